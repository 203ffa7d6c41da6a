/*
 * One block of a GGUF quantized format seen as a grid: element e of the
 * block can hold the values step[e] * q + base[e] for the integers q in
 * [qlo, qhi]. The strategies (awq, gptq) fit a block's grid to weights
 * with per-element importances (a weighted search of scales and, for the
 * formats with a min, offsets), then choose each element's q themselves
 * (gptq compensates the error of one column in the next ones) and pack the
 * block in GGUF's layout. Compiled into each strategy module (qgrid.c).
 *
 * Formats: q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K. The packed
 * blocks decode (the format plugin's to_float) to the grid's values up to
 * float rounding (tests/qstrategy checks it).
 */
#ifndef LOOM_QGRID_H
#define LOOM_QGRID_H

#include <stdbool.h>
#include <stdint.h>

#define QGRID_MAX 256 /* the largest block (k-quants' super-block) */

struct qgrid {
	uint32_t type;
	int n;              /* elements per block */
	int group;          /* elements per scale (sub-block) */
	int qlo, qhi;       /* the integer range of q */
	float step[QGRID_MAX], base[QGRID_MAX];
	/* What is stored: the f16 scale(s), the integer sub-block scales
	 * and mins of k-quants. */
	float d, dmin;
	int sc[16], m[16];
};

/* Elements per block of type, or 0 when qgrid does not handle it. */
int qgrid_block_elems(uint32_t type);

/* Fits g (type's grid) to the n = qgrid_block_elems(type) values x,
 * minimizing sum imp[e] (x[e] - grid value)^2; imp NULL weighs all alike.
 * Returns false for a type qgrid does not handle. */
bool qgrid_fit(struct qgrid *g, uint32_t type, const float *x, const float *imp);

/* The q nearest x on element e's grid, and its value. */
static inline int qgrid_q(const struct qgrid *g, int e, float x)
{
	float s = g->step[e], v;

	if (s == 0.0f)
		return g->qlo > 0 ? g->qlo : (g->qhi < 0 ? g->qhi : 0);
	v = (x - g->base[e]) / s;
	if (!(v > (float)g->qlo)) /* NaN too */
		return g->qlo;
	if (v >= (float)g->qhi)
		return g->qhi;
	return (int)(v < 0.0f ? v - 0.5f : v + 0.5f);
}

static inline float qgrid_value(const struct qgrid *g, int e, int q)
{
	return g->step[e] * (float)q + g->base[e];
}

/* Writes the block (GGUF layout of g->type) holding q[0..n). */
void qgrid_pack(const struct qgrid *g, const int *q, void *block);

/* Fits and packs n values (a multiple of the block) with importances
 * imp[n] (or NULL): the importance-weighted quantizer both strategies use
 * where they do nothing else. false for a type qgrid does not handle. */
bool qgrid_quantize_row(uint32_t type, const float *x, const float *imp, int64_t n,
			void *out, int block_bytes);

#endif /* LOOM_QGRID_H */
