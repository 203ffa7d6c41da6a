/* A distributed job over MPI (see dist.h), built as the module mpi.so
 * (dist_module.h): the core reaches these functions only through the
 * table at the end, after dlopen'ing the module for --tp or --pp. */
#include "dist/dist.h"
#include "dist/dist_module.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom_config.h"
#include "util.h"

#include <mpi.h>

#define DEFAULT_TIMEOUT 60.0

struct loom_dist_watch {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	double since;   /* monotonic seconds when the busy stretch began, 0: idle */
	char what[64];  /* what the stretch is */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static MPI_Comm world(const struct loom_dist *d)
{
	return (MPI_Comm)d->world;
}

/* mpirun sends SIGTERM to the ranks left when one dies. Only
 * async-signal-safe calls here. */
static void on_sigterm(int sig)
{
	static const char msg[] = "loom: error: rank 0: the job was ended by mpirun (SIGTERM): another rank died or was killed\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0) {
		/* nothing left to report it to */
	}
	_exit(1);
}

static void *watch_main(void *arg)
{
	struct loom_dist *d = arg;
	struct loom_dist_watch *w = d->watch;

	pthread_mutex_lock(&w->mu);
	while (!w->stop) {
		struct timespec ts;

		if (w->since > 0.0 && now_s() - w->since > d->timeout) {
			fprintf(stderr, "loom: error: rank %d: %s did not finish within %g s (LOOM_DIST_TIMEOUT): another rank died or hangs; ending the job\n",
				d->rank, w->what, d->timeout);
			fflush(stderr);
			_exit(1);
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000 * 1000;
		if (ts.tv_nsec >= 1000 * 1000 * 1000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000 * 1000 * 1000;
		}
		pthread_cond_timedwait(&w->cv, &w->mu, &ts);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

static int start_watch(struct loom_dist *d, char *err, size_t errlen)
{
	struct loom_dist_watch *w = calloc(1, sizeof(*w));

	if (!w) {
		loom_seterr(err, errlen, "distributed: out of memory");
		return -1;
	}
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	d->watch = w;
	if (pthread_create(&w->thread, NULL, watch_main, d)) {
		loom_seterr(err, errlen, "distributed: cannot start the watchdog thread");
		d->watch = NULL;
		free(w);
		return -1;
	}
	return 0;
}

static void stop_watch(struct loom_dist *d)
{
	struct loom_dist_watch *w = d->watch;

	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thread, NULL);
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
	free(w);
	d->watch = NULL;
}

void loom_dist_busy(struct loom_dist *d, const char *what)
{
	struct loom_dist_watch *w = d ? d->watch : NULL;

	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->since = what ? now_s() : 0.0;
	if (what)
		snprintf(w->what, sizeof(w->what), "%s", what);
	pthread_mutex_unlock(&w->mu);
}

static double read_timeout(void)
{
	const char *s = getenv("LOOM_DIST_TIMEOUT");
	char *end;
	double t;

	if (!s || !*s)
		return DEFAULT_TIMEOUT;
	t = strtod(s, &end);
	if (*end || !(t > 0.0)) {
		loom_log(LOOM_LOG_WARN, "LOOM_DIST_TIMEOUT='%s' is not a positive number of seconds; using %g",
			 s, DEFAULT_TIMEOUT);
		return DEFAULT_TIMEOUT;
	}
	return t;
}

static int init_mpi(struct loom_dist *d, char *err, size_t errlen)
{
	int inited = 0, provided = 0;

	MPI_Initialized(&inited);
	if (!inited) {
		/* the engine thread of `loom serve` makes the calls, one at a time */
		if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
			loom_seterr(err, errlen, "distributed: MPI_Init_thread failed");
			return -1;
		}
		d->initialized_mpi = true;
		if (provided < MPI_THREAD_SERIALIZED) {
			loom_seterr(err, errlen, "distributed: this MPI gives thread level %d, loom needs MPI_THREAD_SERIALIZED",
				    provided);
			return -1;
		}
	}
	return 0;
}

struct loom_dist *loom_dist_open(int tp, int pp, char *err, size_t errlen)
{
	struct loom_dist *d = calloc(1, sizeof(*d));
	MPI_Comm stage_comm;

	if (!d) {
		loom_seterr(err, errlen, "distributed: out of memory");
		return NULL;
	}
	if (tp < 1 || pp < 1 || tp > 4096 || pp > 4096) {
		loom_seterr(err, errlen, "distributed: --tp %d --pp %d: each must be 1 to 4096", tp, pp);
		goto out_free;
	}
	if (init_mpi(d, err, errlen))
		goto out_free;
	d->world = MPI_COMM_WORLD;
	MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &d->size);
	if (d->size != tp * pp) {
		loom_seterr(err, errlen, "distributed: --tp %d x --pp %d needs %d ranks, and mpirun started %d",
			    tp, pp, tp * pp, d->size);
		goto out_free;
	}
	d->tp = tp;
	d->pp = pp;
	d->tp_rank = d->rank % tp;
	d->stage = d->rank / tp;
	d->timeout = read_timeout();
	if (MPI_Comm_split(MPI_COMM_WORLD, d->stage, d->tp_rank, &stage_comm) != MPI_SUCCESS) {
		loom_seterr(err, errlen, "distributed: MPI_Comm_split failed");
		goto out_free;
	}
	d->tp_comm = stage_comm;
	if (start_watch(d, err, errlen))
		goto out_free;
	if (d->rank == 0)
		signal(SIGTERM, on_sigterm);
	loom_log(LOOM_LOG_INFO, "distributed: rank %d of %d (pid %d): stage %d of %d, tensor rank %d of %d",
		 d->rank, d->size, (int)getpid(), d->stage, pp, d->tp_rank, tp);
	return d;
out_free:
	loom_dist_close(d);
	return NULL;
}

void loom_dist_close(struct loom_dist *d)
{
	int finalized = 0;

	if (!d)
		return;
	stop_watch(d);
	if (d->tp_comm) {
		MPI_Comm c = d->tp_comm;

		MPI_Comm_free(&c);
	}
	free(d->posted);
	MPI_Finalized(&finalized);
	if (d->initialized_mpi && !finalized && !d->broken)
		MPI_Finalize();
	free(d);
}

void loom_dist_abort(struct loom_dist *d, const char *why)
{
	fprintf(stderr, "loom: error: rank %d: %s; ending the job\n", d->rank, why);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, 1);
	_exit(1); /* MPI_Abort does not return; if it did, end this rank */
}

bool loom_dist_all_ok(struct loom_dist *d, bool ok)
{
	int mine = ok ? 1 : 0, all = 0;

	if (MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, world(d)) != MPI_SUCCESS)
		return false;
	return all == 1;
}

uint64_t loom_dist_min_u64(struct loom_dist *d, uint64_t v)
{
	uint64_t all = v;

	if (MPI_Allreduce(&v, &all, 1, MPI_UINT64_T, MPI_MIN, world(d)) != MPI_SUCCESS)
		return v;
	return all;
}

bool loom_dist_agree(struct loom_dist *d, const int64_t *vals, const char *const *names,
		     int n, char *err, size_t errlen)
{
	int64_t theirs[32];
	int bad = -1;

	if (n > 32)
		n = 32;
	memcpy(theirs, vals, sizeof(int64_t) * (size_t)n);
	if (MPI_Bcast(theirs, n, MPI_INT64_T, 0, world(d)) != MPI_SUCCESS) {
		loom_seterr(err, errlen, "distributed: MPI_Bcast failed");
		return false;
	}
	for (int i = 0; i < n && bad < 0; i++)
		if (theirs[i] != vals[i])
			bad = i;
	if (bad >= 0)
		loom_seterr(err, errlen, "distributed: rank %d has %s %lld where rank 0 has %lld: start every rank with the same options",
			    d->rank, names[bad], (long long)vals[bad], (long long)theirs[bad]);
	if (!loom_dist_all_ok(d, bad < 0)) {
		if (bad < 0)
			loom_seterr(err, errlen, "distributed: another rank's options differ from rank 0's (see its message)");
		return false;
	}
	return true;
}

int loom_dist_plan_send(struct loom_dist *d, const int32_t *plan, int32_t n, char *err,
			size_t errlen)
{
	int32_t len = n;

	if (MPI_Bcast(&len, 1, MPI_INT32_T, 0, world(d)) != MPI_SUCCESS ||
	    (n > 0 && MPI_Bcast((void *)plan, n, MPI_INT32_T, 0, world(d)) != MPI_SUCCESS)) {
		loom_seterr(err, errlen, "distributed: broadcasting the step plan failed");
		return -1;
	}
	return 0;
}

int loom_dist_plan_recv(struct loom_dist *d, int32_t **buf, int32_t *cap, int32_t *n,
			char *err, size_t errlen)
{
	int32_t len = 0;

	if (MPI_Bcast(&len, 1, MPI_INT32_T, 0, world(d)) != MPI_SUCCESS || len < 0) {
		loom_seterr(err, errlen, "distributed: receiving a step plan failed");
		return -1;
	}
	if (len > *cap) {
		int32_t *nb = realloc(*buf, sizeof(int32_t) * (size_t)len);

		if (!nb) {
			loom_seterr(err, errlen, "distributed: out of memory for a %d-word plan", len);
			return -1;
		}
		*buf = nb;
		*cap = len;
	}
	if (len > 0 && MPI_Bcast(*buf, len, MPI_INT32_T, 0, world(d)) != MPI_SUCCESS) {
		loom_seterr(err, errlen, "distributed: receiving a step plan failed");
		return -1;
	}
	*n = len;
	return 0;
}

/* MPI counts are int: large messages go in pieces. */
#define PIECE ((size_t)1 << 30)

int loom_dist_send(struct loom_dist *d, const void *buf, size_t bytes, int to, int tag,
		   char *err, size_t errlen)
{
	for (size_t off = 0; off < bytes || bytes == 0; off += PIECE) {
		size_t n = bytes - off < PIECE ? bytes - off : PIECE;

		if (MPI_Send((const char *)buf + off, (int)n, MPI_BYTE, to, tag, world(d)) !=
		    MPI_SUCCESS) {
			loom_seterr(err, errlen, "distributed: sending %zu bytes to rank %d failed", bytes, to);
			return -1;
		}
		if (bytes == 0)
			break;
	}
	return 0;
}

int loom_dist_recv(struct loom_dist *d, void *buf, size_t bytes, int from, int tag,
		   char *err, size_t errlen)
{
	for (size_t off = 0; off < bytes || bytes == 0; off += PIECE) {
		size_t n = bytes - off < PIECE ? bytes - off : PIECE;

		if (MPI_Recv((char *)buf + off, (int)n, MPI_BYTE, from, tag, world(d),
			     MPI_STATUS_IGNORE) != MPI_SUCCESS) {
			loom_seterr(err, errlen, "distributed: receiving %zu bytes from rank %d failed", bytes, from);
			return -1;
		}
		if (bytes == 0)
			break;
	}
	return 0;
}

/* Room for one more posted transfer; NULL with err set. */
static MPI_Request *next_request(struct loom_dist *d, size_t bytes, char *err, size_t errlen)
{
	MPI_Request *reqs = d->posted;

	if (bytes > INT_MAX) {
		loom_seterr(err, errlen, "distributed: a posted transfer of %zu bytes is too large", bytes);
		return NULL;
	}
	if (d->n_posted == d->cap_posted) {
		int cap = d->cap_posted ? 2 * d->cap_posted : 16;

		reqs = realloc(d->posted, sizeof(MPI_Request) * (size_t)cap);
		if (!reqs) {
			loom_seterr(err, errlen, "distributed: out of memory");
			return NULL;
		}
		d->posted = reqs;
		d->cap_posted = cap;
	}
	return &reqs[d->n_posted];
}

int loom_dist_post_recv(struct loom_dist *d, void *buf, size_t bytes, int from, int tag,
			char *err, size_t errlen)
{
	MPI_Request *req = next_request(d, bytes, err, errlen);

	if (!req)
		return -1;
	if (MPI_Irecv(buf, (int)bytes, MPI_BYTE, from, tag, world(d), req) != MPI_SUCCESS) {
		loom_seterr(err, errlen, "distributed: receiving %zu bytes from rank %d failed", bytes, from);
		return -1;
	}
	d->n_posted++;
	return 0;
}

int loom_dist_post_send(struct loom_dist *d, const void *buf, size_t bytes, int to, int tag,
			char *err, size_t errlen)
{
	MPI_Request *req = next_request(d, bytes, err, errlen);

	if (!req)
		return -1;
	if (MPI_Isend(buf, (int)bytes, MPI_BYTE, to, tag, world(d), req) != MPI_SUCCESS) {
		loom_seterr(err, errlen, "distributed: sending %zu bytes to rank %d failed", bytes, to);
		return -1;
	}
	d->n_posted++;
	return 0;
}

int loom_dist_wait_posted(struct loom_dist *d, char *err, size_t errlen)
{
	int n = d->n_posted;

	d->n_posted = 0;
	if (n && MPI_Waitall(n, d->posted, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
		loom_seterr(err, errlen, "distributed: waiting for %d posted transfers failed", n);
		return -1;
	}
	return 0;
}

/* The module's one exported symbol (dist_module.h). */
static const struct loom_dist_module mpi_module = {
	.abi_major = LOOM_DIST_MODULE_ABI,
	.abi_minor = 0,
	.struct_size = sizeof(struct loom_dist_module),
	.open = loom_dist_open,
	.close = loom_dist_close,
	.all_ok = loom_dist_all_ok,
	.min_u64 = loom_dist_min_u64,
	.agree = loom_dist_agree,
	.abort = loom_dist_abort,
	.busy = loom_dist_busy,
	.plan_send = loom_dist_plan_send,
	.plan_recv = loom_dist_plan_recv,
	.send = loom_dist_send,
	.recv = loom_dist_recv,
	.post_recv = loom_dist_post_recv,
	.post_send = loom_dist_post_send,
	.wait_posted = loom_dist_wait_posted,
};

__attribute__((visibility("default"))) const struct loom_dist_module *
loom_dist_module_entry(void)
{
	return &mpi_module;
}

