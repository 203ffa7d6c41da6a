/*
 * cpu.so's grouped attention kernels against its one-head, one-row code
 * (LOOM_CPU_ATTN_GROUP=0), bit for bit: the AVX-512 kernels (the query
 * heads of one KV head share each cache row, the scores of 16 keys
 * reduced at once) against the AVX2 one-row kernel in exact mode and
 * against the one-row kernel on the AVX-512 set in fast mode (the same
 * exponentials), and the AVX2 ones (the same with 8 keys, hsum8()) in
 * exact and fast mode (fast mode also splits long decode rows into
 * parts; a part's head groups walk it together, on either set held
 * to a walk per group, LOOM_CPU_ATTN_WALK=0). Every output of prefill
 * chunks, decode rows and rows with history, over f32 and f16 caches,
 * group sizes 1 to 4, head sizes 32 to 256, key counts that fill no 8-
 * or 16-key block, one and several, with and without a window and a
 * soft cap; and the
 * many-row kernels (consecutive causal rows of a prefill chunk or a
 * verification run sharing each cache row) over runs of 1 to 17 rows
 * after several histories, every shape, cache type, window and soft cap
 * (rows_sweep()): their outputs must be the one-row kernel's, so a row
 * that sees a key past its own position, or misses one, fails here. A
 * change in the order of any addition of a score changes bits here.
 *
 * Usage: backend_attn_group. Skips (exit 77) on a CPU without AVX2.
 */
#include "check/tb.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BS 16

struct shape {
	int32_t heads, kv_heads, hd;
};

struct call {
	int32_t n_seqs, q_start[4], kv_len[3], max_blocks, window;
	float softcap;
	uint32_t kv_type;
	int32_t inf_at; /* > 0: sequence 0's V row at this position all +inf */
};

static uint16_t f16_bits(float x)
{
	_Float16 h = (_Float16)x;
	uint16_t b;

	memcpy(&b, &h, 2);
	return b;
}

/* One attention call of shape sh on d over caches k, v (as kv_type) with
 * blocks in table; out gets rows x heads x hd floats. */
static int attend(struct dev *d, const struct shape *sh, const struct call *c, const void *k,
		  const void *v, size_t cache_bytes, const int32_t *table, const float *q,
		  float *out)
{
	const int32_t rows = c->q_start[c->n_seqs], width = sh->heads * sh->hd;
	const size_t ob = sizeof(float) * (size_t)rows * (size_t)width;
	struct loom_attention_args a = {
		.struct_size = sizeof(a), .out = dev_put(d, NULL, ob),
		.q = dev_put(d, q, ob), .q_stride = width, .out_stride = width,
		.kcache = dev_put(d, k, cache_bytes), .vcache = dev_put(d, v, cache_bytes),
		.n_seqs = c->n_seqs, .n_heads = sh->heads, .n_kv_heads = sh->kv_heads,
		.head_dim = sh->hd, .block_size = BS, .max_blocks = c->max_blocks,
		.q_start = dev_put(d, c->q_start, sizeof(int32_t) * (size_t)(c->n_seqs + 1)),
		.kv_len = dev_put(d, c->kv_len, sizeof(int32_t) * (size_t)c->n_seqs),
		.block_table = dev_put(d, table, sizeof(int32_t) * (size_t)(c->n_seqs * c->max_blocks)),
		.scale = 1.0f / sqrtf((float)sh->hd), .softcap = c->softcap, .window = c->window,
		.kv_type = c->kv_type,
	};
	int rc = d->ops->attention(d->ctx, &a);

	if (!rc)
		rc = dev_get(d, out, a.out, ob);
	dev_reset(d);
	return rc;
}

/* The call on both devices: rows whose outputs differ (-1: a call failed). */
static int compare(struct dev *grouped, struct dev *single, const struct shape *sh,
		   const struct call *c)
{
	const int32_t rows = c->q_start[c->n_seqs], width = sh->heads * sh->hd;
	const int32_t kv_dim = sh->kv_heads * sh->hd, n_blocks = c->n_seqs * c->max_blocks;
	const size_t n_vals = (size_t)n_blocks * BS * (size_t)kv_dim;
	const size_t es = c->kv_type == LOOM_TYPE_F16 ? 2 : 4, rb = sizeof(float) * (size_t)width;
	float *k = tb_xmalloc(n_vals * sizeof(float)), *v = tb_xmalloc(n_vals * sizeof(float));
	float *q = tb_xmalloc((size_t)rows * rb), *want = tb_xmalloc((size_t)rows * rb);
	float *got = tb_xmalloc((size_t)rows * rb);
	int32_t *table = tb_xmalloc(sizeof(int32_t) * (size_t)n_blocks);
	int bad = 0;

	tb_fill(k, (int64_t)n_vals, 1.0f);
	tb_fill(v, (int64_t)n_vals, 1.0f);
	tb_fill(q, (int64_t)rows * width, 3.0f);
	for (int32_t b = 0; b < n_blocks; b++) /* blocks out of order */
		table[b] = (b * 7 + 3) % n_blocks;
	if (c->inf_at > 0) { /* only the rows that see it may be other than finite */
		const int32_t t = c->inf_at, blk = table[t / BS];

		for (int32_t i = 0; i < kv_dim; i++)
			v[((size_t)blk * BS + (size_t)(t % BS)) * (size_t)kv_dim + (size_t)i] = INFINITY;
	}
	if (es == 2) { /* the f16 cache in place of the f32 one */
		uint16_t *hk = (uint16_t *)k, *hv = (uint16_t *)v;

		for (size_t i = 0; i < n_vals; i++) {
			hk[i] = f16_bits(k[i]);
			hv[i] = f16_bits(v[i]);
		}
	}
	if (attend(grouped, sh, c, k, v, n_vals * es, table, q, got) ||
	    attend(single, sh, c, k, v, n_vals * es, table, q, want)) {
		bad = -1;
	} else {
		for (int32_t r = 0; r < rows; r++)
			bad += memcmp(got + (size_t)r * width, want + (size_t)r * width, rb) != 0;
	}
	free(k), free(v), free(q), free(want), free(got), free(table);
	return bad;
}

/*
 * The many-row kernel (runs of causal rows of one sequence sharing each
 * cache row): a chunk of 1 to 17 rows after 0, 23 or 300 positions of
 * history, beside a sequence of 2 to 6 verification-like rows, over every
 * shape, cache type, window and soft cap; after 23 positions the V row
 * of the chunk's second position is +inf, so that its first row, which
 * must not see it, gets NaN if it adds that key even with a zero weight
 * (every run of rows starts on a row whose next is there or after it).
 * Returns the cases that differ.
 */
static int rows_sweep(struct dev *grouped, struct dev *single, const struct shape *shapes,
		      int *cases)
{
	static const int32_t history[] = { 0, 23, 300 };
	int failures = 0;

	for (int s = 0; s < 6; s++)
		for (int32_t rows = 1; rows <= 17; rows++)
			for (size_t h = 0; h < sizeof(history) / sizeof(history[0]); h++)
				for (int variant = 0; variant < 8; variant++, (*cases)++) {
					const int32_t extra = rows % 5 + 2;
					struct call c = {
						2, { 0, rows, rows + extra }, { rows + history[h], 41 },
						(317 + BS - 1) / BS, variant & 2 ? 20 : 0,
						variant & 4 ? 3.0f : 0.0f,
						variant & 1 ? LOOM_TYPE_F16 : LOOM_TYPE_F32,
						history[h] == 23 ? 24 : 0,
					};
					int bad = compare(grouped, single, &shapes[s], &c);

					if (bad) {
						printf("FAIL heads %d/%d hd %d: %d rows after %d, %s window %d softcap %g: %d rows differ\n",
						       shapes[s].heads, shapes[s].kv_heads, shapes[s].hd,
						       rows, history[h], variant & 1 ? "f16" : "f32",
						       c.window, c.softcap, bad);
						failures++;
					}
				}
	return failures;
}

/* Every shape x call x variant (cache type, a window of `window`
 * positions, a soft cap) on devices a and b: the cases that differ, each
 * reported with `what`. */
static int calls_sweep(struct dev *a, struct dev *b, const struct shape *shapes, size_t n_shapes,
		       const struct call *calls, size_t n_calls, int32_t window, const char *what,
		       int *cases)
{
	int failures = 0;

	for (size_t s = 0; s < n_shapes; s++)
		for (size_t c = 0; c < n_calls; c++)
			for (int variant = 0; variant < 8; variant++, (*cases)++) {
				struct call call = calls[c];
				int bad;

				call.kv_type = variant & 1 ? LOOM_TYPE_F16 : LOOM_TYPE_F32;
				call.window = variant & 2 ? window : 0;
				call.softcap = variant & 4 ? 3.0f : 0.0f;
				bad = compare(a, b, &shapes[s], &call);
				if (bad) {
					printf("FAIL %s: heads %d/%d hd %d call %zu %s window %d softcap %g: %d rows differ\n",
					       what, shapes[s].heads, shapes[s].kv_heads, shapes[s].hd, c,
					       variant & 1 ? "f16" : "f32", call.window, call.softcap, bad);
					failures++;
				}
			}
	return failures;
}

/* Opens cpu.so with LOOM_CPU_ISA=isa (NULL: unset) and the grouped
 * kernels on or off. */
static int open_cpu(struct dev *d, const char *isa, bool group, unsigned flags)
{
	char err[512];

	setenv("LOOM_CPU_ATTN_WALK", "1", 1);
	if (isa)
		setenv("LOOM_CPU_ISA", isa, 1);
	else
		unsetenv("LOOM_CPU_ISA");
	setenv("LOOM_CPU_ATTN_GROUP", group ? "1" : "0", 1);
	if (dev_open_flags(d, "cpu.so", 1, flags, err, sizeof(err))) {
		printf("FAIL cpu.so (LOOM_CPU_ISA=%s, grouped %d): %s\n", isa ? isa : "", group, err);
		return 1;
	}
	return 0;
}

/* Every case with one kernel set's grouped kernels against the one-row
 * kernel: the cases that differ. */
static int sweep(const char *isa, const char *one_isa, unsigned flags, const char *what,
		 int *cases)
{
	static const struct shape shapes[] = {
		{ 4, 1, 64 }, { 9, 3, 64 }, { 6, 3, 128 }, { 4, 4, 32 }, { 8, 2, 256 }, { 6, 2, 48 },
	};
	/* a prefill chunk and a decode row; a chunk after history and a
	 * decode row past 16 blocks (fast mode: in parts); one key and 17
	 * keys */
	static const struct call calls[] = {
		{ 2, { 0, 37, 38 }, { 37, 70 }, 5, 0, 0.0f, 0, 0 },
		{ 2, { 0, 5, 6 }, { 300, 600 }, 38, 0, 0.0f, 0, 0 },
		{ 3, { 0, 1, 18, 19 }, { 1, 17, 16 }, 2, 0, 0.0f, 0, 0 },
	};
	struct dev grouped, single;
	int failures = 0, n0 = *cases;

	if (open_cpu(&grouped, isa, true, flags))
		return 1;
	if (open_cpu(&single, one_isa, false, flags)) {
		dev_close(&grouped);
		return 1;
	}
	tb_seed(5);
	failures += calls_sweep(&grouped, &single, shapes, sizeof(shapes) / sizeof(shapes[0]), calls,
				sizeof(calls) / sizeof(calls[0]), 20, what, cases);
	failures += rows_sweep(&grouped, &single, shapes, cases);
	printf("%s: %s: %d cases, %d differ from the one-head kernel\n", failures ? "FAIL" : "ok",
	       what, *cases - n0, failures);
	dev_close(&grouped);
	dev_close(&single);
	return failures;
}

/*
 * One kernel set (LOOM_CPU_ISA=isa, NULL: the host's), fast mode: split
 * decode rows with every head group of a part walking its positions at
 * once (part_groups()) against a walk per group (LOOM_CPU_ATTN_WALK=0),
 * bit for bit: decode rows of 600-1100 positions (2-4 parts), beside a
 * prefill chunk, every shape, cache type, a window and a soft cap.
 * Returns the cases that differ.
 */
static int walk_sweep(const char *isa, const char *what, int *cases)
{
	static const struct shape shapes[] = {
		{ 4, 1, 64 }, { 9, 3, 64 }, { 6, 3, 128 }, { 8, 2, 256 }, { 6, 2, 48 },
		{ 32, 8, 64 }, { 16, 16, 32 }, { 12, 3, 72 },
	};
	static const struct call calls[] = {
		{ 2, { 0, 1, 2 }, { 1100, 777 }, 70, 0, 0.0f, 0, 0 },
		{ 3, { 0, 20, 21, 22 }, { 300, 600, 530 }, 38, 0, 0.0f, 0, 0 },
	};
	struct dev walk, groups;
	int failures = 0, n0 = *cases;
	char err[512];

	if (open_cpu(&walk, isa, true, 0))
		return 1;
	setenv("LOOM_CPU_ATTN_WALK", "0", 1);
	if (dev_open_flags(&groups, "cpu.so", 1, 0, err, sizeof(err))) {
		printf("FAIL cpu.so with LOOM_CPU_ATTN_WALK=0: %s\n", err);
		dev_close(&walk);
		return 1;
	}
	setenv("LOOM_CPU_ATTN_WALK", "1", 1);
	tb_seed(9);
	failures = calls_sweep(&walk, &groups, shapes, sizeof(shapes) / sizeof(shapes[0]), calls,
			       sizeof(calls) / sizeof(calls[0]), 530, "part walk", cases);
	printf("%s: %s, fast, split parts: %d cases, %d differ from a walk per group\n",
	       failures ? "FAIL" : "ok", what, *cases - n0, failures);
	dev_close(&walk);
	dev_close(&groups);
	return failures;
}

int main(void)
{
	int failures = 0, cases = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
	    !__builtin_cpu_supports("f16c")) {
		printf("SKIP: no AVX2 here, so cpu.so has no grouped attention kernel\n");
		return 77;
	}
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl"))
		failures += sweep(NULL, "avx2", LOOM_BACKEND_EXACT, "AVX-512, exact", &cases),
		failures += sweep(NULL, NULL, 0, "AVX-512, fast", &cases),
		failures += walk_sweep(NULL, "AVX-512", &cases);
	else
		printf("SKIP: no AVX-512 here: its grouped kernels are not run\n");
	failures += sweep("avx2", "avx2", LOOM_BACKEND_EXACT, "AVX2, exact", &cases);
	failures += sweep("avx2", "avx2", 0, "AVX2, fast", &cases);
	failures += walk_sweep("avx2", "AVX2", &cases);
	return failures ? 1 : 0;
}
