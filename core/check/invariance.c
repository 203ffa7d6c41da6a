/*
 * Batch invariance (LOOM_BACKEND_BATCH_INVARIANT): with the flag, every row
 * an operator produces must be bitwise the same whatever else shares the
 * call. For ref.so and cpu.so (each of its kernel sets: native, avx2,
 * scalar, chosen with LOOM_CPU_ISA; in exact mode, LOOM_BACKEND_EXACT, and
 * in its default fast mode with 8-bit activations and integer dots, there
 * also with LOOM_CPU_ISA=avx512, AVX-512 without VNNI) this checks, bit
 * for bit:
 *
 *   gemm      every row of batches of m = 2, 3, 5, 16, 17, 64 random rows
 *             against the same row alone (m = 1), for every weight format
 *             the backend runs; and against a context with another thread
 *             count;
 *   attention one sequence's decode row and prefill rows alone against the
 *             same rows in a call with other sequences, and a prefill in one
 *             chunk against the same prompt in several chunks over the same
 *             cache;
 *   rmsnorm, rope, glu  a row alone against the same row in a batch.
 *
 * Control: cpu.so without the flag runs the gemm cases and reports (never
 * fails on) how many rows differ, to show the comparison can see a
 * difference when there is one.
 *
 * Each comparison is recorded in the harness's report (tb.h) as op
 * inv-gemm, inv-attention, inv-rmsnorm, inv-rope or inv-glu. Run by
 * `loom check-backend` on the backend under test, and by
 * tests/backend/invariance_main.c on ref.so and cpu.so's kernel sets.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check/tb.h"

#define MAX_BUFS 32

struct be {
	const char *label;
	struct loom_backend *b;
	const struct loom_backend_ops *ops;
	struct loom_backend_ctx *ctx;
	struct loom_buffer *bufs[MAX_BUFS];
	int n_bufs;
};

/* ---- helpers ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
	/* xorshift64* */
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

static float rndf(void)
{
	return (float)rnd32() / 2147483648.0f - 1.0f; /* [-1, 1) */
}

static void *xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	return p;
}

static void fill(float *x, size_t n, float amp)
{
	for (size_t i = 0; i < n; i++)
		x[i] = amp * rndf();
}

static int be_open(struct be *e, const char *name, const char *label, int n_threads,
		   uint32_t flags, char *err, size_t errlen)
{
	struct loom_backend_config cfg = {
		.struct_size = sizeof(cfg), .device = 0, .n_threads = n_threads,
		.flags = flags,
	};

	memset(e, 0, sizeof(*e));
	e->label = label;
	e->b = loom_backend_open(name, &cfg, err, errlen);
	if (!e->b) {
		return -1;
	}
	e->ops = e->b->ops;
	e->ctx = e->b->ctx;
	return 0;
}

/* Frees the buffers allocated after the first `keep`. */
static void be_reset_to(struct be *e, int keep)
{
	while (e->n_bufs > keep)
		e->ops->buffer_free(e->ctx, e->bufs[--e->n_bufs]);
}

static void be_reset(struct be *e)
{
	be_reset_to(e, 0);
}

static void be_close(struct be *e)
{
	if (!e->b)
		return;
	be_reset(e);
	loom_backend_close(e->b);
	e->b = NULL;
}

/* A device copy of n bytes of src (NULL: zeroed). Exits on failure: the
 * harness cannot go on without its buffers. */
static void *put(struct be *e, const void *src, size_t n)
{
	struct loom_buffer *buf;
	void *addr, *zero = NULL;

	if (e->n_bufs == MAX_BUFS || e->ops->buffer_alloc(e->ctx, n ? n : 1, &buf)) {
		fprintf(tb_out(), "FAIL %s: buffer_alloc(%zu)\n", e->label, n);
		exit(1);
	}
	e->bufs[e->n_bufs++] = buf;
	addr = e->ops->buffer_addr(e->ctx, buf);
	if (!src)
		src = zero = xmalloc(n);
	if (n && e->ops->upload(e->ctx, addr, src, n)) {
		fprintf(tb_out(), "FAIL %s: upload\n", e->label);
		exit(1);
	}
	free(zero);
	return addr;
}

static void get(struct be *e, void *dst, const void *src, size_t n)
{
	if (e->ops->synchronize(e->ctx) || e->ops->download(e->ctx, dst, src, n)) {
		fprintf(tb_out(), "FAIL %s: download\n", e->label);
		exit(1);
	}
}

/* Reports one bitwise comparison of n floats as a case of op/fmt (when it
 * must agree); returns whether they agree. */
static bool same(const char *label, const char *op, const char *fmt, const char *what,
		 const float *a, const float *b, int64_t n, bool must)
{
	struct dev as = { .name = label };
	int64_t i;

	if (!memcmp(a, b, (size_t)n * sizeof(float))) {
		if (must)
			tb_result(&as, op, fmt, 0, 0, what);
		return true;
	}
	if (must) {
		for (i = 0; i < n && !memcmp(&a[i], &b[i], sizeof(float)); i++)
			;
		tb_fail(&as, op, fmt, "%s: element %" PRId64 " %.9g vs %.9g", what, i, a[i], b[i]);
	}
	return false;
}

/* A call that failed where it must run. */
static void status_fail(const char *label, const char *op, const char *fmt, const char *what,
			int rc)
{
	struct dev as = { .name = label };

	tb_fail(&as, op, fmt, "%s: status %d", what, rc);
}

/* ---- gemm ---- */

static const uint32_t gemm_types[] = {
	LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0,
	LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K,
	LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K, LOOM_TYPE_MXFP4,
};

static const int64_t batch_m[] = { 2, 3, 5, 16, 17, 64 };

static uint16_t f32_to_f16(float f)
{
	/* small normal values only (the weights here are in [2^-14, 1)) */
	uint32_t b;
	int e;

	memcpy(&b, &f, 4);
	e = (int)((b >> 23) & 0xff) - 127 + 15;
	if (e <= 0)
		return (uint16_t)((b >> 16) & 0x8000);
	return (uint16_t)(((b >> 16) & 0x8000) | (e << 10) | ((b >> 13) & 0x3ff));
}

/*
 * Random weight rows of `type`: random bytes with every half-float field of
 * a block (scales, minimums) replaced by a modest value, so no row holds
 * an inf or NaN. fp16 fields sit at the block offsets listed per format.
 */
static void make_weights(uint32_t type, const struct loom_format_info *fi, uint8_t *w,
			 int64_t n, int64_t k, size_t stride)
{
	static const struct { uint32_t type; int n_half; int off[2]; int tail; } halves[] = {
		{ LOOM_TYPE_Q8_0, 1, { 0 }, 0 }, { LOOM_TYPE_Q4_0, 1, { 0 }, 0 },
		{ LOOM_TYPE_Q4_1, 2, { 0, 2 }, 0 }, { LOOM_TYPE_Q5_0, 1, { 0 }, 0 },
		{ LOOM_TYPE_Q5_1, 2, { 0, 2 }, 0 },
		/* k-quants: d (and dmin) at the end or the start of the block */
		{ LOOM_TYPE_Q2_K, 2, { 80, 82 }, 0 }, { LOOM_TYPE_Q3_K, 1, { 108 }, 0 },
		{ LOOM_TYPE_Q4_K, 2, { 0, 2 }, 0 }, { LOOM_TYPE_Q5_K, 2, { 0, 2 }, 0 },
		{ LOOM_TYPE_Q6_K, 1, { 208 }, 0 },
	};
	int64_t blocks = k / fi->block_elems;

	for (int64_t j = 0; j < n; j++) {
		uint8_t *row = w + (size_t)j * stride;

		for (size_t i = 0; i < stride; i++)
			row[i] = (uint8_t)rnd32();
		if (type == LOOM_TYPE_F32) {
			for (int64_t i = 0; i < k; i++) {
				float f = rndf();

				memcpy(row + 4 * i, &f, 4);
			}
			continue;
		}
		if (type == LOOM_TYPE_F16 || type == LOOM_TYPE_BF16) {
			for (int64_t i = 0; i < k; i++) {
				float f = rndf();
				uint32_t b;
				uint16_t h;

				memcpy(&b, &f, 4);
				h = type == LOOM_TYPE_F16 ? f32_to_f16(f) : (uint16_t)(b >> 16);
				memcpy(row + 2 * i, &h, 2);
			}
			continue;
		}
		/* MXFP4: an E8M0 scale byte first, kept near 1 (2^-4 .. 2^1) */
		for (int64_t b = 0; type == LOOM_TYPE_MXFP4 && b < blocks; b++)
			row[b * fi->block_bytes] = (uint8_t)(124 + rnd32() % 6);
		for (size_t t = 0; t < sizeof(halves) / sizeof(halves[0]); t++) {
			if (halves[t].type != type)
				continue;
			for (int64_t b = 0; b < blocks; b++)
				for (int h = 0; h < halves[t].n_half; h++) {
					uint16_t v = f32_to_f16(0.01f + 0.05f * (rndf() + 1.0f));

					memcpy(row + b * fi->block_bytes + halves[t].off[h], &v, 2);
				}
		}
	}
}

struct gemm_case {
	uint32_t type;
	int64_t n, k;
	size_t w_stride;
	uint8_t *w_host;
};

static int gemm_run(struct be *e, const struct gemm_case *c, const void *w, const float *x,
		    int64_t m, int64_t x_stride, float *y_host)
{
	int keep = e->n_bufs;
	float *xd = put(e, x, (size_t)m * x_stride * sizeof(float));
	float *yd = put(e, NULL, (size_t)m * c->n * sizeof(float));
	struct loom_gemm_args a = {
		.struct_size = sizeof(a), .w_type = c->type, .m = m, .n = c->n, .k = c->k,
		.w = w, .w_stride = c->w_stride, .x = xd, .x_stride = x_stride, .y = yd,
		.y_stride = c->n,
	};
	int rc = e->ops->gemm(e->ctx, &a);

	if (rc == LOOM_OK)
		get(e, y_host, yd, (size_t)m * c->n * sizeof(float));
	be_reset_to(e, keep);
	return rc;
}

/* Rows of batches against the same rows alone; returns rows that differ.
 * `other` (optional): a context with another thread count, whose batch
 * results must match too. */
static int gemm_batches(struct be *e, struct be *other, const struct gemm_case *c, bool must)
{
	const char *tn = loom_format_get(c->type) ? loom_format_get(c->type)->name : "?";
	int64_t xs = c->k + 3; /* padded rows in the batch, dense alone */
	int differ = 0;
	char what[160];

	for (size_t bi = 0; bi < sizeof(batch_m) / sizeof(batch_m[0]); bi++) {
		int64_t m = batch_m[bi];
		float *x = xmalloc((size_t)m * xs * sizeof(float));
		float *y = xmalloc((size_t)m * c->n * sizeof(float));
		float *y1 = xmalloc((size_t)c->n * sizeof(float));
		void *w = put(e, c->w_host, (size_t)c->n * c->w_stride);

		fill(x, (size_t)m * xs, 1.0f);
		if (gemm_run(e, c, w, x, m, xs, y)) {
			snprintf(what, sizeof(what), "gemm m=%" PRId64, m);
			status_fail(e->label, "inv-gemm", tn, what, 1);
			goto next;
		}
		for (int64_t i = 0; i < m; i++) {
			if (gemm_run(e, c, w, x + i * xs, 1, c->k, y1)) {
				status_fail(e->label, "inv-gemm", tn, "gemm m=1", 1);
				break;
			}
			snprintf(what, sizeof(what), "gemm %s k=%" PRId64 " row %" PRId64
				 " of m=%" PRId64 " vs alone", tn, c->k, i, m);
			differ += !same(e->label, "inv-gemm", tn, what, y + i * c->n, y1, c->n, must);
		}
		if (other) {
			float *y2 = xmalloc((size_t)m * c->n * sizeof(float));
			void *w2 = put(other, c->w_host, (size_t)c->n * c->w_stride);

			if (gemm_run(other, c, w2, x, m, xs, y2) == LOOM_OK) {
				snprintf(what, sizeof(what), "gemm %s m=%" PRId64 " vs %s", tn,
					 m, other->label);
				same(e->label, "inv-gemm", tn, what, y, y2, m * c->n, true);
			}
			free(y2);
			be_reset(other);
		}
next:
		be_reset(e);
		free(x);
		free(y);
		free(y1);
	}
	return differ;
}

/* Every format e runs; returns rows that differ (for the control). */
static int check_gemm(struct be *e, struct be *other, bool must)
{
	int differ = 0;
	char list[256] = "";

	for (size_t t = 0; t < sizeof(gemm_types) / sizeof(gemm_types[0]); t++) {
		uint32_t type = gemm_types[t];
		const struct loom_format_info *fi = NULL;
		struct loom_format_info plain = { type, 1, type == LOOM_TYPE_F32 ? 4 : 2, "" };
		const struct loom_quant_format *qf = loom_format_get(type);

		if (!e->ops->supports(e->ctx, LOOM_OP_GEMM, type))
			continue;
		if (type == LOOM_TYPE_F32 || type == LOOM_TYPE_F16 || type == LOOM_TYPE_BF16)
			fi = &plain;
		else if (qf)
			fi = loom_host_services()->format_info(loom_host_services()->host, type);
		if (!fi)
			continue;
		snprintf(list + strlen(list), sizeof(list) - strlen(list), " %s",
			 qf ? qf->name : type == LOOM_TYPE_F32 ? "f32" :
			 type == LOOM_TYPE_F16 ? "f16" : "bf16");
		/* k: several blocks, and for plain types a tail past 32 */
		int64_t ks[2] = { fi->block_elems >= 256 ? 512 : 320,
				  fi->block_elems == 1 ? 100 : 0 };
		for (int ki = 0; ki < 2 && ks[ki]; ki++) {
			struct gemm_case c = { .type = type, .n = 37, .k = ks[ki] };

			c.w_stride = (size_t)(c.k / fi->block_elems) * fi->block_bytes + 8;
			c.w_host = xmalloc((size_t)c.n * c.w_stride);
			make_weights(type, fi, c.w_host, c.n, c.k, c.w_stride);
			differ += gemm_batches(e, other, &c, must);
			free(c.w_host);
		}
	}
	fprintf(tb_out(), "%s gemm formats:%s\n", e->label, list);
	return differ;
}

/*
 * ABI 1.2 weight_pack: where the backend packs a format, gemm on the packed
 * weight equals gemm on the GGUF bytes bit for bit, for every m (the
 * decode kernels and, without the invariance flag, the prefill path).
 * Returns the formats packed.
 */
static int check_packed(struct be *e)
{
	/* the GPU backends: GEMV to 16, the int8 GEMM to 256, panels past */
	static const int64_t ms[] = { 1, 2, 5, 17, 64, 300 };
	static const int64_t ks[] = { 320, 352, 512, 576, 768 };
	int packed = 0;

	if (!loom_backend_has_pack(e->b))
		return 0;
	for (size_t t = 0; t < sizeof(gemm_types) / sizeof(gemm_types[0]); t++) {
		uint32_t type = gemm_types[t];
		const struct loom_format_info *fi;
		bool any = false;

		if (!loom_format_get(type) || !e->ops->supports(e->ctx, LOOM_OP_GEMM, type))
			continue;
		fi = loom_host_services()->format_info(loom_host_services()->host, type);
		for (size_t ki = 0; fi && ki < sizeof(ks) / sizeof(ks[0]); ki++) {
			struct gemm_case c = { .type = type, .n = 37, .k = ks[ki] };
			struct loom_weight_pack_args pa = { .struct_size = sizeof(pa), .type = type,
				.n = c.n, .k = c.k };
			struct loom_buffer *pb = NULL;
			size_t pbytes = 0;
			int rc;

			if (c.k % fi->block_elems)
				continue;
			c.w_stride = (size_t)(c.k / fi->block_elems) * fi->block_bytes + 8;
			c.w_host = xmalloc((size_t)c.n * c.w_stride);
			make_weights(type, fi, c.w_host, c.n, c.k, c.w_stride);
			pa.src = c.w_host;
			pa.src_stride = c.w_stride;
			rc = e->ops->weight_pack(e->ctx, &pa, &pb, &pbytes);
			if (rc == LOOM_ERR_UNSUPPORTED) {
				free(c.w_host);
				continue;
			}
			if (rc || !pb || !pbytes) {
				status_fail(e->label, "pack-gemm", loom_format_get(type)->name,
					    "pack", rc ? rc : LOOM_ERR_INVALID);
				free(c.w_host);
				continue;
			}
			any = true;
			for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
				int64_t m = ms[mi];
				float *x = xmalloc((size_t)m * c.k * sizeof(float));
				float *y = xmalloc((size_t)m * c.n * sizeof(float));
				float *yp = xmalloc((size_t)m * c.n * sizeof(float));
				void *w = put(e, c.w_host, (size_t)c.n * c.w_stride);
				float *xd = put(e, NULL, (size_t)m * c.k * sizeof(float));
				float *yd = put(e, NULL, (size_t)m * c.n * sizeof(float));
				struct loom_gemm_args a = {
					.struct_size = sizeof(a), .w_type = type, .m = m, .n = c.n,
					.k = c.k, .w = w, .w_stride = c.w_stride, .x = xd,
					.x_stride = c.k, .y = yd, .y_stride = c.n,
				};
				char what[128];

				fill(x, (size_t)m * c.k, 1.0f);
				e->ops->upload(e->ctx, xd, x, (size_t)m * c.k * sizeof(float));
				rc = e->ops->gemm(e->ctx, &a);
				if (!rc)
					get(e, y, yd, (size_t)m * c.n * sizeof(float));
				a.w = e->ops->buffer_addr(e->ctx, pb);
				a.w_packed = 1;
				if (!rc)
					rc = e->ops->gemm(e->ctx, &a);
				if (!rc)
					get(e, yp, yd, (size_t)m * c.n * sizeof(float));
				snprintf(what, sizeof(what), "gemm %s k=%" PRId64 " m=%" PRId64
					 " packed vs GGUF layout", loom_format_get(type)->name, c.k, m);
				if (rc)
					status_fail(e->label, "pack-gemm", loom_format_get(type)->name,
						    what, rc);
				else
					same(e->label, "pack-gemm", loom_format_get(type)->name, what, y,
					     yp, m * c.n, true);
				be_reset(e);
				free(x);
				free(y);
				free(yp);
			}
			e->ops->buffer_free(e->ctx, pb);
			free(c.w_host);
		}
		packed += any;
	}
	return packed;
}

/* ---- attention ---- */

#define A_HEADS 4
#define A_KV_HEADS 2
#define A_HD 64
#define A_BS 16
#define A_MAXB 8
#define A_NSEQ 3
#define A_WIDTH (A_HEADS * A_HD)

struct attn_env {
	float *kc, *vc; /* device caches */
	int32_t table[A_NSEQ][A_MAXB];
	int32_t len[A_NSEQ]; /* full lengths of the sequences */
	float *q[A_NSEQ];    /* host queries, one per position */
	int32_t window;
	float softcap;
};

/*
 * One attention call over `n` (sequence, q_len, kv_len) parts; out receives
 * rows in call order. Queries of a part are its positions kv_len - q_len ..
 * kv_len - 1.
 */
static int attn_call(struct be *e, const struct attn_env *v, int n, const int *seq,
		     const int *q_len, const int *kv_len, float *out)
{
	int32_t qs[A_NSEQ + 2] = { 0 }, kl[A_NSEQ + 1], bt[(A_NSEQ + 1) * A_MAXB];
	int keep = e->n_bufs;
	int64_t rows;
	float *q;

	for (int s = 0; s < n; s++) {
		qs[s + 1] = qs[s] + q_len[s];
		kl[s] = kv_len[s];
		memcpy(bt + s * A_MAXB, v->table[seq[s]], sizeof(v->table[0]));
	}
	rows = qs[n];
	q = xmalloc((size_t)rows * A_WIDTH * sizeof(float));
	for (int s = 0; s < n; s++)
		memcpy(q + (size_t)qs[s] * A_WIDTH,
		       v->q[seq[s]] + (size_t)(kv_len[s] - q_len[s]) * A_WIDTH,
		       (size_t)q_len[s] * A_WIDTH * sizeof(float));
	float *qd = put(e, q, (size_t)rows * A_WIDTH * sizeof(float));
	float *od = put(e, NULL, (size_t)rows * A_WIDTH * sizeof(float));
	struct loom_attention_args a = {
		.struct_size = sizeof(a), .out = od, .q = qd, .q_stride = A_WIDTH,
		.out_stride = A_WIDTH, .kcache = v->kc, .vcache = v->vc, .n_seqs = n,
		.n_heads = A_HEADS, .n_kv_heads = A_KV_HEADS, .head_dim = A_HD,
		.block_size = A_BS, .max_blocks = A_MAXB,
		.q_start = put(e, qs, sizeof(qs)), .kv_len = put(e, kl, sizeof(kl)),
		.block_table = put(e, bt, sizeof(bt)), .scale = 0.125f,
		.window = v->window, .softcap = v->softcap,
	};
	int rc = e->ops->attention(e->ctx, &a);

	if (rc == LOOM_OK)
		get(e, out, od, (size_t)rows * A_WIDTH * sizeof(float));
	be_reset_to(e, keep);
	free(q);
	return rc;
}

/* Sequence 0's rows: alone, among others, and chunked. */
static void attn_cases(struct be *e, const struct attn_env *v, const char *var)
{
	const int L = v->len[0];
	float *alone = xmalloc((size_t)L * A_WIDTH * sizeof(float));
	float *mix = xmalloc((size_t)(L + v->len[1] + v->len[2]) * A_WIDTH * sizeof(float));
	char what[160];
	int rc;

	/* decode: the last row alone, then between two other sequences */
	{
		int seq[3] = { 1, 0, 2 }, ql[3] = { 1, 1, 5 };
		int kl[3] = { v->len[1], L, v->len[2] };

		rc = attn_call(e, v, 1, seq + 1, ql + 1, kl + 1, alone);
		rc = rc ? rc : attn_call(e, v, 3, seq, ql, kl, mix);
		snprintf(what, sizeof(what), "attention%s decode alone vs with 2 others", var);
		if (rc)
			status_fail(e->label, "inv-attention", "f32", what, rc);
		else
			same(e->label, "inv-attention", "f32", what, mix + A_WIDTH, alone, A_WIDTH,
			     true);
	}
	/* prefill of all L rows: alone, among others, and in chunks */
	{
		int seq[3] = { 2, 0, 1 }, ql[3] = { 3, L, v->len[1] };
		int kl[3] = { v->len[2], L, v->len[1] };
		static const int cuts[][4] = { { 16, 7, 0 }, { 1, 1, 30 }, { 33, 0 } };

		rc = attn_call(e, v, 1, seq + 1, ql + 1, kl + 1, alone);
		rc = rc ? rc : attn_call(e, v, 3, seq, ql, kl, mix);
		snprintf(what, sizeof(what), "attention%s prefill %d rows alone vs with others",
			 var, L);
		if (rc) {
			status_fail(e->label, "inv-attention", "f32", what, rc);
			goto out;
		}
		same(e->label, "inv-attention", "f32", what, mix + 3 * A_WIDTH, alone, (int64_t)L * A_WIDTH, true);
		for (size_t ci = 0; ci < sizeof(cuts) / sizeof(cuts[0]); ci++) {
			int done = 0, zero = 0;

			snprintf(what, sizeof(what), "attention%s prefill one chunk vs chunks",
				 var);
			for (int p = 0; done < L; p++) {
				int len = p < 4 && cuts[ci][p] ? cuts[ci][p] : L - done;
				int end;

				if (len > L - done)
					len = L - done;
				end = done + len;

				rc = attn_call(e, v, 1, &zero, &len, &end, mix);
				if (rc) {
					status_fail(e->label, "inv-attention", "f32", what, rc);
					goto out;
				}
				if (!same(e->label, "inv-attention", "f32", what, mix, alone + (size_t)done * A_WIDTH,
					  (int64_t)len * A_WIDTH, true))
					break;
				done = end;
			}
		}
	}
out:
	free(alone);
	free(mix);
}

static void check_attention(struct be *e)
{
	static const int lens[A_NSEQ] = { 45, 23, 70 };
	size_t cache = (size_t)A_NSEQ * A_MAXB * A_BS * A_KV_HEADS * A_HD;
	float *kc = xmalloc(cache * sizeof(float)), *vc = xmalloc(cache * sizeof(float));
	struct attn_env v = { 0 };
	int next = 0;

	/* blocks of the sequences interleaved and out of order */
	for (int j = 0; j < A_MAXB; j++)
		for (int s = 0; s < A_NSEQ; s++)
			v.table[s][j] = (A_NSEQ * A_MAXB - 1) - next++;
	for (int s = 0; s < A_NSEQ; s++) {
		v.len[s] = lens[s];
		v.q[s] = xmalloc((size_t)lens[s] * A_WIDTH * sizeof(float));
		fill(v.q[s], (size_t)lens[s] * A_WIDTH, 1.0f);
	}
	for (int variant = 0; variant < 2; variant++) {
		fill(kc, cache, 1.0f);
		fill(vc, cache, 1.0f);
		v.window = variant ? 9 : 0;
		v.softcap = variant ? 2.0f : 0.0f;
		v.kc = put(e, kc, cache * sizeof(float));
		v.vc = put(e, vc, cache * sizeof(float));
		attn_cases(e, &v, variant ? " (window, softcap)" : "");
		be_reset(e);
	}
	for (int s = 0; s < A_NSEQ; s++)
		free(v.q[s]);
	free(kc);
	free(vc);
}

/* ---- row-wise ops ---- */

static void check_rows(struct be *e)
{
	enum { R = 7, N = 96 };
	float x[R * N], w[N], up[R * N], y[R * N], y1[N];
	int32_t pos[R] = { 3, 0, 17, 5, 100, 2, 9 };
	char what[96], op_name[32];

	fill(x, R * N, 3.0f);
	fill(w, N, 1.0f);
	fill(up, R * N, 2.0f);
	for (int op = 0; op < 3; op++) {
		static const char *const names[] = { "rmsnorm", "rope", "glu" };

		for (int rows = R; rows >= 1; rows -= R - 1) {
			/* rows == R: the batch; rows == 1: row 4 alone */
			int first = rows == 1 ? 4 : 0;
			float *xd = put(e, x + first * N, (size_t)rows * N * sizeof(float));
			float *yd = put(e, NULL, (size_t)rows * N * sizeof(float));
			int rc;

			if (op == 0) {
				rc = e->ops->rmsnorm(e->ctx, yd, N, xd, N, put(e, w, sizeof(w)),
						     rows, N, 1e-5f);
			} else if (op == 1) {
				struct loom_rope_args a = {
					.struct_size = sizeof(a), .mode = LOOM_ROPE_NORM, .x = xd,
					.n_tokens = rows, .n_heads = 3, .head_dim = 32, .n_rot = 32,
					.row_stride = N, .pos = put(e, pos + first, rows * 4),
					.freq_base = 10000.0f, .freq_scale = 1.0f,
				};

				rc = e->ops->rope(e->ctx, &a);
				yd = xd;
			} else {
				rc = e->ops->glu(e->ctx, LOOM_GLU_SILU, yd, N, xd, N,
						 put(e, up + first * N, (size_t)rows * N * 4), N,
						 rows, N);
			}
			if (rc) {
				snprintf(what, sizeof(what), "inv-%s", names[op]);
				status_fail(e->label, what, "f32", names[op], rc);
				break;
			}
			get(e, rows == 1 ? y1 : y, yd, (size_t)rows * N * sizeof(float));
			be_reset(e);
		}
		snprintf(what, sizeof(what), "%s row 4 of %d vs alone", names[op], R);
		snprintf(op_name, sizeof(op_name), "inv-%s", names[op]);
		same(e->label, op_name, "f32", what, y + 4 * N, y1, N, true);
	}
}

/* ---- driver ---- */

/* The routed-expert slot (check/moe.c), for three weight types. */
static void check_moe(const char *name, const char *label, uint32_t flags)
{
	static const uint32_t types[] = { LOOM_TYPE_F32, LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0 };
	struct dev d;
	char why[256];

	if (dev_open_flags(&d, name, 2, flags, why, sizeof(why)))
		return;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (d.ops->supports(d.ctx, LOOM_OP_GEMM, types[i]))
			tb_moe_invariance(&d, label, types[i]);
	dev_close(&d);
}

int tb_run_invariance(const char *name, const char *label, bool exact, char *err,
		      size_t errlen)
{
	uint32_t flags = LOOM_BACKEND_BATCH_INVARIANT | (exact ? LOOM_BACKEND_EXACT : 0);
	struct be e, other;
	bool have_other;
	char why[256];

	if (be_open(&e, name, label, 2, flags, err, errlen))
		return -1;
	/* the same results from another thread count */
	have_other = be_open(&other, name, "3 threads", 3, flags, why, sizeof(why)) == 0;
	check_gemm(&e, have_other ? &other : NULL, true);
	check_packed(&e);
	check_attention(&e);
	check_rows(&e);
	be_close(&other);
	be_close(&e);
	check_moe(name, label, flags);
	/* packed weights without the flag too: there m >= 16 may take
	 * another path (cpu.so unpacks for BLAS, the GPU backends run the
	 * int8 GEMM or dequantized panels) */
	if (be_open(&e, name, label, 2, exact ? LOOM_BACKEND_EXACT : 0, why, sizeof(why)) == 0) {
		check_packed(&e);
		be_close(&e);
	}
	return 0;
}

int tb_invariance_control(const char *name)
{
	struct be e;
	char err[4096];
	int differ;

	if (be_open(&e, name, "control", 2, LOOM_BACKEND_EXACT, err, sizeof(err)))
		return -1;
	differ = check_gemm(&e, NULL, false);
	be_close(&e);
	return differ;
}
