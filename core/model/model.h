/* Models: hyperparameters and weights from GGUF, the per-model graph, and
 * the executor that runs it for one step over a flattened batch (internal).
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plugin/backend_loader.h"
#include "format/gguf.h"
#include "engine/kv.h"
#include "model/arch.h"
#include "loom.h" /* loom_gemm_input_fn */
#include "model/shard.h"

struct loom_hparams {
	const struct loom_arch *arch;
	char arch_name[32];
	int64_t n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv;
	int64_t head_dim, n_ff, n_rot;
	float norm_eps, rope_base, rope_scale; /* global layers' RoPE */
	float attn_scale;   /* scores = attn_scale * q.k */
	float attn_softcap; /* > 0: scores = c * tanh(scores / c) */
	float final_softcap; /* > 0: logits = c * tanh(logits / c) */
	int32_t window;     /* local layers' sliding window, 0: none */
	int64_t rope_orig_ctx; /* LongRoPE's original context, 0: none */
	/* mixture of experts (arch->moe; all 0 for a dense model) */
	int64_t n_expert, n_expert_used;
	int64_t n_ff_exp;   /* one routed expert's FFN size */
	int64_t n_ff_shexp; /* the shared expert's, 0: none */
	bool expert_norm;   /* normalise the chosen experts' weights */
	/* YaRN RoPE scaling (<arch>.rope.scaling.type "yarn"; 0: none):
	 * applied as per-dimension divisors (struct loom_model.rope_freqs)
	 * and the magnitude factor's square in attn_scale */
	float yarn_factor, yarn_beta_fast, yarn_beta_slow;
	int64_t yarn_orig_ctx;
};

/* A routed-expert tensor: n_expert matrices, each loaded as a weight of
 * its own (so a backend may pack each), and their device addresses in
 * one host array, as the backend's moe slot takes them. */
struct loom_experts {
	struct loom_weight *w; /* [n_expert] */
	const void **data;     /* [n_expert] */
};

/* A weight on the device: [rows][cols] in `type`, rows row_bytes apart. */
struct loom_weight {
	uint32_t type;
	int64_t rows, cols;
	size_t row_bytes;
	void *data; /* device address, NULL when the tensor is absent */
	bool packed; /* data is the backend's own layout (weight_pack) */
	char name[96]; /* the GGUF tensor's name (gemm_input) */
	bool part_tail; /* a fused matrix's second or later part */
};

/* One layer's weights ([rows][cols]; "opt." ones have data NULL when the
 * family or the file has none) and its attention kind. */
struct loom_layer {
	struct loom_weight attn_norm;      /* [n_embd] */
	struct loom_weight wq;             /* [n_head * head_dim][n_embd] */
	struct loom_weight wk, wv;         /* [n_head_kv * head_dim][n_embd] */
	struct loom_weight bq;             /* [n_head * head_dim], opt. */
	struct loom_weight bk, bv;         /* [n_head_kv * head_dim], opt. */
	struct loom_weight bo;             /* [n_embd], opt. (gpt-oss) */
	struct loom_weight sinks;          /* [n_head] attention sinks, opt. (gpt-oss) */
	struct loom_weight q_norm, k_norm; /* [head_dim], per-head QK-norm, opt. */
	struct loom_weight wo;             /* [n_embd][n_head * head_dim] */
	struct loom_weight post_attn_norm; /* [n_embd], opt. */
	struct loom_weight ffn_norm;       /* [n_embd] */
	struct loom_weight w_gate, w_up;   /* [n_ff][n_embd] */
	struct loom_weight w_down;         /* [n_embd][n_ff] */
	struct loom_weight post_ffn_norm;  /* [n_embd], opt. */
	/* mixture of experts: the router and the experts (each [n_ff_exp]
	 * [n_embd], down [n_embd][n_ff_exp]); Qwen2-MoE's shared expert is
	 * w_gate, w_up, w_down above (n_ff_shexp wide) with its gate */
	struct loom_weight ffn_gate_inp;   /* [n_expert][n_embd] */
	struct loom_experts gate_exps, up_exps, down_exps;
	struct loom_weight gate_inp_shexp; /* [n_embd], opt. */
	struct loom_weight router_b;       /* [n_expert], opt. (gpt-oss) */
	/* expert biases, f32 tables, opt. (gpt-oss): gate/up [n_expert]
	 * [n_ff_exp], down [n_expert][n_embd] */
	struct loom_weight gate_exps_b, up_exps_b, down_exps_b;
	const void *shexp_data[3];         /* w_gate, w_up, w_down's addresses */
	float rope_base, rope_scale;       /* this layer's RoPE */
	int32_t window;                    /* sliding window in tokens, 0: none */
};

/* Activation tensors of the graph: each is [rows][width] f32. */
enum loom_act {
	ACT_X,      /* residual stream          [tokens][n_embd] */
	ACT_XN,     /* normalized input         [tokens][n_embd] */
	ACT_Q,      /* queries                  [tokens][n_head * head_dim] */
	ACT_K,      /* new keys                 [tokens][kv_dim] */
	ACT_V,      /* new values               [tokens][kv_dim] */
	ACT_ATT,    /* attention output         [tokens][n_head * head_dim] */
	ACT_PROJ,   /* projection output        [tokens][n_embd] */
	ACT_GATE,   /* ffn gate, then glu       [tokens][n_ff] */
	ACT_UP,     /* ffn up                   [tokens][n_ff] */
	ACT_ROUTER, /* router logits            [tokens][n_expert] */
	ACT_MOE_X,  /* host fallback: rows of one expert  [tokens][n_embd] */
	ACT_MOE_D,  /* host fallback: their outputs       [tokens][n_embd] */
	ACT_OUT,    /* rows that need logits    [outputs][n_embd] */
	ACT_LOGITS, /* logits                   [outputs][n_vocab] */
	ACT_COUNT
};

enum loom_node_op {
	NODE_EMBED, NODE_RMSNORM, NODE_GEMM, NODE_ADD, NODE_ROPE, NODE_KV_WRITE,
	NODE_ATTENTION, NODE_GLU, NODE_GATHER,
	NODE_HEADNORM, /* rmsnorm of each head_dim slice of a row */
	NODE_SCALE,    /* dst *= value, in place */
	NODE_SOFTCAP,  /* dst = value * tanh(dst / value), in place; logits only
			* (without the backend slot the host caps the download) */
	NODE_ALLGATHER, /* dst's columns, split `split` between tensor ranks */
	NODE_ALLREDUCE, /* dst summed over the tensor ranks */
	NODE_RECV,      /* dst (the residual stream) from the previous stage */
	NODE_SEND,      /* a (the residual stream) to the next stage */
	NODE_MOE,       /* dst = routed experts of a (router logits b), layer's */
};

/* One step of the graph. Row counts are bound at run time: nodes before
 * NODE_GATHER run over all tokens of the step, nodes after it over the
 * rows whose logits were asked for. */
struct loom_node {
	enum loom_node_op op;
	enum loom_act dst, a, b;
	const struct loom_weight *w;
	int32_t layer;
	bool on_outputs;
	float value; /* NODE_SCALE, NODE_SOFTCAP */
	/* a tensor rank's share: gemm writes dst's columns from col on; glu
	 * and attention work on columns col .. col + cols - 1 (0: all) */
	int64_t col, cols;
	int64_t a_col;         /* gemm: the input's columns from a_col on */
	enum loom_split split; /* NODE_ALLGATHER, NODE_ALLREDUCE */
};

struct loom_model {
	struct loom_hparams hp;
	struct loom_backend *be;
	struct loom_buffer *weights_buf;
	/* weights the backend packed into its own layout, one buffer each */
	struct loom_buffer **packs;
	int n_packs;
	size_t weights_bytes, packed_bytes; /* in weights_buf, in packs */
	/* the upload plan before packing: bytes by the type stored on the
	 * backend (a tensor converted at load counts as f32), in all (with
	 * alignment), and the tensors converted to f32 for want of a kernel */
	uint64_t plan_bytes[LOOM_TYPE_COUNT];
	uint64_t plan_total;
	int n_converted;
	uint64_t expert_bytes; /* of plan_total: the routed experts' tensors */
	uint64_t embd_only_bytes; /* of it: a token table only embed reads (untied) */
	struct loom_weight tok_embd, output, output_norm, rope_freqs;
	struct loom_buffer *yarn_buf; /* rope_freqs computed for YaRN, or NULL */
	struct loom_layer *layers; /* n_layer; only shard's layers hold weights */
	struct loom_shard shard;   /* what this process holds (all of it alone) */
	struct loom_node *nodes; /* the graph, built once at load */
	int n_nodes;
	/* loom_engine_params.gemm_input: sees each weight GEMM's input */
	loom_gemm_input_fn gemm_input;
	void *gemm_input_user;
};

struct loom_model_params {
	const char *backend; /* name or path */
	int n_threads;
	bool progress;       /* progress bar on stderr */
	uint32_t backend_flags; /* LOOM_BACKEND_* (e.g. batch invariance) */
	/* the context a sequence may reach, as asked (loom_model_context()
	 * turns it into the one used); picks LongRoPE's factors */
	int32_t n_ctx;
	/* the distributed job this process is a rank of (its share of the
	 * model: loom_shard_plan); NULL: the whole model */
	struct loom_dist *dist;
	/* called once the weights are planned (plan_bytes), before anything
	 * is allocated or uploaded for them: the engine plans the KV cache
	 * and refuses a model that does not fit. Non-zero stops the load
	 * (err set). NULL: no check. */
	int (*before_alloc)(void *arg, struct loom_model *m, char *err, size_t errlen);
	void *before_alloc_arg;
};

/* Context per sequence for an asked n_ctx: n_ctx, or 4096 when <= 0;
 * never above the trained context. */
int32_t loom_model_context(const struct loom_hparams *hp, int32_t n_ctx);

/* Loads hyperparameters and weights from an open GGUF file onto the backend
 * and builds the graph. NULL with the reason in err. */
struct loom_model *loom_model_load(const struct gguf_file *f,
				   const struct loom_model_params *p,
				   char *err, size_t errlen);
void loom_model_free(struct loom_model *m);

/* ---- executor ---- */

/* Per-step input: a flattened batch of tokens from several sequences.
 * Sequence s contributes tokens [q_start[s], q_start[s+1]) at positions
 * seqs[s]->n_tokens onwards (its cache must have room: loom_kv_reserve);
 * out_rows lists the token rows that need logits. After a successful step
 * each sequence's n_tokens has grown by its token count. */
struct loom_batch {
	int32_t n_tokens;
	const int32_t *tokens;
	int32_t n_seqs;
	const int32_t *q_start;  /* n_seqs + 1 */
	struct loom_kv_seq **seqs; /* n_seqs; cache space must be reserved */
	int32_t n_out;
	const int32_t *out_rows;
	/* appended: the last n_hidden_only of out_rows need only the final
	 * normed hidden state (loom_exec_hidden), not logits: the output
	 * layer runs on the first n_out - n_hidden_only rows alone */
	int32_t n_hidden_only;
	/* appended: every logit row is for a plain greedy choice (see
	 * loom_exec_device_greedy): the backend may pick the tokens itself
	 * and download only them (loom_exec_greedy_ids) */
	bool greedy;
	/* token trees (loom_exec_trees): NULL, or per token the index of its
	 * parent among its sequence's tokens of this step (-1: the cached
	 * prefix). Its position is then the sequence's length plus its depth
	 * and it attends to the prefix and its ancestors only; its K/V still
	 * go to the next free slot in token order. */
	const int32_t *parent;
	/* appended: every logit row is sampled on the device (see
	 * loom_exec_device_sample): sample_rows[i] is logit row i's rule
	 * (backend ABI 1.8), its penalty pairs among the n_pen of pen_tokens
	 * and pen_counts; NULL: the host samples (or greedy above) */
	const struct loom_sample_row *sample_rows;
	const int32_t *pen_tokens, *pen_counts;
	int32_t n_pen;
	/* appended (ABI 1.9, loom_exec_sample_logprobs): the largest
	 * sample_rows[i].logprobs of the step, 0 when no row asks for them */
	int32_t lp_stride;
};

struct loom_exec;
struct loom_exec *loom_exec_new(struct loom_model *m, struct loom_kv *kv,
				int32_t max_tokens, int32_t max_seqs,
				int32_t max_outputs, char *err, size_t errlen);
void loom_exec_free(struct loom_exec *e);
/* The bytes of backend memory loom_exec_new would allocate for these
 * limits over a cache of n_blocks blocks (local: with a windowed pool).
 * False on overflow or bad limits. */
bool loom_exec_bytes(struct loom_model *m, int32_t max_tokens, int32_t max_seqs,
		     int32_t max_outputs, int64_t n_blocks, bool local, size_t *bytes);
/* Runs one step; logits (host, n_out x n_vocab) are written to `logits`.
 * 0, or a negative loom_status with err set. */
int loom_exec_step(struct loom_exec *e, const struct loom_batch *b, float *logits,
		   char *err, size_t errlen);
/* After a successful step: the final normed hidden state (what the
 * output layer reads) of output rows [first, first + n), n x n_embd
 * floats to `out`. 0, or a negative loom_status. Logits, written by the
 * step, cover the first n_out - n_hidden_only output rows. */
int loom_exec_hidden(struct loom_exec *e, int32_t first, int32_t n, float *out);
/* Whether a step with b.greedy set picks its tokens on the device (the
 * backend's argmax slot, ABI 1.7; not on distributed jobs, nor where the
 * host would soft-cap the logits; LOOM_DEVICE_GREEDY=0 turns it off). */
bool loom_exec_device_greedy(const struct loom_exec *e);
/* Whether steps may carry token trees (loom_batch.parent): the backend's
 * attention honours them (ABI 1.8) over this cache, on one rank. */
bool loom_exec_trees(const struct loom_exec *e);
/* After a successful step with b.greedy set and loom_exec_device_greedy:
 * the greedy token of each logit row (the logits themselves were not
 * downloaded). NULL for any other step. */
const int32_t *loom_exec_greedy_ids(const struct loom_exec *e);
/* Whether a step with b.sample_rows set samples on the device (the
 * backend's sample slot, ABI 1.8; the same conditions as greedy, and
 * LOOM_DEVICE_SAMPLE=0 turns it off). */
bool loom_exec_device_sample(const struct loom_exec *e);
/* After a successful step sampled on the device: for each logit row i,
 * [2 i] its token and [2 i + 1] 1 when the device drew it (the host then
 * advances that request's generator: loom_sampler_device_drew). NULL for
 * any other step. */
const int32_t *loom_exec_sampled(const struct loom_exec *e);
/* Whether the sample slot draws rows without top-k (ABI 1.9,
 * LOOM_OP_SAMPLE_FULL), and computes logprobs (LOOM_OP_SAMPLE_LOGPROBS). */
bool loom_exec_sample_full(const struct loom_exec *e);
bool loom_exec_sample_logprobs(const struct loom_exec *e);
/* After a step sampled on the device with b.lp_stride > 0: logit row i's
 * log-probabilities (the chosen token's, then its logprobs - 1 top ones,
 * loom_sample_args.lp); NULL for any other step. */
const struct loom_sample_logprob *loom_exec_sampled_logprobs(const struct loom_exec *e,
								 int32_t i);
/* The step on this rank only (loom_exec_step on rank 0 of a distributed
 * job first sends the step's plan to the others, which run it with this),
 * as n_micro micro-batches of whole sequences, micro-batch k holding
 * sequences cuts[k] .. cuts[k+1]-1, run one after another (on pipeline
 * stages they overlap: stage s runs micro-batch k while stage s+1 runs
 * k-1). n_micro 1 (cuts 0, n_seqs): the step whole. Only the rank that
 * computes logits (and rank 0) fills `logits`. */
int loom_exec_run_micro(struct loom_exec *e, const struct loom_batch *b, const int32_t *cuts,
			int32_t n_micro, float *logits, char *err, size_t errlen);
/* Rank 0's cuts of a step of n_seqs sequences (rows q_start[0..n_seqs])
 * on pp stages: micro micro-batches when > 0, else as many as the step's
 * size pays for (docs/DISTRIBUTED.md, "Pipeline overlap"); never more than
 * n_seqs, 1 when pp or n_seqs is 1. Runs of whole sequences with about
 * equal token counts: cuts[0..n] (n + 1 entries, n_seqs + 1 at most),
 * cuts[0] = 0 < cuts[1] < ... < cuts[n] = n_seqs. Returns n. */
int32_t loom_micro_cuts(int pp, int micro, const int32_t *q_start, int32_t n_seqs,
			int32_t *cuts);
/* The executor's cache, for a follower rank. */
struct loom_kv *loom_exec_kv(struct loom_exec *e);
/* One sequence's tokens[0..n) at its next positions (reserved in its
 * cache), as one step; with want_logits, the last token's logits go to
 * `logits` (n_vocab floats). 0, or a negative loom_status with err set. */
int loom_exec_one(struct loom_exec *e, struct loom_kv_seq *seq, const int32_t *tokens,
		  int32_t n, bool want_logits, float *logits, char *err, size_t errlen);

#endif /* LOOM_MODEL_H */
