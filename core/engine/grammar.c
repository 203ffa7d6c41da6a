/* Grammar-constrained decoding: grammars over bytes, run as a pushdown
 * automaton whose states mask the vocabulary (see grammar.h). */
#include "engine/grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "util.h"

/* An element is an int32: type in the low 2 bits, argument above. */
enum { E_END = 0, E_SET = 1, E_REF = 2 };
#define ELEM(type, arg) ((int32_t)(((uint32_t)(arg) << 2) | (type)))
#define ETYPE(e) ((e) & 3)
#define EARG(e) ((int32_t)((uint32_t)(e) >> 2))

#define MAX_DEPTH 96      /* positions on one stack */
#define MAX_STACKS LOOM_GRAMMAR_MAX_STACKS /* stacks in one state: more fails the matcher */
#define EXPAND_BUDGET 4096 /* rule expansions for one stack (guards nullable loops) */
#define MAX_LEVELS 65     /* current state + 64 drafts */
#define CACHE_SIZE 16
#define MAX_INTERNED 4096 /* states remembered with their moves; then forgotten */
#define INTERN_FIRST 64   /* room for states a new matcher starts with */
#define MOVE_UNKNOWN (-2)
#define MOVE_DEAD (-1)
#define MOVE_OVERFLOW (-4) /* the state reached has more than MAX_STACKS stacks */

struct loom_grammar {
	int refs;            /* atomic */
	int32_t *elems;      /* alternatives, each ending in E_END */
	int32_t n_elems;
	uint64_t (*sets)[4]; /* 256-bit byte sets */
	int32_t n_sets;
	int32_t *alt0;       /* rule r's alternatives: alts[alt0[r] .. alt0[r + 1]) */
	int32_t *alts;       /* each alternative's first element */
	int32_t n_rules;
	int32_t start;       /* position of the root's REF */
	/* Bytes that lie in the same sets behave alike in every state
	 * (advance sees a byte only through set membership): byte b is in
	 * class cls[b], whose bytes are cls_bits[cls[b]]. */
	uint8_t cls[256];
	uint64_t (*cls_bits)[4];
	int32_t n_cls;
};

/* ---------------- building ---------------- */

struct brule {
	struct gseq *alt;
	int32_t n, cap;
};

struct gbuild {
	struct brule *rules;
	int32_t n_rules, cap_rules;
	uint64_t (*sets)[4];
	int32_t n_sets, cap_sets;
	int32_t single[256]; /* set index of each one-byte set, or -1 */
	bool oom;
};

struct gbuild *gbuild_new(void)
{
	struct gbuild *b = calloc(1, sizeof(*b));

	if (b)
		memset(b->single, 0xff, sizeof(b->single));
	return b;
}

void gseq_free(struct gseq *s)
{
	free(s->v);
	*s = (struct gseq){ 0 };
}

void gbuild_free(struct gbuild *b)
{
	if (!b)
		return;
	for (int32_t r = 0; r < b->n_rules; r++) {
		for (int32_t a = 0; a < b->rules[r].n; a++)
			gseq_free(&b->rules[r].alt[a]);
		free(b->rules[r].alt);
	}
	free(b->rules);
	free(b->sets);
	free(b);
}

/* Grows *p (of *cap items of size sz) to hold n items. */
static bool grow(void *p, int32_t *cap, int32_t n, size_t sz)
{
	void **pp = p;
	int32_t c = *cap ? *cap : 8;
	void *q;

	if (n <= *cap)
		return true;
	while (c < n)
		c *= 2;
	q = realloc(*pp, (size_t)c * sz);
	if (!q)
		return false;
	*pp = q;
	*cap = c;
	return true;
}

int32_t gbuild_rule(struct gbuild *b)
{
	if (!grow(&b->rules, &b->cap_rules, b->n_rules + 1, sizeof(*b->rules))) {
		b->oom = true;
		return -1;
	}
	b->rules[b->n_rules] = (struct brule){ 0 };
	return b->n_rules++;
}

void gbuild_alt(struct gbuild *b, int32_t r, struct gseq *s)
{
	struct brule *ru;

	if (r < 0 || r >= b->n_rules || s->oom) {
		b->oom = true;
		gseq_free(s);
		return;
	}
	ru = &b->rules[r];
	if (!grow(&ru->alt, &ru->cap, ru->n + 1, sizeof(*ru->alt))) {
		b->oom = true;
		gseq_free(s);
		return;
	}
	ru->alt[ru->n++] = *s;
	*s = (struct gseq){ 0 };
}

static void seq_put(struct gseq *s, int32_t e)
{
	if (s->oom || !grow(&s->v, &s->cap, s->n + 1, sizeof(*s->v))) {
		s->oom = true;
		return;
	}
	s->v[s->n++] = e;
}

/* Index of byte set bits (deduplicated), or -1. */
static int32_t set_index(struct gbuild *b, const uint64_t bits[4])
{
	for (int32_t i = 0; i < b->n_sets; i++)
		if (!memcmp(b->sets[i], bits, sizeof(b->sets[i])))
			return i;
	if (!grow(&b->sets, &b->cap_sets, b->n_sets + 1, sizeof(*b->sets))) {
		b->oom = true;
		return -1;
	}
	memcpy(b->sets[b->n_sets], bits, sizeof(b->sets[0]));
	return b->n_sets++;
}

void gseq_byte(struct gbuild *b, struct gseq *s, unsigned char c)
{
	if (b->single[c] < 0) {
		uint64_t bits[4] = { 0 };

		bits[c >> 6] |= 1ull << (c & 63);
		b->single[c] = set_index(b, bits);
	}
	if (b->single[c] < 0) {
		s->oom = true;
		return;
	}
	seq_put(s, ELEM(E_SET, b->single[c]));
}

void gseq_lit(struct gbuild *b, struct gseq *s, const char *text, size_t n)
{
	for (size_t i = 0; i < n; i++)
		gseq_byte(b, s, (unsigned char)text[i]);
}

void gseq_range(struct gbuild *b, struct gseq *s, unsigned lo, unsigned hi,
		const char *except)
{
	uint64_t bits[4] = { 0 };
	int32_t i;

	for (unsigned c = lo; c <= hi && c < 256; c++)
		bits[c >> 6] |= 1ull << (c & 63);
	for (; except && *except; except++) {
		unsigned c = (unsigned char)*except;

		bits[c >> 6] &= ~(1ull << (c & 63));
	}
	i = set_index(b, bits);
	if (i < 0) {
		s->oom = true;
		return;
	}
	seq_put(s, ELEM(E_SET, i));
}

void gseq_chars(struct gbuild *b, struct gseq *s, const char *chars)
{
	uint64_t bits[4] = { 0 };
	int32_t i;

	for (; *chars; chars++) {
		unsigned c = (unsigned char)*chars;

		bits[c >> 6] |= 1ull << (c & 63);
	}
	i = set_index(b, bits);
	if (i < 0) {
		s->oom = true;
		return;
	}
	seq_put(s, ELEM(E_SET, i));
}

void gseq_ref(struct gseq *s, int32_t rule)
{
	if (rule < 0) {
		s->oom = true;
		return;
	}
	seq_put(s, ELEM(E_REF, rule));
}

/* Flattens the rules into g's arrays. */
static int flatten(struct gbuild *b, struct loom_grammar *g, int32_t root)
{
	int64_t n_elems = 2, n_alts = 0;
	int32_t pos = 0, k = 0;

	for (int32_t r = 0; r < b->n_rules; r++) {
		n_alts += b->rules[r].n;
		for (int32_t a = 0; a < b->rules[r].n; a++)
			n_elems += b->rules[r].alt[a].n + 1;
	}
	if (n_elems > INT32_MAX / 8 || n_alts > INT32_MAX / 8)
		return -1;
	g->elems = malloc(sizeof(int32_t) * (size_t)n_elems);
	g->alts = malloc(sizeof(int32_t) * (size_t)(n_alts + 1));
	g->alt0 = malloc(sizeof(int32_t) * (size_t)(b->n_rules + 1));
	if (!g->elems || !g->alts || !g->alt0)
		return -1;
	/* the start: a stack of one REF to the root */
	g->elems[pos++] = ELEM(E_REF, root);
	g->elems[pos++] = E_END;
	g->start = 0;
	for (int32_t r = 0; r < b->n_rules; r++) {
		g->alt0[r] = k;
		for (int32_t a = 0; a < b->rules[r].n; a++) {
			struct gseq *s = &b->rules[r].alt[a];

			g->alts[k++] = pos;
			if (s->n)
				memcpy(g->elems + pos, s->v, sizeof(int32_t) * (size_t)s->n);
			pos += s->n;
			g->elems[pos++] = E_END;
		}
	}
	g->alt0[b->n_rules] = k;
	g->n_elems = pos;
	g->n_rules = b->n_rules;
	return 0;
}

static bool same_sets(const struct loom_grammar *g, int a, int b)
{
	for (int32_t i = 0; i < g->n_sets; i++)
		if ((g->sets[i][a >> 6] >> (a & 63) & 1) != (g->sets[i][b >> 6] >> (b & 63) & 1))
			return false;
	return true;
}

/* Groups the bytes by the sets they are in: a hash of each byte's sets
 * first, then a check against the class it points to. */
static int byte_classes(struct loom_grammar *g)
{
	uint64_t sig[256];
	int rep[256];

	g->cls_bits = calloc(256, sizeof(*g->cls_bits));
	if (!g->cls_bits)
		return -1;
	for (int b = 0; b < 256; b++)
		sig[b] = 1469598103934665603ull;
	for (int32_t i = 0; i < g->n_sets; i++)
		for (int b = 0; b < 256; b++)
			if (g->sets[i][b >> 6] >> (b & 63) & 1)
				sig[b] = (sig[b] ^ (uint64_t)i) * 1099511628211ull;
	g->n_cls = 0;
	for (int b = 0; b < 256; b++) {
		int k = 0;

		while (k < g->n_cls && !(sig[rep[k]] == sig[b] && same_sets(g, rep[k], b)))
			k++;
		if (k == g->n_cls)
			rep[g->n_cls++] = b;
		g->cls[b] = (uint8_t)k;
		g->cls_bits[k][b >> 6] |= 1ull << (b & 63);
	}
	return 0;
}

struct loom_grammar *gbuild_finish(struct gbuild *b, int32_t root, char *err, size_t errlen)
{
	struct loom_grammar *g = NULL;

	if (!b || b->oom || root < 0 || root >= b->n_rules)
		goto out_nomem;
	for (int32_t r = 0; r < b->n_rules; r++) {
		if (b->rules[r].n == 0) {
			loom_seterr(err, errlen, "grammar: rule %d has no alternative", r);
			gbuild_free(b);
			return NULL;
		}
	}
	g = calloc(1, sizeof(*g));
	if (!g || flatten(b, g, root))
		goto out_nomem;
	g->sets = b->sets;
	g->n_sets = b->n_sets;
	b->sets = NULL;
	if (byte_classes(g))
		goto out_nomem;
	g->refs = 1;
	gbuild_free(b);
	return g;

out_nomem:
	if (g) {
		g->refs = 1;
		loom_grammar_free(g);
	}
	gbuild_free(b);
	loom_seterr(err, errlen, "grammar: out of memory");
	return NULL;
}

struct loom_grammar *loom_grammar_ref(const struct loom_grammar *g)
{
	struct loom_grammar *w = (struct loom_grammar *)g;

	if (w)
		__atomic_add_fetch(&w->refs, 1, __ATOMIC_RELAXED);
	return w;
}

void loom_grammar_free(struct loom_grammar *g)
{
	if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	free(g->elems);
	free(g->sets);
	free(g->alt0);
	free(g->alts);
	free(g->cls_bits);
	free(g);
}

int32_t loom_grammar_n_rules(const struct loom_grammar *g)
{
	return g ? g->n_rules : 0;
}

/* ---------------- states ---------------- */

/* A set of stacks, serialized as [depth, bottom .. top] each; stacks
 * that are empty (a complete sentence) are not stored, only `accept`. */
struct gstate {
	int32_t *v;
	int32_t n, cap;
	int32_t n_stacks;
	bool accept;
	bool oom;
	bool overflow; /* a stack was dropped: more than MAX_STACKS at once */
};

static void state_clear(struct gstate *st)
{
	st->n = 0;
	st->n_stacks = 0;
	st->accept = false;
	st->oom = false;
	st->overflow = false;
}

static bool state_empty(const struct gstate *st)
{
	return st->n_stacks == 0 && !st->accept;
}

/* Adds stack stk[0..d) unless present. */
static void state_add(struct gstate *st, const int32_t *stk, int32_t d)
{
	int32_t i = 0;

	if (d == 0) {
		st->accept = true;
		return;
	}
	while (i < st->n) {
		if (st->v[i] == d && !memcmp(st->v + i + 1, stk, sizeof(int32_t) * (size_t)d))
			return;
		i += st->v[i] + 1;
	}
	if (st->n_stacks >= MAX_STACKS) {
		st->overflow = true;
		return;
	}
	if (!grow(&st->v, &st->cap, st->n + d + 1, sizeof(int32_t))) {
		st->oom = true;
		return;
	}
	st->v[st->n] = d;
	memcpy(st->v + st->n + 1, stk, sizeof(int32_t) * (size_t)d);
	st->n += d + 1;
	st->n_stacks++;
}

/*
 * Brings stack stk[0..d) (positions; the top is stk[d - 1]) to stacks
 * whose top is a byte set, added to out: an END pops, a REF is replaced by
 * what follows it and each of the rule's alternatives is pushed in turn.
 * *budget bounds the expansions (a rule that could loop without reading a
 * byte ends there).
 */
static void expand(const struct loom_grammar *g, int32_t *stk, int32_t d,
		   struct gstate *out, int32_t *budget)
{
	while (d > 0) {
		int32_t p = stk[d - 1], e = g->elems[p], r;
		int32_t cur[MAX_DEPTH];

		if (ETYPE(e) == E_END) {
			d--;
			continue;
		}
		if (ETYPE(e) == E_SET) {
			state_add(out, stk, d);
			return;
		}
		if (--*budget < 0)
			return;
		r = EARG(e);
		/* continue after the REF; nothing left of this alternative:
		 * drop it at once (keeps recursive rules shallow) */
		if (ETYPE(g->elems[p + 1]) == E_END)
			d--;
		else
			stk[d - 1] = p + 1;
		if (d >= MAX_DEPTH)
			return;
		for (int32_t a = g->alt0[r]; a < g->alt0[r + 1]; a++) {
			memcpy(cur, stk, sizeof(int32_t) * (size_t)d);
			cur[d] = g->alts[a];
			expand(g, cur, d + 1, out, budget);
		}
		return;
	}
	state_add(out, stk, 0);
}

/* out = in after byte c. */
static void advance(const struct loom_grammar *g, const struct gstate *in, unsigned char c,
		    struct gstate *out)
{
	int32_t stk[MAX_DEPTH];

	state_clear(out);
	for (int32_t i = 0; i < in->n; i += in->v[i] + 1) {
		int32_t d = in->v[i], p = in->v[i + d], budget = EXPAND_BUDGET;
		const uint64_t *set = g->sets[EARG(g->elems[p])];

		if (!(set[c >> 6] >> (c & 63) & 1))
			continue;
		memcpy(stk, in->v + i + 1, sizeof(int32_t) * (size_t)d);
		stk[d - 1] = p + 1;
		expand(g, stk, d, out, &budget);
	}
}

static int state_copy(struct gstate *dst, const struct gstate *src)
{
	if (!grow(&dst->v, &dst->cap, src->n, sizeof(int32_t)))
		return -1;
	if (src->n)
		memcpy(dst->v, src->v, sizeof(int32_t) * (size_t)src->n);
	dst->n = src->n;
	dst->n_stacks = src->n_stacks;
	dst->accept = src->accept;
	dst->oom = false;
	dst->overflow = src->overflow;
	return 0;
}

static void state_swap(struct gstate *a, struct gstate *b)
{
	struct gstate t = *a;

	*a = *b;
	*b = t;
}

static uint64_t state_hash(const struct gstate *st)
{
	uint64_t h = 1469598103934665603ull ^ (uint64_t)st->accept;

	for (int32_t i = 0; i < st->n; i++)
		h = (h ^ (uint32_t)st->v[i]) * 1099511628211ull;
	return h;
}

/* ---------------- the vocabulary trie ---------------- */

struct loom_gvocab {
	int32_t n_vocab;
	int32_t n_nodes, cap_nodes;
	int32_t *first, *next, *tok; /* per node: first child, next sibling, first token */
	unsigned char *byte;         /* per node: the byte that leads to it */
	int32_t *tok_next;           /* per token: the next token of its node */
	int32_t *eog;                /* end-of-generation tokens */
	int32_t n_eog;
	int32_t max_len;             /* longest token, bytes */
	/* Subtrees, for marking a whole one at once (walk_trie): the tokens
	 * in depth-first order; below node n (its own tokens excluded) are
	 * order[sub_lo[n] .. sub_hi[n]); a node with at least BULK_MIN of
	 * them has the bytes of its descendants in sub_bytes[sub_set[n]]
	 * (else sub_set[n] is -1). */
	int32_t *order;
	int32_t *sub_lo, *sub_hi, *sub_set;
	uint64_t (*sub_bytes)[4];
	int32_t n_sub_bytes;
	const struct loom_tokenizer *t;
};

#define BULK_MIN 64

/* Grows one per-node array to cap entries; false when out of memory. */
static bool grow_nodes(void *p, int32_t cap, size_t sz)
{
	void **pp = p;
	void *q = realloc(*pp, (size_t)cap * sz);

	if (q)
		*pp = q;
	return q != NULL;
}

static int32_t trie_node(struct loom_gvocab *v, unsigned char c)
{
	int32_t n = v->n_nodes;

	if (n == v->cap_nodes) {
		int32_t cap = v->cap_nodes ? 2 * v->cap_nodes : 1024;

		if (!grow_nodes(&v->first, cap, sizeof(int32_t)) ||
		    !grow_nodes(&v->next, cap, sizeof(int32_t)) ||
		    !grow_nodes(&v->tok, cap, sizeof(int32_t)) ||
		    !grow_nodes(&v->byte, cap, 1))
			return -1;
		v->cap_nodes = cap;
	}
	v->first[n] = v->next[n] = v->tok[n] = -1;
	v->byte[n] = c;
	return v->n_nodes++;
}

/* The child of node under byte c, made when missing; -1 out of memory. */
static int32_t trie_child(struct loom_gvocab *v, int32_t node, unsigned char c)
{
	int32_t k, n;

	for (k = v->first[node]; k >= 0; k = v->next[k])
		if (v->byte[k] == c)
			return k;
	n = trie_node(v, c);
	if (n < 0)
		return -1;
	v->next[n] = v->first[node];
	v->first[node] = n;
	return n;
}

static int trie_insert(struct loom_gvocab *v, int32_t id, const char *s, size_t len)
{
	int32_t node = 0;

	for (size_t i = 0; i < len; i++) {
		node = trie_child(v, node, (unsigned char)s[i]);
		if (node < 0)
			return -1;
	}
	v->tok_next[id] = v->tok[node];
	v->tok[node] = id;
	if ((int32_t)len > v->max_len)
		v->max_len = (int32_t)len;
	return 0;
}

void loom_gvocab_free(struct loom_gvocab *v)
{
	if (!v)
		return;
	free(v->first);
	free(v->next);
	free(v->tok);
	free(v->byte);
	free(v->tok_next);
	free(v->eog);
	free(v->order);
	free(v->sub_lo);
	free(v->sub_hi);
	free(v->sub_set);
	free(v->sub_bytes);
	free(v);
}

/* Numbers node's subtree into v->order from *pos and ORs the bytes of its
 * descendants into bytes. Recursion depth: the longest token. */
static void number_subtree(struct loom_gvocab *v, int32_t node, int32_t *pos, uint64_t bytes[4])
{
	uint64_t below[4] = { 0 };

	for (int32_t t = v->tok[node]; t >= 0; t = v->tok_next[t])
		v->order[(*pos)++] = t;
	v->sub_lo[node] = *pos;
	for (int32_t c = v->first[node]; c >= 0; c = v->next[c]) {
		below[v->byte[c] >> 6] |= 1ull << (v->byte[c] & 63);
		number_subtree(v, c, pos, below);
	}
	v->sub_hi[node] = *pos;
	v->sub_set[node] = -1;
	if (v->sub_hi[node] - v->sub_lo[node] >= BULK_MIN) {
		v->sub_set[node] = v->n_sub_bytes;
		memcpy(v->sub_bytes[v->n_sub_bytes++], below, sizeof(below));
	}
	for (int i = 0; i < 4; i++)
		bytes[i] |= below[i];
}

/* Fills the subtree tables once every token is in the trie. */
static int number_trie(struct loom_gvocab *v)
{
	uint64_t all[4] = { 0 };
	int32_t pos = 0;

	v->order = malloc(sizeof(int32_t) * (size_t)v->n_vocab);
	v->sub_lo = malloc(sizeof(int32_t) * (size_t)v->n_nodes);
	v->sub_hi = malloc(sizeof(int32_t) * (size_t)v->n_nodes);
	v->sub_set = malloc(sizeof(int32_t) * (size_t)v->n_nodes);
	/* a node with BULK_MIN tokens below it: at most n_vocab / BULK_MIN
	 * per depth, so bound it by the nodes */
	v->sub_bytes = malloc(sizeof(*v->sub_bytes) * (size_t)v->n_nodes);
	if (!v->order || !v->sub_lo || !v->sub_hi || !v->sub_set || !v->sub_bytes)
		return -1;
	number_subtree(v, 0, &pos, all);
	if (v->n_sub_bytes) {
		void *q = realloc(v->sub_bytes, sizeof(*v->sub_bytes) * (size_t)v->n_sub_bytes);

		if (q)
			v->sub_bytes = q;
	}
	return 0;
}

struct loom_gvocab *loom_gvocab_new(const struct loom_tokenizer *t)
{
	struct loom_gvocab *v = calloc(1, sizeof(*v));
	int32_t n = loom_tokenizer_n_vocab(t);

	if (!v || n <= 0)
		goto out_free;
	v->n_vocab = n;
	v->t = t;
	v->tok_next = malloc(sizeof(int32_t) * (size_t)n);
	v->eog = malloc(sizeof(int32_t) * (size_t)n);
	if (!v->tok_next || !v->eog || trie_node(v, 0) < 0)
		goto out_free;
	for (int32_t id = 0; id < n; id++) {
		size_t len;
		const char *s = loom_tokenizer_piece(t, id, &len);

		v->tok_next[id] = -1;
		if (loom_tokenizer_is_eog(t, id)) {
			v->eog[v->n_eog++] = id;
			continue;
		}
		/* tokens with no bytes (control, unused) never match */
		if (s && len && trie_insert(v, id, s, len))
			goto out_free;
	}
	if (number_trie(v))
		goto out_free;
	return v;

out_free:
	loom_gvocab_free(v);
	return NULL;
}

/* ---------------- matching ---------------- */

struct mcache {
	uint64_t hash;
	struct gstate key;
	uint64_t *bits;
	int32_t n_allowed;
	uint64_t used;
	bool valid;
};

/*
 * States met while walking the trie, interned with their moves: a trie
 * node's byte takes state i to state move[i][byte]. Inside a JSON string
 * every ordinary byte leads back to the same state, so after the first
 * few nodes a walk is table lookups. Kept across steps (the same states
 * recur), forgotten all at once when MAX_INTERNED is reached.
 */
struct interned {
	struct gstate *st;
	int32_t (*move)[256];
	uint64_t (*loop)[4];  /* the bytes that take state i back to itself */
	bool *loop_known;     /* loop[i] computed */
	uint64_t (*reads)[4]; /* the bytes state i can read (state_reads) */
	int32_t n, cap;
	int32_t *table;    /* open addressing: state id + 1, 0 empty */
	int32_t table_cap; /* a power of two, > 2 * cap */
	struct gstate next;
};

struct loom_gmatch {
	const struct loom_grammar *g;
	const struct loom_gvocab *v;
	struct gstate lv[MAX_LEVELS];
	int32_t n_levels;       /* lookahead levels above 0 */
	struct interned in;
	struct gstate tmp[2];
	uint64_t *bits;         /* the mask being built */
	int32_t n_allowed;
	struct mcache cache[CACHE_SIZE];
	uint64_t tick;
	struct loom_gmatch_stats stats;
	/* some state reached (a level, or one a mask walked through) had more
	 * than MAX_STACKS stacks: its text cannot be followed exactly, so
	 * mask and push fail from then on (never a mask cut short) */
	bool overflow;
};

void loom_gmatch_free(struct loom_gmatch *m)
{
	if (!m)
		return;
	for (int i = 0; i < MAX_LEVELS; i++)
		free(m->lv[i].v);
	for (int32_t i = 0; i < m->in.n; i++)
		free(m->in.st[i].v);
	free(m->in.st);
	free(m->in.move);
	free(m->in.loop);
	free(m->in.loop_known);
	free(m->in.reads);
	free(m->in.table);
	free(m->in.next.v);
	free(m->tmp[0].v);
	free(m->tmp[1].v);
	free(m->bits);
	for (int i = 0; i < CACHE_SIZE; i++) {
		free(m->cache[i].key.v);
		free(m->cache[i].bits);
	}
	loom_grammar_free((struct loom_grammar *)m->g);
	free(m);
}

/* What a matcher made without a vocabulary sees (byte-level use only). */
static const struct loom_gvocab no_vocab;

struct loom_gmatch *loom_gmatch_new(const struct loom_grammar *g, const struct loom_gvocab *v)
{
	struct loom_gmatch *m = calloc(1, sizeof(*m));
	int32_t stk[1] = { 0 }, budget = EXPAND_BUDGET;
	size_t words;

	if (!m)
		return NULL;
	m->g = loom_grammar_ref(g);
	m->v = v ? v : &no_vocab;
	words = ((size_t)m->v->n_vocab + 63) / 64 + 1;
	m->bits = malloc(words * sizeof(uint64_t));
	if (!m->bits)
		goto out_free;
	stk[0] = g->start;
	expand(g, stk, 1, &m->lv[0], &budget);
	if (m->lv[0].oom)
		goto out_free;
	m->overflow = m->lv[0].overflow;
	return m;

out_free:
	loom_gmatch_free(m);
	return NULL;
}

static void mark_tokens(struct loom_gmatch *m, int32_t node)
{
	for (int32_t t = m->v->tok[node]; t >= 0; t = m->v->tok_next[t]) {
		m->bits[t >> 6] |= 1ull << (t & 63);
		m->n_allowed++;
	}
}

static bool state_equal(const struct gstate *a, const struct gstate *b);

/* Forgets every interned state. */
static void intern_reset(struct interned *in)
{
	for (int32_t i = 0; i < in->n; i++)
		free(in->st[i].v);
	in->n = 0;
	if (in->table)
		memset(in->table, 0, sizeof(int32_t) * (size_t)in->table_cap);
}

/* The bytes some stack of st can read next: the union of its top sets. */
static void state_reads(const struct loom_grammar *g, const struct gstate *st, uint64_t out[4])
{
	memset(out, 0, 4 * sizeof(uint64_t));
	for (int32_t i = 0; i < st->n; i += st->v[i] + 1) {
		const uint64_t *set = g->sets[EARG(g->elems[st->v[i + st->v[i]]])];

		for (int k = 0; k < 4; k++)
			out[k] |= set[k];
	}
}

/* The id of the state equal to st (hash h), or -1 with *slot the empty
 * table entry where it would go. */
static int32_t intern_find(const struct interned *in, const struct gstate *st, uint64_t h,
			   uint32_t *slot)
{
	uint32_t mask = (uint32_t)in->table_cap - 1, k;

	for (k = (uint32_t)h & mask; in->table[k]; k = (k + 1) & mask)
		if (state_equal(&in->st[in->table[k] - 1], st))
			return in->table[k] - 1;
	*slot = k;
	return -1;
}

/* Room for one more state: the arrays double from INTERN_FIRST up to
 * MAX_INTERNED (a matcher that meets few states stays small), the hash
 * table rebuilt at four times their size. false when full or out of
 * memory. */
static bool intern_room(struct interned *in)
{
	int32_t cap = in->cap ? 2 * in->cap : INTERN_FIRST;
	int32_t *table;
	uint32_t slot = 0;

	if (in->n < in->cap)
		return true;
	if (in->cap >= MAX_INTERNED || !grow_nodes(&in->st, cap, sizeof(*in->st)) ||
	    !grow_nodes(&in->move, cap, sizeof(*in->move)) ||
	    !grow_nodes(&in->loop, cap, sizeof(*in->loop)) ||
	    !grow_nodes(&in->reads, cap, sizeof(*in->reads)) ||
	    !grow_nodes(&in->loop_known, cap, sizeof(*in->loop_known)))
		return false;
	table = calloc((size_t)cap * 4, sizeof(int32_t));
	if (!table)
		return false;
	free(in->table);
	in->table = table;
	in->table_cap = cap * 4;
	in->cap = cap;
	for (int32_t i = 0; i < in->n; i++) {
		intern_find(in, &in->st[i], state_hash(&in->st[i]), &slot);
		in->table[slot] = i + 1;
	}
	return true;
}

/* The id of a state equal to st, adding a copy when new; -1 when out of
 * memory or full. */
static int32_t intern(const struct loom_grammar *g, struct interned *in, const struct gstate *st)
{
	uint64_t h = state_hash(st);
	uint32_t k = 0;
	int32_t id;

	if (in->table && (id = intern_find(in, st, h, &k)) >= 0)
		return id;
	if (!intern_room(in))
		return -1;
	intern_find(in, st, h, &k); /* the table may have been rebuilt */
	in->st[in->n] = (struct gstate){ 0 };
	if (state_copy(&in->st[in->n], st))
		return -1;
	for (int b = 0; b < 256; b++)
		in->move[in->n][b] = MOVE_UNKNOWN;
	in->loop_known[in->n] = false;
	state_reads(g, st, in->reads[in->n]);
	in->table[k] = in->n + 1;
	return in->n++;
}

/* row[b] = to for every byte b of a class: they all lead there. */
static void set_class_moves(int32_t row[256], const uint64_t bits[4], int32_t to)
{
	for (int w = 0; w < 4; w++)
		for (uint64_t x = bits[w]; x; x &= x - 1)
			row[w * 64 + __builtin_ctzll(x)] = to;
}

/* The state byte c takes interned state id to: its id, MOVE_DEAD when
 * none, MOVE_OVERFLOW, or -3 when out of room (the caller resets and
 * starts over). */
static int32_t move(struct loom_gmatch *m, int32_t id, unsigned char c)
{
	struct interned *in = &m->in;
	int32_t to = in->move[id][c];

	if (to != MOVE_UNKNOWN)
		return to;
	advance(m->g, &in->st[id], c, &in->next);
	if (in->next.oom)
		return -3;
	if (in->next.overflow)
		return MOVE_OVERFLOW;
	if (state_empty(&in->next)) {
		to = MOVE_DEAD;
	} else {
		to = intern(m->g, in, &in->next);
		if (to < 0)
			return -3;
	}
	set_class_moves(in->move[id], m->g->cls_bits[m->g->cls[c]], to);
	return to;
}

/* The bytes that take interned state id back to itself, computed once
 * per state (advance only: the states they lead to are not interned). */
static const uint64_t *self_loop(struct loom_gmatch *m, int32_t id)
{
	struct interned *in = &m->in;
	uint64_t *loop = in->loop[id], done[4] = { 0 };

	if (in->loop_known[id])
		return loop;
	memset(loop, 0, sizeof(in->loop[0]));
	for (int b = 0; b < 256; b++) {
		const uint64_t *cb = m->g->cls_bits[m->g->cls[b]];
		int32_t to = in->move[id][b];

		if (!(in->reads[id][b >> 6] >> (b & 63) & 1) || done[b >> 6] >> (b & 63) & 1)
			continue;
		for (int w = 0; w < 4; w++)
			done[w] |= cb[w]; /* one byte of a class answers for all */
		if (to == MOVE_UNKNOWN) {
			advance(m->g, &in->st[id], (unsigned char)b, &m->tmp[0]);
			if (m->tmp[0].oom || m->tmp[0].overflow ||
			    !state_equal(&m->tmp[0], &in->st[id]))
				continue;
		} else if (to != id) {
			continue;
		}
		for (int w = 0; w < 4; w++)
			loop[w] |= cb[w];
	}
	in->loop_known[id] = true;
	return loop;
}

/* Whether every token below node c is taken as a whole by state id: each
 * byte below c leads id back to itself. Only for large subtrees. */
static bool subtree_loops(struct loom_gmatch *m, int32_t c, int32_t id)
{
	int32_t k = m->v->sub_set[c];
	const uint64_t *below, *loop;

	if (k < 0)
		return false;
	/* a cheap probe before the 256 advances of self_loop: most states
	 * (between JSON tokens) do not loop on the first child's byte, and
	 * the walk needs that move anyway */
	if (!m->in.loop_known[id] && move(m, id, m->v->byte[m->v->first[c]]) != id)
		return false;
	below = m->v->sub_bytes[k];
	loop = self_loop(m, id);
	for (int i = 0; i < 4; i++)
		if (below[i] & ~loop[i])
			return false;
	return true;
}

static void mark_subtree(struct loom_gmatch *m, int32_t c)
{
	const struct loom_gvocab *v = m->v;

	for (int32_t i = v->sub_lo[c]; i < v->sub_hi[c]; i++) {
		int32_t t = v->order[i];

		m->bits[t >> 6] |= 1ull << (t & 63);
	}
	m->n_allowed += v->sub_hi[c] - v->sub_lo[c];
}

/* Marks the tokens below node whose remaining bytes interned state id
 * takes. A subtree whose every byte loops on the state it reaches is
 * marked whole (inside a JSON string most of the vocabulary is). -1 when
 * the interned states ran out of room, -2 on a state with too many
 * stacks. */
static int walk_trie(struct loom_gmatch *m, int32_t node, int32_t id)
{
	const struct loom_gvocab *v = m->v;

	for (int32_t c = v->first[node]; c >= 0; c = v->next[c]) {
		unsigned char b = v->byte[c];
		int32_t to;

		m->stats.nodes_visited++;
		/* by index: interning a new state may move the arrays */
		if (!(m->in.reads[id][b >> 6] >> (b & 63) & 1))
			continue; /* no stack reads b: dead without advancing */
		to = move(m, id, b);
		if (to == MOVE_DEAD)
			continue;
		if (to == MOVE_OVERFLOW)
			return -2;
		if (to < 0)
			return -1;
		mark_tokens(m, c);
		if (m->in.st[to].n_stacks == 0 || v->first[c] < 0)
			continue;
		if (subtree_loops(m, c, to))
			mark_subtree(m, c);
		else if ((to = walk_trie(m, c, to)))
			return to;
	}
	return 0;
}

/* Builds m->bits for state st. */
static int build_mask(struct loom_gmatch *m, const struct gstate *st)
{
	size_t words = ((size_t)m->v->n_vocab + 63) / 64;

	for (int attempt = 0; attempt < 2; attempt++) {
		int32_t id = intern(m->g, &m->in, st);
		int rc = -1;

		memset(m->bits, 0, words * sizeof(uint64_t));
		m->n_allowed = 0;
		if (id >= 0 && (rc = walk_trie(m, 0, id)) == 0)
			goto done;
		if (rc == -2) {
			m->overflow = true;
			return -1;
		}
		if (!m->in.table)
			return -1;
		intern_reset(&m->in); /* full: start afresh */
	}
	return -1;
done:
	if (st->accept) {
		for (int32_t i = 0; i < m->v->n_eog; i++) {
			int32_t t = m->v->eog[i];

			m->bits[t >> 6] |= 1ull << (t & 63);
			m->n_allowed++;
		}
	}
	return 0;
}

static bool state_equal(const struct gstate *a, const struct gstate *b)
{
	/* an empty state may have no array: memcmp must not see NULL */
	return a->n == b->n && a->accept == b->accept &&
	       (a->n == 0 || !memcmp(a->v, b->v, sizeof(int32_t) * (size_t)a->n));
}

/* The cached mask of st, computing it (and evicting the least recently
 * used entry) when missing. NULL when out of memory. */
static struct mcache *mask_of(struct loom_gmatch *m, const struct gstate *st)
{
	size_t words = ((size_t)m->v->n_vocab + 63) / 64;
	uint64_t h = state_hash(st);
	struct mcache *c = &m->cache[0];

	m->stats.masks++;
	for (int i = 0; i < CACHE_SIZE; i++) {
		struct mcache *e = &m->cache[i];

		if (e->valid && e->hash == h && state_equal(&e->key, st)) {
			e->used = ++m->tick;
			m->stats.cache_hits++;
			return e;
		}
		if (!e->valid || e->used < c->used)
			c = e;
	}
	if (build_mask(m, st))
		return NULL;
	c->valid = false;
	if (!c->bits && !(c->bits = malloc(words * sizeof(uint64_t))))
		return NULL;
	if (state_copy(&c->key, st))
		return NULL;
	memcpy(c->bits, m->bits, words * sizeof(uint64_t));
	c->n_allowed = m->n_allowed;
	c->hash = h;
	c->used = ++m->tick;
	c->valid = true;
	return c;
}

static const float neg_inf64[64] = { [0 ... 63] = -INFINITY };

/* logits[t] = -inf for every t < n whose bit is clear, a word at a time:
 * most words of a mask are all ones or all zeros. */
static void mask_logits(const uint64_t *bits, float *logits, int32_t n)
{
	for (int32_t w = 0; (int64_t)w * 64 < n; w++) {
		int32_t base = w * 64, end = n - base < 64 ? n - base : 64;
		uint64_t off = ~bits[w];

		if (end < 64)
			off &= (1ull << end) - 1;
		if (off == ~0ull) {
			memcpy(logits + base, neg_inf64, sizeof(neg_inf64));
			continue;
		}
		while (off) {
			logits[base + __builtin_ctzll(off)] = -INFINITY;
			off &= off - 1;
		}
	}
}

int32_t loom_gmatch_mask(struct loom_gmatch *m, int32_t level, float *logits, int32_t n_logits)
{
	int32_t n;

	struct mcache *c;

	if (level < 0 || level > m->n_levels || m->v == &no_vocab || m->overflow)
		return -1;
	c = mask_of(m, &m->lv[level]);
	if (!c)
		return -1;
	n = n_logits < m->v->n_vocab ? n_logits : m->v->n_vocab;
	mask_logits(c->bits, logits, n);
	for (int32_t t = n; t < n_logits; t++)
		logits[t] = -INFINITY; /* rows the tokenizer has no token for */
	return c->n_allowed;
}

/* dst = src after bytes s[0..n); -1 when a byte is refused. */
static int advance_bytes(struct loom_gmatch *m, const struct gstate *src, const char *s,
			 size_t n, struct gstate *dst)
{
	const struct gstate *cur = src;
	int k = 0;

	for (size_t i = 0; i < n; i++) {
		advance(m->g, cur, (unsigned char)s[i], &m->tmp[k]);
		if (m->tmp[k].overflow)
			m->overflow = true;
		if (m->tmp[k].oom || m->tmp[k].overflow || state_empty(&m->tmp[k]))
			return -1;
		cur = &m->tmp[k];
		k ^= 1;
	}
	return state_copy(dst, cur);
}

/* A new deepest level: level `from` (<= the deepest) after token t. 0,
 * or -1 when refused (nothing changes), out of memory or overflow. The
 * levels' buffers are kept between steps: no allocation once grown. */
static int push_at(struct loom_gmatch *m, int32_t from, int32_t t)
{
	const char *s;
	size_t len;

	if (m->n_levels + 1 >= MAX_LEVELS || from < 0 || from > m->n_levels || t < 0 ||
	    t >= m->v->n_vocab || !m->v->t || m->overflow)
		return -1;
	if (loom_tokenizer_is_eog(m->v->t, t))
		return -1;
	s = loom_tokenizer_piece(m->v->t, t, &len);
	if (!s || !len)
		return -1;
	if (advance_bytes(m, &m->lv[from], s, len, &m->lv[m->n_levels + 1]))
		return -1;
	m->n_levels++;
	return 0;
}

int loom_gmatch_push(struct loom_gmatch *m, int32_t t)
{
	return push_at(m, m->n_levels, t);
}

int32_t loom_gmatch_tree(struct loom_gmatch *m, int32_t k, int32_t *tokens, int32_t *parent)
{
	int32_t row[MAX_LEVELS], n = 0; /* row[i]: old row i's new row, -1 dropped */

	m->n_levels = 0;
	row[0] = 0;
	if (k > MAX_LEVELS - 1)
		k = MAX_LEVELS - 1;
	for (int32_t i = 1; i <= k; i++) {
		int32_t p = parent[i], tok = tokens[i - 1];
		/* the parent's level is its new row: its state after its path */
		bool ok = p >= 0 && p < i && row[p] >= 0 && push_at(m, row[p], tok) == 0;

		row[i] = ok ? ++n : -1;
		if (!ok)
			continue;
		tokens[n - 1] = tok; /* n <= i: compaction in place */
		parent[n] = row[p];
	}
	parent[0] = -1;
	return n;
}

void loom_gmatch_keep(struct loom_gmatch *m, int32_t level)
{
	if (level > 0 && level <= m->n_levels)
		state_swap(&m->lv[0], &m->lv[level]);
	m->n_levels = 0;
}

int32_t loom_gmatch_levels(const struct loom_gmatch *m)
{
	return m->n_levels;
}

bool loom_gmatch_any_byte(const struct loom_gmatch *m)
{
	return m->lv[0].n_stacks > 0;
}

bool loom_gmatch_overflowed(const struct loom_gmatch *m)
{
	return m->overflow;
}

bool loom_gmatch_done(const struct loom_gmatch *m)
{
	return m->lv[0].accept;
}

int loom_gmatch_feed(struct loom_gmatch *m, const char *text, size_t n)
{
	m->n_levels = 0;
	if (m->overflow)
		return -1;
	if (advance_bytes(m, &m->lv[0], text, n, &m->lv[1]))
		return -1;
	state_swap(&m->lv[0], &m->lv[1]);
	return 0;
}

void loom_gmatch_get_stats(const struct loom_gmatch *m, struct loom_gmatch_stats *st)
{
	*st = m->stats;
}
