/*
 * gptq: GPTQ (Frantar et al., 2022), column-by-column quantization with
 * error compensation through the calibration Hessian H = E[x x^T].
 *
 * Per tensor: H is damped (1 % of its mean diagonal added; dead columns,
 * whose diagonal is 0, get 1), and U, the upper Cholesky factor of H^-1
 * (H^-1 = U^T U), is computed as P L^-1 P with L L^T = P H P and P the
 * reversal, which needs no explicit inverse. Columns are taken in GPTQ's
 * "act order", largest diag(H) first (H is permuted to that order before
 * the factoring). Then each row is independent: when the first column of
 * a block of the target format is taken, the block's grid (scales, mins)
 * is fitted to the row's current values there, weighted by diag(H)
 * (qgrid.h); each column is rounded to its grid and its error, divided by
 * U[k][k], is spread over the columns still
 * to come along U's row k. A tensor the calibration file has no Hessian
 * for (token_embd) gets the weighted quantizer of its imatrix, if any.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qgrid.h"
#include "qstrat.h"

/* In-place lower Cholesky factor of the n x n matrix a (row-major); the
 * upper triangle is left as it was. false when a pivot is not positive. */
/* sum a[k] b[k], k < n, in four partial sums (the compiler may not
 * reorder a floating-point sum itself). */
static double dot(const double *a, const double *b, int64_t n)
{
	double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
	int64_t k = 0;

	for (; k + 4 <= n; k += 4) {
		s0 += a[k] * b[k];
		s1 += a[k + 1] * b[k + 1];
		s2 += a[k + 2] * b[k + 2];
		s3 += a[k + 3] * b[k + 3];
	}
	for (; k < n; k++)
		s0 += a[k] * b[k];
	return (s0 + s1) + (s2 + s3);
}

static bool cholesky(double *a, int64_t n)
{
	for (int64_t j = 0; j < n; j++) {
		double *rj = a + j * n, s = rj[j] - dot(rj, rj, j);

		if (!(s > 0.0))
			return false;
		rj[j] = sqrt(s);
		for (int64_t i = j + 1; i < n; i++) {
			double *ri = a + i * n;

			ri[j] = (ri[j] - dot(ri, rj, j)) / rj[j];
		}
	}
	return true;
}

/* inv (lower, n x n) = L^-1 for the lower triangle of l, row by row:
 * row i = (e_i - sum_{k<i} l[i][k] row k) / l[i][i]. */
static void lower_inverse(const double *l, double *inv, int64_t n)
{
	memset(inv, 0, sizeof(double) * (size_t)(n * n));
	for (int64_t i = 0; i < n; i++) {
		double *ri = inv + i * n;

		for (int64_t k = 0; k < i; k++) {
			const double *rk = inv + k * n;
			double c = l[i * n + k];

			for (int64_t j = 0; j <= k; j++)
				ri[j] -= c * rk[j];
		}
		ri[i] += 1.0;
		for (int64_t j = 0; j <= i; j++)
			ri[j] /= l[i * n + i];
	}
}

/* u (float, upper) = the upper Cholesky factor of (H + damping)^-1.
 * 0, LOOM_ERR_NOMEM, or LOOM_ERR_FORMAT when H stays indefinite. */
static int hinv_factor(const float *h, int64_t n, float *u)
{
	double *a = malloc(sizeof(double) * (size_t)(n * n));
	double *inv = malloc(sizeof(double) * (size_t)(n * n));
	double mean = 0.0, damp;
	int rc = LOOM_ERR_FORMAT;

	if (!a || !inv) {
		free(a);
		free(inv);
		return LOOM_ERR_NOMEM;
	}
	for (int64_t i = 0; i < n; i++)
		mean += h[i * n + i] > 0.0f ? h[i * n + i] : 0.0;
	mean = mean > 0.0 ? mean / (double)n : 1.0;
	for (damp = 0.01 * mean; damp < 1e3 * mean && rc; damp *= 10.0) {
		/* a = P (H + damp I) P, P reversing the order */
		for (int64_t i = 0; i < n; i++)
			for (int64_t j = 0; j < n; j++)
				a[i * n + j] = h[(n - 1 - i) * n + (n - 1 - j)];
		for (int64_t i = 0; i < n; i++)
			a[i * n + i] = (a[i * n + i] > 0.0 ? a[i * n + i] : 1.0) + damp;
		if (cholesky(a, n))
			rc = 0;
	}
	if (!rc) {
		lower_inverse(a, inv, n);
		for (int64_t i = 0; i < n; i++)
			for (int64_t j = 0; j < n; j++)
				u[i * n + j] = (float)inv[(n - 1 - i) * n + (n - 1 - j)];
	}
	free(a);
	free(inv);
	return rc;
}

struct gptq_job {
	const struct loom_qstrategy_tensor *t;
	const float *u;     /* [cols][cols], upper, in processing order */
	const int64_t *perm; /* processing order: k-th column taken is perm[k] */
	const int64_t *iperm; /* its inverse: column c is taken iperm[c]-th */
	float *imp;         /* [cols]: diag(H), the grid fit's importances */
	size_t row_bytes;
};

/* One row into its blocks. wp is the row in processing order (wp[k] =
 * row[perm[k]]), changed as errors are spread, so the update is one
 * contiguous loop; x gathers a block's current values in column order when
 * its grid is fitted, at the first of its columns taken. */
static void gptq_row(const struct gptq_job *j, float *wp, float *x, struct qgrid *g,
		     bool *fitted, int *q, uint8_t *out)
{
	const struct loom_qstrategy_tensor *t = j->t;
	int64_t n = t->cols, be = t->format->block_elems;

	memset(fitted, 0, sizeof(bool) * (size_t)(n / be));
	for (int64_t k = 0; k < n; k++) {
		int64_t c = j->perm[k], b = c / be;
		const float *uk = j->u + k * n;
		float err;

		if (!fitted[b]) {
			for (int64_t e = 0; e < be; e++)
				x[e] = wp[j->iperm[b * be + e]];
			qgrid_fit(&g[b], t->type, x, j->imp + b * be);
			fitted[b] = true;
		}
		q[c] = qgrid_q(&g[b], (int)(c - b * be), wp[k]);
		err = (wp[k] - qgrid_value(&g[b], (int)(c - b * be), q[c])) / uk[k];
		for (int64_t i = k + 1; i < n; i++)
			wp[i] -= err * uk[i];
	}
	for (int64_t b = 0; b < n / be; b++)
		qgrid_pack(&g[b], q + b * be, out + (size_t)b * t->format->block_bytes);
}

static int gptq_rows(void *arg, int64_t begin, int64_t end)
{
	const struct gptq_job *j = arg;
	const struct loom_qstrategy_tensor *t = j->t;
	int64_t n = t->cols, nb = n / t->format->block_elems;
	float *wp = malloc(sizeof(float) * (size_t)(n + QGRID_MAX));
	int *q = malloc(sizeof(int) * (size_t)n);
	struct qgrid *g = malloc(sizeof(*g) * (size_t)nb);
	bool *fitted = malloc(sizeof(bool) * (size_t)nb);
	int rc = wp && q && g && fitted ? 0 : LOOM_ERR_NOMEM;

	for (int64_t r = begin; r < end && !rc; r++) {
		const float *w = t->w + r * n;

		for (int64_t k = 0; k < n; k++)
			wp[k] = w[j->perm[k]];
		gptq_row(j, wp, wp + n, g, fitted, q, (uint8_t *)t->out + (size_t)r * j->row_bytes);
	}
	free(wp);
	free(q);
	free(g);
	free(fitted);
	return rc;
}

/* GPTQ's "act order": the columns of largest diag(H) first, so the
 * important ones are rounded while the most columns remain to take up
 * their error. Ties keep the column order. */
struct col_key {
	float imp;
	int64_t col;
};

static int by_importance(const void *pa, const void *pb)
{
	const struct col_key *a = pa, *b = pb;

	if (a->imp != b->imp)
		return a->imp > b->imp ? -1 : 1;
	return (a->col > b->col) - (a->col < b->col);
}

/* perm = the processing order, iperm its inverse, hp = H with rows and
 * columns in it. */
static int order_columns(const struct loom_qstrategy_tensor *t, const float *imp, int64_t *perm,
			 int64_t *iperm, float *hp)
{
	int64_t n = t->cols;
	struct col_key *key = malloc(sizeof(*key) * (size_t)n);

	if (!key)
		return LOOM_ERR_NOMEM;
	for (int64_t i = 0; i < n; i++)
		key[i] = (struct col_key){ imp[i], i };
	qsort(key, (size_t)n, sizeof(*key), by_importance);
	for (int64_t i = 0; i < n; i++) {
		perm[i] = key[i].col;
		iperm[perm[i]] = i;
	}
	free(key);
	for (int64_t i = 0; i < n; i++)
		for (int64_t k = 0; k < n; k++)
			hp[i * n + k] = t->hessian[perm[i] * n + perm[k]];
	return 0;
}

/* LOOM_ERR_FORMAT with msg when H holds a NaN or an infinity. */
static int check_finite(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len)
{
	int64_t n = t->cols;

	for (int64_t i = 0; i < n * n; i++)
		if (!isfinite(t->hessian[i])) {
			snprintf(msg, msg_len, "gptq: %s: the Hessian holds %g at (%lld, %lld)",
				 t->name, (double)t->hessian[i], (long long)(i / n),
				 (long long)(i % n));
			return LOOM_ERR_FORMAT;
		}
	return 0;
}

int gptq_quantize(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len)
{
	struct gptq_job j = { .t = t };
	size_t n2;
	float *u, *hp;
	int64_t *perm, *iperm;
	int rc = qs_check_tensor("gptq", t, msg, msg_len);

	if (rc)
		return rc;
	if (!t->hessian || !qgrid_block_elems(t->type) || !t->out)
		return qs_weighted_quantize(t, msg, msg_len);
	if ((rc = check_finite(t, msg, msg_len)))
		return rc;
	if (__builtin_mul_overflow((size_t)t->cols, (size_t)t->cols, &n2) ||
	    n2 > SIZE_MAX / sizeof(double) / 2 ||
	    !(u = malloc(sizeof(float) * (2 * n2 + (size_t)t->cols) +
			 2 * sizeof(int64_t) * (size_t)t->cols))) {
		snprintf(msg, msg_len, "gptq: %s: no memory for a %lld x %lld Hessian", t->name,
			 (long long)t->cols, (long long)t->cols);
		return LOOM_ERR_NOMEM;
	}
	hp = u + n2;
	j.imp = hp + n2;
	perm = (int64_t *)(j.imp + t->cols);
	iperm = perm + t->cols;
	j.u = u;
	j.perm = perm;
	j.iperm = iperm;
	j.row_bytes = (size_t)(t->cols / t->format->block_elems) * t->format->block_bytes;
	for (int64_t c = 0; c < t->cols; c++)
		j.imp[c] = fmaxf(t->hessian[c * t->cols + c], 0.0f);
	rc = order_columns(t, j.imp, perm, iperm, hp);
	if (!rc)
		rc = hinv_factor(hp, t->cols, u);
	if (rc == LOOM_ERR_NOMEM)
		snprintf(msg, msg_len, "gptq: %s: out of memory factoring the Hessian", t->name);
	else if (rc)
		snprintf(msg, msg_len, "gptq: %s: the Hessian is not positive definite even damped",
			 t->name);
	else
		rc = t->for_rows(t, gptq_rows, &j);
	free(u);
	return rc;
}

#ifndef QS_NO_ENTRY
static const struct loom_qstrategy gptq = {
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR,
	.abi_minor = LOOM_QSTRATEGY_ABI_MINOR,
	.struct_size = sizeof(struct loom_qstrategy),
	.name = "gptq",
	.needs = LOOM_QS_NEEDS_HESSIAN | LOOM_QS_NEEDS_IMATRIX,
	.quantize = gptq_quantize,
};

LOOM_EXPORT const struct loom_qstrategy *loom_qstrategy_entry(void)
{
	return &gptq;
}
#endif
