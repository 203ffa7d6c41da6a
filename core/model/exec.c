/* The executor: runs a model's graph for one step through the backend ops. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/moe_exec.h"
#include "dist/dist.h"
#include "dist/follow.h"
#include "util.h"

/* Device int32 inputs of one step. The windowed layers' slots and block
 * table (IN_LSLOTS, IN_LBLOCKS) are empty when the cache has no windowed
 * pool; IN_BLOCKS and IN_LBLOCKS stay last (uploaded up to their used part). */
enum { IN_TOKENS, IN_POS, IN_SLOTS, IN_LSLOTS, IN_QSTART, IN_KVLEN, IN_PARENT,
       IN_BLOCKS, IN_LBLOCKS, IN_COUNT };

struct loom_exec {
	struct loom_model *m;
	struct loom_kv *kv;
	int32_t max_tokens, max_seqs, max_out;
	struct loom_buffer *buf;
	float *act[ACT_COUNT];    /* device addresses */
	int64_t width[ACT_COUNT]; /* floats per row */
	int32_t *in[IN_COUNT];    /* device addresses */
	int32_t *host_in[IN_COUNT]; /* within host_inputs, laid out as on the device */
	int32_t *host_inputs;
	size_t in_count[IN_COUNT];
	int64_t table_stride; /* this step's block-table row length */
	float *gemm_x;        /* host copy of a GEMM's input (gemm_input) */
	size_t gemm_x_cap;    /* floats */
	float *host_x;        /* pipeline stages: the residual stream on the host */
	/* pipeline stages: a micro-batch's q_start and out_rows (rebased to
	 * its first row), and rank 0's cuts of a step */
	int32_t *sub_q, *sub_out, *cuts;
	bool told_split; /* rank 0 logged its first split step */
	struct loom_moe_scratch moe; /* the moe node's fallback (moe_exec.h) */
	bool in_region; /* run_step has a step region open */
	/* greedy steps picked on the device: the ids there and here */
	struct loom_buffer *ids_buf;
	int32_t *ids;
	bool ids_valid;
	/* steps sampled on the device: rules, results and penalty pairs
	 * there (smp_pen pairs of room), results here */
	struct loom_buffer *smp_buf;
	int32_t smp_pen;
	int32_t *sampled;
	bool sampled_valid;
	/* ABI 1.9: the logprobs of a sampled step (max_out x SMP_LP here),
	 * lp_stride of them a row when the step asked */
	struct loom_sample_logprob *smp_lp;
	int32_t lp_stride;
};

/* Block-table rows are this many blocks long or a multiple of it: short
 * enough to keep a step's table small, long enough that the row length
 * (an attention argument) changes rarely, since a backend that captures
 * steps as graphs recaptures when any argument changes. */
#define TABLE_STRIDE_STEP 64

/* Adds n bytes (rounded to 64) to *total; false on overflow. */
static bool add_size(size_t *total, size_t count, size_t elem)
{
	size_t bytes;

	if (__builtin_mul_overflow(count, elem, &bytes) ||
	    __builtin_add_overflow(bytes, (size_t)63, &bytes))
		return false;
	bytes &= ~(size_t)63;
	return !__builtin_add_overflow(*total, bytes, total);
}

static void set_widths(struct loom_exec *e)
{
	const struct loom_hparams *hp = &e->m->hp;
	const struct loom_shard *s = &e->m->shard;

	e->width[ACT_X] = e->width[ACT_XN] = e->width[ACT_PROJ] = hp->n_embd;
	e->width[ACT_OUT] = hp->n_embd;
	/* this rank's heads; att and the ffn are whole (all-gathered) */
	e->width[ACT_Q] = (s->q_hi - s->q_lo) * hp->head_dim;
	e->width[ACT_ATT] = hp->n_head * hp->head_dim;
	e->width[ACT_K] = e->width[ACT_V] = (s->kv_hi - s->kv_lo) * hp->head_dim;
	e->width[ACT_GATE] = e->width[ACT_UP] = hp->n_ff;
	e->width[ACT_LOGITS] = hp->n_vocab;
	if (hp->arch->moe) { /* the FFN buffers hold an expert's rows */
		e->width[ACT_GATE] = e->width[ACT_UP] =
			hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
		e->width[ACT_ROUTER] = hp->n_expert;
		e->width[ACT_MOE_X] = e->width[ACT_MOE_D] = hp->n_embd;
	}
}

static size_t act_rows(const struct loom_exec *e, int a)
{
	return (size_t)(a == ACT_OUT || a == ACT_LOGITS ? e->max_out : e->max_tokens);
}

/* Offsets of every activation and input array in one buffer (offs[],
 * ACT_COUNT + IN_COUNT of them) and its size; sets e->in_count from the
 * cache's blocks (n_blocks, windowed pool or not). False on overflow. */
static bool layout(struct loom_exec *e, int64_t n_blocks, bool local, size_t *offs,
		   size_t *total)
{
	int i;

	e->in_count[IN_TOKENS] = e->in_count[IN_POS] = e->in_count[IN_SLOTS] =
		e->in_count[IN_PARENT] = (size_t)e->max_tokens;
	e->in_count[IN_QSTART] = (size_t)e->max_seqs + 1;
	e->in_count[IN_KVLEN] = (size_t)e->max_seqs;
	if (__builtin_mul_overflow((size_t)e->max_seqs, (size_t)n_blocks, &e->in_count[IN_BLOCKS]))
		return false;
	if (local) { /* same logical length as the full-context table */
		e->in_count[IN_LSLOTS] = (size_t)e->max_tokens;
		e->in_count[IN_LBLOCKS] = e->in_count[IN_BLOCKS];
	}
	*total = 0;
	for (i = 0; i < ACT_COUNT; i++) {
		offs[i] = *total;
		if (!add_size(total, act_rows(e, i) * (size_t)e->width[i], sizeof(float)))
			return false;
	}
	for (i = 0; i < IN_COUNT; i++) {
		offs[ACT_COUNT + i] = *total;
		if (!add_size(total, e->in_count[i], sizeof(int32_t)))
			return false;
	}
	return true;
}

bool loom_exec_bytes(struct loom_model *m, int32_t max_tokens, int32_t max_seqs,
		     int32_t max_outputs, int64_t n_blocks, bool local, size_t *bytes)
{
	struct loom_exec e = { .m = m, .max_tokens = max_tokens, .max_seqs = max_seqs,
			       .max_out = max_outputs };
	size_t offs[ACT_COUNT + IN_COUNT];

	if (max_tokens <= 0 || max_seqs <= 0 || max_outputs <= 0 || n_blocks < 0)
		return false;
	set_widths(&e);
	return layout(&e, n_blocks, local, offs, bytes);
}

/* Lays out every activation and input array in one backend buffer. */
static int alloc_buffers(struct loom_exec *e, char *err, size_t errlen)
{
	struct loom_backend *be = e->m->be;
	size_t total = 0, offs[ACT_COUNT + IN_COUNT];
	char *base;
	int i;

	if (!layout(e, e->kv->n_blocks, e->kv->local != NULL, offs, &total)) {
		loom_seterr(err, errlen, "executor: activation size overflows (batch %d)",
			    e->max_tokens);
		return -1;
	}
	/* one host block with the device layout, so a step's inputs go up in
	 * one upload */
	e->host_inputs = calloc(1, total - offs[ACT_COUNT]);
	if (!e->host_inputs) {
		loom_seterr(err, errlen, "executor: out of memory");
		return -1;
	}
	for (i = 0; i < IN_COUNT; i++)
		e->host_in[i] = (int32_t *)((char *)e->host_inputs +
					    (offs[ACT_COUNT + i] - offs[ACT_COUNT]));
	if (be->ops->buffer_alloc(be->ctx, total, &e->buf)) {
		loom_seterr(err, errlen, "executor: cannot allocate %zu MiB of activations",
			total >> 20);
		return -1;
	}
	base = be->ops->buffer_addr(be->ctx, e->buf);
	for (i = 0; i < ACT_COUNT; i++)
		e->act[i] = (float *)(base + offs[i]);
	for (i = 0; i < IN_COUNT; i++)
		e->in[i] = (int32_t *)(base + offs[ACT_COUNT + i]);
	return 0;
}

struct loom_exec *loom_exec_new(struct loom_model *m, struct loom_kv *kv,
				int32_t max_tokens, int32_t max_seqs,
				int32_t max_outputs, char *err, size_t errlen)
{
	struct loom_exec *e;

	if (max_tokens <= 0 || max_seqs <= 0 || max_outputs <= 0 ||
	    max_seqs > max_tokens) {
		loom_seterr(err, errlen, "executor: bad limits (tokens %d, sequences %d, outputs %d)",
			max_tokens, max_seqs, max_outputs);
		return NULL;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		loom_seterr(err, errlen, "executor: out of memory");
		return NULL;
	}
	e->m = m;
	e->kv = kv;
	e->max_tokens = max_tokens;
	e->max_seqs = max_seqs;
	e->max_out = max_outputs;
	set_widths(e);
	if (m->shard.pp > 1) {
		e->host_x = malloc(sizeof(float) * (size_t)max_tokens * (size_t)m->hp.n_embd);
		e->sub_q = malloc(sizeof(int32_t) * ((size_t)max_seqs + 1));
		e->sub_out = malloc(sizeof(int32_t) * (size_t)max_outputs);
		e->cuts = malloc(sizeof(int32_t) * ((size_t)max_seqs + 1));
		if (!e->host_x || !e->sub_q || !e->sub_out || !e->cuts) {
			loom_seterr(err, errlen, "executor: out of memory");
			loom_exec_free(e);
			return NULL;
		}
	}
	if (alloc_buffers(e, err, errlen)) {
		loom_exec_free(e);
		return NULL;
	}
	if (loom_moe_scratch_alloc(&e->moe, &m->hp, max_tokens)) {
		loom_seterr(err, errlen, "executor: out of memory");
		loom_exec_free(e);
		return NULL;
	}
	e->moe.gx = e->act[ACT_MOE_X], e->moe.gx_w = e->width[ACT_MOE_X];
	e->moe.gate = e->act[ACT_GATE], e->moe.up = e->act[ACT_UP];
	e->moe.ff_w = e->width[ACT_GATE];
	e->moe.d = e->act[ACT_MOE_D], e->moe.d_w = e->width[ACT_MOE_D];
	return e;
}

void loom_exec_free(struct loom_exec *e)
{
	if (!e)
		return;
	if (e->buf)
		e->m->be->ops->buffer_free(e->m->be->ctx, e->buf);
	if (e->ids_buf)
		e->m->be->ops->buffer_free(e->m->be->ctx, e->ids_buf);
	free(e->ids);
	if (e->smp_buf)
		e->m->be->ops->buffer_free(e->m->be->ctx, e->smp_buf);
	free(e->sampled);
	free(e->smp_lp);
	free(e->host_inputs);
	loom_moe_scratch_free(&e->moe);
	free(e->gemm_x);
	free(e->host_x);
	free(e->sub_q);
	free(e->sub_out);
	free(e->cuts);
	free(e);
}

/* The longest block list in the batch, rounded up to TABLE_STRIDE_STEP
 * and at most the cache's block count (a sequence never holds more). */
static int64_t table_stride(const struct loom_exec *e, const struct loom_batch *b)
{
	int64_t longest = 1, stride;

	for (int32_t s = 0; s < b->n_seqs; s++)
		if (b->seqs[s]->n_blocks > longest)
			longest = b->seqs[s]->n_blocks;
	stride = (longest + TABLE_STRIDE_STEP - 1) / TABLE_STRIDE_STEP * TABLE_STRIDE_STEP;
	return stride < e->kv->n_blocks ? stride : e->kv->n_blocks;
}

/* The windowed layers' slots and block-table row of sequence s. Entries
 * the pool released (-1, below every query's window, never read) are
 * given the first held block, so the table holds only valid blocks. */
static int prepare_local(struct loom_exec *e, const struct loom_batch *b, int32_t s,
			 int64_t kv_len, char *err, size_t errlen)
{
	const struct loom_kv_seq *seq = b->seqs[s], *ls = seq->local;
	int32_t *row = e->host_in[IN_LBLOCKS] + (size_t)s * (size_t)e->table_stride;
	int32_t first;

	if (!ls || ls->n_blocks != seq->n_blocks || ls->n_dropped >= ls->n_blocks) {
		loom_seterr(err, errlen, "batch: sequence %d has no room in the windowed layers' cache", s);
		return -1;
	}
	first = ls->blocks[ls->n_dropped];
	for (int32_t j = 0; j < ls->n_blocks; j++)
		row[j] = ls->blocks[j] >= 0 ? ls->blocks[j] : first;
	for (int32_t t = b->q_start[s]; t < b->q_start[s + 1]; t++) {
		int32_t pos = (int32_t)(kv_len - (b->q_start[s + 1] - t));

		if (ls->blocks[pos / e->kv->block_size] < 0) {
			loom_seterr(err, errlen, "batch: sequence %d position %d was released from the windowed layers' cache",
				s, pos);
			return -1;
		}
		e->host_in[IN_LSLOTS][t] = loom_kv_slot(e->kv->local, ls, pos);
	}
	return 0;
}

/* Token trees: sequence s's parents (checked: -1 or an earlier token of
 * the sequence) into the inputs, and its positions from their depths. */
static int tree_positions(struct loom_exec *e, const struct loom_batch *b, int32_t s,
			  char *err, size_t errlen)
{
	int32_t q0 = b->q_start[s], q_len = b->q_start[s + 1] - q0;

	for (int32_t i = 0; i < q_len; i++) {
		int32_t p = b->parent[q0 + i];

		if (p < -1 || p >= i) {
			loom_seterr(err, errlen, "batch: sequence %d token %d has parent %d", s, i, p);
			return -1;
		}
		e->host_in[IN_PARENT][q0 + i] = p;
		e->host_in[IN_POS][q0 + i] = p < 0 ? b->seqs[s]->n_tokens :
					     e->host_in[IN_POS][q0 + p] + 1;
	}
	return 0;
}

/* Checks the batch against the limits and the cache; fills host inputs. */
static int prepare(struct loom_exec *e, const struct loom_batch *b, char *err,
		   size_t errlen)
{
	int32_t s, i, t;

	if (b->n_tokens <= 0 || b->n_tokens > e->max_tokens || b->n_seqs <= 0 ||
	    b->n_seqs > e->max_seqs || b->n_out < 0 || b->n_out > e->max_out ||
	    b->n_hidden_only < 0 || b->n_hidden_only > b->n_out ||
	    (b->n_hidden_only && e->m->shard.dist) ||
	    b->q_start[0] != 0 || b->q_start[b->n_seqs] != b->n_tokens ||
	    (b->parent && !loom_exec_trees(e))) {
		loom_seterr(err, errlen, "batch: bad sizes (%d tokens, %d sequences, %d outputs) or a tree the backend cannot run",
			b->n_tokens, b->n_seqs, b->n_out);
		return -1;
	}
	for (t = 0; t < b->n_tokens; t++) {
		if (b->tokens[t] < 0 || b->tokens[t] >= e->m->hp.n_vocab) {
			loom_seterr(err, errlen, "batch: token id %d out of range (vocabulary %lld)",
				b->tokens[t], (long long)e->m->hp.n_vocab);
			return -1;
		}
	}
	for (i = 0; i < b->n_out; i++) {
		if (b->out_rows[i] < 0 || b->out_rows[i] >= b->n_tokens) {
			loom_seterr(err, errlen, "batch: output row %d out of range", b->out_rows[i]);
			return -1;
		}
	}
	memcpy(e->host_in[IN_TOKENS], b->tokens, sizeof(int32_t) * (size_t)b->n_tokens);
	e->table_stride = table_stride(e, b);
	for (s = 0; s < b->n_seqs; s++) {
		const struct loom_kv_seq *seq = b->seqs[s];
		int32_t q_len = b->q_start[s + 1] - b->q_start[s];
		int64_t kv_len = (int64_t)seq->n_tokens + q_len;

		if (seq->n_blocks > e->table_stride) {
			loom_seterr(err, errlen, "batch: sequence %d holds %d blocks of a %lld-block cache",
				s, seq->n_blocks, (long long)e->kv->n_blocks);
			return -1;
		}
		if (q_len <= 0 || kv_len > (int64_t)seq->n_blocks * e->kv->block_size) {
			loom_seterr(err, errlen, "batch: sequence %d has %d new tokens and room for %lld",
				s, q_len, (long long)seq->n_blocks * e->kv->block_size - seq->n_tokens);
			return -1;
		}
		for (i = 0; i < q_len; i++) {
			t = b->q_start[s] + i;
			e->host_in[IN_POS][t] = seq->n_tokens + i;
			e->host_in[IN_SLOTS][t] = loom_kv_slot(e->kv, seq, seq->n_tokens + i);
		}
		if (b->parent && tree_positions(e, b, s, err, errlen))
			return -1;
		e->host_in[IN_QSTART][s] = b->q_start[s];
		e->host_in[IN_KVLEN][s] = (int32_t)kv_len;
		memcpy(e->host_in[IN_BLOCKS] + (size_t)s * (size_t)e->table_stride,
		       seq->blocks, sizeof(int32_t) * (size_t)seq->n_blocks);
		if (e->kv->local && prepare_local(e, b, s, kv_len, err, errlen))
			return -1;
	}
	e->host_in[IN_QSTART][b->n_seqs] = b->n_tokens;
	return 0;
}

/* The step's inputs in one upload: every array up to the used part of
 * the block table, the last one (unused tails of the others ride along). */
static int upload_inputs(struct loom_exec *e, const struct loom_batch *b)
{
	const struct loom_backend *be = e->m->be;
	size_t blocks = (size_t)b->n_seqs * (size_t)e->table_stride * sizeof(int32_t);
	size_t bytes = (size_t)((char *)e->host_in[IN_BLOCKS] - (char *)e->host_inputs) + blocks;
	int rc = be->ops->upload(be->ctx, e->in[0], e->host_inputs, bytes);

	if (!rc && e->kv->local)
		rc = be->ops->upload(be->ctx, e->in[IN_LBLOCKS], e->host_in[IN_LBLOCKS], blocks);
	return rc;
}

/* Hands a weight GEMM's input to the model's gemm_input observer: the
 * rows are downloaded (waiting for the ops before) and packed to cols. */
static int observe_gemm(struct loom_exec *e, const struct loom_node *nd, int64_t rows)
{
	const struct loom_backend *be = e->m->be;
	int64_t cols = nd->w->cols, width = e->width[nd->a];
	size_t need = (size_t)rows * (size_t)width;
	int rc;

	if (!e->m->gemm_input || nd->w->part_tail || rows <= 0 || width < cols)
		return 0;
	if (need > e->gemm_x_cap) {
		float *nb = realloc(e->gemm_x, need * sizeof(float));

		if (!nb)
			return LOOM_ERR_NOMEM;
		e->gemm_x = nb;
		e->gemm_x_cap = need;
	}
	rc = be->ops->download(be->ctx, e->gemm_x, e->act[nd->a], need * sizeof(float));
	if (!rc)
		rc = be->ops->synchronize(be->ctx);
	if (rc)
		return rc;
	for (int64_t r = 1; width != cols && r < rows; r++)
		memmove(e->gemm_x + r * cols, e->gemm_x + r * width, (size_t)cols * sizeof(float));
	e->m->gemm_input(e->m->gemm_input_user, nd->w->name, e->gemm_x, rows, cols);
	return 0;
}

static int run_gemm(struct loom_exec *e, const struct loom_node *nd, int64_t rows)
{
	const struct loom_backend *be = e->m->be;
	int rc = observe_gemm(e, nd, rows);
	struct loom_gemm_args a = {
		.struct_size = sizeof(a), .w_type = nd->w->type,
		.m = rows, .n = nd->w->rows, .k = nd->w->cols,
		.w = nd->w->data, .w_stride = nd->w->row_bytes,
		.x = e->act[nd->a] + nd->a_col, .x_stride = e->width[nd->a],
		.y = e->act[nd->dst] + nd->col, .y_stride = e->width[nd->dst],
		.w_packed = nd->w->packed,
	};

	return rc ? rc : be->ops->gemm(be->ctx, &a);
}

static int run_rope(struct loom_exec *e, const struct loom_node *nd, int64_t rows)
{
	const struct loom_backend *be = e->m->be;
	const struct loom_hparams *hp = &e->m->hp;
	const struct loom_layer *L = &e->m->layers[nd->layer];
	struct loom_rope_args a = {
		.struct_size = sizeof(a), .mode = hp->arch->rope_mode,
		.x = e->act[nd->dst], .n_tokens = rows,
		.n_heads = e->width[nd->dst] / hp->head_dim, .head_dim = hp->head_dim,
		.n_rot = hp->n_rot, .row_stride = e->width[nd->dst],
		.pos = e->in[IN_POS], .freq_base = L->rope_base,
		.freq_scale = L->rope_scale, .freq_factors = e->m->rope_freqs.data,
	};

	return be->ops->rope(be->ctx, &a);
}

static int run_kv_write(struct loom_exec *e, const struct loom_node *nd, int64_t rows)
{
	const struct loom_backend *be = e->m->be;
	struct loom_kv_write_args a = {
		.struct_size = sizeof(a),
		.kcache = loom_kv_k(e->kv, nd->layer), .vcache = loom_kv_v(e->kv, nd->layer),
		.k = e->act[ACT_K], .v = e->act[ACT_V],
		.k_stride = e->width[ACT_K], .v_stride = e->width[ACT_V],
		.n_tokens = rows, .kv_dim = e->width[ACT_K],
		.slots = e->in[loom_kv_windowed(e->kv, nd->layer) ? IN_LSLOTS : IN_SLOTS],
		.kv_type = e->kv->type,
	};

	return be->ops->kv_write(be->ctx, &a);
}

static int run_attention(struct loom_exec *e, const struct loom_node *nd,
			 const struct loom_batch *b)
{
	const struct loom_backend *be = e->m->be;
	const struct loom_hparams *hp = &e->m->hp;
	struct loom_attention_args a = {
		.struct_size = sizeof(a),
		.out = e->act[ACT_ATT] + nd->col, .q = e->act[ACT_Q],
		.q_stride = e->width[ACT_Q], .out_stride = e->width[ACT_ATT],
		.kcache = loom_kv_k(e->kv, nd->layer), .vcache = loom_kv_v(e->kv, nd->layer),
		.n_seqs = b->n_seqs, .n_heads = e->width[ACT_Q] / hp->head_dim,
		.n_kv_heads = e->width[ACT_K] / hp->head_dim,
		.head_dim = hp->head_dim, .block_size = e->kv->block_size,
		.max_blocks = e->table_stride,
		.q_start = e->in[IN_QSTART], .kv_len = e->in[IN_KVLEN],
		.block_table = e->in[loom_kv_windowed(e->kv, nd->layer) ? IN_LBLOCKS : IN_BLOCKS],
		.scale = hp->attn_scale, .window = e->m->layers[nd->layer].window,
		.softcap = hp->attn_softcap, .kv_type = e->kv->type,
		.parent = b->parent ? e->in[IN_PARENT] : NULL,
		.sinks = e->m->layers[nd->layer].sinks.data, /* ABI 1.8, checked at load */
	};

	return be->ops->attention(be->ctx, &a);
}

/* Copies the rows that need logits next to each other. */
static int run_gather(struct loom_exec *e, const struct loom_node *nd,
		      const struct loom_batch *b)
{
	const struct loom_backend *be = e->m->be;
	size_t row = (size_t)e->width[nd->a] * sizeof(float);
	int32_t i;
	int rc;

	for (i = 0; i < b->n_out; i++) {
		rc = be->ops->copy(be->ctx, e->act[nd->dst] + (size_t)i * e->width[nd->dst],
				   e->act[nd->a] + (size_t)b->out_rows[i] * e->width[nd->a], row);
		if (rc)
			return rc;
	}
	return 0;
}

/* The tensor ranks' shares of dst's columns, to every one of them; or
 * (all-reduce) their partial sums of dst added up. */
static int run_collective(struct loom_exec *e, const struct loom_node *nd, int64_t rows)
{
	const struct loom_backend *be = e->m->be;
	const struct loom_shard *s = &e->m->shard;
	struct loom_collective_args a = {
		.struct_size = sizeof(a), .comm = s->tp_comm,
		.op = nd->op == NODE_ALLREDUCE ? LOOM_COLL_ALLREDUCE_SUM : LOOM_COLL_ALLGATHER,
		.n_ranks = s->tp, .rank = s->tp_rank, .x = e->act[nd->dst], .rows = rows,
		.stride = e->width[nd->dst], .col_start = s->cols[nd->split],
	};

	return be->ops->collective(be->ctx, &a);
}

/* The residual stream to (from) the same tensor rank of the next
 * (previous) stage, through host memory. */
static int run_pipe(struct loom_exec *e, const struct loom_node *nd, int64_t rows)
{
	const struct loom_backend *be = e->m->be;
	const struct loom_shard *s = &e->m->shard;
	size_t bytes = (size_t)rows * (size_t)e->width[ACT_X] * sizeof(float);
	char why[160];
	int rc;

	if (nd->op == NODE_SEND) {
		rc = be->ops->download(be->ctx, e->host_x, e->act[ACT_X], bytes);
		if (!rc)
			rc = be->ops->synchronize(be->ctx);
		if (!rc && loom_dist_send(s->dist, e->host_x, bytes, s->next_rank,
					  LOOM_DIST_TAG_X, why, sizeof(why)))
			rc = LOOM_ERR_IO;
		return rc;
	}
	if (loom_dist_recv(s->dist, e->host_x, bytes, s->prev_rank, LOOM_DIST_TAG_X, why,
			   sizeof(why)))
		return LOOM_ERR_IO;
	return be->ops->upload(be->ctx, e->act[ACT_X], e->host_x, bytes);
}

/* Output rows that need logits (the rest need the hidden state only). */
static int32_t logit_rows(const struct loom_batch *b)
{
	return b->n_out - b->n_hidden_only;
}

static int run_node(struct loom_exec *e, const struct loom_node *nd,
		    const struct loom_batch *b)
{
	const struct loom_backend *be = e->m->be;
	struct loom_backend_ctx *ctx = be->ctx;
	int64_t rows = nd->on_outputs ? b->n_out : b->n_tokens;
	float *dst = e->act[nd->dst], *a = e->act[nd->a];
	int64_t wd = e->width[nd->dst], wa = e->width[nd->a];

	if (nd->on_outputs && nd->dst == ACT_LOGITS)
		rows = logit_rows(b); /* the output layer and its soft-cap */

	switch (nd->op) {
	case NODE_EMBED:
		/* row_bytes 0: the backend's packed table (ABI 1.5) */
		return be->ops->embed(ctx, dst, nd->w->data, nd->w->type,
				      nd->w->packed ? 0 : nd->w->row_bytes,
				      nd->w->rows, nd->w->cols, e->in[IN_TOKENS], rows);
	case NODE_RMSNORM:
		return be->ops->rmsnorm(ctx, dst, wd, a, wa, nd->w->data, rows, wd,
					e->m->hp.norm_eps);
	case NODE_HEADNORM: /* rows of heads: [rows * wd / head_dim][head_dim] */
		return be->ops->rmsnorm(ctx, dst, nd->w->cols, a, nd->w->cols, nd->w->data,
					rows * (wd / nd->w->cols), nd->w->cols, e->m->hp.norm_eps);
	case NODE_SCALE:
		return be->ops->scale(ctx, dst, wd, rows, wd, nd->value);
	case NODE_GEMM:
		return run_gemm(e, nd, rows);
	case NODE_ADD:
		if (nd->w)
			return be->ops->add(ctx, dst, wd, a, wa, nd->w->data, wd, 1, rows, wd);
		return be->ops->add(ctx, dst, wd, a, wa, e->act[nd->b], e->width[nd->b],
				    rows, rows, wd);
	case NODE_ROPE:
		return run_rope(e, nd, rows);
	case NODE_KV_WRITE:
		return run_kv_write(e, nd, rows);
	case NODE_ATTENTION:
		return run_attention(e, nd, b);
	case NODE_GLU: /* over this rank's columns when cols > 0 */
		return be->ops->glu(ctx, e->m->hp.arch->glu, dst + nd->col, wd, a + nd->col, wa,
				    e->act[nd->b] + nd->col, e->width[nd->b], rows,
				    nd->cols ? nd->cols : wd);
	case NODE_ALLGATHER:
	case NODE_ALLREDUCE:
		return run_collective(e, nd, rows);
	case NODE_RECV:
	case NODE_SEND:
		return run_pipe(e, nd, rows);
	case NODE_GATHER:
		return run_gather(e, nd, b);
	case NODE_MOE:
		return loom_moe_run(e->m, nd->layer, rows, a, wa, e->act[nd->b], e->width[nd->b],
				    dst, wd, &e->moe, e->in_region);
	case NODE_SOFTCAP:
		if (!loom_backend_has_softcap(be))
			return 0; /* loom_exec_step caps the downloaded logits */
		return be->ops->softcap(ctx, dst, wd, rows, wd, nd->value);
	}
	return LOOM_ERR_INVALID;
}

static const char *const node_names[] = {
	"embed", "rmsnorm", "gemm", "add", "rope", "kv_write", "attention", "glu", "gather",
	"headnorm", "scale", "softcap", "all-gather", "all-reduce", "receive", "send", "moe",
};

/* Runs the graph's nodes; err names the node that failed. */
static int run_nodes(struct loom_exec *e, const struct loom_batch *b, char *err, size_t errlen)
{
	const struct loom_backend *be = e->m->be;
	int i, rc = 0;

	for (i = 0; rc == 0 && i < e->m->n_nodes; i++) {
		const struct loom_node *nd = &e->m->nodes[i];

		if (nd->on_outputs && b->n_out == 0)
			break;
		if (nd->on_outputs && nd->dst == ACT_LOGITS && logit_rows(b) == 0)
			break; /* hidden states only: the output layer is the rest */
		rc = run_node(e, nd, b);
		if (rc)
			loom_seterr(err, errlen, "backend %s: %s (layer %d) failed with status %d",
				be->ops->name, node_names[nd->op], nd->layer, rc);
	}
	return rc;
}

/*
 * One step's node calls, as a step region where the backend has them
 * (ABI 1.1): it may then capture the calls once and replay them on later
 * steps of the same shape. Every address and size the calls carry comes
 * from the batch's shape (rows, sequences, output rows), never from where
 * sequences sit in the cache, so a decode step repeats its predecessor's
 * calls exactly; positions, slots and block tables reach the kernels
 * through the input arrays uploaded before the region opens.
 */
static int run_step(struct loom_exec *e, const struct loom_batch *b, char *err, size_t errlen)
{
	const struct loom_backend *be = e->m->be;
	int rc, end_rc;

	/* an observer downloads inside the step, and a distributed step's
	 * hand-overs and collectives are not operator calls a region may
	 * defer: such steps run outside regions */
	if (!loom_backend_has_graphs(be) || e->m->gemm_input || e->m->shard.dist ||
	    (e->m->hp.arch->moe && !loom_backend_has_moe(be)))
		return run_nodes(e, b, err, errlen);
	rc = be->ops->graph_begin(be->ctx);
	if (rc)
		return rc;
	e->in_region = true;
	rc = run_nodes(e, b, err, errlen);
	e->in_region = false;
	end_rc = be->ops->graph_end(be->ctx);
	if (end_rc && !rc)
		loom_seterr(err, errlen, "backend %s: step failed with status %d", be->ops->name,
			end_rc);
	return rc ? rc : end_rc;
}

/* Final-logit soft-capping on the host, for backends without the slot;
 * tanhf as ref.so computes it. */
static void host_softcap(const struct loom_exec *e, float *logits, int32_t n_out)
{
	float cap = e->m->hp.final_softcap;
	size_t n = (size_t)n_out * (size_t)e->width[ACT_LOGITS];

	if (cap <= 0.0f || loom_backend_has_softcap(e->m->be))
		return;
	for (size_t i = 0; i < n; i++)
		logits[i] = cap * tanhf(logits[i] / cap);
}

/* The logits to rank 0 of a distributed job when another rank computes
 * them (the last stage's first tensor rank). posted: a micro-batch's,
 * sent with a posted send (rank 0 posted its receive before the step);
 * loom_exec_run_micro waits for both after the step's micro-batches. */
static int pass_logits(struct loom_exec *e, const struct loom_batch *b, float *logits,
		       bool posted, char *err, size_t errlen)
{
	const struct loom_shard *s = &e->m->shard;
	size_t bytes = (size_t)logit_rows(b) * (size_t)e->width[ACT_LOGITS] * sizeof(float);

	if (!s->dist || s->logits_rank == 0 || logit_rows(b) == 0)
		return 0;
	if (s->logits && posted)
		return loom_dist_post_send(s->dist, logits, bytes, 0, LOOM_DIST_TAG_LOGITS, err,
					   errlen) ? LOOM_ERR_IO : 0;
	if (s->logits)
		return loom_dist_send(s->dist, logits, bytes, 0, LOOM_DIST_TAG_LOGITS, err, errlen) ?
			LOOM_ERR_IO : 0;
	if (s->rank == 0 && !posted)
		return loom_dist_recv(s->dist, logits, bytes, s->logits_rank, LOOM_DIST_TAG_LOGITS,
				      err, errlen) ? LOOM_ERR_IO : 0;
	return 0;
}

bool loom_exec_device_greedy(const struct loom_exec *e)
{
	const char *v = getenv("LOOM_DEVICE_GREEDY");

	return loom_backend_has_argmax(e->m->be) && !e->m->shard.dist &&
	       (e->m->hp.final_softcap <= 0.0f || loom_backend_has_softcap(e->m->be)) &&
	       !(v && !strcmp(v, "0"));
}

bool loom_exec_trees(const struct loom_exec *e)
{
	return !e->m->shard.dist && loom_backend_has_tree(e->m->be, e->kv->type);
}

const int32_t *loom_exec_greedy_ids(const struct loom_exec *e)
{
	return e->ids_valid ? e->ids : NULL;
}

/* The greedy token of each logit row, picked on the device: only the ids
 * are downloaded (4 bytes a row instead of the vocabulary's logits). */
static int pick_greedy(struct loom_exec *e, const struct loom_batch *b)
{
	const struct loom_backend *be = e->m->be;
	int32_t rows = logit_rows(b);
	int rc = LOOM_OK;

	if (!e->ids_buf) {
		rc = be->ops->buffer_alloc(be->ctx, (size_t)e->max_out * sizeof(int32_t),
					   &e->ids_buf);
		e->ids = calloc((size_t)e->max_out, sizeof(int32_t));
		if (!rc && !e->ids)
			rc = LOOM_ERR_NOMEM;
		if (rc)
			return rc;
	}
	rc = be->ops->argmax(be->ctx, be->ops->buffer_addr(be->ctx, e->ids_buf),
			     e->act[ACT_LOGITS], e->width[ACT_LOGITS], rows, e->width[ACT_LOGITS]);
	if (!rc)
		rc = be->ops->download(be->ctx, e->ids,
				       be->ops->buffer_addr(be->ctx, e->ids_buf),
				       (size_t)rows * sizeof(int32_t));
	e->ids_valid = rc == LOOM_OK;
	return rc;
}

bool loom_exec_device_sample(const struct loom_exec *e)
{
	const char *v = getenv("LOOM_DEVICE_SAMPLE");

	return loom_backend_has_sample(e->m->be) && !e->m->shard.dist &&
	       (e->m->hp.final_softcap <= 0.0f || loom_backend_has_softcap(e->m->be)) &&
	       !(v && !strcmp(v, "0"));
}

const int32_t *loom_exec_sampled(const struct loom_exec *e)
{
	return e->sampled_valid ? e->sampled : NULL;
}

bool loom_exec_sample_full(const struct loom_exec *e)
{
	return loom_exec_device_sample(e) && loom_backend_has_sample_full(e->m->be);
}

bool loom_exec_sample_logprobs(const struct loom_exec *e)
{
	return loom_exec_device_sample(e) && loom_backend_has_sample_logprobs(e->m->be);
}

const struct loom_sample_logprob *loom_exec_sampled_logprobs(const struct loom_exec *e,
								 int32_t i)
{
	if (!e->sampled_valid || e->lp_stride <= 0 || i < 0 || i >= e->max_out)
		return NULL;
	return e->smp_lp + (size_t)i * (size_t)e->lp_stride;
}

/* The most log-probabilities a row may ask for (the chosen token's and
 * the top ones). */
#define SMP_LP (1 + LOOM_SAMPLE_MAX_TOP_LOGPROBS)

/* The device buffer of sampled steps: max_out rules and results, then
 * room for n_pen penalty pairs (tokens, counts, and the backend's
 * scratch for their values), then max_out x SMP_LP logprobs. */
static int sample_buffer(struct loom_exec *e, int32_t n_pen)
{
	const struct loom_backend *be = e->m->be;
	size_t rows = (size_t)e->max_out, bytes;
	int32_t room = n_pen > 256 ? n_pen : 256;

	if (e->smp_buf && n_pen <= e->smp_pen)
		return LOOM_OK;
	if (e->smp_buf)
		be->ops->buffer_free(be->ctx, e->smp_buf);
	e->smp_buf = NULL;
	bytes = rows * (sizeof(struct loom_sample_row) + 2 * sizeof(int32_t)) +
		3 * (size_t)room * sizeof(int32_t) + rows * SMP_LP * sizeof(*e->smp_lp);
	if (!e->sampled)
		e->sampled = calloc(rows * 2, sizeof(int32_t));
	if (!e->smp_lp)
		e->smp_lp = calloc(rows * SMP_LP, sizeof(*e->smp_lp));
	if (!e->sampled || !e->smp_lp)
		return LOOM_ERR_NOMEM;
	e->smp_pen = room;
	return be->ops->buffer_alloc(be->ctx, bytes, &e->smp_buf);
}

/* Each logit row's token sampled on the device: the rules and penalty
 * pairs go up, 8 bytes a row come back (and the logprobs asked for). */
static int pick_sampled(struct loom_exec *e, const struct loom_batch *b)
{
	const struct loom_backend *be = e->m->be;
	size_t rows = (size_t)logit_rows(b), pen = (size_t)b->n_pen * sizeof(int32_t);
	char *base;
	struct loom_sample_args a;
	int rc = sample_buffer(e, b->n_pen);

	if (rc)
		return rc;
	base = be->ops->buffer_addr(be->ctx, e->smp_buf);
	a = (struct loom_sample_args){
		.struct_size = sizeof(a), .x = e->act[ACT_LOGITS],
		.stride = e->width[ACT_LOGITS], .rows = (int64_t)rows, .n = e->width[ACT_LOGITS],
		.params = (const struct loom_sample_row *)base,
		.out = (int32_t *)(base + (size_t)e->max_out * sizeof(struct loom_sample_row)),
	};
	a.pen_tokens = a.out + 2 * (size_t)e->max_out;
	a.pen_counts = a.pen_tokens + e->smp_pen;
	a.pen_raw = (float *)(void *)(a.pen_tokens + 2 * (size_t)e->smp_pen);
	if (b->lp_stride > 0) {
		a.lp = (struct loom_sample_logprob *)(void *)(a.pen_tokens + 3 * (size_t)e->smp_pen);
		a.lp_stride = b->lp_stride;
	}
	e->lp_stride = b->lp_stride;
	rc = be->ops->upload(be->ctx, base, b->sample_rows, rows * sizeof(*b->sample_rows));
	if (!rc && pen)
		rc = be->ops->upload(be->ctx, (void *)a.pen_tokens, b->pen_tokens, pen);
	if (!rc && pen)
		rc = be->ops->upload(be->ctx, (void *)a.pen_counts, b->pen_counts, pen);
	if (!rc)
		rc = be->ops->sample(be->ctx, &a);
	if (!rc)
		rc = be->ops->download(be->ctx, e->sampled, a.out, rows * 2 * sizeof(int32_t));
	if (!rc && a.lp)
		rc = be->ops->download(be->ctx, e->smp_lp, a.lp,
				       rows * (size_t)a.lp_stride * sizeof(*a.lp));
	e->sampled_valid = rc == LOOM_OK;
	return rc;
}

/* A row the device refused (token -1: parameters outside its rule). */
static int sampled_ok(const struct loom_exec *e, const struct loom_batch *b, char *err,
		      size_t errlen)
{
	for (int32_t i = 0; i < logit_rows(b); i++)
		if (e->sampled[2 * i] < 0 || e->sampled[2 * i] >= e->width[ACT_LOGITS]) {
			loom_seterr(err, errlen, "backend %s: sample returned token %d for row %d",
				    e->m->be->ops->name, (int)e->sampled[2 * i], (int)i);
			return LOOM_ERR_INVALID;
		}
	return 0;
}

static int run_batch(struct loom_exec *e, const struct loom_batch *b, float *logits,
		     bool posted, char *err, size_t errlen)
{
	const struct loom_backend *be = e->m->be;
	bool head = e->m->shard.logits, greedy, sampled;
	int i, rc;

	err[0] = '\0';
	if (prepare(e, b, err, errlen))
		return LOOM_ERR_INVALID;
	rc = upload_inputs(e, b);
	if (rc == 0)
		rc = run_step(e, b, err, errlen);
	e->ids_valid = false;
	e->sampled_valid = false;
	greedy = b->greedy && head && logit_rows(b) > 0 && loom_exec_device_greedy(e);
	sampled = !greedy && b->sample_rows && head && logit_rows(b) > 0 &&
		  loom_exec_device_sample(e);
	if (rc == 0 && greedy)
		rc = pick_greedy(e, b);
	else if (rc == 0 && sampled)
		rc = pick_sampled(e, b);
	else if (rc == 0 && logit_rows(b) > 0 && head)
		rc = be->ops->download(be->ctx, logits, e->act[ACT_LOGITS],
				       (size_t)logit_rows(b) * (size_t)e->width[ACT_LOGITS] * sizeof(float));
	if (rc == 0)
		rc = be->ops->synchronize(be->ctx);
	if (rc == 0 && sampled)
		rc = sampled_ok(e, b, err, errlen);
	if (rc == 0 && head && logit_rows(b) > 0 && !greedy && !sampled)
		host_softcap(e, logits, logit_rows(b));
	if (rc == 0)
		rc = pass_logits(e, b, logits, posted, err, errlen);
	if (rc) {
		if (!err[0])
			loom_seterr(err, errlen, "backend %s: step failed with status %d",
				be->ops->name, rc);
		return rc;
	}
	for (i = 0; i < b->n_seqs; i++)
		b->seqs[i]->n_tokens += b->q_start[i + 1] - b->q_start[i];
	return 0;
}

int loom_exec_hidden(struct loom_exec *e, int32_t first, int32_t n, float *out)
{
	const struct loom_backend *be = e->m->be;
	size_t w = (size_t)e->width[ACT_OUT];
	int rc;

	if (first < 0 || n <= 0)
		return LOOM_ERR_INVALID;
	if (e->m->shard.dist) /* another rank may hold them */
		return LOOM_ERR_UNSUPPORTED;
	rc = be->ops->download(be->ctx, out, e->act[ACT_OUT] + (size_t)first * w,
			       (size_t)n * w * sizeof(float));
	return rc ? rc : be->ops->synchronize(be->ctx);
}

/* Whether b splits at cuts into micro-batches: whole sequences in
 * order, rows in order (so each micro-batch's output rows, and logits,
 * are a run of b's), within the executor's limits. */
static bool cuts_ok(const struct loom_exec *e, const struct loom_batch *b, const int32_t *cuts,
		    int32_t n_micro)
{
	int32_t i;

	if (b->n_seqs <= 0 || b->n_seqs > e->max_seqs || b->n_out < 0 || b->n_out > e->max_out ||
	    b->n_hidden_only || n_micro > b->n_seqs || cuts[0] != 0 ||
	    cuts[n_micro] != b->n_seqs || b->q_start[0] != 0 ||
	    b->q_start[b->n_seqs] != b->n_tokens)
		return false;
	for (i = 0; i < n_micro; i++)
		if (cuts[i + 1] <= cuts[i])
			return false;
	for (i = 0; i < b->n_seqs; i++)
		if (b->q_start[i + 1] < b->q_start[i])
			return false;
	for (i = 1; i < b->n_out; i++)
		if (b->out_rows[i] < b->out_rows[i - 1])
			return false;
	return true;
}

/* Micro-batch k of b (sequences cuts[k] .. cuts[k+1]-1) into sub, its
 * rows counted from its first; *out_lo: its first output row in b's. */
static void micro_batch(struct loom_exec *e, const struct loom_batch *b, const int32_t *cuts,
			int32_t k, struct loom_batch *sub, int32_t *out_lo)
{
	int32_t s0 = cuts[k], s1 = cuts[k + 1], t0 = b->q_start[s0], t1 = b->q_start[s1];
	int32_t o0 = 0, o1;

	while (o0 < b->n_out && b->out_rows[o0] < t0)
		o0++;
	for (o1 = o0; o1 < b->n_out && b->out_rows[o1] < t1; o1++)
		e->sub_out[o1 - o0] = b->out_rows[o1] - t0;
	for (int32_t s = s0; s <= s1; s++)
		e->sub_q[s - s0] = b->q_start[s] - t0;
	*sub = (struct loom_batch){ .n_tokens = t1 - t0, .tokens = b->tokens + t0,
		.n_seqs = s1 - s0, .q_start = e->sub_q, .seqs = b->seqs + s0,
		.n_out = o1 - o0, .out_rows = e->sub_out,
		.parent = b->parent ? b->parent + t0 : NULL };
	*out_lo = o0;
}

/* Rank 0 of a pipeline posts the receives of every micro-batch's logits
 * first: the last stage then sends each as soon as it has it, while rank
 * 0 runs the next micro-batches. */
static int post_logits(struct loom_exec *e, const struct loom_batch *b, const int32_t *cuts,
		       int32_t n_micro, float *logits, char *err, size_t errlen)
{
	const struct loom_shard *s = &e->m->shard;
	size_t row = (size_t)e->width[ACT_LOGITS] * sizeof(float);
	struct loom_batch sub;
	int32_t o0;

	for (int32_t k = 0; k < n_micro; k++) {
		micro_batch(e, b, cuts, k, &sub, &o0);
		if (sub.n_out && loom_dist_post_recv(s->dist, (char *)logits + (size_t)o0 * row,
						     (size_t)sub.n_out * row, s->logits_rank,
						     LOOM_DIST_TAG_LOGITS, err, errlen))
			return LOOM_ERR_IO;
	}
	return 0;
}

int loom_exec_run_micro(struct loom_exec *e, const struct loom_batch *b, const int32_t *cuts,
			int32_t n_micro, float *logits, char *err, size_t errlen)
{
	const struct loom_shard *s = &e->m->shard;
	size_t row = (size_t)e->width[ACT_LOGITS];
	bool post = s->dist && s->rank == 0 && s->logits_rank != 0;
	struct loom_batch sub;
	int32_t o0;
	int rc;

	if (n_micro == 1 && cuts[0] == 0 && cuts[1] == b->n_seqs)
		return run_batch(e, b, logits, false, err, errlen);
	if (n_micro < 1 || !e->sub_q || !cuts_ok(e, b, cuts, n_micro)) {
		loom_seterr(err, errlen, "batch: bad micro-batches (%d of %d sequences)", n_micro,
			b->n_seqs);
		return LOOM_ERR_INVALID;
	}
	rc = post ? post_logits(e, b, cuts, n_micro, logits, err, errlen) : 0;
	for (int32_t k = 0; rc == 0 && k < n_micro; k++) {
		micro_batch(e, b, cuts, k, &sub, &o0);
		rc = run_batch(e, &sub, logits + (size_t)o0 * row, true, err, errlen);
	}
	if (rc == 0 && s->dist && loom_dist_wait_posted(s->dist, err, errlen))
		rc = LOOM_ERR_IO;
	return rc;
}

/* Whether b's output rows are in order (each sequence's after the ones
 * before it), as splitting needs. */
static bool rows_sorted(const struct loom_batch *b)
{
	for (int32_t i = 1; i < b->n_out; i++)
		if (b->out_rows[i] < b->out_rows[i - 1])
			return false;
	return true;
}

/* A micro-batch's own cost, in rows of compute: it streams a stage's
 * weights once more and hands its rows over once more. On cpu.so
 * (SmolLM2, one thread) a weight pass costs about one row's compute;
 * this takes two, a margin for the hand-over (docs/DISTRIBUTED.md). */
#define MICRO_COST_ROWS 2

/* How many micro-batches a step of n_tokens tokens in n_seqs sequences
 * runs as: micro when given; else the N that minimizes the step's time
 * (N + P - 1) * (F + R / N) for R tokens on P stages, F =
 * MICRO_COST_ROWS: N = sqrt((P - 1) * R / F), so 1 below 8 tokens on 2
 * stages, 2 from 8, 4 from 32. Never more than its sequences. */
static int32_t micro_count(int pp, int micro, int32_t n_tokens, int32_t n_seqs)
{
	int64_t work = (int64_t)(pp - 1) * n_tokens, m = 1;

	if (micro > 0)
		m = micro;
	else
		while ((m + 1) * (m + 1) * MICRO_COST_ROWS <= work && m < n_seqs)
			m++;
	return m < n_seqs ? (int32_t)m : n_seqs;
}

int32_t loom_micro_cuts(int pp, int micro, const int32_t *q_start, int32_t n_seqs,
			int32_t *cuts)
{
	int32_t m = pp > 1 && n_seqs > 1 ? micro_count(pp, micro, q_start[n_seqs], n_seqs) : 1;
	int64_t total = q_start[n_seqs];

	cuts[0] = 0;
	for (int32_t k = 1; k < m; k++) {
		int32_t j = cuts[k - 1] + 1;

		while (j < n_seqs - (m - k) && (int64_t)q_start[j] * m < total * k)
			j++;
		cuts[k] = j;
	}
	cuts[m] = n_seqs;
	return m;
}

/* Rank 0 of a pipeline: e->cuts of step b (loom_micro_cuts); their count.
 * 1: the step runs whole, also when its output rows are out of order or
 * its logits too large to post. */
static int32_t split_step(struct loom_exec *e, const struct loom_batch *b,
			  const struct loom_dist *d)
{
	size_t row = (size_t)e->width[ACT_LOGITS] * sizeof(float);

	if (!e->cuts || b->n_hidden_only || !rows_sorted(b) ||
	    (size_t)b->n_out > (size_t)INT32_MAX / row)
		return 1;
	return loom_micro_cuts(d->pp, d->micro, b->q_start, b->n_seqs, e->cuts);
}

int loom_exec_step(struct loom_exec *e, const struct loom_batch *b, float *logits,
		   char *err, size_t errlen)
{
	struct loom_dist *d = e->m->shard.dist;
	int32_t whole[2] = { 0, b->n_seqs }, n_micro;
	const int32_t *cuts;
	int rc;

	if (!d)
		return run_batch(e, b, logits, false, err, errlen);
	n_micro = split_step(e, b, d);
	cuts = n_micro > 1 ? e->cuts : whole;
	if (n_micro > 1 && !e->told_split) {
		loom_log(LOOM_LOG_DEBUG, "distributed: a step of %d sequences runs as %d micro-batches",
			 b->n_seqs, n_micro);
		e->told_split = true;
	}
	/* rank 0 of a distributed job: every rank runs this step; one that
	 * failed here leaves the others inside it, so the job ends */
	loom_dist_busy(d, "a step");
	rc = loom_dist_plan_step(d, e->kv, b, cuts, n_micro, err, errlen) ? LOOM_ERR_IO :
		loom_exec_run_micro(e, b, cuts, n_micro, logits, err, errlen);
	if (rc)
		loom_dist_abort(d, err[0] ? err : "a step failed");
	loom_dist_busy(d, NULL);
	return rc;
}

int loom_exec_one(struct loom_exec *e, struct loom_kv_seq *seq, const int32_t *tokens,
		  int32_t n, bool want_logits, float *logits, char *err, size_t errlen)
{
	int32_t q_start[2] = { 0, n }, out_row = n - 1;
	struct loom_kv_seq *seqs[1] = { seq };
	struct loom_batch b = { .n_tokens = n, .tokens = tokens, .n_seqs = 1,
		.q_start = q_start, .seqs = seqs, .n_out = want_logits ? 1 : 0,
		.out_rows = &out_row };

	return loom_exec_step(e, &b, logits, err, errlen);
}

struct loom_kv *loom_exec_kv(struct loom_exec *e)
{
	return e->kv;
}
