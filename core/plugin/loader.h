/* The one plugin loader (internal): backends, quantization formats and
 * speculative strategies are found, checked and dlopen'ed here.
 *
 * What differs between the kinds is a table, struct loom_plugin_kind:
 * where to look, which entry symbol, the ABI major and the smallest
 * descriptor it accepts, the required slots and one optional check of its
 * own. Everything else is this file's:
 *
 *   resolve  a name with '/' is a path; a bare name ("cpu.so"; "ngram"
 *            when the kind adds ".so") is looked up in the kind's search
 *            path (below); first hit wins.
 *   load     refuse a file that is not ELF, dlopen it, find the entry
 *            symbol, call it (entries are pure: they return a const
 *            descriptor), then check abi_major, struct_size (it must
 *            cover every field the host reads), the name (a string) and
 *            the required and optional slots, all before the caller runs
 *            anything with side effects. The descriptor, its name and
 *            every slot must lie in the plugin's own object (the
 *            segments of the file dlopen'ed, not libc's nor another
 *            library's).
 *
 * The search path of a kind, in order (docs/BACKENDS.md):
 *   1. each folder of the kind's environment variable (colon-separated);
 *   2. the per-user folder ${XDG_DATA_HOME:-$HOME/.local/share}/loom/<dir>;
 *   3. the built-in folder: the build tree's when the running executable
 *      lives under the build tree, else the installed <libdir>/loom/<dir>,
 *      found relative to the executable (<bindir>/../<libdir>, so a moved
 *      or DESTDIR prefix works) and else at the configured prefix.
 * An installed binary never looks into the build tree, so a stale or
 * deleted build cannot shadow or stand in for the installed plugins.
 *
 * Every refusal is one line that starts with the kind ("backend",
 * "quant plugin", "spec plugin") and names the file and the reason.
 *
 * Unloading: a refused plugin is dlclose'd at once (only its pure entry
 * ran). A plugin that loads is never dlclose'd, not even when its owner
 * (struct loom_backend, a spec kind) is closed: threads, atexit handlers
 * and TLS destructors a plugin starts may outlive every object the host
 * made with it (unloading under them crashes at exit), and the format
 * registry points into quant plugins for the life of the process. The
 * owners keep the handle only to say which object they came from.
 */
#ifndef LOOM_PLUGIN_LOADER_H
#define LOOM_PLUGIN_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A slot the host requires non-NULL, by name and offset. */
struct loom_plugin_slot {
	const char *name;
	size_t offset;
};

#define LOOM_PLUGIN_SLOT(type, slot) { #slot, offsetof(type, slot) }

struct loom_plugin_kind {
	const char *what;        /* "backend": starts every message */
	const char *desc_name;   /* "ops table", "descriptor" */
	const char *env;         /* "LOOM_BACKEND_PATH": searched first */
	const char *build_dir;   /* the kind's folder in the build tree */
	bool build_subdirs;      /* the build keeps one subfolder a plugin */
	const char *dir;         /* "backends": <libdir>/loom/<dir>, user folder */
	bool add_suffix;         /* a bare name without ".so" gets it */
	const char *entry;       /* the entry symbol */
	uint32_t abi_major;
	size_t min_size;         /* generation 1.0's struct_size */
	const struct loom_plugin_slot *required;
	size_t n_required;
	/* Slots that may be NULL; one the descriptor's struct_size covers
	 * and that is set must be code, as a required slot must. */
	const struct loom_plugin_slot *optional;
	size_t n_optional;
	bool name_required; /* the name (every kind has one) must be set */
	/* Optional. The kind's own checks of a descriptor that passed the
	 * common ones; 0, or -1 with err naming path. dl is the plugin's
	 * handle (NULL for a table built by the caller: then any loaded
	 * object counts as the plugin's). Pure. */
	int (*check)(const char *path, void *dl, const void *desc, char *err, size_t errlen);
};

/* Resolves name to an existing file (path, cap bytes). 0, or -1 with err. */
int loom_plugin_resolve(const struct loom_plugin_kind *k, const char *name, char *path,
			size_t cap, char *err, size_t errlen);
/* Checks a descriptor as load does (exposed for the per-kind checks
 * that tests call on tables they build), except that any loaded object
 * counts as the plugin's. 0, or -1 with err. */
int loom_plugin_check(const struct loom_plugin_kind *k, const char *path, const void *desc,
		      char *err, size_t errlen);
/* Loads the file at path: ELF check, dlopen, entry, loom_plugin_check.
 * The checked descriptor with *dl set, or NULL with err (and nothing
 * left open). */
const void *loom_plugin_load(const struct loom_plugin_kind *k, const char *path, void **dl,
			     char *err, size_t errlen);
/* Resolves name into path (cap bytes), then loads it. */
const void *loom_plugin_open(const struct loom_plugin_kind *k, const char *name, char *path,
			     size_t cap, void **dl, char *err, size_t errlen);

/* Called on each file a scan finds; 0 to go on, -1 (err set) to stop. */
typedef int (*loom_plugin_found_fn)(const char *path, void *ctx, char *err, size_t errlen);

/* Calls fn on every *.so of the kind's folders, the search path from its
 * end: the built-in folder, the user folder, then each folder of the
 * environment variable from the last, so that earlier ones override.
 * 0, or -1 with err (fn's refusal, or none found anywhere). */
int loom_plugin_scan(const struct loom_plugin_kind *k, loom_plugin_found_fn fn, void *ctx,
		     char *err, size_t errlen);

/* Called on each folder of the search path, in search order. */
typedef int (*loom_plugin_folder_fn)(const char *dir, void *ctx);
/* Calls fn on each folder of the kind's search path, in order (folders that
 * do not exist included); stops at fn's first non-zero, which it returns. */
int loom_plugin_each_folder(const struct loom_plugin_kind *k, loom_plugin_folder_fn fn,
			    void *ctx);
/* The three kinds (backend_loader.c, host.c, engine/spec.c), for listings. */
const struct loom_plugin_kind *loom_backend_plugin_kind(void);
const struct loom_plugin_kind *loom_quant_plugin_kind(void);
const struct loom_plugin_kind *loom_spec_plugin_kind(void);

/* Whether the running executable lives under the build tree. */
bool loom_plugin_in_build_tree(void);

#endif /* LOOM_PLUGIN_LOADER_H */
