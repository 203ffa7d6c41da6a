/*
 * The token-tree acceptance rule (core/engine/spec.c, accept_tree) on
 * known distributions, no model: a test strategy (argv[1], tree.so)
 * proposes three sibling drafts under the last token, each with a child;
 * every verification row gets the same logits, so every emitted token
 * must be distributed as p = softmax(logits / temp) whatever the tree
 * (the multi-draft rejection rule: a child is accepted with what is left
 * of p on its token, a rejected token leaves p, and the correction is
 * drawn from what is left).
 *
 * Tolerance: chi-square goodness of fit of the first and second emitted
 * tokens against p over N trials with a fixed seed, rejected above the
 * quantile at z = 3.09 (about p = 0.001). Greedy: the walk follows the
 * argmax exactly (a path through the tree or the correction).
 *
 * With a grammar (a toy one here): the tree pruned of refused nodes and
 * each row masked after its own path, every emitted token is distributed
 * as p masked by the state it follows (same chi-square bound).
 *
 * Usage: test_tree_accept TREE_SO
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/spec.h"
#include "engine/sampler.h"

#define V 8
#define N 20000

static const char *tree_so;
/* the last token's logits: tokens 2, 3, 4 are the drafts (SPEC_BIAS_TOKEN 2) */
static const float logits[V] = { 0.1f, -1.0f, 1.2f, 0.9f, -0.3f, 0.6f, -2.0f, 0.2f };

static double chi2_crit(int df, double z)
{
	double h = 2.0 / (9.0 * df);

	return df * pow(1.0 - h + z * sqrt(h), 3.0);
}

/* counts[V] against N_total * p (a token p gives 0 must never come). */
static void expect_fit(const long *counts, const double *p, const char *what)
{
	double n = 0, stat = 0;
	int df = -1;

	for (int i = 0; i < V; i++)
		n += (double)counts[i];
	for (int i = 0; i < V; i++) {
		double e = n * p[i];

		if (p[i] == 0) {
			ck_assert_msg(counts[i] == 0, "%s: token %d (masked) came %ld times", what, i,
				      counts[i]);
			continue;
		}
		stat += (counts[i] - e) * (counts[i] - e) / e;
		df++;
	}
	ck_assert_msg(stat < chi2_crit(df, 3.09), "%s: chi-square %.1f with %d df (limit %.1f)",
		      what, stat, df, chi2_crit(df, 3.09));
}

static struct loom_spec_seq *open_seq(struct loom_spec_kind **kind)
{
	struct loom_spec_config c;
	struct loom_spec_seq *q;
	char err[512];

	setenv("SPEC_BIAS_TOKEN", "2", 1);
	loom_spec_config_defaults(&c);
	c.max_tree = 16;
	*kind = loom_spec_kind_load(tree_so, &c, V, NULL, err, sizeof(err));
	ck_assert_msg(*kind != NULL, "%s", err);
	q = loom_spec_seq_new(*kind, 8, 77, NULL, err, sizeof(err));
	ck_assert_msg(q != NULL, "%s", err);
	return q;
}

/* One step: proposes, verifies with the same logits on every row.
 * Returns the path length; tok[0 .. n] the emitted tokens. */
static int32_t step(struct loom_spec_seq *q, struct loom_sampler *smp, bool greedy,
		    int32_t *tok)
{
	int32_t hist[32] = { 5 }, out[16], parent[17], path[16], next, k, n;
	float rows[17 * V];
	char err[256];

	k = loom_spec_seq_propose(q, NULL, hist, 1, 16, out, parent, err, sizeof(err));
	ck_assert_int_eq(k, 6); /* 8 nodes, the repeated sibling and its child dropped */
	ck_assert(loom_spec_seq_is_tree(q));
	for (int32_t r = 0; r <= k; r++)
		memcpy(rows + r * V, logits, sizeof(logits));
	memcpy(hist + 1, out, sizeof(int32_t) * (size_t)k);
	n = loom_spec_seq_accept_tree(q, smp, greedy, rows, hist, 1, k, path, &next);
	for (int32_t d = 0; d < n; d++) {
		ck_assert_int_eq(hist[1 + d], out[path[d] - 1]); /* the path's tokens */
		ck_assert_int_eq(parent[path[d]], d ? path[d - 1] : 0);
		tok[d] = hist[1 + d];
	}
	ck_assert_int_ge(next, 0);
	tok[n] = next;
	return n;
}

START_TEST(sampled_tokens_keep_the_distribution)
{
	struct loom_sampler_params sp = { .temp = 1.0f, .top_p = 1.0f, .repeat_penalty = 1.0f,
		.seed = 1234 };
	struct loom_spec_kind *kind;
	struct loom_spec_seq *q = open_seq(&kind);
	struct loom_sampler *smp = loom_sampler_new(&sp, V, NULL, 0);
	long first[V] = { 0 }, second[V] = { 0 }, accepted = 0;
	double p[V], sum = 0;
	int32_t tok[8];

	ck_assert_ptr_nonnull(smp);
	for (int i = 0; i < V; i++)
		sum += p[i] = exp((double)logits[i]);
	for (int i = 0; i < V; i++)
		p[i] /= sum;
	for (int t = 0; t < N; t++) {
		int32_t n = step(q, smp, false, tok);

		accepted += n;
		first[tok[0]]++;
		if (n >= 1)
			second[tok[1]]++;
	}
	/* the drafts hold 0.59 of p: most steps accept one */
	ck_assert_msg(accepted > N / 2, "only %ld drafts accepted in %d steps", accepted, N);
	expect_fit(first, p, "first token");
	expect_fit(second, p, "second token");
	loom_sampler_free(smp);
	loom_spec_seq_free(q);
	loom_spec_kind_free(kind);
}
END_TEST

START_TEST(greedy_walk_follows_the_argmax)
{
	struct loom_sampler_params sp = { .temp = 0.0f, .top_p = 1.0f, .repeat_penalty = 1.0f };
	struct loom_spec_kind *kind;
	struct loom_spec_seq *q = open_seq(&kind);
	struct loom_sampler *smp = loom_sampler_new(&sp, V, NULL, 0);
	int32_t tok[8];

	/* argmax is 2, a root child whose child is 2 again: two drafts, then
	 * the correction 2 from the leaf's row */
	ck_assert_int_eq(step(q, smp, true, tok), 2);
	ck_assert_int_eq(tok[0], 2);
	ck_assert_int_eq(tok[1], 2);
	ck_assert_int_eq(tok[2], 2);
	loom_sampler_free(smp);
	loom_spec_seq_free(q);
	loom_spec_kind_free(kind);
}
END_TEST

/*
 * A grammar's view of the tree, as the scheduler gives it: a toy grammar
 * on the last token of a node's path refuses token 3 after the history
 * (token 5) and token 4 after token 2. The host prunes the refused root
 * child 3 with its child (loom_spec_seq_prune_tree), and masks every row
 * after its own path's state before acceptance. Each emitted token must
 * then be distributed as p masked by the state it follows: the first as
 * p without 3, the second after a 2 as p without 4, after a 4 as p.
 */
static bool refused(int32_t state, int32_t t)
{
	return (state == 5 && t == 3) || (state == 2 && t == 4);
}

static int32_t step_masked(struct loom_spec_seq *q, struct loom_sampler *smp, int32_t *tok)
{
	int32_t hist[32] = { 5 }, out[16], parent[17], kt[16], kp[17], row[17], path[16];
	int32_t last[17], next, k, n = 0;
	float rows[17 * V];
	char err[256];

	k = loom_spec_seq_propose(q, NULL, hist, 1, 16, out, parent, err, sizeof(err));
	ck_assert_int_eq(k, 6);
	/* prune: a node goes when its parent went or its token is refused */
	row[0] = 0;
	last[0] = 5;
	kp[0] = -1;
	for (int32_t i = 1; i <= k; i++) {
		int32_t pr = row[parent[i]];

		row[i] = pr >= 0 && !refused(last[pr], out[i - 1]) ? ++n : -1;
		if (row[i] < 0)
			continue;
		kt[n - 1] = out[i - 1];
		kp[n] = pr;
		last[n] = out[i - 1];
	}
	ck_assert_int_eq(n, 4); /* 3 and its child pruned */
	loom_spec_seq_prune_tree(q, n, kt, kp);
	ck_assert(loom_spec_seq_is_tree(q));
	for (int32_t r = 0; r <= n; r++) {
		memcpy(rows + r * V, logits, sizeof(logits));
		for (int32_t t = 0; t < V; t++)
			if (refused(last[r], t))
				rows[r * V + t] = -INFINITY;
	}
	memcpy(hist + 1, kt, sizeof(int32_t) * (size_t)n);
	n = loom_spec_seq_accept_tree(q, smp, false, rows, hist, 1, n, path, &next);
	for (int32_t d = 0; d < n; d++)
		tok[d] = hist[1 + d];
	ck_assert_int_ge(next, 0);
	tok[n] = next;
	return n;
}

/* p without token `drop` (-1: none), renormalized. */
static void masked_p(int32_t drop, double *p)
{
	double sum = 0;

	for (int i = 0; i < V; i++)
		sum += p[i] = i == drop ? 0.0 : exp((double)logits[i]);
	for (int i = 0; i < V; i++)
		p[i] /= sum;
}

START_TEST(pruned_masked_tree_keeps_the_masked_distribution)
{
	struct loom_sampler_params sp = { .temp = 1.0f, .top_p = 1.0f, .repeat_penalty = 1.0f,
		.seed = 99 };
	struct loom_spec_kind *kind;
	struct loom_spec_seq *q = open_seq(&kind);
	struct loom_sampler *smp = loom_sampler_new(&sp, V, NULL, 0);
	long first[V] = { 0 }, after2[V] = { 0 }, after4[V] = { 0 }, accepted = 0;
	double p[V];
	int32_t tok[8];

	ck_assert_ptr_nonnull(smp);
	for (int t = 0; t < N; t++) {
		int32_t n = step_masked(q, smp, tok);

		accepted += n;
		first[tok[0]]++;
		if (tok[0] == 2)
			after2[tok[1]]++;
		else if (tok[0] == 4)
			after4[tok[1]]++;
	}
	ck_assert_msg(accepted > N / 2, "only %ld drafts accepted in %d steps", accepted, N);
	masked_p(3, p);
	expect_fit(first, p, "first token (3 masked)");
	masked_p(4, p);
	expect_fit(after2, p, "token after 2 (4 masked)");
	masked_p(-1, p);
	expect_fit(after4, p, "token after 4");
	loom_sampler_free(smp);
	loom_spec_seq_free(q);
	loom_spec_kind_free(kind);
}
END_TEST

int main(int argc, char **argv)
{
	Suite *s = suite_create("tree_accept");
	TCase *tc = tcase_create("rule");
	SRunner *sr;
	int failed;

	if (argc < 2) {
		fprintf(stderr, "usage: %s TREE_SO\n", argv[0]);
		return 2;
	}
	tree_so = argv[1];
	tcase_add_test(tc, sampled_tokens_keep_the_distribution);
	tcase_add_test(tc, greedy_walk_follows_the_argmax);
	tcase_add_test(tc, pruned_masked_tree_keeps_the_masked_distribution);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
