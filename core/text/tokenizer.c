/* tokenizer.c: tokenizers built from GGUF metadata.
 *
 * Two models share one vocabulary layer (texts, types, scores, a hash map
 * text -> id) and one special-token splitter:
 *
 *  - "llama": SentencePiece BPE. The text (spaces escaped to U+2581, an
 *    optional leading space) is cut into UTF-8 characters; adjacent pairs
 *    whose concatenation is a vocabulary entry are merged, highest score
 *    first (leftmost on ties), until no pair merges. Pieces that are not in
 *    the vocabulary fall back to <0xXX> byte tokens, else to <unk>.
 *
 *  - "gpt2": byte-level BPE. A list of pre-tokenizer regexes (chosen by
 *    tokenizer.ggml.pre) cuts the text into words; each regex further splits
 *    every piece the previous ones produced, keeping matches and the gaps
 *    between them. Each word's bytes are mapped to printable code points
 *    (the GPT-2 bytes_to_unicode table), then adjacent symbols are merged by
 *    the rank of "left right" in tokenizer.ggml.merges, lowest rank first.
 *
 * The tokenizer is immutable after construction; loom_tokenize allocates its
 * scratch per call, so one tokenizer may be used from several threads.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "text/tokenizer.h"
#include "util.h"

#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.ggml.token_type values (llama.cpp / gguf-py numbering). */
enum tok_type {
	TT_UNDEFINED = 0,
	TT_NORMAL = 1,
	TT_UNKNOWN = 2,
	TT_CONTROL = 3,
	TT_USER_DEFINED = 4,
	TT_UNUSED = 5,
	TT_BYTE = 6,
};

enum tok_model { MODEL_SPM, MODEL_BPE };

#define MAX_REGEX 8
#define SPACE_ESC "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */

/* Open-addressing hash map from byte strings (kept alive by the owner) to
 * int32 values. */
struct strmap_slot {
	uint64_t hash;
	const char *key; /* NULL: empty slot */
	uint32_t len;
	int32_t val;
};

struct strmap {
	struct strmap_slot *slots;
	size_t mask;
};

/* A byte trie. Node 0 is the root; an edge (node, byte) -> child lives in
 * an open-addressing table keyed by node * 256 + byte + 1 (0: empty). Each
 * node keeps the lowest id of a special token whose text ends there, of
 * any kind (any) and user-defined only (user); -1 if none. */
struct trie_edge {
	uint64_t key;
	int32_t child;
};

struct trie {
	struct trie_edge *edges;
	size_t mask;
	int32_t *any, *user;
	int32_t n_nodes;
};

/* Pairs of adjacent characters, each packed into a uint64 (both
 * characters' bytes, zero-padded to 4) plus one; 0 marks an empty slot. */
struct pairset {
	uint64_t *keys;
	size_t mask, n;
};

struct loom_tokenizer {
	enum tok_model model;
	int32_t n_vocab;

	char *text_blob;     /* token texts, each NUL-terminated */
	size_t *text_off;    /* n_vocab offsets into text_blob */
	uint32_t *text_len;
	char *piece_blob;    /* bytes each token detokenizes to */
	size_t *piece_off;
	uint32_t *piece_len;
	float *scores;       /* spm merge priorities (0 when absent) */
	uint8_t *type;       /* enum tok_type */
	bool *eog;

	struct strmap vocab;  /* text -> id */
	struct strmap merges; /* "left right" -> rank (gpt2) */
	char *merge_blob;

	int32_t byte_tok[256]; /* byte -> token, -1 if none */
	uint32_t max_piece;    /* most text bytes one token of plain text covers */
	uint32_t bucket_min;   /* runs of this many characters merge by buckets */
	int32_t bos, eos, unk, eot, eom;
	bool add_bos, add_eos, add_space_prefix, ignore_merges;

	/* Special-token texts as a trie, so that the longest match at a
	 * position costs at most the longest special's length. */
	struct trie special;

	/* spm: every pair of adjacent characters inside a vocabulary text */
	struct pairset pairs;

	pcre2_code *re[MAX_REGEX];
	int n_re;

	/* GPT-2 bytes_to_unicode: byte -> UTF-8 of its code point, and back. */
	char b2u[256][2];
	uint8_t b2u_len[256];
	int16_t u2b[512];
};

/* ---- hash map ---------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a, then a final mix */

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ull;
	h ^= h >> 32;
	return h;
}

static int strmap_init(struct strmap *m, size_t n)
{
	size_t cap = 16;

	while (cap < 2 * n) {
		if (cap > SIZE_MAX / 4 / sizeof(*m->slots))
			return -1;
		cap *= 2;
	}
	m->slots = calloc(cap, sizeof(*m->slots));
	if (!m->slots)
		return -1;
	m->mask = cap - 1;
	return 0;
}

static struct strmap_slot *strmap_slot(const struct strmap *m, const char *key,
				       size_t len, uint64_t h)
{
	size_t i = h & m->mask;

	for (;;) {
		struct strmap_slot *s = &m->slots[i];

		if (!s->key)
			return s;
		if (s->hash == h && s->len == len && !memcmp(s->key, key, len))
			return s;
		i = (i + 1) & m->mask;
	}
}

/* -1 when absent. */
static int32_t strmap_get(const struct strmap *m, const char *key, size_t len)
{
	const struct strmap_slot *s;

	if (!m->slots)
		return -1;
	s = strmap_slot(m, key, len, hash_bytes(key, len));
	return s->key ? s->val : -1;
}

/* The map never holds more than half its slots, so there is always room.
 * Returns the slot; a new one has key set and val = -1. */
static struct strmap_slot *strmap_put(struct strmap *m, const char *key, uint32_t len)
{
	uint64_t h = hash_bytes(key, len);
	struct strmap_slot *s = strmap_slot(m, key, len, h);

	if (!s->key) {
		s->hash = h;
		s->key = key;
		s->len = len;
		s->val = -1;
	}
	return s;
}

/* ---- small helpers ----------------------------------------------------- */

/* Length of the UTF-8 sequence a lead byte announces (1 for stray bytes). */
static size_t utf8_len(unsigned char c)
{
	if (c < 0xc0)
		return 1;
	if (c < 0xe0)
		return 2;
	if (c < 0xf0)
		return 3;
	if (c < 0xf8)
		return 4;
	return 1;
}

/* Decodes one UTF-8 character of s[0..n) (n > 0) into *cp; returns its
 * length, or 1 with *cp = -1 when the bytes are not valid UTF-8. */
static size_t utf8_decode(const unsigned char *s, size_t n, int32_t *cp)
{
	size_t len = utf8_len(s[0]);
	int32_t v;

	*cp = -1;
	if (len == 1) {
		if (s[0] < 0x80)
			*cp = s[0];
		return 1;
	}
	if (len > n)
		return 1;
	v = s[0] & (0x7f >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 1;
		v = (v << 6) | (s[i] & 0x3f);
	}
	*cp = v;
	return len;
}

static bool is_text_type(uint8_t type)
{
	return type == TT_NORMAL || type == TT_USER_DEFINED || type == TT_UNUSED ||
	       type == TT_UNDEFINED;
}

/* Ids out: at most cap written, n counted. Past limit the count is known
 * to be too large, and the work stops (n stays above limit). */
struct outbuf {
	int32_t *ids;
	int64_t cap;
	int64_t n;
	int64_t limit;
};

static bool out_over(const struct outbuf *o)
{
	return o->n > o->limit;
}

static void out_push(struct outbuf *o, int32_t id)
{
	if (o->n < o->cap)
		o->ids[o->n] = id;
	o->n++;
}

/* ---- merge queue (shared by both models) ------------------------------- */

/* A candidate merge of a symbol and the one after it. Higher pri first; on
 * ties the leftmost pair. The lengths detect stale entries: a symbol only
 * grows by absorbing the one after it, so while both lengths are unchanged
 * the left symbol's neighbour and both texts are the same. pri is a float
 * (an SPM score, or minus a BPE merge rank below 2^24, both exact), so an
 * entry takes 16 bytes: long runs make queues of millions of entries. */
struct bigram {
	float pri;
	int32_t left;
	uint32_t left_len, right_len;
};

struct symbol {
	uint32_t start, len; /* len 0: merged away */
	int32_t prev, next;
};

struct heap {
	struct bigram *v;
	size_t n, cap;
};

static bool bigram_before(const struct bigram *a, const struct bigram *b)
{
	if (a->pri != b->pri)
		return a->pri > b->pri;
	return a->left < b->left;
}

/* Doubles the capacity (from 64) of array v of elem-byte elements: the
 * moved array, or NULL on overflow or allocation failure (v unchanged). */
static void *grow_array(void *v, size_t *cap, size_t elem)
{
	size_t n = *cap ? *cap * 2 : 64;
	void *p;

	if (n > SIZE_MAX / elem)
		return NULL;
	p = realloc(v, n * elem);
	if (p)
		*cap = n;
	return p;
}

/* A 4-ary heap: half the depth of a binary one, and the four children of
 * a node share a cache line. */
enum { HEAP_ARITY = 4 };

static int heap_push(struct heap *h, struct bigram b)
{
	size_t i;

	if (h->n == h->cap) {
		struct bigram *v = grow_array(h->v, &h->cap, sizeof(*v));

		if (!v)
			return -1;
		h->v = v;
	}
	i = h->n++;
	while (i > 0 && bigram_before(&b, &h->v[(i - 1) / HEAP_ARITY])) {
		h->v[i] = h->v[(i - 1) / HEAP_ARITY];
		i = (i - 1) / HEAP_ARITY;
	}
	h->v[i] = b;
	return 0;
}

static struct bigram heap_pop(struct heap *h)
{
	struct bigram top = h->v[0], last = h->v[--h->n];
	size_t i = 0;

	for (;;) {
		size_t first = HEAP_ARITY * i + 1, best = first;

		if (first >= h->n)
			break;
		for (size_t c = first + 1; c < first + HEAP_ARITY && c < h->n; c++)
			if (bigram_before(&h->v[c], &h->v[best]))
				best = c;
		if (!bigram_before(&h->v[best], &last))
			break;
		h->v[i] = h->v[best];
		i = best;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

/* ---- merge queue for long runs: one bucket per priority ---------------- */

/* A run of a million equal characters makes a binary heap of millions of
 * entries whose pops miss the cache at every level. A long run instead
 * files each candidate in the bucket of its priority (a hash on the
 * priority) and keeps only the buckets in a heap: the best bucket is
 * taken whole, sorted by position, and walked in order. The order of the
 * merges is the heap's exactly: highest priority first, leftmost on
 * ties. Candidates of the walked priority that appear during the walk
 * join a small side heap; one of a higher priority stops the walk, and
 * what is left goes back to its bucket. */

struct pending {
	int32_t left, next; /* next: the bucket's following entry, -1 at its end */
	uint32_t left_len, right_len;
};

struct bucket {
	float pri;
	int32_t head, tail; /* the bucket's list in pend, -1 when empty */
	bool queued;        /* in the bucket heap */
};

struct buckets {
	struct pending *pend;
	size_t n_pend, cap_pend;
	struct bucket *b;
	size_t n_b, cap_b;
	int32_t *slot;      /* open addressing: pri -> bucket index + 1, 0 empty */
	size_t n_slot;      /* a power of two, at least twice n_b */
	int32_t *heap;      /* bucket indices, highest pri on top */
	size_t n_heap, cap_heap;
	struct bigram *batch; /* the bucket being walked, by position */
	size_t n_batch, cap_batch;
	struct heap side;   /* candidates of the walked priority found during the walk */
	float walking;      /* that priority */
	bool in_walk, better; /* better: a candidate outranks the walk */
};

static void buckets_free(struct buckets *q)
{
	if (!q)
		return;
	free(q->pend);
	free(q->b);
	free(q->slot);
	free(q->heap);
	free(q->batch);
	free(q->side.v);
	free(q);
}

static uint32_t pri_bits(float pri)
{
	uint32_t u;

	pri += 0.0f; /* -0 and +0 are one priority, as the heap compares them */
	memcpy(&u, &pri, sizeof(u));
	return u;
}

static size_t slot_of(const struct buckets *q, float pri)
{
	size_t i = (size_t)((pri_bits(pri) * 0x9e3779b97f4a7c15ull) >> 32) & (q->n_slot - 1);

	while (q->slot[i] && q->b[q->slot[i] - 1].pri != pri)
		i = (i + 1) & (q->n_slot - 1);
	return i;
}

static int rehash(struct buckets *q)
{
	size_t n = q->n_slot ? q->n_slot * 2 : 256;
	int32_t *old = q->slot;
	size_t n_old = q->n_slot;

	if (n > SIZE_MAX / sizeof(*old))
		return -1;
	q->slot = calloc(n, sizeof(*q->slot));
	if (!q->slot) {
		q->slot = old;
		return -1;
	}
	q->n_slot = n;
	for (size_t i = 0; i < n_old; i++)
		if (old[i])
			q->slot[slot_of(q, q->b[old[i] - 1].pri)] = old[i];
	free(old);
	return 0;
}

/* The bucket of pri, made on first use: its index, or -1 out of memory. */
static int32_t bucket_for(struct buckets *q, float pri)
{
	size_t i;

	if (2 * (q->n_b + 1) > q->n_slot && rehash(q))
		return -1;
	i = slot_of(q, pri);
	if (q->slot[i])
		return q->slot[i] - 1;
	if (q->n_b == q->cap_b) {
		struct bucket *v = grow_array(q->b, &q->cap_b, sizeof(*v));

		if (!v || q->cap_b > INT32_MAX - 1)
			return -1;
		q->b = v;
	}
	q->b[q->n_b] = (struct bucket){ pri, -1, -1, false };
	q->slot[i] = (int32_t)++q->n_b;
	return (int32_t)(q->n_b - 1);
}

static bool bucket_above(const struct buckets *q, size_t a, size_t b)
{
	return q->b[q->heap[a]].pri > q->b[q->heap[b]].pri;
}

static void swap_i32(int32_t *a, int32_t *b)
{
	int32_t t = *a;

	*a = *b;
	*b = t;
}

static int bucket_queue(struct buckets *q, int32_t bi)
{
	size_t i;

	if (q->b[bi].queued)
		return 0;
	if (q->n_heap == q->cap_heap) {
		int32_t *v = grow_array(q->heap, &q->cap_heap, sizeof(*v));

		if (!v)
			return -1;
		q->heap = v;
	}
	q->b[bi].queued = true;
	i = q->n_heap++;
	q->heap[i] = bi;
	for (; i > 0 && bucket_above(q, i, (i - 1) / 2); i = (i - 1) / 2)
		swap_i32(&q->heap[i], &q->heap[(i - 1) / 2]);
	return 0;
}

static int32_t bucket_take_top(struct buckets *q)
{
	int32_t top = q->heap[0];
	size_t i = 0;

	q->heap[0] = q->heap[--q->n_heap];
	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= q->n_heap)
			break;
		if (c + 1 < q->n_heap && bucket_above(q, c + 1, c))
			c++;
		if (!bucket_above(q, c, i))
			break;
		swap_i32(&q->heap[i], &q->heap[c]);
		i = c;
	}
	q->b[top].queued = false;
	return top;
}

/* Files candidate b in its bucket (or the side heap during the walk). */
static int bucket_add(struct buckets *q, const struct bigram *b)
{
	int32_t bi;

	if (q->in_walk && b->pri == q->walking)
		return heap_push(&q->side, *b);
	if (q->in_walk && b->pri > q->walking)
		q->better = true;
	bi = bucket_for(q, b->pri);
	if (bi < 0)
		return -1;
	if (q->n_pend == q->cap_pend) {
		struct pending *v = grow_array(q->pend, &q->cap_pend, sizeof(*v));

		if (!v || q->cap_pend > INT32_MAX)
			return -1;
		q->pend = v;
	}
	q->pend[q->n_pend] = (struct pending){ b->left, -1, b->left_len, b->right_len };
	if (q->b[bi].tail >= 0)
		q->pend[q->b[bi].tail].next = (int32_t)q->n_pend;
	else
		q->b[bi].head = (int32_t)q->n_pend;
	q->b[bi].tail = (int32_t)q->n_pend++;
	return bucket_queue(q, bi);
}

static int by_left(const void *a, const void *b)
{
	const struct bigram *x = a, *y = b;

	return (x->left > y->left) - (x->left < y->left);
}

/* Moves bucket bi's list into batch, sorted by position. */
static int bucket_gather(struct buckets *q, int32_t bi)
{
	bool sorted = true;

	q->n_batch = 0;
	for (int32_t e = q->b[bi].head; e >= 0; e = q->pend[e].next) {
		const struct pending *p = &q->pend[e];

		if (q->n_batch == q->cap_batch) {
			struct bigram *v = grow_array(q->batch, &q->cap_batch, sizeof(*v));

			if (!v)
				return -1;
			q->batch = v;
		}
		if (q->n_batch && q->batch[q->n_batch - 1].left > p->left)
			sorted = false;
		q->batch[q->n_batch++] = (struct bigram){ q->b[bi].pri, p->left,
							  p->left_len, p->right_len };
	}
	q->b[bi].head = q->b[bi].tail = -1;
	if (!sorted)
		qsort(q->batch, q->n_batch, sizeof(*q->batch), by_left);
	return 0;
}

/* Per-call state of one merge run over text[0..n). */
struct merger {
	const struct loom_tokenizer *t;
	const char *text;
	struct symbol *sym;
	int32_t n_sym;
	struct heap heap;
	struct buckets *bq; /* long runs: the queue by buckets, else NULL */
	char *key; /* gpt2: scratch for "left right" */
};

/* Priority of merging symbols l and r, false if they do not merge. */
static bool pair_priority(struct merger *m, int32_t l, int32_t r, float *pri)
{
	const struct loom_tokenizer *t = m->t;
	const struct symbol *a = &m->sym[l], *b = &m->sym[r];
	int32_t id;

	if (t->model == MODEL_SPM) {
		/* The pair is contiguous in the text. */
		id = strmap_get(&t->vocab, m->text + a->start, a->len + b->len);
		if (id < 0 || !is_text_type(t->type[id]))
			return false;
		*pri = t->scores[id];
		return true;
	}
	memcpy(m->key, m->text + a->start, a->len);
	m->key[a->len] = ' ';
	memcpy(m->key + a->len + 1, m->text + b->start, b->len);
	id = strmap_get(&t->merges, m->key, (size_t)a->len + 1 + b->len);
	if (id < 0)
		return false;
	*pri = -(float)id; /* exact: merge ranks are below 2^24 (checked at load) */
	return true;
}

static int try_pair(struct merger *m, int32_t l, int32_t r)
{
	struct bigram b;

	if (l < 0 || r < 0)
		return 0;
	if (!pair_priority(m, l, r, &b.pri))
		return 0;
	b.left = l;
	b.left_len = m->sym[l].len;
	b.right_len = m->sym[r].len;
	return m->bq ? bucket_add(m->bq, &b) : heap_push(&m->heap, b);
}

/* Merges candidate b if it is still current: 0, or -1 out of memory. */
static int merge_pair(struct merger *m, const struct bigram *b)
{
	struct symbol *l = &m->sym[b->left], *r;

	if (l->len != b->left_len || l->next < 0)
		return 0;
	r = &m->sym[l->next];
	if (r->len != b->right_len)
		return 0;
	l->len += r->len;
	r->len = 0;
	l->next = r->next;
	if (r->next >= 0)
		m->sym[r->next].prev = b->left;
	return try_pair(m, l->prev, b->left) || try_pair(m, b->left, l->next) ? -1 : 0;
}

/* Walks the best bucket in order of position, with the candidates of its
 * priority that the walk itself makes; stops early (and files the rest
 * back) when a better candidate appears. */
static int walk_bucket(struct merger *m)
{
	struct buckets *q = m->bq;
	int32_t bi = bucket_take_top(q);
	size_t cur = 0;

	if (bucket_gather(q, bi))
		return -1;
	q->side.n = 0;
	q->walking = q->b[bi].pri;
	q->in_walk = true;
	q->better = false;
	while (!q->better && (cur < q->n_batch || q->side.n)) {
		struct bigram b;

		if (q->side.n && (cur == q->n_batch || q->side.v[0].left < q->batch[cur].left))
			b = heap_pop(&q->side);
		else
			b = q->batch[cur++];
		if (merge_pair(m, &b))
			return -1;
	}
	q->in_walk = false;
	for (; cur < q->n_batch; cur++)
		if (bucket_add(q, &q->batch[cur]))
			return -1;
	while (q->side.n) {
		struct bigram b = heap_pop(&q->side);

		if (bucket_add(q, &b))
			return -1;
	}
	return 0;
}

/* Splits text[0..n) into UTF-8 characters and merges them; the surviving
 * symbols are those with len > 0, in index order. */
static int merge_run(struct merger *m, size_t n)
{
	size_t off = 0;
	int32_t k = 0;

	while (off < n) {
		int32_t cp;
		/* Invalid bytes stand alone, so a bad lead byte never swallows
		 * the escaped space after it. */
		size_t len = utf8_decode((const unsigned char *)m->text + off, n - off, &cp);

		m->sym[k] = (struct symbol){ (uint32_t)off, (uint32_t)len, k - 1, -1 };
		if (k > 0)
			m->sym[k - 1].next = k;
		off += len;
		k++;
	}
	m->n_sym = k;
	m->heap.n = 0;
	if ((uint32_t)k >= m->t->bucket_min) {
		m->bq = calloc(1, sizeof(*m->bq));
		if (!m->bq)
			return -1;
	}
	int rc = 0;

	for (int32_t i = 1; i < k && !rc; i++)
		rc = try_pair(m, i - 1, i);
	while (!rc && m->bq && m->bq->n_heap)
		rc = walk_bucket(m);
	while (!rc && !m->bq && m->heap.n) {
		struct bigram b = heap_pop(&m->heap);

		rc = merge_pair(m, &b);
	}
	buckets_free(m->bq);
	m->bq = NULL;
	return rc;
}

static int merger_init(struct merger *m, const struct loom_tokenizer *t,
		       const char *text, size_t n)
{
	memset(m, 0, sizeof(*m));
	m->t = t;
	m->text = text;
	if (n > UINT32_MAX || n > SIZE_MAX / sizeof(*m->sym) - 1)
		return -1;
	m->sym = malloc((n + 1) * sizeof(*m->sym));
	if (!m->sym)
		return -1;
	if (t->model == MODEL_BPE) {
		m->key = malloc(n + 2);
		if (!m->key)
			return -1;
	}
	return 0;
}

static void merger_free(struct merger *m)
{
	free(m->sym);
	free(m->key);
	free(m->heap.v);
}

/* ---- character pairs (spm) ---------------------------------------------- */

static uint64_t char_pair(const char *a, size_t al, const char *b, size_t bl)
{
	uint64_t k = 0;

	for (size_t i = 0; i < 4; i++)
		k = k << 8 | (i < al ? (unsigned char)a[i] : 0);
	for (size_t i = 0; i < 4; i++)
		k = k << 8 | (i < bl ? (unsigned char)b[i] : 0);
	return k + 1;
}

static size_t pair_slot(const struct pairset *ps, uint64_t key)
{
	size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 17) & ps->mask;

	while (ps->keys[i] && ps->keys[i] != key)
		i = (i + 1) & ps->mask;
	return i;
}

static bool pairset_has(const struct pairset *ps, uint64_t key)
{
	return ps->keys[pair_slot(ps, key)] == key;
}

static int pairset_add(struct pairset *ps, uint64_t key)
{
	size_t i;

	if (2 * (ps->n + 1) > ps->mask + 1) {
		struct pairset grown = { 0 };
		size_t cap = 2 * (ps->mask + 1);

		if (cap > SIZE_MAX / 2 / sizeof(*grown.keys))
			return -1;
		grown.keys = calloc(cap, sizeof(*grown.keys));
		if (!grown.keys)
			return -1;
		grown.mask = cap - 1;
		for (size_t k = 0; k <= ps->mask; k++)
			if (ps->keys[k])
				grown.keys[pair_slot(&grown, ps->keys[k])] = ps->keys[k];
		grown.n = ps->n;
		free(ps->keys);
		*ps = grown;
	}
	i = pair_slot(ps, key);
	if (!ps->keys[i]) {
		ps->keys[i] = key;
		ps->n++;
	}
	return 0;
}

/* Adds the pairs of adjacent characters of s[0..n). */
static int pairs_of(struct pairset *ps, const char *s, size_t n)
{
	int32_t cp;
	size_t at = 0, len = n ? utf8_decode((const unsigned char *)s, n, &cp) : 0;

	while (at + len < n) {
		size_t next = utf8_decode((const unsigned char *)s + at + len, n - at - len, &cp);

		if (pairset_add(ps, char_pair(s + at, len, s + at + len, next)))
			return -1;
		at += len;
		len = next;
	}
	return 0;
}

/* ---- SentencePiece (llama) --------------------------------------------- */

static void spm_emit_bytes(const struct loom_tokenizer *t, const char *s, size_t n,
			   struct outbuf *o)
{
	for (size_t i = 0; i < n; i++) {
		int32_t id = t->byte_tok[(unsigned char)s[i]];

		if (id < 0)
			id = t->unk;
		if (id >= 0)
			out_push(o, id);
	}
}

/* Where the next piece of esc[0..n) ends: at the first two adjacent
 * characters no vocabulary text holds side by side. A merged symbol is a
 * vocabulary text, so none spans that point, and the pieces tokenize
 * alone to the same ids (with small merge queues; a bounded call stops
 * after the piece that passes its limit). */
static size_t spm_piece_end(const struct loom_tokenizer *t, const char *esc, size_t n)
{
	int32_t cp;
	size_t at = 0, len = utf8_decode((const unsigned char *)esc, n, &cp);

	while (at + len < n) {
		size_t next = utf8_decode((const unsigned char *)esc + at + len, n - at - len, &cp);

		if (!pairset_has(&t->pairs, char_pair(esc + at, len, esc + at + len, next)))
			return at + len;
		at += len;
		len = next;
	}
	return n;
}

/* Merges and emits one piece, text[0..n) (m has room for it). */
static int spm_merge_piece(const struct loom_tokenizer *t, struct merger *m,
			   const char *text, size_t n, struct outbuf *o)
{
	m->text = text;
	if (merge_run(m, n))
		return -1;
	for (int32_t i = 0; i < m->n_sym; i++) {
		const struct symbol *y = &m->sym[i];
		int32_t id;

		if (!y->len)
			continue;
		id = strmap_get(&t->vocab, text + y->start, y->len);
		if (id >= 0 && is_text_type(t->type[id]))
			out_push(o, id);
		else
			spm_emit_bytes(t, text + y->start, y->len, o);
	}
	return 0;
}

/* Tokenizes one run of plain text (no special tokens inside). */
static int spm_encode(const struct loom_tokenizer *t, const char *s, size_t n,
		      bool prefix, struct outbuf *o)
{
	struct merger m;
	size_t cap, len = 0, at = 0;
	char *esc;
	int rc = -1;

	/* Every byte may become the 3-byte U+2581, plus the prefix. */
	if (n > (SIZE_MAX - 3) / 3)
		return -1;
	cap = 3 * n + 3;
	esc = malloc(cap);
	if (!esc)
		return -1;
	if (prefix) {
		memcpy(esc, SPACE_ESC, 3);
		len = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(esc + len, SPACE_ESC, 3);
			len += 3;
		} else {
			esc[len++] = s[i];
		}
	}
	if (merger_init(&m, t, esc, len))
		goto out;
	while (at < len && !out_over(o)) {
		size_t end = at + spm_piece_end(t, esc + at, len - at);

		if (spm_merge_piece(t, &m, esc + at, end - at, o))
			goto out;
		at = end;
	}
	rc = 0;
out:
	merger_free(&m);
	free(esc);
	return rc;
}

/* ---- byte-level BPE (gpt2) --------------------------------------------- */

/* Pre-tokenizer regex families. The lists are the published ones (HF
 * tokenizer.json files, as collected in llama.cpp's llama-vocab.cpp). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3_HEAD "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL
#define RE_QWEN2 RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL
#define RE_BLOOM " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+"

static const char *const re_default[] = {
	"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL
};
static const char *const re_gpt2[] = { RE_GPT2, NULL };
static const char *const re_llama3[] = { RE_LLAMA3, NULL };
static const char *const re_qwen2[] = { RE_QWEN2, NULL };
static const char *const re_starcoder[] = { "\\p{N}", RE_GPT2, NULL };
static const char *const re_falcon[] = {
	"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL
};
static const char *const re_deepseek_llm[] = {
	"[\r\n]",
	/* cased letters (Lu, Ll, Lt ranges), as published */
	"\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}"
	"\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}"
	"\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}"
	"\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}"
	"\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}"
	"\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
	"\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
	"\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}"
	"\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"
	"\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}"
	"\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}"
	"\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
	"\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
	"\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}"
	"\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
	"\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
	"\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"
	"\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}"
	"\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"
	"\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
	"\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
	"\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"
	"\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}"
	"\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"
	"\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
	"\\x{1E900}-\\x{1E943}]+",
	"\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
	/* published as \s+$; the look-behind starts a match only where a run
	 * of spaces starts (same matches), so a run is not rescanned from
	 * each of its bytes */
	"(?<!\\s)\\s+$",
	"[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
	"\\p{N}+",
	NULL
};
static const char *const re_deepseek_coder[] = {
	"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}", NULL
};
static const char *const re_deepseek3[] = {
	"\\p{N}{1,3}",
	"[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
	NULL
};
static const char *const re_bloom[] = { RE_BLOOM, NULL };
static const char *const re_viking[] = { RE_BLOOM, "\\p{N}", NULL };
static const char *const re_tekken[] = {
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	NULL
};

struct pre_family {
	const char *names; /* space-separated tokenizer.ggml.pre values */
	const char *const *re;
	bool ignore_merges; /* a word that is itself a token is not merged */
	bool add_bos;       /* default when add_bos_token is absent */
};

static const struct pre_family pre_families[] = {
	{ "default", re_default, false, false },
	{ "gpt-2 gpt2 phi-2 jina-es jina-de gigachat jina-v1-en jina-v2-es "
	  "jina-v2-de jina-v2-code roberta-bpe mpt olmo jais trillion", re_gpt2, false, false },
	{ "llama3 llama-v3 llama-bpe falcon3", re_llama3, true, true },
	{ "dbrx smaug-bpe chatglm-bpe", re_llama3, false, false },
	{ "qwen2 qwen2.5 qwen-2.5 deepseek-r1-qwen stablelm2 hunyuan", re_qwen2, false, false },
	{ "starcoder refact command-r smollm codeshell exaone minerva-7b", re_starcoder, false, false },
	{ "falcon", re_falcon, false, false },
	{ "deepseek-llm", re_deepseek_llm, false, false },
	{ "deepseek-coder", re_deepseek_coder, false, false },
	{ "deepseek-v3", re_deepseek3, false, false },
	{ "poro-chat bloom gpt3-finnish", re_bloom, false, false },
	{ "viking", re_viking, false, false },
	{ "tekken", re_tekken, true, false },
};

static bool name_in_list(const char *list, const char *name)
{
	size_t n = strlen(name);

	while (*list) {
		size_t w = strcspn(list, " ");

		if (w == n && !memcmp(list, name, n))
			return true;
		list += w;
		list += strspn(list, " ");
	}
	return false;
}

static const struct pre_family *pre_find(const char *name)
{
	for (size_t i = 0; i < sizeof(pre_families) / sizeof(pre_families[0]); i++)
		if (name_in_list(pre_families[i].names, name))
			return &pre_families[i];
	return NULL;
}

static int compile_regexes(struct loom_tokenizer *t, const char *const *re,
			   char *err, size_t errlen)
{
	uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY;

#ifdef PCRE2_MATCH_INVALID_UTF
	opts |= PCRE2_MATCH_INVALID_UTF; /* invalid bytes never match, no error */
#endif
	for (t->n_re = 0; re[t->n_re]; t->n_re++) {
		int code;
		PCRE2_SIZE at;
		pcre2_code *c = pcre2_compile((PCRE2_SPTR)re[t->n_re], PCRE2_ZERO_TERMINATED,
					      opts, &code, &at, NULL);

		if (!c) {
			PCRE2_UCHAR msg[256];

			pcre2_get_error_message(code, msg, sizeof(msg));
			loom_seterr(err, errlen, "pre-tokenizer regex %d: %s at offset %zu",
			       t->n_re, (const char *)msg, (size_t)at);
			return -1;
		}
		pcre2_jit_compile(c, PCRE2_JIT_COMPLETE); /* optional speed-up */
		t->re[t->n_re] = c;
	}
	return 0;
}

struct span {
	size_t off, len;
};

struct spans {
	struct span *v;
	size_t n, cap;
};

static int spans_push(struct spans *s, size_t off, size_t len)
{
	if (!len)
		return 0;
	if (s->n == s->cap) {
		struct span *v = grow_array(s->v, &s->cap, sizeof(*v));

		if (!v)
			return -1;
		s->v = v;
	}
	s->v[s->n++] = (struct span){ off, len };
	return 0;
}

/* Splits piece p of text by regex re: matches and the gaps between them
 * are all kept, in order. The regex sees only the piece, so look-aheads
 * stop at its end (as in llama.cpp and HF's sequence of splits). */
static int split_piece(const pcre2_code *re, pcre2_match_data *md, const char *text,
		       struct span p, struct spans *out)
{
	PCRE2_SPTR s = (PCRE2_SPTR)(text + p.off);
	size_t pos = 0, gap = 0;

	while (pos < p.len) {
		int rc = pcre2_match(re, s, p.len, pos, 0, md, NULL);
		PCRE2_SIZE *ov;

		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0)
			return -1;
		ov = pcre2_get_ovector_pointer(md);
		if (ov[1] <= ov[0]) { /* empty match: step one character */
			pos = ov[0] + utf8_len(s[ov[0]]);
			continue;
		}
		if (spans_push(out, p.off + gap, ov[0] - gap) ||
		    spans_push(out, p.off + ov[0], ov[1] - ov[0]))
			return -1;
		pos = gap = ov[1];
	}
	return spans_push(out, p.off + gap, p.len - gap);
}

static int pre_split(const struct loom_tokenizer *t, const char *text, size_t n,
		     struct spans *words)
{
	struct spans cur = { 0 }, next = { 0 };
	int rc = -1;

	if (spans_push(&cur, 0, n))
		goto out;
	for (int r = 0; r < t->n_re; r++) {
		pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re[r], NULL);

		if (!md)
			goto out;
		next.n = 0;
		for (size_t i = 0; i < cur.n; i++) {
			if (split_piece(t->re[r], md, text, cur.v[i], &next)) {
				pcre2_match_data_free(md);
				goto out;
			}
		}
		pcre2_match_data_free(md);
		struct spans tmp = cur;
		cur = next;
		next = tmp;
	}
	*words = cur;
	cur.v = NULL;
	rc = 0;
out:
	free(cur.v);
	free(next.v);
	return rc;
}

/* Emits the tokens of one merged symbol, falling back to its characters. */
static void bpe_emit(const struct loom_tokenizer *t, const char *s, size_t n,
		     struct outbuf *o)
{
	int32_t id = strmap_get(&t->vocab, s, n);

	if (id >= 0) {
		out_push(o, id);
		return;
	}
	for (size_t i = 0; i < n;) {
		size_t len = utf8_len((unsigned char)s[i]);

		if (len > n - i)
			len = n - i;
		id = strmap_get(&t->vocab, s + i, len);
		if (id < 0)
			id = t->unk;
		if (id >= 0)
			out_push(o, id);
		i += len;
	}
}

static int bpe_word(const struct loom_tokenizer *t, struct merger *m, const char *w,
		    size_t n, struct outbuf *o)
{
	if (t->ignore_merges) {
		int32_t id = strmap_get(&t->vocab, w, n);

		if (id >= 0) {
			out_push(o, id);
			return 0;
		}
	}
	m->text = w;
	if (merge_run(m, n))
		return -1;
	for (int32_t i = 0; i < m->n_sym; i++)
		if (m->sym[i].len)
			bpe_emit(t, w + m->sym[i].start, m->sym[i].len, o);
	return 0;
}

static int bpe_encode(const struct loom_tokenizer *t, const char *s, size_t n,
		      struct outbuf *o)
{
	struct spans words = { 0 };
	struct merger m;
	char *enc = NULL;
	int rc = -1;

	if (n > SIZE_MAX / 2)
		return -1;
	if (pre_split(t, s, n, &words))
		return -1;
	/* A mapped byte takes at most 2 bytes; the longest word bounds scratch. */
	size_t longest = 0;
	for (size_t i = 0; i < words.n; i++)
		if (words.v[i].len > longest)
			longest = words.v[i].len;
	enc = malloc(2 * longest + 1);
	if (!enc || merger_init(&m, t, enc, 2 * longest))
		goto out_words;
	for (size_t i = 0; i < words.n && !out_over(o); i++) {
		const unsigned char *w = (const unsigned char *)s + words.v[i].off;
		size_t len = 0;

		for (size_t j = 0; j < words.v[i].len; j++) {
			memcpy(enc + len, t->b2u[w[j]], t->b2u_len[w[j]]);
			len += t->b2u_len[w[j]];
		}
		if (bpe_word(t, &m, enc, len, o))
			goto out;
	}
	rc = 0;
out:
	merger_free(&m);
out_words:
	free(enc);
	free(words.v);
	return rc;
}

/* ---- tokenize ---------------------------------------------------------- */

static size_t trie_slot(const struct trie *tr, uint64_t key)
{
	size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & tr->mask;

	while (tr->edges[i].key && tr->edges[i].key != key)
		i = (i + 1) & tr->mask;
	return i;
}

static int32_t trie_child(const struct trie *tr, int32_t node, unsigned char b)
{
	const struct trie_edge *e;

	if (!tr->edges)
		return -1;
	e = &tr->edges[trie_slot(tr, (uint64_t)node * 256 + b + 1)];
	return e->key ? e->child : -1;
}

/* Longest special token starting at s[0..n), -1 if none. User-defined
 * tokens always match (as added tokens do in HF tokenizers); control and
 * unknown tokens only with parse_special. Of tokens with the same text,
 * the lowest id. */
static int32_t match_special(const struct loom_tokenizer *t, const char *s, size_t n,
			     bool parse_special, size_t *mlen)
{
	const struct trie *tr = &t->special;
	int32_t node = 0, found = -1;

	for (size_t i = 0; i < n; i++) {
		int32_t id;

		node = trie_child(tr, node, (unsigned char)s[i]);
		if (node < 0)
			break;
		id = parse_special ? tr->any[node] : tr->user[node];
		if (id >= 0) {
			found = id;
			*mlen = i + 1;
		}
	}
	return found;
}

/* A run of n bytes needs at least n / max_piece ids: when that alone
 * passes the limit, the run is not tokenized at all. */
static bool run_over(const struct loom_tokenizer *t, size_t n, struct outbuf *o)
{
	uint64_t least = n / t->max_piece;

	if (least <= (uint64_t)(o->limit - o->n))
		return false;
	o->n = o->limit + 1;
	return true;
}

static int encode_text(const struct loom_tokenizer *t, const char *s, size_t n,
		       bool after_special, struct outbuf *o)
{
	if (run_over(t, n, o))
		return 0;
	if (t->model == MODEL_SPM)
		return spm_encode(t, s, n, t->add_space_prefix && after_special, o);
	return bpe_encode(t, s, n, o);
}

/* End of the run of bytes of pos's kind (markup or message text), so that
 * a special token never straddles the two; without a mask, len. */
static size_t run_end(const unsigned char *markup, size_t pos, size_t len)
{
	size_t end = pos;

	if (!markup)
		return len;
	while (end < len && !markup[end] == !markup[pos])
		end++;
	return end;
}

/* markup NULL: parse_special decides for the whole text; else control
 * tokens are parsed only where markup[i] is set. Linear in len: each run
 * is measured once, and a match attempt walks at most the longest
 * special token. */
static int64_t tokenize(const struct loom_tokenizer *t, const char *text, size_t len,
			const unsigned char *markup, bool add_special, bool parse_special,
			int32_t *out, int64_t cap, int64_t limit)
{
	struct outbuf o = { out, cap, 0, limit };
	bool after_special = true; /* spm: the first text run gets the prefix */
	size_t pos = 0, seg = 0, end = 0;

	if (!t || (!text && len) || cap < 0 || (!out && cap > 0) || limit < 0)
		return -1;
	if (add_special && t->add_bos && t->bos >= 0)
		out_push(&o, t->bos);
	while (pos < len && !out_over(&o)) {
		size_t mlen = 0;
		bool ps = markup ? markup[pos] != 0 : parse_special;
		int32_t id;

		if (pos >= end)
			end = run_end(markup, pos, len);
		id = match_special(t, text + pos, end - pos, ps, &mlen);
		if (id < 0) {
			pos++;
			continue;
		}
		if (pos > seg && encode_text(t, text + seg, pos - seg, after_special, &o))
			return -1;
		out_push(&o, id);
		after_special = true;
		pos += mlen;
		seg = pos;
	}
	if (len > seg && !out_over(&o) &&
	    encode_text(t, text + seg, len - seg, after_special, &o))
		return -1;
	if (add_special && t->add_eos && t->eos >= 0)
		out_push(&o, t->eos);
	return out_over(&o) ? limit + 1 : o.n;
}

int64_t loom_tokenize(const struct loom_tokenizer *t, const char *text, size_t len,
		      bool add_special, bool parse_special, int32_t *out, int64_t cap)
{
	return tokenize(t, text, len, NULL, add_special, parse_special, out, cap, INT64_MAX - 1);
}

int64_t loom_tokenize_marked(const struct loom_tokenizer *t, const char *text, size_t len,
			     const unsigned char *markup, bool add_special, int32_t *out,
			     int64_t cap)
{
	if (!markup && len)
		return -1;
	return tokenize(t, text, len, markup, add_special, false, out, cap, INT64_MAX - 1);
}

int64_t loom_tokenize_max(const struct loom_tokenizer *t, const char *text, size_t len,
			  const unsigned char *markup, bool add_special, bool parse_special,
			  int32_t *out, int64_t cap, int64_t max)
{
	if (max < 0 || max == INT64_MAX)
		return -1;
	return tokenize(t, text, len, markup, add_special, markup ? false : parse_special, out,
			cap, max);
}

/* ---- detokenize -------------------------------------------------------- */

/* Bytes held back at the end of buf[0..n): a UTF-8 sequence that has begun
 * but lacks continuation bytes (0 if the end is complete or invalid). */
static size_t incomplete_tail(const unsigned char *buf, size_t n)
{
	for (size_t k = 1; k <= 3 && k <= n; k++) {
		unsigned char c = buf[n - k];
		size_t need;

		if ((c & 0xc0) == 0x80)
			continue; /* continuation byte: look further back */
		need = utf8_len(c);
		return need > k ? k : 0;
	}
	return 0;
}

int loom_detokenize(const struct loom_tokenizer *t, struct loom_detok *st,
		    int32_t token, char *out, size_t cap)
{
	unsigned char last[3], tmp[3];
	const char *piece;
	size_t plen, have, total, nl, tail, emit;
	bool first;

	if (!t || !st || !out || !cap || token < 0 || token >= t->n_vocab)
		return -1;
	if (st->n_pending < 0 || st->n_pending > 3)
		return -1;
	piece = t->piece_blob + t->piece_off[token];
	plen = t->piece_len[token];
	first = st->first;
	if (first && plen) {
		if (t->model == MODEL_SPM && t->add_space_prefix && piece[0] == ' ') {
			piece++;
			plen--;
		}
		first = false;
	}
	/* Stream = pending + piece; only its last 3 bytes can be held back. */
	have = (size_t)st->n_pending;
	total = have + plen;
	nl = total < 3 ? total : 3;
	for (size_t i = 0; i < nl; i++) {
		size_t at = total - nl + i;

		last[i] = at < have ? st->pending[at] : (unsigned char)piece[at - have];
	}
	tail = incomplete_tail(last, nl);
	emit = total - tail;
	if (emit + 1 > cap)
		return -1;
	if (emit <= have) {
		memcpy(out, st->pending, emit);
	} else {
		memcpy(out, st->pending, have);
		memcpy(out + have, piece, emit - have);
	}
	out[emit] = 0;
	memcpy(tmp, last + nl - tail, tail);
	memcpy(st->pending, tmp, tail);
	st->n_pending = (int)tail;
	st->first = first;
	return (int)emit;
}

const char *loom_token_text(const struct loom_tokenizer *t, int32_t token)
{
	if (!t || token < 0 || token >= t->n_vocab)
		return NULL;
	return t->text_blob + t->text_off[token];
}

const char *loom_token_bytes(const struct loom_tokenizer *t, int32_t token, size_t *len)
{
	return loom_tokenizer_piece(t, token, len);
}

int32_t loom_tokenizer_n_vocab(const struct loom_tokenizer *t)
{
	return t ? t->n_vocab : 0;
}

int32_t loom_tokenizer_bos(const struct loom_tokenizer *t)
{
	return t ? t->bos : -1;
}

int32_t loom_tokenizer_eos(const struct loom_tokenizer *t)
{
	return t ? t->eos : -1;
}

bool loom_tokenizer_is_eog(const struct loom_tokenizer *t, int32_t token)
{
	return t && token >= 0 && token < t->n_vocab && t->eog[token];
}

/* ---- construction ------------------------------------------------------ */

void loom_tokenizer_free(struct loom_tokenizer *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->n_re; i++)
		pcre2_code_free(t->re[i]);
	free(t->text_blob);
	free(t->text_off);
	free(t->text_len);
	free(t->piece_blob);
	free(t->piece_off);
	free(t->piece_len);
	free(t->scores);
	free(t->type);
	free(t->eog);
	free(t->vocab.slots);
	free(t->merges.slots);
	free(t->merge_blob);
	free(t->pairs.keys);
	free(t->special.edges);
	free(t->special.any);
	free(t->special.user);
	free(t);
}

static void init_byte_map(struct loom_tokenizer *t)
{
	int extra = 0;

	for (int i = 0; i < 512; i++)
		t->u2b[i] = -1;
	for (int b = 0; b < 256; b++) {
		bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
				 (b >= 174 && b <= 255);
		int cp = printable ? b : 256 + extra++;

		if (cp < 0x80) {
			t->b2u[b][0] = (char)cp;
			t->b2u_len[b] = 1;
		} else {
			t->b2u[b][0] = (char)(0xc0 | (cp >> 6));
			t->b2u[b][1] = (char)(0x80 | (cp & 0x3f));
			t->b2u_len[b] = 2;
		}
		t->u2b[cp] = (int16_t)b;
	}
}

/* Element i of an integer array of any width, as int64. */
static int64_t arr_int(const struct gguf_kv *kv, uint64_t i)
{
	const unsigned char *p = kv->arr_data;

	switch (kv->arr_type) {
	case GGUF_U8: return p[i];
	case GGUF_I8: return (int8_t)p[i];
	case GGUF_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
	case GGUF_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
	case GGUF_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
	case GGUF_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
	case GGUF_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); return (int64_t)v; }
	case GGUF_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return v; }
	default: return 0;
	}
}

static bool is_int_vtype(uint32_t t)
{
	return t == GGUF_U8 || t == GGUF_I8 || t == GGUF_U16 || t == GGUF_I16 ||
	       t == GGUF_U32 || t == GGUF_I32 || t == GGUF_U64 || t == GGUF_I64;
}

static int load_texts(struct loom_tokenizer *t, const struct gguf_file *f,
		      char *err, size_t errlen)
{
	const struct gguf_kv *kv;
	size_t total = 0, off = 0;
	int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &kv, err, errlen);

	if (rc < 0)
		return -1;
	if (rc > 0 || kv->arr_n == 0) {
		loom_seterr(err, errlen, "tokenizer.ggml.tokens: missing or empty");
		return -1;
	}
	if (kv->arr_n > INT32_MAX) {
		loom_seterr(err, errlen, "tokenizer.ggml.tokens: %llu tokens is too many",
		       (unsigned long long)kv->arr_n);
		return -1;
	}
	t->n_vocab = (int32_t)kv->arr_n;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		uint64_t len = kv->arr_str[i].len;

		if (len > UINT32_MAX - 1 || len + 1 > SIZE_MAX - total) {
			loom_seterr(err, errlen, "tokenizer.ggml.tokens[%d]: too long", i);
			return -1;
		}
		total += (size_t)len + 1;
	}
	t->text_blob = malloc(total);
	t->text_off = malloc((size_t)t->n_vocab * sizeof(*t->text_off));
	t->text_len = malloc((size_t)t->n_vocab * sizeof(*t->text_len));
	t->type = malloc((size_t)t->n_vocab);
	t->scores = calloc((size_t)t->n_vocab, sizeof(*t->scores));
	t->eog = calloc((size_t)t->n_vocab, sizeof(*t->eog));
	if (!t->text_blob || !t->text_off || !t->text_len || !t->type || !t->scores ||
	    !t->eog || strmap_init(&t->vocab, (size_t)t->n_vocab))
		goto out_nomem;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		size_t len = (size_t)kv->arr_str[i].len;

		memcpy(t->text_blob + off, kv->arr_str[i].ptr, len);
		t->text_blob[off + len] = 0;
		t->text_off[i] = off;
		t->text_len[i] = (uint32_t)len;
		t->type[i] = TT_NORMAL;
		off += len + 1;
	}
	return 0;
out_nomem:
	loom_seterr(err, errlen, "tokenizer: out of memory for %d tokens", t->n_vocab);
	return -1;
}

static int load_types_scores(struct loom_tokenizer *t, const struct gguf_file *f,
			     char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find(f, "tokenizer.ggml.token_type");
	int rc;

	if (kv) {
		if (kv->type != GGUF_ARRAY || !is_int_vtype(kv->arr_type) ||
		    kv->arr_n != (uint64_t)t->n_vocab) {
			loom_seterr(err, errlen, "tokenizer.ggml.token_type: expected an integer array of %d entries",
			       t->n_vocab);
			return -1;
		}
		for (int32_t i = 0; i < t->n_vocab; i++) {
			int64_t v = arr_int(kv, (uint64_t)i);

			t->type[i] = (v >= 0 && v <= TT_BYTE) ? (uint8_t)v : TT_UNDEFINED;
		}
	}
	rc = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_F32, &kv, err, errlen);
	if (rc < 0)
		return -1;
	if (rc == 0) {
		if (kv->arr_n != (uint64_t)t->n_vocab) {
			loom_seterr(err, errlen, "tokenizer.ggml.scores: %llu entries for %d tokens",
			       (unsigned long long)kv->arr_n, t->n_vocab);
			return -1;
		}
		memcpy(t->scores, kv->arr_data, (size_t)t->n_vocab * sizeof(float));
		/* Scores order merges: NaN orders nothing. */
		for (int32_t i = 0; i < t->n_vocab; i++)
			if (isnan(t->scores[i])) {
				loom_seterr(err, errlen, "tokenizer.ggml.scores[%d]: not a number", i);
				return -1;
			}
	}
	return 0;
}

/* text -> id. On duplicate texts the first wins, except that a normal
 * token replaces an earlier non-normal one. Empty texts are not mapped. */
static void build_vocab_map(struct loom_tokenizer *t)
{
	for (int32_t i = 0; i < t->n_vocab; i++) {
		struct strmap_slot *s;

		if (!t->text_len[i])
			continue;
		s = strmap_put(&t->vocab, t->text_blob + t->text_off[i], t->text_len[i]);
		if (s->val < 0 || (t->type[s->val] != TT_NORMAL && t->type[i] == TT_NORMAL))
			s->val = i;
	}
}

static int load_merges(struct loom_tokenizer *t, const struct gguf_file *f,
		       char *err, size_t errlen)
{
	const struct gguf_kv *kv;
	size_t total = 0, off = 0;
	int rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_STRING, &kv, err, errlen);

	if (rc < 0)
		return -1;
	if (rc > 0) {
		loom_seterr(err, errlen, "tokenizer.ggml.merges: missing (required for gpt2)");
		return -1;
	}
	/* Ranks are merge priorities held exactly in a float (struct bigram);
	 * real vocabularies have a few hundred thousand. */
	if (kv->arr_n > (1u << 24)) {
		loom_seterr(err, errlen, "tokenizer.ggml.merges: %llu entries, more than 2^24",
			    (unsigned long long)kv->arr_n);
		return -1;
	}
	for (uint64_t i = 0; i < kv->arr_n; i++) {
		uint64_t len = kv->arr_str[i].len;

		if (len > UINT32_MAX || len > SIZE_MAX - total) {
			loom_seterr(err, errlen, "tokenizer.ggml.merges[%llu]: too long",
			       (unsigned long long)i);
			return -1;
		}
		total += (size_t)len;
	}
	t->merge_blob = malloc(total ? total : 1);
	if (!t->merge_blob || strmap_init(&t->merges, (size_t)kv->arr_n)) {
		loom_seterr(err, errlen, "tokenizer: out of memory for merges");
		return -1;
	}
	for (uint64_t i = 0; i < kv->arr_n; i++) {
		size_t len = (size_t)kv->arr_str[i].len;
		const char *sp = len > 1 ? memchr(kv->arr_str[i].ptr + 1, ' ', len - 1) : NULL;
		struct strmap_slot *s;

		if (!sp) {
			loom_seterr(err, errlen, "tokenizer.ggml.merges[%llu]: not of the form \"left right\"",
			       (unsigned long long)i);
			return -1;
		}
		memcpy(t->merge_blob + off, kv->arr_str[i].ptr, len);
		s = strmap_put(&t->merges, t->merge_blob + off, (uint32_t)len);
		if (s->val < 0)
			s->val = (int32_t)i; /* the first (best) rank wins */
		off += len;
	}
	return 0;
}

/* Optional token id key: -1 when absent or out of range (with a warning). */
static int load_id(const struct loom_tokenizer *t, const struct gguf_file *f,
		   const char *key, int32_t *id, char *err, size_t errlen)
{
	uint32_t v;
	int rc = gguf_get_u32(f, key, &v, err, errlen);

	if (rc < 0)
		return -1;
	if (rc > 0)
		return 0;
	if (v >= (uint32_t)t->n_vocab) {
		loom_log(LOOM_LOG_WARN, "tokenizer: %s = %u is outside the vocabulary (%d tokens), ignored",
			key, v, t->n_vocab);
		*id = -1;
		return 0;
	}
	*id = (int32_t)v;
	return 0;
}

static int load_flag(const struct gguf_file *f, const char *key, bool *out,
		     char *err, size_t errlen)
{
	return gguf_get_bool(f, key, out, err, errlen) < 0 ? -1 : 0;
}

static int load_special_ids(struct loom_tokenizer *t, const struct gguf_file *f,
			    char *err, size_t errlen)
{
	t->bos = t->eos = t->unk = t->eot = t->eom = -1;
	if (load_id(t, f, "tokenizer.ggml.bos_token_id", &t->bos, err, errlen) ||
	    load_id(t, f, "tokenizer.ggml.eos_token_id", &t->eos, err, errlen) ||
	    load_id(t, f, "tokenizer.ggml.unknown_token_id", &t->unk, err, errlen) ||
	    load_id(t, f, "tokenizer.ggml.eot_token_id", &t->eot, err, errlen) ||
	    load_id(t, f, "tokenizer.ggml.eom_token_id", &t->eom, err, errlen))
		return -1;
	if (t->unk < 0) {
		for (int32_t i = 0; i < t->n_vocab && t->unk < 0; i++)
			if (t->type[i] == TT_UNKNOWN)
				t->unk = i;
	}
	if (load_flag(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err, errlen) ||
	    load_flag(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err, errlen) ||
	    load_flag(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, errlen))
		return -1;
	return 0;
}

static void mark_eog(struct loom_tokenizer *t)
{
	static const char *const names[] = {
		"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>", "<|end|>",
		"<|eom_id|>", NULL
	};

	if (t->eos >= 0)
		t->eog[t->eos] = true;
	if (t->eot >= 0)
		t->eog[t->eot] = true;
	if (t->eom >= 0)
		t->eog[t->eom] = true;
	for (int k = 0; names[k]; k++) {
		int32_t id = strmap_get(&t->vocab, names[k], strlen(names[k]));

		if (id >= 0 && t->type[id] == TT_CONTROL)
			t->eog[id] = true;
	}
}

static bool is_special_type(uint8_t type)
{
	return type == TT_CONTROL || type == TT_USER_DEFINED || type == TT_UNKNOWN;
}

/* Adds token id's text to the trie (which has room for it). */
static void trie_add(struct loom_tokenizer *t, int32_t id)
{
	struct trie *tr = &t->special;
	const unsigned char *s = (const unsigned char *)t->text_blob + t->text_off[id];
	int32_t node = 0;

	for (uint32_t i = 0; i < t->text_len[id]; i++) {
		uint64_t key = (uint64_t)node * 256 + s[i] + 1;
		struct trie_edge *e = &tr->edges[trie_slot(tr, key)];

		if (!e->key) {
			e->key = key;
			e->child = tr->n_nodes;
			tr->any[tr->n_nodes] = tr->user[tr->n_nodes] = -1;
			tr->n_nodes++;
		}
		node = e->child;
	}
	/* ids ascend, so the first token of a text keeps the node */
	if (tr->any[node] < 0)
		tr->any[node] = id;
	if (tr->user[node] < 0 && t->type[id] == TT_USER_DEFINED)
		tr->user[node] = id;
}

/* spm: the adjacent character pairs of every vocabulary text. */
static int index_pairs(struct loom_tokenizer *t)
{
	struct pairset *ps = &t->pairs;

	if (t->model != MODEL_SPM)
		return 0;
	ps->keys = calloc(1024, sizeof(*ps->keys));
	if (!ps->keys)
		return -1;
	ps->mask = 1023;
	for (int32_t i = 0; i < t->n_vocab; i++)
		if (pairs_of(ps, t->text_blob + t->text_off[i], t->text_len[i]))
			return -1;
	return 0;
}

static int index_specials(struct loom_tokenizer *t)
{
	struct trie *tr = &t->special;
	size_t bytes = 0, cap = 16;

	for (int32_t i = 0; i < t->n_vocab; i++) {
		if (!is_special_type(t->type[i]))
			continue;
		if (bytes > SIZE_MAX / 4 - t->text_len[i])
			return -1;
		bytes += t->text_len[i];
	}
	if (bytes >= INT32_MAX)
		return -1;
	while (cap < 2 * bytes)
		cap *= 2;
	tr->edges = calloc(cap, sizeof(*tr->edges));
	tr->any = malloc((bytes + 1) * sizeof(*tr->any));
	tr->user = malloc((bytes + 1) * sizeof(*tr->user));
	if (!tr->edges || !tr->any || !tr->user)
		return -1;
	tr->mask = cap - 1;
	tr->any[0] = tr->user[0] = -1;
	tr->n_nodes = 1;
	for (int32_t i = 0; i < t->n_vocab; i++)
		if (is_special_type(t->type[i]) && t->text_len[i])
			trie_add(t, i);
	return 0;
}

/* "<0xXX>" -> XX, or -1. */
static int parse_byte_token(const char *s, uint32_t len)
{
	unsigned v = 0;

	if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
		return -1;
	for (int i = 3; i < 5; i++) {
		char c = s[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (unsigned)(c - '0');
		else if (c >= 'A' && c <= 'F')
			v |= (unsigned)(c - 'A' + 10);
		else if (c >= 'a' && c <= 'f')
			v |= (unsigned)(c - 'a' + 10);
		else
			return -1;
	}
	return (int)v;
}

static void map_byte_tokens(struct loom_tokenizer *t)
{
	for (int b = 0; b < 256; b++)
		t->byte_tok[b] = -1;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		const char *s = t->text_blob + t->text_off[i];
		int b;

		if (t->model == MODEL_SPM && t->type[i] == TT_BYTE) {
			b = parse_byte_token(s, t->text_len[i]);
			if (b >= 0 && t->byte_tok[b] < 0)
				t->byte_tok[b] = i;
		}
	}
	if (t->model == MODEL_BPE)
		for (int b = 0; b < 256; b++)
			t->byte_tok[b] = strmap_get(&t->vocab, t->b2u[b], t->b2u_len[b]);
}

/* spm: "▁" -> ' ' */
static size_t spm_piece(const char *s, size_t n, char *out)
{
	size_t k = 0;

	for (size_t i = 0; i < n;) {
		if (n - i >= 3 && !memcmp(s + i, SPACE_ESC, 3)) {
			out[k++] = ' ';
			i += 3;
		} else {
			out[k++] = s[i++];
		}
	}
	return k;
}

/* gpt2: mapped code points -> bytes; anything else is kept as is. */
static size_t bpe_piece(const struct loom_tokenizer *t, const char *s, size_t n, char *out)
{
	size_t k = 0;

	for (size_t i = 0; i < n;) {
		int32_t cp;
		size_t len = utf8_decode((const unsigned char *)s + i, n - i, &cp);

		if (cp >= 0 && cp < 512 && t->u2b[cp] >= 0) {
			out[k++] = (char)t->u2b[cp];
		} else {
			memcpy(out + k, s + i, len);
			k += len;
		}
		i += len;
	}
	return k;
}

/* The bytes a token stands for when detokenized. Never longer than
 * max(text, 3). */
static size_t token_piece(const struct loom_tokenizer *t, int32_t id, char *out)
{
	const char *s = t->text_blob + t->text_off[id];
	uint32_t n = t->text_len[id];
	int b;

	switch (t->type[id]) {
	case TT_CONTROL:
	case TT_UNUSED:
		return 0;
	case TT_USER_DEFINED:
		memcpy(out, s, n);
		return n;
	case TT_UNKNOWN:
		if (t->model == MODEL_BPE)
			return 0;
		memcpy(out, "\xe2\x96\x85", 3); /* U+2585, as llama.cpp prints <unk> */
		return 3;
	case TT_BYTE:
		b = parse_byte_token(s, n);
		if (t->model == MODEL_SPM && b >= 0) {
			out[0] = (char)b;
			return 1;
		}
		break;
	default:
		break;
	}
	return t->model == MODEL_SPM ? spm_piece(s, n, out) : bpe_piece(t, s, n, out);
}

static int build_pieces(struct loom_tokenizer *t)
{
	size_t total = 0, off = 0;

	for (int32_t i = 0; i < t->n_vocab; i++) {
		size_t n = t->text_len[i] < 3 ? 3 : t->text_len[i];

		if (n > SIZE_MAX - total)
			return -1;
		total += n;
	}
	t->piece_blob = malloc(total ? total : 1);
	t->piece_off = malloc((size_t)t->n_vocab * sizeof(*t->piece_off));
	t->piece_len = malloc((size_t)t->n_vocab * sizeof(*t->piece_len));
	if (!t->piece_blob || !t->piece_off || !t->piece_len)
		return -1;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		size_t n = token_piece(t, i, t->piece_blob + off);

		t->piece_off[i] = off;
		t->piece_len[i] = (uint32_t)n;
		off += n;
		if (n > t->max_piece)
			t->max_piece = (uint32_t)n;
	}
	return 0;
}

static int setup_bpe(struct loom_tokenizer *t, const struct gguf_file *f,
		     char *err, size_t errlen)
{
	const struct pre_family *fam;
	char *pre = NULL;
	int rc = gguf_get_str(f, "tokenizer.ggml.pre", &pre, err, errlen);

	if (rc < 0)
		return -1;
	fam = pre_find(rc == 0 ? pre : "default");
	if (!fam) {
		loom_log(LOOM_LOG_WARN, "tokenizer: unknown tokenizer.ggml.pre '%s', using the default pre-tokenizer",
			pre);
		fam = pre_find("default");
	}
	free(pre);
	t->ignore_merges = fam->ignore_merges;
	t->add_bos = fam->add_bos;
	if (load_merges(t, f, err, errlen))
		return -1;
	return compile_regexes(t, fam->re, err, errlen);
}

/* tokenizer.ggml.model values loom reads. */
static const struct {
	const char *name;
	enum tok_model model;
	const char *kind; /* for `loom info --archs` */
} tok_models[] = {
	{ "llama", MODEL_SPM, "SentencePiece BPE (scores, byte fallback)" },
	{ "gpt2", MODEL_BPE, "byte-level BPE (merges, pre-tokenizer regexes)" },
};

#define N_TOK_MODELS (sizeof(tok_models) / sizeof(tok_models[0]))

const char *loom_tokenizer_model_name(size_t i, const char **kind)
{
	if (i >= N_TOK_MODELS)
		return NULL;
	*kind = tok_models[i].kind;
	return tok_models[i].name;
}

const char *loom_tokenizer_pre_family(size_t i)
{
	return i < sizeof(pre_families) / sizeof(pre_families[0]) ? pre_families[i].names : NULL;
}

static int setup_model(struct loom_tokenizer *t, const struct gguf_file *f,
		       char *err, size_t errlen)
{
	char *model = NULL;
	int rc = gguf_get_str(f, "tokenizer.ggml.model", &model, err, errlen);
	size_t i;

	if (rc < 0)
		return -1;
	if (rc > 0) {
		loom_seterr(err, errlen, "tokenizer.ggml.model: missing");
		return -1;
	}
	for (i = 0; i < N_TOK_MODELS && strcmp(model, tok_models[i].name); i++)
		;
	if (i == N_TOK_MODELS) {
		loom_seterr(err, errlen, "tokenizer.ggml.model: '%s' is not supported (llama, gpt2)",
		       model);
		free(model);
		return -1;
	}
	t->model = tok_models[i].model;
	free(model);
	return 0;
}

/* spm files written without the id keys use <s> and </s>. */
static void spm_default_ids(struct loom_tokenizer *t, const struct gguf_file *f)
{
	if (!gguf_find(f, "tokenizer.ggml.bos_token_id"))
		t->bos = strmap_get(&t->vocab, "<s>", 3);
	if (!gguf_find(f, "tokenizer.ggml.eos_token_id"))
		t->eos = strmap_get(&t->vocab, "</s>", 4);
}

struct loom_tokenizer *loom_tokenizer_from_gguf(const struct gguf_file *f,
						char *err, size_t errlen)
{
	struct loom_tokenizer *t;

	if (!f) {
		loom_seterr(err, errlen, "tokenizer: no GGUF file");
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t) {
		loom_seterr(err, errlen, "tokenizer: out of memory");
		return NULL;
	}
	t->max_piece = 4; /* a character that falls back to <unk> or bytes */
	t->bucket_min = LOOM_TOKENIZER_BUCKET_MIN;
	init_byte_map(t);
	if (setup_model(t, f, err, errlen) || load_texts(t, f, err, errlen) ||
	    load_types_scores(t, f, err, errlen))
		goto out_free;
	build_vocab_map(t);
	if (t->model == MODEL_SPM) {
		t->add_bos = true;
		t->add_space_prefix = true;
	} else if (setup_bpe(t, f, err, errlen)) {
		goto out_free;
	}
	if (load_special_ids(t, f, err, errlen))
		goto out_free;
	if (t->model == MODEL_SPM)
		spm_default_ids(t, f);
	map_byte_tokens(t);
	mark_eog(t);
	if (build_pieces(t) || index_specials(t) || index_pairs(t)) {
		loom_seterr(err, errlen, "tokenizer: out of memory");
		goto out_free;
	}
	return t;
out_free:
	loom_tokenizer_free(t);
	return NULL;
}

const char *loom_tokenizer_piece(const struct loom_tokenizer *t, int32_t id, size_t *len)
{
	if (!t || id < 0 || id >= t->n_vocab) {
		*len = 0;
		return NULL;
	}
	*len = t->piece_len[id];
	return t->piece_blob + t->piece_off[id];
}

void loom_tokenizer_set_bucket_min(struct loom_tokenizer *t, uint32_t n)
{
	t->bucket_min = n;
}
