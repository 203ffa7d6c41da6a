/* Speculative decoding inside the scheduler, on the real model
 * ($LOOM_MODEL): greedy requests that speculate with ngram.so give exactly
 * the tokens of the same requests decoded plainly and alone, batched with
 * plain ones, under preemption and cancellation, and drafts really get
 * accepted. The backend is opened batch-invariant, so every row's logits
 * are bitwise independent of the rest of the batch; the oracle is plain
 * greedy decoding of each request alone (no speculation, no prefix cache).
 * With token trees (ngram.so, spec_tree 12) the same holds, and every
 * block returns after trees are rejected, preempted or cancelled.
 * LOOM_SCHED_SPEC_CASE=trees runs that case alone (no layerskip kind):
 * sched_spec_trees_gpuemu runs it on gpuemu.so with a small synthetic
 * model, the tree rows through the GPU kernels' split-K path in regions.
 * Trees under a JSON-schema grammar (pruned, rows masked after each
 * node's own path) mixed with plain and grammar-only requests equal each
 * request alone and plain, and every block returns after preemption and
 * cancellation; sampled ones stay inside the grammar.
 * LOOM_SCHED_SPEC_CASE=grammar runs that case alone.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "harness.h"
#include "engine/grammar.h"
#include "engine/scheduler.h"
#include "engine/spec.h"


static struct gguf_file *gf;
static struct loom_model *model;
static struct loom_tokenizer *tok;
static struct loom_spec_kind *ngram;
static struct loom_spec_kind *ngram_tree; /* ngram.so with spec_tree 12 */
static struct loom_spec_kind *layerskip; /* early exit served by the scheduler */

/* Copy-heavy paragraphs: the model repeats them, so prompt lookup hits. */
static const char *const texts[] = {
	"The quick brown fox jumps over the lazy dog near the river bank, while the farmer watches from the old wooden fence and counts his sheep.",
	"Paris is the capital of France. It is known for the Eiffel Tower, the Louvre museum, wide boulevards and cafes along the Seine.",
	"To bake bread, mix flour, water, salt and yeast, knead the dough for ten minutes, let it rise for an hour, then bake it at two hundred degrees.",
	"The train leaves the station at seven in the morning, stops at every village along the coast, and arrives in the city just before noon.",
	"Water boils at one hundred degrees Celsius at sea level; on a high mountain it boils at a lower temperature because the air pressure is lower.",
	"Our meeting on Monday covers the budget, the hiring plan for the spring, the new office in Berlin and the schedule for the product launch.",
	"A binary search halves the interval at every step: compare the middle element with the key, then continue in the left or the right half.",
	"The library opens at nine, closes at six on weekdays and at noon on Saturdays; books may be borrowed for three weeks and renewed twice.",
};
#define N_TEXTS ((int)(sizeof(texts) / sizeof(texts[0])))

/* A greedy job: the chat turn `ask` then `what`. */
static void chat_job(struct job *j, const char *ask, const char *what, int n_predict)
{
	char text[1024];
	int64_t n;

	snprintf(text, sizeof(text),
		 "<|im_start|>user\n%s\n%s<|im_end|>\n<|im_start|>assistant\n", ask, what);
	n = loom_tokenize(tok, text, strlen(text), false, true, j->prompt, 512);
	ck_assert(n > 0 && n <= 512);
	j->n_prompt = (int)n;
	j->n_predict = n_predict;
	loom_sampler_defaults(&j->sp);
	j->sp.temp = 0;
}

static void make_job(struct job *j, int i, int n_predict)
{
	chat_job(j, "Repeat the following text exactly, word for word:", texts[i % N_TEXTS],
		 n_predict);
}

static struct loom_sched *new_sched(int64_t n_blocks, bool prefix)
{
	struct loom_sched_config cfg;
	struct loom_sched *s;
	char err[512];

	loom_sched_config_defaults(&cfg);
	cfg.n_blocks = n_blocks;
	cfg.prefix_cache = prefix;
	cfg.max_ctx = 512;
	cfg.tokenizer = tok;
	s = loom_sched_new(model, &cfg, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	return s;
}

/* The oracle: each job decoded plainly, alone (kept across tests, see
 * alone_find). */
static void run_alone(struct job *jobs, int n, struct col *ref)
{
	struct loom_sched *s = new_sched(0, false);

	for (int i = 0; i < n; i++) {
		if (!alone_find(&jobs[i], &ref[i])) {
			submit(s, &jobs[i], false);
			drain(s);
			ref[i] = jobs[i].c;
			alone_keep(&jobs[i]);
		}
		ck_assert_int_eq(ref[i].n_final, 1);
		ck_assert_int_gt(ref[i].n, 8);
	}
	loom_sched_free(s);
}

static struct job *make_jobs(int n, int n_predict, bool all_spec)
{
	struct job *jobs = calloc((size_t)n, sizeof(*jobs));

	ck_assert_ptr_nonnull(jobs);
	for (int i = 0; i < n; i++) {
		make_job(&jobs[i], i, n_predict - (i % 3) * 5);
		jobs[i].spec = all_spec || i % 2 == 0 ? ngram : NULL;
	}
	return jobs;
}

START_TEST(greedy_spec_equals_plain)
{
	enum { N = 8 };
	struct job *jobs = make_jobs(N, 96, false);
	struct col ref[N];
	struct loom_spec_kind_stats ks0, ks1;
	struct loom_sched_stats st;
	struct loom_sched *s;

	run_alone(jobs, N, ref);
	loom_spec_kind_stats(ngram, &ks0);
	s = new_sched(0, true);
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], true);
	drain(s);
	loom_sched_get_stats(s, &st);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_uint_gt(st.spec_steps, 0);
	ck_assert_uint_gt(st.spec_accepted, 0);
	ck_assert_uint_le(st.spec_accepted, st.spec_drafted);
	/* fewer target passes than tokens: the point of it all */
	ck_assert_uint_lt(st.spec_steps, st.spec_tokens);
	ck_assert_uint_eq(st.spec_tokens, st.spec_steps + st.spec_accepted);
	loom_spec_kind_stats(ngram, &ks1);
	ck_assert_uint_eq(ks1.n_accepted - ks0.n_accepted, st.spec_accepted);
	ck_assert_uint_eq(ks1.n_steps - ks0.n_steps, st.spec_steps);
	fprintf(stderr, "spec: %llu steps, %llu drafted, %llu accepted, %llu tokens\n",
		(unsigned long long)st.spec_steps, (unsigned long long)st.spec_drafted,
		(unsigned long long)st.spec_accepted, (unsigned long long)st.spec_tokens);
	ck_assert_int_eq(st.blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

START_TEST(short_budget_and_rows)
{
	enum { N = 4 };
	struct job *jobs = make_jobs(N, 64, true);
	struct loom_sched_config cfg;
	struct loom_sched_stats st;
	struct col ref[N];
	struct loom_sched *s;
	char err[512];

	run_alone(jobs, N, ref);
	loom_sched_config_defaults(&cfg);
	cfg.max_ctx = 512;
	cfg.tokenizer = tok;
	cfg.max_batch_tokens = 10; /* 4 decodes leave 6 drafts to share */
	cfg.max_seqs = 4;
	cfg.spec_rows = 3;
	s = loom_sched_new(model, &cfg, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], true);
	drain(s);
	loom_sched_get_stats(s, &st);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_uint_gt(st.spec_accepted, 0);
	ck_assert_int_eq(st.blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

START_TEST(preemption_with_spec)
{
	enum { N = 8 };
	struct job *jobs = make_jobs(N, 96, true);
	struct loom_sched_stats st;
	struct col ref[N];
	struct loom_sched *s;

	run_alone(jobs, N, ref);
	s = new_sched(20, true); /* ~2 requests at a time */
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], true);
	drain(s);
	loom_sched_get_stats(s, &st);
	ck_assert_uint_gt(st.preemptions, 0);
	ck_assert_uint_gt(st.spec_accepted, 0);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_int_eq(st.blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

START_TEST(cancel_speculating_frees)
{
	enum { N = 4 };
	struct job *jobs = make_jobs(N, 96, true);
	struct loom_sched_stats st;
	struct loom_sched *s = new_sched(0, false);
	int steps = 0;

	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], true);
	/* until every request decodes (and speculates) */
	do {
		ck_assert_int_ge(loom_sched_step(s), 0);
		loom_sched_get_stats(s, &st);
	} while (st.spec_steps < 2 * N && ++steps < 1000);
	ck_assert_uint_ge(st.spec_steps, 2 * N);
	for (int i = 0; i < N; i++)
		loom_sched_cancel(s, jobs[i].c.id);
	drain(s);
	loom_sched_get_stats(s, &st);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(jobs[i].c.n_final, 1);
		ck_assert_int_eq(jobs[i].c.fin, LOOM_FINISH_CANCELLED);
	}
	ck_assert_int_eq(st.blocks_used, 0);
	ck_assert_int_eq(st.blocks_cached, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

START_TEST(sampled_spec_runs)
{
	struct job j = { 0 };
	struct loom_sched_stats st;
	struct loom_sched *s = new_sched(0, true);

	make_job(&j, 3, 48);
	j.spec = ngram;
	j.sp.temp = 0.7f;
	j.sp.seed = 11;
	submit(s, &j, true);
	drain(s);
	loom_sched_get_stats(s, &st);
	ck_assert_int_eq(j.c.n_final, 1);
	ck_assert(j.c.fin == LOOM_FINISH_LENGTH || j.c.fin == LOOM_FINISH_EOG);
	ck_assert(j.c.fin != LOOM_FINISH_LENGTH || j.c.n == 48);
	ck_assert_uint_gt(st.spec_steps, 0);
	ck_assert_int_eq(st.blocks_used, 0);
	loom_sched_free(s);
}
END_TEST

START_TEST(model_strategies_refused)
{
	struct loom_spec_config c;
	struct loom_spec_kind *k;
	char err[1024], path[4096];

	loom_spec_config_defaults(&c);
	k = loom_spec_kind_load("layerskip", &c, 49152, NULL, err, sizeof(err));
	ck_assert_ptr_null(k);
	ck_assert_msg(strstr(err, "layerskip.so") && strstr(err, "model"), "%s", err);
	/* the scheduler serves early exit, not a draft model */
	k = loom_spec_kind_load("draft", &c, 49152, &(struct loom_spec_models){ .n_layer = 30 }, err,
				sizeof(err));
	ck_assert_ptr_null(k);
	ck_assert_msg(strstr(err, "draft.so") && strstr(err, "draft model"), "%s", err);
	c.layers = 31;
	k = loom_spec_kind_load("layerskip", &c, 49152, &(struct loom_spec_models){ .n_layer = 30 },
				err, sizeof(err));
	ck_assert_ptr_null(k);
	ck_assert_msg(strstr(err, "31") && strstr(err, "30 layers"), "%s", err);
	c.layers = 0;
	k = loom_spec_kind_load("no-such-strategy", &c, 49152, NULL, err, sizeof(err));
	ck_assert_ptr_null(k);
	ck_assert_msg(strstr(err, "no-such-strategy.so") && strstr(err, "not found"), "%s", err);
	/* a file that is not a shared object */
	snprintf(path, sizeof(path), "/tmp/loom_sched_spec_XXXXXX");
	{
		int fd = mkstemp(path);

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(write(fd, "hello", 5), 5);
		close(fd);
	}
	k = loom_spec_kind_load(path, &c, 49152, NULL, err, sizeof(err));
	unlink(path);
	ck_assert_ptr_null(k);
	ck_assert_msg(strstr(err, path) && strstr(err, "not an ELF"), "%s", err);
}
END_TEST

/* Greedy layerskip requests (drafts from the target's first layers, run by
 * the scheduler in each sequence's own blocks) equal plain ones alone,
 * all drafting in the same steps; then a plain request whose prompt runs
 * on into the generated text reuses the blocks they registered and still
 * equals its plain run alone, so no cached block holds early-exit K/V. */
START_TEST(layerskip_equals_plain)
{
	enum { N = 6 };
	struct job *jobs = make_jobs(N, 80, true);
	struct loom_sched_stats st, st2;
	struct col ref[N], ref2;
	struct job *cont = calloc(1, sizeof(*cont));
	struct loom_sched *s;
	int longest = 0, g;

	ck_assert_ptr_nonnull(cont);
	for (int i = 0; i < N; i++)
		jobs[i].spec = layerskip;
	run_alone(jobs, N, ref);
	s = new_sched(0, true);
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], true);
	drain(s);
	loom_sched_get_stats(s, &st);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_uint_gt(st.spec_drafted, 0);
	ck_assert_uint_gt(st.spec_accepted, 0);
	ck_assert_uint_eq(st.spec_tokens, st.spec_steps + st.spec_accepted);
	ck_assert_int_eq(st.blocks_used, 0);
	fprintf(stderr, "layerskip: %llu steps, %llu drafted, %llu accepted\n",
		(unsigned long long)st.spec_steps, (unsigned long long)st.spec_drafted,
		(unsigned long long)st.spec_accepted);
	/* the longest answer's prompt + its first half, decoded plainly */
	for (int i = 1; i < N; i++)
		if (jobs[i].c.n > jobs[longest].c.n)
			longest = i;
	g = jobs[longest].c.n / 2;
	ck_assert_int_ge(g, 12);
	*cont = jobs[longest];
	memcpy(cont->prompt + cont->n_prompt, jobs[longest].c.toks, sizeof(int32_t) * (size_t)g);
	cont->n_prompt += g;
	cont->n_predict = 16;
	cont->spec = NULL;
	run_alone(cont, 1, &ref2);
	submit(s, cont, false);
	drain(s);
	loom_sched_get_stats(s, &st2);
	/* its prompt's full blocks, generated tokens included, came cached */
	ck_assert_uint_ge(st2.prefix_hits - st.prefix_hits, (uint64_t)(cont->n_prompt / 16));
	assert_same(&cont->c, &ref2, 0);
	loom_sched_free(s);
	free(cont);
	free(jobs);
}
END_TEST

/* A cache too small for the batch: preemption, and early-exit passes that
 * find no blocks (no drafts that step), never change the output. */
START_TEST(layerskip_short_blocks)
{
	enum { N = 6 };
	struct job *jobs = make_jobs(N, 80, true);
	struct loom_sched_stats st;
	struct col ref[N];
	struct loom_sched *s;

	for (int i = 0; i < N; i++)
		jobs[i].spec = layerskip;
	run_alone(jobs, N, ref);
	s = new_sched(16, true);
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], true);
	drain(s);
	loom_sched_get_stats(s, &st);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_uint_gt(st.preemptions, 0);
	ck_assert_uint_gt(st.spec_accepted, 0);
	ck_assert_int_eq(st.blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

/* spec_step_rows: a lone request drafts at most rows - 1 per step; a full
 * batch at most rows - n in all; outputs never change. */
START_TEST(step_rows_cap)
{
	enum { N = 8 };
	struct job *jobs = make_jobs(N, 64, true);
	struct loom_sched_config cfg;
	struct loom_sched_stats st;
	struct col ref[N];
	struct loom_sched *s;
	char err[512];

	run_alone(jobs, N, ref);
	loom_sched_config_defaults(&cfg);
	cfg.max_ctx = 512;
	cfg.tokenizer = tok;
	cfg.spec_step_rows = 3;
	s = loom_sched_new(model, &cfg, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	submit(s, &jobs[0], true);
	drain(s);
	loom_sched_get_stats(s, &st);
	assert_same(&jobs[0].c, &ref[0], 0);
	ck_assert_uint_gt(st.spec_accepted, 0);
	ck_assert_uint_le(st.spec_drafted, 2 * st.spec_steps);
	loom_sched_free(s);
	/* 8 at once with 8 rows: whenever all decode, nobody drafts */
	cfg.spec_step_rows = 8;
	s = loom_sched_new(model, &cfg, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	for (int i = 0; i < N; i++)
		submit(s, &jobs[i], true);
	drain(s);
	loom_sched_get_stats(s, &st);
	for (int i = 0; i < N; i++)
		assert_same(&jobs[i].c, &ref[i], i);
	ck_assert_uint_lt(st.spec_drafted, st.spec_steps);
	ck_assert_int_eq(st.blocks_used, 0);
	loom_sched_free(s);
	free(jobs);
}
END_TEST

/* draft.so with the target itself as the draft model (a plumbing check:
 * its greedy drafts are the target's choices, so nearly all are
 * accepted): 4 concurrent requests, each in its own block table of the
 * pool, equal plain runs alone; a pool of 2 blocks (drafts have no room:
 * none that step) changes nothing either. */
START_TEST(draft_pool_equals_plain)
{
	enum { N = 4 };
	struct loom_model_params mp = { .backend = "cpu.so",
		.backend_flags = LOOM_BACKEND_BATCH_INVARIANT | LOOM_BACKEND_EXACT };
	const char *env = getenv("LOOM_SCHED_BACKEND");
	struct job *jobs = make_jobs(N, 64, true);
	struct loom_spec_draft_pool *pool;
	struct loom_spec_kind *draft;
	struct loom_spec_config c;
	struct loom_sched_stats st;
	struct col ref[N];
	struct loom_sched *s;
	char err[1024], other[4096];
	const char *root = getenv("LOOM_BUILD_ROOT");

	if (env && *env)
		mp.backend = env;
	loom_spec_config_defaults(&c);
	c.max_draft = 6;
	run_alone(jobs, N, ref);
	for (int blocks = 200; blocks >= 2; blocks -= 198) {
		pool = loom_spec_draft_pool_open(getenv("LOOM_MODEL"), tok, &mp, 512, blocks, err,
						 sizeof(err));
		ck_assert_msg(pool != NULL, "%s", err);
		draft = loom_spec_kind_load("draft", &c, (int32_t)model->hp.n_vocab,
					    &(struct loom_spec_models){ .pool = pool }, err, sizeof(err));
		ck_assert_msg(draft != NULL, "%s", err);
		for (int i = 0; i < N; i++)
			jobs[i].spec = draft;
		s = new_sched(0, true);
		for (int i = 0; i < N; i++)
			submit(s, &jobs[i], true);
		drain(s);
		loom_sched_get_stats(s, &st);
		for (int i = 0; i < N; i++)
			assert_same(&jobs[i].c, &ref[i], i);
		fprintf(stderr, "draft (%d blocks): %llu steps, %llu drafted, %llu accepted\n", blocks,
			(unsigned long long)st.spec_steps, (unsigned long long)st.spec_drafted,
			(unsigned long long)st.spec_accepted);
		if (blocks > 2) {
			ck_assert_uint_gt(st.spec_drafted, 0);
			ck_assert_uint_ge(st.spec_accepted * 10, st.spec_drafted * 9);
		}
		ck_assert_int_eq(st.blocks_used, 0);
		loom_sched_free(s);
		loom_spec_kind_free(draft);
		loom_spec_draft_pool_free(pool);
	}
	/* another vocabulary is refused, naming the file */
	if (root) {
		snprintf(other, sizeof(other), "%s/tests/spec/other_vocab.gguf", root);
		if (access(other, R_OK) == 0) {
			pool = loom_spec_draft_pool_open(other, tok, &mp, 512, 10, err, sizeof(err));
			ck_assert_ptr_null(pool);
			ck_assert_msg(strstr(err, other) && strstr(err, "vocabulary"), "%s", err);
		}
	}
	free(jobs);
}
END_TEST

/* LOOM_SCHED_SPEC_CASE=trees: the token-tree case alone. */
static bool trees_only(void)
{
	const char *only = getenv("LOOM_SCHED_SPEC_CASE");

	return only && !strcmp(only, "trees");
}

/* LOOM_SCHED_SPEC_CASE=grammar: trees with a grammar alone. */
static bool only_grammar(void)
{
	const char *only = getenv("LOOM_SCHED_SPEC_CASE");

	return only && !strcmp(only, "grammar");
}

static void load_model(void)
{
	const char *path = getenv("LOOM_MODEL");
	const char *backend = getenv("LOOM_SCHED_BACKEND");
	/* exact mode: the prompts were picked so that f32-activation greedy
	 * decoding runs past 8 tokens (fast mode stops one of them at 6) */
	struct loom_model_params p = { .backend = backend && *backend ? backend : "cpu.so",
		.backend_flags = LOOM_BACKEND_BATCH_INVARIANT | LOOM_BACKEND_EXACT };
	struct loom_spec_config c;
	char err[1024];

	gf = gguf_open(path, err, sizeof(err));
	ck_assert_msg(gf != NULL, "%s", err);
	tok = loom_tokenizer_from_gguf(gf, err, sizeof(err));
	ck_assert_msg(tok != NULL, "%s", err);
	model = loom_model_load(gf, &p, err, sizeof(err));
	ck_assert_msg(model != NULL, "%s", err);
	loom_spec_config_defaults(&c);
	c.max_draft = 6;
	ngram = loom_spec_kind_load("ngram", &c, (int32_t)model->hp.n_vocab, NULL, err, sizeof(err));
	ck_assert_msg(ngram != NULL, "%s", err);
	ck_assert_str_eq(loom_spec_kind_name(ngram), "ngram");
	c.max_tree = 12;
	ngram_tree = loom_spec_kind_load("ngram", &c, (int32_t)model->hp.n_vocab, NULL, err,
					 sizeof(err));
	ck_assert_msg(ngram_tree != NULL, "%s", err);
	c.max_tree = 0;
	if (trees_only())
		return;
	c.layers = 28; /* of 30: shallower drafts of SmolLM2 are never accepted */
	layerskip = loom_spec_kind_load("layerskip", &c, (int32_t)model->hp.n_vocab,
					&(struct loom_spec_models){ .n_layer = model->hp.n_layer }, err,
					sizeof(err));
	ck_assert_msg(layerskip != NULL, "%s", err);
}

static void unload_model(void)
{
	alone_forget();
	loom_spec_kind_free(ngram);
	loom_spec_kind_free(ngram_tree);
	loom_spec_kind_free(layerskip);
	loom_model_free(model);
	loom_tokenizer_free(tok);
	gguf_close(gf);
}

/* Jobs [0, n) batched (prefix cache on), then in a cache of 20 blocks
 * (preemption): each equals ref (alone), drafts get accepted, every block
 * returns. */
static void batched_equal_alone(struct job *jobs, int n, const struct col *ref)
{
	struct loom_sched_stats st;

	for (int pass = 0; pass < 2; pass++) {
		struct loom_sched *s = new_sched(pass ? 20 : 0, true);

		for (int i = 0; i < n; i++)
			submit(s, &jobs[i], true);
		drain(s);
		loom_sched_get_stats(s, &st);
		for (int i = 0; i < n; i++)
			assert_same(&jobs[i].c, &ref[i], i);
		ck_assert_uint_gt(st.spec_accepted, 0);
		ck_assert(!pass || st.preemptions > 0);
		ck_assert_int_eq(st.blocks_used, 0);
		loom_sched_free(s);
	}
}

/* Jobs [0, n) cancelled once 8 speculating steps ran (or 1000 steps):
 * every block returns. Returns the speculating steps before the cancel. */
static uint64_t cancel_mid_run_frees(struct job *jobs, int n)
{
	struct loom_sched *s = new_sched(0, false);
	struct loom_sched_stats st;
	uint64_t spec_steps;
	int steps = 0;

	for (int i = 0; i < n; i++)
		submit(s, &jobs[i], true);
	do {
		ck_assert_int_ge(loom_sched_step(s), 0);
		loom_sched_get_stats(s, &st);
	} while (st.spec_steps < 8 && ++steps < 1000);
	spec_steps = st.spec_steps;
	for (int i = 0; i < n; i++)
		loom_sched_cancel(s, jobs[i].c.id);
	drain(s);
	loom_sched_get_stats(s, &st);
	ck_assert_int_eq(st.blocks_used, 0);
	loom_sched_free(s);
	return spec_steps;
}

/* Token trees: 8 greedy requests with trees equal plain alone, batched
 * (prefix cache on) and in a cache of 20 blocks (preemption); 4 cancelled
 * mid-run. Every block returns each time. */
START_TEST(trees_equal_plain_and_free_blocks)
{
	enum { N = 8 };
	struct job *jobs = make_jobs(N, 64, true);
	struct col ref[N];

	for (int i = 0; i < N; i++)
		jobs[i].spec = ngram_tree;
	run_alone(jobs, N, ref);
	batched_equal_alone(jobs, N, ref);
	cancel_mid_run_frees(jobs, 4);
	free(jobs);
}
END_TEST

/* JSON to copy: objects that share keys and part of their values, so
 * ngram.so's trees branch, and the person schema's grammar refuses some
 * branches ("age" a string, "tags" not an array). */
static const char *const json_texts[] = {
	"{\"name\": \"Ann\", \"age\": 31, \"tags\": [\"red\", \"blue\"], \"ok\": true} "
	"{\"name\": \"Ann\", \"age\": \"old\", \"tags\": \"red\"}",
	"{\"name\": \"Bob Stone\", \"age\": 45, \"ok\": false} "
	"{\"name\": \"Bob\", \"age\": 45, \"tags\": [\"x\"], \"ok\": 0}",
	"{\"name\": \"Cid\", \"age\": 7, \"tags\": [\"a\", \"b\", \"c\"]} "
	"{\"name\": \"Cid\", \"age\": \"7\", \"tags\": [\"a\", \"b\"]}",
};
static const char person_schema[] =
	"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
	"\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
	"{\"type\":\"string\"},\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}},"
	"\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

/* Job i of a grammar mix: even jobs copy JSON under the person schema
 * with trees; of the odd ones, i % 4 == 1 under the schema plainly, else
 * copy text with trees (no grammar). */
static void make_json_job(struct job *j, int i, int n_predict, const struct loom_grammar *g)
{
	if (i % 4 == 3) {
		make_job(j, i, n_predict);
		j->spec = ngram_tree;
		j->grammar = NULL;
		return;
	}
	chat_job(j, "Repeat the first JSON object exactly:", json_texts[(i / 2) % 3], n_predict);
	j->grammar = g;
	j->spec = i % 4 == 1 ? NULL : ngram_tree;
}

static struct loom_grammar *person_grammar(void)
{
	char err[512];
	struct loom_grammar *g = loom_grammar_new("json_schema", person_schema,
						  strlen(person_schema), err, sizeof(err));

	ck_assert_msg(g != NULL, "%s", err);
	return g;
}

/* Whether toks[0..n) is text the grammar allows (with n_final EOG: a
 * complete document). */
static bool fits_grammar(const struct loom_grammar *g, const struct col *c)
{
	struct loom_gvocab *v = loom_gvocab_new(tok);
	struct loom_gmatch *m = v ? loom_gmatch_new(g, v) : NULL;
	bool ok = m != NULL;

	for (int k = 0; ok && k < c->n; k++) {
		if (loom_tokenizer_is_eog(tok, c->toks[k])) {
			ok = loom_gmatch_done(m);
			break;
		}
		ok = loom_gmatch_push(m, c->toks[k]) == 0;
		loom_gmatch_keep(m, 1);
	}
	ok = ok && (c->fin != LOOM_FINISH_EOG || loom_gmatch_done(m));
	loom_gmatch_free(m);
	loom_gvocab_free(v);
	return ok;
}

/* Token trees with a grammar: 8 greedy requests (schema with trees, schema
 * plain, text with trees) equal each alone and plain, batched (prefix
 * cache on) and in 20 blocks (preemption); 4 with trees and the schema
 * cancelled mid-run; 2 sampled with trees under the schema give outputs
 * the grammar allows. Every block returns each time. */
START_TEST(trees_with_grammar)
{
	enum { N = 8 };
	struct loom_grammar *g = person_grammar();
	struct job *jobs = calloc(N, sizeof(*jobs));
	struct loom_sched_stats st;
	struct col ref[N];
	struct loom_sched *s;

	ck_assert_ptr_nonnull(jobs);
	for (int i = 0; i < N; i++)
		make_json_job(&jobs[i], i, 64 - (i % 3) * 5, g);
	run_alone(jobs, N, ref);
	for (int i = 0; i < N; i++)
		ck_assert_msg(!jobs[i].grammar || fits_grammar(g, &ref[i]), "request %d", i);
	batched_equal_alone(jobs, N, ref);
	for (int i = 0; i < 4; i++)
		make_json_job(&jobs[i], 2 * i, 64, g);
	ck_assert_uint_ge(cancel_mid_run_frees(jobs, 4), 8); /* cancelled mid-run */
	s = new_sched(0, true);
	for (int i = 0; i < 2; i++) {
		make_json_job(&jobs[i], 2 * i, 64, g);
		jobs[i].sp.temp = 0.8f;
		jobs[i].sp.seed = 5 + (uint64_t)i;
		submit(s, &jobs[i], true);
	}
	drain(s);
	loom_sched_get_stats(s, &st);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(jobs[i].c.n_final, 1);
		ck_assert_msg(jobs[i].c.fin != LOOM_FINISH_ERROR, "sampled request %d failed", i);
		ck_assert_msg(fits_grammar(g, &jobs[i].c), "sampled request %d", i);
	}
	ck_assert_uint_gt(st.spec_steps, 0);
	ck_assert_int_eq(st.blocks_used, 0);
	loom_sched_free(s);
	loom_grammar_free(g);
	free(jobs);
}
END_TEST

static void add_all(TCase *tc)
{
	tcase_add_test(tc, model_strategies_refused);
	tcase_add_test(tc, greedy_spec_equals_plain);
	tcase_add_test(tc, short_budget_and_rows);
	tcase_add_test(tc, preemption_with_spec);
	tcase_add_test(tc, cancel_speculating_frees);
	tcase_add_test(tc, sampled_spec_runs);
	tcase_add_test(tc, layerskip_equals_plain);
	tcase_add_test(tc, layerskip_short_blocks);
	tcase_add_test(tc, step_rows_cap);
	tcase_add_test(tc, draft_pool_equals_plain);
	tcase_add_test(tc, trees_equal_plain_and_free_blocks);
	tcase_add_test(tc, trees_with_grammar);
}

int main(void)
{
	const char *path = getenv("LOOM_MODEL");
	Suite *s = suite_create("sched_spec");
	TCase *tc = tcase_create("model");
	SRunner *sr;
	int failed;

	if (!path || access(path, R_OK) != 0) {
		printf("skip: LOOM_MODEL (%s) not found\n", path ? path : "unset");
		return 77;
	}
	tcase_add_unchecked_fixture(tc, load_model, unload_model);
	tcase_set_timeout(tc, 900);
	if (trees_only())
		tcase_add_test(tc, trees_equal_plain_and_free_blocks);
	else if (only_grammar())
		tcase_add_test(tc, trees_with_grammar);
	else
		add_all(tc);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
