/* Single-sequence session over the paged KV cache. */
#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>

#define KV_BLOCK_SIZE 16

struct loom_session *loom_session_new(struct loom_model *m, int32_t n_ctx,
				      int32_t n_batch, char *err, size_t errlen)
{
	const struct loom_hparams *hp = &m->hp;
	struct loom_session *s;
	int64_t n_blocks;

	if (n_ctx <= 0 || n_batch <= 0) {
		snprintf(err, errlen, "session: context %d and batch %d must be positive",
			 n_ctx, n_batch);
		return NULL;
	}
	if (n_batch > n_ctx)
		n_batch = n_ctx;
	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "session: out of memory");
		return NULL;
	}
	s->m = m;
	s->n_ctx = n_ctx;
	s->n_batch = n_batch;
	n_blocks = ((int64_t)n_ctx + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
	s->logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
	if (!s->logits) {
		snprintf(err, errlen, "session: out of memory");
		goto out_free;
	}
	s->kv = loom_kv_new(m->be, hp->n_layer, hp->n_head_kv * hp->head_dim,
			    KV_BLOCK_SIZE, n_blocks, err, errlen);
	if (!s->kv)
		goto out_free;
	s->exec = loom_exec_new(m, s->kv, n_batch, 1, 1, err, errlen);
	if (!s->exec)
		goto out_free;
	return s;

out_free:
	loom_session_free(s);
	return NULL;
}

void loom_session_free(struct loom_session *s)
{
	if (!s)
		return;
	if (s->kv)
		loom_kv_seq_release(s->kv, &s->seq);
	loom_exec_free(s->exec);
	loom_kv_free(s->kv);
	free(s->logits);
	free(s);
}

void loom_session_reset(struct loom_session *s)
{
	loom_kv_truncate(s->kv, &s->seq, 0);
}

int loom_session_eval(struct loom_session *s, const int32_t *tokens, int32_t n,
		      char *err, size_t errlen)
{
	int32_t done = 0;

	if (n <= 0) {
		snprintf(err, errlen, "nothing to evaluate");
		return -1;
	}
	if ((int64_t)s->seq.n_tokens + n > s->n_ctx) {
		snprintf(err, errlen, "context full: %d tokens cached + %d new > context %d",
			 s->seq.n_tokens, n, s->n_ctx);
		return -1;
	}
	while (done < n) {
		int32_t chunk = n - done < s->n_batch ? n - done : s->n_batch;
		int32_t q_start[2] = { 0, chunk }, out_row = chunk - 1;
		struct loom_kv_seq *seqs[1] = { &s->seq };
		struct loom_batch b = {
			.n_tokens = chunk, .tokens = tokens + done, .n_seqs = 1,
			.q_start = q_start, .seqs = seqs,
			.n_out = done + chunk == n ? 1 : 0, .out_rows = &out_row,
		};

		if (loom_kv_reserve(s->kv, &s->seq, chunk)) {
			snprintf(err, errlen, "kv cache: out of blocks");
			return -1;
		}
		if (loom_exec_step(s->exec, &b, s->logits, err, errlen))
			return -1;
		done += chunk;
	}
	return 0;
}
