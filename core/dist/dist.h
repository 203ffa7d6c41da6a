/* A distributed job (internal): tensor and pipeline parallelism over MPI.
 *
 * Under mpirun with --tp T --pp P the job has T * P ranks. Rank r is tensor
 * rank r % T of pipeline stage r / T: a stage holds a contiguous range of
 * layers, and within a stage each tensor rank holds a share of every
 * layer's heads and FFN columns (core/model/shard.c). Rank 0 tokenizes,
 * schedules, samples and serves; before each step it broadcasts the step's
 * plan (loom_dist_plan_*), which every other rank executes
 * (loom_dist_follow in core/dist/follow.c).
 *
 * Watchdog: while a rank is inside a step (loom_dist_busy), a thread checks
 * that the step ends within LOOM_DIST_TIMEOUT seconds (default 60); if not,
 * the rank prints which step it waited on and ends its process with status
 * 1, and mpirun ends the job. Rank 0 also catches SIGTERM (what mpirun
 * sends when another rank died) and says so before exiting.
 */
#ifndef LOOM_DIST_H
#define LOOM_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct loom_dist {
	int rank, size;      /* in the world communicator */
	int tp, pp;          /* tp * pp == size */
	int tp_rank, stage;  /* rank == stage * tp + tp_rank */
	void *world;         /* MPI_Comm */
	void *tp_comm;       /* MPI_Comm: the ranks of this stage */
	double timeout;      /* seconds (LOOM_DIST_TIMEOUT) */
	bool initialized_mpi; /* MPI_Init_thread was ours: finalize at close */
	bool broken;          /* a step failed: close without MPI_Finalize (which
				 would wait for the others); exiting ends the job */
	int micro;            /* rank 0: micro-batches a pipelined step splits
				 into at most (--pp-micro; 1: none); 0: by
				 the step's size */
	struct loom_dist_watch *watch;
	void *posted;         /* MPI_Request[n_posted] (loom_dist_post_*) */
	int n_posted, cap_posted;
};

/* Joins the job (the first call loads the MPI module, dist_module.h): initializes MPI if nobody did, checks the world's size
 * is tp * pp, splits the stage communicator, starts the watchdog. NULL
 * with err set. */
struct loom_dist *loom_dist_open(int tp, int pp, char *err, size_t errlen);
void loom_dist_close(struct loom_dist *d);

/* All ranks: true when every rank passed ok == true (a collective; every
 * rank must call it at the same point). */
bool loom_dist_all_ok(struct loom_dist *d, bool ok);
/* All ranks: the smallest of every rank's v (a collective), for values
 * each rank measures for itself but all must share, such as the default
 * KV reservation from each host's free memory. v itself on failure. */
uint64_t loom_dist_min_u64(struct loom_dist *d, uint64_t v);
/* All ranks: rank 0's n values are compared with this rank's; false on
 * any rank (on all ranks) when one differs; err names value `names[i]`. */
bool loom_dist_agree(struct loom_dist *d, const int64_t *vals, const char *const *names,
		     int n, char *err, size_t errlen);

/* Ends the whole job now (MPI_Abort) after printing `why` with this
 * rank's number: for a failure after which the ranks can no longer agree
 * on what runs next (a step that failed on some ranks only). */
void loom_dist_abort(struct loom_dist *d, const char *why) __attribute__((noreturn));

/* Marks the start (what: "step 12") and end (NULL) of a stretch the
 * watchdog times. */
void loom_dist_busy(struct loom_dist *d, const char *what);

/* Rank 0: sends a plan of n int32 to every other rank. Others: receives
 * one into *buf (grown as needed, *cap its capacity), *n its length.
 * 0 or -1 with err set. */
int loom_dist_plan_send(struct loom_dist *d, const int32_t *plan, int32_t n, char *err,
			size_t errlen);
int loom_dist_plan_recv(struct loom_dist *d, int32_t **buf, int32_t *cap, int32_t *n,
			char *err, size_t errlen);

/* Point-to-point bytes between world ranks (pipeline activations,
 * logits). 0 or -1 with err set. */
int loom_dist_send(struct loom_dist *d, const void *buf, size_t bytes, int to, int tag,
		   char *err, size_t errlen);
int loom_dist_recv(struct loom_dist *d, void *buf, size_t bytes, int from, int tag,
		   char *err, size_t errlen);

/* Non-blocking point-to-point bytes (at most INT_MAX): starts the transfer
 * and returns; buf must stay as it is until loom_dist_wait_posted.
 * Transfers posted between the same two ranks with the same tag match in
 * the order they were posted. A pipeline step's micro-batches pass their
 * logits this way: rank 0 posts every receive before its first
 * micro-batch, and the last stage never waits on rank 0 to send them. 0
 * or -1 with err set. */
int loom_dist_post_recv(struct loom_dist *d, void *buf, size_t bytes, int from, int tag,
			char *err, size_t errlen);
int loom_dist_post_send(struct loom_dist *d, const void *buf, size_t bytes, int to, int tag,
			char *err, size_t errlen);
/* Waits for every posted transfer of this rank. 0 or -1 with err set. */
int loom_dist_wait_posted(struct loom_dist *d, char *err, size_t errlen);

#endif /* LOOM_DIST_H */
