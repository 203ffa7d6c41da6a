/*
 * Checks shared by the rows-in-lanes tests of tests/backend/qdot.c (the
 * 32-value formats) and qdot_k.c (the K-quants): kpack.h's layout and
 * kernel, whatever the activation blocks are.
 */
#ifndef LOOM_TESTS_KPACK_CHECK_H
#define LOOM_TESTS_KPACK_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "kpack.h"

/* Rows of n GGUF rows w (ws bytes apart) that do not come back byte for
 * byte from the packed weight p (nb blocks a row). */
static inline int kpack_unpack_differs(uint32_t t, const uint8_t *w, size_t ws,
				       const uint8_t *p, int64_t n, int64_t nb)
{
	uint8_t *back = malloc(ws);
	int bad = 0;

	if (!back)
		abort();
	for (int64_t j = 0; j < n; j++) {
		kpack_unpack_row(t, p, nb, j, back);
		if (memcmp(back, w + j * ws, ws)) {
			printf("kpack type %u n=%lld nb=%lld: row %lld does not unpack to itself\n",
			       t, (long long)n, (long long)nb, (long long)j);
			bad++;
		}
	}
	free(back);
	return bad;
}

/*
 * The kernel fn on the packed weight p (n <= 40 rows of nb blocks) against
 * activation row x, over the whole range and 5 random ones: row j must be
 * want[j] bit for bit, and nothing outside the range may be written.
 * Returns the mismatches.
 */
static inline int kpack_ranges_differ(uint32_t t, kpack_fn fn, const uint8_t *p, const void *x,
				      int64_t n, int64_t nb, const float *want,
				      uint32_t (*rnd)(void))
{
	const float mark = -1234.5f;
	float y[40 + 2];
	int bad = 0;

	for (int rep = 0; rep < 6; rep++) {
		int64_t j0 = rep ? rnd() % n : 0, j1 = rep ? j0 + 1 + rnd() % (n - j0) : n;

		for (int i = 0; i < 42; i++)
			y[i] = mark;
		fn(p, x, nb, y + 1, j0, j1);
		for (int i = 0; i < 42; i++) { /* y[i] is row j0 - 1 + i */
			int64_t j = j0 - 1 + i;
			float w = j >= j0 && j < j1 ? want[j] : mark;

			if (memcmp(&y[i], &w, 4)) {
				printf("kpack type %u n=%lld nb=%lld rows [%lld, %lld): row %lld gives "
				       "%.9g, want %.9g\n", t, (long long)n, (long long)nb,
				       (long long)j0, (long long)j1, (long long)j, y[i], w);
				bad++;
			}
		}
	}
	return bad;
}

/* n GGUF rows w (ws bytes apart, nb blocks each) packed group by group
 * into p. */
static inline void kpack_pack_rows(uint32_t t, const uint8_t *w, size_t ws, int64_t n,
				   int64_t nb, uint8_t *p)
{
	for (int64_t g = 0; g * KPACK_ROWS < n; g++)
		kpack_group(t, w + g * KPACK_ROWS * ws, ws,
			    (int)(n - g * KPACK_ROWS < KPACK_ROWS ? n - g * KPACK_ROWS : KPACK_ROWS),
			    nb, p + g * KPACK_ROWS * kpack_row_share(t, nb));
}

/*
 * The many-row kernel fn on the packed weight p (n rows of nb blocks)
 * against m activation rows x (row i at x + i * nb blocks) over the row
 * range [j0, j1): output row i, weight row j must be want(ctx, i, j) bit
 * for bit, and nothing outside the range or the m rows (nor the slot
 * before the first) may be written. Returns the mismatches.
 */
static inline int kpack_rows_differ(uint32_t t, kpack_mfn fn, const uint8_t *p, const void *x,
				    int m, int64_t n, int64_t nb, int64_t j0, int64_t j1,
				    float (*want)(const void *ctx, int i, int64_t j),
				    const void *ctx)
{
	const float mark = -1234.5f;
	const int64_t ys = n + 3;
	float *y = malloc((size_t)(m + 1) * (size_t)ys * sizeof(float));
	int bad = 0;

	if (!y)
		abort();
	for (int64_t e = 0; e < (m + 1) * ys; e++)
		y[e] = mark;
	fn(p, x, m, nb, y + 1, ys, j0, j1); /* y[1 + i * ys + j - j0]: row i, weight row j */
	for (int i = 0; i <= m; i++)
		for (int64_t e = 0; e < ys; e++) {
			int64_t j = j0 - 1 + e;
			float w = i < m && j >= j0 && j < j1 ? want(ctx, i, j) : mark;

			if (memcmp(&y[i * ys + e], &w, 4) && bad++ < 3)
				printf("kpack rows type %u n=%lld nb=%lld m=%d [%lld, %lld): row %d, "
				       "%lld gives %.9g, want %.9g\n", t, (long long)n, (long long)nb,
				       m, (long long)j0, (long long)j1, i, (long long)j,
				       y[i * ys + e], w);
		}
	free(y);
	return bad;
}

#endif /* LOOM_TESTS_KPACK_CHECK_H */
