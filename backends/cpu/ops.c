/*
 * Row-wise operators of the cpu backend: embed, rmsnorm, rope, glu, add,
 * scale and kv_write. Each validates its arguments, then runs over rows,
 * split across the pool only when the op is large (prefill).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "kpack.h"
#include "loom/kv_quant.h"
#include "loom/moe.h"

/* ---- embed ---- */

struct embed_args {
	float *out;
	const uint8_t *table;
	uint32_t type;
	size_t row_bytes;
	int64_t dim;
	const int32_t *ids;
};

static void embed_rows(struct loom_backend_ctx *ctx, const void *p, int64_t r0, int64_t r1)
{
	const struct embed_args *a = p;

	for (int64_t r = r0; r < r1; r++)
		cpu_dequant_row(ctx->isa, a->type, a->table + (size_t)a->ids[r] * a->row_bytes,
				a->out + r * a->dim, a->dim);
}

/* Rows of a table weight_pack packed (ABI 1.5, row_bytes 0): each back to
 * its GGUF bytes (kpack_unpack_row, byte for byte), then as above. */
static int embed_packed(struct loom_backend_ctx *ctx, const struct embed_args *a, int64_t n_ids)
{
	const int64_t nb = a->dim / cpu_block_elems(a->type);
	uint8_t *row = malloc((size_t)nb * cpu_block_bytes(a->type));

	if (!row)
		return LOOM_ERR_NOMEM;
	for (int64_t r = 0; r < n_ids; r++) {
		kpack_unpack_row(a->type, a->table, nb, a->ids[r], row);
		cpu_dequant_row(ctx->isa, a->type, row, a->out + r * a->dim, a->dim);
	}
	free(row);
	return LOOM_OK;
}

int cpu_embed(struct loom_backend_ctx *ctx, float *out, const void *table, uint32_t type,
	      size_t row_bytes, int64_t n_rows, int64_t dim, const int32_t *ids, int64_t n_ids)
{
	struct embed_args a = { out, table, type, row_bytes, dim, ids };
	bool packed = row_bytes == 0 && dim > 0;
	size_t need;

	if (!ctx || n_rows < 0 || dim < 0 || n_ids < 0)
		return LOOM_ERR_INVALID;
	if (!cpu_format_known(type))
		return LOOM_ERR_UNSUPPORTED;
	if (dim % cpu_block_elems(type) ||
	    (uint64_t)(dim / cpu_block_elems(type)) > (uint64_t)(INT64_MAX / 16) / cpu_block_bytes(type))
		return LOOM_ERR_INVALID;
	need = (size_t)(dim / cpu_block_elems(type)) * cpu_block_bytes(type);
	if (packed) { /* a table of this backend's layout: its rows' size */
		if (!ctx->pack || !kpack_format(type))
			return LOOM_ERR_INVALID;
		row_bytes = kpack_row_share(type, kpack_nb(type, dim));
		if (!row_bytes)
			return LOOM_ERR_INVALID;
	}
	if (row_bytes < need || !loom_check_shape(n_ids, dim, dim))
		return LOOM_ERR_INVALID;
	if (row_bytes > 0 && (uint64_t)n_rows > (uint64_t)(INT64_MAX / 16) / row_bytes)
		return LOOM_ERR_INVALID;
	if (n_ids == 0)
		return LOOM_OK;
	if (!out || !ids || (!table && dim > 0))
		return LOOM_ERR_INVALID;
	for (int64_t i = 0; i < n_ids; i++)
		if (ids[i] < 0 || ids[i] >= n_rows)
			return LOOM_ERR_INVALID;
	if (dim == 0)
		return LOOM_OK;
	if (ctx->rg.open) {
		struct cpu_call c = { .op = CPU_CALL_EMBED };

		c.u.embed.out = out, c.u.embed.table = table, c.u.embed.type = type;
		c.u.embed.row_bytes = packed ? 0 : row_bytes, c.u.embed.n_rows = n_rows;
		c.u.embed.dim = dim, c.u.embed.ids = ids, c.u.embed.n_ids = n_ids;
		return cpu_region_record(ctx, &c);
	}
	if (packed)
		return embed_packed(ctx, &a, n_ids);
	cpu_run_rows(ctx, embed_rows, &a, n_ids, (double)n_ids * dim);
	return LOOM_OK;
}

/* ---- rmsnorm ---- */

void cpu_rmsnorm_row(const struct cpu_rmsnorm_args *a, int64_t r, float *y)
{
	const float *x = a->x + r * a->x_stride;
	double ss = 0.0; /* in double, as the reference does */
	float scale;

	for (int64_t i = 0; i < a->n; i++)
		ss += (double)x[i] * x[i];
	scale = (float)(1.0 / sqrt(ss / a->n + a->eps));

	for (int64_t i = 0; i < a->n; i++)
		y[i] = x[i] * scale * a->w[i];
}

static void rmsnorm_rows(struct loom_backend_ctx *ctx, const void *p, int64_t r0, int64_t r1)
{
	const struct cpu_rmsnorm_args *a = p;

	(void)ctx;
	for (int64_t r = r0; r < r1; r++)
		cpu_rmsnorm_row(a, r, a->y + r * a->y_stride);
}

int cpu_rmsnorm(struct loom_backend_ctx *ctx, float *y, int64_t y_stride, const float *x,
		int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps)
{
	struct cpu_rmsnorm_args a = { y, y_stride, x, x_stride, w, rows, n, eps };

	if (!ctx || !loom_check_shape(rows, n, x_stride) || !loom_check_shape(rows, n, y_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!y || !x || !w)
		return LOOM_ERR_INVALID;
	if (ctx->rg.open)
		return cpu_region_record(ctx, &(struct cpu_call){ .op = CPU_CALL_RMSNORM,
								  .u.rmsnorm = a });
	cpu_run_rows(ctx, rmsnorm_rows, &a, rows, (double)rows * n);
	return LOOM_OK;
}

/* ---- rope ---- */

/* Pairs per chunk whose cos/sin are computed once per token. */
#define ROPE_CHUNK 64

/* cos and sin of pair i's angle at position pos, in double exactly as
 * the reference computes them. */
static void rope_angle(const struct loom_rope_args *a, int32_t pos, int64_t i, float *c, float *s)
{
	double theta = (double)pos * a->freq_scale *
		       pow(a->freq_base, -2.0 * (double)i / (double)a->n_rot);

	if (a->freq_factors)
		theta /= a->freq_factors[i];
	*c = (float)cos(theta);
	*s = (float)sin(theta);
}

/* Rotates pairs c0 .. c1 - 1 of every head of one token's row. */
static void rope_apply(const struct loom_rope_args *a, float *row, int64_t c0, int64_t c1,
		       const float *cs, const float *sn)
{
	const int64_t half = a->n_rot / 2;

	for (int64_t h = 0; h < a->n_heads; h++) {
		float *x = row + h * a->head_dim;

		for (int64_t i = c0; i < c1; i++) {
			int64_t i0 = a->mode == LOOM_ROPE_NEOX ? i : 2 * i;
			int64_t i1 = a->mode == LOOM_ROPE_NEOX ? i + half : 2 * i + 1;
			float x0 = x[i0], x1 = x[i1];

			x[i0] = x0 * cs[i - c0] - x1 * sn[i - c0];
			x[i1] = x0 * sn[i - c0] + x1 * cs[i - c0];
		}
	}
}

static void rope_rows(struct loom_backend_ctx *ctx, const void *p, int64_t t0, int64_t t1)
{
	const struct loom_rope_args *a = p;
	const int64_t half = a->n_rot / 2;
	float cs[ROPE_CHUNK], sn[ROPE_CHUNK];

	(void)ctx;
	for (int64_t t = t0; t < t1; t++) {
		float *row = a->x + t * a->row_stride;

		for (int64_t c0 = 0; c0 < half; c0 += ROPE_CHUNK) {
			int64_t c1 = c0 + ROPE_CHUNK < half ? c0 + ROPE_CHUNK : half;

			for (int64_t i = c0; i < c1; i++)
				rope_angle(a, a->pos[t], i, &cs[i - c0], &sn[i - c0]);
			rope_apply(a, row, c0, c1, cs, sn);
		}
	}
}

/*
 * One token (a decode step's row): its cos/sin from ctx->rope_cache when
 * an earlier call had the same position and frequencies (the q and k of
 * every layer share them). freq_factors is compared by address: it is a
 * weight, which does not change while loaded.
 */
static void rope_one_cached(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	const int64_t half = a->n_rot / 2;
	struct cpu_rope_cache *c = NULL;

	for (int e = 0; e < 2; e++) {
		struct cpu_rope_cache *k = &ctx->rope_cache[e];

		if (k->valid && k->pos == a->pos[0] && k->n_rot == a->n_rot &&
		    k->base == a->freq_base && k->scale == a->freq_scale &&
		    k->factors == a->freq_factors)
			c = k;
	}
	if (!c) {
		c = &ctx->rope_cache[ctx->rope_next];
		ctx->rope_next ^= 1;
		*c = (struct cpu_rope_cache){ .valid = true, .pos = a->pos[0], .n_rot = a->n_rot,
			.base = a->freq_base, .scale = a->freq_scale, .factors = a->freq_factors };
		for (int64_t i = 0; i < half; i++)
			rope_angle(a, a->pos[0], i, &c->cs[i], &c->sn[i]);
	}
	rope_apply(a, a->x, 0, half, c->cs, c->sn);
}

/* A multi-token call's rows with their cos/sin from a table. */
struct rope_tab_args {
	const struct loom_rope_args *a;
	const struct cpu_rope_table *tab;
};

static void rope_rows_tab(struct loom_backend_ctx *ctx, const void *p, int64_t t0, int64_t t1)
{
	const struct rope_tab_args *ra = p;
	const struct loom_rope_args *a = ra->a;
	const int64_t half = a->n_rot / 2;

	(void)ctx;
	for (int64_t t = t0; t < t1; t++)
		rope_apply(a, a->x + t * a->row_stride, 0, half, ra->tab->cs + a->pos[t] * half,
			   ra->tab->sn + a->pos[t] * half);
}

/* The table for a's frequencies, grown to hold positions below need
 * (NULL when out of memory). */
static struct cpu_rope_table *rope_table(struct loom_backend_ctx *ctx,
					const struct loom_rope_args *a, int64_t need)
{
	const int64_t half = a->n_rot / 2;
	struct cpu_rope_table *t = NULL;

	for (int e = 0; e < 2; e++) {
		struct cpu_rope_table *k = &ctx->rope_tab[e];

		if (k->valid && k->n_rot == a->n_rot && k->base == a->freq_base &&
		    k->scale == a->freq_scale && k->factors == a->freq_factors)
			t = k;
	}
	if (!t) {
		t = &ctx->rope_tab[ctx->rope_tab_next];
		ctx->rope_tab_next ^= 1;
		free(t->have), free(t->cs), free(t->sn);
		*t = (struct cpu_rope_table){ .valid = true, .base = a->freq_base,
			.scale = a->freq_scale, .factors = a->freq_factors, .n_rot = a->n_rot };
	}
	if (need > t->cap) {
		int64_t cap = need > 2 * t->cap ? need : 2 * t->cap;
		uint8_t *have;
		float *cs, *sn;

		cap = cap < CPU_ROPE_TABLE_POS ? cap : CPU_ROPE_TABLE_POS;
		have = realloc(t->have, (size_t)cap);
		if (have)
			t->have = have;
		cs = have ? realloc(t->cs, sizeof(float) * (size_t)(cap * half)) : NULL;
		if (cs)
			t->cs = cs;
		sn = cs ? realloc(t->sn, sizeof(float) * (size_t)(cap * half)) : NULL;
		if (!sn)
			return NULL; /* the old cap still describes what is there */
		t->sn = sn;
		memset(t->have + t->cap, 0, (size_t)(cap - t->cap));
		t->cap = cap;
	}
	return t;
}

/* Runs a multi-token call from the table; false when a position lies
 * outside it (or memory ran out): the caller computes the angles. */
static bool rope_from_table(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	const int64_t half = a->n_rot / 2;
	struct cpu_rope_table *t;
	int32_t top = 0;

	for (int64_t i = 0; i < a->n_tokens; i++) {
		if (a->pos[i] < 0 || a->pos[i] >= CPU_ROPE_TABLE_POS)
			return false;
		top = a->pos[i] > top ? a->pos[i] : top;
	}
	t = rope_table(ctx, a, (int64_t)top + 1);
	if (!t)
		return false;
	for (int64_t i = 0; i < a->n_tokens; i++) {
		const int32_t p = a->pos[i];

		if (t->have[p])
			continue;
		for (int64_t e = 0; e < half; e++)
			rope_angle(a, p, e, &t->cs[p * half + e], &t->sn[p * half + e]);
		t->have[p] = 1;
	}
	cpu_run_rows(ctx, rope_rows_tab, &(struct rope_tab_args){ a, t }, a->n_tokens,
		     (double)a->n_tokens * a->n_heads * a->n_rot * 4);
	return true;
}

void cpu_rope_tables_free(struct loom_backend_ctx *ctx)
{
	for (int e = 0; e < 2; e++) {
		free(ctx->rope_tab[e].have);
		free(ctx->rope_tab[e].cs);
		free(ctx->rope_tab[e].sn);
		ctx->rope_tab[e] = (struct cpu_rope_table){ 0 };
	}
}

int cpu_rope(struct loom_backend_ctx *ctx, const struct loom_rope_args *a)
{
	int rc = ctx ? loom_check_rope(a) : LOOM_ERR_INVALID;

	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	if (ctx->rg.open) {
		struct cpu_call c = { .op = CPU_CALL_ROPE };

		cpu_region_copy_args(&c.u.rope, sizeof(c.u.rope), a);
		return cpu_region_record(ctx, &c);
	}
	if (a->n_tokens == 1 && a->n_rot / 2 <= CPU_ROPE_CACHE_PAIRS) {
		rope_one_cached(ctx, a);
		return LOOM_OK;
	}
	if (rope_from_table(ctx, a))
		return LOOM_OK;
	cpu_run_rows(ctx, rope_rows, a, a->n_tokens,
		     (double)a->n_tokens * a->n_heads * a->n_rot * 4);
	return LOOM_OK;
}

/* ---- glu ---- */

/* exact mode's (ref.so's) arithmetic; fast mode runs vexp.c's */
static inline float silu(float g)
{
	return g / (1.0f + expf(-g));
}

static inline float gelu_tanh(float g)
{
	const float c = 0.7978845608028654f; /* sqrt(2 / pi) */

	return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g)));
}

/* Columns [j0, j1) of row r. */
static void glu_row(const struct loom_backend_ctx *ctx, const struct cpu_glu_args *a, int64_t r,
		    int64_t j0, int64_t j1)
{
	const float *g = a->gate + r * a->gate_stride + j0;
	const float *u = a->up + r * a->up_stride + j0;
	float *o = a->out + r * a->out_stride + j0;

	if (a->kind == LOOM_GLU_SWIGLU_OAI) /* both modes: loom/moe.h's formula */
		for (int64_t i = 0; i < j1 - j0; i++)
			o[i] = loom_glu_swiglu_oai(g[i], u[i]);
	else if (!ctx->exact)
		cpu_glu_row_fast(ctx->isa, a->kind, o, g, u, j1 - j0);
	else if (a->kind == LOOM_GLU_SILU)
		for (int64_t i = 0; i < j1 - j0; i++)
			o[i] = silu(g[i]) * u[i];
	else
		for (int64_t i = 0; i < j1 - j0; i++)
			o[i] = gelu_tanh(g[i]) * u[i];
}

static void glu_rows(struct loom_backend_ctx *ctx, const void *p, int64_t r0, int64_t r1)
{
	const struct cpu_glu_args *a = p;

	for (int64_t r = r0; r < r1; r++)
		glu_row(ctx, a, r, 0, a->n);
}

void cpu_glu_cols(const struct loom_backend_ctx *ctx, const struct cpu_glu_args *a, int64_t j0,
		  int64_t j1)
{
	for (int64_t r = 0; r < a->rows; r++)
		glu_row(ctx, a, r, j0, j1);
}

int cpu_glu(struct loom_backend_ctx *ctx, enum loom_glu_kind kind, float *out,
	    int64_t out_stride, const float *gate, int64_t gate_stride, const float *up,
	    int64_t up_stride, int64_t rows, int64_t n)
{
	struct cpu_glu_args a = { kind, out, out_stride, gate, gate_stride, up, up_stride, rows, n };

	if (!ctx || (kind != LOOM_GLU_SILU && kind != LOOM_GLU_GELU_TANH &&
		     kind != LOOM_GLU_SWIGLU_OAI))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(rows, n, out_stride) || !loom_check_shape(rows, n, gate_stride) ||
	    !loom_check_shape(rows, n, up_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !gate || !up)
		return LOOM_ERR_INVALID;
	if (ctx->rg.open)
		return cpu_region_record(ctx, &(struct cpu_call){ .op = CPU_CALL_GLU, .u.glu = a });
	cpu_run_rows(ctx, glu_rows, &a, rows, (double)rows * n * 16);
	return LOOM_OK;
}

/* ---- add, scale ---- */

/* Columns [j0, j1) of row r. */
static void add_row(const struct cpu_add_args *a, int64_t r, int64_t j0, int64_t j1)
{
	const float *x = a->a + r * a->a_stride;
	const float *y = a->b + (a->b_rows == 1 ? 0 : r) * a->b_stride;
	float *o = a->out + r * a->out_stride;

	for (int64_t i = j0; i < j1; i++)
		o[i] = x[i] + y[i];
}

static void add_rows(struct loom_backend_ctx *ctx, const void *p, int64_t r0, int64_t r1)
{
	const struct cpu_add_args *a = p;

	(void)ctx;
	for (int64_t r = r0; r < r1; r++)
		add_row(a, r, 0, a->n);
}

void cpu_add_cols(const struct cpu_add_args *a, int64_t j0, int64_t j1)
{
	for (int64_t r = 0; r < a->rows; r++)
		add_row(a, r, j0, j1);
}

int cpu_add(struct loom_backend_ctx *ctx, float *out, int64_t out_stride, const float *a,
	    int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows, int64_t rows,
	    int64_t n)
{
	struct cpu_add_args args = { out, out_stride, a, a_stride, b, b_stride, b_rows, rows, n };

	if (!ctx || (b_rows != 1 && b_rows != rows))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(rows, n, out_stride) || !loom_check_shape(rows, n, a_stride) ||
	    !loom_check_shape(b_rows, n, b_stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!out || !a || !b)
		return LOOM_ERR_INVALID;
	if (ctx->rg.open)
		return cpu_region_record(ctx, &(struct cpu_call){ .op = CPU_CALL_ADD, .u.add = args });
	cpu_run_rows(ctx, add_rows, &args, rows, (double)rows * n);
	return LOOM_OK;
}

struct scale_args {
	float *x;
	int64_t stride, n;
	float s;
};

static void scale_rows(struct loom_backend_ctx *ctx, const void *p, int64_t r0, int64_t r1)
{
	const struct scale_args *a = p;

	for (int64_t r = r0; r < r1; r++) {
		float *x = a->x + r * a->stride;

		for (int64_t i = 0; i < a->n; i++)
			x[i] *= a->s;
	}
}

static int record_scale(struct loom_backend_ctx *ctx, enum cpu_call_op op, float *x,
			int64_t stride, int64_t rows, int64_t n, float s)
{
	struct cpu_call c = { .op = op };

	c.u.scale.x = x, c.u.scale.stride = stride, c.u.scale.rows = rows;
	c.u.scale.n = n, c.u.scale.s = s;
	return cpu_region_record(ctx, &c);
}

int cpu_scale(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows, int64_t n,
	      float s)
{
	struct scale_args a = { x, stride, n, s };

	if (!ctx || !loom_check_shape(rows, n, stride))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!x)
		return LOOM_ERR_INVALID;
	if (ctx->rg.open)
		return record_scale(ctx, CPU_CALL_SCALE, x, stride, rows, n, s);
	cpu_run_rows(ctx, scale_rows, &a, rows, (double)rows * n);
	return LOOM_OK;
}

/* Soft-capping reuses scale's arguments: s is the cap. */
static void softcap_rows(struct loom_backend_ctx *ctx, const void *p, int64_t r0, int64_t r1)
{
	const struct scale_args *a = p;

	for (int64_t r = r0; r < r1; r++) {
		float *x = a->x + r * a->stride;

		for (int64_t i = 0; i < a->n; i++)
			x[i] = a->s * tanhf(x[i] / a->s);
	}
}

int cpu_softcap(struct loom_backend_ctx *ctx, float *x, int64_t stride, int64_t rows,
		int64_t n, float cap)
{
	struct scale_args a = { x, stride, n, cap };

	if (!ctx || !loom_check_shape(rows, n, stride) || !(cap > 0.0f) || isinf(cap))
		return LOOM_ERR_INVALID;
	if (rows == 0 || n == 0)
		return LOOM_OK;
	if (!x)
		return LOOM_ERR_INVALID;
	if (ctx->rg.open)
		return record_scale(ctx, CPU_CALL_SOFTCAP, x, stride, rows, n, cap);
	cpu_run_rows(ctx, softcap_rows, &a, rows, (double)rows * n * 8);
	return LOOM_OK;
}

/* ---- kv_write ---- */

int cpu_kv_write(struct loom_backend_ctx *ctx, const struct loom_kv_write_args *a)
{
	uint32_t type;
	size_t row;
	int rc;

	rc = ctx ? loom_check_kv_write(a) : LOOM_ERR_INVALID;
	if (rc != LOOM_CHECK_RUN)
		return rc == LOOM_CHECK_NOTHING ? LOOM_OK : rc;
	type = LOOM_KV_TYPE(a, struct loom_kv_write_args);
	rc = loom_check_kv_type(type, a->kv_dim);
	if (rc)
		return rc;
	if (!loom_check_slots(a->slots, a->n_tokens, a->kv_dim))
		return LOOM_ERR_INVALID;
	if (ctx->rg.open) {
		struct cpu_call c = { .op = CPU_CALL_KV_WRITE };

		cpu_region_copy_args(&c.u.kv_write, sizeof(c.u.kv_write), a);
		return cpu_region_record(ctx, &c);
	}
	/* the shared quantizers: the same bytes as ref.so writes */
	row = loom_kvq_row_bytes(type, a->kv_dim);
	for (int64_t t = 0; t < a->n_tokens; t++) {
		size_t off = (size_t)a->slots[t] * row;

		loom_kvq_quantize(type, (char *)a->kcache + off, a->k + t * a->k_stride, a->kv_dim);
		loom_kvq_quantize(type, (char *)a->vcache + off, a->v + t * a->v_stride, a->kv_dim);
	}
	return LOOM_OK;
}
