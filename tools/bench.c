/* `loom bench`: for each thread count, `reps` runs of a prefill of n_prompt
 * tokens (pp) and a greedy decode of n_gen tokens after n_depth tokens of
 * context (tg), reported as mean and
 * standard deviation of tokens per second. Prompt tokens are pseudo-random
 * ids from a fixed seed, as llama-bench does, so runs are comparable. Each
 * run is one request through the engine's scheduler, the path every
 * generation takes (public API only). */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void mean_std(const double *v, int n, double *mean, double *sd)
{
	double s = 0, q = 0;
	int i;

	for (i = 0; i < n; i++)
		s += v[i];
	*mean = s / n;
	for (i = 0; i < n; i++)
		q += (v[i] - *mean) * (v[i] - *mean);
	*sd = n > 1 ? sqrt(q / (n - 1)) : 0.0;
}

/* Times one request: the prefill ends at its first token, the decode at
 * its last; at[i] is when token i came (cap of them). */
struct timing {
	int32_t n_tokens, cap;
	double t_first, t_last;
	double *at;
	bool done, failed;
};

static void on_event(void *user, const struct loom_event *ev)
{
	struct timing *t = user;

	if (ev->token >= 0) {
		double now = now_s();

		if (t->n_tokens == 0)
			t->t_first = now;
		t->t_last = now;
		if (t->n_tokens < t->cap)
			t->at[t->n_tokens] = now;
		t->n_tokens++;
	}
	if (ev->finish != LOOM_FINISH_NONE) {
		t->done = true;
		t->failed = ev->finish != LOOM_FINISH_LENGTH;
	}
}

/* Timing state of up to n requests of up to cap tokens each. The engine
 * calls on_event until a request ends, and a failed run leaves requests
 * that end only when the engine closes, so it lives as long as the engine. */
struct timings {
	struct timing *t;
	double *at;
	int n, cap;
};

/*
 * n_seq greedy requests that ignore end-of-generation, submitted together:
 * request s has the n_prompt tokens at prompt + s * stride, then n_gen + 1
 * tokens (the first closes its prefill, the other n_gen are its decode).
 * *t_pre: the first request's prefill seconds. *tg: decode tokens per
 * second from the moment every request has its first token (all prefills
 * done) to the last token, as llama-batched-bench counts S_TG; with one
 * request, n_gen / its decode time.
 */
static int run_requests(struct loom_engine *e, struct timings *tm, const int32_t *prompt,
			size_t stride, int n_seq, int n_prompt, int n_gen, double *t_pre, double *tg,
			char *err, size_t errlen)
{
	struct timing *t = tm->t;
	double t0 = now_s(), ta = 0.0, tb = 0.0;
	int64_t n_in = 0;
	int rc = 0, s, i;

	if (n_seq > tm->n || n_gen + 1 > tm->cap) {
		snprintf(err, errlen, "bench: internal error: %d requests of %d tokens", n_seq,
			 n_gen + 1);
		return -1;
	}
	memset(t, 0, sizeof(*t) * (size_t)n_seq);
	for (s = 0; s < n_seq && !rc; s++) {
		struct loom_request r;
		uint64_t id;

		t[s].cap = n_gen + 1;
		t[s].at = tm->at + (size_t)s * (size_t)tm->cap;
		loom_request_init(&r);
		r.prompt = prompt + (size_t)s * stride;
		r.n_prompt = n_prompt;
		r.n_predict = n_gen + 1;
		r.sampling.temp = 0;
		r.ignore_eog = true;
		r.on_event = on_event;
		r.user = &t[s];
		rc = loom_submit(e, &r, &id, err, errlen);
	}
	for (s = 0; s < n_seq && !rc; s++)
		while (!rc && !t[s].done)
			rc = loom_engine_step(e) < 0 ? -1 : 0;
	for (s = 0; s < n_seq && !rc; s++)
		if (t[s].failed || t[s].n_tokens != n_gen + 1) {
			snprintf(err, errlen, "bench: request %d of %d failed", s + 1, n_seq);
			rc = -1;
		}
	if (rc)
		return -1;
	*t_pre = t[0].t_first - t0;
	for (s = 0; s < n_seq; s++) {
		ta = t[s].t_first > ta ? t[s].t_first : ta;
		tb = t[s].t_last > tb ? t[s].t_last : tb;
	}
	for (s = 0; s < n_seq; s++)
		for (i = 1; i <= n_gen; i++)
			n_in += t[s].at[i] > ta;
	*tg = 0.0;
	if (n_gen > 0 && (n_in == 0 || tb <= ta)) {
		snprintf(err, errlen, "bench: no decode step after the %d prefills; raise -n", n_seq);
		rc = -1;
	} else if (n_gen > 0) {
		*tg = (double)n_in / (tb - ta);
	}
	return rc;
}

/*
 * One repetition, as llama-bench measures: pp is a prefill of n_prompt
 * tokens on an empty cache; tg is n_gen decode steps of one token after
 * n_depth tokens of context (requests whose prompts are n_depth + 1
 * tokens: their prefill is not timed), so with -d 0 the decode starts on
 * an empty cache, not after the pp prompt. With n_seq > 1, n_seq such
 * requests (distinct prompts, stride tokens apart) decode together.
 */
static int bench_once(struct loom_engine *e, struct timings *tm, const int32_t *prompt,
		      size_t stride, int n_seq, int n_prompt, int n_depth, int n_gen, double *pp,
		      double *tg, char *err, size_t errlen)
{
	double pre, unused;

	if (run_requests(e, tm, prompt, stride, 1, n_prompt, 0, &pre, &unused, err, errlen))
		return -1;
	*pp = n_prompt / pre;
	*tg = 0.0;
	if (n_gen == 0)
		return 0;
	return run_requests(e, tm, prompt, stride, n_seq, n_depth + 1, n_gen, &pre, tg, err,
			    errlen);
}

static struct loom_engine *bench_engine(const struct loom_options *o, int threads,
					char *err, size_t errlen)
{
	struct loom_engine_params p;

	loom_options_engine_params(o, &p);
	p.n_threads = threads;
	p.n_ctx = (o->n_prompt > o->n_depth + 1 ? o->n_prompt : o->n_depth + 1) + o->n_gen + 1;
	p.n_batch = o->n_batch;
	p.prefix_cache = -1; /* every repetition computes its prefill */
	p.n_parallel = o->n_parallel;
	return loom_engine_open(&p, err, errlen);
}

/*
 * A mixture-of-experts model's decode reads only the routed experts: one
 * sequence's token reads n_expert_used distinct experts a layer (top-k
 * picks distinct ones), so the weights one decode step of one sequence
 * streams are all the weights less the experts it skips and less an
 * untied token table (embed reads one row of it). Computed from the plan,
 * not counted; with several sequences a step reads the union of their
 * experts, more.
 */
static void print_experts(const struct loom_engine_stats *st)
{
	double all = (double)(st->weights_bytes + st->packed_bytes), exp = (double)st->expert_bytes;
	double active;

	if (!st->n_expert)
		return;
	active = all - (double)st->embd_only_bytes - exp + exp * st->n_expert_used / st->n_expert;
	fprintf(stderr, "bench: experts %d, %d a token: weights read per decode token of one sequence %.1f MiB of %.1f MiB (routed experts %.1f MiB of %.1f MiB)\n",
		st->n_expert, st->n_expert_used, active / 1048576.0, all / 1048576.0,
		exp * st->n_expert_used / st->n_expert / 1048576.0, exp / 1048576.0);
}

/* The table's head, once (only rank 0 of a distributed job prints). */
static void print_header(const struct loom_options *o)
{
	static bool printed;

	if (printed)
		return;
	printed = true;
	printf("| %-32s | %-8s | %7s | %-13s | %21s |\n", "model", "backend", "threads", "test", "t/s");
	printf("| %.32s | %.8s | %.7s | %.13s | %.21s |\n", "--------------------------------",
	       "--------", "-------", "-------------", "---------------------");
}

static int bench_threads(struct loom_options *o, int threads, char *err, size_t errlen)
{
	struct loom_engine *e = bench_engine(o, threads, err, errlen);
	struct loom_engine_stats st;
	double *pp = NULL, *tg = NULL, mean, sd;
	int32_t *prompt = NULL;
	uint64_t x = 0x9e3779b97f4a7c15ull;
	char test[32];
	struct timings tm = { 0 };
	int i, n_tokens, rc = -1;

	if (!e)
		return -1;
	if (loom_engine_is_follower(e)) { /* rank 0 measures; this rank helps */
		rc = loom_engine_follow(e, err, errlen) ? -1 : 1;
		goto out;
	}
	loom_engine_get_stats(e, &st);
	fprintf(stderr, "bench: KV cache %s, %llu bytes/token\n", loom_kv_type_name(st.kv_type),
		(unsigned long long)st.kv_token_bytes);
	print_experts(&st);
	print_header(o);
	n_tokens = o->n_prompt > o->n_depth + 1 ? o->n_prompt : o->n_depth + 1;
	prompt = malloc(sizeof(int32_t) * (size_t)n_tokens * (size_t)o->n_parallel);
	tm.n = o->n_parallel;
	tm.cap = o->n_gen + 1;
	tm.t = calloc((size_t)tm.n, sizeof(*tm.t));
	tm.at = calloc((size_t)tm.n * (size_t)tm.cap, sizeof(*tm.at));
	pp = calloc((size_t)o->reps, sizeof(double));
	tg = calloc((size_t)o->reps, sizeof(double));
	if (!prompt || !pp || !tg || !tm.t || !tm.at) {
		snprintf(err, errlen, "bench: out of memory");
		goto out;
	}
	for (i = 0; i < n_tokens * o->n_parallel; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		prompt[i] = (int32_t)(x % (uint64_t)loom_engine_n_vocab(e));
	}
	/* warm-up run, not counted */
	if (bench_once(e, &tm, prompt, (size_t)n_tokens, o->n_parallel, o->n_prompt, o->n_depth,
		       o->n_gen > 4 ? 4 : o->n_gen, &mean, &sd, err, errlen))
		goto out;
	for (i = 0; i < o->reps; i++)
		if (bench_once(e, &tm, prompt, (size_t)n_tokens, o->n_parallel, o->n_prompt, o->n_depth,
			       o->n_gen, &pp[i], &tg[i], err, errlen))
			goto out;
	mean_std(pp, o->reps, &mean, &sd);
	snprintf(test, sizeof(test), "pp%d", o->n_prompt);
	printf("| %-32.32s | %-8s | %7d | %-13s | %10.2f ± %-8.2f |\n", loom_engine_model_name(e),
	       loom_engine_backend_name(e), threads, test, mean, sd);
	mean_std(tg, o->reps, &mean, &sd);
	if (o->n_depth)
		snprintf(test, sizeof(test), "tg%d @ d%d", o->n_gen, o->n_depth);
	else
		snprintf(test, sizeof(test), "tg%d", o->n_gen);
	if (o->n_parallel > 1) /* the aggregate rate of n_parallel sequences */
		snprintf(test + strlen(test), sizeof(test) - strlen(test), " np%d", o->n_parallel);
	printf("| %-32.32s | %-8s | %7d | %-13s | %10.2f ± %-8.2f |\n", loom_engine_model_name(e),
	       loom_engine_backend_name(e), threads, test, mean, sd);
	fflush(stdout);
	rc = 0;
out:
	free(pp);
	free(tg);
	free(prompt);
	loom_engine_close(e); /* before tm: closing ends what a failure left */
	free(tm.t);
	free(tm.at);
	return rc;
}

int loom_bench(struct loom_options *o, char *err, size_t errlen)
{
	const char *list = o->threads_list[0] ? o->threads_list : "0";
	int rc = 0;

	if (o->n_prompt <= 0 || o->n_gen < 0) {
		snprintf(err, errlen, "bench: -p must be > 0 and -n >= 0");
		return -1;
	}
	if (!o->model[0]) {
		snprintf(err, errlen, "no model given (--model FILE)");
		return -1;
	}
	if ((o->tp > 1 || o->pp > 1) && strchr(list, ',')) {
		snprintf(err, errlen, "bench: --tp/--pp take one thread count, not a list (each rank's MPI starts once)");
		return -1;
	}
	while (rc == 0 && *list) {
		int threads = atoi(list);

		rc = bench_threads(o, threads, err, errlen);
		list = strchr(list, ',');
		if (!list)
			break;
		list++;
	}
	return rc > 0 ? 0 : rc; /* 1: a follower rank's job ended */
}
