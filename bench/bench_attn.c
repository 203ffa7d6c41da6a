/*
 * bench_attn: cpu.so's attention on one causal prefill.
 *
 * Usage: bench_attn [path/to/cpu.so] [rows] [threads] [repeats] [decode|prefill]
 *                   [HEADSxKV_HEADSxHEAD_DIM]
 *
 * Loads cpu.so through its ABI entry, like the host does, and times one
 * attention call of `rows` query rows (default 2048) over as many cached
 * positions, SmolLM2-135M's layer shape (9 query heads, 3 KV heads,
 * head_dim 64, f16 cache in 16-position blocks), in fast mode; the best
 * of `repeats` calls (default 5). Reports the time and nanoseconds per
 * (key, query head) pair: rows * (rows + 1) / 2 * 9 of them. With
 * `decode`, one query row at the last of `rows` positions instead (a
 * decode step at that depth: rows * 9 pairs). Set LOOM_CPU_ATTN_GROUP=0
 * to time the one-head, one-row kernel. A sixth argument gives another
 * layer shape, e.g. 32x8x128 for a Llama-3-8B layer or 4x1x256 for
 * Gemma 3 270M's (the scale is then 1 / sqrt(head_dim)).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "bench_backend.h"

#ifndef CPU_SO_PATH
#define CPU_SO_PATH "cpu.so"
#endif

enum { BLOCK = 16 };

static void host_log(void *host, enum loom_log_level level, const char *msg)
{
	(void)host;
	if (level >= LOOM_LOG_WARN)
		fprintf(stderr, "%s\n", msg);
}

/* A buffer of n bytes on the backend, its address in *addr. */
static struct loom_buffer *alloc(const struct loom_backend_ops *ops,
				 struct loom_backend_ctx *ctx, size_t n, void **addr)
{
	struct loom_buffer *b;

	if (ops->buffer_alloc(ctx, n, &b)) {
		fprintf(stderr, "bench_attn: cannot allocate %zu bytes\n", n);
		exit(1);
	}
	*addr = ops->buffer_addr(ctx, b);
	return b;
}

/* Deterministic values in [-0.5, 0.5): the k cache and v cache as f16,
 * the queries as f32. */
static void fill(uint16_t *k, uint16_t *v, size_t n_kv, float *q, size_t n_q)
{
	for (size_t i = 0; i < n_kv; i++) {
		_Float16 a = (_Float16)((float)(i * 2654435761u % 1000) / 1000.0f - 0.5f);
		_Float16 b = (_Float16)((float)(i * 40503u % 997) / 997.0f - 0.5f);

		memcpy(&k[i], &a, 2);
		memcpy(&v[i], &b, 2);
	}
	for (size_t i = 0; i < n_q; i++)
		q[i] = (float)(i * 7919u % 1013) / 1013.0f - 0.5f;
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : CPU_SO_PATH;
	const int rows = argc > 2 ? atoi(argv[2]) : 2048, threads = argc > 3 ? atoi(argv[3]) : 1;
	const int reps = argc > 4 ? atoi(argv[4]) : 5;
	const bool decode = argc > 5 && !strcmp(argv[5], "decode");
	int heads = 9, kv_heads = 3, head_dim = 64;

	if (argc > 6 && (sscanf(argv[6], "%dx%dx%d", &heads, &kv_heads, &head_dim) != 3 ||
			 heads < 1 || kv_heads < 1 || heads % kv_heads || head_dim < 1 ||
			 head_dim > 512 || head_dim % 8)) {
		fprintf(stderr, "bench_attn: shape %s is not HEADSxKV_HEADSxHEAD_DIM\n", argv[6]);
		return 2;
	}
	const int q_rows = decode ? 1 : rows;
	const int blocks = (rows + BLOCK - 1) / BLOCK;
	const size_t n_kv = (size_t)blocks * BLOCK * kv_heads * head_dim;
	const size_t n_q = (size_t)q_rows * heads * head_dim;
	struct loom_backend_host host = {
		.abi_major = LOOM_BACKEND_ABI_MAJOR, .struct_size = sizeof(host),
		.log = host_log,
	};
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg), .n_threads = threads };
	const struct loom_backend_ops *ops;
	struct loom_backend_ctx *ctx;
	void *k, *v, *q, *out, *qs, *kl, *table;
	struct loom_buffer *bufs[7];
	double best = 1e30;

	if (rows < 1 || rows > 1 << 20 || threads < 1 || reps < 1) {
		fprintf(stderr, "usage: bench_attn [cpu.so] [rows 1..1048576] [threads] [repeats] "
				"[decode|prefill] [HEADSxKV_HEADSxHEAD_DIM]\n");
		return 2;
	}
	ops = bench_open("bench_attn", path);
	if (ops->create(&host, &cfg, &ctx)) {
		fprintf(stderr, "bench_attn: create failed\n");
		return 1;
	}
	bufs[0] = alloc(ops, ctx, n_kv * 2, &k);
	bufs[1] = alloc(ops, ctx, n_kv * 2, &v);
	bufs[2] = alloc(ops, ctx, n_q * sizeof(float), &q);
	bufs[3] = alloc(ops, ctx, n_q * sizeof(float), &out);
	bufs[4] = alloc(ops, ctx, 2 * sizeof(int32_t), &qs);
	bufs[5] = alloc(ops, ctx, sizeof(int32_t), &kl);
	bufs[6] = alloc(ops, ctx, (size_t)blocks * sizeof(int32_t), &table);
	fill(k, v, n_kv, q, n_q);
	((int32_t *)qs)[0] = 0, ((int32_t *)qs)[1] = q_rows;
	((int32_t *)kl)[0] = rows;
	for (int b = 0; b < blocks; b++)
		((int32_t *)table)[b] = b;
	for (int r = 0; r < reps; r++) {
		struct loom_attention_args a = {
			.struct_size = sizeof(a), .out = out, .q = q,
			.q_stride = heads * head_dim, .out_stride = heads * head_dim,
			.kcache = k, .vcache = v, .n_seqs = 1, .n_heads = heads,
			.n_kv_heads = kv_heads, .head_dim = head_dim, .block_size = BLOCK,
			.max_blocks = blocks, .q_start = qs, .kv_len = kl, .block_table = table,
			.scale = 1.0f / sqrtf((float)head_dim), .kv_type = LOOM_TYPE_F16,
		};
		double t0 = bench_now();
		int rc = ops->attention(ctx, &a);
		double t = bench_now() - t0;

		if (rc) {
			fprintf(stderr, "bench_attn: attention failed (%d)\n", rc);
			return 1;
		}
		best = t < best ? t : best;
	}
	printf("%dx%dx%d, %s %d, threads %d: %.3f ms, %.2f ns per (key, query head)\n",
	       heads, kv_heads, head_dim, decode ? "decode at" : "rows", rows, threads, best * 1e3,
	       best * 1e9 / (decode ? (double)rows * heads : (double)rows * (rows + 1) / 2 * heads));
	for (int i = 0; i < 7; i++)
		ops->buffer_free(ctx, bufs[i]);
	ops->destroy(ctx);
	return 0;
}
