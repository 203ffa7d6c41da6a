/* Tests for the one plugin loader (core/plugin/loader.c) through its three
 * kinds: every refusal names the file and the reason, refused backends
 * never get create() called, a good one loads and is lent the host's
 * context, bare names resolve in the same order for every kind (the
 * kind's environment folders, then the build tree), and quant and spec
 * plugins are checked the same way. The shared objects come from fake_backend.c and
 * fake_quant.c, built by meson.build in this folder; argv[1] is that
 * build folder. */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/spec.h"
#include "loom_config.h"
#include "plugin/backend_loader.h"
#include "plugin/loader.h"

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

/* The last line fake_note_create wrote for `tag` ("tag host=..."). */
static bool create_note(const char *tag, char *line, size_t cap)
{
	char buf[512];
	size_t n = strlen(tag);
	bool found = false;
	FILE *f = fopen(create_log, "r");

	if (!f)
		return false;
	while (fgets(buf, sizeof(buf), f)) {
		buf[strcspn(buf, "\n")] = '\0';
		if (strncmp(buf, tag, n) == 0 && buf[n] == ' ') {
			snprintf(line, cap, "%s", buf);
			found = true;
		}
	}
	fclose(f);
	return found;
}

/* Whether create() of the backend tagged `tag` ran since the reset. */
static bool create_called(const char *tag)
{
	char line[512];

	return create_note(tag, line, sizeof(line));
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

static int fake_softcap(struct loom_backend_ctx *ctx, float *x, int64_t stride,
			int64_t rows, int64_t n, float cap)
{
	(void)ctx, (void)x, (void)stride, (void)rows, (void)n, (void)cap;
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
	ops.abi_minor = LOOM_BACKEND_ABI_MINOR + 1;
	ops.struct_size = sizeof(ops) + 64;
	ck_assert_int_eq(loom_backend_check_ops("t.so", &ops, err, sizeof(err)), 0);
	/* Generation 1.1's step regions come as a pair. */
	ops.struct_size = sizeof(ops);
	ops.graph_begin = fake_graph_begin;
	ops.graph_end = NULL;
	ck_assert_int_eq(loom_backend_check_ops("t.so", &ops, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "graph_end"), "'%s'", err);
	/* Generation 1.2's weight_pack is optional and read only where the
	 * table has it. */
	{
		struct loom_backend nb = { .ops = &ops };

		ops.graph_begin = ops.graph_end = NULL;
		ops.weight_pack = (void *)fake_graph_begin; /* never called */
		ops.struct_size = offsetof(struct loom_backend_ops, weight_pack);
		ck_assert_int_eq(loom_backend_check_ops("t.so", &ops, err, sizeof(err)), 0);
		ck_assert(!loom_backend_has_pack(&nb));
		ops.struct_size = sizeof(ops);
		ck_assert(loom_backend_has_pack(&nb));
		ops.weight_pack = NULL;
		ck_assert(!loom_backend_has_pack(&nb));
		ops.graph_begin = fake_graph_begin;
	}
	/* Generation 1.2's softcap is optional and read only where the
	 * table is large enough to have it */
	{
		struct loom_backend nb = *b;
		struct loom_backend_ops t = *b->ops;

		nb.ops = &t;
		t.softcap = fake_softcap;
		ck_assert(loom_backend_has_softcap(&nb));
		t.struct_size = offsetof(struct loom_backend_ops, softcap);
		ck_assert(!loom_backend_has_softcap(&nb));
		t.struct_size = sizeof(t);
		t.softcap = NULL;
		ck_assert(!loom_backend_has_softcap(&nb));
		ck_assert_int_eq(loom_backend_check_ops("t.so", &t, err, sizeof(err)), 0);
	}
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

/* A non-ELF file at p (mod_dir/name) for the refusal tests. */
static void write_not_elf(char *p, size_t cap, const char *name)
{
	static const char text[] = "this is a text file, not a plugin\n";

	mod_path(p, cap, name);
	write_file(p, text, sizeof(text) - 1);
}

START_TEST(quant_and_spec_refuse_non_elf)
{
	char p[4096], err[4096] = "";
	struct loom_spec_config c;

	write_not_elf(p, sizeof(p), "not_elf_quant.so");
	ck_assert_int_eq(loom_formats_load_plugin(p, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "quant plugin") && strstr(err, p) &&
		      strstr(err, "not an ELF shared object"), "'%s'", err);
	unlink(p);

	loom_spec_config_defaults(&c);
	write_not_elf(p, sizeof(p), "not_elf_spec.so");
	err[0] = '\0';
	ck_assert_ptr_null(loom_spec_kind_load(p, &c, 300, NULL, err, sizeof(err)));
	ck_assert_msg(strstr(err, "spec plugin") && strstr(err, p) &&
		      strstr(err, "not an ELF shared object"), "'%s'", err);
	unlink(p);
}
END_TEST

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

	/* wild pointers in the format table: refused before any call */
	mod_path(p, sizeof(p), "quant_wild_fn.so");
	err[0] = '\0';
	ck_assert_int_eq(loom_formats_load_plugin(p, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, p) && strstr(err, "outside the plugin"), "'%s'", err);
	ck_assert_ptr_null(loom_format_get(FAKE_QUANT_TYPE));

	mod_path(p, sizeof(p), "quant_many.so");
	err[0] = '\0';
	ck_assert_int_eq(loom_formats_load_plugin(p, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, p) && strstr(err, "run past"), "'%s'", err);
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

/* A plugin built at quant ABI 1.0 (smaller format entries, two of them)
 * loads, each format read at its own stride, none weighted. */
START_TEST(quant_plugin_abi_1_0_loads)
{
	char p[4096], err[4096] = "";
	const struct loom_quant_format *f, *g;
	const float src[2] = { 3.0f, -0.5f };
	float dst[2];

	mod_path(p, sizeof(p), "quant_v1_0.so");
	ck_assert_msg(loom_formats_load_plugin(p, err, sizeof(err)) == 0, "%s", err);
	f = loom_format_get(FAKE_QUANT_TYPE);
	g = loom_format_get(FAKE_QUANT_TYPE - 1);
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(g);
	ck_assert_str_eq(f->name, "fake32");
	ck_assert_str_eq(g->name, "fake32b");
	ck_assert_uint_lt(f->struct_size, sizeof(struct loom_quant_format));
	ck_assert_int_eq(g->to_float(src, dst, 2), LOOM_OK);
	ck_assert_mem_eq(src, dst, sizeof(src));
	ck_assert_int_eq(loom_format_has_weighted(f), 0);
	ck_assert_int_eq(loom_format_has_weighted(g), 0);
	/* today's plugins offer the weighted search */
	ck_assert_int_eq(loom_formats_init(err, sizeof(err)), 0);
	ck_assert_int_ne(loom_format_has_weighted(loom_format_get(LOOM_TYPE_Q4_K)), 0);
}
END_TEST

/* ---- the host lent to backends ---- */

/* Opens good.so, closes it, and checks its create() note. */
static void expect_create_note(const char *want)
{
	char p[4096], err[4096] = "", line[512];
	struct loom_backend *b;

	create_log_reset();
	mod_path(p, sizeof(p), "good.so");
	b = loom_backend_open(p, &cfg0, err, sizeof(err));
	ck_assert_msg(b != NULL, "%s", err);
	loom_backend_close(b);
	ck_assert(create_note("good", line, sizeof(line)));
	ck_assert_str_eq(line, want);
}

START_TEST(backend_gets_host_context)
{
	const struct loom_backend_host *h = loom_host_services();
	char p[4096], err[4096] = "", want[512];

	ck_assert_ptr_nonnull(h->host);
	/* Opening a backend loads no format plugin (fresh process: Check
	 * forks each test), and the backend is lent the host's context. */
	snprintf(want, sizeof(want), "good host=%p format=-", h->host);
	expect_create_note(want);
	ck_assert_ptr_null(loom_format_get(LOOM_TYPE_Q8_0));
	/* Through that context, the backend reaches the host's registry. */
	mod_path(p, sizeof(p), "quant_good.so");
	ck_assert_msg(loom_formats_load_plugin(p, err, sizeof(err)) == 0, "%s", err);
	snprintf(want, sizeof(want), "good host=%p format=fake32", h->host);
	expect_create_note(want);
}
END_TEST

/* ---- one resolve order for every kind ---- */

/* Makes folder mod_dir/name (out) holding a copy of src, or an empty
 * file, named file. */
static void folder_with(char *out, size_t cap, const char *name, const char *file,
			const char *src)
{
	char p[8192], buf[1 << 16];
	size_t n;
	FILE *in, *f;

	mod_path(out, cap, name);
	mkdir(out, 0755);
	snprintf(p, sizeof(p), "%s/%s", out, file);
	f = fopen(p, "wb");
	ck_assert_msg(f != NULL, "cannot write %s", p);
	in = src ? fopen(src, "rb") : NULL;
	ck_assert(!src || in);
	while (in && (n = fread(buf, 1, sizeof(buf), in)) > 0)
		ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
	if (in)
		fclose(in);
	ck_assert_int_eq(fclose(f), 0);
}

typedef int (*resolve_fn)(const char *name, char *path, size_t cap, char *err,
			  size_t errlen);

/* name resolves to `file` in the folders of $env in their order, then in
 * the user folder $XDG_DATA_HOME/loom/<dir>, then to build_file under the
 * build tree (this test runs from it); a path is taken as it is. */
static void check_order(const char *env, const char *dir, resolve_fn resolve,
			const char *name, const char *file, const char *build_file)
{
	char a[4096], b[4096], list[8192], got[4096], want[8192], err[4096] = "";
	char xdg[4096], user[4096], sub[256];

	folder_with(a, sizeof(a), "order_a", file, NULL);
	folder_with(b, sizeof(b), "order_b", file, NULL);
	snprintf(list, sizeof(list), "/nonexistent-loom-dir:%s:%s", a, b);
	ck_assert_int_eq(setenv(env, list, 1), 0);
	ck_assert_msg(resolve(name, got, sizeof(got), err, sizeof(err)) == 0, "%s", err);
	snprintf(want, sizeof(want), "%s/%s", a, file);
	ck_assert_str_eq(got, want);
	snprintf(list, sizeof(list), "%s:%s", b, a);
	ck_assert_int_eq(setenv(env, list, 1), 0);
	ck_assert_int_eq(resolve(name, got, sizeof(got), err, sizeof(err)), 0);
	snprintf(want, sizeof(want), "%s/%s", b, file);
	ck_assert_str_eq(got, want);

	/* the user folder comes after $env and before the build tree */
	snprintf(xdg, sizeof(xdg), "%s/order_xdg", mod_dir);
	mkdir(xdg, 0755);
	snprintf(user, sizeof(user), "%s/loom", xdg);
	mkdir(user, 0755);
	snprintf(sub, sizeof(sub), "order_xdg/loom/%s", dir);
	folder_with(user, sizeof(user), sub, file, NULL);
	ck_assert_int_eq(setenv("XDG_DATA_HOME", xdg, 1), 0);
	ck_assert_int_eq(resolve(name, got, sizeof(got), err, sizeof(err)), 0);
	snprintf(want, sizeof(want), "%s/%s", b, file);
	ck_assert_str_eq(got, want);
	ck_assert_int_eq(setenv(env, "", 1), 0);
	ck_assert_msg(resolve(name, got, sizeof(got), err, sizeof(err)) == 0, "%s", err);
	snprintf(want, sizeof(want), "%s/%s", user, file);
	ck_assert_str_eq(got, want);

	/* this test runs from the build tree: its folder is the built-in one */
	ck_assert(loom_plugin_in_build_tree());
	ck_assert_int_eq(setenv("XDG_DATA_HOME", "/nonexistent-loom-xdg", 1), 0);
	ck_assert_msg(resolve(name, got, sizeof(got), err, sizeof(err)) == 0, "%s", err);
	snprintf(want, sizeof(want), "%s%s", LOOM_BUILD_ROOT, build_file);
	ck_assert_str_eq(got, want);
	ck_assert_int_eq(resolve("no-such-plugin.so", got, sizeof(got), err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "no-such-plugin.so") && strstr(err, env) &&
		      strstr(err, "not found"), "'%s'", err);

	snprintf(want, sizeof(want), "%s/%s", a, file);
	ck_assert_int_eq(resolve(want, got, sizeof(got), err, sizeof(err)), 0);
	ck_assert_str_eq(got, want);
	snprintf(want, sizeof(want), "%s/none.so", a);
	ck_assert_int_eq(resolve(want, got, sizeof(got), err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, want) && strstr(err, "No such file"), "'%s'", err);
}

START_TEST(backend_resolve_order)
{
	check_order("LOOM_BACKEND_PATH", "backends", loom_backend_resolve, "ref.so", "ref.so",
		    "/backends/ref/ref.so");
}
END_TEST

START_TEST(spec_resolve_order)
{
	/* a bare strategy name gets ".so" */
	check_order("LOOM_SPEC_PATH", "spec", loom_spec_resolve, "ngram", "ngram.so",
		    "/plugins/spec/ngram.so");
}
END_TEST

START_TEST(quant_scan_adds_env_folders)
{
	char src[4096], dir[4096], err[4096] = "";

	/* The build tree's formats, then those of each $LOOM_QUANT_PATH folder. */
	mod_path(src, sizeof(src), "quant_good.so");
	folder_with(dir, sizeof(dir), "quant_env", "fake.so", src);
	ck_assert_int_eq(setenv("LOOM_QUANT_PATH", dir, 1), 0);
	ck_assert_msg(loom_formats_init(err, sizeof(err)) == 0, "%s", err);
	ck_assert_ptr_nonnull(loom_format_get(LOOM_TYPE_Q8_0));
	ck_assert_ptr_nonnull(loom_format_get(FAKE_QUANT_TYPE));
	ck_assert_str_eq(loom_format_get(FAKE_QUANT_TYPE)->name, "fake32");
}
END_TEST

START_TEST(quant_scan_refuses_bad_plugin)
{
	char dir[4096], err[4096] = "";

	folder_with(dir, sizeof(dir), "quant_bad", "bad.so", NULL);
	ck_assert_int_eq(setenv("LOOM_QUANT_PATH", dir, 1), 0);
	ck_assert_int_eq(loom_formats_init(err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, dir) && strstr(err, "bad.so") &&
		      strstr(err, "not an ELF shared object"), "'%s'", err);
}
END_TEST

static Suite *loader_suite(void)
{
	Suite *s = suite_create("loader");
	TCase *tc = tcase_create("backend");
	TCase *tq = tcase_create("quant");
	TCase *th = tcase_create("host");

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
	tcase_add_test(tq, quant_plugin_abi_1_0_loads);
	tcase_add_test(tq, quant_and_spec_refuse_non_elf);
	tcase_add_test(tq, quant_scan_adds_env_folders);
	tcase_add_test(tq, quant_scan_refuses_bad_plugin);
	tcase_add_checked_fixture(th, NULL, create_log_remove);
	tcase_add_test(th, backend_gets_host_context);
	tcase_add_test(th, backend_resolve_order);
	tcase_add_test(th, spec_resolve_order);
	suite_add_tcase(s, th);
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
