/* `loom info --archs`: the architectures and tokenizer families loom reads,
 * as Markdown tables generated from the descriptors themselves (arch.c's
 * table, the tokenizer's model and pre-tokenizer tables), so a family
 * added there shows here without another edit. */
#include <stdio.h>
#include <string.h>

#include "loom.h"
#include "model/model.h"
#include "text/tokenizer.h"

/* The descriptor's per-layer tensor called name, or NULL. */
static const struct loom_arch_tensor *find_tensor(const struct loom_arch *a, const char *name)
{
	for (const struct loom_arch_tensor *t = a->tensors; t && t->name; t++)
		if (!strcmp(t->name, name))
			return t;
	return NULL;
}

/* Appends "; what" (or "what" first) to buf. */
static void add(char *buf, size_t len, const char *what)
{
	size_t n = strlen(buf);

	snprintf(buf + n, len - n, "%s%s", n ? "; " : "", what);
}

static void print_arch(FILE *out, const struct loom_arch *a)
{
	const struct loom_arch_tensor *bias = find_tensor(a, "blk.%d.attn_q.bias");
	char also[128] = "", attn[256] = "", other[320] = "", swa[96];

	for (const char *const *p = a->aliases; p && *p; p++)
		add(also, sizeof(also), *p);
	if (bias)
		add(attn, sizeof(attn), bias->optional ? "Q/K/V biases if present" : "Q/K/V biases");
	if (find_tensor(a, "blk.%d.attn_q_norm.weight"))
		add(attn, sizeof(attn), "QK-norm");
	if (a->swa_period > 0) {
		snprintf(swa, sizeof(swa), "sliding window on %d of %d layers",
			 a->swa_period - 1, a->swa_period);
		add(attn, sizeof(attn), swa);
	}
	if (a->swa == LOOM_SWA_ALL)
		add(attn, sizeof(attn), "sliding window on every layer if the file has one");
	if (a->attn_softcap > 0) {
		snprintf(swa, sizeof(swa), "score soft-cap (default %g)", a->attn_softcap);
		add(attn, sizeof(attn), swa);
	}
	if (find_tensor(a, "blk.%d.attn_qkv.weight"))
		add(attn, sizeof(attn), "fused QKV");
	if (find_tensor(a, "blk.%d.attn_output.bias"))
		add(attn, sizeof(attn), "output bias");
	if (find_tensor(a, "blk.%d.attn_sinks.weight"))
		add(attn, sizeof(attn), "attention sinks (backend ABI 1.8)");
	if (a->swa_global_rope)
		add(attn, sizeof(attn), "local layers with the global RoPE");
	if (find_tensor(a, "blk.%d.attn_qkv.weight") && find_tensor(a, "blk.%d.ffn_up.weight") &&
	    find_tensor(a, "blk.%d.ffn_up.weight")->n_parts > 0)
		add(other, sizeof(other), "fused gate+up");
	if (a->final_softcap > 0) {
		snprintf(swa, sizeof(swa), "final-logit soft-cap (default %g)", a->final_softcap);
		add(other, sizeof(other), swa);
	}
	if (a->rope_factors)
		add(other, sizeof(other), "LongRoPE factors (long ones past the original context)");
	else
		add(other, sizeof(other), a->swa == LOOM_SWA_PERIOD && !a->swa_global_rope ?
			"Llama 3.1 RoPE factors if present" :
			"Llama 3.1 RoPE factors or YaRN if present");
	if (find_tensor(a, "blk.%d.post_ffw_norm.weight"))
		add(other, sizeof(other), "norms after attention and FFN too");
	if (a->embd_scale)
		add(other, sizeof(other), "embeddings x sqrt(n_embd)");
	if (a->moe && a->moe_gating == LOOM_MOE_SOFTMAX_TOPK)
		add(other, sizeof(other), "routed experts (top-k, softmax over them; router and expert biases)");
	else if (a->moe)
		add(other, sizeof(other), a->moe_norm ? "routed experts (softmax top-k, weights normalised)" :
			"routed experts (softmax top-k)");
	if (a->shared_expert)
		add(other, sizeof(other), "shared expert with sigmoid gate");
	if (a->with_experts)
		add(other, sizeof(other), "routed experts when <arch>.expert_count > 0 (Mixtral)");
	if (a->chat_marker) {
		snprintf(swa, sizeof(swa), "chat template by `%s`", a->chat_marker);
		add(other, sizeof(other), swa);
	}
	fprintf(out, "| %s | %s | %s | %s | %s | %s |\n", a->name, also,
		a->rope_mode == LOOM_ROPE_NEOX ? "halves (NeoX)" : "adjacent pairs",
		a->glu == LOOM_GLU_GELU_TANH ? "GELU-tanh gated" :
		a->glu == LOOM_GLU_SWIGLU_OAI ? "clamped SwiGLU (gpt-oss)" : "SiLU gated", attn, other);
}

/* "a b c" as "a, b, c". */
static void print_list(FILE *out, const char *names)
{
	for (bool first = true; *names; first = false) {
		size_t w = strcspn(names, " ");

		fprintf(out, "%s%.*s", first ? "" : ", ", (int)w, names);
		names += w;
		names += strspn(names, " ");
	}
}

int loom_info_print_supported(FILE *out)
{
	const struct loom_arch *a;
	const char *name, *kind, *pre;

	fputs("Architectures (general.architecture):\n\n"
	      "| architecture | also read as | RoPE | FFN | attention | other |\n"
	      "|---|---|---|---|---|---|\n", out);
	for (size_t i = 0; (a = loom_arch_at(i)); i++)
		print_arch(out, a);
	fputs("\nTokenizers (tokenizer.ggml.model):\n\n"
	      "| tokenizer | kind |\n|---|---|\n", out);
	for (size_t i = 0; (name = loom_tokenizer_model_name(i, &kind)); i++)
		fprintf(out, "| %s | %s |\n", name, kind);
	fputs("\nPre-tokenizer families of gpt2 (tokenizer.ggml.pre; unknown values use "
	      "default):\n\n| family | tokenizer.ggml.pre values |\n|---|---|\n", out);
	for (size_t i = 0; (pre = loom_tokenizer_pre_family(i)); i++) {
		fprintf(out, "| %.*s | ", (int)strcspn(pre, " "), pre);
		print_list(out, pre);
		fputs(" |\n", out);
	}
	return ferror(out) ? -1 : 0;
}
