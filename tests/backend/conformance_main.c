/*
 * Backend conformance suite, the test driver (the suite itself is
 * core/check/, shared with `loom check-backend`).
 *
 * Usage: backend_conformance [backend.so[:KEY=VALUE] ...]
 * Without arguments it tests ref.so by hand-computed cases, then compares
 * ref.so, cpu.so, cuda.so and rocm.so (whichever load) against ref.so; cpu.so
 * in exact mode and in fast mode (LOOM_CPU_EXACT=1, 0), each also with 3
 * threads (uneven splits) and with its lesser kernel sets (LOOM_CPU_ISA=
 * avx512 (fast mode: no VNNI), avx2, scalar; amx-emu and amx, the AMX
 * prefill GEMM with emulated and with real tiles); cuda.so and rocm.so in
 * exact and fast mode (LOOM_GPU_EXACT=1, 0). Suffixes :threads=N set the
 * config's n_threads; any other :KEY=VALUE is set in the environment
 * before the backend is created.
 * ref.so failing to load is a failure; any other backend that does not load
 * (not built, no device, incomplete table) is reported as a skip. Each
 * backend runs in its own child process, so a crash in one is reported as
 * that backend's failure and the others still run.
 */
#include "check/tb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Seconds one backend's run may take before it counts as hung. */
#define WATCHDOG_S 300

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
	tb_fast = (getenv("LOOM_CPU_EXACT") && !strcmp(getenv("LOOM_CPU_EXACT"), "0")) ||
		  (getenv("LOOM_GPU_EXACT") && !strcmp(getenv("LOOM_GPU_EXACT"), "0"));
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

		tb_watchdog(WATCHDOG_S);
		rc = fn(name);

		fflush(stdout);
		_exit(rc);
	}
	if (waitpid(pid, &status, 0) < 0) {
		perror("waitpid");
		return 1;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == TB_EXIT_CRASH)
		return 1; /* the watchdog named the case */
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
		"cpu.so:LOOM_CPU_EXACT=0:LOOM_CPU_ISA=avx-vnni",
		"cpu.so:LOOM_CPU_EXACT=0:LOOM_CPU_ISA=avx2",
		"cpu.so:LOOM_CPU_EXACT=0:LOOM_CPU_ISA=scalar",
		/* prefill through AMX tiles: the C tile emulation, and the real
		 * instructions (VNNI with a note where the CPU or kernel has none) */
		"cpu.so:LOOM_CPU_EXACT=0:LOOM_CPU_ISA=amx-emu",
		"cpu.so:LOOM_CPU_EXACT=0:LOOM_CPU_ISA=amx",
		/* GPU backends in exact mode (f32 activations) and in fast mode
		 * (8-bit activations, integer dots in the q4_0, q8_0, q4_K, q6_K
		 * GEMV) */
		"cuda.so:LOOM_GPU_EXACT=1", "cuda.so:LOOM_GPU_EXACT=0",
		"rocm.so:LOOM_GPU_EXACT=1", "rocm.so:LOOM_GPU_EXACT=0",
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
