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
 * is not free: past 64 rows it costs more than one build
 * (kpack_qgemm_max_m()), and larger calls keep the panels.
 */
#include <stdint.h>
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

/*
 * AVX2, Q8_0: the packed group's quant bytes are the panel's (q + 128,
 * vector l of a block holding values 4l .. 4l + 3 of the 16 rows) and its
 * f16 scales widen to the panel's floats with the builder's vcvtph2ps, so
 * reading the group in place skips a build that only copied it: the
 * build read the weights from memory with the arithmetic idle (7 % of a
 * 1B-shaped Q8_0 pp64 at 1 thread), where the first pass here streams
 * them under its arithmetic, prefetching ahead. The arithmetic is
 * qgemm.c's AVX2 Q8_0 path (|q| against x with q's sign, a madd a group
 * of 4 values), so the bits are qgemm_run()'s.
 */
#define TGT_Q8 __attribute__((target("avx2,fma,f16c")))
#define Q8_X 2 /* activation rows a pass, over both halves (qgemm.c's QG_X2) */

TGT_Q8 static inline __attribute__((always_inline)) void
q8_rows(const uint8_t *g, int rows, const struct qdot_block *x, const struct qgemm_x *prep,
	int64_t nb, float *y, int64_t ys, int X, bool cold)
{
	const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
	__m256 acc[2][Q8_X];

	for (int h = 0; h < 2; h++)
		for (int i = 0; i < X; i++)
			acc[h][i] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const struct b32_at at = b32_at(LOOM_TYPE_Q8_0, b, nb);
		const uint8_t *q = g + at.q;
		__m256i s[2][Q8_X];

		for (int h = 0; h < 2; h++)
			for (int i = 0; i < X; i++)
				s[h][i] = _mm256_setzero_si256();
		if (cold && b % 2 == 0)
			_mm_prefetch((const char *)g + at.d + KP_PREFETCH, _MM_HINT_T0);
		for (int l = 0; l < 8; l++) {
			__m256i a[2], sg[2];

			if (cold)
				_mm_prefetch((const char *)q + KP_PREFETCH + 64 * l, _MM_HINT_T0);
			for (int h = 0; h < 2; h++) {
				sg[h] = _mm256_xor_si256(
					_mm256_load_si256((const __m256i *)(q + 64 * l + 32 * h)), flip);
				a[h] = _mm256_abs_epi8(sg[h]);
			}
			for (int i = 0; i < X; i++) {
				const __m256i xb = _mm256_set1_epi32(
					(int)cpu_rd32((const uint8_t *)x[i * nb + b].q + 4 * l));

				for (int h = 0; h < 2; h++) {
					const __m256i p = _mm256_maddubs_epi16(a[h],
									       _mm256_sign_epi8(xb, sg[h]));

					s[h][i] = _mm256_add_epi32(s[h][i], _mm256_madd_epi16(p, ones));
					/* a chain, as in qgemm.c (a tree spilled) */
					__asm__("" : "+x"(s[h][i]));
				}
			}
		}
		for (int h = 0; h < 2; h++) {
			const __m256 d = _mm256_cvtph_ps(
				_mm_load_si128((const __m128i *)(g + at.d + 16 * h)));

			for (int i = 0; i < X; i++)
				acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h][i]),
							    _mm256_mul_ps(d, _mm256_set1_ps(prep[i * nb + b].d)),
							    acc[h][i]);
		}
	}
	for (int h = 0; h < 2 && 8 * h < rows; h++) {
		const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows - 8 * h),
							_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));

		for (int i = 0; i < X; i++)
			_mm256_maskstore_ps(y + i * ys + 8 * h, keep, acc[h][i]);
	}
}

#define Q8_PASS(X, cold) \
	q8_rows(g, rows, x + i * nb, prep + i * nb, nb, y + i * ys, ys, X, cold)

static TGT_Q8 void kq_q8_0(const uint8_t *g, int rows, const struct qdot_block *x,
			   const struct qgemm_x *prep, int64_t m, int64_t nb, float *y, int64_t ys,
			   bool cold)
{
	int64_t i = 0;

	for (; i + Q8_X <= m; i += Q8_X) {
		if (cold && i == 0)
			Q8_PASS(Q8_X, true);
		else
			Q8_PASS(Q8_X, false);
	}
	for (; i < m; i++) {
		if (cold && i == 0)
			Q8_PASS(1, true);
		else
			Q8_PASS(1, false);
	}
}
#endif

/*
 * The in-place kernels, each with the most activation rows it is taken for.
 * In place, every pass of 8 rows over a Q4_K / Q5_K group splits the
 * nibbles again; a panel is built once a call, but from memory, and is
 * then read at 2.2 times the bytes. 1B-shaped Q4_K_M at 2 threads, in
 * place against panels: pp64 +4 %, pp96 +1 %, pp128 -6 %, pp512 -5 %
 * (docs/BENCHMARKS.md), so up to 64 rows. AVX-512 VNNI only: the same
 * kernel on the 256-bit sets was even with panels from the 256-bit
 * builders at pp16-64 (AVX2: behind at pp32), so it was not kept. AVX2's
 * Q8_0 kernel reads the panel's own bytes and splits nothing, so at any
 * m: the build it skips copied weights from memory with the arithmetic
 * idle (1B-shaped Q8_0 pp16 at 1 thread +30 %, pp64 at 2 threads +17-20 %).
 */
struct inplace_kernel {
	enum qdot_isa isa;
	uint32_t type;
	kpack_qgemm_fn fn;
	int64_t max_m;
};

static const struct inplace_kernel *inplace_kernel(enum qdot_isa isa, uint32_t type)
{
#if defined(__x86_64__)
	static const struct inplace_kernel kernels[] = {
		{ QDOT_VNNI, LOOM_TYPE_Q4_K, kq_q4k, 64 },
		{ QDOT_VNNI, LOOM_TYPE_Q5_K, kq_q5k, 64 },
		{ QDOT_AVX2, LOOM_TYPE_Q8_0, kq_q8_0, INT64_MAX },
	};

	for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
		if (kernels[i].isa == isa && kernels[i].type == type)
			return &kernels[i];
#else
	(void)isa;
	(void)type;
#endif
	return NULL;
}

int64_t kpack_qgemm_max_m(enum qdot_isa isa, uint32_t type)
{
	const struct inplace_kernel *k = inplace_kernel(isa, type);

	return k ? k->max_m : 0;
}

kpack_qgemm_fn kpack_qgemm(enum qdot_isa isa, uint32_t type)
{
	const struct inplace_kernel *k = inplace_kernel(isa, type);

	return k && qdot_isa_supported(isa) ? k->fn : NULL;
}
