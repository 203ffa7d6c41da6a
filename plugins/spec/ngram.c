/*
 * ngram.so: prompt lookup decoding. No model: the drafts are what followed
 * earlier occurrences of the sequence's last n tokens (n from ngram_max
 * down to ngram_min, the longest suffix that occurs wins).
 *
 * Where the suffix occurs more than once, the draft follows the
 * continuation most occurrences agree on: at each draft position the
 * token that follows the most of the occurrences still in agreement is
 * taken (a tie goes to the most recent occurrence), and the occurrences
 * that disagree drop out. With one occurrence this is plain prompt
 * lookup; a continuation that runs into the end of the sequence repeats
 * with the match's period.
 *
 * The lookup covers the request's own tokens (prompt and output) first,
 * then the sequences of requests that ended earlier in this process (in
 * `loom serve`: the same server's earlier requests), kept in a store of
 * bounded size, least recently used first out (the SuffixDecoding idea:
 * chat and agent traffic repeats itself across requests).
 *
 * With trees on (spec_tree > 0, propose_tree) the occurrences are not
 * collapsed to one path: the continuations they give form a trie, and
 * its nodes go into the tree heaviest first (a node's weight: how many
 * occurrences follow it), each at most the adaptive draft length deep:
 * the majority path (what a chain would propose) with any weight, and
 * beside it the alternatives that at least BRANCH_MIN occurrences took,
 * until the node budget is spent. (Alternatives of weight 1 cost more
 * rows than they win on chat: measured in docs/SPECULATIVE.md.)
 *
 * The tree's width (side nodes allowed beside the majority path) adapts
 * per sequence to what side branches win: after each tree, the tokens
 * its accepted path gained past the majority path's share, per side node
 * verified, enter a running rate; the width doubles while the rate is at
 * least WIDTH_GROW and halves below WIDTH_SHRINK. At width 0 the tree is
 * the majority path alone, and every WIDTH_PROBE trees one side node is
 * tried again.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "spec_common.h"

#define MAX_OCC 64                /* occurrences followed per lookup */
#define STORE_SEQS 64             /* sequences kept from ended requests */
#define STORE_TOKENS (1 << 20)    /* and their tokens at most (4 MiB) */
#define STORE_MIN_TOKENS 16       /* shorter requests are not kept */
#define MAX_SUFFIX 32             /* suffix lengths with their own rate */
#define RATE_FLOOR 0.15f          /* below: matches of that length sit out */
#define PROBE_EVERY 16            /* ... and are tried again after this many */
#define BRANCH_MIN 2              /* occurrences behind a tree's side branch */
#define TREE_MAX 64               /* nodes a tree holds at most */
#define WIDTH_GROW 0.25f          /* tokens won per side node: width doubles */
#define WIDTH_SHRINK 0.10f        /* below: width halves */
#define WIDTH_PROBE 16            /* trees at width 0 before one side node */
#define CURSOR_SLACK 3            /* tokens an occurrence may sit off the copy cursor */

struct loom_spec_ctx {
	const struct loom_spec_host *host;
	struct loom_spec_params p;
	int32_t k;      /* current draft length */
	/* per suffix length: running acceptance rate of its proposals, and
	 * lookups it sat out since its rate fell under RATE_FLOOR */
	float rate[MAX_SUFFIX + 1];
	int32_t idle[MAX_SUFFIX + 1];
	int32_t last_s; /* suffix length of the last proposal; 0: none */
	int32_t last_depth; /* of the last tree proposal; 0: a chain */
	/* tree width: side nodes allowed, the running rate of tokens side
	 * nodes won, trees proposed at width 0 since the last probe */
	int32_t width;
	float side_rate;
	int32_t narrow;
	/* the last tree (nodes as proposed): on[i] says node i is on the
	 * majority path; last_n 0 when the last proposal was no tree */
	int32_t last_tok[TREE_MAX], last_par[TREE_MAX], last_n;
	bool last_on[TREE_MAX];
	/* where copying stands: the request's own token at cur_src was
	 * aligned with sequence position cur_seq (cur_src -1: nowhere);
	 * last_from: the continuation start the last chain followed in the
	 * request's own tokens (-1: none), at sequence length last_n_seq */
	int64_t cur_src, cur_seq, last_from, last_n_seq;
	int32_t *mine;  /* a copy of the sequence, for the store */
	int64_t n_mine, cap_mine;
};

/* One sequence to look in: tokens t[0..n), and for the request's own
 * sequence, the drafts so far continue it (d, periodic continuation). */
struct text {
	const int32_t *t;
	int64_t n;
	const int32_t *d; /* NULL: a stored sequence, nothing past its end */
};

/* ---- the store of ended requests (shared by every context) ---- */

static struct {
	pthread_mutex_t mu;
	int32_t *seq[STORE_SEQS]; /* most recently used first */
	int64_t len[STORE_SEQS];
	int n;
	int64_t tokens;
} store = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* Moves entry i to the front (store.mu held). */
static void store_touch(int i)
{
	int32_t *s = store.seq[i];
	int64_t l = store.len[i];

	memmove(store.seq + 1, store.seq, sizeof(store.seq[0]) * (size_t)i);
	memmove(store.len + 1, store.len, sizeof(store.len[0]) * (size_t)i);
	store.seq[0] = s;
	store.len[0] = l;
}

/* Takes ownership of s[0..n) (frees it when not kept). */
static void store_add(int32_t *s, int64_t n)
{
	if (n < STORE_MIN_TOKENS || n > STORE_TOKENS) {
		free(s);
		return;
	}
	pthread_mutex_lock(&store.mu);
	for (int i = 0; i < store.n; i++) {
		if (store.len[i] == n && !memcmp(store.seq[i], s, sizeof(int32_t) * (size_t)n)) {
			store_touch(i); /* the same request again: keep one */
			pthread_mutex_unlock(&store.mu);
			free(s);
			return;
		}
	}
	while (store.n > 0 && (store.n == STORE_SEQS || store.tokens + n > STORE_TOKENS)) {
		store.n--;
		store.tokens -= store.len[store.n];
		free(store.seq[store.n]);
	}
	store.seq[store.n] = s;
	store.len[store.n] = n;
	store.tokens += n;
	store_touch(store.n++);
	pthread_mutex_unlock(&store.mu);
}

/* ---- lookup ---- */

static int32_t text_at(const struct text *x, int64_t i)
{
	return i < x->n ? x->t[i] : x->d ? x->d[i - x->n] : -1;
}

/* Up to max starts of continuations of earlier occurrences of the last s
 * tokens of suf in x, most recent first (the suffix itself excluded when
 * x is the request's own sequence). Returns how many. */
static int find_occ(const struct text *x, const int32_t *suf, int32_t s, int64_t *occ,
		    int max)
{
	int n = 0;

	/* a start at n - s would be the suffix itself (own sequence) or have
	 * nothing after it (stored) */
	for (int64_t j = x->n - s - 1; j >= 0 && n < max; j--)
		if (x->t[j] == suf[0] && !memcmp(x->t + j, suf, sizeof(int32_t) * (size_t)s))
			occ[n++] = j + s;
	return n;
}

/* Follows the occurrences (continuation starts occ[0..n_occ), most
 * recent first) by majority, writing up to want drafts to out (out may
 * be x->d). Returns how many. */
static int32_t follow(const struct text *x, int64_t *occ, int n_occ, int32_t want,
		      int32_t *out)
{
	int32_t i;

	for (i = 0; i < want && n_occ > 0; i++) {
		int32_t best = -1, best_n = 0;
		int kept = 0;

		for (int a = 0; a < n_occ; a++) { /* first seen = most recent */
			int32_t t = text_at(x, occ[a] + i), c = 0;

			if (t < 0 || t == best)
				continue;
			for (int b = a; b < n_occ; b++)
				c += text_at(x, occ[b] + i) == t;
			if (c > best_n)
				best = t, best_n = c;
		}
		if (best < 0)
			break;
		out[i] = best;
		for (int a = 0; a < n_occ; a++)
			if (text_at(x, occ[a] + i) == best)
				occ[kept++] = occ[a];
		n_occ = kept;
	}
	return i;
}

/* Whether matches of suffix length s may propose now: those whose
 * proposals are mostly rejected sit out, with a probe now and then. */
static bool length_ok(struct loom_spec_ctx *c, int32_t s)
{
	if (c->rate[s] >= RATE_FLOOR)
		return true;
	if (++c->idle[s] < PROBE_EVERY)
		return false;
	c->idle[s] = 0;
	return true;
}

/* Where the copy cursor says the sequence of length n continues in the
 * request's own tokens: each token since the last alignment moved it one
 * on (a substituted word keeps its length). -1: no cursor. */
static int64_t cursor_at(const struct loom_spec_ctx *c, int64_t n)
{
	return c->cur_src < 0 ? -1 : c->cur_src + (n - c->cur_seq);
}

static int64_t dist(int64_t a, int64_t b)
{
	return a > b ? a - b : b - a;
}

/* Of several occurrences, the one nearest the copy cursor, if one is
 * within CURSOR_SLACK of it: copying goes on where it was, rather than at
 * whichever earlier place the suffix also occurs (a comma, a "the"). */
static int near_cursor(int64_t at, const int64_t *occ, int n_occ)
{
	int best = -1;

	for (int a = 0; at >= 0 && a < n_occ; a++)
		if (dist(occ[a], at) <= CURSOR_SLACK &&
		    (best < 0 || dist(occ[a], at) < dist(occ[best], at)))
			best = a;
	return best;
}

/* Drafts from the longest suffix of h[0..n) that occurs in x (c->last_s
 * gets its length). */
static int32_t lookup(struct loom_spec_ctx *c, const struct text *x, const int32_t *h,
		      int64_t n, int32_t want, int32_t *out)
{
	int64_t occ[MAX_OCC];
	int32_t k;

	for (int32_t s = c->p.ngram_max; s >= c->p.ngram_min; s--) {
		int n_occ;

		if (s >= n || s > x->n)
			continue;
		n_occ = find_occ(x, h + n - s, s, occ, MAX_OCC);
		if (n_occ == 0)
			continue;
		if (!length_ok(c, s))
			return 0; /* a shorter match would be no better */
		c->last_s = s;
		if (x->d && n_occ > 1) { /* the request's own tokens */
			int a = near_cursor(cursor_at(c, n), occ, n_occ);

			if (a >= 0) {
				occ[0] = occ[a];
				n_occ = 1;
			}
		}
		k = follow(x, occ, n_occ, want, out);
		/* follow() keeps the occurrences that agree, most recent first */
		c->last_from = x->d && k > 0 ? occ[0] : -1;
		return k;
	}
	return 0;
}

/* Drafts from the store, most recently used sequence first; the one that
 * gives them moves to the front. */
static int32_t lookup_store(struct loom_spec_ctx *c, const int32_t *h, int64_t n,
			    int32_t want, int32_t *out)
{
	int32_t k = 0;

	pthread_mutex_lock(&store.mu);
	for (int i = 0; i < store.n && k == 0; i++) {
		struct text x = { .t = store.seq[i], .n = store.len[i] };

		k = lookup(c, &x, h, n, want, out);
		if (k > 0)
			store_touch(i);
	}
	pthread_mutex_unlock(&store.mu);
	return k;
}

/* Keeps the copy of the sequence up to date (what ends in the store). */
static void remember(struct loom_spec_ctx *c, const int32_t *h, int64_t n)
{
	if (n > c->cap_mine) {
		int64_t cap = n > 2 * c->cap_mine ? n : 2 * c->cap_mine;
		int32_t *p = realloc(c->mine, sizeof(int32_t) * (size_t)cap);

		if (!p)
			return; /* the store just misses this request */
		c->mine = p;
		c->cap_mine = cap;
	}
	if (n < c->n_mine)
		c->n_mine = 0;
	memcpy(c->mine + c->n_mine, h + c->n_mine, sizeof(int32_t) * (size_t)(n - c->n_mine));
	c->n_mine = n;
}

static int ngram_create(const struct loom_spec_host *host,
			const struct loom_spec_params *params,
			struct loom_spec_ctx **out, char *msg, size_t msg_len)
{
	struct loom_spec_ctx *c = calloc(1, sizeof(*c));

	(void)msg, (void)msg_len;
	if (!c)
		return LOOM_ERR_NOMEM;
	c->host = host;
	c->p = *params;
	if (c->p.ngram_max > MAX_SUFFIX) /* a longer match has this suffix too */
		c->p.ngram_max = MAX_SUFFIX;
	if (c->p.ngram_min > c->p.ngram_max)
		c->p.ngram_min = c->p.ngram_max;
	c->k = params->max_draft;
	c->cur_src = c->last_from = -1;
	c->width = TREE_MAX; /* all the host's budget allows, until measured */
	c->side_rate = WIDTH_GROW;
	for (int s = 0; s <= MAX_SUFFIX; s++)
		c->rate[s] = 1.0f;
	*out = c;
	return 0;
}

static void ngram_destroy(struct loom_spec_ctx *c)
{
	store_add(c->mine, c->n_mine);
	free(c);
}

static int ngram_propose(struct loom_spec_ctx *c, struct loom_spec_draft *d)
{
	int64_t n;
	const int32_t *h = c->host->tokens(c->host->host, &n);
	int32_t want = c->k < d->max ? c->k : d->max, k;
	struct text own = { .t = h, .n = n, .d = d->tokens };

	remember(c, h, n);
	c->last_s = 0;
	c->last_from = -1;
	c->last_n_seq = n;
	k = lookup(c, &own, h, n, want, d->tokens);
	if (k == 0)
		k = lookup_store(c, h, n, want, d->tokens);
	d->has_probs = 0;
	return k;
}

/* ---- trees ---- */

/* A tree being grown: node i has token tok[i], parent par[i] (-1: the
 * last token) and depth dep[i] (1 for a child of the last token). */
struct grow {
	const struct text *x;
	const int64_t *occ;
	int n_occ;
	int32_t at[MAX_OCC]; /* the deepest node each occurrence follows (-1: root) */
	int32_t *tok, *par, dep[TREE_MAX];
	bool on[TREE_MAX]; /* on the majority path */
	int32_t n;
	int32_t tip; /* the majority path's last node (-1: none yet; no child) */
	int32_t side_left; /* side nodes the width still allows */
};

/* Token at position i of the sequence continued along node v's path:
 * past the end of the request's own tokens, the path itself (a match
 * running into the end repeats with its period). -1: nothing there. */
static int32_t grow_text(const struct grow *g, int32_t v, int64_t i)
{
	int64_t m = i - g->x->n;

	if (i < g->x->n)
		return g->x->t[i];
	if (!g->x->d || v < 0 || m >= g->dep[v])
		return -1;
	while (g->dep[v] > m + 1)
		v = g->par[v];
	return g->tok[v];
}

/* Token occurrence a proposes after its node, or -1. */
static int32_t grow_next(const struct grow *g, int a)
{
	int32_t v = g->at[a];

	return grow_text(g, v, g->occ[a] + (v < 0 ? 0 : g->dep[v]));
}

/* Adds the heaviest child not in the tree yet (most occurrences at its
 * parent agreeing on it; ties to the most recent), of a node less than
 * depth deep. False when none is left. */
static bool grow_one(struct grow *g, int32_t depth)
{
	int32_t best_a = -1, best_n = 0, t, v;

	for (int a = 0; a < g->n_occ; a++) {
		int32_t c = 0;

		v = g->at[a];
		if ((v >= 0 && g->dep[v] >= depth) || (t = grow_next(g, a)) < 0)
			continue;
		for (int b = a; b < g->n_occ; b++)
			c += g->at[b] == v && grow_next(g, b) == t;
		if (c > best_n && ((c >= BRANCH_MIN && g->side_left > 0) || v == g->tip))
			best_a = a, best_n = c;
	}
	if (best_a < 0)
		return false;
	v = g->at[best_a];
	t = grow_next(g, best_a);
	g->on[g->n] = v == g->tip;
	if (v == g->tip)
		g->tip = g->n; /* the majority path goes on */
	else
		g->side_left--;
	g->tok[g->n] = t;
	g->par[g->n] = v;
	g->dep[g->n] = v < 0 ? 1 : g->dep[v] + 1;
	for (int a = 0; a < g->n_occ; a++) /* before at[] moves: same parent */
		if (a != best_a && g->at[a] == v && grow_next(g, a) == t)
			g->at[a] = g->n;
	g->at[best_a] = g->n++;
	return true;
}

/* The tree of continuations of the longest suffix of h[0..n) found in x,
 * up to t->max nodes and depth deep. Returns its nodes. */
static int32_t lookup_tree(struct loom_spec_ctx *c, const struct text *x, const int32_t *h,
			   int64_t n, int32_t depth, struct loom_spec_tree *t)
{
	int64_t occ[MAX_OCC];
	struct grow g = { .x = x, .occ = occ, .tok = t->tokens, .par = t->parent, .tip = -1,
			  .side_left = c->width };
	int32_t max = t->max < TREE_MAX ? t->max : TREE_MAX;

	for (int32_t s = c->p.ngram_max; s >= c->p.ngram_min; s--) {
		if (s >= n || s > x->n)
			continue;
		g.n_occ = find_occ(x, h + n - s, s, occ, MAX_OCC);
		if (g.n_occ == 0)
			continue;
		if (!length_ok(c, s))
			return 0;
		c->last_s = s;
		for (int a = 0; a < g.n_occ; a++)
			g.at[a] = -1;
		while (g.n < max && grow_one(&g, depth))
			;
		for (int32_t i = 0; i < g.n; i++)
			if (g.dep[i] > c->last_depth)
				c->last_depth = g.dep[i];
		memcpy(c->last_tok, g.tok, sizeof(int32_t) * (size_t)g.n);
		memcpy(c->last_par, g.par, sizeof(int32_t) * (size_t)g.n);
		memcpy(c->last_on, g.on, sizeof(bool) * (size_t)g.n);
		c->last_n = g.n;
		return g.n;
	}
	return 0;
}

static int ngram_propose_tree(struct loom_spec_ctx *c, struct loom_spec_tree *t)
{
	int64_t n;
	const int32_t *h = c->host->tokens(c->host->host, &n);
	struct text own = { .t = h, .n = n, .d = h }; /* d: continuations follow the path */
	int32_t k;

	remember(c, h, n);
	c->last_s = 0;
	c->last_depth = 0;
	c->last_n = 0;
	if (c->width == 0 && ++c->narrow >= WIDTH_PROBE) { /* probe one side node */
		c->width = 1;
		c->narrow = 0;
		c->side_rate = WIDTH_SHRINK;
	}
	k = lookup_tree(c, &own, h, n, c->k, t);
	pthread_mutex_lock(&store.mu);
	for (int i = 0; i < store.n && k == 0; i++) {
		struct text x = { .t = store.seq[i], .n = store.len[i] };

		k = lookup_tree(c, &x, h, n, c->k, t);
		if (k > 0)
			store_touch(i);
	}
	pthread_mutex_unlock(&store.mu);
	return k;
}

/* The last tree's verified nodes (the first n_proposed) against what
 * was accepted: adds the tokens its side nodes won (the accepted path's
 * nodes past its majority-path prefix) per side node verified to the
 * running rate, and grows or shrinks the width by it. */
static void adapt_width(struct loom_spec_ctx *c, const struct loom_spec_outcome *o)
{
	int32_t n = o->n_proposed < c->last_n ? o->n_proposed : c->last_n;
	int32_t side = 0, on_main = 0, v = -1, d = 0;

	for (int32_t i = 0; i < n; i++)
		side += !c->last_on[i];
	if (side == 0)
		return;
	/* walk the accepted tokens down the tree (siblings are distinct) */
	for (; d < o->n_accepted && d < o->n_new; d++) {
		int32_t next = -1;

		for (int32_t i = 0; i < n && next < 0; i++)
			if (c->last_par[i] == v && c->last_tok[i] == o->new_tokens[d])
				next = i;
		if (next < 0)
			break;
		v = next;
		on_main += c->last_on[v] && on_main == d;
	}
	c->side_rate = 0.8f * c->side_rate + 0.2f * (float)(d - on_main) / (float)side;
	if (c->side_rate >= WIDTH_GROW)
		c->width = c->width * 2 > TREE_MAX ? TREE_MAX : c->width * 2;
	else if (c->side_rate < WIDTH_SHRINK)
		c->width /= 2;
}

static void ngram_observe(struct loom_spec_ctx *c, const struct loom_spec_outcome *o)
{
	struct loom_spec_outcome chain = *o;
	int32_t s = c->last_s;

	if (c->last_n > 0)
		adapt_width(c, o);
	c->last_n = 0;

	/* a tree counts as a chain as deep as it: the depth adapts */
	if (c->last_depth > 0)
		chain.n_proposed = c->last_depth;
	c->last_depth = 0;
	c->k = spec_adapt(c->k, &c->p, &chain);
	if (c->last_from >= 0) { /* the pass aligned the cursor */
		c->cur_src = c->last_from + chain.n_accepted + 1;
		c->cur_seq = c->last_n_seq + chain.n_accepted + 1;
		c->last_from = -1;
	}
	if (s > 0 && chain.n_proposed > 0)
		c->rate[s] = 0.8f * c->rate[s] +
			     0.2f * (float)chain.n_accepted / (float)chain.n_proposed;
}

static const struct loom_spec_plugin ngram_plugin = {
	.abi_major = LOOM_SPEC_ABI_MAJOR,
	.abi_minor = LOOM_SPEC_ABI_MINOR,
	.struct_size = sizeof(struct loom_spec_plugin),
	.name = "ngram",
	.create = ngram_create,
	.propose = ngram_propose,
	.observe = ngram_observe,
	.destroy = ngram_destroy,
	.propose_tree = ngram_propose_tree,
};

__attribute__((visibility("default")))
const struct loom_spec_plugin *loom_spec_entry(void)
{
	return &ngram_plugin;
}
