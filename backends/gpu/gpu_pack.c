/*
 * gpu_pack.c: the weight_pack slot (ABI 1.2) of the GPU backends.
 *
 * GGUF's q4_0, q8_0 and q6_K blocks are 18, 34 and 210 bytes, so their
 * quants are only 2-byte aligned and a kernel reads them 2 or 4 bytes at
 * a time. At load this file repacks such a weight into the layout of
 * gpu_rt.h: per row the quants of every block (16, 32 or 208 bytes each,
 * GGUF's byte order), then the blocks' f16 scales d, the row padded to 16
 * bytes, so the GEMV and the int8 GEMM read quants 16 bytes a load. Same values, same
 * arithmetic: a gemm on a packed weight gives the GGUF layout's bits in
 * both modes (the ABI's rule, held by backend_invariance's pack-gemm).
 *
 * A packed gemm passes only the buffer's address; a table keyed by
 * address (open addressing) gives back its type, shape and row stride.
 * LOOM_GPU_PACK=0 turns packing off (the weights then stay in GGUF
 * layout, for comparisons).
 */
#include <stdlib.h>
#include <string.h>

#include "gpu_ctx.h"

#define PACK_CHUNK ((size_t)16 << 20) /* host bytes packed and uploaded at a time */

static size_t slot_of(const void *p, size_t cap)
{
	uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;

	return (size_t)(h >> 32) & (cap - 1);
}

/* Puts e in a table of cap (a power of two) slots with room. */
static void put(struct gpu_pack *tab, size_t cap, const struct gpu_pack *e)
{
	size_t i = slot_of(e->ptr, cap);

	while (tab[i].ptr)
		i = (i + 1) & (cap - 1);
	tab[i] = *e;
}

static int remember(struct loom_backend_ctx *ctx, const struct gpu_pack *e)
{
	if (2 * (ctx->n_packs + 1) > ctx->packs_cap) {
		size_t cap = ctx->packs_cap ? 2 * ctx->packs_cap : 64;
		struct gpu_pack *tab = calloc(cap, sizeof(*tab));

		if (!tab)
			return LOOM_ERR_NOMEM;
		for (size_t i = 0; i < ctx->packs_cap; i++)
			if (ctx->packs[i].ptr)
				put(tab, cap, &ctx->packs[i]);
		free(ctx->packs);
		ctx->packs = tab;
		ctx->packs_cap = cap;
	}
	put(ctx->packs, ctx->packs_cap, e);
	ctx->n_packs++;
	return LOOM_OK;
}

const struct gpu_pack *gpu_pack_find(const struct loom_backend_ctx *ctx, const void *ptr)
{
	if (!ptr || !ctx->n_packs)
		return NULL;
	for (size_t i = slot_of(ptr, ctx->packs_cap); ctx->packs[i].ptr;
	     i = (i + 1) & (ctx->packs_cap - 1))
		if (ctx->packs[i].ptr == ptr)
			return &ctx->packs[i];
	return NULL;
}

/* Removes ptr's entry and re-inserts the run after it (linear probing
 * has no tombstones). */
void gpu_pack_forget(struct loom_backend_ctx *ctx, const void *ptr)
{
	const struct gpu_pack *e = gpu_pack_find(ctx, ptr);
	size_t i, cap = ctx->packs_cap;

	if (!e)
		return;
	i = (size_t)(e - ctx->packs);
	memset(&ctx->packs[i], 0, sizeof(ctx->packs[i]));
	ctx->n_packs--;
	for (i = (i + 1) & (cap - 1); ctx->packs[i].ptr; i = (i + 1) & (cap - 1)) {
		struct gpu_pack moved = ctx->packs[i];

		memset(&ctx->packs[i], 0, sizeof(ctx->packs[i]));
		put(ctx->packs, cap, &moved);
	}
}

void packs_free(struct loom_backend_ctx *ctx)
{
	free(ctx->packs);
	ctx->packs = NULL;
	ctx->packs_cap = ctx->n_packs = 0;
}

/* A packed format's GGUF block: values, and where its f16 scale d sits
 * (q4_0, q8_0: first; q6_K: last); the rest (q bytes) are its quants. */
struct pack_geom {
	int64_t elems;
	size_t q, d_at;
};

static bool geom_of(uint32_t type, struct pack_geom *g)
{
	switch (type) {
	case LOOM_TYPE_Q4_0: *g = (struct pack_geom){ 32, 16, 0 }; return true;
	case LOOM_TYPE_Q8_0: *g = (struct pack_geom){ 32, 32, 0 }; return true;
	case LOOM_TYPE_Q6_K: *g = (struct pack_geom){ 256, 208, 208 }; return true;
	default: return false;
	}
}

/* Rows r0 .. r0 + rows - 1 of a GGUF weight into dst in the packed layout
 * (row bytes apart): each block's quants, then each block's d. */
static void pack_rows(const struct loom_weight_pack_args *a, const struct pack_geom *g,
		      int64_t r0, int64_t rows, size_t row, unsigned char *dst)
{
	const size_t blocks = (size_t)(a->k / g->elems), bb = g->q + 2;
	const size_t q_at = g->d_at ? 0 : 2;

	memset(dst, 0, (size_t)rows * row);
	for (int64_t r = 0; r < rows; r++) {
		const unsigned char *src = (const unsigned char *)a->src + (size_t)(r0 + r) * a->src_stride;
		unsigned char *quants = dst + (size_t)r * row, *scales = quants + blocks * g->q;

		for (size_t b = 0; b < blocks; b++) {
			memcpy(scales + 2 * b, src + b * bb + g->d_at, 2);
			memcpy(quants + b * g->q, src + b * bb + q_at, g->q);
		}
	}
}

int gpu_weight_pack(struct loom_backend_ctx *ctx, const struct loom_weight_pack_args *a,
		    struct loom_buffer **out, size_t *bytes)
{
	struct gpu_pack e;
	struct pack_geom g;
	struct loom_buffer *buf = NULL;
	unsigned char *host = NULL;
	size_t row, total, chunk_rows;
	int rc;

	if (!ctx || !a || !out || !bytes ||
	    !LOOM_ARGS_HAS(a, struct loom_weight_pack_args, src_stride))
		return LOOM_ERR_INVALID;
	*out = NULL;
	*bytes = 0;
	if (!ctx->pack || !geom_of(a->type, &g))
		return LOOM_ERR_UNSUPPORTED;
	row = gpurt_packed_row(a->type, a->k);
	if (a->n <= 0 || !row || !a->src || a->src_stride < (size_t)(a->k / g.elems) * (g.q + 2))
		return LOOM_ERR_INVALID;
	if (__builtin_mul_overflow((size_t)a->n, row, &total))
		return LOOM_ERR_NOMEM;
	chunk_rows = PACK_CHUNK / row ? PACK_CHUNK / row : 1;
	if (chunk_rows > (size_t)a->n)
		chunk_rows = (size_t)a->n;
	host = malloc(chunk_rows * row);
	if (!host)
		return LOOM_ERR_NOMEM;
	rc = gpu_buffer_alloc(ctx, total, &buf);
	for (int64_t r0 = 0; !rc && r0 < a->n; r0 += (int64_t)chunk_rows) {
		int64_t rows = a->n - r0 < (int64_t)chunk_rows ? a->n - r0 : (int64_t)chunk_rows;

		pack_rows(a, &g, r0, rows, row, host);
		rc = rt_failed(ctx, gpurt_upload(ctx->rt, (char *)gpu_buffer_addr(ctx, buf) +
							  (size_t)r0 * row,
						 host, (size_t)rows * row));
	}
	free(host);
	e = (struct gpu_pack){ gpu_buffer_addr(ctx, buf), a->type | GPU_TYPE_PACKED, a->n, a->k,
			       row };
	if (!rc)
		rc = remember(ctx, &e);
	if (rc) {
		gpu_buffer_free(ctx, buf);
		return rc;
	}
	ctx->n_packed++;
	ctx->packed_bytes += total;
	*out = buf;
	*bytes = total;
	return LOOM_OK;
}

/* The layout type and row stride a gemm on packed weight w of base type,
 * n rows (at most the pack's) and k values reads; LOOM_ERR_INVALID when
 * w is not such a pack of this context. */
int gpu_pack_view(const struct loom_backend_ctx *ctx, const void *w, uint32_t type, int64_t n,
		  int64_t k, uint32_t *view_type, size_t *row)
{
	const struct gpu_pack *p = gpu_pack_find(ctx, w);

	if (!p || (p->type & ~GPU_TYPE_PACKED) != type || n > p->n || k != p->k)
		return LOOM_ERR_INVALID;
	*view_type = p->type;
	*row = p->row;
	return LOOM_OK;
}
