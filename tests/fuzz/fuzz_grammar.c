/* libFuzzer: the grammar compiler (core/engine/grammar_json.c,
 * loom_grammar_new) and its matcher (core/engine/grammar.c).
 *
 * Byte 0 picks the kind (json_schema, tool_calls, json, json_object); the
 * input up to the first 0xff byte is the schema (or tools) text and the
 * bytes after it a text to feed. A refused schema must say why; a
 * compiled one runs a matcher over the GPT-2 vocabulary: the text is fed
 * byte by byte, the vocabulary masked, and the tokens the mask allows
 * pushed, each of which the matcher must then take.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar.h"
#include "fuzz_common.h"

static struct loom_tokenizer *tok;
static struct loom_gvocab *gvocab;
static float *logits;
static int32_t n_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	tok = fuzz_vocab("ggml-vocab-gpt-2.gguf");
	gvocab = loom_gvocab_new(tok);
	n_vocab = loom_tokenizer_n_vocab(tok);
	logits = malloc(sizeof(float) * (size_t)n_vocab);
	if (!gvocab || !logits)
		abort();
	return 0;
}

/* A token the last mask allowed, searched from a place chosen by seed;
 * -1 when none (or only end-of-generation). */
static int32_t allowed_token(unsigned seed)
{
	int32_t start = (int32_t)(seed % (unsigned)n_vocab);

	for (int32_t k = 0; k < n_vocab; k++) {
		int32_t t = (start + k) % n_vocab;

		if (!isinf(logits[t]) && !loom_tokenizer_is_eog(tok, t))
			return t;
	}
	return -1;
}

static void clear_logits(void)
{
	memset(logits, 0, sizeof(float) * (size_t)n_vocab);
}

/* Masks level 0, pushes a token it allows (which the matcher must take),
 * masks that new level and pushes again: two masks over the 50k tokens,
 * most of an input's time. */
static void mask_and_push(struct loom_gmatch *m, unsigned seed)
{
	for (int round = 0; round < 2; round++) {
		int32_t t;

		clear_logits();
		if (loom_gmatch_mask(m, loom_gmatch_levels(m), logits, n_vocab) < 0)
			abort();
		t = allowed_token(seed * 2654435761u + (unsigned)round);
		if (t < 0)
			break;
		if (loom_gmatch_push(m, t))
			abort(); /* the mask allowed it */
	}
	loom_gmatch_keep(m, loom_gmatch_levels(m));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const kinds[] = { "json_schema", "tool_calls", "json", "json_object" };
	const uint8_t *sep;
	size_t slen;
	struct loom_grammar *g;
	struct loom_gmatch *m;
	char err[512] = "";

	if (size < 1 || size > 8192)
		return 0;
	sep = memchr(data + 1, 0xff, size - 1);
	slen = sep ? (size_t)(sep - data - 1) : size - 1;
	g = loom_grammar_new(kinds[data[0] & 3], (const char *)data + 1, slen, err, sizeof(err));
	if (!g) {
		if (!err[0])
			abort(); /* a refusal names its reason */
		return 0;
	}
	m = loom_gmatch_new(g, gvocab);
	if (m) {
		if (sep)
			(void)loom_gmatch_feed(m, (const char *)sep + 1, size - slen - 2);
		mask_and_push(m, data[0]);
		loom_gmatch_free(m);
	}
	loom_grammar_free(g);
	return 0;
}
