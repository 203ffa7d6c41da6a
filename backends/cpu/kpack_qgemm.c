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
 * is not free: past 64 rows (AVX2: 32) it costs more than one build
 * (gemm.c, inplace_max_m()), and larger calls keep the panels.
 */
#include <string.h>

#include "dot256.h"
#include "kpack_at.h"
#include "qgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT_KQ __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
#define KQ_X 8 /* activation rows per pass, as qgemm.c's QG_X */

/* kpack.c's fifth(): bits s.. of every byte of v, the low one in bit 4. */
TGT_KQ static inline __attribute__((always_inline)) __m512i kq_fifth(__m512i v, int s)
{
	return _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(v, s), _mm512_set1_epi8(1)),
				 4);
}

/* The panel block's 8 vectors of 4 values of 16 rows, of sub-block s of
 * super-block p. */
TGT_KQ static inline __attribute__((always_inline)) void kq_quants(bool five, const uint8_t *p,
								   int s, __m512i wq[8])
{
	const __m512i m4 = _mm512_set1_epi8(15);
	const uint8_t *q = p + KP_Q + kp_sub(five) * s;
	const __m512i h = five ? _mm512_loadu_si512(q + 256) : _mm512_setzero_si512();

	for (int v = 0; v < 4; v++) {
		const __m512i x = _mm512_loadu_si512(q + 64 * v);

		wq[2 * v] = _mm512_or_si512(_mm512_and_si512(x, m4), kq_fifth(h, 2 * v));
		wq[2 * v + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(x, 4), m4),
						kq_fifth(h, 2 * v + 1));
	}
}

/* The panel's floats of sub-block s of super-block p, as panel_q4k_512()
 * makes them: the 16 rows' scales d * sc to *dw, minima -dmin * mn to *mw. */
TGT_KQ static inline __attribute__((always_inline)) void kq_scales(const uint8_t *p, int s,
								   __m512 *dw, __m512 *mw)
{
	const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + KP_D)));
	const __m512 ndmin = _mm512_castsi512_ps(_mm512_xor_si512(
		_mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + KP_DMIN)))),
		_mm512_set1_epi32((int)0x80000000)));
	const __m128i sc = _mm_loadu_si128((const __m128i *)(p + KP_SC + 16 * s));
	const __m128i mn = _mm_loadu_si128((const __m128i *)(p + KP_MN + 16 * s));

	*dw = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)));
	*mw = _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)));
}

/* X activation rows (X <= KQ_X) against the group g of nb super-blocks:
 * qgemm.c's qgemm_rows() with B = 32 and minima, the panel block made in
 * registers. `cold`: the first pass over the group, which prefetches it
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

		if (cold)
			kpack_prefetch(p, bytes);
		for (int s = 0; s < 8; s++) {
			const int64_t c = b * 8 + s;
			__m512i wq[8];
			__m512 dw, mw;

			kq_scales(p, s, &dw, &mw);
			kq_quants(five, p, s, wq);
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

/*
 * The same on 256-bit vectors (AVX-VNNI, AVX2), as qgemm.c's 256-bit
 * kernels take a panel: half h of the group (rows 8h .. 8h + 7) is the
 * first or last 32 bytes of every vector and 8 of the 16 scales, and a
 * pass takes KQ_X8 activation rows. The nibbles are unsigned and at most
 * 15 (Q5_K: 31), so AVX2's maddubs sums stay in int16.
 */
#define KQ_X8 4

#define KQ_ROWS8(attr, name, DOT)                                                          \
	static inline __attribute__((always_inline)) attr void                             \
	name(bool five, const uint8_t *g, int h, int lanes, const struct qdot_block *x,    \
	     const struct qgemm_x *prep, int64_t nb, float *y, int64_t ys, int X, bool cold) \
	{                                                                                  \
		const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),          \
			_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));                        \
		const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);        \
		const size_t bytes = five ? KP_Q5K : KP_Q4K;                               \
		const int64_t nc = nb * 8;                                                 \
		__m256 acc[KQ_X8];                                                         \
                                                                                           \
		for (int i = 0; i < X; i++)                                                \
			acc[i] = _mm256_setzero_ps();                                      \
		for (int64_t b = 0; b < nb; b++) {                                         \
			const uint8_t *p = g + (size_t)b * bytes;                          \
			const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(                 \
				(const __m128i *)(p + KP_D + 16 * h)));                    \
			const __m256 ndmin = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128( \
				(const __m128i *)(p + KP_DMIN + 16 * h))),                 \
				_mm256_set1_ps(-0.0f));                                    \
                                                                                           \
			if (cold)                                                          \
				kpack_prefetch(p, bytes);                                  \
			for (int s = 0; s < 8; s++) {                                      \
				const int64_t c = b * 8 + s;                               \
				const uint8_t *q = p + KP_Q + kp_sub(five) * s + 32 * h;   \
				const __m256i hb = five ?                                  \
					_mm256_loadu_si256((const __m256i *)(q + 256)) :   \
					_mm256_setzero_si256();                            \
				const __m256 dw = _mm256_mul_ps(d, _mm256_cvtepi32_ps(     \
					_mm256_cvtepu8_epi32(_mm_loadl_epi64(              \
						(const __m128i *)(p + KP_SC + 16 * s + 8 * h))))); \
				const __m256 mw = _mm256_mul_ps(ndmin, _mm256_cvtepi32_ps( \
					_mm256_cvtepu8_epi32(_mm_loadl_epi64(              \
						(const __m128i *)(p + KP_MN + 16 * s + 8 * h))))); \
				__m256i w[8];                                              \
                                                                                           \
				for (int v = 0; v < 4; v++) {                              \
					const __m256i t = _mm256_loadu_si256(              \
						(const __m256i *)(q + 64 * v));            \
                                                                                           \
					w[2 * v] = _mm256_or_si256(_mm256_and_si256(t, m4), \
						_mm256_slli_epi16(_mm256_and_si256(        \
							_mm256_srli_epi16(hb, 2 * v), one), 4)); \
					w[2 * v + 1] = _mm256_or_si256(                    \
						_mm256_and_si256(_mm256_srli_epi16(t, 4), m4), \
						_mm256_slli_epi16(_mm256_and_si256(        \
							_mm256_srli_epi16(hb, 2 * v + 1), one), 4)); \
				}                                                          \
				for (int i = 0; i < X; i++) {                              \
					const struct qgemm_x *xp = prep + i * nc + c;      \
					const int8_t *xq = x[i * nc + c].q;                \
					__m256i sum = _mm256_set1_epi32(xp->fix);          \
					int32_t x4;                                        \
                                                                                           \
					for (int k = 0; k < 8; k++) {                      \
						memcpy(&x4, xq + 4 * k, 4);                \
						sum = DOT(sum, w[k], _mm256_set1_epi32(x4)); \
					}                                                  \
					acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),  \
						_mm256_mul_ps(dw, _mm256_set1_ps(xp->d)),  \
						acc[i]);                                   \
					acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xp->s), \
								 acc[i]);                  \
				}                                                          \
			}                                                                  \
		}                                                                          \
		for (int i = 0; i < X; i++)                                                \
			_mm256_maskstore_ps(y + i * ys + 8 * h, keep, acc[i]);             \
	}
KQ_ROWS8(TGT_AVX2, kq_rows_avx2, avx2_dot)
KQ_ROWS8(TGT_AVXVNNI, kq_rows_avxvnni, avxvnni_dot)

/* The first pass (h = 0, the first rows) reads both halves' lines and
 * prefetches for both when cold. */
#define KQ_KIND8(attr, name, rows8, five)                                                  \
	static attr void name(const uint8_t *g, int rows, const struct qdot_block *x,       \
			      const struct qgemm_x *prep, int64_t m, int64_t nb, float *y,      \
			      int64_t ys, bool cold)                                           \
	{                                                                                  \
		for (int h = 0; h < 2 && 8 * h < rows; h++) {                              \
			const int lanes = rows - 8 * h < 8 ? rows - 8 * h : 8;             \
			int64_t i = 0;                                                     \
                                                                                           \
			for (; i + KQ_X8 <= m; i += KQ_X8)                                 \
				rows8(five, g, h, lanes, x + i * nb * 8, prep + i * nb * 8, \
				      nb, y + i * ys, ys, KQ_X8, cold && h == 0 && i == 0); \
			for (; i < m; i++)                                                 \
				rows8(five, g, h, lanes, x + i * nb * 8, prep + i * nb * 8, \
				      nb, y + i * ys, ys, 1, cold && h == 0 && i == 0);     \
		}                                                                          \
	}
KQ_KIND8(TGT_AVX2, kq_q4k_avx2, kq_rows_avx2, false)
KQ_KIND8(TGT_AVX2, kq_q5k_avx2, kq_rows_avx2, true)
KQ_KIND8(TGT_AVXVNNI, kq_q4k_avxvnni, kq_rows_avxvnni, false)
KQ_KIND8(TGT_AVXVNNI, kq_q5k_avxvnni, kq_rows_avxvnni, true)
#endif

kpack_qgemm_fn kpack_qgemm(enum qdot_isa isa, uint32_t type)
{
#if defined(__x86_64__)
	static const kpack_qgemm_fn kinds[3][2] = {
		{ kq_q4k, kq_q5k },
		{ kq_q4k_avxvnni, kq_q5k_avxvnni },
		{ kq_q4k_avx2, kq_q5k_avx2 },
	};
	const int set = isa == QDOT_VNNI ? 0 : isa == QDOT_AVXVNNI ? 1 : isa == QDOT_AVX2 ? 2 : -1;

	if (set < 0 || !qdot_isa_supported(isa) ||
	    (type != LOOM_TYPE_Q4_K && type != LOOM_TYPE_Q5_K))
		return NULL;
	return kinds[set][type == LOOM_TYPE_Q5_K];
#else
	(void)isa;
	(void)type;
#endif
	return NULL;
}
