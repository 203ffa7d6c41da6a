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

#endif /* LOOM_QUANT_QUANTIZE_H */
