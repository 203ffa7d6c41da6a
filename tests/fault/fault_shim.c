/*
 * faultshim.so: a backend that forwards every slot to another backend
 * (LOOM_FAULT_TARGET, a path: ref.so in the tests) and makes one call fail,
 * to drive the host's error paths (loader, weight upload, executor,
 * scheduler, KV manager) with a backend that fails as a real device can.
 *
 *   LOOM_FAULT_AT=N     the N-th call (from 1) of any slot that returns a
 *                       status fails (LOOM_ERR_NOMEM for buffer_alloc,
 *                       LOOM_ERR_DEVICE otherwise)
 *   LOOM_FAULT_SLOT=S   the first call of slot S fails instead
 *   LOOM_FAULT_COUNT=1  at destroy, print "faultshim: N calls" on stderr
 *   LOOM_FAULT_ABI_MINOR=N  the table says ABI 1.N (an older backend):
 *                       below 9 a sample call must carry none of 1.9's
 *                       rows (no logprobs; with LOOM_FAULT_HOST_MEMORY=1,
 *                       the target's device memory being host memory, the
 *                       rules are read too: no draw without top-k), else
 *                       it fails with LOOM_ERR_INVALID and a line on stderr
 *
 * Counting starts afresh at each create(), which reads the variables then.
 *
 * Slots without a status (destroy, buffer_free, buffer_addr, supports)
 * and the optional ones other than softcap always forward. Every slot is
 * a function of this object, as the loader requires. Nothing here is used outside tests/fault.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"

static const struct loom_backend_ops *inner;
static struct loom_backend_ops shim;
static long calls, fail_at;
static const char *fail_slot;
static int slot_failed;

/* Whether this call of slot `name` is the one to fail. */
static int fault(const char *name)
{
	calls++;
	if (fail_slot) {
		if (!slot_failed && !strcmp(name, fail_slot)) {
			slot_failed = 1;
			return 1;
		}
		return 0;
	}
	return fail_at > 0 && calls == fail_at;
}

#define FORWARD(slot, err, params, args)                                                   \
	static int shim_##slot params                                                      \
	{                                                                                  \
		if (fault(#slot))                                                          \
			return err;                                                        \
		return inner->slot args;                                                   \
	}

/* Each context counts afresh, with the environment as it is then, so one
 * process can open engines with different faults (tests/fault's engine
 * test). */
static void read_env(void)
{
	const char *at = getenv("LOOM_FAULT_AT");

	fail_at = at ? atol(at) : 0;
	fail_slot = getenv("LOOM_FAULT_SLOT");
	if (fail_slot && !*fail_slot)
		fail_slot = NULL;
	calls = 0;
	slot_failed = 0;
}

static int shim_create(const struct loom_backend_host *h, const struct loom_backend_config *c,
		       struct loom_backend_ctx **out)
{
	read_env();
	if (fault("create"))
		return LOOM_ERR_DEVICE;
	return inner->create(h, c, out);
}
FORWARD(device_info, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, struct loom_device_info *out), (ctx, out))
FORWARD(buffer_alloc, LOOM_ERR_NOMEM,
	(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out), (ctx, size, out))
FORWARD(upload, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n), (ctx, dst, src, n))
FORWARD(download, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n), (ctx, dst, src, n))
FORWARD(copy, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n), (ctx, dst, src, n))
FORWARD(synchronize, LOOM_ERR_DEVICE, (struct loom_backend_ctx *ctx), (ctx))
FORWARD(gemm, LOOM_ERR_DEVICE, (struct loom_backend_ctx *ctx, const struct loom_gemm_args *a),
	(ctx, a))
FORWARD(embed, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, float *out, const void *table, uint32_t type,
	 size_t row_bytes, int64_t n_rows, int64_t dim, const int32_t *ids, int64_t n_ids),
	(ctx, out, table, type, row_bytes, n_rows, dim, ids, n_ids))
FORWARD(rmsnorm, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, float *y, int64_t ys, const float *x, int64_t xs,
	 const float *w, int64_t rows, int64_t n, float eps),
	(ctx, y, ys, x, xs, w, rows, n, eps))
FORWARD(rope, LOOM_ERR_DEVICE, (struct loom_backend_ctx *ctx, const struct loom_rope_args *a),
	(ctx, a))
FORWARD(glu, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out, int64_t os,
	 const float *gate, int64_t gs, const float *up, int64_t us, int64_t rows, int64_t n),
	(ctx, kind, out, os, gate, gs, up, us, rows, n))
FORWARD(add, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, float *out, int64_t os, const float *a, int64_t as,
	 const float *b, int64_t bs, int64_t b_rows, int64_t rows, int64_t n),
	(ctx, out, os, a, as, b, bs, b_rows, rows, n))
FORWARD(scale, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows, int64_t n,
	 float s), (ctx, x, stride, rows, n, s))
FORWARD(kv_write, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a), (ctx, a))
FORWARD(attention, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, const struct loom_attention_args *a), (ctx, a))
FORWARD(softcap, LOOM_ERR_DEVICE,
	(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows, int64_t n,
	 float cap), (ctx, x, stride, rows, n, cap))

/* Slots without a status, and the optional ones, forward without
 * counting: they are here only so that every slot of the table is code
 * of this object (the loader refuses a slot that points into another). */
#define PASS(ret, slot, params, args)                                                      \
	static ret shim_##slot params                                                      \
	{                                                                                  \
		return inner->slot args;                                                   \
	}
PASS(bool, supports, (struct loom_backend_ctx *ctx, enum loom_op op, uint32_t type),
     (ctx, op, type))
PASS(void, buffer_free, (struct loom_backend_ctx *ctx, struct loom_buffer *buf), (ctx, buf))
PASS(void *, buffer_addr, (struct loom_backend_ctx *ctx, struct loom_buffer *buf), (ctx, buf))
PASS(int, graph_begin, (struct loom_backend_ctx *ctx), (ctx))
PASS(int, graph_end, (struct loom_backend_ctx *ctx), (ctx))
PASS(int, weight_pack,
     (struct loom_backend_ctx *ctx, const struct loom_weight_pack_args *a,
      struct loom_buffer **out, size_t *bytes), (ctx, a, out, bytes))
PASS(int, collective, (struct loom_backend_ctx *ctx, const struct loom_collective_args *a),
     (ctx, a))
PASS(int, moe, (struct loom_backend_ctx *ctx, const struct loom_moe_args *a), (ctx, a))
PASS(int, argmax,
     (struct loom_backend_ctx *ctx, int32_t *ids, const float *x, int64_t stride, int64_t rows,
      int64_t n), (ctx, ids, x, stride, rows, n))
/* Whether a sample call holds a row a backend of the table's ABI minor
 * must never see (LOOM_FAULT_ABI_MINOR below 9). */
static const char *sample_too_new(const struct loom_sample_args *a)
{
	const char *host_mem = getenv("LOOM_FAULT_HOST_MEMORY");

	if (shim.abi_minor >= 9)
		return NULL;
	if (LOOM_SAMPLE_HAS_LP(a) && a->lp)
		return "logprobs";
	for (int64_t r = 0; host_mem && *host_mem == '1' && r < a->rows; r++) {
		const struct loom_sample_row *p = &a->params[r];

		if (p->logprobs)
			return "a row asking for logprobs";
		if (p->temp > 0.0f && (p->top_k <= 0 || p->top_k >= a->n))
			return "a row without top-k";
	}
	return NULL;
}

static int shim_sample(struct loom_backend_ctx *ctx, const struct loom_sample_args *a)
{
	const char *why = a ? sample_too_new(a) : NULL;

	if (why) {
		fprintf(stderr, "faultshim: an ABI 1.%u backend was handed %s\n",
			(unsigned)shim.abi_minor, why);
		return LOOM_ERR_INVALID;
	}
	return inner->sample(ctx, a);
}

static void shim_destroy(struct loom_backend_ctx *ctx)
{
	if (getenv("LOOM_FAULT_COUNT"))
		fprintf(stderr, "faultshim: %ld calls\n", calls);
	inner->destroy(ctx);
}

LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
	const char *target = getenv("LOOM_FAULT_TARGET");
	const char *at = NULL;
	loom_backend_entry_fn entry;
	void *dl;

	if (inner)
		return &shim;
	if (!target || !(dl = dlopen(target, RTLD_NOW | RTLD_LOCAL)) ||
	    !(entry = (loom_backend_entry_fn)dlsym(dl, LOOM_BACKEND_ENTRY)) || !(inner = entry()) ||
	    inner->struct_size < sizeof(struct loom_backend_ops)) {
		fprintf(stderr, "faultshim: cannot load LOOM_FAULT_TARGET (%s)\n",
			target ? target : "unset");
		return NULL;
	}
	(void)at;
	shim = *inner;
	shim.name = "faultshim";
	if (getenv("LOOM_FAULT_ABI_MINOR") && atoi(getenv("LOOM_FAULT_ABI_MINOR")) < (int)inner->abi_minor)
		shim.abi_minor = (uint32_t)atoi(getenv("LOOM_FAULT_ABI_MINOR"));
	shim.create = shim_create;
	shim.destroy = shim_destroy;
	shim.device_info = shim_device_info;
	shim.buffer_alloc = shim_buffer_alloc;
	shim.upload = shim_upload;
	shim.download = shim_download;
	shim.copy = shim_copy;
	shim.synchronize = shim_synchronize;
	shim.gemm = shim_gemm;
	shim.embed = shim_embed;
	shim.rmsnorm = shim_rmsnorm;
	shim.rope = shim_rope;
	shim.glu = shim_glu;
	shim.add = shim_add;
	shim.scale = shim_scale;
	shim.kv_write = shim_kv_write;
	shim.attention = shim_attention;
	shim.supports = shim_supports;
	shim.buffer_free = shim_buffer_free;
	shim.buffer_addr = shim_buffer_addr;
	if (inner->softcap)
		shim.softcap = shim_softcap;
	if (inner->graph_begin)
		shim.graph_begin = shim_graph_begin;
	if (inner->graph_end)
		shim.graph_end = shim_graph_end;
	if (inner->weight_pack)
		shim.weight_pack = shim_weight_pack;
	if (inner->collective)
		shim.collective = shim_collective;
	if (inner->moe)
		shim.moe = shim_moe;
	if (inner->argmax)
		shim.argmax = shim_argmax;
	if (inner->sample)
		shim.sample = shim_sample;
	return &shim;
}
