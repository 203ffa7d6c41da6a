/*
 * Fast-mode exponentials of the cpu backend: exp, SiLU and GELU-tanh rows
 * (the FFN's gate) and softmax weights (attention), in place of libm's
 * scalar expf/tanhf. Exact mode never comes here.
 *
 * exp(x) = 2^n * e^r with n = round(x / ln2) and r = x - n*ln2 (Cody-Waite:
 * ln2 in two parts, both subtractions by FMA, so the first is exact),
 * |r| <= ln2/2; e^r = 1 + (r + r^2 q(r)) with q a degree-4 fit of
 * (e^r - 1 - r) / r^2 (relative error 3e-9 in exact arithmetic), and 2^n
 * applied as two powers of two built from exponent bits, 2^(n>>1) and
 * 2^(n - (n>>1)), so that n from -150 to 128 needs no branch: the first
 * product is exact, the second rounds once into a subnormal or overflows
 * to inf. x is clamped to [-104, 89] first (exp is 0 or inf beyond);
 * NaN passes the clamp and gives NaN. The result is within 1.01 ulp of
 * exp() over every float of [-88, 88] (the rounding of r, of r + r^2 q
 * and of the final sum add up; tests/backend/vexp.c holds it to 1.5).
 *
 * cpu_exp_c() is that arithmetic in plain C; the AVX2 and AVX-512 bodies
 * do the same operations lane by lane (FMA where it has fmaf, IEEE
 * division), tails included (masked), so every path gives its bits
 * whatever a value's position in a row: results depend on neither the
 * ISA, nor the thread count, nor the batch (tests/backend/vexp.c).
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define EXP_LO -104.0f
#define EXP_HI 89.0f
#define LOG2E 0x1.715476p+0f
#define SHIFT 0x1.8p23f /* adding it rounds to an integer (|n| < 2^22) */
#define LN2_HI 0x1.62e430p-1f
#define LN2_LO -0x1.05c610p-29f
#define C2 0x1.fffffcp-2f
#define C3 0x1.555492p-3f
#define C4 0x1.5558f2p-5f
#define C5 0x1.123a20p-7f
#define C6 0x1.6a23cep-10f
/* GELU-tanh: g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))) is
 * 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), without the
 * cancellation of 1 + tanh for negative g */
#define GELU_K 0.044715f
#define GELU_M2C -1.5957691216057308f /* -2 sqrt(2/pi) */

static inline uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float cpu_exp_c(float x)
{
	x = x < EXP_LO ? EXP_LO : x;
	x = x > EXP_HI ? EXP_HI : x;
	float kt = fmaf(x, LOG2E, SHIFT);
	float n = kt - SHIFT;
	float r = fmaf(n, -LN2_HI, x);
	r = fmaf(n, -LN2_LO, r);
	float q = fmaf(fmaf(fmaf(fmaf(C6, r, C5), r, C4), r, C3), r, C2);
	float p = 1.0f + fmaf(r * r, q, r);
	uint32_t k = f2u(kt) - f2u(SHIFT);
	uint32_t k1 = (uint32_t)((int32_t)k >> 1);

	return p * u2f((k1 + 127) << 23) * u2f((k - k1 + 127) << 23);
}

float cpu_silu_c(float g)
{
	return g / (1.0f + cpu_exp_c(-g));
}

float cpu_gelu_c(float g)
{
	float s = g + GELU_K * g * g * g;

	return g / (1.0f + cpu_exp_c(GELU_M2C * s));
}

static void exp_row_c(float *y, const float *x, float shift, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = cpu_exp_c(x[i] - shift);
}

static void glu_row_c(enum loom_glu_kind kind, float *o, const float *g, const float *u,
		      int64_t n)
{
	if (kind == LOOM_GLU_SILU)
		for (int64_t i = 0; i < n; i++)
			o[i] = cpu_silu_c(g[i]) * u[i];
	else
		for (int64_t i = 0; i < n; i++)
			o[i] = cpu_gelu_c(g[i]) * u[i];
}

#if defined(__x86_64__)
/*
 * One body for both vector widths: VF and VI name the float and integer
 * vectors, P(op) the intrinsic of that width (the same operations, lane
 * for lane, as cpu_exp_c()).
 */
#define TGT_AVX2 __attribute__((target("avx2,fma")))
#define TGT_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

#define EXP_BODY(VF, VI, P, TO_I, TO_F)                                                 \
	x = P(max_ps)(P(set1_ps)(EXP_LO), x); /* NaN stays: max(lo, NaN) is NaN */      \
	x = P(min_ps)(P(set1_ps)(EXP_HI), x);                                           \
	VF kt = P(fmadd_ps)(x, P(set1_ps)(LOG2E), P(set1_ps)(SHIFT));                   \
	VF n = P(sub_ps)(kt, P(set1_ps)(SHIFT));                                        \
	VF r = P(fmadd_ps)(n, P(set1_ps)(-LN2_HI), x);                                  \
	r = P(fmadd_ps)(n, P(set1_ps)(-LN2_LO), r);                                     \
	VF q = P(fmadd_ps)(P(set1_ps)(C6), r, P(set1_ps)(C5));                          \
	q = P(fmadd_ps)(q, r, P(set1_ps)(C4));                                          \
	q = P(fmadd_ps)(q, r, P(set1_ps)(C3));                                          \
	q = P(fmadd_ps)(q, r, P(set1_ps)(C2));                                          \
	VF p = P(add_ps)(P(set1_ps)(1.0f), P(fmadd_ps)(P(mul_ps)(r, r), q, r));         \
	VI k = TO_I(kt); /* n as an integer, in kt's low mantissa bits */               \
	k = P(sub_epi32)(k, P(set1_epi32)((int)f2u(SHIFT)));                            \
	VI k1 = P(srai_epi32)(k, 1);                                                    \
	VI k2 = P(sub_epi32)(k, k1);                                                    \
	k1 = P(slli_epi32)(P(add_epi32)(k1, P(set1_epi32)(127)), 23);                   \
	k2 = P(slli_epi32)(P(add_epi32)(k2, P(set1_epi32)(127)), 23);                   \
	return P(mul_ps)(P(mul_ps)(p, TO_F(k1)), TO_F(k2))

#define P256(op) _mm256_##op
#define P512(op) _mm512_##op

TGT_AVX2 INLINE __m256 exp8(__m256 x)
{
	EXP_BODY(__m256, __m256i, P256, _mm256_castps_si256, _mm256_castsi256_ps);
}

TGT_AVX512 INLINE __m512 exp16(__m512 x)
{
	EXP_BODY(__m512, __m512i, P512, _mm512_castps_si512, _mm512_castsi512_ps);
}

TGT_AVX2 INLINE __m256 silu8(__m256 g)
{
	__m256 e = exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));

	return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

TGT_AVX2 INLINE __m256 gelu8(__m256 g)
{
	__m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_K), g), g), g);
	__m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(GELU_M2C), _mm256_add_ps(g, a)));

	return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

TGT_AVX512 INLINE __m512 silu16(__m512 g)
{
	__m512 e = exp16(_mm512_castsi512_ps(
		_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32((int)0x80000000))));

	return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

TGT_AVX512 INLINE __m512 gelu16(__m512 g)
{
	__m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(GELU_K), g), g), g);
	__m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(GELU_M2C), _mm512_add_ps(g, a)));

	return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* Lanes below m on, for a row's last n % 8 values. */
TGT_AVX2 INLINE __m256i mask8(int64_t m)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m),
				  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

TGT_AVX2 static void exp_row_avx2(float *y, const float *x, float shift, int64_t n)
{
	const __m256 s = _mm256_set1_ps(shift);
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
	if (i < n) {
		__m256i m = mask8(n - i);
		__m256 v = _mm256_maskload_ps(x + i, m);

		_mm256_maskstore_ps(y + i, m, exp8(_mm256_sub_ps(v, s)));
	}
}

TGT_AVX2 static void glu_row_avx2(enum loom_glu_kind kind, float *o, const float *g,
				  const float *u, int64_t n)
{
	const bool silu = kind == LOOM_GLU_SILU;
	int64_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(g + i);

		v = silu ? silu8(v) : gelu8(v);
		_mm256_storeu_ps(o + i, _mm256_mul_ps(v, _mm256_loadu_ps(u + i)));
	}
	if (i < n) {
		__m256i m = mask8(n - i);
		__m256 v = _mm256_maskload_ps(g + i, m);

		v = silu ? silu8(v) : gelu8(v);
		_mm256_maskstore_ps(o + i, m, _mm256_mul_ps(v, _mm256_maskload_ps(u + i, m)));
	}
}

TGT_AVX512 static void exp_row_avx512(float *y, const float *x, float shift, int64_t n)
{
	const __m512 s = _mm512_set1_ps(shift);
	int64_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(y + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)));
	if (i < n) {
		__mmask16 m = (__mmask16)((1u << (n - i)) - 1);
		__m512 v = _mm512_maskz_loadu_ps(m, x + i);

		_mm512_mask_storeu_ps(y + i, m, exp16(_mm512_sub_ps(v, s)));
	}
}

TGT_AVX512 static void glu_row_avx512(enum loom_glu_kind kind, float *o, const float *g,
				      const float *u, int64_t n)
{
	const bool silu = kind == LOOM_GLU_SILU;
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512 v = _mm512_loadu_ps(g + i);

		v = silu ? silu16(v) : gelu16(v);
		_mm512_storeu_ps(o + i, _mm512_mul_ps(v, _mm512_loadu_ps(u + i)));
	}
	if (i < n) {
		__mmask16 m = (__mmask16)((1u << (n - i)) - 1);
		__m512 v = _mm512_maskz_loadu_ps(m, g + i);

		v = silu ? silu16(v) : gelu16(v);
		_mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, u + i)));
	}
}
#endif

void cpu_exp_row(enum cpu_isa isa, float *y, const float *x, float shift, int64_t n)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX512) {
		exp_row_avx512(y, x, shift, n);
		return;
	}
	if (isa == CPU_ISA_AVX2) {
		exp_row_avx2(y, x, shift, n);
		return;
	}
#endif
	exp_row_c(y, x, shift, n);
}

void cpu_glu_row_fast(enum cpu_isa isa, enum loom_glu_kind kind, float *o, const float *g,
		      const float *u, int64_t n)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX512) {
		glu_row_avx512(kind, o, g, u, n);
		return;
	}
	if (isa == CPU_ISA_AVX2) {
		glu_row_avx2(kind, o, g, u, n);
		return;
	}
#endif
	glu_row_c(kind, o, g, u, n);
}
