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
 *
 * With trees on (--spec-tree N, propose_tree) the greedy chain is drafted
 * as before, and at each depth where the drafting model is unsure (its
 * runner-up has probability SIBLING_MIN or more) the runner-up goes into
 * the tree too, as a leaf beside that depth's chain token: where the
 * target rejects the chain's token there but takes the runner-up, the
 * step keeps one token more than the chain would (the runner-up, then
 * the target's token after it). The siblings come from logits the chain
 * computes anyway, so a tree costs no more drafting than a chain, only
 * its extra verified rows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "spec_common.h"

#define RATE_FLOOR 0.35f
#define MAX_PAUSE 64
#define SIBLING_MIN 0.1f /* a runner-up's draft probability to be verified */

struct loom_spec_ctx {
	const struct loom_spec_host *host;
	struct loom_spec_params p;
	int32_t k;
	float rate;          /* running acceptance rate */
	int32_t pause, wait; /* steps to sit out after a poor run; left of it */
	int32_t last_depth;  /* of the last tree proposal; 0: a chain */
	float *logits; /* [n_vocab] */
	int32_t *path; /* [max_draft]: a tree's chain, what next_logits follows */
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
	c->path = malloc(sizeof(int32_t) * (size_t)params->max_draft);
	if (!c->logits || !c->path) {
		free(c->logits);
		free(c->path);
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
	free(c->path);
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

/* The runner-up of x[0..n) (best its argmax) and its probability under
 * softmax(x); -1 when there is none. */
static int32_t runner_up(const float *x, int32_t n, int32_t best, float *prob)
{
	int32_t second = -1;
	double sum = 0.0;

	for (int32_t i = 0; i < n; i++) {
		sum += exp((double)x[i] - (double)x[best]);
		if (i != best && (second < 0 || x[i] > x[second]))
			second = i;
	}
	*prob = second < 0 ? 0.0f : (float)(exp((double)x[second] - (double)x[best]) / sum);
	return second;
}

/* The greedy chain, and beside each chain token the drafting model's
 * runner-up when that is likely enough (the head comment). */
static int md_propose_tree(struct loom_spec_ctx *c, struct loom_spec_tree *t)
{
	int32_t depth = c->k < c->p.max_draft ? c->k : c->p.max_draft, n = 0, parent = -1;

	c->last_depth = 0;
	if (c->wait > 0) {
		c->wait--;
		return 0;
	}
	for (int32_t i = 0; i < depth && n < t->max; i++) {
		int rc = c->host->next_logits(c->host->host, SPEC_WHICH, c->path, i, c->logits);
		int32_t best, second;
		float p2;

		if (rc)
			return rc;
		best = spec_argmax(c->logits, c->p.n_vocab);
		second = runner_up(c->logits, c->p.n_vocab, best, &p2);
		c->path[i] = best;
		t->tokens[n] = best;
		t->parent[n] = parent;
		parent = n++;
		if (second >= 0 && p2 >= SIBLING_MIN && n < t->max) {
			t->tokens[n] = second;
			t->parent[n++] = t->parent[parent];
		}
		c->last_depth = i + 1;
	}
	return n;
}

static void md_observe(struct loom_spec_ctx *c, const struct loom_spec_outcome *o)
{
	struct loom_spec_outcome chain = *o;

	/* a tree counts as a chain as deep as it: the depth adapts */
	if (c->last_depth > 0)
		chain.n_proposed = c->last_depth;
	c->last_depth = 0;
	o = &chain;
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
	.propose_tree = md_propose_tree,
};

__attribute__((visibility("default")))
const struct loom_spec_plugin *loom_spec_entry(void)
{
	return &md_plugin;
}
