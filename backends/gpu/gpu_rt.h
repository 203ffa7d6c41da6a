/*
 * gpu_rt.h: the seam between the host-side backend (gpu.c, plain C11, no
 * vendor header) and the device side (kernels.cu, built by nvcc or hipcc).
 *
 * Every gpurt_* call returns a loom_status: LOOM_OK, LOOM_ERR_DEVICE when a
 * runtime call failed (gpurt_error() then says which and why), or
 * LOOM_ERR_NOMEM when a device allocation failed. Arguments arrive already
 * validated by gpu.c; these functions only check what the device limits
 * (grid sizes, int ranges of the BLAS interface).
 *
 * All work is queued on the context's one stream, in call order.
 */
#ifndef LOOM_GPU_RT_H
#define LOOM_GPU_RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gpurt;

/* Largest head_dim the attention kernels take. */
#define GPU_ATTN_MAX_HEAD_DIM 256
/* Largest head_dim of the tiled prefill kernel (larger ones use split-K). */
#define GPU_ATTN_PREFILL_MAX_HEAD_DIM 128
/* Query rows per prefill tile; keys per split of the split-K kernel. */
#define GPU_ATTN_TILE_Q 16
#define GPU_ATTN_SPLIT 256

/* "CUDA" or "ROCm/HIP". */
const char *gpurt_vendor(void);
/* Number of devices; on failure err holds the runtime's reason. */
int gpurt_device_count(int *n, char *err, size_t errlen);
int gpurt_open(int device, struct gpurt **out, char *err, size_t errlen);
void gpurt_close(struct gpurt *rt);
/* Text of the last failure (never NULL). */
const char *gpurt_error(const struct gpurt *rt);
/* Kernels queued on the stream so far (LOOM_DEBUG; a graph's replays
 * run theirs without queueing them again). */
uint64_t gpurt_launches(const struct gpurt *rt);
int gpurt_info(struct gpurt *rt, char *name, size_t cap, uint64_t *total, uint64_t *avail);
/* Whether prefill GEMM goes through a vendor BLAS (cuBLAS) or the tiled kernel. */
bool gpurt_has_blas(void);

int gpurt_alloc(struct gpurt *rt, size_t size, void **out);
/* Waits for queued work first, so nothing still uses the memory. */
void gpurt_free(struct gpurt *rt, void *p);
/* upload and download return once the copy is complete. */
int gpurt_upload(struct gpurt *rt, void *dst, const void *src, size_t n);
int gpurt_download(struct gpurt *rt, void *dst, const void *src, size_t n);
/* Queues a copy to pinned host memory (from gpurt_host_alloc); the data
 * is there after the next gpurt_sync. */
/* Queues a copy from pinned host memory (gpurt_host_alloc), which must
 * stay untouched until the next gpurt_sync. */
int gpurt_upload_async(struct gpurt *rt, void *dst, const void *src, size_t n);
int gpurt_download_async(struct gpurt *rt, void *dst, const void *src, size_t n);
/* Pinned (page-locked) host memory; host_free waits for queued work. */
int gpurt_host_alloc(struct gpurt *rt, size_t size, void **out);
void gpurt_host_free(struct gpurt *rt, void *p);
int gpurt_copy(struct gpurt *rt, void *dst, const void *src, size_t n);
int gpurt_sync(struct gpurt *rt);

/* Step graphs. Between capture_begin and capture_end the work queued on
 * the stream is recorded, not run. capture_end always ends the capture;
 * with keep it yields the recorded graph (an error if the capture failed),
 * without it discards whatever was recorded. graph_launch queues one run
 * of a graph; graph_free waits for queued work first. */
struct gpurt_graph;
int gpurt_capture_begin(struct gpurt *rt);
int gpurt_capture_end(struct gpurt *rt, bool keep, struct gpurt_graph **out);
int gpurt_graph_launch(struct gpurt *rt, struct gpurt_graph *g);
void gpurt_graph_free(struct gpurt *rt, struct gpurt_graph *g);

/* Weight formats the kernels decode in place (f32, f16, bf16, q8_0,
 * q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, mxfp4: every
 * format loom reads), with their block geometry (values and bytes per block). */
bool gpurt_format_known(uint32_t type);
uint32_t gpurt_block_elems(uint32_t type);
uint32_t gpurt_block_bytes(uint32_t type);

/*
 * The backend's own weight layouts (the weight_pack slot, ABI 1.2): a
 * packed q4_0 or q8_0 weight is passed to every gpurt_* call that reads
 * weights with these types (gpu.c turns a packed gemm's type into them),
 * rows gpurt_packed_row() bytes apart. A row of k values: the quants of
 * its k/32 blocks, 16 bytes a q4_0 block and 32 a q8_0 block in GGUF's
 * byte order, then the blocks' f16 scales, the row padded to 16 bytes; so
 * every block's quants are 16-byte aligned (128-bit loads) and a warp's
 * lanes read consecutive quants and consecutive scales. The values and
 * the arithmetic are those of the GGUF layout: same bits.
 */
#define GPU_TYPE_PACKED 0x100u
#define GPU_Q4_0P (GPU_TYPE_PACKED | LOOM_TYPE_Q4_0)
#define GPU_Q8_0P (GPU_TYPE_PACKED | LOOM_TYPE_Q8_0)
/* q6_K: per row the first 208 bytes of every super-block (ql, qh and the
 * int8 scales, GGUF's order), then the super-blocks' f16 d, padded to 16
 * bytes: GGUF's 210-byte blocks leave ql and qh 2-byte aligned. */
#define GPU_Q6_KP (GPU_TYPE_PACKED | LOOM_TYPE_Q6_K)
/* Bytes of a packed row of k values of q4_0, q8_0 (k a multiple of 32)
 * or q6_K (of 256); 0 for any other type or k. */
size_t gpurt_packed_row(uint32_t type, int64_t k);

/* y[i][j] = x[i] . W[j] for i < m, j < n, one warp per weight row. The
 * arithmetic for y[i][j] does not depend on m or on i's place in x. */
int gpurt_gemv(struct gpurt *rt, const struct loom_gemm_args *a);
/* Fast GEMV (outside exact mode): the formats it takes (q4_0, q8_0,
 * q4_K, q6_K; k a multiple of their block), the activations quantized per row
 * in blocks of 32 (qs: m x k int8, rows k apart; scale: m x k/32 pairs of
 * floats, 8 bytes each, 8-byte aligned), then y = x . W^T from them with
 * integer dot products. Per output, the arithmetic does not depend on m. */
bool gpurt_gemv_q8_format(uint32_t type);
int gpurt_quantize_q8(struct gpurt *rt, const float *x, int64_t x_stride, int64_t m, int64_t k,
		      int8_t *qs, void *scale);
int gpurt_gemv_q8(struct gpurt *rt, const struct loom_gemm_args *a, const int8_t *qs,
		  const void *scale);
/*
 * GEMV groups: up to GPURT_GROUP_MAX gemms of one weight type over the same
 * activation rows (m x k) in one launch, each y = x . W^T computed as
 * gpurt_gemv (qs NULL: x, x_stride) or gpurt_gemv_q8 (qs, scale as
 * there) computes it, bit for bit. A member with `other` then adds its
 * output to other: out[i][j] = y[i][j] + other[i][j] (y_first) or
 * other[i][j] + y[i][j], other's rows other_stride floats apart (0: the
 * same row for every i); out may be y or other exactly. With glu >= 0
 * (enum loom_glu_kind) the group is a gate (member 0) and an up (member
 * 1) of the same n, without adds, and glu_out[i][j] = act(gate y) * up y
 * is written after both. What a member writes may not overlap what
 * another member reads.
 */
#define GPURT_GROUP_MAX 3
struct gpurt_gemv_member {
	const void *w;
	size_t w_stride;
	int64_t n;
	float *y;
	int64_t y_stride;
	const float *other; /* NULL: no add */
	int64_t other_stride;
	float *out;
	int64_t out_stride;
	int32_t y_first;
};
struct gpurt_gemv_group {
	uint32_t type;
	int32_t n_members, glu;
	int64_t m, k;
	const float *x;
	int64_t x_stride;
	float *glu_out;
	int64_t glu_stride;
	struct gpurt_gemv_member mem[GPURT_GROUP_MAX];
};
int gpurt_gemv_group(struct gpurt *rt, const struct gpurt_gemv_group *g, const int8_t *qs,
		     const void *scale);
/* The same product from the same 8-bit activations for batches (any m
 * up to 65535 x 64): tiles of 64 x 64 outputs, each weight block decoded
 * once per 64 activation rows, never dequantized to memory. Not batch
 * invariant. mma: the integer dots on int8 tensor cores (only where
 * gpurt_has_mma), else by dp4a; the same bits either way. */
int gpurt_mmq(struct gpurt *rt, const struct loom_gemm_args *a, const int8_t *qs,
	      const void *scale, bool mma);
/* Whether this build and rt's device run int8 tensor-core MMA (CUDA
 * compute capability 8.0+, the warp-32 emulator; never HIP). */
bool gpurt_has_mma(struct gpurt *rt);
/*
 * Routed experts (the moe slot). gpurt_moe_route: each of rows rows of
 * router logits picks n_used experts (loom/moe.h's loom_moe_route_as with
 * gating and norm; p: rows x n_expert floats of scratch) into ids and w
 * ([rows][n_used]); then the slots (r * n_used + j) are grouped by expert:
 * expert e's, ascending, are order[start[e] .. start[e + 1]).
 * gpurt_moe_gemv: for every expert e and slot s of e, y[s][j] = x[s /
 * x_div] . W_e[j] (+ bias[e * n + j]) for j < n, W_e the [n][k] matrix at
 * w[e] (w: a DEVICE array of n_expert addresses), each product computed
 * bit for bit as gpurt_gemv (or, with xq, gpurt_gemv_q8) computes it. gpurt_moe_combine: y[r] = sum
 * over j in order of w[r][j] * d[r * k + j] (d rows n floats apart).
 * gpurt_moe_shared: y[r] += sigmoid(s[r]) * d[r].
 */
struct gpurt_moe_route {
	uint32_t gating, norm;
	const float *logits;
	int64_t logits_stride, rows, n_expert, n_used;
	float *p;
	int32_t *ids;
	float *w;
	int32_t *order, *start;
};
struct gpurt_moe_gemv {
	uint32_t type;
	const void *const *w;
	size_t w_stride;
	int64_t n, k, n_expert;
	const float *x;
	int64_t x_stride, x_div;
	const float *bias;
	float *y;
	int64_t y_stride;
	const int32_t *order, *start;
	/* fast (a gpurt_gemv_q8_format type): x's rows quantized as
	 * gpurt_quantize_q8 does (k values a row), the products as
	 * gpurt_gemv_q8's; NULL: f32 x as gpurt_gemv */
	const int8_t *xq;
	const void *xs;
};
int gpurt_moe_route(struct gpurt *rt, const struct gpurt_moe_route *p);
int gpurt_moe_gemv(struct gpurt *rt, const struct gpurt_moe_gemv *g);
int gpurt_moe_combine(struct gpurt *rt, float *y, int64_t y_stride, const float *d,
		      const float *w, int64_t rows, int64_t k, int64_t n);
int gpurt_moe_shared(struct gpurt *rt, float *y, int64_t y_stride, const float *s,
		     const float *d, int64_t rows, int64_t n);
/* ids[i] = index of the largest of x[i * stride .. + n) (NaN lowest,
 * ties to the lowest index), n <= INT32_MAX. */
/* Sampling of struct loom_sample_args (ABI 1.8), arguments checked. */
int gpurt_sample(struct gpurt *rt, const struct loom_sample_args *a);
int gpurt_argmax(struct gpurt *rt, int32_t *ids, const float *x, int64_t stride, int64_t rows,
		 int64_t n);
/* dst[r][0..k) = row r of W (rows rows from w, w_stride bytes apart),
 * dst rows dst_stride floats apart. With ids, row r is ids[r] (device). */
int gpurt_dequant(struct gpurt *rt, uint32_t type, const void *w, size_t w_stride,
		  int64_t k, int64_t rows, const int32_t *ids, float *dst, int64_t dst_stride);
/* y[i][j] = x[i] . p[j] for i < m, j < n; p is f32 [n][k], rows ldp
 * floats apart. */
int gpurt_sgemm(struct gpurt *rt, int64_t m, int64_t n, int64_t k, const float *x,
		int64_t x_stride, const float *p, int64_t ldp, float *y, int64_t y_stride);

/* The tensor-core prefill path (vendor BLAS builds only; gpurt_has_blas()):
 * weight rows dequantized to f16 (dst rows dst_stride halves apart),
 * activation rows converted to f16 or bf16 (dst rows k apart), then
 * y[i][j] = x[i] . p[j] with f32 accumulation, x and p both f16 or both
 * bf16, p's rows ldp elements apart. */
int gpurt_dequant_half(struct gpurt *rt, uint32_t type, const void *w, size_t w_stride,
		       int64_t k, int64_t rows, uint16_t *dst, int64_t dst_stride);
int gpurt_to_half(struct gpurt *rt, const float *x, int64_t x_stride, int64_t rows, int64_t k,
		  bool bf16, uint16_t *dst);
int gpurt_hgemm(struct gpurt *rt, int64_t m, int64_t n, int64_t k, const uint16_t *x,
		const uint16_t *p, int64_t ldp, bool bf16, float *y, int64_t y_stride);

int gpurt_rmsnorm(struct gpurt *rt, float *y, int64_t y_stride, const float *x,
		  int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps);
/* RMSNorm with what precedes and follows it in one kernel: y[r] = x[r]
 * normalized, times w, as gpurt_rmsnorm. With a: first x[r] = a[r] +
 * b[r] (b_stride 0: b's one row for every r), as gpurt_add, written to
 * x. With qs: y also quantized to 8 bits (k = n) as gpurt_quantize_q8
 * quantizes it. Rows are made one block each: a row's writes may not
 * overlap another row's reads. */
struct gpurt_norm {
	float *y;
	int64_t y_stride;
	float *x;
	int64_t x_stride;
	const float *w;
	int64_t rows, n;
	float eps;
	const float *a, *b; /* a NULL: no add */
	int64_t a_stride, b_stride;
	int8_t *qs; /* NULL: no quantization */
	void *scale;
};
int gpurt_norm(struct gpurt *rt, const struct gpurt_norm *n);
/* RoPE's per-pair inverse frequencies, made once per (freq_base, n_rot) on
 * the host (gpu.c): inv[i] = pow(freq_base, -2i / n_rot) in double, as
 * ref.so computes it, inv_f[i] = (float)inv[i] and inv_lo[i] =
 * (float)(inv[i] - inv_f[i]) (device arrays of n_rot / 2). Exact: each
 * angle is ref.so's double (double)pos * freq_scale * inv[i] (/
 * freq_factors[i]) with double cos and sin, so the bits are ref.so's;
 * fast: the same angle in f32 arithmetic as a compensated sum (inv_f +
 * inv_lo, rounding errors kept by fmaf), sincosf, no double. */
struct gpurt_rope_table {
	const double *inv;
	const float *inv_f, *inv_lo;
	int32_t fast;
};
int gpurt_rope(struct gpurt *rt, const struct loom_rope_args *a, const struct gpurt_rope_table *t);
/* q's RoPE (q may be NULL), k's RoPE, then kv_write w of k's rows (w->k,
 * k_stride, n_tokens, kv_dim: exactly the rows k rotates) and v, in one
 * launch; q and k share t (the same freq_base and n_rot). The bits of the
 * three calls one after the other, provided nothing one of them writes
 * overlaps what another reads (gpu_fuse.c checks that). q8_0 and q4_0
 * caches need head_dim a multiple of 32 and, in NEOX mode, n_rot a
 * multiple of 64 (a thread owns the blocks whose values pair up). */
int gpurt_rope_kv(struct gpurt *rt, const struct loom_rope_args *q, const struct loom_rope_args *k,
		  const struct loom_kv_write_args *w, const struct gpurt_rope_table *t);
/* The same with the head norms before the ropes (Qwen3, Gemma 3): q's
 * and k's rows normalized in place head by head (rmsnorm with q_w, k_w
 * of head_dim each), as gpurt_rmsnorm normalizes rows of head_dim, then
 * gpurt_rope_kv's work: the bits of the five calls one after the other
 * (gpu_fuse.c checks they may run together). head_dim a whole number of
 * the cache's units. */
struct gpurt_head_norms {
	const float *q_w, *k_w;
	float q_eps, k_eps;
};
int gpurt_norm_rope_kv(struct gpurt *rt, const struct gpurt_head_norms *n,
		       const struct loom_rope_args *q, const struct loom_rope_args *k,
		       const struct loom_kv_write_args *w, const struct gpurt_rope_table *t);
int gpurt_glu(struct gpurt *rt, enum loom_glu_kind kind, float *out, int64_t out_stride,
	      const float *gate, int64_t gate_stride, const float *up, int64_t up_stride,
	      int64_t rows, int64_t n);
int gpurt_add(struct gpurt *rt, float *out, int64_t out_stride, const float *a,
	      int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows,
	      int64_t rows, int64_t n);
int gpurt_scale(struct gpurt *rt, float *x, int64_t stride, int64_t rows, int64_t n, float s);
int gpurt_softcap(struct gpurt *rt, float *x, int64_t stride, int64_t rows, int64_t n, float cap);
int gpurt_kv_write(struct gpurt *rt, const struct loom_kv_write_args *a);

/* Work items of the attention kernels, built and uploaded by gpu.c.
 * A row item is one query row at position pos attending to [lo, pos];
 * a tile item is n (<= GPU_ATTN_TILE_Q) consecutive rows of one sequence,
 * the first at position pos. With token trees (ABI 1.8) a row's
 * positions map to cache indices through the call's tree table: entry
 * `row` is -1 for a causal row (position t is cache index t), else the
 * offset of its chain record [base, c_0, ..., c_depth]: position t is
 * cache index t below base, c_(t - base) from there (pos = base + depth). */
struct gpu_attn_row {
	int32_t seq, row, pos, lo;
};
struct gpu_attn_tile {
	int32_t seq, row, pos, n;
};
/* Tiled (flash-style) prefill over n_tiles tiles; head_dim must be at most
 * GPU_ATTN_PREFILL_MAX_HEAD_DIM. */
int gpurt_attn_prefill(struct gpurt *rt, const struct loom_attention_args *a,
		       const struct gpu_attn_tile *tiles, int64_t n_tiles);
/* Split-K over n_items rows: n_splits splits of GPU_ATTN_SPLIT keys each,
 * partial results in `partial` (n_items * n_heads * n_splits * (head_dim
 * + 2) floats), then one combine pass. tree: the call's device tree
 * table, NULL when every row is causal. */
int gpurt_attn_split(struct gpurt *rt, const struct loom_attention_args *a,
		     const struct gpu_attn_row *items, int64_t n_items, int64_t n_splits,
		     const int32_t *tree, float *partial);

/*
 * Collectives between the processes of a distributed job, each with its
 * own device: an NCCL-shaped communicator (gpu_coll.c builds the slot on
 * it). CUDA builds with GPU_HAVE_NCCL call NCCL; the emulator's
 * (GPU_EMU_NCCL) runs the same calls over MPI on its host-memory device.
 * In builds with neither (rocm.so: no RCCL) gpurt_has_comm() is false and
 * the communicator calls return LOOM_ERR_UNSUPPORTED.
 */
#define GPURT_COMM_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
struct gpurt_comm;
bool gpurt_has_comm(void);
/* A new unique id (ncclGetUniqueId): one rank makes it, and every rank
 * opens the communicator with the same bytes. */
int gpurt_comm_id(struct gpurt *rt, unsigned char id[GPURT_COMM_ID_BYTES]);
/* Joins n_ranks processes as rank `rank` (ncclCommInitRank), blocking
 * until all have joined. mpi_comm is the host's communicator of these
 * same ranks: NCCL ignores it (the id connects the ranks), the emulator
 * moves its data over it. */
int gpurt_comm_open(struct gpurt *rt, const unsigned char id[GPURT_COMM_ID_BYTES],
		    int n_ranks, int rank, void *mpi_comm, struct gpurt_comm **out);
/* Waits for queued work, then leaves the communicator. */
void gpurt_comm_close(struct gpurt *rt, struct gpurt_comm *c);
/* recv[r * count + i] = rank r's send[i] for i < count, on every rank
 * (ncclAllGather of f32), queued on the stream; send and recv are apart. */
int gpurt_all_gather(struct gpurt *rt, struct gpurt_comm *c, const float *send, float *recv,
		     size_t count);
/* dst[i][j] = src[i][j] for i < rows, j < cols; rows dst_stride and
 * src_stride floats apart. */
int gpurt_copy_cols(struct gpurt *rt, float *dst, int64_t dst_stride, const float *src,
		    int64_t src_stride, int64_t rows, int64_t cols);
/* y[i][j] = ((p_0[i][j] + p_1[i][j]) + p_2[i][j]) ... over n_parts parts,
 * part k at p + k * part_floats, its rows p_stride floats apart. */
int gpurt_sum_parts(struct gpurt *rt, float *y, int64_t y_stride, const float *p,
		    int64_t p_stride, int64_t part_floats, int n_parts, int64_t rows,
		    int64_t cols);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_GPU_RT_H */
