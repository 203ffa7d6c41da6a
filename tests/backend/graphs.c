/*
 * Step regions (backend ABI 1.1, graph_begin / graph_end) against the
 * same calls made one by one, on every backend named on the command line
 * that has regions (others are skipped with a line saying why).
 *
 * Two contexts of one backend run the same small transformer-shaped step
 * (embed, rmsnorm, GEMMs, rope, kv_write, paged attention, add, glu,
 * scale, copy): one calls the operators directly, the other inside a
 * region. A prefill step is followed by decode steps whose key count
 * crosses a split-K boundary (GPU_ATTN_SPLIT = 256 keys), so the region
 * context replays captured steps, then has to capture anew when the
 * attention plan changes. After every step the activations and the KV
 * cache of the two contexts must agree bit for bit. The backend's log
 * (read through our own host services) must report replays and more than
 * one capture.
 *
 * Then the failure rules: a bad slot or attention table in a region is
 * reported by graph_end and nothing in the region runs; a bad call fails
 * itself and the region; upload/synchronize inside a region fail; nesting
 * and an unmatched graph_end are refused; a region after all that works.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/backend_loader.h"

#define VOCAB 50
#define D 64        /* model width */
#define HEADS 4
#define KV_HEADS 2
#define HD 16       /* head_dim */
#define KVD (KV_HEADS * HD)
#define BS 16       /* KV block size */
#define MAXB 24     /* blocks per sequence */
#define SEQS 2
#define NBLOCKS (SEQS * MAXB)
#define MAXROWS 260

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	failures++;
}

/* ---- a backend context with our own log ---- */

static unsigned long long captured, replays;
static bool capture_refused;
/* cpu.so runs regions without capturing them, and logs how many it ran
 * and how many runs of calls it fused (backends/cpu/region.c) */
static unsigned long long regions_run, groups, group_calls;

static void catch_log(void *host, enum loom_log_level level, const char *msg)
{
	const char *p = strstr(msg, "step graphs: ");
	const char *q = strstr(msg, "step regions: ");

	(void)host;
	if (p)
		sscanf(p, "step graphs: %llu captured, %llu replays", &captured, &replays);
	if (q)
		sscanf(q, "step regions: %llu run, %llu gemm groups of %llu calls", &regions_run,
		       &groups, &group_calls);
	if (level == LOOM_LOG_WARN && strstr(msg, "capture failed"))
		capture_refused = true;
}

static struct loom_backend_host host;

struct ctx {
	const struct loom_backend_ops *ops;
	struct loom_backend_ctx *c;
	struct loom_buffer *buf;
	char *base;
	size_t used;
};

/* Device memory of the context, carved from one buffer. */
static void *carve(struct ctx *x, size_t bytes)
{
	void *p = x->base + x->used;

	x->used += (bytes + 255) & ~(size_t)255;
	return p;
}

static void ctx_close(struct ctx *x)
{
	x->ops->buffer_free(x->c, x->buf);
	x->ops->destroy(x->c);
}

/* A context with one zeroed buffer of `bytes` (zeroed, so the two
 * contexts' snapshots agree outside the rows a step writes too). */
static int ctx_open(struct ctx *x, const struct loom_backend_ops *ops, size_t bytes)
{
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg) };
	void *zero = calloc(1, bytes);

	memset(x, 0, sizeof(*x));
	x->ops = ops;
	if (!zero || ops->create(&host, &cfg, &x->c)) {
		free(zero);
		return -1;
	}
	if (ops->buffer_alloc(x->c, bytes, &x->buf)) {
		ops->destroy(x->c);
		free(zero);
		return -1;
	}
	x->base = ops->buffer_addr(x->c, x->buf);
	if (ops->upload(x->c, x->base, zero, bytes)) {
		free(zero);
		ctx_close(x);
		return -1;
	}
	free(zero);
	return 0;
}


/* ---- the model and one step ---- */

struct model {
	float emb[VOCAB * D], norm[D], wq[HEADS * HD * D], wk[KVD * D], wv[KVD * D];
	float wo[D * HEADS * HD];
};

/* Device addresses of one context's weights, activations and inputs. */
struct dev {
	float *emb, *norm, *wq, *wk, *wv, *wo;
	float *x, *xn, *q, *k, *v, *att, *o, *out;
	float *kc, *vc;
	int32_t *ids, *pos, *slots, *q_start, *kv_len, *blocks;
};

struct step {
	int32_t rows, n_seqs;
	int32_t ids[MAXROWS], pos[MAXROWS], slots[MAXROWS];
	int32_t q_start[SEQS + 1], kv_len[SEQS], blocks[SEQS * MAXB];
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void fill(float *p, size_t n, float amp)
{
	for (size_t i = 0; i < n; i++)
		p[i] = amp * frand();
}

static int dev_setup(struct ctx *x, const struct model *m, struct dev *d)
{
	const struct loom_backend_ops *o = x->ops;
	size_t kv_bytes = (size_t)NBLOCKS * BS * KVD * sizeof(float);
	size_t row = MAXROWS * sizeof(float);
	int rc = 0;

	d->emb = carve(x, sizeof(m->emb)), d->norm = carve(x, sizeof(m->norm));
	d->wq = carve(x, sizeof(m->wq)), d->wk = carve(x, sizeof(m->wk));
	d->wv = carve(x, sizeof(m->wv)), d->wo = carve(x, sizeof(m->wo));
	d->x = carve(x, row * D), d->xn = carve(x, row * D), d->q = carve(x, row * HEADS * HD);
	d->k = carve(x, row * KVD), d->v = carve(x, row * KVD), d->att = carve(x, row * HEADS * HD);
	d->o = carve(x, row * D), d->out = carve(x, row * D);
	d->kc = carve(x, kv_bytes), d->vc = carve(x, kv_bytes);
	d->ids = carve(x, MAXROWS * 4), d->pos = carve(x, MAXROWS * 4);
	d->slots = carve(x, MAXROWS * 4), d->q_start = carve(x, (SEQS + 1) * 4);
	d->kv_len = carve(x, SEQS * 4), d->blocks = carve(x, SEQS * MAXB * 4);
	rc |= o->upload(x->c, d->emb, m->emb, sizeof(m->emb));
	rc |= o->upload(x->c, d->norm, m->norm, sizeof(m->norm));
	rc |= o->upload(x->c, d->wq, m->wq, sizeof(m->wq));
	rc |= o->upload(x->c, d->wk, m->wk, sizeof(m->wk));
	rc |= o->upload(x->c, d->wv, m->wv, sizeof(m->wv));
	rc |= o->upload(x->c, d->wo, m->wo, sizeof(m->wo));
	return rc;
}

static int upload_step(struct ctx *x, const struct dev *d, const struct step *s)
{
	const struct loom_backend_ops *o = x->ops;
	int rc = 0;

	rc |= o->upload(x->c, d->ids, s->ids, (size_t)s->rows * 4);
	rc |= o->upload(x->c, d->pos, s->pos, (size_t)s->rows * 4);
	rc |= o->upload(x->c, d->slots, s->slots, (size_t)s->rows * 4);
	rc |= o->upload(x->c, d->q_start, s->q_start, (size_t)(s->n_seqs + 1) * 4);
	rc |= o->upload(x->c, d->kv_len, s->kv_len, (size_t)s->n_seqs * 4);
	rc |= o->upload(x->c, d->blocks, s->blocks, (size_t)s->n_seqs * MAXB * 4);
	return rc;
}

static int gemm(struct ctx *x, const float *w, int64_t n, int64_t k, const float *in,
		float *out, int64_t rows)
{
	struct loom_gemm_args a = {
		.struct_size = sizeof(a), .w_type = LOOM_TYPE_F32, .m = rows, .n = n, .k = k,
		.w = w, .w_stride = (size_t)k * sizeof(float), .x = in, .x_stride = k,
		.y = out, .y_stride = n,
	};

	return x->ops->gemm(x->c, &a);
}

static int rope(struct ctx *x, const struct dev *d, float *t, int64_t heads, int64_t rows)
{
	struct loom_rope_args a = {
		.struct_size = sizeof(a), .mode = LOOM_ROPE_NORM, .x = t, .n_tokens = rows,
		.n_heads = heads, .head_dim = HD, .n_rot = HD, .row_stride = heads * HD,
		.pos = d->pos, .freq_base = 10000.0f, .freq_scale = 1.0f,
	};

	return x->ops->rope(x->c, &a);
}

/* The step's operator calls; the first failing status. */
static int step_calls(struct ctx *x, const struct dev *d, int64_t rows, int64_t n_seqs)
{
	const struct loom_backend_ops *o = x->ops;
	struct loom_kv_write_args kw = {
		.struct_size = sizeof(kw), .kcache = d->kc, .vcache = d->vc, .k = d->k, .v = d->v,
		.k_stride = KVD, .v_stride = KVD, .n_tokens = rows, .kv_dim = KVD,
		.slots = d->slots,
	};
	struct loom_attention_args at = {
		.struct_size = sizeof(at), .out = d->att, .q = d->q, .q_stride = HEADS * HD,
		.out_stride = HEADS * HD, .kcache = d->kc, .vcache = d->vc, .n_seqs = n_seqs,
		.n_heads = HEADS, .n_kv_heads = KV_HEADS, .head_dim = HD, .block_size = BS,
		.max_blocks = MAXB, .q_start = d->q_start, .kv_len = d->kv_len,
		.block_table = d->blocks, .scale = 0.25f,
	};
	int rc = o->embed(x->c, d->x, d->emb, LOOM_TYPE_F32, D * sizeof(float), VOCAB, D, d->ids,
			  rows);

	rc = rc ? rc : o->rmsnorm(x->c, d->xn, D, d->x, D, d->norm, rows, D, 1e-5f);
	rc = rc ? rc : gemm(x, d->wq, HEADS * HD, D, d->xn, d->q, rows);
	rc = rc ? rc : gemm(x, d->wk, KVD, D, d->xn, d->k, rows);
	rc = rc ? rc : gemm(x, d->wv, KVD, D, d->xn, d->v, rows);
	rc = rc ? rc : rope(x, d, d->q, HEADS, rows);
	rc = rc ? rc : rope(x, d, d->k, KV_HEADS, rows);
	rc = rc ? rc : o->kv_write(x->c, &kw);
	rc = rc ? rc : o->attention(x->c, &at);
	rc = rc ? rc : gemm(x, d->wo, D, HEADS * HD, d->att, d->o, rows);
	rc = rc ? rc : o->add(x->c, d->out, D, d->x, D, d->o, D, rows, rows, D);
	rc = rc ? rc : o->glu(x->c, LOOM_GLU_SILU, d->o, D, d->out, D, d->xn, D, rows, D);
	rc = rc ? rc : o->scale(x->c, d->o, D, rows, D, 0.5f);
	/* the last row next to the first, as the executor gathers outputs */
	rc = rc ? rc : o->copy(x->c, d->out + D, d->o + (size_t)(rows - 1) * D, D * sizeof(float));
	return rc;
}

static int run_region(struct ctx *x, const struct dev *d, int64_t rows, int64_t n_seqs)
{
	int rc = x->ops->graph_begin(x->c), end;

	if (rc)
		return rc;
	rc = step_calls(x, d, rows, n_seqs);
	end = x->ops->graph_end(x->c);
	return rc ? rc : end;
}

/* Downloads what a step leaves behind: activations and the whole cache. */
static float *snapshot(struct ctx *x, const struct dev *d, size_t *n)
{
	size_t act = (size_t)MAXROWS * D, kv = (size_t)NBLOCKS * BS * KVD;
	float *h = calloc(3 * act + 2 * kv, sizeof(float));
	int rc;

	*n = 3 * act + 2 * kv;
	if (!h)
		return NULL;
	rc = x->ops->synchronize(x->c);
	rc |= x->ops->download(x->c, h, d->out, act * 4);
	rc |= x->ops->download(x->c, h + act, d->o, act * 4);
	rc |= x->ops->download(x->c, h + 2 * act, d->att, act * 4);
	rc |= x->ops->download(x->c, h + 3 * act, d->kc, kv * 4);
	rc |= x->ops->download(x->c, h + 3 * act + kv, d->vc, kv * 4);
	if (rc) {
		free(h);
		return NULL;
	}
	return h;
}

/* Sequence s holds blocks s * MAXB .. in reverse order, so the block
 * table matters. */
static void set_tables(struct step *s, const int32_t *q_len, const int32_t *cached)
{
	int32_t r = 0;

	s->n_seqs = SEQS;
	for (int q = 0; q < SEQS; q++) {
		s->q_start[q] = r;
		s->kv_len[q] = cached[q] + q_len[q];
		for (int j = 0; j < MAXB; j++)
			s->blocks[q * MAXB + j] = q * MAXB + (MAXB - 1 - j);
		for (int32_t i = 0; i < q_len[q]; i++, r++) {
			int32_t p = cached[q] + i;

			s->ids[r] = (int32_t)((rng >> 20) % VOCAB);
			frand();
			s->pos[r] = p;
			s->slots[r] = s->blocks[q * MAXB + p / BS] * BS + p % BS;
		}
	}
	s->q_start[SEQS] = r;
	s->rows = r;
}

/* ---- the checks ---- */

/* With refuse, the runtime refuses captures (the emulator's
 * LOOM_GPUEMU_CAPTURE=0): the steps must run directly, equal all the
 * same, with one warning. */
static void check_replay(const struct loom_backend_ops *ops, const struct model *m, bool refuse)
{
	struct ctx plain, region;
	struct dev dp, dr;
	int32_t cached[SEQS] = { 0, 0 }, q_len[SEQS] = { 250, 9 };
	const size_t bytes = 8u << 20;
	struct step s;

	if (ctx_open(&plain, ops, bytes) || ctx_open(&region, ops, bytes)) {
		fail("%s: cannot create two contexts", ops->name);
		return;
	}
	if (dev_setup(&plain, m, &dp) || dev_setup(&region, m, &dr)) {
		fail("%s: setup failed", ops->name);
		return;
	}
	for (int step = 0; step < 14; step++) {
		size_t n = 0;
		float *a, *b;
		int rp, rr;

		set_tables(&s, q_len, cached);
		if (upload_step(&plain, &dp, &s) || upload_step(&region, &dr, &s)) {
			fail("%s: upload failed at step %d", ops->name, step);
			break;
		}
		rp = step_calls(&plain, &dp, s.rows, s.n_seqs);
		rr = run_region(&region, &dr, s.rows, s.n_seqs);
		a = snapshot(&plain, &dp, &n);
		b = snapshot(&region, &dr, &n);
		if (rp || rr || !a || !b)
			fail("%s: step %d: status %d directly, %d in a region", ops->name, step, rp, rr);
		else if (memcmp(a, b, n * sizeof(float)))
			fail("%s: step %d (%d rows, keys %d and %d): region results differ from "
			     "direct calls", ops->name, step, s.rows, s.kv_len[0], s.kv_len[1]);
		free(a);
		free(b);
		for (int q = 0; q < SEQS; q++) {
			cached[q] += q_len[q];
			q_len[q] = 1;
		}
	}
	ctx_close(&plain);
	captured = replays = regions_run = groups = group_calls = 0;
	ctx_close(&region); /* logs the graph counts */
	if (regions_run && !captured && !replays && !refuse) {
		/* cpu.so (regions run, never captured): each decode step (2
		 * rows) has the norm and Q/K/V as one group and the output
		 * projection with its residual add as another */
		if (regions_run != 14 || groups < 26 || group_calls < 6 * 13)
			fail("%s: %llu regions, %llu groups of %llu calls; want 14 regions and "
			     "at least 26 groups of 78 calls", ops->name, regions_run, groups,
			     group_calls);
		else
			printf("ok   %s: 14 steps in regions equal direct calls bit for bit "
			       "(%llu groups of %llu calls fused)\n", ops->name, groups, group_calls);
		return;
	}
	/* steps 1..5 and 7..13 repeat (the split count changes at 257 keys) */
	if (refuse && (captured || replays || !capture_refused))
		fail("%s: captures refused: %llu captures, %llu replays, %s warning",
		     ops->name, captured, replays, capture_refused ? "a" : "no");
	else if (!refuse && (captured < 2 || replays < 8))
		fail("%s: %llu captures and %llu replays over 14 steps; want at least 2 and 8",
		     ops->name, captured, replays);
	else if (regions_run && groups < 2) /* the GPU backends' GEMV groups (gpu_fuse.c) */
		fail("%s: %llu gemm groups in %llu regions; want fused launches in the steps run",
		     ops->name, groups, regions_run);
	else
		printf("ok   %s: 14 steps in regions equal direct calls bit for bit "
		       "(%llu captures, %llu replays%s; %llu gemm groups of %llu calls)\n",
		       ops->name, captured, replays,
		       refuse ? ", captures refused by the runtime" : "", groups, group_calls);
}

/* Expects status want from what; counts a failure otherwise. */
static void expect(const char *backend, const char *what, int got, int want)
{
	if (got != want)
		fail("%s: %s: status %d, want %d", backend, what, got, want);
}

static void check_failures(const struct loom_backend_ops *ops, const struct model *m)
{
	const char *n = ops->name;
	int32_t cached[SEQS] = { 0, 0 }, q_len[SEQS] = { 5, 3 };
	struct ctx x;
	struct dev d;
	struct step s;
	size_t sz;
	float *before, *after;

	if (ctx_open(&x, ops, 8u << 20) || dev_setup(&x, m, &d)) {
		fail("%s: cannot set up", n);
		return;
	}
	set_tables(&s, q_len, cached);
	s.slots[2] = -1;
	upload_step(&x, &d, &s);
	before = snapshot(&x, &d, &sz);
	expect(n, "graph_end with a negative slot", run_region(&x, &d, s.rows, s.n_seqs),
	       LOOM_ERR_INVALID);
	after = snapshot(&x, &d, &sz);
	if (!before || !after || memcmp(before, after, sz * sizeof(float)))
		fail("%s: a region refused at graph_end changed device memory", n);
	free(after);

	set_tables(&s, q_len, cached);
	s.kv_len[1] = 1; /* fewer keys than query rows */
	upload_step(&x, &d, &s);
	expect(n, "graph_end with kv_len < q_len", run_region(&x, &d, s.rows, s.n_seqs),
	       LOOM_ERR_INVALID);

	set_tables(&s, q_len, cached);
	upload_step(&x, &d, &s);
	expect(n, "graph_begin", x.ops->graph_begin(x.c), LOOM_OK);
	expect(n, "scale in a region", x.ops->scale(x.c, d.o, D, 2, D, 3.0f), LOOM_OK);
	expect(n, "rmsnorm with stride < n in a region",
	       x.ops->rmsnorm(x.c, d.xn, 2, d.x, D, d.norm, 2, D, 1e-5f), LOOM_ERR_INVALID);
	expect(n, "graph_end after a failed call", x.ops->graph_end(x.c), LOOM_ERR_INVALID);
	after = snapshot(&x, &d, &sz);
	if (!before || !after || memcmp(before, after, sz * sizeof(float)))
		fail("%s: a region with a failed call ran some of its calls", n);
	free(after);
	free(before);

	expect(n, "graph_begin", x.ops->graph_begin(x.c), LOOM_OK);
	expect(n, "nested graph_begin", x.ops->graph_begin(x.c), LOOM_ERR_INVALID);
	expect(n, "upload in a region", x.ops->upload(x.c, d.ids, s.ids, 4), LOOM_ERR_INVALID);
	expect(n, "synchronize in a region", x.ops->synchronize(x.c), LOOM_ERR_INVALID);
	expect(n, "graph_end after refused calls", x.ops->graph_end(x.c), LOOM_ERR_INVALID);
	expect(n, "graph_end outside a region", x.ops->graph_end(x.c), LOOM_ERR_INVALID);

	expect(n, "a good region afterwards", run_region(&x, &d, s.rows, s.n_seqs), LOOM_OK);
	expect(n, "an empty region", x.ops->graph_begin(x.c) || x.ops->graph_end(x.c), LOOM_OK);
	ctx_close(&x);
	if (!failures)
		printf("ok   %s: bad tables, bad calls and refused calls fail their region, "
		       "which runs nothing\n", n);
}

int main(int argc, char **argv)
{
	static struct model m;
	char err[4096];

	host = *loom_host_services();
	host.log = catch_log;
	fill(m.emb, VOCAB * D, 1.0f);
	fill(m.norm, D, 1.0f);
	fill(m.wq, sizeof(m.wq) / 4, 0.3f);
	fill(m.wk, sizeof(m.wk) / 4, 0.3f);
	fill(m.wv, sizeof(m.wv) / 4, 0.3f);
	fill(m.wo, sizeof(m.wo) / 4, 0.3f);
	for (int i = 1; i < argc; i++) {
		char path[4096];
		const struct loom_backend_ops *ops = loom_backend_load_ops(argv[i], path, sizeof(path),
									   err, sizeof(err));
		struct loom_backend_config cfg = { .struct_size = sizeof(cfg) };
		struct loom_backend_ctx *c = NULL;

		if (!ops) {
			printf("SKIP %s: not loadable (%s)\n", argv[i], err);
			continue;
		}
		if (ops->struct_size < offsetof(struct loom_backend_ops, graph_end) + sizeof(void *) ||
		    !ops->graph_begin) {
			printf("SKIP %s: no step regions (ABI 1.1 graph_begin/graph_end)\n", argv[i]);
			continue;
		}
		if (ops->create(&host, &cfg, &c)) {
			printf("SKIP %s: no device\n", argv[i]);
			continue;
		}
		ops->destroy(c);
		check_replay(ops, &m, false);
		check_failures(ops, &m);
		if (!strncmp(ops->name, "gpuemu", 6)) {
			setenv("LOOM_GPUEMU_CAPTURE", "0", 1);
			capture_refused = false;
			check_replay(ops, &m, true);
			unsetenv("LOOM_GPUEMU_CAPTURE");
		}
	}
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
