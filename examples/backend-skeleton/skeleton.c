/*
 * skeleton.so: the smallest complete loom backend, written to be copied.
 *
 * It runs on the host CPU, one plain loop per operator, and claims f32
 * and f16 weights only: gemm and embed on any other format return
 * LOOM_ERR_UNSUPPORTED (and supports() says so), which `loom check-backend`
 * reports as skipped, not failed. Everything else (norms, rope, attention,
 * the KV cache) is f32, as loom/backend.h specifies.
 *
 * It includes only the public plugin headers (pkg-config loom-backend) and
 * exports one symbol, loom_backend_entry; build with -fvisibility=hidden.
 * Argument checks come from loom/backend_check.h, so it refuses exactly
 * the calls ref.so refuses, with LOOM_ERR_INVALID.
 *
 * Build with -DSKELETON_BREAK_RMSNORM for a deliberately wrong rmsnorm, to
 * see `loom check-backend` fail and name the op.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <loom/backend.h>
#include <loom/backend_check.h>

/* Whether an argument struct from the host reaches `field`: structs grow at
 * the end, so a plugin checks the fields it reads, never the whole struct's
 * size (a newer host's struct is larger, an older one's may be smaller). */
#define HAS(a, type, field) \
	((a)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

/* What create() makes: the host's services, kept for logging. */
struct loom_backend_ctx {
	const struct loom_backend_host *host;
};

/* A buffer is host memory; its device address is its host address. */
struct loom_buffer {
	void *data;
};

static void sk_log(const struct loom_backend_host *host, const char *msg)
{
	if (host && host->log)
		host->log(host->host, LOOM_LOG_ERROR, msg);
}

/* ---- lifecycle and memory ---- */

static int sk_create(const struct loom_backend_host *host, const struct loom_backend_config *cfg,
		     struct loom_backend_ctx **out)
{
	struct loom_backend_ctx *ctx;

	if (!out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	/* the host table may be newer (larger) than ours, never older */
	if (!host || host->abi_major != LOOM_BACKEND_ABI_MAJOR ||
	    !HAS(host, struct loom_backend_host, to_float))
		return LOOM_ERR_INVALID;
	if (cfg && cfg->device != 0) {
		sk_log(host, "skeleton: only device 0 (the host CPU) exists");
		return LOOM_ERR_DEVICE;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return LOOM_ERR_NOMEM;
	ctx->host = host;
	*out = ctx;
	return LOOM_OK;
}

static void sk_destroy(struct loom_backend_ctx *ctx)
{
	free(ctx);
}

static int sk_device_info(struct loom_backend_ctx *ctx, struct loom_device_info *out)
{
	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "skeleton (host CPU, plain loops)");
	return LOOM_OK;
}

static bool weight_type_ok(uint32_t type)
{
	return type == LOOM_TYPE_F32 || type == LOOM_TYPE_F16;
}

static bool sk_supports(struct loom_backend_ctx *ctx, enum loom_op op, uint32_t type)
{
	if (!ctx || (unsigned)op >= LOOM_OP_COUNT)
		return false;
	switch (op) {
	case LOOM_OP_GEMM:
	case LOOM_OP_EMBED:
		return weight_type_ok(type);
	case LOOM_OP_RMSNORM:
	case LOOM_OP_ROPE:
	case LOOM_OP_GLU:
	case LOOM_OP_ADD:
	case LOOM_OP_SCALE:
	case LOOM_OP_KV_WRITE:
	case LOOM_OP_ATTENTION:
	case LOOM_OP_COPY:
		return type == LOOM_TYPE_F32;
	default:
		/* ops of later generations (softcap) need slots it lacks */
		return false;
	}
}

static int sk_buffer_alloc(struct loom_backend_ctx *ctx, size_t size, struct loom_buffer **out)
{
	struct loom_buffer *buf;
	size_t rounded;

	if (!ctx || !out)
		return LOOM_ERR_INVALID;
	*out = NULL;
	if (size > SIZE_MAX - 64)
		return LOOM_ERR_NOMEM;
	/* aligned_alloc wants a size that is a multiple of the alignment */
	rounded = size ? (size + 63) / 64 * 64 : 64;
	buf = malloc(sizeof(*buf));
	if (!buf)
		return LOOM_ERR_NOMEM;
	buf->data = aligned_alloc(64, rounded);
	if (!buf->data) {
		free(buf);
		return LOOM_ERR_NOMEM;
	}
	*out = buf;
	return LOOM_OK;
}

static void sk_buffer_free(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	(void)ctx;
	if (buf)
		free(buf->data);
	free(buf);
}

static void *sk_buffer_addr(struct loom_backend_ctx *ctx, struct loom_buffer *buf)
{
	(void)ctx;
	return buf ? buf->data : NULL;
}

/* upload, download and copy: all host memory here. */
static int sk_memcpy(struct loom_backend_ctx *ctx, void *dst, const void *src, size_t n)
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

/* Every operator has finished when it returns. */
static int sk_synchronize(struct loom_backend_ctx *ctx)
{
	return ctx ? LOOM_OK : LOOM_ERR_INVALID;
}

/* ---- weights: f32 and f16 ---- */

/* IEEE half (1 sign, 5 exponent, 10 mantissa bits) to float. */
static float half_to_float(uint16_t h)
{
	int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	float v;

	if (exp == 0)
		v = ldexpf((float)man, -24);                 /* zero, subnormal */
	else if (exp == 31)
		v = man ? NAN : INFINITY;
	else
		v = ldexpf((float)(man | 0x400), exp - 25);  /* 1.man * 2^(exp-15) */
	return sign ? -v : v;
}

static size_t weight_size(uint32_t type)
{
	return type == LOOM_TYPE_F32 ? 4 : 2;
}

/* Row of n weights of `type` at src into dst. */
static void weights_to_float(uint32_t type, const void *src, float *dst, int64_t n)
{
	if (type == LOOM_TYPE_F32) {
		memcpy(dst, src, (size_t)n * sizeof(float));
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		uint16_t h;

		memcpy(&h, (const char *)src + 2 * i, 2);
		dst[i] = half_to_float(h);
	}
}

/* ---- operators ---- */

static int sk_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	float *w;

	if (!ctx || !a || !HAS(a, struct loom_gemm_args, y_stride) || a->m < 0 || a->n < 0 ||
	    a->k < 0)
		return LOOM_ERR_INVALID;
	if (!weight_type_ok(a->w_type))
		return LOOM_ERR_UNSUPPORTED;
	if ((uint64_t)a->k > LOOM_CHECK_LIMIT / 4 ||
	    a->w_stride < (size_t)a->k * weight_size(a->w_type) ||
	    !loom_check_bytes(a->n, (size_t)a->k * weight_size(a->w_type), a->w_stride) ||
	    !loom_check_shape(a->m, a->k, a->x_stride) || !loom_check_shape(a->m, a->n, a->y_stride))
		return LOOM_ERR_INVALID;
	if (a->m == 0 || a->n == 0)
		return LOOM_OK;
	if (!a->x || !a->y || (!a->w && a->k > 0))
		return LOOM_ERR_INVALID;
	w = malloc((size_t)(a->k + 1) * sizeof(float));
	if (!w)
		return LOOM_ERR_NOMEM;
	/* y[i][j] = x[i] . W[j], one weight row at a time */
	for (int64_t j = 0; j < a->n; j++) {
		weights_to_float(a->w_type, (const char *)a->w + (size_t)j * a->w_stride, w, a->k);
		for (int64_t i = 0; i < a->m; i++) {
			const float *x = a->x + i * a->x_stride;
			float sum = 0.0f;

			for (int64_t t = 0; t < a->k; t++)
				sum += x[t] * w[t];
			a->y[i * a->y_stride + j] = sum;
		}
	}
	free(w);
	return LOOM_OK;
}

static int sk_embed(struct loom_backend_ctx *ctx, float *out, const void *table, uint32_t type,
		    size_t row_bytes, int64_t n_rows, int64_t dim, const int32_t *ids,
		    int64_t n_ids)
{
	if (!ctx || n_rows < 0 || dim < 0 || n_ids < 0)
		return LOOM_ERR_INVALID;
	if (!weight_type_ok(type))
		return LOOM_ERR_UNSUPPORTED;
	if ((uint64_t)dim > LOOM_CHECK_LIMIT / 4 || row_bytes < (size_t)dim * weight_size(type) ||
	    !loom_check_bytes(n_rows, (size_t)dim * weight_size(type), row_bytes) ||
	    !loom_check_shape(n_ids, dim, dim))
		return LOOM_ERR_INVALID;
	if (n_ids == 0 || dim == 0)
		return LOOM_OK;
	if (!out || !ids || !table)
		return LOOM_ERR_INVALID;
	for (int64_t i = 0; i < n_ids; i++) /* every id checked before any write */
		if (ids[i] < 0 || ids[i] >= n_rows)
			return LOOM_ERR_INVALID;
	for (int64_t i = 0; i < n_ids; i++)
		weights_to_float(type, (const char *)table + (size_t)ids[i] * row_bytes,
				 out + i * dim, dim);
	return LOOM_OK;
}

static int sk_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride, const float *x,
		      int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps)
{
	if (!ctx || !loom_check_shape(rows, n, x_stride) || !loom_check_shape(rows, n, y_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!y || !x || !w)
		return LOOM_ERR_INVALID;
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * x_stride;
		float *yr = y + r * y_stride;
		double squares = 0.0;
		float inv;

		for (int64_t i = 0; i < n; i++)
			squares += (double)xr[i] * xr[i];
#ifdef SKELETON_BREAK_RMSNORM
		squares *= 1.01; /* the deliberate mistake: 1% too much */
#endif
		inv = (float)(1.0 / sqrt(squares / (double)n + eps));
		for (int64_t i = 0; i < n; i++)
			yr[i] = xr[i] * inv * w[i];
	}
	return LOOM_OK;
}

static int sk_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	int rc = ctx ? loom_check_rope(a) : LOOM_ERR_INVALID;
	int64_t half;

	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	half = a->n_rot / 2;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		for (int64_t h = 0; h < a->n_heads; h++) {
			float *x = a->x + t * a->row_stride + h * a->head_dim;

			for (int64_t i = 0; i < half; i++) {
				double theta = (double)a->pos[t] * a->freq_scale *
					       pow(a->freq_base, -2.0 * (double)i / (double)a->n_rot);
				/* NORM rotates (2i, 2i+1), NEOX (i, i + n_rot/2) */
				int64_t p = a->mode == LOOM_ROPE_NORM ? 2 * i : i;
				int64_t q = a->mode == LOOM_ROPE_NORM ? 2 * i + 1 : i + half;
				float c, s, x0 = x[p], x1 = x[q];

				if (a->freq_factors)
					theta /= a->freq_factors[i];
				c = (float)cos(theta);
				s = (float)sin(theta);
				x[p] = x0 * c - x1 * s;
				x[q] = x0 * s + x1 * c;
			}
		}
	}
	return LOOM_OK;
}

static int sk_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
		  int64_t out_stride, const float *gate, int64_t gate_stride, const float *up,
		  int64_t up_stride, int64_t rows, int64_t n)
{
	if (!ctx || (kind != LOOM_GLU_SILU && kind != LOOM_GLU_GELU_TANH) ||
	    !loom_check_shape(rows, n, out_stride) || !loom_check_shape(rows, n, gate_stride) ||
	    !loom_check_shape(rows, n, up_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !gate || !up)
		return LOOM_ERR_INVALID;
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t i = 0; i < n; i++) {
			float g = gate[r * gate_stride + i], act;

			if (kind == LOOM_GLU_SILU)
				act = g / (1.0f + expf(-g));
			else /* tanh approximation of GELU */
				act = 0.5f * g * (1.0f + tanhf(0.7978845608f *
							       (g + 0.044715f * g * g * g)));
			out[r * out_stride + i] = act * up[r * up_stride + i];
		}
	}
	return LOOM_OK;
}

static int sk_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride, const float *a,
		  int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows,
		  int64_t rows, int64_t n)
{
	if (!ctx || (b_rows != 1 && b_rows != rows) || !loom_check_shape(rows, n, out_stride) ||
	    !loom_check_shape(rows, n, a_stride) || !loom_check_shape(b_rows, n, b_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !a || !b)
		return LOOM_ERR_INVALID;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t i = 0; i < n; i++)
			out[r * out_stride + i] = a[r * a_stride + i] +
						  b[(b_rows == 1 ? 0 : r) * b_stride + i];
	return LOOM_OK;
}

static int sk_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		    int64_t n, float s)
{
	if (!ctx || !loom_check_shape(rows, n, stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!x)
		return LOOM_ERR_INVALID;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t i = 0; i < n; i++)
			x[r * stride + i] *= s;
	return LOOM_OK;
}

static int sk_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a)
{
	int rc = ctx ? loom_check_kv_write(a) : LOOM_ERR_INVALID;

	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	if (!loom_check_slots(a->slots, a->n_tokens, a->kv_dim))
		return LOOM_ERR_INVALID;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		size_t row = (size_t)a->kv_dim * sizeof(float);
		int64_t at = (int64_t)a->slots[t] * a->kv_dim;

		memcpy(a->kcache + at, a->k + t * a->k_stride, row);
		memcpy(a->vcache + at, a->v + t * a->v_stride, row);
	}
	return LOOM_OK;
}

/* Cached key or value row of token t of sequence s, KV head kvh. */
static const float *cached(const struct loom_attention_args *a, const float *cache, int64_t s,
			   int64_t t, int64_t kvh)
{
	int64_t block = a->block_table[s * a->max_blocks + t / a->block_size];

	return cache + (block * a->block_size + t % a->block_size) * a->n_kv_heads * a->head_dim +
	       kvh * a->head_dim;
}

/* One head of one query row over cached tokens lo..pos; w: scratch. */
static void attend_one(const struct loom_attention_args *a, int64_t s, int64_t lo, int64_t pos,
		       int64_t kvh, const float *q, float *out, float *w)
{
	float best = -INFINITY;
	double total = 0.0;

	for (int64_t t = lo; t <= pos; t++) {
		const float *k = cached(a, a->kcache, s, t, kvh);
		float score = 0.0f;

		for (int64_t d = 0; d < a->head_dim; d++)
			score += q[d] * k[d];
		score *= a->scale;
		if (a->softcap > 0.0f)
			score = a->softcap * tanhf(score / a->softcap);
		w[t - lo] = score;
		if (score > best)
			best = score;
	}
	for (int64_t t = lo; t <= pos; t++) {
		w[t - lo] = expf(w[t - lo] - best); /* shifted: nothing overflows */
		total += w[t - lo];
	}
	for (int64_t d = 0; d < a->head_dim; d++)
		out[d] = 0.0f;
	for (int64_t t = lo; t <= pos; t++) {
		const float *v = cached(a, a->vcache, s, t, kvh);

		for (int64_t d = 0; d < a->head_dim; d++)
			out[d] += w[t - lo] * v[d];
	}
	for (int64_t d = 0; d < a->head_dim; d++)
		out[d] = (float)(out[d] / total);
}

static int sk_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	int64_t rows, longest, width;
	float *w;

	if (!ctx || !a || !HAS(a, struct loom_attention_args, softcap) ||
	    !loom_check_attention_args(a))
		return LOOM_ERR_INVALID;
	if (a->n_seqs == 0)
		return LOOM_OK;
	if (!a->q_start || !a->kv_len || !a->block_table ||
	    !loom_check_attention_tables(a, a->q_start, a->kv_len, a->block_table, &rows,
					 &longest))
		return LOOM_ERR_INVALID;
	width = a->n_heads * a->head_dim;
	if (!loom_check_shape(rows, width, a->q_stride) ||
	    !loom_check_shape(rows, width, a->out_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0)
		return LOOM_OK;
	if (!a->out || !a->q || !a->kcache || !a->vcache)
		return LOOM_ERR_INVALID;
	w = malloc((size_t)(longest + 1) * sizeof(float));
	if (!w)
		return LOOM_ERR_NOMEM;
	for (int64_t s = 0; s < a->n_seqs; s++) {
		int64_t q_len = a->q_start[s + 1] - a->q_start[s];

		for (int64_t i = 0; i < q_len; i++) {
			int64_t row = a->q_start[s] + i, pos = a->kv_len[s] - q_len + i;
			int64_t lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;

			for (int64_t h = 0; h < a->n_heads; h++)
				attend_one(a, s, lo, pos, h / (a->n_heads / a->n_kv_heads),
					   a->q + row * a->q_stride + h * a->head_dim,
					   a->out + row * a->out_stride + h * a->head_dim, w);
		}
	}
	free(w);
	return LOOM_OK;
}

/* ---- the one exported symbol ---- */

static const struct loom_backend_ops skeleton_ops = {
	.abi_major = LOOM_BACKEND_ABI_MAJOR,
	.abi_minor = LOOM_BACKEND_ABI_MINOR,
	.struct_size = sizeof(struct loom_backend_ops),
	.name = "skeleton",
	.create = sk_create,
	.destroy = sk_destroy,
	.device_info = sk_device_info,
	.supports = sk_supports,
	.buffer_alloc = sk_buffer_alloc,
	.buffer_free = sk_buffer_free,
	.buffer_addr = sk_buffer_addr,
	.upload = sk_memcpy,
	.download = sk_memcpy,
	.copy = sk_memcpy,
	.synchronize = sk_synchronize,
	.gemm = sk_gemm,
	.embed = sk_embed,
	.rmsnorm = sk_rmsnorm,
	.rope = sk_rope,
	.glu = sk_glu,
	.add = sk_add,
	.scale = sk_scale,
	.kv_write = sk_kv_write,
	.attention = sk_attention,
	/* graph_begin, graph_end (generation 1.1): optional, left NULL */
};

LOOM_EXPORT const struct loom_backend_ops *loom_backend_entry(void)
{
	return &skeleton_ops;
}
