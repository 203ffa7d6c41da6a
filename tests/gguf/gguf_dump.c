/* gguf_dump: prints what core/format/gguf.c reads from a GGUF file, one record a
 * line, for compare_gguf.py to check against the gguf Python package.
 *
 *   gguf_dump FILE    H version n_kv n_tensors data_offset alignment
 *                     K key vtype arr_type arr_n value
 *                     S key index hex            (each string-array element)
 *                     A key hex                  (raw bytes of other arrays)
 *                     T name type ne0,ne1,.. offset nbytes
 *   gguf_dump --types Y id name block_elems block_bytes  (known ids < 64)
 *
 * Fields are tab-separated; keys, names and string values are hex-encoded
 * so any byte survives.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "format/gguf.h"

static void hex(const struct gguf_str *s)
{
	if (s->len == 0)
		putchar('-');
	for (uint64_t i = 0; i < s->len; i++)
		printf("%02x", (unsigned char)s->ptr[i]);
}

static void value(const struct gguf_kv *kv)
{
	switch (kv->type) {
	case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64: case GGUF_BOOL:
		printf("%" PRIu64, kv->v.u64);
		break;
	case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
		printf("%" PRId64, kv->v.i64);
		break;
	case GGUF_F32: case GGUF_F64:
		printf("%.17g", kv->v.f64);
		break;
	case GGUF_STRING:
		hex(&kv->v.str);
		break;
	default:
		putchar('-');
	}
}

static void dump_kv(const struct gguf_kv *kv)
{
	putchar('K');
	putchar('\t');
	hex(&kv->key);
	printf("\t%u\t%u\t%" PRIu64 "\t", kv->type,
	       kv->type == GGUF_ARRAY ? kv->arr_type : 0,
	       kv->type == GGUF_ARRAY ? kv->arr_n : 0);
	value(kv);
	putchar('\n');
	if (kv->type != GGUF_ARRAY)
		return;
	if (kv->arr_type != GGUF_STRING) {
		struct gguf_str raw;
		uint32_t esz = kv->arr_type == GGUF_U8 || kv->arr_type == GGUF_I8 ||
			       kv->arr_type == GGUF_BOOL ? 1 :
			       kv->arr_type == GGUF_U16 || kv->arr_type == GGUF_I16 ? 2 :
			       kv->arr_type == GGUF_U64 || kv->arr_type == GGUF_I64 ||
			       kv->arr_type == GGUF_F64 ? 8 : 4;
		raw.len = kv->arr_n * esz;
		raw.ptr = kv->arr_data;
		putchar('A');
		putchar('\t');
		hex(&kv->key);
		putchar('\t');
		hex(&raw);
		putchar('\n');
		return;
	}
	for (uint64_t i = 0; i < kv->arr_n; i++) {
		putchar('S');
		putchar('\t');
		hex(&kv->key);
		printf("\t%" PRIu64 "\t", i);
		hex(&kv->arr_str[i]);
		putchar('\n');
	}
}

static void dump_tensor(const struct gguf_tensor *t)
{
	putchar('T');
	putchar('\t');
	hex(&t->name);
	printf("\t%u\t", t->type);
	for (uint32_t d = 0; d < t->n_dims; d++)
		printf("%s%" PRId64, d ? "," : "", t->ne[d]);
	printf("\t%" PRIu64 "\t%" PRIu64 "\n", t->offset, t->nbytes);
}

int main(int argc, char **argv)
{
	char err[512];
	struct gguf_file *f;

	if (argc != 2) {
		fprintf(stderr, "usage: gguf_dump FILE | --types\n");
		return 2;
	}
	if (strcmp(argv[1], "--types") == 0) {
		for (uint32_t t = 0; t < 64; t++) {
			uint32_t be, bb;
			if (gguf_type_geometry(t, &be, &bb))
				printf("Y\t%u\t%s\t%u\t%u\n", t, gguf_type_name(t), be, bb);
		}
		return 0;
	}
	f = gguf_open(argv[1], err, sizeof(err));
	if (!f) {
		fprintf(stderr, "gguf_dump: %s\n", err);
		return 1;
	}
	printf("H\t%u\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\n", f->version,
	       f->n_kv, f->n_tensors, f->data_offset, f->alignment);
	for (uint64_t i = 0; i < f->n_kv; i++)
		dump_kv(&f->kv[i]);
	for (uint64_t i = 0; i < f->n_tensors; i++)
		dump_tensor(&f->tensors[i]);
	gguf_close(f);
	return 0;
}
