/*
 * Persistent worker pool with chunk claiming. The caller posts a task by
 * filling the task slot, opening `next` and bumping `gen`; workers spin on
 * `gen` for a short while (ops come back to back during a forward pass) and
 * then sleep on a condition variable. Every thread, the caller included,
 * claims chunks with a compare-and-swap on `next` until none is left; the
 * caller returns once `done` counts them all. It never waits for a worker
 * that has not claimed anything, so on a loaded machine a descheduled worker
 * costs at most the chunk it holds.
 *
 * A worker may wake long after its task ended. `next` carries the task
 * number, so a stale worker's claim fails: the caller closes `next`
 * (chunk half UINT32_MAX) before it rewrites the slot, and a claim succeeds
 * only if `next` still holds the value the worker read before it read the
 * slot.
 *
 * Wake-up without a lost signal: a worker increments `sleepers` and re-reads
 * `gen` under the mutex before waiting; the caller bumps `gen` and then reads
 * `sleepers` (both sequentially consistent), so either the worker sees the
 * new task or the caller sees the sleeper and broadcasts under the mutex.
 */
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "cpu.h"

#define SPIN_ROUNDS (1 << 12)
/* The caller waits for claimed chunks, which are short, so it yields soon:
 * on a loaded machine the chunk's thread may share its core. */
#define DONE_SPIN_ROUNDS (1 << 14)
/*
 * A worker that holds a chunk this long (or that the caller has to yield to)
 * after the caller ran out of work has most likely lost its core to another
 * process; each such wait costs a context switch or a scheduler time slice,
 * so the tasks posted in the next SOLO_NS (a few scheduler slices, several
 * decode steps of a small model) run on the caller alone, then the pool is
 * tried again. The window is time, not a task count: a prefill's tasks are
 * milliseconds each, and 512 of them solo was a whole 1B-shaped pp512 on one
 * thread (556 -> 437 t/s). Results do not depend on the thread count, so
 * this changes only speed.
 */
#define SLOW_WAIT_NS 2000000
#define SOLO_NS 10000000
#define CLOSED 0xffffffffu

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
		/* a spinning worker that shares a core with the caller (other
		 * processes hold the rest) would take the caller's time; the
		 * yield costs little when nobody else wants the core */
		if (i % 64 == 63)
			sched_yield();
		else
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

/* Claims and runs chunks of the open task until none is left. */
static void run_chunks(struct cpu_pool *p, int ith)
{
	uint64_t v = atomic_load(&p->next);

	for (;;) {
		uint32_t c = (uint32_t)v;
		cpu_task_fn fn = atomic_load(&p->fn);
		void *arg = atomic_load(&p->arg);
		int64_t n = atomic_load(&p->n_chunks);

		if (c == CLOSED || c >= n)
			return;
		/* fails (and reloads v) if the task moved on since v was read */
		if (!atomic_compare_exchange_weak(&p->next, &v, v + 1))
			continue;
		fn(arg, c, ith);
		atomic_fetch_add(&p->done, 1);
		v = atomic_load(&p->next);
	}
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
		run_chunks(p, ith);
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
	atomic_init(&p->sleepers, 0);
	atomic_init(&p->stop, false);
	atomic_init(&p->next, CLOSED);
	atomic_init(&p->done, 0);
	atomic_init(&p->fn, NULL);
	atomic_init(&p->arg, NULL);
	atomic_init(&p->n_chunks, 0);
	p->solo_until = 0;
	p->posted = p->slow_waits = p->solo_run = 0;
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

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Waits until every chunk is done; notes a wait that shows contention. */
static void wait_done(struct cpu_pool *p, int64_t n_chunks)
{
	bool yielded = false;
	int64_t t0;

	if (atomic_load(&p->done) >= n_chunks)
		return;
	t0 = now_ns();
	for (int i = 0; atomic_load(&p->done) < n_chunks; i++) {
		if (i < DONE_SPIN_ROUNDS) {
			cpu_relax();
		} else {
			sched_yield();
			yielded = true;
		}
	}
	if (yielded) {
		int64_t t1 = now_ns();

		if (t1 - t0 > SLOW_WAIT_NS) {
			p->solo_until = t1 + SOLO_NS;
			p->slow_waits++;
		}
	}
}

void cpu_pool_run(struct cpu_pool *p, cpu_task_fn fn, void *arg, int64_t n_chunks, int nth)
{
	unsigned g;

	if (n_chunks <= 0)
		return;
	if (p->solo_until && nth > 1) {
		if (now_ns() < p->solo_until) {
			p->solo_run++;
			nth = 1;
		} else {
			p->solo_until = 0;
		}
	}
	if (nth <= 1 || p->n_threads <= 1 || n_chunks == 1 || n_chunks > CPU_POOL_MAX_CHUNKS) {
		for (int64_t c = 0; c < n_chunks; c++)
			fn(arg, c, 0);
		return;
	}
	p->posted++;
	/* the previous task is closed (all its chunks claimed and done) */
	atomic_store(&p->fn, fn);
	atomic_store(&p->arg, arg);
	atomic_store(&p->n_chunks, n_chunks);
	atomic_store(&p->done, 0);
	/* open before bumping gen, so a woken worker finds chunks to claim
	 * (only this thread writes gen) */
	g = atomic_load(&p->gen) + 1;
	atomic_store(&p->next, (uint64_t)g << 32);
	atomic_store(&p->gen, g);
	wake_all(p);
	run_chunks(p, 0);
	wait_done(p, n_chunks);
	atomic_store(&p->next, (uint64_t)g << 32 | CLOSED);
}
