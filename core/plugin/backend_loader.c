/* Backend and quantization-plugin loading (see backend_loader.h). */
#include "plugin/backend_loader.h"
#include "util.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom_config.h"

static bool is_file(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Joins dir and name into out; false if it does not fit. */
static bool join_path(char *out, size_t cap, const char *dir, const char *name)
{
	int n = snprintf(out, cap, "%s/%s", dir, name);

	return n > 0 && (size_t)n < cap;
}

/* Calls fn on each folder of a colon-separated list until fn returns
 * non-zero; returns that value, or 0. Empty entries are skipped. */
static int each_dir(const char *list, int (*fn)(const char *dir, void *ctx), void *ctx)
{
	char dir[4096];
	const char *p = list;
	int rc;

	while (p && *p) {
		const char *end = strchr(p, ':');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len > 0 && len < sizeof(dir)) {
			memcpy(dir, p, len);
			dir[len] = '\0';
			rc = fn(dir, ctx);
			if (rc)
				return rc;
		}
		p = end ? end + 1 : NULL;
	}
	return 0;
}

struct search {
	const char *name;
	char *out;
	size_t cap;
};

static int search_dir(const char *dir, void *ctx)
{
	struct search *s = ctx;

	return join_path(s->out, s->cap, dir, s->name) && is_file(s->out);
}

static bool search_list(const char *list, const char *name, char *out, size_t cap)
{
	struct search s = { name, out, cap };

	return each_dir(list, search_dir, &s) == 1;
}

/* The build tree keeps each backend in a folder of build/backends/
 * (cpu.so in cpu/, gpuemu64.so beside gpuemu.so in gpuemu/): look in each. */
static bool search_build_tree(const char *name, char *out, size_t cap)
{
	char dir[4096];
	struct dirent *de;
	DIR *d = opendir(LOOM_BUILD_ROOT "/backends");
	bool found = false;

	if (!d)
		return false;
	while (!found && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(dir, sizeof(dir), "%s/backends/%s", LOOM_BUILD_ROOT, de->d_name);
		found = join_path(out, cap, dir, name) && is_file(out);
	}
	closedir(d);
	return found;
}

int loom_backend_resolve(const char *name, char *path, size_t cap, char *err,
			 size_t errlen)
{
	if (!name || !*name) {
		loom_seterr(err, errlen, "backend: empty name");
		return -1;
	}
	if (strchr(name, '/')) {
		if (snprintf(path, cap, "%s", name) >= (int)cap) {
			loom_seterr(err, errlen, "backend %s: path too long", name);
			return -1;
		}
		return 0;
	}
	if (search_list(getenv("LOOM_BACKEND_PATH"), name, path, cap))
		return 0;
	if (search_build_tree(name, path, cap))
		return 0;
	if (join_path(path, cap, LOOM_INSTALL_BACKENDS, name) && is_file(path))
		return 0;
	loom_seterr(err, errlen,
		"backend %s: not found in $LOOM_BACKEND_PATH, %s/backends/*/ or %s/",
		name, LOOM_BUILD_ROOT, LOOM_INSTALL_BACKENDS);
	return -1;
}

/* Tells "not a shared object" apart from dlopen's other failures, so the
 * message says what is wrong with the file rather than only dlerror(). */
static int check_elf(const char *path, char *err, size_t errlen)
{
	unsigned char magic[4];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0) {
		loom_seterr(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	n = read(fd, magic, sizeof(magic));
	close(fd);
	if (n != 4 || memcmp(magic, "\177ELF", 4) != 0) {
		loom_seterr(err, errlen, "%s: not an ELF shared object", path);
		return -1;
	}
	return 0;
}

/* Opens a plugin file and returns its entry symbol (NULL with err set). */
static void *open_entry(const char *path, const char *symbol, void **dl,
			char *err, size_t errlen)
{
	void *sym;

	if (check_elf(path, err, errlen))
		return NULL;
	*dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!*dl) {
		loom_seterr(err, errlen, "%s: cannot load: %s", path, dlerror());
		return NULL;
	}
	sym = dlsym(*dl, symbol);
	if (!sym) {
		loom_seterr(err, errlen, "%s: no entry symbol %s", path, symbol);
		dlclose(*dl);
		*dl = NULL;
	}
	return sym;
}

#define REQUIRED(slot) { #slot, offsetof(struct loom_backend_ops, slot) }

static const struct {
	const char *name;
	size_t offset;
} required_slots[] = {
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

int loom_backend_check_ops(const char *path, const struct loom_backend_ops *ops,
			   char *err, size_t errlen)
{
	size_t i;

	if (!ops) {
		loom_seterr(err, errlen, "backend %s: entry returned no ops table", path);
		return -1;
	}
	if (ops->abi_major != LOOM_BACKEND_ABI_MAJOR) {
		loom_seterr(err, errlen, "backend %s: ABI major %u, this loom needs %u",
			path, ops->abi_major, LOOM_BACKEND_ABI_MAJOR);
		return -1;
	}
	if (ops->struct_size < OPS_V1_SIZE) {
		loom_seterr(err, errlen,
			"backend %s: ops table of %u bytes, ABI 1.0 needs at least %zu",
			path, ops->struct_size, (size_t)OPS_V1_SIZE);
		return -1;
	}
	for (i = 0; i < sizeof(required_slots) / sizeof(required_slots[0]); i++) {
		void *const *slot = (void *const *)((const char *)ops +
						    required_slots[i].offset);
		if (!*slot) {
			loom_seterr(err, errlen, "backend %s: required operation %s is missing",
				path, required_slots[i].name);
			return -1;
		}
	}
	if (ops->struct_size >= OPS_V1_1_SIZE && !ops->graph_begin != !ops->graph_end) {
		loom_seterr(err, errlen, "backend %s: has %s but not %s", path,
			ops->graph_begin ? "graph_begin" : "graph_end",
			ops->graph_begin ? "graph_end" : "graph_begin");
		return -1;
	}
	return 0;
}

bool loom_backend_has_graphs(const struct loom_backend *b)
{
	return b->ops->struct_size >= OPS_V1_1_SIZE && b->ops->graph_begin && b->ops->graph_end;
}

struct loom_backend *loom_backend_open(const char *name,
				       const struct loom_backend_config *cfg,
				       char *err, size_t errlen)
{
	struct loom_backend *b = calloc(1, sizeof(*b));
	loom_backend_entry_fn entry;
	int rc;

	if (!b) {
		loom_seterr(err, errlen, "backend %s: out of memory", name);
		return NULL;
	}
	if (loom_backend_resolve(name, b->path, sizeof(b->path), err, errlen))
		goto out_free;
	entry = (loom_backend_entry_fn)open_entry(b->path, LOOM_BACKEND_ENTRY,
						  &b->dl, err, errlen);
	if (!entry)
		goto out_free;
	b->ops = entry();
	if (loom_backend_check_ops(b->path, b->ops, err, errlen))
		goto out_close;
	rc = b->ops->create(loom_host_services(), cfg, &b->ctx);
	if (rc) {
		loom_seterr(err, errlen, "backend %s: initialization failed (%s)", b->path,
			rc == LOOM_ERR_DEVICE ? "no usable device or driver found" :
			rc == LOOM_ERR_NOMEM ? "out of memory" : "error");
		goto out_close;
	}
	return b;

out_close:
	dlclose(b->dl);
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
	/* Never dlclose: a backend's threads or atexit handlers may outlive
	 * the context (STYLE.md: plugins are not unloaded while in use). */
	free(b);
}

/* ---- quantization format registry ---- */

static const struct loom_quant_format *formats[LOOM_TYPE_COUNT];
static struct loom_format_info format_infos[LOOM_TYPE_COUNT];
static pthread_mutex_t formats_lock = PTHREAD_MUTEX_INITIALIZER;
static bool formats_scanned;

#define QUANT_V1_SIZE (offsetof(struct loom_quant_plugin, formats) + sizeof(void *))

static int check_quant(const char *path, const struct loom_quant_plugin *p,
		       char *err, size_t errlen)
{
	uint32_t i;

	if (!p) {
		loom_seterr(err, errlen, "quant plugin %s: entry returned no descriptor", path);
		return -1;
	}
	if (p->abi_major != LOOM_PLUGIN_ABI_MAJOR) {
		loom_seterr(err, errlen, "quant plugin %s: ABI major %u, this loom needs %u",
			path, p->abi_major, LOOM_PLUGIN_ABI_MAJOR);
		return -1;
	}
	if (p->struct_size < QUANT_V1_SIZE || (p->n_formats && !p->formats)) {
		loom_seterr(err, errlen, "quant plugin %s: descriptor too small or empty", path);
		return -1;
	}
	for (i = 0; i < p->n_formats; i++) {
		const struct loom_quant_format *f = &p->formats[i];

		if (f->type >= LOOM_TYPE_COUNT || !f->to_float || !f->from_float ||
		    !f->block_elems || !f->block_bytes || !f->name) {
			loom_seterr(err, errlen, "quant plugin %s: format %u is incomplete",
				path, i);
			return -1;
		}
	}
	return 0;
}

static int register_plugin(const char *path, char *err, size_t errlen)
{
	loom_quant_entry_fn entry;
	const struct loom_quant_plugin *p;
	void *dl = NULL;
	uint32_t i;

	entry = (loom_quant_entry_fn)open_entry(path, LOOM_QUANT_ENTRY, &dl, err, errlen);
	if (!entry)
		return -1;
	p = entry();
	if (check_quant(path, p, err, errlen)) {
		dlclose(dl);
		return -1;
	}
	for (i = 0; i < p->n_formats; i++) {
		const struct loom_quant_format *f = &p->formats[i];

		formats[f->type] = f;
		format_infos[f->type] = (struct loom_format_info){
			.type = f->type, .block_elems = f->block_elems,
			.block_bytes = f->block_bytes, .name = f->name,
		};
	}
	return 0; /* dl stays open: the registry points into it */
}

int loom_formats_load_plugin(const char *path, char *err, size_t errlen)
{
	int rc;

	pthread_mutex_lock(&formats_lock);
	rc = register_plugin(path, err, errlen);
	pthread_mutex_unlock(&formats_lock);
	return rc;
}

static bool has_so_suffix(const char *name)
{
	size_t len = strlen(name);

	return len > 3 && strcmp(name + len - 3, ".so") == 0;
}

/* Registers every *.so in dir; returns -1 on the first bad plugin. */
static int scan_dir(const char *dir, int *found, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4096];
	int rc = 0;

	if (!d)
		return 0;
	while (rc == 0 && (e = readdir(d))) {
		if (!has_so_suffix(e->d_name) || !join_path(path, sizeof(path), dir, e->d_name))
			continue;
		rc = register_plugin(path, err, errlen);
		(*found)++;
	}
	closedir(d);
	return rc;
}

struct scan {
	int *found;
	char *err;
	size_t errlen;
};

static int scan_one(const char *dir, void *ctx)
{
	struct scan *s = ctx;

	return scan_dir(dir, s->found, s->err, s->errlen);
}

static int scan_list(const char *list, int *found, char *err, size_t errlen)
{
	struct scan s = { found, err, errlen };

	return each_dir(list, scan_one, &s);
}

int loom_formats_init(char *err, size_t errlen)
{
	int found = 0, rc = 0;

	pthread_mutex_lock(&formats_lock);
	if (formats_scanned)
		goto out_unlock;
	/* Built-in formats first (build tree, else the installed prefix), then
	 * third-party folders, which may override a built-in format. */
	rc = scan_dir(LOOM_BUILD_ROOT "/plugins/quant", &found, err, errlen);
	if (!rc && !found)
		rc = scan_dir(LOOM_INSTALL_QUANT, &found, err, errlen);
	if (!rc)
		rc = scan_list(getenv("LOOM_QUANT_PATH"), &found, err, errlen);
	if (!rc && !found) {
		loom_seterr(err, errlen,
			"no quantization plugins found in $LOOM_QUANT_PATH, %s/plugins/quant or %s",
			LOOM_BUILD_ROOT, LOOM_INSTALL_QUANT);
		rc = -1;
	}
	formats_scanned = rc == 0;
out_unlock:
	pthread_mutex_unlock(&formats_lock);
	return rc;
}

const struct loom_quant_format *loom_format_get(uint32_t type)
{
	return type < LOOM_TYPE_COUNT ? formats[type] : NULL;
}

/* ---- host services lent to backends ---- */

static void host_log(void *host, enum loom_log_level level, const char *msg)
{
	loom_log(level, "%s", msg);
}

static const struct loom_format_info *host_format_info(void *host, uint32_t type)
{
	return type < LOOM_TYPE_COUNT && formats[type] ? &format_infos[type] : NULL;
}

static int host_to_float(void *host, uint32_t type, const void *src, float *dst,
			 int64_t n)
{
	const struct loom_quant_format *f = loom_format_get(type);

	if (!f)
		return LOOM_ERR_UNSUPPORTED;
	return f->to_float(src, dst, n);
}

static const struct loom_backend_host host_services = {
	.abi_major = LOOM_BACKEND_ABI_MAJOR,
	.struct_size = sizeof(struct loom_backend_host),
	.host = NULL,
	.log = host_log,
	.format_info = host_format_info,
	.to_float = host_to_float,
};

const struct loom_backend_host *loom_host_services(void)
{
	return &host_services;
}
