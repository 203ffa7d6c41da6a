/*
 * Persistent worker pool. The caller posts a task by bumping `gen`; workers
 * spin on it for a short while (ops come back to back during a forward pass)
 * and then sleep on a condition variable. The caller runs share 0 itself and
 * spins until `pending` drops to zero.
 *
 * Wake-up without a lost signal: a worker increments `sleepers` and re-reads
 * `gen` under the mutex before waiting; the caller bumps `gen` and then reads
 * `sleepers` (both sequentially consistent), so either the worker sees the
 * new task or the caller sees the sleeper and broadcasts under the mutex.
 */
#include <sched.h>
#include <stdlib.h>

#include "cpu.h"

#define SPIN_ROUNDS (1 << 12)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static unsigned wait_for_task(struct cpu_pool *p, unsigned seen)
{
	unsigned g;

	for (int i = 0; i < SPIN_ROUNDS; i++) {
		g = atomic_load(&p->gen);
		if (g != seen || atomic_load(&p->stop))
			return g;
		cpu_relax();
	}
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add(&p->sleepers, 1);
	while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
		pthread_cond_wait(&p->cv, &p->mu);
	atomic_fetch_sub(&p->sleepers, 1);
	pthread_mutex_unlock(&p->mu);
	return g;
}

struct worker_arg {
	struct cpu_pool *p;
	int ith;
};

static void *worker_main(void *arg)
{
	struct cpu_pool *p = ((struct worker_arg *)arg)->p;
	int ith = ((struct worker_arg *)arg)->ith;
	unsigned seen = 0; /* gen at init; a task may be posted before we run */

	free(arg);
	for (;;) {
		seen = wait_for_task(p, seen);
		if (atomic_load(&p->stop))
			break;
		if (ith < p->nth)
			p->fn(p->arg, ith, p->nth);
		atomic_fetch_sub(&p->pending, 1);
	}
	return NULL;
}

static void wake_all(struct cpu_pool *p)
{
	if (atomic_load(&p->sleepers) > 0) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
	}
}

int cpu_pool_init(struct cpu_pool *p, int n_threads)
{
	p->n_threads = n_threads < 1 ? 1 : n_threads;
	p->n_started = 0;
	p->threads = NULL;
	atomic_init(&p->gen, 0);
	atomic_init(&p->pending, 0);
	atomic_init(&p->sleepers, 0);
	atomic_init(&p->stop, false);
	p->fn = NULL;
	p->arg = NULL;
	p->nth = 1;
	if (pthread_mutex_init(&p->mu, NULL))
		return LOOM_ERR_NOMEM;
	if (pthread_cond_init(&p->cv, NULL)) {
		pthread_mutex_destroy(&p->mu);
		return LOOM_ERR_NOMEM;
	}
	if (p->n_threads == 1)
		return LOOM_OK;
	p->threads = calloc((size_t)p->n_threads, sizeof(*p->threads));
	if (!p->threads)
		goto out_fail;
	for (int i = 1; i < p->n_threads; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));

		if (!wa)
			goto out_fail;
		wa->p = p;
		wa->ith = i;
		if (pthread_create(&p->threads[i], NULL, worker_main, wa)) {
			free(wa);
			goto out_fail;
		}
		p->n_started++;
	}
	return LOOM_OK;

out_fail:
	cpu_pool_fini(p);
	return LOOM_ERR_NOMEM;
}

void cpu_pool_fini(struct cpu_pool *p)
{
	atomic_store(&p->stop, true);
	pthread_mutex_lock(&p->mu);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i <= p->n_started; i++)
		pthread_join(p->threads[i], NULL);
	free(p->threads);
	p->threads = NULL;
	p->n_started = 0;
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
}

void cpu_pool_run(struct cpu_pool *p, cpu_task_fn fn, void *arg, int nth)
{
	if (nth > p->n_threads)
		nth = p->n_threads;
	if (nth <= 1) {
		fn(arg, 0, 1);
		return;
	}
	p->fn = fn;
	p->arg = arg;
	p->nth = nth;
	/* every worker checks in, even those without a share */
	atomic_store(&p->pending, p->n_threads - 1);
	atomic_fetch_add(&p->gen, 1);
	wake_all(p);
	fn(arg, 0, nth);
	for (int i = 0; atomic_load(&p->pending) > 0; i++) {
		if (i < SPIN_ROUNDS)
			cpu_relax();
		else
			sched_yield();
	}
}
