/*
 * cpu.so's float prefill GEMM (backends/cpu/fgemm.c) against its plain C
 * reference, bit for bit:
 *
 * Each case runs on every kernel set the CPU has (AVX-512F, AVX2):
 *
 *   panel     fgemm_panel_rows() puts value kk of row r at
 *             panel[kk * FGEMM_ROWS + r] and zeros past the rows given,
 *             for every row count and k (the 16x16 register transpose
 *             or 8x8 one, and the scalar tail);
 *   run       every y[i][r] fgemm_run() writes equals fgemm_ref(), the
 *             chain of fmaf in k order, for m of 1 to 101 (every tile
 *             height of both sets, tails, the AVX2 set's 48-row blocks), 1 to 32 valid rows and k across the
 *             256-value passes (1 .. 600); nothing outside the valid
 *             rows, nor past row m, is written;
 *   half      fgemm_panel_half() (AVX2) turns f16 and bf16 rows of any
 *             bits into the panel cpu_dequant_row() and
 *             fgemm_panel_rows() make of them, bit for bit;
 *   f64       and within float rounding of an f64 dot product
 *             (|err| <= k * 2^-23 * sum |x w|), so a reference that were
 *             wrong in the same way as the kernel would still fail.
 *
 * The bf16 pair path (fast mode, bf16 weights, AVX512_BF16):
 *
 *   round     fgemm_pairs_x() (vcvtne2ps2bf16) equals fgemm_bf16_round()
 *             on random floats, ties, infinities, NaNs and denormals;
 *   pairs     fgemm_pairs_run() equals fgemm_pairs_ref() bit for bit
 *             (the same shapes as above, normal values), and is within
 *             float rounding of the f64 dot of the bf16 values.
 *
 * AMX-BF16 (amx.h, the same panels as B tiles; AVX-512 hosts): through
 * its C tile emulation, and through the instructions where the CPU has them and the
 * kernel grants tile state, amx_pairs_run() equals amx_pairs_ref() bit
 * for bit, tails of fewer than 16 pairs included.
 *
 * Skips (77) on CPUs without AVX2 and FMA; the pair cases print a skip
 * line and pass on CPUs without AVX512_BF16.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "cpu.h"
#include "fgemm.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rndf(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (float)(int32_t)((rng * 0x2545f4914f6cdd1dull) >> 32) / 2147483648.0f;
}

static const int64_t ks[] = { 1, 5, 16, 17, 31, 255, 256, 257, 600 };
#define N_KS (int)(sizeof(ks) / sizeof(ks[0]))
#define MAX_K 600
#define MAX_M 101
#define Y_PAD 6 /* activation rows past m whose y must stay untouched */
/* m of the run cases: every tile height of both sets, and around the
 * AVX2 set's blocks of 48 activation rows */
static const int64_t ms[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 27, 40,
			      47, 48, 49, 53, 96, 101 };
#define N_MS (int)(sizeof(ms) / sizeof(ms[0]))
#define SENTINEL 12345.0f

/* The kernel sets this CPU runs, the best first. */
static int kernel_sets(enum cpu_isa sets[2])
{
	int n = 0;

	if (cpu_detect_isa() == CPU_ISA_AVX512)
		sets[n++] = CPU_ISA_AVX512;
	if (cpu_detect_isa() >= CPU_ISA_AVX2)
		sets[n++] = CPU_ISA_AVX2;
	return n;
}

START_TEST(panel_layout)
{
	static float src[FGEMM_ROWS * MAX_K], panel[FGEMM_ROWS * MAX_K];
	enum cpu_isa sets[2];
	const int n_sets = kernel_sets(sets);

	for (int t = 0; t < N_KS * n_sets; t++) {
		const int64_t k = ks[t % N_KS];
		const enum cpu_isa isa = sets[t / N_KS];

		for (int rows = 1; rows <= FGEMM_ROWS; rows++) {
			for (int64_t e = 0; e < FGEMM_ROWS * k; e++)
				src[e] = rndf();
			memset(panel, 0xff, sizeof(panel)); /* NaN: must be overwritten */
			fgemm_panel_rows(isa, src, k, rows, k, panel);
			for (int64_t kk = 0; kk < k; kk++)
				for (int r = 0; r < FGEMM_ROWS; r++) {
					float want = r < rows ? src[r * k + kk] : 0.0f;
					float got = panel[kk * FGEMM_ROWS + r];

					ck_assert_msg(memcmp(&want, &got, sizeof(float)) == 0,
						      "%s k %lld rows %d: panel[%lld][%d] %g, want %g",
						      cpu_isa_name(isa), (long long)k, rows,
						      (long long)kk, r, got, want);
				}
		}
	}
}
END_TEST

/* One (m, rows, k) case: fgemm_run() against fgemm_ref() bit for bit and
 * against f64 within rounding; y past the valid rows untouched. */
static void check_case(enum cpu_isa isa, int64_t m, int rows, int64_t k)
{
	static float w[FGEMM_ROWS * MAX_K], x[MAX_M * (MAX_K + 3)], panel[FGEMM_ROWS * MAX_K];
	static float y[(MAX_M + Y_PAD) * (FGEMM_ROWS + 5)];
	const int64_t xs = k + 3, ys = FGEMM_ROWS + 5;

	for (int64_t e = 0; e < rows * k; e++)
		w[e] = rndf();
	for (int64_t e = 0; e < m * xs; e++)
		x[e] = rndf();
	for (int64_t e = 0; e < (m + Y_PAD) * ys; e++)
		y[e] = SENTINEL;
	fgemm_panel_rows(isa, w, k, rows, k, panel);
	/* the next panel's rows asked for (the AVX2 set): no result changes */
	fgemm_run(isa, panel, rows, x, xs, m, k, y, ys,
		  m % 2 ? NULL : &(struct fgemm_next){ (const uint8_t *)w, (size_t)k * 4,
						      (size_t)k * 4, rows });
	for (int64_t i = 0; i < m; i++) {
		for (int r = 0; r < rows; r++) {
			float want = fgemm_ref(x + i * xs, w + r * k, k), got = y[i * ys + r];
			double d = 0.0, mag = 0.0;

			ck_assert_msg(memcmp(&want, &got, sizeof(float)) == 0,
				      "%s m %lld rows %d k %lld: y[%lld][%d] %.9g, reference %.9g",
				      cpu_isa_name(isa), (long long)m, rows, (long long)k,
				      (long long)i, r, got, want);
			for (int64_t kk = 0; kk < k; kk++) {
				d += (double)x[i * xs + kk] * w[r * k + kk];
				mag += fabs((double)x[i * xs + kk] * w[r * k + kk]);
			}
			ck_assert_msg(fabs(got - d) <= (double)k * 0x1p-23 * mag + 1e-30,
				      "m %lld rows %d k %lld: %.9g vs f64 %.9g", (long long)m, rows,
				      (long long)k, got, d);
		}
		for (int r = rows; r < ys; r++)
			ck_assert_msg(y[i * ys + r] == SENTINEL, "%s wrote past row %d (rows %d)",
				      cpu_isa_name(isa), r, rows);
	}
	for (int64_t e = m * ys; e < (m + Y_PAD) * ys; e++)
		ck_assert_msg(y[e] == SENTINEL, "%s m %lld rows %d k %lld: wrote y past row m",
			      cpu_isa_name(isa), (long long)m, rows, (long long)k);
}

/* fgemm_panel_half() of f16 / bf16 rows (any bits: NaNs, infinities,
 * denormals) against cpu_dequant_row() then fgemm_panel_rows(): the same
 * panel bit for bit, for every row count and k (whole 32-value groups,
 * and the values past them the dequantizer converts one by one). */
START_TEST(half_panel)
{
	static uint16_t src[FGEMM_ROWS * MAX_K];
	static float rows_f32[FGEMM_ROWS * MAX_K], want[FGEMM_ROWS * MAX_K];
	static float got[FGEMM_ROWS * MAX_K];
	static const uint32_t types[] = { LOOM_TYPE_F16, LOOM_TYPE_BF16 };
	static const int rows_set[] = { 1, 7, 8, 9, 15, 16, 17, 24, 25, 31, 32 };

	if (!fgemm_panel_half(CPU_ISA_AVX2, LOOM_TYPE_F16, src, 2, 1, 1, got)) {
		printf("skip: no half-precision panel builder on this build\n");
		return;
	}
	for (int ti = 0; ti < 2; ti++)
		for (int t = 0; t < N_KS; t++) {
			const int64_t k = ks[t];

			for (size_t ri = 0; ri < sizeof(rows_set) / sizeof(rows_set[0]); ri++) {
				const int rows = rows_set[ri];

				for (int64_t e = 0; e < FGEMM_ROWS * k; e++) {
					rndf();
					src[e] = (uint16_t)(rng >> 40);
				}
				for (int r = 0; r < rows; r++)
					cpu_dequant_row(CPU_ISA_AVX2, types[ti], src + r * k,
							rows_f32 + r * k, k);
				fgemm_panel_rows(CPU_ISA_AVX2, rows_f32, k, rows, k, want);
				memset(got, 0xff, sizeof(got));
				ck_assert(fgemm_panel_half(CPU_ISA_AVX2, types[ti], src,
							   (size_t)k * 2, rows, k, got));
				ck_assert_msg(memcmp(want, got, sizeof(float) * FGEMM_ROWS * k) == 0,
					      "%s k %lld rows %d: the panel differs",
					      ti ? "bf16" : "f16", (long long)k, rows);
			}
		}
}
END_TEST

START_TEST(run_matches_reference)
{
	static const int rows_set[] = { 1, 7, 8, 9, 15, 16, 17, 24, 25, 31, 32 };
	enum cpu_isa sets[2];
	const int n_sets = kernel_sets(sets);

	for (int t = 0; t < N_KS * n_sets; t++)
		for (int mi = 0; mi < N_MS; mi++)
			for (size_t r = 0; r < sizeof(rows_set) / sizeof(rows_set[0]); r++)
				check_case(sets[t / N_KS], ms[mi], rows_set[r], ks[t % N_KS]);
}
END_TEST

static uint16_t bf16_of(float v)
{
	return fgemm_bf16_round(v);
}

static float bf16_value(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

START_TEST(pairs_round)
{
	static const uint32_t special[] = {
		0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00400000u, /* zeros, denormals */
		0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, /* inf, NaNs */
		0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, /* ties to even, either side */
		0x7f7fffffu, 0xff7fffffu, /* rounds to infinity */
	};
	enum { N = 4096 + 32 };
	static float x[N];
	static uint32_t out[N / 2];

	if (!fgemm_pairs_supported(cpu_detect_isa())) {
		printf("skip: no AVX512_BF16: the pair path does not run\n");
		return;
	}
	for (int e = 0; e < N; e++) {
		uint32_t u = e < (int)(sizeof(special) / sizeof(special[0])) ?
				     special[e] : (uint32_t)(rndf() * 2147483647.0f) * 2u + (e & 1);

		memcpy(&x[e], &u, sizeof(u));
	}
	fgemm_pairs_x(x, N, out);
	for (int e = 0; e < N; e++) {
		uint16_t got = (uint16_t)(out[e / 2] >> (16 * (e % 2))), want = fgemm_bf16_round(x[e]);
		uint32_t u;

		memcpy(&u, &x[e], sizeof(u));
		ck_assert_msg(got == want, "value %d (bits %08x): bf16 %04x, reference %04x", e, u, got,
			      want);
	}
}
END_TEST

/* One pair case: m rows of kp pairs against rows weight rows, through
 * vdpbf16ps (amx AMX_OFF) or AMX-BF16 tiles. */
static void check_pairs_on(enum amx_mode amx, int64_t m, int rows, int64_t kp)
{
	static uint32_t w[FGEMM_ROWS * MAX_K], x[MAX_M * MAX_K], panel[FGEMM_ROWS * MAX_K];
	static float y[MAX_M * (FGEMM_ROWS + 5)];
	const int64_t ys = FGEMM_ROWS + 5;

	for (int64_t e = 0; e < rows * kp; e++)
		w[e] = bf16_of(rndf()) | (uint32_t)bf16_of(rndf()) << 16;
	for (int64_t e = 0; e < m * kp; e++)
		x[e] = bf16_of(rndf()) | (uint32_t)bf16_of(rndf()) << 16;
	for (int64_t e = 0; e < m * ys; e++)
		y[e] = SENTINEL;
	fgemm_panel_rows(cpu_detect_isa(), w, kp, rows, kp, panel);
	if (amx == AMX_OFF)
		fgemm_pairs_run(panel, rows, x, m, kp, y, ys);
	else
		amx_pairs_run(amx, panel, rows, x, m, kp, y, ys);
	for (int64_t i = 0; i < m; i++) {
		for (int r = 0; r < rows; r++) {
			float want = amx == AMX_OFF ? fgemm_pairs_ref(x + i * kp, w + r * kp, kp) :
						      amx_pairs_ref(x + i * kp, w + r * kp, kp);
			float got = y[i * ys + r];
			double d = 0.0, mag = 0.0;

			ck_assert_msg(memcmp(&want, &got, sizeof(float)) == 0,
				      "pairs (%s) m %lld rows %d kp %lld: y[%lld][%d] %.9g, reference %.9g",
				      amx_mode_name(amx), (long long)m, rows, (long long)kp,
				      (long long)i, r, got, want);
			for (int64_t p = 0; p < kp; p++)
				for (int h = 0; h < 2; h++) {
					double v = (double)bf16_value((uint16_t)(x[i * kp + p] >> 16 * h)) *
						   bf16_value((uint16_t)(w[r * kp + p] >> 16 * h));

					d += v;
					mag += fabs(v);
				}
			ck_assert_msg(fabs(got - d) <= (double)(2 * kp) * 0x1p-23 * mag + 1e-30,
				      "pairs m %lld rows %d kp %lld: %.9g vs f64 %.9g", (long long)m,
				      rows, (long long)kp, got, d);
		}
		for (int r = rows; r < ys; r++)
			ck_assert_msg(y[i * ys + r] == SENTINEL, "pairs wrote past row %d", r);
	}
}

static void check_pairs(int64_t m, int rows, int64_t kp)
{
	check_pairs_on(AMX_OFF, m, rows, kp);
}

START_TEST(amx_pairs_match_reference)
{
	static const int rows_set[] = { 1, 16, 17, 32 };
	static const int64_t kps[] = { 1, 15, 16, 17, 40 };
	enum amx_mode modes[2] = { AMX_EMU, AMX_HW };
	char why[128];

	if (cpu_detect_isa() != CPU_ISA_AVX512) { /* the emulation is AVX-512 code */
		printf("skip: no AVX-512F: the AMX-BF16 path and its emulation do not run\n");
		return;
	}
	if (!amx_pairs_supported(AMX_HW) || amx_request(why, sizeof(why))) {
		printf("skip: AMX-BF16 hardware: no AMX-BF16 or no tile state; emulation only\n");
		modes[1] = AMX_OFF;
	}
	for (int md = 0; md < 2 && modes[md] != AMX_OFF; md++)
		for (size_t t = 0; t < sizeof(kps) / sizeof(kps[0]); t++)
			for (int64_t m = 1; m <= 33; m += m < 4 ? 1 : 14)
				for (size_t r = 0; r < sizeof(rows_set) / sizeof(rows_set[0]); r++)
					check_pairs_on(modes[md], m, rows_set[r], kps[t]);
}
END_TEST

START_TEST(pairs_match_reference)
{
	static const int rows_set[] = { 1, 9, 16, 17, 32 };

	if (!fgemm_pairs_supported(cpu_detect_isa())) {
		printf("skip: no AVX512_BF16: the pair path does not run\n");
		return;
	}
	for (int t = 0; t < N_KS; t++)
		for (int64_t m = 1; m <= MAX_M; m += m < 14 ? 1 : 13)
			for (size_t r = 0; r < sizeof(rows_set) / sizeof(rows_set[0]); r++)
				check_pairs(m, rows_set[r], ks[t]);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fgemm");
	TCase *tc = tcase_create("fgemm");
	SRunner *sr;
	int failed;

	if (!fgemm_supported(cpu_detect_isa())) {
		printf("SKIP: no AVX2 and FMA on this CPU: fgemm does not run\n");
		return 77;
	}
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, panel_layout);
	tcase_add_test(tc, half_panel);
	tcase_add_test(tc, run_matches_reference);
	tcase_add_test(tc, pairs_round);
	tcase_add_test(tc, pairs_match_reference);
	tcase_add_test(tc, amx_pairs_match_reference);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
