/* Loading backends and quantization plugins with dlopen (internal).
 *
 * A bare name ("cpu.so") is looked up, in order, in each folder of the
 * LOOM_BACKEND_PATH environment variable (colon-separated), in the build
 * tree (<build>/backends/<stem>/), and in the installed prefix
 * (<libdir>/loom/backends/). A name containing '/' is used as a path.
 *
 * Refusals (missing file, not an ELF shared object, no entry symbol, ABI
 * major mismatch, table too small, required slot missing, create() failing)
 * produce one line naming the file and the reason, e.g.
 *   backend /x/old.so: ABI major 0, this loom needs 1
 * The checks happen before any backend function with side effects runs.
 * Opening a backend loads nothing else: the format registry is filled by
 * whoever needs formats (loading a model calls loom_formats_init).
 */
#ifndef LOOM_BACKEND_LOADER_H
#define LOOM_BACKEND_LOADER_H

#include <stdbool.h>
#include <stddef.h>

#include "loom/backend.h"
#include "loom/plugin.h"

struct loom_backend {
	void *dl;
	const struct loom_backend_ops *ops;
	struct loom_backend_ctx *ctx;
	char path[4096];
};

/* Resolves name to an existing file path. 0 or -1 with err set. */
int loom_backend_resolve(const char *name, char *path, size_t cap, char *err,
			 size_t errlen);
/* Resolves, loads, validates and creates a context. NULL with err set. */
struct loom_backend *loom_backend_open(const char *name,
				       const struct loom_backend_config *cfg,
				       char *err, size_t errlen);
/* Validates a table (used by open; exposed for tests). 0 or -1 with err. */
int loom_backend_check_ops(const char *path, const struct loom_backend_ops *ops,
			   char *err, size_t errlen);
void loom_backend_close(struct loom_backend *b);
/* Whether the backend has step regions (generation 1.1 graph_begin and
 * graph_end; the loader refuses a table with only one of them). */
bool loom_backend_has_graphs(const struct loom_backend *b);

/* The host services table the core lends every backend. */
const struct loom_backend_host *loom_host_services(void);

/* ---- quantization format registry ---- */

/* Loads every quantization plugin (*.so) from LOOM_QUANT_PATH folders,
 * the build tree's plugins/quant/ and <libdir>/loom/quant/. Idempotent.
 * 0, or -1 with err naming the file and reason. */
int loom_formats_init(char *err, size_t errlen);
/* Loads one plugin file explicitly. 0 or -1 with err. */
int loom_formats_load_plugin(const char *path, char *err, size_t errlen);
/* The registered format for a GGUF type id, or NULL. */
const struct loom_quant_format *loom_format_get(uint32_t type);

#endif /* LOOM_BACKEND_LOADER_H */
