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
	int64_t max_kv;   /* the longest sequence: scores and staging sizes */
	int64_t group;    /* query heads per unit: consecutive, one KV head's */
};

/* At most this many query heads share a unit (their accumulators stay in
 * registers). */
#define GROUP_MAX 4
/* cache rows the grouped kernel asks for ahead of the one it reads */
#define PF_ROWS 8

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

/*
 * Softmax weights in place: sc[i] = exp(sc[i] - mx) for i < n, and their
 * sum, added in order in double. Exact mode takes libm's expf (ref.so's
 * arithmetic), fast mode vexp.c's rows.
 */
static double softmax_weights(const struct attn_task *tk, float *sc, int64_t n, float mx)
{
	double sum = 0.0;

	if (tk->ctx->exact) {
		for (int64_t i = 0; i < n; i++)
			sc[i] = expf(sc[i] - mx);
	} else {
		cpu_exp_row(tk->ctx->isa, sc, sc, mx, n);
	}
	for (int64_t i = 0; i < n; i++)
		sum += sc[i];
	return sum;
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
	double sum; /* softmax denominator in double, as the reference */

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
	sum = softmax_weights(tk, sc, pos + 1 - lo, mx);
	for (int64_t i = 0; i < hd; i++)
		acc[i] = 0.0f;
	for (int64_t t = lo; t <= pos;) {
		const float *v = kv_run(a, a->vcache, s, t, kvh, pos, &n);

		for (int64_t i = 0; i < n; i++, t++, v += stride)
			cpu_axpy_f32(isa, acc, v, sc[t - lo], hd);
	}
	float *out = a->out + row * a->out_stride + h * hd;
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
/* 8 cache values at element i of p as f32: f16 widened (exactly). */
CPU_TGT_AVX2 CPU_INLINE __m256 ld8(const void *p, int64_t i, bool half)
{
	return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
		    : _mm256_loadu_ps((const float *)p + i);
}

/* cpu_avx2_dot(q, k, n) for n a multiple of 8, k f32 or f16: the same
 * fused multiply-adds in the same order on the same (exact) values. */
CPU_TGT_AVX2 CPU_INLINE float dot8(const float *q, const void *k, int64_t n, bool half)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld8(k, i, half), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), ld8(k, i + 8, half), s1);
	}
	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld8(k, i, half), s0);
	return cpu_avx2_hsum(_mm256_add_ps(s0, s1));
}

/* Element offset of the cache row of position t (as kv_run), and in *n
 * how many positions from t on (up to last) follow it in the block. */
static inline int64_t kv_run_off(const struct loom_attention_args *a, int64_t s, int64_t t,
				 int64_t kvh, int64_t last, int64_t *n)
{
	int64_t blk = a->block_table[s * a->max_blocks + t / a->block_size];
	int64_t off = t % a->block_size;

	*n = a->block_size - off < last + 1 - t ? a->block_size - off : last + 1 - t;
	return ((blk * a->block_size + off) * a->n_kv_heads + kvh) * a->head_dim;
}

CPU_TGT_AVX2 CPU_INLINE void attn_row_avx2_t(const struct attn_task *tk, float *scratch,
					     int64_t s, int64_t h, int64_t row, int64_t pos,
					     bool half)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd;
	const int64_t kvh = h / (a->n_heads / a->n_kv_heads);
	const size_t es = half ? 2 : 4; /* bytes per cached value */
	const char *kc = (const char *)a->kcache, *vc = (const char *)a->vcache;
	const float *q = a->q + row * a->q_stride + h * hd;
	float *acc = scratch, *sc = scratch + hd;
	float *out = a->out + row * a->out_stride + h * hd;
	int64_t lo = 0, n;
	float mx = -INFINITY;
	double sum;

	if (a->window > 0 && pos - a->window + 1 > 0)
		lo = pos - a->window + 1;
	/* the rows stream from memory (a step's weights evict the cache):
	 * each is asked for PF_ROWS rows ahead of its use */
	for (int64_t t = lo; t <= pos;) {
		int64_t e = kv_run_off(a, s, t, kvh, pos, &n);

		for (int64_t i = 0; i < n && i < PF_ROWS; i++)
			cpu_prefetch(kc + (size_t)(e + i * stride) * es, (size_t)hd * es);
		for (int64_t i = 0; i < n; i++, t++, e += stride) {
			float v;

			if (i + PF_ROWS < n)
				cpu_prefetch(kc + (size_t)(e + PF_ROWS * stride) * es, (size_t)hd * es);
			v = dot8(q, kc + (size_t)e * es, hd, half) * a->scale;

			if (a->softcap > 0.0f)
				v = a->softcap * tanhf(v / a->softcap);
			sc[t - lo] = v;
			if (v > mx)
				mx = v;
		}
	}
	sum = softmax_weights(tk, sc, pos + 1 - lo, mx);
	for (int64_t d0 = 0; d0 < hd; d0 += 64) {
		const int w = hd - d0 < 64 ? (int)(hd - d0) / 8 : 8;
		__m256 r[8];

		for (int j = 0; j < 8; j++)
			r[j] = _mm256_setzero_ps();
		for (int64_t t = lo; t <= pos;) {
			int64_t e = kv_run_off(a, s, t, kvh, pos, &n) + d0;

			for (int64_t i = 0; i < n && i < PF_ROWS; i++)
				cpu_prefetch(vc + (size_t)(e + i * stride) * es, (size_t)w * 8 * es);
			for (int64_t i = 0; i < n; i++, t++, e += stride) {
				__m256 p = _mm256_set1_ps(sc[t - lo]);
				const void *v = vc + (size_t)e * es;

				if (i + PF_ROWS < n)
					cpu_prefetch((const char *)v + (size_t)(PF_ROWS * stride) * es,
						     (size_t)w * 8 * es);

				for (int j = 0; j < w; j++)
					r[j] = _mm256_fmadd_ps(p, ld8(v, 8 * j, half), r[j]);
			}
		}
		for (int j = 0; j < w; j++)
			_mm256_storeu_ps(acc + d0 + 8 * j, r[j]);
	}
	for (int64_t i = 0; i < hd; i++)
		out[i] = (float)(acc[i] / sum);
}

CPU_TGT_AVX2 static void attn_row_avx2(const struct attn_task *tk, float *scratch, int64_t s,
				       int64_t h, int64_t row, int64_t pos)
{
	attn_row_avx2_t(tk, scratch, s, h, row, pos, false);
}

/* The same over an f16 cache, reading it in place (the values widened
 * exactly, so the bits are those of an f32 cache holding them: what
 * attn_rows_q() gives on machines without AVX2). */
CPU_TGT_AVX2 static void attn_row_avx2_f16(const struct attn_task *tk, float *scratch, int64_t s,
					   int64_t h, int64_t row, int64_t pos)
{
	attn_row_avx2_t(tk, scratch, s, h, row, pos, true);
}

/*
 * attn_row_avx2_t() for n query heads h0 .. h0 + n - 1 (n <= GROUP_MAX)
 * that read the same KV head, on AVX-512 machines, head_dim a multiple of
 * 16: each cache row is loaded and widened once for all of them. Per head
 * the arithmetic is attn_row_avx2_t()'s: a 16-lane accumulator is dot8()'s
 * s0 (low half) and s1 (high half) stepping over the same 16 values, and
 * lo + hi is its s0 + s1; the V sums are the same per-element fused
 * multiply-adds in position order. So the bits are attn_row()'s.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) CPU_INLINE __m512
ld16(const void *p, int64_t i, bool half)
{
	return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
		    : _mm512_loadu_ps((const float *)p + i);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) CPU_INLINE void
attn_group_avx512_t(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0, int n,
		    int64_t row, int64_t pos, bool half)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd;
	const int64_t kvh = h0 / (a->n_heads / a->n_kv_heads);
	const size_t es = half ? 2 : 4;
	const char *kc = (const char *)a->kcache, *vc = (const char *)a->vcache;
	const float *q = a->q + row * a->q_stride + h0 * hd;
	float *acc = scratch, *sc = scratch + GROUP_MAX * hd; /* sc: head g at g * max_kv */
	int64_t lo = 0, len;
	float mx[GROUP_MAX];
	double sum[GROUP_MAX];

	if (a->window > 0 && pos - a->window + 1 > 0)
		lo = pos - a->window + 1;
	len = pos + 1 - lo;
	for (int g = 0; g < n; g++)
		mx[g] = -INFINITY;
	for (int64_t t = lo, m; t <= pos;) {
		int64_t e = kv_run_off(a, s, t, kvh, pos, &m);

		/* a run's rows are `stride` apart: ask for them PF_ROWS ahead
		 * of use (a burst for the whole window at once overflows the
		 * core's outstanding misses) */
		for (int64_t i = 0; i < m && i < PF_ROWS; i++)
			cpu_prefetch(kc + (size_t)(e + i * stride) * es, (size_t)hd * es);
		for (int64_t i = 0; i < m; i++, t++, e += stride) {
			const void *k = kc + (size_t)e * es;
			__m512 d[GROUP_MAX];

			if (i + PF_ROWS < m)
				cpu_prefetch((const char *)k + (size_t)(PF_ROWS * stride) * es,
					     (size_t)hd * es);

			for (int g = 0; g < n; g++)
				d[g] = _mm512_setzero_ps();
			for (int64_t j = 0; j < hd; j += 16) {
				__m512 kv = ld16(k, j, half);

				for (int g = 0; g < n; g++)
					d[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * hd + j), kv, d[g]);
			}
			for (int g = 0; g < n; g++) {
				float v = cpu_avx2_hsum(_mm256_add_ps(_mm512_castps512_ps256(d[g]),
								      _mm256_castpd_ps(_mm512_extractf64x4_pd(
									      _mm512_castps_pd(d[g]), 1)))) *
					  a->scale;

				if (a->softcap > 0.0f)
					v = a->softcap * tanhf(v / a->softcap);
				sc[g * tk->max_kv + t - lo] = v;
				if (v > mx[g])
					mx[g] = v;
			}
		}
	}
	for (int g = 0; g < n; g++)
		sum[g] = softmax_weights(tk, sc + g * tk->max_kv, len, mx[g]);
	for (int64_t d0 = 0; d0 < hd; d0 += 64) {
		const int w = hd - d0 < 64 ? (int)(hd - d0) / 16 : 4;
		__m512 r[GROUP_MAX][4];

		for (int g = 0; g < n; g++)
			for (int j = 0; j < 4; j++)
				r[g][j] = _mm512_setzero_ps();
		for (int64_t t = lo, m; t <= pos;) {
			int64_t e = kv_run_off(a, s, t, kvh, pos, &m) + d0;

			for (int64_t i = 0; i < m && i < PF_ROWS; i++)
				cpu_prefetch(vc + (size_t)(e + i * stride) * es, (size_t)w * 16 * es);
			for (int64_t i = 0; i < m; i++, t++, e += stride) {
				const void *v = vc + (size_t)e * es;
				__m512 vv[4];

				if (i + PF_ROWS < m)
					cpu_prefetch((const char *)v + (size_t)(PF_ROWS * stride) * es,
						     (size_t)w * 16 * es);

				for (int j = 0; j < w; j++)
					vv[j] = ld16(v, 16 * j, half);
				for (int g = 0; g < n; g++) {
					__m512 p = _mm512_set1_ps(sc[g * tk->max_kv + t - lo]);

					for (int j = 0; j < w; j++)
						r[g][j] = _mm512_fmadd_ps(p, vv[j], r[g][j]);
				}
			}
		}
		for (int g = 0; g < n; g++)
			for (int j = 0; j < w; j++)
				_mm512_storeu_ps(acc + g * hd + d0 + 16 * j, r[g][j]);
	}
	for (int g = 0; g < n; g++) {
		float *out = a->out + row * a->out_stride + (h0 + g) * hd;

		for (int64_t i = 0; i < hd; i++)
			out[i] = (float)(acc[g * hd + i] / sum[g]);
	}
}

/* One copy of the kernel per group size and cache type, so the heads'
 * accumulators stay in registers and the loops over them unroll. */
#define ATTN_GROUP_N(N)                                                                    \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) static void    \
	attn_group_avx512_##N(const struct attn_task *tk, float *scratch, int64_t s,       \
			      int64_t h0, int64_t row, int64_t pos, bool half)              \
	{                                                                                  \
		if (half)                                                                  \
			attn_group_avx512_t(tk, scratch, s, h0, N, row, pos, true);        \
		else                                                                       \
			attn_group_avx512_t(tk, scratch, s, h0, N, row, pos, false);       \
	}
ATTN_GROUP_N(1)
ATTN_GROUP_N(2)
ATTN_GROUP_N(3)
ATTN_GROUP_N(4)

static void attn_group_avx512(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0,
			      int n, int64_t row, int64_t pos, bool half)
{
	switch (n) {
	case 1: attn_group_avx512_1(tk, scratch, s, h0, row, pos, half); break;
	case 2: attn_group_avx512_2(tk, scratch, s, h0, row, pos, half); break;
	case 3: attn_group_avx512_3(tk, scratch, s, h0, row, pos, half); break;
	default: attn_group_avx512_4(tk, scratch, s, h0, row, pos, half); break;
	}
}
#endif

/* One query row of a unit: the AVX2 kernel where it applies, else the
 * portable one (the same bits either way). */
static void attn_one(const struct attn_task *tk, float *scratch, int64_t s, int64_t h,
		     int64_t row, int64_t pos)
{
#if defined(__x86_64__)
	if (tk->ctx->isa != CPU_ISA_SCALAR && tk->a->head_dim % 8 == 0) {
		attn_row_avx2(tk, scratch, s, h, row, pos);
		return;
	}
#endif
	attn_row(tk, scratch, s, h, row, pos);
}

/* Whether attn_group_avx512() runs the groups. */
static bool group_kernel(const struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
#if defined(__x86_64__)
	return ctx->isa == CPU_ISA_AVX512 && a->head_dim % 16 == 0;
#else
	(void)ctx, (void)a;
	return false;
#endif
}

/* Whether the kernels read an f16 cache in place (else it is staged). */
static bool reads_f16(const struct attn_task *tk)
{
#if defined(__x86_64__)
	return tk->ctx->isa != CPU_ISA_SCALAR && tk->a->head_dim % 8 == 0;
#else
	(void)tk;
	return false;
#endif
}

/* Query row `row` at position pos for heads h0 .. h0 + tk->group - 1 over
 * an f16 (half) or f32 cache. */
static void attn_heads(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0,
		       int64_t row, int64_t pos, bool half)
{
#if defined(__x86_64__)
	if (group_kernel(tk->ctx, tk->a)) {
		attn_group_avx512(tk, scratch, s, h0, (int)tk->group, row, pos, half);
		return;
	}
	if (half) {
		for (int64_t h = h0; h < h0 + tk->group; h++)
			attn_row_avx2_f16(tk, scratch, s, h, row, pos);
		return;
	}
#endif
	(void)half;
	for (int64_t h = h0; h < h0 + tk->group; h++)
		attn_one(tk, scratch, s, h, row, pos);
}

/*
 * Rows r0 .. r1-1 of sequence s (query rows q0 + i at positions p0 + i),
 * heads h0 .. h0 + group - 1, over a cache of block-quantized values:
 * their KV head's keys and values at the positions those rows read are
 * decoded once (exactly: a value is its scale times its integer) into f32
 * staging in the thread's scratch, laid out as a one-block, one-KV-head
 * cache, and the f32 kernels run over it. So a query row gets the
 * arithmetic of an f32 cache holding the decoded values, and a chunk of
 * 16 prefill rows and a group of heads pay for one decode.
 */
static void attn_rows_q(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0,
			int64_t q0, int64_t p0, int64_t r0, int64_t r1)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, kvh = h0 / (a->n_heads / a->n_kv_heads);
	const size_t head_bytes = tk->row_bytes / (size_t)a->n_kv_heads;
	float *sk = scratch + GROUP_MAX * (hd + tk->max_kv), *sv = sk + tk->max_kv * hd;
	int64_t lo = 0, hi = p0 + r1 - 1;
	static const int32_t block0 = 0;
	struct loom_attention_args st = *a;
	struct attn_task tk2 = *tk;

	if (a->window > 0 && p0 + r0 - a->window + 1 > 0)
		lo = p0 + r0 - a->window + 1;
	for (int64_t t = lo; t <= hi; t++) {
		int64_t blk = a->block_table[s * a->max_blocks + t / a->block_size];
		size_t slot = (size_t)(blk * a->block_size + t % a->block_size);
		size_t off = slot * tk->row_bytes + head_bytes * (size_t)kvh;

		cpu_dequant_row(tk->ctx->isa, tk->type, (const char *)a->kcache + off, sk + t * hd, hd);
		cpu_dequant_row(tk->ctx->isa, tk->type, (const char *)a->vcache + off, sv + t * hd, hd);
	}
	/* the staging as a cache: sequence 0, one block of every position,
	 * one KV head (so every query head reads it) */
	st.kcache = sk, st.vcache = sv;
	st.n_kv_heads = 1, st.block_size = hi + 1, st.max_blocks = 1;
	st.block_table = &block0;
	tk2.a = &st;
	for (int64_t i = r0; i < r1; i++)
		attn_heads(&tk2, scratch, 0, h0, q0 + i, p0 + i, false);
}

static void attn_unit(const struct attn_task *tk, float *scratch, int64_t u)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t n_groups = a->n_heads / tk->group;
	int64_t h0 = u % n_groups * tk->group, c = u / n_groups;
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

	if (tk->type != LOOM_TYPE_F32 && !(tk->type == LOOM_TYPE_F16 && reads_f16(tk))) {
		attn_rows_q(tk, scratch, s, h0, q0, a->kv_len[s] - q_len, r0, r1);
		return;
	}
	for (int64_t i = r0; i < r1; i++)
		attn_heads(tk, scratch, s, h0, q0 + i, a->kv_len[s] - q_len + i,
			   tk->type == LOOM_TYPE_F16);
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

/*
 * Query heads per unit: the largest divisor of the heads per KV head up
 * to GROUP_MAX where a group shares work (the grouped kernel, or one
 * decode of a quantized cache), else 1 (more units to balance).
 */
static int64_t heads_per_unit(const struct loom_backend_ctx *ctx,
			      const struct loom_attention_args *a, uint32_t type)
{
	int64_t per_kv = a->n_heads / a->n_kv_heads;

	if (!group_kernel(ctx, a) && (type == LOOM_TYPE_F32 || type == LOOM_TYPE_F16))
		return 1;
	for (int64_t g = GROUP_MAX; g > 1; g--)
		if (per_kv % g == 0)
			return g;
	return 1;
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
	int64_t max_kv, *chunks, need, stage = 0;
	double work = 0;
	int err;

	if (!ctx)
		return LOOM_ERR_INVALID;
	err = attn_check(a, &max_kv);
	if (err)
		return err < 0 ? err : LOOM_OK;
	/* acc[head_dim] and scores[max_kv] for each head of a group; for a
	 * typed cache also f32 staging of one KV head's keys and values,
	 * [max_kv][head_dim] each */
	if (__builtin_add_overflow(a->head_dim, max_kv, &need) ||
	    __builtin_mul_overflow(need, GROUP_MAX, &need))
		return LOOM_ERR_NOMEM;
	if (LOOM_KV_TYPE(a, struct loom_attention_args) != LOOM_TYPE_F32 &&
	    (__builtin_mul_overflow(max_kv, 2 * a->head_dim, &stage) ||
	     __builtin_add_overflow(need, stage, &need)))
		return LOOM_ERR_NOMEM;
	if (need > LOOM_CHECK_LIMIT || cpu_scratch_reserve(ctx, (size_t)need))
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
	tk.max_kv = max_kv;
	tk.chunk_start = chunks;
	tk.group = heads_per_unit(ctx, a, tk.type);
	tk.n_units = chunks[a->n_seqs] * (a->n_heads / tk.group);
	tk.n_chunks = tk.n_units < ATTN_MAX_CHUNKS ? tk.n_units : ATTN_MAX_CHUNKS;
	work *= (double)a->n_heads * (double)a->head_dim * 2;
	cpu_pool_run(&ctx->pool, attn_task_run, &tk, tk.n_chunks,
		     work >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1);
	free(chunks);
	return LOOM_OK;
}
