/* `loom bench`: prefill and decode throughput, in the spirit of llama-bench. */
#ifndef LOOM_BENCH_H
#define LOOM_BENCH_H

#include <stddef.h>

#include "options.h"

int loom_bench(struct loom_options *o, char *err, size_t errlen);

#endif
