/* `loom perplexity`: perplexity over a text, KL divergence against a base run. */
#ifndef LOOM_PERPLEXITY_H
#define LOOM_PERPLEXITY_H

#include <stddef.h>

#include "options.h"

/* Runs over text[0..len) as o says (model, -c, --chunks, --save-logits,
 * --kl-base, --exact) and prints the results. 0, or -1 with err set. */
int loom_perplexity(const struct loom_options *o, const char *text, size_t len, char *err,
		    size_t errlen);

#endif
