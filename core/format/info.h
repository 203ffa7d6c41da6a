/* `loom info`: a human-readable summary of a GGUF file (internal). */
#ifndef LOOM_INFO_H
#define LOOM_INFO_H

#include <stddef.h>
#include <stdio.h>

/* Prints GGUF version, architecture, the architecture's hyperparameters
 * (context length, embedding length, layers, heads, KV heads, FFN length,
 * RoPE base/dims/scaling, norm eps, vocab size), tokenizer model and vocab
 * size, and tensor counts and bytes by type. Works on vocab-only files.
 * 0, or -1 with the reason in err. */
int loom_info_print(const char *path, FILE *out, char *err, size_t errlen);

#endif
