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

/* Per block: the interleaved bytes, then 16 scales, then 16 minima. */
size_t qgemm_panel_bytes(int64_t nb)
{
	return (size_t)nb * (BLOCK_BYTES + 2 * QGEMM_ROWS * sizeof(float));
}

static uint8_t *panel_block(void *panel, int64_t b)
{
	return (uint8_t *)panel + (size_t)b * (BLOCK_BYTES + 2 * QGEMM_ROWS * sizeof(float));
}

void qgemm_panel(uint32_t type, const uint8_t *w, size_t ws, int64_t j0, int rows, int64_t nb,
		 void *panel)
{
	const size_t bb = cpu_block_bytes(type);
	const int off = weight_off(type);

	memset(panel, 0, qgemm_panel_bytes(nb));
	for (int r = 0; r < rows; r++) {
		const uint8_t *row = w + (size_t)(j0 + r) * ws;

		for (int64_t b = 0; b < nb; b++) {
			uint8_t *pb = panel_block(panel, b);
			float *dw = (float *)(pb + BLOCK_BYTES), *mw = dw + QGEMM_ROWS;
			int8_t q[32];

			qdot_unpack_block(type, row + (size_t)b * bb, q, &dw[r], &mw[r]);
			for (int e = 0; e < 32; e++)
				pb[(e / 4) * GROUP_BYTES + r * 4 + e % 4] = (uint8_t)(q[e] + off);
		}
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
#define QG_X 4 /* activation rows per pass over the panel */

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
