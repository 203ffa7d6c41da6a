/*
 * Integer dot products of the cpu backend's fast (non-exact) mode.
 *
 * An activation row is quantized once per GEMM into blocks of 32 values
 * that line up with the weight blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and
 * MXFP4, whose E2M1 codes doubled are the integers 0..12 with a sign, and
 * its E8M0 scale halved); a
 * weight row times such a row is then a sum of integer block dot products,
 * each scaled by the two blocks' float scales.
 *
 * Every kernel has a plain C twin of the same arithmetic (qdot_ref): the
 * same exact integer sums per float lane, the same fused multiply-adds in
 * the same order and the same final reduction, so a kernel's result is
 * bitwise its reference's (tests/backend/qdot.c checks this).
 */
#ifndef LOOM_CPU_QDOT_H
#define LOOM_CPU_QDOT_H

#include <stdbool.h>
#include <stdint.h>

/*
 * One quantized activation block: x[e] ~ d * q[e], |q[e]| <= 127, q
 * rounded to nearest. s = d * sum(q), the block sum the offset formats
 * (Q4_1, Q5_1: w = dw*q + m) need for their m * sum(x) term.
 */
struct qdot_block {
	float d;
	float s;
	int8_t q[32];
};

/*
 * Kernel sets. The lane layout decides the result's rounding (but
 * QDOT_VNNI and QDOT_AVX2 add the blocks of every format other than MXFP4
 * one after another into a single float: qdot_seq()):
 *   QDOT_SCALAR, QDOT_AVX2  8 float lanes, lane l of every block holds the
 *   for MXFP4, QDOT_AVXVNNI integer sum of elements 4l..4l+3 (AVX-VNNI:
 *                           vpdpbusd on 256-bit vectors where AVX2 has
 *                           maddubs and madd)
 *   QDOT_AVX512 (and        16 float lanes: blocks in pairs, the even block
 *   QDOT_VNNI for MXFP4)    in lanes 0-7 and the odd one in lanes 8-15; the
 *                           offset formats' m * x.s of block b in lane
 *                           b % 16 of a second accumulator
 *   QDOT_VNNI, QDOT_AVX2,   one float a row, block after block (refseq(),
 *   the others              qgemm_ref()'s arithmetic: a row's bits are the
 *                           prefill GEMM's)
 * so scalar and AVX-VNNI agree bitwise, AVX2 with them for MXFP4 and with
 * VNNI for the others, AVX-512 and VNNI only for MXFP4. (The K-quant
 * kernels give the same bits on every set; on AVX-VNNI they are AVX2's.)
 */
enum qdot_isa { QDOT_SCALAR, QDOT_AVX2, QDOT_AVX512, QDOT_VNNI, QDOT_AVXVNNI, QDOT_N_ISA };

/*
 * An activation row's block scales as the 16-lane kernels load them: per
 * group of 16 blocks, their 16 d then their 16 s, zeros past the last
 * block; qdot_scales_len(nb) floats, filled by qdot_row_scales().
 */
static inline int64_t qdot_scales_len(int64_t nb)
{
	return (nb + 15) / 16 * 32;
}

/* y[r] = w_r . x for `rows` weight rows w_r = w + r * w_stride, nb blocks
 * each; xsc is x's scales (qdot_row_scales); y[r] is the same whatever
 * `rows` is. */
typedef void (*qdot_fn)(const uint8_t *w, size_t w_stride, const struct qdot_block *x,
			const float *xsc, int64_t nb, float *y, int rows);

/* Formats with an integer kernel. */
bool qdot_format(uint32_t type);
/* Whether the CPU runs the set (QDOT_VNNI: AVX-512 VNNI). */
bool qdot_isa_supported(enum qdot_isa isa);
const char *qdot_isa_name(enum qdot_isa isa);
/* The kernel of `type` for `isa` (NULL if either is unsupported). */
qdot_fn qdot_kernel(enum qdot_isa isa, uint32_t type);
/* A GGUF block's 32 integers (signed, or 0..31 for the offset formats),
 * scale and minimum (0 if none), as the references read them. */
void qdot_unpack_block(uint32_t type, const uint8_t *p, int8_t q[32], float *d, float *m);
/* Whether set isa adds type's blocks one after another into one float
 * (qdot.c's refseq(), qgemm_ref()'s arithmetic: AVX-512 VNNI and AVX2, all
 * but MXFP4), so a row's result is the same in the GEMV and the GEMM. */
bool qdot_seq(enum qdot_isa isa, uint32_t type);
/* The plain C reference of isa's arithmetic (never NULL for a qdot format). */
float qdot_ref(enum qdot_isa isa, uint32_t type, const uint8_t *w, const struct qdot_block *x,
	       int64_t nb);

/* Quantizes k values (a multiple of 32) into k / 32 blocks, with the
 * widest SIMD the CPU has; the blocks are qdot_quantize_row_c()'s, the
 * plain C version, byte for byte. */
void qdot_quantize_row(const float *x, struct qdot_block *out, int64_t k);
void qdot_quantize_row_c(const float *x, struct qdot_block *out, int64_t k);
/* x's nb block scales into sc[qdot_scales_len(nb)]. */
void qdot_row_scales(const struct qdot_block *x, int64_t nb, float *sc);

/* ---- K-quants (qdot_k.c): super-blocks of 256 values ---- */

/*
 * One quantized activation super-block, scaled per group of 32 values
 * (the Q4_K/Q5_K sub-block, two of the other formats' sub-blocks of 16):
 * x[e] ~ d[e / 32] * q[e], |q[e]| <= 127, q rounded to nearest;
 * bsums[i] = sum of q[16i .. 16i+15], what the K formats' per-sub-block
 * minima and offsets need. A group holding a NaN or inf has d = NaN and
 * q, bsums zero. (llama.cpp's Q8_K has one scale per 256; a scale per 32
 * halves the activation rounding error where a group is quieter than its
 * super-block's loudest value.)
 */
struct qdot_kblock {
	float d[8];
	int16_t bsums[16];
	int8_t q[256];
};

/*
 * y[r] = w_r . x for `rows` weight rows w_r = w + r * w_stride of nb
 * super-blocks each (Q2_K .. Q6_K).
 *
 * Layout of the arithmetic, the same for every kernel set: per super-block
 * b and group g of 32 values (sub-blocks i = 2g, 2g + 1 of 16), the
 * weights as unsigned integers u (q plus the format's offset: 32 for Q6_K,
 * 4 for Q3_K, 0 otherwise) give the exact int32
 *   isum_g = sum_i sc_i * (sum_{e in i} u_e * x.q_e  -  off * x.bsums_i)
 *   msum_g = sum_i mn_i * x.bsums_i              (Q2_K, Q4_K, Q5_K)
 * (sc, mn the sub-block's integer scale and minimum); in float, with the
 * products rounded,
 *   P_g = (float)isum_g * x_b.d[g],  Q_g = (float)msum_g * x_b.d[g]
 *   S = ((P_0 + P_1) + (P_2 + P_3)) + ((P_4 + P_5) + (P_6 + P_7)), M alike
 * (qdot_k_tree8()); then, super-block by super-block in order,
 *   y = fmaf(S, d_b, y)
 *   y = fmaf(-M, dmin_b, y)                      (formats with a minimum)
 * starting from y = 0. The lanes a SIMD kernel sums its integers in do not
 * matter (the sums are exact), so every kernel set gives the same bits,
 * and y[r] is the same whatever `rows` is.
 */
static inline float qdot_k_tree8(const float p[8])
{
	return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

typedef void (*qdot_k_fn)(const uint8_t *w, size_t w_stride, const struct qdot_kblock *x,
			  int64_t nb, float *y, int rows);

/* K formats with an integer kernel. */
bool qdot_k_format(uint32_t type);
/* The kernel of `type` for `isa` (NULL if either is unsupported). */
qdot_k_fn qdot_k_kernel(enum qdot_isa isa, uint32_t type);
/* Super-block p of K-quant t: its 256 unsigned values u (the value is
 * u - qdot_k_offset(t)), per 16 values the integer scale and minimum (0 if
 * none), and d, dmin (0 if none): value e = d * sc[e / 16] * (u[e] - off)
 * - dmin * mn[e / 16]. */
void qdot_k_unpack(uint32_t t, const uint8_t *p, uint8_t u[256], int sc[16], int mn[16],
		   float *d, float *dmin);
int qdot_k_offset(uint32_t t);
/* The plain C reference (the arithmetic above; the same for every set). */
float qdot_k_ref(uint32_t type, const uint8_t *w, const struct qdot_kblock *x, int64_t nb);
/* Quantizes k values (a multiple of 256) into k / 256 super-blocks. */
void qdot_k_quantize_row(const float *x, struct qdot_kblock *out, int64_t k);
void qdot_k_quantize_row_c(const float *x, struct qdot_kblock *out, int64_t k);

#endif /* LOOM_CPU_QDOT_H */
