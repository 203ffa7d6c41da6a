/*
 * Prefill GEMM over f32 panels on AVX-512: y = x . W^T for weights that
 * are (or are dequantized to) f32, in place of dequantize-then-OpenBLAS.
 *
 * A panel holds FGEMM_ROWS weight rows transposed: value kk of row r at
 * panel[kk * FGEMM_ROWS + r], rows past the weight's end zero. The kernel
 * keeps a tile of up to FGEMM_X activation rows by the panel's 32 rows in
 * registers (24 vectors), broadcasts one activation value at a time and
 * multiplies it into two vectors of weights.
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

/* Whether the CPU runs the kernel (AVX-512F). */
bool fgemm_supported(enum cpu_isa isa);
/* Floats a panel of k values takes. */
size_t fgemm_panel_floats(int64_t k);
/* Transposes rows (<= FGEMM_ROWS) f32 rows src, src + ss, ... of k
 * values into panel. */
void fgemm_panel_rows(const float *src, int64_t ss, int rows, int64_t k, float *panel);
/* Sets row r (< FGEMM_ROWS) of panel from k f32 values. */
void fgemm_panel_set(float *panel, int r, const float *row, int64_t k);
/* y[i * ys + r] = x_i . w_r for i < m, r < rows (the panel's valid rows),
 * x_i = x + i * xs. */
void fgemm_run(const float *panel, int rows, const float *x, int64_t xs, int64_t m, int64_t k,
	       float *y, int64_t ys);
/* The plain C reference of one element: the chain of fmaf in k order. */
float fgemm_ref(const float *x, const float *w, int64_t k);

#endif /* LOOM_CPU_FGEMM_H */
