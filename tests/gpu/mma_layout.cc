/*
 * The emulator's int8 MMA (gpu_mma_k32, gpu_mma_k16 of gpu_port.h on
 * gpu_emu.cc) against a plain int32 matrix product.
 *
 * A wrong fragment layout cannot show in the kernels' own tests when the
 * emulator implements the same wrong idea as the kernel. So here a warp
 * loads random A, B and C into fragments by the PTX ISA's tables, written
 * out again independently of gpu_emu.cc (by register here, by element
 * there), runs the emulated instruction and stores D by the accumulator
 * table; D must equal A B + C computed plainly, element by element, and
 * every element of D must be stored by exactly one (lane, register).
 * Random bytes over the whole range (-128 .. 127), extreme matrices (all
 * -128: the largest sums) and C near INT32_MAX (the sum wraps as the
 * instruction's does without .satfinite).
 *
 * PTX ISA 9.7.14.5 (fragments, lane = 4 g + t):
 *   m16n8k32 .s8: a0..a3 row g, cols 4t..4t+3; a4..a7 row g+8, same cols;
 *     a8..a11 row g, cols 16+4t..; a12..a15 row g+8, cols 16+4t..;
 *     b0..b3 rows 4t..4t+3 of col g; b4..b7 rows 16+4t.. of col g
 *   m16n8k16 .s8: a0..a3 row g, cols 4t..; a4..a7 row g+8; b0..b3 rows 4t.. of col g
 *   c0, c1: row g, cols 2t, 2t+1; c2, c3: row g+8, cols 2t, 2t+1
 * four elements to a 32-bit register, the lowest first.
 *
 * Built with the warp-32 emulator only (the instruction is 32 lanes wide).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpu_port.h"

struct mats {
	int8_t a[16][32], b[32][8]; /* K = 16 uses a[.][0..15], b[0..15][.] */
	int32_t c[16][8];
	int32_t d[16][8];
	int stores[16][8];
};

static uint32_t pack4(int8_t e0, int8_t e1, int8_t e2, int8_t e3)
{
	return (uint32_t)(uint8_t)e0 | (uint32_t)(uint8_t)e1 << 8 | (uint32_t)(uint8_t)e2 << 16 |
	       (uint32_t)(uint8_t)e3 << 24;
}

static uint32_t a_word(const mats *m, int row, int col)
{
	return pack4(m->a[row][col], m->a[row][col + 1], m->a[row][col + 2], m->a[row][col + 3]);
}

static uint32_t b_word(const mats *m, int row, int col)
{
	return pack4(m->b[row][col], m->b[row + 1][col], m->b[row + 2][col], m->b[row + 3][col]);
}

/* One warp: fragments in by the tables above, the MMA, D out. */
static void warp_mma(mats *m, int k)
{
	const int lane = (int)threadIdx.x, g = lane / 4, t = lane % 4;
	uint32_t a[4], b[2];
	int c[4], d[4];
	const int rows[4] = { g, g, g + 8, g + 8 }, cols[4] = { 2 * t, 2 * t + 1, 2 * t, 2 * t + 1 };

	a[0] = a_word(m, g, 4 * t);
	a[1] = a_word(m, g + 8, 4 * t);
	b[0] = b_word(m, 4 * t, g);
	if (k == 32) {
		a[2] = a_word(m, g, 16 + 4 * t);
		a[3] = a_word(m, g + 8, 16 + 4 * t);
		b[1] = b_word(m, 16 + 4 * t, g);
	}
	for (int i = 0; i < 4; i++)
		c[i] = m->c[rows[i]][cols[i]];
	if (k == 32)
		gpu_mma_k32(d, a, b, c);
	else
		gpu_mma_k16(d, a, b, c);
	for (int i = 0; i < 4; i++) {
		m->d[rows[i]][cols[i]] = d[i];
		m->stores[rows[i]][cols[i]]++;
	}
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

/* kind 0: random; 1: every byte -128; 2: random with C near INT32_MAX */
static void fill(mats *m, int kind)
{
	memset(m, 0, sizeof(*m));
	for (int r = 0; r < 16; r++)
		for (int e = 0; e < 32; e++)
			m->a[r][e] = kind == 1 ? (int8_t)-128 : (int8_t)rnd();
	for (int e = 0; e < 32; e++)
		for (int col = 0; col < 8; col++)
			m->b[e][col] = kind == 1 ? (int8_t)-128 : (int8_t)rnd();
	for (int r = 0; r < 16; r++)
		for (int col = 0; col < 8; col++)
			m->c[r][col] = kind == 2 ? INT32_MAX - (int32_t)(rnd() % 1000) :
				       (int32_t)(rnd() % 200001) - 100000;
}

/* Failures of D against the plain product (K = k). */
static int check(const mats *m, int k, const char *what)
{
	int bad = 0;

	for (int r = 0; r < 16; r++)
		for (int col = 0; col < 8; col++) {
			uint32_t s = (uint32_t)m->c[r][col];

			for (int e = 0; e < k; e++)
				s += (uint32_t)((int32_t)m->a[r][e] * (int32_t)m->b[e][col]);
			if (m->stores[r][col] != 1 || m->d[r][col] != (int32_t)s) {
				if (bad++ < 4)
					printf("FAIL %s k=%d: D[%d][%d] = %d (stored %d times), "
					       "plain product %d\n", what, k, r, col, m->d[r][col],
					       m->stores[r][col], (int32_t)s);
			}
		}
	return bad;
}

int main(void)
{
	static const char *const kinds[3] = { "random", "all -128", "C near INT32_MAX" };
	int failures = 0, cases = 0;
	mats m;

	for (int k = 16; k <= 32; k += 16)
		for (int trial = 0; trial < 60; trial++) {
			const int kind = trial < 2 ? 1 + trial : 0;
			mats *p = &m;

			fill(&m, kind);
			GPU_LAUNCH(warp_mma, 1, 32, 0, (gpuStream_t)0, p, k);
			if (gpuGetLastError() != gpuSuccess) {
				printf("FAIL launch k=%d\n", k);
				return 1;
			}
			failures += check(&m, k, kinds[kind]) != 0;
			cases++;
		}
	printf("%s: %d of %d warp MMAs (m16n8k16 and m16n8k32) equal the plain product\n",
	       failures ? "FAIL" : "ok", cases - failures, cases);
	return failures ? 1 : 0;
}
