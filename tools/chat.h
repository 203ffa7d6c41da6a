/* loom chat (tools/chat.c). */
#ifndef LOOM_CHAT_H
#define LOOM_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "options.h"

/* Reads a whole file ("-": stdin) as a NUL-terminated string (tools/loom.c);
 * NULL with err naming the file. */
char *loom_read_text(const char *path, size_t *len, char *err, size_t errlen);

/* Runs the conversation until /exit, the end of input or a second Ctrl-C at
 * the prompt. seed: the first reply's; each later reply takes the next.
 * 0, or -1 with err set. */
int loom_chat_main(struct loom_options *o, uint64_t seed, char *err, size_t errlen);

#endif
