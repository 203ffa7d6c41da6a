/* Paged KV cache: block accounting, block tables, truncation, overflow;
 * the sliding-window layers' pool: bounded blocks, fork, copy-on-write,
 * truncation, the prefix cache, release (preemption). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/backend_loader.h"
#include "engine/kv.h"
#include "loom/kv_quant.h"

static struct loom_backend *be;

static void setup(void)
{
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg), .n_threads = 1 };
	char err[512];

	be = loom_backend_open("ref.so", &cfg, err, sizeof(err));
	ck_assert_msg(be != NULL, "%s", err);
}

static void teardown(void)
{
	loom_backend_close(be);
}

START_TEST(reserve_and_release)
{
	char err[256];
	struct loom_kv *kv = loom_kv_new(be, 2, 8, 16, 4, err, sizeof(err));
	struct loom_kv_seq a = { 0 }, b = { 0 };

	ck_assert_msg(kv != NULL, "%s", err);
	ck_assert_int_eq(kv->n_free, 4);
	ck_assert_int_eq(loom_kv_reserve(kv, &a, 17), 0); /* 2 blocks */
	ck_assert_int_eq(a.n_blocks, 2);
	ck_assert_int_eq(kv->n_free, 2);
	a.n_tokens = 17;
	ck_assert_int_eq(loom_kv_reserve(kv, &a, 15), 0); /* 32 fits in 2 */
	ck_assert_int_eq(a.n_blocks, 2);
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 33), LOOM_ERR_FULL); /* needs 3, 2 free */
	ck_assert_int_eq(b.n_blocks, 0);
	ck_assert_int_eq(kv->n_free, 2);
	/* a bad argument is not "out of blocks" */
	ck_assert_int_eq(loom_kv_reserve(kv, &b, -1), LOOM_ERR_INVALID);
	ck_assert_int_eq(loom_kv_seq_append_cached(kv, &b, 0), LOOM_ERR_INVALID);
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 32), 0);
	ck_assert_int_eq(kv->n_free, 0);
	/* distinct physical blocks */
	ck_assert_int_ne(a.blocks[0], b.blocks[0]);
	ck_assert_int_ne(a.blocks[1], b.blocks[1]);
	ck_assert_int_ne(a.blocks[0], b.blocks[1]);
	/* slot of position 17 is block 1, offset 1 */
	ck_assert_int_eq(loom_kv_slot(kv, &a, 17), a.blocks[1] * 16 + 1);
	loom_kv_truncate(kv, &a, 10);
	ck_assert_int_eq(a.n_blocks, 1);
	ck_assert_int_eq(a.n_tokens, 10);
	ck_assert_int_eq(kv->n_free, 1);
	loom_kv_seq_release(kv, &a);
	loom_kv_seq_release(kv, &b);
	ck_assert_int_eq(kv->n_free, 4);
	loom_kv_free(kv);
}
END_TEST

START_TEST(layer_addresses_do_not_overlap)
{
	char err[256];
	struct loom_kv *kv = loom_kv_new(be, 3, 8, 16, 4, err, sizeof(err));
	size_t layer = 4 * 16 * 8 * sizeof(float);

	ck_assert_msg(kv != NULL, "%s", err);
	ck_assert_uint_eq(kv->layer_bytes, layer);
	ck_assert_ptr_eq((char *)loom_kv_v(kv, 0), (char *)loom_kv_k(kv, 0) + layer);
	ck_assert_ptr_eq((char *)loom_kv_k(kv, 2), (char *)loom_kv_k(kv, 0) + 4 * layer);
	loom_kv_free(kv);
}
END_TEST

START_TEST(size_overflow_is_refused)
{
	char err[256] = "";

	ck_assert_uint_eq(loom_kv_bytes(1 << 20, 1 << 20, 1 << 20, 1 << 20), 0);
	ck_assert_ptr_null(loom_kv_new(be, 1 << 20, 1 << 20, 1 << 20, 1 << 20, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "overflow"));
}
END_TEST

/* ---- quantized caches: sizes, copy-on-write and the prefix cache ---- */

START_TEST(quantized_sizes)
{
	char err[256] = "";

	/* 2 layers x K,V x 16 tokens x a 64-value row */
	ck_assert_uint_eq(loom_kv_type_bytes(LOOM_TYPE_F32, 2, 64, 16, 1), 4 * 16 * 256);
	ck_assert_uint_eq(loom_kv_type_bytes(LOOM_TYPE_F16, 2, 64, 16, 1), 4 * 16 * 128);
	ck_assert_uint_eq(loom_kv_type_bytes(LOOM_TYPE_Q8_0, 2, 64, 16, 1), 4 * 16 * 68);
	ck_assert_uint_eq(loom_kv_type_bytes(LOOM_TYPE_Q4_0, 2, 64, 16, 1), 4 * 16 * 36);
	ck_assert_uint_eq(loom_kv_type_bytes(LOOM_TYPE_Q8_0, 2, 48, 16, 1), 0);
	ck_assert_uint_eq(loom_kv_type_bytes(LOOM_TYPE_Q4_1, 2, 64, 16, 1), 0);
	ck_assert_uint_eq(loom_kv_type_bytes(LOOM_TYPE_F16, 2, 48, 16, 1), 4 * 16 * 96);
	ck_assert_ptr_null(loom_kv_new_type(be, LOOM_TYPE_Q8_0, 2, 48, 16, 4, err, sizeof(err)));
	ck_assert_msg(strstr(err, "blocks of 32") != NULL, "%s", err);
	ck_assert_ptr_null(loom_kv_new_type(be, LOOM_TYPE_Q4_1, 2, 64, 16, 4, err, sizeof(err)));
	ck_assert_msg(strstr(err, "not a KV cache type") != NULL, "%s", err);
}
END_TEST

#define QD 64 /* kv_dim of the quantized cases */

/* Writes rows for positions [from, to) of seq into every layer of kv
 * through the backend's kv_write (of kv's type). */
static void write_rows(struct loom_kv *kv, const struct loom_kv_seq *seq, int from, int to)
{
	float k[16 * QD], v[16 * QD];
	int32_t slots[16];
	int n = to - from;

	ck_assert_int_le(n, 16);
	for (int i = 0; i < n * QD; i++) {
		k[i] = (float)((i * 37 + from * 11) % 101) / 25.0f - 2.0f;
		v[i] = (float)((i * 53 + from * 7) % 89) / 20.0f - 2.2f;
	}
	for (int t = 0; t < n; t++)
		slots[t] = loom_kv_slot(kv, seq, from + t);
	for (int64_t l = 0; l < kv->n_layer; l++) {
		struct loom_kv_write_args a = { .struct_size = sizeof(a),
			.kcache = loom_kv_k(kv, l), .vcache = loom_kv_v(kv, l), .k = k, .v = v,
			.k_stride = QD, .v_stride = QD, .n_tokens = n, .kv_dim = QD,
			.slots = slots, .kv_type = kv->type };

		ck_assert_int_eq(be->ops->kv_write(be->ctx, &a), 0);
	}
}

/* Whether physical blocks x and y hold the same bytes in every layer. */
static bool same_block(const struct loom_kv *kv, int32_t x, int32_t y)
{
	size_t bytes = (size_t)kv->block_size * kv->row_bytes;

	for (int64_t l = 0; l < 2 * kv->n_layer; l++) {
		const char *base = kv->base + (size_t)l * kv->layer_bytes;

		if (memcmp(base + (size_t)x * bytes, base + (size_t)y * bytes, bytes))
			return false;
	}
	return true;
}

START_TEST(quantized_copy_on_write_and_prefix)
{
	static const uint32_t types[] = { LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_F16 };
	char err[256];

	for (int ti = 0; ti < 3; ti++) {
		struct loom_kv *kv = loom_kv_new_type(be, types[ti], 2, QD, 16, 6, err, sizeof(err));
		struct loom_kv_seq a = { 0 }, b = { 0 }, c = { 0 };
		int32_t toks[16];
		uint64_t h;
		int32_t first;

		ck_assert_msg(kv != NULL, "%s", err);
		ck_assert_uint_eq(kv->row_bytes, loom_kvq_row_bytes(types[ti], QD));
		/* a: one full block and 10 tokens of a second */
		ck_assert_int_eq(loom_kv_reserve(kv, &a, 26), 0);
		write_rows(kv, &a, 0, 16);
		write_rows(kv, &a, 16, 26);
		a.n_tokens = 26;
		/* b shares both; writing token 26 copies the partial block */
		ck_assert_int_eq(loom_kv_fork(kv, &b, &a), 0);
		ck_assert_int_eq(loom_kv_reserve(kv, &b, 1), 0);
		ck_assert_uint_eq(kv->n_copies, 1);
		ck_assert_int_eq(b.blocks[0], a.blocks[0]);
		ck_assert_int_ne(b.blocks[1], a.blocks[1]);
		ck_assert_msg(same_block(kv, a.blocks[1], b.blocks[1]),
			      "%s: the copied block's bytes differ", loom_kv_type_name((int32_t)types[ti]));
		write_rows(kv, &b, 26, 27); /* the copy diverges; the original not */
		ck_assert(!same_block(kv, a.blocks[1], b.blocks[1]));
		/* the full first block, cached, is found and shared unchanged */
		for (int i = 0; i < 16; i++)
			toks[i] = 100 + i;
		h = loom_kv_block_hash(LOOM_KV_ROOT_HASH, toks, 16);
		first = a.blocks[0];
		ck_assert(loom_kv_cache_register(kv, first, h, LOOM_KV_ROOT_HASH, toks));
		loom_kv_seq_release(kv, &a);
		loom_kv_seq_release(kv, &b);
		ck_assert_int_eq(loom_kv_cache_lookup(kv, h, LOOM_KV_ROOT_HASH, toks), first);
		ck_assert_int_eq(loom_kv_seq_append_cached(kv, &c, first), 0);
		ck_assert_int_eq(c.n_tokens, 16);
		/* writing past the cached block leaves it as it was */
		ck_assert_int_eq(loom_kv_reserve(kv, &c, 1), 0);
		ck_assert_int_ne(c.blocks[1], first);
		write_rows(kv, &c, 16, 17);
		ck_assert_int_eq(loom_kv_cache_lookup(kv, h, LOOM_KV_ROOT_HASH, toks), first);
		loom_kv_seq_release(kv, &c);
		loom_kv_free(kv);
	}
}
END_TEST

/* ---- windowed layers: a pool of their own that keeps only the window ---- */

#define WBS 4   /* tokens per block */
#define WIN 8   /* window of layers 0 and 2 */
#define WLOCAL 8

static struct loom_kv *new_windowed(void)
{
	static const int32_t windows[3] = { WIN, 0, WIN };
	struct loom_kv_config c = { .n_layer = 3, .kv_dim = 8, .block_size = WBS,
		.n_blocks = 64, .windows = windows, .n_local_blocks = WLOCAL };
	char err[256];
	struct loom_kv *kv = loom_kv_new_config(be, &c, err, sizeof(err));

	ck_assert_msg(kv != NULL, "%s", err);
	ck_assert_ptr_nonnull(kv->local);
	return kv;
}

/* Reserves n tokens as the scheduler does (slide first) and writes them. */
static void grow(struct loom_kv *kv, struct loom_kv_seq *s, int32_t n)
{
	loom_kv_slide(kv, s);
	ck_assert_int_eq(loom_kv_reserve(kv, s, n), 0);
	s->n_tokens += n;
}

/* Every table entry below n_dropped is -1 and every other one held. */
static void check_table(const struct loom_kv *kv, const struct loom_kv_seq *s)
{
	const struct loom_kv_seq *ls = s->local;

	ck_assert_int_eq(ls->n_blocks, s->n_blocks);
	for (int32_t j = 0; j < ls->n_blocks; j++) {
		if (j < ls->n_dropped)
			ck_assert_int_eq(ls->blocks[j], -1);
		else
			ck_assert_int_gt(kv->local->refs[ls->blocks[j]], 0);
	}
}

START_TEST(windowed_layers_have_their_own_pool)
{
	struct loom_kv *kv = new_windowed();
	size_t layer = WLOCAL * WBS * 8 * sizeof(float);

	ck_assert_int_eq(kv->n_layer, 1);
	ck_assert_int_eq(kv->local->n_layer, 2);
	ck_assert_int_eq(kv->local->window, WIN);
	ck_assert(loom_kv_windowed(kv, 0) && !loom_kv_windowed(kv, 1) && loom_kv_windowed(kv, 2));
	ck_assert_ptr_eq(loom_kv_k(kv, 1), kv->base);
	ck_assert_ptr_eq(loom_kv_k(kv, 0), kv->local->base);
	ck_assert_ptr_eq((char *)loom_kv_v(kv, 2), kv->local->base + 3 * layer);
	ck_assert_uint_eq(loom_kv_total_bytes(kv),
			  loom_kv_bytes(1, 8, WBS, 64) + loom_kv_bytes(2, 8, WBS, WLOCAL));
	loom_kv_free(kv);
}
END_TEST

START_TEST(uniform_windows_make_one_pool)
{
	static const int32_t all[2] = { WIN, WIN }, none[2] = { 0, 0 };
	struct loom_kv_config c = { .n_layer = 2, .kv_dim = 8, .block_size = WBS,
		.n_blocks = 16, .windows = all, .n_local_blocks = 4 };
	char err[256];
	struct loom_kv *kv = loom_kv_new_config(be, &c, err, sizeof(err));
	int32_t w;

	/* every layer windowed: nothing to split from, all full-context */
	ck_assert_ptr_nonnull(kv);
	ck_assert_ptr_null(kv->local);
	ck_assert_int_eq(kv->n_layer, 2);
	loom_kv_free(kv);
	ck_assert_int_eq(loom_kv_split(none, 2, &w), 0);
	ck_assert_int_eq(loom_kv_split(all, 2, &w), 0);
	ck_assert_int_eq(loom_kv_split((const int32_t[]){ 5, 0, 9 }, 3, &w), 2);
	ck_assert_int_eq(w, 9);
}
END_TEST

START_TEST(windowed_blocks_stay_bounded)
{
	struct loom_kv *kv = new_windowed();
	struct loom_kv_seq a = { 0 };
	int64_t bound = loom_kv_window_blocks(WIN, WBS, 1);

	ck_assert_int_eq(bound, 3);
	for (int32_t t = 0; t < 10 * WIN; t++) { /* decode through ten windows */
		grow(kv, &a, 1);
		check_table(kv, &a);
		ck_assert_int_le(loom_kv_n_held(kv->local), bound);
		/* every position a query at t reads is held */
		for (int32_t p = t - WIN + 1 > 0 ? t - WIN + 1 : 0; p <= t; p++)
			ck_assert_int_ge(a.local->blocks[p / WBS], 0);
	}
	ck_assert_int_eq(a.n_blocks, 10 * WIN / WBS);
	ck_assert_int_eq(loom_kv_n_held(kv), 10 * WIN / WBS); /* full context */
	ck_assert_int_le(kv->local->n_held_peak, bound);
	/* prompt chunks of 10: a window and a chunk */
	for (int32_t t = 0; t < 10; t++) {
		grow(kv, &a, 10);
		check_table(kv, &a);
		ck_assert_int_le(loom_kv_n_held(kv->local), loom_kv_window_blocks(WIN, WBS, 10));
	}
	loom_kv_seq_release(kv, &a);
	ck_assert_int_eq(kv->n_free, 64);
	ck_assert_int_eq(kv->local->n_free, WLOCAL);
	loom_kv_free(kv);
}
END_TEST

START_TEST(windowed_pool_full_changes_nothing)
{
	struct loom_kv *kv = new_windowed();
	struct loom_kv_seq a = { 0 }, b = { 0 };

	grow(kv, &a, 6 * WBS); /* 6 of the 8 windowed blocks: none slid yet */
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 3 * WBS), LOOM_ERR_FULL);
	ck_assert_int_eq(b.n_blocks, 0);
	ck_assert_int_eq(kv->n_free, 64 - 6); /* the full-context pool untouched */
	loom_kv_slide(kv, &a); /* 24 tokens: blocks 0..3 lie behind the window */
	ck_assert_int_eq(a.local->n_dropped, (6 * WBS - WIN + 1) / WBS);
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 3 * WBS), 0);
	loom_kv_seq_release(kv, &a);
	loom_kv_seq_release(kv, &b);
	ck_assert_int_eq(kv->local->n_free, WLOCAL);
	loom_kv_free(kv);
}
END_TEST

START_TEST(windowed_fork_shares_and_copies)
{
	struct loom_kv *kv = new_windowed();
	struct loom_kv_seq a = { 0 }, b = { 0 };
	int32_t held;

	grow(kv, &a, 30); /* 7.5 blocks */
	loom_kv_slide(kv, &a);
	held = (int32_t)loom_kv_n_held(kv->local);
	ck_assert_int_eq(loom_kv_fork(kv, &b, &a), 0);
	ck_assert_int_eq(b.n_tokens, 30);
	ck_assert_int_eq(b.local->n_dropped, a.local->n_dropped);
	check_table(kv, &b);
	for (int32_t j = a.local->n_dropped; j < a.local->n_blocks; j++)
		ck_assert_int_eq(kv->local->refs[a.local->blocks[j]], 2);
	ck_assert_int_eq(loom_kv_n_held(kv->local), held); /* a fork takes nothing */
	/* writing into the shared half block copies it in both pools */
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 1), 0);
	ck_assert_uint_eq(kv->n_copies, 1);
	ck_assert_uint_eq(kv->local->n_copies, 1);
	ck_assert_int_ne(b.local->blocks[7], a.local->blocks[7]);
	b.n_tokens++;
	for (int32_t t = 0; t < 3 * WIN; t++)
		grow(kv, &b, 1);
	check_table(kv, &a);
	check_table(kv, &b);
	loom_kv_seq_release(kv, &b);
	check_table(kv, &a);
	loom_kv_seq_release(kv, &a);
	ck_assert_int_eq(kv->n_free, 64);
	ck_assert_int_eq(kv->local->n_free + kv->local->n_lru, WLOCAL);
	loom_kv_free(kv);
}
END_TEST

START_TEST(truncating_behind_the_window_drops_all)
{
	struct loom_kv *kv = new_windowed();
	struct loom_kv_seq a = { 0 };

	for (int32_t j = 0; j < 10; j++)
		grow(kv, &a, WBS); /* 40 tokens do not fit at once: 8 blocks */
	loom_kv_slide(kv, &a); /* keeps positions 33.. : blocks 8, 9 */
	ck_assert_int_eq(a.local->n_dropped, 8);
	loom_kv_truncate(kv, &a, 39); /* a query at 39 reads 32..39: held */
	ck_assert_int_eq(a.n_tokens, 39);
	ck_assert_int_eq(a.local->n_dropped, 8);
	loom_kv_truncate(kv, &a, 38); /* reads 31..: block 7 is gone */
	ck_assert_int_eq(a.n_tokens, 0);
	ck_assert_int_eq(a.n_blocks, 0);
	ck_assert_int_eq(a.local->n_blocks, 0);
	ck_assert_int_eq(kv->n_free, 64);
	ck_assert_int_eq(kv->local->n_free, WLOCAL);
	loom_kv_seq_release(kv, &a);
	loom_kv_free(kv);
}
END_TEST

/* Chain hashes of the n full blocks of tokens. */
static void hash_blocks(const int32_t *tokens, int32_t n, uint64_t *h)
{
	for (int32_t j = 0; j < n; j++)
		h[j] = loom_kv_block_hash(j ? h[j - 1] : LOOM_KV_ROOT_HASH, tokens + j * WBS, WBS);
}

/* Prefills tokens in chunks of `chunk`, registering full blocks as the
 * scheduler does after each step. */
static void prefill_registered(struct loom_kv *kv, struct loom_kv_seq *s, const int32_t *tokens,
			       int32_t n, int32_t chunk, const uint64_t *h)
{
	int32_t reg = 0;

	for (int32_t t = 0; t < n; t += chunk) {
		grow(kv, s, n - t < chunk ? n - t : chunk);
		for (; reg < s->n_tokens / WBS; reg++)
			loom_kv_cache_register_seq(kv, s, reg, h[reg],
						   reg ? h[reg - 1] : LOOM_KV_ROOT_HASH,
						   tokens + reg * WBS);
	}
}

START_TEST(windowed_prefix_cache_needs_the_window)
{
	struct loom_kv *kv = new_windowed();
	struct loom_kv_seq a = { 0 }, b = { 0 };
	int32_t tok[40], other[40];
	uint64_t h[10], ho[10];

	for (int32_t i = 0; i < 40; i++) {
		tok[i] = i + 1;
		other[i] = i < 2 * WBS ? i + 1 : 1000 + i; /* shares 2 blocks */
	}
	hash_blocks(tok, 10, h);
	hash_blocks(other, 10, ho);
	prefill_registered(kv, &a, tok, 40, WBS, h);
	/* 10 windowed blocks through a pool of 8: blocks 0 and 1 were evicted */
	ck_assert_int_lt(loom_kv_cache_lookup(kv->local, h[0], LOOM_KV_ROOT_HASH, tok), 0);
	ck_assert_int_ge(loom_kv_cache_lookup(kv->local, h[9], h[8], tok + 36), 0);
	loom_kv_seq_release(kv, &a); /* preempted, say */
	/* the whole prompt: the last token is recomputed at 39, which reads
	 * 32..38, blocks 8 and 9: cached */
	ck_assert_int_eq(loom_kv_share_prefix(kv, &b, h, tok, 10, 39), 10);
	ck_assert_int_eq(b.n_tokens, 39);
	ck_assert_int_eq(b.n_blocks, 10);
	ck_assert_int_eq(b.local->n_dropped, 8);
	check_table(kv, &b);
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 1), 0); /* copy-on-write of block 9 */
	ck_assert_uint_eq(kv->local->n_copies, 1);
	loom_kv_seq_release(kv, &b);
	/* a prompt sharing 2 blocks: resuming at 8 reads 1..7, block 0 is
	 * gone from the windowed pool, and at 4 too: nothing is shared */
	ck_assert_int_ge(loom_kv_cache_lookup(kv, ho[1], ho[0], other + WBS), 0);
	ck_assert_int_eq(loom_kv_share_prefix(kv, &b, ho, other, 10, 39), 0);
	ck_assert_int_eq(b.n_blocks, 0);
	ck_assert_int_eq(loom_kv_n_held(kv), 0);
	ck_assert_int_eq(loom_kv_n_held(kv->local), 0);
	/* appending cached blocks one at a time would skip the windowed pool */
	ck_assert_int_eq(loom_kv_seq_append_cached(kv, &b, loom_kv_cache_lookup(kv, h[0],
			 LOOM_KV_ROOT_HASH, tok)), LOOM_ERR_INVALID);
	loom_kv_seq_release(kv, &b);
	loom_kv_free(kv);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv");
	TCase *tc = tcase_create("blocks");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, reserve_and_release);
	tcase_add_test(tc, layer_addresses_do_not_overlap);
	tcase_add_test(tc, size_overflow_is_refused);
	tcase_add_test(tc, quantized_sizes);
	tcase_add_test(tc, quantized_copy_on_write_and_prefix);
	tcase_add_test(tc, windowed_layers_have_their_own_pool);
	tcase_add_test(tc, uniform_windows_make_one_pool);
	tcase_add_test(tc, windowed_blocks_stay_bounded);
	tcase_add_test(tc, windowed_pool_full_changes_nothing);
	tcase_add_test(tc, windowed_fork_shares_and_copies);
	tcase_add_test(tc, truncating_behind_the_window_drops_all);
	tcase_add_test(tc, windowed_prefix_cache_needs_the_window);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
