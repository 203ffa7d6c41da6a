/*
 * loom_check_backend (loom.h): the conformance suite of core/check/ run on
 * one backend against the reference, in a child process, as `loom
 * check-backend` does.
 *
 * The child runs, in order: every op and format against the reference
 * (conformance.c), in exact mode (LOOM_BACKEND_EXACT, the tolerances of
 * conformance.c) and then in the backend's default mode, which may be a
 * fast mode (reported as "<name> fast", gemm of quantized weights judged
 * with the fast-mode tolerance); the invalid-argument contracts (invalid.c), batch
 * invariance with LOOM_BACKEND_BATCH_INVARIANT | LOOM_BACKEND_EXACT
 * (invariance.c), and with a model, greedy generation in exact mode on
 * both, compared token for token. Then the table (tb.c). The watchdog
 * (tb_watchdog) turns a hang or a crash into a FAIL line naming the case.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check/tb.h"
#include "loom.h"

#define WATCHDOG_S 300
#define EXIT_NO_LOAD 4 /* the backend or the reference does not load */
#define MAX_TOKENS 1024

void loom_check_params_init(struct loom_check_params *p)
{
	memset(p, 0, sizeof(*p));
	p->struct_size = sizeof(*p);
}

/* ---- end to end: greedy tokens on the backend and on the reference ---- */

struct tokens {
	int32_t id[MAX_TOKENS];
	int n;
};

static int collect(void *user, int32_t token, const char *text, size_t len)
{
	struct tokens *t = user;

	if (t->n < MAX_TOKENS)
		t->id[t->n++] = token;
	return 0;
}

static const char e2e_prompt[] = "The three primary colors are";

static int greedy(const char *backend, const struct loom_check_params *p, int n_threads,
		  struct tokens *t, char *err, size_t errlen)
{
	struct loom_engine_params ep;
	struct loom_generation_params g;
	struct loom_generation_stats st;
	struct loom_engine *e;
	int rc;

	loom_engine_params_init(&ep);
	ep.model = p->model;
	ep.backend = backend;
	ep.n_threads = n_threads;
	ep.n_ctx = 256;
	ep.exact = true;
	e = loom_engine_open(&ep, err, errlen);
	if (!e)
		return -1;
	loom_generation_params_init(&g);
	g.n_predict = p->n_tokens > 0 ? p->n_tokens : 16;
	if (g.n_predict > MAX_TOKENS)
		g.n_predict = MAX_TOKENS;
	g.add_special = true;
	g.temp = 0.0f;
	t->n = 0;
	rc = loom_generate(e, e2e_prompt, strlen(e2e_prompt), &g, collect, t, &st, err, errlen);
	loom_engine_close(e);
	return rc;
}

static void check_e2e(const struct dev *d, const struct loom_check_params *p,
		      const char *reference)
{
	static struct tokens want, got;
	char err[4096], desc[128];

	if (greedy(reference, p, 0, &want, err, sizeof(err))) {
		tb_fail(d, "e2e", "greedy", "the reference %s: %s", reference, err);
		return;
	}
	if (greedy(p->backend, p, p->n_threads, &got, err, sizeof(err))) {
		tb_fail(d, "e2e", "greedy", "%s", err);
		return;
	}
	for (int i = 0; i < want.n || i < got.n; i++) {
		if (i >= want.n || i >= got.n || want.id[i] != got.id[i]) {
			tb_fail(d, "e2e", "greedy", "token %d: %d, the reference has %d", i,
				i < got.n ? got.id[i] : -1, i < want.n ? want.id[i] : -1);
			return;
		}
	}
	snprintf(desc, sizeof(desc), "%d greedy tokens", got.n);
	tb_result(d, "e2e", "greedy", 0, 0, desc);
}

/* ---- the child ---- */

static void print_header(const struct dev *d, const struct loom_check_params *p,
			 const char *reference, FILE *out)
{
	struct loom_device_info info;

	if (d->ops->device_info(d->ctx, &info) != LOOM_OK) {
		tb_fail(d, "device_info", "-", "device_info failed");
		return;
	}
	if (!p->json)
		fprintf(out, "== %s (%s, %.*s) against %s\n", d->name, d->b->path,
			(int)sizeof(info.name), info.name, reference);
}

static void print_json(const struct dev *d, const char *failed, FILE *out)
{
	fprintf(out, "{\"backend\": ");
	tb_json_string(out, d->name);
	fprintf(out, ", \"passed\": %s, \"failed\": ", failed[0] ? "false" : "true");
	tb_json_string(out, failed);
	fprintf(out, ",\n \"results\": ");
	tb_summary_json(out);
	fprintf(out, "}\n");
}

/* Conformance in the backend's default mode, reported as "<name> fast". */
static void check_default_mode(struct dev *ref, const struct dev *exact,
			       const struct loom_check_params *p)
{
	static char name[64];
	struct dev d;
	char err[4096];

	snprintf(name, sizeof(name), "%s fast", exact->name);
	if (dev_open(&d, p->backend, p->n_threads, err, sizeof(err))) {
		tb_fail(exact, "create", "fast", "without LOOM_BACKEND_EXACT: %s", err);
		return;
	}
	d.name = name;
	tb_fast = true;
	tb_run_conformance(ref, &d);
	tb_fast = false;
	dev_close(&d);
}

/* Runs every check; the exit status of the child (msg: what failed). */
static int run_checks(const struct loom_check_params *p, FILE *out, char *msg, size_t cap)
{
	const char *reference = p->reference ? p->reference : "ref.so";
	struct dev ref, d;
	char err[4096];

	if (dev_open(&ref, reference, 0, err, sizeof(err))) {
		snprintf(msg, cap, "the reference does not load: %s", err);
		return EXIT_NO_LOAD;
	}
	if (dev_open_flags(&d, p->backend, p->n_threads, LOOM_BACKEND_EXACT, err, sizeof(err))) {
		snprintf(msg, cap, "%s", err);
		dev_close(&ref);
		return EXIT_NO_LOAD;
	}
	print_header(&d, p, reference, out);
	tb_run_conformance(&ref, &d);
	tb_run_invalid(&d);
	dev_close(&d);
	check_default_mode(&ref, &d, p);
	dev_close(&ref);
	tb_current(&d, "inv-*", "-", "batch invariance");
	if (tb_run_invariance(p->backend, d.name, true, err, sizeof(err)))
		tb_fail(&d, "inv-open", "-", "with LOOM_BACKEND_BATCH_INVARIANT: %s", err);
	/* the default mode must be invariant under the flag too, and packed
	 * weights (ABI 1.2) give the GGUF layout's results there */
	tb_current(&d, "inv-*", "-", "batch invariance, default mode");
	if (tb_run_invariance(p->backend, d.name, false, err, sizeof(err)))
		tb_fail(&d, "inv-open", "-", "default mode with the flag: %s", err);
	if (p->model) {
		tb_current(&d, "e2e", "greedy", p->model);
		check_e2e(&d, p, reference);
	}
	tb_failed_ops(msg, cap);
	if (p->json) {
		print_json(&d, msg, out);
	} else {
		fprintf(out, "-- %s summary\n", d.name);
		tb_summary();
		fprintf(out, "%s: %s\n", d.name, msg[0] ? "FAILED" : "passed");
	}
	return msg[0] ? 1 : 0;
}

int loom_check_backend(const struct loom_check_params *p, char *err, size_t errlen)
{
	FILE *out = p->out ? p->out : stdout;
	const size_t cap = 4096;
	char *msg, ferr[4096];
	int status, rc;
	pid_t pid;

	if (!p || p->struct_size < sizeof(*p) || !p->backend || !p->backend[0]) {
		snprintf(err, errlen, "no backend to check");
		return -1;
	}
	if (loom_formats_init(ferr, sizeof(ferr)))
		fprintf(p->json ? stderr : out, "note: %s (only f32 weights are checked)\n", ferr);
	/* what failed, written by the child */
	msg = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (msg == MAP_FAILED) {
		snprintf(err, errlen, "mmap: %s", strerror(errno));
		return -1;
	}
	msg[0] = '\0';
	fflush(out);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		munmap(msg, cap);
		return -1;
	}
	if (pid == 0) {
		tb_log = p->json ? stderr : out;
		tb_watchdog(WATCHDOG_S);
		rc = run_checks(p, out, msg, cap);
		fflush(out);
		fflush(stderr);
		_exit(rc);
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(status)) {
		snprintf(err, errlen, "%s: the check crashed with signal %d", p->backend,
			 WTERMSIG(status));
		rc = 1;
	} else if (WEXITSTATUS(status) == TB_EXIT_CRASH) {
		snprintf(err, errlen, "%s crashed or hung (the FAIL line above names the case)",
			 p->backend);
		rc = 1;
	} else if (WEXITSTATUS(status) == EXIT_NO_LOAD) {
		snprintf(err, errlen, "%s", msg);
		rc = -1;
	} else if (WEXITSTATUS(status) != 0) {
		snprintf(err, errlen, "%s failed: %s", p->backend,
			 msg[0] ? msg : "(the child exited early)");
		rc = 1;
	} else {
		rc = 0;
	}
	munmap(msg, cap);
	return rc;
}
