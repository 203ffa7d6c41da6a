/*
 * KV cache element types (backend ABI 1.3): the block layouts a paged KV
 * cache may hold, as static inline helpers a backend may include (like
 * loom/backend_check.h, optional: loom/backend.h states the layouts).
 *
 *   LOOM_TYPE_F32   4 bytes a value
 *   LOOM_TYPE_F16   2 bytes a value, IEEE half, rounded to nearest even
 *   LOOM_TYPE_Q8_0  blocks of 32 values in 34 bytes: an f16 scale d, then
 *                   32 int8 q; value = d * q. d = max|x| / 127,
 *                   q = round(x / d) (GGUF's q8_0)
 *   LOOM_TYPE_Q4_0  blocks of 32 values in 18 bytes: an f16 scale d, then
 *                   16 bytes; byte j holds value j in its low nibble and
 *                   value j + 16 in its high one; value = d * (nibble - 8).
 *                   d = m / -8 with m the value of largest magnitude,
 *                   nibble = min(15, trunc(x / d + 8.5)) (GGUF's q4_0)
 *
 * A cache row (one token's kv_dim values of one layer's K or V) is
 * kv_dim values of the type, so a quantized type needs kv_dim and, for
 * attention to read whole blocks per head, head_dim a multiple of 32.
 * Slot s of a cache starts at byte s * loom_kvq_row_bytes(type, kv_dim).
 *
 * Every function is deterministic and uses only integer and f32
 * arithmetic, so a quantized row is the same bytes on every backend that
 * uses these helpers. LOOM_KVQ_FN lets a device compiler mark them (a
 * CUDA/HIP source defines it as `static __host__ __device__ inline`
 * before including this header).
 */
#ifndef LOOM_KV_QUANT_H
#define LOOM_KV_QUANT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/backend.h"

#ifndef LOOM_KVQ_FN
#define LOOM_KVQ_FN static inline
#endif

#define LOOM_KVQ_BLOCK 32      /* values per q8_0 / q4_0 block */
#define LOOM_KVQ_Q8_0_BYTES 34 /* bytes per q8_0 block */
#define LOOM_KVQ_Q4_0_BYTES 18 /* bytes per q4_0 block */

/* Whether `type` is a KV cache type of ABI 1.3. */
LOOM_KVQ_FN bool loom_kvq_known(uint32_t type)
{
	return type == LOOM_TYPE_F32 || type == LOOM_TYPE_F16 || type == LOOM_TYPE_Q8_0 ||
	       type == LOOM_TYPE_Q4_0;
}

/* Values per block of a KV type: 1 for f32 and f16, 32 for the others. */
LOOM_KVQ_FN int64_t loom_kvq_block_elems(uint32_t type)
{
	return type == LOOM_TYPE_Q8_0 || type == LOOM_TYPE_Q4_0 ? LOOM_KVQ_BLOCK : 1;
}

/* Bytes of n values of a KV type; 0 when the type is unknown, n is not a
 * whole number of blocks, or n is not positive. n < 2^40 is the caller's
 * to check (every use in loom is far below). */
LOOM_KVQ_FN size_t loom_kvq_row_bytes(uint32_t type, int64_t n)
{
	if (n <= 0 || !loom_kvq_known(type) || n % loom_kvq_block_elems(type))
		return 0;
	switch (type) {
	case LOOM_TYPE_F32:
		return (size_t)n * 4;
	case LOOM_TYPE_F16:
		return (size_t)n * 2;
	case LOOM_TYPE_Q8_0:
		return (size_t)(n / LOOM_KVQ_BLOCK) * LOOM_KVQ_Q8_0_BYTES;
	default:
		return (size_t)(n / LOOM_KVQ_BLOCK) * LOOM_KVQ_Q4_0_BYTES;
	}
}

LOOM_KVQ_FN uint32_t loom_kvq_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

LOOM_KVQ_FN float loom_kvq_bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* IEEE half -> f32, exact (subnormals, infinities and NaNs included). */
LOOM_KVQ_FN float loom_kvq_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;

	if (exp == 0x1f) /* inf, NaN */
		return loom_kvq_bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) { /* zero, subnormal: man * 2^-24 exactly */
		float f = (float)man * 5.9604644775390625e-8f;

		return sign ? -f : f;
	}
	return loom_kvq_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* f32 -> IEEE half, rounded to nearest even; overflow gives infinity. */
LOOM_KVQ_FN uint16_t loom_kvq_f32_to_f16(float f)
{
	uint32_t u = loom_kvq_f32_bits(f), sign = (u >> 16) & 0x8000u;
	uint32_t abs = u & 0x7fffffffu;

	if (abs >= 0x7f800000u) /* inf, NaN (kept quiet) */
		return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
	if (abs >= 0x477ff000u) /* rounds to 65536 or more */
		return (uint16_t)(sign | 0x7c00u);
	if (abs < 0x38800000u) { /* below 2^-14: a half subnormal or zero */
		/* the value in units of 2^-24, rounded to nearest even by
		 * adding it to 0.5 (whose ulp at that scale is 2^-24) */
		float a = loom_kvq_bits_f32(abs) + 0.5f;

		return (uint16_t)(sign | (loom_kvq_f32_bits(a) - 0x3f000000u));
	}
	/* normal: rebias the exponent and round the mantissa's 13 dropped bits */
	uint32_t odd = (abs >> 13) & 1u;

	abs += 0xfff + odd;
	return (uint16_t)(sign | ((abs - 0x38000000u) >> 13));
}

LOOM_KVQ_FN uint16_t loom_kvq_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

LOOM_KVQ_FN void loom_kvq_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v & 0xff);
	p[1] = (uint8_t)(v >> 8);
}

/* One q8_0 block of x[0..31] into dst (34 bytes). */
LOOM_KVQ_FN void loom_kvq_put_q8_0(uint8_t *dst, const float *x)
{
	float amax = 0.0f, d, id;

	for (int i = 0; i < LOOM_KVQ_BLOCK; i++) {
		float a = x[i] < 0.0f ? -x[i] : x[i];

		amax = a > amax ? a : amax;
	}
	d = amax / 127.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	loom_kvq_put16(dst, loom_kvq_f32_to_f16(d));
	for (int i = 0; i < LOOM_KVQ_BLOCK; i++)
		dst[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
}

/* One q4_0 block of x[0..31] into dst (18 bytes). */
LOOM_KVQ_FN void loom_kvq_put_q4_0(uint8_t *dst, const float *x)
{
	float amax = 0.0f, m = 0.0f, d, id;

	for (int i = 0; i < LOOM_KVQ_BLOCK; i++) {
		float a = x[i] < 0.0f ? -x[i] : x[i];

		if (a > amax) {
			amax = a;
			m = x[i];
		}
	}
	d = m / -8.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	loom_kvq_put16(dst, loom_kvq_f32_to_f16(d));
	for (int j = 0; j < LOOM_KVQ_BLOCK / 2; j++) {
		int lo = (int)(int8_t)(x[j] * id + 8.5f), hi = (int)(int8_t)(x[j + 16] * id + 8.5f);

		lo = lo < 15 ? lo : 15;
		hi = hi < 15 ? hi : 15;
		dst[2 + j] = (uint8_t)(lo | (hi << 4));
	}
}

/* The values x[0..n) as a row of `type` at dst (n a whole number of
 * blocks, the type known: see loom_kvq_row_bytes). */
LOOM_KVQ_FN void loom_kvq_quantize(uint32_t type, void *dst, const float *x, int64_t n)
{
	uint8_t *d = (uint8_t *)dst;

	switch (type) {
	case LOOM_TYPE_F32:
		memcpy(dst, x, (size_t)n * sizeof(float));
		break;
	case LOOM_TYPE_F16:
		for (int64_t i = 0; i < n; i++)
			loom_kvq_put16(d + 2 * i, loom_kvq_f32_to_f16(x[i]));
		break;
	case LOOM_TYPE_Q8_0:
		for (int64_t b = 0; b < n / LOOM_KVQ_BLOCK; b++)
			loom_kvq_put_q8_0(d + b * LOOM_KVQ_Q8_0_BYTES, x + b * LOOM_KVQ_BLOCK);
		break;
	case LOOM_TYPE_Q4_0:
		for (int64_t b = 0; b < n / LOOM_KVQ_BLOCK; b++)
			loom_kvq_put_q4_0(d + b * LOOM_KVQ_Q4_0_BYTES, x + b * LOOM_KVQ_BLOCK);
		break;
	default:
		break;
	}
}

/* Value i of a row of `type` starting at src. */
LOOM_KVQ_FN float loom_kvq_value(uint32_t type, const void *src, int64_t i)
{
	const uint8_t *s = (const uint8_t *)src;

	switch (type) {
	case LOOM_TYPE_F16:
		return loom_kvq_f16_to_f32(loom_kvq_get16(s + 2 * i));
	case LOOM_TYPE_Q8_0: {
		const uint8_t *b = s + (i / LOOM_KVQ_BLOCK) * LOOM_KVQ_Q8_0_BYTES;

		return loom_kvq_f16_to_f32(loom_kvq_get16(b)) *
		       (float)(int8_t)b[2 + i % LOOM_KVQ_BLOCK];
	}
	case LOOM_TYPE_Q4_0: {
		const uint8_t *b = s + (i / LOOM_KVQ_BLOCK) * LOOM_KVQ_Q4_0_BYTES;
		int j = (int)(i % LOOM_KVQ_BLOCK);
		int nib = j < 16 ? b[2 + j] & 0x0f : b[2 + j - 16] >> 4;

		return loom_kvq_f16_to_f32(loom_kvq_get16(b)) * (float)(nib - 8);
	}
	default: {
		float f;

		memcpy(&f, s + 4 * i, sizeof(f));
		return f;
	}
	}
}

/* dst[0..n) = values first .. first + n - 1 of a row of `type` at src. */
LOOM_KVQ_FN void loom_kvq_dequantize(uint32_t type, float *dst, const void *src,
				     int64_t first, int64_t n)
{
	if (type == LOOM_TYPE_F32) {
		memcpy(dst, (const float *)src + first, (size_t)n * sizeof(float));
		return;
	}
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_kvq_value(type, src, first + i);
}

#endif /* LOOM_KV_QUANT_H */
