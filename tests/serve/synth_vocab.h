/* A byte-level BPE vocabulary built as GGUF in memory, for the serve tests:
 * ids 0..255 are the 256 byte symbols (no merges, so plain text is one
 * token per byte), then the extra tokens given, with their token types
 * (1 normal, 3 control, 4 user-defined). */
#ifndef LOOM_TEST_SYNTH_VOCAB_H
#define LOOM_TEST_SYNTH_VOCAB_H

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "text/tokenizer.h"

struct gb {
	unsigned char *p;
	size_t n, cap;
	uint64_t n_kv;
};

static void gb_raw(struct gb *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 256;
		b->p = realloc(b->p, b->cap);
		ck_assert_ptr_nonnull(b->p);
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void gb_u32(struct gb *b, uint32_t v) { gb_raw(b, &v, 4); }
static void gb_u64(struct gb *b, uint64_t v) { gb_raw(b, &v, 8); }

static void gb_str(struct gb *b, const char *s)
{
	gb_u64(b, strlen(s));
	gb_raw(b, s, strlen(s));
}

/* A key and its type; an array's element type and length follow. */
static void gb_key(struct gb *b, const char *key, uint32_t type)
{
	gb_str(b, key);
	gb_u32(b, type);
	b->n_kv++;
}

/* GPT-2's printable stand-in for a byte, written out for the tests. */
static void byte_char(int byte, char out[3])
{
	int n = 0, cp = byte;

	if (!((byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174)) {
		for (int b = 0; b < byte; b++)
			if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

static struct loom_tokenizer *synth_vocab(const char *const *extra, const int32_t *types,
					  size_t n_extra)
{
	static char bytes[256][3];
	size_t n = 256 + n_extra, i;
	struct gb b = { 0 }, h = { 0 };
	struct gguf_file *f;
	struct loom_tokenizer *t;
	char err[256] = "";

	gb_key(&b, "tokenizer.ggml.model", GGUF_STRING);
	gb_str(&b, "gpt2");
	gb_key(&b, "tokenizer.ggml.tokens", GGUF_ARRAY);
	gb_u32(&b, GGUF_STRING);
	gb_u64(&b, n);
	for (i = 0; i < n; i++) {
		if (i < 256)
			byte_char((int)i, bytes[i]);
		gb_str(&b, i < 256 ? bytes[i] : extra[i - 256]);
	}
	gb_key(&b, "tokenizer.ggml.token_type", GGUF_ARRAY);
	gb_u32(&b, GGUF_I32);
	gb_u64(&b, n);
	for (i = 0; i < n; i++)
		gb_u32(&b, i < 256 ? 1 : (uint32_t)types[i - 256]);
	gb_key(&b, "tokenizer.ggml.merges", GGUF_ARRAY);
	gb_u32(&b, GGUF_STRING);
	gb_u64(&b, 0);
	gb_raw(&h, "GGUF", 4);
	gb_u32(&h, 3);
	gb_u64(&h, 0);
	gb_u64(&h, b.n_kv);
	gb_raw(&h, b.p, b.n);
	free(b.p);
	f = gguf_open_memory(h.p, h.n, err, sizeof(err));
	ck_assert_msg(f != NULL, "synthetic gguf: %s", err);
	t = loom_tokenizer_from_gguf(f, err, sizeof(err));
	ck_assert_msg(t != NULL, "synthetic tokenizer: %s", err);
	gguf_close(f);
	free(h.p);
	return t;
}

#endif
