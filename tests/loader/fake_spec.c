/*
 * A speculative-decoding plugin with one defect, chosen at build time, for
 * tests/loader/test_bad_plugins.py (each must be refused in one line):
 *
 *   FAKE_WILD_NAME     the name points to nothing mapped
 *   FAKE_WILD_OBSERVE  the optional observe slot points to nothing mapped
 *   FAKE_WILD_PROPOSE  the required propose slot does
 *   FAKE_LIBC_PROPOSE  propose points at libc's puts: code, but not the
 *                      plugin's
 *
 * Nothing here is ever called: the loader refuses the descriptor first.
 */
#include <stdint.h>
#include <stdio.h>

#include "loom/backend.h" /* LOOM_EXPORT */
#include "loom/spec.h"

#define WILD ((uintptr_t)0xdead0000)

static int fake_create(const struct loom_spec_host *host, const struct loom_spec_params *params,
		       struct loom_spec_ctx **ctx, char *msg, size_t msg_len)
{
	(void)host, (void)params, (void)msg, (void)msg_len;
	*ctx = NULL;
	return -1;
}

static int __attribute__((unused)) fake_propose(struct loom_spec_ctx *ctx,
						struct loom_spec_draft *d)
{
	(void)ctx, (void)d;
	return 0;
}

static void fake_destroy(struct loom_spec_ctx *ctx)
{
	(void)ctx;
}

static const struct loom_spec_plugin fake_spec = {
	.abi_major = LOOM_SPEC_ABI_MAJOR,
	.abi_minor = LOOM_SPEC_ABI_MINOR,
	.struct_size = sizeof(struct loom_spec_plugin),
#ifdef FAKE_WILD_NAME
	.name = (const char *)WILD,
#else
	.name = "fake",
#endif
	.create = fake_create,
#if defined(FAKE_WILD_PROPOSE)
	.propose = (int (*)(struct loom_spec_ctx *, struct loom_spec_draft *))WILD,
#elif defined(FAKE_LIBC_PROPOSE)
	.propose = (int (*)(struct loom_spec_ctx *, struct loom_spec_draft *))(void (*)(void))puts,
#else
	.propose = fake_propose,
#endif
#ifdef FAKE_WILD_OBSERVE
	.observe = (void (*)(struct loom_spec_ctx *, const struct loom_spec_outcome *))WILD,
#endif
	.destroy = fake_destroy,
};

LOOM_EXPORT const struct loom_spec_plugin *loom_spec_entry(void)
{
	return &fake_spec;
}
