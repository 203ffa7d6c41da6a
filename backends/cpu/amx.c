/* AMX-INT8 prefill GEMM: a tile layer in hardware or in C (amx.h). */
#include <stdio.h>
#include <string.h>

#include "amx.h"
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

ALWAYS TGT_AMX void tiles_configure(struct tiles *ts, int X, int B)
{
	if (ts->hw) {
		struct tile_config cfg;

		memset(&cfg, 0, sizeof(cfg));
		cfg.palette = 1;
		cfg.rows[0] = (uint8_t)X;
		cfg.colsb[0] = 64;
		cfg.rows[1] = (uint8_t)X;
		cfg.colsb[1] = (uint16_t)B;
		cfg.rows[2] = (uint8_t)(B / 4);
		cfg.colsb[2] = 64;
		_tile_loadconfig(&cfg);
	}
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

void amx_qgemm_run(enum amx_mode mode, uint32_t type, const void *panel, int rows,
		   const struct qdot_block *x, const struct qgemm_x *prep, int64_t m, int64_t k,
		   float *y, int64_t ys)
{
	(void)mode; (void)type; (void)panel; (void)rows; (void)x; (void)prep; (void)m; (void)k;
	(void)y; (void)ys;
}
#endif
