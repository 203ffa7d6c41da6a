/*
 * Fast-mode prefill GEMM (m >= 16, not batch invariant) for the formats
 * with 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the K-quants (in
 * blocks of their 16-value sub-blocks), on AVX-512 VNNI.
 *
 * Weight rows are taken 16 at a time into a panel that interleaves them:
 * for block b and group g of 4 values, 64 bytes holding those 4 values of
 * each of the 16 rows, as unsigned bytes (q + 128 for the signed formats).
 * One vpdpbusd of such a vector with 4 bytes of an activation row
 * broadcast adds 4 products into each row's lane, so 8 of them give the
 * 16 rows' exact integer dot products of the block, and the block's float
 * work (scale, minimum) is done once for 16 rows instead of once per row.
 *
 * Arithmetic of y[i][j] (one row j of the panel, one activation row i),
 * block after block, in float:
 *   acc = fma((float)(isum_b - off * xsum_b), dw_b * xd_b, acc)
 *   acc = fma(mw_b, xs_b, acc)             (formats with minima)
 * with isum_b the exact sum of (q + off) * xq over the block, off 128 for
 * the signed formats and 0 for the offset ones, xsum_b the sum of the
 * block's xq, xd_b and xs_b the activation block's scale and d * xsum_b;
 * dw_b is the block's scale (K-quants: d * sc as a float), mw_b its minimum
 * (K-quants: -dmin * mn).
 * qgemm_ref() is that in plain C; the kernel equals it bit for bit
 * (tests/backend/qdot.c). It differs from the decode kernels' rounding,
 * as the BLAS path it replaces did; batch-invariant contexts never use it.
 */
#ifndef LOOM_CPU_QGEMM_H
#define LOOM_CPU_QGEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qdot.h"

#define QGEMM_ROWS 16

/* One activation block as the kernel reads it (per qgemm_block() values):
 * scale d, s = d * (sum of its q) and fix = -off * (sum of its q). */
struct qgemm_x {
	float d, s;
	int32_t fix;
};

/* Whether kernel set isa has a kernel (AVX-512 VNNI; AVX-VNNI and AVX2 on
 * 256-bit vectors), the CPU runs it, and type has one. */
bool qgemm_supported(enum qdot_isa isa, uint32_t type);
/* Fewest activation rows type's gemm takes qgemm for (below, the GEMV). */
int64_t qgemm_min_m(uint32_t type);
/* Values per panel block: 32, or 16 for the K-quants (their sub-blocks). */
int qgemm_block(uint32_t type);
/* Bytes of one panel block of B values: B / 4 groups of 64 bytes, then
 * the 16 rows' scales and their 16 minima (floats). */
size_t qgemm_block_bytes(int B);
/* The offset type's weights enter with (qgemm_x.fix): 128 or 0. */
int qgemm_offset(uint32_t type);
/* Whether type's blocks have a minimum (the panel's minima are used). */
bool qgemm_has_min(uint32_t type);
/* Bytes of a panel of k values (a multiple of 64). */
size_t qgemm_panel_bytes(uint32_t type, int64_t k);
/* Builds the panel of rows [j0, j0 + rows) (rows <= 16; missing rows are
 * zeros in the GGUF case) from rows w + j * ws of k values: GGUF rows,
 * or with `packed` kpack.h's 16-row groups (j0 then a multiple of 16). */
void qgemm_panel(uint32_t type, const uint8_t *w, size_t ws, int64_t j0, int rows, int64_t k,
		 bool packed, void *panel);
/* An activation row's k / qgemm_block() blocks for the kernel, from its
 * qdot_quantize_row() blocks x. */
void qgemm_row_prep(uint32_t type, const struct qdot_block *x, int64_t k, struct qgemm_x *out);
/* y[i * ys + r] for i < m, r < rows: the panel's rows times activation rows
 * x + i * (k / 32) with their prep + i * (k / qgemm_block()), on set isa
 * (qgemm_supported()); every set gives qgemm_ref()'s bits. */
void qgemm_run(enum qdot_isa isa, uint32_t type, const void *panel, int rows,
	       const struct qdot_block *x, const struct qgemm_x *prep, int64_t m, int64_t k,
	       float *y, int64_t ys);
/* The plain C reference of one element: GGUF row w, activation row x. */
float qgemm_ref(uint32_t type, const uint8_t *w, const struct qdot_block *x, int64_t k);

#endif /* LOOM_CPU_QGEMM_H */
