/* Paged KV cache: fork, copy-on-write, refcounts, the prefix cache's hash
 * chain and its LRU eviction order (reference backend, no model). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/backend_loader.h"
#include "engine/kv.h"

#define LAYERS 2
#define KV_DIM 4
#define BS 4

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

static struct loom_kv *new_kv(int64_t n_blocks)
{
	char err[256];
	struct loom_kv *kv = loom_kv_new(be, LAYERS, KV_DIM, BS, n_blocks, err, sizeof(err));

	ck_assert_msg(kv != NULL, "%s", err);
	return kv;
}

/* Whole cache (all layers, K and V) as host floats. */
static float *download_all(struct loom_kv *kv)
{
	size_t n = 2 * LAYERS * kv->layer_bytes;
	float *h = malloc(n);

	ck_assert_ptr_nonnull(h);
	ck_assert_int_eq(be->ops->download(be->ctx, h, kv->base, n), 0);
	return h;
}

/* Float i of the cache holds i + 1 (distinct everywhere). */
static void fill_pattern(struct loom_kv *kv)
{
	size_t n = 2 * LAYERS * kv->layer_bytes / sizeof(float), i;
	float *h = malloc(n * sizeof(float));

	ck_assert_ptr_nonnull(h);
	for (i = 0; i < n; i++)
		h[i] = (float)(i + 1);
	ck_assert_int_eq(be->ops->upload(be->ctx, kv->base, h, n * sizeof(float)), 0);
	free(h);
}

/* Floats of physical block b in layer l's K (kv = 0) or V (kv = 1). */
static const float *block_of(const struct loom_kv *kv, const float *all, int l, int v, int32_t b)
{
	size_t layer = kv->layer_bytes / sizeof(float);

	return all + (size_t)(2 * l + v) * layer + (size_t)b * BS * KV_DIM;
}

static bool same_block(const struct loom_kv *kv, const float *x, int32_t bx,
		       const float *y, int32_t by)
{
	for (int l = 0; l < LAYERS; l++)
		for (int v = 0; v < 2; v++)
			if (memcmp(block_of(kv, x, l, v, bx), block_of(kv, y, l, v, by),
				   BS * KV_DIM * sizeof(float)))
				return false;
	return true;
}

START_TEST(fork_then_write_copies_one_block)
{
	struct loom_kv *kv = new_kv(8);
	struct loom_kv_seq a = { 0 }, b = { 0 };
	float *before, *after, row[KV_DIM] = { -1, -2, -3, -4 };
	int32_t a0, a1;

	ck_assert_int_eq(loom_kv_reserve(kv, &a, 6), 0); /* 1.5 blocks */
	a.n_tokens = 6;
	a0 = a.blocks[0];
	a1 = a.blocks[1];
	fill_pattern(kv);
	before = download_all(kv);

	ck_assert_int_eq(loom_kv_fork(kv, &b, &a), 0);
	ck_assert_int_eq(b.n_tokens, 6);
	ck_assert_int_eq(b.n_blocks, 2);
	ck_assert_int_eq(kv->refs[a0], 2);
	ck_assert_int_eq(kv->refs[a1], 2);
	ck_assert_int_eq(kv->n_free, 6); /* fork allocates nothing */

	/* b writes position 6, inside the shared partial block 1 */
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 1), 0);
	ck_assert_uint_eq(kv->n_copies, 1);
	ck_assert_int_eq(kv->n_free, 5);
	ck_assert_int_eq(b.blocks[0], a0); /* full block still shared */
	ck_assert_int_ne(b.blocks[1], a1);
	ck_assert_int_eq(kv->refs[a0], 2);
	ck_assert_int_eq(kv->refs[a1], 1);
	ck_assert_int_eq(kv->refs[b.blocks[1]], 1);
	ck_assert_int_eq(be->ops->synchronize(be->ctx), 0);
	after = download_all(kv);
	ck_assert(same_block(kv, after, b.blocks[1], before, a1)); /* exact copy */
	free(after);

	/* the write itself lands in b's copy only, in every layer */
	for (int l = 0; l < LAYERS; l++) {
		char *k = loom_kv_k(kv, l), *v = loom_kv_v(kv, l);
		size_t off = (size_t)loom_kv_slot(kv, &b, 6) * sizeof(row);

		ck_assert_int_eq(be->ops->upload(be->ctx, k + off, row, sizeof(row)), 0);
		ck_assert_int_eq(be->ops->upload(be->ctx, v + off, row, sizeof(row)), 0);
	}
	after = download_all(kv);
	ck_assert(same_block(kv, after, a0, before, a0));
	ck_assert(same_block(kv, after, a1, before, a1));
	ck_assert(!same_block(kv, after, b.blocks[1], before, a1));
	ck_assert(memcmp(block_of(kv, after, 1, 1, b.blocks[1]) + 2 * KV_DIM, row,
			 sizeof(row)) == 0);

	/* a's block 1 is private again: a's next write copies nothing */
	ck_assert_int_eq(loom_kv_reserve(kv, &a, 1), 0);
	ck_assert_uint_eq(kv->n_copies, 1);
	ck_assert_int_eq(a.blocks[1], a1);

	loom_kv_seq_release(kv, &a);
	ck_assert_int_eq(kv->refs[a0], 1);
	ck_assert_int_eq(kv->n_free, 7 - 1);
	loom_kv_seq_release(kv, &b);
	ck_assert_int_eq(kv->n_free, 8);
	ck_assert_int_eq(kv->refs[a0], 0);
	free(before);
	free(after);
	loom_kv_free(kv);
}
END_TEST

START_TEST(fork_at_block_boundary_copies_nothing)
{
	struct loom_kv *kv = new_kv(8);
	struct loom_kv_seq a = { 0 }, b = { 0 };

	ck_assert_int_eq(loom_kv_reserve(kv, &a, 12), 0); /* reserve beyond what is written */
	a.n_tokens = 8;
	ck_assert_int_eq(loom_kv_fork(kv, &b, &a), 0);
	ck_assert_int_eq(b.n_blocks, 2); /* the unwritten third block is not shared */
	ck_assert_int_eq(kv->refs[a.blocks[2]], 1);
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 3), 0);
	ck_assert_uint_eq(kv->n_copies, 0);
	ck_assert_int_ne(b.blocks[2], a.blocks[2]);
	loom_kv_seq_release(kv, &a);
	loom_kv_seq_release(kv, &b);
	ck_assert_int_eq(kv->n_free, 8);
	loom_kv_free(kv);
}
END_TEST

START_TEST(cow_out_of_blocks_changes_nothing)
{
	struct loom_kv *kv = new_kv(2);
	struct loom_kv_seq a = { 0 }, b = { 0 };
	int32_t a1;

	ck_assert_int_eq(loom_kv_reserve(kv, &a, 6), 0);
	a.n_tokens = 6;
	a1 = a.blocks[1];
	ck_assert_int_eq(loom_kv_fork(kv, &b, &a), 0);
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 1), LOOM_ERR_FULL); /* the copy needs a block */
	ck_assert_int_eq(b.blocks[1], a1);
	ck_assert_int_eq(kv->refs[a1], 2);
	loom_kv_seq_release(kv, &b);
	loom_kv_seq_release(kv, &a);
	ck_assert_int_eq(kv->n_free, 2);
	loom_kv_free(kv);
}
END_TEST

/* Fills seq with n full blocks of tokens and registers them, chained. */
static void register_seq(struct loom_kv *kv, struct loom_kv_seq *s, const int32_t *tok, int n)
{
	uint64_t parent = LOOM_KV_ROOT_HASH;

	ck_assert_int_eq(loom_kv_reserve(kv, s, n * BS), 0);
	s->n_tokens = n * BS;
	for (int j = 0; j < n; j++) {
		uint64_t h = loom_kv_block_hash(parent, tok + j * BS, BS);

		ck_assert(loom_kv_cache_register(kv, s->blocks[j], h, parent, tok + j * BS));
		parent = h;
	}
}

/* Looks up block j of the chain tok[0 .. (j+1)*BS). */
static int32_t lookup(struct loom_kv *kv, const int32_t *tok, int j)
{
	uint64_t parent = LOOM_KV_ROOT_HASH, h = 0;

	for (int i = 0; i <= j; i++) {
		h = loom_kv_block_hash(parent, tok + i * BS, BS);
		if (i < j)
			parent = h;
	}
	return loom_kv_cache_lookup(kv, h, parent, tok + j * BS);
}

START_TEST(hash_chain_depends_on_prefix)
{
	struct loom_kv *kv = new_kv(8);
	struct loom_kv_seq a = { 0 };
	int32_t ta[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	int32_t tb[8] = { 9, 9, 9, 9, 5, 6, 7, 8 }; /* same second block, other prefix */
	int32_t tc[8] = { 1, 2, 3, 4, 5, 6, 7, 9 };
	uint64_t h0 = loom_kv_block_hash(LOOM_KV_ROOT_HASH, ta, BS);

	register_seq(kv, &a, ta, 2);
	ck_assert_int_eq(lookup(kv, ta, 0), a.blocks[0]);
	ck_assert_int_eq(lookup(kv, ta, 1), a.blocks[1]);
	ck_assert_int_eq(lookup(kv, tb, 1), -1);
	ck_assert_int_eq(lookup(kv, tc, 1), -1);
	/* a forged hash (right hash, other tokens) is not a hit */
	ck_assert_int_eq(loom_kv_cache_lookup(kv, h0, LOOM_KV_ROOT_HASH, tb), -1);
	/* the same hash cannot be registered twice */
	ck_assert(!loom_kv_cache_register(kv, a.blocks[1], h0, LOOM_KV_ROOT_HASH, ta));
	/* hashing looks at every token id and the seed */
	ck_assert_uint_ne(loom_kv_block_hash(1, ta, BS), loom_kv_block_hash(2, ta, BS));
	ck_assert_uint_ne(loom_kv_block_hash(1, ta, BS), loom_kv_block_hash(1, tc + 4, BS));
	loom_kv_seq_release(kv, &a);
	loom_kv_free(kv);
}
END_TEST

START_TEST(unreferenced_cached_blocks_evict_lru)
{
	struct loom_kv *kv = new_kv(4);
	struct loom_kv_seq x = { 0 }, y = { 0 }, t = { 0 }, z = { 0 };
	int32_t tx[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, ty[8] = { 11, 12, 13, 14, 15, 16, 17, 18 };
	int32_t x0, x1, y0, y1;

	register_seq(kv, &x, tx, 2);
	register_seq(kv, &y, ty, 2);
	x0 = x.blocks[0], x1 = x.blocks[1], y0 = y.blocks[0], y1 = y.blocks[1];
	ck_assert_int_eq(kv->n_free, 0);
	loom_kv_seq_release(kv, &x); /* parks x1, then x0 */
	loom_kv_seq_release(kv, &y); /* then y1, y0 */
	ck_assert_int_eq(kv->n_free, 0);
	ck_assert_int_eq(kv->n_lru, 4);
	ck_assert_int_eq(loom_kv_n_available(kv), 4);
	/* reuse x0: it leaves the LRU list, and goes back as the newest */
	ck_assert_int_eq(loom_kv_seq_append_cached(kv, &t, lookup(kv, tx, 0)), 0);
	ck_assert_int_eq(t.blocks[0], x0);
	ck_assert_int_eq(t.n_tokens, BS);
	ck_assert_int_eq(kv->n_lru, 3);
	loom_kv_seq_release(kv, &t);
	/* order now: x1, y1, y0, x0 */
	ck_assert_int_eq(loom_kv_reserve(kv, &z, 1), 0);
	ck_assert_int_eq(z.blocks[0], x1);
	ck_assert_int_eq(lookup(kv, tx, 1), -1);
	ck_assert_int_eq(lookup(kv, tx, 0), x0);
	z.n_tokens = BS;
	ck_assert_int_eq(loom_kv_reserve(kv, &z, 1), 0);
	ck_assert_int_eq(z.blocks[1], y1);
	ck_assert_int_eq(lookup(kv, ty, 0), y0);
	ck_assert_int_eq(lookup(kv, ty, 1), -1);
	z.n_tokens = 2 * BS;
	ck_assert_int_eq(loom_kv_reserve(kv, &z, BS), 0);
	ck_assert_int_eq(z.blocks[2], y0);
	ck_assert_int_eq(loom_kv_n_available(kv), 1);
	z.n_tokens = 3 * BS;
	ck_assert_int_eq(loom_kv_reserve(kv, &z, 2 * BS), LOOM_ERR_FULL); /* needs 2, 1 is left */
	ck_assert_int_eq(z.n_blocks, 3);
	ck_assert_int_eq(lookup(kv, tx, 0), x0);
	loom_kv_seq_release(kv, &z); /* private blocks go to the free list */
	ck_assert_int_eq(kv->n_free, 3);
	ck_assert_int_eq(kv->n_lru, 1);
	loom_kv_free(kv);
}
END_TEST

START_TEST(writing_into_cached_block_copies_it)
{
	struct loom_kv *kv = new_kv(4);
	struct loom_kv_seq a = { 0 }, b = { 0 };
	int32_t t[4] = { 1, 2, 3, 4 }, b0;

	register_seq(kv, &a, t, 1);
	loom_kv_seq_release(kv, &a);
	b0 = lookup(kv, t, 0);
	ck_assert_int_ge(b0, 0);
	ck_assert_int_eq(loom_kv_seq_append_cached(kv, &b, b0), 0);
	b.n_tokens = BS - 1; /* recompute the last token, as the scheduler does */
	ck_assert_int_eq(loom_kv_reserve(kv, &b, 1), 0);
	ck_assert_uint_eq(kv->n_copies, 1);
	ck_assert_int_ne(b.blocks[0], b0);
	ck_assert_int_eq(lookup(kv, t, 0), b0); /* the cached block is intact */
	ck_assert_int_eq(kv->n_lru, 1);
	loom_kv_seq_release(kv, &b);
	loom_kv_free(kv);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv_cow");
	TCase *tc = tcase_create("blocks");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, fork_then_write_copies_one_block);
	tcase_add_test(tc, fork_at_block_boundary_copies_nothing);
	tcase_add_test(tc, cow_out_of_blocks_changes_nothing);
	tcase_add_test(tc, hash_chain_depends_on_prefix);
	tcase_add_test(tc, unreferenced_cached_blocks_evict_lru);
	tcase_add_test(tc, writing_into_cached_block_copies_it);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
