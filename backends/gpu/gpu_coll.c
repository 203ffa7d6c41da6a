/*
 * gpu_coll.c: the `collective` slot (ABI 1.4) of the GPU backends, on
 * device memory, through the NCCL-shaped calls of gpu_rt.h: NCCL in
 * cuda.so, MPI under the emulator in gpuemu.so and gpuemu64.so. Built
 * where meson sets GPU_COLL (a collective library and MPI were found).
 *
 * Both operations are one all-gather of equal blocks, which is what
 * NCCL's all-gather moves. Each rank copies its columns of every row into
 * a block of rows x w floats (w: the widest share), the all-gather lays
 * the ranks' blocks side by side in scratch memory, and then
 *  - ALLGATHER copies the other ranks' blocks into their columns;
 *  - ALLREDUCE_SUM (every rank's block is the whole column range) adds
 *    the blocks up in rank order, ((x0 + x1) + x2) ..., one thread per
 *    element: every rank runs the same kernel on the same gathered bits,
 *    so all get the same result, and the single process's order. NCCL's
 *    own all-reduce promises no order (ring or tree), so it is not used.
 * The all-reduce receives (n-1) times the array where a ring receives
 * 2 (n-1)/n of it; a step's rows are few (decode: one per sequence), so
 * each call costs its latency more than its bytes (docs/DISTRIBUTED.md).
 *
 * A communicator is opened at the first call over a host communicator
 * and kept for the context's life: rank 0 makes an id, MPI_Bcast hands it
 * to the others, every rank joins with it. It is found again by the host
 * communicator's handle, which loom keeps as long as the model (a handle
 * freed and reused for another communicator would find the old one).
 */
#include <stdio.h>
#include <string.h>

#include "gpu_ctx.h"
#include "loom/backend_check.h"

void colls_free(struct loom_backend_ctx *ctx)
{
	for (int i = 0; i < ctx->n_comms; i++)
		gpurt_comm_close(ctx->rt, ctx->comms[i].comm);
	ctx->n_comms = 0;
	gpurt_free(ctx->rt, ctx->coll_buf);
	ctx->coll_buf = NULL;
	ctx->coll_cap = 0;
}

#if GPU_COLL
#include "../mpi/mpi_rt.h" /* MPI found at run time: not linked */

static int refuse(struct loom_backend_ctx *ctx, int rc, const char *why)
{
	gpu_log(ctx->host, LOOM_LOG_ERROR, GPU_BACKEND_NAME ": collective: %s", why);
	return rc;
}

/* Rank 0's id, or its failure, to every rank of the host communicator. */
static int share_id(struct loom_backend_ctx *ctx, const struct loom_collective_args *a,
		    unsigned char *id)
{
	unsigned char msg[1 + GPURT_COMM_ID_BYTES];

	const struct loom_mpi_rt *mpi = loom_mpi_rt(); /* found: comm_for */

	memset(msg, 0, sizeof(msg));
	if (a->rank == 0)
		msg[0] = rt_failed(ctx, gpurt_comm_id(ctx->rt, msg + 1)) == LOOM_OK;
	if (mpi->bcast(msg, (int)sizeof(msg), mpi->byte, 0, (MPI_Comm)a->comm) != MPI_SUCCESS)
		return refuse(ctx, LOOM_ERR_IO, "MPI_Bcast of the communicator id failed");
	if (!msg[0])
		return refuse(ctx, LOOM_ERR_DEVICE, "rank 0 could not make a communicator id");
	memcpy(id, msg + 1, GPURT_COMM_ID_BYTES);
	return LOOM_OK;
}

/* The communicator over a->comm: opened before, or opened now. */
static int comm_for(struct loom_backend_ctx *ctx, const struct loom_collective_args *a,
		    struct gpurt_comm **out)
{
	const struct loom_mpi_rt *mpi = loom_mpi_rt();
	unsigned char id[GPURT_COMM_ID_BYTES];
	struct comm_entry *e = ctx->comms;
	int size = 0, rank = -1, rc;

	for (int i = 0; i < ctx->n_comms; i++)
		if (e[i].mpi_comm == a->comm && e[i].n_ranks == a->n_ranks && e[i].rank == a->rank) {
			*out = e[i].comm;
			return LOOM_OK;
		}
	if (!mpi)
		return refuse(ctx, LOOM_ERR_UNSUPPORTED, "MPI is not loaded in this process (no distributed job started)");
	if (mpi->comm_size((MPI_Comm)a->comm, &size) != MPI_SUCCESS ||
	    mpi->comm_rank((MPI_Comm)a->comm, &rank) != MPI_SUCCESS || size != a->n_ranks ||
	    rank != a->rank)
		return refuse(ctx, LOOM_ERR_INVALID,
			      "the communicator does not match n_ranks and rank");
	if (ctx->n_comms == COMM_SLOTS)
		return refuse(ctx, LOOM_ERR_INVALID, "more host communicators than it keeps");
	rc = share_id(ctx, a, id);
	if (rc)
		return rc;
	e += ctx->n_comms;
	rc = gpurt_comm_open(ctx->rt, id, a->n_ranks, a->rank, a->comm, &e->comm);
	if (rc)
		return rt_failed(ctx, rc);
	e->mpi_comm = a->comm;
	e->n_ranks = a->n_ranks;
	e->rank = a->rank;
	ctx->n_comms++;
	*out = e->comm;
	return LOOM_OK;
}

/* The scratch: n_ranks + 1 blocks of `block` floats (receive, then send). */
static int reserve_blocks(struct loom_backend_ctx *ctx, int n_ranks, int64_t block)
{
	size_t bytes;
	int rc;

	if (__builtin_mul_overflow((size_t)block, (size_t)n_ranks + 1, &bytes) ||
	    __builtin_mul_overflow(bytes, sizeof(float), &bytes))
		return refuse(ctx, LOOM_ERR_NOMEM, "scratch size overflows");
	if (ctx->coll_cap >= bytes)
		return LOOM_OK;
	gpurt_free(ctx->rt, ctx->coll_buf); /* waits for the work still using it */
	ctx->coll_buf = NULL;
	ctx->coll_cap = 0;
	rc = gpurt_alloc(ctx->rt, bytes, &ctx->coll_buf);
	if (rc)
		return rt_failed(ctx, rc);
	ctx->coll_cap = bytes;
	return LOOM_OK;
}

/* Copies each other rank's block (rows x its width, w floats apart) into
 * its columns of x. */
static int unpack_others(struct loom_backend_ctx *ctx, const struct loom_collective_args *a,
			 const float *recv, int64_t w, int64_t block)
{
	const int64_t *cs = a->col_start;
	int rc = LOOM_OK;

	for (int r = 0; r < a->n_ranks && !rc; r++)
		if (r != a->rank)
			rc = gpurt_copy_cols(ctx->rt, a->x + cs[r], a->stride, recv + r * block, w,
					     a->rows, cs[r + 1] - cs[r]);
	return rt_failed(ctx, rc);
}

static int64_t widest(const struct loom_collective_args *a)
{
	int64_t w = 0;

	for (int r = 0; r < a->n_ranks; r++)
		if (a->col_start[r + 1] - a->col_start[r] > w)
			w = a->col_start[r + 1] - a->col_start[r];
	return w;
}

static int run(struct loom_backend_ctx *ctx, const struct loom_collective_args *a,
	       struct gpurt_comm *comm)
{
	const int64_t *cs = a->col_start;
	bool sum = a->op == LOOM_COLL_ALLREDUCE_SUM;
	int64_t c0 = sum ? cs[0] : cs[a->rank], w = cs[a->n_ranks] - cs[0], block;
	float *recv, *send;
	int rc;

	if (!sum) /* blocks as wide as the widest share */
		w = widest(a);
	if (a->rows == 0 || w == 0) /* the same on every rank: none calls */
		return LOOM_OK;
	if (__builtin_mul_overflow(a->rows, w, &block))
		return refuse(ctx, LOOM_ERR_NOMEM, "scratch size overflows");
	rc = reserve_blocks(ctx, a->n_ranks, block);
	if (rc)
		return rc;
	recv = ctx->coll_buf;
	send = recv + (size_t)a->n_ranks * (size_t)block;
	rc = gpurt_copy_cols(ctx->rt, send, w, a->x + c0, a->stride, a->rows,
			     sum ? w : cs[a->rank + 1] - c0);
	if (!rc)
		rc = gpurt_all_gather(ctx->rt, comm, send, recv, (size_t)block);
	if (rc)
		return rt_failed(ctx, rc);
	if (!sum)
		return unpack_others(ctx, a, recv, w, block);
	return rt_failed(ctx, gpurt_sum_parts(ctx->rt, a->x + cs[0], a->stride, recv, w, block,
					      a->n_ranks, a->rows, w));
}

int gpu_collective(struct loom_backend_ctx *ctx, const struct loom_collective_args *a)
{
	struct gpurt_comm *comm;
	int rc;

	if (!ctx || !a)
		return LOOM_ERR_INVALID;
	if (!LOOM_ARGS_HAS(a, struct loom_collective_args, col_start) ||
	    !loom_check_collective_layout(a))
		return refuse(ctx, LOOM_ERR_INVALID, "bad arguments");
	if (ctx->in_region) /* the host runs distributed steps outside regions */
		return refused_in_region(ctx, "collective");
	if (a->op != LOOM_COLL_ALLGATHER && a->op != LOOM_COLL_ALLREDUCE_SUM)
		return refuse(ctx, LOOM_ERR_UNSUPPORTED, "unknown operation");
	rc = comm_for(ctx, a, &comm);
	ctx->queued = true;
	shadows_clear(ctx); /* it writes device memory */
	return rc ? rc : run(ctx, a, comm);
}
#endif /* GPU_COLL */
