/*
 * cpu.so's integer dot products (backends/cpu/qdot.c), every kernel set
 * this machine runs, every format, k of 1 to 37 blocks (odd counts too):
 *
 *   bitwise   kernel == qdot_ref() of its set (the same arithmetic in C);
 *   exact     |kernel - f64 dot of the dequantized weights and the
 *             dequantized 8-bit activations| <= 1e-5 * sum |w * xq|
 *             (float rounding only);
 *   quantized |kernel - f64 dot with the original f32 activations|
 *             <= sum_b amax_b / 254 * sum_e |w_e|  +  1e-5 * sum |w * x|
 *             (round to nearest moves x by at most half a step, amax/127/2).
 *
 * Plus the activation quantizer's own contract: |q| <= 127, x within half a
 * step of d*q, s = d * sum(q); and the packed layout (kpack.h): unpacking
 * gives back the GGUF bytes, the packed kernels equal qdot_ref() of the
 * VNNI set bit for bit, as the GGUF-layout kernels do, and a prefill panel
 * built from a packed group is the GGUF rows' panel.
 *
 * The AMX prefill GEMM (amx.h) through its C tile emulation, and through
 * the AMX instructions where the CPU has them and the kernel grants tile
 * state: qgemm_run()'s VNNI bits and qgemm_ref()'s, bit for bit.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "cpu.h"
#include "qdot.h"
#include "extreme_w.h"
#include "hard_acts.h"
#include "kpack.h"
#include "kpack_check.h"
#include "qgemm.h"

static const uint32_t formats[] = {
	LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1,
	LOOM_TYPE_MXFP4,
};
#define N_FORMATS (int)(sizeof(formats) / sizeof(formats[0]))

static const int64_t block_counts[] = { 1, 2, 3, 5, 8, 9, 18, 37 };
#define N_COUNTS (int)(sizeof(block_counts) / sizeof(block_counts[0]))
#define MAX_NB 48

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t rnd32(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

static float rndf(void)
{
	return (float)rnd32() / 2147483648.0f - 1.0f; /* [-1, 1) */
}

/* Normal half floats only: exponent in range, mantissa truncated. */
static uint16_t to_f16(float f)
{
	uint32_t b;

	memcpy(&b, &f, 4);
	return (uint16_t)(((b >> 16) & 0x8000) | ((((b >> 23) & 0xff) - 112) << 10) |
			  ((b >> 13) & 0x3ff));
}

/* The block's fp16 fields: d at 0, m at 2 for the offset formats. */
static void fill_weights(uint32_t t, uint8_t *w, int64_t nb)
{
	const size_t bb = cpu_block_bytes(t);

	for (size_t i = 0; i < nb * bb; i++)
		w[i] = (uint8_t)rnd32();
	for (int64_t b = 0; t == LOOM_TYPE_MXFP4 && b < nb; b++)
		w[b * bb] = (uint8_t)(118 + rnd32() % 9); /* E8M0: 2^-9 .. 2^-1 */
	for (int64_t b = 0; t != LOOM_TYPE_MXFP4 && b < nb; b++) {
		uint16_t d = to_f16(0.002f + 0.05f * (rndf() + 1.0f));
		uint16_t m = to_f16(-0.3f * (rndf() + 1.5f) / 2.0f);

		memcpy(w + b * bb, &d, 2);
		if (cpu_format_has_min(t))
			memcpy(w + b * bb + 2, &m, 2);
	}
}

/* Activations as a model has them: mostly small, a few outliers, and
 * now and then an all-zero block. */
static void fill_acts(float *x, int64_t k)
{
	for (int64_t i = 0; i < k; i++)
		x[i] = rndf() * (rnd32() % 16 == 0 ? 8.0f : 1.0f);
	if (k >= 64 && rnd32() % 2)
		memset(x + 32, 0, 32 * sizeof(float));
}

/* Weight element e of block p, from the GGUF layouts, in double. */
static double weight(uint32_t t, const uint8_t *p, int e)
{
	static const double e2m1[16] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6,
					 -0.0, -0.5, -1, -1.5, -2, -3, -4, -6 };
	double d = cpu_fp16_to_f32((uint16_t)(p[0] | p[1] << 8)), m = 0.0;
	const uint8_t *qs;
	uint32_t qh = 0;
	int q;

	if (t == LOOM_TYPE_MXFP4) /* E2M1 times 2^(e - 127) */
		return ldexp(e2m1[e < 16 ? p[1 + e] & 15 : p[1 + e - 16] >> 4], p[0] - 127);

	if (t == LOOM_TYPE_Q8_0)
		return d * (int8_t)p[2 + e];
	if (cpu_format_has_min(t))
		m = cpu_fp16_to_f32((uint16_t)(p[2] | p[3] << 8));
	qs = p + (t == LOOM_TYPE_Q4_0 ? 2 : t == LOOM_TYPE_Q4_1 ? 4 :
		  t == LOOM_TYPE_Q5_0 ? 6 : 8);
	if (t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1)
		memcpy(&qh, qs - 4, 4);
	q = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
	q |= (int)((qh >> e) & 1) << 4;
	if (t == LOOM_TYPE_Q4_0)
		q -= 8;
	if (t == LOOM_TYPE_Q5_0)
		q -= 16;
	return d * q + m;
}

START_TEST(quantize_contract)
{
	float x[MAX_NB * 32];
	struct qdot_block q[MAX_NB];

	for (int rep = 0; rep < 50; rep++) {
		fill_acts(x, MAX_NB * 32);
		qdot_quantize_row(x, q, MAX_NB * 32);
		for (int b = 0; b < MAX_NB; b++) {
			int sum = 0;

			for (int e = 0; e < 32; e++) {
				ck_assert_int_le(abs(q[b].q[e]), 127);
				ck_assert_float_le(fabsf(x[32 * b + e] - q[b].d * q[b].q[e]),
						   q[b].d * 0.5001f + 1e-30f);
				sum += q[b].q[e];
			}
			ck_assert_float_eq(q[b].s, q[b].d * (float)sum);
		}
	}
	/* a NaN or an inf poisons its block, not its neighbours */
	x[40] = NAN;
	x[70] = -INFINITY;
	qdot_quantize_row(x, q, 128);
	ck_assert(isnan(q[1].d) && isnan(q[2].d));
	ck_assert(!isnan(q[0].d) && !isnan(q[3].d));
	for (int e = 0; e < 32; e++)
		ck_assert(q[1].q[e] == 0 && q[2].q[e] == 0);
}
END_TEST

/* The SIMD quantizer gives the plain C one's blocks byte for byte, also
 * with zeros, ties at .5 steps, huge and tiny values and non-finite ones. */
START_TEST(quantize_simd_matches_c)
{
	float x[MAX_NB * 32];
	struct qdot_block a[MAX_NB], b[MAX_NB];
	int bad = 0;

	for (int rep = 0; rep < 200; rep++) {
		fill_acts(x, MAX_NB * 32);
		hard_acts(x, MAX_NB * 32, 64, rep % 4 == 0, rnd32);
		if (rep % 10 == 0)
			memset(x, 0, 32 * sizeof(float)); /* an all-zero block */
		qdot_quantize_row(x, a, MAX_NB * 32);
		qdot_quantize_row_c(x, b, MAX_NB * 32);
		for (int i = 0; i < MAX_NB; i++)
			bad += memcmp(&a[i], &b[i], sizeof(a[i])) != 0 &&
			       !(isnan(a[i].d) && isnan(b[i].d) && !memcmp(a[i].q, b[i].q, 32));
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

/* Row r of `w` against f64: returns whether the kernel's y is in bounds. */
static bool near_f64(uint32_t t, const uint8_t *w, const float *x, const struct qdot_block *q,
		     int64_t nb, float got)
{
	const size_t bb = cpu_block_bytes(t);
	double exact = 0, quant = 0, mag = 0, magq = 0, qerr = 0;

	for (int64_t b = 0; b < nb; b++) {
		double wabs = 0;

		for (int e = 0; e < 32; e++) {
			double we = weight(t, w + b * bb, e);
			double xq = (double)q[b].d * q[b].q[e];

			exact += we * x[32 * b + e];
			quant += we * xq;
			mag += fabs(we * x[32 * b + e]);
			magq += fabs(we * xq);
			wabs += fabs(we);
		}
		qerr += wabs * (double)q[b].d / 2.0;
	}
	if (fabs(got - quant) <= 1e-5 * magq && fabs(got - exact) <= qerr * 1.0001 + 1e-5 * mag)
		return true;
	printf("type %u nb=%lld: %.9g, f64 %.9g (quantized x: %.9g)\n", t, (long long)nb, got,
	       exact, quant);
	return false;
}

/*
 * One format and block count on one kernel set: ROWS weight rows in one
 * call (groups of 4, or of 8 for refseq()'s kernels, and a rest), and
 * row 0 alone. Returns mismatches.
 */
#define ROWS 11
static int check_case(enum qdot_isa isa, uint32_t t, int64_t nb)
{
	static uint8_t w[ROWS * MAX_NB * 34];
	const size_t ws = nb * cpu_block_bytes(t);
	qdot_fn fn = qdot_kernel(isa, t);
	struct qdot_block q[MAX_NB];
	float x[MAX_NB * 32], sc[(MAX_NB + 15) / 16 * 32], y[ROWS], y0;
	int bad = 0;

	fill_weights(t, w, ROWS * nb);
	fill_acts(x, nb * 32);
	qdot_quantize_row(x, q, nb * 32);
	qdot_row_scales(q, nb, sc);
	fn(w, ws, q, sc, nb, y, ROWS);
	fn(w, ws, q, sc, nb, &y0, 1);
	for (int r = 0; r < ROWS; r++) {
		float want = qdot_ref(isa, t, w + r * ws, q, nb);

		if (memcmp(&y[r], &want, sizeof(want)) || (r == 0 && memcmp(&y0, &want, 4))) {
			printf("%s type %u nb=%lld row %d: kernel %.9g (alone %.9g), reference %.9g\n",
			       qdot_isa_name(isa), t, (long long)nb, r, y[r], y0, want);
			bad++;
		} else if (!near_f64(t, w + r * ws, x, q, nb, y[r])) {
			bad++;
		}
	}
	return bad;
}

START_TEST(kernels_match_reference)
{
	enum qdot_isa isa = (enum qdot_isa)_i;
	int bad = 0, cases = 0;

	if (!qdot_isa_supported(isa)) {
		printf("qdot %s: not supported here, skipped\n", qdot_isa_name(isa));
		return;
	}
	for (int f = 0; f < N_FORMATS; f++)
		for (int c = 0; c < N_COUNTS; c++)
			for (int rep = 0; rep < 20; rep++, cases++)
				bad += check_case(isa, formats[f], block_counts[c]) != 0;
	printf("qdot %s: %d cases, %d off\n", qdot_isa_name(isa), cases, bad);
	ck_assert_int_eq(bad, 0);
}
END_TEST

/* Sets with the same lane layout give the same bits; VNNI's and AVX2's
 * block after block arithmetic gives qgemm_ref()'s. */
START_TEST(layouts_agree)
{
	static uint8_t w[MAX_NB * 34];
	float x[MAX_NB * 32], sc[(MAX_NB + 15) / 16 * 32], y8[QDOT_N_ISA], y16;
	struct qdot_block q[MAX_NB];

	for (int f = 0; f < N_FORMATS; f++) {
		fill_weights(formats[f], w, MAX_NB);
		fill_acts(x, MAX_NB * 32);
		qdot_quantize_row(x, q, MAX_NB * 32);
		qdot_row_scales(q, MAX_NB, sc);
		for (int i = 0; i < QDOT_N_ISA; i++)
			if (qdot_isa_supported(i))
				qdot_kernel(i, formats[f])(w, 0, q, sc, MAX_NB, &y8[i], 1);
		const float g = qgemm_ref(formats[f], w, q, MAX_NB * 32);

		if (qdot_isa_supported(QDOT_AVX2) && !qdot_seq(QDOT_AVX2, formats[f]))
			ck_assert(!memcmp(&y8[QDOT_SCALAR], &y8[QDOT_AVX2], 4));
		if (qdot_isa_supported(QDOT_AVXVNNI))
			ck_assert(!memcmp(&y8[QDOT_SCALAR], &y8[QDOT_AVXVNNI], 4));
		if (qdot_isa_supported(QDOT_VNNI) && !qdot_seq(QDOT_VNNI, formats[f]))
			ck_assert(!memcmp(&y8[QDOT_AVX512], &y8[QDOT_VNNI], 4));
		/* block after block: the prefill GEMM's bits */
		if (qdot_isa_supported(QDOT_VNNI) && qdot_seq(QDOT_VNNI, formats[f]))
			ck_assert(!memcmp(&g, &y8[QDOT_VNNI], 4));
		if (qdot_isa_supported(QDOT_AVX2) && qdot_seq(QDOT_AVX2, formats[f]))
			ck_assert(!memcmp(&g, &y8[QDOT_AVX2], 4));
		/* and the two layouts round differently, or the bitwise test
		 * above could not tell them apart */
		y16 = qdot_ref(QDOT_AVX512, formats[f], w, q, MAX_NB);
		if (memcmp(&y16, &y8[QDOT_SCALAR], 4))
			continue;
		printf("note: layouts agree on format %u\n", formats[f]);
	}
}
END_TEST

/* Random K-quant super-blocks: random bytes with sane f16 d (and dmin). */
static void fill_k(uint32_t t, uint8_t *w, int64_t n_sb)
{
	const size_t bb = cpu_block_bytes(t);
	const int d_at = t == LOOM_TYPE_Q2_K ? 80 : t == LOOM_TYPE_Q3_K ? 108 :
			 t == LOOM_TYPE_Q6_K ? 208 : 0;

	for (int64_t b = 0; b < n_sb; b++) {
		uint8_t *p = w + b * bb;

		for (size_t i = 0; i < bb; i++)
			p[i] = (uint8_t)rnd32();
		for (int h = 0; h < 2; h++) {
			uint16_t v = to_f16(0.001f + 0.01f * (rndf() + 1.0f));

			if (h == 0 || t == LOOM_TYPE_Q2_K || t == LOOM_TYPE_Q4_K ||
			    t == LOOM_TYPE_Q5_K)
				memcpy(p + d_at + 2 * h, &v, 2);
		}
	}
}

/* K-quants: the kernel's sum against the f64 dot of the weights as
 * kernels.c dequantizes them (independent code) and the dequantized 8-bit
 * activations, within float rounding of the terms. */
static bool near_dequant(uint32_t t, const uint8_t *w, const struct qdot_block *q, int64_t k,
			 float got)
{
	static float wf[1536];
	double dot = 0, mag = 0;

	cpu_dequant_row(CPU_ISA_SCALAR, t, w, wf, k);
	for (int64_t e = 0; e < k; e++) {
		double v = (double)wf[e] * q[e / 32].d * q[e / 32].q[e % 32];

		dot += v;
		mag += fabs(v);
	}
	if (fabs(got - dot) <= 1e-5 * mag + 1e-30)
		return true;
	printf("qgemm type %u k=%lld: %.9g, f64 dot of the dequantized operands %.9g\n", t,
	       (long long)k, got, dot);
	return false;
}

/*
 * The prefill kernel (qgemm.h): panels of up to 16 rows (odd counts too)
 * times m activation rows, against qgemm_ref() bit for bit; for the
 * 32-value formats also against the f64 dot of the dequantized operands
 * within float rounding.
 */
/* Whether two qgemm panels of nb 32-value blocks differ in rows < rows
 * (per block: 8 groups of 16 x 4 bytes, then 16 scales, 16 minima). */
static bool panel_rows_differ(const uint8_t *a, const uint8_t *b, int64_t nb, int rows)
{
	const size_t blk = 8 * 64 + 2 * 16 * sizeof(float);

	for (int64_t c = 0; c < nb; c++)
		for (int r = 0; r < rows; r++) {
			const uint8_t *x = a + c * blk, *y = b + c * blk;

			for (int g = 0; g < 8; g++)
				if (memcmp(x + 64 * g + 4 * r, y + 64 * g + 4 * r, 4))
					return true;
			if (memcmp(x + 512 + 4 * r, y + 512 + 4 * r, 4) ||
			    memcmp(x + 576 + 4 * r, y + 576 + 4 * r, 4))
				return true;
		}
	return false;
}

/*
 * The 32-value formats in rows-in-lanes groups (kpack.h): n rows of nb
 * blocks packed then unpacked are the GGUF rows byte for byte;
 * kpack_panel() of each group is qgemm_panel() of its GGUF rows in every
 * row the group holds; each kernel set's kernel over random row ranges
 * equals qdot_ref() of that set (16 lanes for AVX-512 VNNI, 8 for AVX2
 * and AVX-VNNI) of each row bit for bit and writes nothing outside the
 * range. nb past 512 takes the 256-bit kernels' passes of 512 blocks.
 */
static const enum qdot_isa kpack_isas[] = { QDOT_VNNI, QDOT_AVXVNNI, QDOT_AVX2 };

/* Packs the n GGUF rows w (stride ws) group by group into p and compares
 * each group's kpack_panel() with qgemm_panel() of its rows (want and got
 * hold a panel): the groups that differ. */
static int pack_and_compare_panels(uint32_t t, const uint8_t *w, size_t ws, uint8_t *p,
				   int64_t n, int64_t nb, uint8_t *want, uint8_t *got)
{
	int bad = 0;

	for (int64_t g = 0; g * KPACK_ROWS < n; g++) {
		int rows = (int)(n - g * KPACK_ROWS < KPACK_ROWS ? n - g * KPACK_ROWS : KPACK_ROWS);

		kpack_group(t, w + g * KPACK_ROWS * ws, ws, rows, nb,
			    p + g * KPACK_ROWS * kpack_row_share(t, nb));
		qgemm_panel(t, w + g * KPACK_ROWS * ws, ws, 0, rows, nb * 32, false, want);
		/* the 512-bit, 256-bit and C builders, where the CPU runs them */
		for (int width = 512; width >= 0; width -= 256) {
			kpack_panel_width(t, p, nb, g * KPACK_ROWS, got, width);
			if (panel_rows_differ(got, want, nb, rows)) {
				printf("kpack type %u n=%lld nb=%lld: %d-bit panel of group %lld differs\n",
				       t, (long long)n, (long long)nb, width, (long long)g);
				bad++;
			}
		}
	}
	return bad;
}

static int check_kpack32(uint32_t t, int64_t n, int64_t nb)
{
	const size_t ws = nb * cpu_block_bytes(t), bytes = kpack_bytes(t, n, nb);
	const size_t pbytes = qgemm_panel_bytes(t, nb * 32);
	uint8_t *w = malloc(n * ws);
	uint8_t *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
	uint8_t *want = aligned_alloc(64, pbytes), *got = aligned_alloc(64, pbytes);
	float *x = malloc(nb * 32 * sizeof(float)), want_y[40];
	struct qdot_block *q = malloc(nb * sizeof(*q));
	int bad = 0;

	ck_assert(w && p && want && got && x && q && bytes && n <= 40);
	/* a pair of blocks packs into its GGUF bytes; a last odd one pads */
	ck_assert_uint_ge(kpack_row_share(t, nb), ws);
	ck_assert_uint_le(kpack_row_share(t, nb), ws + (nb % 2 ? 10 : 0));
	fill_weights(t, w, n * nb);
	bad += pack_and_compare_panels(t, w, ws, p, n, nb, want, got);
	bad += kpack_unpack_differs(t, w, ws, p, n, nb);
	fill_acts(x, nb * 32);
	qdot_quantize_row(x, q, nb * 32);
	for (size_t i = 0; i < sizeof(kpack_isas) / sizeof(kpack_isas[0]); i++) {
		kpack_fn fn = kpack_kernel(kpack_isas[i], t);

		if (!fn)
			continue;
		for (int64_t j = 0; j < n; j++)
			want_y[j] = qdot_ref(kpack_isas[i], t, w + j * ws, q, nb);
		bad += kpack_ranges_differ(t, fn, p, q, n, nb, want_y, rnd32);
	}
	free(w);
	free(p);
	free(want);
	free(got);
	free(x);
	free(q);
	return bad;
}

/*
 * The many-row kernels (kpack_kernel_m(): AVX-512 VNNI, AVX2): m activation rows
 * at once over a random row range, each row's result bit for bit
 * qgemm_ref() of its GGUF row (so the GEMV, its many-row form and the
 * prefill GEMM agree), nothing written outside the range or the rows.
 */
struct rows32 {
	uint32_t t;
	const uint8_t *w;
	size_t ws;
	const struct qdot_block *q;
	int64_t nb;
};

static float want_rows32(const void *ctx, int i, int64_t j)
{
	const struct rows32 *c = ctx;

	return qgemm_ref(c->t, c->w + j * c->ws, c->q + i * c->nb, c->nb * 32);
}

static int check_kpack32_rows(enum qdot_isa isa, uint32_t t, int64_t n, int64_t nb, int m)
{
	const size_t ws = nb * cpu_block_bytes(t), bytes = kpack_bytes(t, n, nb);
	uint8_t *w = malloc(n * ws);
	uint8_t *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
	float *x = malloc(nb * 32 * sizeof(float));
	struct qdot_block *q = malloc(m * nb * sizeof(*q));
	kpack_mfn fn = kpack_kernel_m(isa, t);
	int64_t j0 = (int64_t)(rnd32() % n), j1 = j0 + 1 + (int64_t)(rnd32() % (n - j0));
	int bad;

	ck_assert(w && p && x && q && bytes && fn);
	fill_weights(t, w, n * nb);
	kpack_pack_rows(t, w, ws, n, nb, p);
	for (int i = 0; i < m; i++) {
		fill_acts(x, nb * 32);
		qdot_quantize_row(x, q + i * nb, nb * 32);
	}
	bad = kpack_rows_differ(t, fn, p, q, m, n, nb, j0, j1, want_rows32,
				&(struct rows32){ t, w, ws, q, nb });
	free(w);
	free(p);
	free(x);
	free(q);
	return bad;
}

START_TEST(kpack32_rows_match_gemm)
{
	static const enum qdot_isa isas[] = { QDOT_VNNI, QDOT_AVX2 };
	static const int64_t nbs[] = { 1, 3, 18, 255, 256, 257, 520 };
	static const int ms[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 33 };
	int bad = 0, cases = 0;

	for (size_t s = 0; s < sizeof(isas) / sizeof(isas[0]); s++) {
		const enum qdot_isa isa = isas[s];

		if (!qdot_isa_supported(isa)) {
			printf("SKIP: no %s: its many-row kernels are not run here\n",
			       qdot_isa_name(isa));
			continue;
		}
		for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
			if (!qdot_seq(isa, formats[f])) {
				ck_assert(!kpack_kernel_m(isa, formats[f]));
				continue;
			}
			for (size_t c = 0; c < sizeof(nbs) / sizeof(nbs[0]); c++)
				for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++, cases++)
					bad += check_kpack32_rows(isa, formats[f], 37, nbs[c],
								  ms[i]) != 0;
			/* a pass holds 4096 / rows blocks: one row past it, two,
			 * and 17 (16, then 1) */
			for (int m = 1; m <= 17; m += m == 1 ? 1 : 15, cases++)
				bad += check_kpack32_rows(isa, formats[f], 21, 4099, m) != 0;
		}
	}
	printf("kpack many-row kernels: %d cases, %d off\n", cases, bad);
	ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(kpack32_matches_reference)
{
	static const int64_t ns[] = { 1, 5, 16, 21, 37 };
	static const int64_t nbs[] = { 1, 2, 3, 7, 18, 48, 127, 128, 129, 130, 259, 512, 515 };
	int bad = 0, cases = 0;

	for (size_t i = 0; i < sizeof(kpack_isas) / sizeof(kpack_isas[0]); i++)
		printf("kpack kernels %s: %s\n", qdot_isa_name(kpack_isas[i]),
		       kpack_kernel(kpack_isas[i], LOOM_TYPE_Q4_1) ? "checked" :
								      "not run here");
	/* the 256-bit sets run wherever AVX2 does */
	ck_assert(!qdot_isa_supported(QDOT_AVX2) || kpack_kernel(QDOT_AVX2, LOOM_TYPE_Q8_0));
	for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
		if (formats[f] == LOOM_TYPE_MXFP4) /* not packed: GGUF layout kernels */
			continue;
		ck_assert(kpack_format(formats[f]) && kpack_block_elems(formats[f]) == 32);
		for (size_t c = 0; c < sizeof(nbs) / sizeof(nbs[0]); c++)
			for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++, cases++)
				bad += check_kpack32(formats[f], ns[i], nbs[c]) != 0;
	}
	printf("kpack 32-value formats: %d cases, %d off\n", cases, bad);
	ck_assert_int_eq(bad, 0);
}
END_TEST

/*
 * The prefill GEMM that reads a packed Q8_0 group in place (kpack_qgemm(),
 * AVX2): every output qgemm_ref() of its GGUF row bit for bit (so the
 * panel path's, qgemm_match_reference), for m activation rows at a stride,
 * rows of a last group cut short, odd block counts (a block alone at the
 * end), and the first pass that prefetches; nothing written past a group's
 * rows. Returns the outputs that differ.
 */
static int check_q8_inplace(kpack_qgemm_fn fn, int64_t n, int64_t nb, int m, bool extreme)
{
	const uint32_t t = LOOM_TYPE_Q8_0;
	const int64_t k = nb * 32, ys = KPACK_ROWS + 3;
	const size_t ws = nb * cpu_block_bytes(t), bytes = kpack_bytes(t, n, nb);
	uint8_t *w = malloc(n * ws), *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
	struct qdot_block *q = malloc((size_t)(m * nb) * sizeof(*q));
	struct qgemm_x *prep = malloc((size_t)(m * nb) * sizeof(*prep));
	float *x = malloc(k * sizeof(float)), *y = malloc(m * ys * sizeof(float));
	int bad = 0;

	ck_assert(w && p && q && prep && x && y && bytes);
	fill_weights(t, w, n * nb);
	for (int64_t b = 0; extreme && b < n * nb; b++) /* q all -128 or all 127 */
		memset(w + b * ws / nb + 2, b % 2 ? 0x80 : 0x7f, 32);
	kpack_pack_rows(t, w, ws, n, nb, p);
	for (int i = 0; i < m; i++) {
		fill_acts(x, k);
		for (int64_t e = 0; extreme && e < k; e++)
			x[e] = i % 2 ? -1.0f : 1.0f; /* every q +127 or -127 */
		qdot_quantize_row(x, q + i * nb, k);
		qgemm_row_prep(t, q + i * nb, k, prep + i * nb);
	}
	for (int64_t j0 = 0; j0 < n; j0 += KPACK_ROWS) {
		const int rows = n - j0 < KPACK_ROWS ? (int)(n - j0) : KPACK_ROWS;

		memset(y, 0xff, m * ys * sizeof(float)); /* NaN: unwritten */
		fn(kpack_group_at(t, p, nb, j0), rows, q, prep, m, nb, y, ys, j0 % 32 == 0);
		for (int i = 0; i < m; i++)
			for (int r = 0; r < ys; r++) {
				const float got = y[i * ys + r];
				float want;

				if (r >= rows) {
					bad += !isnan(got);
					continue;
				}
				want = qgemm_ref(t, w + (j0 + r) * ws, q + i * nb, k);
				if (memcmp(&got, &want, sizeof(got)) && bad++ < 4)
					printf("q8_0 in place nb=%lld m=%d row %lld act %d: %a, want %a\n",
					       (long long)nb, m, (long long)(j0 + r), i, got, want);
			}
	}
	free(w), free(p), free(q), free(prep), free(x), free(y);
	return bad;
}

START_TEST(kpack32_inplace_matches_reference)
{
	static const int64_t nbs[] = { 1, 2, 3, 7, 18, 65 };
	static const int ms[] = { 1, 2, 3, 5, 16 };
	kpack_qgemm_fn fn = kpack_qgemm(QDOT_AVX2, LOOM_TYPE_Q8_0);
	int bad = 0, cases = 0;

	ck_assert(!kpack_qgemm(QDOT_AVX2, LOOM_TYPE_Q4_0) &&
		  kpack_qgemm_max_m(QDOT_AVX2, LOOM_TYPE_Q8_0) == INT64_MAX);
	if (!qdot_isa_supported(QDOT_AVX2)) {
		ck_assert(!fn);
		printf("SKIP: no AVX2: the in-place Q8_0 prefill GEMM is not run here\n");
		return;
	}
	ck_assert(fn);
	for (size_t c = 0; c < sizeof(nbs) / sizeof(nbs[0]); c++)
		for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++, cases += 2) {
			bad += check_q8_inplace(fn, 37, nbs[c], ms[i], false);
			bad += check_q8_inplace(fn, 21, nbs[c], ms[i], true);
		}
	printf("q8_0 in place: %d cases, %d outputs off\n", cases, bad);
	ck_assert_int_eq(bad, 0);
}
END_TEST

/*
 * The 32-value formats' panels with f16 scales and minima a GGUF file can
 * hold besides ordinary ones (NaNs of both kinds and signs, infinities,
 * subnormals, signed zeros): widened as cpu_fp16_to_f32() does, bit for
 * bit (vcvtph2ps alone would quiet a signalling NaN).
 */
START_TEST(kpack32_panel_special_scales)
{
	static const uint16_t special[] = { 0x7c01, 0xfd00, 0x7e00, 0x7c00, 0xfc00,
					    0x0001, 0x83ff, 0x8000, 0x0000, 0x3c00 };
	const int64_t n = 21, nb = 5, nsp = sizeof(special) / sizeof(special[0]);
	int bad = 0;

	for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
		const uint32_t t = formats[f];
		const size_t ws = nb * cpu_block_bytes(t), bytes = kpack_bytes(t, n, nb);
		const size_t pbytes = qgemm_panel_bytes(t, nb * 32);
		uint8_t *w, *p, *want, *got;

		if (t == LOOM_TYPE_MXFP4) /* not packed */
			continue;
		w = malloc(n * ws), p = aligned_alloc(64, (bytes + 63) / 64 * 64);
		want = aligned_alloc(64, pbytes), got = aligned_alloc(64, pbytes);
		ck_assert(w && p && want && got);
		fill_weights(t, w, n * nb);
		for (int64_t b = 0; b < n * nb; b++) {
			memcpy(w + b * cpu_block_bytes(t), &special[b % nsp], 2);
			if (cpu_format_has_min(t))
				memcpy(w + b * cpu_block_bytes(t) + 2, &special[(b + 3) % nsp], 2);
		}
		bad += pack_and_compare_panels(t, w, ws, p, n, nb, want, got);
		free(w), free(p), free(want), free(got);
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(qgemm_match_reference)
{
	static const uint32_t types[] = { LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1,
					  LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_Q2_K,
					  LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K,
					  LOOM_TYPE_Q6_K };
	static const int64_t ks[] = { 32, 64, 96, 544, 576, 1536 };
	enum { M = 11, N = 16 };
	static uint8_t w[N * 1536 / 32 * 34], panel[2 * 1536 / 16 * 384] __attribute__((aligned(64)));
	static struct qdot_block q[M * 1536 / 32];
	static struct qgemm_x prep[M * 1536 / 16];
	static float x[M * 1536], y[M * N];
	int bad = 0, cases = 0;

	for (size_t f = 0; f < sizeof(types) / sizeof(types[0]) * 3; f++) {
		uint32_t t = types[f / 3];
		enum qdot_isa isa = kpack_isas[f % 3];
		bool kq = t >= LOOM_TYPE_Q2_K && t <= LOOM_TYPE_Q6_K;

		if (!qgemm_supported(isa, t)) {
			printf("qgemm %s: not run here, skipped\n", qdot_isa_name(isa));
			continue;
		}
		for (size_t c = 0; c < sizeof(ks) / sizeof(ks[0]); c++) {
			int64_t k = ks[c], nb = k / 32, nc = k / qgemm_block(t);
			size_t ws = (size_t)(k / cpu_block_elems(t)) * cpu_block_bytes(t);

			if (k % cpu_block_elems(t))
				continue;
			for (int rows = 1; rows <= N; rows += 5, cases++) {
				if (kq)
					fill_k(t, w, N * k / 256);
				else
					fill_weights(t, w, N * nb);
				fill_acts(x, M * k);
				for (int i = 0; i < M; i++) {
					qdot_quantize_row(x + i * k, q + i * nb, k);
					qgemm_row_prep(t, q + i * nb, k, prep + i * nc);
				}
				ck_assert(qgemm_panel_bytes(t, k) <= sizeof(panel));
				memset(y, 0xff, sizeof(y)); /* NaN: unwritten */
				qgemm_panel(t, w, ws, 0, rows, k, false, panel);
				qgemm_run(isa, t, panel, rows, q, prep, M, k, y, N);
				for (int i = 0; i < M; i++)
					for (int r = 0; r < N; r++) {
						float want = qgemm_ref(t, w + r * ws, q + i * nb, k);

						if (r >= rows) {
							bad += !isnan(y[i * N + r]); /* not written */
						} else if (memcmp(&y[i * N + r], &want, 4)) {
							printf("qgemm %s type %u k=%lld rows=%d [%d][%d]: %.9g vs %.9g\n",
							       qdot_isa_name(isa), t, (long long)k, rows, i, r,
							       y[i * N + r], want);
							bad++;
						} else if (!kq && !near_f64(t, w + r * ws, x + i * k,
									    q + i * nb, nb, want)) {
							bad++;
						} else if (kq && !near_dequant(t, w + r * ws, q + i * nb, k,
									       want)) {
							bad++;
						}
					}
			}
		}
	}
	printf("qgemm: %d cases, %d off\n", cases, bad);
	ck_assert_int_eq(bad, 0);
}
END_TEST

/* qgemm at the largest sums its int16 steps can meet (extreme_w.h):
 * weights all at their largest u, activation rows all +127 and all -127,
 * every set against qgemm_ref() bit for bit. */
START_TEST(qgemm_extreme_sums)
{
	static const uint32_t types[] = { LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1,
					  LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_Q2_K,
					  LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K,
					  LOOM_TYPE_Q6_K };
	enum { M = 2, N = 16, K = 512 };
	static uint8_t w[N * K / 32 * 34], panel[2 * K / 16 * 384] __attribute__((aligned(64)));
	static struct qdot_block q[M * K / 32];
	static struct qgemm_x prep[M * K / 16];
	static float x[M * K], y[M * N];
	int bad = 0;

	for (int e = 0; e < K; e++) {
		x[e] = 1.0f;
		x[K + e] = -1.0f;
	}
	for (size_t f = 0; f < sizeof(types) / sizeof(types[0]) * 3; f++) {
		const uint32_t t = types[f / 3];
		const enum qdot_isa isa = kpack_isas[f % 3];
		const int64_t nblk = K / cpu_block_elems(t), nc = K / qgemm_block(t);
		const size_t ws = (size_t)nblk * cpu_block_bytes(t);

		if (!qgemm_supported(isa, t))
			continue;
		for (int64_t b = 0; b < N * nblk; b++)
			extreme_block(t, w + b * cpu_block_bytes(t), cpu_block_bytes(t));
		for (int i = 0; i < M; i++) {
			qdot_quantize_row(x + i * K, q + i * K / 32, K);
			ck_assert_int_eq(abs(q[i * K / 32].q[0]), 127);
			qgemm_row_prep(t, q + i * K / 32, K, prep + i * nc);
		}
		qgemm_panel(t, w, ws, 0, N, K, false, panel);
		qgemm_run(isa, t, panel, N, q, prep, M, K, y, N);
		for (int i = 0; i < M; i++)
			for (int r = 0; r < N; r++) {
				float want = qgemm_ref(t, w + r * ws, q + i * K / 32, K);

				if (memcmp(&y[i * N + r], &want, 4)) {
					printf("qgemm %s type %u extreme [%d][%d]: %.9g vs %.9g\n",
					       qdot_isa_name(isa), t, i, r, y[i * N + r], want);
					bad++;
				}
			}
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

/* The GEMVs at the largest sums their int16 steps can meet (extreme_w.h):
 * weights all at their largest u against activations all +127 and all
 * -127, every set's GGUF-layout kernel, packed kernel and many-row packed
 * kernel (4 rows) against its reference (qdot_ref()) bit for bit. */
START_TEST(qdot_extreme_sums)
{
	enum { N = 16, NB = 24 };
	static uint8_t w[N * NB * 34], p[N * NB * 40] __attribute__((aligned(64)));
	enum { M = 4 };
	static struct qdot_block q[NB], qm[M * NB];
	static float x[NB * 32], sc[(NB + 15) / 16 * 32], y[N + 2], ym[M * N];
	int bad = 0;

	for (int f = 0; f < N_FORMATS; f++) {
		const uint32_t t = formats[f];
		const size_t bb = cpu_block_bytes(t), ws = NB * bb;

		if (t == LOOM_TYPE_MXFP4)
			continue; /* no extreme_block() */
		for (int b = 0; b < N * NB; b++)
			extreme_block(t, w + b * bb, bb);
		ck_assert_uint_le(kpack_bytes(t, N, NB), sizeof(p));
		kpack_group(t, w, ws, N, NB, p);
		for (int sign = 1; sign >= -1; sign -= 2) {
			for (int e = 0; e < NB * 32; e++)
				x[e] = (float)sign;
			qdot_quantize_row(x, q, NB * 32);
			ck_assert_int_eq(q[0].q[0], 127 * sign);
			qdot_row_scales(q, NB, sc);
			for (int i = 0; i < M; i++)
				memcpy(qm + i * NB, q, sizeof(q));
			for (int i = 0; i < QDOT_N_ISA; i++) {
				const float want = qdot_ref(i, t, w, q, NB);
				kpack_fn fn = kpack_kernel(i, t);

				if (!qdot_isa_supported(i))
					continue;
				qdot_kernel(i, t)(w, ws, q, sc, NB, y, N);
				if (fn) /* its last two rows */
					fn(p, q, NB, y + N, N - 2, N);
				for (int r = 0; r < (fn ? N + 2 : N); r++)
					if (memcmp(&y[r], &want, 4)) {
						printf("qdot %s type %u extreme x %+d %s row %d: %.9g vs %.9g\n",
						       qdot_isa_name(i), t, sign, r < N ? "GGUF" : "packed",
						       r < N ? r : r - 2, y[r], want);
						bad++;
					}
				if (kpack_kernel_m(i, t)) {
					kpack_kernel_m(i, t)(p, qm, M, NB, ym, N, 0, N);
					for (int r = 0; r < M * N; r++)
						if (memcmp(&ym[r], &want, 4)) {
							printf("qdot %s type %u extreme x %+d many-row %d, row %d: %.9g vs %.9g\n",
							       qdot_isa_name(i), t, sign, r / N, r % N, ym[r], want);
							bad++;
						}
				}
			}
		}
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

/* Every qgemm format, 1 to 35 activation rows (one, two and three tile
 * passes, full and partial), 1 to 16 weight rows. */
static int check_amx(enum amx_mode mode)
{
	static const uint32_t types[] = { LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1,
					  LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_Q2_K,
					  LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K,
					  LOOM_TYPE_Q6_K };
	static const int64_t ks[] = { 32, 256, 576 };
	static const int64_t ms[] = { 1, 16, 19, 35 };
	enum { M = 35, N = 16, KMAX = 576 };
	static uint8_t w[N * KMAX / 32 * 34], panel[2 * KMAX / 16 * 384] __attribute__((aligned(64)));
	static struct qdot_block q[M * KMAX / 32];
	static struct qgemm_x prep[M * KMAX / 16];
	static float x[M * KMAX], y[M * N], yv[M * N];
	int bad = 0, cases = 0;

	for (size_t f = 0; f < sizeof(types) / sizeof(types[0]); f++) {
		uint32_t t = types[f];
		bool kq = t >= LOOM_TYPE_Q2_K && t <= LOOM_TYPE_Q6_K;

		ck_assert(amx_supported(mode, t));
		for (size_t c = 0; c < sizeof(ks) / sizeof(ks[0]); c++) {
			int64_t k = ks[c], nb = k / 32, nc = k / qgemm_block(t);
			size_t ws = (size_t)(k / cpu_block_elems(t)) * cpu_block_bytes(t);

			if (k % cpu_block_elems(t))
				continue;
			for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++)
				for (int rows = 1; rows <= N; rows += 5, cases++) {
					int64_t m = ms[mi];

					if (kq)
						fill_k(t, w, N * k / 256);
					else
						fill_weights(t, w, N * nb);
					fill_acts(x, m * k);
					for (int i = 0; i < m; i++) {
						qdot_quantize_row(x + i * k, q + i * nb, k);
						qgemm_row_prep(t, q + i * nb, k, prep + i * nc);
					}
					memset(y, 0xff, sizeof(y)); /* NaN: unwritten */
					qgemm_panel(t, w, ws, 0, rows, k, false, panel);
					amx_qgemm_run(mode, t, panel, rows, q, prep, m, k, y, N);
					qgemm_run(QDOT_VNNI, t, panel, rows, q, prep, m, k, yv, N);
					for (int i = 0; i < m; i++)
						for (int r = 0; r < N; r++) {
							float want = qgemm_ref(t, w + r * ws, q + i * nb, k);

							if (r >= rows) {
								bad += !isnan(y[i * N + r]);
							} else if (memcmp(&y[i * N + r], &want, 4) ||
								   memcmp(&y[i * N + r], &yv[i * N + r], 4)) {
								if (bad < 5)
									printf("%s type %u k=%lld m=%lld rows=%d [%d][%d]: %.9g, VNNI %.9g, ref %.9g\n",
									       amx_mode_name(mode), t, (long long)k,
									       (long long)m, rows, i, r, y[i * N + r],
									       yv[i * N + r], want);
								bad++;
							}
						}
				}
		}
	}
	printf("%s: %d cases, %d off\n", amx_mode_name(mode), cases, bad);
	return bad;
}

START_TEST(amx_emulated_matches_vnni)
{
	if (!qdot_isa_supported(QDOT_VNNI)) {
		printf("amx-emu: no AVX-512 VNNI here (its float work and the VNNI twin), skipped\n");
		return;
	}
	ck_assert_int_eq(check_amx(AMX_EMU), 0);
}
END_TEST

START_TEST(amx_hardware_matches_vnni)
{
	char why[128];

	if (!qdot_isa_supported(QDOT_VNNI) || amx_request(why, sizeof(why))) {
		printf("amx: real AMX tiles not run here (%s), skipped\n",
		       qdot_isa_supported(QDOT_VNNI) ? why : "no AVX-512 VNNI");
		return;
	}
	ck_assert_int_eq(check_amx(AMX_HW), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("qdot");
	TCase *tc = tcase_create("kernels");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, quantize_contract);
	tcase_add_test(tc, quantize_simd_matches_c);
	tcase_add_loop_test(tc, kernels_match_reference, 0, QDOT_N_ISA);
	tcase_add_test(tc, layouts_agree);
	tcase_add_test(tc, qgemm_match_reference);
	tcase_add_test(tc, qgemm_extreme_sums);
	tcase_add_test(tc, qdot_extreme_sums);
	tcase_add_test(tc, kpack32_matches_reference);
	tcase_add_test(tc, kpack32_rows_match_gemm);
	tcase_add_test(tc, kpack32_panel_special_scales);
	tcase_add_test(tc, kpack32_inplace_matches_reference);
	tcase_add_test(tc, amx_emulated_matches_vnni);
	tcase_add_test(tc, amx_hardware_matches_vnni);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
