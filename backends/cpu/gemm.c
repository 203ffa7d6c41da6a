/*
 * gemm: y = x . W^T.
 *
 * Decode (m < BLAS_MIN_M) is a memory-bound GEMV: the n weight rows are split
 * evenly over the pool and each thread streams its rows once through the
 * SIMD kernels (each group of 4 rows prefetched whole before it is read).
 *
 * Fast mode (the default; not LOOM_BACKEND_EXACT) runs the GEMV path of
 * the formats qdot.c and qdot_k.c know as integer dot products: each
 * activation row is quantized once to 8-bit blocks (by one function,
 * whichever thread runs it), then each thread streams its weight rows
 * against the quantized rows; on AVX-512 VNNI the weights are in the
 * packed layout (kpack.h) when the host let the backend pack them. A row's
 * result depends only on that row and the weights, so batch invariance and
 * thread-count independence hold as they do in exact mode. Fast-mode
 * prefill (m >= BLAS_MIN_M, not batch invariant) of the 32-value block
 * formats runs qgemm.h's integer GEMM over interleaved 16-row panels, or,
 * packed on AVX-512 VNNI where the GEMV has qgemm's bits (qdot_seq()), up
 * to SEQ_GEMV_MAX_M rows through the packed many-row GEMV.
 *
 * Otherwise prefill (m >= BLAS_MIN_M) is compute-bound: each thread
 * dequantizes panels of its weight rows to f32 in its scratch and multiplies
 * them with single-threaded OpenBLAS sgemm (OpenBLAS's own threads are
 * switched off in create(), so nothing oversubscribes the pool).
 *
 * Batch invariant contexts (LOOM_BACKEND_BATCH_INVARIANT) never use BLAS or
 * qgemm: every m goes through the GEMV kernels, whose arithmetic for
 * y[i][j] is the same whatever m is and wherever row i sits, and whichever
 * thread or chunk computes it (weight rows are split over threads, never k).
 */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>

#include "cpu.h"
#include "fgemm.h"
#include "kpack.h"
#include "qgemm.h"

#define BLAS_MIN_M 16
/*
 * Where the GEMV and qgemm give the same bits (qdot_seq(): the 32-value
 * formats on AVX-512 VNNI and AVX2), the packed many-row GEMV where there
 * is one (kpack_kernel_m(): AVX-512 VNNI; 8 activation rows a pass) takes
 * batches up to this many rows: it reads
 * the packed groups as they are, where qgemm first rebuilds them as
 * panels. 1B-shaped model, 1 thread, against qgemm: Q4_0 pp32 +35 %, pp64
 * +15 %, pp512 +7-9 %; Q8_0 pp64 +5-19 %, pp128 +6-9 %, pp512 +2-4 %.
 * Where AMX tiles run qgemm (LOOM_CPU_ISA=amx, amx-emu), qgemm keeps them.
 * AVX2's many-row GEMV takes only batches below BLAS_MIN_M: from 16 rows
 * its qgemm (int16 sums, two activation rows a pass over both halves of a
 * panel) was ahead, 1B-shaped Q4_0 at 1 thread: pp16 50.8 against 46.7
 * t/s, pp64 60.1 against 47.3.
 */
#define SEQ_GEMV_MAX_M 512

/* A dequantized panel takes about this many bytes of a thread's scratch. */
#define PANEL_BYTES (512 * 1024)
#define GEMV_CHUNKS_PER_THREAD 2

struct gemm_task {
	struct loom_backend_ctx *ctx;
	struct cpu_gemv g;
	int64_t n;
	int64_t chunk; /* weight rows per pool chunk (a panel on the BLAS path) */
	/* the first n_head chunks hold head_rows rows each, the rest chunk
	 * rows (pick_split()); n_head 0 on every other path */
	int64_t n_head, head_rows;
	/* fast mode: m rows of k / 32 quantized blocks, and the kernel */
	const struct qdot_block *qx;
	const float *qsc; /* qdot_scales_len(k / 32) per row */
	qdot_fn dot;
	/* the same for the K-quants: m rows of k / 256 super-blocks */
	const struct qdot_kblock *qkx;
	qdot_k_fn kdot;
	/* a packed weight (g.w in kpack.h's layout): its kernel, for either
	 * kind of quantized rows; dot and kdot then NULL */
	bool packed;
	kpack_fn kp;
	kpack_mfn kpm; /* all m rows at once, where the format has it */
	struct qgemm_x *prep; /* prefill (qgemm.h): k / qgemm_block() per row */
	kpack_qgemm_fn inplace; /* prefill from the packed groups, no panels */
};

/* Rows [*j0, *j1) of chunk c. */
static void chunk_rows(const struct gemm_task *t, int64_t c, int64_t *j0, int64_t *j1)
{
	if (c < t->n_head) {
		*j0 = c * t->head_rows;
		*j1 = *j0 + t->head_rows;
		return;
	}
	*j0 = t->n_head * t->head_rows + (c - t->n_head) * t->chunk;
	*j1 = *j0 + t->chunk < t->n ? *j0 + t->chunk : t->n;
}

static int64_t n_chunks(const struct gemm_task *t)
{
	return t->n_head + (t->n - t->n_head * t->head_rows + t->chunk - 1) / t->chunk;
}

/*
 * Rows per chunk: about GEMV_CHUNKS_PER_THREAD chunks per thread, so a
 * delayed thread leaves little behind, in multiples of `unit`, between lo
 * and hi rows. Each chunk costs a claim and a completion on cache lines
 * both threads write; decode's GEMVs are short, and 2 chunks a thread
 * decoded 13% faster at 2 threads than 4 did (docs/BENCHMARKS.md).
 */
static int64_t pick_chunk(int64_t n, int nth, int64_t unit, int64_t lo, int64_t hi)
{
	int64_t c = n / ((int64_t)nth * GEMV_CHUNKS_PER_THREAD);

	c = c < lo ? lo : c > hi ? hi : c;
	return (c + unit - 1) / unit * unit;
}

/*
 * A decode GEMV's split: one large chunk per thread first (about 3/4 of
 * the rows between them), then small chunks for whoever is free. Equal
 * chunks left the caller waiting for the other thread's last one, 2-3 us
 * a GEMV at 2 threads, 8-10 % of a decode step: a thread that starts late
 * (waking) or runs slower (the memory system is shared) now holds at most
 * a small chunk when the other runs out. Large GEMVs (the output head)
 * keep chunks of at most hi rows: the tail is small beside them.
 */
static void pick_split(struct gemm_task *t, int nth, int64_t unit, int64_t lo, int64_t hi)
{
	int64_t head = t->n * 3 / 4 / nth / unit * unit;
	int64_t rest = t->n - head * nth;

	t->n_head = 0;
	t->head_rows = 0;
	if (nth <= 1 || head < lo || head > 4 * hi) {
		t->chunk = pick_chunk(t->n, nth, unit, lo, hi);
		return;
	}
	t->n_head = nth;
	t->head_rows = head;
	t->chunk = (rest / (4 * nth) + unit - 1) / unit * unit;
	if (t->chunk < 2 * unit)
		t->chunk = 2 * unit;
}

static void gemv_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	int64_t j0, j1;

	(void)ith;
	chunk_rows(t, c, &j0, &j1);
	cpu_gemv_rows(t->ctx->isa, &t->g, j0, j1);
}

/*
 * Batch-invariant prefill: the GEMV kernels on groups of `rows` activation
 * rows (about INV_X_BYTES of them, so they stay in L1 while the chunk's
 * weight rows stream past). The kernels give every element the same
 * operations whatever m is and wherever its row sits (kernels.c), so this
 * only changes the order in which elements are produced.
 */
#define INV_X_BYTES (24 * 1024)

static void inv_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	int64_t rows = INV_X_BYTES / 4 / (t->g.k ? t->g.k : 1) / 4 * 4;
	int64_t j0, j1;

	(void)ith;
	if (rows < 4)
		rows = 4;
	chunk_rows(t, c, &j0, &j1);
	for (int64_t i = 0; i < t->g.m; i += rows) {
		struct cpu_gemv g = t->g;

		g.x += i * g.x_stride;
		g.y += i * g.y_stride;
		if (g.xs)
			g.xs += i * g.xs_stride;
		g.m = g.m - i < rows ? g.m - i : rows;
		cpu_gemv_rows(t->ctx->isa, &g, j0, j1);
	}
}

/* One panel of t->chunk weight rows, dequantized into the thread's scratch. */
static void blas_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	const struct cpu_gemv *g = &t->g;
	float *panel = t->ctx->scratch[ith];
	int64_t j, j1;

	chunk_rows(t, c, &j, &j1);
	for (int64_t r = 0; r < j1 - j; r++) {
		const uint8_t *row = g->w + (size_t)(j + r) * g->w_stride;

		if (t->packed) {
			/* back to the GGUF layout, after the panel in the scratch */
			uint8_t *tmp = (uint8_t *)(panel + t->chunk * g->k);

			kpack_unpack_row(g->type, g->w, kpack_nb(g->type, g->k), j + r, tmp);
			row = tmp;
		}
		cpu_dequant_row(t->ctx->isa, g->type, row, panel + r * g->k, g->k);
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->m, (int)(j1 - j), (int)g->k,
		    1.0f, g->x, (int)g->x_stride, panel, (int)g->k, 0.0f, g->y + j,
		    (int)g->y_stride);
}

/* f32 weights whose rows the panels can read in place. */
static bool plain_f32(const struct cpu_gemv *g)
{
	return g->type == LOOM_TYPE_F32 && g->w_stride % 4 == 0 && (uintptr_t)g->w % 4 == 0;
}

/*
 * Batches of this many rows and more go to OpenBLAS on AVX2 rather than
 * fgemm: every panel there reads all m activation rows again, which two
 * Zen 3 cores shared badly (1B-shaped F16 file at 2 threads, fgemm
 * against OpenBLAS: pp64 +30 %, pp128 +5 %, pp256 -18 %, pp512 -15 %;
 * at 1 thread pp256 +10 %, pp512 +3 %). Blocking m across a chunk's
 * panels was slower still (the panel slice then comes from L2 for every
 * block of rows; docs/BENCHMARKS.md), so the row count picks.
 */
#define FGEMM_AVX2_MAX_M 256

/* The rows of the panel fgemm_task() builds after the one ending at j
 * (NULL when there is none, or its rows are packed). */
static const struct fgemm_next *next_rows(const struct gemm_task *t, int64_t j, int64_t j1,
					  struct fgemm_next *next)
{
	const struct cpu_gemv *g = &t->g;

	if (j >= j1 || t->packed)
		return NULL;
	*next = (struct fgemm_next){
		.p = g->w + (size_t)j * g->w_stride, .stride = g->w_stride,
		.bytes = (size_t)g->k * cpu_block_bytes(g->type) / cpu_block_elems(g->type),
		.rows = j1 - j < FGEMM_ROWS ? j1 - j : FGEMM_ROWS,
	};
	return next;
}

/* Chunk c through fgemm.h: panels of FGEMM_ROWS weight rows, made in the
 * thread's scratch (dequantized to f32 first unless plain_f32()). */
static void fgemm_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	const struct cpu_gemv *g = &t->g;
	float *panel = t->ctx->scratch[ith];
	float *rows = panel + fgemm_panel_floats(g->k);
	uint8_t *tmp = (uint8_t *)(rows + fgemm_panel_floats(g->k));
	struct fgemm_next next;
	int64_t j0, j1;

	chunk_rows(t, c, &j0, &j1);
	for (int64_t j = j0; j < j1; j += FGEMM_ROWS) {
		const int n = j1 - j < FGEMM_ROWS ? (int)(j1 - j) : FGEMM_ROWS;

		if (plain_f32(g)) {
			fgemm_panel_rows(t->ctx->isa,
					 (const float *)(g->w + (size_t)j * g->w_stride),
					 (int64_t)(g->w_stride / 4), n, g->k, panel);
		} else if (t->packed || !fgemm_panel_half(t->ctx->isa, g->type,
					     g->w + (size_t)j * g->w_stride, g->w_stride, n, g->k,
					     panel)) {
			for (int r = 0; r < n; r++) {
				const uint8_t *row = g->w + (size_t)(j + r) * g->w_stride;

				if (t->packed) { /* back to the GGUF layout first */
					kpack_unpack_row(g->type, g->w, kpack_nb(g->type, g->k),
							 j + r, tmp);
					row = tmp;
				}
				cpu_dequant_row(t->ctx->isa, g->type, row, rows + r * g->k, g->k);
			}
			fgemm_panel_rows(t->ctx->isa, rows, g->k, n, g->k, panel);
		}
		fgemm_run(t->ctx->isa, panel, n, g->x, g->x_stride, g->m, g->k, g->y + j,
			  g->y_stride, next_rows(t, j + FGEMM_ROWS, j1, &next));
	}
}

static int fgemm_gemm(struct gemm_task *t, int nth)
{
	const int64_t k = t->g.k;
	size_t need;

	if (k > (int64_t)(SIZE_MAX / sizeof(float) / 4 / FGEMM_ROWS))
		return LOOM_ERR_NOMEM;
	/* the panel, the dequantized rows, a GGUF row to unpack a packed one into */
	need = 2 * fgemm_panel_floats(k) + (t->packed ? (size_t)(k / 32) * 34 / 4 + 1 : 0);
	if (cpu_scratch_reserve(t->ctx, need))
		return LOOM_ERR_NOMEM;
	t->chunk = pick_chunk(t->n, nth, FGEMM_ROWS, FGEMM_ROWS, 256);
	cpu_pool_run(&t->ctx->pool, fgemm_task, t, n_chunks(t), nth);
	return LOOM_OK;
}

static int grow(void **buf, size_t *cap, int64_t a, int64_t b, size_t elem);

/* Fast mode, bf16 weights: rows [j0, j1) of chunk c on bf16 pairs, by
 * vdpbf16ps or AMX-BF16 tiles (amx.h); the weight rows are pairs already
 * (k even, 4-byte aligned rows). */
static void pairs_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	const struct cpu_gemv *g = &t->g;
	uint32_t *panel = (uint32_t *)t->ctx->scratch[ith];
	const int64_t kp = g->k / 2;
	int64_t j0, j1;

	chunk_rows(t, c, &j0, &j1);
	for (int64_t j = j0; j < j1; j += FGEMM_ROWS) {
		const int n = j1 - j < FGEMM_ROWS ? (int)(j1 - j) : FGEMM_ROWS;

		fgemm_panel_rows(t->ctx->isa, g->w + (size_t)j * g->w_stride,
				 (int64_t)(g->w_stride / 4), n, kp, panel);
		if (t->ctx->amx != AMX_OFF && amx_pairs_supported(t->ctx->amx))
			amx_pairs_run(t->ctx->amx, panel, n, t->ctx->bfx, g->m, kp, g->y + j,
				      g->y_stride);
		else
			fgemm_pairs_run(panel, n, t->ctx->bfx, g->m, kp, g->y + j, g->y_stride);
	}
}

/* The activation rows as bf16 pairs, one row a chunk. */
static void pairs_x_task(void *arg, int64_t i, int ith)
{
	const struct gemm_task *t = arg;

	(void)ith;
	fgemm_pairs_x(t->g.x + i * t->g.x_stride, t->g.k, t->ctx->bfx + i * (t->g.k / 2));
}

static bool pairs_ok(const struct loom_backend_ctx *ctx, const struct cpu_gemv *g)
{
	return (ctx->pairs || (ctx->amx != AMX_OFF && amx_pairs_supported(ctx->amx))) &&
	       ctx->fgemm && !ctx->exact && g->type == LOOM_TYPE_BF16 && g->k % 2 == 0 &&
	       g->w_stride % 4 == 0 && (uintptr_t)g->w % 4 == 0 && !g->inv;
}

static int pairs_gemm(struct gemm_task *t, int nth)
{
	struct loom_backend_ctx *ctx = t->ctx;

	if (t->g.k > (int64_t)(SIZE_MAX / sizeof(float) / FGEMM_ROWS) ||
	    grow((void **)&ctx->bfx, &ctx->bfx_cap, t->g.m, t->g.k / 2, sizeof(uint32_t)) ||
	    cpu_scratch_reserve(ctx, fgemm_panel_floats(t->g.k / 2)))
		return LOOM_ERR_NOMEM;
	cpu_pool_run(&ctx->pool, pairs_x_task, t, t->g.m,
		     t->g.m * t->g.k >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1);
	t->chunk = pick_chunk(t->n, nth, FGEMM_ROWS, FGEMM_ROWS, 256);
	cpu_pool_run(&ctx->pool, pairs_task, t, n_chunks(t), nth);
	return LOOM_OK;
}

/* F32 weights with a float-multiple stride go to sgemm as they are. */
static void blas_f32_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	const struct cpu_gemv *g = &t->g;
	int64_t j0, j1;

	(void)ith;
	chunk_rows(t, c, &j0, &j1);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->m, (int)(j1 - j0), (int)g->k,
		    1.0f, g->x, (int)g->x_stride,
		    (const float *)(g->w + (size_t)j0 * g->w_stride), (int)(g->w_stride / 4), 0.0f,
		    g->y + j0, (int)g->y_stride);
}

static bool ranges_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
	uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;

	return a0 < b0 + blen && b0 < a0 + alen;
}

/* Byte span of `rows` rows of `width` bytes, `stride` apart (validated). */
static size_t span_bytes(int64_t rows, size_t stride, size_t width)
{
	return rows > 0 ? (size_t)(rows - 1) * stride + width : 0;
}

/* The reference backend's rules, in its order, plus the header's no-alias
 * rule; *ws is the weight's row stride (the packed one for a packed
 * weight, which only a context that packs can have made). */
static int gemm_check(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a,
		      size_t *ws)
{
	uint64_t blocks;
	size_t w_row;
	bool packed;

	if (!a || a->struct_size < LOOM_GEMM_ARGS_MIN_SIZE || a->m < 0 || a->n < 0 || a->k < 0)
		return LOOM_ERR_INVALID;
	packed = LOOM_GEMM_PACKED(a);
	if (!cpu_format_known(a->w_type))
		return LOOM_ERR_UNSUPPORTED;
	if (a->k % cpu_block_elems(a->w_type))
		return LOOM_ERR_INVALID;
	blocks = (uint64_t)a->k / cpu_block_elems(a->w_type);
	if (blocks > (uint64_t)(INT64_MAX / 16) / cpu_block_bytes(a->w_type))
		return LOOM_ERR_INVALID;
	w_row = (size_t)blocks * cpu_block_bytes(a->w_type);
	*ws = a->w_stride;
	if (packed) {
		if (!(ctx->pack && kpack_format(a->w_type)))
			return LOOM_ERR_INVALID;
		*ws = w_row = cpu_gemm_w_stride(a);
		/* 0: an overflow (weight_pack made nothing of k = 0) */
		if (!w_row || (a->n > 0 && !kpack_bytes(a->w_type, a->n, kpack_nb(a->w_type, a->k))))
			return LOOM_ERR_INVALID;
	}
	if (*ws < w_row || !loom_check_shape(a->m, a->k, a->x_stride) ||
	    !loom_check_shape(a->m, a->n, a->y_stride))
		return LOOM_ERR_INVALID;
	if (a->n > 1 && (uint64_t)(a->n - 1) > (INT64_MAX / 16 - w_row) / (*ws ? *ws : 1))
		return LOOM_ERR_INVALID;
	if (a->m == 0 || a->n == 0)
		return LOOM_OK;
	if (!a->x || !a->y || (!a->w && a->k > 0))
		return LOOM_ERR_INVALID;
	if (ranges_overlap(a->y, span_bytes(a->m, (size_t)a->y_stride * 4, (size_t)a->n * 4),
			   a->x, span_bytes(a->m, (size_t)a->x_stride * 4, (size_t)a->k * 4)) ||
	    (a->w && ranges_overlap(a->y, span_bytes(a->m, (size_t)a->y_stride * 4, (size_t)a->n * 4),
				    a->w, packed ? cpu_gemm_w_bytes(a) : span_bytes(a->n, *ws, w_row))))
		return LOOM_ERR_INVALID;
	return LOOM_OK;
}

/*
 * Makes *buf hold at least a * b elements of elem bytes (its capacity, in
 * elements, in *cap); the old contents are not kept. LOOM_ERR_NOMEM when
 * the size overflows or malloc fails (*buf and *cap then unchanged).
 */
static int grow(void **buf, size_t *cap, int64_t a, int64_t b, size_t elem)
{
	void *p;

	if (a < 0 || b < 0 || (b && (uint64_t)a > SIZE_MAX / elem / (uint64_t)b))
		return LOOM_ERR_NOMEM;
	if (*cap >= (size_t)a * (size_t)b)
		return LOOM_OK;
	p = malloc((size_t)a * (size_t)b * elem);
	if (!p)
		return LOOM_ERR_NOMEM;
	free(*buf);
	*buf = p;
	*cap = (size_t)a * (size_t)b;
	return LOOM_OK;
}

/*
 * Formats with a per-block minimum (w = d*q + m) take sum(w*x) as
 * d*sum(q*x) + m*sum(x); the block sums of x are made here once per call,
 * so every thread reads the same values.
 */
static int xsum_prepare(struct loom_backend_ctx *ctx, struct cpu_gemv *g)
{
	if (!cpu_format_has_min(g->type) || ctx->isa == CPU_ISA_SCALAR)
		return LOOM_OK;
	g->xs_stride = cpu_xsum_stride(g->k);
	if (grow((void **)&ctx->xsum, &ctx->xsum_cap, g->m, g->xs_stride, sizeof(float)))
		return LOOM_ERR_NOMEM;
	cpu_xsum_fill(g, ctx->xsum);
	g->xs = ctx->xsum;
	return LOOM_OK;
}

/* ---- fast mode: integer dot products ---- */

/* Chunk c is activation row c. */
static void quant_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	int64_t nb = t->g.k / 32;

	(void)ith;
	qdot_quantize_row(t->g.x + c * t->g.x_stride, t->ctx->qx + c * nb, t->g.k);
	if (!t->prep) /* the decode kernels' scale vectors */
		qdot_row_scales(t->ctx->qx + c * nb, nb, t->ctx->qsc + c * qdot_scales_len(nb));
	else /* the prefill GEMM's blocks */
		qgemm_row_prep(t->g.type, t->ctx->qx + c * nb, t->g.k,
			       t->prep + c * (t->g.k / qgemm_block(t->g.type)));
}

/*
 * Prefill chunk c: QGEMM_PANELS panels of 16 weight rows against every
 * activation row, a strip of QGEMM_STRIP activation rows at a time
 * against all of them, so the strip is read from L1 by each panel instead
 * of every activation row streaming from L2 or L3 once per panel (at k =
 * 2048 and m = 256 the rows take 850 KB). Each output is still one
 * qgemm_run() element: the order changes no bits.
 */
#define QGEMM_PANELS 4
#define QGEMM_STRIP 16

/*
 * A chunk's panels are built from weights that come from memory (a
 * prefill reads each weight once), and the hardware prefetcher runs only
 * a little ahead of the builder, so the builder waits on DRAM while the
 * cores' arithmetic idles: about a tenth of a 1B-shaped Q4_K_M pp64. While
 * a chunk computes, its thread prefetches into L2 the weight rows of the
 * chunk it most likely claims next (chunks go out in order, one to each
 * thread in turn), a slice at each panel pass, so the next build finds
 * them there. Groups read in place (t->inplace) are not: that kernel's
 * first pass prefetches its group itself, and the chunk-ahead prefetch on
 * top of it cost 1B-shaped Q4_K_M pp16 11 % at 1 thread and 4 % at 2
 * (pp64: no difference).
 */
struct next_weights {
	const char *at, *end;
	size_t slice;
};

static void next_weights_init(const struct gemm_task *t, int64_t c, int ith,
			      struct next_weights *pf)
{
	const int64_t rows = QGEMM_PANELS * QGEMM_ROWS;
	const int64_t j = (c + t->ctx->n_threads) * rows;
	const int64_t strips = (t->g.m + QGEMM_STRIP - 1) / QGEMM_STRIP;
	const int64_t j1 = j + rows < t->n ? j + rows : t->n;

	(void)ith;
	pf->at = pf->end = NULL;
	pf->slice = 0;
	if (j >= t->n || t->inplace)
		return;
	pf->at = (const char *)t->g.w + (size_t)j * t->g.w_stride;
	pf->end = (const char *)t->g.w + (size_t)j1 * t->g.w_stride;
	pf->slice = ((size_t)(pf->end - pf->at) / (size_t)(strips * QGEMM_PANELS) + 63) & ~(size_t)63;
}

static inline void next_weights_step(struct next_weights *pf)
{
	const char *stop = pf->at + pf->slice < pf->end ? pf->at + pf->slice : pf->end;

	for (; pf->at < stop; pf->at += 64)
		__builtin_prefetch(pf->at, 0, 2);
}

static void qgemm_task(void *arg, int64_t c, int ith)
{
	struct next_weights pf;
	const struct gemm_task *t = arg;
	const struct cpu_gemv *g = &t->g;
	const int64_t nb = g->k / 32, nc = g->k / qgemm_block(g->type);
	const int64_t knb = kpack_nb(g->type, g->k);
	const size_t pbytes = (qgemm_panel_bytes(g->type, g->k) + 63) & ~(size_t)63;
	uint8_t *panel = (uint8_t *)t->ctx->scratch[ith];
	int64_t j0[QGEMM_PANELS];
	int rows[QGEMM_PANELS], np = 0;

	for (int64_t j = c * QGEMM_PANELS * QGEMM_ROWS; j < t->n && np < QGEMM_PANELS;
	     j += QGEMM_ROWS, np++) {
		j0[np] = j;
		rows[np] = t->n - j < QGEMM_ROWS ? (int)(t->n - j) : QGEMM_ROWS;
		if (!t->inplace)
			qgemm_panel(g->type, g->w, g->w_stride, j, rows[np], g->k, t->packed,
				    panel + np * pbytes);
	}
	next_weights_init(t, c, ith, &pf);
	for (int64_t i = 0; i < g->m; i += QGEMM_STRIP) {
		const int64_t m = g->m - i < QGEMM_STRIP ? g->m - i : QGEMM_STRIP;

		for (int p = 0; p < np; p++) {
			float *y = g->y + i * g->y_stride + j0[p];

			next_weights_step(&pf);

			if (t->inplace)
				t->inplace(kpack_group_at(g->type, g->w, knb, j0[p]), rows[p],
					   t->qx + i * nb, t->prep + i * nc, m, knb, y, g->y_stride,
					   i == 0);
			else if (t->ctx->amx != AMX_OFF)
				amx_qgemm_run(t->ctx->amx, g->type, panel + p * pbytes, rows[p],
					      t->qx + i * nb, t->prep + i * nc, m, g->k, y,
					      g->y_stride);
			else
				qgemm_run(t->ctx->qisa, g->type, panel + p * pbytes, rows[p],
					  t->qx + i * nb, t->prep + i * nc, m, g->k, y, g->y_stride);
		}
	}
}

/*
 * Up to this many activation rows (decode, small serve batches) a gemm
 * runs as a group (cpu_gemm_group(), of one gemm outside step regions):
 * every thread quantizes the rows itself, at the first chunk it runs,
 * into its own scratch. The rows are short, so doing it twice costs less
 * than a serial step on the caller before each GEMV (with the other
 * threads idle) and a second hand-off; and the quantized rows are then in
 * the cache of the core that reads them. Quantizing is deterministic, so
 * every thread's copy is the same.
 */
#define LOCAL_MAX_M 4

/* Scratch floats group_acts() needs for m rows of nb blocks (or, with
 * kq, of nb K-quant super-blocks). */
static size_t local_floats(int64_t m, int64_t nb, bool kq)
{
	size_t bytes = kq ? (size_t)(m * nb) * sizeof(struct qdot_kblock) :
			    (size_t)(m * nb) * sizeof(struct qdot_block) +
				    (size_t)(m * qdot_scales_len(nb)) * sizeof(float);

	return (bytes + sizeof(float) - 1) / sizeof(float);
}

/* Packed weight rows [j0, j1) of t against its m quantized rows x, each
 * x_row bytes (blocks of either kind). For more than one activation row
 * a span ends with its 16-row group, which stays in cache while each
 * activation row passes. */
static void packed_rows(const struct gemm_task *t, const void *x, size_t x_row, int64_t j0,
			int64_t j1)
{
	const struct cpu_gemv *g = &t->g;
	const int64_t nb = kpack_nb(g->type, g->k);

	if (t->kpm) { /* every activation row at once: each group read once */
		t->kpm(g->w, x, (int)g->m, nb, g->y + j0, g->y_stride, j0, j1);
		return;
	}
	for (int64_t j = j0, e; j < j1; j = e) {
		e = g->m == 1 ? j1 : (j / KPACK_ROWS + 1) * KPACK_ROWS;
		e = e < j1 ? e : j1;
		for (int64_t i = 0; i < g->m; i++)
			t->kp(g->w, (const uint8_t *)x + i * x_row, nb, g->y + i * g->y_stride + j,
			      j, e);
	}
}

/* Weight rows [j0, j1) of t against the quantized rows qx, qsc. */
static void qdot_rows(const struct gemm_task *t, const struct qdot_block *qx, const float *qsc,
		      int64_t j0, int64_t j1)
{
	const struct cpu_gemv *g = &t->g;
	int64_t nb = g->k / 32;

	if (t->packed) {
		packed_rows(t, qx, (size_t)nb * sizeof(*qx), j0, j1);
		return;
	}
	/* 8 weight rows at a time stay in L1 while each x row passes */
	for (int64_t j = j0; j < j1; j += 8) {
		const uint8_t *w = g->w + (size_t)j * g->w_stride;
		int rows = j1 - j < 8 ? (int)(j1 - j) : 8;

		for (int64_t i = 0; i < g->m; i++)
			t->dot(w, g->w_stride, qx + i * nb, qsc + i * qdot_scales_len(nb),
			       nb, g->y + i * g->y_stride + j, rows);
	}
}

static void qdot_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	int64_t j0, j1;

	(void)ith;
	chunk_rows(t, c, &j0, &j1);
	qdot_rows(t, t->qx, t->qsc, j0, j1);
}

/* t's integer kernel for its weight (packed or not; a qdot or qdot_k
 * format) on isa. */
static void kernel_pick(struct gemm_task *t, enum qdot_isa isa)
{
	const bool k = qdot_k_format(t->g.type);

	t->kp = t->packed ? kpack_kernel(isa, t->g.type) : NULL;
	t->kpm = t->packed && t->g.m > 1 && t->g.m <= INT_MAX - 64 ?
			 kpack_kernel_m(isa, t->g.type) : NULL;
	t->dot = t->packed || k ? NULL : qdot_kernel(isa, t->g.type);
	t->kdot = t->packed || !k ? NULL : qdot_k_kernel(isa, t->g.type);
}

static int qx_reserve(struct loom_backend_ctx *ctx, int64_t m, int64_t nb)
{
	return grow((void **)&ctx->qx, &ctx->qx_cap, m, nb, sizeof(*ctx->qx)) ||
	       grow((void **)&ctx->qsc, &ctx->qsc_cap, m, qdot_scales_len(nb), sizeof(float)) ?
		       LOOM_ERR_NOMEM : LOOM_OK;
}

/* t->g set up, k > 0; nth threads for the weight rows. */
static int qdot_gemm(struct gemm_task *t, int nth)
{
	struct loom_backend_ctx *ctx = t->ctx;
	int64_t m = t->g.m, k = t->g.k;

	kernel_pick(t, ctx->qisa);
	ctx->qmemo.valid = false; /* qx is overwritten */
	if (qx_reserve(ctx, m, k / 32))
		return LOOM_ERR_NOMEM;
	t->qx = ctx->qx;
	t->qsc = ctx->qsc;
	cpu_pool_run(&ctx->pool, quant_task, t, m, m * k >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1);
	pick_split(t, nth, t->packed ? KPACK_ROWS : 4, 32, 256);
	cpu_pool_run(&ctx->pool, qdot_task, t, n_chunks(t), nth);
	return LOOM_OK;
}

/* ---- fast mode, K-quants: the same with super-blocks of 256 ---- */

static void kquant_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	int64_t nb = t->g.k / 256;

	(void)ith;
	qdot_k_quantize_row(t->g.x + c * t->g.x_stride, t->ctx->qkx + c * nb, t->g.k);
}

/* Weight rows [j0, j1) of t against the quantized rows qkx. */
static void qdot_k_rows(const struct gemm_task *t, const struct qdot_kblock *qkx, int64_t j0,
			int64_t j1)
{
	const struct cpu_gemv *g = &t->g;
	int64_t nb = g->k / 256;

	if (t->packed) {
		packed_rows(t, qkx, (size_t)nb * sizeof(*qkx), j0, j1);
		return;
	}
	for (int64_t j = j0; j < j1; j += 8) {
		const uint8_t *w = g->w + (size_t)j * g->w_stride;
		int rows = j1 - j < 8 ? (int)(j1 - j) : 8;

		for (int64_t i = 0; i < g->m; i++)
			t->kdot(w, g->w_stride, qkx + i * nb, nb, g->y + i * g->y_stride + j, rows);
	}
}

static void qdot_k_task(void *arg, int64_t c, int ith)
{
	const struct gemm_task *t = arg;
	int64_t j0, j1;

	(void)ith;
	chunk_rows(t, c, &j0, &j1);
	qdot_k_rows(t, t->qkx, j0, j1);
}

/* t->g set up, k > 0 (a multiple of 256: gemm_check); nth threads. */
static int qdot_k_gemm(struct gemm_task *t, int nth)
{
	struct loom_backend_ctx *ctx = t->ctx;
	int64_t m = t->g.m, k = t->g.k;

	kernel_pick(t, ctx->qisa);
	if (grow((void **)&ctx->qkx, &ctx->qkx_cap, m, k / 256, sizeof(*ctx->qkx)))
		return LOOM_ERR_NOMEM;
	t->qkx = ctx->qkx;
	cpu_pool_run(&ctx->pool, kquant_task, t, m, m * k >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1);
	pick_split(t, nth, t->packed ? KPACK_ROWS : 4, 32, 256);
	cpu_pool_run(&ctx->pool, qdot_k_task, t, n_chunks(t), nth);
	return LOOM_OK;
}

/*
 * Inside a replayed step region, a gemm that reads the rows the previous
 * gemm quantized for qgemm (nothing but gemms ran between: region.c) takes
 * them as they are: a prefill layer's Q, K and V read one normalized
 * input, its gate and up another. Quantizing is a function of the rows
 * alone (and of the format's block and offset), so the bits are those of
 * quantizing again.
 */
static bool qx_memo_hit(const struct loom_backend_ctx *ctx, const struct cpu_gemv *g)
{
	const struct cpu_qx_memo *q = &ctx->qmemo;

	return ctx->rg.in_gemm && q->valid && q->x == g->x && q->x_stride == g->x_stride &&
	       q->m == g->m && q->k == g->k && q->block == qgemm_block(g->type) &&
	       q->off == qgemm_offset(g->type);
}

static void qx_memo_set(struct loom_backend_ctx *ctx, const struct cpu_gemv *g)
{
	ctx->qmemo = (struct cpu_qx_memo){
		.valid = ctx->rg.in_gemm, .x = g->x, .x_stride = g->x_stride, .m = g->m,
		.k = g->k, .block = qgemm_block(g->type), .off = qgemm_offset(g->type),
	};
}

/* Fast-mode prefill (qgemm.h): t->g set up, m >= 16, k > 0. */
static int qgemm_gemm(struct gemm_task *t, int nth)
{
	struct loom_backend_ctx *ctx = t->ctx;
	int64_t m = t->g.m, nb = t->g.k / 32, nc = t->g.k / qgemm_block(t->g.type);
	size_t bytes;

	if (qx_reserve(ctx, m, nb) ||
	    grow((void **)&ctx->qprep, &ctx->qprep_cap, m, nc, sizeof(*ctx->qprep)))
		return LOOM_ERR_NOMEM;
	t->inplace = t->packed && ctx->amx == AMX_OFF &&
				     m <= kpack_qgemm_max_m(ctx->qisa, t->g.type) ?
			     kpack_qgemm(ctx->qisa, t->g.type) : NULL;
	bytes = ((qgemm_panel_bytes(t->g.type, t->g.k) + 63) & ~(size_t)63) * QGEMM_PANELS;
	if (!t->inplace && cpu_scratch_reserve(ctx, bytes / sizeof(float) + 1))
		return LOOM_ERR_NOMEM;
	t->qx = ctx->qx;
	t->qsc = ctx->qsc;
	t->prep = ctx->qprep;
	if (qx_memo_hit(ctx, &t->g)) {
		ctx->rg.qx_reused++;
	} else {
		cpu_pool_run(&ctx->pool, quant_task, t, m,
			     m * t->g.k >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1);
		qx_memo_set(ctx, &t->g);
	}
	cpu_pool_run(&ctx->pool, qgemm_task, t,
		     (t->n + QGEMM_PANELS * QGEMM_ROWS - 1) / (QGEMM_PANELS * QGEMM_ROWS), nth);
	return LOOM_OK;
}

/* sgemm takes int sizes and strides. */
static bool blas_fits(const struct loom_gemm_args *a)
{
	return a->k <= INT32_MAX && a->x_stride <= INT32_MAX && a->y_stride <= INT32_MAX &&
	       a->m <= INT32_MAX && a->n <= INT32_MAX;
}

int cpu_gemm(struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	struct gemm_task t;
	double work;
	size_t ws;
	int nth, err;
	bool qgemm_ok;

	if (!ctx)
		return LOOM_ERR_INVALID;
	err = gemm_check(ctx, a, &ws);
	if (err)
		return err;
	if (a->m == 0 || a->n == 0)
		return LOOM_OK;
	if (ctx->rg.open) {
		struct cpu_call c = { .op = CPU_CALL_GEMM };

		cpu_region_copy_args(&c.u.gemm, sizeof(c.u.gemm), a);
		return cpu_region_record(ctx, &c);
	}
	/* decode rows: a group of one (per-thread quantization) */
	if (cpu_gemm_groupable(ctx, a))
		return cpu_gemm_group(ctx, &(struct cpu_group){ .n = 1, .gemm = { a } });

	t.ctx = ctx;
	t.packed = LOOM_GEMM_PACKED(a);
	t.prep = NULL;
	t.n_head = 0;
	t.head_rows = 0;
	t.g = (struct cpu_gemv){ .type = a->w_type, .w = a->w, .w_stride = ws,
				 .x = a->x, .x_stride = a->x_stride, .y = a->y,
				 .y_stride = a->y_stride, .m = a->m, .k = a->k };
	t.g.inv = ctx->invariant;
	t.n = a->n;
	work = (double)a->m * (double)a->n * (double)a->k;
	nth = work >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1;

	if (!ctx->exact && qdot_format(a->w_type) && a->k > 0 &&
	    (ctx->invariant || a->m < BLAS_MIN_M || !blas_fits(a) ||
	     (t.packed && a->m <= SEQ_GEMV_MAX_M && ctx->amx == AMX_OFF &&
	      ctx->qisa == QDOT_VNNI && qdot_seq(ctx->qisa, a->w_type) &&
	      kpack_kernel_m(ctx->qisa, a->w_type))))
		return qdot_gemm(&t, nth);
	qgemm_ok = !ctx->exact && ctx->qgemm && !ctx->invariant &&
		   qgemm_supported(ctx->qisa, a->w_type) && a->k > 0;
	if (qgemm_ok && a->m >= qgemm_min_m(a->w_type))
		return qgemm_gemm(&t, nth);
	if (!ctx->exact && qdot_k_format(a->w_type) && a->k > 0 &&
	    (ctx->invariant || a->m < BLAS_MIN_M || qgemm_ok || !blas_fits(a)))
		return qdot_k_gemm(&t, nth);
	/* a packed weight is a qdot format in fast mode: only BLAS is left */
	if (ctx->invariant) {
		/* no BLAS: its blocking, hence its rounding, depends on m */
		err = xsum_prepare(ctx, &t.g);
		if (err)
			return err;
		t.chunk = pick_chunk(a->n, nth, 4, 32, 256);
		cpu_pool_run(&ctx->pool, inv_task, &t, n_chunks(&t), nth);
		return LOOM_OK;
	}
	if (a->m < BLAS_MIN_M || a->k == 0 || !blas_fits(a)) {
		err = xsum_prepare(ctx, &t.g);
		if (err)
			return err;
		t.chunk = pick_chunk(a->n, nth, 4, 32, 256);
		cpu_pool_run(&ctx->pool, gemv_task, &t, n_chunks(&t), nth);
		return LOOM_OK;
	}
	if (pairs_ok(ctx, &t.g))
		return pairs_gemm(&t, nth);
	if (ctx->fgemm && (ctx->isa != CPU_ISA_AVX2 || a->m < FGEMM_AVX2_MAX_M))
		return fgemm_gemm(&t, nth);
	if (a->w_type == LOOM_TYPE_F32 && a->w_stride % 4 == 0 &&
	    (uintptr_t)a->w % 4 == 0 && a->w_stride / 4 <= INT32_MAX) {
		t.chunk = pick_chunk(a->n, nth, 16, 16, 1024);
		cpu_pool_run(&ctx->pool, blas_f32_task, &t, n_chunks(&t), nth);
		return LOOM_OK;
	}
	t.chunk = PANEL_BYTES / 4 / a->k;
	t.chunk = t.chunk < 16 ? 16 : t.chunk > 256 ? 256 : t.chunk & ~(int64_t)15;
	/* the panel, and a GGUF row to unpack a packed one into */
	if (cpu_scratch_reserve(ctx, (size_t)t.chunk * (size_t)a->k +
				(t.packed ? (size_t)(a->k / 32) * 34 / 4 + 1 : 0)))
		return LOOM_ERR_NOMEM;
	cpu_pool_run(&ctx->pool, blas_task, &t, n_chunks(&t), nth);
	return LOOM_OK;
}

/* ---- the packed layout (ABI 1.2) ---- */

struct pack_task {
	const struct loom_weight_pack_args *a;
	uint8_t *dst;
	size_t stride;
};

/* Chunk c: rows [64c, 64c + 64); for rows in lanes, 4 groups of 16. */
static void pack_task_run(void *arg, int64_t c, int ith)
{
	const struct pack_task *t = arg;
	const uint8_t *src = t->a->src;
	const int64_t n = t->a->n;

	(void)ith;
	for (int64_t r = c * 64; r < n && r < c * 64 + 64; r += KPACK_ROWS)
		kpack_group(t->a->type, src + (size_t)r * t->a->src_stride, t->a->src_stride,
			    n - r < KPACK_ROWS ? (int)(n - r) : KPACK_ROWS,
			    kpack_nb(t->a->type, t->a->k), t->dst + (size_t)r * t->stride);
}

/* Bytes weight_pack makes of a weight it packs (0 on overflow); t->stride
 * the bytes a row counts for. */
static size_t pack_size(const struct loom_weight_pack_args *a, struct pack_task *t)
{
	t->stride = kpack_row_share(a->type, kpack_nb(a->type, a->k));
	return kpack_bytes(a->type, a->n, kpack_nb(a->type, a->k));
}

int cpu_weight_pack(struct loom_backend_ctx *ctx, const struct loom_weight_pack_args *a,
		    struct loom_buffer **out, size_t *bytes)
{
	struct pack_task t = { .a = a };
	size_t size;
	int64_t solo_until;
	int rc;

	if (!ctx || !a || !out || !bytes || !LOOM_ARGS_HAS(a, struct loom_weight_pack_args, src_stride) || a->n <= 0 ||
	    a->k <= 0 || !a->src)
		return LOOM_ERR_INVALID;
	if (!(ctx->pack && kpack_format(a->type) && a->k % kpack_block_elems(a->type) == 0))
		return LOOM_ERR_UNSUPPORTED;
	/* every GGUF row of k values fits in src_stride bytes */
	if (a->src_stride < (size_t)(a->k / cpu_block_elems(a->type)) * cpu_block_bytes(a->type))
		return LOOM_ERR_INVALID;
	size = pack_size(a, &t);
	if (!size)
		return LOOM_ERR_NOMEM;
	rc = cpu_buffer_alloc_packed(ctx, size, out);
	if (rc)
		return rc;
	t.dst = cpu_buffer_addr(ctx, *out);
	/* packing first-touches the arena's pages: a chunk that waits on page
	 * faults is not a thread that lost its core, so a slow wait here must
	 * not send the first steps that follow to one thread */
	solo_until = ctx->pool.solo_until;
	cpu_pool_run(&ctx->pool, pack_task_run, &t, (a->n + 63) / 64, ctx->n_threads);
	ctx->pool.solo_until = solo_until;
	*bytes = size;
	return LOOM_OK;
}

/* ---- decode GEMVs as one task (step regions, region.c) ---- */

/* The kind of row kernel a group member runs. */
enum member_kind { MEMBER_PLAIN, MEMBER_QDOT, MEMBER_QDOT_K };

struct group_member {
	struct gemm_task t; /* g, n, the kernel and packed */
	enum member_kind kind;
	int64_t row0; /* its first row in the group's row space */
	const struct cpu_add_args *add;
};

struct group_task {
	struct loom_backend_ctx *ctx;
	struct group_member mem[CPU_GROUP_MAX];
	int n_mem;
	const struct cpu_glu_args *glu;
	const struct cpu_rmsnorm_args *norm; /* makes x, on every thread */
	struct gemm_task split; /* n, chunk, n_head, head_rows: the row space */
	const float *x;
	int64_t x_stride, m, k;
	bool need_q, need_k; /* quantized rows of either kind */
	/* scratch floats before the quantized rows and before the K-quant
	 * ones (the normalized rows come first) */
	size_t q_off, k_off;
	uint64_t seq;
};

/* What one thread reads of the group's activations. */
struct group_acts {
	const float *x; /* its normalized rows (norm), else the group's */
	int64_t x_stride;
	const struct qdot_block *qx;
	const float *qsc;
	const struct qdot_kblock *qkx;
};

static enum member_kind member_kind(uint32_t type)
{
	if (qdot_format(type))
		return MEMBER_QDOT;
	return qdot_k_format(type) ? MEMBER_QDOT_K : MEMBER_PLAIN;
}

bool cpu_gemm_groupable(const struct loom_backend_ctx *ctx, const struct loom_gemm_args *a)
{
	if (ctx->exact || a->m < 1 || a->m > LOCAL_MAX_M || a->n < 1 || a->k < 1)
		return false;
	if (qdot_format(a->w_type) || qdot_k_format(a->w_type))
		return true;
	/* the plain GEMV of a format without a minimum needs no block sums */
	return !LOOM_GEMM_PACKED(a) && !cpu_format_has_min(a->w_type) &&
	       (a->w_type == LOOM_TYPE_F32 || a->w_type == LOOM_TYPE_F16 ||
		a->w_type == LOOM_TYPE_BF16);
}

/* Thread ith's rows of the group's activations, made at its first chunk
 * of the group, for both kinds of quantized rows the members need,
 * after the norm when there is one. */
static void group_acts(const struct group_task *gt, int ith, struct group_acts *ga)
{
	float *base = gt->ctx->scratch[ith];
	int64_t nb = gt->k / 32, nkb = gt->k / 256;
	struct qdot_block *bx = (struct qdot_block *)(base + gt->q_off);
	float *sc = (float *)(bx + gt->m * nb);
	struct qdot_kblock *kx = (struct qdot_kblock *)(base + gt->k_off);

	ga->x = gt->norm ? base : gt->x;
	ga->x_stride = gt->norm ? gt->k : gt->x_stride;
	ga->qx = bx;
	ga->qsc = sc;
	ga->qkx = kx;
	if (gt->ctx->stamp[ith].gemm == gt->seq)
		return;
	for (int64_t i = 0; i < gt->m; i++) {
		const float *x = ga->x + i * ga->x_stride;

		if (gt->norm)
			cpu_rmsnorm_row(gt->norm, i, base + i * gt->k);
		if (gt->need_q) {
			qdot_quantize_row(x, bx + i * nb, gt->k);
			qdot_row_scales(bx + i * nb, nb, sc + i * qdot_scales_len(nb));
		}
		if (gt->need_k)
			qdot_k_quantize_row(x, kx + i * nkb, gt->k);
	}
	gt->ctx->stamp[ith].gemm = gt->seq;
}

/* Rows [j0, j1) of member mb. */
static void member_rows(const struct group_member *mb, const struct group_acts *ga, int64_t j0,
			int64_t j1)
{
	struct cpu_gemv g;

	switch (mb->kind) {
	case MEMBER_QDOT:
		qdot_rows(&mb->t, ga->qx, ga->qsc, j0, j1);
		break;
	case MEMBER_QDOT_K:
		qdot_k_rows(&mb->t, ga->qkx, j0, j1);
		break;
	default:
		g = mb->t.g;
		g.x = ga->x;
		g.x_stride = ga->x_stride;
		cpu_gemv_rows(mb->t.ctx->isa, &g, j0, j1);
		break;
	}
}

static void group_task_run(void *arg, int64_t c, int ith)
{
	const struct group_task *gt = arg;
	struct group_acts ga;
	int64_t j0, j1;

	group_acts(gt, ith, &ga);
	/* the norm's output, for whatever reads it after the group (no
	 * member does: each reads its thread's copy) */
	if (c == 0 && gt->norm)
		for (int64_t i = 0; i < gt->m; i++)
			memcpy(gt->norm->y + i * gt->norm->y_stride, ga.x + i * gt->k,
			       (size_t)gt->k * sizeof(float));
	chunk_rows(&gt->split, c, &j0, &j1);
	if (gt->glu) { /* gate and up share the row space */
		member_rows(&gt->mem[0], &ga, j0, j1);
		member_rows(&gt->mem[1], &ga, j0, j1);
		cpu_glu_cols(gt->ctx, gt->glu, j0, j1);
		return;
	}
	for (int i = 0; i < gt->n_mem; i++) {
		const struct group_member *mb = &gt->mem[i];
		int64_t a = j0 > mb->row0 ? j0 - mb->row0 : 0;
		int64_t b = j1 - mb->row0 < mb->t.n ? j1 - mb->row0 : mb->t.n;

		if (a >= b)
			continue;
		member_rows(mb, &ga, a, b);
		if (mb->add)
			cpu_add_cols(mb->add, a, b);
	}
}

size_t cpu_gemm_w_stride(const struct loom_gemm_args *a)
{
	if (!LOOM_GEMM_PACKED(a))
		return a->w_stride;
	return kpack_row_share(a->w_type, kpack_nb(a->w_type, a->k));
}

size_t cpu_gemm_w_bytes(const struct loom_gemm_args *a)
{
	if (a->n <= 0)
		return 0;
	if (LOOM_GEMM_PACKED(a))
		return kpack_bytes(a->w_type, a->n, kpack_nb(a->w_type, a->k));
	return (size_t)a->n * cpu_gemm_w_stride(a);
}

/* Member i of g (a call gemm_check() passed); its rows start at row0 of
 * the row space. */
static int member_setup(struct group_task *gt, const struct cpu_group *g, int i, int64_t row0)
{
	const struct loom_gemm_args *a = g->gemm[i];
	struct group_member *mb = &gt->mem[i];
	size_t ws = cpu_gemm_w_stride(a);

	if (!cpu_gemm_groupable(gt->ctx, a) || a->m != gt->m || a->k != gt->k ||
	    a->x != gt->x || a->x_stride != gt->x_stride)
		return LOOM_ERR_INVALID;
	memset(mb, 0, sizeof(*mb));
	mb->t.ctx = gt->ctx;
	mb->t.packed = LOOM_GEMM_PACKED(a);
	mb->t.g = (struct cpu_gemv){ .type = a->w_type, .w = a->w, .w_stride = ws, .x = a->x,
				     .x_stride = a->x_stride, .y = a->y, .y_stride = a->y_stride,
				     .m = a->m, .k = a->k, .inv = gt->ctx->invariant };
	mb->t.n = a->n;
	mb->kind = member_kind(a->w_type);
	mb->row0 = row0;
	mb->add = g->add[i];
	if (mb->kind != MEMBER_PLAIN)
		kernel_pick(&mb->t, gt->ctx->qisa);
	gt->need_q |= mb->kind == MEMBER_QDOT;
	gt->need_k |= mb->kind == MEMBER_QDOT_K;
	return LOOM_OK;
}

int cpu_gemm_group(struct loom_backend_ctx *ctx, const struct cpu_group *g)
{
	struct group_task gt = { .ctx = ctx, .n_mem = g->n, .glu = g->glu, .norm = g->norm };
	int64_t rows = 0, unit = 8;
	double work = 0;
	size_t need;
	int nth;

	if (g->n < 1 || g->n > CPU_GROUP_MAX || (g->glu && g->n != 2))
		return LOOM_ERR_INVALID;
	gt.x = g->gemm[0]->x;
	gt.x_stride = g->gemm[0]->x_stride;
	gt.m = g->gemm[0]->m;
	gt.k = g->gemm[0]->k;
	/* members start on a multiple of `unit` rows, as a chunk does: 16
	 * where one is in rows-in-lanes groups (kpack.h), else 8 */
	for (int i = 0; i < g->n; i++)
		if (LOOM_GEMM_PACKED(g->gemm[i]))
			unit = KPACK_ROWS;
	for (int i = 0; i < g->n; i++) {
		if (member_setup(&gt, g, i, g->glu ? 0 : rows))
			return LOOM_ERR_INVALID;
		rows = g->glu ? g->gemm[0]->n : (rows + g->gemm[i]->n + unit - 1) / unit * unit;
		work += (double)gt.m * (double)g->gemm[i]->n * (double)gt.k;
	}
	if (g->glu && g->gemm[1]->n != rows)
		return LOOM_ERR_INVALID;
	if (g->norm && (g->norm->y != gt.x || g->norm->y_stride != gt.x_stride ||
			g->norm->rows != gt.m || g->norm->n != gt.k))
		return LOOM_ERR_INVALID;
	/* 16 floats: the blocks start on a cache line, as the scratch does */
	gt.q_off = g->norm ? (size_t)(gt.m * gt.k + 15) / 16 * 16 : 0;
	gt.k_off = gt.q_off + (local_floats(gt.m, gt.k / 32, false) + 15) / 16 * 16;
	need = gt.k_off + (gt.need_k ? local_floats(gt.m, gt.k / 256, true) : 0);
	if (cpu_scratch_reserve(ctx, need))
		return LOOM_ERR_NOMEM;
	gt.seq = ++ctx->gemm_seq;
	gt.split.n = rows;
	nth = work >= CPU_PAR_MIN_WORK ? ctx->n_threads : 1;
	if (nth > 1) {
		pick_split(&gt.split, nth, unit, 32, 256);
	} else {
		/* one thread streams each weight whole, as the calls one by
		 * one do: switching between gate and up every few hundred
		 * rows cost 2-3 % */
		gt.split.chunk = rows;
	}
	cpu_pool_run(&ctx->pool, group_task_run, &gt, n_chunks(&gt.split), nth);
	return LOOM_OK;
}

/* ---- the routed experts of one decode row as two tasks (moe.c) ---- */

/* One phase of cpu_gemm_experts(): the gate/up/GLU of every expert over
 * their FFN rows, or the down of every expert over n_embd rows. */
struct experts_task {
	struct loom_backend_ctx *ctx;
	const struct cpu_experts *ex;
	struct group_member mem[2 * CPU_EXPERTS_MAX]; /* gate, up per expert; or down */
	int per;                    /* members per expert: 2, then 1 */
	struct gemm_task split;     /* the row space: ff, then n_embd */
	const float *x[CPU_EXPERTS_MAX]; /* each expert's input row */
	int n_x;                    /* 1: one row for all (phase 1), else n */
	int64_t k;                  /* the input width */
	bool need_q, need_k;
	size_t q_floats, k_off, k_floats; /* scratch per input row */
	uint64_t seq;
};

/* Thread ith's quantized input rows (each kind its members need), made
 * at its first chunk of the phase. */
static void experts_acts(const struct experts_task *t, int ith, struct group_acts *ga)
{
	float *base = t->ctx->scratch[ith];
	int64_t nb = t->k / 32;

	for (int i = 0; i < t->n_x; i++) {
		struct qdot_block *bx = (struct qdot_block *)(base + (size_t)i * t->q_floats);
		struct qdot_kblock *kx = (struct qdot_kblock *)(base + t->k_off +
								 (size_t)i * t->k_floats);

		ga[i] = (struct group_acts){ .x = t->x[i], .x_stride = t->k, .qx = bx,
					     .qsc = (float *)(bx + nb), .qkx = kx };
		if (t->ctx->stamp[ith].gemm == t->seq)
			continue;
		if (t->need_q) {
			qdot_quantize_row(t->x[i], bx, t->k);
			qdot_row_scales(bx, nb, (float *)(bx + nb));
		}
		if (t->need_k)
			qdot_k_quantize_row(t->x[i], kx, t->k);
	}
	t->ctx->stamp[ith].gemm = t->seq;
}

/* y[j0..j1) += b[j0..j1), when there is a bias. */
static void bias_cols(float *y, const float *b, int64_t j0, int64_t j1)
{
	for (int64_t j = j0; b && j < j1; j++)
		y[j] = y[j] + b[j];
}

static void experts_task_run(void *arg, int64_t c, int ith)
{
	const struct experts_task *t = arg;
	const struct cpu_experts *ex = t->ex;
	struct group_acts ga[CPU_EXPERTS_MAX];
	int64_t j0, j1;

	experts_acts(t, ith, ga);
	chunk_rows(&t->split, c, &j0, &j1);
	for (int e = 0; e < ex->n; e++) {
		const struct group_acts *a = &ga[t->n_x == 1 ? 0 : e];

		if (t->per == 1) { /* down */
			member_rows(&t->mem[e], a, j0, j1);
			bias_cols(ex->d[e], ex->down_bias[e], j0, j1);
			continue;
		}
		member_rows(&t->mem[2 * e], a, j0, j1);
		member_rows(&t->mem[2 * e + 1], a, j0, j1);
		bias_cols(ex->g[e], ex->gate_bias[e], j0, j1);
		bias_cols(ex->u[e], ex->up_bias[e], j0, j1);
		cpu_glu_cols(t->ctx, &(struct cpu_glu_args){ ex->glu, ex->g[e], ex->ff, ex->g[e],
							     ex->ff, ex->u[e], ex->ff, 1, ex->ff },
			     j0, j1);
	}
}

/* Member i of phase t: y = w . x for one row, n rows of expert e's
 * matrix of mw (k wide). */
static int experts_member(struct experts_task *t, int i, const struct loom_moe_weights *mw,
			  int32_t e, const float *x, int64_t n, float *y)
{
	uint32_t type = mw->type;
	bool packed = mw->packed;
	struct loom_gemm_args a = { .struct_size = sizeof(a), .w_type = type, .m = 1, .n = n,
				    .k = t->k, .w = mw->w[e], .w_stride = mw->row_bytes, .x = x,
				    .x_stride = t->k, .y = y, .y_stride = n, .w_packed = packed };
	struct group_member *mb = &t->mem[i];
	size_t ws;

	if (!cpu_gemm_groupable(t->ctx, &a) || gemm_check(t->ctx, &a, &ws))
		return LOOM_ERR_INVALID;
	memset(mb, 0, sizeof(*mb));
	mb->t.ctx = t->ctx;
	mb->t.packed = packed;
	mb->t.g = (struct cpu_gemv){ .type = type, .w = a.w, .w_stride = cpu_gemm_w_stride(&a),
				     .x = a.x, .x_stride = a.x_stride, .y = y, .y_stride = n,
				     .m = 1, .k = t->k, .inv = t->ctx->invariant };
	mb->t.n = n;
	mb->kind = member_kind(type);
	if (mb->kind != MEMBER_PLAIN)
		kernel_pick(&mb->t, t->ctx->qisa);
	t->need_q |= mb->kind == MEMBER_QDOT;
	t->need_k |= mb->kind == MEMBER_QDOT_K;
	return LOOM_OK;
}

/* Runs phase t over `rows` rows once its members are set. */
static int experts_phase(struct experts_task *t, int64_t rows)
{
	size_t need;
	int64_t unit = 8;
	int nth;

	for (int i = 0; i < t->per * t->ex->n; i++)
		if (t->mem[i].t.packed)
			unit = KPACK_ROWS;
	t->q_floats = (local_floats(1, t->k / 32, false) + 15) / 16 * 16;
	t->k_floats = t->need_k ? (local_floats(1, t->k / 256, true) + 15) / 16 * 16 : 0;
	t->k_off = (size_t)t->n_x * t->q_floats;
	need = t->k_off + (size_t)t->n_x * t->k_floats;
	if (cpu_scratch_reserve(t->ctx, need))
		return LOOM_ERR_NOMEM;
	t->seq = ++t->ctx->gemm_seq;
	t->split.n = rows;
	nth = (double)rows * t->k * t->per * t->ex->n >= CPU_PAR_MIN_WORK ? t->ctx->n_threads : 1;
	if (nth > 1)
		pick_split(&t->split, nth, unit, 32, 256);
	else
		t->split.chunk = rows;
	cpu_pool_run(&t->ctx->pool, experts_task_run, t, n_chunks(&t->split), nth);
	return LOOM_OK;
}

int cpu_gemm_experts(struct loom_backend_ctx *ctx, const struct cpu_experts *ex)
{
	/* both phases are set up (every member checked) before either runs */
	struct experts_task up = { .ctx = ctx, .ex = ex, .per = 2, .n_x = 1, .k = ex->n_embd };
	struct experts_task down = { .ctx = ctx, .ex = ex, .per = 1, .n_x = ex->n, .k = ex->ff };
	int rc = LOOM_OK;

	if (ex->n < 1 || ex->n > CPU_EXPERTS_MAX)
		return LOOM_ERR_INVALID;
	up.x[0] = ex->x;
	for (int e = 0; e < ex->n && !rc; e++) {
		down.x[e] = ex->g[e];
		rc = experts_member(&up, 2 * e, &ex->gate, ex->ids[e], ex->x, ex->ff, ex->g[e]);
		rc = rc ? rc : experts_member(&up, 2 * e + 1, &ex->up, ex->ids[e], ex->x, ex->ff,
					      ex->u[e]);
		rc = rc ? rc : experts_member(&down, e, &ex->down, ex->ids[e], ex->g[e],
					      ex->n_embd, ex->d[e]);
	}
	rc = rc ? rc : experts_phase(&up, ex->ff);
	return rc ? rc : experts_phase(&down, ex->n_embd);
}
