/*
 * The routed-expert FFN (ABI 1.6) in cpu.so.
 *
 * Every row is routed first (loom/moe.h: the same ids and weights as
 * ref.so and the host's fallback). Then the (row, choice) pairs are
 * grouped by expert, and each expert that any row chose runs once: its
 * rows are gathered together and go through cpu_gemm (gate, up), cpu_glu
 * and cpu_gemm (down), so everything the backend knows for a dense FFN
 * serves the experts too: a decode step streams only the chosen experts'
 * weights through the GEMV kernels (packed integer kernels in fast mode,
 * each expert packed on its own by weight_pack), and a prefill step runs
 * each expert's rows as one GEMM (qgemm or BLAS). Each expert's output
 * row lands in its pair's place, and a row's outputs are then added in
 * choice order (from w_0 * d_0), so the result does not depend on how
 * the rows were grouped. With LOOM_BACKEND_BATCH_INVARIANT every gemm
 * gives each row what it gives that row alone, so a row's output does
 * not depend on the other rows of the step either.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "loom/moe.h"

/* The float and int32 scratch of one call (grown in ctx, kept). */
struct moe_plan {
	float *x, *g, *u, *d, *out, *w, *p, *sg;
	int32_t *ids, *order, *start;
};

/* Carves the call's scratch; false when its size overflows or memory is short. */
static bool plan_scratch(struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
			 struct moe_plan *pl)
{
	size_t rows = (size_t)a->rows, k = (size_t)a->n_used, e = (size_t)a->n_expert;
	size_t embd = (size_t)a->n_embd, pairs, ff, nf, ni, t;
	size_t gu = rows > k ? rows : k; /* gate/up rows: a decode row's k experts' */

	ff = (size_t)(a->n_ff > a->n_ff_shared ? a->n_ff : a->n_ff_shared);
	if (__builtin_mul_overflow(rows, k, &pairs) || __builtin_mul_overflow(rows, embd, &t) ||
	    __builtin_mul_overflow(gu, ff, &nf) || __builtin_mul_overflow(nf, (size_t)2, &nf) ||
	    __builtin_add_overflow(nf, 2 * t, &nf) || __builtin_mul_overflow(pairs, embd, &t) ||
	    __builtin_add_overflow(nf, t, &nf) || __builtin_add_overflow(nf, pairs + e + rows, &nf))
		return false;
	ni = 2 * pairs + e + 1;
	if (nf > ctx->moe_f_cap) {
		float *p = realloc(ctx->moe_f, nf * sizeof(float));

		if (!p || nf > SIZE_MAX / sizeof(float))
			return false;
		ctx->moe_f = p;
		ctx->moe_f_cap = nf;
	}
	if (ni > ctx->moe_i_cap) {
		int32_t *p = realloc(ctx->moe_i, ni * sizeof(int32_t));

		if (!p)
			return false;
		ctx->moe_i = p;
		ctx->moe_i_cap = ni;
	}
	pl->x = ctx->moe_f;
	pl->g = pl->x + rows * embd;
	pl->u = pl->g + gu * ff;
	pl->d = pl->u + gu * ff;
	pl->out = pl->d + rows * embd;
	pl->w = pl->out + pairs * embd;
	pl->p = pl->w + pairs;
	pl->sg = pl->p + e;
	pl->ids = ctx->moe_i;
	pl->order = pl->ids + pairs;
	pl->start = pl->order + pairs;
	return true;
}

/* The pairs r * n_used + j sorted by expert (then by pair): order[],
 * expert e's pairs at order[start[e] .. start[e + 1]). */
static void group_pairs(const struct loom_moe_args *a, struct moe_plan *pl)
{
	int64_t pairs = a->rows * a->n_used;

	memset(pl->start, 0, sizeof(int32_t) * (size_t)(a->n_expert + 1));
	for (int64_t i = 0; i < pairs; i++)
		pl->start[pl->ids[i] + 1]++;
	for (int64_t e = 0; e < a->n_expert; e++)
		pl->start[e + 1] += pl->start[e];
	/* start[e] walks to e's end as its pairs are placed ... */
	for (int64_t i = 0; i < pairs; i++)
		pl->order[pl->start[pl->ids[i]]++] = (int32_t)i;
	/* ... which is e + 1's start: shift back */
	for (int64_t e = a->n_expert; e > 0; e--)
		pl->start[e] = pl->start[e - 1];
	pl->start[0] = 0;
}

static int run_gemm(struct loom_backend_ctx *ctx, const struct loom_moe_weights *mw, int64_t e,
		    int64_t n, int64_t k, int64_t m, const float *x, int64_t x_stride, float *y,
		    int64_t y_stride)
{
	struct loom_gemm_args g = { .struct_size = sizeof(g), .w_type = mw->type, .m = m, .n = n,
				    .k = k, .w = mw->w[e], .w_stride = mw->row_bytes, .x = x,
				    .x_stride = x_stride, .y = y, .y_stride = y_stride,
				    .w_packed = mw->packed };

	return cpu_gemm(ctx, &g);
}

/* y[r][i] += b[i] for m rows of n (stride n), when there is a bias. */
static void add_bias(float *y, const float *b, int64_t m, int64_t n)
{
	for (int64_t r = 0; b && r < m; r++)
		for (int64_t i = 0; i < n; i++)
			y[r * n + i] = y[r * n + i] + b[i];
}

/* d = down(glu(gate . x + bg, up . x + bu)) + bd for m rows x (n_embd
 * apart), weights[3], biases[3] (expert e's rows, or NULL: ABI 1.8). */
static int expert_rows(struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
		       const struct loom_moe_weights *w3, const float *const *bias, int64_t e,
		       int64_t ff, int64_t m, const float *x, int64_t x_stride, struct moe_plan *pl)
{
	int rc = run_gemm(ctx, &w3[0], e, ff, a->n_embd, m, x, x_stride, pl->g, ff);

	if (!rc)
		rc = run_gemm(ctx, &w3[1], e, ff, a->n_embd, m, x, x_stride, pl->u, ff);
	if (rc)
		return rc;
	add_bias(pl->g, bias[0], m, ff);
	add_bias(pl->u, bias[1], m, ff);
	rc = cpu_glu(ctx, (enum loom_glu_kind)a->glu, pl->g, ff, pl->g, ff, pl->u, ff, m, ff);
	if (!rc)
		rc = run_gemm(ctx, &w3[2], e, a->n_embd, ff, m, pl->g, ff, pl->d, a->n_embd);
	if (!rc)
		add_bias(pl->d, bias[2], m, a->n_embd);
	return rc;
}

/* Expert e's pairs: gathered, run, and each output row put in its pair's place. */
static int run_expert(struct loom_backend_ctx *ctx, const struct loom_moe_args *a, int32_t e,
		      struct moe_plan *pl)
{
	const struct loom_moe_weights w3[3] = { a->gate, a->up, a->down };
	const float *bias[3] = { loom_moe_bias(a, a->gate_bias, e, a->n_ff),
				 loom_moe_bias(a, a->up_bias, e, a->n_ff),
				 loom_moe_bias(a, a->down_bias, e, a->n_embd) };
	const int32_t *pairs = pl->order + pl->start[e];
	int64_t m = pl->start[e + 1] - pl->start[e], embd = a->n_embd;
	size_t row = (size_t)embd * sizeof(float);
	int rc;

	for (int64_t i = 0; i < m; i++)
		memcpy(pl->x + i * embd, a->x + (pairs[i] / a->n_used) * a->x_stride, row);
	rc = expert_rows(ctx, a, w3, bias, e, a->n_ff, m, pl->x, embd, pl);
	for (int64_t i = 0; i < m && !rc; i++)
		memcpy(pl->out + (int64_t)pairs[i] * embd, pl->d + i * embd, row);
	return rc;
}

/* One decode row through cpu_gemm_experts (two pool tasks for all its
 * experts); LOOM_ERR_INVALID, with nothing done, where that does not
 * apply (exact mode, a format without a group kernel, too many experts).
 * Its outputs land where run_expert's would. */
static int run_row_experts(struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
			   struct moe_plan *pl)
{
	struct cpu_experts ex = { .n = (int)a->n_used, .ids = pl->ids, .gate = a->gate,
				  .up = a->up, .down = a->down, .glu = (enum loom_glu_kind)a->glu,
				  .x = a->x, .n_embd = a->n_embd, .ff = a->n_ff };

	if (a->rows != 1 || a->n_used > CPU_EXPERTS_MAX || ctx->exact)
		return LOOM_ERR_INVALID;
	for (int j = 0; j < ex.n; j++) {
		int32_t e = pl->ids[j];

		ex.gate_bias[j] = loom_moe_bias(a, a->gate_bias, e, a->n_ff);
		ex.up_bias[j] = loom_moe_bias(a, a->up_bias, e, a->n_ff);
		ex.down_bias[j] = loom_moe_bias(a, a->down_bias, e, a->n_embd);
		ex.g[j] = pl->g + j * a->n_ff;
		ex.u[j] = pl->u + j * a->n_ff;
		ex.d[j] = pl->out + j * a->n_embd;
	}
	return cpu_gemm_experts(ctx, &ex);
}

/* y[r] = sum over j of w_j * out[r][j], in j order. */
static void combine(const struct loom_moe_args *a, const struct moe_plan *pl)
{
	int64_t k = a->n_used, embd = a->n_embd;

	for (int64_t r = 0; r < a->rows; r++) {
		float *y = a->y + r * a->y_stride;

		for (int64_t j = 0; j < k; j++) {
			const float *d = pl->out + (r * k + j) * embd;
			float w = pl->w[r * k + j];

			for (int64_t i = 0; i < embd; i++)
				y[i] = j == 0 ? w * d[i] : y[i] + w * d[i];
		}
	}
}

/* y += sigmoid(x . g) * shared expert(x), over all rows. */
static int run_shared(struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
		      struct moe_plan *pl)
{
	const struct loom_moe_weights w3[3] = { a->shared_gate, a->shared_up, a->shared_down };
	struct loom_gemm_args g = { .struct_size = sizeof(g), .w_type = LOOM_TYPE_F32, .m = a->rows,
				    .n = 1, .k = a->n_embd, .w = a->shared_gate_inp,
				    .w_stride = (size_t)a->n_embd * sizeof(float), .x = a->x,
				    .x_stride = a->x_stride, .y = pl->sg, .y_stride = 1 };
	int rc = cpu_gemm(ctx, &g);

	if (!rc)
		rc = expert_rows(ctx, a, w3, (const float *const[3]){ NULL, NULL, NULL }, 0,
				 a->n_ff_shared, a->rows, a->x, a->x_stride, pl);
	for (int64_t r = 0; r < a->rows && !rc; r++) {
		float s = loom_moe_sigmoid(pl->sg[r]), *y = a->y + r * a->y_stride;
		const float *d = pl->d + r * a->n_embd;

		for (int64_t i = 0; i < a->n_embd; i++)
			y[i] = y[i] + s * d[i];
	}
	return rc;
}

int cpu_moe(struct loom_backend_ctx *ctx, const struct loom_moe_args *a)
{
	struct moe_plan pl;
	int rc;

	if (!ctx)
		return LOOM_ERR_INVALID;
	rc = loom_moe_check_args(a);
	if (rc || a->rows == 0)
		return rc;
	if (ctx->rg.open) {
		struct cpu_call c = { .op = CPU_CALL_MOE };

		cpu_region_copy_args(&c.u.moe, sizeof(c.u.moe), a);
		return cpu_region_record(ctx, &c);
	}
	if (!plan_scratch(ctx, a, &pl))
		return LOOM_ERR_NOMEM;
	for (int64_t r = 0; r < a->rows; r++)
		loom_moe_route_as(a->gating, a->logits + r * a->logits_stride, a->n_expert,
				  a->n_used, a->norm != 0, pl.p, pl.ids + r * a->n_used,
				  pl.w + r * a->n_used);
	if (ctx->rg.fuse && run_row_experts(ctx, a, &pl) == LOOM_OK) {
		rc = LOOM_OK;
	} else {
		group_pairs(a, &pl);
		for (int32_t e = 0; e < a->n_expert && !rc; e++)
			if (pl.start[e + 1] > pl.start[e])
				rc = run_expert(ctx, a, e, &pl);
	}
	if (!rc)
		combine(a, &pl);
	if (!rc && a->n_ff_shared > 0)
		rc = run_shared(ctx, a, &pl);
	return rc;
}
