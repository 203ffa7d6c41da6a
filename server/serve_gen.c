/* `loom serve`: requests, their scheduler events, stop strings, metrics. */
#include "serve_int.h"
#include "serve_api.h"

#include <jansson.h>
#include <math.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- metrics ---- */

static void hist_init(struct hist *h, const double *bounds, int n)
{
	memset(h, 0, sizeof(*h));
	h->n = n;
	memcpy(h->bounds, bounds, sizeof(double) * (size_t)n);
}

void metrics_init(struct metrics *m)
{
	static const double ttft[] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60 };
	static const double itl[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5 };

	memset(m, 0, sizeof(*m));
	pthread_mutex_init(&m->mu, NULL);
	hist_init(&m->ttft, ttft, (int)(sizeof(ttft) / sizeof(ttft[0])));
	hist_init(&m->itl, itl, (int)(sizeof(itl) / sizeof(itl[0])));
}

void metrics_observe(struct metrics *m, struct hist *h, double v)
{
	int i = 0;

	pthread_mutex_lock(&m->mu);
	while (i < h->n && v > h->bounds[i])
		i++;
	h->counts[i]++;
	h->sum += v;
	h->total++;
	pthread_mutex_unlock(&m->mu);
}

void metrics_count_status(struct metrics *m, unsigned status)
{
	pthread_mutex_lock(&m->mu);
	if (status < 600)
		m->by_status[status]++;
	pthread_mutex_unlock(&m->mu);
}

void metrics_count_rejected(struct metrics *m)
{
	pthread_mutex_lock(&m->mu);
	m->rejected++;
	pthread_mutex_unlock(&m->mu);
}

/* ---- jobs ---- */

struct job *job_new(struct server *srv)
{
	struct job *j = calloc(1, sizeof(*j));
	int i;

	if (!j)
		return NULL;
	j->srv = srv;
	j->refs = 1;
	j->n = 1;
	j->t_start = now_s();
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	for (i = 0; i < SRV_MAX_N; i++) {
		j->gens[i].job = j;
		j->gens[i].index = i;
		j->gens[i].dt.first = true;
	}
	return j;
}

/* A seed for a request that names none: different every time. */
static uint64_t fresh_seed(void)
{
	static _Atomic uint64_t counter;
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)ts.tv_sec ^
	       (counter++ << 32);
}

/* Moves n prompts into j: choice i is prompt i / per (n per prompt). */
static void take_prompts(struct job *j, int32_t **prompts, const int32_t *lens, int n, int per)
{
	int i;

	j->n_prompts = n;
	j->n_per_prompt = per;
	j->n = n * per;
	j->n_prompt = 0;
	for (i = 0; i < n; i++) {
		j->prompts[i] = prompts[i];
		j->prompt_lens[i] = lens[i];
		j->n_prompt += lens[i];
	}
	j->prompt = j->prompts[0];
	for (i = 0; i < j->n; i++)
		j->gens[i].prompt = i / per;
}

void job_take_req(struct job *j, struct serve_req *r)
{
	j->chat = r->chat;
	j->stream = r->stream;
	j->include_usage = r->include_usage;
	j->n = r->n;
	j->max_tokens = r->max_tokens;
	j->sp = r->sp;
	if (!r->seed_given)
		j->sp.seed = fresh_seed();
	j->spec = r->spec; /* one of the server's spec_names, or NULL */
	j->spec_max_draft = r->spec_max_draft;
	memcpy(j->stop, r->stop, sizeof(j->stop));
	j->n_stop = r->n_stop;
	j->grammar = r->grammar;
	j->tool_mode = r->tool_mode;
	j->logprobs = r->logprobs;
	j->top_logprobs = r->top_logprobs;
	j->echo = r->echo;
	j->api = r->api;
	j->tool_format = r->tool_format;
	take_prompts(j, r->prompts, r->prompt_lens, r->n_prompts, r->n);
	memset(r, 0, sizeof(*r));
}

void job_take_embed(struct job *j, struct serve_embed_req *r)
{
	j->embed = true;
	j->embed_base64 = r->base64;
	j->max_tokens = 1;
	loom_sampler_defaults(&j->sp);
	j->sp.temp = 0;
	take_prompts(j, r->inputs, r->input_lens, r->n_inputs, 1);
	memset(r, 0, sizeof(*r));
}

static void job_free(struct job *j)
{
	int i;

	for (i = 0; i < SRV_MAX_N; i++) {
		free(j->gens[i].toks);
		sb_free(&j->gens[i].pending);
		sb_free(&j->gens[i].tool_buf);
		free(j->gens[i].lps);
		free(j->gens[i].prompt_lp);
		free(j->gens[i].hidden);
		json_decref(j->gens[i].lp_items);
	}
	for (i = 0; i < j->n_stop; i++)
		free(j->stop[i]);
	for (i = 0; i < j->n_prompts; i++)
		free(j->prompts[i]);
	loom_grammar_free(j->grammar);
	sb_free(&j->out);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	free(j);
}

void job_hold(struct job *j)
{
	pthread_mutex_lock(&j->mu);
	j->refs++;
	pthread_mutex_unlock(&j->mu);
}

void job_put(struct job *j)
{
	int left;

	if (!j)
		return;
	pthread_mutex_lock(&j->mu);
	left = --j->refs;
	pthread_mutex_unlock(&j->mu);
	if (left == 0)
		job_free(j);
}

static void list_add(struct server *srv, struct job *j)
{
	pthread_mutex_lock(&srv->lock);
	j->next = srv->jobs;
	j->prev = NULL;
	if (srv->jobs)
		srv->jobs->prev = j;
	srv->jobs = j;
	j->listed = true;
	pthread_mutex_unlock(&srv->lock);
}

/* Called under srv->lock. */
static void list_del(struct server *srv, struct job *j)
{
	if (!j->listed)
		return;
	if (j->prev)
		j->prev->next = j->next;
	else
		srv->jobs = j->next;
	if (j->next)
		j->next->prev = j->prev;
	j->listed = false;
}

/* The logprob entries of a token event: 1 + top_logprobs per token, kept
 * beside toks (a failed allocation fails the choice, as gen_push). */
static void gen_push_lp(struct gen *g, const struct loom_event *ev)
{
	size_t w = 1 + (size_t)g->job->top_logprobs, at = (g->n_toks - 1) * w;
	struct loom_token_logprob *e;

	if (at + w > g->cap_lps) {
		size_t cap = g->cap_lps ? g->cap_lps * 2 : 64 * w;
		struct loom_token_logprob *n;

		while (cap < at + w)
			cap *= 2;
		n = realloc(g->lps, cap * sizeof(*n));
		if (!n) {
			g->finish = LOOM_FINISH_ERROR;
			snprintf(g->error, sizeof(g->error), "out of memory");
			return;
		}
		g->lps = n;
		g->cap_lps = cap;
	}
	e = g->lps + at;
	e[0] = (struct loom_token_logprob){ ev->token, ev->logprob };
	for (size_t k = 1; k < w; k++)
		e[k] = (int32_t)k <= ev->n_top ? ev->top[k - 1] :
		       (struct loom_token_logprob){ -1, NAN };
}

static void gen_push(struct gen *g, int32_t tok)
{
	if (g->n_toks == g->cap_toks) {
		size_t cap = g->cap_toks ? g->cap_toks * 2 : 64;
		int32_t *nt = realloc(g->toks, cap * sizeof(*nt));

		if (!nt) {
			g->finish = LOOM_FINISH_ERROR;
			snprintf(g->error, sizeof(g->error), "out of memory");
			return;
		}
		g->toks = nt;
		g->cap_toks = cap;
	}
	g->toks[g->n_toks++] = tok;
}

/* Engine thread: one event of a request. */
static void on_event(void *user, const struct loom_event *ev)
{
	struct gen *g = user;
	struct job *j = g->job;
	struct server *srv = j->srv;
	double t = now_s();
	bool final = ev->finish != LOOM_FINISH_NONE;

	pthread_mutex_lock(&j->mu);
	if (ev->token >= 0) {
		if (g->t_last == 0) {
			metrics_observe(&srv->metrics, &srv->metrics.ttft, t - j->t_start);
			g->t_first = t;
		}
		else
			metrics_observe(&srv->metrics, &srv->metrics.itl, t - g->t_last);
		g->t_last = t;
		gen_push(g, ev->token);
		if (j->logprobs && g->finish != LOOM_FINISH_ERROR)
			gen_push_lp(g, ev);
	}
	if (final) {
		g->sched_done = true;
		if (g->finish != LOOM_FINISH_ERROR)
			g->finish = ev->finish;
		if (ev->error)
			snprintf(g->error, sizeof(g->error), "%s", ev->error);
	}
	pthread_cond_broadcast(&j->cv);
	if (j->parked) {
		j->wake(j->parked);
		j->parked = NULL;
	}
	pthread_mutex_unlock(&j->mu);
	if (!final)
		return;
	pthread_mutex_lock(&srv->lock);
	if (--srv->n_gens_active == 0)
		pthread_cond_broadcast(&srv->idle);
	pthread_mutex_lock(&j->mu);
	if (j->listed) {
		int i, live = 0;

		for (i = 0; i < j->n; i++)
			live += j->gens[i].submitted && !j->gens[i].sched_done;
		if (!live)
			list_del(srv, j);
	}
	pthread_mutex_unlock(&j->mu);
	pthread_mutex_unlock(&srv->lock);
	job_put(j); /* the engine request's reference */
}

/* The engine's output buffers of choice g: prompt logprobs for echo,
 * hidden states for embeddings. 0, or -1 out of memory. */
static int gen_buffers(struct job *j, struct gen *g, struct loom_request *r)
{
	size_t n = (size_t)r->n_prompt;

	r->logprobs = j->logprobs;
	r->top_logprobs = j->top_logprobs;
	if (j->echo && j->logprobs) {
		g->prompt_lp = calloc(n * (1 + (size_t)j->top_logprobs), sizeof(*g->prompt_lp));
		r->prompt_logprobs = g->prompt_lp;
		if (!g->prompt_lp)
			return -1;
	}
	if (j->embed) {
		g->hidden = calloc(n * (size_t)loom_engine_n_embd(j->srv->engine), sizeof(float));
		r->hidden = g->hidden;
		if (!g->hidden)
			return -1;
	}
	return 0;
}

/* Tests only (serve_int.h): sleeps the milliseconds the environment
 * variable `name` gives (0 < N <= 10000), else returns at once. */
void test_delay(const char *name)
{
	const char *v = getenv(name);
	int ms = v ? atoi(v) : 0;

	if (ms > 0 && ms <= 10000)
		nanosleep(&(struct timespec){ .tv_sec = ms / 1000,
					      .tv_nsec = (long)(ms % 1000) * 1000000 }, NULL);
}

/* True once j is cancelled; the choices from i on, never submitted, are
 * then ended as cancelled, as the engine would end them. */
static bool skip_cancelled(struct job *j, int i)
{
	bool stop;

	pthread_mutex_lock(&j->mu);
	stop = j->cancelled;
	for (; stop && i < j->n; i++) {
		j->gens[i].sched_done = true;
		j->gens[i].finish = LOOM_FINISH_CANCELLED;
	}
	pthread_mutex_unlock(&j->mu);
	return stop;
}

/* Submits choice g. 0, or loom_submit's status. A job_cancel that ran
 * while loom_submit did saw no id for g: g is cancelled here. */
static int submit_gen(struct job *j, struct gen *g, char *err, size_t errlen)
{
	struct server *srv = j->srv;
	struct loom_request r;
	bool late = false;
	uint64_t id;
	int rc;

	loom_request_init(&r);
	r.prompt = j->prompts[g->prompt];
	r.n_prompt = j->prompt_lens[g->prompt];
	r.n_predict = j->max_tokens > 0 ? j->max_tokens : 1; /* 0: echo only */
	if (gen_buffers(j, g, &r)) {
		snprintf(err, errlen, "out of memory");
		return LOOM_ERR_NOMEM;
	}
	r.sampling = j->sp;
	r.sampling.seed = j->sp.seed + (uint64_t)g->index;
	r.spec = j->spec ? j->spec : "none";
	r.spec_max_draft = j->spec_max_draft;
	r.on_event = on_event;
	r.user = g;
	r.grammar = j->grammar;
	pthread_mutex_lock(&srv->lock);
	srv->n_gens_active++;
	pthread_mutex_unlock(&srv->lock);
	pthread_mutex_lock(&j->mu);
	j->refs++;
	pthread_mutex_unlock(&j->mu);
	rc = loom_submit(srv->engine, &r, &id, err, errlen);
	pthread_mutex_lock(&j->mu);
	if (rc == 0) {
		g->id = id;
		g->submitted = true;
		late = j->cancelled;
	} else {
		j->refs--;
	}
	pthread_mutex_unlock(&j->mu);
	if (late)
		loom_cancel(srv->engine, id);
	if (rc) {
		pthread_mutex_lock(&srv->lock);
		if (--srv->n_gens_active == 0)
			pthread_cond_broadcast(&srv->idle);
		pthread_mutex_unlock(&srv->lock);
	}
	return rc;
}

int job_submit(struct job *j, char *err, size_t errlen)
{
	struct server *srv = j->srv;
	bool stopped = false;
	int i, rc = 0;

	list_add(srv, j);
	for (i = 0; i < j->n && rc == 0; i++) {
		if (i > 0)
			/* tests only: LOOM_TEST_SUBMIT_DELAY_MS=N waits N ms before each
			 * choice after the first, as a submitting thread starved on a
			 * loaded machine does, so that a test can leave while the n
			 * choices are still being submitted (test_serve_flood.py) */
			test_delay("LOOM_TEST_SUBMIT_DELAY_MS");
		stopped = skip_cancelled(j, i);
		if (stopped)
			break;
		rc = submit_gen(j, &j->gens[i], err, errlen);
	}
	if (rc || stopped) {
		job_cancel(j);
		pthread_mutex_lock(&srv->lock);
		pthread_mutex_lock(&j->mu);
		for (i = 0; i < j->n; i++)
			if (j->gens[i].submitted && !j->gens[i].sched_done)
				break;
		if (i == j->n)
			list_del(srv, j);
		pthread_mutex_unlock(&j->mu);
		pthread_mutex_unlock(&srv->lock);
	}
	return rc;
}

void job_cancel(struct job *j)
{
	uint64_t ids[SRV_MAX_N];
	int i, n = 0;

	pthread_mutex_lock(&j->mu);
	j->cancelled = true; /* job_submit submits no more choices */
	for (i = 0; i < j->n; i++)
		if (j->gens[i].submitted && !j->gens[i].sched_done)
			ids[n++] = j->gens[i].id;
	pthread_mutex_unlock(&j->mu);
	for (i = 0; i < n; i++)
		loom_cancel(j->srv->engine, ids[i]);
}

void server_cancel_all(struct server *srv)
{
	uint64_t *ids = NULL;
	size_t n = 0, cap = 0, i;
	struct job *j;

	pthread_mutex_lock(&srv->lock);
	for (j = srv->jobs; j; j = j->next) {
		int k;

		pthread_mutex_lock(&j->mu);
		j->cancelled = true; /* job_submit submits no more choices */
		for (k = 0; k < j->n; k++) {
			struct gen *g = &j->gens[k];

			if (!g->submitted || g->sched_done)
				continue;
			if (n == cap) {
				uint64_t *ni = realloc(ids, (cap = cap ? cap * 2 : 64) * sizeof(*ni));

				if (!ni)
					break;
				ids = ni;
			}
			ids[n++] = g->id;
		}
		pthread_mutex_unlock(&j->mu);
	}
	pthread_mutex_unlock(&srv->lock);
	for (i = 0; i < n; i++)
		loom_cancel(srv->engine, ids[i]);
	free(ids);
}

/* ---- stop strings ---- */

/* Earliest occurrence of any stop string in s[0..n): its offset, or -1. */
static long find_stop(const struct job *j, const char *s, size_t n)
{
	long best = -1;
	int k;

	for (k = 0; k < j->n_stop; k++) {
		size_t m = strlen(j->stop[k]), i;

		for (i = 0; m && i + m <= n; i++) {
			if (best >= 0 && (long)i >= best)
				break;
			if (!memcmp(s + i, j->stop[k], m)) {
				best = (long)i;
				break;
			}
		}
	}
	return best;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of a stop
 * string: text that must be held back until the next token decides. */
static size_t held_len(const struct job *j, const char *s, size_t n)
{
	size_t best = 0;
	int k;

	for (k = 0; k < j->n_stop; k++) {
		size_t m = strlen(j->stop[k]), l;

		for (l = m ? m - 1 : 0; l > best; l--)
			if (l <= n && !memcmp(s + n - l, j->stop[k], l)) {
				best = l;
				break;
			}
	}
	return best;
}

static void gen_finish(struct gen *g, const char *reason, job_emit_fn emit, void *user)
{
	struct sbuf *p = &g->pending;

	g->out_done = true;
	g->finish_reason = reason;
	emit(g->job, g, p->s ? p->s : "", p->len, true, user);
	p->len = 0;
}

/* The generation ends (an end-of-generation token, max_tokens) with a
 * character its tokens left unfinished: U+FFFD in its place, as the
 * non-streamed detokenization of the same tokens gives (serve_api.c). A
 * stop string's cut drops what follows it instead. */
static void gen_end_partial(struct gen *g)
{
	if (!g->dt.n_pending)
		return;
	sb_puts(&g->pending, "\xef\xbf\xbd");
	g->text_off += 3;
	g->dt.n_pending = 0;
}

/* Appends a logprob item for entries e (a token and its top ones) whose
 * text starts text_off bytes into the choice. */
static void gen_lp_item(struct gen *g, const struct loom_token_logprob *e)
{
	struct job *j = g->job;
	json_t *item;

	if (!g->lp_items)
		g->lp_items = json_array();
	item = api_lp_item(j->srv->tok, e, j->top_logprobs, g->text_off);
	if (g->lp_items && item)
		json_array_append_new(g->lp_items, item);
	else
		json_decref(item);
}

/* Drops the logprob items of tokens whose text starts at or after byte
 * cut of the choice (a stop string's, which the reply leaves out). */
static void drop_lp_items(struct gen *g, size_t cut)
{
	size_t n = json_array_size(g->lp_items);

	while (n > 0 && (size_t)json_integer_value(json_object_get(
				json_array_get(g->lp_items, n - 1), "text_offset")) >= cut)
		json_array_remove(g->lp_items, --n);
}

/* echo: the prompt's text (and with logprobs its items, the first with
 * null logprobs) comes first in the choice, before any token. */
static void gen_echo(struct gen *g, job_emit_fn emit, void *user)
{
	struct job *j = g->job;
	const int32_t *p = j->prompts[g->prompt];
	int32_t n = j->prompt_lens[g->prompt], i;
	size_t w = 1 + (size_t)j->top_logprobs;
	struct loom_detok dt = { .first = true };
	struct sbuf text = { 0 };

	g->echoed = true;
	for (i = 0; i < n; i++) {
		size_t before = text.len, len = 0;
		char *buf;
		int got;

		loom_token_bytes(j->srv->tok, p[i], &len);
		buf = malloc(len + 16);
		got = buf ? loom_detokenize(j->srv->tok, &dt, p[i], buf, len + 16) : -1;
		if (got > 0)
			sb_putn(&text, buf, (size_t)got);
		free(buf);
		if (g->prompt_lp)
			gen_lp_item(g, g->prompt_lp + (size_t)i * w);
		g->text_off += text.len - before;
	}
	if (text.len)
		emit(j, g, text.s, text.len, false, user);
	sb_free(&text);
}

/* A token whose text does not fit gen_token's buffer: retried with larger
 * ones (loom_detokenize leaves its state alone when the buffer is short),
 * so no token is dropped whatever its length. */
static void detok_long(struct gen *g, int32_t tok)
{
	const struct loom_tokenizer *t = g->job->srv->tok;
	size_t cap;

	for (cap = 4096; cap <= ((size_t)1 << 24); cap *= 4) {
		char *buf = malloc(cap);
		int len = buf ? loom_detokenize(t, &g->dt, tok, buf, cap) : -1;

		if (len > 0)
			sb_putn(&g->pending, buf, (size_t)len);
		free(buf);
		if (len >= 0 || !buf)
			return;
	}
}

/* Moves one token through the detokenizer and stop matching. */
static void gen_token(struct gen *g, int32_t tok, const struct loom_token_logprob *lp,
		      job_emit_fn emit, void *user)
{
	struct job *j = g->job;
	struct sbuf *p = &g->pending;
	char piece[512];
	size_t keep;
	long at;
	int len;

	if (j->max_tokens == 0) { /* echo only: the token is not part of it */
		gen_finish(g, "length", emit, user);
		return;
	}
	if (loom_tokenizer_is_eog(j->srv->tok, tok)) {
		gen_end_partial(g);
		gen_finish(g, "stop", emit, user);
		return;
	}
	g->n_out++;
	if (lp)
		gen_lp_item(g, lp);
	keep = p->len;
	len = loom_detokenize(j->srv->tok, &g->dt, tok, piece, sizeof(piece));
	if (len > 0)
		sb_putn(p, piece, (size_t)len);
	else if (len < 0)
		detok_long(g, tok);
	g->text_off += p->len - keep;
	at = find_stop(j, p->s ? p->s : "", p->len);
	if (at >= 0) {
		drop_lp_items(g, g->text_off - p->len + (size_t)at);
		p->len = (size_t)at;
		gen_finish(g, "stop", emit, user);
		return;
	}
	if (g->n_out >= j->max_tokens) {
		gen_end_partial(g);
		gen_finish(g, "length", emit, user);
		return;
	}
	keep = held_len(j, p->s, p->len);
	if (p->len > keep) {
		emit(j, g, p->s, p->len - keep, false, user);
		memmove(p->s, p->s + p->len - keep, keep);
		p->len = keep;
		p->s[keep] = '\0';
	}
}

/* Takes the tokens that arrived since the last call, and with logprobs
 * their entries into *lps (under the lock). */
static int32_t *gen_take(struct gen *g, size_t *n, bool *done, enum loom_finish *fin,
			 struct loom_token_logprob **lps)
{
	size_t w = 1 + (size_t)g->job->top_logprobs;
	int32_t *t = NULL;

	*n = g->n_toks - g->n_read;
	*done = g->sched_done;
	*fin = g->finish;
	*lps = NULL;
	if (*n && (t = malloc(*n * sizeof(*t))))
		memcpy(t, g->toks + g->n_read, *n * sizeof(*t));
	if (t && g->job->logprobs && g->lps && (*lps = malloc(*n * w * sizeof(**lps))))
		memcpy(*lps, g->lps + g->n_read * w, *n * w * sizeof(**lps));
	if (!t || (g->job->logprobs && !*lps)) {
		free(t);
		t = NULL;
		*n = 0;
	}
	g->n_read += *n;
	return t;
}


static bool job_has_news(struct job *j)
{
	int i;

	for (i = 0; i < j->n; i++) {
		struct gen *g = &j->gens[i];

		if (!g->out_done && (g->n_toks > g->n_read || g->sched_done))
			return true;
	}
	return false;
}

static void gen_advance(struct gen *g, job_emit_fn emit, void *user)
{
	struct job *j = g->job;
	struct loom_token_logprob *lps;
	size_t n, i, w = 1 + (size_t)j->top_logprobs;
	enum loom_finish fin;
	bool done;
	int32_t *t;

	pthread_mutex_lock(&j->mu);
	t = gen_take(g, &n, &done, &fin, &lps);
	pthread_mutex_unlock(&j->mu);
	if (j->echo && !g->echoed && (n || (done && fin != LOOM_FINISH_ERROR &&
					    fin != LOOM_FINISH_CANCELLED)))
		gen_echo(g, emit, user);
	for (i = 0; i < n && !g->out_done; i++)
		gen_token(g, t[i], lps ? lps + i * w : NULL, emit, user);
	free(t);
	free(lps);
	if (g->out_done) {
		if (!done)
			loom_cancel(j->srv->engine, g->id);
		return;
	}
	if (!done)
		return;
	if (fin == LOOM_FINISH_ERROR)
		g->failed = true;
	if (fin == LOOM_FINISH_CANCELLED) { /* shutdown, or the client left */
		g->failed = true;
		snprintf(g->error, sizeof(g->error), "%s",
			 "the request was cancelled before it finished (the server is shutting down)");
	}
	if (fin == LOOM_FINISH_LENGTH || fin == LOOM_FINISH_EOG)
		gen_end_partial(g);
	gen_finish(g, fin == LOOM_FINISH_LENGTH ? "length" : "stop", emit, user);
}

bool job_advance(struct job *j, int timeout_ms, job_emit_fn emit, void *user)
{
	bool all = true;
	int i;

	pthread_mutex_lock(&j->mu);
	if (!job_has_news(j) && timeout_ms > 0) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += (long)timeout_ms * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&j->cv, &j->mu, &ts);
	}
	pthread_mutex_unlock(&j->mu);
	for (i = 0; i < j->n; i++) {
		struct gen *g = &j->gens[i];

		if (!g->out_done && atomic_load(&j->srv->hard_stop)) {
			g->failed = true;
			snprintf(g->error, sizeof(g->error), "%s", "the server stopped before the request finished");
			gen_finish(g, "stop", emit, user);
		}
		if (!g->out_done)
			gen_advance(g, emit, user);
		all = all && g->out_done;
	}
	return all;
}

bool job_park(struct job *j, void *conn, void (*suspend)(void *), void (*wake)(void *))
{
	bool park;

	pthread_mutex_lock(&j->mu);
	park = !job_has_news(j) && !atomic_load(&j->srv->hard_stop);
	if (park) {
		j->parked = conn;
		j->wake = wake;
		suspend(conn);
	}
	pthread_mutex_unlock(&j->mu);
	return park;
}

void job_unpark(struct job *j)
{
	pthread_mutex_lock(&j->mu);
	if (j->parked) {
		j->wake(j->parked);
		j->parked = NULL;
	}
	pthread_mutex_unlock(&j->mu);
}

void server_unpark_all(struct server *srv)
{
	struct job *j;

	pthread_mutex_lock(&srv->lock);
	for (j = srv->jobs; j; j = j->next)
		job_unpark(j);
	pthread_mutex_unlock(&srv->lock);
}
