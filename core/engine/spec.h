/* Speculative decoding, host side (internal): loading strategy plugins
 * (include/loom/spec.h), the services lent to them (including every
 * drafting model: the early-exit view of the target and the draft model),
 * and the acceptance of their drafts. The scheduler plans every
 * speculating sequence (loom run, the API and loom serve alike) through
 * two calls, propose and accept: one strategy *kind* per plugin, one
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
	int32_t max_tree;        /* nodes of a token tree; 0: chains only */
};

/* Defaults: min 1, max 8, n-grams 1..4, no draft model, layers 0. */
void loom_spec_config_defaults(struct loom_spec_config *c);

/* Resolves name to an existing file. 0 or -1 with err set. */
int loom_spec_resolve(const char *name, char *path, size_t cap, char *err,
		      size_t errlen);
/* Validates a descriptor (exposed for tests). 0 or -1 with err naming path. */
int loom_spec_check(const char *path, const struct loom_spec_plugin *p, char *err,
		    size_t errlen);

/* ---- per-sequence speculation: the one room ----
 *
 * Every drafting runner lives here: the plugins' own lookups (ngram.so),
 * the early-exit runner over the target's first layers (layerskip.so) and
 * the draft model (draft.so). The scheduler sees two calls per step and
 * sequence: loom_spec_seq_propose ("up to max drafts after this
 * sequence") and, after the verification pass, loom_spec_seq_accept
 * ("these rows were verified: how many drafts to keep") followed by
 * loom_spec_seq_settle (the plugin learns the outcome, the kind counts).
 *
 * A *kind* is a strategy loaded once and shared; each sequence that asks
 * for it gets its own plugin context (struct loom_spec_seq), created and
 * used on one thread. Which models a kind may draft with is fixed when it
 * loads (struct loom_spec_models); a strategy that needs a model the host
 * does not offer is refused there (one context is made and destroyed to
 * find out). */
struct loom_spec_kind;
struct loom_spec_seq;
struct loom_spec_draft_pool;
struct loom_spec_target;
struct loom_kv;
struct loom_kv_seq;

/* The models a kind's sequences may draft with. */
struct loom_spec_models {
	/* Layers of the target (0: no early exit). Sequences get an early-exit
	 * runner over c->layers of them (0: half); more than n_layer is
	 * refused. */
	int64_t n_layer;
	/* A loaded draft model (NULL: none), offered as LOOM_SPEC_MODEL_DRAFT;
	 * short of draft blocks, a sequence drafts nothing that step. */
	struct loom_spec_draft_pool *pool;
};

/* Loads and checks a strategy; c gives its defaults (draft lengths,
 * n-gram sizes, early-exit layers), models what it may draft with (NULL:
 * no model: tokens, draw and log only). NULL with err naming the file and
 * the reason. */
struct loom_spec_kind *loom_spec_kind_load(const char *name, const struct loom_spec_config *c,
					   int32_t n_vocab, const struct loom_spec_models *models,
					   char *err, size_t errlen);
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

/* The target model and its KV cache, lent by the scheduler to the
 * early-exit runner (built at its first use; one sequence at a time, on
 * the engine thread). A distributed model offers no early exit. */
struct loom_spec_target *loom_spec_target_new(struct loom_model *m, struct loom_kv *kv,
					      int32_t max_ctx);
void loom_spec_target_free(struct loom_spec_target *t);

/* A context for one sequence: at most max_draft drafts per step (<= 0:
 * the kind's), acceptance random streams from seed, drafting on target t
 * (NULL: no early exit; then a kind that needs it fails here). NULL with
 * err set. */
struct loom_spec_seq *loom_spec_seq_new(struct loom_spec_kind *k, int32_t max_draft,
					uint64_t seed, struct loom_spec_target *t, char *err,
					size_t errlen);
void loom_spec_seq_free(struct loom_spec_seq *q);

/* Up to max drafts to follow hist[0..n_hist) (the last token included,
 * not yet in kvs, which holds the n_hist - 1 before it), written to
 * out[]. An early-exit runner may write past kvs's end while drafting;
 * kvs is back at n_hist - 1 tokens on return. Returns how many (0 also
 * when a runner had no KV blocks to draft in), or -1 with err set.
 * parent non-NULL (room for max + 1): the caller can verify a token tree,
 * and a strategy with trees (spec_tree > 0, propose_tree) may give one:
 * out[] then holds its nodes and parent[] the parent row of each row of
 * the verification chunk (row 0 the last token: -1; row 1 + i node i).
 * loom_spec_seq_is_tree says whether it did (else the drafts are a plain
 * continuation and parent[] is unspecified). */
int32_t loom_spec_seq_propose(struct loom_spec_seq *q, struct loom_kv_seq *kvs,
			      const int32_t *hist, int64_t n_hist, int32_t max, int32_t *out,
			      int32_t *parent, char *err, size_t errlen);
/* Whether the last proposal is a tree (rows with the parents it gave). */
bool loom_spec_seq_is_tree(const struct loom_spec_seq *q);
/* After a tree proposal: the caller kept k of its nodes (tokens[],
 * parent[] by row, as loom_spec_seq_propose gives them; a subset closed
 * under ancestors, renumbered), e.g. those a grammar allows; acceptance
 * walks these. A tree pruned to a chain is a chain (is_tree false). */
void loom_spec_seq_prune_tree(struct loom_spec_seq *q, int32_t k, const int32_t *tokens,
			      const int32_t *parent);
/* After a tree proposal of k nodes: walks rows [k + 1][n_vocab] (row r
 * follows the path to row r; penalties applied in place) from row 0 and
 * keeps the longest path the target accepts, greedy or by rejection
 * sampling. The path's tokens go to hist[n_hist ..] (room for k + 1),
 * path[d] gets the row at depth d + 1. Returns the path's length; *next
 * gets the target's token after it (-1 if none could be drawn). */
int32_t loom_spec_seq_accept_tree(struct loom_spec_seq *q, struct loom_sampler *smp,
				  bool greedy, float *rows, int32_t *hist, int64_t n_hist,
				  int32_t k, int32_t *path, int32_t *next);
/* Checks the last proposal's first k drafts against rows [k + 1][n_vocab]
 * (row i follows draft i; penalties are applied in place); hist[n_hist ..
 * n_hist + k) must hold the drafts. Returns the drafts accepted (the
 * caller keeps them and drops the rest); *next gets the target's token
 * after them (-1 if none could be drawn). */
int32_t loom_spec_seq_accept(struct loom_spec_seq *q, struct loom_sampler *smp, bool greedy,
			     float *rows, const int32_t *hist, int64_t n_hist, int32_t k,
			     int32_t *next);
/* After loom_spec_seq_accept: counts the step in the kind's statistics and,
 * when the plugin proposed (asked), tells it what its proposal came to:
 * k drafts, n_acc accepted, then new_tokens[0..n_acc] (the accepted
 * drafts and the target's token). */
void loom_spec_seq_settle(struct loom_spec_seq *q, bool asked, int32_t k, int32_t n_acc,
			  const int32_t *new_tokens);

/* A draft model for the scheduler's sequences (draft.so): loaded once
 * from path with model params mp, its vocabulary checked against tok
 * token for token; its own KV cache has n_blocks blocks of 16 tokens,
 * each sequence (of at most n_ctx tokens) keeping its own block table
 * there (freed with the sequence). Used on the engine thread only. NULL
 * with err naming the file. Free after every kind using it. */
struct loom_spec_draft_pool *loom_spec_draft_pool_open(const char *path,
							const struct loom_tokenizer *tok,
							const struct loom_model_params *mp,
							int32_t n_ctx, int64_t n_blocks,
							char *err, size_t errlen);
void loom_spec_draft_pool_free(struct loom_spec_draft_pool *p);

#endif /* LOOM_SPEC_CORE_H */
