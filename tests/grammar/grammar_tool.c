/* tests/grammar: drives core/engine/grammar.c for test_grammar.py.
 *
 *   grammar_tool check KIND SPECFILE
 *       stdin: one JSON string literal a line; stdout per line "1" (the
 *       text is a complete sentence), "p" (a proper prefix of one) or "0"
 *       (refused). A grammar that does not compile: "error: ..." and exit 2.
 *   grammar_tool walk GGUF KIND SPECFILE SEED N MAXTOK
 *       N random walks over the vocabulary's tokens, each step choosing
 *       among the tokens the mask allows, until EOG is allowed or MAXTOK
 *       tokens; stdout: each finished walk's text as a JSON string line.
 *       The first steps of the first walk check the mask against pushing
 *       every token one by one. Exit 1 on any inconsistency.
 *   grammar_tool bench GGUF KIND SPECFILE SEED N
 *       as walk, timing (thread CPU time) each step's mask on a fresh matcher (no cache)
 *       and on the walk's own (cached); prints the mean costs.
 *   grammar_tool tree GGUF KIND SPECFILE SEED N
 *       N random token trees (up to 40 nodes, tokens mostly allowed after
 *       their parent's path) along one random walk, pruned by
 *       loom_gmatch_tree: the rows kept must be exactly those whose path
 *       the chain API (push, keep) allows, each row's mask the mask after
 *       its own path. Exit 1 on any difference or when nothing was pruned.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/grammar.h"
#include "engine/rng.h"
#include "loom.h"
#include "text/tokenizer.h"

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
			buf[n] = 0;
			*len = (size_t)n;
		} else {
			free(buf);
			buf = NULL;
		}
	}
	fclose(f);
	return buf;
}

static struct loom_grammar *compile(const char *kind, const char *path)
{
	char err[512];
	size_t len = 0;
	char *text = strcmp(path, "-") ? read_file(path, &len) : NULL;
	struct loom_grammar *g;

	if (strcmp(path, "-") && !text) {
		printf("error: cannot read %s\n", path);
		return NULL;
	}
	g = loom_grammar_new(kind, text, len, err, sizeof(err));
	if (!g)
		printf("error: %s\n", err);
	free(text);
	return g;
}

static int cmd_check(const char *kind, const char *path)
{
	struct loom_grammar *g = compile(kind, path);
	char line[1 << 16];

	if (!g)
		return 2;
	while (fgets(line, sizeof(line), stdin)) {
		json_error_t je;
		json_t *s = json_loads(line, JSON_DECODE_ANY, &je);
		struct loom_gmatch *m = loom_gmatch_new(g, NULL);

		if (!s || !json_is_string(s) || !m) {
			fprintf(stderr, "check: bad input line: %s", line);
			return 1;
		}
		if (loom_gmatch_feed(m, json_string_value(s), json_string_length(s)))
			puts(loom_gmatch_overflowed(m) ? "overflow" : "0");
		else
			puts(loom_gmatch_done(m) ? "1" : "p");
		json_decref(s);
		loom_gmatch_free(m);
	}
	loom_grammar_free(g);
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the machine may be shared */
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Compares m's mask at level 0 with pushing each token alone. */
static int brute_check(struct loom_gmatch *m, const float *logits, int32_t V,
		       const struct loom_tokenizer *t)
{
	int bad = 0;

	for (int32_t i = 0; i < V; i++) {
		bool allowed = logits[i] == 0.0f, pushed;

		if (loom_tokenizer_is_eog(t, i)) {
			pushed = loom_gmatch_done(m);
		} else {
			pushed = loom_gmatch_push(m, i) == 0;
			loom_gmatch_keep(m, 0);
		}
		if (allowed != pushed && bad++ < 5)
			fprintf(stderr, "walk: token %d (%s): mask says %d, push says %d\n", i,
				loom_token_text(t, i), allowed, pushed);
	}
	return bad ? -1 : 0;
}

/* One token among the allowed ones: often one that starts with
 * punctuation (moves the structure on), else any. -1: none allowed. */
static int32_t pick(const float *logits, int32_t V, const struct loom_tokenizer *t,
		    uint64_t *rng, int32_t *cand)
{
	int32_t n = 0, np = 0;
	bool punct = loom_rng_uniform(rng) < 0.6;

	for (int32_t i = 0; i < V; i++) {
		size_t len;
		const char *s;

		if (logits[i] != 0.0f)
			continue;
		s = loom_tokenizer_piece(t, i, &len);
		if (punct && len && strchr("\"{}[],:", s[0])) {
			cand[np++] = i;
			continue;
		}
		if (!np)
			cand[n++] = i;
	}
	if (np)
		return cand[(int32_t)(loom_rng_uniform(rng) * np) % np];
	if (!n)
		return -1;
	return cand[(int32_t)(loom_rng_uniform(rng) * n) % n];
}

static int cmd_walk(const char *gguf, const char *kind, const char *path, uint64_t seed,
		    int n, int maxtok, bool bench)
{
	char err[512];
	struct loom_tokenizer *t = loom_tokenizer_open(gguf, err, sizeof(err));
	struct loom_grammar *g = compile(kind, path);
	struct loom_gvocab *v = t ? loom_gvocab_new(t) : NULL;
	int32_t V = t ? loom_tokenizer_n_vocab(t) : 0;
	float *logits = malloc(sizeof(float) * (size_t)(V + 1));
	int32_t *cand = malloc(sizeof(int32_t) * (size_t)(V + 1));
	uint64_t rng[4];
	double t_cold = 0, t_warm = 0;
	long steps = 0, allowed_sum = 0;
	uint64_t nodes = 0;
	int rc = 0;

	if (!t || !g || !v || !logits || !cand) {
		fprintf(stderr, "walk: %s\n", t ? "setup failed" : err);
		rc = 2;
		goto out;
	}
	loom_rng_seed(rng, seed);
	for (int w = 0; w < n && !rc; w++) {
		struct loom_gmatch *m = loom_gmatch_new(g, v);
		size_t cap = 1 << 16, len = 0;
		char *text = malloc(cap);
		bool done = false;

		for (int k = 0; k < maxtok && text; k++) {
			int32_t a, tok;
			const char *s;
			size_t pl;
			double t0;

			if (bench) {
				struct loom_gmatch_stats gs;
				struct loom_gmatch *fresh = loom_gmatch_new(g, v);

				loom_gmatch_feed(fresh, text, len);
				memset(logits, 0, sizeof(float) * (size_t)V);
				t0 = now();
				loom_gmatch_mask(fresh, 0, logits, V);
				t_cold += now() - t0;
				loom_gmatch_get_stats(fresh, &gs);
				nodes += gs.nodes_visited;
				loom_gmatch_free(fresh);
			}
			memset(logits, 0, sizeof(float) * (size_t)V);
			t0 = now();
			a = loom_gmatch_mask(m, 0, logits, V);
			t_warm += now() - t0;
			steps++;
			allowed_sum += a;
			if (a <= 0) {
				fprintf(stderr, "walk %d: nothing allowed after %zu bytes\n", w, len);
				rc = 1;
				break;
			}
			if (!bench && w == 0 && k < 4 && brute_check(m, logits, V, t))
				rc = 1;
			if (loom_gmatch_done(m) && loom_rng_uniform(rng) < 0.7) {
				done = true;
				break;
			}
			tok = pick(logits, V, t, rng, cand);
			if (tok < 0 || loom_tokenizer_is_eog(t, tok)) {
				done = tok >= 0;
				break;
			}
			if (loom_gmatch_push(m, tok)) {
				fprintf(stderr, "walk %d: allowed token %d refused by push\n", w, tok);
				rc = 1;
				break;
			}
			loom_gmatch_keep(m, 1);
			s = loom_tokenizer_piece(t, tok, &pl);
			if (len + pl + 1 > cap)
				break;
			memcpy(text + len, s, pl);
			len += pl;
		}
		if (done && !bench) {
			json_t *js = json_stringn(text, len);
			char *out = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;

			if (out)
				puts(out);
			else /* not UTF-8: still report it, the test fails on it */
				puts("\"<invalid UTF-8>\"");
			free(out);
			json_decref(js);
		}
		free(text);
		loom_gmatch_free(m);
	}
	if (bench)
		printf("vocab %d steps %ld allowed_mean %.0f trie_nodes_mean %.0f mask_cold_ms %.3f mask_cached_ms %.3f\n",
		       V, steps, steps ? (double)allowed_sum / steps : 0.0,
		       steps ? (double)nodes / steps : 0.0,
		       steps ? 1e3 * t_cold / steps : 0.0, steps ? 1e3 * t_warm / steps : 0.0);
out:
	free(logits);
	free(cand);
	loom_gvocab_free(v);
	loom_grammar_free(g);
	loom_tokenizer_free(t);
	return rc;
}

/* ---- tree: loom_gmatch_tree against pushing each node's path alone ---- */

#define TREE_NODES 40

/* A fresh matcher after tokens hist[0..n) (pushed one by one, the chain
 * API); NULL when one is refused. */
static struct loom_gmatch *after(const struct loom_grammar *g, const struct loom_gvocab *v,
				 const int32_t *hist, int32_t n)
{
	struct loom_gmatch *m = loom_gmatch_new(g, v);

	for (int32_t i = 0; m && i < n; i++) {
		if (loom_gmatch_push(m, hist[i])) {
			loom_gmatch_free(m);
			return NULL;
		}
		loom_gmatch_keep(m, 1);
	}
	return m;
}

/* Row r's path (committed tokens, then its ancestors' and its own) into
 * hist[n_hist ..]; returns the whole length. */
static int32_t path_of(const int32_t *tok, const int32_t *par, int32_t r, int32_t *hist,
		       int32_t n_hist)
{
	int32_t d = 0, rev[TREE_NODES + 1];

	for (int32_t x = r; x > 0; x = par[x])
		rev[d++] = tok[x - 1];
	for (int32_t i = 0; i < d; i++)
		hist[n_hist + i] = rev[d - 1 - i];
	return n_hist + d;
}

/* A random tree of k nodes after the committed hist[0..n): each node under
 * a random earlier row, its token mostly one the grammar allows after its
 * parent's path (when that path is allowed), else any token. */
static void random_tree(const struct loom_grammar *g, const struct loom_gvocab *v,
			const struct loom_tokenizer *t, int32_t V, uint64_t *rng, int32_t *hist,
			int32_t n, int32_t k, int32_t *tok, int32_t *par, float *logits,
			int32_t *cand)
{
	par[0] = -1;
	for (int32_t i = 1; i <= k; i++) {
		int32_t p = (int32_t)(loom_rng_uniform(rng) * i) % i;
		int32_t len = path_of(tok, par, p, hist, n);
		struct loom_gmatch *m = loom_rng_uniform(rng) < 0.8 ? after(g, v, hist, len) : NULL;
		int32_t x = -1;

		par[i] = p;
		if (m) {
			memset(logits, 0, sizeof(float) * (size_t)V);
			if (loom_gmatch_mask(m, 0, logits, V) > 0)
				x = pick(logits, V, t, rng, cand);
			loom_gmatch_free(m);
		}
		tok[i - 1] = x >= 0 ? x : (int32_t)(loom_rng_uniform(rng) * V) % V;
	}
}

/* Checks one pruned tree: the kept rows are exactly the rows whose path
 * the chain API allows, in order, parents renumbered; kept row r's mask
 * (level r) is the mask after r's own path. Returns the problems. */
static int check_tree(const struct loom_grammar *g, const struct loom_gvocab *v,
		      struct loom_gmatch *m, int32_t V, int32_t *hist, int32_t n, int32_t k,
		      const int32_t *tok, const int32_t *par, int32_t kept,
		      const int32_t *ktok, const int32_t *kpar, float *a, float *b)
{
	int32_t row[TREE_NODES + 1], nk = 0, bad = 0;

	row[0] = 0;
	for (int32_t i = 1; i <= k; i++) {
		int32_t len = path_of(tok, par, i, hist, n);
		struct loom_gmatch *ref = row[par[i]] >= 0 ? after(g, v, hist, len) : NULL;

		row[i] = ref ? ++nk : -1;
		if (!ref)
			continue;
		if (nk > kept || ktok[nk - 1] != tok[i - 1] || kpar[nk] != row[par[i]]) {
			if (bad++ < 5)
				fprintf(stderr, "tree: row %d (kept as %d) is wrong\n", i, nk);
			loom_gmatch_free(ref);
			continue;
		}
		memset(a, 0, sizeof(float) * (size_t)V);
		memset(b, 0, sizeof(float) * (size_t)V);
		loom_gmatch_mask(ref, 0, a, V);
		if (loom_gmatch_mask(m, nk, b, V) < 0 || memcmp(a, b, sizeof(float) * (size_t)V)) {
			if (bad++ < 5)
				fprintf(stderr, "tree: row %d's mask is not its path's\n", nk);
		}
		loom_gmatch_free(ref);
	}
	if (nk != kept && bad++ < 5)
		fprintf(stderr, "tree: %d rows kept, %d allowed\n", kept, nk);
	return bad;
}

/* N random trees along one random walk: after each, the walk keeps a
 * random kept row's path (keep at that level) and goes on by one token. */
static int cmd_tree(const char *gguf, const char *kind, const char *path, uint64_t seed, int n)
{
	char err[512];
	struct loom_tokenizer *t = loom_tokenizer_open(gguf, err, sizeof(err));
	struct loom_grammar *g = compile(kind, path);
	struct loom_gvocab *v = t ? loom_gvocab_new(t) : NULL;
	int32_t V = t ? loom_tokenizer_n_vocab(t) : 0, hist[4096], nh = 0;
	float *a = malloc(sizeof(float) * (size_t)(V + 1)), *b = malloc(sizeof(float) * (size_t)(V + 1));
	int32_t *cand = malloc(sizeof(int32_t) * (size_t)(V + 1));
	struct loom_gmatch *m = g && v ? loom_gmatch_new(g, v) : NULL;
	long nodes = 0, kept_sum = 0;
	uint64_t rng[4];
	int bad = 0, walks = 1;

	if (!m || !a || !b || !cand) {
		fprintf(stderr, "tree: %s\n", t ? "setup failed" : err);
		bad = 2;
		goto out;
	}
	loom_rng_seed(rng, seed);
	for (int s = 0; s < n && !bad && m && nh < 3000; s++) {
		int32_t tok[TREE_NODES], par[TREE_NODES + 1], ktok[TREE_NODES], kpar[TREE_NODES + 1];
		int32_t k = 1 + (int32_t)(loom_rng_uniform(rng) * TREE_NODES) % TREE_NODES, kept, r, x;

		random_tree(g, v, t, V, rng, hist, nh, k, tok, par, a, cand);
		memcpy(ktok, tok, sizeof(int32_t) * (size_t)k);
		memcpy(kpar, par, sizeof(int32_t) * (size_t)(k + 1));
		kept = loom_gmatch_tree(m, k, ktok, kpar);
		bad += check_tree(g, v, m, V, hist, nh, k, tok, par, kept, ktok, kpar, a, b);
		nodes += k;
		kept_sum += kept;
		/* the walk takes a random kept row's path, then one allowed token */
		r = (int32_t)(loom_rng_uniform(rng) * (kept + 1)) % (kept + 1);
		loom_gmatch_keep(m, r);
		nh = path_of(ktok, kpar, r, hist, nh);
		memset(a, 0, sizeof(float) * (size_t)V);
		x = loom_gmatch_mask(m, 0, a, V) > 0 ? pick(a, V, t, rng, cand) : -1;
		if (x < 0 || loom_tokenizer_is_eog(t, x) || loom_gmatch_push(m, x)) {
			/* the document is complete: a new walk */
			loom_gmatch_free(m);
			m = loom_gmatch_new(g, v);
			walks++;
			nh = 0;
			continue;
		}
		loom_gmatch_keep(m, 1);
		hist[nh++] = x;
	}
	printf("trees: %ld nodes, %ld kept, %d walks\n", nodes, kept_sum, walks);
	if (kept_sum == 0 || kept_sum == nodes) {
		fprintf(stderr, "tree: nothing %s: the check saw no pruning\n",
			kept_sum ? "pruned" : "kept");
		bad++;
	}
out:
	loom_gmatch_free(m);
	free(a);
	free(b);
	free(cand);
	loom_gvocab_free(v);
	loom_grammar_free(g);
	loom_tokenizer_free(t);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "check"))
		return cmd_check(argv[2], argv[3]);
	if (argc == 8 && !strcmp(argv[1], "walk"))
		return cmd_walk(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 10),
				atoi(argv[6]), atoi(argv[7]), false);
	if (argc == 7 && !strcmp(argv[1], "bench"))
		return cmd_walk(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 10),
				atoi(argv[6]), 200, true);
	if (argc == 7 && !strcmp(argv[1], "tree"))
		return cmd_tree(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 10), atoi(argv[6]));
	fprintf(stderr, "usage: grammar_tool check KIND SPECFILE | walk GGUF KIND SPECFILE SEED N MAXTOK | bench GGUF KIND SPECFILE SEED N | tree GGUF KIND SPECFILE SEED N\n");
	return 2;
}
