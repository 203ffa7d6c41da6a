/* The decoder graph, built from the model's architecture descriptor
 * (arch.c): Llama 2/3/3.1, Mistral, SmolLM2, Qwen2/3, Phi-3, Gemma 2/3.
 *
 * Over every token of the step:
 *   x = embd[tokens]                              (* sqrt(n_embd): gemma)
 * per layer i, with the layer's RoPE base/scaling and window (0: global):
 *   xn  = rmsnorm(x) * attn_norm
 *   q,k,v = xn . Wq/Wk/Wv (+ bq/bk/bv where the layer has them; fused
 *           weights arrive here split, see arch.h)
 *   q,k = rmsnorm(each head of q, k) * q_norm/k_norm   (QK-norm: gemma3, qwen3)
 *   rope(q), rope(k)          (adjacent pairs or NeoX halves: descriptor)
 *   cache <- k, v
 *   s   = attn_scale * q.k;  s = c * tanh(s / c)       (attention softcap: gemma2)
 *   att = softmax(s over the causal window) . v
 *         (gpt-oss: a learned sink logit per head joins the softmax's
 *         denominator, in the attention operator, ABI 1.8)
 *   p   = att . Wo (+ bo: gpt-oss);  p = rmsnorm(p) * post_attn_norm  (gemma)
 *   x  += p
 *   xn  = rmsnorm(x) * ffn_norm
 *   p   = (act(xn . Wgate) * (xn . Wup)) . Wdown      (act: SiLU or GELU-tanh)
 *   p   = rmsnorm(p) * post_ffn_norm                  (gemma)
 *   x  += p
 * Mixture of experts (Mixtral, Qwen2/3-MoE) replaces the FFN with
 *   xn  = rmsnorm(x) * ffn_norm
 *   r   = xn . Wrouter (+ b_router: gpt-oss)   (router logits, [n_expert] a row)
 *   p   = sum over the row's top-k experts e of w_e * down_e(silu(gate_e xn) * up_e xn)
 *         (+ sigmoid(xn . g_shexp) * shared expert(xn): qwen2moe;
 *          gpt-oss: expert biases and its clamped SwiGLU, in the moe node)
 *   x  += p
 * the routing rule and weights as loom/moe.h defines them, one moe node.
 * then, over the rows that need logits only:
 *   logits = rmsnorm(x) * output_norm . Wout          (Wout = embd when tied)
 *   logits = c * tanh(logits / c)                     (final softcap: gemma2)
 *
 * A rank of a distributed job (model/shard.h) builds its share: its
 * stage's layers (receiving x from the previous stage instead of
 * embedding, sending it on instead of the head), and with tensor ranks
 * q, k, v for its heads, att written into its heads' columns, gate/up
 * into its FFN columns, each Wo/Wdown product into its rows of p; att,
 * the gated activation and p are then all-gathered.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/graph.h"

struct builder {
	struct loom_node *nodes;
	int n;
	int cap;
};

static void emit(struct builder *b, struct loom_node node)
{
	if (b->n < b->cap)
		b->nodes[b->n] = node;
	b->n++;
}

/* dst = op(a) with weight w, in layer i. */
static void emit_w(struct builder *b, enum loom_node_op op, enum loom_act dst,
		   enum loom_act a, const struct loom_weight *w, int i)
{
	emit(b, (struct loom_node){ .op = op, .dst = dst, .a = a, .w = w, .layer = i });
}

/* x += p, in layer i. */
static void emit_residual(struct builder *b, int i)
{
	emit(b, (struct loom_node){ .op = NODE_ADD, .dst = ACT_X, .a = ACT_X, .b = ACT_PROJ,
				    .layer = i });
}

/* All-gathers act's columns between the tensor ranks. */
static void emit_gather(struct builder *b, const struct loom_shard *s, enum loom_act act,
			enum loom_split split, int i)
{
	if (s->tp > 1)
		emit(b, (struct loom_node){ .op = NODE_ALLGATHER, .dst = act, .a = act,
					    .layer = i, .split = split });
}

/* dst = a . W^T into dst's columns from col on (the rank's share). */
static void emit_gemm_at(struct builder *b, enum loom_act dst, enum loom_act a,
			 const struct loom_weight *w, int i, int64_t col)
{
	emit(b, (struct loom_node){ .op = NODE_GEMM, .dst = dst, .a = a, .w = w, .layer = i,
				    .col = col });
}

/* p = a . W^T for a projection (wo, w_down) whose input a holds this
 * rank's columns from a_col on: gathered first and multiplied by the
 * rank's rows of W, then gathered (exact); or multiplied by the rank's
 * columns of W and summed over the ranks (shard.h). */
static void emit_projection(struct builder *b, const struct loom_shard *s, enum loom_act a,
			    enum loom_split split, const struct loom_weight *w, int i,
			    int64_t a_col)
{
	if (s->reduce) {
		emit(b, (struct loom_node){ .op = NODE_GEMM, .dst = ACT_PROJ, .a = a, .w = w,
					    .layer = i, .a_col = a_col });
		emit(b, (struct loom_node){ .op = NODE_ALLREDUCE, .dst = ACT_PROJ, .a = ACT_PROJ,
					    .layer = i, .split = SPLIT_SUM });
		return;
	}
	emit_gather(b, s, a, split, i);
	emit_gemm_at(b, ACT_PROJ, a, w, i, s->embd_lo);
	emit_gather(b, s, ACT_PROJ, SPLIT_EMBD, i);
}

static void emit_attention(struct builder *b, const struct loom_shard *s,
			   const struct loom_layer *L, int i, int64_t head_dim)
{
	emit_w(b, NODE_RMSNORM, ACT_XN, ACT_X, &L->attn_norm, i);
	emit_w(b, NODE_GEMM, ACT_Q, ACT_XN, &L->wq, i);
	emit_w(b, NODE_GEMM, ACT_K, ACT_XN, &L->wk, i);
	emit_w(b, NODE_GEMM, ACT_V, ACT_XN, &L->wv, i);
	if (L->bq.data) {
		emit_w(b, NODE_ADD, ACT_Q, ACT_Q, &L->bq, i);
		emit_w(b, NODE_ADD, ACT_K, ACT_K, &L->bk, i);
		emit_w(b, NODE_ADD, ACT_V, ACT_V, &L->bv, i);
	}
	if (L->q_norm.data) {
		emit_w(b, NODE_HEADNORM, ACT_Q, ACT_Q, &L->q_norm, i);
		emit_w(b, NODE_HEADNORM, ACT_K, ACT_K, &L->k_norm, i);
	}
	emit_w(b, NODE_ROPE, ACT_Q, ACT_Q, NULL, i);
	emit_w(b, NODE_ROPE, ACT_K, ACT_K, NULL, i);
	emit(b, (struct loom_node){ .op = NODE_KV_WRITE, .dst = ACT_K, .a = ACT_K, .b = ACT_V,
				    .layer = i });
	emit(b, (struct loom_node){ .op = NODE_ATTENTION, .dst = ACT_ATT, .a = ACT_Q,
				    .layer = i, .col = s->q_lo * head_dim });
	emit_projection(b, s, ACT_ATT, SPLIT_ATT, &L->wo, i, s->q_lo * head_dim);
	if (L->bo.data)
		emit_w(b, NODE_ADD, ACT_PROJ, ACT_PROJ, &L->bo, i);
	if (L->post_attn_norm.data)
		emit_w(b, NODE_RMSNORM, ACT_PROJ, ACT_PROJ, &L->post_attn_norm, i);
	emit_residual(b, i);
}

static void emit_ffn(struct builder *b, const struct loom_shard *s,
		     const struct loom_layer *L, int i)
{
	emit_w(b, NODE_RMSNORM, ACT_XN, ACT_X, &L->ffn_norm, i);
	emit_gemm_at(b, ACT_GATE, ACT_XN, &L->w_gate, i, s->ff_lo);
	emit_gemm_at(b, ACT_UP, ACT_XN, &L->w_up, i, s->ff_lo);
	emit(b, (struct loom_node){ .op = NODE_GLU, .dst = ACT_GATE, .a = ACT_GATE, .b = ACT_UP,
				    .layer = i, .col = s->ff_lo, .cols = s->ff_hi - s->ff_lo });
	emit_projection(b, s, ACT_GATE, SPLIT_FF, &L->w_down, i, s->ff_lo);
	if (L->post_ffn_norm.data)
		emit_w(b, NODE_RMSNORM, ACT_PROJ, ACT_PROJ, &L->post_ffn_norm, i);
	emit_residual(b, i);
}

/* The routed FFN: router logits, then one moe node into p. */
static void emit_moe(struct builder *b, const struct loom_shard *s, const struct loom_layer *L,
		     int i)
{
	emit_w(b, NODE_RMSNORM, ACT_XN, ACT_X, &L->ffn_norm, i);
	emit_w(b, NODE_GEMM, ACT_ROUTER, ACT_XN, &L->ffn_gate_inp, i);
	if (L->router_b.data)
		emit_w(b, NODE_ADD, ACT_ROUTER, ACT_ROUTER, &L->router_b, i);
	emit(b, (struct loom_node){ .op = NODE_MOE, .dst = ACT_PROJ, .a = ACT_XN, .b = ACT_ROUTER,
				    .layer = i });
	if (s->moe_split) /* each rank's experts' columns: summed (shard.h) */
		emit(b, (struct loom_node){ .op = NODE_ALLREDUCE, .dst = ACT_PROJ, .a = ACT_PROJ,
					    .layer = i, .split = SPLIT_SUM });
	emit_residual(b, i);
}

static void emit_input(struct builder *b, const struct loom_model *m)
{
	if (!m->shard.first) {
		emit(b, (struct loom_node){ .op = NODE_RECV, .dst = ACT_X, .a = ACT_X,
					    .layer = -1 });
		return;
	}
	emit_w(b, NODE_EMBED, ACT_X, 0, &m->tok_embd, -1);
	if (m->hp.arch->embd_scale)
		emit(b, (struct loom_node){ .op = NODE_SCALE, .dst = ACT_X, .a = ACT_X,
					    .layer = -1, .value = sqrtf((float)m->hp.n_embd) });
}

static void emit_model(struct builder *b, const struct loom_model *m)
{
	const struct loom_shard *s = &m->shard;
	int i;

	emit_input(b, m);
	for (i = s->layer_lo; i < s->layer_hi; i++) {
		emit_attention(b, s, &m->layers[i], i, m->hp.head_dim);
		if (m->hp.arch->moe)
			emit_moe(b, s, &m->layers[i], i);
		else
			emit_ffn(b, s, &m->layers[i], i);
	}
	if (!s->last) {
		emit(b, (struct loom_node){ .op = NODE_SEND, .dst = ACT_X, .a = ACT_X,
					    .layer = -1 });
		return;
	}
	if (!s->logits)
		return;
	emit(b, (struct loom_node){ .op = NODE_GATHER, .dst = ACT_OUT, .a = ACT_X, .layer = -1,
				    .on_outputs = true });
	emit(b, (struct loom_node){ .op = NODE_RMSNORM, .dst = ACT_OUT, .a = ACT_OUT,
				    .w = &m->output_norm, .layer = -1, .on_outputs = true });
	emit(b, (struct loom_node){ .op = NODE_GEMM, .dst = ACT_LOGITS, .a = ACT_OUT,
				    .w = &m->output, .layer = -1, .on_outputs = true });
	if (m->hp.final_softcap > 0.0f)
		emit(b, (struct loom_node){ .op = NODE_SOFTCAP, .dst = ACT_LOGITS,
					    .a = ACT_LOGITS, .layer = -1, .on_outputs = true,
					    .value = m->hp.final_softcap });
}

int loom_graph_build(struct loom_model *m, char *err, size_t errlen)
{
	struct builder b = { 0 };

	emit_model(&b, m); /* first pass counts */
	b.nodes = calloc((size_t)b.n, sizeof(*b.nodes));
	if (!b.nodes) {
		snprintf(err, errlen, "out of memory building the graph");
		return -1;
	}
	b.cap = b.n;
	b.n = 0;
	emit_model(&b, m);
	m->nodes = b.nodes;
	m->n_nodes = b.n;
	return 0;
}
