/*
 * mxfp4 (GGUF type 39, OCP Microscaling FP4): blocks of 32 values in 17
 * bytes: one E8M0 scale byte e, then 16 nibble bytes (byte j holds value j
 * in its low half and value j + 16 in its high half). A nibble is an E2M1
 * number (sign, 2 exponent bits, 1 mantissa bit): 0, 0.5, 1, 1.5, 2, 3,
 * 4, 6 and their negatives. As GGUF stores it, each nibble indexes the
 * doubled values {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12} and the scale
 * is halved to match:
 *   value = kv[q] * 2^(e - 128)      (2^(e-127) for the E2M1 value itself)
 * which is exact in f32 for every e (2^-128 and 2^-127 are subnormal).
 *
 * from_float, as GGUF's reference quantizer (quantize_row_mxfp4_ref):
 * amax = the largest |x| of the block, e = floor(log2(amax)) - 2 + 127
 * (0 when amax is 0), and each value takes the first index whose kv * d
 * is nearest to it. Where the reference's cast of e to a byte is
 * undefined (amax below 2^-125, or not finite) this clamps e to 0 .. 254.
 */
#include <math.h>

#include "quant_common.h"

#define MXFP4_ELEMS 32
#define MXFP4_BYTES 17

static const float mxfp4_kv[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/* 2^(e - 128): the half scale of an E8M0 byte, built from its bits. */
static float mxfp4_half_scale(uint8_t e)
{
	return quant_bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

static int mxfp4_to_float(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int ret = quant_check_args(src, dst, n, MXFP4_ELEMS);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += MXFP4_ELEMS, b += MXFP4_BYTES) {
		float d = mxfp4_half_scale(b[0]);

		for (int j = 0; j < MXFP4_ELEMS / 2; j++) {
			dst[i + j] = mxfp4_kv[b[1 + j] & 15] * d;
			dst[i + j + 16] = mxfp4_kv[b[1 + j] >> 4] * d;
		}
	}
	return LOOM_OK;
}

/* The first index whose kv * d is nearest to x. */
static int mxfp4_nearest(float x, float d)
{
	int best = 0;
	float err = fabsf(mxfp4_kv[0] * d - x);

	for (int i = 1; i < 16; i++) {
		float e = fabsf(mxfp4_kv[i] * d - x);

		if (e < err) {
			best = i;
			err = e;
		}
	}
	return best;
}

static void mxfp4_block(const float *x, uint8_t *b)
{
	float amax = 0.0f, le, d;
	int e = 0;

	for (int j = 0; j < MXFP4_ELEMS; j++)
		if (amax < fabsf(x[j]))
			amax = fabsf(x[j]);
	if (amax > 0.0f) {
		le = floorf(log2f(amax)) - 2 + 127;
		e = !(le >= 0.0f) ? 0 : le > 254.0f ? 254 : (int)le;
	}
	d = mxfp4_half_scale((uint8_t)e);
	b[0] = (uint8_t)e;
	for (int j = 0; j < MXFP4_ELEMS / 2; j++)
		b[1 + j] = (uint8_t)(mxfp4_nearest(x[j], d) | mxfp4_nearest(x[j + 16], d) << 4);
}

static int mxfp4_from_float(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int ret = quant_check_args(src, dst, n, MXFP4_ELEMS);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += MXFP4_ELEMS, b += MXFP4_BYTES)
		mxfp4_block(src + i, b);
	return LOOM_OK;
}

static const struct loom_quant_format mxfp4_formats[] = {
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_MXFP4,
		.name = "mxfp4",
		.block_elems = MXFP4_ELEMS,
		.block_bytes = MXFP4_BYTES,
		.to_float = mxfp4_to_float,
		.from_float = mxfp4_from_float,
	},
};

static const struct loom_quant_plugin mxfp4_plugin = {
	.abi_major = LOOM_PLUGIN_ABI_MAJOR,
	.abi_minor = LOOM_PLUGIN_ABI_MINOR,
	.struct_size = sizeof(struct loom_quant_plugin),
	.name = "mxfp4",
	.n_formats = sizeof(mxfp4_formats) / sizeof(mxfp4_formats[0]),
	.formats = mxfp4_formats,
};

LOOM_EXPORT const struct loom_quant_plugin *loom_quant_entry(void)
{
	return &mxfp4_plugin;
}
