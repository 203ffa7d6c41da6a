/* Helpers shared by the bundled speculative-decoding plugins (header-only,
 * static: each plugin stays one self-contained shared object). */
#ifndef LOOM_SPEC_COMMON_H
#define LOOM_SPEC_COMMON_H

#include "loom/spec.h"

/*
 * Adaptive draft length: grows by two after a proposal that was accepted
 * whole, falls to one more than what was accepted otherwise, always
 * within [min_draft, max_draft]. Cheap drafts (prompt lookup) can afford
 * to be long; a miss costs only the extra rows of one batched pass.
 */
static inline int32_t spec_adapt(int32_t k, const struct loom_spec_params *p,
				 const struct loom_spec_outcome *o)
{
	if (o->n_proposed <= 0)
		return k;
	if (o->n_accepted == o->n_proposed)
		k += 2;
	else
		k = o->n_accepted + 1;
	if (k > p->max_draft)
		k = p->max_draft;
	if (k < p->min_draft)
		k = p->min_draft;
	return k;
}

static inline int32_t spec_argmax(const float *x, int32_t n)
{
	int32_t best = 0;

	for (int32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

#endif
