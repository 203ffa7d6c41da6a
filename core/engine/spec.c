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
#include "engine/rng.h"
#include "util.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv.h"
#include "format/gguf.h"
#include "plugin/loader.h"
#include "loom_config.h"

#define SPEC_MAX_DRAFT_LIMIT 64
#define DRAFT_POOL_CHUNK 256 /* tokens per draft-model pass in the pool */
/* An early-exit pass runs the pending token and at most 64 drafts. */
#define EE_MAX_TOKENS (SPEC_MAX_DRAFT_LIMIT + 1)

void loom_spec_config_defaults(struct loom_spec_config *c)
{
	*c = (struct loom_spec_config){ .min_draft = 1, .max_draft = 8, .ngram_min = 1,
		.ngram_max = 4 };
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
	target = loom_rng_uniform(rng) * total;
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
#define TREE_SLOT_END (offsetof(struct loom_spec_plugin, propose_tree) + sizeof(void *))

static const struct loom_plugin_slot spec_required[] = {
	LOOM_PLUGIN_SLOT(struct loom_spec_plugin, create),
	LOOM_PLUGIN_SLOT(struct loom_spec_plugin, propose),
	LOOM_PLUGIN_SLOT(struct loom_spec_plugin, destroy),
};

static const struct loom_plugin_slot spec_optional[] = {
	LOOM_PLUGIN_SLOT(struct loom_spec_plugin, observe),
	LOOM_PLUGIN_SLOT(struct loom_spec_plugin, propose_tree), /* 1.1 */
};

/* Only the common checks: ABI, size, the name (may be NULL) and the
 * slots. */
static const struct loom_plugin_kind spec_kind = {
	.what = "spec plugin", .desc_name = "descriptor", .entry = LOOM_SPEC_ENTRY,
	.env = "LOOM_SPEC_PATH", .build_dir = LOOM_BUILD_ROOT "/plugins/spec",
	.dir = "spec", .add_suffix = true, /* "ngram" names ngram.so */
	.abi_major = LOOM_SPEC_ABI_MAJOR, .min_size = SPEC_V1_SIZE,
	.required = spec_required,
	.n_required = sizeof(spec_required) / sizeof(spec_required[0]),
	.optional = spec_optional,
	.n_optional = sizeof(spec_optional) / sizeof(spec_optional[0]),
};

const struct loom_plugin_kind *loom_spec_plugin_kind(void)
{
	return &spec_kind;
}

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

static int check_config(const struct loom_spec_config *c, char *err, size_t errlen)
{
	if (c->min_draft < 1 || c->max_draft < c->min_draft || c->max_draft > SPEC_MAX_DRAFT_LIMIT) {
		loom_seterr(err, errlen, "speculation: need 1 <= spec_min_draft (%d) <= spec_max_draft (%d) <= %d",
			c->min_draft, c->max_draft, SPEC_MAX_DRAFT_LIMIT);
		return -1;
	}
	if (c->max_tree < 0 || c->max_tree > SPEC_MAX_DRAFT_LIMIT) {
		loom_seterr(err, errlen, "speculation: need 0 <= spec_tree (%d) <= %d", c->max_tree,
			SPEC_MAX_DRAFT_LIMIT);
		return -1;
	}
	if (c->ngram_min < 1 || c->ngram_max < c->ngram_min) {
		loom_seterr(err, errlen, "speculation: need 1 <= spec_ngram_min (%d) <= spec_ngram_max (%d)",
			c->ngram_min, c->ngram_max);
		return -1;
	}
	return 0;
}

/* ---- verification ---- */

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
		if (loom_rng_uniform(vb->rng) * qd < pd)
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

/* ---- drafting runners: a model over a sequence's cached prefix ----
 *
 * Both models a plugin can draft with (the early-exit view of the target
 * and the draft model) run the same way: the sequence's cache holds
 * positions [base, kvs->n_tokens) of an earlier call, mirror[] their
 * tokens; the longest prefix shared with hist + draft is kept, the rest
 * runs in chunks of at most max_chunk tokens, and the logits of the last
 * token come back. Engine thread only, one sequence at a time. */

struct runner {
	struct loom_kv *kv;
	struct loom_exec *exec; /* NULL until built */
	int32_t max_chunk;
	int32_t *buf;           /* [max_chunk] */
};

/* Token at position p of hist[0..n_hist) + draft. */
static int32_t token_at(const int32_t *hist, int64_t n_hist, const int32_t *draft, int64_t p)
{
	return p < n_hist ? hist[p] : draft[p - n_hist];
}

/* Logits after hist + draft in kvs, mirror[] holding the tokens of its
 * positions from base on (room for len - base). 0, LOOM_ERR_NOMEM when
 * the cache has no blocks now, or another negative loom_status. */
static int runner_logits(struct runner *ru, struct loom_kv_seq *kvs, int32_t *mirror,
			 int64_t base, const int32_t *hist, int64_t n_hist,
			 const int32_t *draft, int32_t n_draft, float *logits)
{
	int64_t len = n_hist + n_draft, c = base;
	char err[256];

	while (c < kvs->n_tokens && c < len && mirror[c - base] == token_at(hist, n_hist, draft, c))
		c++;
	if (c == len)
		c--; /* the last token must run to give logits */
	if (c < kvs->n_tokens)
		loom_kv_truncate(ru->kv, kvs, (int32_t)c);
	while (c < len) {
		int32_t n = len - c < ru->max_chunk ? (int32_t)(len - c) : ru->max_chunk;
		int rc;

		for (int32_t i = 0; i < n; i++)
			ru->buf[i] = token_at(hist, n_hist, draft, c + i);
		rc = loom_kv_reserve(ru->kv, kvs, n);
		if (rc) /* the service's contract: LOOM_ERR_NOMEM is "no blocks now" */
			return rc == LOOM_ERR_FULL ? LOOM_ERR_NOMEM : rc;
		rc = loom_exec_one(ru->exec, kvs, ru->buf, n, c + n == len, logits, err, sizeof(err));
		if (rc) {
			loom_log(LOOM_LOG_ERROR, "spec: drafting model: %s", err);
			loom_kv_truncate(ru->kv, kvs, (int32_t)c);
			return rc;
		}
		memcpy(mirror + (c - base), ru->buf, sizeof(int32_t) * (size_t)n);
		c += n;
	}
	return 0;
}

/* The draft model (one, shared by the sequences): each sequence keeps its
 * own block table in the pool's KV cache and its tokens' mirror. */
struct loom_spec_draft_pool {
	struct gguf_file *f;
	struct loom_tokenizer *tok;
	struct loom_model *m;
	struct runner run;
	int32_t n_ctx;
	int32_t buf[DRAFT_POOL_CHUNK];
};

/* The early-exit runner: the target's first `layers` layers and its head
 * (the model's node list filtered by layer, same weights) on the target's
 * own cache, in the drafting sequence's own blocks. Positions it writes
 * past the sequence's last token are dropped when the proposal ends
 * (loom_spec_seq_propose), and the verification pass writes every layer
 * of them again. */
struct loom_spec_target {
	struct loom_model *m;
	struct loom_model view;
	struct loom_node *nodes;
	struct runner run;
	int32_t layers;    /* of the built view; 0: none yet */
	int32_t max_ctx;
	int32_t mirror[EE_MAX_TOKENS]; /* tokens at the positions it wrote */
	int32_t buf[EE_MAX_TOKENS];
};

struct loom_spec_target *loom_spec_target_new(struct loom_model *m, struct loom_kv *kv,
					      int32_t max_ctx)
{
	struct loom_spec_target *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->m = m;
	t->max_ctx = max_ctx;
	t->run = (struct runner){ .kv = kv, .max_chunk = EE_MAX_TOKENS, .buf = t->buf };
	return t;
}

void loom_spec_target_free(struct loom_spec_target *t)
{
	if (!t)
		return;
	loom_exec_free(t->run.exec);
	free(t->nodes);
	free(t);
}

/* Builds the layer-filtered view and its executor for `layers` layers
 * (once; again only if another strategy asks for another depth). */
static int target_ready(struct loom_spec_target *t, int32_t layers)
{
	const struct loom_model *m = t->m;
	char err[256];
	int32_t n = 0;

	if (t->run.exec && t->layers == layers)
		return 0;
	if (m->shard.dist) /* the view would run on rank 0 alone */
		return LOOM_ERR_UNSUPPORTED;
	loom_exec_free(t->run.exec);
	t->run.exec = NULL;
	if (!t->nodes)
		t->nodes = calloc((size_t)m->n_nodes, sizeof(*t->nodes));
	if (!t->nodes)
		return LOOM_ERR_NOMEM;
	for (int i = 0; i < m->n_nodes; i++)
		if (m->nodes[i].layer < layers)
			t->nodes[n++] = m->nodes[i];
	t->view = *m;
	t->view.nodes = t->nodes;
	t->view.n_nodes = n;
	t->run.exec = loom_exec_new(&t->view, t->run.kv, EE_MAX_TOKENS, 1, 1, err, sizeof(err));
	if (!t->run.exec) {
		loom_log(LOOM_LOG_ERROR, "spec: early exit: %s", err);
		return LOOM_ERR_NOMEM;
	}
	t->layers = layers;
	return 0;
}

/* ---- per-sequence speculation ----
 *
 * A kind is a strategy loaded once and shared by every sequence that asks
 * for it; each sequence gets its own plugin context and its own host
 * table. The kind's counters are atomics: the engine thread adds, any
 * thread reads. */

struct loom_spec_kind {
	void *dl;
	const struct loom_spec_plugin *p;
	char path[4096];
	struct loom_spec_config cfg;
	int32_t n_vocab;
	int32_t ee_layers; /* early-exit layers offered to sequences; 0: none */
	struct loom_spec_draft_pool *pool; /* draft model offered; NULL: none */
	bool probing;      /* loading: offer early exit without a target */
	_Atomic uint64_t n_steps, n_drafted, n_accepted, n_tokens;
};

struct loom_spec_seq {
	struct loom_spec_kind *k;
	struct loom_spec_ctx *ctx;
	struct loom_spec_host host;
	struct loom_spec_params params;
	/* the proposal being made */
	const int32_t *hist;
	int64_t n_hist;
	struct loom_kv_seq *kvs; /* the sequence's target cache */
	int32_t room;      /* drafts next_logits may take now (propose's max) */
	bool soft_fail;    /* a runner ran out of blocks this propose */
	/* the drafts and their acceptance */
	int32_t max_draft;
	int32_t max_tree; /* nodes of a tree proposal (0: trees off) */
	int32_t *dtok;   /* [max(max_draft, max_tree)] */
	int32_t *dpar;   /* [max_tree] a tree's parents, as the plugin gave them */
	float *dprobs;   /* [max_draft][n_vocab] */
	bool has_probs;
	bool tree;       /* the last proposal is a tree (dtok, dpar by row) */
	float *ptgt, *resid;
	uint64_t rng[4], draft_rng[4];
	/* runners: early exit on the target (NULL: none), and this
	 * sequence's cache in the draft pool (k->pool) */
	struct loom_spec_target *target;
	struct loom_kv_seq dseq;
	int32_t *dmirror;  /* tokens whose K/V are in dseq, pool->n_ctx room */
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

/* Logits of the draft model after the sequence + draft, in q's own
 * cache of the pool. */
static int pool_logits(struct loom_spec_seq *q, const int32_t *draft, int32_t n_draft,
		       float *logits)
{
	struct loom_spec_draft_pool *p = q->k->pool;

	if (q->n_hist + n_draft > p->n_ctx || q->n_hist <= 0)
		return LOOM_ERR_INVALID;
	if (!q->dmirror) {
		q->dmirror = malloc(sizeof(int32_t) * (size_t)p->n_ctx);
		if (!q->dmirror)
			return LOOM_ERR_NOMEM;
	}
	return runner_logits(&p->run, &q->dseq, q->dmirror, 0, q->hist, q->n_hist, draft,
			     n_draft, logits);
}

/* Logits of the target's first layers after the sequence + draft, in the
 * sequence's own blocks from its last token on. */
static int early_exit_logits(struct loom_spec_seq *q, const int32_t *draft, int32_t n_draft,
			     float *logits)
{
	struct loom_spec_target *t = q->target;
	int64_t base = q->n_hist - 1;
	int rc;

	if (!q->kvs || q->kvs->n_tokens < base || 1 + n_draft > EE_MAX_TOKENS ||
	    q->n_hist + n_draft > t->max_ctx)
		return LOOM_ERR_INVALID;
	rc = target_ready(t, q->k->ee_layers);
	if (rc)
		return rc;
	return runner_logits(&t->run, q->kvs, t->mirror, base, q->hist, q->n_hist, draft,
			     n_draft, logits);
}

/* next_logits for a sequence: checks the call, then runs the draft model
 * (pool) or the early-exit view of the target. */
static int seq_next_logits(void *host, enum loom_spec_model which, const int32_t *draft,
			   int32_t n_draft, float *logits)
{
	struct loom_spec_seq *q = host;
	int rc;

	if (which == LOOM_SPEC_MODEL_DRAFT ? !q->k->pool :
	    which != LOOM_SPEC_MODEL_EARLY_EXIT || !q->k->ee_layers || !q->target)
		return LOOM_ERR_UNSUPPORTED;
	if (n_draft < 0 || (n_draft && !draft) || !logits || n_draft > q->room)
		return LOOM_ERR_INVALID;
	for (int32_t i = 0; i < n_draft; i++)
		if (draft[i] < 0 || draft[i] >= q->k->n_vocab)
			return LOOM_ERR_INVALID;
	rc = which == LOOM_SPEC_MODEL_DRAFT ? pool_logits(q, draft, n_draft, logits) :
	     early_exit_logits(q, draft, n_draft, logits);
	if (rc == LOOM_ERR_NOMEM)
		q->soft_fail = true;
	return rc;
}

void loom_spec_draft_pool_free(struct loom_spec_draft_pool *p)
{
	if (!p)
		return;
	loom_exec_free(p->run.exec);
	loom_kv_free(p->run.kv);
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
	p->run = (struct runner){ .max_chunk = DRAFT_POOL_CHUNK, .buf = p->buf };
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
	p->run.kv = loom_kv_new(p->m->be, p->m->hp.n_layer, p->m->hp.n_head_kv * p->m->hp.head_dim,
				16, n_blocks, err, errlen);
	if (!p->run.kv)
		goto out_free;
	p->run.exec = loom_exec_new(p->m, p->run.kv, DRAFT_POOL_CHUNK, 1, 1, err, errlen);
	if (!p->run.exec)
		goto out_free;
	return p;
out_free:
	loom_spec_draft_pool_free(p);
	return NULL;
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
	return k->cfg.max_tree > k->cfg.max_draft && k->p->struct_size >= TREE_SLOT_END &&
	       k->p->propose_tree ? k->cfg.max_tree : k->cfg.max_draft;
}

void loom_spec_kind_stats(const struct loom_spec_kind *k, struct loom_spec_kind_stats *st)
{
	st->n_steps = atomic_load(&k->n_steps);
	st->n_drafted = atomic_load(&k->n_drafted);
	st->n_accepted = atomic_load(&k->n_accepted);
	st->n_tokens = atomic_load(&k->n_tokens);
}

/* Creates and destroys one context on a one-token history, so that a
 * strategy the host cannot serve is refused at start-up. */
static int kind_probe(struct loom_spec_kind *k, char *err, size_t errlen)
{
	struct loom_spec_seq *q;
	char why[512];

	k->probing = true;
	q = loom_spec_seq_new(k, 0, 1, NULL, why, sizeof(why));
	k->probing = false;
	if (!q) {
		loom_seterr(err, errlen, "%s", why);
		return -1;
	}
	loom_spec_seq_free(q);
	return 0;
}

struct loom_spec_kind *loom_spec_kind_load(const char *name, const struct loom_spec_config *c,
					   int32_t n_vocab, const struct loom_spec_models *models,
					   char *err, size_t errlen)
{
	int64_t n_layer = models ? models->n_layer : 0;
	int64_t layers = c->layers > 0 ? c->layers : n_layer / 2 > 0 ? n_layer / 2 : 1;
	struct loom_spec_kind *k;

	if (check_config(c, err, errlen))
		return NULL;
	if (n_vocab <= 0) {
		loom_seterr(err, errlen, "speculation: vocabulary of %d tokens", n_vocab);
		return NULL;
	}
	if (n_layer > 0 && layers > n_layer) {
		loom_seterr(err, errlen, "spec_layers: %lld, but the model has %lld layers",
			(long long)layers, (long long)n_layer);
		return NULL;
	}
	k = calloc(1, sizeof(*k));
	if (!k) {
		loom_seterr(err, errlen, "speculation: out of memory");
		return NULL;
	}
	k->cfg = *c;
	k->n_vocab = n_vocab;
	k->ee_layers = n_layer > 0 ? (int32_t)layers : 0;
	k->pool = models ? models->pool : NULL;
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
	size_t n = q->max_tree > q->max_draft ? (size_t)q->max_tree : d;

	q->dtok = malloc(sizeof(int32_t) * n);
	q->dpar = malloc(sizeof(int32_t) * (n + 1));
	q->dprobs = malloc(sizeof(float) * d * v);
	q->ptgt = malloc(sizeof(float) * v);
	q->resid = malloc(sizeof(float) * v);
	return q->dtok && q->dpar && q->dprobs && q->ptgt && q->resid ? 0 : -1;
}

struct loom_spec_seq *loom_spec_seq_new(struct loom_spec_kind *k, int32_t max_draft,
					uint64_t seed, struct loom_spec_target *t, char *err,
					size_t errlen)
{
	struct loom_spec_seq *q = calloc(1, sizeof(*q));
	bool early_exit = k->ee_layers && (t || k->probing);
	char msg[512] = "";
	int rc;

	if (!q)
		goto out_nomem;
	q->k = k;
	q->target = t;
	q->max_draft = max_draft > 0 && max_draft <= SPEC_MAX_DRAFT_LIMIT ? max_draft :
		       k->cfg.max_draft;
	if (k->p->struct_size >= TREE_SLOT_END && k->p->propose_tree)
		q->max_tree = k->cfg.max_tree;
	if (seq_alloc(q))
		goto out_free_nomem;
	loom_rng_seed(q->rng, seed ^ 0x5bec5bec5bec5becull);
	loom_rng_seed(q->draft_rng, seed ^ 0xd4af7d4af7d4af7dull);
	q->host = (struct loom_spec_host){
		.abi_major = LOOM_SPEC_ABI_MAJOR, .abi_minor = LOOM_SPEC_ABI_MINOR,
		.struct_size = sizeof(struct loom_spec_host), .host = q,
		.log = seq_log, .tokens = seq_tokens, .draw = seq_draw,
		.next_logits = early_exit || k->pool ? seq_next_logits : NULL,
	};
	q->params = (struct loom_spec_params){
		.struct_size = sizeof(struct loom_spec_params), .n_vocab = k->n_vocab,
		.min_draft = k->cfg.min_draft < q->max_draft ? k->cfg.min_draft : q->max_draft,
		.max_draft = q->max_draft, .ngram_min = k->cfg.ngram_min,
		.ngram_max = k->cfg.ngram_max, .layers = early_exit ? k->ee_layers : 0,
		.has_draft_model = k->pool != NULL, .max_tree = q->max_tree,
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
		loom_kv_seq_release(q->k->pool->run.kv, &q->dseq);
	free(q->dmirror);
	free(q->dtok);
	free(q->dpar);
	free(q->dprobs);
	free(q->ptgt);
	free(q->resid);
	free(q);
}

/* Runs the plugin's propose (or propose_tree, with t) with the sequence
 * lent to its services. */
static int32_t call_propose(struct loom_spec_seq *q, struct loom_kv_seq *kvs,
			    const int32_t *hist, int64_t n_hist, struct loom_spec_draft *d,
			    struct loom_spec_tree *t)
{
	int32_t k;

	q->hist = hist;
	q->n_hist = n_hist;
	q->kvs = kvs;
	q->room = t ? t->max : d->max;
	q->soft_fail = false;
	k = t ? q->k->p->propose_tree(q->ctx, t) : q->k->p->propose(q->ctx, d);
	q->room = 0;
	/* the early-exit runner wrote its first layers past the last token:
	 * drop them, the verification pass writes every layer again */
	if (q->target && kvs && kvs->n_tokens > n_hist - 1)
		loom_kv_truncate(q->target->run.kv, kvs, (int32_t)(n_hist - 1));
	q->kvs = NULL;
	return k;
}

/*
 * Keeps the well-formed part of the plugin's tree of k nodes (q->dtok,
 * q->dpar): a node whose parent was dropped or is not earlier, whose
 * token is out of the vocabulary or repeats an earlier sibling's is
 * dropped with its subtree. Writes the kept tokens to out[] and their
 * rows' parents to parent[] (row 0 the last token, parent -1; row 1 + i
 * node i). Returns the nodes kept; *chain: each row's parent is the row
 * before (a plain continuation).
 */
static int32_t tree_rows(struct loom_spec_seq *q, int32_t k, int32_t *out, int32_t *parent,
			 bool *chain)
{
	int32_t *row = q->dpar; /* row[i] replaces dpar[i] once read */
	int32_t n = 0;

	parent[0] = -1;
	*chain = true;
	for (int32_t i = 0; i < k; i++) {
		int32_t p = q->dpar[i], tok = q->dtok[i], pr;
		bool ok = p >= -1 && p < i && (p < 0 || row[p] >= 0) && tok >= 0 &&
			  tok < q->k->n_vocab;

		pr = ok ? (p < 0 ? 0 : row[p]) : -1;
		for (int32_t j = 1; ok && j <= n; j++)
			if (parent[j] == pr && out[j - 1] == tok)
				ok = false; /* a repeated sibling */
		row[i] = ok ? ++n : -1;
		if (!ok)
			continue;
		out[n - 1] = tok;
		parent[n] = pr;
		*chain &= pr == n - 1;
	}
	/* what acceptance walks: the kept nodes, by row */
	memcpy(q->dtok, out, sizeof(int32_t) * (size_t)n);
	memcpy(q->dpar, parent, sizeof(int32_t) * (size_t)(n + 1));
	return n;
}

int32_t loom_spec_seq_propose(struct loom_spec_seq *q, struct loom_kv_seq *kvs,
			      const int32_t *hist, int64_t n_hist, int32_t max, int32_t *out,
			      int32_t *parent, char *err, size_t errlen)
{
	struct loom_spec_draft d = { .tokens = q->dtok, .probs = q->dprobs };
	struct loom_spec_tree t = { .tokens = q->dtok, .parent = q->dpar };
	bool tree = parent && q->max_tree > 0, chain = true;
	uint64_t replay[4];
	int32_t k;

	q->has_probs = false;
	q->tree = false;
	if (max > (tree ? q->max_tree : q->max_draft))
		max = tree ? q->max_tree : q->max_draft;
	if (max <= 0)
		return 0;
	d.max = t.max = max;
	memcpy(replay, q->draft_rng, sizeof(replay));
	k = call_propose(q, kvs, hist, n_hist, &d, tree ? &t : NULL);
	if (k < 0 && q->soft_fail)
		return 0; /* a runner had no blocks to draft in: no drafts */
	if (k < 0) {
		loom_seterr(err, errlen, "spec plugin %s: propose failed with status %d",
			q->k->path, k);
		return -1;
	}
	if (k > max)
		k = max;
	if (tree) {
		k = tree_rows(q, k, out, parent, &chain);
		q->tree = !chain;
		return k;
	}
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

/* The first child of row r at or after row `from` (rows > r), or -1. */
static int32_t next_child(const struct loom_spec_seq *q, int32_t k, int32_t r, int32_t from)
{
	for (int32_t c = from; c <= k; c++)
		if (q->dpar[c] == r)
			return c;
	return -1;
}

/*
 * Rejection sampling over the children of one node, each a point mass on
 * its token (siblings differ): child x is accepted with probability p(x)
 * under what is left of p; on rejection p(x) becomes 0 and p is
 * renormalized (normalize(max(0, p - q)) for q the point mass), and the
 * next child is tried. Each emitted token is distributed as p (SpecInfer's
 * multi-draft rule with deterministic drafts). p is vb->ptgt. Returns the
 * accepted child's row, or -1 with *next drawn from what is left.
 */
static int32_t accept_children(const struct loom_spec_seq *q, const struct verify_buf *vb,
			       int32_t k, int32_t r, int32_t *next)
{
	for (int32_t c = next_child(q, k, r, r + 1); c >= 0; c = next_child(q, k, r, c + 1)) {
		int32_t x = q->dtok[c - 1];

		if (loom_rng_uniform(vb->rng) < vb->ptgt[x])
			return c;
		vb->ptgt[x] = 0.0f;
		if (normalize(vb->ptgt, vb->n_vocab))
			break;
	}
	*next = draw_from(vb->rng, vb->ptgt, vb->n_vocab);
	return -1;
}

/*
 * Walks the tree of the last proposal from row 0: at row r (depth d) the
 * target's choice (greedy: the sampler's pick; sampling: the rule above)
 * either is a child, which is taken, or ends the walk as *next. The
 * history row r's sampler sees is the sequence plus the path to r: the
 * path's tokens are written to hist[n_hist + d] as it goes. Returns the
 * path's length; path[d] gets the row at depth d + 1.
 */
static int32_t accept_tree(struct loom_spec_seq *q, const struct verify_buf *vb,
			   struct loom_sampler *smp, bool greedy, int32_t *hist, int64_t n_hist,
			   int32_t k, int32_t *path, int32_t *next)
{
	const int32_t V = vb->n_vocab;
	int32_t r = 0, d = 0;

	for (;;) {
		float *row = vb->rows + (size_t)r * V;
		int32_t c = -1, t;

		if (greedy) {
			t = loom_sampler_sample(smp, row, hist, n_hist + d);
			for (c = next_child(q, k, r, r + 1); c >= 0 && q->dtok[c - 1] != t;)
				c = next_child(q, k, r, c + 1);
			if (c < 0)
				*next = t;
		} else {
			loom_sampler_probs(smp, row, hist, n_hist + d, vb->ptgt);
			c = accept_children(q, vb, k, r, next);
		}
		if (c < 0)
			return d;
		hist[n_hist + d] = q->dtok[c - 1];
		path[d++] = c;
		r = c;
	}
}

int32_t loom_spec_seq_accept_tree(struct loom_spec_seq *q, struct loom_sampler *smp,
				  bool greedy, float *rows, int32_t *hist, int64_t n_hist,
				  int32_t k, int32_t *path, int32_t *next)
{
	struct verify_buf vb = { .n_vocab = q->k->n_vocab, .rows = rows, .ptgt = q->ptgt,
		.resid = q->resid, .rng = q->rng };

	*next = -1;
	return accept_tree(q, &vb, smp, greedy, hist, n_hist, k, path, next);
}

bool loom_spec_seq_is_tree(const struct loom_spec_seq *q)
{
	return q->tree;
}

void loom_spec_seq_prune_tree(struct loom_spec_seq *q, int32_t k, const int32_t *tokens,
			      const int32_t *parent)
{
	bool chain = true;

	for (int32_t i = 1; i <= k; i++)
		chain &= parent[i] == i - 1;
	memcpy(q->dtok, tokens, sizeof(int32_t) * (size_t)k);
	memcpy(q->dpar, parent, sizeof(int32_t) * (size_t)(k + 1));
	q->tree = q->tree && !chain;
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

void loom_spec_seq_settle(struct loom_spec_seq *q, bool asked, int32_t k, int32_t n_acc,
			  const int32_t *new_tokens)
{
	struct loom_spec_outcome o = { .n_proposed = k, .n_accepted = n_acc, .n_new = n_acc + 1,
		.new_tokens = new_tokens };
	struct loom_spec_kind *kd = q->k;

	if (asked && kd->p->observe)
		kd->p->observe(q->ctx, &o);
	atomic_fetch_add(&kd->n_steps, 1);
	atomic_fetch_add(&kd->n_drafted, (uint64_t)k);
	atomic_fetch_add(&kd->n_accepted, (uint64_t)n_acc);
	atomic_fetch_add(&kd->n_tokens, (uint64_t)n_acc + 1);
}
