/*
 * Small AVX2 helpers shared by kernels.c and attention.c, inline so that a
 * caller's loop holds them in registers. Each has one arithmetic, wherever
 * it is inlined: exact mode's attention gives the same bits whether its
 * dot products run here or through cpu_dot_f32().
 */
#ifndef LOOM_CPU_SIMD_H
#define LOOM_CPU_SIMD_H

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

#endif /* __x86_64__ */
#endif /* LOOM_CPU_SIMD_H */
