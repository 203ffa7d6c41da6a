/*
 * ref.so: context, memory and the ops table of the scalar reference
 * backend. The operators live in ref_ops.c.
 */
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "../mpi/coll.h"

/* A buffer is 64-byte aligned host memory. */
struct loom_buffer {
	void *data;
	size_t size;
};

void ref_log(struct loom_backend_ctx *ctx, const char *msg)
{
	if (ctx && ctx->host && ctx->host->log)
		ctx->host->log(ctx->host->host, LOOM_LOG_ERROR, msg);
}

static void host_log(const struct loom_backend_host *host, const char *msg)
{
	if (host && host->log)
		host->log(host->host, LOOM_LOG_ERROR, msg);
}

/* ref has one device, the host CPU; it only needs the host's services. */
static int ref_create(const struct loom_backend_host *host,
		      const struct loom_backend_config *cfg,
		      struct loom_backend_ctx **out)
{
	struct loom_backend_ctx *ctx;

	if (!out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	if (!host || host->abi_major != LOOM_BACKEND_ABI_MAJOR ||
	    !LOOM_ARGS_HAS(host, struct loom_backend_host, to_float) || !host->format_info ||
	    !host->to_float) {
		host_log(host, "ref: incompatible host services table");
		return LOOM_ERR_INVALID;
	}
	if (cfg && cfg->device != 0) {
		host_log(host, "ref: only device 0 (the host CPU) exists");
		return LOOM_ERR_DEVICE;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return LOOM_ERR_NOMEM;
	ctx->host = host;
	*out = ctx;
	return LOOM_OK;
}

static void ref_destroy(struct loom_backend_ctx *ctx)
{
	free(ctx);
}

static int ref_device_info(struct loom_backend_ctx *ctx, struct loom_device_info *out)
{
	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	memset(out, 0, sizeof(*out));
	strcpy(out->name, "ref (scalar reference)");
	return LOOM_OK;
}

static int ref_buffer_alloc(struct loom_backend_ctx *ctx, size_t size,
			    struct loom_buffer **out)
{
	struct loom_buffer *buf;
	size_t padded;

	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	/* aligned_alloc wants a multiple of the alignment; never zero. */
	if (size > SIZE_MAX - 64)
		return LOOM_ERR_NOMEM;
	padded = (size + 63) / 64 * 64;
	if (padded == 0)
		padded = 64;
	buf = malloc(sizeof(*buf));
	if (!buf)
		return LOOM_ERR_NOMEM;
	buf->data = aligned_alloc(64, padded);
	if (!buf->data) {
		free(buf);
		return LOOM_ERR_NOMEM;
	}
	buf->size = size;
	*out = buf;
	return LOOM_OK;
}

static void ref_buffer_free(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	if (!buf)
		return;
	free(buf->data);
	free(buf);
}

static void *ref_buffer_addr(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	return buf ? buf->data : NULL;
}

/* Host and device memory are the same, so every copy is a memmove. */
static int ref_memcpy(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	if (!ctx)
		return LOOM_ERR_INVALID;
	if (n == 0)
		return LOOM_OK;
	if (!dst || !src)
		return LOOM_ERR_INVALID;
	memmove(dst, src, n);
	return LOOM_OK;
}

/* Every operator finishes before it returns. */
static int ref_synchronize(struct loom_backend_ctx *ctx)
{
	return ctx ? LOOM_OK : LOOM_ERR_INVALID;
}

/* Collectives on host memory through MPI (backends/mpi/coll.c). */
static int ref_collective(struct loom_backend_ctx *ctx, const struct loom_collective_args *a)
{
	char why[160];
	int rc = loom_mpi_collective(a, why, sizeof(why));

	if (rc && rc != LOOM_ERR_UNSUPPORTED)
		ref_log(ctx, why);
	return rc;
}

static const struct loom_backend_ops ref_ops = {
	.abi_major = LOOM_BACKEND_ABI_MAJOR,
	.abi_minor = LOOM_BACKEND_ABI_MINOR,
	.struct_size = sizeof(struct loom_backend_ops),
	.name = "ref",
	.create = ref_create,
	.destroy = ref_destroy,
	.device_info = ref_device_info,
	.supports = ref_supports,
	.buffer_alloc = ref_buffer_alloc,
	.buffer_free = ref_buffer_free,
	.buffer_addr = ref_buffer_addr,
	.upload = ref_memcpy,
	.download = ref_memcpy,
	.copy = ref_memcpy,
	.synchronize = ref_synchronize,
	.gemm = ref_gemm,
	.embed = ref_embed,
	.rmsnorm = ref_rmsnorm,
	.rope = ref_rope,
	.glu = ref_glu,
	.add = ref_add,
	.scale = ref_scale,
	.kv_write = ref_kv_write,
	.attention = ref_attention,
	.softcap = ref_softcap,
	.collective = ref_collective,
	.moe = ref_moe,
};

LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
	return &ref_ops;
}
