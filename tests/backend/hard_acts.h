/*
 * Activations that probe a quantizer's edge cases, shared by the qdot
 * tests: about one value in `one_in` becomes a zero, a tie at a .5 step
 * of 127 levels, a huge or a tiny value, and (when nonfinite) a NaN or an
 * infinity. rnd is the test's own generator, so each test keeps its
 * sequence.
 */
#ifndef LOOM_TESTS_HARD_ACTS_H
#define LOOM_TESTS_HARD_ACTS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

static inline void hard_acts(float *x, int64_t n, uint32_t one_in, bool nonfinite,
			     uint32_t (*rnd)(void))
{
	for (int64_t i = 0; i < n; i++) {
		uint32_t r = rnd() % one_in;

		if (r == 0)
			x[i] = 0.0f;
		else if (r == 1)
			x[i] = 127.5f / 127.0f * (float)(int)(rnd() % 200 - 100) / 100.0f;
		else if (r == 2)
			x[i] *= 1e30f;
		else if (r == 3)
			x[i] *= 1e-30f;
		else if (r == 4 && nonfinite)
			x[i] = rnd() % 2 ? NAN : INFINITY;
	}
}

#endif
