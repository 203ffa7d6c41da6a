/*
 * ref_abi11.so: ref.so's operators behind a generation-1.1 ops table, as
 * a backend built before the optional 1.2 slots (weight_pack, softcap) would be.
 * tests/synth runs the soft-capped Gemma 2 models on it, so the executor's
 * host fallback for the final-logit cap is held to the NumPy reference too.
 * ref.c is compiled into this module with its entry point renamed
 * (meson.build), so the operators are ref.so's own.
 */
#include <stddef.h>

#include "loom/backend.h"

#undef loom_backend_entry /* renamed for ref.c only */

const struct loom_backend_ops *ref_inner_entry(void);

static struct loom_backend_ops old_table;

LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
	old_table = *ref_inner_entry();
	old_table.abi_minor = 1;
	old_table.struct_size = offsetof(struct loom_backend_ops, weight_pack);
	old_table.name = "ref_abi11";
	return &old_table;
}
