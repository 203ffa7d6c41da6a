/* Per-architecture graph builders (internal). */
#ifndef LOOM_GRAPH_H
#define LOOM_GRAPH_H

#include <stddef.h>

#include "model/model.h"

/* Builds m->nodes for m->hp.arch once, after the weights are loaded. */
int loom_graph_build(struct loom_model *m, char *err, size_t errlen);

#endif
