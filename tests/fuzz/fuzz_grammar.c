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

/* Masks level 0 and pushes up to three allowed tokens (chosen by seed),
 * each of which the matcher must accept. */
static void mask_and_push(struct loom_gmatch *m, unsigned seed)
{
	int32_t allowed, pushed = 0;

	for (int32_t i = 0; i < n_vocab; i++)
		logits[i] = 0.0f;
	allowed = loom_gmatch_mask(m, 0, logits, n_vocab);
	if (allowed < 0)
		abort();
	for (int32_t i = (int32_t)(seed % 997); i < n_vocab && pushed < 3; i += 1 + (int32_t)(seed % 5003)) {
		if (isinf(logits[i]) || loom_tokenizer_is_eog(tok, i))
			continue;
		if (loom_gmatch_push(m, i))
			abort(); /* the mask allowed it */
		pushed++;
		/* the deepest level's mask, to exercise the lookahead levels */
		if (loom_gmatch_mask(m, loom_gmatch_levels(m), logits, n_vocab) < 0)
			abort();
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
