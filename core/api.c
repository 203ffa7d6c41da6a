/* The public API (include/loom.h) over the core's internals.
 *
 * An engine is a model, its tokenizer, the speculative strategies it
 * offers and one continuous-batching scheduler. Every generation is a
 * scheduler request: loom_generate submits one and steps the scheduler on
 * the caller's thread; a server submits from many threads and runs
 * loom_engine_run on one engine thread.
 */
#include "loom.h"
#include "util.h"

#include <jansson.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/dist.h"
#include "dist/follow.h"
#include "engine/scheduler.h"
#include "engine/spec.h"
#include "format/gguf.h"
#include "model/memplan.h"
#include "text/tokenizer.h"

#define MAX_SPEC 8      /* strategies an engine offers */
#define PIECE_MAX 2048  /* bytes of text one token can decode to */

struct loom_engine {
	struct gguf_file *f;
	struct loom_tokenizer *tok;
	struct loom_model *m;
	struct loom_sched *sched;
	struct loom_spec_kind *spec[MAX_SPEC];
	int n_spec;
	struct loom_spec_kind *spec_default; /* NULL: plain decoding */
	struct loom_spec_draft_pool *draft_pool;
	struct loom_sched_config cfg;        /* as the scheduler runs it */
	struct loom_kv_plan kv_plan;         /* the KV memory plan of cfg */
	char model_name[256];
	enum loom_pooling pooling;           /* <arch>.pooling_type */
	struct loom_dist *dist;              /* a rank of a distributed job */
	bool dist_started;                   /* every rank opened: rank 0 sends
						the stop plan at close */
};

/* The size of each struct's first generation: anything smaller is refused. */
#define ENGINE_PARAMS_V1 offsetof(struct loom_engine_params, spec)
#define GENERATION_PARAMS_V1 offsetof(struct loom_generation_params, grammar)
#define REQUEST_V1 offsetof(struct loom_request, all_logits)

/*
 * Copies a caller's parameter struct over defaults: the caller's
 * struct_size says which fields it knows (an older, smaller struct leaves
 * the rest at their defaults). 0, or LOOM_ERR_INVALID when it is smaller
 * than the struct's first generation.
 */
/* "PATH: why", unless gguf_open's reason already begins with the path
 * (it names the file when it cannot open or map it): printed once. */
static void name_file(const char *path, const char *why, char *err, size_t errlen)
{
	size_t n = strlen(path);

	if (!strncmp(why, path, n) && why[n] == ':')
		loom_seterr(err, errlen, "%s", why);
	else
		loom_seterr(err, errlen, "%s: %s", path, why);
}

static int take_params(void *dst, size_t dst_size, const void *src, size_t v1,
		       const char *what, char *err, size_t errlen)
{
	uint32_t size;

	if (!src) {
		loom_seterr(err, errlen, "%s: missing", what);
		return LOOM_ERR_INVALID;
	}
	memcpy(&size, src, sizeof(size));
	if (size < v1) {
		loom_seterr(err, errlen, "%s: struct_size %u is smaller than any version of the struct (%zu); call its _init function",
			what, size, v1);
		return LOOM_ERR_INVALID;
	}
	memcpy(dst, src, size < dst_size ? size : dst_size);
	memcpy(dst, &(uint32_t){ (uint32_t)dst_size }, sizeof(uint32_t));
	return 0;
}

void loom_engine_params_init(struct loom_engine_params *p)
{
	*p = (struct loom_engine_params){ .struct_size = sizeof(*p), .backend = "cpu.so",
		.kv_type = LOOM_KV_DEFAULT, .n_gpu_layers = -1 };
}

void loom_generation_params_init(struct loom_generation_params *g)
{
	struct loom_sampler_params sp;

	loom_sampler_defaults(&sp);
	*g = (struct loom_generation_params){
		.struct_size = sizeof(*g), .n_predict = 128, .add_special = true,
		.temp = sp.temp, .top_k = sp.top_k, .top_p = sp.top_p, .min_p = sp.min_p,
		.repeat_penalty = sp.repeat_penalty,
		.presence_penalty = sp.presence_penalty,
		.frequency_penalty = sp.frequency_penalty,
		.repeat_last_n = sp.penalty_last_n, .seed = sp.seed,
	};
}

void loom_request_init(struct loom_request *r)
{
	*r = (struct loom_request){ .struct_size = sizeof(*r) };
	loom_sampler_defaults(&r->sampling);
}

/* ---- opening ---- */

/* Strategy defaults from the engine parameters. */
static void spec_config(const struct loom_engine_params *p, struct loom_spec_config *c)
{
	loom_spec_config_defaults(c);
	if (p->spec_min_draft > 0)
		c->min_draft = p->spec_min_draft;
	if (p->spec_max_draft > 0)
		c->max_draft = p->spec_max_draft;
	if (c->min_draft > c->max_draft && p->spec_max_draft <= 0)
		c->max_draft = c->min_draft;
	if (p->spec_ngram_min > 0)
		c->ngram_min = p->spec_ngram_min;
	if (p->spec_ngram_max > 0)
		c->ngram_max = p->spec_ngram_max;
	if (c->ngram_min > c->ngram_max && p->spec_ngram_max <= 0)
		c->ngram_max = c->ngram_min;
	c->draft_model = p->spec_draft_model;
	c->layers = p->spec_layers > 0 ? p->spec_layers : 0;
	c->max_tree = p->spec_tree > 0 ? p->spec_tree : 0;
}

static struct loom_spec_kind *find_spec(const struct loom_engine *e, const char *name)
{
	size_t len = strlen(name);

	if (len > 3 && !strcmp(name + len - 3, ".so"))
		len -= 3;
	for (int i = 0; i < e->n_spec; i++) {
		const char *k = loom_spec_kind_name(e->spec[i]);

		if (strlen(k) == len && !strncmp(k, name, len))
			return e->spec[i];
	}
	return NULL;
}

static int load_one_spec(struct loom_engine *e, const char *name,
			 const struct loom_spec_config *c, char *err, size_t errlen)
{
	struct loom_spec_models models;
	struct loom_spec_kind *k;

	if (e->n_spec == MAX_SPEC) {
		loom_seterr(err, errlen, "spec: at most %d strategies", MAX_SPEC);
		return LOOM_ERR_INVALID;
	}
	/* the scheduler runs the early-exit model (layerskip), spec.c the
	 * draft model (draft.so); a distributed job offers no early exit (the
	 * step plans carry whole passes only) */
	models = (struct loom_spec_models){ .n_layer = e->dist ? 0 : e->m->hp.n_layer,
		.pool = e->draft_pool };
	k = loom_spec_kind_load(name, c, (int32_t)e->m->hp.n_vocab, &models, err, errlen);
	if (!k) {
		if (e->dist)
			loom_seterr(err + strlen(err), errlen - strlen(err),
				    " (under --tp/--pp no strategy gets the early-exit model)");
		return LOOM_ERR_INVALID;
	}
	if (find_spec(e, loom_spec_kind_name(k))) {
		loom_seterr(err, errlen, "spec: strategy '%s' (%s) is listed twice",
			    loom_spec_kind_name(k), loom_spec_kind_path(k));
		loom_spec_kind_free(k);
		return LOOM_ERR_INVALID;
	}
	e->spec[e->n_spec++] = k;
	return 0;
}

/* The draft model of p->spec_draft_model, with as many cache tokens as
 * the target's sequences can hold. */
static int open_draft_pool(struct loom_engine *e, const struct loom_engine_params *p,
			   const struct loom_model_params *mp, char *err, size_t errlen)
{
	int64_t blocks = ((int64_t)e->cfg.max_ctx + 15) / 16 * e->cfg.max_seqs;

	if (p->kv_bytes > 0)
		blocks = loom_sched_plan_blocks(e->m, 16, (uint64_t)p->kv_bytes);
	e->draft_pool = loom_spec_draft_pool_open(p->spec_draft_model, e->tok, mp,
						  e->cfg.max_ctx, blocks, err, errlen);
	return e->draft_pool ? 0 : LOOM_ERR_INVALID;
}

/* Loads the strategies of p->spec (comma-separated) and picks the default. */
static int load_specs(struct loom_engine *e, const struct loom_engine_params *p,
		      const struct loom_model_params *mp, char *err, size_t errlen)
{
	const char *def = p->spec_default;
	struct loom_spec_config c;
	char *list, *save = NULL, *name;
	int rc = 0;

	if (!p->spec || !p->spec[0] || !strcmp(p->spec, "none"))
		return 0;
	spec_config(p, &c);
	if (p->spec_draft_model && (rc = open_draft_pool(e, p, mp, err, errlen)))
		return rc;
	list = strdup(p->spec);
	if (!list) {
		loom_seterr(err, errlen, "out of memory");
		return LOOM_ERR_NOMEM;
	}
	for (name = strtok_r(list, ",", &save); name && !rc; name = strtok_r(NULL, ",", &save))
		if (name[0] && strcmp(name, "none"))
			rc = load_one_spec(e, name, &c, err, errlen);
	free(list);
	if (rc || (def && !strcmp(def, "none")))
		return rc;
	e->spec_default = def ? find_spec(e, def) : e->n_spec ? e->spec[0] : NULL;
	if (def && !e->spec_default) {
		loom_seterr(err, errlen, "spec default %s: not among the strategies loaded (%s)",
			    def, p->spec);
		return LOOM_ERR_INVALID;
	}
	return 0;
}

/* Context per sequence: n_ctx, or (n_ctx <= 0) the trained context;
 * never above the trained context. */
static int32_t context_size(const struct loom_model *m, int32_t n_ctx)
{
	int32_t used = loom_model_context(&m->hp, n_ctx > 0 ? n_ctx : INT32_MAX);

	if (n_ctx > used)
		loom_log(LOOM_LOG_WARN, "context %d is above the model's trained context; using %d",
			 n_ctx, used);
	return used;
}

/* The KV type p asks for, resolved (the default: f16 where the backend
 * stores it, f32 in exact mode) and checked against the backend and the
 * model's head size. */
static int kv_type(struct loom_engine *e, const struct loom_engine_params *p, char *err,
		   size_t errlen)
{
	const struct loom_hparams *hp = &e->m->hp;
	int32_t t = p->kv_type;
	char why[256];

	if (t == LOOM_KV_DEFAULT) {
		t = p->exact ? LOOM_KV_F32 : LOOM_KV_F16;
		if (!loom_kv_type_usable(e->m->be, (uint32_t)t, why, sizeof(why)))
			t = LOOM_KV_F32;
	}
	if (t < 0 || !loom_kv_type_name(t)) {
		loom_seterr(err, errlen, "kv_type %d: not a KV cache type (f32, f16, q8_0, q4_0)", t);
		return LOOM_ERR_INVALID;
	}
	if (!loom_kv_type_usable(e->m->be, (uint32_t)t, why, sizeof(why))) {
		loom_seterr(err, errlen, "--kv-type %s: %s", loom_kv_type_name(t), why);
		return LOOM_ERR_UNSUPPORTED;
	}
	if ((t == LOOM_KV_Q8_0 || t == LOOM_KV_Q4_0) && hp->head_dim % 32) {
		loom_seterr(err, errlen, "--kv-type %s: the cache stores blocks of 32 values, and this model's heads have %lld",
			    loom_kv_type_name(t), (long long)hp->head_dim);
		return LOOM_ERR_UNSUPPORTED;
	}
	e->cfg.kv_type = (uint32_t)t;
	return 0;
}

/* Whether one sequence at context ctx fits in kv_bytes (both pools). */
static bool context_fits(struct loom_engine *e, int32_t ctx, uint64_t kv_bytes)
{
	struct loom_sched_config c = e->cfg;
	struct loom_kv_plan pl;

	c.max_ctx = ctx;
	if (c.max_batch_tokens > ctx)
		c.max_batch_tokens = ctx;
	loom_sched_plan_kv(e->m, &c, kv_bytes, &pl);
	return pl.n_blocks >= pl.seq_blocks && pl.n_blocks > 0 &&
	       (!pl.n_local_layers || pl.n_local_blocks >= pl.seq_local_blocks);
}

/* The longest context up to c->max_ctx that one sequence can hold in
 * kv_bytes (a block at least, so a cache too small still fails below
 * with its own message). */
static int32_t fitting_context(struct loom_engine *e, uint64_t kv_bytes)
{
	int32_t lo = e->cfg.block_size, hi = e->cfg.max_ctx;

	if (context_fits(e, hi, kv_bytes))
		return hi;
	if (lo > hi)
		lo = hi;
	while (hi - lo > 1) { /* lo fits or is the floor; hi does not fit */
		int32_t mid = lo + (hi - lo) / 2;

		if (context_fits(e, mid, kv_bytes))
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* The scheduler's configuration from the engine parameters (the
 * scheduler checks the rest). 0, or LOOM_ERR_INVALID with err set. */
/* The default KV reservation: from this host's free memory; in a
 * distributed job the smallest of every rank's, since all ranks must run
 * the same cache shapes. */
static uint64_t default_kv_bytes(struct loom_engine *e)
{
	uint64_t b = loom_kv_default_bytes();

	return e->dist ? loom_dist_min_u64(e->dist, b) : b;
}

static int sched_config(struct loom_engine *e, const struct loom_engine_params *p,
			char *err, size_t errlen)
{
	struct loom_sched_config *c = &e->cfg;
	uint64_t kv_bytes = p->kv_bytes > 0 ? (uint64_t)p->kv_bytes : 0;
	int rc;

	loom_sched_config_defaults(c);
	c->block_size = p->block_size > 0 ? p->block_size : 16;
	c->max_seqs = p->n_parallel > 0 ? p->n_parallel : 1;
	c->max_ctx = context_size(e->m, p->n_ctx);
	c->max_batch_tokens = p->n_batch > 0 ? p->n_batch : 256;
	rc = kv_type(e, p, err, errlen);
	if (rc)
		return rc;
	if (e->dist && kv_bytes) /* serve's default is each host's own */
		kv_bytes = loom_dist_min_u64(e->dist, kv_bytes);
	/* no context given: the trained one, capped to what the cache holds
	 * (kv_bytes, else the default reservation shared by the sequences) */
	if (p->n_ctx <= 0)
		c->max_ctx = fitting_context(e, kv_bytes ? kv_bytes :
					     default_kv_bytes(e) / (uint64_t)c->max_seqs);
	/* no step needs more than every sequence's whole context; a step
	 * takes a token of each sequence at least */
	if (c->max_batch_tokens > (int64_t)c->max_ctx * c->max_seqs)
		c->max_batch_tokens = (int32_t)((int64_t)c->max_ctx * c->max_seqs);
	if (c->max_batch_tokens < c->max_seqs) {
		loom_seterr(err, errlen, "batch of %d tokens is smaller than %d parallel sequences: a step takes a token of each",
			    c->max_batch_tokens, c->max_seqs);
		return LOOM_ERR_INVALID;
	}
	c->max_waiting = p->max_waiting > 0 ? p->max_waiting : 256;
	c->prefix_cache = p->prefix_cache ? p->prefix_cache > 0 : p->batch_invariant;
	c->tokenizer = e->tok;
	c->spec_step_rows = p->spec_step_rows > 0 ? p->spec_step_rows : 0;
	/* all_logits: a whole step's rows; else a few beyond one per sequence,
	 * so that requests keeping a row per prompt token (prompt logprobs,
	 * hidden states) prefill in chunks rather than a token a step */
	c->logits_rows = p->all_logits ? c->max_batch_tokens + c->max_seqs :
			 c->max_seqs + (c->max_batch_tokens < 64 ? c->max_batch_tokens : 64);
	/* no kv_bytes: each sequence a whole context (windowed layers: a
	 * window), and one spare block for a copy; else kv_bytes split
	 * between the full-context and the windowed layers */
	loom_sched_plan_kv(e->m, c, kv_bytes, &e->kv_plan);
	c->n_blocks = e->kv_plan.n_blocks;
	c->n_local_blocks = e->kv_plan.n_local_blocks;
	if (c->n_blocks <= 0 || (e->kv_plan.n_local_layers && c->n_local_blocks <= 0)) {
		loom_seterr(err, errlen, "a KV cache of %lld bytes holds not even one block of %d tokens",
			    (long long)p->kv_bytes, c->block_size);
		return LOOM_ERR_INVALID;
	}
	return 0;
}

/* Logits rows for drafts: every sequence drafting its strategy's most. */
static void spec_rows(struct loom_engine *e)
{
	struct loom_sched_config *c = &e->cfg;

	c->spec_rows = 0;
	for (int i = 0; i < e->n_spec; i++) {
		int64_t rows = (int64_t)c->max_seqs * loom_spec_kind_max_draft(e->spec[i]);

		if (rows > c->spec_rows)
			c->spec_rows = rows > c->max_batch_tokens ? c->max_batch_tokens : (int32_t)rows;
	}
}

/* <arch>.pooling_type (llama.cpp: 0 none, 1 mean, 2 cls, 3 last, 4 rank);
 * mean unless cls or last. */
static void read_pooling(struct loom_engine *e)
{
	char *arch = NULL, key[128], why[256];
	uint32_t v = 0;

	e->pooling = LOOM_POOLING_MEAN;
	if (gguf_get_str(e->f, "general.architecture", &arch, why, sizeof(why)) || !arch)
		return;
	snprintf(key, sizeof(key), "%s.pooling_type", arch);
	free(arch);
	if (gguf_get_u32(e->f, key, &v, why, sizeof(why)) == 0 &&
	    (v == LOOM_POOLING_CLS || v == LOOM_POOLING_LAST))
		e->pooling = (enum loom_pooling)v;
}

static void set_model_name(struct loom_engine *e, const char *path)
{
	char *name = NULL, why[64];
	const char *base = strrchr(path, '/');

	if (gguf_get_str(e->f, "general.name", &name, why, sizeof(why)) == 0 && name && name[0])
		snprintf(e->model_name, sizeof(e->model_name), "%s", name);
	else
		snprintf(e->model_name, sizeof(e->model_name), "%s", base ? base + 1 : path);
	free(name);
}

/* What plan_memory needs: the engine and its parameters. */
struct plan_arg {
	struct loom_engine *e;
	const struct loom_engine_params *p;
};

/*
 * Between planning the weights and allocating them (the model loader's
 * before_alloc): the scheduler's configuration with its KV plan, then the
 * memory plan, weights + KV cache + the executor's activations + the
 * backend's reserve, against the backend's free memory. Drafts' logits
 * rows are counted at their most (a step's tokens).
 */
static int plan_memory(void *arg, struct loom_model *m, char *err, size_t errlen)
{
	struct plan_arg *a = arg;
	struct loom_engine *e = a->e;
	const struct loom_sched_config *c = &e->cfg;
	bool spec = a->p->spec && a->p->spec[0] && strcmp(a->p->spec, "none");
	int64_t out = (int64_t)c->max_seqs + (spec ? c->max_batch_tokens : 0);
	size_t acts;

	e->m = m;
	if (a->p->n_gpu_layers >= 0 && a->p->n_gpu_layers < m->hp.n_layer) {
		loom_seterr(err, errlen, "%d GPU layers of the model's %d: loom runs all layers on one backend (no partial offload yet); ask for all (-ngl 99, -1 or %d and more) or none (-ngl 0, cpu.so)",
			    a->p->n_gpu_layers, (int)m->hp.n_layer, (int)m->hp.n_layer);
		return -1;
	}
	if (sched_config(e, a->p, err, errlen))
		return -1;
	if (out < c->logits_rows)
		out = c->logits_rows;
	if (out > INT32_MAX ||
	    !loom_exec_bytes(m, c->max_batch_tokens, c->max_seqs, (int32_t)out,
			     e->kv_plan.n_blocks, e->kv_plan.n_local_layers > 0, &acts)) {
		loom_seterr(err, errlen, "the activations of a step of %d tokens overflow",
			    c->max_batch_tokens);
		return -1;
	}
	return loom_mem_plan_check(m, e->kv_plan.bytes, acts, NULL, err, errlen) ? -1 : 0;
}

static int open_model(struct loom_engine *e, const struct loom_engine_params *p,
		      const struct loom_model_params *model_params, char *err, size_t errlen)
{
	struct loom_model_params mp_plan = *model_params, *mp = &mp_plan;
	struct plan_arg arg = { .e = e, .p = p };
	char why[2048];

	e->f = gguf_open(p->model, why, sizeof(why));
	if (!e->f) {
		name_file(p->model, why, err, errlen);
		return LOOM_ERR_FORMAT;
	}
	set_model_name(e, p->model);
	read_pooling(e);
	e->tok = loom_tokenizer_from_gguf(e->f, err, errlen);
	if (!e->tok)
		return LOOM_ERR_FORMAT;
	mp->before_alloc = plan_memory;
	mp->before_alloc_arg = &arg;
	e->m = loom_model_load(e->f, mp, err, errlen);
	if (!e->m)
		return LOOM_ERR_INVALID;
	e->m->gemm_input = p->gemm_input;
	e->m->gemm_input_user = p->gemm_input_user;
	return 0;
}

/* Model, strategies and scheduler; on a rank of a distributed job every
 * rank learns whether all of them succeeded. */
static int build_engine(struct loom_engine *e, const struct loom_engine_params *p,
			struct loom_model_params *mp, char *err, size_t errlen)
{
	struct loom_model_params draft_mp = *mp;
	int rc = open_model(e, p, mp, err, errlen);

	draft_mp.dist = NULL; /* a draft model runs whole on rank 0 */
	/* the scheduler's configuration was made while loading (plan_memory) */
	if (!rc && load_specs(e, p, &draft_mp, err, errlen))
		rc = -1;
	if (!rc) {
		spec_rows(e);
		e->sched = loom_sched_new(e->m, &e->cfg, err, errlen);
		rc = e->sched ? 0 : -1;
	}
	if (e->dist && !loom_dist_all_ok(e->dist, rc == 0)) {
		if (!rc)
			loom_seterr(err, errlen, "distributed: another rank failed to start (see its message)");
		return -1;
	}
	return rc;
}

static int open_dist(struct loom_engine *e, const struct loom_engine_params *p,
		     struct loom_model_params *mp, char *err, size_t errlen)
{
	e->dist = loom_dist_open(p->tp > 1 ? p->tp : 1, p->pp > 1 ? p->pp : 1, err, errlen);
	if (!e->dist)
		return -1;
	mp->dist = e->dist;
	if (p->pp_micro > 0)
		e->dist->micro = p->pp_micro;
	if (e->dist->rank != 0)
		mp->progress = false;
	return 0;
}

/* Every rank must run the same scheduler shapes (block numbers and step
 * sizes in rank 0's plans address the others' caches). */
static bool dist_agree(struct loom_engine *e, char *err, size_t errlen)
{
	static const char *const names[] = { "KV blocks", "windowed KV blocks", "block size",
		"tokens per step", "sequences", "context" };
	int64_t v[] = { e->cfg.n_blocks, e->cfg.n_local_blocks, e->cfg.block_size,
		e->cfg.max_batch_tokens, e->cfg.max_seqs, e->cfg.max_ctx };

	return !e->dist || loom_dist_agree(e->dist, v, names, 6, err, errlen);
}

bool loom_engine_is_follower(const struct loom_engine *e)
{
	return e->dist && e->dist->rank != 0;
}

int loom_engine_follow(struct loom_engine *e, char *err, size_t errlen)
{
	if (!loom_engine_is_follower(e)) {
		loom_seterr(err, errlen, "loom_engine_follow: not a follower rank of a distributed job");
		return LOOM_ERR_INVALID;
	}
	if (loom_sched_follow(e->sched, err, errlen)) {
		e->dist->broken = true;
		return LOOM_ERR_IO;
	}
	return 0;
}

struct loom_engine *loom_engine_open(const struct loom_engine_params *params,
				     char *err, size_t errlen)
{
	struct loom_engine_params p;
	struct loom_model_params mp;
	struct loom_engine *e;

	loom_engine_params_init(&p);
	if (take_params(&p, sizeof(p), params, ENGINE_PARAMS_V1, "engine parameters", err, errlen))
		return NULL;
	if (!p.model) {
		loom_seterr(err, errlen, "engine parameters: no model given");
		return NULL;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		loom_seterr(err, errlen, "out of memory");
		return NULL;
	}
	mp = (struct loom_model_params){ .backend = p.backend ? p.backend : "cpu.so",
		.n_threads = p.n_threads, .progress = p.progress,
		.backend_flags = (p.batch_invariant ? LOOM_BACKEND_BATCH_INVARIANT : 0) |
				 (p.exact ? LOOM_BACKEND_EXACT : 0),
		.n_ctx = p.n_ctx };
	if ((p.tp > 1 || p.pp > 1) && open_dist(e, &p, &mp, err, errlen))
		goto out_close;
	if (build_engine(e, &p, &mp, err, errlen) || !dist_agree(e, err, errlen))
		goto out_close;
	e->dist_started = e->dist != NULL;
	if (e->dist)
		loom_log(LOOM_LOG_INFO, "distributed: rank %d of %d ready", e->dist->rank,
			 e->dist->size);
	return e;
out_close:
	loom_engine_close(e);
	return NULL;
}

void loom_engine_close(struct loom_engine *e)
{
	if (!e)
		return;
	if (e->dist_started && e->dist->rank == 0) {
		char why[160];

		if (loom_dist_plan_stop(e->dist, why, sizeof(why)))
			loom_log(LOOM_LOG_ERROR, "%s", why);
	}
	loom_sched_free(e->sched); /* requests still queued end CANCELLED */
	for (int i = 0; i < e->n_spec; i++)
		loom_spec_kind_free(e->spec[i]);
	loom_spec_draft_pool_free(e->draft_pool);
	loom_model_free(e->m);
	loom_tokenizer_free(e->tok);
	gguf_close(e->f);
	loom_dist_close(e->dist);
	free(e);
}

/* ---- queries ---- */

int32_t loom_engine_n_vocab(const struct loom_engine *e)
{
	return (int32_t)e->m->hp.n_vocab;
}

int32_t loom_engine_n_ctx(const struct loom_engine *e)
{
	return e->cfg.max_ctx;
}

int32_t loom_engine_n_embd(const struct loom_engine *e)
{
	return (int32_t)e->m->hp.n_embd;
}

enum loom_pooling loom_engine_pooling(const struct loom_engine *e)
{
	return e->pooling;
}

const char *loom_engine_backend_name(const struct loom_engine *e)
{
	return e->m->be->ops->name;
}

const char *loom_engine_model_name(const struct loom_engine *e)
{
	return e->model_name;
}

const char *loom_engine_spec_name(const struct loom_engine *e)
{
	return e->spec_default ? loom_spec_kind_name(e->spec_default) : "none";
}

const char *loom_engine_find_spec(const struct loom_engine *e, const char *name)
{
	struct loom_spec_kind *k = find_spec(e, name);

	return k ? loom_spec_kind_name(k) : NULL;
}

const char *loom_engine_spec_at(const struct loom_engine *e, int i)
{
	return i >= 0 && i < e->n_spec ? loom_spec_kind_name(e->spec[i]) : NULL;
}

int64_t loom_engine_tokenize(const struct loom_engine *e, const char *text,
			     size_t len, bool add_special, int32_t *out, int64_t cap)
{
	return loom_tokenize(e->tok, text, len, add_special, add_special, out, cap);
}

void loom_engine_get_stats(struct loom_engine *e, struct loom_engine_stats *st)
{
	struct loom_sched_stats s;

	loom_sched_get_stats(e->sched, &s);
	*st = (struct loom_engine_stats){
		.running = s.running, .waiting = s.waiting, .blocks_total = s.blocks_total,
		.blocks_used = s.blocks_used, .blocks_cached = s.blocks_cached,
		.block_size = e->cfg.block_size,
		.kv_bytes = e->kv_plan.bytes,
		.n_ctx = e->cfg.max_ctx, .n_parallel = e->cfg.max_seqs,
		.prefix_cache = e->cfg.prefix_cache, .prefix_hits = s.prefix_hits,
		.prefix_lookups = s.prefix_lookups, .preemptions = s.preemptions,
		.rejected = s.rejected, .cow_copies = s.cow_copies,
		.prompt_tokens = s.prompt_tokens, .generated_tokens = s.generated_tokens,
		.steps = s.steps, .spec_steps = s.spec_steps, .spec_drafted = s.spec_drafted,
		.spec_accepted = s.spec_accepted, .spec_tokens = s.spec_tokens,
		.blocks_peak = s.blocks_peak, .local_window = s.local_window,
		.local_blocks_total = s.local_blocks_total,
		.local_blocks_used = s.local_blocks_used,
		.local_blocks_cached = s.local_blocks_cached,
		.local_blocks_peak = s.local_blocks_peak,
		.seq_blocks = e->kv_plan.seq_blocks,
		.seq_local_blocks = e->kv_plan.seq_local_blocks,
		.local_layers = (int32_t)e->kv_plan.n_local_layers,
		.weights_bytes = e->m->weights_bytes, .packed_bytes = e->m->packed_bytes,
		.packed_tensors = e->m->n_packs,
		.kv_type = (int32_t)e->cfg.kv_type, .kv_token_bytes = e->kv_plan.token_bytes,
		.expert_bytes = e->m->expert_bytes, .n_expert = (int32_t)e->m->hp.n_expert,
		.n_expert_used = (int32_t)e->m->hp.n_expert_used,
		.embd_only_bytes = e->m->embd_only_bytes,
	};
}

/* ---- requests ---- */

int loom_submit(struct loom_engine *e, const struct loom_request *req, uint64_t *id,
		char *err, size_t errlen)
{
	struct loom_sched_request sr;
	struct loom_request r;
	struct loom_spec_kind *spec = e->spec_default;
	int rc;

	loom_request_init(&r);
	rc = take_params(&r, sizeof(r), req, REQUEST_V1, "request", err, errlen);
	if (rc)
		return rc;
	if (r.spec && !strcmp(r.spec, "none"))
		spec = NULL;
	else if (r.spec && !(spec = find_spec(e, r.spec))) {
		loom_seterr(err, errlen, "request: speculative strategy '%s' is not loaded", r.spec);
		return LOOM_ERR_INVALID;
	}
	if (r.all_logits && e->cfg.logits_rows < e->cfg.max_batch_tokens + e->cfg.max_seqs) {
		loom_seterr(err, errlen, "request: all_logits needs an engine opened with all_logits");
		return LOOM_ERR_UNSUPPORTED;
	}
	if (r.logprobs || r.prompt_logprobs || r.hidden)
		spec = NULL; /* a token at a time, each from its own row */
	sr = (struct loom_sched_request){
		.prompt = r.prompt, .n_prompt = r.n_prompt, .n_predict = r.n_predict,
		.sampling = r.sampling, .cb = r.on_event, .user = r.user, .spec = spec,
		.spec_max_draft = r.spec_max_draft, .ignore_eog = r.ignore_eog,
		.first_logits = r.prompt_logits, .all_logits = r.all_logits,
		.grammar = r.grammar, .logprobs = r.logprobs, .top_logprobs = r.top_logprobs,
		.prompt_logprobs = r.prompt_logprobs, .hidden = r.hidden,
	};
	return loom_sched_submit(e->sched, &sr, id, err, errlen);
}

void loom_cancel(struct loom_engine *e, uint64_t id)
{
	loom_sched_cancel(e->sched, id);
}

int loom_engine_step(struct loom_engine *e)
{
	int n = loom_sched_step(e->sched);

	return n < 0 ? LOOM_ERR_DEVICE : n;
}

void loom_engine_run(struct loom_engine *e)
{
	loom_sched_run(e->sched);
}

void loom_engine_stop(struct loom_engine *e)
{
	loom_sched_stop(e->sched);
}

/* ---- loom_generate: one request, stepped on the caller's thread ---- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct gen {
	struct loom_engine *e;
	struct loom_detok dt;
	loom_token_fn on_token;
	void *user;
	int32_t n_predict;     /* the caller's: 0 reports no token */
	int64_t made;
	bool stopping;         /* the caller asked to stop: later tokens dropped */
	bool done;
	enum loom_finish finish;
	char error[256];
	double t_first;        /* when the first token came */
};

static void gen_token(struct gen *g, const struct loom_event *ev)
{
	char piece[PIECE_MAX];
	int len;

	if (g->made == 0)
		g->t_first = now_s();
	if (g->n_predict == 0) { /* only the prompt was wanted */
		g->stopping = true;
		loom_cancel(g->e, ev->id);
		return;
	}
	g->made++;
	len = loom_detokenize(g->e->tok, &g->dt, ev->token, piece, sizeof(piece));
	/* the last token leaves a character unfinished: say so with U+FFFD
	 * (text is complete UTF-8 only) rather than drop its bytes unseen,
	 * as the server does */
	if (ev->finish != LOOM_FINISH_NONE && g->dt.n_pending && len >= 0 &&
	    (size_t)len + 4 <= sizeof(piece)) {
		memcpy(piece + len, "\xef\xbf\xbd", 4);
		len += 3;
		g->dt.n_pending = 0;
	}
	if (g->on_token && g->on_token(g->user, ev->token, piece, len > 0 ? (size_t)len : 0)) {
		g->stopping = true;
		loom_cancel(g->e, ev->id);
	}
}

static void gen_event(void *user, const struct loom_event *ev)
{
	struct gen *g = user;

	if (ev->token >= 0 && !g->stopping)
		gen_token(g, ev);
	if (ev->finish == LOOM_FINISH_NONE)
		return;
	g->done = true;
	g->finish = ev->finish;
	if (ev->error)
		snprintf(g->error, sizeof(g->error), "%s", ev->error);
}

/* Tokenizes the prompt; checks that it and n_predict fit the context. */
static int32_t *prompt_tokens(struct loom_engine *e, const char *prompt, size_t len,
			      const struct loom_generation_params *g, int64_t *n,
			      char *err, size_t errlen)
{
	int64_t need = loom_engine_tokenize(e, prompt, len, g->add_special, NULL, 0);
	int32_t *ids;

	if (need < 0) {
		loom_seterr(err, errlen, "the prompt could not be tokenized");
		return NULL;
	}
	if (need == 0) {
		loom_seterr(err, errlen, "the prompt is empty after tokenization");
		return NULL;
	}
	if (g->n_predict < 0 || need + g->n_predict > e->cfg.max_ctx) {
		loom_seterr(err, errlen, "prompt (%lld tokens) + n_predict (%d) exceeds the context (%d)",
			(long long)need, g->n_predict, e->cfg.max_ctx);
		return NULL;
	}
	ids = malloc(sizeof(int32_t) * (size_t)need);
	if (!ids) {
		loom_seterr(err, errlen, "out of memory");
		return NULL;
	}
	*n = loom_engine_tokenize(e, prompt, len, g->add_special, ids, need);
	return ids;
}

static void generation_request(const struct loom_generation_params *g, const int32_t *ids,
			       int64_t n, struct gen *st, struct loom_request *r)
{
	loom_request_init(r);
	r->prompt = ids;
	r->n_prompt = (int32_t)n;
	r->n_predict = g->n_predict > 0 ? g->n_predict : 1;
	r->sampling = (struct loom_sampler_params){
		.temp = g->temp, .top_k = g->top_k, .top_p = g->top_p, .min_p = g->min_p,
		.repeat_penalty = g->repeat_penalty, .presence_penalty = g->presence_penalty,
		.frequency_penalty = g->frequency_penalty, .penalty_last_n = g->repeat_last_n,
		.seed = g->seed,
	};
	r->prompt_logits = g->prompt_logits;
	r->grammar = g->grammar;
	r->on_event = gen_event;
	r->user = st;
}

/* Steps the scheduler until the request has ended. */
static int run_to_end(struct loom_engine *e, struct gen *st, char *err, size_t errlen)
{
	while (!st->done) {
		int n = loom_engine_step(e);

		if (n == 0 && !st->done) {
			loom_seterr(err, errlen, "engine: the request is neither running nor finished (is loom_engine_run active on another thread?)");
			return LOOM_ERR_INVALID;
		}
	}
	if (st->finish == LOOM_FINISH_ERROR) {
		loom_seterr(err, errlen, "%s", st->error[0] ? st->error : "backend failure");
		return LOOM_ERR_DEVICE;
	}
	return 0;
}

int loom_generate(struct loom_engine *e, const char *prompt, size_t len,
		  const struct loom_generation_params *params, loom_token_fn on_token,
		  void *user, struct loom_generation_stats *stats, char *err,
		  size_t errlen)
{
	struct loom_generation_params g;
	struct loom_generation_stats out = { 0 };
	struct gen st = { .e = e, .dt = { .first = true }, .on_token = on_token, .user = user };
	struct loom_sched_stats s0, s1;
	struct loom_request r;
	uint64_t id;
	int32_t *ids;
	double t0;
	int rc;

	loom_generation_params_init(&g);
	rc = take_params(&g, sizeof(g), params, GENERATION_PARAMS_V1, "generation parameters",
			 err, errlen);
	if (rc)
		return rc;
	ids = prompt_tokens(e, prompt, len, &g, &out.n_prompt, err, errlen);
	if (!ids)
		return LOOM_ERR_INVALID;
	st.n_predict = g.n_predict;
	generation_request(&g, ids, out.n_prompt, &st, &r);
	loom_sched_get_stats(e->sched, &s0);
	t0 = now_s();
	rc = loom_submit(e, &r, &id, err, errlen);
	free(ids);
	if (rc)
		return rc;
	rc = run_to_end(e, &st, err, errlen);
	if (rc)
		return rc;
	loom_sched_get_stats(e->sched, &s1);
	if (!st.t_first)
		st.t_first = now_s();
	out.n_generated = st.made;
	out.prompt_seconds = st.t_first - t0;
	out.generate_seconds = now_s() - st.t_first;
	out.spec_steps = (int64_t)(s1.spec_steps - s0.spec_steps);
	out.spec_drafted = (int64_t)(s1.spec_drafted - s0.spec_drafted);
	out.spec_accepted = (int64_t)(s1.spec_accepted - s0.spec_accepted);
	if (stats)
		*stats = out;
	return 0;
}

/* ---- text ---- */

struct loom_tokenizer *loom_tokenizer_open(const char *gguf_path, char *err, size_t errlen)
{
	struct loom_tokenizer *t;
	struct gguf_file *f;
	char why[2048];

	f = gguf_open(gguf_path, why, sizeof(why));
	if (!f) {
		name_file(gguf_path, why, err, errlen);
		return NULL;
	}
	t = loom_tokenizer_from_gguf(f, err, errlen);
	gguf_close(f); /* the tokenizer keeps copies */
	return t;
}

const struct loom_tokenizer *loom_engine_tokenizer(const struct loom_engine *e)
{
	return e->tok;
}

/* The text of the model's token ID ("" when it has none). */
static const char *token_text_or_empty(const struct loom_engine *e, int32_t id)
{
	const char *s = id >= 0 ? loom_token_text(e->tok, id) : NULL;

	return s ? s : "";
}

int loom_engine_chat_template(const struct loom_engine *e, struct loom_chat_template *t,
			      bool *had_one, char *err, size_t errlen)
{
	char *tmpl = NULL;
	char why[512];
	int rc;

	if (gguf_get_str(e->f, "tokenizer.chat_template", &tmpl, err, errlen) < 0)
		return LOOM_ERR_FORMAT;
	if (had_one)
		*had_one = tmpl != NULL;
	if (tmpl && !loom_chat_template_jinja(tmpl, token_text_or_empty(e, loom_tokenizer_bos(e->tok)),
					      token_text_or_empty(e, loom_tokenizer_eos(e->tok)),
					      t, why, sizeof(why))) {
		free(tmpl);
		return 0;
	}
	/* a file without a template: its family's (Gemma 3 GGUFs have none);
	 * one the interpreter cannot parse: the family it belongs to */
	rc = loom_chat_template_detect(tmpl ? tmpl : e->m->hp.arch->chat_marker, t, err, errlen);
	if (rc && tmpl)
		loom_seterr(err, errlen, "%s", why);
	free(tmpl);
	return rc ? LOOM_ERR_UNSUPPORTED : 0;
}

int loom_engine_chat_template_named(const struct loom_engine *e, const char *name,
				    struct loom_chat_template *t, char *err, size_t errlen)
{
	char key[160], *tmpl = NULL;
	int rc;

	memset(t, 0, sizeof(*t));
	if (!name || !*name || strlen(name) > 100) {
		loom_seterr(err, errlen, "a template name of 1 to 100 bytes");
		return LOOM_ERR_INVALID;
	}
	snprintf(key, sizeof(key), "tokenizer.chat_template.%s", name);
	if (gguf_get_str(e->f, key, &tmpl, err, errlen) < 0)
		return LOOM_ERR_FORMAT;
	if (!tmpl)
		return 1;
	rc = loom_chat_template_jinja(tmpl, token_text_or_empty(e, loom_tokenizer_bos(e->tok)),
				      token_text_or_empty(e, loom_tokenizer_eos(e->tok)), t, err,
				      errlen) ? LOOM_ERR_UNSUPPORTED : 0;
	if (rc) { /* name the key */
		char why[512];

		snprintf(why, sizeof(why), "%s", err);
		loom_seterr(err, errlen, "%s: %s", key, why);
	}
	free(tmpl);
	return rc;
}

int loom_engine_chat_template_file(const struct loom_engine *e, const char *path,
				   struct loom_chat_template *t, char *err, size_t errlen)
{
	FILE *fp = fopen(path, "rb");
	char *src = NULL;
	long n = -1;
	int rc = LOOM_ERR_IO;

	memset(t, 0, sizeof(*t));
	if (!fp) {
		loom_seterr(err, errlen, "%s: cannot open", path);
		return LOOM_ERR_IO;
	}
	if (!fseek(fp, 0, SEEK_END))
		n = ftell(fp);
	if (n < 0 || n > (16 << 20) || fseek(fp, 0, SEEK_SET)) {
		loom_seterr(err, errlen, "%s: not a readable file of at most 16 MiB", path);
		goto out_close;
	}
	src = malloc((size_t)n + 1);
	if (!src || fread(src, 1, (size_t)n, fp) != (size_t)n) {
		loom_seterr(err, errlen, "%s: cannot read", path);
		goto out_close;
	}
	src[n] = '\0';
	if (strlen(src) != (size_t)n) {
		loom_seterr(err, errlen, "%s: a NUL byte in the template", path);
		goto out_close;
	}
	rc = loom_chat_template_jinja(src, token_text_or_empty(e, loom_tokenizer_bos(e->tok)),
				      token_text_or_empty(e, loom_tokenizer_eos(e->tok)), t, err,
				      errlen) ? LOOM_ERR_UNSUPPORTED : 0;
	if (rc) { /* name the file */
		char why[512];

		snprintf(why, sizeof(why), "%s", err);
		loom_seterr(err, errlen, "%s: %s", path, why);
	}
out_close:
	free(src);
	fclose(fp);
	return rc;
}

/* One scalar metadata value as JSON; NULL for arrays (vocabularies and
 * per-layer tables are large and say little here). */
static json_t *meta_value(const struct gguf_kv *kv)
{
	switch (kv->type) {
	case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64:
		return json_integer((json_int_t)kv->v.u64);
	case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
		return json_integer((json_int_t)kv->v.i64);
	case GGUF_F32: case GGUF_F64:
		return json_real(kv->v.f64);
	case GGUF_BOOL:
		return json_boolean(kv->v.u64);
	case GGUF_STRING: /* NULL when not UTF-8 */
		return json_stringn(kv->v.str.ptr, (size_t)kv->v.str.len);
	default:
		return NULL;
	}
}

char *loom_engine_metadata_json(const struct loom_engine *e)
{
	json_t *o = json_object();
	char *s;

	for (uint64_t i = 0; o && i < e->f->n_kv; i++) {
		const struct gguf_kv *kv = &e->f->kv[i];
		char key[256];
		json_t *v;

		if (kv->key.len >= sizeof(key))
			continue;
		memcpy(key, kv->key.ptr, (size_t)kv->key.len);
		key[kv->key.len] = '\0';
		if (!strncmp(key, "tokenizer.chat_template", 23) || strlen(key) != kv->key.len)
			continue; /* templates have their own field */
		v = meta_value(kv);
		if (v)
			json_object_set_new(o, key, v);
	}
	s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return s;
}

bool loom_engine_strategy(const struct loom_engine *e, int i, struct loom_strategy_info *out)
{
	struct loom_spec_kind_stats ks;

	if (i < 0 || i >= e->n_spec)
		return false;
	loom_spec_kind_stats(e->spec[i], &ks);
	*out = (struct loom_strategy_info){
		.name = loom_spec_kind_name(e->spec[i]), .path = loom_spec_kind_path(e->spec[i]),
		.max_draft = loom_spec_kind_max_draft(e->spec[i]), .n_steps = ks.n_steps,
		.n_drafted = ks.n_drafted, .n_accepted = ks.n_accepted, .n_tokens = ks.n_tokens,
	};
	return true;
}
