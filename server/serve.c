/* `loom serve`: options, start-up, the engine thread and shutdown. */
#include "serve.h"
#include "serve_int.h"
#include "serve_tools.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>


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
		srv_seterr(err, errlen, "no model given (--model FILE)");
		return -1;
	}
	return 0;
}

/* ---- start-up ---- */

/* The engine the options ask for: batch-invariant (a request's tokens do
 * not depend on what shares its steps), many sequences, a paged KV cache
 * of --kv-mem bytes (default loom_kv_default_bytes(): 1/8 of the memory
 * available, 256 MiB to 4 GiB) in --kv-type (default f16; f32 --exact). */
static void engine_params(const struct loom_options *o, struct loom_engine_params *p)
{
	loom_options_engine_params(o, p);
	p->n_ctx = o->ctx_given ? o->n_ctx : 0;
	p->n_batch = o->serve.max_batch_tokens;
	p->spec_default = o->serve.spec_default[0] ? o->serve.spec_default : "none";
	p->n_parallel = o->serve.parallel;
	p->kv_bytes = (int64_t)(o->serve.kv_mem ? o->serve.kv_mem : loom_kv_default_bytes());
	p->block_size = o->serve.block_size;
	p->max_waiting = o->serve.max_waiting;
	p->prefix_cache = o->serve.prefix_cache ? 1 : -1;
	p->batch_invariant = true;
	p->spec_step_rows = o->serve.spec_step_rows;
}

/* What start-up tells the operator: the chat template, the strategies, the
 * KV memory plan. */
static void print_plan(struct server *srv)
{
	struct loom_strategy_info si;
	struct loom_engine_stats st;

	fprintf(stderr, "loom serve: chat template: %s%s%s\n",
		srv->chat_ok ? loom_chat_family_name(srv->chat.family) : srv->chat_err,
		srv->o.chat_template[0] ? " (--chat-template)" :
		srv->chat_given ? "" : " (the model has none: its architecture's, else chatml)",
		srv->has_chat_tools ? ", and its tool_use variant for requests with tools" : "");
	for (int i = 0; loom_engine_strategy(srv->engine, i, &si); i++)
		fprintf(stderr, "loom serve: speculative strategy %s (%s), up to %d drafts\n",
			si.name, si.path, si.max_draft);
	loom_engine_get_stats(srv->engine, &st);
	fprintf(stderr, "loom serve: weights: %.1f MiB as in the file", (double)st.weights_bytes / 1048576.0);
	if (st.packed_tensors)
		fprintf(stderr, ", %.1f MiB in %d tensors in the backend's own layout",
			(double)st.packed_bytes / 1048576.0, st.packed_tensors);
	fprintf(stderr, "\n");
	fprintf(stderr, "loom serve: KV cache: %s, %llu bytes/token, %lld blocks x %d tokens = %lld tokens, %.1f MiB (%llu bytes); context %d per sequence, %d sequences at most, prefix cache %s\n",
		loom_kv_type_name(st.kv_type), (unsigned long long)st.kv_token_bytes,
		(long long)st.blocks_total, st.block_size,
		(long long)st.blocks_total * st.block_size, (double)st.kv_bytes / 1048576.0,
		(unsigned long long)st.kv_bytes, st.n_ctx, st.n_parallel,
		st.prefix_cache ? "on" : "off");
	if (st.local_window > 0)
		fprintf(stderr, "loom serve: KV cache: %d sliding-window layers (window %d) in a pool of their own: %lld blocks; a sequence at context %d holds %lld blocks of the full-context layers and at most %lld of the windowed ones\n",
			st.local_layers, st.local_window, (long long)st.local_blocks_total,
			st.n_ctx, (long long)st.seq_blocks, (long long)st.seq_local_blocks);
}

static int open_engine(struct server *srv, char *err, size_t errlen)
{
	struct loom_engine_params p;
	struct loom_strategy_info si;
	int32_t ids[4];

	engine_params(&srv->o, &p);
	srv->engine = loom_engine_open(&p, err, errlen);
	if (!srv->engine)
		return -1;
	if (loom_engine_is_follower(srv->engine))
		return 0; /* a rank that only executes rank 0's steps */
	srv->tok = loom_engine_tokenizer(srv->engine);
	srv->n_ctx = loom_engine_n_ctx(srv->engine);
	srv->add_bos = loom_tokenize(srv->tok, "", 0, true, false, ids, 4) >= 1 &&
		       ids[0] == loom_tokenizer_bos(srv->tok);
	if (srv->o.chat_template[0]) { /* --chat-template FILE: refused at start-up if bad */
		if (loom_engine_chat_template_file(srv->engine, srv->o.chat_template, &srv->chat, err,
						   errlen))
			return -1;
		srv->chat_ok = srv->chat_given = true;
	} else {
		srv->chat_ok = !loom_engine_chat_template(srv->engine, &srv->chat, &srv->chat_given,
							  srv->chat_err, sizeof(srv->chat_err));
		if (srv->chat_ok && !srv->chat_given)
			fprintf(stderr, "loom serve: warning: the model has no chat template; using the built-in %s format (--chat-template FILE to give one)\n",
				loom_chat_family_name(srv->chat.family));
	}
	if (!srv->o.chat_template[0] && srv->chat_ok) { /* --chat-template replaces both */
		int rc = loom_engine_chat_template_named(srv->engine, "tool_use", &srv->chat_tools,
							 err, errlen);

		if (rc < 0)
			return -1;
		srv->has_chat_tools = rc == 0;
	}
	for (srv->n_spec = 0; srv->n_spec < SRV_MAX_SPEC &&
	     loom_engine_strategy(srv->engine, srv->n_spec, &si); srv->n_spec++)
		srv->spec_names[srv->n_spec] = si.name;
	if (strcmp(loom_engine_spec_name(srv->engine), "none"))
		srv->spec_default = loom_engine_spec_name(srv->engine);
	print_plan(srv);
	return 0;
}

/* ---- what request parsing sees (serve_request.h) ---- */

static int64_t req_tokenize(void *user, const char *text, size_t len, bool add_special,
			    int32_t *ids, int64_t cap)
{
	const struct server *srv = user;

	/* a prompt past the context is refused; counting stops there */
	return loom_tokenize_max(srv->tok, text, len, NULL, add_special, true, ids, cap,
				 srv->n_ctx);
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

/* The chat's ids: message content tokenized as text, only the template's
 * markup parsed for special tokens. */
static int32_t *req_render_ids(void *user, const struct serve_msg *msgs, size_t n,
			       int64_t *n_ids, char *why, size_t whylen)
{
	const struct server *srv = user;
	struct loom_chat_msg *cm = calloc(n ? n : 1, sizeof(*cm));
	int32_t *ids = NULL;
	size_t i;

	if (!cm) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	for (i = 0; i < n; i++)
		cm[i] = (struct loom_chat_msg){ .role = msgs[i].role, .content = msgs[i].content };
	*n_ids = loom_chat_tokenize_max(srv->tok, &srv->chat, cm, n, true, srv->n_ctx, &ids, why,
					whylen);
	free(cm);
	return ids;
}

/* The template for chats with tools or tool calls. */
static const struct loom_chat_template *tools_template(const struct server *srv)
{
	return srv->has_chat_tools ? &srv->chat_tools : &srv->chat;
}

/* A chat with tools or tool calls: the template gets them as they are. */
static int32_t *req_render_json(void *user, const char *messages_json, const char *tools_json,
				int64_t *n_ids, char *why, size_t whylen)
{
	const struct server *srv = user;
	int32_t *ids = NULL;

	*n_ids = loom_chat_tokenize_json(srv->tok, tools_template(srv), messages_json,
					 strlen(messages_json), tools_json,
					 tools_json ? strlen(tools_json) : 0, true, srv->n_ctx, &ids,
					 why, whylen);
	return ids;
}

static void req_ctx_init(struct server *srv)
{
	const struct loom_chat_template *tt = tools_template(srv);
	bool renders = false;
	int format = serve_tool_format_of(tt->family == LOOM_CHAT_JINJA ? tt->source : NULL,
					  &renders);

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
		.spec_default = srv->spec_default,
		.render_ids = srv->chat_ok ? req_render_ids : NULL,
		.model_names = srv->model_names,
		.n_model_names = srv->n_model_names,
		.render_json = srv->chat_ok && tt->family == LOOM_CHAT_JINJA ? req_render_json : NULL,
		.template_tools = srv->chat_ok && renders,
		.tool_format = format,
	};
	fprintf(stderr, "loom serve: tool calls: %s format, tools presented %s\n",
		serve_tool_format_name(format), srv->req_ctx.template_tools ?
		"by the chat template" : "in a system message of loom's");
}

/* What /api/tags and /api/show say of the model. */
static void ollama_init(struct server *srv)
{
	const char *meta;
	json_t *o;

	srv->metadata_json = loom_engine_metadata_json(srv->engine);
	meta = srv->metadata_json ? srv->metadata_json : "{}";
	o = json_loads(meta, 0, NULL);
	srv->ollama = (struct ollama_model){
		.names = srv->model_names,
		.n_names = srv->n_model_names,
		.path = srv->o.model,
		.metadata_json = meta,
		.quant = json_is_integer(json_object_get(o, "general.file_type")) ?
			 loom_file_type_name((uint32_t)json_integer_value(
				 json_object_get(o, "general.file_type"))) : NULL,
		.template_src = srv->chat_ok && srv->chat.family == LOOM_CHAT_JINJA ?
				srv->chat.source : NULL,
		.n_ctx = srv->n_ctx,
	};
	json_decref(o);
}

static void *engine_main(void *arg)
{
	struct server *srv = arg;

	loom_engine_run(srv->engine);
	return NULL;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s ? s + 1 : path;
}

/* The API key (--api-key, else $LOOM_API_KEY) and the model names. */
static int server_access(struct server *srv)
{
	const char *env = getenv("LOOM_API_KEY");
	char *save = NULL, *name;

	if (srv->o.serve.api_key[0])
		snprintf(srv->api_key, sizeof(srv->api_key), "%s", srv->o.serve.api_key);
	else if (env && strlen(env) < sizeof(srv->api_key))
		snprintf(srv->api_key, sizeof(srv->api_key), "%s", env);
	srv->model_names[srv->n_model_names++] = srv->model_name;
	snprintf(srv->alias_buf, sizeof(srv->alias_buf), "%s", srv->o.serve.aliases);
	for (name = strtok_r(srv->alias_buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
		if (srv->n_model_names == SRV_MAX_NAMES)
			return -1;
		srv->model_names[srv->n_model_names++] = name;
	}
	return 0;
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
	return server_access(srv);
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

/* Each connection holds a descriptor: raise the soft open-file limit to
 * what --max-conns needs (plus room for models, plugins and logs), as far
 * as the hard limit allows, and say so when it caps the connections. */
static void fit_fd_limit(const struct loom_serve_options *so)
{
	rlim_t want = (rlim_t)so->max_conns + 128;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur < want)
		fprintf(stderr, "loom serve: the open-file limit (%llu) allows fewer connections than --max-conns %d\n",
			(unsigned long long)rl.rlim_cur, so->max_conns);
}

/* Who may call, and from which pages (docs/SERVING.md); never the key. */
static void print_access(const struct server *srv)
{
	fprintf(stderr, "loom serve: API key %s; CORS %s%s; model names:",
		srv->api_key[0] ? "required (all but /health, /ready and the chat page)" : "not required",
		srv->o.serve.cors_origin[0] ? "allows " : "off",
		srv->o.serve.cors_origin);
	for (int i = 0; i < srv->n_model_names; i++)
		fprintf(stderr, " %s", srv->model_names[i]);
	fprintf(stderr, "\n");
}

/* $LOOM_SERVE_LOAD_DELAY_MS (for tests: tests/serve/test_serve_edges.py)
 * stretches the model load, so that requests arriving during it can be
 * seen to wait or to get their 503. */
static void test_load_delay(void)
{
	const char *v = getenv("LOOM_SERVE_LOAD_DELAY_MS");
	long ms = v ? strtol(v, NULL, 10) : 0;

	if (ms > 0 && ms <= 600000) {
		struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

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
		srv_seterr(err, errlen, "out of memory");
		return -1;
	}
	loom_options_defaults(&srv->o);
	if (parse_args(argc, argv, &srv->o, err, errlen))
		goto out;
	if (server_init(srv)) {
		srv_seterr(err, errlen, "--alias: at most 31 names");
		goto out;
	}
	if (getenv("LOOM_API_KEY") && strlen(getenv("LOOM_API_KEY")) >= sizeof(srv->api_key)) {
		srv_seterr(err, errlen, "LOOM_API_KEY: longer than 255 bytes");
		goto out;
	}
	/* signals go to sigwait below, never to a worker thread */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	fit_fd_limit(&srv->o.serve);
	/* a distributed job: only rank 0 serves HTTP, known once the engine
	 * has joined the job, so the engine opens first */
	if ((srv->o.tp > 1 || srv->o.pp > 1) && open_engine(srv, err, errlen))
		goto out;
	if (srv->engine && loom_engine_is_follower(srv->engine)) {
		rc = loom_engine_follow(srv->engine, err, errlen) ? -1 : 0;
		goto out_follower;
	}
	d = http_start(srv, err, errlen);
	if (!d)
		goto out;
	test_load_delay();
	if (!srv->engine && open_engine(srv, err, errlen))
		goto out;
	req_ctx_init(srv);
	ollama_init(srv);
	if (pthread_create(&engine, NULL, engine_main, srv)) {
		srv_seterr(err, errlen, "cannot start the engine thread");
		goto out;
	}
	engine_started = true;
	atomic_store(&srv->state, SRV_READY);
	fprintf(stderr, "loom serve: %s on %s, listening on http://%s:%d\n", srv->model_name,
		loom_engine_backend_name(srv->engine), srv->o.serve.host, srv->o.serve.port);
	print_access(srv);
	fprintf(stderr, "loom serve: signal %d, shutting down\n", wait_signal(&set));
	drain(srv);
	rc = 0;
out:
	if (d)
		http_stop(srv, d);
	if (engine_started) {
		loom_engine_stop(srv->engine);
		pthread_join(engine, NULL);
	}
	loom_chat_template_free(&srv->chat);
	loom_chat_template_free(&srv->chat_tools);
	loom_engine_close(srv->engine);
	free(srv->metadata_json);
	free(srv);
	if (rc == 0)
		fprintf(stderr, "loom serve: stopped\n");
	return rc;
out_follower:
	loom_chat_template_free(&srv->chat);
	loom_chat_template_free(&srv->chat_tools);
	loom_engine_close(srv->engine);
	free(srv);
	return rc;
}
