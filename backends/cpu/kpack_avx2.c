/*
 * The packed layout's GEMV kernels on 256-bit vectors (kpack.h): AVX2, and
 * AVX-VNNI where the CPU has it, for the machines without AVX-512.
 *
 * A 64-byte vector of the layout holds 4 bytes of each of a group's 16
 * rows; its first 32 bytes are rows 0-7 and its last 32 rows 8-15, and
 * the f16 scales of 16 rows split the same way. So a 256-bit kernel runs
 * a group as two halves of 8 rows, each the AVX-512 kernel's arithmetic
 * on 8 lanes:
 *   - K-quants: the same integers and the same float steps a super-block
 *     as qdot_k_ref() (qdot.h), which every kernel set gives;
 *   - the 32-value formats, each set's arithmetic (qdot.h), so a packed
 *     weight gives the GGUF-layout kernel's bits: on AVX2 block after
 *     block (refseq(), the prefill GEMM's), one float a row; on AVX-VNNI
 *     8 float lanes a row (ref8()), lane l holding the exact sums of
 *     values 4l .. 4l+3 block after block, one fma each, the offset
 *     formats' m * x.s summed on their own.
 * Byte products reach int32 lanes through vpdpbusd (AVX-VNNI) or maddubs
 * and madd (AVX2); both sums are exact. maddubs adds two u8 x s8 products
 * in int16, which the 2-6 bit values cannot overflow (2 * 63 * 127); Q8_0's
 * stored q + 128 could, so AVX2 takes it back to q and multiplies |q| by x
 * with q's sign (2 * 128 * 127 < 32768), as qdot.c's AVX2 kernel does.
 *
 * Compiled without -march flags; each kernel carries its target.
 */
#include <string.h>

#include "cpu.h"
#include "dot256.h"
#include "kpack.h"
#include "kpack_at.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define ALWAYS static inline __attribute__((always_inline))

/* 4 activation bytes, broadcast to every lane */
TGT_AVX2 ALWAYS __m256i x4(const int8_t *q)
{
	return _mm256_set1_epi32((int)cpu_rd32((const uint8_t *)q));
}

/* 8 f16 at p as floats */
TGT_AVX2 ALWAYS __m256 h8(const uint8_t *p)
{
	return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)p));
}

/* Rows 8h .. 8h+7's part of the 64-byte vector at p. */
TGT_AVX2 ALWAYS __m256i half(const uint8_t *p, int h)
{
	return _mm256_load_si256((const __m256i *)(p + 32 * h));
}

/* Step i of n of a super-block of `bytes` at p: its share of
 * kpack_prefetch()'s lines. The AVX2 one-pass and many-row kernels spread
 * a super-block's prefetches over its sub-blocks: issued as one burst
 * before it (37-53 lines for Q4_K .. Q6_K), they stalled the core until
 * the misses drained (bench_gemm cold, Zen 3, Q6_K at 1 thread: 8.7
 * against 11.4-12.2 GB/s). The half-group kernels (AVX-VNNI's, and a group
 * the row range cuts) still ask in one burst. */
ALWAYS void kp_spread(const uint8_t *p, int bytes, int i, int n)
{
	const int lines = (bytes + 63) / 64;

	for (int l = lines * i / n; l < lines * (i + 1) / n; l++)
		_mm_prefetch((const char *)p + KP_PREFETCH + 64 * l, _MM_HINT_T0);
}

/* A half group's pass touches every cache line of the group (each holds
 * both halves), so the first pass streams the group from memory and
 * prefetches (kpack_prefetch()), the second finds it in L1 or L2 (a group
 * of 16 rows of 4096 Q8_0 values is 70 KB). */

/* ---- K-quants ---- */

/* qdot_k_tree8() of 8 vectors, lane by lane. */
TGT_AVX2 ALWAYS __m256 tree8(const __m256 v[8])
{
	return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])),
			     _mm256_add_ps(_mm256_add_ps(v[4], v[5]), _mm256_add_ps(v[6], v[7])));
}

/* The float of group g's exact integer sums (8 rows), times x.d[g]. */
TGT_AVX2 ALWAYS __m256 grp_term(__m256i sum, const struct qdot_kblock *x, int g)
{
	return _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(x->d[g]));
}

/* acc + qdot_k_ref()'s two fused multiply-adds of super-block p's rows
 * 8h .. 8h+7 (kpack.c's kp_finish() on 8 lanes). */
TGT_AVX2 ALWAYS __m256 kp_finish(const uint8_t *p, int h, const __m256 P[8], const __m256 *Q,
				 __m256 acc)
{
	acc = _mm256_fmadd_ps(tree8(P), h8(p + KP_D + 16 * h), acc);
	if (!Q)
		return acc;
	return _mm256_fnmadd_ps(tree8(Q), h8(p + KP_DMIN + 16 * h), acc);
}

/*
 * AVX2 has no byte dot into int32: maddubs gives each row's two int16 pair
 * sums, and madd against 1s made them int32 after every maddubs. Here the
 * int16 pairs of several maddubs are added first and madd then multiplies
 * them by the row's sub-block scale, which also takes the place of a
 * vpmulld. The sums stay exact: a pair is at most 2 * 15 * 127 = 3810
 * for 4-bit values (8 of them: 30480) and 7874 for 5-bit ones (4: 31496),
 * below 32768, and |x| <= 127 (qdot_k_quantize_row()). So the integers,
 * hence the bits, are the VNNI path's.
 */

/* 8 u8 scales at sc, each in both int16 halves of its row's int32 lane. */
TGT_AVX2 ALWAYS __m256i sc_pairs(const uint8_t *sc)
{
	const __m128i v = _mm_loadl_epi64((const __m128i *)sc);

	return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v));
}

/* Nibble vector v of a sub-block's half at q, split; Q5_K's fifth bits
 * from fh (bit 2v to bit 4 of lo, bit 2v + 1 to bit 4 of hi). */
TGT_AVX2 ALWAYS void q45k_split8(bool five, const uint8_t *q, __m256i fh, int v, int h,
				__m256i *lo, __m256i *hi)
{
	const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
	const __m256i w = half(q + 64 * v, h);

	*lo = _mm256_and_si256(w, m4);
	*hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
	if (five) {
		*lo = _mm256_or_si256(*lo, _mm256_and_si256(v < 2 ? _mm256_slli_epi16(fh, 4 - 2 * v) :
								      _mm256_srli_epi16(fh, 2 * v - 4), b4));
		*hi = _mm256_or_si256(*hi, _mm256_and_si256(v < 2 ? _mm256_slli_epi16(fh, 3 - 2 * v) :
								      _mm256_srli_epi16(fh, 2 * v - 3), b4));
	}
}

/* Sub-block s's 8 rows' exact sum of u * x times their scale (AVX2). */
TGT_AVX2 ALWAYS __m256i q45k_sub_avx2(bool five, const uint8_t *p, const int8_t *xq, int s, int h)
{
	const uint8_t *q = p + KP_Q + kp_sub(five) * s;
	const __m256i fh = five ? half(q + 256, h) : _mm256_setzero_si256();
	const __m256i sc = sc_pairs(p + KP_SC + 16 * s + 8 * h);
	__m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();

	for (int v = 0; v < 4; v++) {
		__m256i lo, hi;

		q45k_split8(five, q, fh, v, h, &lo, &hi);
		a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(lo, x4(xq + 8 * v)));
		a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(hi, x4(xq + 8 * v + 4)));
	}
	if (!five)
		return _mm256_madd_epi16(_mm256_add_epi16(a0, a1), sc);
	return _mm256_add_epi32(_mm256_madd_epi16(a0, sc), _mm256_madd_epi16(a1, sc));
}

/* The same on AVX-VNNI: vpdpbusd's int32 sums times the scale. */
TGT_AVXVNNI ALWAYS __m256i q45k_sub_avxvnni(bool five, const uint8_t *p, const int8_t *xq, int s,
					   int h)
{
	const uint8_t *q = p + KP_Q + kp_sub(five) * s;
	const __m256i fh = five ? half(q + 256, h) : _mm256_setzero_si256();
	__m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();

	for (int v = 0; v < 4; v++) {
		__m256i lo, hi;

		q45k_split8(five, q, fh, v, h, &lo, &hi);
		a0 = avxvnni_dot(a0, lo, x4(xq + 8 * v));
		a1 = avxvnni_dot(a1, hi, x4(xq + 8 * v + 4));
	}
	return _mm256_mullo_epi32(_mm256_add_epi32(a0, a1),
				  _mm256_cvtepu8_epi32(_mm_loadl_epi64(
					  (const __m128i *)(p + KP_SC + 16 * s + 8 * h))));
}

/*
 * Packed Q4_K (five: Q5_K) super-block p, rows 8h .. 8h+7, against x:
 * kpack.c's q45k_block() on 8 lanes.
 */
#define Q45K_HALF(attr, name, SUB)                                                         \
	attr ALWAYS __m256 name(bool five, const uint8_t *p, const struct qdot_kblock *x,  \
				int h, __m256 acc)                                         \
	{                                                                                  \
		__m256 P[8], Q[8];                                                         \
                                                                                           \
		for (int s = 0; s < 8; s++) {                                              \
			int bs = x->bsums[2 * s] + x->bsums[2 * s + 1];                    \
                                                                                           \
			P[s] = grp_term(SUB(five, p, x->q + 32 * s, s, h), x, s);          \
			Q[s] = grp_term(_mm256_mullo_epi32(                                \
				_mm256_set1_epi32(bs), _mm256_cvtepu8_epi32(_mm_loadl_epi64( \
					(const __m128i *)(p + KP_MN + 16 * s + 8 * h)))), x, s); \
		}                                                                          \
		return kp_finish(p, h, P, Q, acc);                                         \
	}

/* The same for Q6_K: kpack.c's q6k_block() on 8 lanes. */
#define Q6K_HALF(attr, name, DOT, I16)                                                          \
	attr ALWAYS __m256 name(bool unused, const uint8_t *p, const struct qdot_kblock *x, \
				int h, __m256 acc)                                         \
	{                                                                                  \
		const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30);      \
		__m256i isum = _mm256_setzero_si256();                                     \
		__m256 P[8];                                                               \
                                                                                           \
		(void)unused;                                                              \
		for (int i = 0; i < 16; i++) {                                             \
			const uint8_t *q = p + KP_Q + KP6_SUB * i;                         \
			const int8_t *xq = x->q + 16 * i;                                  \
			__m256i w0 = half(q, h), w1 = half(q + 64, h), hb = half(q + 128, h); \
			__m256i u0 = _mm256_or_si256(_mm256_and_si256(w0, m4),             \
				_mm256_and_si256(_mm256_slli_epi16(hb, 4), m2));           \
			__m256i u1 = _mm256_or_si256(                                      \
				_mm256_and_si256(_mm256_srli_epi16(w0, 4), m4),            \
				_mm256_and_si256(_mm256_slli_epi16(hb, 2), m2));           \
			__m256i u2 = _mm256_or_si256(_mm256_and_si256(w1, m4),             \
						     _mm256_and_si256(hb, m2));            \
			__m256i u3 = _mm256_or_si256(                                      \
				_mm256_and_si256(_mm256_srli_epi16(w1, 4), m4),            \
				_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2));           \
			const __m128i sv = _mm_loadl_epi64(                                \
				(const __m128i *)(p + KP_SC + 16 * i + 8 * h));            \
                                                                                           \
			if (I16) { /* pairs of 2 * 63 * 127, two of them summed */          \
				const __m256i sc = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sv, sv)); \
				__m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(u0, x4(xq)), \
					_mm256_maddubs_epi16(u1, x4(xq + 4)));             \
				__m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(u2, x4(xq + 8)), \
					_mm256_maddubs_epi16(u3, x4(xq + 12)));            \
                                                                                           \
				isum = _mm256_add_epi32(isum, _mm256_add_epi32(            \
					_mm256_madd_epi16(p0, sc), _mm256_madd_epi16(p1, sc))); \
				/* sc * -32 * bsum: both halves of the pair take -16 */    \
				isum = _mm256_add_epi32(isum, _mm256_madd_epi16(sc,        \
					_mm256_set1_epi16((short)(-16 * x->bsums[i]))));   \
			} else {                                                           \
				__m256i a0 = DOT(_mm256_set1_epi32(-32 * x->bsums[i]), u0, x4(xq)); \
				__m256i a1 = DOT(_mm256_setzero_si256(), u2, x4(xq + 8));  \
                                                                                           \
				a0 = DOT(a0, u1, x4(xq + 4));                              \
				a1 = DOT(a1, u3, x4(xq + 12));                             \
				isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(          \
					_mm256_add_epi32(a0, a1), _mm256_cvtepi8_epi32(sv))); \
			}                                                                  \
			if (i % 2) {                                                       \
				P[i / 2] = grp_term(isum, x, i / 2);                       \
				isum = _mm256_setzero_si256();                             \
			}                                                                  \
		}                                                                          \
		return kp_finish(p, h, P, NULL, acc);                                      \
	}

/* The same for Q2_K (q3: Q3_K): kpack.c's kq_block() on 8 lanes. */
#define KQ_HALF(attr, name, DOT, I16)                                                           \
	attr ALWAYS __m256 name(bool q3, const uint8_t *p, const struct qdot_kblock *x,    \
				int h, __m256 acc)                                         \
	{                                                                                  \
		const __m256i m2 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);          \
		const __m128i n4 = _mm_set1_epi8(15);                                      \
		__m256i isum = _mm256_setzero_si256(), msum = _mm256_setzero_si256();      \
		__m256 P[8], Q[8];                                                         \
                                                                                           \
		for (int i = 0; i < 16; i++) {                                             \
			const __m256i w = half(p + KP_Q + 64 * i, h);                      \
			const __m256i hb = q3 ? half(p + KP3_H + 64 * (i / 2), h) :        \
						_mm256_setzero_si256();                    \
			const __m128i sb = _mm_loadl_epi64(                                \
				(const __m128i *)(p + KP_SC + 16 * i + 8 * h));            \
			__m256i a = _mm256_set1_epi32(q3 ? -4 * x->bsums[i] : 0);          \
			__m256i a16 = _mm256_setzero_si256();                              \
                                                                                           \
			for (int c = 0; c < 4; c++) {                                      \
				const int sh = c + 4 * (i % 2);                            \
				__m256i u = _mm256_and_si256(                              \
					c ? _mm256_srli_epi16(w, 2 * c) : w, m2);          \
                                                                                           \
				if (q3)                                                    \
					u = _mm256_or_si256(u, _mm256_and_si256(sh >= 2 ?  \
						_mm256_srli_epi16(hb, sh - 2) :            \
						_mm256_slli_epi16(hb, 2 - sh), b2));       \
				if (I16) /* pairs of 2 * 7 * 127, four summed */            \
					a16 = _mm256_add_epi16(a16, _mm256_maddubs_epi16(  \
						u, x4(x->q + 16 * i + 4 * c)));            \
				else                                                       \
					a = DOT(a, u, x4(x->q + 16 * i + 4 * c));          \
			}                                                                  \
			if (I16) {                                                         \
				const __m128i sv = q3 ? sb : _mm_and_si128(sb, n4);        \
				const __m128i sp = _mm_unpacklo_epi8(sv, sv);              \
				const __m256i sc = q3 ? _mm256_cvtepi8_epi16(sp) :         \
							_mm256_cvtepu8_epi16(sp);          \
                                                                                           \
				isum = _mm256_add_epi32(isum, _mm256_madd_epi16(a16, sc)); \
				if (q3) /* sc * -4 * bsum: -2 in both halves */            \
					isum = _mm256_add_epi32(isum, _mm256_madd_epi16(sc, \
						_mm256_set1_epi16((short)(-2 * x->bsums[i])))); \
				if (!q3)                                                   \
					msum = _mm256_add_epi32(msum, _mm256_mullo_epi32(  \
						_mm256_set1_epi32(x->bsums[i]), _mm256_cvtepu8_epi32( \
							_mm_and_si128(_mm_srli_epi16(sb, 4), n4)))); \
			} else if (q3) {                                                   \
				isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(a,        \
					_mm256_cvtepi8_epi32(sb)));                        \
			} else {                                                           \
				isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(a,        \
					_mm256_cvtepu8_epi32(_mm_and_si128(sb, n4))));     \
				msum = _mm256_add_epi32(msum, _mm256_mullo_epi32(          \
					_mm256_set1_epi32(x->bsums[i]), _mm256_cvtepu8_epi32( \
						_mm_and_si128(_mm_srli_epi16(sb, 4), n4)))); \
			}                                                                  \
			if (i % 2) {                                                       \
				P[i / 2] = grp_term(isum, x, i / 2);                       \
				Q[i / 2] = grp_term(msum, x, i / 2);                       \
				isum = msum = _mm256_setzero_si256();                      \
			}                                                                  \
		}                                                                          \
		return kp_finish(p, h, P, q3 ? NULL : Q, acc);                             \
	}

KQ_HALF(TGT_AVX2, kq_avx2, avx2_dot, true)
KQ_HALF(TGT_AVXVNNI, kq_avxvnni, avxvnni_dot, false)
Q45K_HALF(TGT_AVX2, q45k_avx2, q45k_sub_avx2)
Q45K_HALF(TGT_AVXVNNI, q45k_avxvnni, q45k_sub_avxvnni)
Q6K_HALF(TGT_AVX2, q6k_avx2, avx2_dot, true)
Q6K_HALF(TGT_AVXVNNI, q6k_avxvnni, avxvnni_dot, false)

/* Copies lanes lo .. hi-1 of v (rows r0 + lo ..) to y, which starts at row
 * j0. */
TGT_AVX2 ALWAYS void store_rows(__m256 v, int64_t r0, int64_t lo, int64_t hi, int64_t j0,
				float *y)
{
	float lanes[8];

	_mm256_storeu_ps(lanes, v);
	memcpy(y + r0 + lo - j0, lanes + lo, (size_t)(hi - lo) * sizeof(float));
}

/* Lanes lo .. hi (clipped to 0 .. 8) of the 8 rows from r0 that lie in
 * [j0, j1); false if none does. */
ALWAYS bool rows_in(int64_t r0, int64_t j0, int64_t j1, int64_t *lo, int64_t *hi)
{
	*lo = j0 > r0 ? j0 - r0 : 0;
	*hi = j1 - r0 < 8 ? j1 - r0 : 8;
	return *lo < *hi;
}

/* Rows [j0, j1) of a packed K-quant weight, half group by half group;
 * block(v, p, x, h, acc) is one super-block (v: the format's variant). */
#define KQ_ROWS(attr, name, block, v, bytes)                                               \
	attr static void name(const uint8_t *w, const void *xv, int64_t nb, float *y,        \
			      int64_t j0, int64_t j1)                                      \
	{                                                                                  \
		const struct qdot_kblock *x = xv;                                           \
		const size_t gb = (size_t)nb * (bytes);                                     \
                                                                                           \
		for (int64_t g = j0 / KPACK_ROWS; g * KPACK_ROWS < j1; g++) {               \
			const uint8_t *p = w + (size_t)g * gb;                              \
                                                                                           \
			for (int h = 0; h < 2; h++) {                                       \
				const int64_t r0 = g * KPACK_ROWS + 8 * h;                  \
				__m256 acc = _mm256_setzero_ps();                           \
				int64_t lo, hi;                                             \
                                                                                           \
				if (!rows_in(r0, j0, j1, &lo, &hi))                         \
					continue;                                           \
				for (int64_t b = 0; b < nb; b++) {                          \
					if (h == 0)                                         \
						kpack_prefetch(p + b * (bytes), bytes);           \
					acc = block(v, p + b * (bytes), x + b, h, acc);     \
				}                                                           \
				store_rows(acc, r0, lo, hi, j0, y);                         \
			}                                                                   \
		}                                                                          \
	}

/*
 * Q45K_HALF of both halves in one pass: each activation broadcast serves
 * the 16 rows (the half passes took it twice, 8 of a sub-block's 41
 * vector operations each), and the group streams once. Each lane's steps
 * are Q45K_HALF's, so the bits are.
 */
TGT_AVX2 ALWAYS void q45k_both_avx2(bool five, const uint8_t *p, const struct qdot_kblock *x,
				    __m256 acc[2])
{
	__m256 P[2][8], Q[2][8];

	for (int s = 0; s < 8; s++) {
		const uint8_t *q = p + KP_Q + kp_sub(five) * s;
		const int8_t *xq = x->q + 32 * s;
		const __m256i bs = _mm256_set1_epi32(x->bsums[2 * s] + x->bsums[2 * s + 1]);
		__m256i a0[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
		__m256i a1[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };

		kp_spread(p, five ? KP_Q5K : KP_Q4K, s, 8);

		for (int v = 0; v < 4; v++) {
			const __m256i xl = x4(xq + 8 * v), xh = x4(xq + 8 * v + 4);

			for (int h = 0; h < 2; h++) {
				const __m256i fh = five ? half(q + 256, h) : _mm256_setzero_si256();
				__m256i lo, hi;

				q45k_split8(five, q, fh, v, h, &lo, &hi);
				a0[h] = _mm256_add_epi16(a0[h], _mm256_maddubs_epi16(lo, xl));
				a1[h] = _mm256_add_epi16(a1[h], _mm256_maddubs_epi16(hi, xh));
			}
		}
		for (int h = 0; h < 2; h++) {
			const __m256i sc = sc_pairs(p + KP_SC + 16 * s + 8 * h);
			const __m256i sum = five ? _mm256_add_epi32(_mm256_madd_epi16(a0[h], sc),
								    _mm256_madd_epi16(a1[h], sc)) :
						   _mm256_madd_epi16(_mm256_add_epi16(a0[h], a1[h]), sc);

			P[h][s] = grp_term(sum, x, s);
			Q[h][s] = grp_term(_mm256_mullo_epi32(bs, _mm256_cvtepu8_epi32(_mm_loadl_epi64(
							(const __m128i *)(p + KP_MN + 16 * s + 8 * h)))),
					   x, s);
		}
	}
	for (int h = 0; h < 2; h++)
		acc[h] = kp_finish(p, h, P[h], Q[h], acc[h]);
}

/* Q6_K sub-block q's four 4-value lanes of rows 8h .. 8h+7 as u (q + 32),
 * with the row's int8 scales (p at sub-block i) in both int16 halves. */
TGT_AVX2 ALWAYS void q6k_u4(const uint8_t *p, int i, int h, __m256i u[4], __m256i *sc)
{
	const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30);
	const uint8_t *q = p + KP_Q + KP6_SUB * i;
	const __m256i w0 = half(q, h), w1 = half(q + 64, h), hb = half(q + 128, h);
	const __m128i sv = _mm_loadl_epi64((const __m128i *)(p + KP_SC + 16 * i + 8 * h));

	u[0] = _mm256_or_si256(_mm256_and_si256(w0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m2));
	u[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w0, 4), m4),
			       _mm256_and_si256(_mm256_slli_epi16(hb, 2), m2));
	u[2] = _mm256_or_si256(_mm256_and_si256(w1, m4), _mm256_and_si256(hb, m2));
	u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w1, 4), m4),
			       _mm256_and_si256(_mm256_srli_epi16(hb, 2), m2));
	*sc = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sv, sv));
}

/* Q6K_HALF's AVX2 steps on both halves in one pass, as q45k_both_avx2(). */
TGT_AVX2 ALWAYS void q6k_both_avx2(bool unused, const uint8_t *p, const struct qdot_kblock *x,
				   __m256 acc[2])
{
	__m256i isum[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
	__m256 P[2][8];

	(void)unused;
	for (int i = 0; i < 16; i++) {
		const int8_t *xq = x->q + 16 * i;
		const __m256i x0 = x4(xq), x1 = x4(xq + 4), x2 = x4(xq + 8), x3 = x4(xq + 12);
		/* sc * -32 * bsum: both halves of the pair take -16 */
		const __m256i nb = _mm256_set1_epi16((short)(-16 * x->bsums[i]));

		kp_spread(p, KP_Q6K, i, 16);
		for (int h = 0; h < 2; h++) {
			__m256i u[4], sc, p0, p1;

			q6k_u4(p, i, h, u, &sc);
			p0 = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], x0), _mm256_maddubs_epi16(u[1], x1));
			p1 = _mm256_add_epi16(_mm256_maddubs_epi16(u[2], x2), _mm256_maddubs_epi16(u[3], x3));

			isum[h] = _mm256_add_epi32(isum[h], _mm256_add_epi32(_mm256_madd_epi16(p0, sc),
									     _mm256_madd_epi16(p1, sc)));
			isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(sc, nb));
			if (i % 2) {
				P[h][i / 2] = grp_term(isum[h], x, i / 2);
				isum[h] = _mm256_setzero_si256();
			}
		}
	}
	for (int h = 0; h < 2; h++)
		acc[h] = kp_finish(p, h, P[h], NULL, acc[h]);
}

/* KQ_HALF's AVX2 steps (Q2_K; q3: Q3_K) on both halves in one pass, as
 * q45k_both_avx2(). */
TGT_AVX2 ALWAYS void kq_both_avx2(bool q3, const uint8_t *p, const struct qdot_kblock *x,
				  __m256 acc[2])
{
	const __m256i m2 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
	const __m128i n4 = _mm_set1_epi8(15);
	__m256i isum[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
	__m256i msum[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
	__m256 P[2][8], Q[2][8];

	for (int i = 0; i < 16; i++) {
		const int8_t *xq = x->q + 16 * i;
		const __m256i xb[4] = { x4(xq), x4(xq + 4), x4(xq + 8), x4(xq + 12) };
		/* Q3_K: sc * -4 * bsum, -2 in both halves; Q2_K: bsum times mn */
		const __m256i nb = _mm256_set1_epi16((short)(-2 * x->bsums[i]));
		const __m256i bs = _mm256_set1_epi32(x->bsums[i]);

		kp_spread(p, q3 ? KP_Q3K : KP_Q2K, i, 16);
		for (int h = 0; h < 2; h++) {
			const __m256i w = half(p + KP_Q + 64 * i, h);
			const __m256i hb = q3 ? half(p + KP3_H + 64 * (i / 2), h) : _mm256_setzero_si256();
			const __m128i sb = _mm_loadl_epi64((const __m128i *)(p + KP_SC + 16 * i + 8 * h));
			const __m128i sv = q3 ? sb : _mm_and_si128(sb, n4);
			const __m128i sp = _mm_unpacklo_epi8(sv, sv);
			const __m256i sc = q3 ? _mm256_cvtepi8_epi16(sp) : _mm256_cvtepu8_epi16(sp);
			__m256i a16 = _mm256_setzero_si256();

			for (int c = 0; c < 4; c++) { /* pairs of 2 * 7 * 127, four summed */
				const int sh = c + 4 * (i % 2);
				__m256i u = _mm256_and_si256(c ? _mm256_srli_epi16(w, 2 * c) : w, m2);

				if (q3)
					u = _mm256_or_si256(u, _mm256_and_si256(
						sh >= 2 ? _mm256_srli_epi16(hb, sh - 2) : _mm256_slli_epi16(hb, 2 - sh),
						b2));
				a16 = _mm256_add_epi16(a16, _mm256_maddubs_epi16(u, xb[c]));
			}
			isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(a16, sc));
			if (q3)
				isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(sc, nb));
			else
				msum[h] = _mm256_add_epi32(msum[h], _mm256_mullo_epi32(bs, _mm256_cvtepu8_epi32(
					_mm_and_si128(_mm_srli_epi16(sb, 4), n4))));
			if (i % 2) {
				P[h][i / 2] = grp_term(isum[h], x, i / 2);
				Q[h][i / 2] = grp_term(msum[h], x, i / 2);
				isum[h] = msum[h] = _mm256_setzero_si256();
			}
		}
	}
	for (int h = 0; h < 2; h++)
		acc[h] = kp_finish(p, h, P[h], q3 ? NULL : Q[h], acc[h]);
}

/* Rows [j0, j1) of a packed K-quant weight: a group whose 16 rows all lie
 * in the range both halves a pass (both(v, p, x, acc[2])), one cut by it
 * through halves(), a KQ_ROWS kernel, on its rows alone. */
#define KQ_ROWS2(attr, name, halves, both, v, bytes)                                       \
	attr static void name(const uint8_t *w, const void *xv, int64_t nb, float *y,        \
			      int64_t j0, int64_t j1)                                      \
	{                                                                                  \
		const struct qdot_kblock *x = xv;                                           \
		const size_t gb = (size_t)nb * (bytes);                                     \
                                                                                           \
		for (int64_t g = j0 / KPACK_ROWS; g * KPACK_ROWS < j1; g++) {               \
			const uint8_t *p = w + (size_t)g * gb;                              \
			const int64_t r0 = g * KPACK_ROWS, r1 = r0 + KPACK_ROWS;            \
			__m256 acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };       \
                                                                                           \
			if (r0 < j0 || r1 > j1) {                                           \
				const int64_t a = r0 > j0 ? r0 : j0, b = r1 < j1 ? r1 : j1; \
                                                                                           \
				halves(w, xv, nb, y + a - j0, a, b);                        \
				continue;                                                   \
			}                                                                   \
			for (int64_t b = 0; b < nb; b++)                                    \
				both(v, p + b * (bytes), x + b, acc);                       \
			_mm256_storeu_ps(y + r0 - j0, acc[0]);                              \
			_mm256_storeu_ps(y + r0 + 8 - j0, acc[1]);                          \
		}                                                                          \
	}

KQ_ROWS(TGT_AVX2, q2k_halves_avx2, kq_avx2, false, KP_Q2K)
KQ_ROWS(TGT_AVX2, q3k_halves_avx2, kq_avx2, true, KP_Q3K)
KQ_ROWS(TGT_AVX2, q4k_halves_avx2, q45k_avx2, false, KP_Q4K)
KQ_ROWS(TGT_AVX2, q5k_halves_avx2, q45k_avx2, true, KP_Q5K)
KQ_ROWS(TGT_AVX2, q6k_halves_avx2, q6k_avx2, false, KP_Q6K)
KQ_ROWS2(TGT_AVX2, q2k_rows_avx2, q2k_halves_avx2, kq_both_avx2, false, KP_Q2K)
KQ_ROWS2(TGT_AVX2, q3k_rows_avx2, q3k_halves_avx2, kq_both_avx2, true, KP_Q3K)
KQ_ROWS2(TGT_AVX2, q4k_rows_avx2, q4k_halves_avx2, q45k_both_avx2, false, KP_Q4K)
KQ_ROWS2(TGT_AVX2, q5k_rows_avx2, q5k_halves_avx2, q45k_both_avx2, true, KP_Q5K)
KQ_ROWS2(TGT_AVX2, q6k_rows_avx2, q6k_halves_avx2, q6k_both_avx2, false, KP_Q6K)
KQ_ROWS(TGT_AVXVNNI, q2k_rows_avxvnni, kq_avxvnni, false, KP_Q2K)
KQ_ROWS(TGT_AVXVNNI, q3k_rows_avxvnni, kq_avxvnni, true, KP_Q3K)
KQ_ROWS(TGT_AVXVNNI, q4k_rows_avxvnni, q45k_avxvnni, false, KP_Q4K)
KQ_ROWS(TGT_AVXVNNI, q5k_rows_avxvnni, q45k_avxvnni, true, KP_Q5K)
KQ_ROWS(TGT_AVXVNNI, q6k_rows_avxvnni, q6k_avxvnni, false, KP_Q6K)

/*
 * Q4_K, Q5_K (and Q6_K below) for up to SEQ_X_K activation rows at once
 * (kpack_kernel_m() on AVX2): each sub-block's nibble vectors are split once and serve every
 * row, each row taking q45k_sub_avx2()'s int16 sums and Q45K_HALF's float
 * steps, so its bits are the one-row kernel's; the rows' group terms wait
 * in memory until the super-block's two fmas.
 */
#define SEQ_X_K 4

TGT_AVX2 ALWAYS void q45k_block_x(bool five, const uint8_t *p, const struct qdot_kblock *x,
				  int64_t xr, int h, int X, bool pf, __m256 *acc)
{
	__m256 P[SEQ_X_K][8], Q[SEQ_X_K][8];

	for (int s = 0; s < 8; s++) {
		const uint8_t *q = p + KP_Q + kp_sub(five) * s;
		const __m256i fh = five ? half(q + 256, h) : _mm256_setzero_si256();
		const __m256i sc = sc_pairs(p + KP_SC + 16 * s + 8 * h);
		const __m256i mn = _mm256_cvtepu8_epi32(
			_mm_loadl_epi64((const __m128i *)(p + KP_MN + 16 * s + 8 * h)));
		__m256i lo[4], hi[4];

		if (pf)
			kp_spread(p, five ? KP_Q5K : KP_Q4K, s, 8);
		for (int v = 0; v < 4; v++)
			q45k_split8(five, q, fh, v, h, &lo[v], &hi[v]);
		for (int i = 0; i < X; i++) {
			const struct qdot_kblock *xi = x + i * xr;
			const int8_t *xq = xi->q + 32 * s;
			const int bs = xi->bsums[2 * s] + xi->bsums[2 * s + 1];
			__m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256(), sum;

			for (int v = 0; v < 4; v++) {
				a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(lo[v], x4(xq + 8 * v)));
				a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(hi[v], x4(xq + 8 * v + 4)));
			}
			sum = five ? _mm256_add_epi32(_mm256_madd_epi16(a0, sc), _mm256_madd_epi16(a1, sc)) :
				     _mm256_madd_epi16(_mm256_add_epi16(a0, a1), sc);
			P[i][s] = grp_term(sum, xi, s);
			Q[i][s] = grp_term(_mm256_mullo_epi32(_mm256_set1_epi32(bs), mn), xi, s);
		}
	}
	for (int i = 0; i < X; i++)
		acc[i] = kp_finish(p, h, P[i], Q[i], acc[i]);
}

/* The same for Q6_K: each sub-block of 16 values unpacked once, each row
 * taking q6k_avx2()'s steps. */
TGT_AVX2 ALWAYS void q6k_block_x(bool unused, const uint8_t *p, const struct qdot_kblock *x,
				 int64_t xr, int h, int X, bool pf, __m256 *acc)
{
	__m256i isum[SEQ_X_K];
	__m256 P[SEQ_X_K][8];

	(void)unused;
	for (int i = 0; i < X; i++)
		isum[i] = _mm256_setzero_si256();
	for (int k = 0; k < 16; k++) {
		__m256i u[4], sc;

		if (pf)
			kp_spread(p, KP_Q6K, k, 16);
		q6k_u4(p, k, h, u, &sc);
		for (int i = 0; i < X; i++) {
			const struct qdot_kblock *xi = x + i * xr;
			const int8_t *xq = xi->q + 16 * k;
			__m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], x4(xq)),
						      _mm256_maddubs_epi16(u[1], x4(xq + 4)));
			__m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(u[2], x4(xq + 8)),
						      _mm256_maddubs_epi16(u[3], x4(xq + 12)));

			isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(_mm256_madd_epi16(p0, sc),
									     _mm256_madd_epi16(p1, sc)));
			isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(sc,
						   _mm256_set1_epi16((short)(-16 * xi->bsums[k]))));
			if (k % 2) {
				P[i][k / 2] = grp_term(isum[i], xi, k / 2);
				isum[i] = _mm256_setzero_si256();
			}
		}
	}
	for (int i = 0; i < X; i++)
		acc[i] = kp_finish(p, h, P[i], NULL, acc[i]);
}

/* The same for Q2_K (q3: Q3_K): each sub-block's 2-bit (3-bit) values
 * unpacked once, each row taking kq_avx2()'s int16 steps. */
TGT_AVX2 ALWAYS void kq_block_x(bool q3, const uint8_t *p, const struct qdot_kblock *x,
				int64_t xr, int h, int X, bool pf, __m256 *acc)
{
	const __m256i m2 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
	const __m128i n4 = _mm_set1_epi8(15);
	__m256i isum[SEQ_X_K], msum[SEQ_X_K];
	__m256 P[SEQ_X_K][8], Q[SEQ_X_K][8];

	for (int r = 0; r < X; r++)
		isum[r] = msum[r] = _mm256_setzero_si256();
	for (int i = 0; i < 16; i++) {
		const __m256i w = half(p + KP_Q + 64 * i, h);
		const __m256i hb = q3 ? half(p + KP3_H + 64 * (i / 2), h) : _mm256_setzero_si256();
		const __m128i sb = _mm_loadl_epi64((const __m128i *)(p + KP_SC + 16 * i + 8 * h));
		const __m128i sv = q3 ? sb : _mm_and_si128(sb, n4), sp = _mm_unpacklo_epi8(sv, sv);
		const __m256i sc = q3 ? _mm256_cvtepi8_epi16(sp) : _mm256_cvtepu8_epi16(sp);
		const __m256i mn = _mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(sb, 4), n4));
		__m256i u[4];

		if (pf)
			kp_spread(p, q3 ? KP_Q3K : KP_Q2K, i, 16);
		for (int c = 0; c < 4; c++) {
			const int sh = c + 4 * (i % 2);

			u[c] = _mm256_and_si256(c ? _mm256_srli_epi16(w, 2 * c) : w, m2);
			if (q3)
				u[c] = _mm256_or_si256(u[c], _mm256_and_si256(
					sh >= 2 ? _mm256_srli_epi16(hb, sh - 2) : _mm256_slli_epi16(hb, 2 - sh),
					b2));
		}
		for (int r = 0; r < X; r++) {
			const struct qdot_kblock *xrow = x + r * xr;
			__m256i a16 = _mm256_setzero_si256();

			for (int c = 0; c < 4; c++)
				a16 = _mm256_add_epi16(a16, _mm256_maddubs_epi16(
					u[c], x4(xrow->q + 16 * i + 4 * c)));
			isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(a16, sc));
			if (q3)
				isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(sc,
					_mm256_set1_epi16((short)(-2 * xrow->bsums[i]))));
			else
				msum[r] = _mm256_add_epi32(msum[r], _mm256_mullo_epi32(
					_mm256_set1_epi32(xrow->bsums[i]), mn));
			if (i % 2) {
				P[r][i / 2] = grp_term(isum[r], xrow, i / 2);
				Q[r][i / 2] = grp_term(msum[r], xrow, i / 2);
				isum[r] = msum[r] = _mm256_setzero_si256();
			}
		}
	}
	for (int r = 0; r < X; r++)
		acc[r] = kp_finish(p, h, P[r], q3 ? NULL : Q[r], acc[r]);
}

/* kpack_mfn of a K-quant: rows [j0, j1) of w against m rows x + i * nb,
 * half group by half group, SEQ_X_K rows a pass (X a constant, case by
 * case, so the row loops unroll); block(v, p, x, xr, h, X, pf, acc) is one
 * super-block of `bytes` (pf: spread its prefetches, on the first pass). */
#define KQ_ROWS_X(name, block, v, bytes)                                                   \
	TGT_AVX2 static void name(const uint8_t *w, const void *xv, int m, int64_t nb,        \
				  float *y, int64_t ys, int64_t j0, int64_t j1)              \
	{                                                                                  \
		const struct qdot_kblock *x = xv;                                           \
		const size_t gb = (size_t)nb * (bytes);                                     \
                                                                                           \
		for (int64_t g = j0 / KPACK_ROWS; g * KPACK_ROWS < j1; g++) {               \
			const uint8_t *p = w + (size_t)g * gb;                              \
                                                                                           \
			for (int h = 0; h < 2; h++) {                                       \
				const int64_t r0 = g * KPACK_ROWS + 8 * h;                  \
				int64_t lo, hi;                                             \
                                                                                           \
				if (!rows_in(r0, j0, j1, &lo, &hi))                         \
					continue;                                           \
				for (int i = 0; i < m; i += SEQ_X_K) {                       \
					const int X = m - i < SEQ_X_K ? m - i : SEQ_X_K;     \
					__m256 acc[SEQ_X_K];                                \
                                                                                           \
					for (int k = 0; k < SEQ_X_K; k++)                    \
						acc[k] = _mm256_setzero_ps();               \
					switch (X) {                                         \
					case 1: KQ_PASS(block, v, bytes, 1); break;          \
					case 2: KQ_PASS(block, v, bytes, 2); break;          \
					case 3: KQ_PASS(block, v, bytes, 3); break;          \
					default: KQ_PASS(block, v, bytes, 4); break;         \
					}                                                    \
					for (int k = 0; k < X; k++)                          \
						store_rows(acc[k], r0, lo, hi, j0,          \
							   y + (i + k) * ys);               \
				}                                                            \
			}                                                                   \
		}                                                                          \
	}
/* The pass over a half group's super-blocks (the first prefetches). */
#define KQ_PASS(block, v, bytes, X_)                                                       \
	for (int64_t b = 0; b < nb; b++)                                                   \
		block((v), p + b * (bytes), x + i * nb + b, nb, h, (X_), h == 0 && i == 0, acc);

KQ_ROWS_X(q2k_avx2_m, kq_block_x, false, KP_Q2K)
KQ_ROWS_X(q3k_avx2_m, kq_block_x, true, KP_Q3K)
KQ_ROWS_X(q4k_avx2_m, q45k_block_x, false, KP_Q4K)
KQ_ROWS_X(q5k_avx2_m, q45k_block_x, true, KP_Q5K)
KQ_ROWS_X(q6k_avx2_m, q6k_block_x, false, KP_Q6K)

/* ---- the 32-value formats ---- */

/*
 * Activation blocks a pass takes; their fixes are 16 KiB on the stack.
 * Up to this many blocks (k = 16384: a 1B or 8B model's ffn_down) the
 * fixes are made once a call; past it every half group makes them again,
 * a pass at a time, which at 128 blocks a pass halved the GEMV where k =
 * 8192 (bench_gemm, LOOM_CPU_ISA=avx2, Q4_0: 17 against 35 GB/s at k =
 * 2048, from cache).
 */
#define FIX_BLOCKS 512

/* fix[b][l] = -offset * the sum of x[b]'s bytes 4l .. 4l+3: what lane l
 * takes back out of the offset weights' sums. */
static void b32_fixes8(int offset, const struct qdot_block *x, int64_t n, int32_t (*fix)[8])
{
	for (int64_t b = 0; b < n; b++)
		for (int l = 0; l < 8; l++) {
			const int8_t *q = x[b].q + 4 * l;

			fix[b][l] = -offset * (q[0] + q[1] + q[2] + q[3]);
		}
}

/* (a0+a4 + a2+a6) + (a1+a5 + a3+a7) in every lane: ref8()'s reduce8()
 * of each row's 8 accumulators. */
TGT_AVX2 ALWAYS __m256 reduce_rows(const __m256 *a)
{
	__m256 v[4];

	for (int i = 0; i < 4; i++)
		v[i] = _mm256_add_ps(a[i], a[i + 4]);
	return _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
}

/* Bit l of each byte of fh moved to bit 4 (a Q5 value's fifth bit). */
TGT_AVX2 ALWAYS __m256i fifth(__m256i fh, int l)
{
	const __m256i b4 = _mm256_set1_epi8(16);

	if (l < 4)
		return _mm256_and_si256(_mm256_slli_epi16(fh, 4 - l), b4);
	return _mm256_and_si256(l > 4 ? _mm256_srli_epi16(fh, l - 4) : fh, b4);
}

/* Nibble vector v of a 4- or 5-bit packed block at g + at, rows 8h ..
 * 8h+7: *lo each row's values 8v .. 8v+3, *hi 8v+4 .. 8v+7, as unsigned
 * bytes (fh: the half's fifth bits, for Q5_0 and Q5_1). */
TGT_AVX2 ALWAYS void b32_values(uint32_t t, const uint8_t *g, struct b32_at at, int h,
				__m256i fh, int v, __m256i *lo, __m256i *hi)
{
	const __m256i m4 = _mm256_set1_epi8(15);
	const __m256i w = half(g + at.q + 64 * v, h);

	*lo = _mm256_and_si256(w, m4);
	*hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
	if (b32_q5(t)) {
		*lo = _mm256_or_si256(*lo, fifth(fh, 2 * v));
		*hi = _mm256_or_si256(*hi, fifth(fh, 2 * v + 1));
	}
}

/*
 * Block x (fixes f) of rows 8h .. 8h+7 against the packed block at g + at:
 * acc[l] += lane l's exact sum times d * x.d, *accm += m * x.s: AVX-VNNI's
 * 8-lane arithmetic (ref8()).
 */
TGT_AVXVNNI ALWAYS void b32_half_avxvnni(uint32_t t, const uint8_t *g, struct b32_at at,
					 const struct qdot_block *x, const int32_t *f, int h,
					 __m256 *acc, __m256 *accm)
{
	const __m256 D = _mm256_mul_ps(h8(g + at.d + 16 * h), _mm256_set1_ps(x->d));
	const int32_t *fx = b32_offset(t) ? f : (const int32_t[8]){ 0 };
	__m256i fh = _mm256_setzero_si256();

	if (b32_min(t))
		*accm = _mm256_fmadd_ps(h8(g + at.m + 16 * h),
					_mm256_set1_ps(x->s), *accm);
	if (t == LOOM_TYPE_Q8_0) {
		for (int l = 0; l < 8; l++) {
			__m256i w = half(g + at.q + 64 * l, h);
			__m256i s = avxvnni_dot(_mm256_set1_epi32(f[l]), w, x4(x->q + 4 * l));

			acc[l] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), D, acc[l]);
		}
		return;
	}
	if (b32_q5(t))
		fh = half(g + at.h, h);
	for (int v = 0; v < 4; v++) {
		__m256i lo, hi;

		b32_values(t, g, at, h, fh, v, &lo, &hi);
		lo = avxvnni_dot(_mm256_set1_epi32(fx[2 * v]), lo, x4(x->q + 8 * v));
		hi = avxvnni_dot(_mm256_set1_epi32(fx[2 * v + 1]), hi, x4(x->q + 8 * v + 4));
		acc[2 * v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), D, acc[2 * v]);
		acc[2 * v + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), D,
						 acc[2 * v + 1]);
	}
}

/*
 * Rows [j0, j1) of a packed 32-value weight: per half group, its blocks in
 * order, in passes of FIX_BLOCKS (even, so a pass holds whole pairs; the
 * fields of a pair's blocks lie at fixed offsets from it).
 */
TGT_AVXVNNI ALWAYS void b32_rows_avxvnni(uint32_t t, const uint8_t *w,
					 const struct qdot_block *x, int64_t nb, float *y,
					 int64_t j0, int64_t j1)
{
	const size_t gb = row_share(t, nb) * KPACK_ROWS, pair = b32_pair(t);
	const struct b32_at a0 = b32_at(t, 0, 2), a1 = b32_at(t, 1, 2);
	const bool fixes = b32_offset(t) != 0;
	const bool once = nb <= FIX_BLOCKS;
	int32_t fix[FIX_BLOCKS][8];

	if (once && fixes)
		b32_fixes8(b32_offset(t), x, nb, fix);
	for (int64_t gi = j0 / KPACK_ROWS; gi * KPACK_ROWS < j1; gi++) {
		const uint8_t *g = w + (size_t)gi * gb;

		for (int h = 0; h < 2; h++) {
			const int64_t r0 = gi * KPACK_ROWS + 8 * h;
			__m256 acc[8], accm = _mm256_setzero_ps();
			int64_t lo, hi, b = 0;

			if (!rows_in(r0, j0, j1, &lo, &hi))
				continue;
			for (int l = 0; l < 8; l++)
				acc[l] = _mm256_setzero_ps();
			for (int64_t s0 = 0; s0 < nb; s0 += FIX_BLOCKS) {
				int64_t end = nb - s0 < FIX_BLOCKS ? nb : s0 + FIX_BLOCKS;

				if (!once && fixes)
					b32_fixes8(b32_offset(t), x + s0, end - s0, fix);
				for (; b + 2 <= end; b += 2) {
					const uint8_t *gp = g + (size_t)(b / 2) * pair;

					if (h == 0)
						kpack_prefetch(gp, pair);
					b32_half_avxvnni(t, gp, a0, x + b, fix[b - s0], h, acc, &accm);
					b32_half_avxvnni(t, gp, a1, x + b + 1, fix[b + 1 - s0], h,
							 acc, &accm);
				}
				if (b < end) /* the last block, alone */
					b32_half_avxvnni(t, g, b32_at(t, b, nb), x + b,
							 fix[b - s0], h, acc, &accm);
			}
			store_rows(_mm256_add_ps(reduce_rows(acc), accm), r0, lo,
				   hi, j0, y);
		}
	}
}

/*
 * AVX2: block after block (qdot.c's refseq(), qgemm_ref()'s arithmetic), so
 * a row's bits are those of the prefill GEMM. Per block and row the exact
 * integer dot of its 32 values, one float step:
 *   acc = fmaf((float)isum, d * x.d, acc),  then  acc = fmaf(m, x.s, acc)
 * The maddubs pairs of several 4-value lanes add in int16 before the one
 * madd that widens them (8 lanes of 4-bit u: 8 * 2 * 15 * 127 < 32768; 4
 * of 5-bit u), and the offset formats' -offset * sum(x.q) is added once a
 * block, so a block costs 9 or 10 multiplies a half group where the
 * 8-lane arithmetic took 16 and a conversion and fma per lane.
 */

/* -offset * the sum of each block's 32 activation bytes. */
static void b32_fixes(int offset, const struct qdot_block *x, int64_t n, int32_t *fix)
{
	for (int64_t b = 0; b < n; b++) {
		int32_t sum = 0;

		for (int e = 0; e < 32; e++)
			sum += x[b].q[e];
		fix[b] = -offset * sum;
	}
}

/* Block x's 32 activation bytes as b32_half_avx2() takes them: word l
 * (values 4l .. 4l+3) broadcast to every lane. */
TGT_AVX2 ALWAYS void b32_xwords(const struct qdot_block *x, __m256i xb[8])
{
	for (int l = 0; l < 8; l++)
		xb[l] = x4(x->q + 4 * l);
}

/* acc after block x (fix: b32_fixes()'s; xb: b32_xwords()) of rows 8h ..
 * 8h+7 against the packed block at g + at. */
TGT_AVX2 ALWAYS __m256 b32_half_avx2(uint32_t t, const uint8_t *g, struct b32_at at,
				     const struct qdot_block *x, const __m256i xb[8], int32_t fix,
				     int h, __m256 acc)
{
	const __m256i one = _mm256_set1_epi16(1);
	const __m256 D = _mm256_mul_ps(h8(g + at.d + 16 * h), _mm256_set1_ps(x->d));
	const int chunk = b32_q5(t) ? 2 : 4; /* nibble vectors (2 lanes each) an int16 sum */
	__m256i isum = _mm256_set1_epi32(fix), s16 = _mm256_setzero_si256(), fh;

	if (t == LOOM_TYPE_Q8_0) { /* |q| times x with q's sign: a madd a lane */
		for (int l = 0; l < 8; l++) {
			__m256i w = _mm256_xor_si256(half(g + at.q + 64 * l, h),
						     _mm256_set1_epi8((char)0x80));
			__m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xb[l], w));

			isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, one));
		}
		return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), D, acc);
	}
	fh = b32_q5(t) ? half(g + at.h, h) : _mm256_setzero_si256();
	for (int v = 0; v < 4; v++) {
		__m256i lo, hi;

		b32_values(t, g, at, h, fh, v, &lo, &hi);
		s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo, xb[2 * v]));
		s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi, xb[2 * v + 1]));
		if ((v + 1) % chunk == 0) {
			isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16, one));
			s16 = _mm256_setzero_si256();
		}
	}
	acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), D, acc);
	if (b32_min(t))
		acc = _mm256_fmadd_ps(h8(g + at.m + 16 * h), _mm256_set1_ps(x->s), acc);
	return acc;
}

/* b32_half_avx2() of half h, its own broadcasts. */
TGT_AVX2 ALWAYS __m256 b32_seq_avx2(uint32_t t, const uint8_t *g, struct b32_at at,
				    const struct qdot_block *x, int32_t fix, int h, __m256 acc)
{
	__m256i xb[8];

	b32_xwords(x, xb);
	return b32_half_avx2(t, g, at, x, xb, fix, h, acc);
}

/* Both halves (the 16 rows) of block x, the broadcasts shared: each lane's
 * steps are b32_seq_avx2()'s, so its bits are. */
TGT_AVX2 ALWAYS void b32_both_avx2(uint32_t t, const uint8_t *g, struct b32_at at,
				   const struct qdot_block *x, int32_t fix, __m256 acc[2])
{
	__m256i xb[8];

	b32_xwords(x, xb);
	acc[0] = b32_half_avx2(t, g, at, x, xb, fix, 0, acc[0]);
	acc[1] = b32_half_avx2(t, g, at, x, xb, fix, 1, acc[1]);
}

/* A whole group's 16 rows (y[0 .. 16)) in one pass, both halves a block
 * (b32_both_avx2()). fix: b32_rows_avx2()'s fixes, made for the whole row
 * already (offset 0), or made here with offset pass by pass (a row past
 * FIX_BLOCKS blocks). */
TGT_AVX2 ALWAYS void b32_group_avx2(uint32_t t, const uint8_t *g, const struct qdot_block *x,
				    int64_t nb, int32_t *fix, int offset, float *y)
{
	const size_t pair = b32_pair(t);
	const struct b32_at a0 = b32_at(t, 0, 2), a1 = b32_at(t, 1, 2);
	__m256 acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };
	int64_t b = 0;

	for (int64_t s0 = 0; s0 < nb; s0 += FIX_BLOCKS) {
		const int64_t end = nb - s0 < FIX_BLOCKS ? nb : s0 + FIX_BLOCKS;

		if (offset)
			b32_fixes(offset, x + s0, end - s0, fix);
		for (; b + 2 <= end; b += 2) {
			const uint8_t *gp = g + (size_t)(b / 2) * pair;

			kpack_prefetch(gp, pair);
			b32_both_avx2(t, gp, a0, x + b, fix[b - s0], acc);
			b32_both_avx2(t, gp, a1, x + b + 1, fix[b + 1 - s0], acc);
		}
		if (b < end) /* the last block, alone */
			b32_both_avx2(t, g, b32_at(t, b, nb), x + b, fix[b - s0], acc);
	}
	_mm256_storeu_ps(y, acc[0]);
	_mm256_storeu_ps(y + 8, acc[1]);
}

/* Rows [j0, j1) of a packed 32-value weight on AVX2: per half group, its
 * blocks in order, in passes of FIX_BLOCKS (as B32_ROWS). */
TGT_AVX2 ALWAYS void b32_rows_avx2(uint32_t t, const uint8_t *w, const struct qdot_block *x,
				   int64_t nb, float *y, int64_t j0, int64_t j1)
{
	const size_t gb = row_share(t, nb) * KPACK_ROWS, pair = b32_pair(t);
	const struct b32_at a0 = b32_at(t, 0, 2), a1 = b32_at(t, 1, 2);
	const int offset = t == LOOM_TYPE_Q8_0 ? 0 : b32_offset(t); /* Q8_0: signs */
	const bool once = nb <= FIX_BLOCKS;
	int32_t fix[FIX_BLOCKS] = { 0 };

	if (once && offset)
		b32_fixes(offset, x, nb, fix);
	for (int64_t gi = j0 / KPACK_ROWS; gi * KPACK_ROWS < j1; gi++) {
		const uint8_t *g = w + (size_t)gi * gb;

		if (gi * KPACK_ROWS >= j0 && (gi + 1) * KPACK_ROWS <= j1) {
			b32_group_avx2(t, g, x, nb, fix, once ? 0 : offset,
				       y + gi * KPACK_ROWS - j0);
			continue;
		}
		for (int h = 0; h < 2; h++) {
			const int64_t r0 = gi * KPACK_ROWS + 8 * h;
			__m256 acc = _mm256_setzero_ps();
			int64_t lo, hi, b = 0;

			if (!rows_in(r0, j0, j1, &lo, &hi))
				continue;
			for (int64_t s0 = 0; s0 < nb; s0 += FIX_BLOCKS) {
				const int64_t end = nb - s0 < FIX_BLOCKS ? nb : s0 + FIX_BLOCKS;

				if (!once && offset)
					b32_fixes(offset, x + s0, end - s0, fix);
				for (; b + 2 <= end; b += 2) {
					const uint8_t *gp = g + (size_t)(b / 2) * pair;

					if (h == 0)
						kpack_prefetch(gp, pair);
					acc = b32_seq_avx2(t, gp, a0, x + b, fix[b - s0], h, acc);
					acc = b32_seq_avx2(t, gp, a1, x + b + 1, fix[b + 1 - s0], h,
							   acc);
				}
				if (b < end) /* the last block, alone */
					acc = b32_seq_avx2(t, g, b32_at(t, b, nb), x + b, fix[b - s0],
							   h, acc);
			}
			store_rows(acc, r0, lo, hi, j0, y);
		}
	}
}

/*
 * Many activation rows at once (kpack_kernel_m() on AVX2): each block's
 * weights are unpacked once, a nibble vector at a time, and serve up to
 * SEQ_X_256 activation rows, each row taking b32_seq_avx2()'s steps, so
 * its bits are the one-row kernel's (and the prefill GEMM's). Fixes are
 * made for SEQ_ROWS_256 rows at a time, in passes of SEQ_FIXES_256 / rows
 * blocks; between passes a row's float waits in y (exactly).
 */
#define SEQ_ROWS_256 16
#define SEQ_FIXES_256 4096
/* 4 rows: a Q4 block then holds 4 int16 sums, 4 accumulators and the two
 * nibble vectors in registers */
#define SEQ_X_256 4

/* Block b's step for X activation rows x + i * xr (fixes fix[i * fs]). */
TGT_AVX2 ALWAYS void b32_seq_avx2_x(uint32_t t, const uint8_t *g, struct b32_at at,
				    const struct qdot_block *x, int64_t xr, const int32_t *fix,
				    int64_t fs, int h, int X, __m256 *acc)
{
	const __m256i one = _mm256_set1_epi16(1);
	const __m256 d = h8(g + at.d + 16 * h);
	const int chunk = b32_q5(t) ? 2 : 4;
	__m256i isum[SEQ_X_256], s16[SEQ_X_256];

	for (int i = 0; i < X; i++) {
		isum[i] = _mm256_set1_epi32(fix[i * fs]);
		s16[i] = _mm256_setzero_si256();
	}
	if (t == LOOM_TYPE_Q8_0) {
		for (int l = 0; l < 8; l++) {
			const __m256i w = _mm256_xor_si256(half(g + at.q + 64 * l, h),
							   _mm256_set1_epi8((char)0x80));
			const __m256i aw = _mm256_abs_epi8(w);

			for (int i = 0; i < X; i++) {
				__m256i p = _mm256_maddubs_epi16(
					aw, _mm256_sign_epi8(x4(x[i * xr].q + 4 * l), w));

				isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p, one));
			}
		}
	} else {
		const __m256i fh = b32_q5(t) ? half(g + at.h, h) : _mm256_setzero_si256();

		for (int v = 0; v < 4; v++) {
			__m256i lo, hi;

			b32_values(t, g, at, h, fh, v, &lo, &hi);
			for (int i = 0; i < X; i++) {
				const int8_t *q = x[i * xr].q + 8 * v;

				s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(lo, x4(q)));
				s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(hi, x4(q + 4)));
				if ((v + 1) % chunk == 0) {
					isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(s16[i], one));
					s16[i] = _mm256_setzero_si256();
				}
			}
		}
	}
	for (int i = 0; i < X; i++) {
		const struct qdot_block *xi = x + i * xr;

		acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]),
					 _mm256_mul_ps(d, _mm256_set1_ps(xi->d)), acc[i]);
		if (b32_min(t))
			acc[i] = _mm256_fmadd_ps(h8(g + at.m + 16 * h), _mm256_set1_ps(xi->s), acc[i]);
	}
}

/* Blocks [s0, s0 + n) of half h of the group at g (nb blocks) for X rows,
 * X a constant (case by case) so the row loops unroll; `fetch`: the first
 * pass over the group, which prefetches it. */
TGT_AVX2 ALWAYS void seq_half_256(uint32_t t, const uint8_t *g, int64_t nb,
				  const struct qdot_block *x, int64_t xr, int X, int64_t s0,
				  int64_t n, const int32_t *fix, int h, bool fetch, __m256 *acc)
{
#define SEQ_HALF_X(X_)                                                                     \
	for (int64_t b = s0; b < s0 + n; b++) {                                            \
		const struct b32_at at = b32_at(t, b, nb);                                  \
                                                                                           \
		if (fetch && b % 2 == 0)                                                    \
			kpack_prefetch(g + at.d, b32_pair(t));                              \
		b32_seq_avx2_x(t, g, at, x + b, xr, fix + b - s0, n, h, X_, acc);           \
	}
	switch (X) {
	case 1: SEQ_HALF_X(1) break;
	case 2: SEQ_HALF_X(2) break;
	case 3: SEQ_HALF_X(3) break;
	default: SEQ_HALF_X(4) break;
	}
#undef SEQ_HALF_X
}

/* Rows [j0, j1) of the packed weight w against m activation rows x (x_i =
 * x + i * nb) into y + i * ys. */
TGT_AVX2 ALWAYS void seq_rows_256(uint32_t t, const uint8_t *w, const struct qdot_block *x,
				  int m, int64_t nb, float *y, int64_t ys, int64_t j0, int64_t j1)
{
	const size_t gb = row_share(t, nb) * KPACK_ROWS;
	const int offset = t == LOOM_TYPE_Q8_0 ? 0 : b32_offset(t); /* Q8_0: signs */
	int32_t fix[SEQ_FIXES_256] = { 0 };

	for (int i0 = 0; i0 < m; i0 += SEQ_ROWS_256) {
		const int mi = m - i0 < SEQ_ROWS_256 ? m - i0 : SEQ_ROWS_256;
		const int64_t per = SEQ_FIXES_256 / mi;

		for (int64_t s0 = 0; s0 < nb; s0 += per) {
			const int64_t n = nb - s0 < per ? nb - s0 : per;

			for (int i = 0; i < mi && offset; i++)
				b32_fixes(offset, x + (i0 + i) * nb + s0, n, fix + i * n);
			for (int64_t gi = j0 / KPACK_ROWS; gi * KPACK_ROWS < j1; gi++) {
				const uint8_t *g = w + (size_t)gi * gb;

				for (int h = 0; h < 2; h++) {
					const int64_t r0 = gi * KPACK_ROWS + 8 * h;
					int64_t lo, hi;

					if (!rows_in(r0, j0, j1, &lo, &hi))
						continue;
					for (int i = 0; i < mi; i += SEQ_X_256) {
						const int X = mi - i < SEQ_X_256 ? mi - i : SEQ_X_256;
						float *yi = y + (i0 + i) * ys + r0 + lo - j0;
						float lanes[8] = { 0 };
						__m256 acc[SEQ_X_256];

						for (int k = 0; k < X; k++) {
							if (s0 > 0)
								memcpy(lanes + lo, yi + k * ys,
								       (size_t)(hi - lo) * sizeof(float));
							acc[k] = _mm256_loadu_ps(lanes);
						}
						seq_half_256(t, g, nb, x + (i0 + i) * nb, nb, X, s0, n,
							     fix + i * n, h, h == 0 && i == 0, acc);
						for (int k = 0; k < X; k++) {
							_mm256_storeu_ps(lanes, acc[k]);
							memcpy(yi + k * ys, lanes + lo,
							       (size_t)(hi - lo) * sizeof(float));
						}
					}
				}
			}
		}
	}
}

#define B32_KERNEL_M(name, T)                                                              \
	TGT_AVX2 static void name(const uint8_t *w, const void *x, int m, int64_t nb, float *y, \
				  int64_t ys, int64_t j0, int64_t j1)                        \
	{                                                                                  \
		seq_rows_256(T, w, x, m, nb, y, ys, j0, j1);                               \
	}
B32_KERNEL_M(q8_0_avx2_m, LOOM_TYPE_Q8_0)
B32_KERNEL_M(q4_0_avx2_m, LOOM_TYPE_Q4_0)
B32_KERNEL_M(q4_1_avx2_m, LOOM_TYPE_Q4_1)
B32_KERNEL_M(q5_0_avx2_m, LOOM_TYPE_Q5_0)
B32_KERNEL_M(q5_1_avx2_m, LOOM_TYPE_Q5_1)

#define B32_KERNEL(attr, name, rows, T)                                                    \
	attr static void name(const uint8_t *w, const void *x, int64_t nb, float *y,         \
			      int64_t j0, int64_t j1)                                      \
	{                                                                                  \
		rows(T, w, x, nb, y, j0, j1);                                              \
	}
B32_KERNEL(TGT_AVX2, q8_0_avx2, b32_rows_avx2, LOOM_TYPE_Q8_0)
B32_KERNEL(TGT_AVX2, q4_0_avx2, b32_rows_avx2, LOOM_TYPE_Q4_0)
B32_KERNEL(TGT_AVX2, q4_1_avx2, b32_rows_avx2, LOOM_TYPE_Q4_1)
B32_KERNEL(TGT_AVX2, q5_0_avx2, b32_rows_avx2, LOOM_TYPE_Q5_0)
B32_KERNEL(TGT_AVX2, q5_1_avx2, b32_rows_avx2, LOOM_TYPE_Q5_1)
B32_KERNEL(TGT_AVXVNNI, q8_0_avxvnni, b32_rows_avxvnni, LOOM_TYPE_Q8_0)
B32_KERNEL(TGT_AVXVNNI, q4_0_avxvnni, b32_rows_avxvnni, LOOM_TYPE_Q4_0)
B32_KERNEL(TGT_AVXVNNI, q4_1_avxvnni, b32_rows_avxvnni, LOOM_TYPE_Q4_1)
B32_KERNEL(TGT_AVXVNNI, q5_0_avxvnni, b32_rows_avxvnni, LOOM_TYPE_Q5_0)
B32_KERNEL(TGT_AVXVNNI, q5_1_avxvnni, b32_rows_avxvnni, LOOM_TYPE_Q5_1)

kpack_fn kpack_kernel_256(enum qdot_isa isa, uint32_t type)
{
	const bool vnni = isa == QDOT_AVXVNNI;

	switch (type) {
	case LOOM_TYPE_Q8_0: return vnni ? q8_0_avxvnni : q8_0_avx2;
	case LOOM_TYPE_Q4_0: return vnni ? q4_0_avxvnni : q4_0_avx2;
	case LOOM_TYPE_Q4_1: return vnni ? q4_1_avxvnni : q4_1_avx2;
	case LOOM_TYPE_Q5_0: return vnni ? q5_0_avxvnni : q5_0_avx2;
	case LOOM_TYPE_Q5_1: return vnni ? q5_1_avxvnni : q5_1_avx2;
	case LOOM_TYPE_Q2_K: return vnni ? q2k_rows_avxvnni : q2k_rows_avx2;
	case LOOM_TYPE_Q3_K: return vnni ? q3k_rows_avxvnni : q3k_rows_avx2;
	case LOOM_TYPE_Q4_K: return vnni ? q4k_rows_avxvnni : q4k_rows_avx2;
	case LOOM_TYPE_Q5_K: return vnni ? q5k_rows_avxvnni : q5k_rows_avx2;
	case LOOM_TYPE_Q6_K: return vnni ? q6k_rows_avxvnni : q6k_rows_avx2;
	default: return NULL;
	}
}

kpack_mfn kpack_kernel_m_256(enum qdot_isa isa, uint32_t type)
{
	if (isa != QDOT_AVX2)
		return NULL;
	switch (type) {
	case LOOM_TYPE_Q8_0: return q8_0_avx2_m;
	case LOOM_TYPE_Q4_0: return q4_0_avx2_m;
	case LOOM_TYPE_Q4_1: return q4_1_avx2_m;
	case LOOM_TYPE_Q5_0: return q5_0_avx2_m;
	case LOOM_TYPE_Q5_1: return q5_1_avx2_m;
	case LOOM_TYPE_Q2_K: return q2k_avx2_m;
	case LOOM_TYPE_Q3_K: return q3k_avx2_m;
	case LOOM_TYPE_Q4_K: return q4k_avx2_m;
	case LOOM_TYPE_Q5_K: return q5k_avx2_m;
	case LOOM_TYPE_Q6_K: return q6k_avx2_m;
	default: return NULL;
	}
}

#endif /* __x86_64__ */
