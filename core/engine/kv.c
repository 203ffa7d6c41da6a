/* Paged KV cache: block pool, per-sequence block tables, copy-on-write,
 * the prefix cache (hash table + LRU list of unreferenced blocks), and a
 * second pool for sliding-window layers whose tables drop leading blocks.
 *
 * Functions named pool_* act on one pool (a struct loom_kv and one of its
 * sequence tables); the public ones keep a sequence's two tables in step. */
#include "engine/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <xxhash.h>

#include "loom/kv_quant.h"

size_t loom_kv_type_bytes(uint32_t type, int64_t n_layer, int64_t kv_dim,
			  int64_t block_size, int64_t n_blocks)
{
	size_t bytes;

	if (n_layer <= 0 || kv_dim <= 0 || block_size <= 0 || n_blocks <= 0 ||
	    kv_dim > ((int64_t)1 << 40))
		return 0;
	bytes = loom_kvq_row_bytes(type, kv_dim);
	if (!bytes || __builtin_mul_overflow(bytes, (size_t)block_size, &bytes) ||
	    __builtin_mul_overflow(bytes, (size_t)n_blocks, &bytes) ||
	    __builtin_mul_overflow(bytes, (size_t)n_layer * 2, &bytes))
		return 0;
	return bytes;
}

size_t loom_kv_bytes(int64_t n_layer, int64_t kv_dim, int64_t block_size,
		     int64_t n_blocks)
{
	return loom_kv_type_bytes(LOOM_TYPE_F32, n_layer, kv_dim, block_size, n_blocks);
}

static const struct {
	uint32_t type;
	const char *name;
} kv_types[] = {
	{ LOOM_TYPE_F32, "f32" },
	{ LOOM_TYPE_F16, "f16" },
	{ LOOM_TYPE_Q8_0, "q8_0" },
	{ LOOM_TYPE_Q4_0, "q4_0" },
};

const char *loom_kv_type_name(int32_t type)
{
	if (type == LOOM_KV_DEFAULT)
		return "default";
	for (size_t i = 0; i < sizeof(kv_types) / sizeof(kv_types[0]); i++)
		if ((int32_t)kv_types[i].type == type)
			return kv_types[i].name;
	return NULL;
}

int loom_kv_type_parse(const char *name, int32_t *type)
{
	for (size_t i = 0; name && i < sizeof(kv_types) / sizeof(kv_types[0]); i++)
		if (!strcasecmp(kv_types[i].name, name)) {
			*type = (int32_t)kv_types[i].type;
			return 0;
		}
	return -1;
}

uint64_t loom_kv_default_bytes(void)
{
	const uint64_t lo = (uint64_t)256 << 20, hi = (uint64_t)4 << 30;
	unsigned long long kb = 0;
	char line[256];
	uint64_t b;
	FILE *f = fopen("/proc/meminfo", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	if (kb > (UINT64_MAX >> 10))
		return hi;
	b = (uint64_t)kb * 1024 / 8;
	return b < lo ? lo : b > hi ? hi : b;
}

bool loom_kv_type_usable(const struct loom_backend *be, uint32_t type, char *why,
			 size_t whylen)
{
	const struct loom_backend_ops *ops = be->ops;
	const char *name = loom_kv_type_name((int32_t)type);

	if (type == LOOM_TYPE_F32)
		return true;
	if (!loom_kvq_known(type)) {
		snprintf(why, whylen, "type %u is not a KV cache type (f32, f16, q8_0, q4_0)",
			 (unsigned)type);
		return false;
	}
	/* a backend of ABI 1.0-1.2 reads f32 whatever the arguments say */
	if (ops->abi_minor < 3) {
		snprintf(why, whylen, "backend %s is of ABI 1.%u, which stores the KV cache as f32 only (a %s cache needs 1.3)",
			 ops->name, (unsigned)ops->abi_minor, name);
		return false;
	}
	if (!ops->supports(be->ctx, LOOM_OP_KV_WRITE, type) ||
	    !ops->supports(be->ctx, LOOM_OP_ATTENTION, type)) {
		snprintf(why, whylen, "backend %s does not store a %s KV cache", ops->name, name);
		return false;
	}
	return true;
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
	return loom_kv_new_type(be, LOOM_TYPE_F32, n_layer, kv_dim, block_size, n_blocks,
				err, errlen);
}

struct loom_kv *loom_kv_new_type(struct loom_backend *be, uint32_t type, int64_t n_layer,
				 int64_t kv_dim, int64_t block_size, int64_t n_blocks,
				 char *err, size_t errlen)
{
	size_t bytes = loom_kv_type_bytes(type, n_layer, kv_dim, block_size, n_blocks);
	struct loom_kv *kv;
	char why[256];
	int32_t i;

	if (!loom_kv_type_usable(be, type, why, sizeof(why))) {
		snprintf(err, errlen, "kv cache: %s", why);
		return NULL;
	}
	if (type != LOOM_TYPE_F32 && kv_dim % LOOM_KVQ_BLOCK &&
	    loom_kvq_block_elems(type) > 1) {
		snprintf(err, errlen, "kv cache: a %s cache needs rows of whole blocks of %d values; this model's are %lld",
			 loom_kv_type_name((int32_t)type), LOOM_KVQ_BLOCK, (long long)kv_dim);
		return NULL;
	}
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
		.layer_bytes = bytes / (size_t)(2 * n_layer), .type = type,
		.row_bytes = loom_kvq_row_bytes(type, kv_dim) };
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
	loom_kv_free(kv->local);
	free(kv->layer_pool);
	free(kv->layer_index);
	free(kv->copy_log);
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

int64_t loom_kv_n_held(const struct loom_kv *kv)
{
	return kv->n_blocks - kv->n_free - kv->n_lru;
}

static void note_held(struct loom_kv *kv)
{
	int64_t held = loom_kv_n_held(kv);

	if (held > kv->n_held_peak)
		kv->n_held_peak = held;
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
	note_held(kv);
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

/* What reserving n_new tokens takes from kv's pool for seq: the table
 * length *len and whether the block at n_tokens needs a copy first.
 * Returns the blocks it takes, or -1 for a bad n_new. */
static int64_t reserve_need(const struct loom_kv *kv, const struct loom_kv_seq *seq,
			    int32_t n_new, int64_t *len, bool *copy)
{
	int64_t total = (int64_t)seq->n_tokens + n_new;

	*len = (total + kv->block_size - 1) / kv->block_size;
	*copy = false;
	if (n_new < 0 || *len > INT32_MAX)
		return -1;
	*copy = n_new > 0 && needs_cow(kv, seq);
	if (*len < seq->n_blocks)
		*len = seq->n_blocks;
	return *len - seq->n_blocks + *copy;
}

/* Makes the reservation reserve_need measured (and the caller checked). */
static int pool_reserve(struct loom_kv *kv, struct loom_kv_seq *seq, int64_t len,
			bool copy)
{
	int rc = grow_table(seq, (int32_t)len);

	if (!rc && copy)
		rc = cow(kv, seq);
	if (rc)
		return rc;
	while (seq->n_blocks < len)
		seq->blocks[seq->n_blocks++] = take_block(kv);
	return 0;
}

/* Drops table entries past n (the -1 of released windowed blocks too). */
static void pool_shrink(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t n)
{
	while (seq->n_blocks > n) {
		int32_t b = seq->blocks[--seq->n_blocks];

		if (b >= 0)
			unref_block(kv, b);
	}
	if (seq->n_dropped > seq->n_blocks)
		seq->n_dropped = seq->n_blocks;
}

/* seq's table in the windowed pool, made on first use, its n_tokens
 * set to seq's. NULL when kv has no windowed pool or out of memory. */
static struct loom_kv_seq *local_seq(const struct loom_kv *kv, struct loom_kv_seq *seq)
{
	if (!kv->local)
		return NULL;
	if (!seq->local)
		seq->local = calloc(1, sizeof(*seq->local));
	if (seq->local)
		seq->local->n_tokens = seq->n_tokens;
	return seq->local;
}

int loom_kv_reserve(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t n_new)
{
	struct loom_kv_seq *ls = local_seq(kv, seq);
	int32_t old = seq->n_blocks;
	int64_t take, ltake = 0, len, llen = 0;
	bool copy = false, lcopy = false;
	int rc;

	if (kv->local && !ls)
		return LOOM_ERR_NOMEM;
	take = reserve_need(kv, seq, n_new, &len, &copy);
	if (ls)
		ltake = reserve_need(kv->local, ls, n_new, &llen, &lcopy);
	if (take < 0 || ltake < 0)
		return LOOM_ERR_INVALID;
	if (take == 0 && ltake == 0)
		return 0;
	if (take > loom_kv_n_available(kv) ||
	    (ls && ltake > loom_kv_n_available(kv->local)))
		return LOOM_ERR_FULL;
	rc = take ? pool_reserve(kv, seq, len, copy) : 0;
	if (rc || !ltake)
		return rc;
	rc = pool_reserve(kv->local, ls, llen, lcopy);
	if (rc)
		pool_shrink(kv, seq, old); /* a copy made above stays: harmless */
	return rc;
}

static void pool_truncate(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t keep)
{
	if (keep < seq->n_tokens)
		seq->n_tokens = keep;
	pool_shrink(kv, seq, (int32_t)((keep + kv->block_size - 1) / kv->block_size));
}

/* True when the windowed table ls still holds every block that queries
 * at positions >= p read (and the block p falls in, for a copy). */
static bool window_intact(const struct loom_kv *local, const struct loom_kv_seq *ls,
			  int32_t p)
{
	int64_t lo = (int64_t)p - local->window + 1;

	return ls->n_dropped == 0 || (lo > 0 && lo / local->block_size >= ls->n_dropped);
}

void loom_kv_truncate(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t keep)
{
	if (keep < 0)
		keep = 0;
	if (seq->local && !window_intact(kv->local, seq->local, keep))
		keep = 0; /* what the positions from keep on read is gone */
	pool_truncate(kv, seq, keep);
	if (seq->local) {
		seq->local->n_tokens = seq->n_tokens;
		pool_truncate(kv->local, seq->local, keep);
	}
}

void loom_kv_slide(struct loom_kv *kv, struct loom_kv_seq *seq)
{
	struct loom_kv_seq *ls = seq->local;
	int64_t lo, upto;

	if (!kv->local || !ls)
		return;
	lo = (int64_t)seq->n_tokens - kv->local->window + 1;
	upto = lo > 0 ? lo / kv->block_size : 0;
	if (upto > ls->n_blocks)
		upto = ls->n_blocks;
	for (; ls->n_dropped < upto; ls->n_dropped++) {
		int32_t *b = &ls->blocks[ls->n_dropped];

		if (*b >= 0)
			unref_block(kv->local, *b);
		*b = -1;
	}
}

void loom_kv_seq_release(struct loom_kv *kv, struct loom_kv_seq *seq)
{
	if (seq->local) {
		pool_truncate(kv->local, seq->local, 0);
		free(seq->local->blocks);
		free(seq->local);
	}
	pool_truncate(kv, seq, 0);
	free(seq->blocks);
	*seq = (struct loom_kv_seq){ 0 };
}

/* dst (empty) shares src's blocks holding its first n_tokens. */
static int pool_fork(struct loom_kv *kv, struct loom_kv_seq *dst,
		     const struct loom_kv_seq *src, int32_t n_tokens)
{
	int32_t n = (int32_t)((n_tokens + kv->block_size - 1) / kv->block_size);
	int rc;

	if (dst->n_blocks || n > src->n_blocks)
		return LOOM_ERR_INVALID;
	rc = n ? grow_table(dst, n) : 0;
	if (rc)
		return rc;
	for (int32_t j = 0; j < n; j++) {
		dst->blocks[j] = src->blocks[j];
		if (src->blocks[j] >= 0)
			kv->refs[src->blocks[j]]++;
	}
	dst->n_blocks = n;
	dst->n_tokens = n_tokens;
	dst->n_dropped = src->n_dropped < n ? src->n_dropped : n;
	return 0;
}

int loom_kv_fork(struct loom_kv *kv, struct loom_kv_seq *dst,
		 const struct loom_kv_seq *src)
{
	struct loom_kv_seq *ls;
	int rc;

	if (dst->n_blocks || (dst->local && dst->local->n_blocks))
		return LOOM_ERR_INVALID;
	rc = pool_fork(kv, dst, src, src->n_tokens);
	if (rc || !kv->local || !src->local)
		return rc;
	ls = local_seq(kv, dst);
	rc = ls ? pool_fork(kv->local, ls, src->local, src->n_tokens) : LOOM_ERR_NOMEM;
	if (rc)
		pool_truncate(kv, dst, 0);
	return rc;
}

/* Records a copy for the other ranks of a distributed job. */
static int log_copy(struct loom_kv *kv, int32_t dst, int32_t src)
{
	if (kv->n_copy_log == kv->cap_copy_log) {
		int32_t cap = kv->cap_copy_log ? 2 * kv->cap_copy_log : 64;
		int32_t *nl = realloc(kv->copy_log, sizeof(int32_t) * 2 * (size_t)cap);

		if (!nl)
			return -1;
		kv->copy_log = nl;
		kv->cap_copy_log = cap;
	}
	kv->copy_log[2 * kv->n_copy_log] = dst;
	kv->copy_log[2 * kv->n_copy_log + 1] = src;
	kv->n_copy_log++;
	return 0;
}

int loom_kv_copy_block(struct loom_kv *kv, int32_t dst, int32_t src)
{
	const struct loom_backend *be = kv->be;
	size_t bytes = (size_t)kv->block_size * kv->row_bytes;
	int64_t l;
	int rc;

	if (dst < 0 || src < 0 || dst >= kv->n_blocks || src >= kv->n_blocks)
		return LOOM_ERR_INVALID;
	if (kv->log_copies && log_copy(kv, dst, src))
		return LOOM_ERR_NOMEM;
	for (l = 0; l < kv->n_layer; l++) {
		/* this pool's own layers, whatever the model's numbering */
		char *k = kv->base + (size_t)(2 * l) * kv->layer_bytes;
		char *v = k + kv->layer_bytes;

		rc = be->ops->copy(be->ctx, k + (size_t)dst * bytes, k + (size_t)src * bytes, bytes);
		if (!rc)
			rc = be->ops->copy(be->ctx, v + (size_t)dst * bytes,
					   v + (size_t)src * bytes, bytes);
		if (rc)
			return rc;
	}
	return 0;
}

/* One pool's part of loom_kv_move_rows. */
static int move_rows_pool(struct loom_kv *kv, const struct loom_kv_seq *seq,
			  const int32_t *from, const int32_t *to, int32_t n)
{
	const struct loom_backend *be = kv->be;
	size_t rb = kv->row_bytes;

	for (int64_t l = 0; l < kv->n_layer; l++) {
		char *k = kv->base + (size_t)(2 * l) * kv->layer_bytes;
		char *v = k + kv->layer_bytes;

		for (int32_t i = 0; i < n; i++) {
			size_t d = (size_t)loom_kv_slot(kv, seq, to[i]) * rb;
			size_t s = (size_t)loom_kv_slot(kv, seq, from[i]) * rb;
			int rc = be->ops->copy(be->ctx, k + d, k + s, rb);

			if (!rc)
				rc = be->ops->copy(be->ctx, v + d, v + s, rb);
			if (rc)
				return rc;
		}
	}
	return 0;
}

int loom_kv_move_rows(struct loom_kv *kv, struct loom_kv_seq *seq, const int32_t *from,
		      const int32_t *to, int32_t n)
{
	int32_t cap = seq->n_blocks * (int32_t)kv->block_size;
	int rc;

	for (int32_t i = 0; i < n; i++)
		if (from[i] < 0 || to[i] < 0 || from[i] >= cap || to[i] >= cap)
			return LOOM_ERR_INVALID;
	rc = move_rows_pool(kv, seq, from, to, n);
	if (!rc && kv->local && seq->local)
		rc = move_rows_pool(kv->local, seq->local, from, to, n);
	return rc;
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

static int pool_append_cached(struct loom_kv *kv, struct loom_kv_seq *seq, int32_t block)
{
	int rc;

	if (block < 0 || block >= kv->n_blocks || !kv->meta[block].cached ||
	    (int64_t)seq->n_tokens != (int64_t)seq->n_blocks * kv->block_size ||
	    seq->n_blocks == INT32_MAX)
		return LOOM_ERR_INVALID;
	rc = grow_table(seq, seq->n_blocks + 1);
	if (rc)
		return rc;
	if (kv->refs[block]++ == 0) {
		lru_unlink(kv, block);
		note_held(kv);
	}
	seq->blocks[seq->n_blocks++] = block;
	seq->n_tokens += (int32_t)kv->block_size;
	return 0;
}

int loom_kv_seq_append_cached(struct loom_kv *kv, struct loom_kv_seq *seq,
			      int32_t block)
{
	if (kv->local)
		return LOOM_ERR_INVALID;
	return pool_append_cached(kv, seq, block);
}

/* ---- windowed layers: construction and sizes ---- */

int64_t loom_kv_split(const int32_t *windows, int64_t n_layer, int32_t *window)
{
	int64_t n = 0;

	*window = 0;
	for (int64_t l = 0; windows && l < n_layer; l++) {
		if (windows[l] <= 0)
			continue;
		n++;
		if (windows[l] > *window)
			*window = windows[l];
	}
	return n < n_layer ? n : 0;
}

int64_t loom_kv_window_blocks(int32_t window, int64_t block_size, int64_t n_new)
{
	if (window <= 0 || block_size <= 0 || n_new <= 0)
		return 0;
	/* positions max(0, p - window + 1) .. p + n_new - 1 span at most
	 * window + n_new - 1 positions, so at most this many blocks */
	return (window + n_new - 2) / block_size + 2;
}

size_t loom_kv_total_bytes(const struct loom_kv *kv)
{
	size_t local = kv->local ? loom_kv_total_bytes(kv->local) : 0;

	return 2 * (size_t)kv->n_layer * kv->layer_bytes + local;
}

/* Which pool model layer l of config c lives in (1: the windowed one). */
static int pool_of(const struct loom_kv_config *c, bool split, int64_t l)
{
	return split && c->windows[l] > 0;
}

/* Maps each model layer to its pool and its index there; layers outside
 * lo .. hi-1 have no memory here (index -1). */
static int map_layers(struct loom_kv *kv, const struct loom_kv_config *c, bool split,
		      int64_t lo, int64_t hi)
{
	int64_t n[2] = { 0, 0 };

	kv->layer_pool = malloc(sizeof(int32_t) * (size_t)c->n_layer);
	kv->layer_index = malloc(sizeof(int32_t) * (size_t)c->n_layer);
	if (!kv->layer_pool || !kv->layer_index)
		return -1;
	for (int64_t l = 0; l < c->n_layer; l++) {
		int p = pool_of(c, split, l);

		kv->layer_pool[l] = p;
		kv->layer_index[l] = l >= lo && l < hi ? (int32_t)n[p]++ : -1;
	}
	kv->n_model_layers = c->n_layer;
	kv->layer_lo = lo;
	kv->layer_hi = hi;
	return 0;
}

/* Layers of each pool with memory here; a pool with none still gets one
 * (its block accounting must match the other ranks'). */
static void held_layers(const struct loom_kv_config *c, bool split, int64_t lo, int64_t hi,
			int64_t held[2])
{
	held[0] = held[1] = 0;
	for (int64_t l = lo; l < hi; l++)
		held[pool_of(c, split, l)]++;
	held[0] += !held[0];
	held[1] += !held[1];
}

struct loom_kv *loom_kv_new_config(struct loom_backend *be, const struct loom_kv_config *c,
				   char *err, size_t errlen)
{
	int32_t window;
	int64_t n_local = loom_kv_split(c->windows, c->n_layer, &window);
	int64_t lo = c->layer_lo, hi = c->layer_hi > 0 ? c->layer_hi : c->n_layer, held[2];
	bool part = lo > 0 || hi < c->n_layer;
	struct loom_kv *kv;

	if (lo < 0 || hi > c->n_layer || lo >= hi) {
		snprintf(err, errlen, "kv cache: layers %lld..%lld outside the model's %lld",
			 (long long)lo, (long long)hi - 1, (long long)c->n_layer);
		return NULL;
	}
	if (!n_local && !part)
		return loom_kv_new_type(be, c->type, c->n_layer, c->kv_dim, c->block_size,
					c->n_blocks, err, errlen);
	held_layers(c, n_local > 0, lo, hi, held);
	kv = loom_kv_new_type(be, c->type, held[0], c->kv_dim, c->block_size, c->n_blocks,
			      err, errlen);
	if (!kv)
		return NULL;
	if (n_local) {
		kv->local = loom_kv_new_type(be, c->type, held[1], c->kv_dim, c->block_size,
					     c->n_local_blocks, err, errlen);
		if (!kv->local)
			goto out_free;
		kv->local->window = window;
	}
	if (map_layers(kv, c, n_local > 0, lo, hi)) {
		snprintf(err, errlen, "kv cache: out of memory");
		goto out_free;
	}
	return kv;
out_free:
	loom_kv_free(kv);
	return NULL;
}

/* ---- the prefix cache over both pools ---- */

static uint64_t parent_of(const uint64_t *hashes, int32_t j)
{
	return j ? hashes[j - 1] : LOOM_KV_ROOT_HASH;
}

/* The first windowed block a query at position p reads (blocks from it to
 * the one holding p - 1 must be held to resume at p). */
static int32_t first_needed(const struct loom_kv *local, int32_t p)
{
	int64_t lo = (int64_t)p - local->window + 1;

	return lo > 0 ? (int32_t)(lo / local->block_size) : 0;
}

/* True when the windowed pool has cached every block needed to resume at
 * position p of the token sequence. */
static bool window_cached(const struct loom_kv *local, const uint64_t *hashes,
			  const int32_t *tokens, int32_t p)
{
	int64_t bs = local->block_size;

	for (int32_t j = first_needed(local, p); j < (int32_t)((p + bs - 1) / bs); j++)
		if (loom_kv_cache_lookup(local, hashes[j], parent_of(hashes, j),
					 tokens + (size_t)j * (size_t)bs) < 0)
			return false;
	return true;
}

/* Appends the windowed pool's cached blocks for a run of n blocks resumed
 * at p: -1 below the first needed one. */
static int share_window(struct loom_kv *local, struct loom_kv_seq *ls, const uint64_t *hashes,
			const int32_t *tokens, int32_t n, int32_t p)
{
	int32_t first = first_needed(local, p);
	int rc = grow_table(ls, n);

	if (rc)
		return rc;
	for (int32_t j = 0; j < first; j++)
		ls->blocks[j] = -1;
	ls->n_blocks = ls->n_dropped = first;
	ls->n_tokens = (int32_t)(first * local->block_size);
	for (int32_t j = first; j < n; j++) {
		int32_t b = loom_kv_cache_lookup(local, hashes[j], parent_of(hashes, j),
						 tokens + (size_t)j * (size_t)local->block_size);

		rc = b < 0 ? LOOM_ERR_INVALID : pool_append_cached(local, ls, b);
		if (rc)
			return rc;
	}
	return 0;
}

int32_t loom_kv_share_prefix(struct loom_kv *kv, struct loom_kv_seq *seq,
			     const uint64_t *hashes, const int32_t *tokens,
			     int32_t n_full, int32_t limit)
{
	int64_t bs = kv->block_size;
	int32_t n = 0, p = 0;
	struct loom_kv_seq *ls;

	if (seq->n_blocks || limit < 0)
		return 0;
	while (n < n_full && loom_kv_cache_lookup(kv, hashes[n], parent_of(hashes, n),
						  tokens + (size_t)n * (size_t)bs) >= 0)
		n++;
	/* the windowed pool may have dropped what the run's end needs:
	 * shorten the run until it has not (a run of 0 needs nothing) */
	for (; n > 0; n--) {
		p = n * bs < limit ? (int32_t)(n * bs) : limit;
		if (!kv->local || window_cached(kv->local, hashes, tokens, p))
			break;
	}
	if (n == 0)
		return 0;
	for (int32_t j = 0; j < n; j++)
		if (pool_append_cached(kv, seq, loom_kv_cache_lookup(kv, hashes[j],
			parent_of(hashes, j), tokens + (size_t)j * (size_t)bs)))
			goto out_release;
	ls = local_seq(kv, seq);
	if (kv->local && (!ls || share_window(kv->local, ls, hashes, tokens, n, p)))
		goto out_release;
	seq->n_tokens = p;
	if (ls)
		ls->n_tokens = p;
	return n;
out_release:
	loom_kv_seq_release(kv, seq);
	return 0;
}

void loom_kv_cache_register_seq(struct loom_kv *kv, const struct loom_kv_seq *seq,
				int32_t j, uint64_t hash, uint64_t parent,
				const int32_t *tokens)
{
	const struct loom_kv_seq *ls = seq->local;

	if (j < 0 || j >= seq->n_blocks)
		return;
	loom_kv_cache_register(kv, seq->blocks[j], hash, parent, tokens);
	if (kv->local && ls && j < ls->n_blocks && ls->blocks[j] >= 0)
		loom_kv_cache_register(kv->local, ls->blocks[j], hash, parent, tokens);
}
