/* Output files written safely (include/loom.h, "output files").
 *
 * Every file loom writes goes through here: a temporary beside the target,
 * created with O_CREAT|O_EXCL|O_NOFOLLOW under a random name (so a link
 * planted there is never followed, and a file there is never truncated),
 * written, flushed and fsync'ed, then renamed over the target. Without
 * LOOM_WRITE_FORCE the rename refuses an existing target
 * (RENAME_NOREPLACE, or link(2) where the file system lacks it, or, with
 * neither, an O_EXCL placeholder renamed over: see place_by_placeholder),
 * so the check and the replace are one step. Which one is found at open,
 * before any work. A refused commit keeps the temporary. Open temporaries
 * are listed in a table that loom_outfile_discard_all() empties from a
 * signal handler.
 */
#include "util.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

#define PENDING_MAX 16
#define TMP_CAP 4200

static_assert(ATOMIC_INT_LOCK_FREE == 2, "the signal handler reads atomic ints");

/* How the commit keeps an existing target: found in loom_outfile_open by
 * trying the method on the temporary itself, before any work is done. */
enum place_method {
	PLACE_NOREPLACE,   /* renameat2(RENAME_NOREPLACE) */
	PLACE_LINK,	   /* link(2), then unlink the temporary */
	PLACE_PLACEHOLDER, /* O_CREAT|O_EXCL the target, then rename over it */
};

struct loom_outfile {
	char path[4096];
	char tmp[TMP_CAP];
	uint32_t flags;
	enum place_method method;
	FILE *fp;
	int slot; /* index in pending, or -1 */
};

/* The temporaries a signal handler removes. The handler may run on any
 * thread, so each slot is published as a seqlock: the name is written
 * while seq is odd, seq made even, then live set; the handler copies the
 * name and uses it only when seq did not move meanwhile (a slot freed and
 * reused under it). `creating` counts threads between creating a
 * temporary and publishing it (with the fatal signals blocked there); the
 * handler sets `dying`, so that no new one starts, then waits for them. */
struct pending_slot {
	atomic_uint seq;
	atomic_int live;
	char name[TMP_CAP];
};
static struct pending_slot pending[PENDING_MAX];
static atomic_int creating, dying;
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;

static int pending_add(const char *tmp)
{
	int slot = -1;

	pthread_mutex_lock(&pending_lock);
	for (int i = 0; i < PENDING_MAX && slot < 0; i++) {
		struct pending_slot *p = &pending[i];
		unsigned s;

		if (atomic_load(&p->live))
			continue;
		s = atomic_load_explicit(&p->seq, memory_order_relaxed);
		atomic_store_explicit(&p->seq, s + 1, memory_order_relaxed);
		atomic_thread_fence(memory_order_release);
		snprintf(p->name, sizeof(p->name), "%s", tmp);
		atomic_store_explicit(&p->seq, s + 2, memory_order_release);
		atomic_store_explicit(&p->live, 1, memory_order_release);
		slot = i;
	}
	pthread_mutex_unlock(&pending_lock);
	return slot;
}

static void pending_drop(int slot)
{
	if (slot >= 0)
		atomic_store_explicit(&pending[slot].live, 0, memory_order_release);
}

/* SIGINT, SIGTERM and SIGHUP held off this thread (the handlers that
 * call loom_outfile_discard_all) while the table changes. */
static void block_fatal(sigset_t *old)
{
	sigset_t s;

	sigemptyset(&s);
	sigaddset(&s, SIGINT);
	sigaddset(&s, SIGTERM);
	sigaddset(&s, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &s, old);
}

static void restore_mask(const sigset_t *old)
{
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

void loom_outfile_discard_all(void)
{
	char name[TMP_CAP];
	struct timespec ms = { 0, 1000000 };

	atomic_store(&dying, 1);
	/* another thread between open() and publishing: up to a second */
	for (int i = 0; i < 1000 && atomic_load(&creating) > 0; i++)
		nanosleep(&ms, NULL); /* async-signal-safe */
	for (int i = 0; i < PENDING_MAX; i++) {
		struct pending_slot *p = &pending[i];
		unsigned s;

		if (!atomic_load_explicit(&p->live, memory_order_acquire))
			continue;
		s = atomic_load_explicit(&p->seq, memory_order_acquire);
		if (s & 1)
			continue;
		memcpy(name, p->name, sizeof(name));
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&p->seq, memory_order_relaxed) != s)
			continue;
		name[sizeof(name) - 1] = 0;
		unlink(name); /* async-signal-safe */
	}
}

/* Test-only fault injection (tests/quantize/test_outfile_unit.c): the
 * environment variable LOOM_TEST_OUTFILE_FAULTS, a list holding
 * "noreplace" (renameat2 answers EINVAL, as on a file system without
 * RENAME_NOREPLACE) and/or "nolink" (link answers EPERM, as on vfat).
 * Read nowhere else; unset in normal use. */
static bool test_fault(const char *what)
{
	const char *v = getenv("LOOM_TEST_OUTFILE_FAULTS");

	return v && strstr(v, what);
}

static int rename_noreplace(const char *from, const char *to)
{
	if (test_fault("noreplace")) {
		errno = EINVAL;
		return -1;
	}
	return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
}

static int link_file(const char *from, const char *to)
{
	if (test_fault("nolink")) {
		errno = EPERM;
		return -1;
	}
	return link(from, to);
}

/* PATH.XXXXXX.part into buf, XXXXXX random; -1 with ENAMETOOLONG. */
static int tmp_name(const char *path, char *buf, size_t cap, int tries)
{
	uint32_t r;

	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
		r = (uint32_t)getpid() * 2654435761u ^ (uint32_t)clock() ^ (uint32_t)tries;
	if (snprintf(buf, cap, "%s.%06x.part", path, r & 0xffffff) >= (int)cap) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return 0;
}

/* PATH.XXXXXX.part, created exclusively, never through a link; 0 with
 * f->tmp and the descriptor in *fd, or -1 with errno. */
static int create_tmp(struct loom_outfile *f, int *fd)
{
	for (int tries = 0; tries < 64; tries++) {
		if (tmp_name(f->path, f->tmp, sizeof(f->tmp), tries))
			return -1;
		*fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
		if (*fd >= 0)
			return 0;
		if (errno != EEXIST)
			return -1;
	}
	return -1;
}

static bool unsupported(int e)
{
	return e == EINVAL || e == ENOSYS || e == EPERM || e == EOPNOTSUPP || e == EMLINK;
}

/* Which way this directory keeps an existing target, tried on the
 * temporary: renamed, or linked, to a second free name (which becomes
 * f->tmp). 0, or -1 with errno on an error that is not "unsupported". */
static int probe_method(struct loom_outfile *f)
{
	char other[TMP_CAP];

	for (int tries = 0; tries < 64; tries++) {
		if (tmp_name(f->path, other, sizeof(other), tries))
			return -1;
		if (rename_noreplace(f->tmp, other) == 0) {
			f->method = PLACE_NOREPLACE;
			memcpy(f->tmp, other, sizeof(other));
			return 0;
		}
		if (errno == EEXIST)
			continue;
		if (errno != EINVAL && errno != ENOSYS)
			return -1;
		if (link_file(f->tmp, other) == 0) {
			unlink(f->tmp);
			f->method = PLACE_LINK;
			memcpy(f->tmp, other, sizeof(other));
			return 0;
		}
		if (errno == EEXIST)
			continue;
		if (!unsupported(errno))
			return -1;
		f->method = PLACE_PLACEHOLDER;
		return 0;
	}
	errno = EEXIST;
	return -1;
}

static void exists_error(const char *path, char *err, size_t errlen)
{
	loom_seterr(err, errlen, "%s: already exists (--force replaces it)", path);
}

/* The temporary, created, probed and listed for the signal handler with
 * the fatal signals held off: 0 with *fd, or -1 with err. */
static int start_tmp(struct loom_outfile *f, int *fd, char *err, size_t errlen)
{
	sigset_t old;
	int rc = 0;

	block_fatal(&old);
	atomic_fetch_add(&creating, 1);
	if (atomic_load(&dying)) { /* a handler is removing temporaries */
		loom_seterr(err, errlen, "%s: interrupted", f->path);
		rc = -1;
	} else if (create_tmp(f, fd)) {
		loom_seterr(err, errlen, "%s: cannot create: %s", f->tmp, strerror(errno));
		rc = -1;
	} else if (!(f->flags & LOOM_WRITE_FORCE) && probe_method(f)) {
		loom_seterr(err, errlen, "%s: cannot create: %s", f->tmp, strerror(errno));
		close(*fd);
		unlink(f->tmp);
		rc = -1;
	} else {
		f->slot = pending_add(f->tmp);
	}
	atomic_fetch_sub(&creating, 1);
	restore_mask(&old);
	return rc;
}

struct loom_outfile *loom_outfile_open(const char *path, uint32_t flags, char *err, size_t errlen)
{
	struct loom_outfile *f = calloc(1, sizeof(*f));
	struct stat st;
	int fd = -1;

	if (!f) {
		loom_seterr(err, errlen, "%s: out of memory", path);
		return NULL;
	}
	f->flags = flags;
	f->slot = -1;
	if (snprintf(f->path, sizeof(f->path), "%s", path) >= (int)sizeof(f->path)) {
		loom_seterr(err, errlen, "%s: path too long", path);
		goto out_free;
	}
	if (lstat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode)) {
			loom_seterr(err, errlen, "%s: is a directory", path);
			goto out_free;
		}
		if (!(flags & LOOM_WRITE_FORCE)) {
			exists_error(path, err, errlen);
			goto out_free;
		}
	}
	if (start_tmp(f, &fd, err, errlen))
		goto out_free;
	f->fp = fdopen(fd, "wb");
	if (!f->fp) {
		loom_seterr(err, errlen, "%s: %s", f->tmp, strerror(errno));
		close(fd);
		loom_outfile_discard(f);
		return NULL;
	}
	return f;

out_free:
	free(f);
	return NULL;
}

FILE *loom_outfile_stream(struct loom_outfile *f)
{
	return f->fp;
}

const char *loom_outfile_path(const struct loom_outfile *f)
{
	return f->path;
}

/* Without renameat2's NOREPLACE or links: the target is created empty
 * with O_EXCL (so an existing one is refused), then the temporary renamed
 * over it. Not atomic: for that moment OUT is an empty file, and a writer
 * that opens it without O_EXCL meanwhile loses its bytes to ours. */
static int place_by_placeholder(const struct loom_outfile *f)
{
	struct stat mine, now;
	int fd = open(f->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
	int e;

	if (fd < 0)
		return -1;
	if (fstat(fd, &mine)) {
		mine.st_ino = 0;
		mine.st_dev = 0;
	}
	close(fd);
	if (rename(f->tmp, f->path) == 0)
		return 0;
	e = errno;
	if (lstat(f->path, &now) == 0 && now.st_ino == mine.st_ino && now.st_dev == mine.st_dev)
		unlink(f->path); /* our placeholder, still there */
	errno = e;
	return -1;
}

/* Moves the temporary to the target; without FORCE never over one. */
static int place(const struct loom_outfile *f)
{
	if (f->flags & LOOM_WRITE_FORCE)
		return rename(f->tmp, f->path);
	switch (f->method) {
	case PLACE_NOREPLACE:
		return rename_noreplace(f->tmp, f->path);
	case PLACE_LINK:
		if (link_file(f->tmp, f->path))
			return -1;
		unlink(f->tmp);
		return 0;
	case PLACE_PLACEHOLDER:
		break;
	}
	return place_by_placeholder(f);
}

/* The temporary is kept: hours of work may be in it. It leaves the
 * signal handler's table, so a later SIGINT does not remove it. */
static void placing_failed(struct loom_outfile *f, char *err, size_t errlen)
{
	if (errno == EEXIST)
		loom_seterr(err, errlen,
			    "%s exists now; the result is kept as %s: rename it, or rerun with --force",
			    f->path, f->tmp);
	else
		loom_seterr(err, errlen, "%s: cannot rename from %s: %s; the result is kept there",
			    f->path, f->tmp, strerror(errno));
}

int loom_outfile_commit(struct loom_outfile *f, char *err, size_t errlen)
{
	sigset_t old;
	int rc = 0;

	if (fflush(f->fp) || fsync(fileno(f->fp))) {
		loom_seterr(err, errlen, "%s: write failed: %s", f->path, strerror(errno));
		rc = -1;
	}
	if (fclose(f->fp) && !rc) {
		loom_seterr(err, errlen, "%s: write failed: %s", f->path, strerror(errno));
		rc = -1;
	}
	f->fp = NULL;
	if (rc)
		unlink(f->tmp);
	else if (place(f)) {
		placing_failed(f, err, errlen);
		rc = -1;
	}
	block_fatal(&old);
	pending_drop(f->slot);
	restore_mask(&old);
	free(f);
	return rc;
}

void loom_outfile_discard(struct loom_outfile *f)
{
	sigset_t old;

	if (!f)
		return;
	if (f->fp)
		fclose(f->fp);
	unlink(f->tmp);
	block_fatal(&old);
	pending_drop(f->slot);
	restore_mask(&old);
	free(f);
}

int loom_write_file(const char *path, uint32_t flags, const void *data, size_t n, char *err,
		    size_t errlen)
{
	struct loom_outfile *f = loom_outfile_open(path, flags, err, errlen);

	if (!f)
		return -1;
	if (n && fwrite(data, 1, n, f->fp) != n) {
		loom_seterr(err, errlen, "%s: write failed: %s", path, strerror(errno));
		loom_outfile_discard(f);
		return -1;
	}
	return loom_outfile_commit(f, err, errlen);
}
