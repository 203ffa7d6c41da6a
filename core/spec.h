/* Speculative decoding, host side (internal): loading strategy plugins
 * (include/loom/spec.h), the services lent to them, and the verification
 * loop that accepts or rejects their drafts.
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
#include "model.h"
#include "sampler.h"
#include "session.h"
#include "tokenizer.h"

struct loom_spec_config {
	const char *plugin;      /* name or path; NULL/""/"none": off */
	int32_t min_draft, max_draft;
	int32_t ngram_min, ngram_max;
	const char *draft_model; /* GGUF path, or NULL */
	int32_t layers;          /* early-exit layers; 0: half the target's */
};

/* Defaults: min 1, max 8, n-grams 1..4, no draft model, layers 0. */
void loom_spec_config_defaults(struct loom_spec_config *c);

struct loom_spec;

/* Resolves name to an existing file. 0 or -1 with err set. */
int loom_spec_resolve(const char *name, char *path, size_t cap, char *err,
		      size_t errlen);
/* Validates a descriptor (exposed for tests). 0 or -1 with err naming path. */
int loom_spec_check(const char *path, const struct loom_spec_plugin *p, char *err,
		    size_t errlen);
/* Loads the plugin (and the draft model, the early-exit graph) for a
 * target model and its session. NULL with err set; *off set (and NULL
 * returned, err empty) when the config asks for no speculation. */
struct loom_spec *loom_spec_open(const struct loom_spec_config *c,
				 struct loom_session *target,
				 const struct loom_tokenizer *tok,
				 const struct loom_model_params *mp, bool *off,
				 char *err, size_t errlen);
void loom_spec_free(struct loom_spec *sp);
const char *loom_spec_name(const struct loom_spec *sp);

struct loom_spec_stats {
	int64_t n_steps;    /* target forward passes while decoding */
	int64_t n_drafted;  /* draft tokens verified */
	int64_t n_accepted; /* of those, accepted */
};

/* Emits one generated token; returns non-zero to stop (end of generation
 * or the caller asked). */
typedef int (*loom_spec_emit_fn)(void *user, int32_t token);

/*
 * The decode loop with speculation. On entry the session holds the whole
 * history hist[0..n_hist) and s->logits are the logits after it. hist has
 * room for hist_cap tokens. Generates at most n_predict tokens through
 * emit. greedy: the target's choice per row is loom_sampler_sample's
 * (so the output is token for token the plain loop's); else rejection
 * sampling against loom_sampler_probs, seeded by seed. Returns tokens
 * made, or -1 with err set.
 */
int64_t loom_spec_decode(struct loom_spec *sp, struct loom_sampler *smp, bool greedy,
			 uint64_t seed, int32_t *hist, int64_t n_hist, int64_t hist_cap,
			 int32_t n_predict, loom_spec_emit_fn emit, void *user,
			 struct loom_spec_stats *st, char *err, size_t errlen);

#endif /* LOOM_SPEC_CORE_H */
