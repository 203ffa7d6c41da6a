/* Paged KV cache: block accounting, block tables, truncation, overflow;
 * the sliding-window layers' pool: bounded blocks, fork, copy-on-write,
 * truncation, the prefix cache, release (preemption). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/backend_loader.h"
#include "engine/kv.h"

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
