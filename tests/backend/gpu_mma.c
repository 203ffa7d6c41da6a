/*
 * The GPU backends' int8 GEMM (fast mode, m 17 to 256): its two inner
 * products, int8 tensor-core MMA and dp4a, give the same bits.
 *
 * Each backend is opened twice in fast mode, with LOOM_GPU_MMA=0 and =1,
 * and runs the same gemm calls: q4_0, q8_0, q4_K and q6_K weights, in the
 * GGUF layout and packed (weight_pack), m from 17 to 256 (whole and
 * partial 64-row tiles), n past a 64-column tile, k not a whole number of
 * the kernel's 4-block steps. Every output must agree bit for bit. The
 * backend's log at destroy says how many int8 GEMM launches each inner
 * product ran ("int8 GEMM: N launches on tensor cores (MMA), M by
 * dp4a"): on gpuemu.so (CUDA's choice) LOOM_GPU_MMA=1 must have run every
 * call on the MMA and =0 every call by dp4a, so neither side of the
 * comparison quietly took the other path; on gpuemu64.so (rocm.so's
 * choice: no MMA on HIP) both run dp4a.
 *
 * Weights and activations live in host memory, which the emulators use as
 * device memory (as tests/backend/cpu_fuse.c does).
 *
 * Usage: backend_gpu_mma backend.so ...   (gpuemu.so gpuemu64.so)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/backend_loader.h"
#include "plugin/host.h"

static int failures;
static unsigned long long n_mma, n_dp4a;
static bool counts_seen;

static void catch_log(void *host, enum loom_log_level level, const char *msg)
{
	const char *q = strstr(msg, "int8 GEMM: ");

	(void)host;
	(void)level;
	if (q && sscanf(q, "int8 GEMM: %llu launches on tensor cores (MMA), %llu by dp4a", &n_mma,
			&n_dp4a) == 2)
		counts_seen = true;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float frand(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

struct weight {
	uint32_t type;
	int64_t n, k;
	void *bytes; /* GGUF layout */
	size_t stride;
};

/* Random n x k weights of `type`, quantized by the format plugin. */
static int make_weight(struct weight *w, uint32_t type, int64_t n, int64_t k)
{
	const struct loom_quant_format *qf = loom_format_get(type);
	float *f = malloc((size_t)k * sizeof(float));

	*w = (struct weight){ .type = type, .n = n, .k = k };
	if (!qf || !f) {
		free(f);
		return -1;
	}
	w->stride = (size_t)(k / qf->block_elems) * qf->block_bytes;
	w->bytes = malloc((size_t)n * w->stride);
	for (int64_t r = 0; w->bytes && r < n; r++) {
		for (int64_t i = 0; i < k; i++)
			f[i] = 0.2f * frand();
		if (qf->from_float(f, (char *)w->bytes + (size_t)r * w->stride, k)) {
			free(w->bytes);
			w->bytes = NULL;
		}
	}
	free(f);
	return w->bytes ? 0 : -1;
}

/* y = x w^T on a context opened with LOOM_GPU_MMA=mma; packed: through
 * weight_pack. Returns the backend's status. */
static int run_gemm(const struct loom_backend_ops *ops, struct loom_backend_ctx *c,
		    const struct weight *w, bool packed, const float *x, int64_t m, float *y)
{
	struct loom_weight_pack_args pa = { .struct_size = sizeof(pa), .type = w->type,
					    .n = w->n, .k = w->k, .src = w->bytes,
					    .src_stride = w->stride };
	struct loom_gemm_args a = {
		.struct_size = sizeof(a), .w_type = w->type, .m = m, .n = w->n, .k = w->k,
		.w = w->bytes, .w_stride = w->stride, .x = x, .x_stride = w->k, .y = y,
		.y_stride = w->n,
	};
	struct loom_buffer *pb = NULL;
	size_t bytes;
	int rc;

	if (packed) {
		rc = ops->weight_pack(c, &pa, &pb, &bytes);
		if (rc)
			return rc;
		a.w = ops->buffer_addr(c, pb);
		a.w_stride = 0;
		a.w_packed = 1;
	}
	rc = ops->gemm(c, &a);
	if (!rc)
		rc = ops->synchronize(c);
	if (pb)
		ops->buffer_free(c, pb);
	return rc;
}

static const uint32_t types[] = { LOOM_TYPE_Q4_0, LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_K, LOOM_TYPE_Q6_K };
static const int64_t ms[] = { 17, 33, 64, 100, 200, 256 };

/* Every case on both contexts; returns the number of gemm calls each ran. */
static int compare(const struct loom_backend_ops *ops, struct loom_backend_ctx *dp4a,
		   struct loom_backend_ctx *mma, const char *label)
{
	int calls = 0;

	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		const bool kq = types[t] == LOOM_TYPE_Q4_K || types[t] == LOOM_TYPE_Q6_K;
		const int64_t ks[2] = { kq ? 256 : 160, kq ? 768 : 288 };

		for (int ki = 0; ki < 2; ki++)
			for (int packed = 0; packed <= 1; packed++) {
				struct weight w;
				int64_t n = 72 + 8 * ki, bad = 0, bad_m = 0;

				if (packed && !ops->weight_pack)
					continue;
				if (make_weight(&w, types[t], n, ks[ki])) {
					printf("FAIL %s: no weights of type %u\n", label, types[t]);
					failures++;
					continue;
				}
				for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
					const int64_t m = ms[mi];
					float *x = malloc((size_t)(m * w.k) * sizeof(float));
					float *y0 = calloc((size_t)(m * n), sizeof(float));
					float *y1 = calloc((size_t)(m * n), sizeof(float));
					int rc0, rc1;

					for (int64_t i = 0; x && i < m * w.k; i++)
						x[i] = frand();
					rc0 = x && y0 && y1 ? run_gemm(ops, dp4a, &w, packed, x, m, y0) : -1;
					rc1 = x && y0 && y1 ? run_gemm(ops, mma, &w, packed, x, m, y1) : -1;
					if (packed && rc0 == LOOM_ERR_UNSUPPORTED &&
					    rc1 == LOOM_ERR_UNSUPPORTED) {
						/* not a packed format (q4_K's blocks are aligned) */
					} else if (rc0 || rc1) {
						printf("FAIL %s: %s gemm type %u m %lld: status %d, %d\n",
						       label, packed ? "packed" : "GGUF", types[t],
						       (long long)m, rc0, rc1);
						failures++;
					} else {
						calls++;
						if (memcmp(y0, y1, (size_t)(m * n) * sizeof(float)))
							bad++, bad_m = m;
					}
					free(x);
					free(y0);
					free(y1);
				}
				if (bad) {
					printf("FAIL %s: type %u k %lld %s: %lld of %zu products differ "
					       "between MMA and dp4a (last at m %lld)\n", label, types[t],
					       (long long)w.k, packed ? "packed" : "GGUF", (long long)bad,
					       sizeof(ms) / sizeof(ms[0]), (long long)bad_m);
					failures++;
				}
				free(w.bytes);
			}
	}
	return calls;
}

static int open_ctx(const struct loom_backend_ops *ops, const struct loom_backend_host *host,
		    const char *mma, struct loom_backend_ctx **c)
{
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg), .n_threads = 0 };

	setenv("LOOM_GPU_MMA", mma, 1);
	return ops->create(host, &cfg, c);
}

/* Destroys c and checks its launch counts: `want_mma` on the MMA. */
static void close_ctx(const struct loom_backend_ops *ops, struct loom_backend_ctx *c,
		      const char *label, const char *side, int calls, int want_mma)
{
	counts_seen = false;
	ops->destroy(c);
	if (!counts_seen || (int)n_mma != want_mma || (int)(n_mma + n_dp4a) != calls) {
		printf("FAIL %s %s: int8 GEMM launches %llu on MMA, %llu by dp4a (log %s); "
		       "want %d and %d\n", label, side, n_mma, n_dp4a, counts_seen ? "read" : "missing",
		       want_mma, calls - want_mma);
		failures++;
	}
}

static void check_backend(const struct loom_backend_ops *ops, const struct loom_backend_host *host,
			  const char *label, bool has_mma)
{
	struct loom_backend_ctx *c0 = NULL, *c1 = NULL;
	int before = failures, calls;

	if (open_ctx(ops, host, "0", &c0) || open_ctx(ops, host, "1", &c1)) {
		printf("FAIL %s: create\n", label);
		failures++;
		if (c0)
			ops->destroy(c0);
		return;
	}
	calls = compare(ops, c0, c1, label);
	close_ctx(ops, c0, label, "LOOM_GPU_MMA=0", calls, 0);
	close_ctx(ops, c1, label, "LOOM_GPU_MMA=1", calls, has_mma ? calls : 0);
	if (failures == before)
		printf("ok   %s: %d int8 GEMMs (q4_0 q8_0 q4_K q6_K, GGUF and packed, m 17..256) "
		       "equal bit for bit with LOOM_GPU_MMA=1 (%s) and =0 (dp4a)\n", label, calls,
		       has_mma ? "tensor-core MMA" : "dp4a too: no MMA on this target");
}

int main(int argc, char **argv)
{
	struct loom_backend_host host = *loom_host_services();
	char err[4096], path[4096];

	setvbuf(stdout, NULL, _IOLBF, 0);
	setenv("LOOM_GPU_EXACT", "0", 1); /* fast mode: the int8 GEMM */
	unsetenv("LOOM_GPU_MMQ_MAX_M");
	host.log = catch_log;
	if (loom_formats_init(err, sizeof(err))) {
		printf("FAIL no format plugins: %s\n", err);
		return 1;
	}
	for (int a = 1; a < argc; a++) {
		const struct loom_backend_ops *ops =
			loom_backend_load_ops(argv[a], path, sizeof(path), err, sizeof(err));

		if (!ops) {
			printf("FAIL %s: %s\n", argv[a], err);
			failures++;
			continue;
		}
		/* gpuemu.so stands for cuda.so (MMA), gpuemu64.so for rocm.so */
		check_backend(ops, &host, argv[a], !strstr(argv[a], "64"));
	}
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
