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

/* Packed geometry: quant bytes a block (with Q5's 4 bytes of high bits),
 * and scale words a block. */
static size_t packed_quants(uint32_t t)
{
	return t == LOOM_TYPE_Q8_0 ? 32 : is_q5(t) ? 20 : 16;
}

static size_t scale_words(uint32_t t)
{
	return t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_1 ? 2 : 1;
}

size_t qpack_row_bytes(uint32_t type, int64_t nb)
{
	size_t per = packed_quants(type) + 2 * scale_words(type);

	if (nb < 0 || (uint64_t)nb > (SIZE_MAX - 64) / per)
		return 0;
	return ((size_t)nb * per + 63) & ~(size_t)63;
}

/* Element e (0..31) of a GGUF Q4 block's 16 quant bytes. */
static uint8_t nibble(const uint8_t *qs, int e)
{
	return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
}

/* Block b's elements, in the packed unit that holds them: `lo` picks the
 * low nibbles. Returns the byte offset of element 0 within the row. */
static size_t q4_place(int64_t b, int64_t nb, bool *lo)
{
	int64_t quads = nb / 4 * 4;

	if (b < quads) {
		/* blocks 4u, 4u+1 low, 4u+2, 4u+3 high; the odd one 32 bytes on */
		*lo = b % 4 < 2;
		return (size_t)(b - b % 4) * 16 + (size_t)(b % 2) * 32;
	}
	*lo = b == quads; /* the pair unit: b low, b + 1 high */
	return (size_t)quads * 16;
}

static void pack_q4(uint32_t t, const uint8_t *src, int64_t nb, uint8_t *dst)
{
	const size_t bb = gguf_block(t), qo = gguf_quants(t);
	bool single = nb % 2 == 1;

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *qs = src + (size_t)b * bb + qo;
		bool lo;
		uint8_t *u = dst + q4_place(b, nb, &lo);

		if (single && b == nb - 1) {
			memcpy(dst + (size_t)b * 16, qs, 16);
			continue;
		}
		for (int e = 0; e < 32; e++)
			u[e] |= lo ? nibble(qs, e) : (uint8_t)(nibble(qs, e) << 4);
	}
}

static void unpack_q4(uint32_t t, const uint8_t *src, int64_t nb, uint8_t *dst)
{
	const size_t bb = gguf_block(t), qo = gguf_quants(t);
	bool single = nb % 2 == 1;

	for (int64_t b = 0; b < nb; b++) {
		uint8_t *qs = dst + (size_t)b * bb + qo;
		bool lo;
		const uint8_t *u = src + q4_place(b, nb, &lo);

		if (single && b == nb - 1) {
			memcpy(qs, src + (size_t)b * 16, 16);
			continue;
		}
		for (int e = 0; e < 16; e++) {
			uint8_t a = lo ? u[e] & 15 : u[e] >> 4;
			uint8_t c = lo ? u[e + 16] & 15 : u[e + 16] >> 4;

			qs[e] = (uint8_t)(a | c << 4);
		}
	}
}

void qpack_row(uint32_t type, const uint8_t *src, int64_t nb, uint8_t *dst)
{
	const size_t bb = gguf_block(type), pq = packed_quants(type);
	uint8_t *sc = dst + (size_t)nb * pq;

	memset(dst, 0, qpack_row_bytes(type, nb));
	if (type == LOOM_TYPE_Q8_0) {
		for (int64_t b = 0; b < nb; b++)
			for (int e = 0; e < 32; e++)
				dst[b * 32 + e] = src[(size_t)b * bb + 2 + e] ^ 0x80;
	} else {
		pack_q4(type, src, nb, dst);
	}
	for (int64_t b = 0; is_q5(type) && b < nb; b++)
		memcpy(dst + (size_t)nb * 16 + 4 * (size_t)b, src + (size_t)b * bb + gguf_high(type), 4);
	for (int64_t b = 0; b < nb; b++)
		for (size_t w = 0; w < scale_words(type); w++)
			memcpy(sc + 2 * ((size_t)nb * w + (size_t)b), src + (size_t)b * bb + 2 * w, 2);
}

void qpack_unpack_row(uint32_t type, const uint8_t *src, int64_t nb, uint8_t *dst)
{
	const size_t bb = gguf_block(type), pq = packed_quants(type);
	const uint8_t *sc = src + (size_t)nb * pq;

	if (type == LOOM_TYPE_Q8_0) {
		for (int64_t b = 0; b < nb; b++)
			for (int e = 0; e < 32; e++)
				dst[(size_t)b * bb + 2 + e] = src[b * 32 + e] ^ 0x80;
	} else {
		unpack_q4(type, src, nb, dst);
	}
	for (int64_t b = 0; is_q5(type) && b < nb; b++)
		memcpy(dst + (size_t)b * bb + gguf_high(type), src + (size_t)nb * 16 + 4 * (size_t)b, 4);
	for (int64_t b = 0; b < nb; b++)
		for (size_t w = 0; w < scale_words(type); w++)
			memcpy(dst + (size_t)b * bb + 2 * w, sc + 2 * ((size_t)nb * w + (size_t)b), 2);
}
