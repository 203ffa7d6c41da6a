/* The MPI module (internal): core/dist/dist.c is built apart from the core
 * as <libdir>/loom/dist/mpi.so, the one part of loom linked with libmpi.
 * core/dist/dist_load.c dlopens it the first time a job asks for --tp or
 * --pp above 1 and forwards each loom_dist_* call (dist.h) to its table,
 * so a single-host loom, and libloom, neither link nor load libmpi.
 *
 * The module exports one symbol, loom_dist_module_entry, returning the
 * table below; the loader checks abi_major, struct_size and every slot
 * (core/plugin/loader.h) before the first call. Module and core are built
 * together from one tree: the ABI is a guard against a stale install, not
 * a promise to third parties.
 */
#ifndef LOOM_DIST_MODULE_H
#define LOOM_DIST_MODULE_H

#include "dist/dist.h"

#define LOOM_DIST_MODULE_ENTRY "loom_dist_module_entry"
#define LOOM_DIST_MODULE_ABI 1

/* Each slot is the dist.h function of the same name; all are required. */
struct loom_dist_module {
	uint32_t abi_major, abi_minor, struct_size;
	struct loom_dist *(*open)(int tp, int pp, char *err, size_t errlen);
	void (*close)(struct loom_dist *d);
	bool (*all_ok)(struct loom_dist *d, bool ok);
	uint64_t (*min_u64)(struct loom_dist *d, uint64_t v);
	bool (*agree)(struct loom_dist *d, const int64_t *vals, const char *const *names, int n,
		      char *err, size_t errlen);
	void (*abort)(struct loom_dist *d, const char *why);
	void (*busy)(struct loom_dist *d, const char *what);
	int (*plan_send)(struct loom_dist *d, const int32_t *plan, int32_t n, char *err,
			 size_t errlen);
	int (*plan_recv)(struct loom_dist *d, int32_t **buf, int32_t *cap, int32_t *n, char *err,
			 size_t errlen);
	int (*send)(struct loom_dist *d, const void *buf, size_t bytes, int to, int tag, char *err,
		    size_t errlen);
	int (*recv)(struct loom_dist *d, void *buf, size_t bytes, int from, int tag, char *err,
		    size_t errlen);
	int (*post_recv)(struct loom_dist *d, void *buf, size_t bytes, int from, int tag,
			 char *err, size_t errlen);
	int (*post_send)(struct loom_dist *d, const void *buf, size_t bytes, int to, int tag,
			 char *err, size_t errlen);
	int (*wait_posted)(struct loom_dist *d, char *err, size_t errlen);
};

typedef const struct loom_dist_module *(*loom_dist_module_entry_fn)(void);

#endif /* LOOM_DIST_MODULE_H */
