/* A one-format quantization plugin for the loader tests: "fake32" stores
 * plain f32 under an otherwise unused type id (FAKE_QUANT_TYPE). Variants:
 *   FAKE_ABI_MAJOR=n   abi_major in the descriptor (default 1)
 *   FAKE_INCOMPLETE    from_float is NULL
 *   FAKE_WILD_FN       from_float points to nothing mapped
 *   FAKE_MANY          n_formats runs far past the format table
 *   FAKE_V1_0          built as at plugin ABI 1.0: format entries end at
 *                      from_float (a struct of that layout, declared here),
 *                      and a second format "fake32b" (type 38) follows, so
 *                      the host must step the table by struct_size
 */
#include <stdint.h>
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
#ifdef FAKE_WILD_FN
/* a function pointer to nothing mapped: refused, never called */
#define FAKE_FROM_FLOAT ((int (*)(const float *, void *, int64_t))(uintptr_t)0x10)
static int (*const fake_keep)(const float *, void *, int64_t) __attribute__((used)) =
	fake32_from_float;
#else
#define FAKE_FROM_FLOAT fake32_from_float
#endif
#else
#define FAKE_FROM_FLOAT NULL
#endif

#ifdef FAKE_V1_0
/* struct loom_quant_format as plugin.h declared it at ABI 1.0. */
struct format_v1_0 {
	uint32_t struct_size;
	uint32_t type;
	const char *name;
	uint32_t block_elems;
	uint32_t block_bytes;
	int (*to_float)(const void *src, float *dst, int64_t n);
	int (*from_float)(const float *src, void *dst, int64_t n);
};

static const struct format_v1_0 fake32_formats_v1_0[] = {
	{ sizeof(struct format_v1_0), FAKE_QUANT_TYPE, "fake32", 1, 4, fake32_to_float,
	  FAKE_FROM_FLOAT },
	{ sizeof(struct format_v1_0), FAKE_QUANT_TYPE - 1, "fake32b", 1, 4, fake32_to_float,
	  FAKE_FROM_FLOAT },
};
#define FAKE_TABLE ((const struct loom_quant_format *)fake32_formats_v1_0)
#define FAKE_N 2
#define FAKE_MINOR 0
#else
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
#define FAKE_TABLE fake32_formats
#ifdef FAKE_MANY
#define FAKE_N 1000000 /* far past the one entry the table has */
#else
#define FAKE_N 1
#endif
#define FAKE_MINOR LOOM_PLUGIN_ABI_MINOR
#endif

static const struct loom_quant_plugin fake32_plugin = {
	.abi_major = FAKE_ABI_MAJOR,
	.abi_minor = FAKE_MINOR,
	.struct_size = sizeof(struct loom_quant_plugin),
	.name = "fake32",
	.n_formats = FAKE_N,
	.formats = FAKE_TABLE,
};

LOOM_EXPORT const struct loom_quant_plugin *loom_quant_entry(void)
{
	return &fake32_plugin;
}
