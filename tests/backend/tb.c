/*
 * Backend conformance suite: harness and main.
 *
 * Usage: backend_conformance [backend.so[:KEY=VALUE] ...]
 * Without arguments it tests ref.so by hand-computed cases, then compares
 * ref.so, cpu.so, cuda.so and rocm.so (whichever load) against ref.so; cpu.so
 * in exact mode and in fast mode (LOOM_CPU_EXACT=1, 0), each also with 3
 * threads (uneven splits) and with its lesser kernel sets (LOOM_CPU_ISA=
 * avx512 (fast mode: no VNNI), avx2, scalar). Suffixes :threads=N set the
 * config's n_threads; any other :KEY=VALUE is set in the environment
 * before the backend is created.
 * ref.so failing to load is a failure; any other backend that does not load
 * (not built, no device, incomplete table) is reported as a skip. Each
 * backend runs in its own child process, so a crash in one is reported as
 * that backend's failure and the others still run.
 */
#include "tb.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

bool tb_fast;

/* Seconds one backend's run may take before it counts as hung. */
#ifndef TB_WATCHDOG_S
#define TB_WATCHDOG_S 300
#endif

/* ---- devices ---- */

int dev_open(struct dev *d, const char *name, int n_threads, char *err, size_t errlen)
{
	struct loom_backend_config cfg = {
		.struct_size = sizeof(cfg), .device = 0, .n_threads = n_threads,
	};

	memset(d, 0, sizeof(*d));
	d->b = loom_backend_open(name, &cfg, err, errlen);
	if (!d->b)
		return -1;
	d->ops = d->b->ops;
	d->ctx = d->b->ctx;
	d->name = d->ops->name ? d->ops->name : name;
	return 0;
}

void dev_close(struct dev *d)
{
	dev_reset(d);
	loom_backend_close(d->b);
	d->b = NULL;
}

void *dev_put(struct dev *d, const void *src, size_t n)
{
	struct loom_buffer *buf;
	void *addr;

	if (d->n_bufs == TB_MAX_BUFS) {
		fprintf(stderr, "tb: too many buffers in one case\n");
		return NULL;
	}
	if (d->ops->buffer_alloc(d->ctx, n, &buf) != LOOM_OK)
		return NULL;
	d->bufs[d->n_bufs++] = buf;
	addr = d->ops->buffer_addr(d->ctx, buf);
	if (src && n && d->ops->upload(d->ctx, addr, src, n) != LOOM_OK)
		return NULL;
	return addr;
}

int dev_get(struct dev *d, void *dst, const void *src, size_t n)
{
	int rc = d->ops->synchronize(d->ctx);

	return rc ? rc : d->ops->download(d->ctx, dst, src, n);
}

void dev_reset(struct dev *d)
{
	while (d->n_bufs > 0)
		d->ops->buffer_free(d->ctx, d->bufs[--d->n_bufs]);
}

/* ---- data ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

void tb_seed(uint64_t seed)
{
	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
}

/* xorshift64*: deterministic, so every run sees the same cases. */
static uint64_t rng_next(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

float tb_rand(void)
{
	return (float)((rng_next() >> 40) * (2.0 / 16777216.0) - 1.0);
}

int64_t tb_rand_int(int64_t n)
{
	return (int64_t)(rng_next() % (uint64_t)n);
}

void tb_fill(float *x, int64_t n, float amp)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = amp * tb_rand();
}

void *tb_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		fprintf(stderr, "tb: out of memory (%zu bytes)\n", n);
		exit(2);
	}
	return p;
}

float *tb_poison(int64_t n)
{
	static const uint32_t nan_bits = 0x7fc0dead;
	float *x = tb_xmalloc((size_t)n * sizeof(float));

	for (int64_t i = 0; i < n; i++)
		memcpy(&x[i], &nan_bits, sizeof(float));
	return x;
}

/* ---- comparison ---- */

double tb_nmse(const float *a, const float *b, int64_t rows, int64_t n, int64_t stride)
{
	double err = 0.0, ref = 0.0;

	for (int64_t r = 0; r < rows; r++) {
		for (int64_t i = 0; i < n; i++) {
			double x = a[r * stride + i], y = b[r * stride + i];

			if (!isfinite(x))
				return INFINITY;
			err += (x - y) * (x - y);
			ref += y * y;
		}
	}
	return ref > 0.0 ? err / ref : err;
}

bool tb_padding_same(const float *a, const float *orig, int64_t rows, int64_t n,
		     int64_t stride)
{
	for (int64_t r = 0; r < rows; r++) {
		size_t pad = (size_t)(stride - n) * sizeof(float);

		if (pad && memcmp(a + r * stride + n, orig + r * stride + n, pad))
			return false;
	}
	return true;
}

/* ---- the watchdog: a hung backend fails with the case it hung in ---- */

static char current[256] = "startup\n";

void tb_current(const struct dev *d, const char *op, const char *fmt, const char *desc)
{
	snprintf(current, sizeof(current), "FAIL %s %s %s: %s: timed out after %d s\n",
		 d->name, op, fmt, desc, TB_WATCHDOG_S);
}

static void on_alarm(int sig)
{
	ssize_t unused = write(STDOUT_FILENO, current, strlen(current));

	(void)unused;
	_exit(1);
}

/* ---- reporting: one tally per backend, op and format ---- */

struct tally {
	char key[64];
	double tol, worst;
	int cases, fails, skips;
};

static struct tally tallies[256];
static int n_tallies, n_failures;

static struct tally *tally_of(const struct dev *d, const char *op, const char *fmt)
{
	char key[64];

	snprintf(key, sizeof(key), "%-5s %-10s %-5s", d->name, op, fmt);
	for (int i = 0; i < n_tallies; i++)
		if (!strcmp(tallies[i].key, key))
			return &tallies[i];
	if (n_tallies == (int)(sizeof(tallies) / sizeof(tallies[0])))
		return &tallies[n_tallies - 1];
	snprintf(tallies[n_tallies].key, sizeof(tallies[0].key), "%s", key);
	return &tallies[n_tallies++];
}

void tb_result(const struct dev *d, const char *op, const char *fmt, double tol,
	       double nmse, const char *desc)
{
	struct tally *t = tally_of(d, op, fmt);

	t->cases++;
	t->tol = tol;
	if (!(nmse <= t->worst))
		t->worst = nmse;
	if (!(nmse <= tol)) {
		t->fails++;
		n_failures++;
		printf("FAIL %s %s %s: %s: nmse %.3g > %.3g\n", d->name, op, fmt,
		       desc, nmse, tol);
	}
}

void tb_fail(const struct dev *d, const char *op, const char *fmt, const char *msg, ...)
{
	struct tally *t = tally_of(d, op, fmt);
	va_list ap;

	t->cases++;
	t->fails++;
	n_failures++;
	printf("FAIL %s %s %s: ", d->name, op, fmt);
	va_start(ap, msg);
	vprintf(msg, ap);
	va_end(ap);
	printf("\n");
}

void tb_skip(const struct dev *d, const char *op, const char *fmt)
{
	tally_of(d, op, fmt)->skips++;
}

int tb_failures(void)
{
	return n_failures;
}

int tb_summary(void)
{
	for (int i = 0; i < n_tallies; i++) {
		const struct tally *t = &tallies[i];

		if (t->cases == 0)
			printf("  %s  skipped (unsupported, %d cases)\n", t->key, t->skips);
		else if (t->tol > 0.0 || t->fails)
			printf("  %s  %4d cases  max nmse %-9.3g tol %-7.1g %s\n", t->key,
			       t->cases, t->worst, t->tol, t->fails ? "FAIL" : "ok");
		else
			printf("  %s  %4d cases  exact %s\n", t->key, t->cases,
			       t->fails ? "FAIL" : "ok");
	}
	return n_failures;
}

bool tb_status_ok(const struct dev *d, const char *op, const char *fmt,
		  bool supported, int rc, const char *desc)
{
	if (supported && rc == LOOM_OK)
		return true;
	if (!supported && rc == LOOM_ERR_UNSUPPORTED) {
		tb_skip(d, op, fmt);
		return false;
	}
	tb_fail(d, op, fmt, "%s: supports() says %s but the call returned %s", desc,
		supported ? "yes" : "no", tb_status_name(rc));
	return false;
}

const char *tb_type_name(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_F32: return "f32";
	case LOOM_TYPE_F16: return "f16";
	case LOOM_TYPE_BF16: return "bf16";
	case LOOM_TYPE_Q8_0: return "q8_0";
	case LOOM_TYPE_Q4_0: return "q4_0";
	case LOOM_TYPE_Q4_1: return "q4_1";
	case LOOM_TYPE_Q5_0: return "q5_0";
	case LOOM_TYPE_Q5_1: return "q5_1";
	case LOOM_TYPE_Q2_K: return "q2_K";
	case LOOM_TYPE_Q3_K: return "q3_K";
	case LOOM_TYPE_Q4_K: return "q4_K";
	case LOOM_TYPE_Q5_K: return "q5_K";
	case LOOM_TYPE_Q6_K: return "q6_K";
	default: return "?";
	}
}

const char *tb_status_name(int rc)
{
	switch (rc) {
	case LOOM_OK: return "LOOM_OK";
	case LOOM_ERR_INVALID: return "LOOM_ERR_INVALID";
	case LOOM_ERR_NOMEM: return "LOOM_ERR_NOMEM";
	case LOOM_ERR_UNSUPPORTED: return "LOOM_ERR_UNSUPPORTED";
	case LOOM_ERR_DEVICE: return "LOOM_ERR_DEVICE";
	default: return "an unknown status";
	}
}

/* ---- main ---- */

/* Splits "cpu.so:KEY=VALUE[:KEY=VALUE...]" into the name and its settings:
 * threads=N goes to *n_threads, anything else into the environment. */
static void apply_variant(const char *spec, char *name, size_t cap, int *n_threads)
{
	const char *colon = strchr(spec, ':');
	char settings[256];
	char *setting, *save, *eq;

	*n_threads = 0;
	snprintf(name, cap, "%.*s", colon ? (int)(colon - spec) : (int)strlen(spec), spec);
	if (!colon)
		return;
	snprintf(settings, sizeof(settings), "%s", colon + 1);
	for (setting = strtok_r(settings, ":", &save); setting;
	     setting = strtok_r(NULL, ":", &save)) {
		eq = strchr(setting, '=');
		if (!eq)
			continue;
		*eq = '\0';
		if (!strcmp(setting, "threads"))
			*n_threads = atoi(eq + 1);
		else
			setenv(setting, eq + 1, 1);
	}
}

/* Runs in a child: compares backend `spec` with ref. Exit status: 0 pass,
 * 1 failures, 77 backend did not load. */
static int test_backend(const char *spec)
{
	struct dev ref, d;
	struct loom_device_info info;
	char err[4096], name[256];
	int n_threads;

	if (dev_open(&ref, "ref.so", 0, err, sizeof(err))) {
		printf("FAIL ref.so does not load: %s\n", err);
		return 1;
	}
	apply_variant(spec, name, sizeof(name), &n_threads);
	tb_fast = getenv("LOOM_CPU_EXACT") && !strcmp(getenv("LOOM_CPU_EXACT"), "0");
	if (dev_open(&d, name, n_threads, err, sizeof(err))) {
		printf("SKIP %s: %s\n", spec, err);
		dev_close(&ref);
		return 77;
	}
	if (d.ops->device_info(d.ctx, &info) == LOOM_OK)
		printf("== %s (%.*s) against ref\n", spec, (int)sizeof(info.name), info.name);
	else
		tb_fail(&d, "device_info", "-", "device_info failed");
	tb_run_conformance(&ref, &d);
	tb_run_invalid(&d);
	printf("-- %s summary\n", spec);
	tb_summary();
	dev_close(&d);
	dev_close(&ref);
	return tb_failures() ? 1 : 0;
}

/* Forks test_backend so that a crash stays inside one backend's report. */
static int run_child(const char *name, int (*fn)(const char *))
{
	int status;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		int rc;

		signal(SIGALRM, on_alarm);
		alarm(TB_WATCHDOG_S);
		rc = fn(name);

		fflush(stdout);
		_exit(rc);
	}
	if (waitpid(pid, &status, 0) < 0) {
		perror("waitpid");
		return 1;
	}
	if (WIFSIGNALED(status)) {
		printf("FAIL %s: crashed with signal %d\n", name, WTERMSIG(status));
		return 1;
	}
	return WEXITSTATUS(status);
}

static int hand_checks(const char *unused)
{
	struct dev ref;
	char err[4096];
	int fails;

	if (dev_open(&ref, "ref.so", 0, err, sizeof(err))) {
		printf("FAIL ref.so does not load: %s\n", err);
		return 1;
	}
	fails = tb_check_ref_by_hand(&ref);
	dev_close(&ref);
	return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const char *const all[] = {
		"ref.so",
		/* cpu.so in exact mode (f32 activations) */
		"cpu.so:LOOM_CPU_EXACT=1", "cpu.so:LOOM_CPU_EXACT=1:threads=3",
		"cpu.so:LOOM_CPU_EXACT=1:LOOM_CPU_ISA=avx2",
		"cpu.so:LOOM_CPU_EXACT=1:LOOM_CPU_ISA=scalar",
		/* and in fast mode (8-bit activations, integer dots) */
		"cpu.so:LOOM_CPU_EXACT=0", "cpu.so:LOOM_CPU_EXACT=0:threads=3",
		"cpu.so:LOOM_CPU_EXACT=0:LOOM_CPU_ISA=avx512",
		"cpu.so:LOOM_CPU_EXACT=0:LOOM_CPU_ISA=avx2",
		"cpu.so:LOOM_CPU_EXACT=0:LOOM_CPU_ISA=scalar",
		"cuda.so", "rocm.so",
	};
	const char *const *names = all;
	int n = sizeof(all) / sizeof(all[0]), failed = 0, tested = 0;
	char err[4096];

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1) {
		names = (const char *const *)argv + 1;
		n = argc - 1;
	}
	if (loom_formats_init(err, sizeof(err)))
		printf("note: %s (only f32 weights will be tested)\n", err);
	printf("== ref.so by hand-computed cases\n");
	if (run_child("ref.so", hand_checks))
		failed++;
	for (int i = 0; i < n; i++) {
		int rc = run_child(names[i], test_backend);

		if (rc == 77)
			continue;
		tested++;
		if (rc)
			failed++;
	}
	printf("%d backend(s) compared with ref, %d run(s) failed\n", tested, failed);
	return failed ? 1 : 0;
}
