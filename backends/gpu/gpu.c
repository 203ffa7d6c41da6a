/*
 * gpu.c: host side of cuda.so and rocm.so (built once per vendor, with
 * GPU_BACKEND_NAME "cuda" or "rocm"). Plain C: the device work goes
 * through gpu_rt.h to kernels.cu.
 *
 * Arguments are validated exactly like the reference backend (ref_ops.c),
 * before anything is queued. Operators whose validity depends on device
 * int32 tables (embed ids, kv_write slots, attention's q_start / kv_len /
 * block_table) download those tables first and check them on the host;
 * that costs one synchronization per such call, the price of never
 * letting a bad index reach a kernel.
 *
 * Decode GEMM (m < BLAS_MIN_M) runs the GEMV kernel straight on the
 * quantized weights. Prefill with cuBLAS converts the activations to f16
 * and dequantizes panels of f16 or quantized weight rows to f16 for
 * cublasGemmEx (tensor cores, f32 accumulation); f32 and bf16 weights, and
 * every weight with LOOM_GPU_GEMM=f32, go through f32 panels and
 * cublasSgemm (TF32 off). Without a vendor BLAS a tiled f32 kernel runs.
 * Attention runs sequences with at least PREFILL_MIN_Q new rows through
 * the tiled prefill kernel and the rest through split-K.
 *
 * LOOM_BACKEND_BATCH_INVARIANT: every GEMM goes through GEMV and every
 * attention row through split-K, whose arithmetic for one output row does
 * not depend on the batch around it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_rt.h"
#include "loom/backend_check.h"

#ifndef GPU_BACKEND_NAME
#error "GPU_BACKEND_NAME must name the backend (\"cuda\" or \"rocm\")"
#endif

#define BLAS_MIN_M 16
#define PANEL_BYTES ((size_t)64 << 20)   /* dequantized weight panel */
#define PARTIAL_BYTES ((size_t)64 << 20) /* split-K partial results per launch */
#define PREFILL_MIN_Q 8

struct loom_backend_ctx {
	const struct loom_backend_host *host;
	struct gpurt *rt;
	bool invariant;
	bool half_gemm; /* prefill of f16 / quantized weights on f16 tensor cores */
	void *scratch; /* device: weight panels, split-K partials */
	size_t scratch_cap;
	void *items; /* device: attention work items */
	size_t items_cap;
	void *hbuf; /* host: downloaded index tables, attention items */
	size_t hbuf_cap;
};

struct loom_buffer {
	void *ptr;
	size_t size;
};

static void gpu_log(const struct loom_backend_host *host, enum loom_log_level lvl,
		    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void gpu_log(const struct loom_backend_host *host, enum loom_log_level lvl,
		    const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!host || !host->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	host->log(host->host, lvl, msg);
}

/* A failed gpurt call: log its reason, pass its status on. */
static int rt_failed(struct loom_backend_ctx *ctx, int rc)
{
	if (rc)
		gpu_log(ctx->host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": %s", gpurt_error(ctx->rt));
	return rc;
}

/* ---- argument checks (the same rules as ref_ops.c) ---- */



static size_t row_size(int64_t n, uint32_t type, bool *ok)
{
	uint32_t be = gpurt_block_elems(type), bb = gpurt_block_bytes(type);
	uint64_t blocks;

	*ok = n >= 0 && n % be == 0;
	if (!*ok)
		return 0;
	blocks = (uint64_t)n / be;
	*ok = blocks <= (uint64_t)(INT64_MAX / 16) / bb;
	return *ok ? (size_t)(blocks * bb) : 0;
}


/* ---- scratch ---- */

/* Makes the device buffer *buf hold at least n bytes. */
static int reserve_dev(struct loom_backend_ctx *ctx, void **buf, size_t *cap, size_t n)
{
	int rc;

	if (*cap >= n)
		return LOOM_OK;
	gpurt_free(ctx->rt, *buf); /* waits for the kernels still using it */
	*buf = NULL;
	*cap = 0;
	rc = gpurt_alloc(ctx->rt, n ? n : 64, buf);
	if (rc)
		return rt_failed(ctx, rc);
	*cap = n;
	return LOOM_OK;
}

static void *reserve_host(struct loom_backend_ctx *ctx, size_t n)
{
	void *p;

	if (ctx->hbuf_cap >= n)
		return ctx->hbuf;
	p = realloc(ctx->hbuf, n ? n : 64);
	if (!p)
		return NULL;
	ctx->hbuf = p;
	ctx->hbuf_cap = n;
	return p;
}

/* A host copy of n device int32 values (in ctx->hbuf), or NULL with *rc set. */
static int32_t *fetch_i32(struct loom_backend_ctx *ctx, const int32_t *dev, int64_t n, int *rc)
{
	int32_t *h;

	*rc = LOOM_ERR_NOMEM;
	if (n < 0 || (uint64_t)n > SIZE_MAX / 8)
		return NULL;
	h = reserve_host(ctx, (size_t)n * sizeof(int32_t));
	if (!h)
		return NULL;
	*rc = n ? rt_failed(ctx, gpurt_download(ctx->rt, h, dev, (size_t)n * sizeof(int32_t))) :
		  LOOM_OK;
	return *rc ? NULL : h;
}

/* ---- context ---- */

static void gpu_destroy(struct loom_backend_ctx *ctx)
{
	if (!ctx)
		return;
	gpurt_free(ctx->rt, ctx->scratch);
	gpurt_free(ctx->rt, ctx->items);
	gpurt_close(ctx->rt);
	free(ctx->hbuf);
	free(ctx);
}

static int gpu_create(const struct loom_backend_host *host, const struct loom_backend_config *cfg,
		      struct loom_backend_ctx **out)
{
	struct loom_backend_ctx *ctx;
	char why[256] = "";
	const char *gemm_env;
	int n = 0, device = 0, rc;

	if (!out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	if (!host || host->abi_major != LOOM_BACKEND_ABI_MAJOR || host->struct_size < sizeof(*host)) {
		gpu_log(host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": incompatible host services table");
		return LOOM_ERR_INVALID;
	}
	if (cfg && cfg->struct_size >= sizeof(*cfg))
		device = cfg->device;
	if (gpurt_device_count(&n, why, sizeof(why)) || n <= 0) {
		gpu_log(host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": no %s device or driver found: %s",
			gpurt_vendor(), n <= 0 && !why[0] ? "no devices" : why);
		return LOOM_ERR_DEVICE;
	}
	if (device < 0 || device >= n) {
		gpu_log(host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": no %s device %d (%d found)",
			gpurt_vendor(), device, n);
		return LOOM_ERR_DEVICE;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return LOOM_ERR_NOMEM;
	ctx->host = host;
	ctx->invariant = cfg && cfg->struct_size >= sizeof(*cfg) &&
			 (cfg->flags & LOOM_BACKEND_BATCH_INVARIANT);
	/* LOOM_GPU_GEMM=f32 keeps prefill in f32 (no tensor cores) */
	gemm_env = getenv("LOOM_GPU_GEMM");
	ctx->half_gemm = gpurt_has_blas() && !(gemm_env && !strcmp(gemm_env, "f32"));
	rc = gpurt_open(device, &ctx->rt, why, sizeof(why));
	if (rc) {
		gpu_log(host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": %s", why);
		free(ctx);
		return rc;
	}
	gpu_log(host, LOOM_LOG_INFO, GPU_BACKEND_NAME ": %s device %d%s, prefill GEMM %s",
		gpurt_vendor(), device, ctx->invariant ? ", batch invariant" : "",
		!gpurt_has_blas() ? "tiled f32 kernel" :
		ctx->half_gemm ? "f16 tensor cores (f32 for f32/bf16 weights)" : "f32 BLAS");
	*out = ctx;
	return LOOM_OK;
}

static int gpu_device_info(struct loom_backend_ctx *ctx, struct loom_device_info *out)
{
	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	memset(out, 0, sizeof(*out));
	return rt_failed(ctx, gpurt_info(ctx->rt, out->name, sizeof(out->name), &out->mem_total,
					 &out->mem_free));
}

static bool gpu_supports(struct loom_backend_ctx *ctx, enum loom_op op, uint32_t type)
{
	if (!ctx || (unsigned)op >= LOOM_OP_COUNT)
		return false;
	if (op == LOOM_OP_GEMM || op == LOOM_OP_EMBED)
		return gpurt_format_known(type);
	return type == LOOM_TYPE_F32;
}

/* ---- memory ---- */

static int gpu_buffer_alloc(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out)
{
	struct loom_buffer *buf;
	int rc;

	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	if (size > SIZE_MAX - 64)
		return LOOM_ERR_NOMEM;
	buf = malloc(sizeof(*buf));
	if (!buf)
		return LOOM_ERR_NOMEM;
	/* the runtimes align allocations to 256 bytes or more */
	rc = gpurt_alloc(ctx->rt, size ? size : 64, &buf->ptr);
	if (rc) {
		rt_failed(ctx, rc);
		free(buf);
		return rc;
	}
	buf->size = size;
	*out = buf;
	return LOOM_OK;
}

static void gpu_buffer_free(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	if (!ctx || !buf)
		return;
	gpurt_free(ctx->rt, buf->ptr);
	free(buf);
}

static void *gpu_buffer_addr(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	return buf ? buf->ptr : NULL;
}

static int gpu_upload(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	if (!ctx || (n && (!dst || !src)))
		return LOOM_ERR_INVALID;
	return n ? rt_failed(ctx, gpurt_upload(ctx->rt, dst, src, n)) : LOOM_OK;
}

static int gpu_download(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	if (!ctx || (n && (!dst || !src)))
		return LOOM_ERR_INVALID;
	return n ? rt_failed(ctx, gpurt_download(ctx->rt, dst, src, n)) : LOOM_OK;
}

static int gpu_copy(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
{
	if (!ctx || (n && (!dst || !src)))
		return LOOM_ERR_INVALID;
	return n ? rt_failed(ctx, gpurt_copy(ctx->rt, dst, src, n)) : LOOM_OK;
}

static int gpu_synchronize(struct loom_backend_ctx *ctx)
{
	if (!ctx)
		return LOOM_ERR_INVALID;
	return rt_failed(ctx, gpurt_sync(ctx->rt));
}

/* ---- gemm and embed ---- */

/*
 * Prefill: panels of weight rows dequantized on the device, one GEMM per
 * panel. In f32 (half false): cublasSgemm or the tiled kernel on the f32
 * activations. In f16 (half true, tensor cores): the activations are
 * converted to f16 once, panels are f16, cublasGemmEx accumulates in f32.
 * Scratch: [activations as f16, m x k, when half][panel, rows x k].
 */
static int gemm_panels(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a, bool half)
{
	const size_t es = half ? sizeof(uint16_t) : sizeof(float);
	int64_t rows = (int64_t)(PANEL_BYTES / es) / a->k;
	size_t x_bytes, panel_bytes;
	void *panel;
	int rc = LOOM_OK;

	if (rows < 1)
		rows = 1;
	if (rows > a->n)
		rows = a->n;
	/* m x k floats already exist as the caller's activations, so m x k
	 * halves fit in size_t; only the sum needs a check */
	x_bytes = half ? (size_t)a->m * (size_t)a->k * es : 0;
	panel_bytes = (size_t)rows * (size_t)a->k * es;
	if (x_bytes > SIZE_MAX - panel_bytes)
		return LOOM_ERR_NOMEM;
	rc = reserve_dev(ctx, &ctx->scratch, &ctx->scratch_cap, x_bytes + panel_bytes);
	if (rc)
		return rc;
	panel = (char *)ctx->scratch + x_bytes;
	if (half)
		rc = rt_failed(ctx, gpurt_to_half(ctx->rt, a->x, a->x_stride, a->m, a->k,
						  ctx->scratch));
	for (int64_t j0 = 0; j0 < a->n && !rc; j0 += rows) {
		int64_t r = a->n - j0 < rows ? a->n - j0 : rows;
		const char *w = (const char *)a->w + (size_t)j0 * a->w_stride;

		if (half) {
			rc = gpurt_dequant_half(ctx->rt, a->w_type, w, a->w_stride, a->k, r, panel,
						a->k);
			if (!rc)
				rc = gpurt_hgemm(ctx->rt, a->m, r, a->k, ctx->scratch, panel,
						 a->y + j0, a->y_stride);
		} else {
			rc = gpurt_dequant(ctx->rt, a->w_type, w, a->w_stride, a->k, r, NULL, panel,
					   a->k);
			if (!rc)
				rc = gpurt_sgemm(ctx->rt, a->m, r, a->k, a->x, a->x_stride, panel,
						 a->y + j0, a->y_stride);
		}
		rt_failed(ctx, rc);
	}
	return rc;
}

static int gpu_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	size_t w_row;
	bool ok;

	if (!ctx || !a || a->struct_size < sizeof(*a) || a->m < 0 || a->n < 0 || a->k < 0)
		return LOOM_ERR_INVALID;
	if (!gpurt_format_known(a->w_type))
		return LOOM_ERR_UNSUPPORTED;
	w_row = row_size(a->k, a->w_type, &ok);
	if (!ok || a->w_stride < w_row || !loom_check_bytes(a->n, w_row, a->w_stride) ||
	    !loom_check_shape(a->m, a->k, a->x_stride) || !loom_check_shape(a->m, a->n, a->y_stride))
		return LOOM_ERR_INVALID;
	if (a->m == 0 || a->n == 0)
		return LOOM_OK;
	if (!a->x || !a->y || (!a->w && a->k > 0))
		return LOOM_ERR_INVALID;
	if (ctx->invariant || a->m < BLAS_MIN_M || a->k == 0)
		return rt_failed(ctx, gpurt_gemv(ctx->rt, a));
	/* f16 panels for f16 and quantized weights; f32 and bf16 (whose range
	 * f16 lacks) keep f32 */
	return gemm_panels(ctx, a, ctx->half_gemm && a->w_type != LOOM_TYPE_F32 &&
					   a->w_type != LOOM_TYPE_BF16);
}

static int gpu_embed(struct loom_backend_ctx *ctx, float *out, const void *table, uint32_t type,
		     size_t row_bytes, int64_t n_rows, int64_t dim, const int32_t *ids,
		     int64_t n_ids)
{
	const int32_t *h;
	size_t need;
	bool ok;
	int rc;

	if (!ctx || n_rows < 0 || dim < 0 || n_ids < 0)
		return LOOM_ERR_INVALID;
	if (!gpurt_format_known(type))
		return LOOM_ERR_UNSUPPORTED;
	need = row_size(dim, type, &ok);
	if (!ok || row_bytes < need || !loom_check_bytes(n_rows, need, row_bytes) ||
	    !loom_check_shape(n_ids, dim, dim))
		return LOOM_ERR_INVALID;
	if (n_ids == 0)
		return LOOM_OK;
	if (!out || !ids || (!table && dim > 0))
		return LOOM_ERR_INVALID;
	h = fetch_i32(ctx, ids, n_ids, &rc);
	if (!h)
		return rc;
	for (int64_t i = 0; i < n_ids; i++)
		if (h[i] < 0 || h[i] >= n_rows)
			return LOOM_ERR_INVALID;
	if (dim == 0)
		return LOOM_OK;
	return rt_failed(ctx, gpurt_dequant(ctx->rt, type, table, row_bytes, dim, n_ids, ids, out,
					    dim));
}

/* ---- row and elementwise operators ---- */

static int gpu_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride, const float *x,
		       int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps)
{
	if (!ctx || !loom_check_shape(rows, n, x_stride) || !loom_check_shape(rows, n, y_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!y || !x || !w)
		return LOOM_ERR_INVALID;
	return rt_failed(ctx, gpurt_rmsnorm(ctx->rt, y, y_stride, x, x_stride, w, rows, n, eps));
}

static int gpu_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	int rc = ctx ? loom_check_rope(a) : LOOM_ERR_INVALID;

	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	return rt_failed(ctx, gpurt_rope(ctx->rt, a));
}

static int gpu_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
		   int64_t out_stride, const float *gate, int64_t gate_stride, const float *up,
		   int64_t up_stride, int64_t rows, int64_t n)
{
	if (!ctx || (kind != LOOM_GLU_SILU && kind != LOOM_GLU_GELU_TANH))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(rows, n, out_stride) || !loom_check_shape(rows, n, gate_stride) ||
	    !loom_check_shape(rows, n, up_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !gate || !up)
		return LOOM_ERR_INVALID;
	return rt_failed(ctx, gpurt_glu(ctx->rt, kind, out, out_stride, gate, gate_stride, up,
					up_stride, rows, n));
}

static int gpu_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride, const float *a,
		   int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows, int64_t rows,
		   int64_t n)
{
	if (!ctx || (b_rows != 1 && b_rows != rows))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(rows, n, out_stride) || !loom_check_shape(rows, n, a_stride) ||
	    !loom_check_shape(b_rows, n, b_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !a || !b)
		return LOOM_ERR_INVALID;
	return rt_failed(ctx, gpurt_add(ctx->rt, out, out_stride, a, a_stride, b, b_stride, b_rows,
					rows, n));
}

static int gpu_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		     int64_t n, float s)
{
	if (!ctx || !loom_check_shape(rows, n, stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!x)
		return LOOM_ERR_INVALID;
	return rt_failed(ctx, gpurt_scale(ctx->rt, x, stride, rows, n, s));
}

static int gpu_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a)
{
	const int32_t *h;
	int rc;

	rc = ctx ? loom_check_kv_write(a) : LOOM_ERR_INVALID;
	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	h = fetch_i32(ctx, a->slots, a->n_tokens, &rc);
	if (!h)
		return rc;
	if (!loom_check_slots(h, a->n_tokens, a->kv_dim))
		return LOOM_ERR_INVALID;
	return rt_failed(ctx, gpurt_kv_write(ctx->rt, a));
}

/* ---- attention ---- */


/* Host copies of the three device tables, checked like ref's seqs_ok. */
struct attn_tables {
	const int32_t *q_start, *kv_len, *block_table;
	int64_t rows;
};

static int fetch_tables(struct loom_backend_ctx *ctx, const struct loom_attention_args *a,
			struct attn_tables *t)
{
	int64_t n_table = a->n_seqs * a->max_blocks, longest;
	int64_t total = 2 * a->n_seqs + 1 + n_table;
	int32_t *h;
	int rc;

	if ((uint64_t)total > SIZE_MAX / 8)
		return LOOM_ERR_NOMEM;
	h = reserve_host(ctx, (size_t)total * sizeof(int32_t));
	if (!h)
		return LOOM_ERR_NOMEM;
	rc = gpurt_download(ctx->rt, h, a->q_start, (size_t)(a->n_seqs + 1) * sizeof(int32_t));
	if (!rc)
		rc = gpurt_download(ctx->rt, h + a->n_seqs + 1, a->kv_len,
				    (size_t)a->n_seqs * sizeof(int32_t));
	if (!rc && n_table)
		rc = gpurt_download(ctx->rt, h + 2 * a->n_seqs + 1, a->block_table,
				    (size_t)n_table * sizeof(int32_t));
	if (rc)
		return rt_failed(ctx, rc);
	t->q_start = h;
	t->kv_len = h + a->n_seqs + 1;
	t->block_table = h + 2 * a->n_seqs + 1;
	if (!loom_check_attention_tables(a, t->q_start, t->kv_len, t->block_table,
					 &t->rows, &longest))
		return LOOM_ERR_INVALID;
	return LOOM_OK;
}

/* Work items: prefill tiles first, then single rows for split-K. */
struct attn_plan {
	struct gpu_attn_tile *tiles;
	struct gpu_attn_row *rows;
	int64_t n_tiles, n_rows, n_splits;
};

static int plan_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a,
			  const struct attn_tables *t, struct attn_plan *pl)
{
	bool tiled_ok = !ctx->invariant && a->head_dim <= GPU_ATTN_PREFILL_MAX_HEAD_DIM;

	memset(pl, 0, sizeof(*pl));
	/* at most one item per query row */
	pl->tiles = malloc((size_t)t->rows * sizeof(*pl->tiles) + 1);
	pl->rows = malloc((size_t)t->rows * sizeof(*pl->rows) + 1);
	if (!pl->tiles || !pl->rows)
		return LOOM_ERR_NOMEM;
	for (int64_t s = 0; s < a->n_seqs; s++) {
		int32_t q0 = t->q_start[s], q_len = t->q_start[s + 1] - q0;
		int32_t pos0 = t->kv_len[s] - q_len;

		if (tiled_ok && q_len >= PREFILL_MIN_Q) {
			for (int32_t i = 0; i < q_len; i += GPU_ATTN_TILE_Q)
				pl->tiles[pl->n_tiles++] = (struct gpu_attn_tile){
					.seq = (int32_t)s, .row = q0 + i, .pos = pos0 + i,
					.n = q_len - i < GPU_ATTN_TILE_Q ? q_len - i : GPU_ATTN_TILE_Q,
				};
			continue;
		}
		for (int32_t i = 0; i < q_len; i++) {
			int32_t pos = pos0 + i;
			int32_t lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
			int64_t splits = ((int64_t)pos - lo + GPU_ATTN_SPLIT) / GPU_ATTN_SPLIT;

			pl->rows[pl->n_rows++] = (struct gpu_attn_row){
				.seq = (int32_t)s, .row = q0 + i, .pos = pos, .lo = lo,
			};
			if (splits > pl->n_splits)
				pl->n_splits = splits;
		}
	}
	return LOOM_OK;
}

/* Uploads the plan and runs it: the tiles in one launch, the rows in as
 * many split-K launches as keep the partials within PARTIAL_BYTES. */
static int run_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a,
			 const struct attn_plan *pl)
{
	size_t tile_bytes = (size_t)pl->n_tiles * sizeof(*pl->tiles);
	size_t row_bytes = (size_t)pl->n_rows * sizeof(*pl->rows);
	size_t per_row = (size_t)a->n_heads * (size_t)pl->n_splits * (size_t)(a->head_dim + 2) *
			 sizeof(float);
	int64_t batch = per_row ? (int64_t)(PARTIAL_BYTES / per_row) : 1;
	struct gpu_attn_tile *dtiles;
	struct gpu_attn_row *drows;
	int rc;

	/* rows start 16-aligned after the tiles (both are 16-byte records) */
	rc = reserve_dev(ctx, &ctx->items, &ctx->items_cap, tile_bytes + row_bytes);
	if (rc)
		return rc;
	dtiles = ctx->items;
	drows = (struct gpu_attn_row *)((char *)ctx->items + tile_bytes);
	if (tile_bytes)
		rc = gpurt_upload(ctx->rt, dtiles, pl->tiles, tile_bytes);
	if (!rc && row_bytes)
		rc = gpurt_upload(ctx->rt, drows, pl->rows, row_bytes);
	if (!rc)
		rc = gpurt_attn_prefill(ctx->rt, a, dtiles, pl->n_tiles);
	if (rc)
		return rt_failed(ctx, rc);
	if (pl->n_rows == 0)
		return LOOM_OK;
	if (batch < 1)
		batch = 1;
	if (batch > pl->n_rows)
		batch = pl->n_rows;
	rc = reserve_dev(ctx, &ctx->scratch, &ctx->scratch_cap, (size_t)batch * per_row);
	for (int64_t r0 = 0; r0 < pl->n_rows && !rc; r0 += batch) {
		int64_t n = pl->n_rows - r0 < batch ? pl->n_rows - r0 : batch;

		rc = rt_failed(ctx, gpurt_attn_split(ctx->rt, a, drows + r0, n, pl->n_splits,
						     ctx->scratch));
	}
	return rc;
}

static int gpu_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	struct attn_tables t;
	struct attn_plan pl;
	int64_t width;
	int rc;

	if (!ctx || !a || a->struct_size < sizeof(*a) || !loom_check_attention_args(a))
		return LOOM_ERR_INVALID;
	if (a->n_seqs == 0)
		return LOOM_OK;
	if (!a->q_start || !a->kv_len || !a->block_table)
		return LOOM_ERR_INVALID;
	rc = fetch_tables(ctx, a, &t);
	if (rc)
		return rc;
	width = a->n_heads * a->head_dim;
	if (!loom_check_shape(t.rows, width, a->q_stride) || !loom_check_shape(t.rows, width, a->out_stride))
		return LOOM_ERR_INVALID;
	if (t.rows == 0)
		return LOOM_OK;
	if (!a->out || !a->q || !a->kcache || !a->vcache)
		return LOOM_ERR_INVALID;
	if (a->head_dim > GPU_ATTN_MAX_HEAD_DIM) {
		gpu_log(ctx->host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": attention head_dim %lld > %d",
			(long long)a->head_dim, GPU_ATTN_MAX_HEAD_DIM);
		return LOOM_ERR_UNSUPPORTED;
	}
	rc = plan_attention(ctx, a, &t, &pl);
	if (!rc)
		rc = run_attention(ctx, a, &pl);
	free(pl.tiles);
	free(pl.rows);
	return rc;
}

static const struct loom_backend_ops gpu_ops = {
	.abi_major = LOOM_BACKEND_ABI_MAJOR,
	.abi_minor = LOOM_BACKEND_ABI_MINOR,
	.struct_size = sizeof(struct loom_backend_ops),
	.name = GPU_BACKEND_NAME,
	.create = gpu_create,
	.destroy = gpu_destroy,
	.device_info = gpu_device_info,
	.supports = gpu_supports,
	.buffer_alloc = gpu_buffer_alloc,
	.buffer_free = gpu_buffer_free,
	.buffer_addr = gpu_buffer_addr,
	.upload = gpu_upload,
	.download = gpu_download,
	.copy = gpu_copy,
	.synchronize = gpu_synchronize,
	.gemm = gpu_gemm,
	.embed = gpu_embed,
	.rmsnorm = gpu_rmsnorm,
	.rope = gpu_rope,
	.glu = gpu_glu,
	.add = gpu_add,
	.scale = gpu_scale,
	.kv_write = gpu_kv_write,
	.attention = gpu_attention,
};

/* Returns the table only: no runtime call, so probing has no side effects. */
LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
	return &gpu_ops;
}
