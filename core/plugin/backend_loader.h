/* Loading backends with dlopen (internal), through the one plugin loader
 * (loader.h), which also says when plugins are unloaded (never, once
 * anything of theirs has run).
 *
 * A bare name ("cpu.so") is looked up in the search path of loader.h:
 * each folder of LOOM_BACKEND_PATH (colon-separated), the user folder
 * ${XDG_DATA_HOME:-~/.local/share}/loom/backends, then the build tree's
 * <build>/backends/<stem>/ when the executable runs from it, else the
 * installed <libdir>/loom/backends/. A name containing '/' is a path.
 *
 * Refusals (missing file, not an ELF shared object, no entry symbol, ABI
 * major mismatch, table too small, required slot missing, create() failing)
 * produce one line naming the file and the reason, e.g.
 *   backend /x/old.so: ABI major 0, this loom needs 1
 * The checks happen before any backend function with side effects runs.
 * Opening a backend loads nothing else: the format registry (host.h) is
 * filled by whoever needs formats (loading a model calls loom_formats_init).
 */
#ifndef LOOM_BACKEND_LOADER_H
#define LOOM_BACKEND_LOADER_H

#include <stdbool.h>
#include <stddef.h>

#include "loom/backend.h"
#include "loom/plugin.h"
#include "plugin/host.h"

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
/* Resolves and loads a backend and checks its table, creating nothing
 * (for tests that drive the table themselves). NULL with err set. */
const struct loom_backend_ops *loom_backend_load_ops(const char *name, char *path, size_t cap,
						     char *err, size_t errlen);
/* Whether the backend has step regions (generation 1.1 graph_begin and
 * graph_end; the loader refuses a table with only one of them). */
bool loom_backend_has_graphs(const struct loom_backend *b);
/* Whether the backend packs weights (generation 1.2 weight_pack). */
bool loom_backend_has_pack(const struct loom_backend *b);
/* Whether weight_pack may take a table embed reads too, of this type
 * (ABI 1.5, LOOM_OP_EMBED_PACKED). */
bool loom_backend_embeds_packed(const struct loom_backend *b, uint32_t type);
/* Whether the backend has the optional softcap slot (ABI 1.2). */
bool loom_backend_has_softcap(const struct loom_backend *b);
/* Generation 1.7: greedy choice on the device (the argmax slot). */
bool loom_backend_has_argmax(const struct loom_backend *b);
/* Whether attention honours a parent table (token trees, ABI 1.8,
 * LOOM_OP_ATTENTION_TREE) over a cache of kv_type. */
bool loom_backend_has_tree(const struct loom_backend *b, uint32_t kv_type);
/* Generation 1.8: sampling on the device (the sample slot). */
bool loom_backend_has_sample(const struct loom_backend *b);
/* Generation 1.9: the sample slot draws rows without top-k
 * (LOOM_OP_SAMPLE_FULL) and computes logprobs (LOOM_OP_SAMPLE_LOGPROBS);
 * never asked of an older backend. */
bool loom_backend_has_sample_full(const struct loom_backend *b);
bool loom_backend_has_sample_logprobs(const struct loom_backend *b);
/* Whether the backend has the optional collective slot (ABI 1.4). */
bool loom_backend_has_collective(const struct loom_backend *b);
/* Whether the backend has the optional routed-expert slot (ABI 1.6). */
bool loom_backend_has_moe(const struct loom_backend *b);

#endif /* LOOM_BACKEND_LOADER_H */
