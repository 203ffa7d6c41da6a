/*
 * Token-tree attention (ABI 1.8, loom_attention_args.parent), against an
 * independent construction: each row of a tree must give, bit for bit,
 * what a causal decode row gives over a cache that holds only the cached
 * prefix and the row's own ancestors, in order (what the sequence's cache
 * holds once that path is accepted and compacted). Checked on ref.so and
 * cpu.so (exact and fast mode), with and without a window, next to a
 * plain chunk in the same call; and a wrong parent table must fail the
 * comparison (the check can fail).
 *
 * Usage: backend_tree_attention
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
#define NODES 12  /* tree rows (the last token and 11 drafts) */
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

/* One attention call on d: n_seqs sequences, rows q[rows][WIDTH]. */
static int attend(struct dev *d, const struct cache *c, const float *q, int32_t n_seqs,
		  const int32_t *q_start, const int32_t *kv_len, const int32_t *table,
		  int32_t max_blocks, const int32_t *parent, int32_t window, float *out)
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
	int rc = d->ops->attention(d->ctx, &a);

	if (!rc)
		rc = dev_get(d, out, a.out, ob);
	dev_reset(d);
	return rc;
}

/* Row i's answer built by hand: a cache of the prefix and i's ancestors
 * (root first) in blocks 0.., one causal decode row over it. */
static int compacted_row(struct dev *d, const struct cache *c, const int32_t *table,
			 const float *q, const int32_t *parent, int32_t i, int32_t window,
			 float *out)
{
	int32_t chain[NODES], depth = 0, len, blocks[8], q_start[2] = { 0, 1 };
	struct cache cc = { .n_blocks = 4 };
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
	for (int32_t b = 0; b < 8; b++)
		blocks[b] = b < cc.n_blocks ? b : 0;
	rc = attend(d, &cc, q + (size_t)i * WIDTH, 1, q_start, &len, blocks, cc.n_blocks, NULL,
		    window, out);
	free(cc.k);
	free(cc.v);
	return rc;
}

/* Runs the tree (and a plain chunk beside it) on d and compares every
 * tree row with compacted_row, bit for bit; the chunk with the same call
 * made without parents. Returns the rows that differ (-1: a call failed). */
static int run_case(struct dev *d, const int32_t *parent, int32_t window)
{
	const int32_t n_tok = PREFIX + NODES, n_chunk = 40;
	int32_t table[2 * 4], q_start[3] = { 0, NODES, NODES + CHUNK };
	int32_t kv_len[2] = { n_tok, n_chunk }, par[NODES + CHUNK];
	struct cache c = { .n_blocks = 9 };
	float q[(NODES + CHUNK) * WIDTH], out[(NODES + CHUNK) * WIDTH], plain[(NODES + CHUNK) * WIDTH];
	float one[WIDTH];
	int bad = 0;

	tb_seed(11);
	c.k = tb_xmalloc((size_t)c.n_blocks * BS * KV_DIM * sizeof(float));
	c.v = tb_xmalloc((size_t)c.n_blocks * BS * KV_DIM * sizeof(float));
	tb_fill(c.k, (int64_t)c.n_blocks * BS * KV_DIM, 1.0f);
	tb_fill(c.v, (int64_t)c.n_blocks * BS * KV_DIM, 1.0f);
	tb_fill(q, (NODES + CHUNK) * WIDTH, 4.0f);
	/* shuffled blocks: sequence 0 in 7, 2, 5; sequence 1 in 0, 8, 3 */
	table[0] = 7, table[1] = 2, table[2] = 5, table[3] = 1;
	table[4] = 0, table[5] = 8, table[6] = 3, table[7] = 6;
	memcpy(par, parent, sizeof(int32_t) * NODES);
	for (int32_t j = 0; j < CHUNK; j++)
		par[NODES + j] = j - 1;
	if (attend(d, &c, q, 2, q_start, kv_len, table, 4, par, window, out) ||
	    attend(d, &c, q, 2, q_start, kv_len, table, 4, NULL, window, plain)) {
		bad = -1;
		goto out_free;
	}
	for (int32_t i = 0; i < NODES; i++) {
		if (compacted_row(d, &c, table, q, tree, i, window, one)) {
			bad = -1;
			goto out_free;
		}
		bad += memcmp(one, out + (size_t)i * WIDTH, sizeof(one)) != 0;
	}
	bad += memcmp(plain + NODES * WIDTH, out + NODES * WIDTH,
		      sizeof(float) * CHUNK * WIDTH) != 0;
out_free:
	free(c.k);
	free(c.v);
	return bad;
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
		int bad = run_case(&d, tree, window);

		printf("%s %s window %d: %d rows differ from the compacted path\n",
		       bad ? "FAIL" : "ok", label, window, bad);
		failures += bad != 0;
	}
	/* a wrong ancestor mask: row 7 hangs off the root instead of row 6 */
	memcpy(wrong, tree, sizeof(wrong));
	wrong[7] = 0;
	if (run_case(&d, wrong, 0) <= 0) {
		printf("FAIL %s: a wrong parent table went unnoticed\n", label);
		failures++;
	} else {
		printf("ok %s: a wrong parent table differs\n", label);
	}
	dev_close(&d);
}

int main(void)
{
	check_backend("ref.so", 0, "ref.so");
	check_backend("cpu.so", LOOM_BACKEND_EXACT, "cpu.so exact");
	check_backend("cpu.so", 0, "cpu.so fast");
	return failures ? 1 : 0;
}
