/*
 * gpu_region.c: step regions (backend ABI 1.1, graph_begin / graph_end)
 * for the GPU backends, and the graphs captured from them.
 *
 * Inside a region the operators only record their calls (gpu.c checks
 * their arguments first). graph_end prepares all of them at once (one
 * batch of table downloads for the whole step, see prepare_calls), then:
 *  - replays a captured graph whose calls and attention plans are those
 *    of this region byte for byte;
 *  - else captures the region, runs the capture and keeps it, if the same
 *    region was seen before (so one-off prefill shapes are not captured);
 *  - else runs the calls directly.
 * Capture and replay give the same bits as direct calls: the same kernels
 * with the same arguments and work items. A capture the runtime refuses
 * turns graphs off for the context (with a warning); the step still runs.
 */
#include <stdlib.h>
#include <string.h>

#include "gpu_ctx.h"

int refused_in_region(struct loom_backend_ctx *ctx, const char *what)
{
	gpu_log(ctx->host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": %s inside a step region", what);
	if (!ctx->region_rc)
		ctx->region_rc = LOOM_ERR_INVALID;
	return LOOM_ERR_INVALID;
}

int region_add(struct loom_backend_ctx *ctx, const struct call *c)
{
	if (ctx->n_calls == ctx->calls_cap) {
		int64_t cap = ctx->calls_cap ? 2 * ctx->calls_cap : 256;
		struct call *calls = realloc(ctx->calls, (size_t)cap * sizeof(*calls));
		struct attn_plan *plans;

		if (calls)
			ctx->calls = calls;
		plans = calls ? realloc(ctx->plans, (size_t)cap * sizeof(*plans)) : NULL;
		if (!plans) {
			ctx->region_rc = LOOM_ERR_NOMEM;
			return LOOM_ERR_NOMEM;
		}
		ctx->plans = plans;
		ctx->calls_cap = cap;
	}
	memcpy(&ctx->calls[ctx->n_calls], c, sizeof(*c));
	memset(&ctx->plans[ctx->n_calls], 0, sizeof(ctx->plans[0]));
	ctx->n_calls++;
	return LOOM_OK;
}

/* ---- captured graphs ---- */

static void entry_clear(struct loom_backend_ctx *ctx, struct graph_entry *e)
{
	if (ctx->last == e)
		ctx->last = NULL;
	gpurt_graph_free(ctx->rt, e->graph);
	free(e->calls);
	free(e->plans);
	memset(e, 0, sizeof(*e));
}

void regions_free(struct loom_backend_ctx *ctx)
{
	for (int i = 0; i < GRAPH_SLOTS; i++)
		entry_clear(ctx, &ctx->graphs[i]);
	free(ctx->calls);
	free(ctx->plans);
	ctx->calls = NULL;
	ctx->plans = NULL;
	ctx->n_calls = ctx->calls_cap = 0;
}

/* A 64-bit hash of n bytes (a multiple of 8), word by word. */
static uint64_t hash_words(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i + 8 <= n; i += 8) {
		uint64_t w;

		memcpy(&w, b + i, sizeof(w));
		h = (h ^ w) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	return h;
}

/* Identifies a region for the second-sighting rule only (a collision
 * just captures a step early; replays compare the calls in full). */
static uint64_t region_hash(const struct loom_backend_ctx *ctx)
{
	uint64_t h = hash_words((uint64_t)ctx->n_calls, ctx->calls,
				(size_t)ctx->n_calls * sizeof(*ctx->calls));

	return hash_words(h, ctx->plans, (size_t)ctx->n_calls * sizeof(*ctx->plans));
}

/* Whether e was captured from exactly this region's calls and plans. A
 * graph from before the scratch buffers moved holds stale addresses. The
 * plans go first: steps of other shapes differ there early. */
static bool graph_matches(const struct loom_backend_ctx *ctx, const struct graph_entry *e)
{
	return e->graph && e->n_calls == ctx->n_calls && e->epoch == ctx->mem_epoch &&
	       !memcmp(e->plans, ctx->plans, (size_t)e->n_calls * sizeof(*e->plans)) &&
	       !memcmp(e->calls, ctx->calls, (size_t)e->n_calls * sizeof(*e->calls));
}

/* The graph for this region, or NULL. No hashing on this path (it runs
 * every decode step): the last graph used is tried first, and a step that
 * repeats its predecessor matches it. */
static struct graph_entry *graph_find(struct loom_backend_ctx *ctx)
{
	if (ctx->last && graph_matches(ctx, ctx->last))
		return ctx->last;
	for (int i = 0; i < GRAPH_SLOTS; i++)
		if (&ctx->graphs[i] != ctx->last && graph_matches(ctx, &ctx->graphs[i]))
			return &ctx->graphs[i];
	return NULL;
}

/* Whether this region was seen before (and remembers it if not). */
static bool seen_before(struct loom_backend_ctx *ctx, uint64_t hash)
{
	for (int i = 0; i < SEEN_SLOTS; i++)
		if (ctx->seen[i] == hash)
			return true;
	ctx->seen[ctx->seen_next] = hash;
	ctx->seen_next = (ctx->seen_next + 1) % SEEN_SLOTS;
	return false;
}

/* The slot for a new graph: an empty one, else the least recently used
 * (a graph whose scratch has moved counts as never used). */
static struct graph_entry *graph_slot(struct loom_backend_ctx *ctx)
{
	struct graph_entry *best = NULL;
	uint64_t best_use = UINT64_MAX;

	for (int i = 0; i < GRAPH_SLOTS; i++) {
		struct graph_entry *x = &ctx->graphs[i];
		uint64_t use = !x->graph ? 0 : x->epoch == ctx->mem_epoch ? x->last_use : 1;

		if (use < best_use) {
			best = x;
			best_use = use;
		}
	}
	return best;
}

/* Keeps graph g as the capture of this region's calls and plans. */
static void graph_keep(struct loom_backend_ctx *ctx, struct gpurt_graph *g)
{
	struct graph_entry *e = graph_slot(ctx);
	size_t cb = (size_t)ctx->n_calls * sizeof(*ctx->calls);
	size_t pb = (size_t)ctx->n_calls * sizeof(*ctx->plans);

	entry_clear(ctx, e);
	e->calls = malloc(cb);
	e->plans = malloc(pb);
	if (!e->calls || !e->plans) { /* not kept: the step has run all the same */
		gpurt_graph_free(ctx->rt, g);
		entry_clear(ctx, e);
		return;
	}
	memcpy(e->calls, ctx->calls, cb);
	memcpy(e->plans, ctx->plans, pb);
	e->graph = g;
	e->n_calls = ctx->n_calls;
	e->epoch = ctx->mem_epoch;
	e->last_use = ++ctx->tick;
	ctx->last = e;
}

static int run_direct(struct loom_backend_ctx *ctx)
{
	ctx->n_direct++;
	return exec_calls(ctx, ctx->calls, ctx->plans, ctx->n_calls);
}

/* Captures the region's calls into a graph, runs it and keeps it. */
static int capture_and_run(struct loom_backend_ctx *ctx)
{
	struct gpurt_graph *g = NULL;
	int rc = rt_failed(ctx, gpurt_capture_begin(ctx->rt));

	if (!rc) {
		rc = exec_calls(ctx, ctx->calls, ctx->plans, ctx->n_calls);
		if (rt_failed(ctx, gpurt_capture_end(ctx->rt, rc == LOOM_OK, &g)))
			rc = LOOM_ERR_DEVICE;
	}
	if (rc || !g) {
		/* a call that fails directly too failed the capture by itself;
		 * otherwise the runtime refused the capture: no more graphs */
		rc = run_direct(ctx);
		if (!rc) {
			gpu_log(ctx->host, LOOM_LOG_WARN, GPU_BACKEND_NAME
				": step capture failed; running steps without graphs");
			ctx->graphs_on = false;
		}
		return rc;
	}
	rc = rt_failed(ctx, gpurt_graph_launch(ctx->rt, g));
	if (rc) {
		gpurt_graph_free(ctx->rt, g);
		return rc;
	}
	ctx->n_captured++;
	graph_keep(ctx, g);
	return LOOM_OK;
}

static int region_run(struct loom_backend_ctx *ctx)
{
	struct graph_entry *e;

	if (!ctx->graphs_on)
		return run_direct(ctx);
	e = graph_find(ctx);
	if (e) {
		e->last_use = ++ctx->tick;
		ctx->last = e;
		ctx->n_replayed++;
		return rt_failed(ctx, gpurt_graph_launch(ctx->rt, e->graph));
	}
	if (seen_before(ctx, region_hash(ctx)))
		return capture_and_run(ctx);
	return run_direct(ctx);
}

/* ---- the two slots ---- */

int gpu_graph_begin(struct loom_backend_ctx *ctx)
{
	if (!ctx)
		return LOOM_ERR_INVALID;
	if (ctx->in_region) {
		gpu_log(ctx->host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": graph_begin inside a region");
		return LOOM_ERR_INVALID;
	}
	ctx->in_region = true;
	ctx->region_rc = LOOM_OK;
	ctx->n_calls = 0;
	ctx->n_moe_tabs = 0;
	return LOOM_OK;
}

int gpu_graph_end(struct loom_backend_ctx *ctx)
{
	int rc;

	if (!ctx || !ctx->in_region)
		return LOOM_ERR_INVALID;
	ctx->in_region = false;
	rc = ctx->region_rc;
	if (!rc && ctx->n_calls)
		rc = prepare_calls(ctx, ctx->calls, ctx->plans, ctx->n_calls);
	if (!rc && ctx->n_calls) {
		ctx->n_steps++;
		rc = region_run(ctx);
	}
	ctx->queued = true; /* conservatively, whatever ran */
	shadows_clear(ctx);  /* the calls may have written what was uploaded */
	ctx->n_calls = 0;
	return rc;
}
