/* Paged KV cache (internal).
 *
 * Every layer's K and V cache is an f32 array [n_blocks][block_size][kv_dim]
 * on the backend. A sequence owns a block table: logical block j of the
 * sequence lives in physical block blocks[j]. Blocks are reference-counted
 * so that later work (prefix caching, copy-on-write) can share them.
 */
#ifndef LOOM_KV_H
#define LOOM_KV_H

#include <stddef.h>
#include <stdint.h>

#include "backend_loader.h"

struct loom_kv {
	struct loom_backend *be;
	int64_t n_layer, kv_dim, block_size, n_blocks;
	struct loom_buffer *buf;
	char *base;         /* device address of the whole cache */
	size_t layer_bytes; /* bytes of one layer's K (or V) cache */
	int32_t *free_list; /* stack of free physical blocks */
	int32_t n_free;
	int32_t *refs;      /* per physical block */
};

struct loom_kv_seq {
	int32_t *blocks;
	int32_t n_blocks, cap;
	int32_t n_tokens; /* tokens whose K/V are in the cache */
};

/* Bytes needed for n_blocks blocks; 0 on overflow. */
size_t loom_kv_bytes(int64_t n_layer, int64_t kv_dim, int64_t block_size,
		     int64_t n_blocks);
struct loom_kv *loom_kv_new(struct loom_backend *be, int64_t n_layer,
			    int64_t kv_dim, int64_t block_size, int64_t n_blocks,
			    char *err, size_t errlen);
void loom_kv_free(struct loom_kv *kv);

/* Makes room for n_new more tokens in seq. 0, or -1 if blocks ran out
 * (nothing is allocated then). */
int loom_kv_reserve(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t n_new);
/* Drops the sequence's tokens from `keep` on, freeing whole blocks past it. */
void loom_kv_truncate(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t keep);
/* Releases every block and the table. */
void loom_kv_seq_release(struct loom_kv *kv, struct loom_kv_seq *seq);

static inline void *loom_kv_k(const struct loom_kv *kv, int64_t layer)
{
	return kv->base + (size_t)(2 * layer) * kv->layer_bytes;
}

static inline void *loom_kv_v(const struct loom_kv *kv, int64_t layer)
{
	return kv->base + (size_t)(2 * layer + 1) * kv->layer_bytes;
}

/* Cache slot of position pos of seq (which must be reserved). */
static inline int32_t loom_kv_slot(const struct loom_kv *kv,
				   const struct loom_kv_seq *seq, int32_t pos)
{
	return seq->blocks[pos / kv->block_size] * (int32_t)kv->block_size +
	       pos % (int32_t)kv->block_size;
}

#endif /* LOOM_KV_H */
