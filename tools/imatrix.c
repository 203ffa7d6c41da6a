/*
 * `loom imatrix` (docs/QUANTIZATION.md): runs a model over calibration text
 * through the normal engine path, watching every weight GEMM's input
 * (loom_engine_params.gemm_input), and saves per weight the mean of x_j^2
 * per input column (llama.cpp's importance matrix) and, with --hessian,
 * the mean of x x^T (what GPTQ needs).
 *
 * The text is tokenized without special tokens and cut into chunks of
 * -c tokens (the last partial one dropped); each chunk runs from an empty
 * context as one request, its first token replaced by BOS when the model
 * adds one (as llama-imatrix does). The output matrix (output.weight, or
 * token_embd.weight when tied) is left out, as llama-imatrix does by
 * default: only the rows that need logits reach it.
 *
 * Weights fed the same input (attn_q, attn_k, attn_v; ffn_gate, ffn_up)
 * share one Hessian: the first call of a step whose input equals the
 * previous call's links the two, and the file stores the matrix once.
 */
#include "imatrix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chunk.h"
#include "loom.h"

struct stat_acc {
	char *name;
	int64_t cols;
	int64_t n_tokens;
	double *sum;      /* [cols] sum of x_j^2 */
	float *h;         /* [cols][cols] lower triangle of sum x x^T, or NULL */
	int link;         /* the stat whose Hessian this one shares, or -1 */
};

struct collector {
	struct stat_acc *s;
	int n, cap;
	bool hessian;
	/* the previous call's input, to find weights fed the same one */
	float *prev;
	size_t prev_cap;
	int64_t prev_rows, prev_cols;
	int prev_stat;
	char error[512];
};

static int find_stat(struct collector *c, const char *name, int64_t cols)
{
	struct stat_acc *s;

	for (int i = 0; i < c->n; i++)
		if (!strcmp(c->s[i].name, name))
			return c->s[i].cols == cols ? i : -1;
	if (c->n == c->cap) {
		int cap = c->cap ? 2 * c->cap : 64;
		struct stat_acc *ns = realloc(c->s, sizeof(*ns) * (size_t)cap);

		if (!ns)
			return -1;
		c->s = ns;
		c->cap = cap;
	}
	s = &c->s[c->n];
	*s = (struct stat_acc){ .name = strdup(name), .cols = cols, .link = -1,
				.sum = calloc((size_t)cols, sizeof(double)) };
	if (!s->name || !s->sum) {
		free(s->name);
		free(s->sum);
		return -1;
	}
	return c->n++;
}

/* H (lower triangle) += x^T x over rows. */
static void add_outer(float *h, const float *x, int64_t rows, int64_t cols)
{
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * cols;

		for (int64_t i = 0; i < cols; i++) {
			float xi = xr[i];
			float *hi = h + i * cols;

			if (xi == 0.0f)
				continue;
			for (int64_t j = 0; j <= i; j++)
				hi[j] += xi * xr[j];
		}
	}
}

static bool same_as_prev(const struct collector *c, const float *x, int64_t rows, int64_t cols)
{
	return c->prev_stat >= 0 && c->prev_rows == rows && c->prev_cols == cols &&
	       !memcmp(c->prev, x, sizeof(float) * (size_t)(rows * cols));
}

static int remember(struct collector *c, int i, const float *x, int64_t rows, int64_t cols)
{
	size_t n = (size_t)(rows * cols);

	if (n > c->prev_cap) {
		float *np = realloc(c->prev, n * sizeof(float));

		if (!np)
			return -1;
		c->prev = np;
		c->prev_cap = n;
	}
	memcpy(c->prev, x, n * sizeof(float));
	c->prev_rows = rows;
	c->prev_cols = cols;
	c->prev_stat = i;
	return 0;
}

/* The Hessian of stat i: its own, or links it to the previous call's. */
static int accumulate_hessian(struct collector *c, int i, const float *x, int64_t rows,
			      int64_t cols)
{
	struct stat_acc *s = &c->s[i];
	bool same = same_as_prev(c, x, rows, cols);

	if (!s->h && s->link < 0 && same) {
		const struct stat_acc *p = &c->s[c->prev_stat];

		s->link = p->link >= 0 ? p->link : c->prev_stat;
	}
	if (s->link >= 0) {
		if (!same || (c->s[c->prev_stat].link != s->link && c->prev_stat != s->link)) {
			snprintf(c->error, sizeof(c->error),
				 "'%s' no longer gets the input of '%s' it got before", s->name,
				 c->s[s->link].name);
			return -1;
		}
		return 0;
	}
	if (!s->h && !(s->h = calloc((size_t)(cols * cols), sizeof(float)))) {
		snprintf(c->error, sizeof(c->error), "out of memory for the Hessian of '%s'", s->name);
		return -1;
	}
	add_outer(s->h, x, rows, cols);
	return remember(c, i, x, rows, cols);
}

static bool is_output(const char *name)
{
	return !strcmp(name, "output.weight") || !strcmp(name, "token_embd.weight");
}

static void on_gemm_input(void *user, const char *weight, const float *x, int64_t rows,
			  int64_t cols)
{
	struct collector *c = user;
	int i;

	if (c->error[0] || is_output(weight))
		return;
	i = find_stat(c, weight, cols);
	if (i < 0) {
		snprintf(c->error, sizeof(c->error), "'%s': out of memory, or inputs of two widths",
			 weight);
		return;
	}
	for (int64_t r = 0; r < rows; r++)
		for (int64_t j = 0; j < cols; j++)
			c->s[i].sum[j] += (double)x[r * cols + j] * (double)x[r * cols + j];
	c->s[i].n_tokens += rows;
	if (c->hessian)
		accumulate_hessian(c, i, x, rows, cols);
}

static void collector_free(struct collector *c)
{
	for (int i = 0; i < c->n; i++) {
		free(c->s[i].name);
		free(c->s[i].sum);
		free(c->s[i].h);
	}
	free(c->s);
	free(c->prev);
}

/* ---- running the chunks ---- */

static int32_t *tokenize_all(struct loom_engine *e, const char *text, size_t len,
			     int64_t *n, int32_t *bos, char *err, size_t errlen)
{
	const struct loom_tokenizer *t = loom_engine_tokenizer(e);
	int64_t need = loom_tokenize(t, text, len, false, false, NULL, 0);
	int32_t *ids, b[2];

	*bos = loom_tokenize(t, "", 0, true, false, b, 2) >= 1 ? b[0] : -1;
	if (need < 0) {
		snprintf(err, errlen, "the text could not be tokenized");
		return NULL;
	}
	ids = malloc(sizeof(int32_t) * (size_t)(need ? need : 1));
	if (!ids) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	*n = loom_tokenize(t, text, len, false, false, ids, need);
	return ids;
}

static int run_all(struct loom_engine *e, struct collector *c, const int32_t *ids,
		   int32_t n_chunks, int32_t n_ctx, int32_t bos, char *err, size_t errlen)
{
	int32_t *chunk = malloc(sizeof(int32_t) * (size_t)n_ctx);
	bool tty = isatty(STDERR_FILENO);
	int rc = 0;

	if (!chunk) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (int32_t k = 0; k < n_chunks && !rc; k++) {
		memcpy(chunk, ids + (size_t)k * (size_t)n_ctx, sizeof(int32_t) * (size_t)n_ctx);
		if (bos >= 0)
			chunk[0] = bos;
		rc = loom_tool_run_chunk(e, chunk, n_ctx, NULL, err, errlen);
		if (!rc && c->error[0]) {
			snprintf(err, errlen, "%s", c->error);
			rc = -1;
		}
		if (tty)
			fprintf(stderr, "\r\033[Kloom imatrix: chunk %d/%d", k + 1, n_chunks);
	}
	if (tty)
		fprintf(stderr, "\r\033[K");
	free(chunk);
	return rc;
}

/* ---- saving ---- */

/* Mirrors each own Hessian's lower triangle and divides by the tokens. */
static void finish_hessian(struct stat_acc *s)
{
	for (int64_t i = 0; i < s->cols; i++) {
		for (int64_t j = 0; j < i; j++) {
			s->h[i * s->cols + j] /= (float)s->n_tokens;
			s->h[j * s->cols + i] = s->h[i * s->cols + j];
		}
		s->h[i * s->cols + i] /= (float)s->n_tokens;
	}
}

static int save(struct collector *c, const char *path, bool force, int32_t n_chunks,
		const char *dataset, char *err, size_t errlen)
{
	struct loom_imatrix_stat *st = calloc(c->n ? (size_t)c->n : 1, sizeof(*st));
	float **mean = calloc(c->n ? (size_t)c->n : 1, sizeof(*mean));
	int rc = -1;

	if (!st || !mean) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (int i = 0; i < c->n; i++) {
		struct stat_acc *s = &c->s[i];

		mean[i] = malloc(sizeof(float) * (size_t)s->cols);
		if (!mean[i]) {
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		for (int64_t j = 0; j < s->cols; j++)
			mean[i][j] = (float)(s->sum[j] / (double)(s->n_tokens ? s->n_tokens : 1));
		if (s->h && s->n_tokens)
			finish_hessian(s);
		st[i] = (struct loom_imatrix_stat){ .name = s->name, .cols = s->cols,
			.n_tokens = s->n_tokens, .mean_sq = mean[i],
			.hessian = s->link >= 0 ? c->s[s->link].h : s->h };
	}
	rc = loom_imatrix_save(path, force ? LOOM_WRITE_FORCE : 0, st, (size_t)c->n, n_chunks, dataset, err, errlen);
out:
	for (int i = 0; mean && i < c->n; i++)
		free(mean[i]);
	free(mean);
	free(st);
	return rc;
}

static struct loom_engine *open_engine(const struct loom_options *o, struct collector *c,
				       int32_t n_ctx, char *err, size_t errlen)
{
	struct loom_engine_params ep;

	loom_options_engine_params(o, &ep);
	ep.n_ctx = n_ctx + 1;
	ep.n_batch = n_ctx;
	ep.prefix_cache = -1; /* every chunk runs whole */
	ep.gemm_input = on_gemm_input;
	ep.gemm_input_user = c;
	return loom_engine_open(&ep, err, errlen);
}

/* The base name of a path, as llama-imatrix records its dataset. */
static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s ? s + 1 : path;
}

int loom_imatrix_main(const struct loom_options *o, const char *text, size_t len, char *err,
		      size_t errlen)
{
	struct collector c = { .hessian = o->hessian, .prev_stat = -1 };
	int32_t n_ctx = o->ctx_given ? o->n_ctx : 512, bos;
	int64_t n_ids = 0, n_chunks;
	int32_t *ids = NULL;
	struct loom_engine *e;
	struct timespec t0, t1;
	int rc = -1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (n_ctx < 2) {
		snprintf(err, errlen, "-c %d: a chunk needs at least 2 tokens", n_ctx);
		return -1;
	}
	e = open_engine(o, &c, n_ctx, err, errlen);
	if (!e)
		return -1;
	if (loom_engine_n_ctx(e) < n_ctx + 1) {
		snprintf(err, errlen, "-c %d is above the model's trained context", n_ctx);
		goto out;
	}
	ids = tokenize_all(e, text, len, &n_ids, &bos, err, errlen);
	if (!ids)
		goto out;
	n_chunks = n_ids / n_ctx;
	if (o->n_chunks > 0 && n_chunks > o->n_chunks)
		n_chunks = o->n_chunks;
	if (n_chunks < 1) {
		snprintf(err, errlen, "the text has %lld tokens, fewer than one chunk of %d (-c)",
			 (long long)n_ids, n_ctx);
		goto out;
	}
	if (run_all(e, &c, ids, (int32_t)n_chunks, n_ctx, bos, err, errlen) ||
	    save(&c, o->imatrix_out, o->force, (int32_t)n_chunks, base_name(o->prompt_file), err,
		 errlen))
		goto out;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("loom imatrix: wrote %s: %d weights, %lld chunks of %d tokens%s, %.1f s\n",
	       o->imatrix_out, c.n, (long long)n_chunks, n_ctx,
	       c.hessian ? ", with Hessians" : "",
	       (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
	rc = 0;
out:
	free(ids);
	loom_engine_close(e);
	collector_free(&c);
	return rc;
}

/* ---- --show ---- */

int loom_imatrix_show(const char *path, char *err, size_t errlen)
{
	struct loom_imatrix *im = loom_imatrix_load(path, LOOM_IMATRIX_HESSIAN, err, errlen);

	if (!im)
		return -1;
	printf("%s: %zu entries, %d chunks, dataset '%s'%s\n", path, loom_imatrix_count(im),
	       loom_imatrix_chunks(im), loom_imatrix_dataset(im),
	       loom_imatrix_has_hessian(im) ? ", Hessians" : "");
	for (size_t i = 0; i < loom_imatrix_count(im); i++) {
		const struct loom_imatrix_entry *en = loom_imatrix_at(im, i);
		double sum = 0.0, max = 0.0, trace = 0.0;

		for (int64_t j = 0; j < en->cols; j++) {
			sum += en->mean_sq[j];
			max = fmax(max, en->mean_sq[j]);
			if (en->hessian)
				trace += en->hessian[j * en->cols + j];
		}
		printf("%s cols %lld tokens %lld mean %.9g max %.9g", en->name,
		       (long long)en->cols, (long long)en->n_tokens, sum / (double)en->cols, max);
		if (en->hessian)
			printf(" hessian_trace %.9g", trace);
		printf("\n");
	}
	loom_imatrix_free(im);
	return 0;
}
