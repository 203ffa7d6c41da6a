/* Which type each tensor gets: the plain formats, and llama.cpp's named
 * mixes with their per-tensor rules (facts from llama.cpp's llama-quant.cpp,
 * as vendored in llama-cpp-python 0.3.36; docs/QUANTIZATION.md lists them
 * and what loom leaves out). */
#include "quant/quantize.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"

/* llama_ftype values (general.file_type) */
enum {
	FT_F32 = 0, FT_F16 = 1, FT_Q4_0 = 2, FT_Q4_1 = 3, FT_Q8_0 = 7, FT_Q5_0 = 8,
	FT_Q5_1 = 9, FT_Q2_K = 10, FT_Q3_K_S = 11, FT_Q3_K_M = 12, FT_Q3_K_L = 13,
	FT_Q4_K_S = 14, FT_Q4_K_M = 15, FT_Q5_K_S = 16, FT_Q5_K_M = 17, FT_Q6_K = 18,
	FT_BF16 = 32, FT_MXFP4_MOE = 38,
};

/* Plain formats: lower-case, as GGUF names the types. */
static const struct quant_target plain[] = {
	{ "f32", FT_F32, LOOM_TYPE_F32, false },
	{ "f16", FT_F16, LOOM_TYPE_F16, false },
	{ "bf16", FT_BF16, LOOM_TYPE_BF16, false },
	{ "q4_0", FT_Q4_0, LOOM_TYPE_Q4_0, false },
	{ "q4_1", FT_Q4_1, LOOM_TYPE_Q4_1, false },
	{ "q5_0", FT_Q5_0, LOOM_TYPE_Q5_0, false },
	{ "q5_1", FT_Q5_1, LOOM_TYPE_Q5_1, false },
	{ "q8_0", FT_Q8_0, LOOM_TYPE_Q8_0, false },
	{ "q2_K", FT_Q2_K, LOOM_TYPE_Q2_K, false },
	{ "q3_K", FT_Q3_K_S, LOOM_TYPE_Q3_K, false },
	{ "q4_K", FT_Q4_K_S, LOOM_TYPE_Q4_K, false },
	{ "q5_K", FT_Q5_K_S, LOOM_TYPE_Q5_K, false },
	{ "q6_K", FT_Q6_K, LOOM_TYPE_Q6_K, false },
	/* the format plugin's (plugins/quant/mxfp4.c); file type as
	 * llama.cpp's MXFP4_MOE, the only mix of it */
	{ "mxfp4", FT_MXFP4_MOE, LOOM_TYPE_MXFP4, false },
};

/* llama.cpp's mixes: upper-case, as llama-quantize names them. */
static const struct quant_target mixes[] = {
	{ "F32", FT_F32, LOOM_TYPE_F32, true },
	{ "F16", FT_F16, LOOM_TYPE_F16, true },
	{ "BF16", FT_BF16, LOOM_TYPE_BF16, true },
	{ "Q4_0", FT_Q4_0, LOOM_TYPE_Q4_0, true },
	{ "Q4_1", FT_Q4_1, LOOM_TYPE_Q4_1, true },
	{ "Q5_0", FT_Q5_0, LOOM_TYPE_Q5_0, true },
	{ "Q5_1", FT_Q5_1, LOOM_TYPE_Q5_1, true },
	{ "Q8_0", FT_Q8_0, LOOM_TYPE_Q8_0, true },
	{ "Q2_K", FT_Q2_K, LOOM_TYPE_Q2_K, true },
	{ "Q3_K_S", FT_Q3_K_S, LOOM_TYPE_Q3_K, true },
	{ "Q3_K_M", FT_Q3_K_M, LOOM_TYPE_Q3_K, true },
	{ "Q3_K_L", FT_Q3_K_L, LOOM_TYPE_Q3_K, true },
	{ "Q4_K_S", FT_Q4_K_S, LOOM_TYPE_Q4_K, true },
	{ "Q4_K_M", FT_Q4_K_M, LOOM_TYPE_Q4_K, true },
	{ "Q5_K_S", FT_Q5_K_S, LOOM_TYPE_Q5_K, true },
	{ "Q5_K_M", FT_Q5_K_M, LOOM_TYPE_Q5_K, true },
	{ "Q6_K", FT_Q6_K, LOOM_TYPE_Q6_K, true },
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

int quant_target_parse(const char *s, struct quant_target *t, char *err, size_t errlen)
{
	char names[1024] = "";
	size_t len;

	for (size_t i = 0; i < COUNT(plain); i++)
		if (!strcmp(s, plain[i].name)) {
			*t = plain[i];
			return 0;
		}
	for (size_t i = 0; i < COUNT(mixes); i++)
		if (!strcmp(s, mixes[i].name)) {
			*t = mixes[i];
			return 0;
		}
	for (size_t i = 0; i < COUNT(plain); i++) {
		len = strlen(names);
		snprintf(names + len, sizeof(names) - len, "%s%s", i ? " " : "", plain[i].name);
	}
	len = strlen(names);
	snprintf(names + len, sizeof(names) - len, "; mixes:");
	for (size_t i = 0; i < COUNT(mixes); i++) {
		len = strlen(names);
		snprintf(names + len, sizeof(names) - len, " %s", mixes[i].name);
	}
	loom_seterr(err, errlen, "unknown type '%s' (formats: %s)", s, names);
	return -1;
}

/* ---- the model facts the rules use ---- */

static bool name_is(const struct gguf_str *s, const char *name)
{
	return s->len == strlen(name) && !memcmp(s->ptr, name, s->len);
}

/* Does the tensor name contain sub? (names are not NUL-terminated) */
static bool name_has(const struct gguf_str *s, const char *sub)
{
	size_t n = strlen(sub);

	for (uint64_t i = 0; i + n <= s->len; i++)
		if (!memcmp(s->ptr + i, sub, n))
			return true;
	return false;
}

static bool is_attn_v(const struct gguf_str *s)
{
	return name_has(s, "attn_v.weight") || name_has(s, "attn_qkv.weight") ||
	       name_has(s, "attn_kv_b.weight");
}

/* "<arch>.<key>" as an int; 0 when absent. */
static int arch_u32(const struct gguf_file *f, const char *arch, const char *key, int *out,
		    char *err, size_t errlen)
{
	char full[256];
	uint32_t v = 0;
	int rc;

	snprintf(full, sizeof(full), "%s.%s", arch, key);
	rc = gguf_get_u32(f, full, &v, err, errlen);
	if (rc < 0)
		return -1;
	*out = rc == 0 && v <= (1u << 30) ? (int)v : 0;
	return 0;
}

int quant_rules_init(struct quant_rules *r, const struct quant_target *t,
		     const struct gguf_file *f, char *err, size_t errlen)
{
	char *arch = NULL;
	int n_head = 0, n_head_kv = 0, rc;

	memset(r, 0, sizeof(*r));
	r->target = t;
	r->tied = true;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		if (name_is(&f->tensors[i].name, "output.weight"))
			r->tied = false;
		if (is_attn_v(&f->tensors[i].name))
			r->n_attn_v++;
	}
	rc = gguf_get_str(f, "general.architecture", &arch, err, errlen);
	if (rc < 0)
		return -1;
	if (rc == 0) {
		r->falcon = !strcmp(arch, "falcon");
		rc = arch_u32(f, arch, "block_count", &r->n_layer, err, errlen) ||
		     arch_u32(f, arch, "expert_count", &r->n_expert, err, errlen) ||
		     arch_u32(f, arch, "attention.head_count", &n_head, err, errlen) ||
		     arch_u32(f, arch, "attention.head_count_kv", &n_head_kv, err, errlen);
		free(arch);
		if (rc)
			return -1;
	}
	/* llama.cpp: head_count_kv defaults to head_count */
	r->n_gqa = n_head > 0 ? n_head / (n_head_kv > 0 ? n_head_kv : n_head) : 1;
	return 0;
}

/* ---- the rules ---- */

/* Every 2-D+ tensor whose name ends in "weight", norms and the MoE router
 * excepted (llama.cpp's list has more names, of architectures loom does
 * not run). */
static bool may_quantize(const struct gguf_tensor *t)
{
	const struct gguf_str *n = &t->name;

	return t->n_dims >= 2 && n->len >= 6 && !memcmp(n->ptr + n->len - 6, "weight", 6) &&
	       !name_has(n, "_norm.weight") && !name_has(n, "ffn_gate_inp.weight") &&
	       !name_is(n, "rope_freqs.weight");
}

static uint32_t block_elems(uint32_t type)
{
	uint32_t be = 1, bb = 0;

	gguf_type_geometry(type, &be, &bb);
	return be;
}

/* llama.cpp: the first and last eighth of the layers, and every third in
 * between, get more bits. */
static bool more_bits(int i, int n)
{
	return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static uint32_t output_type(const struct quant_rules *r, const struct gguf_tensor *t,
			    uint32_t type)
{
	if (r->falcon || t->ne[0] % block_elems(type) != 0)
		return LOOM_TYPE_Q8_0;
	return type != LOOM_TYPE_Q8_0 ? LOOM_TYPE_Q6_K : type;
}

static uint32_t attn_v_type(struct quant_rules *r, uint32_t type)
{
	uint32_t ft = r->target->ftype;
	int i = r->i_attn_v++;

	if (ft == FT_Q2_K)
		type = r->n_gqa >= 4 ? LOOM_TYPE_Q4_K : LOOM_TYPE_Q3_K;
	else if (ft == FT_Q3_K_M)
		type = i < 2 ? LOOM_TYPE_Q5_K : LOOM_TYPE_Q4_K;
	else if (ft == FT_Q3_K_L)
		type = LOOM_TYPE_Q5_K;
	else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && more_bits(i, r->n_attn_v))
		type = LOOM_TYPE_Q6_K;
	else if (ft == FT_Q4_K_S && i < 4)
		type = LOOM_TYPE_Q5_K;
	if (r->n_expert == 8)
		type = LOOM_TYPE_Q8_0;
	return type;
}

static uint32_t ffn_down_type(struct quant_rules *r, uint32_t type)
{
	uint32_t ft = r->target->ftype;
	int i = r->i_ffn_down++, n = r->n_layer;

	if (ft == FT_Q2_K)
		return LOOM_TYPE_Q3_K;
	if (ft == FT_Q3_K_M)
		return i < n / 16 ? LOOM_TYPE_Q5_K :
		       !r->falcon || more_bits(i, n) ? LOOM_TYPE_Q4_K : LOOM_TYPE_Q3_K;
	if (ft == FT_Q3_K_L)
		return r->falcon ? LOOM_TYPE_Q4_K : LOOM_TYPE_Q5_K;
	if (ft == FT_Q4_K_M) {
		if (r->falcon)
			return i < n / 16 ? LOOM_TYPE_Q6_K :
			       more_bits(i, n) ? LOOM_TYPE_Q5_K : LOOM_TYPE_Q4_K;
		return more_bits(i, n) ? LOOM_TYPE_Q6_K : type;
	}
	if (ft == FT_Q5_K_M && more_bits(i, n))
		return LOOM_TYPE_Q6_K;
	if (ft == FT_Q4_K_S && !r->falcon && i < n / 8)
		return LOOM_TYPE_Q5_K;
	if ((ft == FT_Q4_0 || ft == FT_Q5_0) && r->has_imatrix && i < n / 8)
		return ft == FT_Q4_0 ? LOOM_TYPE_Q4_1 : LOOM_TYPE_Q5_1;
	return type;
}

static uint32_t attn_output_type(const struct quant_rules *r, uint32_t type)
{
	uint32_t ft = r->target->ftype;

	if (r->falcon)
		return ft == FT_Q3_K_L ? LOOM_TYPE_Q4_K : type;
	if (r->n_expert == 8)
		return ft == FT_Q2_K || ft == FT_Q3_K_S || ft == FT_Q3_K_M || ft == FT_Q4_K_S ||
		       ft == FT_Q4_K_M ? LOOM_TYPE_Q5_K : type;
	if (ft == FT_Q2_K)
		return LOOM_TYPE_Q3_K;
	if (ft == FT_Q3_K_M)
		return LOOM_TYPE_Q4_K;
	if (ft == FT_Q3_K_L)
		return LOOM_TYPE_Q5_K;
	return type;
}

/* The mix's choice for a quantizable tensor, before the shape fallback. */
static uint32_t mix_type(struct quant_rules *r, const struct gguf_tensor *t, uint32_t type)
{
	const struct gguf_str *n = &t->name;

	if (name_is(n, "output.weight") || (r->tied && name_is(n, "token_embd.weight")))
		return output_type(r, t, type);
	if (name_is(n, "token_embd.weight"))
		return type;
	if (is_attn_v(n))
		return attn_v_type(r, type);
	if (name_has(n, "attn_k.weight"))
		return r->n_expert == 8 ? LOOM_TYPE_Q8_0 : type;
	if (name_has(n, "attn_q.weight"))
		return type;
	if (name_has(n, "attn_output.weight"))
		return attn_output_type(r, type);
	if (name_has(n, "ffn_up") || name_has(n, "ffn_gate"))
		return type;
	if (name_has(n, "ffn_down"))
		return ffn_down_type(r, type);
	return type;
}

/* Rows whose length is not a multiple of the type's block: llama.cpp's
 * fallback to a 32-block format of about the same size, else f16. (It
 * gives q2_K and q3_K's rows q4_0, as loom does.) */
static uint32_t shape_fallback(const struct gguf_tensor *t, uint32_t type)
{
	if (t->ne[0] % block_elems(type) == 0)
		return type;
	switch (type) {
	case LOOM_TYPE_Q2_K:
	case LOOM_TYPE_Q3_K: type = LOOM_TYPE_Q4_0; break;
	case LOOM_TYPE_Q4_K: type = LOOM_TYPE_Q5_0; break;
	case LOOM_TYPE_Q5_K: type = LOOM_TYPE_Q5_1; break;
	case LOOM_TYPE_Q6_K: type = LOOM_TYPE_Q8_0; break;
	default: break;
	}
	return t->ne[0] % block_elems(type) == 0 ? type : LOOM_TYPE_F16;
}

uint32_t quant_tensor_type(struct quant_rules *r, const struct gguf_tensor *t,
			   uint32_t *wanted)
{
	uint32_t type = r->target->type;

	*wanted = t->type;
	if (!may_quantize(t))
		return t->type;
	*wanted = type;
	if (block_elems(type) == 1) /* f32, f16, bf16: no rules */
		return type;
	if (r->target->mix)
		*wanted = type = mix_type(r, t, type);
	return shape_fallback(t, type);
}
