/*
 * Speculative decoding through the public API on a small synthetic model
 * (argv[1]; written by tools/mkgguf.py at build time), plugins from the
 * build tree and the test plugins in argv[2]:
 *   - broken plugins are refused with messages naming the file;
 *   - greedy output with every strategy is the plain greedy output;
 *   - with temperature sampling, the tokens after the first have the same
 *     distribution with and without speculation (two-sample chi-square),
 *     also with a plugin that lies about its draft probabilities;
 *   - the same with token trees (spec_tree, ABI 1.8 attention on cpu.so):
 *     greedy output is plain output, and sampled output keeps the plain
 *     distribution, with ngram.so's trees and with a plugin whose trees
 *     put several siblings under one node (the multi-draft rule).
 *     Tolerance: a two-sample chi-square homogeneity test per position
 *     over N_SEEDS fixed seeds, rejected above the quantile at z = 3.09
 *     (about p = 0.001 each).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "engine/sampler.h"

static const char *model, *fake_dir, *other_vocab;
static int32_t tree_nodes; /* spec_tree of the engines open_with opens */
#define PROMPT "abcabcabcabcabc abc abc abcabcabc"
#define N_SEEDS 3000
#define N_TOK 4

static struct loom_engine *open_with(const char *spec, char *err, size_t errlen)
{
	struct loom_engine_params p;

	loom_engine_params_init(&p);
	p.model = model;
	p.n_ctx = 128;
	p.n_threads = 1;
	p.spec = spec;
	p.spec_draft_model = model; /* draft.so: the same vocabulary, trivially */
	p.spec_layers = 1;
	p.spec_tree = tree_nodes;
	return loom_engine_open(&p, err, errlen);
}

static void fake_path(char *out, size_t cap, const char *name)
{
	snprintf(out, cap, "%s/%s.so", fake_dir, name);
}

static void expect_refusal(const char *name, const char *reason)
{
	char path[4096], err[4096] = "";

	fake_path(path, sizeof(path), name);
	ck_assert_ptr_null(open_with(path, err, sizeof(err)));
	ck_assert_msg(strstr(err, path) && strstr(err, reason), "%s: got '%s'", name, err);
}

START_TEST(broken_plugins_are_refused)
{
	char err[4096] = "";

	expect_refusal("no_entry", "no entry symbol loom_spec_entry");
	expect_refusal("abi2", "ABI major 2");
	expect_refusal("no_propose", "required slot propose is missing");
	expect_refusal("small", "descriptor of 16 bytes");
	ck_assert_ptr_null(open_with("nosuch.so", err, sizeof(err)));
	ck_assert_msg(strstr(err, "nosuch.so") && strstr(err, "not found"), "%s", err);
	ck_assert_ptr_null(open_with("/nonexistent/x.so", err, sizeof(err)));
	ck_assert_msg(strstr(err, "/nonexistent/x.so"), "%s", err);
}
END_TEST

struct run {
	int32_t ids[64];
	int n;
	char text[2048];
	size_t len;
};

/* The sampling prompt: PROMPT, the model's own greedy continuation of it,
 * then PROMPT again, so prompt lookup finds drafts the model likes. */
static char sampling_prompt[8192];

static int collect(void *user, int32_t token, const char *text, size_t len)
{
	struct run *r = user;

	if (r->n < 64)
		r->ids[r->n++] = token;
	if (r->len + len < sizeof(r->text)) {
		memcpy(r->text + r->len, text, len);
		r->len += len;
	}
	return 0;
}

static void generate(struct loom_engine *e, float temp, uint64_t seed, int n, struct run *r,
		     struct loom_generation_stats *st)
{
	const char *prompt = temp > 0.0f && sampling_prompt[0] ? sampling_prompt : PROMPT;
	struct loom_generation_params g;
	char err[1024];

	loom_generation_params_init(&g);
	g.n_predict = n;
	g.temp = temp;
	g.top_k = 6;
	g.top_p = 1.0f;
	g.min_p = 0.0f;
	g.seed = seed;
	r->n = 0;
	r->len = 0;
	ck_assert_msg(loom_generate(e, prompt, strlen(prompt), &g, collect, r, st, err,
				    sizeof(err)) == 0, "%s", err);
}

static const char *const strategies[] = { "ngram.so", "layerskip.so", "draft.so" };

START_TEST(greedy_matches_plain)
{
	struct loom_engine *plain, *e;
	struct loom_generation_stats st;
	struct run a, b;
	char err[4096];

	plain = open_with(NULL, err, sizeof(err));
	ck_assert_msg(plain != NULL, "%s", err);
	generate(plain, 0.0f, 0, 40, &a, &st);
	ck_assert_int_gt(a.n, 0);
	for (size_t i = 0; i < sizeof(strategies) / sizeof(strategies[0]); i++) {
		e = open_with(strategies[i], err, sizeof(err));
		ck_assert_msg(e != NULL, "%s", err);
		generate(e, 0.0f, 0, 40, &b, &st);
		ck_assert_int_eq(a.n, b.n);
		for (int j = 0; j < a.n; j++)
			ck_assert_msg(a.ids[j] == b.ids[j], "%s: token %d: %d vs %d",
				      strategies[i], j, b.ids[j], a.ids[j]);
		ck_assert_msg(st.spec_steps > 0, "%s took no speculative step", strategies[i]);
		loom_engine_close(e);
	}
	loom_engine_close(plain);
}
END_TEST

/* counts[pos][token] over N_SEEDS runs; token 300+ slot for "ended". */
#define BINS 512
static void sample_counts(struct loom_engine *e, int (*counts)[BINS], int64_t *accepted)
{
	struct loom_generation_stats st;
	struct run r;

	for (int s = 0; s < N_SEEDS; s++) {
		generate(e, 0.8f, 1000 + (uint64_t)s, N_TOK, &r, &st);
		for (int pos = 0; pos < N_TOK; pos++) {
			int t = pos < r.n ? r.ids[pos] : BINS - 1;

			counts[pos][t < BINS ? t : BINS - 1]++;
		}
		*accepted += st.spec_accepted;
	}
}

/* Wilson-Hilferty: the chi-square quantile at z standard deviations. */
static double chi2_crit(int df, double z)
{
	double h = 2.0 / (9.0 * df);

	return df * pow(1.0 - h + z * sqrt(h), 3.0);
}

/* Two-sample homogeneity test; bins with fewer than 10 in all are pooled. */
static void expect_same(const int *a, const int *b, const char *what)
{
	double na = 0, nb = 0, stat = 0, pa = 0, pb = 0;
	int df = -1;

	for (int i = 0; i < BINS; i++)
		na += a[i], nb += b[i];
	for (int i = 0; i <= BINS; i++) {
		double x = i < BINS ? a[i] : pa, y = i < BINS ? b[i] : pb, ex, ey;

		if (i < BINS && x + y < 10) {
			pa += x, pb += y;
			continue;
		}
		if (x + y == 0)
			continue;
		ex = (x + y) * na / (na + nb);
		ey = (x + y) * nb / (na + nb);
		stat += (x - ex) * (x - ex) / ex + (y - ey) * (y - ey) / ey;
		df++;
	}
	if (df < 1)
		return; /* one outcome only: nothing to compare */
	ck_assert_msg(stat < chi2_crit(df, 3.09), "%s: chi-square %.1f with %d df (limit %.1f)",
		      what, stat, df, chi2_crit(df, 3.09));
}

static void check_sampling(const char *spec, const char *bias_token)
{
	static int plain_counts[N_TOK][BINS], have_plain;
	int (*counts)[BINS] = calloc(N_TOK, sizeof(*counts));
	struct loom_engine *e;
	int64_t accepted = 0, unused = 0;
	char err[4096], what[256];

	if (!have_plain) {
		struct loom_generation_stats st;
		struct run r;

		e = open_with(NULL, err, sizeof(err));
		ck_assert_msg(e != NULL, "%s", err);
		generate(e, 0.0f, 0, 24, &r, &st);
		snprintf(sampling_prompt, sizeof(sampling_prompt), "%s%.*s%s", PROMPT,
			 (int)r.len, r.text, PROMPT);
		sample_counts(e, plain_counts, &unused);
		loom_engine_close(e);
		have_plain = 1;
	}
	if (bias_token)
		setenv("SPEC_BIAS_TOKEN", bias_token, 1);
	e = open_with(spec, err, sizeof(err));
	ck_assert_msg(e != NULL, "%s", err);
	sample_counts(e, counts, &accepted);
	loom_engine_close(e);
	ck_assert_msg(accepted > 0, "%s: no draft was ever accepted, the test proves nothing", spec);
	for (int pos = 1; pos < N_TOK; pos++) {
		snprintf(what, sizeof(what), "%s, token %d", spec, pos);
		expect_same(plain_counts[pos], counts[pos], what);
	}
	free(counts);
}

/* The plain run's most common second token: what a lying plugin pushes. */
static void common_token(char *out, size_t cap)
{
	struct loom_engine *e;
	struct loom_generation_stats st;
	struct run r;
	int counts[BINS] = { 0 }, best = 0;
	char err[4096];

	e = open_with(NULL, err, sizeof(err));
	ck_assert_msg(e != NULL, "%s", err);
	for (int s = 0; s < 200; s++) {
		generate(e, 0.8f, 5000 + (uint64_t)s, 2, &r, &st);
		if (r.n == 2 && r.ids[1] < BINS)
			counts[r.ids[1]]++;
	}
	for (int i = 1; i < BINS; i++)
		if (counts[i] > counts[best])
			best = i;
	loom_engine_close(e);
	snprintf(out, cap, "%d", best);
}

START_TEST(sampling_distribution_is_preserved)
{
	char path[4096], tok[32];

	check_sampling("ngram.so", NULL);
	check_sampling("layerskip.so", NULL);
	common_token(tok, sizeof(tok));
	fake_path(path, sizeof(path), "biased");
	check_sampling(path, tok);
	fake_path(path, sizeof(path), "fixed");
	check_sampling(path, tok);
}
END_TEST

START_TEST(draft_vocabulary_and_layers_are_checked)
{
	struct loom_engine_params p;
	char err[4096] = "";

	loom_engine_params_init(&p);
	p.model = model;
	p.n_ctx = 64;
	p.spec = "draft.so";
	p.spec_draft_model = other_vocab;
	ck_assert_ptr_null(loom_engine_open(&p, err, sizeof(err)));
	ck_assert_msg(strstr(err, other_vocab) && strstr(err, "vocabulary"), "%s", err);
	p.spec = "layerskip.so";
	p.spec_draft_model = NULL;
	p.spec_layers = 3; /* the model has 2 */
	ck_assert_ptr_null(loom_engine_open(&p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "spec_layers"), "%s", err);
	/* draft.so without a draft model: refused when the engine opens
	 * (the strategy is probed once at load), naming why */
	p.spec = "draft.so";
	p.spec_layers = 0;
	ck_assert_ptr_null(loom_engine_open(&p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "draft.so") && strstr(err, "no draft model"), "%s", err);
}
END_TEST

/* loom_sampler_probs against loom_sampler_sample's own draws. */
static void probs_match_draws(const struct loom_sampler_params *sp)
{
	enum { V = 40, N = 40000 };
	float logits[V], work[V], probs[V];
	int32_t hist[3] = { 3, 3, 7 };
	int counts[V] = { 0 };
	double total = 0, stat = 0;
	int df = -1;
	struct loom_sampler *s;
	char err[256];

	for (int i = 0; i < V; i++)
		logits[i] = (float)((i * 37) % 11) * 0.4f - 2.0f + 0.01f * (float)i;
	s = loom_sampler_new(sp, V, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	memcpy(work, logits, sizeof(work));
	ck_assert_int_eq(loom_sampler_probs(s, work, hist, 3, probs), 0);
	for (int i = 0; i < V; i++)
		total += probs[i];
	ck_assert_msg(fabs(total - 1.0) < 1e-5, "probs sum to %f", total);
	for (int n = 0; n < N; n++) {
		memcpy(work, logits, sizeof(work));
		counts[loom_sampler_sample(s, work, hist, 3)]++;
	}
	for (int i = 0; i < V; i++) {
		double ex = probs[i] * N;

		if (probs[i] == 0.0f) {
			ck_assert_msg(counts[i] == 0, "token %d drawn but has probability 0", i);
			continue;
		}
		stat += (counts[i] - ex) * (counts[i] - ex) / ex;
		df++;
	}
	if (df > 0)
		ck_assert_msg(stat < chi2_crit(df, 3.09), "chi-square %.1f, %d df", stat, df);
	loom_sampler_free(s);
}

START_TEST(sampler_probs_is_what_sample_draws)
{
	struct loom_sampler_params sp;

	loom_sampler_defaults(&sp);
	sp.repeat_penalty = 1.3f;
	sp.seed = 11;
	probs_match_draws(&sp); /* top-k 40, top-p .95, min-p .05 */
	sp.top_k = 0;
	sp.min_p = 0.0f;
	sp.top_p = 0.8f;
	probs_match_draws(&sp);
	sp.top_k = 5;
	sp.top_p = 1.0f;
	sp.temp = 1.5f;
	probs_match_draws(&sp);
}
END_TEST

START_TEST(trees_match_plain_and_keep_the_distribution)
{
	struct loom_engine *plain, *e;
	struct loom_generation_stats st;
	char path[4096], tok[32], err[4096];
	const char *specs[2] = { "ngram.so", path };
	struct run a, b;

	fake_path(path, sizeof(path), "tree");
	common_token(tok, sizeof(tok));
	setenv("SPEC_BIAS_TOKEN", tok, 1);
	plain = open_with(NULL, err, sizeof(err));
	ck_assert_msg(plain != NULL, "%s", err);
	generate(plain, 0.0f, 0, 40, &a, &st);
	loom_engine_close(plain);
	tree_nodes = 16;
	for (int i = 0; i < 2; i++) {
		e = open_with(specs[i], err, sizeof(err));
		ck_assert_msg(e != NULL, "%s", err);
		generate(e, 0.0f, 0, 40, &b, &st);
		ck_assert_int_eq(a.n, b.n);
		for (int j = 0; j < a.n; j++)
			ck_assert_msg(a.ids[j] == b.ids[j], "%s tree: token %d: %d vs %d", specs[i],
				      j, b.ids[j], a.ids[j]);
		ck_assert_msg(st.spec_steps > 0, "%s took no speculative step", specs[i]);
		loom_engine_close(e);
	}
	check_sampling("ngram.so", NULL);
	check_sampling(path, tok);
	tree_nodes = 0;
}
END_TEST

int main(int argc, char **argv)
{
	Suite *s = suite_create("spec");
	TCase *tc = tcase_create("spec");
	SRunner *sr;
	int failed;

	if (argc < 4) {
		fprintf(stderr, "usage: test_spec MODEL.gguf FAKE_PLUGIN_DIR OTHER_VOCAB.gguf\n");
		return 2;
	}
	model = argv[1];
	fake_dir = argv[2];
	other_vocab = argv[3];
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, broken_plugins_are_refused);
	tcase_add_test(tc, greedy_matches_plain);
	tcase_add_test(tc, draft_vocabulary_and_layers_are_checked);
	tcase_add_test(tc, sampler_probs_is_what_sample_draws);
	tcase_add_test(tc, sampling_distribution_is_preserved);
	tcase_add_test(tc, trees_match_plain_and_keep_the_distribution);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
