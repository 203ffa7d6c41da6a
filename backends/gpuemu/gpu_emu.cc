/*
 * gpu_emu.cc: the engine behind gpu_emu.h. Blocks of a launch are claimed
 * by a few OS threads ("workers"); a worker runs one block at a time as
 * blockDim fibers on its own stacks, switching between them only where a
 * thread waits at a barrier or a shuffle. A waiting fiber hands over
 * straight to the next ready one (a queue filled in thread order, as
 * barriers open), so the order is fixed and a launch computes the same
 * values on every run.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gpu_emu.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

thread_local emu_thread_regs *emu_cur;
thread_local emu_block_regs *emu_blk;

namespace {

const size_t STACK_BYTES = 256 << 10; /* per fiber, with a guard page below */
const unsigned MAX_BLOCK = 1024;
const unsigned MAX_GRID_X = 0x7fffffffu, MAX_GRID_YZ = 65535;
const size_t MAX_SHARED = 228 << 10; /* dynamic shared memory per block */

enum fiber_state { READY, WAIT_BLOCK, WAIT_WARP, DONE };

struct fiber {
	emu_thread_regs regs;
	int lin;      /* linear thread index in the block */
	unsigned wi, lane; /* its warp and lane there (no division per shuffle) */
	int state;
	uint64_t got; /* shuffle: the xor mask, then the partner's value */
	const void *xsrc; /* warp gather: this lane's bytes (NULL: a shuffle) */
	size_t xbytes;
	char *stack;  /* top of the fiber's stack */
#if defined(__x86_64__)
	void *sp;
#else
	ucontext_t uc;
#endif
};

/* One OS thread's state: its fibers, the block it runs, the barriers. */
struct worker {
	fiber *fibers;
	char *stack_map;
	size_t map_bytes;
	unsigned n;           /* threads in the block */
	unsigned warp, n_warps;
	unsigned live;        /* threads not finished */
	unsigned block_waiting;
	unsigned *warp_waiting, *warp_live;
	uint64_t *slots;      /* shuffle values, by linear thread index */
	unsigned char *warp_bufs; /* each warp's gather buffer (WARP_BUF bytes) */
	bool *warp_claimed;   /* its first lane has run since it was filled */
	unsigned *runq;       /* ready fibers in the order they run next */
	unsigned rq_head, rq_len;
	unsigned char *shared;
	size_t shared_cap;
	emu_block_regs blk;
	void (*fn)(void *);
	void *ctx;
	bool deadlock;
#if defined(__x86_64__)
	void *sched_sp;
#else
	ucontext_t sched_uc;
#endif
};

thread_local worker *self;

/* A warp's gather buffer: 64 lanes' bytes, then the scratch. */
const size_t WARP_BUF = 64 * EMU_GATHER_BYTES + EMU_WARP_SCRATCH;

unsigned char *warp_buf(const worker *w, unsigned warp_index)
{
	return w->warp_bufs + WARP_BUF * warp_index;
}

/* ---- context switch ---- */

#if defined(__x86_64__)
/* Saves the callee-saved registers and the FP control words on the current
 * stack, stores the stack pointer in *from, and resumes the stack `to`. */
extern "C" void emu_switch(void **from, void *to);
asm(".text\n"
    ".globl emu_switch\n"
    ".hidden emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "	pushq %rbp\n"
    "	pushq %rbx\n"
    "	pushq %r12\n"
    "	pushq %r13\n"
    "	pushq %r14\n"
    "	pushq %r15\n"
    "	subq $8, %rsp\n"
    "	stmxcsr (%rsp)\n"
    "	fnstcw 4(%rsp)\n"
    "	movq %rsp, (%rdi)\n"
    "	movq %rsi, %rsp\n"
    "	ldmxcsr (%rsp)\n"
    "	fldcw 4(%rsp)\n"
    "	addq $8, %rsp\n"
    "	popq %r15\n"
    "	popq %r14\n"
    "	popq %r13\n"
    "	popq %r12\n"
    "	popq %rbx\n"
    "	popq %rbp\n"
    "	ret\n"
    ".size emu_switch, .-emu_switch\n");
#endif

void fiber_main();

#if !defined(__x86_64__)
void fiber_main_uc()
{
	fiber_main();
}
#endif

void enqueue(worker *w, unsigned i)
{
	unsigned at = w->rq_head + w->rq_len++;

	w->runq[at < w->n ? at : at - w->n] = i;
}

/* The next ready fiber, or NULL when none is. */
fiber *dequeue(worker *w)
{
	fiber *f;

	if (!w->rq_len)
		return NULL;
	f = &w->fibers[w->runq[w->rq_head]];
	w->rq_head = w->rq_head + 1 < w->n ? w->rq_head + 1 : 0;
	w->rq_len--;
	return f;
}

/*
 * f waits (or has finished): runs the next ready fiber directly, without a
 * round trip through the scheduler, or returns to the scheduler when none
 * is ready (the block is done, or deadlocked).
 */
void switch_away(worker *w, fiber *f)
{
	fiber *next = dequeue(w);

#if defined(__x86_64__)
	if (next) {
		emu_cur = &next->regs;
		emu_switch(&f->sp, next->sp);
	} else {
		emu_switch(&f->sp, w->sched_sp);
	}
#else
	if (next) {
		emu_cur = &next->regs;
		swapcontext(&f->uc, &next->uc);
	} else {
		swapcontext(&f->uc, &w->sched_uc);
	}
#endif
}

/* The scheduler starts the block's first ready fiber. */
void resume(worker *w, fiber *f)
{
	emu_cur = &f->regs;
#if defined(__x86_64__)
	emu_switch(&w->sched_sp, f->sp);
#else
	swapcontext(&w->sched_uc, &f->uc);
#endif
}

/* Prepares f to start at fiber_main on its own stack. */
void fiber_start(fiber *f)
{
#if defined(__x86_64__)
	uint64_t *sp = (uint64_t *)f->stack; /* 16-byte aligned top */

	*--sp = 0;                                  /* fiber_main's return slot */
	*--sp = (uint64_t)(uintptr_t)&fiber_main;   /* where emu_switch returns */
	for (int i = 0; i < 6; i++)
		*--sp = 0;                          /* rbp rbx r12 r13 r14 r15 */
	*--sp = 0x1f80u | (uint64_t)0x037fu << 32;  /* default MXCSR, x87 CW */
	f->sp = sp;
#else
	getcontext(&f->uc);
	/* the top is staggered down by less than a page (worker_prepare) */
	f->uc.uc_stack.ss_sp = f->stack - (STACK_BYTES - 4096);
	f->uc.uc_stack.ss_size = STACK_BYTES - 4096;
	f->uc.uc_link = NULL;
	makecontext(&f->uc, fiber_main_uc, 0);
#endif
}

/* ---- barriers ---- */

/* Makes the threads waiting in `state` ready: all of the block's, or those
 * of one warp (warp_index >= 0). All but cur, the running thread, join the
 * run queue in thread order. */
void release(worker *w, const fiber *cur, int state, int warp_index)
{
	unsigned lo = 0, hi = w->n;

	if (warp_index >= 0) {
		lo = (unsigned)warp_index * w->warp;
		hi = lo + w->warp < w->n ? lo + w->warp : w->n;
	}
	for (unsigned i = lo; i < hi; i++)
		if (w->fibers[i].state == state) {
			w->fibers[i].state = READY;
			if (&w->fibers[i] != cur)
				enqueue(w, i);
		}
}

/* Every lane's bytes of the warp at base, in lane order, to dst: zeros for
 * a lane that is not in the gather (finished, or past the block). Lanes
 * that pass another size are a kernel's bug, reported. */
void gather_lanes(const worker *w, unsigned base, size_t bytes, unsigned char *dst)
{
	for (unsigned lane = 0; lane < w->warp; lane++, dst += bytes) {
		const fiber *o = base + lane < w->n ? &w->fibers[base + lane] : NULL;

		if (o && o->state == WAIT_WARP && o->xsrc) {
			if (o->xbytes != bytes) {
				fprintf(stderr, "gpu_emu: lanes of a warp gather pass %zu and %zu bytes\n",
					bytes, o->xbytes);
				abort();
			}
			memcpy(dst, o->xsrc, bytes);
		} else {
			memset(dst, 0, bytes);
		}
	}
}

/* Opens every barrier that all its live threads have reached; cur is the
 * running thread. */
void check_barriers(worker *w, const fiber *cur, unsigned warp_index)
{
	if (w->block_waiting && w->block_waiting == w->live) {
		w->block_waiting = 0;
		release(w, cur, WAIT_BLOCK, -1);
	}
	if (w->warp_waiting[warp_index] &&
	    w->warp_waiting[warp_index] == w->warp_live[warp_index]) {
		unsigned base = warp_index * w->warp;
		const fiber *x = NULL; /* the first lane in a gather */

		for (unsigned i = base; i < base + w->warp && i < w->n && !x; i++)
			if (w->fibers[i].state == WAIT_WARP && w->fibers[i].xsrc)
				x = &w->fibers[i];
		if (x) {
			gather_lanes(w, base, x->xbytes, warp_buf(w, warp_index));
			w->warp_claimed[warp_index] = false;
		}
		/* hand each lane in a shuffle its partner's value now, so the
		 * slots are free for the next shuffle */
		for (unsigned i = base; i < base + w->warp && i < w->n; i++) {
			fiber *f = &w->fibers[i];

			if (f->state == WAIT_WARP && !f->xsrc) {
				unsigned lane = i - base, src = lane ^ (unsigned)f->got;

				f->got = w->slots[base + (src < w->warp ? src : lane)];
			}
		}
		w->warp_waiting[warp_index] = 0;
		release(w, cur, WAIT_WARP, (int)warp_index);
	}
}

void fiber_main()
{
	worker *w = self;
	fiber *f = (fiber *)((char *)emu_cur - offsetof(fiber, regs));
	unsigned wi = f->wi;

	w->fn(w->ctx);
	f->state = DONE;
	w->live--;
	w->warp_live[wi]--;
	check_barriers(w, f, wi);
	switch_away(w, f);
	abort(); /* a finished fiber is never resumed */
}

fiber *current()
{
	return (fiber *)((char *)emu_cur - offsetof(fiber, regs));
}

/* ---- workers ---- */

/*
 * Each OS thread that runs blocks keeps one worker for its lifetime:
 * fiber stacks for MAX_BLOCK threads are mapped once (lazily committed,
 * with a guard page below each) and the per-block arrays grow as needed.
 */
bool worker_prepare(worker *w, unsigned n, unsigned warp, size_t shared)
{
	size_t per = STACK_BYTES + (size_t)getpagesize();
	unsigned n_warps = (n + warp - 1) / warp;

	if (!w->stack_map) {
		w->map_bytes = per * MAX_BLOCK;
		w->stack_map = (char *)mmap(NULL, w->map_bytes, PROT_READ | PROT_WRITE,
					    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (w->stack_map == MAP_FAILED) {
			w->stack_map = NULL;
			return false;
		}
		w->fibers = (fiber *)calloc(MAX_BLOCK, sizeof(fiber));
		w->warp_waiting = (unsigned *)calloc(MAX_BLOCK, sizeof(unsigned));
		w->warp_live = (unsigned *)calloc(MAX_BLOCK, sizeof(unsigned));
		w->slots = (uint64_t *)calloc(MAX_BLOCK, sizeof(uint64_t));
		w->runq = (unsigned *)calloc(MAX_BLOCK, sizeof(unsigned));
		w->warp_bufs = (unsigned char *)aligned_alloc(64, WARP_BUF * (MAX_BLOCK / 32));
		w->warp_claimed = (bool *)calloc(MAX_BLOCK / 32, sizeof(bool));
		if (!w->fibers || !w->warp_waiting || !w->warp_live || !w->slots || !w->runq ||
		    !w->warp_bufs || !w->warp_claimed)
			return false;
		for (unsigned i = 0; i < MAX_BLOCK; i++) {
			char *lo = w->stack_map + per * i;

			mprotect(lo, (size_t)getpagesize(), PROT_NONE); /* overflow faults */
			/* tops staggered by cache lines: tops at one offset
			 * in their pages would share L1 sets, and the fibers
			 * of a warp touch theirs in turn */
			w->fibers[i].stack = lo + per - (size_t)(i % 64) * 64;
		}
	}
	if (w->shared_cap < shared || !w->shared) {
		free(w->shared);
		w->shared = (unsigned char *)calloc(1, shared ? shared : 1);
		w->shared_cap = w->shared ? shared : 0;
		if (!w->shared)
			return false;
	}
	w->n = n;
	w->warp = warp;
	w->n_warps = n_warps;
	return warp >= 32 && warp <= 64;
}

/* Runs block `bid` to the end; false on a deadlock. */
bool run_block(worker *w, dim3 bid)
{
	fiber *first;

	w->blk.bid = bid;
	w->live = w->n;
	w->block_waiting = 0;
	w->rq_head = 0;
	w->rq_len = 0;
	for (unsigned i = 0; i < w->n_warps; i++) {
		w->warp_waiting[i] = 0;
		w->warp_live[i] = (i + 1) * w->warp <= w->n ? w->warp : w->n - i * w->warp;
	}
	for (unsigned i = 0; i < w->n; i++) {
		fiber *f = &w->fibers[i];
		const dim3 &bd = w->blk.bdim;

		f->lin = (int)i;
		f->wi = i / w->warp;
		f->lane = i % w->warp;
		f->regs.tid = dim3(i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y));
		f->state = READY;
		f->xsrc = NULL; /* a block that deadlocked may leave a gather open */
		fiber_start(f);
		enqueue(w, i);
	}
	/* the fibers hand over to each other; control comes back here when
	 * none is ready: all finished, or all wait at barriers none can pass */
	first = dequeue(w);
	resume(w, first);
	return w->live == 0;
}

struct launch {
	dim3 grid, block;
	size_t shared;
	unsigned warp;
	void (*fn)(void *);
	void *ctx;
	uint64_t n_blocks;
	std::atomic<uint64_t> next;
	std::atomic<bool> failed;
	int error; /* errno-style setup failure or deadlock */
};

thread_local worker *own;

/* Claims and runs blocks of l until none are left. */
void run_launch(launch *l)
{
	unsigned n = l->block.x * l->block.y * l->block.z;

	if (!own)
		own = (worker *)calloc(1, sizeof(worker));
	if (!own || !worker_prepare(own, n, l->warp, l->shared)) {
		l->error = ENOMEM;
		l->failed = true;
		return;
	}
	self = own;
	emu_blk = &own->blk;
	own->blk.bdim = l->block;
	own->blk.gdim = l->grid;
	own->fn = l->fn;
	own->ctx = l->ctx;
	while (!l->failed) {
		uint64_t b = l->next.fetch_add(1);
		dim3 bid;

		if (b >= l->n_blocks)
			break;
		bid = dim3((unsigned)(b % l->grid.x), (unsigned)(b / l->grid.x % l->grid.y),
			   (unsigned)(b / ((uint64_t)l->grid.x * l->grid.y)));
		if (!run_block(own, bid)) {
			l->error = EDEADLK;
			l->failed = true;
		}
	}
}

/*
 * Pool of OS threads that help run launches, started on first use. One
 * launch at a time (launch_mu); the launching thread takes part. After a
 * fork the child starts with no helpers and makes new ones.
 */
pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t pool_go = PTHREAD_COND_INITIALIZER, pool_done = PTHREAD_COND_INITIALIZER;
launch *pool_job;
uint64_t pool_gen;
unsigned pool_size, pool_busy;
bool pool_atfork;

void *pool_main(void *arg)
{
	uint64_t seen = (uint64_t)(uintptr_t)arg;

	for (;;) {
		launch *l;

		pthread_mutex_lock(&pool_mu);
		while (pool_gen == seen)
			pthread_cond_wait(&pool_go, &pool_mu);
		seen = pool_gen;
		l = pool_job;
		pthread_mutex_unlock(&pool_mu);
		run_launch(l);
		pthread_mutex_lock(&pool_mu);
		if (--pool_busy == 0)
			pthread_cond_signal(&pool_done);
		pthread_mutex_unlock(&pool_mu);
	}
	return NULL;
}

void pool_after_fork(void)
{
	pthread_mutex_init(&launch_mu, NULL);
	pthread_mutex_init(&pool_mu, NULL);
	pthread_cond_init(&pool_go, NULL);
	pthread_cond_init(&pool_done, NULL);
	pool_size = 0;
	pool_busy = 0;
	pool_job = NULL;
}

/* Grows the pool towards want helpers (best effort). */
void pool_grow(unsigned want)
{
	pthread_attr_t attr;

	if (!pool_atfork) {
		pthread_atfork(NULL, NULL, pool_after_fork);
		pool_atfork = true;
	}
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	while (pool_size < want) {
		pthread_t t;

		if (pthread_create(&t, &attr, pool_main, (void *)(uintptr_t)pool_gen))
			break;
		pool_size++;
	}
	pthread_attr_destroy(&attr);
}

void run_on_pool(launch *l, unsigned helpers)
{
	pthread_mutex_lock(&launch_mu);
	pthread_mutex_lock(&pool_mu);
	pool_grow(helpers);
	pool_job = l;
	pool_busy = pool_size;
	pool_gen++;
	pthread_cond_broadcast(&pool_go);
	pthread_mutex_unlock(&pool_mu);
	run_launch(l);
	pthread_mutex_lock(&pool_mu);
	while (pool_busy)
		pthread_cond_wait(&pool_done, &pool_mu);
	pool_job = NULL;
	pthread_mutex_unlock(&pool_mu);
	pthread_mutex_unlock(&launch_mu);
}

/* ---- runtime state ---- */

thread_local gpuError_t last_error = emuSuccess;
std::atomic<size_t> mem_used{0};
char launch_msg[160];

void set_error(gpuError_t e)
{
	if (last_error == emuSuccess)
		last_error = e;
}

long env_long(const char *name, long dflt)
{
	const char *v = getenv(name);
	char *end;
	long r;

	if (!v || !*v)
		return dflt;
	r = strtol(v, &end, 10);
	return *end ? dflt : r;
}

unsigned n_workers(uint64_t n_blocks)
{
	long n = env_long("LOOM_GPUEMU_THREADS", sysconf(_SC_NPROCESSORS_ONLN));

	if (n < 1)
		n = 1;
	if (n > 64)
		n = 64;
	return (uint64_t)n > n_blocks ? (unsigned)n_blocks : (unsigned)n;
}

size_t mem_total()
{
	long mb = env_long("LOOM_GPUEMU_MEM_MB", 0);

	if (mb > 0)
		return (size_t)mb << 20;
	return (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}

} /* namespace */

/* ---- device side ---- */

void emu_syncthreads(void)
{
	worker *w = self;
	fiber *f = current();

	w->block_waiting++;
	f->state = WAIT_BLOCK;
	check_barriers(w, f, f->wi);
	if (f->state != READY)
		switch_away(w, f);
}

uint64_t emu_shfl_xor_u64(uint64_t v, int mask)
{
	worker *w = self;
	fiber *f = current();
	unsigned wi = f->wi;

	w->slots[f->lin] = v;
	f->got = (uint64_t)(unsigned)mask;
	f->state = WAIT_WARP;
	w->warp_waiting[wi]++;
	check_barriers(w, f, wi);
	if (f->state != READY)
		switch_away(w, f);
	return f->got;
}

unsigned char *emu_warp_gather(const void *mine, size_t bytes, unsigned *lane, bool *first)
{
	worker *w = self;
	fiber *f = current();
	unsigned wi = f->wi;

	if (bytes > EMU_GATHER_BYTES) {
		fprintf(stderr, "gpu_emu: a warp gather of %zu bytes a lane (at most %d)\n", bytes,
			EMU_GATHER_BYTES);
		abort();
	}
	f->xsrc = mine;
	f->xbytes = bytes;
	f->state = WAIT_WARP;
	w->warp_waiting[wi]++;
	check_barriers(w, f, wi);
	if (f->state != READY)
		switch_away(w, f);
	f->xsrc = NULL;
	*lane = f->lane;
	*first = !w->warp_claimed[wi];
	w->warp_claimed[wi] = true;
	return warp_buf(w, wi);
}

/*
 * mma.sync.aligned.m16n8k{16,32}.row.col.s32.s8.s8.s32 for the warp: the
 * fragments of every lane are gathered, the matrices A (16 x K), B (K x 8)
 * and C (16 x 8) rebuilt from them by the PTX ISA's fragment tables
 * (section 9.7.14.5, "Matrix Fragments for mma.m16n8k16 with integer
 * type" and "... mma.m16n8k32"), and this lane's four elements of
 * D = A B + C computed. Element i of a fragment is byte i % 4 of register
 * i / 4 (elements low to high). Sums wrap as 32-bit integers.
 */
#if GPU_WARP == 32 /* the MMA is a 32-lane operation: no wave64 form */
struct mma_frag {
	uint32_t a[4], b[2];
	int32_t c[4];
};

/* Row and column of element i (0 .. K / 2 - 1) of A held by lane. */
static void mma_a_at(int k, int lane, int i, int *row, int *col)
{
	const int group = lane >> 2, tig = lane % 4;

	if (k == 16) {
		*row = i < 4 ? group : group + 8;
		*col = tig * 4 + (i & 3);
	} else {
		*row = (i < 4 || (i >= 8 && i < 12)) ? group : group + 8;
		*col = tig * 4 + (i & 3) + (i >= 8 ? 16 : 0);
	}
}

/* Row (of K) and column of element i (0 .. K / 4 - 1) of B held by lane. */
static void mma_b_at(int k, int lane, int i, int *row, int *col)
{
	const int group = lane >> 2, tig = lane % 4;

	*row = tig * 4 + (i & 3) + (k == 32 && i >= 4 ? 16 : 0);
	*col = group;
}

/* Row and column of element i (0 .. 3) of C and D held by lane. */
static void mma_c_at(int lane, int i, int *row, int *col)
{
	*row = i < 2 ? (lane >> 2) : (lane >> 2) + 8;
	*col = (lane % 4) * 2 + (i & 1);
}

static int8_t frag_byte(const uint32_t *regs, int i)
{
	return (int8_t)(regs[i / 4] >> (8 * (i % 4)));
}

/* D = A B + C for the whole warp from its gathered fragments. */
static void mma_warp(int k, const mma_frag *all, int32_t D[16][8])
{
	int8_t A[16][32], B[32][8];
	int r, col;

	for (int l = 0; l < 32; l++) {
		for (int i = 0; i < k / 2; i++) {
			mma_a_at(k, l, i, &r, &col);
			A[r][col] = frag_byte(all[l].a, i);
		}
		for (int i = 0; i < k / 4; i++) {
			mma_b_at(k, l, i, &r, &col);
			B[r][col] = frag_byte(all[l].b, i);
		}
		for (int i = 0; i < 4; i++) {
			mma_c_at(l, i, &r, &col);
			D[r][col] = all[l].c[i];
		}
	}
	for (r = 0; r < 16; r++)
		for (col = 0; col < 8; col++) {
			uint32_t s = (uint32_t)D[r][col];

			for (int e = 0; e < k; e++)
				s += (uint32_t)((int32_t)A[r][e] * (int32_t)B[e][col]);
			D[r][col] = (int32_t)s;
		}
}

/* The warp's first lane to run computes all of D in the gather buffer's
 * scratch; every lane takes its four elements from there. */
void emu_mma_s8(int k, int32_t d[4], const uint32_t *a, const uint32_t *b, const int32_t c[4])
{
	mma_frag mine;
	unsigned lane;
	bool first;
	unsigned char *buf;
	int32_t(*D)[8];
	int r, col;

	static_assert(sizeof(mma_frag) <= EMU_GATHER_BYTES, "an MMA fragment fits a gather");
	static_assert(sizeof(int32_t[16][8]) <= EMU_WARP_SCRATCH, "D fits the scratch");
	memset(&mine, 0, sizeof(mine));
	memcpy(mine.a, a, (size_t)k / 8 * sizeof(uint32_t)); /* 2 or 4 registers */
	memcpy(mine.b, b, (size_t)k / 16 * sizeof(uint32_t)); /* 1 or 2 */
	memcpy(mine.c, c, sizeof(mine.c));
	buf = emu_warp_gather(&mine, sizeof(mine), &lane, &first);
	D = (int32_t(*)[8])(buf + 64 * EMU_GATHER_BYTES);
	if (first)
		mma_warp(k, (const mma_frag *)buf, D);
	for (int i = 0; i < 4; i++) {
		mma_c_at((int)lane, i, &r, &col);
		d[i] = D[r][col];
	}
}
#endif

void *emu_dynamic_shared(void)
{
	return self->shared;
}

void emu_launch_raw(dim3 grid, dim3 block, size_t shared, gpuStream_t s, int warp,
		    void (*fn)(void *), void *ctx)
{
	launch l;
	unsigned n = block.x * block.y * block.z, nw;

	(void)s;
	if (!grid.x || !grid.y || !grid.z || grid.x > MAX_GRID_X || grid.y > MAX_GRID_YZ ||
	    grid.z > MAX_GRID_YZ || !block.x || !block.y || !block.z || block.x > MAX_BLOCK ||
	    block.y > MAX_BLOCK || block.z > 64 || n > MAX_BLOCK || shared > MAX_SHARED) {
		set_error(emuErrorInvalidValue);
		return;
	}
	l.grid = grid;
	l.block = block;
	l.shared = shared;
	l.warp = (unsigned)warp;
	l.fn = fn;
	l.ctx = ctx;
	l.n_blocks = (uint64_t)grid.x * grid.y * grid.z;
	l.next = 0;
	l.failed = false;
	l.error = 0;
	nw = n_workers(l.n_blocks);
	if (nw > 1)
		run_on_pool(&l, nw - 1);
	else
		run_launch(&l);
	if (l.failed) {
		snprintf(launch_msg, sizeof(launch_msg), "%s",
			 l.error == EDEADLK ? "barrier deadlock: threads of a block or warp wait "
					      "at different barriers" :
					      "emulator out of memory for fibers");
		set_error(emuErrorLaunchFailure);
	}
}

/* ---- runtime API ---- */

const char *gpuGetErrorString(gpuError_t e)
{
	switch (e) {
	case emuSuccess: return "no error";
	case emuErrorInvalidValue: return "invalid argument";
	case emuErrorMemoryAllocation: return "out of memory";
	case emuErrorNoDevice: return "no emulated device (LOOM_GPUEMU_DEVICES=0)";
	case emuErrorInvalidDevice: return "invalid device ordinal";
	case emuErrorLaunchFailure: return launch_msg[0] ? launch_msg : "launch failure";
	case emuErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
	case emuErrorStreamCaptureInvalidated: return "capture invalidated by an earlier error";
	}
	return "unknown error";
}

gpuError_t gpuGetLastError(void)
{
	gpuError_t e = last_error;

	last_error = emuSuccess;
	return e;
}

gpuError_t gpuGetDeviceCount(int *n)
{
	long d = env_long("LOOM_GPUEMU_DEVICES", 1);

	*n = d > 0 ? (int)d : 0;
	return d > 0 ? emuSuccess : emuErrorNoDevice;
}

gpuError_t gpuSetDevice(int d)
{
	int n = 0;

	if (gpuGetDeviceCount(&n) != emuSuccess)
		return emuErrorNoDevice;
	return d >= 0 && d < n ? emuSuccess : emuErrorInvalidDevice;
}

gpuError_t gpuGetDeviceProperties(gpuDeviceProp *p, int d)
{
	gpuError_t e = gpuSetDevice(d);

	if (e != emuSuccess)
		return e;
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "host emulator, %u-wide warps", (unsigned)GPU_WARP);
	p->warpSize = GPU_WARP;
	p->totalGlobalMem = mem_total();
	return emuSuccess;
}

gpuError_t gpuMemGetInfo(size_t *avail, size_t *total)
{
	size_t t = mem_total(), u = mem_used;

	*total = t;
	*avail = u < t ? t - u : 0;
	return emuSuccess;
}

/* Each allocation carries its size in a 256-byte header, so the used
 * total can be kept; the pointer handed out stays 256-byte aligned. */
struct emu_stream {
	bool capturing;
	bool invalidated; /* something the capture may not hold was asked for */
	std::vector<std::function<void()>> work;
};

struct emu_graph {
	std::vector<std::function<void()>> work;
};

namespace {

/* Streams capturing on this thread: allocation, freeing and device-wide
 * waits are refused meanwhile, as in CUDA's thread-local capture mode. */
thread_local int captures_here;

/* Refuses an operation a capture may not contain. */
gpuError_t refuse_in_capture(gpuStream_t s)
{
	if (s)
		s->invalidated = true;
	set_error(emuErrorStreamCaptureUnsupported);
	return emuErrorStreamCaptureUnsupported;
}

} /* namespace */

bool emu_capturing(gpuStream_t s)
{
	return s && s->capturing;
}

void emu_record(gpuStream_t s, std::function<void()> work)
{
	s->work.push_back(std::move(work));
}

gpuError_t gpuMalloc(void **p, size_t n)
{
	void *raw = NULL;
	size_t t = mem_total();

	*p = NULL;
	if (captures_here)
		return refuse_in_capture(NULL);
	if (n > t - 256 || mem_used + n + 256 > t || posix_memalign(&raw, 256, n + 256)) {
		set_error(emuErrorMemoryAllocation);
		return emuErrorMemoryAllocation;
	}
	*(size_t *)raw = n;
	mem_used += n + 256;
	*p = (char *)raw + 256;
	return emuSuccess;
}

gpuError_t gpuFree(void *p)
{
	char *raw;

	if (!p)
		return emuSuccess;
	if (captures_here)
		return refuse_in_capture(NULL);
	raw = (char *)p - 256;
	mem_used -= *(size_t *)raw + 256;
	free(raw);
	return emuSuccess;
}

/* Host memory is host memory; allocating it is refused while capturing,
 * as cudaMallocHost is. */
gpuError_t gpuMallocHost(void **p, size_t n)
{
	*p = NULL;
	if (captures_here)
		return refuse_in_capture(NULL);
	*p = malloc(n ? n : 1);
	return *p ? emuSuccess : emuErrorMemoryAllocation;
}

gpuError_t gpuFreeHost(void *p)
{
	if (captures_here)
		return refuse_in_capture(NULL);
	free(p);
	return emuSuccess;
}

/* Copies between device memory are captured; a capture holding host
 * memory is refused (CUDA refuses pageable host memory there). */
gpuError_t gpuMemcpyAsync(void *dst, const void *src, size_t n, enum emu_copy_kind kind,
			  gpuStream_t s)
{
	if (emu_capturing(s)) {
		if (kind != emuDeviceToDevice)
			return refuse_in_capture(s);
		if (n)
			emu_record(s, [=]() { memmove(dst, src, n); });
		return emuSuccess;
	}
	if (n)
		memmove(dst, src, n);
	return emuSuccess;
}

gpuError_t gpuStreamCreateWithFlags(gpuStream_t *s, unsigned flags)
{
	(void)flags;
	*s = new (std::nothrow) emu_stream();
	return *s ? emuSuccess : emuErrorMemoryAllocation;
}

gpuError_t gpuStreamDestroy(gpuStream_t s)
{
	if (s && s->capturing)
		captures_here--;
	delete s;
	return emuSuccess;
}

gpuError_t gpuStreamSynchronize(gpuStream_t s)
{
	if (emu_capturing(s))
		return refuse_in_capture(s);
	return emuSuccess;
}

/* ---- graphs ---- */

/* LOOM_GPUEMU_CAPTURE=0 refuses every capture, so that a backend's path
 * for a runtime that cannot capture can be tested. */
gpuError_t gpuStreamBeginCapture(gpuStream_t s)
{
	if (!s || s->capturing)
		return emuErrorInvalidValue;
	if (env_long("LOOM_GPUEMU_CAPTURE", 1) == 0)
		return emuErrorStreamCaptureUnsupported;
	s->capturing = true;
	s->invalidated = false;
	s->work.clear();
	captures_here++;
	return emuSuccess;
}

/* Ends the capture whatever happened in it; an invalidated one yields no
 * graph. */
gpuError_t gpuStreamEndCapture(gpuStream_t s, gpuGraph_t *g)
{
	*g = NULL;
	if (!s || !s->capturing)
		return emuErrorInvalidValue;
	s->capturing = false;
	captures_here--;
	if (s->invalidated) {
		s->work.clear();
		return emuErrorStreamCaptureInvalidated;
	}
	*g = new (std::nothrow) emu_graph();
	if (!*g)
		return emuErrorMemoryAllocation;
	(*g)->work.swap(s->work);
	return emuSuccess;
}

gpuError_t gpuGraphInstantiate(gpuGraphExec_t *e, gpuGraph_t g)
{
	*e = g ? new (std::nothrow) emu_graph(*g) : NULL;
	return *e ? emuSuccess : g ? emuErrorMemoryAllocation : emuErrorInvalidValue;
}

/* Runs the recorded work in order; a failing launch leaves its error for
 * gpuGetLastError, as it would on the device. */
gpuError_t gpuGraphLaunch(gpuGraphExec_t e, gpuStream_t s)
{
	if (!e)
		return emuErrorInvalidValue;
	if (emu_capturing(s))
		return refuse_in_capture(s);
	for (auto &w : e->work)
		w();
	return emuSuccess;
}

gpuError_t gpuGraphExecDestroy(gpuGraphExec_t e)
{
	delete e;
	return emuSuccess;
}

gpuError_t gpuGraphDestroy(gpuGraph_t g)
{
	delete g;
	return emuSuccess;
}

/* ---- cuBLAS ---- */

#ifdef GPU_EMU_BLAS

struct emu_blas {
	gpuStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	*h = (cublasHandle_t)calloc(1, sizeof(struct emu_blas));
	return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	free(h);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, gpuStream_t s)
{
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
	(void)h;
	(void)m;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *w, size_t n)
{
	(void)h;
	return w || !n ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

namespace {

/* Written apart from kernels.cu's half_to_f32 on purpose: the emulated
 * cuBLAS is a reference for the f16 path, not a copy of it. */
float half_bits_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 31, mant = h & 0x3ffu, u;
	float f;

	if (exp == 0) {
		f = ldexpf((float)mant, -24);
		return sign ? -f : f;
	}
	u = exp == 31 ? sign | 0x7f800000u | mant << 13 : sign | (exp + 112) << 23 | mant << 13;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Element (i, l) of op(A) for a column-major A of type t. */
float elem(const void *a, cudaDataType_t t, cublasOperation_t op, int lda, int i, int l)
{
	int64_t off = op == CUBLAS_OP_N ? i + (int64_t)l * lda : l + (int64_t)i * lda;

	if (t == CUDA_R_16F)
		return half_bits_to_float(((const uint16_t *)a)[off]);
	if (t == CUDA_R_16BF) { /* the high half of a float */
		uint32_t u = (uint32_t)((const uint16_t *)a)[off] << 16;
		float f;

		memcpy(&f, &u, sizeof(f));
		return f;
	}
	return ((const float *)a)[off];
}

/* Rows r0..r1 of op(A) (or, with the op flipped, columns of op(B)) as
 * k contiguous floats each. */
void gather_rows(const void *a, cudaDataType_t t, cublasOperation_t op, int lda, int r0, int r1,
		 int k, float *out)
{
	for (int r = r0; r < r1; r++)
		for (int l = 0; l < k; l++)
			out[(int64_t)(r - r0) * k + l] = elem(a, t, op, lda, r, l);
}

struct gemm_job {
	cublasOperation_t ta;
	int m, n, k;
	float alpha, beta;
	const void *a;
	cudaDataType_t at;
	int lda;
	const float *bcols; /* op(B) by column: n rows of k floats */
	float *c;
	int ldc;
};

const int GEMM_ROWS = 32; /* rows of op(A) gathered at a time */

/* Rows i0..i1 of C. Each entry is the sum over l in ascending order, in
 * double, of exact float products; four columns at a time only to give
 * the core independent sums. */
void gemm_rows(const gemm_job *g, int i0, int i1)
{
	std::vector<float> arows((size_t)GEMM_ROWS * g->k);

	for (int r0 = i0; r0 < i1; r0 += GEMM_ROWS) {
		int r1 = r0 + GEMM_ROWS < i1 ? r0 + GEMM_ROWS : i1;

		gather_rows(g->a, g->at, g->ta, g->lda, r0, r1, g->k, arows.data());
		for (int i = r0; i < r1; i++) {
			const float *ar = &arows[(size_t)(i - r0) * g->k];

			for (int j0 = 0; j0 < g->n; j0 += 4) {
				double s[4] = { 0.0, 0.0, 0.0, 0.0 };
				int nj = g->n - j0 < 4 ? g->n - j0 : 4;

				for (int l = 0; l < g->k; l++)
					for (int jj = 0; jj < nj; jj++)
						s[jj] += (double)ar[l] *
							 g->bcols[(int64_t)(j0 + jj) * g->k + l];
				for (int jj = 0; jj < nj; jj++) {
					float *cv = &g->c[i + (int64_t)(j0 + jj) * g->ldc];

					*cv = (float)(g->alpha * s[jj] +
						      (g->beta != 0.0f ? g->beta * *cv : 0.0f));
				}
			}
		}
	}
}

/* C = alpha op(A) op(B) + beta C, column-major, f32 accumulation (here in
 * double), any of the emulated element types; sizes checked by the caller.
 * Large products are split by rows over the emulator's threads. */
cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
		    float alpha, const void *a, cudaDataType_t at, int lda, const void *b,
		    cudaDataType_t bt, int ldb, float beta, float *c, int ldc)
{
	std::vector<float> bcols((size_t)n * k);
	gemm_job g = { ta, m, n, k, alpha, beta, a, at, lda, bcols.data(), c, ldc };
	unsigned nt = (double)m * n * k < (1 << 22) ? 1 : n_workers((uint64_t)m);
	std::vector<std::thread> helpers;

	gather_rows(b, bt, tb == CUBLAS_OP_N ? CUBLAS_OP_T : CUBLAS_OP_N, ldb, 0, n, k,
		    bcols.data());
	for (unsigned t = 1; t < nt; t++)
		helpers.emplace_back(gemm_rows, &g, (int)((int64_t)m * t / nt),
				     (int)((int64_t)m * (t + 1) / nt));
	gemm_rows(&g, 0, (int)((int64_t)m / nt));
	for (std::thread &h : helpers)
		h.join();
	return CUBLAS_STATUS_SUCCESS;
}

/* Runs gemm now, or records it (host scalars by value, as cuBLAS's host
 * pointer mode bakes them into a capture) on a capturing stream. */
cublasStatus_t queue_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			  int n, int k, float alpha, const void *a, cudaDataType_t at, int lda,
			  const void *b, cudaDataType_t bt, int ldb, float beta, float *c, int ldc)
{
	if (m < 0 || n < 0 || k < 0 || lda < 1 || lda < (ta == CUBLAS_OP_N ? m : k) || ldb < 1 ||
	    ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < 1 || ldc < m)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (!emu_capturing(h->stream))
		return gemm(ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ldc);
	emu_record(h->stream, [=]() {
		(void)gemm(ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ldc);
	});
	return CUBLAS_STATUS_SUCCESS;
}

} /* namespace */

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			    int n, int k, const void *alpha, const void *a, cudaDataType_t at,
			    int lda, const void *b, cudaDataType_t bt, int ldb, const void *beta,
			    void *c, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
			    cublasGemmAlgo_t algo)
{
	(void)algo;
	/* as on the hardware's f32-compute list: A and B of one type */
	if (ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F || at != bt ||
	    (at != CUDA_R_16F && at != CUDA_R_16BF && at != CUDA_R_32F))
		return CUBLAS_STATUS_INVALID_VALUE;
	return queue_gemm(h, ta, tb, m, n, k, *(const float *)alpha, a, at, lda, b, bt, ldb,
			  *(const float *)beta, (float *)c, ldc);
}

/* Column-major, as documented: C (m x n, ld ldc) = alpha op(A) op(B) +
 * beta C, op(A) m x k, op(B) k x n; A stored k x m (lda >= k) when
 * transposed, m x k (lda >= m) otherwise. */
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			   int n, int k, const float *alpha, const float *a, int lda,
			   const float *b, int ldb, const float *beta, float *c, int ldc)
{
	return queue_gemm(h, ta, tb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb,
			  *beta, c, ldc);
}

#endif

/* ---- NCCL over MPI ---- */

#ifdef GPU_EMU_NCCL

#define OMPI_SKIP_MPICXX 1 /* the C interface only */
#define MPICH_SKIP_MPICXX 1
#include <limits.h>
#include <mpi.h>
#include <time.h>

struct emu_nccl_comm {
	MPI_Comm comm; /* a duplicate of the host's: its own message space */
	int n, rank;
};

/* Unique enough: the process, the time and a counter. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	static std::atomic<uint64_t> counter;
	struct timespec ts;
	uint64_t v[4];

	clock_gettime(CLOCK_REALTIME, &ts);
	v[0] = (uint64_t)getpid();
	v[1] = (uint64_t)ts.tv_sec;
	v[2] = (uint64_t)ts.tv_nsec;
	v[3] = ++counter;
	memset(id, 0, sizeof(*id));
	memcpy(id->internal, v, sizeof(v));
	return ncclSuccess;
}

namespace {

/* Whether every rank of comm passed the same id. */
bool same_id_everywhere(MPI_Comm comm, int n, const ncclUniqueId &id)
{
	std::vector<ncclUniqueId> all((size_t)n);
	bool same = true;

	if (MPI_Allgather(&id, (int)sizeof(id), MPI_BYTE, all.data(), (int)sizeof(id), MPI_BYTE,
			  comm) != MPI_SUCCESS)
		return false;
	for (int r = 0; r < n; r++)
		same = same && !memcmp(&all[(size_t)r], &id, sizeof(id));
	return same;
}

} /* namespace */

ncclResult_t emu_ncclCommInitRank(ncclComm_t *out, int n, ncclUniqueId id, int rank,
				  void *mpi_comm)
{
	MPI_Comm host = (MPI_Comm)mpi_comm;
	int size = 0, me = -1, ok, all_ok = 0;
	emu_nccl_comm *c;

	*out = NULL;
	if (MPI_Comm_size(host, &size) != MPI_SUCCESS || MPI_Comm_rank(host, &me) != MPI_SUCCESS ||
	    size != n || me != rank)
		return ncclInvalidArgument;
	c = new (std::nothrow) emu_nccl_comm();
	if (!c)
		return ncclSystemError;
	if (MPI_Comm_dup(host, &c->comm) != MPI_SUCCESS) {
		delete c;
		return ncclSystemError;
	}
	c->n = n;
	c->rank = rank;
	ok = same_id_everywhere(c->comm, n, id);
	if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c->comm) != MPI_SUCCESS || !all_ok) {
		MPI_Comm_free(&c->comm);
		delete c;
		return ncclInvalidUsage;
	}
	*out = c;
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
	int finalized = 1;

	if (!c)
		return ncclSuccess;
	/* a job may end MPI before it frees its backend */
	if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized)
		MPI_Comm_free(&c->comm);
	delete c;
	return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
			   ncclComm_t c, gpuStream_t s)
{
	const char *lo = (const char *)recv, *snd = (const char *)send, *in_place, *hi;

	if (!c || type != ncclFloat32 || count > INT_MAX)
		return ncclInvalidArgument;
	in_place = lo + (size_t)c->rank * count * sizeof(float);
	hi = lo + (size_t)c->n * count * sizeof(float);
	if (emu_capturing(s))
		return ncclInvalidUsage;
	/* NCCL's rule: in place exactly, or apart */
	if (snd != in_place && snd + count * sizeof(float) > lo && snd < hi)
		return ncclInvalidArgument;
	if (MPI_Allgather(snd == in_place ? MPI_IN_PLACE : send, (int)count, MPI_FLOAT, recv,
			  (int)count, MPI_FLOAT, c->comm) != MPI_SUCCESS)
		return ncclSystemError;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess:
		return "no error";
	case ncclSystemError:
		return "system error (MPI under the emulator)";
	case ncclInternalError:
		return "internal error";
	case ncclInvalidArgument:
		return "invalid argument";
	case ncclInvalidUsage:
		return "invalid usage";
	}
	return "unknown result";
}

#endif /* GPU_EMU_NCCL */
