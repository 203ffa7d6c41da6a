/* The core's side of the MPI module (dist_module.h): loads mpi.so the
 * first time a distributed job opens, then forwards every dist.h call to
 * it. A job that never opens (single-host: every d is NULL) never loads
 * it, so libmpi stays out of the process. */
#include "dist/dist_module.h"
#include "plugin/loader.h"
#include "util.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "loom_config.h"

#define SLOT(s) LOOM_PLUGIN_SLOT(struct loom_dist_module, s)

static const struct loom_plugin_slot required_slots[] = {
	SLOT(open), SLOT(close), SLOT(all_ok), SLOT(min_u64), SLOT(agree), SLOT(abort),
	SLOT(busy), SLOT(plan_send), SLOT(plan_recv), SLOT(send), SLOT(recv),
	SLOT(post_recv), SLOT(post_send), SLOT(wait_posted),
};

static const struct loom_plugin_kind dist_kind = {
	.what = "MPI module", .desc_name = "table", .entry = LOOM_DIST_MODULE_ENTRY,
	.env = "LOOM_DIST_PATH", .build_dir = LOOM_BUILD_ROOT "/core/dist", .dir = "dist",
	.abi_major = LOOM_DIST_MODULE_ABI, .min_size = sizeof(struct loom_dist_module),
	.required = required_slots,
	.n_required = sizeof(required_slots) / sizeof(required_slots[0]),
};

static const struct loom_dist_module *mod;
static char load_error[1024];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load_module(void)
{
	char path[PATH_MAX];
	void *dl = NULL;

	if (!LOOM_HAVE_MPI) {
		snprintf(load_error, sizeof(load_error), "this loom was built without MPI (install libopenmpi-dev and rebuild with -Dmpi=enabled)");
		return;
	}
	mod = loom_plugin_open(&dist_kind, "mpi.so", path, sizeof(path), &dl, load_error,
			       sizeof(load_error));
	/* Open MPI's own components expect libmpi's symbols in the global
	 * scope: promote the module and what it linked */
	if (mod && !dlopen(path, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL))
		loom_log(LOOM_LOG_WARN, "MPI module %s: cannot make it global: %s", path, dlerror());
}

struct loom_dist *loom_dist_open(int tp, int pp, char *err, size_t errlen)
{
	pthread_once(&load_once, load_module);
	if (!mod) {
		loom_seterr(err, errlen, "--tp %d --pp %d: MPI support is not available: %s", tp, pp,
			    load_error);
		return NULL;
	}
	return mod->open(tp, pp, err, errlen);
}

/* Below, d != NULL only when loom_dist_open succeeded, so mod is set; a
 * NULL d is a single-host engine and gets what a job of one rank would. */

void loom_dist_close(struct loom_dist *d)
{
	if (d)
		mod->close(d);
}

bool loom_dist_all_ok(struct loom_dist *d, bool ok)
{
	return d ? mod->all_ok(d, ok) : ok;
}

uint64_t loom_dist_min_u64(struct loom_dist *d, uint64_t v)
{
	return d ? mod->min_u64(d, v) : v;
}

bool loom_dist_agree(struct loom_dist *d, const int64_t *vals, const char *const *names,
		     int n, char *err, size_t errlen)
{
	return d ? mod->agree(d, vals, names, n, err, errlen) : true;
}

void loom_dist_abort(struct loom_dist *d, const char *why)
{
	if (d)
		mod->abort(d, why);
	fprintf(stderr, "loom: error: %s\n", why);
	_exit(1);
}

void loom_dist_busy(struct loom_dist *d, const char *what)
{
	if (d)
		mod->busy(d, what);
}

static int no_job(char *err, size_t errlen)
{
	loom_seterr(err, errlen, "distributed: no job (loom_dist_open was not called)");
	return -1;
}

int loom_dist_plan_send(struct loom_dist *d, const int32_t *plan, int32_t n, char *err,
			size_t errlen)
{
	return d ? mod->plan_send(d, plan, n, err, errlen) : no_job(err, errlen);
}

int loom_dist_plan_recv(struct loom_dist *d, int32_t **buf, int32_t *cap, int32_t *n,
			char *err, size_t errlen)
{
	return d ? mod->plan_recv(d, buf, cap, n, err, errlen) : no_job(err, errlen);
}

int loom_dist_send(struct loom_dist *d, const void *buf, size_t bytes, int to, int tag,
		   char *err, size_t errlen)
{
	return d ? mod->send(d, buf, bytes, to, tag, err, errlen) : no_job(err, errlen);
}

int loom_dist_recv(struct loom_dist *d, void *buf, size_t bytes, int from, int tag,
		   char *err, size_t errlen)
{
	return d ? mod->recv(d, buf, bytes, from, tag, err, errlen) : no_job(err, errlen);
}

int loom_dist_post_recv(struct loom_dist *d, void *buf, size_t bytes, int from, int tag,
			char *err, size_t errlen)
{
	return d ? mod->post_recv(d, buf, bytes, from, tag, err, errlen) : no_job(err, errlen);
}

int loom_dist_post_send(struct loom_dist *d, const void *buf, size_t bytes, int to, int tag,
			char *err, size_t errlen)
{
	return d ? mod->post_send(d, buf, bytes, to, tag, err, errlen) : no_job(err, errlen);
}

int loom_dist_wait_posted(struct loom_dist *d, char *err, size_t errlen)
{
	return d ? mod->wait_posted(d, err, errlen) : no_job(err, errlen);
}
