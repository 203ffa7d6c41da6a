/* Speculative decoding, host side (internal): loading strategy plugins
 * (include/loom/spec.h), the services lent to them, and the acceptance of
 * their drafts. The scheduler runs every speculating sequence (loom run,
 * the API and loom serve alike): one strategy *kind* per plugin, one
 * context per sequence.
 *
 * A bare plugin name ("ngram.so", or "ngram") is looked up in each folder
 * of $LOOM_SPEC_PATH (colon-separated), then in the build tree's
 * plugins/spec/, then in <libdir>/loom/spec/. A name with '/' is a path.
 * "none" (or an empty name) means no speculation.
 */
#ifndef LOOM_SPEC_CORE_H
#define LOOM_SPEC_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/spec.h"
#include "model/model.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"

struct loom_spec_config {
	const char *plugin;      /* name or path; NULL/""/"none": off */
	int32_t min_draft, max_draft;
	int32_t ngram_min, ngram_max;
	const char *draft_model; /* GGUF path, or NULL */
	int32_t layers;          /* early-exit layers; 0: half the target's */
};

/* Defaults: min 1, max 8, n-grams 1..4, no draft model, layers 0. */
void loom_spec_config_defaults(struct loom_spec_config *c);

/* Resolves name to an existing file. 0 or -1 with err set. */
int loom_spec_resolve(const char *name, char *path, size_t cap, char *err,
		      size_t errlen);
/* Validates a descriptor (exposed for tests). 0 or -1 with err naming path. */
int loom_spec_check(const char *path, const struct loom_spec_plugin *p, char *err,
		    size_t errlen);

/* ---- per-sequence speculation ----
 *
 * A *kind* is a strategy loaded once and shared; each sequence that asks
 * for it gets its own plugin context (struct loom_spec_seq), created and
 * used on one thread. Through loom_spec_kind_load sequences get the
 * model-free services only (tokens, draw, log; next_logits is NULL), so a
 * strategy that needs a model (layerskip, draft) is refused there: it
 * creates and destroys one context to find out. loom_spec_kind_load_ee /
 * _models (below) also offer the early-exit model, run by the scheduler
 * (loom_spec_seq_new_svc), and a draft model (loom_spec_draft_pool). */
struct loom_spec_kind;
struct loom_spec_seq;

/* Loads and checks a strategy; c gives its defaults (draft lengths,
 * n-gram sizes). NULL with err naming the file and the reason. */
struct loom_spec_kind *loom_spec_kind_load(const char *name, const struct loom_spec_config *c,
					   int32_t n_vocab, char *err, size_t errlen);
/* After every sequence using k is freed. */
void loom_spec_kind_free(struct loom_spec_kind *k);
const char *loom_spec_kind_name(const struct loom_spec_kind *k);
const char *loom_spec_kind_path(const struct loom_spec_kind *k);
int32_t loom_spec_kind_max_draft(const struct loom_spec_kind *k);

/* Cumulative counters of every sequence of a kind (any thread). */
struct loom_spec_kind_stats {
	uint64_t n_steps;    /* verification steps */
	uint64_t n_drafted;  /* drafts verified */
	uint64_t n_accepted; /* of those, accepted */
	uint64_t n_tokens;   /* tokens those steps produced (accepted + target's) */
};
void loom_spec_kind_stats(const struct loom_spec_kind *k, struct loom_spec_kind_stats *st);
void loom_spec_kind_count(struct loom_spec_kind *k, int32_t drafted, int32_t accepted,
			  int32_t tokens);

/* A context for one sequence: at most max_draft drafts per step (<= 0:
 * the kind's), acceptance random streams from seed. NULL with err set. */
struct loom_spec_seq *loom_spec_seq_new(struct loom_spec_kind *k, int32_t max_draft,
					uint64_t seed, char *err, size_t errlen);
void loom_spec_seq_free(struct loom_spec_seq *q);
/* Up to max drafts to follow hist[0..n_hist) (the last token included),
 * written to out[]. Returns how many, or -1 with err set. */
int32_t loom_spec_seq_propose(struct loom_spec_seq *q, const int32_t *hist, int64_t n_hist,
			      int32_t max, int32_t *out, char *err, size_t errlen);
/* Checks the last proposal's first k drafts against rows [k + 1][n_vocab]
 * (row i follows draft i; penalties are applied in place); hist[n_hist ..
 * n_hist + k) must hold the drafts. Returns the drafts accepted; *next
 * gets the target's token after them (-1 if none could be drawn). */
int32_t loom_spec_seq_accept(struct loom_spec_seq *q, struct loom_sampler *smp, bool greedy,
			     float *rows, const int32_t *hist, int64_t n_hist, int32_t k,
			     int32_t *next);
/* ---- model services lent by the scheduler (appended) ----
 *
 * A scheduler that can run the early-exit model for one sequence passes
 * this function when it makes the sequence's context; the sequence's
 * plugin then sees host->next_logits. Called on the engine thread, from
 * inside loom_spec_seq_propose only: logits (n_vocab floats) for the token
 * after hist[0..n_hist) + draft[0..n_draft) under the target's first
 * `layers` layers. Returns 0, or a negative loom_status: LOOM_ERR_NOMEM
 * means "no KV blocks to draft in now", and the proposal that fails with
 * it is taken as no drafts (plain decoding this step), not as an error. */
typedef int (*loom_spec_model_fn)(void *user, enum loom_spec_model which, int32_t layers,
				  const int32_t *hist, int64_t n_hist, const int32_t *draft,
				  int32_t n_draft, float *logits);

/* As loom_spec_kind_load, but sequences are offered the early-exit model
 * of a target with n_layer layers (c->layers of them; 0: half), so
 * layerskip.so loads. n_layer 0: no model (as loom_spec_kind_load). */
struct loom_spec_kind *loom_spec_kind_load_ee(const char *name, const struct loom_spec_config *c,
					      int32_t n_vocab, int64_t n_layer, char *err,
					      size_t errlen);
/* As loom_spec_seq_new, with the scheduler's model service (fn NULL:
 * none; then a kind that needs a model fails here). */
struct loom_spec_seq *loom_spec_seq_new_svc(struct loom_spec_kind *k, int32_t max_draft,
					    uint64_t seed, loom_spec_model_fn fn, void *user,
					    char *err, size_t errlen);

/* A draft model for the scheduler's sequences (draft.so in `loom serve`):
 * loaded once from path with model params mp, its vocabulary checked
 * against tok token for token; its own KV cache has n_blocks blocks of
 * 16 tokens, each sequence (of at most n_ctx tokens) keeping its own block
 * table there (freed with the sequence). Used on the engine thread only. NULL
 * with err naming the file. Free after every kind using it. */
struct loom_spec_draft_pool;
struct loom_spec_draft_pool *loom_spec_draft_pool_open(const char *path,
							const struct loom_tokenizer *tok,
							const struct loom_model_params *mp,
							int32_t n_ctx, int64_t n_blocks,
							char *err, size_t errlen);
void loom_spec_draft_pool_free(struct loom_spec_draft_pool *p);
/* loom_spec_kind_load_ee that also offers the draft model of pool
 * (NULL: none) as LOOM_SPEC_MODEL_DRAFT; short of draft blocks, a
 * sequence drafts nothing that step. */
struct loom_spec_kind *loom_spec_kind_load_models(const char *name,
						  const struct loom_spec_config *c,
						  int32_t n_vocab, int64_t n_layer,
						  struct loom_spec_draft_pool *pool, char *err,
						  size_t errlen);

/* Tells the plugin what its last proposal came to. */
void loom_spec_seq_observe(struct loom_spec_seq *q, int32_t k, int32_t n_acc,
			   const int32_t *new_tokens, int32_t n_new);

#endif /* LOOM_SPEC_CORE_H */
