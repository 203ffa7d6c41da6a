/*
 * ref_nomoe.so: ref.so's operators, ABI 1.8 (attention sinks, the clamped
 * SwiGLU), with the moe slot left out, so the host runs the routed experts
 * through its fallback (core/model/moe_exec.c): tests/synth/test_gptoss.py
 * holds gpt-oss's top-k softmax and expert biases there to the NumPy
 * reference too. ref.c is compiled in with its entry point renamed
 * (meson.build).
 */
#include <stddef.h>

#include "loom/backend.h"

#undef loom_backend_entry /* renamed for ref.c only */

const struct loom_backend_ops *ref_inner_entry(void);

static struct loom_backend_ops table;

LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
	table = *ref_inner_entry();
	table.moe = NULL;
	table.name = "ref_nomoe";
	return &table;
}
