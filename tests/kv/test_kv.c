/* Paged KV cache: block accounting, block tables, truncation, overflow. */
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
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
