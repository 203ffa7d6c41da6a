/* A single-sequence session: one KV sequence, chunked prefill and decode
 * (internal; the multi-sequence scheduler builds on the same executor). */
#ifndef LOOM_SESSION_H
#define LOOM_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

struct loom_session {
	struct loom_model *m;
	struct loom_kv *kv;
	struct loom_exec *exec;
	struct loom_kv_seq seq;
	int32_t n_ctx, n_batch;
	float *logits; /* n_vocab floats: logits after the last evaluated token */
};

/* n_ctx tokens of cache (rounded up to whole blocks), prompts evaluated in
 * chunks of at most n_batch tokens. NULL with err set. */
struct loom_session *loom_session_new(struct loom_model *m, int32_t n_ctx,
				      int32_t n_batch, char *err, size_t errlen);
void loom_session_free(struct loom_session *s);
/* Appends tokens to the sequence and leaves the logits of the last one in
 * s->logits. 0, or -1 with err set (context full, backend failure). */
int loom_session_eval(struct loom_session *s, const int32_t *tokens, int32_t n,
		      char *err, size_t errlen);
/* Forgets the sequence (keeps the allocations). */
void loom_session_reset(struct loom_session *s);

#endif
