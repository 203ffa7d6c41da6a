/*
 * ngram.so: prompt lookup decoding. No model: the drafts are what followed
 * the most recent earlier occurrence of the sequence's last n tokens
 * (n from ngram_max down to ngram_min, the longest match wins). Copying,
 * quoting, editing code and repeating lists make such matches common.
 * When the match runs into the end of the sequence the continuation
 * repeats with the match's period.
 */
#include <stdlib.h>
#include <string.h>

#include "spec_common.h"

struct loom_spec_ctx {
	const struct loom_spec_host *host;
	struct loom_spec_params p;
	int32_t k; /* current draft length */
};

static int ngram_create(const struct loom_spec_host *host,
			const struct loom_spec_params *params,
			struct loom_spec_ctx **out, char *msg, size_t msg_len)
{
	struct loom_spec_ctx *c = calloc(1, sizeof(*c));

	if (!c)
		return LOOM_ERR_NOMEM;
	c->host = host;
	c->p = *params;
	c->k = params->max_draft;
	*out = c;
	return 0;
}

static void ngram_destroy(struct loom_spec_ctx *c)
{
	free(c);
}

/* Start of the continuation of the most recent earlier match of the
 * last s tokens of h[0..n), or -1. */
static int64_t find_match(const int32_t *h, int64_t n, int32_t s)
{
	const int32_t *suffix = h + n - s;

	for (int64_t j = n - s - 1; j >= 0; j--)
		if (h[j] == suffix[0] && !memcmp(h + j, suffix, sizeof(int32_t) * (size_t)s))
			return j + s;
	return -1;
}

static int ngram_propose(struct loom_spec_ctx *c, struct loom_spec_draft *d)
{
	int64_t n, start = -1;
	const int32_t *h = c->host->tokens(c->host->host, &n);
	int32_t want = c->k < d->max ? c->k : d->max, s;

	for (s = c->p.ngram_max; s >= c->p.ngram_min && start < 0; s--)
		if (s < n)
			start = find_match(h, n, s);
	if (start < 0)
		return 0;
	for (int32_t i = 0; i < want; i++) {
		int64_t idx = start + i;

		d->tokens[i] = idx < n ? h[idx] : d->tokens[idx - n];
	}
	d->has_probs = 0;
	return want;
}

static void ngram_observe(struct loom_spec_ctx *c, const struct loom_spec_outcome *o)
{
	c->k = spec_adapt(c->k, &c->p, o);
}

static const struct loom_spec_plugin ngram_plugin = {
	.abi_major = LOOM_SPEC_ABI_MAJOR,
	.abi_minor = LOOM_SPEC_ABI_MINOR,
	.struct_size = sizeof(struct loom_spec_plugin),
	.name = "ngram",
	.create = ngram_create,
	.propose = ngram_propose,
	.observe = ngram_observe,
	.destroy = ngram_destroy,
};

__attribute__((visibility("default")))
const struct loom_spec_plugin *loom_spec_entry(void)
{
	return &ngram_plugin;
}
