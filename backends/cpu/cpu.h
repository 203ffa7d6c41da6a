/*
 * Internals of the cpu backend (cpu.so). Nothing here is part of the ABI;
 * only loom_backend_entry is exported.
 */
#ifndef LOOM_CPU_H
#define LOOM_CPU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/backend_check.h"
#include "amx.h"
#include "qdot.h"

/* ---- thread pool (pool.c) ---- */

/*
 * A task is n_chunks independent chunks; pool threads (the caller is thread
 * 0) claim them one at a time, so a thread that the OS delays holds up at
 * most the chunk it has claimed. ith names the thread running the chunk (for
 * per-thread scratch); what a chunk computes must not depend on it.
 */
typedef void (*cpu_task_fn)(void *arg, int64_t chunk, int ith);

/* Largest chunk count of one task. */
#define CPU_POOL_MAX_CHUNKS ((int64_t)1 << 30)

struct cpu_pool {
	int n_threads; /* including the calling thread */
	pthread_t *threads;
	int n_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_uint gen;      /* bumped once per posted task */
	atomic_int sleepers;  /* workers blocked on cv */
	atomic_bool stop;
	/* task number << 32 | next unclaimed chunk; the chunk half is
	 * UINT32_MAX while no task is open */
	_Atomic uint64_t next;
	atomic_llong done; /* chunks finished in the current task */
	_Atomic(cpu_task_fn) fn;
	_Atomic(void *) arg;
	_Atomic int64_t n_chunks;
	/* until this CLOCK_MONOTONIC time (ns; 0: not set) tasks run on the
	 * caller alone (caller-only) */
	int64_t solo_until;
	/* caller-only counts, for the debug log: tasks posted to the pool,
	 * waits that sent the next tasks solo, tasks run solo that way */
	unsigned long long posted, slow_waits, solo_run;
};

int cpu_pool_init(struct cpu_pool *p, int n_threads);
void cpu_pool_fini(struct cpu_pool *p);
/* Runs fn on chunks 0 .. n_chunks-1 (at most CPU_POOL_MAX_CHUNKS) and
 * returns when all are done: on the calling thread alone when nth <= 1 or
 * there is one chunk, else on the whole pool. */
void cpu_pool_run(struct cpu_pool *p, cpu_task_fn fn, void *arg, int64_t n_chunks, int nth);

/* Little-endian loads from unaligned block bytes (GGUF is little-endian;
 * so are the hosts cpu.so builds for). */
static inline uint16_t cpu_rd16(const uint8_t *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return v;
}

static inline uint32_t cpu_rd32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static inline uint64_t cpu_rd64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

/* MXFP4 (32 E2M1 values sharing an E8M0 scale e: 1 scale byte, then
 * q4_0's nibble layout): the E2M1 codes doubled to integers, and the scale
 * halved to match, 2^(e - 128) (a subnormal float for e < 2). */
static inline float cpu_mxfp4_scale(uint8_t e)
{
	uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
	float f;

	memcpy(&f, &bits, 4);
	return f;
}

/* ---- kernels (kernels.c) ---- */

enum cpu_isa { CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512 };

/* Plain-C block geometry of the formats gemm/embed run natively. */
bool cpu_format_known(uint32_t type);
uint32_t cpu_block_elems(uint32_t type);
uint32_t cpu_block_bytes(uint32_t type);

enum cpu_isa cpu_detect_isa(void);
const char *cpu_isa_name(enum cpu_isa isa);

/* y[i][j] = x[i] . W[j] for i < m, j0 <= j < j1 (small m: GEMV). */
struct cpu_gemv {
	uint32_t type;
	const uint8_t *w;
	size_t w_stride;
	const float *x;
	int64_t x_stride;
	float *y;
	int64_t y_stride;
	int64_t m, k;
	/* Q4_1/Q5_1: per activation row, xs[2b] = 0 and xs[2b + 1] = sum of
	 * x over block b, plus 2 floats of padding (cpu_xsum_fill) */
	const float *xs;
	int64_t xs_stride;
	/* batch invariant: plain-type rows use the same accumulator layout
	 * whatever m is (the m == 1 kernel otherwise uses more, for latency) */
	bool inv;
};

/* Floats of xs per activation row for k values. */
static inline int64_t cpu_xsum_stride(int64_t k)
{
	return 2 * (k / 32) + 2;
}

bool cpu_format_has_min(uint32_t type);
void cpu_xsum_fill(const struct cpu_gemv *g, float *xs);

void cpu_gemv_rows(enum cpu_isa isa, const struct cpu_gemv *g, int64_t j0, int64_t j1);
/* Dequantizes k values (whole blocks; any k for plain types) of one row. */
void cpu_dequant_row(enum cpu_isa isa, uint32_t type, const void *src, float *dst,
		     int64_t k);
float cpu_dot_f32(enum cpu_isa isa, const float *a, const float *b, int64_t n);
/* y += s * x */
void cpu_axpy_f32(enum cpu_isa isa, float *y, const float *x, float s, int64_t n);

float cpu_fp16_to_f32(uint16_t h);

/* ---- fast-mode exponentials (vexp.c) ---- */

/* exp, SiLU and GELU-tanh in plain C: the arithmetic every kernel set of
 * the row functions below gives bit for bit. */
float cpu_exp_c(float x);
float cpu_silu_c(float g);
float cpu_gelu_c(float g);
/* y[i] = exp(x[i] - shift) (y may be x) */
void cpu_exp_row(enum cpu_isa isa, float *y, const float *x, float shift, int64_t n);
/* o[i] = act(g[i]) * u[i], act SiLU or GELU-tanh */
void cpu_glu_row_fast(enum cpu_isa isa, enum loom_glu_kind kind, float *o, const float *g,
		      const float *u, int64_t n);

/* ---- step regions (region.c) ---- */

/* Arguments of the row-wise ops, as ops.c runs them and region.c keeps
 * them for a region's replay. */
struct cpu_add_args {
	float *out;
	int64_t out_stride;
	const float *a;
	int64_t a_stride;
	const float *b;
	int64_t b_stride, b_rows, rows, n;
};

struct cpu_rmsnorm_args {
	float *y;
	int64_t y_stride;
	const float *x;
	int64_t x_stride;
	const float *w;
	int64_t rows, n;
	float eps;
};

struct cpu_glu_args {
	enum loom_glu_kind kind;
	float *out;
	int64_t out_stride;
	const float *gate;
	int64_t gate_stride;
	const float *up;
	int64_t up_stride;
	int64_t rows, n;
};

enum cpu_call_op {
	CPU_CALL_GEMM,
	CPU_CALL_EMBED,
	CPU_CALL_RMSNORM,
	CPU_CALL_ROPE,
	CPU_CALL_GLU,
	CPU_CALL_ADD,
	CPU_CALL_SCALE,
	CPU_CALL_SOFTCAP,
	CPU_CALL_KV_WRITE,
	CPU_CALL_ATTENTION,
	CPU_CALL_COPY,
	CPU_CALL_MOE,
};

/* One operator call of an open region, checked and kept for graph_end. */
struct cpu_call {
	enum cpu_call_op op;
	union {
		struct loom_gemm_args gemm;
		struct loom_rope_args rope;
		struct loom_kv_write_args kv_write;
		struct loom_attention_args attention;
		struct cpu_add_args add;
		struct cpu_glu_args glu;
		struct {
			float *out;
			const void *table;
			uint32_t type;
			size_t row_bytes;
			int64_t n_rows, dim;
			const int32_t *ids;
			int64_t n_ids;
		} embed;
		struct cpu_rmsnorm_args rmsnorm;
		struct { /* scale and softcap (s is the cap) */
			float *x;
			int64_t stride, rows, n;
			float s;
		} scale;
		struct {
			void *dst;
			const void *src;
			size_t n;
		} copy;
		struct loom_moe_args moe;
	} u;
};

struct cpu_region {
	bool open;
	int rc; /* the first failure inside the open region */
	struct cpu_call *calls;
	size_t n, cap;
	/* fuse decode GEMVs with what follows them (LOOM_CPU_FUSE=0: no) */
	bool fuse;
	/* graph_end is running a kept gemm call: since the previous kept
	 * call, only gemms ran (gemm.c may reuse quantized rows) */
	bool in_gemm;
	/* for the log at destroy */
	unsigned long long regions, groups, group_calls, qx_reused;
};

/* Keeps a checked call of the open region; its status is the call's. */
int cpu_region_record(struct loom_backend_ctx *ctx, const struct cpu_call *c);
/* A struct argument as its own struct_size says (at most sizeof what we
 * know, the rest zero), for a recorded call. */
void cpu_region_copy_args(void *dst, size_t dst_size, const void *src);

/*
 * Decode GEMVs run as one pool task (gemm.c): up to CPU_GROUP_MAX gemm
 * calls that read the same activation rows, each with the add that
 * consumes its output, or with the GLU of the first two (gate and up),
 * and the rmsnorm that made the rows when one did. Every thread
 * normalizes (when there is a norm) and quantizes the rows once for the
 * whole group, the first chunk's thread also writes the norm's output,
 * and the add or GLU runs on each chunk's columns as soon as they are
 * computed, so a layer's norm and Q/K/V, norm and gate/up/GLU and each
 * projection with its residual add cost one hand-off each. Results are
 * those of the calls one by one.
 */
#define CPU_GROUP_MAX 4

struct cpu_group {
	int n;
	const struct loom_gemm_args *gemm[CPU_GROUP_MAX];
	const struct cpu_add_args *add[CPU_GROUP_MAX]; /* or NULL */
	const struct cpu_glu_args *glu; /* gate: gemm[0]'s y, up: gemm[1]'s; or NULL */
	const struct cpu_rmsnorm_args *norm; /* writes the gemms' x; or NULL */
};

/*
 * The routed experts one decode row chose, as two pool tasks (gemm.c,
 * for moe.c): the gate and up GEMVs of every expert with their biases
 * and the GLU over the FFN rows (the row quantized once per thread), then
 * every expert's down GEMV and bias over the n_embd rows (each expert's
 * GLU output quantized once per thread). Each output is what the calls
 * one by one give (the group kernels are the GEMV path's), in two
 * hand-offs a layer instead of three gemms and a GLU per expert.
 */
#define CPU_EXPERTS_MAX 16

struct cpu_experts {
	int n;               /* experts the row chose */
	const int32_t *ids;  /* their ids */
	struct loom_moe_weights gate, up, down;
	enum loom_glu_kind glu;
	const float *x;      /* the row, n_embd floats */
	int64_t n_embd, ff;
	const float *gate_bias[CPU_EXPERTS_MAX], *up_bias[CPU_EXPERTS_MAX],
		*down_bias[CPU_EXPERTS_MAX]; /* expert e's, or NULL */
	float *g[CPU_EXPERTS_MAX], *u[CPU_EXPERTS_MAX]; /* ff each: gate (then GLU), up */
	float *d[CPU_EXPERTS_MAX];                      /* n_embd each: down */
};

/* LOOM_ERR_INVALID, before any work, when a matrix of ex may not run so
 * (exact mode, a format without a group kernel, a bad shape). */
int cpu_gemm_experts(struct loom_backend_ctx *ctx, const struct cpu_experts *ex);

/* Whether a checked gemm call may join a group (fast mode, decode rows,
 * a format with a row kernel that needs no per-call preparation). */
bool cpu_gemm_groupable(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a);
/* Runs a group of gemm calls that gemm_check() passed (as the region's
 * recorded calls did when they came). */
int cpu_gemm_group(struct loom_backend_ctx *ctx, const struct cpu_group *g);
/* A checked gemm call's weight row stride (the packed one when packed:
 * for rows in lanes, the bytes a row counts for). */
size_t cpu_gemm_w_stride(const struct loom_gemm_args *a);
/* The bytes its weight spans. */
size_t cpu_gemm_w_bytes(const struct loom_gemm_args *a);
/* Row r of an rmsnorm, into y (ops.c). */
void cpu_rmsnorm_row(const struct cpu_rmsnorm_args *a, int64_t r, float *y);
/* Columns [j0, j1) of every row of an add / a GLU (ops.c). */
void cpu_add_cols(const struct cpu_add_args *a, int64_t j0, int64_t j1);
void cpu_glu_cols(const struct loom_backend_ctx *ctx, const struct cpu_glu_args *a, int64_t j0,
		  int64_t j1);

/* A status from an operator slot: inside a region, a failure fails it. */
int cpu_region_noted(struct loom_backend_ctx *ctx, int rc);
int cpu_graph_begin(struct loom_backend_ctx *ctx);
int cpu_graph_end(struct loom_backend_ctx *ctx);
/* copy: recorded in a region; upload, download, synchronize refused */
int cpu_rg_copy(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n);
int cpu_rg_transfer(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n);
int cpu_rg_synchronize(struct loom_backend_ctx *ctx);
/* Whether buffer management is refused now (and the region failed). */
bool cpu_region_refuses(struct loom_backend_ctx *ctx, const char *what);
void cpu_region_free(struct loom_backend_ctx *ctx);

/* ---- context (cpu.c) ---- */

/* Below this many multiply-adds an op runs on the calling thread only. */
#define CPU_PAR_MIN_WORK (1 << 15)

/* Rotated pairs (n_rot / 2) the RoPE cache holds; more are not cached. */
#define CPU_ROPE_CACHE_PAIRS 256
#define CPU_ROPE_TABLE_POS 32768 /* positions the multi-token table keeps */

struct loom_backend_ctx {
	const struct loom_backend_host *host;
	struct cpu_pool pool;
	enum cpu_isa isa;
	int n_threads;
	float **scratch; /* per thread, grown by cpu_scratch_reserve() */
	size_t *scratch_cap;
	/* per thread, a cache line apart: the gemm whose activation rows the
	 * thread's scratch holds quantized (gemm.c, decode GEMVs) */
	struct cpu_stamp {
		_Alignas(64) uint64_t gemm;
	} *stamp;
	uint64_t gemm_seq; /* numbers the gemm calls (caller only) */
	float *xsum; /* block sums of the activations (gemm.c) */
	size_t xsum_cap;
	/* LOOM_BACKEND_BATCH_INVARIANT (or LOOM_CPU_INVARIANT=1): every output
	 * row is computed by the same operations whatever the batch holds */
	bool invariant;
	/* LOOM_BACKEND_EXACT (or LOOM_CPU_EXACT=1): f32 activations only */
	bool exact;
	/* fast mode: integer dot kernels and the activation rows quantized
	 * for them (gemm.c) */
	enum qdot_isa qisa;
	/* weight_pack() packs the formats kpack.h knows (fast mode with VNNI
	 * kernels only; LOOM_CPU_PACK=0 turns it off, for comparisons) */
	bool pack;
	struct cpu_arena *arena; /* where packed weights are carved (cpu.c) */
	/* fast-mode prefill through qgemm.h (LOOM_CPU_QGEMM=0: BLAS, for
	 * comparisons) */
	bool qgemm;
	bool fgemm; /* float prefill through fgemm.h, not OpenBLAS */
	/* attention's grouped and many-row kernels (LOOM_CPU_ATTN_GROUP=0:
	 * one head and one row at a time, for comparisons) */
	bool attn_group;
	bool attn_walk; /* LOOM_CPU_ATTN_WALK (attention.c, part_groups) */
	bool pairs; /* fast mode: bf16 weights' prefill on bf16 pairs (fgemm.h) */
	uint32_t *bfx; /* its activations as bf16 pairs */
	size_t bfx_cap;
	/* prefill through AMX-INT8 tiles (LOOM_CPU_ISA=amx, or amx-emu for
	 * the C tile emulation; amx.h) instead of qgemm's VNNI kernel */
	enum amx_mode amx;
	struct qdot_block *qx;
	size_t qx_cap; /* blocks */
	float *qsc; /* their scales, qdot_scales_len() per row */
	size_t qsc_cap; /* floats */
	struct qgemm_x *qprep; /* prefill (qgemm.h): activation blocks */
	size_t qprep_cap;
	/* which rows qx and qprep hold for qgemm (gemm.c, qgemm_gemm): in a
	 * replayed step region the next gemm of the same rows (a layer's Q,
	 * K and V; its gate and up) reuses them */
	struct cpu_qx_memo {
		bool valid;
		const float *x;
		int64_t x_stride, m, k;
		int block, off;
	} qmemo;
	struct qdot_kblock *qkx; /* the same for the K-quants */
	size_t qkx_cap; /* super-blocks */
	/* one token's RoPE cos/sin (ops.c): a decode step rotates q and k of
	 * every layer at the same position, so they are computed once; two
	 * entries for models whose layers alternate two bases (Gemma) */
	struct cpu_rope_cache {
		bool valid;
		int32_t pos;
		float base, scale;
		const float *factors;
		int64_t n_rot;
		float cs[CPU_ROPE_CACHE_PAIRS], sn[CPU_ROPE_CACHE_PAIRS];
	} rope_cache[2];
	int rope_next; /* the entry a miss overwrites */
	/* the same for calls of several tokens (prefill, verification):
	 * cos/sin rows of every position seen below CPU_ROPE_TABLE_POS, per
	 * parameter set, filled by the caller before the rows run */
	struct cpu_rope_table {
		bool valid;
		float base, scale;
		const float *factors;
		int64_t n_rot;
		int64_t cap;   /* positions allocated */
		uint8_t *have; /* per position: its row is computed */
		float *cs, *sn; /* [cap][n_rot / 2] */
	} rope_tab[2];
	int rope_tab_next;
	struct cpu_region rg; /* step regions (region.c) */
	/* the moe slot's scratch (moe.c), grown as calls need */
	float *moe_f;
	size_t moe_f_cap;
	int32_t *moe_i;
	size_t moe_i_cap;
};

void cpu_log(struct loom_backend_ctx *ctx, enum loom_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The buffer_alloc and buffer_addr slots (cpu.c). */
int cpu_buffer_alloc(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out);
void *cpu_buffer_addr(struct loom_backend_ctx *ctx, struct loom_buffer *buf);
/* A buffer for a packed weight, carved after the previous one (cpu.c). */
int cpu_buffer_alloc_packed(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out);
/*
 * Asks for every cache line of the weight rows a kernel is about to read,
 * before it reads any. Decode streams the weights from memory, and a kernel
 * that only loads as it goes keeps too few misses in flight: cold GEMVs
 * (weights not in cache, as in decode) ran 1.2-2.8x faster with this
 * (docs/BENCHMARKS.md). Prefetches change no result.
 */
static inline void cpu_prefetch(const void *p, size_t bytes)
{
	for (size_t o = 0; o < bytes; o += 64)
		__builtin_prefetch((const char *)p + o, 0, 3);
}

/* ABI 1.2 weight_pack (gemm.c). */
int cpu_weight_pack(struct loom_backend_ctx *ctx, const struct loom_weight_pack_args *a,
		    struct loom_buffer **out, size_t *bytes);
/* Makes every thread's scratch hold at least n floats. */
int cpu_scratch_reserve(struct loom_backend_ctx *ctx, size_t n);

/* fn(ctx, args, r0, r1) over [0, rows) split across the pool when work
 * (about the number of flops) is worth it. */
typedef void (*cpu_rows_fn)(struct loom_backend_ctx *ctx, const void *args, int64_t r0,
			    int64_t r1);
void cpu_run_rows(struct loom_backend_ctx *ctx, cpu_rows_fn fn, const void *args, int64_t rows,
		  double work);

/* ---- operators (gemm.c, ops.c, attention.c) ---- */

int cpu_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a);
int cpu_embed(struct loom_backend_ctx *ctx, float *out, const void *table, uint32_t type,
	      size_t row_bytes, int64_t n_rows, int64_t dim, const int32_t *ids, int64_t n_ids);
int cpu_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride, const float *x,
		int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps);
int cpu_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a);
/* Frees the multi-token RoPE tables (ops.c). */
void cpu_rope_tables_free(struct loom_backend_ctx *ctx);
int cpu_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
	    int64_t out_stride, const float *gate, int64_t gate_stride, const float *up,
	    int64_t up_stride, int64_t rows, int64_t n);
int cpu_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride, const float *a,
	    int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows, int64_t rows,
	    int64_t n);
int cpu_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows, int64_t n,
	      float s);
int cpu_softcap(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		int64_t n, float cap);
int cpu_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a);
int cpu_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a);
/* The routed-expert FFN (ABI 1.6, moe.c). */
int cpu_moe(struct loom_backend_ctx *ctx, const struct loom_moe_args *a);

#endif /* LOOM_CPU_H */
