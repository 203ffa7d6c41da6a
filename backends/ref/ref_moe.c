/*
 * The routed-expert FFN (ABI 1.6) in ref.so: row by row, the row's
 * experts (loom/moe.h's rule) one after another, each product through
 * ref_gemm and ref_glu, so an expert's output is exactly what gemm and
 * glu give for that expert's matrices; then the shared expert, if any.
 */
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "loom/moe.h"

/* One expert: matrices gate, up ([n_ff][n_embd]) and down, index e. */
struct expert {
	const struct loom_moe_weights *gate, *up, *down;
	int32_t e;
	int64_t n_ff;
	const float *bias[3]; /* gate, up, down: expert e's rows, or NULL */
};

/* y = w . x for one row: n outputs of k inputs, weight m's expert e. */
static int row_gemm(struct loom_backend_ctx *ctx, const struct loom_moe_weights *m, int32_t e,
		    int64_t n, int64_t k, const float *x, float *y)
{
	struct loom_gemm_args g = { .struct_size = sizeof(g), .w_type = m->type, .m = 1, .n = n,
				    .k = k, .w = m->w[e], .w_stride = m->row_bytes, .x = x,
				    .x_stride = k, .y = y, .y_stride = n };

	return ref_gemm(ctx, &g);
}

/* y[i] += b[i] for n values, when there is a bias (b non-NULL). */
static void add_bias(float *y, const float *b, int64_t n)
{
	for (int64_t i = 0; b && i < n; i++)
		y[i] = y[i] + b[i];
}

/* d = down(glu(gate . x + bg, up . x + bu)) + bd for one row x (the
 * biases of ABI 1.8 where the call has them); g, u: n_ff floats. */
static int expert_row(struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
		      const struct expert *ex, const float *x, float *g, float *u, float *d)
{
	int rc = row_gemm(ctx, ex->gate, ex->e, ex->n_ff, a->n_embd, x, g);

	if (!rc)
		rc = row_gemm(ctx, ex->up, ex->e, ex->n_ff, a->n_embd, x, u);
	if (rc)
		return rc;
	add_bias(g, ex->bias[0], ex->n_ff);
	add_bias(u, ex->bias[1], ex->n_ff);
	rc = ref_glu(ctx, (enum loom_glu_kind)a->glu, g, ex->n_ff, g, ex->n_ff, u, ex->n_ff, 1,
		     ex->n_ff);
	if (!rc)
		rc = row_gemm(ctx, ex->down, ex->e, a->n_embd, ex->n_ff, g, d);
	if (!rc)
		add_bias(d, ex->bias[2], a->n_embd);
	return rc;
}

/* y += sigmoid(x . shared_gate_inp) * shared expert(x), one row. */
static int shared_row(struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
		      const float *x, float *y, float *g, float *u, float *d)
{
	const struct expert ex = { &a->shared_gate, &a->shared_up, &a->shared_down, 0,
				   a->n_ff_shared, { NULL, NULL, NULL } };
	struct loom_gemm_args s = { .struct_size = sizeof(s), .w_type = LOOM_TYPE_F32, .m = 1,
				    .n = 1, .k = a->n_embd, .w = a->shared_gate_inp,
				    .w_stride = (size_t)a->n_embd * sizeof(float), .x = x,
				    .x_stride = a->n_embd, .y_stride = 1 };
	float logit, gate;
	int rc;

	s.y = &logit;
	rc = ref_gemm(ctx, &s);
	if (!rc)
		rc = expert_row(ctx, a, &ex, x, g, u, d);
	gate = loom_moe_sigmoid(logit);
	for (int64_t i = 0; i < a->n_embd && !rc; i++)
		y[i] = y[i] + gate * d[i];
	return rc;
}

int ref_moe(struct loom_backend_ctx *ctx, const struct loom_moe_args *a)
{
	int32_t ids[LOOM_MOE_MAX_USED];
	float w[LOOM_MOE_MAX_USED], *p, *g, *u, *d;
	int64_t ff;
	int rc;

	if (!ctx)
		return LOOM_ERR_INVALID;
	rc = loom_moe_check_args(a);
	if (rc || a->rows == 0)
		return rc;
	/* packed weights are never this backend's (it packs nothing) */
	if (a->gate.packed || a->up.packed || a->down.packed ||
	    (a->n_ff_shared && (a->shared_gate.packed || a->shared_up.packed ||
				a->shared_down.packed)))
		return LOOM_ERR_INVALID;
	ff = a->n_ff > a->n_ff_shared ? a->n_ff : a->n_ff_shared;
	p = malloc(sizeof(float) * (size_t)(a->n_expert + 2 * ff + a->n_embd));
	if (!p)
		return LOOM_ERR_NOMEM;
	g = p + a->n_expert;
	u = g + ff;
	d = u + ff;
	for (int64_t r = 0; r < a->rows && !rc; r++) {
		const float *x = a->x + r * a->x_stride;
		float *y = a->y + r * a->y_stride;

		loom_moe_route_as(a->gating, a->logits + r * a->logits_stride, a->n_expert,
				  a->n_used, a->norm != 0, p, ids, w);
		for (int64_t j = 0; j < a->n_used && !rc; j++) {
			const struct expert ex = {
				&a->gate, &a->up, &a->down, ids[j], a->n_ff,
				{ loom_moe_bias(a, a->gate_bias, ids[j], a->n_ff),
				  loom_moe_bias(a, a->up_bias, ids[j], a->n_ff),
				  loom_moe_bias(a, a->down_bias, ids[j], a->n_embd) } };

			rc = expert_row(ctx, a, &ex, x, g, u, d);
			for (int64_t i = 0; i < a->n_embd && !rc; i++)
				y[i] = j == 0 ? w[j] * d[i] : y[i] + w[j] * d[i];
		}
		if (!rc && a->n_ff_shared > 0)
			rc = shared_row(ctx, a, x, y, g, u, d);
	}
	free(p);
	return rc;
}
