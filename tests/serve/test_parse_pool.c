/* test_parse_pool.c: server/serve_parse.c, the parse stage's queue.
 *
 * One worker, held inside a gate item until everything is queued: client A
 * queues five items, then B one, then C one. Round robin runs A, B, C,
 * then A's other four, whatever A queued first; every item runs once and
 * its done() follows its run(). A stopped pool refuses new items. */
#include <check.h>
#include <pthread.h>
#include <string.h>

#include "serve_parse.h"

struct rec {
	struct parse_item it;
	char name[8];
	bool ran, done_after_run;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool released, gate_in;
static char order[64];
static int n_done;

static void rec_run(struct parse_item *it)
{
	struct rec *r = (struct rec *)it;

	pthread_mutex_lock(&mu);
	gate_in = true;
	pthread_cond_broadcast(&cv);
	while (!released)
		pthread_cond_wait(&cv, &mu);
	strcat(order, r->name);
	strcat(order, " ");
	r->ran = true;
	pthread_mutex_unlock(&mu);
}

static void rec_done(struct parse_item *it)
{
	struct rec *r = (struct rec *)it;

	pthread_mutex_lock(&mu);
	r->done_after_run = r->ran;
	n_done++;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void rec_init(struct rec *r, const char *client, const char *name)
{
	memset(r, 0, sizeof(*r));
	r->it.key_len = strlen(client);
	memcpy(r->it.key, client, r->it.key_len);
	r->it.run = rec_run;
	r->it.done = rec_done;
	strcpy(r->name, name);
}

START_TEST(test_round_robin)
{
	struct parse_pool *p = parse_pool_start(1);
	static const char *const names[] = { "a0", "a1", "a2", "a3", "a4", "b0", "c0" };
	struct rec gate, recs[7], late;

	ck_assert_ptr_nonnull(p);
	rec_init(&gate, "Z", "z");
	ck_assert_int_eq(parse_pool_submit(p, &gate.it), 0);
	pthread_mutex_lock(&mu);
	while (!gate_in) /* the worker is busy with the gate */
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < 7; i++) {
		rec_init(&recs[i], names[i][0] == 'a' ? "A" : names[i][0] == 'b' ? "B" : "C",
			 names[i]);
		ck_assert_int_eq(parse_pool_submit(p, &recs[i].it), 0);
	}
	pthread_mutex_lock(&mu);
	released = true;
	pthread_cond_broadcast(&cv);
	while (n_done < 8)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	ck_assert_str_eq(order, "z a0 b0 c0 a1 a2 a3 a4 ");
	for (int i = 0; i < 7; i++)
		ck_assert(recs[i].done_after_run);
	parse_pool_stop(p);
	rec_init(&late, "A", "late");
	ck_assert_int_eq(parse_pool_submit(p, &late.it), -1);
	parse_pool_free(p);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("parse_pool");
	TCase *tc = tcase_create("queue");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_round_robin);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
