/*
 * cpu.so: the fast CPU backend. Host memory buffers, a persistent thread
 * pool, SIMD GEMV kernels for decode, OpenBLAS sgemm on dequantized panels
 * for prefill, and straightforward vectorized elementwise ops and paged
 * attention. Arguments are validated like the reference backend: a bad
 * shape, stride or index returns LOOM_ERR_INVALID before anything runs.
 */
#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu.h"
#include "fgemm.h"
#include "kpack.h"
#include "../mpi/coll.h"

#define MAX_THREADS 256

/*
 * Packed weights (gemm.c) are carved one after another out of large
 * chunks, in the order the host offers them, which is file order and so
 * the order a forward pass reads them: the hardware prefetcher runs on from
 * one matrix into the next, as it does over one buffer of GGUF-layout
 * weights. A chunk is freed with the last buffer carved from it.
 */
struct cpu_arena {
	uint8_t *base;
	size_t cap, used;
	size_t mapped; /* what pages_alloc mapped for base */
	int refs;
};

#define ARENA_CHUNK ((size_t)64 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

struct loom_buffer {
	void *ptr;
	size_t size;
	struct cpu_arena *arena; /* NULL: ptr is its own allocation */
	size_t mapped; /* > 0: ptr is a mapping of that many bytes (pages_alloc) */
};

/* Buffers of at least this many bytes are mapped from the kernel. */
#define MAP_MIN ((size_t)1 << 20)

void cpu_log(struct loom_backend_ctx *ctx, enum loom_log_level lvl, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	if (!ctx || !ctx->host || !ctx->host->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ctx->host->log(ctx->host->host, lvl, msg);
}

/* Makes every thread's scratch hold at least n floats. */
int cpu_scratch_reserve(struct loom_backend_ctx *ctx, size_t n)
{
	if (n > SIZE_MAX / sizeof(float) - 16)
		return LOOM_ERR_NOMEM;
	for (int i = 0; i < ctx->n_threads; i++) {
		float *p;

		if (ctx->scratch_cap[i] >= n)
			continue;
		p = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
		if (!p)
			return LOOM_ERR_NOMEM;
		free(ctx->scratch[i]);
		ctx->scratch[i] = p;
		ctx->scratch_cap[i] = n;
	}
	return LOOM_OK;
}

/* ---- context ---- */

static void cpu_destroy(struct loom_backend_ctx *ctx)
{
	if (!ctx)
		return;
	if (ctx->n_threads > 1)
		cpu_log(ctx, LOOM_LOG_DEBUG,
			"cpu: pool: %llu tasks on %d threads; %llu slow waits sent %llu tasks "
			"to one thread", ctx->pool.posted, ctx->n_threads, ctx->pool.slow_waits,
			ctx->pool.solo_run);
	cpu_pool_fini(&ctx->pool);
	if (ctx->scratch)
		for (int i = 0; i < ctx->n_threads; i++)
			free(ctx->scratch[i]);
	free(ctx->scratch);
	free(ctx->scratch_cap);
	free(ctx->stamp);
	free(ctx->xsum);
	free(ctx->qx);
	free(ctx->qsc);
	free(ctx->qprep);
	free(ctx->bfx);
	cpu_rope_tables_free(ctx);
	free(ctx->qkx);
	free(ctx->moe_f);
	free(ctx->moe_i);
	cpu_region_free(ctx);
	free(ctx);
}

/* The integer dot set that goes with kernel set isa: AVX-512 VNNI or
 * AVX-VNNI where the CPU has it, unless LOOM_CPU_ISA asked for plain
 * avx512 or avx2. */
static enum qdot_isa pick_qdot_isa(enum cpu_isa isa, const char *want)
{
	switch (isa) {
	case CPU_ISA_AVX512:
		if ((!want || strcmp(want, "avx512")) && qdot_isa_supported(QDOT_VNNI))
			return QDOT_VNNI;
		return QDOT_AVX512;
	case CPU_ISA_AVX2:
		if ((!want || strcmp(want, "avx2")) && qdot_isa_supported(QDOT_AVXVNNI))
			return QDOT_AVXVNNI;
		return QDOT_AVX2;
	default:
		return QDOT_SCALAR;
	}
}

/*
 * The backend's whole configuration: what the host's loom_backend_config
 * says, then the environment knobs, all read here and nowhere else
 * (docs/BACKENDS.md, "cpu.so configuration", lists them).
 */
struct cpu_config {
	int32_t device;
	long n_threads;   /* <= 0: one per online CPU */
	bool invariant;   /* LOOM_BACKEND_BATCH_INVARIANT, LOOM_CPU_INVARIANT */
	bool exact;       /* LOOM_BACKEND_EXACT, LOOM_CPU_EXACT */
	const char *isa;  /* LOOM_CPU_ISA: NULL, scalar, avx2, avx-vnni, avx512,
			   * amx, amx-emu */
	bool qgemm;       /* LOOM_CPU_QGEMM=0: dequantize + OpenBLAS prefill */
	bool fgemm;       /* LOOM_CPU_FGEMM=0: OpenBLAS for float panels */
	bool pairs;       /* LOOM_CPU_BF16DOT=0: bf16 weights' fast prefill in f32 */
	bool pack;        /* LOOM_CPU_PACK=0: weights stay in GGUF layout */
	bool fuse;        /* LOOM_CPU_FUSE=0: step regions run call by call */
	bool attn_group;  /* LOOM_CPU_ATTN_GROUP=0: attention a head and a row
			   * at a time */
	bool attn_walk;   /* LOOM_CPU_ATTN_WALK=0: a split decode part walks
			   * its positions once per head group */
};

/* Whether a config of cfg->struct_size bytes holds the field that ends
 * at byte end: an older host's smaller struct lacks the later fields. */
static bool cfg_has(const struct loom_backend_config *cfg, size_t end)
{
	return cfg && cfg->struct_size >= end;
}

#define CFG_HAS(cfg, field) \
	cfg_has(cfg, offsetof(struct loom_backend_config, field) + \
			     sizeof(((struct loom_backend_config *)0)->field))

/* An on/off knob: "1" or "0"; anything else (or unset) keeps def. */
static bool env_flag(const char *name, bool def)
{
	const char *v = getenv(name);

	if (v && (!strcmp(v, "1") || !strcmp(v, "0")))
		return v[0] == '1';
	return def;
}

/* An off switch: "0" turns it off, anything else leaves it on. */
static bool env_off(const char *name)
{
	const char *v = getenv(name);

	return !(v && !strcmp(v, "0"));
}

static void read_config(const struct loom_backend_config *cfg, struct cpu_config *c)
{
	memset(c, 0, sizeof(*c));
	if (CFG_HAS(cfg, device))
		c->device = cfg->device;
	if (CFG_HAS(cfg, n_threads))
		c->n_threads = cfg->n_threads;
	if (CFG_HAS(cfg, flags)) {
		c->invariant = (cfg->flags & LOOM_BACKEND_BATCH_INVARIANT) != 0;
		c->exact = (cfg->flags & LOOM_BACKEND_EXACT) != 0;
	}
	c->exact = env_flag("LOOM_CPU_EXACT", c->exact);
	c->invariant = env_flag("LOOM_CPU_INVARIANT", c->invariant);
	c->isa = getenv("LOOM_CPU_ISA");
	c->qgemm = env_off("LOOM_CPU_QGEMM");
	c->fgemm = env_off("LOOM_CPU_FGEMM");
	c->pairs = env_off("LOOM_CPU_BF16DOT");
	c->pack = env_off("LOOM_CPU_PACK");
	c->fuse = env_off("LOOM_CPU_FUSE");
	c->attn_group = env_off("LOOM_CPU_ATTN_GROUP");
	c->attn_walk = env_off("LOOM_CPU_ATTN_WALK");
}

/* The kernel set: the best the CPU has, or the lesser one LOOM_CPU_ISA
 * names (avx512 is AVX-512 without VNNI for the integer dots, avx2 AVX2
 * without AVX-VNNI, avx-vnni AVX2 with it). */
static enum cpu_isa pick_isa(const char *want)
{
	enum cpu_isa isa = cpu_detect_isa();

	if (want && !strcmp(want, "scalar"))
		return CPU_ISA_SCALAR;
	if (want && (!strcmp(want, "avx2") || !strcmp(want, "avx-vnni")) &&
	    isa == CPU_ISA_AVX512)
		return CPU_ISA_AVX2;
	return isa;
}

/*
 * LOOM_CPU_ISA=amx: fast-mode prefill through AMX-INT8 tiles where the
 * CPU and the kernel allow it (tile state asked for here, before the pool
 * starts), else the VNNI kernel with a note; amx-emu: the same kernel with
 * the tile instructions emulated in C (tests). Opt-in: AMX is not the
 * default until its test has passed on an AMX host (docs/BACKENDS.md).
 */
static enum amx_mode pick_amx(struct loom_backend_ctx *ctx, const char *want)
{
	char why[128];

	if (!want || (strcmp(want, "amx") && strcmp(want, "amx-emu")) || ctx->exact)
		return AMX_OFF;
	if (ctx->qisa != QDOT_VNNI) {
		cpu_log(ctx, LOOM_LOG_WARN, "cpu: %s needs AVX-512 VNNI; VNNI-less prefill", want);
		return AMX_OFF;
	}
	if (!strcmp(want, "amx-emu"))
		return AMX_EMU;
	if (amx_request(why, sizeof(why))) {
		cpu_log(ctx, LOOM_LOG_WARN, "cpu: AMX not used, VNNI prefill instead: %s", why);
		return AMX_OFF;
	}
	return AMX_HW;
}

static long pick_threads(long n)
{
	if (n <= 0)
		n = sysconf(_SC_NPROCESSORS_ONLN);
	if (n <= 0)
		n = 1;
	return n > MAX_THREADS ? MAX_THREADS : n;
}

static int cpu_create(const struct loom_backend_host *host, const struct loom_backend_config *cfg,
		      struct loom_backend_ctx **out)
{
	struct loom_backend_ctx *ctx;
	struct cpu_config c;
	long n;

	if (!out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	read_config(cfg, &c);
	if (c.device != 0) {
		if (host && host->log)
			host->log(host->host, LOOM_LOG_ERROR, "cpu: only device 0 exists");
		return LOOM_ERR_DEVICE;
	}
	n = pick_threads(c.n_threads);

	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return LOOM_ERR_NOMEM;
	ctx->host = host;
	ctx->isa = pick_isa(c.isa);
	ctx->qisa = pick_qdot_isa(ctx->isa, c.isa);
	ctx->n_threads = (int)n;
	ctx->invariant = c.invariant;
	ctx->exact = c.exact;
	ctx->qgemm = c.qgemm;
	ctx->fgemm = c.fgemm && fgemm_supported(ctx->isa);
	ctx->pairs = ctx->fgemm && c.pairs && fgemm_pairs_supported(ctx->isa);
	ctx->pack = !ctx->exact && kpack_kernel(ctx->qisa, LOOM_TYPE_Q4_1) && c.pack;
	ctx->rg.fuse = c.fuse;
	ctx->attn_group = c.attn_group;
	ctx->attn_walk = c.attn_walk;
	ctx->amx = pick_amx(ctx, c.isa);
	ctx->scratch = calloc((size_t)n, sizeof(*ctx->scratch));
	ctx->scratch_cap = calloc((size_t)n, sizeof(*ctx->scratch_cap));
	ctx->stamp = aligned_alloc(64, (size_t)n * sizeof(*ctx->stamp));
	if (!ctx->scratch || !ctx->scratch_cap || !ctx->stamp)
		goto out_free_ctx;
	memset(ctx->stamp, 0, (size_t)n * sizeof(*ctx->stamp));
	if (cpu_pool_init(&ctx->pool, (int)n))
		goto out_free_ctx;
	/* each pool thread calls sgemm on its own panel; OpenBLAS must not
	 * start threads of its own on top */
	openblas_set_num_threads(1);
	cpu_log(ctx, LOOM_LOG_INFO, "cpu: %d threads, %s kernels%s%s%s", ctx->n_threads,
		cpu_isa_name(ctx->isa), ctx->invariant ? ", batch invariant" : "",
		ctx->exact ? ", exact" : ", integer dots ",
		ctx->exact ? "" : qdot_isa_name(ctx->qisa));
	if (ctx->amx != AMX_OFF)
		cpu_log(ctx, LOOM_LOG_INFO, "cpu: prefill through AMX-INT8 tiles (%s)",
			amx_mode_name(ctx->amx));
	if (ctx->pack)
		cpu_log(ctx, LOOM_LOG_INFO, "cpu: q8_0, q4_0, q4_1, q5_0, q5_1 and q2_K .. q6_K "
			"weights packed at load, 16 rows in the lanes");
	*out = ctx;
	return LOOM_OK;

out_free_ctx:
	free(ctx->scratch);
	free(ctx->scratch_cap);
	free(ctx->stamp);
	free(ctx);
	return LOOM_ERR_NOMEM;
}

/* Bytes the kernel says can be allocated without swapping (MemAvailable:
 * free memory plus reclaimable caches, such as a mapped model file's
 * pages); 0 where /proc/meminfo has no such line. */
static uint64_t mem_available(void)
{
	unsigned long long kb = 0;
	char line[256];
	FILE *f = fopen("/proc/meminfo", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb > UINT64_MAX / 1024 ? 0 : (uint64_t)kb * 1024;
}

static int cpu_device_info(struct loom_backend_ctx *ctx, struct loom_device_info *out)
{
	long pages, avail, psize;

	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "cpu (%s, %d threads)", cpu_isa_name(ctx->isa),
		 ctx->n_threads);
	pages = sysconf(_SC_PHYS_PAGES);
	avail = sysconf(_SC_AVPHYS_PAGES);
	psize = sysconf(_SC_PAGESIZE);
	if (pages > 0 && psize > 0)
		out->mem_total = (uint64_t)pages * (uint64_t)psize;
	/* the host's memory plan compares its needs with mem_free: page
	 * cache counts as free, as the kernel would reclaim it */
	out->mem_free = mem_available();
	if (!out->mem_free && avail > 0 && psize > 0)
		out->mem_free = (uint64_t)avail * (uint64_t)psize;
	return LOOM_OK;
}

static bool cpu_supports(struct loom_backend_ctx *ctx, enum loom_op op, uint32_t type)
{
	switch (op) {
	case LOOM_OP_GEMM:
	case LOOM_OP_EMBED:
		return cpu_format_known(type);
	case LOOM_OP_RMSNORM:
	case LOOM_OP_ROPE:
	case LOOM_OP_GLU:
	case LOOM_OP_ADD:
	case LOOM_OP_SCALE:
	case LOOM_OP_KV_WRITE:
	case LOOM_OP_ATTENTION:
	case LOOM_OP_ATTENTION_TREE: /* attn_tree(), ABI 1.8 */
		return loom_check_kv_type(type, 32) == LOOM_OK; /* ABI 1.3 KV types */
	case LOOM_OP_COPY:
	case LOOM_OP_SOFTCAP:
	case LOOM_OP_ATTENTION_SINKS: /* ABI 1.8 */
	case LOOM_OP_GLU_OAI:
		return type == LOOM_TYPE_F32;
	case LOOM_OP_EMBED_PACKED:
		/* embed unpacks what weight_pack packs (its rows, as the GGUF
		 * bytes); the head then streams the table in 16-row groups,
		 * 1.1-2x faster than the GGUF-layout kernels (bench_gemm, lm
		 * head 576x49152 from memory) */
		return ctx && ctx->pack && kpack_format(type);
	default:
		return false;
	}
}

/* ---- memory ---- */

/*
 * Large buffers (the KV cache, activations, weights in GGUF layout, the
 * packed weights' arena chunks) are anonymous mappings rather than
 * malloc's: committed page by page as they are first touched, and handed
 * back to the system whole when freed, where malloc may keep them in its
 * heap. Nothing here writes them first; malloc would under
 * MALLOC_PERTURB_ (meson sets it for every test), which touched the whole
 * KV pool of every server start. *bytes is set to what was mapped (size
 * rounded up to whole pages), for pages_free. With huge set, the mapping
 * starts on a 2 MiB boundary and asks for transparent huge pages (where
 * the system gives them on request).
 */
static void *pages_alloc(size_t size, bool huge, size_t *bytes)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), align = huge ? HUGE_PAGE : page;
	size_t len, extra;
	uint8_t *p, *start;

	if (size > SIZE_MAX - 2 * align)
		return NULL;
	len = (size + page - 1) / page * page;
	extra = align > page ? align : 0; /* slack to find the boundary in */
	p = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	start = (uint8_t *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
	if (start > p)
		munmap(p, (size_t)(start - p));
	if (p + len + extra > start + len)
		munmap(start + len, (size_t)(p + len + extra - (start + len)));
#ifdef MADV_HUGEPAGE
	if (huge)
		madvise(start, len, MADV_HUGEPAGE);
#endif
	*bytes = len;
	return start;
}

static void pages_free(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes);
}

int cpu_buffer_alloc(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out)
{
	struct loom_buffer *buf;
	size_t rounded;

	if (!ctx || !out || cpu_region_refuses(ctx, "buffer_alloc"))
		return LOOM_ERR_INVALID;
	*out = NULL;
	if (size > SIZE_MAX - 64)
		return LOOM_ERR_NOMEM;
	rounded = size ? (size + 63) & ~(size_t)63 : 64;
	buf = malloc(sizeof(*buf));
	if (!buf)
		return LOOM_ERR_NOMEM;
	buf->arena = NULL;
	buf->mapped = 0;
	/*
	 * No huge pages here: these buffers (the KV cache, activations, the
	 * weights that are not packed) are first touched a little at a
	 * time, and a huge page zeroes 2 MiB at its first touch. A
	 * layer-major KV cache's first token touches a page in each layer's
	 * K and V: SmolLM2 with an 8192-token cache zeroed 120 MiB there,
	 * and a 200-token prompt took 0.43 s instead of 0.12 s on a VM that
	 * backs memory lazily. The packed weights, which stream every step,
	 * keep their huge pages (the arena); an f16 1B-shaped model's
	 * weights here decoded at 12.3-12.5 t/s with them, 12.5-12.7
	 * without.
	 */
	if (rounded >= MAP_MIN)
		buf->ptr = pages_alloc(rounded, false, &buf->mapped);
	else
		buf->ptr = aligned_alloc(64, rounded);
	if (!buf->ptr) {
		free(buf);
		return LOOM_ERR_NOMEM;
	}
	buf->size = size;
	*out = buf;
	return LOOM_OK;
}

int cpu_buffer_alloc_packed(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out)
{
	struct cpu_arena *a = ctx->arena;
	struct loom_buffer *buf;

	if (size > SIZE_MAX - ARENA_CHUNK)
		return LOOM_ERR_NOMEM;
	size = (size + 63) & ~(size_t)63;
	buf = malloc(sizeof(*buf));
	if (!buf)
		return LOOM_ERR_NOMEM;
	if (!a || a->cap - a->used < size) {
		a = calloc(1, sizeof(*a));
		if (a) {
			a->cap = size > ARENA_CHUNK ? size : ARENA_CHUNK;
			/* huge pages: weights stream through them every
			 * step, and 2 MiB pages take most TLB misses out */
			a->base = pages_alloc(a->cap, a->cap >= HUGE_PAGE, &a->mapped);
		}
		if (!a || !a->base) {
			free(a);
			free(buf);
			return LOOM_ERR_NOMEM;
		}
		ctx->arena = a;
	}
	buf->ptr = a->base + a->used;
	buf->size = size;
	buf->arena = a;
	buf->mapped = 0;
	a->used += size;
	a->refs++;
	*out = buf;
	return LOOM_OK;
}

static void cpu_buffer_free(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	/* kept: the region's calls may use it */
	if (!buf || cpu_region_refuses(ctx, "buffer_free"))
		return;
	if (buf->arena) {
		if (--buf->arena->refs == 0) {
			if (ctx && ctx->arena == buf->arena)
				ctx->arena = NULL;
			pages_free(buf->arena->base, buf->arena->mapped);
			free(buf->arena);
		}
	} else if (buf->mapped) {
		pages_free(buf->ptr, buf->mapped);
	} else {
		free(buf->ptr);
	}
	free(buf);
}

void *cpu_buffer_addr(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	return buf ? buf->ptr : NULL;
}

/* ---- row-parallel helper for the elementwise ops ---- */

struct rows_task {
	struct loom_backend_ctx *ctx;
	cpu_rows_fn fn;
	const void *args;
	int64_t rows;
	int64_t n_chunks;
};

/* Chunk c of n covers rows [rows*c/n, rows*(c+1)/n). */
static void rows_task_run(void *arg, int64_t c, int ith)
{
	const struct rows_task *t = arg;
	int64_t r0 = t->rows * c / t->n_chunks, r1 = t->rows * (c + 1) / t->n_chunks;

	(void)ith;
	if (r0 < r1)
		t->fn(t->ctx, t->args, r0, r1);
}

void cpu_run_rows(struct loom_backend_ctx *ctx, cpu_rows_fn fn, const void *args, int64_t rows,
		  double work)
{
	struct rows_task t = { ctx, fn, args, rows, 1 };
	int nth = work >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1;

	if (rows <= 0)
		return;
	if (nth > 1) {
		/* a few chunks per thread, each worth the claim */
		t.n_chunks = (int64_t)nth * 4;
		if (t.n_chunks > rows)
			t.n_chunks = rows;
		if (t.n_chunks > work / (CPU_PAR_MIN_WORK / 4))
			t.n_chunks = (int64_t)(work / (CPU_PAR_MIN_WORK / 4)) + 1;
	}
	cpu_pool_run(&ctx->pool, rows_task_run, &t, t.n_chunks, nth);
}

/* Collectives on host memory through MPI (backends/mpi/coll.c); the
 * pool is idle between operator calls, so nothing races the buffers. */
static int cpu_collective(struct loom_backend_ctx *ctx, const struct loom_collective_args *a)
{
	char why[160];
	int rc;

	/* the host runs distributed steps outside regions */
	if (cpu_region_refuses(ctx, "collective"))
		return LOOM_ERR_INVALID;
	rc = loom_mpi_collective(a, why, sizeof(why));

	if (rc && rc != LOOM_ERR_UNSUPPORTED)
		cpu_log(ctx, LOOM_LOG_ERROR, "cpu: %s", why);
	return rc;
}

/* ---- operator slots: a failure inside a step region fails it ---- */

static int rg_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	return cpu_region_noted(ctx, cpu_gemm(ctx, a));
}

static int rg_embed(struct loom_backend_ctx *ctx, float *out, const void *table, uint32_t type,
		    size_t row_bytes, int64_t n_rows, int64_t dim, const int32_t *ids,
		    int64_t n_ids)
{
	return cpu_region_noted(ctx, cpu_embed(ctx, out, table, type, row_bytes, n_rows, dim,
					       ids, n_ids));
}

static int rg_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride, const float *x,
		      int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps)
{
	return cpu_region_noted(ctx, cpu_rmsnorm(ctx, y, y_stride, x, x_stride, w, rows, n, eps));
}

static int rg_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	return cpu_region_noted(ctx, cpu_rope(ctx, a));
}

static int rg_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
		  int64_t out_stride, const float *gate, int64_t gate_stride, const float *up,
		  int64_t up_stride, int64_t rows, int64_t n)
{
	return cpu_region_noted(ctx, cpu_glu(ctx, kind, out, out_stride, gate, gate_stride, up,
					     up_stride, rows, n));
}

static int rg_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride, const float *a,
		  int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows,
		  int64_t rows, int64_t n)
{
	return cpu_region_noted(ctx, cpu_add(ctx, out, out_stride, a, a_stride, b, b_stride,
					     b_rows, rows, n));
}

static int rg_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		    int64_t n, float s)
{
	return cpu_region_noted(ctx, cpu_scale(ctx, x, stride, rows, n, s));
}

static int rg_softcap(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		      int64_t n, float cap)
{
	return cpu_region_noted(ctx, cpu_softcap(ctx, x, stride, rows, n, cap));
}

static int rg_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a)
{
	return cpu_region_noted(ctx, cpu_kv_write(ctx, a));
}

static int rg_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	return cpu_region_noted(ctx, cpu_attention(ctx, a));
}

static int rg_moe(struct loom_backend_ctx *ctx, const struct loom_moe_args *a)
{
	return cpu_region_noted(ctx, cpu_moe(ctx, a));
}

static const struct loom_backend_ops cpu_ops = {
	.abi_major = LOOM_BACKEND_ABI_MAJOR,
	.abi_minor = LOOM_BACKEND_ABI_MINOR,
	.struct_size = sizeof(struct loom_backend_ops),
	.name = "cpu",
	.create = cpu_create,
	.destroy = cpu_destroy,
	.device_info = cpu_device_info,
	.supports = cpu_supports,
	.buffer_alloc = cpu_buffer_alloc,
	.buffer_free = cpu_buffer_free,
	.buffer_addr = cpu_buffer_addr,
	.upload = cpu_rg_transfer,
	.download = cpu_rg_transfer,
	.copy = cpu_rg_copy,
	.synchronize = cpu_rg_synchronize,
	.gemm = rg_gemm,
	.embed = rg_embed,
	.rmsnorm = rg_rmsnorm,
	.rope = rg_rope,
	.glu = rg_glu,
	.add = rg_add,
	.scale = rg_scale,
	.kv_write = rg_kv_write,
	.attention = rg_attention,
	.graph_begin = cpu_graph_begin,
	.graph_end = cpu_graph_end,
	.weight_pack = cpu_weight_pack,
	.softcap = rg_softcap,
	.collective = cpu_collective,
	.moe = rg_moe,
};

LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
	return &cpu_ops;
}
