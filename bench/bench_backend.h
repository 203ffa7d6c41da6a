/*
 * What the benchmarks built with the tree share: a wall clock, and a
 * backend .so opened through its ABI entry the way the host opens it.
 */
#ifndef LOOM_BENCH_BACKEND_H
#define LOOM_BENCH_BACKEND_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "loom/backend.h"

static inline double bench_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The ops of the backend at path; on failure a message naming `tool`,
 * and exit(1). The library stays loaded until the process ends. */
static inline const struct loom_backend_ops *bench_open(const char *tool, const char *path)
{
	const struct loom_backend_ops *ops;
	loom_backend_entry_fn entry;
	void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);

	if (!dl) {
		fprintf(stderr, "%s: %s\n", tool, dlerror());
		exit(1);
	}
	entry = (loom_backend_entry_fn)dlsym(dl, LOOM_BACKEND_ENTRY);
	if (!entry || !(ops = entry()) || ops->abi_major != LOOM_BACKEND_ABI_MAJOR) {
		fprintf(stderr, "%s: %s is not a loom backend of ABI %d\n", tool, path,
			LOOM_BACKEND_ABI_MAJOR);
		exit(1);
	}
	return ops;
}

#endif
