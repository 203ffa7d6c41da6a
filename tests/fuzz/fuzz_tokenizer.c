/* libFuzzer: the tokenizers (core/text/tokenizer.c) on arbitrary bytes.
 *
 * Byte 0 picks the vocabulary (GPT-2 byte-level BPE or llama SentencePiece)
 * and the flags (add_special, parse_special, marked); the rest is the
 * text. Each id must lie in the vocabulary, the count must not depend on
 * the buffer given, and the streaming detokenizer must take every id. For
 * byte-level BPE without special-token parsing, detokenizing gives back
 * the text exactly (every byte has a token). Every input also runs through
 * the queue of buckets that long runs merge with, for the same ids.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "text/tokenizer.h"

static struct loom_tokenizer *bpe, *spm;
/* The same vocabularies with every word merged through the queue of
 * buckets (long runs' path): the ids must equal the heap's. */
static struct loom_tokenizer *bpe_b, *spm_b;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	bpe = fuzz_vocab("ggml-vocab-gpt-2.gguf");
	spm = fuzz_vocab("ggml-vocab-llama-spm.gguf");
	bpe_b = fuzz_vocab("ggml-vocab-gpt-2.gguf");
	spm_b = fuzz_vocab("ggml-vocab-llama-spm.gguf");
	loom_tokenizer_set_bucket_min(bpe, UINT32_MAX);
	loom_tokenizer_set_bucket_min(spm, UINT32_MAX);
	loom_tokenizer_set_bucket_min(bpe_b, 0);
	loom_tokenizer_set_bucket_min(spm_b, 0);
	return 0;
}

/* ids equal those of the bucket-queue twin of t */
static void check_buckets(const struct loom_tokenizer *t, const char *text, size_t len,
			  const unsigned char *markup, bool add, bool parse,
			  const int32_t *ids, int64_t n)
{
	const struct loom_tokenizer *tb = t == spm ? spm_b : bpe_b;
	int32_t *got = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
	int64_t m = markup ? loom_tokenize_marked(tb, text, len, markup, add, got, n)
			   : loom_tokenize(tb, text, len, add, parse, got, n);

	if (m != n || memcmp(got, ids, sizeof(int32_t) * (size_t)n))
		abort();
	free(got);
}

/* Detokenizes ids into a malloc'd string of *len bytes. */
static char *detok_all(const struct loom_tokenizer *t, const int32_t *ids, int64_t n,
		       size_t *len)
{
	struct loom_detok st = { .first = true };
	char piece[1024];
	size_t cap = 64, k = 0;
	char *s = malloc(cap);

	for (int64_t i = 0; i < n; i++) {
		int m = loom_detokenize(t, &st, ids[i], piece, sizeof(piece));

		if (m < 0)
			abort(); /* an id the tokenizer gave must detokenize */
		if (k + (size_t)m + 1 > cap) {
			cap = 2 * (k + (size_t)m + 1);
			s = realloc(s, cap);
		}
		memcpy(s + k, piece, (size_t)m);
		k += (size_t)m;
	}
	*len = k;
	return s;
}

static bool valid_utf8(const unsigned char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		unsigned c = s[i], need = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 :
			     (c >> 3) == 30 ? 3 : 9;
		uint32_t cp = need == 0 ? c : need == 1 ? c & 0x1f : need == 2 ? c & 0x0f : c & 0x07;

		if (need == 9 || i + need >= n)
			return false;
		for (unsigned k = 1; k <= need; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + k] & 0x3f);
		}
		if ((need == 1 && cp < 0x80) || (need == 2 && cp < 0x800) ||
		    (need == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += need + 1;
	}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct loom_tokenizer *t;
	const char *text = (const char *)data + 1;
	size_t len = size ? size - 1 : 0;
	bool add, parse, marked;
	unsigned char *markup = NULL;
	int32_t *ids, small[4];
	int64_t n, again;

	if (!size)
		return 0;
	t = data[0] & 1 ? spm : bpe;
	add = data[0] & 2;
	parse = data[0] & 4;
	marked = data[0] & 8;
	if (marked) { /* the template wrote the bytes whose bit 6 is clear */
		markup = malloc(len ? len : 1);
		for (size_t i = 0; i < len; i++)
			markup[i] = !(data[1 + i] & 0x40);
		n = loom_tokenize_marked(t, text, len, markup, add, NULL, 0);
	} else {
		n = loom_tokenize(t, text, len, add, parse, NULL, 0);
	}
	if (n < 0) {
		free(markup);
		return 0;
	}
	ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
	again = marked ? loom_tokenize_marked(t, text, len, markup, add, ids, n)
		       : loom_tokenize(t, text, len, add, parse, ids, n);
	if (again != n)
		abort(); /* the count does not depend on the buffer */
	/* a short buffer gets a prefix and the same count */
	if ((marked ? loom_tokenize_marked(t, text, len, markup, add, small, 4)
		    : loom_tokenize(t, text, len, add, parse, small, 4)) != n ||
	    memcmp(small, ids, sizeof(int32_t) * (size_t)(n < 4 ? n : 4)))
		abort();
	for (int64_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= loom_tokenizer_n_vocab(t))
			abort();
	check_buckets(t, text, len, markup, add, parse, ids, n);
	size_t dlen;
	char *back = detok_all(t, ids, n, &dlen);

	if (t == bpe && !add && !parse && !marked && valid_utf8(data + 1, len) &&
	    (dlen != len || memcmp(back, text, len)))
		abort(); /* byte-level BPE gives the text back */
	free(back);
	free(ids);
	free(markup);
	return 0;
}
