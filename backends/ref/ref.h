/*
 * ref.so internals: the scalar reference backend.
 *
 * The oracle every other backend is tested against, so it is written to be
 * obviously right rather than fast: each operator is a short loop over the
 * shapes spelled out in loom/backend.h, in f32, with two exceptions where a
 * wider sum is free: the rmsnorm sum of squares and the softmax denominator
 * are accumulated in double. Dot products (gemm, attention scores) are
 * plain f32 sums in index order.
 *
 * Memory is host memory, so device addresses are host pointers.
 */
#ifndef LOOM_REF_H
#define LOOM_REF_H

#include "loom/backend.h"
#include "loom/backend_check.h"
#include "loom/kv_quant.h"

struct loom_backend_ctx {
	const struct loom_backend_host *host;
};

/* Operators (ref_ops.c). */
bool ref_supports(struct loom_backend_ctx *ctx, enum loom_op op, uint32_t type);
int ref_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a);
int ref_embed(struct loom_backend_ctx *ctx, float *out, const void *table,
	      uint32_t type, size_t row_bytes, int64_t n_rows, int64_t dim,
	      const int32_t *ids, int64_t n_ids);
int ref_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride,
		const float *x, int64_t x_stride, const float *w,
		int64_t rows, int64_t n, float eps);
int ref_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a);
int ref_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
	    int64_t out_stride, const float *gate, int64_t gate_stride,
	    const float *up, int64_t up_stride, int64_t rows, int64_t n);
int ref_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride,
	    const float *a, int64_t a_stride, const float *b, int64_t b_stride,
	    int64_t b_rows, int64_t rows, int64_t n);
int ref_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride,
	      int64_t rows, int64_t n, float s);
/* x = cap * tanh(x / cap), in place (ABI 1.2). */
int ref_softcap(struct loom_backend_ctx *ctx, float *x, int64_t stride,
		int64_t rows, int64_t n, float cap);
int ref_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a);
int ref_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a);
/* The routed-expert FFN (ABI 1.6, ref_moe.c). */
int ref_moe(struct loom_backend_ctx *ctx, const struct loom_moe_args *a);

/* Logs msg at error level through the host, when it has a log callback. */
void ref_log(struct loom_backend_ctx *ctx, const char *msg);

#endif /* LOOM_REF_H */
