/* Step plans of a distributed job (internal): what rank 0 sends before
 * each step, and the loop the other ranks run on them (see dist.h). */
#ifndef LOOM_DIST_FOLLOW_H
#define LOOM_DIST_FOLLOW_H

#include <stddef.h>
#include <stdint.h>

struct loom_dist;
struct loom_kv;
struct loom_batch;
struct loom_exec;

/* Message tags of the point-to-point traffic. */
enum { LOOM_DIST_TAG_X = 1, LOOM_DIST_TAG_LOGITS = 2 };

/* Rank 0: sends step b's plan (tokens, sequences' block tables, output
 * rows, the cache blocks copied on write since the last plan, which the
 * other ranks copy first, and the step's micro-batches: cuts[n_micro + 1]
 * sequence indices, micro-batch k holding sequences cuts[k] ..
 * cuts[k+1]-1). 0 or -1 with err set. */
int loom_dist_plan_step(struct loom_dist *d, struct loom_kv *kv, const struct loom_batch *b,
			const int32_t *cuts, int32_t n_micro, char *err, size_t errlen);
/* Rank 0: tells the other ranks the job is over. */
int loom_dist_plan_stop(struct loom_dist *d, char *err, size_t errlen);
/* Ranks other than 0: runs rank 0's plans on e until the stop plan (0),
 * or a failure (-1 with err set; the caller ends its process, and so the
 * job). max_out: logits rows e holds at most; n_vocab: their width. */
int loom_dist_follow(struct loom_dist *d, struct loom_exec *e, int32_t max_out,
		     int32_t n_vocab, char *err, size_t errlen);

#endif
