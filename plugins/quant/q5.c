/*
 * 5-bit formats, blocks of 32 values. Nibble byte j holds the low 4 bits of
 * element j (low half) and of element j + 16 (high half); bit j of the
 * 32-bit little-endian word qh is bit 4 of element j.
 *
 * q5_0, 22 bytes: f16 d, qh, 16 nibble bytes; value = (q - 16) * d.
 * q5_1, 24 bytes: f16 d, f16 m, qh, 16 nibble bytes; value = q * d + m.
 *
 * from_float, as GGUF's reference quantizer (float arithmetic, scales
 * rounded to f16 only when stored):
 *   q5_0: max = the value of largest magnitude (first one on ties),
 *         d = max / -16, q = min(31, trunc(x * (1/d) + 16.5)).
 *   q5_1: d = (max - min) / 31, m = min,
 *         q = min(31, trunc((x - min) * (1/d) + 0.5)).
 *
 * from_float_weighted: quant_search.h's search (q5_0 symmetric on
 * -16..15, q5_1 affine on 0..31), q rounded again for the f16 scales.
 */
#include <float.h>
#include <math.h>

#include "quant_common.h"
#include "quant_search.h"

#define QK5 32
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24

/* Unpacks qh (4 bytes) and the 16 nibble bytes that follow into q[0..32). */
static void q5_unpack(const uint8_t *qh, int q[QK5])
{
	const uint8_t *qs = qh + 4;

	for (int j = 0; j < QK5 / 2; j++) {
		q[j] = qs[j] & 0x0f;
		q[j + QK5 / 2] = qs[j] >> 4;
	}
	for (int j = 0; j < QK5; j++)
		q[j] |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
}

static void q5_pack(const int q[QK5], uint8_t *qh)
{
	uint8_t *qs = qh + 4;

	for (int j = 0; j < QK5 / 2; j++)
		qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + QK5 / 2] & 0x0f) << 4));
	for (int k = 0; k < 4; k++)
		qh[k] = 0;
	for (int j = 0; j < QK5; j++)
		qh[j / 8] |= (uint8_t)(((q[j] >> 4) & 1) << (j % 8));
}

static int q5_0_to_float(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int ret = quant_check_args(src, dst, n, QK5);
	int q[QK5];

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK5, b += Q5_0_BYTES) {
		float d = quant_ld_f16(b);

		q5_unpack(b + 2, q);
		for (int j = 0; j < QK5; j++)
			dst[i + j] = (float)(q[j] - 16) * d;
	}
	return LOOM_OK;
}

static void q5_0_block(const float *x, uint8_t *b)
{
	float amax = 0.0f, max = 0.0f;
	float d, id;
	int q[QK5];

	for (int j = 0; j < QK5; j++) {
		if (fabsf(x[j]) > amax) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	d = max / -16.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	for (int j = 0; j < QK5; j++)
		q[j] = quant_trunc_clamp(x[j] * id + 16.5f, 0, 31);
	quant_st_f16(b, d);
	q5_pack(q, b + 2);
}

static int q5_0_from_float(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int ret = quant_check_args(src, dst, n, QK5);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK5, b += Q5_0_BYTES)
		q5_0_block(src + i, b);
	return LOOM_OK;
}

static int q5_1_to_float(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int ret = quant_check_args(src, dst, n, QK5);
	int q[QK5];

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK5, b += Q5_1_BYTES) {
		float d = quant_ld_f16(b);
		float m = quant_ld_f16(b + 2);

		q5_unpack(b + 4, q);
		for (int j = 0; j < QK5; j++)
			dst[i + j] = (float)q[j] * d + m; /* q * d is exact */
	}
	return LOOM_OK;
}

static void q5_1_block(const float *x, uint8_t *b)
{
	float min = FLT_MAX, max = -FLT_MAX;
	float d, id;
	int q[QK5];

	for (int j = 0; j < QK5; j++) {
		if (x[j] < min)
			min = x[j];
		if (x[j] > max)
			max = x[j];
	}
	d = (max - min) / 31.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	for (int j = 0; j < QK5; j++)
		q[j] = quant_trunc_clamp((x[j] - min) * id + 0.5f, 0, 31);
	quant_st_f16(b, d);
	quant_st_f16(b + 2, min);
	q5_pack(q, b + 4);
}

static int q5_1_from_float(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int ret = quant_check_args(src, dst, n, QK5);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK5, b += Q5_1_BYTES)
		q5_1_block(src + i, b);
	return LOOM_OK;
}

/* ---- from_float_weighted (quant_search.h) ---- */

static void q5_0_search(const float *x, const float *w, uint8_t *b)
{
	int q[QK5];
	float d = qs_f16(qs_symmetric(x, w, QK5, -16, 15, q));

	qs_symmetric_round(x, QK5, -16, 15, d, q);
	for (int j = 0; j < QK5; j++)
		q[j] += 16;
	quant_st_f16(b, d);
	q5_pack(q, b + 2);
}

static int q5_0_from_float_weighted(const float *src, void *dst, int64_t n, const float *w)
{
	return qs_blocks(src, dst, n, w, QK5, Q5_0_BYTES, q5_0_from_float, q5_0_search,
			 q5_0_to_float);
}

static void q5_1_search(const float *x, const float *w, uint8_t *b)
{
	int q[QK5];
	float d, m;

	qs_affine(x, w, QK5, 31, false, q, &d, &m);
	d = qs_f16(d);
	m = qs_f16(m);
	qs_affine_round(x, QK5, 31, d, m, q);
	quant_st_f16(b, d);
	quant_st_f16(b + 2, m);
	q5_pack(q, b + 4);
}

static int q5_1_from_float_weighted(const float *src, void *dst, int64_t n, const float *w)
{
	return qs_blocks(src, dst, n, w, QK5, Q5_1_BYTES, q5_1_from_float, q5_1_search,
			 q5_1_to_float);
}

static const struct loom_quant_format q5_formats[] = {
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_Q5_0,
		.name = "q5_0",
		.block_elems = QK5,
		.block_bytes = Q5_0_BYTES,
		.to_float = q5_0_to_float,
		.from_float = q5_0_from_float,
		.from_float_weighted = q5_0_from_float_weighted,
	},
	{
		.struct_size = sizeof(struct loom_quant_format),
		.type = LOOM_TYPE_Q5_1,
		.name = "q5_1",
		.block_elems = QK5,
		.block_bytes = Q5_1_BYTES,
		.to_float = q5_1_to_float,
		.from_float = q5_1_from_float,
		.from_float_weighted = q5_1_from_float_weighted,
	},
};

static const struct loom_quant_plugin q5_plugin = {
	.abi_major = LOOM_PLUGIN_ABI_MAJOR,
	.abi_minor = LOOM_PLUGIN_ABI_MINOR,
	.struct_size = sizeof(struct loom_quant_plugin),
	.name = "q5",
	.n_formats = sizeof(q5_formats) / sizeof(q5_formats[0]),
	.formats = q5_formats,
};

LOOM_EXPORT const struct loom_quant_plugin *loom_quant_entry(void)
{
	return &q5_plugin;
}
