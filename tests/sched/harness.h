/* Shared by the scheduler tests: collecting a request's events, submitting
 * jobs, stepping until idle, comparing with a request run alone. */
#ifndef LOOM_TEST_SCHED_HARNESS_H
#define LOOM_TEST_SCHED_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/scheduler.h"

#define MAX_GEN 160
#define HARNESS_TOP 6

/* Everything one request reported. */
struct col {
	int32_t toks[MAX_GEN];
	/* with logprobs: each token's, and its first HARNESS_TOP top ones */
	float lp[MAX_GEN];
	struct loom_token_logprob top[MAX_GEN][HARNESS_TOP];
	int n, n_final;
	enum loom_finish fin;
	int32_t n_cached;
	uint64_t id;
};

struct job {
	int32_t prompt[512];
	int n_prompt, n_predict;
	struct loom_sampler_params sp;
	struct loom_spec_kind *spec; /* used when submitted with spec = true */
	const struct loom_grammar *grammar; /* optional: constrains the output */
	bool logprobs;        /* ask for logprobs (and top_logprobs of them) */
	int32_t top_logprobs;
	struct col c;
};

/* The loom_sched_cb for a struct col; asserts the event protocol. */
void collect(void *user, const struct loom_event *ev);
/* Submits j (with its strategy when spec), resetting j->c; asserts success. */
void submit(struct loom_sched *s, struct job *j, bool spec);
/* Steps until nothing runs or waits. */
void drain(struct loom_sched *s);
/* Request i's tokens and finish equal those it got alone. */
void assert_same(const struct col *got, const struct col *want, int i);

/* The oracle: a request run alone is deterministic, so its result is kept
 * and reused by later tests that hold the same request to it. alone_find
 * gives j's result alone (prompt, sampling and n_predict as in j) when a
 * kept run fixes it, else false; alone_keep keeps j->c, j's result alone;
 * alone_forget drops them all (before the model goes). */
bool alone_find(const struct job *j, struct col *out);
void alone_keep(const struct job *j);
void alone_forget(void);

#endif
