/* GGUF v2/v3 reader (internal to the core).
 *
 * The file is mapped read-only; keys, values and tensor data point into the
 * mapping and live until gguf_close(). Every count, length, dimension and
 * offset is bounds- and overflow-checked while opening, so accessors never
 * read outside the mapping. Errors are written to `err` as one line naming
 * the field at fault, e.g. "tensor 'blk.0.attn_q.weight': data ends past
 * end of file (offset 123 + 4096 > 2048)".
 */
#ifndef LOOM_GGUF_H
#define LOOM_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
	GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4,
	GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8,
	GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12,
	GGUF_VTYPE_COUNT
};

/* A string inside the mapping: not NUL-terminated. */
struct gguf_str {
	uint64_t len;
	const char *ptr;
};

struct gguf_kv {
	struct gguf_str key;
	uint32_t type; /* enum gguf_vtype */
	union {
		uint64_t u64; /* all unsigned integers and bool, widened */
		int64_t i64;  /* all signed integers, widened */
		double f64;   /* f32 and f64, widened */
		struct gguf_str str;
	} v;
	/* type == GGUF_ARRAY: */
	uint32_t arr_type;      /* element type; nested arrays are rejected */
	uint64_t arr_n;         /* element count */
	const void *arr_data;   /* raw little-endian elements (non-string) */
	struct gguf_str *arr_str; /* arr_n strings (string arrays only) */
};

#define GGUF_MAX_DIMS 4

struct gguf_tensor {
	struct gguf_str name;
	uint32_t n_dims;
	int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous dim; unused = 1 */
	uint32_t type;             /* ggml_type id (enum loom_type) */
	uint64_t offset;           /* relative to the data section */
	uint64_t nbytes;
	const void *data;          /* inside the mapping */
};

struct gguf_file {
	uint32_t version;
	uint64_t n_kv;
	struct gguf_kv *kv;
	uint64_t n_tensors;
	struct gguf_tensor *tensors;
	uint64_t alignment;
	uint64_t data_offset; /* start of the tensor data section */
	const uint8_t *base;  /* the mapping */
	uint64_t size;
	bool mapped;          /* base came from mmap (else caller's memory) */
};

/* Opens and validates. NULL on failure with the reason in err. */
struct gguf_file *gguf_open(const char *path, char *err, size_t errlen);
/* Same over memory the caller keeps alive until gguf_close (tests, fuzz). */
struct gguf_file *gguf_open_memory(const void *data, size_t size, char *err,
				   size_t errlen);
void gguf_close(struct gguf_file *f);
/* Tells the system the n bytes at p (inside the mapping) will not be read
 * soon, so their pages leave memory; they are read back from the file if
 * they are. Nothing for files opened from memory. */
void gguf_release(const struct gguf_file *f, const void *p, size_t n);

/* Geometry of a ggml type known to the reader (independent of which
 * formats have plugins). Returns false for an unknown type id. */
bool gguf_type_geometry(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);
const char *gguf_type_name(uint32_t type); /* "?" when unknown */
const char *gguf_vtype_name(uint32_t vtype);

const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/*
 * Typed accessors. Each returns 0 if the key is present with an acceptable
 * type and value, 1 if the key is absent (out untouched), and -1 with a
 * message naming the key in err if it is present but of the wrong type or
 * out of range. Integer getters accept any integer type whose value fits.
 */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out,
		 char *err, size_t errlen);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out,
		 char *err, size_t errlen); /* accepts f32/f64 */
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out,
		  char *err, size_t errlen);
/* Strings are copied NUL-terminated into a malloc'd buffer the caller frees;
 * an embedded NUL is an error. */
int gguf_get_str(const struct gguf_file *f, const char *key, char **out,
		 char *err, size_t errlen);
/* An array whose element type must be `elem_type`; *n gets the count and
 * *kv the entry (arr_data / arr_str hold the elements). */
int gguf_get_arr(const struct gguf_file *f, const char *key, uint32_t elem_type,
		 const struct gguf_kv **kv, char *err, size_t errlen);

#endif /* LOOM_GGUF_H */
