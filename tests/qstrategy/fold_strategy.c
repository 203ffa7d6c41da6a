/* A strategy for tests/qstrategy/test_fold.py: input_scales gives fixed
 * pseudo-random scales 2^u, u in [-1.5, 1.5], per channel (so folding is
 * visible and must keep the model's function); quantize rounds to nearest
 * through the target format. Built with -DBAD_SCALE it returns a NaN
 * scale, which the host must refuse. Needs no calibration data. */
#include <math.h>
#include <stdio.h>

#include "loom/qstrategy.h"

struct job {
	const struct loom_qstrategy_tensor *t;
	size_t row_bytes;
};

static int rows(void *arg, int64_t begin, int64_t end)
{
	const struct job *j = arg;
	const struct loom_qstrategy_tensor *t = j->t;

	return t->format->from_float(t->w + begin * t->cols,
				     (char *)t->out + (size_t)begin * j->row_bytes,
				     (end - begin) * t->cols);
}

static int fold_quantize(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len)
{
	struct job j = { .t = t };

	(void)msg;
	(void)msg_len;
	j.row_bytes = (size_t)(t->cols / t->format->block_elems) * t->format->block_bytes;
	return t->for_rows(t, rows, &j);
}

static int fold_scales(const struct loom_qstrategy_tensor *const *group, int n, float *scales,
		       char *msg, size_t msg_len)
{
	uint32_t h = 2166136261u;

	(void)msg;
	(void)msg_len;
	for (const char *p = group[0]->name; *p; p++)
		h = (h ^ (uint8_t)*p) * 16777619u;
	for (int64_t c = 0; c < group[0]->cols; c++) {
		h = h * 1664525u + 1013904223u + (uint32_t)n;
		scales[c] = exp2f(3.0f * (float)(h >> 8) / 16777216.0f - 1.5f);
	}
#ifdef BAD_SCALE
	scales[group[0]->cols / 2] = NAN;
#endif
	return 0;
}

static const struct loom_qstrategy fold = {
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR,
	.abi_minor = LOOM_QSTRATEGY_ABI_MINOR,
	.struct_size = sizeof(struct loom_qstrategy),
	.name = "fold_test",
	.quantize = fold_quantize,
	.input_scales = fold_scales,
};

LOOM_EXPORT const struct loom_qstrategy *loom_qstrategy_entry(void)
{
	return &fold;
}
