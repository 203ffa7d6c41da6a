/* gptq_awq: AWQ's input scales (awq.c), folded by the host into the
 * RMSNorm before, then GPTQ (gptq.c) on the scaled weights with the
 * Hessian the host rescaled to match (H_ij / (s_i s_j)). */
#include "qstrat.h"

static const struct loom_qstrategy gptq_awq = {
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR,
	.abi_minor = LOOM_QSTRATEGY_ABI_MINOR,
	.struct_size = sizeof(struct loom_qstrategy),
	.name = "gptq_awq",
	.needs = LOOM_QS_NEEDS_HESSIAN | LOOM_QS_NEEDS_IMATRIX,
	.quantize = gptq_quantize,
	.input_scales = awq_input_scales,
};

LOOM_EXPORT const struct loom_qstrategy *loom_qstrategy_entry(void)
{
	return &gptq_awq;
}
