/* What one rank of a distributed job holds of a model (internal).
 *
 * Tensor parallelism (tp ranks in a stage) splits each layer by rows of its
 * matrices only, so a rank reads whole rows (whole quantized blocks) of the
 * GGUF and never re-quantizes:
 *   wq, bq          query heads q_lo .. q_hi-1
 *   wk, wv, bk, bv  KV heads kv_lo .. kv_hi-1 (a rank's query heads read only
 *                   its KV heads; when tp > n_head_kv the KV heads repeat)
 *   w_gate, w_up    FFN columns ff_lo .. ff_hi-1
 *   wo, w_down      output rows embd_lo .. embd_hi-1
 * and norms whole. A fused tensor (Phi-3's [q; k; v], [gate; up]) gives
 * each part the rows above, read at the part's offset. Each column-parallel result (the attention output, the
 * gated FFN activation) and each row-split projection is all-gathered, so
 * every dot product a rank computes is one a single process computes, in
 * the same order: the output is bitwise the single-process output wherever
 * the backend's gemm does not depend on the matrix's row count (ref.so
 * always; cpu.so for decode; docs/DISTRIBUTED.md).
 *
 * Outside exact mode (`reduce`), when every rank's heads and FFN columns
 * start and end on the weights' block boundaries, wo and w_down are split
 * by columns instead (row-parallel: each rank reads the columns of its
 * heads, of its FFN columns) and each projection is summed over the
 * ranks with one all-reduce: two collectives per layer, not four, with
 * sums in another order than one process's (within float rounding).
 *
 * Mixture of experts: see moe_split below.
 *
 * Pipeline parallelism (pp stages) gives stage s layers layer_lo ..
 * layer_hi-1; stage 0 embeds, the last stage's tensor rank 0 computes the
 * logits.
 */
#ifndef LOOM_SHARD_H
#define LOOM_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct loom_hparams;

/* The all-gathered activations' column splits. */
enum loom_split { SPLIT_ATT, SPLIT_EMBD, SPLIT_FF,
		  SPLIT_SUM, /* all-reduce: every rank holds all n_embd columns */
		  SPLIT_COUNT };

struct loom_shard {
	int tp, tp_rank, pp, stage, rank;
	int64_t q_lo, q_hi;       /* query heads */
	int64_t kv_lo, kv_hi;     /* KV heads */
	int64_t ff_lo, ff_hi;     /* FFN columns */
	int64_t embd_lo, embd_hi; /* rows of wo and w_down */
	int32_t layer_lo, layer_hi;
	bool first, last;         /* the stage embeds / holds the last layer */
	bool logits;              /* this rank computes the logits */
	bool reduce;              /* wo, w_down split by columns + all-reduce */
	/* Routed experts (and a shared expert) split between the tensor
	 * ranks: each expert's FFN columns fx_lo .. fx_hi-1 (rows of its gate
	 * and up, columns of its down), the shared expert's fs_lo .. fs_hi-1,
	 * each rank's moe output summed by one all-reduce. Otherwise (exact
	 * mode, or columns off the blocks) every rank holds the experts whole
	 * and computes the single process's moe output. */
	bool moe_split;
	int64_t fx_lo, fx_hi, fs_lo, fs_hi;
	int logits_rank;          /* the world rank that does */
	int prev_rank, next_rank; /* same tensor rank, stage -1 / +1; -1: none */
	/* [tp + 1] column starts of each split, per tensor rank */
	int64_t cols[SPLIT_COUNT][65];
	void *tp_comm;            /* MPI_Comm of the stage */
	struct loom_dist *dist;
};

#define LOOM_SHARD_MAX_TP 64

/* The whole model in one process. */
void loom_shard_single(struct loom_shard *s, const struct loom_hparams *hp);
/* Rank `rank`'s share for tp x pp. -1 with err naming what does not split
 * (tp above the heads, pp above the layers, ...). */
int loom_shard_plan(struct loom_shard *s, const struct loom_hparams *hp, int tp, int pp,
		    int rank, char *err, size_t errlen);

/* Splits the routed experts' FFN columns (and a shared expert's) between
 * s's tensor ranks in whole units (the block size of their down matrices,
 * which are split by columns): sets moe_split and the fx/fs ranges, or
 * returns false, leaving the experts whole, when a count is not a whole
 * number of units or has fewer units than ranks. */
bool loom_shard_split_experts(struct loom_shard *s, const struct loom_hparams *hp,
			      int64_t unit_exp, int64_t unit_shexp);

#endif /* LOOM_SHARD_H */
