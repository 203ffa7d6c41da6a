/*
 * Attention over the paged KV cache (contract in loom/backend.h).
 *
 * Work units are (sequence, query-row chunk, head); threads take them from
 * a shared counter, so causal prefill (later rows cost more) balances
 * itself. Each query row is done in two passes over its visible cache
 * positions: scores (q.k, scaled, soft-capped) into the thread's scratch,
 * then softmax weights applied to V, all in f32.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "loom/kv_quant.h"
#include "simd.h"

#define ROWS_PER_UNIT 16
/* units are grouped into at most this many pool chunks */
#define ATTN_MAX_CHUNKS ((int64_t)1 << 16)

struct attn_task {
	struct loom_backend_ctx *ctx;
	const struct loom_attention_args *a;
	const int64_t *chunk_start; /* [n_seqs + 1]: first unit chunk of each sequence */
	int64_t n_units;
	int64_t n_chunks;
	uint32_t type;    /* the cache's (ABI 1.3) */
	size_t row_bytes; /* of one cache slot: kv_dim values of type */
	int64_t buf_off;  /* floats into a thread's scratch of the row buffer */
};

/*
 * Cache row of position t of sequence s, head kvh, and in *n how many
 * positions from t on (up to `last`) follow it in the same block, each
 * n_kv_heads * head_dim floats after the one before: the loops below walk
 * a block at a time instead of dividing by block_size per position.
 */
static inline const float *kv_run(const struct loom_attention_args *a, const float *cache,
				  int64_t s, int64_t t, int64_t kvh, int64_t last, int64_t *n)
{
	int64_t blk = a->block_table[s * a->max_blocks + t / a->block_size];
	int64_t off = t % a->block_size;

	*n = a->block_size - off < last + 1 - t ? a->block_size - off : last + 1 - t;
	return cache + ((blk * a->block_size + off) * a->n_kv_heads + kvh) * a->head_dim;
}

static void attn_row(const struct attn_task *tk, float *scratch, int64_t s, int64_t h,
		     int64_t row, int64_t pos)
{
	const struct loom_attention_args *a = tk->a;
	enum cpu_isa isa = tk->ctx->isa;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd;
	const int64_t kvh = h / (a->n_heads / a->n_kv_heads);
	const float *q = a->q + row * a->q_stride + h * hd;
	float *acc = scratch, *sc = scratch + hd;
	int64_t lo = 0, n;
	float mx = -INFINITY;
	double sum = 0.0; /* softmax denominator in double, as the reference */

	if (a->window > 0 && pos - a->window + 1 > 0)
		lo = pos - a->window + 1;
	for (int64_t t = lo; t <= pos;) {
		const float *k = kv_run(a, a->kcache, s, t, kvh, pos, &n);

		for (int64_t i = 0; i < n; i++, t++, k += stride) {
			float v = cpu_dot_f32(isa, q, k, hd) * a->scale;

			if (a->softcap > 0.0f)
				v = a->softcap * tanhf(v / a->softcap);
			sc[t - lo] = v;
			if (v > mx)
				mx = v;
		}
	}
	for (int64_t i = 0; i < hd; i++)
		acc[i] = 0.0f;
	for (int64_t t = lo; t <= pos;) {
		const float *v = kv_run(a, a->vcache, s, t, kvh, pos, &n);

		for (int64_t i = 0; i < n; i++, t++, v += stride) {
			float p = expf(sc[t - lo] - mx);

			sum += p;
			cpu_axpy_f32(isa, acc, v, p, hd);
		}
	}
	float *out = a->out + row * a->out_stride + h * hd;
	for (int64_t i = 0; i < hd; i++)
		out[i] = (float)(acc[i] / sum);
}

/* Head kvh of the cache row of position t of sequence s, as f32 in buf. */
static inline const float *kv_head(const struct attn_task *tk, const float *cache, int64_t s,
				   int64_t t, int64_t kvh, float *buf)
{
	const struct loom_attention_args *a = tk->a;
	int64_t blk = a->block_table[s * a->max_blocks + t / a->block_size];
	size_t slot = (size_t)(blk * a->block_size + t % a->block_size);
	/* head_dim is a multiple of the block (checked), so a head's values
	 * start on a block boundary: the head's bytes are kvh/n of the row's */
	const char *row = (const char *)cache + slot * tk->row_bytes +
			  tk->row_bytes / (size_t)a->n_kv_heads * (size_t)kvh;

	cpu_dequant_row(tk->ctx->isa, tk->type, row, buf, a->head_dim);
	return buf;
}

/* attn_row() over a cache of f16 or block-quantized values: each cached
 * head row is dequantized (exactly: a value is its scale times its
 * integer) into the thread's row buffer, then the same f32 arithmetic. */
static void attn_row_q(const struct attn_task *tk, float *scratch, int64_t s, int64_t h,
		       int64_t row, int64_t pos)
{
	const struct loom_attention_args *a = tk->a;
	enum cpu_isa isa = tk->ctx->isa;
	const int64_t hd = a->head_dim, kvh = h / (a->n_heads / a->n_kv_heads);
	const float *q = a->q + row * a->q_stride + h * hd;
	float *acc = scratch, *sc = scratch + hd, *buf = scratch + tk->buf_off;
	float *out = a->out + row * a->out_stride + h * hd;
	int64_t lo = 0;
	float mx = -INFINITY;
	double sum = 0.0;

	if (a->window > 0 && pos - a->window + 1 > 0)
		lo = pos - a->window + 1;
	for (int64_t t = lo; t <= pos; t++) {
		float v = cpu_dot_f32(isa, q, kv_head(tk, a->kcache, s, t, kvh, buf), hd) * a->scale;

		if (a->softcap > 0.0f)
			v = a->softcap * tanhf(v / a->softcap);
		sc[t - lo] = v;
		if (v > mx)
			mx = v;
	}
	for (int64_t i = 0; i < hd; i++)
		acc[i] = 0.0f;
	for (int64_t t = lo; t <= pos; t++) {
		float p = expf(sc[t - lo] - mx);

		sum += p;
		cpu_axpy_f32(isa, acc, kv_head(tk, a->vcache, s, t, kvh, buf), p, hd);
	}
	for (int64_t i = 0; i < hd; i++)
		out[i] = (float)(acc[i] / sum);
}

#if defined(__x86_64__)
/*
 * attn_row()'s arithmetic for head_dim a multiple of 8 on AVX2/AVX-512
 * machines, faster: the dot products inline (cpu_avx2_dot(), what
 * cpu_dot_f32() runs there), the softmax weights kept, and the weighted V
 * sum accumulated in registers, 64 dims at a time over all positions. Per
 * output element that is the same fused multiply-adds in the same order as
 * cpu_axpy_f32() into memory, so the bits are attn_row()'s
 * (tests/backend: conformance and invariance; the greedy fixture).
 */
CPU_TGT_AVX2 static void attn_row_avx2(const struct attn_task *tk, float *scratch, int64_t s,
				       int64_t h, int64_t row, int64_t pos)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd;
	const int64_t kvh = h / (a->n_heads / a->n_kv_heads);
	const float *q = a->q + row * a->q_stride + h * hd;
	float *acc = scratch, *sc = scratch + hd;
	float *out = a->out + row * a->out_stride + h * hd;
	int64_t lo = 0, n;
	float mx = -INFINITY;
	double sum = 0.0;

	if (a->window > 0 && pos - a->window + 1 > 0)
		lo = pos - a->window + 1;
	/* the rows stream from memory (a step's weights evict the cache):
	 * ask for the whole window's K and V first, a run at a time */
	for (int64_t t = lo; t <= pos; t += n) {
		const float *k = kv_run(a, a->kcache, s, t, kvh, pos, &n);
		const float *v = a->vcache + (k - a->kcache);

		for (int64_t i = 0; i < n; i++) {
			cpu_prefetch(k + i * stride, (size_t)hd * sizeof(float));
			cpu_prefetch(v + i * stride, (size_t)hd * sizeof(float));
		}
	}
	for (int64_t t = lo; t <= pos;) {
		const float *k = kv_run(a, a->kcache, s, t, kvh, pos, &n);

		for (int64_t i = 0; i < n; i++, t++, k += stride) {
			float v = cpu_avx2_dot(q, k, hd) * a->scale;

			if (a->softcap > 0.0f)
				v = a->softcap * tanhf(v / a->softcap);
			sc[t - lo] = v;
			if (v > mx)
				mx = v;
		}
	}
	for (int64_t t = lo; t <= pos; t++) {
		float p = expf(sc[t - lo] - mx);

		sum += p;
		sc[t - lo] = p;
	}
	for (int64_t d0 = 0; d0 < hd; d0 += 64) {
		const int w = hd - d0 < 64 ? (int)(hd - d0) / 8 : 8;
		__m256 r[8];

		for (int j = 0; j < 8; j++)
			r[j] = _mm256_setzero_ps();
		for (int64_t t = lo; t <= pos;) {
			const float *v = kv_run(a, a->vcache, s, t, kvh, pos, &n) + d0;

			for (int64_t i = 0; i < n; i++, t++, v += stride) {
				__m256 p = _mm256_set1_ps(sc[t - lo]);

				for (int j = 0; j < w; j++)
					r[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * j), r[j]);
			}
		}
		for (int j = 0; j < w; j++)
			_mm256_storeu_ps(acc + d0 + 8 * j, r[j]);
	}
	for (int64_t i = 0; i < hd; i++)
		out[i] = (float)(acc[i] / sum);
}
#endif

static void attn_unit(const struct attn_task *tk, float *scratch, int64_t u)
{
	const struct loom_attention_args *a = tk->a;
	int64_t h = u % a->n_heads, c = u / a->n_heads;
	int64_t lo = 0, hi = a->n_seqs;

	/* the sequence whose chunks hold c */
	while (hi - lo > 1) {
		int64_t mid = (lo + hi) / 2;

		if (tk->chunk_start[mid] <= c)
			lo = mid;
		else
			hi = mid;
	}
	int64_t s = lo;
	int64_t q0 = a->q_start[s], q_len = a->q_start[s + 1] - q0;
	int64_t r0 = (c - tk->chunk_start[s]) * ROWS_PER_UNIT;
	int64_t r1 = r0 + ROWS_PER_UNIT < q_len ? r0 + ROWS_PER_UNIT : q_len;

	for (int64_t i = r0; i < r1; i++) {
		if (tk->type != LOOM_TYPE_F32) {
			attn_row_q(tk, scratch, s, h, q0 + i, a->kv_len[s] - q_len + i);
			continue;
		}
#if defined(__x86_64__)
		if (tk->ctx->isa != CPU_ISA_SCALAR && a->head_dim % 8 == 0) {
			attn_row_avx2(tk, scratch, s, h, q0 + i, a->kv_len[s] - q_len + i);
			continue;
		}
#endif
		attn_row(tk, scratch, s, h, q0 + i, a->kv_len[s] - q_len + i);
	}
}

/* Pool chunk c of n_chunks: units [n_units*c/n_chunks, n_units*(c+1)/n_chunks). */
static void attn_task_run(void *arg, int64_t c, int ith)
{
	struct attn_task *tk = arg;
	float *scratch = tk->ctx->scratch[ith];
	int64_t u0 = (int64_t)((double)tk->n_units * c / tk->n_chunks);
	int64_t u1 = (int64_t)((double)tk->n_units * (c + 1) / tk->n_chunks);

	if (c + 1 == tk->n_chunks)
		u1 = tk->n_units;
	for (int64_t u = u0; u < u1; u++)
		attn_unit(tk, scratch, u);
}


/* The reference backend's rules, in its order. 1: nothing to do. */
static int attn_check(const struct loom_attention_args *a, int64_t *longest)
{
	int64_t rows, width;

	int rc;

	if (!a || !LOOM_ARGS_HAS(a, struct loom_attention_args, softcap) || !loom_check_attention_args(a))
		return LOOM_ERR_INVALID;
	rc = loom_check_kv_type(LOOM_KV_TYPE(a, struct loom_attention_args), a->head_dim);
	if (rc)
		return rc;
	if (a->n_seqs == 0)
		return 1;
	if (!a->q_start || !a->kv_len || !a->block_table || !loom_check_attention_tables(a, a->q_start, a->kv_len, a->block_table, &rows, longest))
		return LOOM_ERR_INVALID;
	width = a->n_heads * a->head_dim;
	if (!loom_check_shape(rows, width, a->q_stride) || !loom_check_shape(rows, width, a->out_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0)
		return 1;
	if (!a->out || !a->q || !a->kcache || !a->vcache)
		return LOOM_ERR_INVALID;
	return LOOM_OK;
}

int cpu_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	struct attn_task tk;
	int64_t max_kv, *chunks;
	double work = 0;
	int err;

	if (!ctx)
		return LOOM_ERR_INVALID;
	err = attn_check(a, &max_kv);
	if (err)
		return err < 0 ? err : LOOM_OK;
	/* acc[head_dim], scores[max_kv], a dequantized row[head_dim] */
	if (max_kv > LOOM_CHECK_LIMIT - 2 * a->head_dim ||
	    cpu_scratch_reserve(ctx, (size_t)(max_kv + 2 * a->head_dim)))
		return LOOM_ERR_NOMEM;
	chunks = malloc((size_t)(a->n_seqs + 1) * sizeof(*chunks));
	if (!chunks)
		return LOOM_ERR_NOMEM;
	chunks[0] = 0;
	for (int64_t s = 0; s < a->n_seqs; s++) {
		int64_t q_len = a->q_start[s + 1] - a->q_start[s];

		chunks[s + 1] = chunks[s] + (q_len + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
		work += (double)q_len * a->kv_len[s];
	}
	tk.ctx = ctx;
	tk.a = a;
	tk.type = LOOM_KV_TYPE(a, struct loom_attention_args);
	tk.row_bytes = loom_kvq_row_bytes(tk.type, a->n_kv_heads * a->head_dim);
	tk.buf_off = a->head_dim + max_kv;
	tk.chunk_start = chunks;
	tk.n_units = chunks[a->n_seqs] * a->n_heads;
	tk.n_chunks = tk.n_units < ATTN_MAX_CHUNKS ? tk.n_units : ATTN_MAX_CHUNKS;
	work *= (double)a->n_heads * (double)a->head_dim * 2;
	cpu_pool_run(&ctx->pool, attn_task_run, &tk, tk.n_chunks,
		     work >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1);
	free(chunks);
	return LOOM_OK;
}
