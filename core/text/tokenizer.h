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
#include "loom.h"

/* The tokenizer's public functions (loom_tokenize, loom_detokenize,
 * struct loom_detok, loom_tokenizer_is_eog, ...) are declared in loom.h. */

/* Builds from the tokenizer.* keys of f. NULL with a reason in err when
 * the metadata is missing, malformed or of an unsupported model. The
 * tokenizer copies what it needs; f may be closed afterwards. */
struct loom_tokenizer *loom_tokenizer_from_gguf(const struct gguf_file *f,
						char *err, size_t errlen);

/* For `loom info --archs`: the i-th tokenizer.ggml.model value loom reads
 * and (*kind) what it is; NULL past the end. */
const char *loom_tokenizer_model_name(size_t i, const char **kind);
/* The i-th pre-tokenizer family: its tokenizer.ggml.pre values,
 * space-separated (the first is "default"); NULL past the end. */
const char *loom_tokenizer_pre_family(size_t i);

/* Appended (grammar): the bytes token id detokenizes to (not
 * NUL-terminated; *len may be 0 for control tokens), or NULL for an id out
 * of range. SentencePiece's leading-space strip at the start of a stream
 * is not applied. */
const char *loom_tokenizer_piece(const struct loom_tokenizer *t, int32_t id, size_t *len);

/* Runs of at least this many characters merge through a queue of buckets
 * by priority instead of one heap (the same merges, cache-friendly on
 * megabyte runs). Tests set it to 0 or UINT32_MAX to compare the two. */
#define LOOM_TOKENIZER_BUCKET_MIN 1024
void loom_tokenizer_set_bucket_min(struct loom_tokenizer *t, uint32_t n);

#endif /* LOOM_TOKENIZER_H */
