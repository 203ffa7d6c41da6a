/*
 * ref.so operators: one short loop each, shapes as in loom/backend.h.
 *
 * Every operator first checks its arguments and returns LOOM_ERR_INVALID
 * (touching nothing) for a bad shape, stride, id or pointer, and
 * LOOM_ERR_UNSUPPORTED for a weight format no plugin registered. A row
 * count or length of 0 is a valid no-op.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "loom/moe.h"

/* ---- argument checks ---- */

/* Block geometry of a weight type. f32 is built in; every other format
 * comes from the host's registry (a quantization plugin). */
static bool format_of(struct loom_backend_ctx *ctx, uint32_t type,
		      uint32_t *block_elems, uint32_t *block_bytes)
{
	const struct loom_format_info *fi;

	if (type == LOOM_TYPE_F32) {
		*block_elems = 1;
		*block_bytes = sizeof(float);
		return true;
	}
	fi = ctx->host->format_info(ctx->host->host, type);
	if (!fi || fi->block_elems == 0 || fi->block_bytes == 0)
		return false;
	*block_elems = fi->block_elems;
	*block_bytes = fi->block_bytes;
	return true;
}

/* Bytes of n values of a format, or 0 with *ok false when n is not a whole
 * number of blocks or the size overflows. */
static size_t row_size(int64_t n, uint32_t block_elems, uint32_t block_bytes, bool *ok)
{
	uint64_t blocks;

	*ok = n >= 0 && n % block_elems == 0;
	if (!*ok)
		return 0;
	blocks = (uint64_t)n / block_elems;
	*ok = blocks <= (uint64_t)(INT64_MAX / 16) / block_bytes;
	return *ok ? (size_t)(blocks * block_bytes) : 0;
}

/* dst[0..n) = the n values at src in format type. */
static int dequantize(struct loom_backend_ctx *ctx, uint32_t type, const void *src,
		      float *dst, int64_t n)
{
	if (type == LOOM_TYPE_F32) {
		memcpy(dst, src, (size_t)n * sizeof(float));
		return LOOM_OK;
	}
	return ctx->host->to_float(ctx->host->host, type, src, dst, n);
}

/* A scratch array of n floats (at least one, so n == 0 is not a failure). */
static float *scratch(int64_t n)
{
	if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float) - 1)
		return NULL;
	return malloc(((size_t)n + 1) * sizeof(float));
}

bool ref_supports(struct loom_backend_ctx *ctx, enum loom_op op, uint32_t type)
{
	uint32_t be, bb;

	/* no sample slot, so none of its ABI 1.9 rows either */
	if (!ctx || (unsigned)op >= LOOM_OP_COUNT || op == LOOM_OP_EMBED_PACKED ||
	    op == LOOM_OP_SAMPLE_FULL || op == LOOM_OP_SAMPLE_LOGPROBS)
		return false;
	if (op == LOOM_OP_GEMM || op == LOOM_OP_EMBED)
		return format_of(ctx, type, &be, &bb);
	/* ABI 1.8: attention honours parent[] for every cache type */
	if (op == LOOM_OP_KV_WRITE || op == LOOM_OP_ATTENTION || op == LOOM_OP_ATTENTION_TREE)
		return loom_kvq_known(type); /* the KV cache types of ABI 1.3 */
	/* ABI 1.8: sinks in attention, gpt-oss's glu (and in moe) */
	/* Everything else, copy included, works on f32 only. */
	return type == LOOM_TYPE_F32;
}

/* ---- gemm and embed ---- */

/* Plain f32 dot product in index order. */
static float dot(const float *a, const float *b, int64_t n)
{
	float sum = 0.0f;

	for (int64_t i = 0; i < n; i++)
		sum += a[i] * b[i];
	return sum;
}

int ref_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	uint32_t be, bb;
	size_t w_row;
	float *row;
	bool ok;
	int rc = LOOM_OK;

	/* this backend packs no weight, so w_packed is never its own */
	if (!ctx || !a || a->struct_size < LOOM_GEMM_ARGS_MIN_SIZE || LOOM_GEMM_PACKED(a) ||
	    a->m < 0 || a->n < 0 || a->k < 0)
		return LOOM_ERR_INVALID;
	if (!format_of(ctx, a->w_type, &be, &bb))
		return LOOM_ERR_UNSUPPORTED;
	w_row = row_size(a->k, be, bb, &ok);
	if (!ok || a->w_stride < w_row || !loom_check_bytes(a->n, w_row, a->w_stride) ||
	    !loom_check_shape(a->m, a->k, a->x_stride) || !loom_check_shape(a->m, a->n, a->y_stride))
		return LOOM_ERR_INVALID;
	if (a->m == 0 || a->n == 0)
		return LOOM_OK;
	if (!a->x || !a->y || (!a->w && a->k > 0))
		return LOOM_ERR_INVALID;
	row = scratch(a->k);
	if (!row)
		return LOOM_ERR_NOMEM;
	/* Weight row j, dequantized once, meets every activation row i. */
	for (int64_t j = 0; j < a->n && rc == LOOM_OK; j++) {
		const char *w = (const char *)a->w + (size_t)j * a->w_stride;

		if (a->k > 0)
			rc = dequantize(ctx, a->w_type, w, row, a->k);
		for (int64_t i = 0; i < a->m && rc == LOOM_OK; i++)
			a->y[i * a->y_stride + j] = dot(a->x + i * a->x_stride, row, a->k);
	}
	free(row);
	return rc;
}

int ref_embed(struct loom_backend_ctx *ctx, float *out, const void *table,
	      uint32_t type, size_t row_bytes, int64_t n_rows, int64_t dim,
	      const int32_t *ids, int64_t n_ids)
{
	uint32_t be, bb;
	size_t need;
	bool ok;
	int rc = LOOM_OK;

	if (!ctx || n_rows < 0 || dim < 0 || n_ids < 0)
		return LOOM_ERR_INVALID;
	if (!format_of(ctx, type, &be, &bb))
		return LOOM_ERR_UNSUPPORTED;
	need = row_size(dim, be, bb, &ok);
	if (!ok || row_bytes < need || !loom_check_bytes(n_rows, need, row_bytes) ||
	    !loom_check_shape(n_ids, dim, dim))
		return LOOM_ERR_INVALID;
	if (n_ids == 0)
		return LOOM_OK;
	if (!out || !ids || (!table && dim > 0))
		return LOOM_ERR_INVALID;
	/* Check every id before writing anything. */
	for (int64_t i = 0; i < n_ids; i++)
		if (ids[i] < 0 || ids[i] >= n_rows)
			return LOOM_ERR_INVALID;
	for (int64_t i = 0; i < n_ids && rc == LOOM_OK && dim > 0; i++) {
		const char *src = (const char *)table + (size_t)ids[i] * row_bytes;

		rc = dequantize(ctx, type, src, out + i * dim, dim);
	}
	return rc;
}

/* ---- elementwise and row operators ---- */

int ref_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride,
		const float *x, int64_t x_stride, const float *w,
		int64_t rows, int64_t n, float eps)
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
		double ss = 0.0; /* sum of squares, in double */
		float inv;

		for (int64_t i = 0; i < n; i++)
			ss += (double)xr[i] * xr[i];
		inv = (float)(1.0 / sqrt(ss / n + eps));
		for (int64_t i = 0; i < n; i++)
			yr[i] = xr[i] * inv * w[i];
	}
	return LOOM_OK;
}

/* Rotates the pair (*a, *b) by the angle whose cosine and sine are c, s. */
static void rotate(float *a, float *b, float c, float s)
{
	float x0 = *a, x1 = *b;

	*a = x0 * c - x1 * s;
	*b = x0 * s + x1 * c;
}

/* One head of one token: NORM pairs (2i, 2i+1), NEOX pairs (i, i + n_rot/2). */
static void rope_head(const struct loom_rope_args *a, float *x, int32_t pos)
{
	int64_t half = a->n_rot / 2;

	for (int64_t i = 0; i < half; i++) {
		/* The angle in double: at long positions f32 loses its digits. */
		double theta = (double)pos * a->freq_scale *
			       pow(a->freq_base, -2.0 * (double)i / (double)a->n_rot);
		float c, s;

		if (a->freq_factors)
			theta /= a->freq_factors[i];
		c = (float)cos(theta);
		s = (float)sin(theta);
		if (a->mode == LOOM_ROPE_NORM)
			rotate(&x[2 * i], &x[2 * i + 1], c, s);
		else
			rotate(&x[i], &x[i + half], c, s);
	}
}

int ref_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	int rc = ctx ? loom_check_rope(a) : LOOM_ERR_INVALID;

	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	for (int64_t t = 0; t < a->n_tokens; t++)
		for (int64_t h = 0; h < a->n_heads; h++)
			rope_head(a, a->x + t * a->row_stride + h * a->head_dim, a->pos[t]);
	return LOOM_OK;
}

static float silu(float g)
{
	return g / (1.0f + expf(-g));
}

/* GELU, tanh approximation: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))). */
static float gelu_tanh(float g)
{
	const float sqrt_2_over_pi = 0.79788456080286535588f;

	return 0.5f * g * (1.0f + tanhf(sqrt_2_over_pi * (g + 0.044715f * g * g * g)));
}

int ref_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
	    int64_t out_stride, const float *gate, int64_t gate_stride,
	    const float *up, int64_t up_stride, int64_t rows, int64_t n)
{
	if (!ctx || (kind != LOOM_GLU_SILU && kind != LOOM_GLU_GELU_TANH &&
		     kind != LOOM_GLU_SWIGLU_OAI))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(rows, n, out_stride) || !loom_check_shape(rows, n, gate_stride) ||
	    !loom_check_shape(rows, n, up_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !gate || !up)
		return LOOM_ERR_INVALID;
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t i = 0; i < n; i++) {
			float g = gate[r * gate_stride + i], u = up[r * up_stride + i];

			if (kind == LOOM_GLU_SWIGLU_OAI)
				out[r * out_stride + i] = loom_glu_swiglu_oai(g, u);
			else
				out[r * out_stride + i] =
					(kind == LOOM_GLU_SILU ? silu(g) : gelu_tanh(g)) * u;
		}
	}
	return LOOM_OK;
}

int ref_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride,
	    const float *a, int64_t a_stride, const float *b, int64_t b_stride,
	    int64_t b_rows, int64_t rows, int64_t n)
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
	for (int64_t r = 0; r < rows; r++) {
		const float *br = b + (b_rows == 1 ? 0 : r * b_stride);

		for (int64_t i = 0; i < n; i++)
			out[r * out_stride + i] = a[r * a_stride + i] + br[i];
	}
	return LOOM_OK;
}

int ref_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride,
	      int64_t rows, int64_t n, float s)
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

int ref_softcap(struct loom_backend_ctx *ctx, float *x, int64_t stride,
		int64_t rows, int64_t n, float cap)
{
	if (!ctx || !loom_check_shape(rows, n, stride) || !(cap > 0.0f) || isinf(cap))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!x)
		return LOOM_ERR_INVALID;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t i = 0; i < n; i++)
			x[r * stride + i] = cap * tanhf(x[r * stride + i] / cap);
	return LOOM_OK;
}

/* ---- paged KV cache ---- */

int ref_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a)
{
	uint32_t type;
	size_t row;
	int rc;

	rc = ctx ? loom_check_kv_write(a) : LOOM_ERR_INVALID;
	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	type = LOOM_KV_TYPE(a, struct loom_kv_write_args);
	rc = loom_check_kv_type(type, a->kv_dim);
	if (rc)
		return rc;
	if (!loom_check_slots(a->slots, a->n_tokens, a->kv_dim))
		return LOOM_ERR_INVALID;
	row = loom_kvq_row_bytes(type, a->kv_dim);
	for (int64_t t = 0; t < a->n_tokens; t++) {
		size_t dst = (size_t)a->slots[t] * row;

		loom_kvq_quantize(type, (char *)a->kcache + dst, a->k + t * a->k_stride, a->kv_dim);
		loom_kvq_quantize(type, (char *)a->vcache + dst, a->v + t * a->v_stride, a->kv_dim);
	}
	return LOOM_OK;
}

/* ---- attention ---- */

/* Cache row of token t of sequence s, KV head kvh, as f32 in buf (head_dim
 * floats): the cache itself when it holds f32, else dequantized into buf. */
static const float *cache_at(const struct loom_attention_args *a, uint32_t type,
			     const float *cache, int64_t s, int64_t t, int64_t kvh, float *buf)
{
	int64_t block = a->block_table[s * a->max_blocks + t / a->block_size];
	int64_t slot = block * a->block_size + t % a->block_size;
	int64_t kv_dim = a->n_kv_heads * a->head_dim;

	if (type == LOOM_TYPE_F32)
		return cache + slot * kv_dim + kvh * a->head_dim;
	loom_kvq_dequantize(type, buf, (const char *)cache + (size_t)slot * loom_kvq_row_bytes(type, kv_dim),
			    kvh * a->head_dim, a->head_dim);
	return buf;
}

/*
/*
 * One query head attending to the cached tokens keys[0..n) of sequence s
 * (ascending; lo..pos for a causal row): out = softmax(scale * q.k) . v,
 * the softmax shifted by its maximum so no exp overflows; with a sink
 * (ABI 1.8) exp(sink - max) joins the denominator last. p[] is scratch
 * for n weights, buf for one dequantized row of head_dim values.
 */
static void attend(const struct loom_attention_args *a, uint32_t type, int64_t s,
		   const int32_t *keys, int64_t n, int64_t kvh, const float *q,
		   const float *sink, float *out,
		   float *p, float *buf)
{
	int64_t hd = a->head_dim;
	float max = -INFINITY;
	double sum = 0.0; /* softmax denominator, in double */

	for (int64_t t = 0; t < n; t++) {
		float score = a->scale * dot(q, cache_at(a, type, a->kcache, s, keys[t], kvh, buf), hd);

		if (a->softcap > 0.0f)
			score = a->softcap * tanhf(score / a->softcap);
		p[t] = score;
		if (score > max)
			max = score;
	}
	for (int64_t t = 0; t < n; t++) {
		p[t] = expf(p[t] - max);
		sum += p[t];
	}
	if (sink)
		sum += expf(*sink - max);
	for (int64_t d = 0; d < hd; d++)
		out[d] = 0.0f;
	for (int64_t t = 0; t < n; t++) {
		const float *v = cache_at(a, type, a->vcache, s, keys[t], kvh, buf);

		for (int64_t d = 0; d < hd; d++)
			out[d] += p[t] * v[d];
	}
	for (int64_t d = 0; d < hd; d++)
		out[d] = (float)(out[d] / sum);
}

int ref_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	int64_t rows, longest, width, group;
	const int32_t *parent;
	int32_t *keys;
	const float *sinks;
	float *p;
	uint32_t type;
	int rc;

	if (!ctx || !a || !LOOM_ARGS_HAS(a, struct loom_attention_args, softcap) ||
	    !loom_check_attention_args(a))
		return LOOM_ERR_INVALID;
	type = LOOM_KV_TYPE(a, struct loom_attention_args);
	rc = loom_check_kv_type(type, a->head_dim);
	if (rc)
		return rc;
	if (a->n_seqs == 0)
		return LOOM_OK;
	if (!a->q_start || !a->kv_len || !a->block_table || !loom_check_attention_tables(a, a->q_start, a->kv_len, a->block_table, &rows, &longest))
		return LOOM_ERR_INVALID;
	parent = LOOM_ATTN_PARENT(a);
	if (parent && !loom_check_attention_parents(a, a->q_start, parent))
		return LOOM_ERR_INVALID;
	width = a->n_heads * a->head_dim;
	if (!loom_check_shape(rows, width, a->q_stride) || !loom_check_shape(rows, width, a->out_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0)
		return LOOM_OK;
	if (!a->out || !a->q || !a->kcache || !a->vcache)
		return LOOM_ERR_INVALID;
	/* longest weights, then one dequantized row */
	p = longest <= LOOM_CHECK_LIMIT - a->head_dim ? scratch(longest + a->head_dim) : NULL;
	keys = p ? malloc(sizeof(int32_t) * (size_t)longest) : NULL;
	if (!keys) {
		free(p);
		return LOOM_ERR_NOMEM;
	}
	group = a->n_heads / a->n_kv_heads; /* query heads per KV head */
	sinks = LOOM_ATTN_SINKS(a);
	for (int64_t s = 0; s < a->n_seqs; s++) {
		int64_t q_len = a->q_start[s + 1] - a->q_start[s];

		for (int64_t i = 0; i < q_len; i++) {
			int64_t row = a->q_start[s] + i, pos;
			int64_t n = loom_attention_keys(a, a->q_start, a->kv_len, parent, s, i, keys, &pos);

			for (int64_t h = 0; h < a->n_heads; h++)
				attend(a, type, s, keys, n, h / group,
				       a->q + row * a->q_stride + h * a->head_dim,
				       sinks ? sinks + h : NULL,
				       a->out + row * a->out_stride + h * a->head_dim, p,
				       p + longest);
		}
	}
	free(keys);
	free(p);
	return LOOM_OK;
}
