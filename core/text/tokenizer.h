/* Tokenizers built from GGUF metadata (internal to the core).
 *
 * tokenizer.ggml.model "llama": SentencePiece-style (scores, byte fallback
 * <0xXX>, optional space prefix, "▁" for spaces).
 * tokenizer.ggml.model "gpt2": byte-level BPE with merges, the pre-tokenizer
 * regexes chosen by tokenizer.ggml.pre (PCRE2 with Unicode properties).
 */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"

struct loom_tokenizer;

/* Builds from the tokenizer.* keys of f. NULL with a reason in err when
 * the metadata is missing, malformed or of an unsupported model. The
 * tokenizer copies what it needs; f may be closed afterwards. */
struct loom_tokenizer *loom_tokenizer_from_gguf(const struct gguf_file *f,
						char *err, size_t errlen);
void loom_tokenizer_free(struct loom_tokenizer *t);

/*
 * Encodes text[0..len). add_special: prepend BOS (and append EOS) as the
 * model's metadata asks (tokenizer.ggml.add_bos_token / add_eos_token).
 * parse_special: text such as "<|im_start|>" matching a control/user-defined
 * token becomes that token instead of being split.
 * Writes at most cap ids to out and returns the total number of ids the
 * text needs (call again with a larger buffer if > cap), or -1 on error.
 */
int64_t loom_tokenize(const struct loom_tokenizer *t, const char *text, size_t len,
		      bool add_special, bool parse_special, int32_t *out, int64_t cap);

/*
 * Streaming detokenizer: appends the bytes of `token` to a per-stream
 * pending buffer and returns in out (NUL-terminated, at most cap-1 bytes)
 * only complete UTF-8 text, holding back a trailing incomplete sequence
 * until the bytes that finish it arrive. Returns the number of bytes
 * written, or -1 if cap is too small or the id is out of range.
 * Control tokens (BOS/EOS...) produce no text.
 */
struct loom_detok {
	unsigned char pending[8];
	int n_pending;
	bool first; /* set true before the first token: spm strips a leading space */
};
int loom_detokenize(const struct loom_tokenizer *t, struct loom_detok *st,
		    int32_t token, char *out, size_t cap);
/* Text of one token as stored (for debugging), NUL-terminated copy. */
const char *loom_token_text(const struct loom_tokenizer *t, int32_t token);

int32_t loom_tokenizer_n_vocab(const struct loom_tokenizer *t);
int32_t loom_tokenizer_bos(const struct loom_tokenizer *t); /* -1 if none */
int32_t loom_tokenizer_eos(const struct loom_tokenizer *t); /* -1 if none */
/* True for end-of-generation tokens (EOS, EOT, <|im_end|>, <end_of_turn>...). */
bool loom_tokenizer_is_eog(const struct loom_tokenizer *t, int32_t token);

#endif /* LOOM_TOKENIZER_H */
