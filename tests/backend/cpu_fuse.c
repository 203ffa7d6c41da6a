/*
 * cpu.so's step regions run runs of decode calls as one pool task
 * (backends/cpu/region.c: gemms that read the same rows, each with the
 * add that consumes its output, or a gate/up pair with its GLU). Here a
 * transformer layer's calls run once directly and once inside a region,
 * on two contexts with the same inputs, and every buffer must agree bit
 * for bit: for each weight format a group takes (Q4_1 in GGUF layout and
 * packed, Q8_0 and the K-quants mixed in one group, F16, F32), 1 and 3
 * activation rows, 1 and 2 threads. cpu.so's log must count the groups
 * the layer has (4, of 14 calls), so a region that quietly fused nothing
 * fails. Then runs whose calls write what another of them reads: they
 * must not be fused (or only as far as is safe), and still agree. Last,
 * 400 random runs of those calls over buffers that alias by chance.
 *
 * The GPU backends (gpuemu.so, gpuemu64.so: backends/gpu/gpu_fuse.c) run
 * the same checks in fast and in exact mode: their groups are GEMVs
 * over the same rows with their adds (of one weight type in exact mode;
 * in fast mode of several, one launch a type, all reading the rows
 * quantized once), or a gate and up pair of one type with its GLU, in
 * one launch (no norm: 4 groups of 12 calls where the layer has one
 * type); they log the same counts.
 *
 * The GPU backends also run a layer's rope of q, rope of k and the
 * kv_write of k's rows as one launch (gpurt_rope_kv): check_rope_kv below
 * holds that to the calls one by one for every cache type, both rope
 * modes, partial rotation and frequency factors, over three steps (run
 * directly, captured, replayed), and runs where fusing would change the
 * result must not fuse.
 *
 * Usage: backend_cpu_fuse [backend.so ...] (cpu.so when none)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/backend_loader.h"
#include "plugin/host.h"

#define D 512   /* model width (K-quants need k % 256 == 0) */
#define KVD 128 /* K and V rows */
#define F 1024  /* FFN width */
#define MAXM 3

static int failures;
static unsigned long long regions_run, groups, group_calls, rkv_launches, rkv_ncalls, qx_reused;

static void catch_log(void *host, enum loom_log_level level, const char *msg)
{
	const char *q = strstr(msg, "step regions: ");
	const char *r = strstr(msg, "rope and kv_write: ");

	(void)host;
	(void)level;
	if (r)
		sscanf(r, "rope and kv_write: %llu launches of %llu calls", &rkv_launches,
		       &rkv_ncalls);
	if (q)
		sscanf(q, "step regions: %llu run, %llu gemm groups of %llu calls, %llu prefill",
		       &regions_run, &groups, &group_calls, &qx_reused);
}

static uint64_t rng;

static float frand(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* ---- weights ---- */

struct weight {
	uint32_t type;
	int64_t n, k;
	bool pack;
	void *bytes; /* GGUF layout */
	size_t stride;
};

/* Random n x k weights of `type`, quantized by the format plugins. */
static int make_weight(struct weight *w, uint32_t type, int64_t n, int64_t k, bool pack)
{
	float *f = malloc((size_t)(n * k) * sizeof(float));
	const struct loom_quant_format *qf = loom_format_get(type);

	*w = (struct weight){ .type = type, .n = n, .k = k, .pack = pack };
	if (!f)
		return -1;
	for (int64_t i = 0; i < n * k; i++)
		f[i] = 0.2f * frand();
	if (type == LOOM_TYPE_F32) {
		w->bytes = f;
		w->stride = (size_t)k * 4;
		return 0;
	}
	if (type == LOOM_TYPE_F16) {
		_Float16 *h = malloc((size_t)(n * k) * sizeof(*h));

		for (int64_t i = 0; h && i < n * k; i++)
			h[i] = (_Float16)f[i];
		free(f);
		w->bytes = h;
		w->stride = (size_t)k * 2;
		return h ? 0 : -1;
	}
	if (!qf) {
		free(f);
		return -1;
	}
	w->stride = (size_t)(k / qf->block_elems) * qf->block_bytes;
	w->bytes = malloc((size_t)n * w->stride);
	for (int64_t r = 0; w->bytes && r < n; r++)
		if (qf->from_float(f + r * k, (char *)w->bytes + (size_t)r * w->stride, k)) {
			free(f);
			return -1;
		}
	free(f);
	return w->bytes ? 0 : -1;
}

/* ---- one context and its buffers ---- */

struct bufs {
	float *x, *xn, *q, *k, *v, *p, *g, *u, *bq, *bk, *norm;
};

struct ctx {
	const struct loom_backend_ops *ops;
	struct loom_backend_ctx *c;
	struct loom_buffer *packed[8];
	const void *w[8];
	size_t ws[8];
	int n_packed;
	float *mem;
	struct bufs b;
};

static size_t bufs_floats(void)
{
	return (size_t)MAXM * (3 * D + 512 + 2 * KVD + 2 * F) + 512 + KVD + D + 64;
}

/* Carves the buffers and fills them from the seed (the same in both
 * contexts). */
static void bufs_fill(struct ctx *x, uint64_t seed)
{
	float *p = x->mem;
	size_t n = bufs_floats();

	rng = seed;
	for (size_t i = 0; i < n; i++)
		p[i] = frand();
	x->b.x = p, p += MAXM * D;
	x->b.xn = p, p += MAXM * D;
	x->b.q = p, p += MAXM * 512;
	x->b.k = p, p += MAXM * KVD;
	x->b.v = p, p += MAXM * KVD;
	x->b.p = p, p += MAXM * D;
	x->b.g = p, p += MAXM * F;
	x->b.u = p, p += MAXM * F;
	x->b.bq = p, p += 512;
	x->b.bk = p, p += KVD;
	x->b.norm = p;
}

static int ctx_open(struct ctx *x, const struct loom_backend_ops *ops,
		    const struct loom_backend_host *host, int threads, const struct weight *w,
		    int n_w)
{
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg), .n_threads = threads };

	memset(x, 0, sizeof(*x));
	x->ops = ops;
	x->mem = malloc(bufs_floats() * sizeof(float));
	if (!x->mem || ops->create(host, &cfg, &x->c))
		return -1;
	for (int i = 0; i < n_w; i++) {
		struct loom_weight_pack_args pa = { .struct_size = sizeof(pa), .type = w[i].type,
						    .n = w[i].n, .k = w[i].k, .src = w[i].bytes,
						    .src_stride = w[i].stride };
		size_t bytes;

		x->w[i] = w[i].bytes;
		x->ws[i] = w[i].stride;
		if (!w[i].pack)
			continue;
		if (ops->weight_pack(x->c, &pa, &x->packed[i], &bytes))
			return -1;
		x->w[i] = ops->buffer_addr(x->c, x->packed[i]);
		x->ws[i] = 0;
	}
	x->n_packed = n_w;
	return 0;
}

static void ctx_close(struct ctx *x)
{
	for (int i = 0; i < x->n_packed; i++)
		if (x->packed[i])
			x->ops->buffer_free(x->c, x->packed[i]);
	if (x->c)
		x->ops->destroy(x->c);
}

static int gemm(struct ctx *x, const struct weight *w, int i, const float *in, float *out,
		int64_t m)
{
	struct loom_gemm_args a = {
		.struct_size = sizeof(a), .w_type = w[i].type, .m = m, .n = w[i].n, .k = w[i].k,
		.w = x->w[i], .w_stride = x->ws[i], .x = in, .x_stride = w[i].k, .y = out,
		.y_stride = w[i].n, .w_packed = w[i].pack,
	};

	return x->ops->gemm(x->c, &a);
}

/* ---- the calls ---- */

enum { WQ, WK, WV, WO, WG, WU, WD, N_W };

/* A decode layer's calls but attention's: 4 groups of 14 calls. */
static int layer(struct ctx *x, const struct weight *w, int64_t m)
{
	const struct loom_backend_ops *o = x->ops;
	struct bufs *b = &x->b;
	int rc = o->rmsnorm(x->c, b->xn, D, b->x, D, b->norm, m, D, 1e-5f);

	rc = rc ? rc : gemm(x, w, WQ, b->xn, b->q, m);
	rc = rc ? rc : o->add(x->c, b->q, 512, b->q, 512, b->bq, 512, 1, m, 512);
	rc = rc ? rc : gemm(x, w, WK, b->xn, b->k, m);
	rc = rc ? rc : o->add(x->c, b->k, KVD, b->k, KVD, b->bk, KVD, 1, m, KVD);
	rc = rc ? rc : gemm(x, w, WV, b->xn, b->v, m);
	rc = rc ? rc : gemm(x, w, WO, b->q, b->p, m);
	rc = rc ? rc : o->add(x->c, b->x, D, b->x, D, b->p, D, m, m, D);
	rc = rc ? rc : o->rmsnorm(x->c, b->xn, D, b->x, D, b->norm, m, D, 1e-5f);
	rc = rc ? rc : gemm(x, w, WG, b->xn, b->g, m);
	rc = rc ? rc : gemm(x, w, WU, b->xn, b->u, m);
	rc = rc ? rc : o->glu(x->c, LOOM_GLU_SILU, b->g, F, b->g, F, b->u, F, m, F);
	rc = rc ? rc : gemm(x, w, WD, b->g, b->p, m);
	rc = rc ? rc : o->add(x->c, b->x, D, b->x, D, b->p, D, m, m, D);
	return rc;
}

/* Runs whose calls write what another reads; how many groups each may
 * make is `want` below. */
static int hazards(struct ctx *x, const struct weight *w, int64_t m, int which)
{
	const struct loom_backend_ops *o = x->ops;
	struct bufs *b = &x->b;
	int rc;

	switch (which) {
	case 0: /* the second gemm's output overlaps the first's */
		rc = gemm(x, w, WK, b->xn, b->q, m);
		return rc ? rc : gemm(x, w, WV, b->xn, b->q + 64, m);
	case 1: /* the add writes the gemm's input */
		rc = gemm(x, w, WO, b->xn, b->p, m);
		return rc ? rc : o->add(x->c, b->xn, D, b->xn, D, b->p, D, m, m, D);
	case 2: /* the GLU writes the rows gate and up read: gate and up
		 * only */
		rc = gemm(x, w, WG, b->xn, b->g, m);
		rc = rc ? rc : gemm(x, w, WU, b->xn, b->u, m);
		return rc ? rc : o->glu(x->c, LOOM_GLU_SILU, b->xn, F, b->g, F, b->u, F, m, F);
	case 3: /* the add reads what the next gemm writes: q and the add
		 * group, k alone */
		rc = gemm(x, w, WQ, b->xn, b->q, m);
		rc = rc ? rc : o->add(x->c, b->q, 512, b->q, 512, b->p, D, m, m, 512);
		return rc ? rc : gemm(x, w, WO, b->xn, b->p, m);
	case 4: /* the add's output overlaps the gemm's output elsewhere
		 * (its own inputs stay clear of it: a shifted in-place add has
		 * no defined result on a parallel backend) */
		rc = gemm(x, w, WK, b->xn, b->k, m);
		return rc ? rc : o->add(x->c, b->k + 1, KVD, b->g, KVD, b->bk, KVD, 1, m, KVD);
	case 5: /* a norm in place: the gemms only */
		rc = o->rmsnorm(x->c, b->xn, D, b->xn, D, b->norm, m, D, 1e-5f);
		rc = rc ? rc : gemm(x, w, WQ, b->xn, b->q, m);
		return rc ? rc : gemm(x, w, WK, b->xn, b->k, m);
	case 6: /* the add writes what the norm reads: norm and gemm only */
		rc = o->rmsnorm(x->c, b->xn, D, b->x, D, b->norm, m, D, 1e-5f);
		rc = rc ? rc : gemm(x, w, WO, b->xn, b->p, m);
		return rc ? rc : o->add(x->c, b->x, D, b->x, D, b->p, D, m, m, D);
	default: /* the add reads the norm's output: norm and gemm only */
		rc = o->rmsnorm(x->c, b->xn, D, b->x, D, b->norm, m, D, 1e-5f);
		rc = rc ? rc : gemm(x, w, WO, b->xn, b->p, m);
		return rc ? rc : o->add(x->c, b->q, 512, b->p, D, b->xn, D, m, m, D);
	}
}

/* Groups and grouped calls each case may make: in case 2 gate and up
 * still share a task, without the GLU; in case 3 q takes its add; in
 * case 5 the two gemms group without the norm, in cases 6 and 7 the norm
 * and the gemm without the add. */
#define N_HAZARDS 8
static const unsigned long long hazard_groups[N_HAZARDS] = { 0, 0, 1, 1, 0, 1, 1, 1 };
static const unsigned long long hazard_calls[N_HAZARDS] = { 0, 0, 2, 2, 0, 2, 2, 2 };
/* The GPU backends in fast mode (8-bit activations): a norm
 * joins the gemms it feeds (it quantizes their rows), in place or not, in
 * cases 5, 6 and 7 */
static const unsigned long long hazard_calls_q8[N_HAZARDS] = { 0, 0, 2, 2, 0, 3, 3, 3 };

/* ---- the checks ---- */

static bool same(const struct ctx *a, const struct ctx *b)
{
	return !memcmp(a->mem, b->mem, bufs_floats() * sizeof(float));
}

/* which < 0: the layer; else hazard case `which`. */
/* The groups and grouped calls a layer makes, the hazard cases' calls,
 * and the label of a run. */
struct want {
	unsigned long long groups, calls;
	const unsigned long long *hazard_calls;
	const char *mode;
};

static void check(const struct loom_backend_ops *ops, const struct loom_backend_host *host,
		  const char *label, const struct weight *w, int64_t m, int threads, int which,
		  const struct want *lw)
{
	struct ctx direct, region;
	unsigned long long want = which < 0 ? lw->groups : hazard_groups[which];
	unsigned long long want_calls = which < 0 ? lw->calls : lw->hazard_calls[which];
	int rd, rr;

	if (ctx_open(&direct, ops, host, threads, w, N_W) ||
	    ctx_open(&region, ops, host, threads, w, N_W)) {
		printf("FAIL %s: cannot set up the contexts\n", label);
		failures++;
		ctx_close(&direct);
		ctx_close(&region);
		free(direct.mem);
		free(region.mem);
		return;
	}
	bufs_fill(&direct, 7);
	bufs_fill(&region, 7);
	rd = which < 0 ? layer(&direct, w, m) : hazards(&direct, w, m, which);
	rr = region.ops->graph_begin(region.c);
	if (!rr) {
		int end;

		rr = which < 0 ? layer(&region, w, m) : hazards(&region, w, m, which);
		end = region.ops->graph_end(region.c);
		rr = rr ? rr : end;
	}
	ctx_close(&direct);
	regions_run = groups = group_calls = 0;
	ctx_close(&region); /* logs the counts */
	if (rd || rr) {
		printf("FAIL %s%s m=%lld t=%d case %d: status %d directly, %d in a region\n", label,
		       lw->mode, (long long)m, threads, which, rd, rr);
		failures++;
	} else if (!same(&direct, &region)) {
		printf("FAIL %s%s m=%lld t=%d case %d: a region's results differ from direct calls\n",
		       label, lw->mode, (long long)m, threads, which);
		failures++;
	} else if (regions_run != 1 || groups != want || group_calls != want_calls) {
		printf("FAIL %s%s m=%lld t=%d case %d: %llu regions, %llu groups of %llu calls; "
		       "want 1 region, %llu groups of %llu calls\n", label, lw->mode, (long long)m,
		       threads, which, regions_run, groups, group_calls, want, want_calls);
		failures++;
	}
	free(direct.mem);
	free(region.mem);
}

/* ---- prefill gemms that share quantized rows ---- */

/*
 * cpu.so's prefill GEMM (qgemm, 16 rows or more) quantizes its activation
 * rows; in a region the next gemm of the same rows takes them as they are
 * when only gemms ran between (backends/cpu/gemm.c, qx_memo_hit). The
 * calls below reuse them exactly twice (b after a, twice); a Q6_K gemm
 * (16-value blocks) between, a float gemm that writes the rows, and an add
 * that does must each make the next gemm quantize again, or its output
 * differs from the direct calls'.
 */
#define PM 32 /* prefill rows */
#define PN 128

enum { PA, PB, PC, PF, N_PW };

static int prefill_calls(struct ctx *x, const struct weight *w, float *mem)
{
	float *in = mem, *z = in + PM * D, *y = z + PM * D;
	int rc = gemm(x, w, PA, in, y, PM);

	rc = rc ? rc : gemm(x, w, PB, in, y + 1 * PM * PN, PM);  /* reuses */
	rc = rc ? rc : gemm(x, w, PC, in, y + 2 * PM * PN, PM);  /* Q6_K: its own */
	rc = rc ? rc : gemm(x, w, PA, in, y + 3 * PM * PN, PM);  /* Q4_K again */
	rc = rc ? rc : gemm(x, w, PF, z, in, PM);                /* writes the rows */
	rc = rc ? rc : gemm(x, w, PB, in, y + 4 * PM * PN, PM);
	rc = rc ? rc : x->ops->add(x->c, in, D, in, D, z, D, PM, PM, D); /* and again */
	rc = rc ? rc : gemm(x, w, PA, in, y + 5 * PM * PN, PM);
	rc = rc ? rc : gemm(x, w, PB, in, y + 6 * PM * PN, PM);  /* reuses */
	return rc;
}

static void check_prefill_quant(const struct loom_backend_ops *ops,
				const struct loom_backend_host *host)
{
	static const uint32_t type[N_PW] = { LOOM_TYPE_Q4_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q6_K,
					     LOOM_TYPE_F32 };
	const size_t floats = (size_t)PM * (2 * D + 7 * PN);
	struct weight w[N_PW];
	struct ctx x[2];
	int rc[2] = { -1, -1 };

	rng = 0x51ed2701ull;
	for (int i = 0; i < N_PW; i++)
		if (make_weight(&w[i], type[i], i == PF ? D : PN, D, type[i] != LOOM_TYPE_F32)) {
			printf("FAIL prefill rows: cannot make the weights\n");
			failures++;
			return;
		}
	for (int r = 0; r < 2; r++) {
		if (ctx_open(&x[r], ops, host, 2, w, N_PW)) {
			printf("FAIL prefill rows: cannot set up a context\n");
			failures++;
			return;
		}
		free(x[r].mem);
		x[r].mem = malloc(floats * sizeof(float));
		rng = 99;
		for (size_t i = 0; x[r].mem && i < floats; i++)
			x[r].mem[i] = frand();
	}
	if (x[0].mem && x[1].mem) {
		rc[0] = prefill_calls(&x[0], w, x[0].mem);
		rc[1] = ops->graph_begin(x[1].c);
		if (!rc[1]) {
			int end;

			rc[1] = prefill_calls(&x[1], w, x[1].mem);
			end = ops->graph_end(x[1].c);
			rc[1] = rc[1] ? rc[1] : end;
		}
	}
	ctx_close(&x[0]);
	qx_reused = 0;
	ctx_close(&x[1]); /* logs the count */
	if (rc[0] || rc[1]) {
		printf("FAIL prefill rows: status %d directly, %d in a region\n", rc[0], rc[1]);
		failures++;
	} else if (memcmp(x[0].mem, x[1].mem, floats * sizeof(float))) {
		printf("FAIL prefill rows: a region's results differ from direct calls\n");
		failures++;
	} else if (qx_reused != 2) {
		printf("FAIL prefill rows: %llu gemms reused quantized rows, want 2\n", qx_reused);
		failures++;
	} else {
		printf("ok   prefill rows: two gemms of 8 reuse quantized rows, the rest quantize "
		       "again; results equal direct calls bit for bit\n");
	}
	free(x[0].mem);
	free(x[1].mem);
	for (int i = 0; i < N_PW; i++)
		free(w[i].bytes);
}

/* ---- random runs ---- */

/*
 * Random runs of the calls a group takes (an add and the rmsnorm of its
 * output, gemms, adds, a GLU) over a few buffers, with outputs, inputs and operands drawn so that
 * they alias, overlap or stay apart by chance: each run directly and in a
 * region, then every buffer compared. The hand-written cases above name
 * the hazards we thought of; these look for the ones we did not.
 */
#define RS 1024  /* row stride of every buffer, floats */
#define RSLOTS 6 /* buffers, MAXM rows each */
#define RK 256   /* every gemm's k */
#define RUNS 400
#define RUNS_GPU 150 /* the emulator is slower: fewer on the GPU backends */

struct rcall {
	enum { R_NORM, R_GEMM, R_ADD, R_GLU } op;
	float *out, *a, *b;
	int w, brows1;
	int64_t n;
};

static float *rpick(float *mem, int slot)
{
	static const int offs[] = { 0, 0, 0, 1, 64 };

	return mem + (size_t)slot * MAXM * RS + offs[rng % 5];
}

/* A run of calls over mem; returns how many. */
static int rrun(float *mem, const struct weight *w, struct rcall *c)
{
	int n = 0, xs = (int)(frand() * 3 + 3) % RSLOTS, ng = 1 + (int)((frand() + 1) * 1.5);
	float *x = rpick(mem, xs), *y[3];
	int64_t yn[3];

	if (frand() > 0) { /* the rows come from a norm */
		float *in = rpick(mem, (xs + 1) % RSLOTS);

		if (frand() > 0.2f) { /* of rows an add makes (a residual add) */
			float *a = frand() > 0 ? in : rpick(mem, (int)(rng % RSLOTS));

			c[n++] = (struct rcall){ .op = R_ADD, .out = in, .a = a,
						 .b = rpick(mem, (int)((rng >> 8) % RSLOTS)),
						 .brows1 = frand() > 0, .n = RK };
		}
		c[n++] = (struct rcall){ .op = R_NORM, .out = x, .a = in, .n = RK };
		frand();
	}
	for (int g = 0; g < ng && g < 3; g++) {
		int ys = (xs + 1 + (int)((frand() + 1) * 2.5)) % RSLOTS;

		if (ys == xs)
			ys = (ys + 1) % RSLOTS;
		y[g] = rpick(mem, ys);
		c[n++] = (struct rcall){ .op = R_GEMM, .out = y[g], .a = x, .w = (int)(rng % 4) };
		yn[g] = w[c[n - 1].w].n;
		frand();
		if (frand() > 0.2f) { /* an add of this gemm's output */
			float *other = rpick(mem, (int)(rng % RSLOTS));
			float *outs[3] = { y[g], other, rpick(mem, (int)((rng >> 8) % RSLOTS)) };
			bool swap = frand() > 0;

			c[n++] = (struct rcall){ .op = R_ADD, .out = outs[rng % 3],
						 .a = swap ? other : y[g], .b = swap ? y[g] : other,
						 .brows1 = swap && frand() > 0, .n = yn[g] };
		}
	}
	if (ng >= 2 && yn[0] == yn[1] && frand() > -0.2f) {
		float *outs[3] = { y[0], y[1], rpick(mem, (int)(rng % RSLOTS)) };

		c[n++] = (struct rcall){ .op = R_GLU, .out = outs[(rng >> 4) % 3], .a = y[0],
					 .b = y[1], .n = yn[0] };
	}
	return n;
}

/* One call's inputs may equal its output (the ABI's "out may equal a")
 * or stay clear of it; a partial overlap, or a one-row operand that is
 * also the output's first row, has no defined result on a parallel
 * backend (rows and elements run in any order). Such an input is moved to
 * a slot the output does not touch: the runs still overlap one call's
 * output with another's inputs, which is what they are for. */
static float *legal_input(float *mem, const float *out, float *in, bool one_row)
{
	size_t slot = (size_t)MAXM * RS, so = (size_t)(out - mem) / slot;

	if ((size_t)(in - mem) / slot != so || (in == out && !one_row))
		return in;
	return mem + (so + 3) % RSLOTS * slot;
}

static void legalize(float *mem, struct rcall *c, int n)
{
	for (int i = 0; i < n; i++) {
		if (c[i].op != R_ADD && c[i].op != R_GLU)
			continue;
		c[i].a = legal_input(mem, c[i].out, c[i].a, false);
		c[i].b = legal_input(mem, c[i].out, c[i].b, c[i].op == R_ADD && c[i].brows1);
	}
}

static int rplay(struct ctx *x, const struct weight *w, const struct rcall *c, int n, int64_t m)
{
	const struct loom_backend_ops *o = x->ops;
	int rc = 0;

	for (int i = 0; i < n && !rc; i++) {
		const struct rcall *k = &c[i];
		struct loom_gemm_args g = {
			.struct_size = sizeof(g), .w_type = w[k->w].type, .m = m, .n = w[k->w].n,
			.k = RK, .w = x->w[k->w], .w_stride = x->ws[k->w], .x = k->a, .x_stride = RS,
			.y = k->out, .y_stride = RS,
		};

		switch (k->op) {
		case R_NORM:
			rc = o->rmsnorm(x->c, k->out, RS, k->a, RS, x->b.norm, m, k->n, 1e-5f);
			break;
		case R_GEMM:
			rc = o->gemm(x->c, &g);
			break;
		case R_ADD:
			rc = o->add(x->c, k->out, RS, k->a, RS, k->b, RS, k->brows1 ? 1 : m, m, k->n);
			break;
		default:
			rc = o->glu(x->c, LOOM_GLU_SILU, k->out, RS, k->a, RS, k->b, RS, m, k->n);
			break;
		}
	}
	return rc;
}

/* The random runs at 2 threads; the region context's log must count
 * groups in a good share of them. */
static void check_random(const struct loom_backend_ops *ops, const struct loom_backend_host *host,
			 int runs)
{
	static const uint32_t types[4] = { LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_0, LOOM_TYPE_F32,
					   LOOM_TYPE_Q4_K };
	static const int64_t ns[4] = { 256, 128, 256, 256 };
	size_t bytes = (size_t)RSLOTS * MAXM * RS * sizeof(float);
	float *md = malloc(bytes), *mr = malloc(bytes);
	struct weight w[4];
	struct ctx direct, region;
	int bad = 0, ran = 0;

	rng = 0x2545f4914f6cdd1dull;
	for (int i = 0; i < 4; i++)
		make_weight(&w[i], types[i], ns[i], RK, false);
	if (!md || !mr || ctx_open(&direct, ops, host, 2, w, 4) ||
	    ctx_open(&region, ops, host, 2, w, 4)) {
		printf("FAIL random runs: cannot set up\n");
		failures++;
		return;
	}
	bufs_fill(&direct, 3); /* for the norm weights */
	bufs_fill(&region, 3);
	for (int r = 0; r < runs && bad < 3; r++) {
		struct rcall c[16];
		uint64_t seed = rng;
		int64_t m = 1 + r % MAXM;
		int n, rd, rr, end;

		for (size_t i = 0; i < bytes / sizeof(float); i++)
			md[i] = frand();
		memcpy(mr, md, bytes);
		rng = seed;
		n = rrun(md, w, c);
		legalize(md, c, n);
		rd = rplay(&direct, w, c, n, m);
		/* the same run over the region context's copy */
		for (int i = 0; i < n; i++) {
			c[i].out = mr + (c[i].out - md);
			c[i].a = mr + (c[i].a - md);
			if (c[i].b)
				c[i].b = mr + (c[i].b - md);
		}
		rr = ops->graph_begin(region.c);
		if (!rr) {
			rr = rplay(&region, w, c, n, m);
			end = ops->graph_end(region.c);
			rr = rr ? rr : end;
		}
		ran++;
		if (rd || rr || memcmp(md, mr, bytes)) {
			printf("FAIL random run %d (%d calls, m=%lld): status %d / %d, %s\n", r, n,
			       (long long)m, rd, rr, rd || rr ? "a call failed" :
			       "a region's results differ from direct calls");
			failures++;
			bad++;
		}
	}
	ctx_close(&direct);
	regions_run = groups = group_calls = 0;
	ctx_close(&region);
	if (!bad && groups < (unsigned long long)ran / 4) {
		printf("FAIL random runs: only %llu groups in %d runs\n", groups, ran);
		failures++;
	} else if (!bad) {
		printf("ok   %d random runs of norms, gemms, adds and GLUs: regions equal direct "
		       "calls bit for bit (%llu groups of %llu calls fused)\n", ran, groups,
		       group_calls);
	}
	free(md);
	free(mr);
	free(direct.mem);
	free(region.mem);
	for (int i = 0; i < 4; i++)
		free(w[i].bytes);
}

/* ---- rope and kv_write (GPU backends) ---- */

/*
 * A layer's rope of q (4 heads), rope of k (2 heads) and kv_write of k
 * and v, on one context directly and on another inside a region, three
 * steps each (the region runs directly, then is captured, then replayed;
 * positions and slots change between steps), then every byte compared:
 * the rows, the position and slot tables, both caches. Hazards: runs the
 * fused launch would get wrong, which must not fuse (or fuse only k):
 *   1 kv_write reads rows the rope did not write (other rows),
 *   2 ... a shifted row set (it overlaps the rotated rows),
 *   3 v overlaps the rotated k rows,
 *   4 q's rope rotates k's rows too (k and its kv_write still fuse),
 *   5 the k cache's slots lie over q's rows.
 * With the head norms of Qwen3 and Gemma 3 (norms: rmsnorm of each head of
 * q and of k, in place, before the ropes) the five calls are one launch
 * (gpurt_norm_rope_kv); hazards where only the three after them fuse:
 *   6 q's norm weights lie in k's rows,
 *   7 k's norm normalizes other rows (k2).
 */
#define RHD 64                 /* head_dim */
#define RQS (4 * RHD + 8)      /* q row stride */
#define RKS (2 * RHD + 8)      /* k row stride */
#define RSLOT 8                /* cache slots */
#define RKV_FLOATS (MAXM * (RQS + 2 * RKS + 2 * RHD) + 16 + RHD / 2 + 4 * RSLOT * 2 * RHD + \
		    2 * RHD)

struct rkv_case {
	uint32_t type, mode;
	int64_t n_rot, m;
	bool factors;
	int hazard;
	bool norms; /* head norms first (then rows are unpadded: heads back to back) */
};

struct rkv {
	float *q, *k, *k2, *v, *ff, *kc, *vc, *qn, *kn;
	int32_t *pos, *slots;
};

static void rkv_carve(float *mem, struct rkv *b)
{
	b->q = mem, mem += MAXM * RQS;
	b->k = mem, mem += MAXM * RKS;
	b->k2 = mem, mem += MAXM * RKS;
	b->v = mem, mem += MAXM * 2 * RHD;
	b->pos = (int32_t *)mem, mem += 8;
	b->slots = (int32_t *)mem, mem += 8;
	b->ff = mem, mem += RHD / 2;
	b->kc = mem, mem += 2 * RSLOT * 2 * RHD; /* room for f32 rows */
	b->vc = mem, mem += 2 * RSLOT * 2 * RHD;
	b->qn = mem, mem += RHD;
	b->kn = mem;
}

/* Step s's positions and slots (distinct; hazard 5: inside q's rows). */
static void rkv_tables(struct rkv *b, const struct rkv_case *c, int s)
{
	for (int t = 0; t < MAXM; t++) {
		b->pos[t] = (int32_t)((t * 1499 + s * 977 + 5) % 4096);
		b->slots[t] = c->hazard == 5 ? (t + s) % MAXM : (t * 3 + s * 5) % RSLOT;
	}
}

/* The head norms of q and k, in place, as the engine makes them (rows of
 * head_dim); their rows unpadded, so q, k and the kv_write change stride. */
static int rkv_norms(const struct loom_backend_ops *o, struct loom_backend_ctx *x,
		     const struct rkv_case *c, const struct rkv *b, struct loom_rope_args *q,
		     struct loom_rope_args *k, struct loom_kv_write_args *w)
{
	const float *qw = c->hazard == 6 ? b->k + RHD / 2 : b->qn;
	float *kr = c->hazard == 7 ? b->k2 : b->k;
	int rc;

	q->row_stride = 4 * RHD;
	k->row_stride = w->k_stride = 2 * RHD;
	rc = o->rmsnorm(x, b->q, RHD, b->q, RHD, qw, c->m * 4, RHD, 1e-6f);
	return rc ? rc : o->rmsnorm(x, kr, RHD, kr, RHD, b->kn, c->m * 2, RHD, 1e-6f);
}

static int rkv_calls(const struct loom_backend_ops *o, struct loom_backend_ctx *x,
		     const struct rkv_case *c, const struct rkv *b)
{
	struct loom_rope_args q = {
		.struct_size = sizeof(q), .mode = c->mode, .x = b->q, .n_tokens = c->m,
		.n_heads = 4, .head_dim = RHD, .n_rot = c->n_rot, .row_stride = RQS,
		.pos = b->pos, .freq_base = 10000.0f, .freq_scale = 1.0f,
		.freq_factors = c->factors ? b->ff : NULL,
	};
	struct loom_rope_args k = q;
	struct loom_kv_write_args w = {
		.struct_size = sizeof(w), .kcache = c->hazard == 5 ? b->q : b->kc, .vcache = b->vc,
		.k = c->hazard == 1 ? b->k2 : c->hazard == 2 ? b->k + 4 : b->k,
		.v = c->hazard == 3 ? b->k + RHD : b->v, .k_stride = RKS,
		.v_stride = c->hazard == 3 ? RKS : 2 * RHD, .n_tokens = c->m, .kv_dim = 2 * RHD,
		.slots = b->slots, .kv_type = c->type,
	};
	int rc;

	k.x = b->k, k.n_heads = 2, k.row_stride = RKS;
	if (c->hazard == 4)
		q.x = b->k, q.n_heads = 2, q.row_stride = RKS;
	rc = c->norms ? rkv_norms(o, x, c, b, &q, &k, &w) : 0;
	rc = rc ? rc : o->rope(x, &q);
	rc = rc ? rc : o->rope(x, &k);
	return rc ? rc : o->kv_write(x, &w);
}

/* Launches and calls one run of the three calls fuses into. */
static void rkv_want(const struct rkv_case *c, bool fuse, unsigned long long *l,
		     unsigned long long *n)
{
	bool quant = c->type == LOOM_TYPE_Q8_0 || c->type == LOOM_TYPE_Q4_0;
	bool ok = fuse && (!quant || c->mode == LOOM_ROPE_NORM || c->n_rot % 64 == 0);

	*l = ok && (c->hazard == 0 || c->hazard == 4 || c->hazard >= 6);
	*n = !*l ? 0 : c->hazard == 4 ? 2 : c->norms && c->hazard == 0 ? 5 : 3;
}

static int rkv_steps(const struct loom_backend_ops *o, struct loom_backend_ctx *x, float *mem,
		     const struct rkv_case *c, bool region)
{
	struct rkv b;
	int rc = 0;

	rkv_carve(mem, &b);
	for (int s = 0; s < 3 && !rc; s++) {
		rkv_tables(&b, c, s);
		if (!region) {
			rc = rkv_calls(o, x, c, &b);
			continue;
		}
		rc = o->graph_begin(x);
		if (!rc) {
			int end;

			rc = rkv_calls(o, x, c, &b);
			end = o->graph_end(x);
			rc = rc ? rc : end;
		}
	}
	return rc;
}

static void check_rope_kv_case(const struct loom_backend_ops *ops,
			       const struct loom_backend_host *host, const struct rkv_case *c,
			       bool fuse, const char *mode)
{
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg), .n_threads = 1 };
	struct loom_backend_ctx *cd = NULL, *cr = NULL;
	size_t bytes = RKV_FLOATS * sizeof(float);
	float *md = malloc(bytes), *mr = malloc(bytes);
	unsigned long long want_l, want_n;
	int rd = -1, rr = -1;

	rng = 0x51ed2701u + (uint64_t)c->type * 7 + c->mode + (c->norms ? 1000 : 0);
	for (size_t i = 0; md && mr && i < RKV_FLOATS; i++)
		md[i] = mr[i] = frand();
	if (md && mr && !ops->create(host, &cfg, &cd) && !ops->create(host, &cfg, &cr)) {
		rd = rkv_steps(ops, cd, md, c, false);
		rr = rkv_steps(ops, cr, mr, c, true);
	}
	if (cd)
		ops->destroy(cd);
	rkv_launches = rkv_ncalls = regions_run = 0;
	if (cr)
		ops->destroy(cr); /* logs the counts */
	rkv_want(c, fuse, &want_l, &want_n);
	if (rd || rr) {
		printf("FAIL rope+kv_write%s type %u mode %u n_rot %lld m %lld hazard %d: status "
		       "%d directly, %d in regions\n", mode, c->type, c->mode, (long long)c->n_rot,
		       (long long)c->m, c->hazard, rd, rr);
		failures++;
	} else if (memcmp(md, mr, bytes)) {
		printf("FAIL rope+kv_write%s%s type %u mode %u n_rot %lld m %lld hazard %d: regions "
		       "differ from direct calls\n", c->norms ? " with head norms" : "", mode,
		       c->type, c->mode, (long long)c->n_rot, (long long)c->m, c->hazard);
		failures++;
	} else if (regions_run != 3 || rkv_launches != 2 * want_l || rkv_ncalls != 2 * want_n) {
		/* the capture runs the calls too; the replay is not counted */
		printf("FAIL rope+kv_write%s%s type %u mode %u n_rot %lld m %lld hazard %d: %llu "
		       "regions, %llu fused launches of %llu calls; want 3, %llu of %llu\n",
		       c->norms ? " with head norms" : "", mode,
		       c->type, c->mode, (long long)c->n_rot, (long long)c->m, c->hazard,
		       regions_run, rkv_launches, rkv_ncalls, 2 * want_l, 2 * want_n);
		failures++;
	}
	free(md);
	free(mr);
}

static void check_rope_kv(const struct loom_backend_ops *ops, const struct loom_backend_host *host,
			  const char *mode)
{
	static const uint32_t types[] = { LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_Q8_0,
					  LOOM_TYPE_Q4_0 };
	static const uint32_t modes[] = { LOOM_ROPE_NORM, LOOM_ROPE_NEOX };
	int before = failures, runs = 0;

	for (int ti = 0; ti < 4; ti++)
		for (int mi = 0; mi < 2; mi++)
			for (int64_t m = 1; m <= MAXM; m += 2)
				for (int v = 0; v < 2; v++, runs++) {
					/* v 1: partial rotation (32 of 64) with factors */
					struct rkv_case c = { types[ti], modes[mi], v ? 32 : RHD, m,
							      v == 1, 0, false };

					check_rope_kv_case(ops, host, &c, true, mode);
				}
	for (int h = 1; h <= 5; h++)
		for (int ti = 0; ti < 3; ti += 2, runs++) {
			struct rkv_case c = { types[ti], LOOM_ROPE_NEOX, RHD, MAXM, false, h, false };

			check_rope_kv_case(ops, host, &c, true, mode);
		}
	/* the head norms before them: every cache type, both modes, m 1 and
	 * 3, full and partial rotation; then the two hazards */
	for (int ti = 0; ti < 4; ti++)
		for (int mi = 0; mi < 2; mi++)
			for (int64_t m = 1; m <= MAXM; m += 2)
				for (int v = 0; v < 2; v++, runs++) {
					struct rkv_case c = { types[ti], modes[mi], v ? 32 : RHD, m,
							      v == 1, 0, true };

					check_rope_kv_case(ops, host, &c, true, mode);
				}
	for (int h = 6; h <= 7; h++)
		for (int ti = 0; ti < 4; ti++, runs++) {
			struct rkv_case c = { types[ti], LOOM_ROPE_NEOX, RHD, MAXM, false, h, true };

			check_rope_kv_case(ops, host, &c, true, mode);
		}
	/* LOOM_GPU_FUSE=0: the same bits, nothing fused */
	setenv("LOOM_GPU_FUSE", "0", 1);
	for (int ti = 0; ti < 4; ti++, runs++) {
		struct rkv_case c = { types[ti], LOOM_ROPE_NORM, RHD, MAXM, true, 0, false };

		check_rope_kv_case(ops, host, &c, false, mode);
		c.norms = true, runs++;
		check_rope_kv_case(ops, host, &c, false, mode);
	}
	unsetenv("LOOM_GPU_FUSE");
	if (failures == before)
		printf("ok   rope+kv_write%s: %d runs of 3 steps (f32, f16, q8_0, q4_0 caches; norm "
		       "and neox; partial rotation, factors; with and without the head norms; 7 "
		       "hazards; LOOM_GPU_FUSE=0) equal direct calls bit for bit, fused where "
		       "safe\n", mode, runs);
}

/* gpu[exact]: { groups, calls } the GPU backends make of the
 * layer in fast and exact mode (one weight type a group in exact mode,
 * several in fast mode, one launch a type on the same 8-bit rows; a
 * gemm with its add is a group, a lone one not; in fast mode a norm
 * joins the gemms of quantized formats it feeds); gpu_hazards: run the
 * unsafe runs
 * on the GPU (the first config runs them everywhere) */
struct config {
	const char *label;
	uint32_t type[N_W];
	bool pack;
	unsigned gpu[2][2];
	bool gpu_hazards;
	int only; /* packed layouts: 1 cpu.so's (q4_1), 2 the GPU's (q4_0, q8_0) */
};

#define ALL7(t) { t, t, t, t, t, t, t }
#define SAME(g, c) { { g, c }, { g, c } }
static const struct config configs[] = {
	{ "q4_1", ALL7(LOOM_TYPE_Q4_1), false, { { 4, 14 }, { 4, 12 } }, false, 0 },
	{ "q4_1 packed", ALL7(LOOM_TYPE_Q4_1), true, SAME(4, 12), false, 1 },
	/* 32-value blocks and K-quant super-blocks in one group (on the GPU
	 * in exact mode each of q, k, o and down with its add; in fast mode,
	 * where members of several types share the 8-bit rows, the norm with
	 * q, k, v and their adds, o, the norm with gate and up, but not their
	 * GLU (one launch a type), and down) */
	{ "k-quants and q8_0/q5_0", { LOOM_TYPE_Q4_K, LOOM_TYPE_Q8_0, LOOM_TYPE_Q6_K,
				      LOOM_TYPE_Q5_0, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K,
				      LOOM_TYPE_Q6_K }, false, { { 4, 13 }, { 4, 8 } }, false, 0 },
	/* on the GPU k, its add and v are one group in exact mode; in fast
	 * mode the norm, q, k, v and the adds, and the norm, gate and up */
	{ "q2_k/q3_k", { LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q2_K,
			 LOOM_TYPE_Q3_K, LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K }, false, { { 4, 13 }, { 4, 9 } },
	  false, 0 },
	{ "f16", ALL7(LOOM_TYPE_F16), false, SAME(4, 12), false, 0 },
	{ "f32", ALL7(LOOM_TYPE_F32), false, SAME(4, 12), false, 0 },
	/* formats of the GPU's integer kernels (fast mode), one a layer */
	{ "q4_0", ALL7(LOOM_TYPE_Q4_0), false, { { 4, 14 }, { 4, 12 } }, true, 0 },
	{ "q8_0", ALL7(LOOM_TYPE_Q8_0), false, { { 4, 14 }, { 4, 12 } }, false, 0 },
	{ "q4_k", ALL7(LOOM_TYPE_Q4_K), false, { { 4, 14 }, { 4, 12 } }, false, 0 },
	{ "q6_k", ALL7(LOOM_TYPE_Q6_K), false, { { 4, 14 }, { 4, 12 } }, false, 0 },
	/* the GPU's packed layouts (gpu_pack.c): the groups of the GGUF layout */
	{ "q4_0 packed", ALL7(LOOM_TYPE_Q4_0), true, { { 4, 14 }, { 4, 12 } }, false, 2 },
	{ "q8_0 packed", ALL7(LOOM_TYPE_Q8_0), true, { { 4, 14 }, { 4, 12 } }, false, 2 },
	{ "q6_k packed", ALL7(LOOM_TYPE_Q6_K), true, { { 4, 14 }, { 4, 12 } }, false, 2 },
};

/* Rows and columns of each weight (enum order). */
static const int64_t w_n[N_W] = { 512, KVD, KVD, D, F, F, D };
static const int64_t w_k[N_W] = { D, D, D, 512, D, D, F };

/* Every config's layer (and for the first the unsafe runs), then the
 * random runs, on one backend in the mode set in the environment. */
static void check_backend(const struct loom_backend_ops *ops, const struct loom_backend_host *host,
			  bool gpu, bool exact, const char *mode)
{
	for (size_t c = 0; c < sizeof(configs) / sizeof(configs[0]); c++) {
		const struct config *cf = &configs[c];
		const bool hazards = c == 0 || (gpu && cf->gpu_hazards);
		const struct want lw = {
			gpu ? cf->gpu[exact][0] : 4, gpu ? cf->gpu[exact][1] : 14,
			gpu && !exact ? hazard_calls_q8 : hazard_calls, mode,
		};
		struct weight w[N_W];
		bool ok = true;
		int before = failures;

		if ((cf->pack && !ops->weight_pack) || (cf->only && cf->only != (gpu ? 2 : 1)))
			continue;
		rng = 0x9e3779b97f4a7c15ull + c;
		for (int i = 0; i < N_W; i++)
			if (make_weight(&w[i], cf->type[i], w_n[i], w_k[i], cf->pack))
				ok = false;
		if (!ok) {
			printf("FAIL %s: cannot make the weights\n", cf->label);
			failures++;
			continue;
		}
		/* threads: cpu.so's pool; the GPU backends ignore them */
		for (int64_t m = 1; m <= MAXM; m += 2)
			for (int t = 1; t <= (gpu ? 1 : 2); t++) {
				check(ops, host, cf->label, w, m, t, -1, &lw);
				for (int h = 0; h < N_HAZARDS && hazards; h++)
					check(ops, host, cf->label, w, m, t, h, &lw);
			}
		if (failures == before)
			printf("ok   %s%s: a layer in a region equals direct calls bit for bit "
			       "(%llu groups of %llu calls; m 1 and 3)%s\n", cf->label, mode,
			       lw.groups, lw.calls, hazards ? "; 8 unsafe runs left apart" : "");
		for (int i = 0; i < N_W; i++)
			free(w[i].bytes);
	}
	check_random(ops, host, gpu ? RUNS_GPU : RUNS);
}

int main(int argc, char **argv)
{
	struct loom_backend_host host = *loom_host_services();
	char err[4096], path[4096];

	setvbuf(stdout, NULL, _IOLBF, 0);
	/* the test decides the mode: fast, fused */
	unsetenv("LOOM_CPU_EXACT");
	unsetenv("LOOM_CPU_FUSE");
	unsetenv("LOOM_GPU_FUSE");
	host.log = catch_log;
	if (loom_formats_init(err, sizeof(err))) {
		printf("FAIL no format plugins: %s\n", err);
		return 1;
	}
	for (int a = 1; a < (argc > 1 ? argc : 2); a++) {
		const char *name = argc > 1 ? argv[a] : "cpu.so";
		const struct loom_backend_ops *ops =
			loom_backend_load_ops(name, path, sizeof(path), err, sizeof(err));
		const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
		bool gpu = !strncmp(base, "gpu", 3); /* gpuemu.so, gpuemu64.so or a path */

		if (!ops || !ops->graph_begin || (!gpu && !ops->weight_pack)) {
			printf("FAIL %s: %s\n", name, ops ? "no step regions or weight_pack" : err);
			failures++;
			continue;
		}
		if (!gpu) {
			check_backend(ops, &host, false, false, "");
			check_prefill_quant(ops, &host);
			continue;
		}
		/* GPU backends in both modes: 8-bit activations, then f32 */
		setenv("LOOM_GPU_EXACT", "0", 1);
		check_backend(ops, &host, true, false, " (fast)");
		check_rope_kv(ops, &host, " (fast)");
		setenv("LOOM_GPU_EXACT", "1", 1);
		check_backend(ops, &host, true, true, " (exact)");
		check_rope_kv(ops, &host, " (exact)");
	}
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
