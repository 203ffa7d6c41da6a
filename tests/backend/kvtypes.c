/*
 * KV cache types (backend ABI 1.3): each backend named on the command line
 * (ref, cpu, the GPU kernels through the emulator) writes K/V rows as f32,
 * f16, q8_0 and q4_0 and attends over them, checked against plain C
 * written here:
 *
 *  - loom/kv_quant.h's f16 conversions against the compiler's _Float16
 *    (every half; a million f32 bit patterns and the edge cases), and its
 *    block quantizers against the format's error bound;
 *  - kv_write: the cache bytes of every written slot equal the helpers'
 *    (so every backend stores the same bytes);
 *  - attention over a paged, permuted block table (a decode-like sequence
 *    and a prefill-like one) against a reference that decodes the blocks
 *    with its own code and computes in double;
 *  - a 1.2 host's shorter argument structs mean f32 whatever follows
 *    them; an unknown type is LOOM_ERR_UNSUPPORTED, rows of partial
 *    blocks LOOM_ERR_INVALID.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/kv_quant.h"
#include "plugin/backend_loader.h"

#define HEADS 4
#define KV_HEADS 2
#define HD 64
#define KVD (KV_HEADS * HD)
#define BS 16
#define NBLOCKS 8
#define MAXB 4 /* blocks per sequence */
#define NSEQ 2
#define ROWS 23 /* query rows: 3 of sequence 0, 20 of sequence 1 */
#define NTOK (40 + 20)

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	failures++;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}

static float frand(void)
{
	return (float)((next() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static const uint32_t types[] = { LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0 };
static const char *const names[] = { "f32", "f16", "q8_0", "q4_0" };

/* ---- the helpers against the compiler and the format's bounds ---- */

static uint16_t half_bits(_Float16 h)
{
	uint16_t u;

	memcpy(&u, &h, 2);
	return u;
}

static void check_f16(void)
{
	static const float edge[] = { 0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f,
				      -1e9f, 6.1035156e-05f, 6.0e-05f, 5.96e-08f, 2.98e-08f,
				      2.99e-08f, 1e-10f, INFINITY, -INFINITY, 1.00048828125f,
				      1.000732421875f, 0.33333334f };
	int bad = 0;

	for (uint32_t h = 0; h < 65536; h++) {
		_Float16 x;
		uint16_t b = (uint16_t)h;

		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
			continue; /* NaN */
		memcpy(&x, &b, 2);
		if (loom_kvq_f32_bits(loom_kvq_f16_to_f32(b)) != loom_kvq_f32_bits((float)x) ||
		    loom_kvq_f32_to_f16((float)x) != b)
			bad++;
	}
	for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++)
		if (loom_kvq_f32_to_f16(edge[i]) != half_bits((_Float16)edge[i]))
			fail("f16 of %g: %04x, the compiler says %04x", (double)edge[i],
			     loom_kvq_f32_to_f16(edge[i]), half_bits((_Float16)edge[i]));
	for (int i = 0; i < 1000000; i++) {
		uint32_t u = (uint32_t)next();
		float f = loom_kvq_bits_f32(u);

		if (isnan(f))
			continue;
		if (loom_kvq_f32_to_f16(f) != half_bits((_Float16)f))
			bad++;
	}
	if (bad)
		fail("f16 conversions: %d values differ from _Float16", bad);
}

/* The block quantizers within the format's bounds: half a step (q8_0),
 * a step (q4_0: the value opposite the largest one clamps to 7 steps),
 * plus what rounding the scale to f16 moves the furthest level. */
static void check_blocks(void)
{
	float x[32];
	uint8_t b[34];

	for (int rep = 0; rep < 2000; rep++) {
		float amp = rep % 10 == 0 ? 1e-3f : rep % 7 == 0 ? 300.0f : 2.0f, amax = 0, m = 0;
		float d8, d4, slack8, slack4;

		for (int i = 0; i < 32; i++) {
			x[i] = amp * frand();
			if (fabsf(x[i]) > amax)
				amax = fabsf(x[i]), m = x[i];
		}
		if (rep == 5)
			memset(x, 0, sizeof(x)), amax = m = 0;
		d8 = amax / 127.0f;
		d4 = fabsf(m) / 8.0f;
		slack8 = 127.0f * fabsf(loom_kvq_f16_to_f32(loom_kvq_f32_to_f16(d8)) - d8);
		slack4 = 8.0f * fabsf(loom_kvq_f16_to_f32(loom_kvq_f32_to_f16(d4)) - d4);
		loom_kvq_quantize(LOOM_TYPE_Q8_0, b, x, 32);
		for (int i = 0; i < 32; i++)
			if (fabsf(loom_kvq_value(LOOM_TYPE_Q8_0, b, i) - x[i]) > 0.501f * d8 + slack8)
				fail("q8_0 value %d: %g for %g", i, (double)loom_kvq_value(LOOM_TYPE_Q8_0, b, i),
				     (double)x[i]);
		loom_kvq_quantize(LOOM_TYPE_Q4_0, b, x, 32);
		for (int i = 0; i < 32; i++)
			if (fabsf(loom_kvq_value(LOOM_TYPE_Q4_0, b, i) - x[i]) > 1.001f * d4 + slack4)
				fail("q4_0 value %d: %g for %g", i, (double)loom_kvq_value(LOOM_TYPE_Q4_0, b, i),
				     (double)x[i]);
	}
}

/* ---- an independent decoder for the reference ---- */

static double ref_value(uint32_t type, const uint8_t *row, int64_t i)
{
	_Float16 h;

	switch (type) {
	case LOOM_TYPE_F32: {
		float f;

		memcpy(&f, row + 4 * i, 4);
		return f;
	}
	case LOOM_TYPE_F16:
		memcpy(&h, row + 2 * i, 2);
		return (double)h;
	case LOOM_TYPE_Q8_0: {
		const uint8_t *blk = row + 34 * (i / 32);

		memcpy(&h, blk, 2);
		return (double)h * (int8_t)blk[2 + i % 32];
	}
	default: {
		const uint8_t *blk = row + 18 * (i / 32);
		int j = (int)(i % 32);
		int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);

		memcpy(&h, blk, 2);
		return (double)h * (q - 8);
	}
	}
}

/* ---- one backend ---- */

struct data {
	float k[NTOK][KVD], v[NTOK][KVD], q[ROWS][HEADS * HD];
	int32_t slots[NTOK], q_start[NSEQ + 1], kv_len[NSEQ], table[NSEQ * MAXB];
};

struct dev {
	struct loom_backend *be;
	struct loom_buffer *buf;
	char *base;
	float *kc, *vc, *k, *v, *q, *out;
	int32_t *slots, *q_start, *kv_len, *table;
};

static size_t cache_bytes(void)
{
	return (size_t)NBLOCKS * BS * KVD * sizeof(float);
}

static int dev_open(struct dev *d, const char *name, const struct data *in)
{
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg) };
	const struct loom_backend_ops *o;
	char err[1024];
	size_t off = 0, total = 2 * cache_bytes() + sizeof(*in) + sizeof(in->q);

	memset(d, 0, sizeof(*d));
	d->be = loom_backend_open(name, &cfg, err, sizeof(err));
	if (!d->be) {
		printf("SKIP %s: %s\n", name, err);
		return -1;
	}
	o = d->be->ops;
	if (o->abi_minor < 3) {
		printf("SKIP %s: ABI 1.%u, before KV cache types\n", name, o->abi_minor);
		return -1;
	}
	if (o->buffer_alloc(d->be->ctx, total + 4096, &d->buf))
		return -1;
	d->base = o->buffer_addr(d->be->ctx, d->buf);
#define CARVE(p, n) (p = (void *)(d->base + off), off += ((n) + 255) & ~(size_t)255)
	CARVE(d->kc, cache_bytes());
	CARVE(d->vc, cache_bytes());
	CARVE(d->k, sizeof(in->k));
	CARVE(d->v, sizeof(in->v));
	CARVE(d->q, sizeof(in->q));
	CARVE(d->out, sizeof(in->q));
	CARVE(d->slots, sizeof(in->slots));
	CARVE(d->q_start, sizeof(in->q_start));
	CARVE(d->kv_len, sizeof(in->kv_len));
	CARVE(d->table, sizeof(in->table));
#undef CARVE
	return o->upload(d->be->ctx, d->k, in->k, sizeof(in->k)) ||
	       o->upload(d->be->ctx, d->v, in->v, sizeof(in->v)) ||
	       o->upload(d->be->ctx, d->q, in->q, sizeof(in->q)) ||
	       o->upload(d->be->ctx, d->slots, in->slots, sizeof(in->slots)) ||
	       o->upload(d->be->ctx, d->q_start, in->q_start, sizeof(in->q_start)) ||
	       o->upload(d->be->ctx, d->kv_len, in->kv_len, sizeof(in->kv_len)) ||
	       o->upload(d->be->ctx, d->table, in->table, sizeof(in->table)) ? -1 : 0;
}

static void dev_close(struct dev *d)
{
	if (d->buf)
		d->be->ops->buffer_free(d->be->ctx, d->buf);
	loom_backend_close(d->be);
}

static struct loom_kv_write_args write_args(const struct dev *d, uint32_t type)
{
	return (struct loom_kv_write_args){
		.struct_size = sizeof(struct loom_kv_write_args), .kcache = d->kc, .vcache = d->vc,
		.k = d->k, .v = d->v, .k_stride = KVD, .v_stride = KVD, .n_tokens = NTOK,
		.kv_dim = KVD, .slots = d->slots, .kv_type = type,
	};
}

static struct loom_attention_args attn_args(const struct dev *d, uint32_t type)
{
	return (struct loom_attention_args){
		.struct_size = sizeof(struct loom_attention_args), .out = d->out, .q = d->q,
		.q_stride = HEADS * HD, .out_stride = HEADS * HD, .kcache = d->kc, .vcache = d->vc,
		.n_seqs = NSEQ, .n_heads = HEADS, .n_kv_heads = KV_HEADS, .head_dim = HD,
		.block_size = BS, .max_blocks = MAXB, .q_start = d->q_start, .kv_len = d->kv_len,
		.block_table = d->table, .scale = 0.125f, .kv_type = type,
	};
}

/* The cache bytes of every written slot against the helpers' rows. */
static void check_written(const char *name, const char *tn, uint32_t type,
			  const struct data *in, const uint8_t *kc, const uint8_t *vc)
{
	size_t row = loom_kvq_row_bytes(type, KVD);
	uint8_t want[KVD * 4];

	for (int t = 0; t < NTOK; t++) {
		loom_kvq_quantize(type, want, in->k[t], KVD);
		if (memcmp(kc + (size_t)in->slots[t] * row, want, row))
			fail("%s %s: K row of token %d differs from loom/kv_quant.h's", name, tn, t);
		loom_kvq_quantize(type, want, in->v[t], KVD);
		if (memcmp(vc + (size_t)in->slots[t] * row, want, row))
			fail("%s %s: V row of token %d differs from loom/kv_quant.h's", name, tn, t);
	}
}

/* Reference attention of query row r (sequence s at position pos), head
 * h, over the downloaded cache, in double. */
static void ref_attend(uint32_t type, const struct data *in, const uint8_t *kc,
		       const uint8_t *vc, int s, int r, int pos, int h, double *out)
{
	size_t row = loom_kvq_row_bytes(type, KVD);
	int kvh = h / (HEADS / KV_HEADS);
	double sc[64], mx = -INFINITY, sum = 0;

	for (int t = 0; t <= pos; t++) {
		int slot = in->table[s * MAXB + t / BS] * BS + t % BS;
		double dot = 0;

		for (int i = 0; i < HD; i++)
			dot += in->q[r][h * HD + i] * ref_value(type, kc + slot * row, kvh * HD + i);
		sc[t] = 0.125 * dot;
		mx = sc[t] > mx ? sc[t] : mx;
	}
	for (int i = 0; i < HD; i++)
		out[i] = 0;
	for (int t = 0; t <= pos; t++) {
		int slot = in->table[s * MAXB + t / BS] * BS + t % BS;
		double p = exp(sc[t] - mx);

		sum += p;
		for (int i = 0; i < HD; i++)
			out[i] += p * ref_value(type, vc + slot * row, kvh * HD + i);
	}
	for (int i = 0; i < HD; i++)
		out[i] /= sum;
}

static void check_attention(const char *name, const char *tn, uint32_t type,
			    const struct data *in, const uint8_t *kc, const uint8_t *vc,
			    const float *out)
{
	double want[HD], worst = 0;

	for (int s = 0; s < NSEQ; s++)
		for (int r = in->q_start[s]; r < in->q_start[s + 1]; r++) {
			int pos = in->kv_len[s] - (in->q_start[s + 1] - r);

			for (int h = 0; h < HEADS; h++) {
				ref_attend(type, in, kc, vc, s, r, pos, h, want);
				for (int i = 0; i < HD; i++) {
					double e = fabs(out[r * HEADS * HD + h * HD + i] - want[i]);

					worst = e > worst ? e : worst;
				}
			}
		}
	if (!(worst <= 2e-5))
		fail("%s %s: attention differs from the reference by %g", name, tn, worst);
	else
		printf("ok %s %s: kv_write bytes as loom/kv_quant.h; attention within %.2g of the reference\n",
		       name, tn, worst);
}

static void check_type(struct dev *d, const char *name, int ti, const struct data *in)
{
	const struct loom_backend_ops *o = d->be->ops;
	struct loom_backend_ctx *c = d->be->ctx;
	struct loom_kv_write_args w = write_args(d, types[ti]);
	struct loom_attention_args a = attn_args(d, types[ti]);
	uint8_t *kc = malloc(cache_bytes()), *vc = malloc(cache_bytes());
	float *out = malloc(sizeof(in->q));
	int rc;

	if (!o->supports(c, LOOM_OP_KV_WRITE, types[ti]) ||
	    !o->supports(c, LOOM_OP_ATTENTION, types[ti]))
		fail("%s: supports() denies a %s KV cache", name, names[ti]);
	rc = o->kv_write(c, &w);
	if (!rc)
		rc = o->attention(c, &a);
	if (!rc)
		rc = o->synchronize(c);
	if (!rc)
		rc = o->download(c, kc, d->kc, cache_bytes()) ||
		     o->download(c, vc, d->vc, cache_bytes()) ||
		     o->download(c, out, d->out, sizeof(in->q));
	if (rc) {
		fail("%s %s: kv_write/attention failed (%d)", name, names[ti], rc);
	} else {
		check_written(name, names[ti], types[ti], in, kc, vc);
		check_attention(name, names[ti], types[ti], in, kc, vc, out);
	}
	free(kc);
	free(vc);
	free(out);
}

/* A 1.2 host's structs end before kv_type: f32, whatever bytes follow. */
static void check_old_host(struct dev *d, const char *name, const struct data *in)
{
	const struct loom_backend_ops *o = d->be->ops;
	struct loom_kv_write_args w = write_args(d, LOOM_TYPE_Q4_0);
	struct loom_attention_args a = attn_args(d, LOOM_TYPE_Q4_0);
	uint8_t *kc = malloc(cache_bytes()), *vc = malloc(cache_bytes());
	float *out = malloc(sizeof(in->q));

	w.struct_size = offsetof(struct loom_kv_write_args, kv_type);
	a.struct_size = offsetof(struct loom_attention_args, kv_type);
	if (o->kv_write(d->be->ctx, &w) || o->attention(d->be->ctx, &a) ||
	    o->synchronize(d->be->ctx) ||
	    o->download(d->be->ctx, kc, d->kc, cache_bytes()) ||
	    o->download(d->be->ctx, vc, d->vc, cache_bytes()) ||
	    o->download(d->be->ctx, out, d->out, sizeof(in->q))) {
		fail("%s: a 1.2 host's kv_write/attention failed", name);
	} else {
		check_written(name, "1.2-host", LOOM_TYPE_F32, in, kc, vc);
		check_attention(name, "1.2-host", LOOM_TYPE_F32, in, kc, vc, out);
	}
	free(kc);
	free(vc);
	free(out);
}

static void check_refusals(struct dev *d, const char *name)
{
	const struct loom_backend_ops *o = d->be->ops;
	struct loom_kv_write_args w = write_args(d, 99);
	struct loom_attention_args a = attn_args(d, 99);
	int rc;

	if ((rc = o->kv_write(d->be->ctx, &w)) != LOOM_ERR_UNSUPPORTED)
		fail("%s: kv_write of type 99 gave %d, not LOOM_ERR_UNSUPPORTED", name, rc);
	if ((rc = o->attention(d->be->ctx, &a)) != LOOM_ERR_UNSUPPORTED)
		fail("%s: attention of type 99 gave %d, not LOOM_ERR_UNSUPPORTED", name, rc);
	if (o->supports(d->be->ctx, LOOM_OP_KV_WRITE, 99))
		fail("%s: supports() a KV cache of type 99", name);
	w = write_args(d, LOOM_TYPE_Q8_0);
	w.kv_dim = 48; /* a block and a half */
	w.k_stride = w.v_stride = 48;
	if ((rc = o->kv_write(d->be->ctx, &w)) != LOOM_ERR_INVALID)
		fail("%s: q8_0 kv_write of 48-value rows gave %d, not LOOM_ERR_INVALID", name, rc);
	a = attn_args(d, LOOM_TYPE_Q4_0);
	a.head_dim = 16;
	if ((rc = o->attention(d->be->ctx, &a)) != LOOM_ERR_INVALID)
		fail("%s: q4_0 attention with head_dim 16 gave %d, not LOOM_ERR_INVALID", name, rc);
	o->synchronize(d->be->ctx);
}

static void make_data(struct data *in)
{
	/* sequence 0: 40 tokens in blocks 5, 2, 7 (3 decode-like queries at
	 * the end); sequence 1: 20 tokens in blocks 0, 6, all queried */
	static const int32_t table[NSEQ * MAXB] = { 5, 2, 7, 0, 0, 6, 0, 0 };

	memcpy(in->table, table, sizeof(table));
	for (int t = 0; t < NTOK; t++) {
		int s = t < 40 ? 0 : 1, p = s ? t - 40 : t;

		in->slots[t] = in->table[s * MAXB + p / BS] * BS + p % BS;
		for (int i = 0; i < KVD; i++) {
			/* a few large values per row, as real keys have */
			float big = i % 37 == 3 ? 8.0f : 1.0f;

			in->k[t][i] = big * frand();
			in->v[t][i] = big * frand();
		}
	}
	for (int r = 0; r < ROWS; r++)
		for (int i = 0; i < HEADS * HD; i++)
			in->q[r][i] = frand();
	in->q_start[0] = 0, in->q_start[1] = 3, in->q_start[2] = ROWS;
	in->kv_len[0] = 40, in->kv_len[1] = 20;
}

int main(int argc, char **argv)
{
	static struct data in;

	check_f16();
	check_blocks();
	make_data(&in);
	for (int i = 1; i < argc; i++) {
		struct dev d;

		if (dev_open(&d, argv[i], &in)) {
			if (d.be)
				dev_close(&d);
			continue;
		}
		for (int t = 0; t < 4; t++)
			check_type(&d, d.be->ops->name, t, &in);
		check_old_host(&d, d.be->ops->name, &in);
		check_refusals(&d, d.be->ops->name);
		dev_close(&d);
	}
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
