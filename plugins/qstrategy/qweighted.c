/* The importance-weighted quantizer shared by the strategies (qstrat.h). */
#include <stdio.h>

#include "qgrid.h"
#include "qstrat.h"

int qs_check_tensor(const char *who, const struct loom_qstrategy_tensor *t, char *msg,
		    size_t msg_len)
{
	const struct loom_quant_format *f = t->format;
	size_t row_bytes;

	if (t->struct_size < sizeof(*t) || !f || !f->block_elems || t->cols <= 0 ||
	    t->rows < 0 || t->cols % f->block_elems || !t->w) {
		snprintf(msg, msg_len, "%s: %s: bad tensor description", who, t->name);
		return LOOM_ERR_INVALID;
	}
	row_bytes = (size_t)(t->cols / f->block_elems) * f->block_bytes;
	if (t->out && row_bytes * (size_t)t->rows != t->out_size) {
		snprintf(msg, msg_len, "%s: %s: output of %zu bytes, %lld rows of %s need %zu",
			 who, t->name, t->out_size, (long long)t->rows, f->name,
			 row_bytes * (size_t)t->rows);
		return LOOM_ERR_INVALID;
	}
	return 0;
}

static int weighted_rows(void *arg, int64_t begin, int64_t end)
{
	const struct loom_qstrategy_tensor *t = arg;
	const struct loom_quant_format *f = t->format;
	size_t row_bytes = (size_t)(t->cols / f->block_elems) * f->block_bytes;

	for (int64_t r = begin; r < end; r++) {
		const float *x = t->w + r * t->cols;
		void *out = (char *)t->out + (size_t)r * row_bytes;

		if (!qgrid_quantize_row(t->type, x, t->imatrix, t->cols, out,
					(int)f->block_bytes)) {
			int rc = f->from_float(x, out, t->cols); /* f16, bf16, f32 */

			if (rc)
				return rc;
		}
	}
	return 0;
}

int qs_weighted_quantize(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len)
{
	int rc = qs_check_tensor("weighted", t, msg, msg_len);

	if (rc)
		return rc;
	if (!t->out) {
		snprintf(msg, msg_len, "weighted: %s: no output buffer", t->name);
		return LOOM_ERR_INVALID;
	}
	return t->for_rows(t, weighted_rows, (void *)t);
}
