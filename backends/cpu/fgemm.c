/* Prefill GEMM over transposed f32 panels on AVX-512 (fgemm.h). */
#include <math.h>
#include <string.h>

#include "fgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TGT_512 __attribute__((target("avx512f")))
#endif

#define HALF 16 /* rows a vector holds: a panel is two halves */
/* k values a pass takes: the panel's share (32 KiB) stays in L1 while the
 * activation tiles go past; an element's chain goes on across passes
 * through y, exactly (an f32 stored and loaded back) */
#define KC 256

bool fgemm_supported(enum cpu_isa isa)
{
	return isa == CPU_ISA_AVX512;
}

size_t fgemm_panel_floats(int64_t k)
{
	return (size_t)k * FGEMM_ROWS;
}

float fgemm_ref(const float *x, const float *w, int64_t k)
{
	float acc = 0.0f;

	for (int64_t kk = 0; kk < k; kk++)
		acc = fmaf(x[kk], w[kk], acc);
	return acc;
}

void fgemm_panel_set(float *panel, int r, const float *row, int64_t k)
{
	for (int64_t kk = 0; kk < k; kk++)
		panel[kk * FGEMM_ROWS + r] = row[kk];
}

#if defined(__x86_64__)
/* v[0..16): rows of 16 floats in, their columns out. */
TGT_512 static inline __attribute__((always_inline)) void transpose16(__m512 v[16])
{
	__m512 t[16];

	/* within each 128-bit lane L: pairs of rows interleaved */
	for (int i = 0; i < 16; i += 2) {
		t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
		t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
	}
	/* v[4q + c], lane L: column 4L + c of rows 4q .. 4q+3 */
	for (int i = 0; i < 16; i += 4)
		for (int j = 0; j < 2; j++) {
			__m512d a = _mm512_castps_pd(t[i + j]), b = _mm512_castps_pd(t[i + j + 2]);

			v[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
			v[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
		}
	/* column 4L + c: lane L of v[c], v[4 + c], v[8 + c], v[12 + c] */
	for (int c = 0; c < 4; c++) {
		__m512 u = _mm512_shuffle_f32x4(v[c], v[4 + c], 0x44);
		__m512 w = _mm512_shuffle_f32x4(v[8 + c], v[12 + c], 0x44);
		__m512 u2 = _mm512_shuffle_f32x4(v[c], v[4 + c], 0xee);
		__m512 w2 = _mm512_shuffle_f32x4(v[8 + c], v[12 + c], 0xee);

		t[c] = _mm512_shuffle_f32x4(u, w, 0x88);
		t[4 + c] = _mm512_shuffle_f32x4(u, w, 0xdd);
		t[8 + c] = _mm512_shuffle_f32x4(u2, w2, 0x88);
		t[12 + c] = _mm512_shuffle_f32x4(u2, w2, 0xdd);
	}
	for (int i = 0; i < 16; i++)
		v[i] = t[i];
}

TGT_512 void fgemm_panel_rows(const float *src, int64_t ss, int rows, int64_t k, float *panel)
{
	int64_t kk = 0;

	for (int h = 0; h < 2; h++) {
		const int n = rows - HALF * h < 0 ? 0 : rows - HALF * h > HALF ? HALF : rows - HALF * h;

		for (kk = 0; kk + 16 <= k; kk += 16) {
			__m512 v[16];

			for (int r = 0; r < 16; r++)
				v[r] = r < n ? _mm512_loadu_ps(src + (HALF * h + r) * ss + kk) :
					       _mm512_setzero_ps();
			transpose16(v);
			for (int c = 0; c < 16; c++)
				_mm512_storeu_ps(panel + (kk + c) * FGEMM_ROWS + HALF * h, v[c]);
		}
	}
	for (; kk < k; kk++)
		for (int r = 0; r < FGEMM_ROWS; r++)
			panel[kk * FGEMM_ROWS + r] = r < rows ? src[r * ss + kk] : 0.0f;
}

/* X activation rows by the panel's rows, k values [k0, k0 + kn); the
 * chains start at 0 (k0 == 0) or go on from y. */
TGT_512 static inline __attribute__((always_inline)) void
tile(const float *panel, int64_t k0, int64_t kn, const float *x, int64_t xs, int X, float *y,
     int64_t ys, __mmask16 m0, __mmask16 m1)
{
	__m512 a0[FGEMM_X], a1[FGEMM_X];
	const float *pb = panel + k0 * FGEMM_ROWS;

	for (int i = 0; i < X; i++) {
		a0[i] = k0 ? _mm512_maskz_loadu_ps(m0, y + i * ys) : _mm512_setzero_ps();
		a1[i] = k0 ? _mm512_maskz_loadu_ps(m1, y + i * ys + HALF) : _mm512_setzero_ps();
	}
	for (int64_t kk = 0; kk < kn; kk++) {
		const __m512 w0 = _mm512_loadu_ps(pb + kk * FGEMM_ROWS);
		const __m512 w1 = _mm512_loadu_ps(pb + kk * FGEMM_ROWS + HALF);

		for (int i = 0; i < X; i++) {
			const __m512 b = _mm512_set1_ps(x[i * xs + k0 + kk]);

			a0[i] = _mm512_fmadd_ps(b, w0, a0[i]);
			a1[i] = _mm512_fmadd_ps(b, w1, a1[i]);
		}
	}
	for (int i = 0; i < X; i++) {
		_mm512_mask_storeu_ps(y + i * ys, m0, a0[i]);
		_mm512_mask_storeu_ps(y + i * ys + HALF, m1, a1[i]);
	}
}

/* tile() with X a constant, so its row loops unroll. */
#define TILE_CASE(n)                                                                    \
	case n:                                                                         \
		tile(panel, k0, kn, x, xs, n, y, ys, m0, m1);                           \
		break;

TGT_512 static void tile_x(const float *panel, int64_t k0, int64_t kn, const float *x,
			   int64_t xs, int X, float *y, int64_t ys, __mmask16 m0, __mmask16 m1)
{
	switch (X) {
	TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6)
	TILE_CASE(7) TILE_CASE(8) TILE_CASE(9) TILE_CASE(10) TILE_CASE(11)
	default:
		tile(panel, k0, kn, x, xs, FGEMM_X, y, ys, m0, m1);
		break;
	}
}

TGT_512 void fgemm_run(const float *panel, int rows, const float *x, int64_t xs, int64_t m,
		       int64_t k, float *y, int64_t ys)
{
	const __mmask16 m0 = (__mmask16)(rows >= HALF ? 0xffff : (1u << rows) - 1);
	const __mmask16 m1 = (__mmask16)(rows >= FGEMM_ROWS ? 0xffff :
					 rows > HALF ? (1u << (rows - HALF)) - 1 : 0);

	if (k == 0) { /* empty sums */
		for (int64_t i = 0; i < m; i++)
			for (int r = 0; r < rows; r++)
				y[i * ys + r] = 0.0f;
		return;
	}
	for (int64_t k0 = 0; k0 < k; k0 += KC) {
		const int64_t kn = k - k0 < KC ? k - k0 : KC;

		for (int64_t i = 0; i < m; i += FGEMM_X) {
			const int X = m - i < FGEMM_X ? (int)(m - i) : FGEMM_X;

			tile_x(panel, k0, kn, x + i * xs, xs, X, y + i * ys, ys, m0, m1);
		}
	}
}
#else
void fgemm_panel_rows(const float *src, int64_t ss, int rows, int64_t k, float *panel)
{
	for (int64_t kk = 0; kk < k; kk++)
		for (int r = 0; r < FGEMM_ROWS; r++)
			panel[kk * FGEMM_ROWS + r] = r < rows ? src[r * ss + kk] : 0.0f;
}

void fgemm_run(const float *panel, int rows, const float *x, int64_t xs, int64_t m, int64_t k,
	       float *y, int64_t ys)
{
	(void)panel, (void)rows, (void)x, (void)xs, (void)m, (void)k, (void)y, (void)ys;
}
#endif
