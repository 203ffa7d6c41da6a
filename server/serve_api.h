/* `loom serve`: JSON for log-probabilities, embeddings, /tokenize and
 * /detokenize (serve_api.c). */
#ifndef LOOM_SERVE_API_H
#define LOOM_SERVE_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "serve_request.h"

/* Bytes as a JSON string, with U+FFFD for bytes that are not UTF-8. */
json_t *api_text_json(const char *s, size_t n);

/* One token's logprob item from e[0] (the token) and e[1..n_top] (the
 * most likely): {"token", "logprob", "bytes", "top_logprobs": [...],
 * "text_offset"}. logprob NAN (the first prompt token) is null, and so
 * are its top_logprobs. */
json_t *api_lp_item(const struct loom_tokenizer *tok, const struct loom_token_logprob *e,
		    int n_top, size_t offset);
/* A chat choice's "logprobs": {"content": items without text_offset,
 * "refusal": null}. */
json_t *api_chat_logprobs(json_t *items);
/* A completion choice's "logprobs": {"tokens", "token_logprobs",
 * "top_logprobs": [{text: logprob}], "text_offset"}. */
json_t *api_completion_logprobs(json_t *items);

/* Pools n rows of d floats (mean, or the first or last row) into out and
 * normalizes it to length 1. 0, or -1 when the result has no length. */
int api_pool(const float *rows, int32_t n, int32_t d, enum loom_pooling pooling, float *out);
/* {"object": "embedding", "index", "embedding": floats or base64}. */
json_t *api_embedding_item(int index, const float *v, int32_t d, bool base64);

/* llama-server's /tokenize ({content, add_special, with_pieces} ->
 * {tokens}) and /detokenize ({tokens} -> {content}); NULL with e filled. */
json_t *api_tokenize(const struct loom_tokenizer *tok, const char *body, size_t len,
		     struct perr *e);
json_t *api_detokenize(const struct loom_tokenizer *tok, const char *body, size_t len,
		       struct perr *e);

#endif
