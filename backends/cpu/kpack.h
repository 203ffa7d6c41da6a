/*
 * The cpu backend's packed layout of every format it packs (ABI 1.2
 * weight_pack: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K), for the
 * fast mode's GEMV: rows in lanes. The kernels take 16 rows a vector on
 * AVX-512 VNNI (kpack.c) and 8 rows, a half of each 64-byte vector, on
 * AVX-VNNI and AVX2 (kpack_avx2.c).
 *
 * The GGUF-layout K-quant kernels (qdot_k.c) decode each row's 6-bit
 * sub-block scales, permute them across a vector and widen the products to
 * apply them, about 45 vector operations a row and super-block: they run
 * at 16-19 GB/s with the weights in cache, below what memory gives. Here
 * 16 rows share every vector: a 64-byte load holds 4 bytes of each of 16
 * rows, so one vpdpbusd against 4 activation bytes broadcast to every lane
 * adds 4 products to each row's int32 lane, and a sub-block's scale is one
 * vpmulld for 16 rows. A row and super-block then costs about 16.
 *
 * Q4_K. Rows go in groups of 16 (the last padded with zero rows); group G's
 * super-blocks lie one after the other, each 2368 bytes (16 x 148, the
 * GGUF 16 x 144 with the 12 packed scale bytes spread to 16):
 *
 *   0     d[16]      f16, row r's super-block scale (GGUF bits)
 *   32    dmin[16]   f16
 *   64    sc[8][16]  u8, sub-block s (values 32s .. 32s+31) of row r
 *   192   mn[8][16]  u8, its minimum
 *   320   q[8][4][16][4]  byte k of (s, v, r): value 32s + 8v + k of row r
 *                    in the low nibble, value 32s + 8v + 4 + k in the high
 *
 * Q5_K: the same, and after each sub-block's four nibble vectors a fifth
 * (64 bytes): bit 2v of byte k of row r is the fifth bit of value 32s + 8v
 * + k, bit 2v + 1 that of value 32s + 8v + 4 + k. 2880 bytes (16 x 180).
 *
 * Q6_K (u = q + 32, 6 bits): d[16] at 0, 32 bytes of padding, sc[16][16]
 * (int8, sub-blocks of 16 values) at 64, and from 320 per sub-block i 192
 * bytes: two nibble vectors as above (byte k of row r: value 16i + 8v + k
 * low, 16i + 8v + 4 + k high) and a vector whose bits 2c, 2c + 1 of byte
 * k are the top two bits of value 16i + 4c + k. 3392 bytes (16 x 212; the
 * padding keeps every super-block on a cache line).
 *
 * Q2_K and Q3_K (sub-blocks of 16 values, u = 2 bits, Q3_K's with a third
 * bit on top, q = u - 4): d[16] at 0, dmin[16] at 32 (Q2_K; Q3_K pads),
 * at 64 a byte per sub-block i and row r (Q2_K: the GGUF scale byte, scale
 * in the low nibble and minimum in the high; Q3_K: the 6-bit scale less
 * 32, as int8), from 320 one vector per sub-block whose byte k of row r
 * holds value 16i + 4c + k in bits 2c, 2c + 1, and for Q3_K from 1344 one
 * vector per two sub-blocks 2j, 2j + 1 whose bit c + 4h of byte k holds
 * the third bit of value 16 (2j + h) + 4c + k. Q2_K 1344 bytes (16 x 84,
 * its GGUF size), Q3_K 1856 (16 x 116; GGUF 16 x 110).
 *
 * The 32-value formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), in the same 16-row
 * groups: blocks go in pairs, whose bytes are the GGUF bytes exactly
 * (16 x 2 x 34, 18, 20, 22, 24):
 *
 *   0     d[2][16]   f16, the first block's scale of row r, then the
 *                    second's
 *   64    m[2][16]   f16 minima, likewise (Q4_1, Q5_1)
 *   then  h[2][16][4]   Q5: bit l of byte k of row r is the fifth bit of
 *                    value 4l + k (one 64-byte vector a block)
 *   then  the first block's quants, then the second's: lane l of a block
 *         holds values 4l .. 4l+3 of each row (byte k of row r: value
 *         4l + k). Q8_0: lane l is vector l, the values stored as q + 128
 *         (q ^ 80h, vpdpbusd's unsigned operand), 512 bytes; Q4/Q5: vector
 *         v holds lane 2v in its low nibbles and lane 2v + 1 in its high
 *         ones, 256 bytes.
 *
 * A last unpaired block keeps the same order with its fields padded to
 * cache lines (d at 0, m at 64, h and the quants after). Every field
 * starts on a cache line. A lane against 4 broadcast activation bytes is
 * one vpdpbusd (Q4/Q5: after a mask or shift, and the fifth bits) that adds
 * to the block's exact integer sum for 16 rows at once; the block then
 * adds to each row's one float as qdot.c's refseq() (qgemm's arithmetic)
 * does on AVX-512 VNNI and AVX2, and as ref8() does on AVX-VNNI.
 *
 * A row counts for nb * 84, 116, 148, 180 or 212 bytes (K-quants) or its GGUF
 * bytes (32-value formats; a few more for odd nb) (kpack_row_share()), so
 * a group's start is row 16G's at that stride, and the whole weight is
 * kpack_bytes(). Every field keeps the GGUF bits, so kpack_unpack_row()
 * gives the GGUF row back byte for byte and the kernels' results are
 * qdot_k_ref()'s (tests/backend/qdot_k.c) and qdot_ref()'s
 * (tests/backend/qdot.c) bit for bit.
 */
#ifndef LOOM_CPU_KPACK_H
#define LOOM_CPU_KPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"
#include "qdot.h"

#define KPACK_ROWS 16

/* Formats with a rows-in-lanes layout. */
bool kpack_format(uint32_t type);
/* Values of the blocks kpack counts in ("nb" below): 32 for Q8_0, 256
 * (super-blocks) for the K-quants; kpack_nb() of a row of k values. */
static inline int64_t kpack_block_elems(uint32_t type)
{
	return type >= LOOM_TYPE_Q2_K && type <= LOOM_TYPE_Q6_K ? 256 : 32;
}

static inline int64_t kpack_nb(uint32_t type, int64_t k)
{
	return k / kpack_block_elems(type);
}
/* Bytes one row of nb blocks counts for; 0 on overflow. */
size_t kpack_row_share(uint32_t type, int64_t nb);
/* Bytes of n packed rows of nb blocks (whole groups); 0 on overflow. */
size_t kpack_bytes(uint32_t type, int64_t n, int64_t nb);
/* GGUF rows src, src + src_stride, ... (rows <= KPACK_ROWS of them) into
 * one group at dst (nb blocks; missing rows are zero). */
void kpack_group(uint32_t type, const uint8_t *src, size_t src_stride, int rows, int64_t nb,
		 uint8_t *dst);
/* Row j of the packed weight w (nb blocks a row) back to its GGUF
 * row, byte for byte. */
void kpack_unpack_row(uint32_t type, const uint8_t *w, int64_t nb, int64_t j, uint8_t *dst);

/* qgemm_panel() of the group that starts at row j0 (a multiple of 16) of
 * the packed weight w: qgemm_panel_bytes(type, k) bytes for rows of k
 * values, the GGUF rows' panel bit for bit in every row the group holds. */
void kpack_panel(uint32_t type, const uint8_t *w, int64_t nb, int64_t j0, uint8_t *panel);
/* The same with the builders of at most `width` bits where the CPU runs
 * them (512, 256 or 0: plain C; every width gives the same bytes);
 * kpack_panel() takes the widest. */
void kpack_panel_width(uint32_t type, const uint8_t *w, int64_t nb, int64_t j0, uint8_t *panel,
		       int width);

/* y[j - j0] = w_j . x for rows j0 <= j < j1 of the packed weight w (nb
 * blocks a row) against one quantized activation row x: nb struct
 * qdot_block (32-value formats; bit for bit qdot_ref() of the GGUF row
 * for the kernel's set: block after block on AVX-512 VNNI, 8 lanes on
 * AVX-VNNI and AVX2)
 * or nb struct qdot_kblock (K-quants; qdot_k_ref() on every set). */
typedef void (*kpack_fn)(const uint8_t *w, const void *x, int64_t nb, float *y, int64_t j0,
			 int64_t j1);
/* The kernel (NULL unless isa is QDOT_VNNI, QDOT_AVXVNNI or QDOT_AVX2,
 * the CPU runs it, and kpack_format(type)). */
kpack_fn kpack_kernel(enum qdot_isa isa, uint32_t type);

/* kpack_fn for m activation rows x + i * nb (struct qdot_block or
 * qdot_kblock rows) into y + i * ys at once, each row's bits kpack_fn's:
 * the weights are read and unpacked once for up to 8 rows. */
typedef void (*kpack_mfn)(const uint8_t *w, const void *x, int m, int64_t nb, float *y,
			  int64_t ys, int64_t j0, int64_t j1);
/* The many-row kernel where there is one (AVX-512 VNNI and AVX2: the
 * 32-value formats but MXFP4, Q4_K, Q5_K, Q6_K), else NULL. */
kpack_mfn kpack_kernel_m(enum qdot_isa isa, uint32_t type);

/* The first byte of the group that holds row j0 of the packed weight w. */
const uint8_t *kpack_group_at(uint32_t type, const uint8_t *w, int64_t nb, int64_t j0);

struct qgemm_x;
/* qgemm_run() of the group g (kpack_group_at(); nb blocks a row, `rows`
 * of its rows wanted) read in place, without kpack_panel(): y[i * ys + r]
 * for i < m, r < rows against activation rows x + i * (k / 32) and their
 * prep, qgemm_run()'s bits of the group's panel. `cold`: the group is not
 * in cache (the first call on it): prefetch ahead while reading it. */
typedef void (*kpack_qgemm_fn)(const uint8_t *g, int rows, const struct qdot_block *x,
			       const struct qgemm_x *prep, int64_t m, int64_t nb, float *y,
			       int64_t ys, bool cold);
/* The kernel (kpack_qgemm.c: AVX-512 VNNI, Q4_K and Q5_K; AVX2, Q8_0),
 * else NULL. */
kpack_qgemm_fn kpack_qgemm(enum qdot_isa isa, uint32_t type);
/* Most activation rows a gemm should take kpack_qgemm()'s kernel for
 * (past them, panels cost less); 0 where isa has none for type. */
int64_t kpack_qgemm_max_m(enum qdot_isa isa, uint32_t type);

#endif /* LOOM_CPU_KPACK_H */
