/* Paged KV cache (internal).
 *
 * Every layer's K and V cache is an array [n_blocks][block_size][kv_dim]
 * of the cache's type (kv->type: f32, f16, q8_0 or q4_0, the layouts of
 * loom/kv_quant.h; the backend quantizes on kv_write) on the backend. A sequence owns a block table: logical block j of the
 * sequence lives in physical block blocks[j]. Blocks are reference-counted
 * and shared: a fork shares all of a sequence's written blocks, and a write
 * into a shared (or prefix-cached) partially used block first gives the
 * writer a private copy (copy-on-write, done by loom_kv_reserve).
 *
 * Prefix cache: a full block can be registered under a chained hash of its
 * tokens (loom_kv_block_hash, seeded with the parent block's hash). A
 * registered block is immutable. When its last reference goes, it is not
 * freed but parked on an LRU list; it can be found again by its hash
 * (loom_kv_cache_lookup) and shared (loom_kv_seq_append_cached), and it is
 * evicted, least recently released first, only when the free list is
 * empty. Blocks never registered behave exactly as before (free list).
 *
 * Windowed layers (loom_kv_new_config with per-layer windows, when some
 * layers have a sliding window and some do not): the windowed layers get
 * a pool of their own, kv->local, a struct loom_kv with window > 0, and
 * each sequence a second block table, seq->local, with the same logical
 * indexing (block j holds positions j * block_size ..). loom_kv_slide
 * releases the leading blocks no later query can reach (entries become
 * -1, seq->local->n_dropped of them), so a long sequence holds about
 * window / block_size + 1 windowed blocks. The functions below keep both
 * tables in step; the prefix cache keys both pools' blocks by the same
 * chain hashes (loom_kv_share_prefix, loom_kv_cache_register_seq).
 */
#ifndef LOOM_KV_H
#define LOOM_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "plugin/backend_loader.h"

struct loom_kv {
	struct loom_backend *be;
	int64_t n_layer, kv_dim, block_size, n_blocks;
	struct loom_buffer *buf;
	char *base;         /* device address of the whole cache */
	size_t layer_bytes; /* bytes of one layer's K (or V) cache */
	int32_t *free_list; /* stack of free physical blocks */
	int32_t n_free;
	int32_t *refs;      /* per physical block */
	/* prefix cache (all per physical block) */
	struct loom_kv_block *meta;
	int32_t *tokens;    /* [n_blocks][block_size] ids of registered blocks */
	int32_t *buckets;   /* hash table heads, n_buckets (a power of two) */
	uint32_t n_buckets;
	int32_t lru_head, lru_tail; /* unreferenced registered blocks, oldest first */
	int32_t n_lru;
	uint64_t n_copies;  /* blocks copied on write, cumulative */
	/* windowed layers */
	int32_t window;          /* > 0: a windowed pool (kv->local of another) */
	struct loom_kv *local;   /* the windowed layers' pool, or NULL */
	int64_t n_model_layers;  /* with local: the model's layers, both pools */
	int32_t *layer_pool;     /* with local, per model layer: 1 in local, 0 here */
	int32_t *layer_index;    /* with local, per model layer: index in its pool */
	int64_t n_held_peak;     /* most blocks referenced by sequences at once */
	/* quantized caches */
	uint32_t type;           /* enum loom_type of every K and V value */
	size_t row_bytes;        /* one slot: kv_dim values of type */
	/* distributed jobs */
	bool log_copies;         /* record copies (rank 0 sends them on) */
	int32_t *copy_log;       /* (dst, src) pairs since the last plan */
	int32_t n_copy_log, cap_copy_log;
	int64_t layer_lo, layer_hi; /* model layers with memory here (pp) */
};

struct loom_kv_block {
	uint64_t hash, parent; /* chain hash and the parent's, while cached */
	int32_t hnext;         /* next block in the same hash bucket */
	int32_t prev, next;    /* LRU links while unreferenced and cached */
	bool cached;           /* registered in the hash table */
};

struct loom_kv_seq {
	int32_t *blocks;
	int32_t n_blocks, cap;
	int32_t n_tokens; /* tokens whose K/V are in the cache */
	/* windowed layers */
	int32_t n_dropped;         /* leading entries released (-1), windowed pool */
	struct loom_kv_seq *local; /* the table in kv->local, made on first use */
};

/* A cache whose layers may differ in window (loom_kv_new_config). */
struct loom_kv_config {
	int64_t n_layer, kv_dim, block_size;
	int64_t n_blocks;        /* blocks of the full-context layers' pool */
	const int32_t *windows;  /* per layer: > 0 a sliding window; NULL: none */
	int64_t n_local_blocks;  /* blocks of the windowed layers' pool */
	uint32_t type;           /* the cache's enum loom_type; 0 is F32 */
	/* a pipeline stage's layers: only layers layer_lo .. layer_hi-1 get
	 * memory (the pools and block counts stay the whole model's);
	 * both 0: every layer */
	int64_t layer_lo, layer_hi;
};

/* Bytes needed for n_blocks blocks of f32; 0 on overflow. */
size_t loom_kv_bytes(int64_t n_layer, int64_t kv_dim, int64_t block_size,
		     int64_t n_blocks);
/* The same for a cache of `type`; 0 on overflow, or when kv_dim is not a
 * whole number of the type's blocks or the type is no KV type. */
size_t loom_kv_type_bytes(uint32_t type, int64_t n_layer, int64_t kv_dim,
			  int64_t block_size, int64_t n_blocks);
/* loom_kv_type_name() and loom_kv_type_parse() are public (loom.h). */
/* An f32 cache (loom_kv_new_type with LOOM_TYPE_F32). */
struct loom_kv *loom_kv_new(struct loom_backend *be, int64_t n_layer,
			    int64_t kv_dim, int64_t block_size, int64_t n_blocks,
			    char *err, size_t errlen);
/* A cache of `type`: refused (NULL, err says why) when the type is no KV
 * type, kv_dim is not a whole number of its blocks, or the backend does
 * not store it (ABI minor < 3, or supports() says no). */
struct loom_kv *loom_kv_new_type(struct loom_backend *be, uint32_t type, int64_t n_layer,
				 int64_t kv_dim, int64_t block_size, int64_t n_blocks,
				 char *err, size_t errlen);
/* Whether backend be stores KV caches of `type` (f32: always). When not,
 * *why says so in a sentence. */
bool loom_kv_type_usable(const struct loom_backend *be, uint32_t type, char *why,
			 size_t whylen);
void loom_kv_free(struct loom_kv *kv);
/* Layers with a window get their own pool (kv->local, n_local_blocks
 * blocks) when some layers have none; otherwise this is loom_kv_new
 * (every layer full-context: correct, only no saving). */
struct loom_kv *loom_kv_new_config(struct loom_backend *be, const struct loom_kv_config *c,
				   char *err, size_t errlen);
/* How many of n_layer layers go to a windowed pool: those with
 * windows[i] > 0 when at least one layer has none, else 0. *window: the
 * largest of their windows. */
int64_t loom_kv_split(const int32_t *windows, int64_t n_layer, int32_t *window);
/* Windowed blocks a sequence holds at most when it reserves n_new tokens
 * after a loom_kv_slide: blocks (p - window + 1) / bs .. (p + n_new - 1) / bs. */
int64_t loom_kv_window_blocks(int32_t window, int64_t block_size, int64_t n_new);
/* Bytes of the whole cache, both pools. */
size_t loom_kv_total_bytes(const struct loom_kv *kv);
/* Blocks referenced by sequences now (this pool only). */
int64_t loom_kv_n_held(const struct loom_kv *kv);

/* Makes room for n_new more tokens in seq. 0, or LOOM_ERR_FULL if blocks
 * ran out (nothing is allocated then), LOOM_ERR_NOMEM if the block table
 * could not grow. When n_new > 0 and the block that position n_tokens
 * falls in is partially used and shared or cached, the sequence first gets
 * a private copy of it (one more block); the backend's status if that copy
 * fails (the sequence is unchanged). Free blocks are used first, then
 * unreferenced cached blocks are evicted, least recently used first. */
int loom_kv_reserve(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t n_new);
/* Drops the sequence's tokens from `keep` on, freeing whole blocks past it.
 * If loom_kv_slide already released windowed blocks that a query at
 * position keep reads, the whole sequence goes (n_tokens 0: the caller
 * recomputes); the scheduler never truncates below a slid position. */
void loom_kv_truncate(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t keep);
/* Declares the positions below seq->n_tokens final (no truncate below it
 * follows) and releases the windowed blocks that no query at a position
 * >= n_tokens reads: those wholly below n_tokens - window + 1. No-op
 * without windowed layers. */
void loom_kv_slide(struct loom_kv *kv, struct loom_kv_seq *seq);
/* Releases every block and the table. */
void loom_kv_seq_release(struct loom_kv *kv, struct loom_kv_seq *seq);

/* sharing, copy-on-write, prefix cache */

/* Blocks that reserve can still hand out: free plus evictable cached. */
int64_t loom_kv_n_available(const struct loom_kv *kv);
/* dst (empty) shares every written block of src (refcount + 1 each; in
 * the windowed pool the blocks src still holds) and gets src's n_tokens.
 * 0, or LOOM_ERR_NOMEM (dst unchanged). */
int loom_kv_fork(struct loom_kv *kv, struct loom_kv_seq *dst,
		 const struct loom_kv_seq *src);
/* Copies physical block src to dst in every layer's K and V cache of
 * this pool with the backend's copy op. 0 or a negative loom_status. */
int loom_kv_copy_block(struct loom_kv *kv, int32_t dst, int32_t src);

/* Copies the K/V rows of seq's positions from[i] to positions to[i], in
 * order, in every layer of both pools (token trees: the accepted path's
 * rows to consecutive positions). The positions must be reserved and the
 * destinations private to seq. 0 or a negative loom_status. */
int loom_kv_move_rows(struct loom_kv *kv, struct loom_kv_seq *seq, const int32_t *from,
		      const int32_t *to, int32_t n);
/* Chain hash of a block: XXH3-64 of its n token ids seeded with the
 * parent block's hash (LOOM_KV_ROOT_HASH for the first block). */
#define LOOM_KV_ROOT_HASH 0x6c6f6f6d6b76ULL
uint64_t loom_kv_block_hash(uint64_t parent, const int32_t *tokens, int64_t n);
/* The cached block with this hash, parent hash and block_size tokens, or
 * -1. Token ids are compared, so a hash collision is never a hit. */
int32_t loom_kv_cache_lookup(const struct loom_kv *kv, uint64_t hash,
			     uint64_t parent, const int32_t *tokens);
/* Registers full block `block` (referenced, holding `tokens`) under hash.
 * True if registered; false if that hash is cached already (by another
 * block) or the block is already registered. */
bool loom_kv_cache_register(struct loom_kv *kv, int32_t block, uint64_t hash,
			    uint64_t parent, const int32_t *tokens);
/* Appends cached block `block` to seq, whose n_tokens must equal
 * n_blocks * block_size: refcount + 1 (leaving the LRU list if it was on
 * it), n_tokens += block_size. 0, LOOM_ERR_INVALID (not a cached block,
 * seq not block-aligned, kv has windowed layers: use share_prefix), or
 * LOOM_ERR_NOMEM. */
int loom_kv_seq_append_cached(struct loom_kv *kv, struct loom_kv_seq *seq,
			      int32_t block);

/* the prefix cache over both pools */

/* Shares, into empty seq, the longest run of cached blocks among the first
 * n_full blocks of a token sequence (chain hashes hashes[j], tokens
 * tokens[j * block_size ..]) that the cache can resume from: every block
 * of the run in the full-context pool, and in the windowed pool the
 * blocks a query at the resume position reads. seq->n_tokens becomes
 * min(run * block_size, limit). Returns the run's length in blocks (0
 * when nothing is shared, or on an allocation failure: seq empty). */
int32_t loom_kv_share_prefix(struct loom_kv *kv, struct loom_kv_seq *seq,
			     const uint64_t *hashes, const int32_t *tokens,
			     int32_t n_full, int32_t limit);
/* Registers logical block j of seq (full, holding `tokens`) in both pools
 * (the windowed one if seq still holds it there). */
void loom_kv_cache_register_seq(struct loom_kv *kv, const struct loom_kv_seq *seq,
				int32_t j, uint64_t hash, uint64_t parent,
				const int32_t *tokens);

/* The pool that holds model layer *layer; *layer becomes its index there. */
static inline const struct loom_kv *loom_kv_pool(const struct loom_kv *kv, int64_t *layer)
{
	int64_t l = *layer;

	if (!kv->layer_index)
		return kv;
	*layer = kv->layer_index[l];
	return kv->layer_pool[l] ? kv->local : kv;
}

/* True when model layer `layer` lives in the windowed pool. */
static inline bool loom_kv_windowed(const struct loom_kv *kv, int64_t layer)
{
	return kv->layer_pool && kv->layer_pool[layer];
}

static inline void *loom_kv_k(const struct loom_kv *kv, int64_t layer)
{
	kv = loom_kv_pool(kv, &layer);
	return kv->base + (size_t)(2 * layer) * kv->layer_bytes;
}

static inline void *loom_kv_v(const struct loom_kv *kv, int64_t layer)
{
	kv = loom_kv_pool(kv, &layer);
	return kv->base + (size_t)(2 * layer + 1) * kv->layer_bytes;
}

/* Cache slot of position pos of seq (which must be reserved) in pool kv
 * (for the windowed pool: loom_kv_slot(kv->local, seq->local, pos)). */
static inline int32_t loom_kv_slot(const struct loom_kv *kv,
				   const struct loom_kv_seq *seq, int32_t pos)
{
	return seq->blocks[pos / kv->block_size] * (int32_t)kv->block_size +
	       pos % (int32_t)kv->block_size;
}

#endif /* LOOM_KV_H */
