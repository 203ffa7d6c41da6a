/* `loom serve`: Ollama's API (/api/chat, /api/generate, /api/tags,
 * /api/show) on the same engine requests as the OpenAI endpoints.
 *
 * An Ollama body is translated into the OpenAI body it means and parsed
 * by serve_req_parse_obj, so every check, limit and refusal of the OpenAI
 * path holds here too; what Ollama has and loom cannot honour is refused
 * by name (docs/SERVING.md, "Ollama's API"). The answer's shapes are
 * built here from plain values; serve_http.c sends them.
 */
#ifndef LOOM_SERVE_OLLAMA_H
#define LOOM_SERVE_OLLAMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve_request.h"

/* Parses an /api/chat (chat true) or /api/generate body into r, with
 * r->api set. 0: r holds the request; 1: a load request (no messages, or
 * an empty prompt), which generates nothing; -1 with e filled (Ollama's errors are {"error": msg}:
 * e->msg). r is empty unless 0 is returned. */
int ollama_parse(const struct serve_req_ctx *ctx, const char *body, size_t len, bool chat,
		 struct serve_req *r, struct perr *e);

/* "2026-11-28T04:59:01.123456789Z": now, as Ollama's created_at. */
void ollama_time(char *out, size_t cap);

/* The answer to a load request: {"model", "created_at", "response": ""
 * or "message", "done": true, "done_reason": "load"}. */
json_t *ollama_load_reply(const char *model, bool chat);

/* Timings of an answer, in seconds since the request arrived. */
struct ollama_stats {
	double total, first;  /* first: the first token (0: none came) */
	int prompt_tokens, eval_tokens;
	const char *done_reason; /* "stop" or "length" */
};

/* One answer object: a stream's chunk (done false: text or calls) or the
 * last object / the whole answer (done true, with the timings).
 * chat: {"message": {"role": "assistant", "content", "tool_calls"?}};
 * generate: {"response"}. calls: OpenAI tool_calls (borrowed), or NULL. */
json_t *ollama_answer(const char *model, bool chat, const char *text, size_t len,
		      json_t *calls, const struct ollama_stats *st);

/* What /api/tags and /api/show tell of the model. */
struct ollama_model {
	const char *const *names;   /* the names the server answers to */
	int n_names;
	const char *path;           /* the GGUF file */
	const char *metadata_json;  /* loom_engine_metadata_json's object */
	const char *quant;          /* e.g. "q4_1" */
	const char *template_src;   /* the chat template's source, or NULL */
	int32_t n_ctx;
};

/* GET /api/tags: {"models": [one per name]}. */
json_t *ollama_tags(const struct ollama_model *m);
/* POST /api/show {"model"} (or the older "name"): the model's details,
 * model_info, template and capabilities; NULL with e (404 for a name the
 * server does not answer to). */
json_t *ollama_show(const struct ollama_model *m, const char *body, size_t len,
		    struct perr *e);

#endif
