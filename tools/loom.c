/* loom: run, chat (tools/chat.c), info, tokenize, bench, perplexity,
 * backends, check-backend, quantize, imatrix
 * (serve is server/). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends.h"
#include "chat.h"
#include "bench.h"
#include "imatrix.h"
#include "perplexity.h"
#include "loom.h"
#include "loom_config.h"
#include "options.h"
#include "serve.h"

#define ERRLEN 4096

static void usage(FILE *out)
{
	loom_options_usage(out, 0);
}

/* argv[1] is the command; its options, config file first (tools/options.c). */
static int parse_args(int argc, char **argv, struct loom_options *o, char *err)
{
	int rc = loom_options_parse(o, argc, argv, err, ERRLEN);

	if (rc > 0) /* --help */
		exit(0);
	return rc;
}

/* Reads a whole file ("-": stdin) as a NUL-terminated string. */
char *loom_read_text(const char *path, size_t *len, char *err, size_t errlen)
{
	bool std_in = !strcmp(path, "-");
	FILE *fp = std_in ? stdin : fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, n = 0, r;

	if (!fp) {
		snprintf(err, errlen, "%s: cannot open", path);
		return NULL;
	}
	do {
		if (n + 65536 + 1 > cap) {
			char *nb = realloc(buf, cap = n + 65536 + 1);

			if (!nb) {
				free(buf);
				if (!std_in)
					fclose(fp);
				snprintf(err, errlen, "%s: out of memory", std_in ? "stdin" : path);
				return NULL;
			}
			buf = nb;
		}
		r = fread(buf + n, 1, 65536, fp);
		n += r;
	} while (r > 0);
	if (!std_in)
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
	struct loom_options o;
	char why[ERRLEN - 256];
	const char *path;

	loom_options_defaults(&o);
	if (parse_args(argc, argv, &o, err))
		return -1;
	path = o.n_args ? o.args[0] : o.model;
	if (o.archs || !path[0]) { /* no model: what loom can read */
		if (loom_info_print_supported(stdout)) {
			snprintf(err, ERRLEN, "cannot write the table");
			return -1;
		}
		return 0;
	}
	if (loom_info_print(path, stdout, why, sizeof(why))) {
		snprintf(err, ERRLEN, "%s: %s", path, why);
		return -1;
	}
	return 0;
}

/* The length of the valid UTF-8 character at s (n bytes left), or 0. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
	size_t len = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;

	if (s[0] >= 0xf8 || len > n)
		return 0;
	for (size_t i = 1; i < len; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((len == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (len == 4 && s[0] == 0xf0 && s[1] < 0x90) ||
	    (len == 4 && s[0] == 0xf4 && s[1] >= 0x90) || (len == 3 && s[0] == 0xed && s[1] >= 0xa0))
		return 0;
	return len;
}

/* A piece between single quotes: \\, \', \n, \t, \r as in C, other
 * control bytes and bytes of no whole UTF-8 character as \xNN. */
static void print_escaped(const unsigned char *s, size_t n)
{
	putchar('\'');
	for (size_t i = 0; i < n;) {
		size_t len = s[i] >= 0x80 ? utf8_char(s + i, n - i) : 0;

		if (len) {
			fwrite(s + i, 1, len, stdout);
			i += len;
			continue;
		}
		if (s[i] == '\\' || s[i] == '\'')
			printf("\\%c", s[i]);
		else if (s[i] == '\n' || s[i] == '\t' || s[i] == '\r')
			printf("\\%c", s[i] == '\n' ? 'n' : s[i] == '\t' ? 't' : 'r');
		else if (s[i] < 0x20 || s[i] >= 0x7f)
			printf("\\x%02x", s[i]);
		else
			putchar(s[i]);
		i++;
	}
	putchar('\'');
}

/* tokenize --pieces: a line a token, its id and the bytes it stands for. */
static void print_pieces(const struct loom_tokenizer *tok, const int32_t *ids, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		size_t len = 0;
		const char *bytes = loom_token_bytes(tok, ids[i], &len);

		printf("%d\t", ids[i]);
		print_escaped((const unsigned char *)(bytes ? bytes : ""), bytes ? len : 0);
		putchar('\n');
	}
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
		text = loom_read_text(o.prompt_file, &len, err, ERRLEN);
	else if (o.n_args)
		text = strdup(o.args[0]), len = text ? strlen(text) : 0;
	else
		text = loom_read_text("-", &len, err, ERRLEN);
	if (!text)
		goto out_free;
	ids = tokenize_all(tok, text, len, !o.no_bos, &n, err);
	if (!ids)
		goto out_free;
	if (o.pieces)
		print_pieces(tok, ids, n);
	else {
		for (i = 0; i < n; i++)
			printf(i ? " %d" : "%d", ids[i]);
		printf("\n");
	}
	rc = 0;
out_free:
	free(ids);
	free(text);
	loom_tokenizer_free(tok);
	return rc;
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

/* A seed for a run without --seed: the clock's nanoseconds and the process
 * id, mixed (splitmix64's finalizer) so that close times differ widely. */
static uint64_t clock_seed(void)
{
	struct timespec ts;
	uint64_t x;

	clock_gettime(CLOCK_REALTIME, &ts);
	x = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
	x ^= (uint64_t)getpid() << 32;
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
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
	g->seed = o->seed_given ? o->sp.seed : clock_seed();
	/* printed so that --seed reproduces the run */
	fprintf(stderr, "seed: %llu\n", (unsigned long long)g->seed);
}

/* -p TEXT, -f FILE, -f - (stdin), or stdin when it is piped and neither is
 * given. */
static char *prompt_text(const struct loom_options *o, size_t *len, char *err)
{
	char *text = NULL;

	if (o->prompt && o->prompt_file[0]) {
		snprintf(err, ERRLEN, "-p and -f exclude each other");
		return NULL;
	}
	if (o->prompt_file[0])
		return loom_read_text(o->prompt_file, len, err, ERRLEN);
	if (!o->prompt && !isatty(0))
		return loom_read_text("-", len, err, ERRLEN);
	if (o->prompt && (text = strdup(o->prompt)))
		*len = strlen(text);
	else
		snprintf(err, ERRLEN, o->prompt ? "out of memory" : "no prompt given (-p TEXT, -f FILE, or text piped on stdin)");
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

/* For a model with sliding-window layers: the KV blocks each pool held at
 * most, beside the plan's blocks per sequence. */
static void print_kv_stats(struct loom_engine *e)
{
	struct loom_engine_stats st;

	loom_engine_get_stats(e, &st);
	if (st.local_window <= 0)
		return;
	fprintf(stderr, "loom: KV blocks held at most: full-context layers %lld (plan %lld per sequence), %d windowed layers (window %d) %lld (plan %lld per sequence), blocks of %d tokens\n",
		(long long)st.blocks_peak, (long long)st.seq_blocks, st.local_layers,
		st.local_window, (long long)st.local_blocks_peak,
		(long long)st.seq_local_blocks, st.block_size);
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
	print_kv_stats(e);
	if (o->dump_logits[0])
		return loom_write_file(o->dump_logits, LOOM_WRITE_FORCE, logits,
				       sizeof(float) * (size_t)loom_engine_n_vocab(e), err, ERRLEN);
	return 0;
}

/* The grammar --grammar or --json-schema asks for; NULL with *err empty
 * when neither does, NULL with err set when it cannot be had. */
static struct loom_grammar *run_grammar(const struct loom_options *o, char *err)
{
	struct loom_grammar *g;
	char *schema;
	size_t len = 0;

	err[0] = '\0';
	if (o->json_schema[0] && o->grammar[0] && strcmp(o->grammar, "none")) {
		snprintf(err, ERRLEN, "--grammar and --json-schema exclude each other");
		return NULL;
	}
	if (o->json_schema[0]) {
		schema = loom_read_text(o->json_schema, &len, err, ERRLEN);
		if (!schema)
			return NULL;
		g = loom_grammar_new("json_schema", schema, len, err, ERRLEN);
		free(schema);
		if (!g)
			snprintf(err + strlen(err), ERRLEN - strlen(err), " (in %s)", o->json_schema);
		return g;
	}
	if (!o->grammar[0] || !strcmp(o->grammar, "none"))
		return NULL;
	if (strcmp(o->grammar, "json") && strcmp(o->grammar, "json_object")) {
		snprintf(err, ERRLEN, "--grammar: '%s' is not json or json_object (a schema: --json-schema FILE)",
			 o->grammar);
		return NULL;
	}
	return loom_grammar_new(o->grammar, NULL, 0, err, ERRLEN);
}

/* The KV memory plan, on stderr: type, bytes per token, blocks, tokens. */
static void print_kv_plan(struct loom_engine *e)
{
	struct loom_engine_stats st;

	loom_engine_get_stats(e, &st);
	fprintf(stderr, "loom: KV cache %s, %llu bytes/token: %lld blocks x %d = %lld tokens, %.1f MiB; context %d\n",
		loom_kv_type_name(st.kv_type), (unsigned long long)st.kv_token_bytes,
		(long long)st.blocks_total, st.block_size, (long long)st.blocks_total * st.block_size,
		(double)st.kv_bytes / 1048576.0, st.n_ctx);
}

/* The tokens to generate: -n, or what the context holds after the prompt
 * when -n is -1 (until the end of the sequence or a full context) or more
 * than that; said on stderr. A prompt that fills the context is left to
 * loom_generate's refusal. */
static int32_t fit_context(struct loom_engine *e, const struct loom_options *o,
			   const char *text, size_t len, bool add_special)
{
	int64_t prompt = loom_engine_tokenize(e, text, len, add_special, NULL, 0);
	int64_t room = (int64_t)loom_engine_n_ctx(e) - prompt;

	if (prompt <= 0 || room <= 0 || (o->n_predict >= 0 && o->n_predict <= room))
		return o->n_predict < 0 ? 1 : o->n_predict;
	if (o->n_predict > 0)
		fprintf(stderr, "loom run: -n %d does not fit: the context holds %d tokens and the prompt takes %lld; generating until it is full (%lld tokens at most)\n",
			o->n_predict, loom_engine_n_ctx(e), (long long)prompt, (long long)room);
	return (int32_t)room;
}

static int cmd_run(int argc, char **argv, char *err)
{
	struct loom_grammar *gram = NULL;
	struct loom_options o;
	struct loom_engine_params ep;
	struct loom_generation_params g;
	struct loom_generation_stats st;
	struct run_out ro = { 0 };
	struct loom_outfile *tokens_out = NULL; /* --dump-tokens */
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
	loom_options_engine_params(&o, &ep);
	ep.n_ctx = o.ctx_given ? o.n_ctx : 0;
	ep.kv_bytes = (int64_t)o.serve.kv_mem;
	ep.n_batch = o.n_batch;
	ep.block_size = o.serve.block_size;
	ep.progress = o.progress;
	if (!(e = loom_engine_open(&ep, err, ERRLEN)))
		goto out;
	if (loom_engine_is_follower(e)) { /* rank 0 generates; this rank helps */
		rc = loom_engine_follow(e, err, ERRLEN) ? -1 : 0;
		goto out;
	}
	print_kv_plan(e);
	generation_params(&o, &g);
	g.n_predict = fit_context(e, &o, text, len, g.add_special);
	if (!(g.grammar = gram = run_grammar(&o, err)) && err[0])
		goto out;
	if (o.dump_logits[0] &&
	    !(g.prompt_logits = logits = malloc(sizeof(float) * (size_t)loom_engine_n_vocab(e)))) {
		snprintf(err, ERRLEN, "out of memory");
		goto out;
	}
	if (o.dump_tokens[0]) {
		/* debug dumps replace: scripts rerun with one path (docs/TESTING.md) */
		tokens_out = loom_outfile_open(o.dump_tokens, LOOM_WRITE_FORCE, err, ERRLEN);
		if (!tokens_out)
			goto out;
		ro.tokens = loom_outfile_stream(tokens_out);
	}
	if (loom_generate(e, text, len, &g, on_token, &ro, &st, err, ERRLEN) == 0)
		rc = finish_run(e, &o, &st, logits, err);
	if (!rc && g.n_predict != o.n_predict && st.n_generated == g.n_predict)
		fprintf(stderr, "loom run: stopped: the context (%d tokens) is full\n",
			loom_engine_n_ctx(e));
	if (tokens_out) {
		fputc('\n', ro.tokens);
		if (!rc && loom_outfile_commit(tokens_out, err, ERRLEN))
			rc = -1;
		else if (rc)
			loom_outfile_discard(tokens_out);
		tokens_out = NULL;
	}
out:
	loom_grammar_free(gram);
	loom_engine_close(e);
	free(logits);
	free(text);
	return rc;
}

static int cmd_chat(int argc, char **argv, char *err)
{
	struct loom_options o;
	uint64_t seed;

	loom_options_defaults(&o);
	o.n_predict = -1; /* a reply runs to its end-of-turn token */
	if (parse_args(argc, argv, &o, err))
		return -1;
	seed = o.seed_given ? o.sp.seed : clock_seed();
	fprintf(stderr, "seed: %llu\n", (unsigned long long)seed);
	return loom_chat_main(&o, seed, err, ERRLEN);
}

static int cmd_perplexity(int argc, char **argv, char *err)
{
	struct loom_options o;
	char *text;
	size_t len = 0;
	int rc;

	loom_options_defaults(&o);
	if (parse_args(argc, argv, &o, err))
		return -1;
	if (!o.model[0] || !o.prompt_file[0]) {
		snprintf(err, ERRLEN, "perplexity needs --model FILE and -f TEXT_FILE");
		return -1;
	}
	text = loom_read_text(o.prompt_file, &len, err, ERRLEN);
	if (!text)
		return -1;
	rc = loom_perplexity(&o, text, len, err, ERRLEN);
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

static int cmd_backends(int argc, char **argv, char *err)
{
	struct loom_options o;

	loom_options_defaults(&o);
	if (parse_args(argc, argv, &o, err))
		return -1;
	return loom_backends_main(&o, err, ERRLEN);
}

static int cmd_check(int argc, char **argv, char *err)
{
	struct loom_options o;

	loom_options_defaults(&o);
	o.n_predict = 16; /* greedy tokens compared with --model */
	if (parse_args(argc, argv, &o, err))
		return -1;
	return loom_check_main(&o, err, ERRLEN);
}

static int cmd_quantize(int argc, char **argv, char *err)
{
	struct loom_options o;
	struct loom_quantize_params q;

	loom_options_defaults(&o);
	if (parse_args(argc, argv, &o, err))
		return -1;
	if (o.n_args != 3) {
		snprintf(err, ERRLEN, "quantize needs IN.gguf OUT.gguf TYPE (see loom quantize --help)");
		return -1;
	}
	loom_quantize_params_init(&q);
	q.input = o.args[0];
	q.output = o.args[1];
	q.type = o.args[2];
	q.strategy = o.qstrategy[0] ? o.qstrategy : NULL;
	q.n_threads = o.n_threads;
	q.allow_requantize = o.allow_requantize;
	q.dry_run = o.dry_run;
	q.force = o.force;
	q.imatrix = o.imatrix[0] ? o.imatrix : NULL;
	return loom_quantize(&q, err, ERRLEN);
}

static int cmd_imatrix(int argc, char **argv, char *err)
{
	struct loom_options o;
	struct loom_outfile *probe;
	char *text;
	size_t len = 0;
	int rc;

	loom_options_defaults(&o);
	if (parse_args(argc, argv, &o, err))
		return -1;
	if (o.imatrix_show[0])
		return loom_imatrix_show(o.imatrix_show, err, ERRLEN);
	if (!o.model[0] || !o.prompt_file[0] || !o.imatrix_out[0]) {
		snprintf(err, ERRLEN, "imatrix needs --model FILE, -f CALIB.txt and -o FILE (or --show FILE)");
		return -1;
	}
	/* before the hours of calibration, the save's own checks on a trial
	 * temporary: an existing OUT (refused again atomically by the save), a
	 * directory there, a directory that cannot be written */
	probe = loom_outfile_open(o.imatrix_out, o.force ? LOOM_WRITE_FORCE : 0, err, ERRLEN);
	if (!probe)
		return -1;
	loom_outfile_discard(probe);
	text = loom_read_text(o.prompt_file, &len, err, ERRLEN);
	if (!text)
		return -1;
	rc = loom_imatrix_main(&o, text, len, err, ERRLEN);
	free(text);
	return rc;
}

/* A command that writes files dies on SIGINT, SIGTERM or SIGHUP as
 * before, but first removes the temporaries it had open (loom.h, output
 * files), so an interrupted quantize leaves no OUT.gguf.XXXXXX.part. */
static void on_fatal_signal(int sig)
{
	loom_outfile_discard_all();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void clean_up_on_signals(const char *cmd)
{
	static const char *const writers[] = { "run", "quantize", "imatrix", "perplexity" };
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };

	for (size_t i = 0; i < sizeof(writers) / sizeof(writers[0]); i++) {
		if (strcmp(cmd, writers[i]))
			continue;
		for (size_t j = 0; j < sizeof(sigs) / sizeof(sigs[0]); j++)
			signal(sigs[j], on_fatal_signal);
	}
}

/* loom template [--now UNIX_SECONDS] FILE.jinja [CONTEXT.json]: renders a
 * chat template with the variables of CONTEXT (stdin without it) and
 * prints the text exactly; a template that raises fails with its message. */
static int cmd_template(int argc, char **argv, char *err)
{
	const char *tpath = NULL, *cpath = "-";
	char *tmpl = NULL, *vars = NULL, *out = NULL;
	size_t tlen = 0, vlen = 0, len = 0;
	long long now = 0;
	int i = 2, rc = -1;

	if (i + 1 < argc && !strcmp(argv[i], "--now")) {
		char *end;

		now = strtoll(argv[i + 1], &end, 10);
		if (*end || end == argv[i + 1]) {
			snprintf(err, ERRLEN, "--now needs Unix seconds, not '%s'", argv[i + 1]);
			return -1;
		}
		i += 2;
	}
	if (i < argc && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) {
		printf("usage: loom template [--now UNIX_SECONDS] FILE.jinja [CONTEXT.json]\n");
		return 0;
	}
	if (argc - i < 1 || argc - i > 2) {
		snprintf(err, ERRLEN, "template needs FILE.jinja and a JSON context (a file or stdin)");
		return -1;
	}
	tpath = argv[i];
	if (argc - i == 2)
		cpath = argv[i + 1];
	tmpl = loom_read_text(tpath, &tlen, err, ERRLEN);
	if (!tmpl)
		goto out_free;
	vars = loom_read_text(cpath, &vlen, err, ERRLEN);
	if (!vars)
		goto out_free;
	out = loom_template_render(tmpl, tlen, vars, vlen, now, &len, err, ERRLEN);
	if (!out)
		goto out_free;
	rc = fwrite(out, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : -1;
	if (rc)
		snprintf(err, ERRLEN, "writing the output failed");
out_free:
	free(out);
	free(vars);
	free(tmpl);
	return rc;
}

/* llama-cli's habits: `loom run ... -cnv` is `loom chat ...`, and so is a
 * command line of flags with -cnv and no command; -hf is refused by name.
 * 0 to go on (argv may now name chat), or the exit status. */
static int llama_cli(int *argc, char ***argv)
{
	const char *cmd = *argc > 1 ? (*argv)[1] : "";
	const char *refused;
	char **av;

	if (!strcmp(cmd, "run") && loom_options_wants_chat(*argc, *argv, 1)) {
		(*argv)[1] = "chat";
		loom_options_run_to_chat(*argc, *argv, 1);
		return 0;
	}
	if (cmd[0] != '-' || !strcmp(cmd, "-h") || !strcmp(cmd, "--help") ||
	    !strcmp(cmd, "--version") || !strcmp(cmd, "--help-man") || !strcmp(cmd, "--completion"))
		return 0;
	if ((refused = loom_options_refused_flag(*argc, *argv, 0))) {
		fprintf(stderr, "loom: error: %s\n", refused);
		return 1;
	}
	if (!loom_options_wants_chat(*argc, *argv, 0)) {
		fprintf(stderr, "loom: a command comes first: loom run -m FILE -p TEXT (llama-cli), loom chat -m FILE (llama-cli -cnv), loom serve -m FILE (llama-server); see loom --help\n");
		return 2;
	}
	av = malloc(sizeof(char *) * (size_t)(*argc + 2));
	if (!av) {
		fprintf(stderr, "loom: out of memory\n");
		return 1;
	}
	av[0] = (*argv)[0];
	av[1] = "chat";
	memcpy(av + 2, *argv + 1, sizeof(char *) * (size_t)*argc); /* with the NULL */
	(*argc)++;
	*argv = av; /* main frees it */
	loom_options_run_to_chat(*argc, *argv, 1);
	return 0;
}

int main(int argc, char **argv)
{
	char err[ERRLEN] = "";
	char **given = argv;
	const char *cmd;
	int rc;

	if ((rc = llama_cli(&argc, &argv)))
		return rc;
	cmd = argc > 1 ? argv[1] : "";
	clean_up_on_signals(cmd);
	if (!strcmp(cmd, "run"))
		rc = cmd_run(argc, argv, err);
	else if (!strcmp(cmd, "chat"))
		rc = cmd_chat(argc, argv, err);
	else if (!strcmp(cmd, "info"))
		rc = cmd_info(argc, argv, err);
	else if (!strcmp(cmd, "tokenize"))
		rc = cmd_tokenize(argc, argv, err);
	else if (!strcmp(cmd, "bench"))
		rc = cmd_bench(argc, argv, err);
	else if (!strcmp(cmd, "perplexity"))
		rc = cmd_perplexity(argc, argv, err);
	else if (!strcmp(cmd, "check-backend"))
		rc = cmd_check(argc, argv, err);
	else if (!strcmp(cmd, "backends"))
		rc = cmd_backends(argc, argv, err);
	else if (!strcmp(cmd, "quantize"))
		rc = cmd_quantize(argc, argv, err);
	else if (!strcmp(cmd, "imatrix"))
		rc = cmd_imatrix(argc, argv, err);
	else if (!strcmp(cmd, "template"))
		rc = cmd_template(argc, argv, err);
	else if (!strcmp(cmd, "serve")) rc = loom_serve_main(argc, argv, err, ERRLEN);
	else if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		printf("loom %s\n", LOOM_VERSION);
		return 0;
	} else if (!strcmp(cmd, "--help-man")) {
		loom_options_man(stdout, LOOM_VERSION);
		return 0;
	} else if (!strcmp(cmd, "--completion") && argc == 3 && !strcmp(argv[2], "bash")) {
		loom_options_completion(stdout);
		return 0;
	} else if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
		usage(stdout);
		return 0;
	} else if (!cmd[0]) {
		usage(stderr);
		return 2;
	} else {
		fprintf(stderr, "loom: unknown command '%s' (commands: %s; see loom --help)\n",
			cmd, loom_options_commands());
		return 2;
	}
	if (argv != given)
		free(argv); /* llama_cli's copy (only chat gets one) */
	if (rc) {
		fprintf(stderr, "loom %s: error: %s\n", cmd, err[0] ? err : "failed");
		return 1;
	}
	return 0;
}
