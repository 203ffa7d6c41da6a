/* Prefill GEMM over transposed f32 panels on AVX-512 and AVX2 (fgemm.h). */
#include <math.h>
#include <string.h>

#include "fgemm.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define TGT_512 __attribute__((target("avx512f")))
#define TGT_256 __attribute__((target("avx2,fma,f16c")))
#endif

#define HALF 16 /* rows a vector holds: a panel is two halves */
/* k values a pass takes: the panel's share (32 KiB) stays in L1 while the
 * activation tiles go past; an element's chain goes on across passes
 * through y, exactly (an f32 stored and loaded back) */
#define KC 256

bool fgemm_supported(enum cpu_isa isa)
{
	return isa == CPU_ISA_AVX512 || isa == CPU_ISA_AVX2;
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

uint16_t fgemm_bf16_round(float v)
{
	uint32_t u;

	memcpy(&u, &v, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quieted, sign kept */
		return (uint16_t)((u >> 16) | 0x40);
	if (!(u & 0x7f800000u)) /* denormal inputs as zero */
		return (uint16_t)((u >> 16) & 0x8000u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

float fgemm_pairs_ref(const uint32_t *x, const uint32_t *w, int64_t kp)
{
	float acc = 0.0f;

	for (int64_t p = 0; p < kp; p++) {
		/* the upper bf16 of each pair first, then the lower */
		acc = fgemm_flush(fmaf(fgemm_pair_hi(x[p]), fgemm_pair_hi(w[p]), acc));
		acc = fgemm_flush(fmaf(fgemm_pair_lo(x[p]), fgemm_pair_lo(w[p]), acc));
	}
	return acc;
}

void fgemm_panel_set(float *panel, int r, const float *row, int64_t k)
{
	for (int64_t kk = 0; kk < k; kk++)
		panel[kk * FGEMM_ROWS + r] = row[kk];
}

/* Values kk0 .. k-1 of the panel's rows as bits (the pairs path keeps
 * bf16 pairs in these slots), zero past `rows`. */
static void panel_tail(const float *src, int64_t ss, int rows, int64_t kk0, int64_t k,
		       float *panel)
{
	for (int64_t kk = kk0; kk < k; kk++)
		for (int r = 0; r < FGEMM_ROWS; r++) {
			uint32_t v = 0;

			if (r < rows)
				memcpy(&v, src + r * ss + kk, sizeof(v));
			memcpy(panel + kk * FGEMM_ROWS + r, &v, sizeof(v));
		}
}

/* The plain C panel and chains, for a kernel set without either (no
 * caller asks today: they check fgemm_supported() first). */
static void run_c(const float *panel, int rows, const float *x, int64_t xs, int64_t m,
		  int64_t k, float *y, int64_t ys)
{
	for (int64_t i = 0; i < m; i++)
		for (int r = 0; r < rows; r++) {
			float acc = 0.0f;

			for (int64_t kk = 0; kk < k; kk++)
				acc = fmaf(x[i * xs + kk], panel[kk * FGEMM_ROWS + r], acc);
			y[i * ys + r] = acc;
		}
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

/* How many of `rows` rows fall in the slice of `width` rows from base. */
static inline int slice_rows(int rows, int base, int width)
{
	return rows - base < 0 ? 0 : rows - base > width ? width : rows - base;
}

TGT_512 static void panel_rows_512(const float *src, int64_t ss, int rows, int64_t k,
				   float *panel)
{
	int64_t kk = 0;

	for (int h = 0; h < 2; h++) {
		const int n = slice_rows(rows, HALF * h, HALF);

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
	panel_tail(src, ss, rows, kk, k, panel);
}

/* The masks of a panel's two halves for its first `rows` rows. */
TGT_512 static inline void half_masks(int rows, __mmask16 *m0, __mmask16 *m1)
{
	*m0 = (__mmask16)(rows >= HALF ? 0xffff : (1u << rows) - 1);
	*m1 = (__mmask16)(rows >= FGEMM_ROWS ? 0xffff :
			  rows > HALF ? (1u << (rows - HALF)) - 1 : 0);
}

/* The sums over no values: y's m rows of `rows` zeros. */
static void zero_rows(float *y, int64_t ys, int64_t m, int rows)
{
	for (int64_t i = 0; i < m; i++)
		for (int r = 0; r < rows; r++)
			y[i * ys + r] = 0.0f;
}

/* A tile's X x 2 accumulators (the panel's two halves): zero for a
 * chain's start, else the chains so far from y. */
TGT_512 static inline __attribute__((always_inline)) void
tile_start(__m512 *a0, __m512 *a1, int X, bool first, const float *y, int64_t ys, __mmask16 m0,
	   __mmask16 m1)
{
	for (int i = 0; i < X; i++) {
		a0[i] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, y + i * ys);
		a1[i] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, y + i * ys + HALF);
	}
}

/* The accumulators to y, the masked rows only. */
TGT_512 static inline __attribute__((always_inline)) void
tile_store(const __m512 *a0, const __m512 *a1, int X, float *y, int64_t ys, __mmask16 m0,
	   __mmask16 m1)
{
	for (int i = 0; i < X; i++) {
		_mm512_mask_storeu_ps(y + i * ys, m0, a0[i]);
		_mm512_mask_storeu_ps(y + i * ys + HALF, m1, a1[i]);
	}
}

/* X activation rows by the panel's rows, k values [k0, k0 + kn); the
 * chains start at 0 (k0 == 0) or go on from y. */
TGT_512 static inline __attribute__((always_inline)) void
tile(const float *panel, int64_t k0, int64_t kn, const float *x, int64_t xs, int X, float *y,
     int64_t ys, __mmask16 m0, __mmask16 m1)
{
	__m512 a0[FGEMM_X], a1[FGEMM_X];
	const float *pb = panel + k0 * FGEMM_ROWS;

	tile_start(a0, a1, X, k0 == 0, y, ys, m0, m1);
	for (int64_t kk = 0; kk < kn; kk++) {
		const __m512 w0 = _mm512_loadu_ps(pb + kk * FGEMM_ROWS);
		const __m512 w1 = _mm512_loadu_ps(pb + kk * FGEMM_ROWS + HALF);

		for (int i = 0; i < X; i++) {
			const __m512 b = _mm512_set1_ps(x[i * xs + k0 + kk]);

			a0[i] = _mm512_fmadd_ps(b, w0, a0[i]);
			a1[i] = _mm512_fmadd_ps(b, w1, a1[i]);
		}
	}
	tile_store(a0, a1, X, y, ys, m0, m1);
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

TGT_512 static void run_512(const float *panel, int rows, const float *x, int64_t xs, int64_t m,
			    int64_t k, float *y, int64_t ys)
{
	__mmask16 m0, m1;

	if (k == 0) {
		zero_rows(y, ys, m, rows);
		return;
	}
	half_masks(rows, &m0, &m1);
	for (int64_t k0 = 0; k0 < k; k0 += KC) {
		const int64_t kn = k - k0 < KC ? k - k0 : KC;

		for (int64_t i = 0; i < m; i += FGEMM_X) {
			const int X = m - i < FGEMM_X ? (int)(m - i) : FGEMM_X;

			tile_x(panel, k0, kn, x + i * xs, xs, X, y + i * ys, ys, m0, m1);
		}
	}
}

/* ---- AVX2: the same panels and chains, 8 rows a vector ---- */

#define QUART 8   /* rows a 256-bit vector holds: a panel is four */
#define X256 6    /* activation rows a 256-bit tile holds (12 accumulators) */
/* activation rows whose pass slices both halves take in turn (48 KiB of
 * them at KC: the second half finds them in L1 or L2; over all m rows the
 * slices were read from L3 twice) */
#define XB256 48

/* v[0..8): rows of 8 floats in, their columns out. */
TGT_256 static inline __attribute__((always_inline)) void transpose8(__m256 v[8])
{
	__m256 t[8], u[8];

	for (int i = 0; i < 8; i += 2) {
		t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
		t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
	}
	/* u[4q + c], lane L: column 4L + c of rows 4q .. 4q+3 */
	for (int q = 0; q < 2; q++) {
		u[4 * q] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
		u[4 * q + 1] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0xee);
		u[4 * q + 2] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
		u[4 * q + 3] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xee);
	}
	for (int c = 0; c < 4; c++) {
		v[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
		v[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
	}
}

TGT_256 static void panel_rows_256(const float *src, int64_t ss, int rows, int64_t k,
				   float *panel)
{
	int64_t kk = 0;

	for (int q = 0; q < FGEMM_ROWS / QUART; q++) {
		const int n = slice_rows(rows, QUART * q, QUART);

		for (kk = 0; kk + 8 <= k; kk += 8) {
			__m256 v[8];

			for (int r = 0; r < 8; r++)
				v[r] = r < n ? _mm256_loadu_ps(src + (QUART * q + r) * ss + kk) :
					       _mm256_setzero_ps();
			transpose8(v);
			for (int c = 0; c < 8; c++)
				_mm256_storeu_ps(panel + (kk + c) * FGEMM_ROWS + QUART * q, v[c]);
		}
	}
	panel_tail(src, ss, rows, kk, k, panel);
}

/* Value e of an f16 (bf16: !f16) row as cpu_dequant_row()'s scalar tail
 * converts it. */
static float half_value(bool f16, const uint8_t *row, int64_t e)
{
	const uint16_t h = cpu_rd16(row + 2 * e);
	uint32_t u = (uint32_t)h << 16;
	float v;

	if (f16)
		return cpu_fp16_to_f32(h);
	memcpy(&v, &u, sizeof(v));
	return v;
}

/* 8 f16 (bf16) values at p as floats, as cpu_dequant_row()'s groups. */
TGT_256 static inline __attribute__((always_inline)) __m256 half8(bool f16, const uint8_t *p)
{
	const __m128i v = _mm_loadu_si128((const __m128i *)p);

	if (f16)
		return _mm256_cvtph_ps(v);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

TGT_256 static void panel_half_256(bool f16, const uint8_t *src, size_t ss, int rows, int64_t k,
				   float *panel)
{
	const int64_t whole = k / 32 * 32; /* the dequantizer's F16C groups */

	for (int q = 0; q < FGEMM_ROWS / QUART; q++) {
		const int n = slice_rows(rows, QUART * q, QUART);

		for (int64_t kk = 0; kk < whole; kk += 8) {
			__m256 v[8];

			for (int r = 0; r < 8; r++)
				v[r] = r < n ? half8(f16, src + (size_t)(QUART * q + r) * ss + 2 * kk) :
					       _mm256_setzero_ps();
			transpose8(v);
			for (int c = 0; c < 8; c++)
				_mm256_storeu_ps(panel + (kk + c) * FGEMM_ROWS + QUART * q, v[c]);
		}
	}
	for (int64_t kk = whole; kk < k; kk++)
		for (int r = 0; r < FGEMM_ROWS; r++)
			panel[kk * FGEMM_ROWS + r] =
				r < rows ? half_value(f16, src + (size_t)r * ss, kk) : 0.0f;
}

bool fgemm_panel_half(enum cpu_isa isa, uint32_t type, const void *src, size_t ss, int rows,
		      int64_t k, float *panel)
{
	if (isa != CPU_ISA_AVX2 || (type != LOOM_TYPE_F16 && type != LOOM_TYPE_BF16))
		return false;
	panel_half_256(type == LOOM_TYPE_F16, src, ss, rows, k, panel);
	return true;
}

/* Lanes of rows 8q .. 8q+7 that are among the first `rows`. */
TGT_256 static inline __m256i quart_mask(int rows, int q)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(rows - QUART * q),
				  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Row i's step of tile_256(); X is a constant where it is inlined, so
 * the rows past it fall away. */
#define T256_LOAD(i)                                                                        \
	if (X > (i) && !first) {                                                           \
		p##i = _mm256_maskload_ps(y + (i) * ys, quart_mask(n, 0));                 \
		q##i = _mm256_maskload_ps(y + (i) * ys + QUART, quart_mask(n, 1));         \
	}
#define T256_FMA(i)                                                                         \
	if (X > (i)) {                                                                     \
		const __m256 b = _mm256_broadcast_ss(x + (i) * xs + kk);                   \
                                                                                           \
		p##i = _mm256_fmadd_ps(b, w0, p##i);                                       \
		q##i = _mm256_fmadd_ps(b, w1, q##i);                                       \
	}
#define T256_STORE(i)                                                                       \
	if (X > (i)) {                                                                     \
		_mm256_maskstore_ps(y + (i) * ys, quart_mask(n, 0), p##i);                 \
		_mm256_maskstore_ps(y + (i) * ys + QUART, quart_mask(n, 1), q##i);         \
	}

/*
 * X (<= 6) activation rows by the 16 panel rows at pb (a half: two
 * vectors, n of its rows valid), k values [0, kn) of a pass; the chains
 * start at 0 (first) or go on from y. The 12 accumulators are named, not
 * an array: as arrays GCC kept a copy of each on the stack, stored every
 * step, and the masks are made before and after the loop (held through
 * it they took two of the 16 registers).
 */
TGT_256 static inline __attribute__((always_inline)) void
tile_256(const float *pb, int64_t kn, const float *x, int64_t xs, int X, bool first, float *y,
	 int64_t ys, int n)
{
	__m256 p0, p1, p2, p3, p4, p5, q0, q1, q2, q3, q4, q5;

	p0 = p1 = p2 = p3 = p4 = p5 = _mm256_setzero_ps();
	q0 = q1 = q2 = q3 = q4 = q5 = _mm256_setzero_ps();
	T256_LOAD(0) T256_LOAD(1) T256_LOAD(2) T256_LOAD(3) T256_LOAD(4) T256_LOAD(5)
	for (int64_t kk = 0; kk < kn; kk++) {
		const __m256 w0 = _mm256_loadu_ps(pb + kk * FGEMM_ROWS);
		const __m256 w1 = _mm256_loadu_ps(pb + kk * FGEMM_ROWS + QUART);

		T256_FMA(0) T256_FMA(1) T256_FMA(2) T256_FMA(3) T256_FMA(4) T256_FMA(5)
	}
	T256_STORE(0) T256_STORE(1) T256_STORE(2) T256_STORE(3) T256_STORE(4) T256_STORE(5)
}

#define TILE256_CASE(n)                                                                 \
	case n:                                                                         \
		tile_256(pb, kn, x, xs, n, first, y, ys, rows);                         \
		break;

/* tile_256() with X a constant, so its row loops unroll. */
TGT_256 static void tile_256_x(const float *pb, int64_t kn, const float *x, int64_t xs, int X,
			       bool first, float *y, int64_t ys, int rows)
{
	switch (X) {
	TILE256_CASE(1) TILE256_CASE(2) TILE256_CASE(3) TILE256_CASE(4) TILE256_CASE(5)
	default:
		tile_256(pb, kn, x, xs, X256, first, y, ys, rows);
		break;
	}
}

/* Lines [l0, l1) of the rows `next` names (line l: row l / per, its
 * (l % per)-th 64 bytes). */
static void prefetch_lines(const struct fgemm_next *next, int64_t l0, int64_t l1)
{
	const int64_t per = (int64_t)((next->bytes + 63) / 64) + 1; /* a row may straddle */

	for (int64_t l = l0; l < l1; l++)
		__builtin_prefetch(next->p + (size_t)(l / per) * next->stride + 64 * (size_t)(l % per),
				   0, 3);
}

TGT_256 static void run_256(const float *panel, int rows, const float *x, int64_t xs, int64_t m,
			    int64_t k, float *y, int64_t ys, const struct fgemm_next *next)
{
	const int64_t tiles = (k + KC - 1) / KC * (rows > HALF ? 2 : 1) *
			      (m / XB256 * (XB256 / X256) + (m % XB256 + X256 - 1) / X256);
	const int64_t lines = next ? next->rows * ((int64_t)((next->bytes + 63) / 64) + 1) : 0;
	int64_t done = 0;

	if (k == 0) {
		zero_rows(y, ys, m, rows);
		return;
	}
	for (int64_t k0 = 0; k0 < k; k0 += KC) {
		const int64_t kn = k - k0 < KC ? k - k0 : KC;

		for (int64_t i0 = 0; i0 < m; i0 += XB256)
			for (int h = 0; h < 2 && HALF * h < rows; h++) {
				const int n = rows - HALF * h;
				const float *pb = panel + k0 * FGEMM_ROWS + HALF * h;
				const int64_t i1 = m - i0 < XB256 ? m : i0 + XB256;

				for (int64_t i = i0; i < i1; i += X256, done++) {
					const int X = i1 - i < X256 ? (int)(i1 - i) : X256;

					if (lines)
						prefetch_lines(next, lines * done / tiles,
							       lines * (done + 1) / tiles);
					tile_256_x(pb, kn, x + i * xs + k0, xs, X, k0 == 0,
						   y + i * ys + HALF * h, ys, n);
				}
			}
	}
}

void fgemm_panel_rows(enum cpu_isa isa, const void *src, int64_t ss, int rows, int64_t k,
		      void *panel)
{
	if (isa == CPU_ISA_AVX512)
		panel_rows_512(src, ss, rows, k, panel);
	else if (isa == CPU_ISA_AVX2)
		panel_rows_256(src, ss, rows, k, panel);
	else
		panel_tail(src, ss, rows, 0, k, panel);
}

void fgemm_run(enum cpu_isa isa, const float *panel, int rows, const float *x, int64_t xs,
	       int64_t m, int64_t k, float *y, int64_t ys, const struct fgemm_next *next)
{
	if (isa == CPU_ISA_AVX512)
		run_512(panel, rows, x, xs, m, k, y, ys);
	else if (isa == CPU_ISA_AVX2)
		run_256(panel, rows, x, xs, m, k, y, ys, next);
	else
		run_c(panel, rows, x, xs, m, k, y, ys);
}

/* ---- bf16 pairs (AVX512_BF16) ---- */

bool fgemm_pairs_supported(enum cpu_isa isa)
{
	unsigned a, b, c, d;

	/* CPUID.(EAX=7, ECX=1):EAX bit 5: AVX512_BF16 */
	return isa == CPU_ISA_AVX512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

__attribute__((target("avx512f,avx512bf16"))) void fgemm_pairs_x(const float *x, int64_t k,
								  uint32_t *out)
{
	/* the instruction where the CPU has it (AMX-BF16 may run without) */
	static _Atomic int has = -1;
	int64_t e = 0;

	if (has < 0)
		has = fgemm_pairs_supported(cpu_detect_isa());
	for (; has && e + 32 <= k; e += 32) {
		__m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + e + 16), _mm512_loadu_ps(x + e));

		_mm512_storeu_si512(out + e / 2, (__m512i)v);
	}
	for (; e < k; e += 2)
		out[e / 2] = fgemm_bf16_round(x[e]) | (uint32_t)fgemm_bf16_round(x[e + 1]) << 16;
}

/* tile() on bf16 pairs: pairs [p0, p0 + pn) of x's rows (kp pairs apart). */
__attribute__((target("avx512f,avx512bf16"))) static inline __attribute__((always_inline)) void
tile_pairs(const uint32_t *panel, int64_t p0, int64_t pn, const uint32_t *xp, int64_t kp, int X,
	   float *y, int64_t ys, __mmask16 m0, __mmask16 m1)
{
	__m512 a0[FGEMM_X], a1[FGEMM_X];
	const uint32_t *pb = panel + p0 * FGEMM_ROWS;

	tile_start(a0, a1, X, p0 == 0, y, ys, m0, m1);
	for (int64_t p = 0; p < pn; p++) {
		const __m512bh w0 = (__m512bh)_mm512_loadu_si512(pb + p * FGEMM_ROWS);
		const __m512bh w1 = (__m512bh)_mm512_loadu_si512(pb + p * FGEMM_ROWS + HALF);

		for (int i = 0; i < X; i++) {
			const __m512bh b = (__m512bh)_mm512_set1_epi32((int)xp[i * kp + p0 + p]);

			a0[i] = _mm512_dpbf16_ps(a0[i], b, w0);
			a1[i] = _mm512_dpbf16_ps(a1[i], b, w1);
		}
	}
	tile_store(a0, a1, X, y, ys, m0, m1);
}

#define PAIRS_CASE(n)                                                                   \
	case n:                                                                         \
		tile_pairs(panel, p0, pn, xp, kp, n, yi, ys, m0, m1);                   \
		break;

__attribute__((target("avx512f,avx512bf16"))) void
fgemm_pairs_run(const uint32_t *panel, int rows, const uint32_t *x, int64_t m, int64_t kp,
		float *y, int64_t ys)
{
	__mmask16 m0, m1;

	if (kp == 0) {
		zero_rows(y, ys, m, rows);
		return;
	}
	half_masks(rows, &m0, &m1);
	for (int64_t p0 = 0; p0 < kp; p0 += KC / 2) {
		const int64_t pn = kp - p0 < KC / 2 ? kp - p0 : KC / 2;

		for (int64_t i = 0; i < m; i += FGEMM_X) {
			const int X = m - i < FGEMM_X ? (int)(m - i) : FGEMM_X;
			const uint32_t *xp = x + i * kp;
			float *yi = y + i * ys;

			switch (X) {
			PAIRS_CASE(1) PAIRS_CASE(2) PAIRS_CASE(3) PAIRS_CASE(4) PAIRS_CASE(5)
			PAIRS_CASE(6) PAIRS_CASE(7) PAIRS_CASE(8) PAIRS_CASE(9) PAIRS_CASE(10)
			PAIRS_CASE(11)
			default:
				tile_pairs(panel, p0, pn, xp, kp, FGEMM_X, yi, ys, m0, m1);
				break;
			}
		}
	}
}
#else
bool fgemm_pairs_supported(enum cpu_isa isa)
{
	(void)isa;
	return false;
}

void fgemm_pairs_x(const float *x, int64_t k, uint32_t *out)
{
	for (int64_t e = 0; e < k; e += 2)
		out[e / 2] = fgemm_bf16_round(x[e]) | (uint32_t)fgemm_bf16_round(x[e + 1]) << 16;
}

void fgemm_pairs_run(const uint32_t *panel, int rows, const uint32_t *x, int64_t m, int64_t kp,
		     float *y, int64_t ys)
{
	(void)panel, (void)rows, (void)x, (void)m, (void)kp, (void)y, (void)ys;
}

void fgemm_panel_rows(enum cpu_isa isa, const void *src, int64_t ss, int rows, int64_t k,
		      void *panel)
{
	(void)isa;
	panel_tail(src, ss, rows, 0, k, panel);
}

bool fgemm_panel_half(enum cpu_isa isa, uint32_t type, const void *src, size_t ss, int rows,
		      int64_t k, float *panel)
{
	(void)isa, (void)type, (void)src, (void)ss, (void)rows, (void)k, (void)panel;
	return false;
}

void fgemm_run(enum cpu_isa isa, const float *panel, int rows, const float *x, int64_t xs,
	       int64_t m, int64_t k, float *y, int64_t ys, const struct fgemm_next *next)
{
	(void)isa, (void)next;
	run_c(panel, rows, x, xs, m, k, y, ys);
}
#endif
