/* The architecture descriptors: one table per model family (see arch.h);
 * archs[] below is the one list of them.
 *
 * Tensor and key names are llama.cpp's GGUF names. Families differ in:
 *   llama, mistral: RoPE on adjacent pairs (the converter permutes Q/K),
 *                   SiLU-gated FFN, attention biases if the file has them;
 *                   Llama 3.1's RoPE scaling comes as rope_freqs.weight
 *                   (per-dimension divisors the converter computes);
 *                   a window key (<arch>.attention.sliding_window, which
 *                   llama.cpp's converter never writes) makes every layer
 *                   local, as in Mistral 7B v0.1;
 *   qwen2:          RoPE on halves (NeoX), Q/K/V biases;
 *   qwen3:          RoPE on halves, per-head QK-norm, no biases;
 *   phi3:           RoPE on halves, fused Q/K/V (attn_qkv) and fused
 *                   gate/up (ffn_up, 2 * n_ff rows, gate first), LongRoPE's
 *                   factors as the divisors: rope_factors_long when the
 *                   context used exceeds the file's original context,
 *                   rope_factors_short otherwise (llama.cpp's rule);
 *   gemma2:         RoPE on halves, GELU(tanh)-gated FFN, embeddings
 *                   scaled by sqrt(n_embd), norms after attention and FFN
 *                   as well as before, attention and final-logit
 *                   soft-capping (50, 30), every other layer local
 *                   (window 4096) starting with layer 0;
 *   gemma3:         as gemma2 without soft-capping, plus per-head QK-norm,
 *                   and five local (RoPE base 10000) layers per global one.
 * Mixture of experts (the FFN routed per token to n_used of n_expert
 * experts, docs/MOE.md):
 *   llama + experts (Mixtral): llama with llama.expert_count > 0: the
 *                   router ffn_gate_inp and the 3-D ffn_{gate,up,down}_exps
 *                   instead of the dense FFN, experts n_ff wide, weights
 *                   normalised;
 *   qwen3moe:       qwen3's attention, routed experts sized
 *                   qwen3moe.expert_feed_forward_length, normalised;
 *   qwen2moe:       qwen2's attention (biases), routed experts (weights
 *                   not normalised) plus a shared expert
 *                   (ffn_{gate,up,down}_shexp) scaled by
 *                   sigmoid(x . ffn_gate_inp_shexp);
 *   gpt-oss:        RoPE on halves (YaRN scaling from the file), biases on
 *                   Q/K/V and the output projection, a learned attention
 *                   sink per head (attn_sinks), every other layer local
 *                   (layer 0 first; window gpt-oss.attention.sliding_window,
 *                   required) with the global RoPE; the FFN norm is named
 *                   post_attention_norm; a router with a bias, experts
 *                   with biases (ffn_{gate,up,down}_exps.bias), the n_used
 *                   largest router logits chosen and weighted by a softmax
 *                   over them, and the clamped SwiGLU (LOOM_GLU_SWIGLU_OAI).
 */
#include <stdio.h>
#include <string.h>

#include "model/model.h"

/* A per-layer tensor: GGUF name, struct loom_layer member, [rows][cols]. */
#define TENSOR(nm, member, r, c, opt) \
	{ .name = "blk.%d." nm, .slot = offsetof(struct loom_layer, member), \
	  .rows = LOOM_DIM_##r, .cols = LOOM_DIM_##c, .optional = opt }
#define END { .name = NULL }
/* A routed-expert tensor: n_expert matrices [r][c] (struct loom_experts). */
#define EXPERTS(nm, member, r, c) \
	{ .name = "blk.%d." nm, .slot = offsetof(struct loom_layer, member), \
	  .rows = LOOM_DIM_##r, .cols = LOOM_DIM_##c, .experts = true }
/* A fused tensor of 2 or 3 row blocks: members and their row counts. */
#define FUSED2(nm, m0, r0, m1, r1, c) \
	{ .name = "blk.%d." nm, .cols = LOOM_DIM_##c, .n_parts = 2, \
	  .part_slots = { offsetof(struct loom_layer, m0), offsetof(struct loom_layer, m1) }, \
	  .part_rows = { LOOM_DIM_##r0, LOOM_DIM_##r1 } }
#define FUSED3(nm, m0, r0, m1, r1, m2, r2, c) \
	{ .name = "blk.%d." nm, .cols = LOOM_DIM_##c, .n_parts = 3, \
	  .part_slots = { offsetof(struct loom_layer, m0), offsetof(struct loom_layer, m1), \
			  offsetof(struct loom_layer, m2) }, \
	  .part_rows = { LOOM_DIM_##r0, LOOM_DIM_##r1, LOOM_DIM_##r2 } }

/* The tensors every family here shares, in file order. */
#define ATTN_TENSORS \
	TENSOR("attn_norm.weight", attn_norm, 1, EMBD, false), \
	TENSOR("attn_q.weight", wq, Q, EMBD, false), \
	TENSOR("attn_k.weight", wk, KV, EMBD, false), \
	TENSOR("attn_v.weight", wv, KV, EMBD, false), \
	TENSOR("attn_output.weight", wo, EMBD, Q, false)

#define FFN_TENSORS \
	TENSOR("ffn_norm.weight", ffn_norm, 1, EMBD, false), \
	TENSOR("ffn_gate.weight", w_gate, FF, EMBD, false), \
	TENSOR("ffn_up.weight", w_up, FF, EMBD, false), \
	TENSOR("ffn_down.weight", w_down, EMBD, FF, false)

#define QKV_BIASES(opt) \
	TENSOR("attn_q.bias", bq, 1, Q, opt), \
	TENSOR("attn_k.bias", bk, 1, KV, opt), \
	TENSOR("attn_v.bias", bv, 1, KV, opt)

static const struct loom_arch_tensor llama_tensors[] = {
	ATTN_TENSORS, QKV_BIASES(true), FFN_TENSORS, END,
};

static const struct loom_arch_tensor qwen2_tensors[] = {
	ATTN_TENSORS, QKV_BIASES(false), FFN_TENSORS, END,
};

#define QK_NORMS \
	TENSOR("attn_q_norm.weight", q_norm, 1, HEAD, false), \
	TENSOR("attn_k_norm.weight", k_norm, 1, HEAD, false)

static const struct loom_arch_tensor qwen3_tensors[] = {
	ATTN_TENSORS, QK_NORMS, FFN_TENSORS, END,
};

/* The routed FFN: norm, router, experts (llama.cpp's file order). */
#define MOE_TENSORS \
	TENSOR("ffn_norm.weight", ffn_norm, 1, EMBD, false), \
	TENSOR("ffn_gate_inp.weight", ffn_gate_inp, EXPERT, EMBD, false), \
	EXPERTS("ffn_gate_exps.weight", gate_exps, FF_EXP, EMBD), \
	EXPERTS("ffn_down_exps.weight", down_exps, EMBD, FF_EXP), \
	EXPERTS("ffn_up_exps.weight", up_exps, FF_EXP, EMBD)

static const struct loom_arch_tensor mixtral_tensors[] = {
	ATTN_TENSORS, QKV_BIASES(true), MOE_TENSORS, END,
};

static const struct loom_arch_tensor qwen3moe_tensors[] = {
	ATTN_TENSORS, QK_NORMS, MOE_TENSORS, END,
};

static const struct loom_arch_tensor qwen2moe_tensors[] = {
	ATTN_TENSORS, QKV_BIASES(false), MOE_TENSORS,
	TENSOR("ffn_gate_inp_shexp.weight", gate_inp_shexp, 1, EMBD, false),
	TENSOR("ffn_gate_shexp.weight", w_gate, FF_SHEXP, EMBD, false),
	TENSOR("ffn_down_shexp.weight", w_down, EMBD, FF_SHEXP, false),
	TENSOR("ffn_up_shexp.weight", w_up, FF_SHEXP, EMBD, false),
	END,
};

/* A [rows][cols] f32 table added by rows (expert biases). */
#define TABLE(nm, member, r, c) \
	{ .name = "blk.%d." nm, .slot = offsetof(struct loom_layer, member), \
	  .rows = LOOM_DIM_##r, .cols = LOOM_DIM_##c, .table = true }

static const struct loom_arch_tensor gptoss_tensors[] = {
	ATTN_TENSORS, QKV_BIASES(false),
	TENSOR("attn_output.bias", bo, 1, EMBD, false),
	TENSOR("attn_sinks.weight", sinks, 1, HEADS, false),
	TENSOR("post_attention_norm.weight", ffn_norm, 1, EMBD, false),
	TENSOR("ffn_gate_inp.weight", ffn_gate_inp, EXPERT, EMBD, false),
	TENSOR("ffn_gate_inp.bias", router_b, 1, EXPERT, false),
	EXPERTS("ffn_gate_exps.weight", gate_exps, FF_EXP, EMBD),
	EXPERTS("ffn_down_exps.weight", down_exps, EMBD, FF_EXP),
	EXPERTS("ffn_up_exps.weight", up_exps, FF_EXP, EMBD),
	TABLE("ffn_gate_exps.bias", gate_exps_b, EXPERT, FF_EXP),
	TABLE("ffn_down_exps.bias", down_exps_b, EXPERT, EMBD),
	TABLE("ffn_up_exps.bias", up_exps_b, EXPERT, FF_EXP),
	END,
};

static const struct loom_arch_tensor phi3_tensors[] = {
	TENSOR("attn_norm.weight", attn_norm, 1, EMBD, false),
	FUSED3("attn_qkv.weight", wq, Q, wk, KV, wv, KV, EMBD),
	TENSOR("attn_output.weight", wo, EMBD, Q, false),
	TENSOR("ffn_norm.weight", ffn_norm, 1, EMBD, false),
	FUSED2("ffn_up.weight", w_gate, FF, w_up, FF, EMBD),
	TENSOR("ffn_down.weight", w_down, EMBD, FF, false),
	END,
};

static const struct loom_arch_tensor gemma2_tensors[] = {
	ATTN_TENSORS,
	TENSOR("post_attention_norm.weight", post_attn_norm, 1, EMBD, false),
	FFN_TENSORS,
	TENSOR("post_ffw_norm.weight", post_ffn_norm, 1, EMBD, false),
	END,
};

static const struct loom_arch_tensor gemma3_tensors[] = {
	ATTN_TENSORS,
	QK_NORMS,
	TENSOR("post_attention_norm.weight", post_attn_norm, 1, EMBD, false),
	FFN_TENSORS,
	TENSOR("post_ffw_norm.weight", post_ffn_norm, 1, EMBD, false),
	END,
};

/* llama with llama.expert_count > 0; not looked up by name */
static const struct loom_arch arch_mixtral = {
	.name = "llama",
	.aliases = (const char *const[]){ "mistral", NULL },
	.tensors = mixtral_tensors,
	.rope_mode = LOOM_ROPE_NORM,
	.glu = LOOM_GLU_SILU,
	.swa = LOOM_SWA_ALL,
	.moe = true,
	.moe_norm = true,
};

static const struct loom_arch arch_llama = {
	.name = "llama",
	.aliases = (const char *const[]){ "mistral", NULL },
	.tensors = llama_tensors,
	.rope_mode = LOOM_ROPE_NORM,
	.glu = LOOM_GLU_SILU,
	.swa = LOOM_SWA_ALL,
	.with_experts = &arch_mixtral,
};

static const struct loom_arch arch_qwen3moe = {
	.name = "qwen3moe",
	.tensors = qwen3moe_tensors,
	.rope_mode = LOOM_ROPE_NEOX,
	.glu = LOOM_GLU_SILU,
	.moe = true,
	.expert_ff_key = true,
	.moe_norm = true,
};

static const struct loom_arch arch_qwen2moe = {
	.name = "qwen2moe",
	.tensors = qwen2moe_tensors,
	.rope_mode = LOOM_ROPE_NEOX,
	.glu = LOOM_GLU_SILU,
	.moe = true,
	.expert_ff_key = true,
	.shared_expert = true,
};

static const struct loom_arch arch_gptoss = {
	.name = "gpt-oss",
	.tensors = gptoss_tensors,
	.rope_mode = LOOM_ROPE_NEOX,
	.glu = LOOM_GLU_SWIGLU_OAI,
	.swa = LOOM_SWA_PERIOD,
	.swa_period = 2,
	.swa_window = -1, /* gpt-oss.attention.sliding_window is required */
	.swa_global_rope = true,
	.moe = true,
	.expert_ff_key = true,
	.moe_gating = LOOM_MOE_SOFTMAX_TOPK,
	.chat_marker = "<|start|>",
};

static const struct loom_arch arch_qwen2 = {
	.name = "qwen2",
	.tensors = qwen2_tensors,
	.rope_mode = LOOM_ROPE_NEOX,
	.glu = LOOM_GLU_SILU,
};

static const struct loom_arch arch_qwen3 = {
	.name = "qwen3",
	.tensors = qwen3_tensors,
	.rope_mode = LOOM_ROPE_NEOX,
	.glu = LOOM_GLU_SILU,
};

static const struct loom_arch arch_phi3 = {
	.name = "phi3",
	.tensors = phi3_tensors,
	.rope_mode = LOOM_ROPE_NEOX,
	.glu = LOOM_GLU_SILU,
	/* phi3.attention.sliding_window is ignored, as llama.cpp does: the
	 * converter's value is not what the models were trained with */
	.rope_factors = "rope_factors_short.weight",
	.rope_factors_long = "rope_factors_long.weight",
};

static const struct loom_arch arch_gemma2 = {
	.name = "gemma2",
	.tensors = gemma2_tensors,
	.rope_mode = LOOM_ROPE_NEOX,
	.glu = LOOM_GLU_GELU_TANH,
	.embd_scale = true,
	.swa = LOOM_SWA_PERIOD,
	.swa_period = 2,
	.swa_window = 4096,
	.attn_softcap = 50.0f,
	.final_softcap = 30.0f,
	.attn_scale_embd_layers = 46,
	.chat_marker = "<start_of_turn>",
};

static const struct loom_arch arch_gemma3 = {
	.name = "gemma3",
	.tensors = gemma3_tensors,
	.rope_mode = LOOM_ROPE_NEOX,
	.glu = LOOM_GLU_GELU_TANH,
	.embd_scale = true,
	.swa = LOOM_SWA_PERIOD,
	.swa_period = 6,
	.swa_rope_base = 10000.0f,
	.attn_scale_embd_layers = 62,
	.chat_marker = "<start_of_turn>",
};

static const struct loom_arch *const archs[] = {
	&arch_llama, &arch_qwen2, &arch_qwen3, &arch_phi3, &arch_gemma2, &arch_gemma3,
	&arch_qwen3moe, &arch_qwen2moe, &arch_gptoss,
};

#define N_ARCHS (sizeof(archs) / sizeof(archs[0]))

static bool arch_matches(const struct loom_arch *a, const char *name)
{
	if (strcmp(a->name, name) == 0)
		return true;
	for (const char *const *p = a->aliases; p && *p; p++)
		if (strcmp(*p, name) == 0)
			return true;
	return false;
}

const struct loom_arch *loom_arch_find(const char *name)
{
	for (size_t i = 0; i < N_ARCHS; i++)
		if (arch_matches(archs[i], name))
			return archs[i];
	return NULL;
}

void loom_arch_names(char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < N_ARCHS && n < len; i++) {
		const struct loom_arch *a = archs[i];

		n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "", a->name);
		for (const char *const *p = a->aliases; p && *p && n < len; p++)
			n += (size_t)snprintf(buf + n, len - n, ", %s", *p);
	}
}

const struct loom_arch *loom_arch_at(size_t i)
{
	return i < N_ARCHS ? archs[i] : NULL;
}
