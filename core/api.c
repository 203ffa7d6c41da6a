/* The public API (include/loom.h) over the core's internals. */
#include "loom.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/gguf.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/spec.h"
#include "text/tokenizer.h"

struct loom_engine {
	struct gguf_file *f;
	struct loom_tokenizer *tok;
	struct loom_model *m;
	struct loom_session *s;
	struct loom_spec *spec; /* NULL: plain decoding */
};

void loom_engine_params_init(struct loom_engine_params *p)
{
	*p = (struct loom_engine_params){ .struct_size = sizeof(*p), .backend = "cpu.so" };
}

/* The speculative strategy the parameters name, if any. */
static int open_spec(struct loom_engine *e, const struct loom_engine_params *p,
		     const struct loom_model_params *mp, char *err, size_t errlen)
{
	struct loom_spec_config c;
	bool off;

	loom_spec_config_defaults(&c);
	c.plugin = p->spec;
	if (p->spec_min_draft > 0)
		c.min_draft = p->spec_min_draft;
	if (p->spec_max_draft > 0)
		c.max_draft = p->spec_max_draft;
	if (c.min_draft > c.max_draft && p->spec_max_draft <= 0)
		c.max_draft = c.min_draft;
	if (p->spec_ngram_min > 0)
		c.ngram_min = p->spec_ngram_min;
	if (p->spec_ngram_max > 0)
		c.ngram_max = p->spec_ngram_max;
	if (c.ngram_min > c.ngram_max && p->spec_ngram_max <= 0)
		c.ngram_max = c.ngram_min;
	c.draft_model = p->spec_draft_model;
	c.layers = p->spec_layers > 0 ? p->spec_layers : 0;
	e->spec = loom_spec_open(&c, e->s, e->tok, mp, &off, err, errlen);
	return e->spec || off ? 0 : -1;
}

struct loom_engine *loom_engine_open(const struct loom_engine_params *p,
				     char *err, size_t errlen)
{
	struct loom_model_params mp = { .backend = p->backend ? p->backend : "cpu.so",
		.n_threads = p->n_threads, .progress = p->progress };
	struct loom_engine *e = calloc(1, sizeof(*e));
	char why[2048];
	int32_t n_ctx;

	if (!e) {
		loom_seterr(err, errlen, "out of memory");
		return NULL;
	}
	if (p->struct_size < sizeof(*p) || !p->model) {
		loom_seterr(err, errlen, "engine parameters: struct_size or model missing");
		goto out_free;
	}
	e->f = gguf_open(p->model, why, sizeof(why));
	if (!e->f) {
		loom_seterr(err, errlen, "%s: %s", p->model, why);
		goto out_free;
	}
	e->tok = loom_tokenizer_from_gguf(e->f, err, errlen);
	if (!e->tok)
		goto out_free;
	e->m = loom_model_load(e->f, &mp, err, errlen);
	if (!e->m)
		goto out_free;
	n_ctx = p->n_ctx > 0 ? p->n_ctx : 4096;
	if (n_ctx > e->m->hp.n_ctx_train)
		n_ctx = (int32_t)e->m->hp.n_ctx_train;
	e->s = loom_session_new(e->m, n_ctx, p->n_batch > 0 ? p->n_batch : 256, err, errlen);
	if (!e->s || open_spec(e, p, &mp, err, errlen))
		goto out_free;
	return e;
out_free:
	loom_engine_close(e);
	return NULL;
}

void loom_engine_close(struct loom_engine *e)
{
	if (!e)
		return;
	loom_spec_free(e->spec);
	loom_session_free(e->s);
	loom_model_free(e->m);
	loom_tokenizer_free(e->tok);
	gguf_close(e->f);
	free(e);
}

int32_t loom_engine_n_vocab(const struct loom_engine *e)
{
	return (int32_t)e->m->hp.n_vocab;
}

int32_t loom_engine_n_ctx(const struct loom_engine *e)
{
	return e->s->n_ctx;
}

const char *loom_engine_backend_name(const struct loom_engine *e)
{
	return e->m->be->ops->name;
}

const char *loom_engine_spec_name(const struct loom_engine *e)
{
	return e->spec ? loom_spec_name(e->spec) : "none";
}

int64_t loom_engine_tokenize(const struct loom_engine *e, const char *text,
			     size_t len, bool add_special, int32_t *out, int64_t cap)
{
	return loom_tokenize(e->tok, text, len, add_special, add_special, out, cap);
}

void loom_generation_params_init(struct loom_generation_params *g)
{
	struct loom_sampler_params sp;

	loom_sampler_defaults(&sp);
	*g = (struct loom_generation_params){
		.struct_size = sizeof(*g), .n_predict = 128, .add_special = true,
		.temp = sp.temp, .top_k = sp.top_k, .top_p = sp.top_p, .min_p = sp.min_p,
		.repeat_penalty = sp.repeat_penalty,
		.presence_penalty = sp.presence_penalty,
		.frequency_penalty = sp.frequency_penalty,
		.repeat_last_n = sp.penalty_last_n, .seed = sp.seed,
	};
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Tokenizes the prompt into a history buffer with room for n_predict more. */
static int32_t *prompt_history(struct loom_engine *e, const char *prompt, size_t len,
			       const struct loom_generation_params *g, int64_t *n,
			       char *err, size_t errlen)
{
	int64_t need = loom_engine_tokenize(e, prompt, len, g->add_special, NULL, 0);
	int32_t *hist;

	if (need < 0) {
		loom_seterr(err, errlen, "the prompt could not be tokenized");
		return NULL;
	}
	if (need == 0) {
		loom_seterr(err, errlen, "the prompt is empty after tokenization");
		return NULL;
	}
	if (g->n_predict < 0 || need + g->n_predict > e->s->n_ctx) {
		loom_seterr(err, errlen, "prompt (%lld tokens) + n_predict (%d) exceeds the context (%d)",
			(long long)need, g->n_predict, e->s->n_ctx);
		return NULL;
	}
	hist = malloc(sizeof(int32_t) * (size_t)(need + g->n_predict + 1));
	if (!hist) {
		loom_seterr(err, errlen, "out of memory");
		return NULL;
	}
	*n = loom_engine_tokenize(e, prompt, len, g->add_special, hist, need);
	return hist;
}

static struct loom_sampler *make_sampler(const struct loom_engine *e,
					 const struct loom_generation_params *g,
					 char *err, size_t errlen)
{
	struct loom_sampler_params sp = {
		.temp = g->temp, .top_k = g->top_k, .top_p = g->top_p, .min_p = g->min_p,
		.repeat_penalty = g->repeat_penalty, .presence_penalty = g->presence_penalty,
		.frequency_penalty = g->frequency_penalty, .penalty_last_n = g->repeat_last_n,
		.seed = g->seed,
	};

	return loom_sampler_new(&sp, (int32_t)e->m->hp.n_vocab, err, errlen);
}

struct emitter {
	struct loom_engine *e;
	struct loom_detok dt;
	loom_token_fn on_token;
	void *user;
};

/* Speculative loop's emit: 1 at end of generation (not reported), 2 when
 * the caller asks to stop, 0 to go on. */
static int emit_token(void *user, int32_t t)
{
	struct emitter *em = user;
	char piece[512];
	int len;

	if (loom_tokenizer_is_eog(em->e->tok, t))
		return 1;
	len = loom_detokenize(em->e->tok, &em->dt, t, piece, sizeof(piece));
	if (em->on_token && em->on_token(em->user, t, piece, len > 0 ? (size_t)len : 0))
		return 2;
	return 0;
}

static int64_t decode_spec(struct loom_engine *e, struct loom_sampler *smp,
			   const struct loom_generation_params *g, int32_t *hist,
			   int64_t n_hist, loom_token_fn on_token, void *user,
			   struct loom_generation_stats *st, char *err, size_t errlen)
{
	struct emitter em = { .e = e, .dt = { .first = true }, .on_token = on_token,
		.user = user };
	struct loom_spec_stats ss;
	int64_t made;

	made = loom_spec_decode(e->spec, smp, g->temp <= 0.0f, g->seed, hist, n_hist,
				n_hist + g->n_predict + 1, g->n_predict, emit_token, &em, &ss,
				err, errlen);
	st->spec_steps = ss.n_steps;
	st->spec_drafted = ss.n_drafted;
	st->spec_accepted = ss.n_accepted;
	return made;
}

/* The decode loop: sample, report, feed back. Returns tokens made or -1. */
static int64_t decode(struct loom_engine *e, struct loom_sampler *smp, int32_t *hist,
		      int64_t n_hist, int32_t n_predict, loom_token_fn on_token,
		      void *user, char *err, size_t errlen)
{
	struct loom_detok dt = { .first = true };
	char piece[512];
	int64_t made = 0;

	while (made < n_predict) {
		int32_t t = loom_sampler_sample(smp, e->s->logits, hist, n_hist);
		int len;

		if (t < 0 || loom_tokenizer_is_eog(e->tok, t))
			break;
		hist[n_hist++] = t;
		made++;
		len = loom_detokenize(e->tok, &dt, t, piece, sizeof(piece));
		if (on_token && on_token(user, t, piece, len > 0 ? (size_t)len : 0))
			break;
		if (made < n_predict && loom_session_eval(e->s, &t, 1, err, errlen))
			return -1;
	}
	return made;
}

int loom_generate(struct loom_engine *e, const char *prompt, size_t len,
		  const struct loom_generation_params *g, loom_token_fn on_token,
		  void *user, struct loom_generation_stats *stats, char *err,
		  size_t errlen)
{
	struct loom_generation_stats st = { 0 };
	struct loom_sampler *smp = NULL;
	int32_t *hist;
	double t0, t1;
	int rc = -1;

	if (!g || g->struct_size < sizeof(*g)) {
		loom_seterr(err, errlen, "generation parameters: struct_size missing");
		return -1;
	}
	hist = prompt_history(e, prompt, len, g, &st.n_prompt, err, errlen);
	if (!hist)
		return -1;
	smp = make_sampler(e, g, err, errlen);
	if (!smp)
		goto out;
	loom_session_reset(e->s);
	t0 = now_s();
	if (loom_session_eval(e->s, hist, (int32_t)st.n_prompt, err, errlen))
		goto out;
	t1 = now_s();
	st.prompt_seconds = t1 - t0;
	if (g->prompt_logits)
		memcpy(g->prompt_logits, e->s->logits, sizeof(float) * (size_t)e->m->hp.n_vocab);
	if (e->spec)
		st.n_generated = decode_spec(e, smp, g, hist, st.n_prompt, on_token, user, &st,
					     err, errlen);
	else
		st.n_generated = decode(e, smp, hist, st.n_prompt, g->n_predict, on_token,
					user, err, errlen);
	st.generate_seconds = now_s() - t1;
	if (st.n_generated >= 0)
		rc = 0;
	if (stats)
		*stats = st;
out:
	loom_sampler_free(smp);
	free(hist);
	return rc;
}
