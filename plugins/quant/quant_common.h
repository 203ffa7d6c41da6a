/*
 * Helpers shared by the quantization plugins (header only, static inline).
 *
 * Half-precision conversions follow IEEE 754 binary16 and Google's bfloat16:
 * float -> half rounds to nearest, ties to even, overflows to infinity and
 * produces subnormals; NaN stays NaN (made quiet). half -> float is exact.
 */
#ifndef LOOM_QUANT_COMMON_H
#define LOOM_QUANT_COMMON_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "loom/plugin.h"

static inline uint32_t quant_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float quant_bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Rounds the low `shift` bits off m, to nearest with ties to even. */
static inline uint32_t quant_round_shift(uint32_t m, unsigned int shift)
{
	uint32_t q = m >> shift;
	uint32_t rem = m & ((1u << shift) - 1);
	uint32_t half = 1u << (shift - 1);

	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

static inline uint16_t quant_f32_to_f16(float f)
{
	uint32_t x = quant_f32_bits(f);
	uint16_t sign = (x >> 16) & 0x8000;
	uint32_t ax = x & 0x7fffffff;

	if (ax > 0x7f800000) /* NaN: quiet, keep the top payload bits */
		return sign | 0x7e00 | ((ax >> 13) & 0x3ff);
	if (ax >= 0x477ff000) /* >= 65520 (halfway above 65504): infinity */
		return sign | 0x7c00;
	if (ax < 0x33000000) /* < 2^-25: rounds to zero */
		return sign;
	if (ax < 0x38800000) {
		/* Below 2^-14: half subnormal, units of 2^-24. The value is
		 * m * 2^(e - 150), so the result is m >> (126 - e). A carry
		 * into 0x400 gives the smallest normal, correctly encoded. */
		uint32_t e = ax >> 23;
		uint32_t m = (ax & 0x7fffff) | 0x800000;

		return sign | quant_round_shift(m, 126 - e);
	}
	/* Normal: rebias the exponent (127 -> 15) and drop 13 mantissa
	 * bits; a mantissa carry correctly bumps the exponent. */
	return sign | quant_round_shift(ax - 0x38000000, 13);
}

static inline float quant_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t e = (h >> 10) & 0x1f;
	uint32_t m = h & 0x3ff;
	float v;

	if (e == 0x1f) /* inf or NaN, payload kept */
		return quant_bits_f32(sign | 0x7f800000 | (m << 13));
	if (e != 0)
		return quant_bits_f32(sign | ((e + 112) << 23) | (m << 13));
	v = (float)m * 0x1p-24f; /* zero or subnormal, exact */
	return sign ? -v : v;
}

static inline float quant_bf16_to_f32(uint16_t h)
{
	return quant_bits_f32((uint32_t)h << 16);
}

static inline uint16_t quant_f32_to_bf16(float f)
{
	uint32_t x = quant_f32_bits(f);

	if ((x & 0x7fffffff) > 0x7f800000) /* NaN: quiet, keep sign */
		return ((x >> 16) & 0xffff) | 0x0040;
	/* Round to nearest even; cannot overflow 32 bits for non-NaN x. */
	return (x + 0x7fff + ((x >> 16) & 1)) >> 16;
}

/* Little-endian 16-bit load and store, alignment free. */
static inline uint16_t quant_ld16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void quant_st16(uint8_t *p, uint16_t v)
{
	p[0] = v & 0xff;
	p[1] = v >> 8;
}

static inline float quant_ld_f16(const uint8_t *p)
{
	return quant_f16_to_f32(quant_ld16(p));
}

static inline void quant_st_f16(uint8_t *p, float v)
{
	quant_st16(p, quant_f32_to_f16(v));
}

/*
 * Truncates v toward zero and clamps it to [lo, hi]. NaN gives lo. Never
 * converts an out-of-range float to int (undefined behaviour in C).
 */
static inline int quant_trunc_clamp(float v, int lo, int hi)
{
	if (!(v >= (float)lo))
		return lo;
	if (v >= (float)hi)
		return hi;
	return (int)v;
}

/* 0 when the arguments describe n / block values, else LOOM_ERR_INVALID. */
static inline int quant_check_args(const void *src, const void *dst, int64_t n,
				   uint32_t block)
{
	if (n < 0 || n % block != 0)
		return LOOM_ERR_INVALID;
	/* No buffer of n floats can exist past this; keeps n * 4 in size_t. */
	if ((uint64_t)n > SIZE_MAX / sizeof(float))
		return LOOM_ERR_INVALID;
	if (n > 0 && (!src || !dst))
		return LOOM_ERR_INVALID;
	return LOOM_OK;
}

/* Sets sub-block j's 6-bit scale and minimum in a Q4_K/Q5_K block's 12
 * scale bytes s (zeroed before the first call). */
static inline void quant_k4_set_scale_min(uint8_t *s, int j, int sc, int m)
{
	if (j < 4) {
		s[j] |= (uint8_t)sc;
		s[j + 4] |= (uint8_t)m;
	} else {
		s[j + 4] |= (uint8_t)((sc & 0x0f) | (m & 0x0f) << 4);
		s[j - 4] |= (uint8_t)((sc >> 4) << 6);
		s[j] |= (uint8_t)((m >> 4) << 6);
	}
}

#endif /* LOOM_QUANT_COMMON_H */
