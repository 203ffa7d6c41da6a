/*
 * cpu.so's K-quant integer dot products (backends/cpu/qdot_k.c), every
 * kernel set this machine runs, Q2_K .. Q6_K, 1 to 9 super-blocks, 5 rows
 * in one call (a group of 4 and a rest) and row 0 alone:
 *
 *   bitwise   kernel == qdot_k_ref() (the same integer sums, the same
 *             fused multiply-adds in the same order);
 *   exact     |kernel - f64 dot of the dequantized weights (kernels.c's
 *             scalar dequantization, itself checked against the kquant
 *             plugin by backend_kdequant) and the dequantized 8-bit
 *             activations| <= 1e-5 * sum_e |xq_e| * (|w_e| + max_b |w|)
 *             (float rounding only: the scale products, the int -> float
 *             conversion of sums that can exceed 2^24, the dequantized
 *             weights' own rounding, which the max term covers for the
 *             formats whose minimum cancels d * sc * q);
 *   quantized |kernel - f64 dot with the original f32 activations|
 *             <= sum_g xd_g / 2 * sum_{e in g} |w_e| + the exact bound,
 *             g over the groups of 32 (round to nearest moves x by at
 *             most half its group's step).
 *
 * Plus the activation quantizer's own contract: one scale per 32 values,
 * that group's max |x| / 127; |q| <= 127, x within half a step of d*q,
 * bsums the sums of q over 16 values, NaN confined to its group. Prints the largest error relative to sum |w * x| seen.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "kpack.h"
#include "kpack_check.h"
#include "qdot.h"
#include "qgemm.h"
#include "hard_acts.h"

static const uint32_t formats[] = {
	LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K,
};
#define N_FORMATS (int)(sizeof(formats) / sizeof(formats[0]))

static const int64_t block_counts[] = { 1, 2, 3, 6, 9 };
#define N_COUNTS (int)(sizeof(block_counts) / sizeof(block_counts[0]))
#define MAX_NB 9
#define ROWS 5

static uint64_t rng = 0x9e3779b97f4a7c15ull;

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

/* Offset of the f16 d in a super-block; dmin follows it where there is one. */
static int d_offset(uint32_t t)
{
	switch (t) {
	case LOOM_TYPE_Q2_K: return 80;
	case LOOM_TYPE_Q3_K: return 108;
	case LOOM_TYPE_Q6_K: return 208;
	default: return 0;
	}
}

static bool has_dmin(uint32_t t)
{
	return t == LOOM_TYPE_Q2_K || t == LOOM_TYPE_Q4_K || t == LOOM_TYPE_Q5_K;
}

/* Random quants and scales; d and dmin small positive halves. */
static void fill_weights(uint32_t t, uint8_t *w, int64_t nb)
{
	const size_t bb = cpu_block_bytes(t);

	for (size_t i = 0; i < nb * bb; i++)
		w[i] = (uint8_t)rnd32();
	for (int64_t b = 0; b < nb; b++) {
		uint16_t d = to_f16(0.0005f + 0.01f * (rndf() + 1.0f));
		uint16_t m = to_f16(0.0005f + 0.005f * (rndf() + 1.0f));

		memcpy(w + b * bb + d_offset(t), &d, 2);
		if (has_dmin(t))
			memcpy(w + b * bb + d_offset(t) + 2, &m, 2);
	}
}

/* Activations as a model has them: mostly small, a few outliers, and
 * now and then an all-zero super-block. */
static void fill_acts(float *x, int64_t k)
{
	for (int64_t i = 0; i < k; i++)
		x[i] = rndf() * (rnd32() % 16 == 0 ? 8.0f : 1.0f);
	if (k >= 512 && rnd32() % 4 == 0)
		memset(x + 256, 0, 256 * sizeof(float));
}

/* The largest |x| of group g of super-block b. */
static float group_amax(const float *x, int b, int g)
{
	float m = 0.0f;

	for (int e = 0; e < 32; e++)
		m = fmaxf(m, fabsf(x[256 * b + 32 * g + e]));
	return m;
}

START_TEST(quantize_contract)
{
	static float x[MAX_NB * 256];
	static struct qdot_kblock q[MAX_NB];

	for (int rep = 0; rep < 50; rep++) {
		fill_acts(x, MAX_NB * 256);
		qdot_k_quantize_row(x, q, MAX_NB * 256);
		for (int b = 0; b < MAX_NB; b++) {
			/* each group of 32 has its own scale: its own max / 127 */
			for (int g = 0; g < 8; g++)
				ck_assert_float_eq(q[b].d[g], group_amax(x, b, g) / 127.0f);
			for (int i = 0; i < 16; i++) {
				int sum = 0;

				for (int e = 16 * i; e < 16 * i + 16; e++) {
					float d = q[b].d[e / 32];

					ck_assert_int_le(abs(q[b].q[e]), 127);
					ck_assert_float_le(fabsf(x[256 * b + e] - d * q[b].q[e]),
							   d * 0.5001f + 1e-30f);
					sum += q[b].q[e];
				}
				ck_assert_int_eq(q[b].bsums[i], sum);
			}
		}
	}
	/* a NaN poisons its group of 32, not its neighbours */
	x[300] = NAN;
	qdot_k_quantize_row(x, q, 768);
	for (int b = 0; b < 3; b++)
		for (int g = 0; g < 8; g++)
			ck_assert(isnan(q[b].d[g]) == (b == 1 && g == 1));
	for (int e = 32; e < 64; e++)
		ck_assert_int_eq(q[1].q[e], 0);
}
END_TEST

/* Blocks a and b the same, but for the sign or payload of NaN scales. */
static bool kblock_same(const struct qdot_kblock *a, const struct qdot_kblock *b)
{
	if (memcmp(a->q, b->q, sizeof(a->q)) || memcmp(a->bsums, b->bsums, sizeof(a->bsums)))
		return false;
	for (int g = 0; g < 8; g++)
		if (memcmp(&a->d[g], &b->d[g], sizeof(float)) && !(isnan(a->d[g]) && isnan(b->d[g])))
			return false;
	return true;
}

/* The SIMD quantizer gives the plain C one's super-blocks byte for byte,
 * also with zeros, ties at .5 steps, huge and tiny values and non-finite
 * ones (a non-finite group's d is a NaN of either sign bit). */
START_TEST(quantize_simd_matches_c)
{
	static float x[MAX_NB * 256];
	static struct qdot_kblock a[MAX_NB], b[MAX_NB];
	int bad = 0;

	for (int rep = 0; rep < 100; rep++) {
		fill_acts(x, MAX_NB * 256);
		hard_acts(x, MAX_NB * 256, rep % 2 ? 256 : 32, rep % 4 == 0, rnd32);
		qdot_k_quantize_row(x, a, MAX_NB * 256);
		qdot_k_quantize_row_c(x, b, MAX_NB * 256);
		for (int i = 0; i < MAX_NB; i++)
			bad += !kblock_same(&a[i], &b[i]);
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

static double worst_rel; /* largest |kernel - f32 dot| / sum |w * x| */

/* The kernel's y of weight row w against f64 dots: in bounds? */
static bool near_f64(uint32_t t, const uint8_t *w, const float *x, const struct qdot_kblock *q,
		     int64_t nb, float got)
{
	static float wf[MAX_NB * 256];
	double exact = 0, quant = 0, tol = 0, qerr = 0, mag = 0;

	cpu_dequant_row(CPU_ISA_SCALAR, t, w, wf, nb * 256);
	for (int64_t b = 0; b < nb; b++) {
		double wabs = 0, wmax = 0; /* wabs: sum |w| over the group of 32 */

		for (int e = 0; e < 256; e++)
			wmax = fmax(wmax, fabs(wf[256 * b + e]));
		for (int e = 0; e < 256; e++) {
			double we = wf[256 * b + e], xe = x[256 * b + e];
			double xq = (double)q[b].d[e / 32] * q[b].q[e];

			exact += we * xe;
			quant += we * xq;
			tol += 1e-5 * fabs(xq) * (fabs(we) + wmax);
			mag += fabs(we * xe);
			wabs += fabs(we);
			if (e % 32 == 31) { /* group e / 32 done */
				qerr += wabs * (double)q[b].d[e / 32] / 2.0;
				wabs = 0;
			}
		}
	}
	if (mag > 0 && fabs(got - exact) / mag > worst_rel)
		worst_rel = fabs(got - exact) / mag;
	if (fabs(got - quant) <= tol && fabs(got - exact) <= qerr * 1.0001 + tol)
		return true;
	printf("type %u nb=%lld: %.9g, f64 %.9g (quantized x: %.9g, tol %.3g)\n", t,
	       (long long)nb, got, exact, quant, tol);
	return false;
}

static int check_case(enum qdot_isa isa, uint32_t t, int64_t nb)
{
	static uint8_t w[ROWS * MAX_NB * 210];
	static float x[MAX_NB * 256];
	static struct qdot_kblock q[MAX_NB];
	const size_t ws = nb * cpu_block_bytes(t);
	qdot_k_fn fn = qdot_k_kernel(isa, t);
	float y[ROWS], y0;
	int bad = 0;

	fill_weights(t, w, ROWS * nb);
	fill_acts(x, nb * 256);
	qdot_k_quantize_row(x, q, nb * 256);
	fn(w, ws, q, nb, y, ROWS);
	fn(w, ws, q, nb, &y0, 1);
	for (int r = 0; r < ROWS; r++) {
		float want = qdot_k_ref(t, w + r * ws, q, nb);

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
		printf("qdot_k %s: not supported here, skipped\n", qdot_isa_name(isa));
		return;
	}
	worst_rel = 0;
	for (int f = 0; f < N_FORMATS; f++)
		for (int c = 0; c < N_COUNTS; c++)
			for (int rep = 0; rep < 20; rep++, cases++)
				bad += check_case(isa, formats[f], block_counts[c]) != 0;
	printf("qdot_k %s: %d cases, %d off; worst |y - f32 dot| / sum |w x| = %.2e\n",
	       qdot_isa_name(isa), cases, bad, worst_rel);
	ck_assert_int_eq(bad, 0);
}
END_TEST

/* A wrong bit anywhere in the weights must show: the reference is not a
 * constant of the weights (guards the bitwise test against a kernel and
 * reference that both ignore some field). */
START_TEST(every_field_counts)
{
	static uint8_t w[210 * 2];
	static float x[256 * 2];
	static struct qdot_kblock q[2];

	fill_acts(x, 512);
	for (int i = 0; i < 512; i++)
		x[i] = x[i] != 0.0f ? x[i] : 0.5f;
	qdot_k_quantize_row(x, q, 512);
	for (int f = 0; f < N_FORMATS; f++) {
		uint32_t t = formats[f];
		size_t bb = cpu_block_bytes(t);
		int same = 0;

		fill_weights(t, w, 2);
		for (size_t i = 0; i < bb; i++) {
			float a = qdot_k_ref(t, w, q, 2), b;

			if ((int)i >= d_offset(t) && (int)i < d_offset(t) + 4)
				continue; /* the f16 scales: flipping a bit may do little */
			w[bb + i] ^= 0x5a;
			b = qdot_k_ref(t, w, q, 2);
			w[bb + i] ^= 0x5a;
			same += a == b;
		}
		/* a few flips can cancel out (a scale and a quant moving
		 * together), but not many */
		ck_assert_msg(same < (int)bb / 20, "type %u: %d of %zu bytes change nothing", t,
			      same, bb);
	}
}
END_TEST

/*
 * The rows-in-lanes layout (kpack.h): every row packed then unpacked is
 * its GGUF row byte for byte, and the kernel over any row range [j0, j1)
 * gives qdot_k_ref() of each row bit for bit and writes nothing else.
 * Row counts that fill no group, one group, and groups plus a rest. And
 * the prefill panel made from a packed group is the GGUF rows' panel.
 */
/* kpack_panel() of each group against qgemm_panel() of its GGUF rows:
 * the same bytes and floats for every row the group holds. */
static int check_kpanel(uint32_t t, const uint8_t *w, size_t ws, const uint8_t *p, int64_t n,
			int64_t nb)
{
	const int B = qgemm_block(t), groups = B / 4;
	const size_t bytes = qgemm_panel_bytes(t, nb * 256), bb = qgemm_panel_bytes(t, B);
	const size_t dw = (size_t)groups * 64, mw = dw + 64;
	uint8_t *want = malloc(bytes), *got = malloc(bytes);
	int bad = 0;

	ck_assert(want && got && bytes == (size_t)(nb * 256 / B) * bb);
	for (int64_t j0 = 0; j0 < n; j0 += KPACK_ROWS) {
		int rows = n - j0 < KPACK_ROWS ? (int)(n - j0) : KPACK_ROWS;

		qgemm_panel(t, w, ws, j0, rows, nb * 256, false, want);
		/* the 512-bit, 256-bit and C builders, where the CPU runs them */
		for (int width = 512; width >= 0; width -= 256) {
			kpack_panel_width(t, p, nb, j0, got, width);
			for (int64_t blk = 0; blk < nb * 256 / B; blk++) {
				const uint8_t *a = want + blk * bb, *b = got + blk * bb;

				for (int r = 0; r < rows; r++) {
					bool same = !memcmp(a + dw + 4 * r, b + dw + 4 * r, 4) &&
						    !memcmp(a + mw + 4 * r, b + mw + 4 * r, 4);

					for (int g = 0; g < groups; g++)
						same &= !memcmp(a + 64 * g + 4 * r, b + 64 * g + 4 * r, 4);
					if (!same) {
						printf("kpack_panel type %u nb=%lld width %d: row %lld, block %lld differs\n",
						       t, (long long)nb, width, (long long)(j0 + r), (long long)blk);
						bad++;
					}
				}
			}
		}
	}
	free(want);
	free(got);
	return bad;
}

/* Every kernel set with a rows-in-lanes kernel; each must give qdot_k_ref()
 * (the same on every set). */
static const enum qdot_isa kpack_isas[] = { QDOT_VNNI, QDOT_AVXVNNI, QDOT_AVX2 };

static int check_kpack(uint32_t t, int64_t n, int64_t nb)
{
	const size_t ws = nb * cpu_block_bytes(t), bytes = kpack_bytes(t, n, nb);
	uint8_t *w = malloc(n * ws);
	uint8_t *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
	float x[MAX_NB * 256], want[40];
	struct qdot_kblock q[MAX_NB];
	int bad = 0;

	ck_assert(w && p && bytes && n <= 40);
	fill_weights(t, w, n * nb);
	for (int64_t g = 0; g * KPACK_ROWS < n; g++)
		kpack_group(t, w + g * KPACK_ROWS * ws, ws,
			    (int)(n - g * KPACK_ROWS < KPACK_ROWS ? n - g * KPACK_ROWS : KPACK_ROWS),
			    nb, p + g * KPACK_ROWS * kpack_row_share(t, nb));
	bad += kpack_unpack_differs(t, w, ws, p, n, nb);
	bad += check_kpanel(t, w, ws, p, n, nb);
	fill_acts(x, nb * 256);
	qdot_k_quantize_row(x, q, nb * 256);
	for (int64_t j = 0; j < n; j++)
		want[j] = qdot_k_ref(t, w + j * ws, q, nb);
	for (size_t i = 0; i < sizeof(kpack_isas) / sizeof(kpack_isas[0]); i++) {
		kpack_fn fn = kpack_kernel(kpack_isas[i], t);

		if (fn)
			bad += kpack_ranges_differ(t, fn, p, q, n, nb, want, rnd32);
	}
	free(w);
	free(p);
	return bad;
}

/*
 * The prefill GEMM that reads a packed Q4_K / Q5_K group in place
 * (kpack_qgemm(), AVX-512 VNNI) against qgemm_run() of the group's
 * kpack_panel() (itself held to the GGUF rows' panel above): the same
 * bits for m activation rows at a stride, in every row the group holds,
 * and nothing written outside them. Returns the outputs that differ.
 */
static int check_kqgemm(uint32_t t, const uint8_t *p, int64_t n, int64_t nb, int m)
{
	const int64_t k = nb * 256, nc = k / qgemm_block(t), ys = KPACK_ROWS + 3;
	kpack_qgemm_fn fn = kpack_qgemm(QDOT_VNNI, t);
	uint8_t *panel = aligned_alloc(64, (qgemm_panel_bytes(t, k) + 63) / 64 * 64);
	struct qdot_block *x = malloc((size_t)(m * k / 32) * sizeof(*x));
	struct qgemm_x *prep = malloc((size_t)(m * nc) * sizeof(*prep));
	float *a = malloc(k * sizeof(float)), *want = malloc(m * ys * sizeof(float));
	float *got = malloc(m * ys * sizeof(float));
	int bad = 0;

	ck_assert(fn && panel && x && prep && a && want && got);
	for (int i = 0; i < m; i++) {
		fill_acts(a, k);
		qdot_quantize_row(a, x + i * (k / 32), k);
		qgemm_row_prep(t, x + i * (k / 32), k, prep + i * nc);
	}
	for (int64_t j0 = 0; j0 < n; j0 += KPACK_ROWS) {
		const int rows = n - j0 < KPACK_ROWS ? (int)(n - j0) : KPACK_ROWS;

		memset(want, 0x7f, m * ys * sizeof(float));
		memset(got, 0x7f, m * ys * sizeof(float));
		kpack_panel(t, p, nb, j0, panel);
		qgemm_run(QDOT_VNNI, t, panel, rows, x, prep, m, k, want, ys);
		fn(kpack_group_at(t, p, nb, j0), rows, x, prep, m, nb, got, ys, j0 % 32 == 0);
		for (int64_t e = 0; e < m * ys; e++)
			if (memcmp(&want[e], &got[e], sizeof(float))) {
				if (bad++ < 4)
					printf("kpack_qgemm type %u nb=%lld m=%d: row %lld, output %lld: %a, panel %a\n",
					       t, (long long)nb, m, (long long)(j0 + e % ys),
					       (long long)(e / ys), got[e], want[e]);
			}
	}
	free(panel);
	free(x);
	free(prep);
	free(a);
	free(want);
	free(got);
	return bad;
}

START_TEST(kpack_qgemm_matches_panel)
{
	static const uint32_t types[] = { LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K };
	static const int ms[] = { 1, 7, 8, 9, 17 };
	const int64_t n = 37;
	int bad = 0, cases = 0;

	ck_assert(!kpack_qgemm(QDOT_AVX2, LOOM_TYPE_Q4_K) && !kpack_qgemm(QDOT_VNNI, LOOM_TYPE_Q6_K));
	if (!qdot_isa_supported(QDOT_VNNI)) {
		printf("SKIP: no AVX-512 VNNI: the in-place prefill GEMM is not run here\n");
		return;
	}
	for (size_t f = 0; f < sizeof(types) / sizeof(types[0]); f++)
		for (int64_t nb = 1; nb <= 3; nb += 2) {
			const uint32_t t = types[f];
			const size_t ws = nb * cpu_block_bytes(t), bytes = kpack_bytes(t, n, nb);
			uint8_t *w = malloc(n * ws), *p = aligned_alloc(64, (bytes + 63) / 64 * 64);

			ck_assert(w && p);
			fill_weights(t, w, n * nb);
			kpack_pack_rows(t, w, ws, n, nb, p);
			for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++, cases++)
				bad += check_kqgemm(t, p, n, nb, ms[i]);
			free(w);
			free(p);
		}
	printf("kpack in-place prefill GEMM: %d cases, %d outputs off\n", cases, bad);
	ck_assert_int_eq(bad, 0);
}
END_TEST

/* f16 scales a GGUF file can hold besides ordinary ones: signalling and
 * quiet NaNs of both signs, infinities, subnormals, zeros, one. */
static const uint16_t special_f16[] = { 0x7c01, 0xfd00, 0x7e00, 0x7c00, 0xfc00,
					0x0001, 0x83ff, 0x8000, 0x0000, 0x3c00 };

/* Byte offsets of a GGUF K-quant super-block's d and dmin (dmin -1: none). */
static void k_scale_offsets(uint32_t t, int *d, int *dmin)
{
	switch (t) {
	case LOOM_TYPE_Q2_K: *d = 80, *dmin = 82; break;
	case LOOM_TYPE_Q3_K: *d = 108, *dmin = -1; break;
	case LOOM_TYPE_Q6_K: *d = 208, *dmin = -1; break;
	default: *d = 0, *dmin = 2; break; /* Q4_K, Q5_K */
	}
}

/*
 * The panel builders widen every f16 scale as cpu_fp16_to_f32() does,
 * bit for bit: NaNs (a signalling one stays signalling), infinities,
 * subnormals and signed zeros too (the vector builders use vcvtph2ps,
 * which quiets a signalling NaN unless they take care).
 */
START_TEST(kpanel_special_scales)
{
	static const uint32_t types[] = { LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K,
					  LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K };
	const int64_t n = 21, nb = 3, nsp = sizeof(special_f16) / sizeof(special_f16[0]);
	int bad = 0;

	for (size_t f = 0; f < sizeof(types) / sizeof(types[0]); f++) {
		const uint32_t t = types[f];
		const size_t ws = nb * cpu_block_bytes(t), bytes = kpack_bytes(t, n, nb);
		uint8_t *w = malloc(n * ws), *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
		int od, om;

		ck_assert(w && p);
		k_scale_offsets(t, &od, &om);
		fill_weights(t, w, n * nb);
		for (int64_t b = 0; b < n * nb; b++) {
			memcpy(w + b * cpu_block_bytes(t) + od, &special_f16[b % nsp], 2);
			if (om >= 0)
				memcpy(w + b * cpu_block_bytes(t) + om, &special_f16[(b + 3) % nsp], 2);
		}
		for (int64_t g = 0; g * KPACK_ROWS < n; g++)
			kpack_group(t, w + g * KPACK_ROWS * ws, ws,
				    (int)(n - g * KPACK_ROWS < KPACK_ROWS ? n - g * KPACK_ROWS : KPACK_ROWS),
				    nb, p + g * KPACK_ROWS * kpack_row_share(t, nb));
		bad += check_kpanel(t, w, ws, p, n, nb);
		if (kpack_qgemm(QDOT_VNNI, t) && qdot_isa_supported(QDOT_VNNI))
			bad += check_kqgemm(t, p, n, nb, 9);
		free(w);
		free(p);
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

/*
 * The many-row kernels (kpack_kernel_m(): AVX-512 VNNI for Q4_K, Q5_K, Q6_K;
 * AVX2 also for Q2_K and Q3_K):
 * m activation rows at once over a random row range, each row bit for bit
 * qdot_k_ref() (the one-row kernels' bits), nothing written outside the
 * range or the rows.
 */
struct rows_k {
	uint32_t t;
	const uint8_t *w;
	size_t ws;
	const struct qdot_kblock *q;
	int64_t nb;
};

static float want_rows_k(const void *ctx, int i, int64_t j)
{
	const struct rows_k *c = ctx;

	return qdot_k_ref(c->t, c->w + j * c->ws, c->q + i * c->nb, c->nb);
}

static int check_kpack_rows(enum qdot_isa isa, uint32_t t, int64_t n, int64_t nb, int m)
{
	const size_t ws = nb * cpu_block_bytes(t), bytes = kpack_bytes(t, n, nb);
	uint8_t *w = malloc(n * ws);
	uint8_t *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
	float *x = malloc(nb * 256 * sizeof(float));
	struct qdot_kblock *q = malloc(m * nb * sizeof(*q));
	kpack_mfn fn = kpack_kernel_m(isa, t);
	int64_t j0 = (int64_t)(rnd32() % n), j1 = j0 + 1 + (int64_t)(rnd32() % (n - j0));
	int bad;

	ck_assert(w && p && x && q && bytes && fn);
	fill_weights(t, w, n * nb);
	kpack_pack_rows(t, w, ws, n, nb, p);
	for (int i = 0; i < m; i++) {
		fill_acts(x, nb * 256);
		qdot_k_quantize_row(x, q + i * nb, nb * 256);
	}
	bad = kpack_rows_differ(t, fn, p, q, m, n, nb, j0, j1, want_rows_k,
				&(struct rows_k){ t, w, ws, q, nb });
	free(w);
	free(p);
	free(x);
	free(q);
	return bad;
}

START_TEST(kpack_rows_match_reference)
{
	static const enum qdot_isa isas[] = { QDOT_VNNI, QDOT_AVX2 };
	static const uint32_t types[] = { LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K,
					  LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K };
	static const int ms[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17 };
	int bad = 0, cases = 0;

	for (size_t s = 0; s < sizeof(isas) / sizeof(isas[0]); s++) {
		if (!qdot_isa_supported(isas[s])) {
			printf("SKIP: no %s: its many-row kernels are not run here\n",
			       qdot_isa_name(isas[s]));
			continue;
		}
		for (size_t f = 0; f < sizeof(types) / sizeof(types[0]); f++) {
			/* AVX-512 VNNI has none for Q2_K and Q3_K; AVX2 has all */
			if (!kpack_kernel_m(isas[s], types[f])) {
				ck_assert(isas[s] != QDOT_AVX2 &&
					  (types[f] == LOOM_TYPE_Q2_K || types[f] == LOOM_TYPE_Q3_K));
				continue;
			}
			for (int64_t nb = 1; nb <= 4; nb += 3)
				for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++, cases++)
					bad += check_kpack_rows(isas[s], types[f], 37, nb,
								ms[i]) != 0;
		}
	}
	printf("kpack many-row K kernels: %d cases, %d off\n", cases, bad);
	ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(kpack_matches_reference)
{
	static const int64_t ns[] = { 1, 5, 16, 21, 37 };
	static const uint32_t types[] = { LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K,
					  LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K };

	for (size_t i = 0; i < sizeof(kpack_isas) / sizeof(kpack_isas[0]); i++)
		printf("kpack kernels %s: %s\n", qdot_isa_name(kpack_isas[i]),
		       kpack_kernel(kpack_isas[i], LOOM_TYPE_Q4_K) ? "checked" :
								      "not run here");
	for (int f = 0; f < (int)(sizeof(types) / sizeof(types[0])); f++) {
		int bad = 0, cases = 0;

		ck_assert(kpack_format(types[f]));
		for (int c = 0; c < N_COUNTS; c++)
			for (int i = 0; i < (int)(sizeof(ns) / sizeof(ns[0])); i++, cases++)
				bad += check_kpack(types[f], ns[i], block_counts[c]) != 0;
		printf("kpack type %u: %d cases, %d off\n", types[f], cases, bad);
		ck_assert_int_eq(bad, 0);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("qdot_k");
	TCase *tc = tcase_create("kernels");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, quantize_contract);
	tcase_add_test(tc, quantize_simd_matches_c);
	tcase_add_loop_test(tc, kernels_match_reference, 0, QDOT_N_ISA);
	tcase_add_test(tc, every_field_counts);
	tcase_add_test(tc, kpack_matches_reference);
	tcase_add_test(tc, kpack_rows_match_reference);
	tcase_add_test(tc, kpanel_special_scales);
	tcase_add_test(tc, kpack_qgemm_matches_panel);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
