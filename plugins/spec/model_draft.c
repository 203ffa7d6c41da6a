/*
 * layerskip.so and draft.so: greedy drafting with a model the host runs.
 * Built twice from this file:
 *   layerskip.so (-DSPEC_WHICH=LOOM_SPEC_MODEL_EARLY_EXIT): self-speculation,
 *     the target's first spec_layers layers and its output head;
 *   draft.so (-DSPEC_WHICH=LOOM_SPEC_MODEL_DRAFT): a second, smaller model
 *     with the target's vocabulary (--spec-draft-model).
 * Each draft is the argmax of the drafting model's logits, so the proposal
 * is deterministic (has_probs = 0): the host's acceptance is exact for it
 * under greedy and sampled decoding alike. The draft length adapts to the
 * acceptance rate (spec_common.h). Drafting with a model is not free, so
 * when the running acceptance rate falls below RATE_FLOOR the plugin sits
 * out a number of steps (proposing nothing: plain decoding), doubling the
 * pause each time a probe fails, up to MAX_PAUSE steps.
 */
#include <stdio.h>
#include <stdlib.h>

#include "spec_common.h"

#define RATE_FLOOR 0.35f
#define MAX_PAUSE 64

struct loom_spec_ctx {
	const struct loom_spec_host *host;
	struct loom_spec_params p;
	int32_t k;
	float rate;          /* running acceptance rate */
	int32_t pause, wait; /* steps to sit out after a poor run; left of it */
	float *logits; /* [n_vocab] */
};

static int md_create(const struct loom_spec_host *host, const struct loom_spec_params *params,
		     struct loom_spec_ctx **out, char *msg, size_t msg_len)
{
	struct loom_spec_ctx *c;

	if (!host->next_logits) {
		snprintf(msg, msg_len, "the host offers no model to draft with");
		return LOOM_ERR_UNSUPPORTED;
	}
	if (SPEC_WHICH == LOOM_SPEC_MODEL_DRAFT && !params->has_draft_model) {
		snprintf(msg, msg_len, "no draft model given (--spec-draft-model FILE)");
		return LOOM_ERR_INVALID;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return LOOM_ERR_NOMEM;
	c->logits = malloc(sizeof(float) * (size_t)params->n_vocab);
	if (!c->logits) {
		free(c);
		return LOOM_ERR_NOMEM;
	}
	c->host = host;
	c->p = *params;
	c->k = (params->min_draft + params->max_draft + 1) / 2;
	c->rate = 1.0f;
	c->pause = 1;
	*out = c;
	return 0;
}

static void md_destroy(struct loom_spec_ctx *c)
{
	free(c->logits);
	free(c);
}

static int md_propose(struct loom_spec_ctx *c, struct loom_spec_draft *d)
{
	int32_t want = c->k < d->max ? c->k : d->max;

	if (c->wait > 0) {
		c->wait--;
		return 0;
	}
	for (int32_t i = 0; i < want; i++) {
		int rc = c->host->next_logits(c->host->host, SPEC_WHICH, d->tokens, i, c->logits);

		if (rc)
			return rc;
		d->tokens[i] = spec_argmax(c->logits, c->p.n_vocab);
	}
	d->has_probs = 0;
	return want;
}

static void md_observe(struct loom_spec_ctx *c, const struct loom_spec_outcome *o)
{
	if (o->n_proposed <= 0)
		return;
	c->k = spec_adapt(c->k, &c->p, o);
	c->rate = 0.7f * c->rate + 0.3f * (float)o->n_accepted / (float)o->n_proposed;
	if (c->rate >= RATE_FLOOR) {
		c->pause = 1;
		return;
	}
	c->wait = c->pause;
	c->pause = c->pause * 2 < MAX_PAUSE ? c->pause * 2 : MAX_PAUSE;
	c->rate = RATE_FLOOR; /* the next probe decides afresh */
}

static const struct loom_spec_plugin md_plugin = {
	.abi_major = LOOM_SPEC_ABI_MAJOR,
	.abi_minor = LOOM_SPEC_ABI_MINOR,
	.struct_size = sizeof(struct loom_spec_plugin),
	.name = SPEC_NAME,
	.create = md_create,
	.propose = md_propose,
	.observe = md_observe,
	.destroy = md_destroy,
};

__attribute__((visibility("default")))
const struct loom_spec_plugin *loom_spec_entry(void)
{
	return &md_plugin;
}
