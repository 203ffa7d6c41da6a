/* Fast-mode prefill GEMM over interleaved 16-row panels (qgemm.h). */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "qgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define GROUP_BYTES (4 * QGEMM_ROWS) /* 4 values of each of the 16 rows */
#define BLOCK_BYTES (8 * GROUP_BYTES)

static bool offset_format(uint32_t t)
{
	return t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_1;
}

static int weight_off(uint32_t t)
{
	return offset_format(t) ? 0 : 128;
}

bool qgemm_supported(uint32_t type)
{
	return qdot_format(type) && qdot_isa_supported(QDOT_VNNI);
}

#if defined(__x86_64__)
/* block_u8() with vector nibble splits (GGUF Q4/Q5: byte j holds element
 * j low and j + 16 high; Q5's element e has its fifth bit at bit e). */
__attribute__((target("avx2,f16c"))) static void block_u8_avx2(uint32_t t, const uint8_t *p,
							      uint8_t u[32], float *d, float *m)
{
	const __m128i m4 = _mm_set1_epi8(15);
	__m128i lo, hi, v;
	uint32_t qh = 0;
	int qs = 2;

	*d = _cvtsh_ss((uint16_t)(p[0] | p[1] << 8));
	*m = 0.0f;
	if (t == LOOM_TYPE_Q8_0) {
		__m256i q = _mm256_loadu_si256((const __m256i *)(p + 2));

		_mm256_storeu_si256((__m256i *)u, _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)));
		return;
	}
	if (offset_format(t)) {
		*m = _cvtsh_ss((uint16_t)(p[2] | p[3] << 8));
		qs = 4;
	}
	if (t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1) {
		memcpy(&qh, p + qs, 4);
		qs += 4;
	}
	v = _mm_loadu_si128((const __m128i *)(p + qs));
	lo = _mm_and_si128(v, m4);
	hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
	if (qh) {
		/* bit e of qh to byte e's bit 4 */
		const __m256i pick = _mm256_setr_epi64x(0x8040201008040201ll, 0x8040201008040201ll,
							0x8040201008040201ll, 0x8040201008040201ll);
		__m256i bits = _mm256_shuffle_epi8(
			_mm256_set1_epi32((int)qh),
			_mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll,
					   0x0303030303030303ll));
		__m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, pick), pick),
					     _mm256_set1_epi8(16));

		lo = _mm_or_si128(lo, _mm256_castsi256_si128(h));
		hi = _mm_or_si128(hi, _mm256_extracti128_si256(h, 1));
	}
	if (!offset_format(t)) { /* + off - the format's zero point */
		__m128i add = _mm_set1_epi8((char)(t == LOOM_TYPE_Q5_0 ? 112 : 120));

		lo = _mm_add_epi8(lo, add);
		hi = _mm_add_epi8(hi, add);
	}
	_mm_storeu_si128((__m128i *)u, lo);
	_mm_storeu_si128((__m128i *)(u + 16), hi);
}
#endif

/* Per block: the interleaved bytes, then 16 scales, then 16 minima. */
size_t qgemm_panel_bytes(int64_t nb)
{
	return (size_t)nb * (BLOCK_BYTES + 2 * QGEMM_ROWS * sizeof(float));
}

static uint8_t *panel_block(void *panel, int64_t b)
{
	return (uint8_t *)panel + (size_t)b * (BLOCK_BYTES + 2 * QGEMM_ROWS * sizeof(float));
}

/* GGUF block p of type t as 32 unsigned bytes q + off (element order),
 * its scale and minimum. */
static void block_u8(uint32_t t, const uint8_t *p, uint8_t u[32], float *d, float *m)
{
#if defined(__x86_64__)
	if (qdot_isa_supported(QDOT_AVX2)) {
		block_u8_avx2(t, p, u, d, m);
		return;
	}
#endif
	int8_t q[32];

	qdot_unpack_block(t, p, q, d, m);
	for (int e = 0; e < 32; e++)
		u[e] = (uint8_t)(q[e] + weight_off(t));
}

void qgemm_panel(uint32_t type, const uint8_t *w, size_t ws, int64_t j0, int rows, int64_t nb,
		 void *panel)
{
	const size_t bb = cpu_block_bytes(type);
	uint8_t u[QGEMM_ROWS][32];

	memset(u, 0, sizeof(u));
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *pb = panel_block(panel, b);
		float *dw = (float *)(pb + BLOCK_BYTES), *mw = dw + QGEMM_ROWS;

		for (int r = 0; r < QGEMM_ROWS; r++) {
			dw[r] = mw[r] = 0.0f;
			if (r < rows)
				block_u8(type, w + (size_t)(j0 + r) * ws + (size_t)b * bb, u[r],
					 &dw[r], &mw[r]);
		}
		/* group g of every row: 4 bytes each, row after row */
		for (int g = 0; g < 8; g++)
			for (int r = 0; r < QGEMM_ROWS; r++)
				memcpy(pb + g * GROUP_BYTES + r * 4, u[r] + 4 * g, 4);
	}
}

void qgemm_row_fix(uint32_t type, const struct qdot_block *x, int64_t nb, int32_t *fix)
{
	for (int64_t b = 0; b < nb; b++) {
		int32_t sum = 0;

		for (int e = 0; e < 32; e++)
			sum += x[b].q[e];
		fix[b] = -weight_off(type) * sum;
	}
}

float qgemm_ref(uint32_t type, const uint8_t *w, const struct qdot_block *x, int64_t nb)
{
	const int off = weight_off(type);
	float acc = 0.0f;

	for (int64_t b = 0; b < nb; b++) {
		int8_t q[32];
		float d, m;
		int32_t isum = 0, xsum = 0;

		qdot_unpack_block(type, w + (size_t)b * cpu_block_bytes(type), q, &d, &m);
		for (int e = 0; e < 32; e++) {
			isum += (int32_t)(uint8_t)(q[e] + off) * x[b].q[e];
			xsum += x[b].q[e];
		}
		acc = fmaf((float)(isum - off * xsum), d * x[b].d, acc);
		if (offset_format(type))
			acc = fmaf(m, x[b].s, acc);
	}
	return acc;
}

#if defined(__x86_64__)
#define TGT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define QG_X 8 /* activation rows per pass over the panel */

/* X activation rows (X <= QG_X) against the panel; has_min a constant. */
static inline __attribute__((always_inline)) TGT_VNNI void
qgemm_rows(const uint8_t *panel, int rows, const struct qdot_block *x, const int32_t *fix,
	   int64_t nb, float *y, int64_t ys, int X, bool has_min)
{
	const __mmask16 keep = (__mmask16)((1u << rows) - 1);
	__m512 acc[QG_X];

	for (int i = 0; i < X; i++)
		acc[i] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = panel_block((void *)panel, b);
		__m512 dw = _mm512_loadu_ps(pb + BLOCK_BYTES);
		__m512 mw = _mm512_loadu_ps(pb + BLOCK_BYTES + QGEMM_ROWS * sizeof(float));
		__m512i wq[8];

		for (int g = 0; g < 8; g++)
			wq[g] = _mm512_loadu_si512(pb + g * GROUP_BYTES);
		for (int i = 0; i < X; i++) {
			const struct qdot_block *xb = x + i * nb + b;
			__m512i s = _mm512_set1_epi32(fix[i * nb + b]);
			int32_t x4;

			for (int g = 0; g < 8; g++) {
				memcpy(&x4, xb->q + 4 * g, 4);
				s = _mm512_dpbusd_epi32(s, wq[g], _mm512_set1_epi32(x4));
			}
			acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
						 _mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), acc[i]);
			if (has_min)
				acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb->s), acc[i]);
		}
	}
	for (int i = 0; i < X; i++)
		_mm512_mask_storeu_ps(y + i * ys, keep, acc[i]);
}

static TGT_VNNI void qgemm_run_vnni(uint32_t type, const void *panel, int rows,
				    const struct qdot_block *x, const int32_t *fix, int64_t m,
				    int64_t nb, float *y, int64_t ys)
{
	const bool mn = offset_format(type);
	int64_t i = 0;

	for (; i + QG_X <= m; i += QG_X) {
		if (mn)
			qgemm_rows(panel, rows, x + i * nb, fix + i * nb, nb, y + i * ys, ys, QG_X, true);
		else
			qgemm_rows(panel, rows, x + i * nb, fix + i * nb, nb, y + i * ys, ys, QG_X, false);
	}
	for (; i < m; i++) {
		if (mn)
			qgemm_rows(panel, rows, x + i * nb, fix + i * nb, nb, y + i * ys, ys, 1, true);
		else
			qgemm_rows(panel, rows, x + i * nb, fix + i * nb, nb, y + i * ys, ys, 1, false);
	}
}
#endif

void qgemm_run(uint32_t type, const void *panel, int rows, const struct qdot_block *x,
	       const int32_t *fix, int64_t m, int64_t nb, float *y, int64_t ys)
{
#if defined(__x86_64__)
	qgemm_run_vnni(type, panel, rows, x, fix, m, nb, y, ys);
#else
	(void)type; (void)panel; (void)rows; (void)x; (void)fix; (void)m; (void)nb; (void)y;
	(void)ys;
#endif
}
