/* Host-memory collectives over MPI (see coll.h). The all-gather moves
 * each rank's columns as one contiguous block per rank: pack, one
 * MPI_Allgatherv, unpack. The all-reduce is an all-to-all of pieces, a
 * sum in rank order of each piece by the rank that owns it, and an
 * all-gather (see allreduce), so the result is bitwise the same on all
 * ranks and from run to run (MPI_Allreduce promises neither). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "loom/backend_check.h"

#if LOOM_HAVE_MPI
#include "mpi_rt.h"

#define LOOM_MPI_MAX_RANKS 4096

static int fail(char *why, size_t len, int rc, const char *msg)
{
	if (why && len)
		snprintf(why, len, "%s", msg);
	return rc;
}

/* rows x cols floats as an MPI count; false past INT_MAX. */
static bool count_of(int64_t rows, int64_t cols, int *out)
{
	int64_t n;

	if (__builtin_mul_overflow(rows, cols, &n) || n > INT_MAX)
		return false;
	*out = (int)n;
	return true;
}

static void pack(const struct loom_collective_args *a, int64_t c0, int64_t w, float *dst)
{
	for (int64_t i = 0; i < a->rows; i++)
		memcpy(dst + i * w, a->x + i * a->stride + c0, sizeof(float) * (size_t)w);
}

static void unpack(const struct loom_collective_args *a, int64_t c0, int64_t w,
		   const float *src)
{
	for (int64_t i = 0; i < a->rows; i++)
		memcpy(a->x + i * a->stride + c0, src + i * w, sizeof(float) * (size_t)w);
}

static int allgather(const struct loom_collective_args *a, char *why, size_t len)
{
	const struct loom_mpi_rt *mpi = loom_mpi_rt(); /* found: loom_mpi_collective */
	int n = a->n_ranks, *counts = calloc((size_t)n * 2, sizeof(int)), *displs, total = 0;
	const int64_t *c = a->col_start;
	float *send = NULL, *recv = NULL;
	int rc = LOOM_ERR_NOMEM;

	if (!counts)
		return fail(why, len, rc, "out of memory");
	displs = counts + n;
	for (int r = 0; r < n; r++) {
		if (!count_of(a->rows, c[r + 1] - c[r], &counts[r]) ||
		    __builtin_add_overflow(total, counts[r], &total)) {
			rc = fail(why, len, LOOM_ERR_INVALID, "all-gather larger than MPI's int count");
			goto out_free;
		}
		displs[r] = total - counts[r];
	}
	send = malloc(sizeof(float) * ((size_t)counts[a->rank] + 1));
	recv = malloc(sizeof(float) * ((size_t)total + 1));
	if (!send || !recv) {
		rc = fail(why, len, LOOM_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	pack(a, c[a->rank], c[a->rank + 1] - c[a->rank], send);
	if (mpi->allgatherv(send, counts[a->rank], mpi->flt, recv, counts, displs, mpi->flt,
			   (MPI_Comm)a->comm) != MPI_SUCCESS) {
		rc = fail(why, len, LOOM_ERR_IO, "MPI_Allgatherv failed");
		goto out_free;
	}
	for (int r = 0; r < n; r++)
		if (r != a->rank)
			unpack(a, c[r], c[r + 1] - c[r], recv + displs[r]);
	rc = 0;
out_free:
	free(recv);
	free(send);
	free(counts);
	return rc;
}

/* Columns c0 .. c0+w-1 in n near-equal pieces: piece p is [lo(p), lo(p+1)). */
static int64_t piece_lo(int64_t w, int n, int p)
{
	return w * p / n;
}

/*
 * Sum over the ranks, added in rank order, at a ring all-reduce's cost:
 * each rank owns one piece of the columns; an all-to-all brings it every
 * rank's values of its piece, which it adds up in rank order; an
 * all-gather then gives every rank every summed piece. Each rank receives
 * 2 (n-1)/n of the array, and every element is summed by one rank only,
 * so all ranks end up with the same bits.
 */
static int allreduce(const struct loom_collective_args *a, char *why, size_t len)
{
	const struct loom_mpi_rt *mpi = loom_mpi_rt();
	int n = a->n_ranks, me = a->rank, *cnt = calloc((size_t)n * 4, sizeof(int));
	int64_t c0 = a->col_start[0], w = a->col_start[n] - c0;
	int64_t mine = piece_lo(w, n, me + 1) - piece_lo(w, n, me);
	float *send = NULL, *recv = NULL;
	int *sd, *rc_, *rd, total = 0, rc = LOOM_ERR_NOMEM;

	if (!cnt)
		return fail(why, len, rc, "out of memory");
	sd = cnt + n, rc_ = cnt + 2 * n, rd = cnt + 3 * n;
	for (int p = 0; p < n; p++) {
		int64_t pw = piece_lo(w, n, p + 1) - piece_lo(w, n, p);

		if (!count_of(a->rows, pw, &cnt[p]) || !count_of(a->rows, mine, &rc_[p]) ||
		    __builtin_add_overflow(total, cnt[p], &total)) {
			rc = fail(why, len, LOOM_ERR_INVALID, "all-reduce larger than MPI's int count");
			goto out_free;
		}
		sd[p] = total - cnt[p];
		rd[p] = p * rc_[0];
	}
	send = calloc((size_t)total + 1, sizeof(float));
	recv = malloc(sizeof(float) * ((size_t)rc_[0] * (size_t)n + 1));
	if (!send || !recv) {
		rc = fail(why, len, LOOM_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	for (int p = 0; p < n; p++) /* piece by piece, each [rows][piece width] */
		for (int64_t i = 0; i < a->rows; i++) {
			int64_t lo = piece_lo(w, n, p), pw = piece_lo(w, n, p + 1) - lo;

			memcpy(send + sd[p] + i * pw, a->x + i * a->stride + c0 + lo,
			       sizeof(float) * (size_t)pw);
		}
	if (mpi->alltoallv(send, cnt, sd, mpi->flt, recv, rc_, rd, mpi->flt,
			  (MPI_Comm)a->comm) != MPI_SUCCESS) {
		rc = fail(why, len, LOOM_ERR_IO, "MPI_Alltoallv failed");
		goto out_free;
	}
	for (int r = 1; r < n; r++) /* rank order: ((x0 + x1) + x2) ... */
		for (int i = 0; i < rc_[0]; i++)
			recv[i] += recv[(size_t)r * (size_t)rc_[0] + (size_t)i];
	for (int64_t i = 0; i < a->rows; i++)
		memcpy(a->x + i * a->stride + c0 + piece_lo(w, n, me), recv + i * mine,
		       sizeof(float) * (size_t)mine);
	rc = 0;
out_free:
	free(recv);
	free(send);
	free(cnt);
	if (rc == 0) { /* every rank's summed piece to every rank */
		int64_t cols[LOOM_MPI_MAX_RANKS + 1];
		struct loom_collective_args g = *a;

		if (n > LOOM_MPI_MAX_RANKS)
			return fail(why, len, LOOM_ERR_INVALID, "all-reduce: too many ranks");
		for (int p = 0; p <= n; p++)
			cols[p] = c0 + piece_lo(w, n, p);
		g.col_start = cols;
		rc = allgather(&g, why, len);
	}
	return rc;
}

int loom_mpi_collective(const struct loom_collective_args *a, char *why, size_t len)
{
	const struct loom_mpi_rt *mpi = loom_mpi_rt();
	int size = 0, rank = -1;

	if (!a || a->struct_size < sizeof(*a) || !loom_check_collective_layout(a))
		return fail(why, len, LOOM_ERR_INVALID, "collective: bad arguments");
	if (!mpi)
		return fail(why, len, LOOM_ERR_UNSUPPORTED, "collective: MPI is not loaded in this process (no distributed job started)");
	if (mpi->comm_size((MPI_Comm)a->comm, &size) != MPI_SUCCESS ||
	    mpi->comm_rank((MPI_Comm)a->comm, &rank) != MPI_SUCCESS || size != a->n_ranks ||
	    rank != a->rank)
		return fail(why, len, LOOM_ERR_INVALID,
			    "collective: the communicator does not match n_ranks and rank");
	if (a->op == LOOM_COLL_ALLGATHER)
		return allgather(a, why, len);
	if (a->op == LOOM_COLL_ALLREDUCE_SUM)
		return allreduce(a, why, len);
	return fail(why, len, LOOM_ERR_UNSUPPORTED, "collective: unknown operation");
}
#else
int loom_mpi_collective(const struct loom_collective_args *a, char *why, size_t len)
{
	(void)a;
	if (why && len)
		snprintf(why, len, "built without MPI");
	return LOOM_ERR_UNSUPPORTED;
}
#endif
