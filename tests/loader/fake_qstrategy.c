/*
 * A quantization strategy with one defect, chosen at build time, for
 * tests/loader/test_bad_plugins.py (each must be refused in one line):
 *
 *   FAKE_WILD_NAME      the name points to nothing mapped
 *   FAKE_WILD_SCALES    the optional input_scales slot does
 *   FAKE_WILD_QUANTIZE  the required quantize slot does
 *   FAKE_LIBC_QUANTIZE  quantize points at libc's abort: code, but not
 *                       the plugin's
 *
 * Nothing here is ever called: the loader refuses the descriptor first.
 */
#include <stdint.h>
#include <stdlib.h>

#include "loom/backend.h" /* LOOM_EXPORT */
#include "loom/qstrategy.h"

#define WILD ((uintptr_t)0xdead0000)

typedef int (*quantize_fn)(const struct loom_qstrategy_tensor *t, char *msg, size_t msg_len);
typedef int (*scales_fn)(const struct loom_qstrategy_tensor *const *group, int n, float *scales,
			 char *msg, size_t msg_len);

static int __attribute__((unused)) fake_quantize(const struct loom_qstrategy_tensor *t,
						 char *msg, size_t msg_len)
{
	(void)t, (void)msg, (void)msg_len;
	return -1;
}

static const struct loom_qstrategy fake_qs = {
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR,
	.abi_minor = LOOM_QSTRATEGY_ABI_MINOR,
	.struct_size = sizeof(struct loom_qstrategy),
#ifdef FAKE_WILD_NAME
	.name = (const char *)WILD,
#else
	.name = "fake",
#endif
#if defined(FAKE_WILD_QUANTIZE)
	.quantize = (quantize_fn)WILD,
#elif defined(FAKE_LIBC_QUANTIZE)
	.quantize = (quantize_fn)(void (*)(void))abort,
#else
	.quantize = fake_quantize,
#endif
#ifdef FAKE_WILD_SCALES
	.input_scales = (scales_fn)WILD,
#endif
};

LOOM_EXPORT const struct loom_qstrategy *loom_qstrategy_entry(void)
{
	return &fake_qs;
}
