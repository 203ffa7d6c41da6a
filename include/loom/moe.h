/*
 * Routed experts (backend ABI 1.6): the routing rule every backend's moe
 * slot and the host's fallback share, as static inline helpers, so the
 * experts a row picks and their weights are the same bits everywhere
 * (like loom/kv_quant.h: optional for a backend, but the rule is this).
 *
 * LOOM_MOE_SOFTMAX, for one row of n_expert router logits l:
 *   p[e] = exp(l[e] - max l) / sum_e' exp(l[e'] - max l)   (f32, sums in
 *          expert order)
 *   e_0 = the expert of largest p, e_1 the next, ... (n_used of them; of
 *         equal p the lower expert id first)
 *   w_j = p[e_j]; with norm, w_j /= max(sum_j w_j, 2^-14) (sum in j order)
 * This is llama.cpp's softmax gating (build_moe_ffn: soft_max, top_k,
 * get_rows, and with norm_w the division by the clamped sum). For Mixtral
 * (norm on) it equals a softmax over the chosen logits alone.
 *
 * LOOM_MOE_SOFTMAX_TOPK (ABI 1.8, gpt-oss), for the same logits:
 *   e_0 .. e_{n_used-1} = the n_used largest l (ties: the lower id)
 *   w_j = exp(l[e_j] - l[e_0]) / sum_j exp(l[e_j] - l[e_0])   (f32, sum
 *         in j order; l[e_0] is the largest)
 * llama.cpp's SOFTMAX_WEIGHT gating (top_k of the logits, get_rows, then
 * soft_max over the k). A NaN logit is never chosen before a number.
 *
 * LOOM_MOE_FN lets a device compiler mark the helpers (a CUDA/HIP source
 * defines it as `static __host__ __device__ inline` first).
 */
#ifndef LOOM_MOE_H
#define LOOM_MOE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/backend_check.h"

#ifndef LOOM_MOE_FN
#define LOOM_MOE_FN static inline
#endif

/* The most experts a layer may have (llama.cpp's LLAMA_MAX_EXPERTS is
 * 512; this leaves room) and route per row. */
#define LOOM_MOE_MAX_EXPERTS 4096
#define LOOM_MOE_MAX_USED 64

/*
 * Routes one row: ids[n_used] (each in [0, n_expert), distinct when the
 * logits are finite) and w[n_used]. p is scratch of n_expert floats.
 * The caller checked 1 <= n_used <= n_expert (loom_moe_check_args).
 */
LOOM_MOE_FN void loom_moe_route(const float *logits, int64_t n_expert, int64_t n_used,
				bool norm, float *p, int32_t *ids, float *w)
{
	float mx = logits[0], sum = 0.0f;

	for (int64_t e = 1; e < n_expert; e++)
		if (logits[e] > mx)
			mx = logits[e];
	for (int64_t e = 0; e < n_expert; e++) {
		p[e] = expf(logits[e] - mx);
		sum += p[e];
	}
	for (int64_t e = 0; e < n_expert; e++)
		p[e] /= sum;
	for (int64_t j = 0; j < n_used; j++) {
		int64_t best = -1;

		/* chosen experts are marked -1 (every p is >= 0) */
		for (int64_t e = 0; e < n_expert; e++)
			if (!(p[e] < 0.0f) && (best < 0 || p[e] > p[best]))
				best = e;
		if (best < 0)
			best = 0; /* only after NaN logits: any valid id */
		ids[j] = (int32_t)best;
		w[j] = p[best];
		p[best] = -1.0f;
	}
	if (!norm)
		return;
	sum = 0.0f;
	for (int64_t j = 0; j < n_used; j++)
		sum += w[j];
	if (!(sum >= 6.103515625e-5f))
		sum = 6.103515625e-5f;
	for (int64_t j = 0; j < n_used; j++)
		w[j] /= sum;
}

/* The n_used largest logits' ids (ties: the lower id; NaN last), weighted
 * by a softmax over them (LOOM_MOE_SOFTMAX_TOPK). p: n_expert floats of
 * scratch. */
LOOM_MOE_FN void loom_moe_route_topk(const float *logits, int64_t n_expert, int64_t n_used,
				     float *p, int32_t *ids, float *w)
{
	float sum = 0.0f;

	for (int64_t e = 0; e < n_expert; e++)
		p[e] = 0.0f; /* 1: chosen */
	for (int64_t j = 0; j < n_used; j++) {
		int64_t best = -1;

		for (int64_t e = 0; e < n_expert; e++)
			if (p[e] == 0.0f && (best < 0 || logits[e] > logits[best] ||
					     (isnan(logits[best]) && !isnan(logits[e]))))
				best = e;
		ids[j] = (int32_t)best;
		p[best] = 1.0f;
	}
	for (int64_t j = 0; j < n_used; j++) {
		w[j] = expf(logits[ids[j]] - logits[ids[0]]);
		sum += w[j];
	}
	for (int64_t j = 0; j < n_used; j++)
		w[j] /= sum;
}

/* Routes one row by the call's gating rule (loom_moe_route or
 * loom_moe_route_topk). */
LOOM_MOE_FN void loom_moe_route_as(uint32_t gating, const float *logits, int64_t n_expert,
				   int64_t n_used, bool norm, float *p, int32_t *ids, float *w)
{
	if (gating == LOOM_MOE_SOFTMAX_TOPK)
		loom_moe_route_topk(logits, n_expert, n_used, p, ids, w);
	else
		loom_moe_route(logits, n_expert, n_used, norm, p, ids, w);
}

/* gpt-oss's clamped SwiGLU of one value pair (LOOM_GLU_SWIGLU_OAI): the
 * one formula every backend computes. */
LOOM_MOE_FN float loom_glu_swiglu_oai(float gate, float up)
{
	float g = gate < LOOM_GLU_OAI_LIMIT ? gate : LOOM_GLU_OAI_LIMIT;
	float u = up < -LOOM_GLU_OAI_LIMIT ? -LOOM_GLU_OAI_LIMIT :
		  up > LOOM_GLU_OAI_LIMIT ? LOOM_GLU_OAI_LIMIT : up;

	if (isnan(gate))
		g = gate;
	if (isnan(up))
		u = up;
	return g / (1.0f + expf(-LOOM_GLU_OAI_ALPHA * g)) * (u + 1.0f);
}

/* Expert e's bias row of a generation 1.8 bias array (NULL: none). */
LOOM_MOE_FN const float *loom_moe_bias(const struct loom_moe_args *a, const float *b,
				       int64_t e, int64_t n)
{
	return LOOM_MOE_BIASES(a) && b ? b + e * n : NULL;
}

/* One expert tensor's n_expert addresses, all set. */
LOOM_MOE_FN bool loom_moe_check_weights(const struct loom_moe_weights *m, int64_t n_expert)
{
	if (!m->w)
		return false;
	for (int64_t e = 0; e < n_expert; e++)
		if (!m->w[e])
			return false;
	return true;
}

/*
 * Checks a moe call's sizes and pointers; the row strides and types are
 * the expert products' to check (they are gemm's arguments).
 * LOOM_OK or LOOM_ERR_INVALID.
 */
LOOM_MOE_FN int loom_moe_check_args(const struct loom_moe_args *a)
{
	if (!a || a->struct_size < LOOM_MOE_ARGS_MIN_SIZE || a->rows < 0 ||
	    a->n_embd <= 0 || a->n_ff <= 0 || a->n_expert < 1 ||
	    a->n_expert > LOOM_MOE_MAX_EXPERTS || a->n_used < 1 || a->n_used > a->n_expert ||
	    a->n_used > LOOM_MOE_MAX_USED)
		return LOOM_ERR_INVALID;
	/* a rule or activation this header does not know: the host's
	 * fallback runs it (a later generation's) */
	if ((a->gating != LOOM_MOE_SOFTMAX && a->gating != LOOM_MOE_SOFTMAX_TOPK) ||
	    (a->glu != LOOM_GLU_SILU && a->glu != LOOM_GLU_GELU_TANH &&
	     a->glu != LOOM_GLU_SWIGLU_OAI))
		return LOOM_ERR_UNSUPPORTED;
	if (!loom_check_shape(a->rows, a->n_embd, a->x_stride) ||
	    !loom_check_shape(a->rows, a->n_embd, a->y_stride) ||
	    !loom_check_shape(a->rows, a->n_expert, a->logits_stride))
		return LOOM_ERR_INVALID;
	if (a->rows == 0)
		return LOOM_OK;
	if (!a->x || !a->y || !a->logits || !loom_moe_check_weights(&a->gate, a->n_expert) ||
	    !loom_moe_check_weights(&a->up, a->n_expert) ||
	    !loom_moe_check_weights(&a->down, a->n_expert) || a->n_ff_shared < 0)
		return LOOM_ERR_INVALID;
	if (a->n_ff_shared > 0 &&
	    (!a->shared_gate_inp || !loom_moe_check_weights(&a->shared_gate, 1) ||
	     !loom_moe_check_weights(&a->shared_up, 1) || !loom_moe_check_weights(&a->shared_down, 1)))
		return LOOM_ERR_INVALID;
	return LOOM_OK;
}

/* The shared expert's gate: 1 / (1 + exp(-s)). */
LOOM_MOE_FN float loom_moe_sigmoid(float s)
{
	return 1.0f / (1.0f + expf(-s));
}

#endif /* LOOM_MOE_H */
