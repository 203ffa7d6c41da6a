/*
 * GGUF blocks whose values are all the format's largest unsigned value u
 * (every quant bit set: 4-bit 15, 5-bit 31, Q6_K 63, Q3_K 7, Q2_K 3;
 * Q8_0 all -128) with every 6- or 4-bit scale at its largest and the f16
 * scales 1.0: against activations all +127 or all -127 they give the
 * largest byte-product sums a kernel can meet, where a kernel that adds
 * too many products in int16 overflows. Shared by the qdot tests.
 */
#ifndef LOOM_TESTS_EXTREME_W_H
#define LOOM_TESTS_EXTREME_W_H

#include <stdint.h>
#include <string.h>

#include "loom/backend.h"

/* One block of type t at b (bytes bytes). */
static inline void extreme_block(uint32_t t, uint8_t *b, size_t bytes)
{
	int f16[2] = { -1, -1 }; /* offsets of the f16 scales */

	memset(b, 0xff, bytes);
	switch (t) {
	case LOOM_TYPE_Q8_0: memset(b + 2, 0x80, 32); f16[0] = 0; break;
	case LOOM_TYPE_Q4_0: case LOOM_TYPE_Q5_0: f16[0] = 0; break;
	case LOOM_TYPE_Q4_1: case LOOM_TYPE_Q5_1: f16[0] = 0; f16[1] = 2; break;
	case LOOM_TYPE_Q2_K: f16[0] = 80; f16[1] = 82; break;
	case LOOM_TYPE_Q3_K: f16[0] = 108; break;
	case LOOM_TYPE_Q4_K: case LOOM_TYPE_Q5_K: f16[0] = 0; f16[1] = 2; break;
	case LOOM_TYPE_Q6_K: memset(b + 192, 0x7f, 16); f16[0] = 208; break;
	default: break;
	}
	for (int i = 0; i < 2; i++)
		if (f16[i] >= 0) {
			b[f16[i]] = 0x00; /* 1.0 */
			b[f16[i] + 1] = 0x3c;
		}
}

#endif
