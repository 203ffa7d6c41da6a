/* Host-memory collectives over MPI (see coll.h). Both operations move
 * each rank's columns as one contiguous block per rank: pack, one
 * MPI_Allgatherv, unpack. The all-reduce gathers every rank's block and
 * sums in rank order on each rank, so the result is bitwise the same on
 * all ranks and from run to run (MPI_Allreduce promises neither). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"

#if LOOM_HAVE_MPI
#include <mpi.h>

static int fail(char *why, size_t len, int rc, const char *msg)
{
	if (why && len)
		snprintf(why, len, "%s", msg);
	return rc;
}

/* Columns of x are col_start[0] .. col_start[n]-1; checks the layout. */
static bool layout_ok(const struct loom_collective_args *a)
{
	if (a->n_ranks <= 0 || a->rank < 0 || a->rank >= a->n_ranks || a->rows < 0 ||
	    !a->col_start || !a->x || a->col_start[0] < 0 ||
	    a->col_start[a->n_ranks] > a->stride)
		return false;
	for (int r = 0; r < a->n_ranks; r++)
		if (a->col_start[r + 1] < a->col_start[r])
			return false;
	return true;
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
	if (MPI_Allgatherv(send, counts[a->rank], MPI_FLOAT, recv, counts, displs, MPI_FLOAT,
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

static int allreduce(const struct loom_collective_args *a, char *why, size_t len)
{
	int64_t c0 = a->col_start[0], w = a->col_start[a->n_ranks] - c0;
	int count, all;
	float *send, *recv;
	int rc = 0;

	if (!count_of(a->rows, w, &count) || !count_of(count, a->n_ranks, &all))
		return fail(why, len, LOOM_ERR_INVALID, "all-reduce larger than MPI's int count");
	send = malloc(sizeof(float) * ((size_t)count + 1));
	recv = malloc(sizeof(float) * ((size_t)all + 1));
	if (!send || !recv) {
		rc = fail(why, len, LOOM_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	pack(a, c0, w, send);
	if (MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT,
			  (MPI_Comm)a->comm) != MPI_SUCCESS) {
		rc = fail(why, len, LOOM_ERR_IO, "MPI_Allgather failed");
		goto out_free;
	}
	for (int r = 1; r < a->n_ranks; r++) /* rank order: ((x0 + x1) + x2) ... */
		for (int i = 0; i < count; i++)
			recv[i] += recv[(size_t)r * (size_t)count + (size_t)i];
	unpack(a, c0, w, recv);
out_free:
	free(recv);
	free(send);
	return rc;
}

int loom_mpi_collective(const struct loom_collective_args *a, char *why, size_t len)
{
	int size = 0, rank = -1;

	if (!a || a->struct_size < sizeof(*a) || !layout_ok(a))
		return fail(why, len, LOOM_ERR_INVALID, "collective: bad arguments");
	if (MPI_Comm_size((MPI_Comm)a->comm, &size) != MPI_SUCCESS ||
	    MPI_Comm_rank((MPI_Comm)a->comm, &rank) != MPI_SUCCESS || size != a->n_ranks ||
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
