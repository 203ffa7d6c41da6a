/* The public API (include/loom.h) as an embedding program uses it. */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom.h"

static const char *model;
static struct loom_engine *engine;

struct collected {
	int32_t ids[64];
	int n;
	int stop_after;
};

static int collect(void *user, int32_t token, const char *text, size_t len)
{
	struct collected *c = user;

	if (c->n < 64)
		c->ids[c->n++] = token;
	return c->stop_after && c->n >= c->stop_after;
}

static void open_engine(void)
{
	struct loom_engine_params p;
	char err[1024];

	loom_engine_params_init(&p);
	p.model = model;
	p.n_ctx = 256;
	engine = loom_engine_open(&p, err, sizeof(err));
	ck_assert_msg(engine != NULL, "%s", err);
}

static void close_engine(void)
{
	loom_engine_close(engine);
}

START_TEST(missing_model_is_named)
{
	struct loom_engine_params p;
	char err[1024] = "";

	loom_engine_params_init(&p);
	p.model = "/nonexistent/m.gguf";
	ck_assert_ptr_null(loom_engine_open(&p, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/m.gguf"));
}
END_TEST

START_TEST(greedy_is_repeatable_and_stoppable)
{
	struct loom_generation_params g;
	struct loom_generation_stats st;
	struct collected a = { .n = 0 }, b = { .n = 0 }, c = { .stop_after = 3 };
	const char *prompt = "The capital of France is";
	char err[1024];

	loom_generation_params_init(&g);
	g.temp = 0;
	g.n_predict = 12;
	ck_assert_msg(loom_generate(engine, prompt, strlen(prompt), &g, collect, &a, &st,
				    err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(st.n_prompt, 5);
	ck_assert_int_eq(st.n_generated, a.n);
	ck_assert_int_gt(a.n, 0);
	ck_assert_int_eq(loom_generate(engine, prompt, strlen(prompt), &g, collect, &b, NULL,
				       err, sizeof(err)), 0);
	ck_assert_int_eq(a.n, b.n);
	ck_assert_mem_eq(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n);
	ck_assert_int_eq(loom_generate(engine, prompt, strlen(prompt), &g, collect, &c, &st,
				       err, sizeof(err)), 0);
	ck_assert_int_eq(st.n_generated, 3);
	ck_assert_mem_eq(a.ids, c.ids, sizeof(int32_t) * 3);
}
END_TEST

struct text {
	char s[256];
	size_t len;
};

static int collect_text(void *user, int32_t token, const char *text, size_t len)
{
	struct text *t = user;

	(void)token;
	if (t->len + len < sizeof(t->s)) {
		memcpy(t->s + t->len, text, len);
		t->len += len;
	}
	return 0;
}

/* The output held to the JSON string "\U0001d49c" (four bytes, three
 * tokens in SmolLM2's vocabulary: f0 9d, 92, 9c) and cut after four
 * tokens: greedy SmolLM2 writes a newline, the quote, then two of the
 * character's tokens. The text ends with U+FFFD where the unfinished
 * character's bytes were, not with them dropped unseen. */
START_TEST(unfinished_character_ends_with_replacement)
{
	static const char schema[] = "{\"const\": \"\xf0\x9d\x92\x9c\"}";
	struct loom_generation_params g;
	struct text t = { .len = 0 };
	struct loom_grammar *gr;
	char err[1024];

	gr = loom_grammar_new("json_schema", schema, strlen(schema), err, sizeof(err));
	ck_assert_msg(gr != NULL, "%s", err);
	loom_generation_params_init(&g);
	g.temp = 0;
	g.n_predict = 4;
	g.grammar = gr;
	ck_assert_msg(loom_generate(engine, "Write it:", 9, &g, collect_text, &t, NULL, err,
				    sizeof(err)) == 0, "%s", err);
	loom_grammar_free(gr);
	ck_assert_uint_eq(t.len, 5);
	ck_assert_mem_eq(t.s, "\n\"\xef\xbf\xbd", 5);
}
END_TEST

START_TEST(context_overflow_is_refused)
{
	struct loom_generation_params g;
	char err[1024] = "";

	loom_generation_params_init(&g);
	g.n_predict = 1000; /* context is 256 */
	ck_assert_int_eq(loom_generate(engine, "hi", 2, &g, NULL, NULL, NULL, err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "context"));
}
END_TEST

/* Many sequences on a short context: each step takes a token of every
 * sequence, so the step batch may not shrink to one context (it did:
 * `loom bench -p 1 -n 16 -npl 32` failed with the scheduler's "bad
 * config"); a batch below the sequence count is refused by name. */
START_TEST(parallel_sequences_outgrow_context)
{
	struct loom_engine_params p;
	struct loom_engine *e;
	char err[1024] = "";

	loom_engine_params_init(&p);
	p.model = model;
	p.n_ctx = 18;
	p.n_parallel = 32;
	e = loom_engine_open(&p, err, sizeof(err));
	ck_assert_msg(e != NULL, "%s", err);
	loom_engine_close(e);
	p.n_batch = 8;
	ck_assert_ptr_null(loom_engine_open(&p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "smaller than 32 parallel sequences") != NULL, "%s", err);
}
END_TEST

/* A caller built against an older loom.h passes a smaller struct: the
 * fields it does not know keep their defaults. Below the first generation
 * the struct is refused, naming struct_size. */
START_TEST(older_structs_are_accepted)
{
	struct loom_engine_params p;
	struct loom_generation_params g;
	struct collected a = { .n = 0 };
	struct loom_engine *e;
	char err[1024] = "";

	loom_engine_params_init(&p);
	p.model = model;
	p.n_ctx = 64;
	p.spec = "no-such-strategy.so"; /* beyond the old size: must be ignored */
	p.struct_size = (uint32_t)offsetof(struct loom_engine_params, spec);
	e = loom_engine_open(&p, err, sizeof(err));
	ck_assert_msg(e != NULL, "%s", err);
	ck_assert_str_eq(loom_engine_spec_name(e), "none");
	loom_generation_params_init(&g);
	g.temp = 0;
	g.n_predict = 4;
	ck_assert_msg(loom_generate(e, "Hello", 5, &g, collect, &a, NULL, err, sizeof(err)) == 0,
		      "%s", err);
	ck_assert_int_gt(a.n, 0);
	loom_engine_close(e);
	p.struct_size = (uint32_t)offsetof(struct loom_engine_params, n_ctx);
	ck_assert_ptr_null(loom_engine_open(&p, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "struct_size"));
	g.struct_size = 4;
	ck_assert_int_eq(loom_generate(engine, "Hello", 5, &g, NULL, NULL, NULL, err, sizeof(err)),
			 LOOM_ERR_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "struct_size"));
}
END_TEST

/* A request through the same engine path as a server's: events in order,
 * one final event, the same tokens as loom_generate, prompt logits. */
struct events {
	int32_t ids[64];
	int n, n_final;
	enum loom_finish finish;
};

static void on_event(void *user, const struct loom_event *ev)
{
	struct events *c = user;

	if (ev->token >= 0 && c->n < 64)
		c->ids[c->n++] = ev->token;
	if (ev->finish != LOOM_FINISH_NONE) {
		c->n_final++;
		c->finish = ev->finish;
	}
}

START_TEST(requests_match_generate)
{
	struct loom_generation_params g;
	struct collected a = { .n = 0 };
	struct events ev = { .n = 0 };
	struct loom_request r;
	int32_t ids[16];
	int64_t n = loom_engine_tokenize(engine, "The capital of France is", 24, true, ids, 16);
	float *logits = malloc(sizeof(float) * (size_t)loom_engine_n_vocab(engine));
	char err[1024];
	uint64_t id;
	int steps = 0;

	ck_assert_ptr_nonnull(logits);
	loom_generation_params_init(&g);
	g.temp = 0;
	g.n_predict = 8;
	ck_assert_int_eq(loom_generate(engine, "The capital of France is", 24, &g, collect, &a,
				       NULL, err, sizeof(err)), 0);
	loom_request_init(&r);
	r.prompt = ids;
	r.n_prompt = (int32_t)n;
	r.n_predict = 8;
	r.sampling.temp = 0;
	r.prompt_logits = logits;
	r.on_event = on_event;
	r.user = &ev;
	ck_assert_msg(loom_submit(engine, &r, &id, err, sizeof(err)) == 0, "%s", err);
	while (ev.n_final == 0 && steps++ < 100)
		ck_assert_int_ge(loom_engine_step(engine), 0);
	ck_assert_int_eq(ev.n_final, 1);
	ck_assert_int_eq(ev.n, a.n);
	ck_assert_mem_eq(ev.ids, a.ids, sizeof(int32_t) * (size_t)a.n);
	/* greedy: the first token is the argmax of the prompt logits */
	for (int32_t i = 0; i < loom_engine_n_vocab(engine); i++)
		ck_assert(logits[i] <= logits[ev.ids[0]]);
	/* a strategy the engine did not load is refused by name */
	r.spec = "nosuch";
	ck_assert_int_eq(loom_submit(engine, &r, &id, err, sizeof(err)), LOOM_ERR_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "nosuch"));
	/* a request longer than the context is refused as such */
	r.spec = NULL;
	r.n_predict = 1000;
	ck_assert_int_eq(loom_submit(engine, &r, &id, err, sizeof(err)), LOOM_ERR_CONTEXT);
	free(logits);
}
END_TEST

/* all_logits: row i is what predicts token i + 1; the last row is the one
 * the first token is drawn from; chunking the prompt (n_batch 4) moves
 * values only by float rounding. */
static float *all_rows(int32_t n_batch, const int32_t *ids, int32_t n, float *first)
{
	struct loom_engine_params p;
	struct events ev = { .n = 0 };
	struct loom_request r;
	struct loom_engine *e;
	char err[1024];
	uint64_t id;
	float *rows;

	loom_engine_params_init(&p);
	p.model = model;
	p.n_ctx = 64;
	p.n_batch = n_batch;
	p.all_logits = true;
	e = loom_engine_open(&p, err, sizeof(err));
	ck_assert_msg(e != NULL, "%s", err);
	rows = malloc(sizeof(float) * (size_t)n * (size_t)loom_engine_n_vocab(e));
	ck_assert_ptr_nonnull(rows);
	loom_request_init(&r);
	r.prompt = ids;
	r.n_prompt = n;
	r.n_predict = 1;
	r.sampling.temp = 0;
	r.all_logits = rows;
	r.prompt_logits = first;
	r.on_event = on_event;
	r.user = &ev;
	ck_assert_msg(loom_submit(e, &r, &id, err, sizeof(err)) == 0, "%s", err);
	while (ev.n_final == 0)
		ck_assert_int_ge(loom_engine_step(e), 0);
	loom_engine_close(e);
	return rows;
}

START_TEST(all_logits_rows)
{
	const char *text = "The quick brown fox jumps over the lazy dog because it";
	int32_t ids[32], V = loom_engine_n_vocab(engine);
	int32_t n = (int32_t)loom_engine_tokenize(engine, text, strlen(text), true, ids, 32);
	float *first = malloc(sizeof(float) * (size_t)V);
	float *a, *b;
	double worst = 0.0;
	struct loom_request r;
	char err[256];
	uint64_t id;

	ck_assert_int_gt(n, 8);
	a = all_rows(64, ids, n, first);
	ck_assert_mem_eq(a + (size_t)(n - 1) * (size_t)V, first, sizeof(float) * (size_t)V);
	b = all_rows(4, ids, n, first);
	for (size_t i = 0; i < (size_t)n * (size_t)V; i++) {
		double d = fabs((double)a[i] - (double)b[i]);

		worst = d > worst ? d : worst;
	}
	ck_assert_msg(worst < 1e-3, "chunked rows differ by %g", worst);
	/* an engine opened without all_logits refuses such a request */
	loom_request_init(&r);
	r.prompt = ids;
	r.n_prompt = n;
	r.all_logits = a;
	ck_assert_int_eq(loom_submit(engine, &r, &id, err, sizeof(err)), LOOM_ERR_UNSUPPORTED);
	free(a);
	free(b);
	free(first);
}
END_TEST

/* gemm_input (0.6): sees each weight GEMM's input by the weight's name,
 * every token once, and changes nothing the model computes. */
struct observed {
	int64_t q_rows, q_cols, down_cols, calls;
	bool bad_name;
};

static void observe(void *user, const char *weight, const float *x, int64_t rows, int64_t cols)
{
	struct observed *o = user;

	o->calls++;
	if (!strcmp(weight, "blk.0.attn_q.weight")) {
		o->q_rows += rows;
		o->q_cols = cols;
		ck_assert(isfinite(x[rows * cols - 1]));
	} else if (!strcmp(weight, "blk.0.ffn_down.weight")) {
		o->down_cols = cols;
	} else if (strncmp(weight, "blk.", 4) && strcmp(weight, "token_embd.weight") &&
		   strcmp(weight, "output.weight")) {
		o->bad_name = true;
	}
}

START_TEST(gemm_input_observes)
{
	struct loom_engine_params p;
	struct loom_generation_params g;
	struct collected a = { .n = 0 }, b = { .n = 0 };
	struct observed o = { 0 };
	const char *prompt = "The capital of France is";
	struct loom_engine *e;
	char err[1024];

	loom_engine_params_init(&p);
	p.model = model;
	p.n_ctx = 256;
	p.gemm_input = observe;
	p.gemm_input_user = &o;
	e = loom_engine_open(&p, err, sizeof(err));
	ck_assert_msg(e != NULL, "%s", err);
	loom_generation_params_init(&g);
	g.temp = 0;
	g.n_predict = 8;
	ck_assert_int_eq(loom_generate(engine, prompt, strlen(prompt), &g, collect, &a, NULL,
				       err, sizeof(err)), 0);
	ck_assert_int_eq(loom_generate(e, prompt, strlen(prompt), &g, collect, &b, NULL,
				       err, sizeof(err)), 0);
	loom_engine_close(e);
	ck_assert_int_eq(a.n, b.n);
	ck_assert_mem_eq(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n);
	/* the prompt and every generated token but the last ran */
	ck_assert_int_eq(o.q_rows, 5 + b.n - 1);
	ck_assert_int_eq(o.q_cols, 576);
	ck_assert_int_eq(o.down_cols, 1536);
	ck_assert(!o.bad_name);
	ck_assert_int_gt(o.calls, 7 * 30);
}
END_TEST

/* ---- log-probabilities and hidden states ---- */

struct lp_events {
	int32_t ids[16];
	float lp[16];
	struct loom_token_logprob top[16][LOOM_MAX_TOP_LOGPROBS];
	int n, n_top, n_final;
	enum loom_finish finish;
	int32_t n_generated;
};

static void on_lp_event(void *user, const struct loom_event *ev)
{
	struct lp_events *c = user;

	if (ev->token >= 0 && c->n < 16) {
		c->ids[c->n] = ev->token;
		c->lp[c->n] = ev->logprob;
		c->n_top = ev->n_top;
		if (ev->n_top > 0)
			memcpy(c->top[c->n], ev->top, sizeof(*ev->top) * (size_t)ev->n_top);
		c->n++;
	}
	if (ev->finish != LOOM_FINISH_NONE) {
		c->n_final++;
		c->finish = ev->finish;
		c->n_generated = ev->n_generated;
	}
}

static void run_request(struct loom_engine *e, struct loom_request *r, struct lp_events *ev)
{
	char err[512];
	uint64_t id;
	int steps = 0;

	memset(ev, 0, sizeof(*ev));
	r->on_event = on_lp_event;
	r->user = ev;
	ck_assert_msg(loom_submit(e, r, &id, err, sizeof(err)) == 0, "%s", err);
	while (ev->n_final == 0 && steps++ < 200)
		ck_assert_int_ge(loom_engine_step(e), 0);
	ck_assert_int_eq(ev->n_final, 1);
}

/* log softmax of row at t, in double */
static double log_softmax_at(const float *row, int32_t n, int32_t t)
{
	double max = -INFINITY, sum = 0;

	for (int32_t i = 0; i < n; i++)
		max = row[i] > max ? row[i] : max;
	for (int32_t i = 0; i < n; i++)
		sum += exp((double)row[i] - max);
	return (double)row[t] - max - log(sum);
}

/* The first token's logprob is the log softmax of the logits it was drawn
 * from, before penalties and temperature; top_logprobs are sorted, start
 * at the greedy token and agree with the same row. */
START_TEST(logprobs_are_the_model_distribution)
{
	int32_t ids[16], V = loom_engine_n_vocab(engine);
	int32_t n = (int32_t)loom_engine_tokenize(engine, "The capital of France is", 24, true,
						  ids, 16);
	float *logits = malloc(sizeof(float) * (size_t)V);
	struct lp_events ev, ev2;
	struct loom_request r;
	char err[256];
	uint64_t id;

	ck_assert_ptr_nonnull(logits);
	loom_request_init(&r);
	r.prompt = ids;
	r.n_prompt = n;
	r.n_predict = 4;
	r.sampling.temp = 0;
	r.sampling.repeat_penalty = 1.3f; /* changes sampling, not the logprobs */
	r.logprobs = true;
	r.top_logprobs = 5;
	r.prompt_logits = logits;
	run_request(engine, &r, &ev);
	ck_assert_int_eq(ev.n, 4);
	ck_assert_int_eq(ev.n_top, 5);
	ck_assert_msg(fabs(ev.lp[0] - log_softmax_at(logits, V, ev.ids[0])) < 1e-5,
		      "logprob %g, log softmax %g", ev.lp[0], log_softmax_at(logits, V, ev.ids[0]));
	ck_assert_int_eq(ev.top[0][0].token, ev.ids[0]); /* greedy, no penalty yet */
	for (int k = 0; k < 5; k++) {
		ck_assert(fabs(ev.top[0][k].logprob -
			       log_softmax_at(logits, V, ev.top[0][k].token)) < 1e-5);
		if (k)
			ck_assert(ev.top[0][k].logprob <= ev.top[0][k - 1].logprob);
	}
	for (int i = 0; i < ev.n; i++) {
		ck_assert(ev.lp[i] <= 0 && isfinite(ev.lp[i]));
		ck_assert(ev.lp[i] <= ev.top[i][0].logprob);
	}
	/* repeatable, and the same without asking for the top tokens */
	r.top_logprobs = 0;
	run_request(engine, &r, &ev2);
	ck_assert_mem_eq(ev.ids, ev2.ids, sizeof(int32_t) * 4);
	ck_assert_mem_eq(ev.lp, ev2.lp, sizeof(float) * 4);
	ck_assert_int_eq(ev2.n_top, 0);
	/* a struct from before logprobs: the fields past its size are not read */
	r.top_logprobs = 5;
	r.hidden = (float *)&r; /* would be written to if it were read */
	r.struct_size = (uint32_t)offsetof(struct loom_request, logprobs);
	run_request(engine, &r, &ev2);
	ck_assert_int_eq(ev2.n, 4);
	ck_assert_mem_eq(ev.ids, ev2.ids, sizeof(int32_t) * 4);
	ck_assert_int_eq(ev2.n_top, 0);
	ck_assert(ev2.lp[0] == 0.0f);
	r.struct_size = sizeof(r);
	r.hidden = NULL;
	/* out of range */
	r.top_logprobs = LOOM_MAX_TOP_LOGPROBS + 1;
	ck_assert_int_eq(loom_submit(engine, &r, &id, err, sizeof(err)), LOOM_ERR_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "top_logprobs"));
	free(logits);
}
END_TEST

/* prompt_logprobs row i + 1 is the log softmax of all_logits row i at
 * prompt token i + 1; row 0 is NAN. */
START_TEST(prompt_logprobs_match_all_logits)
{
	const char *text = "The quick brown fox jumps over the lazy dog because it";
	int32_t ids[32], V = loom_engine_n_vocab(engine);
	int32_t n = (int32_t)loom_engine_tokenize(engine, text, strlen(text), true, ids, 32);
	float *first = malloc(sizeof(float) * (size_t)V), *rows;
	struct loom_token_logprob *plp = calloc((size_t)n * 4, sizeof(*plp));
	struct lp_events ev;
	struct loom_request r;

	ck_assert_ptr_nonnull(plp);
	rows = all_rows(64, ids, n, first);
	loom_request_init(&r);
	r.prompt = ids;
	r.n_prompt = n;
	r.n_predict = 1;
	r.sampling.temp = 0;
	r.logprobs = true;
	r.top_logprobs = 3;
	r.prompt_logprobs = plp;
	run_request(engine, &r, &ev);
	ck_assert(isnan(plp[0].logprob));
	ck_assert_int_eq(plp[0].token, ids[0]);
	for (int32_t i = 1; i < n; i++) {
		const struct loom_token_logprob *row = plp + (size_t)i * 4;
		double want = log_softmax_at(rows + (size_t)(i - 1) * V, V, ids[i]);

		ck_assert_int_eq(row[0].token, ids[i]);
		ck_assert_msg(fabs(row[0].logprob - want) < 1e-3, "row %d: %g vs %g", i,
			      row[0].logprob, want);
		ck_assert(row[1].logprob >= row[2].logprob && row[2].logprob >= row[3].logprob);
		ck_assert(row[0].logprob <= row[1].logprob + 1e-6);
	}
	free(rows);
	free(first);
	free(plp);
}
END_TEST

/* A hidden-state request sharing steps with a decoding one (its rows skip
 * the output layer, the other's do not): both get what they get alone. */
static void hidden_beside_decoding(const int32_t *ids, int32_t n, const float *want)
{
	int32_t D = loom_engine_n_embd(engine);
	float *h = calloc((size_t)n * (size_t)D, sizeof(float));
	struct lp_events alone, ev_dec, ev_hid;
	struct loom_request dec, hid;
	char err[256];
	uint64_t id;
	int steps = 0;

	loom_request_init(&dec);
	dec.prompt = ids;
	dec.n_prompt = n;
	dec.n_predict = 6;
	dec.sampling.temp = 0;
	run_request(engine, &dec, &alone);
	memset(&ev_dec, 0, sizeof(ev_dec));
	memset(&ev_hid, 0, sizeof(ev_hid));
	dec.on_event = on_lp_event;
	dec.user = &ev_dec;
	loom_request_init(&hid);
	hid.prompt = ids;
	hid.n_prompt = n;
	hid.hidden = h;
	hid.on_event = on_lp_event;
	hid.user = &ev_hid;
	ck_assert_msg(loom_submit(engine, &dec, &id, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_ge(loom_engine_step(engine), 0); /* dec's prompt; it decodes next */
	ck_assert_msg(loom_submit(engine, &hid, &id, err, sizeof(err)) == 0, "%s", err);
	while ((ev_dec.n_final == 0 || ev_hid.n_final == 0) && steps++ < 200)
		ck_assert_int_ge(loom_engine_step(engine), 0);
	ck_assert_int_eq(ev_dec.n, alone.n);
	ck_assert_mem_eq(ev_dec.ids, alone.ids, sizeof(int32_t) * (size_t)alone.n);
	for (size_t i = 0; i < (size_t)n * (size_t)D; i++)
		ck_assert_msg(fabsf(h[i] - want[i]) <= 1e-3f * (1.0f + fabsf(want[i])),
			      "hidden %zu: %g vs %g", i, h[i], want[i]);
	free(h);
}

/* hidden: the request ends after its prompt with no token; the rows are
 * finite, the same for the same prompt, and differ between positions. */
START_TEST(hidden_rows)
{
	int32_t ids[16], D = loom_engine_n_embd(engine);
	int32_t n = (int32_t)loom_engine_tokenize(engine, "The capital of France is", 24, true,
						  ids, 16);
	float *a = calloc((size_t)n * (size_t)D, sizeof(float));
	float *b = calloc((size_t)n * (size_t)D, sizeof(float));
	struct lp_events ev;
	struct loom_request r;

	ck_assert_int_gt(D, 0);
	ck_assert_int_eq(loom_engine_pooling(engine), LOOM_POOLING_MEAN);
	loom_request_init(&r);
	r.prompt = ids;
	r.n_prompt = n;
	r.hidden = a;
	run_request(engine, &r, &ev);
	ck_assert_int_eq(ev.finish, LOOM_FINISH_LENGTH);
	ck_assert_int_eq(ev.n, 0);
	ck_assert_int_eq(ev.n_generated, 0);
	r.hidden = b;
	run_request(engine, &r, &ev);
	ck_assert_mem_eq(a, b, sizeof(float) * (size_t)n * (size_t)D);
	for (size_t i = 0; i < (size_t)n * (size_t)D; i++)
		ck_assert(isfinite(a[i]));
	ck_assert(memcmp(a, a + D, sizeof(float) * (size_t)D) != 0);
	ck_assert(memcmp(a + (size_t)(n - 2) * D, a + (size_t)(n - 1) * D,
			 sizeof(float) * (size_t)D) != 0);
	hidden_beside_decoding(ids, n, a);
	free(a);
	free(b);
}
END_TEST

START_TEST(tokenize_counts)
{
	int32_t ids[16];
	int64_t n = loom_engine_tokenize(engine, "The capital of France is", 24, false, ids, 16);

	/* SmolLM2's vocabulary: "The", " capital", " of", " France", " is" */
	ck_assert_int_eq(n, 5);
	ck_assert_int_eq(loom_engine_tokenize(engine, "The capital", 11, false, NULL, 0), 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("api");
	TCase *plain = tcase_create("plain"), *with_model = tcase_create("model");
	SRunner *sr;
	int failed;

	model = getenv("LOOM_MODEL");
	tcase_add_test(plain, missing_model_is_named);
	suite_add_tcase(s, plain);
	if (model && access(model, R_OK) == 0) {
		tcase_add_unchecked_fixture(with_model, open_engine, close_engine);
		tcase_set_timeout(with_model, 300);
		tcase_add_test(with_model, greedy_is_repeatable_and_stoppable);
		tcase_add_test(with_model, context_overflow_is_refused);
		tcase_add_test(with_model, parallel_sequences_outgrow_context);
		tcase_add_test(with_model, tokenize_counts);
		tcase_add_test(with_model, older_structs_are_accepted);
		tcase_add_test(with_model, requests_match_generate);
		tcase_add_test(with_model, all_logits_rows);
		tcase_add_test(with_model, gemm_input_observes);
		tcase_add_test(with_model, logprobs_are_the_model_distribution);
		tcase_add_test(with_model, prompt_logprobs_match_all_logits);
		tcase_add_test(with_model, hidden_rows);
		tcase_add_test(with_model, unfinished_character_ends_with_replacement);
		suite_add_tcase(s, with_model);
	} else {
		printf("skip model checks: LOOM_MODEL (%s) not found\n", model ? model : "unset");
	}
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
