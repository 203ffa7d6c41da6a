/* Block grids of the GGUF formats (qgrid.h): a weighted search of each
 * block's scales, then GGUF's layouts to pack the chosen integers. The
 * layouts are the ones plugins/quant documents (q4.c, q5.c, q8.c,
 * kquant.c); the tests decode packed blocks with those plugins. */
#include <math.h>
#include <string.h>

#include "qgrid.h"
#include "../quant/quant_common.h"

/* ---- scale searches on one group of values ---- */

static float f16_round(float v)
{
	return quant_f16_to_f32(quant_f32_to_f16(v));
}

/* v rounded to nearest (halves away from zero) and clamped; NaN gives lo.
 * Inline arithmetic: this runs for every candidate scale of every block. */
static inline int round_clamp(float v, int lo, int hi)
{
	if (!(v > (float)lo))
		return lo;
	if (v >= (float)hi)
		return hi;
	return (int)(v + (v < 0.0f ? -0.5f : 0.5f));
}

static float weight(const float *w, int i)
{
	return w ? w[i] : 1.0f;
}

/* Symmetric grid s * q, q in [-lneg, lpos]: tries inverse scales that put
 * the value of largest magnitude near either end (and a little beyond,
 * clipping it), each followed by the weighted least-squares s for its q;
 * keeps the s of least weighted error. 0 for an all-zero group. */
static float fit_sym(const float *x, const float *w, int n, int lneg, int lpos)
{
	float amax = 0.0f, mx = 0.0f, best_s = 0.0f, best = -1.0f;

	for (int i = 0; i < n; i++)
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			mx = x[i];
		}
	if (amax == 0.0f)
		return 0.0f;
	/* with 64 or more levels a step is under 2 % of the range: a few
	 * candidates around the extremes suffice */
	int k_lo = lneg >= 32 ? -2 : -6, k_hi = lneg >= 32 ? 2 : 10;

	for (int side = 0; side < 2; side++) {
		for (int k = k_lo; k <= k_hi; k++) {
			float target = side ? (float)lpos + 0.1f * (float)k :
				-((float)lneg + 0.1f * (float)k);
			float is = target / mx, sxq = 0.0f, sqq = 0.0f;

			if (target == 0.0f)
				continue;
			for (int i = 0; i < n; i++) {
				float q = (float)round_clamp(x[i] * is, -lneg, lpos);

				sxq += weight(w, i) * x[i] * q;
				sqq += weight(w, i) * q * q;
			}
			/* error = sum w x^2 - sxq^2 / sqq: maximize the last */
			if (sqq > 0.0f && sxq * sxq / sqq > best) {
				best = sxq * sxq / sqq;
				best_s = sxq / sqq;
			}
		}
	}
	return best < 0.0f ? mx / (float)-lneg : best_s;
}

/* Affine grid s * q + m, q in [0, levels], s >= 0; with min_le0 the
 * offset m is at most 0 (k-quants store it as a non-negative min). Tries
 * ranges slightly narrower and wider than [min, max], each followed by the
 * weighted least-squares (s, m) for its q; keeps the best. */
static void fit_affine(const float *x, const float *w, int n, int levels, bool min_le0,
		       float *s_out, float *m_out)
{
	float lo = x[0], hi = x[0], best = INFINITY;

	for (int i = 1; i < n; i++) {
		lo = fminf(lo, x[i]);
		hi = fmaxf(hi, x[i]);
	}
	if (min_le0)
		lo = fminf(lo, 0.0f);
	*s_out = (hi - lo) / (float)levels;
	*m_out = lo;
	if (!(hi > lo))
		return;
	for (int k = -10; k <= 10; k++) {
		float is = ((float)levels + 0.1f * (float)k) / (hi - lo);
		float sw = 0, sq = 0, sqq = 0, sx = 0, sxq = 0, s, m, det, err = 0;

		if (is <= 0.0f)
			continue;
		for (int i = 0; i < n; i++) {
			float wi = weight(w, i), q = (float)round_clamp((x[i] - lo) * is, 0, levels);

			sw += wi; sq += wi * q; sqq += wi * q * q; sx += wi * x[i]; sxq += wi * x[i] * q;
		}
		det = sw * sqq - sq * sq;
		if (!(det > 0.0f))
			continue;
		s = (sw * sxq - sq * sx) / det;
		m = (sqq * sx - sq * sxq) / det;
		if (min_le0 && m > 0.0f) {
			m = 0.0f;
			s = sxq / sqq;
		}
		if (!(s > 0.0f))
			continue;
		for (int i = 0; i < n; i++) {
			float q = (float)round_clamp((x[i] - m) / s, 0, levels), e = s * q + m - x[i];

			err += weight(w, i) * e * e;
		}
		if (err < best) {
			best = err;
			*s_out = s;
			*m_out = m;
		}
	}
}

/* ---- the formats ---- */

static void set_group(struct qgrid *g, int grp, float step, float base)
{
	for (int e = grp * g->group; e < (grp + 1) * g->group; e++) {
		g->step[e] = step;
		g->base[e] = base;
	}
}

/* q4_0, q5_0, q8_0: one f16 scale, symmetric. */
static void fit_sym_block(struct qgrid *g, const float *x, const float *imp)
{
	g->d = f16_round(fit_sym(x, imp, g->n, -g->qlo, g->qhi));
	set_group(g, 0, g->d, 0.0f);
}

/* q4_1, q5_1: f16 scale and f16 offset. */
static void fit_affine_block(struct qgrid *g, const float *x, const float *imp)
{
	float s, m;

	fit_affine(x, imp, g->n, g->qhi, false, &s, &m);
	g->d = f16_round(s);
	g->dmin = f16_round(m);
	set_group(g, 0, g->d, g->dmin);
}

/* q3_K, q6_K: signed integer scales (sc_lo..sc_hi) of one f16 d. */
static void fit_k_signed(struct qgrid *g, const float *x, const float *imp, int sc_lo, int sc_hi)
{
	int ng = g->n / g->group;
	float s[16], smax = 0.0f;

	for (int j = 0; j < ng; j++) {
		s[j] = fit_sym(x + j * g->group, imp ? imp + j * g->group : NULL, g->group,
			       -g->qlo, g->qhi);
		smax = fmaxf(smax, fabsf(s[j]));
	}
	g->d = f16_round(smax / (float)sc_hi);
	for (int j = 0; j < ng; j++) {
		g->sc[j] = g->d > 0.0f ? round_clamp(s[j] / g->d, sc_lo, sc_hi) : 0;
		set_group(g, j, g->d * (float)g->sc[j], 0.0f);
	}
}

/* q2_K, q4_K, q5_K: unsigned integer scales and mins (0..smax) of f16 d
 * and dmin; value = d sc q - dmin m. */
static void fit_k_affine(struct qgrid *g, const float *x, const float *imp, int smax)
{
	int ng = g->n / g->group;
	float s[16], o[16], s_hi = 0.0f, o_hi = 0.0f;

	for (int j = 0; j < ng; j++) {
		float m;

		fit_affine(x + j * g->group, imp ? imp + j * g->group : NULL, g->group, g->qhi,
			   true, &s[j], &m);
		o[j] = -m;
		s_hi = fmaxf(s_hi, s[j]);
		o_hi = fmaxf(o_hi, o[j]);
	}
	g->d = f16_round(s_hi / (float)smax);
	g->dmin = f16_round(o_hi / (float)smax);
	for (int j = 0; j < ng; j++) {
		g->sc[j] = g->d > 0.0f ? round_clamp(s[j] / g->d, 0, smax) : 0;
		g->m[j] = g->dmin > 0.0f ? round_clamp(o[j] / g->dmin, 0, smax) : 0;
		set_group(g, j, g->d * (float)g->sc[j], -(g->dmin * (float)g->m[j]));
	}
}

/* Block geometry of each type: n, group, qlo, qhi; 0 n when unknown. */
static bool geometry(struct qgrid *g, uint32_t type)
{
	static const struct { uint32_t type; int n, group, qlo, qhi; } t[] = {
		{ LOOM_TYPE_Q4_0, 32, 32, -8, 7 },    { LOOM_TYPE_Q4_1, 32, 32, 0, 15 },
		{ LOOM_TYPE_Q5_0, 32, 32, -16, 15 },  { LOOM_TYPE_Q5_1, 32, 32, 0, 31 },
		{ LOOM_TYPE_Q8_0, 32, 32, -128, 127 }, { LOOM_TYPE_Q2_K, 256, 16, 0, 3 },
		{ LOOM_TYPE_Q3_K, 256, 16, -4, 3 },   { LOOM_TYPE_Q4_K, 256, 32, 0, 15 },
		{ LOOM_TYPE_Q5_K, 256, 32, 0, 31 },   { LOOM_TYPE_Q6_K, 256, 16, -32, 31 },
	};

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (t[i].type == type) {
			g->type = type;
			g->n = t[i].n;
			g->group = t[i].group;
			g->qlo = t[i].qlo;
			g->qhi = t[i].qhi;
			return true;
		}
	return false;
}

int qgrid_block_elems(uint32_t type)
{
	struct qgrid g;

	return geometry(&g, type) ? g.n : 0;
}

bool qgrid_fit(struct qgrid *g, uint32_t type, const float *x, const float *imp)
{
	if (!geometry(g, type))
		return false;
	g->d = g->dmin = 0.0f;
	switch (type) {
	case LOOM_TYPE_Q4_0: case LOOM_TYPE_Q5_0: case LOOM_TYPE_Q8_0:
		fit_sym_block(g, x, imp);
		break;
	case LOOM_TYPE_Q4_1: case LOOM_TYPE_Q5_1:
		fit_affine_block(g, x, imp);
		break;
	case LOOM_TYPE_Q3_K:
		fit_k_signed(g, x, imp, -32, 31);
		break;
	case LOOM_TYPE_Q6_K:
		fit_k_signed(g, x, imp, -127, 127);
		break;
	case LOOM_TYPE_Q2_K:
		fit_k_affine(g, x, imp, 15);
		break;
	default: /* q4_K, q5_K */
		fit_k_affine(g, x, imp, 63);
		break;
	}
	return true;
}

/* ---- packing (GGUF layouts) ---- */

/* 32-element formats: nibble byte j holds elements j (low) and j + 16. */
static void pack_nibbles(const int *u, uint8_t *qs)
{
	for (int j = 0; j < 16; j++)
		qs[j] = (uint8_t)((u[j] & 0x0f) | (u[j + 16] & 0x0f) << 4);
}

static void pack_qh32(const int *u, uint8_t *qh)
{
	memset(qh, 0, 4);
	for (int j = 0; j < 32; j++)
		qh[j / 8] |= (uint8_t)(((u[j] >> 4) & 1) << (j % 8));
}

static void pack_32(const struct qgrid *g, const int *q, uint8_t *b)
{
	int u[32];

	for (int j = 0; j < 32; j++)
		u[j] = q[j] - (g->type == LOOM_TYPE_Q4_0 ? -8 : g->type == LOOM_TYPE_Q5_0 ? -16 : 0);
	quant_st_f16(b, g->d);
	switch (g->type) {
	case LOOM_TYPE_Q4_0:
		pack_nibbles(u, b + 2);
		break;
	case LOOM_TYPE_Q4_1:
		quant_st_f16(b + 2, g->dmin);
		pack_nibbles(u, b + 4);
		break;
	case LOOM_TYPE_Q5_0:
		pack_qh32(u, b + 2);
		pack_nibbles(u, b + 6);
		break;
	case LOOM_TYPE_Q5_1:
		quant_st_f16(b + 2, g->dmin);
		pack_qh32(u, b + 4);
		pack_nibbles(u, b + 8);
		break;
	default: /* q8_0 */
		for (int j = 0; j < 32; j++)
			b[2 + j] = (uint8_t)(int8_t)q[j];
	}
}

/* k-quant bit positions (kquant.c's top comment spells them out). */
static int k2_byte(int e) { return 32 * (e / 128) + e % 32; }
static int k2_shift(int e) { return 2 * (e / 32 % 4); }
static int k4_byte(int e) { return 32 * (e / 64) + e % 32; }
static int k4_shift(int e) { return 4 * (e / 32 % 2); }

static void pack_q2_K(const struct qgrid *g, const int *q, uint8_t *b)
{
	memset(b, 0, 84);
	for (int j = 0; j < 16; j++)
		b[j] = (uint8_t)(g->sc[j] | g->m[j] << 4);
	for (int e = 0; e < 256; e++)
		b[16 + k2_byte(e)] |= (uint8_t)(q[e] << k2_shift(e));
	quant_st_f16(b + 80, g->d);
	quant_st_f16(b + 82, g->dmin);
}

static void pack_q3_K(const struct qgrid *g, const int *q, uint8_t *b)
{
	memset(b, 0, 110);
	for (int e = 0; e < 256; e++) {
		int u = q[e] + 4; /* bit 2 is the hmask bit */

		b[e % 32] |= (uint8_t)((u >> 2) << (e / 32));
		b[32 + k2_byte(e)] |= (uint8_t)((u & 3) << k2_shift(e));
	}
	for (int i = 0; i < 16; i++) {
		int u = g->sc[i] + 32;

		b[96 + i % 8] |= (uint8_t)((u & 0x0f) << (4 * (i / 8)));
		b[96 + 8 + i % 4] |= (uint8_t)((u >> 4) << (2 * (i / 4)));
	}
	quant_st_f16(b + 108, g->d);
}

/* q4_K (bytes 144) and q5_K (176, with qh). */
static void pack_k45(const struct qgrid *g, const int *q, uint8_t *b, bool five)
{
	uint8_t *s = b + 4, *qh = b + 16, *qs = five ? b + 48 : b + 16;

	memset(b, 0, five ? 176 : 144);
	quant_st_f16(b, g->d);
	quant_st_f16(b + 2, g->dmin);
	for (int j = 0; j < 8; j++)
		quant_k4_set_scale_min(s, j, g->sc[j], g->m[j]);
	for (int e = 0; e < 256; e++) {
		qs[k4_byte(e)] |= (uint8_t)((q[e] & 0x0f) << k4_shift(e));
		if (five)
			qh[e % 32] |= (uint8_t)((q[e] >> 4) << (e / 32));
	}
}

static void pack_q6_K(const struct qgrid *g, const int *q, uint8_t *b)
{
	memset(b, 0, 210);
	for (int e = 0; e < 256; e++) {
		int u = q[e] + 32;

		b[64 * (e / 128) + e % 64] |= (uint8_t)((u & 0x0f) << (4 * (e / 64 % 2)));
		b[128 + k2_byte(e)] |= (uint8_t)((u >> 4) << k2_shift(e));
	}
	for (int j = 0; j < 16; j++)
		b[192 + j] = (uint8_t)(int8_t)g->sc[j];
	quant_st_f16(b + 208, g->d);
}

void qgrid_pack(const struct qgrid *g, const int *q, void *block)
{
	uint8_t *b = block;

	switch (g->type) {
	case LOOM_TYPE_Q2_K: pack_q2_K(g, q, b); break;
	case LOOM_TYPE_Q3_K: pack_q3_K(g, q, b); break;
	case LOOM_TYPE_Q4_K: pack_k45(g, q, b, false); break;
	case LOOM_TYPE_Q5_K: pack_k45(g, q, b, true); break;
	case LOOM_TYPE_Q6_K: pack_q6_K(g, q, b); break;
	default: pack_32(g, q, b); break;
	}
}

bool qgrid_quantize_row(uint32_t type, const float *x, const float *imp, int64_t n,
			void *out, int block_bytes)
{
	struct qgrid g;
	int q[QGRID_MAX];
	int be = qgrid_block_elems(type);

	if (!be || n % be)
		return false;
	for (int64_t i = 0; i < n; i += be) {
		qgrid_fit(&g, type, x + i, imp ? imp + i : NULL);
		for (int e = 0; e < be; e++)
			q[e] = qgrid_q(&g, e, x[i + e]);
		qgrid_pack(&g, q, (uint8_t *)out + (size_t)(i / be) * (size_t)block_bytes);
	}
	return true;
}
