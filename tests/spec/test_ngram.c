/*
 * ngram.so's lookup, through the host's per-sequence API with no model:
 * the continuation most earlier occurrences agree on wins (a tie goes to
 * the most recent), ended requests are looked up too (a store of bounded
 * size, least recently used out first), and a suffix length whose
 * proposals keep failing sits out and is probed again later; a copy that
 * substituted a few tokens goes on drafting from where it stood in the
 * source (the copy cursor), not from the majority's place. With trees
 * on, the continuations of every occurrence come as one tree, heaviest
 * first, and its width follows what side branches win.
 *
 * The store is one per process, so the cases run in order in one process
 * (CK_NOFORK) and use disjoint token ranges.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/spec.h"

#define N_VOCAB 300
#define STORE_SEQS 64 /* ngram.c's bound on stored requests */

static struct loom_spec_kind *kind;

static struct loom_spec_seq *seq_open(void)
{
	char err[512];
	struct loom_spec_seq *q = loom_spec_seq_new(kind, 8, 1, NULL, err, sizeof(err));

	ck_assert_msg(q != NULL, "%s", err);
	return q;
}

static int32_t propose(struct loom_spec_seq *q, const int32_t *h, int64_t n, int32_t *out)
{
	char err[512];
	int32_t k = loom_spec_seq_propose(q, NULL, h, n, 8, out, NULL, err, sizeof(err));

	ck_assert_msg(k >= 0, "%s", err);
	return k;
}

/* Drafts for h from a fresh context (which is then stored, if long). */
static int32_t propose_once(const int32_t *h, int64_t n, int32_t *out)
{
	struct loom_spec_seq *q = seq_open();
	int32_t k = propose(q, h, n, out);

	loom_spec_seq_free(q);
	return k;
}

START_TEST(majority_wins)
{
	/* "9 1 2 3" is followed by 50 51 twice and by 60 61 once (the most
	 * recent): prompt lookup alone would draft 60 */
	static const int32_t h[] = { 9, 1, 2, 3, 50, 51, 9, 1, 2, 3, 50, 51,
				     9, 1, 2, 3, 60, 61, 9, 1, 2, 3 };
	int32_t out[8];
	int32_t k = propose_once(h, sizeof(h) / sizeof(h[0]), out);

	ck_assert_int_ge(k, 3);
	ck_assert_int_eq(out[0], 50);
	ck_assert_int_eq(out[1], 51);
	ck_assert_int_eq(out[2], 9);
}
END_TEST

START_TEST(tie_goes_to_the_most_recent)
{
	static const int32_t h[] = { 8, 4, 5, 6, 70, 8, 4, 5, 6, 80, 8, 4, 5, 6 };
	int32_t out[8];

	ck_assert_int_ge(propose_once(h, sizeof(h) / sizeof(h[0]), out), 1);
	ck_assert_int_eq(out[0], 80);
}
END_TEST

START_TEST(store_of_ended_requests)
{
	int32_t first[40], probe[] = { 7, 11, 120, 121, 122 }, other[20], out[8];

	for (int i = 0; i < 40; i++)
		first[i] = 100 + i;
	/* no request has seen 120 121 122 yet: nothing to draft */
	ck_assert_int_eq(propose_once(probe, 5, out), 0);
	propose_once(first, 40, out); /* ends: its tokens go to the store */
	ck_assert_int_eq(propose_once(probe, 5, out), 8);
	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(out[i], 123 + i);
	/* STORE_SEQS other requests push it out (each distinct, 200..299) */
	for (int r = 0; r < STORE_SEQS; r++) {
		other[0] = 200 + r;
		for (int i = 1; i < 20; i++)
			other[i] = 270 + i;
		propose_once(other, 20, out);
	}
	ck_assert_int_eq(propose_once(probe, 5, out), 0);
}
END_TEST

START_TEST(failing_length_sits_out)
{
	/* a period-3 pattern in tokens 30..32: always a match of length 4 */
	int32_t h[24], out[8], zeros = 0, longest = 0, probed_after = 0;
	struct loom_spec_seq *q = seq_open();

	for (int i = 0; i < 24; i++)
		h[i] = 30 + i % 3;
	for (int step = 0; step < 60; step++) {
		int32_t k = propose(q, h, 24, out);

		if (k == 0) {
			zeros++;
			longest = zeros > longest ? zeros : longest;
			continue;
		}
		if (longest >= 10)
			probed_after++;
		zeros = 0;
		/* every draft rejected: the target's token is some other one */
		loom_spec_seq_settle(q, true, k, 0, (const int32_t[]){ 40 });
	}
	loom_spec_seq_free(q);
	ck_assert_msg(longest >= 10, "rejected proposals never stopped (longest pause %d)", longest);
	ck_assert_msg(probed_after > 0, "no probe after the pause");
}
END_TEST

START_TEST(copy_cursor_keeps_its_place)
{
	/* a source with the "comma" 200 twice; the copy substitutes two
	 * tokens (14 15 -> 90 91) and goes on at the second comma: the
	 * drafts after it follow the source there (16 17 18), not the first
	 * comma's continuation, which the majority (the source and the copy
	 * both have "200 13") would pick */
	int32_t h[32] = { 10, 11, 12, 200, 13, 14, 15, 200, 16, 17, 18, 10, 11, 12 };
	int32_t out[8], k;
	struct loom_spec_seq *q = seq_open();

	k = propose(q, h, 14, out); /* "10 11 12" -> 200 13 14 15 ... */
	ck_assert_int_ge(k, 3);
	ck_assert_int_eq(out[0], 200);
	ck_assert_int_eq(out[1], 13);
	/* 200 and 13 accepted, the target says 90 where the source has 14 */
	loom_spec_seq_settle(q, true, k, 2, (const int32_t[]){ 200, 13, 90 });
	h[14] = 200, h[15] = 13, h[16] = 90, h[17] = 91, h[18] = 200;
	k = propose(q, h, 19, out);
	ck_assert_int_ge(k, 3);
	ck_assert_msg(out[0] == 16 && out[1] == 17 && out[2] == 18,
		      "drafts %d %d %d: not the source after the second comma", out[0], out[1],
		      out[2]);
	loom_spec_seq_free(q);
}
END_TEST

/* Trees: "9 1 2 3" is followed by 50 51 three times and by 60 61 twice;
 * the tree holds the 50 51 path first (rows 1, 2 under the last token,
 * row 0) and the 60 61 branch beside it (two occurrences: enough for a
 * side branch), siblings distinct. */
/* ngram.so with trees of up to 16 nodes, and one sequence of it (draft
 * length 8). */
static struct loom_spec_seq *tree_seq(struct loom_spec_kind **tk)
{
	struct loom_spec_config c;
	struct loom_spec_seq *q;
	char err[512];

	loom_spec_config_defaults(&c);
	c.max_tree = 16;
	*tk = loom_spec_kind_load("ngram", &c, N_VOCAB, NULL, err, sizeof(err));
	ck_assert_msg(*tk != NULL, "%s", err);
	q = loom_spec_seq_new(*tk, 8, 1, NULL, err, sizeof(err));
	ck_assert_msg(q != NULL, "%s", err);
	return q;
}

START_TEST(tree_of_continuations)
{
	static const int32_t h[] = { 9, 1, 2, 3, 50, 51, 9, 1, 2, 3, 60, 61, 9, 1, 2, 3, 50, 51,
				     9, 1, 2, 3, 60, 61, 9, 1, 2, 3, 50, 51, 9, 1, 2, 3 };
	struct loom_spec_kind *tk;
	struct loom_spec_seq *q;
	int32_t out[16], parent[17], k, r60 = -1;
	char err[512];

	q = tree_seq(&tk);
	k = loom_spec_seq_propose(q, NULL, h, sizeof(h) / sizeof(h[0]), 16, out, parent, err,
				  sizeof(err));
	ck_assert_int_ge(k, 4);
	ck_assert(loom_spec_seq_is_tree(q));
	ck_assert_int_eq(parent[0], -1);
	ck_assert_int_eq(out[0], 50);
	ck_assert_int_eq(parent[1], 0);
	ck_assert_int_eq(out[1], 51);
	ck_assert_int_eq(parent[2], 1);
	for (int32_t i = 0; i < k; i++)
		if (out[i] == 60 && parent[i + 1] == 0)
			r60 = i + 1;
	ck_assert_msg(r60 > 2, "no 60 branch under the last token");
	for (int32_t i = 0; i < k; i++) /* 61 follows 60 on that branch */
		if (parent[i + 1] == r60)
			ck_assert_int_eq(out[i], 61);
	for (int32_t i = 1; i <= k; i++) /* siblings differ */
		for (int32_t j = i + 1; j <= k; j++)
			ck_assert(parent[i] != parent[j] || out[i - 1] != out[j - 1]);
	loom_spec_seq_free(q);
	loom_spec_kind_free(tk);
}
END_TEST

/* A tree proposal's nodes off its majority path: those not on the path
 * of first-listed children from row 0 (heaviest first: the majority
 * child comes first). main[] gets that path's tokens, *n_main its length. */
static int32_t side_nodes(const int32_t *out, const int32_t *parent, int32_t k, int32_t *main,
			  int32_t *n_main)
{
	int32_t row = 0, n = 0;

	for (;;) {
		int32_t child = -1;

		for (int32_t i = 1; i <= k && child < 0; i++)
			if (parent[i] == row)
				child = i;
		if (child < 0)
			break;
		main[n++] = out[child - 1];
		row = child;
	}
	*n_main = n;
	return k - n;
}

/* Tree width: "141 142 143 144" is followed by 145 146 three times and by
 * 147 148 twice. While the target takes only the majority path, side
 * nodes win nothing and the width shrinks until the tree is a chain;
 * WIDTH_PROBE (16) chains later one side node is tried; once the target
 * takes it (a token won by one side node), the width grows to 2. */
START_TEST(tree_width_follows_side_wins)
{
	static const int32_t h[] = { 141, 142, 143, 144, 145, 146, 141, 142, 143, 144, 147, 148,
				     141, 142, 143, 144, 145, 146, 141, 142, 143, 144, 147, 148,
				     141, 142, 143, 144, 145, 146, 141, 142, 143, 144 };
	const int64_t n = sizeof(h) / sizeof(h[0]);
	struct loom_spec_kind *tk;
	struct loom_spec_seq *q;
	int32_t out[16], parent[17], main[17], n_main, k, side = 1, steps = 0, chains = 0;
	int32_t acc[3];
	char err[512];

	q = tree_seq(&tk);
	/* the target follows the majority path two tokens, then 77 */
	for (; side > 0 && steps < 40; steps++) {
		k = loom_spec_seq_propose(q, NULL, h, n, 16, out, parent, err, sizeof(err));
		ck_assert_int_ge(k, 2);
		side = side_nodes(out, parent, k, main, &n_main);
		if (steps == 0)
			ck_assert_msg(side >= 2, "the first tree has %d side nodes", side);
		acc[0] = main[0], acc[1] = main[1], acc[2] = 77;
		loom_spec_seq_settle(q, true, k, 2, acc);
	}
	ck_assert_msg(side == 0, "side nodes that never win still proposed after %d trees", steps);
	/* chains until the probe */
	for (; side == 0 && chains < 40; chains++) {
		k = loom_spec_seq_propose(q, NULL, h, n, 16, out, parent, err, sizeof(err));
		side = side_nodes(out, parent, k, main, &n_main);
		if (side == 0) {
			acc[0] = main[0], acc[1] = main[1], acc[2] = 77;
			loom_spec_seq_settle(q, true, k, 2, acc);
		}
	}
	ck_assert_msg(chains >= 8 && chains <= 20, "one side node tried after %d chains", chains);
	ck_assert_int_eq(side, 1);
	/* the target takes the side node, 147 under the last token, then 77 */
	for (int32_t i = 1; i <= k; i++)
		if (parent[i] == 0 && out[i - 1] != main[0])
			ck_assert_int_eq(out[i - 1], 147);
	acc[0] = 147, acc[1] = 77;
	loom_spec_seq_settle(q, true, k, 1, acc);
	k = loom_spec_seq_propose(q, NULL, h, n, 16, out, parent, err, sizeof(err));
	side = side_nodes(out, parent, k, main, &n_main);
	ck_assert_msg(side == 2, "after a side win the tree has %d side nodes, not 2", side);
	loom_spec_seq_free(q);
	loom_spec_kind_free(tk);
}
END_TEST

static Suite *ngram_suite(void)
{
	Suite *s = suite_create("ngram");
	TCase *tc = tcase_create("lookup");

	tcase_add_test(tc, majority_wins);
	tcase_add_test(tc, tie_goes_to_the_most_recent);
	tcase_add_test(tc, store_of_ended_requests);
	tcase_add_test(tc, failing_length_sits_out);
	tcase_add_test(tc, copy_cursor_keeps_its_place);
	tcase_add_test(tc, tree_of_continuations);
	tcase_add_test(tc, tree_width_follows_side_wins);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	struct loom_spec_config c;
	char err[512];
	SRunner *sr;
	int failed;

	loom_spec_config_defaults(&c);
	kind = loom_spec_kind_load("ngram", &c, N_VOCAB, NULL, err, sizeof(err));
	if (!kind) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	sr = srunner_create(ngram_suite());
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	loom_spec_kind_free(kind);
	return failed ? 1 : 0;
}
