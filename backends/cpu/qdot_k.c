/*
 * Integer dot products of the K-quants (Q2_K .. Q6_K) against activation
 * rows quantized to 8 bits with a scale per 32 values (struct qdot_kblock,
 * super-blocks of 256).
 *
 * A K-quant super-block holds 16 sub-blocks of 16 values, each value
 * w = d * sc_i * q - dmin * mn_i (the Q2_K/Q4_K/Q5_K minimum) or
 * w = d * sc_i * q with q signed (Q3_K, Q6_K). With x ~ xd_g * xq over
 * group g of 32 values (sub-blocks 2g, 2g + 1):
 *
 *   w . x = d * sum_g xd_g * sum_{i in g} sc_i * sum_e q_e xq_e
 *           - dmin * sum_g xd_g * sum_{i in g} mn_i * bsum_i
 *
 * The signed formats enter the unsigned x signed byte products (maddubs)
 * as u = q + off (off 32 for Q6_K, 4 for Q3_K) with the correction
 * -off * bsum_i per sub-block. All integer sums are exact in int32:
 * maddubs pairs are at most 2 * 63 * 127 < 32768, and |isum_g| of a Q6_K
 * group at most 2 * 128 * (16 * 63 * 127 + 32 * 16 * 127) < 2^31.
 * The float work is a fixed sequence per super-block (qdot.h), so every
 * kernel set equals qdot_k_ref() bit for bit.
 *
 * Compiled without -march flags; each SIMD function carries its target.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "simd.h"
#include "qdot.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define ALWAYS static inline __attribute__((always_inline))

bool qdot_k_format(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_Q2_K:
	case LOOM_TYPE_Q3_K:
	case LOOM_TYPE_Q4_K:
	case LOOM_TYPE_Q5_K:
	case LOOM_TYPE_Q6_K:
		return true;
	default:
		return false;
	}
}

/* Local twins of kernels.c's geometry, so they fold into the kernels. */
static inline size_t kb_bytes(uint32_t t)
{
	switch (t) {
	case LOOM_TYPE_Q2_K: return 84;
	case LOOM_TYPE_Q3_K: return 110;
	case LOOM_TYPE_Q4_K: return 144;
	case LOOM_TYPE_Q5_K: return 176;
	default: return 210; /* Q6_K */
	}
}

/* Byte offset of the f16 d; dmin follows it in the formats with one. */
static inline int kd_off(uint32_t t)
{
	switch (t) {
	case LOOM_TYPE_Q2_K: return 80;
	case LOOM_TYPE_Q3_K: return 108;
	case LOOM_TYPE_Q6_K: return 208;
	default: return 0; /* Q4_K, Q5_K */
	}
}

static inline bool k_min(uint32_t t)
{
	return t == LOOM_TYPE_Q2_K || t == LOOM_TYPE_Q4_K || t == LOOM_TYPE_Q5_K;
}

/* What makes q unsigned. */
static inline int k_off(uint32_t t)
{
	return t == LOOM_TYPE_Q6_K ? 32 : t == LOOM_TYPE_Q3_K ? 4 : 0;
}

/*
 * Where the quants of group g (values 32g .. 32g+31) of super-block b
 * live: u[e] = (lo[e] >> lo_shift & lo_mask) | (hi[e] >> hi_shift &
 * hi_mask) << hi_pos for e < 32 (no hi when hi_mask is 0); q = u - off.
 * Every mask is below 2^(8 - shift), so SIMD shifts of wider lanes, which
 * pull in the next byte's bits from above, still pick the right bits.
 */
struct kgrp {
	const uint8_t *lo, *hi;
	int lo_shift, lo_mask, hi_shift, hi_mask, hi_pos;
};

ALWAYS struct kgrp k_grp(uint32_t t, const uint8_t *b, int g)
{
	switch (t) {
	case LOOM_TYPE_Q2_K:
		return (struct kgrp){ .lo = b + 16 + 32 * (g / 4), .lo_shift = 2 * (g % 4),
				      .lo_mask = 3, .hi = b };
	case LOOM_TYPE_Q3_K: /* the high bit set means "no -4" */
		return (struct kgrp){ .lo = b + 32 + 32 * (g / 4), .lo_shift = 2 * (g % 4),
				      .lo_mask = 3, .hi = b, .hi_shift = g, .hi_mask = 1,
				      .hi_pos = 2 };
	case LOOM_TYPE_Q4_K:
		return (struct kgrp){ .lo = b + 16 + 32 * (g / 2), .lo_shift = 4 * (g % 2),
				      .lo_mask = 15, .hi = b };
	case LOOM_TYPE_Q5_K:
		return (struct kgrp){ .lo = b + 48 + 32 * (g / 2), .lo_shift = 4 * (g % 2),
				      .lo_mask = 15, .hi = b + 16, .hi_shift = g, .hi_mask = 1,
				      .hi_pos = 4 };
	default: /* Q6_K: low nibbles in ql[128], top 2 bits in qh[64] */
		return (struct kgrp){ .lo = b + 64 * (g / 4) + 32 * (g % 2),
				      .lo_shift = 4 * (g / 2 % 2), .lo_mask = 15,
				      .hi = b + 128 + 32 * (g / 4), .hi_shift = 2 * (g % 4),
				      .hi_mask = 3, .hi_pos = 4 };
	}
}

/* ---- activation quantization ---- */

/* Group g (values 32g .. 32g+31) of super-block v into o. */
static void k_quantize_group(const float *v, struct qdot_kblock *o, int g)
{
	float amax = 0.0f, id;
	bool finite = true;

	for (int e = 32 * g; e < 32 * g + 32; e++) {
		float a = fabsf(v[e]);

		finite &= isfinite(a);
		amax = a > amax ? a : amax;
	}
	id = amax > 0.0f ? 127.0f / amax : 0.0f;
	for (int i = 2 * g; i < 2 * g + 2; i++) {
		int sum = 0;

		for (int e = 16 * i; e < 16 * i + 16; e++) {
			long q = finite ? lrintf(v[e] * id) : 0;

			q = q > 127 ? 127 : q < -127 ? -127 : q;
			o->q[e] = (int8_t)q;
			sum += (int)q;
		}
		o->bsums[i] = (int16_t)sum;
	}
	/* a NaN or inf in the group makes its every product NaN */
	o->d[g] = finite ? amax / 127.0f : NAN;
}

void qdot_k_quantize_row_c(const float *x, struct qdot_kblock *out, int64_t k)
{
	for (int64_t b = 0; b < k / 256; b++)
		for (int g = 0; g < 8; g++)
			k_quantize_group(x + 256 * b, out + b, g);
}

#if defined(__x86_64__)
/*
 * qdot_k_quantize_row_c() on 16 lanes, byte for byte (tests/backend/
 * qdot_k.c): max |x| is exact in any order, v * id the same product, the
 * conversion rounds to nearest even as lrintf() does, and the sub-block
 * sums are exact integers.
 */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void k_quantize_row_avx512(const float *x, struct qdot_kblock *out, int64_t k)
{
	const __m512 inf = _mm512_set1_ps(INFINITY);
	const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);

	for (int64_t b = 0; b < k / 256; b++)
		for (int g = 0; g < 8; g++) {
			const float *v = x + 256 * b + 32 * g;
			__m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
			__m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
			/* NaN compares false: not finite */
			bool finite = (_mm512_cmp_ps_mask(a0, inf, _CMP_LT_OQ) &
				       _mm512_cmp_ps_mask(a1, inf, _CMP_LT_OQ)) == 0xffff;
			float m = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
			__m512 id = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
			__m512i q0 = _mm512_setzero_si512(), q1 = q0;

			if (finite) {
				q0 = _mm512_max_epi32(_mm512_min_epi32(
					_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), lim), nlim);
				q1 = _mm512_max_epi32(_mm512_min_epi32(
					_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)), lim), nlim);
			}
			_mm_storeu_si128((__m128i *)(out[b].q + 32 * g), _mm512_cvtepi32_epi8(q0));
			_mm_storeu_si128((__m128i *)(out[b].q + 32 * g + 16), _mm512_cvtepi32_epi8(q1));
			out[b].bsums[2 * g] = (int16_t)_mm512_reduce_add_epi32(q0);
			out[b].bsums[2 * g + 1] = (int16_t)_mm512_reduce_add_epi32(q1);
			out[b].d[g] = finite ? m / 127.0f : NAN;
		}
}
#endif

#if defined(__x86_64__)
/* The same on 8 lanes (AVX2 hosts). */
CPU_TGT_AVX2 static void k_quantize_row_avx2(const float *x, struct qdot_kblock *out, int64_t k)
{
	for (int64_t b = 0; b < k / 256; b++)
		for (int g = 0; g < 8; g++) {
			float amax;
			int sum[2];
			bool finite = cpu_avx2_q32(x + 256 * b + 32 * g, out[b].q + 32 * g, &amax, sum);

			out[b].bsums[2 * g] = (int16_t)sum[0];
			out[b].bsums[2 * g + 1] = (int16_t)sum[1];
			out[b].d[g] = finite ? amax / 127.0f : NAN;
		}
}
#endif

void qdot_k_quantize_row(const float *x, struct qdot_kblock *out, int64_t k)
{
#if defined(__x86_64__)
	if (cpu_detect_isa() >= CPU_ISA_AVX512) {
		k_quantize_row_avx512(x, out, k);
		return;
	}
	if (qdot_isa_supported(QDOT_AVX2)) {
		k_quantize_row_avx2(x, out, k);
		return;
	}
#endif
	qdot_k_quantize_row_c(x, out, k);
}

/* ---- plain C: the reference, which is also the scalar kernel ---- */

/* The 16 sub-block scales and minima (0 if none), from the GGUF layouts. */
static inline void ref_scales(uint32_t t, const uint8_t *b, int sc[16], int mn[16])
{
	const uint8_t *s;

	for (int i = 0; i < 16; i++) {
		mn[i] = 0;
		switch (t) {
		case LOOM_TYPE_Q2_K: /* scale in the low nibble, min in the high */
			sc[i] = b[i] & 15;
			mn[i] = b[i] >> 4;
			break;
		case LOOM_TYPE_Q3_K: /* 6 bits biased by 32: low nibble in byte
				      * i % 8 (high half for i >= 8), top bits
				      * in byte 8 + i % 4 at bit 2 * (i / 4) */
			s = b + 96;
			sc[i] = (((s[i % 8] >> (4 * (i / 8))) & 15) |
				 ((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32;
			break;
		case LOOM_TYPE_Q6_K:
			sc[i] = (int8_t)b[192 + i];
			break;
		default: /* Q4_K, Q5_K: 6-bit scale and min per group of 32 */
			s = b + 4;
			if (i / 2 < 4) {
				sc[i] = s[i / 2] & 63;
				mn[i] = s[i / 2 + 4] & 63;
			} else {
				sc[i] = (s[i / 2 + 4] & 15) | (s[i / 2 - 4] >> 6) << 4;
				mn[i] = (s[i / 2 + 4] >> 4) | (s[i / 2] >> 6) << 4;
			}
			break;
		}
	}
}

ALWAYS int k_u(const struct kgrp *q, int e)
{
	int v = (q->lo[e] >> q->lo_shift) & q->lo_mask;

	return v | ((q->hi[e] >> q->hi_shift) & q->hi_mask) << q->hi_pos;
}

#if defined(__x86_64__)
static void unpack_u_avx2(uint32_t t, const uint8_t *p, uint8_t u[256]);
#endif

void qdot_k_unpack(uint32_t t, const uint8_t *p, uint8_t u[256], int sc[16], int mn[16],
		   float *d, float *dmin)
{
#if defined(__x86_64__)
	if (qdot_isa_supported(QDOT_AVX2))
		unpack_u_avx2(t, p, u);
	else
#endif
	for (int g = 0; g < 8; g++) {
		struct kgrp q = k_grp(t, p, g);

		for (int e = 0; e < 32; e++)
			u[32 * g + e] = (uint8_t)k_u(&q, e);
	}
	ref_scales(t, p, sc, mn);
	*d = cpu_fp16_to_f32(cpu_rd16(p + kd_off(t)));
	*dmin = k_min(t) ? cpu_fp16_to_f32(cpu_rd16(p + kd_off(t) + 2)) : 0.0f;
}

int qdot_k_offset(uint32_t t)
{
	return k_off(t);
}

/* y plus a super-block's two terms, in qdot.h's order: S and M, the
 * tree sums of its groups' float terms; d, dmin the weight block's
 * scales. */
ALWAYS float k_accumulate(uint32_t t, float S, float M, float y, float d, float dmin)
{
	y = fmaf(S, d, y);
	if (k_min(t))
		y = fmaf(-M, dmin, y);
	return y;
}

float qdot_k_ref(uint32_t t, const uint8_t *w, const struct qdot_kblock *x, int64_t nb)
{
	const size_t bb = kb_bytes(t);
	const int off = k_off(t);
	float y = 0.0f;

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = w + b * bb;
		float P[8], Q[8];
		int sc[16], mn[16];

		ref_scales(t, p, sc, mn);
		for (int g = 0; g < 8; g++) {
			struct kgrp q = k_grp(t, p, g);
			int32_t isum = 0, msum = 0;

			for (int h = 0; h < 2; h++) {
				int i = 2 * g + h, dot = 0;

				for (int e = 16 * h; e < 16 * h + 16; e++)
					dot += k_u(&q, e) * x[b].q[32 * g + e];
				isum += sc[i] * (dot - off * x[b].bsums[i]);
				msum += mn[i] * x[b].bsums[i];
			}
			P[g] = (float)isum * x[b].d[g];
			Q[g] = (float)msum * x[b].d[g];
		}
		y = k_accumulate(t, qdot_k_tree8(P), qdot_k_tree8(Q), y,
				 cpu_fp16_to_f32(cpu_rd16(p + kd_off(t))),
				 k_min(t) ? cpu_fp16_to_f32(cpu_rd16(p + kd_off(t) + 2)) : 0.0f);
	}
	return y;
}

#define QDOT_K_ONE(attr, name, T, body)                                           \
	static attr void name(           const uint8_t *w, size_t ws,                      \
					 const struct qdot_kblock *x, int64_t nb, float *y, \
					 int rows)                                          \
	{                                                                                  \
		int r = 0;                                                                 \
		for (; r + 4 <= rows; r += 4) {                                            \
			cpu_prefetch(w + r * ws, 4 * ws);                                  \
			body(T, w + r * ws, ws, x, nb, y + r, 4);                           \
		}                                                                          \
		cpu_prefetch(w + r * ws, (size_t)(rows - r) * ws);                         \
		for (; r < rows; r++)                                                      \
			body(T, w + r * ws, ws, x, nb, y + r, 1);                           \
	}
ALWAYS void scalar_rows(uint32_t t, const uint8_t *w, size_t ws, const struct qdot_kblock *x,
			int64_t nb, float *y, int R)
{
	for (int r = 0; r < R; r++)
		y[r] = qdot_k_ref(t, w + r * ws, x, nb);
}

/* the scalar set: one function per format, and its table */
QDOT_K_ONE(, scalar_q2_K, LOOM_TYPE_Q2_K, scalar_rows)
QDOT_K_ONE(, scalar_q3_K, LOOM_TYPE_Q3_K, scalar_rows)
QDOT_K_ONE(, scalar_q4_K, LOOM_TYPE_Q4_K, scalar_rows)
QDOT_K_ONE(, scalar_q5_K, LOOM_TYPE_Q5_K, scalar_rows)
QDOT_K_ONE(, scalar_q6_K, LOOM_TYPE_Q6_K, scalar_rows)
static const qdot_k_fn scalar_kset[] = {
	scalar_q2_K,
	scalar_q3_K,
	scalar_q4_K,
	scalar_q5_K,
	scalar_q6_K,
};

#if defined(__x86_64__)

#define TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TGT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define TGT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/*
 * The 16 sub-block scales (signed bytes) and minima (unsigned bytes) of
 * super-block b in registers. The 6-bit packings are unpacked four bytes
 * at a time in 32-bit words (a, c, e: the packed bytes 0-3, 4-7, 8-11).
 */
TGT_AVX2 ALWAYS void k_scales_v(uint32_t t, const uint8_t *b, __m128i *sc, __m128i *mn)
{
	const uint32_t lo4 = 0x0f0f0f0fu, b45 = 0x30303030u;
	uint32_t a, c, e;
	__m128i raw;

	*mn = _mm_setzero_si128();
	switch (t) {
	case LOOM_TYPE_Q2_K:
		raw = _mm_loadu_si128((const __m128i *)b);
		*sc = _mm_and_si128(raw, _mm_set1_epi8(15));
		*mn = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
		return;
	case LOOM_TYPE_Q6_K:
		*sc = _mm_loadu_si128((const __m128i *)(b + 192));
		return;
	case LOOM_TYPE_Q3_K:
		a = cpu_rd32(b + 96);
		c = cpu_rd32(b + 100);
		e = cpu_rd32(b + 104);
		*sc = _mm_setr_epi32((int)((a & lo4) | ((e << 4) & b45)),
				     (int)((c & lo4) | ((e << 2) & b45)),
				     (int)(((a >> 4) & lo4) | (e & b45)),
				     (int)(((c >> 4) & lo4) | ((e >> 2) & b45)));
		*sc = _mm_sub_epi8(*sc, _mm_set1_epi8(32));
		return;
	default: /* Q4_K, Q5_K: per group of 32, so each byte twice */
		/* dwords of b: d and dmin, then a, c, e; the scales are
		 *   a & 3f3f3f3f, (e & lo4) | (a >> 2 & b45)
		 * and the minima
		 *   c & 3f3f3f3f, (e >> 4 & lo4) | (c >> 2 & b45) */
		raw = _mm_loadu_si128((const __m128i *)b);
		raw = _mm_or_si128(
			_mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(raw, 0xed), /* a e c e */
						     _mm_setr_epi32(0, 0, 0, 4)),
				      _mm_setr_epi32(0x3f3f3f3f, (int)lo4, 0x3f3f3f3f, (int)lo4)),
			_mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(raw, 0xa5), 2), /* a a c c */
				      _mm_setr_epi32(0, (int)b45, 0, (int)b45)));
		*sc = _mm_unpacklo_epi8(raw, raw);
		*mn = _mm_unpackhi_epi8(raw, raw);
		return;
	}
}

/* The lane sums of eight vectors, v[g]'s in lane g (exact in int32). */
TGT_AVX2 ALWAYS __m256i sum8_i32(const __m256i v[8])
{
	/* per 128-bit half: v[0 .. 3]'s sums of that half's lanes, then v[4 .. 7]'s */
	__m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
	__m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));

	return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
				_mm256_permute2x128_si256(a, b, 0x31));
}

/*
 * The parts every set shares, in lane g for group g (sub-blocks 2g, 2g + 1:
 * madd's pairs): the offset correction -off * sum sc_i * bsum_i (to add
 * to the products), and the minima's msum_g in *mv (zeros if none). S is
 * the 16 scales as int16.
 */
TGT_AVX2 ALWAYS __m256i k_fix(uint32_t t, const struct qdot_kblock *x, __m256i S, __m128i mn,
			      __m256i *mv)
{
	__m256i bs = _mm256_loadu_si256((const __m256i *)x->bsums), fix = _mm256_setzero_si256();

	*mv = fix;
	if (k_min(t))
		*mv = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mn), bs);
	if (k_off(t)) /* off is 32 or 4 */
		fix = _mm256_sub_epi32(fix, _mm256_slli_epi32(_mm256_madd_epi16(S, bs),
							      k_off(t) == 32 ? 5 : 2));
	return fix;
}

/* qdot.h's P_g and Q_g (lane g) from the groups' integers isum and msum
 * (lane g) and the activation block's scales xd; Q zeros without minima. */
TGT_AVX2 ALWAYS void k_prods(uint32_t t, __m256i isum, __m256i msum, const float *xd, __m256 *P,
			     __m256 *Q)
{
	const __m256 d = _mm256_loadu_ps(xd);

	*P = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d);
	*Q = k_min(t) ? _mm256_mul_ps(_mm256_cvtepi32_ps(msum), d) : _mm256_setzero_ps();
}

/* S and M of one row: the tree by two horizontal adds ([P0+P1, P2+P3,
 * Q0+Q1, Q2+Q3] per half, then the pairs of those) and one add of the
 * halves. */
TGT_AVX2 ALWAYS void k_tree(__m256 P, __m256 Q, float *S, float *M)
{
	__m256 h = _mm256_hadd_ps(P, Q);
	__m128 s;

	h = _mm256_hadd_ps(h, h);
	s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
	*S = _mm_cvtss_f32(s);
	*M = _mm_cvtss_f32(_mm_movehdup_ps(s));
}

/* The trees of four rows' P, row r's in lane r: per half, hadd twice
 * gives [(P0+P1)+(P2+P3)] of each row, then the halves add. */
TGT_AVX2 ALWAYS __m128 k_tree4(const __m256 P[4])
{
	__m256 h = _mm256_hadd_ps(_mm256_hadd_ps(P[0], P[1]), _mm256_hadd_ps(P[2], P[3]));

	return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The 32 unsigned quants of group g: lo (and hi) shifted per 16-bit lane. */
TGT_AVX2 ALWAYS __m256i avx2_quants(uint32_t t, const uint8_t *p, int g)
{
	struct kgrp q = k_grp(t, p, g);
	__m256i u = _mm256_loadu_si256((const __m256i *)q.lo), h;

	u = _mm256_and_si256(_mm256_srli_epi16(u, q.lo_shift), _mm256_set1_epi8((char)q.lo_mask));
	if (!q.hi_mask)
		return u;
	h = _mm256_loadu_si256((const __m256i *)q.hi);
	h = _mm256_and_si256(_mm256_srli_epi16(h, q.hi_shift), _mm256_set1_epi8((char)q.hi_mask));
	return _mm256_or_si256(u, _mm256_slli_epi16(h, q.hi_pos));
}

/* qdot_k_unpack()'s values with the kernels' group decoding. */
TGT_AVX2 static void unpack_u_avx2(uint32_t t, const uint8_t *p, uint8_t u[256])
{
	switch (t) {
#define UNPACK_CASE(T)                                                                     \
	case T:                                                                            \
		for (int g = 0; g < 8; g++)                                                \
			_mm256_storeu_si256((__m256i *)(u + 32 * g), avx2_quants(T, p, g)); \
		break;
	UNPACK_CASE(LOOM_TYPE_Q2_K)
	UNPACK_CASE(LOOM_TYPE_Q3_K)
	UNPACK_CASE(LOOM_TYPE_Q4_K)
	UNPACK_CASE(LOOM_TYPE_Q5_K)
	UNPACK_CASE(LOOM_TYPE_Q6_K)
#undef UNPACK_CASE
	}
}

/* P and Q of super-block p with 8 int32 lanes a group (AVX2). */
TGT_AVX2 ALWAYS void avx2_sb(uint32_t t, const uint8_t *p, const struct qdot_kblock *x, __m256 *P,
			     __m256 *Q)
{
	/* within each 128-bit half: int16 0 of the dword eight times, or 1 */
	const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
						2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
	__m128i sc, mn;
	__m256i Sc, fix, mv, v[8];

	k_scales_v(t, p, &sc, &mn);
	Sc = _mm256_cvtepi8_epi16(sc);
	fix = k_fix(t, x, Sc, mn, &mv);
#pragma GCC unroll 8
	for (int g = 0; g < 8; g++) {
		__m256i prod = _mm256_maddubs_epi16(
			avx2_quants(t, p, g), _mm256_loadu_si256((const __m256i *)(x->q + 32 * g)));
		/* scale of sub-block 2g in int16 lanes 0-7, of 2g + 1 in 8-15 */
		__m256i s = _mm256_permutevar8x32_epi32(Sc, _mm256_set1_epi32(g));

		v[g] = _mm256_madd_epi16(prod, _mm256_shuffle_epi8(s, spread));
	}
	k_prods(t, _mm256_add_epi32(sum8_i32(v), fix), mv, x->d, P, Q);
}

TGT_AVX2 ALWAYS float avx2_h(const uint8_t *p)
{
	return _cvtsh_ss(cpu_rd16(p));
}

/* The f16 at byte off of four super-blocks ws apart, as floats. */
TGT_AVX2 ALWAYS __m128 k_half4(const uint8_t *p, size_t ws, int off)
{
	return _mm_cvtph_ps(_mm_setr_epi16((short)cpu_rd16(p + off), (short)cpu_rd16(p + ws + off),
					   (short)cpu_rd16(p + 2 * ws + off),
					   (short)cpu_rd16(p + 3 * ws + off), 0, 0, 0, 0));
}

/*
 * R rows, super-block by super-block; sb computes one block's P and Q.
 * Four rows at a time share the float work after the products: their
 * trees in one pass (k_tree4()) and k_accumulate()'s two fused
 * multiply-adds as one vector operation with row r in lane r (the same
 * IEEE operations on the same values, so the bits of the one-row loop).
 */
#define K_ROWS(attr, name, sb)                                                             \
	attr ALWAYS void name(uint32_t t, const uint8_t *w, size_t ws,                      \
			      const struct qdot_kblock *x, int64_t nb, float *y, int R)     \
	{                                                                                  \
		const size_t bb = kb_bytes(t);                                              \
		__m256 P[4], Q[4];                                                          \
		__m128 acc = _mm_setzero_ps();                                              \
                                                                                           \
		if (R != 4) {                                                               \
			for (int r = 0; r < R; r++) {                                       \
				float v = 0.0f, S, M;                                       \
                                                                                           \
				for (int64_t b = 0; b < nb; b++) {                          \
					const uint8_t *p = w + r * ws + b * bb;             \
                                                                                           \
					sb(t, p, x + b, &P[0], &Q[0]);                      \
					k_tree(P[0], Q[0], &S, &M);                         \
					v = k_accumulate(t, S, M, v, avx2_h(p + kd_off(t)), \
							 k_min(t) ? avx2_h(p + kd_off(t) + 2) : 0.0f); \
				}                                                           \
				y[r] = v;                                                   \
			}                                                                   \
			return;                                                             \
		}                                                                          \
		for (int64_t b = 0; b < nb; b++) {                                          \
			const uint8_t *p = w + b * bb;                                      \
                                                                                           \
			for (int r = 0; r < 4; r++)                                         \
				sb(t, p + r * ws, x + b, &P[r], &Q[r]);                     \
			acc = _mm_fmadd_ps(k_tree4(P), k_half4(p, ws, kd_off(t)), acc);     \
			if (k_min(t))                                                       \
				acc = _mm_fnmadd_ps(k_tree4(Q), k_half4(p, ws, kd_off(t) + 2), acc); \
		}                                                                          \
		_mm_storeu_ps(y, acc);                                                      \
	}

K_ROWS(TGT_AVX2, avx2_rows, avx2_sb)
/* the avx2 set: one function per format, and its table */
QDOT_K_ONE(TGT_AVX2, avx2_q2_K, LOOM_TYPE_Q2_K, avx2_rows)
QDOT_K_ONE(TGT_AVX2, avx2_q3_K, LOOM_TYPE_Q3_K, avx2_rows)
QDOT_K_ONE(TGT_AVX2, avx2_q4_K, LOOM_TYPE_Q4_K, avx2_rows)
QDOT_K_ONE(TGT_AVX2, avx2_q5_K, LOOM_TYPE_Q5_K, avx2_rows)
QDOT_K_ONE(TGT_AVX2, avx2_q6_K, LOOM_TYPE_Q6_K, avx2_rows)
static const qdot_k_fn avx2_kset[] = {
	avx2_q2_K,
	avx2_q3_K,
	avx2_q4_K,
	avx2_q5_K,
	avx2_q6_K,
};

/* ---- AVX-512: 64 values (groups 2j, 2j + 1) per step ---- */

TGT_AVX512 ALWAYS __m512i join2(const uint8_t *a, const uint8_t *b)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
				  _mm256_loadu_si256((const __m256i *)b), 1);
}

/* The 64 unsigned quants of groups 2j and 2j + 1. */
TGT_AVX512 ALWAYS __m512i avx512_quants(uint32_t t, const uint8_t *p, int j)
{
	struct kgrp a = k_grp(t, p, 2 * j), b = k_grp(t, p, 2 * j + 1);
	__m512i u = join2(a.lo, b.lo), h;

	u = _mm512_srlv_epi64(u, _mm512_setr_epi64(a.lo_shift, a.lo_shift, a.lo_shift, a.lo_shift,
						   b.lo_shift, b.lo_shift, b.lo_shift, b.lo_shift));
	u = _mm512_and_si512(u, _mm512_set1_epi8((char)a.lo_mask));
	if (!a.hi_mask)
		return u;
	h = join2(a.hi, b.hi);
	h = _mm512_srlv_epi64(h, _mm512_setr_epi64(a.hi_shift, a.hi_shift, a.hi_shift, a.hi_shift,
						   b.hi_shift, b.hi_shift, b.hi_shift, b.hi_shift));
	h = _mm512_and_si512(h, _mm512_set1_epi8((char)a.hi_mask));
	return _mm512_or_si512(u, _mm512_slli_epi16(h, a.hi_pos));
}

/* Scale of sub-block 4j + e / 8 in int16 lane e. */
TGT_AVX512 ALWAYS __m512i avx512_scales(__m256i S, int j)
{
	__m512i idx = _mm512_add_epi16(_mm512_srli_epi16(_mm512_setr_epi64(
		0x0003000200010000ll, 0x0007000600050004ll, 0x000b000a00090008ll,
		0x000f000e000d000cll, 0x0013001200110010ll, 0x0017001600150014ll,
		0x001b001a00190018ll, 0x001f001e001d001cll), 3), _mm512_set1_epi16((short)(4 * j)));

	return _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(S));
}

TGT_AVX512 ALWAYS __m512i bw_scaled(__m512i acc, __m512i prod, __m512i s)
{
	return _mm512_add_epi32(acc, _mm512_madd_epi16(prod, s));
}

TGT_VNNI ALWAYS __m512i vnni_scaled(__m512i acc, __m512i prod, __m512i s)
{
	return _mm512_dpwssd_epi32(acc, prod, s);
}

/*
 * The lane sums of four AVX-512 vectors whose 128-bit lanes 0, 1 belong to
 * group 2j of z[j] and lanes 2, 3 to group 2j + 1: group g's in lane g.
 * Two rounds of unpack-and-add leave in 128-bit lane k the lane-k sums of
 * z[0 .. 3]; the lanes reordered 0, 2, 1, 3 and the halves added give
 * groups 0, 2, 4, 6, 1, 3, 5, 7, put in order by one permute. Exact int32.
 */
TGT_AVX512 ALWAYS __m256i sum4x2_i32(const __m512i z[4])
{
	__m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]),
				     _mm512_unpackhi_epi32(z[0], z[1]));
	__m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]),
				     _mm512_unpackhi_epi32(z[2], z[3]));
	__m512i c = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
	__m256i e;

	c = _mm512_shuffle_i32x4(c, c, _MM_SHUFFLE(3, 1, 2, 0));
	e = _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
	return _mm256_permutevar8x32_epi32(e, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/*
 * P and Q of super-block p (AVX-512): 64 values a step, group 2j's
 * products in the low 8 int32 lanes and 2j + 1's in the high 8.
 */
#define K_SB512(attr, name, SCALED)                                                        \
	attr ALWAYS void name(uint32_t t, const uint8_t *p, const struct qdot_kblock *x,     \
			      __m256 *P, __m256 *Q)                                         \
	{                                                                                  \
		__m256i Sc, fix, mv;                                                        \
		__m512i z[4];                                                               \
		__m128i sc, mn;                                                             \
                                                                                           \
		k_scales_v(t, p, &sc, &mn);                                                 \
		Sc = _mm256_cvtepi8_epi16(sc);                                              \
		fix = k_fix(t, x, Sc, mn, &mv);                                             \
		_Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                         \
		{                                                                          \
			__m512i prod = _mm512_maddubs_epi16(                                \
				avx512_quants(t, p, j),                                     \
				_mm512_loadu_si512((const void *)(x->q + 64 * j)));         \
                                                                                           \
			z[j] = SCALED(_mm512_setzero_si512(), prod, avx512_scales(Sc, j));  \
		}                                                                          \
		k_prods(t, _mm256_add_epi32(sum4x2_i32(z), fix), mv, x->d, P, Q);           \
	}

K_SB512(TGT_AVX512, avx512_sb, bw_scaled)
K_SB512(TGT_VNNI, vnni_sb, vnni_scaled)
K_ROWS(TGT_AVX512, avx512_rows, avx512_sb)
K_ROWS(TGT_VNNI, vnni_rows, vnni_sb)
/* the avx512 set: one function per format, and its table */
QDOT_K_ONE(TGT_AVX512, avx512_q2_K, LOOM_TYPE_Q2_K, avx512_rows)
QDOT_K_ONE(TGT_AVX512, avx512_q3_K, LOOM_TYPE_Q3_K, avx512_rows)
QDOT_K_ONE(TGT_AVX512, avx512_q4_K, LOOM_TYPE_Q4_K, avx512_rows)
QDOT_K_ONE(TGT_AVX512, avx512_q5_K, LOOM_TYPE_Q5_K, avx512_rows)
QDOT_K_ONE(TGT_AVX512, avx512_q6_K, LOOM_TYPE_Q6_K, avx512_rows)
static const qdot_k_fn avx512_kset[] = {
	avx512_q2_K,
	avx512_q3_K,
	avx512_q4_K,
	avx512_q5_K,
	avx512_q6_K,
};
/* the vnni set: one function per format, and its table */
QDOT_K_ONE(TGT_VNNI, vnni_q2_K, LOOM_TYPE_Q2_K, vnni_rows)
QDOT_K_ONE(TGT_VNNI, vnni_q3_K, LOOM_TYPE_Q3_K, vnni_rows)
QDOT_K_ONE(TGT_VNNI, vnni_q4_K, LOOM_TYPE_Q4_K, vnni_rows)
QDOT_K_ONE(TGT_VNNI, vnni_q5_K, LOOM_TYPE_Q5_K, vnni_rows)
QDOT_K_ONE(TGT_VNNI, vnni_q6_K, LOOM_TYPE_Q6_K, vnni_rows)
static const qdot_k_fn vnni_kset[] = {
	vnni_q2_K,
	vnni_q3_K,
	vnni_q4_K,
	vnni_q5_K,
	vnni_q6_K,
};

#endif /* __x86_64__ */

qdot_k_fn qdot_k_kernel(enum qdot_isa isa, uint32_t type)
{
	int f;

	switch (type) {
	case LOOM_TYPE_Q2_K: f = 0; break;
	case LOOM_TYPE_Q3_K: f = 1; break;
	case LOOM_TYPE_Q4_K: f = 2; break;
	case LOOM_TYPE_Q5_K: f = 3; break;
	case LOOM_TYPE_Q6_K: f = 4; break;
	default: return NULL;
	}
	if (!qdot_isa_supported(isa))
		return NULL;
	switch (isa) {
#if defined(__x86_64__)
	case QDOT_AVX2:
	case QDOT_AVXVNNI: /* the same bits on every set; AVX2's kernels */
		return avx2_kset[f];
	case QDOT_AVX512: return avx512_kset[f];
	case QDOT_VNNI: return vnni_kset[f];
#endif
	case QDOT_SCALAR: return scalar_kset[f];
	default: return NULL;
	}
}
