/* Folding a strategy's input scales (loom/qstrategy.h input_scales) into
 * the RMSNorm before the tensors that read its output, for the llama-style
 * families (docs/QUANTIZATION.md, "Input scales"). A layer's q, k and v
 * read attn_norm's output; its ffn gate and up read ffn_norm's. With the
 * norm's weight g divided by s and each member's columns multiplied by s,
 * W diag(s) (x * g / s) = W (x * g): the same function. */
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
	char name[128];

	snprintf(name, sizeof(name), "blk.%ld.%s.weight", layer, what);
	return gguf_find_tensor(in, name);
}

/* A group of layer `layer`: its norm and members, if all exist and have
 * the shapes folding needs (f32 norm of the members' input width). */
static bool find_group(const struct gguf_file *in, long layer, const char *norm,
		       const char *const *members, int n, struct fold_group *g)
{
	*g = (struct fold_group){ .norm = layer_tensor(in, layer, norm) };
	if (!g->norm || g->norm->type != LOOM_TYPE_F32 || g->norm->n_dims != 1)
		return false;
	g->cols = (int64_t)g->norm->ne[0];
	for (int m = 0; m < n; m++) {
		const struct gguf_tensor *t = layer_tensor(in, layer, members[m]);

		if (!t || t->n_dims != 2 || (int64_t)t->ne[0] != g->cols)
			return false;
		g->member[g->n++] = t;
	}
	return true;
}

int quant_fold_plan(struct quant_fold *f, const struct gguf_file *in, char *err, size_t errlen)
{
	static const char *const attn[] = { "attn_q", "attn_k", "attn_v" };
	static const char *const ffn[] = { "ffn_gate", "ffn_up" };
	size_t cap = 0;

	*f = (struct quant_fold){ 0 };
	if (!arch_folds(in))
		return 0;
	for (long layer = 0; layer < 100000; layer++) {
		struct fold_group g[2];
		int found = find_group(in, layer, "attn_norm", attn, 3, &g[0]);

		found += find_group(in, layer, "ffn_norm", ffn, 2, &g[found]);
		if (!layer_tensor(in, layer, "attn_norm") && !layer_tensor(in, layer, "ffn_norm"))
			break;
		if (f->n + (size_t)found > cap) {
			struct fold_group *ng;

			cap = cap ? 2 * cap : 64;
			ng = realloc(f->g, cap * sizeof(*ng));
			if (!ng) {
				loom_seterr(err, errlen, "out of memory");
				return -1;
			}
			f->g = ng;
		}
		for (int i = 0; i < found; i++)
			f->g[f->n++] = g[i];
	}
	return 0;
}

struct fold_group *quant_fold_find(struct quant_fold *f, const struct gguf_tensor *t,
				   bool *is_norm)
{
	for (size_t i = 0; i < f->n; i++) {
		struct fold_group *g = &f->g[i];

		if (!g->n)
			continue;
		if (g->norm == t) {
			*is_norm = true;
			return g;
		}
		for (int m = 0; m < g->n; m++)
			if (g->member[m] == t) {
				*is_norm = false;
				return g;
			}
	}
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
