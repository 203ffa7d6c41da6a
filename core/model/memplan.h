/*
 * The memory plan of a model on its backend, made before anything is
 * allocated for it: the weights (by the type stored on the backend), the
 * KV cache, the executor's activations and a reserve for the backend's own
 * working memory, against the memory the backend reports free.
 */
#ifndef LOOM_MEMPLAN_H
#define LOOM_MEMPLAN_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* The backend's own working memory, beyond what the host allocates: for
 * cuda.so up to 64 MiB of weight panels dequantized for prefill, 64 MiB
 * of split-K attention partials, the activations converted to f16 and
 * the attention work items; a little for other backends. */
#define LOOM_MEM_RESERVE ((uint64_t)256 << 20)

struct loom_mem_plan {
	uint64_t weights, kv, acts, reserve, need;
	uint64_t mem_free, mem_total; /* as the backend reports them; 0: unknown */
};

/*
 * Makes the plan of model m (planned, nothing uploaded: m->plan_bytes)
 * with a KV cache of kv bytes and activations of acts bytes, logs it
 * (info), and refuses (LOOM_ERR_NOMEM, the plan in err) when the backend
 * reports less free memory than the plan needs. A backend that reports
 * no free memory (0) is not checked.
 */
int loom_mem_plan_check(const struct loom_model *m, uint64_t kv, uint64_t acts,
			struct loom_mem_plan *out, char *err, size_t errlen);

/* The plan as one line: "weights ... MiB (q4_K ..., ...), KV cache ...". */
void loom_mem_plan_format(const struct loom_model *m, const struct loom_mem_plan *p, char *buf,
			  size_t len);

#endif
