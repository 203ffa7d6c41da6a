/* Command-line and config-file options of every `loom` subcommand.
 *
 * One table (tools/options.c) lists every option once: its long flag, its
 * config-file key (the flag with '_' for '-'), its type and range, and the
 * subcommands it applies to. The config file (--config) is read first, so
 * flags override it.
 */
#ifndef LOOM_OPTIONS_H
#define LOOM_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom.h"

/* The subcommands, as bits so an option can name every one it applies to. */
enum loom_cmd {
	LOOM_CMD_RUN = 1 << 0,
	LOOM_CMD_INFO = 1 << 1,
	LOOM_CMD_TOKENIZE = 1 << 2,
	LOOM_CMD_BENCH = 1 << 3,
	LOOM_CMD_SERVE = 1 << 4,
	LOOM_CMD_PERPLEXITY = 1 << 5,
	LOOM_CMD_BACKENDS = 1 << 6,
	LOOM_CMD_CHECK = 1 << 7, /* check-backend */
	LOOM_CMD_QUANTIZE = 1 << 8,
	LOOM_CMD_IMATRIX = 1 << 9,
	LOOM_CMD_CHAT = 1 << 10,
};

/* Decode rows per step beyond which speculating sequences stop drafting
 * (scheduler spec_step_rows; measured on cpu.so, docs/SPECULATIVE.md). */
#define LOOM_SPEC_STEP_ROWS 8

/* `loom serve` only; in a config file also under [serve]. */
struct loom_serve_options {
	char host[256];
	int port;
	uint64_t kv_mem;        /* KV reservation (run, serve); 0: loom_kv_default_bytes() */
	int parallel, block_size, max_batch_tokens, max_waiting;
	uint64_t max_body;
	uint64_t max_queued;    /* request bytes waiting to be parsed, in all */
	uint64_t max_queued_per_client; /* the same, from one client key */
	int shutdown_timeout;
	bool prefix_cache;
	char spec_default[256]; /* strategy for requests that name none */
	int spec_step_rows;     /* decode rows per step before drafts stop (0: no cap) */
	/* connections (docs/SERVING.md) */
	int http_threads;       /* event-loop threads serving the sockets */
	int header_timeout;     /* s from accept (or the last response) to the headers' end */
	int body_timeout;       /* s from the headers' end to the body's end */
	int idle_timeout;       /* s without socket progress before a connection is closed */
	int max_conns;          /* open connections, in all */
	int max_conns_per_ip;   /* open connections from one client address */
	int load_wait;          /* s a request waits for the model to load, then 503 */
	bool half_close;        /* answer a client that shut its sending side (else: cancel) */
	/* access */
	char api_key[256];      /* "" (and no LOOM_API_KEY): the API is open */
	char cors_origin[256];  /* "": no CORS headers; an origin or "*" */
	char aliases[1024];     /* model names accepted besides the file's, comma-separated */
};

struct loom_options {
	enum loom_cmd cmd;      /* set by loom_options_parse; 0: every option applies */
	char backend[4096];
	char model[4096];
	char prompt_file[4096];
	char dump_logits[4096];
	char dump_tokens[4096];
	const char *prompt;     /* points into argv */
	int n_predict;
	int n_threads;
	int n_ctx;
	bool ctx_given;         /* ctx_size came from a flag or the config file */
	bool seed_given;        /* seed likewise; run: else a seed from the clock */
	int n_batch;
	bool no_bos;
	bool archs;         /* info: the supported architectures and tokenizers */
	bool progress;
	bool exact; /* --exact: f32 activations, ref.so's arithmetic */
	bool json;  /* backends, check-backend: JSON on stdout */
	char reference[4096]; /* check-backend: the oracle, ref.so */
	/* perplexity */
	char save_logits[4096]; /* --save-logits: the base run's log-probs */
	char kl_base[4096];     /* --kl-base: compare with a saved base run */
	int n_chunks;           /* --chunks: at most this many (0: all) */
	bool prefill_kernels;   /* --prefill-kernels: not batch invariant */
	struct loom_sampler_params sp;
	/* bench */
	int n_prompt;
	int n_gen;
	int n_depth; /* bench: context tokens before the timed decode */
	int reps;
	int n_parallel; /* bench: sequences decoding together in the tg test */
	char threads_list[256];
	/* speculative decoding (docs/SPECULATIVE.md); 0: the engine's default */
	char spec[4096];             /* plugin name or path; "" or "none": off */
	char spec_draft_model[4096];
	int spec_min_draft, spec_max_draft;
	int spec_ngram_min, spec_ngram_max;
	int spec_layers;
	int spec_tree; /* nodes of a token tree; 0: chains */
	struct loom_serve_options serve;
	/* quantize (docs/QUANTIZATION.md) */
	char qstrategy[4096];   /* --strategy: name or path; "": rtn */
	bool allow_requantize;
	bool dry_run;
	bool force;             /* --force: replace an existing output file */
	/* what the command line leaves after the flags (FILE, TEXT) */
	char **args;
	int n_args;
	/* ---- appended (gram): constrained decoding for run (loom.h
	 * loom_grammar_new) ---- */
	char grammar[64];        /* "json", "json_object"; "" or "none": off */
	char json_schema[4096];  /* a JSON Schema file: output follows it */
	/* ---- appended: KV cache type ---- */
	int32_t kv_type;         /* --kv-type: enum loom_kv_type; LOOM_KV_DEFAULT */
	/* ---- appended (imat): calibration (docs/QUANTIZATION.md) ---- */
	char imatrix_out[4096];  /* imatrix -o: the file to write */
	bool hessian;            /* imatrix --hessian: also the mean of x x^T */
	char imatrix_show[4096]; /* imatrix --show FILE: print a file's entries */
	char imatrix[4096];      /* quantize --imatrix FILE */
	/* ---- appended (mpi): distributed jobs (docs/DISTRIBUTED.md) ---- */
	int tp, pp;              /* --tp, --pp: tensor ranks, pipeline stages */
	int pp_micro;            /* --pp-micro: micro-batches per step (0: auto) */
	/* ---- appended (cli): loom chat ---- */
	const char *system_prompt;      /* -sys TEXT: points into argv */
	char system_prompt_file[4096];  /* -sysf FILE */
	/* ---- appended: Jinja chat templates (docs/TEMPLATES.md) ---- */
	char chat_template[4096];       /* --chat-template FILE: replaces the model's */
	/* ---- appended: llama.cpp's flags (README.md, "Coming from llama.cpp") ---- */
	int n_gpu_layers;        /* -ngl N: < 0 or 99 every layer; see gpu_layers() */
	bool ngl_given;
	bool backend_given;      /* --backend came from a flag or the config file */
	bool flash_attn;         /* -fa: attention is always flash-style; off is refused */
	bool flash_attn_given;
	bool conversation;       /* -cnv: `loom run` becomes `loom chat` (tools/loom.c) */
	bool pieces;             /* tokenize --pieces: each id with its text */
};

/* Every subcommand's defaults (the server's too: they touch no other). */
void loom_options_defaults(struct loom_options *o);

/* Parses `loom CMD [options] [operands]` (argv[1] is CMD): the config files
 * of --config first, then the flags. A flag that CMD does not take is
 * refused. 0; 1 after printing CMD's usage for --help; -1 with the reason
 * in err. */
int loom_options_parse(struct loom_options *o, int argc, char **argv, char *err,
		       size_t errlen);

/* Does argv (after argv[first]) ask for llama.cpp's conversation mode
 * (-cnv, --conversation)? Values of options are skipped, not read as flags. */
bool loom_options_wants_chat(int argc, char **argv, int first);

/* For -cnv: llama-cli's -p TEXT and -f FILE in conversation mode are the
 * system prompt, so they become --system-prompt(-file), in place. */
void loom_options_run_to_chat(int argc, char **argv, int first);

/* The one-line refusal of llama.cpp's flags loom does not take (-hf: loom
 * downloads nothing) found in argv after argv[first], or NULL. */
const char *loom_options_refused_flag(int argc, char **argv, int first);

/* Prints the usage of cmd, or of every subcommand for 0. */
void loom_options_usage(FILE *out, enum loom_cmd cmd);

/* The manual page (roff, man(7)) and the bash completion script, both
 * made from the option and subcommand tables (loom --help-man,
 * loom --completion bash; the build installs them). */
void loom_options_man(FILE *out, const char *version);
void loom_options_completion(FILE *out);

/* The subcommands' names, comma-separated, for a refusal of an unknown one. */
const char *loom_options_commands(void);

/* Engine parameters every subcommand shares (model, backend, threads,
 * speculation, exact mode); a subcommand then sets its own. The strings
 * point into o. */
void loom_options_engine_params(const struct loom_options *o, struct loom_engine_params *p);

/* Reads an INI file: keys at top level or in [loom]; [serve] keys count
 * for `loom serve` only. A key another subcommand takes is checked and
 * skipped. 0, or -1 with a message naming the file, line and key in err. */
int loom_options_load_ini(struct loom_options *o, const char *path, char *err,
			  size_t errlen);

/* Applies one option by its config key (shared by the INI reader and the
 * command line). 0, or -1 with the reason in err. */
int loom_options_set(struct loom_options *o, const char *key, const char *value,
		     char *err, size_t errlen);

/* Parses a decimal integer in [lo, hi] for option `key`; 0, or -1 with a
 * message naming the key and the range. */
int loom_options_parse_int(const char *key, const char *v, long lo, long hi,
			   int *out, char *err, size_t errlen);

#endif
