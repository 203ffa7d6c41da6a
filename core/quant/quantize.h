/* `loom quantize` internals: which type each tensor gets (mix.c) and the
 * strategy plugin kind (strategy.c). The driver is quantize.c; the public
 * entry is loom_quantize() in loom.h. */
#ifndef LOOM_QUANT_QUANTIZE_H
#define LOOM_QUANT_QUANTIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "loom/qstrategy.h"

/* What the user asked for: a plain format ("q4_0": every quantizable
 * tensor gets it) or one of llama.cpp's named mixes ("Q4_K_M": per-tensor
 * rules on top of a default type). */
struct quant_target {
	const char *name;
	uint32_t ftype;  /* llama_ftype, written as general.file_type */
	uint32_t type;   /* the default ggml type */
	bool mix;        /* the per-tensor rules apply */
};

/* 0, or -1 with err listing the accepted names. */
int quant_target_parse(const char *s, struct quant_target *t, char *err, size_t errlen);

/* What the rules read from the model, gathered once (quant_rules_init). */
struct quant_rules {
	const struct quant_target *target;
	bool tied;          /* no output.weight: token_embd is the output too */
	bool falcon;
	bool has_imatrix;
	int n_layer, n_attn_v, n_gqa, n_expert;
	int i_attn_v, i_ffn_down; /* counters, advanced in tensor order */
};

/* 0, or -1 with err naming a malformed metadata key. */
int quant_rules_init(struct quant_rules *r, const struct quant_target *t,
		     const struct gguf_file *f, char *err, size_t errlen);
/* The type tensor t gets; call once per tensor, in llama.cpp's order
 * (by layer, then name: the counters of the rules depend on it). *wanted
 * gets the rules' choice before the fallback for rows that do not divide
 * into its blocks. */
uint32_t quant_tensor_type(struct quant_rules *r, const struct gguf_tensor *t,
			   uint32_t *wanted);

/* Loads a strategy by name ("rtn", "rtn.so") or path through the plugin
 * loader; path gets the file (cap bytes). NULL with err. */
const struct loom_qstrategy *quant_strategy_open(const char *name, char *path, size_t cap,
						  char *err, size_t errlen);

/* Input scales (fold.c): a group of tensors reading one input, whose
 * scales a strategy with input_scales chooses, and the tensor before that
 * input takes 1/s: an RMSNorm weight (q/k/v after attn_norm, gate/up after
 * ffn_norm) or the rows of a matrix whose output is the input (ffn_up
 * before ffn_down; attn_v before attn_output when every head has its own
 * K/V head). */
struct fold_group {
	const struct gguf_tensor *prev;  /* takes 1/s: a norm (1-D) or rows (2-D) */
	const struct gguf_tensor *member[3];
	int n;           /* members; 0: the group was dropped */
	int64_t cols;
	float *scales;   /* [cols], NULL until chosen */
};

struct quant_fold {
	struct fold_group *g;
	size_t n;
};

/* The groups of a llama / mistral / qwen2 file (none for other families).
 * 0, or -1 with err. */
int quant_fold_plan(struct quant_fold *f, const struct gguf_file *in, char *err, size_t errlen);
/* The live group t is a member of, or the one it is the prev of; NULL if none. */
struct fold_group *quant_fold_member(struct quant_fold *f, const struct gguf_tensor *t);
struct fold_group *quant_fold_prev(struct quant_fold *f, const struct gguf_tensor *t);
/* 0, or -1 with err when a scale is not finite and positive. */
int quant_fold_check_scales(const struct fold_group *g, char *err, size_t errlen);
void quant_fold_free(struct quant_fold *f);

#endif /* LOOM_QUANT_QUANTIZE_H */
