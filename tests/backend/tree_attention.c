/*
 * Token-tree attention (ABI 1.8, loom_attention_args.parent), against an
 * independent construction: each row of a tree must give, bit for bit,
 * what a causal decode row gives over a cache that holds only the cached
 * prefix and the row's own ancestors, in order (what the sequence's cache
 * holds once that path is accepted and compacted). A tree that is a plain
 * chain (parent[i] = i - 1) must instead give the bits of the same call
 * without parents (backend.h: the causal rule exactly; the GPU kernels
 * plan such a sequence as a causal one, tiled from 8 rows, whose bits
 * differ from decode rows). Checked on one irregular tree with and
 * without a window, and on every tree of depth 1..8 and width 1..8 (a
 * root and `width` branches of `depth` nodes, breadth first), next to a
 * plain chunk in the same call; without a window also in step regions
 * (two layers' calls a region, three regions: captured and replayed on
 * the GPU backends), bit for bit as the direct call; a wrong parent
 * table must fail the comparison (the check can fail); and a parent
 * table that breaks the rule (a row's own or a later row, -2) is refused.
 *
 * Usage: backend_tree_attention [backend.so ...]
 * Without arguments: ref.so and cpu.so (exact and fast mode). Each named
 * backend runs in exact and fast mode (LOOM_BACKEND_EXACT and not); the
 * GPU emulators (gpuemu.so, gpuemu64.so) run through meson's
 * backend_tree_attention_gpuemu.
 */
#include "check/tb.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADS 4
#define KV_HEADS 2
#define HD 32
#define BS 16
#define PREFIX 21 /* cached tokens before the tree */
#define NODES 12  /* rows of the irregular tree (the last token and 11 drafts) */
#define MAX_NODES 65 /* the largest swept tree: a root, 8 branches of 8 */
#define MAX_BLOCKS 6 /* per sequence: PREFIX + MAX_NODES tokens */
#define CHUNK 3   /* a plain chunk in the same call */
#define KV_DIM (KV_HEADS * HD)
#define WIDTH (HEADS * HD)

static int failures;

/* The tree: row i's parent (row 0 the last token, parent -1). */
static const int32_t tree[NODES] = { -1, 0, 1, 1, 0, 4, 2, 6, 3, 5, 9, 0 };

struct cache {
	int32_t n_blocks;
	float *k, *v; /* [n_blocks * BS][KV_DIM] */
};

/* The arguments of one attention call on d (its buffers put there):
 * n_seqs sequences, rows q[rows][WIDTH]. */
static struct loom_attention_args attn_args(struct dev *d, const struct cache *c, const float *q,
					    int32_t n_seqs, const int32_t *q_start,
					    const int32_t *kv_len, const int32_t *table,
					    int32_t max_blocks, const int32_t *parent, int32_t window)
{
	int32_t rows = q_start[n_seqs];
	size_t cb = (size_t)c->n_blocks * BS * KV_DIM * sizeof(float);
	size_t ob = (size_t)rows * WIDTH * sizeof(float);
	struct loom_attention_args a = {
		.struct_size = sizeof(a), .out = dev_put(d, NULL, ob),
		.q = dev_put(d, q, ob), .q_stride = WIDTH, .out_stride = WIDTH,
		.kcache = dev_put(d, c->k, cb), .vcache = dev_put(d, c->v, cb),
		.n_seqs = n_seqs, .n_heads = HEADS, .n_kv_heads = KV_HEADS, .head_dim = HD,
		.block_size = BS, .max_blocks = max_blocks,
		.q_start = dev_put(d, q_start, sizeof(int32_t) * (size_t)(n_seqs + 1)),
		.kv_len = dev_put(d, kv_len, sizeof(int32_t) * (size_t)n_seqs),
		.block_table = dev_put(d, table, sizeof(int32_t) * (size_t)(n_seqs * max_blocks)),
		.scale = 1.0f / sqrtf((float)HD), .window = window,
		.parent = parent ? dev_put(d, parent, sizeof(int32_t) * (size_t)rows) : NULL,
	};

	return a;
}

/* One attention call on d, out[rows][WIDTH]. */
static int attend(struct dev *d, const struct cache *c, const float *q, int32_t n_seqs,
		  const int32_t *q_start, const int32_t *kv_len, const int32_t *table,
		  int32_t max_blocks, const int32_t *parent, int32_t window, float *out)
{
	struct loom_attention_args a = attn_args(d, c, q, n_seqs, q_start, kv_len, table,
						 max_blocks, parent, window);
	int rc = d->ops->attention(d->ctx, &a);

	if (!rc)
		rc = dev_get(d, out, a.out, sizeof(float) * (size_t)q_start[n_seqs] * WIDTH);
	dev_reset(d);
	return rc;
}

/* The same call twice (two layers of a step) in a step region, three
 * times over the same buffers (seen, captured, replayed where the
 * backend captures): rows that differ from want, in any output of any
 * round; -1 when a call failed. */
static int attend_in_regions(struct dev *d, const struct cache *c, const float *q,
			     const int32_t *q_start, const int32_t *kv_len, const int32_t *table,
			     const int32_t *parent, const float *want)
{
	const int32_t rows = q_start[2];
	const size_t ob = sizeof(float) * (size_t)rows * WIDTH;
	struct loom_attention_args a = attn_args(d, c, q, 2, q_start, kv_len, table, MAX_BLOCKS,
						 parent, 0);
	struct loom_attention_args b = a;
	float *got = tb_xmalloc(ob);
	int bad = 0;

	b.out = dev_put(d, NULL, ob);
	for (int round = 0; round < 3 && bad >= 0; round++) {
		int rc = d->ops->graph_begin(d->ctx);

		if (!rc) {
			d->ops->attention(d->ctx, &a); /* failures: from graph_end */
			d->ops->attention(d->ctx, &b);
			rc = d->ops->graph_end(d->ctx);
		}
		for (int k = 0; k < 2 && !rc; k++) {
			rc = dev_get(d, got, k ? b.out : a.out, ob);
			for (int32_t r = 0; r < rows && !rc; r++)
				bad += memcmp(got + (size_t)r * WIDTH, want + (size_t)r * WIDTH,
					      sizeof(float) * WIDTH) != 0;
		}
		if (rc)
			bad = -1;
	}
	dev_reset(d);
	free(got);
	return bad;
}

/* Row i's answer built by hand: a cache of the prefix and i's ancestors
 * (root first) in blocks 0.., one causal decode row over it. */
static int compacted_row(struct dev *d, const struct cache *c, const int32_t *table,
			 const float *q, const int32_t *parent, int32_t i, int32_t window,
			 float *out)
{
	int32_t chain[MAX_NODES], depth = 0, len, blocks[MAX_BLOCKS], q_start[2] = { 0, 1 };
	struct cache cc = { .n_blocks = MAX_BLOCKS };
	int rc;

	for (int32_t j = i; j >= 0; j = parent[j])
		chain[depth++] = j;
	len = PREFIX + depth;
	cc.k = tb_xmalloc((size_t)cc.n_blocks * BS * KV_DIM * sizeof(float));
	cc.v = tb_xmalloc((size_t)cc.n_blocks * BS * KV_DIM * sizeof(float));
	for (int32_t p = 0; p < len; p++) {
		/* source position: prefix p, else tree row chain[depth - 1 - (p - PREFIX)] */
		int32_t src = p < PREFIX ? p : PREFIX + chain[depth - 1 - (p - PREFIX)];
		size_t from = ((size_t)table[src / BS] * BS + (size_t)(src % BS)) * KV_DIM;

		memcpy(cc.k + (size_t)p * KV_DIM, c->k + from, KV_DIM * sizeof(float));
		memcpy(cc.v + (size_t)p * KV_DIM, c->v + from, KV_DIM * sizeof(float));
	}
	for (int32_t b = 0; b < MAX_BLOCKS; b++)
		blocks[b] = b;
	rc = attend(d, &cc, q + (size_t)i * WIDTH, 1, q_start, &len, blocks, cc.n_blocks, NULL,
		    window, out);
	free(cc.k);
	free(cc.v);
	return rc;
}

/* Whether parent[0 .. n) is the plain chain. */
static bool chain_shaped(const int32_t *parent, int32_t n)
{
	for (int32_t i = 0; i < n; i++)
		if (parent[i] != i - 1)
			return false;
	return true;
}

/* Runs the call with parent table `parent` for the tree of `nodes` rows
 * `truth` (and a plain chunk beside it) on d and compares every tree row
 * with compacted_row of truth (a chain: with the call made without
 * parents), bit for bit; the chunk with the call made without parents.
 * Returns the rows that differ (-1: a call failed). */
static int run_case(struct dev *d, const int32_t *parent, const int32_t *truth, int32_t nodes,
		    int32_t window)
{
	const int32_t n_tok = PREFIX + nodes, n_chunk = 40, rows = nodes + CHUNK;
	const size_t rb = sizeof(float) * WIDTH;
	int32_t table[2 * MAX_BLOCKS] = { 7, 2, 5, 12, 9, 10, 0, 8, 3, 1, 4, 6 };
	int32_t q_start[3] = { 0, nodes, rows }, kv_len[2] = { n_tok, n_chunk };
	int32_t par[MAX_NODES + CHUNK];
	struct cache c = { .n_blocks = 2 * MAX_BLOCKS + 1 };
	float *q = tb_xmalloc((size_t)rows * rb), *out = tb_xmalloc((size_t)rows * rb);
	float *plain = tb_xmalloc((size_t)rows * rb), one[WIDTH];
	bool chain = chain_shaped(truth, nodes);
	int bad = 0;

	tb_seed(11);
	c.k = tb_xmalloc((size_t)c.n_blocks * BS * KV_DIM * sizeof(float));
	c.v = tb_xmalloc((size_t)c.n_blocks * BS * KV_DIM * sizeof(float));
	tb_fill(c.k, (int64_t)c.n_blocks * BS * KV_DIM, 1.0f);
	tb_fill(c.v, (int64_t)c.n_blocks * BS * KV_DIM, 1.0f);
	tb_fill(q, (int64_t)rows * WIDTH, 4.0f);
	/* shuffled blocks: sequence 0 in 7, 2, 5, ...; sequence 1 in 0, 8, 3 */
	memcpy(par, parent, sizeof(int32_t) * (size_t)nodes);
	for (int32_t j = 0; j < CHUNK; j++)
		par[nodes + j] = j - 1;
	if (attend(d, &c, q, 2, q_start, kv_len, table, MAX_BLOCKS, par, window, out) ||
	    attend(d, &c, q, 2, q_start, kv_len, table, MAX_BLOCKS, NULL, window, plain)) {
		bad = -1;
		goto out_free;
	}
	for (int32_t i = 0; i < nodes; i++) {
		if (chain) {
			bad += memcmp(plain + (size_t)i * WIDTH, out + (size_t)i * WIDTH, rb) != 0;
			continue;
		}
		if (compacted_row(d, &c, table, q, truth, i, window, one)) {
			bad = -1;
			goto out_free;
		}
		bad += memcmp(one, out + (size_t)i * WIDTH, rb) != 0;
	}
	bad += memcmp(plain + (size_t)nodes * WIDTH, out + (size_t)nodes * WIDTH,
		      rb * CHUNK) != 0;
	/* in step regions (ABI 1.1) as by the direct call */
	if (window == 0 && d->ops->abi_minor >= 1 && d->ops->graph_begin) {
		int r = attend_in_regions(d, &c, q, q_start, kv_len, table, par, out);

		bad = r < 0 ? -1 : bad + r;
	}
out_free:
	free(c.k);
	free(c.v);
	free(q);
	free(out);
	free(plain);
	return bad;
}

/* The swept tree: a root, then level by level each of `width` branches'
 * next node (the node at level l of branch b hangs off level l - 1 of b).
 * Returns its rows. */
static int32_t sweep_tree(int32_t depth, int32_t width, int32_t *parent)
{
	parent[0] = -1;
	for (int32_t l = 1; l <= depth; l++)
		for (int32_t b = 0; b < width; b++)
			parent[1 + (l - 1) * width + b] = l == 1 ? 0 : 1 + (l - 2) * width + b;
	return 1 + depth * width;
}

/* Every tree of depth 1..8 and width 1..8, without a window and with one
 * of 5 (which cuts the deeper chains); returns the failed cases. */
static int sweep(struct dev *d, const char *label)
{
	int32_t parent[MAX_NODES];
	int failed = 0;

	for (int32_t depth = 1; depth <= 8; depth++)
		for (int32_t width = 1; width <= 8; width++)
			for (int32_t window = 0; window <= 5; window += 5) {
				int32_t n = sweep_tree(depth, width, parent);
				int bad = run_case(d, parent, parent, n, window);

				if (bad) {
					printf("FAIL %s depth %d width %d window %d: %d rows differ\n",
					       label, depth, width, window, bad);
					failed++;
				}
			}
	printf("%s %s: trees of depth 1..8, width 1..8, window 0 and 5: %d failed\n",
	       failed ? "FAIL" : "ok", label, failed);
	return failed;
}

/* A parent that is not -1 or an earlier row of its sequence (itself, a
 * later row, -2) is LOOM_ERR_INVALID, as a direct call. Returns the bad
 * tables accepted. */
static int bad_parents_accepted(struct dev *d)
{
	static const int32_t bad[][2] = { { 5, 5 }, { 3, 7 }, { 4, -2 }, { 0, 0 } };
	int32_t table[MAX_BLOCKS] = { 0, 1, 2, 3, 4, 5 }, q_start[2] = { 0, NODES };
	int32_t kv_len = PREFIX + NODES, par[NODES];
	struct cache c = { .n_blocks = MAX_BLOCKS };
	float *q = tb_xmalloc(sizeof(float) * NODES * WIDTH);
	float *out = tb_xmalloc(sizeof(float) * NODES * WIDTH);
	int accepted = 0;

	c.k = tb_xmalloc((size_t)c.n_blocks * BS * KV_DIM * sizeof(float));
	c.v = tb_xmalloc((size_t)c.n_blocks * BS * KV_DIM * sizeof(float));
	tb_fill(c.k, (int64_t)c.n_blocks * BS * KV_DIM, 1.0f);
	tb_fill(c.v, (int64_t)c.n_blocks * BS * KV_DIM, 1.0f);
	tb_fill(q, NODES * WIDTH, 1.0f);
	for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
		memcpy(par, tree, sizeof(par));
		par[bad[b][0]] = bad[b][1];
		accepted += attend(d, &c, q, 1, q_start, &kv_len, table, MAX_BLOCKS, par, 0, out) !=
			    LOOM_ERR_INVALID;
	}
	free(c.k);
	free(c.v);
	free(q);
	free(out);
	return accepted;
}

static void check_backend(const char *name, uint32_t flags, const char *label)
{
	struct dev d;
	char err[512];
	int32_t wrong[NODES];

	if (dev_open_flags(&d, name, 1, flags, err, sizeof(err))) {
		printf("FAIL %s: %s\n", label, err);
		failures++;
		return;
	}
	if (d.ops->abi_minor < 8 || !d.ops->supports(d.ctx, LOOM_OP_ATTENTION_TREE, LOOM_TYPE_F32)) {
		printf("FAIL %s: no token-tree attention\n", label);
		failures++;
		dev_close(&d);
		return;
	}
	for (int32_t window = 0; window <= 9; window += 9) {
		int bad = run_case(&d, tree, tree, NODES, window);

		printf("%s %s window %d: %d rows differ from the compacted path\n",
		       bad ? "FAIL" : "ok", label, window, bad);
		failures += bad != 0;
	}
	/* a wrong ancestor mask: row 7 hangs off the root instead of row 6 */
	memcpy(wrong, tree, sizeof(wrong));
	wrong[7] = 0;
	if (run_case(&d, wrong, tree, NODES, 0) <= 0) {
		printf("FAIL %s: a wrong parent table went unnoticed\n", label);
		failures++;
	} else {
		printf("ok %s: a wrong parent table differs\n", label);
	}
	if (bad_parents_accepted(&d)) {
		printf("FAIL %s: a parent table with a row's own, a later or -2 parent accepted\n",
		       label);
		failures++;
	} else {
		printf("ok %s: bad parent tables refused\n", label);
	}
	failures += sweep(&d, label) != 0;
	dev_close(&d);
}

int main(int argc, char **argv)
{
	char label[256];

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2) {
		check_backend("ref.so", 0, "ref.so");
		check_backend("cpu.so", LOOM_BACKEND_EXACT, "cpu.so exact");
		check_backend("cpu.so", 0, "cpu.so fast");
	}
	for (int i = 1; i < argc; i++) {
		snprintf(label, sizeof(label), "%s exact", argv[i]);
		check_backend(argv[i], LOOM_BACKEND_EXACT, label);
		snprintf(label, sizeof(label), "%s fast", argv[i]);
		check_backend(argv[i], 0, label);
	}
	return failures ? 1 : 0;
}
