/*
 * q8_0: blocks of 32 values, 34 bytes: f16 scale d, then 32 int8 q.
 * value = q * d.
 *
 * from_float, as GGUF's reference quantizer: d = max|x| / 127 (float),
 * q = round(x / d) with halves away from zero (computed as x * (1/d) in
 * float), and d stored rounded to f16 afterwards.
 */
#include <math.h>

#include "quant_common.h"
#include "quant_search.h"

#define Q8_0_ELEMS 32
#define Q8_0_BYTES 34

static int q8_0_to_float(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int ret = quant_check_args(src, dst, n, Q8_0_ELEMS);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += Q8_0_ELEMS, b += Q8_0_BYTES) {
		float d = quant_ld_f16(b);

		for (int j = 0; j < Q8_0_ELEMS; j++)
			dst[i + j] = (float)(int8_t)b[2 + j] * d;
	}
	return LOOM_OK;
}

static void q8_0_block(const float *x, uint8_t *b)
{
	float amax = 0.0f;
	float d, id;

	for (int j = 0; j < Q8_0_ELEMS; j++) {
		float a = fabsf(x[j]);

		if (a > amax)
			amax = a;
	}
	d = amax / 127.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	quant_st_f16(b, d);
	for (int j = 0; j < Q8_0_ELEMS; j++) {
		float v = roundf(x[j] * id);

		b[2 + j] = (uint8_t)(int8_t)quant_trunc_clamp(v, -127, 127);
	}
}

static int q8_0_from_float(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int ret = quant_check_args(src, dst, n, Q8_0_ELEMS);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += Q8_0_ELEMS, b += Q8_0_BYTES)
		q8_0_block(src + i, b);
	return LOOM_OK;
}

/* from_float_weighted: quant_search.h's symmetric search on -127..127. */
static void q8_0_search(const float *x, const float *w, uint8_t *b)
{
	int q[Q8_0_ELEMS];
	float d = qs_f16(qs_symmetric(x, w, Q8_0_ELEMS, -127, 127, q));

	qs_symmetric_round(x, Q8_0_ELEMS, -127, 127, d, q);
	quant_st_f16(b, d);
	for (int j = 0; j < Q8_0_ELEMS; j++)
		b[2 + j] = (uint8_t)(int8_t)q[j];
}

static int q8_0_from_float_weighted(const float *src, void *dst, int64_t n, const float *w)
{
	return qs_blocks(src, dst, n, w, Q8_0_ELEMS, Q8_0_BYTES, q8_0_from_float, q8_0_search,
			 q8_0_to_float);
}

static const struct loom_quant_format q8_formats[] = {
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_Q8_0,
		.name = "q8_0",
		.block_elems = Q8_0_ELEMS,
		.block_bytes = Q8_0_BYTES,
		.to_float = q8_0_to_float,
		.from_float = q8_0_from_float,
		.from_float_weighted = q8_0_from_float_weighted,
	},
};

static const struct loom_quant_plugin q8_plugin = {
	.abi_major = LOOM_PLUGIN_ABI_MAJOR,
	.abi_minor = LOOM_PLUGIN_ABI_MINOR,
	.struct_size = sizeof(struct loom_quant_plugin),
	.name = "q8",
	.n_formats = sizeof(q8_formats) / sizeof(q8_formats[0]),
	.formats = q8_formats,
};

LOOM_EXPORT const struct loom_quant_plugin *loom_quant_entry(void)
{
	return &q8_plugin;
}
