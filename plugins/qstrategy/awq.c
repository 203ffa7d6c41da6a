/*
 * awq: activation-aware weight quantization (Lin et al., 2023).
 *
 * input_scales: for a group of tensors reading one input (q/k/v, gate/up),
 * per input channel j the activation size a_j = sqrt(E[x_j^2]) (the
 * imatrix) and the weight size w_j (mean over rows of |W_ij| / max_j |W_ij|)
 * give candidate scales s_j = a_j^alpha / w_j^(1 - alpha) for alpha = 0,
 * 0.05, ..., 0.95, normalized to a geometric mean of 1 (plus s = 1, so the
 * search never does worse than no scaling on its own measure). Each
 * candidate is scored by quantizing W diag(s) (the grid fit of qgrid.h,
 * weighted by a^2 / s^2) on a sample of rows of each member and summing
 * a_j^2 (Q(W s)_ij / s_j - W_ij)^2: the output error if channels were
 * uncorrelated. The host folds 1/s into the RMSNorm weight before.
 *
 * quantize: the same weighted grid fit of each block, whose search over
 * scales narrower than the block's range is AWQ's clipping search.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qgrid.h"
#include "qstrat.h"

#define AWQ_GRID 20
#define AWQ_SAMPLE_ROWS 64

struct awq_search {
	const struct loom_qstrategy_tensor *const *group;
	int n;
	int64_t cols;
	float *a2;    /* [cols] E[x^2], dead channels raised to the least live */
	float *wmag;  /* [cols] */
	float *imp;   /* [cols] a2 / s^2 for the candidate */
	float *row;   /* [cols] a scaled row, then its quantized values */
};

/* Weighted output error of quantizing the sampled rows of every member
 * scaled by s. */
static double awq_error(struct awq_search *a, const float *s)
{
	struct qgrid g;
	double err = 0.0;
	int64_t cols = a->cols;

	for (int64_t c = 0; c < cols; c++)
		a->imp[c] = a->a2[c] / (s[c] * s[c]);
	for (int m = 0; m < a->n; m++) {
		const struct loom_qstrategy_tensor *t = a->group[m];
		int64_t step = t->rows > AWQ_SAMPLE_ROWS ? t->rows / AWQ_SAMPLE_ROWS : 1;
		int be = qgrid_block_elems(t->type);

		for (int64_t r = 0; r < t->rows; r += step) {
			const float *w = t->w + r * cols;

			for (int64_t c = 0; c < cols; c++)
				a->row[c] = w[c] * s[c];
			for (int64_t c0 = 0; be && c0 < cols; c0 += be) {
				qgrid_fit(&g, t->type, a->row + c0, a->imp + c0);
				for (int e = 0; e < be; e++) {
					int64_t c = c0 + e;
					float v = qgrid_value(&g, e, qgrid_q(&g, e, a->row[c]));
					double d = (double)(v / s[c] - w[c]);

					err += (double)a->a2[c] * d * d;
				}
			}
		}
	}
	return err;
}

/* a2 from the first member with an imatrix; false when none has one.
 * Dead channels (0) get the least positive value, so no scale is 0. */
static bool awq_stats(struct awq_search *a)
{
	const float *im = NULL;
	float least = INFINITY;

	for (int m = 0; m < a->n && !im; m++)
		im = a->group[m]->imatrix;
	if (!im)
		return false;
	for (int64_t c = 0; c < a->cols; c++) {
		a->a2[c] = isfinite(im[c]) && im[c] > 0.0f ? im[c] : 0.0f;
		if (a->a2[c] > 0.0f)
			least = fminf(least, a->a2[c]);
	}
	if (!isfinite(least))
		return false;
	for (int64_t c = 0; c < a->cols; c++)
		if (a->a2[c] == 0.0f)
			a->a2[c] = least;
	return true;
}

static void awq_wmag(struct awq_search *a)
{
	int64_t rows = 0;

	memset(a->wmag, 0, sizeof(float) * (size_t)a->cols);
	for (int m = 0; m < a->n; m++) {
		const struct loom_qstrategy_tensor *t = a->group[m];

		for (int64_t r = 0; r < t->rows; r++, rows++) {
			const float *w = t->w + r * a->cols;
			float mx = 0.0f;

			for (int64_t c = 0; c < a->cols; c++)
				mx = fmaxf(mx, fabsf(w[c]));
			for (int64_t c = 0; mx > 0.0f && c < a->cols; c++)
				a->wmag[c] += fabsf(w[c]) / mx;
		}
	}
	for (int64_t c = 0; c < a->cols; c++)
		a->wmag[c] = fmaxf(a->wmag[c] / (float)(rows ? rows : 1), 1e-6f);
}

/* s = a^alpha / w^(1 - alpha), to geometric mean 1. */
static void awq_candidate(const struct awq_search *a, float alpha, float *s)
{
	double logsum = 0.0;
	float norm;

	for (int64_t c = 0; c < a->cols; c++) {
		s[c] = powf(sqrtf(a->a2[c]), alpha) / powf(a->wmag[c], 1.0f - alpha);
		s[c] = fminf(fmaxf(s[c], 1e-4f), 1e4f);
		logsum += log(s[c]);
	}
	norm = (float)exp(-logsum / (double)a->cols);
	for (int64_t c = 0; c < a->cols; c++)
		s[c] *= norm;
}

static int awq_check_group(const struct loom_qstrategy_tensor *const *group, int n, char *msg,
			   size_t msg_len)
{
	if (n < 1) {
		snprintf(msg, msg_len, "awq: empty group");
		return LOOM_ERR_INVALID;
	}
	for (int m = 0; m < n; m++) {
		int rc = qs_check_tensor("awq", group[m], msg, msg_len);

		if (rc)
			return rc;
		if (group[m]->cols != group[0]->cols) {
			snprintf(msg, msg_len, "awq: %s and %s have different input widths",
				 group[0]->name, group[m]->name);
			return LOOM_ERR_INVALID;
		}
	}
	return 0;
}

int awq_input_scales(const struct loom_qstrategy_tensor *const *group, int n, float *scales,
		     char *msg, size_t msg_len)
{
	struct awq_search a = { .group = group, .n = n };
	float *cand, *buf;
	double best;
	int rc = awq_check_group(group, n, msg, msg_len);

	if (rc)
		return rc;
	a.cols = group[0]->cols;
	for (int64_t c = 0; c < a.cols; c++)
		scales[c] = 1.0f;
	if (!(buf = malloc(sizeof(float) * 5 * (size_t)a.cols))) {
		snprintf(msg, msg_len, "awq: out of memory");
		return LOOM_ERR_NOMEM;
	}
	a.a2 = buf;
	a.wmag = buf + a.cols;
	a.imp = buf + 2 * a.cols;
	a.row = buf + 3 * a.cols;
	cand = buf + 4 * a.cols;
	if (awq_stats(&a)) {
		awq_wmag(&a);
		best = awq_error(&a, scales);
		for (int i = 0; i < AWQ_GRID; i++) {
			double e;

			awq_candidate(&a, (float)i / AWQ_GRID, cand);
			e = awq_error(&a, cand);
			if (e < best) {
				best = e;
				memcpy(scales, cand, sizeof(float) * (size_t)a.cols);
			}
		}
	}
	free(buf);
	return 0;
}

#ifndef QS_NO_ENTRY
static const struct loom_qstrategy awq = {
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR,
	.abi_minor = LOOM_QSTRATEGY_ABI_MINOR,
	.struct_size = sizeof(struct loom_qstrategy),
	.name = "awq",
	.needs = LOOM_QS_NEEDS_IMATRIX,
	.quantize = qs_weighted_quantize,
	.input_scales = awq_input_scales,
};

LOOM_EXPORT const struct loom_qstrategy *loom_qstrategy_entry(void)
{
	return &awq;
}
#endif
