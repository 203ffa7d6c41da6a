/* `loom serve`: options, start-up, the engine thread and shutdown. */
#include "serve.h"
#include "serve_int.h"

#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "util.h"

/* ---- options ---- */

/* The options are tools/options.c's, the server's among them. */
static int parse_args(int argc, char **argv, struct loom_options *o, char *err, size_t errlen)
{
	int rc = loom_options_parse(o, argc, argv, err, errlen);

	if (rc > 0) /* --help */
		exit(0);
	if (rc)
		return -1;
	if (!o->model[0]) {
		loom_seterr(err, errlen, "no model given (--model FILE)");
		return -1;
	}
	return 0;
}

/* ---- start-up ---- */

static int load_tokenizer(struct server *srv, char *err, size_t errlen)
{
	char *tmpl = NULL;
	int32_t ids[4];
	int rc;

	srv->tok = loom_tokenizer_from_gguf(srv->f, err, errlen);
	if (!srv->tok)
		return -1;
	srv->add_bos = loom_tokenize(srv->tok, "", 0, true, false, ids, 4) >= 1 &&
		       ids[0] == loom_tokenizer_bos(srv->tok);
	rc = gguf_get_str(srv->f, "tokenizer.chat_template", &tmpl, err, errlen);
	if (rc < 0)
		return -1;
	srv->chat_ok = !loom_chat_template_detect(tmpl, &srv->chat, srv->chat_err,
						  sizeof(srv->chat_err));
	fprintf(stderr, "loom serve: chat template: %s%s\n",
		srv->chat_ok ? loom_chat_family_name(srv->chat.family) : srv->chat_err,
		tmpl ? "" : " (the model has none; chatml assumed)");
	free(tmpl);
	return 0;
}

static int load_model(struct server *srv, char *err, size_t errlen)
{
	struct loom_model_params mp = {
		.backend = srv->o.backend, .n_threads = srv->o.n_threads,
		.backend_flags = LOOM_BACKEND_BATCH_INVARIANT,
	};
	char why[2048];
	int64_t train;

	srv->f = gguf_open(srv->o.model, why, sizeof(why));
	if (!srv->f) {
		loom_seterr(err, errlen, "%s: %s", srv->o.model, why);
		return -1;
	}
	if (load_tokenizer(srv, err, errlen))
		return -1;
	srv->m = loom_model_load(srv->f, &mp, err, errlen);
	if (!srv->m)
		return -1;
	train = srv->m->hp.n_ctx_train > 0 ? srv->m->hp.n_ctx_train : 4096;
	srv->n_ctx = srv->o.ctx_given ? srv->o.n_ctx : 4096;
	if (srv->n_ctx > train) {
		if (srv->o.ctx_given)
			fprintf(stderr, "loom serve: --ctx-size %d is above the trained context; using %lld\n",
				srv->n_ctx, (long long)train);
		srv->n_ctx = (int32_t)train;
	}
	return 0;
}

/* Finds an offered strategy by name ("ngram", "ngram.so"); NULL if none. */
struct loom_spec_kind *server_find_spec(const struct server *srv, const char *name)
{
	size_t len = strlen(name);
	int i;

	if (len > 3 && !strcmp(name + len - 3, ".so"))
		len -= 3;
	for (i = 0; i < srv->n_spec; i++) {
		const char *k = loom_spec_kind_name(srv->spec[i]);

		if (strlen(k) == len && !strncmp(k, name, len))
			return srv->spec[i];
	}
	return NULL;
}

/* Loads one strategy of the --spec list. */
static int load_one_spec(struct server *srv, const char *name, const struct loom_spec_config *c,
			 char *err, size_t errlen)
{
	struct loom_spec_kind *k;

	if (srv->n_spec == SRV_MAX_SPEC) {
		loom_seterr(err, errlen, "--spec: at most %d strategies", SRV_MAX_SPEC);
		return -1;
	}
	/* the scheduler runs the early-exit model (layerskip); spec.c the draft
	 * model of --spec-draft-model (draft.so) */
	k = loom_spec_kind_load_models(name, c, (int32_t)srv->m->hp.n_vocab, srv->m->hp.n_layer,
				       srv->draft_pool, err, errlen);
	if (!k)
		return -1;
	if (server_find_spec(srv, loom_spec_kind_name(k))) {
		loom_seterr(err, errlen, "--spec: strategy '%s' (%s) is listed twice",
			    loom_spec_kind_name(k), loom_spec_kind_path(k));
		loom_spec_kind_free(k);
		return -1;
	}
	srv->spec[srv->n_spec++] = k;
	fprintf(stderr, "loom serve: speculative strategy %s (%s), up to %d drafts\n",
		loom_spec_kind_name(k), loom_spec_kind_path(k), loom_spec_kind_max_draft(k));
	return 0;
}

/* Loads the strategies of --spec (comma-separated) and checks the default. */
static int load_specs(struct server *srv, char *err, size_t errlen)
{
	const struct loom_options *b = &srv->o;
	struct loom_spec_config c;
	char list[sizeof(b->spec)], *save = NULL, *name;
	const char *def = srv->o.serve.spec_default;

	loom_spec_config_defaults(&c);
	if (b->spec_min_draft)
		c.min_draft = b->spec_min_draft;
	if (b->spec_max_draft)
		c.max_draft = b->spec_max_draft;
	if (b->spec_ngram_min)
		c.ngram_min = b->spec_ngram_min;
	if (b->spec_ngram_max)
		c.ngram_max = b->spec_ngram_max;
	c.layers = b->spec_layers;
	if (b->spec_draft_model[0]) {
		struct loom_model_params mp = {
			.backend = b->backend, .n_threads = b->n_threads,
			.backend_flags = LOOM_BACKEND_BATCH_INVARIANT,
		};

		/* as many tokens as the target's cache (start_sched), 16 per block */
		int64_t blocks = ((int64_t)srv->n_ctx + 15) / 16 * srv->o.serve.parallel;

		if (srv->o.serve.kv_mem)
			blocks = loom_sched_plan_blocks(srv->m, 16, srv->o.serve.kv_mem);
		srv->draft_pool = loom_spec_draft_pool_open(b->spec_draft_model, srv->tok, &mp,
							    srv->n_ctx, blocks, err, errlen);
		if (!srv->draft_pool)
			return -1;
		fprintf(stderr, "loom serve: draft model %s, a cache of %lld tokens\n",
			b->spec_draft_model, (long long)blocks * 16);
	}
	snprintf(list, sizeof(list), "%s", b->spec);
	for (name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
		if (!name[0] || !strcmp(name, "none"))
			continue;
		if (load_one_spec(srv, name, &c, err, errlen))
			return -1;
	}
	if (!def[0] || !strcmp(def, "none"))
		return 0;
	srv->spec_default = server_find_spec(srv, def);
	if (!srv->spec_default) {
		loom_seterr(err, errlen, "--spec-default %s: not among the strategies of --spec", def);
		return -1;
	}
	return 0;
}

/* ---- what request parsing sees (serve_request.h) ---- */

static int64_t req_tokenize(void *user, const char *text, size_t len, bool add_special,
			    int32_t *ids, int64_t cap)
{
	const struct server *srv = user;

	return loom_tokenize(srv->tok, text, len, add_special, true, ids, cap);
}

static char *req_render(void *user, const struct serve_msg *msgs, size_t n, char *why,
			size_t whylen)
{
	const struct server *srv = user;
	struct loom_chat_msg *cm = calloc(n ? n : 1, sizeof(*cm));
	char *text;
	size_t i;

	if (!cm) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	for (i = 0; i < n; i++)
		cm[i] = (struct loom_chat_msg){ .role = msgs[i].role, .content = msgs[i].content };
	text = loom_chat_render(&srv->chat, cm, n, true, why, whylen);
	free(cm);
	return text;
}

static void req_ctx_init(struct server *srv)
{
	int i;

	for (i = 0; i < srv->n_spec; i++)
		srv->spec_names[i] = loom_spec_kind_name(srv->spec[i]);
	srv->req_ctx = (struct serve_req_ctx){
		.n_vocab = loom_tokenizer_n_vocab(srv->tok),
		.n_ctx = srv->n_ctx,
		.max_n = SRV_MAX_N,
		.max_stop = SRV_MAX_STOP,
		.tokenize = req_tokenize,
		.render = srv->chat_ok ? req_render : NULL,
		.chat_err = srv->chat_err,
		/* a rendered chat is tokenized without BOS; add it where plain
		 * text would get one */
		.chat_bos = srv->add_bos ? loom_tokenizer_bos(srv->tok) : -1,
		.user = srv,
		.spec_names = srv->spec_names,
		.n_spec = srv->n_spec,
		.spec_default = srv->spec_default ? loom_spec_kind_name(srv->spec_default) : NULL,
	};
}

static int start_sched(struct server *srv, char *err, size_t errlen)
{
	const struct loom_hparams *hp = &srv->m->hp;
	struct loom_sched_config c;
	int64_t per_seq = (srv->n_ctx + srv->o.serve.block_size - 1) / srv->o.serve.block_size;
	uint64_t bytes = srv->o.serve.kv_mem;

	if (!bytes)
		bytes = loom_kv_bytes(hp->n_layer, hp->n_head_kv * hp->head_dim, srv->o.serve.block_size,
				      per_seq * srv->o.serve.parallel);
	loom_sched_config_defaults(&c);
	c.block_size = srv->o.serve.block_size;
	c.n_blocks = loom_sched_plan_blocks(srv->m, srv->o.serve.block_size, bytes);
	c.max_batch_tokens = srv->o.serve.max_batch_tokens;
	c.max_seqs = srv->o.serve.parallel;
	c.max_waiting = srv->o.serve.max_waiting;
	c.max_ctx = srv->n_ctx;
	c.prefix_cache = srv->o.serve.prefix_cache;
	c.tokenizer = srv->tok;
	c.spec_step_rows = srv->o.serve.spec_step_rows;
	c.spec_rows = 0;
	for (int i = 0; i < srv->n_spec; i++) {
		int64_t rows = (int64_t)c.max_seqs * loom_spec_kind_max_draft(srv->spec[i]);

		if (rows > c.spec_rows)
			c.spec_rows = rows > c.max_batch_tokens ? c.max_batch_tokens : (int32_t)rows;
	}
	if (c.n_blocks <= 0) {
		loom_seterr(err, errlen, "--kv-mem %llu bytes holds not even one KV block",
			    (unsigned long long)bytes);
		return -1;
	}
	fprintf(stderr, "loom serve: KV cache: %lld blocks x %d tokens = %lld tokens, %.1f MiB "
		"(%lld bytes); context %d per sequence, %d sequences at most, prefix cache %s\n",
		(long long)c.n_blocks, c.block_size, (long long)c.n_blocks * c.block_size,
		(double)loom_kv_bytes(hp->n_layer, hp->n_head_kv * hp->head_dim, c.block_size,
				      c.n_blocks) / 1048576.0,
		(long long)loom_kv_bytes(hp->n_layer, hp->n_head_kv * hp->head_dim, c.block_size,
					 c.n_blocks),
		srv->n_ctx, c.max_seqs, c.prefix_cache ? "on" : "off");
	srv->sched = loom_sched_new(srv->m, &c, err, errlen);
	return srv->sched ? 0 : -1;
}

static void *engine_main(void *arg)
{
	struct server *srv = arg;

	loom_sched_run(srv->sched);
	return NULL;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s ? s + 1 : path;
}

static int server_init(struct server *srv)
{
	srv->created = (int64_t)time(NULL);
	atomic_init(&srv->state, SRV_LOADING);
	atomic_init(&srv->hard_stop, false);
	metrics_init(&srv->metrics);
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->idle, NULL);
	snprintf(srv->model_name, sizeof(srv->model_name), "%s", base_name(srv->o.model));
	return 0;
}

/* ---- shutdown ---- */

/* Waits until no scheduler request is outstanding or `seconds` pass. */
static bool wait_idle(struct server *srv, double seconds)
{
	struct timespec ts;
	bool idle;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)seconds;
	ts.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&srv->lock);
	while (srv->n_gens_active > 0)
		if (pthread_cond_timedwait(&srv->idle, &srv->lock, &ts))
			break;
	idle = srv->n_gens_active == 0;
	pthread_mutex_unlock(&srv->lock);
	return idle;
}

static void drain(struct server *srv)
{
	atomic_store(&srv->state, SRV_DRAINING);
	fprintf(stderr, "loom serve: draining (up to %d s)\n", srv->o.serve.shutdown_timeout);
	if (!wait_idle(srv, srv->o.serve.shutdown_timeout)) {
		fprintf(stderr, "loom serve: cancelling the requests still running\n");
		server_cancel_all(srv);
		if (!wait_idle(srv, 5.0))
			atomic_store(&srv->hard_stop, true);
	}
	/* let the last responses reach their clients before MHD closes them */
	{
		struct timespec ts = { 0, 200 * 1000000L };

		nanosleep(&ts, NULL);
	}
}

static int wait_signal(const sigset_t *set)
{
	int sig = 0;

	while (sigwait(set, &sig))
		;
	return sig;
}

int loom_serve_main(int argc, char **argv, char *err, size_t errlen)
{
	struct server *srv = calloc(1, sizeof(*srv));
	struct MHD_Daemon *d = NULL;
	pthread_t engine;
	bool engine_started = false;
	sigset_t set;
	int rc = -1;

	if (!srv) {
		loom_seterr(err, errlen, "out of memory");
		return -1;
	}
	loom_options_defaults(&srv->o);
	if (parse_args(argc, argv, &srv->o, err, errlen))
		goto out;
	server_init(srv);
	/* signals go to sigwait below, never to a worker thread */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	d = http_start(srv, err, errlen);
	if (!d || load_model(srv, err, errlen) || load_specs(srv, err, errlen) ||
	    start_sched(srv, err, errlen))
		goto out;
	req_ctx_init(srv);
	if (pthread_create(&engine, NULL, engine_main, srv)) {
		loom_seterr(err, errlen, "cannot start the engine thread");
		goto out;
	}
	engine_started = true;
	atomic_store(&srv->state, SRV_READY);
	fprintf(stderr, "loom serve: %s on %s, listening on http://%s:%d\n", srv->model_name,
		srv->m->be->ops->name, srv->o.serve.host, srv->o.serve.port);
	fprintf(stderr, "loom serve: signal %d, shutting down\n", wait_signal(&set));
	drain(srv);
	rc = 0;
out:
	if (d)
		MHD_stop_daemon(d);
	if (engine_started) {
		loom_sched_stop(srv->sched);
		pthread_join(engine, NULL);
	}
	loom_sched_free(srv->sched);
	for (int i = 0; i < srv->n_spec; i++)
		loom_spec_kind_free(srv->spec[i]);
	loom_spec_draft_pool_free(srv->draft_pool);
	loom_model_free(srv->m);
	loom_tokenizer_free(srv->tok);
	if (srv->f)
		gguf_close(srv->f);
	free(srv);
	if (rc == 0)
		fprintf(stderr, "loom serve: stopped\n");
	return rc;
}
