/*
 * gpu_fuse.c: fewer launches for a step region's calls (GPU backends).
 *
 * A decode layer makes about 17 launches of which most are small: three
 * GEMVs that read the same normalized rows (q, k, v), each bias add, the
 * output projection and its residual add, gate and up and the GLU of
 * them, the down projection and its residual add. When exec_calls runs a
 * region's calls (directly or into a captured graph) it finds, from each
 * call on, the longest run of
 *   - gemms that run as GEMVs over the same activation rows, in one mode
 *     (fast or exact), of one weight type in exact mode (fast mode: one
 *     launch a type, all on the same 8-bit activations),
 *   - each followed, optionally, by the add that consumes its output (a
 *     bias or the residual),
 *   - or exactly a gate and an up gemm followed by the GLU of them,
 * and runs it as one GEMV group (gpurt_gemv_group): one launch, the
 * activations quantized once for all members in fast mode, the adds and
 * the GLU in the kernel's epilogue. The rmsnorm before such a run (and
 * the add before that norm, which makes the rows it reads: the residual
 * add of a prefill step, whose GEMMs are not GEMVs) runs as one kernel
 * too, gpurt_norm, which in fast mode also quantizes the normalized rows
 * for the group when the group reads them. So a fast decode layer runs
 * its q, k and v (or gate, up and the GLU) in two launches where there
 * were five. Each element is computed by the same
 * arithmetic as the calls one by one, so the results are the same bits
 * (tests/backend/cpu_fuse.c holds regions to direct calls on gpuemu.so
 * and gpuemu64.so in both modes, and backend_graphs whole steps).
 *
 * The grouped calls run at once on many blocks, so a run is grouped only
 * where no call of it writes what another reads (beyond an add or a GLU
 * updating its own operand in place): the rules of backends/cpu/region.c,
 * whose threads run a group the same way. Everything stays inside the
 * backend: the host still makes the unfused calls, so no ABI slot is
 * needed and a backend without fusion runs the same graph.
 * LOOM_GPU_FUSE=0 runs every call on its own (A/B for bench/).
 */
#include <string.h>

#include "gpu_ctx.h"
#include "../common/fuse_io.h"
#include "loom/kv_quant.h"

_Static_assert(GPURT_GROUP_MAX <= FUSE_GROUP_MAX, "group_io holds every member");

/* All n rows' bytes, counted as whole strides (more than the last row
 * needs: a wider span only keeps calls apart). */
static struct span weight_span(const struct loom_gemm_args *a)
{
	struct span s = { (uintptr_t)a->w, (uintptr_t)a->w };

	s.hi = s.lo + (size_t)a->n * a->w_stride;
	return s;
}

/* Joins gemm a when it runs as the same kind of GEMV over the same rows
 * and writes nothing the group reads or writes. */
static bool join_gemm(const struct loom_backend_ctx *ctx, struct group_io *io,
		      struct gpu_group *g, const struct loom_gemm_args *a)
{
	const struct loom_gemm_args *first = g->n ? g->gemm[0] : a;
	struct span y = rows_span(a->y, a->m, a->y_stride, a->n), w = weight_span(a);
	bool q8;
	int i = io->n;

	if (g->n == GPURT_GROUP_MAX || !gemm_groupable(ctx, a, &q8) || (g->n && q8 != g->q8) ||
	    (a->w_type != first->w_type && !q8) || a->m != first->m || a->k != first->k ||
	    a->x != first->x || a->x_stride != first->x_stride)
		return false;
	if (!g->n)
		io->x = rows_span(a->x, a->m, a->x_stride, a->k);
	if (overlap(y, io->x) || overlap(y, w) || !disjoint_from_writes(io, y, -1) ||
	    !disjoint_from_reads(io, y, -1) || !disjoint_from_writes(io, w, -1))
		return false;
	io->w[i] = w;
	io->y[i] = io->out[i] = y;
	io->other[i] = (struct span){ 0, 0 };
	io->n++;
	g->q8 = q8;
	g->gemm[g->n] = a;
	g->add[g->n] = NULL;
	g->n++;
	return true;
}

/* Attaches add d to the group's last gemm when it adds that gemm's whole
 * output (as a, or as b of as many rows) to an operand nothing else in
 * the group writes. */
static bool join_add(struct group_io *io, struct gpu_group *g, const struct rows_call *d)
{
	const struct loom_gemm_args *m = g->gemm[g->n - 1];
	int i = io->n - 1;
	bool y_is_a = same_rows(d->x, d->x_stride, m->y, m->y_stride);
	bool y_is_b = d->b_rows == d->rows && same_rows(d->w, d->w_stride, m->y, m->y_stride);
	const float *op = y_is_a ? d->w : d->x;
	int64_t op_stride = y_is_a ? d->w_stride : d->x_stride;
	int64_t op_rows = y_is_a ? d->b_rows : d->rows;
	struct span out = rows_span(d->y, d->rows, d->y_stride, d->n);
	struct span other = rows_span(op, op_rows, op_stride, d->n);

	if (g->add[g->n - 1] || d->rows != m->m || d->n != m->n || (!y_is_a && !y_is_b))
		return false;
	/* the other operand: read, never written by a member */
	if (!disjoint_from_writes(io, other, i) || overlap(other, io->y[i]))
		return false;
	/* the output: y itself, or rows nothing else touches, or the other
	 * operand exactly (x += p) */
	if (!same_rows(d->y, d->y_stride, m->y, m->y_stride)) {
		if (overlap(out, io->y[i]) || !disjoint_from_writes(io, out, i) ||
		    !disjoint_from_reads(io, out, -1))
			return false;
		if (overlap(out, other) &&
		    !(same_rows(d->y, d->y_stride, op, op_stride) && op_rows == d->rows))
			return false;
	}
	io->out[i] = out;
	io->other[i] = other;
	g->add[g->n - 1] = d;
	return true;
}

/* Attaches GLU u to a group of exactly a gate and an up gemm (in either
 * order: the host may make up first), making the gate member 0. */
static bool join_glu(struct group_io *io, struct gpu_group *g, const struct rows_call *u)
{
	const struct loom_gemm_args *a = g->gemm[0], *b = g->gemm[1];
	struct span out = rows_span(u->y, u->rows, u->y_stride, u->n);
	bool ab, ba;

	if (g->n != 2 || g->add[0] || g->add[1] || a->n != b->n || u->n != a->n ||
	    u->rows != a->m || a->w_type != b->w_type)
		return false;
	ab = same_rows(u->x, u->x_stride, a->y, a->y_stride) &&
	     same_rows(u->w, u->w_stride, b->y, b->y_stride);
	ba = same_rows(u->x, u->x_stride, b->y, b->y_stride) &&
	     same_rows(u->w, u->w_stride, a->y, a->y_stride);
	if (!ab && !ba)
		return false;
	/* in place over gate or up, or into rows nothing else touches */
	if (!same_rows(u->y, u->y_stride, a->y, a->y_stride) &&
	    !same_rows(u->y, u->y_stride, b->y, b->y_stride) &&
	    (!disjoint_from_writes(io, out, -1) || !disjoint_from_reads(io, out, -1)))
		return false;
	if (ba) {
		g->gemm[0] = b;
		g->gemm[1] = a;
	}
	g->glu = u;
	return true;
}

/* An operand of a norm's row kernel: exactly the rows written (each
 * block reads its own row before it writes it), or apart from them. */
static bool row_safe(struct span written, const float *w, int64_t ws, const float *p, int64_t ps,
		     struct span read)
{
	return same_rows(w, ws, p, ps) || !overlap(written, read);
}

/* Add d then norm r as one row kernel: r normalizes what d writes; each
 * block writes its row of d's output and of r's, reading only that row
 * of d's operands (or b's one row, which nothing writes). */
static bool join_add_norm(const struct rows_call *d, const struct rows_call *r)
{
	struct span out = rows_span(d->y, d->rows, d->y_stride, d->n);
	struct span a = rows_span(d->x, d->rows, d->x_stride, d->n);
	struct span b = rows_span(d->w, d->b_rows, d->w_stride, d->n);
	struct span y = rows_span(r->y, r->rows, r->y_stride, r->n);
	struct span w = rows_span(r->w, 1, r->n, r->n);

	if (r->x != d->y || r->x_stride != d->y_stride || r->rows != d->rows || r->n != d->n)
		return false;
	if (!row_safe(out, d->y, d->y_stride, d->x, d->x_stride, a) ||
	    (d->b_rows == 1 ? overlap(out, b) :
			      !row_safe(out, d->y, d->y_stride, d->w, d->w_stride, b)))
		return false;
	if (overlap(w, out) || overlap(w, y))
		return false;
	return same_rows(r->y, r->y_stride, d->y, d->y_stride) ||
	       (!overlap(y, out) && !overlap(y, a) && !overlap(y, b));
}

/* A norm on its own: in place or apart from what it reads. */
static bool norm_alone_ok(const struct rows_call *r)
{
	struct span x = rows_span(r->x, r->rows, r->x_stride, r->n);
	struct span y = rows_span(r->y, r->rows, r->y_stride, r->n);
	struct span w = rows_span(r->w, 1, r->n, r->n);

	return row_safe(y, r->y, r->y_stride, r->x, r->x_stride, x) && !overlap(y, w);
}

/* The leading add and norm of a run (calls taken, 0 for none). */
static int64_t find_norm(const struct call *c, int64_t n, struct gpu_group *g)
{
	if (n >= 2 && c[0].kind == CALL_ADD && c[1].kind == CALL_RMSNORM &&
	    join_add_norm(&c[0].u.rows, &c[1].u.rows)) {
		g->norm_add = &c[0].u.rows;
		g->norm = &c[1].u.rows;
		return 2;
	}
	if (n >= 1 && c[0].kind == CALL_RMSNORM && norm_alone_ok(&c[0].u.rows)) {
		g->norm = &c[0].u.rows;
		return 1;
	}
	return 0;
}

/* Whether the norm makes the rows the fast GEMVs read: then it
 * quantizes them itself. */
static bool norm_feeds(const struct gpu_group *g)
{
	const struct rows_call *r = g->norm;
	const struct loom_gemm_args *a = g->gemm[0];

	return g->q8 && a->x == r->y && a->x_stride == r->y_stride && a->m == r->rows &&
	       a->k == r->n;
}

int64_t gpu_find_group(const struct loom_backend_ctx *ctx, const struct call *c, int64_t n,
		       struct gpu_group *g)
{
	struct group_io io = { .n = 0 };
	int64_t lead, i;

	memset(g, 0, sizeof(*g));
	i = lead = find_norm(c, n, g);
	while (i < n && c[i].kind == CALL_GEMM && join_gemm(ctx, &io, g, &c[i].u.gemm)) {
		i++;
		if (i < n && c[i].kind == CALL_ADD && join_add(&io, g, &c[i].u.rows))
			i++;
	}
	if (i < n && c[i].kind == CALL_GLU && join_glu(&io, g, &c[i].u.rows))
		i++;
	g->norm_q8 = g->norm && g->n && norm_feeds(g);
	if (g->norm && g->n && !g->norm_q8) {
		/* the norm gains nothing from the gemms: add and norm alone,
		 * or nothing of it here (the gemms group from the next call) */
		memset(&g->gemm, 0, sizeof(g->gemm));
		memset(&g->add, 0, sizeof(g->add));
		g->glu = NULL;
		g->n = 0;
		i = lead;
	}
	if (!g->norm_add && !g->n)
		g->norm = NULL, i = 0; /* a norm alone runs as it is */
	return i >= 2 ? i : 0; /* so does a lone gemm */
}

/* Member i of the launch: gemm i and its add. */
static void group_member(const struct gpu_group *g, int i, struct gpurt_gemv_member *m)
{
	const struct loom_gemm_args *a = g->gemm[i];
	const struct rows_call *d = g->add[i];

	memset(m, 0, sizeof(*m));
	m->w = a->w, m->w_stride = a->w_stride, m->n = a->n;
	m->y = a->y, m->y_stride = a->y_stride;
	if (!d)
		return;
	m->y_first = same_rows(d->x, d->x_stride, a->y, a->y_stride);
	m->other = m->y_first ? d->w : d->x;
	m->other_stride = !m->y_first ? d->x_stride : d->b_rows == 1 ? 0 : d->w_stride;
	m->out = d->y, m->out_stride = d->y_stride;
}

/* The group's norm (with its add, and its quantization for the GEMVs). */
static int run_norm(struct loom_backend_ctx *ctx, const struct gpu_group *g, int8_t **qs,
		    void **scale)
{
	const struct rows_call *r = g->norm, *d = g->norm_add;
	struct gpurt_norm p;
	int rc;

	memset(&p, 0, sizeof(p));
	p.y = r->y, p.y_stride = r->y_stride;
	p.x = (float *)r->x, p.x_stride = r->x_stride; /* written only with the add: d->y */
	p.w = r->w, p.rows = r->rows, p.n = r->n, p.eps = r->eps;
	if (d) {
		p.x = d->y;
		p.a = d->x, p.a_stride = d->x_stride;
		p.b = d->w, p.b_stride = d->b_rows == 1 ? 0 : d->w_stride;
	}
	if (g->norm_q8) {
		rc = gemv_q8_buffers(ctx, g->gemm[0], qs, scale);
		if (rc)
			return rc;
		p.qs = *qs, p.scale = *scale;
	}
	return rt_failed(ctx, gpurt_norm(ctx->rt, &p));
}

/* The launch of the group's members of weight type t (all of them but
 * in a fast group of several types), in the group's order. */
static int run_type(struct loom_backend_ctx *ctx, const struct gpu_group *g, uint32_t t,
		    const int8_t *qs, const void *scale)
{
	const struct loom_gemm_args *a = g->gemm[0];
	struct gpurt_gemv_group r;

	memset(&r, 0, sizeof(r));
	r.type = t;
	r.glu = g->glu ? g->glu->kind : -1; /* a GLU pair is of one type */
	r.m = a->m, r.k = a->k;
	r.x = a->x, r.x_stride = a->x_stride;
	if (g->glu)
		r.glu_out = g->glu->y, r.glu_stride = g->glu->y_stride;
	for (int i = 0; i < g->n; i++)
		if (g->gemm[i]->w_type == t)
			group_member(g, i, &r.mem[r.n_members++]);
	return rt_failed(ctx, gpurt_gemv_group(ctx->rt, &r, qs, scale));
}

/*
 * The group's launches: one per weight type among its members, in the
 * order the types first appear. In fast mode the members of every type
 * read the same 8-bit activations, quantized once (by the norm, or here):
 * a Q4_K_M layer's q4_K q and k and q6_K v, which quantized the same rows
 * twice when v ran on its own. The quantization is a function of the rows
 * alone, so each member sees the bits it would see alone. The members
 * write nothing another reads (join_gemm), so their order is free.
 */
int gpu_run_group(struct loom_backend_ctx *ctx, const struct gpu_group *g)
{
	int8_t *qs = NULL;
	void *scale = NULL;
	int rc = g->norm ? run_norm(ctx, g, &qs, &scale) : LOOM_OK;

	if (rc || !g->n)
		return rc;
	if (g->q8 && !g->norm_q8)
		rc = gemv_quantize(ctx, g->gemm[0], &qs, &scale);
	for (int i = 0; i < g->n && !rc; i++) {
		bool first = true;

		for (int j = 0; j < i; j++)
			first = first && g->gemm[j]->w_type != g->gemm[i]->w_type;
		if (first)
			rc = run_type(ctx, g, g->gemm[i]->w_type, qs, scale);
	}
	return rc;
}

/* ---- RoPE with kv_write ---- */

/* n int32 (or float) values at p. */
static struct span words_span(const void *p, int64_t n)
{
	struct span s = { (uintptr_t)p, (uintptr_t)p + (p ? (size_t)n * 4 : 0) };

	return s;
}

static struct span rope_rows(const struct loom_rope_args *a)
{
	return rows_span(a->x, a->n_tokens, a->row_stride, a->n_heads * a->head_dim);
}

/* What a rope reads besides its rows: positions and frequency factors. */
static bool rope_inputs_apart(const struct loom_rope_args *a, struct span s)
{
	return !overlap(s, words_span(a->pos, a->n_tokens)) &&
	       !overlap(s, words_span(a->freq_factors, a->n_rot / 2));
}

bool gpu_caches_apart(const struct call *c, int64_t i, const int32_t *slots)
{
	const struct loom_kv_write_args *w = &c[i].u.kv;
	size_t rb = loom_kvq_row_bytes(w->kv_type, w->kv_dim);
	int64_t lo = INT32_MAX, hi = -1;
	struct span ks, vs, rows[4];

	for (int64_t t = 0; slots && t < w->n_tokens; t++) {
		lo = slots[t] < lo ? slots[t] : lo;
		hi = slots[t] > hi ? slots[t] : hi;
	}
	if (!slots || lo < 0 || hi < lo)
		return false; /* the checks refuse it anyway */
	ks = (struct span){ (uintptr_t)w->kcache + (size_t)lo * rb,
			    (uintptr_t)w->kcache + (size_t)(hi + 1) * rb };
	vs = (struct span){ (uintptr_t)w->vcache + (size_t)lo * rb,
			    (uintptr_t)w->vcache + (size_t)(hi + 1) * rb };
	rows[0] = rows_span(w->k, w->n_tokens, w->k_stride, w->kv_dim);
	rows[1] = rows_span(w->v, w->n_tokens, w->v_stride, w->kv_dim);
	rows[2] = words_span(w->slots, w->n_tokens);
	rows[3] = ks;
	for (int j = 0; j < 4; j++)
		if (overlap(vs, rows[j]) || (j < 3 && overlap(ks, rows[j])))
			return false;
	for (int64_t j = i - 1; j >= 0 && j >= i - 2 && c[j].kind == CALL_ROPE; j--) {
		const struct loom_rope_args *r = &c[j].u.rope;

		if (overlap(ks, rope_rows(r)) || overlap(vs, rope_rows(r)) ||
		    !rope_inputs_apart(r, ks) || !rope_inputs_apart(r, vs))
			return false;
	}
	/* the head norms before two ropes (Qwen3, Gemma 3): their rows and
	 * weights too */
	for (int64_t j = i - 3; i >= 4 && j >= i - 4 && c[i - 1].kind == CALL_ROPE &&
			       c[i - 2].kind == CALL_ROPE && c[j].kind == CALL_RMSNORM; j--) {
		const struct rows_call *r = &c[j].u.rows;
		struct span w = words_span(r->w, r->n);
		struct span x = rows_span(r->x, r->rows, r->x_stride, r->n);

		if (overlap(ks, w) || overlap(vs, w) || overlap(ks, x) || overlap(vs, x))
			return false;
	}
	return true;
}

/* kv_write w stores exactly the rows rope k rotates (so each thread can
 * rotate its values and store them), with caches, v rows and slots apart
 * from them, in units that own whole pairs. */
static bool rope_kv_ok(const struct loom_rope_args *k, const struct loom_kv_write_args *w,
		       const struct attn_plan *pl)
{
	if (!pl->caches_apart || w->k != k->x || w->k_stride != k->row_stride ||
	    w->n_tokens != k->n_tokens || w->kv_dim != k->n_heads * k->head_dim)
		return false;
	if (loom_kvq_block_elems(w->kv_type) > 1 &&
	    (k->head_dim % 32 || (k->mode != LOOM_ROPE_NORM && k->n_rot % 64)))
		return false;
	return !overlap(rows_span(w->v, w->n_tokens, w->v_stride, w->kv_dim), rope_rows(k)) &&
	       !overlap(words_span(w->slots, w->n_tokens), rope_rows(k));
}

/* Rope q joins when it shares k's table and mode and its rows are apart
 * from everything k's rope and the kv_write read or write. */
static bool rope_q_ok(const struct loom_rope_args *q, const struct loom_rope_args *k,
		      const struct loom_kv_write_args *w)
{
	struct span qs = rope_rows(q);

	if (q->mode != k->mode || q->n_rot != k->n_rot || q->n_tokens != k->n_tokens ||
	    memcmp(&q->freq_base, &k->freq_base, sizeof(float)))
		return false;
	return !overlap(qs, rope_rows(k)) && rope_inputs_apart(k, qs) &&
	       !overlap(qs, rows_span(w->v, w->n_tokens, w->v_stride, w->kv_dim)) &&
	       !overlap(qs, words_span(w->slots, w->n_tokens));
}

/* Head norm r (rmsnorm of each head of rope a's rows, in place) may run
 * in a's block: its rows are exactly a's heads, contiguous, and its
 * weights lie apart from every row the fused launch writes (q's, k's). */
static bool head_norm_ok(const struct rows_call *r, const struct loom_rope_args *a,
			 const struct loom_rope_args *q, const struct loom_rope_args *k)
{
	struct span w = words_span(r->w, r->n);

	return r->y == a->x && r->x == a->x && r->x_stride == a->head_dim &&
	       r->y_stride == a->head_dim && r->n == a->head_dim &&
	       a->row_stride == a->n_heads * a->head_dim && r->rows == a->n_tokens * a->n_heads &&
	       !overlap(w, rope_rows(q)) && !overlap(w, rope_rows(k));
}

int64_t gpu_find_rope_kv(const struct call *c, const struct attn_plan *pl, int64_t n,
			 struct gpu_rope_kv *f)
{
	memset(f, 0, sizeof(*f));
	if (n >= 5 && c[0].kind == CALL_RMSNORM && c[1].kind == CALL_RMSNORM &&
	    c[2].kind == CALL_ROPE && c[3].kind == CALL_ROPE && c[4].kind == CALL_KV_WRITE &&
	    c[2].u.rope.head_dim == c[3].u.rope.head_dim &&
	    c[3].u.rope.head_dim % loom_kvq_block_elems(c[4].u.kv.kv_type) == 0 &&
	    rope_kv_ok(&c[3].u.rope, &c[4].u.kv, &pl[4]) &&
	    rope_q_ok(&c[2].u.rope, &c[3].u.rope, &c[4].u.kv) &&
	    head_norm_ok(&c[0].u.rows, &c[2].u.rope, &c[2].u.rope, &c[3].u.rope) &&
	    head_norm_ok(&c[1].u.rows, &c[3].u.rope, &c[2].u.rope, &c[3].u.rope)) {
		f->qn = &c[0].u.rows;
		f->kn = &c[1].u.rows;
		f->q = &c[2].u.rope;
		f->k = &c[3].u.rope;
		f->w = &c[4].u.kv;
		return 5;
	}
	if (n >= 3 && c[0].kind == CALL_ROPE && c[1].kind == CALL_ROPE &&
	    c[2].kind == CALL_KV_WRITE && rope_kv_ok(&c[1].u.rope, &c[2].u.kv, &pl[2]) &&
	    rope_q_ok(&c[0].u.rope, &c[1].u.rope, &c[2].u.kv)) {
		f->q = &c[0].u.rope;
		f->k = &c[1].u.rope;
		f->w = &c[2].u.kv;
		return 3;
	}
	if (n >= 2 && c[0].kind == CALL_ROPE && c[1].kind == CALL_KV_WRITE &&
	    rope_kv_ok(&c[0].u.rope, &c[1].u.kv, &pl[1])) {
		f->k = &c[0].u.rope;
		f->w = &c[1].u.kv;
		return 2;
	}
	return 0;
}

int gpu_run_rope_kv(struct loom_backend_ctx *ctx, const struct gpu_rope_kv *f)
{
	struct gpurt_rope_table t;
	int rc = rope_table(ctx, f->k, false, &t);

	if (!rc && f->qn) {
		struct gpurt_head_norms hn = { f->qn->w, f->kn->w, f->qn->eps, f->kn->eps };

		return rt_failed(ctx, gpurt_norm_rope_kv(ctx->rt, &hn, f->q, f->k, f->w, &t));
	}
	return rc ? rc : rt_failed(ctx, gpurt_rope_kv(ctx->rt, f->q, f->k, f->w, &t));
}
