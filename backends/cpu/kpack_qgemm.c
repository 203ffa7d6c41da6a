/*
 * The prefill GEMM (qgemm.h) reading a packed Q4_K / Q5_K group in place
 * (kpack.h), with no panel built: the 16-row group already holds, per
 * sub-block of 32 values, the 64-byte vectors whose nibbles are the
 * panel's groups of 4 values, and the rows' d, dmin and 6-bit scales. The
 * panel builder (kpack.c, panel_q4k_512) spent its time splitting those
 * nibbles and turning the scales into floats once per call, and the
 * kernel then read a panel 2.2 times the packed bytes (a 1B-shaped
 * Q4_K_M pp64: the builds were 6 % of the time, k = 2048's panel 40 KiB
 * against a group's 18 KiB). Here every pass of 8 activation rows over
 * the group splits the nibbles again in registers and computes the scales
 * with the builder's own multiplies, so every output is qgemm_run()'s of
 * kpack_panel()'s panel bit for bit (tests/backend/qdot_k.c). That split
 * is not free: past 64 rows it costs more than one build (gemm.c,
 * QGEMM_INPLACE_MAX_M), and larger calls keep the panels.
 */
#include <string.h>

#include "kpack_at.h"
#include "qgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT_KQ __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
#define KQ_X 8 /* activation rows per pass, as qgemm.c's QG_X */

/* X activation rows (X <= KQ_X) against the group g of nb super-blocks:
 * qgemm.c's qgemm_rows() with B = 32 and minima, the panel block made in
 * registers by panel_q4k_512()'s own steps (kpack_at.h). `cold`: the first pass over the group, which prefetches it
 * ahead. */
TGT_KQ static inline __attribute__((always_inline)) void
kq_rows(bool five, const uint8_t *g, int rows, const struct qdot_block *x,
	const struct qgemm_x *prep, int64_t nb, float *y, int64_t ys, int X, bool cold)
{
	const __mmask16 keep = (__mmask16)((1u << rows) - 1);
	const size_t bytes = five ? KP_Q5K : KP_Q4K;
	const int64_t nc = nb * 8;
	__m512 acc[KQ_X];

	for (int i = 0; i < X; i++)
		acc[i] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + (size_t)b * bytes;
		__m512 d, ndmin;

		q45k_d(p, &d, &ndmin);
		if (cold)
			kpack_prefetch(p, bytes);
		for (int s = 0; s < 8; s++) {
			const int64_t c = b * 8 + s;
			__m512i wq[8];
			__m512 dw, mw;

			q45k_sub(five, p, s, wq);
			q45k_scales(p, s, d, ndmin, &dw, &mw);
			for (int i = 0; i < X; i++) {
				const struct qgemm_x *xp = prep + i * nc + c;
				const int8_t *xq = x[i * nc + c].q;
				__m512i sum = _mm512_set1_epi32(xp->fix);
				int32_t x4;

				for (int k = 0; k < 8; k++) {
					memcpy(&x4, xq + 4 * k, 4);
					sum = _mm512_dpbusd_epi32(sum, wq[k], _mm512_set1_epi32(x4));
				}
				acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
							 _mm512_mul_ps(dw, _mm512_set1_ps(xp->d)), acc[i]);
				acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xp->s), acc[i]);
			}
		}
	}
	for (int i = 0; i < X; i++)
		_mm512_mask_storeu_ps(y + i * ys, keep, acc[i]);
}

/* Rows i .. i + X - 1; cold a constant in each copy. */
#define KQ_PASS(five, X, cold)                                                             \
	kq_rows(five, g, rows, x + i * nb * 8, prep + i * nb * 8, nb, y + i * ys, ys, \
		X, cold)

#define KQ_KIND(name, five)                                                                \
	static TGT_KQ void name(const uint8_t *g, int rows,                                 \
				const struct qdot_block *x, const struct qgemm_x *prep,         \
				int64_t m, int64_t nb, float *y, int64_t ys, bool cold)          \
	{                                                                                  \
		int64_t i = 0;                                                             \
                                                                                           \
		for (; i + KQ_X <= m; i += KQ_X) {                                         \
			if (cold && i == 0)                                                \
				KQ_PASS(five, KQ_X, true);                                 \
			else                                                               \
				KQ_PASS(five, KQ_X, false);                                \
		}                                                                          \
		for (; i < m; i++) {                                                       \
			if (cold && i == 0)                                                \
				KQ_PASS(five, 1, true);                                    \
			else                                                               \
				KQ_PASS(five, 1, false);                                   \
		}                                                                          \
	}
KQ_KIND(kq_q4k, false)
KQ_KIND(kq_q5k, true)
#endif

kpack_qgemm_fn kpack_qgemm(enum qdot_isa isa, uint32_t type)
{
#if defined(__x86_64__)
	if (isa != QDOT_VNNI || !qdot_isa_supported(isa))
		return NULL;
	if (type == LOOM_TYPE_Q4_K)
		return kq_q4k;
	if (type == LOOM_TYPE_Q5_K)
		return kq_q5k;
#else
	(void)isa;
	(void)type;
#endif
	return NULL;
}
