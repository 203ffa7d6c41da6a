/*
 * loom strategy-plugin ABI, version 1 (minor 1): speculative decoders.
 *
 * (A header of its own rather than a section of loom/plugin.h, so that a
 * strategy author includes exactly one file and the quantization ABI can
 * evolve separately. The conventions are plugin.h's.)
 *
 * A speculative decoder is a shared object exporting one symbol,
 * LOOM_SPEC_ENTRY ("loom_spec_entry"), that returns a `const struct
 * loom_spec_plugin`. The host checks abi_major, struct_size and the
 * required slots (create, propose, destroy) before it calls anything.
 * Plugins never link the core: what they need comes through struct
 * loom_spec_host.
 *
 * The contract: a plugin only PROPOSES draft tokens. The core verifies all
 * of them in one batched forward pass of the target model and accepts or
 * rejects them (greedy: exact match with the target's choice; sampling:
 * rejection sampling), so a plugin can change how fast loom generates,
 * never what it generates. A plugin that proposes garbage is merely slow.
 *
 * Lifecycle (per generation request):
 *   create()  once; the host MUST call destroy() if create() succeeded.
 *   propose() before each verification step; observe() after it.
 *   destroy() once.
 * All calls for one context come from one thread.
 */
#ifndef LOOM_SPEC_H
#define LOOM_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h" /* loom_status, loom_log_level */

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_SPEC_ABI_MAJOR 1
#define LOOM_SPEC_ABI_MINOR 1
#define LOOM_SPEC_ENTRY "loom_spec_entry"

/* Models a plugin can ask the host to run (host->next_logits). */
enum loom_spec_model {
	/* The target's first `layers` layers, then its output norm and head
	 * (self-speculation / early exit). */
	LOOM_SPEC_MODEL_EARLY_EXIT = 0,
	/* A second model sharing the target's vocabulary (--spec-draft-model). */
	LOOM_SPEC_MODEL_DRAFT = 1,
};

/* Settings the user gave (command line or config); the plugin may ignore
 * those it has no use for. */
struct loom_spec_params {
	uint32_t struct_size;
	int32_t n_vocab;
	int32_t min_draft; /* >= 1 */
	int32_t max_draft; /* >= min_draft */
	int32_t ngram_min; /* prompt lookup: shortest suffix to match, >= 1 */
	int32_t ngram_max; /* prompt lookup: longest suffix to match */
	int32_t layers;    /* early exit: target layers the host runs (0: none) */
	int32_t has_draft_model; /* 1 if LOOM_SPEC_MODEL_DRAFT is available */
	/* ---- generation 1.1 (read only when struct_size covers it) ---- */
	int32_t max_tree; /* nodes a propose_tree() may return (0: no trees) */
};

/*
 * Services the host lends a plugin, valid from create() until destroy()
 * returns. Every callback takes `host` as its first argument. Slots marked
 * optional may be NULL (the service is not available in this run).
 */
struct loom_spec_host {
	/* ---- generation 1.0 ---- */
	uint32_t abi_major;
	uint32_t abi_minor;
	uint32_t struct_size;
	void *host;
	void (*log)(void *host, enum loom_log_level level, const char *msg);
	/* The sequence so far: prompt and every accepted token, the last one
	 * included (its logits are not known yet: it is what the drafts
	 * follow). *n gets the length. The pointer is valid until the
	 * plugin's current call returns. */
	const int32_t *(*tokens)(void *host, int64_t *n);
	/* Optional. Logits (n_vocab floats into `logits`) for the token that
	 * follows tokens() + draft[0..n_draft) under `which` model. The host
	 * keeps that model's cache and reuses whatever prefix matches, so
	 * drafting autoregressively (n_draft = 0, 1, 2, ...) costs one token
	 * per call. Returns loom_status; LOOM_ERR_UNSUPPORTED if `which` is
	 * not available. */
	int (*next_logits)(void *host, enum loom_spec_model which,
			   const int32_t *draft, int32_t n_draft, float *logits);
	/* Optional. Draws a token from probs[0..n_vocab) (need not be
	 * normalized) with the host's draft random stream. A plugin that
	 * samples its drafts and reports their distributions MUST draw with
	 * this (see loom_spec_draft.probs). */
	int32_t (*draw)(void *host, const float *probs);
	/* ---- end of generation 1.0; append new slots below ---- */
};

/* What propose() fills in. The host owns the buffers. */
struct loom_spec_draft {
	int32_t max;    /* room in tokens (and rows of probs); never 0 */
	int32_t *tokens; /* [max]: the proposed continuation */
	/* [max][n_vocab]: the distribution each draft token was drawn from.
	 * Leave has_probs 0 for a deterministic proposer (prompt lookup,
	 * greedy drafting): the host then treats each draft as certain,
	 * which is exact for any proposer. If has_probs is 1, token i MUST
	 * have been drawn with host->draw(probs row i), conditioned on the
	 * drafts before it; the host replays those draws, and at the first
	 * token that is not what the replay gives it substitutes the replayed
	 * draw and drops the rest, so a plugin that lies about its
	 * distribution stays exact (and merely gets fewer tokens accepted). */
	float *probs;
	int32_t has_probs;
};

/*
 * Generation 1.1: what propose_tree() fills in, a tree of drafts. Node i
 * (0 <= i < n) is token tokens[i] following node parent[i] (< i), or the
 * sequence's last token when parent[i] is -1. Siblings should differ: the
 * host drops a node whose token repeats an earlier sibling's, with its
 * subtree, and a node with a bad parent or token likewise. The host owns
 * the buffers.
 *
 *   last token ─┬─ tokens[0] ─┬─ tokens[1]      parent: -1  0  0  -1
 *               │             └─ tokens[2]
 *               └─ tokens[3]
 *
 * The target verifies every node in one pass (each node sees the
 * sequence and its own ancestors) and keeps the longest path it accepts.
 * Put the likeliest child first: with sampling, children are tried in
 * order.
 */
struct loom_spec_tree {
	int32_t max;     /* room in nodes; never 0 */
	int32_t *tokens; /* [max] */
	int32_t *parent; /* [max] */
};

/* What happened to the last proposal (observe()). */
struct loom_spec_outcome {
	int32_t n_proposed; /* drafts the host verified (after any cut) */
	int32_t n_accepted; /* of those, accepted (a prefix) */
	/* Tokens appended to the sequence by this step: the accepted drafts
	 * and one token from the target (a correction or a bonus token). */
	int32_t n_new;
	const int32_t *new_tokens;
};

struct loom_spec_ctx; /* the plugin's own state */

struct loom_spec_plugin {
	/* ---- generation 1.0 ---- */
	uint32_t abi_major;
	uint32_t abi_minor;
	uint32_t struct_size; /* sizeof(struct loom_spec_plugin) when built */
	const char *name;     /* "ngram", "layerskip", ... */
	/* Required. 0 and *ctx set, or a negative loom_status (then the host
	 * reports msg, if the plugin wrote one, and does not call destroy).
	 * msg has room for msg_len bytes. */
	int (*create)(const struct loom_spec_host *host,
		      const struct loom_spec_params *params,
		      struct loom_spec_ctx **ctx, char *msg, size_t msg_len);
	/* Required. Fills d->tokens[0..n) (and d->probs if has_probs) and
	 * returns n in [0, d->max], or a negative loom_status (generation
	 * then fails). Returning 0 makes the host take an ordinary one-token
	 * step. The plugin should keep n within its adaptive draft length in
	 * [min_draft, max_draft] (fewer when it has nothing to propose). */
	int (*propose)(struct loom_spec_ctx *ctx, struct loom_spec_draft *d);
	/* Optional. Called after every step that followed a propose(). */
	void (*observe)(struct loom_spec_ctx *ctx, const struct loom_spec_outcome *o);
	/* Required. Frees ctx. */
	void (*destroy)(struct loom_spec_ctx *ctx);
	/* ---- end of generation 1.0 ---- */

	/* ---- generation 1.1 ---- */
	/* Optional. A tree of drafts instead of one continuation (struct
	 * loom_spec_tree): fills t->tokens and t->parent [0..n) and returns n
	 * in [0, t->max], or a negative loom_status (generation then fails).
	 * The host calls it instead of propose() when trees are on
	 * (params->max_tree > 0) and the target can verify them (a backend of
	 * ABI 1.8 with LOOM_OP_ATTENTION_TREE, no grammar); otherwise it calls
	 * propose(). observe() then reports the nodes verified as n_proposed
	 * and the accepted path's length as n_accepted. */
	int (*propose_tree)(struct loom_spec_ctx *ctx, struct loom_spec_tree *t);
	/* ---- end of generation 1.1; append new slots below ---- */
};

typedef const struct loom_spec_plugin *(*loom_spec_entry_fn)(void);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_SPEC_H */
