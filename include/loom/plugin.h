/*
 * loom strategy-plugin ABI, version 1: quantization formats.
 *
 * A quantization plugin is a shared object exporting one symbol,
 * LOOM_QUANT_ENTRY ("loom_quant_entry"), that returns a `const struct
 * loom_quant_plugin` describing one family of weight formats (for example
 * q4_0 and q4_1). The host checks abi_major and struct_size before it reads
 * anything else. Plugins never link the core; they see only this header
 * (and loom/backend.h for the shared type ids and status codes).
 *
 * Block layouts are GGUF's, so data read from a GGUF file is used as is.
 */
#ifndef LOOM_PLUGIN_H
#define LOOM_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_PLUGIN_ABI_MAJOR 1
#define LOOM_PLUGIN_ABI_MINOR 1
#define LOOM_QUANT_ENTRY "loom_quant_entry"

/* One weight format. All functions are pure and thread-safe.
 *
 * struct_size says which fields exist: a plugin built at ABI 1.0 has
 * none of the appended ones. Every format of a plugin's table has the
 * same struct_size, and the host steps through the table by it, so a
 * table built against an older header still reads right. */
struct loom_quant_format {
	uint32_t struct_size;
	uint32_t type;        /* GGUF ggml_type id (enum loom_type) */
	const char *name;     /* GGUF's name: "q4_0", "f16", ... */
	uint32_t block_elems; /* values per block (1 for plain types) */
	uint32_t block_bytes; /* bytes per block */
	/* Required. dst[0..n) = values of the n / block_elems blocks at src.
	 * n must be a multiple of block_elems (else LOOM_ERR_INVALID). */
	int (*to_float)(const void *src, float *dst, int64_t n);
	/* Required. Quantizes n values (a multiple of block_elems) into
	 * n / block_elems blocks at dst. Formats whose GGUF reference
	 * quantizer is a plain rounding (q8_0, q4_0, ...) must match it byte
	 * for byte; for formats with an iterative reference (k-quants) the
	 * plugin documents its own method and bytes may differ. */
	int (*from_float)(const float *src, void *dst, int64_t n);
	/* ---- appended (ABI 1.1) ---- */
	/* Optional (NULL: none). As from_float, but each block's scales (and
	 * mins) are searched to minimize sum_i weights[i] * (src[i] -
	 * value_i)^2, value_i being what to_float gives back; weights[0..n)
	 * >= 0 (a weight tensor row's importance matrix, e.g. the mean of
	 * x_j^2 over calibration inputs), or NULL for all 1. Per block the
	 * result is never worse in that error than from_float's. Its bytes
	 * are its own (no reference quantizer to match). */
	int (*from_float_weighted)(const float *src, void *dst, int64_t n, const float *weights);
};

/* Whether f has a from_float_weighted (built at ABI 1.1 or later, and set). */
static inline int loom_format_has_weighted(const struct loom_quant_format *f)
{
	return f && f->struct_size >= offsetof(struct loom_quant_format, from_float_weighted) +
					     sizeof(f->from_float_weighted) &&
	       f->from_float_weighted != NULL;
}

struct loom_quant_plugin {
	/* ---- generation 1.0 ---- */
	uint32_t abi_major;
	uint32_t abi_minor;
	uint32_t struct_size; /* sizeof(struct loom_quant_plugin) when built */
	const char *name;     /* family name, e.g. "q4" */
	uint32_t n_formats;
	const struct loom_quant_format *formats;
	/* ---- end of generation 1.0; append new slots below ---- */
};

typedef const struct loom_quant_plugin *(*loom_quant_entry_fn)(void);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PLUGIN_H */
