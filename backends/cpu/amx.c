/* AMX-INT8 prefill GEMM: a tile layer in hardware or in C (amx.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "amx.h"
#include "fgemm.h"
#include "cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define TILE_ROWS 16 /* activation rows a pass takes (the A tile's rows) */

const char *amx_mode_name(enum amx_mode mode)
{
	return mode == AMX_HW ? "amx" : mode == AMX_EMU ? "amx-emu" : "off";
}

#if defined(__x86_64__)
bool amx_hw_present(void)
{
	unsigned a, b, c, d;
	uint32_t lo, hi;

	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return false;
	/* EDX bit 24: AMX-TILE, bit 25: AMX-INT8 */
	if (!(d & (1u << 24)) || !(d & (1u << 25)))
		return false;
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
		return false;
	__asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	(void)hi;
	/* XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves tiles */
	return (lo & (3u << 17)) == (3u << 17);
}

int amx_request(char *why, size_t why_size)
{
	enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

	if (!amx_hw_present()) {
		snprintf(why, why_size, "the CPU or OS has no AMX-INT8 tile state");
		return -1;
	}
	if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
		snprintf(why, why_size, "the kernel refused tile state (arch_prctl)");
		return -1;
	}
	return 0;
}

/* ---- the tile layer, emulated: the instructions' semantics in C ---- */

struct emu_tile {
	int rows, colsb;
	uint8_t b[16][64];
};

/* TILELOADD: rows x colsb bytes, row r from base + r * stride. */
static void emu_load(struct emu_tile *t, const void *base, size_t stride, int rows, int colsb)
{
	t->rows = rows;
	t->colsb = colsb;
	for (int r = 0; r < rows; r++)
		memcpy(t->b[r], (const uint8_t *)base + r * stride, (size_t)colsb);
}

/* TILEZERO of a rows x colsb dword tile. */
static void emu_zero(struct emu_tile *t, int rows, int colsb)
{
	t->rows = rows;
	t->colsb = colsb;
	memset(t->b, 0, sizeof(t->b));
}

/* TDPBSUD c += a . b: for each row m of a and dword column n of c, the
 * products of a's signed bytes 4k..4k+3 with b's row k, column n unsigned
 * bytes, summed over k into c's dword (wrapping like the instruction). */
static void emu_dpbsud(struct emu_tile *c, const struct emu_tile *a, const struct emu_tile *b)
{
	for (int m = 0; m < c->rows; m++)
		for (int n = 0; n < c->colsb / 4; n++) {
			uint32_t s;

			memcpy(&s, &c->b[m][4 * n], 4);
			for (int k = 0; k < a->colsb / 4; k++)
				for (int e = 0; e < 4; e++)
					s += (uint32_t)((int32_t)(int8_t)a->b[m][4 * k + e] *
							(int32_t)b->b[k][4 * n + e]);
			memcpy(&c->b[m][4 * n], &s, 4);
		}
}

/* acc + the pair products of dwords a and b, as TDPBF16PS documents it:
 * the lower bf16's product added first, then the upper's, each rounded to
 * nearest even, denormals as zero. */
static float pair_fma(uint32_t a, uint32_t b, float acc)
{
	acc = fgemm_flush(fmaf(fgemm_pair_lo(a), fgemm_pair_lo(b), acc));
	return fgemm_flush(fmaf(fgemm_pair_hi(a), fgemm_pair_hi(b), acc));
}

/* TDPBF16PS c += a . b: for each row m of a and dword column n of c, the
 * bf16 pairs of a's dword k and b's row k, column n, over k in order. */
static void emu_dpbf16ps(struct emu_tile *c, const struct emu_tile *a, const struct emu_tile *b)
{
	for (int m = 0; m < c->rows; m++)
		for (int n = 0; n < c->colsb / 4; n++) {
			float s;

			memcpy(&s, &c->b[m][4 * n], 4);
			for (int k = 0; k < a->colsb / 4; k++) {
				uint32_t x, w;

				memcpy(&x, &a->b[m][4 * k], 4);
				memcpy(&w, &b->b[k][4 * n], 4);
				s = pair_fma(x, w, s);
			}
			memcpy(&c->b[m][4 * n], &s, 4);
		}
}

float amx_pairs_ref(const uint32_t *x, const uint32_t *w, int64_t kp)
{
	float acc = 0.0f;

	for (int64_t p = 0; p < kp; p++)
		acc = pair_fma(x[p], w[p], acc);
	return acc;
}

/* TILESTORED: the tile's rows to base + r * stride. */
static void emu_store(const struct emu_tile *t, void *base, size_t stride)
{
	for (int r = 0; r < t->rows; r++)
		memcpy((uint8_t *)base + r * stride, t->b[r], (size_t)t->colsb);
}

/* ---- the tile layer: tile 0 the int32 sums, 1 activations, 2 weights ---- */

#define TGT_AMX __attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-int8")))
#define ALWAYS static inline __attribute__((always_inline))

struct tiles {
	bool hw;
	struct emu_tile t[3]; /* AMX_EMU's registers */
};

/* The 64-byte tile configuration (palette 1) for X activation rows and a
 * block of B values. */
struct tile_config {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};

/* Loads the configuration both tile layers use: tile 0 X rows of 64
 * bytes of sums, tile 1 X activation rows of `bytes` bytes, tile 2
 * bytes / 4 weight rows of 64 bytes (4-byte groups: int8 quads or bf16
 * pairs). */
static __attribute__((target("amx-tile"))) void tiles_load_config(int X, int bytes)
{
	struct tile_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	cfg.rows[0] = (uint8_t)X;
	cfg.colsb[0] = 64;
	cfg.rows[1] = (uint8_t)X;
	cfg.colsb[1] = (uint16_t)bytes;
	cfg.rows[2] = (uint8_t)(bytes / 4);
	cfg.colsb[2] = 64;
	_tile_loadconfig(&cfg);
}

ALWAYS TGT_AMX void tiles_configure(struct tiles *ts, int X, int B)
{
	if (ts->hw)
		tiles_load_config(X, B);
}

ALWAYS TGT_AMX void tiles_release(struct tiles *ts)
{
	if (ts->hw)
		_tile_release();
}

/* sums[m][r] = a[m] . b[r] over B values: one TDPBSUD. */
ALWAYS TGT_AMX void tiles_block(struct tiles *ts, const int8_t *a, size_t a_stride,
				const uint8_t *b, int X, int B, int32_t sums[16][16])
{
	if (ts->hw) {
		_tile_zero(0);
		_tile_loadd(1, a, (long)a_stride);
		_tile_loadd(2, b, 64);
		_tile_dpbsud(0, 1, 2);
		_tile_stored(0, sums, 64);
		return;
	}
	emu_zero(&ts->t[0], X, 64);
	emu_load(&ts->t[1], a, a_stride, X, B);
	emu_load(&ts->t[2], b, 64, B / 4, 64);
	emu_dpbsud(&ts->t[0], &ts->t[1], &ts->t[2]);
	emu_store(&ts->t[0], sums, 64);
}

/*
 * X (<= 16) activation rows against the panel, block after block: the
 * tile sums, then qgemm's VNNI float work on the 16 weight-row lanes, in
 * its order (the sum starts from the prep's fix, then the dots).
 */
ALWAYS TGT_AMX void amx_pass(struct tiles *ts, const uint8_t *panel, int rows,
			     const struct qdot_block *x, const struct qgemm_x *prep, int64_t k,
			     float *y, int64_t ys, int X, int B, bool has_min)
{
	const __mmask16 keep = (__mmask16)((1u << rows) - 1);
	const int64_t nc = k / B, nx = k / 32;
	int32_t sums[16][16] __attribute__((aligned(64)));
	__m512 acc[TILE_ROWS];

	for (int i = 0; i < X; i++)
		acc[i] = _mm512_setzero_ps();
	tiles_configure(ts, X, B);
	for (int64_t c = 0; c < nc; c++) {
		const uint8_t *pb = panel + (size_t)c * qgemm_block_bytes(B);
		const float *dwp = (const float *)(pb + (size_t)B / 4 * 64);
		__m512 dw = _mm512_loadu_ps(dwp), mw = _mm512_loadu_ps(dwp + QGEMM_ROWS);

		tiles_block(ts, x[c * B / 32].q + c * B % 32, (size_t)nx * sizeof(*x), pb, X, B,
			    sums);
		for (int i = 0; i < X; i++) {
			const struct qgemm_x *xp = prep + i * nc + c;
			__m512i s = _mm512_add_epi32(_mm512_set1_epi32(xp->fix),
						     _mm512_load_si512(sums[i]));

			acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
						 _mm512_mul_ps(dw, _mm512_set1_ps(xp->d)), acc[i]);
			if (has_min)
				acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xp->s), acc[i]);
		}
	}
	tiles_release(ts);
	for (int i = 0; i < X; i++)
		_mm512_mask_storeu_ps(y + i * ys, keep, acc[i]);
}

static TGT_AMX void amx_run(bool hw, const void *panel, int rows, const struct qdot_block *x,
			    const struct qgemm_x *prep, int64_t m, int64_t k, float *y, int64_t ys,
			    int B, bool has_min)
{
	struct tiles ts = { .hw = hw };
	const int64_t nx = k / 32, nc = k / B;

	for (int64_t i = 0; i < m; i += TILE_ROWS) {
		int X = m - i < TILE_ROWS ? (int)(m - i) : TILE_ROWS;

		amx_pass(&ts, panel, rows, x + i * nx, prep + i * nc, k, y + i * ys, ys, X, B,
			 has_min);
	}
}

/* ---- AMX-BF16: bf16 weights, fast mode (fgemm.h's pair panels) ---- */

#define TGT_AMXBF __attribute__((target("avx512f,amx-tile,amx-bf16")))
#define PAIRS_TILE 16 /* pairs a tile takes: 64 bytes a row */

static bool amx_bf16_present(void)
{
	unsigned a, b, c, d;

	/* EDX bit 22: AMX-BF16 */
	return amx_hw_present() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22));
}

/* Tile 0: X x 16 sums; 1: X activation rows of pn pairs; 2: pn pair rows
 * of one half of the panel (16 weight rows). */
static TGT_AMXBF void pairs_configure(bool hw, int X, int pn)
{
	if (hw)
		tiles_load_config(X, 4 * pn);
}

/* sums (X x 16, row stride 64 bytes) += activation pairs . panel half,
 * over pairs [p0, p0 + pn). */
static TGT_AMXBF void pairs_block(bool hw, struct emu_tile t[3], const uint32_t *x, int64_t kp,
				  const uint32_t *half, int64_t p0, int X, int pn,
				  float sums[16][16])
{
	if (hw) {
		_tile_loadd(0, sums, 64);
		_tile_loadd(1, x + p0, (long)(kp * 4));
		_tile_loadd(2, half + p0 * 32, 128);
		_tile_dpbf16ps(0, 1, 2);
		_tile_stored(0, sums, 64);
		return;
	}
	emu_load(&t[0], sums, 64, X, 64);
	emu_load(&t[1], x + p0, (size_t)kp * 4, X, 4 * pn);
	emu_load(&t[2], half + p0 * 32, 128, pn, 64);
	emu_dpbf16ps(&t[0], &t[1], &t[2]);
	emu_store(&t[0], sums, 64);
}

/* X (<= 16) activation rows (kp pairs apart) against one half of the
 * panel: out[i][r] for r < n. */
static TGT_AMXBF void pairs_half(bool hw, const uint32_t *half, int n, const uint32_t *x,
				 int64_t kp, int X, float *y, int64_t ys)
{
	float sums[16][16] __attribute__((aligned(64)));
	struct emu_tile t[3];
	int64_t p0 = 0;

	memset(sums, 0, sizeof(sums));
	for (; p0 + PAIRS_TILE <= kp; p0 += PAIRS_TILE) {
		if (p0 == 0)
			pairs_configure(hw, X, PAIRS_TILE);
		pairs_block(hw, t, x, kp, half, p0, X, PAIRS_TILE, sums);
	}
	if (p0 < kp) { /* the tail: narrower tiles */
		pairs_configure(hw, X, (int)(kp - p0));
		pairs_block(hw, t, x, kp, half, p0, X, (int)(kp - p0), sums);
	}
	if (hw)
		_tile_release();
	for (int i = 0; i < X; i++)
		memcpy(y + i * ys, sums[i], (size_t)n * sizeof(float));
}

bool amx_pairs_supported(enum amx_mode mode)
{
	return mode == AMX_EMU || (mode == AMX_HW && amx_bf16_present());
}

void amx_pairs_run(enum amx_mode mode, const uint32_t *panel, int rows, const uint32_t *x,
		   int64_t m, int64_t kp, float *y, int64_t ys)
{
	for (int64_t i = 0; i < m; i += TILE_ROWS) {
		const int X = m - i < TILE_ROWS ? (int)(m - i) : TILE_ROWS;

		for (int h = 0; h < 2 && 16 * h < rows; h++)
			pairs_half(mode == AMX_HW, panel + 16 * h, rows - 16 * h < 16 ? rows - 16 * h : 16,
				   x + i * kp, kp, X, y + i * ys + 16 * h, ys);
	}
}

bool amx_supported(enum amx_mode mode, uint32_t type)
{
	if (!(qdot_format(type) || qdot_k_format(type)) || type == LOOM_TYPE_MXFP4)
		return false; /* mxfp4: no qgemm panels (qgemm.c) */
	if (mode == AMX_EMU)
		return qdot_isa_supported(QDOT_VNNI);
	return mode == AMX_HW && amx_hw_present();
}

void amx_qgemm_run(enum amx_mode mode, uint32_t type, const void *panel, int rows,
		   const struct qdot_block *x, const struct qgemm_x *prep, int64_t m, int64_t k,
		   float *y, int64_t ys)
{
	amx_run(mode == AMX_HW, panel, rows, x, prep, m, k, y, ys, qgemm_block(type),
		qgemm_has_min(type));
}
#else
bool amx_hw_present(void)
{
	return false;
}

int amx_request(char *why, size_t why_size)
{
	snprintf(why, why_size, "AMX is an x86-64 feature");
	return -1;
}

bool amx_supported(enum amx_mode mode, uint32_t type)
{
	(void)mode;
	(void)type;
	return false;
}

bool amx_pairs_supported(enum amx_mode mode)
{
	(void)mode;
	return false;
}

void amx_pairs_run(enum amx_mode mode, const uint32_t *panel, int rows, const uint32_t *x,
		   int64_t m, int64_t kp, float *y, int64_t ys)
{
	(void)mode; (void)panel; (void)rows; (void)x; (void)m; (void)kp; (void)y; (void)ys;
}

float amx_pairs_ref(const uint32_t *x, const uint32_t *w, int64_t kp)
{
	(void)x; (void)w; (void)kp;
	return 0.0f;
}

void amx_qgemm_run(enum amx_mode mode, uint32_t type, const void *panel, int rows,
		   const struct qdot_block *x, const struct qgemm_x *prep, int64_t m, int64_t k,
		   float *y, int64_t ys)
{
	(void)mode; (void)type; (void)panel; (void)rows; (void)x; (void)prep; (void)m; (void)k;
	(void)y; (void)ys;
}
#endif
