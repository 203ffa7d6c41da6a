/*
 * The routed-expert slot (ABI 1.6) in the conformance suite:
 *
 *   moe      against ref.so: random experts (8 of them, 2 or 3 routed a
 *            row, weights normalised or not, with and without a shared
 *            expert) over 1, 5 and 33 rows (decode; prefill, where a
 *            backend may run an expert's rows as one GEMM), judged by the
 *            normalised error of gemm on the same weight type (the routes
 *            are the same bits: loom/moe.h);
 *   moe_oai  the same for gpt-oss's pieces (ABI 1.8, LOOM_OP_GLU_OAI): the
 *            clamped SwiGLU, top-k gating and expert biases (gate, up,
 *            down; all or none);
 *   inv-moe  with LOOM_BACKEND_BATCH_INVARIANT: each row of a 9-row call
 *            (other rows sharing its experts) bit for bit the same as that
 *            row alone.
 * A backend without the slot is skipped (the host's fallback runs its
 * gemm, glu, scale and add, which the rest of the suite checks).
 */
#include "check/tb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/moe.h"

#define F (sizeof(float))
#define N_EXPERT 8
#define N_EMBD 64
#define N_FF 96

struct moe_case {
	uint32_t type;
	int64_t rows, n_used, n_ff_shared;
	bool norm;
	bool oai; /* gpt-oss: LOOM_GLU_SWIGLU_OAI, LOOM_MOE_SOFTMAX_TOPK */
	float *bias[3]; /* gate, up ([N_EXPERT][N_FF]), down ([N_EXPERT][N_EMBD]) or NULL */
	size_t row_embd, row_ff; /* bytes of a row of N_EMBD / N_FF values */
	void *w[6];   /* host: gate, up, down (N_EXPERT each), shared gate, up, down */
	float *x, *logits, *sg; /* [rows][N_EMBD], [rows][N_EXPERT], [N_EMBD] */
};

static bool has_moe(const struct dev *d)
{
	return d->ops->struct_size >= offsetof(struct loom_backend_ops, moe) + sizeof(void *) &&
	       d->ops->moe;
}

/* Bytes of a row of k values of type (0: no plugin for it). */
static size_t row_bytes(uint32_t type, int64_t k)
{
	const struct loom_quant_format *qf = loom_format_get(type);

	if (type == LOOM_TYPE_F32)
		return (size_t)k * F;
	return qf && k % qf->block_elems == 0 ? (size_t)(k / qf->block_elems) * qf->block_bytes : 0;
}

/* n rows of k random values in type, rows `stride` bytes apart. */
static void *weights(uint32_t type, int64_t n, int64_t k, size_t stride)
{
	const struct loom_quant_format *qf = loom_format_get(type);
	unsigned char *w = tb_xmalloc((size_t)n * stride);
	float *row = tb_xmalloc((size_t)k * F);

	for (int64_t j = 0; j < n; j++) {
		tb_fill(row, k, 1.0f);
		if (type == LOOM_TYPE_F32)
			memcpy(w + j * stride, row, (size_t)k * F);
		else if (qf->from_float(row, w + j * stride, k) != LOOM_OK)
			fprintf(stderr, "tb: from_float(%s) failed\n", qf->name);
	}
	free(row);
	return w;
}

static bool moe_make(struct moe_case *c, uint32_t type, int64_t rows, int64_t n_used,
		     bool shared, bool norm)
{
	memset(c, 0, sizeof(*c));
	c->type = type, c->rows = rows, c->n_used = n_used, c->norm = norm;
	c->n_ff_shared = shared ? 2 * N_FF : 0;
	c->row_embd = row_bytes(type, N_EMBD);
	c->row_ff = row_bytes(type, shared ? 2 * N_FF : N_FF);
	if (!c->row_embd || !c->row_ff)
		return false;
	c->row_ff = row_bytes(type, N_FF);
	c->w[0] = weights(type, N_EXPERT * N_FF, N_EMBD, c->row_embd);
	c->w[1] = weights(type, N_EXPERT * N_FF, N_EMBD, c->row_embd);
	c->w[2] = weights(type, N_EXPERT * N_EMBD, N_FF, c->row_ff);
	if (shared) {
		c->w[3] = weights(type, c->n_ff_shared, N_EMBD, c->row_embd);
		c->w[4] = weights(type, c->n_ff_shared, N_EMBD, c->row_embd);
		c->w[5] = weights(type, N_EMBD, c->n_ff_shared, row_bytes(type, c->n_ff_shared));
	}
	c->x = tb_xmalloc((size_t)rows * N_EMBD * F);
	c->logits = tb_xmalloc((size_t)rows * N_EXPERT * F);
	c->sg = tb_xmalloc(N_EMBD * F);
	tb_fill(c->x, rows * N_EMBD, 1.0f);
	tb_fill(c->logits, rows * N_EXPERT, 3.0f);
	tb_fill(c->sg, N_EMBD, 0.3f);
	return true;
}

static void moe_free(struct moe_case *c)
{
	for (int i = 0; i < 6; i++)
		free(c->w[i]);
	for (int i = 0; i < 3; i++)
		free(c->bias[i]);
	free(c->x);
	free(c->logits);
	free(c->sg);
}

/* One expert tensor on d: n matrices of `rows` rows in one buffer. */
static bool put_weights(struct dev *d, const void *host, int64_t n, int64_t rows, size_t row,
			uint32_t type, const void **addr, struct loom_moe_weights *mw)
{
	char *base = dev_put(d, host, (size_t)(n * rows) * row);

	if (!base)
		return false;
	for (int64_t e = 0; e < n; e++)
		addr[e] = base + (size_t)(e * rows) * row;
	*mw = (struct loom_moe_weights){ .type = type, .row_bytes = row, .w = addr };
	return true;
}

/* Rows [r0, r0 + n) of case c on d, into y ([n][N_EMBD]). */
static int moe_on(struct dev *d, const struct moe_case *c, int64_t r0, int64_t n, float *y)
{
	const void *addr[6][N_EXPERT];
	struct loom_moe_args a = {
		.struct_size = sizeof(a), .glu = LOOM_GLU_SILU, .gating = LOOM_MOE_SOFTMAX,
		.norm = c->norm, .rows = n, .n_embd = N_EMBD, .n_ff = N_FF,
		.n_expert = N_EXPERT, .n_used = c->n_used, .x_stride = N_EMBD,
		.logits_stride = N_EXPERT, .y_stride = N_EMBD, .n_ff_shared = c->n_ff_shared,
	};
	size_t y_bytes = (size_t)n * N_EMBD * F;
	bool ok;
	int rc = LOOM_ERR_NOMEM;

	a.x = dev_put(d, c->x + r0 * N_EMBD, y_bytes);
	a.logits = dev_put(d, c->logits + r0 * N_EXPERT, (size_t)n * N_EXPERT * F);
	a.y = dev_put(d, NULL, y_bytes);
	ok = a.x && a.logits && a.y &&
	     put_weights(d, c->w[0], N_EXPERT, N_FF, c->row_embd, c->type, addr[0], &a.gate) &&
	     put_weights(d, c->w[1], N_EXPERT, N_FF, c->row_embd, c->type, addr[1], &a.up) &&
	     put_weights(d, c->w[2], N_EXPERT, N_EMBD, c->row_ff, c->type, addr[2], &a.down);
	if (c->oai) {
		a.glu = LOOM_GLU_SWIGLU_OAI;
		a.gating = LOOM_MOE_SOFTMAX_TOPK;
	}
	if (ok && c->bias[0]) {
		a.gate_bias = dev_put(d, c->bias[0], N_EXPERT * N_FF * F);
		a.up_bias = dev_put(d, c->bias[1], N_EXPERT * N_FF * F);
		a.down_bias = dev_put(d, c->bias[2], N_EXPERT * N_EMBD * F);
		ok = a.gate_bias && a.up_bias && a.down_bias;
	}
	if (ok && c->n_ff_shared) {
		size_t row_sff = row_bytes(c->type, c->n_ff_shared);

		a.shared_gate_inp = dev_put(d, c->sg, N_EMBD * F);
		ok = a.shared_gate_inp &&
		     put_weights(d, c->w[3], 1, c->n_ff_shared, c->row_embd, c->type, addr[3],
				 &a.shared_gate) &&
		     put_weights(d, c->w[4], 1, c->n_ff_shared, c->row_embd, c->type, addr[4],
				 &a.shared_up) &&
		     put_weights(d, c->w[5], 1, N_EMBD, row_sff, c->type, addr[5], &a.shared_down);
	}
	if (ok) {
		rc = d->ops->moe(d->ctx, &a);
		if (rc == LOOM_OK)
			rc = dev_get(d, y, a.y, y_bytes);
	}
	dev_reset(d);
	return rc;
}

/* Case c on ref and d, compared as `op` with tolerance tol. */
static void moe_compare(struct dev *ref, struct dev *d, const char *op, const char *fmt,
			double tol, struct moe_case *c, const char *desc)
{
	int64_t rows = c->rows, n = rows * N_EMBD;
	float *want = tb_poison(n), *got = tb_poison(n);
	int rc_ref = moe_on(ref, c, 0, rows, want), rc;

	tb_current(d, op, fmt, desc);
	rc = moe_on(d, c, 0, rows, got);
	if (rc_ref != LOOM_OK)
		tb_fail(d, op, fmt, "%s: ref.so status %d", desc, rc_ref);
	else if (tb_status_ok(d, op, fmt, true, rc, desc))
		tb_result(d, op, fmt, tol, tb_nmse(got, want, rows, N_EMBD, N_EMBD), desc);
	free(want);
	free(got);
}

void tb_run_moe(struct dev *ref, struct dev *d, uint32_t type, double tol)
{
	static const int64_t rows_list[] = { 1, 5, 33 };
	const char *fmt = tb_type_name(type);

	if (!has_moe(d)) {
		tb_skip(d, "moe", fmt);
		return;
	}
	for (int ri = 0; ri < 3; ri++)
		for (int v = 0; v < 4; v++) {
			struct moe_case c;
			int64_t rows = rows_list[ri];
			char desc[128];

			if (!moe_make(&c, type, rows, 2 + (v & 1), v >= 2, v != 1)) {
				tb_skip(d, "moe", fmt);
				return;
			}
			snprintf(desc, sizeof(desc), "rows %lld, %lld of %d experts%s%s",
				 (long long)rows, (long long)c.n_used, N_EXPERT,
				 c.norm ? ", normalised" : "", v >= 2 ? ", shared expert" : "");
			moe_compare(ref, d, "moe", fmt, tol, &c, desc);
			moe_free(&c);
		}
}

/* gpt-oss's routed FFN: rows 1, 5, 33; 2 or 4 of 8 experts; biases or
 * not. Expert products reach the SwiGLU's clamps (x amplitude 1, weights
 * 1, 64 inputs: products of order 5). */
void tb_run_moe_oai(struct dev *ref, struct dev *d, uint32_t type, double tol)
{
	static const int64_t rows_list[] = { 1, 5, 33 };
	const char *fmt = tb_type_name(type);

	if (!has_moe(d) || d->ops->abi_minor < 8 ||
	    !d->ops->supports(d->ctx, LOOM_OP_GLU_OAI, LOOM_TYPE_F32)) {
		tb_skip(d, "moe_oai", fmt);
		return;
	}
	for (int ri = 0; ri < 3; ri++)
		for (int v = 0; v < 4; v++) {
			struct moe_case c;
			int64_t rows = rows_list[ri];
			char desc[128];

			if (!moe_make(&c, type, rows, v & 1 ? 4 : 2, false, false)) {
				tb_skip(d, "moe_oai", fmt);
				return;
			}
			c.oai = true;
			if (v >= 2) {
				c.bias[0] = tb_xmalloc(N_EXPERT * N_FF * F);
				c.bias[1] = tb_xmalloc(N_EXPERT * N_FF * F);
				c.bias[2] = tb_xmalloc(N_EXPERT * N_EMBD * F);
				tb_fill(c.bias[0], N_EXPERT * N_FF, 2.0f);
				tb_fill(c.bias[1], N_EXPERT * N_FF, 2.0f);
				/* the down products' size (rms ~25): a bias
				 * dropped fails even fast mode's tolerance */
				tb_fill(c.bias[2], N_EXPERT * N_EMBD, 25.0f);
			}
			snprintf(desc, sizeof(desc), "rows %lld, %lld of %d experts, top-k%s",
				 (long long)rows, (long long)c.n_used, N_EXPERT,
				 v >= 2 ? ", biases" : "");
			moe_compare(ref, d, "moe_oai", fmt, tol, &c, desc);
			moe_free(&c);
		}
}

/* Case c's rows alone against the 9-row batch, bit for bit. */
static void moe_invariant_case(struct dev *d, struct dev *as, const char *op, const char *fmt,
			       const struct moe_case *c)
{
	const int64_t rows = c->rows;
	float *batch = tb_poison(rows * N_EMBD), *one = tb_poison(N_EMBD);
	char what[64];
	int rc = moe_on(d, c, 0, rows, batch);

	for (int64_t r = 0; r < rows && rc == LOOM_OK; r++) {
		rc = moe_on(d, c, r, 1, one);
		snprintf(what, sizeof(what), "row %lld of %lld alone", (long long)r, (long long)rows);
		if (rc != LOOM_OK)
			break;
		if (memcmp(one, batch + r * N_EMBD, N_EMBD * F))
			tb_fail(as, op, fmt, "%s differs from the batch", what);
		else
			tb_result(as, op, fmt, 0, 0, what);
	}
	if (rc != LOOM_OK)
		tb_fail(as, op, fmt, "status %d", rc);
	free(batch);
	free(one);
}

void tb_moe_invariance(struct dev *d, const char *label, uint32_t type)
{
	struct dev as = { .name = label };
	const char *fmt = tb_type_name(type);
	struct moe_case c;

	if (!has_moe(d))
		return;
	if (moe_make(&c, type, 9, 3, type == LOOM_TYPE_F32, true)) {
		moe_invariant_case(d, &as, "inv-moe", fmt, &c);
		moe_free(&c);
	}
	/* gpt-oss's pieces (ABI 1.8): top-k gating, clamped SwiGLU, biases */
	if (d->ops->abi_minor >= 8 && d->ops->supports(d->ctx, LOOM_OP_GLU_OAI, LOOM_TYPE_F32) &&
	    moe_make(&c, type, 9, 4, false, false)) {
		c.oai = true;
		for (int i = 0; i < 3; i++) {
			int64_t n = N_EXPERT * (i < 2 ? N_FF : N_EMBD);

			c.bias[i] = tb_xmalloc((size_t)n * F);
			tb_fill(c.bias[i], n, 2.0f);
		}
		moe_invariant_case(d, &as, "inv-moe_oai", fmt, &c);
		moe_free(&c);
	}
}
