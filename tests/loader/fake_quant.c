/* A one-format quantization plugin for the loader tests: "fake32" stores
 * plain f32 under an otherwise unused type id (FAKE_QUANT_TYPE). Variants:
 *   FAKE_ABI_MAJOR=n   abi_major in the descriptor (default 1)
 *   FAKE_INCOMPLETE    from_float is NULL
 */
#include <string.h>

#include "loom/plugin.h"

#ifndef FAKE_ABI_MAJOR
#define FAKE_ABI_MAJOR LOOM_PLUGIN_ABI_MAJOR
#endif
#define FAKE_QUANT_TYPE 39

static int fake32_to_float(const void *src, float *dst, int64_t n)
{
	if (n < 0)
		return LOOM_ERR_INVALID;
	memcpy(dst, src, (size_t)n * sizeof(float));
	return LOOM_OK;
}

#ifndef FAKE_INCOMPLETE
static int fake32_from_float(const float *src, void *dst, int64_t n)
{
	if (n < 0)
		return LOOM_ERR_INVALID;
	memcpy(dst, src, (size_t)n * sizeof(float));
	return LOOM_OK;
}
#define FAKE_FROM_FLOAT fake32_from_float
#else
#define FAKE_FROM_FLOAT NULL
#endif

static const struct loom_quant_format fake32_formats[] = {
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = FAKE_QUANT_TYPE,
		.name = "fake32",
		.block_elems = 1,
		.block_bytes = 4,
		.to_float = fake32_to_float,
		.from_float = FAKE_FROM_FLOAT,
	},
};

static const struct loom_quant_plugin fake32_plugin = {
	.abi_major = FAKE_ABI_MAJOR,
	.abi_minor = LOOM_PLUGIN_ABI_MINOR,
	.struct_size = sizeof(struct loom_quant_plugin),
	.name = "fake32",
	.n_formats = 1,
	.formats = fake32_formats,
};

LOOM_EXPORT const struct loom_quant_plugin *loom_quant_entry(void)
{
	return &fake32_plugin;
}
