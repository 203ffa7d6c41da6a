/*
 * Invalid arguments: every backend must answer LOOM_ERR_INVALID (never
 * crash, never LOOM_OK) for arguments loom/backend.h rules out. The
 * buffers passed are real device buffers, so a backend that skips a check
 * reads or writes garbage rather than faulting on a NULL.
 */
#include "check/tb.h"

#include <math.h>
#include <stddef.h>

#include <stdio.h>
#include <string.h>

static void expect_invalid(struct dev *d, const char *what, int rc, bool unsupported_ok)
{
	if (rc == LOOM_ERR_INVALID || (unsupported_ok && rc == LOOM_ERR_UNSUPPORTED))
		tb_result(d, "invalid", "-", 0, 0, what);
	else
		tb_fail(d, "invalid", "-", "%s: returned %s, want LOOM_ERR_INVALID", what,
			tb_status_name(rc));
}

static void invalid_gemm(struct dev *d)
{
	float *buf = dev_put(d, NULL, 64 * 1024);
	struct loom_gemm_args a = {
		.struct_size = sizeof(a), .w_type = LOOM_TYPE_F32, .m = 2, .n = 2, .k = 32,
		.w = buf, .w_stride = 32 * sizeof(float), .x = buf + 4096, .x_stride = 32,
		.y = buf + 8192, .y_stride = 2,
	};
	struct loom_gemm_args b = a;

	expect_invalid(d, "gemm with NULL args", d->ops->gemm(d->ctx, NULL), false);
	b.m = -1;
	expect_invalid(d, "gemm with m = -1", d->ops->gemm(d->ctx, &b), false);
	b = a;
	b.x_stride = 16;
	expect_invalid(d, "gemm with x_stride < k", d->ops->gemm(d->ctx, &b), false);
	/* k not a whole number of blocks, for every block format there is */
	for (uint32_t type = 0; type < LOOM_TYPE_COUNT; type++) {
		const struct loom_quant_format *qf = loom_format_get(type);
		char what[96];

		if (!qf || qf->block_elems == 1)
			continue;
		b = a;
		b.w_type = type;
		b.k = qf->block_elems + qf->block_elems / 2;
		b.w_stride = 4 * qf->block_bytes;
		b.x_stride = b.k;
		snprintf(what, sizeof(what), "gemm %s with k %lld (not whole blocks)",
			 qf->name, (long long)b.k);
		expect_invalid(d, what, d->ops->gemm(d->ctx, &b),
			       !d->ops->supports(d->ctx, LOOM_OP_GEMM, type));
	}
	dev_reset(d);
}

static void invalid_embed(struct dev *d)
{
	static const int32_t too_big[2] = { 0, 10 }, negative[2] = { 3, -1 };
	float *table = dev_put(d, NULL, 10 * 64 * sizeof(float));
	float *out = dev_put(d, NULL, 2 * 64 * sizeof(float));
	const int32_t *ids_big = dev_put(d, too_big, sizeof(too_big));
	const int32_t *ids_neg = dev_put(d, negative, sizeof(negative));
	bool f32 = d->ops->supports(d->ctx, LOOM_OP_EMBED, LOOM_TYPE_F32);
	const struct loom_quant_format *q4 = loom_format_get(LOOM_TYPE_Q4_0);

	expect_invalid(d, "embed id == n_rows",
		       d->ops->embed(d->ctx, out, table, LOOM_TYPE_F32, 64 * sizeof(float),
				     10, 64, ids_big, 2), !f32);
	expect_invalid(d, "embed id -1",
		       d->ops->embed(d->ctx, out, table, LOOM_TYPE_F32, 64 * sizeof(float),
				     10, 64, ids_neg, 2), !f32);
	expect_invalid(d, "embed row_bytes < dim * 4",
		       d->ops->embed(d->ctx, out, table, LOOM_TYPE_F32, 63 * sizeof(float),
				     10, 64, ids_neg, 1), !f32);
	if (q4)
		expect_invalid(d, "embed q4_0 with dim 48 (not whole blocks)",
			       d->ops->embed(d->ctx, out, table, LOOM_TYPE_Q4_0,
					     2 * q4->block_bytes, 10, 48, ids_neg, 1),
			       !d->ops->supports(d->ctx, LOOM_OP_EMBED, LOOM_TYPE_Q4_0));
	dev_reset(d);
}

static void invalid_rows(struct dev *d)
{
	float *x = dev_put(d, NULL, 4096 * sizeof(float));
	int32_t zero[4] = { 0 };
	const int32_t *pos = dev_put(d, zero, sizeof(zero));
	struct loom_rope_args r = {
		.struct_size = sizeof(r), .mode = LOOM_ROPE_NORM, .x = x, .n_tokens = 2,
		.n_heads = 2, .head_dim = 8, .n_rot = 8, .row_stride = 16, .pos = pos,
		.freq_base = 10000, .freq_scale = 1,
	};
	struct loom_rope_args rb = r;

	expect_invalid(d, "rmsnorm with n = -1",
		       d->ops->rmsnorm(d->ctx, x, 8, x, 8, x + 64, 2, -1, 1e-5f), false);
	expect_invalid(d, "add with b_rows 2 for 3 rows",
		       d->ops->add(d->ctx, x, 8, x, 8, x + 64, 8, 2, 3, 8), false);
	expect_invalid(d, "glu with an unknown kind",
		       d->ops->glu(d->ctx, (enum loom_glu_kind)7, x, 8, x + 64, 8, x + 128, 8,
				   2, 8), false);
	expect_invalid(d, "scale with rows = -1",
		       d->ops->scale(d->ctx, x, 8, -1, 8, 2.0f), false);
	if (d->ops->struct_size >= offsetof(struct loom_backend_ops, softcap) + sizeof(void *) &&
	    d->ops->softcap) {
		expect_invalid(d, "softcap with cap 0",
			       d->ops->softcap(d->ctx, x, 8, 2, 8, 0.0f), false);
		expect_invalid(d, "softcap with cap NaN",
			       d->ops->softcap(d->ctx, x, 8, 2, 8, NAN), false);
		expect_invalid(d, "softcap with stride < n",
			       d->ops->softcap(d->ctx, x, 4, 2, 8, 30.0f), false);
	}
	rb.n_rot = 7;
	expect_invalid(d, "rope with odd n_rot", d->ops->rope(d->ctx, &rb), false);
	rb = r;
	rb.n_rot = 16;
	expect_invalid(d, "rope with n_rot > head_dim", d->ops->rope(d->ctx, &rb), false);
	rb = r;
	rb.mode = 1;
	expect_invalid(d, "rope with mode 1", d->ops->rope(d->ctx, &rb), false);
	expect_invalid(d, "rope with NULL args", d->ops->rope(d->ctx, NULL), false);
	dev_reset(d);
}

static void invalid_attention(struct dev *d)
{
	static const int32_t q_start[2] = { 0, 3 }, kv_ok[1] = { 3 }, kv_short[1] = { 2 };
	static const int32_t kv_long[1] = { 40 }, table[2] = { 0, 1 };
	float *buf = dev_put(d, NULL, 64 * 1024 * sizeof(float));
	struct loom_attention_args a = {
		.struct_size = sizeof(a), .out = buf, .q = buf + 16384,
		.q_stride = 64, .out_stride = 64, .kcache = buf + 32768,
		.vcache = buf + 49152, .n_seqs = 1, .n_heads = 4, .n_kv_heads = 2,
		.head_dim = 16, .block_size = 16, .max_blocks = 2,
		.q_start = dev_put(d, q_start, sizeof(q_start)),
		.kv_len = dev_put(d, kv_ok, sizeof(kv_ok)),
		.block_table = dev_put(d, table, sizeof(table)), .scale = 0.25f,
	};
	struct loom_attention_args b = a;

	expect_invalid(d, "attention with NULL args", d->ops->attention(d->ctx, NULL), false);
	b.n_heads = 6;
	b.n_kv_heads = 4;
	expect_invalid(d, "attention with 6 heads over 4 KV heads",
		       d->ops->attention(d->ctx, &b), false);
	b = a;
	b.kv_len = dev_put(d, kv_short, sizeof(kv_short));
	expect_invalid(d, "attention with q_len 3 > kv_len 2",
		       d->ops->attention(d->ctx, &b), false);
	b = a;
	b.kv_len = dev_put(d, kv_long, sizeof(kv_long));
	expect_invalid(d, "attention with kv_len 40 > max_blocks 2 x block 16",
		       d->ops->attention(d->ctx, &b), false);
	b = a;
	b.head_dim = 0;
	expect_invalid(d, "attention with head_dim 0", d->ops->attention(d->ctx, &b), false);
	dev_reset(d);
}

void tb_run_invalid(struct dev *d)
{
	invalid_gemm(d);
	invalid_embed(d);
	invalid_rows(d);
	invalid_attention(d);
}
