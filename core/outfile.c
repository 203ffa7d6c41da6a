/* Output files written safely (include/loom.h, "output files").
 *
 * Every file loom writes goes through here: a temporary beside the target,
 * created with O_CREAT|O_EXCL|O_NOFOLLOW under a random name (so a link
 * planted there is never followed, and a file there is never truncated),
 * written, flushed and fsync'ed, then renamed over the target. Without
 * LOOM_WRITE_FORCE the rename refuses an existing target
 * (RENAME_NOREPLACE, or link(2) where the file system lacks it), so the
 * check and the replace are one step. Open temporaries are listed in a
 * table that loom_outfile_discard_all() empties from a signal handler.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
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

struct loom_outfile {
	char path[4096];
	char tmp[TMP_CAP];
	uint32_t flags;
	FILE *fp;
	int slot; /* index in pending, or -1 */
};

/* The temporaries a signal handler removes: a name is published before
 * its slot is marked used and the slot is cleared before the name goes. */
static char pending[PENDING_MAX][TMP_CAP];
static volatile sig_atomic_t pending_used[PENDING_MAX];
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;

static int pending_add(const char *tmp)
{
	int slot = -1;

	pthread_mutex_lock(&pending_lock);
	for (int i = 0; i < PENDING_MAX && slot < 0; i++) {
		if (!pending_used[i]) {
			snprintf(pending[i], sizeof(pending[i]), "%s", tmp);
			pending_used[i] = 1;
			slot = i;
		}
	}
	pthread_mutex_unlock(&pending_lock);
	return slot;
}

static void pending_drop(int slot)
{
	if (slot >= 0)
		pending_used[slot] = 0;
}

void loom_outfile_discard_all(void)
{
	for (int i = 0; i < PENDING_MAX; i++) {
		if (pending_used[i])
			unlink(pending[i]); /* async-signal-safe */
	}
}

/* PATH.XXXXXX.part, XXXXXX random, created exclusively, never through a
 * link; 0 with f->tmp and the descriptor in *fd, or -1 with errno. */
static int create_tmp(struct loom_outfile *f, int *fd)
{
	for (int tries = 0; tries < 64; tries++) {
		uint32_t r;

		if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
			r = (uint32_t)getpid() * 2654435761u ^ (uint32_t)clock() ^ (uint32_t)tries;
		if (snprintf(f->tmp, sizeof(f->tmp), "%s.%06x.part", f->path, r & 0xffffff) >=
		    (int)sizeof(f->tmp)) {
			errno = ENAMETOOLONG;
			return -1;
		}
		*fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
		if (*fd >= 0)
			return 0;
		if (errno != EEXIST)
			return -1;
	}
	return -1;
}

static void exists_error(const char *path, char *err, size_t errlen)
{
	loom_seterr(err, errlen, "%s: already exists (--force replaces it)", path);
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
	if (!(flags & LOOM_WRITE_FORCE) && lstat(path, &st) == 0) {
		exists_error(path, err, errlen);
		goto out_free;
	}
	if (create_tmp(f, &fd)) {
		loom_seterr(err, errlen, "%s: cannot create: %s", f->tmp, strerror(errno));
		goto out_free;
	}
	f->slot = pending_add(f->tmp);
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

/* Moves the temporary to the target; without FORCE never over one. */
static int place(const struct loom_outfile *f)
{
	if (f->flags & LOOM_WRITE_FORCE)
		return rename(f->tmp, f->path);
	if (renameat2(AT_FDCWD, f->tmp, AT_FDCWD, f->path, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -1;
	/* no RENAME_NOREPLACE on this file system: link(2) refuses too */
	if (link(f->tmp, f->path))
		return -1;
	unlink(f->tmp);
	return 0;
}

int loom_outfile_commit(struct loom_outfile *f, char *err, size_t errlen)
{
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
	if (!rc && place(f)) {
		if (errno == EEXIST)
			exists_error(f->path, err, errlen);
		else
			loom_seterr(err, errlen, "%s: cannot rename from %s: %s", f->path, f->tmp,
				    strerror(errno));
		rc = -1;
	}
	if (rc)
		unlink(f->tmp);
	pending_drop(f->slot);
	free(f);
	return rc;
}

void loom_outfile_discard(struct loom_outfile *f)
{
	if (!f)
		return;
	if (f->fp)
		fclose(f->fp);
	unlink(f->tmp);
	pending_drop(f->slot);
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
