/*
 * Batch invariance, the test driver (the checks are core/check/invariance.c,
 * shared with `loom check-backend`): ref.so and cpu.so, the latter with each
 * of its kernel sets (native, avx2, scalar by LOOM_CPU_ISA), in exact mode
 * and in its default fast mode (there also avx512 without VNNI and
 * avx-vnni, AVX2 with VNNI); then the control, cpu.so without the flag,
 * reported and never judged.
 *
 * Usage: backend_invariance [backend.so ...]   (default ref.so cpu.so)
 */
#include "check/tb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run_invariant(const char *so, const char *isa, bool exact)
{
	char label[128], err[4096];

	if (isa)
		setenv("LOOM_CPU_ISA", isa, 1);
	else
		unsetenv("LOOM_CPU_ISA");
	snprintf(label, sizeof(label), "%s%s%s%s", so, isa ? ":" : "", isa ? isa : "",
		 exact ? " exact" : " fast");
	printf("== %s, batch invariant\n", label);
	if (tb_run_invariance(so, label, exact, err, sizeof(err)))
		printf("SKIP %s: %s\n", label, err);
}

int main(int argc, char **argv)
{
	static const char *const dflt[] = { "ref.so", "cpu.so" };
	const char *const *names = dflt;
	int n = 2, before, differ;
	char err[4096];

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1) {
		names = (const char *const *)argv + 1;
		n = argc - 1;
	}
	/* the test sets the flags itself */
	unsetenv("LOOM_CPU_INVARIANT");
	unsetenv("LOOM_CPU_EXACT");
	if (loom_formats_init(err, sizeof(err)))
		printf("note: %s (plain weight types only)\n", err);
	for (int i = 0; i < n; i++) {
		before = tb_failures();
		for (int exact = 1; exact >= 0; exact--) {
			run_invariant(names[i], NULL, exact);
			if (!strstr(names[i], "cpu"))
				continue;
			if (!exact) {
				run_invariant(names[i], "avx512", exact);
				run_invariant(names[i], "avx-vnni", exact);
			}
			run_invariant(names[i], "avx2", exact);
			run_invariant(names[i], "scalar", exact);
		}
		printf("%s: %s\n", names[i],
		       tb_failures() == before ? "bitwise invariant" : "FAILED");
	}
	/* control: without the flag cpu.so takes other kernels for m >= 16 */
	unsetenv("LOOM_CPU_ISA");
	differ = tb_invariance_control("cpu.so");
	if (differ >= 0)
		printf("control: cpu.so without the flag: %d gemm rows differ from the same row alone%s\n",
		       differ, differ ? "" : " (no difference seen)");
	printf("-- summary\n");
	tb_summary();
	printf("%d failed\n", tb_failures());
	return tb_failures() ? 1 : 0;
}
