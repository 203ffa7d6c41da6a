/*
 * Independent checks of ref.so against small cases worked out by hand (or
 * with libm from the formulas in loom/backend.h), so the oracle is not only
 * compared with itself.
 */
#include "check/tb.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int fails;

static void expect(const char *what, const float *got, const float *want, int n)
{
	for (int i = 0; i < n; i++) {
		if (fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])))
			continue;
		printf("FAIL ref by hand: %s: element %d is %.7g, want %.7g\n", what, i,
		       got[i], want[i]);
		fails++;
		return;
	}
	printf("  ok  %s\n", what);
}

static void expect_rc(const char *what, int rc, int want)
{
	if (rc == want)
		return;
	printf("FAIL ref by hand: %s: returned %s, want %s\n", what, tb_status_name(rc),
	       tb_status_name(want));
	fails++;
}

static void check_gemm(struct dev *ref)
{
	const float x[4] = { 1, 2, 3, 4 };           /* [2][2] */
	const float w[6] = { 5, 6, 7, 8, 9, 10 };    /* [3][2] */
	const float want[6] = { 17, 23, 29, 39, 53, 67 };
	float got[6];
	struct loom_gemm_args a = {
		.struct_size = sizeof(a), .w_type = LOOM_TYPE_F32, .m = 2, .n = 3, .k = 2,
		.w = dev_put(ref, w, sizeof(w)), .w_stride = 2 * sizeof(float),
		.x = dev_put(ref, x, sizeof(x)), .x_stride = 2,
		.y = dev_put(ref, NULL, sizeof(got)), .y_stride = 3,
	};

	expect_rc("gemm f32", ref->ops->gemm(ref->ctx, &a), LOOM_OK);
	dev_get(ref, got, a.y, sizeof(got));
	expect("gemm f32 [[1,2],[3,4]] . [[5,6],[7,8],[9,10]]^T", got, want, 6);
	dev_reset(ref);
}

static void check_rmsnorm(struct dev *ref)
{
	const float x[4] = { 3, 4, 3, 4 }, w[2] = { 1, 1 }, w2[2] = { 2, 0.5f };
	/* mean(9, 16) = 12.5 */
	const float want[4] = { 3 / sqrtf(12.5f), 4 / sqrtf(12.5f),
				2 * 3 / sqrtf(12.5f), 0.5f * 4 / sqrtf(12.5f) };
	float got[4];
	float *dx = dev_put(ref, x, sizeof(x));

	expect_rc("rmsnorm", ref->ops->rmsnorm(ref->ctx, dx, 2, dx, 2,
					       dev_put(ref, w, sizeof(w)), 1, 2, 0.0f), LOOM_OK);
	expect_rc("rmsnorm", ref->ops->rmsnorm(ref->ctx, dx + 2, 2, dx + 2, 2,
					       dev_put(ref, w2, sizeof(w2)), 1, 2, 0.0f), LOOM_OK);
	dev_get(ref, got, dx, sizeof(got));
	expect("rmsnorm [3,4] with w=1 and w=[2,0.5], in place", got, want, 4);
	dev_reset(ref);
}

static void rope_case(struct dev *ref, const char *what, uint32_t mode, float *x,
		      int64_t head_dim, int64_t n_rot, int32_t pos, float base,
		      float fscale, const float *ff, const float *want)
{
	float got[8];
	struct loom_rope_args a = {
		.struct_size = sizeof(a), .mode = mode,
		.x = dev_put(ref, x, head_dim * sizeof(float)),
		.n_tokens = 1, .n_heads = 1, .head_dim = head_dim, .n_rot = n_rot,
		.row_stride = head_dim, .pos = dev_put(ref, &pos, sizeof(pos)),
		.freq_base = base, .freq_scale = fscale,
		.freq_factors = ff ? dev_put(ref, ff, n_rot / 2 * sizeof(float)) : NULL,
	};

	expect_rc(what, ref->ops->rope(ref->ctx, &a), LOOM_OK);
	dev_get(ref, got, a.x, head_dim * sizeof(float));
	expect(what, got, want, (int)head_dim);
	dev_reset(ref);
}

static void check_rope(struct dev *ref)
{
	const float pi_2 = (float)(M_PI / 2);
	float x[4] = { 1, 2, 3, 4 }, unit[4] = { 1, 0, 0, 1 }, two = 2;
	/* A quarter turn of (x0, x1); n_rot 2 < head_dim leaves x2, x3 alone. */
	const float quarter[4] = { -2, 1, 3, 4 };
	/* pos 1, base 10000, n_rot 4: pair 0 turns by 1 rad, pair 1 by 0.01 rad. */
	const float norm[4] = { cosf(1), sinf(1), -sinf(0.01f), cosf(0.01f) };
	const float neox[4] = { cosf(1), -sinf(0.01f), sinf(1), cosf(0.01f) };

	rope_case(ref, "rope norm: quarter turn of the first pair only", LOOM_ROPE_NORM,
		  x, 4, 2, 1, 10000, pi_2, NULL, quarter);
	rope_case(ref, "rope norm: pos 2, freq_factor 2 is a quarter turn", LOOM_ROPE_NORM,
		  x, 4, 2, 2, 10000, pi_2, &two, quarter);
	rope_case(ref, "rope norm: angles 1 and 0.01 rad", LOOM_ROPE_NORM, unit, 4, 4, 1,
		  10000, 1, NULL, norm);
	rope_case(ref, "rope neox: angles 1 and 0.01 rad on halves", LOOM_ROPE_NEOX, unit,
		  4, 4, 1, 10000, 1, NULL, neox);
}

static void check_elementwise(struct dev *ref)
{
	const float gate[3] = { 1, 0, -1 }, up[3] = { 2, 5, 1 };
	const float silu[3] = { 2 / (1 + expf(-1)), 0, -1 / (1 + expf(1)) };
	const float gelu[3] = { 2 * 0.8411920f, 0, -0.1588080f };
	const float a[4] = { 1, 2, 3, 4 }, b[2] = { 10, 20 };
	const float sum[4] = { 11, 22, 13, 24 }, scaled[4] = { 33, 66, 39, 72 };
	float got[4];
	float *dg = dev_put(ref, gate, sizeof(gate)), *du = dev_put(ref, up, sizeof(up));
	float *dout = dev_put(ref, NULL, sizeof(gate)), *da = dev_put(ref, a, sizeof(a));

	expect_rc("glu silu", ref->ops->glu(ref->ctx, LOOM_GLU_SILU, dout, 3, dg, 3, du, 3,
					    1, 3), LOOM_OK);
	dev_get(ref, got, dout, sizeof(gate));
	expect("glu silu(g) * up", got, silu, 3);
	expect_rc("glu gelu", ref->ops->glu(ref->ctx, LOOM_GLU_GELU_TANH, dout, 3, dg, 3,
					    du, 3, 1, 3), LOOM_OK);
	dev_get(ref, got, dout, sizeof(gate));
	expect("glu gelu_tanh(g) * up (gelu(1) = 0.841192)", got, gelu, 3);
	expect_rc("add", ref->ops->add(ref->ctx, da, 2, da, 2, dev_put(ref, b, sizeof(b)),
				       2, 1, 2, 2), LOOM_OK);
	dev_get(ref, got, da, sizeof(a));
	expect("add, b broadcast over rows, in place", got, sum, 4);
	expect_rc("scale", ref->ops->scale(ref->ctx, da, 2, 2, 2, 3.0f), LOOM_OK);
	dev_get(ref, got, da, sizeof(a));
	expect("scale by 3", got, scaled, 4);
	dev_reset(ref);
}

/* softcap (ABI 1.2): cap * tanh(x / cap), tanh from its definition. */
static void check_softcap(struct dev *ref)
{
	const float x[4] = { 0, 2, -6, 1000 };
	float want[4], got[4];
	float *dx = dev_put(ref, x, sizeof(x));

	for (int i = 0; i < 4; i++) {
		double e = exp(2.0 * x[i] / 2.0);

		want[i] = (float)(2.0 * (isinf(e) ? 1.0 : (e - 1.0) / (e + 1.0)));
	}
	expect_rc("softcap", ref->ops->softcap(ref->ctx, dx, 4, 1, 4, 2.0f), LOOM_OK);
	dev_get(ref, got, dx, sizeof(x));
	expect("softcap 2: 2 tanh(x / 2) of 0, 2, -6, 1000 (-> 0, 1.523, -1.990, 2)", got,
	       want, 4);
	expect_rc("softcap 0 is refused", ref->ops->softcap(ref->ctx, dx, 4, 1, 4, 0.0f),
		  LOOM_ERR_INVALID);
	dev_reset(ref);
}

static void check_kv_write(struct dev *ref)
{
	const float k[4] = { 1, 2, 3, 4 }, v[4] = { 5, 6, 7, 8 };
	const int32_t slots[2] = { 2, 0 };
	const float kwant[6] = { 3, 4, 0, 0, 1, 2 }, vwant[6] = { 7, 8, 0, 0, 5, 6 };
	float zero[6] = { 0 }, got[6];
	struct loom_kv_write_args a = {
		.struct_size = sizeof(a),
		.kcache = dev_put(ref, zero, sizeof(zero)),
		.vcache = dev_put(ref, zero, sizeof(zero)),
		.k = dev_put(ref, k, sizeof(k)), .v = dev_put(ref, v, sizeof(v)),
		.k_stride = 2, .v_stride = 2, .n_tokens = 2, .kv_dim = 2,
		.slots = dev_put(ref, slots, sizeof(slots)),
	};

	expect_rc("kv_write", ref->ops->kv_write(ref->ctx, &a), LOOM_OK);
	dev_get(ref, got, a.kcache, sizeof(got));
	expect("kv_write k to slots 2 and 0", got, kwant, 6);
	dev_get(ref, got, a.vcache, sizeof(got));
	expect("kv_write v to slots 2 and 0", got, vwant, 6);
	dev_reset(ref);
}

/*
 * A tiny attention: block_size 2, cache of 4 blocks, kv_dim 2 (head_dim 1
 * per KV head, or 2 with one KV head). The caller fills the cache slots and
 * the query; this runs one sequence of q_len rows over kv_len tokens kept
 * in blocks {3, 1} (so slots 6, 7, 2, 3 hold tokens 0..3).
 */
struct tiny {
	float kc[8 * 4], vc[8 * 4];
	float q[4 * 8];
	int64_t n_heads, n_kv_heads, head_dim;
	int32_t q_len, kv_len, window;
	float scale, softcap;
};

static int tiny_slot(int t)
{
	static const int block_of[2] = { 3, 1 };

	return block_of[t / 2] * 2 + t % 2;
}

static void tiny_run(struct dev *ref, const struct tiny *c, float *out)
{
	const int32_t q_start[2] = { 0, c->q_len }, bt[2] = { 3, 1 };
	int64_t width = c->n_heads * c->head_dim;
	struct loom_attention_args a = {
		.struct_size = sizeof(a),
		.out = dev_put(ref, NULL, c->q_len * width * sizeof(float)),
		.q = dev_put(ref, c->q, c->q_len * width * sizeof(float)),
		.q_stride = width, .out_stride = width,
		.kcache = dev_put(ref, c->kc, sizeof(c->kc)),
		.vcache = dev_put(ref, c->vc, sizeof(c->vc)),
		.n_seqs = 1, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
		.head_dim = c->head_dim, .block_size = 2, .max_blocks = 2,
		.q_start = dev_put(ref, q_start, sizeof(q_start)),
		.kv_len = dev_put(ref, &c->kv_len, sizeof(c->kv_len)),
		.block_table = dev_put(ref, bt, sizeof(bt)),
		.scale = c->scale, .window = c->window, .softcap = c->softcap,
	};

	expect_rc("attention", ref->ops->attention(ref->ctx, &a), LOOM_OK);
	dev_get(ref, out, a.out, c->q_len * width * sizeof(float));
	dev_reset(ref);
}

static void check_attention_gqa(struct dev *ref)
{
	/* 4 query heads over 2 KV heads of dim 2, one cached token:
	 * softmax of one score is 1, so head h outputs v of KV head h / 2. */
	struct tiny c = {
		.n_heads = 4, .n_kv_heads = 2, .head_dim = 2, .q_len = 1, .kv_len = 1,
		.scale = 1,
	};
	const float v0[4] = { 1, 2, 3, 4 }; /* KV head 0: (1,2), head 1: (3,4) */
	const float want[8] = { 1, 2, 1, 2, 3, 4, 3, 4 };
	float out[8];

	memcpy(c.vc + tiny_slot(0) * 4, v0, sizeof(v0));
	tb_fill(c.kc, 32, 1);
	tb_fill(c.q, 8, 3);
	tiny_run(ref, &c, out);
	expect("attention with one key returns v; GQA head h reads KV head h/2", out,
	       want, 8);
}

static void check_attention_softmax(struct dev *ref)
{
	/* One head of dim 2, keys (0,0) and (ln 3, 0), query (1,0), scale 1:
	 * scores 0 and ln 3, weights 1/4 and 3/4. */
	struct tiny c = {
		.n_heads = 1, .n_kv_heads = 1, .head_dim = 2, .q_len = 1, .kv_len = 2,
		.scale = 1, .q = { 1, 0 },
	};
	const float v[2][2] = { { 4, 8 }, { 8, 0 } };
	const float want[2] = { 0.25f * 4 + 0.75f * 8, 0.25f * 8 };
	/* softcap 1: tanh(ln 3) = 0.8, so weights 1 : e^0.8. */
	const float w1 = expf(0.8f) / (1 + expf(0.8f));
	const float capped[2] = { (1 - w1) * 4 + w1 * 8, (1 - w1) * 8 };
	float out[2];

	c.kc[tiny_slot(1) * 2] = logf(3);
	memcpy(c.vc + tiny_slot(0) * 2, v[0], sizeof(v[0]));
	memcpy(c.vc + tiny_slot(1) * 2, v[1], sizeof(v[1]));
	tiny_run(ref, &c, out);
	expect("attention softmax weights 1/4, 3/4 from scores 0, ln 3", out, want, 2);
	c.softcap = 1;
	tiny_run(ref, &c, out);
	expect("attention softcap 1: score ln 3 becomes tanh(ln 3) = 0.8", out, capped, 2);
}

static void check_attention_causal(struct dev *ref)
{
	/* Prefill of 4 tokens with q = 0: every visible score is 0, so row i
	 * is the mean of v over the tokens it may see. Values v_t = (t, 10t). */
	struct tiny c = {
		.n_heads = 1, .n_kv_heads = 1, .head_dim = 2, .q_len = 4, .kv_len = 4,
		.scale = 1,
	};
	const float causal[8] = { 0, 0, 0.5f, 5, 1, 10, 1.5f, 15 };
	const float window2[8] = { 0, 0, 0.5f, 5, 1.5f, 15, 2.5f, 25 };
	const float decode[2] = { 1.5f, 15 };
	float out[8];

	for (int t = 0; t < 4; t++) {
		c.vc[tiny_slot(t) * 2] = (float)t;
		c.vc[tiny_slot(t) * 2 + 1] = 10.0f * t;
	}
	tiny_run(ref, &c, out);
	expect("attention prefill is causal across blocks {3, 1}", out, causal, 8);
	c.window = 2;
	tiny_run(ref, &c, out);
	expect("attention window 2 sees the token and the one before", out, window2, 8);
	c.window = 0;
	c.q_len = 1;
	tiny_run(ref, &c, out);
	expect("attention decode at position 3 sees all 4 tokens", out, decode, 2);
}

/* f16 bits of small exact values: 1.0 = 0x3c00, 0.5 = 0x3800. */
static void check_quant_layouts(struct dev *ref)
{
	unsigned char q8[34], q4[18];
	float want8[32], want4[32], got[32];
	int32_t id = 0;
	float *out;

	if (!loom_format_get(LOOM_TYPE_Q8_0) || !loom_format_get(LOOM_TYPE_Q4_0)) {
		printf("  skip q8_0/q4_0 layout checks: plugin not registered\n");
		return;
	}
	/* q8_0: f16 scale d, then 32 int8: value i = d * q[i]. */
	q8[0] = 0x00;
	q8[1] = 0x38;
	for (int i = 0; i < 32; i++) {
		q8[2 + i] = (unsigned char)(int8_t)(i - 16);
		want8[i] = 0.5f * (i - 16);
	}
	/* q4_0: f16 d, 16 bytes; value j = d * (low nibble of byte j - 8),
	 * value j + 16 = d * (high nibble of byte j - 8). */
	q4[0] = 0x00;
	q4[1] = 0x3c;
	for (int j = 0; j < 16; j++) {
		q4[2 + j] = (unsigned char)(j | (15 - j) << 4);
		want4[j] = (float)(j - 8);
		want4[j + 16] = (float)(7 - j);
	}
	out = dev_put(ref, NULL, sizeof(got));
	expect_rc("embed q8_0", ref->ops->embed(ref->ctx, out, dev_put(ref, q8, sizeof(q8)),
						LOOM_TYPE_Q8_0, sizeof(q8), 1, 32,
						dev_put(ref, &id, sizeof(id)), 1), LOOM_OK);
	dev_get(ref, got, out, sizeof(got));
	expect("embed of a hand-built q8_0 block (d 0.5)", got, want8, 32);
	expect_rc("embed q4_0", ref->ops->embed(ref->ctx, out, dev_put(ref, q4, sizeof(q4)),
						LOOM_TYPE_Q4_0, sizeof(q4), 1, 32,
						dev_put(ref, &id, sizeof(id)), 1), LOOM_OK);
	dev_get(ref, got, out, sizeof(got));
	expect("embed of a hand-built q4_0 block (d 1)", got, want4, 32);
	dev_reset(ref);
}

static void check_embed(struct dev *ref)
{
	const float table[6] = { 1, 2, 3, 4, 5, 6 };
	const int32_t ids[3] = { 2, 0, 2 };
	const float want[6] = { 5, 6, 1, 2, 5, 6 };
	float got[6];
	float *out = dev_put(ref, NULL, sizeof(got));

	expect_rc("embed f32", ref->ops->embed(ref->ctx, out,
					       dev_put(ref, table, sizeof(table)),
					       LOOM_TYPE_F32, 2 * sizeof(float), 3, 2,
					       dev_put(ref, ids, sizeof(ids)), 3), LOOM_OK);
	dev_get(ref, got, out, sizeof(got));
	expect("embed f32 rows 2, 0, 2", got, want, 6);
	dev_reset(ref);
}

/* ref dequantizes through the host, so it must run every registered format. */
static void check_ref_supports(struct dev *ref)
{
	static const uint32_t types[] = {
		LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,
		LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1,
	};

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		bool reg = types[i] == LOOM_TYPE_F32 || loom_format_get(types[i]);

		if (ref->ops->supports(ref->ctx, LOOM_OP_GEMM, types[i]) != reg ||
		    ref->ops->supports(ref->ctx, LOOM_OP_EMBED, types[i]) != reg) {
			printf("FAIL ref by hand: supports(gemm/embed, %s) is not %s\n",
			       tb_type_name(types[i]), reg ? "true" : "false");
			fails++;
		}
	}
	printf("  ok  supports() matches the registered formats\n");
}

int tb_check_ref_by_hand(struct dev *ref)
{
	tb_seed(1);
	check_gemm(ref);
	check_embed(ref);
	check_quant_layouts(ref);
	check_rmsnorm(ref);
	check_rope(ref);
	check_elementwise(ref);
	check_softcap(ref);
	check_kv_write(ref);
	check_attention_gqa(ref);
	check_attention_softmax(ref);
	check_attention_causal(ref);
	check_ref_supports(ref);
	return fails;
}
