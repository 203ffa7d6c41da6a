/*
 * The algorithms behind awq.so, gptq.so and gptq_awq.so (awq.c, gptq.c),
 * each module built from the sources it needs; the entry points below are
 * what their descriptors hold. Hidden symbols: nothing here leaves a module.
 */
#ifndef LOOM_QSTRAT_H
#define LOOM_QSTRAT_H

#include <stddef.h>

#include "loom/qstrategy.h"

/* Checks t's shape and output size against its format; 0, or
 * LOOM_ERR_INVALID with msg naming who. */
int qs_check_tensor(const char *who, const struct loom_qstrategy_tensor *t, char *msg,
		    size_t msg_len);

/* Importance-weighted grid fit of each block (qgrid.h) with t->imatrix as
 * the importances; round to nearest through the format plugin for the
 * float formats. awq's quantize. */
int qs_weighted_quantize(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len);

/* GPTQ (gptq.c): column-by-column error compensation with t->hessian;
 * without one, qs_weighted_quantize. */
int gptq_quantize(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len);

/* AWQ's scale search (awq.c), the input_scales slot. */
int awq_input_scales(const struct loom_qstrategy_tensor *const *group, int n, float *scales,
		     char *msg, size_t msg_len);

#endif /* LOOM_QSTRAT_H */
