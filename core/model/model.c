/* Model loading: hyperparameters and weights from GGUF onto a backend. */
#include "model/model.h"
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/graph.h"
#include "dist/dist.h"
#include "loom/moe.h"

/* Reads "<arch>.<suffix>" as an integer; `def` < 0 means required. */
static int get_arch_int(const struct gguf_file *f, const char *arch,
			const char *suffix, int64_t def, int64_t *out,
			char *err, size_t errlen)
{
	char key[128];
	uint32_t v;
	int rc;

	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	rc = gguf_get_u32(f, key, &v, err, errlen);
	if (rc < 0)
		return -1;
	if (rc == 1) {
		if (def < 0) {
			loom_seterr(err, errlen, "missing key '%s'", key);
			return -1;
		}
		*out = def;
		return 0;
	}
	*out = v;
	return 0;
}

static int get_arch_float(const struct gguf_file *f, const char *arch,
			  const char *suffix, float def, float *out,
			  char *err, size_t errlen)
{
	char key[128];
	int rc;

	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	rc = gguf_get_f32(f, key, out, err, errlen);
	if (rc == 1)
		*out = def;
	return rc < 0 ? -1 : 0;
}

/*
 * YaRN's keys (llama.cpp's names): the original context (default the
 * trained one) and the ramp's beta_fast / beta_slow (default 32 and 1).
 */
static int read_yarn(const struct gguf_file *f, struct loom_hparams *hp, float factor,
		     char *err, size_t errlen)
{
	const char *a = hp->arch_name;

	if (!(factor >= 1.0f && factor <= 1024.0f)) {
		loom_seterr(err, errlen, "key '%s.rope.scaling.factor': %g is not a YaRN factor (1 to 1024)",
			    a, factor);
		return -1;
	}
	if (hp->arch->swa == LOOM_SWA_PERIOD && !hp->arch->swa_global_rope) {
		/* the divisors apply to every layer; these local layers have no scaling */
		loom_seterr(err, errlen, "key '%s.rope.scaling.type': YaRN on %s, whose local layers take no RoPE scaling, is not supported",
			    a, a);
		return -1;
	}
	hp->yarn_factor = factor;
	if (get_arch_int(f, a, "rope.scaling.original_context_length", hp->n_ctx_train,
			 &hp->yarn_orig_ctx, err, errlen) ||
	    get_arch_float(f, a, "rope.scaling.yarn_beta_fast", 32.0f, &hp->yarn_beta_fast,
			   err, errlen) ||
	    get_arch_float(f, a, "rope.scaling.yarn_beta_slow", 1.0f, &hp->yarn_beta_slow,
			   err, errlen))
		return -1;
	if (hp->yarn_orig_ctx < 1 || !(hp->yarn_beta_fast > 0.0f) ||
	    !(hp->yarn_beta_slow > 0.0f) || isinf(hp->yarn_beta_fast) ||
	    isinf(hp->yarn_beta_slow)) {
		loom_seterr(err, errlen, "key '%s.rope.scaling.*': YaRN's original context %lld, beta_fast %g and beta_slow %g must be positive",
			    a, (long long)hp->yarn_orig_ctx, hp->yarn_beta_fast,
			    hp->yarn_beta_slow);
		return -1;
	}
	return 0;
}

/*
 * RoPE scaling: linear (positions / factor) or YaRN (read_yarn,
 * yarn_factors) from <arch>.rope.scaling.*. Llama 3.1's scaling needs no
 * key: llama.cpp's converter writes it as per-dimension divisors
 * (rope_freqs.weight), which plan_all loads.
 */
static int read_rope_scaling(const struct gguf_file *f, struct loom_hparams *hp,
			     char *err, size_t errlen)
{
	char key[128], *type = NULL;
	float factor = 1.0f;
	int rc;

	snprintf(key, sizeof(key), "%s.rope.scaling.type", hp->arch_name);
	rc = gguf_get_str(f, key, &type, err, errlen);
	if (rc < 0)
		return -1;
	if (get_arch_float(f, hp->arch_name, "rope.scaling.factor", 1.0f, &factor,
			   err, errlen))
		goto out_fail;
	hp->rope_scale = 1.0f;
	if (rc == 0 && strcmp(type, "yarn") == 0) {
		rc = read_yarn(f, hp, factor, err, errlen);
		free(type);
		return rc;
	}
	if (rc == 0 && strcmp(type, "none") != 0 && strcmp(type, "linear") != 0) {
		loom_seterr(err, errlen, "key '%s': rope scaling '%s' is not supported yet",
			key, type);
		goto out_fail;
	}
	if ((rc == 1 || strcmp(type, "linear") == 0) && factor > 0.0f && factor != 1.0f)
		hp->rope_scale = 1.0f / factor;
	free(type);
	return 0;
out_fail:
	free(type);
	return -1;
}

static int read_arch(const struct gguf_file *f, struct loom_hparams *hp,
		     char *err, size_t errlen)
{
	char *arch = NULL, names[256];

	if (gguf_get_str(f, "general.architecture", &arch, err, errlen)) {
		if (!arch)
			loom_seterr(err, errlen, "missing key 'general.architecture'");
		return -1;
	}
	snprintf(hp->arch_name, sizeof(hp->arch_name), "%s", arch);
	free(arch);
	hp->arch = loom_arch_find(hp->arch_name);
	if (!hp->arch) {
		loom_arch_names(names, sizeof(names));
		loom_seterr(err, errlen, "architecture '%s' is not supported (%s)",
			hp->arch_name, names);
		return -1;
	}
	return 0;
}

/*
 * RoPE's attention factor (<arch>.rope.scaling.attn_factor, Phi-3
 * LongRoPE's sqrt(1 + ln(s) / ln(original context))): llama.cpp's rope
 * multiplies the rotated q and k by it, so q.k grows by its square, which
 * the attention scale takes when every dimension is rotated.
 */
static int read_rope_attn_factor(const struct gguf_file *f, struct loom_hparams *hp,
				 char *err, size_t errlen)
{
	float af = 1.0f;

	if (get_arch_float(f, hp->arch_name, "rope.scaling.attn_factor", 1.0f, &af, err, errlen))
		return -1;
	if (af == 1.0f)
		return 0;
	if (!(af > 0.0f && af < 100.0f) || hp->n_rot != hp->head_dim) {
		loom_seterr(err, errlen, "key '%s.rope.scaling.attn_factor': %g with %lld of %lld dimensions rotated is not supported",
			hp->arch_name, af, (long long)hp->n_rot, (long long)hp->head_dim);
		return -1;
	}
	hp->attn_scale *= af * af;
	return 0;
}

/*
 * YaRN's magnitude: llama.cpp's rope_yarn multiplies cos and sin by
 * 1 + 0.1 ln(factor) (OpenAI's gpt-oss reference calls it the
 * concentration), so q.k grows by its square, which the attention scale
 * takes when every dimension is rotated.
 */
static int fold_yarn_mscale(struct loom_hparams *hp, char *err, size_t errlen)
{
	float ms;

	if (hp->yarn_factor <= 1.0f)
		return 0;
	if (hp->n_rot != hp->head_dim) {
		loom_seterr(err, errlen, "key '%s.rope.scaling.type': YaRN with %lld of %lld dimensions rotated is not supported",
			    hp->arch_name, (long long)hp->n_rot, (long long)hp->head_dim);
		return -1;
	}
	ms = 1.0f + 0.1f * logf(hp->yarn_factor);
	hp->attn_scale *= ms * ms;
	return 0;
}

/* A soft-cap: the file's value or the family's default; 0 turns it off. */
static int read_softcap(const struct gguf_file *f, const struct loom_hparams *hp,
			const char *suffix, float def, float *out, char *err, size_t errlen)
{
	if (get_arch_float(f, hp->arch_name, suffix, def, out, err, errlen))
		return -1;
	if (!(*out >= 0.0f) || isinf(*out)) {
		loom_seterr(err, errlen, "key '%s.%s': %g is not a soft-cap", hp->arch_name,
			suffix, *out);
		return -1;
	}
	return 0;
}

/* Attention scale, soft-capping and the local layers' window. */
static int read_attention(const struct gguf_file *f, struct loom_hparams *hp,
			  char *err, size_t errlen)
{
	const struct loom_arch *arch = hp->arch;
	const char *a = hp->arch_name;
	float dim = (float)hp->head_dim;
	int64_t window = 0;

	if (arch->attn_scale_embd_layers && hp->n_layer == arch->attn_scale_embd_layers)
		dim = (float)(hp->n_embd / hp->n_head);
	if (get_arch_float(f, a, "attention.scale", 1.0f / sqrtf(dim), &hp->attn_scale,
			   err, errlen) ||
	    read_rope_attn_factor(f, hp, err, errlen) || fold_yarn_mscale(hp, err, errlen) ||
	    read_softcap(f, hp, "attn_logit_softcapping", arch->attn_softcap,
			 &hp->attn_softcap, err, errlen) ||
	    read_softcap(f, hp, "final_logit_softcapping", arch->final_softcap,
			 &hp->final_softcap, err, errlen) ||
	    (arch->swa != LOOM_SWA_NONE &&
	     get_arch_int(f, a, "attention.sliding_window", arch->swa_window, &window, err,
			  errlen)) ||
	    (arch->rope_factors_long &&
	     get_arch_int(f, a, "rope.scaling.original_context_length", 0, &hp->rope_orig_ctx,
			  err, errlen)))
		return -1;
	if (window > INT32_MAX) {
		loom_seterr(err, errlen, "key '%s.attention.sliding_window': %lld is too large",
			a, (long long)window);
		return -1;
	}
	hp->window = (int32_t)window;
	return 0;
}

/* Layer count, width and feed-forward size: each named by its own key
 * when it is not positive (a file with block_count 0 has no layers, which
 * is not a head-geometry problem). */
static int check_sizes(const char *a, const struct loom_hparams *hp, char *err, size_t errlen)
{
	const char *key = hp->n_layer <= 0 ? "block_count" :
			  hp->n_embd <= 0 ? "embedding_length" :
			  hp->n_ff <= 0 ? "feed_forward_length" : NULL;
	long long v = hp->n_layer <= 0 ? (long long)hp->n_layer :
		      hp->n_embd <= 0 ? (long long)hp->n_embd : (long long)hp->n_ff;

	if (!key)
		return 0;
	loom_seterr(err, errlen, "key '%s.%s' is %lld; it must be at least 1", a, key, v);
	return -1;
}

/* "<arch>.<suffix>" must lie in [lo, hi]. */
static int check_range(const char *a, const char *suffix, int64_t v, int64_t lo, int64_t hi,
		       char *err, size_t errlen)
{
	if (v >= lo && v <= hi)
		return 0;
	loom_seterr(err, errlen, "key '%s.%s' is %lld; it must be %lld to %lld", a, suffix,
		    (long long)v, (long long)lo, (long long)hi);
	return -1;
}

/*
 * Mixture-of-experts hyperparameters (struct loom_arch): a family with
 * experts requires expert_count and expert_used_count; llama becomes
 * Mixtral when its expert_count is non-zero.
 */
static int read_moe(const struct gguf_file *f, struct loom_hparams *hp, char *err, size_t errlen)
{
	const char *a = hp->arch_name;
	const struct loom_arch *arch = hp->arch;
	char key[128];
	int64_t n = 0;
	bool norm;

	if (arch->with_experts) {
		if (get_arch_int(f, a, "expert_count", 0, &n, err, errlen))
			return -1;
		if (n > 0)
			hp->arch = arch = arch->with_experts;
	}
	if (!arch->moe)
		return 0;
	if (get_arch_int(f, a, "expert_count", -1, &hp->n_expert, err, errlen) ||
	    check_range(a, "expert_count", hp->n_expert, 1, LOOM_MOE_MAX_EXPERTS, err, errlen) ||
	    get_arch_int(f, a, "expert_used_count", -1, &hp->n_expert_used, err, errlen) ||
	    check_range(a, "expert_used_count", hp->n_expert_used, 1,
			hp->n_expert < LOOM_MOE_MAX_USED ? hp->n_expert : LOOM_MOE_MAX_USED,
			err, errlen))
		return -1;
	hp->n_ff_exp = hp->n_ff; /* Mixtral: the experts are the dense FFN's size */
	if (arch->expert_ff_key &&
	    (get_arch_int(f, a, "expert_feed_forward_length", -1, &hp->n_ff_exp, err, errlen) ||
	     check_range(a, "expert_feed_forward_length", hp->n_ff_exp, 1, INT32_MAX, err, errlen)))
		return -1;
	if (arch->shared_expert &&
	    (get_arch_int(f, a, "expert_shared_feed_forward_length", -1, &hp->n_ff_shexp, err,
			  errlen) ||
	     check_range(a, "expert_shared_feed_forward_length", hp->n_ff_shexp, 1, INT32_MAX,
			 err, errlen)))
		return -1;
	snprintf(key, sizeof(key), "%s.expert_weights_norm", a);
	norm = arch->moe_norm;
	if (gguf_get_bool(f, key, &norm, err, errlen) < 0)
		return -1;
	hp->expert_norm = norm;
	return 0;
}

static int read_hparams(const struct gguf_file *f, struct loom_hparams *hp,
			char *err, size_t errlen)
{
	const struct gguf_kv *tokens;
	const char *a;

	if (read_arch(f, hp, err, errlen))
		return -1;
	a = hp->arch_name;
	if (get_arch_int(f, a, "context_length", 4096, &hp->n_ctx_train, err, errlen) ||
	    get_arch_int(f, a, "embedding_length", -1, &hp->n_embd, err, errlen) ||
	    get_arch_int(f, a, "block_count", -1, &hp->n_layer, err, errlen) ||
	    get_arch_int(f, a, "feed_forward_length", -1, &hp->n_ff, err, errlen) ||
	    get_arch_int(f, a, "attention.head_count", -1, &hp->n_head, err, errlen) ||
	    get_arch_int(f, a, "attention.head_count_kv", hp->n_head, &hp->n_head_kv, err, errlen))
		return -1;
	if (check_sizes(a, hp, err, errlen) || read_moe(f, hp, err, errlen))
		return -1;
	if (hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv ||
	    hp->n_embd % hp->n_head) {
		loom_seterr(err, errlen, "bad head geometry: %lld heads, %lld KV heads, embedding %lld",
			(long long)hp->n_head, (long long)hp->n_head_kv, (long long)hp->n_embd);
		return -1;
	}
	if (get_arch_int(f, a, "attention.key_length", hp->n_embd / hp->n_head,
			 &hp->head_dim, err, errlen) ||
	    get_arch_int(f, a, "rope.dimension_count", hp->head_dim, &hp->n_rot, err, errlen) ||
	    get_arch_float(f, a, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->norm_eps, err, errlen) ||
	    get_arch_float(f, a, "rope.freq_base", 10000.0f, &hp->rope_base, err, errlen) ||
	    read_rope_scaling(f, hp, err, errlen))
		return -1;
	if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 ||
	    hp->head_dim > 1024) {
		loom_seterr(err, errlen, "bad RoPE geometry: %lld rotated dims of head size %lld",
			(long long)hp->n_rot, (long long)hp->head_dim);
		return -1;
	}
	if (read_attention(f, hp, err, errlen) ||
	    gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &tokens, err, errlen))
		return -1;
	hp->n_vocab = (int64_t)tokens->arr_n;
	return 0;
}

/*
 * Each layer's attention kind: global layers take the file's RoPE (base
 * and scaling) and see the whole context; with a sliding window, the
 * family's rule makes some or all local (see struct loom_arch). A
 * periodic family's local layers have their own RoPE base and no scaling;
 * where every layer is local (Mistral) RoPE stays the file's.
 */
static int set_layer_kinds(const struct gguf_file *f, struct loom_model *m,
			   char *err, size_t errlen)
{
	const struct loom_hparams *hp = &m->hp;
	const struct loom_arch *arch = hp->arch;
	int64_t period = arch->swa_period;
	float local_base = arch->swa_rope_base > 0.0f ? arch->swa_rope_base : hp->rope_base;

	bool periodic = arch->swa == LOOM_SWA_PERIOD;

	if (hp->window > 0 && periodic &&
	    (get_arch_int(f, hp->arch_name, "attention.sliding_window_pattern", period,
			  &period, err, errlen) ||
	     get_arch_float(f, hp->arch_name, "rope.freq_base_swa", local_base,
			    &local_base, err, errlen)))
		return -1;
	for (int64_t i = 0; i < hp->n_layer; i++) {
		struct loom_layer *L = &m->layers[i];
		bool local = hp->window > 0 &&
			(arch->swa == LOOM_SWA_ALL || (periodic && period > 0 && (i + 1) % period != 0));

		bool own = local && periodic && !arch->swa_global_rope;

		L->rope_base = local && periodic ? local_base : hp->rope_base;
		L->rope_scale = own ? 1.0f : hp->rope_scale;
		L->window = local ? hp->window : 0;
	}
	return 0;
}

/* ---- weights ---- */

struct weight_plan {
	struct loom_weight *w;
	const struct gguf_tensor *t;
	bool dequant; /* convert to f32 at load (no native kernel) */
	bool gemm_only; /* read by gemm and nothing else: the backend may pack it */
	bool tied;      /* the token table that is also the output head (ABI 1.5) */
	bool packed;  /* packed by the backend: nothing to upload */
	bool expert;  /* one routed expert's matrix */
	size_t offset, bytes;
	/* what this rank reads of the file: the whole tensor, or its shard
	 * (a run of rows, or of a vector's values) */
	const void *src;
	size_t src_bytes;
	void *owned; /* src when it is a copy (a column shard), freed after load */
};

struct loader {
	const struct gguf_file *f;
	struct loom_model *m;
	int32_t n_ctx; /* the context asked for (loom_model_params) */
	/* the shard of the next planned tensor: rows (values of a vector)
	 * slice_lo .. slice_lo + slice_n - 1; slice_n 0: the whole tensor */
	int64_t slice_lo, slice_n;
	bool slice_cols; /* the slice is of columns (every row's), not rows */
	int64_t cols_row_lo, cols_row_n; /* a column slice's rows (0, 0: all) */
	struct weight_plan *plan;
	int n_plan, cap_plan;
	size_t total;
	char *err;
	size_t errlen;
};

static const struct gguf_tensor *find_tensor(const struct gguf_file *f,
					     const char *fmt, int layer)
{
	char name[128];

	snprintf(name, sizeof(name), fmt, layer);
	return gguf_find_tensor(f, name);
}

/* Narrows plan p to the loader's slice: rows slice_lo.. of a matrix (whole
 * rows, so whole quantized blocks), or values of a vector (which must be
 * of a plain type). Only these bytes of the mapped file are read. */
static int take_slice(struct loader *l, struct weight_plan *p, const char *name,
		      int64_t *rows, int64_t *cols, bool vector)
{
	int64_t lo = l->slice_lo, n = l->slice_n, full = vector ? *cols : *rows;
	size_t unit;

	if (lo < 0 || n <= 0 || lo + n > full) {
		loom_seterr(l->err, l->errlen, "tensor '%s': shard %lld+%lld outside its %lld %s",
			    name, (long long)lo, (long long)n, (long long)full,
			    vector ? "values" : "rows");
		return -1;
	}
	if (vector) {
		const struct loom_quant_format *fmt = loom_format_get(p->t->type);

		if (fmt->block_elems != 1) {
			loom_seterr(l->err, l->errlen, "tensor '%s': a %s vector cannot be split between tensor ranks",
				    name, gguf_type_name(p->t->type));
			return -1;
		}
		unit = fmt->block_bytes;
		*cols = n;
	} else {
		unit = p->t->nbytes / (size_t)full;
		*rows = n;
	}
	p->src = (const char *)p->t->data + (size_t)lo * unit;
	p->src_bytes = (size_t)n * unit;
	return 0;
}

/* Narrows plan p to columns slice_lo.. of every row, copied together
 * (a row-parallel shard); the slice starts and ends on block boundaries. */
static int take_cols(struct loader *l, struct weight_plan *p, const char *name, int64_t *rows,
		     int64_t *cols)
{
	const struct loom_quant_format *fmt = loom_format_get(p->t->type);
	int64_t lo = l->slice_lo, n = l->slice_n, be = fmt->block_elems;
	int64_t r0 = l->cols_row_lo, nr = l->cols_row_n ? l->cols_row_n : *rows;
	size_t row = p->t->nbytes / (size_t)*rows, off, len, total;
	const char *base = (const char *)p->t->data + (size_t)r0 * row;
	char *copy;

	if (r0 < 0 || nr <= 0 || r0 + nr > *rows) {
		loom_seterr(l->err, l->errlen, "tensor '%s': rows %lld+%lld outside its %lld",
			    name, (long long)r0, (long long)nr, (long long)*rows);
		return -1;
	}
	if (lo < 0 || n <= 0 || lo + n > *cols || lo % be || n % be) {
		loom_seterr(l->err, l->errlen, "tensor '%s': columns %lld+%lld do not fall on its %lld-value blocks",
			    name, (long long)lo, (long long)n, (long long)be);
		return -1;
	}
	off = (size_t)(lo / be) * fmt->block_bytes;
	len = (size_t)(n / be) * fmt->block_bytes;
	if (__builtin_mul_overflow(len, (size_t)nr, &total) || !(copy = malloc(total))) {
		loom_seterr(l->err, l->errlen, "tensor '%s': out of memory for its shard", name);
		return -1;
	}
	for (int64_t r = 0; r < nr; r++)
		memcpy(copy + (size_t)r * len, base + (size_t)r * row + off, len);
	p->owned = copy;
	p->src = copy;
	p->src_bytes = total;
	*rows = nr;
	*cols = n;
	return 0;
}

/* Registers a tensor to load into w, checking its shape is [rows][cols]
 * (GGUF: ne[0] = cols). rows == 0 marks a vector of cols values. */
static int plan_weight(struct loader *l, struct loom_weight *w, const char *fmt,
		       int layer, int64_t rows, int64_t cols, bool required,
		       enum loom_op op)
{
	const struct gguf_tensor *t = find_tensor(l->f, fmt, layer);
	struct loom_backend *be = l->m->be;
	struct weight_plan *p;
	char name[128];
	int64_t want_rows = rows ? rows : 1;

	snprintf(name, sizeof(name), fmt, layer);
	if (!t) {
		if (required)
			loom_seterr(l->err, l->errlen, "missing tensor '%s'", name);
		return required ? -1 : 0;
	}
	if (t->ne[0] != cols || t->ne[1] * t->ne[2] * t->ne[3] != want_rows ||
	    (rows == 0 && t->n_dims != 1)) {
		loom_seterr(l->err, l->errlen,
			"tensor '%s': shape [%lld, %lld], expected [%lld, %lld]", name,
			(long long)t->ne[0], (long long)t->ne[1], (long long)cols,
			(long long)want_rows);
		return -1;
	}
	if (!loom_format_get(t->type)) {
		loom_seterr(l->err, l->errlen,
			"tensor '%s': type %s has no quantization plugin loaded",
			name, gguf_type_name(t->type));
		return -1;
	}
	if (l->n_plan == l->cap_plan) {
		int cap = l->cap_plan ? 2 * l->cap_plan : 64;
		struct weight_plan *np = realloc(l->plan, sizeof(*np) * (size_t)cap);

		if (!np) {
			loom_seterr(l->err, l->errlen, "out of memory");
			return -1;
		}
		l->plan = np;
		l->cap_plan = cap;
	}
	p = &l->plan[l->n_plan++];
	memset(p, 0, sizeof(*p));
	p->w = w;
	p->t = t;
	p->src = t->data;
	p->src_bytes = t->nbytes;
	if (l->slice_n && (l->slice_cols ? take_cols(l, p, name, &want_rows, &cols) :
			   take_slice(l, p, name, &want_rows, &cols, rows == 0)))
		return -1;
	p->dequant = rows == 0 ? t->type != LOOM_TYPE_F32 :
		!be->ops->supports(be->ctx, op, t->type);
	p->gemm_only = rows > 0 && op == LOOM_OP_GEMM && !p->dequant;
	p->packed = false;
	p->bytes = p->dequant ? (size_t)(want_rows * cols) * sizeof(float) : p->src_bytes;
	p->offset = l->total;
	l->total += (p->bytes + 63) & ~(size_t)63;
	w->type = p->dequant ? LOOM_TYPE_F32 : t->type;
	w->rows = want_rows;
	w->cols = cols;
	w->row_bytes = p->dequant ? (size_t)cols * sizeof(float) : p->src_bytes / (size_t)want_rows;
	snprintf(w->name, sizeof(w->name), "%s", name);
	return 0;
}

static int64_t dim_size(const struct loom_hparams *hp, enum loom_dim d)
{
	switch (d) {
	case LOOM_DIM_1:
		return 0;
	case LOOM_DIM_EMBD:
		return hp->n_embd;
	case LOOM_DIM_Q:
		return hp->n_head * hp->head_dim;
	case LOOM_DIM_KV:
		return hp->n_head_kv * hp->head_dim;
	case LOOM_DIM_FF:
		return hp->n_ff;
	case LOOM_DIM_HEAD:
		return hp->head_dim;
	case LOOM_DIM_EXPERT:
		return hp->n_expert;
	case LOOM_DIM_FF_EXP:
		return hp->n_ff_exp;
	case LOOM_DIM_FF_SHEXP:
		return hp->n_ff_shexp;
	case LOOM_DIM_HEADS:
		return hp->n_head;
	}
	return 0;
}

/* The expert tables and the shared expert (w_gate, w_up, w_down in a
 * family with experts) under --tp: their FFN columns when the experts are
 * split, else whole. True when slot is one of them. */
static bool set_moe_slice(struct loader *l, size_t slot)
{
	const struct loom_shard *s = &l->m->shard;
	bool table = slot == offsetof(struct loom_layer, gate_exps_b) ||
		slot == offsetof(struct loom_layer, up_exps_b);
	bool shared = slot == offsetof(struct loom_layer, w_gate) ||
		slot == offsetof(struct loom_layer, w_up);
	bool down = slot == offsetof(struct loom_layer, w_down);

	if (!table && !shared && !down)
		return false;
	if (!s->moe_split)
		return true;
	l->slice_cols = table || down;
	l->slice_lo = table ? s->fx_lo : s->fs_lo;
	l->slice_n = table ? s->fx_hi - s->fx_lo : s->fs_hi - s->fs_lo;
	return true;
}

/* This rank's rows (values) of the layer tensor in `slot` (shard.h). */
static void set_slice(struct loader *l, size_t slot)
{
	const struct loom_shard *s = &l->m->shard;
	int64_t hd = l->m->hp.head_dim;

	l->slice_lo = l->slice_n = 0;
	l->slice_cols = false;
	if (s->tp == 1)
		return;
	if (l->m->hp.arch->moe && set_moe_slice(l, slot))
		return;
	if (slot == offsetof(struct loom_layer, sinks)) { /* one value a query head */
		l->slice_lo = s->q_lo;
		l->slice_n = s->q_hi - s->q_lo;
	} else if (slot == offsetof(struct loom_layer, wq) || slot == offsetof(struct loom_layer, bq)) {
		l->slice_lo = s->q_lo * hd;
		l->slice_n = (s->q_hi - s->q_lo) * hd;
	} else if (slot == offsetof(struct loom_layer, wk) || slot == offsetof(struct loom_layer, wv) ||
		   slot == offsetof(struct loom_layer, bk) || slot == offsetof(struct loom_layer, bv)) {
		l->slice_lo = s->kv_lo * hd;
		l->slice_n = (s->kv_hi - s->kv_lo) * hd;
	} else if (slot == offsetof(struct loom_layer, w_gate) ||
		   slot == offsetof(struct loom_layer, w_up)) {
		l->slice_lo = s->ff_lo;
		l->slice_n = s->ff_hi - s->ff_lo;
	} else if (s->reduce && slot == offsetof(struct loom_layer, wo)) {
		l->slice_cols = true; /* row-parallel: this rank's heads' columns */
		l->slice_lo = s->q_lo * hd;
		l->slice_n = (s->q_hi - s->q_lo) * hd;
	} else if (s->reduce && slot == offsetof(struct loom_layer, w_down)) {
		l->slice_cols = true;
		l->slice_lo = s->ff_lo;
		l->slice_n = s->ff_hi - s->ff_lo;
	} else if (slot == offsetof(struct loom_layer, wo) ||
		   slot == offsetof(struct loom_layer, w_down)) {
		l->slice_lo = s->embd_lo;
		l->slice_n = s->embd_hi - s->embd_lo;
	}
}

/*
 * A fused matrix (Phi-3's attn_qkv, ffn_up): each part is planned as a
 * weight of its own, the rows of it this rank holds (set_slice; all of
 * them in one process) read by offset from the fused tensor. So the graph
 * sees separate weights, a backend packs each part on its own, and tensor
 * ranks hold [q_r], [k_r], [v_r] and [gate_r], [up_r] as they would of
 * an unfused model.
 */
static int plan_fused(struct loader *l, char *layer, const struct loom_arch_tensor *t, int i)
{
	const struct loom_hparams *hp = &l->m->hp;
	int64_t rows = 0, start = 0, part[LOOM_ARCH_MAX_PARTS];
	int k;

	for (k = 0; k < t->n_parts; k++) {
		part[k] = dim_size(hp, t->part_rows[k]);
		rows += part[k];
	}
	if (t->optional && !find_tensor(l->f, t->name, i))
		return 0;
	for (k = 0; k < t->n_parts; k++) {
		struct loom_weight *w = (struct loom_weight *)(layer + t->part_slots[k]);

		set_slice(l, t->part_slots[k]);
		if (!l->slice_n)
			l->slice_n = part[k];
		l->slice_lo += start;
		if (plan_weight(l, w, t->name, i, rows, dim_size(hp, t->cols), true,
				LOOM_OP_GEMM))
			return -1;
		w->part_tail = k > 0; /* its input is the first part's */
		start += part[k];
	}
	return 0;
}

/* Expert e's part of a routed-expert tensor of `rows` rows an expert:
 * all its rows; with the experts split between tensor ranks (shard.h),
 * this rank's FFN columns of it: rows of gate and up, columns of down. */
static void expert_slice(struct loader *l, const struct loom_arch_tensor *t, int64_t e,
			 int64_t rows)
{
	const struct loom_shard *s = &l->m->shard;
	bool down = t->slot == offsetof(struct loom_layer, down_exps);

	l->slice_cols = false;
	l->cols_row_lo = l->cols_row_n = 0;
	l->slice_lo = e * rows;
	l->slice_n = rows;
	if (!s->moe_split)
		return;
	if (!down) {
		l->slice_lo += s->fx_lo;
		l->slice_n = s->fx_hi - s->fx_lo;
		return;
	}
	l->slice_cols = true;
	l->cols_row_lo = e * rows;
	l->cols_row_n = rows;
	l->slice_lo = s->fx_lo;
	l->slice_n = s->fx_hi - s->fx_lo;
}

/*
 * A routed-expert tensor (GGUF [cols, rows, n_expert]): each expert's
 * rows are planned as a weight of their own, read by offset from the
 * tensor (take_slice), so a backend packs and a gemm reads each expert
 * as it would a dense matrix.
 */
static int plan_experts(struct loader *l, char *layer, const struct loom_arch_tensor *t, int i)
{
	const struct loom_hparams *hp = &l->m->hp;
	struct loom_experts *x = (struct loom_experts *)(layer + t->slot);
	int64_t rows = dim_size(hp, t->rows), cols = dim_size(hp, t->cols), n = hp->n_expert;
	const struct gguf_tensor *gt = find_tensor(l->f, t->name, i);
	char name[128];

	snprintf(name, sizeof(name), t->name, i);
	if (!gt) {
		loom_seterr(l->err, l->errlen, "missing tensor '%s'", name);
		return -1;
	}
	if (gt->n_dims != 3 || gt->ne[0] != cols || gt->ne[1] != rows || gt->ne[2] != n) {
		loom_seterr(l->err, l->errlen,
			    "tensor '%s': shape [%lld, %lld, %lld] (%u dims), expected [%lld, %lld, %lld] (one matrix per expert)",
			    name, (long long)gt->ne[0], (long long)gt->ne[1], (long long)gt->ne[2],
			    gt->n_dims, (long long)cols, (long long)rows, (long long)n);
		return -1;
	}
	x->w = calloc((size_t)n, sizeof(*x->w));
	x->data = calloc((size_t)n, sizeof(*x->data));
	if (!x->w || !x->data) {
		loom_seterr(l->err, l->errlen, "out of memory");
		return -1;
	}
	for (int64_t e = 0; e < n; e++) {
		expert_slice(l, t, e, rows);
		if (plan_weight(l, &x->w[e], t->name, i, rows * n, cols, true, LOOM_OP_GEMM))
			return -1;
		l->plan[l->n_plan - 1].expert = true;
	}
	l->slice_lo = l->slice_n = 0;
	l->slice_cols = false;
	l->cols_row_lo = l->cols_row_n = 0;
	return 0;
}

/* The tensors of this rank's layers, as the family's table lists them. */
static int plan_layers(struct loader *l)
{
	const struct loom_hparams *hp = &l->m->hp;
	const struct loom_arch_tensor *t;
	int i;

	for (i = l->m->shard.layer_lo; i < l->m->shard.layer_hi; i++) {
		char *L = (char *)&l->m->layers[i];

		for (t = hp->arch->tensors; t->name; t++) {
			int64_t rows = dim_size(hp, t->rows);

			if (t->n_parts > 0 || t->experts) {
				if (t->experts ? plan_experts(l, L, t, i) : plan_fused(l, L, t, i))
					return -1;
				continue;
			}
			set_slice(l, t->slot);
			/* a table is added, in f32 (converted at load if need be) */
			if (plan_weight(l, (struct loom_weight *)(L + t->slot), t->name, i,
					rows, dim_size(hp, t->cols), !t->optional,
					t->table ? LOOM_OP_ADD : rows ? LOOM_OP_GEMM : 0))
				return -1;
		}
	}
	l->slice_lo = l->slice_n = 0;
	l->slice_cols = false;
	return 0;
}

int32_t loom_model_context(const struct loom_hparams *hp, int32_t n_ctx)
{
	int64_t train = hp->n_ctx_train > 0 ? hp->n_ctx_train : 4096;

	if (n_ctx <= 0)
		n_ctx = 4096;
	return n_ctx > train ? (int32_t)train : n_ctx;
}

/*
 * The RoPE divisors' tensor: Llama 3.1's rope_freqs, or the family's; for
 * LongRoPE (Phi-3) the long factors when the context used goes past the
 * file's original_context_length, as llama.cpp decides, else the short.
 */
static const char *rope_factors_name(const struct loader *l)
{
	const struct loom_hparams *hp = &l->m->hp;

	if (!hp->arch->rope_factors)
		return "rope_freqs.weight";
	if (hp->arch->rope_factors_long && hp->rope_orig_ctx > 0 &&
	    loom_model_context(hp, l->n_ctx) > hp->rope_orig_ctx &&
	    gguf_find_tensor(l->f, hp->arch->rope_factors_long))
		return hp->arch->rope_factors_long;
	return hp->arch->rope_factors;
}

static int plan_all(struct loader *l)
{
	struct loom_model *m = l->m;
	const struct loom_hparams *hp = &m->hp;
	struct loom_backend *be = m->be;
	bool tied = !gguf_find_tensor(l->f, "output.weight");
	bool head = m->shard.logits; /* this rank computes the logits */

	/* the first stage embeds; a tied table is also the output head */
	if (!m->shard.first && !(head && tied))
		goto out_head;
	if (plan_weight(l, &m->tok_embd, "token_embd.weight", 0, hp->n_vocab,
			hp->n_embd, true, LOOM_OP_EMBED))
		return -1;
	/* A tied table serves both embed and the output GEMM. */
	if (tied && head && !l->plan[l->n_plan - 1].dequant &&
	    !be->ops->supports(be->ctx, LOOM_OP_GEMM, m->tok_embd.type)) {
		l->total -= (l->plan[--l->n_plan].bytes + 63) & ~(size_t)63;
		if (plan_weight(l, &m->tok_embd, "token_embd.weight", 0, hp->n_vocab,
				hp->n_embd, true, LOOM_OP_COUNT))
			return -1;
		l->plan[l->n_plan - 1].dequant = true;
	}
	l->plan[l->n_plan - 1].tied = tied && head;
out_head:
	if (head && !tied && plan_weight(l, &m->output, "output.weight", 0, hp->n_vocab,
					 hp->n_embd, true, LOOM_OP_GEMM))
		return -1;
	if (head && plan_weight(l, &m->output_norm, "output_norm.weight", 0, 0, hp->n_embd,
				true, 0))
		return -1;
	if (plan_weight(l, &m->rope_freqs, rope_factors_name(l), 0, 0, hp->n_rot / 2, false, 0))
		return -1;
	if (hp->yarn_factor > 0.0f && l->n_plan && l->plan[l->n_plan - 1].w == &m->rope_freqs) {
		loom_seterr(l->err, l->errlen, "tensor '%s' with YaRN scaling (%s.rope.scaling.type) is not supported",
			    rope_factors_name(l), hp->arch_name);
		return -1;
	}
	return plan_layers(l);
}

/* Offers each gemm-only weight to the backend's weight_pack, and a tied
 * table when the backend's embed reads its layout too (the head streams
 * the whole table every step, embed a few rows); what it packs leaves the
 * upload plan, and its pages of the file leave memory. */
static int pack_all(struct loader *l)
{
	struct loom_model *m = l->m;
	struct loom_backend *be = m->be;
	struct loom_buffer *buf;
	size_t bytes;
	int i, rc;

	if (!loom_backend_has_pack(be))
		return 0;
	m->packs = calloc((size_t)l->n_plan, sizeof(*m->packs));
	if (!m->packs) {
		loom_seterr(l->err, l->errlen, "out of memory");
		return -1;
	}
	for (i = 0; i < l->n_plan; i++) {
		struct weight_plan *p = &l->plan[i];
		struct loom_weight_pack_args a = { .struct_size = sizeof(a), .type = p->t->type,
			.n = p->w->rows, .k = p->w->cols, .src = p->src,
			.src_stride = p->w->row_bytes };

		if (!p->gemm_only &&
		    !(p->tied && !p->dequant && loom_backend_embeds_packed(be, p->t->type)))
			continue;
		buf = NULL;
		rc = be->ops->weight_pack(be->ctx, &a, &buf, &bytes);
		if (rc == LOOM_ERR_UNSUPPORTED)
			continue;
		if (rc || !buf) {
			loom_seterr(l->err, l->errlen, "backend %s: packing tensor '%.*s' failed (%d)",
				    be->ops->name, (int)p->t->name.len, p->t->name.ptr, rc);
			return -1;
		}
		m->packs[m->n_packs++] = buf;
		m->packed_bytes += bytes;
		p->packed = true;
		p->w->packed = true;
		p->w->data = be->ops->buffer_addr(be->ctx, buf);
		if (!p->owned)
			gguf_release(l->f, p->src, p->src_bytes);
	}
	/* the upload plan without the packed weights */
	l->total = 0;
	for (i = 0; i < l->n_plan; i++) {
		if (l->plan[i].packed)
			continue;
		l->plan[i].offset = l->total;
		l->total += (l->plan[i].bytes + 63) & ~(size_t)63;
	}
	return 0;
}

static void progress(bool on, size_t done, size_t total)
{
	int width = 40, filled;

	if (!on || !total)
		return;
	filled = (int)((double)done / (double)total * width);
	fprintf(stderr, "\rloading [%.*s%*s] %3d%%", filled,
		"========================================", width - filled, "",
		(int)(100.0 * (double)done / (double)total));
	if (done == total)
		fputc('\n', stderr);
}

/* Converts a tensor to f32 on the host and uploads it. */
static int upload_dequant(struct loader *l, const struct weight_plan *p, void *dst)
{
	const struct loom_quant_format *fmt = loom_format_get(p->t->type);
	struct loom_backend *be = l->m->be;
	int64_t n = (int64_t)(p->bytes / sizeof(float));
	float *tmp = malloc(p->bytes);
	int rc;

	if (!tmp) {
		loom_seterr(l->err, l->errlen, "out of memory converting '%.*s'",
			(int)p->t->name.len, p->t->name.ptr);
		return -1;
	}
	rc = fmt->to_float(p->src, tmp, n);
	if (!rc)
		rc = be->ops->upload(be->ctx, dst, tmp, p->bytes);
	free(tmp);
	if (rc)
		loom_seterr(l->err, l->errlen, "tensor '%.*s': conversion or upload failed (%d)",
			(int)p->t->name.len, p->t->name.ptr, rc);
	return rc ? -1 : 0;
}

static int upload_all(struct loader *l, bool show)
{
	struct loom_backend *be = l->m->be;
	char *base;
	size_t done = 0;
	int i, n_deq = 0;

	if (be->ops->buffer_alloc(be->ctx, l->total, &l->m->weights_buf)) {
		loom_seterr(l->err, l->errlen, "cannot allocate %zu MiB for weights on backend %s",
			l->total >> 20, be->ops->name);
		return -1;
	}
	base = be->ops->buffer_addr(be->ctx, l->m->weights_buf);
	for (i = 0; i < l->n_plan; i++) {
		const struct weight_plan *p = &l->plan[i];
		void *dst = base + p->offset;

		if (p->packed)
			continue;
		if (p->dequant) {
			if (upload_dequant(l, p, dst))
				return -1;
			n_deq += p->t->type != LOOM_TYPE_F32;
		} else if (be->ops->upload(be->ctx, dst, p->src, p->bytes)) {
			loom_seterr(l->err, l->errlen, "upload of '%.*s' failed",
				(int)p->t->name.len, p->t->name.ptr);
			return -1;
		}
		p->w->data = dst;
		done += p->bytes;
		progress(show, done, l->total);
	}
	l->m->weights_bytes = l->total;
	if (n_deq)
		loom_log(LOOM_LOG_WARN, "%d tensors converted to f32 at load: backend %s has no native kernel for their type",
			n_deq, be->ops->name);
	return 0;
}

/* Whether every held layer's wo and w_down split by columns on block
 * boundaries (each rank's heads' and FFN columns' start and count). */
static bool columns_fit(const struct gguf_file *f, const struct loom_model *m)
{
	const struct loom_shard *s = &m->shard;
	int64_t hd = m->hp.head_dim;

	for (int32_t i = s->layer_lo; i < s->layer_hi; i++) {
		for (const struct loom_arch_tensor *t = m->hp.arch->tensors; t->name; t++) {
			bool wo = t->slot == offsetof(struct loom_layer, wo);
			const struct gguf_tensor *gt;
			int64_t lo, n, be;

			if (t->n_parts || (!wo && t->slot != offsetof(struct loom_layer, w_down)))
				continue;
			if (!wo && m->hp.arch->moe)
				continue; /* the shared expert's: plan_experts_split */
			gt = find_tensor(f, t->name, i);
			if (!gt || !loom_format_get(gt->type))
				return false;
			be = loom_format_get(gt->type)->block_elems;
			lo = wo ? s->q_lo * hd : s->ff_lo;
			n = wo ? (s->q_hi - s->q_lo) * hd : s->ff_hi - s->ff_lo;
			if (lo % be || n % be)
				return false;
		}
	}
	return true;
}

/* The least common multiple of the block sizes of tensor `name` over the
 * held layers (every block size is a power of two or 1 in practice; 0
 * when a layer lacks the tensor or its type is unknown). */
static int64_t block_lcm(const struct gguf_file *f, const struct loom_model *m, const char *name)
{
	int64_t unit = 1;

	for (int32_t i = m->shard.layer_lo; i < m->shard.layer_hi; i++) {
		const struct gguf_tensor *t = find_tensor(f, name, i);
		const struct loom_quant_format *fmt = t ? loom_format_get(t->type) : NULL;
		int64_t be, a, b;

		if (!fmt)
			return 0;
		be = fmt->block_elems;
		for (a = unit, b = be; b;) { /* gcd */
			int64_t r = a % b;

			a = b, b = r;
		}
		unit = unit / a * be;
	}
	return unit;
}

/* Routed experts under --tp: split by FFN columns (one all-reduce of the
 * moe output) outside exact mode when every rank's columns fall on the
 * down matrices' blocks; else held whole on every rank (shard.h). */
static void plan_experts_split(const struct gguf_file *f, struct loom_model *m, uint32_t flags)
{
	struct loom_shard *s = &m->shard;
	int64_t ux = block_lcm(f, m, "blk.%d.ffn_down_exps.weight");
	int64_t us = m->hp.n_ff_shexp ? block_lcm(f, m, "blk.%d.ffn_down_shexp.weight") : 1;

	if (!(flags & LOOM_BACKEND_EXACT) && ux && us && loom_shard_split_experts(s, &m->hp, ux, us)) {
		loom_log(LOOM_LOG_INFO, "--tp %d: experts split by FFN columns (%lld of %lld a rank here), one all-reduce per moe layer",
			 s->tp, (long long)(s->fx_hi - s->fx_lo), (long long)m->hp.n_ff_exp);
		return;
	}
	loom_log(LOOM_LOG_INFO, "--tp %d: experts held whole on every rank (%s)", s->tp,
		 flags & LOOM_BACKEND_EXACT ? "exact mode keeps the single process's sums" :
		 "their FFN columns do not split on the weights' blocks");
}

/* This process's share of the model: all of it, or a rank's. */
static int plan_shard(struct loom_model *m, const struct gguf_file *f, struct loom_dist *d,
		      uint32_t flags, char *err, size_t errlen)
{
	if (!d) {
		loom_shard_single(&m->shard, &m->hp);
		return 0;
	}
	if (loom_shard_plan(&m->shard, &m->hp, d->tp, d->pp, d->rank, err, errlen))
		return -1;
	if (d->tp > 1 && m->hp.arch->moe)
		plan_experts_split(f, m, flags);
	m->shard.dist = d;
	m->shard.tp_comm = d->tp_comm;
	/* exact mode keeps the single process's sums (all-gathers) */
	m->shard.reduce = d->tp > 1 && !(flags & LOOM_BACKEND_EXACT) && columns_fit(f, m);
	if (d->tp > 1 && !(flags & LOOM_BACKEND_EXACT) && !m->shard.reduce)
		loom_log(LOOM_LOG_INFO, "--tp %d: the heads or FFN columns do not split on the weights' blocks; all-gathers as in exact mode",
			 d->tp);
	if (d->tp > 1 && !m->hp.arch->moe)
		loom_log(LOOM_LOG_INFO, "--tp %d: %s per layer", d->tp, m->shard.reduce ?
			 "2 all-reduces (row-parallel wo, w_down)" :
			 "4 all-gathers (the single process's sums)");
	if (d->tp > 1 && m->hp.arch->moe)
		loom_log(LOOM_LOG_INFO, "--tp %d: attention: %s per layer", d->tp, m->shard.reduce ?
			 "1 all-reduce (row-parallel wo)" : "2 all-gathers (the single process's sums)");
	if (d->tp > 1 && !loom_backend_has_collective(m->be)) {
		loom_seterr(err, errlen, "--tp %d: backend %s (ABI 1.%u) has no collective slot (ABI 1.4); use one that has, e.g. cpu.so or ref.so",
			    d->tp, m->be->path, m->be->ops->abi_minor);
		return -1;
	}
	return 0;
}

/* The upload plan's bytes by stored type, before packing. */
static void tally_plan(struct loader *l)
{
	struct loom_model *m = l->m;

	memset(m->plan_bytes, 0, sizeof(m->plan_bytes));
	m->n_converted = 0;
	m->expert_bytes = 0;
	m->embd_only_bytes = 0;
	for (int i = 0; i < l->n_plan; i++) {
		const struct weight_plan *p = &l->plan[i];
		uint32_t t = p->dequant ? LOOM_TYPE_F32 : p->t->type;

		if (t < LOOM_TYPE_COUNT)
			m->plan_bytes[t] += p->bytes;
		if (p->expert)
			m->expert_bytes += p->bytes;
		if (p->w == &m->tok_embd && !p->tied)
			m->embd_only_bytes += p->bytes;
		m->n_converted += p->dequant && p->t->type != LOOM_TYPE_F32;
	}
	m->plan_total = l->total;
}

static void free_plan(struct loader *l)
{
	for (int i = 0; i < l->n_plan; i++)
		free(l->plan[i].owned);
	free(l->plan);
}

/*
 * YaRN as RoPE divisors (llama.cpp's rope_yarn with ext_factor 1): pair i
 * of n = n_rot / 2 turns by theta_i = pos * base^(-2i/n_rot) * (s (1 - r)
 * + r), s = 1 / factor, r = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)
 * with lo = max(0, floor(d(beta_fast))), hi = min(n_rot - 1,
 * ceil(d(beta_slow))), d(b) = n_rot ln(orig_ctx / (2 pi b)) / (2 ln base).
 * The divisor is 1 / (s (1 - r) + r); the magnitude is fold_yarn_mscale's.
 */
static int yarn_factors(struct loom_model *m, char *err, size_t errlen)
{
	const struct loom_hparams *hp = &m->hp;
	const struct loom_backend *be = m->be;
	int64_t n = hp->n_rot / 2;
	double s = 1.0 / hp->yarn_factor, nr = (double)hp->n_rot, lb = log(hp->rope_base);
	double lo = floor(nr * log(hp->yarn_orig_ctx / (2 * 3.14159265358979323846 * hp->yarn_beta_fast)) / (2 * lb));
	double hi = ceil(nr * log(hp->yarn_orig_ctx / (2 * 3.14159265358979323846 * hp->yarn_beta_slow)) / (2 * lb));
	float f[512];
	int rc;

	lo = lo > 0 ? lo : 0;
	hi = hi < nr - 1 ? hi : nr - 1;
	for (int64_t i = 0; i < n; i++) {
		double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
		double r = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y);

		f[i] = (float)(1.0 / (s * (1.0 - r) + r));
	}
	rc = be->ops->buffer_alloc(be->ctx, (size_t)n * sizeof(float), &m->yarn_buf);
	if (!rc)
		rc = be->ops->upload(be->ctx, be->ops->buffer_addr(be->ctx, m->yarn_buf), f,
				     (size_t)n * sizeof(float));
	if (rc) {
		loom_seterr(err, errlen, "YaRN's RoPE divisors: backend %s failed (%d)",
			    be->ops->name, rc);
		return -1;
	}
	m->rope_freqs.data = be->ops->buffer_addr(be->ctx, m->yarn_buf);
	m->rope_freqs.type = LOOM_TYPE_F32;
	m->rope_freqs.cols = n;
	return 0;
}

/* Whether the family's layers hold a tensor in this struct loom_layer slot. */
static bool arch_has(const struct loom_arch *arch, size_t slot)
{
	for (const struct loom_arch_tensor *t = arch->tensors; t->name; t++)
		if (!t->experts && !t->n_parts && t->slot == slot)
			return true;
	return false;
}

/* The backend runs what the family needs of ABI 1.8 (gpt-oss's attention
 * sinks and clamped SwiGLU), or the load is refused by name: there is no
 * host fallback for either. */
static int check_features(const struct loom_model *m, char *err, size_t errlen)
{
	const struct loom_backend *be = m->be;
	const struct loom_arch *arch = m->hp.arch;
	bool new_abi = be->ops->abi_minor >= 8;
	const char *what = NULL;

	if (arch_has(arch, offsetof(struct loom_layer, sinks)) &&
	    !(new_abi && be->ops->supports(be->ctx, LOOM_OP_ATTENTION_SINKS, LOOM_TYPE_F32)))
		what = "attention sinks";
	else if (arch->glu == LOOM_GLU_SWIGLU_OAI &&
		 !(new_abi && be->ops->supports(be->ctx, LOOM_OP_GLU_OAI, LOOM_TYPE_F32)))
		what = "the clamped SwiGLU";
	if (!what)
		return 0;
	loom_seterr(err, errlen, "architecture '%s' needs %s, which backend %s (ABI 1.%u) does not run (they came with backend ABI 1.8; ref.so and cpu.so have them)",
		    m->hp.arch_name, what, be->path, be->ops->abi_minor);
	return -1;
}

/* The experts' device addresses, in the arrays the moe slot takes. */
static void set_expert_data(struct loom_model *m)
{
	for (int32_t i = m->shard.layer_lo; i < m->shard.layer_hi && m->hp.arch->moe; i++) {
		struct loom_layer *L = &m->layers[i];
		struct loom_experts *xs[3] = { &L->gate_exps, &L->up_exps, &L->down_exps };

		for (int k = 0; k < 3; k++)
			for (int64_t e = 0; xs[k]->w && e < m->hp.n_expert; e++)
				xs[k]->data[e] = xs[k]->w[e].data;
		L->shexp_data[0] = L->w_gate.data;
		L->shexp_data[1] = L->w_up.data;
		L->shexp_data[2] = L->w_down.data;
	}
}

static void free_experts(struct loom_model *m)
{
	for (int64_t i = 0; m->layers && i < m->hp.n_layer; i++) {
		struct loom_layer *L = &m->layers[i];

		free(L->gate_exps.w);
		free(L->gate_exps.data);
		free(L->up_exps.w);
		free(L->up_exps.data);
		free(L->down_exps.w);
		free(L->down_exps.data);
	}
}

struct loom_model *loom_model_load(const struct gguf_file *f,
				   const struct loom_model_params *p,
				   char *err, size_t errlen)
{
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg),
		.n_threads = p->n_threads, .flags = p->backend_flags };
	struct loom_model *m = calloc(1, sizeof(*m));
	struct loader l = { .f = f, .m = m, .n_ctx = p->n_ctx, .err = err, .errlen = errlen };

	if (!m) {
		loom_seterr(err, errlen, "out of memory");
		return NULL;
	}
	if (loom_formats_init(err, errlen) || read_hparams(f, &m->hp, err, errlen))
		goto out_free;
	m->be = loom_backend_open(p->backend, &cfg, err, errlen);
	if (!m->be || check_features(m, err, errlen))
		goto out_free;
	m->layers = calloc((size_t)m->hp.n_layer, sizeof(*m->layers));
	if (!m->layers) {
		loom_seterr(err, errlen, "out of memory");
		goto out_free;
	}
	if (plan_shard(m, f, p->dist, p->backend_flags, err, errlen))
		goto out_free;
	if (set_layer_kinds(f, m, err, errlen) || plan_all(&l))
		goto out_free;
	tally_plan(&l);
	if (p->before_alloc && p->before_alloc(p->before_alloc_arg, m, err, errlen))
		goto out_free;
	if (pack_all(&l) || upload_all(&l, p->progress && isatty(2)))
		goto out_free;
	if (m->n_packs)
		loom_log(LOOM_LOG_INFO, "weights: %.1f MiB as in the file, %.1f MiB in %d tensors packed by backend %s",
			 (double)m->weights_bytes / 1048576.0, (double)m->packed_bytes / 1048576.0,
			 m->n_packs, m->be->ops->name);
	if (!m->output.data)
		m->output = m->tok_embd;
	if (m->hp.yarn_factor > 0.0f && yarn_factors(m, err, errlen))
		goto out_free;
	set_expert_data(m);
	if (loom_graph_build(m, err, errlen))
		goto out_free;
	free_plan(&l);
	return m;

out_free:
	free_plan(&l);
	loom_model_free(m);
	return NULL;
}

void loom_model_free(struct loom_model *m)
{
	if (!m)
		return;
	if (m->be && m->weights_buf)
		m->be->ops->buffer_free(m->be->ctx, m->weights_buf);
	if (m->be && m->yarn_buf)
		m->be->ops->buffer_free(m->be->ctx, m->yarn_buf);
	for (int i = 0; m->be && i < m->n_packs; i++)
		m->be->ops->buffer_free(m->be->ctx, m->packs[i]);
	free(m->packs);
	loom_backend_close(m->be);
	free_experts(m);
	free(m->layers);
	free(m->nodes);
	free(m);
}
