/* Step plans (see follow.h). A plan is one int32 array:
 *   kind (PLAN_STEP or PLAN_STOP), n_tokens, n_seqs, n_out,
 *   n_copies (full-context pool), n_local_copies (windowed pool), n_micro,
 *   tokens[n_tokens], q_start[n_seqs + 1], out_rows[n_out],
 *   cuts[n_micro + 1] (the micro-batches' first sequences, then n_seqs),
 *   copies[2 * n_copies] and local copies (dst, src pairs),
 *   then per sequence: n_tokens, n_blocks, blocks[n_blocks], has_local,
 *   and with it n_tokens, n_dropped, n_blocks, blocks[n_blocks] of the
 *   windowed table.
 * The other ranks hold caches with the same pools and block counts as rank
 * 0's, so rank 0's block numbers address theirs.
 */
#include "dist/follow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "engine/kv.h"
#include "model/model.h"
#include "util.h"

enum { PLAN_STOP = 0, PLAN_STEP = 1, PLAN_HEAD = 7 };

struct plan_buf {
	int32_t *v;
	int32_t n, cap;
	bool overflow;
};

static void put(struct plan_buf *p, int32_t x)
{
	if (p->n == p->cap) {
		int32_t cap = p->cap ? 2 * p->cap : 1024;
		int32_t *nv = cap > 0 ? realloc(p->v, sizeof(int32_t) * (size_t)cap) : NULL;

		if (!nv) {
			p->overflow = true;
			return;
		}
		p->v = nv;
		p->cap = cap;
	}
	p->v[p->n++] = x;
}

static void put_n(struct plan_buf *p, const int32_t *x, int32_t n)
{
	for (int32_t i = 0; i < n; i++)
		put(p, x[i]);
}

static void put_seq(struct plan_buf *p, const struct loom_kv_seq *q)
{
	put(p, q->n_tokens);
	put(p, q->n_blocks);
	put_n(p, q->blocks, q->n_blocks);
	put(p, q->local != NULL);
	if (q->local) {
		put(p, q->local->n_tokens);
		put(p, q->local->n_dropped);
		put(p, q->local->n_blocks);
		put_n(p, q->local->blocks, q->local->n_blocks);
	}
}

int loom_dist_plan_step(struct loom_dist *d, struct loom_kv *kv, const struct loom_batch *b,
			const int32_t *cuts, int32_t n_micro, char *err, size_t errlen)
{
	static struct plan_buf p; /* rank 0's engine thread only */
	struct loom_kv *lk = kv->local;
	int rc;

	p.n = 0;
	p.overflow = false;
	put(&p, PLAN_STEP);
	put(&p, b->n_tokens);
	put(&p, b->n_seqs);
	put(&p, b->n_out);
	put(&p, kv->n_copy_log);
	put(&p, lk ? lk->n_copy_log : 0);
	put(&p, n_micro);
	put_n(&p, b->tokens, b->n_tokens);
	put_n(&p, b->q_start, b->n_seqs + 1);
	put_n(&p, b->out_rows, b->n_out);
	put_n(&p, cuts, n_micro + 1);
	put_n(&p, kv->copy_log, 2 * kv->n_copy_log);
	if (lk)
		put_n(&p, lk->copy_log, 2 * lk->n_copy_log);
	for (int32_t s = 0; s < b->n_seqs; s++)
		put_seq(&p, b->seqs[s]);
	if (p.overflow) {
		loom_seterr(err, errlen, "distributed: out of memory for a step plan");
		return -1;
	}
	rc = loom_dist_plan_send(d, p.v, p.n, err, errlen);
	kv->n_copy_log = 0;
	if (lk)
		lk->n_copy_log = 0;
	return rc;
}

int loom_dist_plan_stop(struct loom_dist *d, char *err, size_t errlen)
{
	int32_t stop = PLAN_STOP;

	return loom_dist_plan_send(d, &stop, 1, err, errlen);
}

/* A plan being read: every take checks the length. */
struct reader {
	int32_t *v;
	int32_t n, at;
	bool bad;
};

static int32_t *take(struct reader *r, int64_t n)
{
	int32_t *p = r->v + r->at;

	if (n < 0 || n > r->n - r->at) {
		r->bad = true;
		return NULL;
	}
	r->at += (int32_t)n;
	return p;
}

static int32_t take1(struct reader *r)
{
	int32_t *p = take(r, 1);

	return p ? *p : -1;
}

/* The plan's block numbers must be blocks of the pool. */
static bool blocks_ok(const struct loom_kv *kv, const int32_t *blocks, int32_t n, bool holes)
{
	for (int32_t j = 0; j < n; j++)
		if (blocks[j] >= kv->n_blocks || blocks[j] < (holes ? -1 : 0))
			return false;
	return true;
}

static void read_seq(struct reader *r, const struct loom_kv *kv, struct loom_kv_seq *q,
		     struct loom_kv_seq *lq)
{
	/* one take per statement: initializers run in no set order */
	memset(q, 0, sizeof(*q));
	q->n_tokens = take1(r);
	q->n_blocks = take1(r);
	q->blocks = take(r, q->n_blocks);
	q->cap = q->n_blocks;
	if (!q->blocks || !blocks_ok(kv, q->blocks, q->n_blocks, false)) {
		r->bad = true;
		return;
	}
	if (take1(r) != 1)
		return;
	memset(lq, 0, sizeof(*lq));
	lq->n_tokens = take1(r);
	lq->n_dropped = take1(r);
	lq->n_blocks = take1(r);
	lq->blocks = take(r, lq->n_blocks);
	lq->cap = lq->n_blocks;
	if (!kv->local || !lq->blocks || !blocks_ok(kv->local, lq->blocks, lq->n_blocks, true))
		r->bad = true;
	q->local = lq;
}

/* Storage for a decoded plan's sequences (grown to the largest plan),
 * and its micro-batches (cuts point into the plan). */
struct follower {
	struct loom_kv_seq *seqs, *locals, **ptrs;
	int32_t cap;
	const int32_t *cuts;
	int32_t n_micro;
};

static int grow(struct follower *f, int32_t n)
{
	if (n <= f->cap)
		return 0;
	free(f->seqs);
	free(f->locals);
	free(f->ptrs);
	f->seqs = calloc((size_t)n, sizeof(*f->seqs));
	f->locals = calloc((size_t)n, sizeof(*f->locals));
	f->ptrs = calloc((size_t)n, sizeof(*f->ptrs));
	f->cap = f->seqs && f->locals && f->ptrs ? n : 0;
	return f->cap ? 0 : -1;
}

static int copy_blocks(struct loom_kv *kv, const int32_t *pairs, int32_t n)
{
	for (int32_t i = 0; i < n; i++) {
		int rc = kv ? loom_kv_copy_block(kv, pairs[2 * i], pairs[2 * i + 1]) :
			LOOM_ERR_INVALID;

		if (rc)
			return rc;
	}
	return 0;
}

/* Decodes a step plan into b and makes its copies. */
static int read_step(struct reader *r, struct follower *f, struct loom_kv *kv,
		     struct loom_batch *b, char *err, size_t errlen)
{
	/* the head after the kind: n_tokens, n_seqs, n_out, copies, local
	 * copies, micro-batches */
	int32_t *h = take(r, PLAN_HEAD - 1), *copies, *lcopies;

	if (!h || h[1] <= 0 || h[5] <= 0 || grow(f, h[1])) {
		loom_seterr(err, errlen, "distributed: a bad step plan (or out of memory)");
		return -1;
	}
	*b = (struct loom_batch){ .n_tokens = h[0], .n_seqs = h[1], .n_out = h[2] };
	b->tokens = take(r, h[0]);
	b->q_start = take(r, (int64_t)h[1] + 1);
	b->out_rows = take(r, h[2]);
	f->cuts = take(r, (int64_t)h[5] + 1);
	f->n_micro = h[5];
	copies = take(r, 2 * (int64_t)h[3]);
	lcopies = take(r, 2 * (int64_t)h[4]);
	for (int32_t s = 0; s < b->n_seqs && !r->bad; s++) {
		read_seq(r, kv, &f->seqs[s], &f->locals[s]);
		f->ptrs[s] = &f->seqs[s];
	}
	b->seqs = f->ptrs;
	if (r->bad || r->at != r->n) {
		loom_seterr(err, errlen, "distributed: a step plan of %d words does not parse", r->n);
		return -1;
	}
	if (copy_blocks(kv, copies, h[3]) || copy_blocks(kv->local, lcopies, h[4])) {
		loom_seterr(err, errlen, "distributed: copying cache blocks as rank 0 did failed");
		return -1;
	}
	return 0;
}

int loom_dist_follow(struct loom_dist *d, struct loom_exec *e, int32_t max_out,
		     int32_t n_vocab, char *err, size_t errlen)
{
	struct follower f = { 0 };
	struct reader r = { 0 };
	int32_t cap = 0;
	float *logits = calloc((size_t)max_out * (size_t)n_vocab, sizeof(float));
	struct loom_batch b;
	int rc = -1;

	if (!logits) {
		loom_seterr(err, errlen, "distributed: out of memory");
		return -1;
	}
	for (;;) {
		if (loom_dist_plan_recv(d, &r.v, &cap, &r.n, err, errlen))
			break;
		if (r.n >= 1 && r.v[0] == PLAN_STOP) {
			rc = 0;
			break;
		}
		r.at = 0;
		r.bad = false;
		if (take1(&r) != PLAN_STEP || read_step(&r, &f, loom_exec_kv(e), &b, err, errlen))
			break;
		loom_dist_busy(d, "a step");
		if (loom_exec_run_micro(e, &b, f.cuts, f.n_micro, logits, err, errlen))
			loom_dist_abort(d, err); /* the others are inside this step */
		loom_dist_busy(d, NULL);
	}
	loom_dist_busy(d, NULL);
	free(r.v);
	free(f.seqs);
	free(f.locals);
	free(f.ptrs);
	free(logits);
	return rc;
}
