/*
 * The engine after a backend failure, through the public API: for each
 * fault (faultshim.so failing one call of the load or of a step), either
 * loom_engine_open fails with a message, or every submitted request gets
 * exactly one final event (ERROR with a message for those the failed step
 * hit), the KV manager gets every block back (blocks_used 0 once nothing
 * runs), and a request submitted afterwards completes normally.
 *
 * Usage: test_fault_engine FAULTSHIM_SO (LOOM_MODEL, LOOM_FAULT_TARGET set)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom.h"

#define N_REQ 3

struct ends {
	int finals, errors, tokens;
	char why[256];
};

static void on_event(void *user, const struct loom_event *ev)
{
	struct ends *e = user;

	if (ev->token >= 0)
		e->tokens++;
	if (ev->finish == LOOM_FINISH_NONE)
		return;
	e->finals++;
	if (ev->finish == LOOM_FINISH_ERROR) {
		e->errors++;
		snprintf(e->why, sizeof(e->why), "%s", ev->error ? ev->error : "");
	}
}

static int submit(struct loom_engine *eng, const int32_t *prompt, int n, struct ends *e)
{
	struct loom_request r;
	uint64_t id;
	char err[256];

	loom_request_init(&r);
	r.prompt = prompt;
	r.n_prompt = n;
	r.n_predict = 3;
	r.sampling.temp = 0.0f;
	r.ignore_eog = true;
	r.on_event = on_event;
	r.user = e;
	return loom_submit(eng, &r, &id, err, sizeof(err));
}

/* Steps until idle (bounded); returns the number of failed steps. */
static int drain(struct loom_engine *eng)
{
	int failed = 0;

	for (int i = 0; i < 1000; i++) {
		int rc = loom_engine_step(eng);

		if (rc == 0)
			break;
		failed += rc < 0;
	}
	return failed;
}

/* One fault case; returns 0 if every rule held. */
static int one_case(const char *shim, const char *model, const char *what)
{
	static const int32_t prompts[N_REQ][6] = {
		{ 1, 504, 3125, 314, 4701, 30 }, { 1, 2779, 28, 1351 }, { 1, 378, 1345, 2329, 314 },
	};
	static const int lens[N_REQ] = { 6, 4, 5 };
	struct loom_engine_params p;
	struct loom_engine_stats st;
	struct ends e[N_REQ], after;
	struct loom_engine *eng;
	char err[512] = "";
	int bad = 0, failed;

	loom_engine_params_init(&p);
	p.model = model;
	p.backend = shim;
	p.n_ctx = 128;
	p.n_parallel = N_REQ;
	p.n_threads = 1;
	eng = loom_engine_open(&p, err, sizeof(err));
	if (!eng) {
		if (!err[0]) {
			printf("FAIL %s: open failed without a message\n", what);
			return 1;
		}
		printf("%s: open failed: %s\n", what, err);
		return 0;
	}
	memset(e, 0, sizeof(e));
	for (int i = 0; i < N_REQ; i++)
		if (submit(eng, prompts[i], lens[i], &e[i]))
			bad++;
	failed = drain(eng);
	for (int i = 0; i < N_REQ; i++) {
		if (e[i].finals != 1) {
			printf("FAIL %s: request %d got %d final events\n", what, i, e[i].finals);
			bad++;
		}
		if (e[i].errors && !e[i].why[0]) {
			printf("FAIL %s: request %d failed without a message\n", what, i);
			bad++;
		}
	}
	loom_engine_get_stats(eng, &st);
	if (st.running || st.waiting || st.blocks_used || st.local_blocks_used) {
		printf("FAIL %s: after the requests ended: %d running, %d waiting, %lld blocks held\n",
		       what, st.running, st.waiting, (long long)(st.blocks_used + st.local_blocks_used));
		bad++;
	}
	/* the fault was one call: the engine serves the next request */
	memset(&after, 0, sizeof(after));
	if (submit(eng, prompts[0], lens[0], &after) || drain(eng) || after.finals != 1 ||
	    after.errors || after.tokens != 3) {
		printf("FAIL %s: a request after the fault: %d finals, %d errors, %d tokens\n",
		       what, after.finals, after.errors, after.tokens);
		bad++;
	}
	printf("%s: %d failed step(s), %d of %d requests ended in error%s%s\n", what, failed,
	       e[0].errors + e[1].errors + e[2].errors, N_REQ, failed ? ": " : "",
	       failed ? e[0].why[0] ? e[0].why : e[1].why[0] ? e[1].why : e[2].why : "");
	loom_engine_close(eng);
	return bad;
}

int main(int argc, char **argv)
{
	static const char *const slots[] = { "gemm", "attention", "kv_write", "download",
					     "embed", "rope", "glu", "rmsnorm", "add", "copy" };
	const char *model = getenv("LOOM_MODEL");
	char what[64], n[32];
	int bad = 0, cases = 0;

	if (argc < 2 || !model || access(model, R_OK)) {
		printf("skip: LOOM_MODEL not found\n");
		return 77;
	}
	for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++, cases++) {
		setenv("LOOM_FAULT_SLOT", slots[i], 1);
		snprintf(what, sizeof(what), "slot %s", slots[i]);
		bad += one_case(argv[1], model, what) != 0;
	}
	unsetenv("LOOM_FAULT_SLOT");
	/* call numbers into the load, the prefill step and the decode steps */
	for (long at = 1; at <= 1400; at = at < 8 ? at + 3 : at * 3 / 2, cases++) {
		snprintf(n, sizeof(n), "%ld", at);
		setenv("LOOM_FAULT_AT", n, 1);
		snprintf(what, sizeof(what), "call %ld", at);
		bad += one_case(argv[1], model, what) != 0;
	}
	printf("%d engine fault cases, %d failed\n", cases, bad);
	return bad ? 1 : 0;
}
