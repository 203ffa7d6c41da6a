/* Strategies the host must refuse or report, one per -D flag (meson builds
 * one module for each): BAD_MAJOR (ABI 2), NO_QUANTIZE (the required slot
 * NULL), NO_NAME, FAILS (quantize returns an error with a message),
 * NEEDS_IMATRIX (asks for calibration data), UNKNOWN_NEED (a needs bit this
 * loom does not know). */
#include <stdio.h>

#include "loom/qstrategy.h"

__attribute__((unused)) static int fail_quantize(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len)
{
	snprintf(msg, msg_len, "refusing %s on purpose", t->name);
	return LOOM_ERR_UNSUPPORTED;
}

static const struct loom_qstrategy bad = {
#ifdef BAD_MAJOR
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR + 1,
#else
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR,
#endif
	.abi_minor = LOOM_QSTRATEGY_ABI_MINOR,
	.struct_size = sizeof(struct loom_qstrategy),
#ifdef NO_NAME
	.name = "",
#else
	.name = "bad",
#endif
#if defined(NEEDS_IMATRIX)
	.needs = LOOM_QS_NEEDS_IMATRIX,
#elif defined(UNKNOWN_NEED)
	.needs = 1u << 7,
#endif
#ifdef NO_QUANTIZE
	.quantize = NULL,
#else
	.quantize = fail_quantize,
#endif
};

LOOM_EXPORT const struct loom_qstrategy *loom_qstrategy_entry(void)
{
	return &bad;
}
