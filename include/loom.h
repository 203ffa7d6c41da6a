/*
 * loom public API: load a model onto a backend and generate text.
 *
 * Handles are opaque. Every function that can fail returns 0 (or a valid
 * pointer) on success and a negative enum loom_status (or NULL) on failure
 * with a one-line reason in the caller's err buffer.
 *
 * Parameter structs start with struct_size: fill them with their _init()
 * function, which sets it to sizeof(). Fields are only ever appended, so a
 * program built against an older loom.h passes a smaller struct_size and
 * the fields it does not know keep their defaults; a struct_size smaller
 * than the first generation of the struct is refused.
 *
 * One engine path: every generation (loom_generate, loom run, loom bench,
 * loom serve) is a request to the engine's continuous-batching scheduler.
 * loom_generate steps it on the caller's thread; a server submits requests
 * from many threads and runs loom_engine_run on one engine thread.
 */
#ifndef LOOM_H
#define LOOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom/status.h"

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

/* Appended (0.6), loom_engine_params.gemm_input: called during a step with
 * the input of a weight GEMM, before the GEMM runs: `weight` is the GGUF
 * tensor's name ("blk.3.attn_q.weight"; a fused matrix's name once, not
 * per part), x its rows x cols input row-major in host memory (valid for
 * the call only), rows the tokens of the step that reach it (after the
 * logits gather, only the rows that need logits). Used for calibration
 * (`loom imatrix`). */
typedef void (*loom_gemm_input_fn)(void *user, const char *weight, const float *x,
				   int64_t rows, int64_t cols);

struct loom_engine_params {
	uint32_t struct_size;
	const char *model;   /* GGUF file */
	const char *backend; /* "cpu.so", "ref.so" or a path; NULL: cpu.so */
	int32_t n_threads;   /* <= 0: the backend chooses */
	int32_t n_ctx;       /* context in tokens; <= 0: min(4096, trained) */
	int32_t n_batch;     /* tokens per step (prompt chunk size); <= 0: 256 */
	bool progress;       /* progress bar on stderr while loading (if a tty) */
	/* ---- appended: speculative decoding (docs/SPECULATIVE.md) ---- */
	const char *spec;    /* strategy plugin, name ("ngram.so") or path;
				NULL, "" or "none": plain decoding */
	int32_t spec_min_draft, spec_max_draft; /* <= 0: 1 and 8 */
	int32_t spec_ngram_min, spec_ngram_max; /* <= 0: 1 and 4 */
	const char *spec_draft_model; /* GGUF sharing the vocabulary, or NULL */
	int32_t spec_layers;  /* early-exit layers; <= 0: half the model's */
	/* ---- appended (0.2): serving several requests ---- */
	/* spec may list several strategies, comma-separated; requests pick
	 * one by name. spec_default: the one a request that names none gets
	 * (NULL: the first listed; "none": plain decoding). */
	const char *spec_default;
	int32_t n_parallel;    /* sequences decoded together; <= 0: 1 */
	int64_t kv_bytes;      /* KV cache; <= 0: n_ctx tokens per sequence */
	int32_t block_size;    /* tokens per KV block; <= 0: 16 */
	int32_t max_waiting;   /* queued requests at most; <= 0: 256 */
	int32_t prefix_cache;  /* 1 on, -1 off, 0: on when batch_invariant */
	bool batch_invariant;  /* a request's tokens do not depend on what
				  shares its steps (what a server wants) */
	int32_t spec_step_rows; /* decode rows per step beyond which drafts
				   stop (docs/SPECULATIVE.md); 0: no cap */
	/* ---- appended (0.3): exact mode ---- */
	bool exact;            /* f32 activations, ref.so's arithmetic
				  (LOOM_BACKEND_EXACT); false: the backend's
				  fast mode, deterministic but not bitwise ref.so's */
	bool all_logits;       /* room for a logits row per prompt token of a
				  step (n_batch x n_vocab floats), so requests
				  may ask for all_logits */
	/* ---- appended (0.5): the KV cache's type ----
	 * n_ctx <= 0 now means the model's trained context, capped to what
	 * the KV cache holds for one sequence: kv_bytes when > 0, else the
	 * default reservation (loom_kv_default_bytes) shared by n_parallel
	 * sequences, whose cache is then n_ctx tokens each as before. */
	int32_t kv_type;       /* enum loom_kv_type; loom_engine_params_init
				  sets LOOM_KV_DEFAULT */
	/* ---- appended (0.6): calibration ---- */
	/* optional: observes every weight GEMM's input (loom_gemm_input_fn).
	 * Each step then runs op by op (no captured step graphs), with a
	 * download and a synchronize per GEMM: for calibration, not serving. */
	loom_gemm_input_fn gemm_input;
	void *gemm_input_user;
	/* ---- appended (0.6): distributed jobs (docs/DISTRIBUTED.md) ---- */
	int32_t tp, pp;        /* tensor ranks per stage, pipeline stages;
				  <= 1: none. Under mpirun with tp * pp ranks:
				  rank 0 is the engine, the others follow it
				  (loom_engine_follow) */
	/* ---- appended (0.7): pipeline micro-batches ---- */
	int32_t pp_micro;      /* with pp > 1, a step of several sequences runs
				  as up to this many micro-batches of whole
				  sequences, so stages overlap; 1: steps run
				  whole; <= 0: a count that grows with the
				  step's tokens (docs/DISTRIBUTED.md) */
	/* ---- appended (0.8): llama.cpp's -ngl ---- */
	int32_t n_gpu_layers;  /* the layers asked to run on the backend; < 0
				  (loom_engine_params_init): all. loom runs every
				  layer on its one backend, so a count below the
				  model's layers is refused (no partial offload) */
	/* ---- appended (0.9): token trees (docs/SPECULATIVE.md) ---- */
	int32_t spec_tree;     /* nodes of a draft tree per step (1..64) for a
				  strategy with trees (ngram.so), verified in one
				  pass where the backend can (ABI 1.8); <= 0:
				  chains only */
};

void loom_engine_params_init(struct loom_engine_params *p);

/* KV cache element types (GGUF type ids; docs/QUANTIZATION.md, "KV cache").
 * LOOM_KV_DEFAULT: f16 where the backend stores it, f32 in exact mode or
 * on a backend of ABI < 1.3. */
enum loom_kv_type {
	LOOM_KV_DEFAULT = -1,
	LOOM_KV_F32 = 0,
	LOOM_KV_F16 = 1,
	LOOM_KV_Q4_0 = 2,
	LOOM_KV_Q8_0 = 8,
};
/* "f32", "f16", "q8_0" or "q4_0" (any case): 0 and *type set, else -1. */
int loom_kv_type_parse(const char *name, int32_t *type);
/* The name of a KV type, "default" for LOOM_KV_DEFAULT, or NULL. */
const char *loom_kv_type_name(int32_t type);
/* The KV reservation used when none is given: 1/8 of the memory the
 * system has available (MemAvailable), clamped to [256 MiB, 4 GiB];
 * 256 MiB when that cannot be read. */
uint64_t loom_kv_default_bytes(void);
struct loom_engine *loom_engine_open(const struct loom_engine_params *p,
				     char *err, size_t errlen);
void loom_engine_close(struct loom_engine *e);

/* Distributed jobs: true on every rank but 0, which must call
 * loom_engine_follow and then loom_engine_close, and nothing else. */
bool loom_engine_is_follower(const struct loom_engine *e);
/* Executes rank 0's steps until rank 0 closes its engine: 0, or a negative
 * loom_status with err set (the process should then exit non-zero, which
 * ends the job). */
int loom_engine_follow(struct loom_engine *e, char *err, size_t errlen);

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
	/* ---- appended (0.5) ---- */
	const struct loom_grammar *grammar; /* optional: constrains the output
					       (loom_grammar_new) */
};

void loom_generation_params_init(struct loom_generation_params *g);

/* Called for each generated token with its text (complete UTF-8 only; may
 * be empty while a multi-byte character is pending; when the last token
 * leaves one unfinished, its text ends with U+FFFD in place of the
 * pending bytes). Return non-zero to stop generating. */
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

/* ======== appended (0.2): requests, the one engine path ======== */

/* The model's general.name, or its file name. */
const char *loom_engine_model_name(const struct loom_engine *e);

/* How a request ended. */
enum loom_finish {
	LOOM_FINISH_NONE = 0,   /* more tokens follow */
	LOOM_FINISH_LENGTH,     /* n_predict reached */
	LOOM_FINISH_EOG,        /* end-of-generation token (not reported as a token) */
	LOOM_FINISH_CANCELLED,  /* loom_cancel, or the engine closed */
	LOOM_FINISH_ERROR,      /* backend failure; message in the event */
};

/* One event of a request: a new token (token >= 0; finish NONE, or LENGTH
 * with the last token) or the end alone (token -1, finish != NONE).
 * Exactly one event with finish != NONE arrives per accepted request;
 * after it the engine forgets `user`. */
struct loom_event {
	uint64_t id;
	int32_t token;
	enum loom_finish finish;
	int32_t n_prompt, n_generated; /* n_generated counts reported tokens */
	int32_t n_cached;              /* prompt tokens served from the prefix cache */
	const char *error;             /* LOOM_FINISH_ERROR: why; else NULL */
	/* ---- appended (api): a token's log-probabilities, for a request
	 * with logprobs (else 0 and NULL). They are the log-softmax of the
	 * model's logits, before a grammar's mask, penalties, temperature and
	 * truncation: what the model itself gives the token. top: the
	 * request's top_logprobs most likely tokens, most likely first (ties
	 * to the lower id); valid during the callback only. */
	float logprob;
	const struct loom_token_logprob *top;
	int32_t n_top;
};

/* A token and its log-probability (natural log). */
struct loom_token_logprob {
	int32_t token;
	float logprob;
};

/* Called on the thread that steps the engine; must not block for long.
 * It may call loom_submit and loom_cancel. */
typedef void (*loom_event_fn)(void *user, const struct loom_event *ev);

struct loom_request {
	uint32_t struct_size;
	const int32_t *prompt;  /* token ids, copied by loom_submit */
	int32_t n_prompt;
	int32_t n_predict;      /* <= 0: up to the context */
	struct loom_sampler_params sampling; /* loom_sampler_defaults by _init */
	/* a speculative strategy loaded by the engine, by name ("ngram" or
	 * "ngram.so"); NULL: the engine's default; "none": plain decoding */
	const char *spec;
	int32_t spec_max_draft; /* <= 0: the strategy's */
	bool ignore_eog;        /* end-of-generation tokens are generated like
				   any other (benchmarks) */
	float *prompt_logits;   /* optional: n_vocab floats, the logits the
				   first token is drawn from */
	loom_event_fn on_event;
	void *user;
	/* ---- appended (0.3) ---- */
	/* optional: n_prompt x n_vocab floats; row i gets the logits after
	 * prompt token i (what predicts token i + 1), for perplexity. Needs an
	 * engine opened with all_logits; such a request shares no cached
	 * prefix (every position runs). */
	float *all_logits;
	/* ---- appended (0.5): constrained decoding ---- */
	/* optional: every generated token must continue a sentence of this
	 * grammar (loom_grammar_new), and end-of-generation comes only where
	 * the text is complete. loom_submit takes its own reference. */
	const struct loom_grammar *grammar;
	/* ---- appended (0.6): log-probabilities and hidden states ----
	 * A request with logprobs, prompt_logprobs or hidden decodes without
	 * speculation and shares no cached prefix. */
	bool logprobs;          /* each token event carries its logprob */
	int32_t top_logprobs;   /* and the most likely tokens, 0..20 */
	/* optional: n_prompt x (1 + top_logprobs) entries. Row i: the prompt
	 * token i and its logprob given the tokens before it (row 0, which has
	 * none: NAN), then the top_logprobs most likely tokens at position i
	 * (row 0: token -1, logprob NAN). */
	struct loom_token_logprob *prompt_logprobs;
	/* optional: n_prompt x loom_engine_n_embd floats; row i gets the
	 * model's final normed hidden state at prompt token i (what its output
	 * layer reads). Such a request ends after its prompt, with no token
	 * (finish LENGTH, n_generated 0): it is for embeddings. */
	float *hidden;
};

#define LOOM_MAX_TOP_LOGPROBS 20

void loom_request_init(struct loom_request *r);

/* Queues a request (any thread). 0 and its id in *id; LOOM_ERR_INVALID
 * (or LOOM_ERR_CONTEXT) with err set for a bad request; LOOM_ERR_FULL when
 * the waiting queue is full; LOOM_ERR_NOMEM. */
int loom_submit(struct loom_engine *e, const struct loom_request *r, uint64_t *id,
		char *err, size_t errlen);
/* Asks to end a request (any thread); its final event says CANCELLED
 * unless it finished first. Unknown or finished ids are ignored. */
void loom_cancel(struct loom_engine *e, uint64_t id);
/* Runs one scheduler step on this thread: the number of sequences that
 * ran (0: idle), or a negative loom_status after a backend failure (the
 * requests it hit get ERROR events). */
int loom_engine_step(struct loom_engine *e);
/* Steps whenever there is work, until loom_engine_stop (another thread). */
void loom_engine_run(struct loom_engine *e);
void loom_engine_stop(struct loom_engine *e);

/* The speculative strategy called name ("ngram", "ngram.so"), among those
 * the engine loaded: its name and path, or NULL. */
const char *loom_engine_find_spec(const struct loom_engine *e, const char *name);

struct loom_engine_stats {
	int32_t running, waiting;
	int64_t blocks_total, blocks_used, blocks_cached; /* cached: free but reusable */
	int32_t block_size;
	uint64_t kv_bytes;    /* the whole KV cache */
	int32_t n_ctx;        /* tokens per sequence at most */
	int32_t n_parallel;   /* sequences at most */
	bool prefix_cache;
	uint64_t prefix_hits, prefix_lookups; /* blocks reused / looked up */
	uint64_t preemptions, rejected, cow_copies;
	uint64_t prompt_tokens, generated_tokens, steps;
	uint64_t spec_steps, spec_drafted, spec_accepted, spec_tokens;
	/* ---- appended (swa): sliding-window layers ----
	 * A model with both windowed and full-context layers keeps the
	 * windowed ones in a pool of their own, holding only the blocks their
	 * window reaches; blocks_* above are then the full-context pool and
	 * kv_bytes both pools. */
	int64_t blocks_peak;      /* most full-context blocks held at once */
	int32_t local_window;     /* the windowed layers' window; 0: no such pool */
	int32_t local_layers;     /* layers in it */
	int64_t local_blocks_total, local_blocks_used, local_blocks_cached;
	int64_t local_blocks_peak;
	/* the plan: blocks one sequence at n_ctx needs in each pool */
	int64_t seq_blocks, seq_local_blocks;
	/* ---- appended (0.4): weights on the backend ----
	 * bytes in the GGUF layout (one buffer), and bytes and tensors the
	 * backend keeps in a layout of its own (ABI 1.2 weight_pack) */
	uint64_t weights_bytes, packed_bytes;
	int32_t packed_tensors;
	/* ---- appended (0.5): the KV cache's type ---- */
	int32_t kv_type;          /* enum loom_kv_type, never DEFAULT */
	uint64_t kv_token_bytes;  /* K and V of one token in every layer */
	/* ---- appended (0.6): mixture of experts ----
	 * bytes of the routed experts' tensors as planned (included in the
	 * weights above), and experts a layer has / routes a token to (0: a
	 * dense model) */
	uint64_t expert_bytes;
	int32_t n_expert, n_expert_used;
	/* bytes of a token table that only the embedding reads (an untied
	 * model's token_embd: a step reads a row of it, not all) */
	uint64_t embd_only_bytes;
};
void loom_engine_get_stats(struct loom_engine *e, struct loom_engine_stats *st);


/* ======== appended (0.2): text, and files without an engine ======== */

/*
 * Tokenizers, built from a GGUF file's tokenizer.* keys: SentencePiece
 * ("llama") and byte-level BPE ("gpt2", pre-tokenizer by tokenizer.ggml.pre).
 * An engine's tokenizer lives as long as the engine; one opened alone
 * (loom_tokenizer_open, which also reads vocabulary-only files) until
 * loom_tokenizer_free. Read-only after creation: any thread may use it.
 */
struct loom_tokenizer;

struct loom_tokenizer *loom_tokenizer_open(const char *gguf_path, char *err, size_t errlen);
void loom_tokenizer_free(struct loom_tokenizer *t);
const struct loom_tokenizer *loom_engine_tokenizer(const struct loom_engine *e);

/*
 * Encodes text[0..len). add_special: prepend BOS (and append EOS) as the
 * model's metadata asks (tokenizer.ggml.add_bos_token / add_eos_token).
 * parse_special: text such as "<|im_start|>" matching a control/user-defined
 * token becomes that token instead of being split (never for text a user
 * wrote: that is how chat turns get forged).
 * Writes at most cap ids to out and returns the total number of ids the
 * text needs (call again with a larger buffer if > cap), or -1 on error.
 */
int64_t loom_tokenize(const struct loom_tokenizer *t, const char *text, size_t len,
		      bool add_special, bool parse_special, int32_t *out, int64_t cap);

/*
 * Streaming detokenizer: appends the bytes of `token` to a per-stream
 * pending buffer and returns in out (NUL-terminated, at most cap-1 bytes)
 * only complete UTF-8 text, holding back a trailing incomplete sequence
 * until the bytes that finish it arrive. Returns the number of bytes
 * written, or -1 if cap is too small or the id is out of range.
 * Control tokens (BOS/EOS...) produce no text.
 */
struct loom_detok {
	unsigned char pending[8];
	int n_pending;
	bool first; /* set true before the first token: spm strips a leading space */
};
int loom_detokenize(const struct loom_tokenizer *t, struct loom_detok *st,
		    int32_t token, char *out, size_t cap);
/* Text of one token as stored (for debugging), NUL-terminated copy. */
const char *loom_token_text(const struct loom_tokenizer *t, int32_t token);

int32_t loom_tokenizer_n_vocab(const struct loom_tokenizer *t);
/* Appended (api): the bytes token decodes to (not NUL-terminated, perhaps
 * part of a UTF-8 character; *len 0 for control tokens), or NULL for an
 * id out of range. */
const char *loom_token_bytes(const struct loom_tokenizer *t, int32_t token, size_t *len);
int32_t loom_tokenizer_bos(const struct loom_tokenizer *t); /* -1 if none */
int32_t loom_tokenizer_eos(const struct loom_tokenizer *t); /* -1 if none */
/* True for end-of-generation tokens (EOS, EOT, <|im_end|>, <end_of_turn>...). */
bool loom_tokenizer_is_eog(const struct loom_tokenizer *t, int32_t token);

/*
 * Chat templates. GGUF files carry tokenizer.chat_template as a Jinja
 * program; loom runs it with its own interpreter (LOOM_CHAT_JINJA,
 * docs/TEMPLATES.md). For a model without one, the built-in families
 * render their formats in C.
 * The rendered text contains special-token text ("<|im_start|>") and must
 * be tokenized with parse_special; it never contains BOS (the tokenizer
 * adds it when the model's metadata asks).
 */
enum loom_chat_family {
	LOOM_CHAT_UNKNOWN = 0,
	LOOM_CHAT_CHATML,  /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
	LOOM_CHAT_LLAMA2,  /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] */
	LOOM_CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	LOOM_CHAT_GEMMA,   /* <start_of_turn>user\n...<end_of_turn>\n */
	LOOM_CHAT_MISTRAL, /* [INST] ... [/INST]...</s> (no <<SYS>> block) */
	LOOM_CHAT_PHI3,    /* <|user|>\n...<|end|>\n */
	LOOM_CHAT_ZEPHYR,  /* <|user|>\n...</s>\n */
	LOOM_CHAT_JINJA,   /* appended: a Jinja template, run by loom's interpreter */
};

struct loom_chat_template {
	enum loom_chat_family family;
	/* chatml only: the system message the template inserts when the
	 * conversation has none (SmolLM2 does this), or "" */
	char default_system[512];
	/* appended: LOOM_CHAT_JINJA only: the template's source (malloc'd;
	 * loom_chat_template_free releases it) and the texts of the model's
	 * BOS and EOS tokens, passed as bos_token and eos_token ("" if none) */
	char *source;
	char bos_token[128], eos_token[128];
};

/* A message; role is "system", "user" or "assistant". */
struct loom_chat_msg {
	const char *role;
	const char *content;
};

/* Recognizes tmpl (the Jinja source; NULL when the model has none, which
 * means chatml) as one of the built-in families (not LOOM_CHAT_JINJA).
 * Returns 0, or -1 with err naming what was not recognized. */
int loom_chat_template_detect(const char *tmpl, struct loom_chat_template *t,
			      char *err, size_t errlen);
/* The engine's model's template: its tokenizer.chat_template as a Jinja
 * template (LOOM_CHAT_JINJA), else (no template, or one the interpreter
 * cannot parse) the family detect recognizes, else the architecture's
 * family; *had_one (may be NULL) says whether the model carries one.
 * Release it with loom_chat_template_free. */
int loom_engine_chat_template(const struct loom_engine *e, struct loom_chat_template *t,
			      bool *had_one, char *err, size_t errlen);
const char *loom_chat_family_name(enum loom_chat_family f);

/* Renders msgs[0..n) into a malloc'd NUL-terminated string, adding the
 * assistant header when add_generation_prompt. NULL with err set for an
 * unknown role, a misplaced system message, or out of memory; for a Jinja
 * template, with the template's message when it raises. A Jinja template
 * gets messages (role, content), add_generation_prompt, bos_token and
 * eos_token; the text keeps a BOS it writes (loom_chat_tokenize drops it
 * when the tokenizer adds BOS itself, as callers then prepend one). */
char *loom_chat_render(const struct loom_chat_template *t,
		       const struct loom_chat_msg *msgs, size_t n,
		       bool add_generation_prompt, char *err, size_t errlen);

/* A speculative strategy the engine loaded (i from 0): false past the last. */
struct loom_strategy_info {
	const char *name, *path;
	int32_t max_draft;
	uint64_t n_steps;    /* verification steps */
	uint64_t n_drafted;  /* drafts verified */
	uint64_t n_accepted; /* of those, accepted */
	uint64_t n_tokens;   /* tokens those steps produced */
};
bool loom_engine_strategy(const struct loom_engine *e, int i, struct loom_strategy_info *out);

/* `loom info`: GGUF version, architecture and hyperparameters, tokenizer,
 * tensor counts and bytes by type, printed to out. Works on vocabulary-only
 * files. 0, or a negative loom_status with the reason in err. */
int loom_info_print(const char *path, FILE *out, char *err, size_t errlen);
/* `loom info --archs`: Markdown tables of the architectures (with what
 * each descriptor sets: RoPE ordering, FFN, attention features) and the
 * tokenizer families loom reads, generated from the descriptors. 0, or
 * -1 when writing failed. */
int loom_info_print_supported(FILE *out);

/* ======== appended (0.4): plugins on the search path ======== */

/*
 * Where plugins are found (docs/BACKENDS.md). A bare name is looked up in
 * each folder of $LOOM_BACKEND_PATH (LOOM_QUANT_PATH, LOOM_SPEC_PATH),
 * then ${XDG_DATA_HOME:-~/.local/share}/loom/<kind>, then the built-in
 * folder: the build tree's for a program run from the build tree, else
 * the installed <libdir>/loom/<kind>. A name with a '/' is a path.
 *
 * loom_plugin_path writes the search path of kind ("backends", "quant" or
 * "spec"), folders joined by ':', into out. 0, or -1 for an unknown kind
 * or an out of cap bytes too small.
 */
int loom_plugin_path(const char *kind, char *out, size_t cap);

/* One file of the backend search path, as loom_backends_list found it. */
struct loom_backend_listing {
	const char *path;
	const char *refused;     /* not loadable (not ELF, no entry symbol,
				    ABI mismatch, slot missing): why; else NULL */
	const char *shadowed_by; /* an earlier file of the same name wins a
				    lookup by name; else NULL */
	/* the rest only when refused is NULL */
	const char *name;        /* the backend's own name */
	uint32_t abi_major, abi_minor, struct_size;
	const char *create_error; /* create() failed (no device, driver): why */
	/* the rest only when create_error is NULL too */
	char device[128];
	uint64_t mem_total, mem_free; /* bytes; 0 if unknown */
	char gemm_formats[256];  /* weight formats gemm runs, "f32 f16 q4_0" */
	char embed_formats[256]; /* the same for embed */
	char ops[256];           /* operators run on f32, "rmsnorm rope ..." */
	char optional[128];      /* optional slots present, "graph_begin ..." */
};

typedef void (*loom_backend_list_fn)(void *user, const struct loom_backend_listing *l);

/* Calls fn on every *.so of the backend search path, in search order
 * (names in each folder sorted). Each file is loaded (only its pure entry
 * runs when it is refused) and created on device 0 to ask what it
 * supports, then destroyed; backends are never unloaded. 0, or -1 with err
 * when no file was found at all. */
int loom_backends_list(loom_backend_list_fn fn, void *user, char *err, size_t errlen);

/* ======== appended (0.4): the backend conformance suite ======== */

struct loom_check_params {
	uint32_t struct_size;
	const char *backend;   /* the backend under test: name or path */
	const char *reference; /* the oracle; NULL: "ref.so" */
	const char *model;     /* GGUF for the end-to-end comparison, or NULL */
	int32_t n_tokens;      /* greedy tokens compared with --model; <= 0: 16 */
	int32_t n_threads;     /* for the backend under test; <= 0: its choice */
	bool json;             /* the report as JSON on out (FAIL lines on stderr) */
	FILE *out;             /* the report; NULL: stdout */
};

void loom_check_params_init(struct loom_check_params *p);

/*
 * `loom check-backend` (docs/BACKENDS.md): every operator and weight
 * format the backend claims against the reference with normalized-error
 * tolerances, the invalid-argument contracts, batch invariance with
 * LOOM_BACKEND_BATCH_INVARIANT, and with a model greedy generation in
 * exact mode against the reference, token for token. Prints a FAIL line
 * per failed case and a table per op and format. Runs in a child process
 * so that a crash or a hang (300 s) in the backend is reported with the
 * case it happened in.
 * 0: every check passed; 1: some failed (err names the ops and formats);
 * -1: the check could not run (err says why: the backend or the reference
 * does not load, fork failed).
 */
int loom_check_backend(const struct loom_check_params *p, char *err, size_t errlen);

/* ---- appended: `loom quantize` (docs/QUANTIZATION.md) ---- */
struct loom_quantize_params {
	uint32_t struct_size;
	const char *input;    /* GGUF to read */
	const char *output;   /* GGUF to write (through loom_outfile_open: a temporary
				 renamed at the end; an existing file needs force) */
	/* A plain format ("q4_0", "q4_K", "f16": every quantizable tensor) or
	 * a llama.cpp mix ("Q4_K_M", "Q8_0": per-tensor rules). */
	const char *type;
	const char *strategy; /* quant strategy plugin, name or path; NULL: "rtn" */
	int32_t n_threads;    /* threads over rows; <= 0: every core */
	bool allow_requantize; /* accept a quantized source (dequantized first) */
	bool dry_run;         /* print the plan, write nothing */
	bool progress;        /* progress bar on stderr (if a tty) */
	FILE *out;            /* the plan and the summary; NULL: stdout */
	/* ---- appended (0.6) ---- */
	/* calibration file (loom_imatrix_load) for strategies that need one,
	 * and for the mixes' imatrix-only rules; NULL: none */
	const char *imatrix;
	/* ---- appended (0.7) ---- */
	bool force;           /* replace an existing output (else refused) */
};

void loom_quantize_params_init(struct loom_quantize_params *p);

/* Writes p->output: p->input's metadata (general.file_type set) and
 * tensors, each quantized by the strategy to the type the plan gives it,
 * one tensor in memory at a time. 0, or -1 with err naming what is wrong
 * (the file, the type, the tensor and its shape). */
int loom_quantize(const struct loom_quantize_params *p, char *err, size_t errlen);
/* ======== appended: chat prompts without control-token injection ======== */

/*
 * As loom_tokenize, but special-token text becomes a control token only
 * where markup[i] is nonzero for every byte it spans (markup: one byte per
 * byte of text); elsewhere it is tokenized as plain text, as with
 * parse_special false. -1 if markup is NULL for a non-empty text.
 */
int64_t loom_tokenize_marked(const struct loom_tokenizer *t, const char *text, size_t len,
			     const unsigned char *markup, bool add_special, int32_t *out,
			     int64_t cap);

/*
 * As loom_chat_render; *markup (malloc'd, one byte per byte of the text,
 * may be NULL to skip) is 1 where the template wrote the byte and 0 where
 * it comes from a message's content.
 */
char *loom_chat_render_marked(const struct loom_chat_template *t,
			      const struct loom_chat_msg *msgs, size_t n,
			      bool add_generation_prompt, unsigned char **markup,
			      char *err, size_t errlen);

/*
 * Renders and tokenizes a chat so that special tokens come only from the
 * template: a message containing "<|im_start|>system" is tokenized as that
 * text. No BOS is added. *ids is malloc'd (the caller frees it); returns
 * their number, or -1 with err set (and *ids NULL).
 */
int64_t loom_chat_tokenize(const struct loom_tokenizer *tok, const struct loom_chat_template *t,
			   const struct loom_chat_msg *msgs, size_t n, bool add_generation_prompt,
			   int32_t **ids, char *err, size_t errlen);
/* ======== appended: bounded tokenization (a request's prompt) ======== */

/*
 * As loom_tokenize_marked (markup NULL: as loom_tokenize with
 * parse_special), but the work stops once the text is known to need more
 * than max ids, and max + 1 is returned then (out holds nothing useful). So
 * a prompt too long for a context of max tokens is refused after about
 * max ids' worth of its text, however long it is. max in [0, INT64_MAX).
 */
int64_t loom_tokenize_max(const struct loom_tokenizer *t, const char *text, size_t len,
			  const unsigned char *markup, bool add_special, bool parse_special,
			  int32_t *out, int64_t cap, int64_t max);

/*
 * As loom_chat_tokenize, but returns max + 1 (and *ids NULL, err empty) as
 * soon as the chat is known to need more than max ids.
 */
int64_t loom_chat_tokenize_max(const struct loom_tokenizer *tok,
			       const struct loom_chat_template *t,
			       const struct loom_chat_msg *msgs, size_t n,
			       bool add_generation_prompt, int64_t max, int32_t **ids,
			       char *err, size_t errlen);
/* ======== appended (api): embeddings ======== */

/* Width of the hidden state (loom_request.hidden rows). */
int32_t loom_engine_n_embd(const struct loom_engine *e);

/* How an embedding pools the rows of a prompt's hidden states, from the
 * GGUF key <arch>.pooling_type (llama.cpp's values); mean when the file
 * has none or names one loom does not offer (none, rank). */
enum loom_pooling {
	LOOM_POOLING_MEAN = 1,
	LOOM_POOLING_CLS = 2,  /* the first token's row */
	LOOM_POOLING_LAST = 3, /* the last token's row */
};
enum loom_pooling loom_engine_pooling(const struct loom_engine *e);

/* ======== appended (0.5): constrained decoding ======== */

/*
 * A grammar that constrains a request's output (loom_request.grammar):
 * at each step the logits of every token whose bytes cannot continue a
 * sentence of the grammar are set to -inf before penalties and sampling,
 * and speculative drafts it rejects are rejected (docs/SERVING.md,
 * "Structured output and tools"). kind:
 *   "json"        any JSON value (text unused)
 *   "json_object" any JSON object (text unused)
 *   "json_schema" text[0..len) is a JSON Schema: type (object, array,
 *                 string, number, integer, boolean, null, or a list),
 *                 properties, required, additionalProperties, items,
 *                 minItems, maxItems, enum, const, anyOf, oneOf (as
 *                 anyOf), local $ref; annotations (title, description,
 *                 default, ...) are ignored, any other keyword is refused
 *   "tool_calls"  text is {"tools": [{"name", "parameters": schema}...],
 *                 "mode": "required" | "auto", "begin": marker, "end":
 *                 marker, "max_calls": n}: begin {"name": ...,
 *                 "arguments": ...} end, one to n times (default 1, at
 *                 most 16); "auto" also allows any text that does not
 *                 start with begin
 * NULL with err naming what is wrong or unsupported. Immutable and
 * reference-counted: loom_grammar_free drops the caller's reference.
 */
struct loom_grammar;
struct loom_grammar *loom_grammar_new(const char *kind, const char *text, size_t len,
				      char *err, size_t errlen);
void loom_grammar_free(struct loom_grammar *g);

/* ======== appended (0.6): calibration files (docs/QUANTIZATION.md) ======== */

/*
 * An importance matrix: per weight tensor, per input column j, the mean
 * over calibration tokens of x_j^2 (x: the input the weight multiplies),
 * and optionally (`loom imatrix --hessian`) the mean of x x^T.
 *
 * loom_imatrix_load reads llama.cpp's legacy .dat layout (what `loom
 * imatrix` writes, followed by loom's Hessian section when there is one)
 * and llama.cpp's GGUF imatrix files (general.type "imatrix", tensors
 * NAME.in_sum2 and NAME.counts). flags: LOOM_IMATRIX_HESSIAN maps the
 * Hessians too (else their pointers are NULL). NULL with err naming the
 * file and what is wrong (truncated, a count out of range, a name too
 * long, sizes that disagree). Read-only after loading: any thread may
 * look up entries.
 */
struct loom_imatrix;

enum { LOOM_IMATRIX_HESSIAN = 1u << 0 };

struct loom_imatrix_entry {
	const char *name;      /* the weight, "blk.0.attn_q.weight" */
	int64_t cols;          /* the weight's input width: floats in mean_sq */
	int64_t n_tokens;      /* tokens behind the entry (loom's files, GGUF
				  ones of one matrix); 0 when unknown */
	const float *mean_sq;  /* [cols] mean of x_j^2 */
	const float *hessian;  /* [cols][cols] mean of x x^T (symmetric), or NULL */
};

struct loom_imatrix *loom_imatrix_load(const char *path, uint32_t flags, char *err,
				       size_t errlen);
void loom_imatrix_free(struct loom_imatrix *im);
size_t loom_imatrix_count(const struct loom_imatrix *im);
/* Entry i (0 <= i < count), or NULL. */
const struct loom_imatrix_entry *loom_imatrix_at(const struct loom_imatrix *im, size_t i);
/* The entry of a weight tensor, or NULL when the file has none. */
const struct loom_imatrix_entry *loom_imatrix_lookup(const struct loom_imatrix *im,
						     const char *name);
/* Chunks of calibration text behind the file (0 when unknown), the
 * dataset's name ("" when unknown), whether Hessians were mapped. */
int32_t loom_imatrix_chunks(const struct loom_imatrix *im);
const char *loom_imatrix_dataset(const struct loom_imatrix *im);
bool loom_imatrix_has_hessian(const struct loom_imatrix *im);

/* One tensor's statistics for loom_imatrix_save. */
struct loom_imatrix_stat {
	const char *name;
	int64_t cols;
	int64_t n_tokens;      /* tokens averaged over */
	const float *mean_sq;  /* [cols] */
	const float *hessian;  /* [cols][cols], or NULL; the same pointer given
				  for several tensors is stored once */
};

/*
 * Writes stats[0..n) to path in llama.cpp's legacy imatrix layout (which
 * llama-quantize --imatrix reads: per entry the name, ncall = n_chunks,
 * and mean_sq * n_chunks); after llama.cpp's trailer, loom's sections
 * (docs/QUANTIZATION.md): "LOOMTOK1", each entry's n_tokens, when any is
 * known, and "LOOMHES1" when any entry has a Hessian.
 * Written through loom_outfile_open(path, flags) (below): an existing
 * file is replaced only with LOOM_WRITE_FORCE. 0, or -1 with err.
 */
int loom_imatrix_save(const char *path, uint32_t flags, const struct loom_imatrix_stat *stats,
		      size_t n, int32_t n_chunks, const char *dataset, char *err, size_t errlen);

/* ======== appended: output files ======== */

/*
 * Every file loom writes is created through these. The data goes to a
 * temporary PATH.XXXXXX.part beside PATH, created with
 * O_CREAT|O_EXCL|O_NOFOLLOW under a random name (a link planted there is
 * never followed, an existing file never truncated), and is renamed over
 * PATH only by loom_outfile_commit, after fflush and fsync. An existing
 * PATH is refused ("PATH: already exists (--force replaces it)") both at
 * open and, atomically, at the rename unless flags has LOOM_WRITE_FORCE;
 * with it the rename replaces PATH itself, never a link's target. A
 * directory at PATH is refused at open, with or without the flag. Where
 * the file system lacks renameat2's RENAME_NOREPLACE, link(2) keeps the
 * rename from replacing; where it lacks links too (vfat, some FUSE or SMB
 * mounts), PATH is created empty with O_EXCL and the temporary renamed
 * over it (not atomic: see core/outfile.c). Which of these applies is
 * found at open, on the temporary, before any work.
 */
#define LOOM_WRITE_FORCE 1u

struct loom_outfile;
/* The open temporary, or NULL with err. */
struct loom_outfile *loom_outfile_open(const char *path, uint32_t flags, char *err,
				       size_t errlen);
/* Where to write; valid until commit or discard. */
FILE *loom_outfile_stream(struct loom_outfile *f);
const char *loom_outfile_path(const struct loom_outfile *f);
/* Flushes, syncs, closes and renames into place; always frees f. 0, or
 * -1 with err: after a write error the temporary is removed; when the
 * rename fails (PATH appeared meanwhile: "PATH exists now; the result is
 * kept as PATH.XXXXXX.part: rename it, or rerun with --force") the
 * finished temporary is kept, and no longer removed on a signal. */
int loom_outfile_commit(struct loom_outfile *f, char *err, size_t errlen);
/* Closes and removes the temporary; frees f (NULL: nothing). */
void loom_outfile_discard(struct loom_outfile *f);
/* Removes every temporary still open in the process. Async-signal-safe:
 * a command's SIGINT/SIGTERM handler calls it before dying, so an
 * interrupted run leaves no PATH.XXXXXX.part behind. It may run on any
 * thread: the table is published so that a slot is read whole or not at
 * all, open and discard hold the signals off while they change it, and
 * the handler waits (up to a second) for a thread that has created a
 * temporary but not yet listed it; after it, no new temporary is made. */
void loom_outfile_discard_all(void);
/* data[0..n) to path through the above. 0, or -1 with err. */
int loom_write_file(const char *path, uint32_t flags, const void *data, size_t n, char *err,
		    size_t errlen);


/* ======== appended: Jinja chat templates ======== */

/*
 * Renders a Jinja chat template (a model's tokenizer.chat_template, or any
 * template text) with the variables of VARS_JSON, a JSON object (empty or
 * NULL: none)
 * (messages, add_generation_prompt, tools, bos_token, eos_token...), as
 * Hugging Face transformers renders it (docs/TEMPLATES.md). NOW is
 * strftime_now's time in Unix seconds, UTC (0: the clock, local time).
 * Returns the text, malloc'd and NUL-terminated, its length in *len; or
 * NULL with err: the template's own message when it raised, else what is
 * wrong and where. Limits on output, memory, steps and nesting make a
 * hostile template fail, never hang.
 */
char *loom_template_render(const char *tmpl, size_t tlen, const char *vars_json, size_t vlen,
			   int64_t now, size_t *len, char *err, size_t errlen);

/*
 * A chat template from Jinja SOURCE (LOOM_CHAT_JINJA), given BOS and EOS
 * token texts (NULL: ""). 0, or -1 with err when the source does not
 * parse. Release it with loom_chat_template_free.
 */
int loom_chat_template_jinja(const char *source, const char *bos, const char *eos,
			     struct loom_chat_template *t, char *err, size_t errlen);
/* As loom_engine_chat_template, with the Jinja template in the file PATH in
 * place of the model's (--chat-template FILE). */
int loom_engine_chat_template_file(const struct loom_engine *e, const char *path,
				   struct loom_chat_template *t, char *err, size_t errlen);
/* Frees what a template holds (its Jinja source); safe on any template
 * filled by the functions above, and twice. */
void loom_chat_template_free(struct loom_chat_template *t);

/* ======== chats with tools and tool calls ======== */

/*
 * As loom_chat_render, with the chat as JSON text for a Jinja template
 * (LOOM_CHAT_JINJA; a built-in family cannot place tools and is refused):
 * MESSAGES_JSON an array of messages as Hugging Face transformers passes
 * them (role, content, an assistant's tool_calls with their arguments as
 * objects, a tool result's tool_call_id and name), TOOLS_JSON (NULL or
 * empty: none) the request's tools array, passed as `tools`.
 */
char *loom_chat_render_json(const struct loom_chat_template *t, const char *messages_json,
			    size_t mlen, const char *tools_json, size_t tlen,
			    bool add_generation_prompt, char *err, size_t errlen);
/*
 * As loom_chat_tokenize_max for loom_chat_render_json's rendering: every
 * byte that came from the messages or the tools (names, descriptions,
 * arguments, results) is tokenized as text, never as special tokens.
 */
int64_t loom_chat_tokenize_json(const struct loom_tokenizer *tok,
				const struct loom_chat_template *t, const char *messages_json,
				size_t mlen, const char *tools_json, size_t tlen,
				bool add_generation_prompt, int64_t max, int32_t **ids, char *err,
				size_t errlen);

/*
 * A named variant of the model's chat template, the GGUF key
 * tokenizer.chat_template.NAME ("tool_use": the template some models give
 * for requests with tools). 0 with t filled (release it with
 * loom_chat_template_free); 1 when the file has no such template; or a
 * negative loom_status with err (a variant that does not parse).
 */
int loom_engine_chat_template_named(const struct loom_engine *e, const char *name,
				    struct loom_chat_template *t, char *err, size_t errlen);

/* ======== what a server tells of its model ======== */

/*
 * The model file's scalar metadata (every key but the chat templates and
 * arrays) as one JSON object, {"general.architecture": "llama", ...}:
 * malloc'd text the caller frees, or NULL when out of memory.
 */
char *loom_engine_metadata_json(const struct loom_engine *e);
/* llama.cpp's name of a general.file_type id ("q4_K_M"), or NULL. */
const char *loom_file_type_name(uint32_t ft);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_H */
