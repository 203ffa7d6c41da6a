/*
 * GEMV and dequantization kernels of the cpu backend.
 *
 * Every weight format is handled as a sequence of 32-value blocks: the
 * GGUF block for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, and 32 consecutive values for
 * F32/F16/BF16 (whose row tail, k % 32, goes through scalar code). A block
 * is dequantized in registers and multiplied with f32 activations, so the
 * results differ from the scalar reference only by summation order.
 *
 * One body per instruction set, written once and specialized by constant
 * format and row count through always_inline; runtime dispatch picks the
 * AVX-512, AVX2 or portable version (no -march flags, so cpu.so runs on any
 * x86-64 and builds elsewhere).
 *
 * Block layouts (GGUF): d and m are IEEE half floats.
 *   Q8_0  d, int8 q[32]                       x = d*q
 *   Q4_0  d, u8 qs[16]                        x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
 *   Q4_1  d, m, u8 qs[16]                     x = d*q + m, q as for Q4_0 without -8
 *   Q5_0  d, u32 qh, u8 qs[16]                fifth bit of value e is bit e of qh; x = d*(q-16)
 *   Q5_1  d, m, u32 qh, u8 qs[16]             x = d*q + m
 *
 * K-quants (super-blocks of 256 values, k a multiple of 256) are walked as
 * eight 32-value groups too: group g of a super-block takes its two
 * 16-value scales (k_scales), then 32 quants that sit in 32 consecutive
 * bytes at a bit offset, plus, for q3_K/q5_K/q6_K, high bits from another
 * 32 bytes (struct kgroup). Value = dl*q - ml with dl = d*sc, ml = dmin*m,
 * as plugins/quant/kquant.c's to_float computes it. Every product there is
 * exact in f32 (an f16 mantissa of 11 bits times a 6-bit scale times a
 * 6-bit quant fits in 24 bits), so the one rounding is the subtraction and
 * an FMA gives the same bits: dequantization is bit for bit the plugin's.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define ALWAYS static inline __attribute__((always_inline))

bool cpu_format_known(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_F32:
	case LOOM_TYPE_F16:
	case LOOM_TYPE_BF16:
	case LOOM_TYPE_Q8_0:
	case LOOM_TYPE_Q4_0:
	case LOOM_TYPE_Q4_1:
	case LOOM_TYPE_Q5_0:
	case LOOM_TYPE_Q5_1:
	case LOOM_TYPE_Q2_K:
	case LOOM_TYPE_Q3_K:
	case LOOM_TYPE_Q4_K:
	case LOOM_TYPE_Q5_K:
	case LOOM_TYPE_Q6_K:
	case LOOM_TYPE_MXFP4:
		return true;
	default:
		return false;
	}
}

uint32_t cpu_block_elems(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_F32:
	case LOOM_TYPE_F16:
	case LOOM_TYPE_BF16:
		return 1;
	case LOOM_TYPE_Q2_K:
	case LOOM_TYPE_Q3_K:
	case LOOM_TYPE_Q4_K:
	case LOOM_TYPE_Q5_K:
	case LOOM_TYPE_Q6_K:
		return 256;
	default:
		return 32;
	}
}

uint32_t cpu_block_bytes(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_F32: return 4;
	case LOOM_TYPE_F16: return 2;
	case LOOM_TYPE_BF16: return 2;
	case LOOM_TYPE_Q8_0: return 34;
	case LOOM_TYPE_Q4_0: return 18;
	case LOOM_TYPE_Q4_1: return 20;
	case LOOM_TYPE_Q5_0: return 22;
	case LOOM_TYPE_Q5_1: return 24;
	case LOOM_TYPE_Q2_K: return 84;
	case LOOM_TYPE_Q3_K: return 110;
	case LOOM_TYPE_Q4_K: return 144;
	case LOOM_TYPE_Q5_K: return 176;
	case LOOM_TYPE_Q6_K: return 210;
	case LOOM_TYPE_MXFP4: return 17;
	default: return 0;
	}
}

bool cpu_format_has_min(uint32_t type)
{
	return type == LOOM_TYPE_Q4_1 || type == LOOM_TYPE_Q5_1;
}

static inline bool format_quant(uint32_t type)
{
	return cpu_block_elems(type) == 32;
}

static inline bool format_k(uint32_t type)
{
	return cpu_block_elems(type) == 256;
}

void cpu_xsum_fill(const struct cpu_gemv *g, float *xs)
{
	const int64_t nb = g->k / 32;

	for (int64_t i = 0; i < g->m; i++) {
		const float *x = g->x + i * g->x_stride;
		float *o = xs + i * g->xs_stride;

		for (int64_t b = 0; b < nb; b++) {
			float s = 0.0f;

			for (int e = 0; e < 32; e++)
				s += x[b * 32 + e];
			o[2 * b] = 0.0f;
			o[2 * b + 1] = s;
		}
		o[2 * nb] = o[2 * nb + 1] = 0.0f;
	}
}

/* Bytes of one 32-value group (a block, or 32 plain values; not K-quants). */
static inline size_t group_bytes(uint32_t type)
{
	return cpu_block_elems(type) == 1 ? 32 * (size_t)cpu_block_bytes(type)
					  : cpu_block_bytes(type);
}

static enum cpu_isa detect_isa(void)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("f16c"))
		return CPU_ISA_AVX512;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("f16c"))
		return CPU_ISA_AVX2;
#endif
	return CPU_ISA_SCALAR;
}

/* Asked per activation row and per panel block: detected once (every
 * thread that races here stores the same value). */
enum cpu_isa cpu_detect_isa(void)
{
	static _Atomic int isa = -1;
	int v = atomic_load_explicit(&isa, memory_order_relaxed);

	if (v < 0) {
		v = (int)detect_isa();
		atomic_store_explicit(&isa, v, memory_order_relaxed);
	}
	return (enum cpu_isa)v;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
	switch (isa) {
	case CPU_ISA_AVX512: return "avx512";
	case CPU_ISA_AVX2: return "avx2";
	default: return "scalar";
	}
}

/* ------------------------------------------------------------------ */
/* portable scalar code                                                */

float cpu_fp16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	uint32_t bits;
	float f;

	if (exp == 0) {
		f = (float)man * 5.9604644775390625e-8f; /* man * 2^-24 */
		return sign ? -f : f;
	}
	if (exp == 31)
		bits = sign | 0x7f800000u | (man << 13);
	else
		bits = sign | ((exp + 112) << 23) | (man << 13);
	memcpy(&f, &bits, 4);
	return f;
}

static inline float bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;

	memcpy(&f, &bits, 4);
	return f;
}

/* Value e of a row of a plain type. */
static inline float plain_get(uint32_t t, const uint8_t *row, int64_t e)
{
	switch (t) {
	case LOOM_TYPE_F32: {
		float f;

		memcpy(&f, row + 4 * e, 4);
		return f;
	}
	case LOOM_TYPE_F16:
		return cpu_fp16_to_f32(cpu_rd16(row + 2 * e));
	default:
		return bf16_to_f32(cpu_rd16(row + 2 * e));
	}
}

/* MXFP4's doubled E2M1 values, and its E8M0 scale halved to match. */
static const float mxfp4_kv[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };


#if defined(__x86_64__)
/* mxfp4_kv as bytes, for a byte shuffle (SSSE3, in the AVX2 and AVX-512 sets) */
#define MXFP4_LUT _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
#endif

/* 32 values of group p into out. */
static void scalar_deq(uint32_t t, const uint8_t *p, float *out)
{
	float d = 0.0f, m = 0.0f;
	uint32_t qh;

	switch (t) {
	case LOOM_TYPE_F32:
	case LOOM_TYPE_F16:
	case LOOM_TYPE_BF16:
		for (int e = 0; e < 32; e++)
			out[e] = plain_get(t, p, e);
		return;
	case LOOM_TYPE_Q8_0:
		d = cpu_fp16_to_f32(cpu_rd16(p));
		for (int e = 0; e < 32; e++)
			out[e] = (float)(int8_t)p[2 + e] * d;
		return;
	case LOOM_TYPE_Q4_0:
		d = cpu_fp16_to_f32(cpu_rd16(p));
		for (int j = 0; j < 16; j++) {
			out[j] = (float)((p[2 + j] & 15) - 8) * d;
			out[j + 16] = (float)((p[2 + j] >> 4) - 8) * d;
		}
		return;
	case LOOM_TYPE_Q4_1:
		d = cpu_fp16_to_f32(cpu_rd16(p));
		m = cpu_fp16_to_f32(cpu_rd16(p + 2));
		for (int j = 0; j < 16; j++) {
			out[j] = (float)(p[4 + j] & 15) * d + m;
			out[j + 16] = (float)(p[4 + j] >> 4) * d + m;
		}
		return;
	case LOOM_TYPE_Q5_0:
		d = cpu_fp16_to_f32(cpu_rd16(p));
		qh = cpu_rd32(p + 2);
		for (int j = 0; j < 16; j++) {
			int lo = (p[6 + j] & 15) | (int)(((qh >> j) & 1) << 4);
			int hi = (p[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);

			out[j] = (float)(lo - 16) * d;
			out[j + 16] = (float)(hi - 16) * d;
		}
		return;
	case LOOM_TYPE_MXFP4: /* E2M1 by table, scale 2^(e - 128) (plugins/quant/mxfp4.c) */
		d = cpu_mxfp4_scale(p[0]);
		for (int j = 0; j < 16; j++) {
			out[j] = mxfp4_kv[p[1 + j] & 15] * d;
			out[j + 16] = mxfp4_kv[p[1 + j] >> 4] * d;
		}
		return;
	case LOOM_TYPE_Q5_1:
		d = cpu_fp16_to_f32(cpu_rd16(p));
		m = cpu_fp16_to_f32(cpu_rd16(p + 2));
		qh = cpu_rd32(p + 4);
		for (int j = 0; j < 16; j++) {
			int lo = (p[8 + j] & 15) | (int)(((qh >> j) & 1) << 4);
			int hi = (p[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);

			out[j] = (float)lo * d + m;
			out[j + 16] = (float)hi * d + m;
		}
		return;
	}
}

/* ---- K-quants: group g (values 32g .. 32g+31) of super-block b ---- */

/* Byte offsets of the f16 d and dmin in a super-block (dmin: -1 if none). */
static inline int k_d_off(uint32_t t)
{
	switch (t) {
	case LOOM_TYPE_Q2_K: return 80;
	case LOOM_TYPE_Q3_K: return 108;
	case LOOM_TYPE_Q6_K: return 208;
	default: return 0; /* Q4_K, Q5_K */
	}
}

static inline bool k_has_min(uint32_t t)
{
	return t == LOOM_TYPE_Q2_K || t == LOOM_TYPE_Q4_K || t == LOOM_TYPE_Q5_K;
}

static inline float k_dmin_scalar(uint32_t t, const uint8_t *b)
{
	return k_has_min(t) ? cpu_fp16_to_f32(cpu_rd16(b + k_d_off(t) + 2)) : 0.0f;
}

/* q3_K's 6-bit scale i (biased by 32): low nibble in byte i % 8 (high half
 * if i >= 8), top 2 bits in byte 8 + i % 4 at bit 2 * (i / 4). */
static inline int k3_scale(const uint8_t *s, int i)
{
	int lo = (s[i % 8] >> (4 * (i / 8))) & 15;
	int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;

	return (lo | hi << 4) - 32;
}

/* q4_K/q5_K's 6-bit scale and min of group g from their 12 bytes. */
static inline void k4_scale_min(const uint8_t *s, int g, int *sc, int *m)
{
	if (g < 4) {
		*sc = s[g] & 63;
		*m = s[g + 4] & 63;
	} else {
		*sc = (s[g + 4] & 15) | (s[g - 4] >> 6) << 4;
		*m = (s[g + 4] >> 4) | (s[g] >> 6) << 4;
	}
}

/*
 * Values 32g+16h .. +15 (h = 0, 1) are dl[h] * q - ml[h], given the
 * super-block's d and dmin (converted by the caller's instruction set;
 * dmin 0 for formats without one).
 */
static inline void k_scales(uint32_t t, const uint8_t *b, int g, float d, float dmin,
			    float dl[2], float ml[2])
{
	int sc, m;

	for (int h = 0; h < 2; h++) {
		int i = 2 * g + h;

		switch (t) {
		case LOOM_TYPE_Q2_K:
			dl[h] = d * (float)(b[i] & 15);
			ml[h] = dmin * (float)(b[i] >> 4);
			break;
		case LOOM_TYPE_Q3_K:
			dl[h] = d * (float)k3_scale(b + 96, i);
			ml[h] = 0.0f;
			break;
		case LOOM_TYPE_Q6_K:
			dl[h] = d * (float)(int8_t)b[192 + i];
			ml[h] = 0.0f;
			break;
		default: /* Q4_K, Q5_K: one scale and min for the 32 values */
			k4_scale_min(b + 4, g, &sc, &m);
			dl[h] = d * (float)sc;
			ml[h] = dmin * (float)m;
			break;
		}
	}
}

/* The 16 scales of a super-block, decoded once for its 8 groups. */
struct ksb {
	float dl[16], ml[16];
};

static inline void k_sb_scales(uint32_t t, const uint8_t *b, float d, float dmin,
			       struct ksb *sb)
{
	for (int g = 0; g < 8; g++)
		k_scales(t, b, g, d, dmin, sb->dl + 2 * g, sb->ml + 2 * g);
}

/*
 * Where the quants of group g live: q[i] = (lo[i] >> lo_shift & lo_mask |
 * (hi[i] >> hi_shift & hi_mask) << hi_pos) + bias for i < 32, no hi when
 * hi_mask is 0. (q3_K's set high bit means "no -4": bias -4, hi_pos 2.)
 */
struct kgroup {
	const uint8_t *lo, *hi;
	int lo_shift, lo_mask, hi_shift, hi_mask, hi_pos, bias;
};

static inline struct kgroup k_group(uint32_t t, const uint8_t *b, int g)
{
	switch (t) {
	case LOOM_TYPE_Q2_K:
		return (struct kgroup){ .lo = b + 16 + 32 * (g / 4), .lo_shift = 2 * (g % 4),
					.lo_mask = 3, .hi = b };
	case LOOM_TYPE_Q3_K:
		return (struct kgroup){ .lo = b + 32 + 32 * (g / 4), .lo_shift = 2 * (g % 4),
					.lo_mask = 3, .hi = b, .hi_shift = g, .hi_mask = 1,
					.hi_pos = 2, .bias = -4 };
	case LOOM_TYPE_Q4_K:
		return (struct kgroup){ .lo = b + 16 + 32 * (g / 2), .lo_shift = 4 * (g % 2),
					.lo_mask = 15, .hi = b };
	case LOOM_TYPE_Q5_K:
		return (struct kgroup){ .lo = b + 48 + 32 * (g / 2), .lo_shift = 4 * (g % 2),
					.lo_mask = 15, .hi = b + 16, .hi_shift = g, .hi_mask = 1,
					.hi_pos = 4 };
	default: /* Q6_K: low nibbles in ql[128], top 2 bits in qh[64] */
		return (struct kgroup){ .lo = b + 64 * (g / 4) + 32 * (g % 2),
					.lo_shift = 4 * (g / 2 % 2), .lo_mask = 15,
					.hi = b + 128 + 32 * (g / 4), .hi_shift = 2 * (g % 4),
					.hi_mask = 3, .hi_pos = 4, .bias = -32 };
	}
}

static inline int k_quant(const struct kgroup *q, int i)
{
	int v = (q->lo[i] >> q->lo_shift) & q->lo_mask;

	v |= ((q->hi[i] >> q->hi_shift) & q->hi_mask) << q->hi_pos;
	return v + q->bias;
}

/* 32 values of group g of super-block b, as to_float computes them. */
static void scalar_kdeq(uint32_t t, const uint8_t *b, int g, float *out)
{
	struct kgroup q = k_group(t, b, g);
	float dl[2], ml[2];

	k_scales(t, b, g, cpu_fp16_to_f32(cpu_rd16(b + k_d_off(t))), k_dmin_scalar(t, b), dl, ml);
	for (int i = 0; i < 32; i++)
		out[i] = dl[i / 16] * (float)k_quant(&q, i) - ml[i / 16];
}

/* 32-value group gi of a row, any format. */
static void scalar_group(uint32_t t, const uint8_t *row, int64_t gi, float *out)
{
	if (format_k(t))
		scalar_kdeq(t, row + (size_t)(gi / 8) * cpu_block_bytes(t), (int)(gi % 8), out);
	else
		scalar_deq(t, row + gi * group_bytes(t), out);
}

static float tail_dot(uint32_t t, const uint8_t *row, const float *x, int64_t from,
		      int64_t k)
{
	float s = 0.0f;

	for (int64_t e = from; e < k; e++)
		s += plain_get(t, row, e) * x[e];
	return s;
}

static void scalar_gemv(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	const int64_t nb = g->k / 32;
	float w[32];

	for (int64_t j = j0; j < j1; j++) {
		const uint8_t *wr = g->w + (size_t)j * g->w_stride;

		for (int64_t i = 0; i < g->m; i++) {
			const float *x = g->x + i * g->x_stride;
			float acc[8] = { 0 };

			for (int64_t b = 0; b < nb; b++) {
				scalar_group(g->type, wr, b, w);
				for (int e = 0; e < 32; e++)
					acc[e & 7] += w[e] * x[b * 32 + e];
			}
			float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
				  ((acc[4] + acc[5]) + (acc[6] + acc[7]));
			if (nb * 32 < g->k)
				s += tail_dot(g->type, wr, x, nb * 32, g->k);
			g->y[i * g->y_stride + j] = s;
		}
	}
}

static void scalar_deq_row(uint32_t t, const uint8_t *src, float *dst, int64_t k)
{
	const int64_t nb = k / 32;

	for (int64_t b = 0; b < nb; b++)
		scalar_group(t, src, b, dst + b * 32);
	for (int64_t e = nb * 32; e < k; e++)
		dst[e] = plain_get(t, src, e);
}

static float scalar_dot(const float *a, const float *b, int64_t n)
{
	float acc[8] = { 0 };
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		for (int l = 0; l < 8; l++)
			acc[l] += a[i + l] * b[i + l];
	for (; i < n; i++)
		acc[0] += a[i] * b[i];
	return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void scalar_axpy(float *y, const float *x, float s, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		y[i] += s * x[i];
}

#if defined(__x86_64__)
/* ------------------------------------------------------------------ */
/* AVX2 + FMA + F16C                                                   */

#define TGT_AVX2 __attribute__((target("avx2,fma,f16c")))

TGT_AVX2 ALWAYS float avx2_h(const uint8_t *p)
{
	return _cvtsh_ss(cpu_rd16(p));
}

TGT_AVX2 ALWAYS __m256 avx2_nib32(__m128i bytes, int hi_half)
{
	if (hi_half)
		bytes = _mm_srli_si128(bytes, 8);
	return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

/* Integer fifth bits of 8 values (bits of `b`), as 0 or 16 per lane. */
TGT_AVX2 ALWAYS __m256i avx2_hibits(uint32_t b)
{
	const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
	__m256i v = _mm256_and_si256(_mm256_set1_epi32((int)(b & 0xff)), sel);

	v = _mm256_cmpeq_epi32(v, sel);
	return _mm256_and_si256(v, _mm256_set1_epi32(16));
}

/* 4 x 8 values of q5: nibbles (unsigned) | fifth bit, as floats. */
TGT_AVX2 ALWAYS void avx2_q5(const uint8_t *qs, uint32_t qh, __m256 q[4])
{
	__m128i raw = _mm_loadu_si128((const __m128i *)qs);
	__m128i lo = _mm_and_si128(raw, _mm_set1_epi8(15));
	__m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
	__m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };

	for (int s = 0; s < 4; s++) {
		__m256i v = _mm256_cvtepu8_epi32(parts[s]);

		v = _mm256_or_si256(v, avx2_hibits(qh >> (8 * s)));
		q[s] = _mm256_cvtepi32_ps(v);
	}
}

TGT_AVX2 ALWAYS void avx2_deq(const uint32_t t, const uint8_t *p, __m256 w[4])
{
	__m256 d, m;
	__m128i raw, lo, hi;

	switch (t) {
	case LOOM_TYPE_F32:
		for (int s = 0; s < 4; s++)
			w[s] = _mm256_loadu_ps((const float *)p + 8 * s);
		break;
	case LOOM_TYPE_F16:
		for (int s = 0; s < 4; s++)
			w[s] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * s)));
		break;
	case LOOM_TYPE_BF16:
		for (int s = 0; s < 4; s++) {
			__m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * s)));

			w[s] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
		}
		break;
	case LOOM_TYPE_Q8_0:
		d = _mm256_set1_ps(avx2_h(p));
		for (int s = 0; s < 4; s++) {
			__m128i q = _mm_loadl_epi64((const __m128i *)(p + 2 + 8 * s));

			w[s] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
		}
		break;
	case LOOM_TYPE_Q4_0:
		d = _mm256_set1_ps(avx2_h(p));
		raw = _mm_loadu_si128((const __m128i *)(p + 2));
		lo = _mm_sub_epi8(_mm_and_si128(raw, _mm_set1_epi8(15)), _mm_set1_epi8(8));
		hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)),
				  _mm_set1_epi8(8));
		w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d);
		w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d);
		w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d);
		w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d);
		break;
	case LOOM_TYPE_Q4_1:
		d = _mm256_set1_ps(avx2_h(p));
		m = _mm256_set1_ps(avx2_h(p + 2));
		raw = _mm_loadu_si128((const __m128i *)(p + 4));
		lo = _mm_and_si128(raw, _mm_set1_epi8(15));
		hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
		w[0] = _mm256_fmadd_ps(avx2_nib32(lo, 0), d, m);
		w[1] = _mm256_fmadd_ps(avx2_nib32(lo, 1), d, m);
		w[2] = _mm256_fmadd_ps(avx2_nib32(hi, 0), d, m);
		w[3] = _mm256_fmadd_ps(avx2_nib32(hi, 1), d, m);
		break;
	case LOOM_TYPE_Q5_0:
		d = _mm256_set1_ps(avx2_h(p));
		avx2_q5(p + 6, cpu_rd32(p + 2), w);
		for (int s = 0; s < 4; s++)
			w[s] = _mm256_mul_ps(_mm256_sub_ps(w[s], _mm256_set1_ps(16.0f)), d);
		break;
	case LOOM_TYPE_Q5_1:
		d = _mm256_set1_ps(avx2_h(p));
		m = _mm256_set1_ps(avx2_h(p + 2));
		avx2_q5(p + 8, cpu_rd32(p + 4), w);
		for (int s = 0; s < 4; s++)
			w[s] = _mm256_fmadd_ps(w[s], d, m);
		break;
	case LOOM_TYPE_MXFP4: /* scalar_deq's table by byte shuffle: the same products */
		d = _mm256_set1_ps(cpu_mxfp4_scale(p[0]));
		raw = _mm_loadu_si128((const __m128i *)(p + 1));
		lo = _mm_shuffle_epi8(MXFP4_LUT, _mm_and_si128(raw, _mm_set1_epi8(15)));
		hi = _mm_shuffle_epi8(MXFP4_LUT,
				      _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)));
		w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d);
		w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d);
		w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d);
		w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d);
		break;
	default: /* never reached: types are checked before */
		for (int s = 0; s < 4; s++)
			w[s] = _mm256_setzero_ps();
		break;
	}
}

/* 32 bit fields (mask at shift) of 32 consecutive bytes, one per byte. */
TGT_AVX2 ALWAYS __m256i avx2_kbits(const uint8_t *p, int shift, int mask)
{
	__m256i v = _mm256_loadu_si256((const __m256i *)p);

	v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift));
	return _mm256_and_si256(v, _mm256_set1_epi8((char)mask));
}

/* The 32 quants of a K group as signed bytes. */
TGT_AVX2 ALWAYS __m256i avx2_kquants(const struct kgroup *q)
{
	__m256i v = avx2_kbits(q->lo, q->lo_shift, q->lo_mask);

	if (q->hi_mask) {
		__m256i h = avx2_kbits(q->hi, q->hi_shift, q->hi_mask);

		v = _mm256_or_si256(v, _mm256_sll_epi16(h, _mm_cvtsi32_si128(q->hi_pos)));
	}
	if (q->bias)
		v = _mm256_add_epi8(v, _mm256_set1_epi8((char)q->bias));
	return v;
}

/* Group g of K super-block b into w (x order), dl and ml its two scales. */
TGT_AVX2 ALWAYS void avx2_kdeq(const uint32_t t, const uint8_t *b, int g, const float *dl,
			       const float *ml, __m256 w[4])
{
	struct kgroup q = k_group(t, b, g);
	__m256i v = avx2_kquants(&q);
	__m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
	__m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };

	for (int s = 0; s < 4; s++) {
		__m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[s]));
		__m256 d = _mm256_set1_ps(dl[s / 2]), m = _mm256_set1_ps(ml[s / 2]);

		w[s] = k_has_min(t) ? _mm256_fmsub_ps(f, d, m) : _mm256_mul_ps(f, d);
	}
}

/* The scales of K super-block b into sb. */
TGT_AVX2 ALWAYS void avx2_ksb(const uint32_t t, const uint8_t *b, struct ksb *sb)
{
	float dmin = k_has_min(t) ? avx2_h(b + k_d_off(t) + 2) : 0.0f;

	k_sb_scales(t, b, avx2_h(b + k_d_off(t)), dmin, sb);
}

/* 32-value group gi of a row, any format. Groups come in order from 0:
 * a K super-block's scales are decoded into sb at its first group. */
TGT_AVX2 ALWAYS void avx2_group(const uint32_t t, const uint8_t *row, int64_t gi,
				struct ksb *sb, __m256 w[4])
{
	const uint8_t *p = row + (size_t)(gi / 8) * cpu_block_bytes(t);
	int g = (int)(gi % 8);

	if (!format_k(t)) {
		avx2_deq(t, row + gi * group_bytes(t), w);
		return;
	}
	if (g == 0)
		avx2_ksb(t, p, sb);
	avx2_kdeq(t, p, g, sb->dl + 2 * g, sb->ml + 2 * g, w);
}

TGT_AVX2 ALWAYS float avx2_hsum(__m256 v)
{
	return cpu_avx2_hsum(v);
}

/* R activation rows (i..i+R-1) against weight row j with A accumulators
 * per row: 4 for a lone row (latency), 2 otherwise (registers). A row's
 * result depends on A, not on R. */
TGT_AVX2 ALWAYS void avx2_rows(const struct cpu_gemv *g, const uint32_t t, const int R,
			       const int A, const uint8_t *wr, int64_t i, int64_t j)
{
	const int64_t nb = g->k / 32;
	const float *x = g->x + i * g->x_stride;
	__m256 acc[4][4];
	struct ksb sb;

	for (int r = 0; r < R; r++)
		for (int a = 0; a < A; a++)
			acc[r][a] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		__m256 w[4];

		avx2_group(t, wr, b, &sb, w);
		for (int r = 0; r < R; r++) {
			const float *xp = x + r * g->x_stride + b * 32;

			for (int s = 0; s < 4; s++)
				acc[r][s % A] = _mm256_fmadd_ps(w[s], _mm256_loadu_ps(xp + 8 * s),
								acc[r][s % A]);
		}
	}
	for (int r = 0; r < R; r++) {
		__m256 v = _mm256_add_ps(acc[r][0], acc[r][1]);

		if (A == 4)
			v = _mm256_add_ps(v, _mm256_add_ps(acc[r][2], acc[r][3]));
		float s = avx2_hsum(v);
		if (nb * 32 < g->k)
			s += tail_dot(t, wr, x + r * g->x_stride, nb * 32, g->k);
		g->y[(i + r) * g->y_stride + j] = s;
	}
}

/*
 * Quantized blocks with the scale factored out: per block the kernels form
 * sum(q*x) from the unscaled integer quants, then add d*that (and m*sum(x)
 * for formats with a minimum) to the row's accumulator.
 *
 * Quants of one block as floats, in x order 0-7, 8-15, 16-23, 24-31, the
 * format's offset (-8, -16) already applied.
 */
TGT_AVX2 ALWAYS void avx2_quants(const uint32_t t, const uint8_t *p, __m256 q[4])
{
	const __m256i m15 = _mm256_set1_epi32(15);
	__m256i a, b;

	switch (t) {
	case LOOM_TYPE_Q8_0:
		for (int s = 0; s < 4; s++)
			q[s] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
				_mm_loadl_epi64((const __m128i *)(p + 2 + 8 * s))));
		return;
	case LOOM_TYPE_Q4_0:
	case LOOM_TYPE_Q4_1: {
		const uint8_t *qs = p + (t == LOOM_TYPE_Q4_0 ? 2 : 4);
		const __m256i off = _mm256_set1_epi32(t == LOOM_TYPE_Q4_0 ? 8 : 0);

		/* each lane holds one byte: low nibble value e, high value e+16 */
		a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
		b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
		q[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(a, m15), off));
		q[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b, m15), off));
		q[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(a, 4), off));
		q[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 4), off));
		return;
	}
	case LOOM_TYPE_Q5_0:
		avx2_q5(p + 6, cpu_rd32(p + 2), q);
		for (int s = 0; s < 4; s++)
			q[s] = _mm256_sub_ps(q[s], _mm256_set1_ps(16.0f));
		return;
	default: /* Q5_1 */
		avx2_q5(p + 8, cpu_rd32(p + 4), q);
		return;
	}
}

/* [d, m, 0, 0] of a block (lane 1 is junk for formats without m). */
TGT_AVX2 ALWAYS __m128 avx2_dm(const uint8_t *p)
{
	return _mm_cvtph_ps(_mm_cvtsi32_si128((int)cpu_rd32(p)));
}

/* sum(q*x) over one block. */
TGT_AVX2 ALWAYS __m256 avx2_qdot(const __m256 q[4], const __m256 x[4])
{
	__m256 s = _mm256_mul_ps(q[0], x[0]);

	s = _mm256_fmadd_ps(q[1], x[1], s);
	s = _mm256_fmadd_ps(q[2], x[2], s);
	return _mm256_fmadd_ps(q[3], x[3], s);
}

TGT_AVX2 ALWAYS void avx2_loadx(const float *xp, __m256 x[4])
{
	for (int s = 0; s < 4; s++)
		x[s] = _mm256_loadu_ps(xp + 8 * s);
}

/*
 * A tile of R activation rows (from i) by J weight rows (from j), R == 1 or
 * J == 1. The m*sum(x) terms gather in lane 1 of macc.
 */
TGT_AVX2 ALWAYS void avx2_qtile(const struct cpu_gemv *g, const uint32_t t, const int R,
				const int J, int64_t i, int64_t j)
{
	const int64_t nb = g->k / 32;
	const size_t gb = cpu_block_bytes(t);
	const bool has_m = cpu_format_has_min(t);
	const uint8_t *w = g->w + (size_t)j * g->w_stride;
	const float *x = g->x + i * g->x_stride;
	const float *xs = has_m ? g->xs + i * g->xs_stride : NULL;
	__m256 acc[4], q[4], xv[4];
	__m128 macc[4];

	for (int a = 0; a < 4; a++) {
		acc[a] = _mm256_setzero_ps();
		macc[a] = _mm_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = w + b * gb;

		if (J == 1) {
			__m128 dm = avx2_dm(p);
			__m256 d = _mm256_broadcastss_ps(dm);

			avx2_quants(t, p, q);
			for (int r = 0; r < R; r++) {
				avx2_loadx(x + r * g->x_stride + b * 32, xv);
				acc[r] = _mm256_fmadd_ps(avx2_qdot(q, xv), d, acc[r]);
				if (has_m)
					macc[r] = _mm_fmadd_ps(dm, _mm_loadu_ps(xs + r * g->xs_stride + 2 * b),
							       macc[r]);
			}
			continue;
		}
		avx2_loadx(x + b * 32, xv);
		for (int c = 0; c < J; c++) {
			const uint8_t *pc = p + (size_t)c * g->w_stride;
			__m128 dm = avx2_dm(pc);

			avx2_quants(t, pc, q);
			acc[c] = _mm256_fmadd_ps(avx2_qdot(q, xv), _mm256_broadcastss_ps(dm), acc[c]);
			if (has_m)
				macc[c] = _mm_fmadd_ps(dm, _mm_loadu_ps(xs + 2 * b), macc[c]);
		}
	}
	for (int a = 0; a < R * J; a++) {
		float s = avx2_hsum(acc[a]);

		if (has_m)
			s += _mm_cvtss_f32(_mm_movehdup_ps(macc[a]));
		if (J == 1)
			g->y[(i + a) * g->y_stride + j] = s;
		else
			g->y[i * g->y_stride + j + a] = s;
	}
}

TGT_AVX2 ALWAYS void avx2_qgemv(const struct cpu_gemv *g, const uint32_t t, int64_t j0,
				int64_t j1)
{
	int64_t j = j0;

	if (g->m == 1) {
		for (; j + 4 <= j1; j += 4)
			avx2_qtile(g, t, 1, 4, 0, j);
		for (; j < j1; j++)
			avx2_qtile(g, t, 1, 1, 0, j);
		return;
	}
	for (; j < j1; j++) {
		int64_t i = 0;

		for (; i + 4 <= g->m; i += 4)
			avx2_qtile(g, t, 4, 1, i, j);
		switch (g->m - i) {
		case 3: avx2_qtile(g, t, 3, 1, i, j); break;
		case 2: avx2_qtile(g, t, 2, 1, i, j); break;
		case 1: avx2_qtile(g, t, 1, 1, i, j); break;
		}
	}
}

TGT_AVX2 ALWAYS void avx2_gemv(const struct cpu_gemv *g, const uint32_t t, int64_t j0,
			       int64_t j1)
{
	if (format_quant(t) && t != LOOM_TYPE_MXFP4) { /* MXFP4: by its group, below */
		avx2_qgemv(g, t, j0, j1);
		return;
	}
	for (int64_t j = j0; j < j1; j++) {
		const uint8_t *wr = g->w + (size_t)j * g->w_stride;
		int64_t i = 0;

		if (g->m == 1 && !g->inv) {
			avx2_rows(g, t, 1, 4, wr, 0, j);
			continue;
		}
		for (; i + 4 <= g->m; i += 4)
			avx2_rows(g, t, 4, 2, wr, i, j);
		switch (g->m - i) {
		case 3: avx2_rows(g, t, 3, 2, wr, i, j); break;
		case 2: avx2_rows(g, t, 2, 2, wr, i, j); break;
		case 1: avx2_rows(g, t, 1, 2, wr, i, j); break;
		}
	}
}

TGT_AVX2 static void avx2_deq_row(const uint32_t t, const uint8_t *src, float *dst, int64_t k)
{
	const int64_t nb = k / 32;
	struct ksb sb;

	for (int64_t b = 0; b < nb; b++) {
		__m256 w[4];

		avx2_group(t, src, b, &sb, w);
		for (int s = 0; s < 4; s++)
			_mm256_storeu_ps(dst + b * 32 + 8 * s, w[s]);
	}
	for (int64_t e = nb * 32; e < k; e++)
		dst[e] = plain_get(t, src, e);
}

TGT_AVX2 static float avx2_dot(const float *a, const float *b, int64_t n)
{
	return cpu_avx2_dot(a, b, n);
}

TGT_AVX2 static void avx2_axpy(float *y, const float *x, float s, int64_t n)
{
	__m256 vs = _mm256_set1_ps(s);
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(x + i),
							_mm256_loadu_ps(y + i)));
	for (; i < n; i++)
		y[i] += s * x[i];
}

typedef void (*cpu_gemv_fn)(const struct cpu_gemv *g, int64_t j0, int64_t j1);
typedef void (*cpu_deq_fn)(const uint8_t *src, float *dst, int64_t k);

/* One GEMV per format, each inlining avx2_gemv for its constant type, and
 * the table cpu_gemv_rows looks them up in. */
TGT_AVX2 static void avx2_gemv_f32(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_F32, j0, j1);
}

TGT_AVX2 static void avx2_gemv_f16(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_F16, j0, j1);
}

TGT_AVX2 static void avx2_gemv_bf16(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_BF16, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q8_0(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q8_0, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q4_0(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q4_0, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q4_1(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q4_1, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q5_0(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q5_0, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q5_1(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q5_1, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q2_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q2_K, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q3_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q3_K, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q4_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q4_K, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q5_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q5_K, j0, j1);
}

TGT_AVX2 static void avx2_gemv_q6_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_Q6_K, j0, j1);
}

TGT_AVX2 static void avx2_gemv_mxfp4(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx2_gemv(g, LOOM_TYPE_MXFP4, j0, j1);
}

static const cpu_gemv_fn avx2_gemv_table[LOOM_TYPE_COUNT] = {
	[LOOM_TYPE_F32] = avx2_gemv_f32,
	[LOOM_TYPE_F16] = avx2_gemv_f16,
	[LOOM_TYPE_BF16] = avx2_gemv_bf16,
	[LOOM_TYPE_Q8_0] = avx2_gemv_q8_0,
	[LOOM_TYPE_Q4_0] = avx2_gemv_q4_0,
	[LOOM_TYPE_Q4_1] = avx2_gemv_q4_1,
	[LOOM_TYPE_Q5_0] = avx2_gemv_q5_0,
	[LOOM_TYPE_Q5_1] = avx2_gemv_q5_1,
	[LOOM_TYPE_Q2_K] = avx2_gemv_q2_K,
	[LOOM_TYPE_Q3_K] = avx2_gemv_q3_K,
	[LOOM_TYPE_Q4_K] = avx2_gemv_q4_K,
	[LOOM_TYPE_Q5_K] = avx2_gemv_q5_K,
	[LOOM_TYPE_Q6_K] = avx2_gemv_q6_K,
	[LOOM_TYPE_MXFP4] = avx2_gemv_mxfp4,
};

/* One dequantizing row per format, each inlining avx2_deq_row for its
 * constant type, and the table cpu_dequant_row looks them up in. */
TGT_AVX2 static void avx2_deq_row_f32(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_F32, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_f16(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_F16, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_bf16(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_BF16, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q8_0(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q8_0, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q4_0(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q4_0, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q4_1(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q4_1, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q5_0(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q5_0, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q5_1(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q5_1, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q2_K(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q2_K, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q3_K(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q3_K, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q4_K(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q4_K, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q5_K(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q5_K, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_q6_K(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_Q6_K, src, dst, k);
}

TGT_AVX2 static void avx2_deq_row_mxfp4(const uint8_t *src, float *dst, int64_t k)
{
	avx2_deq_row(LOOM_TYPE_MXFP4, src, dst, k);
}

static const cpu_deq_fn avx2_deq_table[LOOM_TYPE_COUNT] = {
	[LOOM_TYPE_F32] = avx2_deq_row_f32,
	[LOOM_TYPE_F16] = avx2_deq_row_f16,
	[LOOM_TYPE_BF16] = avx2_deq_row_bf16,
	[LOOM_TYPE_Q8_0] = avx2_deq_row_q8_0,
	[LOOM_TYPE_Q4_0] = avx2_deq_row_q4_0,
	[LOOM_TYPE_Q4_1] = avx2_deq_row_q4_1,
	[LOOM_TYPE_Q5_0] = avx2_deq_row_q5_0,
	[LOOM_TYPE_Q5_1] = avx2_deq_row_q5_1,
	[LOOM_TYPE_Q2_K] = avx2_deq_row_q2_K,
	[LOOM_TYPE_Q3_K] = avx2_deq_row_q3_K,
	[LOOM_TYPE_Q4_K] = avx2_deq_row_q4_K,
	[LOOM_TYPE_Q5_K] = avx2_deq_row_q5_K,
	[LOOM_TYPE_Q6_K] = avx2_deq_row_q6_K,
	[LOOM_TYPE_MXFP4] = avx2_deq_row_mxfp4,
};

/* ------------------------------------------------------------------ */
/* AVX-512 (F, BW, VL)                                                 */

#define TGT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

TGT_AVX512 ALWAYS __m512 avx512_nib(__m128i nibbles)
{
	return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nibbles));
}

/* 2 x 16 values of q5 (unsigned, fifth bit included), as floats. */
TGT_AVX512 ALWAYS void avx512_q5(const uint8_t *qs, uint32_t qh, __m512 q[2])
{
	__m128i raw = _mm_loadu_si128((const __m128i *)qs);
	__m128i lo = _mm_and_si128(raw, _mm_set1_epi8(15));
	__m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
	__m512i sixteen = _mm512_set1_epi32(16);
	__m512i a = _mm512_cvtepu8_epi32(lo), b = _mm512_cvtepu8_epi32(hi);

	a = _mm512_mask_or_epi32(a, (__mmask16)(qh & 0xffff), a, sixteen);
	b = _mm512_mask_or_epi32(b, (__mmask16)(qh >> 16), b, sixteen);
	q[0] = _mm512_cvtepi32_ps(a);
	q[1] = _mm512_cvtepi32_ps(b);
}

TGT_AVX512 ALWAYS void avx512_deq(const uint32_t t, const uint8_t *p, __m512 w[2])
{
	__m512 d, m;
	__m128i raw, lo, hi;

	switch (t) {
	case LOOM_TYPE_F32:
		for (int s = 0; s < 2; s++)
			w[s] = _mm512_loadu_ps((const float *)p + 16 * s);
		break;
	case LOOM_TYPE_F16:
		for (int s = 0; s < 2; s++)
			w[s] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32 * s)));
		break;
	case LOOM_TYPE_BF16:
		for (int s = 0; s < 2; s++) {
			__m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 32 * s)));

			w[s] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
		}
		break;
	case LOOM_TYPE_Q8_0:
		d = _mm512_set1_ps(avx2_h(p));
		for (int s = 0; s < 2; s++) {
			__m128i q = _mm_loadu_si128((const __m128i *)(p + 2 + 16 * s));

			w[s] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
		}
		break;
	case LOOM_TYPE_Q4_0:
		d = _mm512_set1_ps(avx2_h(p));
		raw = _mm_loadu_si128((const __m128i *)(p + 2));
		lo = _mm_sub_epi8(_mm_and_si128(raw, _mm_set1_epi8(15)), _mm_set1_epi8(8));
		hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)),
				  _mm_set1_epi8(8));
		w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
		w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
		break;
	case LOOM_TYPE_Q4_1:
		d = _mm512_set1_ps(avx2_h(p));
		m = _mm512_set1_ps(avx2_h(p + 2));
		raw = _mm_loadu_si128((const __m128i *)(p + 4));
		lo = _mm_and_si128(raw, _mm_set1_epi8(15));
		hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
		w[0] = _mm512_fmadd_ps(avx512_nib(lo), d, m);
		w[1] = _mm512_fmadd_ps(avx512_nib(hi), d, m);
		break;
	case LOOM_TYPE_Q5_0:
		d = _mm512_set1_ps(avx2_h(p));
		avx512_q5(p + 6, cpu_rd32(p + 2), w);
		for (int s = 0; s < 2; s++)
			w[s] = _mm512_mul_ps(_mm512_sub_ps(w[s], _mm512_set1_ps(16.0f)), d);
		break;
	case LOOM_TYPE_Q5_1:
		d = _mm512_set1_ps(avx2_h(p));
		m = _mm512_set1_ps(avx2_h(p + 2));
		avx512_q5(p + 8, cpu_rd32(p + 4), w);
		for (int s = 0; s < 2; s++)
			w[s] = _mm512_fmadd_ps(w[s], d, m);
		break;
	case LOOM_TYPE_MXFP4:
		d = _mm512_set1_ps(cpu_mxfp4_scale(p[0]));
		raw = _mm_loadu_si128((const __m128i *)(p + 1));
		lo = _mm_shuffle_epi8(MXFP4_LUT, _mm_and_si128(raw, _mm_set1_epi8(15)));
		hi = _mm_shuffle_epi8(MXFP4_LUT,
				      _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)));
		w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
		w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
		break;
	default: /* never reached: types are checked before */
		w[0] = w[1] = _mm512_setzero_ps();
		break;
	}
}

/* As avx2_kdeq: values 0-15 and 16-31 of group g. */
TGT_AVX512 ALWAYS void avx512_kdeq(const uint32_t t, const uint8_t *b, int g, const float *dl,
				   const float *ml, __m512 w[2])
{
	struct kgroup q = k_group(t, b, g);
	__m256i v = avx2_kquants(&q);
	__m128i parts[2] = { _mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1) };

	for (int s = 0; s < 2; s++) {
		__m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(parts[s]));
		__m512 d = _mm512_set1_ps(dl[s]), m = _mm512_set1_ps(ml[s]);

		w[s] = k_has_min(t) ? _mm512_fmsub_ps(f, d, m) : _mm512_mul_ps(f, d);
	}
}

/* As avx2_group. */
TGT_AVX512 ALWAYS void avx512_group(const uint32_t t, const uint8_t *row, int64_t gi,
				    struct ksb *sb, __m512 w[2])
{
	const uint8_t *p = row + (size_t)(gi / 8) * cpu_block_bytes(t);
	int g = (int)(gi % 8);

	if (!format_k(t)) {
		avx512_deq(t, row + gi * group_bytes(t), w);
		return;
	}
	if (g == 0)
		avx2_ksb(t, p, sb);
	avx512_kdeq(t, p, g, sb->dl + 2 * g, sb->ml + 2 * g, w);
}

/* One block for R rows; `phase` alternates accumulators when A == 4. */
TGT_AVX512 ALWAYS void avx512_block(const struct cpu_gemv *g, const uint32_t t, const int R,
				    const int A, const uint8_t *wr, const float *x, int64_t b,
				    const int phase, struct ksb *sb, __m512 acc[4][4])
{
	__m512 w[2];

	avx512_group(t, wr, b, sb, w);
	for (int r = 0; r < R; r++) {
		const float *xp = x + r * g->x_stride + b * 32;

		for (int s = 0; s < 2; s++) {
			int a = (s + 2 * phase) % A;

			acc[r][a] = _mm512_fmadd_ps(w[s], _mm512_loadu_ps(xp + 16 * s), acc[r][a]);
		}
	}
}

/* As avx2_rows: A accumulators per row, 4 for a lone row, else 2. */
TGT_AVX512 ALWAYS void avx512_rows(const struct cpu_gemv *g, const uint32_t t, const int R,
				   const int A, const uint8_t *wr, int64_t i, int64_t j)
{
	const int64_t nb = g->k / 32;
	const float *x = g->x + i * g->x_stride;
	__m512 acc[4][4];
	struct ksb sb;
	int64_t b = 0;

	for (int r = 0; r < R; r++)
		for (int a = 0; a < A; a++)
			acc[r][a] = _mm512_setzero_ps();
	for (; b + 2 <= nb; b += 2) {
		avx512_block(g, t, R, A, wr, x, b, 0, &sb, acc);
		avx512_block(g, t, R, A, wr, x, b + 1, 1, &sb, acc);
	}
	if (b < nb)
		avx512_block(g, t, R, A, wr, x, b, 0, &sb, acc);
	for (int r = 0; r < R; r++) {
		__m512 v = _mm512_add_ps(acc[r][0], acc[r][1]);

		if (A == 4)
			v = _mm512_add_ps(v, _mm512_add_ps(acc[r][2], acc[r][3]));
		float s = _mm512_reduce_add_ps(v);
		if (nb * 32 < g->k)
			s += tail_dot(t, wr, x + r * g->x_stride, nb * 32, g->k);
		g->y[(i + r) * g->y_stride + j] = s;
	}
}

/* Quants of one block as floats, values 0-15 and 16-31, offset applied. */
TGT_AVX512 ALWAYS void avx512_quants(const uint32_t t, const uint8_t *p, __m512 q[2])
{
	switch (t) {
	case LOOM_TYPE_Q8_0:
		for (int s = 0; s < 2; s++)
			q[s] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
				_mm_loadu_si128((const __m128i *)(p + 2 + 16 * s))));
		return;
	case LOOM_TYPE_Q4_0:
	case LOOM_TYPE_Q4_1: {
		const uint8_t *qs = p + (t == LOOM_TYPE_Q4_0 ? 2 : 4);
		const __m512i off = _mm512_set1_epi32(t == LOOM_TYPE_Q4_0 ? 8 : 0);
		/* lane e holds byte e: low nibble is value e, high value e+16 */
		__m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));

		q[0] = _mm512_cvtepi32_ps(
			_mm512_sub_epi32(_mm512_and_si512(v, _mm512_set1_epi32(15)), off));
		q[1] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(v, 4), off));
		return;
	}
	case LOOM_TYPE_Q5_0:
		avx512_q5(p + 6, cpu_rd32(p + 2), q);
		for (int s = 0; s < 2; s++)
			q[s] = _mm512_sub_ps(q[s], _mm512_set1_ps(16.0f));
		return;
	default: /* Q5_1 */
		avx512_q5(p + 8, cpu_rd32(p + 4), q);
		return;
	}
}

TGT_AVX512 ALWAYS __m512 avx512_qdot(const __m512 q[2], __m512 x0, __m512 x1)
{
	return _mm512_fmadd_ps(q[1], x1, _mm512_mul_ps(q[0], x0));
}

/*
 * As avx2_qtile, but any R x J tile with R * J <= 8 (32 registers). Each
 * element gets the same operations, in the same order, whatever the tile.
 */
TGT_AVX512 ALWAYS void avx512_qtile(const struct cpu_gemv *g, const uint32_t t, const int R,
				    const int J, int64_t i, int64_t j)
{
	const int64_t nb = g->k / 32;
	const size_t gb = cpu_block_bytes(t);
	const bool has_m = cpu_format_has_min(t);
	const uint8_t *w = g->w + (size_t)j * g->w_stride;
	const float *x = g->x + i * g->x_stride;
	const float *xs = has_m ? g->xs + i * g->xs_stride : NULL;
	__m512 acc[8], q[4][2], d[4];
	__m128 macc[8], dm[4];

	for (int a = 0; a < R * J; a++) {
		acc[a] = _mm512_setzero_ps();
		macc[a] = _mm_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		for (int c = 0; c < J; c++) {
			const uint8_t *pc = w + (size_t)c * g->w_stride + b * gb;

			dm[c] = avx2_dm(pc);
			d[c] = _mm512_broadcastss_ps(dm[c]);
			avx512_quants(t, pc, q[c]);
		}
		for (int r = 0; r < R; r++) {
			const float *xp = x + r * g->x_stride + b * 32;
			__m512 x0 = _mm512_loadu_ps(xp), x1 = _mm512_loadu_ps(xp + 16);
			__m128 sx = has_m ? _mm_loadu_ps(xs + r * g->xs_stride + 2 * b)
					  : _mm_setzero_ps();

			for (int c = 0; c < J; c++) {
				int a = r * J + c;

				acc[a] = _mm512_fmadd_ps(avx512_qdot(q[c], x0, x1), d[c], acc[a]);
				if (has_m)
					macc[a] = _mm_fmadd_ps(dm[c], sx, macc[a]);
			}
		}
	}
	for (int r = 0; r < R; r++)
		for (int c = 0; c < J; c++) {
			float s = _mm512_reduce_add_ps(acc[r * J + c]);

			if (has_m)
				s += _mm_cvtss_f32(_mm_movehdup_ps(macc[r * J + c]));
			g->y[(i + r) * g->y_stride + j + c] = s;
		}
}

/* Rows i.. of weight rows j.. (J of them) in tiles of up to 4 rows. */
TGT_AVX512 ALWAYS void avx512_qcols(const struct cpu_gemv *g, const uint32_t t, const int J,
				    int64_t j)
{
	int64_t i = 0;

	for (; i + 4 <= g->m; i += 4)
		avx512_qtile(g, t, 4, J, i, j);
	switch (g->m - i) {
	case 3: avx512_qtile(g, t, 3, J, i, j); break;
	case 2: avx512_qtile(g, t, 2, J, i, j); break;
	case 1: avx512_qtile(g, t, 1, J, i, j); break;
	}
}

TGT_AVX512 ALWAYS void avx512_qgemv(const struct cpu_gemv *g, const uint32_t t, int64_t j0,
				    int64_t j1)
{
	int64_t j = j0;

	if (g->m == 1) {
		for (; j + 4 <= j1; j += 4)
			avx512_qtile(g, t, 1, 4, 0, j);
		for (; j < j1; j++)
			avx512_qtile(g, t, 1, 1, 0, j);
		return;
	}
	for (; j + 2 <= j1; j += 2)
		avx512_qcols(g, t, 2, j);
	if (j < j1)
		avx512_qcols(g, t, 1, j);
}

TGT_AVX512 ALWAYS void avx512_gemv(const struct cpu_gemv *g, const uint32_t t, int64_t j0,
				   int64_t j1)
{
	if (format_quant(t) && t != LOOM_TYPE_MXFP4) { /* MXFP4: by its group, below */
		avx512_qgemv(g, t, j0, j1);
		return;
	}
	for (int64_t j = j0; j < j1; j++) {
		const uint8_t *wr = g->w + (size_t)j * g->w_stride;
		int64_t i = 0;

		if (g->m == 1 && !g->inv) {
			avx512_rows(g, t, 1, 4, wr, 0, j);
			continue;
		}
		for (; i + 4 <= g->m; i += 4)
			avx512_rows(g, t, 4, 2, wr, i, j);
		switch (g->m - i) {
		case 3: avx512_rows(g, t, 3, 2, wr, i, j); break;
		case 2: avx512_rows(g, t, 2, 2, wr, i, j); break;
		case 1: avx512_rows(g, t, 1, 2, wr, i, j); break;
		}
	}
}

TGT_AVX512 static void avx512_deq_row(const uint32_t t, const uint8_t *src, float *dst,
				      int64_t k)
{
	const int64_t nb = k / 32;
	struct ksb sb;

	for (int64_t b = 0; b < nb; b++) {
		__m512 w[2];

		avx512_group(t, src, b, &sb, w);
		_mm512_storeu_ps(dst + b * 32, w[0]);
		_mm512_storeu_ps(dst + b * 32 + 16, w[1]);
	}
	for (int64_t e = nb * 32; e < k; e++)
		dst[e] = plain_get(t, src, e);
}

/* One GEMV per format, each inlining avx512_gemv for its constant type, and
 * the table cpu_gemv_rows looks them up in. */
TGT_AVX512 static void avx512_gemv_f32(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_F32, j0, j1);
}

TGT_AVX512 static void avx512_gemv_f16(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_F16, j0, j1);
}

TGT_AVX512 static void avx512_gemv_bf16(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_BF16, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q8_0(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q8_0, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q4_0(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q4_0, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q4_1(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q4_1, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q5_0(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q5_0, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q5_1(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q5_1, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q2_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q2_K, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q3_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q3_K, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q4_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q4_K, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q5_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q5_K, j0, j1);
}

TGT_AVX512 static void avx512_gemv_q6_K(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_Q6_K, j0, j1);
}

TGT_AVX512 static void avx512_gemv_mxfp4(const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
	avx512_gemv(g, LOOM_TYPE_MXFP4, j0, j1);
}

static const cpu_gemv_fn avx512_gemv_table[LOOM_TYPE_COUNT] = {
	[LOOM_TYPE_F32] = avx512_gemv_f32,
	[LOOM_TYPE_F16] = avx512_gemv_f16,
	[LOOM_TYPE_BF16] = avx512_gemv_bf16,
	[LOOM_TYPE_Q8_0] = avx512_gemv_q8_0,
	[LOOM_TYPE_Q4_0] = avx512_gemv_q4_0,
	[LOOM_TYPE_Q4_1] = avx512_gemv_q4_1,
	[LOOM_TYPE_Q5_0] = avx512_gemv_q5_0,
	[LOOM_TYPE_Q5_1] = avx512_gemv_q5_1,
	[LOOM_TYPE_Q2_K] = avx512_gemv_q2_K,
	[LOOM_TYPE_Q3_K] = avx512_gemv_q3_K,
	[LOOM_TYPE_Q4_K] = avx512_gemv_q4_K,
	[LOOM_TYPE_Q5_K] = avx512_gemv_q5_K,
	[LOOM_TYPE_Q6_K] = avx512_gemv_q6_K,
	[LOOM_TYPE_MXFP4] = avx512_gemv_mxfp4,
};

/* One dequantizing row per format, each inlining avx512_deq_row for its
 * constant type, and the table cpu_dequant_row looks them up in. */
TGT_AVX512 static void avx512_deq_row_f32(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_F32, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_f16(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_F16, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_bf16(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_BF16, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q8_0(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q8_0, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q4_0(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q4_0, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q4_1(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q4_1, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q5_0(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q5_0, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q5_1(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q5_1, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q2_K(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q2_K, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q3_K(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q3_K, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q4_K(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q4_K, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q5_K(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q5_K, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_q6_K(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_Q6_K, src, dst, k);
}

TGT_AVX512 static void avx512_deq_row_mxfp4(const uint8_t *src, float *dst, int64_t k)
{
	avx512_deq_row(LOOM_TYPE_MXFP4, src, dst, k);
}

static const cpu_deq_fn avx512_deq_table[LOOM_TYPE_COUNT] = {
	[LOOM_TYPE_F32] = avx512_deq_row_f32,
	[LOOM_TYPE_F16] = avx512_deq_row_f16,
	[LOOM_TYPE_BF16] = avx512_deq_row_bf16,
	[LOOM_TYPE_Q8_0] = avx512_deq_row_q8_0,
	[LOOM_TYPE_Q4_0] = avx512_deq_row_q4_0,
	[LOOM_TYPE_Q4_1] = avx512_deq_row_q4_1,
	[LOOM_TYPE_Q5_0] = avx512_deq_row_q5_0,
	[LOOM_TYPE_Q5_1] = avx512_deq_row_q5_1,
	[LOOM_TYPE_Q2_K] = avx512_deq_row_q2_K,
	[LOOM_TYPE_Q3_K] = avx512_deq_row_q3_K,
	[LOOM_TYPE_Q4_K] = avx512_deq_row_q4_K,
	[LOOM_TYPE_Q5_K] = avx512_deq_row_q5_K,
	[LOOM_TYPE_Q6_K] = avx512_deq_row_q6_K,
	[LOOM_TYPE_MXFP4] = avx512_deq_row_mxfp4,
};
#endif /* __x86_64__ */

void cpu_gemv_rows(enum cpu_isa isa, const struct cpu_gemv *g, int64_t j0, int64_t j1)
{
#if defined(__x86_64__)
	/* the one place a GEMV picks its kernel: by instruction set, then
	 * format (a type missing from the table takes the scalar loop) */
	const cpu_gemv_fn *table = isa == CPU_ISA_AVX512 ? avx512_gemv_table
				   : isa == CPU_ISA_AVX2 ? avx2_gemv_table
							 : NULL;

	if (table && g->type < LOOM_TYPE_COUNT && table[g->type]) {
		table[g->type](g, j0, j1);
		return;
	}
#endif
	scalar_gemv(g, j0, j1);
}

void cpu_dequant_row(enum cpu_isa isa, uint32_t type, const void *src, float *dst, int64_t k)
{
#if defined(__x86_64__)
	/* the one place a dequantizing row picks its kernel, as in
	 * cpu_gemv_rows */
	const cpu_deq_fn *table = isa == CPU_ISA_AVX512 ? avx512_deq_table
				  : isa == CPU_ISA_AVX2 ? avx2_deq_table
							: NULL;

	if (table && type < LOOM_TYPE_COUNT && table[type]) {
		table[type](src, dst, k);
		return;
	}
#endif
	scalar_deq_row(type, src, dst, k);
}

float cpu_dot_f32(enum cpu_isa isa, const float *a, const float *b, int64_t n)
{
#if defined(__x86_64__)
	if (isa != CPU_ISA_SCALAR)
		return avx2_dot(a, b, n);
#endif
	return scalar_dot(a, b, n);
}

void cpu_axpy_f32(enum cpu_isa isa, float *y, const float *x, float s, int64_t n)
{
#if defined(__x86_64__)
	if (isa != CPU_ISA_SCALAR) {
		avx2_axpy(y, x, s, n);
		return;
	}
#endif
	scalar_axpy(y, x, s, n);
}
