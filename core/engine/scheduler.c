/* Continuous-batching scheduler: iteration-level batching over the paged
 * KV cache, chunked prefill, prefix caching and preemption by recompute.
 *
 * Threads: submit/cancel/stats touch only what the mutex guards (the
 * pending list, the cancel list, the published stats). Everything else
 * (waiting queue, running set, KV cache, executor) belongs to the engine
 * thread that calls loom_sched_step; callbacks run there, with no lock
 * held, so they may call submit or cancel.
 */
#include "engine/scheduler.h"
#include "dist/follow.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar.h"
#include "engine/spec.h"
#include "util.h"

#define DEFAULT_KV_BYTES (256ull << 20)
/* most rows a speculating decode verifies: its last token and 64 drafts */
#define SPEC_ROWS_MAX 65

struct req {
	/* the queue and the caller */
	uint64_t id;
	struct req *prev, *next;  /* pending or waiting list */
	loom_sched_cb cb;
	void *user;
	/* tokens and their KV cache */
	int32_t *tokens;          /* prompt, then generated tokens */
	int32_t n_tokens, n_prompt, n_predict, n_generated;
	int32_t n_cached;         /* prompt tokens reused at first admission */
	bool admitted;            /* admitted at least once */
	uint64_t preempted_tick;  /* tick of the last preemption; 0: never */
	uint64_t *hashes;         /* chain hashes of the first n_hashed full blocks */
	int32_t n_hashed;
	int32_t n_registered;     /* leading blocks already in the prefix cache */
	struct loom_kv_seq seq;
	/* sampling */
	struct loom_sampler *smp; /* lives across preemption: draws continue */
	bool ignore_eog;
	/* speculation (NULL kind: none); the context is made on the engine
	 * thread at the first decode and lives until the request ends */
	struct {
		struct loom_spec_kind *kind;
		struct loom_spec_seq *sq;
		int32_t max_draft;
		bool greedy;
		uint64_t seed;    /* of its acceptance streams */
		/* a token tree's parent per row (SPEC_ROWS_MAX), made with sq */
		int32_t *parent;
	} spec;
	/* constrained decoding: the grammar (a reference) and its matcher,
	 * made on the engine thread at the first sampled token */
	struct {
		struct loom_grammar *grammar;
		struct loom_gmatch *gm;
	} gram;
	/* outputs beyond the tokens: logits, log-probabilities (logprobs)
	 * and hidden states (see loom.h) */
	struct {
		float *first_logits;  /* copy of the first sampled row, or NULL */
		float *all_logits;    /* n_prompt rows, or NULL */
		bool logprobs;
		int32_t n_top;
		struct loom_token_logprob *prompt_lp; /* n_prompt x (1 + n_top) */
		float *hidden;                        /* n_prompt x n_embd */
		/* the logprobs of the token being delivered, for its event */
		float ev_logprob;
		struct loom_token_logprob ev_top[LOOM_MAX_TOP_LOGPROBS];
	} out;
};

struct req_list {
	struct req *head, *tail;
	int32_t n;
};

/* One sequence's share of a step: n tokens from seq.n_tokens on. */
struct entry {
	struct req *r;
	int32_t n;
	bool spec;   /* a speculating decode: 1 token + n - 1 drafts, n rows */
	bool tree;   /* its drafts are a token tree (parents: r->spec.parent) */
	bool asked;  /* its strategy proposed (and so gets observe) */
	bool all;    /* a prompt chunk of a request that keeps every row
		      (all_logits, prompt_logprobs, hidden): n rows */
	bool last;   /* its last token is the sequence's last: sample after */
	int32_t row; /* first logits row of this entry, -1 for none */
	int32_t pos; /* position of its first token (set when it runs) */
};

struct loom_sched {
	struct loom_model *m;
	struct loom_sched_config cfg;
	struct loom_kv *kv;
	struct loom_exec *exec;
	int32_t n_vocab;

	/* engine thread only */
	struct req_list waiting;
	struct req **running; /* admission order, newest last */
	int32_t n_running;
	struct entry *plan;
	int32_t n_plan;
	int32_t *tok_buf, *q_start, *out_rows;
	int32_t *parent_buf; /* a step's token-tree parents (loom_batch.parent) */
	bool trees;          /* the executor verifies token trees */
	struct loom_kv_seq **seqs;
	float *logits;
	struct loom_sched_stats eng; /* counters kept by the engine */
	uint64_t *cancel_buf;
	int32_t cancel_cap;
	uint64_t tick; /* loom_sched_step calls, from 1 */
	int32_t max_out;   /* logits rows per step: max_seqs + spec_rows */
	int32_t rows_left; /* spare rows for drafts in the step being planned */
	/* batch-aware drafting (spec_step_rows): drafts left to share in the
	 * step being planned, and the speculating decodes still to plan */
	int32_t step_drafts, step_spec;
	/* the target and its cache, lent to the early-exit drafting runner */
	struct loom_spec_target *spec_target;
	struct loom_gvocab *gvocab; /* the vocabulary's trie, at the first grammar */
	float *raw_row;    /* a logits row before masks and penalties (logprobs) */
	float *hidden_buf; /* a step's hidden rows, max_out x n_embd */
	/* steps sampled on the device: each logit row's rule, and the
	 * penalty pairs (pen_cap of room) */
	struct loom_sample_row *smp_rows;
	int32_t *pen_tok, *pen_cnt, pen_cap;

	/* guarded by mu */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct req_list pending;
	uint64_t *cancels;
	int32_t n_cancels, cap_cancels;
	uint64_t next_id, rejected;
	int32_t n_active;            /* waiting + running after the last step */
	bool stop;
	struct loom_sched_stats pub; /* published after each step */
};

void loom_sched_config_defaults(struct loom_sched_config *c)
{
	*c = (struct loom_sched_config){
		.block_size = 16, .n_blocks = 0, .max_batch_tokens = 512,
		.max_seqs = 64, .max_waiting = 256, .max_ctx = 0,
		.prefix_cache = true, .tokenizer = NULL, .spec_rows = 64,
	};
}

/* Blocks of `type` that fit in kv_bytes for model m; 0 if not even one. */
static int64_t plan_blocks(const struct loom_model *m, uint32_t type, int32_t block_size,
			   uint64_t kv_bytes)
{
	const struct loom_hparams *hp = &m->hp;
	size_t per_block;
	uint64_t n;

	if (block_size <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0 ||
	    hp->n_head_kv > INT64_MAX / hp->head_dim)
		return 0;
	/* 2 (K and V) * n_layer * block_size * kv_dim values of type */
	per_block = loom_kv_type_bytes(type, hp->n_layer, hp->n_head_kv * hp->head_dim,
				       block_size, 1);
	if (!per_block)
		return 0;
	n = kv_bytes / per_block;
	if (n > (uint64_t)(INT32_MAX / block_size))
		n = (uint64_t)(INT32_MAX / block_size); /* slots are int32 */
	return (int64_t)n;
}

int64_t loom_sched_plan_blocks(const struct loom_model *m, int32_t block_size,
			       uint64_t kv_bytes)
{
	return plan_blocks(m, LOOM_TYPE_F32, block_size, kv_bytes);
}

/* Each layer's window (0: full context), for the KV cache; NULL: no memory. */
static int32_t *layer_windows(const struct loom_model *m)
{
	int32_t *w = malloc(sizeof(int32_t) * (size_t)(m->hp.n_layer > 0 ? m->hp.n_layer : 1));

	for (int64_t l = 0; w && l < m->hp.n_layer; l++)
		w[l] = m->layers[l].window;
	return w;
}

void loom_sched_plan_kv(const struct loom_model *m, const struct loom_sched_config *c,
			uint64_t kv_bytes, struct loom_kv_plan *p)
{
	const struct loom_hparams *hp = &m->hp;
	int64_t bs = c->block_size, kv_dim = hp->n_head_kv * hp->head_dim, cap;
	int32_t *w = layer_windows(m);
	size_t pg, pl = 0;
	unsigned __int128 d;

	*p = (struct loom_kv_plan){ 0 };
	if (bs <= 0 || !w)
		goto out;
	p->n_local_layers = loom_kv_split(w, hp->n_layer, &p->window);
	p->seq_blocks = ((int64_t)c->max_ctx + bs - 1) / bs;
	if (p->n_local_layers) {
		p->seq_local_blocks = loom_kv_window_blocks(p->window, bs, c->max_batch_tokens);
		if (p->seq_local_blocks > p->seq_blocks)
			p->seq_local_blocks = p->seq_blocks;
		pl = loom_kv_type_bytes(c->kv_type, p->n_local_layers, kv_dim, bs, 1);
	}
	pg = loom_kv_type_bytes(c->kv_type, hp->n_layer - p->n_local_layers, kv_dim, bs, 1);
	p->token_bytes = loom_kv_type_bytes(c->kv_type, hp->n_layer, kv_dim, 1, 1);
	if (!pg || (p->n_local_layers && !pl))
		goto out;
	if (!kv_bytes) {
		p->n_blocks = p->seq_blocks * c->max_seqs + 1;
		p->n_local_blocks = p->n_local_layers ? p->seq_local_blocks * c->max_seqs + 1 : 0;
	} else { /* n * pg + n_local * pl <= kv_bytes, n : n_local = seq : seq_local */
		d = (unsigned __int128)p->seq_blocks * pg +
		    (unsigned __int128)p->seq_local_blocks * pl;
		p->n_blocks = (int64_t)((unsigned __int128)kv_bytes * p->seq_blocks / d);
		p->n_local_blocks = (int64_t)((unsigned __int128)kv_bytes * p->seq_local_blocks / d);
	}
	cap = INT32_MAX / bs; /* slots are int32 */
	if (p->n_blocks > cap)
		p->n_blocks = cap;
	if (p->n_local_blocks > cap)
		p->n_local_blocks = cap;
	p->bytes = (uint64_t)p->n_blocks * pg + (uint64_t)p->n_local_blocks * pl;
out:
	free(w);
}

/* ---- lists ---- */

static void list_push_back(struct req_list *l, struct req *r)
{
	r->next = NULL;
	r->prev = l->tail;
	if (l->tail)
		l->tail->next = r;
	else
		l->head = r;
	l->tail = r;
	l->n++;
}

static void list_push_front(struct req_list *l, struct req *r)
{
	r->prev = NULL;
	r->next = l->head;
	if (l->head)
		l->head->prev = r;
	else
		l->tail = r;
	l->head = r;
	l->n++;
}

static void list_remove(struct req_list *l, struct req *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		l->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		l->tail = r->prev;
	r->prev = r->next = NULL;
	l->n--;
}

/* Appends all of src to dst (src becomes empty). */
static void list_splice(struct req_list *dst, struct req_list *src)
{
	if (!src->head)
		return;
	if (dst->tail) {
		dst->tail->next = src->head;
		src->head->prev = dst->tail;
	} else {
		dst->head = src->head;
	}
	dst->tail = src->tail;
	dst->n += src->n;
	*src = (struct req_list){ 0 };
}

/* ---- requests ---- */

static void req_free(struct loom_sched *s, struct req *r)
{
	loom_kv_seq_release(s->kv, &r->seq);
	loom_spec_seq_free(r->spec.sq);
	free(r->spec.parent);
	loom_sampler_free(r->smp);
	loom_gmatch_free(r->gram.gm);
	loom_grammar_free(r->gram.grammar);
	free(r->tokens);
	free(r->hashes);
	free(r);
}

static void emit(struct req *r, int32_t token, enum loom_finish fin, const char *error)
{
	struct loom_event ev = {
		.id = r->id, .token = token, .finish = fin, .n_prompt = r->n_prompt,
		.n_generated = r->n_generated, .n_cached = r->n_cached, .error = error,
	};

	if (r->out.logprobs && token >= 0) {
		ev.logprob = r->out.ev_logprob;
		ev.top = r->out.ev_top;
		ev.n_top = r->out.n_top;
	}

	if (r->cb)
		r->cb(r->user, &ev);
}

/* Delivers the final event and forgets the request (not in any list). */
static void finish(struct loom_sched *s, struct req *r, enum loom_finish fin,
		   const char *error)
{
	emit(r, -1, fin, error);
	req_free(s, r);
}

static int running_index(const struct loom_sched *s, const struct req *r)
{
	int32_t i;

	for (i = 0; i < s->n_running; i++)
		if (s->running[i] == r)
			return i;
	return -1;
}

static void running_remove(struct loom_sched *s, struct req *r)
{
	int i = running_index(s, r);

	if (i < 0)
		return;
	memmove(s->running + i, s->running + i + 1,
		sizeof(*s->running) * (size_t)(s->n_running - i - 1));
	s->n_running--;
}

/* Drops r's entry from this step's plan; returns the tokens it had. */
static int32_t plan_remove(struct loom_sched *s, const struct req *r)
{
	int32_t i, n;

	for (i = 0; i < s->n_plan; i++) {
		if (s->plan[i].r != r)
			continue;
		n = s->plan[i].n;
		memmove(s->plan + i, s->plan + i + 1,
			sizeof(*s->plan) * (size_t)(s->n_plan - i - 1));
		s->n_plan--;
		return n;
	}
	return 0;
}

/* ---- submit / cancel / stats (any thread) ---- */

/* Windowed-layer blocks a sequence of `total` tokens holds at most: all
 * of its blocks when it is short, else a window and a step's reservation
 * (a prompt chunk or a decode with drafts, at most the step budget). */
static int64_t local_blocks(const struct loom_sched *s, int64_t total)
{
	int64_t all = (total + s->cfg.block_size - 1) / s->cfg.block_size;
	int64_t win = loom_kv_window_blocks(s->kv->local->window, s->cfg.block_size,
					    s->cfg.max_batch_tokens);

	return win < all ? win : all;
}

static int check_request(struct loom_sched *s, const struct loom_sched_request *rq,
			 int32_t *n_predict, char *err, size_t errlen)
{
	int64_t total, blocks, i;

	if (!rq->prompt || rq->n_prompt <= 0) {
		loom_seterr(err, errlen, "request: empty prompt");
		return LOOM_ERR_INVALID;
	}
	for (i = 0; i < rq->n_prompt; i++) {
		if (rq->prompt[i] < 0 || rq->prompt[i] >= s->n_vocab) {
			loom_seterr(err, errlen, "request: token id %d out of range (vocabulary %d)",
				rq->prompt[i], s->n_vocab);
			return LOOM_ERR_INVALID;
		}
	}
	if (rq->top_logprobs < 0 || rq->top_logprobs > LOOM_MAX_TOP_LOGPROBS) {
		loom_seterr(err, errlen, "request: top_logprobs %d is outside 0..%d",
			rq->top_logprobs, LOOM_MAX_TOP_LOGPROBS);
		return LOOM_ERR_INVALID;
	}
	if (rq->hidden && s->m->shard.dist) {
		loom_seterr(err, errlen, "request: hidden states are not available in a distributed job (--tp, --pp)");
		return LOOM_ERR_UNSUPPORTED;
	}
	if (rq->spec && (rq->logprobs || rq->prompt_logprobs || rq->hidden)) {
		loom_seterr(err, errlen, "request: logprobs and hidden states need plain decoding");
		return LOOM_ERR_INVALID;
	}
	if (rq->spec_max_draft > 64) {
		loom_seterr(err, errlen, "request: spec_max_draft %d is above 64", rq->spec_max_draft);
		return LOOM_ERR_INVALID;
	}
	*n_predict = rq->n_predict > 0 ? rq->n_predict : s->cfg.max_ctx - rq->n_prompt;
	if (rq->hidden)
		*n_predict = 1; /* ends after its prompt; room kept as for a token */
	total = (int64_t)rq->n_prompt + *n_predict;
	if (*n_predict <= 0 || total > s->cfg.max_ctx) {
		loom_seterr(err, errlen, "request: %d prompt + %d predicted tokens exceed the context of %d",
			rq->n_prompt, rq->n_predict, s->cfg.max_ctx);
		return LOOM_ERR_CONTEXT;
	}
	/* one spare block for a copy-on-write */
	blocks = (total + s->cfg.block_size - 1) / s->cfg.block_size + 1;
	if (blocks > s->kv->n_blocks) {
		loom_seterr(err, errlen, "request: needs %lld KV blocks, the cache has %lld",
			(long long)blocks, (long long)s->kv->n_blocks);
		return LOOM_ERR_INVALID;
	}
	if (s->kv->local) {
		int64_t w = local_blocks(s, total) + 1;

		if (w > s->kv->local->n_blocks) {
			loom_seterr(err, errlen, "request: needs %lld KV blocks for its windowed layers, the cache has %lld",
				(long long)w, (long long)s->kv->local->n_blocks);
			return LOOM_ERR_INVALID;
		}
	}
	return 0;
}

/* Row 0 of prompt_logprobs: the first token has no context to be
 * predicted from. */
static void prompt_lp_first(struct req *r, int32_t n_top)
{
	r->out.prompt_lp[0] = (struct loom_token_logprob){ r->tokens[0], NAN };
	for (int32_t k = 1; k <= n_top; k++)
		r->out.prompt_lp[k] = (struct loom_token_logprob){ -1, NAN };
}

static struct req *req_new(struct loom_sched *s, const struct loom_sched_request *rq,
			   int32_t n_predict, char *err, size_t errlen)
{
	int32_t cap = rq->n_prompt + n_predict; /* <= max_ctx, checked */
	struct req *r = calloc(1, sizeof(*r));

	if (!r)
		goto out_nomem;
	r->tokens = malloc(sizeof(int32_t) * (size_t)cap);
	r->hashes = malloc(sizeof(uint64_t) * ((size_t)cap / (size_t)s->cfg.block_size + 1));
	if (!r->tokens || !r->hashes)
		goto out_free;
	r->smp = loom_sampler_new(&rq->sampling, s->n_vocab, err, errlen);
	if (!r->smp)
		goto out_free_quiet;
	memcpy(r->tokens, rq->prompt, sizeof(int32_t) * (size_t)rq->n_prompt);
	r->n_tokens = r->n_prompt = rq->n_prompt;
	r->n_predict = n_predict;
	r->cb = rq->cb;
	r->user = rq->user;
	r->ignore_eog = rq->ignore_eog;
	r->spec.kind = rq->spec;
	r->spec.max_draft = rq->spec_max_draft;
	r->spec.greedy = rq->sampling.temp <= 0.0f;
	r->spec.seed = rq->sampling.seed;
	r->gram.grammar = loom_grammar_ref(rq->grammar);
	r->out.first_logits = rq->first_logits;
	r->out.all_logits = rq->all_logits;
	r->out.logprobs = rq->logprobs;
	r->out.n_top = rq->top_logprobs;
	r->out.prompt_lp = rq->prompt_logprobs;
	r->out.hidden = rq->hidden;
	if (r->out.prompt_lp)
		prompt_lp_first(r, rq->top_logprobs);
	return r;

out_free:
	loom_seterr(err, errlen, "request: out of memory");
out_free_quiet:
	free(r->tokens);
	free(r->hashes);
	free(r);
	return NULL;
out_nomem:
	loom_seterr(err, errlen, "request: out of memory");
	return NULL;
}

int loom_sched_submit(struct loom_sched *s, const struct loom_sched_request *rq,
		      uint64_t *id, char *err, size_t errlen)
{
	int32_t n_predict;
	struct req *r;
	int rc = check_request(s, rq, &n_predict, err, errlen);

	if (rc)
		return rc;
	r = req_new(s, rq, n_predict, err, errlen);
	if (!r)
		return LOOM_ERR_NOMEM;
	pthread_mutex_lock(&s->mu);
	if (s->pending.n + s->pub.waiting >= s->cfg.max_waiting) {
		s->rejected++;
		pthread_mutex_unlock(&s->mu);
		loom_seterr(err, errlen, "request: waiting queue full (%d)", s->cfg.max_waiting);
		req_free(s, r);
		return LOOM_ERR_FULL;
	}
	r->id = ++s->next_id;
	*id = r->id;
	list_push_back(&s->pending, r);
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

void loom_sched_cancel(struct loom_sched *s, uint64_t id)
{
	pthread_mutex_lock(&s->mu);
	if (s->n_cancels == s->cap_cancels) {
		int32_t cap = s->cap_cancels ? 2 * s->cap_cancels : 16;
		uint64_t *p = realloc(s->cancels, sizeof(uint64_t) * (size_t)cap);

		if (!p) {
			/* out of memory: the request simply runs to its end */
			pthread_mutex_unlock(&s->mu);
			return;
		}
		s->cancels = p;
		s->cap_cancels = cap;
	}
	s->cancels[s->n_cancels++] = id;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void loom_sched_get_stats(struct loom_sched *s, struct loom_sched_stats *st)
{
	pthread_mutex_lock(&s->mu);
	*st = s->pub;
	st->waiting += s->pending.n;
	st->rejected = s->rejected;
	pthread_mutex_unlock(&s->mu);
}

/* Publishes the engine's view (engine thread). */
static void publish(struct loom_sched *s)
{
	struct loom_sched_stats st = s->eng;

	st.running = s->n_running;
	st.waiting = s->waiting.n;
	st.blocks_total = s->kv->n_blocks;
	st.blocks_cached = s->kv->n_lru;
	st.blocks_used = s->kv->n_blocks - s->kv->n_free - s->kv->n_lru;
	st.cow_copies = s->kv->n_copies;
	st.blocks_peak = s->kv->n_held_peak;
	if (s->kv->local) {
		const struct loom_kv *l = s->kv->local;

		st.local_window = l->window;
		st.local_blocks_total = l->n_blocks;
		st.local_blocks_cached = l->n_lru;
		st.local_blocks_used = loom_kv_n_held(l);
		st.local_blocks_peak = l->n_held_peak;
		st.cow_copies += l->n_copies;
	}
	pthread_mutex_lock(&s->mu);
	s->pub = st;
	s->n_active = s->n_running + s->waiting.n;
	pthread_mutex_unlock(&s->mu);
}

/* ---- the engine ---- */

/* Moves new submissions to the waiting queue and takes the cancel list. */
static int32_t take_inputs(struct loom_sched *s)
{
	int32_t n;

	pthread_mutex_lock(&s->mu);
	list_splice(&s->waiting, &s->pending);
	n = s->n_cancels;
	if (n > s->cancel_cap) {
		uint64_t *p = realloc(s->cancel_buf, sizeof(uint64_t) * (size_t)n);

		if (!p)
			n = s->cancel_cap; /* the rest wait for the next step */
		else
			s->cancel_buf = p, s->cancel_cap = n;
	}
	if (n > 0) {
		memcpy(s->cancel_buf, s->cancels, sizeof(uint64_t) * (size_t)n);
		memmove(s->cancels, s->cancels + n,
			sizeof(uint64_t) * (size_t)(s->n_cancels - n));
		s->n_cancels -= n;
	}
	pthread_mutex_unlock(&s->mu);
	return n;
}

static void apply_cancel(struct loom_sched *s, uint64_t id)
{
	struct req *r;
	int32_t i;

	for (r = s->waiting.head; r; r = r->next) {
		if (r->id == id) {
			list_remove(&s->waiting, r);
			finish(s, r, LOOM_FINISH_CANCELLED, NULL);
			return;
		}
	}
	for (i = 0; i < s->n_running; i++) {
		r = s->running[i];
		if (r->id == id) {
			running_remove(s, r);
			finish(s, r, LOOM_FINISH_CANCELLED, NULL);
			return;
		}
	}
}

/* Frees r's blocks and puts it at the front of the waiting queue; its
 * prompt and generated tokens are recomputed when it is admitted again. */
static void preempt(struct loom_sched *s, struct req *r, int32_t *budget)
{
	running_remove(s, r);
	*budget += plan_remove(s, r);
	loom_kv_seq_release(s->kv, &r->seq);
	r->n_registered = 0;
	r->preempted_tick = s->tick;
	list_push_front(&s->waiting, r);
	s->eng.preemptions++;
}

/* What a KV cache failure other than "no blocks" means, for an event. */
static const char *kv_failure(int rc)
{
	return rc == LOOM_ERR_NOMEM ? "kv cache: out of memory" : "kv cache: block copy failed";
}

static void fail_running(struct loom_sched *s, struct req *r, const char *why);
static int32_t grammar_drafts(struct loom_sched *s, struct req *r, int32_t k);

/* Reserves n tokens for running request r, preempting the newest running
 * sequences while blocks run short. 0, or -1 when r itself was preempted
 * or failed. */
static int reserve_running(struct loom_sched *s, struct req *r, int32_t n,
			   int32_t *budget)
{
	for (;;) {
		int rc = loom_kv_reserve(s->kv, &r->seq, n);
		struct req *victim;

		if (rc == 0)
			return 0;
		if (rc != LOOM_ERR_FULL) {
			fail_running(s, r, kv_failure(rc));
			return -1;
		}
		victim = s->running[s->n_running - 1];
		preempt(s, victim, budget);
		if (victim == r)
			return -1;
	}
}

/* Drafts r may add this step: the budget minus one token for each of the
 * n_dec decodes still to plan (r's included), the spare logits rows, and
 * what r may still generate after the target's own token. */
static int32_t draft_room(const struct loom_sched *s, const struct req *r, int32_t budget,
			  int32_t n_dec)
{
	int32_t k = budget - n_dec;

	if (k > s->rows_left)
		k = s->rows_left;
	if (s->cfg.spec_step_rows > 0 && s->step_spec > 0 && k > s->step_drafts / s->step_spec)
		k = s->step_drafts / s->step_spec; /* a fair share of what the step spares */
	if (k > r->n_predict - r->n_generated - 1)
		k = r->n_predict - r->n_generated - 1;
	return k > 0 ? k : 0;
}

/* Ends running request r with an error. */
static void fail_running(struct loom_sched *s, struct req *r, const char *why)
{
	running_remove(s, r);
	finish(s, r, LOOM_FINISH_ERROR, why);
}

/* Gets r's drafts (written after its last token, r->tokens has room) and
 * reserves their blocks. Returns how many (0 when blocks are short), or
 * -1 when r failed. *asked: the strategy was asked. */
static int32_t get_drafts(struct loom_sched *s, struct req *r, int32_t max, bool *asked)
{
	char err[512];
	int32_t k;
	int rc;

	*asked = false;
	if (!r->spec.sq) {
		r->spec.sq = loom_spec_seq_new(r->spec.kind, r->spec.max_draft, r->spec.seed,
					       s->spec_target, err, sizeof(err));
		r->spec.parent = malloc(sizeof(int32_t) * (SPEC_ROWS_MAX + 1));
		if (!r->spec.sq || !r->spec.parent) {
			fail_running(s, r, r->spec.sq ? "speculation: out of memory" : err);
			return -1;
		}
	}
	if (max <= 0)
		return 0;
	*asked = true;
	/* a tree's nodes are rows like a chain's drafts */
	k = loom_spec_seq_propose(r->spec.sq, &r->seq, r->tokens, r->n_tokens, max,
				  r->tokens + r->n_tokens, s->trees ? r->spec.parent : NULL, err,
				  sizeof(err));
	if (k < 0) {
		fail_running(s, r, err);
		return -1;
	}
	/* a draft the grammar refuses is rejected before it costs a row */
	if (k > 0 && r->gram.grammar && (k = grammar_drafts(s, r, k)) < 0)
		return -1;
	if (k == 0)
		return 0;
	rc = loom_kv_reserve(s->kv, &r->seq, 1 + k);
	if (rc && rc != LOOM_ERR_FULL) {
		fail_running(s, r, kv_failure(rc));
		return -1;
	}
	return rc ? 0 : k; /* short of blocks: decode plainly (may preempt) */
}

/* True for a request that keeps a row per prompt token. */
static bool all_rows(const struct req *r)
{
	return r->out.all_logits || r->out.prompt_lp || r->out.hidden;
}

/* A prompt chunk of at most n tokens for r: a request that keeps every
 * row needs a logits row per token, so its chunk is cut to the rows left. */
static int32_t chunk_cap(const struct loom_sched *s, const struct req *r, int32_t n)
{
	if (all_rows(r) && n > s->rows_left + 1)
		n = s->rows_left + 1;
	return n;
}

/* Adds a prompt chunk of n tokens of r to the plan. */
static void plan_chunk(struct loom_sched *s, struct req *r, int32_t n)
{
	bool all = all_rows(r);

	if (all)
		s->rows_left -= n - 1; /* one row per entry is always there */
	s->plan[s->n_plan++] = (struct entry){ .r = r, .n = n, .all = all, .row = -1 };
}

/* Plans decoding request r: its last token, and its drafts when it
 * speculates. 0, or -1 when r left the running set. */
static int plan_decode(struct loom_sched *s, struct req *r, int32_t *budget, int32_t n_dec)
{
	bool asked = false;
	int32_t k = 0;

	if (r->spec.kind) {
		k = get_drafts(s, r, draft_room(s, r, *budget, n_dec), &asked);
		if (k < 0)
			return -1;
	}
	if (k == 0 && reserve_running(s, r, 1, budget))
		return -1;
	s->plan[s->n_plan++] = (struct entry){ .r = r, .n = 1 + k, .spec = r->spec.kind != NULL,
		.tree = k > 0 && loom_spec_seq_is_tree(r->spec.sq), .asked = asked, .row = -1 };
	*budget -= 1 + k;
	s->rows_left -= k;
	if (r->spec.kind) {
		s->step_drafts -= k;
		s->step_spec--;
	}
	return 0;
}

/* Plans the running sequences: decodes first (one token each, plus drafts
 * for speculating ones), then prompt chunks (prefill or recompute),
 * oldest first. */
static void plan_running(struct loom_sched *s, int32_t *budget)
{
	int32_t i, n_dec = 0;
	int pass;

	s->step_spec = 0;
	for (i = 0; i < s->n_running; i++) {
		/* what the cache holds is final here: release the windowed
		 * blocks no later query reads, before reserving more */
		loom_kv_slide(s->kv, &s->running[i]->seq);
	}
	for (i = 0; i < s->n_running; i++) {
		bool dec = s->running[i]->n_tokens - s->running[i]->seq.n_tokens == 1;

		n_dec += dec;
		s->step_spec += dec && s->running[i]->spec.kind;
	}
	s->step_drafts = s->cfg.spec_step_rows - n_dec;
	if (s->step_drafts < 0)
		s->step_drafts = 0;
	for (pass = 0; pass < 2; pass++) {
		for (i = 0; i < s->n_running && *budget > 0; i++) {
			struct req *r = s->running[i];
			int32_t rem = r->n_tokens - r->seq.n_tokens, n;

			if ((pass == 0) != (rem == 1))
				continue;
			if (pass == 0) {
				if (plan_decode(s, r, budget, n_dec--))
					i--; /* r left the running set */
				continue;
			}
			n = chunk_cap(s, r, rem < *budget ? rem : *budget);
			if (reserve_running(s, r, n, budget)) {
				i--; /* r left the running set; i now names the next */
				continue;
			}
			plan_chunk(s, r, n);
			*budget -= n;
		}
	}
}

/* Chain hash of full block j of r (computed once). */
static uint64_t block_hash(struct loom_sched *s, struct req *r, int32_t j)
{
	int32_t bs = s->cfg.block_size;

	while (r->n_hashed <= j) {
		int32_t k = r->n_hashed;
		uint64_t parent = k ? r->hashes[k - 1] : LOOM_KV_ROOT_HASH;

		r->hashes[k] = loom_kv_block_hash(parent, r->tokens + (size_t)k * bs, bs);
		r->n_hashed++;
	}
	return r->hashes[j];
}

/* Shares the longest run of cached full blocks that starts r's tokens
 * (and that the windowed layers can resume from). Leaves at least one
 * token to compute so that there are logits: when every token is cached,
 * the last one is recomputed (copy-on-write). */
static void match_prefix(struct loom_sched *s, struct req *r)
{
	int32_t full = r->n_tokens / s->cfg.block_size;

	if (full > 0)
		block_hash(s, r, full - 1); /* hashes every full block */
	r->n_registered = loom_kv_share_prefix(s->kv, &r->seq, r->hashes, r->tokens, full,
					       r->n_tokens - 1);
}

/* Admits r with its first chunk of at most budget tokens. 0;
 * LOOM_ERR_FULL when the blocks do not allow (r unchanged); another
 * loom_status when the KV cache failed. */
static int admit(struct loom_sched *s, struct req *r, int32_t budget)
{
	int32_t n, rc;

	if (s->cfg.prefix_cache && !all_rows(r))
		match_prefix(s, r);
	n = r->n_tokens - r->seq.n_tokens;
	n = chunk_cap(s, r, n > budget ? budget : n);
	rc = loom_kv_reserve(s->kv, &r->seq, n);
	if (rc) {
		loom_kv_seq_release(s->kv, &r->seq);
		r->n_registered = 0;
		return rc;
	}
	if (s->cfg.prefix_cache) {
		s->eng.prefix_lookups += (uint64_t)(r->n_tokens / s->cfg.block_size);
		s->eng.prefix_hits += (uint64_t)r->n_registered; /* matched blocks */
	}
	if (!r->admitted) {
		r->admitted = true;
		r->n_cached = r->seq.n_tokens < r->n_prompt ? r->seq.n_tokens : r->n_prompt;
		s->eng.prompt_tokens += (uint64_t)r->n_prompt;
	}
	s->running[s->n_running++] = r;
	plan_chunk(s, r, n);
	return 0;
}

/* Admits waiting requests in arrival order while blocks, the token budget
 * and the sequence limit allow. */
static void plan_admissions(struct loom_sched *s, int32_t *budget)
{
	while (s->waiting.head && *budget > 0 && s->n_running < s->cfg.max_seqs) {
		struct req *r = s->waiting.head;
		int rc;

		if (r->preempted_tick == s->tick)
			break; /* just preempted: the blocks are not there */
		rc = admit(s, r, *budget);
		if (rc == LOOM_ERR_FULL)
			break;
		list_remove(&s->waiting, r);
		if (rc) {
			finish(s, r, LOOM_FINISH_ERROR, kv_failure(rc));
			continue;
		}
		*budget -= s->plan[s->n_plan - 1].n;
	}
}

/* Registers r's newly filled blocks in the prefix cache. */
static void register_blocks(struct loom_sched *s, struct req *r)
{
	int32_t bs = s->cfg.block_size, full = r->seq.n_tokens / bs;

	while (r->n_registered < full) {
		int32_t j = r->n_registered++;
		uint64_t h = block_hash(s, r, j);
		uint64_t parent = j ? r->hashes[j - 1] : LOOM_KV_ROOT_HASH;

		loom_kv_cache_register_seq(s->kv, &r->seq, j, h, parent,
					   r->tokens + (size_t)j * bs);
	}
}

/* Appends t to r and reports it, or ends r at an EOG token or n_predict.
 * True when r is gone. */
static bool deliver(struct loom_sched *s, struct req *r, int32_t t)
{
	if (t < 0) {
		fail_running(s, r, "sampling: no token could be drawn");
		return true;
	}
	if (!r->ignore_eog && loom_tokenizer_is_eog(s->cfg.tokenizer, t)) {
		running_remove(s, r);
		finish(s, r, LOOM_FINISH_EOG, NULL);
		return true;
	}
	r->tokens[r->n_tokens++] = t;
	r->n_generated++;
	s->eng.generated_tokens++;
	if (r->n_generated < r->n_predict) {
		emit(r, t, LOOM_FINISH_NONE, NULL);
		return false;
	}
	running_remove(s, r);
	emit(r, t, LOOM_FINISH_LENGTH, NULL);
	req_free(s, r);
	return true;
}

/* r's grammar matcher, made at first use (engine thread); NULL when r
 * has no grammar or r failed (out of memory). */
static struct loom_gmatch *gmatch(struct loom_sched *s, struct req *r)
{
	if (!r->gram.grammar || r->gram.gm)
		return r->gram.gm;
	if (!s->gvocab)
		s->gvocab = loom_gvocab_new(s->cfg.tokenizer);
	if (s->gvocab)
		r->gram.gm = loom_gmatch_new(r->gram.grammar, s->gvocab);
	if (!r->gram.gm)
		fail_running(s, r, "grammar: out of memory");
	return r->gram.gm;
}

/* Why a request fails when its grammar meets more alternatives at once
 * than the matcher follows (nested enums or anyOfs whose product is too
 * large; a single one that large is refused when the schema compiles). */
#define GRAMMAR_STR_(x) #x
#define GRAMMAR_STR(x) GRAMMAR_STR_(x)
#define GRAMMAR_OVERFLOW "grammar: more than " GRAMMAR_STR(LOOM_GRAMMAR_MAX_STACKS) \
	" alternatives open at once (nested enum/anyOf too large to follow)"

/* Masks row with r's grammar at lookahead level `level`. 0, or -1 when r
 * failed (nothing can follow: the output so far is a dead end). */
static int grammar_mask(struct loom_sched *s, struct req *r, int32_t level, float *row)
{
	int32_t n = loom_gmatch_mask(r->gram.gm, level, row, s->n_vocab);

	if (n > 0)
		return 0;
	fail_running(s, r, n == 0 ? "grammar: no token can continue the output" :
		     loom_gmatch_overflowed(r->gram.gm) ? GRAMMAR_OVERFLOW : "grammar: out of memory");
	return -1;
}

/* Moves r's grammar over its new token t (an EOG ends the request: no
 * move). 0, or -1 when r failed. */
static int grammar_take(struct loom_sched *s, struct req *r, int32_t t)
{
	if (t < 0 || loom_tokenizer_is_eog(s->cfg.tokenizer, t))
		return 0;
	if (loom_gmatch_push(r->gram.gm, t)) {
		fail_running(s, r, loom_gmatch_overflowed(r->gram.gm) ? GRAMMAR_OVERFLOW :
			     "grammar: the sampled token does not fit the grammar");
		return -1;
	}
	loom_gmatch_keep(r->gram.gm, loom_gmatch_levels(r->gram.gm));
	return 0;
}

/* Samples r's next token from its logits row and reports it. With a
 * grammar, the tokens it refuses are masked first (before penalties and
 * the sampling chain). */
static void sample_one(struct loom_sched *s, struct req *r, float *row)
{
	double lse = 0;
	int32_t t;

	if (r->out.first_logits && r->n_generated == 0) {
		memcpy(r->out.first_logits, row, sizeof(float) * (size_t)s->n_vocab);
		r->out.first_logits = NULL;
	}
	if (r->out.logprobs) { /* the model's own distribution: before any mask */
		memcpy(s->raw_row, row, sizeof(float) * (size_t)s->n_vocab);
		lse = loom_logprob_lse(row, s->n_vocab);
		loom_logprob_top(row, s->n_vocab, lse, r->out.n_top, r->out.ev_top);
	}
	if (r->gram.grammar) {
		if (!gmatch(s, r))
			return;
		loom_gmatch_keep(r->gram.gm, 0); /* drafts of a step that was preempted */
		if (grammar_mask(s, r, 0, row))
			return;
	}
	t = loom_sampler_sample(r->smp, row, r->tokens, r->n_tokens);
	if (r->gram.grammar && grammar_take(s, r, t))
		return;
	if (r->out.logprobs && t >= 0)
		r->out.ev_logprob = (float)((double)s->raw_row[t] - lse);
	deliver(s, r, t);
}

/* Cuts r's k drafts (after its last token) at the first one its grammar
 * refuses, leaving a lookahead level per draft kept; of a token tree, keeps
 * the nodes whose path the grammar allows (a refused node goes with its
 * subtree), row i's level the state after row i's own path. Either way
 * row i is masked at level i. Returns the drafts kept, or -1 when r
 * failed. */
static int32_t grammar_drafts(struct loom_sched *s, struct req *r, int32_t k)
{
	int32_t j, *tok = r->tokens + r->n_tokens;

	if (!gmatch(s, r))
		return -1;
	if (loom_spec_seq_is_tree(r->spec.sq)) {
		k = loom_gmatch_tree(r->gram.gm, k, tok, r->spec.parent);
		loom_spec_seq_prune_tree(r->spec.sq, k, tok, r->spec.parent);
		return k;
	}
	loom_gmatch_keep(r->gram.gm, 0);
	for (j = 0; j < k; j++)
		if (loom_gmatch_push(r->gram.gm, tok[j]))
			break;
	return j;
}

/*
 * After a speculating decode of r's last token and k drafts (rows: k + 1
 * rows of logits): keeps the accepted drafts in the cache and drops the
 * rest, registers the blocks now final, and reports the accepted drafts
 * and the target's token in order, as plain decoding would have.
 */
/* After a token tree's verification: accepts a path (its tokens land
 * in r->tokens after the last) and moves its rows' K/V to the positions
 * that follow the last token, one copy per accepted node that is not in
 * place already. Returns the path's length, or -1 when r failed. */
static int32_t tree_accept(struct loom_sched *s, struct req *r, float *rows, int32_t k,
			   int32_t *next, int32_t *last)
{
	int32_t n_kv = r->seq.n_tokens - k - 1, path[SPEC_ROWS_MAX], from[SPEC_ROWS_MAX];
	int32_t to[SPEC_ROWS_MAX], n_acc, n = 0;

	n_acc = loom_spec_seq_accept_tree(r->spec.sq, r->smp, r->spec.greedy, rows, r->tokens,
					  r->n_tokens, k, path, next);
	*last = n_acc > 0 ? path[n_acc - 1] : 0; /* the path's end row */
	for (int32_t d = 0; d < n_acc; d++) {
		if (path[d] == d + 1)
			continue;
		from[n] = n_kv + path[d];
		to[n++] = n_kv + 1 + d;
	}
	if (n && loom_kv_move_rows(s->kv, &r->seq, from, to, n)) {
		fail_running(s, r, "kv cache: moving the accepted path's rows failed");
		return -1;
	}
	return n_acc;
}

static void spec_finish(struct loom_sched *s, struct req *r, float *rows, int32_t k,
			bool asked, bool tree)
{
	int32_t n_kv = r->seq.n_tokens - k - 1, n_acc, next, i, last;

	if (r->gram.grammar) {
		/* row i follows draft i - 1 (a tree: its own path): masked at
		 * lookahead level i (grammar_drafts pushed the k drafts) */
		if (!gmatch(s, r))
			return;
		if (loom_gmatch_levels(r->gram.gm) < k) {
			fail_running(s, r, "grammar: lookahead out of step with the drafts");
			return;
		}
		for (i = 0; i <= k; i++)
			if (grammar_mask(s, r, i, rows + (size_t)i * (size_t)s->n_vocab))
				return;
	}
	n_acc = tree ? tree_accept(s, r, rows, k, &next, &last) :
		loom_spec_seq_accept(r->spec.sq, r->smp, r->spec.greedy, rows, r->tokens,
				     r->n_tokens, k, &next);
	if (!tree)
		last = n_acc; /* a chain's level i is row i */
	if (n_acc < 0)
		return;
	loom_kv_truncate(s->kv, &r->seq, n_kv + 1 + n_acc);
	/* the cache now holds r->tokens[0 .. n_tokens + n_acc): all final */
	if (s->cfg.prefix_cache)
		register_blocks(s, r);
	r->tokens[r->n_tokens + n_acc] = next; /* room: k < n_predict - n_generated */
	loom_spec_seq_settle(r->spec.sq, asked, k, n_acc, r->tokens + r->n_tokens);
	s->eng.spec_steps++;
	s->eng.spec_drafted += (uint64_t)k;
	s->eng.spec_accepted += (uint64_t)n_acc;
	s->eng.spec_tokens += (uint64_t)n_acc + 1;
	if (next < 0) {
		fail_running(s, r, "speculation: the target distribution is empty");
		return;
	}
	if (r->gram.grammar) {
		loom_gmatch_keep(r->gram.gm, last);
		if (grammar_take(s, r, next))
			return;
	}
	for (i = 0; i <= n_acc; i++)
		if (deliver(s, r, r->tokens[r->n_tokens]))
			return;
}

/* Row p + 1 of r's prompt_logprobs from the logits at prompt position p
 * (what predicts prompt token p + 1). */
static void save_prompt_lp(struct loom_sched *s, struct req *r, int32_t p, const float *row)
{
	struct loom_token_logprob *out = r->out.prompt_lp + (size_t)(p + 1) * (size_t)(1 + r->out.n_top);
	double lse = loom_logprob_lse(row, s->n_vocab);
	int32_t t = r->tokens[p + 1];

	out[0] = (struct loom_token_logprob){ t, (float)((double)row[t] - lse) };
	loom_logprob_top(row, s->n_vocab, lse, r->out.n_top, out + 1);
}

/* Keeps what a chunk of a request with every row asks for: logits,
 * prompt logprobs, hidden states (prompt positions only: a recompute
 * after preemption runs generated tokens too). 0, or -1 when the hidden
 * states could not be read (r failed). */
static int save_rows(struct loom_sched *s, const struct entry *e)
{
	size_t V = (size_t)s->n_vocab, D = (size_t)s->m->hp.n_embd;
	struct req *r = e->r;
	int32_t n = e->n, j;
	int rc;

	if (e->pos + n > r->n_prompt)
		n = r->n_prompt - e->pos;
	if (n <= 0)
		return 0;
	for (j = 0; j < n; j++) {
		const float *row = s->logits + (size_t)(e->row + j) * V;

		if (r->out.all_logits)
			memcpy(r->out.all_logits + (size_t)(e->pos + j) * V, row, sizeof(float) * V);
		if (r->out.prompt_lp && e->pos + j + 1 < r->n_prompt)
			save_prompt_lp(s, r, e->pos + j, row);
	}
	if (!r->out.hidden)
		return 0;
	rc = loom_exec_hidden(s->exec, e->row, n, s->hidden_buf);
	if (rc) {
		fail_running(s, r, "backend: reading the hidden states failed");
		return -1;
	}
	memcpy(r->out.hidden + (size_t)e->pos * D, s->hidden_buf, sizeof(float) * D * (size_t)n);
	return 0;
}

/* True for an entry that wants hidden states and no logits at all. */
static bool hidden_only(const struct entry *e)
{
	return e->all && e->r->out.hidden && !e->r->out.all_logits && !e->r->out.prompt_lp;
}

/* Output rows of entry e, whose tokens start at row t0 of the batch (the
 * last token; every token of a speculating decode or of a chunk that keeps
 * every row), appended to the batch. */
static void plan_rows(struct loom_sched *s, struct loom_batch *b, struct entry *e, int32_t t0)
{
	int32_t j;

	if (e->spec || e->all) {
		e->row = b->n_out;
		for (j = 0; j < e->n; j++)
			s->out_rows[b->n_out++] = t0 + j;
	} else if (e->last) {
		e->row = b->n_out;
		s->out_rows[b->n_out++] = t0 + e->n - 1;
	}
}

/* ---- greedy and sampling on the device (ABI 1.7 argmax, 1.8 and 1.9
 * sample; issue 30) ----
 * Whether every logit row of the step is a plain choice the device makes
 * exactly as the host would: the last token of a plain decode or prompt,
 * no grammar or logits kept; greedy without penalties or logprobs when
 * `sample` is false, else a rule the backend's sample slot draws (with
 * logprobs when it computes them). */
static bool device_rows(struct loom_sched *s, bool sample)
{
	bool full = sample && loom_exec_sample_full(s->exec);
	bool lp = sample && loom_exec_sample_logprobs(s->exec);

	for (int32_t i = 0; i < s->n_plan; i++) {
		const struct entry *e = &s->plan[i];
		const struct req *r = e->r;

		if (e->spec || e->all || r->out.hidden || (r->out.logprobs && !lp) ||
		    r->gram.grammar || (r->out.first_logits && r->n_generated == 0))
			return false;
		if (sample ? !loom_sampler_device_ok(r->smp, full) : !loom_sampler_greedy_only(r->smp))
			return false;
	}
	return true;
}

/* Greedy without penalties: the backend picks, only the ids come back. */
static bool greedy_step(struct loom_sched *s)
{
	return loom_exec_device_greedy(s->exec) && device_rows(s, false);
}

/* A step with a token tree: every entry's parents (a tree's, else each
 * token's the one before it) into parent_buf, by batch token. */
static void batch_parents(struct loom_sched *s)
{
	for (int32_t i = 0; i < s->n_plan; i++) {
		const struct entry *e = &s->plan[i];
		int32_t *p = s->parent_buf + s->q_start[i];

		for (int32_t j = 0; j < e->n; j++)
			p[j] = e->tree ? e->r->spec.parent[j] : j - 1;
	}
}

/* Greedy with penalties, top-k sampling, sampling over the whole
 * vocabulary or logprobs (loom_sampler_device_ok, ABI 1.9): the backend
 * draws, only the tokens (and the logprobs asked for) come back. */
static bool sample_step(struct loom_sched *s)
{
	return loom_exec_device_sample(s->exec) && device_rows(s, true);
}

/* Room for n more penalty pairs after the first `used`. */
static int pen_room(struct loom_sched *s, int32_t used, int64_t n)
{
	int32_t *t, *c;
	int64_t want = used + n;

	if (want <= s->pen_cap)
		return 0;
	if (want > INT32_MAX / 2)
		return -1;
	want = want < 2 * (int64_t)s->pen_cap ? 2 * (int64_t)s->pen_cap : want;
	t = realloc(s->pen_tok, (size_t)want * sizeof(*t));
	if (t)
		s->pen_tok = t;
	c = realloc(s->pen_cnt, (size_t)want * sizeof(*c));
	if (c)
		s->pen_cnt = c;
	if (!t || !c)
		return -1;
	s->pen_cap = (int32_t)want;
	return 0;
}

/* Each logit row's rule into b (false: out of memory, the host samples). */
static bool plan_sampling(struct loom_sched *s, struct loom_batch *b)
{
	int32_t used = 0, lp = 0;

	for (int32_t i = 0; i < s->n_plan; i++) {
		const struct entry *e = &s->plan[i];
		struct req *r = e->r;
		int64_t most = r->n_tokens < s->n_vocab ? r->n_tokens : s->n_vocab;
		int32_t n;

		if (e->row < 0)
			continue;
		if (pen_room(s, used, most))
			return false;
		n = loom_sampler_device_row(r->smp, r->tokens, r->n_tokens, &s->smp_rows[e->row],
					    used, s->pen_tok + used, s->pen_cnt + used,
					    s->pen_cap - used);
		if (n < 0)
			return false;
		used += n;
		if (r->out.logprobs) { /* ABI 1.9: the chosen token's and the top n_top */
			s->smp_rows[e->row].logprobs = 1 + r->out.n_top;
			lp = lp > 1 + r->out.n_top ? lp : 1 + r->out.n_top;
		}
	}
	b->sample_rows = s->smp_rows;
	b->lp_stride = lp;
	b->pen_tokens = s->pen_tok;
	b->pen_counts = s->pen_cnt;
	b->n_pen = used;
	return true;
}

/* The device's token for logit row `at` of r (its draw, if it made one,
 * taken from r's generator here as well), with the logprobs the device
 * computed when r asked for them. */
static void deliver_sampled(struct loom_sched *s, struct req *r, int32_t at)
{
	const int32_t *row = loom_exec_sampled(s->exec) + 2 * at;
	const struct loom_sample_logprob *lp = loom_exec_sampled_logprobs(s->exec, at);

	if (row[1])
		loom_sampler_device_drew(r->smp);
	if (r->out.logprobs && lp) {
		r->out.ev_logprob = lp[0].logprob;
		for (int32_t j = 0; j < r->out.n_top; j++)
			r->out.ev_top[j] = (struct loom_token_logprob){ lp[1 + j].token,
									lp[1 + j].logprob };
	}
	deliver(s, r, row[0]);
}
/* ---- end of greedy and sampling on the device ---- */

/* Flattens the plan into a batch, runs it and samples. */
static int run_plan(struct loom_sched *s)
{
	struct loom_batch b = { .tokens = s->tok_buf, .n_seqs = s->n_plan,
		.q_start = s->q_start, .seqs = s->seqs, .out_rows = s->out_rows };
	size_t V = (size_t)s->n_vocab;
	char err[512];
	int32_t i;

	for (i = 0; i < s->n_plan; i++) {
		struct entry *e = &s->plan[i];
		struct req *r = e->r;

		s->q_start[i] = b.n_tokens;
		memcpy(s->tok_buf + b.n_tokens, r->tokens + r->seq.n_tokens,
		       sizeof(int32_t) * (size_t)e->n);
		b.n_tokens += e->n;
		s->seqs[i] = &r->seq;
		e->pos = r->seq.n_tokens;
		e->last = e->pos + e->n == r->n_tokens;
		if (e->tree)
			b.parent = s->parent_buf;
	}
	if (b.parent)
		batch_parents(s);
	s->q_start[s->n_plan] = b.n_tokens;
	/* rows that need logits first; hidden-state-only rows last, where the
	 * output layer does not run */
	for (int pass = 0; pass < 2; pass++) {
		for (i = 0; i < s->n_plan; i++)
			if (hidden_only(&s->plan[i]) == (pass == 1))
				plan_rows(s, &b, &s->plan[i], s->q_start[i]);
		if (pass == 0)
			b.n_hidden_only = b.n_out;
	}
	b.n_hidden_only = b.n_out - b.n_hidden_only;
	b.greedy = greedy_step(s);
	if (!b.greedy && sample_step(s))
		plan_sampling(s, &b);
	if (loom_exec_step(s->exec, &b, s->logits, err, sizeof(err))) {
		for (i = 0; i < s->n_plan; i++)
			fail_running(s, s->plan[i].r, err);
		return -1;
	}
	/* a speculating sequence registers once its drafts are settled */
	if (s->cfg.prefix_cache)
		for (i = 0; i < s->n_plan; i++)
			if (!s->plan[i].spec)
				register_blocks(s, s->plan[i].r);
	for (i = 0; i < s->n_plan; i++) {
		struct entry *e = &s->plan[i];

		if (e->row < 0)
			continue;
		if (e->spec) {
			spec_finish(s, e->r, s->logits + (size_t)e->row * V, e->n - 1, e->asked,
				    e->tree);
			continue;
		}
		if (e->all && save_rows(s, e))
			continue;
		if (e->last && e->r->out.hidden) { /* embeddings: no token */
			running_remove(s, e->r);
			finish(s, e->r, LOOM_FINISH_LENGTH, NULL);
			continue;
		}
		if (e->last && loom_exec_greedy_ids(s->exec))
			deliver(s, e->r, loom_exec_greedy_ids(s->exec)[e->row]);
		else if (e->last && loom_exec_sampled(s->exec))
			deliver_sampled(s, e->r, e->row);
		else if (e->last)
			sample_one(s, e->r, s->logits + (size_t)(e->row + (e->all ? e->n - 1 : 0)) * V);
	}
	return 0;
}

int loom_sched_step(struct loom_sched *s)
{
	int32_t budget = s->cfg.max_batch_tokens, n_cancel, i, n;
	int rc = 0;

	s->tick++;
	n_cancel = take_inputs(s);
	for (i = 0; i < n_cancel; i++)
		apply_cancel(s, s->cancel_buf[i]);
	s->n_plan = 0;
	s->rows_left = s->max_out - s->cfg.max_seqs;
	plan_running(s, &budget);
	plan_admissions(s, &budget);
	n = s->n_plan;
	if (n > 0) {
		s->eng.steps++;
		rc = run_plan(s);
	}
	s->n_plan = 0;
	publish(s);
	return rc ? -1 : n;
}

static bool has_work(struct loom_sched *s)
{
	return s->pending.n > 0 || s->n_cancels > 0 || s->n_active > 0;
}

void loom_sched_run(struct loom_sched *s)
{
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (!s->stop && !has_work(s))
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->stop) {
			pthread_mutex_unlock(&s->mu);
			return;
		}
		pthread_mutex_unlock(&s->mu);
		loom_sched_step(s);
	}
}

void loom_sched_stop(struct loom_sched *s)
{
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* ---- construction ---- */

static int check_config(struct loom_sched *s, char *err, size_t errlen)
{
	struct loom_sched_config *c = &s->cfg;
	int64_t min_blocks;

	if (c->max_ctx <= 0)
		c->max_ctx = s->m->hp.n_ctx_train > INT32_MAX / 2 ? INT32_MAX / 2 :
			     (int32_t)s->m->hp.n_ctx_train;
	if (c->block_size <= 0 || c->block_size > 1 << 16 || c->max_batch_tokens <= 0 ||
	    c->max_seqs <= 0 || c->max_seqs > c->max_batch_tokens || c->max_waiting <= 0 ||
	    c->max_ctx <= 0 || c->spec_rows < 0 || c->spec_rows > c->max_batch_tokens ||
	    c->logits_rows < 0 || c->logits_rows > c->max_batch_tokens + c->max_seqs) {
		loom_seterr(err, errlen, "scheduler: bad config (block %d, batch %d, sequences %d, waiting %d, context %d, spec rows %d)",
			c->block_size, c->max_batch_tokens, c->max_seqs, c->max_waiting, c->max_ctx,
			c->spec_rows);
		return -1;
	}
	min_blocks = ((int64_t)c->max_ctx + c->block_size - 1) / c->block_size + 1;
	if (c->n_blocks <= 0) {
		c->n_blocks = plan_blocks(s->m, c->kv_type, c->block_size, DEFAULT_KV_BYTES);
		if (c->n_blocks < min_blocks)
			c->n_blocks = min_blocks;
	}
	if (c->n_blocks < 2) {
		loom_seterr(err, errlen, "scheduler: %lld KV blocks are too few", (long long)c->n_blocks);
		return -1;
	}
	if (c->n_local_blocks <= 0) {
		struct loom_kv_plan p;

		loom_sched_plan_kv(s->m, c, 0, &p);
		c->n_local_blocks = p.n_local_blocks < c->n_blocks ? p.n_local_blocks : c->n_blocks;
	}
	return 0;
}

static int alloc_engine(struct loom_sched *s, char *err, size_t errlen)
{
	const struct loom_hparams *hp = &s->m->hp;
	size_t seqs = (size_t)s->cfg.max_seqs;

	const struct loom_shard *sh = &s->m->shard;
	/* a rank of a distributed job holds its heads of its layers */
	struct loom_kv_config kc = {
		.n_layer = hp->n_layer, .kv_dim = (sh->kv_hi - sh->kv_lo) * hp->head_dim,
		.block_size = s->cfg.block_size, .n_blocks = s->cfg.n_blocks,
		.n_local_blocks = s->cfg.n_local_blocks, .type = s->cfg.kv_type,
		.layer_lo = sh->layer_lo, .layer_hi = sh->layer_hi,
	};
	int32_t *windows = layer_windows(s->m);

	if (!windows) {
		loom_seterr(err, errlen, "scheduler: out of memory");
		return -1;
	}
	kc.windows = windows;
	s->kv = loom_kv_new_config(s->m->be, &kc, err, errlen);
	free(windows);
	if (!s->kv)
		return -1;
	if (sh->dist) { /* rank 0 sends its copies on write to the others */
		s->kv->log_copies = true;
		if (s->kv->local)
			s->kv->local->log_copies = true;
	}
	s->max_out = s->cfg.max_seqs + s->cfg.spec_rows;
	if (s->max_out < s->cfg.logits_rows)
		s->max_out = s->cfg.logits_rows;
	s->exec = loom_exec_new(s->m, s->kv, s->cfg.max_batch_tokens, s->cfg.max_seqs,
				s->max_out, err, errlen);
	if (!s->exec)
		return -1;
	s->spec_target = loom_spec_target_new(s->m, s->kv, s->cfg.max_ctx);
	s->trees = loom_exec_trees(s->exec);
	s->running = calloc(seqs, sizeof(*s->running));
	s->plan = calloc(seqs, sizeof(*s->plan));
	s->q_start = calloc(seqs + 1, sizeof(int32_t));
	s->out_rows = calloc((size_t)s->max_out, sizeof(int32_t));
	s->seqs = calloc(seqs, sizeof(*s->seqs));
	s->tok_buf = calloc((size_t)s->cfg.max_batch_tokens, sizeof(int32_t));
	s->parent_buf = calloc((size_t)s->cfg.max_batch_tokens, sizeof(int32_t));
	s->logits = calloc((size_t)s->max_out * (size_t)s->n_vocab, sizeof(float));
	s->raw_row = calloc((size_t)s->n_vocab, sizeof(float));
	s->hidden_buf = calloc((size_t)s->max_out * (size_t)hp->n_embd, sizeof(float));
	s->smp_rows = calloc((size_t)s->max_out, sizeof(*s->smp_rows));
	if (!s->running || !s->plan || !s->q_start || !s->out_rows || !s->smp_rows ||
	    !s->seqs || !s->tok_buf || !s->parent_buf || !s->logits || !s->raw_row || !s->hidden_buf ||
	    !s->spec_target) {
		loom_seterr(err, errlen, "scheduler: out of memory");
		return -1;
	}
	return 0;
}

static void free_engine(struct loom_sched *s)
{
	loom_spec_target_free(s->spec_target);
	loom_gvocab_free(s->gvocab);
	loom_exec_free(s->exec);
	loom_kv_free(s->kv);
	free(s->running);
	free(s->plan);
	free(s->q_start);
	free(s->out_rows);
	free(s->seqs);
	free(s->tok_buf);
	free(s->parent_buf);
	free(s->logits);
	free(s->raw_row);
	free(s->hidden_buf);
	free(s->smp_rows);
	free(s->pen_tok);
	free(s->pen_cnt);
	free(s->cancels);
	free(s->cancel_buf);
}

struct loom_sched *loom_sched_new(struct loom_model *m, const struct loom_sched_config *c,
				  char *err, size_t errlen)
{
	struct loom_sched *s = calloc(1, sizeof(*s));

	if (!s) {
		loom_seterr(err, errlen, "scheduler: out of memory");
		return NULL;
	}
	s->m = m;
	s->cfg = *c;
	s->n_vocab = (int32_t)m->hp.n_vocab;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (check_config(s, err, errlen) || alloc_engine(s, err, errlen)) {
		free_engine(s);
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		free(s);
		return NULL;
	}
	publish(s);
	return s;
}

void loom_sched_free(struct loom_sched *s)
{
	struct req *r;

	if (!s)
		return;
	list_splice(&s->waiting, &s->pending);
	while ((r = s->waiting.head)) {
		list_remove(&s->waiting, r);
		finish(s, r, LOOM_FINISH_CANCELLED, NULL);
	}
	while (s->n_running > 0) {
		r = s->running[--s->n_running];
		finish(s, r, LOOM_FINISH_CANCELLED, NULL);
	}
	free_engine(s);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
}

int loom_sched_follow(struct loom_sched *s, char *err, size_t errlen)
{
	return loom_dist_follow(s->m->shard.dist, s->exec, s->max_out, s->n_vocab, err, errlen);
}
