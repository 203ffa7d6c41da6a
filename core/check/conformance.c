/*
 * Backend conformance: every operator of a backend against ref.so over
 * many shapes and formats.
 *
 * Each case builds its inputs on the host, runs the operator on ref and on
 * the backend under test (outputs pre-filled with a NaN poison, so an
 * element a backend forgets to write fails the comparison), and compares
 * with the normalized error nmse = sum((a-b)^2) / sum(b^2). Row padding
 * must come back untouched. Tolerances, per op:
 *
 *   embed, add, scale          1e-10 / 1e-12  dequantization and one rounding
 *   softcap (ABI 1.2, opt.)    1e-10          a backend may use its own tanh
 *   argmax (ABI 1.6, opt.)     exact          the host's greedy choice
 *   kv_write                   exact          a copy
 *   rmsnorm                    1e-9           a backend may sum squares in f32
 *   glu                        1e-7           a backend may use its own exp/tanh
 *   rope                       1e-5           a backend may compute angles in f32
 *     in a fast mode           1e-5           cuda.so's (the angle in f32
 *     (cuda.so, rocm.so)                      arithmetic, compensated, sincosf):
 *                                             measured max 1.9e-15 with
 *                                             positions up to 131072 (a plain
 *                                             f32 angle: 2.5e-10 below 4096,
 *                                             2.4e-7 below 131072); exact
 *                                             modes measure 0 (ref.so's double)
 *   attention                  1e-6           f32 sums in any order
 *   attention, token trees     1e-6           the same (ABI 1.8, optional:
 *     (parent table)                          LOOM_OP_ATTENTION_TREE)
 *   attention_sinks            1e-6           the same (ABI 1.8, optional:
 *                                             LOOM_OP_ATTENTION_SINKS)
 *   glu_oai                    1e-7           as glu (ABI 1.8, optional:
 *                                             LOOM_OP_GLU_OAI)
 *   moe, moe_oai               gemm's         for the weight type (check/moe.c)
 *   gemm f32 / f16 / bf16      1e-6 / 1e-5 / 1e-4
 *                                             a backend may round activations to
 *                                             the weight's type and reorder sums
 *   gemm q8_0, q4_*, q5_*,     5e-4           a backend may quantize activations
 *   q2_K .. q6_K
 *                                             to 8 bits (as GGML's q8 dot does)
 *     in a fast mode           3e-2           it does: measured max 1.0e-2 (q4_1,
 *     (cpu.so; cuda.so's                      n = 1, where the nmse is one output's
 *     GEMV and int8 GEMM)                     squared relative error, and a sum
 *                                             that cancels makes it large)
 *       q4_0, mxfp4 /          1e-3 / 5e-3    measured max 7.8e-5, 1.4e-4 /
 *       q4_K, q6_K, q5_0,                     7.3e-4, 3.5e-4, 1.2e-3, 3.3e-4,
 *       q5_1, q3_K, q5_K                      3.6e-4, 4.6e-4
 *       q2_K                   1e-2           2.6e-3
 */
#include "check/tb.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F (sizeof(float))

static const uint32_t weight_types[] = {
	LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,
	LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1,
	LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K,
	LOOM_TYPE_MXFP4,
};
#define N_WEIGHT_TYPES (sizeof(weight_types) / sizeof(weight_types[0]))

/* Block geometry of a weight type; f32 works without a plugin. */
static bool geometry(uint32_t type, uint32_t *be, uint32_t *bb)
{
	const struct loom_quant_format *qf = loom_format_get(type);

	if (qf) {
		*be = qf->block_elems;
		*bb = qf->block_bytes;
		return true;
	}
	*be = 1;
	*bb = F;
	return type == LOOM_TYPE_F32;
}

static double gemm_tolerance(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_F32: return 1e-6;
	case LOOM_TYPE_F16: return 1e-5;
	case LOOM_TYPE_BF16: return 1e-4;
	/* fast mode: q4_0, q4_K and q6_K measured far below the rest (cpu.so
	 * 7.8e-5, 7.3e-4 and 3.5e-4 with K-quant activations scaled per 32
	 * values, 1.0e-3 and 6.1e-4 per 256 before; cuda.so's emulated kernels
	 * 7.8e-5, 7.3e-4 and 3.5e-4), held tighter so a scale taken from the
	 * wrong activation block (nmse 1.6e-2 on q4_K; 7.6e-3 for the
	 * neighbouring group of 32) fails */
	case LOOM_TYPE_Q4_0:
	/* mxfp4: cpu.so's 8-bit activation kernel measured 1.4e-4 */
	case LOOM_TYPE_MXFP4: return tb_fast ? 1e-3 : 5e-4;
	case LOOM_TYPE_Q4_K:
	case LOOM_TYPE_Q6_K:
	/* q5_0, q5_1, q3_K, q5_K: measured 1.2e-3, 3.3e-4, 3.6e-4, 4.6e-4
	 * (cpu.so's and cuda.so's kernels alike: the same activation blocks,
	 * the same integer sums); q2_K 2.6e-3 */
	case LOOM_TYPE_Q5_0:
	case LOOM_TYPE_Q5_1:
	case LOOM_TYPE_Q3_K:
	case LOOM_TYPE_Q5_K: return tb_fast ? 5e-3 : 5e-4;
	case LOOM_TYPE_Q2_K: return tb_fast ? 1e-2 : 5e-4;
	/* q4_1 and q8_0: 1.0e-2 and 4.5e-3, at n = 1 where one output that
	 * cancels makes the nmse large */
	default: return tb_fast ? 3e-2 : 5e-4;
	}
}

/* n_rows rows of k random values in `type`, row stride `stride` bytes. The
 * quant plugin's from_float makes them, as `loom quantize` would. */
static void *make_weights(uint32_t type, int64_t n_rows, int64_t k, size_t stride)
{
	const struct loom_quant_format *qf = loom_format_get(type);
	unsigned char *w = tb_xmalloc((size_t)n_rows * stride);
	float *row = tb_xmalloc((size_t)k * F);

	memset(w, 0xab, (size_t)n_rows * stride);
	for (int64_t j = 0; j < n_rows; j++) {
		tb_fill(row, k, 1.0f);
		if (!qf)
			memcpy(w + j * stride, row, (size_t)k * F);
		else if (qf->from_float(row, w + j * stride, k) != LOOM_OK)
			fprintf(stderr, "tb: from_float(%s) failed\n", qf->name);
	}
	free(row);
	return w;
}

/* ---- gemm ---- */

struct gemm_case {
	uint32_t type;
	int64_t m, n, k, x_stride, y_stride;
	size_t w_stride;
};

/* Runs one gemm on d; y holds the initial output and receives the result. */
static int gemm_on(struct dev *d, const struct gemm_case *c, const void *w,
		   const float *x, float *y)
{
	size_t y_bytes = (size_t)(c->m * c->y_stride) * F;
	struct loom_gemm_args a = {
		.struct_size = sizeof(a), .w_type = c->type,
		.m = c->m, .n = c->n, .k = c->k,
		.w = dev_put(d, w, (size_t)c->n * c->w_stride), .w_stride = c->w_stride,
		.x = dev_put(d, x, (size_t)(c->m * c->x_stride) * F), .x_stride = c->x_stride,
		.y = dev_put(d, y, y_bytes), .y_stride = c->y_stride,
	};
	int rc = LOOM_ERR_NOMEM;

	if (a.w && a.x && a.y) {
		rc = d->ops->gemm(d->ctx, &a);
		if (rc == LOOM_OK)
			rc = dev_get(d, y, a.y, y_bytes);
	}
	dev_reset(d);
	return rc;
}

static void gemm_case(struct dev *ref, struct dev *d, const struct gemm_case *c)
{
	const char *fmt = tb_type_name(c->type);
	int64_t y_n = c->m * c->y_stride;
	void *w = make_weights(c->type, c->n, c->k, c->w_stride);
	float *x = tb_xmalloc((size_t)(c->m * c->x_stride) * F);
	float *want = tb_poison(y_n), *got = tb_poison(y_n), *orig = tb_poison(y_n);
	bool sup = d->ops->supports(d->ctx, LOOM_OP_GEMM, c->type);
	char desc[160];
	int rc;

	snprintf(desc, sizeof(desc), "m %lld n %lld k %lld strides x %lld y %lld w %zu",
		 (long long)c->m, (long long)c->n, (long long)c->k,
		 (long long)c->x_stride, (long long)c->y_stride, c->w_stride);
	tb_fill(x, c->m * c->x_stride, 1.0f);
	rc = gemm_on(ref, c, w, x, want);
	if (rc != LOOM_OK) {
		tb_fail(d, "gemm", fmt, "%s: ref returned %s", desc, tb_status_name(rc));
	} else {
		tb_current(d, "gemm", fmt, desc);
		rc = gemm_on(d, c, w, x, got);
		if (tb_status_ok(d, "gemm", fmt, sup, rc, desc)) {
			tb_result(d, "gemm", fmt, gemm_tolerance(c->type),
				  tb_nmse(got, want, c->m, c->n, c->y_stride), desc);
			if (!tb_padding_same(got, orig, c->m, c->n, c->y_stride))
				tb_fail(d, "gemm", fmt, "%s: wrote into y's row padding", desc);
		}
	}
	free(w);
	free(x);
	free(want);
	free(got);
	free(orig);
}

static void test_gemm_type(struct dev *ref, struct dev *d, uint32_t type)
{
	static const int64_t ms[] = { 1, 2, 7, 32, 65 };
	static const int64_t ns[] = { 1, 3, 16, 33, 100 };
	static const int64_t plain_ks[] = { 1, 7, 32, 33, 96, 288 };
	static const int64_t block_ks[] = { 32, 64, 96, 288 };
	static const int64_t superblock_ks[] = { 256, 512, 768 };
	uint32_t be, bb;
	const int64_t *ks;
	size_t n_ks;
	int64_t pad_k;

	if (!geometry(type, &be, &bb)) {
		fprintf(tb_out(), "  skip gemm/embed %s: no quantization plugin registers it\n",
		       tb_type_name(type));
		return;
	}
	ks = be == 1 ? plain_ks : be == 32 ? block_ks : superblock_ks;
	n_ks = be == 1 ? 6 : be == 32 ? 4 : 3;
	pad_k = be > 96 ? be : 96;
	for (size_t mi = 0; mi < 5; mi++) {
		for (size_t ni = 0; ni < 5; ni++) {
			for (size_t ki = 0; ki < n_ks; ki++) {
				int64_t k = ks[ki];
				struct gemm_case c = {
					.type = type, .m = ms[mi], .n = ns[ni], .k = k,
					.x_stride = k, .y_stride = ns[ni],
					.w_stride = (size_t)(k / be) * bb,
				};

				gemm_case(ref, d, &c);
			}
		}
		/* Padded strides: x and y rows inside wider arrays, weight
		 * rows two blocks apart more than needed. */
		struct gemm_case c = {
			.type = type, .m = ms[mi], .n = 33, .k = pad_k,
			.x_stride = pad_k + 5, .y_stride = 33 + 3,
			.w_stride = (size_t)(pad_k / be + 2) * bb,
		};
		gemm_case(ref, d, &c);
	}
	/* One larger product, where a backend may switch to a blocked or BLAS
	 * path. */
	struct gemm_case big = {
		.type = type, .m = 100, .n = 300, .k = 512, .x_stride = 512,
		.y_stride = 300, .w_stride = (size_t)(512 / be) * bb,
	};
	gemm_case(ref, d, &big);
}

/* Batches of 16 rows (a whole GEMV pass on the GPUs) and a few more
 * past a 64-row int8 GEMM tile, run after every other case so that the
 * random inputs of those stay what they were. */
static void test_gemm_batches(struct dev *ref, struct dev *d, uint32_t type)
{
	static const int64_t ms[] = { 16, 130 }, ns[] = { 3, 65 };
	uint32_t be, bb;

	if (!geometry(type, &be, &bb))
		return;
	for (size_t mi = 0; mi < 2; mi++)
		for (size_t ni = 0; ni < 2; ni++) {
			int64_t k = be == 256 ? 512 : be == 32 ? 160 : 96;
			struct gemm_case c = {
				.type = type, .m = ms[mi], .n = ns[ni], .k = k,
				.x_stride = k + 1, .y_stride = ns[ni] + 2,
				.w_stride = (size_t)(k / be) * bb,
			};

			gemm_case(ref, d, &c);
		}
}

/* The int8 GEMM's range on the GPUs (fast mode, m 17 to 256): its first
 * and last m, a whole tile and a partial one, 72 outputs (a tile and 8),
 * k not a whole number of the kernel's 4-block steps. Appended last. */
static void test_gemm_tiles(struct dev *ref, struct dev *d, uint32_t type)
{
	static const int64_t ms[] = { 17, 64, 200, 256 };
	uint32_t be, bb;

	if (!geometry(type, &be, &bb))
		return;
	for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
		int64_t k = be == 256 ? 768 : be == 32 ? 288 : 96;
		struct gemm_case c = {
			.type = type, .m = ms[mi], .n = 72, .k = k,
			.x_stride = k, .y_stride = 72, .w_stride = (size_t)(k / be) * bb,
		};

		gemm_case(ref, d, &c);
	}
}

/* ---- embed ---- */

static int embed_on(struct dev *d, uint32_t type, const void *table, size_t row_bytes,
		    int64_t n_rows, int64_t dim, const int32_t *ids, int64_t n_ids,
		    float *out)
{
	size_t out_bytes = (size_t)(n_ids * dim) * F;
	float *dout = dev_put(d, out, out_bytes);
	const void *dt = dev_put(d, table, (size_t)n_rows * row_bytes);
	const int32_t *dids = dev_put(d, ids, (size_t)n_ids * sizeof(*ids));
	int rc = LOOM_ERR_NOMEM;

	if (dout && dt && dids) {
		rc = d->ops->embed(d->ctx, dout, dt, type, row_bytes, n_rows, dim, dids, n_ids);
		if (rc == LOOM_OK)
			rc = dev_get(d, out, dout, out_bytes);
	}
	dev_reset(d);
	return rc;
}

static void test_embed_type(struct dev *ref, struct dev *d, uint32_t type)
{
	static const int32_t ids[] = { 0, 39, 5, 5, 17, 22, 1 };
	static const int64_t dims[] = { 32, 288, 7 }, k_dims[] = { 256, 768 };
	const int64_t n_rows = 40, n_ids = 7;
	const char *fmt = tb_type_name(type);
	bool sup = d->ops->supports(d->ctx, LOOM_OP_EMBED, type);
	uint32_t be, bb;

	if (!geometry(type, &be, &bb))
		return;
	for (int di = 0; di < (be == 1 ? 3 : 2); di++) {
		for (int pad = 0; pad < 2; pad++) {
			int64_t dim = be == 256 ? k_dims[di] : dims[di];
			size_t row_bytes = (size_t)(dim / be + pad) * bb;
			void *table = make_weights(type, n_rows, dim, row_bytes);
			float *want = tb_poison(n_ids * dim), *got = tb_poison(n_ids * dim);
			char desc[96];
			int rc;

			snprintf(desc, sizeof(desc), "dim %lld row_bytes %zu", (long long)dim,
				 row_bytes);
			rc = embed_on(ref, type, table, row_bytes, n_rows, dim, ids, n_ids, want);
			tb_current(d, "embed", fmt, desc);
			if (rc != LOOM_OK) {
				tb_fail(d, "embed", fmt, "%s: ref returned %s", desc,
					tb_status_name(rc));
			} else {
				rc = embed_on(d, type, table, row_bytes, n_rows, dim, ids, n_ids, got);
				if (tb_status_ok(d, "embed", fmt, sup, rc, desc))
					tb_result(d, "embed", fmt, 1e-10,
						  tb_nmse(got, want, n_ids, dim, dim), desc);
			}
			free(table);
			free(want);
			free(got);
		}
	}
}

/* ---- float operators: a case is a set of host arrays and one call ---- */

/*
 * The result of one row operator on one backend: `io` is the array the
 * operator writes (rows x stride floats), copied to the device, operated
 * on and copied back. The other inputs are uploaded by the caller's
 * closure-like struct below.
 */
struct rowop {
	enum loom_op op;
	const char *name;
	int64_t rows, n, stride; /* the written array */
	double tol;
	char desc[128];
};

/* Compares `got` (from d) with `want` (from ref) and checks padding. */
static void rowop_compare(struct dev *d, const struct rowop *r, int rc_ref, int rc,
			  const float *got, const float *want, const float *orig)
{
	bool sup = d->ops->supports(d->ctx, r->op, LOOM_TYPE_F32);

	if (rc_ref != LOOM_OK) {
		tb_fail(d, r->name, "f32", "%s: ref returned %s", r->desc,
			tb_status_name(rc_ref));
		return;
	}
	if (!tb_status_ok(d, r->name, "f32", sup, rc, r->desc))
		return;
	tb_result(d, r->name, "f32", r->tol, tb_nmse(got, want, r->rows, r->n, r->stride),
		  r->desc);
	if (!tb_padding_same(got, orig, r->rows, r->n, r->stride))
		tb_fail(d, r->name, "f32", "%s: wrote into row padding", r->desc);
}

/* ---- rmsnorm ---- */

static int rmsnorm_on(struct dev *d, const float *x, const float *w, float *y,
		      int64_t rows, int64_t n, int64_t stride, float eps, bool in_place)
{
	size_t bytes = (size_t)(rows * stride) * F;
	float *dx = dev_put(d, x, bytes);
	float *dy = in_place ? dx : dev_put(d, y, bytes);
	const float *dw = dev_put(d, w, (size_t)n * F);
	int rc = LOOM_ERR_NOMEM;

	if (dx && dy && dw) {
		rc = d->ops->rmsnorm(d->ctx, dy, stride, dx, stride, dw, rows, n, eps);
		if (rc == LOOM_OK)
			rc = dev_get(d, y, dy, bytes);
	}
	dev_reset(d);
	return rc;
}

static void test_rmsnorm(struct dev *ref, struct dev *d)
{
	static const int64_t rows_list[] = { 1, 3, 17 }, ns[] = { 1, 7, 64, 288, 1000 };

	for (int ri = 0; ri < 3; ri++) {
		for (int ni = 0; ni < 5; ni++) {
			for (int v = 0; v < 2; v++) {
				struct rowop r = {
					.op = LOOM_OP_RMSNORM, .name = "rmsnorm", .tol = 1e-9,
					.rows = rows_list[ri], .n = ns[ni],
					.stride = ns[ni] + (v ? 3 : 0),
				};
				int64_t len = r.rows * r.stride;
				float *x = tb_xmalloc((size_t)len * F), *w = tb_xmalloc((size_t)r.n * F);
				float *want = tb_poison(len), *got = tb_poison(len);
				float *orig = v ? x : want; /* in place: padding stays x's */
				float eps = v ? 1e-6f : 1e-5f;
				int rc_ref, rc;

				tb_fill(x, len, 2.0f);
				for (int64_t i = 0; i < r.n; i++)
					w[i] = 1.0f + 0.5f * tb_rand();
				snprintf(r.desc, sizeof(r.desc), "rows %lld n %lld stride %lld%s",
					 (long long)r.rows, (long long)r.n,
					 (long long)r.stride, v ? " in place" : "");
				if (v) {
					memcpy(want, x, (size_t)len * F);
					memcpy(got, x, (size_t)len * F);
				}
				rc_ref = rmsnorm_on(ref, x, w, want, r.rows, r.n, r.stride, eps, v);
				tb_current(d, "rmsnorm", "f32", r.desc);
				rc = rmsnorm_on(d, x, w, got, r.rows, r.n, r.stride, eps, v);
				if (!v) {
					orig = tb_poison(len);
					rowop_compare(d, &r, rc_ref, rc, got, want, orig);
					free(orig);
				} else {
					rowop_compare(d, &r, rc_ref, rc, got, want, orig);
				}
				free(x);
				free(w);
				free(want);
				free(got);
			}
		}
	}
}

/* ---- rope ---- */

struct rope_case {
	uint32_t mode;
	int64_t n_tokens, n_heads, head_dim, n_rot, row_stride, max_pos;
	float base, fscale;
	bool factors;
};

static int rope_on(struct dev *d, const struct rope_case *c, float *x,
		   const int32_t *pos, const float *ff)
{
	size_t bytes = (size_t)(c->n_tokens * c->row_stride) * F;
	struct loom_rope_args a = {
		.struct_size = sizeof(a), .mode = c->mode, .x = dev_put(d, x, bytes),
		.n_tokens = c->n_tokens, .n_heads = c->n_heads, .head_dim = c->head_dim,
		.n_rot = c->n_rot, .row_stride = c->row_stride,
		.pos = dev_put(d, pos, (size_t)c->n_tokens * sizeof(*pos)),
		.freq_base = c->base, .freq_scale = c->fscale,
		.freq_factors = ff ? dev_put(d, ff, (size_t)c->n_rot / 2 * F) : NULL,
	};
	int rc = LOOM_ERR_NOMEM;

	if (a.x && a.pos && (!ff || a.freq_factors)) {
		rc = d->ops->rope(d->ctx, &a);
		if (rc == LOOM_OK)
			rc = dev_get(d, x, a.x, bytes);
	}
	dev_reset(d);
	return rc;
}

static void rope_case(struct dev *ref, struct dev *d, const struct rope_case *c)
{
	struct rowop r = {
		.op = LOOM_OP_ROPE, .name = "rope", .tol = 1e-5, .rows = c->n_tokens,
		.n = c->n_heads * c->head_dim, .stride = c->row_stride,
	};
	int64_t len = c->n_tokens * c->row_stride;
	float *x = tb_xmalloc((size_t)len * F), *want = tb_xmalloc((size_t)len * F);
	float *got = tb_xmalloc((size_t)len * F), *ff = NULL;
	int32_t *pos = tb_xmalloc((size_t)c->n_tokens * sizeof(*pos));
	int rc_ref, rc;

	tb_fill(x, len, 1.0f);
	for (int64_t t = 0; t < c->n_tokens; t++)
		pos[t] = t == 0 ? 0 : (int32_t)tb_rand_int(c->max_pos);
	if (c->factors) {
		ff = tb_xmalloc((size_t)c->n_rot / 2 * F);
		for (int64_t i = 0; i < c->n_rot / 2; i++)
			ff[i] = 1.0f + 3.5f * (tb_rand() + 1.0f);
	}
	snprintf(r.desc, sizeof(r.desc),
		 "%s tokens %lld heads %lld head_dim %lld n_rot %lld stride %lld base %g scale %g "
		 "pos < %lld%s",
		 c->mode == LOOM_ROPE_NORM ? "norm" : "neox", (long long)c->n_tokens,
		 (long long)c->n_heads, (long long)c->head_dim, (long long)c->n_rot,
		 (long long)c->row_stride, c->base, c->fscale, (long long)c->max_pos,
		 ff ? " freq_factors" : "");
	memcpy(want, x, (size_t)len * F);
	memcpy(got, x, (size_t)len * F);
	rc_ref = rope_on(ref, c, want, pos, ff);
	tb_current(d, "rope", "f32", r.desc);
	rc = rope_on(d, c, got, pos, ff);
	rowop_compare(d, &r, rc_ref, rc, got, want, x);
	free(x);
	free(want);
	free(got);
	free(ff);
	free(pos);
}

static void test_rope(struct dev *ref, struct dev *d)
{
	/* heads, head_dim, n_rot: full rotation, partial (n_rot < head_dim),
	 * odd head counts and a head_dim that is no power of two. */
	static const int64_t shapes[][3] = {
		{ 4, 64, 64 }, { 3, 128, 128 }, { 2, 64, 32 }, { 5, 80, 64 }, { 1, 6, 2 },
	};
	static const int64_t tokens[] = { 1, 5, 19 };
	static const uint32_t modes[] = { LOOM_ROPE_NORM, LOOM_ROPE_NEOX };

	for (int mi = 0; mi < 2; mi++)
		for (int si = 0; si < 5; si++)
			for (int ti = 0; ti < 3; ti++)
				for (int v = 0; v < 3; v++) {
					int64_t width = shapes[si][0] * shapes[si][1];
					struct rope_case c = {
						.mode = modes[mi], .n_tokens = tokens[ti],
						.n_heads = shapes[si][0],
						.head_dim = shapes[si][1],
						.n_rot = shapes[si][2],
						/* v 1: q inside a wider fused qkv row */
						.row_stride = width + (v == 1 ? 2 * width + 8 : 0),
						.base = v == 2 ? 1e6f : 10000.0f,
						.fscale = v == 1 ? 0.25f : 1.0f,
						.factors = v == 2,
						/* v 2: a long context's positions */
						.max_pos = v == 2 ? 131072 : 4096,
					};
					rope_case(ref, d, &c);
				}
}

/* ---- glu, add, scale ---- */

/* alias: 0 separate output, 1 out == first input, 2 out == second input. */
static int glu_on(struct dev *d, enum loom_glu_kind kind, const float *gate,
		  const float *up, float *out, int64_t rows, int64_t n, int64_t stride,
		  int alias)
{
	size_t bytes = (size_t)(rows * stride) * F;
	float *dg = dev_put(d, gate, bytes), *du = dev_put(d, up, bytes);
	float *dout = alias == 1 ? dg : alias == 2 ? du : dev_put(d, out, bytes);
	int rc = LOOM_ERR_NOMEM;

	if (dg && du && dout) {
		rc = d->ops->glu(d->ctx, kind, dout, stride, dg, stride, du, stride, rows, n);
		if (rc == LOOM_OK)
			rc = dev_get(d, out, dout, bytes);
	}
	dev_reset(d);
	return rc;
}

/* One glu case: gate and up drawn from [-g_amp, g_amp) and [-u_amp,
 * u_amp), rows of n, `pad` floats past each row unless out aliases gate
 * (alias 1) or up (alias 2). */
struct glu_case {
	enum loom_op op;
	const char *name, *kind_name;
	int kind;
	int64_t rows, n, pad;
	int alias;
	float g_amp, u_amp;
};

static void run_glu_case(struct dev *ref, struct dev *d, const struct glu_case *c)
{
	struct rowop r = {
		.op = c->op, .name = c->name, .tol = 1e-7, .rows = c->rows, .n = c->n,
		.stride = c->n + (c->alias ? 0 : c->pad),
	};
	int64_t len = r.rows * r.stride;
	float *g = tb_xmalloc((size_t)len * F), *u = tb_xmalloc((size_t)len * F);
	float *want = tb_poison(len), *got = tb_poison(len);
	float *orig = tb_poison(len);
	int rc_ref, rc;

	tb_fill(g, len, c->g_amp);
	tb_fill(u, len, c->u_amp);
	if (c->alias)
		memcpy(orig, c->alias == 1 ? g : u, (size_t)len * F);
	snprintf(r.desc, sizeof(r.desc), "%s rows %lld n %lld stride %lld%s", c->kind_name,
		 (long long)r.rows, (long long)r.n, (long long)r.stride,
		 c->alias == 1 ? " out=gate" : c->alias == 2 ? " out=up" : "");
	rc_ref = glu_on(ref, c->kind, g, u, want, r.rows, r.n, r.stride, c->alias);
	tb_current(d, c->name, "f32", r.desc);
	rc = glu_on(d, c->kind, g, u, got, r.rows, r.n, r.stride, c->alias);
	rowop_compare(d, &r, rc_ref, rc, got, want, orig);
	free(g);
	free(u);
	free(want);
	free(got);
	free(orig);
}

static void test_glu(struct dev *ref, struct dev *d)
{
	static const int64_t rows_list[] = { 1, 4, 9 }, ns[] = { 1, 17, 64, 1000 };

	/* gate over [-8, 8): both tails of the activations */
	for (int kind = 0; kind < 2; kind++)
		for (int ri = 0; ri < 3; ri++)
			for (int ni = 0; ni < 4; ni++)
				for (int alias = 0; alias < 3; alias++)
					run_glu_case(ref, d, &(struct glu_case){
						.op = LOOM_OP_GLU, .name = "glu",
						.kind_name = kind ? "gelu_tanh" : "silu",
						.kind = kind, .rows = rows_list[ri], .n = ns[ni],
						.pad = 5, .alias = alias, .g_amp = 8.0f,
						.u_amp = 1.0f });
}

/* gpt-oss's clamped SwiGLU (ABI 1.8, optional: LOOM_OP_GLU_OAI): gate
 * and up over [-10, 10), so both of up's clamps and gate's upper one
 * (7) are crossed, out separate or over gate or up. */
static void test_glu_oai(struct dev *ref, struct dev *d)
{
	static const int64_t rows_list[] = { 1, 9 }, ns[] = { 17, 1000 };

	if (d->ops->abi_minor < 8 || !d->ops->supports(d->ctx, LOOM_OP_GLU_OAI, LOOM_TYPE_F32)) {
		tb_skip(d, "glu_oai", "f32");
		return;
	}
	for (int ri = 0; ri < 2; ri++)
		for (int ni = 0; ni < 2; ni++)
			for (int alias = 0; alias < 3; alias++)
				run_glu_case(ref, d, &(struct glu_case){
					.op = LOOM_OP_GLU_OAI, .name = "glu_oai",
					.kind_name = "swiglu_oai", .kind = LOOM_GLU_SWIGLU_OAI,
					.rows = rows_list[ri], .n = ns[ni], .pad = 3,
					.alias = alias, .g_amp = 10.0f, .u_amp = 10.0f });
}

static int add_on(struct dev *d, const float *a, const float *b, float *out,
		  int64_t rows, int64_t b_rows, int64_t n, int64_t stride,
		  int64_t b_stride, bool in_place)
{
	size_t bytes = (size_t)(rows * stride) * F;
	float *da = dev_put(d, a, bytes);
	const float *db = dev_put(d, b, (size_t)(b_rows * b_stride) * F);
	float *dout = in_place ? da : dev_put(d, out, bytes);
	int rc = LOOM_ERR_NOMEM;

	if (da && db && dout) {
		rc = d->ops->add(d->ctx, dout, stride, da, stride, db, b_stride, b_rows, rows, n);
		if (rc == LOOM_OK)
			rc = dev_get(d, out, dout, bytes);
	}
	dev_reset(d);
	return rc;
}

static void test_add(struct dev *ref, struct dev *d)
{
	static const int64_t rows_list[] = { 1, 5, 16 }, ns[] = { 1, 33, 256 };

	for (int ri = 0; ri < 3; ri++)
		for (int ni = 0; ni < 3; ni++)
			for (int v = 0; v < 4; v++) {
				bool bcast = v & 1, in_place = v & 2;
				int64_t b_rows = bcast ? 1 : rows_list[ri];
				int64_t b_stride = ns[ni] + (bcast ? 0 : 2);
				struct rowop r = {
					.op = LOOM_OP_ADD, .name = "add", .tol = 1e-12,
					.rows = rows_list[ri], .n = ns[ni], .stride = ns[ni] + 4,
				};
				int64_t len = r.rows * r.stride;
				float *a = tb_xmalloc((size_t)len * F);
				float *b = tb_xmalloc((size_t)(b_rows * b_stride) * F);
				float *want = tb_poison(len), *got = tb_poison(len);
				float *orig = tb_poison(len);
				int rc_ref, rc;

				tb_fill(a, len, 1.0f);
				tb_fill(b, b_rows * b_stride, 1.0f);
				if (in_place)
					memcpy(orig, a, (size_t)len * F);
				snprintf(r.desc, sizeof(r.desc), "rows %lld b_rows %lld n %lld%s",
					 (long long)r.rows, (long long)b_rows, (long long)r.n,
					 in_place ? " in place" : "");
				rc_ref = add_on(ref, a, b, want, r.rows, b_rows, r.n, r.stride,
						b_stride, in_place);
				tb_current(d, "add", "f32", r.desc);
				rc = add_on(d, a, b, got, r.rows, b_rows, r.n, r.stride, b_stride,
					    in_place);
				rowop_compare(d, &r, rc_ref, rc, got, want, orig);
				free(a);
				free(b);
				free(want);
				free(got);
				free(orig);
			}
}

static int scale_on(struct dev *d, float *x, int64_t rows, int64_t n, int64_t stride,
		    float s)
{
	size_t bytes = (size_t)(rows * stride) * F;
	float *dx = dev_put(d, x, bytes);
	int rc = LOOM_ERR_NOMEM;

	if (dx) {
		rc = d->ops->scale(d->ctx, dx, stride, rows, n, s);
		if (rc == LOOM_OK)
			rc = dev_get(d, x, dx, bytes);
	}
	dev_reset(d);
	return rc;
}

static void test_scale(struct dev *ref, struct dev *d)
{
	static const int64_t rows_list[] = { 1, 7 }, ns[] = { 1, 100, 1023 };
	static const float factors[] = { 0.5f, -3.25f };

	for (int ri = 0; ri < 2; ri++)
		for (int ni = 0; ni < 3; ni++)
			for (int si = 0; si < 2; si++) {
				struct rowop r = {
					.op = LOOM_OP_SCALE, .name = "scale", .tol = 1e-12,
					.rows = rows_list[ri], .n = ns[ni],
					.stride = ns[ni] + 3 * si,
				};
				int64_t len = r.rows * r.stride;
				float *x = tb_xmalloc((size_t)len * F), *want = tb_xmalloc((size_t)len * F);
				float *got = tb_xmalloc((size_t)len * F);
				int rc_ref, rc;

				tb_fill(x, len, 1.0f);
				memcpy(want, x, (size_t)len * F);
				memcpy(got, x, (size_t)len * F);
				snprintf(r.desc, sizeof(r.desc), "rows %lld n %lld stride %lld by %g",
					 (long long)r.rows, (long long)r.n, (long long)r.stride,
					 factors[si]);
				rc_ref = scale_on(ref, want, r.rows, r.n, r.stride, factors[si]);
				tb_current(d, "scale", "f32", r.desc);
				rc = scale_on(d, got, r.rows, r.n, r.stride, factors[si]);
				rowop_compare(d, &r, rc_ref, rc, got, want, x);
				free(x);
				free(want);
				free(got);
			}
}

/* ---- softcap (optional, ABI 1.2) ---- */

static bool has_softcap(const struct dev *d)
{
	return d->ops->struct_size >= offsetof(struct loom_backend_ops, softcap) + sizeof(void *) &&
	       d->ops->softcap;
}

static int softcap_on(struct dev *d, float *x, int64_t rows, int64_t n, int64_t stride,
		      float cap)
{
	size_t bytes = (size_t)(rows * stride) * F;
	float *dx = dev_put(d, x, bytes);
	int rc = LOOM_ERR_NOMEM;

	if (dx) {
		rc = d->ops->softcap(d->ctx, dx, stride, rows, n, cap);
		if (rc == LOOM_OK)
			rc = dev_get(d, x, dx, bytes);
	}
	dev_reset(d);
	return rc;
}

/* Inputs spread to +-3 * cap, so the cap bends them well into tanh's tail. */
static void test_softcap(struct dev *ref, struct dev *d)
{
	static const int64_t rows_list[] = { 1, 5 }, ns[] = { 1, 257, 4096 };
	static const float caps[] = { 30.0f, 0.5f };

	if (!has_softcap(d)) {
		if (d->ops->supports(d->ctx, LOOM_OP_SOFTCAP, LOOM_TYPE_F32))
			tb_fail(d, "softcap", "f32", "supports() says yes but there is no slot");
		else
			tb_skip(d, "softcap", "f32");
		return;
	}
	for (int ri = 0; ri < 2; ri++)
		for (int ni = 0; ni < 3; ni++)
			for (int ci = 0; ci < 2; ci++) {
				struct rowop r = {
					.op = LOOM_OP_SOFTCAP, .name = "softcap", .tol = 1e-10,
					.rows = rows_list[ri], .n = ns[ni], .stride = ns[ni] + 2 * ci,
				};
				int64_t len = r.rows * r.stride;
				float *x = tb_xmalloc((size_t)len * F), *want = tb_xmalloc((size_t)len * F);
				float *got = tb_xmalloc((size_t)len * F);
				int rc_ref, rc;

				tb_fill(x, len, 3.0f * caps[ci]);
				memcpy(want, x, (size_t)len * F);
				memcpy(got, x, (size_t)len * F);
				snprintf(r.desc, sizeof(r.desc), "rows %lld n %lld stride %lld cap %g",
					 (long long)r.rows, (long long)r.n, (long long)r.stride,
					 caps[ci]);
				rc_ref = softcap_on(ref, want, r.rows, r.n, r.stride, caps[ci]);
				tb_current(d, "softcap", "f32", r.desc);
				rc = softcap_on(d, got, r.rows, r.n, r.stride, caps[ci]);
				rowop_compare(d, &r, rc_ref, rc, got, want, x);
				free(x);
				free(want);
				free(got);
			}
}

/* ---- argmax (optional, ABI 1.6) ---- */

static bool has_argmax(const struct dev *d)
{
	return d->ops->struct_size >= offsetof(struct loom_backend_ops, argmax) + sizeof(void *) &&
	       d->ops->argmax;
}

/* The host's greedy choice (core/engine/sampler.c): the largest value,
 * NaN below everything, ties to the lowest index. */
static int32_t host_argmax(const float *x, int64_t n)
{
	int32_t best = 0;
	float bl = isnan(x[0]) ? -INFINITY : x[0];

	for (int64_t i = 1; i < n; i++) {
		float v = isnan(x[i]) ? -INFINITY : x[i];

		if (v > bl) {
			bl = v;
			best = (int32_t)i;
		}
	}
	return best;
}

/* Rows of random values with a planted maximum that appears twice (a
 * tie), NaNs and infinities around it; the last row is all NaN / -inf. */
static void argmax_rows(float *x, int64_t rows, int64_t n, int64_t stride)
{
	tb_fill(x, rows * stride, 1.0f);
	for (int64_t r = 0; r < rows; r++) {
		float *row = x + r * stride;
		int64_t a = tb_rand_int(n), b = tb_rand_int(n);

		row[tb_rand_int(n)] = NAN;
		row[tb_rand_int(n)] = -INFINITY;
		row[a] = 2.0f + (float)r;
		row[b] = 2.0f + (float)r; /* the lower of a, b wins */
		if (r == rows - 1 && rows > 1)
			for (int64_t i = 0; i < n; i++)
				row[i] = i % 2 ? NAN : -INFINITY;
	}
}

static void test_argmax(struct dev *d)
{
	static const int64_t rows_list[] = { 1, 3, 17 }, ns[] = { 1, 255, 257, 49152 };

	if (!has_argmax(d)) {
		tb_skip(d, "argmax", "f32");
		return;
	}
	for (int ri = 0; ri < 3; ri++)
		for (int ni = 0; ni < 4; ni++) {
			int64_t rows = rows_list[ri], n = ns[ni], stride = n + (ri == 1 ? 3 : 0);
			size_t bytes = (size_t)(rows * stride) * F;
			float *x = tb_xmalloc(bytes), *dx;
			int32_t got[17], *dids;
			char desc[96];
			int rc = LOOM_ERR_NOMEM;

			argmax_rows(x, rows, n, stride);
			snprintf(desc, sizeof(desc), "rows %lld n %lld stride %lld", (long long)rows,
				 (long long)n, (long long)stride);
			tb_current(d, "argmax", "f32", desc);
			dx = dev_put(d, x, bytes);
			dids = dev_put(d, NULL, sizeof(got));
			if (dx && dids)
				rc = d->ops->argmax(d->ctx, dids, dx, stride, rows, n);
			if (rc == LOOM_OK)
				rc = dev_get(d, got, dids, (size_t)rows * sizeof(int32_t));
			if (rc != LOOM_OK) {
				tb_fail(d, "argmax", "f32", "%s: returned %s", desc, tb_status_name(rc));
			} else {
				int64_t r = 0;

				while (r < rows && got[r] == host_argmax(x + r * stride, n))
					r++;
				if (r < rows)
					tb_fail(d, "argmax", "f32", "%s: row %lld: index %d, the host picks %d",
						desc, (long long)r, (int)got[r],
						(int)host_argmax(x + r * stride, n));
				else
					tb_result(d, "argmax", "f32", 0.0, 0.0, desc);
			}
			dev_reset(d);
			free(x);
		}
}

/* ---- sample (optional, ABI 1.8) ----
 * The slot against the host sampler itself (core/engine/sampler.c): for
 * each case a host sampler and a "device" sampler start from the same
 * seed; each of DRAWS steps draws a token on the host from one copy of
 * the logits and on the backend from another (the rule and generator
 * state from loom_sampler_device_row, the generator advanced by
 * loom_sampler_device_drew when the backend drew), and the tokens, the
 * draw flags and the penalized logits must be equal. */

#define DRAWS 4

static bool has_sample(const struct dev *d)
{
	return d->ops->struct_size >= offsetof(struct loom_backend_ops, sample) + sizeof(void *) &&
	       d->ops->sample;
}

/* Generation 1.9: rows without top-k, logprobs. */
static bool has_sample_op(const struct dev *d, enum loom_op op)
{
	return has_sample(d) && d->ops->abi_minor >= 9 && d->ops->supports(d->ctx, op, LOOM_TYPE_F32);
}

/* The logprobs row r asks for at a step (generation 1.9): none, the
 * chosen token's alone, or it and 1..20 top ones. */
static int32_t sample_lp_ask(int step, int64_t r)
{
	int v = (step * 5 + (int)r * 7) % 23;

	return v == 0 ? 0 : v == 1 ? 1 : 1 + (v - 2) % 20 + 1;
}

/* Random logits with the ties, NaNs, infinities and signed zeros the rule
 * orders: the maximum and another value repeated at several indices, -0
 * and +0, a NaN, a -inf. Row kind 1 is all NaN / -inf (greedy fallback),
 * kind 2 holds a +inf, kind 3 is negative but for a top of three -0 and
 * three +0 (so the draw picks among equal values by index). */
static void sample_logits(float *row, int64_t n, int kind)
{
	tb_fill(row, n, 4.0f);
	for (int j = 0; j < 6; j++)
		row[tb_rand_int(n)] = j < 3 ? 4.5f : 3.5f;
	if (kind == 3) {
		for (int64_t i = 0; i < n; i++)
			row[i] = -1.0f - fabsf(row[i]);
		for (int j = 0; j < 6; j++)
			row[tb_rand_int(n)] = j % 2 ? 0.0f : -0.0f;
	}
	row[tb_rand_int(n)] = 0.0f;
	row[tb_rand_int(n)] = -0.0f;
	row[tb_rand_int(n)] = NAN;
	row[tb_rand_int(n)] = -INFINITY;
	if (kind == 1)
		for (int64_t i = 0; i < n; i++)
			row[i] = i % 3 ? -INFINITY : NAN;
	if (kind == 2)
		row[tb_rand_int(n)] = INFINITY;
}

struct sample_case {
	int64_t n, rows;
	struct loom_sampler_params p[3]; /* row r uses p[r % 3] */
};

/* One step of every row on the backend: tokens and draw flags into out,
 * the penalized logits into x. */
static int sample_on(struct dev *d, float *x, int64_t rows, int64_t n,
		     const struct loom_sample_row *sr, const int32_t *tok, const int32_t *cnt,
		     int32_t n_pen, int32_t *out, struct loom_sample_logprob *lp, int64_t lp_stride)
{
	size_t bytes = (size_t)(rows * n) * F, pen = (size_t)(n_pen > 0 ? n_pen : 1) * 4;
	size_t lp_bytes = (size_t)(rows * lp_stride) * sizeof(*lp);
	struct loom_sample_args a = {
		.struct_size = lp_stride ? sizeof(a) : LOOM_SAMPLE_ARGS_MIN_SIZE, /* as a 1.8 host */
		.x = dev_put(d, x, bytes), .stride = n, .rows = rows,
		.n = n, .params = dev_put(d, sr, (size_t)rows * sizeof(*sr)),
		.pen_tokens = dev_put(d, tok, pen), .pen_counts = dev_put(d, cnt, pen),
		.out = dev_put(d, NULL, (size_t)rows * 2 * sizeof(int32_t)),
	};
	int rc = LOOM_ERR_NOMEM;

	if (lp_stride) {
		a.lp = dev_put(d, NULL, lp_bytes);
		a.lp_stride = lp_stride;
		a.pen_raw = dev_put(d, NULL, pen);
	}
	if (a.x && a.params && a.pen_tokens && a.pen_counts && a.out &&
	    (!lp_stride || (a.lp && a.pen_raw)))
		rc = d->ops->sample(d->ctx, &a);
	if (rc == LOOM_OK)
		rc = dev_get(d, out, a.out, (size_t)rows * 2 * sizeof(int32_t));
	if (rc == LOOM_OK && lp_stride)
		rc = dev_get(d, lp, a.lp, lp_bytes);
	if (rc == LOOM_OK)
		rc = dev_get(d, x, a.x, bytes);
	dev_reset(d);
	return rc;
}

/* Row r's logprobs from the device (m asked) against the host's
 * definitions (engine/sampler.h) over the raw row: bit for bit. */
static int sample_lp_check(struct dev *d, const float *raw, int64_t n, int32_t m, int32_t t,
			   const struct loom_sample_logprob *got, const char *desc, int step,
			   int64_t r)
{
	struct loom_token_logprob top[LOOM_SAMPLE_MAX_TOP_LOGPROBS];
	double lse = loom_logprob_lse(raw, (int32_t)n);
	float chosen = (float)((double)raw[t] - lse);
	int32_t j;

	loom_logprob_top(raw, (int32_t)n, lse, m - 1, top);
	if (got[0].token != t || memcmp(&got[0].logprob, &chosen, F)) {
		tb_fail(d, "sample", "f32", "%s step %d row %lld: chosen logprob {%d, %.9g}, the host's {%d, %.9g}",
			desc, step, (long long)r, (int)got[0].token, got[0].logprob, (int)t, chosen);
		return 1;
	}
	for (j = 0; j < m - 1; j++)
		if (got[1 + j].token != top[j].token ||
		    (memcmp(&got[1 + j].logprob, &top[j].logprob, F) &&
		     !(isnan(got[1 + j].logprob) && isnan(top[j].logprob))))
			break;
	if (j < m - 1) {
		tb_fail(d, "sample", "f32", "%s step %d row %lld: top logprob %d of %d is {%d, %.9g}, the host's {%d, %.9g}",
			desc, step, (long long)r, (int)j, (int)(m - 1), (int)got[1 + j].token,
			got[1 + j].logprob, (int)top[j].token, top[j].logprob);
		return 1;
	}
	return 0;
}

/* Step `step` of a case: 0 when the backend drew what the host drew (and,
 * with lp, computed the host's logprobs). */
static int sample_step_check(struct dev *d, const struct sample_case *c, int step,
			     struct loom_sampler **host, struct loom_sampler **devs,
			     const int32_t *hist, int64_t n_hist, bool lp, const char *desc)
{
	int64_t rows = c->rows, n = c->n, stride = lp ? 1 + LOOM_SAMPLE_MAX_TOP_LOGPROBS : 0;
	float *want = tb_xmalloc((size_t)(rows * n) * F), *got = tb_xmalloc((size_t)(rows * n) * F);
	float *raw = tb_xmalloc((size_t)(rows * n) * F);
	struct loom_sample_logprob glp[3 * (1 + LOOM_SAMPLE_MAX_TOP_LOGPROBS)];
	struct loom_sample_row sr[3];
	int32_t tok[3 * 64], cnt[3 * 64], out[6], used = 0, bad = 0, rc;

	for (int64_t r = 0; r < rows; r++) {
		int kind = (step + (int)r) % 5;

		sample_logits(want + r * n, n, kind == 4 ? (int)(r % 2) + 1 : kind == 2 ? 3 : 0);
		used += loom_sampler_device_row(devs[r], hist, n_hist, &sr[r], used, tok + used,
						cnt + used, 64);
		if (lp)
			sr[r].logprobs = sample_lp_ask(step, r);
		if (lp && (step + (int)r) % 2) /* a NaN makes every logprob NaN: none */
			for (int64_t i = 0; i < n; i++)
				if (isnan(want[r * n + i]))
					want[r * n + i] = -2.5f;
	}
	memcpy(got, want, (size_t)(rows * n) * F);
	memcpy(raw, want, (size_t)(rows * n) * F);
	rc = sample_on(d, got, rows, n, sr, tok, cnt, used, out, glp, stride);
	if (rc != LOOM_OK) {
		tb_fail(d, "sample", "f32", "%s step %d: returned %s", desc, step, tb_status_name(rc));
		bad = 1;
	}
	for (int64_t r = 0; r < rows && !bad; r++) {
		int32_t t = loom_sampler_sample(host[r], want + r * n, hist, n_hist);
		const struct loom_sampler_params *p = &c->p[r % 3];
		float mx = -INFINITY;

		for (int64_t i = 0; i < n; i++)
			if (!isnan(want[r * n + i]) && want[r * n + i] > mx)
				mx = want[r * n + i];
		if (out[2 * r] != t || out[2 * r + 1] != (p->temp > 0.0f && isfinite(mx))) {
			tb_fail(d, "sample", "f32",
				"%s step %d row %lld (temp %g top_k %d top_p %g min_p %g): token %d drew %d, the host draws %d",
				desc, step, (long long)r, p->temp, p->top_k, p->top_p, p->min_p,
				(int)out[2 * r], (int)out[2 * r + 1], (int)t);
			bad = 1;
		} else if (memcmp(want + r * n, got + r * n, (size_t)n * F)) {
			tb_fail(d, "sample", "f32", "%s step %d row %lld: penalized logits differ",
				desc, step, (long long)r);
			bad = 1;
		} else if (lp && sr[r].logprobs > 0) {
			bad = sample_lp_check(d, raw + r * n, n, sr[r].logprobs, t,
					      glp + r * stride, desc, step, r);
		}
		if (!bad && out[2 * r + 1])
			loom_sampler_device_drew(devs[r]);
	}
	free(want);
	free(got);
	free(raw);
	return bad;
}

static void sample_case_run(struct dev *d, const struct sample_case *c, uint64_t seed, bool lp)
{
	struct loom_sampler *host[3] = { 0 }, *devs[3] = { 0 };
	int32_t hist[40];
	char desc[160];
	int bad = 0;

	for (int i = 0; i < 40; i++) /* repeats, and ids outside the vocabulary */
		hist[i] = i % 7 == 6 ? (int32_t)c->n + i : (int32_t)tb_rand_int(i % 2 ? 12 : c->n);
	snprintf(desc, sizeof(desc), "n %lld rows %lld temp %g top_k %d top_p %g min_p %g pen %g/%g/%g seed %llu%s",
		 (long long)c->n, (long long)c->rows, c->p[0].temp, c->p[0].top_k, c->p[0].top_p,
		 c->p[0].min_p, c->p[0].repeat_penalty, c->p[0].presence_penalty,
		 c->p[0].frequency_penalty, (unsigned long long)seed, lp ? " logprobs" : "");
	tb_current(d, "sample", "f32", desc);
	for (int64_t r = 0; r < c->rows; r++) {
		struct loom_sampler_params p = c->p[r % 3];

		p.seed = seed + (uint64_t)r;
		host[r] = loom_sampler_new(&p, (int32_t)c->n, NULL, 0);
		devs[r] = loom_sampler_new(&p, (int32_t)c->n, NULL, 0);
		if (!host[r] || !devs[r])
			bad = 1;
	}
	if (bad)
		tb_fail(d, "sample", "f32", "%s: no host sampler for these parameters", desc);
	for (int step = 0; step < DRAWS && !bad; step++)
		bad = sample_step_check(d, c, step, host, devs, hist, 40 - 8 + 2 * step, lp, desc);
	if (!bad)
		tb_result(d, "sample", "f32", 0.0, 0.0, desc);
	for (int r = 0; r < 3; r++) {
		loom_sampler_free(host[r]);
		loom_sampler_free(devs[r]);
	}
}

static struct loom_sampler_params sample_params(float temp, int32_t k, float top_p, float min_p,
						float rep, float pres, float freq)
{
	struct loom_sampler_params p;

	loom_sampler_defaults(&p);
	p.temp = temp;
	p.top_k = k;
	p.top_p = top_p;
	p.min_p = min_p;
	p.repeat_penalty = rep;
	p.presence_penalty = pres;
	p.frequency_penalty = freq;
	p.penalty_last_n = 16;
	return p;
}

static void test_sample(struct dev *d)
{
	/* temperature, top-k, top-p, min-p, repeat, presence, frequency */
	const struct loom_sampler_params mixes[] = {
		sample_params(0.0f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f),  /* greedy */
		sample_params(0.0f, 0, 1.0f, 0.0f, 1.3f, 0.5f, 0.25f),    /* greedy, penalties */
		sample_params(0.8f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f),  /* loom's defaults */
		sample_params(1.5f, 1000, 1.0f, 0.0f, 1.1f, 0.0f, 0.0f),
		sample_params(0.7f, 1024, 0.5f, 0.3f, 1.0f, 0.2f, 0.1f),
		sample_params(2.5f, 5, 0.9f, 0.0f, 0.8f, 0.0f, 0.0f),
		sample_params(1.0f, 1, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f),
		sample_params(0.3f, 300, 0.99f, 0.01f, 1.2f, 1.0f, 0.5f),
	};
	/* generation 1.9: without top-k (top_k 0, or the whole vocabulary) */
	const struct loom_sampler_params full_mixes[] = {
		sample_params(0.9f, 0, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f),
		sample_params(0.8f, 0, 0.95f, 0.05f, 1.3f, 0.5f, 0.25f),
		sample_params(1.7f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f),   /* temperature alone */
		sample_params(1.2f, 100000, 0.5f, 0.02f, 1.0f, 0.0f, 0.3f), /* top_k >= n */
		sample_params(3.0f, 0, 0.999f, 0.0f, 1.1f, 0.0f, 0.0f),  /* a long prefix */
	};
	const bool full = has_sample_op(d, LOOM_OP_SAMPLE_FULL);
	const bool lp = has_sample_op(d, LOOM_OP_SAMPLE_LOGPROBS);
	struct loom_sampler_params all[32];
	int n_mixes = 0;
	static const int64_t ns[] = { 1500, 49152 };

	if (!has_sample(d)) {
		tb_skip(d, "sample", "f32");
		return;
	}
	for (size_t i = 0; i < sizeof(mixes) / sizeof(mixes[0]); i++)
		all[n_mixes++] = mixes[i];
	for (size_t i = 0; full && i < sizeof(full_mixes) / sizeof(full_mixes[0]); i++)
		all[n_mixes++] = full_mixes[i];
	for (int ni = 0; ni < 2; ni++)
		for (int m = 0; m < n_mixes; m++)
			for (uint64_t seed = 1; seed <= (ni ? 1u : 6u); seed++) {
				struct sample_case c = { .n = ns[ni], .rows = m % 2 ? 3 : 1 };

				for (int r = 0; r < 3; r++)
					c.p[r] = all[(m + 3 * r) % n_mixes];
				sample_case_run(d, &c, seed * 7919u + (uint64_t)m,
						lp && (seed + (uint64_t)m) % 2 == 0);
			}
}

/* ---- kv_write ---- */

struct kv_case {
	int64_t n_slots, n_tokens, kv_dim, stride;
};

/* Writes into a copy of `cache` (k and v halves of 2 x n_slots x kv_dim). */
static int kv_write_on(struct dev *d, const struct kv_case *c, float *cache,
		       const float *k, const float *v, const int32_t *slots)
{
	size_t half = (size_t)(c->n_slots * c->kv_dim) * F;
	size_t in_bytes = (size_t)(c->n_tokens * c->stride) * F;
	struct loom_kv_write_args a = {
		.struct_size = sizeof(a),
		.kcache = dev_put(d, cache, half),
		.vcache = dev_put(d, cache + c->n_slots * c->kv_dim, half),
		.k = dev_put(d, k, in_bytes), .v = dev_put(d, v, in_bytes),
		.k_stride = c->stride, .v_stride = c->stride,
		.n_tokens = c->n_tokens, .kv_dim = c->kv_dim,
		.slots = dev_put(d, slots, (size_t)c->n_tokens * sizeof(*slots)),
	};
	int rc = LOOM_ERR_NOMEM;

	if (a.kcache && a.vcache && a.k && a.v && a.slots) {
		rc = d->ops->kv_write(d->ctx, &a);
		if (rc == LOOM_OK)
			rc = dev_get(d, cache, a.kcache, half);
		if (rc == LOOM_OK)
			rc = dev_get(d, cache + c->n_slots * c->kv_dim, a.vcache, half);
	}
	dev_reset(d);
	return rc;
}

static void test_kv_write(struct dev *ref, struct dev *d)
{
	static const int64_t dims[] = { 64, 128, 640 }, tokens[] = { 1, 7, 40 };

	for (int di = 0; di < 3; di++)
		for (int ti = 0; ti < 3; ti++)
			for (int v = 0; v < 2; v++) {
				struct kv_case c = {
					.n_slots = 8 * 16, .n_tokens = tokens[ti], .kv_dim = dims[di],
					/* v 1: k and v are slices of a fused qkv row */
					.stride = dims[di] * (v ? 3 : 1),
				};
				struct rowop r = {
					.op = LOOM_OP_KV_WRITE, .name = "kv_write", .tol = 0,
					.rows = 1, .n = 2 * c.n_slots * c.kv_dim, .stride = 2 * c.n_slots * c.kv_dim,
				};
				int64_t len = 2 * c.n_slots * c.kv_dim, in = c.n_tokens * c.stride;
				float *cache = tb_xmalloc((size_t)len * F);
				float *want = tb_xmalloc((size_t)len * F), *got = tb_xmalloc((size_t)len * F);
				float *k = tb_xmalloc((size_t)in * F), *vv = tb_xmalloc((size_t)in * F);
				int32_t *slots = tb_xmalloc((size_t)c.n_slots * sizeof(*slots));
				int rc_ref, rc;

				tb_fill(cache, len, 1.0f);
				tb_fill(k, in, 1.0f);
				tb_fill(vv, in, 1.0f);
				/* distinct slots in random order: a shuffled prefix */
				for (int64_t i = 0; i < c.n_slots; i++)
					slots[i] = (int32_t)i;
				for (int64_t i = c.n_slots - 1; i > 0; i--) {
					int64_t j = tb_rand_int(i + 1);
					int32_t t = slots[i];

					slots[i] = slots[j];
					slots[j] = t;
				}
				memcpy(want, cache, (size_t)len * F);
				memcpy(got, cache, (size_t)len * F);
				snprintf(r.desc, sizeof(r.desc), "tokens %lld kv_dim %lld stride %lld",
					 (long long)c.n_tokens, (long long)c.kv_dim,
					 (long long)c.stride);
				rc_ref = kv_write_on(ref, &c, want, k, vv, slots);
				tb_current(d, "kv_write", "f32", r.desc);
				rc = kv_write_on(d, &c, got, k, vv, slots);
				rowop_compare(d, &r, rc_ref, rc, got, want, cache);
				free(cache);
				free(want);
				free(got);
				free(k);
				free(vv);
				free(slots);
			}
}

/* ---- attention ---- */

#define MAX_SEQS 8

struct attn_case {
	int64_t n_heads, n_kv_heads, head_dim, block_size;
	int32_t window;
	float softcap;
	bool pad;
	/* filled by attn_build */
	int64_t n_seqs, max_blocks, pool, rows, q_stride, out_stride;
	int32_t q_start[MAX_SEQS + 1], kv_len[MAX_SEQS];
	int32_t *block_table;
	float *kcache, *vcache, *q;
	int32_t *parent; /* [rows] token trees (ABI 1.8), or NULL */
	float *sinks;    /* [n_heads] attention sinks (ABI 1.8), or NULL */
};

/* A mixed batch: a prefill from scratch, decodes (first token, at a block
 * boundary, long), chunked prefills continuing earlier chunks. Blocks come
 * from a shuffled pool larger than needed; table entries past a sequence's
 * blocks point at valid but wrong blocks, so reading them shows. */
static void attn_build(struct attn_case *c)
{
	const int32_t bs = (int32_t)c->block_size;
	/* the last: a decode row long enough that cpu.so's fast mode splits
	 * its positions into parts (attention.c, ATTN_PART) */
	const int32_t q_lens[] = { 37, 1, 9, 1, 1, 1, 5, 1 };
	const int32_t kv_lens[] = { 37, 50, 70, 1, bs, 300, 2 * bs, 1100 };
	int64_t kv_dim = c->n_kv_heads * c->head_dim, width = c->n_heads * c->head_dim;
	int64_t used = 0, longest = 0, next = 0;
	int32_t *perm;

	c->n_seqs = 8;
	c->q_start[0] = 0;
	for (int s = 0; s < c->n_seqs; s++) {
		int64_t nb = (kv_lens[s] + bs - 1) / bs;

		c->kv_len[s] = kv_lens[s];
		c->q_start[s + 1] = c->q_start[s] + q_lens[s];
		used += nb;
		if (nb > longest)
			longest = nb;
	}
	c->rows = c->q_start[c->n_seqs];
	c->max_blocks = longest + 2;
	c->pool = used + 7;
	perm = tb_xmalloc((size_t)c->pool * sizeof(*perm));
	for (int64_t i = 0; i < c->pool; i++)
		perm[i] = (int32_t)i;
	for (int64_t i = c->pool - 1; i > 0; i--) {
		int64_t j = tb_rand_int(i + 1);
		int32_t t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	c->block_table = tb_xmalloc((size_t)(c->n_seqs * c->max_blocks) * sizeof(int32_t));
	for (int s = 0; s < c->n_seqs; s++) {
		int64_t nb = (c->kv_len[s] + bs - 1) / bs;

		for (int64_t j = 0; j < c->max_blocks; j++)
			c->block_table[s * c->max_blocks + j] =
				j < nb ? perm[next++] : (int32_t)tb_rand_int(c->pool);
	}
	free(perm);
	c->q_stride = width + (c->pad ? 8 : 0);
	c->out_stride = width + (c->pad ? 4 : 0);
	c->kcache = tb_xmalloc((size_t)(c->pool * bs * kv_dim) * F);
	c->vcache = tb_xmalloc((size_t)(c->pool * bs * kv_dim) * F);
	c->q = tb_xmalloc((size_t)(c->rows * c->q_stride) * F);
	tb_fill(c->kcache, c->pool * bs * kv_dim, 1.0f);
	tb_fill(c->vcache, c->pool * bs * kv_dim, 1.0f);
	/* amplitude 4: scores of order 1, so the softmax is far from flat */
	tb_fill(c->q, c->rows * c->q_stride, 4.0f);
}

static int attn_on(struct dev *d, const struct attn_case *c, float *out)
{
	size_t cache_bytes = (size_t)(c->pool * c->block_size * c->n_kv_heads * c->head_dim) * F;
	size_t out_bytes = (size_t)(c->rows * c->out_stride) * F;
	struct loom_attention_args a = {
		.struct_size = sizeof(a),
		.out = dev_put(d, out, out_bytes),
		.q = dev_put(d, c->q, (size_t)(c->rows * c->q_stride) * F),
		.q_stride = c->q_stride, .out_stride = c->out_stride,
		.kcache = dev_put(d, c->kcache, cache_bytes),
		.vcache = dev_put(d, c->vcache, cache_bytes),
		.n_seqs = c->n_seqs, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
		.head_dim = c->head_dim, .block_size = c->block_size,
		.max_blocks = c->max_blocks,
		.q_start = dev_put(d, c->q_start, (size_t)(c->n_seqs + 1) * sizeof(int32_t)),
		.kv_len = dev_put(d, c->kv_len, (size_t)c->n_seqs * sizeof(int32_t)),
		.block_table = dev_put(d, c->block_table,
				       (size_t)(c->n_seqs * c->max_blocks) * sizeof(int32_t)),
		.scale = 1.0f / sqrtf((float)c->head_dim),
		.window = c->window, .softcap = c->softcap,
	};
	int rc = LOOM_ERR_NOMEM;

	if (c->parent)
		a.parent = dev_put(d, c->parent, (size_t)c->rows * sizeof(int32_t));
	if (c->sinks)
		a.sinks = dev_put(d, c->sinks, (size_t)c->n_heads * F);
	if (a.out && a.q && a.kcache && a.vcache && a.q_start && a.kv_len && a.block_table &&
	    (!c->parent || a.parent) && (!c->sinks || a.sinks)) {
		rc = d->ops->attention(d->ctx, &a);
		if (rc == LOOM_OK)
			rc = dev_get(d, out, a.out, out_bytes);
	}
	dev_reset(d);
	return rc;
}

static void attn_case(struct dev *ref, struct dev *d, struct attn_case *c)
{
	struct rowop r = {
		.op = LOOM_OP_ATTENTION, .name = "attention", .tol = 1e-6,
	};
	float *want, *got, *orig;
	int rc_ref, rc;

	attn_build(c);
	if (c->parent)
		r.name = "attention_tree";
	if (c->sinks) { /* a sink logit per head over [-3, 3): a share of 0 .. 95% */
		r.name = "attention_sinks";
		r.op = LOOM_OP_ATTENTION_SINKS;
		c->sinks = tb_xmalloc((size_t)c->n_heads * F);
		tb_fill(c->sinks, c->n_heads, 3.0f);
	}
	if (c->parent) { /* a random forest per sequence: row i's parent in -1 .. i-1 */
		c->parent = tb_xmalloc((size_t)c->rows * sizeof(int32_t));
		for (int64_t s = 0; s < c->n_seqs; s++)
			for (int32_t i = 0; i < c->q_start[s + 1] - c->q_start[s]; i++)
				c->parent[c->q_start[s] + i] = (int32_t)tb_rand_int(i + 1) - 1;
	}
	r.rows = c->rows;
	r.n = c->n_heads * c->head_dim;
	r.stride = c->out_stride;
	want = tb_poison(c->rows * c->out_stride);
	got = tb_poison(c->rows * c->out_stride);
	orig = tb_poison(c->rows * c->out_stride);
	snprintf(r.desc, sizeof(r.desc),
		 "heads %lld/%lld head_dim %lld block %lld window %d softcap %g%s%s",
		 (long long)c->n_heads, (long long)c->n_kv_heads, (long long)c->head_dim,
		 (long long)c->block_size, c->window, c->softcap, c->pad ? " padded" : "",
		 c->parent ? " tree" : c->sinks ? " sinks" : "");
	rc_ref = attn_on(ref, c, want);
	tb_current(d, r.name, "f32", r.desc);
	rc = attn_on(d, c, got);
	rowop_compare(d, &r, rc_ref, rc, got, want, orig);
	free(want);
	free(got);
	free(orig);
	free(c->block_table);
	free(c->parent);
	free(c->sinks);
	free(c->kcache);
	free(c->vcache);
	free(c->q);
}

static void test_attention(struct dev *ref, struct dev *d)
{
	static const int64_t ratios[] = { 1, 3, 4 }, dims[] = { 64, 128 }, blocks[] = { 16, 32 };
	static const int32_t windows[] = { 0, 20 };
	int i = 0;

	for (int ri = 0; ri < 3; ri++)
		for (int di = 0; di < 2; di++)
			for (int bi = 0; bi < 2; bi++)
				for (int wi = 0; wi < 2; wi++)
					for (int cap = 0; cap < (di == 0 ? 2 : 1); cap++) {
						struct attn_case c = {
							.n_kv_heads = 2, .n_heads = 2 * ratios[ri],
							.head_dim = dims[di], .block_size = blocks[bi],
							.window = windows[wi], .softcap = cap ? 2.0f : 0.0f,
							.pad = i++ % 2,
						};
						attn_case(ref, d, &c);
					}
	/* multi-query: every query head shares one KV head */
	struct attn_case mqa = {
		.n_kv_heads = 1, .n_heads = 4, .head_dim = 64, .block_size = 16,
	};
	attn_case(ref, d, &mqa);
}

/* Token trees (ABI 1.8, optional): the same batches with a random parent
 * table (each sequence's rows a forest over its cached prefix). */
static void test_attention_tree(struct dev *ref, struct dev *d)
{
	static int32_t on = 1; /* any non-NULL parent: attn_case makes the table */
	static const int64_t ratios[] = { 1, 3 }, blocks[] = { 16, 32 };
	static const int32_t windows[] = { 0, 20 };

	if (d->ops->abi_minor < 8 || !d->ops->supports(d->ctx, LOOM_OP_ATTENTION_TREE, LOOM_TYPE_F32)) {
		tb_skip(d, "attention_tree", "f32");
		return;
	}
	for (int ri = 0; ri < 2; ri++)
		for (int bi = 0; bi < 2; bi++)
			for (int wi = 0; wi < 2; wi++) {
				struct attn_case c = {
					.n_kv_heads = 2, .n_heads = 2 * ratios[ri], .head_dim = 64,
					.block_size = blocks[bi], .window = windows[wi],
					.softcap = wi ? 2.0f : 0.0f, .pad = bi, .parent = &on,
				};
				attn_case(ref, d, &c);
			}
}

/* Attention sinks (ABI 1.8, optional: LOOM_OP_ATTENTION_SINKS): the
 * mixed batches (prefill tiles, decodes, chunks) with a sink per head,
 * GQA and MHA, windowed or not, head_dim 64 (gpt-oss's) and 128. */
static void test_attention_sinks(struct dev *ref, struct dev *d)
{
	static float on = 1.0f; /* any non-NULL sinks: attn_case makes them */
	static const int64_t ratios[] = { 1, 4 }, dims[] = { 64, 128 };
	static const int32_t windows[] = { 0, 20 };

	if (d->ops->abi_minor < 8 ||
	    !d->ops->supports(d->ctx, LOOM_OP_ATTENTION_SINKS, LOOM_TYPE_F32)) {
		tb_skip(d, "attention_sinks", "f32");
		return;
	}
	for (int ri = 0; ri < 2; ri++)
		for (int di = 0; di < 2; di++)
			for (int wi = 0; wi < 2; wi++) {
				struct attn_case c = {
					.n_kv_heads = 2, .n_heads = 2 * ratios[ri],
					.head_dim = dims[di], .block_size = 16 << wi,
					.window = windows[wi], .pad = ri, .sinks = &on,
				};
				attn_case(ref, d, &c);
			}
}

/* ---- moe (optional, ABI 1.6; check/moe.c) ---- */

static void test_moe(struct dev *ref, struct dev *d)
{
	static const uint32_t types[] = { LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_Q8_0,
					  LOOM_TYPE_Q4_0, LOOM_TYPE_MXFP4 };

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		if (!d->ops->supports(d->ctx, LOOM_OP_GEMM, types[i])) {
			tb_skip(d, "moe", tb_type_name(types[i]));
			continue;
		}
		tb_run_moe(ref, d, types[i], gemm_tolerance(types[i]));
	}
}

/* gpt-oss's routed FFN (ABI 1.8; check/moe.c): mxfp4 as it ships, and
 * f32 and q8_0. */
static void test_moe_oai(struct dev *ref, struct dev *d)
{
	static const uint32_t types[] = { LOOM_TYPE_F32, LOOM_TYPE_Q8_0, LOOM_TYPE_MXFP4 };

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		if (!d->ops->supports(d->ctx, LOOM_OP_GEMM, types[i])) {
			tb_skip(d, "moe_oai", tb_type_name(types[i]));
			continue;
		}
		tb_run_moe_oai(ref, d, types[i], gemm_tolerance(types[i]));
	}
}

void tb_run_conformance(struct dev *ref, struct dev *d)
{
	const char *only = getenv("LOOM_CHECK_ONLY");

	tb_seed(42);
	if (only && !strcmp(only, "sample")) { /* the sample slot's cases alone */
		test_sample(d);
		return;
	}
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
		test_gemm_type(ref, d, weight_types[i]);
		test_embed_type(ref, d, weight_types[i]);
	}
	test_rmsnorm(ref, d);
	test_rope(ref, d);
	test_glu(ref, d);
	test_add(ref, d);
	test_scale(ref, d);
	test_softcap(ref, d);
	test_kv_write(ref, d);
	test_attention(ref, d);
	test_moe(ref, d);
	/* appended cases last: the earlier ones keep their random inputs */
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++)
		test_gemm_batches(ref, d, weight_types[i]);
	test_argmax(d);
	test_attention_tree(ref, d);
	test_sample(d);
	test_glu_oai(ref, d);
	test_attention_sinks(ref, d);
	test_moe_oai(ref, d);
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++)
		test_gemm_tiles(ref, d, weight_types[i]);
}
