/* Scheduler on the real model ($LOOM_MODEL): a request's tokens do not
 * depend on what else runs (batching, preemption, prefix cache,
 * cancellation of others), queue bounds, block accounting.
 *
 * The backend ($LOOM_SCHED_BACKEND, default cpu.so) is opened with
 * LOOM_BACKEND_BATCH_INVARIANT, so each row's result is bitwise independent
 * of the rest of the batch and of prompt chunking; the oracle for every
 * request is the same request run alone on a scheduler with the prefix
 * cache off. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "format/gguf.h"
#include "harness.h"
#include "engine/scheduler.h"


static struct gguf_file *gf;
static struct loom_model *model;

/* Deterministic pseudo-random prompt of n token ids (plain vocabulary:
 * from id 200, at most 40000 ids, fewer for a small synthetic model). */
static void make_prompt(int32_t *p, int n, uint32_t seed)
{
	uint32_t span = model->hp.n_vocab > 40200 ? 40000 : (uint32_t)(model->hp.n_vocab - 200);

	for (int i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		p[i] = 200 + (int32_t)((seed >> 8) % span);
	}
}

static struct loom_sched *new_sched(int64_t n_blocks, bool prefix, int32_t max_batch)
{
	struct loom_sched_config cfg;
	struct loom_sched *s;
	char err[512];

	loom_sched_config_defaults(&cfg);
	cfg.n_blocks = n_blocks;
	cfg.prefix_cache = prefix;
	cfg.max_ctx = 1024;
	if (max_batch)
		cfg.max_batch_tokens = max_batch;
	s = loom_sched_new(model, &cfg, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	return s;
}

/* Each job alone on a cache-less scheduler: the oracle (kept across
 * tests, see alone_find). */
static void run_alone(struct job *jobs, int n, struct col *ref)
{
	struct loom_sched *s = new_sched(0, false, 0);

	for (int i = 0; i < n; i++) {
		if (alone_find(&jobs[i], &ref[i]))
			continue;
		submit(s, &jobs[i], false);
		drain(s);
		ref[i] = jobs[i].c;
		ck_assert_int_eq(ref[i].n_final, 1);
		alone_keep(&jobs[i]);
	}
	loom_sched_free(s);
}

static struct job *make_jobs(int n, int n_predict, bool some_sampled)
{
	struct job *jobs = calloc((size_t)n, sizeof(*jobs));

	ck_assert_ptr_nonnull(jobs);
	for (int i = 0; i < n; i++) {
		jobs[i].n_prompt = 5 + (i * 37) % 120;
		jobs[i].n_predict = n_predict - (i % 3) * 2;
		make_prompt(jobs[i].prompt, jobs[i].n_prompt, 1000u + (uint32_t)i);
		loom_sampler_defaults(&jobs[i].sp);
		jobs[i].sp.temp = 0;
		if (some_sampled && i % 2) {
			jobs[i].sp.temp = 0.9f; /* draws must continue across preemption */
			jobs[i].sp.top_k = 40;
			jobs[i].sp.seed = 77u + (uint64_t)i;
		}
	}
	return jobs;
}

START_TEST(batched_equals_alone)
{
	enum { N = 16 };
	struct job *jobs = make_jobs(N, 24, false);
	struct col ref[N];
	struct loom_sched *s;
	struct loom_sched_stats st;

	run_alone(jobs, N, ref);
	s = new_sched(0, false, 64); /* small budget: chunked prefills share steps */
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], false);
	drain(s);
	loom_sched_get_stats(s, &st);
	ck_assert_int_eq(st.preemptions, 0);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_int_eq(st.blocks_used, 0);
	ck_assert_int_eq(st.local_blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

START_TEST(preemption_keeps_outputs)
{
	enum { N = 16 };
	struct job *jobs = make_jobs(N, 32, true);
	struct col ref[N];
	struct loom_sched *s;
	struct loom_sched_stats st;

	run_alone(jobs, N, ref);
	/* 24 blocks of 16 tokens: ~3 of these requests at a time */
	s = new_sched(24, true, 0);
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], false);
	drain(s);
	loom_sched_get_stats(s, &st);
	ck_assert_uint_gt(st.preemptions, 0);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_int_eq(st.blocks_used, 0);
	ck_assert_int_eq(st.local_blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

START_TEST(prefix_cache_reuses_blocks)
{
	struct job *jobs = make_jobs(3, 16, false);
	struct col ref[3];
	struct loom_sched *s;
	struct loom_sched_stats st;

	/* 0 and 1 share a 100-token prefix; 2 repeats 0 exactly (112 tokens,
	 * seven full blocks: all cached, the last token is recomputed into a
	 * copy of the last block) */
	make_prompt(jobs[0].prompt, 112, 5);
	jobs[0].n_prompt = 112;
	make_prompt(jobs[1].prompt, 130, 6);
	memcpy(jobs[1].prompt, jobs[0].prompt, 100 * sizeof(int32_t));
	jobs[1].n_prompt = 130;
	memcpy(jobs[2].prompt, jobs[0].prompt, 112 * sizeof(int32_t));
	jobs[2].n_prompt = 112;
	jobs[0].n_predict = jobs[1].n_predict = jobs[2].n_predict = 16;
	run_alone(jobs, 3, ref);

	s = new_sched(0, true, 0);
	submit(s, &jobs[0], false);
	drain(s);
	ck_assert_int_eq(jobs[0].c.n_cached, 0);
	submit(s, &jobs[1], false);
	drain(s);
	loom_sched_get_stats(s, &st);
	ck_assert_uint_eq(st.prefix_hits, 6); /* 96 of the 100 shared tokens */
	ck_assert_int_eq(jobs[1].c.n_cached, 96);
	ck_assert_int_gt(st.blocks_cached, 0);
	submit(s, &jobs[2], false);
	drain(s);
	loom_sched_get_stats(s, &st);
	ck_assert_int_eq(jobs[2].c.n_cached, 111);
	ck_assert_uint_eq(st.prefix_hits, 6 + 7);
	ck_assert_uint_ge(st.cow_copies, 1);
	for (int i = 0; i < 3; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_int_eq(st.blocks_used, 0);
	ck_assert_int_eq(st.local_blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

START_TEST(cancel_half_frees_blocks)
{
	enum { N = 16 };
	struct job *jobs = make_jobs(N, 40, false);
	struct col ref[N];
	struct loom_sched *s;
	struct loom_sched_stats st;

	run_alone(jobs, N, ref);
	s = new_sched(0, true, 128);
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], false);
	for (int k = 0; k < 12; k++)
		ck_assert_int_ge(loom_sched_step(s), 0);
	loom_sched_get_stats(s, &st);
	ck_assert_int_gt(st.blocks_used, 0);
	for (int i = 0; i < N; i += 2)
		loom_sched_cancel(s, jobs[i].c.id);
	loom_sched_cancel(s, 999999); /* unknown ids are ignored */
	drain(s);
	loom_sched_get_stats(s, &st);
	ck_assert_int_eq(st.blocks_used, 0);
	ck_assert_int_eq(st.local_blocks_used, 0);
	ck_assert_int_eq(st.running, 0);
	for (int i = 0; i < N; i++) {
		if (i % 2 == 0) {
			ck_assert_int_eq(jobs[i].c.n_final, 1);
			ck_assert_int_eq(jobs[i].c.fin, LOOM_FINISH_CANCELLED);
			ck_assert_int_lt(jobs[i].c.n, ref[i].n);
			for (int k = 0; k < jobs[i].c.n; k++)
				ck_assert_int_eq(jobs[i].c.toks[k], ref[i].toks[k]);
		} else {
			assert_same(&jobs[i].c, &ref[i], i);
		}
	}
	loom_sched_free(s);
	free(jobs);
}
END_TEST

START_TEST(window_bounds_local_blocks)
{
	struct job *jobs = make_jobs(2, 96, false);
	struct col ref[2];
	struct loom_sched *s = new_sched(0, true, 64);
	struct loom_sched_stats st;
	int64_t bound;

	loom_sched_get_stats(s, &st);
	if (st.local_window <= 0) { /* the model has no sliding window */
		loom_sched_free(s);
		free(jobs);
		return;
	}
	/* two long requests sharing a prefix, chunks of at most 64 tokens:
	 * after a step at p, the local layers keep positions from
	 * p - window + 1, so a sequence holds the blocks that a window and a
	 * chunk touch; the global layers hold every position */
	make_prompt(jobs[0].prompt, 400, 9);
	jobs[0].n_prompt = 400;
	memcpy(jobs[1].prompt, jobs[0].prompt, 400 * sizeof(int32_t));
	jobs[1].prompt[399] = jobs[0].prompt[399] == 200 ? 201 : 200;
	jobs[1].n_prompt = 400;
	run_alone(jobs, 2, ref);
	submit(s, &jobs[0], false);
	drain(s);
	submit(s, &jobs[1], false);
	drain(s);
	loom_sched_get_stats(s, &st);
	bound = (st.local_window + 64 - 2) / 16 + 2;
	ck_assert_int_le(st.local_blocks_peak, bound);
	ck_assert_int_ge(st.blocks_peak, (400 + 96 - 1 + 15) / 16);
	ck_assert_uint_ge(st.prefix_hits, 400 / 16 - 1); /* the window was still cached */
	for (int i = 0; i < 2; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_int_eq(st.blocks_used, 0);
	ck_assert_int_eq(st.local_blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST


/*
 * Sampling on the device (backend ABI 1.8 and 1.9: greedy with penalties,
 * top-k, the whole vocabulary, logprobs) against the host sampler: the
 * same requests batched, once as the backend takes them and once with
 * LOOM_DEVICE_SAMPLE=0 (every row's logits downloaded and sampled on the
 * host): tokens, logprobs and top logprobs equal bit for bit. On a
 * backend without the slot both runs are the host's.
 */
START_TEST(device_sampling_equals_host)
{
	enum { N = 6 };
	struct job *jobs = make_jobs(N, 12, false);
	struct col host[N];
	const char *old = getenv("LOOM_DEVICE_SAMPLE");

	for (int i = 0; i < N; i++) {
		struct loom_sampler_params *sp = &jobs[i].sp;

		sp->seed = 500u + (uint64_t)i;
		sp->temp = i == 5 ? 0.0f : 0.6f + 0.2f * (float)i;
		sp->top_k = i % 3 == 0 ? 0 : i == 4 ? 100000 : 40; /* 0, >= n: the whole vocabulary */
		sp->top_p = i % 2 ? 0.9f : 1.0f;
		sp->min_p = i == 3 ? 0.05f : 0.0f;
		sp->repeat_penalty = i >= 2 ? 1.3f : 1.0f;
		sp->presence_penalty = i == 2 ? 0.4f : 0.0f;
		jobs[i].logprobs = i % 3 != 0; /* 0 and 3 (the longest) without: steps of full rows alone */
		jobs[i].top_logprobs = (i * 2) % (HARNESS_TOP + 1);
	}
	for (int pass = 0; pass < 2; pass++) {
		struct loom_sched *s = new_sched(0, false, 0);

		setenv("LOOM_DEVICE_SAMPLE", pass == 0 ? "0" : "1", 1);
		for (int i = 0; i < N; i++)
			submit(s, &jobs[i], false);
		drain(s);
		for (int i = 0; i < N; i++) {
			const struct col *a = &host[i], *b = &jobs[i].c;

			ck_assert_int_eq(b->n_final, 1);
			if (pass == 0) {
				host[i] = *b;
				continue;
			}
			assert_same(b, a, i);
			for (int t = 0; t < a->n && jobs[i].logprobs; t++) {
				ck_assert_msg(!memcmp(&a->lp[t], &b->lp[t], sizeof(float)),
					      "request %d token %d: logprob %.9g, the host's %.9g", i, t,
					      b->lp[t], a->lp[t]);
				for (int j = 0; j < jobs[i].top_logprobs; j++)
					ck_assert_msg(a->top[t][j].token == b->top[t][j].token &&
						      !memcmp(&a->top[t][j].logprob,
							      &b->top[t][j].logprob, sizeof(float)),
						      "request %d token %d: top %d is {%d, %.9g}, the host's {%d, %.9g}",
						      i, t, j, b->top[t][j].token, b->top[t][j].logprob,
						      a->top[t][j].token, a->top[t][j].logprob);
			}
		}
		loom_sched_free(s);
	}
	if (old)
		setenv("LOOM_DEVICE_SAMPLE", old, 1);
	else
		unsetenv("LOOM_DEVICE_SAMPLE");
	free(jobs);
}
END_TEST

START_TEST(queue_bound_and_bad_requests)
{
	struct loom_sched_config cfg;
	struct loom_sched_request rq = { 0 };
	struct loom_sched_stats st;
	struct col c[4] = { 0 };
	int32_t prompt[4] = { 1, 2, 3, 4 };
	uint64_t id;
	char err[512];
	struct loom_sched *s;

	loom_sched_config_defaults(&cfg);
	cfg.max_waiting = 3;
	cfg.max_ctx = 64;
	s = loom_sched_new(model, &cfg, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	rq.prompt = prompt;
	rq.n_prompt = 4;
	rq.n_predict = 2;
	loom_sampler_defaults(&rq.sampling);
	rq.cb = collect;
	for (int i = 0; i < 3; i++) {
		rq.user = &c[i];
		ck_assert_int_eq(loom_sched_submit(s, &rq, &c[i].id, err, sizeof(err)), 0);
	}
	rq.user = &c[3];
	ck_assert_int_eq(loom_sched_submit(s, &rq, &id, err, sizeof(err)), LOOM_ERR_FULL);
	loom_sched_get_stats(s, &st);
	ck_assert_uint_eq(st.rejected, 1);
	ck_assert_int_eq(st.waiting, 3);
	rq.n_predict = 61; /* 4 + 61 > 64 */
	ck_assert_int_eq(loom_sched_submit(s, &rq, &id, err, sizeof(err)), LOOM_ERR_CONTEXT);
	rq.n_predict = 2;
	rq.n_prompt = 0;
	ck_assert_int_eq(loom_sched_submit(s, &rq, &id, err, sizeof(err)), LOOM_ERR_INVALID);
	rq.n_prompt = 4;
	prompt[2] = (int32_t)model->hp.n_vocab;
	ck_assert_int_eq(loom_sched_submit(s, &rq, &id, err, sizeof(err)), LOOM_ERR_INVALID);
	prompt[2] = -5;
	ck_assert_int_eq(loom_sched_submit(s, &rq, &id, err, sizeof(err)), LOOM_ERR_INVALID);
	/* freeing cancels what is queued: one final event each */
	loom_sched_free(s);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(c[i].n_final, 1);
		ck_assert_int_eq(c[i].fin, LOOM_FINISH_CANCELLED);
	}
}
END_TEST

START_TEST(plan_blocks_is_exact)
{
	const struct loom_hparams *hp = &model->hp;
	uint64_t per = 2ull * (uint64_t)hp->n_layer * 16 * (uint64_t)(hp->n_head_kv * hp->head_dim) * 4;

	ck_assert_int_eq(loom_sched_plan_blocks(model, 16, per * 10), 10);
	ck_assert_int_eq(loom_sched_plan_blocks(model, 16, per * 10 - 1), 9);
	ck_assert_int_eq(loom_sched_plan_blocks(model, 16, per - 1), 0);
	ck_assert_int_eq(loom_sched_plan_blocks(model, 0, per), 0);
	/* slots are int32: never more than INT32_MAX / block_size blocks */
	ck_assert_int_eq(loom_sched_plan_blocks(model, INT32_MAX, UINT64_MAX), 1);
	ck_assert_int_eq(loom_sched_plan_blocks(model, 16, UINT64_MAX), INT32_MAX / 16);
}
END_TEST

/* loom_sched_run on its own thread; submissions from this one. */
struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
};

static struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };

static void on_event(void *user, const struct loom_event *ev)
{
	pthread_mutex_lock(&w.mu);
	collect(user, ev);
	if (ev->finish != LOOM_FINISH_NONE) {
		w.done++;
		pthread_cond_signal(&w.cv);
	}
	pthread_mutex_unlock(&w.mu);
}

static void *engine(void *arg)
{
	loom_sched_run(arg);
	return NULL;
}

START_TEST(run_thread_serves_and_stops)
{
	enum { N = 4 };
	struct job *jobs = make_jobs(N, 8, false);
	struct col ref[N];
	struct loom_sched *s;
	pthread_t th;

	run_alone(jobs, N, ref);
	s = new_sched(0, true, 0);
	ck_assert_int_eq(pthread_create(&th, NULL, engine, s), 0);
	usleep(20000); /* let it wait for work */
	for (int i = 0; i < N; i++) {
		struct loom_sched_request rq = { .prompt = jobs[i].prompt,
			.n_prompt = jobs[i].n_prompt, .n_predict = jobs[i].n_predict,
			.sampling = jobs[i].sp, .cb = on_event, .user = &jobs[i].c };
		char err[256];

		memset(&jobs[i].c, 0, sizeof(jobs[i].c));
		pthread_mutex_lock(&w.mu); /* the callback may run before id is stored */
		ck_assert_int_eq(loom_sched_submit(s, &rq, &jobs[i].c.id, err, sizeof(err)), 0);
		pthread_mutex_unlock(&w.mu);
	}
	pthread_mutex_lock(&w.mu);
	while (w.done < N)
		pthread_cond_wait(&w.cv, &w.mu);
	pthread_mutex_unlock(&w.mu);
	loom_sched_stop(s);
	pthread_join(th, NULL);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Not an assertion: prints tokens/s for 16 x 64 tokens, one at a time
 * and all at once (LOOM_SCHED_BENCH=1). */
START_TEST(throughput)
{
	enum { N = 16 };
	struct job *jobs = make_jobs(N, 64, false);
	struct loom_sched *s = new_sched(0, false, 0);
	double t0, t1, t2;

	for (int i = 0; i < N; i++)
		jobs[i].n_predict = 64;
	t0 = now();
	for (int i = 0; i < N; i++) {
		submit(s, &jobs[i], false);
		drain(s);
	}
	t1 = now();
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], false);
	drain(s);
	t2 = now();
	printf("throughput: one at a time %.1f tok/s, 16 concurrent %.1f tok/s\n",
	       N * 64 / (t1 - t0), N * 64 / (t2 - t1));
	loom_sched_free(s);
	free(jobs);
}
END_TEST

static void load_model(void)
{
	const char *path = getenv("LOOM_MODEL");
	const char *backend = getenv("LOOM_SCHED_BACKEND");
	struct loom_model_params p = { .backend = backend && *backend ? backend : "cpu.so",
		.backend_flags = LOOM_BACKEND_BATCH_INVARIANT };
	char err[1024];

	gf = gguf_open(path, err, sizeof(err));
	ck_assert_msg(gf != NULL, "%s", err);
	model = loom_model_load(gf, &p, err, sizeof(err));
	ck_assert_msg(model != NULL, "%s", err);
}

static void unload_model(void)
{
	alone_forget();
	loom_model_free(model);
	gguf_close(gf);
}

int main(void)
{
	const char *path = getenv("LOOM_MODEL");
	const char *bench = getenv("LOOM_SCHED_BENCH");
	Suite *s = suite_create("sched");
	TCase *tc = tcase_create("model");
	SRunner *sr;
	int failed;

	if (!path || access(path, R_OK) != 0) {
		printf("skip: LOOM_MODEL (%s) not found\n", path ? path : "unset");
		return 77;
	}
	tcase_add_unchecked_fixture(tc, load_model, unload_model);
	tcase_set_timeout(tc, 900);
	const char *quick = getenv("LOOM_SCHED_QUICK");

	const char *only = getenv("LOOM_SCHED_ONLY");

	if (bench && *bench == '1') {
		tcase_add_test(tc, throughput);
	} else if (only && !strcmp(only, "device_sampling")) {
		tcase_add_test(tc, device_sampling_equals_host);
	} else if (quick && *quick == '1') {
		/* the emulated GPU path of the windowed pool: batching and the
		 * pool's bound (the rest runs on cpu.so in sched_swa) */
		tcase_add_test(tc, batched_equals_alone);
		tcase_add_test(tc, window_bounds_local_blocks);
	} else {
		tcase_add_test(tc, plan_blocks_is_exact);
		tcase_add_test(tc, queue_bound_and_bad_requests);
		/* the longest greedy requests first: their runs alone serve
		 * the shorter ones of the tests after (alone_find) */
		tcase_add_test(tc, cancel_half_frees_blocks);
		tcase_add_test(tc, batched_equals_alone);
		tcase_add_test(tc, device_sampling_equals_host);
		tcase_add_test(tc, preemption_keeps_outputs);
		tcase_add_test(tc, prefix_cache_reuses_blocks);
		tcase_add_test(tc, window_bounds_local_blocks);
		tcase_add_test(tc, run_thread_serves_and_stops);
	}
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
