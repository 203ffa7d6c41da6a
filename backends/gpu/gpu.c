/*
 * gpu.c: host side of cuda.so and rocm.so (built once per vendor, with
 * GPU_BACKEND_NAME "cuda" or "rocm"). Plain C: the device work goes
 * through gpu_rt.h to kernels.cu; step regions live in gpu_region.c.
 *
 * Arguments are validated exactly like the reference backend (ref_ops.c),
 * before anything is queued. Each operator call becomes a struct call
 * (gpu_ctx.h). Calls whose validity depends on device int32 tables (embed
 * ids, kv_write slots, attention's q_start / kv_len / block_table) have
 * those tables downloaded and checked on the host before anything of
 * theirs runs, so no bad index ever reaches a kernel. A direct call pays
 * one synchronization for that; a step region pays one for all its calls.
 *
 * Decode GEMM (m < BLAS_MIN_M) runs the GEMV kernel straight on the
 * quantized weights, every activation row of the batch in one pass. In
 * fast mode a larger batch of q4_0, q8_0, q4_K or q6_K weights (m up to
 * LOOM_GPU_MMQ_MAX_M, default MMQ_MAX_M) runs the int8 tiled GEMM on the
 * same 8-bit activations, reading the weights in place; its integer dots
 * on int8 tensor cores where the build and device have them (LOOM_GPU_MMA,
 * gpurt_has_mma), else by dp4a, the same bits either way. Prefill with cuBLAS converts the activations to f16
 * and dequantizes panels of f16 or quantized weight rows to f16 for
 * cublasGemmEx (tensor cores, f32 accumulation); f32 and bf16 weights, and
 * every weight with LOOM_GPU_GEMM=f32, go through f32 panels and
 * cublasSgemm (TF32 off). Without a vendor BLAS a tiled f32 kernel runs.
 * Attention runs sequences with at least PREFILL_MIN_Q new rows through
 * the tiled prefill kernel and the rest through split-K.
 *
 * Collectives (ABI 1.4, gpu_coll.c) exist in builds with a collective
 * library and MPI (GPU_COLL): cuda.so with NCCL, the emulators.
 *
 * LOOM_BACKEND_BATCH_INVARIANT: every GEMM goes through GEMV and every
 * attention row through split-K, whose arithmetic for one output row does
 * not depend on the batch around it.
 *
 * Outside exact mode (LOOM_BACKEND_EXACT; LOOM_GPU_EXACT=1 / =0 forces it
 * on / off) a GEMV of q4_0, q8_0, q4_K or q6_K weights quantizes its activations
 * to 8 bits once (blocks of 32, in the scratch) and runs integer dot
 * products; the other formats, and every GEMV in exact mode, dequantize
 * to f32 and multiply in f32 as ref.so does.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ctx.h"
#include "loom/backend_check.h"
#include "loom/moe.h"

#define BLAS_MIN_M 17 /* GEMV up to GEMV_MB (16) rows: one pass, weights read once */
#define MMQ_MAX_M 256 /* fast mode: int8 tiled GEMM up to this m, BLAS panels above */
#define PANEL_BYTES ((size_t)64 << 20)   /* dequantized weight panel */
#define PARTIAL_BYTES ((size_t)64 << 20) /* split-K partial results per launch */
#define PREFILL_MIN_Q 8
#define RING_MAX ((size_t)4 << 20) /* uploads up to this size go through the ring */
#define RING_MIN ((size_t)1 << 20) /* the ring's first size */

struct loom_buffer {
	void *ptr;
	size_t size;
};

void gpu_log(const struct loom_backend_host *host, enum loom_log_level lvl, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!host || !host->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	host->log(host->host, lvl, msg);
}

int rt_failed(struct loom_backend_ctx *ctx, int rc)
{
	if (rc)
		gpu_log(ctx->host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": %s", gpurt_error(ctx->rt));
	return rc;
}

/* A layout of weight_pack's (gpu_rt.h), not a format a caller names. */
static bool is_packed_type(uint32_t type)
{
	return (type & GPU_TYPE_PACKED) != 0;
}

static size_t row_size(int64_t n, uint32_t type, bool *ok)
{
	uint32_t be = gpurt_block_elems(type), bb = gpurt_block_bytes(type);
	uint64_t blocks;

	*ok = n >= 0 && n % be == 0;
	if (!*ok)
		return 0;
	blocks = (uint64_t)n / be;
	*ok = blocks <= (uint64_t)(INT64_MAX / 16) / bb;
	return *ok ? (size_t)(blocks * bb) : 0;
}

/* ---- scratch ---- */

/* Makes the device buffer *buf hold at least n bytes. A new buffer moves
 * the scratch addresses that captured graphs hold, so it retires them. */
static int reserve_dev(struct loom_backend_ctx *ctx, void **buf, size_t *cap, size_t n)
{
	int rc;

	if (*cap >= n)
		return LOOM_OK;
	gpurt_free(ctx->rt, *buf); /* waits for the kernels still using it */
	*buf = NULL;
	*cap = 0;
	ctx->mem_epoch++;
	rc = gpurt_alloc(ctx->rt, n ? n : 64, buf);
	if (rc)
		return rt_failed(ctx, rc);
	*cap = n;
	return LOOM_OK;
}

/* Makes *buf (host) hold at least n bytes. */
static void *reserve_host(void **buf, size_t *cap, size_t n)
{
	void *p;

	if (*cap >= n)
		return *buf;
	p = realloc(*buf, n ? n : 64);
	if (!p)
		return NULL;
	*buf = p;
	*cap = n;
	return p;
}

/* ---- device tables, staged on the host ---- */

/* Asks for n int32 values at dev to be staged (once, however often asked). */
static int want_table(struct loom_backend_ctx *ctx, const int32_t *dev, int64_t n)
{
	size_t bytes = (size_t)n * sizeof(int32_t), off = 0;
	struct fetch *f;

	if (n <= 0)
		return LOOM_OK;
	for (int64_t i = 0; i < ctx->n_fetches; i++) {
		f = &ctx->fetches[i];
		if (f->dev == dev && f->bytes == bytes)
			return LOOM_OK;
		off = f->off + ((f->bytes + 15) & ~(size_t)15);
	}
	/* n was bounded by the argument checks (LOOM_CHECK_LIMIT), the sum
	 * of a step's tables is not */
	if ((uint64_t)n > SIZE_MAX / 8 || off > SIZE_MAX / 2 - bytes)
		return LOOM_ERR_NOMEM;
	if (ctx->n_fetches == ctx->fetches_cap) {
		int64_t cap = ctx->fetches_cap ? 2 * ctx->fetches_cap : 8;

		f = realloc(ctx->fetches, (size_t)cap * sizeof(*f));
		if (!f)
			return LOOM_ERR_NOMEM;
		ctx->fetches = f;
		ctx->fetches_cap = cap;
	}
	ctx->fetches[ctx->n_fetches++] =
		(struct fetch){ .dev = dev, .bytes = bytes, .off = off, .host = NULL };
	return LOOM_OK;
}

/* Counts a wait for the device: every copy queued from the upload ring
 * is done, so the ring is free again (and what it shadows is let go). */
static void waited(struct loom_backend_ctx *ctx)
{
	ctx->n_waits += ctx->n_steps > 0;
	ctx->queued = false;
	ctx->ring_used = 0;
	ctx->n_shadows = 0;
}

/* Forgets what the ring says of device memory: called whenever work
 * that may write device memory has been queued. */
void shadows_clear(struct loom_backend_ctx *ctx)
{
	ctx->n_shadows = 0;
}

/* The shadow holding all of [dev, dev + bytes), or NULL. */
static const void *shadowed(const struct loom_backend_ctx *ctx, const void *dev, size_t bytes)
{
	const char *d = dev;

	for (int64_t i = 0; i < ctx->n_shadows; i++) {
		const struct shadow *sh = &ctx->shadows[i];
		const char *s0 = sh->dev;

		if (d >= s0 && bytes <= sh->bytes && (size_t)(d - s0) <= sh->bytes - bytes)
			return (const char *)ctx->ring + sh->off + (d - s0);
	}
	return NULL;
}

/* Forgets the shadows that overlap [dev, dev + n): new bytes go there. */
static void shadows_drop(struct loom_backend_ctx *ctx, const void *dev, size_t n)
{
	const char *d = dev;
	int64_t kept = 0;

	for (int64_t i = 0; i < ctx->n_shadows; i++) {
		const struct shadow *sh = &ctx->shadows[i];
		const char *s0 = sh->dev;

		if (s0 + sh->bytes <= d || d + n <= s0)
			ctx->shadows[kept++] = *sh;
	}
	ctx->n_shadows = kept;
}

static void shadow_add(struct loom_backend_ctx *ctx, const void *dev, size_t n, size_t off)
{
	shadows_drop(ctx, dev, n);
	if (ctx->n_shadows == ctx->shadows_cap) {
		int64_t cap = ctx->shadows_cap ? 2 * ctx->shadows_cap : 16;
		struct shadow *p = realloc(ctx->shadows, (size_t)cap * sizeof(*p));

		if (!p)
			return; /* not shadowed: the table is downloaded instead */
		ctx->shadows = p;
		ctx->shadows_cap = cap;
	}
	ctx->shadows[ctx->n_shadows++] = (struct shadow){ .dev = dev, .bytes = n, .off = off };
}

/*
 * Queues the upload of n bytes from src to dev through the pinned ring:
 * src is copied there, so the caller may reuse it at once, and the copy
 * is asynchronous (no wait). A full ring waits once (and grows). With
 * keep, the ring's bytes shadow dev's until the next wait, so the table
 * checks read them instead of downloading them again.
 */
static int upload_ring(struct loom_backend_ctx *ctx, void *dev, const void *src, size_t n,
		       bool keep)
{
	size_t off = (ctx->ring_used + 15) & ~(size_t)15;
	int rc;

	if (off > ctx->ring_cap || n > ctx->ring_cap - off) {
		size_t cap = ctx->ring_cap;

		rc = rt_failed(ctx, gpurt_sync(ctx->rt));
		if (rc)
			return rc;
		waited(ctx);
		off = 0;
		if (n > cap) {
			cap = n > 2 * cap ? n : 2 * cap;
			if (cap < RING_MIN)
				cap = RING_MIN;
			gpurt_host_free(ctx->rt, ctx->ring);
			ctx->ring = NULL;
			ctx->ring_cap = 0;
			rc = rt_failed(ctx, gpurt_host_alloc(ctx->rt, cap, &ctx->ring));
			if (rc)
				return rc;
			ctx->ring_cap = cap;
		}
	}
	memcpy((char *)ctx->ring + off, src, n);
	ctx->ring_used = off + n;
	ctx->queued = true;
	rc = rt_failed(ctx, gpurt_upload_async(ctx->rt, dev, (char *)ctx->ring + off, n));
	if (!rc && keep)
		shadow_add(ctx, dev, n, off);
	else
		shadows_drop(ctx, dev, n);
	return rc;
}

/* Stages every wanted table from the first-th on (those before are
 * staged already): from the upload ring when this step uploaded it (no
 * copy, no wait), else downloaded into pinned memory, all in one batch
 * with one wait. A stage that must grow loses what it held, so then every
 * table is staged again. */
static int fetch_tables(struct loom_backend_ctx *ctx, int64_t first)
{
	const struct fetch *last = ctx->n_fetches ? &ctx->fetches[ctx->n_fetches - 1] : NULL;
	size_t total = last ? last->off + last->bytes : 0;
	bool queued = false;
	int rc = LOOM_OK;

	for (int64_t i = first; i < ctx->n_fetches; i++) {
		struct fetch *f = &ctx->fetches[i];

		f->host = shadowed(ctx, f->dev, f->bytes);
		queued |= !f->host;
	}
	if (!total || !queued)
		return LOOM_OK;
	if (ctx->stage_cap < total) {
		gpurt_host_free(ctx->rt, ctx->stage);
		ctx->stage = NULL;
		ctx->stage_cap = 0;
		rc = rt_failed(ctx, gpurt_host_alloc(ctx->rt, total, &ctx->stage));
		if (rc)
			return rc;
		ctx->stage_cap = total;
		for (int64_t i = 0; i < first; i++)
			ctx->fetches[i].host = shadowed(ctx, ctx->fetches[i].dev, ctx->fetches[i].bytes);
		first = 0;
	}
	for (int64_t i = first; i < ctx->n_fetches && !rc; i++) {
		struct fetch *f = &ctx->fetches[i];

		if (f->host)
			continue;
		f->host = (char *)ctx->stage + f->off;
		rc = gpurt_download_async(ctx->rt, (char *)ctx->stage + f->off, f->dev, f->bytes);
	}
	if (!rc)
		rc = gpurt_sync(ctx->rt);
	if (!rc)
		waited(ctx);
	return rt_failed(ctx, rc);
}

/* The staged copy of a table fetch_tables staged. */
static const int32_t *staged(const struct loom_backend_ctx *ctx, const int32_t *dev, int64_t n)
{
	size_t bytes = (size_t)n * sizeof(int32_t);

	for (int64_t i = 0; i < ctx->n_fetches; i++)
		if (ctx->fetches[i].dev == dev && ctx->fetches[i].bytes == bytes)
			return (const int32_t *)ctx->fetches[i].host;
	return NULL; /* only for n == 0: nothing to read */
}

/* ---- context ---- */

static void gpu_destroy(struct loom_backend_ctx *ctx)
{
	if (!ctx)
		return;
	if (ctx->n_captured || ctx->n_replayed || ctx->n_direct)
		gpu_log(ctx->host, LOOM_LOG_INFO,
			GPU_BACKEND_NAME ": step graphs: %llu captured, %llu replays, "
			"%llu steps run directly",
			(unsigned long long)ctx->n_captured, (unsigned long long)ctx->n_replayed,
			(unsigned long long)ctx->n_direct);
	if (ctx->n_steps) /* the line cpu.so logs too (tests/backend/cpu_fuse.c reads it) */
		gpu_log(ctx->host, LOOM_LOG_INFO,
			GPU_BACKEND_NAME ": step regions: %llu run, %llu gemm groups of %llu calls",
			(unsigned long long)ctx->n_steps, (unsigned long long)ctx->n_groups,
			(unsigned long long)ctx->n_group_calls);
	if (ctx->n_mmq_mma || ctx->n_mmq_dp4a) /* tests/backend/gpu_mma.c reads it */
		gpu_log(ctx->host, LOOM_LOG_INFO,
			GPU_BACKEND_NAME ": int8 GEMM: %llu launches on tensor cores (MMA), "
			"%llu by dp4a", (unsigned long long)ctx->n_mmq_mma,
			(unsigned long long)ctx->n_mmq_dp4a);
	if (ctx->n_steps)
		gpu_log(ctx->host, LOOM_LOG_INFO,
			GPU_BACKEND_NAME ": rope and kv_write: %llu launches of %llu calls",
			(unsigned long long)ctx->n_rope_kv, (unsigned long long)ctx->n_rope_kv_calls);
	gpu_log(ctx->host, LOOM_LOG_DEBUG,
		GPU_BACKEND_NAME ": kernel launches: %llu queued one by one (graph replays not "
		"counted)", (unsigned long long)gpurt_launches(ctx->rt));
	if (ctx->n_steps)
		gpu_log(ctx->host, LOOM_LOG_INFO,
			GPU_BACKEND_NAME ": host waits: %llu in %llu step regions (from the first on)",
			(unsigned long long)ctx->n_waits, (unsigned long long)ctx->n_steps);
	if (ctx->n_sampled)
		gpu_log(ctx->host, LOOM_LOG_INFO, GPU_BACKEND_NAME ": rows sampled on the device: %llu",
			(unsigned long long)ctx->n_sampled);
	if (ctx->n_packed)
		gpu_log(ctx->host, LOOM_LOG_INFO,
			GPU_BACKEND_NAME ": weights packed (q4_0/q8_0/q6_K, 16-byte aligned quants): %llu, "
			"%.1f MiB", (unsigned long long)ctx->n_packed,
			(double)ctx->packed_bytes / (1 << 20));
	regions_free(ctx);
	colls_free(ctx);
	gpurt_free(ctx->rt, ctx->scratch);
	gpurt_free(ctx->rt, ctx->items);
	gpurt_host_free(ctx->rt, ctx->stage);
	gpurt_host_free(ctx->rt, ctx->ring);
	for (int64_t i = 0; i < ctx->n_rope_tabs; i++)
		gpurt_free(ctx->rt, ctx->rope_tabs[i].dev);
	free(ctx->rope_tabs);
	gpurt_close(ctx->rt);
	free(ctx->shadows);
	free(ctx->moe_tabs);
	free(ctx->hitems);
	free(ctx->fetches);
	packs_free(ctx);
	free(ctx);
}

static bool env_is(const char *name, const char *value)
{
	const char *v = getenv(name);

	return v && !strcmp(v, value);
}

/* An integer setting from the environment in [lo, hi]; def when unset or
 * not a whole number in range. */
static int64_t env_int(const char *name, int64_t def, int64_t lo, int64_t hi)
{
	const char *v = getenv(name);
	char *end;
	long long n;

	if (!v || !*v)
		return def;
	n = strtoll(v, &end, 10);
	return *end || n < lo || n > hi ? def : (int64_t)n;
}

/*
 * The device of this process when the host asked for the default (0):
 * under a launcher that says which local rank this is (Open MPI, MPICH,
 * Slurm), local rank % devices, so that the ranks of one host spread over
 * its GPUs (NCCL refuses two ranks on one device) without a
 * CUDA_VISIBLE_DEVICES per rank. n devices are visible.
 */
static int default_device(int n)
{
	static const char *const vars[] = { "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
					    "SLURM_LOCALID" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		char *end;
		long r;

		if (!v || !*v)
			continue;
		r = strtol(v, &end, 10);
		if (*end || r < 0 || r > INT32_MAX)
			return 0;
		return (int)(r % n);
	}
	return 0;
}

static int gpu_create(const struct loom_backend_host *host, const struct loom_backend_config *cfg,
		      struct loom_backend_ctx **out)
{
	struct loom_backend_ctx *ctx;
	char why[256] = "";
	int n = 0, device = 0, rc;

	if (!out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	if (!host || host->abi_major != LOOM_BACKEND_ABI_MAJOR ||
	    !LOOM_ARGS_HAS(host, struct loom_backend_host, to_float)) {
		gpu_log(host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": incompatible host services table");
		return LOOM_ERR_INVALID;
	}
	if (cfg && cfg->struct_size >= sizeof(*cfg))
		device = cfg->device;
	if (gpurt_device_count(&n, why, sizeof(why)) || n <= 0) {
		gpu_log(host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": no %s device or driver found: %s",
			gpurt_vendor(), n <= 0 && !why[0] ? "no devices" : why);
		return LOOM_ERR_DEVICE;
	}
	if (device == 0)
		device = default_device(n);
	if (device < 0 || device >= n) {
		gpu_log(host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": no %s device %d (%d found)",
			gpurt_vendor(), device, n);
		return LOOM_ERR_DEVICE;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return LOOM_ERR_NOMEM;
	ctx->host = host;
	ctx->invariant = cfg && cfg->struct_size >= sizeof(*cfg) &&
			 (cfg->flags & LOOM_BACKEND_BATCH_INVARIANT);
	ctx->exact = cfg && cfg->struct_size >= sizeof(*cfg) && (cfg->flags & LOOM_BACKEND_EXACT);
	if (getenv("LOOM_GPU_EXACT")) /* tests: =1 exact mode, =0 fast mode */
		ctx->exact = env_is("LOOM_GPU_EXACT", "1");
	/* LOOM_GPU_GEMM=f32 keeps prefill in f32 (no tensor cores) */
	ctx->half_gemm = gpurt_has_blas() && !env_is("LOOM_GPU_GEMM", "f32");
	ctx->graphs_on = !env_is("LOOM_GPU_GRAPHS", "0");
	ctx->fuse = !env_is("LOOM_GPU_FUSE", "0");
	ctx->pack = !env_is("LOOM_GPU_PACK", "0");
	ctx->mmq_max_m = env_int("LOOM_GPU_MMQ_MAX_M", MMQ_MAX_M, 0, 65535 * 64);
	rc = gpurt_open(device, &ctx->rt, why, sizeof(why));
	if (rc) {
		gpu_log(host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": %s", why);
		free(ctx);
		return rc;
	}
	/* LOOM_GPU_MMA=0: the int8 GEMM's dots by dp4a where the tensor-core
	 * MMA exists too (the two give the same bits) */
	ctx->mma = !env_is("LOOM_GPU_MMA", "0") && gpurt_has_mma(ctx->rt);
	if (env_is("LOOM_GPU_MMA", "1") && !ctx->mma)
		gpu_log(host, LOOM_LOG_INFO, GPU_BACKEND_NAME ": LOOM_GPU_MMA=1: no int8 "
			"tensor-core MMA in this build or on this device; the int8 GEMM uses dp4a");
	gpu_log(host, LOOM_LOG_INFO, GPU_BACKEND_NAME ": %s device %d%s, %s, prefill GEMM %s, %s, %s",
		gpurt_vendor(), device, ctx->invariant ? ", batch invariant" : "",
		ctx->exact ? "exact (f32 activations)" :
		ctx->mma ? "8-bit activations and integer dots in the GEMV and GEMM of every "
			   "quantized format but mxfp4 (q2_K: GEMV only; int8 GEMM on tensor cores)" :
		"8-bit activations and integer dots in the GEMV and GEMM of every quantized "
		"format but mxfp4 (q2_K: GEMV only)",
		!gpurt_has_blas() ? "tiled f32 kernel" :
		ctx->half_gemm ? "f16/bf16 tensor cores (f32 for f32 weights)" : "f32 BLAS",
		ctx->graphs_on ? "step graphs on" : "step graphs off",
		ctx->pack ? "q4_0/q8_0/q6_K weights repacked" : "weights in GGUF layout");
	*out = ctx;
	return LOOM_OK;
}

static int gpu_device_info(struct loom_backend_ctx *ctx, struct loom_device_info *out)
{
	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	memset(out, 0, sizeof(*out));
	return rt_failed(ctx, gpurt_info(ctx->rt, out->name, sizeof(out->name), &out->mem_total,
					 &out->mem_free));
}

/* LOOM_GPU_SAMPLE_19=0 answers no to both generation 1.9 sample ops
 * (the host then keeps those rows, as with a 1.8 backend). */
static bool sample_19_off(void)
{
	const char *v = getenv("LOOM_GPU_SAMPLE_19");

	return v && !strcmp(v, "0");
}

static bool gpu_supports(struct loom_backend_ctx *ctx, enum loom_op op, uint32_t type)
{
	/* ABI 1.8: token trees, attention sinks and the clamped SwiGLU are
	 * all in the GPU kernels */
	if (!ctx || (unsigned)op >= LOOM_OP_COUNT)
		return false;
	/* ABI 1.5: a tied table packed by weight_pack, read by embed too (the
	 * same decoders, rows picked by id) */
	if (op == LOOM_OP_EMBED_PACKED)
		return ctx->pack && gpurt_packed_row(type, 256) != 0;
	if (op == LOOM_OP_GEMM || op == LOOM_OP_EMBED)
		return gpurt_format_known(type);
	/* ABI 1.9: k_sample draws without top-k and computes logprobs */
	if (op == LOOM_OP_SAMPLE_FULL || op == LOOM_OP_SAMPLE_LOGPROBS)
		return type == LOOM_TYPE_F32 && !sample_19_off();
	/* token trees (ABI 1.8): every KV type, rows through split-K */
	if (op == LOOM_OP_KV_WRITE || op == LOOM_OP_ATTENTION || op == LOOM_OP_ATTENTION_TREE)
		return loom_check_kv_type(type, 32) == LOOM_OK; /* ABI 1.3 KV types */
	return type == LOOM_TYPE_F32;
}

/* ---- memory ---- */

int gpu_buffer_alloc(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out)
{
	struct loom_buffer *buf;
	int rc;

	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	if (ctx->in_region)
		return refused_in_region(ctx, "buffer_alloc");
	if (size > SIZE_MAX - 64)
		return LOOM_ERR_NOMEM;
	buf = malloc(sizeof(*buf));
	if (!buf)
		return LOOM_ERR_NOMEM;
	/* the runtimes align allocations to 256 bytes or more */
	rc = gpurt_alloc(ctx->rt, size ? size : 64, &buf->ptr);
	if (rc) {
		rt_failed(ctx, rc);
		free(buf);
		return rc;
	}
	buf->size = size;
	*out = buf;
	return LOOM_OK;
}

void gpu_buffer_free(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	if (!ctx || !buf)
		return;
	if (ctx->in_region) {
		/* kept: the region's calls may use it; the host leaks it */
		refused_in_region(ctx, "buffer_free");
		return;
	}
	shadows_drop(ctx, buf->ptr, buf->size ? buf->size : 1); /* the address may come back */
	gpu_pack_forget(ctx, buf->ptr);
	gpurt_free(ctx->rt, buf->ptr);
	free(buf);
}

void *gpu_buffer_addr(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	return buf ? buf->ptr : NULL;
}

static int gpu_upload(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	int rc;

	if (!ctx || (n && (!dst || !src)))
		return LOOM_ERR_INVALID;
	if (ctx->in_region)
		return refused_in_region(ctx, "upload");
	if (!n)
		return LOOM_OK;
	if (n <= RING_MAX)
		return upload_ring(ctx, dst, src, n, true);
	shadows_drop(ctx, dst, n);
	rc = rt_failed(ctx, gpurt_upload(ctx->rt, dst, src, n));
	if (!rc)
		waited(ctx);
	return rc;
}

static int gpu_download(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	int rc;

	if (!ctx || (n && (!dst || !src)))
		return LOOM_ERR_INVALID;
	if (ctx->in_region)
		return refused_in_region(ctx, "download");
	if (!n)
		return LOOM_OK;
	rc = rt_failed(ctx, gpurt_download(ctx->rt, dst, src, n));
	if (!rc)
		waited(ctx);
	return rc;
}

static int gpu_synchronize(struct loom_backend_ctx *ctx)
{
	int rc;

	if (!ctx)
		return LOOM_ERR_INVALID;
	if (ctx->in_region)
		return refused_in_region(ctx, "synchronize");
	if (!ctx->queued)
		return LOOM_OK; /* nothing queued since the last wait */
	rc = rt_failed(ctx, gpurt_sync(ctx->rt));
	if (!rc)
		waited(ctx);
	return rc;
}

/* ---- running a call ---- */

/* Inside a region: records the call. Outside: prepares and runs it now. */
static int submit(struct loom_backend_ctx *ctx, const struct call *c)
{
	struct attn_plan plan;
	int rc;

	if (ctx->in_region)
		return region_add(ctx, c);
	memset(&plan, 0, sizeof(plan));
	rc = prepare_calls(ctx, c, &plan, 1);
	return rc ? rc : exec_calls(ctx, c, &plan, 1);
}

/* A zeroed call of the given kind (see struct call on padding). */
static struct call new_call(enum call_kind kind)
{
	struct call c;

	memset(&c, 0, sizeof(c));
	c.kind = kind;
	return c;
}

static int do_copy(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	struct call c = new_call(CALL_COPY);

	if (!ctx || (n && (!dst || !src)))
		return LOOM_ERR_INVALID;
	if (n == 0)
		return LOOM_OK;
	c.u.copy.dst = dst;
	c.u.copy.src = src;
	c.u.copy.n = n;
	return submit(ctx, &c);
}

/* ---- gemm and embed ---- */

/* Element type of a prefill GEMM. */
enum gemm_elem { ELEM_F32, ELEM_F16, ELEM_BF16 };

/* f32 weights, LOOM_GPU_GEMM=f32 and builds without BLAS: f32; bf16
 * weights: bf16 tensor cores; f16 and quantized weights: f16 tensor
 * cores. A dequantized weight (scale x quant, + min) is rounded to f16
 * (about 2^-11 relative), like the activations: within the conformance
 * tolerances (1e-5 f16, 5e-4 quantized), and the reason LOOM_GPU_GEMM=f32
 * exists. */
static enum gemm_elem gemm_elem(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	if (!ctx->half_gemm || a->w_type == LOOM_TYPE_F32)
		return ELEM_F32;
	return a->w_type == LOOM_TYPE_BF16 ? ELEM_BF16 : ELEM_F16;
}

static size_t elem_size(enum gemm_elem e)
{
	return e == ELEM_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Whether the weights already are the GEMM's element type, rows a whole
 * number of elements apart: then the BLAS reads them in place. */
static bool gemm_in_place(const struct loom_gemm_args *a, enum gemm_elem e)
{
	const uint32_t same = e == ELEM_F32 ? LOOM_TYPE_F32 :
			      e == ELEM_F16 ? LOOM_TYPE_F16 : LOOM_TYPE_BF16;

	return a->w_type == same && a->w_stride % elem_size(e) == 0 &&
	       (uintptr_t)a->w % elem_size(e) == 0;
}

static bool gemm_is_gemv(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	return ctx->invariant || a->m < BLAS_MIN_M || a->k == 0;
}

/* Whether a GEMV runs on 8-bit activations (fast mode, a format with an
 * integer kernel). */
static bool gemv_q8(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	return !ctx->exact && a->k > 0 && gpurt_gemv_q8_format(a->w_type);
}

/* Whether a GEMM past the GEMV runs the int8 tiled kernel. */
static bool gemm_mmq(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	return !gemm_is_gemv(ctx, a) && gemv_q8(ctx, a) && gpurt_mmq_format(a->w_type) &&
	       a->m <= ctx->mmq_max_m;
}

/* Scratch of the 8-bit activations: [m x k int8][m x k/32 scales of 8
 * bytes], the scales 16-byte aligned; *qs_bytes is where they start.
 * False on overflow. */
static bool q8_scratch(const struct loom_gemm_args *a, size_t *qs_bytes, size_t *bytes)
{
	size_t qs, scales;

	if (__builtin_mul_overflow((size_t)a->m, (size_t)a->k, &qs) ||
	    __builtin_add_overflow(qs, (size_t)15, &qs) ||
	    __builtin_mul_overflow((size_t)a->m, (size_t)(a->k / 32) * 8, &scales))
		return false;
	qs &= ~(size_t)15;
	*qs_bytes = qs;
	return !__builtin_add_overflow(qs, scales, bytes);
}

/* Weight rows per panel and the scratch a prefill GEMM needs:
 * [activations as f16/bf16, m x k, unless f32][panel, rows x k, unless
 * the weights are read in place]. False on overflow. */
static bool gemm_scratch(const struct loom_gemm_args *a, enum gemm_elem e, int64_t *rows_out,
			 size_t *bytes)
{
	const size_t es = elem_size(e);
	int64_t rows = (int64_t)(PANEL_BYTES / es) / a->k;
	size_t x_bytes, panel_bytes;

	if (rows < 1)
		rows = 1;
	if (rows > a->n)
		rows = a->n;
	*rows_out = rows;
	/* m x k floats already exist as the caller's activations, so m x k
	 * halves fit in size_t; only the sum needs a check */
	x_bytes = e != ELEM_F32 ? (size_t)a->m * (size_t)a->k * es : 0;
	panel_bytes = gemm_in_place(a, e) ? 0 : (size_t)rows * (size_t)a->k * es;
	*bytes = x_bytes + panel_bytes;
	return x_bytes <= SIZE_MAX - panel_bytes;
}

/* y[:, j0 .. j0 + n) from weight rows p (ldp elements apart) of type e. */
static int gemm_blas(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a,
		     enum gemm_elem e, int64_t j0, int64_t n, const void *p, int64_t ldp)
{
	if (e == ELEM_F32)
		return gpurt_sgemm(ctx->rt, a->m, n, a->k, a->x, a->x_stride, p, ldp, a->y + j0,
				   a->y_stride);
	return gpurt_hgemm(ctx->rt, a->m, n, a->k, ctx->scratch, p, ldp, e == ELEM_BF16,
			   a->y + j0, a->y_stride);
}

/*
 * Prefill through the vendor BLAS (or the tiled kernel): activations are
 * converted to f16/bf16 once unless the GEMM is f32; weights that already
 * have the element type are read in place, others are dequantized on the
 * device in panels of rows, one GEMM per panel.
 */
static int gemm_panels(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	const enum gemm_elem e = gemm_elem(ctx, a);
	const size_t es = elem_size(e);
	int64_t rows;
	size_t need;
	void *panel;
	int rc;

	if (!gemm_scratch(a, e, &rows, &need))
		return LOOM_ERR_NOMEM;
	rc = reserve_dev(ctx, &ctx->scratch, &ctx->scratch_cap, need);
	if (rc)
		return rc;
	if (e != ELEM_F32)
		rc = rt_failed(ctx, gpurt_to_half(ctx->rt, a->x, a->x_stride, a->m, a->k,
						  e == ELEM_BF16, ctx->scratch));
	if (!rc && gemm_in_place(a, e))
		return rt_failed(ctx, gemm_blas(ctx, a, e, 0, a->n, a->w,
						(int64_t)(a->w_stride / es)));
	panel = (char *)ctx->scratch + (e != ELEM_F32 ? (size_t)a->m * (size_t)a->k * es : 0);
	for (int64_t j0 = 0; j0 < a->n && !rc; j0 += rows) {
		int64_t r = a->n - j0 < rows ? a->n - j0 : rows;
		const char *w = (const char *)a->w + (size_t)j0 * a->w_stride;

		if (e == ELEM_F32)
			rc = gpurt_dequant(ctx->rt, a->w_type, w, a->w_stride, a->k, r, NULL, panel,
					   a->k);
		else
			rc = gpurt_dequant_half(ctx->rt, a->w_type, w, a->w_stride, a->k, r, panel,
						a->k);
		if (!rc)
			rc = gemm_blas(ctx, a, e, j0, r, panel, a->k);
		rt_failed(ctx, rc);
	}
	return rc;
}

int gemv_q8_buffers(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a, int8_t **qs,
		    void **scale)
{
	size_t qs_bytes, need;
	int rc;

	if (!q8_scratch(a, &qs_bytes, &need))
		return LOOM_ERR_NOMEM;
	rc = reserve_dev(ctx, &ctx->scratch, &ctx->scratch_cap, need); /* reserved already */
	if (rc)
		return rc;
	*qs = ctx->scratch;
	*scale = (char *)ctx->scratch + qs_bytes;
	return LOOM_OK;
}

int gemv_quantize(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a, int8_t **qs,
		  void **scale)
{
	int rc = gemv_q8_buffers(ctx, a, qs, scale);

	return rc ? rc : rt_failed(ctx, gpurt_quantize_q8(ctx->rt, a->x, a->x_stride, a->m, a->k,
							  *qs, *scale));
}

bool gemm_groupable(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a, bool *q8)
{
	*q8 = gemv_q8(ctx, a);
	return gemm_is_gemv(ctx, a) && a->k > 0;
}

/* Fast GEMV or int8 GEMM (mmq): the activations to 8 bits once, then the
 * integer kernel. */
static int exec_gemv_q8(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a, bool mmq)
{
	int8_t *qs;
	void *scale;
	int rc = gemv_quantize(ctx, a, &qs, &scale);

	if (!rc && mmq) {
		rc = rt_failed(ctx, gpurt_mmq(ctx->rt, a, qs, scale, ctx->mma));
		if (!rc)
			ctx->mma ? ctx->n_mmq_mma++ : ctx->n_mmq_dp4a++;
	}
	else if (!rc)
		rc = rt_failed(ctx, gpurt_gemv_q8(ctx->rt, a, qs, scale));
	return rc;
}

static int exec_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	if (gemm_is_gemv(ctx, a) && gemv_q8(ctx, a))
		return exec_gemv_q8(ctx, a, false);
	if (gemm_mmq(ctx, a))
		return exec_gemv_q8(ctx, a, true);
	if (gemm_is_gemv(ctx, a))
		return rt_failed(ctx, gpurt_gemv(ctx->rt, a));
	return gemm_panels(ctx, a);
}

static int do_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	struct call c = new_call(CALL_GEMM);
	struct loom_gemm_args *g = &c.u.gemm;
	uint32_t type;
	size_t w_row, w_stride;
	bool ok;

	if (!ctx || !a || a->struct_size < LOOM_GEMM_ARGS_MIN_SIZE || a->m < 0 || a->n < 0 ||
	    a->k < 0)
		return LOOM_ERR_INVALID;
	if (!gpurt_format_known(a->w_type))
		return LOOM_ERR_UNSUPPORTED;
	type = a->w_type;
	w_stride = a->w_stride;
	/* a packed weight: the kernels read its layout type, rows its stride apart */
	if (LOOM_GEMM_PACKED(a) && gpu_pack_view(ctx, a->w, a->w_type, a->n, a->k, &type,
						 &w_stride))
		return LOOM_ERR_INVALID;
	w_row = LOOM_GEMM_PACKED(a) ? w_stride : row_size(a->k, a->w_type, &ok);
	if (LOOM_GEMM_PACKED(a))
		ok = true;
	if (!ok || w_stride < w_row || !loom_check_bytes(a->n, w_row, w_stride) ||
	    !loom_check_shape(a->m, a->k, a->x_stride) || !loom_check_shape(a->m, a->n, a->y_stride))
		return LOOM_ERR_INVALID;
	if (a->m == 0 || a->n == 0)
		return LOOM_OK;
	if (!a->x || !a->y || (!a->w && a->k > 0))
		return LOOM_ERR_INVALID;
	g->struct_size = sizeof(*g);
	g->w_type = type;
	g->m = a->m, g->n = a->n, g->k = a->k;
	g->w = a->w, g->w_stride = w_stride;
	g->x = a->x, g->x_stride = a->x_stride;
	g->y = a->y, g->y_stride = a->y_stride;
	return submit(ctx, &c);
}

static int exec_embed(struct loom_backend_ctx *ctx, const struct embed_call *e)
{
	if (e->dim == 0)
		return LOOM_OK;
	return rt_failed(ctx, gpurt_dequant(ctx->rt, e->type, e->table, e->row_bytes, e->dim,
					    e->n_ids, e->ids, e->out, e->dim));
}

static int check_ids(const struct loom_backend_ctx *ctx, const struct embed_call *e)
{
	const int32_t *h = staged(ctx, e->ids, e->n_ids);

	for (int64_t i = 0; i < e->n_ids; i++)
		if (h[i] < 0 || h[i] >= e->n_rows)
			return LOOM_ERR_INVALID;
	return LOOM_OK;
}

static int do_embed(struct loom_backend_ctx *ctx, float *out, const void *table, uint32_t type,
		    size_t row_bytes, int64_t n_rows, int64_t dim, const int32_t *ids,
		    int64_t n_ids)
{
	struct call c = new_call(CALL_EMBED);
	struct embed_call *e = &c.u.embed;
	size_t need;
	bool ok;

	if (!ctx || n_rows < 0 || dim < 0 || n_ids < 0)
		return LOOM_ERR_INVALID;
	if (!gpurt_format_known(type))
		return LOOM_ERR_UNSUPPORTED;
	/* row_bytes 0: a table weight_pack packed (ABI 1.5), read in its layout */
	if (row_bytes == 0 && dim > 0 &&
	    gpu_pack_view(ctx, table, type, n_rows, dim, &type, &row_bytes))
		return LOOM_ERR_INVALID;
	need = row_bytes && is_packed_type(type) ? row_bytes : row_size(dim, type, &ok);
	if (is_packed_type(type))
		ok = true;
	if (!ok || row_bytes < need || !loom_check_bytes(n_rows, need, row_bytes) ||
	    !loom_check_shape(n_ids, dim, dim))
		return LOOM_ERR_INVALID;
	if (n_ids == 0)
		return LOOM_OK;
	if (!out || !ids || (!table && dim > 0))
		return LOOM_ERR_INVALID;
	e->out = out, e->table = table, e->ids = ids, e->row_bytes = row_bytes;
	e->n_rows = n_rows, e->dim = dim, e->n_ids = n_ids, e->type = type;
	return submit(ctx, &c);
}

/* ---- row and elementwise operators ---- */

static int exec_rows(struct loom_backend_ctx *ctx, enum call_kind kind, const struct rows_call *r)
{
	switch (kind) {
	case CALL_RMSNORM:
		return rt_failed(ctx, gpurt_rmsnorm(ctx->rt, r->y, r->y_stride, r->x, r->x_stride,
						    r->w, r->rows, r->n, r->eps));
	case CALL_GLU:
		return rt_failed(ctx, gpurt_glu(ctx->rt, (enum loom_glu_kind)r->kind, r->y,
						r->y_stride, r->x, r->x_stride, r->w, r->w_stride,
						r->rows, r->n));
	case CALL_ADD:
		return rt_failed(ctx, gpurt_add(ctx->rt, r->y, r->y_stride, r->x, r->x_stride, r->w,
						r->w_stride, r->b_rows, r->rows, r->n));
	case CALL_SCALE:
		return rt_failed(ctx, gpurt_scale(ctx->rt, r->y, r->y_stride, r->rows, r->n, r->s));
	case CALL_SOFTCAP:
		return rt_failed(ctx, gpurt_softcap(ctx->rt, r->y, r->y_stride, r->rows, r->n, r->s));
	default:
		return LOOM_ERR_INVALID;
	}
}

/* Submits a checked rows_call, copied field by field into a zeroed call. */
static int submit_rows(struct loom_backend_ctx *ctx, enum call_kind kind, const struct rows_call *r)
{
	struct call c = new_call(kind);
	struct rows_call *d = &c.u.rows;

	d->y = r->y, d->x = r->x, d->w = r->w;
	d->y_stride = r->y_stride, d->x_stride = r->x_stride, d->w_stride = r->w_stride;
	d->b_rows = r->b_rows, d->rows = r->rows, d->n = r->n;
	d->eps = r->eps, d->s = r->s, d->kind = r->kind;
	return submit(ctx, &c);
}

static int do_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride, const float *x,
		      int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps)
{
	if (!ctx || !loom_check_shape(rows, n, x_stride) || !loom_check_shape(rows, n, y_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!y || !x || !w)
		return LOOM_ERR_INVALID;
	return submit_rows(ctx, CALL_RMSNORM, &(struct rows_call){
		.y = y, .y_stride = y_stride, .x = x, .x_stride = x_stride, .w = w,
		.rows = rows, .n = n, .eps = eps });
}

static int do_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
		  int64_t out_stride, const float *gate, int64_t gate_stride, const float *up,
		  int64_t up_stride, int64_t rows, int64_t n)
{
	if (!ctx || (kind != LOOM_GLU_SILU && kind != LOOM_GLU_GELU_TANH &&
		     kind != LOOM_GLU_SWIGLU_OAI))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(rows, n, out_stride) || !loom_check_shape(rows, n, gate_stride) ||
	    !loom_check_shape(rows, n, up_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !gate || !up)
		return LOOM_ERR_INVALID;
	return submit_rows(ctx, CALL_GLU, &(struct rows_call){
		.y = out, .y_stride = out_stride, .x = gate, .x_stride = gate_stride, .w = up,
		.w_stride = up_stride, .rows = rows, .n = n, .kind = (int32_t)kind });
}

static int do_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride, const float *a,
		  int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows, int64_t rows,
		  int64_t n)
{
	if (!ctx || (b_rows != 1 && b_rows != rows))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(rows, n, out_stride) || !loom_check_shape(rows, n, a_stride) ||
	    !loom_check_shape(b_rows, n, b_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !a || !b)
		return LOOM_ERR_INVALID;
	return submit_rows(ctx, CALL_ADD, &(struct rows_call){
		.y = out, .y_stride = out_stride, .x = a, .x_stride = a_stride, .w = b,
		.w_stride = b_stride, .b_rows = b_rows, .rows = rows, .n = n });
}

static int do_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		    int64_t n, float s)
{
	if (!ctx || !loom_check_shape(rows, n, stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!x)
		return LOOM_ERR_INVALID;
	return submit_rows(ctx, CALL_SCALE, &(struct rows_call){
		.y = x, .y_stride = stride, .rows = rows, .n = n, .s = s });
}

/* x = cap * tanh(x / cap) (ABI 1.2); the cap rides in scale's field. */
static int do_softcap(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		      int64_t n, float cap)
{
	if (!ctx || !loom_check_shape(rows, n, stride) || !(cap > 0.0f) || isinf(cap))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!x)
		return LOOM_ERR_INVALID;
	return submit_rows(ctx, CALL_SOFTCAP, &(struct rows_call){
		.y = x, .y_stride = stride, .rows = rows, .n = n, .s = cap });
}

static int do_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	struct call c = new_call(CALL_ROPE);
	struct loom_rope_args *r = &c.u.rope;
	int rc = ctx ? loom_check_rope(a) : LOOM_ERR_INVALID;

	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	r->struct_size = sizeof(*r);
	r->mode = a->mode;
	r->x = a->x;
	r->n_tokens = a->n_tokens, r->n_heads = a->n_heads, r->head_dim = a->head_dim;
	r->n_rot = a->n_rot, r->row_stride = a->row_stride;
	r->pos = a->pos;
	r->freq_base = a->freq_base, r->freq_scale = a->freq_scale;
	r->freq_factors = a->freq_factors;
	return submit(ctx, &c);
}

/* Computes a table on the host (pow in double, as ref.so's rope_head
 * does, so exact mode's angles are ref.so's) and uploads it. */
static int rope_table_make(struct loom_backend_ctx *ctx, const struct loom_rope_args *a,
			   struct rope_tab *e)
{
	int64_t half = a->n_rot / 2;
	size_t bytes = (size_t)half * (sizeof(double) + 2 * sizeof(float));
	double *inv = malloc(bytes);
	float *inv_f = (float *)(inv + half), *inv_lo = inv_f + half;
	int rc = inv ? rt_failed(ctx, gpurt_alloc(ctx->rt, bytes, &e->dev)) : LOOM_ERR_NOMEM;

	for (int64_t i = 0; !rc && i < half; i++) {
		inv[i] = pow(a->freq_base, -2.0 * (double)i / (double)a->n_rot);
		inv_f[i] = (float)inv[i];
		inv_lo[i] = (float)(inv[i] - (double)inv_f[i]);
	}
	if (!rc)
		rc = rt_failed(ctx, gpurt_upload(ctx->rt, e->dev, inv, bytes));
	if (rc && e->dev)
		gpurt_free(ctx->rt, e->dev);
	free(inv);
	e->base = a->freq_base;
	e->n_rot = a->n_rot;
	return rc;
}

int rope_table(struct loom_backend_ctx *ctx, const struct loom_rope_args *a, bool make,
	       struct gpurt_rope_table *t)
{
	struct rope_tab *e = NULL, *tabs;
	int rc;

	for (int64_t i = 0; i < ctx->n_rope_tabs && !e; i++)
		if (ctx->rope_tabs[i].n_rot == a->n_rot &&
		    !memcmp(&ctx->rope_tabs[i].base, &a->freq_base, sizeof(float)))
			e = &ctx->rope_tabs[i];
	if (!e && !make)
		return LOOM_ERR_INVALID; /* prepare_calls made every table */
	if (!e) {
		tabs = realloc(ctx->rope_tabs, (size_t)(ctx->n_rope_tabs + 1) * sizeof(*tabs));
		if (!tabs)
			return LOOM_ERR_NOMEM;
		ctx->rope_tabs = tabs;
		e = &tabs[ctx->n_rope_tabs];
		memset(e, 0, sizeof(*e));
		rc = rope_table_make(ctx, a, e);
		if (rc)
			return rc;
		ctx->n_rope_tabs++;
	}
	t->inv = e->dev;
	t->inv_f = (const float *)(t->inv + a->n_rot / 2);
	t->inv_lo = t->inv_f + a->n_rot / 2;
	t->fast = !ctx->exact;
	return LOOM_OK;
}

static int exec_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	struct gpurt_rope_table t;
	int rc = rope_table(ctx, a, false, &t);

	return rc ? rc : rt_failed(ctx, gpurt_rope(ctx->rt, a, &t));
}

static int do_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a)
{
	struct call c = new_call(CALL_KV_WRITE);
	struct loom_kv_write_args *k = &c.u.kv;
	int rc = ctx ? loom_check_kv_write(a) : LOOM_ERR_INVALID;

	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	k->kv_type = LOOM_KV_TYPE(a, struct loom_kv_write_args);
	rc = loom_check_kv_type(k->kv_type, a->kv_dim);
	if (rc)
		return rc;
	k->struct_size = sizeof(*k);
	k->kcache = a->kcache, k->vcache = a->vcache;
	k->k = a->k, k->v = a->v;
	k->k_stride = a->k_stride, k->v_stride = a->v_stride;
	k->n_tokens = a->n_tokens, k->kv_dim = a->kv_dim;
	k->slots = a->slots;
	return submit(ctx, &c);
}

/* ---- attention ---- */

/* Host copies of the device tables (parent: NULL without token trees). */
struct attn_tables {
	const int32_t *q_start, *kv_len, *block_table, *parent;
	int64_t rows;
};

static void want_attn_tables(struct loom_backend_ctx *ctx, const struct loom_attention_args *a,
			     int *rc)
{
	if (!*rc)
		*rc = want_table(ctx, a->q_start, a->n_seqs + 1);
	if (!*rc)
		*rc = want_table(ctx, a->kv_len, a->n_seqs);
	if (!*rc)
		*rc = want_table(ctx, a->block_table, a->n_seqs * a->max_blocks);
}

/* Whether attention call b checks and plans exactly as a does: the same
 * tables and every field the checks and the plan read (out, q and the
 * caches only for being non-NULL). The layers of a step are such calls,
 * so a step checks and plans its attention once and shares the items. */
static bool same_attn_plan(const struct loom_attention_args *a,
			   const struct loom_attention_args *b)
{
	return a->q_start == b->q_start && a->kv_len == b->kv_len &&
	       a->block_table == b->block_table && a->n_seqs == b->n_seqs &&
	       a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
	       a->head_dim == b->head_dim && a->block_size == b->block_size &&
	       a->max_blocks == b->max_blocks && a->window == b->window && a->parent == b->parent &&
	       a->q_stride == b->q_stride && a->out_stride == b->out_stride && !a->out == !b->out &&
	       !a->q == !b->q && !a->kcache == !b->kcache && !a->vcache == !b->vcache;
}

/* Asks for the parent tables (token trees, ABI 1.8) of the attention
 * calls that have one: a table holds one entry per query row, a count
 * known only once q_start is staged, so these come in a second round.
 * A call whose tables fail the checks asks for nothing (check_call
 * refuses it). */
static int want_parents(struct loom_backend_ctx *ctx, const struct call *calls, int64_t n)
{
	const struct loom_attention_args *last = NULL;
	int rc = LOOM_OK;

	for (int64_t i = 0; i < n && !rc; i++) {
		const struct loom_attention_args *a = &calls[i].u.attn;
		int64_t rows, longest;

		if (calls[i].kind != CALL_ATTENTION || !a->parent)
			continue;
		if (last && same_attn_plan(last, a)) /* the step's other layers */
			continue;
		last = a;
		if (!loom_check_attention_tables(a, staged(ctx, a->q_start, a->n_seqs + 1),
						 staged(ctx, a->kv_len, a->n_seqs),
						 staged(ctx, a->block_table, a->n_seqs * a->max_blocks),
						 &rows, &longest))
			continue;
		rc = want_table(ctx, a->parent, rows);
	}
	return rc;
}

/* The staged tables of a, checked like ref does, then the shapes they
 * imply. */
static int check_attn_tables(const struct loom_backend_ctx *ctx,
			     const struct loom_attention_args *a, struct attn_tables *t)
{
	int64_t longest, width = a->n_heads * a->head_dim;

	t->q_start = staged(ctx, a->q_start, a->n_seqs + 1);
	t->kv_len = staged(ctx, a->kv_len, a->n_seqs);
	t->block_table = staged(ctx, a->block_table, a->n_seqs * a->max_blocks);
	if (!loom_check_attention_tables(a, t->q_start, t->kv_len, t->block_table,
					 &t->rows, &longest))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(t->rows, width, a->q_stride) ||
	    !loom_check_shape(t->rows, width, a->out_stride))
		return LOOM_ERR_INVALID;
	if (t->rows > 0 && (!a->out || !a->q || !a->kcache || !a->vcache))
		return LOOM_ERR_INVALID;
	t->parent = a->parent ? staged(ctx, a->parent, t->rows) : NULL;
	if (t->parent && !loom_check_attention_parents(a, t->q_start, t->parent))
		return LOOM_ERR_INVALID;
	return LOOM_OK;
}

/* Appends n 16-byte work items to ctx->hitems; NULL when out of memory. */
static unsigned char *add_items(struct loom_backend_ctx *ctx, int64_t n)
{
	size_t bytes = ((size_t)ctx->n_hitems + (size_t)n) * sizeof(struct gpu_attn_row);
	unsigned char *p = reserve_host(&ctx->hitems, &ctx->hitems_cap, bytes);

	if (!p)
		return NULL;
	p += (size_t)ctx->n_hitems * sizeof(struct gpu_attn_row);
	ctx->n_hitems += n;
	return p;
}

/* Whether q_len rows' parents (token trees) are the causal chain,
 * parent[i] = i - 1: such a sequence is planned as one without them. */
static bool chain_shaped(const int32_t *parent, int32_t q_len)
{
	for (int32_t i = 0; i < q_len; i++)
		if (parent[i] != i - 1)
			return false;
	return true;
}

/* Whether sequence s of the call is a token tree (not a plain chain). */
static bool tree_seq(const struct attn_tables *t, int64_t s)
{
	return t->parent &&
	       !chain_shaped(t->parent + t->q_start[s], t->q_start[s + 1] - t->q_start[s]);
}

/* Local row i's depth in its sequence's tree (0: its parent is the
 * cached prefix); parent is the sequence's part of the table. */
static int32_t tree_depth(const int32_t *parent, int32_t i)
{
	int32_t depth = 0;

	while (parent[i] >= 0)
		i = parent[i], depth++;
	return depth;
}

/*
 * The tree table of a call with token trees (gpu_rt.h, struct
 * gpu_attn_row), appended to ctx->hitems after its items: entry r for
 * each query row r, -1 for a causal row, else the offset of the row's
 * chain record [base, base + j_0, ..., base + j_depth], the cache indices
 * of its ancestors root first, the row itself last.
 */
static int plan_tree(struct loom_backend_ctx *ctx, const struct attn_tables *t,
		     int64_t n_seqs, struct attn_plan *pl)
{
	int64_t count = t->rows, off = t->rows;
	int32_t *tab;

	for (int64_t s = 0; s < n_seqs; s++) {
		int32_t q0 = t->q_start[s], q_len = tree_seq(t, s) ? t->q_start[s + 1] - q0 : 0;

		for (int32_t i = 0; i < q_len; i++) {
			count += tree_depth(t->parent + q0, i) + 2;
			if (count > INT32_MAX) /* offsets are int32 */
				return LOOM_ERR_NOMEM;
		}
	}
	pl->tree = ctx->n_hitems;
	pl->n_tree = (count * (int64_t)sizeof(int32_t) + 15) / 16;
	tab = (int32_t *)add_items(ctx, pl->n_tree);
	if (!tab)
		return LOOM_ERR_NOMEM;
	for (int64_t r = 0; r < t->rows; r++)
		tab[r] = -1;
	for (int64_t s = 0; s < n_seqs; s++) {
		const int32_t *par = t->parent + t->q_start[s];
		int32_t q_len = t->q_start[s + 1] - t->q_start[s], base = t->kv_len[s] - q_len;

		if (!tree_seq(t, s))
			continue;
		for (int32_t i = 0; i < q_len; i++) {
			int32_t depth = tree_depth(par, i);

			tab[t->q_start[s] + i] = (int32_t)off;
			tab[off] = base;
			for (int32_t j = i, d = depth; j >= 0; j = par[j], d--)
				tab[off + 1 + d] = base + j;
			off += depth + 2;
		}
	}
	return LOOM_OK;
}

/* Work items of one call, appended to ctx->hitems: prefill tiles, then
 * single rows for split-K, then the tree table when the call has token
 * trees. At most one item per query row. The rows of a tree go through
 * split-K (a row at position base + depth, its keys mapped through the
 * table), so each gives a decode row's bits over the same keys; a
 * sequence whose parents are the plain chain is planned as a causal one. */
static int plan_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a,
			  const struct attn_tables *t, struct attn_plan *pl)
{
	bool tiled_ok = !ctx->invariant && a->head_dim <= GPU_ATTN_PREFILL_MAX_HEAD_DIM;
	bool any_tree = false;
	unsigned char *tiles, *rows;

	_Static_assert(sizeof(struct gpu_attn_tile) == sizeof(struct gpu_attn_row),
		       "attention work items share one 16-byte record");
	memset(pl, 0, sizeof(*pl));
	pl->tiles = ctx->n_hitems;
	pl->rows = ctx->n_hitems + t->rows;
	tiles = add_items(ctx, 2 * t->rows);
	if (!tiles)
		return LOOM_ERR_NOMEM;
	rows = tiles + (size_t)t->rows * sizeof(struct gpu_attn_row);
	for (int64_t s = 0; s < a->n_seqs; s++) {
		int32_t q0 = t->q_start[s], q_len = t->q_start[s + 1] - q0;
		int32_t pos0 = t->kv_len[s] - q_len;
		bool tree = tree_seq(t, s);

		any_tree |= tree;
		if (tiled_ok && !tree && q_len >= PREFILL_MIN_Q) {
			for (int32_t i = 0; i < q_len; i += GPU_ATTN_TILE_Q) {
				struct gpu_attn_tile it = {
					.seq = (int32_t)s, .row = q0 + i, .pos = pos0 + i,
					.n = q_len - i < GPU_ATTN_TILE_Q ? q_len - i : GPU_ATTN_TILE_Q,
				};
				memcpy(tiles + (size_t)pl->n_tiles++ * sizeof(it), &it, sizeof(it));
			}
			continue;
		}
		for (int32_t i = 0; i < q_len; i++) {
			int32_t pos = pos0 + (tree ? tree_depth(t->parent + q0, i) : i);
			int32_t lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
			int64_t splits = ((int64_t)pos - lo + GPU_ATTN_SPLIT) / GPU_ATTN_SPLIT;
			struct gpu_attn_row it = {
				.seq = (int32_t)s, .row = q0 + i, .pos = pos, .lo = lo,
			};

			memcpy(rows + (size_t)pl->n_rows++ * sizeof(it), &it, sizeof(it));
			if (splits > pl->n_splits)
				pl->n_splits = splits;
		}
	}
	return any_tree ? plan_tree(ctx, t, a->n_seqs, pl) : LOOM_OK;
}

/* Split-K partials for one row, and rows per launch so a launch's
 * partials stay within PARTIAL_BYTES. */
static size_t split_scratch(const struct loom_attention_args *a, const struct attn_plan *pl,
			    int64_t *batch_out)
{
	size_t per_row = (size_t)a->n_heads * (size_t)pl->n_splits * (size_t)(a->head_dim + 2) *
			 sizeof(float);
	int64_t batch = per_row ? (int64_t)(PARTIAL_BYTES / per_row) : 1;

	if (batch < 1)
		batch = 1;
	if (batch > pl->n_rows)
		batch = pl->n_rows;
	*batch_out = batch;
	return (size_t)batch * per_row;
}

/* Runs a plan whose items are already in the device items buffer: the
 * tiles in one launch, the rows in as many split-K launches as keep the
 * partials within PARTIAL_BYTES. */
static int exec_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a,
			  const struct attn_plan *pl)
{
	const struct gpu_attn_tile *dtiles = (const struct gpu_attn_tile *)ctx->items + pl->tiles;
	const struct gpu_attn_row *drows = (const struct gpu_attn_row *)ctx->items + pl->rows;
	const int32_t *dtree =
		pl->n_tree ? (const int32_t *)((const struct gpu_attn_row *)ctx->items + pl->tree) :
			     NULL;
	int64_t batch;
	size_t need = split_scratch(a, pl, &batch);
	int rc;

	rc = rt_failed(ctx, gpurt_attn_prefill(ctx->rt, a, dtiles, pl->n_tiles));
	if (rc || pl->n_rows == 0)
		return rc;
	rc = reserve_dev(ctx, &ctx->scratch, &ctx->scratch_cap, need);
	for (int64_t r0 = 0; r0 < pl->n_rows && !rc; r0 += batch) {
		int64_t n = pl->n_rows - r0 < batch ? pl->n_rows - r0 : batch;

		rc = rt_failed(ctx, gpurt_attn_split(ctx->rt, a, drows + r0, n, pl->n_splits,
						     dtree, ctx->scratch));
	}
	return rc;
}

static int attention_args_ok(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	if (!loom_check_attention_args(a))
		return LOOM_ERR_INVALID;
	if (a->n_seqs > 0 && (!a->q_start || !a->kv_len || !a->block_table))
		return LOOM_ERR_INVALID;
	if (a->head_dim > GPU_ATTN_MAX_HEAD_DIM) {
		gpu_log(ctx->host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": attention head_dim %lld > %d",
			(long long)a->head_dim, GPU_ATTN_MAX_HEAD_DIM);
		return LOOM_ERR_UNSUPPORTED;
	}
	return LOOM_OK;
}

static int do_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	struct call c = new_call(CALL_ATTENTION);
	struct loom_attention_args *t = &c.u.attn;
	int rc;

	if (!ctx || !a || !LOOM_ARGS_HAS(a, struct loom_attention_args, softcap))
		return LOOM_ERR_INVALID;
	rc = attention_args_ok(ctx, a);
	if (!rc)
		rc = loom_check_kv_type(LOOM_KV_TYPE(a, struct loom_attention_args), a->head_dim);
	if (rc || a->n_seqs == 0)
		return rc;
	t->kv_type = LOOM_KV_TYPE(a, struct loom_attention_args);
	t->struct_size = sizeof(*t);
	t->out = a->out, t->q = a->q;
	t->q_stride = a->q_stride, t->out_stride = a->out_stride;
	t->kcache = a->kcache, t->vcache = a->vcache;
	t->n_seqs = a->n_seqs, t->n_heads = a->n_heads, t->n_kv_heads = a->n_kv_heads;
	t->head_dim = a->head_dim, t->block_size = a->block_size, t->max_blocks = a->max_blocks;
	t->q_start = a->q_start, t->kv_len = a->kv_len, t->block_table = a->block_table;
	t->scale = a->scale, t->window = a->window, t->softcap = a->softcap;
	t->sinks = LOOM_ATTN_SINKS(a); /* ABI 1.8 (gpt-oss) */
	t->parent = LOOM_ATTN_PARENT(a);
	return submit(ctx, &c);
}

/* ---- routed experts (ABI 1.6; gpt-oss's pieces 1.8) ---- */

/*
 * The moe slot: per chunk of rows, the routing on the device (loom/moe.h's
 * rule), the (row, choice) slots grouped by expert, then gate and up of
 * every expert over its slots (one launch each, expert biases added),
 * the GLU over all slots, down likewise, and each row's weighted sum in
 * choice order; then the shared expert through plain exact GEMVs. Every
 * routed product is the GEMV's a gemm of its type runs: f32 activations
 * in exact mode, in fast mode the 8-bit ones for q4_0, q8_0, q4_K and
 * q6_K (x quantized once a chunk, the GLU's output once), so a lone
 * gemm's bits in either mode, and a row's result never depends on the
 * other rows of the call.
 */
#define MOE_SLOTS 1024 /* (row, choice) slots a chunk runs at once */
#define MOE_MAX_N ((int64_t)65535 * 8) /* outputs a GEMV launch covers */

/* Byte offsets of a chunk's buffers in the scratch (16-byte aligned);
 * the 8-bit activations of x and of the GLU's output (qx, qh and their
 * scales) only in fast mode. */
struct moe_layout {
	int64_t rows; /* a chunk's rows */
	size_t p, ids, w, order, start, g, u, d, sg, su, sd, ss, qx, qxs, qh, qhs, bytes;
};

/* Whether the expert products of weight type t run on 8-bit activations
 * (fast mode, a format with an integer GEMV), as a gemm of t would. */
static bool moe_q8(const struct loom_backend_ctx *ctx, uint32_t t)
{
	return !ctx->exact && gpurt_gemv_q8_format(t);
}

static size_t moe_take(size_t *at, int64_t n, size_t size)
{
	size_t o = *at;

	*at += ((size_t)n * size + 15) & ~(size_t)15;
	return o;
}

static void moe_layout_of(const struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
			  struct moe_layout *l)
{
	const bool qx = moe_q8(ctx, a->gate.type) || moe_q8(ctx, a->up.type);
	const bool qh = moe_q8(ctx, a->down.type);
	int64_t rows = MOE_SLOTS / a->n_used, slots, fs = a->n_ff_shared;
	size_t at = 0;

	rows = rows < 1 ? 1 : rows < a->rows ? rows : a->rows;
	slots = rows * a->n_used;
	l->rows = rows;
	l->p = moe_take(&at, rows * a->n_expert, sizeof(float));
	l->ids = moe_take(&at, slots, sizeof(int32_t));
	l->w = moe_take(&at, slots, sizeof(float));
	l->order = moe_take(&at, slots, sizeof(int32_t));
	l->start = moe_take(&at, a->n_expert + 1, sizeof(int32_t));
	l->g = moe_take(&at, slots * a->n_ff, sizeof(float));
	l->u = moe_take(&at, slots * a->n_ff, sizeof(float));
	l->d = moe_take(&at, slots * a->n_embd, sizeof(float));
	l->sg = moe_take(&at, rows * fs, sizeof(float));
	l->su = moe_take(&at, rows * fs, sizeof(float));
	l->sd = moe_take(&at, fs ? rows * a->n_embd : 0, sizeof(float));
	l->ss = moe_take(&at, fs ? rows : 0, sizeof(float));
	/* k a whole number of 32-value blocks: the formats with integer
	 * GEMVs have blocks of 32 or 256 */
	l->qx = moe_take(&at, qx ? rows * a->n_embd : 0, 1);
	l->qxs = moe_take(&at, qx ? rows * (a->n_embd / 32) : 0, 8);
	l->qh = moe_take(&at, qh ? slots * a->n_ff : 0, 1);
	l->qhs = moe_take(&at, qh ? slots * (a->n_ff / 32) : 0, 8);
	l->bytes = at;
}

/* LOOM_OK when the count matrices of m ([n][k] each) are a format this
 * backend runs with rows of k values in row_bytes, or packs of this
 * context (then *view has the layout type and row stride the kernels
 * read, else m's own). */
static int moe_weights_ok(const struct loom_backend_ctx *ctx, const struct loom_moe_weights *m,
			  int64_t count, int64_t n, int64_t k, struct loom_moe_weights *view)
{
	size_t row;
	bool ok;

	*view = *m;
	if (!gpurt_format_known(m->type) || n > MOE_MAX_N)
		return LOOM_ERR_UNSUPPORTED;
	if (m->packed) {
		for (int64_t e = 0; e < count; e++) {
			uint32_t t;

			if (gpu_pack_view(ctx, m->w[e], m->type, n, k, &t, &row) ||
			    (e && (t != view->type || row != view->row_bytes)))
				return LOOM_ERR_INVALID;
			view->type = t, view->row_bytes = row, view->packed = 0;
		}
		return LOOM_OK;
	}
	row = row_size(k, m->type, &ok);
	return ok && m->row_bytes >= row && loom_check_bytes(n, row, m->row_bytes) ?
		       LOOM_OK : LOOM_ERR_INVALID;
}

/* Checks a; v[0..5] get the views of its gate, up, down and shared
 * expert weights (moe_weights_ok). */
static int moe_args_ok(const struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
		       struct loom_moe_weights v[6])
{
	int64_t fs = a->n_ff_shared, ne = a->n_expert;
	int rc = loom_moe_check_args(a);

	/* the scratch's sizes stay far below SIZE_MAX with these */
	if (!rc && (a->n_ff > INT32_MAX || a->n_embd > INT32_MAX || fs > INT32_MAX))
		rc = LOOM_ERR_UNSUPPORTED;
	if (rc || a->rows == 0)
		return rc;
	rc = moe_weights_ok(ctx, &a->gate, ne, a->n_ff, a->n_embd, &v[0]);
	if (!rc)
		rc = moe_weights_ok(ctx, &a->up, ne, a->n_ff, a->n_embd, &v[1]);
	if (!rc)
		rc = moe_weights_ok(ctx, &a->down, ne, a->n_embd, a->n_ff, &v[2]);
	if (!rc && fs > 0)
		rc = moe_weights_ok(ctx, &a->shared_gate, 1, fs, a->n_embd, &v[3]);
	if (!rc && fs > 0)
		rc = moe_weights_ok(ctx, &a->shared_up, 1, fs, a->n_embd, &v[4]);
	if (!rc && fs > 0)
		rc = moe_weights_ok(ctx, &a->shared_down, 1, a->n_embd, fs, &v[5]);
	return rc;
}

/* Copies the call's expert addresses to ctx->moe_tabs; *tab: where. */
static int moe_keep_tabs(struct loom_backend_ctx *ctx, const struct loom_moe_args *a,
			 int64_t *tab)
{
	const struct loom_moe_weights *m[3] = { &a->gate, &a->up, &a->down };
	int64_t n = 3 * a->n_expert;

	if (ctx->n_moe_tabs + n > ctx->moe_tabs_cap) {
		int64_t cap = 2 * (ctx->n_moe_tabs + n);
		const void **p = realloc(ctx->moe_tabs, (size_t)cap * sizeof(*p));

		if (!p)
			return LOOM_ERR_NOMEM;
		ctx->moe_tabs = p;
		ctx->moe_tabs_cap = cap;
	}
	*tab = ctx->n_moe_tabs;
	for (int i = 0; i < 3; i++)
		memcpy(ctx->moe_tabs + *tab + i * a->n_expert, m[i]->w,
		       (size_t)a->n_expert * sizeof(void *));
	ctx->n_moe_tabs += n;
	return LOOM_OK;
}

static int do_moe(struct loom_backend_ctx *ctx, const struct loom_moe_args *a)
{
	struct call c = new_call(CALL_MOE);
	struct moe_call *m = &c.u.moe;
	struct loom_moe_weights v[6];
	int rc;

	if (!ctx)
		return LOOM_ERR_INVALID;
	rc = moe_args_ok(ctx, a, v);
	if (rc || a->rows == 0)
		return rc;
	if (!ctx->in_region)
		ctx->n_moe_tabs = 0; /* a direct call: the last one's are spent */
	rc = moe_keep_tabs(ctx, a, &m->tab);
	if (rc)
		return rc;
	/* whole struct copies: loom_moe_args has no padding */
	memcpy(&m->a, a, a->struct_size < sizeof(m->a) ? a->struct_size : sizeof(m->a));
	m->a.struct_size = sizeof(m->a);
	if (!LOOM_MOE_BIASES(a))
		m->a.gate_bias = m->a.up_bias = m->a.down_bias = NULL;
	/* packed experts: the kernels read their layout type and stride */
	m->a.gate = v[0], m->a.up = v[1], m->a.down = v[2];
	if (a->n_ff_shared > 0)
		m->a.shared_gate = v[3], m->a.shared_up = v[4], m->a.shared_down = v[5];
	if (a->n_ff_shared > 0) {
		m->shared_w[0] = a->shared_gate.w[0];
		m->shared_w[1] = a->shared_up.w[0];
		m->shared_w[2] = a->shared_down.w[0];
	}
	return submit(ctx, &c);
}

/* Puts the call's expert addresses in the work items: *need the scratch. */
static int plan_moe(struct loom_backend_ctx *ctx, const struct moe_call *m,
		    struct attn_plan *pl, size_t *need)
{
	const size_t bytes = (size_t)(3 * m->a.n_expert) * sizeof(void *);
	const size_t rec = sizeof(struct gpu_attn_row);
	struct moe_layout l;
	unsigned char *items;

	memset(pl, 0, sizeof(*pl));
	pl->tiles = ctx->n_hitems;
	items = add_items(ctx, (int64_t)((bytes + rec - 1) / rec));
	if (!items)
		return LOOM_ERR_NOMEM;
	memcpy(items, ctx->moe_tabs + m->tab, bytes);
	moe_layout_of(ctx, &m->a, &l);
	*need = l.bytes;
	return LOOM_OK;
}

/* One expert product's input: f32 rows, and their 8-bit form (fast). */
struct moe_input {
	const float *x;
	int64_t x_stride, div; /* slot s reads row s / div */
	const int8_t *xq;
	const void *xs;
};

/* y = x . W_e^T (+ bias) over expert e's slots, for every expert: on the
 * 8-bit activations where a gemm of the type would use them. */
static int moe_product(struct loom_backend_ctx *ctx, const struct loom_moe_weights *mw,
		       const void *const *tab, const struct moe_input *in, int64_t n, int64_t k,
		       const float *bias, float *y, const char *sc, const struct moe_layout *l,
		       int64_t n_expert)
{
	const bool q8 = moe_q8(ctx, mw->type);
	struct gpurt_moe_gemv g = {
		.type = mw->type, .w = tab, .w_stride = mw->row_bytes, .n = n, .k = k,
		.n_expert = n_expert, .x = in->x, .x_stride = in->x_stride, .x_div = in->div,
		.bias = bias, .y = y, .y_stride = n,
		.order = (const int32_t *)(sc + l->order), .start = (const int32_t *)(sc + l->start),
		.xq = q8 ? in->xq : NULL, .xs = q8 ? in->xs : NULL,
	};

	return rt_failed(ctx, gpurt_moe_gemv(ctx->rt, &g));
}

/* The fast mode's 8-bit copy of rows x rows of k values, into in. */
static int moe_quantize(struct loom_backend_ctx *ctx, bool q8, int64_t rows, int64_t k, char *qs,
			char *scales, struct moe_input *in)
{
	if (!q8)
		return LOOM_OK;
	in->xq = (const int8_t *)qs;
	in->xs = scales;
	return rt_failed(ctx, gpurt_quantize_q8(ctx->rt, in->x, in->x_stride, rows, k,
						(int8_t *)qs, scales));
}

/* One plain GEMV of the shared expert: y = x . W^T, W [n][k] of type. */
static int moe_gemv(struct loom_backend_ctx *ctx, uint32_t type, const void *w, size_t w_stride,
		    int64_t rows, int64_t n, int64_t k, const float *x, int64_t x_stride, float *y)
{
	struct loom_gemm_args g = {
		.struct_size = sizeof(g), .w_type = type, .m = rows, .n = n, .k = k, .w = w,
		.w_stride = w_stride, .x = x, .x_stride = x_stride, .y = y, .y_stride = n,
	};

	return rt_failed(ctx, gpurt_gemv(ctx->rt, &g));
}

/* Rows r0 .. r0 + rows - 1: y += sigmoid(x . gate_inp) * shared expert. */
static int moe_shared(struct loom_backend_ctx *ctx, const struct moe_call *m, int64_t r0,
		      int64_t rows, char *sc, const struct moe_layout *l)
{
	const struct loom_moe_args *a = &m->a;
	const int64_t fs = a->n_ff_shared, e = a->n_embd;
	const float *x = a->x + r0 * a->x_stride;
	float *sg = (float *)(sc + l->sg), *su = (float *)(sc + l->su);
	float *sd = (float *)(sc + l->sd), *ss = (float *)(sc + l->ss);
	int rc;

	rc = moe_gemv(ctx, a->shared_gate.type, m->shared_w[0], a->shared_gate.row_bytes, rows, fs,
		      e, x, a->x_stride, sg);
	if (!rc)
		rc = moe_gemv(ctx, a->shared_up.type, m->shared_w[1], a->shared_up.row_bytes, rows,
			      fs, e, x, a->x_stride, su);
	if (!rc)
		rc = rt_failed(ctx, gpurt_glu(ctx->rt, (enum loom_glu_kind)a->glu, sg, fs, sg, fs,
					      su, fs, rows, fs));
	if (!rc)
		rc = moe_gemv(ctx, a->shared_down.type, m->shared_w[2], a->shared_down.row_bytes,
			      rows, e, fs, sg, fs, sd);
	if (!rc)
		rc = moe_gemv(ctx, LOOM_TYPE_F32, a->shared_gate_inp, (size_t)e * sizeof(float), rows,
			      1, e, x, a->x_stride, ss);
	if (!rc)
		rc = rt_failed(ctx, gpurt_moe_shared(ctx->rt, a->y + r0 * a->y_stride, a->y_stride,
						     ss, sd, rows, e));
	return rc;
}

/* Rows r0 .. r0 + rows - 1 of the routed experts (tab: the device copy
 * of the expert addresses, gate's, up's and down's). */
static int moe_chunk(struct loom_backend_ctx *ctx, const struct moe_call *m,
		     const void *const *tab, int64_t r0, int64_t rows, char *sc,
		     const struct moe_layout *l)
{
	const struct loom_moe_args *a = &m->a;
	const int64_t k = a->n_used, ne = a->n_expert, slots = rows * k;
	const float *x = a->x + r0 * a->x_stride;
	float *g = (float *)(sc + l->g), *u = (float *)(sc + l->u), *d = (float *)(sc + l->d);
	struct gpurt_moe_route route = {
		.gating = a->gating, .norm = a->norm, .logits = a->logits + r0 * a->logits_stride,
		.logits_stride = a->logits_stride, .rows = rows, .n_expert = ne, .n_used = k,
		.p = (float *)(sc + l->p), .ids = (int32_t *)(sc + l->ids),
		.w = (float *)(sc + l->w), .order = (int32_t *)(sc + l->order),
		.start = (int32_t *)(sc + l->start),
	};
	struct moe_input in_x = { .x = x, .x_stride = a->x_stride, .div = k };
	struct moe_input in_h = { .x = g, .x_stride = a->n_ff, .div = 1 };
	int rc = rt_failed(ctx, gpurt_moe_route(ctx->rt, &route));

	if (!rc)
		rc = moe_quantize(ctx, moe_q8(ctx, a->gate.type) || moe_q8(ctx, a->up.type), rows,
				  a->n_embd, sc + l->qx, sc + l->qxs, &in_x);
	if (!rc)
		rc = moe_product(ctx, &a->gate, tab, &in_x, a->n_ff, a->n_embd, a->gate_bias, g, sc,
				 l, ne);
	if (!rc)
		rc = moe_product(ctx, &a->up, tab + ne, &in_x, a->n_ff, a->n_embd, a->up_bias, u, sc,
				 l, ne);
	if (!rc)
		rc = rt_failed(ctx, gpurt_glu(ctx->rt, (enum loom_glu_kind)a->glu, g, a->n_ff, g,
					      a->n_ff, u, a->n_ff, slots, a->n_ff));
	if (!rc)
		rc = moe_quantize(ctx, moe_q8(ctx, a->down.type), slots, a->n_ff, sc + l->qh,
				  sc + l->qhs, &in_h);
	if (!rc)
		rc = moe_product(ctx, &a->down, tab + 2 * ne, &in_h, a->n_embd, a->n_ff,
				 a->down_bias, d, sc, l, ne);
	if (!rc)
		rc = rt_failed(ctx, gpurt_moe_combine(ctx->rt, a->y + r0 * a->y_stride, a->y_stride,
						      d, route.w, rows, k, a->n_embd));
	if (!rc && a->n_ff_shared > 0)
		rc = moe_shared(ctx, m, r0, rows, sc, l);
	return rc;
}

static int exec_moe(struct loom_backend_ctx *ctx, const struct moe_call *m,
		    const struct attn_plan *pl)
{
	const void *const *tab =
		(const void *const *)((const struct gpu_attn_row *)ctx->items + pl->tiles);
	struct moe_layout l;
	int rc = LOOM_OK;

	moe_layout_of(ctx, &m->a, &l);
	for (int64_t r0 = 0; r0 < m->a.rows && !rc; r0 += l.rows) {
		int64_t rows = m->a.rows - r0 < l.rows ? m->a.rows - r0 : l.rows;

		rc = moe_chunk(ctx, m, tab, r0, rows, ctx->scratch, &l);
	}
	return rc;
}

/* ---- preparing and running calls ---- */

/* Checks what call c read from the staged tables; plans its attention;
 * raises *need to the scratch it will use. */
static int check_call(struct loom_backend_ctx *ctx, const struct call *c, struct attn_plan *pl,
		      size_t *need)
{
	struct attn_tables t;
	int64_t rows;
	size_t n = 0;
	int rc = LOOM_OK;

	switch (c->kind) {
	case CALL_EMBED:
		return check_ids(ctx, &c->u.embed);
	case CALL_ROPE:
		return rope_table(ctx, &c->u.rope, true, &(struct gpurt_rope_table){ 0 });
	case CALL_KV_WRITE:
		return loom_check_slots(staged(ctx, c->u.kv.slots, c->u.kv.n_tokens),
					c->u.kv.n_tokens, c->u.kv.kv_dim) ?
			       LOOM_OK : LOOM_ERR_INVALID;
	case CALL_GEMM:
		if (!gemm_is_gemv(ctx, &c->u.gemm) && !gemm_mmq(ctx, &c->u.gemm)) {
			if (!gemm_scratch(&c->u.gemm, gemm_elem(ctx, &c->u.gemm), &rows, &n))
				rc = LOOM_ERR_NOMEM;
		} else if (gemv_q8(ctx, &c->u.gemm)) {
			size_t qs_bytes;

			if (!q8_scratch(&c->u.gemm, &qs_bytes, &n))
				rc = LOOM_ERR_NOMEM;
		}
		break;
	case CALL_MOE:
		rc = plan_moe(ctx, &c->u.moe, pl, &n);
		break;
	case CALL_ATTENTION:
		rc = check_attn_tables(ctx, &c->u.attn, &t);
		if (!rc)
			rc = plan_attention(ctx, &c->u.attn, &t, pl);
		if (!rc && pl->n_rows)
			n = split_scratch(&c->u.attn, pl, &rows);
		break;
	default:
		break;
	}
	if (n > *need)
		*need = n;
	return rc;
}

int prepare_calls(struct loom_backend_ctx *ctx, const struct call *calls,
		  struct attn_plan *plans, int64_t n)
{
	const struct loom_attention_args *last_attn = NULL;
	const struct loom_kv_write_args *last_kv = NULL;
	const struct attn_plan *last_plan = NULL;
	size_t need = 0, bytes;
	int64_t first;
	int rc = LOOM_OK;

	ctx->n_fetches = 0;
	for (int64_t i = 0; i < n && !rc; i++) {
		const struct call *c = &calls[i];

		if (c->kind == CALL_EMBED)
			rc = want_table(ctx, c->u.embed.ids, c->u.embed.n_ids);
		else if (c->kind == CALL_KV_WRITE)
			rc = want_table(ctx, c->u.kv.slots, c->u.kv.n_tokens);
		else if (c->kind == CALL_ATTENTION)
			want_attn_tables(ctx, &c->u.attn, &rc);
	}
	if (!rc)
		rc = fetch_tables(ctx, 0);
	first = ctx->n_fetches;
	if (!rc)
		rc = want_parents(ctx, calls, n);
	if (!rc && ctx->n_fetches > first)
		rc = fetch_tables(ctx, first);
	ctx->n_hitems = 0;
	for (int64_t i = 0; i < n && !rc; i++) {
		const struct call *c = &calls[i];

		if (c->kind == CALL_ATTENTION && last_attn && same_attn_plan(last_attn, &c->u.attn)) {
			plans[i] = *last_plan; /* its items and scratch are there already */
			continue;
		}
		if (c->kind == CALL_KV_WRITE)
			plans[i].caches_apart = gpu_caches_apart(
				calls, i, staged(ctx, c->u.kv.slots, c->u.kv.n_tokens));
		if (c->kind == CALL_KV_WRITE && last_kv && last_kv->slots == c->u.kv.slots &&
		    last_kv->n_tokens == c->u.kv.n_tokens && last_kv->kv_dim == c->u.kv.kv_dim)
			continue;
		rc = check_call(ctx, c, &plans[i], &need);
		if (c->kind == CALL_ATTENTION) {
			last_attn = &c->u.attn;
			last_plan = &plans[i];
		} else if (c->kind == CALL_KV_WRITE) {
			last_kv = &c->u.kv;
		}
	}
	if (!rc)
		rc = reserve_dev(ctx, &ctx->scratch, &ctx->scratch_cap, need);
	bytes = (size_t)ctx->n_hitems * sizeof(struct gpu_attn_row);
	if (!rc)
		rc = reserve_dev(ctx, &ctx->items, &ctx->items_cap, bytes);
	if (!rc && bytes)
		rc = upload_ring(ctx, ctx->items, ctx->hitems, bytes, false);
	return rc;
}

static int exec_call(struct loom_backend_ctx *ctx, const struct call *c, const struct attn_plan *pl)
{
	switch (c->kind) {
	case CALL_GEMM:
		return exec_gemm(ctx, &c->u.gemm);
	case CALL_EMBED:
		return exec_embed(ctx, &c->u.embed);
	case CALL_ROPE:
		return exec_rope(ctx, &c->u.rope);
	case CALL_KV_WRITE:
		return rt_failed(ctx, gpurt_kv_write(ctx->rt, &c->u.kv));
	case CALL_ATTENTION:
		return exec_attention(ctx, &c->u.attn, pl);
	case CALL_MOE:
		return exec_moe(ctx, &c->u.moe, pl);
	case CALL_COPY:
		return rt_failed(ctx, gpurt_copy(ctx->rt, c->u.copy.dst, c->u.copy.src, c->u.copy.n));
	default:
		return exec_rows(ctx, (enum call_kind)c->kind, &c->u.rows);
	}
}

int exec_calls(struct loom_backend_ctx *ctx, const struct call *calls,
	       const struct attn_plan *plans, int64_t n)
{
	int rc = LOOM_OK;

	shadows_clear(ctx); /* the calls may write what was uploaded */
	ctx->queued = true;
	for (int64_t i = 0; i < n && !rc;) {
		struct gpu_group g;
		struct gpu_rope_kv rk;
		int64_t run = ctx->fuse ? gpu_find_rope_kv(&calls[i], &plans[i], n - i, &rk) : 0;

		if (run) {
			rc = gpu_run_rope_kv(ctx, &rk);
			ctx->n_rope_kv++;
			ctx->n_rope_kv_calls += (uint64_t)run;
			i += run;
			continue;
		}
		run = ctx->fuse ? gpu_find_group(ctx, &calls[i], n - i, &g) : 0;

		if (run) {
			rc = gpu_run_group(ctx, &g);
			ctx->n_groups++;
			ctx->n_group_calls += (uint64_t)run;
			i += run;
			continue;
		}
		rc = exec_call(ctx, &calls[i], &plans[i]);
		i++;
	}
	return rc;
}

/* ---- the operators as the host calls them ---- */

/* A failing call inside a region fails the region (ABI 1.1). */
static int noted(struct loom_backend_ctx *ctx, int rc)
{
	if (rc && ctx && ctx->in_region && !ctx->region_rc)
		ctx->region_rc = rc;
	return rc;
}

static int gpu_copy(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	return noted(ctx, do_copy(ctx, dst, src, n));
}

static int gpu_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	return noted(ctx, do_gemm(ctx, a));
}

static int gpu_embed(struct loom_backend_ctx *ctx, float *out, const void *table, uint32_t type,
		     size_t row_bytes, int64_t n_rows, int64_t dim, const int32_t *ids,
		     int64_t n_ids)
{
	return noted(ctx, do_embed(ctx, out, table, type, row_bytes, n_rows, dim, ids, n_ids));
}

static int gpu_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride, const float *x,
		       int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps)
{
	return noted(ctx, do_rmsnorm(ctx, y, y_stride, x, x_stride, w, rows, n, eps));
}

static int gpu_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	return noted(ctx, do_rope(ctx, a));
}

static int gpu_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
		   int64_t out_stride, const float *gate, int64_t gate_stride, const float *up,
		   int64_t up_stride, int64_t rows, int64_t n)
{
	return noted(ctx, do_glu(ctx, kind, out, out_stride, gate, gate_stride, up, up_stride,
				 rows, n));
}

static int gpu_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride, const float *a,
		   int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows, int64_t rows,
		   int64_t n)
{
	return noted(ctx, do_add(ctx, out, out_stride, a, a_stride, b, b_stride, b_rows, rows, n));
}

static int gpu_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		     int64_t n, float s)
{
	return noted(ctx, do_scale(ctx, x, stride, rows, n, s));
}

static int gpu_softcap(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		       int64_t n, float cap)
{
	return noted(ctx, do_softcap(ctx, x, stride, rows, n, cap));
}

static int gpu_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a)
{
	return noted(ctx, do_kv_write(ctx, a));
}

static int gpu_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	return noted(ctx, do_attention(ctx, a));
}

static int gpu_moe(struct loom_backend_ctx *ctx, const struct loom_moe_args *a)
{
	return noted(ctx, do_moe(ctx, a));
}

/* ABI 1.7: the greedy token of each row, on the device. */
static int gpu_argmax(struct loom_backend_ctx *ctx, int32_t *ids, const float *x, int64_t stride,
		      int64_t rows, int64_t n)
{
	if (!ctx || rows < 0 || n < 1 || n > INT32_MAX || stride < n ||
	    (rows > 0 && (!ids || !x)) || (rows > 0 && (uint64_t)(rows - 1) > INT64_MAX / 4 / (uint64_t)stride))
		return LOOM_ERR_INVALID;
	if (ctx->in_region)
		return refused_in_region(ctx, "argmax");
	if (!rows)
		return LOOM_OK;
	ctx->queued = true;
	shadows_drop(ctx, ids, (size_t)rows * sizeof(int32_t));
	return rt_failed(ctx, gpurt_argmax(ctx->rt, ids, x, stride, rows, n));
}

/* ABI 1.8: sampling on the device (k_sample, the host sampler's rule);
 * 1.9: rows without top-k and logprobs. */
static int gpu_sample(struct loom_backend_ctx *ctx, const struct loom_sample_args *a)
{
	const bool lp = a && LOOM_SAMPLE_HAS_LP(a) && a->lp;

	if (!ctx || !a || a->struct_size < LOOM_SAMPLE_ARGS_MIN_SIZE || a->rows < 0 || a->n < 1 ||
	    a->n > LOOM_SAMPLE_MAX_VOCAB ||
	    (lp && (a->lp_stride < 1 || a->lp_stride > 1 + LOOM_SAMPLE_MAX_TOP_LOGPROBS ||
		    !a->pen_raw)) ||
	    a->n > INT32_MAX || a->stride < a->n ||
	    (a->rows > 0 && (!a->x || !a->params || !a->out)) ||
	    (a->rows > 0 && (uint64_t)(a->rows - 1) > INT64_MAX / 4 / (uint64_t)a->stride))
		return LOOM_ERR_INVALID;
	if (ctx->in_region)
		return refused_in_region(ctx, "sample");
	if (!a->rows)
		return LOOM_OK;
	ctx->queued = true;
	ctx->n_sampled += (uint64_t)a->rows;
	shadows_drop(ctx, a->out, (size_t)a->rows * 2 * sizeof(int32_t));
	shadows_drop(ctx, a->x, (size_t)a->rows * (size_t)a->stride * sizeof(float));
	if (lp)
		shadows_drop(ctx, a->lp, (size_t)a->rows * (size_t)a->lp_stride * sizeof(*a->lp));
	return rt_failed(ctx, gpurt_sample(ctx->rt, a));
}

static const struct loom_backend_ops gpu_ops = {
	.abi_major = LOOM_BACKEND_ABI_MAJOR,
	.abi_minor = LOOM_BACKEND_ABI_MINOR,
	.struct_size = sizeof(struct loom_backend_ops),
	.name = GPU_BACKEND_NAME,
	.create = gpu_create,
	.destroy = gpu_destroy,
	.device_info = gpu_device_info,
	.supports = gpu_supports,
	.buffer_alloc = gpu_buffer_alloc,
	.buffer_free = gpu_buffer_free,
	.buffer_addr = gpu_buffer_addr,
	.upload = gpu_upload,
	.download = gpu_download,
	.copy = gpu_copy,
	.synchronize = gpu_synchronize,
	.gemm = gpu_gemm,
	.embed = gpu_embed,
	.rmsnorm = gpu_rmsnorm,
	.rope = gpu_rope,
	.glu = gpu_glu,
	.add = gpu_add,
	.scale = gpu_scale,
	.kv_write = gpu_kv_write,
	.attention = gpu_attention,
	.graph_begin = gpu_graph_begin,
	.graph_end = gpu_graph_end,
	.softcap = gpu_softcap,
#if GPU_COLL
	.collective = gpu_collective,
#endif
	.weight_pack = gpu_weight_pack,
	.moe = gpu_moe,
	.argmax = gpu_argmax,
	.sample = gpu_sample,
};

/* Returns the table only: no runtime call, so probing has no side effects. */
LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
	return &gpu_ops;
}
