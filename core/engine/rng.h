/* The core's random numbers (internal): xoshiro256** seeded by splitmix64.
 * One generator for the sampler and for speculative acceptance, so a seed
 * means the same stream everywhere. Deterministic and platform-independent. */
#ifndef LOOM_RNG_H
#define LOOM_RNG_H

#include <stdint.h>

static inline uint64_t loom_splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t loom_rotl64(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static inline uint64_t loom_rng_next(uint64_t s[4])
{
	uint64_t out = loom_rotl64(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = loom_rotl64(s[3], 45);
	return out;
}

/* Uniform double in [0, 1) from the top 53 bits. */
static inline double loom_rng_uniform(uint64_t s[4])
{
	return (double)(loom_rng_next(s) >> 11) * 0x1.0p-53;
}

static inline void loom_rng_seed(uint64_t s[4], uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		s[i] = loom_splitmix64(&seed);
}

#endif /* LOOM_RNG_H */
