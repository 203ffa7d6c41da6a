/* Paged KV cache: block pool, per-sequence block tables, copy-on-write
 * and the prefix cache (hash table + LRU list of unreferenced blocks). */
#include "engine/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

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

/* Prefix-cache tables: per-block metadata, token ids, hash buckets. */
static int alloc_cache(struct loom_kv *kv)
{
	size_t n = (size_t)kv->n_blocks;
	uint32_t nb = 16;
	int32_t i;

	while (nb < n && nb < (1u << 30))
		nb <<= 1;
	kv->n_buckets = nb;
	kv->meta = calloc(n, sizeof(*kv->meta));
	/* n_blocks * block_size <= INT32_MAX was checked by the caller */
	kv->tokens = malloc(n * (size_t)kv->block_size * sizeof(int32_t));
	kv->buckets = malloc(nb * sizeof(int32_t));
	if (!kv->meta || !kv->tokens || !kv->buckets)
		return -1;
	for (i = 0; i < (int32_t)nb; i++)
		kv->buckets[i] = -1;
	for (i = 0; i < (int32_t)n; i++)
		kv->meta[i] = (struct loom_kv_block){ .hnext = -1, .prev = -1, .next = -1 };
	kv->lru_head = kv->lru_tail = -1;
	return 0;
}

static void free_cache(struct loom_kv *kv)
{
	free(kv->meta);
	free(kv->tokens);
	free(kv->buckets);
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
	if (!kv->free_list || !kv->refs || alloc_cache(kv))
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
	free_cache(kv);
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
	free_cache(kv);
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
			return LOOM_ERR_INVALID;
		cap *= 2;
	}
	if (cap == seq->cap)
		return 0;
	blocks = realloc(seq->blocks, sizeof(int32_t) * (size_t)cap);
	if (!blocks)
		return LOOM_ERR_NOMEM;
	seq->blocks = blocks;
	seq->cap = cap;
	return 0;
}

static void lru_unlink(struct loom_kv *kv, int32_t b)
{
	struct loom_kv_block *m = &kv->meta[b];

	if (m->prev >= 0)
		kv->meta[m->prev].next = m->next;
	else
		kv->lru_head = m->next;
	if (m->next >= 0)
		kv->meta[m->next].prev = m->prev;
	else
		kv->lru_tail = m->prev;
	m->prev = m->next = -1;
	kv->n_lru--;
}

static void lru_push(struct loom_kv *kv, int32_t b)
{
	struct loom_kv_block *m = &kv->meta[b];

	m->prev = kv->lru_tail;
	m->next = -1;
	if (kv->lru_tail >= 0)
		kv->meta[kv->lru_tail].next = b;
	else
		kv->lru_head = b;
	kv->lru_tail = b;
	kv->n_lru++;
}

static uint32_t bucket_of(const struct loom_kv *kv, uint64_t hash)
{
	return (uint32_t)(hash ^ (hash >> 32)) & (kv->n_buckets - 1);
}

/* Removes a cached block from the hash table. */
static void unhash(struct loom_kv *kv, int32_t b)
{
	int32_t *p = &kv->buckets[bucket_of(kv, kv->meta[b].hash)];

	while (*p != b)
		p = &kv->meta[*p].hnext;
	*p = kv->meta[b].hnext;
	kv->meta[b].hnext = -1;
	kv->meta[b].cached = false;
}

/* One block with refcount 1: a free one, else the least recently used
 * unreferenced cached one (evicted from the cache). The caller has checked
 * that one is available. */
static int32_t take_block(struct loom_kv *kv)
{
	int32_t b;

	if (kv->n_free > 0) {
		b = kv->free_list[--kv->n_free];
	} else {
		b = kv->lru_head;
		lru_unlink(kv, b);
		unhash(kv, b);
	}
	kv->refs[b] = 1;
	return b;
}

static void unref_block(struct loom_kv *kv, int32_t b)
{
	if (--kv->refs[b] > 0)
		return;
	if (kv->meta[b].cached)
		lru_push(kv, b); /* stays findable until evicted */
	else
		kv->free_list[kv->n_free++] = b;
}

int64_t loom_kv_n_available(const struct loom_kv *kv)
{
	return (int64_t)kv->n_free + kv->n_lru;
}

/* True when writing at position n_tokens of seq needs a private copy of
 * the block it falls in: that block is partially used and shared with
 * another sequence or registered in the prefix cache (immutable). */
static bool needs_cow(const struct loom_kv *kv, const struct loom_kv_seq *seq)
{
	int32_t j = (int32_t)(seq->n_tokens / kv->block_size), b;

	if (seq->n_tokens % kv->block_size == 0 || j >= seq->n_blocks)
		return false;
	b = seq->blocks[j];
	return kv->refs[b] > 1 || kv->meta[b].cached;
}

/* Replaces the block position n_tokens falls in with a private copy. */
static int cow(struct loom_kv *kv, struct loom_kv_seq *seq)
{
	int32_t j = (int32_t)(seq->n_tokens / kv->block_size);
	int32_t old = seq->blocks[j], b = take_block(kv);
	int rc = loom_kv_copy_block(kv, b, old);

	if (rc) {
		unref_block(kv, b);
		return rc;
	}
	seq->blocks[j] = b;
	unref_block(kv, old);
	kv->n_copies++;
	return 0;
}

int loom_kv_reserve(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t n_new)
{
	int64_t total = (int64_t)seq->n_tokens + n_new;
	int64_t need = (total + kv->block_size - 1) / kv->block_size;
	bool copy;
	int rc;

	if (n_new < 0 || need > INT32_MAX)
		return LOOM_ERR_INVALID;
	copy = n_new > 0 && needs_cow(kv, seq);
	if (need <= seq->n_blocks && !copy)
		return 0;
	if (need < seq->n_blocks)
		need = seq->n_blocks;
	if (need - seq->n_blocks + copy > loom_kv_n_available(kv))
		return LOOM_ERR_FULL;
	rc = grow_table(seq, (int32_t)need);
	if (rc)
		return rc;
	rc = copy ? cow(kv, seq) : 0;
	if (rc)
		return rc;
	while (seq->n_blocks < need)
		seq->blocks[seq->n_blocks++] = take_block(kv);
	return 0;
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

int loom_kv_fork(struct loom_kv *kv, struct loom_kv_seq *dst,
		 const struct loom_kv_seq *src)
{
	int32_t n = (int32_t)((src->n_tokens + kv->block_size - 1) / kv->block_size);
	int32_t j;

	int rc;

	if (dst->n_blocks || n > src->n_blocks)
		return LOOM_ERR_INVALID;
	rc = n ? grow_table(dst, n) : 0;
	if (rc)
		return rc;
	for (j = 0; j < n; j++) {
		dst->blocks[j] = src->blocks[j];
		kv->refs[src->blocks[j]]++;
	}
	dst->n_blocks = n;
	dst->n_tokens = src->n_tokens;
	return 0;
}

int loom_kv_copy_block(struct loom_kv *kv, int32_t dst, int32_t src)
{
	const struct loom_backend *be = kv->be;
	size_t bytes = (size_t)kv->block_size * (size_t)kv->kv_dim * sizeof(float);
	int64_t l;
	int rc;

	if (dst < 0 || src < 0 || dst >= kv->n_blocks || src >= kv->n_blocks)
		return LOOM_ERR_INVALID;
	for (l = 0; l < kv->n_layer; l++) {
		char *k = loom_kv_k(kv, l), *v = loom_kv_v(kv, l);

		rc = be->ops->copy(be->ctx, k + (size_t)dst * bytes, k + (size_t)src * bytes, bytes);
		if (!rc)
			rc = be->ops->copy(be->ctx, v + (size_t)dst * bytes,
					   v + (size_t)src * bytes, bytes);
		if (rc)
			return rc;
	}
	return 0;
}

uint64_t loom_kv_block_hash(uint64_t parent, const int32_t *tokens, int64_t n)
{
	return XXH3_64bits_withSeed(tokens, (size_t)n * sizeof(int32_t), parent);
}

static const int32_t *block_tokens(const struct loom_kv *kv, int32_t b)
{
	return kv->tokens + (size_t)b * (size_t)kv->block_size;
}

int32_t loom_kv_cache_lookup(const struct loom_kv *kv, uint64_t hash,
			     uint64_t parent, const int32_t *tokens)
{
	size_t bytes = (size_t)kv->block_size * sizeof(int32_t);
	int32_t b;

	for (b = kv->buckets[bucket_of(kv, hash)]; b >= 0; b = kv->meta[b].hnext) {
		const struct loom_kv_block *m = &kv->meta[b];

		if (m->hash == hash && m->parent == parent &&
		    memcmp(block_tokens(kv, b), tokens, bytes) == 0)
			return b;
	}
	return -1;
}

bool loom_kv_cache_register(struct loom_kv *kv, int32_t block, uint64_t hash,
			    uint64_t parent, const int32_t *tokens)
{
	struct loom_kv_block *m;
	uint32_t h = bucket_of(kv, hash);
	int32_t b;

	if (block < 0 || block >= kv->n_blocks || kv->refs[block] <= 0)
		return false;
	m = &kv->meta[block];
	if (m->cached)
		return false;
	for (b = kv->buckets[h]; b >= 0; b = kv->meta[b].hnext)
		if (kv->meta[b].hash == hash)
			return false;
	memcpy(kv->tokens + (size_t)block * (size_t)kv->block_size, tokens,
	       (size_t)kv->block_size * sizeof(int32_t));
	*m = (struct loom_kv_block){ .hash = hash, .parent = parent,
		.hnext = kv->buckets[h], .prev = -1, .next = -1, .cached = true };
	kv->buckets[h] = block;
	return true;
}

int loom_kv_seq_append_cached(struct loom_kv *kv, struct loom_kv_seq *seq,
			      int32_t block)
{
	int rc;

	if (block < 0 || block >= kv->n_blocks || !kv->meta[block].cached ||
	    (int64_t)seq->n_tokens != (int64_t)seq->n_blocks * kv->block_size ||
	    seq->n_blocks == INT32_MAX)
		return LOOM_ERR_INVALID;
	rc = grow_table(seq, seq->n_blocks + 1);
	if (rc)
		return rc;
	if (kv->refs[block]++ == 0)
		lru_unlink(kv, block);
	seq->blocks[seq->n_blocks++] = block;
	seq->n_tokens += (int32_t)kv->block_size;
	return 0;
}
