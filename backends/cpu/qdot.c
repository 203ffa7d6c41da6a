/*
 * Integer dot products: a weight row (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) times
 * an activation row quantized to 8 bits (struct qdot_block), block by block.
 *
 * For weight block b with integers wq[e] and scale dw (and minimum mw for
 * the offset formats), and activation block x[b]:
 *
 *   w . x  =  sum_b  dw * x[b].d * sum_e wq[e] * x[b].q[e]  +  mw * x[b].s
 *
 * The inner sums are exact in int32, so the only roundings are the float
 * lanes' fused multiply-adds and their final reduction. Those are fixed per
 * kernel set (qdot.h) and written out in plain C in ref8(), ref16() and
 * refseq() (one float, block after block), which the SIMD kernels match
 * bit for bit.
 *
 * Signed weights (Q8_0, Q4_0, Q5_0) enter the unsigned x signed byte
 * products (maddubs, vpdpbusd) as |wq| times x with wq's sign; the offset
 * formats' wq are unsigned already. No int16 pair sum can saturate:
 * 2 * 128 * 127 < 32768.
 *
 * Compiled without -march flags; each SIMD function carries its target.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "dot256.h"
#include "qdot.h"
#include "simd.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#define ALWAYS static inline __attribute__((always_inline))

bool qdot_format(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_Q8_0:
	case LOOM_TYPE_Q4_0:
	case LOOM_TYPE_Q4_1:
	case LOOM_TYPE_Q5_0:
	case LOOM_TYPE_Q5_1:
	case LOOM_TYPE_MXFP4:
		return true;
	default:
		return false;
	}
}

/* AVX-VNNI (CPUID leaf 7, sub-leaf 1, EAX bit 4): this gcc's
 * __builtin_cpu_supports does not know it. The OS saves the YMM state
 * wherever AVX2 runs, which the callers check first. */
static bool has_avxvnni(void)
{
#if defined(__x86_64__)
	unsigned a, b, c, d;

	return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
#else
	return false;
#endif
}

bool qdot_isa_supported(enum qdot_isa isa)
{
	enum cpu_isa best = cpu_detect_isa();

	switch (isa) {
	case QDOT_SCALAR:
		return true;
	case QDOT_AVX2:
		return best >= CPU_ISA_AVX2;
	case QDOT_AVX512:
		return best >= CPU_ISA_AVX512;
	case QDOT_VNNI:
#if defined(__x86_64__)
		return best >= CPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
#endif
	case QDOT_AVXVNNI:
		return best >= CPU_ISA_AVX2 && has_avxvnni();
	default:
		return false;
	}
}

const char *qdot_isa_name(enum qdot_isa isa)
{
	static const char *const names[] = { "scalar", "avx2", "avx512", "avx512-vnni",
					     "avx-vnni" };

	return isa < QDOT_N_ISA ? names[isa] : "?";
}

/* Local twins of kernels.c's geometry, so they fold into the kernels. */
static inline size_t block_bytes(uint32_t t)
{
	switch (t) {
	case LOOM_TYPE_Q8_0: return 34;
	case LOOM_TYPE_Q4_0: return 18;
	case LOOM_TYPE_Q4_1: return 20;
	case LOOM_TYPE_Q5_0: return 22;
	case LOOM_TYPE_MXFP4: return 17;
	default: return 24; /* Q5_1 */
	}
}

static inline bool has_min(uint32_t t)
{
	return t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_1;
}

/* ---- activation quantization ---- */

void qdot_quantize_row_c(const float *x, struct qdot_block *out, int64_t k)
{
	for (int64_t b = 0; b < k / 32; b++) {
		const float *v = x + 32 * b;
		float amax = 0.0f, id;
		bool finite = true;
		int sum = 0;

		for (int e = 0; e < 32; e++) {
			float a = fabsf(v[e]);

			finite &= isfinite(a);
			amax = a > amax ? a : amax;
		}
		id = amax > 0.0f ? 127.0f / amax : 0.0f;
		for (int e = 0; e < 32; e++) {
			long q = finite ? lrintf(v[e] * id) : 0;

			q = q > 127 ? 127 : q < -127 ? -127 : q;
			out[b].q[e] = (int8_t)q;
			sum += (int)q;
		}
		/* a NaN or inf in the block makes its every product NaN */
		out[b].d = finite ? amax / 127.0f : NAN;
		out[b].s = out[b].d * (float)sum;
	}
}

#if defined(__x86_64__)
/*
 * The same arithmetic on 16 lanes: max |x| is exact in any order, v * id
 * is the same float product, and the conversion rounds to nearest even as
 * lrintf() does in the default rounding mode; so the blocks are
 * qdot_quantize_row_c()'s byte for byte (tests/backend/qdot.c).
 */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void quantize_row_avx512(const float *x, struct qdot_block *out, int64_t k)
{
	const __m512 inf = _mm512_set1_ps(INFINITY);
	const __m512i lim = _mm512_set1_epi32(127);

	for (int64_t b = 0; b < k / 32; b++) {
		__m512 lo = _mm512_loadu_ps(x + 32 * b), hi = _mm512_loadu_ps(x + 32 * b + 16);
		__m512 alo = _mm512_abs_ps(lo), ahi = _mm512_abs_ps(hi);
		/* NaN compares false: not finite */
		bool finite = (_mm512_cmp_ps_mask(alo, inf, _CMP_LT_OQ) &
			       _mm512_cmp_ps_mask(ahi, inf, _CMP_LT_OQ)) == 0xffff;
		float amax = _mm512_reduce_max_ps(_mm512_max_ps(alo, ahi));
		float id = amax > 0.0f ? 127.0f / amax : 0.0f;
		__m512i qlo = _mm512_setzero_si512(), qhi = _mm512_setzero_si512();

		if (finite) {
			qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(id)));
			qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(id)));
			qlo = _mm512_max_epi32(_mm512_min_epi32(qlo, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
			qhi = _mm512_max_epi32(_mm512_min_epi32(qhi, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
		}
		_mm_storeu_si128((__m128i *)out[b].q, _mm512_cvtepi32_epi8(qlo));
		_mm_storeu_si128((__m128i *)(out[b].q + 16), _mm512_cvtepi32_epi8(qhi));
		out[b].d = finite ? amax / 127.0f : NAN;
		out[b].s = out[b].d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
	}
}
#endif

#if defined(__x86_64__)
/* The same on 8 lanes (AVX2 hosts: in C it was 5-6 % of a 1B-shaped
 * prefill there). */
CPU_TGT_AVX2 static void quantize_row_avx2(const float *x, struct qdot_block *out, int64_t k)
{
	for (int64_t b = 0; b < k / 32; b++) {
		float amax;
		int sum[2];
		bool finite = cpu_avx2_q32(x + 32 * b, out[b].q, &amax, sum);

		out[b].d = finite ? amax / 127.0f : NAN;
		out[b].s = out[b].d * (float)(sum[0] + sum[1]);
	}
}
#endif

void qdot_quantize_row(const float *x, struct qdot_block *out, int64_t k)
{
#if defined(__x86_64__)
	if (cpu_detect_isa() >= CPU_ISA_AVX512) {
		quantize_row_avx512(x, out, k);
		return;
	}
	if (qdot_isa_supported(QDOT_AVX2)) {
		quantize_row_avx2(x, out, k);
		return;
	}
#endif
	qdot_quantize_row_c(x, out, k);
}

void qdot_row_scales(const struct qdot_block *x, int64_t nb, float *sc)
{
	memset(sc, 0, (size_t)qdot_scales_len(nb) * sizeof(*sc));
	for (int64_t b = 0; b < nb; b++) {
		sc[b / 16 * 32 + b % 16] = x[b].d;
		sc[b / 16 * 32 + 16 + b % 16] = x[b].s;
	}
}

/* ---- plain C: the references, and the scalar kernels ---- */

/* MXFP4's doubled E2M1 codes (cpu_mxfp4_scale() is the halved scale). */
static const int8_t mxfp4_q[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/* Weight block p of type t: its 32 integers, scale and minimum (0 if none). */
ALWAYS void unpack(uint32_t t, const uint8_t *p, int8_t q[32], float *d, float *m)
{
	uint32_t qh;

	*m = 0.0f;
	if (t == LOOM_TYPE_MXFP4) {
		*d = cpu_mxfp4_scale(p[0]);
		for (int j = 0; j < 16; j++) {
			q[j] = mxfp4_q[p[1 + j] & 15];
			q[j + 16] = mxfp4_q[p[1 + j] >> 4];
		}
		return;
	}
	*d = cpu_fp16_to_f32(cpu_rd16(p));
	switch (t) {
	case LOOM_TYPE_Q8_0:
		memcpy(q, p + 2, 32);
		break;
	case LOOM_TYPE_Q4_0:
		for (int j = 0; j < 16; j++) {
			q[j] = (int8_t)((p[2 + j] & 15) - 8);
			q[j + 16] = (int8_t)((p[2 + j] >> 4) - 8);
		}
		break;
	case LOOM_TYPE_Q4_1:
		*m = cpu_fp16_to_f32(cpu_rd16(p + 2));
		for (int j = 0; j < 16; j++) {
			q[j] = (int8_t)(p[4 + j] & 15);
			q[j + 16] = (int8_t)(p[4 + j] >> 4);
		}
		break;
	case LOOM_TYPE_Q5_0:
		qh = cpu_rd32(p + 2);
		for (int j = 0; j < 16; j++) {
			q[j] = (int8_t)(((p[6 + j] & 15) | ((qh >> j & 1) << 4)) - 16);
			q[j + 16] = (int8_t)(((p[6 + j] >> 4) | ((qh >> (j + 16) & 1) << 4)) - 16);
		}
		break;
	default: /* Q5_1 */
		*m = cpu_fp16_to_f32(cpu_rd16(p + 2));
		qh = cpu_rd32(p + 4);
		for (int j = 0; j < 16; j++) {
			q[j] = (int8_t)((p[8 + j] & 15) | ((qh >> j & 1) << 4));
			q[j + 16] = (int8_t)((p[8 + j] >> 4) | ((qh >> (j + 16) & 1) << 4));
		}
		break;
	}
}

/* Exact integer sums of elements 4l .. 4l+3, l < 8: one float lane each. */
ALWAYS void lane_sums(const int8_t *w, const int8_t *x, int32_t s[8])
{
	for (int l = 0; l < 8; l++)
		s[l] = w[4 * l] * x[4 * l] + w[4 * l + 1] * x[4 * l + 1] +
		       w[4 * l + 2] * x[4 * l + 2] + w[4 * l + 3] * x[4 * l + 3];
}

/* (a0+a4 + a2+a6) + (a1+a5 + a3+a7), as the SIMD horizontal sum goes. */
static inline float reduce8(const float a[8])
{
	float v[4];

	for (int i = 0; i < 4; i++)
		v[i] = a[i] + a[i + 4];
	return (v[0] + v[2]) + (v[1] + v[3]);
}

/* 8 lanes, one block at a time (QDOT_SCALAR, QDOT_AVXVNNI; QDOT_AVX2 for MXFP4). */
ALWAYS float ref8(uint32_t t, const uint8_t *w, const struct qdot_block *x, int64_t nb)
{
	const size_t bb = block_bytes(t);
	float acc[8] = { 0 }, accm = 0.0f, d, m;
	int8_t q[32];
	int32_t s[8];

	for (int64_t b = 0; b < nb; b++) {
		unpack(t, w + b * bb, q, &d, &m);
		lane_sums(q, x[b].q, s);
		d = d * x[b].d;
		for (int l = 0; l < 8; l++)
			acc[l] = fmaf((float)s[l], d, acc[l]);
		if (has_min(t))
			accm = fmaf(m, x[b].s, accm);
	}
	return reduce8(acc) + accm;
}

/* (a0+a8) .. (a7+a15) in reduce8()'s order, as avx512_hsum() goes. */
static inline float reduce16(const float a[16])
{
	float r[8];

	for (int i = 0; i < 8; i++)
		r[i] = a[i] + a[i + 8];
	return reduce8(r);
}

/*
 * 16 lanes, blocks in pairs (QDOT_AVX512, QDOT_VNNI): the even block in
 * lanes 0-7, the odd in 8-15; a last unpaired block leaves lanes 8-15 an
 * fma of zeros. The minimum terms of block b go to lane b % 16 of their
 * own accumulator (so 16 blocks' scales convert as one vector), reduced
 * once at the end.
 */
ALWAYS float ref16(uint32_t t, const uint8_t *w, const struct qdot_block *x, int64_t nb)
{
	const size_t bb = block_bytes(t);
	float acc[16] = { 0 }, accm[16] = { 0 }, d, m;
	int8_t q[32];
	int32_t s[8];

	for (int64_t b = 0; b < nb; b += 2) {
		for (int h = 0; h < 2; h++) {
			memset(s, 0, sizeof(s));
			d = 0.0f;
			if (b + h < nb) {
				unpack(t, w + (b + h) * bb, q, &d, &m);
				lane_sums(q, x[b + h].q, s);
				d = d * x[b + h].d;
				if (has_min(t))
					accm[(b + h) % 16] = fmaf(m, x[b + h].s, accm[(b + h) % 16]);
			}
			for (int l = 0; l < 8; l++)
				acc[8 * h + l] = fmaf((float)s[l], d, acc[8 * h + l]);
		}
	}
	return reduce16(acc) + reduce16(accm);
}

/*
 * Block after block (QDOT_VNNI and QDOT_AVX2, all but MXFP4): one float,
 * and for block b with exact integer dot isum_b
 *   acc = fmaf((float)isum_b, dw_b * x[b].d, acc)
 *   acc = fmaf(mw_b, x[b].s, acc)               (Q4_1, Q5_1)
 * qgemm_ref()'s arithmetic: a row's bits are the same in the GEMV, the
 * prefill GEMM and any number of rows per call.
 */
ALWAYS float refseq(uint32_t t, const uint8_t *w, const struct qdot_block *x, int64_t nb)
{
	const size_t bb = block_bytes(t);
	float acc = 0.0f, d, m;
	int8_t q[32];

	for (int64_t b = 0; b < nb; b++) {
		int32_t isum = 0;

		unpack(t, w + b * bb, q, &d, &m);
		for (int e = 0; e < 32; e++)
			isum += q[e] * x[b].q[e];
		acc = fmaf((float)isum, d * x[b].d, acc);
		if (has_min(t))
			acc = fmaf(m, x[b].s, acc);
	}
	return acc;
}

void qdot_unpack_block(uint32_t type, const uint8_t *p, int8_t q[32], float *d, float *m)
{
	unpack(type, p, q, d, m);
}

bool qdot_seq(enum qdot_isa isa, uint32_t type)
{
	return (isa == QDOT_VNNI || isa == QDOT_AVX2) && qdot_format(type) &&
	       type != LOOM_TYPE_MXFP4;
}

float qdot_ref(enum qdot_isa isa, uint32_t type, const uint8_t *w, const struct qdot_block *x,
	       int64_t nb)
{
	if (qdot_seq(isa, type))
		return refseq(type, w, x, nb);
	if (isa == QDOT_AVX512 || isa == QDOT_VNNI)
		return ref16(type, w, x, nb);
	return ref8(type, w, x, nb);
}

/*
 * One function per format, so the block body is specialized for it. The
 * body takes R weight rows w_stride apart at once (R = 4, then 1 for the
 * rest): independent accumulators that overlap their latencies; each row's
 * arithmetic is the same whatever R is.
 */
#define QDOT_ONE(attr, name, T, body)                                             \
	static attr void name(           const uint8_t *w, size_t ws,                      \
					 const struct qdot_block *x, const float *xsc,      \
					 int64_t nb, float *y, int rows)                    \
	{                                                                                  \
		int r = 0;                                                                 \
		for (; r + 4 <= rows; r += 4) {                                            \
			cpu_prefetch(w + r * ws, 4 * ws);                                  \
			body(T, w + r * ws, ws, x, xsc, nb, y + r, 4);                      \
		}                                                                          \
		cpu_prefetch(w + r * ws, (size_t)(rows - r) * ws);                         \
		for (; r < rows; r++)                                                      \
			body(T, w + r * ws, ws, x, xsc, nb, y + r, 1);                      \
	}
ALWAYS void scalar_rows(uint32_t t, const uint8_t *w, size_t ws, const struct qdot_block *x,
			const float *xsc, int64_t nb, float *y, int R)
{
	for (int r = 0; r < R; r++)
		y[r] = ref8(t, w + r * ws, x, nb);
}

/* the scalar set: one function per format, and its table */
QDOT_ONE(, scalar_q8_0, LOOM_TYPE_Q8_0, scalar_rows)
QDOT_ONE(, scalar_q4_0, LOOM_TYPE_Q4_0, scalar_rows)
QDOT_ONE(, scalar_q4_1, LOOM_TYPE_Q4_1, scalar_rows)
QDOT_ONE(, scalar_q5_0, LOOM_TYPE_Q5_0, scalar_rows)
QDOT_ONE(, scalar_q5_1, LOOM_TYPE_Q5_1, scalar_rows)
QDOT_ONE(, scalar_mxfp4, LOOM_TYPE_MXFP4, scalar_rows)
static const qdot_fn scalar_set[] = {
	scalar_q8_0,
	scalar_q4_0,
	scalar_q4_1,
	scalar_q5_0,
	scalar_q5_1,
	scalar_mxfp4,
};

#if defined(__x86_64__)

/* ---- AVX2: 8 lanes, maddubs + madd ---- */


TGT_AVX2 ALWAYS float avx2_h(const uint8_t *p)
{
	return _cvtsh_ss(cpu_rd16(p));
}

/* 16 bytes of nibbles as 32 bytes: low nibbles, then high nibbles (the
 * bytes in both halves, the high half shifted). */
TGT_AVX2 ALWAYS __m256i avx2_nibbles(const uint8_t *qs)
{
	__m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));

	raw = _mm256_srlv_epi64(raw, _mm256_setr_epi64x(0, 0, 4, 4));
	return _mm256_and_si256(raw, _mm256_set1_epi8(15));
}

/* Byte e is 16 where bit e of qh is set, else 0. */
TGT_AVX2 ALWAYS __m256i avx2_fifth_bits(uint32_t qh)
{
	const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
					      2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
	const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
	__m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);

	v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
	return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

/*
 * Operands of weight block p and activation block x: unsigned bytes *u
 * and signed bytes *s whose products are wq[e] * x.q[e]; *d the block's
 * combined scale, *m its minimum.
 */
TGT_AVX2 ALWAYS void avx2_operands(uint32_t t, const uint8_t *p, const struct qdot_block *x,
				   __m256i *u, __m256i *s, float *d, float *m)
{
	__m256i xq = _mm256_loadu_si256((const __m256i *)x->q), w;

	*m = 0.0f;
	if (t == LOOM_TYPE_MXFP4) { /* the codes by byte shuffle, as unpack() */
		const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(
			(const __m128i *)mxfp4_q));

		*d = cpu_mxfp4_scale(p[0]) * x->d;
		w = _mm256_shuffle_epi8(lut, avx2_nibbles(p + 1));
		*u = _mm256_abs_epi8(w);
		*s = _mm256_sign_epi8(xq, w);
		return;
	}
	*d = avx2_h(p) * x->d;
	switch (t) {
	case LOOM_TYPE_Q8_0:
		w = _mm256_loadu_si256((const __m256i *)(p + 2));
		break;
	case LOOM_TYPE_Q4_0:
		w = _mm256_sub_epi8(avx2_nibbles(p + 2), _mm256_set1_epi8(8));
		break;
	case LOOM_TYPE_Q4_1:
		*m = avx2_h(p + 2);
		*u = avx2_nibbles(p + 4);
		*s = xq;
		return;
	case LOOM_TYPE_Q5_0:
		w = _mm256_or_si256(avx2_nibbles(p + 6), avx2_fifth_bits(cpu_rd32(p + 2)));
		w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
		break;
	default: /* Q5_1 */
		*m = avx2_h(p + 2);
		*u = _mm256_or_si256(avx2_nibbles(p + 8), avx2_fifth_bits(cpu_rd32(p + 4)));
		*s = xq;
		return;
	}
	*u = _mm256_abs_epi8(w);
	*s = _mm256_sign_epi8(xq, w);
}

/* reduce8()'s order. */
TGT_AVX2 ALWAYS float avx2_hsum(__m256 a)
{
	__m128 v = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));

	v = _mm_add_ps(v, _mm_movehl_ps(v, v));
	v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
	return _mm_cvtss_f32(v);
}

/* Byte products summed per int32 lane (dot256.h): maddubs and madd
 * (AVX2), or one vpdpbusd (AVX-VNNI). The sums are exact either way. */
TGT_AVX2 ALWAYS __m256i avx2_lanes(__m256i u, __m256i s)
{
	return avx2_dot(_mm256_setzero_si256(), u, s);
}

TGT_AVXVNNI ALWAYS __m256i avxvnni_lanes(__m256i u, __m256i s)
{
	return avxvnni_dot(_mm256_setzero_si256(), u, s);
}

#define AVX2_ROWS(attr, name, LANES)                                                     \
	attr ALWAYS void name(uint32_t t, const uint8_t *w, size_t ws,                     \
			      const struct qdot_block *x, const float *xsc, int64_t nb,    \
			      float *y, int R)                                             \
	{                                                                                  \
		const size_t bb = block_bytes(t);                                          \
		__m256 acc[4];                                                             \
		float accm[4], d, m;                                                       \
                                                                                           \
		(void)xsc;                                                                 \
		for (int r = 0; r < R; r++) {                                              \
			acc[r] = _mm256_setzero_ps();                                      \
			accm[r] = 0.0f;                                                    \
		}                                                                          \
		for (int64_t b = 0; b < nb; b++) {                                         \
			/* Q4_0: nibbles q as they are, less 8 * the lane's sum of x.q */   \
			__m256i xq = _mm256_loadu_si256((const __m256i *)x[b].q);          \
			__m256i fix = _mm256_setzero_si256();                              \
                                                                                           \
			if (t == LOOM_TYPE_Q4_0)                                           \
				fix = LANES(_mm256_set1_epi8(8), xq);                      \
			for (int r = 0; r < R; r++) {                                      \
				const uint8_t *p = w + r * ws + b * bb;                    \
				__m256i u, s, l;                                           \
                                                                                           \
				if (t == LOOM_TYPE_Q4_0) {                                 \
					u = avx2_nibbles(p + 2);                           \
					d = avx2_h(p) * x[b].d;                            \
					l = _mm256_sub_epi32(LANES(u, xq), fix);           \
					acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l),    \
								 _mm256_set1_ps(d), acc[r]); \
					continue;                                          \
				}                                                          \
				avx2_operands(t, p, x + b, &u, &s, &d, &m);                \
				l = LANES(u, s);                                           \
				acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l),            \
							 _mm256_set1_ps(d), acc[r]);       \
				if (has_min(t))                                            \
					accm[r] = fmaf(m, x[b].s, accm[r]);                \
			}                                                                  \
		}                                                                          \
		for (int r = 0; r < R; r++)                                                \
			y[r] = avx2_hsum(acc[r]) + accm[r];                                \
	}

AVX2_ROWS(TGT_AVX2, avx2_rows, avx2_lanes)
AVX2_ROWS(TGT_AVXVNNI, avxvnni_rows, avxvnni_lanes)

/* ---- AVX2 block after block (refseq()): 8 rows in the float lanes ---- */

/* One GEMV per format of a block-after-block set: rows(T, ...) takes up to
 * 8 rows at a time, one a float lane. */
#define SEQ_ONE(attr, name, rows, T)                                                       \
	static attr void name(const uint8_t *w, size_t ws, const struct qdot_block *x,      \
			      const float *xsc, int64_t nb, float *y, int rows_n)          \
	{                                                                                  \
		(void)xsc;                                                                 \
		for (int r = 0; r < rows_n; r += 8) {                                      \
			const int R = rows_n - r < 8 ? rows_n - r : 8;                     \
                                                                                           \
			cpu_prefetch(w + r * ws, (size_t)R * ws);                          \
			rows(T, w + r * ws, ws, x, nb, y + r, R);                          \
		}                                                                          \
	}

/* The 8 int32 lane sums of each of v[0..7], as one vector (exact). */
TGT_AVX2 ALWAYS __m256i seq_sums8(const __m256i v[8])
{
	__m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
	__m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
	__m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);

	return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
				_mm256_permute2x128_si256(u0, u1, 0x31));
}

/* acc after one block of 8 rows (refseq()): their exact sums times
 * d * x.d, then m * x.s (dh, mh: the rows' f16 scales and minima). */
TGT_AVX2 ALWAYS __m256 seq_step(uint32_t t, const uint16_t *dh, const uint16_t *mh,
				const struct qdot_block *x, __m256i sums, __m256 acc)
{
	const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)),
				       _mm256_set1_ps(x->d));

	acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc);
	if (has_min(t))
		acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh)),
				      _mm256_set1_ps(x->s), acc);
	return acc;
}

/* The first R lanes of acc to y. */
TGT_AVX2 ALWAYS void seq_store(__m256 acc, float *y, int R)
{
	float out[8];

	_mm256_storeu_ps(out, acc);
	memcpy(y, out, (size_t)R * sizeof(float));
}

/* R <= 8 rows (row r at w + r * ws), lane r of the float accumulator; the
 * operands of avx2_operands() (|q| times x with q's sign for the signed
 * formats), each row's lane sums added across by seq_sums8(). */
TGT_AVX2 ALWAYS void seq_rows_avx2(uint32_t t, const uint8_t *w, size_t ws,
				   const struct qdot_block *x, int64_t nb, float *y, int R)
{
	const size_t bb = block_bytes(t);
	__m256 acc = _mm256_setzero_ps();

	for (int64_t b = 0; b < nb; b++) {
		uint16_t dh[8] = { 0 }, mh[8] = { 0 };
		__m256i v[8];

		for (int r = 0; r < 8; r++) {
			const uint8_t *p = w + (size_t)(r < R ? r : 0) * ws + b * bb;
			__m256i u, sx;
			float dr, mr;

			avx2_operands(t, p, x + b, &u, &sx, &dr, &mr);
			v[r] = avx2_lanes(u, sx);
			dh[r] = r < R ? cpu_rd16(p) : 0;
			mh[r] = r < R && has_min(t) ? cpu_rd16(p + 2) : 0;
		}
		acc = seq_step(t, dh, mh, x + b, seq_sums8(v), acc);
	}
	seq_store(acc, y, R);
}

SEQ_ONE(TGT_AVX2, seq_avx2_q8_0, seq_rows_avx2, LOOM_TYPE_Q8_0)
SEQ_ONE(TGT_AVX2, seq_avx2_q4_0, seq_rows_avx2, LOOM_TYPE_Q4_0)
SEQ_ONE(TGT_AVX2, seq_avx2_q4_1, seq_rows_avx2, LOOM_TYPE_Q4_1)
SEQ_ONE(TGT_AVX2, seq_avx2_q5_0, seq_rows_avx2, LOOM_TYPE_Q5_0)
SEQ_ONE(TGT_AVX2, seq_avx2_q5_1, seq_rows_avx2, LOOM_TYPE_Q5_1)

/* the avx2 set: refseq()'s arithmetic but for MXFP4 (ref8()'s) */
QDOT_ONE(TGT_AVX2, avx2_mxfp4, LOOM_TYPE_MXFP4, avx2_rows)
static const qdot_fn avx2_set[] = {
	seq_avx2_q8_0,
	seq_avx2_q4_0,
	seq_avx2_q4_1,
	seq_avx2_q5_0,
	seq_avx2_q5_1,
	avx2_mxfp4,
};
/* the avxvnni set: one function per format, and its table */
QDOT_ONE(TGT_AVXVNNI, avxvnni_q8_0, LOOM_TYPE_Q8_0, avxvnni_rows)
QDOT_ONE(TGT_AVXVNNI, avxvnni_q4_0, LOOM_TYPE_Q4_0, avxvnni_rows)
QDOT_ONE(TGT_AVXVNNI, avxvnni_q4_1, LOOM_TYPE_Q4_1, avxvnni_rows)
QDOT_ONE(TGT_AVXVNNI, avxvnni_q5_0, LOOM_TYPE_Q5_0, avxvnni_rows)
QDOT_ONE(TGT_AVXVNNI, avxvnni_q5_1, LOOM_TYPE_Q5_1, avxvnni_rows)
QDOT_ONE(TGT_AVXVNNI, avxvnni_mxfp4, LOOM_TYPE_MXFP4, avxvnni_rows)
static const qdot_fn avxvnni_set[] = {
	avxvnni_q8_0,
	avxvnni_q4_0,
	avxvnni_q4_1,
	avxvnni_q5_0,
	avxvnni_q5_1,
	avxvnni_mxfp4,
};

/* ---- AVX-512: 16 lanes, two blocks per step ---- */

#define TGT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define TGT_VNNI                                                                          \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")))

TGT_AVX512 ALWAYS __m512i join_i(__m256i lo, __m256i hi)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Adds m * xs to lane b % 16 of *accm, as ref16() does. */
TGT_AVX512 ALWAYS void avx512_min_lane(__m512 *accm, int64_t b, float m, float xs)
{
	*accm = _mm512_mask3_fmadd_ps(_mm512_set1_ps(m), _mm512_set1_ps(xs), *accm,
				      (__mmask16)(1u << (b % 16)));
}

/*
 * Operands of blocks b and b+1 (zeros for b+1 == nb) in the low and high
 * halves; accm takes the minimum terms in their lanes.
 */
TGT_AVX512 ALWAYS void avx512_pair(uint32_t t, const uint8_t *w, const struct qdot_block *x,
				   int64_t b, int64_t nb, __m512i *u, __m512i *s, __m512 *d,
				   __m512 *accm)
{
	const size_t bb = block_bytes(t);
	__m256i u0, s0, u1 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
	float d0, d1 = 0.0f, m0, m1;

	avx2_operands(t, w + b * bb, x + b, &u0, &s0, &d0, &m0);
	if (has_min(t))
		avx512_min_lane(accm, b, m0, x[b].s);
	if (b + 1 < nb) {
		avx2_operands(t, w + (b + 1) * bb, x + b + 1, &u1, &s1, &d1, &m1);
		if (has_min(t))
			avx512_min_lane(accm, b + 1, m1, x[b + 1].s);
	}
	*u = join_i(u0, u1);
	*s = join_i(s0, s1);
	*d = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
}

/* ref16()'s order. */
TGT_AVX512 ALWAYS float avx512_hsum(__m512 a)
{
	__m256 lo = _mm512_castps512_ps256(a);
	__m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));

	return avx2_hsum(_mm256_add_ps(lo, hi));
}

/* Byte products summed per int32 lane: without VNNI maddubs + madd, as
 * AVX2 does; with it, one vpdpbusd. */
TGT_AVX512 ALWAYS __m512i bw_lanes(__m512i u, __m512i s)
{
	return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}

TGT_VNNI ALWAYS __m512i vnni_lanes(__m512i u, __m512i s)
{
	return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
}

#define AVX512_ROWS(attr, name, LANES)                                                   \
	attr ALWAYS void name(uint32_t t, const uint8_t *w, size_t ws,                    \
			      const struct qdot_block *x, const float *xsc, int64_t nb, \
			      float *y, int R)                                           \
	{                                                                                  \
		__m512 acc[4], accm[4], d;                                                 \
		__m512i u, s;                                                              \
                                                                                           \
		for (int r = 0; r < R; r++) {                                              \
			acc[r] = _mm512_setzero_ps();                                      \
			accm[r] = _mm512_setzero_ps();                                     \
		}                                                                          \
		for (int64_t b = 0; b < nb; b += 2)                                        \
			for (int r = 0; r < R; r++) {                                      \
				avx512_pair(t, w + r * ws, x, b, nb, &u, &s, &d, &accm[r]); \
				acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(LANES(u, s)), d, \
							 acc[r]);                          \
			}                                                                  \
		for (int r = 0; r < R; r++)                                                \
			y[r] = avx512_hsum(acc[r]) + avx512_hsum(accm[r]);                 \
	}

AVX512_ROWS(TGT_AVX512, avx512_rows, bw_lanes)
AVX512_ROWS(TGT_VNNI, vnni_rows, vnni_lanes)

/* ---- VNNI block after block (refseq()): 8 rows in the float lanes ---- */

/* Block p's values as unsigned bytes (q plus seq_off(t)), in order. */
TGT_VNNI ALWAYS __m256i seq_u(uint32_t t, const uint8_t *p)
{
	const __m128i m4 = _mm_set1_epi8(15);
	__m128i b;
	__m256i u;

	if (t == LOOM_TYPE_Q8_0)
		return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)),
					_mm256_set1_epi8((char)0x80));
	b = _mm_loadu_si128((const __m128i *)(p + (t == LOOM_TYPE_Q4_0 ? 2 :
					   t == LOOM_TYPE_Q4_1 ? 4 : t == LOOM_TYPE_Q5_0 ? 6 : 8)));
	u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
	if (t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1) /* fifth bit of value j: bit j */
		u = _mm256_or_si256(u, _mm256_maskz_set1_epi8(cpu_rd32(p + (t == LOOM_TYPE_Q5_0 ? 2 : 4)),
							      16));
	return u;
}

static inline int seq_off(uint32_t t)
{
	return t == LOOM_TYPE_Q8_0 ? 128 : t == LOOM_TYPE_Q4_0 ? 8 : t == LOOM_TYPE_Q5_0 ? 16 : 0;
}

/* R <= 8 rows (row r at w + r * ws), lane r of the float accumulator. */
TGT_VNNI ALWAYS void seq_rows(uint32_t t, const uint8_t *w, size_t ws, const struct qdot_block *x,
			      int64_t nb, float *y, int R)
{
	const size_t bb = block_bytes(t);
	const int off = seq_off(t);
	__m256 acc = _mm256_setzero_ps();

	for (int64_t b = 0; b < nb; b++) {
		const __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].q);
		__m256i v[8], fix = _mm256_setzero_si256();
		uint16_t dh[8] = { 0 }, mh[8] = { 0 };

		if (off) { /* -off * sum(x.q), at most 128 * 32 * 127: no overflow */
			__m256i l = _mm256_dpbusd_epi32(_mm256_setzero_si256(),
							_mm256_set1_epi8((char)off), xq);
			__m256i one[8] = { l, l, l, l, l, l, l, l };

			fix = _mm256_sub_epi32(fix, seq_sums8(one));
		}
		for (int r = 0; r < 8; r++) {
			const uint8_t *p = w + (size_t)(r < R ? r : 0) * ws + b * bb;

			v[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), seq_u(t, p), xq);
			dh[r] = r < R ? cpu_rd16(p) : 0;
			mh[r] = r < R && has_min(t) ? cpu_rd16(p + 2) : 0;
		}
		acc = seq_step(t, dh, mh, x + b, _mm256_add_epi32(seq_sums8(v), fix), acc);
	}
	seq_store(acc, y, R);
}

SEQ_ONE(TGT_VNNI, seq_q8_0, seq_rows, LOOM_TYPE_Q8_0)
SEQ_ONE(TGT_VNNI, seq_q4_0, seq_rows, LOOM_TYPE_Q4_0)
SEQ_ONE(TGT_VNNI, seq_q4_1, seq_rows, LOOM_TYPE_Q4_1)
SEQ_ONE(TGT_VNNI, seq_q5_0, seq_rows, LOOM_TYPE_Q5_0)
SEQ_ONE(TGT_VNNI, seq_q5_1, seq_rows, LOOM_TYPE_Q5_1)

/* the avx512 set: one function per format, and its table */
QDOT_ONE(TGT_AVX512, avx512_q8_0, LOOM_TYPE_Q8_0, avx512_rows)
QDOT_ONE(TGT_AVX512, avx512_q4_0, LOOM_TYPE_Q4_0, avx512_rows)
QDOT_ONE(TGT_AVX512, avx512_q4_1, LOOM_TYPE_Q4_1, avx512_rows)
QDOT_ONE(TGT_AVX512, avx512_q5_0, LOOM_TYPE_Q5_0, avx512_rows)
QDOT_ONE(TGT_AVX512, avx512_q5_1, LOOM_TYPE_Q5_1, avx512_rows)
QDOT_ONE(TGT_AVX512, avx512_mxfp4, LOOM_TYPE_MXFP4, avx512_rows)
static const qdot_fn avx512_set[] = {
	avx512_q8_0,
	avx512_q4_0,
	avx512_q4_1,
	avx512_q5_0,
	avx512_q5_1,
	avx512_mxfp4,
};
/* the vnni set: one function per format, and its table */
QDOT_ONE(TGT_VNNI, vnni_mxfp4, LOOM_TYPE_MXFP4, vnni_rows)
/* refseq()'s arithmetic but for MXFP4 (ref16()'s) */
static const qdot_fn vnni_set[] = {
	seq_q8_0,
	seq_q4_0,
	seq_q4_1,
	seq_q5_0,
	seq_q5_1,
	vnni_mxfp4,
};

#endif /* __x86_64__ */

/* Index of a qdot format in the per-set tables (scalar_set, vnni_set, ...). */
static int format_index(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_Q8_0: return 0;
	case LOOM_TYPE_Q4_0: return 1;
	case LOOM_TYPE_Q4_1: return 2;
	case LOOM_TYPE_Q5_0: return 3;
	case LOOM_TYPE_Q5_1: return 4;
	case LOOM_TYPE_MXFP4: return 5;
	default: return -1;
	}
}

qdot_fn qdot_kernel(enum qdot_isa isa, uint32_t type)
{
	int f = format_index(type);

	if (f < 0 || !qdot_isa_supported(isa))
		return NULL;
	switch (isa) {
#if defined(__x86_64__)
	case QDOT_AVX2: return avx2_set[f];
	case QDOT_AVX512: return avx512_set[f];
	case QDOT_VNNI: return vnni_set[f];
	case QDOT_AVXVNNI: return avxvnni_set[f];
#endif
	case QDOT_SCALAR: return scalar_set[f];
	default: return NULL;
	}
}
