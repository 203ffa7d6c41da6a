/*
 * Small AVX2 helpers shared by kernels.c and attention.c, inline so that a
 * caller's loop holds them in registers. Each has one arithmetic, wherever
 * it is inlined: exact mode's attention gives the same bits whether its
 * dot products run here or through cpu_dot_f32().
 */
#ifndef LOOM_CPU_SIMD_H
#define LOOM_CPU_SIMD_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define CPU_TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CPU_INLINE static inline __attribute__((always_inline))

/* (v0+v4) + (v2+v6) ... in one fixed order. */
CPU_TGT_AVX2 CPU_INLINE float cpu_avx2_hsum(__m256 v)
{
	__m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	x = _mm_add_ps(x, _mm_movehl_ps(x, x));
	x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
	return _mm_cvtss_f32(x);
}

/* a . b: two 8-lane accumulators over 16-float steps, then 8, then the
 * rest in plain C (mul and add, never contracted). */
CPU_TGT_AVX2 CPU_INLINE float cpu_avx2_dot(const float *a, const float *b, int64_t n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
	}
	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
	float s = cpu_avx2_hsum(_mm256_add_ps(s0, s1));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/*
 * 32 activations v as int8 on 127 levels of their max |v| (qdot.c's and
 * qdot_k.c's quantizers, byte for byte: the max is exact in any order,
 * v * id the same product, the conversion rounds to nearest even as
 * lrintf() does). A NaN or inf among them: every q 0 and false returned.
 * Also the max, and the sums of q over the two halves of 16.
 */
CPU_TGT_AVX2 CPU_INLINE bool cpu_avx2_q32(const float *v, int8_t q[32], float *amax, int sum[2])
{
	const __m256 inf = _mm256_set1_ps(INFINITY);
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
	/* packs works within 128-bit lanes: this puts the 32 bytes back in order */
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	__m256 x[4], a[4], m;
	__m256i qi[4], s0, s1;
	__m128 m4;
	int finite = 0xff;
	float id;

	for (int i = 0; i < 4; i++) {
		x[i] = _mm256_loadu_ps(v + 8 * i);
		a[i] = _mm256_and_ps(x[i], absmask);
		/* NaN compares false: not finite */
		finite &= _mm256_movemask_ps(_mm256_cmp_ps(a[i], inf, _CMP_LT_OQ));
	}
	m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
	m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
	*amax = _mm_cvtss_f32(m4);
	id = *amax > 0.0f ? 127.0f / *amax : 0.0f;
	for (int i = 0; i < 4; i++) {
		qi[i] = _mm256_setzero_si256();
		if (finite == 0xff)
			qi[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(
				_mm256_mul_ps(x[i], _mm256_set1_ps(id))), lim), nlim);
	}
	_mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(
		_mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3])),
		order));
	s0 = _mm256_add_epi32(qi[0], qi[1]);
	s1 = _mm256_add_epi32(qi[2], qi[3]);
	s0 = _mm256_hadd_epi32(s0, s1); /* lanes 0-1, 4-5: s0's; 2-3, 6-7: s1's */
	s0 = _mm256_hadd_epi32(s0, s0);
	sum[0] = _mm256_extract_epi32(s0, 0) + _mm256_extract_epi32(s0, 4);
	sum[1] = _mm256_extract_epi32(s0, 1) + _mm256_extract_epi32(s0, 5);
	return finite == 0xff;
}

#endif /* __x86_64__ */
#endif /* LOOM_CPU_SIMD_H */
