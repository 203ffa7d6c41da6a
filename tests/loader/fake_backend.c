/* A minimal backend built several times with different defects, one .so per
 * defect (see meson.build), to exercise the loader's refusals:
 *   FAKE_ABI_MAJOR=n   abi_major reported in the table (default 1)
 *   FAKE_SMALL         struct_size one slot short of the 1.0 table
 *   FAKE_NO_ATTENTION  the required attention slot is NULL
 *   FAKE_NO_DEVICE     create() fails with LOOM_ERR_DEVICE, as a GPU
 *                      backend does on a machine without a GPU
 *   FAKE_NO_ENTRY      exports a misspelled entry symbol instead
 *   FAKE_NULL_TABLE    the entry returns NULL
 *   FAKE_WILD_TABLE    the entry returns a pointer to nothing mapped
 *   FAKE_FF_TABLE      the entry returns a table of 0xff bytes
 *   FAKE_FF_SLOTS      the same with a good head: only the slots are wild
 *   FAKE_DATA_ENTRY    loom_backend_entry is a data object, not a function
 *   FAKE_LIBC_SLOT     gemm points into libc's text (abort), not the backend's
 *
 * create() appends a line starting with the backend's file tag to the file
 * named by $LOOM_TEST_CREATE_LOG, so the test can tell whether the loader
 * called it and with which host context (see fake_note_create).
 * Only the two buffer and device_info slots do anything; the operators
 * answer LOOM_ERR_UNSUPPORTED.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"

#ifndef FAKE_ABI_MAJOR
#define FAKE_ABI_MAJOR LOOM_BACKEND_ABI_MAJOR
#endif
/* the type fake_quant.c registers */
#define FAKE_FORMAT_TYPE 39

#ifndef FAKE_TAG
#define FAKE_TAG "fake"
#endif

struct loom_backend_ctx {
	const struct loom_backend_host *host;
	int32_t device;
};

/* Appends a line: the tag, the host context create() was lent, and the
 * name that context gives format FAKE_FORMAT_TYPE ("-": none). */
static void fake_note_create(const struct loom_backend_host *host)
{
	const char *log = getenv("LOOM_TEST_CREATE_LOG");
	const struct loom_format_info *fi = NULL;
	FILE *f;

	if (!log || !*log)
		return;
	f = fopen(log, "a");
	if (!f)
		return;
	if (host && host->host && host->format_info)
		fi = host->format_info(host->host, FAKE_FORMAT_TYPE);
	fprintf(f, "%s host=%p format=%s\n", FAKE_TAG,
		host ? host->host : NULL, fi && fi->name ? fi->name : "-");
	fclose(f);
}

static int fake_create(const struct loom_backend_host *host,
		       const struct loom_backend_config *cfg,
		       struct loom_backend_ctx **out)
{
	struct loom_backend_ctx *ctx;

	fake_note_create(host);
#ifdef FAKE_NO_DEVICE
	if (host && host->log)
		host->log(host->host, LOOM_LOG_ERROR, "fake: no device found");
	return LOOM_ERR_DEVICE;
#endif
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return LOOM_ERR_NOMEM;
	ctx->host = host;
	ctx->device = cfg ? cfg->device : 0;
	*out = ctx;
	return LOOM_OK;
}

static void fake_destroy(struct loom_backend_ctx *ctx)
{
	free(ctx);
}

static int fake_device_info(struct loom_backend_ctx *ctx,
			    struct loom_device_info *out)
{
	snprintf(out->name, sizeof(out->name), "fake device %d", (int)ctx->device);
	out->mem_total = 0;
	out->mem_free = 0;
	return LOOM_OK;
}

static bool fake_supports(struct loom_backend_ctx *ctx, enum loom_op op,
			  uint32_t type)
{
	return false;
}

static int fake_buffer_alloc(struct loom_backend_ctx *ctx, size_t size,
			     struct loom_buffer **out)
{
	return LOOM_ERR_UNSUPPORTED;
}

static void fake_buffer_free(struct loom_backend_ctx *ctx, struct loom_buffer *b)
{
}

static void *fake_buffer_addr(struct loom_backend_ctx *ctx, struct loom_buffer *b)
{
	return NULL;
}

static int fake_xfer(struct loom_backend_ctx *ctx, void *dst, const void *src,
		     size_t n)
{
	return LOOM_ERR_UNSUPPORTED;
}

static int fake_synchronize(struct loom_backend_ctx *ctx)
{
	return LOOM_OK;
}

static int __attribute__((unused)) fake_gemm(struct loom_backend_ctx *ctx,
					     const struct loom_gemm_args *a)
{
	return LOOM_ERR_UNSUPPORTED;
}

static int fake_embed(struct loom_backend_ctx *ctx, float *out, const void *table,
		      uint32_t type, size_t row_bytes, int64_t n_rows,
		      int64_t dim, const int32_t *ids, int64_t n_ids)
{
	return LOOM_ERR_UNSUPPORTED;
}

static int fake_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t ys,
			const float *x, int64_t xs, const float *w, int64_t rows,
			int64_t n, float eps)
{
	return LOOM_ERR_UNSUPPORTED;
}

static int fake_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	return LOOM_ERR_UNSUPPORTED;
}

static int fake_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind,
		    float *out, int64_t os, const float *gate, int64_t gs,
		    const float *up, int64_t us, int64_t rows, int64_t n)
{
	return LOOM_ERR_UNSUPPORTED;
}

static int fake_add(struct loom_backend_ctx *ctx, float *out, int64_t os,
		    const float *a, int64_t as, const float *b, int64_t bs,
		    int64_t b_rows, int64_t rows, int64_t n)
{
	return LOOM_ERR_UNSUPPORTED;
}

static int fake_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride,
		      int64_t rows, int64_t n, float s)
{
	return LOOM_ERR_UNSUPPORTED;
}

static int fake_kv_write(struct loom_backend_ctx *ctx,
			 const struct loom_kv_write_args *a)
{
	return LOOM_ERR_UNSUPPORTED;
}

#ifndef FAKE_NO_ATTENTION
static int fake_attention(struct loom_backend_ctx *ctx,
			  const struct loom_attention_args *a)
{
	return LOOM_ERR_UNSUPPORTED;
}
#define FAKE_ATTENTION fake_attention
#else
#define FAKE_ATTENTION NULL
#endif

#ifdef FAKE_LIBC_SLOT
/* gemm points at libc's abort: code, but not the backend's own. */
#define FAKE_GEMM ((int (*)(struct loom_backend_ctx *, const struct loom_gemm_args *)) \
		   (void (*)(void))abort)
#else
#define FAKE_GEMM fake_gemm
#endif

#ifdef FAKE_SMALL
/* A table from before `attention` existed: one pointer short. */
#define FAKE_SIZE (offsetof(struct loom_backend_ops, attention))
#else
#define FAKE_SIZE sizeof(struct loom_backend_ops)
#endif

static const struct loom_backend_ops fake_ops = {
	.abi_major = FAKE_ABI_MAJOR,
	.abi_minor = LOOM_BACKEND_ABI_MINOR,
	.struct_size = FAKE_SIZE,
	.name = FAKE_TAG,
	.create = fake_create,
	.destroy = fake_destroy,
	.device_info = fake_device_info,
	.supports = fake_supports,
	.buffer_alloc = fake_buffer_alloc,
	.buffer_free = fake_buffer_free,
	.buffer_addr = fake_buffer_addr,
	.upload = fake_xfer,
	.download = fake_xfer,
	.copy = fake_xfer,
	.synchronize = fake_synchronize,
	.gemm = FAKE_GEMM,
	.embed = fake_embed,
	.rmsnorm = fake_rmsnorm,
	.rope = fake_rope,
	.glu = fake_glu,
	.add = fake_add,
	.scale = fake_scale,
	.kv_write = fake_kv_write,
	.attention = FAKE_ATTENTION,
};

#if defined(FAKE_NO_ENTRY)
/* Misspelled on purpose: the loader must not find loom_backend_entry. */
LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry_v0(void)
{
	return &fake_ops;
}
#elif defined(FAKE_DATA_ENTRY)
/* The entry symbol names a data object, not a function: calling it would
 * jump into data. */
LOOM_EXPORT const unsigned char fake_data_entry[64] __asm__("loom_backend_entry") = { 0xff };
const void *fake_keep = &fake_ops;
#else
#if defined(FAKE_FF_TABLE) || defined(FAKE_FF_SLOTS)
/* A table of 0xff bytes; with FAKE_FF_SLOTS its head is a good one, so
 * only the slots are garbage. */
static union {
	unsigned char bytes[sizeof(struct loom_backend_ops)];
	struct loom_backend_ops ops;
} fake_ff;
#endif

LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
#if defined(FAKE_NULL_TABLE)
	(void)&fake_ops;
	return NULL;
#elif defined(FAKE_WILD_TABLE)
	(void)&fake_ops;
	return (const struct loom_backend_ops *)(uintptr_t)0xdead0000;
#elif defined(FAKE_FF_TABLE) || defined(FAKE_FF_SLOTS)
	(void)&fake_ops;
	memset(fake_ff.bytes, 0xff, sizeof(fake_ff.bytes));
#ifdef FAKE_FF_SLOTS
	fake_ff.ops.abi_major = LOOM_BACKEND_ABI_MAJOR;
	fake_ff.ops.abi_minor = LOOM_BACKEND_ABI_MINOR;
	fake_ff.ops.struct_size = sizeof(struct loom_backend_ops);
#endif
	return &fake_ff.ops;
#else
	return &fake_ops;
#endif
}
#endif
