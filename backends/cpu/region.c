/*
 * Step regions (backend ABI 1.1) in cpu.so.
 *
 * graph_begin opens a region; each operator call then checks its arguments
 * as it would outside one and, instead of running, is kept here (the call
 * struct holds copies of its scalars and argument structs, and the same
 * addresses). graph_end runs the kept calls in order. A call that fails
 * fails the region: graph_end then runs nothing and returns that status,
 * and upload, download, synchronize, buffer_alloc and buffer_free are
 * refused inside a region, as the ABI says.
 *
 * What a region buys on a CPU is the view ahead. A decode step makes each
 * of its GEMVs a pool task of its own, and between two of them the caller
 * runs the small ops (an add, a GLU) alone while the other threads wait:
 * at 2 threads that hand-off costs about 2 us a task, against GEMVs of
 * 10-25 us. graph_end finds, in the kept calls:
 *   - gemms that read the same activation rows (a layer's Q, K and V; its
 *     gate and up),
 *   - the add that consumes a gemm's output right after it (the residual
 *     add after the output and down projections, a bias add),
 *   - the GLU of a gate and up pair,
 *   - the rmsnorm that made the shared rows (every thread normalizes them
 *     itself; one also writes them out),
 * and runs each such run of calls as one pool task (cpu_gemm_group in
 * gemm.c). That is worth about 10 % where a model's GEMVs are short
 * (weights in cache) and little where they stream from memory
 * (docs/BENCHMARKS.md). The grouped calls compute every element with the same function
 * and operands as the calls one by one; only the order in which elements
 * are produced changes. So a region's results equal direct calls bit for
 * bit, which tests/backend/graphs.c and tests/backend/cpu_fuse.c check. A
 * run is grouped only when no call of it writes what another of its calls
 * reads (beyond an add or GLU that updates its own input in place).
 * LOOM_CPU_FUSE=0 keeps regions but runs every call on its own, for
 * comparisons.
 *
 * Prefill gemms (qgemm, 16 rows or more) are not grouped, but one that
 * reads the rows the gemm before it quantized, with only gemms run in
 * between and none of them writing those rows, takes the quantized rows
 * as they are (gemm.c, qx_memo_hit: a layer's Q, K and V; its gate and
 * up): about 1.5 % of a 1B-shaped Q4_K_M pp64 at 2 threads.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "../common/fuse_io.h"

_Static_assert(CPU_GROUP_MAX <= FUSE_GROUP_MAX, "group_io holds every member");

#define FIRST_CAP 256

void cpu_region_copy_args(void *dst, size_t dst_size, const void *src)
{
	uint32_t size;

	memcpy(&size, src, sizeof(size)); /* every argument struct starts with it */
	if (size > dst_size)
		size = (uint32_t)dst_size;
	memset(dst, 0, dst_size);
	memcpy(dst, src, size);
	memcpy(dst, &size, sizeof(size));
}

int cpu_region_record(struct loom_backend_ctx *ctx, const struct cpu_call *c)
{
	struct cpu_region *rg = &ctx->rg;

	if (rg->n == rg->cap) {
		size_t cap = rg->cap ? rg->cap * 2 : FIRST_CAP;
		struct cpu_call *p;

		if (cap > SIZE_MAX / sizeof(*p))
			return LOOM_ERR_NOMEM;
		p = realloc(rg->calls, cap * sizeof(*p));
		if (!p)
			return LOOM_ERR_NOMEM;
		rg->calls = p;
		rg->cap = cap;
	}
	rg->calls[rg->n++] = *c;
	return LOOM_OK;
}

void cpu_region_free(struct loom_backend_ctx *ctx)
{
	cpu_log(ctx, LOOM_LOG_DEBUG,
		"cpu: step regions: %llu run, %llu gemm groups of %llu calls, %llu prefill gemms "
		"reused quantized rows",
		ctx->rg.regions, ctx->rg.groups, ctx->rg.group_calls, ctx->rg.qx_reused);
	free(ctx->rg.calls);
	ctx->rg.calls = NULL;
	ctx->rg.n = ctx->rg.cap = 0;
}

int cpu_region_noted(struct loom_backend_ctx *ctx, int rc)
{
	if (rc && ctx && ctx->rg.open && !ctx->rg.rc)
		ctx->rg.rc = rc;
	return rc;
}

bool cpu_region_refuses(struct loom_backend_ctx *ctx, const char *what)
{
	if (!ctx || !ctx->rg.open)
		return false;
	cpu_log(ctx, LOOM_LOG_ERROR, "cpu: %s inside a step region", what);
	cpu_region_noted(ctx, LOOM_ERR_INVALID);
	return true;
}

int cpu_graph_begin(struct loom_backend_ctx *ctx)
{
	if (!ctx || ctx->rg.open)
		return LOOM_ERR_INVALID;
	ctx->rg.open = true;
	ctx->rg.rc = LOOM_OK;
	ctx->rg.n = 0;
	return LOOM_OK;
}

/* ---- finding groups ---- */

static struct span weight_span(const struct loom_gemm_args *a)
{
	struct span s = { (uintptr_t)a->w, (uintptr_t)a->w };

	if (a->n > 0)
		s.hi = s.lo + cpu_gemm_w_bytes(a);
	return s;
}

/* Joins gemm a to the group when it reads the same rows and writes
 * nothing the group reads or writes. */
static bool join_gemm(const struct loom_backend_ctx *ctx, struct group_io *io,
		      struct cpu_group *g, const struct loom_gemm_args *a)
{
	const struct loom_gemm_args *first = g->n ? g->gemm[0] : a;
	struct span y = rows_span(a->y, a->m, a->y_stride, a->n), w = weight_span(a);
	int i = io->n;

	if (g->n == CPU_GROUP_MAX || !cpu_gemm_groupable(ctx, a) || a->m != first->m ||
	    a->k != first->k || a->x != first->x || a->x_stride != first->x_stride)
		return false;
	if (!g->n)
		io->x = rows_span(a->x, a->m, a->x_stride, a->k);
	if (overlap(y, io->x) || overlap(y, w) || !disjoint_from_writes(io, y, -1) ||
	    !disjoint_from_reads(io, y, -1) || !disjoint_from_writes(io, w, -1) ||
	    (g->norm && overlap(w, io->x)))
		return false;
	io->w[i] = w;
	io->y[i] = io->out[i] = y;
	io->other[i] = (struct span){ 0, 0 };
	io->n++;
	g->gemm[g->n] = a;
	g->add[g->n] = NULL;
	g->n++;
	return true;
}

/* Attaches add d to the group's last gemm when it adds that gemm's whole
 * output (as a or as b) to an operand nothing else in the group writes. */
static bool join_add(struct group_io *io, struct cpu_group *g, const struct cpu_add_args *d)
{
	const struct loom_gemm_args *m = g->gemm[g->n - 1];
	int i = io->n - 1;
	bool y_is_a = same_rows(d->a, d->a_stride, m->y, m->y_stride);
	bool y_is_b = d->b_rows == d->rows && same_rows(d->b, d->b_stride, m->y, m->y_stride);
	const float *op = y_is_a ? d->b : d->a;
	int64_t op_stride = y_is_a ? d->b_stride : d->a_stride;
	int64_t op_rows = y_is_a ? d->b_rows : d->rows;
	struct span out = rows_span(d->out, d->rows, d->out_stride, d->n);
	struct span other = rows_span(op, op_rows, op_stride, d->n);

	if (g->glu || g->add[g->n - 1] || d->rows != m->m || d->n != m->n || (!y_is_a && !y_is_b))
		return false;
	/* the other operand: read, never written by another member, nor
	 * the norm's output (written by one thread while others run) */
	if (!disjoint_from_writes(io, other, i) || overlap(other, io->y[i]) ||
	    (g->norm && overlap(other, io->x)))
		return false;
	/* the output: y itself, or rows that nothing else touches, or the
	 * other operand exactly (x += p) */
	if (!same_rows(d->out, d->out_stride, m->y, m->y_stride)) {
		if (overlap(out, io->y[i]) || !disjoint_from_writes(io, out, i) ||
		    !disjoint_from_reads(io, out, -1))
			return false;
		if (overlap(out, other) &&
		    !(same_rows(d->out, d->out_stride, op, op_stride) && op_rows == d->rows))
			return false;
	}
	io->out[i] = out;
	io->other[i] = other;
	g->add[g->n - 1] = d;
	return true;
}

/* Attaches GLU u to a group of exactly a gate and an up gemm. */
static bool join_glu(struct group_io *io, struct cpu_group *g, const struct cpu_glu_args *u)
{
	const struct loom_gemm_args *gate = g->gemm[0], *up = g->gemm[1]; /* or the reverse */
	struct span out = rows_span(u->out, u->rows, u->out_stride, u->n);

	if (g->n != 2 || g->add[0] || g->add[1] || gate->n != up->n || u->n != gate->n ||
	    u->rows != gate->m)
		return false;
	/* the host may have made up before gate: the task computes both */
	if (!(same_rows(u->gate, u->gate_stride, gate->y, gate->y_stride) &&
	      same_rows(u->up, u->up_stride, up->y, up->y_stride)) &&
	    !(same_rows(u->gate, u->gate_stride, up->y, up->y_stride) &&
	      same_rows(u->up, u->up_stride, gate->y, gate->y_stride)))
		return false;
	/* in place over gate or up, or into rows nothing else touches */
	if (!same_rows(u->out, u->out_stride, gate->y, gate->y_stride) &&
	    !same_rows(u->out, u->out_stride, up->y, up->y_stride) &&
	    (!disjoint_from_writes(io, out, -1) || !disjoint_from_reads(io, out, -1)))
		return false;
	g->glu = u;
	return true;
}

/* Takes norm r into the group when it makes the rows gemm a reads, into
 * rows apart from what it reads (every thread normalizes the rows itself
 * while the first chunk's thread writes them out). */
static bool join_norm(struct group_io *io, struct cpu_group *g, const struct cpu_rmsnorm_args *r,
		      const struct loom_gemm_args *a)
{
	struct span y = rows_span(r->y, r->rows, r->y_stride, r->n);

	if (a->x != r->y || a->x_stride != r->y_stride || a->m != r->rows || a->k != r->n)
		return false;
	io->norm_x = rows_span(r->x, r->rows, r->x_stride, r->n);
	io->norm_w = rows_span(r->w, 1, r->n, r->n);
	if (overlap(y, io->norm_x) || overlap(y, io->norm_w))
		return false;
	g->norm = r;
	return true;
}

/* The calls from c on that run as one group: how many (0: none). */
static size_t find_group(const struct loom_backend_ctx *ctx, const struct cpu_call *c, size_t n,
			 struct cpu_group *g)
{
	struct group_io io = { .n = 0 };
	size_t i = 0;

	memset(g, 0, sizeof(*g));
	if (n >= 2 && c[0].op == CPU_CALL_RMSNORM && c[1].op == CPU_CALL_GEMM &&
	    join_norm(&io, g, &c[0].u.rmsnorm, &c[1].u.gemm))
		i = 1;
	while (i < n && c[i].op == CPU_CALL_GEMM && join_gemm(ctx, &io, g, &c[i].u.gemm)) {
		i++;
		if (i < n && c[i].op == CPU_CALL_ADD && join_add(&io, g, &c[i].u.add))
			i++;
	}
	if (i < n && c[i].op == CPU_CALL_GLU && join_glu(&io, g, &c[i].u.glu))
		i++;
	/* a lone gemm gains nothing from being a group, a norm without one
	 * runs as it is */
	return i >= 2 && g->n ? i : 0;
}

/* ---- running the calls ---- */

static int run_call(struct loom_backend_ctx *ctx, const struct cpu_call *c)
{
	switch (c->op) {
	case CPU_CALL_GEMM:
		return cpu_gemm(ctx, &c->u.gemm);
	case CPU_CALL_EMBED:
		return cpu_embed(ctx, c->u.embed.out, c->u.embed.table, c->u.embed.type,
				 c->u.embed.row_bytes, c->u.embed.n_rows, c->u.embed.dim,
				 c->u.embed.ids, c->u.embed.n_ids);
	case CPU_CALL_RMSNORM:
		return cpu_rmsnorm(ctx, c->u.rmsnorm.y, c->u.rmsnorm.y_stride, c->u.rmsnorm.x,
				   c->u.rmsnorm.x_stride, c->u.rmsnorm.w, c->u.rmsnorm.rows,
				   c->u.rmsnorm.n, c->u.rmsnorm.eps);
	case CPU_CALL_ROPE:
		return cpu_rope(ctx, &c->u.rope);
	case CPU_CALL_GLU:
		return cpu_glu(ctx, c->u.glu.kind, c->u.glu.out, c->u.glu.out_stride, c->u.glu.gate,
			       c->u.glu.gate_stride, c->u.glu.up, c->u.glu.up_stride, c->u.glu.rows,
			       c->u.glu.n);
	case CPU_CALL_ADD:
		return cpu_add(ctx, c->u.add.out, c->u.add.out_stride, c->u.add.a, c->u.add.a_stride,
			       c->u.add.b, c->u.add.b_stride, c->u.add.b_rows, c->u.add.rows,
			       c->u.add.n);
	case CPU_CALL_SCALE:
		return cpu_scale(ctx, c->u.scale.x, c->u.scale.stride, c->u.scale.rows,
				 c->u.scale.n, c->u.scale.s);
	case CPU_CALL_SOFTCAP:
		return cpu_softcap(ctx, c->u.scale.x, c->u.scale.stride, c->u.scale.rows,
				   c->u.scale.n, c->u.scale.s);
	case CPU_CALL_KV_WRITE:
		return cpu_kv_write(ctx, &c->u.kv_write);
	case CPU_CALL_ATTENTION:
		return cpu_attention(ctx, &c->u.attention);
	case CPU_CALL_COPY:
		memmove(c->u.copy.dst, c->u.copy.src, c->u.copy.n);
		return LOOM_OK;
	case CPU_CALL_MOE:
		return cpu_moe(ctx, &c->u.moe);
	}
	return LOOM_ERR_INVALID;
}

/* A kept gemm whose output lands on the rows gemm.c keeps quantized
 * changes them. */
static void memo_written(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	const struct cpu_qx_memo *q = &ctx->qmemo;

	if (q->valid && overlap(rows_span(a->y, a->m, a->y_stride, a->n),
				rows_span(q->x, q->m, q->x_stride, q->k)))
		ctx->qmemo.valid = false;
}

int cpu_graph_end(struct loom_backend_ctx *ctx)
{
	struct cpu_region *rg;
	int rc;

	if (!ctx || !ctx->rg.open)
		return LOOM_ERR_INVALID;
	rg = &ctx->rg;
	rg->open = false; /* the calls below run */
	rc = rg->rc;
	for (size_t i = 0; !rc && i < rg->n;) {
		struct cpu_group g;
		size_t used = rg->fuse ? find_group(ctx, rg->calls + i, rg->n - i, &g) : 0;

		if (used) {
			ctx->qmemo.valid = false;
			rc = cpu_gemm_group(ctx, &g);
			rg->groups++;
			rg->group_calls += used;
			i += used;
		} else {
			/* any other call may write the rows a gemm quantized */
			rg->in_gemm = rg->calls[i].op == CPU_CALL_GEMM;
			if (!rg->in_gemm)
				ctx->qmemo.valid = false;
			rc = run_call(ctx, &rg->calls[i]);
			if (rg->in_gemm)
				memo_written(ctx, &rg->calls[i].u.gemm);
			rg->in_gemm = false;
			i++;
		}
	}
	ctx->qmemo.valid = false;
	rg->regions++;
	rg->n = 0;
	return rc;
}

/* ---- the ops table's slots that are not operators ---- */

int cpu_rg_copy(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	struct cpu_call c = { .op = CPU_CALL_COPY };

	if (!ctx || (n && (!dst || !src)))
		return cpu_region_noted(ctx, LOOM_ERR_INVALID);
	if (!n)
		return LOOM_OK;
	if (!ctx->rg.open) {
		memmove(dst, src, n);
		return LOOM_OK;
	}
	c.u.copy.dst = dst, c.u.copy.src = src, c.u.copy.n = n;
	return cpu_region_noted(ctx, cpu_region_record(ctx, &c));
}

int cpu_rg_transfer(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	if (!ctx || (n && (!dst || !src)))
		return LOOM_ERR_INVALID;
	if (cpu_region_refuses(ctx, "upload or download"))
		return LOOM_ERR_INVALID;
	if (n)
		memmove(dst, src, n);
	return LOOM_OK;
}

int cpu_rg_synchronize(struct loom_backend_ctx *ctx)
{
	if (!ctx || cpu_region_refuses(ctx, "synchronize"))
		return LOOM_ERR_INVALID;
	return LOOM_OK;
}
