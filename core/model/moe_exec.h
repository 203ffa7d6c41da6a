/* The executor's moe node (internal): the backend's moe slot (ABI 1.6),
 * or the host's fallback through gemm, glu, scale, add and copy. */
#ifndef LOOM_MOE_EXEC_H
#define LOOM_MOE_EXEC_H

#include <stdint.h>

#include "model/model.h"

/* Device buffers and host scratch the fallback uses (struct loom_exec
 * holds them); widths in floats, rows up to max_rows. */
struct loom_moe_scratch {
	float *gx, *gate, *up, *d; /* device: [rows][n_embd], [rows][ff] x2, [rows][n_embd] */
	int64_t gx_w, ff_w, d_w;
	int64_t max_rows;
	/* host: logits [max_rows][n_expert], the routes [max_rows][n_used],
	 * softmax scratch [n_expert], a group's rows [max_rows] */
	float *logits, *w, *p;
	int32_t *ids, *rows;
};

/* Host scratch for a model's experts (nothing for a dense model). */
int loom_moe_scratch_alloc(struct loom_moe_scratch *s, const struct loom_hparams *hp,
			   int64_t max_rows);
void loom_moe_scratch_free(struct loom_moe_scratch *s);

/* y = layer's routed FFN of x (rows, logits from its router). in_region:
 * the call is inside a step region, where the fallback cannot run. */
int loom_moe_run(const struct loom_model *m, int32_t layer, int64_t rows, const float *x,
		 int64_t x_stride, const float *logits, int64_t logits_stride, float *y,
		 int64_t y_stride, struct loom_moe_scratch *s, bool in_region);

#endif
