/*
 * The GPU backends' collective slot (backends/gpu/gpu_coll.c, ABI 1.4) on
 * device memory, under mpirun -np 3, for every backend named on the
 * command line (gpuemu.so and gpuemu64.so here, where the emulated NCCL
 * runs over MPI; cuda.so where it has a device and NCCL).
 *
 * Rows of pseudo-random floats, a stride wider than the columns, uneven
 * column shares (one of them empty), many rows and columns (past one
 * block of threads), a second and a one-rank communicator: after each
 * all-gather every rank must hold every owner's bits, after each
 * all-reduce the sum in rank order computed here, bit for bit, and the
 * columns outside the range must be untouched. Then the refusals: bad
 * column starts, a communicator of another size, a call inside a step
 * region. Prints "ok" lines; exit 1 on any failure.
 */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/backend_loader.h"

#define UNTOUCHED -7.0f

static int failures;

static void fail(int rank, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(int rank, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL rank %d: ", rank);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	failures++;
}

/* A float only (seed, rank, row, column) gives, of varied magnitude, so
 * that sums round differently in another order. */
static float value(uint32_t seed, int rank, int64_t row, int64_t col)
{
	uint64_t h = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)rank << 40 ^ (uint64_t)row << 20 ^
		     (uint64_t)col;

	h ^= h >> 31;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 29;
	return (float)((int64_t)(h & 0xffffff) - 0x800000) * 0x1p-20f * (float)(1 + (h >> 60));
}

/* A backend context with one device array of rows x stride floats. */
struct dev {
	const struct loom_backend_ops *ops;
	struct loom_backend_ctx *c;
	struct loom_buffer *buf;
	float *x;
};

struct job {
	MPI_Comm comm;
	int n, rank;
};

/* Uploads host, runs the collective, downloads into host. */
static int collect(struct dev *d, const struct job *j, uint32_t op, float *host, int64_t rows,
		   int64_t stride, const int64_t *cols)
{
	size_t bytes = sizeof(float) * (size_t)rows * (size_t)stride;
	struct loom_collective_args a = { .struct_size = sizeof(a), .op = op, .comm = j->comm,
		.n_ranks = j->n, .rank = j->rank, .x = d->x, .rows = rows, .stride = stride,
		.col_start = cols };
	int rc = d->ops->upload(d->c, d->x, host, bytes);

	if (!rc)
		rc = d->ops->collective(d->c, &a);
	if (!rc)
		rc = d->ops->download(d->c, host, d->x, bytes);
	return rc;
}

static void check_allgather(struct dev *d, const struct job *j, uint32_t seed, int64_t rows,
			    int64_t stride, const int64_t *cols, const char *what)
{
	float *x = malloc(sizeof(float) * (size_t)(rows * stride));
	int64_t bad = -1;
	int rc;

	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = 0; c < stride; c++)
			x[r * stride + c] = c >= cols[j->rank] && c < cols[j->rank + 1] ?
				value(seed, j->rank, r, c) : UNTOUCHED;
	rc = collect(d, j, LOOM_COLL_ALLGATHER, x, rows, stride, cols);
	for (int64_t r = 0; r < rows && !rc && bad < 0; r++)
		for (int owner = 0, c = 0; c < stride; c++) {
			float want = UNTOUCHED;

			while (owner < j->n && c >= cols[owner + 1])
				owner++;
			if (c >= cols[0] && c < cols[j->n])
				want = value(seed, owner, r, c);
			if (memcmp(&want, &x[r * stride + c], sizeof(want))) {
				bad = r * stride + c;
				break;
			}
		}
	if (rc)
		fail(j->rank, "%s: %s all-gather returned %d", d->ops->name, what, rc);
	else if (bad >= 0)
		fail(j->rank, "%s: %s all-gather: row %lld column %lld wrong (%g)", d->ops->name,
		     what, (long long)(bad / stride), (long long)(bad % stride), x[bad]);
	free(x);
}

static void check_allreduce(struct dev *d, const struct job *j, uint32_t seed, int64_t rows,
			    int64_t stride, int64_t c0, int64_t c1, const char *what)
{
	int64_t cols[8], bad = -1;
	float *x = malloc(sizeof(float) * (size_t)(rows * stride));
	int rc;

	for (int r = 0; r <= j->n; r++) /* every rank holds c0 .. c1-1 */
		cols[r] = r == j->n ? c1 : c0;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = 0; c < stride; c++)
			x[r * stride + c] = c >= c0 && c < c1 ? value(seed, j->rank, r, c) : UNTOUCHED;
	rc = collect(d, j, LOOM_COLL_ALLREDUCE_SUM, x, rows, stride, cols);
	for (int64_t i = 0; i < rows * stride && !rc && bad < 0; i++) {
		int64_t r = i / stride, c = i % stride;
		float want = UNTOUCHED;

		if (c >= c0 && c < c1) {
			want = value(seed, 0, r, c);
			for (int k = 1; k < j->n; k++) /* rank order */
				want += value(seed, k, r, c);
		}
		if (memcmp(&want, &x[i], sizeof(want)))
			bad = i;
	}
	if (rc)
		fail(j->rank, "%s: %s all-reduce returned %d", d->ops->name, what, rc);
	else if (bad >= 0)
		fail(j->rank, "%s: %s all-reduce: row %lld column %lld is %.9g, not the rank-order sum",
		     d->ops->name, what, (long long)(bad / stride), (long long)(bad % stride), x[bad]);
	free(x);
}

/* Every rank's result bits agree with every other's (the contract's
 * "bitwise the same on all"), beyond agreeing with our sum. */
static void check_same_everywhere(struct dev *d, const struct job *j)
{
	enum { ROWS = 3, STRIDE = 300 };
	int64_t cols[8];
	float x[ROWS * STRIDE], *all = malloc(sizeof(x) * (size_t)j->n);

	for (int r = 0; r <= j->n; r++)
		cols[r] = r == j->n ? STRIDE : 0;
	for (int i = 0; i < ROWS * STRIDE; i++)
		x[i] = value(99, j->rank, i / STRIDE, i % STRIDE);
	if (collect(d, j, LOOM_COLL_ALLREDUCE_SUM, x, ROWS, STRIDE, cols) ||
	    MPI_Allgather(x, (int)sizeof(x), MPI_BYTE, all, (int)sizeof(x), MPI_BYTE, j->comm))
		fail(j->rank, "%s: all-reduce for the cross-rank comparison failed", d->ops->name);
	else
		for (int r = 0; r < j->n; r++)
			if (memcmp(all + (size_t)r * ROWS * STRIDE, x, sizeof(x)))
				fail(j->rank, "%s: all-reduce bits differ from rank %d's", d->ops->name,
				     r);
	free(all);
}

static void expect_refused(struct dev *d, const struct job *j, const int64_t *cols, int n_ranks,
			   const char *what)
{
	struct loom_collective_args a = { .struct_size = sizeof(a), .op = LOOM_COLL_ALLGATHER,
		.comm = j->comm, .n_ranks = n_ranks, .rank = j->rank, .x = d->x, .rows = 2,
		.stride = 16, .col_start = cols };
	int rc = d->ops->collective(d->c, &a);

	if (rc != LOOM_ERR_INVALID)
		fail(j->rank, "%s: %s: status %d, want LOOM_ERR_INVALID", d->ops->name, what, rc);
}

static void check_refusals(struct dev *d, const struct job *j)
{
	int64_t down[5] = { 6, 3, 9, 12, 12 }, past[5] = { 0, 4, 8, 20, 20 };
	int64_t cols[5] = { 0, 4, 8, 12, 16 };
	struct loom_collective_args a = { .struct_size = sizeof(a), .op = LOOM_COLL_ALLGATHER,
		.comm = j->comm, .n_ranks = j->n, .rank = j->rank, .x = d->x, .rows = 2,
		.stride = 16, .col_start = cols };
	int rc;

	past[j->n] = 20; /* beyond the stride */
	expect_refused(d, j, down, j->n, "decreasing column starts");
	expect_refused(d, j, past, j->n, "columns past the stride");
	expect_refused(d, j, cols, j->n + 1, "a rank count that is not the communicator's");
	if (!d->ops->graph_begin)
		return;
	rc = d->ops->graph_begin(d->c);
	if (!rc) {
		rc = d->ops->collective(d->c, &a);
		if (rc != LOOM_ERR_INVALID)
			fail(j->rank, "%s: a collective inside a step region: status %d", d->ops->name,
			     rc);
		if (d->ops->graph_end(d->c) == LOOM_OK)
			fail(j->rank, "%s: the region with a collective succeeded", d->ops->name);
	}
}

static int dev_open(struct dev *d, const struct loom_backend_ops *ops, size_t bytes)
{
	static struct loom_backend_host host;
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg) };

	host = *loom_host_services();
	memset(d, 0, sizeof(*d));
	d->ops = ops;
	if (ops->create(&host, &cfg, &d->c))
		return -1;
	if (ops->buffer_alloc(d->c, bytes, &d->buf)) {
		ops->destroy(d->c);
		return -1;
	}
	d->x = ops->buffer_addr(d->c, d->buf);
	return 0;
}

static void dev_close(struct dev *d)
{
	d->ops->buffer_free(d->c, d->buf);
	d->ops->destroy(d->c);
}

/* Two ranks in one communicator, the third alone in its own. */
static void check_split(struct dev *d, const struct job *world)
{
	struct job j = { .comm = MPI_COMM_NULL };
	int64_t cols2[3] = { 1, 40, 333 }, cols1[2] = { 3, 50 };

	MPI_Comm_split(MPI_COMM_WORLD, world->rank < 2, world->rank, &j.comm);
	MPI_Comm_size(j.comm, &j.n);
	MPI_Comm_rank(j.comm, &j.rank);
	check_allgather(d, &j, 7, 9, 340, j.n == 2 ? cols2 : cols1, "sub-communicator");
	check_allreduce(d, &j, 8, 9, 340, 5, 339, "sub-communicator");
	check_allgather(d, world, 9, 4, 21, (int64_t[]){ 0, 7, 14, 21 }, "world again");
	MPI_Comm_free(&j.comm);
}

static void check_backend(const char *name, const struct job *world)
{
	char path[4096], err[4096];
	const struct loom_backend_ops *ops = loom_backend_load_ops(name, path, sizeof(path), err,
								   sizeof(err));
	int64_t uneven[4] = { 2, 7, 7, 19 }; /* widths 5, 0, 12 */
	int64_t wide[4] = { 0, 300, 301, 650 };
	int before = failures, all = 0;
	struct dev d;

	if (!ops || ops->struct_size < offsetof(struct loom_backend_ops, collective) +
					   sizeof(void *) || !ops->collective) {
		if (world->rank == 0)
			printf("SKIP %s: %s\n", name, ops ? "no collective slot" : err);
		return;
	}
	if (dev_open(&d, ops, sizeof(float) << 20)) {
		if (world->rank == 0)
			printf("SKIP %s: no device\n", name);
		return;
	}
	check_allgather(&d, world, 1, 5, 23, uneven, "uneven shares");
	check_allgather(&d, world, 2, 70, 700, wide, "wide");
	check_allreduce(&d, world, 3, 5, 23, 2, 19, "strided");
	check_allreduce(&d, world, 4, 70, 700, 0, 650, "wide");
	check_allreduce(&d, world, 5, 0, 23, 2, 19, "no rows");
	check_same_everywhere(&d, world);
	check_split(&d, world);
	check_refusals(&d, world);
	dev_close(&d);
	before = failures - before;
	MPI_Allreduce(&before, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (world->rank == 0 && !all)
		printf("ok   %s: all-gather (uneven, wide, sub-communicators) and rank-order "
		       "all-reduce bit for bit on %d ranks; refusals\n", name, world->n);
}

int main(int argc, char **argv)
{
	struct job world = { .comm = MPI_COMM_WORLD };
	int all = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world.n);
	if (world.n != 3) {
		if (world.rank == 0)
			printf("FAIL: run under mpirun -np 3\n");
		MPI_Finalize();
		return 1;
	}
	for (int i = 1; i < argc; i++)
		check_backend(argv[i], &world);
	MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (world.rank == 0)
		printf("%d failures\n", all);
	MPI_Finalize();
	return all ? 1 : 0;
}
