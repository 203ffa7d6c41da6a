/* Backends: their entry in the one loader (loader.h) and their lifecycle
 * (see backend_loader.h). */
#include "plugin/backend_loader.h"
#include "plugin/loader.h"
#include "util.h"

#include <stdlib.h>

#include "loom_config.h"

#define REQUIRED(slot) LOOM_PLUGIN_SLOT(struct loom_backend_ops, slot)

static const struct loom_plugin_slot required_slots[] = {
	REQUIRED(create), REQUIRED(destroy), REQUIRED(device_info),
	REQUIRED(supports), REQUIRED(buffer_alloc), REQUIRED(buffer_free),
	REQUIRED(buffer_addr), REQUIRED(upload), REQUIRED(download),
	REQUIRED(copy), REQUIRED(synchronize), REQUIRED(gemm), REQUIRED(embed),
	REQUIRED(rmsnorm), REQUIRED(rope), REQUIRED(glu), REQUIRED(add),
	REQUIRED(scale), REQUIRED(kv_write), REQUIRED(attention),
};

/* Size of the generation-1.0 table: everything up to `attention`. */
#define OPS_V1_SIZE (offsetof(struct loom_backend_ops, attention) + sizeof(void *))
/* Generation 1.1 adds graph_begin and graph_end. */
#define OPS_V1_1_SIZE (offsetof(struct loom_backend_ops, graph_end) + sizeof(void *))
/* Where a slot ends: a table at least this large has it. Generation 1.2
 * adds weight_pack and softcap (both optional). */
#define SLOT_END(slot) (offsetof(struct loom_backend_ops, slot) + sizeof(void *))

static const struct loom_plugin_slot optional_slots[] = {
	LOOM_PLUGIN_SLOT(struct loom_backend_ops, graph_begin),
	LOOM_PLUGIN_SLOT(struct loom_backend_ops, graph_end),
	LOOM_PLUGIN_SLOT(struct loom_backend_ops, weight_pack),
	LOOM_PLUGIN_SLOT(struct loom_backend_ops, softcap),
	LOOM_PLUGIN_SLOT(struct loom_backend_ops, collective),
	LOOM_PLUGIN_SLOT(struct loom_backend_ops, moe),
	LOOM_PLUGIN_SLOT(struct loom_backend_ops, argmax),
	LOOM_PLUGIN_SLOT(struct loom_backend_ops, sample),
};

/* Step regions come as a pair (read only where the table has them). */
static int check_graph_pair(const char *path, void *dl, const void *desc, char *err,
			    size_t errlen)
{
	const struct loom_backend_ops *ops = desc;

	(void)dl;
	if (ops->struct_size >= OPS_V1_1_SIZE && !ops->graph_begin != !ops->graph_end) {
		loom_seterr(err, errlen, "backend %s: has %s but not %s", path,
			    ops->graph_begin ? "graph_begin" : "graph_end",
			    ops->graph_begin ? "graph_end" : "graph_begin");
		return -1;
	}
	return 0;
}

static const struct loom_plugin_kind backend_kind = {
	.what = "backend", .desc_name = "ops table", .entry = LOOM_BACKEND_ENTRY,
	/* cpu.so in build/backends/cpu/, gpuemu64.so beside gpuemu.so in gpuemu/ */
	.env = "LOOM_BACKEND_PATH", .build_dir = LOOM_BUILD_ROOT "/backends", .build_subdirs = true,
	.dir = "backends",
	.abi_major = LOOM_BACKEND_ABI_MAJOR, .min_size = OPS_V1_SIZE, .check = check_graph_pair,
	.required = required_slots,
	.n_required = sizeof(required_slots) / sizeof(required_slots[0]),
	.optional = optional_slots,
	.n_optional = sizeof(optional_slots) / sizeof(optional_slots[0]),
};

const struct loom_plugin_kind *loom_backend_plugin_kind(void)
{
	return &backend_kind;
}

int loom_backend_resolve(const char *name, char *path, size_t cap, char *err,
			 size_t errlen)
{
	return loom_plugin_resolve(&backend_kind, name, path, cap, err, errlen);
}

int loom_backend_check_ops(const char *path, const struct loom_backend_ops *ops,
			   char *err, size_t errlen)
{
	return loom_plugin_check(&backend_kind, path, ops, err, errlen);
}

const struct loom_backend_ops *loom_backend_load_ops(const char *name, char *path, size_t cap,
						     char *err, size_t errlen)
{
	void *dl;

	return loom_plugin_open(&backend_kind, name, path, cap, &dl, err, errlen);
}

bool loom_backend_has_graphs(const struct loom_backend *b)
{
	return b->ops->struct_size >= OPS_V1_1_SIZE && b->ops->graph_begin && b->ops->graph_end;
}

bool loom_backend_has_pack(const struct loom_backend *b)
{
	return b->ops->struct_size >= SLOT_END(weight_pack) && b->ops->weight_pack;
}

bool loom_backend_embeds_packed(const struct loom_backend *b, uint32_t type)
{
	return loom_backend_has_pack(b) && b->ops->abi_minor >= 5 &&
	       b->ops->supports(b->ctx, LOOM_OP_EMBED_PACKED, type);
}

bool loom_backend_has_softcap(const struct loom_backend *b)
{
	return b->ops->struct_size >= SLOT_END(softcap) && b->ops->softcap;
}

bool loom_backend_has_argmax(const struct loom_backend *b)
{
	return b->ops->struct_size >= SLOT_END(argmax) && b->ops->argmax;
}

bool loom_backend_has_tree(const struct loom_backend *b, uint32_t kv_type)
{
	return b->ops->abi_minor >= 8 && b->ops->supports(b->ctx, LOOM_OP_ATTENTION_TREE, kv_type);
}

bool loom_backend_has_sample(const struct loom_backend *b)
{
	return b->ops->struct_size >= SLOT_END(sample) && b->ops->sample;
}

bool loom_backend_has_sample_full(const struct loom_backend *b)
{
	return loom_backend_has_sample(b) && b->ops->abi_minor >= 9 &&
	       b->ops->supports(b->ctx, LOOM_OP_SAMPLE_FULL, LOOM_TYPE_F32);
}

bool loom_backend_has_sample_logprobs(const struct loom_backend *b)
{
	return loom_backend_has_sample(b) && b->ops->abi_minor >= 9 &&
	       b->ops->supports(b->ctx, LOOM_OP_SAMPLE_LOGPROBS, LOOM_TYPE_F32);
}

bool loom_backend_has_collective(const struct loom_backend *b)
{
	return b->ops->struct_size >= SLOT_END(collective) && b->ops->collective;
}

bool loom_backend_has_moe(const struct loom_backend *b)
{
	return b->ops->struct_size >= SLOT_END(moe) && b->ops->moe;
}

static const char *create_failure(int rc)
{
	return rc == LOOM_ERR_DEVICE ? "no usable device or driver found" :
	       rc == LOOM_ERR_NOMEM ? "out of memory" : "error";
}

struct loom_backend *loom_backend_open(const char *name,
				       const struct loom_backend_config *cfg,
				       char *err, size_t errlen)
{
	struct loom_backend *b = calloc(1, sizeof(*b));
	int rc;

	if (!b) {
		loom_seterr(err, errlen, "backend %s: out of memory", name);
		return NULL;
	}
	b->ops = loom_plugin_open(&backend_kind, name, b->path, sizeof(b->path), &b->dl, err,
				  errlen);
	if (!b->ops)
		goto out_free;
	/* the first call with side effects, after every check */
	rc = b->ops->create(loom_host_services(), cfg, &b->ctx);
	if (rc) {
		loom_seterr(err, errlen, "backend %s: initialization failed (%s)", b->path,
			    create_failure(rc));
		goto out_free; /* create() ran: the plugin stays loaded (loader.h) */
	}
	return b;

out_free:
	free(b);
	return NULL;
}

void loom_backend_close(struct loom_backend *b)
{
	if (!b)
		return;
	if (b->ctx)
		b->ops->destroy(b->ctx);
	free(b); /* never dlclose (loader.h) */
}
