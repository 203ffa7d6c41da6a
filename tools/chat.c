/* loom chat: a conversation in the model's chat template, on the one
 * engine path (loom_submit + loom_engine_step on this thread).
 *
 * Every turn renders the whole history through loom_chat_tokenize, so
 * special tokens come only from the template and a message is always
 * tokenized as text; the engine's prefix cache keeps the turns already
 * computed. Ctrl-C cancels the reply being generated; at the prompt a
 * second Ctrl-C in a row exits. When stdin is not a terminal, each line is
 * a turn and a line of statistics per reply goes to stderr. */
#include "chat.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PIECE_MAX 1024  /* bytes of one detokenized piece at most */
#define REPLY_ROOM 256  /* tokens kept free for a reply when -n is not set */

struct chat {
	struct loom_engine *e;
	const struct loom_tokenizer *tok;
	struct loom_chat_template tmpl;
	int32_t bos;              /* prepended to the rendered chat, or -1 */
	struct loom_chat_msg *msgs; /* contents malloc'd */
	size_t n, cap;
	size_t n_fixed;           /* the system message, kept by /reset */
	const struct loom_options *o;
	uint64_t seed;
	bool tty;
};

/* One reply as it streams. */
struct reply {
	struct chat *c;
	uint64_t id;
	struct loom_detok dt;
	char *text;
	size_t len, cap;
	bool done, oom;
	enum loom_finish finish;
	int32_t n_prompt, n_cached, n_generated;
	char error[256];
	double t_first;
};

static volatile sig_atomic_t n_interrupts;

static void on_sigint(int sig)
{
	(void)sig;
	n_interrupts++;
}

/* restart: whether a Ctrl-C lets a blocked read go on (while generating)
 * or ends it (at the prompt, so that the line read returns). */
static void catch_sigint(bool restart)
{
	struct sigaction sa = { .sa_handler = on_sigint };

	sigemptyset(&sa.sa_mask);
	sa.sa_flags = restart ? SA_RESTART : 0;
	sigaction(SIGINT, &sa, NULL);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
	if (*len + n + 1 > *cap) {
		size_t want = (*len + n + 1) * 2;
		char *nb = realloc(*buf, want);

		if (!nb)
			return -1;
		*buf = nb;
		*cap = want;
	}
	memcpy(*buf + *len, s, n);
	*len += n;
	(*buf)[*len] = '\0';
	return 0;
}

static void reply_token(struct reply *r, int32_t token)
{
	char piece[PIECE_MAX];
	int len = loom_detokenize(r->c->tok, &r->dt, token, piece, sizeof(piece));

	if (!r->t_first)
		r->t_first = now_s();
	if (len <= 0)
		return;
	fwrite(piece, 1, (size_t)len, stdout);
	fflush(stdout);
	if (append(&r->text, &r->len, &r->cap, piece, (size_t)len))
		r->oom = true;
}

static void on_event(void *user, const struct loom_event *ev)
{
	struct reply *r = user;

	if (ev->token >= 0)
		reply_token(r, ev->token);
	if (ev->finish == LOOM_FINISH_NONE)
		return;
	if (r->dt.n_pending) { /* a character the reply leaves unfinished */
		fwrite("\xef\xbf\xbd", 1, 3, stdout);
		if (append(&r->text, &r->len, &r->cap, "\xef\xbf\xbd", 3))
			r->oom = true;
		r->dt.n_pending = 0;
	}
	r->done = true;
	r->finish = ev->finish;
	r->n_prompt = ev->n_prompt;
	r->n_cached = ev->n_cached;
	r->n_generated = ev->n_generated;
	if (ev->error)
		snprintf(r->error, sizeof(r->error), "%s", ev->error);
}

static int push_msg(struct chat *c, const char *role, const char *content, size_t len)
{
	char *copy = malloc(len + 1);

	if (!copy)
		return -1;
	memcpy(copy, content, len);
	copy[len] = '\0';
	if (c->n == c->cap) {
		size_t want = c->cap ? 2 * c->cap : 16;
		struct loom_chat_msg *nm = realloc(c->msgs, want * sizeof(*nm));

		if (!nm) {
			free(copy);
			return -1;
		}
		c->msgs = nm;
		c->cap = want;
	}
	c->msgs[c->n++] = (struct loom_chat_msg){ .role = role, .content = copy };
	return 0;
}

/* Forgets messages [from, from + k). */
static void drop_msgs(struct chat *c, size_t from, size_t k)
{
	size_t i;

	if (!k) /* msgs may still be NULL: memmove must not see it */
		return;
	for (i = from; i < from + k; i++)
		free((char *)c->msgs[i].content);
	memmove(c->msgs + from, c->msgs + from + k, (c->n - from - k) * sizeof(*c->msgs));
	c->n -= k;
}

/* The history's ids (BOS first where the model wants one), or NULL with
 * err set. */
static int32_t *chat_ids(struct chat *c, int64_t *n, char *err, size_t errlen)
{
	int32_t *ids = NULL, *all;
	int64_t k = loom_chat_tokenize(c->tok, &c->tmpl, c->msgs, c->n, true, &ids, err, errlen);

	if (k < 0)
		return NULL;
	if (c->bos < 0) {
		*n = k;
		return ids;
	}
	all = malloc(sizeof(int32_t) * (size_t)(k + 1));
	if (!all) {
		free(ids);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	all[0] = c->bos;
	memcpy(all + 1, ids, sizeof(int32_t) * (size_t)k);
	free(ids);
	*n = k + 1;
	return all;
}

/* The history's ids, dropping the oldest exchanges until the prompt
 * leaves room for a reply in the context. */
static int32_t *fitting_ids(struct chat *c, int64_t *n, char *err, size_t errlen)
{
	int64_t n_ctx = loom_engine_n_ctx(c->e);
	int64_t room = c->o->n_predict > 0 ? c->o->n_predict : REPLY_ROOM;
	bool dropped = false;
	int32_t *ids;

	if (room > n_ctx / 2 && c->o->n_predict <= 0)
		room = n_ctx / 2;
	for (;;) {
		if (!(ids = chat_ids(c, n, err, errlen)))
			return NULL;
		if (*n + room <= n_ctx)
			break;
		free(ids);
		if (c->n - c->n_fixed < 2) {
			snprintf(err, errlen, "the message (%lld tokens with the template) and %lld tokens for the reply do not fit the context of %lld (-c)",
				 (long long)*n, (long long)room, (long long)n_ctx);
			return NULL;
		}
		/* the oldest user message and the reply to it */
		drop_msgs(c, c->n_fixed, 2);
		dropped = true;
	}
	if (dropped)
		fprintf(stderr, "loom chat: the oldest turns were dropped to fit the context (%lld tokens)\n",
			(long long)n_ctx);
	return ids;
}

static void fill_request(const struct chat *c, struct loom_request *rq, struct reply *r)
{
	const struct loom_options *o = c->o;

	loom_request_init(rq);
	rq->n_predict = o->n_predict > 0 ? o->n_predict : 0;
	rq->sampling = o->sp;
	rq->sampling.seed = c->seed;
	rq->on_event = on_event;
	rq->user = r;
}

/* Steps the engine until the reply ends; a Ctrl-C cancels it. */
static int step_to_end(struct chat *c, struct reply *r, char *err, size_t errlen)
{
	bool cancelled = false;

	n_interrupts = 0;
	catch_sigint(true);
	while (!r->done) {
		if (n_interrupts && !cancelled) {
			loom_cancel(c->e, r->id);
			cancelled = true;
		}
		if (loom_engine_step(c->e) == 0 && !r->done) {
			snprintf(err, errlen, "engine: the reply is neither running nor finished");
			return -1;
		}
	}
	n_interrupts = 0; /* the Ctrl-C that stopped the reply counts no more */
	if (r->finish == LOOM_FINISH_ERROR) {
		snprintf(err, errlen, "%s", r->error[0] ? r->error : "backend failure");
		return -1;
	}
	return 0;
}

static void print_stats(const struct chat *c, const struct reply *r, double t0)
{
	double gen = r->t_first ? now_s() - r->t_first : 0;

	if (c->tty)
		return;
	fprintf(stderr, "loom chat: prompt %d tokens (%d cached) in %.3f s, reply %d tokens in %.3f s (%.1f t/s)%s\n",
		r->n_prompt, r->n_cached, (r->t_first ? r->t_first : now_s()) - t0,
		r->n_generated, gen, gen > 0 ? (double)r->n_generated / gen : 0.0,
		r->finish == LOOM_FINISH_CANCELLED ? ", stopped" : "");
}

/* Generates the assistant's reply to the history, streaming it, and
 * appends it (what came before a Ctrl-C too) to the history. */
static int chat_reply(struct chat *c, char *err, size_t errlen)
{
	struct reply r = { .c = c, .dt = { .first = true } };
	struct loom_request rq;
	int64_t n;
	int32_t *ids = fitting_ids(c, &n, err, errlen);
	double t0 = now_s();
	int rc;

	if (!ids)
		return -1;
	fill_request(c, &rq, &r);
	rq.prompt = ids;
	rq.n_prompt = (int32_t)n;
	rc = loom_submit(c->e, &rq, &r.id, err, errlen);
	free(ids);
	if (!rc)
		rc = step_to_end(c, &r, err, errlen);
	fputc('\n', stdout);
	fflush(stdout);
	if (!rc && r.oom) {
		snprintf(err, errlen, "out of memory");
		rc = -1;
	}
	if (!rc) {
		print_stats(c, &r, t0);
		rc = push_msg(c, "assistant", r.text ? r.text : "", r.len);
		if (rc)
			snprintf(err, errlen, "out of memory");
	}
	free(r.text);
	c->seed++; /* each reply its own draw, the run still reproducible */
	return rc;
}

/* Reads one turn: a line, and the lines after one ending in '\'. 1 with
 * the text in *buf, 0 at the end of input, -1 on a Ctrl-C. */
static int read_turn(struct chat *c, char **buf, size_t *len)
{
	char *line = NULL;
	size_t cap = 0, bcap = 0;
	ssize_t k;

	*len = 0;
	catch_sigint(false);
	for (;;) {
		if (c->tty)
			fputs(*len ? ". " : "> ", stdout), fflush(stdout);
		k = getline(&line, &cap, stdin);
		if (k < 0) {
			bool intr = ferror(stdin) && errno == EINTR;

			clearerr(stdin);
			free(line);
			return intr ? -1 : (*len ? 1 : 0);
		}
		if (k && line[k - 1] == '\n')
			line[--k] = '\0';
		if (k && line[k - 1] == '\r')
			line[--k] = '\0';
		bool more = k && line[k - 1] == '\\';

		if (append(buf, len, &bcap, line, (size_t)(k - more)) ||
		    (more && append(buf, len, &bcap, "\n", 1))) {
			free(line);
			return 0;
		}
		if (!more)
			break;
	}
	free(line);
	return 1;
}

/* "/reset", "/exit": 1 handled, 2 exit, 0 not a command. */
static int chat_command(struct chat *c, const char *text)
{
	if (!strcmp(text, "/exit") || !strcmp(text, "/quit"))
		return 2;
	if (!strcmp(text, "/reset")) {
		drop_msgs(c, c->n_fixed, c->n - c->n_fixed);
		if (c->tty)
			fputs("(history cleared)\n", stdout);
		return 1;
	}
	if (text[0] == '/' && !strchr(text, ' ') && strlen(text) < 32) {
		fprintf(stderr, "loom chat: unknown command '%s' (/reset, /exit; start a message with a space to send it as text)\n",
			text);
		return 1;
	}
	return 0;
}

/* One turn: 1 go on, 0 exit, -1 a fatal error in err. */
static int chat_turn(struct chat *c, char *err, size_t errlen)
{
	char *text = NULL;
	size_t len = 0;
	int rc = read_turn(c, &text, &len), cmd;

	if (rc < 0) { /* Ctrl-C at the prompt: the second in a row exits */
		free(text);
		if (n_interrupts >= 2)
			return 0;
		fputs("\n(Ctrl-C again or /exit to quit)\n", stdout);
		return 1;
	}
	n_interrupts = 0;
	if (rc == 0 || !text) {
		free(text);
		return 0;
	}
	cmd = chat_command(c, text);
	if (cmd || !len) {
		free(text);
		return cmd == 2 ? 0 : 1;
	}
	rc = push_msg(c, "user", text, len);
	free(text);
	if (rc) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (chat_reply(c, err, errlen)) {
		/* a turn that could not run is forgotten, the chat goes on */
		fprintf(stderr, "loom chat: %s\n", err);
		err[0] = '\0';
		if (c->n > c->n_fixed && !strcmp(c->msgs[c->n - 1].role, "user"))
			drop_msgs(c, c->n - 1, 1);
	}
	return 1;
}

/* The system message of -sys or -sysf, if any. */
static int system_message(struct chat *c, char *err, size_t errlen)
{
	const struct loom_options *o = c->o;
	char *text;
	size_t len;
	int rc;

	if (o->system_prompt && o->system_prompt_file[0]) {
		snprintf(err, errlen, "-sys and -sysf exclude each other");
		return -1;
	}
	if (o->system_prompt)
		rc = push_msg(c, "system", o->system_prompt, strlen(o->system_prompt));
	else if (o->system_prompt_file[0]) {
		if (!(text = loom_read_text(o->system_prompt_file, &len, err, errlen)))
			return -1;
		rc = push_msg(c, "system", text, len);
		free(text);
	} else
		return 0;
	if (rc)
		snprintf(err, errlen, "out of memory");
	c->n_fixed = c->n;
	return rc;
}

static int chat_open(struct chat *c, char *err, size_t errlen)
{
	struct loom_engine_params ep;
	int32_t ids[4];

	loom_options_engine_params(c->o, &ep);
	/* as loom run: the model's context unless -c, capped to the KV
	 * reservation (--kv-mem) */
	ep.n_ctx = c->o->ctx_given ? c->o->n_ctx : 0;
	ep.kv_bytes = (int64_t)c->o->serve.kv_mem;
	ep.n_batch = c->o->n_batch;
	ep.block_size = c->o->serve.block_size;
	ep.progress = c->o->progress && c->tty;
	/* earlier turns are served from the prefix cache, with the same
	 * tokens as if computed afresh */
	ep.batch_invariant = true;
	ep.prefix_cache = 1;
	if (!(c->e = loom_engine_open(&ep, err, errlen)))
		return -1;
	c->tok = loom_engine_tokenizer(c->e);
	if (c->o->chat_template[0]) {
		if (loom_engine_chat_template_file(c->e, c->o->chat_template, &c->tmpl, err, errlen))
			return -1;
	} else {
		bool had_one;

		if (loom_engine_chat_template(c->e, &c->tmpl, &had_one, err, errlen))
			return -1;
		if (!had_one)
			fprintf(stderr, "loom chat: warning: the model has no chat template; using the built-in %s format (--chat-template FILE to give one)\n",
				loom_chat_family_name(c->tmpl.family));
	}
	c->bos = loom_tokenize(c->tok, "", 0, true, false, ids, 4) >= 1 &&
		 ids[0] == loom_tokenizer_bos(c->tok) ? loom_tokenizer_bos(c->tok) : -1;
	return 0;
}

int loom_chat_main(struct loom_options *o, uint64_t seed, char *err, size_t errlen)
{
	struct chat c = { .o = o, .seed = seed, .tty = isatty(0) && isatty(1) };
	int rc = 0;

	if (!o->model[0]) {
		snprintf(err, errlen, "no model given (--model FILE)");
		return -1;
	}
	if (system_message(&c, err, errlen) || chat_open(&c, err, errlen))
		rc = -1;
	if (!rc && c.tty)
		fprintf(stderr, "loom chat: %s, template %s; /reset clears the history, /exit quits, Ctrl-C stops a reply; a line ending in \\ continues\n",
			loom_engine_model_name(c.e), loom_chat_family_name(c.tmpl.family));
	while (!rc) {
		int turn = chat_turn(&c, err, errlen);

		if (turn != 1) {
			rc = turn;
			break;
		}
	}
	signal(SIGINT, SIG_DFL);
	drop_msgs(&c, 0, c.n);
	free(c.msgs);
	loom_chat_template_free(&c.tmpl);
	loom_engine_close(c.e);
	return rc < 0 ? -1 : 0;
}
