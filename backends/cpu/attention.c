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

#define ROWS_PER_UNIT 16
/* units are grouped into at most this many pool chunks */
#define ATTN_MAX_CHUNKS ((int64_t)1 << 16)

struct attn_task {
	struct loom_backend_ctx *ctx;
	const struct loom_attention_args *a;
	const int64_t *chunk_start; /* [n_seqs + 1]: first unit chunk of each sequence */
	int64_t n_units;
	int64_t n_chunks;
};

/* Cache row of position t of sequence s, head kvh. */
static inline const float *kv_row(const struct loom_attention_args *a, const float *cache,
				  int64_t s, int64_t t, int64_t kvh)
{
	int64_t blk = a->block_table[s * a->max_blocks + t / a->block_size];
	int64_t slot = blk * a->block_size + t % a->block_size;

	return cache + slot * a->n_kv_heads * a->head_dim + kvh * a->head_dim;
}

static void attn_row(const struct attn_task *tk, float *scratch, int64_t s, int64_t h,
		     int64_t row, int64_t pos)
{
	const struct loom_attention_args *a = tk->a;
	enum cpu_isa isa = tk->ctx->isa;
	const int64_t hd = a->head_dim;
	const int64_t kvh = h / (a->n_heads / a->n_kv_heads);
	const float *q = a->q + row * a->q_stride + h * hd;
	float *acc = scratch, *sc = scratch + hd;
	int64_t lo = 0;
	float mx = -INFINITY;
	double sum = 0.0; /* softmax denominator in double, as the reference */

	if (a->window > 0 && pos - a->window + 1 > 0)
		lo = pos - a->window + 1;
	for (int64_t t = lo; t <= pos; t++) {
		float v = cpu_dot_f32(isa, q, kv_row(a, a->kcache, s, t, kvh), hd) * a->scale;

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
		cpu_axpy_f32(isa, acc, kv_row(a, a->vcache, s, t, kvh), p, hd);
	}
	float *out = a->out + row * a->out_stride + h * hd;
	for (int64_t i = 0; i < hd; i++)
		out[i] = (float)(acc[i] / sum);
}

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

	for (int64_t i = r0; i < r1; i++)
		attn_row(tk, scratch, s, h, q0 + i, a->kv_len[s] - q_len + i);
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

	if (!a || a->struct_size < sizeof(*a) || !loom_check_attention_args(a))
		return LOOM_ERR_INVALID;
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
	if (cpu_scratch_reserve(ctx, (size_t)(max_kv + a->head_dim)))
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
	tk.chunk_start = chunks;
	tk.n_units = chunks[a->n_seqs] * a->n_heads;
	tk.n_chunks = tk.n_units < ATTN_MAX_CHUNKS ? tk.n_units : ATTN_MAX_CHUNKS;
	work *= (double)a->n_heads * (double)a->head_dim * 2;
	cpu_pool_run(&ctx->pool, attn_task_run, &tk, tk.n_chunks,
		     work >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1);
	free(chunks);
	return LOOM_OK;
}
