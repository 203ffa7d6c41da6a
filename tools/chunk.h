/* One prompt run to its end as one greedy request on the engine, for the
 * tools that score or observe a text chunk by chunk (perplexity, imatrix). */
#ifndef LOOM_TOOLS_CHUNK_H
#define LOOM_TOOLS_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* Runs toks[0..n) through the engine (n_predict 1: the token it draws
 * never runs). all_logits: NULL, or n x n_vocab floats for the logits after
 * every prompt token (the engine must be opened with all_logits). 0, or
 * -1 with err set. */
int loom_tool_run_chunk(struct loom_engine *e, const int32_t *toks, int32_t n,
			float *all_logits, char *err, size_t errlen);

#endif
