/* Continuous-batching scheduler over the paged KV cache (internal).
 *
 * One scheduler owns a model's KV cache and executor. Requests are
 * submitted from any thread; a single engine thread calls loom_sched_step()
 * in a loop (or loom_sched_run()). Each step:
 *   1. running sequences that are decoding each contribute one token;
 *      a sequence that needs a new block and finds none preempts the newest
 *      running sequence (its blocks are freed; it goes back to the front of
 *      the waiting queue and its prompt + generated tokens are recomputed
 *      later, so its output is unchanged);
 *   2. waiting requests are admitted in arrival order while free blocks and
 *      the per-step token budget allow; long prompts are split into chunks
 *      that share steps with decodes;
 *      (in step 1, a decoding sequence with a speculation strategy gives its
 *      last token and the strategy's drafts as one chunk (fewer drafts
 *      when the budget, the logits rows or the blocks are short));
 *   3. one executor step runs the flattened batch; each sequence that
 *      finished its prompt or decoded a token samples its next token with
 *      its own seeded sampler and reports it through its callback.
 * Full KV blocks are keyed by a chained xxHash of their tokens (prefix
 * cache); a new request reuses cached blocks for its longest cached
 * prefix, and unreferenced cached blocks are evicted LRU.
 *
 * Thread safety: submit, cancel and stats may be called from any thread;
 * callbacks run on the engine thread and must not block for long.
 */
#ifndef LOOM_SCHEDULER_H
#define LOOM_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"

struct loom_spec_kind; /* core/engine/spec.h */

struct loom_sched_config {
	int32_t block_size;     /* tokens per KV block (default 16) */
	int64_t n_blocks;       /* total KV blocks (see loom_sched_plan_blocks) */
	int32_t max_batch_tokens; /* token budget per step (default 512) */
	int32_t max_seqs;       /* running sequences at most (default 64) */
	int32_t max_waiting;    /* waiting queue bound; beyond it submit fails */
	int32_t max_ctx;        /* prompt + generated tokens per sequence */
	bool prefix_cache;      /* default true */
	/* EOG tokens end a request (LOOM_FINISH_EOG); NULL: only n_predict
	 * ends one. Borrowed: must outlive the scheduler. */
	const struct loom_tokenizer *tokenizer;
	/* Logits rows per step for drafts beyond one per sequence: a
	 * speculating sequence verifies k drafts with k + 1 rows, and drafts
	 * are cut when the step's rows run out. 0: no drafts at all. */
	int32_t spec_rows;
	/* batch-aware drafting:
	 * Rows (tokens) a step's decodes may take together before drafts stop
	 * paying: a step with n decoding sequences shares at most
	 * spec_step_rows - n drafts among its speculating ones (none when
	 * n >= spec_step_rows), so a full batch decodes plainly and a lone
	 * request drafts freely. Only k changes, never the output. 0: no cap
	 * (drafts limited by the budget and spec_rows only; the default). */
	int32_t spec_step_rows;
	/* logits for every prompt token:
	 * Logits rows per step at least, so a request with all_logits gets
	 * rows for a whole prompt chunk (its chunks are cut to the rows
	 * left). 0: max_seqs + spec_rows, enough for sampling and drafts. */
	int32_t logits_rows;
	/* sliding-window layers:
	 * Blocks of the windowed layers' own pool (see engine/kv.h), used when
	 * the model has both windowed and full-context layers. 0: enough for
	 * max_seqs sequences at max_ctx (never more than n_blocks). */
	int64_t n_local_blocks;
	/* the KV cache's type:
	 * enum loom_type of every cached K and V value: F32 (0, the
	 * default), F16, Q8_0 or Q4_0 (engine/kv.h); block counts and the
	 * plan are in bytes of this type. */
	uint32_t kv_type;
};

/* The KV memory plan for a model and a configuration (block_size,
 * max_ctx, max_seqs, max_batch_tokens). */
struct loom_kv_plan {
	int64_t n_blocks;         /* full-context layers' pool */
	int64_t n_local_blocks;   /* windowed layers' pool (0: none) */
	int64_t seq_blocks;       /* one sequence at max_ctx: full-context */
	int64_t seq_local_blocks; /* and windowed (window + a step's tokens) */
	int64_t n_local_layers;   /* layers in the windowed pool */
	int32_t window;           /* their window (the largest) */
	uint64_t bytes;           /* both pools */
	uint64_t token_bytes;     /* K and V of one token in every layer */
};
/* Defaults: block_size 16, n_blocks 0 (= loom_sched_plan_blocks for
 * 256 MiB, at least one max_ctx sequence), max_batch_tokens 512, max_seqs
 * 64, max_waiting 256, max_ctx 0 (= the model's training context),
 * prefix_cache true, tokenizer NULL, spec_rows 64. */

void loom_sched_config_defaults(struct loom_sched_config *c);

/* Number of f32 blocks that fit in kv_bytes for model m; 0 if not even one. */
int64_t loom_sched_plan_blocks(const struct loom_model *m, int32_t block_size,
			       uint64_t kv_bytes);
/* Splits kv_bytes between the two pools in the ratio one sequence at
 * max_ctx needs (kv_bytes 0: max_seqs such sequences and a spare block
 * each pool). p->n_blocks 0 when not one block fits. */
void loom_sched_plan_kv(const struct loom_model *m, const struct loom_sched_config *c,
			uint64_t kv_bytes, struct loom_kv_plan *p);

/* enum loom_finish and struct loom_event are public (loom.h). */

typedef void (*loom_sched_cb)(void *user, const struct loom_event *ev);

/* n_generated counts the tokens reported so far (an EOG token is not
 * reported and not counted). */

struct loom_sched_request {
	const int32_t *prompt; /* copied by submit */
	int32_t n_prompt;
	int32_t n_predict;     /* <= 0: up to max_ctx - n_prompt */
	struct loom_sampler_params sampling;
	loom_sched_cb cb;
	void *user;
	/* Speculative decoding with this strategy (core/engine/spec.h), NULL: none.
	 * Borrowed: must outlive the request. Greedy output is token for token
	 * the plain output (bitwise logits with a batch-invariant backend);
	 * sampled output has the plain distribution, from its own random
	 * streams (seeded by sampling.seed). */
	struct loom_spec_kind *spec;
	int32_t spec_max_draft; /* <= 0: the strategy's default */
	bool ignore_eog;      /* EOG tokens are generated like any other */
	float *first_logits;  /* optional: n_vocab floats, gets the logits the
				 first token is drawn from (before penalties
				 and before a grammar's mask) */
	/* optional: n_prompt x n_vocab floats; row i gets the logits after
	 * prompt token i (what predicts token i + 1). Such a request shares
	 * no prefix-cache blocks (every position must run). */
	float *all_logits;
	/* optional: constrains the output (engine/grammar.h); the request
	 * holds its own reference */
	const struct loom_grammar *grammar;
	/* log-probabilities and hidden states:
	 * (loom.h's struct loom_request says what each holds). Requests with
	 * any of them must not speculate (spec NULL); prompt_logprobs and
	 * hidden take a row per prompt token, like all_logits. */
	bool logprobs;
	int32_t top_logprobs; /* 0..LOOM_MAX_TOP_LOGPROBS */
	struct loom_token_logprob *prompt_logprobs;
	float *hidden;        /* the request ends after its prompt */
};

struct loom_sched;

struct loom_sched *loom_sched_new(struct loom_model *m, const struct loom_sched_config *c,
				  char *err, size_t errlen);
/* Cancels everything still queued or running (callbacks get CANCELLED). */
void loom_sched_free(struct loom_sched *s);

/* Queues a request. Returns 0 and its id in *id; LOOM_ERR_INVALID with
 * err set for a bad request (empty prompt, bad sampling params, token id
 * out of range, more KV blocks than the cache holds); LOOM_ERR_CONTEXT
 * when prompt + n_predict exceed max_ctx; LOOM_ERR_NOMEM; LOOM_ERR_FULL
 * when the waiting queue is full (HTTP 503). */
int loom_sched_submit(struct loom_sched *s, const struct loom_sched_request *r,
		      uint64_t *id, char *err, size_t errlen);
/* Asks to abort a request; its blocks are freed within the next step and
 * its callback gets a CANCELLED event (unless it finished already). */
void loom_sched_cancel(struct loom_sched *s, uint64_t id);

/* Runs one step. Returns the number of sequences that ran (0 when idle),
 * or -1 on a backend failure (affected requests get ERROR events). */
int loom_sched_step(struct loom_sched *s);
/* Blocks until there is work, then steps, until loom_sched_stop(). */
void loom_sched_run(struct loom_sched *s);
/* Makes loom_sched_run return (sticky: a later run returns at once). */
void loom_sched_stop(struct loom_sched *s);
/* Wakes a loom_sched_run loop that waits for work (after submit/cancel). */

struct loom_sched_stats {
	int32_t running, waiting;
	int64_t blocks_total, blocks_used, blocks_cached; /* cached: free but reusable */
	uint64_t prefix_hits, prefix_lookups; /* blocks reused / blocks looked up */
	uint64_t preemptions, rejected;
	uint64_t prompt_tokens, generated_tokens; /* cumulative */
	uint64_t steps;
	uint64_t cow_copies; /* KV blocks copied on write */
	/* speculation, all strategies together */
	uint64_t spec_steps;    /* verification steps of speculating sequences */
	uint64_t spec_drafted;  /* drafts verified */
	uint64_t spec_accepted; /* of those, accepted */
	uint64_t spec_tokens;   /* tokens those steps produced */
	/* blocks held, and the windowed layers' pool
	 * (blocks_* above: the full-context layers' pool) */
	int64_t blocks_peak;       /* most blocks held at once */
	int32_t local_window;      /* 0: no windowed pool */
	int64_t local_blocks_total, local_blocks_used, local_blocks_cached;
	int64_t local_blocks_peak;
};

void loom_sched_get_stats(struct loom_sched *s, struct loom_sched_stats *st);

/* A rank other than 0 of a distributed job: executes rank 0's step plans
 * on this scheduler's cache and executor until rank 0 closes (0), or a
 * failure (-1 with err set). */
int loom_sched_follow(struct loom_sched *s, char *err, size_t errlen);

#endif /* LOOM_SCHEDULER_H */
