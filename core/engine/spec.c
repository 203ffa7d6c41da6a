/* Speculative decoding, host side (see spec.h and include/loom/spec.h).
 *
 * One verification step, with the sequence's last accepted token t not yet
 * in the cache (n_kv = n_hist - 1 tokens are):
 *   1. the plugin proposes d1..dk (k <= the room left);
 *   2. the target runs [t, d1..dk] as one chunk with logits for all k + 1
 *      rows (row i predicts what follows d_i; row 0 what follows t);
 *   3. rows are checked in order: greedy accepts d_{i+1} iff it is the
 *      token the plain sampler would pick from row i; sampling accepts it
 *      with probability min(1, p(d)/q(d)) and otherwise draws from
 *      normalize(max(0, p - q)) and stops (q is the plugin's distribution,
 *      or a point mass on d for deterministic proposers); if all k are
 *      accepted, row k gives one more token from p;
 *   4. the cache keeps t and the accepted drafts (loom_kv_truncate drops
 *      the rest); the token from step 3 is the new t.
 * p is loom_sampler_probs of the row with the same history the plain loop
 * would pass, so penalties, temperature, top-k/top-p/min-p all hold.
 *
 * Early exit (self-speculation) runs the target's first L layers and its
 * output head on the target's own cache and sequence: the drafted
 * positions get their first L layers' K/V written, the host truncates the
 * sequence back to n_kv before verification, and the verification pass
 * writes every layer of those positions again (bitwise the same values for
 * the first L layers). No second cache is needed.
 *
 * A draft model has its own weights, cache and sequence; the host mirrors
 * the tokens in its cache and, per request, rolls it back to the longest
 * prefix it shares with the sequence asked for.
 */
#include "engine/spec.h"
#include "util.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "plugin/loader.h"
#include "loom_config.h"

#define SPEC_MAX_DRAFT_LIMIT 64
#define DRAFT_POOL_CHUNK 256 /* tokens per draft-model pass in the pool */

/* A model the host runs for the plugin. */
struct spec_model {
	bool available;
	struct loom_model *m;     /* the early-exit view, or the draft model */
	struct loom_kv *kv;       /* the target's (early exit) or its own */
	struct loom_kv_seq *seq;  /* the target's (early exit) or &own_seq */
	struct loom_kv_seq own_seq;
	struct loom_exec *exec;
	int32_t max_chunk;
	int32_t *cached;          /* tokens whose K/V are in seq, n_ctx room */
	int64_t n_cached;
	/* owned by the draft model only */
	struct gguf_file *f;
	struct loom_tokenizer *tok;
};

struct loom_spec {
	void *dl;
	const struct loom_spec_plugin *p;
	char path[4096];
	struct loom_spec_config cfg;
	struct loom_session *s;
	int32_t n_vocab, n_ctx;
	struct loom_exec *verify;
	float *rows;   /* [max_draft + 1][n_vocab] target logits */
	float *ptgt;   /* [n_vocab] target distribution */
	float *resid;  /* [n_vocab] residual distribution */
	int32_t *dtok; /* [max_draft] */
	float *dprobs; /* [max_draft][n_vocab] */
	int32_t *chunk; /* [max_draft + 1] */
	int32_t *out_rows;
	struct spec_model ee, draft;
	struct loom_model ee_view;
	struct loom_node *ee_nodes;
	struct loom_spec_host host;
	struct loom_spec_params params;
	/* the current decode */
	int32_t *hist;
	int64_t n_hist;
	int32_t draft_room; /* drafts next_logits may take now (propose's max) */
	uint64_t rng[4], draft_rng[4];
	char err[1024];
};

void loom_spec_config_defaults(struct loom_spec_config *c)
{
	*c = (struct loom_spec_config){ .min_draft = 1, .max_draft = 8, .ngram_min = 1,
		.ngram_max = 4 };
}

const char *loom_spec_name(const struct loom_spec *sp)
{
	return sp->p->name ? sp->p->name : sp->path;
}

/* ---- random numbers (xoshiro256**, seeded by splitmix64) ---- */

static uint64_t mix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rot(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static double uniform(uint64_t s[4])
{
	uint64_t out = rot(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rot(s[3], 45);
	return (double)(out >> 11) * 0x1.0p-53;
}

static void seed_rng(uint64_t s[4], uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		s[i] = mix64(&seed);
}

/* Draws i with probability w[i] / sum(w) (negative and NaN weights count
 * as 0); -1 if nothing has weight. */
static int32_t draw_from(uint64_t rng[4], const float *w, int32_t n)
{
	double total = 0.0, target, cum = 0.0;
	int32_t last = -1;

	for (int32_t i = 0; i < n; i++)
		if (w[i] > 0.0f)
			total += w[i];
	if (!(total > 0.0) || !isfinite(total))
		return -1;
	target = uniform(rng) * total;
	for (int32_t i = 0; i < n; i++) {
		if (!(w[i] > 0.0f))
			continue;
		cum += w[i];
		last = i;
		if (target < cum)
			return i;
	}
	return last;
}

/* ---- finding and loading plugins (the one loader, plugin/loader.h) ---- */

#define SPEC_V1_SIZE (offsetof(struct loom_spec_plugin, destroy) + sizeof(void *))

static const struct loom_plugin_slot spec_required[] = {
	LOOM_PLUGIN_SLOT(struct loom_spec_plugin, create),
	LOOM_PLUGIN_SLOT(struct loom_spec_plugin, propose),
	LOOM_PLUGIN_SLOT(struct loom_spec_plugin, destroy),
};

/* Only the common checks: ABI, size and the three required slots. */
static const struct loom_plugin_kind spec_kind = {
	.what = "spec plugin", .desc_name = "descriptor", .entry = LOOM_SPEC_ENTRY,
	.env = "LOOM_SPEC_PATH", .build_dir = LOOM_BUILD_ROOT "/plugins/spec",
	.install_dir = LOOM_INSTALL_SPEC, .add_suffix = true, /* "ngram" names ngram.so */
	.abi_major = LOOM_SPEC_ABI_MAJOR, .min_size = SPEC_V1_SIZE,
	.required = spec_required,
	.n_required = sizeof(spec_required) / sizeof(spec_required[0]),
};

int loom_spec_resolve(const char *name, char *path, size_t cap, char *err,
		      size_t errlen)
{
	return loom_plugin_resolve(&spec_kind, name, path, cap, err, errlen);
}

int loom_spec_check(const char *path, const struct loom_spec_plugin *p, char *err,
		    size_t errlen)
{
	return loom_plugin_check(&spec_kind, path, p, err, errlen);
}

/* dlopens the plugin `name` resolves to and checks its descriptor; path
 * (cap bytes) gets the file. Never dlclose'd once it loads (loader.h). */
static int open_plugin(const char *name, char *path, size_t cap, void **dl,
		       const struct loom_spec_plugin **p, char *err, size_t errlen)
{
	*p = loom_plugin_open(&spec_kind, name, path, cap, dl, err, errlen);
	return *p ? 0 : -1;
}

static int load_plugin(struct loom_spec *sp, const char *name, char *err, size_t errlen)
{
	return open_plugin(name, sp->path, sizeof(sp->path), &sp->dl, &sp->p, err, errlen);
}

/* ---- models the plugin may run ---- */

static int model_seq_init(struct spec_model *sm, int32_t n_ctx, char *err, size_t errlen)
{
	sm->cached = malloc(sizeof(int32_t) * (size_t)n_ctx);
	if (!sm->cached) {
		loom_seterr(err, errlen, "speculation: out of memory");
		return -1;
	}
	return 0;
}

/* The target's first `layers` layers and its output nodes, on its cache. */
static int open_early_exit(struct loom_spec *sp, char *err, size_t errlen)
{
	struct loom_model *m = sp->s->m;
	int32_t layers = sp->cfg.layers, n = 0;

	if (layers <= 0)
		layers = (int32_t)(m->hp.n_layer / 2 > 0 ? m->hp.n_layer / 2 : 1);
	if (layers > m->hp.n_layer) {
		loom_seterr(err, errlen, "spec_layers: %d, but the model has %lld layers",
			layers, (long long)m->hp.n_layer);
		return -1;
	}
	sp->params.layers = layers;
	sp->ee_nodes = calloc((size_t)m->n_nodes, sizeof(*sp->ee_nodes));
	if (!sp->ee_nodes) {
		loom_seterr(err, errlen, "speculation: out of memory");
		return -1;
	}
	for (int i = 0; i < m->n_nodes; i++)
		if (m->nodes[i].layer < layers)
			sp->ee_nodes[n++] = m->nodes[i];
	sp->ee_view = *m;
	sp->ee_view.nodes = sp->ee_nodes;
	sp->ee_view.n_nodes = n;
	sp->ee.m = &sp->ee_view;
	sp->ee.kv = sp->s->kv;
	sp->ee.seq = &sp->s->seq;
	sp->ee.max_chunk = sp->cfg.max_draft + 1;
	sp->ee.exec = loom_exec_new(sp->ee.m, sp->ee.kv, sp->ee.max_chunk, 1, 1, err, errlen);
	if (!sp->ee.exec || model_seq_init(&sp->ee, sp->n_ctx, err, errlen))
		return -1;
	sp->ee.available = true;
	return 0;
}

/* The draft's vocabulary must be the target's, token for token. */
static int check_vocab(const struct loom_tokenizer *a, const struct loom_tokenizer *b,
		       const char *path, char *err, size_t errlen)
{
	int32_t n = loom_tokenizer_n_vocab(a);

	if (loom_tokenizer_n_vocab(b) != n) {
		loom_seterr(err, errlen, "draft model %s: vocabulary of %d tokens, the target has %d",
			path, loom_tokenizer_n_vocab(b), n);
		return -1;
	}
	for (int32_t i = 0; i < n; i++) {
		const char *x = loom_token_text(a, i), *y = loom_token_text(b, i);

		if (!x || !y || strcmp(x, y)) {
			loom_seterr(err, errlen, "draft model %s: token %d differs from the target's vocabulary",
				path, i);
			return -1;
		}
	}
	return 0;
}

static int open_draft(struct loom_spec *sp, const struct loom_tokenizer *tok,
		      const struct loom_model_params *mp, char *err, size_t errlen)
{
	struct spec_model *d = &sp->draft;
	const char *path = sp->cfg.draft_model;
	char why[2048];
	int64_t n_blocks = ((int64_t)sp->n_ctx + 15) / 16;

	d->f = gguf_open(path, why, sizeof(why));
	if (!d->f) {
		loom_seterr(err, errlen, "draft model %s: %s", path, why);
		return -1;
	}
	d->tok = loom_tokenizer_from_gguf(d->f, why, sizeof(why));
	if (!d->tok) {
		loom_seterr(err, errlen, "draft model %s: %s", path, why);
		return -1;
	}
	if (check_vocab(tok, d->tok, path, err, errlen))
		return -1;
	d->m = loom_model_load(d->f, mp, why, sizeof(why));
	if (!d->m) {
		loom_seterr(err, errlen, "draft model %s: %s", path, why);
		return -1;
	}
	if (d->m->hp.n_vocab != sp->n_vocab) {
		loom_seterr(err, errlen, "draft model %s: output of %lld tokens, the target has %d",
			path, (long long)d->m->hp.n_vocab, sp->n_vocab);
		return -1;
	}
	d->kv = loom_kv_new(d->m->be, d->m->hp.n_layer, d->m->hp.n_head_kv * d->m->hp.head_dim,
			    16, n_blocks, err, errlen);
	if (!d->kv)
		return -1;
	d->seq = &d->own_seq;
	d->max_chunk = sp->s->n_batch;
	d->exec = loom_exec_new(d->m, d->kv, d->max_chunk, 1, 1, err, errlen);
	if (!d->exec || model_seq_init(d, sp->n_ctx, err, errlen))
		return -1;
	d->available = true;
	sp->params.has_draft_model = 1;
	return 0;
}

static void close_model(struct spec_model *sm, bool owned)
{
	loom_exec_free(sm->exec);
	free(sm->cached);
	if (!owned)
		return;
	if (sm->kv) {
		loom_kv_seq_release(sm->kv, &sm->own_seq);
		loom_kv_free(sm->kv);
	}
	loom_model_free(sm->m);
	loom_tokenizer_free(sm->tok);
	gguf_close(sm->f);
}

/* Evaluates seq[from..len) on sm and leaves the last row's logits. */
static int model_eval(struct spec_model *sm, const int32_t *seq, int64_t from, int64_t len,
		      float *logits, char *err, size_t errlen)
{
	while (from < len) {
		int32_t n = len - from < sm->max_chunk ? (int32_t)(len - from) : sm->max_chunk;
		int32_t q_start[2] = { 0, n }, out_row = n - 1;
		struct loom_kv_seq *seqs[1] = { sm->seq };
		struct loom_batch b = { .n_tokens = n, .tokens = seq + from, .n_seqs = 1,
			.q_start = q_start, .seqs = seqs, .n_out = from + n == len,
			.out_rows = &out_row };
		int rc;

		if (loom_kv_reserve(sm->kv, sm->seq, n)) {
			loom_seterr(err, errlen, "speculation: cache out of blocks");
			return LOOM_ERR_NOMEM;
		}
		rc = loom_exec_step(sm->exec, &b, logits, err, errlen);
		if (rc)
			return rc;
		memcpy(sm->cached + from, seq + from, sizeof(int32_t) * (size_t)n);
		from += n;
		sm->n_cached = from;
	}
	return 0;
}

/* ---- host services ---- */

static void host_log(void *host, enum loom_log_level level, const char *msg)
{
	struct loom_spec *sp = host;

	if (level >= LOOM_LOG_WARN || getenv("LOOM_DEBUG"))
		fprintf(stderr, "loom: spec %s: %s\n", loom_spec_name(sp), msg);
}

static const int32_t *host_tokens(void *host, int64_t *n)
{
	struct loom_spec *sp = host;

	*n = sp->n_hist;
	return sp->hist;
}

static int host_next_logits(void *host, enum loom_spec_model which,
			    const int32_t *draft, int32_t n_draft, float *logits)
{
	struct loom_spec *sp = host;
	struct spec_model *sm = which == LOOM_SPEC_MODEL_EARLY_EXIT ? &sp->ee :
				which == LOOM_SPEC_MODEL_DRAFT ? &sp->draft : NULL;
	int64_t len, c = 0;
	int32_t *seq;

	if (!sm || !sm->available)
		return LOOM_ERR_UNSUPPORTED;
	if (n_draft < 0 || (n_draft && !draft) || !logits ||
	    n_draft > sp->draft_room)
		return LOOM_ERR_INVALID;
	for (int32_t i = 0; i < n_draft; i++)
		if (draft[i] < 0 || draft[i] >= sp->n_vocab)
			return LOOM_ERR_INVALID;
	/* hist has room for the drafts past n_hist (the caller made sure) */
	seq = sp->hist;
	memcpy(seq + sp->n_hist, draft, sizeof(int32_t) * (size_t)n_draft);
	len = sp->n_hist + n_draft;
	while (c < sm->n_cached && c < len && sm->cached[c] == seq[c])
		c++;
	if (c == len)
		c--; /* the last token must run to give logits */
	loom_kv_truncate(sm->kv, sm->seq, (int32_t)c);
	sm->n_cached = c;
	return model_eval(sm, seq, c, len, logits, sp->err, sizeof(sp->err));
}

static int32_t host_draw(void *host, const float *probs)
{
	struct loom_spec *sp = host;

	return probs ? draw_from(sp->draft_rng, probs, sp->n_vocab) : -1;
}

/* ---- open / free ---- */

static int alloc_buffers(struct loom_spec *sp, char *err, size_t errlen)
{
	size_t k = (size_t)sp->cfg.max_draft, v = (size_t)sp->n_vocab;

	sp->rows = malloc(sizeof(float) * (k + 1) * v);
	sp->ptgt = malloc(sizeof(float) * v);
	sp->resid = malloc(sizeof(float) * v);
	sp->dtok = malloc(sizeof(int32_t) * k);
	sp->dprobs = malloc(sizeof(float) * k * v);
	sp->chunk = malloc(sizeof(int32_t) * (k + 1));
	sp->out_rows = malloc(sizeof(int32_t) * (k + 1));
	if (!sp->rows || !sp->ptgt || !sp->resid || !sp->dtok || !sp->dprobs || !sp->chunk ||
	    !sp->out_rows) {
		loom_seterr(err, errlen, "speculation: out of memory");
		return -1;
	}
	for (size_t i = 0; i <= k; i++)
		sp->out_rows[i] = (int32_t)i;
	sp->verify = loom_exec_new(sp->s->m, sp->s->kv, (int32_t)k + 1, 1, (int32_t)k + 1,
				   err, errlen);
	return sp->verify ? 0 : -1;
}

static int check_config(const struct loom_spec_config *c, char *err, size_t errlen)
{
	if (c->min_draft < 1 || c->max_draft < c->min_draft || c->max_draft > SPEC_MAX_DRAFT_LIMIT) {
		loom_seterr(err, errlen, "speculation: need 1 <= spec_min_draft (%d) <= spec_max_draft (%d) <= %d",
			c->min_draft, c->max_draft, SPEC_MAX_DRAFT_LIMIT);
		return -1;
	}
	if (c->ngram_min < 1 || c->ngram_max < c->ngram_min) {
		loom_seterr(err, errlen, "speculation: need 1 <= spec_ngram_min (%d) <= spec_ngram_max (%d)",
			c->ngram_min, c->ngram_max);
		return -1;
	}
	return 0;
}

static void init_host(struct loom_spec *sp)
{
	sp->host = (struct loom_spec_host){
		.abi_major = LOOM_SPEC_ABI_MAJOR, .abi_minor = LOOM_SPEC_ABI_MINOR,
		.struct_size = sizeof(struct loom_spec_host), .host = sp,
		.log = host_log, .tokens = host_tokens, .next_logits = host_next_logits,
		.draw = host_draw,
	};
	sp->params = (struct loom_spec_params){
		.struct_size = sizeof(struct loom_spec_params), .n_vocab = sp->n_vocab,
		.min_draft = sp->cfg.min_draft, .max_draft = sp->cfg.max_draft,
		.ngram_min = sp->cfg.ngram_min, .ngram_max = sp->cfg.ngram_max,
	};
}

struct loom_spec *loom_spec_open(const struct loom_spec_config *c,
				 struct loom_session *target,
				 const struct loom_tokenizer *tok,
				 const struct loom_model_params *mp, bool *off,
				 char *err, size_t errlen)
{
	struct loom_spec *sp;

	*off = !c->plugin || !c->plugin[0] || !strcmp(c->plugin, "none");
	if (*off) {
		if (errlen)
			err[0] = '\0';
		return NULL;
	}
	if (check_config(c, err, errlen))
		return NULL;
	sp = calloc(1, sizeof(*sp));
	if (!sp) {
		loom_seterr(err, errlen, "speculation: out of memory");
		return NULL;
	}
	sp->cfg = *c;
	sp->s = target;
	sp->n_vocab = (int32_t)target->m->hp.n_vocab;
	sp->n_ctx = target->n_ctx;
	init_host(sp);
	if (load_plugin(sp, c->plugin, err, errlen) || alloc_buffers(sp, err, errlen) ||
	    open_early_exit(sp, err, errlen))
		goto out_free;
	if (c->draft_model && c->draft_model[0] && open_draft(sp, tok, mp, err, errlen))
		goto out_free;
	return sp;
out_free:
	loom_spec_free(sp);
	return NULL;
}

void loom_spec_free(struct loom_spec *sp)
{
	if (!sp)
		return;
	close_model(&sp->ee, false);
	close_model(&sp->draft, true);
	loom_exec_free(sp->verify);
	free(sp->ee_nodes);
	free(sp->rows);
	free(sp->ptgt);
	free(sp->resid);
	free(sp->dtok);
	free(sp->dprobs);
	free(sp->chunk);
	free(sp->out_rows);
	/* never dlclose: see backend_loader.c */
	free(sp);
}

/* ---- the decode loop ---- */

/* Makes w a distribution (negative and NaN weights become 0); -1 if no
 * weight is left. */
static int normalize(float *w, int32_t n)
{
	double total = 0.0;

	for (int32_t i = 0; i < n; i++) {
		if (!(w[i] > 0.0f))
			w[i] = 0.0f;
		total += w[i];
	}
	if (!(total > 0.0) || !isfinite(total))
		return -1;
	for (int32_t i = 0; i < n; i++)
		w[i] = (float)(w[i] / total);
	return 0;
}

/* Replays the host draws of a plugin that reported distributions: a draft
 * that is not what its own distribution gives here is replaced by the
 * replayed draw and the rest dropped. Returns the drafts kept; rng
 * advances as the plugin's draws did. */
static int32_t replay_drafts(uint64_t rng[4], int32_t *dtok, float *dprobs, int32_t V,
			     int32_t k)
{
	for (int32_t i = 0; i < k; i++) {
		int32_t t;

		if (normalize(dprobs + (size_t)i * V, V))
			return i;
		t = draw_from(rng, dprobs + (size_t)i * V, V);
		if (t != dtok[i]) {
			if (t < 0)
				return i;
			dtok[i] = t;
			return i + 1;
		}
	}
	return k;
}

/* Asks the plugin for up to max drafts; returns how many survive the
 * checks (ids in range, distributions replayed), or -1 with err set. */
static int32_t get_drafts(struct loom_spec *sp, struct loom_spec_ctx *ctx, int32_t max,
			  bool *has_probs, char *err, size_t errlen)
{
	struct loom_spec_draft d = { .max = max, .tokens = sp->dtok, .probs = sp->dprobs };
	uint64_t replay[4];
	int32_t k;

	memcpy(replay, sp->draft_rng, sizeof(replay));
	if (sp->ee.available) {
		memcpy(sp->ee.cached, sp->hist, sizeof(int32_t) * (size_t)sp->s->seq.n_tokens);
		sp->ee.n_cached = sp->s->seq.n_tokens;
	}
	sp->draft_room = max;
	sp->err[0] = '\0';
	k = sp->p->propose(ctx, &d);
	sp->draft_room = 0;
	/* early exit wrote the first layers past n_kv: verification redoes them */
	if (sp->ee.available && sp->s->seq.n_tokens > sp->n_hist - 1)
		loom_kv_truncate(sp->s->kv, &sp->s->seq, (int32_t)(sp->n_hist - 1));
	if (k < 0) {
		loom_seterr(err, errlen, "spec plugin %s: propose failed with status %d%s%s",
			sp->path, k, sp->err[0] ? ": " : "", sp->err);
		return -1;
	}
	if (k > max)
		k = max;
	for (int32_t i = 0; i < k; i++) {
		if (sp->dtok[i] < 0 || sp->dtok[i] >= sp->n_vocab) {
			k = i;
			break;
		}
	}
	*has_probs = d.has_probs != 0;
	if (!*has_probs)
		return k;
	k = replay_drafts(replay, sp->dtok, sp->dprobs, sp->n_vocab, k);
	memcpy(sp->draft_rng, replay, sizeof(replay));
	return k;
}

/* Runs [t, d1..dk] on the target; rows get k + 1 rows of logits. */
static int verify_pass(struct loom_spec *sp, int32_t k, char *err, size_t errlen)
{
	struct loom_session *s = sp->s;
	int32_t q_start[2] = { 0, k + 1 };
	struct loom_kv_seq *seqs[1] = { &s->seq };
	struct loom_batch b = { .n_tokens = k + 1, .tokens = sp->chunk, .n_seqs = 1,
		.q_start = q_start, .seqs = seqs, .n_out = k + 1, .out_rows = sp->out_rows };

	sp->chunk[0] = sp->hist[sp->n_hist - 1];
	memcpy(sp->chunk + 1, sp->dtok, sizeof(int32_t) * (size_t)k);
	if (loom_kv_reserve(s->kv, &s->seq, k + 1)) {
		loom_seterr(err, errlen, "kv cache: out of blocks");
		return -1;
	}
	return loom_exec_step(sp->verify, &b, sp->rows, err, errlen) ? -1 : 0;
}

/* The buffers one acceptance works on. */
struct verify_buf {
	int32_t n_vocab;
	float *rows;         /* [k + 1][n_vocab] target logits (penalties applied in place) */
	const int32_t *dtok; /* [k] drafts */
	const float *dprobs; /* [k][n_vocab] their distributions, or NULL (point masses) */
	float *ptgt, *resid; /* [n_vocab] scratch */
	uint64_t *rng;       /* [4] the acceptance stream */
};

/*
 * Checks the drafts against the rows. hist[n_hist..n_hist+k) already holds
 * the drafts (the history each row's penalties see). Returns the number
 * accepted; *next gets the target's own token that follows them.
 */
static int32_t accept_rows(const struct verify_buf *vb, struct loom_sampler *smp,
			   bool greedy, const int32_t *hist, int64_t n_hist, int32_t k,
			   int32_t *next)
{
	const int32_t V = vb->n_vocab;
	int32_t i;

	for (i = 0; i <= k; i++) {
		float *row = vb->rows + (size_t)i * V;
		const float *q = vb->dprobs && i < k ? vb->dprobs + (size_t)i * V : NULL;
		int32_t d = i < k ? vb->dtok[i] : -1, t;
		double pd, qd;

		if (greedy) {
			t = loom_sampler_sample(smp, row, hist, n_hist + i);
			if (t == d)
				continue;
			*next = t;
			return i;
		}
		loom_sampler_probs(smp, row, hist, n_hist + i, vb->ptgt);
		if (i == k) { /* every draft accepted: a bonus token from p */
			*next = draw_from(vb->rng, vb->ptgt, V);
			return k;
		}
		pd = vb->ptgt[d];
		qd = q ? q[d] : 1.0;
		if (uniform(vb->rng) * qd < pd)
			continue;
		/* rejected: draw from normalize(max(0, p - q)) */
		for (int32_t x = 0; x < V; x++) {
			float r = vb->ptgt[x] - (q ? q[x] : (x == d ? 1.0f : 0.0f));

			vb->resid[x] = r > 0.0f ? r : 0.0f;
		}
		t = draw_from(vb->rng, vb->resid, V);
		*next = t >= 0 ? t : draw_from(vb->rng, vb->ptgt, V);
		return i;
	}
	return k; /* not reached */
}

static int32_t accept(struct loom_spec *sp, struct loom_sampler *smp, bool greedy,
		      int32_t k, bool has_probs, int32_t *next)
{
	struct verify_buf vb = { .n_vocab = sp->n_vocab, .rows = sp->rows, .dtok = sp->dtok,
		.dprobs = has_probs ? sp->dprobs : NULL, .ptgt = sp->ptgt, .resid = sp->resid,
		.rng = sp->rng };

	return accept_rows(&vb, smp, greedy, sp->hist, sp->n_hist, k, next);
}

/* Appends and emits t; returns 1 to stop (end of generation or caller). */
static int push(struct loom_spec *sp, int32_t t, int64_t *made, loom_spec_emit_fn emit,
		void *user)
{
	int r;

	if (t < 0)
		return 1;
	r = emit(user, t);
	if (r == 1) /* end of generation: not counted, as in the plain loop */
		return 1;
	sp->hist[sp->n_hist++] = t;
	(*made)++;
	return r != 0;
}

static int32_t draft_cap(const struct loom_spec *sp, int64_t hist_cap, int32_t room)
{
	int64_t k = sp->cfg.max_draft;

	if (k > room - 1)
		k = room - 1;
	if (k > hist_cap - sp->n_hist)
		k = hist_cap - sp->n_hist;
	if (k > sp->n_ctx - sp->n_hist)
		k = sp->n_ctx - sp->n_hist;
	return k > 0 ? (int32_t)k : 0;
}

/* One propose / verify / accept round. Returns 1 when generation is over,
 * 0 to go on, -1 on error. */
static int spec_step(struct loom_spec *sp, struct loom_spec_ctx *ctx,
		     struct loom_sampler *smp, bool greedy, int64_t hist_cap,
		     int32_t n_predict, int64_t *made, loom_spec_emit_fn emit, void *user,
		     struct loom_spec_stats *st, char *err, size_t errlen)
{
	int32_t max = draft_cap(sp, hist_cap, (int32_t)(n_predict - *made));
	int32_t k = 0, n_acc, next = -1, i;
	int64_t n_kv = sp->n_hist - 1, first = sp->n_hist;
	bool has_probs = false;
	int stop = 0;

	if (max > 0)
		k = get_drafts(sp, ctx, max, &has_probs, err, errlen);
	if (k < 0 || verify_pass(sp, k, err, errlen))
		return -1;
	memcpy(sp->hist + sp->n_hist, sp->dtok, sizeof(int32_t) * (size_t)k);
	n_acc = accept(sp, smp, greedy, k, has_probs, &next);
	loom_kv_truncate(sp->s->kv, &sp->s->seq, (int32_t)(n_kv + 1 + n_acc));
	st->n_steps++;
	st->n_drafted += k;
	st->n_accepted += n_acc;
	for (i = 0; i < n_acc && !stop; i++)
		stop = push(sp, sp->dtok[i], made, emit, user);
	if (!stop)
		stop = push(sp, next, made, emit, user);
	if (sp->p->observe) {
		struct loom_spec_outcome o = { .n_proposed = k, .n_accepted = n_acc,
			.n_new = (int32_t)(sp->n_hist - first), .new_tokens = sp->hist + first };

		sp->p->observe(ctx, &o);
	}
	return stop || *made >= n_predict;
}

int64_t loom_spec_decode(struct loom_spec *sp, struct loom_sampler *smp, bool greedy,
			 uint64_t seed, int32_t *hist, int64_t n_hist, int64_t hist_cap,
			 int32_t n_predict, loom_spec_emit_fn emit, void *user,
			 struct loom_spec_stats *st, char *err, size_t errlen)
{
	struct loom_spec_ctx *ctx = NULL;
	char msg[512] = "";
	int64_t made = 0;
	int rc;

	*st = (struct loom_spec_stats){ 0 };
	sp->hist = hist;
	sp->n_hist = n_hist;
	seed_rng(sp->rng, seed ^ 0x5bec5bec5bec5becull);
	seed_rng(sp->draft_rng, seed ^ 0xd4af7d4af7d4af7dull);
	if (sp->draft.available) {
		loom_kv_truncate(sp->draft.kv, sp->draft.seq, 0);
		sp->draft.n_cached = 0;
	}
	if (n_predict <= 0)
		return 0;
	/* the first token comes from the prompt's logits, as in the plain loop */
	if (push(sp, loom_sampler_sample(smp, sp->s->logits, hist, n_hist), &made, emit, user) ||
	    made >= n_predict)
		return made;
	rc = sp->p->create(&sp->host, &sp->params, &ctx, msg, sizeof(msg));
	if (rc) {
		loom_seterr(err, errlen, "spec plugin %s: create failed (status %d)%s%s", sp->path,
			rc, msg[0] ? ": " : "", msg);
		return -1;
	}
	do
		rc = spec_step(sp, ctx, smp, greedy, hist_cap, n_predict, &made, emit, user, st,
			       err, errlen);
	while (rc == 0);
	sp->p->destroy(ctx);
	return rc < 0 ? -1 : made;
}

/* ---- per-sequence speculation (the scheduler) ----
 *
 * A kind is a strategy loaded once and shared by every sequence that asks
 * for it; each sequence gets its own plugin context and its own host
 * table (tokens, draw, log; no next_logits). The kind's counters are
 * atomics: the engine thread adds, any thread reads. */

struct loom_spec_kind {
	void *dl;
	const struct loom_spec_plugin *p;
	char path[4096];
	struct loom_spec_config cfg;
	int32_t n_vocab;
	int32_t ee_layers; /* early-exit layers offered to sequences; 0: none */
	struct loom_spec_draft_pool *pool; /* draft model offered; NULL: none */
	_Atomic uint64_t n_steps, n_drafted, n_accepted, n_tokens;
};

struct loom_spec_seq {
	struct loom_spec_kind *k;
	struct loom_spec_ctx *ctx;
	struct loom_spec_host host;
	struct loom_spec_params params;
	const int32_t *hist;
	int64_t n_hist;
	int32_t max_draft;
	int32_t *dtok;   /* [max_draft] */
	float *dprobs;   /* [max_draft][n_vocab] */
	bool has_probs;
	float *ptgt, *resid;
	uint64_t rng[4], draft_rng[4];
	/* the scheduler's model service (NULL: none) */
	loom_spec_model_fn model_fn;
	void *model_user;
	int32_t room;      /* drafts next_logits may take now (propose's max) */
	bool soft_fail;    /* the service ran out of blocks this propose */
	/* this sequence's cache in the draft pool (k->pool) */
	struct loom_kv_seq dseq;
	int32_t *dcached;  /* tokens whose K/V are in dseq, pool->n_ctx room */
	int64_t n_dcached;
};

/* ---- the draft model of `loom serve` (one, shared by the sequences) ----
 *
 * Loaded once; each sequence keeps its own block table in the pool's KV
 * cache and mirrors its tokens there, like the single-session draft model
 * above (longest shared prefix kept, the rest run). Engine thread only. */
struct loom_spec_draft_pool {
	struct gguf_file *f;
	struct loom_tokenizer *tok;
	struct loom_model *m;
	struct loom_kv *kv;
	struct loom_exec *exec;
	int32_t n_ctx, max_chunk;
	int32_t buf[DRAFT_POOL_CHUNK];
};

static void seq_log(void *host, enum loom_log_level level, const char *msg)
{
	struct loom_spec_seq *q = host;

	loom_log(level, "spec %s: %s", loom_spec_kind_name(q->k), msg);
}

static const int32_t *seq_tokens(void *host, int64_t *n)
{
	struct loom_spec_seq *q = host;

	*n = q->n_hist;
	return q->hist;
}

static int32_t seq_draw(void *host, const float *probs)
{
	struct loom_spec_seq *q = host;

	return probs ? draw_from(q->draft_rng, probs, q->k->n_vocab) : -1;
}

static int pool_logits(struct loom_spec_seq *q, const int32_t *draft, int32_t n_draft,
		       float *logits);

/* next_logits for a sequence: checks the call, then runs the draft model
 * (pool) or asks the scheduler (early exit). */
static int seq_next_logits(void *host, enum loom_spec_model which, const int32_t *draft,
			   int32_t n_draft, float *logits)
{
	struct loom_spec_seq *q = host;
	int rc;

	if (which == LOOM_SPEC_MODEL_DRAFT ? !q->k->pool :
	    which != LOOM_SPEC_MODEL_EARLY_EXIT || !q->k->ee_layers || !q->model_fn)
		return LOOM_ERR_UNSUPPORTED;
	if (n_draft < 0 || (n_draft && !draft) || !logits || n_draft > q->room)
		return LOOM_ERR_INVALID;
	for (int32_t i = 0; i < n_draft; i++)
		if (draft[i] < 0 || draft[i] >= q->k->n_vocab)
			return LOOM_ERR_INVALID;
	if (which == LOOM_SPEC_MODEL_DRAFT) {
		rc = pool_logits(q, draft, n_draft, logits);
		if (rc == LOOM_ERR_NOMEM)
			q->soft_fail = true;
		return rc;
	}
	rc = q->model_fn(q->model_user, which, q->k->ee_layers, q->hist, q->n_hist, draft,
			 n_draft, logits);
	if (rc == LOOM_ERR_NOMEM)
		q->soft_fail = true;
	return rc;
}

void loom_spec_draft_pool_free(struct loom_spec_draft_pool *p)
{
	if (!p)
		return;
	loom_exec_free(p->exec);
	loom_kv_free(p->kv);
	loom_model_free(p->m);
	loom_tokenizer_free(p->tok);
	if (p->f)
		gguf_close(p->f);
	free(p);
}

struct loom_spec_draft_pool *loom_spec_draft_pool_open(const char *path,
							const struct loom_tokenizer *tok,
							const struct loom_model_params *mp,
							int32_t n_ctx, int64_t n_blocks,
							char *err, size_t errlen)
{
	struct loom_spec_draft_pool *p = calloc(1, sizeof(*p));
	char why[2048];

	if (!p || n_ctx <= 0 || n_blocks <= 0 || n_blocks > INT32_MAX / 16) {
		loom_seterr(err, errlen, "draft model %s: %s", path,
			!p ? "out of memory" : "bad context or sequence count");
		free(p);
		return NULL;
	}
	p->n_ctx = n_ctx;
	p->max_chunk = DRAFT_POOL_CHUNK;
	p->f = gguf_open(path, why, sizeof(why));
	if (p->f)
		p->tok = loom_tokenizer_from_gguf(p->f, why, sizeof(why));
	if (!p->f || !p->tok) {
		loom_seterr(err, errlen, "draft model %s: %s", path, why);
		goto out_free;
	}
	if (check_vocab(tok, p->tok, path, err, errlen))
		goto out_free;
	p->m = loom_model_load(p->f, mp, why, sizeof(why));
	if (!p->m) {
		loom_seterr(err, errlen, "draft model %s: %s", path, why);
		goto out_free;
	}
	if (p->m->hp.n_vocab != loom_tokenizer_n_vocab(tok)) {
		loom_seterr(err, errlen, "draft model %s: output of %lld tokens, the target has %d",
			path, (long long)p->m->hp.n_vocab, loom_tokenizer_n_vocab(tok));
		goto out_free;
	}
	p->kv = loom_kv_new(p->m->be, p->m->hp.n_layer, p->m->hp.n_head_kv * p->m->hp.head_dim,
			    16, n_blocks, err, errlen);
	if (!p->kv)
		goto out_free;
	p->exec = loom_exec_new(p->m, p->kv, p->max_chunk, 1, 1, err, errlen);
	if (!p->exec)
		goto out_free;
	return p;
out_free:
	loom_spec_draft_pool_free(p);
	return NULL;
}

/* Logits of the draft model after hist + draft, in q's own cache. */
static int pool_logits(struct loom_spec_seq *q, const int32_t *draft, int32_t n_draft,
		       float *logits)
{
	struct loom_spec_draft_pool *p = q->k->pool;
	int64_t len = q->n_hist + n_draft, c = 0;
	char err[256];

	if (len > p->n_ctx || q->n_hist <= 0)
		return LOOM_ERR_INVALID;
	if (!q->dcached) {
		q->dcached = malloc(sizeof(int32_t) * (size_t)p->n_ctx);
		if (!q->dcached)
			return LOOM_ERR_NOMEM;
	}
#define TOK_AT(i) ((i) < q->n_hist ? q->hist[i] : draft[(i) - q->n_hist])
	while (c < q->n_dcached && c < len && q->dcached[c] == TOK_AT(c))
		c++;
	if (c == len)
		c--; /* the last token must run to give logits */
	loom_kv_truncate(p->kv, &q->dseq, (int32_t)c);
	q->n_dcached = c;
	while (c < len) {
		int32_t n = len - c < p->max_chunk ? (int32_t)(len - c) : p->max_chunk;
		int32_t q_start[2] = { 0, n }, out_row = n - 1;
		struct loom_kv_seq *seqs[1] = { &q->dseq };
		struct loom_batch b = { .n_tokens = n, .tokens = p->buf, .n_seqs = 1,
			.q_start = q_start, .seqs = seqs, .n_out = c + n == len,
			.out_rows = &out_row };
		int rc;

		for (int32_t i = 0; i < n; i++)
			p->buf[i] = TOK_AT(c + i);
		if (loom_kv_reserve(p->kv, &q->dseq, n))
			return LOOM_ERR_NOMEM; /* no drafts this step */
		rc = loom_exec_step(p->exec, &b, logits, err, sizeof(err));
		if (rc) {
			loom_log(LOOM_LOG_ERROR, "spec: draft model: %s", err);
			loom_kv_truncate(p->kv, &q->dseq, (int32_t)q->n_dcached);
			return rc;
		}
		memcpy(q->dcached + c, p->buf, sizeof(int32_t) * (size_t)n);
		c += n;
		q->n_dcached = c;
	}
#undef TOK_AT
	return 0;
}

/* Stands in for the scheduler's service while a kind is probed. */
static int probe_model_fn(void *user, enum loom_spec_model which, int32_t layers,
			  const int32_t *hist, int64_t n_hist, const int32_t *draft,
			  int32_t n_draft, float *logits)
{
	(void)user, (void)which, (void)layers, (void)hist, (void)n_hist, (void)draft;
	(void)n_draft, (void)logits;
	return LOOM_ERR_UNSUPPORTED;
}

const char *loom_spec_kind_name(const struct loom_spec_kind *k)
{
	return k->p->name && k->p->name[0] ? k->p->name : k->path;
}

const char *loom_spec_kind_path(const struct loom_spec_kind *k)
{
	return k->path;
}

int32_t loom_spec_kind_max_draft(const struct loom_spec_kind *k)
{
	return k->cfg.max_draft;
}

void loom_spec_kind_stats(const struct loom_spec_kind *k, struct loom_spec_kind_stats *st)
{
	st->n_steps = atomic_load(&k->n_steps);
	st->n_drafted = atomic_load(&k->n_drafted);
	st->n_accepted = atomic_load(&k->n_accepted);
	st->n_tokens = atomic_load(&k->n_tokens);
}

void loom_spec_kind_count(struct loom_spec_kind *k, int32_t drafted, int32_t accepted,
			  int32_t tokens)
{
	atomic_fetch_add(&k->n_steps, 1);
	atomic_fetch_add(&k->n_drafted, (uint64_t)drafted);
	atomic_fetch_add(&k->n_accepted, (uint64_t)accepted);
	atomic_fetch_add(&k->n_tokens, (uint64_t)tokens);
}

/* Creates and destroys one context on a one-token history, so that a
 * strategy the scheduler cannot serve is refused at start-up. */
static int kind_probe(struct loom_spec_kind *k, char *err, size_t errlen)
{
	struct loom_spec_seq *q;
	char why[512];

	q = loom_spec_seq_new_svc(k, 0, 1, k->ee_layers ? probe_model_fn : NULL, NULL, why,
				  sizeof(why));
	if (!q) {
		loom_seterr(err, errlen, "%s", why);
		return -1;
	}
	loom_spec_seq_free(q);
	return 0;
}

struct loom_spec_kind *loom_spec_kind_load(const char *name, const struct loom_spec_config *c,
					   int32_t n_vocab, char *err, size_t errlen)
{
	return loom_spec_kind_load_ee(name, c, n_vocab, 0, err, errlen);
}

struct loom_spec_kind *loom_spec_kind_load_ee(const char *name, const struct loom_spec_config *c,
					      int32_t n_vocab, int64_t n_layer, char *err,
					      size_t errlen)
{
	return loom_spec_kind_load_models(name, c, n_vocab, n_layer, NULL, err, errlen);
}

struct loom_spec_kind *loom_spec_kind_load_models(const char *name,
						  const struct loom_spec_config *c,
						  int32_t n_vocab, int64_t n_layer,
						  struct loom_spec_draft_pool *pool, char *err,
						  size_t errlen)
{
	struct loom_spec_kind *k;
	int64_t layers = c->layers > 0 ? c->layers : n_layer / 2 > 0 ? n_layer / 2 : 1;

	if (check_config(c, err, errlen))
		return NULL;
	if (n_vocab <= 0) {
		loom_seterr(err, errlen, "speculation: vocabulary of %d tokens", n_vocab);
		return NULL;
	}
	k = calloc(1, sizeof(*k));
	if (!k) {
		loom_seterr(err, errlen, "speculation: out of memory");
		return NULL;
	}
	k->cfg = *c;
	k->n_vocab = n_vocab;
	if (n_layer > 0 && layers > n_layer) {
		loom_seterr(err, errlen, "spec_layers: %lld, but the model has %lld layers",
			(long long)layers, (long long)n_layer);
		free(k);
		return NULL;
	}
	k->ee_layers = n_layer > 0 ? (int32_t)layers : 0;
	k->pool = pool;
	if (open_plugin(name, k->path, sizeof(k->path), &k->dl, &k->p, err, errlen) ||
	    kind_probe(k, err, errlen)) {
		free(k); /* never dlclose (plugin/loader.h) */
		return NULL;
	}
	return k;
}

void loom_spec_kind_free(struct loom_spec_kind *k)
{
	free(k); /* the plugin stays mapped */
}

static int seq_alloc(struct loom_spec_seq *q)
{
	size_t d = (size_t)q->max_draft, v = (size_t)q->k->n_vocab;

	q->dtok = malloc(sizeof(int32_t) * d);
	q->dprobs = malloc(sizeof(float) * d * v);
	q->ptgt = malloc(sizeof(float) * v);
	q->resid = malloc(sizeof(float) * v);
	return q->dtok && q->dprobs && q->ptgt && q->resid ? 0 : -1;
}

struct loom_spec_seq *loom_spec_seq_new(struct loom_spec_kind *k, int32_t max_draft,
					uint64_t seed, char *err, size_t errlen)
{
	return loom_spec_seq_new_svc(k, max_draft, seed, NULL, NULL, err, errlen);
}

struct loom_spec_seq *loom_spec_seq_new_svc(struct loom_spec_kind *k, int32_t max_draft,
					    uint64_t seed, loom_spec_model_fn fn, void *user,
					    char *err, size_t errlen)
{
	struct loom_spec_seq *q = calloc(1, sizeof(*q));
	char msg[512] = "";
	int rc;

	if (!q)
		goto out_nomem;
	q->k = k;
	q->model_fn = fn;
	q->model_user = user;
	q->max_draft = max_draft > 0 && max_draft <= SPEC_MAX_DRAFT_LIMIT ? max_draft :
		       k->cfg.max_draft;
	if (seq_alloc(q))
		goto out_free_nomem;
	seed_rng(q->rng, seed ^ 0x5bec5bec5bec5becull);
	seed_rng(q->draft_rng, seed ^ 0xd4af7d4af7d4af7dull);
	q->host = (struct loom_spec_host){
		.abi_major = LOOM_SPEC_ABI_MAJOR, .abi_minor = LOOM_SPEC_ABI_MINOR,
		.struct_size = sizeof(struct loom_spec_host), .host = q,
		.log = seq_log, .tokens = seq_tokens, .draw = seq_draw,
		.next_logits = (fn && k->ee_layers) || k->pool ? seq_next_logits : NULL,
	};
	q->params = (struct loom_spec_params){
		.struct_size = sizeof(struct loom_spec_params), .n_vocab = k->n_vocab,
		.min_draft = k->cfg.min_draft < q->max_draft ? k->cfg.min_draft : q->max_draft,
		.max_draft = q->max_draft, .ngram_min = k->cfg.ngram_min,
		.ngram_max = k->cfg.ngram_max, .layers = fn ? k->ee_layers : 0,
		.has_draft_model = k->pool != NULL,
	};
	rc = k->p->create(&q->host, &q->params, &q->ctx, msg, sizeof(msg));
	if (rc) {
		loom_seterr(err, errlen, "spec plugin %s: create failed (status %d)%s%s", k->path,
			rc, msg[0] ? ": " : "", msg);
		q->ctx = NULL;
		loom_spec_seq_free(q);
		return NULL;
	}
	return q;
out_free_nomem:
	loom_spec_seq_free(q);
out_nomem:
	loom_seterr(err, errlen, "speculation: out of memory");
	return NULL;
}

void loom_spec_seq_free(struct loom_spec_seq *q)
{
	if (!q)
		return;
	if (q->ctx)
		q->k->p->destroy(q->ctx);
	if (q->k->pool)
		loom_kv_seq_release(q->k->pool->kv, &q->dseq);
	free(q->dcached);
	free(q->dtok);
	free(q->dprobs);
	free(q->ptgt);
	free(q->resid);
	free(q);
}

int32_t loom_spec_seq_propose(struct loom_spec_seq *q, const int32_t *hist, int64_t n_hist,
			      int32_t max, int32_t *out, char *err, size_t errlen)
{
	struct loom_spec_draft d = { .tokens = q->dtok, .probs = q->dprobs };
	uint64_t replay[4];
	int32_t k;

	q->has_probs = false;
	if (max > q->max_draft)
		max = q->max_draft;
	if (max <= 0)
		return 0;
	d.max = max;
	q->hist = hist;
	q->n_hist = n_hist;
	memcpy(replay, q->draft_rng, sizeof(replay));
	q->room = max;
	q->soft_fail = false;
	k = q->k->p->propose(q->ctx, &d);
	q->room = 0;
	if (k < 0 && q->soft_fail)
		return 0; /* the scheduler had no blocks to draft in: no drafts */
	if (k < 0) {
		loom_seterr(err, errlen, "spec plugin %s: propose failed with status %d",
			q->k->path, k);
		return -1;
	}
	if (k > max)
		k = max;
	for (int32_t i = 0; i < k; i++) {
		if (q->dtok[i] < 0 || q->dtok[i] >= q->k->n_vocab) {
			k = i;
			break;
		}
	}
	if (d.has_probs) {
		k = replay_drafts(replay, q->dtok, q->dprobs, q->k->n_vocab, k);
		memcpy(q->draft_rng, replay, sizeof(replay));
		q->has_probs = true;
	}
	memcpy(out, q->dtok, sizeof(int32_t) * (size_t)k);
	return k;
}

int32_t loom_spec_seq_accept(struct loom_spec_seq *q, struct loom_sampler *smp, bool greedy,
			     float *rows, const int32_t *hist, int64_t n_hist, int32_t k,
			     int32_t *next)
{
	struct verify_buf vb = { .n_vocab = q->k->n_vocab, .rows = rows, .dtok = q->dtok,
		.dprobs = q->has_probs ? q->dprobs : NULL, .ptgt = q->ptgt, .resid = q->resid,
		.rng = q->rng };

	*next = -1;
	return accept_rows(&vb, smp, greedy, hist, n_hist, k, next);
}

void loom_spec_seq_observe(struct loom_spec_seq *q, int32_t k, int32_t n_acc,
			   const int32_t *new_tokens, int32_t n_new)
{
	struct loom_spec_outcome o = { .n_proposed = k, .n_accepted = n_acc, .n_new = n_new,
		.new_tokens = new_tokens };

	if (q->k->p->observe)
		q->k->p->observe(q->ctx, &o);
}
