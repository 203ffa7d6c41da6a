/*
 * Attention over the paged KV cache (contract in loom/backend.h).
 *
 * Work units are (sequence, query-row chunk, head); threads take them from
 * a shared counter, so causal prefill (later rows cost more) balances
 * itself. Each query row is done in two passes over its visible cache
 * positions: scores (q.k, scaled, soft-capped) into the thread's scratch,
 * then softmax weights applied to V, all in f32. In fast mode a decode
 * row with at least 2 * ATTN_PART visible positions is split into parts,
 * each a unit of its own, merged by their maxima and sums (attn_part(),
 * attn_merge()): its bits then differ from exact mode's in rounding, but
 * not with the thread count or the batch.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
	/* decode rows split over their positions (fast mode, split_parts()):
	 * per sequence its number of parts (0: not split); each part's
	 * partial results, ATTN_PSTRIDE floats a head at (chunk, head); and
	 * per (sequence, group) how many parts are done */
	const int64_t *parts;
	float *partial;
	atomic_int *merged;
	bool walk; /* split parts run as part_groups() (each chunk one part) */
};

/*
 * Fast mode splits a decode row's visible positions into parts of about
 * ATTN_PART (when it has at least two), each a unit of its own, so that a
 * long context spreads over the threads even when there are fewer KV
 * heads than threads. The parts depend only on the row's own positions,
 * never on the thread count or the batch; the part that finishes last
 * merges them in part order.
 */
#define ATTN_PART 256
/* a head's partial: acc[head_dim], max, (pad), sum as a double */
#define ATTN_PSTRIDE(hd) ((hd) + 4)

/* Positions t0 .. t1 of a row, and where its partial results go. */
struct attn_span {
	int64_t t0, t1;
	float *part; /* head 0's slot */
};

/* At most this many query heads share a unit (their accumulators stay in
 * registers). */
#define GROUP_MAX 4
/* (query row, head) pairs the many-row kernel keeps at once: its runs
 * are up to PAIRS_MAX / group rows (attn_rows_avx512_t()) */
#define PAIRS_MAX 16
/* cache rows the grouped kernel asks for ahead of the one it reads */
#define PF_ROWS 8
/*
 * A cache row holds every KV head of a position (n_kv_heads * head_dim
 * values), and the units of the other KV heads walk the same positions,
 * next on this core or at once on another. Up to this many bytes, the
 * kernels ask for the whole row rather than their head's slice of it, so
 * that one walk brings in the others' rows too: with SmolLM2's 3 KV heads
 * (384-byte f16 rows) decode attention took 15-27 % less time at depth
 * 400 and 2048, 1 and 2 threads; with 2 KB rows it took longer
 * (docs/BENCHMARKS.md). Prefetches change no result.
 */
#define PF_ROW_MAX 512

/* Prefetches the cache row whose slice for head kvh, dims d0 on, starts
 * at element e; `bytes` of the slice when the row is larger than
 * PF_ROW_MAX. */
static inline void pf_row(const struct loom_attention_args *a, const char *cache, size_t es,
			  int64_t e, int64_t kvh, int64_t d0, size_t bytes)
{
	size_t row = (size_t)(a->n_kv_heads * a->head_dim) * es;

	if (row <= PF_ROW_MAX)
		cpu_prefetch(cache + (size_t)(e - kvh * a->head_dim - d0) * es, row);
	else
		cpu_prefetch(cache + (size_t)e * es, bytes);
}

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
static void softmax_exp(const struct attn_task *tk, float *sc, int64_t n, float mx)
{
	if (tk->ctx->exact) {
		for (int64_t i = 0; i < n; i++)
			sc[i] = expf(sc[i] - mx);
	} else {
		cpu_exp_row(tk->ctx->isa, sc, sc, mx, n);
	}
}

static double softmax_weights(const struct attn_task *tk, float *sc, int64_t n, float mx)
{
	double sum = 0.0;

	softmax_exp(tk, sc, n, mx);
	for (int64_t i = 0; i < n; i++)
		sum += sc[i];
	return sum;
}

/*
 * softmax_weights()'s sums for np pairs (weights w[p][0 .. len[p] - 1]):
 * each pair's in its own order in double, as there, but the pairs' chains
 * interleaved over their common length, so that the adds' latency (a
 * chain is one dependent add a key) overlaps across pairs. npmax: np's
 * bound (compile time).
 */
static inline void pair_sums(float *const *w, const int64_t *len, int np, int npmax, double *sum)
{
	int64_t common = len[0];

	for (int p = 0; p < np; p++) {
		sum[p] = 0.0;
		if (len[p] < common)
			common = len[p];
	}
	for (int64_t i = 0; i < common; i++)
#pragma GCC unroll 16
		for (int p = 0; p < npmax; p++)
			if (p < np)
				sum[p] += w[p][i];
	for (int p = 0; p < np; p++)
		for (int64_t i = common; i < len[p]; i++)
			sum[p] += w[p][i];
}

/* The pairs' softmax weights in place (pair p = r * n + g's scores at
 * sc + p * max_kv + lo[r] - lo[0]) from their maxima mx, and in sum
 * their sums (pair_sums()). npmax: R * n's bound (compile time). */
static inline void pairs_softmax(const struct attn_task *tk, int n, int npmax, int R,
				 const int64_t *lo, const int64_t *hi, float *sc, const float *mx,
				 double *sum)
{
	float *w[PAIRS_MAX];
	int64_t len[PAIRS_MAX];

	for (int r = 0; r < R; r++)
		for (int g = 0; g < n; g++) {
			const int p = r * n + g;

			w[p] = sc + p * tk->max_kv + lo[r] - lo[0];
			len[p] = hi[r] + 1 - lo[r];
			softmax_exp(tk, w[p], len[p], mx[p]);
		}
	pair_sums(w, len, R * n, npmax, sum);
}

/* Visible positions [*lo, *hi] of the row at pos: its window, or sp's. */
static void attn_range(const struct loom_attention_args *a, int64_t pos,
		       const struct attn_span *sp, int64_t *lo, int64_t *hi)
{
	*lo = 0;
	*hi = pos;
	if (a->window > 0 && pos - a->window + 1 > 0)
		*lo = pos - a->window + 1;
	if (sp) {
		*lo = sp->t0;
		*hi = sp->t1;
	}
}

/* Head h of query row `row`: acc / sum into the output, or (sp) acc, the
 * scores' maximum and sum into the part's slot. */
static void attn_put(const struct loom_attention_args *a, const struct attn_span *sp, int64_t row,
		     int64_t h, const float *acc, float mx, double sum)
{
	const int64_t hd = a->head_dim;

	if (sp) {
		float *p = sp->part + h * ATTN_PSTRIDE(hd);

		memcpy(p, acc, (size_t)hd * sizeof(float));
		p[hd] = mx;
		memcpy(p + hd + 2, &sum, sizeof(sum));
		return;
	}
	float *out = a->out + row * a->out_stride + h * hd;
	const float *sinks = LOOM_ATTN_SINKS(a);

	if (sinks) /* ABI 1.8: the sink joins the denominator last, as in ref.so */
		sum += expf(sinks[h] - mx);
	for (int64_t i = 0; i < hd; i++)
		out[i] = (float)(acc[i] / sum);
}

static void attn_row(const struct attn_task *tk, float *scratch, int64_t s, int64_t h,
		     int64_t row, int64_t pos, const struct attn_span *sp)
{
	const struct loom_attention_args *a = tk->a;
	enum cpu_isa isa = tk->ctx->isa;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd;
	const int64_t kvh = h / (a->n_heads / a->n_kv_heads);
	const float *q = a->q + row * a->q_stride + h * hd;
	float *acc = scratch, *sc = scratch + hd;
	int64_t lo, hi, n;
	float mx = -INFINITY;
	double sum; /* softmax denominator in double, as the reference */

	attn_range(a, pos, sp, &lo, &hi);
	for (int64_t t = lo; t <= hi;) {
		const float *k = kv_run(a, a->kcache, s, t, kvh, hi, &n);

		for (int64_t i = 0; i < n; i++, t++, k += stride) {
			float v = cpu_dot_f32(isa, q, k, hd) * a->scale;

			if (a->softcap > 0.0f)
				v = a->softcap * tanhf(v / a->softcap);
			sc[t - lo] = v;
			if (v > mx)
				mx = v;
		}
	}
	sum = softmax_weights(tk, sc, hi + 1 - lo, mx);
	for (int64_t i = 0; i < hd; i++)
		acc[i] = 0.0f;
	for (int64_t t = lo; t <= hi;) {
		const float *v = kv_run(a, a->vcache, s, t, kvh, hi, &n);

		for (int64_t i = 0; i < n; i++, t++, v += stride)
			cpu_axpy_f32(isa, acc, v, sc[t - lo], hd);
	}
	attn_put(a, sp, row, h, acc, mx, sum);
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
					     bool half, const struct attn_span *sp)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd;
	const int64_t kvh = h / (a->n_heads / a->n_kv_heads);
	const size_t es = half ? 2 : 4; /* bytes per cached value */
	const char *kc = (const char *)a->kcache, *vc = (const char *)a->vcache;
	const float *q = a->q + row * a->q_stride + h * hd;
	float *acc = scratch, *sc = scratch + hd;
	int64_t lo, hi, n;
	float mx = -INFINITY;
	double sum;

	attn_range(a, pos, sp, &lo, &hi);
	/* the rows stream from memory (a step's weights evict the cache):
	 * each is asked for PF_ROWS rows ahead of its use */
	for (int64_t t = lo; t <= hi;) {
		int64_t e = kv_run_off(a, s, t, kvh, hi, &n);

		for (int64_t i = 0; i < n && i < PF_ROWS; i++)
			pf_row(a, kc, es, e + i * stride, kvh, 0, (size_t)hd * es);
		for (int64_t i = 0; i < n; i++, t++, e += stride) {
			float v;

			if (i + PF_ROWS < n)
				pf_row(a, kc, es, e + PF_ROWS * stride, kvh, 0, (size_t)hd * es);
			v = dot8(q, kc + (size_t)e * es, hd, half) * a->scale;

			if (a->softcap > 0.0f)
				v = a->softcap * tanhf(v / a->softcap);
			sc[t - lo] = v;
			if (v > mx)
				mx = v;
		}
	}
	sum = softmax_weights(tk, sc, hi + 1 - lo, mx);
	for (int64_t d0 = 0; d0 < hd; d0 += 64) {
		const int w = hd - d0 < 64 ? (int)(hd - d0) / 8 : 8;
		__m256 r[8];

		for (int j = 0; j < 8; j++)
			r[j] = _mm256_setzero_ps();
		for (int64_t t = lo; t <= hi;) {
			int64_t e = kv_run_off(a, s, t, kvh, hi, &n) + d0;

			for (int64_t i = 0; i < n && i < PF_ROWS; i++)
				pf_row(a, vc, es, e + i * stride, kvh, d0, (size_t)w * 8 * es);
			for (int64_t i = 0; i < n; i++, t++, e += stride) {
				__m256 p = _mm256_set1_ps(sc[t - lo]);
				const void *v = vc + (size_t)e * es;

				if (i + PF_ROWS < n)
					pf_row(a, vc, es, e + PF_ROWS * stride, kvh, d0,
					       (size_t)w * 8 * es);

				for (int j = 0; j < w; j++)
					r[j] = _mm256_fmadd_ps(p, ld8(v, 8 * j, half), r[j]);
			}
		}
		for (int j = 0; j < w; j++)
			_mm256_storeu_ps(acc + d0 + 8 * j, r[j]);
	}
	attn_put(a, sp, row, h, acc, mx, sum);
}

CPU_TGT_AVX2 static void attn_row_avx2(const struct attn_task *tk, float *scratch, int64_t s,
				       int64_t h, int64_t row, int64_t pos,
				       const struct attn_span *sp)
{
	attn_row_avx2_t(tk, scratch, s, h, row, pos, false, sp);
}

/* The same over an f16 cache, reading it in place (the values widened
 * exactly, so the bits are those of an f32 cache holding them: what
 * attn_rows_q() gives on machines without AVX2). */
CPU_TGT_AVX2 static void attn_row_avx2_f16(const struct attn_task *tk, float *scratch, int64_t s,
					   int64_t h, int64_t row, int64_t pos,
					   const struct attn_span *sp)
{
	attn_row_avx2_t(tk, scratch, s, h, row, pos, true, sp);
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

#define TGT_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* Lanes i and i + h of each 2h-lane half (h = 4, 2, 1 within 128-bit
 * chunks: shuffle_ps; h = 8, 4 across them: shuffle_f32x4) of x and y
 * added: the steps of cpu_avx2_hsum(lo + hi) for 16 keys at once. */
TGT_512 CPU_INLINE __m512 pair_f32x4_lohi(__m512 x, __m512 y)
{
	return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
			     _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}

TGT_512 CPU_INLINE __m512 pair_f32x4_even_odd(__m512 x, __m512 y)
{
	return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
			     _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

/*
 * The horizontal sums of 16 dot vectors v[0..15], sum j in lane j, each
 * added in exactly cpu_avx2_hsum(lo + hi)'s order (so a key's score has
 * the bits of the one-key code): a_i = v_i + v_(i+8), then b_i = a_i +
 * a_(i+4), c_i = b_i + b_(i+2), and c_0 + c_1. Four rounds of shuffles
 * and adds pair up the lanes of two vectors at a time, 46 instructions for
 * 16 keys where one key's reduction took about 8.
 */
TGT_512 CPU_INLINE __m512 hsum16(const __m512 v[16])
{
	__m512 A[8], B[4], C[2], lo, hi;

	for (int k = 0; k < 8; k++) /* chunks: key 2k lanes 0-3, 4-7; key 2k+1 */
		A[k] = pair_f32x4_lohi(v[2 * k], v[2 * k + 1]);
	for (int k = 0; k < 4; k++) /* chunk j: key 4k + j, lanes 0-3 */
		B[k] = pair_f32x4_even_odd(A[2 * k], A[2 * k + 1]);
	for (int k = 0; k < 2; k++) /* chunk j: c0, c1 of key 8k + j, then 8k + 4 + j */
		C[k] = _mm512_add_ps(_mm512_shuffle_ps(B[2 * k], B[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
				     _mm512_shuffle_ps(B[2 * k], B[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
	lo = _mm512_shuffle_ps(C[0], C[1], _MM_SHUFFLE(2, 0, 2, 0));
	hi = _mm512_shuffle_ps(C[0], C[1], _MM_SHUFFLE(3, 1, 3, 1));
	/* lane 4j + l holds key 4l + j */
	return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3,
						       7, 11, 15),
				     _mm512_add_ps(lo, hi));
}

/*
 * Scores of cnt <= 16 consecutive keys for n heads from their dot vectors
 * (unused ones zeroed): scaled, soft-capped, stored at sc + g * stride,
 * and each head's running maximum per lane in mxv (max_ps keeps the
 * earlier of equal values and skips a NaN score, as attn_row()'s `v > mx`
 * does; the lanes' maxima are reduced at the end, where only the sign of
 * a zero maximum could differ, which no exp(v - mx) sees). The soft cap's
 * tanhf goes lane by lane.
 */
TGT_512 CPU_INLINE void scores16(const struct loom_attention_args *a,
				 __m512 dots[GROUP_MAX][16], int n, int cnt, float *sc,
				 int64_t stride, __m512 *mxv)
{
	const __mmask16 keep = (__mmask16)((1u << cnt) - 1);

	for (int g = 0; g < n; g++) {
		__m512 v;

		for (int i = cnt; i < 16; i++)
			dots[g][i] = _mm512_setzero_ps();
		v = _mm512_mul_ps(hsum16(dots[g]), _mm512_set1_ps(a->scale));
		if (a->softcap > 0.0f) {
			float x[16];

			_mm512_storeu_ps(x, v);
			for (int i = 0; i < cnt; i++)
				x[i] = a->softcap * tanhf(x[i] / a->softcap);
			v = _mm512_loadu_ps(x);
		}
		_mm512_mask_storeu_ps(sc + g * stride, keep, v);
		mxv[g] = _mm512_mask_max_ps(mxv[g], keep, v, mxv[g]);
	}
}

/* The grouped kernel's scores of positions lo .. hi for its n heads
 * (queries q, head g at g * hd) into sc (head g at g * max_kv), and each
 * head's running maximum per lane in mxv; hd is the head dimension. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) CPU_INLINE void
group_scores(const struct attn_task *tk, int64_t s, int64_t kvh, int n, int64_t lo, int64_t hi,
	     bool half, const float *q, float *sc, __m512 *mxv, int64_t hd, bool pf)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t stride = a->n_kv_heads * hd;
	const size_t es = half ? 2 : 4;
	const char *kc = (const char *)a->kcache;
	__m512 dots[GROUP_MAX][16]; /* each head's 16-lane dot sums of 16 keys */

	for (int64_t t = lo, m, t0 = lo; t <= hi;) {
		int64_t e = kv_run_off(a, s, t, kvh, hi, &m);

		/* a run's rows are `stride` apart: ask for them PF_ROWS ahead
		 * of use (a burst for the whole window at once overflows the
		 * core's outstanding misses) */
		for (int64_t i = 0; pf && i < m && i < PF_ROWS; i++)
			pf_row(a, kc, es, e + i * stride, kvh, 0, (size_t)hd * es);
		for (int64_t i = 0; i < m; i++, t++, e += stride) {
			const void *k = kc + (size_t)e * es;
			__m512 d[GROUP_MAX];

			if (pf && i + PF_ROWS < m)
				pf_row(a, kc, es, e + PF_ROWS * stride, kvh, 0, (size_t)hd * es);

			for (int g = 0; g < n; g++)
				d[g] = _mm512_setzero_ps();
			for (int64_t j = 0; j < hd; j += 16) {
				__m512 kv = ld16(k, j, half);

				for (int g = 0; g < n; g++)
					d[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * hd + j), kv, d[g]);
			}
			for (int g = 0; g < n; g++)
				dots[g][t - t0] = d[g];
			if (t - t0 == 15 || t == hi) {
				scores16(a, dots, n, (int)(t + 1 - t0), sc + t0 - lo, tk->max_kv, mxv);
				t0 = t + 1;
			}
		}
	}
}

/* The grouped kernel's V sums of dims d0 .. d0 + 16 w for its n heads,
 * weights sc (head g at g * max_kv), into acc (head g at g * head_dim);
 * with cont, added on to the sums acc holds (of the keys before lo). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) CPU_INLINE void
group_values(const struct attn_task *tk, int64_t s, int64_t kvh, int n, int64_t lo, int64_t hi,
	     int64_t d0, bool half, const float *sc, float *acc, int w, bool cont, bool pf)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd;
	const size_t es = half ? 2 : 4;
	const char *vc = (const char *)a->vcache;
	__m512 r[GROUP_MAX][4];

	for (int g = 0; g < n; g++)
		for (int j = 0; j < 4; j++)
			r[g][j] = cont && j < w ? _mm512_loadu_ps(acc + g * hd + d0 + 16 * j) :
						  _mm512_setzero_ps();
	for (int64_t t = lo, m; t <= hi;) {
		int64_t e = kv_run_off(a, s, t, kvh, hi, &m) + d0;

		for (int64_t i = 0; pf && i < m && i < PF_ROWS; i++)
			pf_row(a, vc, es, e + i * stride, kvh, d0, (size_t)w * 16 * es);
		for (int64_t i = 0; i < m; i++, t++, e += stride) {
			const void *v = vc + (size_t)e * es;
			__m512 vv[4];

			if (pf && i + PF_ROWS < m)
				pf_row(a, vc, es, e + PF_ROWS * stride, kvh, d0, (size_t)w * 16 * es);

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

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) CPU_INLINE void
attn_group_avx512_t(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0, int n,
		    int64_t row, int64_t pos, bool half, const struct attn_span *sp)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim;
	const int64_t kvh = h0 / (a->n_heads / a->n_kv_heads);
	const float *q = a->q + row * a->q_stride + h0 * hd;
	float *acc = scratch, *sc = scratch + GROUP_MAX * hd; /* sc: head g at g * max_kv */
	int64_t lo, hi;
	float mx[GROUP_MAX];
	double sum[GROUP_MAX];
	__m512 mxv[GROUP_MAX];

	attn_range(a, pos, sp, &lo, &hi);
	for (int g = 0; g < n; g++)
		mxv[g] = _mm512_set1_ps(-INFINITY);
	/* head_dim a constant where it is a common one, so the dot loop
	 * unrolls */
	if (hd == 64)
		group_scores(tk, s, kvh, n, lo, hi, half, q, sc, mxv, 64, true);
	else if (hd == 128)
		group_scores(tk, s, kvh, n, lo, hi, half, q, sc, mxv, 128, true);
	else
		group_scores(tk, s, kvh, n, lo, hi, half, q, sc, mxv, hd, true);
	/* softmax_weights() of each head, the sums' chains side by side */
	for (int g = 0; g < n; g++)
		mx[g] = _mm512_reduce_max_ps(mxv[g]);
	pairs_softmax(tk, n, GROUP_MAX, 1, &lo, &hi, sc, mx, sum);
	for (int64_t d0 = 0; d0 < hd; d0 += 64) {
		/* a full slice of 64 dims with its width a constant, so the
		 * accumulators stay in registers and the loops unroll */
		if (hd - d0 >= 64)
			group_values(tk, s, kvh, n, lo, hi, d0, half, sc, acc, 4, false, true);
		else
			group_values(tk, s, kvh, n, lo, hi, d0, half, sc, acc,
				     (int)(hd - d0) / 16, false, true);
	}
	for (int g = 0; g < n; g++)
		attn_put(a, sp, row, h0 + g, acc + g * hd, mx[g], sum[g]);
}

/* One copy of the kernel per group size and cache type, so the heads'
 * accumulators stay in registers and the loops over them unroll. */
#define ATTN_GROUP_N(N)                                                                    \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) static void    \
	attn_group_avx512_##N(const struct attn_task *tk, float *scratch, int64_t s,       \
			      int64_t h0, int64_t row, int64_t pos, bool half,              \
			      const struct attn_span *sp)                                   \
	{                                                                                  \
		if (half)                                                                  \
			attn_group_avx512_t(tk, scratch, s, h0, N, row, pos, true, sp);    \
		else                                                                       \
			attn_group_avx512_t(tk, scratch, s, h0, N, row, pos, false, sp);   \
	}
ATTN_GROUP_N(1)
ATTN_GROUP_N(2)
ATTN_GROUP_N(3)
ATTN_GROUP_N(4)

static void attn_group_avx512(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0,
			      int n, int64_t row, int64_t pos, bool half,
			      const struct attn_span *sp)
{
	switch (n) {
	case 1: attn_group_avx512_1(tk, scratch, s, h0, row, pos, half, sp); break;
	case 2: attn_group_avx512_2(tk, scratch, s, h0, row, pos, half, sp); break;
	case 3: attn_group_avx512_3(tk, scratch, s, h0, row, pos, half, sp); break;
	default: attn_group_avx512_4(tk, scratch, s, h0, row, pos, half, sp); break;
	}
}

/*
 * Many query rows at once: R consecutive causal rows of one sequence (row
 * row0 + i at position pos0 + i) and the n heads h0 .. of one KV head,
 * with each K and V row loaded and widened once for all R x n (row, head)
 * pairs. A pair's arithmetic is attn_group_avx512_t()'s for its row alone:
 * the same 16-lane dot sums over head_dim, hsum16() (whose lanes are
 * independent of each other, so a key's score does not depend on which
 * lane of which 16-key block it lands in), scale and soft cap, the
 * maximum over only the row's keys, softmax_weights() over only those,
 * and the V sums as the same fused multiply-adds in position order, keys
 * outside the row's range skipped (not weighted by zero: 0 * inf is
 * NaN). So every output has the one-row kernel's bits
 * (tests/backend/attn_group.c holds them to it).
 */

/* Lanes of the cnt keys from tb on that the row seeing [lo, hi] sees. */
static inline unsigned seen16(int64_t tb, int cnt, int64_t lo, int64_t hi)
{
	int64_t a = lo > tb ? lo - tb : 0, b = hi - tb < cnt - 1 ? hi - tb : cnt - 1;

	if (a > b)
		return 0;
	return ((1u << (b + 1)) - 1) & ~((1u << a) - 1);
}

/* scores16() for one pair and the keys in `keep`: stored at sc (the
 * block's first key), the pair's running maximum in *mxv. */
TGT_512 CPU_INLINE void score_pair16(const struct loom_attention_args *a, const __m512 dots[16],
				     __mmask16 keep, float *sc, __m512 *mxv)
{
	__m512 v = _mm512_mul_ps(hsum16(dots), _mm512_set1_ps(a->scale));

	if (a->softcap > 0.0f) {
		float x[16];

		_mm512_storeu_ps(x, v);
		for (int i = 0; i < 16; i++)
			if (keep >> i & 1)
				x[i] = a->softcap * tanhf(x[i] / a->softcap);
		v = _mm512_loadu_ps(x);
	}
	_mm512_mask_storeu_ps(sc, keep, v);
	*mxv = _mm512_mask_max_ps(*mxv, keep, v, *mxv);
}

/* Rows rr with t in [lo[rr], hi[rr]], as bits. */
static inline unsigned rows_seeing(const int64_t *lo, const int64_t *hi, int R, int64_t t)
{
	unsigned live = 0;

	for (int r = 0; r < R; r++)
		live |= (unsigned)(t >= lo[r] && t <= hi[r]) << r;
	return live;
}

/* One key's dot vectors into d[p] for the pairs of rows 0 .. rmax - 1
 * (rmax, n at compile time; with `check` only rows whose bit is set in
 * `live`): a pair's 16-lane sums over the key's head_dim values, 16 at a
 * time in order, its query read from memory. */
TGT_512 CPU_INLINE void key_dots16(const void *k, int64_t hd, bool half, int rmax, int n,
				   bool check, unsigned live, const float *const *q, __m512 *d)
{
	#pragma GCC unroll 16
	for (int p = 0; p < rmax * n; p++)
		d[p] = _mm512_setzero_ps();
	for (int64_t j = 0; j < hd; j += 16) {
		__m512 kv = ld16(k, j, half);

		#pragma GCC unroll 16
		for (int r = 0; r < rmax; r++) {
			if (check && !(live >> r & 1))
				continue;
			#pragma GCC unroll 16
			for (int g = 0; g < n; g++)
				d[r * n + g] = _mm512_fmadd_ps(_mm512_loadu_ps(q[r] + g * hd + j), kv,
							       d[r * n + g]);
		}
	}
}

/* The keys [*all_lo, *all_hi] that all R rows see. */
static inline void keys_all_see(const int64_t *lo, const int64_t *hi, int R, int64_t *all_lo,
				int64_t *all_hi)
{
	*all_lo = lo[0];
	*all_hi = hi[0];
	for (int r = 1; r < R; r++) {
		*all_lo = lo[r] > *all_lo ? lo[r] : *all_lo;
		*all_hi = hi[r] < *all_hi ? hi[r] : *all_hi;
	}
}

/* Scores of all pairs in blocks of 16 keys from lo[0] (block b at sc + b
 * * 256, pair p = r * n + g's 16 keys at + p * 16; lanes of keys a pair
 * does not see are left as they were) and their maxima in mxv. rmax: R's
 * bound (compile time); where R is rmax, keys that every row sees take no
 * per-row test. */
TGT_512 CPU_INLINE void rows_scores(const struct attn_task *tk, int64_t s, int64_t kvh, int n,
				    int rmax, int R, const int64_t *lo, const int64_t *hi,
				    const float *const *q, bool half, float *sc, __m512 *mxv)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd, last = hi[R - 1];
	const size_t es = half ? 2 : 4;
	const char *kc = (const char *)a->kcache;
	int64_t all_lo, all_hi;
	__m512 dots[PAIRS_MAX][16];

	keys_all_see(lo, hi, R, &all_lo, &all_hi);
	#pragma GCC unroll 16
	for (int p = 0; p < rmax * n; p++)
		mxv[p] = _mm512_set1_ps(-INFINITY);
	for (int64_t t = lo[0], m, tb = lo[0]; t <= last;) {
		int64_t e = kv_run_off(a, s, t, kvh, last, &m);

		for (int64_t i = 0; i < m && i < PF_ROWS; i++)
			pf_row(a, kc, es, e + i * stride, kvh, 0, (size_t)hd * es);
		for (int64_t i = 0; i < m; i++, t++, e += stride) {
			const void *k = kc + (size_t)e * es;
			__m512 d[PAIRS_MAX];

			if (i + PF_ROWS < m)
				pf_row(a, kc, es, e + PF_ROWS * stride, kvh, 0, (size_t)hd * es);
			if (R == rmax && t >= all_lo && t <= all_hi)
				key_dots16(k, hd, half, rmax, n, false, 0, q, d);
			else
				key_dots16(k, hd, half, rmax, n, true, rows_seeing(lo, hi, R, t), q, d);
			#pragma GCC unroll 16
			for (int p = 0; p < rmax * n; p++)
				dots[p][t - tb] = d[p];
			if (t - tb < 15 && t < last)
				continue;
			for (int r = 0; r < R; r++) {
				const int cnt = (int)(t + 1 - tb);
				const __mmask16 keep = (__mmask16)seen16(tb, cnt, lo[r], hi[r]);

				for (int g = 0; keep && g < n; g++) {
					for (int c = cnt; c < 16; c++)
						dots[r * n + g][c] = _mm512_setzero_ps();
					score_pair16(a, dots[r * n + g], keep,
						     sc + (tb - lo[0] + r * n + g) * 16,
						     &mxv[r * n + g]);
				}
			}
			tb = t + 1;
		}
	}
}

/* One key's weighted V vectors (W at compile time, the first w of them
 * in vv) into the sums r of the pairs of rows 0 .. rmax - 1 (with
 * `check` only rows set in `live`), pair p's weight at w0[p]. */
TGT_512 CPU_INLINE void key_values16(const __m512 *vv, int W, int w, int rmax, int n, bool check,
				     unsigned live, const float *w0, __m512 r[][4])
{
	#pragma GCC unroll 16
	for (int rr = 0; rr < rmax; rr++) {
		if (check && !(live >> rr & 1))
			continue;
		#pragma GCC unroll 16
		for (int g = 0; g < n; g++) {
			const int p = rr * n + g;
			const __m512 wt = _mm512_set1_ps(w0[p]);

			#pragma GCC unroll 16
			for (int j = 0; j < W; j++)
				if (j < w)
					r[p][j] = _mm512_fmadd_ps(wt, vv[j], r[p][j]);
		}
	}
}

/* The weighted V sums of all pairs into acc (pair p at p * head_dim),
 * W * 16 dims at a time (W: compile time, so the sums stay in
 * registers), from the weights blocks_softmax() left key-major. */
TGT_512 CPU_INLINE void rows_values(const struct attn_task *tk, int64_t s, int64_t kvh, int n,
				    int rmax, int W, int R, const int64_t *lo, const int64_t *hi,
				    bool half, const float *sc, float *acc)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd, last = hi[R - 1];
	const size_t es = half ? 2 : 4;
	const char *vc = (const char *)a->vcache;
	int64_t all_lo, all_hi;

	keys_all_see(lo, hi, R, &all_lo, &all_hi);
	for (int64_t d0 = 0; d0 < hd; d0 += 16 * W) {
		const int w = hd - d0 < 16 * W ? (int)(hd - d0) / 16 : W;
		__m512 r[PAIRS_MAX][4];

		#pragma GCC unroll 16
		for (int p = 0; p < rmax * n; p++)
			#pragma GCC unroll 16
			for (int j = 0; j < W; j++)
				r[p][j] = _mm512_setzero_ps();
		for (int64_t t = lo[0], m; t <= last;) {
			int64_t e = kv_run_off(a, s, t, kvh, last, &m) + d0;

			for (int64_t i = 0; i < m && i < PF_ROWS; i++)
				pf_row(a, vc, es, e + i * stride, kvh, d0, (size_t)w * 16 * es);
			for (int64_t i = 0; i < m; i++, t++, e += stride) {
				const void *v = vc + (size_t)e * es;
				const float *w0 = sc + (t - lo[0]) * 16;
				__m512 vv[4] = { 0 }; /* (only j < w are read) */

				if (i + PF_ROWS < m)
					pf_row(a, vc, es, e + PF_ROWS * stride, kvh, d0,
					       (size_t)w * 16 * es);
				#pragma GCC unroll 16
				for (int j = 0; j < W; j++)
					if (j < w)
						vv[j] = ld16(v, 16 * j, half);
				if (R == rmax && t >= all_lo && t <= all_hi)
					key_values16(vv, W, w, rmax, n, false, 0, w0, r);
				else
					key_values16(vv, W, w, rmax, n, true,
						     rows_seeing(lo, hi, R, t), w0, r);
			}
		}
		for (int p = 0; p < R * n; p++)
			for (int j = 0; j < w; j++)
				_mm512_storeu_ps(acc + p * hd + d0 + 16 * j, r[p][j]);
	}
}

/* v[0 .. 15] transposed: lane j of v[i] to lane i of v[j]. */
TGT_512 CPU_INLINE void transpose16(__m512 v[16])
{
	__m512 a[16], b[16];

	for (int k = 0; k < 16; k += 2) { /* chunk c: rows k, k + 1 at 4c .. 4c + 3 */
		a[k] = _mm512_unpacklo_ps(v[k], v[k + 1]);
		a[k + 1] = _mm512_unpackhi_ps(v[k], v[k + 1]);
	}
	for (int k = 0; k < 16; k += 4) { /* b[k + e] chunk c: rows k .. k + 3 at 4c + e */
		b[k] = _mm512_shuffle_ps(a[k], a[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
		b[k + 1] = _mm512_shuffle_ps(a[k], a[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
		b[k + 2] = _mm512_shuffle_ps(a[k + 1], a[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
		b[k + 3] = _mm512_shuffle_ps(a[k + 1], a[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
	}
	for (int e = 0; e < 4; e++) { /* lane 4c + e of the four row quads */
		__m512 lo0 = _mm512_shuffle_f32x4(b[e], b[4 + e], _MM_SHUFFLE(2, 0, 2, 0));
		__m512 hi0 = _mm512_shuffle_f32x4(b[e], b[4 + e], _MM_SHUFFLE(3, 1, 3, 1));
		__m512 lo1 = _mm512_shuffle_f32x4(b[8 + e], b[12 + e], _MM_SHUFFLE(2, 0, 2, 0));
		__m512 hi1 = _mm512_shuffle_f32x4(b[8 + e], b[12 + e], _MM_SHUFFLE(3, 1, 3, 1));

		v[e] = _mm512_shuffle_f32x4(lo0, lo1, _MM_SHUFFLE(2, 0, 2, 0));
		v[8 + e] = _mm512_shuffle_f32x4(lo0, lo1, _MM_SHUFFLE(3, 1, 3, 1));
		v[4 + e] = _mm512_shuffle_f32x4(hi0, hi1, _MM_SHUFFLE(2, 0, 2, 0));
		v[12 + e] = _mm512_shuffle_f32x4(hi0, hi1, _MM_SHUFFLE(3, 1, 3, 1));
	}
}

/*
 * The pairs' softmax weights from rows_scores()'s blocks, in place and
 * key-major: key t's weights of pairs 0 .. 15 at sc + (t - lo[0]) * 16,
 * 0 for a key the pair's row does not see (and for pairs past R * n).
 * A weight is softmax_exp()'s exp(score - max) (the subtraction first,
 * then the exponential of the difference: the same float), and sum[p]
 * softmax_weights()'s sum, each weight added in key order in double (the
 * zeros add nothing), eight pairs to a vector. rmax, n: compile time.
 */
TGT_512 CPU_INLINE void blocks_softmax(const struct attn_task *tk, int n, int rmax, int R,
				       const int64_t *lo, const int64_t *hi, float *sc,
				       const float *mx, double *sum)
{
	const int64_t last = hi[R - 1];
	__m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
	double out[16];

	for (int64_t tb = lo[0]; tb <= last; tb += 16) {
		float *blk = sc + (tb - lo[0]) * 16;
		const int cnt = last + 1 - tb < 16 ? (int)(last + 1 - tb) : 16;
		__m512 v[16];

		for (int p = 0; p < R * n; p++)
			_mm512_storeu_ps(blk + p * 16, _mm512_sub_ps(_mm512_loadu_ps(blk + p * 16),
								     _mm512_set1_ps(mx[p])));
		softmax_exp(tk, blk, (int64_t)R * n * 16, 0.0f);
		#pragma GCC unroll 16
		for (int p = 0; p < 16; p++) {
			const int r = p / n;
			const __mmask16 keep = p < R * n ?
				(__mmask16)seen16(tb, cnt, lo[r], hi[r]) : 0;

			v[p] = _mm512_maskz_loadu_ps(keep, blk + p * 16);
		}
		transpose16(v);
		#pragma GCC unroll 16
		for (int i = 0; i < 16; i++) {
			_mm512_storeu_ps(blk + i * 16, v[i]);
			if (i < cnt) {
				s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v[i])));
				s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(
					_mm512_extractf64x4_pd(_mm512_castps_pd(v[i]), 1))));
			}
		}
	}
	_mm512_storeu_pd(out, s0);
	_mm512_storeu_pd(out + 8, s1);
	for (int p = 0; p < R * n; p++)
		sum[p] = out[p];
	(void)rmax;
}

/* Every pair's output (attn_put()): rows row0 .., heads h0 .. */
static inline void pairs_put(const struct loom_attention_args *a, const struct attn_span *sp,
			     int64_t row0, int64_t h0, int n, int R, const float *acc,
			     const float *mx, const double *sum)
{
	for (int r = 0; r < R; r++)
		for (int g = 0; g < n; g++)
			attn_put(a, sp, row0 + r, h0 + g, acc + (r * n + g) * a->head_dim,
				 mx[r * n + g], sum[r * n + g]);
}

TGT_512 CPU_INLINE void attn_rows_avx512_t(const struct attn_task *tk, float *scratch, int64_t s,
					   int64_t h0, int n, int rmax, int W, int64_t row0,
					   int64_t pos0, int R, bool half)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, kvh = h0 / (a->n_heads / a->n_kv_heads);
	float *acc = scratch, *sc = scratch + PAIRS_MAX * hd;
	const float *q[PAIRS_MAX];
	int64_t lo[PAIRS_MAX], hi[PAIRS_MAX];
	__m512 mxv[PAIRS_MAX];
	float mx[PAIRS_MAX];
	double sum[PAIRS_MAX];

	for (int r = 0; r < R; r++) {
		attn_range(a, pos0 + r, NULL, &lo[r], &hi[r]);
		q[r] = a->q + (row0 + r) * a->q_stride + h0 * hd;
	}
	rows_scores(tk, s, kvh, n, rmax, R, lo, hi, q, half, sc, mxv);
	for (int p = 0; p < R * n; p++)
		mx[p] = _mm512_reduce_max_ps(mxv[p]);
	blocks_softmax(tk, n, rmax, R, lo, hi, sc, mx, sum);
	rows_values(tk, s, kvh, n, rmax, W, R, lo, hi, half, sc, acc);
	pairs_put(a, NULL, row0, h0, n, R, acc, mx, sum);
}

/* One copy per group size and cache type: rows up to PAIRS_MAX / N, and
 * V sums over 64, 32 or 16 dims at a time as the pairs allow (P pairs
 * and their P * W sums, W V vectors in the 32 registers); and one where R
 * is the run a whole unit of ROWS_PER_UNIT rows splits into (attn_run():
 * 16, 8, 4 and 4 rows for N = 1 .. 4), so that its row loops are
 * constant and keys every row sees take no test (where that run is
 * ROWS_MAX(N) rows, the first copy does so already). */
#define ROWS_MAX(N) (PAIRS_MAX / (N))
#define PAIRS_W(P) ((P) <= 6 ? 4 : (P) <= 14 ? 2 : 1)
#define UNIT_RUNS(N) ((ROWS_PER_UNIT + ROWS_MAX(N) - 1) / ROWS_MAX(N))
#define UNIT_ROWS(N) (ROWS_PER_UNIT / UNIT_RUNS(N))
#define ATTN_ROWS_N(N)                                                                    \
	TGT_512 static void attn_rows_avx512_##N(const struct attn_task *tk, float *scratch, \
						 int64_t s, int64_t h0, int64_t row0,         \
						 int64_t pos0, int R, bool half)              \
	{                                                                                 \
		if (UNIT_ROWS(N) != ROWS_MAX(N) && R == UNIT_ROWS(N) && half)             \
			attn_rows_avx512_t(tk, scratch, s, h0, N, UNIT_ROWS(N),            \
					   PAIRS_W(UNIT_ROWS(N) * N), row0, pos0,         \
					   UNIT_ROWS(N), true);                           \
		else if (UNIT_ROWS(N) != ROWS_MAX(N) && R == UNIT_ROWS(N))                \
			attn_rows_avx512_t(tk, scratch, s, h0, N, UNIT_ROWS(N),            \
					   PAIRS_W(UNIT_ROWS(N) * N), row0, pos0,         \
					   UNIT_ROWS(N), false);                          \
		else if (half)                                                            \
			attn_rows_avx512_t(tk, scratch, s, h0, N, ROWS_MAX(N),             \
					   PAIRS_W(ROWS_MAX(N) * N), row0, pos0, R, true); \
		else                                                                      \
			attn_rows_avx512_t(tk, scratch, s, h0, N, ROWS_MAX(N),             \
					   PAIRS_W(ROWS_MAX(N) * N), row0, pos0, R,       \
					   false);                                        \
	}
ATTN_ROWS_N(1)
ATTN_ROWS_N(2)
ATTN_ROWS_N(3)
ATTN_ROWS_N(4)

/* R <= ROWS_MAX(n) rows, n heads. */
static void attn_rows_avx512(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0,
			     int n, int64_t row0, int64_t pos0, int R, bool half)
{
	switch (n) {
	case 1: attn_rows_avx512_1(tk, scratch, s, h0, row0, pos0, R, half); break;
	case 2: attn_rows_avx512_2(tk, scratch, s, h0, row0, pos0, R, half); break;
	case 3: attn_rows_avx512_3(tk, scratch, s, h0, row0, pos0, R, half); break;
	default: attn_rows_avx512_4(tk, scratch, s, h0, row0, pos0, R, half); break;
	}
}
/*
 * The many-row kernel on 8-lane vectors (AVX2 machines, head_dim a
 * multiple of 8): R consecutive causal rows and the n heads of one KV
 * head share each K and V row, as attn_rows_avx512_t() does, and a pair's
 * arithmetic is attn_row_avx2_t()'s for its row and head alone: dot8()'s
 * two accumulators (s0 over the 16-value steps' first 8 values, s1 over
 * their second), hsum8() of s0 + s1, scale, soft cap, the maximum over the
 * row's keys only, softmax_weights() over those, and the V sums as the
 * same fused multiply-adds in position order. R = 1 with a part (sp)
 * serves a split decode row. tests/backend/attn_group.c holds every
 * output to the one-row kernel's bits (LOOM_CPU_ATTN_GROUP=0).
 */
#define PAIRS_256 12

/* cpu_avx2_hsum() of 8 vectors at once: lane i is v[i]'s sum, added in
 * its order (a_l = v_l + v_(l+4), b_l = a_l + a_(l+2), b_0 + b_1), 22
 * instructions for 8 keys where one key's reduction took about 6. */
CPU_TGT_AVX2 CPU_INLINE __m256 hsum8(const __m256 v[8])
{
	__m256 A[4], B[2], C;

	for (int k = 0; k < 4; k++) /* halves: key 2k's a_0..3, key 2k+1's */
		A[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
				     _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
	for (int k = 0; k < 2; k++) /* halves: b_0, b_1 of keys 4k, 4k+2; 4k+1, 4k+3 */
		B[k] = _mm256_add_ps(_mm256_shuffle_ps(A[2 * k], A[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
				     _mm256_shuffle_ps(A[2 * k], A[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
	/* halves: keys 0, 2, 4, 6; 1, 3, 5, 7 */
	C = _mm256_add_ps(_mm256_shuffle_ps(B[0], B[1], _MM_SHUFFLE(2, 0, 2, 0)),
			  _mm256_shuffle_ps(B[0], B[1], _MM_SHUFFLE(3, 1, 3, 1)));
	return _mm256_permutevar8x32_ps(C, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Lanes (all bits set) of the cnt keys from tb on that [lo, hi] holds. */
CPU_TGT_AVX2 CPU_INLINE __m256i seen8(int64_t tb, int cnt, int64_t lo, int64_t hi)
{
	const int a = lo > tb ? (int)(lo - tb) : 0;
	const int b = hi - tb < cnt - 1 ? (int)(hi - tb) : cnt - 1;
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);

	if (a > b)
		return _mm256_setzero_si256();
	return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(a), lane),
				   _mm256_cmpgt_epi32(_mm256_set1_epi32(b + 1), lane));
}

/* A pair's scores of the keys in `keep` from its 8 dot vectors: stored
 * at sc (the block's first key), its running maximum per lane in *mxv
 * (max_ps keeps the earlier of equal values and skips a NaN score, as
 * `v > mx` does). */
CPU_TGT_AVX2 CPU_INLINE void score_pair8(const struct loom_attention_args *a, const __m256 dots[8],
					 bool all, __m256i keep, float *sc, __m256 *mxv)
{
	__m256 v = _mm256_mul_ps(hsum8(dots), _mm256_set1_ps(a->scale));

	if (a->softcap > 0.0f) {
		float x[8];

		_mm256_storeu_ps(x, v);
		for (int i = 0; i < 8; i++)
			x[i] = a->softcap * tanhf(x[i] / a->softcap);
		v = _mm256_loadu_ps(x);
	}
	if (all) { /* every lane kept (vmaskmovps stores are slow on some CPUs) */
		_mm256_storeu_ps(sc, v);
		*mxv = _mm256_max_ps(v, *mxv);
		return;
	}
	_mm256_maskstore_ps(sc, keep, v);
	*mxv = _mm256_blendv_ps(*mxv, _mm256_max_ps(v, *mxv), _mm256_castsi256_ps(keep));
}

/* One pair's two sums (dot8()'s s0 and s1) over the first w of the key's
 * 8 widened vectors kv, against its query from qp: even vectors step s0,
 * odd ones s1. */
CPU_TGT_AVX2 CPU_INLINE void dot_steps8(const float *qp, const __m256 *kv, int w, __m256 *s0,
					__m256 *s1)
{
	#pragma GCC unroll 8
	for (int c = 0; c < 8; c += 2) {
		if (c < w)
			*s0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp + 8 * c), kv[c], *s0);
		if (c + 1 < w)
			*s1 = _mm256_fmadd_ps(_mm256_loadu_ps(qp + 8 * c + 8), kv[c + 1], *s1);
	}
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/*
 * The dot vectors (s0 + s1) of one key for pairs 0 .. NP - 1 (NP at
 * compile time; with `check`, only those whose bit is set in `live`) into
 * dots[p][slot]: 64 dims of the key at a time held in registers, each
 * pair's query read from memory (qp[p]), its two sums carried in `part`
 * from one 64-dim slice to the next; a last slice of fewer dims
 * (head_dim % 64) takes as many vectors as it has.
 */
CPU_TGT_AVX2 CPU_INLINE void key_dots8(const void *k, int64_t hd, bool half, int NP, bool check,
				       unsigned live, const float *const *qp,
				       __m256 dots[PAIRS_256][8], int slot)
{
	__m256 part[PAIRS_256][2]; /* read only after a slice wrote it */

	for (int64_t d0 = 0; d0 < hd; d0 += 64) {
		const int w = hd - d0 < 64 ? (int)(hd - d0) / 8 : 8;
		const bool first = d0 == 0, last = d0 + 64 >= hd;
		__m256 kv[8];

		#pragma GCC unroll 8
		for (int c = 0; c < 8; c++)
			kv[c] = w == 8 || c < w ? ld8(k, d0 + 8 * c, half) : _mm256_setzero_ps();
		#pragma GCC unroll 12
		for (int p = 0; p < NP; p++) {
			__m256 s0 = first ? _mm256_setzero_ps() : part[p][0];
			__m256 s1 = first ? _mm256_setzero_ps() : part[p][1];

			if (check && !(live >> p & 1))
				continue;
			if (w == 8) /* (the whole slice: no test a vector) */
				dot_steps8(qp[p] + d0, kv, 8, &s0, &s1);
			else
				dot_steps8(qp[p] + d0, kv, w, &s0, &s1);
			if (last) {
				dots[p][slot] = _mm256_add_ps(s0, s1);
			} else {
				part[p][0] = s0;
				part[p][1] = s1;
			}
		}
	}
}
#pragma GCC diagnostic pop

/* Pairs (r * n + g) whose row sees key t, as bits. */
static inline unsigned pairs_seeing(const int64_t *lo, const int64_t *hi, int R, int n, int64_t t)
{
	unsigned live = 0;

	for (int r = 0; r < R; r++)
		if (t >= lo[r] && t <= hi[r])
			live |= ((1u << n) - 1) << (r * n);
	return live;
}

/* Scores of all pairs in blocks of 16 keys from lo[0] (block b at sc + b
 * * 256, pair p = r * n + g's keys at + p * 16, lanes of keys a pair does
 * not see left as they were; its query at qp[p]) and their maxima per
 * lane in mxv. rmax: R's bound (compile time); a lone row (rmax 1) keeps
 * pair p's scores in a row at sc + p * max_kv instead (key t at t -
 * lo[0]): its few pairs pay less for that than for a transposition. With
 * pf, the rows are asked for ahead of use. */
CPU_TGT_AVX2 CPU_INLINE void rows_scores8(const struct attn_task *tk, int64_t s, int64_t kvh,
					  int n, int rmax, int R, const int64_t *lo,
					  const int64_t *hi, const float *const *qp, bool half,
					  float *sc, __m256 *mxv, bool pf)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd, last = hi[R - 1];
	const size_t es = half ? 2 : 4;
	const char *kc = (const char *)a->kcache;
	int64_t all_lo = lo[0], all_hi = hi[0]; /* the keys every row sees */
	__m256 dots[PAIRS_256][8];

	for (int r = 1; r < R; r++) {
		all_lo = lo[r] > all_lo ? lo[r] : all_lo;
		all_hi = hi[r] < all_hi ? hi[r] : all_hi;
	}

	for (int p = 0; p < rmax * n; p++)
		mxv[p] = _mm256_set1_ps(-INFINITY);
	for (int64_t t = lo[0], m, tb = lo[0]; t <= last;) {
		int64_t e = kv_run_off(a, s, t, kvh, last, &m);

		for (int64_t i = 0; pf && i < m && i < PF_ROWS; i++)
			pf_row(a, kc, es, e + i * stride, kvh, 0, (size_t)hd * es);
		for (int64_t i = 0; i < m; i++, t++, e += stride) {
			const void *k = kc + (size_t)e * es;
			const int slot = (int)(t - tb);
			const bool every = R == rmax && t >= all_lo && t <= all_hi;
			const unsigned live = every ? 0 : pairs_seeing(lo, hi, R, n, t);

			if (pf && i + PF_ROWS < m)
				pf_row(a, kc, es, e + PF_ROWS * stride, kvh, 0, (size_t)hd * es);

			/* (head_dim 64 as a constant: one slice, no tests a
			 * vector; every pair live: no test a pair) */
			if (hd == 64 && every)
				key_dots8(k, 64, half, rmax * n, false, 0, qp, dots, slot);
			else if (hd == 64)
				key_dots8(k, 64, half, rmax * n, true, live, qp, dots, slot);
			else if (every)
				key_dots8(k, hd, half, rmax * n, false, 0, qp, dots, slot);
			else
				key_dots8(k, hd, half, rmax * n, true, live, qp, dots, slot);
			if (t - tb < 7 && t < last)
				continue;
			for (int r = 0; r < R; r++) {
				const int cnt = (int)(t + 1 - tb);
				const __m256i keep = seen8(tb, cnt, lo[r], hi[r]);
				const bool all = cnt == 8 && tb >= lo[r] && tb + 7 <= hi[r];

				if (_mm256_testz_si256(keep, keep))
					continue;
				for (int g = 0; g < n; g++) {
					const int p = r * n + g;

					for (int c = cnt; c < 8; c++)
						dots[p][c] = _mm256_setzero_ps();
					score_pair8(a, dots[p], all, keep, rmax > 1 ?
						    sc + (tb - lo[0]) / 16 * 256 + p * 16 +
						    (tb - lo[0]) % 16 :
						    sc + p * tk->max_kv + tb - lo[0], &mxv[p]);
				}
			}
			tb = t + 1;
		}
	}
}

/* The pairs of one V pass (values_pass8()): rows r0 .., the keys any of
 * them sees [first, last] and those all of them see [all_lo, all_hi]. */
struct vpass {
	int r0;
	int64_t first, last, all_lo, all_hi;
};

/* One key's weighted V vectors (W from v, 8 dims each) into the sums r of
 * RG * n pairs (with `check`, only rows rr with t in [lo[rr], hi[rr]]),
 * pair p's weight at w0[p * ps], broadcast once for its W vectors: the V
 * vectors loaded first, or where they and the sums would not leave a
 * register for a weight, the weights first and a V vector at a time. */
CPU_TGT_AVX2 CPU_INLINE void key_values8(const void *v, bool half, int W, int n, int RG,
					 bool check, int r0, const int64_t *lo, const int64_t *hi,
					 int64_t t, const float *w0, int64_t ps, __m256 r[][4])
{
	if (RG * n * W + W + 1 > 16) {
		__m256 wt[12];
		bool on[12];

		#pragma GCC unroll 12
		for (int p = 0; p < RG * n; p++) {
			const int rr = r0 + p / n;

			on[p] = !check || (t >= lo[rr] && t <= hi[rr]);
			wt[p] = _mm256_broadcast_ss(w0 + p * ps);
		}
		#pragma GCC unroll 4
		for (int j = 0; j < W; j++) {
			const __m256 x = ld8(v, 8 * j, half);

			#pragma GCC unroll 12
			for (int p = 0; p < RG * n; p++)
				if (on[p])
					r[p][j] = _mm256_fmadd_ps(wt[p], x, r[p][j]);
		}
		return;
	}
	__m256 vv[4];

	#pragma GCC unroll 4
	for (int j = 0; j < W; j++)
		vv[j] = ld8(v, 8 * j, half);
	#pragma GCC unroll 12
	for (int p = 0; p < RG * n; p++) {
		const int rr = r0 + p / n;
		__m256 wt;

		if (check && (t < lo[rr] || t > hi[rr]))
			continue;
		wt = _mm256_broadcast_ss(w0 + p * ps);
		#pragma GCC unroll 4
		for (int j = 0; j < W; j++)
			r[p][j] = _mm256_fmadd_ps(wt, vv[j], r[p][j]);
	}
}

/*
 * One pass of values_rows8(): W vectors (8W dims from d0) of the V sums
 * of RG * n pairs (all three at compile time, RG * n * W <= 12, so the
 * sums, the W V vectors and a weight fit the 16 vector registers), from
 * the weights blocks_softmax8() left key-major (key t's at sc + (t -
 * lo[0]) * 16; with km false, pairs_softmax()'s rows). Keys every row
 * sees take no per-row test; the first pass (pf) asks for the rows ahead.
 * With cont, the sums go on from those acc holds (of keys before first).
 */
CPU_TGT_AVX2 CPU_INLINE void values_pass8(const struct attn_task *tk, int64_t s, int64_t kvh,
					  int n, int RG, int W, bool km, const struct vpass *vp,
					  const int64_t *lo, const int64_t *hi, const float *sc,
					  int64_t d0, bool pf, bool half, float *acc, bool cont)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, stride = a->n_kv_heads * hd;
	const size_t es = half ? 2 : 4;
	const char *vc = (const char *)a->vcache;
	const int64_t ks = km ? 16 : 1, ps = km ? 1 : tk->max_kv; /* key, pair strides */
	__m256 r[12][4];

	#pragma GCC unroll 12
	for (int p = 0; p < RG * n; p++)
		#pragma GCC unroll 4
		for (int j = 0; j < W; j++)
			r[p][j] = cont ? _mm256_loadu_ps(acc + (vp->r0 * n + p) * hd + d0 + 8 * j) :
					 _mm256_setzero_ps();
	for (int64_t t = vp->first, m; t <= vp->last;) {
		int64_t e = kv_run_off(a, s, t, kvh, vp->last, &m) + d0;

		for (int64_t i = 0; pf && i < m && i < PF_ROWS; i++)
			pf_row(a, vc, es, e - d0 + i * stride, kvh, 0, (size_t)hd * es);
		for (int64_t i = 0; i < m; i++, t++, e += stride) {
			const void *v = vc + (size_t)e * es;
			const float *w0 = sc + (t - lo[0]) * ks + vp->r0 * n * ps;

			if (pf && i + PF_ROWS < m)
				pf_row(a, vc, es, e - d0 + PF_ROWS * stride, kvh, 0, (size_t)hd * es);
			if (t >= vp->all_lo && t <= vp->all_hi)
				key_values8(v, half, W, n, RG, false, vp->r0, lo, hi, t, w0, ps, r);
			else
				key_values8(v, half, W, n, RG, true, vp->r0, lo, hi, t, w0, ps, r);
		}
	}
	#pragma GCC unroll 12
	for (int p = 0; p < RG * n; p++)
		#pragma GCC unroll 4
		for (int j = 0; j < W; j++)
			_mm256_storeu_ps(acc + (vp->r0 * n + p) * hd + d0 + 8 * j, r[p][j]);
}

/* Vectors of dims a V pass of np pairs takes, so that the sums, the V
 * vectors and a weight fit the 16 vector registers. */
#define V_WIDTH(np) ((np) <= 3 ? 4 : (np) <= 6 ? 2 : 1)

/* values_pass8() over every dim of head_dim: passes of V_WIDTH(RG * n)
 * vectors, then of 2 where that is wider, then of 1 (which dims share a
 * pass changes no bits: each dim's sums are its own); the first asks for
 * the rows ahead where pf. */
CPU_TGT_AVX2 CPU_INLINE void values_dims8(const struct attn_task *tk, int64_t s, int64_t kvh,
					  int n, int RG, bool km, const struct vpass *vp,
					  const int64_t *lo, const int64_t *hi, const float *sc,
					  bool pf, bool half, float *acc, bool cont)
{
	const int64_t hd = tk->a->head_dim;
	const int W = V_WIDTH(RG * n);
	int64_t d0 = 0;

	for (; d0 + 8 * W <= hd; d0 += 8 * W)
		values_pass8(tk, s, kvh, n, RG, W, km, vp, lo, hi, sc, d0, pf && d0 == 0, half, acc,
			     cont);
	for (; W > 2 && d0 + 16 <= hd; d0 += 16)
		values_pass8(tk, s, kvh, n, RG, 2, km, vp, lo, hi, sc, d0, pf && d0 == 0, half, acc,
			     cont);
	for (; d0 < hd; d0 += 8)
		values_pass8(tk, s, kvh, n, RG, 1, km, vp, lo, hi, sc, d0, pf && d0 == 0, half, acc,
			     cont);
}

/*
 * The weighted V sums of the pairs of rows r0 .. r0 + RG - 1 (RG and n at
 * compile time, RG * n <= 6) into acc (pair p at p * head_dim), in
 * position order per pair (attn_row_avx2_t()'s fused multiply-adds),
 * values_dims8()'s passes.
 */
CPU_TGT_AVX2 CPU_INLINE void values_rows8(const struct attn_task *tk, int64_t s, int64_t kvh,
					  int n, int RG, bool km, int r0, const int64_t *lo,
					  const int64_t *hi, bool half, const float *sc, float *acc)
{
	struct vpass vp = { r0, lo[r0], hi[r0], lo[r0], hi[r0] };

	for (int r = r0; r < r0 + RG; r++) {
		vp.first = lo[r] < vp.first ? lo[r] : vp.first;
		vp.last = hi[r] > vp.last ? hi[r] : vp.last;
		vp.all_lo = lo[r] > vp.all_lo ? lo[r] : vp.all_lo;
		vp.all_hi = hi[r] < vp.all_hi ? hi[r] : vp.all_hi;
	}
	values_dims8(tk, s, kvh, n, RG, km, &vp, lo, hi, sc, r0 == 0, half, acc, false);
}

/* values_rows8() over rows 0 .. R - 1, V_ROWS(n) rows at a time (n at
 * compile time). */
#define V_ROWS(n) ((n) >= 4 ? 3 : 6 / (n))
CPU_TGT_AVX2 CPU_INLINE void rows_values8(const struct attn_task *tk, int64_t s, int64_t kvh,
					  int n, int R, bool km, const int64_t *lo, const int64_t *hi,
					  bool half, const float *sc, float *acc)
{
	int r0 = 0;

	for (; r0 + V_ROWS(n) <= R; r0 += V_ROWS(n))
		values_rows8(tk, s, kvh, n, V_ROWS(n), km, r0, lo, hi, half, sc, acc);
	for (; r0 < R; r0++) /* the rest one at a time */
		values_rows8(tk, s, kvh, n, 1, km, r0, lo, hi, half, sc, acc);
}

/* v[0 .. 7] transposed: lane j of v[i] to lane i of v[j]. */
CPU_TGT_AVX2 CPU_INLINE void transpose8(__m256 v[8])
{
	__m256 a[8], b[8];

	for (int k = 0; k < 8; k += 2) { /* half h: rows k, k + 1 at 4h .. 4h + 3 */
		a[k] = _mm256_unpacklo_ps(v[k], v[k + 1]);
		a[k + 1] = _mm256_unpackhi_ps(v[k], v[k + 1]);
	}
	for (int k = 0; k < 8; k += 4) { /* b[k + e] half h: rows k .. k + 3 at 4h + e */
		b[k] = _mm256_shuffle_ps(a[k], a[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
		b[k + 1] = _mm256_shuffle_ps(a[k], a[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
		b[k + 2] = _mm256_shuffle_ps(a[k + 1], a[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
		b[k + 3] = _mm256_shuffle_ps(a[k + 1], a[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
	}
	for (int e = 0; e < 4; e++) {
		v[e] = _mm256_permute2f128_ps(b[e], b[4 + e], 0x20);
		v[4 + e] = _mm256_permute2f128_ps(b[e], b[4 + e], 0x31);
	}
}

/*
 * blocks_softmax() on 8-lane vectors: the pairs' weights from
 * rows_scores8()'s blocks, in place and key-major (key t's weights of
 * pairs 0 .. 15 at sc + (t - lo[0]) * 16; 0 for a key the pair's row
 * does not see; pairs from 8 on only where npmax, R * n's bound at
 * compile time, exceeds 8), and in sum[p] each pair's sum in key order
 * in double, four pairs to a vector.
 */
CPU_TGT_AVX2 CPU_INLINE void blocks_softmax8(const struct attn_task *tk, int n, int npmax, int R,
					     const int64_t *lo, const int64_t *hi, float *sc,
					     const float *mx, double *sum)
{
	const int64_t last = hi[R - 1];
	const int PH = npmax > 8 ? 2 : 1; /* halves of the pairs */
	__m256d s[4] = { _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
			 _mm256_setzero_pd() };
	double out[16];

	for (int64_t tb = lo[0]; tb <= last; tb += 16) {
		float *blk = sc + (tb - lo[0]) * 16;
		const int cnt = last + 1 - tb < 16 ? (int)(last + 1 - tb) : 16;
		__m256 v[2][2][8]; /* [pair half][key half][8 rows] */

		for (int p = 0; p < R * n; p++)
			for (int h = 0; h < 16; h += 8)
				_mm256_storeu_ps(blk + p * 16 + h,
						 _mm256_sub_ps(_mm256_loadu_ps(blk + p * 16 + h),
							       _mm256_set1_ps(mx[p])));
		softmax_exp(tk, blk, (int64_t)R * n * 16, 0.0f);
		for (int ph = 0; ph < PH; ph++)
			for (int kh = 0; kh < 2; kh++) {
				#pragma GCC unroll 8
				for (int i = 0; i < 8; i++) {
					const int p = ph * 8 + i, r = p / n;
					const __m256i keep = p < R * n ?
						seen8(tb + kh * 8, cnt - kh * 8, lo[r], hi[r]) :
						_mm256_setzero_si256();

					v[ph][kh][i] = _mm256_and_ps(_mm256_loadu_ps(blk + p * 16 + kh * 8),
								     _mm256_castsi256_ps(keep));
				}
				transpose8(v[ph][kh]);
			}
		for (int kh = 0; kh < 2; kh++)
			for (int j = 0; j < 8; j++) {
				const int i = kh * 8 + j;

				for (int ph = 0; ph < PH; ph++) {
					const __m256 w = v[ph][kh][j];

					_mm256_storeu_ps(blk + i * 16 + ph * 8, w);
					if (i >= cnt)
						continue;
					s[2 * ph] = _mm256_add_pd(s[2 * ph],
								  _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
					s[2 * ph + 1] = _mm256_add_pd(s[2 * ph + 1],
								      _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)));
				}
			}
	}
	for (int q = 0; q < 4; q++)
		_mm256_storeu_pd(out + 4 * q, s[q]);
	for (int p = 0; p < R * n; p++)
		sum[p] = out[p];
}

/* The largest of v's lanes (any order: only a zero's sign could differ,
 * which no exp(v - mx) sees). */
CPU_TGT_AVX2 CPU_INLINE float hmax8(__m256 v)
{
	__m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	x = _mm_max_ps(x, _mm_movehl_ps(x, x));
	x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
	return _mm_cvtss_f32(x);
}

CPU_TGT_AVX2 CPU_INLINE void attn_rows_avx2_t(const struct attn_task *tk, float *scratch, int64_t s,
					      int64_t h0, int n, int rmax, int64_t row0,
					      int64_t pos0, int R, bool half,
					      const struct attn_span *sp)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, kvh = h0 / (a->n_heads / a->n_kv_heads);
	float *acc = scratch, *sc = scratch + PAIRS_MAX * hd;
	const float *qp[PAIRS_256];
	int64_t lo[PAIRS_256], hi[PAIRS_256];
	__m256 mxv[PAIRS_256];
	float mx[PAIRS_256];
	double sum[PAIRS_256];

	if (R < 1) /* (never: attn_run() passes runs of at least one row) */
		return;
	for (int r = 0; r < R; r++) {
		attn_range(a, pos0 + r, sp, &lo[r], &hi[r]);
		for (int g = 0; g < n; g++)
			qp[r * n + g] = a->q + (row0 + r) * a->q_stride + (h0 + g) * hd;
	}
	rows_scores8(tk, s, kvh, n, rmax, R, lo, hi, qp, half, sc, mxv, true);
	for (int p = 0; p < R * n; p++)
		mx[p] = hmax8(mxv[p]);
	if (rmax > 1)
		blocks_softmax8(tk, n, rmax * n, R, lo, hi, sc, mx, sum);
	else
		pairs_softmax(tk, n, n, R, lo, hi, sc, mx, sum);
	rows_values8(tk, s, kvh, n, R, rmax > 1, lo, hi, half, sc, acc);
	pairs_put(a, sp, row0, h0, n, R, acc, mx, sum);
}

/* One copy per group size and cache type: rows up to PAIRS_256 / N. */
#define ROWS8_MAX(N) (PAIRS_256 / (N))
#define ATTN_ROWS8_N(N)                                                                   \
	CPU_TGT_AVX2 static void attn_rows_avx2_##N(const struct attn_task *tk, float *scratch, \
						    int64_t s, int64_t h0, int64_t row0,      \
						    int64_t pos0, int R, bool half,           \
						    const struct attn_span *sp)               \
	{                                                                                 \
		/* a lone row (decode, a split part) with its bound a constant */        \
		if (R == 1 && half)                                                       \
			attn_rows_avx2_t(tk, scratch, s, h0, N, 1, row0, pos0, 1, true, sp);  \
		else if (R == 1)                                                          \
			attn_rows_avx2_t(tk, scratch, s, h0, N, 1, row0, pos0, 1, false, sp); \
		else if (half)                                                            \
			attn_rows_avx2_t(tk, scratch, s, h0, N, ROWS8_MAX(N),              \
					 row0, pos0, R, true, sp);                        \
		else                                                                      \
			attn_rows_avx2_t(tk, scratch, s, h0, N, ROWS8_MAX(N),              \
					 row0, pos0, R, false, sp);                       \
	}
ATTN_ROWS8_N(1)
ATTN_ROWS8_N(2)
ATTN_ROWS8_N(3)
ATTN_ROWS8_N(4)

/* R <= ROWS8_MAX(n) rows (1 with a part), n heads. */
static void attn_rows_avx2(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0,
			   int n, int64_t row0, int64_t pos0, int R, bool half,
			   const struct attn_span *sp)
{
	switch (n) {
	case 1: attn_rows_avx2_1(tk, scratch, s, h0, row0, pos0, R, half, sp); break;
	case 2: attn_rows_avx2_2(tk, scratch, s, h0, row0, pos0, R, half, sp); break;
	case 3: attn_rows_avx2_3(tk, scratch, s, h0, row0, pos0, R, half, sp); break;
	default: attn_rows_avx2_4(tk, scratch, s, h0, row0, pos0, R, half, sp); break;
	}
}

#endif

/* One query row of a unit: the AVX2 kernel where it applies, else the
 * portable one (the same bits either way). */
static void attn_one(const struct attn_task *tk, float *scratch, int64_t s, int64_t h,
		     int64_t row, int64_t pos, const struct attn_span *sp)
{
#if defined(__x86_64__)
	if (tk->ctx->isa != CPU_ISA_SCALAR && tk->a->head_dim % 8 == 0) {
		attn_row_avx2(tk, scratch, s, h, row, pos, sp);
		return;
	}
#endif
	attn_row(tk, scratch, s, h, row, pos, sp);
}

/* Whether attn_group_avx512() runs the groups. */
static bool group_kernel(const struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
#if defined(__x86_64__)
	return ctx->attn_group && ctx->isa == CPU_ISA_AVX512 && a->head_dim % 16 == 0;
#else
	(void)ctx, (void)a;
	return false;
#endif
}

/* Whether attn_rows_avx2() runs the groups (where the AVX-512 kernel does
 * not). */
static bool rows8_kernel(const struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
#if defined(__x86_64__)
	return ctx->attn_group && ctx->isa != CPU_ISA_SCALAR && a->head_dim % 8 == 0 &&
	       !group_kernel(ctx, a);
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
		       int64_t row, int64_t pos, bool half, const struct attn_span *sp)
{
#if defined(__x86_64__)
	if (group_kernel(tk->ctx, tk->a)) {
		attn_group_avx512(tk, scratch, s, h0, (int)tk->group, row, pos, half, sp);
		return;
	}
	if (rows8_kernel(tk->ctx, tk->a)) {
		attn_rows_avx2(tk, scratch, s, h0, (int)tk->group, row, pos, 1, half, sp);
		return;
	}
	if (half) {
		for (int64_t h = h0; h < h0 + tk->group; h++)
			attn_row_avx2_f16(tk, scratch, s, h, row, pos, sp);
		return;
	}
#endif
	(void)half;
	for (int64_t h = h0; h < h0 + tk->group; h++)
		attn_one(tk, scratch, s, h, row, pos, sp);
}

/*
 * Query rows row0 .. row0 + R - 1 at positions pos0 on, heads h0 .. h0 +
 * group - 1: with the grouped kernel, runs of up to ROWS_MAX(group) rows
 * (evenly cut) share each cache row (attn_rows_avx512()); a lone row and
 * a part (sp) take attn_heads(). The bits are the same either way.
 */
static void attn_run(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0,
		     int64_t row0, int64_t pos0, int64_t R, bool half, const struct attn_span *sp)
{
#if defined(__x86_64__)
	if (!sp && R > 1 && group_kernel(tk->ctx, tk->a)) {
		const int64_t step = PAIRS_MAX / tk->group, runs = (R + step - 1) / step;

		for (int64_t k = 0; k < runs; k++) {
			int64_t i = R * k / runs, n = R * (k + 1) / runs - i;

			if (n == 1)
				attn_heads(tk, scratch, s, h0, row0 + i, pos0 + i, half, NULL);
			else
				attn_rows_avx512(tk, scratch, s, h0, (int)tk->group, row0 + i,
						 pos0 + i, (int)n, half);
		}
		return;
	}
	if (!sp && R > 1 && rows8_kernel(tk->ctx, tk->a)) {
		const int64_t step = PAIRS_256 / tk->group, runs = (R + step - 1) / step;

		for (int64_t k = 0; k < runs; k++) {
			int64_t i = R * k / runs, n = R * (k + 1) / runs - i;

			attn_rows_avx2(tk, scratch, s, h0, (int)tk->group, row0 + i, pos0 + i,
				       (int)n, half, NULL);
		}
		return;
	}
#endif
	for (int64_t i = 0; i < R; i++)
		attn_heads(tk, scratch, s, h0, row0 + i, pos0 + i, half, sp);
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
			int64_t q0, int64_t p0, int64_t r0, int64_t r1, const struct attn_span *sp)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, kvh = h0 / (a->n_heads / a->n_kv_heads);
	const size_t head_bytes = tk->row_bytes / (size_t)a->n_kv_heads;
	float *sk = scratch + PAIRS_MAX * (hd + tk->max_kv + 16), *sv = sk + tk->max_kv * hd;
	int64_t lo = 0, hi = p0 + r1 - 1;
	static const int32_t block0 = 0;
	struct loom_attention_args st = *a;
	struct attn_task tk2 = *tk;

	if (a->window > 0 && p0 + r0 - a->window + 1 > 0)
		lo = p0 + r0 - a->window + 1;
	if (sp) /* one row's part: only its positions */
		lo = sp->t0, hi = sp->t1;
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
	attn_run(&tk2, scratch, 0, h0, q0 + r0, p0 + r0, r1 - r0, false, sp);
}

/* Whether the cache is decoded into f32 staging first (attn_rows_q()). */
static bool staged(const struct attn_task *tk)
{
	return tk->type != LOOM_TYPE_F32 && !(tk->type == LOOM_TYPE_F16 && reads_f16(tk));
}

/*
 * Sequence s's decode row, heads h0 .. h0 + group - 1, from its parts'
 * partial results, in part order: with M the largest part maximum and
 * w_p = exp(max_p - M), out = sum_p w_p acc_p / sum_p w_p sum_p (in
 * double; w in the thread's scratch).
 */
static void attn_merge(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t hd = a->head_dim, P = tk->parts[s], ps = ATTN_PSTRIDE(hd);
	const int64_t row = a->q_start[s], step = a->n_heads * ps;
	double *w = (double *)scratch;

	for (int64_t h = h0; h < h0 + tk->group; h++) {
		const float *p0 = tk->partial + tk->chunk_start[s] * step + h * ps;
		float *out = a->out + row * a->out_stride + h * hd;
		float mx = -INFINITY;
		double total = 0.0;

		for (int64_t p = 0; p < P; p++)
			if (p0[p * step + hd] > mx)
				mx = p0[p * step + hd];
		for (int64_t p = 0; p < P; p++) {
			double sum;

			memcpy(&sum, p0 + p * step + hd + 2, sizeof(sum));
			w[p] = exp((double)p0[p * step + hd] - (double)mx);
			total += w[p] * sum;
		}
		if (LOOM_ATTN_SINKS(a)) /* ABI 1.8 */
			total += expf(LOOM_ATTN_SINKS(a)[h] - mx);
		for (int64_t i = 0; i < hd; i++) {
			double v = 0.0;

			for (int64_t p = 0; p < P; p++)
				v += w[p] * (double)p0[p * step + i];
			out[i] = (float)(v / total);
		}
	}
}

/* The sequence whose chunks hold chunk c. */
static int64_t chunk_seq(const struct attn_task *tk, int64_t c)
{
	int64_t lo = 0, hi = tk->a->n_seqs;

	while (hi - lo > 1) {
		int64_t mid = (lo + hi) / 2;

		if (tk->chunk_start[mid] <= c)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* In sp, the positions (t0 .. t1) of chunk c, a part of sequence s's
 * split decode row, and where its partial results go. */
static void part_span(const struct attn_task *tk, int64_t s, int64_t c, struct attn_span *sp)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t P = tk->parts[s], p = c - tk->chunk_start[s];
	int64_t lo, hi, len;

	attn_range(a, a->kv_len[s] - 1, NULL, &lo, &hi);
	len = hi + 1 - lo;
	sp->t0 = lo + len * p / P;
	sp->t1 = lo + len * (p + 1) / P - 1;
	sp->part = tk->partial + c * a->n_heads * ATTN_PSTRIDE(a->head_dim);
}

/* The merge of each head group of sequence s whose last part this was. */
static void part_done(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0)
{
	const struct loom_attention_args *a = tk->a;

	/* the fetch-add orders this part's stores before the merger's loads */
	if (atomic_fetch_add(&tk->merged[s * (a->n_heads / tk->group) + h0 / tk->group], 1) + 1 ==
	    tk->parts[s])
		attn_merge(tk, scratch, s, h0);
}

/* Part c - chunk_start[s] of sequence s's decode row, heads h0 ..; the
 * group's last part to finish merges them. */
static void attn_part(const struct attn_task *tk, float *scratch, int64_t s, int64_t h0, int64_t c)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t row = a->q_start[s], pos = a->kv_len[s] - 1;
	struct attn_span sp;

	part_span(tk, s, c, &sp);
	if (staged(tk))
		attn_rows_q(tk, scratch, s, h0, row, pos, 0, 1, &sp);
	else
		attn_heads(tk, scratch, s, h0, row, pos, tk->type == LOOM_TYPE_F16, &sp);
	part_done(tk, scratch, s, h0);
}

#if defined(__x86_64__)
/* Whether part_groups() runs the split decode parts. */
static bool part_walk(const struct attn_task *tk)
{
	return tk->ctx->attn_walk &&
	       (group_kernel(tk->ctx, tk->a) || rows8_kernel(tk->ctx, tk->a)) && !staged(tk) &&
	       tk->a->n_heads / tk->group > 1;
}

/* The cache rows of up to 16 positions from t on (up to last) as runs of
 * whole rows, each contiguous (a block's positions are): the first two
 * runs, which are all of them where blocks hold 16 positions or more (with
 * smaller blocks the rest go unasked: a prefetch changes no result). */
struct rows16 {
	const char *p[2];
	size_t n[2];
};

static inline void rows16_at(const struct loom_attention_args *a, const char *cache, size_t es,
			     int64_t s, int64_t t, int64_t last, struct rows16 *rs)
{
	const size_t row = (size_t)(a->n_kv_heads * a->head_dim) * es;
	const int64_t end = t + 15 < last ? t + 15 : last;

	rs->n[0] = rs->n[1] = 0;
	for (int k = 0; k < 2 && t <= end; k++) {
		int64_t m, e = kv_run_off(a, s, t, 0, end, &m);

		rs->p[k] = cache + (size_t)e * es;
		rs->n[k] = (size_t)m * row;
		t += m;
	}
}

/* Head group gi's share (of G) of the rows in rs, asked for ahead of the
 * walk that reads them. */
static inline void pf_share(const struct rows16 *rs, int64_t gi, int64_t G)
{
	const size_t all = rs->n[0] + rs->n[1];
	size_t o = all * (size_t)gi / (size_t)G / 64 * 64;
	const size_t end = all * (size_t)(gi + 1) / (size_t)G;

	for (; o < end; o += 64)
		__builtin_prefetch(o < rs->n[0] ? rs->p[0] + o : rs->p[1] + (o - rs->n[0]), 0, 3);
}

/*
 * One pass of part_groups_t() over the part sp (with `values` the V sums
 * into acc, else the scores into sc and maxima into mxv; head h's at h *
 * tk->max_kv): 16 positions at a time, every head group's grouped-kernel
 * pass over the block in turn, the next block's whole rows asked for a
 * share per group meanwhile.
 */
TGT_512 CPU_INLINE void part_blocks(const struct attn_task *tk, int64_t s,
				    const struct attn_span *sp, int n, int64_t hd, bool half,
				    bool values, float *sc, __m512 *mxv, float *acc)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t G = a->n_heads / n, per_kv = a->n_heads / a->n_kv_heads, Ls = tk->max_kv;
	const float *q = a->q + a->q_start[s] * a->q_stride;
	const char *cache = (const char *)(values ? a->vcache : a->kcache);
	const size_t es = half ? 2 : 4;

	for (int64_t tb = sp->t0; tb <= sp->t1; tb += 16) {
		const int64_t te = tb + 15 < sp->t1 ? tb + 15 : sp->t1;
		struct rows16 next;

		rows16_at(a, cache, es, s, tb + 16, sp->t1, &next);
		for (int64_t gi = 0; gi < G; gi++) {
			const int64_t h0 = gi * n;
			float *w = sc + h0 * Ls + (tb - sp->t0);

			pf_share(&next, gi, G);
			if (!values) {
				group_scores(tk, s, h0 / per_kv, n, tb, te, half, q + h0 * a->head_dim,
					     w, mxv + h0, hd, false);
				continue;
			}
			for (int64_t d0 = 0; d0 < hd; d0 += 64)
				group_values(tk, s, h0 / per_kv, n, tb, te, d0, half, w,
					     acc + h0 * a->head_dim,
					     hd - d0 >= 64 ? 4 : (int)(hd - d0) / 16, tb > sp->t0,
					     false);
		}
	}
}

/*
 * Part c of a split decode row, every head group at once: the part's
 * positions in blocks of 16, each block's K rows read by every group in
 * turn (and the next block's whole rows asked for meanwhile, a share per
 * group), so the cache streams through once instead of once per group
 * (each group's walk read a slice of every row: 11 GB/s from DRAM where
 * a plain stream reads 40); then each group's softmax, and the V rows the
 * same way, each group's sums carried from block to block in scratch. A
 * head's arithmetic is attn_group_avx512_t()'s: group_scores() and
 * group_values() over the same keys in the same order (a 16-key block
 * starts at the part's first position either way), so the bits are the
 * per-group walk's (LOOM_CPU_ATTN_WALK=0; backend_attn_group holds them
 * to it).
 */
TGT_512 CPU_INLINE void part_groups_t(const struct attn_task *tk, float *scratch, int64_t s,
				      int64_t c, bool half, int n, int64_t hd)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t row = a->q_start[s];
	struct attn_span sp;
	struct attn_task tk2 = *tk;
	int64_t Ls; /* the part's length rounded up to 16 (parts are under 2 * ATTN_PART) */
	/* scratch (cpu_attention() reserves n_heads * (head_dim + 2 *
	 * ATTN_PART + 20) floats): each head's V sums, scores, running
	 * maxima, maximum and sum */
	float *acc = scratch, *sc, *mx;
	double *sum;
	__m512 *mxv;

	part_span(tk, s, c, &sp);
	Ls = (sp.t1 - sp.t0 + 16) / 16 * 16;
	tk2.max_kv = Ls; /* a head's scores at h * Ls */
	sc = acc + a->n_heads * a->head_dim;
	mxv = (__m512 *)(sc + a->n_heads * Ls);
	mx = (float *)(mxv + a->n_heads);
	sum = (double *)(mx + (a->n_heads + 1) / 2 * 2);
	for (int64_t h = 0; h < a->n_heads; h++)
		mxv[h] = _mm512_set1_ps(-INFINITY);
	part_blocks(&tk2, s, &sp, n, hd, half, false, sc, mxv, acc);
	for (int64_t h0 = 0; h0 < a->n_heads; h0 += n) {
		for (int g = 0; g < n; g++)
			mx[h0 + g] = _mm512_reduce_max_ps(mxv[h0 + g]);
		pairs_softmax(&tk2, n, GROUP_MAX, 1, &sp.t0, &sp.t1, sc + h0 * Ls, mx + h0, sum + h0);
	}
	part_blocks(&tk2, s, &sp, n, hd, half, true, sc, mxv, acc);
	for (int64_t h = 0; h < a->n_heads; h++)
		attn_put(a, &sp, row, h, acc + h * a->head_dim, mx[h], sum[h]);
	for (int64_t h0 = 0; h0 < a->n_heads; h0 += n)
		part_done(tk, scratch, s, h0);
}

/* One copy per group size, cache type and common head_dim. */
#define PART_GROUPS_N(N)                                                                   \
	TGT_512 static void part_groups_##N(const struct attn_task *tk, float *scratch,       \
					    int64_t s, int64_t c, bool half)                  \
	{                                                                                  \
		const int64_t hd = tk->a->head_dim;                                        \
		if (half && hd == 64)                                                      \
			part_groups_t(tk, scratch, s, c, true, N, 64);                     \
		else if (half && hd == 128)                                                \
			part_groups_t(tk, scratch, s, c, true, N, 128);                    \
		else if (half)                                                             \
			part_groups_t(tk, scratch, s, c, true, N, hd);                     \
		else                                                                       \
			part_groups_t(tk, scratch, s, c, false, N, hd);                    \
	}
PART_GROUPS_N(1)
PART_GROUPS_N(2)
PART_GROUPS_N(3)
PART_GROUPS_N(4)

/*
 * part_blocks() with the AVX2 kernels (the lone-row walk of
 * attn_rows_avx2_t(): rows_scores8() and values_pass8() over each block,
 * the maxima carried in mxv, the V sums in acc).
 */
CPU_TGT_AVX2 CPU_INLINE void part_blocks8(const struct attn_task *tk, int64_t s,
					  const struct attn_span *sp, int n, bool half, bool values,
					  float *sc, __m256 *mxv, float *acc)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t G = a->n_heads / n, per_kv = a->n_heads / a->n_kv_heads, Ls = tk->max_kv;
	const int64_t hd = a->head_dim;
	const float *q = a->q + a->q_start[s] * a->q_stride;
	const char *cache = (const char *)(values ? a->vcache : a->kcache);
	const size_t es = half ? 2 : 4;

	for (int64_t tb = sp->t0; tb <= sp->t1; tb += 16) {
		int64_t lo = tb, hi = tb + 15 < sp->t1 ? tb + 15 : sp->t1;
		const struct vpass vp = { 0, lo, hi, lo, hi };
		struct rows16 next;

		rows16_at(a, cache, es, s, tb + 16, sp->t1, &next);
		for (int64_t gi = 0; gi < G; gi++) {
			const int64_t h0 = gi * n, kvh = h0 / per_kv;
			float *w = sc + h0 * Ls + (tb - sp->t0);

			pf_share(&next, gi, G);
			if (!values) {
				const float *qp[GROUP_MAX];
				__m256 m[GROUP_MAX];

				for (int g = 0; g < n; g++)
					qp[g] = q + (h0 + g) * hd;
				rows_scores8(tk, s, kvh, n, 1, 1, &lo, &hi, qp, half, w, m, false);
				for (int g = 0; g < n; g++)
					/* (the earlier of equal maxima kept, as score_pair8()) */
					mxv[h0 + g] = _mm256_max_ps(m[g], mxv[h0 + g]);
				continue;
			}
			values_dims8(tk, s, kvh, n, 1, false, &vp, &lo, &hi, w, false, half,
				     acc + h0 * hd, tb > sp->t0);
		}
	}
}

/*
 * part_groups_t() on AVX2: part c of a split decode row, every head group
 * walking its positions together, 16 at a time. A head's arithmetic is
 * attn_rows_avx2_t()'s for one row: its scores in 8-key steps from the
 * part's first position (the blocks start there too), the same softmax,
 * its V sums in position order, so the bits are the per-group walk's
 * (backend_attn_group holds them to it).
 */
CPU_TGT_AVX2 CPU_INLINE void part_groups8_t(const struct attn_task *tk, float *scratch, int64_t s,
					    int64_t c, bool half, int n)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t row = a->q_start[s];
	struct attn_span sp;
	struct attn_task tk2 = *tk;
	int64_t Ls;
	/* scratch as part_groups_t()'s, the maxima 8 lanes a head */
	float *acc = scratch, *sc, *mx;
	double *sum;
	__m256 *mxv;

	part_span(tk, s, c, &sp);
	Ls = (sp.t1 - sp.t0 + 16) / 16 * 16;
	tk2.max_kv = Ls;
	sc = acc + a->n_heads * a->head_dim;
	mxv = (__m256 *)(sc + a->n_heads * Ls);
	mx = (float *)(mxv + a->n_heads);
	sum = (double *)(mx + (a->n_heads + 1) / 2 * 2);
	for (int64_t h = 0; h < a->n_heads; h++)
		mxv[h] = _mm256_set1_ps(-INFINITY);
	part_blocks8(&tk2, s, &sp, n, half, false, sc, mxv, acc);
	for (int64_t h0 = 0; h0 < a->n_heads; h0 += n) {
		for (int g = 0; g < n; g++)
			mx[h0 + g] = hmax8(mxv[h0 + g]);
		pairs_softmax(&tk2, n, n, 1, &sp.t0, &sp.t1, sc + h0 * Ls, mx + h0, sum + h0);
	}
	part_blocks8(&tk2, s, &sp, n, half, true, sc, mxv, acc);
	for (int64_t h = 0; h < a->n_heads; h++)
		attn_put(a, &sp, row, h, acc + h * a->head_dim, mx[h], sum[h]);
	for (int64_t h0 = 0; h0 < a->n_heads; h0 += n)
		part_done(tk, scratch, s, h0);
}

#define PART_GROUPS8_N(N)                                                                  \
	CPU_TGT_AVX2 static void part_groups8_##N(const struct attn_task *tk, float *scratch, \
						  int64_t s, int64_t c, bool half)            \
	{                                                                                  \
		if (half)                                                                  \
			part_groups8_t(tk, scratch, s, c, true, N);                        \
		else                                                                       \
			part_groups8_t(tk, scratch, s, c, false, N);                       \
	}
PART_GROUPS8_N(1)
PART_GROUPS8_N(2)
PART_GROUPS8_N(3)
PART_GROUPS8_N(4)

static void part_groups(const struct attn_task *tk, float *scratch, int64_t s, int64_t c)
{
	const bool half = tk->type == LOOM_TYPE_F16;

	if (!group_kernel(tk->ctx, tk->a)) {
		switch (tk->group) {
		case 1: part_groups8_1(tk, scratch, s, c, half); break;
		case 2: part_groups8_2(tk, scratch, s, c, half); break;
		case 3: part_groups8_3(tk, scratch, s, c, half); break;
		default: part_groups8_4(tk, scratch, s, c, half); break;
		}
		return;
	}
	switch (tk->group) {
	case 1: part_groups_1(tk, scratch, s, c, half); break;
	case 2: part_groups_2(tk, scratch, s, c, half); break;
	case 3: part_groups_3(tk, scratch, s, c, half); break;
	default: part_groups_4(tk, scratch, s, c, half); break;
	}
}
#endif

static void attn_unit(const struct attn_task *tk, float *scratch, int64_t u)
{
	const struct loom_attention_args *a = tk->a;
	const int64_t n_groups = a->n_heads / tk->group;
	int64_t h0 = u % n_groups * tk->group, c = u / n_groups;
	int64_t s = chunk_seq(tk, c);
	int64_t q0 = a->q_start[s], q_len = a->q_start[s + 1] - q0;
	int64_t r0 = (c - tk->chunk_start[s]) * ROWS_PER_UNIT;
	int64_t r1 = r0 + ROWS_PER_UNIT < q_len ? r0 + ROWS_PER_UNIT : q_len;

	if (tk->parts && tk->parts[s]) {
		attn_part(tk, scratch, s, h0, c);
		return;
	}
	if (staged(tk)) {
		attn_rows_q(tk, scratch, s, h0, q0, a->kv_len[s] - q_len, r0, r1, NULL);
		return;
	}
	attn_run(tk, scratch, s, h0, q0 + r0, a->kv_len[s] - q_len + r0, r1 - r0,
		 tk->type == LOOM_TYPE_F16, NULL);
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
#if defined(__x86_64__)
	/* a chunk that is one split part (chunks are not capped): its groups
	 * at once */
	if (tk->parts && tk->walk) {
		int64_t s = chunk_seq(tk, c);

		if (tk->parts[s]) {
			part_groups(tk, scratch, s, c);
			return;
		}
	}
#endif
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

	if (!group_kernel(ctx, a) && !rows8_kernel(ctx, a) &&
	    (type == LOOM_TYPE_F32 || type == LOOM_TYPE_F16))
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

/* Parts of sequence s's row if it is a decode row (fast mode) with at
 * least 2 * ATTN_PART visible positions, else 0. */
static int64_t split_parts(const struct loom_backend_ctx *ctx,
			   const struct loom_attention_args *a, int64_t s)
{
	int64_t lo, hi;

	if (ctx->exact || a->q_start[s + 1] - a->q_start[s] != 1)
		return 0;
	attn_range(a, a->kv_len[s] - 1, NULL, &lo, &hi);
	return (hi + 1 - lo) / ATTN_PART >= 2 ? (hi + 1 - lo) / ATTN_PART : 0;
}

/* The split's buffers (tk->parts set): partials for n_chunks chunks of
 * every head, and the (sequence, group) counters, zeroed. */
static int split_alloc(struct attn_task *tk, int64_t n_chunks)
{
	const struct loom_attention_args *a = tk->a;
	int64_t n;

	if (__builtin_mul_overflow(n_chunks, a->n_heads * ATTN_PSTRIDE(a->head_dim), &n) ||
	    n > LOOM_CHECK_LIMIT)
		return LOOM_ERR_NOMEM;
	tk->partial = malloc((size_t)n * sizeof(float));
	tk->merged = calloc((size_t)(a->n_seqs * (a->n_heads / tk->group)), sizeof(atomic_int));
	return tk->partial && tk->merged ? LOOM_OK : LOOM_ERR_NOMEM;
}

/*
 * A call with a parent table (token trees, ABI 1.8) as one without: each
 * query row becomes a sequence of its own with a block size of 1 whose
 * "blocks" are the cache slots of the keys it sees, in ascending order
 * (loom_attention_keys()). The kernels then walk exactly the keys a
 * causal row at the same position over the same values walks, in the
 * same order, so a tree row gets a decode row's bits.
 */
static int attn_tree(struct loom_backend_ctx *ctx, const struct loom_attention_args *a,
		     int64_t max_kv)
{
	const int64_t rows = a->q_start[a->n_seqs];
	struct loom_attention_args f = *a;
	int32_t *tab, *qs, *kl, *keys;
	int64_t s, i, bytes;
	int rc;

	if (!loom_check_attention_parents(a, a->q_start, a->parent))
		return LOOM_ERR_INVALID;
	if (__builtin_mul_overflow(rows, max_kv + 2, &bytes) || bytes > LOOM_CHECK_LIMIT / 4)
		return LOOM_ERR_NOMEM;
	tab = malloc(sizeof(int32_t) * (size_t)(rows * max_kv + 2 * rows + 1 + max_kv));
	if (!tab)
		return LOOM_ERR_NOMEM;
	qs = tab + rows * max_kv;
	kl = qs + rows + 1;
	keys = kl + rows;
	for (s = 0; s < a->n_seqs; s++) {
		for (i = 0; i < a->q_start[s + 1] - a->q_start[s]; i++) {
			int64_t r = a->q_start[s] + i, pos;
			int64_t n = loom_attention_keys(a, a->q_start, a->kv_len, a->parent, s, i,
							keys, &pos);

			for (int64_t t = 0; t < n; t++) {
				int64_t blk = a->block_table[s * a->max_blocks + keys[t] / a->block_size];

				tab[r * max_kv + t] = (int32_t)(blk * a->block_size +
								keys[t] % a->block_size);
			}
			qs[r] = (int32_t)r;
			kl[r] = (int32_t)n;
		}
	}
	qs[rows] = (int32_t)rows;
	f.n_seqs = rows;
	f.q_start = qs;
	f.kv_len = kl;
	f.block_table = tab;
	f.block_size = 1;
	f.max_blocks = max_kv;
	f.window = 0; /* the keys are already cut to it */
	f.parent = NULL;
	rc = cpu_attention(ctx, &f);
	free(tab);
	return rc;
}

int cpu_attention(struct loom_backend_ctx *ctx, const struct loom_attention_args *a)
{
	struct attn_task tk;
	int64_t max_kv, *chunks, *parts, need, stage = 0;
	bool split = false;
	double work = 0;
	int err;

	if (!ctx)
		return LOOM_ERR_INVALID;
	err = attn_check(a, &max_kv);
	if (err)
		return err < 0 ? err : LOOM_OK;
	if (ctx->rg.open) {
		struct cpu_call c = { .op = CPU_CALL_ATTENTION };

		cpu_region_copy_args(&c.u.attention, sizeof(c.u.attention), a);
		return cpu_region_record(ctx, &c);
	}
	if (LOOM_ATTN_PARENT(a))
		return attn_tree(ctx, a, max_kv);
	/* acc[head_dim] and scores[max_kv + 16] (the many-row kernel's last
	 * 16-key block) for each (row, head) pair of a unit; for a typed
	 * cache also f32 staging of one KV head's keys and values,
	 * [max_kv][head_dim] each */
	if (__builtin_add_overflow(a->head_dim, max_kv + 16, &need) ||
	    __builtin_mul_overflow(need, PAIRS_MAX, &need))
		return LOOM_ERR_NOMEM;
	if (LOOM_KV_TYPE(a, struct loom_attention_args) != LOOM_TYPE_F32 &&
	    (__builtin_mul_overflow(max_kv, 2 * a->head_dim, &stage) ||
	     __builtin_add_overflow(need, stage, &need)))
		return LOOM_ERR_NOMEM;
	if (need > LOOM_CHECK_LIMIT || cpu_scratch_reserve(ctx, (size_t)need))
		return LOOM_ERR_NOMEM;
	chunks = malloc((size_t)(2 * a->n_seqs + 1) * sizeof(*chunks));
	if (!chunks)
		return LOOM_ERR_NOMEM;
	parts = chunks + a->n_seqs + 1;
	chunks[0] = 0;
	for (int64_t s = 0; s < a->n_seqs; s++) {
		int64_t q_len = a->q_start[s + 1] - a->q_start[s];

		/* a split decode row: a chunk per part */
		parts[s] = split_parts(ctx, a, s);
		split |= parts[s] > 0;
		chunks[s + 1] = chunks[s] + (parts[s] ? parts[s] :
					     (q_len + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT);
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
	/* with split rows, a pool chunk takes every head group of a part
	 * (units are part-major), so that the cache rows one group's walk
	 * asks for whole (pf_row()) are read by the same core next; the
	 * parts are enough work to spread */
	tk.n_chunks = split ? chunks[a->n_seqs] : tk.n_units;
	if (tk.n_chunks > ATTN_MAX_CHUNKS)
		tk.n_chunks = ATTN_MAX_CHUNKS;
	tk.parts = split ? parts : NULL;
	tk.partial = NULL;
	tk.merged = NULL;
	tk.walk = false;
	err = split ? split_alloc(&tk, chunks[a->n_seqs]) : LOOM_OK;
#if defined(__x86_64__)
	/* split parts walked by every head group at once, where each chunk
	 * is one part and the scratch takes the whole part (else per group) */
	if (err == LOOM_OK && split && tk.n_chunks == chunks[a->n_seqs] && part_walk(&tk)) {
		int64_t pw;

		tk.walk = !__builtin_mul_overflow(a->n_heads, a->head_dim + 2 * ATTN_PART + 20,
						  &pw) &&
			  pw <= LOOM_CHECK_LIMIT && cpu_scratch_reserve(ctx, (size_t)pw) == LOOM_OK;
	}
#endif
	work *= (double)a->n_heads * (double)a->head_dim * 2;
	if (err == LOOM_OK)
		cpu_pool_run(&ctx->pool, attn_task_run, &tk, tk.n_chunks,
			     work >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1);
	free(tk.partial);
	free(tk.merged);
	free(chunks);
	return err;
}
