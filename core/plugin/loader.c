/* The one plugin loader (see loader.h). */
#include "plugin/loader.h"
#include "plugin/mapcheck.h"
#include "util.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <pthread.h>
#include <unistd.h>

#include "loom_config.h"

#include "loom/backend.h"
#include "loom/plugin.h"
#include "loom/qstrategy.h"
#include "loom/spec.h"

/* Every descriptor starts with these three fields, whatever its kind, so
 * the common checks read them through this view. */
struct plugin_head {
	uint32_t abi_major;
	uint32_t abi_minor;
	uint32_t struct_size;
	const char *name;
};

#define HEAD_MATCHES(type)                                                    \
	_Static_assert(offsetof(type, abi_major) == 0 &&                      \
		       offsetof(type, abi_minor) == 4 &&                      \
		       offsetof(type, struct_size) == 8 &&                    \
		       offsetof(type, name) == offsetof(struct plugin_head, name), \
		       #type " does not start as every plugin descriptor does")
HEAD_MATCHES(struct loom_backend_ops);
HEAD_MATCHES(struct loom_quant_plugin);
HEAD_MATCHES(struct loom_spec_plugin);
HEAD_MATCHES(struct loom_qstrategy);

#define NAME_MAX_BYTES 256 /* a plugin's name, NUL included */

/* ---- folders ---- */

static bool is_file(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_so_suffix(const char *name)
{
	size_t len = strlen(name);

	return len > 3 && strcmp(name + len - 3, ".so") == 0;
}

/* Joins dir and name into out; false if it does not fit. */
static bool join_path(char *out, size_t cap, const char *dir, const char *name)
{
	int n = snprintf(out, cap, "%s/%s", dir, name);

	return n > 0 && (size_t)n < cap;
}

/* Where the running executable and the build tree are, resolved once. */
static char exe_dir[4096];
static bool from_build_tree;
static pthread_once_t where_once = PTHREAD_ONCE_INIT;

static void find_where(void)
{
	char exe[4096], build[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	char *slash;
	size_t len;

	if (n <= 0)
		return;
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	if (!slash)
		return;
	*slash = '\0';
	snprintf(exe_dir, sizeof(exe_dir), "%s", exe[0] ? exe : "/");
	/* /proc/self/exe is canonical; the configured build root may not be */
	if (!realpath(LOOM_BUILD_ROOT, build))
		return;
	len = strlen(build);
	from_build_tree = strncmp(exe_dir, build, len) == 0 &&
			  (exe_dir[len] == '/' || exe_dir[len] == '\0');
}

bool loom_plugin_in_build_tree(void)
{
	pthread_once(&where_once, find_where);
	return from_build_tree;
}

/* For a program linked with libloom.so (include/loom.h): <libdir>/loom/<dir>
 * beside the library itself, when the core is in a shared object other
 * than the executable and that folder exists. */
static bool beside_library(const struct loom_plugin_kind *k, char *out, size_t cap)
{
	char lib[PATH_MAX], exe[PATH_MAX], dir[PATH_MAX + 64];
	Dl_info info;
	char *slash;

	if (!dladdr((void *)beside_library, &info) || !info.dli_fname ||
	    !realpath(info.dli_fname, lib) || !realpath("/proc/self/exe", exe) ||
	    !strcmp(lib, exe) || !(slash = strrchr(lib, '/')))
		return false;
	*slash = '\0';
	snprintf(dir, sizeof(dir), "%s/loom/%s", lib, k->dir);
	return is_dir(dir) && cap >= PATH_MAX && realpath(dir, out);
}

/* The installed folder: beside the executable's prefix when it exists
 * there (a DESTDIR or moved install), else the configured one. */
static void installed_folder(const struct loom_plugin_kind *k, char *out, size_t cap)
{
	pthread_once(&where_once, find_where);
	char beside[4096];

	if (exe_dir[0] && LOOM_BINDIR_TO_LIBDIR[0]) {
		snprintf(beside, sizeof(beside), "%s/%s/loom/%s", exe_dir, LOOM_BINDIR_TO_LIBDIR,
			 k->dir);
		/* canonical, so messages show <prefix>/lib/..., not bin/../lib */
		if (is_dir(beside) && cap >= PATH_MAX && realpath(beside, out))
			return;
	}
	if (beside_library(k, out, cap))
		return;
	snprintf(out, cap, "%s/loom/%s", LOOM_INSTALL_LIBDIR, k->dir);
}

/* ${XDG_DATA_HOME:-$HOME/.local/share}/loom/<dir>; false without either
 * (a relative XDG_DATA_HOME is ignored, as the XDG spec asks). */
static bool user_folder(const struct loom_plugin_kind *k, char *out, size_t cap)
{
	const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
	int n;

	if (xdg && xdg[0] == '/')
		n = snprintf(out, cap, "%s/loom/%s", xdg, k->dir);
	else if (home && home[0] == '/')
		n = snprintf(out, cap, "%s/.local/share/loom/%s", home, k->dir);
	else
		return false;
	return n > 0 && (size_t)n < cap;
}

/* The search path as a list of folders, in search order. */
#define MAX_FOLDERS 64

struct folders {
	char dir[MAX_FOLDERS][1024];
	int n;
};

static void add_folder(struct folders *f, const char *dir)
{
	if (f->n < MAX_FOLDERS && strlen(dir) < sizeof(f->dir[0]))
		snprintf(f->dir[f->n++], sizeof(f->dir[0]), "%s", dir);
}

/* Each folder of a colon-separated list; empty entries are skipped. */
static void add_listed(struct folders *f, const char *list)
{
	const char *p = list;

	while (p && *p) {
		const char *end = strchr(p, ':');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char dir[1024];

		if (len > 0 && len < sizeof(dir)) {
			memcpy(dir, p, len);
			dir[len] = '\0';
			add_folder(f, dir);
		}
		p = end ? end + 1 : NULL;
	}
}

/* Each subfolder of dir (build/backends/cpu/, build/backends/gpuemu/...),
 * in name order so that the search does not depend on the file system. */
static void add_subdirs(struct folders *f, const char *dir)
{
	struct dirent **list;
	char sub[4096];
	int n = scandir(dir, &list, NULL, alphasort);

	for (int i = 0; i < n; i++) {
		if (list[i]->d_name[0] != '.' && join_path(sub, sizeof(sub), dir, list[i]->d_name) &&
		    is_dir(sub))
			add_folder(f, sub);
		free(list[i]);
	}
	if (n >= 0)
		free(list);
}

/* The kind's search path (loader.h): malloc'd, NULL when out of memory. */
static struct folders *search_path(const struct loom_plugin_kind *k)
{
	struct folders *f = calloc(1, sizeof(*f));
	char dir[4096];

	if (!f)
		return NULL;
	add_listed(f, getenv(k->env));
	if (user_folder(k, dir, sizeof(dir)))
		add_folder(f, dir);
	if (!loom_plugin_in_build_tree()) {
		installed_folder(k, dir, sizeof(dir));
		add_folder(f, dir);
	} else if (k->build_subdirs) {
		add_subdirs(f, k->build_dir);
	} else {
		add_folder(f, k->build_dir);
	}
	return f;
}

int loom_plugin_each_folder(const struct loom_plugin_kind *k, loom_plugin_folder_fn fn,
			    void *ctx)
{
	struct folders *f = search_path(k);
	int rc = 0;

	if (!f)
		return -1;
	for (int i = 0; i < f->n && !rc; i++)
		rc = fn(f->dir[i], ctx);
	free(f);
	return rc;
}

/* "$LOOM_X_PATH (a, b), c, d", for messages. */
static const char *folders_text(const struct loom_plugin_kind *k, char *buf, size_t cap)
{
	struct folders *f = search_path(k);
	size_t len;

	snprintf(buf, cap, "$%s", k->env);
	if (!f)
		return buf;
	for (int i = 0; i < f->n; i++) {
		len = strlen(buf);
		snprintf(buf + len, cap - len, "%s%s", i ? ", " : ": ", f->dir[i]);
	}
	free(f);
	return buf;
}

/* ---- resolve ---- */

struct lookup {
	const char *file;
	char *path;
	size_t cap;
};

static int try_folder(const char *dir, void *ctx)
{
	struct lookup *l = ctx;

	return join_path(l->path, l->cap, dir, l->file) && is_file(l->path);
}

static int explicit_path(const struct loom_plugin_kind *k, const char *name, char *path,
			 size_t cap, char *err, size_t errlen)
{
	struct stat st;

	if (snprintf(path, cap, "%s", name) >= (int)cap) {
		loom_seterr(err, errlen, "%s %s: path too long", k->what, name);
		return -1;
	}
	if (stat(path, &st)) {
		loom_seterr(err, errlen, "%s %s: %s", k->what, path, strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		loom_seterr(err, errlen, "%s %s: not a regular file", k->what, path);
		return -1;
	}
	return 0;
}

int loom_plugin_resolve(const struct loom_plugin_kind *k, const char *name, char *path,
			size_t cap, char *err, size_t errlen)
{
	char file[1024], where[8192];
	struct lookup l = { .file = file, .path = path, .cap = cap };
	bool add;

	if (!name || !*name) {
		loom_seterr(err, errlen, "%s: empty name", k->what);
		return -1;
	}
	if (strchr(name, '/'))
		return explicit_path(k, name, path, cap, err, errlen);
	/* "ngram" and "ngram.so" both name ngram.so where the kind says so */
	add = k->add_suffix && !has_so_suffix(name);
	if (snprintf(file, sizeof(file), "%s%s", name, add ? ".so" : "") >= (int)sizeof(file)) {
		loom_seterr(err, errlen, "%s %s: name too long", k->what, name);
		return -1;
	}
	if (loom_plugin_each_folder(k, try_folder, &l) == 1)
		return 0;
	loom_seterr(err, errlen, "%s %s: not found in %s", k->what, file,
		    folders_text(k, where, sizeof(where)));
	return -1;
}

/* ---- load ---- */

/* Tells "not a shared object" and "built for another machine" apart from
 * dlopen's other failures, so the message says what is wrong with the
 * file rather than only dlerror(). */
static int check_elf(const struct loom_plugin_kind *k, const char *path, char *err,
		     size_t errlen)
{
	char why[128] = "";

	switch (loom_elf_inspect(path, why, sizeof(why))) {
	case ELF_OK:
		return 0;
	case ELF_UNREADABLE:
		loom_seterr(err, errlen, "%s %s: %s", k->what, path, strerror(errno));
		return -1;
	case ELF_FOREIGN:
		loom_seterr(err, errlen, "%s %s: %s", k->what, path, why);
		return -1;
	default:
		loom_seterr(err, errlen, "%s %s: not an ELF shared object", k->what, path);
		return -1;
	}
}

/* Slot s of desc is NULL or code of the plugin (dl; NULL: any object). */
static int check_slot(const struct loom_plugin_kind *k, const char *path, void *dl,
		      const void *desc, const struct loom_plugin_slot *s, char *err, size_t errlen)
{
	void *const *slot = (void *const *)((const char *)desc + s->offset);

	if (!*slot || loom_map_in_object(dl, *slot, 1, true))
		return 0;
	loom_seterr(err, errlen, "%s %s: bad %s: slot %s (%p) points outside %s", k->what, path,
		    k->desc_name, s->name, *slot,
		    dl ? "the plugin's own code" : "any loaded code");
	return -1;
}

/* Every required slot is set and code, every optional slot the table has
 * is NULL or code: a garbage table fails here, before any call through
 * it. */
static int check_slots(const struct loom_plugin_kind *k, const char *path, void *dl,
		       const void *desc, char *err, size_t errlen)
{
	const struct plugin_head *h = desc;

	for (size_t i = 0; i < k->n_required; i++) {
		void *const *slot = (void *const *)((const char *)desc + k->required[i].offset);

		if (!*slot) {
			loom_seterr(err, errlen, "%s %s: required slot %s is missing", k->what,
				    path, k->required[i].name);
			return -1;
		}
		if (check_slot(k, path, dl, desc, &k->required[i], err, errlen))
			return -1;
	}
	for (size_t i = 0; i < k->n_optional; i++) {
		if (h->struct_size < k->optional[i].offset + sizeof(void *))
			continue; /* an older generation's table: the host never reads it */
		if (check_slot(k, path, dl, desc, &k->optional[i], err, errlen))
			return -1;
	}
	return 0;
}

/* The name is NULL (where allowed) or a readable string of the plugin. */
static int check_name(const struct loom_plugin_kind *k, const char *path, void *dl,
		      const struct plugin_head *h, char *err, size_t errlen)
{
	if (!h->name && !k->name_required)
		return 0;
	if (!h->name) {
		loom_seterr(err, errlen, "%s %s: %s has no name", k->what, path, k->desc_name);
		return -1;
	}
	if (!loom_map_string_in(dl, h->name, NAME_MAX_BYTES)) {
		loom_seterr(err, errlen, "%s %s: bad %s: name (%p) is not a readable string of at most %d bytes in the plugin",
			    k->what, path, k->desc_name, (const void *)h->name, NAME_MAX_BYTES - 1);
		return -1;
	}
	return 0;
}

static int check_desc(const struct loom_plugin_kind *k, const char *path, void *dl,
		      const void *desc, char *err, size_t errlen)
{
	const struct plugin_head *h = desc;

	if (!h) {
		loom_seterr(err, errlen, "%s %s: entry returned no %s", k->what, path, k->desc_name);
		return -1;
	}
	if (h->abi_major != k->abi_major) {
		loom_seterr(err, errlen, "%s %s: ABI major %u, this loom needs %u", k->what, path,
			    h->abi_major, k->abi_major);
		return -1;
	}
	if (h->struct_size < k->min_size) {
		loom_seterr(err, errlen, "%s %s: %s of %u bytes, ABI 1.0 needs at least %zu",
			    k->what, path, k->desc_name, h->struct_size, k->min_size);
		return -1;
	}
	if (check_slots(k, path, dl, desc, err, errlen) || check_name(k, path, dl, h, err, errlen))
		return -1;
	return k->check ? k->check(path, dl, desc, err, errlen) : 0;
}

int loom_plugin_check(const struct loom_plugin_kind *k, const char *path, const void *desc,
		      char *err, size_t errlen)
{
	return check_desc(k, path, NULL, desc, err, errlen);
}

/* The descriptor lies inside the plugin's own readable segments: its
 * head, then (when the head is one this loom reads further) all of
 * struct_size bytes. NULL is left to loom_plugin_check's message. */
static int check_mapped(const struct loom_plugin_kind *k, const char *path, void *handle,
			const void *desc, char *err, size_t errlen)
{
	const struct plugin_head *h = desc;

	if (!desc)
		return 0;
	if (!loom_map_in_object(handle, desc, sizeof(*h), false)) {
		loom_seterr(err, errlen, "%s %s: bad %s: entry returned %p, outside the plugin's readable segments",
			    k->what, path, k->desc_name, desc);
		return -1;
	}
	if (h->abi_major == k->abi_major && h->struct_size >= k->min_size &&
	    !loom_map_in_object(handle, desc, h->struct_size, false)) {
		loom_seterr(err, errlen, "%s %s: bad %s: %u bytes at %p run past the plugin's readable segments",
			    k->what, path, k->desc_name, h->struct_size, desc);
		return -1;
	}
	return 0;
}

/* Every entry is `const struct <kind> *(*)(void)`; a pointer to a struct
 * and a pointer to void share their representation on every ABI loom
 * builds for, so one type calls them all. */
typedef const void *(*entry_fn)(void);

const void *loom_plugin_load(const struct loom_plugin_kind *k, const char *path, void **dl,
			     char *err, size_t errlen)
{
	void *handle;
	entry_fn entry;
	const void *desc;

	*dl = NULL;
	if (check_elf(k, path, err, errlen))
		return NULL;
	handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		loom_seterr(err, errlen, "%s %s: cannot load: %s", k->what, path, dlerror());
		return NULL;
	}
	entry = (entry_fn)dlsym(handle, k->entry);
	if (!entry) {
		loom_seterr(err, errlen, "%s %s: no entry symbol %s", k->what, path, k->entry);
		goto out_close;
	}
	if (!loom_map_is_function((const void *)entry) ||
	    !loom_map_in_object(handle, (const void *)entry, 1, true)) {
		loom_seterr(err, errlen, "%s %s: entry symbol %s is not a function of the plugin",
			    k->what, path, k->entry);
		goto out_close;
	}
	desc = entry();
	if (check_mapped(k, path, handle, desc, err, errlen) ||
	    check_desc(k, path, handle, desc, err, errlen))
		goto out_close;
	*dl = handle;
	return desc;

out_close:
	dlclose(handle); /* only the pure entry ran: nothing of it lives */
	return NULL;
}

const void *loom_plugin_open(const struct loom_plugin_kind *k, const char *name, char *path,
			     size_t cap, void **dl, char *err, size_t errlen)
{
	*dl = NULL;
	if (loom_plugin_resolve(k, name, path, cap, err, errlen))
		return NULL;
	return loom_plugin_load(k, path, dl, err, errlen);
}

/* ---- scan ---- */

struct scan {
	loom_plugin_found_fn fn;
	void *ctx;
	char *err;
	size_t errlen;
	int found;
};

/* Hands every *.so in dir to the scan's fn; stops at its first refusal. */
static int scan_folder(const char *dir, void *ctx)
{
	struct scan *s = ctx;
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4096];
	int rc = 0;

	if (!d)
		return 0;
	while (rc == 0 && (e = readdir(d))) {
		if (!has_so_suffix(e->d_name) || !join_path(path, sizeof(path), dir, e->d_name))
			continue;
		rc = s->fn(path, s->ctx, s->err, s->errlen);
		s->found++;
	}
	closedir(d);
	return rc;
}

int loom_plugin_scan(const struct loom_plugin_kind *k, loom_plugin_found_fn fn, void *ctx,
		     char *err, size_t errlen)
{
	struct scan s = { .fn = fn, .ctx = ctx, .err = err, .errlen = errlen };
	struct folders *f = search_path(k);
	char where[8192];
	int rc = 0;

	if (!f) {
		loom_seterr(err, errlen, "%s: out of memory", k->what);
		return -1;
	}
	/* from the end, so that a folder earlier in the path overrides */
	for (int i = f->n - 1; i >= 0 && !rc; i--)
		rc = scan_folder(f->dir[i], &s);
	free(f);
	if (!rc && !s.found) {
		loom_seterr(err, errlen, "%s: none found in %s", k->what,
			    folders_text(k, where, sizeof(where)));
		rc = -1;
	}
	return rc;
}
