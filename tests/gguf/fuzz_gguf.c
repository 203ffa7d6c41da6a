/* libFuzzer target for gguf_open_memory (tests/fuzz builds it with clang and
 * runs it over tests/fuzz/corpus/gguf; by hand:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Icore -Iinclude \
 *         tests/gguf/fuzz_gguf.c core/format/gguf.c -o fuzz_gguf
 *   ./fuzz_gguf -max_total_time=60 CORPUS_DIR
 *
 * An accepted file has every key, string, array and tensor touched so a
 * bad pointer or length faults under ASan.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"

static unsigned touch(const struct gguf_file *f)
{
	unsigned sum = 0;
	char key[64];

	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct gguf_kv *kv = &f->kv[i];
		sum += (unsigned char)kv->key.ptr[kv->key.len - 1];
		if (kv->key.len < sizeof(key)) {
			memcpy(key, kv->key.ptr, kv->key.len);
			key[kv->key.len] = 0;
			if (gguf_find(f, key) != kv)
				abort();
		}
		if (kv->type == GGUF_STRING && kv->v.str.len)
			sum += (unsigned char)kv->v.str.ptr[kv->v.str.len - 1];
		if (kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING)
			for (uint64_t j = 0; j < kv->arr_n; j++)
				if (kv->arr_str[j].len)
					sum += (unsigned char)kv->arr_str[j].ptr[kv->arr_str[j].len - 1];
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		if (t->nbytes)
			sum += ((const uint8_t *)t->data)[t->nbytes - 1];
	}
	return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	struct gguf_file *f = gguf_open_memory(data, size, err, sizeof(err));
	volatile unsigned sink;

	if (f) {
		sink = touch(f);
		(void)sink;
		gguf_close(f);
	}
	return 0;
}
