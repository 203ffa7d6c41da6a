/*
 * loom backend ABI, version 1 (minor 9).
 *
 * This is the only header a backend author includes. A backend is a shared
 * object that exports exactly one symbol, LOOM_BACKEND_ENTRY
 * ("loom_backend_entry"), returning a pointer to a `const struct
 * loom_backend_ops`. The host checks abi_major and struct_size before it
 * calls anything else, so probing a backend has no side effects.
 *
 * Versioning: abi_major changes only when an existing slot changes meaning.
 * New slots are appended at the end (each generation marked below) and
 * struct_size tells the host which slots exist; the host never reads past
 * struct_size and treats a missing optional slot as NULL.
 *
 * Memory model: a backend owns its device memory. The host asks for buffers
 * with buffer_alloc and receives an opaque buffer plus a *device address*
 * (buffer_addr). Device addresses are `void *` values the host only offsets
 * (base + byte offset) and passes back to operators; it never dereferences
 * them. On host-memory backends (ref, cpu) they happen to be host pointers.
 *
 * Errors: every slot that can fail returns enum loom_status (0 on success,
 * negative on failure) and never aborts or exits the process. On failure
 * output buffers hold unspecified contents; inputs are unchanged. A backend
 * may describe the last failure through host->log.
 *
 * Threading: the host calls a backend context from one thread at a time.
 * A backend may use its own threads inside a call. Operators may be
 * asynchronous on devices with queues; synchronize() and download() are the
 * points where results become visible to the host.
 */
#ifndef LOOM_BACKEND_H
#define LOOM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_BACKEND_ABI_MAJOR 1
#define LOOM_BACKEND_ABI_MINOR 9
#define LOOM_BACKEND_ENTRY "loom_backend_entry"

/* enum loom_status (LOOM_OK, LOOM_ERR_*) lives in loom/status.h. */

/* Weight and activation element types. Values are GGUF's ggml_type ids, so
 * a tensor's type read from a GGUF file is passed through unchanged. */
enum loom_type {
	LOOM_TYPE_F32 = 0,
	LOOM_TYPE_F16 = 1,
	LOOM_TYPE_Q4_0 = 2,
	LOOM_TYPE_Q4_1 = 3,
	LOOM_TYPE_Q5_0 = 6,
	LOOM_TYPE_Q5_1 = 7,
	LOOM_TYPE_Q8_0 = 8,
	LOOM_TYPE_Q8_1 = 9,
	LOOM_TYPE_Q2_K = 10,
	LOOM_TYPE_Q3_K = 11,
	LOOM_TYPE_Q4_K = 12,
	LOOM_TYPE_Q5_K = 13,
	LOOM_TYPE_Q6_K = 14,
	LOOM_TYPE_Q8_K = 15,
	LOOM_TYPE_BF16 = 30,
	LOOM_TYPE_MXFP4 = 39, /* E2M1 x 32 with an E8M0 scale (plugins/quant/mxfp4.c) */
	LOOM_TYPE_COUNT = 40, /* upper bound for tables indexed by type */
};

/* Operators, for supports(). */
enum loom_op {
	LOOM_OP_GEMM = 0,
	LOOM_OP_EMBED,
	LOOM_OP_RMSNORM,
	LOOM_OP_ROPE,
	LOOM_OP_GLU,
	LOOM_OP_ADD,
	LOOM_OP_SCALE,
	LOOM_OP_KV_WRITE,
	LOOM_OP_ATTENTION,
	LOOM_OP_COPY,
	LOOM_OP_SOFTCAP, /* generation 1.2 */
	/* generation 1.5: embed reads a table this backend packed
	 * (weight_pack, below); asked only of backends of ABI 1.5 or later */
	LOOM_OP_EMBED_PACKED,
	/* generation 1.8: attention honours loom_attention_args.parent (token
	 * trees); asked only of backends of ABI 1.8 or later, with the KV
	 * cache type */
	LOOM_OP_ATTENTION_TREE,
	/* generation 1.8 (gpt-oss), asked only of backends of ABI 1.8 or
	 * later, with type LOOM_TYPE_F32: attention reads `sinks` (struct
	 * loom_attention_args) for every KV type it supports; glu and moe
	 * run LOOM_GLU_SWIGLU_OAI, and moe reads the expert biases and
	 * LOOM_MOE_SOFTMAX_TOPK gating (struct loom_moe_args) */
	LOOM_OP_ATTENTION_SINKS,
	LOOM_OP_GLU_OAI,
	/* generation 1.9, asked only of backends of ABI 1.9 or later (type
	 * LOOM_TYPE_F32): the sample slot draws rows without top-k (the
	 * whole-vocabulary rule of struct loom_sample_args), and computes the
	 * log-probabilities a row's `logprobs` asks for */
	LOOM_OP_SAMPLE_FULL,
	LOOM_OP_SAMPLE_LOGPROBS,
	LOOM_OP_COUNT,
};

enum loom_log_level { LOOM_LOG_DEBUG, LOOM_LOG_INFO, LOOM_LOG_WARN, LOOM_LOG_ERROR };

/* Geometry of a block-quantized format: `block_elems` values are stored in
 * `block_bytes` bytes. Plain types have block_elems == 1. */
struct loom_format_info {
	uint32_t type;
	uint32_t block_elems;
	uint32_t block_bytes;
	const char *name;
};

/*
 * Services the host lends a backend. Valid from create() until destroy()
 * returns. A backend never links the core; everything it needs from the
 * host comes through here.
 */
struct loom_backend_host {
	uint32_t abi_major;
	uint32_t struct_size;
	void *host; /* first argument of every callback below */
	void (*log)(void *host, enum loom_log_level level, const char *msg);
	/* Geometry of a registered weight format, or NULL if none is registered. */
	const struct loom_format_info *(*format_info)(void *host, uint32_t type);
	/* Reference dequantization: n values (a whole number of blocks) of
	 * `type` from host memory `src` into `dst`. Returns loom_status. */
	int (*to_float)(void *host, uint32_t type, const void *src, float *dst, int64_t n);
};

/* loom_backend_config.flags */
#define LOOM_BACKEND_BATCH_INVARIANT (1u << 0)
/* Every row an operator produces (gemm, attention, norms, ...) must be
 * bitwise the same whatever else is in the batch: the result for one
 * sequence may not depend on which other sequences share the step or on
 * how its prompt was chunked. Servers ask for this so a request's output
 * does not change with load; a backend may be slower for it. */
#define LOOM_BACKEND_EXACT (1u << 1)
/* Exact mode: operators keep activations in f32
 * and compute what ref.so computes, up to the order of float sums; no
 * quantization of activations for integer dot products. Without it a
 * backend may run a fast mode whose results differ from ref.so within a
 * measured bound, but must still be deterministic (the same for any thread
 * count) and honour LOOM_BACKEND_BATCH_INVARIANT. A backend with no fast
 * mode ignores the flag (as backends built before it ignore every unknown
 * bit, which is right for them: they have no fast mode). */

struct loom_backend_config {
	uint32_t struct_size;
	int32_t device;    /* device index, 0 for the first */
	int32_t n_threads; /* <= 0: the backend chooses */
	uint32_t flags;    /* LOOM_BACKEND_*; unknown bits are ignored */
};

struct loom_device_info {
	char name[128];
	uint64_t mem_total; /* bytes; 0 if unknown */
	uint64_t mem_free;  /* bytes; 0 if unknown */
};

/* Opaque to the host. */
struct loom_backend_ctx;
struct loom_buffer;

/*
 * y = x . W^T : x is f32 [m][k] (row stride x_stride floats), W is [n][k]
 * in weight format w_type (row stride w_stride bytes, k a whole number of
 * blocks), y is f32 [m][n] (row stride y_stride floats). y must not alias
 * x or W.
 *
 * Generation 1.2 appends w_packed: non-zero when w is the address of a
 * buffer this backend returned from weight_pack() for this weight (then
 * w_stride is ignored). A backend reads it only when struct_size covers
 * it (LOOM_ARGS_HAS), so arguments from a 1.0/1.1 host still work.
 */
struct loom_gemm_args {
	uint32_t struct_size;
	uint32_t w_type;
	int64_t m, n, k;
	const void *w;
	size_t w_stride;
	const float *x;
	int64_t x_stride;
	float *y;
	int64_t y_stride;
	/* ---- generation 1.2 ---- */
	uint32_t w_packed;
};

/* Whether an argument struct from the other side of the ABI has `field`
 * (structs grow at the end; older ones are shorter). */
#define LOOM_ARGS_HAS(a, type, field) \
	((a)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))
/* The smallest loom_gemm_args a backend accepts (a 1.0 host's). */
#define LOOM_GEMM_ARGS_MIN_SIZE offsetof(struct loom_gemm_args, w_packed)
/* Whether a gemm call passes a packed weight. */
#define LOOM_GEMM_PACKED(a) \
	(LOOM_ARGS_HAS(a, struct loom_gemm_args, w_packed) && (a)->w_packed)

/*
 * A weight offered to weight_pack(): [n][k] in `type` (k a whole number of
 * blocks), in the GGUF layout, in HOST memory, rows src_stride bytes apart.
 */
struct loom_weight_pack_args {
	uint32_t struct_size;
	uint32_t type;
	int64_t n, k;
	const void *src;
	size_t src_stride;
};

enum loom_rope_mode {
	LOOM_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): GGUF llama */
	LOOM_ROPE_NEOX = 2, /* rotate halves (x[i], x[i + n_rot/2]): qwen2, gemma */
};

/*
 * In-place rotary embedding of x: [n_tokens][n_heads][head_dim] f32, token
 * rows row_stride floats apart. Token t sits at position pos[t] (device
 * int32 array). The first n_rot dims of each head are rotated; for pair i,
 * theta = pos * freq_scale * freq_base^(-2i/n_rot) / freq_factors[i]
 * (freq_factors: device f32 [n_rot/2] or NULL for all ones).
 */
struct loom_rope_args {
	uint32_t struct_size;
	uint32_t mode;
	float *x;
	int64_t n_tokens, n_heads, head_dim, n_rot, row_stride;
	const int32_t *pos;
	float freq_base, freq_scale;
	const float *freq_factors;
};

/*
 * Paged KV cache. One layer's K (and V) cache is a device array
 * [n_blocks][block_size][kv_dim] of kv_type values, kv_dim = n_kv_heads *
 * head_dim. A token's cache slot is block * block_size + offset; slot s
 * starts at byte s * row_bytes, row_bytes the size of kv_dim values.
 *
 * Generation 1.3 appends kv_type to both argument structs: LOOM_TYPE_F32
 * (what a 1.0-1.2 host means: its structs end before kv_type), F16, Q8_0
 * or Q4_0, the block layouts of GGUF (loom/kv_quant.h spells them out and
 * has helpers). kcache and vcache keep their f32 pointer type for source
 * compatibility; with another kv_type they are byte addresses. Quantized
 * types need kv_dim (kv_write) and head_dim (attention) multiples of 32.
 * kv_write rounds each row to the type (f16: to nearest even; q8_0/q4_0:
 * GGUF's reference quantizers); attention reads the stored values exactly
 * and computes in f32 as before. A backend answers supports(LOOM_OP_KV_WRITE
 * or LOOM_OP_ATTENTION, kv_type) for the types it stores, and refuses an
 * unknown or unsupported kv_type with LOOM_ERR_UNSUPPORTED.
 *
 * kv_write: for t < n_tokens, copy k[t] (row stride k_stride floats) to
 * kcache slot slots[t], and v[t] likewise. slots is a device int32 array.
 * Slots are meant to be distinct: where one repeats, that slot ends up
 * holding one of its rows, unspecified which (device backends write the
 * rows in parallel).
 */
struct loom_kv_write_args {
	uint32_t struct_size;
	float *kcache, *vcache;
	const float *k, *v;
	int64_t k_stride, v_stride;
	int64_t n_tokens, kv_dim;
	const int32_t *slots;
	/* ---- generation 1.3 ---- */
	uint32_t kv_type;  /* enum loom_type of the cache; F32 when absent */
	uint32_t reserved; /* zero */
};

/*
 * Attention over the paged cache for a flattened batch of n_seqs sequences.
 * Sequence s owns query rows q_start[s] .. q_start[s+1]-1 (its newest
 * q_len = q_start[s+1]-q_start[s] tokens, already written to the cache) and
 * has kv_len[s] cached tokens in all, so its query row i sits at position
 * kv_len[s] - q_len + i and attends causally to positions <= its own
 * (and > its own - window when window > 0). Its cache blocks are
 * block_table[s * max_blocks + j], j < ceil(kv_len[s] / block_size).
 * q and out are [rows][n_heads * head_dim] f32 with row strides q_stride /
 * out_stride floats; head h reads KV head h / (n_heads / n_kv_heads).
 * softmax(scale * q.k) . v, computed in f32. q_start, kv_len and
 * block_table are device int32 arrays.
 */
struct loom_attention_args {
	uint32_t struct_size;
	float *out;
	const float *q;
	int64_t q_stride, out_stride;
	const float *kcache, *vcache;
	int64_t n_seqs, n_heads, n_kv_heads, head_dim, block_size, max_blocks;
	const int32_t *q_start;
	const int32_t *kv_len;
	const int32_t *block_table;
	float scale;
	int32_t window;
	float softcap; /* > 0: scores = softcap * tanh(scores / softcap) */
	/* the 1.2 struct's tail padding, named so that kv_type starts past
	 * every 1.2 struct_size (a 1.2 host leaves it unset) */
	uint32_t reserved_1_2;
	/* ---- generation 1.3 ---- */
	uint32_t kv_type;  /* enum loom_type of the cache; F32 when absent */
	uint32_t reserved; /* zero */
	/* ---- generation 1.8 ---- */
	/*
	 * Token trees (speculative decoding). NULL, or absent from an older
	 * host's struct: every row is causal as above. Otherwise a device
	 * int32 array of one entry per query row, asked of a backend only when
	 * supports(LOOM_OP_ATTENTION_TREE, kv_type) says yes: parent[r] is
	 * the local index (0 .. i-1) of the parent of local query row i of its
	 * sequence, or -1 for a row whose parent is the cached prefix. Let
	 * base = kv_len[s] - q_len. Local row j's K/V sit at cache index
	 * base + j as usual; row i attends to cache indices 0 .. base-1 and
	 * to base + j for j on its ancestor chain (i, parent[i],
	 * parent[parent[i]], ... while >= 0), in ascending order, and its
	 * position is base + depth(i) (depth: the chain's length minus one);
	 * the window counts those positions (index j < base has position j,
	 * chain row j has base + depth(j)). parent[i] = i - 1 with parent[0]
	 * = -1 is the causal rule exactly. A row must see exactly what a
	 * causal row at its position over the same keys in the same order
	 * sees: cpu.so and ref.so give the same bits either way. A parent
	 * that is not -1 or below i is LOOM_ERR_INVALID.
	 */
	const int32_t *parent;
	/* Attention sinks (gpt-oss), after parent: device f32 [n_heads], NULL for none.
	 * Head h's output becomes acc / (sum + exp(sinks[h] - mx)) where mx
	 * is the largest score of the row's visible positions, sum the
	 * softmax denominator sum_t exp(score_t - mx) and acc the weighted
	 * sum of V: a learned logit per head that takes a share of the
	 * softmax and contributes no value. Read only when struct_size
	 * covers it (LOOM_ATTN_SINKS); a host passes sinks only to a
	 * backend that answers supports(LOOM_OP_ATTENTION_SINKS). */
	const float *sinks;
};

/* The sinks of an attention call, NULL when there are none or the
 * caller's struct predates generation 1.8. */
#define LOOM_ATTN_SINKS(a) \
	(LOOM_ARGS_HAS(a, struct loom_attention_args, sinks) ? (a)->sinks : NULL)

/* The KV cache type of a kv_write or attention call: kv_type where the
 * caller's struct has it, else F32 (a 1.0-1.2 host). */
#define LOOM_KV_TYPE(a, type) \
	(LOOM_ARGS_HAS(a, type, kv_type) ? (a)->kv_type : (uint32_t)LOOM_TYPE_F32)

enum loom_glu_kind {
	LOOM_GLU_SILU = 0,
	LOOM_GLU_GELU_TANH = 1,
	/* generation 1.8 (supports(LOOM_OP_GLU_OAI)): gpt-oss's clamped
	 * SwiGLU, with g = min(gate, L) and u = min(max(up, -L), L):
	 *   out = g / (1 + exp(-A * g)) * (u + 1),  A = 1.702, L = 7
	 * (the constants llama.cpp and OpenAI's reference hard-code) */
	LOOM_GLU_SWIGLU_OAI = 2,
};
#define LOOM_GLU_OAI_ALPHA 1.702f
#define LOOM_GLU_OAI_LIMIT 7.0f

/* Generation 1.4: collectives between the ranks of a distributed job. */
enum loom_collective_op {
	/* Rank r holds columns col_start[r] .. col_start[r+1]-1 of every row
	 * of x; afterwards every rank holds all columns col_start[0] ..
	 * col_start[n_ranks]-1 (the other columns are left alone). */
	LOOM_COLL_ALLGATHER = 0,
	/* Every rank holds columns col_start[0] .. col_start[n_ranks]-1 of
	 * every row; afterwards each holds their sum over the ranks, added
	 * in rank order (((x0 + x1) + x2) ...), bitwise the same on all. */
	LOOM_COLL_ALLREDUCE_SUM = 1,
};

/*
 * x is a device f32 array [rows][stride floats]. comm is the host's MPI
 * communicator (an MPI_Comm of the MPI library the host runs under; in
 * Open MPI a pointer), whose size is n_ranks and in which this process
 * is rank `rank`. col_start is a HOST int64 array [n_ranks + 1],
 * non-decreasing, col_start[n_ranks] <= stride. Every rank of comm makes
 * the same call (same op, rows and col_start) in the same order.
 */
struct loom_collective_args {
	uint32_t struct_size;
	uint32_t op; /* enum loom_collective_op */
	void *comm;
	int32_t n_ranks, rank;
	float *x;
	int64_t rows, stride;
	const int64_t *col_start;
};

/* Generation 1.6: routed experts (mixture-of-experts FFN). */
enum loom_moe_gating {
	/* p = softmax(logits) over all experts; the n_used largest p (ties:
	 * the lower expert id) are chosen, weighted by their p (llama.cpp's
	 * softmax gating: Mixtral, Qwen2-MoE, Qwen3-MoE) */
	LOOM_MOE_SOFTMAX = 0,
	/* generation 1.8: the n_used largest logits (ties: the lower id)
	 * are chosen, weighted by a softmax over those n_used logits alone
	 * (llama.cpp's SOFTMAX_WEIGHT gating: gpt-oss); norm is ignored */
	LOOM_MOE_SOFTMAX_TOPK = 1,
};

/* One expert tensor: n_expert matrices of the same shape and type. */
struct loom_moe_weights {
	uint32_t type;
	uint32_t packed;      /* every w[e] is a weight_pack() buffer's address */
	size_t row_bytes;     /* row stride of each matrix (ignored when packed) */
	const void *const *w; /* HOST array [n_expert] of device addresses */
};

/*
 * The routed FFN of rows x [rows][n_embd] (row stride x_stride floats):
 * for each row r, the router's logits[r] ([n_expert], stride
 * logits_stride) choose n_used experts e_0 .. e_{n_used-1} with weights
 * w_0 .. (loom/moe.h's loom_moe_route() defines the choice and the
 * weights, with `norm`: weights divided by their sum), and
 *   y[r] = sum over j in order of w_j * down_e(glu(gate_e . x[r], up_e . x[r]))
 * where gate_e, up_e are [n_ff][n_embd] and down_e [n_embd][n_ff], each
 * product computed as gemm computes it for that matrix (so each expert's
 * rows may be multiplied together), and the sum starts from w_0 * d_0.
 * With a shared expert (n_ff_shared > 0, Qwen2-MoE), after that sum
 *   y[r] += sigmoid(x[r] . shared_gate_inp) * down_s(glu(gate_s . x[r], up_s . x[r]))
 * with the shared matrices (w arrays of one address) sized by n_ff_shared
 * and the dot as gemm computes it for a [1][n_embd] f32 weight;
 * sigmoid(s) = 1 / (1 + exp(-s)).
 * y ([rows][n_embd], stride y_stride) must not alias x or logits.
 */
struct loom_moe_args {
	uint32_t struct_size;
	uint32_t glu;    /* enum loom_glu_kind */
	uint32_t gating; /* enum loom_moe_gating */
	uint32_t norm;   /* non-zero: normalise the chosen weights */
	int64_t rows, n_embd, n_ff, n_expert, n_used;
	const float *x;
	int64_t x_stride;
	const float *logits;
	int64_t logits_stride;
	float *y;
	int64_t y_stride;
	struct loom_moe_weights gate, up, down;
	int64_t n_ff_shared; /* 0: no shared expert */
	const float *shared_gate_inp; /* device f32 [n_embd] */
	struct loom_moe_weights shared_gate, shared_up, shared_down;
	/* ---- generation 1.8 ---- */
	/* Expert biases (gpt-oss), device f32, NULL for none: expert e's
	 * gate and up products get gate_bias[e * n_ff ..] and up_bias[..]
	 * added (before the glu), its down product down_bias[e * n_embd ..]
	 * (before the weight w_j multiplies it). Read only when struct_size
	 * covers them (LOOM_MOE_BIASES). */
	const float *gate_bias, *up_bias, *down_bias;
};

/* The smallest loom_moe_args a backend accepts (a 1.6 host's). */
#define LOOM_MOE_ARGS_MIN_SIZE offsetof(struct loom_moe_args, gate_bias)
/* Whether a moe call's struct has the generation 1.8 biases. */
#define LOOM_MOE_BIASES(a) LOOM_ARGS_HAS(a, struct loom_moe_args, down_bias)
/*
 * Generation 1.8: sampling on the device. One logit row's rule, as the
 * host sampler (core/engine/sampler.h) applies it:
 *   1. penalties: for each pair j in [pen_first, pen_first + pen_count),
 *      token t = pen_tokens[j] (distinct tokens of the penalty window) seen
 *      c = pen_counts[j] times: l = x[t]; l = l > 0 ? l / repeat : l *
 *      repeat; l -= presence; l -= frequency * (float)c; x[t] = l (f32,
 *      each operation rounded, no fused multiply-add);
 *   2. greedy = the largest value, NaN below everything, ties to the lowest
 *      index; temp <= 0 or a non-finite maximum: that token, no draw;
 *   3. otherwise 0 < top_k < n, top_k <= LOOM_SAMPLE_MAX_TOP_K (the only
 *      other case the host hands a backend): the top_k tokens in
 *      rank order (larger value first, NaN as -inf, -0 equal to +0, ties to
 *      the lower index), weights w = exp(((double)l - max) * (1.0 /
 *      (double)temp)) in double, their sum z in rank order; top-p keeps the
 *      shortest prefix whose running sum reaches top_p * z (when top_p <
 *      1), min-p then keeps the prefix of weights >= min_p (when min_p >
 *      0; the first token always stays); one draw u = (next >> 11) *
 *      2^-53 from the xoshiro256** state rng (not written back: the host
 *      advances its own copy), target = u * (sum of the kept weights, in
 *      rank order), the first kept token whose running sum exceeds target
 *      (skipping zero weights; the last positive one if rounding runs
 *      past).
 *   4. generation 1.9, only for a backend that answers
 *      supports(LOOM_OP_SAMPLE_FULL): top_k <= 0 or top_k >= n (the whole
 *      vocabulary). Every token's weight w as above, and its mass q =
 *      (uint64_t)(w * 2^LOOM_SAMPLE_MASS_BITS) (exact integers: the sums
 *      below do not depend on their order); F = the tokens with w >=
 *      min_p (all when min_p <= 0); Q = the mass of all n tokens. With
 *      top_p < 1, need = (uint64_t)((double)top_p * (double)Q) (1 if that
 *      is 0) and K = the shortest rank-order prefix of F whose mass
 *      reaches need (all of F if it falls short); else K = F. The draw:
 *      T = the mass of K, target = ((next >> 11) * T) >> 53 (exact, 117
 *      bits), the token of K in id order whose running mass first exceeds
 *      target.
 * out[2 i] = the token of row i, out[2 i + 1] = 1 when a draw was made.
 *
 * Generation 1.9, logprobs (only for a backend that answers
 * supports(LOOM_OP_SAMPLE_LOGPROBS); 0 for any other): m = logprobs > 0
 * asks for row i's log-probabilities of the logits as they came, before
 * the penalties: lse = max + log(s) in double, max the largest value (NaN
 * skipped; lse = max when max is not finite), s the sum over
 * LOOM_SAMPLE_LANES lanes, lane j adding exp((double)x[t] - max) for t = j,
 * j + LANES, ... in that order, then lanes 0, 1, ... in order;
 * lp[i * lp_stride] = { the chosen token, (float)((double)x[token] - lse) }
 * and lp[i * lp_stride + 1 + j], j < m - 1, the (j+1)-th token in rank
 * order (as 3.) with its value likewise ({ -1, NaN } past n). pen_raw
 * (n_pen floats) is the backend's scratch for the penalized tokens' values.
 */
#define LOOM_SAMPLE_MAX_TOP_K 1024
/* Generation 1.9: masses are weights in units of 2^-40 of the top token's
 * (whose weight is 1), so a vocabulary of up to 2^23 tokens sums in 64
 * bits; the lanes of the log-sum-exp; the most top log-probabilities. */
#define LOOM_SAMPLE_MASS_BITS 40
#define LOOM_SAMPLE_MAX_VOCAB (1 << 23)
#define LOOM_SAMPLE_LANES 256
#define LOOM_SAMPLE_MAX_TOP_LOGPROBS 20

struct loom_sample_row {
	float temp, top_p, min_p;
	int32_t top_k;
	float repeat_penalty, presence_penalty, frequency_penalty;
	int32_t pen_first, pen_count;
	/* 0 (generation 1.8: reserved); generation 1.9: 1 + the top
	 * log-probabilities asked for (at most LOOM_SAMPLE_MAX_TOP_LOGPROBS),
	 * only with supports(LOOM_OP_SAMPLE_LOGPROBS) */
	int32_t logprobs;
	uint64_t rng[4];    /* the generator's state before this token's draw */
};

/* Generation 1.9: a token and its log-probability. */
struct loom_sample_logprob {
	int32_t token;
	float logprob;
};

struct loom_sample_args {
	size_t struct_size;
	float *x;                 /* device: rows x n logits, stride apart (penalized in place) */
	int64_t stride, rows, n;
	const struct loom_sample_row *params; /* device: rows entries */
	const int32_t *pen_tokens; /* device: the rows' penalty pairs */
	const int32_t *pen_counts;
	int32_t *out;             /* device: rows x 2 */
	/* ---- generation 1.9 (read when struct_size covers them) ---- */
	struct loom_sample_logprob *lp; /* device: rows x lp_stride, or NULL */
	int64_t lp_stride;        /* >= every row's logprobs */
	float *pen_raw;           /* device: scratch, one float a penalty pair */
};

/* Whether a sample call's struct has the generation 1.9 logprobs. */
#define LOOM_SAMPLE_HAS_LP(a) LOOM_ARGS_HAS(a, struct loom_sample_args, pen_raw)
/* The smallest loom_sample_args a backend accepts (a 1.8 host's). */
#define LOOM_SAMPLE_ARGS_MIN_SIZE offsetof(struct loom_sample_args, lp)

/* Required slots must be non-NULL; the host checks once at load time. */
struct loom_backend_ops {
	/* ---- generation 1.0 ---- */
	uint32_t abi_major;   /* LOOM_BACKEND_ABI_MAJOR the backend was built with */
	uint32_t abi_minor;
	uint32_t struct_size; /* sizeof(struct loom_backend_ops) when built */
	const char *name;     /* short name, e.g. "cpu" */

	/* Required. Creates a context on cfg->device. Returns LOOM_ERR_DEVICE
	 * with a logged reason when no usable device or driver exists. On
	 * success *out is valid until destroy(). On failure nothing leaks. */
	int (*create)(const struct loom_backend_host *host,
		      const struct loom_backend_config *cfg,
		      struct loom_backend_ctx **out);
	/* Required. Frees the context; every buffer must be freed before. */
	void (*destroy)(struct loom_backend_ctx *ctx);
	/* Required. */
	int (*device_info)(struct loom_backend_ctx *ctx, struct loom_device_info *out);
	/* Required. Whether `op` runs natively on data of `type` (the weight
	 * type for GEMM and EMBED; the KV cache type for KV_WRITE and
	 * ATTENTION, generation 1.3; LOOM_TYPE_F32 for the others). */
	bool (*supports)(struct loom_backend_ctx *ctx, enum loom_op op, uint32_t type);

	/* Required. Allocates `size` bytes (64-byte aligned address). The
	 * buffer belongs to the backend; the host returns it with buffer_free. */
	int (*buffer_alloc)(struct loom_backend_ctx *ctx, size_t size,
			    struct loom_buffer **out);
	void (*buffer_free)(struct loom_backend_ctx *ctx, struct loom_buffer *buf);
	void *(*buffer_addr)(struct loom_backend_ctx *ctx, struct loom_buffer *buf);
	/* Required. Host <-> device and device <-> device copies of n bytes. */
	int (*upload)(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n);
	int (*download)(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n);
	int (*copy)(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n);
	/* Required. Waits until all queued work is done. */
	int (*synchronize)(struct loom_backend_ctx *ctx);

	/* Required operators. Device addresses everywhere. */
	int (*gemm)(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a);
	/* out[i] = dequantized row ids[i] of table ([n_rows][dim] in `type`,
	 * row stride `row_bytes`); out row stride is dim floats. ids are
	 * device int32 and must be < n_rows (else LOOM_ERR_INVALID).
	 * Generation 1.5: row_bytes 0 means table is a buffer this backend
	 * returned from weight_pack() for this table (see there). */
	int (*embed)(struct loom_backend_ctx *ctx, float *out, const void *table,
		     uint32_t type, size_t row_bytes, int64_t n_rows, int64_t dim,
		     const int32_t *ids, int64_t n_ids);
	/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for r < rows; rows of
	 * n floats, row strides in floats; w is f32 [n]; y may equal x. */
	int (*rmsnorm)(struct loom_backend_ctx *ctx, float *y, int64_t y_stride,
		       const float *x, int64_t x_stride, const float *w,
		       int64_t rows, int64_t n, float eps);
	int (*rope)(struct loom_backend_ctx *ctx, const struct loom_rope_args *a);
	/* out[r][i] = act(gate[r][i]) * up[r][i]; out may equal gate or up. */
	int (*glu)(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
		   int64_t out_stride, const float *gate, int64_t gate_stride,
		   const float *up, int64_t up_stride, int64_t rows, int64_t n);
	/* out[r][i] = a[r][i] + b[b_rows == 1 ? 0 : r][i]; out may equal a. */
	int (*add)(struct loom_backend_ctx *ctx, float *out, int64_t out_stride,
		   const float *a, int64_t a_stride, const float *b, int64_t b_stride,
		   int64_t b_rows, int64_t rows, int64_t n);
	/* x[r][i] *= s, in place. */
	int (*scale)(struct loom_backend_ctx *ctx, float *x, int64_t stride,
		     int64_t rows, int64_t n, float s);
	int (*kv_write)(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a);
	int (*attention)(struct loom_backend_ctx *ctx, const struct loom_attention_args *a);
	/* ---- end of generation 1.0 ---- */

	/* ---- generation 1.1 ---- */
	/*
	 * Optional, both or neither: step regions, which let a device backend
	 * capture the operator calls of a step once and replay them (CUDA
	 * graphs) when a later step makes the same calls.
	 *
	 * graph_begin opens a region; graph_end closes it. Between them the
	 * backend may defer every operator call and copy(): the call checks
	 * its arguments and returns, and the work is queued by graph_end,
	 * which returns the region's status. Errors the backend can only see
	 * in device memory (embed ids, kv_write slots, attention tables) are
	 * reported by graph_end, before any of the region's work runs. Once
	 * a call in the region has failed, graph_end runs nothing and returns
	 * that failure. The host calls graph_end after every successful
	 * graph_begin.
	 *
	 * Calls that repeat byte for byte (the same addresses, shapes and
	 * scalars) may be replayed from a capture; only the contents of
	 * device memory differ between replays. So inside a region the host:
	 *  - makes only operator calls and copy() (upload, download,
	 *    synchronize, buffer_alloc and buffer_free fail with
	 *    LOOM_ERR_INVALID and fail the region);
	 *  - has already written the device int32 tables the calls read
	 *    (ids, slots, q_start, kv_len, block_table) before graph_begin,
	 *    and no call of the region writes them.
	 * Results are bitwise the same as the calls made outside a region.
	 */
	int (*graph_begin)(struct loom_backend_ctx *ctx);
	int (*graph_end)(struct loom_backend_ctx *ctx);
	/* ---- end of generation 1.1 ---- */

	/* ---- generation 1.2 ---- */
	/*
	 * Optional: a weight layout of the backend's own. At load the host
	 * offers each weight that only gemm reads (never a table embed also
	 * reads), once, before it uploads anything of it. LOOM_ERR_UNSUPPORTED
	 * (the backend keeps the GGUF layout for this type, shape or mode):
	 * the host uploads the GGUF bytes as before. LOOM_OK: *out is a new
	 * buffer of the backend's holding the weight in its layout, *bytes
	 * its size; the host then uploads nothing of the weight, may release
	 * the GGUF bytes, passes buffer_addr(*out) as gemm's w with w_packed
	 * set, and frees *out with buffer_free. Any other status fails the
	 * load. A gemm on a packed weight must give the same results, bit for
	 * bit, as on the GGUF layout in the same context.
	 *
	 * Generation 1.5: a table that embed reads too (a tied output head,
	 * which gemm streams whole every step) is offered as well when the
	 * backend's abi_minor is 5 or more and supports(ctx,
	 * LOOM_OP_EMBED_PACKED, type) says its embed reads its own layout of
	 * that type. If packed, the host also passes buffer_addr(*out) to
	 * embed as the table, with row_bytes 0; embed must give the rows the
	 * GGUF layout gives, bit for bit.
	 */
	int (*weight_pack)(struct loom_backend_ctx *ctx, const struct loom_weight_pack_args *a,
			   struct loom_buffer **out, size_t *bytes);
	/* Optional. x[r][i] = cap * tanh(x[r][i] / cap), in place, cap > 0
	 * (Gemma 2's final-logit soft-capping). Without it the host applies
	 * the cap to the logits it downloads. */
	int (*softcap)(struct loom_backend_ctx *ctx, float *x, int64_t stride,
		       int64_t rows, int64_t n, float cap);
	/* ---- end of generation 1.2 ---- */

	/* Generation 1.3 changed no slot of this table (it added the KV
	 * cache's element type to the cache arguments). */

	/* ---- generation 1.4 ---- */
	/* Optional: a collective over the host's MPI communicator (struct
	 * loom_collective_args). Host-memory backends call MPI on the
	 * buffers; a GPU backend may use NCCL. LOOM_ERR_UNSUPPORTED: the
	 * backend was built without MPI (the host then refuses tensor
	 * parallelism with a message naming the backend). Any other failure
	 * leaves x unspecified and the job must end: the other ranks may
	 * have completed the call. */
	int (*collective)(struct loom_backend_ctx *ctx, const struct loom_collective_args *a);
	/* ---- end of generation 1.4 ---- */

	/* Generation 1.5 changed no slot of this table (embed of a packed
	 * table, LOOM_OP_EMBED_PACKED). */

	/* ---- generation 1.6 ---- */
	/* Optional: the routed-expert FFN (struct loom_moe_args). A backend
	 * runs only the chosen experts' rows. LOOM_ERR_UNSUPPORTED (a type,
	 * gating or shape it does not run): the host runs the same
	 * arithmetic with gemm, glu, scale and add calls, as it does for a
	 * backend without the slot. In a step region the call is deferred
	 * like any operator (routing reads logits in device memory). */
	int (*moe)(struct loom_backend_ctx *ctx, const struct loom_moe_args *a);
	/* ---- end of generation 1.6 ---- */

	/* ---- generation 1.7 ---- */
	/* Optional: greedy choice on the device. ids[i] (device int32) = the
	 * index of the largest of x[i * stride .. i * stride + n) for i <
	 * rows, ties to the lowest index, NaN below everything (index 0 when
	 * no value is a number), as the host's greedy sampler picks. The host
	 * then downloads rows ids instead of rows x n logits. Outside step
	 * regions. NULL: the host downloads the logits and picks there. */
	int (*argmax)(struct loom_backend_ctx *ctx, int32_t *ids, const float *x, int64_t stride,
		      int64_t rows, int64_t n);
	/* ---- end of generation 1.7 ---- */

	/* ---- generation 1.8 ---- */
	/* Besides this slot, 1.8 appended parent (token trees), attention
	 * sinks and expert biases to the argument structs, a glu kind and a
	 * gating rule, each announced by supports() (LOOM_OP_ATTENTION_TREE,
	 * LOOM_OP_ATTENTION_SINKS, LOOM_OP_GLU_OAI). */
	/* Optional: sampling on the device (struct loom_sample_args), the
	 * host sampler's rule exactly for the rows the host hands it (see the
	 * struct): greedy, or 0 < top_k <= LOOM_SAMPLE_MAX_TOP_K with top_k <
	 * n (and from 1.9 the whole vocabulary, when supports() says so). A
	 * row outside that gets token -1 (the host fails the step).
	 * Outside step regions. NULL: the host downloads the logits and
	 * samples there. */
	int (*sample)(struct loom_backend_ctx *ctx, const struct loom_sample_args *a);
	/* ---- end of generation 1.8 ---- */

	/* ---- generation 1.9 ----
	 * No new slot: the sample slot may draw rows without top-k
	 * (LOOM_OP_SAMPLE_FULL) and compute log-probabilities
	 * (LOOM_OP_SAMPLE_LOGPROBS, loom_sample_args.lp), each announced by
	 * supports(). A 1.8 backend gets neither. */
	/* ---- end of generation 1.9; append new slots below ---- */
};

/* The entry point every backend exports (as "loom_backend_entry"). */
typedef const struct loom_backend_ops *(*loom_backend_entry_fn)(void);

#if defined(__GNUC__)
#define LOOM_EXPORT __attribute__((visibility("default")))
#else
#define LOOM_EXPORT
#endif

#ifdef __cplusplus
}
#endif
#endif /* LOOM_BACKEND_H */
