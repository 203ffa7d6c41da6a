/*
 * cpu.so's K-quant dequantization against the kquant plugin's to_float,
 * bit for bit, on random super-blocks, for each of cpu.so's kernel sets
 * (native, LOOM_CPU_ISA=avx2, scalar).
 *
 * The blocks are random bytes (every scale, min and quant bit pattern),
 * with the f16 d and dmin fields set to random finite halves (normal,
 * subnormal, zero, either sign). cpu.so is driven through embed, which
 * gathers rows with the same cpu_dequant_row the OpenBLAS prefill path
 * uses.
 *
 * Usage: backend_kdequant   (skips, exit 77, when cpu.so or the kquant
 * plugin does not load)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/backend_loader.h"
#include "plugin/host.h"

#define N_ROWS 48
#define BLOCKS_PER_ROW 4
#define DIM (256 * BLOCKS_PER_ROW)

static const uint32_t k_types[] = {
	LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K,
};

/* Offsets of the f16 fields (d, then dmin where there is one). */
static const struct { uint32_t type; int n; int off[2]; } halves[] = {
	{ LOOM_TYPE_Q2_K, 2, { 80, 82 } }, { LOOM_TYPE_Q3_K, 1, { 108 } },
	{ LOOM_TYPE_Q4_K, 2, { 0, 2 } },   { LOOM_TYPE_Q5_K, 2, { 0, 2 } },
	{ LOOM_TYPE_Q6_K, 1, { 208 } },
};

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t rnd32(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

/* A random finite half: any sign, mantissa and exponent but all-ones. */
static uint16_t rnd_half(void)
{
	uint16_t h = (uint16_t)rnd32();

	if ((h & 0x7c00) == 0x7c00)
		h &= (uint16_t)~0x4000;
	return h;
}

static void random_blocks(uint32_t type, uint8_t *p, size_t n_blocks, size_t bytes)
{
	for (size_t i = 0; i < n_blocks * bytes; i++)
		p[i] = (uint8_t)rnd32();
	for (size_t h = 0; h < sizeof(halves) / sizeof(halves[0]); h++) {
		if (halves[h].type != type)
			continue;
		for (size_t b = 0; b < n_blocks; b++)
			for (int f = 0; f < halves[h].n; f++) {
				uint16_t v = rnd_half();

				memcpy(p + b * bytes + halves[h].off[f], &v, 2);
			}
	}
}

static void *dev_copy(struct loom_backend *b, struct loom_buffer **buf, const void *src,
		      size_t n)
{
	void *addr;

	if (b->ops->buffer_alloc(b->ctx, n, buf))
		return NULL;
	addr = b->ops->buffer_addr(b->ctx, *buf);
	if (src && b->ops->upload(b->ctx, addr, src, n)) {
		b->ops->buffer_free(b->ctx, *buf);
		return NULL;
	}
	return addr;
}

/* Rows 0..N_ROWS-1 of `table` through embed; returns 0 when all match. */
static int check_type(struct loom_backend *b, const char *label,
		      const struct loom_quant_format *qf)
{
	size_t row_bytes = (size_t)BLOCKS_PER_ROW * qf->block_bytes;
	size_t out_bytes = (size_t)N_ROWS * DIM * sizeof(float);
	uint8_t *table = malloc(N_ROWS * row_bytes);
	float *want = malloc(out_bytes), *got = malloc(out_bytes);
	int32_t ids[N_ROWS];
	struct loom_buffer *bt = NULL, *bo = NULL, *bi = NULL;
	void *dt, *dout, *dids;
	int rc = -1, bad = 0;

	if (!table || !want || !got)
		goto out_free;
	random_blocks(qf->type, table, (size_t)N_ROWS * BLOCKS_PER_ROW, qf->block_bytes);
	for (int r = 0; r < N_ROWS; r++) {
		ids[r] = N_ROWS - 1 - r; /* gathered in reverse */
		if (qf->to_float(table + (size_t)ids[r] * row_bytes, want + (size_t)r * DIM, DIM))
			goto out_free;
	}
	dt = dev_copy(b, &bt, table, N_ROWS * row_bytes);
	dids = dev_copy(b, &bi, ids, sizeof(ids));
	dout = dev_copy(b, &bo, NULL, out_bytes);
	if (!dt || !dids || !dout ||
	    b->ops->embed(b->ctx, dout, dt, qf->type, row_bytes, N_ROWS, DIM, dids, N_ROWS) ||
	    b->ops->download(b->ctx, got, dout, out_bytes)) {
		printf("FAIL %s %s: embed failed\n", label, qf->name);
		goto out_bufs;
	}
	for (size_t e = 0; e < (size_t)N_ROWS * DIM; e++) {
		if (memcmp(&got[e], &want[e], sizeof(float)) && bad++ < 3)
			printf("  %s %s: row %zu value %zu: %a, to_float %a\n", label, qf->name,
			       e / DIM, e % DIM, got[e], want[e]);
	}
	printf("%s %s %s: %d of %d values differ\n", bad ? "FAIL" : "ok", label, qf->name, bad,
	       N_ROWS * DIM);
	rc = bad ? -1 : 0;
out_bufs:
	if (bt)
		b->ops->buffer_free(b->ctx, bt);
	if (bi)
		b->ops->buffer_free(b->ctx, bi);
	if (bo)
		b->ops->buffer_free(b->ctx, bo);
out_free:
	free(table);
	free(want);
	free(got);
	return rc;
}

int main(void)
{
	static const char *const isas[] = { NULL, "avx2", "scalar" };
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg), .n_threads = 1 };
	char err[4096];
	int failures = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (loom_formats_init(err, sizeof(err)) || !loom_format_get(LOOM_TYPE_Q4_K)) {
		printf("SKIP: no kquant plugin (%s)\n", err);
		return 77;
	}
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
		const char *label = isas[i] ? isas[i] : "native";
		struct loom_backend *b;

		if (isas[i])
			setenv("LOOM_CPU_ISA", isas[i], 1);
		else
			unsetenv("LOOM_CPU_ISA");
		b = loom_backend_open("cpu.so", &cfg, err, sizeof(err));
		if (!b) {
			printf("SKIP: cpu.so: %s\n", err);
			return 77;
		}
		for (size_t t = 0; t < sizeof(k_types) / sizeof(k_types[0]); t++)
			if (check_type(b, label, loom_format_get(k_types[t])))
				failures++;
		loom_backend_close(b);
	}
	printf("%d failed\n", failures);
	return failures ? 1 : 0;
}
