/* Token sampler: penalties, greedy, top-k, temperature, top-p, min-p and a
 * seeded draw. See sampler.h for the order of application.
 *
 * Cost for a vocabulary of n tokens (nothing sorts the whole vocabulary):
 *   - penalties: O(window), through a per-token count array;
 *   - greedy, plain temperature and min-p: O(n), no sort (min-p is a
 *     threshold on the weight relative to the top token);
 *   - top-k: O(n log k) with a bounded heap, then O(k log k) to order the k;
 *   - top-p without top-k: O(n) expected, by a quickselect on probability
 *     mass (partition around a pivot, keep the side that holds the cut), so
 *     the kept set is found without ordering it.
 * With top-k the candidates are drawn from in rank order with double sums.
 * Without top-k every sum is over integer masses (the weight in units of
 * 2^-LOOM_SAMPLE_MASS_BITS of the top token's, truncated), so the result
 * is the same whatever order the sums run in (a parallel device pass, the
 * quickselect's), and the draw runs over the kept tokens in id order: the
 * rule of struct loom_sample_row, generation 1.9 (loom/backend.h).
 *
 * Logits that are NaN count as -inf. When the largest logit is not finite
 * (+inf, or every logit -inf/NaN) the sampler returns the greedy choice.
 */
#include "engine/sampler.h"
#include "engine/rng.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cand {
	double w; /* exp((logit - max) / temp): 1 for the top token */
	uint64_t q; /* its integer mass (without top-k) */
	float logit;
	int32_t id;
};

struct loom_sampler {
	struct loom_sampler_params p;
	int32_t n_vocab;
	uint64_t rng[4];   /* xoshiro256** state */
	int32_t *counts;   /* [n_vocab], all zero between calls */
	struct cand *cand; /* [n_vocab] candidate scratch */
	struct cand *sel;  /* [n_vocab] the quickselect's copy (top-p without top-k) */
};

void loom_sampler_defaults(struct loom_sampler_params *p)
{
	p->temp = 0.8f;
	p->top_k = 40;
	p->top_p = 0.95f;
	p->min_p = 0.05f;
	p->repeat_penalty = 1.0f;
	p->presence_penalty = 0.0f;
	p->frequency_penalty = 0.0f;
	p->penalty_last_n = 64;
	p->seed = 0;
}

/* ---- construction ---- */

static int check_params(const struct loom_sampler_params *p, int32_t n_vocab,
			char *err, size_t errlen)
{
	const char *why = NULL;

	if (n_vocab <= 0)
		why = "n_vocab must be positive";
	else if (n_vocab > LOOM_SAMPLE_MAX_VOCAB)
		why = "n_vocab must be at most 2^23 (integer masses)";
	else if (!isfinite(p->temp))
		why = "temp must be a finite number";
	else if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		why = "top_p must be in (0, 1]";
	else if (!(p->min_p <= 1.0f))
		why = "min_p must be a number <= 1";
	else if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
		why = "repeat_penalty must be a finite number > 0";
	else if (!isfinite(p->presence_penalty))
		why = "presence_penalty must be a finite number";
	else if (!isfinite(p->frequency_penalty))
		why = "frequency_penalty must be a finite number";
	else if (p->penalty_last_n < 0)
		why = "penalty_last_n must be >= 0";
	if (!why)
		return 0;
	if (err && errlen)
		snprintf(err, errlen, "sampler: %s", why);
	return -1;
}

struct loom_sampler *loom_sampler_new(const struct loom_sampler_params *p,
				      int32_t n_vocab, char *err, size_t errlen)
{
	struct loom_sampler *s;

	if (!p) {
		if (err && errlen)
			snprintf(err, errlen, "sampler: no parameters");
		return NULL;
	}
	if (check_params(p, n_vocab, err, errlen))
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		goto out_nomem;
	s->p = *p;
	s->n_vocab = n_vocab;
	loom_rng_seed(s->rng, p->seed);
	s->counts = calloc((size_t)n_vocab, sizeof(*s->counts));
	s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
	s->sel = malloc((size_t)n_vocab * sizeof(*s->sel));
	if (!s->counts || !s->cand || !s->sel)
		goto out_free;
	return s;

out_free:
	loom_sampler_free(s);
out_nomem:
	if (err && errlen)
		snprintf(err, errlen, "sampler: out of memory for %d tokens",
			 (int)n_vocab);
	return NULL;
}

void loom_sampler_free(struct loom_sampler *s)
{
	if (!s)
		return;
	free(s->counts);
	free(s->cand);
	free(s->sel);
	free(s);
}

/* ---- penalties ---- */

static bool penalties_off(const struct loom_sampler_params *p)
{
	return p->penalty_last_n == 0 ||
	       (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
		p->frequency_penalty == 0.0f);
}

bool loom_sampler_greedy_only(const struct loom_sampler *s)
{
	return s && s->p.temp <= 0.0f && penalties_off(&s->p);
}

/* Counts every in-range token of the window, then penalizes each distinct
 * token once (clearing its count, so counts is all zero again after). */
static void apply_penalties(struct loom_sampler *s, float *logits,
			    const int32_t *history, int64_t n_history)
{
	const struct loom_sampler_params *p = &s->p;
	int64_t start, i;

	if (penalties_off(p) || !history || n_history <= 0)
		return;
	start = n_history > p->penalty_last_n ? n_history - p->penalty_last_n : 0;
	for (i = start; i < n_history; i++) {
		if (history[i] >= 0 && history[i] < s->n_vocab)
			s->counts[history[i]]++;
	}
	for (i = start; i < n_history; i++) {
		int32_t t = history[i];
		float l;

		if (t < 0 || t >= s->n_vocab || s->counts[t] == 0)
			continue;
		l = logits[t];
		l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
		l -= p->presence_penalty;
		l -= p->frequency_penalty * (float)s->counts[t];
		logits[t] = l;
		s->counts[t] = 0;
	}
}

/* ---- selection helpers ---- */

static float key(float l)
{
	return isnan(l) ? -INFINITY : l;
}

/* Greedy: the largest logit, ties to the lowest id. */
static int32_t argmax(const float *logits, int32_t n)
{
	int32_t best = 0;
	float bl = key(logits[0]);

	for (int32_t i = 1; i < n; i++) {
		if (key(logits[i]) > bl) {
			bl = key(logits[i]);
			best = i;
		}
	}
	return best;
}

/* a ranks before b: larger logit, then lower id. */
static bool before(const struct cand *a, const struct cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Heap whose root is the candidate that ranks last. */
static void sift_down(struct cand *h, int32_t n, int32_t i)
{
	for (;;) {
		int32_t l = 2 * i + 1, r = l + 1, m = i;
		struct cand t;

		if (l < n && before(&h[m], &h[l]))
			m = l;
		if (r < n && before(&h[m], &h[r]))
			m = r;
		if (m == i)
			return;
		t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static void heapify(struct cand *h, int32_t n)
{
	for (int32_t i = n / 2 - 1; i >= 0; i--)
		sift_down(h, n, i);
}

/* Turns a heap into rank order (best first) by popping the last-ranked. */
static void heap_sort(struct cand *h, int32_t n)
{
	for (int32_t end = n - 1; end > 0; end--) {
		struct cand t = h[0];

		h[0] = h[end];
		h[end] = t;
		sift_down(h, end, 0);
	}
}

/* The k best logits in rank order into s->cand; returns k. */
static int32_t select_top_k(struct loom_sampler *s, const float *logits,
			    int32_t k)
{
	struct cand *h = s->cand;

	for (int32_t i = 0; i < k; i++)
		h[i] = (struct cand){ 0.0, 0, key(logits[i]), i };
	heapify(h, k);
	for (int32_t i = k; i < s->n_vocab; i++) {
		struct cand c = { 0.0, 0, key(logits[i]), i };

		if (before(&c, &h[0])) {
			h[0] = c;
			sift_down(h, k, 0);
		}
	}
	heap_sort(h, k);
	return k;
}

/* A weight's integer mass: w in units of 2^-LOOM_SAMPLE_MASS_BITS,
 * truncated (w <= 1, so n_vocab <= 2^23 masses fit 64 bits). */
static uint64_t mass_of(double w)
{
	return (uint64_t)(w * (double)(UINT64_C(1) << LOOM_SAMPLE_MASS_BITS));
}

/* Every token whose weight is at least floor_w into s->cand, in id order,
 * with its weight and mass; *z gets the mass of the whole vocabulary.
 * Returns the count. */
static int32_t gather(struct loom_sampler *s, const float *logits, float max,
		      double inv_t, double floor_w, uint64_t *z)
{
	int32_t n = 0;

	*z = 0;
	for (int32_t i = 0; i < s->n_vocab; i++) {
		float l = key(logits[i]);
		double w = exp(((double)l - max) * inv_t);
		uint64_t q = mass_of(w);

		*z += q;
		if (w >= floor_w)
			s->cand[n++] = (struct cand){ w, q, l, i };
	}
	return n;
}

static void swap(struct cand *a, struct cand *b)
{
	struct cand t = *a;

	*a = *b;
	*b = t;
}

static void insertion_sort(struct cand *c, int32_t n)
{
	for (int32_t i = 1; i < n; i++)
		for (int32_t j = i; j > 0 && before(&c[j], &c[j - 1]); j--)
			swap(&c[j], &c[j - 1]);
}

/* Moves the median of c[lo], c[mid], c[hi-1] to c[hi-1] and partitions
 * c[lo..hi) around it: better ones first. Returns the pivot's index and
 * the mass of the better ones in *mass. */
static int32_t partition(struct cand *c, int32_t lo, int32_t hi, uint64_t *mass)
{
	int32_t mid = lo + (hi - lo) / 2, last = hi - 1, store = lo;

	if (before(&c[mid], &c[lo]))
		swap(&c[mid], &c[lo]);
	if (before(&c[last], &c[lo]))
		swap(&c[last], &c[lo]);
	if (before(&c[mid], &c[last]))
		swap(&c[mid], &c[last]);
	*mass = 0;
	for (int32_t i = lo; i < last; i++) {
		if (before(&c[i], &c[last])) {
			*mass += c[i].q;
			swap(&c[i], &c[store++]);
		}
	}
	swap(&c[store], &c[last]);
	return store;
}

/*
 * Top-p without ordering: reorders c[0..n) so that its first `keep`
 * entries are the smallest rank-order prefix whose mass reaches `need`
 * (need >= 1; all n if the total falls short), and returns keep. The
 * masses are integers, so the answer does not depend on the order the
 * partitions add them in. Everything left of lo is kept; the cut lies in
 * c[lo..hi).
 */
static int32_t select_mass(struct cand *c, int32_t n, uint64_t need)
{
	int32_t lo = 0, hi = n;

	while (hi - lo > 16) {
		uint64_t better;
		int32_t p = partition(c, lo, hi, &better);

		if (better >= need) {
			hi = p;
			continue;
		}
		need -= better;
		if (c[p].q >= need)
			return p + 1;
		need -= c[p].q;
		lo = p + 1;
	}
	insertion_sort(c + lo, hi - lo);
	for (int32_t i = lo; i < hi; i++) {
		if (c[i].q >= need)
			return i + 1;
		need -= c[i].q;
	}
	return hi; /* the total falls short */
}

/* Draws j < n with probability c[j].w / sum of c[0..n).w. */
static int32_t draw(uint64_t rng[4], const struct cand *c, int32_t n)
{
	double total = 0.0, target, cum = 0.0;
	int32_t last = 0;

	for (int32_t j = 0; j < n; j++)
		total += c[j].w;
	target = loom_rng_uniform(rng) * total;
	for (int32_t j = 0; j < n; j++) {
		if (c[j].w <= 0.0)
			continue;
		cum += c[j].w;
		last = j;
		if (target < cum)
			return j;
	}
	return last; /* rounding left target at the very top */
}

/* Top-p, then min-p, over the top-k candidates in rank order (c[0].w is
 * 1); z is their total weight. Returns how many stay. */
static int32_t cut_ranked(const struct loom_sampler_params *p,
			  const struct cand *c, int32_t n, double z)
{
	int32_t keep = n, j = 1;

	if (p->top_p < 1.0f) {
		double need = (double)p->top_p * z, cum = 0.0;

		for (j = 0; j < n; j++) {
			cum += c[j].w;
			if (cum >= need) {
				keep = j + 1;
				break;
			}
		}
	}
	if (p->min_p > 0.0f) {
		j = 1;
		while (j < keep && c[j].w >= (double)p->min_p)
			j++;
		keep = j;
	}
	return keep;
}

/* Whether s draws from its top_k in rank order (else from the whole
 * vocabulary with integer masses). */
static bool ranked(const struct loom_sampler *s)
{
	return s->p.top_k > 0 && s->p.top_k < s->n_vocab;
}

/* The mass top-p needs of a total z: max(1, trunc(top_p * z)) in double. */
static uint64_t need_of(float top_p, uint64_t z)
{
	uint64_t need = (uint64_t)((double)top_p * (double)z);

	return need ? need : 1;
}

/* Keeps of s->cand[0..n) (id order) the ones that rank at or before the
 * last of sel[0..keep) (a quickselect's kept prefix); returns how many. */
static int32_t keep_ranked_before(struct loom_sampler *s, int32_t n, int32_t keep)
{
	const struct cand *last = &s->sel[0];
	int32_t m = 0;

	for (int32_t j = 1; j < keep; j++)
		if (before(last, &s->sel[j]))
			last = &s->sel[j];
	for (int32_t j = 0; j < n; j++)
		if (!before(last, &s->cand[j]))
			s->cand[m++] = s->cand[j];
	return m;
}

/* After the penalties, with max the top logit: the candidates the draw is
 * made from (top-k, softmax at temperature, top-p, min-p), their weights
 * in cand[].w (and masses in cand[].q without top-k: then in id order).
 * Returns how many. Shared by sample and probs, so both see the same set. */
static int32_t candidates(struct loom_sampler *s, const float *logits, float max)
{
	const struct loom_sampler_params *p = &s->p;
	double z = 0.0, inv_t = 1.0 / p->temp;
	uint64_t mass;
	int32_t n, keep;

	if (ranked(s)) {
		n = select_top_k(s, logits, p->top_k);
		for (int32_t j = 0; j < n; j++) {
			s->cand[j].w = exp(((double)s->cand[j].logit - max) * inv_t);
			z += s->cand[j].w;
		}
		return cut_ranked(p, s->cand, n, z);
	}
	/* min-p is the floor: the top-p prefix of the whole distribution,
	 * cut to the floor, is the prefix of the tokens above the floor that
	 * reaches top_p * z. */
	n = gather(s, logits, max, inv_t, p->min_p > 0.0f ? p->min_p : 0.0, &mass);
	if (p->top_p >= 1.0f || n == 0)
		return n;
	memcpy(s->sel, s->cand, (size_t)n * sizeof(*s->sel));
	keep = select_mass(s->sel, n, need_of(p->top_p, mass));
	return keep < n ? keep_ranked_before(s, n, keep) : n;
}

/* (a * b) >> 53 for a < 2^53, in 64-bit halves (exact). */
static uint64_t mul_shift53(uint64_t a, uint64_t b)
{
	uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
	uint64_t lo = a0 * b0, mid1 = a1 * b0, mid2 = a0 * b1, hi = a1 * b1;
	uint64_t mid = (lo >> 32) + (mid1 & 0xffffffffu) + (mid2 & 0xffffffffu);

	hi += (mid1 >> 32) + (mid2 >> 32) + (mid >> 32);
	lo = (mid << 32) | (lo & 0xffffffffu);
	return hi << 11 | lo >> 53;
}

/* Without top-k: draws j < n (id order) with probability c[j].q / their
 * total mass: target = (53 random bits * total) >> 53, the first whose
 * running mass exceeds it. */
static int32_t draw_mass(uint64_t rng[4], const struct cand *c, int32_t n)
{
	uint64_t total = 0, target, cum = 0;

	for (int32_t j = 0; j < n; j++)
		total += c[j].q;
	target = mul_shift53(loom_rng_next(rng) >> 11, total);
	for (int32_t j = 0; j < n; j++) {
		cum += c[j].q;
		if (target < cum)
			return j;
	}
	return 0; /* total 0: cannot happen, the top token's mass is 2^40 */
}

int32_t loom_sampler_sample(struct loom_sampler *s, float *logits,
			    const int32_t *history, int64_t n_history)
{
	const struct loom_sampler_params *p;
	int32_t greedy, n;
	float max;

	if (!s || !logits)
		return -1;
	p = &s->p;
	apply_penalties(s, logits, history, n_history);
	greedy = argmax(logits, s->n_vocab);
	max = key(logits[greedy]);
	if (p->temp <= 0.0f || !isfinite(max))
		return greedy;
	n = candidates(s, logits, max);
	if (!ranked(s))
		return s->cand[draw_mass(s->rng, s->cand, n)].id;
	return s->cand[draw(s->rng, s->cand, n)].id;
}

/* ---- sampling on the device (backend ABI 1.8, 1.9) ---- */

bool loom_sampler_device_ok(const struct loom_sampler *s, bool full)
{
	const struct loom_sampler_params *p;

	if (!s)
		return false;
	p = &s->p;
	return p->temp <= 0.0f || (full && !ranked(s)) ||
	       (ranked(s) && p->top_k <= LOOM_SAMPLE_MAX_TOP_K);
}

/* s->counts is all zero between calls; the window's counts are taken and
 * cleared again in the same two passes as apply_penalties. */
int32_t loom_sampler_device_row(const struct loom_sampler *s, const int32_t *history,
				int64_t n_history, struct loom_sample_row *row, int32_t first,
				int32_t *tok, int32_t *cnt, int32_t cap)
{
	const struct loom_sampler_params *p = &s->p;
	int32_t n = 0;
	int64_t start, i;

	*row = (struct loom_sample_row){
		.temp = p->temp, .top_p = p->top_p, .min_p = p->min_p, .top_k = p->top_k,
		.repeat_penalty = p->repeat_penalty, .presence_penalty = p->presence_penalty,
		.frequency_penalty = p->frequency_penalty, .pen_first = first,
		.rng = { s->rng[0], s->rng[1], s->rng[2], s->rng[3] },
	};
	if (penalties_off(p) || !history || n_history <= 0)
		return 0;
	start = n_history > p->penalty_last_n ? n_history - p->penalty_last_n : 0;
	for (i = start; i < n_history; i++)
		if (history[i] >= 0 && history[i] < s->n_vocab)
			s->counts[history[i]]++;
	for (i = start; i < n_history; i++) {
		int32_t t = history[i];

		if (t < 0 || t >= s->n_vocab || s->counts[t] == 0)
			continue;
		if (n < cap) {
			tok[n] = t;
			cnt[n] = s->counts[t];
		}
		n++;
		s->counts[t] = 0;
	}
	row->pen_count = n <= cap ? n : 0;
	return n <= cap ? n : -1;
}

void loom_sampler_device_drew(struct loom_sampler *s)
{
	if (s)
		(void)loom_rng_next(s->rng);
}

/* ---- log-probabilities (the rule of loom_sample_args, generation 1.9) ---- */

double loom_logprob_lse(const float *row, int32_t n)
{
	double max = -INFINITY, lane[LOOM_SAMPLE_LANES] = { 0 }, sum = 0.0;

	for (int32_t i = 0; i < n; i++)
		if (row[i] > max)
			max = row[i];
	if (!isfinite(max))
		return max;
	for (int32_t i = 0; i < n; i++)
		lane[i % LOOM_SAMPLE_LANES] += exp((double)row[i] - max);
	for (int j = 0; j < LOOM_SAMPLE_LANES; j++)
		sum += lane[j];
	return max + log(sum);
}

/* a ranks before b: larger (NaN as -inf, -0 as +0), then the lower id. */
static bool ranks_before(const float *row, int32_t a, int32_t b)
{
	float x = key(row[a]), y = key(row[b]);

	return x > y || (x == y && a < b);
}

void loom_logprob_top(const float *row, int32_t n, double lse, int32_t k,
		      struct loom_token_logprob *out)
{
	int32_t have = 0, i, j;

	for (i = 0; i < n && k > 0; i++) {
		if (have == k && !ranks_before(row, i, out[have - 1].token))
			continue;
		j = have < k ? have++ : k - 1;
		while (j > 0 && ranks_before(row, i, out[j - 1].token)) {
			out[j] = out[j - 1];
			j--;
		}
		out[j].token = i;
	}
	for (j = 0; j < have; j++)
		out[j].logprob = (float)((double)row[out[j].token] - lse);
	for (; j < k; j++)
		out[j] = (struct loom_token_logprob){ -1, NAN };
}

/* ---- the final distribution, for speculative decoding ---- */

int loom_sampler_probs(struct loom_sampler *s, float *logits,
		       const int32_t *history, int64_t n_history, float *probs)
{
	const struct loom_sampler_params *p;
	int32_t greedy, n;
	float max;
	double total = 0.0;

	if (!s || !logits || !probs)
		return -1;
	p = &s->p;
	apply_penalties(s, logits, history, n_history);
	greedy = argmax(logits, s->n_vocab);
	max = key(logits[greedy]);
	for (int32_t i = 0; i < s->n_vocab; i++)
		probs[i] = 0.0f;
	if (p->temp <= 0.0f || !isfinite(max)) {
		probs[greedy] = 1.0f;
		return 0;
	}
	n = candidates(s, logits, max); /* the set loom_sampler_sample draws from */
	for (int32_t j = 0; j < n; j++)
		total += ranked(s) ? s->cand[j].w : (double)s->cand[j].q;
	for (int32_t j = 0; j < n; j++)
		probs[s->cand[j].id] =
			(float)((ranked(s) ? s->cand[j].w : (double)s->cand[j].q) / total);
	return 0;
}
