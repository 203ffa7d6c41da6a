/*
 * bench_gemm: weight bandwidth of cpu.so's GEMV (decode) path.
 *
 * Usage: bench_gemm [path/to/cpu.so] [seconds per case] [cold|hot] [type] [m]
 *
 * With a type name (q8_0, q5_0, ...) only that format's shapes run. With m
 * (default 1) the calls take m activation rows, as a prefill does (m >= 16
 * runs the fast mode's prefill GEMM), and the line adds products a second.
 *
 * Loads cpu.so through its ABI entry, like the host does, and times
 * y = x . W^T for one activation row on SmolLM2-135M shapes in Q4_1, Q8_0,
 * the K-quants and F32 (what a K-quant tensor streamed when the core had to
 * convert it) at 1 and 2 threads. Reports GB/s of weight bytes streamed.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_backend.h"

#ifndef CPU_SO_PATH
#define CPU_SO_PATH "cpu.so"
#endif

struct shape {
	const char *what;
	int64_t k, n; /* W is [n][k] */
	uint32_t type;
};

static void host_log(void *host, enum loom_log_level level, const char *msg)
{
	if (level >= LOOM_LOG_INFO)
		fprintf(stderr, "%s\n", msg);
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)rng;
}

/* Block geometry and where the f16 scales sit (-1: none). */
static const struct format {
	uint32_t type;
	const char *name;
	int elems, bytes, d_off[2];
} formats[] = {
	{ LOOM_TYPE_F32, "f32", 1, 4, { -1, -1 } },
	{ LOOM_TYPE_Q8_0, "q8_0", 32, 34, { 0, -1 } },
	{ LOOM_TYPE_Q4_0, "q4_0", 32, 18, { 0, -1 } },
	{ LOOM_TYPE_Q4_1, "q4_1", 32, 20, { 0, 2 } },
	{ LOOM_TYPE_Q5_0, "q5_0", 32, 22, { 0, -1 } },
	{ LOOM_TYPE_Q2_K, "q2_K", 256, 84, { 80, 82 } },
	{ LOOM_TYPE_Q3_K, "q3_K", 256, 110, { 108, -1 } },
	{ LOOM_TYPE_Q4_K, "q4_K", 256, 144, { 0, 2 } },
	{ LOOM_TYPE_Q5_K, "q5_K", 256, 176, { 0, 2 } },
	{ LOOM_TYPE_Q6_K, "q6_K", 256, 210, { 208, -1 } },
};

static const struct format *format_of(uint32_t type)
{
	for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
		if (formats[i].type == type)
			return &formats[i];
	return &formats[0];
}

/* Random rows whose scales are small normal halves (f32: small floats). */
static void fill_weights(uint8_t *w, size_t bytes, const struct format *f)
{
	for (size_t i = 0; i < bytes; i++)
		w[i] = (uint8_t)rnd();
	if (f->type == LOOM_TYPE_F32) {
		for (size_t i = 0; i + 4 <= bytes; i += 4) {
			float v = (float)(rnd() % 2001) / 1000.0f - 1.0f;

			memcpy(w + i, &v, 4);
		}
		return;
	}
	for (size_t b = 0; b + f->bytes <= bytes; b += f->bytes) {
		for (int h = 0; h < 2; h++) {
			uint16_t d = 0x2000 | (rnd() & 0x3ff); /* about 0.008 */

			if (f->d_off[h] >= 0)
				memcpy(w + b + f->d_off[h], &d, 2);
		}
	}
}

/* Copies of the weight rotated through in cold mode: more bytes than any
 * cache holds, so every call streams its weight from memory, as decode
 * does (a step's weights are far larger than the cache). */
#define COLD_BYTES ((size_t)256 << 20)
#define MAX_COPIES 4096

/* With `packed`, the weight goes through weight_pack first (1 if the
 * backend keeps this format as it is: nothing to time). GB/s counts the
 * GGUF bytes either way. With `cold`, many copies are rotated through. */
static int bench_one(const struct loom_backend_ops *ops, struct loom_backend_ctx *ctx,
		     const struct shape *s, int threads, double secs, bool packed, bool cold,
		     int64_t m)
{
	static struct loom_buffer *copies[MAX_COPIES];
	static const void *addr[MAX_COPIES];
	int n_copies = 1;
	struct loom_buffer *bp = NULL;
	size_t pbytes;
	const struct format *f = format_of(s->type);
	size_t row = (size_t)(s->k / f->elems) * f->bytes;
	size_t wbytes = row * (size_t)s->n;
	struct loom_buffer *bw, *bx, *by;
	struct loom_gemm_args a;
	double t0, t;
	long iters = 0;
	float *x;
	int rc;

	if (ops->buffer_alloc(ctx, wbytes, &bw))
		return -1;
	if (ops->buffer_alloc(ctx, (size_t)(m * s->k) * 4, &bx)) {
		ops->buffer_free(ctx, bw);
		return -1;
	}
	if (ops->buffer_alloc(ctx, (size_t)(m * s->n) * 4, &by)) {
		ops->buffer_free(ctx, bw);
		ops->buffer_free(ctx, bx);
		return -1;
	}
	fill_weights(ops->buffer_addr(ctx, bw), wbytes, f);
	x = ops->buffer_addr(ctx, bx);
	for (int64_t i = 0; i < m * s->k; i++)
		x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
	a = (struct loom_gemm_args){
		.struct_size = sizeof(a), .w_type = s->type, .m = m, .n = s->n, .k = s->k,
		.w = ops->buffer_addr(ctx, bw), .w_stride = row, .x = x, .x_stride = s->k,
		.y = ops->buffer_addr(ctx, by), .y_stride = s->n,
	};
	if (packed) {
		struct loom_weight_pack_args pa = { .struct_size = sizeof(pa), .type = s->type,
			.n = s->n, .k = s->k, .src = a.w, .src_stride = row };

		if (ops->struct_size < offsetof(struct loom_backend_ops, weight_pack) + sizeof(void *) ||
		    !ops->weight_pack || ops->weight_pack(ctx, &pa, &bp, &pbytes)) {
			ops->buffer_free(ctx, bw);
			ops->buffer_free(ctx, bx);
			ops->buffer_free(ctx, by);
			return 1;
		}
		a.w = ops->buffer_addr(ctx, bp);
		a.w_packed = 1;
	}
	addr[0] = a.w;
	if (cold) {
		struct loom_weight_pack_args pa = { .struct_size = sizeof(pa), .type = s->type,
			.n = s->n, .k = s->k, .src = ops->buffer_addr(ctx, bw), .src_stride = row };

		n_copies = (int)(COLD_BYTES / wbytes) + 1;
		n_copies = n_copies > MAX_COPIES ? MAX_COPIES : n_copies;
		for (int c = 1; c < n_copies; c++) {
			if (packed ? ops->weight_pack(ctx, &pa, &copies[c], &pbytes) :
				     ops->buffer_alloc(ctx, wbytes, &copies[c])) {
				n_copies = c;
				break;
			}
			if (!packed)
				memcpy(ops->buffer_addr(ctx, copies[c]), ops->buffer_addr(ctx, bw),
				       wbytes);
			addr[c] = ops->buffer_addr(ctx, copies[c]);
		}
	}
	for (int i = 0; i < 3; i++)
		rc = ops->gemm(ctx, &a);
	if (rc) {
		fprintf(stderr, "gemm failed: %d\n", rc);
		return -1;
	}
	t0 = bench_now();
	do {
		for (int i = 0; i < 16; i++) {
			a.w = addr[iters % n_copies];
			ops->gemm(ctx, &a);
			iters++;
		}
		t = bench_now() - t0;
	} while (t < secs);
	printf("%-22s %-5s%s%s k=%-5lld n=%-6lld threads=%d  %8.1f us  %6.2f GB/s", s->what,
	       f->name, packed ? "+pack" : "     ", cold ? " cold" : "     ", (long long)s->k,
	       (long long)s->n, threads, t / iters * 1e6, wbytes * (double)iters / t / 1e9);
	if (m > 1)
		printf("  m=%lld %6.2f G products/s", (long long)m,
		       (double)m * (double)s->n * (double)s->k * (double)iters / t / 1e9);
	printf("\n");
	for (int c = 1; c < n_copies; c++)
		ops->buffer_free(ctx, copies[c]);
	if (bp)
		ops->buffer_free(ctx, bp);
	ops->buffer_free(ctx, bw);
	ops->buffer_free(ctx, bx);
	ops->buffer_free(ctx, by);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct shape shapes[] = {
		{ "ffn up/gate 576x1536", 576, 1536, LOOM_TYPE_Q4_1 },
		{ "ffn down 1536x576", 1536, 576, LOOM_TYPE_Q4_1 },
		{ "ffn up/gate 576x1536", 576, 1536, LOOM_TYPE_Q8_0 },
		{ "ffn down 1536x576", 1536, 576, LOOM_TYPE_Q8_0 },
		{ "ffn up/gate 576x1536", 576, 1536, LOOM_TYPE_Q5_0 },
		{ "lm head 576x49152", 576, 49152, LOOM_TYPE_Q8_0 },
		{ "lm head 576x49152", 576, 49152, LOOM_TYPE_Q4_1 },
		{ "lm head 576x49152", 576, 49152, LOOM_TYPE_Q5_0 },
		{ "ffn down 1536x576", 1536, 576, LOOM_TYPE_F32 },
		{ "ffn down 1536x576", 1536, 576, LOOM_TYPE_Q2_K },
		{ "ffn down 1536x576", 1536, 576, LOOM_TYPE_Q3_K },
		{ "ffn down 1536x576", 1536, 576, LOOM_TYPE_Q4_K },
		{ "ffn down 1536x576", 1536, 576, LOOM_TYPE_Q5_K },
		{ "ffn down 1536x576", 1536, 576, LOOM_TYPE_Q6_K },
		/* Llama-3.2-1B's feed-forward (tools/mkgguf.py --preset 1b) */
		{ "1b ffn up 2048x8192", 2048, 8192, LOOM_TYPE_Q4_0 },
		{ "1b ffn up 2048x8192", 2048, 8192, LOOM_TYPE_Q8_0 },
		{ "1b ffn up 2048x8192", 2048, 8192, LOOM_TYPE_Q4_K },
		{ "1b ffn down 8192x2048", 8192, 2048, LOOM_TYPE_Q4_K },
		{ "1b ffn down 8192x2048", 8192, 2048, LOOM_TYPE_Q6_K },
		{ "1b ffn down 8192x2048", 8192, 2048, LOOM_TYPE_Q4_0 },
		{ "1b lm head 2048x128256", 2048, 128256, LOOM_TYPE_Q6_K },
		{ "1b lm head 2048x128256", 2048, 128256, LOOM_TYPE_Q8_0 },
		/* Llama-3-8B's ffn down (k past one pass of the 1-row kernels' fixes
		 * before 2026-11-29) */
		{ "8b ffn down 14336x4096", 14336, 4096, LOOM_TYPE_Q4_0 },
		{ "8b ffn down 14336x4096", 14336, 4096, LOOM_TYPE_Q8_0 },
	};
	const char *path = argc > 1 ? argv[1] : CPU_SO_PATH;
	double secs = argc > 2 ? atof(argv[2]) : 0.5;
	bool cold = argc > 3 && !strcmp(argv[3], "cold");
	const char *only = argc > 4 ? argv[4] : NULL;
	const int64_t m = argc > 5 ? atoll(argv[5]) : 1;
	struct loom_backend_host host = {
		.abi_major = LOOM_BACKEND_ABI_MAJOR, .struct_size = sizeof(host),
		.log = host_log,
	};
	const struct loom_backend_ops *ops;

	if (m < 1 || m > 4096) {
		fprintf(stderr, "bench_gemm: m must be 1 .. 4096\n");
		return 1;
	}
	ops = bench_open("bench_gemm", path);

	for (int threads = 1; threads <= 2; threads++) {
		struct loom_backend_config cfg = { .struct_size = sizeof(cfg), .n_threads = threads };
		struct loom_backend_ctx *ctx;

		if (ops->create(&host, &cfg, &ctx)) {
			fprintf(stderr, "bench_gemm: create failed\n");
			return 1;
		}
		for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
			for (int packed = 0; packed < 2 &&
					     (!only || !strcmp(only, format_of(shapes[i].type)->name));
			     packed++)
				if (bench_one(ops, ctx, &shapes[i], threads, secs, packed, cold, m) < 0)
					return 1;
		ops->destroy(ctx);
	}
	return 0;
}
