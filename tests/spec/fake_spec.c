/*
 * Test strategies, one shared object per variant (see meson.build):
 *   biased:     always proposes SPEC_BIAS_TOKEN (env, default 1) and claims
 *               it was drawn from a uniform distribution (a lie: were the
 *               claim believed, the token would be accepted far too often);
 *   fixed:      always proposes SPEC_BIAS_TOKEN as a deterministic draft;
 *   tree:       proposes a token tree (ABI 1.1): SPEC_BIAS_TOKEN and the two
 *               tokens after it as siblings, each followed by
 *               SPEC_BIAS_TOKEN, and a repeated sibling the host must drop;
 *   no_entry:   exports no loom_spec_entry;
 *   abi2:       declares ABI major 2;
 *   no_propose: leaves the required propose slot empty;
 *   small:      declares a descriptor too small for ABI 1.0.
 */
#include <stdlib.h>

#include "loom/spec.h"

struct loom_spec_ctx {
	const struct loom_spec_host *host;
	int32_t n_vocab, token;
};

static int fake_create(const struct loom_spec_host *host, const struct loom_spec_params *p,
		       struct loom_spec_ctx **out, char *msg, size_t msg_len)
{
	struct loom_spec_ctx *c = calloc(1, sizeof(*c));
	const char *t = getenv("SPEC_BIAS_TOKEN");

	if (!c)
		return LOOM_ERR_NOMEM;
	c->host = host;
	c->n_vocab = p->n_vocab;
	c->token = t ? atoi(t) : 1;
	*out = c;
	return 0;
}

static void fake_destroy(struct loom_spec_ctx *c)
{
	free(c);
}

__attribute__((unused)) static int fake_propose(struct loom_spec_ctx *c, struct loom_spec_draft *d)
{
	int32_t k = d->max < 3 ? d->max : 3;

	for (int32_t i = 0; i < k; i++) {
		d->tokens[i] = c->token;
#ifdef FAKE_LIE
		for (int32_t v = 0; v < c->n_vocab; v++)
			d->probs[(size_t)i * c->n_vocab + v] = 1.0f / (float)c->n_vocab;
#endif
	}
#ifdef FAKE_LIE
	d->has_probs = 1;
#endif
	return k;
}

#ifdef FAKE_TREE
/* t, t+1, t+2 under the last token, each with child t; then t again
 * (a repeated sibling: dropped by the host with its child). */
static int fake_propose_tree(struct loom_spec_ctx *c, struct loom_spec_tree *t)
{
	static const int32_t add[8] = { 0, 0, 1, 0, 2, 0, 0, 0 };
	static const int32_t par[8] = { -1, 0, -1, 2, -1, 4, -1, 6 };
	int32_t n = t->max < 8 ? t->max : 8;

	for (int32_t i = 0; i < n; i++) {
		t->tokens[i] = (c->token + add[i]) % c->n_vocab;
		t->parent[i] = par[i];
	}
	return n;
}
#endif

#ifndef FAKE_ABI_MAJOR
#define FAKE_ABI_MAJOR LOOM_SPEC_ABI_MAJOR
#endif

static const struct loom_spec_plugin fake_plugin = {
	.abi_major = FAKE_ABI_MAJOR,
	.abi_minor = 0,
#ifdef FAKE_SMALL
	.struct_size = 16,
#else
	.struct_size = sizeof(struct loom_spec_plugin),
#endif
	.name = "fake",
	.create = fake_create,
#ifndef FAKE_NO_PROPOSE
	.propose = fake_propose,
#endif
	.destroy = fake_destroy,
#ifdef FAKE_TREE
	.propose_tree = fake_propose_tree,
#endif
};

#ifndef FAKE_NO_ENTRY
__attribute__((visibility("default")))
const struct loom_spec_plugin *loom_spec_entry(void)
{
	return &fake_plugin;
}
#else
__attribute__((visibility("default")))
const struct loom_spec_plugin *loom_spec_entry_misspelt(void)
{
	return &fake_plugin;
}
#endif
