/* How rank 0 cuts a pipelined step into micro-batches (loom_micro_cuts):
 * the default count follows the step's size, the cuts fall between whole
 * sequences and balance tokens, and every cut list is well formed. */
#include <check.h>
#include <stdlib.h>

#include "model/model.h"

#define MAX_SEQS 64

/* q_start of sequences with these token counts. */
static void starts(const int32_t *lens, int32_t n, int32_t *q_start)
{
	q_start[0] = 0;
	for (int32_t i = 0; i < n; i++)
		q_start[i + 1] = q_start[i] + lens[i];
}

/* n sequences of one token each (a decode step). */
static int32_t decode_cuts(int pp, int micro, int32_t n, int32_t *cuts)
{
	int32_t lens[MAX_SEQS], q_start[MAX_SEQS + 1];

	for (int32_t i = 0; i < n; i++)
		lens[i] = 1;
	starts(lens, n, q_start);
	return loom_micro_cuts(pp, micro, q_start, n, cuts);
}

START_TEST(default_count_follows_step_size)
{
	int32_t cuts[MAX_SEQS + 1];

	/* 2 stages: N = sqrt(R / 2), so 1 below 8 tokens, 2 from 8, 4 from 32 */
	ck_assert_int_eq(decode_cuts(2, 0, 2, cuts), 1);
	ck_assert_int_eq(decode_cuts(2, 0, 7, cuts), 1);
	ck_assert_int_eq(decode_cuts(2, 0, 8, cuts), 2);
	ck_assert_int_eq(cuts[0], 0);
	ck_assert_int_eq(cuts[1], 4);
	ck_assert_int_eq(cuts[2], 8);
	ck_assert_int_eq(decode_cuts(2, 0, 31, cuts), 3);
	ck_assert_int_eq(decode_cuts(2, 0, 32, cuts), 4);
	ck_assert_int_eq(cuts[1], 8);
	ck_assert_int_eq(cuts[2], 16);
	ck_assert_int_eq(cuts[3], 24);
	/* 4 stages: N = sqrt(3 R / 2): 3 from 6 tokens */
	ck_assert_int_eq(decode_cuts(4, 0, 6, cuts), 3);
	/* one stage, or one sequence: whole */
	ck_assert_int_eq(decode_cuts(1, 0, 32, cuts), 1);
	ck_assert_int_eq(decode_cuts(2, 4, 1, cuts), 1);
	ck_assert_int_eq(cuts[1], 1);
}
END_TEST

START_TEST(given_count_is_kept_up_to_the_sequences)
{
	int32_t cuts[MAX_SEQS + 1];

	ck_assert_int_eq(decode_cuts(2, 2, 2, cuts), 2);
	ck_assert_int_eq(decode_cuts(2, 1, 40, cuts), 1);
	ck_assert_int_eq(cuts[1], 40);
	ck_assert_int_eq(decode_cuts(2, 8, 3, cuts), 3);
	ck_assert_int_eq(cuts[1], 1);
	ck_assert_int_eq(cuts[2], 2);
	ck_assert_int_eq(cuts[3], 3);
}
END_TEST

START_TEST(cuts_balance_tokens_between_sequences)
{
	/* a 200-token prompt chunk and seven decodes */
	int32_t lens[] = { 200, 1, 1, 1, 1, 1, 1, 1 }, q_start[9], cuts[9];

	starts(lens, 8, q_start);
	ck_assert_int_eq(loom_micro_cuts(2, 2, q_start, 8, cuts), 2);
	ck_assert_int_eq(cuts[1], 1); /* the chunk, then the decodes */
	/* the chunk last: everything before it in one micro-batch */
	int32_t late[] = { 1, 1, 1, 1, 1, 1, 1, 200 };

	starts(late, 8, q_start);
	ck_assert_int_eq(loom_micro_cuts(2, 2, q_start, 8, cuts), 2);
	ck_assert_int_eq(cuts[1], 7);
	/* six decodes in four: no micro-batch empty */
	int32_t six[] = { 1, 1, 1, 1, 1, 1 };

	starts(six, 6, q_start);
	ck_assert_int_eq(loom_micro_cuts(2, 4, q_start, 6, cuts), 4);
	ck_assert_int_eq(cuts[1], 2);
	ck_assert_int_eq(cuts[2], 3);
	ck_assert_int_eq(cuts[3], 5);
	ck_assert_int_eq(cuts[4], 6);
}
END_TEST

START_TEST(random_steps_give_well_formed_cuts)
{
	int32_t lens[MAX_SEQS], q_start[MAX_SEQS + 1], cuts[MAX_SEQS + 1];

	srand(17);
	for (int trial = 0; trial < 2000; trial++) {
		int32_t n = 1 + rand() % MAX_SEQS, m;
		int pp = 1 + rand() % 4, micro = rand() % 10;

		for (int32_t i = 0; i < n; i++)
			lens[i] = rand() % 3 ? 1 : 1 + rand() % 300;
		starts(lens, n, q_start);
		m = loom_micro_cuts(pp, micro, q_start, n, cuts);
		ck_assert(m >= 1 && m <= n);
		ck_assert(micro == 0 || m == (micro < n ? micro : n) || pp == 1 || n == 1);
		ck_assert_int_eq(cuts[0], 0);
		ck_assert_int_eq(cuts[m], n);
		for (int32_t k = 0; k < m; k++)
			ck_assert(cuts[k] < cuts[k + 1]);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("dist_cuts");
	TCase *tc = tcase_create("cuts");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, default_count_follows_step_size);
	tcase_add_test(tc, given_count_is_kept_up_to_the_sequences);
	tcase_add_test(tc, cuts_balance_tokens_between_sequences);
	tcase_add_test(tc, random_steps_give_well_formed_cuts);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
