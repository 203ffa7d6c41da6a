/* test_parse_pool.c: server/serve_parse.c, the parse stage's queue.
 *
 * One worker, held inside a gate item until everything is queued: client A
 * queues five items, then B one, then C one. Round robin runs A, B, C,
 * then A's other four, whatever A queued first; every item runs once and
 * its done() follows its run(). A stopped pool refuses new items.
 *
 * Caps: with 100 bytes a client and 250 in all, what would pass either is
 * refused (PARSE_FULL) and nothing of it queued; an empty queue takes one
 * item of any size; bytes taken by the worker count no more.
 *
 * Keys: two IPv6 addresses in one /64 share a key, another /64 does not;
 * ::ffff:10.0.0.1 has the key of 10.0.0.1. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
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

static void hold_gate(struct parse_pool *p, struct rec *gate)
{
	pthread_mutex_lock(&mu);
	released = gate_in = false;
	n_done = 0;
	order[0] = 0;
	pthread_mutex_unlock(&mu);
	rec_init(gate, "Z", "z");
	ck_assert_int_eq(parse_pool_submit(p, &gate->it), PARSE_QUEUED_OK);
	pthread_mutex_lock(&mu);
	while (!gate_in)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

static void release_all(int n)
{
	pthread_mutex_lock(&mu);
	released = true;
	pthread_cond_broadcast(&cv);
	while (n_done < n)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

static int submit(struct parse_pool *p, struct rec *r, const char *client, size_t bytes)
{
	rec_init(r, client, client);
	r->it.bytes = bytes;
	return parse_pool_submit(p, &r->it);
}

START_TEST(test_caps)
{
	struct parse_pool *p = parse_pool_start(1);
	struct rec gate, r[8];

	ck_assert_ptr_nonnull(p);
	parse_pool_set_caps(p, 100, 250);
	hold_gate(p, &gate);
	ck_assert_int_eq(submit(p, &r[0], "A", 60), PARSE_QUEUED_OK);
	ck_assert_int_eq(submit(p, &r[1], "A", 50), PARSE_FULL); /* A: 110 > 100 */
	ck_assert_int_eq(submit(p, &r[2], "A", 40), PARSE_QUEUED_OK); /* A: 100 */
	ck_assert_int_eq(submit(p, &r[3], "B", 100), PARSE_QUEUED_OK);
	ck_assert_int_eq(submit(p, &r[4], "C", 100), PARSE_FULL); /* all: 300 > 250 */
	ck_assert_int_eq(submit(p, &r[5], "C", 50), PARSE_QUEUED_OK); /* all: 250 */
	ck_assert_int_eq(submit(p, &r[6], "D", 1), PARSE_FULL);
	release_all(5);
	ck_assert_str_eq(order, "z A B C A ");
	/* drained: an empty queue takes one item over both caps */
	hold_gate(p, &gate);
	ck_assert_int_eq(submit(p, &r[0], "A", 1000), PARSE_QUEUED_OK);
	ck_assert_int_eq(submit(p, &r[1], "B", 1), PARSE_FULL);
	release_all(2);
	parse_pool_free(p);
}
END_TEST

static struct parse_item key_of(const char *addr)
{
	struct sockaddr_in v4 = { .sin_family = AF_INET };
	struct sockaddr_in6 v6 = { .sin6_family = AF_INET6 };
	struct parse_item it;

	memset(&it, 0, sizeof(it));
	if (inet_pton(AF_INET, addr, &v4.sin_addr) == 1)
		parse_key_from_addr(&it, (struct sockaddr *)&v4);
	else if (inet_pton(AF_INET6, addr, &v6.sin6_addr) == 1)
		parse_key_from_addr(&it, (struct sockaddr *)&v6);
	else
		ck_abort_msg("bad address %s", addr);
	return it;
}

static bool same_key(const char *a, const char *b)
{
	struct parse_item x = key_of(a), y = key_of(b);

	return x.key_len == y.key_len && !memcmp(x.key, y.key, x.key_len);
}

START_TEST(test_keys)
{
	ck_assert(same_key("2001:db8:1:2::1", "2001:db8:1:2:ffff:1234:5678:9abc"));
	ck_assert(!same_key("2001:db8:1:2::1", "2001:db8:1:3::1"));
	ck_assert(same_key("::ffff:10.0.0.1", "10.0.0.1"));
	ck_assert(!same_key("::ffff:10.0.0.1", "10.0.0.2"));
	ck_assert(!same_key("10.0.0.1", "10.0.0.2"));
	ck_assert_int_eq(key_of("2001:db8::1").key_len, 8);
	ck_assert_int_eq(key_of("::ffff:10.0.0.1").key_len, 4);
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
	tcase_add_test(tc, test_caps);
	tcase_add_test(tc, test_keys);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
