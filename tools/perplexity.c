/*
 * `loom perplexity`: a model's perplexity over a text and, against a base
 * run saved earlier, the KL divergence of its next-token distributions, as
 * llama-perplexity (--kl-divergence) reports them.
 *
 * The text is tokenized once, without special tokens, and cut into chunks
 * of n_ctx tokens (the last partial chunk is dropped). Each chunk starts
 * from an empty context, with BOS in its first position when the model
 * adds one, and runs as one engine request with all_logits. Its second
 * half is scored: the logits after position i (n_ctx/2 <= i < n_ctx - 1)
 * predict token i + 1. Perplexity is exp of the mean negative
 * log-likelihood over every scored position. The engine runs batch
 * invariant, so every position goes through the arithmetic of decoding
 * (in cpu.so's fast mode: the 8-bit integer kernels), not a prefill GEMM;
 * --prefill-kernels runs it without batch invariance, so the chunk goes
 * through the backend's prefill GEMM instead (its quality measured).
 *
 * --save-logits FILE writes the tokens and, for every scored position, the
 * log-probabilities over the vocabulary as IEEE half floats:
 *   "LOOMKLD1", u32 n_vocab, u32 n_ctx, u32 n_chunks, u32 0, then per
 *   chunk: n_ctx i32 tokens, (n_ctx - 1 - n_ctx/2) x n_vocab f16 log-probs.
 * --kl-base FILE reads such a file (same model vocabulary, text and n_ctx)
 * and reports, per scored position, KL(base || this run): the mean, the
 * 99th percentile, and how often both put the same token on top.
 */
#include "perplexity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "loom.h"

#define MAGIC "LOOMKLD1"

struct ppl {
	struct loom_engine *e;
	int32_t n_vocab, n_ctx, first; /* scored positions: [first, n_ctx - 1) */
	int32_t *ids;                  /* the whole text */
	int64_t n_ids;
	int32_t n_chunks;
	float *logits;                 /* n_ctx x n_vocab, one chunk */
	double *lp;                    /* n_vocab log-probs of one position */
	_Float16 *half;                /* n_vocab, to and from the files */
	double nll, nll2;              /* sums over scored positions */
	int64_t n_scored;
	FILE *save, *base;
	struct loom_outfile *save_out; /* --save-logits, committed on success */
	/* --kl-base */
	double *kl;                    /* one per scored position */
	double base_nll;
	int64_t top1_same;
};

static int32_t scored_per_chunk(const struct ppl *p)
{
	return p->n_ctx - 1 - p->first;
}

/* lp[] = log softmax(x[0..n)), in double. */
static void log_softmax(const float *x, int32_t n, double *lp)
{
	double max = x[0], sum = 0.0;

	for (int32_t i = 1; i < n; i++)
		if (x[i] > max)
			max = x[i];
	for (int32_t i = 0; i < n; i++)
		sum += exp((double)x[i] - max);
	for (int32_t i = 0; i < n; i++)
		lp[i] = (double)x[i] - max - log(sum);
}

static int32_t argmax_d(const double *x, int32_t n)
{
	int32_t best = 0;

	for (int32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* ---- the base file ---- */

static int write_header(struct ppl *p, char *err, size_t errlen)
{
	uint32_t h[4] = { (uint32_t)p->n_vocab, (uint32_t)p->n_ctx, (uint32_t)p->n_chunks, 0 };

	if (fwrite(MAGIC, 1, 8, p->save) != 8 || fwrite(h, sizeof(h), 1, p->save) != 1) {
		snprintf(err, errlen, "--save-logits: write failed");
		return -1;
	}
	return 0;
}

static int read_header(struct ppl *p, const char *path, char *err, size_t errlen)
{
	char magic[8];
	uint32_t h[4];

	if (fread(magic, 1, 8, p->base) != 8 || memcmp(magic, MAGIC, 8) ||
	    fread(h, sizeof(h), 1, p->base) != 1) {
		snprintf(err, errlen, "%s: not a file of loom perplexity --save-logits", path);
		return -1;
	}
	if (h[0] != (uint32_t)p->n_vocab || h[1] != (uint32_t)p->n_ctx ||
	    h[2] < (uint32_t)p->n_chunks) {
		snprintf(err, errlen, "%s: saved with vocabulary %u, context %u, %u chunks; this run has %d, %d, %d",
			 path, h[0], h[1], h[2], p->n_vocab, p->n_ctx, p->n_chunks);
		return -1;
	}
	return 0;
}

/* The base's tokens for a chunk must be this run's. */
static int check_base_tokens(struct ppl *p, const int32_t *toks, char *err, size_t errlen)
{
	int32_t *b = malloc(sizeof(int32_t) * (size_t)p->n_ctx);
	int rc = 0;

	if (!b || fread(b, sizeof(int32_t), (size_t)p->n_ctx, p->base) != (size_t)p->n_ctx) {
		snprintf(err, errlen, "--kl-base: file truncated");
		rc = -1;
	} else if (memcmp(b, toks, sizeof(int32_t) * (size_t)p->n_ctx)) {
		snprintf(err, errlen, "--kl-base: the base run tokenized another text (or another tokenizer)");
		rc = -1;
	}
	free(b);
	return rc;
}

/* KL(base || this) at one position; lp holds this run's log-probs. */
static int compare_position(struct ppl *p, char *err, size_t errlen)
{
	double z = 0.0, kl = 0.0, bmax = -INFINITY;
	int32_t btop = 0, V = p->n_vocab;

	if (fread(p->half, sizeof(_Float16), (size_t)V, p->base) != (size_t)V) {
		snprintf(err, errlen, "--kl-base: file truncated");
		return -1;
	}
	for (int32_t i = 0; i < V; i++) {
		double b = (double)p->half[i];

		z += exp(b);
		if (b > bmax)
			bmax = b, btop = i;
	}
	/* renormalize: half floats do not sum to exactly 1 */
	z = log(z);
	for (int32_t i = 0; i < V; i++) {
		double b = (double)p->half[i] - z;

		kl += exp(b) * (b - p->lp[i]);
	}
	p->kl[p->n_scored] = kl > 0.0 ? kl : 0.0;
	p->top1_same += btop == argmax_d(p->lp, V);
	return 0;
}

/* ---- one chunk ---- */

/* Scores the second half of a chunk whose logits are in p->logits. */
static int score_chunk(struct ppl *p, const int32_t *toks, char *err, size_t errlen)
{
	int32_t V = p->n_vocab;
	double nll = 0.0;

	for (int32_t i = p->first; i < p->n_ctx - 1; i++) {
		double x;

		log_softmax(p->logits + (size_t)i * (size_t)V, V, p->lp);
		x = -p->lp[toks[i + 1]];
		nll += x;
		p->nll += x;
		p->nll2 += x * x;
		if (p->save) {
			for (int32_t v = 0; v < V; v++)
				p->half[v] = (_Float16)p->lp[v];
			if (fwrite(p->half, sizeof(_Float16), (size_t)V, p->save) != (size_t)V) {
				snprintf(err, errlen, "--save-logits: write failed");
				return -1;
			}
		}
		if (p->base && compare_position(p, err, errlen))
			return -1;
		if (p->base)
			p->base_nll -= (double)p->half[toks[i + 1]];
		p->n_scored++;
	}
	printf("[%d] %.4f\n", (int)(p->n_scored / scored_per_chunk(p)),
	       exp(nll / scored_per_chunk(p)));
	fflush(stdout);
	return 0;
}

static int run_chunks(struct ppl *p, char *err, size_t errlen)
{
	int32_t *toks = malloc(sizeof(int32_t) * (size_t)p->n_ctx);
	const struct loom_tokenizer *t = loom_engine_tokenizer(p->e);
	int32_t bos = loom_tokenizer_bos(t), probe[4];
	bool add_bos = loom_tokenize(t, "", 0, true, false, probe, 4) >= 1 && probe[0] == bos;
	int rc = 0;

	if (!toks) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (int32_t c = 0; c < p->n_chunks && !rc; c++) {
		memcpy(toks, p->ids + (size_t)c * (size_t)p->n_ctx, sizeof(int32_t) * (size_t)p->n_ctx);
		if (add_bos && bos >= 0)
			toks[0] = bos;
		if (p->save && fwrite(toks, sizeof(int32_t), (size_t)p->n_ctx, p->save) != (size_t)p->n_ctx) {
			snprintf(err, errlen, "--save-logits: write failed");
			rc = -1;
			break;
		}
		if (p->base && check_base_tokens(p, toks, err, errlen))
			rc = -1;
		if (!rc)
			rc = loom_tool_run_chunk(p->e, toks, p->n_ctx, p->logits, err, errlen);
		if (!rc)
			rc = score_chunk(p, toks, err, errlen);
	}
	free(toks);
	return rc;
}

/* ---- results ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void report(struct ppl *p)
{
	double n = (double)p->n_scored, mean = p->nll / n;
	double var = p->nll2 / n - mean * mean, se = n > 1 && var > 0 ? sqrt(var / (n - 1)) : 0.0;
	double kl = 0.0;

	printf("perplexity: %.4f (mean NLL %.6f +/- %.6f over %lld positions, %d chunks of %d)\n",
	       exp(mean), mean, se, (long long)p->n_scored, p->n_chunks, p->n_ctx);
	if (!p->base)
		return;
	for (int64_t i = 0; i < p->n_scored; i++)
		kl += p->kl[i];
	qsort(p->kl, (size_t)p->n_scored, sizeof(double), cmp_double);
	printf("base perplexity: %.4f\n", exp(p->base_nll / n));
	printf("KL divergence: mean %.6f, 99th percentile %.6f, max %.6f\n", kl / n,
	       p->kl[(int64_t)(0.99 * (double)(p->n_scored - 1))], p->kl[p->n_scored - 1]);
	printf("top-1 agreement: %.2f%% (%lld of %lld)\n", 100.0 * (double)p->top1_same / n,
	       (long long)p->top1_same, (long long)p->n_scored);
}

/* ---- set-up ---- */

static int tokenize_text(struct ppl *p, const char *text, size_t len, char *err, size_t errlen)
{
	const struct loom_tokenizer *t = loom_engine_tokenizer(p->e);
	int64_t need = loom_tokenize(t, text, len, false, false, NULL, 0);

	if (need < 0) {
		snprintf(err, errlen, "the text could not be tokenized");
		return -1;
	}
	p->ids = malloc(sizeof(int32_t) * (size_t)(need ? need : 1));
	if (!p->ids) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	p->n_ids = loom_tokenize(t, text, len, false, false, p->ids, need);
	return 0;
}

static int plan(struct ppl *p, int max_chunks, char *err, size_t errlen)
{
	int64_t n = p->n_ids / p->n_ctx;

	if (max_chunks > 0 && n > max_chunks)
		n = max_chunks;
	if (n < 1) {
		snprintf(err, errlen, "the text has %lld tokens, fewer than one chunk of %d (-c)",
			 (long long)p->n_ids, p->n_ctx);
		return -1;
	}
	p->n_chunks = (int32_t)n;
	p->first = p->n_ctx / 2;
	p->logits = malloc(sizeof(float) * (size_t)p->n_ctx * (size_t)p->n_vocab);
	p->lp = malloc(sizeof(double) * (size_t)p->n_vocab);
	p->half = malloc(sizeof(_Float16) * (size_t)p->n_vocab);
	p->kl = malloc(sizeof(double) * (size_t)n * (size_t)scored_per_chunk(p));
	if (!p->logits || !p->lp || !p->half || !p->kl) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

static struct loom_engine *open_engine(const struct loom_options *o, int32_t n_ctx,
				       char *err, size_t errlen)
{
	struct loom_engine_params ep;

	loom_options_engine_params(o, &ep);
	ep.n_ctx = n_ctx + 1; /* the chunk and the one token each request draws */
	ep.n_batch = n_ctx;
	ep.all_logits = true;
	/* every position through the kernels decode uses (a backend's fast
	 * mode may keep f32 GEMM for prefill otherwise), so the figures are
	 * those of generation; --prefill-kernels: those of prompt processing */
	ep.batch_invariant = !o->prefill_kernels;
	ep.prefix_cache = -1;
	return loom_engine_open(&ep, err, errlen);
}

static int open_files(struct ppl *p, const struct loom_options *o, char *err, size_t errlen)
{
	if (o->save_logits[0] && o->kl_base[0]) {
		snprintf(err, errlen, "--save-logits and --kl-base: one or the other");
		return -1;
	}
	if (o->save_logits[0]) {
		p->save_out = loom_outfile_open(o->save_logits, o->force ? LOOM_WRITE_FORCE : 0, err,
						errlen);
		if (!p->save_out)
			return -1;
		p->save = loom_outfile_stream(p->save_out);
		return write_header(p, err, errlen);
	}
	if (o->kl_base[0] && !(p->base = fopen(o->kl_base, "rb"))) {
		snprintf(err, errlen, "%s: cannot open", o->kl_base);
		return -1;
	}
	return o->kl_base[0] ? read_header(p, o->kl_base, err, errlen) : 0;
}

static void ppl_free(struct ppl *p)
{
	loom_outfile_discard(p->save_out); /* NULL once committed */
	if (p->base)
		fclose(p->base);
	loom_engine_close(p->e);
	free(p->ids);
	free(p->logits);
	free(p->lp);
	free(p->half);
	free(p->kl);
}

int loom_perplexity(const struct loom_options *o, const char *text, size_t len, char *err,
		    size_t errlen)
{
	struct ppl p = { .n_ctx = o->ctx_given ? o->n_ctx : 512 };
	int rc = -1;

	if (p.n_ctx < 4) {
		snprintf(err, errlen, "-c %d: a chunk needs at least 4 tokens", p.n_ctx);
		return -1;
	}
	p.e = open_engine(o, p.n_ctx, err, errlen);
	if (!p.e)
		return -1;
	if (loom_engine_n_ctx(p.e) < p.n_ctx + 1) {
		snprintf(err, errlen, "-c %d is above the model's trained context", p.n_ctx);
		goto out;
	}
	p.n_vocab = loom_engine_n_vocab(p.e);
	if (tokenize_text(&p, text, len, err, errlen) || plan(&p, o->n_chunks, err, errlen) ||
	    open_files(&p, o, err, errlen) || run_chunks(&p, err, errlen))
		goto out;
	if (p.save_out) {
		rc = loom_outfile_commit(p.save_out, err, errlen);
		p.save_out = NULL;
		if (rc)
			goto out;
	}
	report(&p);
	rc = 0;
out:
	ppl_free(&p);
	return rc;
}
