/*
 * ABI layout: every member of every generation-1.0 struct sits at the same
 * offset with the same size in today's headers as in the frozen 1.0 ones,
 * and no struct shrank (later generations only append). Two translation
 * units lay the same member list out, one against tests/abi/v1_0 and one
 * against include/, so a member moved, resized or removed fails here by
 * name. Static checks on today's headers guard the same in any build.
 */
#include <stdio.h>
#include <string.h>

#include "loom/backend.h"
#include "abi_layout.h"

/* A few pins at compile time too (LP64): the table heads and the slots
 * each generation appended, in order. */
_Static_assert(offsetof(struct loom_backend_ops, create) == 24, "create moved");
_Static_assert(offsetof(struct loom_backend_ops, graph_begin) ==
	       offsetof(struct loom_backend_ops, attention) + sizeof(void *),
	       "generation 1.1 must follow 1.0");
_Static_assert(offsetof(struct loom_backend_ops, weight_pack) ==
	       offsetof(struct loom_backend_ops, graph_end) + sizeof(void *),
	       "generation 1.2 must follow 1.1");
_Static_assert(offsetof(struct loom_backend_ops, collective) ==
	       offsetof(struct loom_backend_ops, softcap) + sizeof(void *),
	       "generation 1.4 must follow 1.2 (1.3 added no slot)");
_Static_assert(offsetof(struct loom_backend_ops, moe) ==
	       offsetof(struct loom_backend_ops, collective) + sizeof(void *),
	       "generation 1.6 must follow 1.4 (1.3 and 1.5 added no slot)");
_Static_assert(offsetof(struct loom_backend_ops, argmax) ==
	       offsetof(struct loom_backend_ops, moe) + sizeof(void *),
	       "generation 1.7 must follow 1.6");
_Static_assert(offsetof(struct loom_backend_ops, sample) ==
	       offsetof(struct loom_backend_ops, argmax) + sizeof(void *),
	       "generation 1.8 must follow 1.7");
_Static_assert(offsetof(struct loom_gemm_args, w_packed) == 80, "w_packed moved");
_Static_assert(offsetof(struct loom_backend_host, struct_size) == 4, "host header moved");
/* generation 1.3: kv_type past every 1.2 struct_size (80 and 144), so a
 * backend never reads it from an older host's padding */
_Static_assert(offsetof(struct loom_kv_write_args, kv_type) == 80, "kv_write kv_type moved");
_Static_assert(offsetof(struct loom_attention_args, kv_type) == 144, "attention kv_type moved");
/* generation 1.8: parent (token trees) and sinks (gpt-oss) after the 1.3
 * fields, past every 1.3-1.7 struct_size (152); moe's expert biases past
 * 1.6-1.7's 264 */
_Static_assert(offsetof(struct loom_attention_args, parent) == 152, "attention parent moved");
_Static_assert(offsetof(struct loom_attention_args, sinks) == 160, "attention sinks moved");
_Static_assert(offsetof(struct loom_moe_args, gate_bias) == 264, "moe biases moved");
_Static_assert(LOOM_OP_ATTENTION_TREE == LOOM_OP_EMBED_PACKED + 1, "generation 1.8 op moved");
/* generation 1.9: the sample slot's logprobs after the 1.8 struct (72),
 * the row's logprobs where 1.8 had a reserved 0, and two ops after 1.8's */
_Static_assert(offsetof(struct loom_sample_args, lp) == 72, "sample lp moved");
_Static_assert(LOOM_SAMPLE_ARGS_MIN_SIZE == 72, "a 1.8 host's sample args");
_Static_assert(offsetof(struct loom_sample_row, logprobs) == 36, "sample row logprobs moved");
_Static_assert(LOOM_OP_SAMPLE_FULL == LOOM_OP_GLU_OAI + 1, "generation 1.9 op moved");

/*
 * Today's sizes (LP64), the generation 1.9 headers (1.8 appended
 * attention's parent at 152 and sinks at 160, moe's expert biases at 264;
 * 1.9 the sample args' logprobs at 72): a change here is a new
 * generation (append, update the pin and say so in backend.h) or an ABI
 * break (a major bump), never an accident.
 */
#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(sizeof(struct loom_format_info) == 24, "struct loom_format_info changed size");
_Static_assert(sizeof(struct loom_backend_host) == 40, "struct loom_backend_host changed size");
_Static_assert(sizeof(struct loom_backend_config) == 16, "struct loom_backend_config changed size");
_Static_assert(sizeof(struct loom_device_info) == 144, "struct loom_device_info changed size");
_Static_assert(sizeof(struct loom_gemm_args) == 88, "struct loom_gemm_args changed size");
_Static_assert(sizeof(struct loom_weight_pack_args) == 40, "struct loom_weight_pack_args changed size");
_Static_assert(sizeof(struct loom_rope_args) == 80, "struct loom_rope_args changed size");
_Static_assert(sizeof(struct loom_kv_write_args) == 88, "struct loom_kv_write_args changed size");
_Static_assert(sizeof(struct loom_attention_args) == 168, "struct loom_attention_args changed size");
_Static_assert(sizeof(struct loom_backend_ops) == 248, "struct loom_backend_ops changed size");
_Static_assert(sizeof(struct loom_moe_args) == 288, "struct loom_moe_args changed size");
_Static_assert(sizeof(struct loom_sample_row) == 72, "struct loom_sample_row changed size");
_Static_assert(sizeof(struct loom_sample_args) == 96, "struct loom_sample_args changed size");
_Static_assert(sizeof(struct loom_sample_logprob) == 8, "struct loom_sample_logprob changed size");
_Static_assert(offsetof(struct loom_sample_row, rng) == 40, "loom_sample_row rng moved");
_Static_assert(sizeof(struct loom_collective_args) == 56, "struct loom_collective_args changed size");
#endif

int main(void)
{
	int bad = 0, n = 0;

	for (int i = 0; abi_members_v1_0[i].s; i++, n++) {
		const struct abi_member *a = &abi_members_v1_0[i], *b = &abi_members_now[i];

		if (strcmp(a->s, b->s) || strcmp(a->m, b->m) || a->off != b->off ||
		    a->size != b->size) {
			printf("FAIL struct %s member %s: 1.0 at %zu (%zu bytes), now at %zu (%zu bytes)\n",
			       a->s, a->m, a->off, a->size, b->off, b->size);
			bad++;
		}
	}
	for (int i = 0; abi_structs_v1_0[i].s; i++)
		if (abi_structs_now[i].size < abi_structs_v1_0[i].size) {
			printf("FAIL struct %s shrank: %zu bytes at 1.0, %zu now\n",
			       abi_structs_v1_0[i].s, abi_structs_v1_0[i].size, abi_structs_now[i].size);
			bad++;
		}
	printf("%d generation-1.0 members checked, %d moved\n", n, bad);
	return bad ? 1 : 0;
}
