/*
 * cpu.so's fast-mode exponentials (backends/cpu/vexp.c):
 *
 *   bitwise   every kernel set this machine runs (forced one by one) gives
 *             cpu_exp_c() / cpu_silu_c() / cpu_gelu_c()'s bits, over one
 *             float bit pattern in 251 (NaNs, infinities, subnormals
 *             included; a NaN only has to stay a NaN), at every position
 *             of rows of 1 to 40 values (the masked tails);
 *   exp       within EXP_ULP ulp of exp() in double over the floats of
 *             [-88, 88] (one bit pattern in 31; LOOM_VEXP_FULL=1: all of
 *             them), within one subnormal step below, and right at the
 *             special values;
 *   SiLU      within SILU_REL (relative) of g / (1 + exp(-g)) in double;
 *   GELU      within (GELU_REL + GELU_ZREL |z|) (relative) of
 *             0.5 g (1 + tanh(z / 2)) = g / (1 + exp(-z)) in double,
 *             z = 2 sqrt(2/pi) (g + 0.044715 g^3): exp's argument carries
 *             float rounding, a few 2^-24 relative, which becomes that
 *             times |z| of relative error in exp(z);
 *             both over g in [-100, 100], absolute 1e-36 where the true
 *             value is smaller (exp(-g) overflows a float below -88.7).
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* stated bounds, checked below (measured maxima are printed) */
#define EXP_ULP 1.5
#define SILU_REL 2.5e-7
#define GELU_REL 2.5e-7
#define GELU_ZREL 3e-7 /* z takes 5 roundings and 2 rounded constants */

#define CHUNK 4096

static const enum cpu_isa isas[] = { CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512 };

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static bool same(float a, float b)
{
	return (isnan(a) && isnan(b)) || f2u(a) == f2u(b);
}

static bool isa_runs(enum cpu_isa isa)
{
	return isa <= cpu_detect_isa();
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rndf(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / 8388608.0f - 1.0f; /* [-1, 1) */
}

/* Bit patterns b0, b0 + step, ... into x (at most CHUNK); how many. */
static int fill_bits(float *x, uint64_t *b, uint64_t end, uint64_t step)
{
	int n = 0;

	for (; n < CHUNK && *b < end; n++, *b += step)
		x[n] = u2f((uint32_t)*b);
	return n;
}

/* The three row functions of isa against the C twins at x[0..n). */
static int check_rows(enum cpu_isa isa, const float *x, const float *u, int n)
{
	static float y[CHUNK];
	int bad = 0;

	cpu_exp_row(isa, y, x, 0.0f, n);
	for (int i = 0; i < n; i++)
		bad += !same(y[i], cpu_exp_c(x[i]));
	cpu_glu_row_fast(isa, LOOM_GLU_SILU, y, x, u, n);
	for (int i = 0; i < n; i++)
		bad += !same(y[i], cpu_silu_c(x[i]) * u[i]);
	cpu_glu_row_fast(isa, LOOM_GLU_GELU_TANH, y, x, u, n);
	for (int i = 0; i < n; i++)
		bad += !same(y[i], cpu_gelu_c(x[i]) * u[i]);
	return bad;
}

START_TEST(rows_match_c)
{
	enum cpu_isa isa = isas[_i];
	static float x[CHUNK], u[CHUNK];
	uint64_t b = 0;
	long bad = 0, cases = 0;
	int n;

	if (!isa_runs(isa)) {
		printf("vexp %s: not supported here, skipped\n", cpu_isa_name(isa));
		return;
	}
	for (int i = 0; i < CHUNK; i++)
		u[i] = rndf() * 4.0f;
	while ((n = fill_bits(x, &b, 1ull << 32, 251)) > 0) {
		bad += check_rows(isa, x, u, n);
		cases += n;
	}
	ck_assert_int_eq(bad, 0);
	printf("vexp %s: %ld bit patterns, exp/silu/gelu == C twins\n", cpu_isa_name(isa), cases);
}
END_TEST

/* Each length 1..40 and each position: the tails are the C twin's too, and
 * exp_row's shift is subtracted first, in float. */
START_TEST(tails_match_c)
{
	enum cpu_isa isa = isas[_i];
	float x[48], u[48], y[48], g[48];
	const float guard = 12345.0f;

	if (!isa_runs(isa))
		return;
	for (int len = 1; len <= 40; len++) {
		float shift = rndf() * 3.0f;

		for (int i = 0; i < 48; i++) {
			x[i] = rndf() * 30.0f;
			u[i] = rndf();
			y[i] = g[i] = guard;
		}
		cpu_exp_row(isa, y, x, shift, len);
		cpu_glu_row_fast(isa, len % 2 ? LOOM_GLU_SILU : LOOM_GLU_GELU_TANH, g, x, u, len);
		for (int i = 0; i < len; i++) {
			float want = len % 2 ? cpu_silu_c(x[i]) : cpu_gelu_c(x[i]);

			ck_assert(same(y[i], cpu_exp_c(x[i] - shift)));
			ck_assert(same(g[i], want * u[i]));
		}
		for (int i = len; i < 48; i++) /* nothing written past the row */
			ck_assert(y[i] == guard && g[i] == guard);
	}
	/* in place, as attention calls it */
	for (int i = 0; i < 40; i++)
		x[i] = y[i] = rndf() * 50.0f;
	cpu_exp_row(isa, x, x, 1.5f, 37);
	for (int i = 0; i < 37; i++)
		ck_assert(same(x[i], cpu_exp_c(y[i] - 1.5f)));
}
END_TEST

/* |f - y| in units of the float ulp at y (2^-149 below the normals). */
static double ulps(float f, double y)
{
	double a = fabs(y);
	int e;

	if (a < FLT_MIN)
		return fabs(f - y) / 0x1p-149;
	frexp(a, &e);
	return fabs(f - y) / ldexp(1.0, e - 24);
}

START_TEST(exp_accuracy)
{
	const char *full = getenv("LOOM_VEXP_FULL");
	const uint64_t step = full && !strcmp(full, "1") ? 1 : 31;
	static float x[CHUNK], y[CHUNK];
	double worst = 0, worst_x = 0, worst_sub = 0, worst_libm = 0;
	long cases = 0;
	int n;

	/* -88 .. 88: the negative and the positive bit ranges */
	for (int side = 0; side < 2; side++) {
		uint64_t b = side ? f2u(-0.0f) : 0, end = f2u(side ? -88.0f : 88.0f) + 1ull;

		while ((n = fill_bits(x, &b, end, step)) > 0) {
			cpu_exp_row(cpu_detect_isa(), y, x, 0.0f, n);
			for (int i = 0; i < n; i++) {
				double e = ulps(y[i], exp((double)x[i]));

				if (e > worst)
					worst = e, worst_x = x[i];
				e = fabs(y[i] - (double)expf(x[i])) / expf(x[i]);
				worst_libm = e > worst_libm ? e : worst_libm;
			}
			cases += n;
		}
	}
	/* subnormal and zero results: one step of 2^-149 at most */
	for (float v = -88.0f; v > -110.0f; v = nextafterf(v, -INFINITY)) {
		float f = cpu_exp_c(v);
		double e = fabs(f - exp((double)v)) / 0x1p-149;

		worst_sub = e > worst_sub ? e : worst_sub;
		if (v < -104.0f)
			v -= 1e-3f; /* all are zero there: step faster */
	}
	printf("vexp exp: %ld values of [-88, 88], max %.3f ulp (at %a; bound %.1f), "
	       "max rel diff to expf %.3g; subnormal results within %.3f of 2^-149\n",
	       cases, worst, worst_x, EXP_ULP, worst_libm, worst_sub);
	ck_assert(worst <= EXP_ULP);
	ck_assert(worst_sub <= 1.0);
}
END_TEST

START_TEST(exp_specials)
{
	ck_assert(cpu_exp_c(0.0f) == 1.0f && cpu_exp_c(-0.0f) == 1.0f);
	ck_assert(isinf(cpu_exp_c(INFINITY)) && cpu_exp_c(INFINITY) > 0);
	ck_assert(cpu_exp_c(-INFINITY) == 0.0f);
	ck_assert(isnan(cpu_exp_c(NAN)) && isnan(cpu_exp_c(-NAN)));
	ck_assert(isinf(cpu_exp_c(FLT_MAX)) && cpu_exp_c(-FLT_MAX) == 0.0f);
	/* the largest float whose exp is finite, and the next one */
	ck_assert(isfinite(cpu_exp_c(0x1.62e42ep6f)));
	ck_assert(isinf(cpu_exp_c(0x1.62e430p6f)));
	ck_assert(cpu_exp_c(-103.0f) > 0.0f && cpu_exp_c(-104.0f) == 0.0f);
	ck_assert(ulps(cpu_exp_c(1.0f), M_E) <= EXP_ULP);
	/* SiLU and GELU at the ends */
	ck_assert(cpu_silu_c(100.0f) == 100.0f && cpu_gelu_c(100.0f) == 100.0f);
	ck_assert(cpu_silu_c(-200.0f) == -0.0f && cpu_gelu_c(-20.0f) == -0.0f);
	ck_assert(isinf(cpu_silu_c(INFINITY)) && isinf(cpu_gelu_c(INFINITY)));
	ck_assert(isnan(cpu_silu_c(NAN)) && isnan(cpu_gelu_c(NAN)));
	ck_assert(cpu_silu_c(0.0f) == 0.0f && cpu_gelu_c(0.0f) == 0.0f);
}
END_TEST

static double silu_ref(double g)
{
	return g / (1.0 + exp(-g));
}

static double gelu_z(double g)
{
	return 2.0 * sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
}

/* 0.5 g (1 + tanh(z / 2)) without its cancellation */
static double gelu_ref(double g)
{
	return g / (1.0 + exp(-gelu_z(g)));
}

/*
 * f's error against ref as a fraction of the bound: bound relative to ref,
 * or, where |ref| < TINY (g below -88, where exp(-g) overflows a float:
 * the formula gives -0 there, as exact mode's does), TINY absolute.
 */
#define TINY 1e-36

static double err_of_bound(float f, double ref, double bound)
{
	if (fabs(ref) < TINY)
		return fabs(f - ref) / TINY;
	return fabs(f - ref) / fabs(ref) / bound;
}

START_TEST(glu_accuracy)
{
	static float g[CHUNK], u[CHUNK], ys[CHUNK], yg[CHUNK];
	double worst_s = 0, worst_g = 0, ws_at = 0, wg_at = 0;
	long cases = 0;

	for (int i = 0; i < CHUNK; i++)
		u[i] = 1.0f;
	/* one float bit pattern in 217 of [-100, 100] */
	for (int side = 0; side < 2; side++) {
		uint64_t b = side ? f2u(-0.0f) : 0, end = f2u(side ? -100.0f : 100.0f) + 1ull;
		int n;

		while ((n = fill_bits(g, &b, end, 7 * 31)) > 0) {
			cpu_glu_row_fast(cpu_detect_isa(), LOOM_GLU_SILU, ys, g, u, n);
			cpu_glu_row_fast(cpu_detect_isa(), LOOM_GLU_GELU_TANH, yg, g, u, n);
			for (int i = 0; i < n; i++) {
				double gb = GELU_REL + GELU_ZREL * fabs(gelu_z(g[i]));
				double es = err_of_bound(ys[i], silu_ref(g[i]), SILU_REL);
				double eg = err_of_bound(yg[i], gelu_ref(g[i]), gb);

				if (es > worst_s)
					worst_s = es, ws_at = g[i];
				if (eg > worst_g)
					worst_g = eg, wg_at = g[i];
			}
			cases += n;
		}
	}
	printf("vexp glu: %ld values of [-100, 100]: max error %.3f of the bound for SiLU "
	       "(at %g), %.3f for GELU (at %g)\n", cases, worst_s, ws_at, worst_g, wg_at);
	ck_assert(worst_s <= 1.0);
	ck_assert(worst_g <= 1.0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("vexp");
	TCase *tc = tcase_create("vexp");
	SRunner *sr;
	int failed;

	setvbuf(stdout, NULL, _IONBF, 0); /* the figures before a failed assertion */

	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, rows_match_c, 0, 3);
	tcase_add_loop_test(tc, tails_match_c, 0, 3);
	tcase_add_test(tc, exp_accuracy);
	tcase_add_test(tc, exp_specials);
	tcase_add_test(tc, glu_accuracy);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
