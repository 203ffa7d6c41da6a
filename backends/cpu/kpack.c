/*
 * Rows-in-lanes weights (kpack.h): packing, unpacking, prefill panels and
 * the AVX-512 VNNI GEMV kernels (the 256-bit ones are in kpack_avx2.c).
 *
 * Compiled without -march flags; the kernel carries its target.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "kpack.h"
#include "kpack_at.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

bool kpack_format(uint32_t type)
{
	return b32(type) || (type >= LOOM_TYPE_Q2_K && type <= LOOM_TYPE_Q6_K);
}

static size_t gguf_bytes(uint32_t t)
{
	return cpu_block_bytes(t);
}

/* Where K-quant super-block b of a packed group starts. */
static size_t block_at(uint32_t t, int64_t b)
{
	return (size_t)b * kp_bytes(t);
}

size_t kpack_row_share(uint32_t type, int64_t nb)
{
	/* a row's share of the biggest packed block, a bound for all */
	const size_t most = kp_bytes(LOOM_TYPE_Q6_K) / KPACK_ROWS;

	if (!kpack_format(type) || nb < 0 || (uint64_t)nb > SIZE_MAX / most)
		return 0;
	return row_share(type, nb);
}

size_t kpack_bytes(uint32_t type, int64_t n, int64_t nb)
{
	size_t share = kpack_row_share(type, nb);
	uint64_t rows = n < 0 ? 0 : ((uint64_t)n + KPACK_ROWS - 1) / KPACK_ROWS * KPACK_ROWS;

	if (!share || rows > SIZE_MAX / share)
		return 0;
	return (size_t)rows * share;
}

/* 8 six-bit scales and minima (values 32j ..) back to Q4_K's 12 scale
 * bytes: the inverse of the decoding in qdot_k_unpack(). */
static void q4k_scales_back(const uint8_t sc[8], const uint8_t mn[8], uint8_t s[12])
{
	for (int j = 0; j < 4; j++) {
		s[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
		s[j + 4] = (uint8_t)((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
		s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
	}
}

/*
 * The packers read a GGUF block 8 bytes at a time: their nibbles (or
 * 2-bit fields) go to the packed lanes with shifts and masks on whole
 * words, where decoding the 256 values first and placing them one by one
 * took a third of a model's load (an 8B-shaped Q4_K_M file: 7 of 21 s at
 * one thread). A packed lane's 4 bytes hold values k (low nibble) and
 * 4 + k (high) for k = 0..3, so from a word w of 8 values (one a byte,
 * in its low bits) the lane is lane_of(w).
 */
#define NIBBLES 0x0F0F0F0F0F0F0F0Full
#define PAIRS 0x0303030303030303ull
#define BIT0 0x0101010101010101ull

static inline void wr32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static inline uint32_t lane_of(uint64_t w)
{
	return (uint32_t)w | (uint32_t)(w >> 32) << 4;
}

/* Q4_K's (Q5_K's) 6-bit scale and minimum of sub-block j from the 12
 * scale bytes s (the GGUF packing q4k_scales_back() makes). */
static inline void q4k_scale(const uint8_t *s, int j, uint8_t *sc, uint8_t *mn)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*mn = s[j + 4] & 63;
	} else {
		*sc = (uint8_t)((s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
		*mn = (uint8_t)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
	}
}

/* Where byte k of row r in nibble vector v (4: the fifth bits) of
 * sub-block s lies in a packed super-block. */
static inline size_t kp_qbyte(bool five, int s, int v, int r, int k)
{
	return KP_Q + (size_t)(kp_sub(five) * s + 64 * v + 4 * r + k);
}

/*
 * A Q4_K / Q5_K sub-block's value 8v + k (low nibble) and 8v + 4 + k
 * (high) in byte k of row r's lane in vector v; Q5_K's fifth bits of
 * those two at bits 2v and 2v + 1 of byte k in vector 4; the 6-bit scale
 * and minimum a byte each; d and dmin keep their f16 bits. Sub-blocks 2c
 * and 2c + 1 are the low and high nibbles of the same 32 GGUF bytes, and
 * the fifth bit of value 32s + i is bit s of qh[i].
 */
static void pack_q4k_block(bool five, const uint8_t *b, int r, uint8_t *p)
{
	const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);

	memcpy(p + KP_D + 2 * r, b, 2);
	memcpy(p + KP_DMIN + 2 * r, b + 2, 2);
	for (int s = 0; s < 8; s++)
		q4k_scale(b + 4, s, &p[KP_SC + 16 * s + r], &p[KP_MN + 16 * s + r]);
	for (int s = 0; s < 8; s++) {
		uint32_t fifth = 0;

		for (int v = 0; v < 4; v++) {
			const uint64_t w = cpu_rd64(qs + 32 * (s / 2) + 8 * v) >> (4 * (s % 2)) & NIBBLES;

			wr32(p + kp_qbyte(five, s, v, r, 0), lane_of(w));
			if (five) {
				const uint64_t h = cpu_rd64(qh + 8 * v) >> s & BIT0;

				fifth |= (uint32_t)h << (2 * v) | (uint32_t)(h >> 32) << (2 * v + 1);
			}
		}
		if (five)
			wr32(p + kp_qbyte(five, s, 4, r, 0), fifth);
	}
}

static void unpack_q4k_block(bool five, const uint8_t *p, int r, uint8_t *o)
{
	uint8_t sc[8], mn[8], u[256];
	uint8_t *qs = o + (five ? 48 : 16);

	memcpy(o, p + KP_D + 2 * r, 2);
	memcpy(o + 2, p + KP_DMIN + 2 * r, 2);
	for (int s = 0; s < 8; s++) {
		sc[s] = p[KP_SC + 16 * s + r];
		mn[s] = p[KP_MN + 16 * s + r];
		for (int v = 0; v < 4; v++)
			for (int k = 0; k < 4; k++) {
				uint8_t q = p[kp_qbyte(five, s, v, r, k)];
				uint8_t h = five ? p[kp_qbyte(five, s, 4, r, k)] : 0;

				u[32 * s + 8 * v + k] = (uint8_t)((q & 15) | (h >> (2 * v) & 1) << 4);
				u[32 * s + 8 * v + 4 + k] =
					(uint8_t)((q >> 4) | (h >> (2 * v + 1) & 1) << 4);
			}
	}
	q4k_scales_back(sc, mn, o + 4);
	for (int e = 0; e < 128; e++)
		qs[e] = (uint8_t)((u[64 * (e / 32) + e % 32] & 15) |
				  (u[64 * (e / 32) + 32 + e % 32] & 15) << 4);
	if (five) {
		memset(o + 16, 0, 32);
		for (int e = 0; e < 256; e++)
			o[16 + e % 32] |= (uint8_t)((u[e] >> 4) << (e / 32));
	}
}

/*
 * qgemm.h's panel block of 32 values of 16 rows: group g (values 4g ..
 * 4g+3) as 16 x 4 bytes, then the 16 rows' d * sc and -dmin * mn. In the
 * packed sub-block, vector v's low nibbles are group 2v and its high ones
 * group 2v + 1, so a block is 4 loads, 8 masks and the float products.
 */
static void panel_q4k(bool five, const uint8_t *g, int64_t nb, uint8_t *panel)
{
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + b * (five ? KP_Q5K : KP_Q4K);
		float d[KPACK_ROWS], dmin[KPACK_ROWS];

		for (int r = 0; r < KPACK_ROWS; r++) {
			d[r] = cpu_fp16_to_f32(cpu_rd16(p + KP_D + 2 * r));
			dmin[r] = cpu_fp16_to_f32(cpu_rd16(p + KP_DMIN + 2 * r));
		}
		for (int s = 0; s < 8; s++, panel += 8 * 64 + 2 * KPACK_ROWS * 4) {
			const uint8_t *q = p + KP_Q + kp_sub(five) * s;
			float *dw = (float *)(panel + 512), *mw = dw + KPACK_ROWS;

			for (int v = 0; v < 4; v++)
				for (int i = 0; i < 64; i++) {
					int h = five ? q[256 + i] >> (2 * v) : 0;

					panel[128 * v + i] = (uint8_t)((q[64 * v + i] & 15) | (h & 1) << 4);
					panel[128 * v + 64 + i] =
						(uint8_t)((q[64 * v + i] >> 4) | (h & 2) << 3);
				}
			for (int r = 0; r < KPACK_ROWS; r++) {
				dw[r] = d[r] * (float)p[KP_SC + 16 * s + r];
				mw[r] = -dmin[r] * (float)p[KP_MN + 16 * s + r];
			}
		}
	}
}

/* ---- Q6_K: u = q + 32 in 0..63, low 4 bits and high 2 ---- */

/* Sub-block i of a packed Q6_K super-block: byte k of row r's lane in
 * nibble vector v holds value 16i + 8v + k (low nibble) and 16i + 8v + 4
 * + k (high); in the high-bit vector, bits 2c, 2c + 1 hold the top bits of
 * value 16i + 4c + k. */
static inline size_t kp6_byte(int i, int vec, int r, int k)
{
	return KP_Q + (size_t)(KP6_SUB * i + 64 * vec + 4 * r + k);
}

/*
 * Sub-block i (values 16i ..) from GGUF: in each 128-value half n, quarter
 * q takes the low (q < 2) or high nibbles of ql[64n + 32 (q % 2) ..] and
 * bits 2q, 2q + 1 of qh[32n ..]; a sub-block is 16 of those bytes from
 * offset 16 (i % 2). The scales and d keep their GGUF bytes.
 */
static void pack_q6k_block(const uint8_t *b, int r, uint8_t *p)
{
	memcpy(p + KP_D + 2 * r, b + 208, 2);
	for (int i = 0; i < 16; i++) {
		const int n = i / 8, q = i % 8 / 2, i0 = 16 * (i % 2);
		const uint8_t *lo = b + 64 * n + 32 * (q % 2) + i0, *hi = b + 128 + 32 * n + i0;
		const uint64_t a = cpu_rd64(lo) >> (4 * (q / 2)) & NIBBLES;
		const uint64_t c = cpu_rd64(lo + 8) >> (4 * (q / 2)) & NIBBLES;
		const uint64_t ha = cpu_rd64(hi) >> (2 * q) & PAIRS, hc = cpu_rd64(hi + 8) >> (2 * q) & PAIRS;

		p[KP_SC + 16 * i + r] = b[192 + i];
		wr32(p + kp6_byte(i, 0, r, 0), lane_of(a));
		wr32(p + kp6_byte(i, 1, r, 0), lane_of(c));
		/* bits 2c, 2c + 1 of byte k: the top bits of value 4c + k */
		wr32(p + kp6_byte(i, 2, r, 0), (uint32_t)ha | (uint32_t)(ha >> 32) << 2 |
						       (uint32_t)hc << 4 | (uint32_t)(hc >> 32) << 6);
	}
}

/* Value e (0..255) of row r of a packed Q6_K super-block, as u. */
static inline int kp6_u(const uint8_t *p, int r, int e)
{
	const int i = e / 16, c = e % 16 / 4, k = e % 4;
	const int lo = p[kp6_byte(i, c / 2, r, k)] >> (4 * (c % 2)) & 15;

	return lo | (p[kp6_byte(i, 2, r, k)] >> (2 * c) & 3) << 4;
}

static void unpack_q6k_block(const uint8_t *p, int r, uint8_t *o)
{
	memset(o, 0, 192);
	for (int e = 0; e < 256; e++) {
		const int g = e / 32, u = kp6_u(p, r, e);

		o[64 * (g / 4) + 32 * (g % 2) + e % 32] |= (uint8_t)((u & 15) << (4 * (g / 2 % 2)));
		o[128 + 32 * (g / 4) + e % 32] |= (uint8_t)((u >> 4) << (2 * (g % 4)));
	}
	for (int i = 0; i < 16; i++)
		o[192 + i] = p[KP_SC + 16 * i + r];
	memcpy(o + 208, p + KP_D + 2 * r, 2);
}

/* qgemm.h's panel blocks of 16 values: group c (values 4c .. 4c+3) as
 * 16 x 4 bytes of u + 96 (q + 128), then d * sc and -dmin * mn (dmin 0). */
static void panel_q6k(const uint8_t *g, int64_t nb, uint8_t *panel)
{
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + b * KP_Q6K;
		float d[KPACK_ROWS];

		for (int r = 0; r < KPACK_ROWS; r++)
			d[r] = cpu_fp16_to_f32(cpu_rd16(p + KP_D + 2 * r));
		for (int i = 0; i < 16; i++, panel += 4 * 64 + 2 * KPACK_ROWS * 4) {
			const uint8_t *q = p + KP_Q + KP6_SUB * i;
			float *dw = (float *)(panel + 256), *mw = dw + KPACK_ROWS;

			for (int c = 0; c < 4; c++)
				for (int n = 0; n < 64; n++)
					panel[64 * c + n] = (uint8_t)(
						(q[64 * (c / 2) + n] >> (4 * (c % 2)) & 15) +
						(q[128 + n] >> (2 * c) & 3) * 16 + 96);
			for (int r = 0; r < KPACK_ROWS; r++) {
				dw[r] = d[r] * (float)(int8_t)p[KP_SC + 16 * i + r];
				mw[r] = -0.0f * 0.0f; /* qgemm_panel()'s -dmin * mn */
			}
		}
	}
}

/* ---- Q2_K, Q3_K: 2-bit values (Q3_K: and a third bit) ---- */

/* Byte k of row r in sub-block i's vector of 2-bit values: bits 2c, 2c + 1
 * hold value 16i + 4c + k. In Q3_K's vector j of third bits, bit c + 4h of
 * byte k of row r is that of value 16 (2j + h) + 4c + k. */
static inline size_t kq_byte(int i, int r, int k)
{
	return KP_Q + (size_t)(64 * i + 4 * r + k);
}

static inline size_t kq_hbyte(int j, int r, int k)
{
	return KP3_H + (size_t)(64 * j + 4 * r + k);
}

/* Q3_K's 6-bit scale of sub-block i from its 12 GGUF bytes s (the
 * packing q3k_scales_back() makes): low 4 bits from s[i % 8], high 2 from
 * s[8 + i % 4]. */
static inline int q3k_scale(const uint8_t *s, int i)
{
	return (s[i % 8] >> (4 * (i / 8)) & 15) | (s[8 + i % 4] >> (2 * (i / 4)) & 3) << 4;
}

/*
 * Sub-block i (values 16i ..): in each 128-value half n, the 2-bit fields
 * 2j of qs[32n + 16 (i % 2) ..] with j = i % 8 / 2, so byte k of the lane
 * takes those of GGUF bytes k, 4 + k, 8 + k, 12 + k; Q3_K's third bit of
 * value 32h + m is bit h of hmask[m]. Q2_K's scale bytes and both
 * formats' f16 keep their GGUF bits, Q3_K's 6-bit scales are kept less
 * 32 (as int8). Words at a time, as the other packers.
 */
static void pack_kq_block(uint32_t t, const uint8_t *b, int r, uint8_t *p)
{
	const bool q3 = t == LOOM_TYPE_Q3_K;
	const uint8_t *qs = b + (q3 ? 32 : 16);

	memcpy(p + KP_D + 2 * r, b + (q3 ? 108 : 80), 2);
	if (!q3)
		memcpy(p + KP_DMIN + 2 * r, b + 82, 2);
	for (int i = 0; i < 16; i++) {
		const uint8_t *src = qs + 32 * (i / 8) + 16 * (i % 2);
		const int j = i % 8 / 2;
		const uint64_t a = cpu_rd64(src) >> (2 * j) & PAIRS, c = cpu_rd64(src + 8) >> (2 * j) & PAIRS;

		p[KP_SC + 16 * i + r] = q3 ? (uint8_t)(int8_t)(q3k_scale(b + 96, i) - 32) : b[i];
		wr32(p + kq_byte(i, r, 0), (uint32_t)a | (uint32_t)(a >> 32) << 2 |
						   (uint32_t)c << 4 | (uint32_t)(c >> 32) << 6);
		if (q3) { /* bit c + 4 (i % 2) of byte k: value 16i + 4c + k */
			const uint8_t *hm = b + 16 * (i % 2);
			const uint64_t ha = cpu_rd64(hm) >> (i / 2) & BIT0, hc = cpu_rd64(hm + 8) >> (i / 2) & BIT0;
			const uint32_t h = (uint32_t)ha | (uint32_t)(ha >> 32) << 1 | (uint32_t)hc << 2 |
					   (uint32_t)(hc >> 32) << 3;

			wr32(p + kq_hbyte(i / 2, r, 0),
			     cpu_rd32(p + kq_hbyte(i / 2, r, 0)) | h << (4 * (i % 2)));
		}
	}
}

/* Value e (0..255) of row r of a packed Q2_K / Q3_K super-block, as u. */
static inline int kq_u(bool q3, const uint8_t *p, int r, int e)
{
	const int i = e / 16, c = e % 16 / 4, k = e % 4;
	const int lo = p[kq_byte(i, r, k)] >> (2 * c) & 3;

	return q3 ? lo | (p[kq_hbyte(i / 2, r, k)] >> (c + 4 * (i % 2)) & 1) << 2 : lo;
}

/* 16 six-bit Q3_K scales back to their 12 GGUF bytes (qdot_k.c's
 * ref_scales() decodes them). */
static void q3k_scales_back(const int v[16], uint8_t s[12])
{
	for (int j = 0; j < 8; j++)
		s[j] = (uint8_t)((v[j] & 15) | (v[j + 8] & 15) << 4);
	for (int m = 0; m < 4; m++)
		s[8 + m] = (uint8_t)((v[m] >> 4 & 3) | (v[m + 4] >> 4 & 3) << 2 |
				     (v[m + 8] >> 4 & 3) << 4 | (v[m + 12] >> 4 & 3) << 6);
}

static void unpack_kq_block(uint32_t t, const uint8_t *p, int r, uint8_t *o)
{
	const bool q3 = t == LOOM_TYPE_Q3_K;
	uint8_t *qs = o + (q3 ? 32 : 16);
	int v[16];

	memset(o, 0, cpu_block_bytes(t));
	for (int e = 0; e < 256; e++) {
		const int g = e / 32, u = kq_u(q3, p, r, e);

		qs[32 * (g / 4) + e % 32] |= (uint8_t)((u & 3) << (2 * (g % 4)));
		if (q3)
			o[e % 32] |= (uint8_t)((u >> 2) << g);
	}
	for (int i = 0; i < 16; i++) {
		v[i] = (int8_t)p[KP_SC + 16 * i + r] + 32;
		if (!q3)
			o[i] = p[KP_SC + 16 * i + r];
	}
	if (q3)
		q3k_scales_back(v, o + 96);
	memcpy(o + (q3 ? 108 : 80), p + KP_D + 2 * r, 2);
	if (!q3)
		memcpy(o + 82, p + KP_DMIN + 2 * r, 2);
}

/* qgemm.h's panel blocks of 16 values, as panel_q6k() makes them: u plus
 * 124 for Q3_K (q + 128), as it is for Q2_K (a minimum format). */
static void panel_kq(uint32_t t, const uint8_t *g, int64_t nb, uint8_t *panel)
{
	const bool q3 = t == LOOM_TYPE_Q3_K;

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + b * kp_bytes(t);
		float d[KPACK_ROWS], dmin[KPACK_ROWS];

		for (int r = 0; r < KPACK_ROWS; r++) {
			d[r] = cpu_fp16_to_f32(cpu_rd16(p + KP_D + 2 * r));
			dmin[r] = q3 ? 0.0f : cpu_fp16_to_f32(cpu_rd16(p + KP_DMIN + 2 * r));
		}
		for (int i = 0; i < 16; i++, panel += 4 * 64 + 2 * KPACK_ROWS * 4) {
			float *dw = (float *)(panel + 256), *mw = dw + KPACK_ROWS;

			const uint8_t *restrict q = p + KP_Q + 64 * i;
			const uint8_t *restrict h = p + KP3_H + 64 * (i / 2);

			/* byte n of group c: row n / 4's value 16i + 4c + n % 4 */
			for (int c = 0; c < 4; c++) {
				uint8_t *restrict out = panel + 64 * c;
				const int hs = c + 4 * (i % 2);

				if (q3)
					for (int n = 0; n < 64; n++)
						out[n] = (uint8_t)((q[n] >> (2 * c) & 3) |
								   (h[n] >> hs & 1) << 2) + 124;
				else
					for (int n = 0; n < 64; n++)
						out[n] = q[n] >> (2 * c) & 3;
			}
			for (int r = 0; r < KPACK_ROWS; r++) {
				uint8_t sb = p[KP_SC + 16 * i + r];

				dw[r] = d[r] * (float)(q3 ? (int8_t)sb : sb & 15);
				mw[r] = -dmin[r] * (float)(q3 ? 0 : sb >> 4);
			}
		}
	}
}

/* ---- 32-value blocks: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 ---- */

/* Bits 0..3 of x to bit 0 of bytes 0..3 (bit k moves 7k places up;
 * no two of the four products overlap). */
static inline uint32_t spread4(uint32_t x)
{
	return x * 0x00204081u & 0x01010101u;
}

/*
 * Block b of GGUF row r into the group at g (nb blocks): value e = 4l + k
 * goes to byte 4r + k of lane l's vector (Q8_0: vector l, as q + 128;
 * Q4/Q5: vector l / 2, low nibble for even l, high for odd), its fifth
 * bit (Q5: bit e of qh) to bit l of byte 4r + k of the h vector. So
 * vector j of a 4-bit block is lane_of() of values 8j .. 8j + 7, the low
 * (j < 2) or high nibbles of GGUF bytes 8 (j % 2) .., words at a time as
 * in the K-quant packers.
 */
static void pack_b32_block(uint32_t t, const uint8_t *blk, int r, int64_t b, int64_t nb,
			   uint8_t *g)
{
	const struct b32_at at = b32_at(t, b, nb);
	const uint8_t *qs = blk + 2 + (b32_min(t) ? 2 : 0) + (b32_q5(t) ? 4 : 0);

	memcpy(g + at.d + 2 * r, blk, 2);
	if (b32_min(t))
		memcpy(g + at.m + 2 * r, blk + 2, 2);
	if (t == LOOM_TYPE_Q8_0) {
		for (int l = 0; l < 8; l++)
			wr32(g + at.q + 64 * l + 4 * r, cpu_rd32(qs + 4 * l) ^ 0x80808080u);
		return;
	}
	for (int j = 0; j < 4; j++)
		wr32(g + at.q + 64 * j + 4 * r,
		     lane_of(cpu_rd64(qs + 8 * (j % 2)) >> (4 * (j / 2)) & NIBBLES));
	if (b32_q5(t)) {
		const uint32_t qh = cpu_rd32(qs - 4);
		uint32_t h = 0;

		for (int l = 0; l < 8; l++)
			h |= spread4(qh >> (4 * l) & 15) << l;
		wr32(g + at.h + 4 * r, h);
	}
}

/* Value e of row r of block b, as the unsigned operand. */
static inline int b32_u(uint32_t t, const uint8_t *g, struct b32_at at, int r, int e)
{
	const int l = e / 4, k = e % 4;

	if (t == LOOM_TYPE_Q8_0)
		return g[at.q + 64 * l + 4 * r + k];
	return (g[at.q + 64 * (l / 2) + 4 * r + k] >> (4 * (l % 2)) & 15) |
	       (b32_q5(t) ? (g[at.h + 4 * r + k] >> l & 1) << 4 : 0);
}

static void unpack_b32_block(uint32_t t, const uint8_t *g, int r, int64_t b, int64_t nb,
			     uint8_t *o)
{
	const struct b32_at at = b32_at(t, b, nb);
	size_t qs = b32_min(t) ? 4 : 2;
	uint8_t u[32];

	for (int e = 0; e < 32; e++)
		u[e] = (uint8_t)b32_u(t, g, at, r, e);
	memcpy(o, g + at.d + 2 * r, 2);
	if (b32_min(t))
		memcpy(o + 2, g + at.m + 2 * r, 2);
	if (t == LOOM_TYPE_Q8_0) {
		for (int e = 0; e < 32; e++)
			o[2 + e] = u[e] ^ 0x80;
		return;
	}
	if (b32_q5(t)) {
		uint32_t qh = 0;

		for (int e = 0; e < 32; e++)
			qh |= (uint32_t)(u[e] >> 4) << e;
		for (int i = 0; i < 4; i++)
			o[qs + i] = (uint8_t)(qh >> (8 * i));
		qs += 4;
	}
	for (int j = 0; j < 16; j++)
		o[qs + j] = (uint8_t)((u[j] & 15) | (u[j + 16] & 15) << 4);
}

/* qgemm.h's panel blocks: lane l's 16 x 4 bytes (q + 128 for the signed
 * formats), then d and the minimum (0 if none). Q8_0's lanes are its
 * quant vectors as they are; a Q4/Q5 nibble vector gives two lanes (byte
 * loops, which the compiler vectorizes). */
/* An f16 scale as the GGUF-layout panel widens it (qdot_unpack_block():
 * F16C, which makes a signalling NaN quiet). */
static float f16_quiet(uint16_t h)
{
	float f = cpu_fp16_to_f32(h);

	return isnan(f) ? f + 0.0f : f;
}

static void panel_b32(uint32_t t, const uint8_t *g, int64_t nb, uint8_t *panel)
{
	const int add = t == LOOM_TYPE_Q4_0 ? 120 : t == LOOM_TYPE_Q5_0 ? 112 : 0;
	static const uint8_t zero[64];

	for (int64_t b = 0; b < nb; b++, panel += 512 + 2 * KPACK_ROWS * 4) {
		const struct b32_at at = b32_at(t, b, nb);
		const uint8_t *h = b32_q5(t) ? g + at.h : zero;
		float *dw = (float *)(panel + 512);

		if (t == LOOM_TYPE_Q8_0)
			memcpy(panel, g + at.q, 512);
		else
			for (int v = 0; v < 4; v++) {
				const uint8_t *q = g + at.q + 64 * v;
				uint8_t *lo = panel + 128 * v, *hi = lo + 64;

				for (int i = 0; i < 64; i++) {
					lo[i] = (uint8_t)(((q[i] & 15) | (h[i] >> (2 * v) & 1) << 4) + add);
					hi[i] = (uint8_t)(((q[i] >> 4) | (h[i] >> (2 * v + 1) & 1) << 4) + add);
				}
			}
		for (int r = 0; r < KPACK_ROWS; r++) {
			dw[r] = f16_quiet(cpu_rd16(g + at.d + 2 * r));
			dw[KPACK_ROWS + r] = b32_min(t) ? f16_quiet(cpu_rd16(g + at.m + 2 * r)) : 0.0f;
		}
	}
}

/* ---- any format ---- */

void kpack_group(uint32_t type, const uint8_t *src, size_t src_stride, int rows, int64_t nb,
		 uint8_t *dst)
{
	const size_t gb = gguf_bytes(type);

	memset(dst, 0, row_share(type, nb) * KPACK_ROWS);
	for (int r = 0; r < rows; r++)
		for (int64_t b = 0; b < nb; b++) {
			const uint8_t *s = src + r * src_stride + b * gb;

			if (b32(type))
				pack_b32_block(type, s, r, b, nb, dst);
			else if (type == LOOM_TYPE_Q2_K || type == LOOM_TYPE_Q3_K)
				pack_kq_block(type, s, r, dst + block_at(type, b));
			else if (type == LOOM_TYPE_Q6_K)
				pack_q6k_block(s, r, dst + block_at(type, b));
			else
				pack_q4k_block(type == LOOM_TYPE_Q5_K, s, r, dst + block_at(type, b));
		}
}

const uint8_t *kpack_group_at(uint32_t type, const uint8_t *w, int64_t nb, int64_t j0)
{
	return w + (size_t)(j0 / KPACK_ROWS) * row_share(type, nb) * KPACK_ROWS;
}

void kpack_unpack_row(uint32_t type, const uint8_t *w, int64_t nb, int64_t j, uint8_t *dst)
{
	const uint8_t *g = kpack_group_at(type, w, nb, j);
	const int r = (int)(j % KPACK_ROWS);

	for (int64_t b = 0; b < nb; b++) {
		uint8_t *o = dst + b * gguf_bytes(type);

		if (b32(type))
			unpack_b32_block(type, g, r, b, nb, o);
		else if (type == LOOM_TYPE_Q2_K || type == LOOM_TYPE_Q3_K)
			unpack_kq_block(type, g + block_at(type, b), r, o);
		else if (type == LOOM_TYPE_Q6_K)
			unpack_q6k_block(g + block_at(type, b), r, o);
		else
			unpack_q4k_block(type == LOOM_TYPE_Q5_K, g + block_at(type, b), r, o);
	}
}

#if defined(__x86_64__)
/*
 * The panel builders above on 512-bit vectors (they run at every prefill
 * GEMM, for every 16 weight rows: in C they took about a tenth of a 1B
 * model's prefill). Same bytes and floats: the nibbles are split with
 * 16-bit shifts masked per byte, the f16 scales widened with vcvtph2ps.
 * The K-quant builders prefetch ahead as the GEMVs do: with only the
 * chunk-ahead prefetch into L2 (gemm.c, next_weights) a Q4_K build still
 * waited on its loads for half its time (1B-shaped pp64 at 1 thread:
 * builds 350 Mcycles with this off, 250 with it, 130 with the weights
 * already in cache).
 * backend_qdot and backend_qdot_k hold kpack_panel() to qgemm_panel() of
 * the GGUF rows byte for byte, special scales (NaNs, subnormals) too.
 */
#define TGT_PANEL __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

/* 16 f16 scales widened (exact; a signalling NaN comes out quiet, as the
 * GGUF-layout panel's _cvtsh_ss gives it). */
TGT_PANEL static inline __attribute__((always_inline)) __m512 f16x16(const uint8_t *p)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

TGT_PANEL static void panel_b32_512(uint32_t t, const uint8_t *g, int64_t nb, uint8_t *panel)
{
	const __m512i add = _mm512_set1_epi8(t == LOOM_TYPE_Q4_0 ? 120 : t == LOOM_TYPE_Q5_0 ? 112 : 0);
	const __m512i m4 = _mm512_set1_epi8(15);

	for (int64_t b = 0; b < nb; b++, panel += 512 + 2 * KPACK_ROWS * 4) {
		const struct b32_at at = b32_at(t, b, nb);
		const __m512i h = b32_q5(t) ? _mm512_loadu_si512(g + at.h) : _mm512_setzero_si512();
		float *dw = (float *)(panel + 512);

		if (t == LOOM_TYPE_Q8_0)
			memcpy(panel, g + at.q, 512);
		else
			for (int v = 0; v < 4; v++) {
				const __m512i q = _mm512_loadu_si512(g + at.q + 64 * v);
				__m512i lo = _mm512_and_si512(q, m4);
				__m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);

				lo = _mm512_add_epi8(_mm512_or_si512(lo, kp_fifth(h, 2 * v)), add);
				hi = _mm512_add_epi8(_mm512_or_si512(hi, kp_fifth(h, 2 * v + 1)), add);
				_mm512_storeu_si512(panel + 128 * v, lo);
				_mm512_storeu_si512(panel + 128 * v + 64, hi);
			}
		_mm512_storeu_ps(dw, f16x16(g + at.d));
		_mm512_storeu_ps(dw + KPACK_ROWS,
				 b32_min(t) ? f16x16(g + at.m) : _mm512_setzero_ps());
	}
}

TGT_PANEL static void panel_q4k_512(bool five, const uint8_t *g, int64_t nb, uint8_t *panel)
{
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + b * (five ? KP_Q5K : KP_Q4K);
		__m512 d, ndmin;

		q45k_d(p, &d, &ndmin);
		kpack_prefetch(p, five ? KP_Q5K : KP_Q4K);
		for (int s = 0; s < 8; s++, panel += 8 * 64 + 2 * KPACK_ROWS * 4) {
			__m512i w[8];
			__m512 dw, mw;

			q45k_sub(five, p, s, w);
			q45k_scales(p, s, d, ndmin, &dw, &mw);
			for (int k = 0; k < 8; k++)
				_mm512_storeu_si512(panel + 64 * k, w[k]);
			_mm512_storeu_ps(panel + 512, dw);
			_mm512_storeu_ps(panel + 512 + 64, mw);
		}
	}
}

TGT_PANEL static void panel_q6k_512(const uint8_t *g, int64_t nb, uint8_t *panel)
{
	const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);
	const __m512i add = _mm512_set1_epi8(96);

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + b * KP_Q6K;
		const __m512 d = f16x16(p + KP_D);

		kpack_prefetch(p, KP_Q6K);

		for (int i = 0; i < 16; i++, panel += 4 * 64 + 2 * KPACK_ROWS * 4) {
			const uint8_t *q = p + KP_Q + KP6_SUB * i;
			const __m512i top = _mm512_loadu_si512(q + 128);
			const __m128i sc = _mm_loadu_si128((const __m128i *)(p + KP_SC + 16 * i));

			for (int c = 0; c < 4; c++) {
				const __m512i x = _mm512_loadu_si512(q + 64 * (c / 2));
				const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(x, 4 * (c % 2)), m4);
				const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(top, 2 * c), m2);

				_mm512_storeu_si512(panel + 64 * c,
						    _mm512_add_epi8(_mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)), add));
			}
			_mm512_storeu_ps(panel + 256, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc))));
			_mm512_storeu_ps(panel + 256 + 64, _mm512_set1_ps(-0.0f * 0.0f));
		}
	}
}

/*
 * The same on 256-bit vectors, for hosts with AVX2 but not AVX-512 (their
 * panels were built in C: against that, a 1B-shaped Q4_K_M pp64 at 2
 * threads emulated on this project's AVX-512 host gained about 7 %,
 * docs/BENCHMARKS.md). A 64-byte vector is two loads; same bytes and
 * floats as above.
 */
#define TGT_PANEL8 __attribute__((target("avx2,f16c")))

/* 8 f16 scales widened, as f16x16(). */
TGT_PANEL8 static inline __attribute__((always_inline)) __m256 f16x8(const uint8_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* kp_fifth() on 256 bits. */
TGT_PANEL8 static inline __attribute__((always_inline)) __m256i fifth8(__m256i v, int s)
{
	return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(v, s), _mm256_set1_epi8(1)),
				 4);
}

/* 16 u8 (or, with sign, int8) scales v times d, as two vectors of 8. */
TGT_PANEL8 static inline __attribute__((always_inline)) void
scales8v(__m128i v, bool sign, __m256 d0, __m256 d1, float *out)
{
	const __m256i a = sign ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
	const __m256i b = sign ? _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)) :
				 _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8));

	_mm256_storeu_ps(out, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(a)));
	_mm256_storeu_ps(out + 8, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(b)));
}

/* The same from 16 bytes at sc. */
TGT_PANEL8 static inline __attribute__((always_inline)) void
scales8(const uint8_t *sc, bool sign, __m256 d0, __m256 d1, float *out)
{
	scales8v(_mm_loadu_si128((const __m128i *)sc), sign, d0, d1, out);
}

/* 8 f16 scales widened, the sign flipped bit-wise (-dmin). */
TGT_PANEL8 static inline __attribute__((always_inline)) __m256 nf16x8(const uint8_t *p)
{
	return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(f16x8(p)),
						    _mm256_set1_epi32((int)0x80000000)));
}

TGT_PANEL8 static void panel_b32_256(uint32_t t, const uint8_t *g, int64_t nb, uint8_t *panel)
{
	const __m256i add = _mm256_set1_epi8(t == LOOM_TYPE_Q4_0 ? 120 : t == LOOM_TYPE_Q5_0 ? 112 : 0);
	const __m256i m4 = _mm256_set1_epi8(15);

	for (int64_t b = 0; b < nb; b++, panel += 512 + 2 * KPACK_ROWS * 4) {
		const struct b32_at at = b32_at(t, b, nb);
		float *dw = (float *)(panel + 512);

		if (t == LOOM_TYPE_Q8_0)
			memcpy(panel, g + at.q, 512);
		else
			for (int v = 0; v < 8; v++) { /* half v % 2 of vector v / 2 */
				const int o = 64 * (v / 2) + 32 * (v % 2);
				const __m256i q = _mm256_loadu_si256((const __m256i *)(g + at.q + o));
				const __m256i h = b32_q5(t) ? _mm256_loadu_si256((const __m256i *)(
								      g + at.h + 32 * (v % 2))) :
							      _mm256_setzero_si256();
				__m256i lo = _mm256_and_si256(q, m4);
				__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);

				lo = _mm256_add_epi8(_mm256_or_si256(lo, fifth8(h, 2 * (v / 2))), add);
				hi = _mm256_add_epi8(_mm256_or_si256(hi, fifth8(h, 2 * (v / 2) + 1)), add);
				_mm256_storeu_si256((__m256i *)(panel + 128 * (v / 2) + 32 * (v % 2)), lo);
				_mm256_storeu_si256((__m256i *)(panel + 128 * (v / 2) + 64 + 32 * (v % 2)),
						    hi);
			}
		for (int k = 0; k < 2; k++) {
			_mm256_storeu_ps(dw + 8 * k, f16x8(g + at.d + 16 * k));
			_mm256_storeu_ps(dw + KPACK_ROWS + 8 * k,
					 b32_min(t) ? f16x8(g + at.m + 16 * k) : _mm256_setzero_ps());
		}
	}
}

TGT_PANEL8 static void panel_q4k_256(bool five, const uint8_t *g, int64_t nb, uint8_t *panel)
{
	const __m256i m4 = _mm256_set1_epi8(15);
	const __m256 neg = _mm256_set1_ps(-0.0f);

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + b * (five ? KP_Q5K : KP_Q4K);
		const __m256 d0 = f16x8(p + KP_D), d1 = f16x8(p + KP_D + 16);
		const __m256 n0 = _mm256_xor_ps(f16x8(p + KP_DMIN), neg);
		const __m256 n1 = _mm256_xor_ps(f16x8(p + KP_DMIN + 16), neg);

		kpack_prefetch(p, five ? KP_Q5K : KP_Q4K);
		for (int s = 0; s < 8; s++, panel += 8 * 64 + 2 * KPACK_ROWS * 4) {
			const uint8_t *q = p + KP_Q + kp_sub(five) * s;

			for (int v = 0; v < 8; v++) { /* half v % 2 of vector v / 2 */
				const int o = 64 * (v / 2) + 32 * (v % 2), u = v / 2;
				const __m256i x = _mm256_loadu_si256((const __m256i *)(q + o));
				const __m256i h = five ? _mm256_loadu_si256((const __m256i *)(
								 q + 256 + 32 * (v % 2))) :
							 _mm256_setzero_si256();

				_mm256_storeu_si256((__m256i *)(panel + 128 * u + 32 * (v % 2)),
						    _mm256_or_si256(_mm256_and_si256(x, m4), fifth8(h, 2 * u)));
				_mm256_storeu_si256((__m256i *)(panel + 128 * u + 64 + 32 * (v % 2)),
						    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4),
								    fifth8(h, 2 * u + 1)));
			}
			scales8(p + KP_SC + 16 * s, false, d0, d1, (float *)(panel + 512));
			scales8(p + KP_MN + 16 * s, false, n0, n1, (float *)(panel + 512 + 64));
		}
	}
}

TGT_PANEL8 static void panel_q6k_256(const uint8_t *g, int64_t nb, uint8_t *panel)
{
	const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
	const __m256i add = _mm256_set1_epi8(96);

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + b * KP_Q6K;
		const __m256 d0 = f16x8(p + KP_D), d1 = f16x8(p + KP_D + 16);

		kpack_prefetch(p, KP_Q6K);
		for (int i = 0; i < 16; i++, panel += 4 * 64 + 2 * KPACK_ROWS * 4) {
			const uint8_t *q = p + KP_Q + KP6_SUB * i;
			float *mw = (float *)(panel + 256 + 64);

			for (int c = 0; c < 8; c++) { /* half c % 2 of group c / 2 */
				const int e = c / 2, o = 32 * (c % 2);
				const __m256i x = _mm256_loadu_si256((const __m256i *)(q + 64 * (e / 2) + o));
				const __m256i top = _mm256_loadu_si256((const __m256i *)(q + 128 + o));
				const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(x, 4 * (e % 2)), m4);
				const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(top, 2 * e), m2);

				_mm256_storeu_si256((__m256i *)(panel + 64 * e + o),
						    _mm256_add_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), add));
			}
			scales8(p + KP_SC + 16 * i, true, d0, d1, (float *)(panel + 256));
			for (int r = 0; r < KPACK_ROWS; r++)
				mw[r] = -0.0f * 0.0f;
		}
	}
}

/* panel_kq() on 256-bit vectors. */
TGT_PANEL8 static void panel_kq_256(uint32_t t, const uint8_t *g, int64_t nb, uint8_t *panel)
{
	const bool q3 = t == LOOM_TYPE_Q3_K;
	const size_t bytes = q3 ? KP_Q3K : KP_Q2K;
	const __m256i m2 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
	const __m256i add = _mm256_set1_epi8(124);

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = g + b * bytes;
		const __m256 d0 = f16x8(p + KP_D), d1 = f16x8(p + KP_D + 16);
		const __m256 n0 = q3 ? d0 : nf16x8(p + KP_DMIN), n1 = q3 ? d1 : nf16x8(p + KP_DMIN + 16);

		kpack_prefetch(p, bytes);
		for (int i = 0; i < 16; i++, panel += 4 * 64 + 2 * KPACK_ROWS * 4) {
			float *dw = (float *)(panel + 256), *mw = dw + KPACK_ROWS;

			for (int o = 0; o < 64; o += 32) {
				const __m256i q = _mm256_loadu_si256((const __m256i *)(p + KP_Q + 64 * i + o));
				const __m256i h = q3 ? _mm256_loadu_si256((const __m256i *)(p + KP3_H + 64 * (i / 2) + o)) :
						       _mm256_setzero_si256();

				for (int c = 0; c < 4; c++) {
					__m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * c), m2);

					if (q3) {
						const int hs = c + 4 * (i % 2);
						const __m256i hb = hs >= 2 ? _mm256_srli_epi16(h, hs - 2) :
									      _mm256_slli_epi16(h, 2 - hs);

						v = _mm256_add_epi8(_mm256_or_si256(v, _mm256_and_si256(hb, b2)), add);
					}
					_mm256_storeu_si256((__m256i *)(panel + 64 * c + o), v);
				}
			}
			if (q3) {
				scales8(p + KP_SC + 16 * i, true, d0, d1, dw);
				for (int r = 0; r < KPACK_ROWS; r++)
					mw[r] = -0.0f * 0.0f;
				continue;
			}
			{ /* the scale byte: scale in the low nibble, minimum in the high */
				const __m128i sb = _mm_loadu_si128((const __m128i *)(p + KP_SC + 16 * i));
				const __m128i m4 = _mm_set1_epi8(15);

				scales8v(_mm_and_si128(sb, m4), false, d0, d1, dw);
				scales8v(_mm_and_si128(_mm_srli_epi16(sb, 4), m4), false, n0, n1, mw);
			}
		}
	}
}

/* Whether the 256-bit builders run here (checked once). */
static bool panel_256(void)
{
	static int have = -1;

	if (have < 0)
		have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
	return have;
}

/* Whether the 512-bit builders run here (checked once). */
static bool panel_512(void)
{
	static int have = -1;

	if (have < 0)
		have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
	return have;
}
#endif

void kpack_panel(uint32_t type, const uint8_t *w, int64_t nb, int64_t j0, uint8_t *panel)
{
	kpack_panel_width(type, w, nb, j0, panel, 512);
}

/* One width's panel builders: the 32-value formats, Q4_K / Q5_K, Q6_K. */
struct panel_set {
	void (*b32)(uint32_t t, const uint8_t *g, int64_t nb, uint8_t *panel);
	void (*q45k)(bool five, const uint8_t *g, int64_t nb, uint8_t *panel);
	void (*q6k)(const uint8_t *g, int64_t nb, uint8_t *panel);
	void (*kq)(uint32_t t, const uint8_t *g, int64_t nb, uint8_t *panel); /* Q2_K, Q3_K */
};

void kpack_panel_width(uint32_t type, const uint8_t *w, int64_t nb, int64_t j0, uint8_t *panel,
		       int width)
{
	static const struct panel_set in_c = { panel_b32, panel_q4k, panel_q6k, panel_kq };
	const struct panel_set *ps = &in_c;
	const uint8_t *g = kpack_group_at(type, w, nb, j0);

#if defined(__x86_64__)
	/* Q2_K and Q3_K take the 256-bit builder on AVX-512 hosts too */
	static const struct panel_set v512 = { panel_b32_512, panel_q4k_512, panel_q6k_512,
						 panel_kq_256 };
	static const struct panel_set v256 = { panel_b32_256, panel_q4k_256, panel_q6k_256,
						 panel_kq_256 };

	if (width >= 512 && panel_512())
		ps = &v512;
	else if (width >= 256 && panel_256())
		ps = &v256;
#else
	(void)width;
#endif
	if (b32(type))
		ps->b32(type, g, nb, panel);
	else if (type == LOOM_TYPE_Q2_K || type == LOOM_TYPE_Q3_K)
		ps->kq(type, g, nb, panel);
	else if (type == LOOM_TYPE_Q6_K)
		ps->q6k(g, nb, panel);
	else
		ps->q45k(type == LOOM_TYPE_Q5_K, g, nb, panel);
}

#if defined(__x86_64__)

#define TGT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* qdot_k_tree8() of 8 vectors, lane by lane. */
TGT_VNNI static inline __attribute__((always_inline)) __m512 tree8(const __m512 v[8])
{
	return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[1]), _mm512_add_ps(v[2], v[3])),
			     _mm512_add_ps(_mm512_add_ps(v[4], v[5]), _mm512_add_ps(v[6], v[7])));
}

/* The float of group g's exact integer sums (16 rows), times x.d[g]. */
TGT_VNNI static inline __attribute__((always_inline)) __m512
grp_term(__m512i sum, const struct qdot_kblock *x, int g)
{
	return _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(x->d[g]));
}

/* acc + qdot_k_ref()'s two fused multiply-adds of super-block p, from its
 * groups' terms P and (formats with minima: Q not NULL) Q. fnmadd(M, dmin,
 * acc) rounds -(M * dmin) + acc once, as fmaf(-M, dmin, acc) does. */
TGT_VNNI static inline __attribute__((always_inline)) __m512
kp_finish(const uint8_t *p, const __m512 P[8], const __m512 *Q, __m512 acc)
{
	acc = _mm512_fmadd_ps(tree8(P), _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(p + KP_D))),
			      acc);
	if (!Q)
		return acc;
	return _mm512_fnmadd_ps(tree8(Q),
				_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(p + KP_DMIN))), acc);
}

/*
 * One packed Q4_K (or, five, Q5_K) super-block of 16 rows against
 * activation block x: acc + qdot_k_ref()'s float steps, lane r for row r;
 * Q5_K's fifth bits are or-ed into bit 4 first. Per sub-block s (values
 * 32s .. 32s+31, activation group s) the lanes sum u * x.q exactly (two
 * chains of four vpdpbusd); isum_s = sc * dot and msum_s = mn * the
 * group's activation sum. The integers are the reference's, so the float
 * steps round alike.
 */
TGT_VNNI static inline __attribute__((always_inline)) __m512
q45k_block(bool five, const uint8_t *p, const struct qdot_kblock *x, __m512 acc)
{
	__m512 P[8], Q[8];
	int32_t bs[8];

	/* the sub-blocks' activation sums: bsums of 16 values, in pairs */
	_mm256_storeu_si256((__m256i *)bs, _mm256_cvtepi16_epi32(_mm_hadd_epi16(
		_mm_loadu_si128((const __m128i *)x->bsums),
		_mm_loadu_si128((const __m128i *)(x->bsums + 8)))));
	for (int s = 0; s < 8; s++) {
		const uint8_t *q = p + KP_Q + kp_sub(five) * s;
		const uint8_t *xq = (const uint8_t *)x->q + 32 * s;
		__m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512(), h;

		h = five ? _mm512_load_si512((const void *)(q + 256)) : _mm512_setzero_si512();
		for (int v = 0; v < 4; v++) {
			__m512i lo, hi;

			q45k_unpack(five, q, h, v, &lo, &hi);
			a0 = _mm512_dpbusd_epi32(a0, lo, _mm512_set1_epi32((int)cpu_rd32(xq + 8 * v)));
			a1 = _mm512_dpbusd_epi32(a1, hi, _mm512_set1_epi32((int)cpu_rd32(xq + 8 * v + 4)));
		}
		P[s] = grp_term(_mm512_mullo_epi32(_mm512_add_epi32(a0, a1),
			_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(p + KP_SC + 16 * s)))), x, s);
		Q[s] = grp_term(_mm512_mullo_epi32(_mm512_set1_epi32(bs[s]),
			_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(p + KP_MN + 16 * s)))), x, s);
	}
	return kp_finish(p, P, Q, acc);
}

/* A packed Q6_K sub-block's four groups of 4 values (16 rows each) as
 * unsigned 6-bit values: nibble | 2 high bits << 4. */
TGT_VNNI static inline __attribute__((always_inline)) void
q6k_unpack(const uint8_t *q, __m512i *u0, __m512i *u1, __m512i *u2, __m512i *u3)
{
	const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(0x30);
	__m512i w0 = _mm512_load_si512((const void *)q);
	__m512i w1 = _mm512_load_si512((const void *)(q + 64));
	__m512i h = _mm512_load_si512((const void *)(q + 128));

	*u0 = _mm512_or_si512(_mm512_and_si512(w0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m2));
	*u1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w0, 4), m4),
			      _mm512_and_si512(_mm512_slli_epi16(h, 2), m2));
	*u2 = _mm512_or_si512(_mm512_and_si512(w1, m4), _mm512_and_si512(h, m2));
	*u3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w1, 4), m4),
			      _mm512_and_si512(_mm512_srli_epi16(h, 2), m2));
}

/*
 * The same for Q6_K: per sub-block of 16 values, u = nibble | 2 high bits
 * << 4 for the four groups of 4 values, one vpdpbusd each; then
 * sc * (dot - 32 * bsum), summed over the group's two sub-blocks: the
 * reference's integers exactly.
 */
TGT_VNNI static inline __attribute__((always_inline)) __m512
q6k_block(bool unused, const uint8_t *p, const struct qdot_kblock *x, __m512 acc)
{
	__m512i isum = _mm512_setzero_si512();
	__m512 P[8];

	(void)unused; /* KP_ROWS passes the other K-quants' variant */

	for (int i = 0; i < 16; i++) {
		const uint8_t *q = p + KP_Q + KP6_SUB * i;
		const uint8_t *xq = (const uint8_t *)x->q + 16 * i;
		__m512i u0, u1, u2, u3;

		q6k_unpack(q, &u0, &u1, &u2, &u3);
		__m512i a0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-32 * x->bsums[i]), u0,
						 _mm512_set1_epi32((int)cpu_rd32(xq)));
		__m512i a1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u2,
						 _mm512_set1_epi32((int)cpu_rd32(xq + 8)));

		a0 = _mm512_dpbusd_epi32(a0, u1, _mm512_set1_epi32((int)cpu_rd32(xq + 4)));
		a1 = _mm512_dpbusd_epi32(a1, u3, _mm512_set1_epi32((int)cpu_rd32(xq + 12)));
		isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_add_epi32(a0, a1),
			_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(p + KP_SC + 16 * i)))));
		if (i % 2) {
			P[i / 2] = grp_term(isum, x, i / 2);
			isum = _mm512_setzero_si512();
		}
	}
	return kp_finish(p, P, NULL, acc);
}

/*
 * The same for Q2_K (q3: Q3_K): per sub-block of 16 values, the four
 * 2-bit fields of a byte (Q3_K: each with its third bit) against four
 * groups of 4 activation bytes, four vpdpbusd into one sum that starts
 * at -4 * bsum for Q3_K; isum += sc * sum, and Q2_K's msum += mn * bsum,
 * over the group's two sub-blocks. Shifts of 16-bit lanes pull the next
 * byte's bits in only above the bits the masks keep.
 */
TGT_VNNI static inline __attribute__((always_inline)) __m512
kq_block(bool q3, const uint8_t *p, const struct qdot_kblock *x, __m512 acc)
{
	const __m512i m2 = _mm512_set1_epi8(3), b2 = _mm512_set1_epi8(4);
	const __m128i n4 = _mm_set1_epi8(15);
	__m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
	__m512 P[8], Q[8];

	for (int i = 0; i < 16; i++) {
		const __m512i w = _mm512_load_si512((const void *)(p + KP_Q + 64 * i));
		const __m512i h = q3 ? _mm512_load_si512((const void *)(p + KP3_H + 64 * (i / 2))) :
				       _mm512_setzero_si512();
		const __m128i sb = _mm_load_si128((const __m128i *)(p + KP_SC + 16 * i));
		__m512i a = _mm512_set1_epi32(q3 ? -4 * x->bsums[i] : 0);

		for (int c = 0; c < 4; c++) {
			const int sh = c + 4 * (i % 2);
			__m512i u = _mm512_and_si512(c ? _mm512_srli_epi16(w, 2 * c) : w, m2);

			if (q3)
				u = _mm512_or_si512(u, _mm512_and_si512(sh >= 2 ?
					_mm512_srli_epi16(h, sh - 2) : _mm512_slli_epi16(h, 2 - sh), b2));
			a = _mm512_dpbusd_epi32(a, u, _mm512_set1_epi32(
				(int)cpu_rd32((const uint8_t *)x->q + 16 * i + 4 * c)));
		}
		if (q3) {
			isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(a, _mm512_cvtepi8_epi32(sb)));
		} else {
			isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(a,
				_mm512_cvtepu8_epi32(_mm_and_si128(sb, n4))));
			msum = _mm512_add_epi32(msum, _mm512_mullo_epi32(_mm512_set1_epi32(x->bsums[i]),
				_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(sb, 4), n4))));
		}
		if (i % 2) {
			P[i / 2] = grp_term(isum, x, i / 2);
			Q[i / 2] = grp_term(msum, x, i / 2);
			isum = msum = _mm512_setzero_si512();
		}
	}
	return kp_finish(p, P, q3 ? NULL : Q, acc);
}

/* Rows [j0, j1) of packed weight w, group by group; block(v, p, x, acc)
 * is one super-block of a group (v: the format's variant), bytes apart. */
#define KP_ROWS(name, block, v, bytes)                                                     \
	TGT_VNNI static void name(const uint8_t *w, const void *xv, int64_t nb, float *y,    \
				  int64_t j0, int64_t j1)                                    \
	{                                                                                  \
		const struct qdot_kblock *x = xv;                                           \
		const size_t gb = (size_t)nb * (bytes);                                     \
                                                                                           \
		for (int64_t g = j0 / KPACK_ROWS; g * KPACK_ROWS < j1; g++) {               \
			const uint8_t *p = w + (size_t)g * gb;                              \
			const int64_t r0 = g * KPACK_ROWS;                                  \
			int64_t lo = j0 > r0 ? j0 - r0 : 0;                                 \
			int64_t hi = j1 - r0 < KPACK_ROWS ? j1 - r0 : KPACK_ROWS;           \
			__m512 acc = _mm512_setzero_ps();                                   \
			float lanes[KPACK_ROWS];                                            \
                                                                                           \
			for (int64_t b = 0; b < nb; b++) {                                  \
				kpack_prefetch(p + b * (bytes), bytes);                         \
				acc = block(v, p + b * (bytes), x + b, acc);                \
			}                                                                   \
			/* lanes lo .. hi-1 are rows r0 + lo .. r0 + hi - 1 */              \
			_mm512_storeu_ps(lanes, acc);                                       \
			memcpy(y + r0 + lo - j0, lanes + lo, (size_t)(hi - lo) * sizeof(float)); \
		}                                                                          \
	}

/*
 * The 32-value formats: qdot.c's refseq() (qgemm_ref()'s arithmetic) with
 * the 16 rows of a group in the vector lanes. Lane l of block b (values
 * 4l .. 4l+3) is one vector of 16 rows' weights; a vpdpbusd of it against
 * the 4 activation bytes adds their products to the block's exact int32
 * sum, which one fma then adds to the row's float (and one more the
 * minimum term, Q4_1 / Q5_1). Integer sums are exact, so the 8 lanes go
 * in two chains. The signed formats' weights enter with their offset o
 * (128, 8, 16): the sum starts from -o * (sum of the block's activation
 * bytes), the same for all 16 rows, made once per call (seq_fixes()).
 * Up to 8 activation rows share each block's weights from registers; a
 * row's bits do not depend on how many rows a call has.
 */

/*
 * Activation rows a pass takes, and the fixes it keeps (16 KiB of stack):
 * SEQ_FIXES / rows blocks a pass, so that one decode row (and up to 4
 * rows up to k = 32768) reads every group in one pass. With more blocks
 * than a pass holds, a pass reads a slice of each group and jumps to the
 * next: on an 8B-shaped Q4_0 file's ffn_down (k = 14336) at 256 blocks a
 * pass, decode read 28 GB/s against Q4_K_M's 34 (1 thread).
 */
#define SEQ_ROWS 16
#define SEQ_FIXES 4096
/* Activation rows that share a block's weights from registers: 8 rather
 * than 4 gave a 1B-shaped Q4_0 model's pp512 +7 % (1 thread). */
#define SEQ_X 8

TGT_VNNI static inline __attribute__((always_inline)) int32_t hsum_i256(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));

	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

/* fix[i * n + b - s0] = -o * sum(x[i * xr + b].q) for m rows, blocks
 * [s0, s0 + n). */
TGT_VNNI static inline __attribute__((always_inline)) void
seq_fixes(uint32_t t, const struct qdot_block *x, int64_t xr, int m, int64_t s0, int64_t n,
	  int32_t *fix)
{
	const __m256i o = _mm256_set1_epi8((char)b32_offset(t));

	for (int i = 0; i < m; i++)
		for (int64_t b = 0; b < n; b++)
			fix[i * n + b] = b32_offset(t) ?
				-hsum_i256(_mm256_dpbusd_epi32(
					_mm256_setzero_si256(), o,
					_mm256_loadu_si256((const __m256i *)x[i * xr + s0 + b].q))) : 0;
}

/* Block `at` of a group: its 8 lane vectors (unsigned weights), the 16
 * rows' scales and (Q4_1, Q5_1) minima. */
TGT_VNNI static inline __attribute__((always_inline)) void
seq_weights(uint32_t t, const uint8_t *g, struct b32_at at, __m512i u[8], __m512 *dw, __m512 *mw)
{
	const __m512i m4 = _mm512_set1_epi8(15);
	__m512i h = _mm512_setzero_si512();

	*dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(g + at.d)));
	*mw = b32_min(t) ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(g + at.m))) :
			   _mm512_setzero_ps();
	if (t == LOOM_TYPE_Q8_0) {
		for (int l = 0; l < 8; l++)
			u[l] = _mm512_load_si512((const void *)(g + at.q + 64 * l));
		return;
	}
	if (b32_q5(t))
		h = _mm512_load_si512((const void *)(g + at.h));
	for (int v = 0; v < 4; v++) {
		__m512i w = _mm512_load_si512((const void *)(g + at.q + 64 * v));

		u[2 * v] = _mm512_and_si512(w, m4);
		u[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
		if (b32_q5(t)) {
			u[2 * v] = _mm512_or_si512(u[2 * v], kp_fifth(h, 2 * v));
			u[2 * v + 1] = _mm512_or_si512(u[2 * v + 1], kp_fifth(h, 2 * v + 1));
		}
	}
}

/* Blocks [s0, s0 + n) of the group at g (nb blocks) for X activation rows
 * x, x + xr, ... into acc[0 .. X). */
TGT_VNNI static inline __attribute__((always_inline)) void
seq_group(uint32_t t, const uint8_t *g, int64_t nb, const struct qdot_block *x, int64_t xr,
	  int X, int64_t s0, int64_t n, const int32_t *fix, __m512 *acc)
{
	for (int64_t b = s0; b < s0 + n; b++) {
		const struct b32_at at = b32_at(t, b, nb);
		__m512i u[8];
		__m512 dw, mw;

		if (b % 2 == 0)
			kpack_prefetch(g + at.d, b32_pair(t));
		seq_weights(t, g, at, u, &dw, &mw);
		for (int i = 0; i < X; i++) {
			const struct qdot_block *xb = x + i * xr + b;
			__m512i s0v = _mm512_set1_epi32(fix[i * n + b - s0]), s1v = _mm512_setzero_si512();

			for (int l = 0; l < 4; l++) {
				s0v = _mm512_dpbusd_epi32(s0v, u[l], _mm512_set1_epi32((int)cpu_rd32((const uint8_t *)xb->q + 4 * l)));
				s1v = _mm512_dpbusd_epi32(s1v, u[l + 4],
							  _mm512_set1_epi32((int)cpu_rd32((const uint8_t *)xb->q + 16 + 4 * l)));
			}
			acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0v, s1v)),
						 _mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), acc[i]);
			if (b32_min(t))
				acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb->s), acc[i]);
		}
	}
}

/* seq_group() with X a constant, so its row loop unrolls. */
TGT_VNNI static inline __attribute__((always_inline)) void
seq_group_x(uint32_t t, const uint8_t *g, int64_t nb, const struct qdot_block *x, int64_t xr,
	    int X, int64_t s0, int64_t n, const int32_t *fix, __m512 *acc)
{
	switch (X) {
	case 1: seq_group(t, g, nb, x, xr, 1, s0, n, fix, acc); break;
	case 2: seq_group(t, g, nb, x, xr, 2, s0, n, fix, acc); break;
	case 3: seq_group(t, g, nb, x, xr, 3, s0, n, fix, acc); break;
	case 4: seq_group(t, g, nb, x, xr, 4, s0, n, fix, acc); break;
	case 5: seq_group(t, g, nb, x, xr, 5, s0, n, fix, acc); break;
	case 6: seq_group(t, g, nb, x, xr, 6, s0, n, fix, acc); break;
	case 7: seq_group(t, g, nb, x, xr, 7, s0, n, fix, acc); break;
	default: seq_group(t, g, nb, x, xr, 8, s0, n, fix, acc); break;
	}
}

/*
 * Rows [j0, j1) of the packed weight w against m activation rows x (x_i =
 * x + i * nb) into y + i * ys. Weights of more blocks than a pass holds
 * (SEQ_FIXES / rows) take passes; between them a row's float waits in y
 * (exactly).
 */
TGT_VNNI static inline __attribute__((always_inline)) void
seq_rows(uint32_t t, const uint8_t *w, const struct qdot_block *x, int m, int64_t nb, float *y,
	 int64_t ys, int64_t j0, int64_t j1)
{
	const size_t gb = row_share(t, nb) * KPACK_ROWS;
	int32_t fix[SEQ_FIXES];

	for (int i0 = 0; i0 < m; i0 += SEQ_ROWS) {
		const int mi = m - i0 < SEQ_ROWS ? m - i0 : SEQ_ROWS;
		const int64_t per = SEQ_FIXES / mi;

		for (int64_t s0 = 0; s0 < nb; s0 += per) {
			const int64_t n = nb - s0 < per ? nb - s0 : per;

			seq_fixes(t, x + i0 * nb, nb, mi, s0, n, fix);
			for (int64_t gi = j0 / KPACK_ROWS; gi * KPACK_ROWS < j1; gi++) {
				const int64_t r0 = gi * KPACK_ROWS;
				const int64_t lo = j0 > r0 ? j0 - r0 : 0;
				const int64_t hi = j1 - r0 < KPACK_ROWS ? j1 - r0 : KPACK_ROWS;

				for (int i = 0; i < mi; i += SEQ_X) {
					const int X = mi - i < SEQ_X ? mi - i : SEQ_X;
					float *yi = y + (i0 + i) * ys + r0 + lo - j0;
					float lanes[KPACK_ROWS] = { 0 };
					__m512 acc[SEQ_X];

					for (int k = 0; k < X; k++) {
						if (s0 > 0)
							memcpy(lanes + lo, yi + k * ys,
							       (size_t)(hi - lo) * sizeof(float));
						acc[k] = _mm512_loadu_ps(lanes);
					}
					seq_group_x(t, w + (size_t)gi * gb, nb, x + (i0 + i) * nb, nb,
						    X, s0, n, fix + i * n, acc);
					/* lanes lo .. hi-1 are rows r0 + lo .. r0 + hi - 1 */
					for (int k = 0; k < X; k++) {
						_mm512_storeu_ps(lanes, acc[k]);
						memcpy(yi + k * ys, lanes + lo,
						       (size_t)(hi - lo) * sizeof(float));
					}
				}
			}
		}
	}
}

#define SEQ_KERNEL(name, T)                                                                \
	TGT_VNNI static void name(const uint8_t *w, const void *x, int64_t nb, float *y,     \
				  int64_t j0, int64_t j1)                                    \
	{                                                                                  \
		seq_rows(T, w, x, 1, nb, y, 0, j0, j1);                                    \
	}                                                                                  \
	TGT_VNNI static void name##_m(const uint8_t *w, const void *x, int m, int64_t nb,     \
				      float *y, int64_t ys, int64_t j0, int64_t j1)           \
	{                                                                                  \
		seq_rows(T, w, x, m, nb, y, ys, j0, j1);                                   \
	}
SEQ_KERNEL(q8_0_vnni, LOOM_TYPE_Q8_0)
SEQ_KERNEL(q4_0_vnni, LOOM_TYPE_Q4_0)
SEQ_KERNEL(q4_1_vnni, LOOM_TYPE_Q4_1)
SEQ_KERNEL(q5_0_vnni, LOOM_TYPE_Q5_0)
SEQ_KERNEL(q5_1_vnni, LOOM_TYPE_Q5_1)

/*
 * Q4_K, Q5_K and Q6_K for up to SEQ_X activation rows at once: each
 * sub-block's weights are unpacked once and serve every row; a row's
 * group terms wait in memory until its super-block finishes. Each row
 * takes q45k_block()'s / q6k_block()'s integer and float steps exactly,
 * so its bits are the one-row kernel's.
 */
TGT_VNNI static inline __attribute__((always_inline)) void
q45k_block_m(bool five, const uint8_t *p, const struct qdot_kblock *x, int64_t xr, int X,
	     __m512 *acc)
{
	__m512 P[SEQ_X][8], Q[SEQ_X][8];
	int32_t bs[SEQ_X][8];

	for (int i = 0; i < X; i++)
		_mm256_storeu_si256((__m256i *)bs[i], _mm256_cvtepi16_epi32(_mm_hadd_epi16(
			_mm_loadu_si128((const __m128i *)x[i * xr].bsums),
			_mm_loadu_si128((const __m128i *)(x[i * xr].bsums + 8)))));
	for (int s = 0; s < 8; s++) {
		const uint8_t *q = p + KP_Q + kp_sub(five) * s;
		const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(p + KP_SC + 16 * s)));
		const __m512i mn = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(p + KP_MN + 16 * s)));
		__m512i lo[4], hi[4], h;

		h = five ? _mm512_load_si512((const void *)(q + 256)) : _mm512_setzero_si512();
		for (int v = 0; v < 4; v++)
			q45k_unpack(five, q, h, v, &lo[v], &hi[v]);
		for (int i = 0; i < X; i++) {
			const uint8_t *xq = (const uint8_t *)x[i * xr].q + 32 * s;
			__m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();

			for (int v = 0; v < 4; v++) {
				a0 = _mm512_dpbusd_epi32(a0, lo[v], _mm512_set1_epi32((int)cpu_rd32(xq + 8 * v)));
				a1 = _mm512_dpbusd_epi32(a1, hi[v], _mm512_set1_epi32((int)cpu_rd32(xq + 8 * v + 4)));
			}
			P[i][s] = grp_term(_mm512_mullo_epi32(_mm512_add_epi32(a0, a1), sc), x + i * xr, s);
			Q[i][s] = grp_term(_mm512_mullo_epi32(_mm512_set1_epi32(bs[i][s]), mn), x + i * xr, s);
		}
	}
	for (int i = 0; i < X; i++)
		acc[i] = kp_finish(p, P[i], Q[i], acc[i]);
}

TGT_VNNI static inline __attribute__((always_inline)) void
q6k_block_m(bool unused, const uint8_t *p, const struct qdot_kblock *x, int64_t xr, int X,
	    __m512 *acc)
{
	__m512i isum[SEQ_X];
	__m512 P[SEQ_X][8];

	(void)unused;
	for (int i = 0; i < X; i++)
		isum[i] = _mm512_setzero_si512();
	for (int k = 0; k < 16; k++) {
		const uint8_t *q = p + KP_Q + KP6_SUB * k;
		const __m512i sc = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(p + KP_SC + 16 * k)));
		__m512i u0, u1, u2, u3;

		q6k_unpack(q, &u0, &u1, &u2, &u3);

		for (int i = 0; i < X; i++) {
			const struct qdot_kblock *xi = x + i * xr;
			const uint8_t *xq = (const uint8_t *)xi->q + 16 * k;
			__m512i a0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-32 * xi->bsums[k]), u0,
							 _mm512_set1_epi32((int)cpu_rd32(xq)));
			__m512i a1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u2,
							 _mm512_set1_epi32((int)cpu_rd32(xq + 8)));

			a0 = _mm512_dpbusd_epi32(a0, u1, _mm512_set1_epi32((int)cpu_rd32(xq + 4)));
			a1 = _mm512_dpbusd_epi32(a1, u3, _mm512_set1_epi32((int)cpu_rd32(xq + 12)));
			isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(_mm512_add_epi32(a0, a1), sc));
			if (k % 2) {
				P[i][k / 2] = grp_term(isum[i], xi, k / 2);
				isum[i] = _mm512_setzero_si512();
			}
		}
	}
	for (int i = 0; i < X; i++)
		acc[i] = kp_finish(p, P[i], NULL, acc[i]);
}

/* A group's nb super-blocks for X rows: block_m's X made a constant. */
#define KP_GROUP_X(block, v, bytes, p, x, nb, X, acc)                                      \
	do {                                                                               \
		for (int64_t b_ = 0; b_ < (nb); b_++) {                                    \
			kpack_prefetch((p) + b_ * (bytes), (bytes));                       \
			block((v), (p) + b_ * (bytes), (x) + b_, (nb), (X), (acc));        \
		}                                                                          \
	} while (0)

/* kpack_mfn of a K-quant: rows [j0, j1) of w against m rows x + i * nb. */
#define KP_ROWS_M(name, block, v, bytes)                                                   \
	TGT_VNNI static void name(const uint8_t *w, const void *xv, int m, int64_t nb,        \
				  float *y, int64_t ys, int64_t j0, int64_t j1)              \
	{                                                                                  \
		const struct qdot_kblock *x = xv;                                           \
		const size_t gb = (size_t)nb * (bytes);                                     \
                                                                                           \
		for (int64_t g = j0 / KPACK_ROWS; g * KPACK_ROWS < j1; g++) {               \
			const uint8_t *p = w + (size_t)g * gb;                              \
			const int64_t r0 = g * KPACK_ROWS;                                  \
			int64_t lo = j0 > r0 ? j0 - r0 : 0;                                 \
			int64_t hi = j1 - r0 < KPACK_ROWS ? j1 - r0 : KPACK_ROWS;           \
                                                                                           \
			for (int i = 0; i < m; i += SEQ_X) {                                 \
				const struct qdot_kblock *xi = x + i * nb;                  \
				__m512 acc[SEQ_X];                                          \
				float lanes[KPACK_ROWS];                                    \
				int X = m - i < SEQ_X ? m - i : SEQ_X;                       \
                                                                                           \
				for (int k = 0; k < SEQ_X; k++)                              \
					acc[k] = _mm512_setzero_ps();                       \
				switch (X) {                                                 \
				case 1: KP_GROUP_X(block, v, bytes, p, xi, nb, 1, acc); break; \
				case 2: KP_GROUP_X(block, v, bytes, p, xi, nb, 2, acc); break; \
				case 3: KP_GROUP_X(block, v, bytes, p, xi, nb, 3, acc); break; \
				case 4: KP_GROUP_X(block, v, bytes, p, xi, nb, 4, acc); break; \
				default: KP_GROUP_X(block, v, bytes, p, xi, nb, X, acc); break; \
				}                                                            \
				for (int k = 0; k < X; k++) { /* lanes lo .. hi-1 */          \
					_mm512_storeu_ps(lanes, acc[k]);                     \
					memcpy(y + (i + k) * ys + r0 + lo - j0, lanes + lo,  \
					       (size_t)(hi - lo) * sizeof(float));           \
				}                                                            \
			}                                                                  \
		}                                                                          \
	}

KP_ROWS_M(q4k_vnni_m, q45k_block_m, false, KP_Q4K)
KP_ROWS_M(q5k_vnni_m, q45k_block_m, true, KP_Q5K)
KP_ROWS_M(q6k_vnni_m, q6k_block_m, false, KP_Q6K)

KP_ROWS(q2k_vnni, kq_block, false, KP_Q2K)
KP_ROWS(q3k_vnni, kq_block, true, KP_Q3K)
KP_ROWS(q4k_vnni, q45k_block, false, KP_Q4K)
KP_ROWS(q5k_vnni, q45k_block, true, KP_Q5K)
KP_ROWS(q6k_vnni, q6k_block, false, KP_Q6K)


#endif /* __x86_64__ */

kpack_fn kpack_kernel(enum qdot_isa isa, uint32_t type)
{
#if defined(__x86_64__)
	if (!qdot_isa_supported(isa))
		return NULL;
	if (isa == QDOT_AVX2 || isa == QDOT_AVXVNNI)
		return kpack_kernel_256(isa, type);
	if (isa != QDOT_VNNI)
		return NULL;
	switch (type) {
	case LOOM_TYPE_Q8_0: return q8_0_vnni;
	case LOOM_TYPE_Q4_0: return q4_0_vnni;
	case LOOM_TYPE_Q4_1: return q4_1_vnni;
	case LOOM_TYPE_Q5_0: return q5_0_vnni;
	case LOOM_TYPE_Q5_1: return q5_1_vnni;
	case LOOM_TYPE_Q2_K: return q2k_vnni;
	case LOOM_TYPE_Q3_K: return q3k_vnni;
	case LOOM_TYPE_Q4_K: return q4k_vnni;
	case LOOM_TYPE_Q5_K: return q5k_vnni;
	case LOOM_TYPE_Q6_K: return q6k_vnni;
	default: return NULL;
	}
#else
	(void)isa;
	(void)type;
	return NULL;
#endif
}

kpack_mfn kpack_kernel_m(enum qdot_isa isa, uint32_t type)
{
#if defined(__x86_64__)
	if (!qdot_isa_supported(isa))
		return NULL;
	if (isa == QDOT_AVX2)
		return kpack_kernel_m_256(isa, type);
	if (isa != QDOT_VNNI)
		return NULL;
	switch (type) {
	case LOOM_TYPE_Q4_K: return q4k_vnni_m;
	case LOOM_TYPE_Q5_K: return q5k_vnni_m;
	case LOOM_TYPE_Q6_K: return q6k_vnni_m;
	case LOOM_TYPE_Q8_0: return q8_0_vnni_m;
	case LOOM_TYPE_Q4_0: return q4_0_vnni_m;
	case LOOM_TYPE_Q4_1: return q4_1_vnni_m;
	case LOOM_TYPE_Q5_0: return q5_0_vnni_m;
	case LOOM_TYPE_Q5_1: return q5_1_vnni_m;
	default: return NULL;
	}
#else
	(void)isa;
	(void)type;
	return NULL;
#endif
}
