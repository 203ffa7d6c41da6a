/*
 * 4-bit formats, blocks of 32 values. Nibble byte j holds element j in its
 * low half and element j + 16 in its high half.
 *
 * q4_0, 18 bytes: f16 d, 16 nibble bytes; value = (q - 8) * d.
 * q4_1, 20 bytes: f16 d, f16 m, 16 nibble bytes; value = q * d + m.
 *
 * from_float, as GGUF's reference quantizer (all arithmetic in float, the
 * scales rounded to f16 only when stored):
 *   q4_0: max = the value of largest magnitude (first one on ties),
 *         d = max / -8, q = min(15, trunc(x * (1/d) + 8.5)).
 *   q4_1: d = (max - min) / 15, m = min,
 *         q = min(15, trunc((x - min) * (1/d) + 0.5)).
 *
 * from_float_weighted: quant_search.h's search (q4_0 symmetric on
 * -8..7, q4_1 affine on 0..15), q rounded again for the f16 scales.
 */
#include <float.h>
#include <math.h>

#include "quant_common.h"
#include "quant_search.h"

#define QK4 32
#define Q4_0_BYTES 18
#define Q4_1_BYTES 20

/* Unpacks the 16 nibble bytes at qs into q[0..32). */
static void q4_unpack(const uint8_t *qs, int q[QK4])
{
	for (int j = 0; j < QK4 / 2; j++) {
		q[j] = qs[j] & 0x0f;
		q[j + QK4 / 2] = qs[j] >> 4;
	}
}

static void q4_pack(const int q[QK4], uint8_t *qs)
{
	for (int j = 0; j < QK4 / 2; j++)
		qs[j] = (uint8_t)(q[j] | (q[j + QK4 / 2] << 4));
}

static int q4_0_to_float(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int ret = quant_check_args(src, dst, n, QK4);
	int q[QK4];

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK4, b += Q4_0_BYTES) {
		float d = quant_ld_f16(b);

		q4_unpack(b + 2, q);
		for (int j = 0; j < QK4; j++)
			dst[i + j] = (float)(q[j] - 8) * d;
	}
	return LOOM_OK;
}

static void q4_0_block(const float *x, uint8_t *b)
{
	float amax = 0.0f, max = 0.0f;
	float d, id;
	int q[QK4];

	for (int j = 0; j < QK4; j++) {
		if (fabsf(x[j]) > amax) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	d = max / -8.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	for (int j = 0; j < QK4; j++)
		q[j] = quant_trunc_clamp(x[j] * id + 8.5f, 0, 15);
	quant_st_f16(b, d);
	q4_pack(q, b + 2);
}

static int q4_0_from_float(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int ret = quant_check_args(src, dst, n, QK4);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK4, b += Q4_0_BYTES)
		q4_0_block(src + i, b);
	return LOOM_OK;
}

static int q4_1_to_float(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int ret = quant_check_args(src, dst, n, QK4);
	int q[QK4];

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK4, b += Q4_1_BYTES) {
		float d = quant_ld_f16(b);
		float m = quant_ld_f16(b + 2);

		q4_unpack(b + 4, q);
		for (int j = 0; j < QK4; j++)
			dst[i + j] = (float)q[j] * d + m; /* q * d is exact */
	}
	return LOOM_OK;
}

static void q4_1_block(const float *x, uint8_t *b)
{
	float min = FLT_MAX, max = -FLT_MAX;
	float d, id;
	int q[QK4];

	for (int j = 0; j < QK4; j++) {
		if (x[j] < min)
			min = x[j];
		if (x[j] > max)
			max = x[j];
	}
	d = (max - min) / 15.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	for (int j = 0; j < QK4; j++)
		q[j] = quant_trunc_clamp((x[j] - min) * id + 0.5f, 0, 15);
	quant_st_f16(b, d);
	quant_st_f16(b + 2, min);
	q4_pack(q, b + 4);
}

static int q4_1_from_float(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int ret = quant_check_args(src, dst, n, QK4);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK4, b += Q4_1_BYTES)
		q4_1_block(src + i, b);
	return LOOM_OK;
}

/* ---- from_float_weighted (quant_search.h) ---- */

static void q4_0_search(const float *x, const float *w, uint8_t *b)
{
	int q[QK4];
	float d = qs_f16(qs_symmetric(x, w, QK4, -8, 7, q));

	qs_symmetric_round(x, QK4, -8, 7, d, q);
	for (int j = 0; j < QK4; j++)
		q[j] += 8;
	quant_st_f16(b, d);
	q4_pack(q, b + 2);
}

static int q4_0_from_float_weighted(const float *src, void *dst, int64_t n, const float *w)
{
	return qs_blocks(src, dst, n, w, QK4, Q4_0_BYTES, q4_0_from_float, q4_0_search,
			 q4_0_to_float);
}

static void q4_1_search(const float *x, const float *w, uint8_t *b)
{
	int q[QK4];
	float d, m;

	qs_affine(x, w, QK4, 15, false, q, &d, &m);
	d = qs_f16(d);
	m = qs_f16(m);
	qs_affine_round(x, QK4, 15, d, m, q);
	quant_st_f16(b, d);
	quant_st_f16(b + 2, m);
	q4_pack(q, b + 4);
}

static int q4_1_from_float_weighted(const float *src, void *dst, int64_t n, const float *w)
{
	return qs_blocks(src, dst, n, w, QK4, Q4_1_BYTES, q4_1_from_float, q4_1_search,
			 q4_1_to_float);
}

static const struct loom_quant_format q4_formats[] = {
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_Q4_0,
		.name = "q4_0",
		.block_elems = QK4,
		.block_bytes = Q4_0_BYTES,
		.to_float = q4_0_to_float,
		.from_float = q4_0_from_float,
		.from_float_weighted = q4_0_from_float_weighted,
	},
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_Q4_1,
		.name = "q4_1",
		.block_elems = QK4,
		.block_bytes = Q4_1_BYTES,
		.to_float = q4_1_to_float,
		.from_float = q4_1_from_float,
		.from_float_weighted = q4_1_from_float_weighted,
	},
};

static const struct loom_quant_plugin q4_plugin = {
	.abi_major = LOOM_PLUGIN_ABI_MAJOR,
	.abi_minor = LOOM_PLUGIN_ABI_MINOR,
	.struct_size = sizeof(struct loom_quant_plugin),
	.name = "q4",
	.n_formats = sizeof(q4_formats) / sizeof(q4_formats[0]),
	.formats = q4_formats,
};

LOOM_EXPORT const struct loom_quant_plugin *loom_quant_entry(void)
{
	return &q4_plugin;
}
