/*
 * kpack_at.h: where kpack.h's packed layout keeps each field, for the
 * files that pack it (kpack.c) and those whose kernels read it (kpack.c's
 * AVX-512 kernels, kpack_avx2.c's 256-bit ones). Private to cpu.so.
 */
#ifndef LOOM_CPU_KPACK_AT_H
#define LOOM_CPU_KPACK_AT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu.h"
#include "kpack.h"

/* Q4_K's packed super-block of 16 rows (kpack.h) and its fields; Q5_K's
 * is the same with a vector of fifth bits after each sub-block's four
 * nibble vectors (320 bytes a sub-block: 2880, GGUF 16 x 176). */
#define Q4K_BYTES 144
#define KP_Q4K 2368
#define Q5K_BYTES 176
#define KP_Q5K 2880
#define KP_D 0
#define KP_DMIN 32
#define KP_SC 64
#define KP_MN 192
#define KP_Q 320
/* Q6_K's: d at KP_D, 32 bytes of padding, the scales at KP_SC, quants at
 * KP_Q (192 bytes a sub-block of 16 values: two nibble vectors, then the
 * vector of high bits). */
#define Q6K_BYTES 210
#define KP_Q6K 3392
#define KP6_SUB 192
/* Q2_K's and Q3_K's: d at KP_D, Q2_K's dmin at KP_DMIN (Q3_K: padding),
 * a scale byte per sub-block of 16 values and row at KP_SC, one vector of
 * 2-bit values a sub-block at KP_Q; Q3_K's high bits after them at KP3_H
 * (one vector per two sub-blocks). */
#define KP_Q2K 1344
#define KP_Q3K 1856
#define KP3_H 1344

/* The formats with blocks of 32 values (kpack.h: 16 rows' blocks in
 * pairs). */
static inline bool b32(uint32_t t)
{
	return t == LOOM_TYPE_Q8_0 || t == LOOM_TYPE_Q4_0 || t == LOOM_TYPE_Q4_1 ||
	       t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1;
}

/* A 32-value format's fields: minima (Q4_1, Q5_1), fifth bits (Q5_0,
 * Q5_1), quant bytes of a block of 16 rows, and the offset that makes its
 * values unsigned (their sum times the activations is taken back out). */
static inline bool b32_min(uint32_t t)
{
	return t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_1;
}

static inline bool b32_q5(uint32_t t)
{
	return t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1;
}

static inline size_t b32_qbytes(uint32_t t)
{
	return t == LOOM_TYPE_Q8_0 ? 512 : 256;
}

static inline int b32_offset(uint32_t t)
{
	return t == LOOM_TYPE_Q8_0 ? 128 : t == LOOM_TYPE_Q4_0 ? 8 : t == LOOM_TYPE_Q5_0 ? 16 : 0;
}

/* Bytes of a pair of blocks of 16 rows (the GGUF bytes), and of a last
 * unpaired block (padded so that every field starts on a cache line). */
static inline size_t b32_pair(uint32_t t)
{
	return 64 + (b32_min(t) ? 64 : 0) + (b32_q5(t) ? 128 : 0) + 2 * b32_qbytes(t);
}

static inline size_t b32_single(uint32_t t)
{
	return 64 + (b32_min(t) ? 64 : 0) + (b32_q5(t) ? 64 : 0) + b32_qbytes(t);
}

/* Where block b (of nb) of a group keeps its scales d, minima m, fifth
 * bits h and quants q, from the group's start (kpack.h). */
struct b32_at {
	size_t d, m, h, q;
};

static inline struct b32_at b32_at(uint32_t t, int64_t b, int64_t nb)
{
	const size_t base = (size_t)(b / 2) * b32_pair(t), w = (size_t)(b % 2);
	const size_t mn = b32_min(t) ? 64 : 0, h5 = b32_q5(t) ? 64 : 0;

	if (b == nb - 1 && nb % 2) /* alone */
		return (struct b32_at){ base, base + 64, base + 64 + mn, base + 64 + mn + h5 };
	return (struct b32_at){ base + 32 * w, base + 64 + 32 * w, base + 64 + mn + 64 * w,
				base + 64 + mn + 2 * h5 + b32_qbytes(t) * w };
}

/* Packed bytes of a K-quant super-block of 16 rows. */
static inline size_t kp_bytes(uint32_t t)
{
	switch (t) {
	case LOOM_TYPE_Q2_K: return KP_Q2K;
	case LOOM_TYPE_Q3_K: return KP_Q3K;
	case LOOM_TYPE_Q5_K: return KP_Q5K;
	case LOOM_TYPE_Q6_K: return KP_Q6K;
	default: return KP_Q4K;
	}
}

/* A row's share of a group of nb blocks: the group's bytes / 16 (the
 * callers check nb * 212 for overflow). */
static inline size_t row_share(uint32_t t, int64_t nb)
{
	if (b32(t))
		return (size_t)(nb / 2) * (b32_pair(t) / KPACK_ROWS) +
		       (size_t)(nb % 2) * (b32_single(t) / KPACK_ROWS);
	return (size_t)nb * (kp_bytes(t) / KPACK_ROWS);
}

/* Bytes of a packed Q4_K / Q5_K sub-block (32 values of 16 rows). */
static inline int kp_sub(bool five)
{
	return five ? 320 : 256;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* Bit l (0..7) of every byte of h moved to bit 4, the rest 0: a Q5
 * value's fifth bit, for the 512-bit builders and kernels. */
__attribute__((target("avx512f,avx512bw"))) static inline __attribute__((always_inline)) __m512i
kp_fifth(__m512i h, int l)
{
	const __m512i b4 = _mm512_set1_epi8(16);

	if (l < 4)
		return _mm512_and_si512(_mm512_slli_epi16(h, 4 - l), b4);
	return _mm512_and_si512(l > 4 ? _mm512_srli_epi16(h, l - 4) : h, b4);
}

/* Nibble vector v of a packed Q4_K / Q5_K sub-block at q (64-byte
 * aligned): its low and high nibbles, with Q5_K's fifth bits from h (bit
 * 2v to bit 4 of lo, bit 2v + 1 to bit 4 of hi). */
__attribute__((target("avx512f,avx512bw"))) static inline __attribute__((always_inline)) void
q45k_unpack(bool five, const uint8_t *q, __m512i h, int v, __m512i *lo, __m512i *hi)
{
	const __m512i m4 = _mm512_set1_epi8(15);
	const __m512i w = _mm512_load_si512((const void *)(q + 64 * v));

	*lo = _mm512_and_si512(w, m4);
	*hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
	if (five) {
		*lo = _mm512_or_si512(*lo, kp_fifth(h, 2 * v));
		*hi = _mm512_or_si512(*hi, kp_fifth(h, 2 * v + 1));
	}
}

/* Sub-block s of the packed Q4_K / Q5_K super-block p as qgemm.h's panel
 * block holds its values: vector 2v + j is group 2v + j (values 8v + 4j
 * .. 8v + 4j + 3) of the 16 rows. */
__attribute__((target("avx512f,avx512bw"))) static inline __attribute__((always_inline)) void
q45k_sub(bool five, const uint8_t *p, int s, __m512i w[8])
{
	const uint8_t *q = p + KP_Q + kp_sub(five) * s;
	const __m512i h = five ? _mm512_load_si512((const void *)(q + 256)) : _mm512_setzero_si512();

	for (int v = 0; v < 4; v++)
		q45k_unpack(five, q, h, v, &w[2 * v], &w[2 * v + 1]);
}

/* The super-block's 16 rows' d and -dmin (f16 widened, the sign flipped
 * bit-wise, so a NaN stays the NaN it was). */
__attribute__((target("avx512f,avx512bw"))) static inline __attribute__((always_inline)) void
q45k_d(const uint8_t *p, __m512 *d, __m512 *ndmin)
{
	*d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + KP_D)));
	*ndmin = _mm512_castsi512_ps(_mm512_xor_si512(
		_mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + KP_DMIN)))),
		_mm512_set1_epi32((int)0x80000000)));
}

/* Sub-block s's panel floats: the rows' d * sc to *dw, -dmin * mn to *mw. */
__attribute__((target("avx512f,avx512bw"))) static inline __attribute__((always_inline)) void
q45k_scales(const uint8_t *p, int s, __m512 d, __m512 ndmin, __m512 *dw, __m512 *mw)
{
	const __m128i sc = _mm_loadu_si128((const __m128i *)(p + KP_SC + 16 * s));
	const __m128i mn = _mm_loadu_si128((const __m128i *)(p + KP_MN + 16 * s));

	*dw = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)));
	*mw = _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)));
}

/*
 * Prefetches the `bytes` that lie KP_PREFETCH bytes after p: the kernels
 * read a group front to back and the next group lies right after it. On
 * this project's machines one core streaming from memory with only the
 * hardware prefetcher reached 50-75 % of a plain-load read (bench_gemm
 * cold, ffn down 1536x576: Q4_K 8.5-9.1 GB/s, with this 12.5-14).
 */
#define KP_PREFETCH 8704

static inline __attribute__((always_inline)) void kpack_prefetch(const uint8_t *p, size_t bytes)
{
	for (size_t o = 0; o < bytes; o += 64)
		_mm_prefetch((const char *)p + KP_PREFETCH + o, _MM_HINT_T0);
}

/* kpack_kernel() of the 256-bit sets (kpack_avx2.c): isa QDOT_AVX2 or
 * QDOT_AVXVNNI, supported by the caller's check. */
kpack_fn kpack_kernel_256(enum qdot_isa isa, uint32_t type);
/* kpack_kernel_m() of the same: AVX2's 32-value formats, else NULL. */
kpack_mfn kpack_kernel_m_256(enum qdot_isa isa, uint32_t type);
#endif

#endif /* LOOM_CPU_KPACK_AT_H */
