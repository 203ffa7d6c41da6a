/*
 * k-quants: super-blocks of 256 values (GGUF's QK_K), in GGUF's layouts.
 *
 *   q2_K,  84 bytes: scales[16] (low nibble scale, high nibble min, per 16
 *          values), qs[64] (2 bits), f16 d, f16 dmin.
 *          value = d * sc * q - dmin * m
 *   q3_K, 110 bytes: hmask[32], qs[64] (low 2 bits), scales[12] (16 6-bit
 *          scales, biased by 32), f16 d.
 *          value = d * (sc - 32) * (q_low - (high bit ? 0 : 4))
 *   q4_K, 144 bytes: f16 d, f16 dmin, scales[12] (8 6-bit scales and mins,
 *          per 32 values), qs[128] (4 bits).  value = d * sc * q - dmin * m
 *   q5_K, 176 bytes: f16 d, f16 dmin, scales[12], qh[32], qs[128].
 *          As q4_K with a fifth bit from qh.
 *   q6_K, 210 bytes: ql[128], qh[64], int8 scales[16] (per 16 values),
 *          f16 d.  value = d * sc * (q - 32)
 *
 * Where each value's bits live is spelled out by the *_index helpers below;
 * the arithmetic order (d * sc first, then * q) is GGUF's, so decoding is
 * bit-exact with gguf's reference dequantizer.
 *
 * from_float is a simple one-pass quantizer, not ggml's iterative
 * error-minimizing search (its bytes differ from ggml's):
 *   q2_K, q4_K, q5_K (scale and min): per group, lo = min(0, min x); the
 *     mins m = ceil(-lo / dmin) with dmin = max(-lo) / (2^bits - 1) make
 *     dmin * m >= -lo; then span = max x + dmin * m, and the scales
 *     sc = ceil(span / L / d) with d = max(span / L) / (2^bits - 1) (L = 3,
 *     15 or 31 levels), so the grid covers the group; q = round((x +
 *     dmin * m) / (d * sc)) clamped to 0..L. d and dmin are rounded to f16
 *     before the integer scales are chosen.
 *   q3_K, q6_K (signed scale): per group of 16, the value mx of largest
 *     magnitude gives s = mx / -L (L = 4 or 32, as q4_0 does), the f16 d
 *     = max|s| / smax (smax 31 or 127), sc = sign(s) * ceil(|s| / d), and
 *     q = round(x / (d * sc)) clamped to -L..L-1.
 * Error: at most half a step, d * |sc| / 2, except the values of sign
 * opposite to mx in q3_K/q6_K beyond (L - 1/2) steps, clipped to L - 1.
 *
 * from_float_weighted: per group quant_search.h's weighted search (affine
 * with offset >= 0 for q2_K/q4_K/q5_K, symmetric for q3_K/q6_K), the group
 * scales (and mins) as integers of an f16 d (and dmin) searched to keep
 * the groups' weighted error small (qs_scale_ints), q rounded again for
 * them; per super-block the better of that and the one-pass block in
 * weighted error.
 */
#include <math.h>

#include "quant_common.h"
#include "quant_search.h"

#define QK_K 256
#define Q2_K_BYTES 84
#define Q3_K_BYTES 110
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210

/* ---- bit positions (e: element 0..255 of the super-block) ---- */

/* q2_K / q3_K low bits: qs[32 * (e / 128) + e % 32], shift 2 * (e / 32 % 4). */
static int k2_byte(int e)
{
	return 32 * (e / 128) + e % 32;
}

static int k2_shift(int e)
{
	return 2 * (e / 32 % 4);
}

/* q4_K / q5_K nibble: qs[32 * (e / 64) + e % 32], high half if e / 32 odd. */
static int k4_byte(int e)
{
	return 32 * (e / 64) + e % 32;
}

static int k4_shift(int e)
{
	return 4 * (e / 32 % 2);
}

/* q6_K: low nibble in ql[64 * (e / 128) + e % 64] (high half if e / 64
 * odd), top 2 bits in qh[32 * (e / 128) + e % 32] at 2 * (e / 32 % 4). */
static int k6_lbyte(int e)
{
	return 64 * (e / 128) + e % 64;
}

static int k6_lshift(int e)
{
	return 4 * (e / 64 % 2);
}

/* q3_K 6-bit scale i: low nibble in byte i % 8 (high half if i >= 8), top
 * 2 bits in byte 8 + i % 4 at 2 * (i / 4). */
static int k3_scale(const uint8_t *s, int i)
{
	int lo = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
	int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 0x03;

	return (lo | hi << 4) - 32;
}

static void k3_set_scale(uint8_t *s, int i, int sc)
{
	int u = sc + 32;

	s[i % 8] |= (uint8_t)((u & 0x0f) << (4 * (i / 8)));
	s[8 + i % 4] |= (uint8_t)((u >> 4) << (2 * (i / 4)));
}

/* q4_K / q5_K 6-bit scale and min of sub-block j (0..7) from 12 bytes. */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
		*m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

/* ---- to_float ---- */

static void q2_K_block(const uint8_t *b, float *y)
{
	const uint8_t *scales = b, *qs = b + 16;
	float d = quant_ld_f16(b + 80), dmin = quant_ld_f16(b + 82);

	for (int e = 0; e < QK_K; e++) {
		int q = (qs[k2_byte(e)] >> k2_shift(e)) & 3;
		float dl = d * (float)(scales[e / 16] & 0x0f);
		float ml = dmin * (float)(scales[e / 16] >> 4);

		y[e] = dl * (float)q - ml;
	}
}

static void q3_K_block(const uint8_t *b, float *y)
{
	const uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
	float d = quant_ld_f16(b + 108);

	for (int e = 0; e < QK_K; e++) {
		int q = (qs[k2_byte(e)] >> k2_shift(e)) & 3;
		int high = (hmask[e % 32] >> (e / 32)) & 1;
		float dl = d * (float)k3_scale(scales, e / 16);

		y[e] = dl * (float)(q - (high ? 0 : 4));
	}
}

/* q4_K and q5_K; qh is NULL for q4_K. */
static void k45_block(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y)
{
	float d = quant_ld_f16(b), dmin = quant_ld_f16(b + 2);

	for (int j = 0; j < 8; j++) {
		int sc, m;
		float dl, ml;

		k4_scale_min(b + 4, j, &sc, &m);
		dl = d * (float)sc;
		ml = dmin * (float)m;
		for (int e = 32 * j; e < 32 * j + 32; e++) {
			int q = (qs[k4_byte(e)] >> k4_shift(e)) & 0x0f;

			if (qh)
				q |= ((qh[e % 32] >> j) & 1) << 4;
			y[e] = dl * (float)q - ml;
		}
	}
}

static void q4_K_block(const uint8_t *b, float *y)
{
	k45_block(b, NULL, b + 16, y);
}

static void q5_K_block(const uint8_t *b, float *y)
{
	k45_block(b, b + 16, b + 48, y);
}

static void q6_K_block(const uint8_t *b, float *y)
{
	const uint8_t *ql = b, *qh = b + 128;
	const int8_t *scales = (const int8_t *)(b + 192);
	float d = quant_ld_f16(b + 208);

	for (int e = 0; e < QK_K; e++) {
		int lo = (ql[k6_lbyte(e)] >> k6_lshift(e)) & 0x0f;
		int hi = (qh[k2_byte(e)] >> k2_shift(e)) & 3;
		float dl = d * (float)scales[e / 16];

		y[e] = dl * (float)((lo | hi << 4) - 32);
	}
}

static int k_to_float(const void *src, float *dst, int64_t n, size_t bytes,
		      void (*block)(const uint8_t *, float *))
{
	const uint8_t *b = src;
	int ret = quant_check_args(src, dst, n, QK_K);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK_K, b += bytes)
		block(b, dst + i);
	return LOOM_OK;
}

/* ---- from_float ---- */

static float f16_round(float v)
{
	return quant_f16_to_f32(quant_f32_to_f16(v));
}

/* ceil(v / unit) clamped to 0..max; 0 when unit is 0. */
static int ceil_units(float v, float unit, int max)
{
	return unit > 0.0f ? quant_trunc_clamp(ceilf(v / unit), 0, max) : 0;
}

/* Scale-and-min quantization of 256 values in groups of `group`; see the
 * top comment. Writes the f16-exact d and dmin, sc, m and q. */
struct k_affine {
	int group, levels, smax;
	float d, dmin;
	int sc[16], m[16];
	int q[QK_K];
};

static void k_affine_quant(const float *x, struct k_affine *k)
{
	int n_groups = QK_K / k->group;
	float lo[16], span[16], max_lo = 0.0f, max_span = 0.0f;

	for (int g = 0; g < n_groups; g++) {
		const float *xg = x + g * k->group;
		float mn = 0.0f, mx = -INFINITY;

		for (int j = 0; j < k->group; j++) {
			mn = fminf(mn, xg[j]);
			mx = fmaxf(mx, xg[j]);
		}
		lo[g] = mn;
		span[g] = mx; /* offset added below */
		max_lo = fmaxf(max_lo, -mn);
	}
	k->dmin = f16_round(max_lo / (float)k->smax);
	for (int g = 0; g < n_groups; g++) {
		k->m[g] = ceil_units(-lo[g], k->dmin, k->smax);
		span[g] = fmaxf(span[g] + k->dmin * (float)k->m[g], 0.0f);
		max_span = fmaxf(max_span, span[g] / (float)k->levels);
	}
	k->d = f16_round(max_span / (float)k->smax);
	for (int g = 0; g < n_groups; g++) {
		float off = k->dmin * (float)k->m[g], step;

		k->sc[g] = ceil_units(span[g] / (float)k->levels, k->d, k->smax);
		step = k->d * (float)k->sc[g];
		for (int e = g * k->group; e < (g + 1) * k->group; e++)
			k->q[e] = step > 0.0f ?
				quant_trunc_clamp(roundf((x[e] + off) / step), 0, k->levels) : 0;
	}
}

/* Signed-scale quantization of 256 values in groups of 16; see the top
 * comment. q in -levels..levels-1, sc in -smax..smax. */
struct k_signed {
	int levels, smax;
	float d;
	int sc[16];
	int q[QK_K];
};

static void k_signed_quant(const float *x, struct k_signed *k)
{
	float s[16], max_s = 0.0f;

	for (int g = 0; g < 16; g++) {
		float amax = 0.0f, mx = 0.0f;

		for (int j = 16 * g; j < 16 * g + 16; j++) {
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				mx = x[j];
			}
		}
		s[g] = mx / (float)-k->levels;
		max_s = fmaxf(max_s, fabsf(s[g]));
	}
	k->d = f16_round(max_s / (float)k->smax);
	for (int g = 0; g < 16; g++) {
		int a = ceil_units(fabsf(s[g]), k->d, k->smax);
		float step;

		k->sc[g] = s[g] < 0.0f ? -a : a;
		step = k->d * (float)k->sc[g];
		for (int e = 16 * g; e < 16 * g + 16; e++)
			k->q[e] = step != 0.0f ?
				quant_trunc_clamp(roundf(x[e] / step), -k->levels,
						  k->levels - 1) : 0;
	}
}

/* The weighted search (quant_search.h): per group the best step and
 * offset for its weights, then the group scales and mins as integers of
 * the f16 d and dmin (rounded), and q rounded again for the result. */
static void k_affine_search(const float *x, const float *w, struct k_affine *k)
{
	int n_groups = QK_K / k->group, G = k->group;
	float s[16], off[16], ws[16], wo[16];

	for (int g = 0; g < n_groups; g++) {
		const float *wg = w ? w + g * G : NULL;
		float m;

		qs_affine(x + g * G, wg, G, k->levels, true, k->q + g * G, &s[g], &m);
		off[g] = -m;
		qs_group_weights(wg, k->q + g * G, G, &ws[g], &wo[g]);
	}
	k->d = qs_scale_ints(s, ws, n_groups, 0, k->smax, k->sc);
	k->dmin = qs_scale_ints(off, wo, n_groups, 0, k->smax, k->m);
	for (int g = 0; g < n_groups; g++) {
		float step, o;

		step = k->d * (float)k->sc[g];
		o = k->dmin * (float)k->m[g];
		for (int e = g * G; e < (g + 1) * G; e++)
			k->q[e] = step > 0.0f ? qs_round_clamp((x[e] + o) / step, 0, k->levels) : 0;
	}
}

/* As k_affine_search for the signed formats (groups of 16). */
static void k_signed_search(const float *x, const float *w, struct k_signed *k)
{
	float s[16], ws[16], unused;

	for (int g = 0; g < 16; g++) {
		const float *wg = w ? w + 16 * g : NULL;

		s[g] = qs_symmetric(x + 16 * g, wg, 16, -k->levels, k->levels - 1, k->q + 16 * g);
		qs_group_weights(wg, k->q + 16 * g, 16, &ws[g], &unused);
	}
	k->d = qs_scale_ints(s, ws, 16, -k->smax, k->smax, k->sc);
	for (int g = 0; g < 16; g++) {
		float step;

		step = k->d * (float)k->sc[g];
		for (int e = 16 * g; e < 16 * g + 16; e++)
			k->q[e] = step != 0.0f ?
				qs_round_clamp(x[e] / step, -k->levels, k->levels - 1) : 0;
	}
}

static void q2_K_pack(const struct k_affine *kp, uint8_t *b)
{
	const struct k_affine k = *kp;

	memset(b, 0, Q2_K_BYTES);
	for (int g = 0; g < 16; g++)
		b[g] = (uint8_t)(k.sc[g] | k.m[g] << 4);
	for (int e = 0; e < QK_K; e++)
		b[16 + k2_byte(e)] |= (uint8_t)(k.q[e] << k2_shift(e));
	quant_st_f16(b + 80, k.d);
	quant_st_f16(b + 82, k.dmin);
}

static void q2_K_quant(const float *x, uint8_t *b)
{
	struct k_affine k = { .group = 16, .levels = 3, .smax = 15 };

	k_affine_quant(x, &k);
	q2_K_pack(&k, b);
}

static void q2_K_search(const float *x, const float *w, uint8_t *b)
{
	struct k_affine k = { .group = 16, .levels = 3, .smax = 15 };

	k_affine_search(x, w, &k);
	q2_K_pack(&k, b);
}

static void q3_K_pack(const struct k_signed *kp, uint8_t *b)
{
	const struct k_signed k = *kp;

	memset(b, 0, Q3_K_BYTES);
	for (int e = 0; e < QK_K; e++) {
		int u = k.q[e] + 4; /* 0..7: bit 2 is the hmask bit */

		b[e % 32] |= (uint8_t)((u >> 2) << (e / 32));
		b[32 + k2_byte(e)] |= (uint8_t)((u & 3) << k2_shift(e));
	}
	for (int g = 0; g < 16; g++)
		k3_set_scale(b + 96, g, k.sc[g]);
	quant_st_f16(b + 108, k.d);
}

static void q3_K_quant(const float *x, uint8_t *b)
{
	struct k_signed k = { .levels = 4, .smax = 31 };

	k_signed_quant(x, &k);
	q3_K_pack(&k, b);
}

static void q3_K_search(const float *x, const float *w, uint8_t *b)
{
	struct k_signed k = { .levels = 4, .smax = 31 };

	k_signed_search(x, w, &k);
	q3_K_pack(&k, b);
}

/* q4_K (qh NULL, 15 levels) and q5_K (31 levels); search: the weighted
 * search with importance w (NULL: all 1), else the one-pass method. */
static void k45_quant(const float *x, bool search, const float *w, uint8_t *b, uint8_t *qh,
		      uint8_t *qs, int levels)
{
	struct k_affine k = { .group = 32, .levels = levels, .smax = 63 };

	if (search)
		k_affine_search(x, w, &k);
	else
		k_affine_quant(x, &k);
	quant_st_f16(b, k.d);
	quant_st_f16(b + 2, k.dmin);
	for (int j = 0; j < 8; j++)
		quant_k4_set_scale_min(b + 4, j, k.sc[j], k.m[j]);
	for (int e = 0; e < QK_K; e++) {
		qs[k4_byte(e)] |= (uint8_t)((k.q[e] & 0x0f) << k4_shift(e));
		if (qh)
			qh[e % 32] |= (uint8_t)((k.q[e] >> 4) << (e / 32));
	}
}

static void q4_K_quant(const float *x, uint8_t *b)
{
	memset(b, 0, Q4_K_BYTES);
	k45_quant(x, false, NULL, b, NULL, b + 16, 15);
}

static void q4_K_search(const float *x, const float *w, uint8_t *b)
{
	memset(b, 0, Q4_K_BYTES);
	k45_quant(x, true, w, b, NULL, b + 16, 15);
}

static void q5_K_quant(const float *x, uint8_t *b)
{
	memset(b, 0, Q5_K_BYTES);
	k45_quant(x, false, NULL, b, b + 16, b + 48, 31);
}

static void q5_K_search(const float *x, const float *w, uint8_t *b)
{
	memset(b, 0, Q5_K_BYTES);
	k45_quant(x, true, w, b, b + 16, b + 48, 31);
}

static void q6_K_pack(const struct k_signed *kp, uint8_t *b)
{
	const struct k_signed k = *kp;

	memset(b, 0, Q6_K_BYTES);
	for (int e = 0; e < QK_K; e++) {
		int u = k.q[e] + 32; /* 0..63 */

		b[k6_lbyte(e)] |= (uint8_t)((u & 0x0f) << k6_lshift(e));
		b[128 + k2_byte(e)] |= (uint8_t)((u >> 4) << k2_shift(e));
	}
	for (int g = 0; g < 16; g++)
		b[192 + g] = (uint8_t)(int8_t)k.sc[g];
	quant_st_f16(b + 208, k.d);
}

static void q6_K_quant(const float *x, uint8_t *b)
{
	struct k_signed k = { .levels = 32, .smax = 127 };

	k_signed_quant(x, &k);
	q6_K_pack(&k, b);
}

static void q6_K_search(const float *x, const float *w, uint8_t *b)
{
	struct k_signed k = { .levels = 32, .smax = 127 };

	k_signed_search(x, w, &k);
	q6_K_pack(&k, b);
}

static int k_from_float(const float *src, void *dst, int64_t n, size_t bytes,
			void (*block)(const float *, uint8_t *))
{
	uint8_t *b = dst;
	int ret = quant_check_args(src, dst, n, QK_K);

	if (ret)
		return ret;
	for (int64_t i = 0; i < n; i += QK_K, b += bytes)
		block(src + i, b);
	return LOOM_OK;
}

/* ---- the descriptor ---- */

#define K_FORMAT(lower, upper)                                                 \
	static int lower##_to_float(const void *src, float *dst, int64_t n)    \
	{                                                                      \
		return k_to_float(src, dst, n, upper##_BYTES, lower##_block);  \
	}                                                                      \
	static int lower##_from_float(const float *src, void *dst, int64_t n)  \
	{                                                                      \
		return k_from_float(src, dst, n, upper##_BYTES, lower##_quant); \
	}                                                                      \
	static int lower##_from_float_weighted(const float *src, void *dst,    \
					       int64_t n, const float *w)      \
	{                                                                      \
		return qs_blocks(src, dst, n, w, QK_K, upper##_BYTES,          \
				 lower##_from_float, lower##_search,           \
				 lower##_to_float);                            \
	}

K_FORMAT(q2_K, Q2_K)
K_FORMAT(q3_K, Q3_K)
K_FORMAT(q4_K, Q4_K)
K_FORMAT(q5_K, Q5_K)
K_FORMAT(q6_K, Q6_K)

#define K_ENTRY(lower, upper)                                                  \
	{                                                                      \
		.struct_size = sizeof(struct loom_quant_format),               \
		.type = LOOM_TYPE_##upper,                                     \
		.name = #lower,                                                \
		.block_elems = QK_K,                                           \
		.block_bytes = upper##_BYTES,                                  \
		.to_float = lower##_to_float,                                  \
		.from_float = lower##_from_float,                              \
		.from_float_weighted = lower##_from_float_weighted,            \
	}

static const struct loom_quant_format kquant_formats[] = {
	K_ENTRY(q2_K, Q2_K), K_ENTRY(q3_K, Q3_K), K_ENTRY(q4_K, Q4_K),
	K_ENTRY(q5_K, Q5_K), K_ENTRY(q6_K, Q6_K),
};

static const struct loom_quant_plugin kquant_plugin = {
	.abi_major = LOOM_PLUGIN_ABI_MAJOR,
	.abi_minor = LOOM_PLUGIN_ABI_MINOR,
	.struct_size = sizeof(struct loom_quant_plugin),
	.name = "kquant",
	.n_formats = sizeof(kquant_formats) / sizeof(kquant_formats[0]),
	.formats = kquant_formats,
};

LOOM_EXPORT const struct loom_quant_plugin *loom_quant_entry(void)
{
	return &kquant_plugin;
}
