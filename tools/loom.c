/* loom: run, info, tokenize and bench. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "loom.h"
#include "loom_config.h"
#include "options.h"
#include "serve.h"

#define ERRLEN 4096

static void usage(FILE *out)
{
	fputs("usage: loom COMMAND [options]\n"
	      "commands:\n"
	      "  run       --model FILE -p PROMPT [-n N] [--backend=cpu.so] [--temp T] [--seed S]\n"
	      "            [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
	      "            [--presence-penalty P] [--frequency-penalty F] [--repeat-last-n N]\n"
	      "            [-t THREADS] [-c CTX] [-b BATCH] [-f PROMPT_FILE] [--config FILE]\n"
	      "            [--dump-logits FILE] [--dump-tokens FILE]\n"
	      "            [--spec=ngram.so|layerskip.so|draft.so|PATH] [--spec-max-draft N]\n"
	      "            [--spec-min-draft N] [--spec-ngram-min N] [--spec-ngram-max N]\n"
	      "            [--spec-draft-model FILE] [--spec-layers N]\n"
	      "  info      FILE\n"
	      "  tokenize  --model FILE [--no-bos] [-f FILE | TEXT]\n"
	      "  bench     --model FILE [--backend=cpu.so] [-p 128] [-n 64] [-t 1,2] [-r 3]\n"
	      "  serve     --model FILE [--host H] [--port 8080] [--parallel 16] [--kv-mem 512M] (loom serve --help)\n"
	      "  version\n", out);
}

static const struct option long_opts[] = {
	{ "backend", required_argument, 0, 'B' },
	{ "model", required_argument, 0, 'm' },
	{ "prompt", required_argument, 0, 'p' },
	{ "file", required_argument, 0, 'f' },
	{ "n-predict", required_argument, 0, 'n' },
	{ "threads", required_argument, 0, 't' },
	{ "ctx-size", required_argument, 0, 'c' },
	{ "batch-size", required_argument, 0, 'b' },
	{ "reps", required_argument, 0, 'r' },
	{ "config", required_argument, 0, 'C' },
	{ "temp", required_argument, 0, 1000 },
	{ "seed", required_argument, 0, 1001 },
	{ "top-k", required_argument, 0, 1002 },
	{ "top-p", required_argument, 0, 1003 },
	{ "min-p", required_argument, 0, 1004 },
	{ "repeat-penalty", required_argument, 0, 1005 },
	{ "presence-penalty", required_argument, 0, 1006 },
	{ "frequency-penalty", required_argument, 0, 1007 },
	{ "repeat-last-n", required_argument, 0, 1008 },
	{ "dump-logits", required_argument, 0, 1009 },
	{ "dump-tokens", required_argument, 0, 1010 },
	{ "no-bos", no_argument, 0, 1011 },
	{ "no-progress", no_argument, 0, 1012 },
	{ "spec", required_argument, 0, 1100 },
	{ "spec-max-draft", required_argument, 0, 1101 },
	{ "spec-min-draft", required_argument, 0, 1102 },
	{ "spec-ngram-min", required_argument, 0, 1103 },
	{ "spec-ngram-max", required_argument, 0, 1104 },
	{ "spec-draft-model", required_argument, 0, 1105 },
	{ "spec-layers", required_argument, 0, 1106 },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};

static const char *const long_keys[] = {
	[1000 - 1000] = "temp", "seed", "top_k", "top_p", "min_p", "repeat_penalty",
	"presence_penalty", "frequency_penalty", "repeat_last_n",
};

/* --spec* flags: the INI keys of the same names (docs/SPECULATIVE.md). */
static const char *const spec_keys[] = {
	"spec", "spec_max_draft", "spec_min_draft", "spec_ngram_min",
	"spec_ngram_max", "spec_draft_model", "spec_layers",
};

/* The config file is read before the other flags so flags override it. */
static int load_config_first(int argc, char **argv, struct loom_options *o,
			     char *err)
{
	int i;

	for (i = 1; i < argc; i++) {
		const char *path = NULL;

		if (!strcmp(argv[i], "--config") && i + 1 < argc)
			path = argv[i + 1];
		else if (!strncmp(argv[i], "--config=", 9))
			path = argv[i] + 9;
		if (path && loom_options_load_ini(o, path, err, ERRLEN))
			return -1;
	}
	return 0;
}

static int copy_arg(char *dst, size_t cap, const char *v, const char *what, char *err)
{
	if (strlen(v) >= cap) {
		snprintf(err, ERRLEN, "%s: path too long", what);
		return -1;
	}
	strcpy(dst, v);
	return 0;
}

static int parse_opt(struct loom_options *o, int c, const char *arg, char *err)
{
	char bench_n[32];

	switch (c) {
	case 'B': return loom_options_set(o, "backend", arg, err, ERRLEN);
	case 'm': return loom_options_set(o, "model", arg, err, ERRLEN);
	case 'p':
		o->prompt = arg;
		snprintf(bench_n, sizeof(bench_n), "%s", arg);
		o->n_prompt = atoi(bench_n);
		return 0;
	case 'f': return copy_arg(o->prompt_file, sizeof(o->prompt_file), arg, "-f", err);
	case 'n':
		o->n_gen = atoi(arg);
		return loom_options_set(o, "n_predict", arg, err, ERRLEN);
	case 't':
		if (copy_arg(o->threads_list, sizeof(o->threads_list), arg, "-t", err))
			return -1;
		return strchr(arg, ',') ? 0 : loom_options_set(o, "threads", arg, err, ERRLEN);
	case 'c': return loom_options_set(o, "ctx_size", arg, err, ERRLEN);
	case 'b': return loom_options_set(o, "batch_size", arg, err, ERRLEN);
	case 'r': o->reps = atoi(arg); return o->reps > 0 ? 0 : (snprintf(err, ERRLEN, "-r: must be positive"), -1);
	case 'C': return 0; /* already read */
	case 1009: return copy_arg(o->dump_logits, sizeof(o->dump_logits), arg, "--dump-logits", err);
	case 1010: return copy_arg(o->dump_tokens, sizeof(o->dump_tokens), arg, "--dump-tokens", err);
	case 1011: o->no_bos = true; return 0;
	case 1012: o->progress = false; return 0;
	default:
		if (c >= 1000 && c <= 1008)
			return loom_options_set(o, long_keys[c - 1000], arg, err, ERRLEN);
		if (c >= 1100 && c <= 1106)
			return loom_options_set(o, spec_keys[c - 1100], arg, err, ERRLEN);
		snprintf(err, ERRLEN, "unknown option (see loom --help)");
		return -1;
	}
}

static int parse_args(int argc, char **argv, struct loom_options *o, char *err)
{
	int c;

	if (load_config_first(argc, argv, o, err))
		return -1;
	optind = 2; /* argv[1] is the command */
	opterr = 0;
	while ((c = getopt_long(argc, argv, "B:m:p:f:n:t:c:b:r:C:h", long_opts, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			exit(0);
		}
		if (c == '?' || c == ':') {
			snprintf(err, ERRLEN, "bad or incomplete option '%s'", argv[optind - 1]);
			return -1;
		}
		if (parse_opt(o, c, optarg, err))
			return -1;
	}
	return 0;
}

/* Reads a whole file as a NUL-terminated string. */
static char *read_file(const char *path, size_t *len, char *err)
{
	FILE *fp = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, n = 0, r;

	if (!fp) {
		snprintf(err, ERRLEN, "%s: cannot open", path);
		return NULL;
	}
	do {
		if (n + 65536 + 1 > cap) {
			char *nb = realloc(buf, cap = n + 65536 + 1);

			if (!nb) {
				free(buf);
				fclose(fp);
				snprintf(err, ERRLEN, "%s: out of memory", path);
				return NULL;
			}
			buf = nb;
		}
		r = fread(buf + n, 1, 65536, fp);
		n += r;
	} while (r > 0);
	fclose(fp);
	buf[n] = '\0';
	*len = n;
	return buf;
}

/* Tokenizes text into a malloc'd array. */
static int32_t *tokenize_all(const struct loom_tokenizer *tok, const char *text,
			     size_t len, bool special, int64_t *n, char *err)
{
	int64_t need = loom_tokenize(tok, text, len, special, special, NULL, 0);
	int32_t *ids;

	if (need < 0) {
		snprintf(err, ERRLEN, "tokenizer failed on the input");
		return NULL;
	}
	ids = malloc(sizeof(int32_t) * (size_t)(need ? need : 1));
	if (!ids) {
		snprintf(err, ERRLEN, "out of memory");
		return NULL;
	}
	*n = loom_tokenize(tok, text, len, special, special, ids, need);
	return ids;
}

static int cmd_info(int argc, char **argv, char *err)
{
	char why[ERRLEN - 256];

	if (argc < 3) {
		snprintf(err, ERRLEN, "usage: loom info FILE");
		return -1;
	}
	if (loom_info_print(argv[2], stdout, why, sizeof(why))) {
		snprintf(err, ERRLEN, "%s: %s", argv[2], why);
		return -1;
	}
	return 0;
}

static int cmd_tokenize(int argc, char **argv, char *err)
{
	struct loom_options o;
	struct loom_tokenizer *tok = NULL;
	char *text = NULL;
	size_t len = 0;
	int32_t *ids = NULL;
	int64_t n = 0, i;
	int rc = -1;

	loom_options_defaults(&o);
	if (parse_args(argc, argv, &o, err))
		return -1;
	if (!o.model[0]) {
		snprintf(err, ERRLEN, "no model given (--model FILE)");
		return -1;
	}
	tok = loom_tokenizer_open(o.model, err, ERRLEN);
	if (!tok)
		return -1;
	if (o.prompt_file[0])
		text = read_file(o.prompt_file, &len, err);
	else if (optind < argc)
		text = strdup(argv[optind]), len = text ? strlen(text) : 0;
	else
		text = read_file("/dev/stdin", &len, err);
	if (!text)
		goto out_free;
	ids = tokenize_all(tok, text, len, !o.no_bos, &n, err);
	if (!ids)
		goto out_free;
	for (i = 0; i < n; i++)
		printf(i ? " %d" : "%d", ids[i]);
	printf("\n");
	rc = 0;
out_free:
	free(ids);
	free(text);
	loom_tokenizer_free(tok);
	return rc;
}

static int write_file(const char *path, const void *data, size_t n, char *err)
{
	FILE *fp = fopen(path, "wb");

	if (!fp || fwrite(data, 1, n, fp) != n) {
		snprintf(err, ERRLEN, "%s: cannot write", path);
		if (fp)
			fclose(fp);
		return -1;
	}
	return fclose(fp) ? -1 : 0;
}

struct run_out {
	FILE *tokens; /* --dump-tokens, or NULL */
	int64_t n;
};

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
	struct run_out *ro = user;

	if (ro->tokens)
		fprintf(ro->tokens, ro->n++ ? " %d" : "%d", token);
	if (len) {
		fwrite(text, 1, len, stdout);
		fflush(stdout);
	}
	return 0;
}

static void generation_params(const struct loom_options *o, struct loom_generation_params *g)
{
	loom_generation_params_init(g);
	g->n_predict = o->n_predict;
	g->add_special = !o->no_bos;
	g->temp = o->sp.temp;
	g->top_k = o->sp.top_k;
	g->top_p = o->sp.top_p;
	g->min_p = o->sp.min_p;
	g->repeat_penalty = o->sp.repeat_penalty;
	g->presence_penalty = o->sp.presence_penalty;
	g->frequency_penalty = o->sp.frequency_penalty;
	g->repeat_last_n = o->sp.penalty_last_n;
	g->seed = o->sp.seed;
}

static char *prompt_text(const struct loom_options *o, size_t *len, char *err)
{
	char *text = NULL;

	if (o->prompt_file[0])
		return read_file(o->prompt_file, len, err);
	if (o->prompt && (text = strdup(o->prompt)))
		*len = strlen(text);
	else
		snprintf(err, ERRLEN, o->prompt ? "out of memory" : "no prompt given (-p TEXT or -f FILE)");
	return text;
}

/* The speculative strategy's line: acceptance and tokens per target pass. */
static void print_spec_stats(const struct loom_engine *e, const struct loom_generation_stats *st)
{
	if (!strcmp(loom_engine_spec_name(e), "none"))
		return;
	fprintf(stderr, "loom: spec %s: acceptance %.1f%% (%lld of %lld drafts), mean accepted length %.2f per step, %.2f tokens per target pass, %.1f t/s\n",
		loom_engine_spec_name(e),
		st->spec_drafted ? 100.0 * (double)st->spec_accepted / (double)st->spec_drafted : 0.0,
		(long long)st->spec_accepted, (long long)st->spec_drafted,
		st->spec_steps ? (double)st->spec_accepted / (double)st->spec_steps : 0.0,
		st->spec_steps ? (double)(st->n_generated - 1) / (double)st->spec_steps : 0.0,
		st->generate_seconds > 0 ? (double)st->n_generated / st->generate_seconds : 0.0);
}

static int finish_run(struct loom_engine *e, const struct loom_options *o,
		      const struct loom_generation_stats *st, const float *logits,
		      char *err)
{
	printf("\n");
	fflush(stdout);
	fprintf(stderr, "loom: backend %s, prompt %lld tokens in %.3f s (%.1f t/s), generated %lld tokens in %.3f s (%.1f t/s)\n",
		loom_engine_backend_name(e), (long long)st->n_prompt, st->prompt_seconds,
		(double)st->n_prompt / st->prompt_seconds, (long long)st->n_generated,
		st->generate_seconds,
		st->n_generated > 0 ? (double)st->n_generated / st->generate_seconds : 0.0);
	print_spec_stats(e, st);
	if (o->dump_logits[0])
		return write_file(o->dump_logits, logits,
				  sizeof(float) * (size_t)loom_engine_n_vocab(e), err);
	return 0;
}

static int cmd_run(int argc, char **argv, char *err)
{
	struct loom_options o;
	struct loom_engine_params ep;
	struct loom_generation_params g;
	struct loom_generation_stats st;
	struct run_out ro = { 0 };
	struct loom_engine *e = NULL;
	float *logits = NULL;
	char *text = NULL;
	size_t len = 0;
	int rc = -1;

	loom_options_defaults(&o);
	if (parse_args(argc, argv, &o, err) || !(text = prompt_text(&o, &len, err)))
		goto out;
	if (!o.model[0]) {
		snprintf(err, ERRLEN, "no model given (--model FILE)");
		goto out;
	}
	loom_engine_params_init(&ep);
	ep.model = o.model;
	ep.backend = o.backend;
	ep.n_threads = o.n_threads;
	ep.n_ctx = o.n_ctx;
	ep.n_batch = o.n_batch;
	ep.progress = o.progress;
	ep.spec = o.spec;
	ep.spec_min_draft = o.spec_min_draft;
	ep.spec_max_draft = o.spec_max_draft;
	ep.spec_ngram_min = o.spec_ngram_min;
	ep.spec_ngram_max = o.spec_ngram_max;
	ep.spec_draft_model = o.spec_draft_model[0] ? o.spec_draft_model : NULL;
	ep.spec_layers = o.spec_layers;
	if (!(e = loom_engine_open(&ep, err, ERRLEN)))
		goto out;
	generation_params(&o, &g);
	if (o.dump_logits[0] &&
	    !(g.prompt_logits = logits = malloc(sizeof(float) * (size_t)loom_engine_n_vocab(e)))) {
		snprintf(err, ERRLEN, "out of memory");
		goto out;
	}
	if (o.dump_tokens[0] && !(ro.tokens = fopen(o.dump_tokens, "w"))) {
		snprintf(err, ERRLEN, "%s: cannot write", o.dump_tokens);
		goto out;
	}
	if (loom_generate(e, text, len, &g, on_token, &ro, &st, err, ERRLEN) == 0)
		rc = finish_run(e, &o, &st, logits, err);
out:
	if (ro.tokens) {
		fputc('\n', ro.tokens);
		fclose(ro.tokens);
	}
	loom_engine_close(e);
	free(logits);
	free(text);
	return rc;
}

static int cmd_bench(int argc, char **argv, char *err)
{
	struct loom_options o;

	loom_options_defaults(&o);
	if (parse_args(argc, argv, &o, err))
		return -1;
	return loom_bench(&o, err, ERRLEN);
}

int main(int argc, char **argv)
{
	char err[ERRLEN] = "";
	const char *cmd = argc > 1 ? argv[1] : "";
	int rc;

	if (!strcmp(cmd, "run"))
		rc = cmd_run(argc, argv, err);
	else if (!strcmp(cmd, "info"))
		rc = cmd_info(argc, argv, err);
	else if (!strcmp(cmd, "tokenize"))
		rc = cmd_tokenize(argc, argv, err);
	else if (!strcmp(cmd, "bench"))
		rc = cmd_bench(argc, argv, err);
	else if (!strcmp(cmd, "serve")) rc = loom_serve_main(argc, argv, err, ERRLEN);
	else if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		printf("loom %s\n", LOOM_VERSION);
		return 0;
	} else if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
		usage(stdout);
		return 0;
	} else {
		usage(stderr);
		return 2;
	}
	if (rc) {
		fprintf(stderr, "loom %s: error: %s\n", cmd, err[0] ? err : "failed");
		return 1;
	}
	return 0;
}
