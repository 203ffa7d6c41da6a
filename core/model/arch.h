/* Architecture descriptors (internal): what one model family is, in one
 * table, so that the loader (model.c), the graph builder (graph.c) and the
 * executor (exec.c) hold no per-family code. Adding a family is adding a
 * descriptor to arch.c.
 */
#ifndef LOOM_ARCH_H
#define LOOM_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"

/* A dimension of a weight, in terms of the hyperparameters. */
enum loom_dim {
	LOOM_DIM_1,    /* a vector: the weight has one row */
	LOOM_DIM_EMBD, /* n_embd */
	LOOM_DIM_Q,    /* n_head * head_dim */
	LOOM_DIM_KV,   /* n_head_kv * head_dim */
	LOOM_DIM_FF,   /* n_ff */
	LOOM_DIM_HEAD, /* head_dim (per-head norms) */
	LOOM_DIM_EXPERT, /* n_expert (the router's rows) */
	LOOM_DIM_FF_EXP, /* n_ff_exp, one routed expert's FFN size */
	LOOM_DIM_FF_SHEXP, /* n_ff_shexp, the shared expert's */
	LOOM_DIM_HEADS,  /* n_head (attention sinks, one per query head) */
};

#define LOOM_ARCH_MAX_PARTS 3

/* One per-layer tensor: its GGUF name (a format taking the layer index),
 * the struct loom_layer member it fills, and its shape [rows][cols]
 * (GGUF ne[0] = cols). Matrices with rows > 1 run through gemm.
 *
 * A fused tensor (n_parts > 0; slot and rows unused) is n_parts weights
 * stacked by rows, as Phi-3's attn_qkv (Q, K, V) and ffn_up (gate, up):
 * part i fills member part_slots[i] with the next part_rows[i] rows. Each
 * part is loaded as a weight of its own, its rows read by offset (under
 * --tp only the rank's rows of each part), so the graph sees ordinary
 * separate weights. */
struct loom_arch_tensor {
	const char *name;
	size_t slot; /* offsetof(struct loom_layer, member) */
	enum loom_dim rows, cols;
	bool optional;
	/* routed experts: a 3-D tensor (GGUF [cols, rows, n_expert]) of
	 * n_expert matrices [rows][cols]; slot is a struct loom_experts,
	 * each expert loaded as a weight of its own */
	bool experts;
	/* a [rows][cols] f32 table the graph adds by rows (gpt-oss's expert
	 * biases, GGUF [cols, rows]), not a gemm weight */
	bool table;
	int n_parts;
	size_t part_slots[LOOM_ARCH_MAX_PARTS];
	enum loom_dim part_rows[LOOM_ARCH_MAX_PARTS];
};

/* Which layers a sliding window (when there is one) applies to. */
enum loom_swa_layers {
	LOOM_SWA_NONE,    /* none: the family ignores window keys */
	LOOM_SWA_PERIOD,  /* layer i is local unless (i + 1) % period == 0 */
	LOOM_SWA_ALL,     /* every layer (Mistral 7B v0.1) */
};

/*
 * A family. The graph applies a weight wherever the layer has it (biases,
 * QK-norm, the post-attention and post-FFN norms), so the tensor table
 * decides those; the rest is here. Norm weights are used as stored: for
 * Gemma, whose norms compute x * (1 + w), llama.cpp's converter already
 * wrote 1 + w into the GGUF.
 *
 * Sliding window: with swa != LOOM_SWA_NONE and a window (the file's
 * <arch>.attention.sliding_window, else swa_window), the layers swa picks
 * are local: they attend to the window only and, for LOOM_SWA_PERIOD, take
 * RoPE base swa_rope_base and no RoPE scaling.
 * <arch>.attention.sliding_window_pattern (u32) overrides swa_period,
 * <arch>.rope.freq_base_swa the local base.
 *
 * Soft-capping (Gemma 2): scores = c * tanh(scores / c) in attention,
 * logits likewise, c from <arch>.attn_logit_softcapping and
 * <arch>.final_logit_softcapping, attn_softcap / final_softcap when the
 * file has none (0: off).
 *
 * Attention scale: <arch>.attention.scale, else head_dim^-0.5, except
 * with n_layer == attn_scale_embd_layers: (n_embd / n_head)^-0.5 (Gemma
 * 27B's query_pre_attn_scalar, which GGUF does not record; llama.cpp
 * tells that size by its layer count the same way).
 */
struct loom_arch {
	const char *name;             /* general.architecture */
	const char *const *aliases;   /* other names of the same family, NULL-ended */
	const struct loom_arch_tensor *tensors; /* per layer, ended by a NULL name */
	enum loom_rope_mode rope_mode;
	enum loom_glu_kind glu;       /* FFN activation: act(gate) * up */
	bool embd_scale;              /* x = embd * sqrt(n_embd) after the lookup */
	enum loom_swa_layers swa;
	int32_t swa_period;           /* LOOM_SWA_PERIOD */
	int32_t swa_window;           /* window when the file has none, 0: none */
	float swa_rope_base;          /* local layers' RoPE base, 0: the global one */
	float attn_softcap;           /* defaults, 0: none */
	float final_softcap;
	int32_t attn_scale_embd_layers;
	/* per-dimension RoPE frequency divisors ([n_rot / 2] f32, optional);
	 * NULL: "rope_freqs.weight" (Llama 3.1's, written by the converter) */
	const char *rope_factors;
	/* LongRoPE: the divisors for a context above the file's
	 * <arch>.rope.scaling.original_context_length (NULL: rope_factors
	 * whatever the context) */
	const char *rope_factors_long;
	const char *chat_marker;      /* chat template family when the file has none */
	/* Mixture of experts: <arch>.expert_count and .expert_used_count
	 * are required (moe), or turn the family into with_experts when the
	 * file has a non-zero expert_count (llama -> Mixtral). An expert's
	 * FFN size is <arch>.expert_feed_forward_length (required when
	 * expert_ff_key), else feed_forward_length; the shared expert's
	 * <arch>.expert_shared_feed_forward_length (shared_expert). The
	 * router's chosen weights are normalised per
	 * <arch>.expert_weights_norm, moe_norm when the file has no such key
	 * (llama.cpp: true for Mixtral and Qwen3-MoE, false for Qwen2-MoE). */
	bool moe;
	const struct loom_arch *with_experts;
	bool expert_ff_key;
	bool shared_expert;
	bool moe_norm;
	uint32_t moe_gating;          /* enum loom_moe_gating */
	/* the local layers of a LOOM_SWA_PERIOD family take the global RoPE
	 * (base and scaling), unless <arch>.rope.freq_base_swa says a base
	 * (gpt-oss) */
	bool swa_global_rope;
};

/* The descriptor for a general.architecture value, or NULL. */
const struct loom_arch *loom_arch_find(const char *name);
/* "llama, mistral, ..." into buf, for messages. */
void loom_arch_names(char *buf, size_t len);
/* The i-th descriptor, NULL past the end (for `loom info --archs`). */
const struct loom_arch *loom_arch_at(size_t i);

#endif /* LOOM_ARCH_H */
