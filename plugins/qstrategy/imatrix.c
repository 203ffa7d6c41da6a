/* imatrix: importance-weighted quantization (docs/QUANTIZATION.md). Each
 * row goes through the target format's from_float_weighted with the
 * tensor's importance matrix as the weights: per input column j the mean
 * of x_j^2 over the calibration tokens, so the search minimizes
 * sum_j E[x_j^2] (w_j - q_j)^2, the expected squared error of the row's
 * dot product with an input of uncorrelated columns. A tensor the file
 * has no entry for (token_embd) gets the search with equal weights;
 * formats without a weighted search (f32, f16, bf16, or a plugin built at
 * quant ABI 1.0) are rounded to nearest, as rtn does. */
#include <stdio.h>

#include "loom/qstrategy.h"

struct imatrix_job {
	const struct loom_qstrategy_tensor *t;
	size_t row_bytes;
	bool weighted;
};

static int imatrix_rows(void *arg, int64_t begin, int64_t end)
{
	const struct imatrix_job *j = arg;
	const struct loom_qstrategy_tensor *t = j->t;
	int rc = 0;

	for (int64_t r = begin; r < end && !rc; r++) {
		const float *src = t->w + r * t->cols;
		void *dst = (char *)t->out + (size_t)r * j->row_bytes;

		rc = j->weighted ? t->format->from_float_weighted(src, dst, t->cols, t->imatrix) :
				   t->format->from_float(src, dst, t->cols);
	}
	return rc;
}

static int imatrix_quantize(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len)
{
	struct imatrix_job j = { .t = t };
	const struct loom_quant_format *f = t->format;

	if (t->struct_size < sizeof(*t) || !f || !f->block_elems || t->cols <= 0 || t->rows < 0 ||
	    t->cols % f->block_elems) {
		snprintf(msg, msg_len, "imatrix: %s: bad tensor description", t->name);
		return LOOM_ERR_INVALID;
	}
	j.row_bytes = (size_t)(t->cols / f->block_elems) * f->block_bytes;
	if (j.row_bytes * (size_t)t->rows != t->out_size) {
		snprintf(msg, msg_len, "imatrix: %s: output of %zu bytes, %lld rows of %s need %zu",
			 t->name, t->out_size, (long long)t->rows, f->name,
			 j.row_bytes * (size_t)t->rows);
		return LOOM_ERR_INVALID;
	}
	j.weighted = loom_format_has_weighted(f);
	return t->for_rows(t, imatrix_rows, &j);
}

static const struct loom_qstrategy imatrix = {
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR,
	.abi_minor = LOOM_QSTRATEGY_ABI_MINOR,
	.struct_size = sizeof(struct loom_qstrategy),
	.name = "imatrix",
	.needs = LOOM_QS_NEEDS_IMATRIX,
	.quantize = imatrix_quantize,
};

LOOM_EXPORT const struct loom_qstrategy *loom_qstrategy_entry(void)
{
	return &imatrix;
}
