/* The packed weight layout (qpack.h): packing and unpacking of rows. */
#include <string.h>

#include "cpu.h"
#include "qpack.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

bool qpack_format(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_Q4_0:
	case LOOM_TYPE_Q4_1:
	case LOOM_TYPE_Q5_0:
	case LOOM_TYPE_Q5_1:
		return true;
	default:
		return false;
	}
}

static bool is_q5(uint32_t t)
{
	return t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1;
}

/* GGUF geometry: block bytes, where the quants start in a block, and
 * (Q5) where its 32 high bits are. */
static size_t gguf_block(uint32_t t)
{
	switch (t) {
	case LOOM_TYPE_Q4_1: return 20;
	case LOOM_TYPE_Q5_0: return 22;
	case LOOM_TYPE_Q5_1: return 24;
	default: return 18;
	}
}

static size_t gguf_quants(uint32_t t)
{
	switch (t) {
	case LOOM_TYPE_Q4_1: return 4;
	case LOOM_TYPE_Q5_0: return 6;
	case LOOM_TYPE_Q5_1: return 8;
	default: return 2;
	}
}

static size_t gguf_high(uint32_t t)
{
	return t == LOOM_TYPE_Q5_1 ? 4 : 2;
}

size_t qpack_row_bytes(uint32_t type, int64_t nb)
{
	size_t cb = QPACK_CHUNK_BYTES(type), tail = (size_t)(nb % 16);

	if (nb < 0 || (uint64_t)nb / 16 > (SIZE_MAX - 2 * cb) / cb)
		return 0;
	return ((size_t)(nb / 16) * cb +
		(tail ? qpack_head(type, (int)tail).quants + tail * QPACK_QB(type) : 0) + 31) &
	       ~(size_t)31;
}

/* Element e (0..31) of a GGUF Q4 block's 16 quant bytes. */
static uint8_t nibble(const uint8_t *qs, int e)
{
	return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
}

/*
 * Where block i (of the n in its chunk) keeps its low 4 bits, from the
 * chunk's first quant byte, and whether in the low nibbles; single: the
 * odd last block, stored as GGUF stores it.
 */
static size_t q4_place(int i, int n, bool *lo, bool *single)
{
	int quads = n / 4 * 4;

	*single = n % 2 == 1 && i == n - 1;
	if (*single)
		return (size_t)i * 16;
	if (i < quads) {
		/* blocks 4u, 4u+1 low, 4u+2, 4u+3 high; the odd one 32 bytes on */
		*lo = i % 4 < 2;
		return (size_t)(i - i % 4) * 16 + (size_t)(i % 2) * 32;
	}
	*lo = i == quads; /* the pair unit: i low, i + 1 high */
	return (size_t)quads * 16;
}

/* Block b of a row: its chunk's offset in the row, its index there, and
 * how many blocks that chunk holds. */
static size_t chunk_of(uint32_t t, int64_t b, int64_t nb, int *i, int *n)
{
	int64_t c = b / 16;

	*i = (int)(b % 16);
	*n = (int)(nb - 16 * c < 16 ? nb - 16 * c : 16);
	return (size_t)c * QPACK_CHUNK_BYTES(t);
}

/* Block b's quants between the GGUF block g and the packed row p. */
static void move_quants(uint32_t t, uint8_t *p, const uint8_t *g, int64_t b, int64_t nb,
			bool pack)
{
	const size_t qo = gguf_quants(t);
	int i, n;
	uint8_t *q = p + chunk_of(t, b, nb, &i, &n);
	bool lo, single;

	q += qpack_head(t, n).quants;
	q += q4_place(i, n, &lo, &single);
	if (single) {
		if (pack)
			memcpy(q, g + qo, 16);
		else
			memcpy((uint8_t *)g + qo, q, 16);
		return;
	}
	if (pack) {
		for (int e = 0; e < 32; e++)
			q[e] |= lo ? nibble(g + qo, e) : (uint8_t)(nibble(g + qo, e) << 4);
		return;
	}
	for (int e = 0; e < 16; e++) {
		uint8_t a = lo ? q[e] & 15 : q[e] >> 4;
		uint8_t c = lo ? q[e + 16] & 15 : q[e + 16] >> 4;

		((uint8_t *)g)[qo + e] = (uint8_t)(a | c << 4);
	}
}

/* A header field: its offset in the chunk header and in the GGUF block. */
struct field {
	size_t packed, gguf, len;
};

/* Block b's header fields (scale, minimum, Q5's high bits) between the
 * GGUF block g and the packed row p. */
static void move_head(uint32_t t, uint8_t *p, uint8_t *g, int64_t b, int64_t nb, bool pack)
{
	int i, n;
	uint8_t *h = p + chunk_of(t, b, nb, &i, &n);
	struct qpack_at at = qpack_head(t, n);
	struct field f[3] = { { 2 * (size_t)i, 0, 2 } };
	int nf = 1;

	if (t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_1)
		f[nf++] = (struct field){ at.min + 2 * (size_t)i, 2, 2 };
	if (is_q5(t))
		f[nf++] = (struct field){ at.high + 4 * (size_t)i, gguf_high(t), 4 };
	for (int k = 0; k < nf; k++) {
		if (pack)
			memcpy(h + f[k].packed, g + f[k].gguf, f[k].len);
		else
			memcpy(g + f[k].gguf, h + f[k].packed, f[k].len);
	}
}

void qpack_row(uint32_t type, const uint8_t *src, int64_t nb, uint8_t *dst)
{
	const size_t bb = gguf_block(type);

	memset(dst, 0, qpack_row_bytes(type, nb));
	for (int64_t b = 0; b < nb; b++) {
		move_head(type, dst, (uint8_t *)src + (size_t)b * bb, b, nb, true);
		move_quants(type, dst, src + (size_t)b * bb, b, nb, true);
	}
}

void qpack_unpack_row(uint32_t type, const uint8_t *src, int64_t nb, uint8_t *dst)
{
	const size_t bb = gguf_block(type);

	for (int64_t b = 0; b < nb; b++) {
		move_head(type, (uint8_t *)src, dst + (size_t)b * bb, b, nb, false);
		move_quants(type, (uint8_t *)src, dst + (size_t)b * bb, b, nb, false);
	}
}

#if defined(__x86_64__)
/* Block i's 32 values as unsigned bytes with AVX2: q its quant bytes
 * (where q4_place() puts them), qh its fifth bits, add the zero offset. */
__attribute__((target("avx2"))) static void nibbles_u8_avx2(const uint8_t *q, bool lo,
							    bool single, uint32_t qh, uint8_t add,
							    uint8_t u[32])
{
	__m256i v;

	if (single) { /* GGUF order: element j low, j + 16 high */
		__m128i b = _mm_loadu_si128((const __m128i *)q);

		v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
	} else {
		v = _mm256_loadu_si256((const __m256i *)q);
		if (!lo)
			v = _mm256_srli_epi16(v, 4);
	}
	v = _mm256_and_si256(v, _mm256_set1_epi8(15));
	if (qh) { /* bit e of qh to byte e's bit 4 */
		const __m256i pick = _mm256_set1_epi64x((long long)0x8040201008040201ull);
		__m256i bits = _mm256_shuffle_epi8(
			_mm256_set1_epi32((int)qh),
			_mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll,
					   0x0303030303030303ll));

		bits = _mm256_cmpeq_epi8(_mm256_and_si256(bits, pick), pick);
		v = _mm256_or_si256(v, _mm256_and_si256(bits, _mm256_set1_epi8(16)));
	}
	_mm256_storeu_si256((__m256i *)u, _mm256_add_epi8(v, _mm256_set1_epi8((char)add)));
}
#endif

/* The same, with AVX2 where `avx2` says the CPU has it, else in plain C. */
static void nibbles_u8(bool avx2, const uint8_t *q, bool lo, bool single, uint32_t qh,
		       uint8_t add, uint8_t u[32])
{
	(void)avx2; /* other architectures */
#if defined(__x86_64__)
	if (avx2) {
		nibbles_u8_avx2(q, lo, single, qh, add, u);
		return;
	}
#endif
	for (int e = 0; e < 32; e++) {
		uint8_t b = single ? (e < 16 ? q[e] & 15 : q[e - 16] >> 4) :
				     lo ? q[e] & 15 : q[e] >> 4;

		u[e] = (uint8_t)((b | ((qh >> e) & 1) << 4) + add);
	}
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) static void heads_f16c(const uint8_t *h, size_t min,
							   bool minima, float d[16], float m[16])
{
	for (int i = 0; i < 16; i += 8) {
		_mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 2 * i))));
		_mm256_storeu_ps(m + i, minima ? _mm256_cvtph_ps(_mm_loadu_si128(
							 (const __m128i *)(h + min + 2 * i))) :
						 _mm256_setzero_ps());
	}
}
#endif

/* A chunk header's n scales and (minima) n minima, at min, as floats. */
static void heads_f32(const uint8_t *h, size_t min, bool minima, int n, float d[16],
		      float m[16])
{
#if defined(__x86_64__)
	if (n == 16 && __builtin_cpu_supports("f16c")) {
		heads_f16c(h, min, minima, d, m);
		return;
	}
#endif
	for (int i = 0; i < n; i++) {
		d[i] = cpu_fp16_to_f32((uint16_t)(h[2 * i] | h[2 * i + 1] << 8));
		m[i] = minima ? cpu_fp16_to_f32((uint16_t)(h[min + 2 * i] | h[min + 2 * i + 1] << 8)) :
				0.0f;
	}
}

int qpack_chunk_u8(uint32_t type, const uint8_t *p, int64_t c, int64_t nb, uint8_t u[16][32],
		   float d[16], float m[16])
{
	int i, n;
	const uint8_t *h = p + chunk_of(type, 16 * c, nb, &i, &n);
	const struct qpack_at at = qpack_head(type, n);
	const uint8_t *q = h + at.quants;
	const uint8_t add = type == LOOM_TYPE_Q4_0 ? 120 : type == LOOM_TYPE_Q5_0 ? 112 : 0;
	const bool minima = type == LOOM_TYPE_Q4_1 || type == LOOM_TYPE_Q5_1;
#if defined(__x86_64__)
	const bool avx2 = __builtin_cpu_supports("avx2"); /* once a chunk, not a block */
#else
	const bool avx2 = false;
#endif

	heads_f32(h, at.min, minima, n, d, m);
	for (i = 0; i < n; i++) {
		uint32_t qh = 0;
		bool lo = true, single = false;
		size_t place;

		if (is_q5(type))
			memcpy(&qh, h + at.high + 4 * i, 4);
		place = q4_place(i, n, &lo, &single);
		nibbles_u8(avx2, q + place, lo, single, qh, add, u[i]);
	}
	return n;
}
