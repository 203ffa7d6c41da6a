/*
 * loom strategy-plugin ABI, version 1: quantization strategies.
 *
 * (A header of its own, like loom/spec.h; the conventions are plugin.h's.)
 *
 * A quantization strategy decides which values a weight tensor's blocks
 * hold: round to nearest ("rtn"), an importance-weighted search of scales
 * ("imatrix"), activation-aware scaling ("awq"), error compensation with
 * the calibration Hessian ("gptq"). It does not define block layouts: the
 * target format's plugin (loom/plugin.h) does, and the strategy gets that
 * format's descriptor to encode with, or to check its own encoding against.
 *
 * A strategy is a shared object exporting one symbol,
 * LOOM_QSTRATEGY_ENTRY ("loom_qstrategy_entry"), that returns a `const
 * struct loom_qstrategy`. Generation 1.1 adds the optional input_scales
 * slot (activation-aware scaling, folded into the layer before). The host checks abi_major, struct_size and the
 * required slot (quantize) before it calls anything. Strategies never link
 * the core; they see only this header, loom/plugin.h and loom/backend.h.
 *
 * The contract of quantize(): fill t->out with t->rows rows of
 * t->cols / format->block_elems blocks each (row-major, exactly
 * t->out_size bytes, GGUF's block layout of t->type), from the f32 source
 * t->w. Each call is independent and quantize() must be thread-safe: the
 * host may quantize several tensors at once.
 */
#ifndef LOOM_QSTRATEGY_H
#define LOOM_QSTRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h" /* loom_status, enum loom_type */
#include "loom/plugin.h"  /* struct loom_quant_format */

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_QSTRATEGY_ABI_MAJOR 1
#define LOOM_QSTRATEGY_ABI_MINOR 1
#define LOOM_QSTRATEGY_ENTRY "loom_qstrategy_entry"

/* What a strategy needs from calibration (struct loom_qstrategy.needs). */
enum loom_qs_needs {
	/* Per input column j: the mean over calibration tokens of x_j^2,
	 * where x is the input the weight multiplies (t->imatrix, cols). */
	LOOM_QS_NEEDS_IMATRIX = 1u << 0,
	/* The mean over calibration tokens of x x^T (t->hessian, cols x cols,
	 * row-major, symmetric). */
	LOOM_QS_NEEDS_HESSIAN = 1u << 1,
};

/* Runs fn(arg, row_begin, row_end) over disjoint ranges covering
 * [0, rows) on the host's threads (-t N) and waits for all of them;
 * returns 0, or the first non-zero value an fn returned (the other ranges
 * may or may not have run). fn must be thread-safe across ranges. */
typedef int (*loom_qs_rows_fn)(void *arg, int64_t row_begin, int64_t row_end);

/* One tensor to quantize. The host owns every buffer; pointers are valid
 * until quantize() returns. */
struct loom_qstrategy_tensor {
	/* ---- generation 1.0 ---- */
	uint32_t struct_size; /* sizeof(struct loom_qstrategy_tensor) when built */
	uint32_t type;        /* target GGUF ggml_type id (enum loom_type) */
	const char *name;     /* GGUF tensor name, e.g. "blk.3.attn_v.weight" */
	int64_t rows;         /* output dimension (rows of w) */
	int64_t cols;         /* input dimension; a multiple of block_elems */
	const float *w;       /* [rows][cols] source weights */
	/* [cols] or NULL: LOOM_QS_NEEDS_IMATRIX data for this tensor. The
	 * host refuses a run with a strategy that needs it and no calibration
	 * file, but a file may lack some tensors (token_embd): then NULL,
	 * and the strategy treats every column as equally important. */
	const float *imatrix;
	/* [cols][cols] or NULL: LOOM_QS_NEEDS_HESSIAN data, as imatrix. */
	const float *hessian;
	/* The target format (format->type == type): its reference to_float
	 * and from_float (round to nearest), block_elems and block_bytes. */
	const struct loom_quant_format *format;
	void *out;            /* [rows][cols / block_elems] blocks */
	size_t out_size;      /* bytes at out: rows * cols / block_elems * block_bytes */
	/* The host's thread pool over rows (see loom_qs_rows_fn); never NULL.
	 * A strategy that works row by row passes its row loop here; one that
	 * first computes something per tensor (a Hessian's factor) does so,
	 * then calls it. */
	int (*for_rows)(const struct loom_qstrategy_tensor *t, loom_qs_rows_fn fn, void *arg);
	void *host;           /* the host's; for for_rows only */
	/* ---- end of generation 1.0; append new fields below ---- */
};

struct loom_qstrategy {
	/* ---- generation 1.0 ---- */
	uint32_t abi_major;
	uint32_t abi_minor;
	uint32_t struct_size; /* sizeof(struct loom_qstrategy) when built */
	const char *name;     /* "rtn", "imatrix", ... */
	/* enum loom_qs_needs bits: the calibration data it uses. The host
	 * loads only what is asked (a Hessian is cols^2 floats a tensor). */
	uint32_t needs;
	/* Required. Quantizes t (see the contract above). 0, or a negative
	 * loom_status with a one-line reason in msg (msg_len bytes of room),
	 * e.g. LOOM_ERR_UNSUPPORTED for a format the strategy does not
	 * handle; the host then names the tensor and stops. */
	int (*quantize)(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len);
	/* ---- generation 1.1 ---- */
	/* Optional (NULL: none). Chooses one scale per input channel,
	 * scales[cols], for a group of n tensors that multiply the same
	 * input (a layer's q, k and v; its ffn gate and up). The host then
	 * quantizes each member as W diag(s) (column j times s_j, with its
	 * imatrix divided by s_j^2 and its hessian by s_i s_j) and divides
	 * the input by s where it can fold that into the tensor before (the
	 * RMSNorm weight), so the model computes the same function in exact
	 * arithmetic. Called only for groups the host can fold; each
	 * member's out is NULL (nothing is written here). scales must be
	 * finite and > 0. 0, or a negative loom_status with msg. */
	int (*input_scales)(const struct loom_qstrategy_tensor *const *group, int n,
			    float *scales, char *msg, size_t msg_len);
	/* ---- end of generation 1.1; append new slots below ---- */
};

typedef const struct loom_qstrategy *(*loom_qstrategy_entry_fn)(void);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_QSTRATEGY_H */
