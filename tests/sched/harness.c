#include "harness.h"

#include <check.h>
#include <string.h>

void collect(void *user, const struct loom_event *ev)
{
	struct col *c = user;

	ck_assert_uint_eq(ev->id, c->id);
	ck_assert_int_eq(c->n_final, 0); /* nothing after the final event */
	if (ev->token >= 0) {
		ck_assert_int_lt(c->n, MAX_GEN);
		c->toks[c->n++] = ev->token;
		ck_assert_int_eq(ev->n_generated, c->n);
	}
	c->n_cached = ev->n_cached;
	if (ev->finish != LOOM_FINISH_NONE) {
		c->fin = ev->finish;
		c->n_final++;
	}
}

void submit(struct loom_sched *s, struct job *j, bool spec)
{
	struct loom_sched_request rq = { .prompt = j->prompt, .n_prompt = j->n_prompt,
		.n_predict = j->n_predict, .sampling = j->sp, .cb = collect, .user = &j->c,
		.spec = spec ? j->spec : NULL };
	char err[512];

	memset(&j->c, 0, sizeof(j->c));
	ck_assert_msg(loom_sched_submit(s, &rq, &j->c.id, err, sizeof(err)) == 0, "%s", err);
}

void drain(struct loom_sched *s)
{
	struct loom_sched_stats st;
	int guard = 0;

	do {
		ck_assert_int_ge(loom_sched_step(s), 0);
		loom_sched_get_stats(s, &st);
		ck_assert_int_lt(++guard, 100000);
	} while (st.running + st.waiting > 0);
}

void assert_same(const struct col *got, const struct col *want, int i)
{
	ck_assert_int_eq(got->n_final, 1);
	ck_assert_msg(got->fin == want->fin, "request %d: finish %d, alone %d", i, got->fin,
		      want->fin);
	ck_assert_msg(got->n == want->n, "request %d: %d tokens, alone %d", i, got->n, want->n);
	for (int k = 0; k < got->n; k++)
		ck_assert_msg(got->toks[k] == want->toks[k],
			      "request %d token %d: %d, alone %d", i, k, got->toks[k],
			      want->toks[k]);
}
