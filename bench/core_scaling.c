/*
 * core_scaling: do two threads get two cores' arithmetic?
 *
 *   cc -O2 -mavx2 -mfma -pthread bench/core_scaling.c -o /tmp/core_scaling
 *   /tmp/core_scaling
 *
 * Times a register-only loop of 8 independent FMA chains (no memory
 * traffic) on one thread, then on two at once. If the two vCPUs were
 * hyperthreads of one core, each would take about twice as long when both
 * run; on separate cores the times match. Used for the "Two threads on
 * this host" figures in docs/BENCHMARKS.md.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#define ITERS 200000000L

static volatile float sink;

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *fma_loop(void *arg)
{
	__m256 a[8], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
	double t0 = now();
	float s = 0.0f;

	for (int i = 0; i < 8; i++)
		a[i] = _mm256_set1_ps(1.0f + (float)i * 1e-3f);
	for (long n = 0; n < ITERS; n++)
		for (int i = 0; i < 8; i++)
			a[i] = _mm256_fmadd_ps(a[i], m, c);
	for (int i = 0; i < 8; i++)
		s += _mm256_cvtss_f32(a[i]);
	sink = s;
	*(double *)arg = now() - t0;
	return NULL;
}

int main(void)
{
	double alone, both[2];
	pthread_t th;

	fma_loop(&alone);
	if (pthread_create(&th, NULL, fma_loop, &both[1]))
		return 1;
	fma_loop(&both[0]);
	pthread_join(th, NULL);
	printf("one thread: %.2f s; two threads at once: %.2f s and %.2f s\n", alone, both[0],
	       both[1]);
	return 0;
}
