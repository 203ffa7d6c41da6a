/* Token sampler (internal to the core).
 *
 * Order of application, as llama.cpp and vLLM users expect:
 *   1. repetition / presence / frequency penalties over the last
 *      `penalty_last_n` tokens of the history (repeat: logit / r if
 *      positive, * r if negative; presence: - p once per seen token;
 *      frequency: - f * count),
 *   2. temp <= 0: greedy argmax (ties -> lowest id), done,
 *   3. top-k (k <= 0: off), 4. softmax at temperature,
 *   5. top-p (1.0: off), 6. min-p (0: off, relative to the top prob),
 *   7. renormalize and draw with the seeded generator.
 * Deterministic: the same seed, logits and history give the same token.
 */
#ifndef LOOM_SAMPLER_H
#define LOOM_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "loom/backend.h"

/* struct loom_sampler_params and loom_sampler_defaults are public (loom.h). */

struct loom_sampler;
/* NULL on allocation failure or invalid params (err gets the reason). */
struct loom_sampler *loom_sampler_new(const struct loom_sampler_params *p,
				      int32_t n_vocab, char *err, size_t errlen);
void loom_sampler_free(struct loom_sampler *s);

/* Whether sample is a plain argmax: temp <= 0 and no penalty (so the
 * greedy choice may be made where the logits are, on the device). */
bool loom_sampler_greedy_only(const struct loom_sampler *s);

/* Samples from logits[0..n_vocab) (modified in place by penalties) given
 * the history of tokens so far (prompt and generated). Returns a token id. */
int32_t loom_sampler_sample(struct loom_sampler *s, float *logits,
			    const int32_t *history, int64_t n_history);

/* Appended for speculative decoding: the distribution loom_sampler_sample
 * draws from, as a dense vector. Applies the penalties to logits (in place,
 * as sample does) and writes probs[0..n_vocab): one-hot at the greedy
 * choice when temp <= 0 (or the top logit is not finite), else the
 * renormalized weights of the tokens that survive top-k/top-p/min-p and 0
 * elsewhere. Does not touch the random state. 0, or -1 on bad arguments. */
int loom_sampler_probs(struct loom_sampler *s, float *logits,
		       const int32_t *history, int64_t n_history, float *probs);

/* ---- sampling on the device (backend ABI 1.8, struct loom_sample_row) ----
 * Whether the backend's sample slot draws what loom_sampler_sample would:
 * a greedy choice (with or without penalties), a draw with 0 < top_k <
 * n_vocab and top_k <= LOOM_SAMPLE_MAX_TOP_K (the candidates are then the
 * top_k in rank order, and every sum runs in that order), or, when full
 * (the backend answers LOOM_OP_SAMPLE_FULL, ABI 1.9), a draw over the
 * whole vocabulary (min-p, top-p or temperature without top-k: integer
 * masses, whose sums do not depend on their order). */
bool loom_sampler_device_ok(const struct loom_sampler *s, bool full);
/* Fills row with s's parameters and generator state, and tok/cnt (room
 * for cap pairs) with the distinct in-range tokens of the penalty window
 * of history and how often each occurs there, in first-seen order (none
 * when penalties are off); row->pen_first = first. Returns the pair count,
 * or -1 when cap is too small. */
int32_t loom_sampler_device_row(const struct loom_sampler *s, const int32_t *history,
				int64_t n_history, struct loom_sample_row *row, int32_t first,
				int32_t *tok, int32_t *cnt, int32_t cap);
/* The device made this token's draw: advances the generator as
 * loom_sampler_sample's draw does, so the stream stays the host's. */
void loom_sampler_device_drew(struct loom_sampler *s);

/* ---- log-probabilities (backend ABI 1.9, loom_sample_args.lp) ----
 * The definitions the device reproduces bit for bit. log(sum(exp(row)))
 * in double: the largest value (NaN skipped; returned as is when not
 * finite) plus the log of the sum of exp(row[i] - max) over
 * LOOM_SAMPLE_LANES lanes (lane j: i = j, j + LANES, ... in order; then
 * the lanes in order). */
double loom_logprob_lse(const float *row, int32_t n);
/* The k best of row in rank order (larger first, NaN as -inf, -0 as +0,
 * ties to the lower id) with their logprobs (float)((double)row[t] -
 * lse); { -1, NaN } past n. */
void loom_logprob_top(const float *row, int32_t n, double lse, int32_t k,
		      struct loom_token_logprob *out);

#endif /* LOOM_SAMPLER_H */
