#include "harness.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

void collect(void *user, const struct loom_event *ev)
{
	struct col *c = user;

	ck_assert_uint_eq(ev->id, c->id);
	ck_assert_int_eq(c->n_final, 0); /* nothing after the final event */
	if (ev->token >= 0) {
		ck_assert_int_lt(c->n, MAX_GEN);
		c->lp[c->n] = ev->logprob;
		for (int32_t j = 0; j < ev->n_top && j < HARNESS_TOP; j++)
			c->top[c->n][j] = ev->top[j];
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
		.spec = spec ? j->spec : NULL, .grammar = j->grammar,
		.logprobs = j->logprobs, .top_logprobs = j->top_logprobs };
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

static struct job *kept;
static int n_kept;

static bool same_sampling(const struct loom_sampler_params *a,
			  const struct loom_sampler_params *b)
{
	return a->temp == b->temp && a->top_k == b->top_k && a->top_p == b->top_p &&
	       a->min_p == b->min_p && a->repeat_penalty == b->repeat_penalty &&
	       a->presence_penalty == b->presence_penalty &&
	       a->frequency_penalty == b->frequency_penalty &&
	       a->penalty_last_n == b->penalty_last_n && a->seed == b->seed;
}

/* A run of the same request with a budget of at least n_predict fixes the
 * run with n_predict when it went past n_predict tokens (the first
 * n_predict of them, finishing on length) or met its end-of-generation
 * token before n_predict. An end at exactly n_predict is left to a fresh
 * run (the shorter one would stop on length there). */
static bool derive(const struct job *k, const struct job *j, struct col *out)
{
	const struct col *c = &k->c;

	if (k->n_prompt != j->n_prompt || k->n_predict < j->n_predict ||
	    memcmp(k->prompt, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt) != 0 ||
	    !same_sampling(&k->sp, &j->sp) || k->grammar != j->grammar)
		return false;
	if (k->n_predict == j->n_predict) {
		*out = *c;
		return true;
	}
	if (c->n > j->n_predict) {
		*out = *c;
		out->n = j->n_predict;
		out->fin = LOOM_FINISH_LENGTH;
		return true;
	}
	if (c->n < j->n_predict && c->fin == LOOM_FINISH_EOG) {
		*out = *c;
		return true;
	}
	return false;
}

bool alone_find(const struct job *j, struct col *out)
{
	for (int i = 0; i < n_kept; i++)
		if (derive(&kept[i], j, out))
			return true;
	return false;
}

void alone_keep(const struct job *j)
{
	struct job *grown = realloc(kept, sizeof(*kept) * (size_t)(n_kept + 1));

	ck_assert_ptr_nonnull(grown);
	kept = grown;
	kept[n_kept++] = *j;
}

void alone_forget(void)
{
	free(kept);
	kept = NULL;
	n_kept = 0;
}
