/* `loom serve`: the HTTP side (libmicrohttpd, event-driven).
 *
 * A few threads (--http-threads) run MHD's epoll loops; no handler blocks.
 * A POST body is parsed and tokenized by a parse worker (serve_parse.h)
 * while its connection is suspended. A request waiting on the engine is
 * parked: its connection is suspended (MHD_suspend_connection) and the
 * engine thread resumes it when tokens or a finish arrive (job_park). A
 * deadline thread closes connections that take too long to send their
 * headers or body (MHD's own timeout restarts on every byte, so a trickle
 * would hold a socket forever), cancels the requests whose clients have
 * gone (watch_clients), resumes requests waiting for the model to load,
 * and wakes parked requests now and then. */
#include "serve_int.h"

#include <jansson.h>

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve_api.h"
#include "serve_index_html.h"
#include "serve_ollama.h"
#include "serve_parse.h"
#include "serve_tools.h"

#define TICK_MS 100          /* the deadline thread's period */
#define UNPARK_TICKS 5       /* parked requests are woken every 0.5 s */
#define MAX_URL 8192         /* longer: 414 */
#define MAX_HEADERS 16384    /* request line + headers beyond this: 431 */
#define MHD_POOL 65536       /* MHD's per-connection memory (it answers past it) */
/* /api/version: the Ollama API version whose shapes loom answers in */
#define LOOM_OLLAMA_VERSION "0.12.0"

/* A socket's deadline state, from MHD's connection-start notification to
 * its close notification. */
enum sock_phase {
	PH_HEADERS, /* reading a request's headers: t0 + header_timeout */
	PH_BODY,    /* reading its body: t0 + body_timeout */
	PH_BUSY,    /* answering: no deadline */
	PH_CLOSING, /* shut down for a missed deadline */
};

struct sock {
	int fd;
	double t0;
	int phase;             /* enum sock_phase, under http->mu */
	struct job *job;       /* the request it is answering (held), under http->mu */
	struct sock *next, *prev;
};

struct conn;

/* What job_park holds of a connection: the connection, and the counter of
 * suspended connections that http_stop waits to reach zero. */
struct parker {
	struct MHD_Connection *c;
	struct http *h;
};

struct http {
	struct server *srv;
	pthread_mutex_t mu;    /* socks and loading */
	struct sock *socks;
	struct conn *loading;  /* suspended until the model is loaded */
	_Atomic int n_suspended;
	atomic_bool stopping;  /* no more parking: the daemon is stopping */
	atomic_bool timer_quit;
	pthread_t timer;
	bool timer_started;
	struct parse_pool *parse;
};

/* Per-request state, from the first call of the handler to
 * MHD_OPTION_NOTIFY_COMPLETED. */
/* A request's body, parsed by the parse stage. */
struct parsed {
	bool gone;                 /* the client left before its turn */
	bool stopping;             /* the server is stopping: 503 */
	bool full;                 /* the parse queue's byte cap: 503 */
	int rc;                    /* 0: req or ereq holds the request */
	struct perr e;             /* else: why (a 4xx/5xx) */
	struct serve_req req;      /* completions, chat */
	struct serve_embed_req ereq; /* embeddings */
	struct json_t *reply;      /* /tokenize, /detokenize: the answer (NULL: e) */
};

enum parse_state { PARSE_NONE, PARSE_QUEUED, PARSE_DONE, PARSE_TAKEN };

struct conn {
	struct sbuf body;
	bool too_big;
	int fd;
	int ep;               /* enum endpoint */
	int parse;            /* enum parse_state */
	struct parse_item pi;
	struct parsed p;
	struct job *job; /* a non-streaming request in progress */
	struct parker pk;
	struct sbuf texts[SRV_MAX_N]; /* non-streaming: each choice's text */
	double t_arrive;
	struct conn *lnext; /* http->loading */
};

/* The content-reader state of a streaming response. */
struct stream {
	struct job *job;
	int fd;
	struct parker pk;
};

/* ---- responses ---- */

static enum MHD_Result fail_ep(struct MHD_Connection *c, struct server *srv,
			       const struct conn *cn, int status, const char *code,
			       const char *msg);

/* --cors-origin: the headers every response carries. */
static void add_cors(struct MHD_Response *r, const struct server *srv)
{
	if (!srv->o.serve.cors_origin[0])
		return;
	MHD_add_response_header(r, "Access-Control-Allow-Origin", srv->o.serve.cors_origin);
	if (strcmp(srv->o.serve.cors_origin, "*"))
		MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result send_bytes(struct MHD_Connection *c, unsigned status,
				  const char *type, const char *data, size_t len,
				  bool retry_after, struct server *srv)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data,
								 MHD_RESPMEM_MUST_COPY);
	enum MHD_Result rc;

	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", type);
	if (retry_after)
		MHD_add_response_header(r, "Retry-After", "1");
	add_cors(r, srv);
	if (status == 401)
		MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
	rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	metrics_count_status(&srv->metrics, status);
	return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *o,
				 struct server *srv)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	enum MHD_Result rc;

	json_decref(o);
	if (!s)
		return send_bytes(c, 500, "application/json",
				  "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}",
				  86, false, srv);
	rc = send_bytes(c, status, "application/json", s, strlen(s), status == 503, srv);
	free(s);
	return rc;
}

static const char *error_type(int status)
{
	if (status == 503)
		return "service_unavailable";
	if (status >= 500)
		return "server_error";
	if (status == 404)
		return "not_found_error";
	if (status == 401)
		return "authentication_error";
	return "invalid_request_error";
}

static json_t *error_body(const struct perr *e)
{
	return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->msg,
			 "type", error_type(e->status),
			 "param", e->param[0] ? json_string(e->param) : json_null(),
			 "code", e->code ? json_string(e->code) : json_null());
}

static enum MHD_Result send_error(struct MHD_Connection *c, struct server *srv,
				  const struct perr *e)
{
	return send_json(c, (unsigned)e->status, error_body(e), srv);
}

/* Ollama's error shape: {"error": "message"}. */
static json_t *ollama_error_body(const struct perr *e)
{
	return json_pack("{s:s}", "error", e->msg);
}

static enum MHD_Result fail(struct MHD_Connection *c, struct server *srv, int status,
			    const char *code, const char *msg)
{
	struct perr e;

	perr_set(&e, status, NULL, code, "%s", msg);
	return send_error(c, srv, &e);
}

/* Text as a JSON string; bytes that are not UTF-8 become U+FFFD (the
 * detokenizer releases only whole characters, so this is a safety net). */
static json_t *text_json(const char *s, size_t n)
{
	return api_text_json(s, n);
}

/* A choice's "logprobs": null unless asked for; then the items of the
 * tokens consumed (take: and forgets them, for the next stream chunk). */
static json_t *choice_logprobs(const struct job *j, struct gen *g, bool take)
{
	json_t *items, *out;

	if (!j->logprobs)
		return json_null();
	items = g->lp_items ? g->lp_items : json_array();
	out = j->chat ? api_chat_logprobs(items) : api_completion_logprobs(items);
	if (take || !g->lp_items)
		json_decref(items);
	if (take)
		g->lp_items = NULL;
	return out ? out : json_null();
}

/* ---- client liveness ---- */

static int conn_fd(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);

	return ci ? ci->connect_fd : -1;
}

/* True once the client has gone: the connection is broken (reset, or
 * shut in both directions), or the peer has shut its sending side
 * (POLLRDHUP, an EOF after the request), as a client that closes its
 * socket does. With --half-close, a peer that only shut its sending side
 * (shutdown(SHUT_WR) after the request) still reads and is answered; one
 * that closed for good is then found out by the first write that meets
 * its reset. */
static bool client_gone(const struct http *h, int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };
	short gone = POLLHUP | POLLERR | POLLNVAL;

	if (fd < 0)
		return false;
	if (poll(&p, 1, 0) <= 0)
		return false;
	if (!h->srv->o.serve.half_close)
		gone |= POLLRDHUP;
	return p.revents & gone;
}

/* ---- parking (suspend / resume) ---- */

static void park_suspend(void *arg)
{
	struct parker *pk = arg;

	atomic_fetch_add(&pk->h->n_suspended, 1);
	MHD_suspend_connection(pk->c);
}

static void park_wake(void *arg)
{
	struct parker *pk = arg;

	MHD_resume_connection(pk->c);
	atomic_fetch_sub(&pk->h->n_suspended, 1);
}

/* Parks j on its connection until news; false if news is already there
 * or the daemon is stopping (the caller goes on at once). */
static bool park(struct job *j, struct parker *pk)
{
	if (atomic_load(&pk->h->stopping))
		return false;
	return job_park(j, pk, park_suspend, park_wake);
}

/* ---- OpenAI response shapes ---- */

static json_t *usage_json(const struct job *j)
{
	int i, out = 0;

	for (i = 0; i < j->n; i++)
		out += j->gens[i].n_out;
	return json_pack("{s:i,s:i,s:i}", "prompt_tokens", j->n_prompt,
			 "completion_tokens", out, "total_tokens", j->n_prompt + out);
}

static json_t *envelope(const struct job *j, const char *object, json_t *choices)
{
	return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", j->id, "object", object,
			 "created", (json_int_t)j->created, "model", j->srv->model_name,
			 "choices", choices);
}

/* A chat choice whose text is complete tool calls (a tools request that
 * stopped on its own), or NULL. */
static json_t *tool_choice_json(const struct job *j, const struct gen *g, const struct sbuf *text)
{
	json_t *calls;

	if (!j->chat || !j->tool_mode || strcmp(g->finish_reason, "stop") || !text->s)
		return NULL;
	calls = serve_tool_calls(j->tool_format, text->s, text->len);
	if (!calls)
		return NULL;
	return json_pack("{s:i,s:{s:s,s:n,s:o},s:n,s:s}", "index", g->index, "message",
			 "role", "assistant", "content", "tool_calls", calls, "logprobs",
			 "finish_reason", "tool_calls");
}

static json_t *final_choice(const struct job *j, struct gen *g, const struct sbuf *text)
{
	json_t *t, *calls = tool_choice_json(j, g, text);

	if (calls)
		return calls;
	t = text_json(text->s ? text->s : "", text->len);

	if (j->chat)
		return json_pack("{s:i,s:{s:s,s:o},s:o,s:s}", "index", g->index,
				 "message", "role", "assistant", "content", t,
				 "logprobs", choice_logprobs(j, g, false),
				 "finish_reason", g->finish_reason);
	return json_pack("{s:i,s:o,s:o,s:s}", "index", g->index, "text", t, "logprobs",
			 choice_logprobs(j, g, false), "finish_reason", g->finish_reason);
}

/* ---- Ollama's shapes (serve_ollama.h) ---- */

static bool is_ollama(const struct job *j)
{
	return j->api != SERVE_API_OPENAI;
}

/* The timings and counts of j's only choice (Ollama has no n). */
static void ollama_stats_of(struct job *j, struct ollama_stats *st)
{
	struct gen *g = &j->gens[0];
	double t_first;

	pthread_mutex_lock(&j->mu);
	t_first = g->t_first;
	pthread_mutex_unlock(&j->mu);
	*st = (struct ollama_stats){
		.total = now_s() - j->t_start,
		.first = t_first > 0 ? t_first - j->t_start : 0,
		.prompt_tokens = j->n_prompt,
		.eval_tokens = g->n_out,
		.done_reason = g->finish_reason && !strcmp(g->finish_reason, "length") ? "length" :
			       "stop",
	};
}

static enum MHD_Result ollama_whole(struct MHD_Connection *c, struct job *j,
				    const struct sbuf *text)
{
	bool chat = j->api == SERVE_API_OLLAMA_CHAT;
	json_t *calls = NULL, *o;
	struct ollama_stats st;

	if (chat && j->tool_mode && !strcmp(j->gens[0].finish_reason, "stop") && text->s)
		calls = serve_tool_calls(j->tool_format, text->s, text->len);
	ollama_stats_of(j, &st);
	o = ollama_answer(j->srv->model_name, chat, calls ? "" : text->s, calls ? 0 : text->len,
			  calls, &st);
	json_decref(calls);
	return send_json(c, 200, o, j->srv);
}

/* ---- non-streaming ---- */

static void collect(struct job *j, struct gen *g, const char *text, size_t len,
		    bool finished, void *user)
{
	struct sbuf *texts = user;

	(void)j;
	(void)finished;
	sb_putn(&texts[g->index], text, len);
}

/* /v1/embeddings: each input's hidden states pooled as the model says
 * (mean by default) and normalized to length 1. */
static enum MHD_Result send_embeddings(struct MHD_Connection *c, struct job *j)
{
	int32_t d = loom_engine_n_embd(j->srv->engine);
	enum loom_pooling pooling = loom_engine_pooling(j->srv->engine);
	float *v = malloc(sizeof(float) * (size_t)d);
	json_t *data = json_array();
	int i;

	for (i = 0; v && data && i < j->n; i++) {
		if (api_pool(j->gens[i].hidden, j->prompt_lens[i], d, pooling, v)) {
			free(v);
			json_decref(data);
			return fail(c, j->srv, 500, "backend_error",
				    "the hidden state has no length (not finite or zero)");
		}
		json_array_append_new(data, api_embedding_item(i, v, d, j->embed_base64));
	}
	free(v);
	return send_json(c, 200, json_pack("{s:s,s:o,s:s,s:{s:i,s:i}}", "object", "list",
					   "data", data, "model", j->srv->model_name, "usage",
					   "prompt_tokens", j->n_prompt, "total_tokens",
					   j->n_prompt), j->srv);
}

/* Called again each time the parked request is woken: moves what arrived
 * into cn->texts, parks again, or answers once every choice is done. */
static enum MHD_Result answer_whole(struct MHD_Connection *c, struct conn *cn)
{
	struct job *j = cn->job;
	struct server *srv = j->srv;
	json_t *choices, *o;
	int i;

	while (!job_advance(j, 0, collect, cn->texts)) {
		if (client_gone(cn->pk.h, conn_fd(c))) {
			job_cancel(j);
			return MHD_NO;
		}
		if (atomic_load(&cn->pk.h->stopping)) {
			job_cancel(j);
			return fail_ep(c, srv, cn, 503, "unavailable", "the server is shutting down");
		}
		if (park(j, &cn->pk))
			return MHD_YES;
	}
	for (i = 0; i < j->n; i++)
		if (j->gens[i].failed)
			return fail_ep(c, srv, cn, 500, "backend_error",
				       j->gens[i].error[0] ? j->gens[i].error : "generation failed");
	if (j->embed)
		return send_embeddings(c, j);
	if (is_ollama(j))
		return ollama_whole(c, j, &cn->texts[0]);
	choices = json_array();
	for (i = 0; i < j->n; i++)
		json_array_append_new(choices, final_choice(j, &j->gens[i], &cn->texts[i]));
	o = envelope(j, j->chat ? "chat.completion" : "text_completion", choices);
	if (o)
		json_object_set_new(o, "usage", usage_json(j));
	return send_json(c, 200, o, srv);
}

/* ---- streaming (SSE) ---- */

/* o (taken) as compact JSON between pre and post, for the stream. */
static void put_json(struct job *j, json_t *o, const char *pre, const char *post)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	if (!s) {
		j->out.failed = true;
		return;
	}
	sb_puts(&j->out, pre);
	sb_puts(&j->out, s);
	sb_puts(&j->out, post);
	free(s);
}

static void sse_put(struct job *j, json_t *o)
{
	put_json(j, o, "data: ", "\n\n");
}

/* An NDJSON line (Ollama's streams). */
static void ndjson_put(struct job *j, json_t *o)
{
	put_json(j, o, "", "\n");
}

/* A stream chunk's choice; with logprobs, those of the tokens consumed
 * since the last chunk (null in the role chunk and the finish). */
static json_t *delta_choice(const struct job *j, struct gen *g, json_t *text,
			    bool role, const char *finish)
{
	json_t *fr = finish ? json_string(finish) : json_null();
	bool pending = g->lp_items && json_array_size(g->lp_items);
	json_t *lp = !role && (pending || (text && !finish)) ? choice_logprobs(j, g, true) :
		     json_null();

	if (!j->chat)
		return json_pack("{s:i,s:o,s:o,s:o}", "index", g->index, "text", text,
				 "logprobs", lp, "finish_reason", fr);
	if (!text)
		return json_pack("{s:i,s:{},s:o,s:o}", "index", g->index, "delta",
				 "logprobs", lp, "finish_reason", fr);
	if (role)
		return json_pack("{s:i,s:{s:s,s:o},s:o,s:o}", "index", g->index, "delta",
				 "role", "assistant", "content", text, "logprobs", lp,
				 "finish_reason", fr);
	return json_pack("{s:i,s:{s:o},s:o,s:o}", "index", g->index, "delta",
			 "content", text, "logprobs", lp, "finish_reason", fr);
}

static void sse_choice(struct job *j, json_t *choice)
{
	const char *object = j->chat ? "chat.completion.chunk" : "text_completion";

	sse_put(j, envelope(j, object, json_pack("[o]", choice)));
}

static void stream_emit(struct job *j, struct gen *g, const char *text, size_t len,
			bool finished, void *user);

/* Streams the tool calls in calls as OpenAI does: per call a delta with
 * its id, type, name and empty arguments, then one with the arguments;
 * then the finish. */
static void stream_calls(struct job *j, struct gen *g, json_t *calls)
{
	size_t k;
	json_t *c;

	if (is_ollama(j)) { /* one chunk with the calls; stream_finish ends it */
		ndjson_put(j, ollama_answer(j->srv->model_name, true, "", 0, calls, NULL));
		g->finish_reason = "stop";
		return;
	}
	json_array_foreach(calls, k, c) {
		json_t *fn = json_object_get(c, "function");

		sse_choice(j, json_pack("{s:i,s:{s:[{s:i,s:O,s:s,s:{s:O,s:s}}]},s:n,s:n}",
					"index", g->index, "delta", "tool_calls", "index", (int)k,
					"id", json_object_get(c, "id"), "type", "function",
					"function", "name", json_object_get(fn, "name"),
					"arguments", "", "logprobs", "finish_reason"));
		sse_choice(j, json_pack("{s:i,s:{s:[{s:i,s:{s:O}}]},s:n,s:n}", "index", g->index,
					"delta", "tool_calls", "index", (int)k, "function",
					"arguments", json_object_get(fn, "arguments"), "logprobs",
					"finish_reason"));
	}
	g->finish_reason = "tool_calls";
	sse_choice(j, delta_choice(j, g, NULL, false, g->finish_reason));
}

/* A tools request's stream: text is held while it may still become tool
 * calls (a prefix of the begin marker, or calls not yet finished). True
 * when this event was dealt with here. */
static bool stream_tools(struct job *j, struct gen *g, const char *text, size_t len,
			 bool finished)
{
	struct sbuf *b = &g->tool_buf, held;
	json_t *calls = NULL;

	if (g->tool_kind == 1)
		return false; /* plain text: streamed as it comes */
	sb_putn(b, text, len);
	g->tool_kind = serve_tool_kind(j->tool_format, b->s ? b->s : "", b->len);
	if (finished && g->tool_kind == 2 && !g->failed && !strcmp(g->finish_reason, "stop"))
		calls = serve_tool_calls(j->tool_format, b->s, b->len);
	if (calls) {
		stream_calls(j, g, calls);
		json_decref(calls);
		return true;
	}
	if (g->tool_kind == 1 || finished) {
		held = *b;
		*b = (struct sbuf){ 0 };
		g->tool_kind = 1;
		stream_emit(j, g, held.s ? held.s : "", held.len, finished, NULL);
		sb_free(&held);
	}
	return true;
}

/* An Ollama stream's text chunk; its last object (done, with the
 * timings) comes from stream_finish, and a failure is an error line. */
static void ollama_emit(struct job *j, struct gen *g, const char *text, size_t len,
			bool finished)
{
	if (len)
		ndjson_put(j, ollama_answer(j->srv->model_name, j->api == SERVE_API_OLLAMA_CHAT,
					    text, len, NULL, NULL));
	if (finished && g->failed)
		ndjson_put(j, json_pack("{s:s}", "error",
					g->error[0] ? g->error : "generation failed"));
}

static void stream_emit(struct job *j, struct gen *g, const char *text, size_t len,
			bool finished, void *user)
{
	(void)user;
	if (j->chat && j->tool_mode && stream_tools(j, g, text, len, finished))
		return;
	if (is_ollama(j)) {
		ollama_emit(j, g, text, len, finished);
		return;
	}
	if (len)
		sse_choice(j, delta_choice(j, g, text_json(text, len), false, NULL));
	if (!finished)
		return;
	if (g->failed) {
		struct perr e;

		perr_set(&e, 500, NULL, "backend_error", "%s",
			 g->error[0] ? g->error : "generation failed");
		sse_put(j, error_body(&e));
		return;
	}
	sse_choice(j, delta_choice(j, g, j->chat ? NULL : json_string(""), false,
				   g->finish_reason));
}

static void stream_start(struct job *j)
{
	int i;

	if (!j->chat || is_ollama(j))
		return;
	for (i = 0; i < j->n; i++)
		sse_choice(j, delta_choice(j, &j->gens[i], json_string(""), true, NULL));
}

/* The end of a stream: the usage chunk and [DONE]; a stream whose choice
 * failed (an error, a cancel at shutdown) ends with its error event
 * instead, so no client takes it for a complete reply. */
static void stream_finish(struct job *j)
{
	for (int i = 0; i < j->n; i++) {
		if (j->gens[i].failed) {
			j->stream_end = true;
			return;
		}
	}
	if (is_ollama(j)) {
		struct ollama_stats st;

		ollama_stats_of(j, &st);
		ndjson_put(j, ollama_answer(j->srv->model_name, j->api == SERVE_API_OLLAMA_CHAT,
					    "", 0, NULL, &st));
		j->stream_end = true;
		return;
	}
	if (j->include_usage) {
		json_t *o = envelope(j, j->chat ? "chat.completion.chunk" : "text_completion",
				     json_array());

		if (o)
			json_object_set_new(o, "usage", usage_json(j));
		sse_put(j, o);
	}
	sb_puts(&j->out, "data: [DONE]\n\n");
	j->stream_end = true;
}

/* MHD's content reader: never blocks. With nothing to send it parks the
 * connection and returns 0; the engine's next event resumes it. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *st = cls;
	struct job *j = st->job;

	(void)pos;
	for (;;) {
		if (j->out.failed)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (j->out_pos < j->out.len) {
			size_t n = j->out.len - j->out_pos;

			if (n > max)
				n = max;
			memcpy(buf, j->out.s + j->out_pos, n);
			j->out_pos += n;
			if (j->out_pos == j->out.len)
				j->out_pos = j->out.len = 0;
			return (ssize_t)n;
		}
		if (j->stream_end)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (client_gone(st->pk.h, st->fd) || atomic_load(&st->pk.h->stopping)) {
			job_cancel(j);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		if (job_advance(j, 0, stream_emit, NULL)) {
			stream_finish(j);
			continue;
		}
		if (j->out_pos == j->out.len && park(j, &st->pk))
			return 0;
	}
}

/* MHD is done with the response: the client finished or went away. */
static void stream_free(void *cls)
{
	struct stream *st = cls;

	job_cancel(st->job);
	job_put(st->job);
	free(st);
}

static enum MHD_Result answer_stream(struct MHD_Connection *c, struct conn *cn, struct job *j)
{
	struct stream *st = malloc(sizeof(*st));
	struct MHD_Response *r;
	enum MHD_Result rc;

	if (!st) {
		job_cancel(j);
		return fail(c, j->srv, 500, NULL, "out of memory");
	}
	st->job = j;
	st->fd = conn_fd(c);
	st->pk = cn->pk;
	pthread_mutex_lock(&j->mu);
	j->refs++;
	pthread_mutex_unlock(&j->mu);
	stream_start(j);
	r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st,
					      stream_free);
	if (!r) {
		stream_free(st);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type",
				is_ollama(j) ? "application/x-ndjson" : "text/event-stream");
	MHD_add_response_header(r, "Cache-Control", "no-cache");
	add_cors(r, j->srv);
	rc = MHD_queue_response(c, 200, r);
	MHD_destroy_response(r);
	metrics_count_status(&j->srv->metrics, 200);
	return rc;
}

/* ---- endpoints ---- */

static void make_id(struct job *j)
{
	static _Atomic uint64_t counter;
	struct timespec ts;
	uint64_t x;

	clock_gettime(CLOCK_REALTIME, &ts);
	x = ((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) * 0x9e3779b97f4a7c15ULL;
	x ^= (x >> 29) ^ (++counter * 0xbf58476d1ce4e5b9ULL);

	snprintf(j->id, sizeof(j->id), "%s-%016llx", j->chat ? "chatcmpl" : "cmpl",
		 (unsigned long long)x);
	j->created = (int64_t)time(NULL);
}

/* A request before the model is ready: parked on the loading list (the
 * deadline thread wakes it every tick) while --load-wait allows, then a
 * 503 that says the model is loading; while draining, a 503 that says so.
 * True when it answered or parked, with *rc MHD's result. */
static bool wait_ready(struct MHD_Connection *c, struct server *srv, struct conn *cn,
		       enum MHD_Result *rc)
{
	int st = atomic_load(&srv->state);
	struct http *h = srv->http;

	if (st == SRV_READY)
		return false;
	if (st == SRV_LOADING && now_s() - cn->t_arrive < srv->o.serve.load_wait &&
	    !atomic_load(&h->stopping)) {
		pthread_mutex_lock(&h->mu);
		cn->lnext = h->loading;
		h->loading = cn;
		atomic_fetch_add(&h->n_suspended, 1);
		MHD_suspend_connection(c);
		pthread_mutex_unlock(&h->mu);
		*rc = MHD_YES;
		return true;
	}
	/* queue-full rejections are counted by the scheduler */
	metrics_count_rejected(&srv->metrics);
	if (st == SRV_LOADING)
		*rc = fail_ep(c, srv, cn, 503, "model_loading",
			      "the model is still loading; retry later");
	else
		*rc = fail_ep(c, srv, cn, 503, "unavailable", "the server is shutting down");
	return true;
}

/* The POST endpoints. */
enum endpoint {
	EP_NONE, EP_COMPLETIONS, EP_CHAT, EP_EMBED, EP_TOKENIZE, EP_DETOKENIZE,
	EP_OLLAMA_CHAT, EP_OLLAMA_GENERATE, EP_OLLAMA_SHOW, /* serve_ollama.h */
};

static bool ep_ollama(int ep)
{
	return ep == EP_OLLAMA_CHAT || ep == EP_OLLAMA_GENERATE || ep == EP_OLLAMA_SHOW;
}

/* An error in the shape of the API the connection's request came by. */
static enum MHD_Result send_error_ep(struct MHD_Connection *c, struct server *srv,
				     const struct conn *cn, const struct perr *e)
{
	if (cn && ep_ollama(cn->ep))
		return send_json(c, (unsigned)e->status, ollama_error_body(e), srv);
	return send_error(c, srv, e);
}

static enum MHD_Result fail_ep(struct MHD_Connection *c, struct server *srv,
			       const struct conn *cn, int status, const char *code,
			       const char *msg)
{
	struct perr e;

	perr_set(&e, status, NULL, code, "%s", msg);
	return send_error_ep(c, srv, cn, &e);
}

static enum endpoint post_endpoint(const char *url)
{
	if (!strcmp(url, "/v1/completions"))
		return EP_COMPLETIONS;
	if (!strcmp(url, "/v1/chat/completions"))
		return EP_CHAT;
	if (!strcmp(url, "/v1/embeddings") || !strcmp(url, "/embeddings"))
		return EP_EMBED;
	if (!strcmp(url, "/tokenize"))
		return EP_TOKENIZE;
	if (!strcmp(url, "/detokenize"))
		return EP_DETOKENIZE;
	if (!strcmp(url, "/api/chat"))
		return EP_OLLAMA_CHAT;
	if (!strcmp(url, "/api/generate"))
		return EP_OLLAMA_GENERATE;
	if (!strcmp(url, "/api/show"))
		return EP_OLLAMA_SHOW;
	return EP_NONE;
}

static enum MHD_Result start_job(struct MHD_Connection *c, struct server *srv,
				 struct conn *cn, struct job *j);
static struct sock *conn_sock(struct MHD_Connection *c);
static void sock_watch(struct http *h, struct sock *sk, struct job *j);

/* The hidden states an embeddings request holds until it is pooled: a
 * row per input token. Bounded, so that a request cannot make the server
 * hold gigabytes (32 inputs of a long context on a wide model). */
#define EMBED_MAX_BYTES (256ull << 20)

static bool embed_too_big(const struct server *srv, const struct serve_embed_req *r,
			  struct perr *e)
{
	uint64_t tokens = 0, row = sizeof(float) * (uint64_t)loom_engine_n_embd(srv->engine);

	for (int i = 0; i < r->n_inputs; i++)
		tokens += (uint64_t)r->input_lens[i];
	if (tokens * row <= EMBED_MAX_BYTES)
		return false;
	perr_set(e, 400, "input", "invalid_value",
		 "the inputs are %llu tokens; one request may embed at most %llu with this model",
		 (unsigned long long)tokens, (unsigned long long)(EMBED_MAX_BYTES / row));
	return true;
}

/* ---- the parse stage (serve_parse.h) ---- */

/* On a worker: the body into cn->p (a request, or a /tokenize reply). */
static void parse_run(struct parse_item *it)
{
	struct conn *cn = (struct conn *)((char *)it - offsetof(struct conn, pi));
	struct http *h = cn->pk.h;
	struct server *srv = h->srv;
	struct parsed *p = &cn->p;
	const char *body = cn->body.s ? cn->body.s : "";
	size_t len = cn->body.len;

	if (client_gone(h, cn->fd)) {
		p->gone = true; /* left while queued: not worth parsing */
		return;
	}
	if (atomic_load(&h->stopping)) {
		p->stopping = true;
		return;
	}
	/* tests only: LOOM_TEST_PARSE_DELAY_MS=N makes every parse take N ms
	 * longer, so that a test can leave while its request is being parsed
	 * (test_serve_flood.py) */
	test_delay("LOOM_TEST_PARSE_DELAY_MS");
	if (cn->ep == EP_TOKENIZE || cn->ep == EP_DETOKENIZE) {
		p->reply = cn->ep == EP_TOKENIZE ? api_tokenize(srv->tok, body, len, &p->e) :
			   api_detokenize(srv->tok, body, len, &p->e);
		return;
	}
	if (cn->ep == EP_OLLAMA_SHOW) {
		p->reply = ollama_show(&srv->ollama, body, len, &p->e);
		return;
	}
	if (cn->ep == EP_OLLAMA_CHAT || cn->ep == EP_OLLAMA_GENERATE) {
		bool chat = cn->ep == EP_OLLAMA_CHAT;

		p->rc = ollama_parse(&srv->req_ctx, body, len, chat, &p->req, &p->e);
		if (p->rc == 1) { /* a load request: the model is loaded */
			p->reply = ollama_load_reply(srv->model_name, chat);
			if (!p->reply)
				perr_set(&p->e, 500, NULL, NULL, "out of memory");
		}
		return;
	}
	if (cn->ep == EP_EMBED) {
		p->rc = serve_embed_parse(&srv->req_ctx, body, len, &p->ereq, &p->e);
		if (!p->rc && embed_too_big(srv, &p->ereq, &p->e)) {
			serve_embed_free(&p->ereq);
			p->rc = -1;
		}
		return;
	}
	p->rc = serve_req_parse(&srv->req_ctx, body, len, cn->ep == EP_CHAT, &p->req, &p->e);
}

/* On a worker, after parse_run: hands the connection back to MHD. Once
 * resumed, the connection may end and cn be freed at once: nothing of cn
 * is read after the resume. */
static void parse_done(struct parse_item *it)
{
	struct conn *cn = (struct conn *)((char *)it - offsetof(struct conn, pi));
	struct http *h = cn->pk.h;

	cn->parse = PARSE_DONE;
	MHD_resume_connection(cn->pk.c);
	atomic_fetch_sub(&h->n_suspended, 1);
}

/* The client's address: the key its requests queue under. */
static void client_key(struct MHD_Connection *c, struct parse_item *it)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

	parse_key_from_addr(it, ci ? ci->client_addr : NULL);
}

/* Suspends the connection and queues its body for a parse worker; the
 * worker resumes it and the handler, called again, goes on in
 * parse_finish. */
static enum MHD_Result parse_start(struct MHD_Connection *c, struct server *srv,
				   struct conn *cn, enum endpoint ep)
{
	struct http *h = srv->http;
	int rc;

	cn->ep = ep;
	cn->pi.run = parse_run;
	cn->pi.done = parse_done;
	cn->pi.bytes = cn->body.len;
	client_key(c, &cn->pi);
	cn->parse = PARSE_QUEUED;
	park_suspend(&cn->pk);
	rc = parse_pool_submit(h->parse, &cn->pi);
	if (rc != PARSE_QUEUED_OK) {
		cn->p.full = rc == PARSE_FULL;
		cn->p.stopping = rc != PARSE_FULL;
		cn->parse = PARSE_DONE;
		park_wake(&cn->pk);
	}
	return MHD_YES;
}

/* Back on MHD's thread with the parse's outcome: an answer, or a job. */
static enum MHD_Result parse_finish(struct MHD_Connection *c, struct server *srv,
				    struct conn *cn)
{
	struct parsed *p = &cn->p;
	json_t *reply = p->reply;
	struct job *j;

	cn->parse = PARSE_TAKEN;
	p->reply = NULL;
	if (p->gone)
		return MHD_NO;
	if (p->stopping)
		return fail_ep(c, srv, cn, 503, "unavailable", "the server is shutting down");
	if (p->full)
		return fail_ep(c, srv, cn, 503, "parse_queue_full",
			       "too many request bytes wait to be parsed; retry later");
	if (cn->ep == EP_TOKENIZE || cn->ep == EP_DETOKENIZE || cn->ep == EP_OLLAMA_SHOW ||
	    p->rc == 1)
		return reply ? send_json(c, 200, reply, srv) : send_error_ep(c, srv, cn, &p->e);
	if (p->rc)
		return send_error_ep(c, srv, cn, &p->e);
	if (client_gone(srv->http, cn->fd))
		return MHD_NO; /* left while its request was parsed: no job */
	j = job_new(srv);
	if (!j)
		return fail(c, srv, 500, NULL, "out of memory");
	if (cn->ep == EP_EMBED)
		job_take_embed(j, &p->ereq);
	else
		job_take_req(j, &p->req);
	make_id(j);
	return start_job(c, srv, cn, j);
}

/* Submits j and answers: a stream, or a whole answer once it is done. */
static enum MHD_Result start_job(struct MHD_Connection *c, struct server *srv,
				 struct conn *cn, struct job *j)
{
	char why[512];
	int rc;

	/* watched while its choices are submitted: a client that leaves
	 * then stops the rest from being submitted (job_cancel) */
	sock_watch(srv->http, conn_sock(c), j);
	rc = job_submit(j, why, sizeof(why));
	if (rc) {
		sock_watch(srv->http, conn_sock(c), NULL);
		job_put(j);
		if (rc == LOOM_ERR_FULL)
			return fail_ep(c, srv, cn, 503, "queue_full",
				       "the request queue is full; retry later");
		if (rc == LOOM_ERR_NOMEM)
			return fail_ep(c, srv, cn, 500, "out_of_memory", why);
		return fail_ep(c, srv, cn, 400, "invalid_value", why);
	}
	if (j->stream) {
		enum MHD_Result r = answer_stream(c, cn, j);

		job_put(j);
		return r;
	}
	cn->job = j; /* dropped in on_completed */
	return answer_whole(c, cn);
}

/* One entry per name the server answers to: the file's, then each --alias. */
static enum MHD_Result models(struct MHD_Connection *c, struct server *srv)
{
	json_t *data = json_array();

	for (int i = 0; i < srv->n_model_names; i++)
		json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s,s:i}", "id",
						      srv->model_names[i], "object", "model",
						      "created", (json_int_t)srv->created,
						      "owned_by", "loom", "max_model_len", srv->n_ctx));
	return send_json(c, 200, json_pack("{s:s,s:o}", "object", "list", "data", data), srv);
}

static void hist_text(struct sbuf *b, const char *name, const struct hist *h)
{
	uint64_t cum = 0;
	int i;

	sb_printf(b, "# TYPE %s histogram\n", name);
	for (i = 0; i < h->n; i++) {
		cum += h->counts[i];
		sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
	}
	cum += h->counts[h->n];
	sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
	sb_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->total);
}

static void gauge(struct sbuf *b, const char *name, const char *type, double v)
{
	sb_printf(b, "# TYPE %s %s\n%s %.17g\n", name, type, name, v);
}

/* One labelled sample per offered strategy. */
static void spec_family(struct sbuf *b, const struct server *srv, const char *name,
			const char *type, int what)
{
	struct loom_strategy_info si;

	sb_printf(b, "# TYPE %s %s\n", name, type);
	for (int i = 0; loom_engine_strategy(srv->engine, i, &si); i++) {
		double v;

		switch (what) {
		case 0: v = (double)si.n_steps; break;
		case 1: v = (double)si.n_drafted; break;
		case 2: v = (double)si.n_accepted; break;
		case 3: v = (double)si.n_tokens; break;
		case 4: v = si.n_drafted ? (double)si.n_accepted / (double)si.n_drafted : 0.0; break;
		default: v = si.n_steps ? (double)si.n_accepted / (double)si.n_steps : 0.0; break;
		}
		sb_printf(b, "%s{strategy=\"%s\"} %.17g\n", name, si.name, v);
	}
}

/* Speculative decoding: steps, drafts verified and accepted, tokens made,
 * acceptance rate and mean accepted drafts per step, per strategy. */
static void spec_metrics(struct sbuf *b, const struct server *srv)
{
	if (!srv->n_spec)
		return;
	spec_family(b, srv, "loom_spec_steps_total", "counter", 0);
	spec_family(b, srv, "loom_spec_drafted_tokens_total", "counter", 1);
	spec_family(b, srv, "loom_spec_accepted_tokens_total", "counter", 2);
	spec_family(b, srv, "loom_spec_generated_tokens_total", "counter", 3);
	spec_family(b, srv, "loom_spec_acceptance_rate", "gauge", 4);
	spec_family(b, srv, "loom_spec_mean_accepted_length", "gauge", 5);
}

static enum MHD_Result metrics_page(struct MHD_Connection *c, struct server *srv)
{
	struct loom_engine_stats st;
	struct metrics *m = &srv->metrics;
	struct sbuf b = { 0 };
	enum MHD_Result rc;
	unsigned s;

	loom_engine_get_stats(srv->engine, &st);
	gauge(&b, "loom_requests_running", "gauge", st.running);
	gauge(&b, "loom_requests_waiting", "gauge", st.waiting);
	gauge(&b, "loom_kv_blocks_used", "gauge", (double)st.blocks_used);
	gauge(&b, "loom_kv_blocks_free", "gauge", (double)(st.blocks_total - st.blocks_used));
	gauge(&b, "loom_kv_blocks_cached", "gauge", (double)st.blocks_cached);
	gauge(&b, "loom_kv_blocks_total", "gauge", (double)st.blocks_total);
	if (st.local_window > 0) { /* the sliding-window layers' own pool */
		gauge(&b, "loom_kv_window_blocks_used", "gauge", (double)st.local_blocks_used);
		gauge(&b, "loom_kv_window_blocks_total", "gauge", (double)st.local_blocks_total);
	}
	gauge(&b, "loom_prefix_cache_hit_rate", "gauge",
	      st.prefix_lookups ? (double)st.prefix_hits / (double)st.prefix_lookups : 0.0);
	gauge(&b, "loom_prefix_cache_hits_total", "counter", (double)st.prefix_hits);
	gauge(&b, "loom_prefix_cache_lookups_total", "counter", (double)st.prefix_lookups);
	gauge(&b, "loom_preemptions_total", "counter", (double)st.preemptions);
	gauge(&b, "loom_prompt_tokens_total", "counter", (double)st.prompt_tokens);
	gauge(&b, "loom_generation_tokens_total", "counter", (double)st.generated_tokens);
	gauge(&b, "loom_steps_total", "counter", (double)st.steps);
	spec_metrics(&b, srv);
	pthread_mutex_lock(&m->mu);
	gauge(&b, "loom_requests_rejected_total", "counter", (double)(m->rejected + st.rejected));
	hist_text(&b, "loom_time_to_first_token_seconds", &m->ttft);
	hist_text(&b, "loom_inter_token_latency_seconds", &m->itl);
	sb_puts(&b, "# TYPE loom_requests_total counter\n");
	for (s = 100; s < 600; s++)
		if (m->by_status[s])
			sb_printf(&b, "loom_requests_total{status=\"%u\"} %llu\n", s,
				  (unsigned long long)m->by_status[s]);
	pthread_mutex_unlock(&m->mu);
	if (b.failed) {
		sb_free(&b);
		return fail(c, srv, 500, NULL, "out of memory");
	}
	rc = send_bytes(c, 200, "text/plain; version=0.0.4", b.s, b.len, false, srv);
	sb_free(&b);
	return rc;
}

/* llama-server's convention: 200 {"status":"ok"} once the model is ready;
 * 503 with an error object whose message is "Loading model" before. While
 * draining at shutdown, 503 "Shutting down". */
static enum MHD_Result health(struct MHD_Connection *c, struct server *srv)
{
	int st = atomic_load(&srv->state);

	if (st == SRV_READY)
		return send_json(c, 200, json_pack("{s:s}", "status", "ok"), srv);
	return send_json(c, 503, json_pack("{s:{s:i,s:s,s:s}}", "error", "code", 503, "message",
					   st == SRV_LOADING ? "Loading model" : "Shutting down",
					   "type", "unavailable_error"), srv);
}

static enum MHD_Result route_get(struct MHD_Connection *c, struct server *srv, const char *url)
{
	if (!strcmp(url, "/health"))
		return health(c, srv);
	if (!strcmp(url, "/ready")) {
		bool ready = atomic_load(&srv->state) == SRV_READY;

		return send_json(c, ready ? 200 : 503,
				 json_pack("{s:s}", "status", ready ? "ready" :
					   atomic_load(&srv->state) == SRV_LOADING ? "loading" : "draining"),
				 srv);
	}
	if (!strcmp(url, "/metrics") && atomic_load(&srv->state) == SRV_LOADING)
		return fail(c, srv, 503, "model_loading", "Loading model");
	if (!strcmp(url, "/metrics"))
		return metrics_page(c, srv);
	if (!strcmp(url, "/v1/models"))
		return models(c, srv);
	if (!strcmp(url, "/api/tags") && atomic_load(&srv->state) == SRV_LOADING)
		return send_json(c, 503, json_pack("{s:s}", "error", "the model is still loading"), srv);
	if (!strcmp(url, "/api/tags"))
		return send_json(c, 200, ollama_tags(&srv->ollama), srv);
	if (!strcmp(url, "/api/version"))
		return send_json(c, 200, json_pack("{s:s}", "version", LOOM_OLLAMA_VERSION), srv);
	if (!strcmp(url, "/") || !strcmp(url, "/index.html"))
		return send_bytes(c, 200, "text/html; charset=utf-8", loom_index_html,
				  loom_index_html_len, false, srv);
	return fail(c, srv, 404, "not_found", "no such endpoint");
}

static bool is_post_route(const char *url)
{
	return post_endpoint(url) != EP_NONE;
}

static bool is_get_route(const char *url)
{
	return !strcmp(url, "/health") || !strcmp(url, "/ready") || !strcmp(url, "/metrics") ||
	       !strcmp(url, "/v1/models") || !strcmp(url, "/") || !strcmp(url, "/index.html") ||
	       !strcmp(url, "/api/tags") || !strcmp(url, "/api/version");
}

/* Paths open without the API key: probes and the chat page's HTML. */
static bool is_public(const char *url)
{
	return !strcmp(url, "/health") || !strcmp(url, "/ready") || !strcmp(url, "/") ||
	       !strcmp(url, "/index.html");
}

/* --api-key: every other endpoint (the /v1/ ones, /metrics, any added later)
 * needs "Authorization: Bearer KEY"; compared in time that does not depend
 * on where the first difference is. */
static bool authorized(struct MHD_Connection *c, const struct server *srv, const char *url)
{
	const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	size_t n = strlen(srv->api_key), i;
	unsigned char diff = 0;

	if (!srv->api_key[0] || is_public(url))
		return true;
	if (!h || strncasecmp(h, "Bearer ", 7))
		return false;
	h += 7;
	while (*h == ' ')
		h++;
	if (strlen(h) != n)
		return false;
	for (i = 0; i < n; i++)
		diff |= (unsigned char)(h[i] ^ srv->api_key[i]);
	return diff == 0;
}

/* --cors-origin: the answer to a browser's preflight OPTIONS request. */
static enum MHD_Result preflight(struct MHD_Connection *c, struct server *srv)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"",
								 MHD_RESPMEM_PERSISTENT);
	enum MHD_Result rc;

	if (!r)
		return MHD_NO;
	add_cors(r, srv);
	MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
	MHD_add_response_header(r, "Access-Control-Allow-Headers",
				"Authorization, Content-Type, Accept");
	MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
	rc = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
	MHD_destroy_response(r);
	metrics_count_status(&srv->metrics, MHD_HTTP_NO_CONTENT);
	return rc;
}

static enum MHD_Result route(struct MHD_Connection *c, struct server *srv, struct conn *cn,
			     const char *url, const char *method)
{
	bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");

	if (!strcmp(method, "OPTIONS") && srv->o.serve.cors_origin[0])
		return preflight(c, srv);
	cn->ep = post_endpoint(url); /* errors take the shape of its API */
	if (!authorized(c, srv, url))
		return fail_ep(c, srv, cn, 401, "invalid_api_key",
			       "Incorrect or missing API key: send 'Authorization: Bearer KEY'");
	if (post && is_post_route(url)) {
		enum endpoint ep = post_endpoint(url);
		enum MHD_Result rc_http;

		if (cn->too_big)
			return fail_ep(c, srv, cn, 413, "request_too_large",
				       "the request body is too large");
		if (wait_ready(c, srv, cn, &rc_http))
			return rc_http;
		return parse_start(c, srv, cn, ep);
	}
	if (get && is_get_route(url))
		return route_get(c, srv, url);
	if (is_post_route(url) || is_get_route(url))
		return fail(c, srv, 405, "method_not_allowed", "method not allowed on this endpoint");
	return fail(c, srv, 404, "not_found", "no such endpoint");
}

static struct sock *conn_sock(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* The deadline thread watches sk's client while j runs (NULL: no longer)
 * and cancels j when the client goes. NULL-safe. */
static void sock_watch(struct http *h, struct sock *sk, struct job *j)
{
	struct job *old;

	if (!sk)
		return;
	if (j)
		job_hold(j);
	pthread_mutex_lock(&h->mu);
	old = sk->job;
	sk->job = j;
	pthread_mutex_unlock(&h->mu);
	job_put(old);
}

/* Moves the socket's deadline to the next phase (NULL-safe). */
static void sock_phase(struct http *h, struct sock *sk, enum sock_phase ph)
{
	if (!sk)
		return;
	pthread_mutex_lock(&h->mu);
	if (sk->phase != PH_CLOSING) {
		sk->phase = ph;
		sk->t0 = now_s();
	}
	pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result add_arg_len(void *cls, enum MHD_ValueKind kind, const char *key,
				   const char *value)
{
	size_t *n = cls;

	(void)kind;
	*n += strlen(key) + (value ? strlen(value) : 0) + 2; /* '?' or '&', '=' */
	return MHD_YES;
}

/* The request target's length: the path MHD hands the handler plus its
 * query arguments (decoded, so a little under what was sent). */
static size_t uri_length(struct MHD_Connection *c, const char *url)
{
	size_t n = strlen(url);

	MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, add_arg_len, &n);
	return n;
}

/* First call, the headers read: a 414 or 431 for an oversized request
 * line or header block (as JSON; past MHD's own buffer, MHD answers
 * itself), a 413 for a declared body over --max-body. */
static enum MHD_Result on_first_call(struct MHD_Connection *c, struct server *srv,
				     const char *url, void **con_cls)
{
	const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
	const union MHD_ConnectionInfo *hs =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
	struct conn *cn = calloc(1, sizeof(*cn));

	if (!cn)
		return MHD_NO;
	*con_cls = cn;
	cn->pk = (struct parker){ .c = c, .h = srv->http };
	cn->t_arrive = now_s();
	cn->fd = conn_fd(c);
	sock_phase(srv->http, conn_sock(c), PH_BODY);
	if (uri_length(c, url) > MAX_URL) {
		cn->too_big = true;
		return fail(c, srv, 414, "uri_too_long", "the request URI is too long");
	}
	if (hs && hs->header_size > MAX_HEADERS) {
		cn->too_big = true;
		return fail(c, srv, 431, "headers_too_large", "the request headers are too large");
	}
	if (cl && strtoull(cl, NULL, 10) > srv->o.serve.max_body) {
		cn->too_big = true;
		return fail(c, srv, 413, "request_too_large", "the request body is too large");
	}
	return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version,
				  const char *upload, size_t *upload_size, void **con_cls)
{
	struct server *srv = cls;
	struct conn *cn = *con_cls;

	(void)version;
	if (!cn)
		return on_first_call(c, srv, url, con_cls);
	if (cn->job) /* woken from parking */
		return answer_whole(c, cn);
	if (cn->parse == PARSE_DONE) /* parsed */
		return parse_finish(c, srv, cn);
	if (*upload_size) {
		if (!cn->too_big && cn->body.len + *upload_size <= srv->o.serve.max_body)
			sb_putn(&cn->body, upload, *upload_size);
		else
			cn->too_big = true;
		if (cn->body.failed)
			cn->too_big = true;
		*upload_size = 0;
		return MHD_YES;
	}
	sock_phase(srv->http, conn_sock(c), PH_BUSY);
	return route(c, srv, cn, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct server *srv = cls;
	struct conn *cn = *con_cls;
	int i;

	(void)toe;
	/* keep-alive: the next request's headers are due from now */
	sock_phase(srv->http, conn_sock(c), PH_HEADERS);
	sock_watch(srv->http, conn_sock(c), NULL);
	if (!cn)
		return;
	if (cn->job) {
		job_cancel(cn->job); /* no-op unless the client left early */
		job_put(cn->job);
	}
	for (i = 0; i < SRV_MAX_N; i++)
		sb_free(&cn->texts[i]);
	serve_req_free(&cn->p.req);   /* what parse_finish did not take */
	serve_embed_free(&cn->p.ereq);
	json_decref(cn->p.reply);
	sb_free(&cn->body);
	free(cn);
	*con_cls = NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: a socket opens (its header deadline
 * starts) or closes. MHD closes the descriptor only after this returns,
 * so the deadline thread, which shuts sockets down under h->mu, never
 * touches a reused descriptor. */
static void on_socket(void *cls, struct MHD_Connection *c, void **socket_context,
		      enum MHD_ConnectionNotificationCode code)
{
	struct server *srv = cls;
	struct http *h = srv->http;
	struct sock *sk = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		sk = calloc(1, sizeof(*sk));
		if (!sk)
			return; /* no deadline for this one; MHD's idle timeout still applies */
		sk->fd = conn_fd(c);
		sk->t0 = now_s();
		sk->phase = PH_HEADERS;
		pthread_mutex_lock(&h->mu);
		sk->next = h->socks;
		if (h->socks)
			h->socks->prev = sk;
		h->socks = sk;
		pthread_mutex_unlock(&h->mu);
		*socket_context = sk;
		return;
	}
	if (!sk)
		return;
	pthread_mutex_lock(&h->mu);
	if (sk->prev)
		sk->prev->next = sk->next;
	else
		h->socks = sk->next;
	if (sk->next)
		sk->next->prev = sk->prev;
	pthread_mutex_unlock(&h->mu);
	job_put(sk->job);
	free(sk);
	*socket_context = NULL;
}

/* ---- the deadline thread ---- */

/* Shuts down the sockets past their header or body deadline; MHD then
 * reads the end of the stream and closes them. */
static void enforce_deadlines(struct http *h)
{
	const struct loom_serve_options *so = &h->srv->o.serve;
	double now = now_s();
	struct sock *sk;

	pthread_mutex_lock(&h->mu);
	for (sk = h->socks; sk; sk = sk->next) {
		bool late = (sk->phase == PH_HEADERS && now - sk->t0 > so->header_timeout) ||
			    (sk->phase == PH_BODY && now - sk->t0 > so->body_timeout);

		if (late && sk->fd >= 0) {
			shutdown(sk->fd, SHUT_RDWR);
			sk->phase = PH_CLOSING;
		}
	}
	pthread_mutex_unlock(&h->mu);
}

/* Cancels the requests whose clients have gone, and wakes them so that
 * their connections end; their KV blocks return at the engine's next
 * step. Every tick, so a client that leaves a long request (streaming or
 * not) stops costing within TICK_MS plus a step. */
static void watch_clients(struct http *h)
{
	struct sock *sk;

	pthread_mutex_lock(&h->mu);
	for (sk = h->socks; sk; sk = sk->next) {
		struct job *j = sk->job;

		if (!j || !client_gone(h, sk->fd))
			continue;
		sk->job = NULL;
		job_cancel(j);
		job_unpark(j);
		job_put(j);
	}
	pthread_mutex_unlock(&h->mu);
}

/* Resumes the requests waiting for the model: each looks at the state
 * again and parks anew, answers, or gives up at --load-wait. */
static void wake_loading(struct http *h)
{
	struct conn *cn, *next;

	pthread_mutex_lock(&h->mu);
	for (cn = h->loading; cn; cn = next) {
		next = cn->lnext;
		cn->lnext = NULL;
		MHD_resume_connection(cn->pk.c);
		atomic_fetch_sub(&h->n_suspended, 1);
	}
	h->loading = NULL;
	pthread_mutex_unlock(&h->mu);
}

static void *timer_main(void *arg)
{
	struct http *h = arg;
	struct timespec ts = { 0, TICK_MS * 1000000L };
	unsigned tick = 0;

	while (!atomic_load(&h->timer_quit)) {
		nanosleep(&ts, NULL);
		enforce_deadlines(h);
		watch_clients(h);
		wake_loading(h);
		if (++tick % UNPARK_TICKS == 0 || atomic_load(&h->stopping))
			server_unpark_all(h->srv);
	}
	return NULL;
}

static int bind_addr(struct server *srv, struct sockaddr_storage *ss, unsigned *flags,
		     char *err, size_t errlen)
{
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;

	memset(ss, 0, sizeof(*ss));
	if (inet_pton(AF_INET, srv->o.serve.host, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons((uint16_t)srv->o.serve.port);
		return 0;
	}
	if (inet_pton(AF_INET6, srv->o.serve.host, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons((uint16_t)srv->o.serve.port);
		*flags |= MHD_USE_IPv6;
		return 0;
	}
	snprintf(err, errlen, "--host: '%s' is not an IPv4 or IPv6 address", srv->o.serve.host);
	return -1;
}

/* MHD's error log, rate-limited: a flood of broken connections would
 * otherwise write a line each. At most LOG_BURST lines per LOG_WINDOW
 * seconds, then one line saying how many were dropped. */
#define LOG_BURST 5
#define LOG_WINDOW 10.0

static void http_log(void *cls, const char *fmt, va_list ap)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static double window;
	static int shown;
	static unsigned long dropped;
	double now = now_s();

	(void)cls;
	pthread_mutex_lock(&mu);
	if (now - window > LOG_WINDOW) {
		if (dropped)
			fprintf(stderr, "loom serve: http: %lu more messages in %.0f s not shown\n",
				dropped, LOG_WINDOW);
		window = now;
		shown = 0;
		dropped = 0;
	}
	if (shown < LOG_BURST) {
		shown++;
		fputs("loom serve: http: ", stderr);
		vfprintf(stderr, fmt, ap);
		if (!strchr(fmt, '\n'))
			fputc('\n', stderr);
	} else {
		dropped++;
	}
	pthread_mutex_unlock(&mu);
}

static void http_free(struct http *h)
{
	if (!h)
		return;
	parse_pool_free(h->parse);
	pthread_mutex_destroy(&h->mu);
	free(h);
}

struct MHD_Daemon *http_start(struct server *srv, char *err, size_t errlen)
{
	const struct loom_serve_options *so = &srv->o.serve;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
			 MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
	struct sockaddr_storage ss;
	struct MHD_Daemon *d;
	struct http *h;

	if (bind_addr(srv, &ss, &flags, err, errlen))
		return NULL;
	h = calloc(1, sizeof(*h));
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	h->srv = srv;
	pthread_mutex_init(&h->mu, NULL);
	srv->http = h;
	h->parse = parse_pool_start(so->http_threads);
	if (!h->parse) {
		snprintf(err, errlen, "cannot start the request parse threads");
		goto out_free;
	}
	parse_pool_set_caps(h->parse, so->max_queued_per_client, so->max_queued);
	d = MHD_start_daemon(flags, (uint16_t)so->port, NULL, NULL, on_request, srv,
			     MHD_OPTION_EXTERNAL_LOGGER, http_log, srv, /* first, as MHD asks */
			     MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
			     MHD_OPTION_THREAD_POOL_SIZE, (unsigned)so->http_threads,
			     MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
			     MHD_OPTION_NOTIFY_CONNECTION, on_socket, srv,
			     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)so->idle_timeout,
			     MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)MHD_POOL,
			     MHD_OPTION_CONNECTION_LIMIT, (unsigned)so->max_conns,
			     MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)so->max_conns_per_ip,
			     MHD_OPTION_END);
	if (!d) {
		snprintf(err, errlen, "cannot listen on %s port %d (in use, or no permission)",
			 so->host, so->port);
		goto out_free;
	}
	if (pthread_create(&h->timer, NULL, timer_main, h)) {
		snprintf(err, errlen, "cannot start the connection deadline thread");
		MHD_stop_daemon(d);
		goto out_free;
	}
	h->timer_started = true;
	return d;
out_free:
	srv->http = NULL;
	http_free(h);
	return NULL;
}

void http_stop(struct server *srv, struct MHD_Daemon *d)
{
	struct http *h = srv->http;
	double t0 = now_s();

	atomic_store(&h->stopping, true);
	/* the timer resumes parked and loading requests every tick; those
	 * answer or end instead of parking again */
	while (atomic_load(&h->n_suspended) > 0 && now_s() - t0 < 10.0) {
		struct timespec ts = { 0, 20 * 1000000L };

		server_unpark_all(srv);
		wake_loading(h);
		nanosleep(&ts, NULL);
	}
	if (atomic_load(&h->n_suspended) > 0)
		fprintf(stderr, "loom serve: %d connections still suspended at exit\n",
			atomic_load(&h->n_suspended));
	parse_pool_stop(h->parse); /* later requests are answered 503 */
	MHD_stop_daemon(d);
	atomic_store(&h->timer_quit, true);
	if (h->timer_started)
		pthread_join(h->timer, NULL);
	srv->http = NULL;
	http_free(h);
}
