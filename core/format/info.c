/* `loom info`: summary of a GGUF file. See info.h.
 *
 * Hyperparameters live under "<general.architecture>.<name>" keys
 * (llama.block_count, qwen2.rope.freq_base, gemma3.attention.sliding_window,
 * ...). Each is printed with whatever type the file uses; missing keys are
 * left out, so vocab-only files and unknown architectures still print.
 */
#include "format/info.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"

/* Architecture-relative hyperparameter keys and their labels. */
static const struct {
	const char *suffix;
	const char *label;
} arch_keys[] = {
	{ "context_length", "context length" },
	{ "embedding_length", "embedding length" },
	{ "block_count", "layers" },
	{ "feed_forward_length", "FFN length" },
	{ "attention.head_count", "attention heads" },
	{ "attention.head_count_kv", "KV heads" },
	{ "attention.key_length", "key length" },
	{ "attention.value_length", "value length" },
	{ "attention.sliding_window", "sliding window" },
	{ "rope.freq_base", "RoPE base" },
	{ "rope.dimension_count", "RoPE dimensions" },
	{ "rope.scaling.type", "RoPE scaling" },
	{ "rope.scaling.factor", "RoPE scaling factor" },
	{ "rope.scaling.original_context_length", "RoPE original context" },
	{ "attention.layer_norm_rms_epsilon", "RMS norm eps" },
	{ "attention.layer_norm_epsilon", "norm eps" },
	{ "vocab_size", "vocab size" },
	{ "expert_count", "experts" },
	{ "expert_used_count", "experts used" },
	{ "expert_feed_forward_length", "expert FFN length" },
	{ "expert_shared_feed_forward_length", "shared expert FFN" },
	{ "expert_weights_norm", "expert weights norm" },
};

/* general.file_type: llama.cpp's llama_ftype ids (the "mostly" type). */
static const char *const ftype_names[] = {
	[0] = "all f32", [1] = "f16", [2] = "q4_0", [3] = "q4_1", [7] = "q8_0",
	[8] = "q5_0", [9] = "q5_1", [10] = "q2_K", [11] = "q3_K_S", [12] = "q3_K_M",
	[13] = "q3_K_L", [14] = "q4_K_S", [15] = "q4_K_M", [16] = "q5_K_S",
	[17] = "q5_K_M", [18] = "q6_K", [19] = "iq2_xxs", [20] = "iq2_xs",
	[21] = "q2_K_S", [22] = "iq3_xs", [23] = "iq3_xxs", [24] = "iq1_s",
	[25] = "iq4_nl", [26] = "iq3_s", [27] = "iq3_m", [28] = "iq2_s",
	[29] = "iq2_m", [30] = "iq4_xs", [31] = "iq1_m", [32] = "bf16",
	[36] = "tq1_0", [37] = "tq2_0", [38] = "mxfp4_moe",
};

#define LABEL_FMT "  %-24s "
#define TOP_FMT "%-26s "

/* Prints a string value, at most 80 bytes, control bytes shown as '?'. */
static void print_str(FILE *out, struct gguf_str s)
{
	uint64_t n = s.len < 80 ? s.len : 80;

	for (uint64_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		fputc(c < 0x20 || c == 0x7f ? '?' : c, out);
	}
	if (s.len > n)
		fputs("...", out);
}

static void print_value(FILE *out, const struct gguf_kv *kv)
{
	switch (kv->type) {
	case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64:
		fprintf(out, "%" PRIu64, kv->v.u64);
		break;
	case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
		fprintf(out, "%" PRId64, kv->v.i64);
		break;
	case GGUF_F32: case GGUF_F64:
		fprintf(out, "%g", kv->v.f64);
		break;
	case GGUF_BOOL:
		fputs(kv->v.u64 ? "true" : "false", out);
		break;
	case GGUF_STRING:
		print_str(out, kv->v.str);
		break;
	case GGUF_ARRAY:
		/* Per-layer values (e.g. head counts) come as arrays. */
		fprintf(out, "[%" PRIu64 " x %s]", kv->arr_n, gguf_vtype_name(kv->arr_type));
		break;
	}
	fputc('\n', out);
}

/* A value under a section heading (top: a top-level line instead). */
static void print_key_at(FILE *out, const struct gguf_file *f, const char *key,
			 const char *label, bool top)
{
	const struct gguf_kv *kv = gguf_find(f, key);

	if (!kv)
		return;
	fprintf(out, top ? TOP_FMT : LABEL_FMT, label);
	print_value(out, kv);
}

static void print_key(FILE *out, const struct gguf_file *f, const char *key,
		      const char *label)
{
	print_key_at(out, f, key, label, false);
}

static void print_top(FILE *out, const struct gguf_file *f, const char *key,
		      const char *label)
{
	print_key_at(out, f, key, label, true);
}

const char *loom_file_type_name(uint32_t ft)
{
	if (ft < sizeof(ftype_names) / sizeof(ftype_names[0]))
		return ftype_names[ft];
	return NULL;
}

static void print_file_type(FILE *out, const struct gguf_file *f)
{
	const char *name = NULL;
	uint32_t ft;

	if (gguf_get_u32(f, "general.file_type", &ft, NULL, 0) != 0)
		return;
	if (ft < sizeof(ftype_names) / sizeof(ftype_names[0]))
		name = ftype_names[ft];
	fprintf(out, TOP_FMT "%" PRIu32 " (%s)\n", "file type:", ft, name ? name : "?");
}

static void print_arch(FILE *out, const struct gguf_file *f)
{
	const struct gguf_kv *arch = gguf_find(f, "general.architecture");
	char key[256];

	if (!arch || arch->type != GGUF_STRING || arch->v.str.len > 128)
		return;
	fprintf(out, "hyperparameters:\n");
	for (size_t i = 0; i < sizeof(arch_keys) / sizeof(arch_keys[0]); i++) {
		snprintf(key, sizeof(key), "%.*s.%s", (int)arch->v.str.len,
			 arch->v.str.ptr, arch_keys[i].suffix);
		print_key(out, f, key, arch_keys[i].label);
	}
}

static void print_tokenizer(FILE *out, const struct gguf_file *f)
{
	const struct gguf_kv *kv;

	if (!gguf_find(f, "tokenizer.ggml.model"))
		return;
	fprintf(out, "tokenizer:\n");
	print_key(out, f, "tokenizer.ggml.model", "model");
	print_key(out, f, "tokenizer.ggml.pre", "pre-tokenizer");
	kv = gguf_find(f, "tokenizer.ggml.tokens");
	if (kv && kv->type == GGUF_ARRAY)
		fprintf(out, LABEL_FMT "%" PRIu64 "\n", "vocab size", kv->arr_n);
	kv = gguf_find(f, "tokenizer.ggml.merges");
	if (kv && kv->type == GGUF_ARRAY)
		fprintf(out, LABEL_FMT "%" PRIu64 "\n", "merges", kv->arr_n);
	print_key(out, f, "tokenizer.ggml.bos_token_id", "BOS id");
	print_key(out, f, "tokenizer.ggml.eos_token_id", "EOS id");
	if (gguf_find(f, "tokenizer.chat_template"))
		fprintf(out, LABEL_FMT "yes\n", "chat template");
}

/*
 * The routed experts' share (tensors named *_exps, 3-D: one matrix per
 * expert): their bytes, and what one token reads of them, experts used
 * of every expert count (the active bytes a decode step streams).
 */
static void print_experts(FILE *out, const struct gguf_file *f)
{
	uint64_t bytes = 0, active = 0, n_exp = 0, used = 0, n = 0;
	char key[96];
	const struct gguf_kv *arch = gguf_find(f, "general.architecture");

	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];

		if (t->n_dims == 3 && t->name.len >= 12 &&
		    !memcmp(t->name.ptr + t->name.len - 12, "_exps.weight", 12)) {
			bytes += t->nbytes;
			n_exp = (uint64_t)t->ne[2];
			n++;
		}
	}
	if (!n || !arch || arch->type != GGUF_STRING)
		return;
	snprintf(key, sizeof(key), "%.*s.expert_used_count", (int)arch->v.str.len,
		 arch->v.str.ptr);
	if (gguf_find(f, key) && gguf_find(f, key)->type <= GGUF_U32)
		used = gguf_find(f, key)->v.u64; /* u8, i8, u16, i16, u32 */
	if (used && used <= n_exp)
		active = bytes / n_exp * used;
	fprintf(out, "  routed experts %" PRIu64 " tensors %14" PRIu64 " bytes (%.1f MiB; a token reads %" PRIu64
		" of %" PRIu64 " experts: %.1f MiB)\n", n, bytes, bytes / 1048576.0, used, n_exp,
		active / 1048576.0);
}

/* Tensor count and bytes per type, types in id order. */
static void print_tensors(FILE *out, const struct gguf_file *f)
{
	enum { MAX_TYPE = 64 };
	uint64_t count[MAX_TYPE] = { 0 }, bytes[MAX_TYPE] = { 0 };
	uint64_t total = 0, elems = 0;

	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		uint64_t n = 1;
		for (int d = 0; d < GGUF_MAX_DIMS; d++)
			n *= (uint64_t)t->ne[d]; /* checked by gguf_open */
		elems += n;
		total += t->nbytes;
		if (t->type < MAX_TYPE) {
			count[t->type]++;
			bytes[t->type] += t->nbytes;
		}
	}
	fprintf(out, "tensors: %" PRIu64 " (%" PRIu64 " parameters, %" PRIu64
		" bytes, %.1f MiB)\n", f->n_tensors, elems, total, total / 1048576.0);
	print_experts(out, f);
	for (uint32_t ty = 0; ty < MAX_TYPE; ty++) {
		if (!count[ty])
			continue;
		fprintf(out, "  %-8s %6" PRIu64 " tensors %14" PRIu64 " bytes\n",
			gguf_type_name(ty), count[ty], bytes[ty]);
	}
}

int loom_info_print(const char *path, FILE *out, char *err, size_t errlen)
{
	struct gguf_file *f = gguf_open(path, err, errlen);

	if (!f)
		return -1;
	fprintf(out, TOP_FMT "%s\n", "file:", path);
	fprintf(out, TOP_FMT "%" PRIu32 "\n", "GGUF version:", f->version);
	fprintf(out, TOP_FMT "%" PRIu64 " bytes\n", "size:", f->size);
	fprintf(out, TOP_FMT "%" PRIu64 "\n", "metadata keys:", f->n_kv);
	print_top(out, f, "general.architecture", "architecture:");
	print_top(out, f, "general.name", "name:");
	print_top(out, f, "general.size_label", "size label:");
	print_file_type(out, f);
	print_top(out, f, "general.quantization_version", "quantization version:");
	fprintf(out, TOP_FMT "%" PRIu64 "\n", "alignment:", f->alignment);
	print_arch(out, f);
	print_tokenizer(out, f);
	print_tensors(out, f);
	gguf_close(f);
	if (ferror(out)) {
		if (err && errlen)
			snprintf(err, errlen, "%s: error writing the summary", path);
		return -1;
	}
	return 0;
}
