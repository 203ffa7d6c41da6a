/*
 * loom public API: load a model onto a backend and generate text.
 *
 * Handles are opaque. Every function that can fail returns 0 (or a valid
 * pointer) on success and -1 (or NULL) on failure with a one-line reason in
 * the caller's err buffer. Parameter structs start with struct_size so
 * fields can be appended without breaking callers: set it to sizeof().
 * An engine is used from one thread at a time.
 */
#ifndef LOOM_H
#define LOOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct loom_engine;

/*
 * Sampling, the same for every entry point (loom run, loom serve, this
 * API). Applied in this order: repetition / presence / frequency penalties
 * over the last penalty_last_n tokens; temp <= 0: greedy argmax (ties to
 * the lowest id), done; top-k; softmax at temp; top-p; min-p; a draw from
 * the seeded generator. The same seed, logits and history give the same
 * token.
 */
struct loom_sampler_params {
	float temp;              /* <= 0: greedy */
	int32_t top_k;           /* <= 0: off */
	float top_p;             /* in (0, 1]; 1: off */
	float min_p;             /* <= 0: off */
	float repeat_penalty;    /* 1: off */
	float presence_penalty;  /* 0: off */
	float frequency_penalty; /* 0: off */
	int32_t penalty_last_n;  /* history window for the penalties; 0: off */
	uint64_t seed;
};

/* The defaults everywhere: temp 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * penalties off (window 64), seed 0. */
void loom_sampler_defaults(struct loom_sampler_params *p);

struct loom_engine_params {
	uint32_t struct_size;
	const char *model;   /* GGUF file */
	const char *backend; /* "cpu.so", "ref.so" or a path; NULL: cpu.so */
	int32_t n_threads;   /* <= 0: the backend chooses */
	int32_t n_ctx;       /* context in tokens; <= 0: min(4096, trained) */
	int32_t n_batch;     /* prompt chunk size; <= 0: 256 */
	bool progress;       /* progress bar on stderr while loading (if a tty) */
	/* ---- appended: speculative decoding (docs/SPECULATIVE.md) ---- */
	const char *spec;    /* strategy plugin, name ("ngram.so") or path;
				NULL, "" or "none": plain decoding */
	int32_t spec_min_draft, spec_max_draft; /* <= 0: 1 and 8 */
	int32_t spec_ngram_min, spec_ngram_max; /* <= 0: 1 and 4 */
	const char *spec_draft_model; /* GGUF sharing the vocabulary, or NULL */
	int32_t spec_layers;  /* early-exit layers; <= 0: half the model's */
};

void loom_engine_params_init(struct loom_engine_params *p);
struct loom_engine *loom_engine_open(const struct loom_engine_params *p,
				     char *err, size_t errlen);
void loom_engine_close(struct loom_engine *e);

int32_t loom_engine_n_vocab(const struct loom_engine *e);
int32_t loom_engine_n_ctx(const struct loom_engine *e);
const char *loom_engine_backend_name(const struct loom_engine *e);

/* Tokenizes text; add_special adds BOS/EOS as the model asks and parses
 * special-token text. Returns the number of ids the text needs (write at
 * most cap to out), or -1. */
int64_t loom_engine_tokenize(const struct loom_engine *e, const char *text,
			     size_t len, bool add_special, int32_t *out, int64_t cap);

struct loom_generation_params {
	uint32_t struct_size;
	int32_t n_predict;       /* tokens to generate at most */
	bool add_special;        /* BOS etc. as the model's metadata says */
	float temp;              /* <= 0: greedy */
	int32_t top_k;           /* <= 0: off */
	float top_p;             /* (0, 1]; 1: off */
	float min_p;             /* 0: off */
	float repeat_penalty;    /* 1: off */
	float presence_penalty;  /* 0: off */
	float frequency_penalty; /* 0: off */
	int32_t repeat_last_n;   /* penalty window */
	uint64_t seed;
	float *prompt_logits;    /* optional: n_vocab floats, logits after the prompt */
};

void loom_generation_params_init(struct loom_generation_params *g);

/* Called for each generated token with its text (complete UTF-8 only; may
 * be empty while a multi-byte character is pending). Return non-zero to
 * stop generating. */
typedef int (*loom_token_fn)(void *user, int32_t token, const char *text, size_t len);

struct loom_generation_stats {
	int64_t n_prompt, n_generated;
	double prompt_seconds, generate_seconds;
	/* ---- appended: speculative decoding (all 0 without it) ---- */
	int64_t spec_steps;    /* target forward passes while generating */
	int64_t spec_drafted;  /* draft tokens verified */
	int64_t spec_accepted; /* of those, accepted */
};

/* Generates a continuation of prompt, from an empty context each call.
 * Stops at n_predict tokens, an end-of-generation token, or when on_token
 * asks. 0, or -1 with err set. */
int loom_generate(struct loom_engine *e, const char *prompt, size_t len,
		  const struct loom_generation_params *g, loom_token_fn on_token,
		  void *user, struct loom_generation_stats *stats, char *err,
		  size_t errlen);

/* Appended: the speculative strategy's name, or "none". */
const char *loom_engine_spec_name(const struct loom_engine *e);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_H */
