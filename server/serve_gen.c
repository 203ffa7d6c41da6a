/* `loom serve`: requests, their scheduler events, stop strings, metrics. */
#include "serve_int.h"

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
	j->prompt = r->prompt;
	j->n_prompt = r->n_prompt;
	j->grammar = r->grammar;
	j->tool_mode = r->tool_mode;
	memset(r, 0, sizeof(*r));
}

static void job_free(struct job *j)
{
	int i;

	for (i = 0; i < SRV_MAX_N; i++) {
		free(j->gens[i].toks);
		sb_free(&j->gens[i].pending);
		sb_free(&j->gens[i].tool_buf);
	}
	for (i = 0; i < j->n_stop; i++)
		free(j->stop[i]);
	free(j->prompt);
	loom_grammar_free(j->grammar);
	sb_free(&j->out);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	free(j);
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
		if (g->t_last == 0)
			metrics_observe(&srv->metrics, &srv->metrics.ttft, t - j->t_start);
		else
			metrics_observe(&srv->metrics, &srv->metrics.itl, t - g->t_last);
		g->t_last = t;
		gen_push(g, ev->token);
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

int job_submit(struct job *j, char *err, size_t errlen)
{
	struct server *srv = j->srv;
	int i, rc = 0;

	list_add(srv, j);
	for (i = 0; i < j->n && rc == 0; i++) {
		struct gen *g = &j->gens[i];
		struct loom_request r;
		uint64_t id;

		loom_request_init(&r);
		r.prompt = j->prompt;
		r.n_prompt = j->n_prompt;
		r.n_predict = j->max_tokens;
		r.sampling = j->sp;
		r.sampling.seed = j->sp.seed + (uint64_t)i;
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
		} else {
			j->refs--;
		}
		pthread_mutex_unlock(&j->mu);
		if (rc) {
			pthread_mutex_lock(&srv->lock);
			if (--srv->n_gens_active == 0)
				pthread_cond_broadcast(&srv->idle);
			pthread_mutex_unlock(&srv->lock);
		}
	}
	if (rc) {
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
static void gen_token(struct gen *g, int32_t tok, job_emit_fn emit, void *user)
{
	struct job *j = g->job;
	struct sbuf *p = &g->pending;
	char piece[512];
	size_t keep;
	long at;
	int len;

	if (loom_tokenizer_is_eog(j->srv->tok, tok)) {
		gen_finish(g, "stop", emit, user);
		return;
	}
	g->n_out++;
	len = loom_detokenize(j->srv->tok, &g->dt, tok, piece, sizeof(piece));
	if (len > 0)
		sb_putn(p, piece, (size_t)len);
	else if (len < 0)
		detok_long(g, tok);
	at = find_stop(j, p->s ? p->s : "", p->len);
	if (at >= 0) {
		p->len = (size_t)at;
		gen_finish(g, "stop", emit, user);
		return;
	}
	if (g->n_out >= j->max_tokens) {
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

/* Takes the tokens that arrived since the last call (under the lock). */
static int32_t *gen_take(struct gen *g, size_t *n, bool *done, enum loom_finish *fin)
{
	int32_t *t = NULL;

	*n = g->n_toks - g->n_read;
	*done = g->sched_done;
	*fin = g->finish;
	if (*n && (t = malloc(*n * sizeof(*t))))
		memcpy(t, g->toks + g->n_read, *n * sizeof(*t));
	if (!t)
		*n = 0;
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
	enum loom_finish fin;
	size_t n, i;
	bool done;
	int32_t *t;

	pthread_mutex_lock(&j->mu);
	t = gen_take(g, &n, &done, &fin);
	pthread_mutex_unlock(&j->mu);
	for (i = 0; i < n && !g->out_done; i++)
		gen_token(g, t[i], emit, user);
	free(t);
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
