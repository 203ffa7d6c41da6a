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
};

/* One per-layer tensor: its GGUF name (a format taking the layer index),
 * the struct loom_layer member it fills, and its shape [rows][cols]
 * (GGUF ne[0] = cols). Matrices with rows > 1 run through gemm. */
struct loom_arch_tensor {
	const char *name;
	size_t slot; /* offsetof(struct loom_layer, member) */
	enum loom_dim rows, cols;
	bool optional;
};

/*
 * A family. The graph applies a weight wherever the layer has it (biases,
 * QK-norm, the post-attention and post-FFN norms), so the tensor table
 * decides those; the rest is here. Norm weights are used as stored: for
 * Gemma, whose norms compute x * (1 + w), llama.cpp's converter already
 * wrote 1 + w into the GGUF.
 *
 * Sliding window: with swa_period > 0 and a window in the file
 * (<arch>.attention.sliding_window), layer i is local (attends to the
 * window only, RoPE base swa_rope_base, no RoPE scaling) unless
 * (i + 1) % period == 0; <arch>.attention.sliding_window_pattern (u32)
 * overrides the period, <arch>.rope.freq_base_swa the local base.
 */
struct loom_arch {
	const char *name;             /* general.architecture */
	const char *const *aliases;   /* other names of the same family, NULL-ended */
	const struct loom_arch_tensor *tensors; /* per layer, ended by a NULL name */
	enum loom_rope_mode rope_mode;
	enum loom_glu_kind glu;       /* FFN activation: act(gate) * up */
	bool embd_scale;              /* x = embd * sqrt(n_embd) after the lookup */
	int32_t swa_period;           /* 0: no sliding window */
	float swa_rope_base;          /* local layers' RoPE base, 0: the global one */
	const char *chat_marker;      /* chat template family when the file has none */
};

/* The descriptor for a general.architecture value, or NULL. */
const struct loom_arch *loom_arch_find(const char *name);
/* "llama, mistral, ..." into buf, for messages. */
void loom_arch_names(char *buf, size_t len);
/* The i-th descriptor, NULL past the end (for `loom info --archs`). */
const struct loom_arch *loom_arch_at(size_t i);

#endif /* LOOM_ARCH_H */
