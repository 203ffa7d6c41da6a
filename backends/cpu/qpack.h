/*
 * The cpu backend's own weight layout (ABI 1.2 weight_pack), for the fast
 * mode's AVX-512 VNNI kernels. A packed row holds what a GGUF row holds,
 * rearranged so that the kernel loads each operand whole and reads the row
 * front to back (as the hardware prefetcher expects):
 *
 * For Q4_0, Q4_1, Q5_0 and Q5_1 (Q8_0 and the K-quants have kpack.h's
 * rows-in-lanes layout instead):
 *
 * chunks of 16 blocks (the last may hold fewer), each a header then quants.
 *   header  for a chunk of n blocks (qpack_head()): their f16 scale words
 *           at 0; (Q4_1, Q5_1) their f16 minimum words at 2n; (Q5_0, Q5_1)
 *           then their 32 high bits, 4 bytes a block (bit e for element e,
 *           as the file has them, so a pair's are the 64-bit byte mask of
 *           the pair operand). Nothing else: a packed row is its GGUF
 *           row's size but for the padding at its end (a 576-wide Q5_0 row,
 *           18 blocks: 416 bytes for 396; with 64-byte headers and rows it
 *           was 544, and decode streams every byte).
 *   quants  Q4_0, Q4_1, Q5_0, Q5_1 (their low 4 bits): 16 bytes a block.
 *           Blocks 4u .. 4u+3 in 64 bytes: byte i's low nibble is element
 *           i % 32 of block 4u + i / 32, its high nibble element i % 32 of
 *           block 4u + 2 + i / 32, so one load and two masks give two
 *           block pairs. In a chunk of n blocks, if n % 4 >= 2, the two
 *           blocks after the quads share 32 bytes (byte i: element i of the
 *           first low, of the second high); if n is odd, the last block's 16
 *           bytes are as GGUF stores them.
 *
 * A full chunk's header is a multiple of 32 bytes (32, 64, 96 or 128) and
 * rows are padded to a multiple of 32 bytes, so in a 32-byte aligned row
 * every 256-bit half of a full chunk's quad load is aligned. The
 * scales keep their f16 bits, so a packed weight gives exactly the
 * products of the GGUF one (tests/backend/qdot.c).
 */
#ifndef LOOM_CPU_QPACK_H
#define LOOM_CPU_QPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"

/* Header bytes of a full chunk (qpack_head(t, 16).quants), quant bytes a
 * block and bytes of a full chunk of type t. */
#define QPACK_HEAD(t)                                                                    \
	((t) == LOOM_TYPE_Q5_1 ? 128u : (t) == LOOM_TYPE_Q5_0 ? 96u : (t) == LOOM_TYPE_Q4_1 ? 64u \
												: 32u)
#define QPACK_QB(t) 16u
#define QPACK_CHUNK_BYTES(t) (QPACK_HEAD(t) + 16u * QPACK_QB(t))

/* Where a chunk of n blocks (16, or fewer for a row's last) keeps its
 * minima, high bits and quants, in bytes from the chunk's start. */
struct qpack_at {
	uint32_t min, high, quants;
};

static inline struct qpack_at qpack_head(uint32_t t, int n)
{
	const bool q5 = t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1;
	const bool mins = t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_1;
	const uint32_t high = (uint32_t)(mins ? 4 * n : 2 * n);

	return (struct qpack_at){ (uint32_t)(2 * n), high, high + (q5 ? 4u * (uint32_t)n : 0u) };
}

/* Formats with a packed layout. */
bool qpack_format(uint32_t type);
/* Bytes of one packed row of nb blocks (a multiple of 32); 0 on overflow. */
size_t qpack_row_bytes(uint32_t type, int64_t nb);
/* One GGUF row of nb blocks into its packed row (qpack_row_bytes bytes;
 * the padding is zeroed). */
void qpack_row(uint32_t type, const uint8_t *src, int64_t nb, uint8_t *dst);
/* A packed row back to its GGUF row, byte for byte. */
void qpack_unpack_row(uint32_t type, const uint8_t *src, int64_t nb, uint8_t *dst);

/* Chunk c (blocks 16c ..) of packed row p of nb blocks as the prefill GEMM
 * reads blocks (qgemm.h): u[i][e] = q[e] + 128 for the signed formats,
 * q[e] for the offset ones; d[i] the scale, m[i] the minimum (0 if none).
 * Returns how many blocks the chunk holds. */
int qpack_chunk_u8(uint32_t type, const uint8_t *p, int64_t c, int64_t nb, uint8_t u[16][32],
		   float d[16], float m[16]);

#endif /* LOOM_CPU_QPACK_H */
