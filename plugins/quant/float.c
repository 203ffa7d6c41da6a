/*
 * Plain floating-point weight formats: f32, f16 and bf16 (block size 1).
 * f32 is copied as is; f16 and bf16 round to nearest even (NaN kept quiet,
 * overflow to infinity) and widen exactly.
 */
#include <string.h>

#include "quant_common.h"

static int f32_to_float(const void *src, float *dst, int64_t n)
{
	int ret = quant_check_args(src, dst, n, 1);

	if (ret == LOOM_OK && n > 0)
		memcpy(dst, src, (size_t)n * sizeof(float));
	return ret;
}

static int f32_from_float(const float *src, void *dst, int64_t n)
{
	return f32_to_float(src, dst, n);
}

static int f16_to_float(const void *src, float *dst, int64_t n)
{
	const uint8_t *s = src;
	int ret = quant_check_args(src, dst, n, 1);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i++)
		dst[i] = quant_ld_f16(s + 2 * i);
	return LOOM_OK;
}

static int f16_from_float(const float *src, void *dst, int64_t n)
{
	uint8_t *d = dst;
	int ret = quant_check_args(src, dst, n, 1);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i++)
		quant_st_f16(d + 2 * i, src[i]);
	return LOOM_OK;
}

static int bf16_to_float(const void *src, float *dst, int64_t n)
{
	const uint8_t *s = src;
	int ret = quant_check_args(src, dst, n, 1);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i++)
		dst[i] = quant_bf16_to_f32(quant_ld16(s + 2 * i));
	return LOOM_OK;
}

static int bf16_from_float(const float *src, void *dst, int64_t n)
{
	uint8_t *d = dst;
	int ret = quant_check_args(src, dst, n, 1);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i++)
		quant_st16(d + 2 * i, quant_f32_to_bf16(src[i]));
	return LOOM_OK;
}

static const struct loom_quant_format float_formats[] = {
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_F32,
		.name = "f32",
		.block_elems = 1,
		.block_bytes = 4,
		.to_float = f32_to_float,
		.from_float = f32_from_float,
	},
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_F16,
		.name = "f16",
		.block_elems = 1,
		.block_bytes = 2,
		.to_float = f16_to_float,
		.from_float = f16_from_float,
	},
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_BF16,
		.name = "bf16",
		.block_elems = 1,
		.block_bytes = 2,
		.to_float = bf16_to_float,
		.from_float = bf16_from_float,
	},
};

static const struct loom_quant_plugin float_plugin = {
	.abi_major = LOOM_PLUGIN_ABI_MAJOR,
	.abi_minor = LOOM_PLUGIN_ABI_MINOR,
	.struct_size = sizeof(struct loom_quant_plugin),
	.name = "float",
	.n_formats = sizeof(float_formats) / sizeof(float_formats[0]),
	.formats = float_formats,
};

LOOM_EXPORT const struct loom_quant_plugin *loom_quant_entry(void)
{
	return &float_plugin;
}
