/* GGUF v2/v3 reader: see gguf.h.
 *
 * Layout (all little-endian):
 *   "GGUF" u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x { string key, u32 vtype, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   padding to general.alignment, then the tensor data section.
 * A string is u64 length + bytes; an array is u32 element type + u64 count
 * + elements.
 *
 * Every read goes through struct rd, which knows how many bytes remain, so
 * a malformed file can only produce an error message, never a read outside
 * the buffer. Counts are checked against the bytes that remain before any
 * allocation, so allocations stay proportional to the file size.
 */
#include "format/gguf.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian values in place; big-endian hosts are not supported"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32
/* Smallest encodings, used to bound counts by the bytes that remain. */
#define MIN_KV_BYTES (8 + 1 + 4 + 1)         /* key len, 1-byte key, type, u8 */
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 4 + 8) /* name len, name, n_dims=0, type, offset */

/* The public struct plus the lookup indexes, which callers never see. */
struct gguf_priv {
	struct gguf_file f;
	const void **kv_sorted;     /* struct gguf_kv *, by key */
	const void **tensor_sorted; /* struct gguf_tensor *, by name */
};

struct rd {
	const uint8_t *p;
	uint64_t size;
	uint64_t pos;
	char ctx[192]; /* the field being read, prefixed to messages */
	char *err;
	size_t errlen;
};

/* ---- type tables ---- */

struct type_geom {
	const char *name;
	uint32_t block_elems;
	uint32_t block_bytes;
};

/* ggml_type ids and block layouts (ggml-common.h). Ids that ggml retired
 * (4, 5, 31-33, 36-38) stay unknown. Ids stop below LOOM_TYPE_COUNT (40)
 * because callers index tables by type. */
static const struct type_geom type_table[] = {
	[0] = { "f32", 1, 4 },
	[1] = { "f16", 1, 2 },
	[2] = { "q4_0", 32, 18 },
	[3] = { "q4_1", 32, 20 },
	[6] = { "q5_0", 32, 22 },
	[7] = { "q5_1", 32, 24 },
	[8] = { "q8_0", 32, 34 },
	[9] = { "q8_1", 32, 36 },
	[10] = { "q2_K", 256, 84 },
	[11] = { "q3_K", 256, 110 },
	[12] = { "q4_K", 256, 144 },
	[13] = { "q5_K", 256, 176 },
	[14] = { "q6_K", 256, 210 },
	[15] = { "q8_K", 256, 292 },
	[16] = { "iq2_xxs", 256, 66 },
	[17] = { "iq2_xs", 256, 74 },
	[18] = { "iq3_xxs", 256, 98 },
	[19] = { "iq1_s", 256, 50 },
	[20] = { "iq4_nl", 32, 18 },
	[21] = { "iq3_s", 256, 110 },
	[22] = { "iq2_s", 256, 82 },
	[23] = { "iq4_xs", 256, 136 },
	[24] = { "i8", 1, 1 },
	[25] = { "i16", 1, 2 },
	[26] = { "i32", 1, 4 },
	[27] = { "i64", 1, 8 },
	[28] = { "f64", 1, 8 },
	[29] = { "iq1_m", 256, 56 },
	[30] = { "bf16", 1, 2 },
	[34] = { "tq1_0", 256, 54 },
	[35] = { "tq2_0", 256, 66 },
	[39] = { "mxfp4", 32, 17 },
};

#define N_TYPES (sizeof(type_table) / sizeof(type_table[0]))

bool gguf_type_geometry(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes)
{
	if (type >= N_TYPES || !type_table[type].name)
		return false;
	if (block_elems)
		*block_elems = type_table[type].block_elems;
	if (block_bytes)
		*block_bytes = type_table[type].block_bytes;
	return true;
}

const char *gguf_type_name(uint32_t type)
{
	if (type >= N_TYPES || !type_table[type].name)
		return "?";
	return type_table[type].name;
}

static const char *const vtype_names[GGUF_VTYPE_COUNT] = {
	[GGUF_U8] = "u8", [GGUF_I8] = "i8", [GGUF_U16] = "u16",
	[GGUF_I16] = "i16", [GGUF_U32] = "u32", [GGUF_I32] = "i32",
	[GGUF_F32] = "f32", [GGUF_BOOL] = "bool", [GGUF_STRING] = "string",
	[GGUF_ARRAY] = "array", [GGUF_U64] = "u64", [GGUF_I64] = "i64",
	[GGUF_F64] = "f64",
};

/* Byte size of a fixed-size value type (0 for string, array, unknown). */
static const uint8_t vtype_sizes[GGUF_VTYPE_COUNT] = {
	[GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2,
	[GGUF_U32] = 4, [GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1,
	[GGUF_U64] = 8, [GGUF_I64] = 8, [GGUF_F64] = 8,
};

const char *gguf_vtype_name(uint32_t vtype)
{
	if (vtype >= GGUF_VTYPE_COUNT)
		return "?";
	return vtype_names[vtype];
}

/* ---- errors ---- */

/* Writes "<ctx>: <message>". Always returns -1. */
static int fail(struct rd *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int fail(struct rd *r, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	loom_seterr(r->err, r->errlen, "%s: %s", r->ctx, msg);
	return -1;
}

static void setctx(struct rd *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void setctx(struct rd *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->ctx, sizeof(r->ctx), fmt, ap);
	va_end(ap);
}

/* Puts a key or name into a context line, shortened and with control
 * bytes shown as '?', so messages stay one readable line. */
static void show_str(struct gguf_str s, char *buf, size_t cap)
{
	size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;

	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	buf[n] = 0;
	if (s.len > n && n >= 3)
		memcpy(buf + n - 3, "...", 3);
}

/* ---- primitive reads ---- */

static uint64_t remain(const struct rd *r)
{
	return r->size - r->pos;
}

/* Returns a pointer to the next n bytes and advances, or NULL (with an
 * error) if fewer than n remain. */
static const uint8_t *take(struct rd *r, uint64_t n, const char *what)
{
	const uint8_t *p;

	if (n > remain(r)) {
		fail(r, "truncated: %s needs %" PRIu64 " bytes at offset %" PRIu64
		     " but the file has %" PRIu64 " bytes", what, n, r->pos, r->size);
		return NULL;
	}
	p = r->p + r->pos;
	r->pos += n;
	return p;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what)
{
	const uint8_t *p = take(r, 4, what);

	if (!p)
		return -1;
	memcpy(v, p, 4);
	return 0;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what)
{
	const uint8_t *p = take(r, 8, what);

	if (!p)
		return -1;
	memcpy(v, p, 8);
	return 0;
}

/* A string whose bytes must lie inside the buffer. */
static int rd_str(struct rd *r, struct gguf_str *s, const char *what)
{
	uint64_t len;

	if (rd_u64(r, &len, what))
		return -1;
	if (len > remain(r))
		return fail(r, "%s length %" PRIu64 " runs past end of file (%" PRIu64
			    " bytes left at offset %" PRIu64 ")", what, len, remain(r), r->pos);
	s->len = len;
	s->ptr = (const char *)take(r, len, what);
	return 0;
}

/* A key or tensor name: non-empty and without NUL bytes. */
static int rd_name(struct rd *r, struct gguf_str *s, const char *what)
{
	if (rd_str(r, s, what))
		return -1;
	if (s->len == 0)
		return fail(r, "%s is empty", what);
	if (memchr(s->ptr, 0, s->len))
		return fail(r, "%s contains a NUL byte", what);
	return 0;
}

/* ---- metadata ---- */

/* One fixed-size scalar, widened into kv->v. */
static int rd_scalar(struct rd *r, struct gguf_kv *kv, uint32_t type)
{
	const uint8_t *p = take(r, vtype_sizes[type], gguf_vtype_name(type));
	uint16_t u16;
	uint32_t u32;
	float f32;

	if (!p)
		return -1;
	switch (type) {
	case GGUF_U8: kv->v.u64 = p[0]; break;
	case GGUF_I8: kv->v.i64 = (int8_t)p[0]; break;
	case GGUF_BOOL:
		if (p[0] > 1)
			return fail(r, "bool value %u is neither 0 nor 1", p[0]);
		kv->v.u64 = p[0];
		break;
	case GGUF_U16: memcpy(&u16, p, 2); kv->v.u64 = u16; break;
	case GGUF_I16: memcpy(&u16, p, 2); kv->v.i64 = (int16_t)u16; break;
	case GGUF_U32: memcpy(&u32, p, 4); kv->v.u64 = u32; break;
	case GGUF_I32: memcpy(&u32, p, 4); kv->v.i64 = (int32_t)u32; break;
	case GGUF_F32: memcpy(&f32, p, 4); kv->v.f64 = f32; break;
	case GGUF_U64: memcpy(&kv->v.u64, p, 8); break;
	case GGUF_I64: memcpy(&kv->v.i64, p, 8); break;
	case GGUF_F64: memcpy(&kv->v.f64, p, 8); break;
	}
	return 0;
}

static int rd_str_array(struct rd *r, struct gguf_kv *kv)
{
	/* Each string takes at least its 8-byte length. */
	if (kv->arr_n > remain(r) / 8)
		return fail(r, "array of %" PRIu64 " strings cannot fit in the %" PRIu64
			    " bytes left", kv->arr_n, remain(r));
	kv->arr_str = calloc(kv->arr_n ? kv->arr_n : 1, sizeof(*kv->arr_str));
	if (!kv->arr_str)
		return fail(r, "out of memory for %" PRIu64 " strings", kv->arr_n);
	for (uint64_t i = 0; i < kv->arr_n; i++) {
		if (rd_str(r, &kv->arr_str[i], "array string"))
			return fail(r, "string %" PRIu64 " of %" PRIu64 " runs past end of file",
				    i, kv->arr_n);
	}
	return 0;
}

static int rd_array(struct rd *r, struct gguf_kv *kv)
{
	uint64_t bytes;
	uint32_t esz;

	if (rd_u32(r, &kv->arr_type, "array element type") ||
	    rd_u64(r, &kv->arr_n, "array length"))
		return -1;
	if (kv->arr_type == GGUF_ARRAY)
		return fail(r, "nested arrays are not supported");
	if (kv->arr_type >= GGUF_VTYPE_COUNT)
		return fail(r, "unknown array element type %" PRIu32, kv->arr_type);
	if (kv->arr_type == GGUF_STRING)
		return rd_str_array(r, kv);
	esz = vtype_sizes[kv->arr_type];
	if (__builtin_mul_overflow(kv->arr_n, esz, &bytes) || bytes > remain(r))
		return fail(r, "array of %" PRIu64 " %s runs past end of file (%" PRIu64
			    " bytes left)", kv->arr_n, gguf_vtype_name(kv->arr_type), remain(r));
	kv->arr_data = take(r, bytes, "array");
	if (kv->arr_type == GGUF_BOOL) {
		const uint8_t *b = kv->arr_data;
		for (uint64_t i = 0; i < kv->arr_n; i++)
			if (b[i] > 1)
				return fail(r, "bool element %" PRIu64 " is %u, neither 0 nor 1",
					    i, b[i]);
	}
	return 0;
}

static int rd_kv(struct rd *r, struct gguf_kv *kv, uint64_t i)
{
	char shown[96];

	setctx(r, "metadata entry %" PRIu64 " key", i);
	if (rd_name(r, &kv->key, "key"))
		return -1;
	show_str(kv->key, shown, sizeof(shown));
	setctx(r, "key '%s'", shown);
	if (rd_u32(r, &kv->type, "value type"))
		return -1;
	switch (kv->type) {
	case GGUF_STRING:
		return rd_str(r, &kv->v.str, "string");
	case GGUF_ARRAY:
		return rd_array(r, kv);
	default:
		if (kv->type >= GGUF_VTYPE_COUNT)
			return fail(r, "unknown value type %" PRIu32, kv->type);
		return rd_scalar(r, kv, kv->type);
	}
}

/* ---- sorted indexes ---- */

static int str_cmp(struct gguf_str a, struct gguf_str b)
{
	uint64_t n = a.len < b.len ? a.len : b.len;
	int c = memcmp(a.ptr, b.ptr, n);

	if (c)
		return c;
	return a.len < b.len ? -1 : a.len > b.len;
}

/* qsort_r comparator of pointers to elements whose name is the struct
 * gguf_str at byte offset *(size_t *)off. */
static int name_cmp(const void *a, const void *b, void *off)
{
	size_t o = *(const size_t *)off;
	const char *x = *(const char *const *)a, *y = *(const char *const *)b;

	return str_cmp(*(const struct gguf_str *)(x + o), *(const struct gguf_str *)(y + o));
}

/* Points v[0..n) at the n elements of base (stride bytes apart) in the
 * order of their names (the struct gguf_str at name_off) and refuses a
 * name that repeats: the error says "<what> '<name>': <dup>". */
static int index_by_name(struct rd *r, const void **v, const void *base, size_t stride,
			 size_t name_off, uint64_t n, const char *what, const char *dup)
{
	char shown[96];

	for (uint64_t i = 0; i < n; i++)
		v[i] = (const char *)base + i * stride;
	qsort_r(v, n, sizeof(*v), name_cmp, &name_off);
	for (uint64_t i = 1; i < n; i++) {
		const struct gguf_str *prev = (const void *)((const char *)v[i - 1] + name_off);
		const struct gguf_str *cur = (const void *)((const char *)v[i] + name_off);

		if (str_cmp(*prev, *cur) == 0) {
			show_str(*cur, shown, sizeof(shown));
			setctx(r, "%s '%s'", what, shown);
			return fail(r, dup);
		}
	}
	return 0;
}

/* The sorted indexes hold element addresses as const void * (what
 * qsort_r and index_by_name handle) and are read back through the typed
 * accessors below. */
static int index_kvs(struct rd *r, struct gguf_priv *g)
{
	g->kv_sorted = malloc((g->f.n_kv ? g->f.n_kv : 1) * sizeof(*g->kv_sorted));
	if (!g->kv_sorted)
		return fail(r, "out of memory");
	return index_by_name(r, g->kv_sorted, g->f.kv, sizeof(*g->f.kv),
			     offsetof(struct gguf_kv, key), g->f.n_kv, "key", "duplicate key");
}

static int index_tensors(struct rd *r, struct gguf_priv *g)
{
	g->tensor_sorted = malloc((g->f.n_tensors ? g->f.n_tensors : 1) *
				  sizeof(*g->tensor_sorted));
	if (!g->tensor_sorted)
		return fail(r, "out of memory");
	return index_by_name(r, g->tensor_sorted, g->f.tensors, sizeof(*g->f.tensors),
			     offsetof(struct gguf_tensor, name), g->f.n_tensors, "tensor",
			     "duplicate tensor name");
}

/* Binary search of a name index (see index_by_name): the element, or NULL. */
static const void *find_by_name(const void *const *v, uint64_t n, size_t name_off,
				const char *name)
{
	struct gguf_str k = { strlen(name), name };
	uint64_t lo = 0, hi = n;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int c = str_cmp(*(const struct gguf_str *)((const char *)v[mid] + name_off), k);

		if (c == 0)
			return v[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static const struct gguf_kv *find_key(const struct gguf_priv *g, const char *key)
{
	return find_by_name(g->kv_sorted, g->f.n_kv, offsetof(struct gguf_kv, key), key);
}

/* ---- alignment and tensors ---- */

static int read_alignment(struct rd *r, struct gguf_priv *g)
{
	const struct gguf_kv *kv = find_key(g, "general.alignment");

	g->f.alignment = GGUF_DEFAULT_ALIGNMENT;
	if (!kv)
		return 0;
	setctx(r, "key 'general.alignment'");
	if (kv->type != GGUF_U32)
		return fail(r, "type %s, expected u32", gguf_vtype_name(kv->type));
	if (kv->v.u64 == 0 || (kv->v.u64 & (kv->v.u64 - 1)))
		return fail(r, "%" PRIu64 " is not a nonzero power of two", kv->v.u64);
	g->f.alignment = kv->v.u64;
	return 0;
}

/* Element count and byte size, with every product overflow-checked. */
static int tensor_size(struct rd *r, struct gguf_tensor *t)
{
	uint32_t be, bb;
	int64_t nelem = 1;
	uint64_t rows = 1, row_bytes;

	if (!gguf_type_geometry(t->type, &be, &bb))
		return fail(r, "unknown type %" PRIu32, t->type);
	if (t->ne[0] % be)
		return fail(r, "row length ne[0] = %" PRId64 " is not a multiple of the "
			    "%s block size %" PRIu32, t->ne[0], gguf_type_name(t->type), be);
	for (int d = 0; d < GGUF_MAX_DIMS; d++) {
		if (__builtin_mul_overflow(nelem, t->ne[d], &nelem))
			return fail(r, "element count overflows (dims %" PRId64 " x %" PRId64
				    " x %" PRId64 " x %" PRId64 ")",
				    t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
	}
	for (int d = 1; d < GGUF_MAX_DIMS; d++)
		if (__builtin_mul_overflow(rows, (uint64_t)t->ne[d], &rows))
			return fail(r, "row count overflows");
	if (__builtin_mul_overflow((uint64_t)t->ne[0] / be, (uint64_t)bb, &row_bytes) ||
	    __builtin_mul_overflow(row_bytes, rows, &t->nbytes))
		return fail(r, "byte size overflows");
	return 0;
}

static int rd_tensor(struct rd *r, struct gguf_file *f, struct gguf_tensor *t,
		     uint64_t i)
{
	char shown[96];

	setctx(r, "tensor %" PRIu64 " name", i);
	if (rd_name(r, &t->name, "name"))
		return -1;
	show_str(t->name, shown, sizeof(shown));
	setctx(r, "tensor '%s'", shown);
	if (rd_u32(r, &t->n_dims, "n_dims"))
		return -1;
	if (t->n_dims > GGUF_MAX_DIMS)
		return fail(r, "n_dims %" PRIu32 " exceeds %d", t->n_dims, GGUF_MAX_DIMS);
	for (int d = 0; d < GGUF_MAX_DIMS; d++)
		t->ne[d] = 1;
	for (uint32_t d = 0; d < t->n_dims; d++) {
		uint64_t ne;
		if (rd_u64(r, &ne, "dimension"))
			return -1;
		if (ne > INT64_MAX)
			return fail(r, "dimension ne[%" PRIu32 "] = %" PRIu64 " is too large",
				    d, ne);
		if (ne == 0) /* no elements: nothing can read or quantize it */
			return fail(r, "dimension ne[%" PRIu32 "] is 0", d);
		t->ne[d] = (int64_t)ne;
	}
	if (rd_u32(r, &t->type, "type") || rd_u64(r, &t->offset, "offset"))
		return -1;
	if (t->offset % f->alignment)
		return fail(r, "offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
			    t->offset, f->alignment);
	return tensor_size(r, t);
}

static int offset_cmp(const void *a, const void *b)
{
	const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
	const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Every tensor inside the file, none overlapping another. */
static int place_tensors(struct rd *r, struct gguf_priv *g)
{
	struct gguf_file *f = &g->f;
	const struct gguf_tensor **by_off;
	uint64_t avail = f->size - f->data_offset;
	char shown[96], prev[96];
	int ret = 0;

	for (uint64_t i = 0; i < f->n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];
		if (t->offset > avail || t->nbytes > avail - t->offset) {
			show_str(t->name, shown, sizeof(shown));
			setctx(r, "tensor '%s'", shown);
			return fail(r, "data ends past end of file (data section %" PRIu64
				    " + offset %" PRIu64 " + %" PRIu64 " bytes > %" PRIu64 ")",
				    f->data_offset, t->offset, t->nbytes, f->size);
		}
		t->data = f->base + f->data_offset + t->offset;
	}
	/* The name index is a handy array of pointers to sort by offset. */
	by_off = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof(*by_off));
	if (!by_off)
		return fail(r, "out of memory");
	memcpy(by_off, g->tensor_sorted, f->n_tensors * sizeof(*by_off));
	qsort(by_off, f->n_tensors, sizeof(*by_off), offset_cmp);
	for (uint64_t i = 1; i < f->n_tensors; i++) {
		const struct gguf_tensor *a = by_off[i - 1], *b = by_off[i];
		if (a->offset + a->nbytes > b->offset) {
			show_str(b->name, shown, sizeof(shown));
			show_str(a->name, prev, sizeof(prev));
			setctx(r, "tensor '%s'", shown);
			ret = fail(r, "data at offset %" PRIu64 " overlaps tensor '%s' (%"
				   PRIu64 " + %" PRIu64 ")", b->offset, prev, a->offset,
				   a->nbytes);
			break;
		}
	}
	free(by_off);
	return ret;
}

/* ---- header and the whole file ---- */

static int rd_header(struct rd *r, struct gguf_file *f)
{
	const uint8_t *magic;

	setctx(r, "header");
	magic = take(r, 4, "magic");
	if (!magic)
		return -1;
	if (memcmp(magic, "GGUF", 4))
		return fail(r, "bad magic %02x %02x %02x %02x, expected 'GGUF'",
			    magic[0], magic[1], magic[2], magic[3]);
	if (rd_u32(r, &f->version, "version"))
		return -1;
	if (f->version == 0x02000000 || f->version == 0x03000000)
		return fail(r, "big-endian GGUF files are not supported");
	if (f->version < 2 || f->version > 3)
		return fail(r, "unsupported version %" PRIu32 " (supported: 2 and 3)",
			    f->version);
	if (rd_u64(r, &f->n_tensors, "n_tensors") || rd_u64(r, &f->n_kv, "n_kv"))
		return -1;
	if (f->n_kv > remain(r) / MIN_KV_BYTES)
		return fail(r, "n_kv %" PRIu64 " is too large for the %" PRIu64
			    " bytes left", f->n_kv, remain(r));
	if (f->n_tensors > remain(r) / MIN_TENSOR_BYTES)
		return fail(r, "n_tensors %" PRIu64 " is too large for the %" PRIu64
			    " bytes left", f->n_tensors, remain(r));
	return 0;
}

static int parse(struct rd *r, struct gguf_priv *g)
{
	struct gguf_file *f = &g->f;
	uint64_t pad;

	if (rd_header(r, f))
		return -1;
	f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof(*f->kv));
	f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(*f->tensors));
	if (!f->kv || !f->tensors)
		return fail(r, "out of memory");
	for (uint64_t i = 0; i < f->n_kv; i++)
		if (rd_kv(r, &f->kv[i], i))
			return -1;
	if (index_kvs(r, g) || read_alignment(r, g))
		return -1;
	for (uint64_t i = 0; i < f->n_tensors; i++)
		if (rd_tensor(r, f, &f->tensors[i], i))
			return -1;
	if (index_tensors(r, g))
		return -1;
	/* pos <= size and alignment is a power of two far below 2^63. */
	pad = (f->alignment - r->pos % f->alignment) % f->alignment;
	f->data_offset = r->pos + pad;
	if (f->data_offset > f->size) {
		/* Vocab-only files may end before the padding. */
		if (f->n_tensors == 0) {
			f->data_offset = f->size;
		} else {
			setctx(r, "data section");
			return fail(r, "starts at %" PRIu64 ", past end of file (%" PRIu64
				    " bytes)", f->data_offset, f->size);
		}
	}
	return place_tensors(r, g);
}

static struct gguf_file *open_buffer(const uint8_t *base, uint64_t size, bool mapped,
				     char *err, size_t errlen)
{
	struct gguf_priv *g = calloc(1, sizeof(*g));
	struct rd r = { .p = base, .size = size, .err = err, .errlen = errlen };

	if (!g) {
		loom_seterr(err, errlen, "out of memory");
		return NULL;
	}
	g->f.base = base;
	g->f.size = size;
	if (parse(&r, g)) {
		/* mapped stays false: the caller unmaps on failure. */
		gguf_close(&g->f);
		return NULL;
	}
	g->f.mapped = mapped;
	return &g->f;
}

struct gguf_file *gguf_open_memory(const void *data, size_t size, char *err,
				   size_t errlen)
{
	if (!data && size) {
		loom_seterr(err, errlen, "no data");
		return NULL;
	}
	return open_buffer(data ? data : (const uint8_t *)"", size, false, err, errlen);
}

struct gguf_file *gguf_open(const char *path, char *err, size_t errlen)
{
	struct gguf_file *f = NULL;
	struct stat st;
	void *map;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		loom_seterr(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st)) {
		loom_seterr(err, errlen, "%s: %s", path, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		loom_seterr(err, errlen, "%s: not a regular file", path);
		goto out_close;
	}
	if (st.st_size == 0) {
		loom_seterr(err, errlen, "%s: empty file", path);
		goto out_close;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		loom_seterr(err, errlen, "%s: mmap: %s", path, strerror(errno));
		goto out_close;
	}
	f = open_buffer(map, (uint64_t)st.st_size, true, err, errlen);
	if (!f)
		munmap(map, (size_t)st.st_size);
out_close:
	close(fd);
	return f;
}

void gguf_close(struct gguf_file *f)
{
	struct gguf_priv *g = (struct gguf_priv *)f;

	if (!f)
		return;
	if (f->kv)
		for (uint64_t i = 0; i < f->n_kv; i++)
			free(f->kv[i].arr_str);
	free(f->kv);
	free(f->tensors);
	free(g->kv_sorted);
	free(g->tensor_sorted);
	if (f->mapped)
		munmap((void *)f->base, f->size);
	free(g);
}

void gguf_release(const struct gguf_file *f, const void *p, size_t n)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo, hi;

	if (!f || !f->mapped || !p || page == 0 || page == (uintptr_t)-1)
		return;
	/* only the pages wholly inside [p, p + n) */
	lo = ((uintptr_t)p + page - 1) / page * page;
	hi = ((uintptr_t)p + n) / page * page;
	if (lo < hi && lo >= (uintptr_t)f->base && hi <= (uintptr_t)f->base + f->size)
		madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ---- lookups and typed accessors ---- */

const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key)
{
	if (!f || !key)
		return NULL;
	return find_key((const struct gguf_priv *)f, key);
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
	const struct gguf_priv *g = (const struct gguf_priv *)f;

	if (!f || !name)
		return NULL;
	return find_by_name(g->tensor_sorted, f->n_tensors, offsetof(struct gguf_tensor, name),
			    name);
}

static bool is_unsigned(uint32_t t)
{
	return t == GGUF_U8 || t == GGUF_U16 || t == GGUF_U32 || t == GGUF_U64;
}

static bool is_signed(uint32_t t)
{
	return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64;
}

/* "array of u32" or "u32": the type of a value, for messages. */
static void type_desc(const struct gguf_kv *kv, char *buf, size_t cap)
{
	if (kv->type == GGUF_ARRAY)
		snprintf(buf, cap, "array of %s", gguf_vtype_name(kv->arr_type));
	else
		snprintf(buf, cap, "%s", gguf_vtype_name(kv->type));
}

static int wrong_type(const struct gguf_kv *kv, const char *key, const char *want,
		      char *err, size_t errlen)
{
	char have[32];

	type_desc(kv, have, sizeof(have));
	loom_seterr(err, errlen, "key '%s': %s, expected %s", key, have, want);
	return -1;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out,
		 char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find(f, key);

	if (!kv)
		return 1;
	if (is_unsigned(kv->type)) {
		if (kv->v.u64 > UINT32_MAX)
			goto out_of_range;
		*out = (uint32_t)kv->v.u64;
		return 0;
	}
	if (is_signed(kv->type)) {
		if (kv->v.i64 < 0 || kv->v.i64 > (int64_t)UINT32_MAX)
			goto out_of_range;
		*out = (uint32_t)kv->v.i64;
		return 0;
	}
	return wrong_type(kv, key, "an integer", err, errlen);
out_of_range:
	if (is_signed(kv->type))
		loom_seterr(err, errlen, "key '%s': value %" PRId64 " is out of range for u32",
		       key, kv->v.i64);
	else
		loom_seterr(err, errlen, "key '%s': value %" PRIu64 " is out of range for u32",
		       key, kv->v.u64);
	return -1;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out,
		 char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find(f, key);

	if (!kv)
		return 1;
	if (kv->type != GGUF_F32 && kv->type != GGUF_F64)
		return wrong_type(kv, key, "f32", err, errlen);
	*out = (float)kv->v.f64;
	return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out,
		  char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find(f, key);

	if (!kv)
		return 1;
	if (kv->type != GGUF_BOOL)
		return wrong_type(kv, key, "bool", err, errlen);
	*out = kv->v.u64 != 0;
	return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, char **out,
		 char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find(f, key);
	char *s;

	if (!kv)
		return 1;
	if (kv->type != GGUF_STRING)
		return wrong_type(kv, key, "string", err, errlen);
	if (memchr(kv->v.str.ptr, 0, kv->v.str.len)) {
		loom_seterr(err, errlen, "key '%s': string contains a NUL byte", key);
		return -1;
	}
	/* len fits in size_t: the string lies inside the buffer. */
	s = malloc((size_t)kv->v.str.len + 1);
	if (!s) {
		loom_seterr(err, errlen, "key '%s': out of memory", key);
		return -1;
	}
	memcpy(s, kv->v.str.ptr, (size_t)kv->v.str.len);
	s[kv->v.str.len] = 0;
	*out = s;
	return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, uint32_t elem_type,
		 const struct gguf_kv **kvp, char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find(f, key);
	char want[32];

	if (!kv)
		return 1;
	if (kv->type != GGUF_ARRAY || kv->arr_type != elem_type) {
		snprintf(want, sizeof(want), "array of %s", gguf_vtype_name(elem_type));
		return wrong_type(kv, key, want, err, errlen);
	}
	*kvp = kv;
	return 0;
}
