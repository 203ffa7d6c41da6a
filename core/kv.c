/* Paged KV cache: block pool and per-sequence block tables. */
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t loom_kv_bytes(int64_t n_layer, int64_t kv_dim, int64_t block_size,
		     int64_t n_blocks)
{
	size_t bytes = sizeof(float);

	if (n_layer <= 0 || kv_dim <= 0 || block_size <= 0 || n_blocks <= 0)
		return 0;
	if (__builtin_mul_overflow(bytes, (size_t)kv_dim, &bytes) ||
	    __builtin_mul_overflow(bytes, (size_t)block_size, &bytes) ||
	    __builtin_mul_overflow(bytes, (size_t)n_blocks, &bytes) ||
	    __builtin_mul_overflow(bytes, (size_t)n_layer * 2, &bytes))
		return 0;
	return bytes;
}

struct loom_kv *loom_kv_new(struct loom_backend *be, int64_t n_layer,
			    int64_t kv_dim, int64_t block_size, int64_t n_blocks,
			    char *err, size_t errlen)
{
	size_t bytes = loom_kv_bytes(n_layer, kv_dim, block_size, n_blocks);
	struct loom_kv *kv;
	int32_t i;

	if (!bytes || n_blocks > INT32_MAX / block_size) {
		snprintf(err, errlen, "kv cache: size overflow (%lld blocks of %lld tokens)",
			 (long long)n_blocks, (long long)block_size);
		return NULL;
	}
	kv = calloc(1, sizeof(*kv));
	if (!kv)
		goto out_nomem;
	*kv = (struct loom_kv){ .be = be, .n_layer = n_layer, .kv_dim = kv_dim,
		.block_size = block_size, .n_blocks = n_blocks,
		.layer_bytes = bytes / (size_t)(2 * n_layer) };
	kv->free_list = malloc(sizeof(int32_t) * (size_t)n_blocks);
	kv->refs = calloc((size_t)n_blocks, sizeof(int32_t));
	if (!kv->free_list || !kv->refs)
		goto out_free;
	if (be->ops->buffer_alloc(be->ctx, bytes, &kv->buf)) {
		snprintf(err, errlen, "kv cache: cannot allocate %zu MiB on the backend",
			 bytes >> 20);
		goto out_free_quiet;
	}
	kv->base = be->ops->buffer_addr(be->ctx, kv->buf);
	/* Hand out low block numbers first: easier to read in dumps. */
	for (i = 0; i < n_blocks; i++)
		kv->free_list[i] = (int32_t)(n_blocks - 1 - i);
	kv->n_free = (int32_t)n_blocks;
	return kv;

out_free:
	snprintf(err, errlen, "kv cache: out of memory");
out_free_quiet:
	free(kv->free_list);
	free(kv->refs);
	free(kv);
	return NULL;
out_nomem:
	snprintf(err, errlen, "kv cache: out of memory");
	return NULL;
}

void loom_kv_free(struct loom_kv *kv)
{
	if (!kv)
		return;
	kv->be->ops->buffer_free(kv->be->ctx, kv->buf);
	free(kv->free_list);
	free(kv->refs);
	free(kv);
}

static int grow_table(struct loom_kv_seq *seq, int32_t need)
{
	int32_t cap = seq->cap ? seq->cap : 8;
	int32_t *blocks;

	while (cap < need) {
		if (cap > INT32_MAX / 2)
			return -1;
		cap *= 2;
	}
	if (cap == seq->cap)
		return 0;
	blocks = realloc(seq->blocks, sizeof(int32_t) * (size_t)cap);
	if (!blocks)
		return -1;
	seq->blocks = blocks;
	seq->cap = cap;
	return 0;
}

int loom_kv_reserve(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t n_new)
{
	int64_t total = (int64_t)seq->n_tokens + n_new;
	int64_t need = (total + kv->block_size - 1) / kv->block_size;

	if (n_new < 0 || need > INT32_MAX)
		return -1;
	if (need <= seq->n_blocks)
		return 0;
	if (need - seq->n_blocks > kv->n_free || grow_table(seq, (int32_t)need))
		return -1;
	while (seq->n_blocks < need) {
		int32_t b = kv->free_list[--kv->n_free];

		kv->refs[b] = 1;
		seq->blocks[seq->n_blocks++] = b;
	}
	return 0;
}

static void unref_block(struct loom_kv *kv, int32_t b)
{
	if (--kv->refs[b] == 0)
		kv->free_list[kv->n_free++] = b;
}

void loom_kv_truncate(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t keep)
{
	int32_t need;

	if (keep < 0)
		keep = 0;
	if (keep < seq->n_tokens)
		seq->n_tokens = keep;
	need = (int32_t)((keep + kv->block_size - 1) / kv->block_size);
	while (seq->n_blocks > need)
		unref_block(kv, seq->blocks[--seq->n_blocks]);
}

void loom_kv_seq_release(struct loom_kv *kv, struct loom_kv_seq *seq)
{
	loom_kv_truncate(kv, seq, 0);
	free(seq->blocks);
	*seq = (struct loom_kv_seq){ 0 };
}
