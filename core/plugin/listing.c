/* The plugin search path and what is on it, for the public API (loom.h):
 * loom_plugin_path and loom_backends_list, which `loom backends` prints. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "plugin/backend_loader.h"
#include "plugin/host.h"
#include "plugin/loader.h"

static const struct loom_plugin_kind *kind_named(const char *kind)
{
	if (!kind)
		return NULL;
	if (!strcmp(kind, "backends"))
		return loom_backend_plugin_kind();
	if (!strcmp(kind, "quant"))
		return loom_quant_plugin_kind();
	if (!strcmp(kind, "spec"))
		return loom_spec_plugin_kind();
	return NULL;
}

struct path_text {
	char *out;
	size_t cap, len;
	bool overflow;
};

static int add_to_path(const char *dir, void *ctx)
{
	struct path_text *t = ctx;
	int n = snprintf(t->out + t->len, t->cap - t->len, "%s%s", t->len ? ":" : "", dir);

	if (n < 0 || (size_t)n >= t->cap - t->len) {
		t->overflow = true;
		return 1;
	}
	t->len += (size_t)n;
	return 0;
}

int loom_plugin_path(const char *kind, char *out, size_t cap)
{
	const struct loom_plugin_kind *k = kind_named(kind);
	struct path_text t = { .out = out, .cap = cap };

	if (!k || !out || cap == 0)
		return -1;
	out[0] = '\0';
	if (loom_plugin_each_folder(k, add_to_path, &t) || t.overflow)
		return -1;
	return 0;
}

/* ---- loom_backends_list ---- */

/* Appends word to a space-separated list in buf (cap bytes). */
static void add_word(char *buf, size_t cap, const char *word)
{
	size_t len = strlen(buf);

	snprintf(buf + len, cap - len, "%s%s", len ? " " : "", word);
}

static const char *const op_names[LOOM_OP_COUNT] = {
	[LOOM_OP_GEMM] = "gemm", [LOOM_OP_EMBED] = "embed", [LOOM_OP_RMSNORM] = "rmsnorm",
	[LOOM_OP_ROPE] = "rope", [LOOM_OP_GLU] = "glu", [LOOM_OP_ADD] = "add",
	[LOOM_OP_SCALE] = "scale", [LOOM_OP_KV_WRITE] = "kv_write",
	[LOOM_OP_ATTENTION] = "attention", [LOOM_OP_COPY] = "copy",
	[LOOM_OP_SOFTCAP] = "softcap", [LOOM_OP_ATTENTION_TREE] = "attention_tree",
};

/* The weight formats op runs, by the names the quant plugins give them. */
static void list_formats(const struct loom_backend *b, enum loom_op op, char *buf,
			 size_t cap)
{
	for (uint32_t type = 0; type < LOOM_TYPE_COUNT; type++) {
		const struct loom_quant_format *qf = loom_format_get(type);
		const char *name = type == LOOM_TYPE_F32 ? "f32" : qf ? qf->name : NULL;

		if (name && b->ops->supports(b->ctx, op, type))
			add_word(buf, cap, name);
	}
}

/* What a created backend says about itself. */
static void describe(const struct loom_backend *b, struct loom_backend_listing *l)
{
	struct loom_device_info info = { 0 };

	if (b->ops->device_info(b->ctx, &info) == LOOM_OK) {
		snprintf(l->device, sizeof(l->device), "%.*s", (int)sizeof(info.name), info.name);
		l->mem_total = info.mem_total;
		l->mem_free = info.mem_free;
	}
	list_formats(b, LOOM_OP_GEMM, l->gemm_formats, sizeof(l->gemm_formats));
	list_formats(b, LOOM_OP_EMBED, l->embed_formats, sizeof(l->embed_formats));
	for (int op = LOOM_OP_RMSNORM; op < LOOM_OP_COUNT; op++)
		if (op_names[op] && b->ops->supports(b->ctx, op, LOOM_TYPE_F32))
			add_word(l->ops, sizeof(l->ops), op_names[op]);
	if (loom_backend_has_graphs(b))
		add_word(l->optional, sizeof(l->optional), "graph_begin graph_end");
	if (loom_backend_has_pack(b))
		add_word(l->optional, sizeof(l->optional), "weight_pack");
	if (loom_backend_has_softcap(b))
		add_word(l->optional, sizeof(l->optional), "softcap");
	if (loom_backend_has_collective(b))
		add_word(l->optional, sizeof(l->optional), "collective");
	if (loom_backend_has_moe(b))
		add_word(l->optional, sizeof(l->optional), "moe");
	if (loom_backend_has_argmax(b))
		add_word(l->optional, sizeof(l->optional), "argmax");
	if (loom_backend_has_sample(b))
		add_word(l->optional, sizeof(l->optional), "sample");
	if (loom_backend_has_sample_full(b)) /* ABI 1.9 */
		add_word(l->optional, sizeof(l->optional), "sample_full");
	if (loom_backend_has_sample_logprobs(b))
		add_word(l->optional, sizeof(l->optional), "sample_logprobs");
}

#define MAX_SEEN 256

struct listing {
	loom_backend_list_fn fn;
	void *user;
	char seen[MAX_SEEN][256];  /* file names met so far */
	char seen_path[MAX_SEEN][1024];
	int n_seen, n_files;
};

/* The path of an earlier file named like this one, or NULL (and remember). */
static const char *shadowing(struct listing *ls, const char *file, const char *path)
{
	for (int i = 0; i < ls->n_seen; i++)
		if (!strcmp(ls->seen[i], file))
			return ls->seen_path[i];
	if (ls->n_seen < MAX_SEEN) {
		snprintf(ls->seen[ls->n_seen], sizeof(ls->seen[0]), "%s", file);
		snprintf(ls->seen_path[ls->n_seen++], sizeof(ls->seen_path[0]), "%s", path);
	}
	return NULL;
}

static void list_file(struct listing *ls, const char *path, const char *file)
{
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg) };
	struct loom_backend_listing l = { .path = path };
	char err[4096] = "", cerr[4096] = "", resolved[4096];
	const struct loom_backend_ops *ops;
	struct loom_backend *b;

	l.shadowed_by = shadowing(ls, file, path);
	ops = loom_backend_load_ops(path, resolved, sizeof(resolved), err, sizeof(err));
	if (!ops) {
		l.refused = err;
		ls->fn(ls->user, &l);
		return;
	}
	l.name = ops->name ? ops->name : file;
	l.abi_major = ops->abi_major;
	l.abi_minor = ops->abi_minor;
	l.struct_size = ops->struct_size;
	b = loom_backend_open(path, &cfg, cerr, sizeof(cerr));
	if (b)
		describe(b, &l);
	else
		l.create_error = cerr;
	ls->fn(ls->user, &l);
	loom_backend_close(b);
}

static int so_filter(const struct dirent *e)
{
	size_t len = strlen(e->d_name);

	return len > 3 && !strcmp(e->d_name + len - 3, ".so");
}

static int list_folder(const char *dir, void *ctx)
{
	struct listing *ls = ctx;
	struct dirent **names;
	char path[4096];
	int n = scandir(dir, &names, so_filter, alphasort);

	for (int i = 0; i < n; i++) {
		if (snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name) <
		    (int)sizeof(path)) {
			list_file(ls, path, names[i]->d_name);
			ls->n_files++;
		}
		free(names[i]);
	}
	if (n >= 0)
		free(names);
	return 0;
}

int loom_backends_list(loom_backend_list_fn fn, void *user, char *err, size_t errlen)
{
	struct listing *ls = calloc(1, sizeof(*ls));
	char ferr[4096];
	int found;

	if (!ls) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	ls->fn = fn;
	ls->user = user;
	/* format names come from the quant plugins; without them, f32 only */
	loom_formats_init(ferr, sizeof(ferr));
	loom_plugin_each_folder(loom_backend_plugin_kind(), list_folder, ls);
	found = ls->n_files;
	free(ls);
	if (!found) {
		char path[8192];

		if (loom_plugin_path("backends", path, sizeof(path)))
			snprintf(path, sizeof(path), "(too long to show)");
		snprintf(err, errlen, "no backend found in the search path %s", path);
		return -1;
	}
	return 0;
}
