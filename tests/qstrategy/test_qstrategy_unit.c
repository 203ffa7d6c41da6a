/*
 * The awq, gptq and gptq_awq strategies (and rtn, the baseline) loaded
 * with dlopen from the build tree as loom quantize loads them, on random
 * matrices whose inputs have skewed channel sizes and correlations.
 *
 * The measure is the output error a quantized W' gives on those inputs:
 * sum over rows of (W' - W) H (W' - W)^T with H = X^T X / T, which is what
 * the strategies try to lower. For every format they handle each strategy
 * must beat round to nearest on it. The block grids (qgrid.c, compiled in
 * here) must decode through the format plugins to the values the grid
 * claims, and broken inputs must be refused with a message.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/qstrategy.h"
#include "../../plugins/qstrategy/qgrid.h"

#define ROWS 48
#define COLS 256
#define TOKENS 768

struct fmt {
	const char *plugin, *name;
	uint32_t type;
};

static const struct fmt fmts[] = {
	{ "q4", "q4_0", LOOM_TYPE_Q4_0 },   { "q4", "q4_1", LOOM_TYPE_Q4_1 },
	{ "q5", "q5_0", LOOM_TYPE_Q5_0 },   { "q5", "q5_1", LOOM_TYPE_Q5_1 },
	{ "q8", "q8_0", LOOM_TYPE_Q8_0 },   { "kquant", "q2_K", LOOM_TYPE_Q2_K },
	{ "kquant", "q3_K", LOOM_TYPE_Q3_K }, { "kquant", "q4_K", LOOM_TYPE_Q4_K },
	{ "kquant", "q5_K", LOOM_TYPE_Q5_K }, { "kquant", "q6_K", LOOM_TYPE_Q6_K },
};

#define N_FMTS (int)(sizeof(fmts) / sizeof(fmts[0]))

static void *open_so(const char *dir, const char *name, const char *sym)
{
	const char *root = getenv("LOOM_BUILD_ROOT");
	char path[4096];
	void *h, *entry;

	ck_assert_msg(root && *root, "LOOM_BUILD_ROOT is not set");
	snprintf(path, sizeof(path), "%s/plugins/%s/%s.so", root, dir, name);
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h, "dlopen %s: %s", path, dlerror());
	entry = dlsym(h, sym);
	ck_assert_msg(entry, "%s: no %s", path, sym);
	return entry;
}

static const struct loom_quant_format *format_of(const struct fmt *f)
{
	const struct loom_quant_plugin *(*entry)(void);
	const struct loom_quant_plugin *p;

	*(void **)&entry = open_so("quant", f->plugin, LOOM_QUANT_ENTRY);
	p = entry();
	for (uint32_t i = 0; i < p->n_formats; i++)
		if (p->formats[i].type == f->type)
			return &p->formats[i];
	ck_abort_msg("%s.so has no %s", f->plugin, f->name);
	return NULL;
}

static const struct loom_qstrategy *strategy(const char *name)
{
	loom_qstrategy_entry_fn entry;

	*(void **)&entry = open_so("qstrategy", name, LOOM_QSTRATEGY_ENTRY);
	return entry();
}

/* ---- the data: a fixed generator, so failures reproduce ---- */

static uint64_t rng_state;

static double uniform(void)
{
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
	return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}

struct data {
	float w[ROWS * COLS];
	float h[COLS * COLS];
	float imatrix[COLS];
};

/* X: channel sizes log-normal with a few 20x outliers, and each token
 * shares a component among channels of the same residue mod 8. */
static void make_data(struct data *d, uint64_t seed)
{
	static float x[TOKENS * COLS];
	float size[COLS];

	rng_state = seed;
	for (int c = 0; c < COLS; c++)
		size[c] = (float)exp(0.8 * gauss()) * (c % 37 == 5 ? 20.0f : 1.0f);
	for (int t = 0; t < TOKENS; t++) {
		float shared[8];

		for (int k = 0; k < 8; k++)
			shared[k] = (float)gauss();
		for (int c = 0; c < COLS; c++)
			x[t * COLS + c] = size[c] * ((float)gauss() + 0.7f * shared[c % 8]);
	}
	for (int i = 0; i < COLS; i++)
		for (int j = 0; j <= i; j++) {
			double s = 0.0;

			for (int t = 0; t < TOKENS; t++)
				s += (double)x[t * COLS + i] * x[t * COLS + j];
			d->h[i * COLS + j] = d->h[j * COLS + i] = (float)(s / TOKENS);
		}
	for (int c = 0; c < COLS; c++)
		d->imatrix[c] = d->h[c * COLS + c];
	for (int i = 0; i < ROWS * COLS; i++)
		d->w[i] = (float)(0.02 * gauss() * (i % 97 == 3 ? 6.0 : 1.0));
}

/* sum_r (q_r - w_r) H (q_r - w_r)^T */
static double output_error(const struct data *d, const float *q)
{
	double total = 0.0;

	for (int r = 0; r < ROWS; r++) {
		double e[COLS];

		for (int c = 0; c < COLS; c++)
			e[c] = (double)q[r * COLS + c] - d->w[r * COLS + c];
		for (int i = 0; i < COLS; i++) {
			double s = 0.0;

			for (int j = 0; j < COLS; j++)
				s += (double)d->h[i * COLS + j] * e[j];
			total += e[i] * s;
		}
	}
	return total;
}

/* The host's for_rows, in three uneven ranges (as threads would). */
static int test_for_rows(const struct loom_qstrategy_tensor *t, loom_qs_rows_fn fn, void *arg)
{
	int64_t cut[4] = { 0, t->rows / 5, t->rows / 2, t->rows };
	int rc = 0;

	for (int i = 0; i < 3 && !rc; i++)
		rc = fn(arg, cut[i], cut[i + 1]);
	return rc;
}

static struct loom_qstrategy_tensor tensor(const struct loom_quant_format *f, const float *w,
					   const float *imatrix, const float *h, void *out)
{
	return (struct loom_qstrategy_tensor){
		.struct_size = sizeof(struct loom_qstrategy_tensor), .type = f->type,
		.name = "blk.0.attn_q.weight", .rows = ROWS, .cols = COLS, .w = w,
		.imatrix = imatrix, .hessian = h, .format = f, .out = out,
		.out_size = (size_t)ROWS * COLS / f->block_elems * f->block_bytes,
		.for_rows = test_for_rows,
	};
}

/* Quantizes d->w with strategy s (its input scales first when it has
 * them, applied as the host does) and returns the output error of the
 * dequantized result, scales undone. */
static double strategy_error(const struct loom_qstrategy *s, const struct loom_quant_format *f,
			     const struct data *d)
{
	static float ws[ROWS * COLS], hs[COLS * COLS], q[ROWS * COLS];
	static unsigned char out[ROWS * COLS * 2];
	float scale[COLS], ims[COLS];
	struct loom_qstrategy_tensor t = tensor(f, d->w, d->imatrix, d->h, NULL);
	const struct loom_qstrategy_tensor *group[1] = { &t };
	char msg[256] = "";
	int rc;

	for (int c = 0; c < COLS; c++)
		scale[c] = 1.0f;
	if (s->struct_size > offsetof(struct loom_qstrategy, input_scales) && s->input_scales) {
		rc = s->input_scales(group, 1, scale, msg, sizeof(msg));
		ck_assert_msg(rc == 0, "%s input_scales on %s: %d %s", s->name, f->name, rc, msg);
	}
	for (int i = 0; i < COLS; i++) {
		ck_assert_msg(isfinite(scale[i]) && scale[i] > 0.0f, "%s: scale %d is %g", s->name,
			      i, scale[i]);
		ims[i] = d->imatrix[i] / (scale[i] * scale[i]);
		for (int j = 0; j < COLS; j++)
			hs[i * COLS + j] = d->h[i * COLS + j] / (scale[i] * scale[j]);
	}
	for (int i = 0; i < ROWS * COLS; i++)
		ws[i] = d->w[i] * scale[i % COLS];
	t = tensor(f, ws, ims, hs, out);
	rc = s->quantize(&t, msg, sizeof(msg));
	ck_assert_msg(rc == 0, "%s on %s: %d %s", s->name, f->name, rc, msg);
	ck_assert_int_eq(f->to_float(out, q, ROWS * COLS), 0);
	for (int i = 0; i < ROWS * COLS; i++)
		q[i] /= scale[i % COLS];
	return output_error(d, q);
}

START_TEST(beats_rtn)
{
	static struct data d;
	const struct fmt *fm = &fmts[_i];
	const struct loom_quant_format *f = format_of(fm);
	const char *names[] = { "awq", "gptq", "gptq_awq" };
	double rtn, e[3];

	make_data(&d, 1000 + (uint64_t)_i);
	rtn = strategy_error(strategy("rtn"), f, &d);
	for (int k = 0; k < 3; k++)
		e[k] = strategy_error(strategy(names[k]), f, &d);
	printf("%-5s output error: rtn %.4g  awq %.3f  gptq %.3f  gptq_awq %.3f (of rtn)\n",
	       fm->name, rtn, e[0] / rtn, e[1] / rtn, e[2] / rtn);
	for (int k = 0; k < 3; k++)
		ck_assert_msg(e[k] < 0.95 * rtn, "%s on %s: output error %g, rtn %g", names[k],
			      fm->name, e[k], rtn);
}
END_TEST

/* Grids packed by qgrid decode, through the format plugin, to the values
 * qgrid_value gives: the layouts agree with the readers. */
START_TEST(grid_packs_decode)
{
	const struct fmt *fm = &fmts[_i];
	const struct loom_quant_format *f = format_of(fm);
	float x[256], y[256], imp[256];
	unsigned char block[256];
	int q[256], n = qgrid_block_elems(fm->type);
	struct qgrid g;

	ck_assert_int_eq(n, (int)f->block_elems);
	rng_state = 77 + (uint64_t)_i;
	for (int trial = 0; trial < 50; trial++) {
		for (int e = 0; e < n; e++) {
			x[e] = (float)gauss() * (trial % 3 ? 1.0f : 0.01f) + (trial % 4 == 1);
			imp[e] = (float)uniform();
		}
		ck_assert(qgrid_fit(&g, fm->type, x, trial % 2 ? imp : NULL));
		for (int e = 0; e < n; e++) {
			q[e] = qgrid_q(&g, e, x[e]);
			ck_assert(q[e] >= g.qlo && q[e] <= g.qhi);
		}
		qgrid_pack(&g, q, block);
		ck_assert_int_eq(f->to_float(block, y, n), 0);
		for (int e = 0; e < n; e++)
			ck_assert_msg(fabsf(y[e] - qgrid_value(&g, e, q[e])) <=
				      1e-6f * (fabsf(y[e]) + 1e-3f),
				      "%s trial %d element %d: decoded %g, grid %g", fm->name, trial,
				      e, y[e], qgrid_value(&g, e, q[e]));
	}
}
END_TEST

START_TEST(refuses_broken_input)
{
	static struct data d;
	const struct loom_quant_format *f = format_of(&fmts[0]);
	static unsigned char out[ROWS * COLS];
	static float bad_h[COLS * COLS];
	struct loom_qstrategy_tensor t;
	char msg[256];

	make_data(&d, 5);
	memcpy(bad_h, d.h, sizeof(bad_h));
	bad_h[3 * COLS + 3] = NAN;
	t = tensor(f, d.w, d.imatrix, bad_h, out);
	msg[0] = 0;
	ck_assert_int_eq(strategy("gptq")->quantize(&t, msg, sizeof(msg)), LOOM_ERR_FORMAT);
	ck_assert_msg(strstr(msg, "the Hessian holds nan at (3, 3)"), "message: %s", msg);
	t = tensor(f, d.w, d.imatrix, d.h, out);
	t.out_size--;
	msg[0] = 0;
	ck_assert_int_eq(strategy("gptq")->quantize(&t, msg, sizeof(msg)), LOOM_ERR_INVALID);
	ck_assert_msg(strstr(msg, "need"), "message: %s", msg);
	t = tensor(f, d.w, d.imatrix, d.h, out);
	t.cols = 100; /* not a multiple of 32 */
	msg[0] = 0;
	ck_assert_int_eq(strategy("awq")->quantize(&t, msg, sizeof(msg)), LOOM_ERR_INVALID);
	ck_assert_msg(strstr(msg, "bad tensor"), "message: %s", msg);
}
END_TEST

/* Without calibration data awq keeps scales of 1 and gptq falls back to
 * the unweighted grid fit: both still work. */
START_TEST(no_calibration)
{
	static struct data d;
	const struct loom_quant_format *f = format_of(&fmts[7]);
	static unsigned char out[ROWS * COLS];
	const struct loom_qstrategy_tensor *group[1];
	struct loom_qstrategy_tensor t;
	float scale[COLS];
	char msg[256] = "";

	make_data(&d, 9);
	t = tensor(f, d.w, NULL, NULL, NULL);
	group[0] = &t;
	ck_assert_int_eq(strategy("awq")->input_scales(group, 1, scale, msg, sizeof(msg)), 0);
	for (int c = 0; c < COLS; c++)
		ck_assert(scale[c] == 1.0f);
	t = tensor(f, d.w, NULL, NULL, out);
	ck_assert_int_eq(strategy("gptq")->quantize(&t, msg, sizeof(msg)), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("qstrategy");
	TCase *tc = tcase_create("unit");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, grid_packs_decode, 0, N_FMTS);
	tcase_add_loop_test(tc, beats_rtn, 0, N_FMTS);
	tcase_add_test(tc, refuses_broken_input);
	tcase_add_test(tc, no_calibration);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
