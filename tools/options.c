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
};

#define FIELD(f) .off = offsetof(struct loom_options, f), \
		 .size = sizeof(((struct loom_options *)0)->f)

static const struct opt_def opts[] = {
	{ .name = "backend", .type = OPT_STR, FIELD(backend), .cmds = ENGINE },
	{ .name = "model", .short_name = 'm', .type = OPT_STR, FIELD(model),
	  .cmds = ENGINE | INFO | TOKENIZE | CHECK },
	{ .name = "prompt", .short_name = 'p', .type = OPT_ARG, FIELD(prompt), .cmds = RUN,
	  .flag_only = true },
	{ .name = "file", .short_name = 'f', .type = OPT_STR, FIELD(prompt_file),
	  .cmds = RUN | TOKENIZE | PPL | IMATRIX },
	{ .name = "n-predict", .short_name = 'n', .type = OPT_INT, FIELD(n_predict),
	  .lo = -1, .hi = INT_MAX, .cmds = GEN | CHECK },
	{ .name = "threads", .short_name = 't', .type = OPT_THREADS, FIELD(n_threads),
	  .lo = 0, .hi = 1024, .cmds = ENGINE | CHECK | QUANTIZE },
	{ .name = "ctx-size", .short_name = 'c', .type = OPT_INT, FIELD(n_ctx),
	  .lo = 1, .hi = 1 << 24, .cmds = GEN | SERVE | PPL | IMATRIX },
	{ .name = "batch-size", .short_name = 'b', .type = OPT_INT, FIELD(n_batch),
	  .lo = 1, .hi = 1 << 16, .cmds = GEN | BENCH },
	{ .name = "no-bos", .type = OPT_BOOL, FIELD(no_bos), .cmds = RUN | TOKENIZE },
	{ .name = "archs", .type = OPT_BOOL, FIELD(archs), .cmds = INFO },
	{ .name = "no-progress", .type = OPT_NOT, FIELD(progress), .cmds = GEN },
	{ .name = "exact", .type = OPT_BOOL, FIELD(exact), .cmds = ENGINE },
	{ .name = "kv-type", .type = OPT_KVTYPE, FIELD(kv_type), .cmds = ENGINE },
	/* distributed jobs under mpirun (docs/DISTRIBUTED.md) */
	{ .name = "tp", .type = OPT_INT, FIELD(tp), .lo = 1, .hi = 64, .cmds = RUN | BENCH | SERVE },
	{ .name = "pp", .type = OPT_INT, FIELD(pp), .lo = 1, .hi = 4096,
	  .cmds = RUN | BENCH | SERVE },
	{ .name = "pp-micro", .type = OPT_INT, FIELD(pp_micro), .lo = 1, .hi = 4096,
	  .cmds = SERVE },
	{ .name = "dump-logits", .type = OPT_STR, FIELD(dump_logits), .cmds = RUN },
	{ .name = "dump-tokens", .type = OPT_STR, FIELD(dump_tokens), .cmds = RUN },
	/* constrained decoding (docs/SERVING.md, "Structured output and tools") */
	{ .name = "grammar", .type = OPT_STR, FIELD(grammar), .cmds = RUN },
	{ .name = "json-schema", .type = OPT_STR, FIELD(json_schema), .cmds = RUN },
	/* chat */
	{ .name = "system-prompt", .type = OPT_ARG, FIELD(system_prompt), .cmds = CHAT,
	  .flag_only = true },
	{ .name = "system-prompt-file", .type = OPT_STR, FIELD(system_prompt_file),
	  .cmds = CHAT },
	{ .name = "chat-template", .type = OPT_STR, FIELD(chat_template), .cmds = CHAT | SERVE },
	{ .name = "json", .type = OPT_BOOL, FIELD(json), .cmds = BACKENDS | CHECK,
	  .flag_only = true },
	{ .name = "reference", .type = OPT_STR, FIELD(reference), .cmds = CHECK },
	/* perplexity */
	{ .name = "save-logits", .type = OPT_STR, FIELD(save_logits), .cmds = PPL },
	{ .name = "kl-base", .type = OPT_STR, FIELD(kl_base), .cmds = PPL },
	{ .name = "chunks", .type = OPT_INT, FIELD(n_chunks), .lo = 0, .hi = INT_MAX,
	  .cmds = PPL | IMATRIX },
	/* imatrix, and quantize --imatrix (docs/QUANTIZATION.md) */
	{ .name = "output", .short_name = 'o', .type = OPT_STR, FIELD(imatrix_out),
	  .cmds = IMATRIX },
	{ .name = "hessian", .type = OPT_BOOL, FIELD(hessian), .cmds = IMATRIX },
	{ .name = "show", .type = OPT_STR, FIELD(imatrix_show), .cmds = IMATRIX,
	  .flag_only = true },
	{ .name = "imatrix", .type = OPT_STR, FIELD(imatrix), .cmds = QUANTIZE },
	/* sampling */
	{ .name = "temp", .type = OPT_FLOAT, FIELD(sp.temp), .lo = 0, .hi = 100, .cmds = GEN },
	{ .name = "top-k", .type = OPT_INT, FIELD(sp.top_k), .lo = 0, .hi = INT_MAX, .cmds = GEN },
	{ .name = "top-p", .type = OPT_FLOAT, FIELD(sp.top_p), .lo = 0, .hi = 1, .cmds = GEN },
	{ .name = "min-p", .type = OPT_FLOAT, FIELD(sp.min_p), .lo = 0, .hi = 1, .cmds = GEN },
	{ .name = "repeat-penalty", .type = OPT_FLOAT, FIELD(sp.repeat_penalty),
	  .lo = 0, .hi = 100, .cmds = GEN },
	{ .name = "presence-penalty", .type = OPT_FLOAT, FIELD(sp.presence_penalty),
	  .lo = -100, .hi = 100, .cmds = GEN },
	{ .name = "frequency-penalty", .type = OPT_FLOAT, FIELD(sp.frequency_penalty),
	  .lo = -100, .hi = 100, .cmds = GEN },
	{ .name = "repeat-last-n", .type = OPT_INT, FIELD(sp.penalty_last_n),
	  .lo = 0, .hi = INT_MAX, .cmds = GEN },
	{ .name = "seed", .short_name = 's', .type = OPT_U64, FIELD(sp.seed), .cmds = GEN },
	/* bench: -p and -n count tokens there */
	{ .name = "n-prompt", .short_name = 'p', .type = OPT_INT, FIELD(n_prompt),
	  .lo = 1, .hi = 1 << 24, .cmds = BENCH },
	{ .name = "n-gen", .short_name = 'n', .type = OPT_INT, FIELD(n_gen),
	  .lo = 0, .hi = 1 << 24, .cmds = BENCH },
	{ .name = "reps", .short_name = 'r', .type = OPT_INT, FIELD(reps),
	  .lo = 1, .hi = 1 << 20, .cmds = BENCH },
	{ .name = "n-depth", .short_name = 'd', .type = OPT_INT, FIELD(n_depth),
	  .lo = 0, .hi = 1 << 24, .cmds = BENCH },
	{ .name = "n-parallel", .type = OPT_INT, FIELD(n_parallel), .lo = 1, .hi = 256,
	  .cmds = BENCH },
	/* speculative decoding (docs/SPECULATIVE.md) */
	{ .name = "spec", .type = OPT_STR, FIELD(spec), .cmds = GEN | SERVE },
	{ .name = "spec-draft-model", .type = OPT_STR, FIELD(spec_draft_model),
	  .cmds = GEN | SERVE },
	{ .name = "spec-max-draft", .type = OPT_INT, FIELD(spec_max_draft),
	  .lo = 1, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-min-draft", .type = OPT_INT, FIELD(spec_min_draft),
	  .lo = 1, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-ngram-min", .type = OPT_INT, FIELD(spec_ngram_min),
	  .lo = 1, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-ngram-max", .type = OPT_INT, FIELD(spec_ngram_max),
	  .lo = 1, .hi = 64, .cmds = GEN | SERVE },
	{ .name = "spec-layers", .type = OPT_INT, FIELD(spec_layers),
	  .lo = 1, .hi = 4096, .cmds = GEN | SERVE },
	/* serve */
	{ .name = "host", .type = OPT_STR, FIELD(serve.host), .cmds = SERVE },
	{ .name = "port", .type = OPT_INT, FIELD(serve.port), .lo = 0, .hi = 65535,
	  .cmds = SERVE },
	{ .name = "kv-mem", .type = OPT_SIZE, FIELD(serve.kv_mem), .cmds = GEN | SERVE },
	{ .name = "parallel", .type = OPT_INT, FIELD(serve.parallel), .lo = 1, .hi = 4096,
	  .cmds = SERVE },
	{ .name = "block-size", .type = OPT_INT, FIELD(serve.block_size), .lo = 1, .hi = 4096,
	  .cmds = GEN | SERVE },
	{ .name = "max-batch-tokens", .type = OPT_INT, FIELD(serve.max_batch_tokens),
	  .lo = 1, .hi = 1 << 20, .cmds = SERVE },
	{ .name = "max-waiting", .type = OPT_INT, FIELD(serve.max_waiting),
	  .lo = 0, .hi = 1 << 20, .cmds = SERVE },
	{ .name = "max-body", .type = OPT_SIZE, FIELD(serve.max_body), .cmds = SERVE },
	{ .name = "max-queued-bytes", .type = OPT_SIZE, FIELD(serve.max_queued), .cmds = SERVE },
	{ .name = "max-queued-bytes-per-client", .type = OPT_SIZE,
	  FIELD(serve.max_queued_per_client), .cmds = SERVE },
	{ .name = "shutdown-timeout", .type = OPT_INT, FIELD(serve.shutdown_timeout),
	  .lo = 0, .hi = 86400, .cmds = SERVE },
	{ .name = "prefix-cache", .type = OPT_BOOL, FIELD(serve.prefix_cache), .cmds = SERVE },
	{ .name = "no-prefix-cache", .type = OPT_NOT, FIELD(serve.prefix_cache), .cmds = SERVE },
	{ .name = "spec-default", .type = OPT_STR, FIELD(serve.spec_default), .cmds = SERVE },
	{ .name = "spec-step-rows", .type = OPT_INT, FIELD(serve.spec_step_rows),
	  .lo = 0, .hi = 1 << 20, .cmds = SERVE },
	/* quantize (docs/QUANTIZATION.md) */
	{ .name = "strategy", .type = OPT_STR, FIELD(qstrategy), .cmds = QUANTIZE },
	{ .name = "allow-requantize", .type = OPT_BOOL, FIELD(allow_requantize),
	  .cmds = QUANTIZE },
	{ .name = "dry-run", .type = OPT_BOOL, FIELD(dry_run), .cmds = QUANTIZE },
	/* every command that writes a file refuses an existing one without it */
	{ .name = "force", .type = OPT_BOOL, FIELD(force), .cmds = QUANTIZE | IMATRIX | PPL },
	/* serve: connections and access (docs/SERVING.md) */
	{ .name = "http-threads", .type = OPT_INT, FIELD(serve.http_threads),
	  .lo = 1, .hi = 256, .cmds = SERVE },
	{ .name = "header-timeout", .type = OPT_INT, FIELD(serve.header_timeout),
	  .lo = 1, .hi = 3600, .cmds = SERVE },
	{ .name = "body-timeout", .type = OPT_INT, FIELD(serve.body_timeout),
	  .lo = 1, .hi = 3600, .cmds = SERVE },
	{ .name = "idle-timeout", .type = OPT_INT, FIELD(serve.idle_timeout),
	  .lo = 1, .hi = 86400, .cmds = SERVE },
	{ .name = "max-conns", .type = OPT_INT, FIELD(serve.max_conns),
	  .lo = 1, .hi = 1 << 20, .cmds = SERVE },
	{ .name = "max-conns-per-ip", .type = OPT_INT, FIELD(serve.max_conns_per_ip),
	  .lo = 1, .hi = 1 << 20, .cmds = SERVE },
	{ .name = "load-wait", .type = OPT_INT, FIELD(serve.load_wait),
	  .lo = 0, .hi = 3600, .cmds = SERVE },
	{ .name = "half-close", .type = OPT_BOOL, FIELD(serve.half_close), .cmds = SERVE },
	{ .name = "api-key", .type = OPT_STR, FIELD(serve.api_key), .cmds = SERVE },
	{ .name = "cors-origin", .type = OPT_STR, FIELD(serve.cors_origin), .cmds = SERVE },
	{ .name = "alias", .short_name = 'a', .type = OPT_LIST, FIELD(serve.aliases), .cmds = SERVE },
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
	  "            --kv-type: default f16, f32 with --exact\n" },
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
	  "tokenize  --model FILE [--no-bos] [--config FILE] [-f FILE | TEXT]\n" },
	{ .name = "bench", .cmd = BENCH, .usage =
	  "bench     --model FILE [--backend=cpu.so] [-p 128] [-n 64] [-d 0] [-t 1,2] [-r 3]\n"
	  "            [-b 256] [--exact] [--kv-type f16|f32|q8_0|q4_0] [-npl 1] [--config FILE]\n"
	  "            pp: a prefill of -p tokens; tg: -n decode steps after -d tokens\n"
	  "            of context (as llama-bench's -p, -n and -d); with -npl N, N\n"
	  "            sequences decode together and tg is their tokens per second\n" },
	{ .name = "perplexity", .cmd = PPL, .usage =
	  "perplexity --model FILE -f TEXT [-c 512] [--chunks N] [--backend=cpu.so] [-t N]\n"
	  "            [--exact] [--kv-type f16|f32|q8_0|q4_0] [--save-logits FILE | --kl-base FILE]\n"
	  "            [--force] [--config FILE]\n" },
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
		      "  version\n", out);
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
	if (d->off == offsetof(struct loom_options, n_ctx))
		o->ctx_given = true;
	if (d->off == offsetof(struct loom_options, sp.seed))
		o->seed_given = true;
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
	if (d->off == offsetof(struct loom_options, n_ctx))
		o->ctx_given = true;
	if (d->off == offsetof(struct loom_options, sp.seed))
		o->seed_given = true;
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

/* Rewrites llama.cpp's spellings (flag_aliases) to ours, in place. */
static void rewrite_aliases(int argc, char **argv)
{
	size_t k;
	int i;

	for (i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			return;
		for (k = 0; k < sizeof(flag_aliases) / sizeof(flag_aliases[0]); k++)
			if (!strcmp(argv[i], flag_aliases[k].from))
				argv[i] = (char *)flag_aliases[k].to;
	}
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
	rewrite_aliases(argc, argv);
	rc = scan(o, cd, argc, argv, 0, err, errlen);
	if (!rc)
		rc = scan(o, cd, argc, argv, 1, err, errlen);
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
	p->exact = o->exact;
	p->kv_type = o->kv_type;
	p->tp = o->tp;
	p->pp = o->pp;
	p->pp_micro = o->pp_micro;
}
