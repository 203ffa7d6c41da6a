/* Tests for core/format/gguf.c and core/format/info.c.
 *
 *   test_gguf          unit tests over GGUF files built in memory
 *   test_gguf model    checks against the real model ($LOOM_MODEL) and the
 *                      vocab-only files ($LOOM_SHARED_DIR/data/tokenizer);
 *                      exits 77 when neither is there.
 *
 * Expected figures for the real files come from the gguf Python package
 * (GGUFReader), not from this reader.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/info.h"

/* ---- a small GGUF writer ---- */

struct wbuf {
	uint8_t *p;
	size_t n, cap;
};

static void w_bytes(struct wbuf *w, const void *src, size_t n)
{
	if (w->n + n > w->cap) {
		w->cap = (w->n + n) * 2 + 64;
		w->p = realloc(w->p, w->cap);
		ck_assert_ptr_nonnull(w->p);
	}
	memcpy(w->p + w->n, src, n);
	w->n += n;
}

static void w_u8(struct wbuf *w, uint8_t v) { w_bytes(w, &v, 1); }
static void w_u16(struct wbuf *w, uint16_t v) { w_bytes(w, &v, 2); }
static void w_u32(struct wbuf *w, uint32_t v) { w_bytes(w, &v, 4); }
static void w_u64(struct wbuf *w, uint64_t v) { w_bytes(w, &v, 8); }
static void w_f32(struct wbuf *w, float v) { w_bytes(w, &v, 4); }
static void w_f64(struct wbuf *w, double v) { w_bytes(w, &v, 8); }

static void w_strn(struct wbuf *w, const char *s, size_t n)
{
	w_u64(w, n);
	w_bytes(w, s, n);
}

static void w_str(struct wbuf *w, const char *s) { w_strn(w, s, strlen(s)); }

static void w_header(struct wbuf *w, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	w_bytes(w, "GGUF", 4);
	w_u32(w, version);
	w_u64(w, n_tensors);
	w_u64(w, n_kv);
}

static void kv_u32(struct wbuf *w, const char *key, uint32_t v)
{
	w_str(w, key);
	w_u32(w, GGUF_U32);
	w_u32(w, v);
}

static void kv_str(struct wbuf *w, const char *key, const char *v)
{
	w_str(w, key);
	w_u32(w, GGUF_STRING);
	w_str(w, v);
}

static void kv_arr(struct wbuf *w, const char *key, uint32_t type, uint64_t n)
{
	w_str(w, key);
	w_u32(w, GGUF_ARRAY);
	w_u32(w, type);
	w_u64(w, n);
}

static void tensor_info(struct wbuf *w, const char *name, uint32_t n_dims,
			const uint64_t *ne, uint32_t type, uint64_t offset)
{
	w_str(w, name);
	w_u32(w, n_dims);
	for (uint32_t d = 0; d < n_dims; d++)
		w_u64(w, ne[d]);
	w_u32(w, type);
	w_u64(w, offset);
}

static void w_pad(struct wbuf *w, size_t align)
{
	while (w->n % align)
		w_u8(w, 0);
}

/* Data bytes follow a pattern so tests can tell where a tensor starts. */
static void w_data(struct wbuf *w, size_t n)
{
	for (size_t i = 0; i < n; i++)
		w_u8(w, (uint8_t)(i * 7 + 1));
}

/* ---- the valid reference file ---- */

static const uint8_t a_u8[] = { 1, 2, 255 };
static const int8_t a_i8[] = { -128, 0, 127 };
static const uint16_t a_u16[] = { 0, 65535 };
static const int16_t a_i16[] = { -32768, 32767, -1 };
static const uint32_t a_u32[] = { 7, 4000000000u };
static const int32_t a_i32[] = { -5, 2147483647, -2147483647 - 1 };
static const float a_f32[] = { 0.5f, -3.25f, 1e30f };
static const uint8_t a_bool[] = { 1, 0, 1, 1 };
static const char *const a_str[] = { "alpha", "", "\xe2\x96\x81gamma" };
static const uint64_t a_u64[] = { 0, UINT64_MAX };
static const int64_t a_i64[] = { INT64_MIN, -1, INT64_MAX };
static const double a_f64[] = { 3.141592653589793, -0.0 };

#define N(a) (sizeof(a) / sizeof((a)[0]))
#define N_KV 26
/* w0: q8_0 64x3 = 2 blocks * 34 bytes * 3 rows = 204 bytes at 0;
 * w1: f32 5 = 20 bytes at 224 (204 rounded up to 32). */
#define W0_BYTES 204
#define W1_OFFSET 224
#define W1_BYTES 20

static void put_fixed_arr(struct wbuf *w, const char *key, uint32_t type,
			  const void *v, size_t n, size_t esz)
{
	kv_arr(w, key, type, n);
	w_bytes(w, v, n * esz);
}

static void put_scalars(struct wbuf *w)
{
	w_str(w, "t.u8"); w_u32(w, GGUF_U8); w_u8(w, 200);
	w_str(w, "t.i8"); w_u32(w, GGUF_I8); w_u8(w, (uint8_t)-100);
	w_str(w, "t.u16"); w_u32(w, GGUF_U16); w_u16(w, 60000);
	w_str(w, "t.i16"); w_u32(w, GGUF_I16); w_u16(w, (uint16_t)-30000);
	kv_u32(w, "t.u32", 4000000000u);
	w_str(w, "t.i32"); w_u32(w, GGUF_I32); w_u32(w, (uint32_t)-2000000000);
	w_str(w, "t.f32"); w_u32(w, GGUF_F32); w_f32(w, 1.5f);
	w_str(w, "t.bool"); w_u32(w, GGUF_BOOL); w_u8(w, 1);
	kv_str(w, "t.str", "hello");
	w_str(w, "t.u64"); w_u32(w, GGUF_U64); w_u64(w, (1ull << 40) + 7);
	w_str(w, "t.i64"); w_u32(w, GGUF_I64); w_u64(w, (uint64_t)-(1ll << 40));
	w_str(w, "t.f64"); w_u32(w, GGUF_F64); w_f64(w, -2.25);
	w_str(w, "t.strnul"); w_u32(w, GGUF_STRING); w_strn(w, "a\0b", 3);
}

static void put_arrays(struct wbuf *w)
{
	put_fixed_arr(w, "a.u8", GGUF_U8, a_u8, N(a_u8), 1);
	put_fixed_arr(w, "a.i8", GGUF_I8, a_i8, N(a_i8), 1);
	put_fixed_arr(w, "a.u16", GGUF_U16, a_u16, N(a_u16), 2);
	put_fixed_arr(w, "a.i16", GGUF_I16, a_i16, N(a_i16), 2);
	put_fixed_arr(w, "a.u32", GGUF_U32, a_u32, N(a_u32), 4);
	put_fixed_arr(w, "a.i32", GGUF_I32, a_i32, N(a_i32), 4);
	put_fixed_arr(w, "a.f32", GGUF_F32, a_f32, N(a_f32), 4);
	put_fixed_arr(w, "a.bool", GGUF_BOOL, a_bool, N(a_bool), 1);
	kv_arr(w, "a.str", GGUF_STRING, N(a_str));
	for (size_t i = 0; i < N(a_str); i++)
		w_str(w, a_str[i]);
	put_fixed_arr(w, "a.u64", GGUF_U64, a_u64, N(a_u64), 8);
	put_fixed_arr(w, "a.i64", GGUF_I64, a_i64, N(a_i64), 8);
	put_fixed_arr(w, "a.f64", GGUF_F64, a_f64, N(a_f64), 8);
	kv_arr(w, "a.empty", GGUF_U32, 0);
}

static struct wbuf build_valid(uint32_t version)
{
	struct wbuf w = { 0 };
	const uint64_t ne0[] = { 64, 3 }, ne1[] = { 5 };

	w_header(&w, version, 2, N_KV);
	put_scalars(&w);
	put_arrays(&w);
	tensor_info(&w, "w0", 2, ne0, 8, 0);
	tensor_info(&w, "w1", 1, ne1, 0, W1_OFFSET);
	w_pad(&w, 32);
	w_data(&w, W1_OFFSET + W1_BYTES);
	return w;
}

/* A minimal file with given kvs/tensors written by the caller after the
 * header; finish() pads and appends `data` bytes. */
static void finish(struct wbuf *w, size_t align, size_t data)
{
	w_pad(w, align);
	w_data(w, data);
}

/* Opens from an exact-size heap copy, so any overread hits a redzone
 * under ASan/valgrind. */
static struct gguf_file *open_copy(const struct wbuf *w, size_t n, uint8_t **copy,
				   char *err, size_t errlen)
{
	*copy = malloc(n ? n : 1);
	ck_assert_ptr_nonnull(*copy);
	memcpy(*copy, w->p, n);
	return gguf_open_memory(*copy, n, err, errlen);
}

static void expect_fail(struct wbuf *w, const char *want1, const char *want2)
{
	char err[512] = "";
	uint8_t *copy;
	struct gguf_file *f = open_copy(w, w->n, &copy, err, sizeof(err));

	ck_assert_msg(f == NULL, "opened a broken file (expected '%s')", want1);
	ck_assert_msg(strstr(err, want1), "error '%s' lacks '%s'", err, want1);
	if (want2)
		ck_assert_msg(strstr(err, want2), "error '%s' lacks '%s'", err, want2);
	free(copy);
	free(w->p);
}

/* ---- round trip ---- */

static void check_scalars(const struct gguf_file *f)
{
	const struct gguf_kv *kv;

	kv = gguf_find(f, "t.u8");
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(kv->type, GGUF_U8);
	ck_assert_uint_eq(kv->v.u64, 200);
	ck_assert_int_eq(gguf_find(f, "t.i8")->v.i64, -100);
	ck_assert_uint_eq(gguf_find(f, "t.u16")->v.u64, 60000);
	ck_assert_int_eq(gguf_find(f, "t.i16")->v.i64, -30000);
	ck_assert_uint_eq(gguf_find(f, "t.u32")->v.u64, 4000000000u);
	ck_assert_int_eq(gguf_find(f, "t.i32")->v.i64, -2000000000);
	ck_assert(gguf_find(f, "t.f32")->v.f64 == 1.5);
	ck_assert_uint_eq(gguf_find(f, "t.bool")->v.u64, 1);
	kv = gguf_find(f, "t.str");
	ck_assert_uint_eq(kv->type, GGUF_STRING);
	ck_assert_uint_eq(kv->v.str.len, 5);
	ck_assert(memcmp(kv->v.str.ptr, "hello", 5) == 0);
	ck_assert_uint_eq(gguf_find(f, "t.u64")->v.u64, (1ull << 40) + 7);
	ck_assert_int_eq(gguf_find(f, "t.i64")->v.i64, -(1ll << 40));
	ck_assert(gguf_find(f, "t.f64")->v.f64 == -2.25);
	ck_assert_ptr_null(gguf_find(f, "t.missing"));
	ck_assert_ptr_null(gguf_find(f, "t.u"));
}

static void check_fixed_arr(const struct gguf_file *f, const char *key, uint32_t type,
			    const void *v, size_t n, size_t esz)
{
	const struct gguf_kv *kv = NULL;
	char err[256];

	ck_assert_int_eq(gguf_get_arr(f, key, type, &kv, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(kv->type, GGUF_ARRAY);
	ck_assert_uint_eq(kv->arr_type, type);
	ck_assert_uint_eq(kv->arr_n, n);
	ck_assert_msg(n == 0 || memcmp(kv->arr_data, v, n * esz) == 0, "%s differs", key);
}

static void check_arrays(const struct gguf_file *f)
{
	const struct gguf_kv *kv = NULL;
	char err[256];

	check_fixed_arr(f, "a.u8", GGUF_U8, a_u8, N(a_u8), 1);
	check_fixed_arr(f, "a.i8", GGUF_I8, a_i8, N(a_i8), 1);
	check_fixed_arr(f, "a.u16", GGUF_U16, a_u16, N(a_u16), 2);
	check_fixed_arr(f, "a.i16", GGUF_I16, a_i16, N(a_i16), 2);
	check_fixed_arr(f, "a.u32", GGUF_U32, a_u32, N(a_u32), 4);
	check_fixed_arr(f, "a.i32", GGUF_I32, a_i32, N(a_i32), 4);
	check_fixed_arr(f, "a.f32", GGUF_F32, a_f32, N(a_f32), 4);
	check_fixed_arr(f, "a.bool", GGUF_BOOL, a_bool, N(a_bool), 1);
	check_fixed_arr(f, "a.u64", GGUF_U64, a_u64, N(a_u64), 8);
	check_fixed_arr(f, "a.i64", GGUF_I64, a_i64, N(a_i64), 8);
	check_fixed_arr(f, "a.f64", GGUF_F64, a_f64, N(a_f64), 8);
	check_fixed_arr(f, "a.empty", GGUF_U32, NULL, 0, 4);
	ck_assert_int_eq(gguf_get_arr(f, "a.str", GGUF_STRING, &kv, err, sizeof(err)), 0);
	ck_assert_uint_eq(kv->arr_n, N(a_str));
	for (size_t i = 0; i < N(a_str); i++) {
		ck_assert_uint_eq(kv->arr_str[i].len, strlen(a_str[i]));
		ck_assert(memcmp(kv->arr_str[i].ptr, a_str[i], strlen(a_str[i])) == 0);
	}
}

static void check_tensors(const struct gguf_file *f)
{
	const struct gguf_tensor *t0 = gguf_find_tensor(f, "w0");
	const struct gguf_tensor *t1 = gguf_find_tensor(f, "w1");
	const uint8_t *d;

	ck_assert_uint_eq(f->n_tensors, 2);
	ck_assert_uint_eq(f->alignment, 32);
	ck_assert_uint_eq(f->data_offset % 32, 0);
	ck_assert_ptr_eq(t0, &f->tensors[0]);
	ck_assert_ptr_eq(t1, &f->tensors[1]);
	ck_assert_ptr_null(gguf_find_tensor(f, "w"));
	ck_assert_uint_eq(t0->n_dims, 2);
	ck_assert_int_eq(t0->ne[0], 64);
	ck_assert_int_eq(t0->ne[1], 3);
	ck_assert_int_eq(t0->ne[2], 1);
	ck_assert_int_eq(t0->ne[3], 1);
	ck_assert_uint_eq(t0->type, 8);
	ck_assert_uint_eq(t0->nbytes, W0_BYTES);
	ck_assert_uint_eq(t0->offset, 0);
	ck_assert_uint_eq(t1->n_dims, 1);
	ck_assert_int_eq(t1->ne[0], 5);
	ck_assert_uint_eq(t1->nbytes, W1_BYTES);
	ck_assert_uint_eq(t1->offset, W1_OFFSET);
	ck_assert_ptr_eq(t0->data, f->base + f->data_offset);
	d = t1->data;
	ck_assert_ptr_eq(d, f->base + f->data_offset + W1_OFFSET);
	ck_assert_uint_eq(d[0], (uint8_t)(W1_OFFSET * 7 + 1));
	ck_assert_uint_eq(f->data_offset + W1_OFFSET + W1_BYTES, f->size);
}

static void check_valid(const struct gguf_file *f, uint32_t version)
{
	ck_assert_uint_eq(f->version, version);
	ck_assert_uint_eq(f->n_kv, N_KV);
	check_scalars(f);
	check_arrays(f);
	check_tensors(f);
}

START_TEST(test_roundtrip)
{
	uint32_t version = _i ? 3 : 2;
	struct wbuf w = build_valid(version);
	char err[256] = "";
	uint8_t *copy;
	struct gguf_file *f = open_copy(&w, w.n, &copy, err, sizeof(err));

	ck_assert_msg(f != NULL, "open failed: %s", err);
	ck_assert(!f->mapped);
	check_valid(f, version);
	gguf_close(f);
	free(copy);
	free(w.p);
}
END_TEST

START_TEST(test_open_file)
{
	struct wbuf w = build_valid(3);
	char path[] = "/tmp/loom_gguf_testXXXXXX", err[512] = "";
	int fd = mkstemp(path);
	struct gguf_file *f;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, w.p, w.n), (ssize_t)w.n);
	close(fd);
	f = gguf_open(path, err, sizeof(err));
	ck_assert_msg(f != NULL, "open failed: %s", err);
	ck_assert(f->mapped);
	check_valid(f, 3);
	gguf_close(f);
	/* Empty file, missing file and a directory are refused by name. */
	ck_assert_int_eq(truncate(path, 0), 0);
	ck_assert_ptr_null(gguf_open(path, err, sizeof(err)));
	ck_assert_msg(strstr(err, path) && strstr(err, "empty"), "%s", err);
	unlink(path);
	ck_assert_ptr_null(gguf_open(path, err, sizeof(err)));
	ck_assert_msg(strstr(err, path), "%s", err);
	ck_assert_ptr_null(gguf_open("/tmp", err, sizeof(err)));
	ck_assert_msg(strstr(err, "regular"), "%s", err);
	free(w.p);
}
END_TEST

START_TEST(test_accessors)
{
	struct wbuf w = build_valid(3);
	char err[256];
	struct gguf_file *f = gguf_open_memory(w.p, w.n, err, sizeof(err));
	const struct gguf_kv *kv = NULL;
	uint32_t u = 12345;
	float x = 0;
	bool b = false;
	char *s = NULL;

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(gguf_get_u32(f, "t.u8", &u, err, sizeof(err)), 0);
	ck_assert_uint_eq(u, 200);
	ck_assert_int_eq(gguf_get_u32(f, "t.u32", &u, err, sizeof(err)), 0);
	ck_assert_uint_eq(u, 4000000000u);
	ck_assert_int_eq(gguf_get_u32(f, "t.i8", &u, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "'t.i8'") && strstr(err, "range"), "%s", err);
	ck_assert_int_eq(gguf_get_u32(f, "t.u64", &u, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "'t.u64'"), "%s", err);
	ck_assert_int_eq(gguf_get_u32(f, "t.str", &u, err, sizeof(err)), -1);
	ck_assert_str_eq(err, "key 't.str': string, expected an integer");
	u = 77;
	ck_assert_int_eq(gguf_get_u32(f, "nope", &u, err, sizeof(err)), 1);
	ck_assert_uint_eq(u, 77);
	ck_assert_int_eq(gguf_get_f32(f, "t.f32", &x, err, sizeof(err)), 0);
	ck_assert(x == 1.5f);
	ck_assert_int_eq(gguf_get_f32(f, "t.f64", &x, err, sizeof(err)), 0);
	ck_assert(x == -2.25f);
	ck_assert_int_eq(gguf_get_f32(f, "t.bool", &x, err, sizeof(err)), -1);
	ck_assert_int_eq(gguf_get_bool(f, "t.bool", &b, err, sizeof(err)), 0);
	ck_assert(b);
	ck_assert_int_eq(gguf_get_bool(f, "t.u8", &b, err, sizeof(err)), -1);
	ck_assert_int_eq(gguf_get_str(f, "t.str", &s, err, sizeof(err)), 0);
	ck_assert_str_eq(s, "hello");
	free(s);
	ck_assert_int_eq(gguf_get_str(f, "t.strnul", &s, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "'t.strnul'") && strstr(err, "NUL"), "%s", err);
	ck_assert_int_eq(gguf_get_str(f, "a.str", &s, err, sizeof(err)), -1);
	ck_assert_str_eq(err, "key 'a.str': array of string, expected string");
	ck_assert_int_eq(gguf_get_arr(f, "a.u32", GGUF_STRING, &kv, err, sizeof(err)), -1);
	ck_assert_str_eq(err, "key 'a.u32': array of u32, expected array of string");
	ck_assert_int_eq(gguf_get_arr(f, "t.u32", GGUF_U32, &kv, err, sizeof(err)), -1);
	ck_assert_str_eq(err, "key 't.u32': u32, expected array of u32");
	ck_assert_int_eq(gguf_get_arr(f, "nope", GGUF_U32, &kv, err, sizeof(err)), 1);
	gguf_close(f);
	free(w.p);
}
END_TEST

START_TEST(test_arr_mismatch_tokens)
{
	struct wbuf w = { 0 };
	const struct gguf_kv *kv = NULL;
	char err[256];
	struct gguf_file *f;

	w_header(&w, 3, 0, 1);
	kv_arr(&w, "tokenizer.ggml.tokens", GGUF_U32, 2);
	w_u32(&w, 1);
	w_u32(&w, 2);
	f = gguf_open_memory(w.p, w.n, err, sizeof(err));
	ck_assert_msg(f != NULL, "%s", err);
	ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &kv, err,
				      sizeof(err)), -1);
	ck_assert_str_eq(err, "key 'tokenizer.ggml.tokens': array of u32, expected array of string");
	ck_assert_ptr_null(kv);
	gguf_close(f);
	free(w.p);
}
END_TEST

START_TEST(test_type_geometry)
{
	/* Block layouts from ggml-common.h, counted by hand:
	 * q4_0 = f16 d + 16 nibble bytes; q8_0 = f16 d + 32; q4_K = 2 f16 +
	 * 12 scale bytes + 128; q6_K = 128 + 64 + 16 + f16. */
	static const struct { uint32_t type, be, bb; const char *name; } known[] = {
		{ 0, 1, 4, "f32" }, { 1, 1, 2, "f16" }, { 2, 32, 18, "q4_0" },
		{ 3, 32, 20, "q4_1" }, { 8, 32, 34, "q8_0" }, { 12, 256, 144, "q4_K" },
		{ 14, 256, 210, "q6_K" }, { 30, 1, 2, "bf16" },
	};
	uint32_t be, bb;

	for (size_t i = 0; i < N(known); i++) {
		ck_assert(gguf_type_geometry(known[i].type, &be, &bb));
		ck_assert_uint_eq(be, known[i].be);
		ck_assert_uint_eq(bb, known[i].bb);
		ck_assert_str_eq(gguf_type_name(known[i].type), known[i].name);
	}
	ck_assert(!gguf_type_geometry(4, &be, &bb));
	ck_assert(!gguf_type_geometry(40, &be, &bb));
	ck_assert(!gguf_type_geometry(UINT32_MAX, &be, &bb));
	ck_assert_str_eq(gguf_type_name(4), "?");
	ck_assert_str_eq(gguf_vtype_name(GGUF_STRING), "string");
	ck_assert_str_eq(gguf_vtype_name(99), "?");
}
END_TEST

START_TEST(test_alignment_ok)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 8 };
	char err[256];
	struct gguf_file *f;

	w_header(&w, 3, 2, 1);
	kv_u32(&w, "general.alignment", 64);
	tensor_info(&w, "a", 1, ne, 0, 0);
	tensor_info(&w, "b", 1, ne, 0, 64);
	finish(&w, 64, 96);
	f = gguf_open_memory(w.p, w.n, err, sizeof(err));
	ck_assert_msg(f != NULL, "%s", err);
	ck_assert_uint_eq(f->alignment, 64);
	ck_assert_uint_eq(f->data_offset % 64, 0);
	ck_assert_uint_eq(f->data_offset + 96, f->size);
	gguf_close(f);
	free(w.p);
}
END_TEST

/* `loom info` on a small file of another architecture: keys are found
 * under the architecture's prefix and absent ones are left out. */
static char *info_text(const struct wbuf *w)
{
	char path[] = "/tmp/loom_gguf_infoXXXXXX", err[512] = "", *text = NULL;
	size_t len;
	int fd = mkstemp(path);
	FILE *out;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, w->p, w->n), (ssize_t)w->n);
	close(fd);
	out = open_memstream(&text, &len);
	ck_assert_ptr_nonnull(out);
	ck_assert_msg(loom_info_print(path, out, err, sizeof(err)) == 0, "%s", err);
	fclose(out);
	unlink(path);
	return text;
}

START_TEST(test_info_arch)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 32, 2 };
	char *text;

	w_header(&w, 3, 1, 6);
	kv_str(&w, "general.architecture", "gemma3");
	kv_u32(&w, "gemma3.block_count", 26);
	kv_u32(&w, "gemma3.attention.sliding_window", 512);
	kv_u32(&w, "llama.block_count", 99);
	w_str(&w, "gemma3.rope.freq_base");
	w_u32(&w, GGUF_F32);
	w_f32(&w, 1000000.0f);
	kv_u32(&w, "general.file_type", 7);
	tensor_info(&w, "t", 2, ne, 8, 0);
	finish(&w, 32, 2 * 34);
	text = info_text(&w);
	ck_assert_msg(strstr(text, "gemma3"), "%s", text);
	ck_assert_msg(strstr(text, "  layers                   26\n"), "%s", text);
	ck_assert_msg(strstr(text, "  sliding window           512\n"), "%s", text);
	ck_assert_msg(strstr(text, "  RoPE base                1e+06\n"), "%s", text);
	ck_assert_msg(strstr(text, "(q8_0)"), "%s", text);
	ck_assert_msg(!strstr(text, "99"), "%s", text);
	ck_assert_msg(!strstr(text, "KV heads"), "%s", text);
	ck_assert_msg(strstr(text, "tensors: 1 (64 parameters, 68 bytes"), "%s", text);
	free(text);
	free(w.p);
}
END_TEST

START_TEST(test_info_error)
{
	char err[256] = "";

	ck_assert_int_eq(loom_info_print("/nonexistent/x.gguf", stdout, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "/nonexistent/x.gguf"), "%s", err);
}
END_TEST

/* ---- rejected files ---- */

START_TEST(test_bad_magic)
{
	struct wbuf w = build_valid(3);

	w.p[0] = 'X';
	expect_fail(&w, "magic", NULL);
}
END_TEST

START_TEST(test_bad_version)
{
	static const uint32_t versions[] = { 1, 4, 0, 0x03000000 };
	static const char *const want[] = { "version 1", "version 4", "version 0",
					    "big-endian" };
	struct wbuf w = build_valid(3);

	memcpy(w.p + 4, &versions[_i], 4);
	expect_fail(&w, want[_i], NULL);
}
END_TEST

START_TEST(test_huge_counts)
{
	struct wbuf w = build_valid(3);
	uint64_t huge = _i < 2 ? (1ull << 40) : UINT64_MAX;

	/* n_tensors at 8, n_kv at 16 */
	memcpy(w.p + (_i % 2 ? 16 : 8), &huge, 8);
	expect_fail(&w, _i % 2 ? "n_kv" : "n_tensors", "too large");
}
END_TEST

START_TEST(test_truncation)
{
	struct wbuf w = build_valid(3);
	char err[512];

	for (size_t n = 0; n < w.n; n++) {
		uint8_t *copy;
		struct gguf_file *f;

		err[0] = 0;
		f = open_copy(&w, n, &copy, err, sizeof(err));
		ck_assert_msg(f == NULL, "opened a file cut at %zu of %zu bytes", n, w.n);
		ck_assert_msg(err[0], "no message for a cut at %zu", n);
		free(copy);
	}
	free(w.p);
}
END_TEST

START_TEST(test_key_string_past_end)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 1);
	w_u64(&w, 1000);
	w_bytes(&w, "general.name", 12);
	w_u32(&w, GGUF_U8);
	w_u8(&w, 1);
	expect_fail(&w, "key", "past end");
}
END_TEST

START_TEST(test_value_string_past_end)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 1);
	w_str(&w, "general.name");
	w_u32(&w, GGUF_STRING);
	w_u64(&w, UINT64_MAX);
	w_bytes(&w, "abcdefghijklmnopq", 16);
	expect_fail(&w, "key 'general.name'", "past end");
}
END_TEST

START_TEST(test_array_past_end)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 1);
	kv_arr(&w, "a.big", _i ? GGUF_STRING : GGUF_U64, UINT64_MAX / 4);
	w_data(&w, 64);
	expect_fail(&w, "key 'a.big'", NULL);
}
END_TEST

START_TEST(test_string_array_elem_past_end)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 1);
	kv_arr(&w, "tokenizer.ggml.tokens", GGUF_STRING, 3);
	w_str(&w, "a");
	w_str(&w, "b");
	w_u64(&w, 100);
	w_bytes(&w, "cc", 2);
	expect_fail(&w, "key 'tokenizer.ggml.tokens'", "string 2");
}
END_TEST

START_TEST(test_tensor_past_eof)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 16 };

	w_header(&w, 3, 2, 0);
	tensor_info(&w, "ok", 1, ne, 0, 0);
	tensor_info(&w, "late", 1, ne, 0, 64);
	finish(&w, 32, 64 + 63);
	expect_fail(&w, "tensor 'late'", "past end of file");
}
END_TEST

START_TEST(test_tensor_offset_huge)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 16 };

	w_header(&w, 3, 1, 0);
	tensor_info(&w, "far", 1, ne, 0, UINT64_MAX - 31);
	finish(&w, 32, 64);
	expect_fail(&w, "tensor 'far'", "past end of file");
}
END_TEST

START_TEST(test_dims_overflow)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 1ull << 32, 1ull << 32, 1ull << 32 };

	w_header(&w, 3, 1, 0);
	tensor_info(&w, "big", 3, ne, 0, 0);
	finish(&w, 32, 32);
	expect_fail(&w, "tensor 'big'", "overflow");
}
END_TEST

START_TEST(test_bytes_overflow)
{
	/* 2^62 f64 elements fit int64, but their 2^65 bytes overflow uint64. */
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 1ull << 31, 1ull << 31 };

	w_header(&w, 3, 1, 0);
	tensor_info(&w, "wide", 2, ne, 28, 0);
	finish(&w, 32, 32);
	expect_fail(&w, "tensor 'wide'", "overflow");
}
END_TEST

START_TEST(test_dim_negative)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 4, (uint64_t)-4 };

	w_header(&w, 3, 1, 0);
	tensor_info(&w, "neg", 2, ne, 0, 0);
	finish(&w, 32, 32);
	expect_fail(&w, "tensor 'neg'", "ne[1]");
}
END_TEST

START_TEST(test_too_many_dims)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 1, 1, 1, 1, 1 };

	w_header(&w, 3, 1, 0);
	tensor_info(&w, "t5", 5, ne, 0, 0);
	finish(&w, 32, 32);
	expect_fail(&w, "tensor 't5'", "n_dims 5");
}
END_TEST

START_TEST(test_unknown_tensor_type)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 32 };

	w_header(&w, 3, 1, 0);
	tensor_info(&w, "odd", 1, ne, _i ? 40 : 4, 0);
	finish(&w, 32, 64);
	expect_fail(&w, "tensor 'odd'", _i ? "unknown type 40" : "unknown type 4");
}
END_TEST

START_TEST(test_row_not_block_multiple)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 48, 2 };

	w_header(&w, 3, 1, 0);
	tensor_info(&w, "q", 2, ne, 2, 0);
	finish(&w, 32, 128);
	expect_fail(&w, "tensor 'q'", "block size");
}
END_TEST

START_TEST(test_misaligned_offset)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 4 };

	w_header(&w, 3, 1, 0);
	tensor_info(&w, "m", 1, ne, 0, 8);
	finish(&w, 32, 64);
	expect_fail(&w, "tensor 'm'", "alignment");
}
END_TEST

START_TEST(test_overlap)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 16 };

	w_header(&w, 3, 2, 0);
	tensor_info(&w, "x", 1, ne, 0, 32);
	tensor_info(&w, "y", 1, ne, 0, 64);
	finish(&w, 32, 128);
	expect_fail(&w, "tensor 'y'", "overlaps tensor 'x'");
}
END_TEST

START_TEST(test_duplicate_key)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 4);
	kv_u32(&w, "a", 1);
	kv_str(&w, "general.name", "x");
	kv_u32(&w, "b", 1);
	kv_u32(&w, "general.name", 2);
	expect_fail(&w, "key 'general.name'", "duplicate");
}
END_TEST

START_TEST(test_duplicate_tensor)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 8 };

	w_header(&w, 3, 3, 0);
	tensor_info(&w, "blk.0.w", 1, ne, 0, 0);
	tensor_info(&w, "blk.1.w", 1, ne, 0, 32);
	tensor_info(&w, "blk.0.w", 1, ne, 0, 64);
	finish(&w, 32, 96);
	expect_fail(&w, "tensor 'blk.0.w'", "duplicate");
}
END_TEST

START_TEST(test_bad_alignment)
{
	static const uint32_t values[] = { 0, 3, 48 };
	struct wbuf w = { 0 };
	char want[32];

	w_header(&w, 3, 0, 1);
	kv_u32(&w, "general.alignment", values[_i]);
	snprintf(want, sizeof(want), "%u is not", values[_i]);
	expect_fail(&w, "general.alignment", want);
}
END_TEST

START_TEST(test_alignment_wrong_type)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 1);
	w_str(&w, "general.alignment");
	w_u32(&w, GGUF_U64);
	w_u64(&w, 32);
	expect_fail(&w, "general.alignment", "expected u32");
}
END_TEST

START_TEST(test_nested_array)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 1);
	kv_arr(&w, "a.nest", GGUF_ARRAY, 1);
	w_u32(&w, GGUF_U8);
	w_u64(&w, 1);
	w_u8(&w, 1);
	expect_fail(&w, "key 'a.nest'", "nested");
}
END_TEST

START_TEST(test_unknown_value_type)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 1);
	w_str(&w, "k");
	w_u32(&w, _i ? GGUF_ARRAY : GGUF_VTYPE_COUNT);
	if (_i) {
		w_u32(&w, 77);
		w_u64(&w, 0);
	} else {
		w_u64(&w, 0);
	}
	expect_fail(&w, "key 'k'", "unknown");
}
END_TEST

START_TEST(test_bad_bool)
{
	struct wbuf w = { 0 };

	w_header(&w, 3, 0, 1);
	if (_i) {
		kv_arr(&w, "b", GGUF_BOOL, 2);
		w_u8(&w, 0);
		w_u8(&w, 2);
	} else {
		w_str(&w, "b");
		w_u32(&w, GGUF_BOOL);
		w_u8(&w, 2);
	}
	expect_fail(&w, "key 'b'", "bool");
}
END_TEST

START_TEST(test_bad_names)
{
	struct wbuf w = { 0 };
	const uint64_t ne[] = { 8 };

	w_header(&w, 3, _i >= 2, _i < 2);
	switch (_i) {
	case 0: /* key with an embedded NUL */
		w_strn(&w, "gen\0eral", 8);
		w_u32(&w, GGUF_U8);
		w_u8(&w, 0);
		expect_fail(&w, "key", "NUL");
		break;
	case 1: /* empty key */
		w_strn(&w, "", 0);
		w_u32(&w, GGUF_U32);
		w_u32(&w, 0);
		expect_fail(&w, "key", "empty");
		break;
	case 2:
		w_strn(&w, "ab\0c", 4);
		w_u32(&w, 1);
		w_u64(&w, ne[0]);
		w_u32(&w, 0);
		w_u64(&w, 0);
		finish(&w, 32, 32);
		expect_fail(&w, "tensor 0 name", "NUL");
		break;
	}
}
END_TEST

/* ---- random mutation ---- */

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64* */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

/* Touches everything an accepted file exposes, so a bad pointer faults. */
static unsigned walk(const struct gguf_file *f)
{
	unsigned sum = 0;

	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct gguf_kv *kv = &f->kv[i];
		char key[64];
		sum += (unsigned char)kv->key.ptr[kv->key.len - 1];
		if (kv->key.len < sizeof(key)) {
			memcpy(key, kv->key.ptr, kv->key.len);
			key[kv->key.len] = 0;
			ck_assert_ptr_eq(gguf_find(f, key), kv);
		}
		if (kv->type == GGUF_STRING && kv->v.str.len)
			sum += (unsigned char)kv->v.str.ptr[kv->v.str.len - 1];
		if (kv->type != GGUF_ARRAY || kv->arr_n == 0)
			continue;
		if (kv->arr_type == GGUF_STRING) {
			for (uint64_t j = 0; j < kv->arr_n; j++)
				if (kv->arr_str[j].len)
					sum += (unsigned char)kv->arr_str[j].ptr[kv->arr_str[j].len - 1];
		} else {
			sum += ((const uint8_t *)kv->arr_data)[0];
		}
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		if (t->nbytes)
			sum += ((const uint8_t *)t->data)[0] +
			       ((const uint8_t *)t->data)[t->nbytes - 1];
	}
	return sum;
}

static void mutate(uint8_t *p, size_t *n, uint64_t *rng)
{
	static const uint64_t special[] = { 0, 1, 2, 3, 4, 5, 31, 32, 33, 255, 65535,
					    0x7fffffff, 0xffffffff, 1ull << 32,
					    INT64_MAX, UINT64_MAX, 40, 13, 9, 8 };
	int k = 1 + (int)(rng_next(rng) % 4);

	while (k--) {
		size_t at = rng_next(rng) % *n;
		uint64_t r = rng_next(rng);
		switch (r % 4) {
		case 0: p[at] = (uint8_t)(r >> 8); break;
		case 1: p[at] ^= (uint8_t)(1u << ((r >> 8) % 8)); break;
		case 2: {
			uint64_t v = special[(r >> 8) % N(special)];
			size_t len = (r >> 16) % 2 ? 8 : 4;
			if (at + len <= *n)
				memcpy(p + at, &v, len);
			break;
		}
		case 3: if (at > 0 && (r >> 8) % 8 == 0) *n = at; break;
		}
	}
}

START_TEST(test_random_mutations)
{
	struct wbuf w = build_valid(3);
	uint64_t rng = 0x1234567887654321ull;
	unsigned opened = 0, sink = 0;
	char err[512];

	for (int it = 0; it < 5000; it++) {
		size_t n = w.n;
		uint8_t *p = malloc(n);
		struct gguf_file *f;

		memcpy(p, w.p, n);
		mutate(p, &n, &rng);
		f = gguf_open_memory(p, n, err, sizeof(err));
		if (f) {
			sink += walk(f);
			opened++;
			gguf_close(f);
		} else {
			ck_assert(err[0] != 0);
		}
		free(p);
	}
	/* Some mutations hit data bytes and keep the file valid. */
	ck_assert_uint_gt(opened, 0);
	ck_assert_uint_lt(opened, 5000);
	(void)sink;
	free(w.p);
}
END_TEST

/* ---- real files ---- */

static const char *model_path(void)
{
	const char *p = getenv("LOOM_MODEL");
	struct stat st;

	return p && *p && stat(p, &st) == 0 ? p : NULL;
}

static char vocab_dir[4096];

START_TEST(test_model)
{
	const char *path = model_path();
	char err[512] = "";
	struct gguf_file *f = gguf_open(path, err, sizeof(err));
	const struct gguf_tensor *t;
	const struct gguf_kv *kv = NULL;
	uint32_t n_layer = 0;

	ck_assert_msg(f != NULL, "%s", err);
	/* Figures from gguf.GGUFReader over the same file. */
	ck_assert_uint_eq(f->version, 3);
	ck_assert_uint_eq(f->n_tensors, 272);
	ck_assert_uint_eq(f->n_kv, 33);
	ck_assert_int_eq(gguf_get_u32(f, "llama.block_count", &n_layer, err, sizeof(err)), 0);
	ck_assert_uint_eq(n_layer, 30);
	ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &kv, err,
				      sizeof(err)), 0);
	ck_assert_uint_eq(kv->arr_n, 49152);
	ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_STRING, &kv, err,
				      sizeof(err)), 0);
	ck_assert_uint_eq(kv->arr_n, 48900);
	ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_U32, &kv, err,
				      sizeof(err)), -1);
	ck_assert_str_eq(err, "key 'tokenizer.ggml.tokens': array of string, expected array of u32");
	t = gguf_find_tensor(f, "token_embd.weight");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->type, 8);
	ck_assert_uint_eq(t->n_dims, 2);
	ck_assert_int_eq(t->ne[0], 576);
	ck_assert_int_eq(t->ne[1], 49152);
	/* 576 / 32 blocks * 34 bytes * 49152 rows */
	ck_assert_uint_eq(t->nbytes, 576 / 32 * 34 * 49152ull);
	ck_assert_uint_eq(f->data_offset, 1785664);
	ck_assert_uint_eq(t->offset, 0);
	gguf_close(f);
}
END_TEST

/* The line of `loom info` output that starts with label, or NULL. */
static const char *info_line(const char *text, const char *label)
{
	const char *p = text;

	while (p && *p) {
		if (strncmp(p, label, strlen(label)) == 0)
			return p + strlen(label);
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return NULL;
}

static void info_of(const char *path, char **text)
{
	size_t len;
	char err[512] = "";
	FILE *out = open_memstream(text, &len);

	ck_assert_ptr_nonnull(out);
	ck_assert_msg(loom_info_print(path, out, err, sizeof(err)) == 0, "%s", err);
	fclose(out);
}

START_TEST(test_model_info)
{
	char *text = NULL;
	const char *v;

	info_of(model_path(), &text);
	v = info_line(text, "architecture:");
	ck_assert_msg(v && strtoul(v, NULL, 10) == 0 && strstr(v, "llama"), "%s", text);
	v = info_line(text, "  layers");
	ck_assert_msg(v && strtoul(v, NULL, 10) == 30, "%s", text);
	v = info_line(text, "  KV heads");
	ck_assert_msg(v && strtoul(v, NULL, 10) == 3, "%s", text);
	v = info_line(text, "tensors:");
	ck_assert_msg(v && strtoul(v, NULL, 10) == 272, "%s", text);
	ck_assert_ptr_nonnull(info_line(text, "  q8_0 "));
	free(text);
}
END_TEST

START_TEST(test_vocab_files)
{
	/* Token counts from gguf.GGUFReader. */
	static const struct { const char *file; uint64_t n_tokens; const char *arch; } files[] = {
		{ "ggml-vocab-gpt-2.gguf", 50257, "gpt2" },
		{ "ggml-vocab-llama-spm.gguf", 32000, "llama" },
	};
	char path[8192], err[512] = "", *text = NULL, *arch = NULL;
	const struct gguf_kv *kv = NULL;
	struct gguf_file *f;

	snprintf(path, sizeof(path), "%s/%s", vocab_dir, files[_i].file);
	f = gguf_open(path, err, sizeof(err));
	ck_assert_msg(f != NULL, "%s", err);
	ck_assert_uint_eq(f->n_tensors, 0);
	ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &kv, err,
				      sizeof(err)), 0);
	ck_assert_uint_eq(kv->arr_n, files[_i].n_tokens);
	ck_assert_int_eq(gguf_get_str(f, "general.architecture", &arch, err, sizeof(err)), 0);
	ck_assert_str_eq(arch, files[_i].arch);
	free(arch);
	gguf_close(f);
	info_of(path, &text);
	ck_assert_msg(strstr(text, "tensors: 0"), "%s", text);
	free(text);
}
END_TEST

static int run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

static int run_real(void)
{
	Suite *s;
	TCase *tc;
	const char *shared = getenv("LOOM_SHARED_DIR");
	struct stat st;
	bool have_vocab;

	snprintf(vocab_dir, sizeof(vocab_dir), "%s/data/tokenizer", shared ? shared : "");
	have_vocab = shared && stat(vocab_dir, &st) == 0;
	/* One line saying what is missing. */
	if (!model_path())
		printf("model not found (LOOM_MODEL=%s)%s%s\n",
		       getenv("LOOM_MODEL") ? getenv("LOOM_MODEL") : "",
		       have_vocab ? "" : " and shared data not found in ",
		       have_vocab ? "" : vocab_dir);
	else if (!have_vocab)
		printf("shared data not found in '%s'\n", vocab_dir);
	if (!model_path() && !have_vocab)
		return 77;
	s = suite_create("gguf_real");
	tc = tcase_create("real");
	tcase_set_timeout(tc, 60);
	if (model_path()) {
		tcase_add_test(tc, test_model);
		tcase_add_test(tc, test_model_info);
	}
	if (have_vocab)
		tcase_add_loop_test(tc, test_vocab_files, 0, 2);
	suite_add_tcase(s, tc);
	return run(s);
}

int main(int argc, char **argv)
{
	Suite *s;
	TCase *tc;

	if (argc > 1 && strcmp(argv[1], "model") == 0)
		return run_real();
	s = suite_create("gguf");
	tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_roundtrip, 0, 2);
	tcase_add_test(tc, test_open_file);
	tcase_add_test(tc, test_accessors);
	tcase_add_test(tc, test_arr_mismatch_tokens);
	tcase_add_test(tc, test_type_geometry);
	tcase_add_test(tc, test_alignment_ok);
	tcase_add_test(tc, test_info_arch);
	tcase_add_test(tc, test_info_error);
	tcase_add_test(tc, test_bad_magic);
	tcase_add_loop_test(tc, test_bad_version, 0, 4);
	tcase_add_loop_test(tc, test_huge_counts, 0, 4);
	tcase_add_test(tc, test_truncation);
	tcase_add_test(tc, test_key_string_past_end);
	tcase_add_test(tc, test_value_string_past_end);
	tcase_add_loop_test(tc, test_array_past_end, 0, 2);
	tcase_add_test(tc, test_string_array_elem_past_end);
	tcase_add_test(tc, test_tensor_past_eof);
	tcase_add_test(tc, test_tensor_offset_huge);
	tcase_add_test(tc, test_dims_overflow);
	tcase_add_test(tc, test_bytes_overflow);
	tcase_add_test(tc, test_dim_negative);
	tcase_add_test(tc, test_too_many_dims);
	tcase_add_loop_test(tc, test_unknown_tensor_type, 0, 2);
	tcase_add_test(tc, test_row_not_block_multiple);
	tcase_add_test(tc, test_misaligned_offset);
	tcase_add_test(tc, test_overlap);
	tcase_add_test(tc, test_duplicate_key);
	tcase_add_test(tc, test_duplicate_tensor);
	tcase_add_loop_test(tc, test_bad_alignment, 0, 3);
	tcase_add_test(tc, test_alignment_wrong_type);
	tcase_add_test(tc, test_nested_array);
	tcase_add_loop_test(tc, test_unknown_value_type, 0, 2);
	tcase_add_loop_test(tc, test_bad_bool, 0, 2);
	tcase_add_loop_test(tc, test_bad_names, 0, 3);
	tcase_add_test(tc, test_random_mutations);
	suite_add_tcase(s, tc);
	return run(s);
}
