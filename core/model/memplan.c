/* The memory plan of a model on its backend: see memplan.h. */
#include "model/memplan.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "format/gguf.h"
#include "util.h"

static double mib(uint64_t b)
{
	return (double)b / 1048576.0;
}

/* Appends printf output to buf (len bytes, NUL-terminated), truncating. */
static void append(char *buf, size_t len, const char *fmt, ...)
{
	size_t used = strlen(buf);
	va_list ap;

	if (used + 1 >= len)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + used, len - used, fmt, ap);
	va_end(ap);
}

void loom_mem_plan_format(const struct loom_model *m, const struct loom_mem_plan *p, char *buf,
			  size_t len)
{
	const char *sep = " (";

	if (!len)
		return;
	buf[0] = '\0';
	append(buf, len, "weights %.1f MiB", mib(p->weights));
	for (uint32_t t = 0; t < LOOM_TYPE_COUNT; t++) {
		if (!m->plan_bytes[t])
			continue;
		append(buf, len, "%s%s %.1f", sep, gguf_type_name(t), mib(m->plan_bytes[t]));
		sep = ", ";
	}
	append(buf, len, "%s%d tensors converted to f32 at load)", *sep == ',' ? "; " : " (",
	       m->n_converted);
	if (m->expert_bytes) /* of which the routed experts, and one token's share */
		append(buf, len, " of which routed experts %.1f MiB (%lld of %lld a token: %.1f MiB)",
		       mib(m->expert_bytes), (long long)m->hp.n_expert_used,
		       (long long)m->hp.n_expert,
		       mib(m->expert_bytes / (uint64_t)m->hp.n_expert * (uint64_t)m->hp.n_expert_used));
	append(buf, len, ", KV cache %.1f MiB, activations %.1f MiB", mib(p->kv), mib(p->acts));
	append(buf, len, ", backend working memory %.1f MiB (reserve): %.1f MiB in all",
	       mib(p->reserve), mib(p->need));
	if (p->mem_free)
		append(buf, len, "; %.1f MiB free", mib(p->mem_free));
	if (p->mem_total)
		append(buf, len, " of %.1f MiB", mib(p->mem_total));
}

/* a + b, saturating (the sums are compared, never allocated). */
static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

int loom_mem_plan_check(const struct loom_model *m, uint64_t kv, uint64_t acts,
			struct loom_mem_plan *out, char *err, size_t errlen)
{
	const struct loom_backend *be = m->be;
	struct loom_device_info info;
	struct loom_mem_plan p = { .weights = m->plan_total, .kv = kv, .acts = acts,
				   .reserve = LOOM_MEM_RESERVE };
	char line[1024];

	memset(&info, 0, sizeof(info));
	if (be->ops->device_info(be->ctx, &info) == LOOM_OK) {
		p.mem_free = info.mem_free;
		p.mem_total = info.mem_total;
	}
	p.need = add_sat(add_sat(add_sat(p.weights, p.kv), p.acts), p.reserve);
	if (out)
		*out = p;
	loom_mem_plan_format(m, &p, line, sizeof(line));
	if (p.mem_free && p.need > p.mem_free) {
		loom_seterr(err, errlen, "the model does not fit on backend %s (%.*s): %s; "
			    "a shorter context (-c) or a smaller KV cache (--kv-mem, "
			    "--kv-type) needs less", be->ops->name, (int)sizeof(info.name),
			    info.name, line);
		return LOOM_ERR_NOMEM;
	}
	loom_log(LOOM_LOG_INFO, "memory plan on %s: %s", be->ops->name, line);
	return 0;
}
