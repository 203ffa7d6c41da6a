/*
 * Prefill GEMM over f32 panels on AVX-512 and AVX2: y = x . W^T for
 * weights that are (or are dequantized to) f32, in place of
 * dequantize-then-OpenBLAS.
 *
 * A panel holds FGEMM_ROWS weight rows transposed: value kk of row r at
 * panel[kk * FGEMM_ROWS + r], rows past the weight's end zero. The kernel
 * keeps a tile of up to FGEMM_X activation rows by the panel's 32 rows in
 * registers (24 vectors), broadcasts one activation value at a time and
 * multiplies it into two vectors of weights. AVX2 takes the panel as two
 * halves of 16 rows (two 256-bit vectors each) and a tile of up to 6
 * activation rows by a half (12 accumulators of the 16 registers).
 *
 * Every element is one chain of fused multiply-adds in the order of k,
 * from 0.0f: y[i][r] = fma(x[i][k-1], w[r][k-1], ... fma(x[i][0],
 * w[r][0], 0.0f)), what fgemm_ref() computes in plain C. So a row's result
 * depends only on that row and the weights: not on m, the tile it sits
 * in, the k blocking or the thread that runs it.
 */
#ifndef LOOM_CPU_FGEMM_H
#define LOOM_CPU_FGEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu.h"

#define FGEMM_ROWS 32 /* weight rows a panel holds */
#define FGEMM_X 12    /* activation rows a tile holds */

/* Whether kernel set isa has the kernel (AVX-512F; AVX2 with FMA and F16C). */
bool fgemm_supported(enum cpu_isa isa);
/* Floats a panel of k values takes. */
size_t fgemm_panel_floats(int64_t k);
/* Transposes rows (<= FGEMM_ROWS) rows src, src + ss, ... of k 32-bit
 * values (f32, or bf16 pairs) into panel, bit for bit, with kernel set
 * isa (fgemm_supported()). */
void fgemm_panel_rows(enum cpu_isa isa, const void *src, int64_t ss, int rows, int64_t k,
		      void *panel);
/* fgemm_panel_rows() of rows (<= FGEMM_ROWS) f16 or bf16 rows (type),
 * ss bytes apart, converted on the way with the bits cpu_dequant_row()
 * gives them (one pass where dequantizing into rows and transposing
 * those took two); false, nothing done, where kernel set isa has no such
 * builder (AVX2 has). */
bool fgemm_panel_half(enum cpu_isa isa, uint32_t type, const void *src, size_t ss, int rows,
		      int64_t k, float *panel);
/* Sets row r (< FGEMM_ROWS) of panel from k f32 values. */
void fgemm_panel_set(float *panel, int r, const float *row, int64_t k);
/* The source rows of the panel a caller builds next: `rows` rows of
 * `bytes` at p, stride apart. */
struct fgemm_next {
	const uint8_t *p;
	size_t stride, bytes;
	int64_t rows;
};
/* y[i * ys + r] = x_i . w_r for i < m, r < rows (the panel's valid rows),
 * x_i = x + i * xs, with kernel set isa; every set gives the same bits.
 * next (may be NULL): rows the AVX2 set asks the memory for while it
 * computes, spread over its tiles, so the next panel's weights stream in
 * under this one's arithmetic rather than after it. */
void fgemm_run(enum cpu_isa isa, const float *panel, int rows, const float *x, int64_t xs,
	       int64_t m, int64_t k, float *y, int64_t ys, const struct fgemm_next *next);
/* The plain C reference of one element: the chain of fmaf in k order. */
float fgemm_ref(const float *x, const float *w, int64_t k);

/*
 * Fast mode, bf16 weights, on AVX512_BF16 (vdpbf16ps): the weights' bf16
 * values stay as they are, two consecutive ones a 32-bit panel slot (the
 * lower first, as in memory); the activations are rounded to bf16 (to
 * nearest, ties to even) once per call. One instruction adds 2 products
 * to each of 16 sums, twice an f32 FMA's. The instruction, as this CPU
 * runs it (and as Intel documents it), adds the pair's upper product and
 * then its lower one to the sum, each rounded to nearest even, inputs
 * and results that are denormal taken as zero: fgemm_pairs_ref().
 */
/* The f32 of bits u. */
static inline float fgemm_bits_f32(uint32_t u)
{
	float f;

	__builtin_memcpy(&f, &u, sizeof(f));
	return f;
}

/* Denormals as zero (the bf16 instructions' DAZ on inputs, FTZ on sums). */
static inline float fgemm_flush(float v)
{
	uint32_t u;

	__builtin_memcpy(&u, &v, sizeof(u));
	return (u & 0x7f800000u) ? v : fgemm_bits_f32(u & 0x80000000u);
}

/* The lower and upper bf16 of a pair as f32, denormals as zero. */
static inline float fgemm_pair_lo(uint32_t pair)
{
	return fgemm_flush(fgemm_bits_f32(pair << 16));
}

static inline float fgemm_pair_hi(uint32_t pair)
{
	return fgemm_flush(fgemm_bits_f32(pair & 0xffff0000u));
}

/* Whether the CPU has AVX512_BF16. */
bool fgemm_pairs_supported(enum cpu_isa isa);
/* f32 -> bf16, to nearest even (NaN quieted, denormals to zero):
 * vcvtne2ps2bf16 as this CPU runs it. */
uint16_t fgemm_bf16_round(float v);
/* k (even) values of x as k / 2 bf16 pairs. */
void fgemm_pairs_x(const float *x, int64_t k, uint32_t *out);
/* fgemm_run() on pairs: panel of kp pair slots, x rows kp pairs apart. */
void fgemm_pairs_run(const uint32_t *panel, int rows, const uint32_t *x, int64_t m, int64_t kp,
		     float *y, int64_t ys);
/* The reference of one element over kp pairs. */
float fgemm_pairs_ref(const uint32_t *x, const uint32_t *w, int64_t kp);

#endif /* LOOM_CPU_FGEMM_H */
