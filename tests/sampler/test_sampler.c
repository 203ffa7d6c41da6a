/* Unit tests for core/engine/sampler.c. Expected values are hand-computed or come
 * from a plain reference (softmax + qsort) written here, never from the
 * sampler itself. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rng.h"
#include "engine/sampler.h"

static struct loom_sampler_params params(float temp, uint64_t seed)
{
	struct loom_sampler_params p = {
		.temp = temp, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
		.repeat_penalty = 1.0f, .presence_penalty = 0.0f,
		.frequency_penalty = 0.0f, .penalty_last_n = 0, .seed = seed,
	};
	return p;
}

static struct loom_sampler *make(const struct loom_sampler_params *p, int32_t n)
{
	char err[256] = "";
	struct loom_sampler *s = loom_sampler_new(p, n, err, sizeof(err));

	ck_assert_msg(s != NULL, "loom_sampler_new failed: %s", err);
	return s;
}

/* Samples `draws` times from a fresh copy of logits each time. */
static void histogram(struct loom_sampler *s, const float *logits, int32_t n,
		      int draws, long *count)
{
	float *tmp = malloc(n * sizeof(*tmp));

	ck_assert_ptr_nonnull(tmp);
	memset(count, 0, n * sizeof(*count));
	for (int d = 0; d < draws; d++) {
		memcpy(tmp, logits, n * sizeof(*tmp));
		int32_t t = loom_sampler_sample(s, tmp, NULL, 0);

		ck_assert_int_ge(t, 0);
		ck_assert_int_lt(t, n);
		count[t]++;
	}
	free(tmp);
}

/* Test-side generator for random logits (independent of the sampler's). */
static uint32_t lcg(uint32_t *x)
{
	*x = *x * 1664525u + 1013904223u;
	return *x >> 8;
}

static float rand_logit(uint32_t *x, float scale)
{
	/* Sum of 4 uniforms: roughly normal, mean 0. */
	float u = 0.0f;

	for (int i = 0; i < 4; i++)
		u += (float)lcg(x) / 16777216.0f - 0.5f;
	return u * scale;
}

/* ---- greedy ---- */

START_TEST(greedy_argmax_and_ties)
{
	struct loom_sampler_params p = params(0.0f, 1);
	struct loom_sampler *s = make(&p, 5);
	float a[5] = { 0.5f, 2.0f, -1.0f, 1.5f, 1.9f };
	float b[5] = { 1.0f, 3.0f, 0.0f, 3.0f, 3.0f };
	float c[5] = { NAN, 1.0f, 2.0f, NAN, -5.0f };
	float d[5] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY };

	ck_assert_int_eq(loom_sampler_sample(s, a, NULL, 0), 1);
	ck_assert_int_eq(loom_sampler_sample(s, b, NULL, 0), 1);
	ck_assert_int_eq(loom_sampler_sample(s, c, NULL, 0), 2);
	ck_assert_int_eq(loom_sampler_sample(s, d, NULL, 0), 0);
	loom_sampler_free(s);

	/* A negative temperature is greedy too. */
	p = params(-1.0f, 1);
	s = make(&p, 5);
	ck_assert_int_eq(loom_sampler_sample(s, b, NULL, 0), 1);
	loom_sampler_free(s);
}
END_TEST

START_TEST(top_k_one_is_greedy)
{
	enum { N = 1000 };
	struct loom_sampler_params p = params(1.0f, 7);
	float *l = malloc(N * sizeof(*l));
	uint32_t x = 12345;

	p.top_k = 1;
	struct loom_sampler *s = make(&p, N);
	for (int trial = 0; trial < 50; trial++) {
		int32_t best = 0;

		/* Coarse values so ties happen. */
		for (int i = 0; i < N; i++)
			l[i] = roundf(rand_logit(&x, 20.0f));
		for (int i = 1; i < N; i++)
			if (l[i] > l[best])
				best = i;
		ck_assert_int_eq(loom_sampler_sample(s, l, NULL, 0), best);
	}
	loom_sampler_free(s);
	free(l);
}
END_TEST

/* Non-finite maxima fall back to greedy rather than producing NaN. */
START_TEST(non_finite_logits)
{
	struct loom_sampler_params p = params(1.0f, 3);
	struct loom_sampler *s = make(&p, 4);
	float a[4] = { 1.0f, INFINITY, 2.0f, INFINITY };
	float b[4] = { -INFINITY, NAN, -INFINITY, NAN };
	float c[4] = { -INFINITY, 0.0f, -INFINITY, NAN };

	ck_assert_int_eq(loom_sampler_sample(s, a, NULL, 0), 1);
	ck_assert_int_eq(loom_sampler_sample(s, b, NULL, 0), 0);
	/* Only one token has non-zero probability. */
	for (int i = 0; i < 100; i++) {
		float t[4];

		memcpy(t, c, sizeof(t));
		ck_assert_int_eq(loom_sampler_sample(s, t, NULL, 0), 1);
	}
	loom_sampler_free(s);
}
END_TEST

/* ---- determinism ---- */

static void sequence(uint64_t seed, int32_t top_k, float top_p, int32_t *out,
		     int n)
{
	float logits[6] = { 0.1f, 0.2f, 0.0f, -0.1f, 0.15f, 0.05f };
	struct loom_sampler_params p = params(1.0f, seed);

	p.top_k = top_k;
	p.top_p = top_p;
	struct loom_sampler *s = make(&p, 6);
	for (int i = 0; i < n; i++) {
		float t[6];

		memcpy(t, logits, sizeof(t));
		out[i] = loom_sampler_sample(s, t, NULL, 0);
	}
	loom_sampler_free(s);
}

START_TEST(determinism)
{
	enum { N = 300 };
	int32_t a[N], b[N], c[N];
	/* Three paths: plain, top-k and top-p. */
	const int32_t ks[3] = { 0, 4, 0 };
	const float ps[3] = { 1.0f, 1.0f, 0.9f };

	for (int v = 0; v < 3; v++) {
		int differ = 0;

		sequence(42, ks[v], ps[v], a, N);
		sequence(42, ks[v], ps[v], b, N);
		sequence(43, ks[v], ps[v], c, N);
		ck_assert_mem_eq(a, b, sizeof(a));
		for (int i = 0; i < N; i++)
			differ += a[i] != c[i];
		/* Near-uniform over >= 4 tokens: two seeds agreeing on most
		 * of 300 draws would mean the seed is ignored. */
		ck_assert_int_gt(differ, N / 3);
	}
}
END_TEST

/* ---- distribution ---- */

/* Pearson chi-square of counts against softmax(logits / temp). */
static double chi_square(const float *logits, int n, float temp,
			 const long *count, long draws)
{
	double m = -INFINITY, z = 0.0, chi = 0.0, pr[16];

	for (int i = 0; i < n; i++)
		m = fmax(m, logits[i]);
	for (int i = 0; i < n; i++)
		z += pr[i] = exp((logits[i] - m) / temp);
	for (int i = 0; i < n; i++) {
		double e = draws * pr[i] / z;

		chi += (count[i] - e) * (count[i] - e) / e;
	}
	return chi;
}

/* Chi-square critical value for 4 degrees of freedom at alpha = 0.001. */
#define CHI2_DF4_P001 18.467

START_TEST(softmax_distribution)
{
	const float logits[5] = { 1.0f, 0.5f, 0.0f, -0.5f, -1.5f };
	const float temps[3] = { 1.0f, 0.5f, 2.0f };
	long count[5];

	for (int t = 0; t < 3; t++) {
		struct loom_sampler_params p = params(temps[t], 2024);
		struct loom_sampler *s = make(&p, 5);
		double chi;

		histogram(s, logits, 5, 20000, count);
		chi = chi_square(logits, 5, temps[t], count, 20000);
		ck_assert_msg(chi < CHI2_DF4_P001,
			      "temp %.1f: chi-square %.2f >= %.3f", temps[t],
			      chi, CHI2_DF4_P001);
		loom_sampler_free(s);
	}
}
END_TEST

START_TEST(temperature_sharpens)
{
	const float logits[5] = { 1.0f, 0.5f, 0.0f, -0.5f, -1.5f };
	const float temps[4] = { 2.0f, 1.0f, 0.5f, 0.1f };
	long count[5], prev = 0;

	for (int t = 0; t < 4; t++) {
		struct loom_sampler_params p = params(temps[t], 99);
		struct loom_sampler *s = make(&p, 5);

		histogram(s, logits, 5, 5000, count);
		ck_assert_msg(count[0] > prev, "temp %.1f: top count %ld <= %ld",
			      temps[t], count[0], prev);
		prev = count[0];
		loom_sampler_free(s);
	}
	/* At 0.1 the top token has p = 1 / (1 + e^-5 + ...) > 0.99. */
	ck_assert_int_gt(prev, 4900);
}
END_TEST

/* ---- truncation: hand-computed ---- */

/* probs: token 3: 0.5, 0: 0.25, 4: 0.15, 1: 0.1, 2: 0 */
static void truncation_logits(float *l)
{
	l[0] = logf(0.25f);
	l[1] = logf(0.10f);
	l[2] = -INFINITY;
	l[3] = logf(0.50f);
	l[4] = logf(0.15f);
}

/* Draws 6000 times and checks exactly `keep` (a mask) can appear. */
static void expect_set(const struct loom_sampler_params *p, unsigned keep,
		       long *count)
{
	float l[5];
	struct loom_sampler *s = make(p, 5);

	truncation_logits(l);
	histogram(s, l, 5, 6000, count);
	for (int i = 0; i < 5; i++) {
		if (keep & (1u << i))
			ck_assert_msg(count[i] > 0, "token %d never drawn", i);
		else
			ck_assert_msg(count[i] == 0, "token %d drawn %ld times",
				      i, count[i]);
	}
	loom_sampler_free(s);
}

#define M(a) (1u << (a))

START_TEST(top_p_smallest_set)
{
	struct loom_sampler_params p = params(1.0f, 5);
	long c[5];

	/* Cumulative in rank order: 0.5, 0.75, 0.9, 1.0. */
	p.top_p = 0.4f;
	expect_set(&p, M(3), c);
	p.top_p = 0.7f;
	expect_set(&p, M(3) | M(0), c);
	/* Renormalized: token 3 has 0.5 / 0.75 = 2/3 (sd ~0.006). */
	ck_assert(fabs(c[3] / 6000.0 - 2.0 / 3.0) < 0.03);
	p.top_p = 0.8f;
	expect_set(&p, M(3) | M(0) | M(4), c);
	p.top_p = 0.95f;
	expect_set(&p, M(3) | M(0) | M(4) | M(1), c);
	p.top_p = 1.0f;
	expect_set(&p, M(3) | M(0) | M(4) | M(1), c);
}
END_TEST

START_TEST(min_p_relative)
{
	struct loom_sampler_params p = params(1.0f, 6);
	long c[5];

	/* Threshold 0.25 * 0.5 = 0.125: 0.15 stays, 0.1 goes. */
	p.min_p = 0.25f;
	expect_set(&p, M(3) | M(0) | M(4), c);
	/* 0.5/0.9 for token 3. */
	ck_assert(fabs(c[3] / 6000.0 - 0.5 / 0.9) < 0.03);
	/* Threshold 0.175: 0.25 stays, 0.15 goes. */
	p.min_p = 0.35f;
	expect_set(&p, M(3) | M(0), c);
	p.min_p = 0.6f;
	expect_set(&p, M(3), c);
	/* With top-p 0.95 (keeps 4 tokens) min-p 0.35 still cuts to 2. */
	p.top_p = 0.95f;
	p.min_p = 0.35f;
	expect_set(&p, M(3) | M(0), c);
}
END_TEST

START_TEST(top_k_then_softmax)
{
	struct loom_sampler_params p = params(1.0f, 8);
	long c[5];

	p.top_k = 2;
	expect_set(&p, M(3) | M(0), c);
	p.top_k = 3;
	expect_set(&p, M(3) | M(0) | M(4), c);
	/* top-p applies to the softmax over the k survivors: 0.5/0.9 =
	 * 0.556 < 0.8, then 0.75/0.9 = 0.833 >= 0.8, so two stay (over the
	 * whole vocabulary top-p 0.8 keeps three, see top_p_smallest_set). */
	p.top_p = 0.8f;
	expect_set(&p, M(3) | M(0), c);
}
END_TEST

/* ---- large vocabulary against a sort-based reference ---- */

struct ref {
	double pr;
	int32_t id;
};

static int ref_cmp(const void *a, const void *b)
{
	const struct ref *x = a, *y = b;

	if (x->pr != y->pr)
		return x->pr < y->pr ? 1 : -1;
	return x->id - y->id;
}

/* Marks in `allowed` the tokens the header's rules keep, by full sort. */
static void reference_set(const float *l, int32_t n, float temp, int32_t k,
			  float top_p, float min_p, unsigned char *allowed)
{
	struct ref *r = malloc(n * sizeof(*r));
	double m = -INFINITY, z = 0.0, cum = 0.0;
	int32_t keep;

	for (int32_t i = 0; i < n; i++)
		m = fmax(m, l[i]);
	for (int32_t i = 0; i < n; i++)
		r[i] = (struct ref){ exp((l[i] - m) / temp), i };
	qsort(r, n, sizeof(*r), ref_cmp);
	keep = k > 0 && k < n ? k : n;
	for (int32_t i = 0; i < keep; i++)
		z += r[i].pr;
	for (int32_t i = 0; i < keep && top_p < 1.0f; i++) {
		cum += r[i].pr / z;
		if (cum >= top_p) {
			keep = i + 1;
			break;
		}
	}
	memset(allowed, 0, n);
	for (int32_t i = 0; i < keep; i++)
		if (min_p <= 0.0f || r[i].pr >= min_p * r[0].pr)
			allowed[r[i].id] = 1;
	free(r);
}

/* spike: token 1234 sits this far above the rest (0: none). */
static void large_case(int32_t k, float top_p, float min_p, float scale,
		       float spike)
{
	enum { N = 150000, DRAWS = 400 };
	float *l = malloc(N * sizeof(*l)), *t = malloc(N * sizeof(*t));
	unsigned char *allowed = malloc(N);
	struct loom_sampler_params p = params(0.8f, 11);
	uint32_t x = 777;
	int distinct = 0;

	ck_assert(l && t && allowed);
	for (int32_t i = 0; i < N; i++)
		l[i] = rand_logit(&x, scale);
	l[1234] += spike;
	p.top_k = k;
	p.top_p = top_p;
	p.min_p = min_p;
	reference_set(l, N, p.temp, k, top_p, min_p, allowed);
	struct loom_sampler *s = make(&p, N);
	for (int d = 0; d < DRAWS; d++) {
		memcpy(t, l, N * sizeof(*t));
		int32_t tok = loom_sampler_sample(s, t, NULL, 0);

		ck_assert_int_ge(tok, 0);
		ck_assert_int_lt(tok, N);
		ck_assert_msg(allowed[tok] != 0,
			      "k=%d p=%.2f min_p=%.2f: token %d outside the set",
			      k, top_p, min_p, tok);
		distinct += allowed[tok] == 1;
		allowed[tok] = 2;
	}
	ck_assert_int_gt(distinct, 1);
	loom_sampler_free(s);
	free(l);
	free(t);
	free(allowed);
}

START_TEST(large_vocab_matches_reference)
{
	large_case(50, 1.0f, 0.0f, 8.0f, 0.0f);
	large_case(0, 0.9f, 0.0f, 30.0f, 0.0f); /* peaked: few tokens sorted */
	large_case(0, 0.5f, 0.0f, 2.0f, 0.0f);
	/* One token far above a flat bulk that holds most of the mass: the
	 * top-p threshold must be lowered well below the spike's weight. */
	large_case(0, 0.5f, 0.0f, 0.5f, 6.0f);
	large_case(0, 0.99f, 0.0f, 0.5f, 6.0f);
	large_case(0, 1.0f, 0.05f, 30.0f, 0.0f);
	large_case(0, 0.9f, 0.1f, 30.0f, 0.0f);
	large_case(40, 0.95f, 0.05f, 20.0f, 0.0f);
}
END_TEST

/*
 * Exact sets with ties: TIED tokens scattered over the vocabulary share
 * logit 0 (weight 1), the rest sit at -1000 (weight 0 after exp), so
 * z = TIED exactly. Ties rank by id, so top-p (k - 0.5) / TIED and top-k k
 * both keep exactly the k lowest tied ids, each with probability 1/k; every
 * one of them must be drawn and nothing else.
 */
static void tied_case(const float *l, int32_t n, const int32_t *tied,
		      int32_t n_tied, int32_t k, bool use_top_k)
{
	struct loom_sampler_params p = params(0.8f, 1000 + k);
	float *t = malloc(n * sizeof(*t));
	long *count = calloc(n, sizeof(*count));
	int draws = 30 * k + 50;

	ck_assert(t && count);
	if (use_top_k)
		p.top_k = k;
	else
		p.top_p = (k - 0.5f) / n_tied;
	struct loom_sampler *s = make(&p, n);
	for (int d = 0; d < draws; d++) {
		memcpy(t, l, n * sizeof(*t));
		int32_t tok = loom_sampler_sample(s, t, NULL, 0);

		ck_assert(tok >= 0 && tok < n);
		count[tok]++;
	}
	for (int32_t j = 0; j < n_tied; j++) {
		if (j < k)
			ck_assert_msg(count[tied[j]] > 0, "%s k=%d: token %d never drawn",
				      use_top_k ? "top-k" : "top-p", k, tied[j]);
		else
			ck_assert_msg(count[tied[j]] == 0, "%s k=%d: token %d drawn",
				      use_top_k ? "top-k" : "top-p", k, tied[j]);
	}
	loom_sampler_free(s);
	free(t);
	free(count);
}

START_TEST(exact_sets_with_ties)
{
	enum { N = 20000 };
	static const int32_t ks[] = { 1, 2, 3, 5, 8, 13, 16, 17, 21, 34, 55, 89 };
	float *l = malloc(N * sizeof(*l));
	int32_t *tied = malloc(N * sizeof(*tied)), n_tied = 0;
	uint32_t x = 4242;

	ck_assert(l && tied);
	for (int32_t i = 0; i < N; i++) {
		bool t = lcg(&x) % 4 == 0;

		l[i] = t ? 0.0f : -1000.0f;
		if (t)
			tied[n_tied++] = i; /* ascending ids */
	}
	for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
		tied_case(l, N, tied, n_tied, ks[i], false);
		tied_case(l, N, tied, n_tied, ks[i], true);
	}
	free(l);
	free(tied);
}
END_TEST

/* ---- penalties: hand-computed ---- */

static void check_logits(const float *got, const float *want, int n)
{
	for (int i = 0; i < n; i++)
		ck_assert_msg(got[i] == want[i], "logit %d: %g, want %g", i,
			      got[i], want[i]);
}

START_TEST(repeat_penalty_window)
{
	struct loom_sampler_params p = params(0.0f, 1);
	/* Window of 5 sees {0, 1, 0} (plus ids out of range, ignored);
	 * token 2 lies outside the window. */
	const int32_t hist[] = { 2, 0, 99, 1, -5, 0 };
	float l[5] = { 2.0f, -2.0f, 1.0f, 3.0f, 0.5f };
	const float want[5] = { 1.0f, -4.0f, 1.0f, 3.0f, 0.5f };

	p.repeat_penalty = 2.0f;
	p.penalty_last_n = 5;
	struct loom_sampler *s = make(&p, 5);
	ck_assert_int_eq(loom_sampler_sample(s, l, hist, 6), 3);
	check_logits(l, want, 5);
	loom_sampler_free(s);

	/* A window larger than the history covers all of it. */
	float l2[5] = { 2.0f, -2.0f, 1.0f, 3.0f, 0.5f };
	const float want2[5] = { 1.0f, -4.0f, 0.5f, 3.0f, 0.5f };

	p.penalty_last_n = 100;
	s = make(&p, 5);
	loom_sampler_sample(s, l2, hist, 6);
	check_logits(l2, want2, 5);
	loom_sampler_free(s);
}
END_TEST

START_TEST(penalty_changes_choice)
{
	struct loom_sampler_params p = params(0.0f, 1);
	const int32_t hist[] = { 0 };
	float l[2] = { 3.0f, 2.9f };

	p.repeat_penalty = 2.0f;
	p.penalty_last_n = 1;
	struct loom_sampler *s = make(&p, 2);
	ck_assert_int_eq(loom_sampler_sample(s, l, hist, 1), 1);
	ck_assert(l[0] == 1.5f);
	/* Counts are cleared between calls: the same input, the same result. */
	l[0] = 3.0f;
	l[1] = 2.9f;
	ck_assert_int_eq(loom_sampler_sample(s, l, hist, 1), 1);
	ck_assert(l[0] == 1.5f);
	loom_sampler_free(s);

	/* penalty_last_n = 0 turns penalties off. */
	p.penalty_last_n = 0;
	s = make(&p, 2);
	l[0] = 3.0f;
	ck_assert_int_eq(loom_sampler_sample(s, l, hist, 1), 0);
	ck_assert(l[0] == 3.0f);
	loom_sampler_free(s);
}
END_TEST

START_TEST(presence_frequency)
{
	struct loom_sampler_params p = params(0.0f, 1);
	/* Window of 4: token 0 twice, token 1 once, token 4 once. */
	const int32_t hist[] = { 3, 0, 1, 4, 0 };
	float l[5] = { 2.0f, -2.0f, 1.0f, 3.0f, 0.5f };
	/* 0: 2 - 0.5 - 0.25*2 = 1; 1: -2 - 0.5 - 0.25 = -2.75;
	 * 4: 0.5 - 0.5 - 0.25 = -0.25; 3 is outside the window. */
	const float want[5] = { 1.0f, -2.75f, 1.0f, 3.0f, -0.25f };

	p.presence_penalty = 0.5f;
	p.frequency_penalty = 0.25f;
	p.penalty_last_n = 4;
	struct loom_sampler *s = make(&p, 5);
	loom_sampler_sample(s, l, hist, 5);
	check_logits(l, want, 5);
	loom_sampler_free(s);

	/* With repeat 2 first: 0: 2/2 - 0.5 - 0.5 = 0; 1: -2*2 - 0.75 =
	 * -4.75; 4: 0.5/2 - 0.75 = -0.5. */
	float l2[5] = { 2.0f, -2.0f, 1.0f, 3.0f, 0.5f };
	const float want2[5] = { 0.0f, -4.75f, 1.0f, 3.0f, -0.5f };

	p.repeat_penalty = 2.0f;
	s = make(&p, 5);
	loom_sampler_sample(s, l2, hist, 5);
	check_logits(l2, want2, 5);
	loom_sampler_free(s);
}
END_TEST


/* ---- the whole-vocabulary rule (integer masses, ABI 1.9) ----
 * A plain reference of the rule in loom/backend.h: every mass, a full
 * sort for the top-p prefix, unsigned __int128 for the target, the draw
 * in id order. The sampler (quickselect, 64-bit halves) must pick the
 * same token for every seed, draw for draw. */

static int rank_cmp(const void *a, const void *b)
{
	const float *x = a, *y = b; /* {key, id} pairs as floats */
	float kx = x[0], ky = y[0];

	if (kx != ky)
		return kx > ky ? -1 : 1;
	return (int)x[1] - (int)y[1];
}

static int32_t reference_full_draw(const float *l, int32_t n, const struct loom_sampler_params *p,
				   uint64_t rng[4])
{
	uint64_t *q = malloc((size_t)n * sizeof(*q)), all = 0, need, got = 0, total = 0, cum = 0;
	unsigned char *in_f = calloc((size_t)n, 1), *kept = calloc((size_t)n, 1);
	float *order = malloc((size_t)n * 2 * sizeof(*order)), max = -INFINITY;
	double floor_w = p->min_p > 0.0f ? p->min_p : 0.0;
	int32_t i, j, tok = -1;
	unsigned __int128 target;

	ck_assert(q && in_f && kept && order && n < (1 << 24));
	for (i = 0; i < n; i++)
		if (!isnan(l[i]) && l[i] > max)
			max = l[i];
	for (i = 0; i < n; i++) {
		float k = isnan(l[i]) ? -INFINITY : l[i];
		double w = exp(((double)k - max) * (1.0 / p->temp));

		q[i] = (uint64_t)ldexp(w, LOOM_SAMPLE_MASS_BITS);
		all += q[i];
		in_f[i] = w >= floor_w;
		order[2 * i] = k == 0.0f ? 0.0f : k;
		order[2 * i + 1] = (float)i;
	}
	qsort(order, (size_t)n, 2 * sizeof(float), rank_cmp);
	need = (uint64_t)((double)p->top_p * (double)all);
	need = need ? need : 1;
	for (j = 0; j < n; j++) {
		int32_t id = (int32_t)order[2 * j + 1];

		if (!in_f[id])
			continue;
		if (p->top_p < 1.0f && got >= need)
			break;
		kept[id] = 1;
		got += q[id];
	}
	for (i = 0; i < n; i++)
		total += kept[i] ? q[i] : 0;
	target = ((unsigned __int128)(loom_rng_next(rng) >> 11) * total) >> 53;
	for (i = 0; i < n && tok < 0; i++) {
		cum += kept[i] ? q[i] : 0;
		if (target < cum)
			tok = i;
	}
	free(q);
	free(in_f);
	free(kept);
	free(order);
	return tok;
}

static void full_case(int32_t n, float temp, float top_p, float min_p, int32_t top_k,
		      float scale, uint64_t seed)
{
	struct loom_sampler_params p = params(temp, seed);
	float *l = malloc((size_t)n * sizeof(*l)), *t = malloc((size_t)n * sizeof(*t));
	uint64_t rng[4];
	uint32_t x = (uint32_t)seed * 2654435761u + 1;
	struct loom_sampler *s;

	ck_assert(l && t);
	p.top_p = top_p;
	p.min_p = min_p;
	p.top_k = top_k;
	s = make(&p, n);
	loom_rng_seed(rng, seed);
	for (int d = 0; d < 25; d++) {
		for (int32_t i = 0; i < n; i++)
			l[i] = rand_logit(&x, scale);
		if (d % 5 == 1) /* ties: a run of equal logits, and -0 beside +0 */
			for (int32_t i = 0; i < n; i += 7)
				l[i] = i % 2 ? 0.0f : -0.0f;
		if (d % 5 == 2)
			l[x % (uint32_t)n] = NAN;
		memcpy(t, l, (size_t)n * sizeof(*t));
		{
			int32_t want = reference_full_draw(l, n, &p, rng);
			int32_t got = loom_sampler_sample(s, t, NULL, 0);

			ck_assert_msg(got == want,
				      "n %d temp %g top_p %g min_p %g seed %llu draw %d: token %d, the rule draws %d",
				      n, temp, top_p, min_p, (unsigned long long)seed, d, got, want);
		}
	}
	loom_sampler_free(s);
	free(l);
	free(t);
}

START_TEST(whole_vocabulary_rule)
{
	for (uint64_t seed = 1; seed <= 3; seed++) {
		full_case(1500, 0.8f, 0.95f, 0.05f, 0, 8.0f, seed);
		full_case(1500, 1.5f, 0.9f, 0.0f, 0, 2.0f, seed);  /* flat: a long prefix */
		full_case(1500, 0.7f, 1.0f, 0.0f, 0, 4.0f, seed);  /* temperature only */
		full_case(1500, 1.0f, 0.5f, 0.2f, 1500, 6.0f, seed); /* top_k = n: whole */
		full_case(49152, 0.9f, 0.9f, 0.0f, 0, 8.0f, seed);
		full_case(49152, 3.0f, 0.99f, 0.0f, 0, 1.0f, seed); /* quickselect deep */
		full_case(300, 0.5f, 0.3f, 0.0f, 0, 0.1f, seed);   /* near-uniform */
	}
}
END_TEST

/* ---- log-probabilities (ABI 1.9) ---- */

/* The lanes' order is the definition: over random rows the sum in lane
 * order must be what loom_logprob_lse returns, and the rows must be ones
 * where another order (the lanes reversed) gives other bits, else the
 * check above could not see a wrong order. */
static void lanes_order_matters(void)
{
	enum { N = 3000 };
	float l[N];
	uint32_t x = 4321;
	int differ = 0;

	for (int row = 0; row < 40; row++) {
		double lane[LOOM_SAMPLE_LANES] = { 0 }, fwd = 0.0, rev = 0.0, max = -INFINITY;

		for (int i = 0; i < N; i++) {
			l[i] = rand_logit(&x, 3.0f);
			max = l[i] > max ? l[i] : max;
		}
		for (int i = 0; i < N; i++)
			lane[i % LOOM_SAMPLE_LANES] += exp((double)l[i] - max);
		for (int j = 0; j < LOOM_SAMPLE_LANES; j++) {
			fwd += lane[j];
			rev += lane[LOOM_SAMPLE_LANES - 1 - j];
		}
		ck_assert(loom_logprob_lse(l, N) == max + log(fwd));
		differ += max + log(fwd) != max + log(rev);
	}
	ck_assert_int_gt(differ, 0);
}

START_TEST(logprob_lanes_and_top)
{
	enum { N = 5000, K = 20 };
	float *l = malloc(N * sizeof(*l));
	double lane[LOOM_SAMPLE_LANES] = { 0 }, sum = 0.0, lse, naive = 0.0, max = -INFINITY;
	struct loom_token_logprob top[K + 2];
	uint32_t x = 99;

	ck_assert(l);
	for (int i = 0; i < N; i++)
		l[i] = rand_logit(&x, 6.0f);
	l[17] = l[4000] = 12.0f; /* a tie at the top: the lower id first */
	l[3] = NAN;
	/* lanes i % 256 in order, then the lanes in order */
	for (int i = 0; i < N; i++)
		if (l[i] > max)
			max = l[i];
	for (int i = 0; i < N; i++)
		lane[i % LOOM_SAMPLE_LANES] += exp((double)l[i] - max);
	for (int j = 0; j < LOOM_SAMPLE_LANES; j++)
		sum += lane[j];
	l[3] = 0.0f; /* NaN would make the sum NaN: compare with a number */
	for (int i = 0; i < LOOM_SAMPLE_LANES; i++)
		lane[i] = 0.0;
	for (int i = 0; i < N; i++)
		lane[i % LOOM_SAMPLE_LANES] += exp((double)l[i] - max);
	sum = 0.0;
	for (int j = 0; j < LOOM_SAMPLE_LANES; j++)
		sum += lane[j];
	lse = loom_logprob_lse(l, N);
	ck_assert(lse == max + log(sum)); /* bit for bit */
	lanes_order_matters();
	for (int i = 0; i < N; i++)
		naive += exp((double)l[i] - max);
	ck_assert(fabs(lse - (max + log(naive))) < 1e-12);
	loom_logprob_top(l, N, lse, K, top);
	ck_assert_int_eq(top[0].token, 17);
	ck_assert_int_eq(top[1].token, 4000);
	for (int j = 1; j < K; j++) {
		float a = l[top[j - 1].token], b = l[top[j].token];

		ck_assert(a > b || (a == b && top[j - 1].token < top[j].token));
		ck_assert(top[j].logprob == (float)((double)b - lse));
	}
	for (int i = 0; i < N; i++) { /* nothing outside beats the last */
		bool in = false;

		for (int j = 0; j < K; j++)
			in |= top[j].token == i;
		ck_assert(in || l[i] < l[top[K - 1].token] ||
			  (l[i] == l[top[K - 1].token] && i > top[K - 1].token));
	}
	/* past the vocabulary: { -1, NaN } */
	loom_logprob_top(l, 3, loom_logprob_lse(l, 3), 5, top);
	ck_assert_int_eq(top[3].token, -1);
	ck_assert(isnan(top[4].logprob));
	free(l);
}
END_TEST

/* ---- validation ---- */

/* ---- sampling on the device (backend ABI 1.8) ---- */

/* Which rules the device may draw (top-k within LOOM_SAMPLE_MAX_TOP_K, or
 * greedy), the penalty pairs of the window, and the generator: a draw the
 * device made and the host then skips leaves the host's stream where its
 * own draw would have. */
START_TEST(device_rules_pairs_and_stream)
{
	struct loom_sampler_params p = params(0.0f, 5);
	const int32_t hist[] = { 2, 0, 99, 1, -5, 0, 3 };
	struct loom_sample_row row;
	int32_t tok[8], cnt[8];
	struct loom_sampler *s, *h;
	float l[64];

	p.repeat_penalty = 1.5f;
	p.penalty_last_n = 6; /* {0, 99, 1, -5, 0, 3}: 0 twice, 1 and 3 once */
	s = make(&p, 64);
	ck_assert(loom_sampler_device_ok(s, false)); /* greedy with penalties */
	ck_assert_int_eq(loom_sampler_device_row(s, hist, 7, &row, 10, tok, cnt, 8), 3);
	ck_assert_int_eq(row.pen_first, 10);
	ck_assert_int_eq(row.pen_count, 3);
	ck_assert_int_eq(tok[0], 0);
	ck_assert_int_eq(cnt[0], 2);
	ck_assert_int_eq(tok[1], 1);
	ck_assert_int_eq(cnt[1], 1);
	ck_assert_int_eq(tok[2], 3);
	ck_assert_int_eq(loom_sampler_device_row(s, hist, 7, &row, 0, tok, cnt, 2), -1);
	ck_assert_int_eq(row.pen_count, 0);
	/* the counts were cleared: the host's own penalties see the same */
	for (int i = 0; i < 64; i++)
		l[i] = (float)(i % 5);
	ck_assert_int_eq(loom_sampler_sample(s, l, hist, 7), 4);
	loom_sampler_free(s);

	/* without top-k only a backend of the whole-vocabulary rule (ABI 1.9,
	 * full) draws */
	p = params(0.8f, 5);
	s = make(&p, 64);
	ck_assert(!loom_sampler_device_ok(s, false));
	ck_assert(loom_sampler_device_ok(s, true));
	loom_sampler_free(s);
	p.top_k = 64; /* the whole vocabulary: the host's path without top-k */
	s = make(&p, 64);
	ck_assert(!loom_sampler_device_ok(s, false));
	ck_assert(loom_sampler_device_ok(s, true));
	loom_sampler_free(s);
	p.top_k = 40;
	s = make(&p, 64);
	h = make(&p, 64);
	ck_assert(loom_sampler_device_ok(s, false));
	for (int d = 0; d < 20; d++) {
		for (int i = 0; i < 64; i++)
			l[i] = (float)((i * 7 + d) % 13) * 0.25f;
		loom_sampler_device_row(s, NULL, 0, &row, 0, tok, cnt, 8);
		loom_sampler_sample(h, l, NULL, 0);
		loom_sampler_device_drew(s);
		/* the state handed to the device is the host's before each draw */
		loom_sampler_device_row(h, NULL, 0, &row, 0, tok, cnt, 8);
		{
			struct loom_sample_row mine;

			loom_sampler_device_row(s, NULL, 0, &mine, 0, tok, cnt, 8);
			ck_assert(!memcmp(mine.rng, row.rng, sizeof(row.rng)));
		}
	}
	loom_sampler_free(s);
	loom_sampler_free(h);
	p.top_k = LOOM_SAMPLE_MAX_TOP_K + 1;
	s = make(&p, 100000);
	ck_assert(!loom_sampler_device_ok(s, false));
	ck_assert(!loom_sampler_device_ok(s, true)); /* top-k past what the device sorts */
	loom_sampler_free(s);
}
END_TEST

START_TEST(invalid_params)
{
	struct {
		const char *field;
		struct loom_sampler_params p;
		int32_t n_vocab;
	} bad[16];
	int n = 0;
	struct loom_sampler_params ok = params(1.0f, 0);

#define BAD(f, expr, nv) do { \
		bad[n].field = (f); bad[n].p = ok; bad[n].n_vocab = (nv); \
		{ struct loom_sampler_params *q = &bad[n].p; expr; } n++; \
	} while (0)
	BAD("temp", q->temp = NAN, 10);
	BAD("temp", q->temp = INFINITY, 10);
	BAD("top_p", q->top_p = 0.0f, 10);
	BAD("top_p", q->top_p = -0.5f, 10);
	BAD("top_p", q->top_p = 1.5f, 10);
	BAD("top_p", q->top_p = NAN, 10);
	BAD("min_p", q->min_p = NAN, 10);
	BAD("min_p", q->min_p = 1.5f, 10);
	BAD("repeat_penalty", q->repeat_penalty = 0.0f, 10);
	BAD("repeat_penalty", q->repeat_penalty = -1.0f, 10);
	BAD("repeat_penalty", q->repeat_penalty = NAN, 10);
	BAD("presence_penalty", q->presence_penalty = INFINITY, 10);
	BAD("frequency_penalty", q->frequency_penalty = NAN, 10);
	BAD("penalty_last_n", q->penalty_last_n = -1, 10);
	BAD("n_vocab", (void)q, 0);
	BAD("n_vocab", (void)q, -3);
#undef BAD
	for (int i = 0; i < n; i++) {
		char err[256] = "";

		ck_assert_ptr_null(loom_sampler_new(&bad[i].p, bad[i].n_vocab,
						    err, sizeof(err)));
		ck_assert_msg(strstr(err, bad[i].field) != NULL,
			      "case %d: '%s' does not name %s", i, err,
			      bad[i].field);
	}
	ck_assert_ptr_null(loom_sampler_new(NULL, 10, NULL, 0));
}
END_TEST

START_TEST(defaults_are_valid)
{
	struct loom_sampler_params p;
	char err[256] = "";

	loom_sampler_defaults(&p);
	struct loom_sampler *s = loom_sampler_new(&p, 32000, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	loom_sampler_free(s);
	loom_sampler_free(NULL);
}
END_TEST

static Suite *sampler_suite(void)
{
	Suite *su = suite_create("sampler");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 100);
	tcase_add_test(tc, greedy_argmax_and_ties);
	tcase_add_test(tc, top_k_one_is_greedy);
	tcase_add_test(tc, non_finite_logits);
	tcase_add_test(tc, determinism);
	tcase_add_test(tc, softmax_distribution);
	tcase_add_test(tc, temperature_sharpens);
	tcase_add_test(tc, top_p_smallest_set);
	tcase_add_test(tc, min_p_relative);
	tcase_add_test(tc, top_k_then_softmax);
	tcase_add_test(tc, large_vocab_matches_reference);
	tcase_add_test(tc, exact_sets_with_ties);
	tcase_add_test(tc, repeat_penalty_window);
	tcase_add_test(tc, penalty_changes_choice);
	tcase_add_test(tc, presence_frequency);
	tcase_add_test(tc, invalid_params);
	tcase_add_test(tc, device_rules_pairs_and_stream);
	tcase_add_test(tc, whole_vocabulary_rule);
	tcase_add_test(tc, logprob_lanes_and_top);
	tcase_add_test(tc, defaults_are_valid);
	suite_add_tcase(su, tc);
	return su;
}

int main(void)
{
	SRunner *sr = srunner_create(sampler_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
