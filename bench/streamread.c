/*
 * Streaming-read bandwidth probe for bench/vs_llamacpp.sh and
 * bench/thread_scaling.sh: see bench/streamread.sh.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define BYTES ((size_t)1 << 30)
#define CHUNK ((size_t)64 << 20)
#define PASSES 6
#define PF 136 /* vectors of 64 bytes */
typedef uint64_t v8 __attribute__((vector_size(64)));
static v8 *buf; static int nthr;
static pthread_barrier_t bar;
static volatile uint64_t sink;
static double best_chunk = 1e30, best_pass = 1e30;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *worker(void *arg) {
	long id = (long)arg;
	size_t cv = CHUNK / sizeof(v8), lo = cv * id / nthr, hi = cv * (id + 1) / nthr;
	v8 a = {0}, b = {0}, c = {0}, d = {0};
	for (int pass = 0; pass < PASSES; pass++) {
		pthread_barrier_wait(&bar);
		double p0 = now();
		for (size_t k = 0; k < BYTES / CHUNK; k++) {
			/* t0 is taken before any thread may start the chunk (the
			   barrier after it), t1 after all have finished it. */
			double t0 = now();
			pthread_barrier_wait(&bar);
			const v8 *x = buf + k * cv;
			/* with software prefetch PF vectors (8.5 KiB) ahead, as the
			   GEMVs do: on an AMD EPYC host the hardware prefetcher alone
			   read 13 GB/s from one core, this 15-16 */
			for (size_t i = lo; i + 4 <= hi; i += 4) {
				for (int j = 0; j < 4; j++)
					__builtin_prefetch(&x[i + PF + j]);
				a += x[i]; b += x[i+1]; c += x[i+2]; d += x[i+3];
			}
			pthread_barrier_wait(&bar);
			double dt = now() - t0;
			if (id == 0 && pass > 0 && dt < best_chunk) best_chunk = dt;
		}
		double dp = now() - p0;
		if (id == 0 && pass > 0 && dp < best_pass) best_pass = dp;
	}
	v8 s = a + b + c + d; uint64_t r = 0;
	for (int j = 0; j < 8; j++) r += s[j];
	sink += r;
	return NULL;
}
int main(int argc, char **argv) {
	nthr = argc > 1 ? atoi(argv[1]) : 1;
	if (nthr < 1 || nthr > 64) return 2;
	if (posix_memalign((void **)&buf, 4096, BYTES)) return 1;
	memset(buf, 1, BYTES);
	pthread_barrier_init(&bar, NULL, nthr);
	pthread_t th[64];
	for (long i = 1; i < nthr; i++) pthread_create(&th[i], NULL, worker, (void *)i);
	worker((void *)0);
	for (long i = 1; i < nthr; i++) pthread_join(th[i], NULL);
	printf("%.2f %.2f\n", CHUNK / best_chunk / 1e9, BYTES / best_pass / 1e9);
	return 0;
}
