/* The host collectives of backends/mpi/coll.c (what cpu.so's and ref.so's
 * `collective` slot runs), under mpirun -np 3: uneven column splits, rows
 * with a stride wider than the columns, and an all-reduce whose result
 * must equal a sum in rank order computed here, bit for bit, while the
 * columns outside the range stay untouched. Prints "ok" lines; exit 1 on
 * the first failure. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"

enum { ROWS = 5, STRIDE = 23, C0 = 2, C1 = 19 };

/* A value only (rank, row, column) gives, with bits that round when added. */
static float value(int rank, int row, int col)
{
	return (float)(rank + 1) * 0.1f + (float)row * 1.37f + (float)col * 1e-3f;
}

static int check_allgather(int rank, int n, const int64_t *cols)
{
	float x[ROWS * STRIDE];
	struct loom_collective_args a = { .struct_size = sizeof(a), .op = LOOM_COLL_ALLGATHER,
		.comm = MPI_COMM_WORLD, .n_ranks = n, .rank = rank, .x = x, .rows = ROWS,
		.stride = STRIDE, .col_start = cols };
	char why[128] = "";

	for (int i = 0; i < ROWS * STRIDE; i++)
		x[i] = -1.0f;
	for (int r = 0; r < ROWS; r++)
		for (int64_t c = cols[rank]; c < cols[rank + 1]; c++)
			x[r * STRIDE + c] = value((int)c, r, (int)c); /* the owner's value */
	if (loom_mpi_collective(&a, why, sizeof(why))) {
		printf("FAIL all-gather: %s\n", why);
		return 1;
	}
	for (int r = 0; r < ROWS; r++)
		for (int c = 0; c < STRIDE; c++) {
			float want = c >= cols[0] && c < cols[n] ? value(c, r, c) : -1.0f;

			if (memcmp(&x[r * STRIDE + c], &want, sizeof(float))) {
				printf("FAIL all-gather: rank %d row %d col %d: %g, want %g\n", rank, r, c,
				       x[r * STRIDE + c], want);
				return 1;
			}
		}
	return 0;
}

static int check_allreduce(int rank, int n)
{
	int64_t cols[4] = { C0, C1, C1, C1 };
	float x[ROWS * STRIDE];
	struct loom_collective_args a = { .struct_size = sizeof(a),
		.op = LOOM_COLL_ALLREDUCE_SUM, .comm = MPI_COMM_WORLD, .n_ranks = n, .rank = rank,
		.x = x, .rows = ROWS, .stride = STRIDE, .col_start = cols };
	char why[128] = "";

	cols[n] = C1;
	for (int r = 0; r < ROWS; r++)
		for (int c = 0; c < STRIDE; c++)
			x[r * STRIDE + c] = c >= C0 && c < C1 ? value(rank, r, c) : -1.0f;
	if (loom_mpi_collective(&a, why, sizeof(why))) {
		printf("FAIL all-reduce: %s\n", why);
		return 1;
	}
	for (int r = 0; r < ROWS; r++)
		for (int c = 0; c < STRIDE; c++) {
			float want = -1.0f;

			if (c >= C0 && c < C1) {
				want = value(0, r, c);
				for (int k = 1; k < n; k++) /* rank order */
					want += value(k, r, c);
			}
			if (memcmp(&x[r * STRIDE + c], &want, sizeof(float))) {
				printf("FAIL all-reduce: rank %d row %d col %d: %.9g, want %.9g\n", rank, r,
				       c, x[r * STRIDE + c], want);
				return 1;
			}
		}
	return 0;
}

static int check_refusals(int rank, int n)
{
	int64_t bad[4] = { 5, 3, 9, 9 }; /* decreasing */
	float x[4];
	struct loom_collective_args a = { .struct_size = sizeof(a), .op = LOOM_COLL_ALLGATHER,
		.comm = MPI_COMM_WORLD, .n_ranks = n, .rank = rank, .x = x, .rows = 1,
		.stride = 4, .col_start = bad };
	char why[128] = "";

	if (loom_mpi_collective(&a, why, sizeof(why)) != LOOM_ERR_INVALID) {
		printf("FAIL: decreasing column starts accepted\n");
		return 1;
	}
	a.col_start = (int64_t[]){ 0, 1, 2, 3, 4 };
	a.n_ranks = n + 1; /* not the communicator's size */
	if (loom_mpi_collective(&a, why, sizeof(why)) != LOOM_ERR_INVALID || !strstr(why, "communicator")) {
		printf("FAIL: a wrong rank count accepted (%s)\n", why);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int rank, n, bad = 0, all = 0;
	int64_t cols[4] = { C0, 7, 8, C1 }; /* widths 5, 1, 11 */

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	if (n != 3) {
		if (rank == 0)
			printf("FAIL: run under mpirun -np 3\n");
		MPI_Finalize();
		return 1;
	}
	bad |= check_allgather(rank, n, cols);
	bad |= check_allreduce(rank, n);
	bad |= check_refusals(rank, n);
	MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (rank == 0 && !all)
		printf("ok all-gather (uneven splits), all-reduce (rank-order sum, bitwise), refusals\n");
	MPI_Finalize();
	return all;
}
