/* Options of every `loom` subcommand: one table for the command line and
 * the INI config file. */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <ini.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define RUN LOOM_CMD_RUN
#define INFO LOOM_CMD_INFO
#define TOKENIZE LOOM_CMD_TOKENIZE
#define BENCH LOOM_CMD_BENCH
#define SERVE LOOM_CMD_SERVE
#define PPL LOOM_CMD_PERPLEXITY
#define BACKENDS LOOM_CMD_BACKENDS
#define CHECK LOOM_CMD_CHECK
#define QUANTIZE LOOM_CMD_QUANTIZE
#define IMATRIX LOOM_CMD_IMATRIX
#define CHAT LOOM_CMD_CHAT
#define GEN (RUN | CHAT) /* the subcommands that sample text */
#define ENGINE (RUN | CHAT | BENCH | SERVE | PPL | IMATRIX) /* the subcommands that load a backend */

enum opt_type {
	OPT_STR,     /* a char array, the value copied in */
	OPT_ARG,     /* a const char * into argv: command line only */
	OPT_INT,     /* an int in [lo, hi] */
	OPT_FLOAT,   /* a float in [lo, hi] */
	OPT_U64,     /* a uint64_t */
	OPT_SIZE,    /* bytes, with an optional K, M, G or T suffix */
	OPT_BOOL,    /* true/false, yes/no, on/off, 1/0; a bare --flag is true */
	OPT_NOT,     /* OPT_BOOL stored negated: --no-progress clears progress */
	OPT_THREADS, /* an int; for bench also a list such as 1,2,4 */
	OPT_LIST,    /* a char array; each use appends, comma-separated */
	OPT_KVTYPE,  /* an int32_t enum loom_kv_type, by name */
};

struct opt_def {
	const char *name; /* --name; the config key is the name with '_' for '-' */
	char short_name;  /* -x, or 0 */
	enum opt_type type;
	size_t off, size; /* the field of struct loom_options */
	double lo, hi;    /* OPT_INT, OPT_FLOAT */
	unsigned cmds;    /* enum loom_cmd bits: the subcommands that take it */
	bool flag_only;   /* not a config key */
	const char *arg;  /* the value's name in the manual ("FILE"); NULL for a flag */
	const char *help; /* one line for the manual */
};

#define FIELD(f) .off = offsetof(struct loom_options, f), \
		 .size = sizeof(((struct loom_options *)0)->f)

static const struct opt_def opts[] = {
	{ .name = "backend", .arg = "NAME|PATH", .help = "the backend plugin: cpu.so (default), ref.so, cuda.so, rocm.so or a path",
	  .type = OPT_STR, FIELD(backend), .cmds = ENGINE },
	{ .name = "model", .arg = "FILE", .help = "the GGUF model file",
	  .short_name = 'm', .type = OPT_STR, FIELD(model),
	  .cmds = ENGINE | INFO | TOKENIZE | CHECK },
	{ .name = "prompt", .arg = "TEXT", .help = "the prompt (run); with -cnv, the system prompt",
	  .short_name = 'p', .type = OPT_ARG, FIELD(prompt), .cmds = RUN,
	  .flag_only = true },
	{ .name = "file", .arg = "FILE", .help = "read the prompt or text from FILE (- for stdin)",
	  .short_name = 'f', .type = OPT_STR, FIELD(prompt_file),
	  .cmds = RUN | TOKENIZE | PPL | IMATRIX },
	{ .name = "n-predict", .arg = "N", .help = "tokens to generate at most; -1: until the end of the sequence or a full context",
	  .short_name = 'n', .type = OPT_INT, FIELD(n_predict),
	  .lo = -1, .hi = INT_MAX, .cmds = GEN | CHECK },
	{ .name = "threads", .arg = "N", .help = "worker threads (bench: also a list such as 1,2,4); 0: the backend chooses",
	  .short_name = 't', .type = OPT_THREADS, FIELD(n_threads),
	  .lo = 0, .hi = 1024, .cmds = ENGINE | CHECK | QUANTIZE },
	{ .name = "ctx-size", .arg = "N", .help = "context in tokens; default the model's, capped to the KV reservation",
	  .short_name = 'c', .type = OPT_INT, FIELD(n_ctx),
	  .lo = 1, .hi = 1 << 24, .cmds = GEN | SERVE | PPL | IMATRIX },
	{ .name = "batch-size", .arg = "N", .help = "tokens per step while reading the prompt",
	  .short_name = 'b', .type = OPT_INT, FIELD(n_batch),
	  .lo = 1, .hi = 1 << 16, .cmds = GEN | BENCH },
	{ .name = "no-bos", .help = "do not add the model's BOS token",
	  .type = OPT_BOOL, FIELD(no_bos), .cmds = RUN | TOKENIZE },
	{ .name = "pieces", .help = "print each token id with the text it stands for, escaped",
	  .type = OPT_BOOL, FIELD(pieces), .cmds = TOKENIZE, .flag_only = true },
	{ .name = "archs", .help = "list the architectures and tokenizers loom reads",
	  .type = OPT_BOOL, FIELD(archs), .cmds = INFO },
	{ .name = "no-progress", .help = "no progress bar while loading",
	  .type = OPT_NOT, FIELD(progress), .cmds = GEN },
	{ .name = "exact", .help = "f32 activations with ref.so's arithmetic (bit-identical to ref.so)",
	  .type = OPT_BOOL, FIELD(exact), .cmds = ENGINE },
	{ .name = "kv-type", .arg = "TYPE", .help = "KV cache type: f16, f32, q8_0 or q4_0",
	  .type = OPT_KVTYPE, FIELD(kv_type), .cmds = ENGINE },
	/* llama.cpp's: -ngl picks the backend (gpu_layers), -fa is what loom
	 * always does, -cnv makes run a chat (README.md, "Coming from llama.cpp") */
	{ .name = "n-gpu-layers", .arg = "N", .help = "llama.cpp's -ngl: 0 runs every layer on the CPU (cpu.so); 99, -1 or at least the model's layers run all on a GPU backend; partial offload is refused",
	  .type = OPT_INT, FIELD(n_gpu_layers), .lo = -1, .hi = INT_MAX,
	  .cmds = ENGINE },
	{ .name = "flash-attn", .help = "llama.cpp's -fa: accepted, loom's attention is always flash-style; off is refused",
	  .type = OPT_BOOL, FIELD(flash_attn), .cmds = ENGINE },
	{ .name = "conversation", .help = "llama.cpp's -cnv: loom run becomes loom chat",
	  .type = OPT_BOOL, FIELD(conversation), .cmds = RUN | CHAT,
	  .flag_only = true },
	/* distributed jobs under mpirun (docs/DISTRIBUTED.md) */
	{ .name = "tp", .arg = "N", .help = "tensor-parallel ranks under mpirun (loads the MPI module)",
	  .type = OPT_INT, FIELD(tp), .lo = 1, .hi = 64, .cmds = RUN | BENCH | SERVE },
	{ .name = "pp", .arg = "N", .help = "pipeline stages under mpirun (loads the MPI module)",
	  .type = OPT_INT, FIELD(pp), .lo = 1, .hi = 4096,
	  .cmds = RUN | BENCH | SERVE },
	{ .name = "pp-micro", .arg = "N", .help = "micro-batches a pipelined step splits into",
	  .type = OPT_INT, FIELD(pp_micro), .lo = 1, .hi = 4096,
	  .cmds = SERVE },
	{ .name = "dump-logits", .arg = "FILE", .help = "write the logits after the prompt (f32)",
	  .type = OPT_STR, FIELD(dump_logits), .cmds = RUN },
	{ .name = "dump-tokens", .arg = "FILE", .help = "write the generated token ids",
	  .type = OPT_STR, FIELD(dump_tokens), .cmds = RUN },
	/* constrained decoding (docs/SERVING.md, "Structured output and tools") */
	{ .name = "grammar", .arg = "KIND", .help = "constrain the output: json or json_object",
	  .type = OPT_STR, FIELD(grammar), .cmds = RUN },
	{ .name = "json-schema", .arg = "FILE", .help = "constrain the output to a JSON Schema",
	  .type = OPT_STR, FIELD(json_schema), .cmds = RUN },
	/* chat */
	{ .name = "system-prompt", .arg = "TEXT", .help = "the system prompt",
	  .type = OPT_ARG, FIELD(system_prompt), .cmds = CHAT,
	  .flag_only = true },
	{ .name = "system-prompt-file", .arg = "FILE", .help = "the system prompt, read from FILE",
	  .type = OPT_STR, FIELD(system_prompt_file),
	  .cmds = CHAT },
	{ .name = "chat-template", .arg = "FILE", .help = "a Jinja chat template in place of the model's",
	  .type = OPT_STR, FIELD(chat_template), .cmds = CHAT | SERVE },
	{ .name = "json", .help = "JSON on stdout",
	  .type = OPT_BOOL, FIELD(json), .cmds = BACKENDS | CHECK,
	  .flag_only = true },
	{ .name = "reference", .arg = "NAME|PATH", .help = "the oracle backend (ref.so)",
	  .type = OPT_STR, FIELD(reference), .cmds = CHECK },
	/* perplexity */
	{ .name = "save-logits", .arg = "FILE", .help = "save the run's log-probabilities as a base for --kl-base",
	  .type = OPT_STR, FIELD(save_logits), .cmds = PPL },
	{ .name = "kl-base", .arg = "FILE", .help = "compare with a saved base run (KL divergence)",
	  .type = OPT_STR, FIELD(kl_base), .cmds = PPL },
	{ .name = "prefill-kernels", .help = "score through the backend's prefill GEMM (not batch invariant) rather than decode's kernels",
	  .type = OPT_BOOL, FIELD(prefill_kernels), .cmds = PPL, .flag_only = true },
	{ .name = "chunks", .arg = "N", .help = "chunks of text at most (0: all)",
	  .type = OPT_INT, FIELD(n_chunks), .lo = 0, .hi = INT_MAX,
	  .cmds = PPL | IMATRIX },
	/* imatrix, and quantize --imatrix (docs/QUANTIZATION.md) */
	{ .name = "output", .arg = "FILE", .help = "the imatrix file to write",
	  .short_name = 'o', .type = OPT_STR, FIELD(imatrix_out),
	  .cmds = IMATRIX },
	{ .name = "hessian", .help = "also collect the mean of x x^T per weight (for gptq)",
	  .type = OPT_BOOL, FIELD(hessian), .cmds = IMATRIX },
	{ .name = "show", .arg = "FILE", .help = "print an imatrix file's entries",
	  .type = OPT_STR, FIELD(imatrix_show), .cmds = IMATRIX,
	  .flag_only = true },
	{ .name = "imatrix", .arg = "FILE", .help = "importance data from loom imatrix or llama-imatrix",
	  .type = OPT_STR, FIELD(imatrix), .cmds = QUANTIZE },
	/* sampling */
	{ .name = "temp", .arg = "T", .help = "sampling temperature; 0: greedy",
	  .type = OPT_FLOAT, FIELD(sp.temp), .lo = 0, .hi = 100, .cmds = GEN },
	{ .name = "top-k", .arg = "K", .help = "sample among the K most likely tokens; 0: off",
	  .type = OPT_INT, FIELD(sp.top_k), .lo = 0, .hi = INT_MAX, .cmds = GEN },
	{ .name = "top-p", .arg = "P", .help = "nucleus sampling; 1: off",
	  .type = OPT_FLOAT, FIELD(sp.top_p), .lo = 0, .hi = 1, .cmds = GEN },
	{ .name = "min-p", .arg = "P", .help = "drop tokens below P times the most likely one's probability",
	  .type = OPT_FLOAT, FIELD(sp.min_p), .lo = 0, .hi = 1, .cmds = GEN },
	{ .name = "repeat-penalty", .arg = "R", .help = "penalty on repeated tokens; 1: off",
	  .type = OPT_FLOAT, FIELD(sp.repeat_penalty),
	  .lo = 0, .hi = 100, .cmds = GEN },
	{ .name = "presence-penalty", .arg = "P", .help = "OpenAI-style presence penalty",
	  .type = OPT_FLOAT, FIELD(sp.presence_penalty),
	  .lo = -100, .hi = 100, .cmds = GEN },
	{ .name = "frequency-penalty", .arg = "F", .help = "OpenAI-style frequency penalty",
	  .type = OPT_FLOAT, FIELD(sp.frequency_penalty),
	  .lo = -100, .hi = 100, .cmds = GEN },
	{ .name = "repeat-last-n", .arg = "N", .help = "tokens the penalties look back over",
	  .type = OPT_INT, FIELD(sp.penalty_last_n),
	  .lo = 0, .hi = INT_MAX, .cmds = GEN },
	{ .name = "seed", .arg = "S", .help = "the sampling seed (default: from the clock, printed)",
	  .short_name = 's', .type = OPT_U64, FIELD(sp.seed), .cmds = GEN },
	/* bench: -p and -n count tokens there */
	{ .name = "n-prompt", .arg = "N", .help = "bench: prompt tokens of the pp test",
	  .short_name = 'p', .type = OPT_INT, FIELD(n_prompt),
	  .lo = 1, .hi = 1 << 24, .cmds = BENCH },
	{ .name = "n-gen", .arg = "N", .help = "bench: decode steps of the tg test",
	  .short_name = 'n', .type = OPT_INT, FIELD(n_gen),
	  .lo = 0, .hi = 1 << 24, .cmds = BENCH },
	{ .name = "reps", .arg = "N", .help = "bench: repetitions of each test",
	  .short_name = 'r', .type = OPT_INT, FIELD(reps),
	  .lo = 1, .hi = 1 << 20, .cmds = BENCH },
	{ .name = "n-depth", .arg = "N", .help = "bench: context tokens before the timed decode",
	  .short_name = 'd', .type = OPT_INT, FIELD(n_depth),
	  .lo = 0, .hi = 1 << 24, .cmds = BENCH },
	{ .name = "n-parallel", .arg = "N", .help = "bench: sequences decoding together",
	  .type = OPT_INT, FIELD(n_parallel), .lo = 1, .hi = 256,
	  .cmds = BENCH },
	/* speculative decoding (docs/SPECULATIVE.md) */
	{ .name = "spec", .arg = "NAME|PATH", .help = "speculative decoding strategy: ngram.so, layerskip.so, draft.so or a path",
	  .type = OPT_STR, FIELD(spec), .cmds = GEN | SERVE },
	{ .name = "spec-draft-model", .arg = "FILE", .help = "the draft model of draft.so",
	  .type = OPT_STR, FIELD(spec_draft_model),
	  .cmds = GEN | SERVE },
	{ .name = "spec-max-draft", .arg = "N", .help = "draft tokens per step at most",
	  .type = OPT_INT, FIELD(spec_max_draft),
	  .lo = 1, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-min-draft", .arg = "N", .help = "draft tokens per step at least",
	  .type = OPT_INT, FIELD(spec_min_draft),
	  .lo = 1, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-ngram-min", .arg = "N", .help = "shortest n-gram ngram.so matches",
	  .type = OPT_INT, FIELD(spec_ngram_min),
	  .lo = 1, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-ngram-max", .arg = "N", .help = "longest n-gram ngram.so matches",
	  .type = OPT_INT, FIELD(spec_ngram_max),
	  .lo = 1, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-tree", .arg = "N", .help = "nodes of a token tree per step (ngram.so; 0: chains)",
	  .type = OPT_INT, FIELD(spec_tree),
	  .lo = 0, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-layers", .arg = "N", .help = "early-exit layers of layerskip.so",
	  .type = OPT_INT, FIELD(spec_layers),
	  .lo = 1, .hi = 4096, .cmds = GEN | SERVE },
	/* serve */
	{ .name = "host", .arg = "ADDR", .help = "address to listen on",
	  .type = OPT_STR, FIELD(serve.host), .cmds = SERVE },
	{ .name = "port", .arg = "PORT", .help = "TCP port to listen on",
	  .type = OPT_INT, FIELD(serve.port), .lo = 0, .hi = 65535,
	  .cmds = SERVE },
	{ .name = "kv-mem", .arg = "SIZE", .help = "KV cache reservation (K, M, G suffixes)",
	  .type = OPT_SIZE, FIELD(serve.kv_mem), .cmds = GEN | SERVE },
	{ .name = "parallel", .arg = "N", .help = "sequences served at once",
	  .type = OPT_INT, FIELD(serve.parallel), .lo = 1, .hi = 4096,
	  .cmds = SERVE },
	{ .name = "block-size", .arg = "N", .help = "tokens per KV block",
	  .type = OPT_INT, FIELD(serve.block_size), .lo = 1, .hi = 4096,
	  .cmds = GEN | SERVE },
	{ .name = "max-batch-tokens", .arg = "N", .help = "tokens per scheduler step at most",
	  .type = OPT_INT, FIELD(serve.max_batch_tokens),
	  .lo = 1, .hi = 1 << 20, .cmds = SERVE },
	{ .name = "max-waiting", .arg = "N", .help = "queued requests at most",
	  .type = OPT_INT, FIELD(serve.max_waiting),
	  .lo = 0, .hi = 1 << 20, .cmds = SERVE },
	{ .name = "max-body", .arg = "SIZE", .help = "largest request body",
	  .type = OPT_SIZE, FIELD(serve.max_body), .cmds = SERVE },
	{ .name = "max-queued-bytes", .arg = "SIZE", .help = "request bytes waiting to be parsed, in all, at most (503 parse_queue_full beyond)",
	  .type = OPT_SIZE, FIELD(serve.max_queued), .cmds = SERVE },
	{ .name = "max-queued-bytes-per-client", .arg = "SIZE", .help = "request bytes waiting to be parsed from one client (address, IPv6 /64) at most",
	  .type = OPT_SIZE, FIELD(serve.max_queued_per_client), .cmds = SERVE },
	{ .name = "shutdown-timeout", .arg = "S", .help = "seconds running requests get on shutdown",
	  .type = OPT_INT, FIELD(serve.shutdown_timeout),
	  .lo = 0, .hi = 86400, .cmds = SERVE },
	{ .name = "prefix-cache", .help = "reuse the KV blocks of shared prompt prefixes",
	  .type = OPT_BOOL, FIELD(serve.prefix_cache), .cmds = SERVE },
	{ .name = "no-prefix-cache", .help = "no prefix cache",
	  .type = OPT_NOT, FIELD(serve.prefix_cache), .cmds = SERVE },
	{ .name = "spec-default", .arg = "NAME", .help = "the strategy of requests that name none",
	  .type = OPT_STR, FIELD(serve.spec_default), .cmds = SERVE },
	{ .name = "spec-step-rows", .arg = "N", .help = "decode rows per step before drafting stops (0: no cap)",
	  .type = OPT_INT, FIELD(serve.spec_step_rows),
	  .lo = 0, .hi = 1 << 20, .cmds = SERVE },
	/* quantize (docs/QUANTIZATION.md) */
	{ .name = "strategy", .arg = "NAME|PATH", .help = "quantization strategy: rtn, imatrix, awq, gptq, gptq_awq or a path",
	  .type = OPT_STR, FIELD(qstrategy), .cmds = QUANTIZE },
	{ .name = "allow-requantize", .help = "quantize an already quantized model",
	  .type = OPT_BOOL, FIELD(allow_requantize),
	  .cmds = QUANTIZE },
	{ .name = "dry-run", .help = "print the plan, write nothing",
	  .type = OPT_BOOL, FIELD(dry_run), .cmds = QUANTIZE },
	/* every command that writes a file refuses an existing one without it */
	{ .name = "force", .help = "replace an existing output file",
	  .type = OPT_BOOL, FIELD(force), .cmds = QUANTIZE | IMATRIX | PPL },
	/* serve: connections and access (docs/SERVING.md) */
	{ .name = "http-threads", .arg = "N", .help = "threads serving the sockets",
	  .type = OPT_INT, FIELD(serve.http_threads),
	  .lo = 1, .hi = 256, .cmds = SERVE },
	{ .name = "header-timeout", .arg = "S", .help = "seconds to receive a request's headers",
	  .type = OPT_INT, FIELD(serve.header_timeout),
	  .lo = 1, .hi = 3600, .cmds = SERVE },
	{ .name = "body-timeout", .arg = "S", .help = "seconds to receive a request's body",
	  .type = OPT_INT, FIELD(serve.body_timeout),
	  .lo = 1, .hi = 3600, .cmds = SERVE },
	{ .name = "idle-timeout", .arg = "S", .help = "seconds without progress before a connection closes",
	  .type = OPT_INT, FIELD(serve.idle_timeout),
	  .lo = 1, .hi = 86400, .cmds = SERVE },
	{ .name = "max-conns", .arg = "N", .help = "open connections at most",
	  .type = OPT_INT, FIELD(serve.max_conns),
	  .lo = 1, .hi = 1 << 20, .cmds = SERVE },
	{ .name = "max-conns-per-ip", .arg = "N", .help = "open connections from one address at most",
	  .type = OPT_INT, FIELD(serve.max_conns_per_ip),
	  .lo = 1, .hi = 1 << 20, .cmds = SERVE },
	{ .name = "load-wait", .arg = "S", .help = "seconds a request waits for the model to load",
	  .type = OPT_INT, FIELD(serve.load_wait),
	  .lo = 0, .hi = 3600, .cmds = SERVE },
	{ .name = "half-close", .help = "answer a client that shut its sending side",
	  .type = OPT_BOOL, FIELD(serve.half_close), .cmds = SERVE },
	{ .name = "api-key", .arg = "KEY", .help = "require this bearer key (or LOOM_API_KEY)",
	  .type = OPT_STR, FIELD(serve.api_key), .cmds = SERVE },
	{ .name = "cors-origin", .arg = "ORIGIN", .help = "send CORS headers for ORIGIN or *",
	  .type = OPT_STR, FIELD(serve.cors_origin), .cmds = SERVE },
	{ .name = "alias", .arg = "NAME", .help = "a model name accepted besides the file's (repeatable)",
	  .short_name = 'a', .type = OPT_LIST, FIELD(serve.aliases), .cmds = SERVE },
};

#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

/* llama.cpp's spellings where they mean the same as one of ours: multi-letter
 * single-dash flags getopt cannot read, and other long names. */
static const struct flag_alias {
	const char *from, *to;
} flag_aliases[] = {
	{ "-sys", "--system-prompt" },
	{ "--system", "--system-prompt" },
	{ "-sysf", "--system-prompt-file" },
	{ "--predict", "--n-predict" },
	{ "-np", "--parallel" },
	{ "-npl", "--n-parallel" },
	{ "-md", "--spec-draft-model" },
	{ "--model-draft", "--spec-draft-model" },
	{ "--draft-max", "--spec-max-draft" },
	{ "--draft", "--spec-max-draft" },
	{ "--draft-min", "--spec-min-draft" },
	{ "-jf", "--json-schema" },
	{ "--json-schema-file", "--json-schema" },
	{ "--threads-http", "--http-threads" },
	{ "-ngl", "--n-gpu-layers" },
	{ "--gpu-layers", "--n-gpu-layers" },
	{ "-fa", "--flash-attn" },
	{ "-cnv", "--conversation" },
};

/* llama.cpp's flags that loom refuses, each with the reason. */
static const struct flag_refusal {
	const char *flag, *why;
} flag_refusals[] = {
	{ "-hf", "loom downloads nothing, pass -m FILE" },
	{ "-hfr", "loom downloads nothing, pass -m FILE" },
	{ "--hf-repo", "loom downloads nothing, pass -m FILE" },
	{ "-hff", "loom downloads nothing, pass -m FILE" },
	{ "--hf-file", "loom downloads nothing, pass -m FILE" },
	{ "-mu", "loom downloads nothing, pass -m FILE" },
	{ "--model-url", "loom downloads nothing, pass -m FILE" },
	{ "-no-cnv", "loom run never converses; loom chat always does" },
	{ "--no-conversation", "loom run never converses; loom chat always does" },
};

static const struct cmd_def {
	const char *name;
	enum loom_cmd cmd;
	int max_args; /* operands after the flags */
	const char *usage;
} cmds[] = {
	{ .name = "run", .cmd = RUN, .usage =
	  "run       --model FILE -p PROMPT [-n N] [--backend=cpu.so] [--temp T] [--seed S]\n"
	  "            [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
	  "            [--presence-penalty P] [--frequency-penalty F] [--repeat-last-n N]\n"
	  "            [-t THREADS] [-c CTX] [-b BATCH] [--block-size 16] [-f PROMPT_FILE] [--no-bos]\n"
	  "            [--no-progress] [--dump-logits FILE] [--dump-tokens FILE]\n"
	  "            [--spec=ngram.so|layerskip.so|draft.so|PATH] [--spec-max-draft N]\n"
	  "            [--spec-min-draft N] [--spec-ngram-min N] [--spec-ngram-max N]\n"
	  "            [--spec-draft-model FILE] [--spec-layers N] [--exact] [--config FILE]\n"
	  "            the prompt: -p TEXT, -f FILE, -f - or piped on stdin\n"
	  "            [--grammar json|json_object] [--json-schema FILE]\n"
	  "            [--kv-type f16|f32|q8_0|q4_0] [--kv-mem SIZE]\n"
	  "            -c: default the model's context, capped to what the KV reservation\n"
	  "            holds (--kv-mem; default 1/8 of available memory, 256M..4G);\n"
	  "            --kv-type: default f16, f32 with --exact; -n -1: until the end or a\n"
	  "            full context. llama.cpp's -ngl N (0: cpu.so; all: a GPU backend),\n"
	  "            -fa (always on), -cnv (this is loom chat) are taken; -hf is refused\n" },
	{ .name = "chat", .cmd = CHAT, .usage =
	  "chat      --model FILE [-sys TEXT | -sysf FILE] [-n MAX_REPLY] [--temp T] [-s SEED]\n"
	  "            [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [-t N] [-c CTX]\n"
	  "            [--spec=ngram.so] [--exact] [--kv-type T] [--kv-mem SIZE] [--config FILE]\n"
	  "            [--chat-template FILE.jinja]\n"
	  "            a conversation in the model's chat template; /reset, /exit; Ctrl-C\n"
	  "            stops a reply; turns are read one a line from stdin when it is not a\n"
	  "            terminal; -c and --kv-mem as for run\n" },
	{ .name = "info", .cmd = INFO, .max_args = 1, .usage =
	  "info      FILE | --model FILE [--config FILE] | --archs\n" },
	{ .name = "tokenize", .cmd = TOKENIZE, .max_args = 1, .usage =
	  "tokenize  --model FILE [--no-bos] [--pieces] [--config FILE] [-f FILE | TEXT]\n"
	  "            --pieces: a line a token, its id and its text (escaped)\n" },
	{ .name = "bench", .cmd = BENCH, .usage =
	  "bench     --model FILE [--backend=cpu.so] [-p 128] [-n 64] [-d 0] [-t 1,2] [-r 3]\n"
	  "            [-b 256] [--exact] [--kv-type f16|f32|q8_0|q4_0] [-npl 1] [--config FILE]\n"
	  "            pp: a prefill of -p tokens; tg: -n decode steps after -d tokens\n"
	  "            of context (as llama-bench's -p, -n and -d); with -npl N, N\n"
	  "            sequences decode together and tg is their tokens per second\n" },
	{ .name = "perplexity", .cmd = PPL, .usage =
	  "perplexity --model FILE -f TEXT [-c 512] [--chunks N] [--backend=cpu.so] [-t N]\n"
	  "            [--exact] [--kv-type f16|f32|q8_0|q4_0] [--save-logits FILE | --kl-base FILE]\n"
	  "            [--force] [--prefill-kernels] [--config FILE]\n" },
	{ .name = "serve", .cmd = SERVE, .usage =
	  "serve     --model FILE [--backend=cpu.so] [--host 127.0.0.1] [--port 8080]\n"
	  "            [-t THREADS] [--kv-mem SIZE] [--kv-type f16|f32|q8_0|q4_0] [-c CTX]\n"
	  "            [--parallel 16] [--block-size 16] [--chat-template FILE.jinja]\n"
	  "            [--max-batch-tokens 512] [--max-waiting 64] [--max-body 1M]\n"
	  "            [--shutdown-timeout 10] [--no-prefix-cache] [--exact] [--config FILE]\n"
	  "            [--spec=ngram.so[,other.so...]] [--spec-default NAME] [--spec-max-draft 8]\n"
	  "            [--spec-min-draft 1] [--spec-ngram-min 1] [--spec-ngram-max 4]\n"
	  "            [--spec-layers N] [--spec-draft-model FILE] [--spec-step-rows 8]\n"
	  "            [--api-key KEY] [--cors-origin ORIGIN|*] [--alias NAME]...\n"
	  "            [--http-threads 4] [--max-conns 1024] [--max-conns-per-ip 256]\n"
	  "            [--header-timeout 10] [--body-timeout 30] [--idle-timeout 120]\n"
	  "            [--max-queued-bytes 128M] [--max-queued-bytes-per-client 16M]\n"
	  "            [--half-close] [--load-wait 30] [--tp 1] [--pp 1] [--pp-micro N] (under mpirun)\n"
	  "            --kv-mem: default 1/8 of available memory, 256M..4G; --kv-type: default\n"
	  "            f16, f32 with --exact; -c: default the model's context, capped to --kv-mem\n" },
	{ .name = "backends", .cmd = BACKENDS, .usage =
	  "backends  [--json]   the backend search path, what loads and what is refused\n" },
	{ .name = "check-backend", .cmd = CHECK, .max_args = 1, .usage =
	  "check-backend BACKEND.so [--model FILE [-n 16]] [-t N] [--reference ref.so]\n"
	  "            [--json]   the conformance suite against ref.so (docs/BACKENDS.md)\n" },
	{ .name = "quantize", .cmd = QUANTIZE, .max_args = 3, .usage =
	  "quantize  IN.gguf OUT.gguf TYPE [--strategy rtn|imatrix|awq|gptq|gptq_awq|PATH] [-t N]\n"
	  "            [--imatrix FILE] [--allow-requantize] [--dry-run] [--force] [--config FILE]\n"
	  "            TYPE: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_K..q6_K, or a llama.cpp\n"
	  "            mix: Q4_K_M Q4_K_S Q5_K_M Q5_K_S Q3_K_M Q3_K_S Q3_K_L Q2_K Q6_K Q8_0 Q4_0...\n" },
	{ .name = "imatrix", .cmd = IMATRIX, .usage =
	  "imatrix   --model FILE -f CALIB.txt -o FILE [-c 512] [--chunks N] [--hessian] [--force]\n"
	  "            [--backend=cpu.so] [-t N] [--exact] [--config FILE]\n"
	  "            | --show FILE   calibration statistics for quantize --imatrix\n" },
};

#define N_CMDS (sizeof(cmds) / sizeof(cmds[0]))

void loom_options_usage(FILE *out, enum loom_cmd cmd)
{
	size_t i;

	if (!cmd)
		fputs("usage: loom COMMAND [options]\ncommands:\n", out);
	for (i = 0; i < N_CMDS; i++) {
		if (!cmd)
			fprintf(out, "  %s", cmds[i].usage);
		else if (cmds[i].cmd == cmd)
			fprintf(out, "usage: loom %s", cmds[i].usage);
	}
	if (!cmd) /* commands that parse their own arguments */
		fputs("  template  [--now UNIX_SECONDS] FILE.jinja [CONTEXT.json]   a chat template\n"
		      "            rendered with a JSON context (stdin), as transformers renders it\n"
		      "  version\n"
		      "  --help-man, --completion bash   the manual page, the bash completion\n", out);
	fputs("Each --flag VALUE is also a config-file key, flag_name = VALUE (at top level,\n"
	      "in [loom], or for serve in [serve]); flags override the config file.\n", out);
}

void loom_options_defaults(struct loom_options *o)
{
	memset(o, 0, sizeof(*o));
	snprintf(o->backend, sizeof(o->backend), "cpu.so");
	snprintf(o->reference, sizeof(o->reference), "ref.so");
	o->n_predict = 128;
	o->n_threads = 0;
	o->n_ctx = 0; /* the model's context, capped to what the KV cache holds */
	o->kv_type = LOOM_KV_DEFAULT;
	o->n_batch = 256;
	o->progress = true;
	loom_sampler_defaults(&o->sp);
	o->n_prompt = 128;
	o->n_gen = 64;
	o->reps = 3;
	o->n_parallel = 1;
	o->serve = (struct loom_serve_options){
		.host = "127.0.0.1",
		.port = 8080,
		.parallel = 16,
		.block_size = 16,
		.max_batch_tokens = 512,
		.max_waiting = 64,
		.max_body = 1 << 20,
		.max_queued = 128ull << 20, /* serve_parse.h */
		.max_queued_per_client = 16ull << 20,
		.shutdown_timeout = 10,
		.prefix_cache = true,
		.spec_step_rows = LOOM_SPEC_STEP_ROWS,
		.http_threads = 4,
		.header_timeout = 10,
		.body_timeout = 30,
		.idle_timeout = 120,
		.max_conns = 1024,
		.max_conns_per_ip = 256,
		.load_wait = 30,
	};
}

/* ---- values ---- */

static int parse_int(const char *key, const char *v, long lo, long hi,
		     int *out, char *err, size_t errlen)
{
	char *end;
	long x;

	errno = 0;
	x = strtol(v, &end, 10);
	if (errno || end == v || *end || x < lo || x > hi) {
		snprintf(err, errlen, "%s: '%s' is not an integer in [%ld, %ld]", key, v, lo, hi);
		return -1;
	}
	*out = (int)x;
	return 0;
}

static int parse_float(const char *key, const char *v, float lo, float hi,
		       float *out, char *err, size_t errlen)
{
	char *end;
	float x;

	errno = 0;
	x = strtof(v, &end);
	if (errno || end == v || *end || !(x >= lo && x <= hi)) {
		snprintf(err, errlen, "%s: '%s' is not a number in [%g, %g]", key, v, lo, hi);
		return -1;
	}
	*out = x;
	return 0;
}

static int parse_u64(const char *key, const char *v, uint64_t *out, char *err,
		     size_t errlen)
{
	char *end;
	unsigned long long x;

	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-') {
		snprintf(err, errlen, "%s: '%s' is not a non-negative integer", key, v);
		return -1;
	}
	*out = x;
	return 0;
}

/* Bytes with an optional binary suffix: 512M, 2G, 64KiB, 1048576. */
static int parse_size(const char *key, const char *v, uint64_t *out, char *err,
		      size_t errlen)
{
	static const char units[] = "KMGT";
	unsigned long long x;
	const char *u;
	char *end;
	int shift = 0;

	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || end == v || v[0] == '-')
		goto bad;
	/* a NUL from the case fold (a space) must not match the terminator */
	if (*end && (*end & ~0x20) && (u = strchr(units, *end & ~0x20))) {
		shift = 10 * (int)(u - units + 1);
		end++;
		if (!strcasecmp(end, "iB") || !strcasecmp(end, "B"))
			end += strlen(end);
	} else if (!strcasecmp(end, "B")) {
		end++;
	}
	if (*end || (shift && x > (ULLONG_MAX >> shift)))
		goto bad;
	*out = (uint64_t)x << shift;
	return 0;
bad:
	snprintf(err, errlen, "%s: '%s' is not a size (bytes, or a number with K, M, G or T)", key, v);
	return -1;
}

static int parse_bool(const char *key, const char *v, bool *out, char *err, size_t errlen)
{
	if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
		*out = true;
	else if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))
		*out = false;
	else {
		snprintf(err, errlen, "%s: '%s' is not true or false", key, v);
		return -1;
	}
	return 0;
}

static int copy_str(const char *key, const char *v, char *dst, size_t cap,
		    char *err, size_t errlen)
{
	if (strlen(v) >= cap) {
		snprintf(err, errlen, "%s: value too long", key);
		return -1;
	}
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

/* -t/threads: a thread count; bench also takes a list (1,2,4) to sweep. */
static int set_threads(struct loom_options *o, const char *key, const char *v,
		       char *err, size_t errlen)
{
	bool list = strchr(v, ',') && (o->cmd == BENCH || !o->cmd);

	if (!list && parse_int(key, v, 0, 1024, &o->n_threads, err, errlen))
		return -1;
	return copy_str(key, v, o->threads_list, sizeof(o->threads_list), err, errlen);
}

/* A repeatable option: v joins what earlier uses gave, comma-separated. */
static int append_list(const char *key, const char *v, char *dst, size_t cap,
		       char *err, size_t errlen)
{
	size_t have = strlen(dst), need = have + (have ? 1 : 0) + strlen(v);

	if (!v[0]) {
		snprintf(err, errlen, "%s: empty value", key);
		return -1;
	}
	if (need >= cap) {
		snprintf(err, errlen, "%s: values too long (%zu bytes in all at most)", key, cap - 1);
		return -1;
	}
	if (have)
		dst[have++] = ',';
	memcpy(dst + have, v, strlen(v) + 1);
	return 0;
}

/* Parses v into d's field of o. */
static int opt_apply(struct loom_options *o, const struct opt_def *d, const char *key,
		     const char *v, char *err, size_t errlen)
{
	void *dst = (char *)o + d->off;
	bool b;

	switch (d->type) {
	case OPT_STR: return copy_str(key, v, dst, d->size, err, errlen);
	case OPT_ARG: *(const char **)dst = v; return 0;
	case OPT_INT: return parse_int(key, v, (long)d->lo, (long)d->hi, dst, err, errlen);
	case OPT_FLOAT: return parse_float(key, v, (float)d->lo, (float)d->hi, dst, err, errlen);
	case OPT_U64: return parse_u64(key, v, dst, err, errlen);
	case OPT_SIZE: return parse_size(key, v, dst, err, errlen);
	case OPT_BOOL: return parse_bool(key, v, dst, err, errlen);
	case OPT_NOT:
		if (parse_bool(key, v, &b, err, errlen))
			return -1;
		*(bool *)dst = !b;
		return 0;
	case OPT_THREADS: return set_threads(o, key, v, err, errlen);
	case OPT_LIST: return append_list(key, v, dst, d->size, err, errlen);
	case OPT_KVTYPE:
		if (!loom_kv_type_parse(v, dst))
			return 0;
		snprintf(err, errlen, "%s: '%s' is not a KV cache type (f32, f16, q8_0, q4_0)", key, v);
		return -1;
	}
	return -1;
}

/* Does the config key name this option ("ctx_size" for --ctx-size)? */
static bool key_is(const struct opt_def *d, const char *key)
{
	const char *n = d->name;

	for (; *n && *key; n++, key++)
		if (*key != (*n == '-' ? '_' : *n))
			return false;
	return !*n && !*key && !d->flag_only;
}

static const struct opt_def *find_key(const char *key)
{
	size_t i;

	for (i = 0; i < N_OPTS; i++)
		if (key_is(&opts[i], key))
			return &opts[i];
	return NULL;
}

/* Checks an option this subcommand does not take, leaving o as it is. */
static int opt_check(const struct opt_def *d, const char *key, const char *v,
		     char *err, size_t errlen)
{
	struct loom_options *scratch = malloc(sizeof(*scratch));
	int rc;

	if (!scratch) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	loom_options_defaults(scratch);
	rc = opt_apply(scratch, d, key, v, err, errlen);
	free(scratch);
	return rc;
}

/* The options whose absence means something: noted when given. */
static void mark_given(struct loom_options *o, const struct opt_def *d)
{
	if (d->off == offsetof(struct loom_options, n_ctx))
		o->ctx_given = true;
	else if (d->off == offsetof(struct loom_options, sp.seed))
		o->seed_given = true;
	else if (d->off == offsetof(struct loom_options, backend))
		o->backend_given = true;
	else if (d->off == offsetof(struct loom_options, n_gpu_layers))
		o->ngl_given = true;
	else if (d->off == offsetof(struct loom_options, flash_attn))
		o->flash_attn_given = true;
}

int loom_options_set(struct loom_options *o, const char *key, const char *v,
		     char *err, size_t errlen)
{
	const struct opt_def *d = find_key(key);

	if (!d) {
		snprintf(err, errlen, "unknown key '%s'", key);
		return -1;
	}
	if (o->cmd && !(d->cmds & o->cmd))
		return opt_check(d, key, v, err, errlen);
	mark_given(o, d);
	return opt_apply(o, d, key, v, err, errlen);
}

/* ---- the config file ---- */

struct ini_state {
	struct loom_options *o;
	char why[512];
	bool failed;
};

/* Debian's inih passes no line number to the handler; ini_parse returns
 * the line of the first handler failure instead, so the message is kept
 * here and the line added afterwards. */
static int on_ini_entry(void *user, const char *section, const char *key,
			const char *value)
{
	struct ini_state *st = user;
	const struct opt_def *d;
	int rc;

	if (st->failed)
		return 0;
	if (section[0] && strcmp(section, "loom") && strcmp(section, "serve")) {
		snprintf(st->why, sizeof(st->why), "key '%s' in unknown section [%s]",
			 key, section);
		st->failed = true;
		return 0;
	}
	/* [serve] holds the server's settings: another subcommand only checks them */
	if (!strcmp(section, "serve") && st->o->cmd && st->o->cmd != SERVE &&
	    (d = find_key(key)))
		rc = opt_check(d, key, value, st->why, sizeof(st->why));
	else
		rc = loom_options_set(st->o, key, value, st->why, sizeof(st->why));
	st->failed = rc != 0;
	return !st->failed;
}

int loom_options_load_ini(struct loom_options *o, const char *path, char *err,
			  size_t errlen)
{
	struct ini_state st = { .o = o };
	int rc = ini_parse(path, on_ini_entry, &st);

	if (rc == -1) {
		snprintf(err, errlen, "%s: cannot open config file: %s", path, strerror(errno));
		return -1;
	}
	if (st.failed) {
		snprintf(err, errlen, "%s:%d: %s", path, rc, st.why);
		return -1;
	}
	if (rc) {
		snprintf(err, errlen, "%s:%d: syntax error", path, rc);
		return -1;
	}
	return 0;
}

/* ---- the command line ---- */

enum { VAL_HELP = 'h', VAL_CONFIG = 1, VAL_FIRST_OPT = 256 };

struct cmdline {
	struct option longs[N_OPTS + 3];
	char shorts[2 * N_OPTS + 4];
};

/* The getopt tables: every option of every subcommand, so one that the
 * subcommand does not take is named in a refusal, not called unknown. */
static void cmdline_init(struct cmdline *cl)
{
	size_t i, k = 0;

	cl->shorts[k++] = ':'; /* a missing argument returns ':' */
	cl->shorts[k++] = 'h';
	for (i = 0; i < N_OPTS; i++) {
		bool flag = opts[i].type == OPT_BOOL || opts[i].type == OPT_NOT;

		cl->longs[i] = (struct option){
			.name = opts[i].name,
			.has_arg = flag ? optional_argument : required_argument,
			.val = VAL_FIRST_OPT + (int)i,
		};
		if (opts[i].short_name && !memchr(cl->shorts, opts[i].short_name, k)) {
			cl->shorts[k++] = opts[i].short_name;
			cl->shorts[k++] = ':';
		}
	}
	cl->shorts[k] = '\0';
	cl->longs[N_OPTS] = (struct option){ .name = "config", .has_arg = required_argument,
					     .val = VAL_CONFIG };
	cl->longs[N_OPTS + 1] = (struct option){ .name = "help", .val = VAL_HELP };
	cl->longs[N_OPTS + 2] = (struct option){ 0 };
}

/* The option getopt returned: -p is --prompt for run, --n-prompt for bench. */
static const struct opt_def *find_flag(int c, enum loom_cmd cmd)
{
	const struct opt_def *any = NULL;
	size_t i;

	if (c >= VAL_FIRST_OPT)
		return &opts[c - VAL_FIRST_OPT];
	for (i = 0; i < N_OPTS; i++) {
		if (opts[i].short_name != c)
			continue;
		if (opts[i].cmds & cmd)
			return &opts[i];
		if (!any)
			any = &opts[i];
	}
	return any;
}

static const struct cmd_def *find_cmd(const char *name)
{
	size_t i;

	for (i = 0; i < N_CMDS; i++)
		if (!strcmp(cmds[i].name, name))
			return &cmds[i];
	return NULL;
}

/* One flag of the second pass. */
static int on_flag(struct loom_options *o, const struct cmd_def *cd, int c,
		   const char *arg, char *err, size_t errlen)
{
	const struct opt_def *d = find_flag(c, cd->cmd);
	char flag[64];

	if (!(d->cmds & cd->cmd)) {
		if (c < VAL_FIRST_OPT)
			snprintf(err, errlen, "-%c is not an option of 'loom %s' (see loom %s --help)", c, cd->name, cd->name);
		else
			snprintf(err, errlen, "--%s is not an option of 'loom %s' (see loom %s --help)", d->name, cd->name, cd->name);
		return -1;
	}
	if (!arg && (d->type == OPT_BOOL || d->type == OPT_NOT))
		arg = "true";
	/* messages name the flag as it was typed */
	if (c < VAL_FIRST_OPT)
		snprintf(flag, sizeof(flag), "-%c", c);
	else
		snprintf(flag, sizeof(flag), "--%s", d->name);
	mark_given(o, d);
	return opt_apply(o, d, flag, arg, err, errlen);
}

/* One line for a flag getopt refused: unknown, ambiguous or missing its
 * value. av is the argv getopt saw. */
static void bad_flag(const struct cmd_def *cd, int c, char **av, char *err, size_t errlen)
{
	char flag[64];
	const char *el = optind > 0 ? av[optind - 1] : "";
	size_t n = strcspn(el, "=");

	if (c == '?' && optopt > 0 && optopt < 128)
		snprintf(flag, sizeof(flag), "-%c", optopt);
	else
		snprintf(flag, sizeof(flag), "%.*s", (int)(n < 60 ? n : 60), el);
	if (c == ':')
		snprintf(err, errlen, "option '%s' needs a value (see loom %s --help)", flag, cd->name);
	else
		snprintf(err, errlen, "unknown or ambiguous option '%s' (see loom %s --help)", flag, cd->name);
}

/* ---- llama.cpp's spellings, read before getopt ---- */

static const char *alias_of(const char *a)
{
	for (size_t k = 0; k < sizeof(flag_aliases) / sizeof(flag_aliases[0]); k++)
		if (!strcmp(a, flag_aliases[k].from))
			return flag_aliases[k].to;
	return a;
}

static const char *refusal_of(const char *a)
{
	for (size_t k = 0; k < sizeof(flag_refusals) / sizeof(flag_refusals[0]); k++)
		if (!strcmp(a, flag_refusals[k].flag))
			return flag_refusals[k].why;
	return NULL;
}

static bool is_short(char c)
{
	for (size_t i = 0; i < N_OPTS; i++)
		if (opts[i].short_name == c)
			return true;
	return false;
}

/* Is the next element of argv this one's value ("-p -fa" is a prompt)? */
static bool takes_value(const char *a)
{
	if (a[0] != '-' || !a[1])
		return false;
	if (a[1] != '-') /* -n 5; -n5 carries its value */
		return !a[2] && is_short(a[1]);
	if (strchr(a, '='))
		return false;
	if (!strcmp(a + 2, "config"))
		return true;
	for (size_t i = 0; i < N_OPTS; i++)
		if (!strcmp(opts[i].name, a + 2))
			return opts[i].type != OPT_BOOL && opts[i].type != OPT_NOT;
	return false;
}

/* A word after one dash with more than one letter: -ngl, never -n gl.
 * Only a short option with a number attached (-n128, -c2048) is getopt's. */
static bool several_letters(const char *a)
{
	char *end;

	if (a[0] != '-' || a[1] == '-' || !a[1] || !a[2])
		return false;
	if (is_short(a[1])) {
		strtod(a + 2, &end);
		if (end != a + 2 && !*end)
			return false;
	}
	return true;
}

/* The index of the next flag of argv after i, skipping values, or argc. */
static int next_flag(int argc, char **argv, int i)
{
	if (i < argc && takes_value(alias_of(argv[i])))
		i++;
	for (i++; i < argc; i++)
		if (!strcmp(argv[i], "--")) /* operands only after it */
			return argc;
		else if (argv[i][0] == '-' && argv[i][1])
			return i;
	return argc;
}

bool loom_options_wants_chat(int argc, char **argv, int first)
{
	for (int i = next_flag(argc, argv, first); i < argc; i = next_flag(argc, argv, i))
		if (!strcmp(alias_of(argv[i]), "--conversation"))
			return true;
	return false;
}

void loom_options_run_to_chat(int argc, char **argv, int first)
{
	for (int i = next_flag(argc, argv, first); i < argc; i = next_flag(argc, argv, i))
		if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt"))
			argv[i] = "--system-prompt";
		else if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file"))
			argv[i] = "--system-prompt-file";
}

const char *loom_options_refused_flag(int argc, char **argv, int first)
{
	static char line[256];

	for (int i = next_flag(argc, argv, first); i < argc; i = next_flag(argc, argv, i)) {
		const char *why = refusal_of(argv[i]);

		if (why) {
			snprintf(line, sizeof(line), "%s: %s", argv[i], why);
			return line;
		}
	}
	return NULL;
}

/* -fa on|off|auto (llama.cpp's newer form): joined to one element. */
static void join_flash_attn(int *argc, char **argv, int i)
{
	static const char *const joined[][2] = {
		{ "on", "--flash-attn=on" }, { "auto", "--flash-attn=on" }, { "off", "--flash-attn=off" },
	};

	if (i + 1 >= *argc)
		return;
	for (size_t k = 0; k < 3; k++) {
		if (strcmp(argv[i + 1], joined[k][0]))
			continue;
		argv[i] = (char *)joined[k][1];
		memmove(argv + i + 1, argv + i + 2, sizeof(char *) * (size_t)(*argc - i - 2));
		(*argc)--;
		return;
	}
}

/* Before getopt: llama.cpp's spellings (flag_aliases) rewritten to ours in
 * place, its refused flags named with the reason, and any other word of
 * several letters after one dash refused whole, so -ngl is never -n gl.
 * *argc shrinks when -fa's value is joined to it. */
static int read_llama_flags(const struct cmd_def *cd, int *argc, char **argv, char *err,
			    size_t errlen)
{
	for (int i = next_flag(*argc, argv, 1); i < *argc; i = next_flag(*argc, argv, i)) {
		const char *why = refusal_of(argv[i]);

		if (why) {
			snprintf(err, errlen, "%s: %s", argv[i], why);
			return -1;
		}
		argv[i] = (char *)alias_of(argv[i]);
		if (!strcmp(argv[i], "--flash-attn"))
			join_flash_attn(argc, argv, i);
		if (several_letters(argv[i])) {
			snprintf(err, errlen, "unknown option '%.60s': a word after one dash is one option, never single letters bundled (see loom %s --help)", argv[i], cd->name);
			return -1;
		}
	}
	return 0;
}

/* A backend that runs on the host: ref.so and cpu.so, by name or path. */
static bool host_backend(const char *b)
{
	const char *base = strrchr(b, '/') ? strrchr(b, '/') + 1 : b;

	return !strcmp(base, "cpu.so") || !strcmp(base, "ref.so") || !strcmp(base, "cpu") ||
	       !strcmp(base, "ref");
}

struct gpu_pick {
	char name[64];
	char why[512];
};

/* The first cuda or rocm backend that loads and finds a device. */
static void on_listed(void *user, const struct loom_backend_listing *l)
{
	struct gpu_pick *g = user;
	const char *base = strrchr(l->path, '/') ? strrchr(l->path, '/') + 1 : l->path;
	size_t n = strlen(g->why);

	if (g->name[0] || l->shadowed_by || (strcmp(base, "cuda.so") && strcmp(base, "rocm.so")))
		return;
	if (!l->refused && !l->create_error) {
		snprintf(g->name, sizeof(g->name), "%s", base);
		return;
	}
	snprintf(g->why + n, sizeof(g->why) - n, "%s%s: %.200s", n ? "; " : "", base,
		 l->refused ? l->refused : l->create_error);
}

/*
 * -ngl N. loom runs every layer on its one backend, so -ngl says which:
 * 0 the host (cpu.so); N > 0 or -1 a GPU backend, --backend's or else the
 * first cuda.so or rocm.so that finds a device. All layers or none: a
 * count below the model's layers is refused when the model is read
 * (loom_engine_params.n_gpu_layers); 99 means all, as in llama.cpp's
 * idiom, whatever the model's depth.
 */
static int gpu_layers(struct loom_options *o, char *err, size_t errlen)
{
	struct gpu_pick g = { 0 };
	char why[64];

	if (!o->ngl_given)
		return 0;
	if (o->n_gpu_layers == 0) {
		if (o->backend_given && !host_backend(o->backend)) {
			snprintf(err, errlen, "-ngl 0 keeps every layer on the CPU, but --backend %s runs them all on its device (loom has no partial offload): use --backend cpu.so or drop -ngl", o->backend);
			return -1;
		}
		if (!o->backend_given)
			snprintf(o->backend, sizeof(o->backend), "cpu.so");
		return 0;
	}
	if (o->backend_given) {
		if (!host_backend(o->backend))
			return 0;
		snprintf(err, errlen, "-ngl %d puts layers on a GPU, but %s runs on the CPU: name a GPU backend (--backend cuda.so or rocm.so) or drop -ngl", o->n_gpu_layers, o->backend);
		return -1;
	}
	if (loom_backends_list(on_listed, &g, why, sizeof(why)) == 0 && g.name[0]) {
		snprintf(o->backend, sizeof(o->backend), "%s", g.name);
		return 0;
	}
	snprintf(err, errlen, "-ngl %d puts layers on a GPU, but no GPU backend loads here (%s); loom runs every layer on the CPU with cpu.so: drop -ngl", o->n_gpu_layers, g.why[0] ? g.why : "no cuda.so or rocm.so installed");
	return -1;
}

/* After the flags: what llama.cpp's spellings asked for. */
static int finish_llama_flags(struct loom_options *o, char *err, size_t errlen)
{
	if (o->flash_attn_given && !o->flash_attn) {
		snprintf(err, errlen, "--flash-attn off: loom's attention is always flash-style (tiled, one pass with a running softmax); there is no other kind to choose");
		return -1;
	}
	return gpu_layers(o, err, errlen);
}

const char *loom_options_commands(void)
{
	static char names[256];
	size_t i, n = 0;

	if (names[0])
		return names;
	for (i = 0; i < N_CMDS; i++)
		n += (size_t)snprintf(names + n, sizeof(names) - n, "%s, ", cmds[i].name);
	snprintf(names + n, sizeof(names) - n, "template, version, help");
	return names;
}

/* Runs getopt over argv[2..]: pass 0 reads the config files, pass 1 the
 * other flags, so flags override the config whatever their order. */
static int scan(struct loom_options *o, const struct cmd_def *cd, int argc, char **argv,
		int pass, char *err, size_t errlen)
{
	struct cmdline cl;
	int c;

	cmdline_init(&cl);
	optind = 0; /* a fresh scan; argv[1], the subcommand, stands as argv[0] */
	opterr = 0;
	while ((c = getopt_long(argc - 1, argv + 1, cl.shorts, cl.longs, NULL)) != -1) {
		if (c == '?' || c == ':') {
			if (pass == 0)
				continue;
			bad_flag(cd, c, argv + 1, err, errlen);
			return -1;
		}
		if (c == VAL_CONFIG) {
			if (pass == 0 && loom_options_load_ini(o, optarg, err, errlen))
				return -1;
		} else if (pass == 1 && c == VAL_HELP) {
			loom_options_usage(stdout, cd->cmd);
			return 1;
		} else if (pass == 1 && on_flag(o, cd, c, optarg, err, errlen)) {
			return -1;
		}
	}
	return 0;
}

int loom_options_parse(struct loom_options *o, int argc, char **argv, char *err,
		       size_t errlen)
{
	const struct cmd_def *cd = argc > 1 ? find_cmd(argv[1]) : NULL;
	int rc;

	if (!cd) {
		snprintf(err, errlen, "unknown command '%s' (commands: %s)", argc > 1 ? argv[1] : "",
			 loom_options_commands());
		return -1;
	}
	o->cmd = cd->cmd;
	if (read_llama_flags(cd, &argc, argv, err, errlen))
		return -1;
	rc = scan(o, cd, argc, argv, 0, err, errlen);
	if (!rc)
		rc = scan(o, cd, argc, argv, 1, err, errlen);
	if (!rc && finish_llama_flags(o, err, errlen))
		rc = -1;
	if (rc)
		return rc;
	o->args = argv + 1 + optind;
	o->n_args = argc - 1 - optind;
	if (o->n_args > cd->max_args) {
		snprintf(err, errlen, "unexpected argument '%s'", o->args[cd->max_args]);
		return -1;
	}
	return 0;
}

void loom_options_engine_params(const struct loom_options *o, struct loom_engine_params *p)
{
	loom_engine_params_init(p);
	p->model = o->model;
	p->backend = o->backend;
	p->n_threads = o->n_threads;
	p->spec = o->spec[0] ? o->spec : NULL;
	p->spec_min_draft = o->spec_min_draft;
	p->spec_max_draft = o->spec_max_draft;
	p->spec_ngram_min = o->spec_ngram_min;
	p->spec_ngram_max = o->spec_ngram_max;
	p->spec_draft_model = o->spec_draft_model[0] ? o->spec_draft_model : NULL;
	p->spec_layers = o->spec_layers;
	p->spec_tree = o->spec_tree;
	p->exact = o->exact;
	p->kv_type = o->kv_type;
	p->tp = o->tp;
	p->pp = o->pp;
	p->pp_micro = o->pp_micro;
	/* -ngl: all layers or a count the core checks against the model's */
	p->n_gpu_layers = o->ngl_given && o->n_gpu_layers > 0 && o->n_gpu_layers != 99 ?
			  o->n_gpu_layers : -1;
}

/* ---- the manual page and shell completion, made from the tables ---- */

/* Text for roff: backslashes doubled, '-' as \-, no line starting with a
 * control character. */
static void roff(FILE *out, const char *s)
{
	if (*s == '.' || *s == '\'')
		fputs("\\&", out);
	for (; *s; s++) {
		if (*s == '\\')
			fputs("\\\\", out);
		else if (*s == '-')
			fputs("\\-", out);
		else
			fputc(*s, out);
		if (*s == '\n' && (s[1] == '.' || s[1] == '\''))
			fputs("\\&", out);
	}
}

/* The subcommands an option applies to, comma-separated. */
static void roff_cmds(FILE *out, unsigned bits)
{
	bool first = true;

	for (size_t i = 0; i < N_CMDS; i++) {
		if (!(bits & cmds[i].cmd))
			continue;
		fprintf(out, "%s\\fB%s\\fR", first ? "" : ", ", cmds[i].name);
		first = false;
	}
}

static void man_option(FILE *out, const struct opt_def *d)
{
	fputs(".TP\n", out);
	if (d->short_name)
		fprintf(out, "\\fB\\-%c\\fR, ", d->short_name);
	fputs("\\fB\\-\\-", out);
	roff(out, d->name);
	fputs("\\fR", out);
	if (d->arg) {
		fputs(" \\fI", out);
		roff(out, d->arg);
		fputs("\\fR", out);
	}
	fputs("\n", out);
	roff(out, d->help ? d->help : "");
	fputs(".\nCommands: ", out);
	roff_cmds(out, d->cmds);
	if (!d->flag_only) {
		fputs(". Config key: \\fB", out);
		for (const char *n = d->name; *n; n++)
			fputc(*n == '-' ? '_' : *n, out);
		fputs("\\fR", out);
	}
	fputs(".\n", out);
}

void loom_options_man(FILE *out, const char *version)
{
	fprintf(out, ".\\\" made by loom --help-man from tools/options.c; do not edit\n"
		".TH LOOM 1 \"\" \"loom %s\" \"User Commands\"\n.SH NAME\n"
		"loom \\- run, chat with, serve, quantize and check GGUF language models\n"
		".SH SYNOPSIS\n.B loom\n.I COMMAND\n[\\fIoptions\\fR] [\\fIoperands\\fR]\n"
		".SH COMMANDS\n", version);
	for (size_t i = 0; i < N_CMDS; i++) {
		fprintf(out, ".TP\n.B %s\n.nf\n", cmds[i].name);
		roff(out, cmds[i].usage + strlen(cmds[i].name));
		fputs(".fi\n", out);
	}
	fputs(".TP\n.B template\n[\\-\\-now \\fIUNIX_SECONDS\\fR] \\fIFILE.jinja\\fR [\\fICONTEXT.json\\fR]:"
	      " a chat template rendered with a JSON context (stdin without one).\n"
	      ".TP\n.B version\nthe version.\n.SH OPTIONS\n"
	      "Every option with a config key may also be set in the file of \\fB\\-\\-config\\fR "
	      "\\fIFILE\\fR (INI: at top level, in [loom], or for serve in [serve]); flags override it. "
	      "A word after one dash is one option, never letters bundled.\n", out);
	for (size_t i = 0; i < N_OPTS; i++)
		man_option(out, &opts[i]);
	fputs(".TP\n\\fB\\-\\-config\\fR \\fIFILE\\fR\nread options from an INI file first. Commands: all.\n"
	      ".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nthe command's usage.\n"
	      ".SH LLAMA.CPP SPELLINGS\nAccepted with loom's meaning:\n.RS\n.nf\n", out);
	for (size_t k = 0; k < sizeof(flag_aliases) / sizeof(flag_aliases[0]); k++) {
		roff(out, flag_aliases[k].from);
		fputs("  ", out);
		roff(out, flag_aliases[k].to);
		fputs("\n", out);
	}
	fputs(".fi\n.RE\nRefused, with the reason:\n.RS\n.nf\n", out);
	for (size_t k = 0; k < sizeof(flag_refusals) / sizeof(flag_refusals[0]); k++) {
		roff(out, flag_refusals[k].flag);
		fputs("  ", out);
		roff(out, flag_refusals[k].why);
		fputs("\n", out);
	}
	fputs(".fi\n.RE\n.SH ENVIRONMENT\n"
	      ".TP\n.B LOOM_BACKEND_PATH, LOOM_QUANT_PATH, LOOM_SPEC_PATH, LOOM_QSTRATEGY_PATH, LOOM_DIST_PATH\n"
	      "colon-separated folders searched first for plugins of each kind.\n"
	      ".TP\n.B LOOM_API_KEY\nthe key loom serve requires, as \\fB\\-\\-api\\-key\\fR.\n"
	      ".SH SEE ALSO\nREADME.md and docs/ in the source: SERVING.md, QUANTIZATION.md, "
	      "BACKENDS.md, DISTRIBUTED.md.\n", out);
}

/* The completion words of one subcommand: its flags, long and short, and
 * llama.cpp's spellings of them. */
static void completion_words(FILE *out, enum loom_cmd cmd)
{
	for (size_t i = 0; i < N_OPTS; i++) {
		if (!(opts[i].cmds & cmd))
			continue;
		fprintf(out, " --%s", opts[i].name);
		if (opts[i].short_name)
			fprintf(out, " -%c", opts[i].short_name);
		for (size_t k = 0; k < sizeof(flag_aliases) / sizeof(flag_aliases[0]); k++)
			if (!strcmp(flag_aliases[k].to + 2, opts[i].name))
				fprintf(out, " %s", flag_aliases[k].from);
	}
	fputs(" --config --help", out);
}

void loom_options_completion(FILE *out)
{
	fputs("# bash completion for loom, made by `loom --completion bash` from\n"
	      "# tools/options.c; do not edit.\n_loom()\n{\n"
	      "\tlocal cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} words\n"
	      "\tif [ \"$COMP_CWORD\" -eq 1 ]; then\n\t\twords=\"", out);
	for (size_t i = 0; i < N_CMDS; i++)
		fprintf(out, "%s ", cmds[i].name);
	fputs("template version help\"\n"
	      "\t\tCOMPREPLY=( $(compgen -W \"$words\" -- \"$cur\") )\n\t\treturn\n\tfi\n"
	      "\tcase \"$prev\" in\n\t--config", out);
	for (size_t i = 0; i < N_OPTS; i++) {
		if (!opts[i].arg || (!strstr(opts[i].arg, "FILE") && !strstr(opts[i].arg, "PATH")))
			continue;
		fprintf(out, "|--%s", opts[i].name);
		if (opts[i].short_name && opts[i].type == OPT_STR)
			fprintf(out, "|-%c", opts[i].short_name);
	}
	fputs(")\n\t\tCOMPREPLY=( $(compgen -f -- \"$cur\") )\n\t\treturn;;\n\tesac\n"
	      "\tcase \"${COMP_WORDS[1]}\" in\n", out);
	for (size_t i = 0; i < N_CMDS; i++) {
		fprintf(out, "\t%s) words=\"", cmds[i].name);
		completion_words(out, cmds[i].cmd);
		fputs("\";;\n", out);
	}
	fputs("\ttemplate) words=\"--now --help\";;\n\t*) words=\"\";;\n\tesac\n"
	      "\tif [[ \"$cur\" == -* ]]; then\n"
	      "\t\tCOMPREPLY=( $(compgen -W \"$words\" -- \"$cur\") )\n\telse\n"
	      "\t\tCOMPREPLY=( $(compgen -f -- \"$cur\") )\n\tfi\n}\n"
	      "complete -F _loom loom\n", out);
}
