/* A rank's share of a model (see shard.h). */
#include "model/shard.h"

#include <string.h>

#include "model/model.h"
#include "util.h"

/* Part r of n things split into `parts` nearly equal contiguous runs. */
static int64_t part_start(int64_t n, int parts, int r)
{
	return n * r / parts;
}

static void split_cols(int64_t *cols, int64_t n, int64_t unit, int tp)
{
	for (int r = 0; r <= tp; r++)
		cols[r] = part_start(n, tp, r) * unit;
}

void loom_shard_single(struct loom_shard *s, const struct loom_hparams *hp)
{
	memset(s, 0, sizeof(*s));
	s->tp = s->pp = 1;
	s->q_hi = hp->n_head;
	s->kv_hi = hp->n_head_kv;
	s->ff_hi = hp->n_ff;
	s->fx_hi = hp->n_ff_exp;
	s->fs_hi = hp->n_ff_shexp;
	s->embd_hi = hp->n_embd;
	s->layer_hi = (int32_t)hp->n_layer;
	s->first = s->last = s->logits = true;
	s->prev_rank = s->next_rank = -1;
}

/* Query and KV heads of tensor rank r: whole KV groups when tp <= n_kv,
 * else a run of query heads inside one group. */
static int split_heads(struct loom_shard *s, const struct loom_hparams *hp, int tp, int r,
		       char *err, size_t errlen)
{
	int64_t g = hp->n_head / hp->n_head_kv;

	if (tp <= hp->n_head_kv) {
		s->kv_lo = part_start(hp->n_head_kv, tp, r);
		s->kv_hi = part_start(hp->n_head_kv, tp, r + 1);
		s->q_lo = s->kv_lo * g;
		s->q_hi = s->kv_hi * g;
		return 0;
	}
	if (tp % hp->n_head_kv || hp->n_head % tp) {
		loom_seterr(err, errlen, "--tp %d does not split this model's %lld query heads in %lld KV groups: use at most %lld ranks, or a count that divides %lld and is a multiple of %lld",
			    tp, (long long)hp->n_head, (long long)hp->n_head_kv,
			    (long long)hp->n_head_kv, (long long)hp->n_head,
			    (long long)hp->n_head_kv);
		return -1;
	}
	s->q_lo = hp->n_head / tp * r;
	s->q_hi = s->q_lo + hp->n_head / tp;
	s->kv_lo = s->q_lo / g;
	s->kv_hi = s->kv_lo + 1;
	return 0;
}

static void att_cols(struct loom_shard *s, const struct loom_hparams *hp, int tp)
{
	for (int r = 0; r <= tp; r++) {
		struct loom_shard t = { 0 };

		if (r == tp) {
			s->cols[SPLIT_ATT][r] = hp->n_head * hp->head_dim;
			break;
		}
		split_heads(&t, hp, tp, r, NULL, 0);
		s->cols[SPLIT_ATT][r] = t.q_lo * hp->head_dim;
	}
}

int loom_shard_plan(struct loom_shard *s, const struct loom_hparams *hp, int tp, int pp,
		    int rank, char *err, size_t errlen)
{
	int last_stage = pp - 1;

	loom_shard_single(s, hp);
	if (tp < 1 || pp < 1 || tp > LOOM_SHARD_MAX_TP || rank < 0 || rank >= tp * pp) {
		loom_seterr(err, errlen, "--tp %d: at most %d tensor ranks", tp, LOOM_SHARD_MAX_TP);
		return -1;
	}
	if (pp > hp->n_layer) {
		loom_seterr(err, errlen, "--pp %d: the model has only %lld layers", pp,
			    (long long)hp->n_layer);
		return -1;
	}
	if (tp > hp->n_head || tp > hp->n_ff || tp > hp->n_embd || hp->n_head_kv <= 0) {
		loom_seterr(err, errlen, "--tp %d: the model has only %lld query heads", tp,
			    (long long)hp->n_head);
		return -1;
	}
	s->tp = tp;
	s->pp = pp;
	s->rank = rank;
	s->tp_rank = rank % tp;
	s->stage = rank / tp;
	if (split_heads(s, hp, tp, s->tp_rank, err, errlen))
		return -1;
	att_cols(s, hp, tp);
	split_cols(s->cols[SPLIT_EMBD], hp->n_embd, 1, tp);
	split_cols(s->cols[SPLIT_FF], hp->n_ff, 1, tp);
	for (int r = 0; r <= tp; r++)
		s->cols[SPLIT_SUM][r] = r ? hp->n_embd : 0;
	s->ff_lo = s->cols[SPLIT_FF][s->tp_rank];
	s->ff_hi = s->cols[SPLIT_FF][s->tp_rank + 1];
	s->embd_lo = s->cols[SPLIT_EMBD][s->tp_rank];
	s->embd_hi = s->cols[SPLIT_EMBD][s->tp_rank + 1];
	s->layer_lo = (int32_t)part_start(hp->n_layer, pp, s->stage);
	s->layer_hi = (int32_t)part_start(hp->n_layer, pp, s->stage + 1);
	s->first = s->stage == 0;
	s->last = s->stage == last_stage;
	s->logits_rank = last_stage * tp;
	s->logits = rank == s->logits_rank;
	s->prev_rank = s->first ? -1 : rank - tp;
	s->next_rank = s->last ? -1 : rank + tp;
	return 0;
}

/* Part tp_rank of n columns in whole units of `unit` values; false when
 * n is not a whole number of units or has fewer units than ranks. */
static bool unit_split(int64_t n, int64_t unit, int tp, int r, int64_t *lo, int64_t *hi)
{
	if (n <= 0) {
		*lo = *hi = 0;
		return true;
	}
	if (unit <= 0 || n % unit || n / unit < tp)
		return false;
	*lo = part_start(n / unit, tp, r) * unit;
	*hi = part_start(n / unit, tp, r + 1) * unit;
	return true;
}

bool loom_shard_split_experts(struct loom_shard *s, const struct loom_hparams *hp,
			      int64_t unit_exp, int64_t unit_shexp)
{
	int64_t xl, xh, sl, sh;

	if (s->tp < 2 || !unit_split(hp->n_ff_exp, unit_exp, s->tp, s->tp_rank, &xl, &xh) ||
	    !unit_split(hp->n_ff_shexp, unit_shexp, s->tp, s->tp_rank, &sl, &sh))
		return false;
	s->moe_split = true;
	s->fx_lo = xl, s->fx_hi = xh;
	s->fs_lo = sl, s->fs_hi = sh;
	return true;
}
