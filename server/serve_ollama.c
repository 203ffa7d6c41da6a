/* `loom serve`: Ollama request bodies into OpenAI ones, and Ollama's
 * answer shapes (serve_ollama.h). */
#include "serve_ollama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- requests ---- */

/* Ollama's options that become the OpenAI field of the same meaning. */
static const struct {
	const char *ollama, *openai;
} option_map[] = {
	{ "temperature", "temperature" },  { "top_k", "top_k" },
	{ "top_p", "top_p" },              { "min_p", "min_p" },
	{ "seed", "seed" },                { "stop", "stop" },
	{ "repeat_penalty", "repetition_penalty" },
	{ "presence_penalty", "presence_penalty" },
	{ "frequency_penalty", "frequency_penalty" },
};

/* Options loom refuses, and why. */
static const struct {
	const char *name, *why;
} option_refused[] = {
	{ "num_keep", "loom never cuts a prompt to fit; one too long is refused" },
	{ "typical_p", "loom's sampler has no typical sampling" },
	{ "tfs_z", "loom's sampler has no tail-free sampling" },
	{ "mirostat", "loom's sampler has no mirostat" },
	{ "mirostat_tau", "loom's sampler has no mirostat" },
	{ "mirostat_eta", "loom's sampler has no mirostat" },
	{ "repeat_last_n", "loom's penalties cover the whole sequence" },
	{ "penalize_newline", "loom's penalties treat every token alike" },
};

/* Load-time settings: loom serve takes them on its command line. */
static const char *const option_load_time[] = {
	"numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "vocab_only", "use_mmap",
	"use_mlock", "num_thread", "f16_kv", "logits_all", "embedding_only", NULL,
};

static int option_one(json_t *oa, const char *k, json_t *v, int32_t *n_ctx, struct perr *e)
{
	size_t i;

	for (i = 0; i < sizeof(option_map) / sizeof(option_map[0]); i++)
		if (!strcmp(k, option_map[i].ollama))
			return json_object_set(oa, option_map[i].openai, v) ?
			       perr_set(e, 500, NULL, NULL, "out of memory") : 0;
	if (!strcmp(k, "num_predict")) {
		/* -1: until the end; -2: until the context is full (loom stops
		 * at the end of sequence or the context, whichever comes first) */
		if (!json_is_integer(v) || (json_integer_value(v) < 1 &&
					    json_integer_value(v) != -1 && json_integer_value(v) != -2))
			return perr_set(e, 400, "options.num_predict", "invalid_value",
					"options.num_predict must be a positive integer, -1 or -2");
		if (json_integer_value(v) > 0)
			json_object_set(oa, "max_tokens", v);
		return 0;
	}
	if (!strcmp(k, "num_ctx")) {
		if (!json_is_integer(v) || json_integer_value(v) < 1)
			return perr_set(e, 400, "options.num_ctx", "invalid_value",
					"options.num_ctx must be a positive integer");
		if (json_integer_value(v) > *n_ctx)
			return perr_set(e, 400, "options.num_ctx", "invalid_value",
					"options.num_ctx %lld is more than this server's context (%d tokens; loom serve -c sets it)",
					(long long)json_integer_value(v), *n_ctx);
		*n_ctx = (int32_t)json_integer_value(v);
		return 0;
	}
	for (i = 0; i < sizeof(option_refused) / sizeof(option_refused[0]); i++)
		if (!strcmp(k, option_refused[i].name))
			return perr_set(e, 400, "options", "unsupported",
					"options.%s is not supported: %s", k, option_refused[i].why);
	for (i = 0; option_load_time[i]; i++)
		if (!strcmp(k, option_load_time[i]))
			return perr_set(e, 400, "options", "unsupported",
					"options.%s is not supported per request: it is a load-time setting, given to loom serve on its command line",
					k);
	return perr_set(e, 400, "options", "unsupported", "options.%.64s is not an option loom knows", k);
}

static int options(json_t *o, json_t *oa, int32_t *n_ctx, struct perr *e)
{
	json_t *opts = req_member(o, "options"), *v;
	const char *k;

	if (!opts)
		return 0;
	if (!json_is_object(opts))
		return perr_set(e, 400, "options", "invalid_type", "'options' must be an object");
	json_object_foreach(opts, k, v)
		if (!json_is_null(v) && option_one(oa, k, v, n_ctx, e))
			return -1;
	return 0;
}

/* format: "json", or a JSON schema (an object). */
static int format(json_t *o, json_t *oa, struct perr *e)
{
	json_t *f = req_member(o, "format"), *rf;

	if (!f || (json_is_string(f) && !json_string_length(f)))
		return 0;
	if (json_is_string(f) && !strcmp(json_string_value(f), "json"))
		rf = json_pack("{s:s}", "type", "json_object");
	else if (json_is_object(f))
		rf = json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema", "name",
			       "format", "schema", f);
	else
		return perr_set(e, 400, "format", "invalid_value",
				"'format' must be \"json\" or a JSON schema object");
	return json_object_set_new(oa, "response_format", rf) ?
	       perr_set(e, 500, NULL, NULL, "out of memory") : 0;
}

/* An Ollama tool call ({"function": {"name", "arguments": {...}}}) as
 * OpenAI's (arguments as JSON text). */
static json_t *tool_call_openai(json_t *c, size_t i, size_t k, struct perr *e)
{
	json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");
	const char *name = json_string_value(json_object_get(fn, "name"));
	char id[32], *a;
	json_t *out;

	if (!name) {
		perr_set(e, 400, "messages", "invalid_value",
			 "messages[%zu].tool_calls[%zu].function.name must be a string", i, k);
		return NULL;
	}
	a = args ? json_dumps(args, JSON_ENCODE_ANY | JSON_COMPACT) : strdup("{}");
	snprintf(id, sizeof(id), "call_%zu_%zu", i, k);
	out = a ? json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function",
			    "name", name, "arguments", a) : NULL;
	free(a);
	if (!out)
		perr_set(e, 500, NULL, NULL, "out of memory");
	return out;
}

/* One Ollama message as OpenAI's: role, content, tool_calls, and a tool
 * result's tool_name as name. */
static json_t *message_openai(json_t *m, size_t i, struct perr *e)
{
	json_t *out, *calls = req_member(m, "tool_calls"), *c, *imgs = req_member(m, "images");
	json_t *think = req_member(m, "thinking");
	size_t k;

	if (!json_is_object(m)) {
		perr_set(e, 400, "messages", "invalid_type", "messages[%zu] must be an object", i);
		return NULL;
	}
	if (imgs && (!json_is_array(imgs) || json_array_size(imgs))) {
		perr_set(e, 400, "messages", "unsupported",
			 "messages[%zu].images: loom serves text models only", i);
		return NULL;
	}
	if (think && (!json_is_string(think) || json_string_length(think))) {
		perr_set(e, 400, "messages", "unsupported",
			 "messages[%zu].thinking is not supported", i);
		return NULL;
	}
	out = json_pack("{s:O,s:O}", "role", json_object_get(m, "role") ? json_object_get(m, "role") : json_null(),
			"content", json_object_get(m, "content") ? json_object_get(m, "content") : json_null());
	if (!out) {
		perr_set(e, 500, NULL, NULL, "out of memory");
		return NULL;
	}
	if (req_member(m, "tool_name"))
		json_object_set(out, "name", req_member(m, "tool_name"));
	if (calls && !json_is_array(calls)) {
		json_decref(out);
		perr_set(e, 400, "messages", "invalid_type",
			 "messages[%zu].tool_calls must be an array", i);
		return NULL;
	}
	if (calls) {
		json_t *list = json_array();

		json_object_set_new(out, "tool_calls", list);
		json_array_foreach(calls, k, c) {
			json_t *one = tool_call_openai(c, i, k, e);

			if (!one) {
				json_decref(out);
				return NULL;
			}
			json_array_append_new(list, one);
		}
	}
	return out;
}

/* messages; *load when there are none. */
static int chat_messages(json_t *o, json_t *oa, bool *load, struct perr *e)
{
	json_t *v = req_member(o, "messages"), *list, *m;
	size_t i;

	if (v && !json_is_array(v))
		return perr_set(e, 400, "messages", "invalid_type", "'messages' must be an array");
	*load = !v || json_array_size(v) == 0;
	if (*load)
		return 0;
	list = json_array();
	if (!list || json_object_set_new(oa, "messages", list))
		return perr_set(e, 500, NULL, NULL, "out of memory");
	json_array_foreach(v, i, m) {
		json_t *one = message_openai(m, i, e);

		if (!one)
			return -1;
		json_array_append_new(list, one);
	}
	return 0;
}

/* prompt, system and raw: a chat of the system message and the prompt,
 * or with raw the prompt as it is (a completion); *load for no prompt. */
static int generate_prompt(json_t *o, json_t *oa, bool *chat, bool *load, struct perr *e)
{
	json_t *p = req_member(o, "prompt"), *sys = req_member(o, "system"), *list;
	bool raw = false;

	if (req_get_bool(o, "raw", &raw, e))
		return -1;
	if (p && !json_is_string(p))
		return perr_set(e, 400, "prompt", "invalid_type", "'prompt' must be a string");
	if (sys && !json_is_string(sys))
		return perr_set(e, 400, "system", "invalid_type", "'system' must be a string");
	*load = !p || !json_string_length(p);
	*chat = !raw;
	if (*load)
		return 0;
	if (raw) {
		if (sys)
			return perr_set(e, 400, "system", "unsupported",
					"'system' goes through the chat template, which 'raw' skips");
		return json_object_set(oa, "prompt", p) ? perr_set(e, 500, NULL, NULL, "out of memory") : 0;
	}
	list = sys && json_string_length(sys) ?
	       json_pack("[{s:s,s:O},{s:s,s:O}]", "role", "system", "content", sys, "role", "user",
			 "content", p) :
	       json_pack("[{s:s,s:O}]", "role", "user", "content", p);
	return !list || json_object_set_new(oa, "messages", list) ?
	       perr_set(e, 500, NULL, NULL, "out of memory") : 0;
}

/* Top-level fields loom refuses, and why; any other unknown field is
 * refused too, so that nothing is silently ignored. */
static const struct {
	const char *name, *why;
} field_refused[] = {
	{ "images", "loom serves text models only" },
	{ "suffix", "fill-in-the-middle is not supported" },
	{ "template", "loom renders the model's own template (loom serve --chat-template FILE replaces it)" },
	{ "context", "loom keeps no conversation state: send the messages to /api/chat" },
	{ "logprobs", "use /v1/chat/completions for log-probabilities" },
	{ "top_logprobs", "use /v1/chat/completions for log-probabilities" },
};

static int check_fields(json_t *o, bool chat, struct perr *e)
{
	static const char *const common[] = { "model", "stream", "format", "options", "keep_alive",
					      "think", NULL };
	static const char *const for_chat[] = { "messages", "tools", NULL };
	static const char *const for_gen[] = { "prompt", "system", "raw", NULL };
	const char *k;
	json_t *v;
	size_t i;

	json_object_foreach(o, k, v) {
		bool known = false;

		for (i = 0; common[i] && !known; i++)
			known = !strcmp(k, common[i]);
		for (i = 0; (chat ? for_chat : for_gen)[i] && !known; i++)
			known = !strcmp(k, (chat ? for_chat : for_gen)[i]);
		if (known || json_is_null(v))
			continue;
		for (i = 0; i < sizeof(field_refused) / sizeof(field_refused[0]); i++)
			if (!strcmp(k, field_refused[i].name))
				break;
		if (i == sizeof(field_refused) / sizeof(field_refused[0]))
			return perr_set(e, 400, k, "unsupported", "'%.64s' is not a field of %s loom knows",
					k, chat ? "/api/chat" : "/api/generate");
		if ((json_is_array(v) && !json_array_size(v)) ||
		    (json_is_string(v) && !json_string_length(v)))
			continue; /* empty: asks for nothing */
		return perr_set(e, 400, k, "unsupported", "'%s' is not supported: %s", k,
				field_refused[i].why);
	}
	return 0;
}

/* model (a name the server answers to, ":latest" allowed), stream (true
 * unless false), think (only false), keep_alive (the model stays loaded
 * while the server runs: accepted, nothing to do). */
static int common_fields(json_t *o, json_t *oa, struct perr *e)
{
	json_t *m = req_member(o, "model"), *think = req_member(o, "think");
	bool stream = true;

	if (m && !json_is_string(m))
		return perr_set(e, 400, "model", "invalid_type", "'model' must be a string");
	if (m) {
		const char *s = json_string_value(m);
		size_t n = json_string_length(m);

		if (n > 7 && !strcmp(s + n - 7, ":latest"))
			n -= 7;
		json_object_set_new(oa, "model", json_stringn(s, n));
	}
	if (think && !json_is_false(think))
		return perr_set(e, 400, "think", "unsupported",
				"'think' is not supported: loom does not separate a model's thinking from its answer");
	if (req_get_bool(o, "stream", &stream, e))
		return -1;
	json_object_set_new(oa, "stream", json_boolean(stream));
	return 0;
}

/* The OpenAI body o means; *chat_out: a chat (else a completion). */
static int translate(json_t *o, bool chat, json_t *oa, bool *chat_out, bool *load,
		     int32_t *n_ctx, struct perr *e)
{
	if (!json_is_object(o))
		return perr_set(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
	if (check_fields(o, chat, e) || common_fields(o, oa, e) || options(o, oa, n_ctx, e) ||
	    format(o, oa, e))
		return -1;
	*chat_out = chat;
	if (chat && req_member(o, "tools") && json_object_set(oa, "tools", req_member(o, "tools")))
		return perr_set(e, 500, NULL, NULL, "out of memory");
	return chat ? chat_messages(o, oa, load, e) : generate_prompt(o, oa, chat_out, load, e);
}

int ollama_parse(const struct serve_req_ctx *ctx, const char *body, size_t len, bool chat,
		 struct serve_req *r, struct perr *e)
{
	struct serve_req_ctx c = *ctx;
	json_error_t jerr;
	json_t *o, *oa = json_object();
	bool as_chat = chat, load = false;
	int rc;

	memset(r, 0, sizeof(*r));
	o = json_loadb(body, len, 0, &jerr);
	if (!o || !oa) {
		json_decref(oa);
		json_decref(o);
		return perr_set(e, 400, NULL, "invalid_json", "invalid JSON at line %d column %d: %s",
				jerr.line, jerr.column, jerr.text);
	}
	rc = translate(o, chat, oa, &as_chat, &load, &c.n_ctx, e);
	if (!rc && load)
		rc = 1;
	if (!rc)
		rc = serve_req_parse_obj(&c, oa, as_chat, true, r, e);
	if (!rc)
		r->api = chat ? SERVE_API_OLLAMA_CHAT : SERVE_API_OLLAMA_GENERATE;
	json_decref(oa);
	json_decref(o);
	return rc;
}

/* ---- answers ---- */

void ollama_time(char *out, size_t cap)
{
	struct timespec ts;
	struct tm tm;
	char day[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, cap, "%s.%09ldZ", day, (long)ts.tv_nsec);
}

static json_t *head(const char *model)
{
	char t[64];

	ollama_time(t, sizeof(t));
	return json_pack("{s:s,s:s}", "model", model, "created_at", t);
}

json_t *ollama_load_reply(const char *model, bool chat)
{
	json_t *o = head(model);

	if (o && chat)
		json_object_set_new(o, "message", json_pack("{s:s,s:s}", "role", "assistant",
							    "content", ""));
	else if (o)
		json_object_set_new(o, "response", json_string(""));
	if (o) {
		json_object_set_new(o, "done", json_true());
		json_object_set_new(o, "done_reason", json_string("load"));
	}
	return o;
}

/* Ollama's tool calls: {"function": {"name", "arguments": {...}}}. */
static json_t *calls_ollama(json_t *calls)
{
	json_t *out = json_array(), *c;
	size_t k;

	json_array_foreach(calls, k, c) {
		json_t *fn = json_object_get(c, "function");
		json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")),
					  JSON_DECODE_ANY, NULL);

		json_array_append_new(out, json_pack("{s:{s:O,s:o}}", "function", "name",
						     json_object_get(fn, "name"), "arguments",
						     args ? args : json_object()));
	}
	return out;
}

static json_int_t ns(double s)
{
	return s > 0 ? (json_int_t)(s * 1e9) : 0;
}

json_t *ollama_answer(const char *model, bool chat, const char *text, size_t len,
		      json_t *calls, const struct ollama_stats *st)
{
	json_t *o = head(model), *t = json_stringn(text ? text : "", len);

	if (!t) /* not UTF-8: the detokenizer releases whole characters only */
		t = json_string("\xef\xbf\xbd");
	if (o && chat) {
		json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", t);

		if (m && calls)
			json_object_set_new(m, "tool_calls", calls_ollama(calls));
		json_object_set_new(o, "message", m);
	} else if (o) {
		json_object_set_new(o, "response", t);
	} else {
		json_decref(t);
	}
	if (!o)
		return NULL;
	json_object_set_new(o, "done", json_boolean(st != NULL));
	if (!st)
		return o;
	json_object_set_new(o, "done_reason", json_string(st->done_reason));
	json_object_set_new(o, "total_duration", json_integer(ns(st->total)));
	json_object_set_new(o, "load_duration", json_integer(0));
	json_object_set_new(o, "prompt_eval_count", json_integer(st->prompt_tokens));
	json_object_set_new(o, "prompt_eval_duration", json_integer(ns(st->first)));
	json_object_set_new(o, "eval_count", json_integer(st->eval_tokens));
	json_object_set_new(o, "eval_duration",
			    json_integer(st->first > 0 ? ns(st->total - st->first) : 0));
	return o;
}

/* ---- /api/tags, /api/show ---- */

static void modified_at(const char *path, char *out, size_t cap)
{
	struct stat sb;
	struct tm tm;

	if (stat(path, &sb) || !gmtime_r(&sb.st_mtime, &tm) ||
	    !strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(out, cap, "1970-01-01T00:00:00Z");
}

static json_t *details(const struct ollama_model *m, json_t *meta)
{
	const char *arch = json_string_value(json_object_get(meta, "general.architecture"));
	const char *size = json_string_value(json_object_get(meta, "general.size_label"));

	return json_pack("{s:s,s:s,s:s,s:[s],s:s,s:s}", "parent_model", "", "format", "gguf",
			 "family", arch ? arch : "", "families", arch ? arch : "",
			 "parameter_size", size ? size : "", "quantization_level",
			 m->quant ? m->quant : "");
}

json_t *ollama_tags(const struct ollama_model *m)
{
	json_t *meta = json_loads(m->metadata_json ? m->metadata_json : "{}", 0, NULL);
	json_t *list = json_array();
	struct stat sb;
	char when[64];

	modified_at(m->path, when, sizeof(when));
	for (int i = 0; list && i < m->n_names; i++)
		json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:I,s:s,s:o}", "name",
						      m->names[i], "model", m->names[i],
						      "modified_at", when, "size",
						      (json_int_t)(stat(m->path, &sb) ? 0 : sb.st_size),
						      "digest", "", "details", details(m, meta)));
	json_decref(meta);
	return json_pack("{s:o}", "models", list);
}

json_t *ollama_show(const struct ollama_model *m, const char *body, size_t len,
		    struct perr *e)
{
	json_t *o = json_loadb(body, len, 0, NULL), *meta, *out;
	const char *name = json_string_value(req_member(o, "model"));
	char when[64];
	int i;

	if (!json_is_object(o)) {
		json_decref(o);
		perr_set(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
		return NULL;
	}
	if (!name)
		name = json_string_value(req_member(o, "name"));
	for (i = 0; name && i < m->n_names; i++) {
		size_t n = strlen(m->names[i]);

		if (!strcmp(name, m->names[i]) ||
		    (!strncmp(name, m->names[i], n) && !strcmp(name + n, ":latest")))
			break;
	}
	if (!name || i == m->n_names) {
		perr_set(e, 404, "model", "model_not_found", "model '%.200s' not found",
			 name ? name : "");
		json_decref(o);
		return NULL;
	}
	json_decref(o);
	meta = json_loads(m->metadata_json ? m->metadata_json : "{}", 0, NULL);
	if (!meta)
		meta = json_object();
	modified_at(m->path, when, sizeof(when));
	/* tools: every model takes them (the template presents them, else a
	 * system message of loom's; the calls are grammar-constrained) */
	out = json_pack("{s:s,s:s,s:s,s:o,s:O,s:[s,s],s:s}", "modelfile", "", "parameters", "",
			"template", m->template_src ? m->template_src : "", "details",
			details(m, meta), "model_info", meta, "capabilities", "completion",
			"tools", "modified_at", when);
	json_decref(meta);
	if (!out)
		perr_set(e, 500, NULL, NULL, "out of memory");
	return out;
}
