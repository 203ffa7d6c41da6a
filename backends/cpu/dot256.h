/*
 * dot256.h: exact sums of byte products on 256-bit vectors, shared by
 * qdot.c, kpack_avx2.c and qgemm.c. Each int32 lane of a gets the sum of
 * its 4 products u[i] * s[i] (u unsigned, s signed bytes): maddubs and
 * madd on AVX2, one vpdpbusd on AVX-VNNI. maddubs adds pairs in int16, so
 * the caller keeps 2 * u * |s| below 32768 there (values of up to 6 bits,
 * or |q| against x with q's sign); both give the same exact sums.
 */
#ifndef LOOM_CPU_DOT256_H
#define LOOM_CPU_DOT256_H

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TGT_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

static inline __attribute__((always_inline)) TGT_AVX2 __m256i avx2_dot(__m256i a, __m256i u,
									 __m256i s)
{
	return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
						     _mm256_set1_epi16(1)));
}

static inline __attribute__((always_inline)) TGT_AVXVNNI __m256i avxvnni_dot(__m256i a,
									     __m256i u,
									     __m256i s)
{
	return _mm256_dpbusd_avx_epi32(a, u, s);
}
#endif

#endif /* LOOM_CPU_DOT256_H */
