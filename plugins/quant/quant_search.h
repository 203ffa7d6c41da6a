/*
 * The importance-weighted scale search behind every integer format's
 * from_float_weighted (header only, static inline; see loom/plugin.h).
 *
 * The error of a block is E = sum_i w_i (x_i - v_i)^2, v_i the value the
 * block decodes to and w_i >= 0 the importance of element i (NULL: 1).
 *
 *   qs_symmetric: v = d * q, q in [qmin, qmax]. Candidate inverse scales
 *     (t + k/10) / mx, mx the value of largest magnitude and t either end
 *     of the grid, k = -10..10; each rounds x, and the best d for those q
 *     is the weighted least-squares one, sum w x q / sum w q^2. The
 *     candidate that removes the most error (sum w x q)^2 / sum w q^2 wins.
 *   qs_affine: v = d * q + m, q in [0, levels]; candidates (levels +
 *     k/10) / (max - min), then for each q the weighted least-squares
 *     (d, m) (the 2x2 normal equations), q rounded again with them and
 *     (d, m) refitted once; m <= 0 where the format stores -m (k-quants).
 *
 * qs_blocks runs a format's search over a row of blocks and keeps, per
 * block, the search's block or the round-to-nearest one (from_float's),
 * whichever has the smaller E once decoded by the format's own to_float:
 * the weighted result is never worse than round-to-nearest.
 */
#ifndef LOOM_QUANT_SEARCH_H
#define LOOM_QUANT_SEARCH_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "quant_common.h"

#define QS_STEPS 10 /* candidates k = -QS_STEPS..QS_STEPS a grid end */
#define QS_MAX_BLOCK 256
#define QS_MAX_BYTES 256
#define QS_LANES 8 /* every block length (16, 32, 256) is a multiple */

/* v as the f16 a block stores it. */
static inline float qs_f16(float v)
{
	return quant_f16_to_f32(quant_f32_to_f16(v));
}

/* The importance of element i; negative or NaN counts as 0. */
static inline float qs_w(const float *w, int i)
{
	return !w ? 1.0f : w[i] > 0.0f ? w[i] : 0.0f;
}

/* round(v) clamped to [lo, hi] (halves away from zero); NaN gives lo. */
static inline int qs_round_clamp(float v, int lo, int hi)
{
	/* comparisons, not fminf/fmaxf: those are calls in the hot loop */
	v = v >= (float)lo ? v : (float)lo;
	v = v <= (float)hi ? v : (float)hi;
	return (int)(v + (v < 0.0f ? -0.5f : 0.5f));
}

/* One candidate of qs_symmetric, inverse scale is: the error it removes,
 * (sum w x q)^2 / sum w q^2 (wx[i] = w[i] * x[i]), and its d in *d. */
static inline float qs_sym_try(const float *x, const float *w, const float *wx, int n,
			       int qmin, int qmax, float is, float *d)
{
	/* QS_LANES independent sums (n is a multiple), so the loop vectorizes
	 * without reassociating any one sum */
	float a[QS_LANES] = { 0 }, b[QS_LANES] = { 0 }, sxq = 0.0f, sqq = 0.0f;

	for (int i = 0; i < n; i += QS_LANES) {
		for (int l = 0; l < QS_LANES; l++) {
			float q = (float)qs_round_clamp(x[i + l] * is, qmin, qmax);

			a[l] += wx[i + l] * q;
			b[l] += w[i + l] * q * q;
		}
	}
	for (int l = 0; l < QS_LANES; l++) {
		sxq += a[l];
		sqq += b[l];
	}
	*d = sqq > 0.0f ? sxq / sqq : 0.0f;
	return sqq > 0.0f ? sxq * sxq / sqq : 0.0f;
}

/* q = round(x / d) clamped, for a stored (rounded) d. */
static inline void qs_symmetric_round(const float *x, int n, int qmin, int qmax, float d, int *q)
{
	float id = d != 0.0f ? 1.0f / d : 0.0f;

	for (int i = 0; i < n; i++)
		q[i] = qs_round_clamp(x[i] * id, qmin, qmax);
}

/* Best d (unrounded) for v = d * q, q in [qmin, qmax]; q gets its values. */
static inline float qs_symmetric(const float *x, const float *wt, int n, int qmin, int qmax,
				 int *q)
{
	float amax = 0.0f, mx = 0.0f, best = -1.0f, best_d = 0.0f, best_is = 0.0f;
	float w[QS_MAX_BLOCK], wx[QS_MAX_BLOCK];
	const int ends[2] = { qmin, qmax };

	for (int i = 0; i < n; i++) {
		w[i] = qs_w(wt, i);
		wx[i] = w[i] * x[i];
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			mx = x[i];
		}
	}
	if (amax == 0.0f) {
		memset(q, 0, sizeof(int) * (size_t)n);
		return 0.0f;
	}
	for (int e = 0; e < 2; e++) {
		for (int k = -QS_STEPS; k <= QS_STEPS; k++) {
			float t = (float)ends[e] + 0.1f * (float)k, d, gain;

			if (t == 0.0f)
				continue;
			gain = qs_sym_try(x, w, wx, n, qmin, qmax, t / mx, &d);
			if (gain > best) {
				best = gain;
				best_d = d;
				best_is = t / mx;
			}
		}
	}
	/* refine: round for the best d, refit d, while that removes more */
	for (int it = 0; it < 4 && best_d != 0.0f; it++) {
		float d, gain = qs_sym_try(x, w, wx, n, qmin, qmax, 1.0f / best_d, &d);

		if (!(gain > best))
			break;
		best = gain;
		best_is = 1.0f / best_d;
		best_d = d;
	}
	for (int i = 0; i < n; i++)
		q[i] = qs_round_clamp(x[i] * best_is, qmin, qmax);
	return best_d;
}

/* The weighted least-squares (d, m) for fixed q; m <= 0 when nonpos. */
static inline void qs_affine_fit(const float *x, const float *w, int n, const int *q,
				 bool nonpos, float *d, float *m)
{
	float sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0, det;

	for (int i = 0; i < n; i++) {
		float wq = w[i] * (float)q[i];

		sw += w[i];
		sq += wq;
		sqq += wq * (float)q[i];
		sx += w[i] * x[i];
		sqx += wq * x[i];
	}
	det = sqq * sw - sq * sq;
	if (det > 0.0f) {
		*d = (sw * sqx - sq * sx) / det;
		*m = (sqq * sx - sq * sqx) / det;
	} else {
		*d = sqq > 0.0f ? sqx / sqq : 0.0f;
		*m = 0.0f;
	}
	if (nonpos && *m > 0.0f) {
		*m = 0.0f;
		*d = sqq > 0.0f ? sqx / sqq : 0.0f;
	}
}

static inline float qs_affine_err(const float *x, const float *w, int n, const int *q,
				  float d, float m)
{
	float e = 0.0f;

	for (int i = 0; i < n; i++) {
		float r = x[i] - (d * (float)q[i] + m);

		e += w[i] * r * r;
	}
	return e;
}

static inline void qs_affine_round(const float *x, int n, int levels, float d, float m, int *q)
{
	float id = d > 0.0f ? 1.0f / d : 0.0f;

	for (int i = 0; i < n; i++)
		q[i] = qs_round_clamp((x[i] - m) * id, 0, levels);
}

/* Best (d, m) for v = d * q + m, q in [0, levels], d >= 0; q gets them. */
static inline void qs_affine(const float *x, const float *wt, int n, int levels, bool nonpos,
			     int *q, float *d, float *m)
{
	float mn = x[0], mx = x[0], best = INFINITY, w[QS_MAX_BLOCK];
	int tq[QS_MAX_BLOCK];

	for (int i = 0; i < n; i++) {
		w[i] = qs_w(wt, i);
		mn = fminf(mn, x[i]);
		mx = fmaxf(mx, x[i]);
	}
	if (nonpos)
		mn = fminf(mn, 0.0f);
	*d = 0.0f;
	*m = mn;
	memset(q, 0, sizeof(int) * (size_t)n);
	if (!(mx > mn))
		return;
	for (int k = -QS_STEPS; k <= QS_STEPS; k++) {
		float is = ((float)levels + 0.1f * (float)k) / (mx - mn), td = 0.0f, tm = 0.0f, e;

		for (int i = 0; i < n; i++)
			tq[i] = qs_round_clamp((x[i] - mn) * is, 0, levels);
		for (int it = 0; it < 2; it++) {
			qs_affine_fit(x, w, n, tq, nonpos, &td, &tm);
			if (!(td > 0.0f))
				break;
			qs_affine_round(x, n, levels, td, tm, tq);
		}
		if (!(td > 0.0f))
			continue;
		e = qs_affine_err(x, w, n, tq, td, tm);
		if (e < best) {
			best = e;
			*d = td;
			*m = tm;
			memcpy(q, tq, sizeof(int) * (size_t)n);
		}
	}
}

/*
 * Integer scales of a super-block: s[0..n) (float, the groups' best
 * scales or mins) become d * l[g], l in [lo, hi], d stored as f16. Each
 * group's error grows by W[g] (s[g] - d l[g])^2 (W: its sum of w q^2, or
 * of w for a min), so d is searched as qs_symmetric searches a block's
 * scale: candidates (hi + k/10) / max|s|, the weighted least-squares d
 * of each, the smallest error after rounding d to f16. Returns that d.
 */
static inline float qs_scale_ints(const float *s, const float *W, int n, int lo, int hi, int *l)
{
	float amax = 0.0f, best = INFINITY, best_d = 0.0f;

	for (int g = 0; g < n; g++)
		amax = fmaxf(amax, fabsf(s[g]));
	memset(l, 0, sizeof(int) * (size_t)n);
	if (amax == 0.0f)
		return 0.0f;
	for (int k = -QS_STEPS; k <= QS_STEPS; k++) {
		float is = ((float)hi + 0.1f * (float)k) / amax, num = 0.0f, den = 0.0f, d, e = 0.0f;

		for (int g = 0; g < n; g++) {
			float q = (float)qs_round_clamp(s[g] * is, lo, hi);

			num += W[g] * s[g] * q;
			den += W[g] * q * q;
		}
		if (!(den > 0.0f))
			continue;
		d = qs_f16(num / den);
		if (!(d > 0.0f))
			continue;
		for (int g = 0; g < n; g++) {
			float r = s[g] - d * (float)qs_round_clamp(s[g] / d, lo, hi);

			e += W[g] * r * r;
		}
		if (e < best) {
			best = e;
			best_d = d;
		}
	}
	for (int g = 0; g < n && best_d > 0.0f; g++)
		l[g] = qs_round_clamp(s[g] / best_d, lo, hi);
	return best_d;
}

/* sum w q^2 and sum w over a group (the W of qs_scale_ints). */
static inline void qs_group_weights(const float *wt, const int *q, int n, float *wqq, float *ww)
{
	*wqq = 0.0f;
	*ww = 0.0f;
	for (int i = 0; i < n; i++) {
		float w = qs_w(wt, i);

		*wqq += w * (float)q[i] * (float)q[i];
		*ww += w;
	}
}

/* ---- per block: the search's block or round-to-nearest's ---- */

typedef int (*qs_decode_fn)(const void *src, float *dst, int64_t n);

static inline float qs_block_error(qs_decode_fn decode, const void *b, const float *x,
				   const float *w, int n)
{
	float v[QS_MAX_BLOCK], e = 0.0f;

	if (decode(b, v, n))
		return INFINITY;
	for (int i = 0; i < n; i++) {
		float r = x[i] - v[i];

		e += qs_w(w, i) * r * r;
	}
	return e;
}

/* Quantizes n values (checked as from_float does) block by block: rtn
 * (from_float of one block) and search each write a block; the one of
 * smaller weighted error is kept. */
static inline int qs_blocks(const float *src, void *dst, int64_t n, const float *w,
			    uint32_t block, uint32_t bytes,
			    int (*rtn)(const float *, void *, int64_t),
			    void (*search)(const float *x, const float *w, uint8_t *b),
			    qs_decode_fn decode)
{
	uint8_t cand[QS_MAX_BYTES], *b = dst;
	int ret = quant_check_args(src, dst, n, block);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += block, b += bytes) {
		const float *wi = w ? w + i : NULL;

		ret = rtn(src + i, b, block);
		if (ret)
			return ret;
		search(src + i, wi, cand);
		if (qs_block_error(decode, cand, src + i, wi, (int)block) <
		    qs_block_error(decode, b, src + i, wi, (int)block))
			memcpy(b, cand, bytes);
	}
	return LOOM_OK;
}

#endif /* LOOM_QUANT_SEARCH_H */
