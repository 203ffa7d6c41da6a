/*
 * The moe node. With the backend's slot (ABI 1.6) one call does it all;
 * without it (or when the slot answers LOOM_ERR_UNSUPPORTED) the host
 * runs the same arithmetic through the required operators:
 *   - the router logits come down, and loom/moe.h routes each row (the
 *     rule every backend's slot uses, so the routes are the same bits);
 *   - for each slot j of the top-k and each expert e, the rows whose j-th
 *     choice is e are copied together, run through e's gate, up, glu and
 *     down gemms, scaled by their weights and written (j = 0) or added
 *     (j > 0) to their rows of y: so each row's sum runs in j order from
 *     w_0 * d_0, as the slot's contract says;
 *   - a shared expert (Qwen2-MoE) runs over all rows, its gate
 *     (sigmoid(x . g)) computed on the host from a downloaded gemm.
 * That is many small calls (a few per routed row), which is why a step
 * that needs it runs outside step regions; it exists so that a backend
 * without the slot gives the right output, not to be fast.
 */
#include <stdlib.h>
#include <string.h>

#include "model/moe_exec.h"
#include "loom/moe.h"
#include "util.h"

int loom_moe_scratch_alloc(struct loom_moe_scratch *s, const struct loom_hparams *hp,
			   int64_t max_rows)
{
	size_t r = (size_t)max_rows, e = (size_t)hp->n_expert, k = (size_t)hp->n_expert_used;

	memset(s, 0, sizeof(*s));
	s->max_rows = max_rows;
	if (!hp->arch->moe)
		return 0;
	/* max_rows and n_expert are bounded (executor limits, LOOM_MOE_MAX_EXPERTS) */
	s->logits = malloc(sizeof(float) * r * e);
	s->w = malloc(sizeof(float) * r * k);
	s->p = malloc(sizeof(float) * (e > r ? e : r));
	s->ids = malloc(sizeof(int32_t) * r * k);
	s->rows = malloc(sizeof(int32_t) * r);
	return s->logits && s->w && s->p && s->ids && s->rows ? 0 : -1;
}

void loom_moe_scratch_free(struct loom_moe_scratch *s)
{
	free(s->logits);
	free(s->w);
	free(s->p);
	free(s->ids);
	free(s->rows);
	memset(s, 0, sizeof(*s));
}

static void set_weights(struct loom_moe_weights *mw, const struct loom_experts *x)
{
	mw->type = x->w[0].type;
	mw->packed = x->w[0].packed;
	mw->row_bytes = x->w[0].row_bytes;
	mw->w = x->data;
}

/* The slot's weight arguments of one shared-expert matrix. */
static void set_shared(struct loom_moe_weights *mw, const struct loom_weight *w,
		       const void *const *addr)
{
	mw->type = w->type;
	mw->packed = w->packed;
	mw->row_bytes = w->row_bytes;
	mw->w = addr;
}

static void fill_args(const struct loom_model *m, const struct loom_layer *L,
		      struct loom_moe_args *a)
{
	const struct loom_hparams *hp = &m->hp;
	const struct loom_shard *sh = &m->shard;

	a->struct_size = sizeof(*a);
	a->glu = hp->arch->glu;
	a->gating = hp->arch->moe_gating;
	a->norm = hp->expert_norm;
	a->n_embd = hp->n_embd;
	a->n_ff = sh->fx_hi - sh->fx_lo; /* this rank's columns (shard.h) */
	a->n_expert = hp->n_expert;
	a->n_used = hp->n_expert_used;
	set_weights(&a->gate, &L->gate_exps);
	set_weights(&a->up, &L->up_exps);
	set_weights(&a->down, &L->down_exps);
	a->gate_bias = L->gate_exps_b.data;
	a->up_bias = L->up_exps_b.data;
	/* split experts: the ranks' outputs are summed, so one adds the bias */
	a->down_bias = sh->moe_split && sh->tp_rank ? NULL : L->down_exps_b.data;
	if (hp->n_ff_shexp > 0) {
		a->n_ff_shared = sh->fs_hi - sh->fs_lo;
		a->shared_gate_inp = L->gate_inp_shexp.data;
		set_shared(&a->shared_gate, &L->w_gate, &L->shexp_data[0]);
		set_shared(&a->shared_up, &L->w_up, &L->shexp_data[1]);
		set_shared(&a->shared_down, &L->w_down, &L->shexp_data[2]);
	}
}

/* y = w . x for n rows (gemm over a weight's matrix). */
static int gemm(const struct loom_backend *be, const struct loom_moe_weights *mw, int64_t e,
		int64_t n_out, int64_t k, int64_t rows, const float *x, int64_t x_stride,
		float *y, int64_t y_stride)
{
	struct loom_gemm_args g = { .struct_size = sizeof(g), .w_type = mw->type, .m = rows,
				    .n = n_out, .k = k, .w = mw->w[e], .w_stride = mw->row_bytes,
				    .x = x, .x_stride = x_stride, .y = y, .y_stride = y_stride,
				    .w_packed = mw->packed };

	return be->ops->gemm(be->ctx, &g);
}

/* y[r] += b for n rows (stride y_w), when there is a bias b (NULL: none). */
static int add_bias(const struct loom_backend *be, float *y, int64_t y_w, const float *b,
		    int64_t n, int64_t width)
{
	return b ? be->ops->add(be->ctx, y, y_w, y, y_w, b, width, 1, n, width) : 0;
}

/* d[0..n) = down(glu(gate . gx + bg, up . gx + bu)) + bd for the n rows
 * gathered in gx (the biases of expert e, when bias; gpt-oss). */
static int expert_rows(const struct loom_backend *be, const struct loom_moe_args *a,
		       const struct loom_moe_weights *w3, int64_t e, int64_t ff, int64_t n,
		       const struct loom_moe_scratch *s, const float *gx, int64_t gx_w, bool bias)
{
	int rc = gemm(be, &w3[0], e, ff, a->n_embd, n, gx, gx_w, s->gate, s->ff_w);

	if (!rc)
		rc = gemm(be, &w3[1], e, ff, a->n_embd, n, gx, gx_w, s->up, s->ff_w);
	if (!rc && bias)
		rc = add_bias(be, s->gate, s->ff_w, loom_moe_bias(a, a->gate_bias, e, ff), n, ff);
	if (!rc && bias)
		rc = add_bias(be, s->up, s->ff_w, loom_moe_bias(a, a->up_bias, e, ff), n, ff);
	if (!rc)
		rc = be->ops->glu(be->ctx, (enum loom_glu_kind)a->glu, s->gate, s->ff_w, s->gate,
				  s->ff_w, s->up, s->ff_w, n, ff);
	if (!rc)
		rc = gemm(be, &w3[2], e, a->n_embd, ff, n, s->gate, s->ff_w, s->d, s->d_w);
	if (!rc && bias)
		rc = add_bias(be, s->d, s->d_w, loom_moe_bias(a, a->down_bias, e, a->n_embd), n,
			      a->n_embd);
	return rc;
}

/* Row i of d times `scale`, written to (first) or added to y's row r. */
static int combine_row(const struct loom_backend *be, const struct loom_moe_args *a,
		       const struct loom_moe_scratch *s, int64_t i, int32_t r, float scale,
		       bool first)
{
	float *d = s->d + i * s->d_w, *y = a->y + (int64_t)r * a->y_stride;
	int rc = be->ops->scale(be->ctx, d, s->d_w, 1, a->n_embd, scale);

	if (rc)
		return rc;
	if (first)
		return be->ops->copy(be->ctx, y, d, (size_t)a->n_embd * sizeof(float));
	return be->ops->add(be->ctx, y, a->y_stride, y, a->y_stride, d, s->d_w, 1, 1, a->n_embd);
}

/* The rows whose j-th choice is expert e, through e. */
static int run_group(const struct loom_backend *be, const struct loom_moe_args *a,
		     const struct loom_moe_scratch *s, int64_t j, int32_t e)
{
	const struct loom_moe_weights w3[3] = { a->gate, a->up, a->down };
	int64_t n = 0, k = a->n_used;
	int rc = 0;

	for (int64_t r = 0; r < a->rows; r++)
		if (s->ids[r * k + j] == e)
			s->rows[n++] = (int32_t)r;
	for (int64_t i = 0; i < n && !rc; i++)
		rc = be->ops->copy(be->ctx, s->gx + i * s->gx_w, a->x + (int64_t)s->rows[i] * a->x_stride,
				   (size_t)a->n_embd * sizeof(float));
	if (n == 0 || rc)
		return rc;
	rc = expert_rows(be, a, w3, e, a->n_ff, n, s, s->gx, s->gx_w, true);
	for (int64_t i = 0; i < n && !rc; i++)
		rc = combine_row(be, a, s, i, s->rows[i], s->w[(int64_t)s->rows[i] * k + j], j == 0);
	return rc;
}

/* y += sigmoid(x . g) * shared expert(x), over all rows. */
static int run_shared(const struct loom_backend *be, const struct loom_moe_args *a,
		      const struct loom_moe_scratch *s)
{
	const struct loom_moe_weights w3[3] = { a->shared_gate, a->shared_up, a->shared_down };
	const void *gaddr[1] = { a->shared_gate_inp };
	const struct loom_moe_weights g = { .type = LOOM_TYPE_F32, .w = gaddr,
					    .row_bytes = (size_t)a->n_embd * sizeof(float) };
	int rc = gemm(be, &g, 0, 1, a->n_embd, a->rows, a->x, a->x_stride, s->gx, 1);

	if (!rc)
		rc = be->ops->download(be->ctx, s->p, s->gx, (size_t)a->rows * sizeof(float));
	if (!rc)
		rc = be->ops->synchronize(be->ctx);
	if (!rc)
		rc = expert_rows(be, a, w3, 0, a->n_ff_shared, a->rows, s, a->x, a->x_stride,
				 false);
	for (int64_t r = 0; r < a->rows && !rc; r++)
		rc = combine_row(be, a, s, r, (int32_t)r, loom_moe_sigmoid(s->p[r]), false);
	return rc;
}

static int fallback(const struct loom_backend *be, const struct loom_moe_args *a,
		    struct loom_moe_scratch *s)
{
	int64_t k = a->n_used;
	int rc;

	if (a->rows > s->max_rows || a->n_ff > s->ff_w || a->n_ff_shared > s->ff_w)
		return LOOM_ERR_INVALID;
	rc = be->ops->download(be->ctx, s->logits, a->logits,
			       (size_t)a->rows * (size_t)a->n_expert * sizeof(float));
	if (!rc)
		rc = be->ops->synchronize(be->ctx);
	for (int64_t r = 0; r < a->rows && !rc; r++)
		loom_moe_route_as(a->gating, s->logits + r * a->n_expert, a->n_expert, k,
				  a->norm != 0, s->p, s->ids + r * k, s->w + r * k);
	for (int64_t j = 0; j < k && !rc; j++)
		for (int32_t e = 0; e < a->n_expert && !rc; e++)
			rc = run_group(be, a, s, j, e);
	if (!rc && a->n_ff_shared > 0)
		rc = run_shared(be, a, s);
	return rc;
}

int loom_moe_run(const struct loom_model *m, int32_t layer, int64_t rows, const float *x,
		 int64_t x_stride, const float *logits, int64_t logits_stride, float *y,
		 int64_t y_stride, struct loom_moe_scratch *s, bool in_region)
{
	const struct loom_backend *be = m->be;
	struct loom_moe_args a = { 0 };
	int rc;

	fill_args(m, &m->layers[layer], &a);
	a.rows = rows;
	a.x = x, a.x_stride = x_stride;
	a.logits = logits, a.logits_stride = logits_stride;
	a.y = y, a.y_stride = y_stride;
	if (loom_backend_has_moe(be)) {
		rc = be->ops->moe(be->ctx, &a);
		if (rc != LOOM_ERR_UNSUPPORTED || in_region)
			return rc;
	}
	/* the fallback reads logits the ops before wrote: logits must be
	 * contiguous rows of n_expert, as the executor's are */
	if (logits_stride != a.n_expert)
		return LOOM_ERR_INVALID;
	return fallback(be, &a, s);
}
