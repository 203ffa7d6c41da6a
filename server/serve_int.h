/* Internals of `loom serve` shared by its source files.
 *
 * The server is a client of the public API (include/loom.h) only.
 *
 * Threads: MHD runs a few event-loop threads (--http-threads, epoll); one
 * engine thread runs loom_engine_run; a deadline thread (serve_http.c)
 * enforces header and body deadlines. A request (struct job) holds one
 * struct gen per choice (n); each gen is one engine request. The event
 * callback (engine thread) appends tokens to the gen under the job's mutex
 * and resumes the connection parked on the job (job_park); the HTTP
 * handler then detokenizes, matches stop strings and writes the response,
 * or parks again. No handler blocks.
 */
#ifndef LOOM_SERVE_INT_H
#define LOOM_SERVE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "options.h"
#include "serve_ollama.h"
#include "serve_request.h"
#include "srv_util.h"

#define SRV_MAX_N SERVE_REQ_MAX_CHOICES /* choices per request (prompts x n) */
#define SRV_MAX_STOP SERVE_REQ_MAX_STOP /* stop strings per request */
#define SRV_MAX_SPEC 8  /* speculative strategies a server offers */
#define SRV_MAX_NAMES 32 /* model names: the file's and its aliases */

/* ---- metrics ---- */

#define HIST_MAX 16

struct hist {
	int n;
	double bounds[HIST_MAX];
	uint64_t counts[HIST_MAX + 1]; /* the last is +Inf */
	double sum;
	uint64_t total;
};

struct metrics {
	pthread_mutex_t mu;
	struct hist ttft, itl;
	uint64_t by_status[600];
	uint64_t rejected; /* 503s: queue full or draining */
};

void metrics_init(struct metrics *m);
void metrics_observe(struct metrics *m, struct hist *h, double v);
void metrics_count_status(struct metrics *m, unsigned status);
void metrics_count_rejected(struct metrics *m);

/* ---- the server ---- */

enum srv_state { SRV_LOADING, SRV_READY, SRV_DRAINING };

struct job;

struct server {
	struct loom_options o;   /* tools/options.h: o.serve holds the server's own */
	struct loom_engine *engine;
	const struct loom_tokenizer *tok; /* the engine's */
	/* speculative strategies offered (--spec=a.so,b.so), loaded with
	 * the engine; names live as long as it does */
	const char *spec_names[SRV_MAX_SPEC];
	int n_spec;
	const char *spec_default; /* NULL: plain decoding */
	struct serve_req_ctx req_ctx; /* what request parsing needs, set at start */
	struct loom_chat_template chat;
	/* requests with tools or tool calls: the model's tool_use variant
	 * (tokenizer.chat_template.tool_use) when it has one, else chat */
	struct loom_chat_template chat_tools;
	bool has_chat_tools;
	bool chat_ok;
	bool chat_given; /* the model carries a template */
	char chat_err[256];
	bool add_bos; /* the tokenizer prepends BOS to plain text */
	char model_name[256];
	int32_t n_ctx;
	int64_t created;
	_Atomic int state;        /* enum srv_state */
	atomic_bool hard_stop;    /* the engine is gone: waits end at once */
	struct metrics metrics;

	pthread_mutex_t lock;     /* guards jobs and n_gens_active */
	struct job *jobs;         /* jobs with scheduler requests outstanding */
	int64_t n_gens_active;
	pthread_cond_t idle;      /* n_gens_active reached 0 */
	struct http *http;        /* serve_http.c's connection state */
	char api_key[256];        /* --api-key, else $LOOM_API_KEY; "": open */
	/* the names requests may give as "model": the file's, then --alias */
	const char *model_names[SRV_MAX_NAMES];
	int n_model_names;
	char alias_buf[1024];
	/* /api/tags and /api/show (serve_ollama.h), set at start */
	struct ollama_model ollama;
	char *metadata_json;          /* loom_engine_metadata_json's */
};

/* ---- requests ---- */

/* One choice: a scheduler request and its output state. */
struct gen {
	struct job *job;
	int index;
	/* shared with the engine thread, under job->mu */
	uint64_t id;
	bool submitted, sched_done; /* sched_done: its final event arrived */
	enum loom_finish finish;
	char error[256];
	int32_t *toks;
	size_t n_toks, cap_toks;
	double t_last;
	/* connection thread only */
	size_t n_read;
	struct loom_detok dt;
	struct sbuf pending;   /* decoded text not yet released (stop matching) */
	int n_out;             /* tokens consumed (completion_tokens) */
	bool out_done;         /* finish_reason decided */
	const char *finish_reason;
	bool failed;           /* backend error */
	bool sent_role;        /* chat streaming: role delta sent */
	/* ---- appended (gram): a tools request's stream holds text back
	 * while it may still become tool calls (serve_tools.h) ---- */
	int tool_kind;         /* serve_tool_kind of what came so far */
	struct sbuf tool_buf;
	/* ---- appended (api) ---- */
	int prompt;            /* its prompt: job->prompts[prompt] */
	/* logprobs: 1 + top entries per token, under job->mu */
	struct loom_token_logprob *lps;
	size_t cap_lps;
	struct loom_token_logprob *prompt_lp; /* echo with logprobs: the engine's */
	float *hidden;         /* embeddings: n_prompt x n_embd, the engine's */
	/* connection thread only: logprob items of consumed tokens not yet
	 * sent (streaming) or all of them (whole answers), and the byte
	 * offset of the next token's text (completions' text_offset) */
	struct json_t *lp_items;
	size_t text_off;
	bool echoed;
	/* ---- appended (ollama) ---- */
	double t_first;        /* its first token came (under job->mu) */
};

struct job {
	struct server *srv;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;              /* under mu: 1 per live scheduler request + holders */
	double t_start;
	/* request */
	bool chat, stream, include_usage;
	int n;
	int max_tokens;
	struct loom_sampler_params sp;
	const char *spec;            /* strategy name; NULL: plain decoding */
	int spec_max_draft;          /* 0: the strategy's */
	char *stop[SRV_MAX_STOP];
	int n_stop;
	int32_t *prompt;       /* prompts[0] */
	int32_t n_prompt;      /* prompt tokens, all prompts together (usage) */
	char id[48];
	int64_t created;
	/* output */
	struct gen gens[SRV_MAX_N];
	struct sbuf out;       /* streaming: SSE bytes not yet handed to MHD */
	size_t out_pos;
	bool stream_end;       /* [DONE] queued */
	struct job *next, *prev; /* server->jobs */
	bool listed;
	/* event-driven HTTP: the connection waiting for news (under mu) */
	void *parked;
	void (*wake)(void *parked);
	/* ---- appended (gram) ---- */
	struct loom_grammar *grammar; /* owned; constrains every choice */
	int tool_mode;                /* enum serve_tool_mode */
	/* ---- appended (api) ---- */
	bool logprobs, echo;
	int top_logprobs;
	int n_per_prompt;             /* n: choice i is prompt i / n_per_prompt */
	int n_prompts;
	int32_t *prompts[SERVE_REQ_MAX_PROMPTS]; /* owned */
	int32_t prompt_lens[SERVE_REQ_MAX_PROMPTS];
	bool embed;                   /* /v1/embeddings: hidden states, no tokens */
	bool embed_base64;
	/* ---- appended (ollama) ---- */
	int api;                      /* enum serve_api: the answer's shape */
	int tool_format;              /* enum serve_tool_format of its calls */
	/* ---- appended (hcancel) ---- */
	bool cancelled;               /* under mu: job_cancel ran; no choice is
				       * submitted after it (job_submit) */
};

struct job *job_new(struct server *srv);
/* Moves a parsed request into j (r is left empty). */
void job_take_req(struct job *j, struct serve_req *r);
/* Moves a parsed embeddings request into j (r is left empty). */
void job_take_embed(struct job *j, struct serve_embed_req *r);
/* Takes a reference to j (job_put drops it). */
void job_hold(struct job *j);
void job_put(struct job *j);
/* Submits the n engine requests. 0, or loom_submit's status with
 * err: LOOM_ERR_FULL when the queue is full (HTTP 503), else a bad request. */
/* Tests only: sleeps the N milliseconds (0 < N <= 10000) that the
 * environment variable `name` gives; nothing else reads those variables. */
void test_delay(const char *name);
int job_submit(struct job *j, char *err, size_t errlen);
/* Cancels every choice still running, and those job_submit has not
 * submitted yet: they are never submitted (the client may leave while
 * the n choices are still being submitted). */
void job_cancel(struct job *j);
/* Waits up to timeout_ms for news, then moves every choice's new tokens
 * through detokenization and stop matching, calling emit for released
 * text (len may be 0 when a choice finishes without text). Returns true
 * once every choice has its finish_reason. */
typedef void (*job_emit_fn)(struct job *j, struct gen *g, const char *text,
			    size_t len, bool finished, void *user);
bool job_advance(struct job *j, int timeout_ms, job_emit_fn emit, void *user);
/* Cancels every outstanding request of every job (shutdown). */
void server_cancel_all(struct server *srv);
/* Waiting without blocking a thread: under the job's lock, when no news
 * (tokens, a finish) is pending, records conn as parked and calls
 * suspend(conn); the engine thread calls wake(conn) with the next news.
 * Returns false, parking nothing, when news is already pending. */
bool job_park(struct job *j, void *conn, void (*suspend)(void *), void (*wake)(void *));
/* Wakes the job's parked connection now, if it has one (timers, shutdown). */
void job_unpark(struct job *j);
/* Calls job_unpark on every job with requests outstanding. */
void server_unpark_all(struct server *srv);

/* ---- HTTP ---- */

struct MHD_Daemon;
struct MHD_Daemon *http_start(struct server *srv, char *err, size_t errlen);
/* Wakes every suspended connection, stops the deadline thread and the
 * daemon (MHD must not be stopped with connections suspended). */
void http_stop(struct server *srv, struct MHD_Daemon *d);

double now_s(void);

#endif /* LOOM_SERVE_INT_H */
