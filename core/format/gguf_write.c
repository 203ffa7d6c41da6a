/* GGUF v3 writer (see gguf_write.h). Little-endian hosts only, as the
 * reader. */
#include "format/gguf_write.h"
#include "util.h"
#include "loom.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gguf_writer {
	struct loom_outfile *out; /* NULL: counting only */
	FILE *fp;         /* out's stream */
	uint64_t pos;
	uint64_t alignment;
	int failed;       /* errno of the first failed write, or 0 */
	char path[4096];
};

/* Bytes of one value of a non-string, non-array type (0 for those). */
static size_t value_size(uint32_t vtype)
{
	switch (vtype) {
	case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
	case GGUF_U16: case GGUF_I16: return 2;
	case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
	case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
	default: return 0;
	}
}

struct gguf_writer *gguf_writer_open(const char *path, uint32_t flags, uint64_t alignment,
				     char *err, size_t errlen)
{
	struct gguf_writer *w = calloc(1, sizeof(*w));

	if (!w) {
		loom_seterr(err, errlen, "out of memory");
		return NULL;
	}
	w->alignment = alignment ? alignment : 32;
	if (path) {
		snprintf(w->path, sizeof(w->path), "%s", path);
		w->out = loom_outfile_open(path, flags, err, errlen);
		if (!w->out) {
			free(w);
			return NULL;
		}
		w->fp = loom_outfile_stream(w->out);
		setvbuf(w->fp, NULL, _IOFBF, 1 << 20);
	}
	return w;
}

uint64_t gguf_writer_pos(const struct gguf_writer *w)
{
	return w->pos;
}

int gguf_write_bytes(struct gguf_writer *w, const void *p, size_t n, char *err, size_t errlen)
{
	if (w->fp && !w->failed && n && fwrite(p, 1, n, w->fp) != n)
		w->failed = errno ? errno : EIO;
	if (w->failed) {
		loom_seterr(err, errlen, "%s: write failed: %s", w->path, strerror(w->failed));
		return -1;
	}
	w->pos += n;
	return 0;
}

static int put_u32(struct gguf_writer *w, uint32_t v, char *err, size_t errlen)
{
	return gguf_write_bytes(w, &v, 4, err, errlen);
}

static int put_u64(struct gguf_writer *w, uint64_t v, char *err, size_t errlen)
{
	return gguf_write_bytes(w, &v, 8, err, errlen);
}

static int put_str(struct gguf_writer *w, const struct gguf_str *s, char *err, size_t errlen)
{
	if (put_u64(w, s->len, err, errlen))
		return -1;
	return gguf_write_bytes(w, s->ptr, (size_t)s->len, err, errlen);
}

int gguf_write_header(struct gguf_writer *w, uint64_t n_tensors, uint64_t n_kv, char *err,
		      size_t errlen)
{
	if (gguf_write_bytes(w, "GGUF", 4, err, errlen) || put_u32(w, 3, err, errlen) ||
	    put_u64(w, n_tensors, err, errlen))
		return -1;
	return put_u64(w, n_kv, err, errlen);
}

/* A scalar value, from the reader's widened fields. */
static int put_scalar(struct gguf_writer *w, const struct gguf_kv *kv, char *err, size_t errlen)
{
	unsigned char b[8];
	size_t n = value_size(kv->type);
	float f;

	if (kv->type == GGUF_STRING)
		return put_str(w, &kv->v.str, err, errlen);
	if (kv->type == GGUF_F32) {
		f = (float)kv->v.f64; /* exact: widened from a float */
		memcpy(b, &f, 4);
	} else if (kv->type == GGUF_F64) {
		memcpy(b, &kv->v.f64, 8);
	} else if (n) {
		memcpy(b, &kv->v.u64, n); /* little-endian: the low bytes */
	} else {
		loom_seterr(err, errlen, "key %.*s: cannot write value type %u",
			    (int)kv->key.len, kv->key.ptr, kv->type);
		return -1;
	}
	return gguf_write_bytes(w, b, n, err, errlen);
}

static int put_array(struct gguf_writer *w, const struct gguf_kv *kv, char *err, size_t errlen)
{
	size_t n = value_size(kv->arr_type);

	if (put_u32(w, kv->arr_type, err, errlen) || put_u64(w, kv->arr_n, err, errlen))
		return -1;
	if (kv->arr_type == GGUF_STRING) {
		for (uint64_t i = 0; i < kv->arr_n; i++)
			if (put_str(w, &kv->arr_str[i], err, errlen))
				return -1;
		return 0;
	}
	if (!n) {
		loom_seterr(err, errlen, "key %.*s: cannot write arrays of type %u",
			    (int)kv->key.len, kv->key.ptr, kv->arr_type);
		return -1;
	}
	/* the reader bounds-checked arr_n * n against the file */
	return gguf_write_bytes(w, kv->arr_data, (size_t)kv->arr_n * n, err, errlen);
}

int gguf_write_kv(struct gguf_writer *w, const struct gguf_kv *kv, char *err, size_t errlen)
{
	if (put_str(w, &kv->key, err, errlen) || put_u32(w, kv->type, err, errlen))
		return -1;
	if (kv->type == GGUF_ARRAY)
		return put_array(w, kv, err, errlen);
	return put_scalar(w, kv, err, errlen);
}

int gguf_write_kv_u32(struct gguf_writer *w, const char *key, uint32_t value, char *err,
		      size_t errlen)
{
	struct gguf_kv kv = {
		.key = { .len = strlen(key), .ptr = key },
		.type = GGUF_U32,
		.v.u64 = value,
	};

	return gguf_write_kv(w, &kv, err, errlen);
}

int gguf_write_tensor_info(struct gguf_writer *w, const struct gguf_str *name, uint32_t n_dims,
			   const int64_t *ne, uint32_t type, uint64_t offset, char *err,
			   size_t errlen)
{
	if (put_str(w, name, err, errlen) || put_u32(w, n_dims, err, errlen))
		return -1;
	for (uint32_t i = 0; i < n_dims; i++)
		if (put_u64(w, (uint64_t)ne[i], err, errlen))
			return -1;
	if (put_u32(w, type, err, errlen))
		return -1;
	return put_u64(w, offset, err, errlen);
}

int gguf_write_pad(struct gguf_writer *w, char *err, size_t errlen)
{
	static const unsigned char zeros[256];
	uint64_t pad = (w->alignment - w->pos % w->alignment) % w->alignment;

	while (pad) {
		size_t n = pad < sizeof(zeros) ? (size_t)pad : sizeof(zeros);

		if (gguf_write_bytes(w, zeros, n, err, errlen))
			return -1;
		pad -= n;
	}
	return 0;
}

int gguf_writer_close(struct gguf_writer *w, char *err, size_t errlen)
{
	int rc = 0;

	if (w->failed) {
		loom_seterr(err, errlen, "%s: write failed: %s", w->path, strerror(w->failed));
		loom_outfile_discard(w->out);
		rc = -1;
	} else if (w->out) {
		rc = loom_outfile_commit(w->out, err, errlen);
	}
	free(w);
	return rc;
}

void gguf_writer_discard(struct gguf_writer *w)
{
	if (!w)
		return;
	loom_outfile_discard(w->out);
	free(w);
}

bool gguf_next_offset(uint64_t offset, uint64_t nbytes, uint64_t alignment, uint64_t *next)
{
	uint64_t end = offset + nbytes;

	if (end < offset || end > UINT64_MAX - alignment)
		return false;
	*next = (end + alignment - 1) / alignment * alignment;
	return true;
}
