#include "chunk.h"

#include <stdbool.h>
#include <stdio.h>

struct chunk_done {
	bool done, failed;
	char error[256];
};

static void on_event(void *user, const struct loom_event *ev)
{
	struct chunk_done *d = user;

	if (ev->finish == LOOM_FINISH_NONE)
		return;
	d->done = true;
	d->failed = ev->finish == LOOM_FINISH_ERROR;
	if (ev->error)
		snprintf(d->error, sizeof(d->error), "%s", ev->error);
}

int loom_tool_run_chunk(struct loom_engine *e, const int32_t *toks, int32_t n,
			float *all_logits, char *err, size_t errlen)
{
	struct chunk_done d = { 0 };
	struct loom_request r;
	uint64_t id;
	int rc;

	loom_request_init(&r);
	r.prompt = toks;
	r.n_prompt = n;
	r.n_predict = 1;
	r.sampling.temp = 0;
	r.ignore_eog = true;
	r.all_logits = all_logits;
	r.on_event = on_event;
	r.user = &d;
	rc = loom_submit(e, &r, &id, err, errlen);
	while (!rc && !d.done)
		rc = loom_engine_step(e) < 0 && !d.done ? -1 : 0;
	if (!rc && d.failed) {
		snprintf(err, errlen, "%s", d.error[0] ? d.error : "backend failure");
		rc = -1;
	}
	return rc;
}
