/* `loom serve`: request parsing (see serve_json.c). */
#ifndef LOOM_SERVE_JSON_H
#define LOOM_SERVE_JSON_H

#include <jansson.h>

#include "serve_int.h"

/* An HTTP error in OpenAI's shape: status, message, param, code. */
struct perr {
	int status;
	char msg[512];
	char param[64];  /* "" for none */
	const char *code; /* NULL for none */
};

/* Fills e; returns -1 so callers can `return perr_set(...)`. */
int perr_set(struct perr *e, int status, const char *param, const char *code,
	     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Parses a /v1/completions (chat false) or /v1/chat/completions body into
 * j: sampling, stop strings, stream, n, the tokenized prompt, max_tokens.
 * 0, or -1 with e filled. */
int parse_request(struct job *j, const char *body, size_t len, bool chat, struct perr *e);

#endif
