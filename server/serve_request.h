/* `loom serve`: an OpenAI request body, parsed and checked.
 *
 * A pure function of its inputs: what it needs from the model comes in a
 * read-only struct serve_req_ctx (sizes, limits, callbacks to render chat
 * messages and to tokenize), what it finds goes out in a plain struct
 * serve_req. It sees no server, job or engine, so tests/serve/test_request.c
 * drives it with fake callbacks. The server turns a serve_req into a job.
 */
#ifndef LOOM_SERVE_REQUEST_H
#define LOOM_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "loom.h"

#define SERVE_REQ_MAX_N 8         /* choices per request */
#define SERVE_REQ_MAX_STOP 4      /* stop strings per request */
#define SERVE_REQ_MAX_STOP_LEN 256
#define SERVE_REQ_MAX_PROMPTS 32  /* prompts in a prompt array (or embeddings input) */
#define SERVE_REQ_MAX_CHOICES 64  /* prompts x n */

/* An HTTP error in OpenAI's shape: status, message, param, code. */
struct perr {
	int status;
	char msg[512];
	char param[64];   /* "" for none */
	const char *code; /* NULL for none */
};

/* Fills e; returns -1 so callers can `return perr_set(...)`. */
int perr_set(struct perr *e, int status, const char *param, const char *code,
	     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A present, non-null member of o, or NULL (OpenAI clients send nulls for
 * unset options). */
json_t *req_member(json_t *o, const char *key);
/* o's boolean `key` into *out when present; 400 "invalid_type" otherwise. */
int req_get_bool(json_t *o, const char *key, bool *out, struct perr *e);

/* One chat message, as the render callback sees it. */
struct serve_msg {
	const char *role;
	const char *content;
};

struct serve_req_ctx {
	int32_t n_vocab;   /* token ids in a prompt lie in [0, n_vocab) */
	int32_t n_ctx;     /* prompt + max_tokens must fit in it */
	int max_n;         /* choices per request, <= SERVE_REQ_MAX_N */
	int max_stop;      /* stop strings per request, <= SERVE_REQ_MAX_STOP */
	/* Tokenizes text, special-token text included; add_special adds BOS/EOS
	 * as the model asks. Returns how many ids the text needs (writes at most
	 * cap), or -1; past n_ctx it may stop counting and return any number
	 * above n_ctx. */
	int64_t (*tokenize)(void *user, const char *text, size_t len, bool add_special,
			    int32_t *ids, int64_t cap);
	/* Renders chat messages into prompt text ending in the assistant's turn:
	 * malloc'd text the parser frees, or NULL with why filled (a 400).
	 * NULL: the model has no usable chat template, and chat requests fail
	 * with a 500 that quotes chat_err. */
	char *(*render)(void *user, const struct serve_msg *msgs, size_t n, char *why,
			size_t whylen);
	const char *chat_err;
	int32_t chat_bos;  /* prepended to a rendered chat prompt; -1: none */
	void *user;        /* for the callbacks */
	/* the speculative strategies offered, and the one for requests that
	 * name none (one of spec_names, or NULL: plain decoding) */
	const char *const *spec_names;
	int n_spec;
	const char *spec_default;
	/* appended: renders and tokenizes chat messages so that only the
	 * template's markup becomes special tokens (message text never does):
	 * malloc'd ids the parser frees, their number in *n; NULL with why
	 * filled (a 400), or NULL with *n above n_ctx when the chat needs more
	 * (counting may stop there). NULL callback: render + tokenize above. */
	int32_t *(*render_ids)(void *user, const struct serve_msg *msgs, size_t n,
			       int64_t *n_ids, char *why, size_t whylen);
	/* appended: the names a request's "model" may give (another is a 404
	 * model_not_found); n_model_names 0: any name */
	const char *const *model_names;
	int n_model_names;
	/* appended (tools): renders a chat that has tools or tool calls
	 * (requests with tools, or a history holding calls and results):
	 * MESSAGES_JSON the messages as transformers passes them (tool call
	 * arguments as objects), TOOLS_JSON the tools or NULL; as render_ids
	 * otherwise. NULL, or template_tools false: such chats go through
	 * render_ids with tools as a system-prompt section of loom's and calls
	 * and results rewritten as text (serve_tool_history). */
	int32_t *(*render_json)(void *user, const char *messages_json, const char *tools_json,
				int64_t *n_ids, char *why, size_t whylen);
	bool template_tools; /* the tool template presents tools in tool_format */
	int tool_format;     /* enum serve_tool_format the tool template asks for */
};

struct serve_req {
	bool chat, stream, include_usage;
	int n;                          /* choices */
	int max_tokens;
	struct loom_sampler_params sp;  /* loom_sampler_defaults for fields not given */
	bool seed_given;                /* false: sp.seed is 0; pick a fresh one */
	const char *spec;               /* one of ctx->spec_names; NULL: plain decoding */
	int spec_max_draft;             /* 0: the strategy's */
	char *stop[SERVE_REQ_MAX_STOP]; /* malloc'd, non-empty */
	int n_stop;
	int32_t *prompt;                /* prompts[0] (owned there once parsed) */
	int32_t n_prompt;
	/* ---- appended (gram): structured output and tools (serve_tools.h) ---- */
	struct loom_grammar *grammar;   /* owned; NULL: unconstrained */
	int tool_mode;                  /* enum serve_tool_mode */
	/* ---- appended (api) ---- */
	bool logprobs;                  /* chat: logprobs true; completions: logprobs N */
	int top_logprobs;               /* 0..LOOM_MAX_TOP_LOGPROBS */
	bool echo;                      /* completions: the prompt comes back first */
	int n_prompts;                  /* a prompt array's prompts (else 1); choices
					   are prompt-major: prompt i, sample k is
					   choice i * n + k */
	int32_t *prompts[SERVE_REQ_MAX_PROMPTS]; /* malloc'd token ids */
	int32_t prompt_lens[SERVE_REQ_MAX_PROMPTS];
	/* ---- appended (ollama) ---- */
	int api;                        /* enum serve_api: the shape of the answer */
	int tool_format;                /* enum serve_tool_format of the calls */
};

/* Which API a request came through, so the answer takes its shape. */
enum serve_api {
	SERVE_API_OPENAI = 0,
	SERVE_API_OLLAMA_CHAT,      /* /api/chat */
	SERVE_API_OLLAMA_GENERATE,  /* /api/generate */
};

/* A /v1/embeddings body: its inputs as token ids. */
struct serve_embed_req {
	int n_inputs;
	int32_t *inputs[SERVE_REQ_MAX_PROMPTS]; /* malloc'd */
	int32_t input_lens[SERVE_REQ_MAX_PROMPTS];
	bool base64;                    /* encoding_format "base64" */
};

/* Parses a /v1/embeddings body (input: a string, an array of strings, an
 * array of token ids or an array of such arrays). 0; or -1 with e filled
 * and r freed. */
int serve_embed_parse(const struct serve_req_ctx *ctx, const char *body, size_t len,
		      struct serve_embed_req *r, struct perr *e);
void serve_embed_free(struct serve_embed_req *r);

/* Parses a /v1/completions (chat false) or /v1/chat/completions body into
 * r. 0; or -1 with e filled, r freed and zeroed. On success the caller owns
 * r's strings and prompt: serve_req_free, or take them. */
int serve_req_parse(const struct serve_req_ctx *ctx, const char *body, size_t len,
		    bool chat, struct serve_req *r, struct perr *e);
void serve_req_free(struct serve_req *r);
/* As serve_req_parse, from a parsed body o (borrowed). until_full: a
 * request without max_tokens generates until the context is full (chat
 * requests always do; this makes completions do so too). */
int serve_req_parse_obj(const struct serve_req_ctx *ctx, json_t *o, bool chat, bool until_full,
			struct serve_req *r, struct perr *e);

#endif
