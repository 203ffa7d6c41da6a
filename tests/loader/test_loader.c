/* Tests for core/plugin/backend_loader.c: every refusal names the file and the
 * reason, refused backends never get create() called, a good one loads,
 * bare names resolve through $LOOM_BACKEND_PATH, and quant plugins are
 * checked the same way. The shared objects come from fake_backend.c and
 * fake_quant.c, built by meson.build in this folder; argv[1] is that
 * build folder. */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin/backend_loader.h"

static const char *mod_dir;

static void mod_path(char *out, size_t cap, const char *file)
{
	int n = snprintf(out, cap, "%s/%s", mod_dir, file);

	ck_assert(n > 0 && (size_t)n < cap);
}

/* ---- create() log: which fake backends had create() called ---- */

static char create_log[4096];

static void create_log_reset(void)
{
	int n = snprintf(create_log, sizeof(create_log), "%s/create-%ld.log",
			 mod_dir, (long)getpid());

	ck_assert(n > 0 && (size_t)n < sizeof(create_log));
	unlink(create_log);
	ck_assert_int_eq(setenv("LOOM_TEST_CREATE_LOG", create_log, 1), 0);
}

static void create_log_remove(void)
{
	if (create_log[0])
		unlink(create_log);
}

/* Whether create() of the backend tagged `tag` ran since the reset. */
static bool create_called(const char *tag)
{
	char line[256];
	bool found = false;
	FILE *f = fopen(create_log, "r");

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		found |= strcmp(line, tag) == 0;
	}
	fclose(f);
	return found;
}

static void write_file(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");

	ck_assert_msg(f != NULL, "cannot write %s", path);
	ck_assert_uint_eq(fwrite(data, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
}

static const struct loom_backend_config cfg0 = {
	.struct_size = sizeof(struct loom_backend_config),
	.device = 0,
	.n_threads = 1,
};

/* Opens path, expects a refusal whose message holds path and `reason`,
 * and returns the message for further checks. */
static const char *expect_refusal(const char *path, const char *reason)
{
	static char err[8192];
	struct loom_backend *b;

	err[0] = '\0';
	b = loom_backend_open(path, &cfg0, err, sizeof(err));
	ck_assert_msg(b == NULL, "%s loaded; it should have been refused", path);
	ck_assert_msg(strstr(err, path) != NULL, "'%s' does not name %s", err, path);
	ck_assert_msg(strstr(err, reason) != NULL, "'%s' does not say '%s'", err,
		      reason);
	return err;
}

/* ---- refusals of real .so files ---- */

START_TEST(refuses_missing_entry)
{
	char p[4096];

	create_log_reset();
	mod_path(p, sizeof(p), "no_entry.so");
	expect_refusal(p, LOOM_BACKEND_ENTRY);
}
END_TEST

START_TEST(refuses_null_table)
{
	char p[4096];

	create_log_reset();
	mod_path(p, sizeof(p), "null_table.so");
	expect_refusal(p, "table");
}
END_TEST

START_TEST(refuses_abi_major)
{
	char p[4096];
	char needs[64];
	const char *err;

	/* The message gives the backend's major and ours. */
	snprintf(needs, sizeof(needs), "%d", LOOM_BACKEND_ABI_MAJOR);
	create_log_reset();
	mod_path(p, sizeof(p), "abi0.so");
	err = expect_refusal(p, "ABI major 0");
	ck_assert_ptr_nonnull(strstr(strstr(err, "ABI major 0") + 11, needs));
	mod_path(p, sizeof(p), "abi2.so");
	err = expect_refusal(p, "ABI major 2");
	ck_assert_ptr_nonnull(strstr(strstr(err, "ABI major 2") + 11, needs));
	/* Probing is pure: neither create() ran. */
	ck_assert(!create_called("abi0"));
	ck_assert(!create_called("abi2"));
}
END_TEST

START_TEST(refuses_small_table)
{
	char p[4096], size[32];

	/* The fake's table stops just before `attention`. */
	snprintf(size, sizeof(size), "%zu",
		 offsetof(struct loom_backend_ops, attention));
	create_log_reset();
	mod_path(p, sizeof(p), "small_table.so");
	expect_refusal(p, size);
	ck_assert(!create_called("small_table"));
}
END_TEST

START_TEST(refuses_missing_required_slot)
{
	char p[4096];

	create_log_reset();
	mod_path(p, sizeof(p), "no_attention.so");
	expect_refusal(p, "attention");
	ck_assert(!create_called("no_attention"));
}
END_TEST

START_TEST(refuses_when_create_fails)
{
	char p[4096];

	create_log_reset();
	mod_path(p, sizeof(p), "no_device.so");
	expect_refusal(p, "device");
	/* Here the table was fine, so create() did run, and failed. */
	ck_assert(create_called("no_device"));
}
END_TEST

START_TEST(refuses_non_elf)
{
	char p[4096];
	static const char text[] = "this is a text file, not a backend\n";

	mod_path(p, sizeof(p), "not_elf.so");
	write_file(p, text, sizeof(text) - 1);
	expect_refusal(p, "not an ELF");
	unlink(p);

	/* An empty file is no ELF either. */
	mod_path(p, sizeof(p), "empty.so");
	write_file(p, "", 0);
	expect_refusal(p, "not an ELF");
	unlink(p);
}
END_TEST

START_TEST(refuses_truncated_elf)
{
	char p[4096];
	unsigned char junk[64] = { 0x7f, 'E', 'L', 'F', 2, 1, 1 };

	/* ELF magic but no valid object behind it: dlopen fails, and the
	 * message still names the file. */
	mod_path(p, sizeof(p), "truncated.so");
	write_file(p, junk, sizeof(junk));
	expect_refusal(p, "");
	unlink(p);
}
END_TEST

START_TEST(refuses_missing_path)
{
	char p[4096];

	mod_path(p, sizeof(p), "does_not_exist.so");
	expect_refusal(p, "No such file");
}
END_TEST

/* ---- the good one ---- */

START_TEST(loads_good_backend)
{
	char p[4096], err[4096] = "";
	struct loom_backend_config cfg = cfg0;
	struct loom_device_info info;
	struct loom_backend *b;

	create_log_reset();
	mod_path(p, sizeof(p), "good.so");
	cfg.device = 3;
	b = loom_backend_open(p, &cfg, err, sizeof(err));
	ck_assert_msg(b != NULL, "good.so refused: %s", err);
	ck_assert(create_called("good"));
	ck_assert_str_eq(b->ops->name, "good");
	ck_assert_str_eq(b->path, p);
	ck_assert_ptr_nonnull(b->ctx);
	/* The config reached create(): the fake reports its device index. */
	ck_assert_int_eq(b->ops->device_info(b->ctx, &info), LOOM_OK);
	ck_assert_str_eq(info.name, "fake device 3");
	loom_backend_close(b);
}
END_TEST

/* ---- name resolution ---- */

START_TEST(bare_name_through_env)
{
	char want[4096], list[8192], err[4096] = "", got[4096];
	struct loom_backend *b;

	mod_path(want, sizeof(want), "good.so");
	snprintf(list, sizeof(list), "/nonexistent-loom-dir::%s", mod_dir);
	ck_assert_int_eq(setenv("LOOM_BACKEND_PATH", list, 1), 0);
	ck_assert_int_eq(loom_backend_resolve("good.so", got, sizeof(got), err,
					      sizeof(err)), 0);
	ck_assert_str_eq(got, want);
	b = loom_backend_open("good.so", &cfg0, err, sizeof(err));
	ck_assert_msg(b != NULL, "good.so via LOOM_BACKEND_PATH: %s", err);
	ck_assert_str_eq(b->path, want);
	loom_backend_close(b);

	/* A bare name resolved through the list is still checked, and the
	 * refusal names the file found. */
	mod_path(want, sizeof(want), "abi2.so");
	ck_assert_ptr_nonnull(strstr(expect_refusal("abi2.so", "ABI major 2"),
				     want));

	/* Unknown bare names are refused by name. */
	err[0] = '\0';
	ck_assert_ptr_null(loom_backend_open("nope.so", &cfg0, err, sizeof(err)));
	ck_assert_msg(strstr(err, "nope.so") != NULL, "'%s'", err);
	ck_assert_int_eq(loom_backend_resolve("nope.so", got, sizeof(got), err,
					      sizeof(err)), -1);

	/* Without the list entry, the test folder is not searched. */
	ck_assert_int_eq(setenv("LOOM_BACKEND_PATH", "", 1), 0);
	ck_assert_int_eq(loom_backend_resolve("good.so", got, sizeof(got), err,
					      sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "good.so"));
}
END_TEST

START_TEST(empty_name)
{
	char err[256] = "";

	ck_assert_ptr_null(loom_backend_open("", &cfg0, err, sizeof(err)));
	ck_assert(err[0] != '\0');
}
END_TEST

/* ---- loom_backend_check_ops on tables built here ---- */

#define SLOT(s) { #s, offsetof(struct loom_backend_ops, s) }

/* The required slots, as include/loom/backend.h marks them. */
static const struct {
	const char *name;
	size_t off;
} required[] = {
	SLOT(create), SLOT(destroy), SLOT(device_info), SLOT(supports),
	SLOT(buffer_alloc), SLOT(upload), SLOT(download), SLOT(copy),
	SLOT(synchronize), SLOT(gemm), SLOT(embed), SLOT(rmsnorm), SLOT(rope),
	SLOT(glu), SLOT(add), SLOT(scale), SLOT(kv_write), SLOT(attention),
};

static int fake_graph_begin(struct loom_backend_ctx *ctx)
{
	(void)ctx;
	return LOOM_OK;
}

START_TEST(check_ops_names_each_slot)
{
	char p[4096], err[4096] = "";
	struct loom_backend *b;
	struct loom_backend_ops ops;

	/* Start from the good backend's complete table. */
	mod_path(p, sizeof(p), "good.so");
	b = loom_backend_open(p, &cfg0, err, sizeof(err));
	ck_assert_msg(b != NULL, "%s", err);
	ops = *b->ops;
	ck_assert_int_eq(loom_backend_check_ops("t.so", &ops, err, sizeof(err)), 0);

	for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
		struct loom_backend_ops t = ops;

		memset((char *)&t + required[i].off, 0, sizeof(void *));
		err[0] = '\0';
		ck_assert_int_eq(loom_backend_check_ops("t.so", &t, err,
							sizeof(err)), -1);
		ck_assert_msg(strstr(err, required[i].name) && strstr(err, "t.so"),
			      "slot %s: '%s'", required[i].name, err);
	}

	/* A newer minor and a larger table (slots appended later) load. */
	ops.abi_minor = 7;
	ops.struct_size = sizeof(ops) + 64;
	ck_assert_int_eq(loom_backend_check_ops("t.so", &ops, err, sizeof(err)), 0);
	/* Generation 1.1's step regions come as a pair. */
	ops.struct_size = sizeof(ops);
	ops.graph_begin = fake_graph_begin;
	ops.graph_end = NULL;
	ck_assert_int_eq(loom_backend_check_ops("t.so", &ops, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "graph_end"), "'%s'", err);
	/* a 1.0-sized table never has its slots read */
	ops.struct_size = offsetof(struct loom_backend_ops, graph_begin);
	ck_assert_int_eq(loom_backend_check_ops("t.so", &ops, err, sizeof(err)), 0);
	ops.graph_begin = NULL;
	ops.struct_size = 8;
	ck_assert_int_eq(loom_backend_check_ops("t.so", &ops, err, sizeof(err)), -1);
	ck_assert_int_eq(loom_backend_check_ops("t.so", NULL, err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "t.so"));
	loom_backend_close(b);
}
END_TEST

/* ---- quantization plugins ---- */

#define FAKE_QUANT_TYPE 39

START_TEST(quant_plugin_refusals)
{
	char p[4096], err[4096];

	mod_path(p, sizeof(p), "quant_abi2.so");
	err[0] = '\0';
	ck_assert_int_eq(loom_formats_load_plugin(p, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, p) && strstr(err, "ABI major 2"), "'%s'", err);
	ck_assert_ptr_null(loom_format_get(FAKE_QUANT_TYPE));

	mod_path(p, sizeof(p), "quant_incomplete.so");
	err[0] = '\0';
	ck_assert_int_eq(loom_formats_load_plugin(p, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, p) != NULL, "'%s'", err);
	ck_assert_ptr_null(loom_format_get(FAKE_QUANT_TYPE));

	/* A backend is no quant plugin: no loom_quant_entry. */
	mod_path(p, sizeof(p), "good.so");
	err[0] = '\0';
	ck_assert_int_eq(loom_formats_load_plugin(p, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, p) && strstr(err, LOOM_QUANT_ENTRY), "'%s'", err);

	mod_path(p, sizeof(p), "missing_quant.so");
	err[0] = '\0';
	ck_assert_int_eq(loom_formats_load_plugin(p, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, p) && strstr(err, "No such file"), "'%s'", err);
}
END_TEST

START_TEST(quant_plugin_loads)
{
	char p[4096], err[4096] = "";
	const struct loom_quant_format *f;
	const float src[3] = { 1.5f, -2.0f, 0.25f };
	float dst[3];

	mod_path(p, sizeof(p), "quant_good.so");
	ck_assert_msg(loom_formats_load_plugin(p, err, sizeof(err)) == 0, "%s", err);
	f = loom_format_get(FAKE_QUANT_TYPE);
	ck_assert_ptr_nonnull(f);
	ck_assert_str_eq(f->name, "fake32");
	ck_assert_int_eq(f->to_float(src, dst, 3), LOOM_OK);
	ck_assert_mem_eq(src, dst, sizeof(src));
	/* And the host lends it to backends through format_info. */
	const struct loom_backend_host *h = loom_host_services();
	const struct loom_format_info *fi = h->format_info(h->host, FAKE_QUANT_TYPE);
	ck_assert_ptr_nonnull(fi);
	ck_assert_uint_eq(fi->block_bytes, 4);
	ck_assert_ptr_null(loom_format_get(LOOM_TYPE_COUNT));
}
END_TEST

static Suite *loader_suite(void)
{
	Suite *s = suite_create("loader");
	TCase *tc = tcase_create("backend");
	TCase *tq = tcase_create("quant");

	tcase_add_checked_fixture(tc, NULL, create_log_remove);
	tcase_add_test(tc, refuses_missing_entry);
	tcase_add_test(tc, refuses_null_table);
	tcase_add_test(tc, refuses_abi_major);
	tcase_add_test(tc, refuses_small_table);
	tcase_add_test(tc, refuses_missing_required_slot);
	tcase_add_test(tc, refuses_when_create_fails);
	tcase_add_test(tc, refuses_non_elf);
	tcase_add_test(tc, refuses_truncated_elf);
	tcase_add_test(tc, refuses_missing_path);
	tcase_add_test(tc, loads_good_backend);
	tcase_add_test(tc, bare_name_through_env);
	tcase_add_test(tc, empty_name);
	tcase_add_test(tc, check_ops_names_each_slot);
	/* Each test runs in its own forked process (Check's default), so the
	 * global format registry starts empty in both quant tests. */
	tcase_add_test(tq, quant_plugin_refusals);
	tcase_add_test(tq, quant_plugin_loads);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, tq);
	return s;
}

int main(int argc, char **argv)
{
	SRunner *sr;
	int failed;

	mod_dir = argc > 1 ? argv[1] : getenv("LOOM_TEST_MODULE_DIR");
	if (!mod_dir) {
		fprintf(stderr, "usage: %s <folder with the fake .so files>\n", argv[0]);
		return EXIT_FAILURE;
	}
	sr = srunner_create(loader_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
