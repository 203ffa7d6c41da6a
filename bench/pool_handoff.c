/*
 * pool_handoff: what one task of cpu.so's worker pool costs.
 *
 *   cc -O2 -march=native -I backends/cpu -I include -I build \
 *      bench/pool_handoff.c backends/cpu/pool.c -o /tmp/pool_handoff -lpthread
 *   /tmp/pool_handoff CHUNKS WORK THREADS
 *
 * Posts 20000 tasks of CHUNKS chunks, each chunk WORK iterations of a
 * dependent add (WORK 10: almost nothing), on THREADS threads, and prints
 * the time per task three times. With almost no work, that is the hand-off
 * every pool task of a decode step pays (docs/BENCHMARKS.md, "Threads").
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu.h"

static volatile double sink;
static int work;

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void chunk(void *arg, int64_t c, int ith)
{
	double s = 0.0;

	(void)arg, (void)c, (void)ith;
	for (int i = 0; i < work; i++)
		s += i * 1e-9;
	sink = s;
}

int main(int argc, char **argv)
{
	struct cpu_pool p;
	int chunks, threads;

	if (argc != 4) {
		fprintf(stderr, "usage: pool_handoff CHUNKS WORK THREADS\n");
		return 2;
	}
	chunks = atoi(argv[1]);
	work = atoi(argv[2]);
	threads = atoi(argv[3]);
	if (cpu_pool_init(&p, threads))
		return 1;
	for (int rep = 0; rep < 3; rep++) {
		const int n = 20000;
		double t0 = now();

		for (int i = 0; i < n; i++)
			cpu_pool_run(&p, chunk, NULL, chunks, threads);
		printf("%d threads, %d chunks of %d: %.2f us a task\n", threads, chunks, work,
		       (now() - t0) / n * 1e6);
	}
	cpu_pool_fini(&p);
	return 0;
}
