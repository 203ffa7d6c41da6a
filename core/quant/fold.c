/* Folding a strategy's input scales (loom/qstrategy.h input_scales) into
 * the tensor before the ones that read its output, for the llama-style
 * families (docs/QUANTIZATION.md, "Input scales"). A layer's q, k and v
 * read attn_norm's output; its ffn gate and up read ffn_norm's: with the
 * norm's weight g divided by s and each member's columns multiplied by s,
 * W diag(s) (x * g / s) = W (x * g). ffn_down reads silu(gate x) * (up x),
 * linear in up's rows: dividing row j of up by s_j folds s into it.
 * attn_output reads the heads' softmax-weighted V rows, linear in attn_v's
 * rows, when each head has its own V head (with grouped K/V heads one V
 * row serves several heads, which would need equal scales: not folded). */
#include "quant/quantize.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Families whose attn_norm / ffn_norm are plain RMSNorm weights (x * g)
 * feeding q/k/v and gate/up directly. */
static bool arch_folds(const struct gguf_file *in)
{
	static const char *const archs[] = { "llama", "mistral", "qwen2" };
	char *arch = NULL;
	bool ok = false;

	if (gguf_get_str(in, "general.architecture", &arch, NULL, 0) != 0)
		return false;
	for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
		ok = ok || !strcmp(arch, archs[i]);
	free(arch);
	return ok;
}

static const struct gguf_tensor *layer_tensor(const struct gguf_file *in, long layer,
					      const char *what)
{
	char name[160];

	snprintf(name, sizeof(name), "blk.%ld.%s.weight", layer, what);
	return gguf_find_tensor(in, name);
}

/* A group of layer `layer`: prev and members, if all exist and have the
 * shapes folding needs (prev: an f32 norm of the members' input width, or
 * a matrix with that many rows and no bias). */
static bool find_group(const struct gguf_file *in, long layer, const char *prev,
		       const char *const *members, int n, struct fold_group *g)
{
	char bias[160];

	*g = (struct fold_group){ .prev = layer_tensor(in, layer, prev) };
	if (!g->prev || g->prev->n_dims < 1 || g->prev->n_dims > 2 ||
	    (g->prev->n_dims == 1 && g->prev->type != LOOM_TYPE_F32))
		return false;
	snprintf(bias, sizeof(bias), "blk.%ld.%s.bias", layer, prev);
	if (g->prev->n_dims == 2 && gguf_find_tensor(in, bias))
		return false;
	g->cols = (int64_t)g->prev->ne[g->prev->n_dims - 1];
	for (int m = 0; m < n; m++) {
		const struct gguf_tensor *t = layer_tensor(in, layer, members[m]);

		if (!t || t->n_dims != 2 || (int64_t)t->ne[0] != g->cols)
			return false;
		g->member[g->n++] = t;
	}
	return true;
}

static bool add_group(struct quant_fold *f, const struct fold_group *g, size_t *cap)
{
	if (f->n == *cap) {
		size_t ncap = *cap ? 2 * *cap : 64;
		struct fold_group *ng = realloc(f->g, ncap * sizeof(*ng));

		if (!ng)
			return false;
		f->g = ng;
		*cap = ncap;
	}
	f->g[f->n++] = *g;
	return true;
}

int quant_fold_plan(struct quant_fold *f, const struct gguf_file *in, char *err, size_t errlen)
{
	static const struct {
		const char *prev, *members[3];
		int n;
	} kinds[] = {
		{ "attn_norm", { "attn_q", "attn_k", "attn_v" }, 3 },
		{ "ffn_norm", { "ffn_gate", "ffn_up" }, 2 },
		{ "ffn_up", { "ffn_down" }, 1 },
		{ "attn_v", { "attn_output" }, 1 },
	};
	size_t cap = 0;

	*f = (struct quant_fold){ 0 };
	if (!arch_folds(in))
		return 0;
	for (long layer = 0; layer < 100000; layer++) {
		if (!layer_tensor(in, layer, "attn_norm") && !layer_tensor(in, layer, "ffn_norm"))
			break;
		for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
			struct fold_group g;

			if (find_group(in, layer, kinds[k].prev, kinds[k].members, kinds[k].n, &g) &&
			    !add_group(f, &g, &cap)) {
				loom_seterr(err, errlen, "out of memory");
				return -1;
			}
		}
	}
	return 0;
}

struct fold_group *quant_fold_member(struct quant_fold *f, const struct gguf_tensor *t)
{
	for (size_t i = 0; i < f->n; i++)
		for (int m = 0; m < f->g[i].n; m++)
			if (f->g[i].member[m] == t)
				return &f->g[i];
	return NULL;
}

struct fold_group *quant_fold_prev(struct quant_fold *f, const struct gguf_tensor *t)
{
	for (size_t i = 0; i < f->n; i++)
		if (f->g[i].n && f->g[i].prev == t)
			return &f->g[i];
	return NULL;
}

int quant_fold_check_scales(const struct fold_group *g, char *err, size_t errlen)
{
	for (int64_t j = 0; j < g->cols; j++)
		if (!isfinite(g->scales[j]) || !(g->scales[j] > 0.0f)) {
			loom_seterr(err, errlen,
				    "tensor '%.*s': the strategy's input scale %lld is %g (must be finite and > 0)",
				    (int)g->member[0]->name.len, g->member[0]->name.ptr,
				    (long long)j, (double)g->scales[j]);
			return -1;
		}
	return 0;
}

void quant_fold_free(struct quant_fold *f)
{
	for (size_t i = 0; i < f->n; i++)
		free(f->g[i].scales);
	free(f->g);
	*f = (struct quant_fold){ 0 };
}
