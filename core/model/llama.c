/* The llama-family graph (Llama 2/3, Mistral, SmolLM2, Qwen2).
 *
 * Per layer, over every token of the step:
 *   xn  = rmsnorm(x) * attn_norm
 *   q,k,v = xn . Wq/Wk/Wv (+ biases for qwen2); rope(q), rope(k)
 *   cache <- k, v;  att = attention(q, cache)
 *   x  += att . Wo
 *   xn  = rmsnorm(x) * ffn_norm
 *   x  += (silu(xn . Wgate) * (xn . Wup)) . Wdown
 * then, over the rows that need logits only:
 *   logits = rmsnorm(x) * output_norm . Wout
 */
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

static void emit_layer(struct builder *b, const struct loom_layer *L, int i)
{
	emit(b, (struct loom_node){ NODE_RMSNORM, ACT_XN, ACT_X, 0, &L->attn_norm, i, false });
	emit(b, (struct loom_node){ NODE_GEMM, ACT_Q, ACT_XN, 0, &L->wq, i, false });
	emit(b, (struct loom_node){ NODE_GEMM, ACT_K, ACT_XN, 0, &L->wk, i, false });
	emit(b, (struct loom_node){ NODE_GEMM, ACT_V, ACT_XN, 0, &L->wv, i, false });
	if (L->bq.data) {
		emit(b, (struct loom_node){ NODE_ADD, ACT_Q, ACT_Q, 0, &L->bq, i, false });
		emit(b, (struct loom_node){ NODE_ADD, ACT_K, ACT_K, 0, &L->bk, i, false });
		emit(b, (struct loom_node){ NODE_ADD, ACT_V, ACT_V, 0, &L->bv, i, false });
	}
	emit(b, (struct loom_node){ NODE_ROPE, ACT_Q, ACT_Q, 0, NULL, i, false });
	emit(b, (struct loom_node){ NODE_ROPE, ACT_K, ACT_K, 0, NULL, i, false });
	emit(b, (struct loom_node){ NODE_KV_WRITE, ACT_K, ACT_K, ACT_V, NULL, i, false });
	emit(b, (struct loom_node){ NODE_ATTENTION, ACT_ATT, ACT_Q, 0, NULL, i, false });
	emit(b, (struct loom_node){ NODE_GEMM, ACT_PROJ, ACT_ATT, 0, &L->wo, i, false });
	emit(b, (struct loom_node){ NODE_ADD, ACT_X, ACT_X, ACT_PROJ, NULL, i, false });
	emit(b, (struct loom_node){ NODE_RMSNORM, ACT_XN, ACT_X, 0, &L->ffn_norm, i, false });
	emit(b, (struct loom_node){ NODE_GEMM, ACT_GATE, ACT_XN, 0, &L->w_gate, i, false });
	emit(b, (struct loom_node){ NODE_GEMM, ACT_UP, ACT_XN, 0, &L->w_up, i, false });
	emit(b, (struct loom_node){ NODE_GLU, ACT_GATE, ACT_GATE, ACT_UP, NULL, i, false });
	emit(b, (struct loom_node){ NODE_GEMM, ACT_PROJ, ACT_GATE, 0, &L->w_down, i, false });
	emit(b, (struct loom_node){ NODE_ADD, ACT_X, ACT_X, ACT_PROJ, NULL, i, false });
}

static void emit_model(struct builder *b, const struct loom_model *m)
{
	int i;

	emit(b, (struct loom_node){ NODE_EMBED, ACT_X, 0, 0, &m->tok_embd, -1, false });
	for (i = 0; i < m->hp.n_layer; i++)
		emit_layer(b, &m->layers[i], i);
	emit(b, (struct loom_node){ NODE_GATHER, ACT_OUT, ACT_X, 0, NULL, -1, true });
	emit(b, (struct loom_node){ NODE_RMSNORM, ACT_OUT, ACT_OUT, 0, &m->output_norm, -1, true });
	emit(b, (struct loom_node){ NODE_GEMM, ACT_LOGITS, ACT_OUT, 0, &m->output, -1, true });
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
