/*
 * The cpu backend's own weight layout (ABI 1.2 weight_pack), for the fast
 * mode's AVX-512 VNNI kernels. A packed row holds what a GGUF row holds,
 * rearranged so the kernel loads each operand whole:
 *
 *   quants  Q4_0, Q4_1, Q5_0, Q5_1 (their low 4 bits): 16 bytes a block. Blocks 4u .. 4u+3 in 64 bytes:
 *             byte i's low nibble is element i % 32 of block 4u + i / 32,
 *             its high nibble element i % 32 of block 4u + 2 + i / 32, so
 *             one load and two masks give two block pairs. Then, if
 *             nb % 4 >= 2, the next two blocks b, b+1 in 32 bytes (byte
 *             i: element i of b low, of b+1 high); then, if nb is odd,
 *             the last block's 16 bytes as GGUF stores them.
 *           Q8_0: 32 bytes a block, each q + 128 (the unsigned operand).
 *   high    Q5_0, Q5_1: after the quants, every block's 32 high bits as
 *           the file stores them (bit e for element e), so two blocks'
 *           are the 64-bit byte mask of a pair operand.
 *   scales  then the f16 scale word of every block, then (Q4_1, Q5_1)
 *           every block's f16 minimum word, as stored in the file.
 *
 * Block b's quants start at byte 16 * b (Q8_0: 32 * b). Rows are padded to
 * a multiple of 64 bytes, so in a 64-byte aligned buffer every row's quants
 * start on a cache line. The scales keep their f16 bits, so a packed
 * weight gives exactly the products of the GGUF one (tests/backend/qdot.c).
 */
#ifndef LOOM_CPU_QPACK_H
#define LOOM_CPU_QPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Formats with a packed layout. */
bool qpack_format(uint32_t type);
/* Bytes of one packed row of nb blocks (a multiple of 64); 0 on overflow. */
size_t qpack_row_bytes(uint32_t type, int64_t nb);
/* One GGUF row of nb blocks into its packed row (qpack_row_bytes bytes;
 * the padding is zeroed). */
void qpack_row(uint32_t type, const uint8_t *src, int64_t nb, uint8_t *dst);
/* A packed row back to its GGUF row, byte for byte. */
void qpack_unpack_row(uint32_t type, const uint8_t *src, int64_t nb, uint8_t *dst);

#endif /* LOOM_CPU_QPACK_H */
