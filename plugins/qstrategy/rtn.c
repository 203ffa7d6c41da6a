/* rtn: round to nearest. Each row goes through the target format's own
 * from_float, so for the formats whose GGUF reference quantizer is a plain
 * rounding (q8_0, q4_0, q4_1, q5_0, q5_1, f16, bf16) the bytes are the
 * reference's; for k-quants they are the format plugin's one-pass method
 * (plugins/quant/kquant.c). Uses no calibration data. */
#include <stdio.h>

#include "loom/qstrategy.h"

struct rtn_job {
	const struct loom_qstrategy_tensor *t;
	size_t row_bytes;
};

static int rtn_rows(void *arg, int64_t begin, int64_t end)
{
	const struct rtn_job *j = arg;
	const struct loom_qstrategy_tensor *t = j->t;

	return t->format->from_float(t->w + begin * t->cols,
				     (char *)t->out + (size_t)begin * j->row_bytes,
				     (end - begin) * t->cols);
}

static int rtn_quantize(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len)
{
	struct rtn_job j = { .t = t };
	const struct loom_quant_format *f = t->format;

	if (t->struct_size < sizeof(*t) || !f || !f->block_elems || t->cols <= 0 || t->rows < 0 ||
	    t->cols % f->block_elems) {
		snprintf(msg, msg_len, "rtn: %s: bad tensor description", t->name);
		return LOOM_ERR_INVALID;
	}
	j.row_bytes = (size_t)(t->cols / f->block_elems) * f->block_bytes;
	if (j.row_bytes * (size_t)t->rows != t->out_size) {
		snprintf(msg, msg_len, "rtn: %s: output of %zu bytes, %lld rows of %s need %zu",
			 t->name, t->out_size, (long long)t->rows, f->name,
			 j.row_bytes * (size_t)t->rows);
		return LOOM_ERR_INVALID;
	}
	return t->for_rows(t, rtn_rows, &j);
}

static const struct loom_qstrategy rtn = {
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR,
	.abi_minor = LOOM_QSTRATEGY_ABI_MINOR,
	.struct_size = sizeof(struct loom_qstrategy),
	.name = "rtn",
	.needs = 0,
	.quantize = rtn_quantize,
};

LOOM_EXPORT const struct loom_qstrategy *loom_qstrategy_entry(void)
{
	return &rtn;
}
