/*
 * gpu_ctx.h: what gpu.c (the operators) and gpu_region.c (step regions
 * and their graphs) share inside the GPU backends: the context, the record
 * of one operator call, and the functions each file lends the other.
 *
 * Every operator call becomes a `struct call` holding its arguments by
 * value. Outside a region the call is prepared and run at once; inside a
 * region it is kept, and graph_end prepares and runs (or replays) all of
 * the region's calls together. Preparing is where the device tables the
 * calls read (embed ids, kv_write slots, attention tables) are downloaded
 * (all in one batch), checked on the host, and attention is planned.
 */
#ifndef LOOM_GPU_CTX_H
#define LOOM_GPU_CTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu_rt.h"

#ifndef GPU_BACKEND_NAME
#error "GPU_BACKEND_NAME must name the backend (\"cuda\" or \"rocm\")"
#endif

enum call_kind {
	CALL_GEMM, CALL_EMBED, CALL_RMSNORM, CALL_ROPE, CALL_GLU, CALL_ADD,
	CALL_SCALE, CALL_KV_WRITE, CALL_ATTENTION, CALL_COPY, CALL_SOFTCAP, CALL_MOE,
};

struct embed_call {
	float *out;
	const void *table;
	const int32_t *ids;
	size_t row_bytes;
	int64_t n_rows, dim, n_ids;
	uint32_t type;
};

/* rmsnorm (x, w, eps), glu (x = gate, w = up, kind), add (x = a, w = b,
 * b_rows), scale (y in place, s) */
struct rows_call {
	float *y;
	const float *x, *w;
	int64_t y_stride, x_stride, w_stride, b_rows, rows, n;
	float eps, s;
	int32_t kind;
};

struct copy_call {
	void *dst;
	const void *src;
	size_t n;
};

/* The routed experts (moe): the arguments, with the host arrays of expert
 * addresses copied at the call (gate, up, down: n_expert each, from
 * ctx->moe_tabs[tab]; the shared expert's three), so a deferred call does
 * not read the host's arrays later. */
struct moe_call {
	struct loom_moe_args a;
	int64_t tab;
	const void *shared_w[3];
};

/* One operator call. Calls are zeroed before their fields are set one by
 * one, so two calls with the same arguments compare equal with memcmp
 * (no stray padding bytes). */
struct call {
	int64_t kind;
	union {
		struct loom_gemm_args gemm;
		struct embed_call embed;
		struct rows_call rows;
		struct loom_rope_args rope;
		struct loom_kv_write_args kv;
		struct loom_attention_args attn;
		struct copy_call copy;
		struct moe_call moe;
	} u;
};

/* Where an attention call's work items sit in the device items buffer
 * (16-byte records): tiles first, then split-K rows, then the tree table
 * (n_tree records, none without token trees). A replay must match the
 * plans as well as the calls. */
struct attn_plan {
	int64_t tiles, n_tiles, rows, n_rows, n_splits, tree, n_tree;
	/* a kv_write: the cache slots this step writes lie apart from every
	 * row the ropes before it and the call itself read (gpu_fuse.c may
	 * fuse them; a replay needs the same answer) */
	int64_t caches_apart;
};

/* A RoPE table (gpurt_rope_table) on the device, for one (freq_base,
 * n_rot): n_rot / 2 doubles, then inv_f's and inv_lo's n_rot / 2 floats. */
struct rope_tab {
	float base;
	int64_t n_rot;
	void *dev;
};

/* A device table some call reads, staged in pinned host memory: host
 * is where its bytes are (in the upload ring when they were uploaded
 * this step, else downloaded to stage + off). */
struct fetch {
	const void *dev;
	size_t bytes, off;
	const void *host;
};

/* Device bytes [dev, dev + bytes) hold what the upload ring holds at off:
 * uploaded since the last wait, and nothing has run since that could
 * have written them. */
struct shadow {
	const void *dev;
	size_t bytes, off;
};

/* A captured step: the calls and plans it was captured from. */
struct graph_entry {
	struct gpurt_graph *graph;
	uint64_t last_use, epoch;
	struct call *calls;
	struct attn_plan *plans;
	int64_t n_calls;
};

/* An NCCL-shaped communicator opened over one host communicator. */
struct comm_entry {
	void *mpi_comm;
	int n_ranks, rank;
	struct gpurt_comm *comm;
};

#define COMM_SLOTS 4   /* host communicators one context serves */
#define GRAPH_SLOTS 32 /* captured steps kept (least recently used goes) */
#define SEEN_SLOTS 64  /* steps remembered; the second sighting is captured */

/* A weight weight_pack packed (gpu_pack.c): its device address, layout
 * type (GPU_Q4_0P, GPU_Q8_0P, GPU_Q6_KP), shape and row stride. */
struct gpu_pack {
	const void *ptr;
	uint32_t type;
	int64_t n, k;
	size_t row;
};

struct loom_backend_ctx {
	const struct loom_backend_host *host;
	struct gpurt *rt;
	bool invariant;
	bool exact;     /* f32 activations everywhere (else fast GEMV: 8-bit activations) */
	bool half_gemm; /* prefill of f16 / quantized weights on f16 tensor cores */
	bool graphs_on; /* capture repeated steps (LOOM_GPU_GRAPHS=0: never) */
	bool fuse;      /* GEMV groups in regions (LOOM_GPU_FUSE=0: never) */
	bool pack;      /* weight_pack repacks q4_0/q8_0/q6_K (LOOM_GPU_PACK=0: never) */
	struct gpu_pack *packs; /* open addressing by ptr, packs_cap a power of two */
	size_t packs_cap, n_packs;
	uint64_t n_packed, packed_bytes; /* weights packed so far (LOOM_DEBUG) */
	int64_t mmq_max_m; /* fast mode: int8 GEMM up to this m (LOOM_GPU_MMQ_MAX_M) */
	bool mma;          /* int8 GEMM on tensor cores (LOOM_GPU_MMA, where built) */
	uint64_t n_mmq_mma, n_mmq_dp4a; /* int8 GEMM launches by each inner product */
	void *scratch;  /* device: weight panels, split-K partials, 8-bit activations */
	size_t scratch_cap;
	void *items; /* device: attention work items */
	size_t items_cap;
	uint64_t mem_epoch; /* bumped whenever scratch or items move */
	void *hitems;       /* host: work items of the calls being prepared */
	size_t hitems_cap;
	int64_t n_hitems;
	struct fetch *fetches; /* tables the calls being prepared read */
	int64_t n_fetches, fetches_cap;
	void *stage; /* pinned host memory the tables are downloaded to */
	size_t stage_cap;
	/* small uploads (step inputs, work items) go through this pinned ring
	 * without waiting; it is reused after the next wait */
	void *ring;
	size_t ring_cap, ring_used;
	struct shadow *shadows;
	int64_t n_shadows, shadows_cap;
	/* host waits for the device (from the first step region on: loading
	 * weights waits too); step regions run */
	uint64_t n_waits, n_steps;
	uint64_t n_sampled; /* rows sampled by the sample slot (LOOM_DEBUG) */
	bool queued; /* work queued since the last wait (else synchronize returns at once) */
	/* the step region being recorded */
	bool in_region;
	int region_rc;
	struct call *calls;
	struct attn_plan *plans;
	int64_t n_calls, calls_cap;
	/* captured steps */
	struct graph_entry graphs[GRAPH_SLOTS];
	struct graph_entry *last; /* the graph replayed or captured last */
	uint64_t seen[SEEN_SLOTS];
	int seen_next;
	uint64_t tick, n_captured, n_replayed, n_direct;
	uint64_t n_groups, n_group_calls; /* GEMV groups run, and the calls in them */
	uint64_t n_rope_kv, n_rope_kv_calls; /* rope + kv_write launches, and their calls */
	struct rope_tab *rope_tabs; /* made at the first rope call of each kind */
	int64_t n_rope_tabs;
	/* collectives (gpu_coll.c) */
	struct comm_entry comms[COMM_SLOTS];
	int n_comms;
	void *coll_buf; /* device: the all-gather's send and receive blocks */
	size_t coll_cap;
	/* host: the expert addresses of the moe calls being recorded (or of
	 * the one direct call), uploaded with the work items */
	const void **moe_tabs;
	int64_t n_moe_tabs, moe_tabs_cap;
};

/* ---- gpu.c ---- */
void gpu_log(const struct loom_backend_host *host, enum loom_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* A failed gpurt call: logs its reason, passes its status on. */
int rt_failed(struct loom_backend_ctx *ctx, int rc);
/* Checks what n calls read from device tables, plans their attention
 * (plans[i] for call i), uploads the work items and reserves the scratch
 * they need: after it, exec_calls queues only kernels and BLAS calls. */
int prepare_calls(struct loom_backend_ctx *ctx, const struct call *calls,
		  struct attn_plan *plans, int64_t n);
void shadows_clear(struct loom_backend_ctx *ctx);
int exec_calls(struct loom_backend_ctx *ctx, const struct call *calls,
	       const struct attn_plan *plans, int64_t n);

/* Whether gemm a runs as a GEMV (*q8: on 8-bit activations). */
bool gemm_groupable(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a, bool *q8);
/* Where a's 8-bit activations go in the scratch (reserved by
 * prepare_calls); gemv_quantize also quantizes them there. */
int gemv_q8_buffers(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a, int8_t **qs,
		    void **scale);
int gemv_quantize(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a, int8_t **qs,
		  void **scale);

/* The RoPE table for a's freq_base and n_rot (make: made and uploaded if
 * there is none yet, which prepare_calls does before anything runs). */
int rope_table(struct loom_backend_ctx *ctx, const struct loom_rope_args *a, bool make,
	       struct gpurt_rope_table *t);

int gpu_buffer_alloc(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out);
void gpu_buffer_free(struct loom_backend_ctx *ctx, struct loom_buffer *buf);
void *gpu_buffer_addr(struct loom_backend_ctx *ctx, struct loom_buffer *buf);

/* ---- gpu_pack.c ---- */
/* The weight_pack slot (ABI 1.2): q4_0, q8_0, q6_K into gpu_rt.h's layout. */
int gpu_weight_pack(struct loom_backend_ctx *ctx, const struct loom_weight_pack_args *a,
		    struct loom_buffer **out, size_t *bytes);
/* The pack at device address ptr, or NULL. */
const struct gpu_pack *gpu_pack_find(const struct loom_backend_ctx *ctx, const void *ptr);
/* Forgets the pack at ptr (its buffer is being freed); no-op for others. */
void gpu_pack_forget(struct loom_backend_ctx *ctx, const void *ptr);
void packs_free(struct loom_backend_ctx *ctx);
int gpu_pack_view(const struct loom_backend_ctx *ctx, const void *w, uint32_t type, int64_t n,
		  int64_t k, uint32_t *view_type, size_t *row);

/* ---- gpu_fuse.c ---- */
/* A run of calls that runs as one GEMV group (gpurt_gemv_group): gemms
 * over the same rows, each with the add that consumes its output, or a
 * gate and up pair (gate first) with their GLU; before them, optionally,
 * the norm that makes their rows (then norm_q8: it quantizes them) and
 * the add before that norm. An add and a norm may also make a run alone
 * (n 0). */
struct gpu_group {
	const struct rows_call *norm_add, *norm;
	bool norm_q8;
	int n; /* gemms */
	bool q8;
	const struct loom_gemm_args *gemm[GPURT_GROUP_MAX];
	const struct rows_call *add[GPURT_GROUP_MAX];
	const struct rows_call *glu;
};
/* How many of the n calls from c on run as one group (0: none). */
int64_t gpu_find_group(const struct loom_backend_ctx *ctx, const struct call *c, int64_t n,
		       struct gpu_group *g);
int gpu_run_group(struct loom_backend_ctx *ctx, const struct gpu_group *g);
/* RoPE of k (and of q right before it) with the kv_write of k's rows
 * after it (gpurt_rope_kv). */
struct gpu_rope_kv {
	const struct rows_call *qn, *kn; /* the head norms before them, or NULL */
	const struct loom_rope_args *q, *k;
	const struct loom_kv_write_args *w;
};
/* Whether kv_write call c[i] (slots: its staged table) writes cache slots
 * apart from the rows the ropes before it and the call itself read. */
bool gpu_caches_apart(const struct call *c, int64_t i, const int32_t *slots);
/* How many of the n calls from c on (plans alongside) run as one rope +
 * kv_write launch (0: none), with the head norms of q and k before them
 * (5 calls) when they may. */
int64_t gpu_find_rope_kv(const struct call *c, const struct attn_plan *pl, int64_t n,
			 struct gpu_rope_kv *f);
int gpu_run_rope_kv(struct loom_backend_ctx *ctx, const struct gpu_rope_kv *f);

/* ---- gpu_region.c ---- */
/* Appends a call to the open region (which fails if memory runs out). */
int region_add(struct loom_backend_ctx *ctx, const struct call *c);
/* A call a region may not contain: it fails, and fails the region. */
int refused_in_region(struct loom_backend_ctx *ctx, const char *what);
int gpu_graph_begin(struct loom_backend_ctx *ctx);
int gpu_graph_end(struct loom_backend_ctx *ctx);
/* Frees every captured graph and the region's storage. */
void regions_free(struct loom_backend_ctx *ctx);

/* ---- gpu_coll.c ---- */
/* The collective slot (ABI 1.4); built where GPU_COLL is set. */
int gpu_collective(struct loom_backend_ctx *ctx, const struct loom_collective_args *a);
/* Leaves every communicator and frees the collectives' buffer. */
void colls_free(struct loom_backend_ctx *ctx);

#endif /* LOOM_GPU_CTX_H */
