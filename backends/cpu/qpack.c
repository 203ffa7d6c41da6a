/* The packed weight layout (qpack.h): packing and unpacking of rows. */
#include <string.h>

#include "cpu.h"
#include "qpack.h"

bool qpack_format(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_Q4_0:
	case LOOM_TYPE_Q4_1:
	case LOOM_TYPE_Q5_0:
	case LOOM_TYPE_Q5_1:
	case LOOM_TYPE_Q8_0:
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
	case LOOM_TYPE_Q8_0: return 34;
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
	return ((size_t)(nb / 16) * cb + (tail ? QPACK_HEAD(type) + tail * QPACK_QB(type) : 0) +
		63) & ~(size_t)63;
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
	uint8_t *q = p + chunk_of(t, b, nb, &i, &n) + QPACK_HEAD(t);
	bool lo, single;

	if (t == LOOM_TYPE_Q8_0) {
		for (int e = 0; e < 32; e++) {
			if (pack)
				q[32 * i + e] = g[qo + e] ^ 0x80;
			else
				((uint8_t *)g)[qo + e] = q[32 * i + e] ^ 0x80;
		}
		return;
	}
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
	struct field f[3] = { { 2 * (size_t)i, 0, 2 } };
	int nf = 1;

	if (t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_1)
		f[nf++] = (struct field){ 32 + 2 * (size_t)i, 2, 2 };
	if (is_q5(t))
		f[nf++] = (struct field){ 64 + 4 * (size_t)i, gguf_high(t), 4 };
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
