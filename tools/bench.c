/* `loom bench`: for each thread count, `reps` runs of a prefill of n_prompt
 * tokens (pp) and a greedy decode of n_gen tokens (tg), reported as mean and
 * standard deviation of tokens per second. Prompt tokens are pseudo-random
 * ids from a fixed seed, as llama-bench does, so runs are comparable. */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/gguf.h"
#include "engine/session.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int32_t argmax(const float *x, int64_t n)
{
	int64_t i, best = 0;

	for (i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return (int32_t)best;
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

/* One repetition: returns pp and tg tokens/s. */
static int bench_once(struct loom_session *s, const int32_t *prompt, int n_prompt,
		      int n_gen, double *pp, double *tg, char *err, size_t errlen)
{
	double t0, t1, t2;
	int32_t t;
	int i;

	loom_session_reset(s);
	t0 = now_s();
	if (loom_session_eval(s, prompt, n_prompt, err, errlen))
		return -1;
	t1 = now_s();
	for (i = 0; i < n_gen; i++) {
		t = argmax(s->logits, s->m->hp.n_vocab);
		if (loom_session_eval(s, &t, 1, err, errlen))
			return -1;
	}
	t2 = now_s();
	*pp = n_prompt / (t1 - t0);
	*tg = n_gen > 0 ? n_gen / (t2 - t1) : 0.0;
	return 0;
}

static int bench_threads(struct loom_options *o, const struct gguf_file *f, int threads,
			 const char *model_name, char *err, size_t errlen)
{
	struct loom_model_params mp = { .backend = o->backend, .n_threads = threads };
	struct loom_model *m = loom_model_load(f, &mp, err, errlen);
	struct loom_session *s = NULL;
	double *pp = NULL, *tg = NULL, mean, sd;
	int32_t *prompt = NULL;
	uint64_t x = 0x9e3779b97f4a7c15ull;
	int i, rc = -1;

	if (!m)
		return -1;
	s = loom_session_new(m, o->n_prompt + o->n_gen + 1, o->n_batch, err, errlen);
	prompt = malloc(sizeof(int32_t) * (size_t)o->n_prompt);
	pp = calloc((size_t)o->reps, sizeof(double));
	tg = calloc((size_t)o->reps, sizeof(double));
	if (!s || !prompt || !pp || !tg)
		goto out;
	for (i = 0; i < o->n_prompt; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		prompt[i] = (int32_t)(x % (uint64_t)m->hp.n_vocab);
	}
	/* warm-up run, not counted */
	if (bench_once(s, prompt, o->n_prompt, o->n_gen > 4 ? 4 : o->n_gen, &mean, &sd, err, errlen))
		goto out;
	for (i = 0; i < o->reps; i++)
		if (bench_once(s, prompt, o->n_prompt, o->n_gen, &pp[i], &tg[i], err, errlen))
			goto out;
	mean_std(pp, o->reps, &mean, &sd);
	printf("| %-32.32s | %-8s | %7d | pp%-5d | %10.2f ± %-8.2f |\n", model_name,
	       m->be->ops->name, threads, o->n_prompt, mean, sd);
	mean_std(tg, o->reps, &mean, &sd);
	printf("| %-32.32s | %-8s | %7d | tg%-5d | %10.2f ± %-8.2f |\n", model_name,
	       m->be->ops->name, threads, o->n_gen, mean, sd);
	fflush(stdout);
	rc = 0;
out:
	free(pp);
	free(tg);
	free(prompt);
	loom_session_free(s);
	loom_model_free(m);
	return rc;
}

int loom_bench(struct loom_options *o, char *err, size_t errlen)
{
	const char *list = o->threads_list[0] ? o->threads_list : "0";
	char name[64] = "?", *tmp = NULL;
	struct gguf_file *f;
	int rc = 0;

	if (o->n_prompt <= 0 || o->n_gen < 0) {
		snprintf(err, errlen, "bench: -p must be > 0 and -n >= 0");
		return -1;
	}
	f = gguf_open(o->model, err, errlen);
	if (!f)
		return -1;
	if (gguf_get_str(f, "general.name", &tmp, err, errlen) == 0)
		snprintf(name, sizeof(name), "%s", tmp);
	free(tmp);
	printf("| %-32s | %-8s | %7s | %-7s | %21s |\n", "model", "backend", "threads", "test", "t/s");
	printf("| %.32s | %.8s | %.7s | %.7s | %.21s |\n", "--------------------------------",
	       "--------", "-------", "-------", "---------------------");
	while (rc == 0 && *list) {
		int threads = atoi(list);

		rc = bench_threads(o, f, threads, name, err, errlen);
		list = strchr(list, ',');
		if (!list)
			break;
		list++;
	}
	gguf_close(f);
	return rc;
}
