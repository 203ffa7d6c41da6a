/* Times the host-memory collectives cpu.so and ref.so run for --tp
 * (coll.c) at the sizes a step moves: run under mpirun, e.g.
 *   mpirun -np 2 build/backends/cpu/bench_collective
 * Rank 0 prints one line per (operation, width, rows): the mean time per
 * call and the bytes each rank receives. Not a test. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "coll.h"

static double time_op(struct loom_collective_args *a, int reps)
{
	double t0;

	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int i = 0; i < reps; i++)
		if (loom_mpi_collective(a, NULL, 0))
			return -1.0;
	return (MPI_Wtime() - t0) / reps;
}

int main(int argc, char **argv)
{
	static const int64_t widths[] = { 576, 1536, 8192, 28672 };
	static const int64_t rows[] = { 1, 16, 256 };
	int rank, size;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (rank == 0)
		printf("| op | width | rows | us/call | bytes in per rank |\n|---|---:|---:|---:|---:|\n");
	for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
		for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
			int64_t cols[65];
			float *x = calloc((size_t)(widths[w] * rows[r]), sizeof(float));
			struct loom_collective_args a = { .struct_size = sizeof(a),
				.comm = MPI_COMM_WORLD, .n_ranks = size, .rank = rank, .x = x,
				.rows = rows[r], .stride = widths[w], .col_start = cols };
			int reps = rows[r] * widths[w] > 100000 ? 20 : 200;

			for (int i = 0; i <= size; i++)
				cols[i] = widths[w] * i / size;
			for (int op = 0; op < 2; op++) {
				double t;
				int64_t in;

				a.op = (uint32_t)op;
				t = time_op(&a, reps);
				/* all-reduce: an all-to-all and an all-gather of
				 * (size - 1) / size of the array each */
				in = op == LOOM_COLL_ALLGATHER ?
					rows[r] * (widths[w] - (cols[rank + 1] - cols[rank])) * 4 :
					2 * rows[r] * widths[w] * 4 * (size - 1) / size;
				if (rank == 0)
					printf("| %s | %lld | %lld | %.1f | %lld |\n",
					       op ? "all-reduce" : "all-gather", (long long)widths[w],
					       (long long)rows[r], t * 1e6, (long long)in);
			}
			free(x);
		}
	}
	MPI_Finalize();
	return 0;
}
