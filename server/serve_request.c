/* `loom serve`: OpenAI request bodies into struct serve_req (validation,
 * chat rendering and tokenization through the context's callbacks). */
#include "serve_request.h"
#include "serve_tools.h"

#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int perr_set(struct perr *e, int status, const char *param, const char *code,
	     const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	e->code = code;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return -1;
}

json_t *req_member(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return v && !json_is_null(v) ? v : NULL;
}

static int get_int(json_t *o, const char *key, long long lo, long long hi,
		   long long *out, struct perr *e)
{
	json_t *v = req_member(o, key);

	if (!v)
		return 0;
	if (!json_is_integer(v))
		return perr_set(e, 400, key, "invalid_type", "'%s' must be an integer", key);
	if (json_integer_value(v) < lo || json_integer_value(v) > hi)
		return perr_set(e, 400, key, "invalid_value", "'%s' must be between %lld and %lld",
				key, lo, hi);
	*out = json_integer_value(v);
	return 0;
}

static int get_num(json_t *o, const char *key, double lo, double hi, bool lo_open,
		   float *out, struct perr *e)
{
	json_t *v = req_member(o, key);
	double x;

	if (!v)
		return 0;
	if (!json_is_number(v))
		return perr_set(e, 400, key, "invalid_type", "'%s' must be a number", key);
	x = json_number_value(v);
	if (!(x >= lo && x <= hi) || (lo_open && x == lo))
		return perr_set(e, 400, key, "invalid_value", "'%s' must be in %s%g, %g]",
				key, lo_open ? "(" : "[", lo, hi);
	*out = (float)x;
	return 0;
}

int req_get_bool(json_t *o, const char *key, bool *out, struct perr *e)
{
	json_t *v = req_member(o, key);

	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return perr_set(e, 400, key, "invalid_type", "'%s' must be a boolean", key);
	*out = json_is_true(v);
	return 0;
}

static int add_stop(const struct serve_req_ctx *ctx, struct serve_req *r, json_t *v,
		    struct perr *e)
{
	if (!json_is_string(v))
		return perr_set(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
	if (json_string_length(v) == 0)
		return 0; /* an empty stop string would end every request at once */
	if (r->n_stop == ctx->max_stop)
		return perr_set(e, 400, "stop", "invalid_value", "at most %d stop strings", ctx->max_stop);
	if (json_string_length(v) > SERVE_REQ_MAX_STOP_LEN)
		return perr_set(e, 400, "stop", "invalid_value", "a stop string is longer than %d bytes",
				SERVE_REQ_MAX_STOP_LEN);
	if (memchr(json_string_value(v), '\0', json_string_length(v)))
		return perr_set(e, 400, "stop", "invalid_value", "a stop string contains NUL");
	r->stop[r->n_stop] = strdup(json_string_value(v));
	if (!r->stop[r->n_stop])
		return perr_set(e, 500, NULL, NULL, "out of memory");
	r->n_stop++;
	return 0;
}

static int get_stop(const struct serve_req_ctx *ctx, json_t *o, struct serve_req *r,
		    struct perr *e)
{
	json_t *v = req_member(o, "stop"), *x;
	size_t i;

	if (!v)
		return 0;
	if (!json_is_array(v))
		return add_stop(ctx, r, v, e);
	if (json_array_size(v) > (size_t)ctx->max_stop)
		return perr_set(e, 400, "stop", "invalid_value", "at most %d stop strings", ctx->max_stop);
	json_array_foreach(v, i, x)
		if (add_stop(ctx, r, x, e))
			return -1;
	return 0;
}

/* "logit_bias" ({"token id": bias}): checked, each id a token of the
 * vocabulary and each bias in [-100, 100] as OpenAI's API says; loom's
 * sampler has no per-token bias, so a non-zero one is refused by name
 * rather than ignored (docs/SERVING.md). */
static int check_logit_bias(const struct serve_req_ctx *ctx, json_t *o, struct perr *e)
{
	json_t *lb = req_member(o, "logit_bias"), *v;
	const char *key;
	bool any = false;

	if (!lb)
		return 0;
	if (!json_is_object(lb))
		return perr_set(e, 400, "logit_bias", "invalid_type",
				"'logit_bias' must be an object of token ids to biases");
	json_object_foreach(lb, key, v) {
		char *end;
		long long id = strtoll(key, &end, 10);

		if (!*key || *end || id < 0 || id >= ctx->n_vocab)
			return perr_set(e, 400, "logit_bias", "invalid_value",
					"'logit_bias' key '%.32s' is not a token id in [0, %d)", key,
					ctx->n_vocab);
		if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
			return perr_set(e, 400, "logit_bias", "invalid_value",
					"'logit_bias' of token %lld must be a number in [-100, 100]", id);
		any |= json_number_value(v) != 0;
	}
	if (any)
		return perr_set(e, 400, "logit_bias", "invalid_value",
				"'logit_bias' with a non-zero bias is not supported by this server");
	return 0;
}

static int get_sampling(const struct serve_req_ctx *ctx, json_t *o, struct serve_req *r,
			struct perr *e)
{
	struct loom_sampler_params *sp = &r->sp;
	long long top_k, seed = 0, n = 1;

	loom_sampler_defaults(sp); /* what a field the request omits gets, as in loom run */
	top_k = sp->top_k;
	if (get_num(o, "temperature", 0, 2, false, &sp->temp, e) ||
	    get_num(o, "top_p", 0, 1, true, &sp->top_p, e) ||
	    get_num(o, "min_p", 0, 1, false, &sp->min_p, e) ||
	    get_num(o, "presence_penalty", -2, 2, false, &sp->presence_penalty, e) ||
	    get_num(o, "frequency_penalty", -2, 2, false, &sp->frequency_penalty, e) ||
	    get_num(o, "repetition_penalty", 0, 10, true, &sp->repeat_penalty, e) ||
	    get_int(o, "top_k", 0, ctx->n_vocab, &top_k, e) ||
	    get_int(o, "seed", LLONG_MIN, LLONG_MAX, &seed, e) ||
	    get_int(o, "n", 1, ctx->max_n, &n, e) || check_logit_bias(ctx, o, e))
		return -1;
	sp->top_k = (int32_t)top_k;
	r->seed_given = req_member(o, "seed") != NULL;
	if (r->seed_given)
		sp->seed = (uint64_t)seed;
	r->n = (int)n;
	return 0;
}

/* "none", or the names of the offered strategies, for error messages. */
static void spec_names(const struct serve_req_ctx *ctx, char *out, size_t cap)
{
	size_t len;
	int i;

	snprintf(out, cap, "none");
	len = strlen(out);
	for (i = 0; i < ctx->n_spec && len < cap; i++) {
		snprintf(out + len, cap - len, ", %s", ctx->spec_names[i]);
		len += strlen(out + len);
	}
}

/* The offered strategy called name ("ngram" or "ngram.so"), or NULL. */
static const char *find_spec(const struct serve_req_ctx *ctx, const char *name)
{
	size_t len = strlen(name);
	int i;

	if (len > 3 && !strcmp(name + len - 3, ".so"))
		len -= 3;
	for (i = 0; i < ctx->n_spec; i++)
		if (strlen(ctx->spec_names[i]) == len && !strncmp(ctx->spec_names[i], name, len))
			return ctx->spec_names[i];
	return NULL;
}

/* "speculative" (or "spec"): a strategy name, or {"name": ..., "max_draft": n}. */
static int get_spec(const struct serve_req_ctx *ctx, json_t *o, struct serve_req *r,
		    struct perr *e)
{
	const char *key = req_member(o, "speculative") ? "speculative" : "spec";
	json_t *v = req_member(o, key), *name = v;
	long long max_draft = 0;
	char names[512];

	r->spec = ctx->spec_default;
	if (!v)
		return 0;
	if (json_is_object(v)) {
		name = req_member(v, "name");
		if (get_int(v, "max_draft", 1, 64, &max_draft, e))
			return -1;
	}
	if (!name || !json_is_string(name))
		return perr_set(e, 400, key, "invalid_type",
				"'%s' must be a strategy name or an object with a string 'name'", key);
	r->spec_max_draft = (int)max_draft;
	if (!strcmp(json_string_value(name), "none")) {
		r->spec = NULL;
		return 0;
	}
	r->spec = find_spec(ctx, json_string_value(name));
	if (r->spec)
		return 0;
	spec_names(ctx, names, sizeof(names));
	return perr_set(e, 400, key, "invalid_value",
			"unknown speculative strategy '%.64s'; this server offers: %s%s", json_string_value(name),
			names, ctx->n_spec ? "" : " (start it with --spec=ngram.so)");
}

static int get_stream(json_t *o, struct serve_req *r, struct perr *e)
{
	json_t *so = req_member(o, "stream_options");

	if (req_get_bool(o, "stream", &r->stream, e))
		return -1;
	if (!so)
		return 0;
	if (!json_is_object(so))
		return perr_set(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
	return req_get_bool(so, "include_usage", &r->include_usage, e);
}

/* The tokenizer stops counting past the context, so the size of a prompt
 * that does not fit is not known. */
static int too_long(const struct serve_req_ctx *ctx, const char *param, struct perr *e)
{
	return perr_set(e, 400, param, "context_length_exceeded",
			"the prompt is longer than the context (%d tokens)", ctx->n_ctx);
}

/* Tokenizes into r->prompt; bos (>= 0) goes first. */
static int tokenize(const struct serve_req_ctx *ctx, struct serve_req *r, const char *text,
		    size_t len, bool add_special, int32_t bos, const char *param, struct perr *e)
{
	int64_t need = ctx->tokenize(ctx->user, text, len, add_special, NULL, 0);
	int64_t extra = bos >= 0 ? 1 : 0;

	if (need < 0)
		return perr_set(e, 400, param, "invalid_value", "the prompt could not be tokenized");
	if (need + extra == 0)
		return perr_set(e, 400, param, "invalid_value", "the prompt is empty");
	if (need + extra > ctx->n_ctx)
		return too_long(ctx, param, e);
	r->prompt = malloc(sizeof(int32_t) * (size_t)(need + extra + 1));
	if (!r->prompt)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	if (extra)
		r->prompt[0] = bos;
	if (ctx->tokenize(ctx->user, text, len, add_special, r->prompt + extra, need) != need)
		return perr_set(e, 500, NULL, NULL, "the prompt could not be tokenized");
	r->n_prompt = (int32_t)(need + extra);
	return 0;
}

/* Token ids from the array v into r->prompt; what names v in errors:
 * "prompt" or "prompt[2]". */
static int prompt_ids(const struct serve_req_ctx *ctx, struct serve_req *r, json_t *v,
		      const char *param, const char *what, struct perr *e)
{
	size_t i, n = json_array_size(v);
	json_t *x;

	if (n == 0)
		return perr_set(e, 400, param, "invalid_value", "%s is empty", what);
	if (n > (size_t)ctx->n_ctx)
		return perr_set(e, 400, param, "context_length_exceeded",
				"%s is %zu tokens; the context is %d", what, n, ctx->n_ctx);
	r->prompt = malloc(sizeof(int32_t) * (n + 1));
	if (!r->prompt)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	json_array_foreach(v, i, x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) >= ctx->n_vocab)
			return perr_set(e, 400, param, "invalid_value",
					"%s[%zu] is not a token id in [0, %d)", what, i, ctx->n_vocab);
		r->prompt[i] = (int32_t)json_integer_value(x);
	}
	r->n_prompt = (int32_t)n;
	return 0;
}

/* One prompt: a string or an array of token ids, into r->prompt. */
static int one_prompt(const struct serve_req_ctx *ctx, struct serve_req *r, json_t *v,
		      const char *param, const char *what, struct perr *e)
{
	if (json_is_string(v))
		return tokenize(ctx, r, json_string_value(v), json_string_length(v), true, -1,
				param, e);
	if (json_is_array(v))
		return prompt_ids(ctx, r, v, param, what, e);
	return perr_set(e, 400, param, "invalid_type",
			"%s must be a string or an array of token ids", what);
}

/* True for an array whose elements are all strings or arrays: a batch of
 * prompts (an array of integers is one prompt). */
static bool is_prompt_list(json_t *v)
{
	json_t *x;
	size_t i;

	if (!json_is_array(v) || json_array_size(v) == 0)
		return false;
	json_array_foreach(v, i, x)
		if (!json_is_string(x) && !json_is_array(x))
			return false;
	return true;
}

/* Moves r->prompt into the next slot of r->prompts. */
static void keep_prompt(struct serve_req *r)
{
	r->prompts[r->n_prompts] = r->prompt;
	r->prompt_lens[r->n_prompts++] = r->n_prompt;
	r->prompt = NULL;
	r->n_prompt = 0;
}

/* prompt: a string, an array of token ids, or an array of those (a batch:
 * one choice each). */
static int get_prompt(const struct serve_req_ctx *ctx, json_t *o, struct serve_req *r,
		      struct perr *e)
{
	json_t *v = req_member(o, "prompt"), *x;
	char what[32];
	size_t i;

	if (!v)
		return perr_set(e, 400, "prompt", "missing", "'prompt' is required");
	if (!is_prompt_list(v)) {
		if (!json_is_string(v) && !(json_is_array(v) && json_array_size(v) > 0))
			return perr_set(e, 400, "prompt", "invalid_type",
					"'prompt' must be a string, an array of token ids or an array of those");
		if (one_prompt(ctx, r, v, "prompt", "prompt", e))
			return -1;
		keep_prompt(r);
		return 0;
	}
	if (json_array_size(v) > SERVE_REQ_MAX_PROMPTS)
		return perr_set(e, 400, "prompt", "invalid_value", "at most %d prompts per request",
				SERVE_REQ_MAX_PROMPTS);
	json_array_foreach(v, i, x) {
		snprintf(what, sizeof(what), "prompt[%zu]", i);
		if (one_prompt(ctx, r, x, "prompt", what, e))
			return -1;
		keep_prompt(r);
	}
	return 0;
}

/* logprobs and top_logprobs (chat), or logprobs N and echo (completions). */
static int get_logprobs(json_t *o, struct serve_req *r, struct perr *e)
{
	long long top = 0;

	if (!r->chat) {
		if (req_get_bool(o, "echo", &r->echo, e) ||
		    get_int(o, "logprobs", 0, LOOM_MAX_TOP_LOGPROBS, &top, e))
			return -1;
		r->logprobs = req_member(o, "logprobs") != NULL;
		r->top_logprobs = (int)top;
		return 0;
	}
	if (req_get_bool(o, "logprobs", &r->logprobs, e) ||
	    get_int(o, "top_logprobs", 0, LOOM_MAX_TOP_LOGPROBS, &top, e))
		return -1;
	if (top > 0 && !r->logprobs)
		return perr_set(e, 400, "top_logprobs", "invalid_value",
				"'top_logprobs' needs 'logprobs': true");
	r->top_logprobs = (int)top;
	return 0;
}

/* Joins an array of {"type":"text","text":...} parts into *out (malloc'd). */
static int join_parts(json_t *c, size_t i, char **out, struct perr *e)
{
	json_t *part;
	size_t k, len = 0;

	json_array_foreach(c, k, part) {
		json_t *type = json_object_get(part, "type"), *t = json_object_get(part, "text");

		if (!json_is_object(part) || !json_is_string(type) ||
		    strcmp(json_string_value(type), "text") || !json_is_string(t))
			return perr_set(e, 400, "messages", "invalid_value",
					"messages[%zu].content[%zu]: only text parts are supported", i, k);
		len += json_string_length(t);
	}
	*out = malloc(len + 1);
	if (!*out)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	len = 0;
	json_array_foreach(c, k, part) {
		json_t *t = json_object_get(part, "text");

		memcpy(*out + len, json_string_value(t), json_string_length(t));
		len += json_string_length(t);
	}
	(*out)[len] = '\0';
	return 0;
}

/* content: a string, null, or an array of text parts; the text goes into
 * *out (malloc'd). */
static int message_text(json_t *c, size_t i, char **out, struct perr *e)
{
	if (json_is_array(c))
		return join_parts(c, i, out, e);
	if (c && !json_is_null(c) && !json_is_string(c))
		return perr_set(e, 400, "messages", "invalid_type",
				"messages[%zu].content must be a string or an array of text parts", i);
	*out = strdup(json_is_string(c) ? json_string_value(c) : "");
	return *out ? 0 : perr_set(e, 500, NULL, NULL, "out of memory");
}

static int take_ids(const struct serve_req_ctx *ctx, struct serve_req *r, int32_t *ids,
		    int64_t n_ids, const char *why, struct perr *e);

/* The chat's ids from ctx->render_ids, with chat_bos first where it is set. */
static int render_chat_ids(const struct serve_req_ctx *ctx, struct serve_req *r,
			   const struct serve_msg *msgs, size_t n, struct perr *e)
{
	int64_t n_ids = 0;
	char why[256] = "";
	int32_t *ids = ctx->render_ids(ctx->user, msgs, n, &n_ids, why, sizeof(why));

	return take_ids(ctx, r, ids, n_ids, why, e);
}

/* A rendering's ids (owned) into r->prompt, chat_bos first where set. */
static int take_ids(const struct serve_req_ctx *ctx, struct serve_req *r, int32_t *ids,
		    int64_t n_ids, const char *why, struct perr *e)
{
	int64_t extra = ctx->chat_bos >= 0 ? 1 : 0;

	if (n_ids + extra > ctx->n_ctx) {
		free(ids);
		return too_long(ctx, "messages", e);
	}
	if (!ids)
		return perr_set(e, 400, "messages", "invalid_value", "%s", why);
	if (n_ids + extra == 0) {
		free(ids);
		return perr_set(e, 400, "messages", "invalid_value", "the prompt is empty");
	}
	r->prompt = malloc(sizeof(int32_t) * (size_t)(n_ids + extra + 1));
	if (!r->prompt) {
		free(ids);
		return perr_set(e, 500, NULL, NULL, "out of memory");
	}
	if (extra)
		r->prompt[0] = ctx->chat_bos;
	memcpy(r->prompt + extra, ids, sizeof(int32_t) * (size_t)n_ids);
	free(ids);
	r->n_prompt = (int32_t)(n_ids + extra);
	return 0;
}

static int render_chat(const struct serve_req_ctx *ctx, struct serve_req *r,
		       const struct serve_msg *msgs, size_t n, struct perr *e)
{
	char why[256];
	char *text;
	int rc;

	if (!ctx->render)
		return perr_set(e, 500, NULL, "unsupported_chat_template", "%s",
				ctx->chat_err ? ctx->chat_err : "no chat template");
	why[0] = '\0';
	if (ctx->render_ids)
		return render_chat_ids(ctx, r, msgs, n, e);
	text = ctx->render(ctx->user, msgs, n, why, sizeof(why));
	if (!text)
		return perr_set(e, 400, "messages", "invalid_value", "%s", why);
	rc = tokenize(ctx, r, text, strlen(text), false, ctx->chat_bos, "messages", e);
	free(text);
	return rc;
}

/* Puts the tools' section into the system message (first), or a new
 * system message before the others. msgs has room for one more. */
static int add_tools_text(struct serve_msg *msgs, size_t *n, const char *tools_text,
			  struct perr *e)
{
	char *text;

	if (*n > 0 && !strcmp(msgs[0].role, "system")) {
		size_t a = strlen(msgs[0].content), b = strlen(tools_text);

		text = malloc(a + b + 3);
		if (!text)
			return perr_set(e, 500, NULL, NULL, "out of memory");
		memcpy(text, msgs[0].content, a);
		memcpy(text + a, a ? "\n\n" : "", a ? 2 : 0);
		memcpy(text + a + (a ? 2 : 0), tools_text, b + 1);
		free((char *)msgs[0].content);
		msgs[0].content = text;
		return 0;
	}
	text = strdup(tools_text);
	if (!text)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	memmove(msgs + 1, msgs, sizeof(*msgs) * *n);
	msgs[0] = (struct serve_msg){ .role = "system", .content = text };
	(*n)++;
	return 0;
}

/* ---- chats with tools, through the template (ctx->render_json) ---- */

/* The chat goes to the template as JSON: the template presents tools
 * itself, and tools are in use or the history holds calls or results. */
static bool json_chat(const struct serve_req_ctx *ctx, json_t *msgs, bool tools_on)
{
	json_t *m;
	size_t i;

	if (!ctx->render_json || !ctx->template_tools)
		return false;
	if (tools_on)
		return true;
	json_array_foreach(msgs, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));

		if (req_member(m, "tool_calls") || (role && !strcmp(role, "tool")))
			return true;
	}
	return false;
}

/* An assistant's tool_calls as transformers passes them to templates:
 * each arguments text parsed into its object (kept as text when it is
 * not JSON). */
static json_t *calls_json(json_t *calls, size_t i, struct perr *e)
{
	json_t *out = json_array(), *c;
	size_t k;

	if (!json_is_array(calls)) {
		json_decref(out);
		perr_set(e, 400, "messages", "invalid_type", "messages[%zu].tool_calls must be an array", i);
		return NULL;
	}
	json_array_foreach(calls, k, c) {
		json_t *fn = json_object_get(c, "function"), *name = json_object_get(fn, "name");
		json_t *args = json_object_get(fn, "arguments"), *parsed = NULL, *one;

		if (!json_is_string(name)) {
			json_decref(out);
			perr_set(e, 400, "messages", "invalid_value",
				 "messages[%zu].tool_calls[%zu].function.name must be a string", i, k);
			return NULL;
		}
		if (json_is_string(args))
			parsed = json_loadb(json_string_value(args), json_string_length(args),
					    JSON_DECODE_ANY, NULL);
		one = json_pack("{s:s,s:{s:O,s:o}}", "type", "function", "function", "name", name,
				"arguments", parsed ? parsed : args ? json_incref(args) : json_object());
		if (one && json_is_string(json_object_get(c, "id")))
			json_object_set(one, "id", json_object_get(c, "id"));
		json_array_append_new(out, one);
	}
	return out;
}

/* One message as the template sees it: role (developer as system),
 * content as text, and tool_calls, tool_call_id and name where given. */
static json_t *message_json(json_t *m, size_t i, struct perr *e)
{
	const char *role = json_string_value(json_object_get(m, "role"));
	json_t *out, *calls = req_member(m, "tool_calls");
	char *text = NULL;
	const char *keys[] = { "tool_call_id", "name" };

	if (!json_is_object(m) || !role) {
		perr_set(e, 400, "messages", "invalid_type",
			 "messages[%zu] must be an object with a string 'role'", i);
		return NULL;
	}
	if (message_text(json_object_get(m, "content"), i, &text, e))
		return NULL;
	out = json_pack("{s:s,s:s}", "role", strcmp(role, "developer") ? role : "system",
			"content", text);
	free(text);
	if (!out) {
		perr_set(e, 400, "messages", "invalid_value", "messages[%zu] is not UTF-8", i);
		return NULL;
	}
	for (size_t k = 0; k < 2; k++)
		if (json_is_string(json_object_get(m, keys[k])))
			json_object_set(out, keys[k], json_object_get(m, keys[k]));
	if (calls) {
		json_t *list = calls_json(calls, i, e);

		if (!list) {
			json_decref(out);
			return NULL;
		}
		json_object_set_new(out, "tool_calls", list);
	}
	return out;
}

static int render_chat_json(const struct serve_req_ctx *ctx, struct serve_req *r, json_t *v,
			    json_t *tools, struct perr *e)
{
	json_t *msgs = json_array(), *m;
	char *mj = NULL, *tj = NULL, why[256] = "";
	int64_t n_ids = 0;
	int32_t *ids;
	size_t i;
	int rc = -1;

	json_array_foreach(v, i, m) {
		json_t *one = message_json(m, i, e);

		if (!one)
			goto out;
		json_array_append_new(msgs, one);
	}
	mj = json_dumps(msgs, JSON_COMPACT);
	tj = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
	if (!mj || (tools && !tj)) {
		perr_set(e, 500, NULL, NULL, "out of memory");
		goto out;
	}
	ids = ctx->render_json(ctx->user, mj, tj, &n_ids, why, sizeof(why));
	rc = take_ids(ctx, r, ids, n_ids, why, e);
out:
	free(mj);
	free(tj);
	json_decref(msgs);
	return rc;
}

static int get_messages(const struct serve_req_ctx *ctx, json_t *o, struct serve_req *r,
			const char *tools_text, struct perr *e)
{
	json_t *v = req_member(o, "messages"), *m;
	struct serve_msg *msgs;
	size_t i, n;
	int rc = -1;

	if (!v)
		return perr_set(e, 400, "messages", "missing", "'messages' is required");
	if (!json_is_array(v) || json_array_size(v) == 0)
		return perr_set(e, 400, "messages", "invalid_type", "'messages' must be a non-empty array");
	if (ctx->render && json_chat(ctx, v, r->tool_mode != SERVE_TOOLS_OFF))
		return render_chat_json(ctx, r, v,
					r->tool_mode != SERVE_TOOLS_OFF ? req_member(o, "tools") : NULL,
					e);
	n = json_array_size(v);
	msgs = calloc(n + 1, sizeof(*msgs)); /* + 1: a system message for the tools */
	if (!msgs)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	json_array_foreach(v, i, m) {
		json_t *role = json_object_get(m, "role");
		char *text = NULL;

		if (!json_is_object(m) || !json_is_string(role)) {
			perr_set(e, 400, "messages", "invalid_type",
				 "messages[%zu] must be an object with a string 'role'", i);
			goto out;
		}
		if (message_text(json_object_get(m, "content"), i, &text, e))
			goto out;
		msgs[i].role = json_string_value(role);
		/* current OpenAI clients send "developer" for what older ones
		 * call "system": templates know only the latter */
		if (!strcmp(msgs[i].role, "developer"))
			msgs[i].role = "system";
		msgs[i].content = text;
		if (serve_tool_history(m, i, &msgs[i].role, (char **)&msgs[i].content, e))
			goto out;
	}
	if (tools_text && add_tools_text(msgs, &n, tools_text, e))
		goto out;
	rc = render_chat(ctx, r, msgs, n, e);
out:
	for (i = 0; i < n; i++)
		free((char *)msgs[i].content);
	free(msgs);
	return rc;
}

static int get_max_tokens(const struct serve_req_ctx *ctx, json_t *o, struct serve_req *r,
			  bool until_full, struct perr *e)
{
	int32_t longest = 0, room;
	const char *key = "max_tokens";
	long long mt;
	int i;

	for (i = 0; i < r->n_prompts; i++)
		longest = r->prompt_lens[i] > longest ? r->prompt_lens[i] : longest;
	room = ctx->n_ctx - longest;
	mt = r->chat || until_full ? room : 16;
	if (r->chat && req_member(o, "max_completion_tokens"))
		key = "max_completion_tokens";
	/* 0 with echo: the prompt and its logprobs only (scoring) */
	if (get_int(o, key, r->echo ? 0 : 1, INT_MAX, &mt, e))
		return -1;
	if (room < 1 || mt > room)
		return perr_set(e, 400, key, "context_length_exceeded",
				"the prompt (%d tokens) + %s (%lld) exceeds the context (%d)",
				longest, key, mt, ctx->n_ctx);
	r->max_tokens = (int)mt;
	return 0;
}

void serve_req_free(struct serve_req *r)
{
	int i;

	for (i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	for (i = 0; i < r->n_prompts; i++)
		free(r->prompts[i]);
	if (r->prompt && (!r->n_prompts || r->prompt != r->prompts[0]))
		free(r->prompt); /* not yet moved to prompts */
	loom_grammar_free(r->grammar);
	memset(r, 0, sizeof(*r));
}

/* model: absent, empty, or one of the names the server answers to (its
 * file's name and --alias); another name is a 404 as OpenAI gives. */
static int check_model(const struct serve_req_ctx *ctx, json_t *v, struct perr *e)
{
	const char *name = v ? json_string_value(v) : NULL;
	int i;

	if (!name || !name[0] || !ctx->n_model_names)
		return 0;
	for (i = 0; i < ctx->n_model_names; i++)
		if (!strcmp(name, ctx->model_names[i]))
			return 0;
	return perr_set(e, 404, "model", "model_not_found",
			"The model '%.200s' does not exist (GET /v1/models lists the names served)", name);
}

/* The members of the body object, in the order their errors are reported. */
static int parse_object(const struct serve_req_ctx *ctx, json_t *o, struct serve_req *r,
			bool until_full, struct perr *e)
{
	char *tools_text = NULL;
	int rc;

	if (!json_is_object(o))
		return perr_set(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
	if (req_member(o, "model") && !json_is_string(req_member(o, "model")))
		return perr_set(e, 400, "model", "invalid_type", "'model' must be a string");
	if (check_model(ctx, req_member(o, "model"), e))
		return -1;
	if (get_logprobs(o, r, e) || get_sampling(ctx, o, r, e) ||
	    get_stop(ctx, o, r, e) || get_stream(o, r, e) || get_spec(ctx, o, r, e))
		return -1;
	if (serve_structured_parse(o, r->chat, ctx->tool_format,
				   ctx->template_tools && ctx->render_json && ctx->render, r,
				   &tools_text, e))
		return -1;
	if (r->chat) {
		rc = get_messages(ctx, o, r, tools_text, e);
		if (rc == 0)
			keep_prompt(r);
	} else {
		rc = get_prompt(ctx, o, r, e);
	}
	free(tools_text);
	if (rc)
		return -1;
	if (r->n_prompts * r->n > SERVE_REQ_MAX_CHOICES)
		return perr_set(e, 400, "n", "invalid_value",
				"%d prompts x n %d is more than %d choices", r->n_prompts, r->n,
				SERVE_REQ_MAX_CHOICES);
	r->prompt = r->prompts[0]; /* owned by prompts */
	r->n_prompt = r->prompt_lens[0];
	return get_max_tokens(ctx, o, r, until_full, e);
}

int serve_req_parse_obj(const struct serve_req_ctx *ctx, json_t *o, bool chat, bool until_full,
			struct serve_req *r, struct perr *e)
{
	int rc;

	memset(r, 0, sizeof(*r));
	r->chat = chat;
	rc = parse_object(ctx, o, r, until_full, e);
	if (rc)
		serve_req_free(r);
	return rc;
}

int serve_req_parse(const struct serve_req_ctx *ctx, const char *body, size_t len,
		    bool chat, struct serve_req *r, struct perr *e)
{
	json_error_t jerr;
	json_t *o;
	int rc;

	memset(r, 0, sizeof(*r));
	r->chat = chat;
	o = json_loadb(body, len, 0, &jerr);
	if (!o)
		return perr_set(e, 400, NULL, "invalid_json", "invalid JSON at line %d column %d: %s",
				jerr.line, jerr.column, jerr.text);
	rc = serve_req_parse_obj(ctx, o, chat, false, r, e);
	json_decref(o);
	return rc;
}

/* ---- /v1/embeddings ---- */

void serve_embed_free(struct serve_embed_req *r)
{
	for (int i = 0; i < r->n_inputs; i++)
		free(r->inputs[i]);
	memset(r, 0, sizeof(*r));
}

/* input: as a completion's prompt (without BOS rules of its own: the
 * tokenizer adds what the model asks), into r's inputs. */
static int embed_inputs(const struct serve_req_ctx *ctx, json_t *v, struct serve_embed_req *r,
			struct perr *e)
{
	struct serve_req tmp = { 0 };
	int rc, i;

	if (!v)
		return perr_set(e, 400, "input", "missing", "'input' is required");
	tmp.n = 1;
	if (!is_prompt_list(v) && !json_is_string(v) && !(json_is_array(v) && json_array_size(v)))
		return perr_set(e, 400, "input", "invalid_type",
				"'input' must be a string, an array of strings, an array of token ids or an array of those");
	if (is_prompt_list(v)) {
		json_t *x;
		char what[32];
		size_t k;

		if (json_array_size(v) > SERVE_REQ_MAX_PROMPTS)
			return perr_set(e, 400, "input", "invalid_value",
					"at most %d inputs per request", SERVE_REQ_MAX_PROMPTS);
		rc = 0;
		json_array_foreach(v, k, x) {
			snprintf(what, sizeof(what), "input[%zu]", k);
			if ((rc = one_prompt(ctx, &tmp, x, "input", what, e)))
				break;
			keep_prompt(&tmp);
		}
	} else {
		rc = one_prompt(ctx, &tmp, v, "input", "input", e);
		if (rc == 0)
			keep_prompt(&tmp);
	}
	for (i = 0; rc == 0 && i < tmp.n_prompts; i++) {
		r->inputs[i] = tmp.prompts[i];
		r->input_lens[i] = tmp.prompt_lens[i];
		tmp.prompts[i] = NULL;
	}
	if (rc == 0)
		r->n_inputs = tmp.n_prompts;
	serve_req_free(&tmp);
	return rc;
}

static int embed_object(const struct serve_req_ctx *ctx, json_t *o, struct serve_embed_req *r,
			struct perr *e)
{
	json_t *fmt;

	if (!json_is_object(o))
		return perr_set(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
	if (req_member(o, "model") && !json_is_string(req_member(o, "model")))
		return perr_set(e, 400, "model", "invalid_type", "'model' must be a string");
	if (check_model(ctx, req_member(o, "model"), e))
		return -1;
	fmt = req_member(o, "encoding_format");
	if (fmt && (!json_is_string(fmt) || (strcmp(json_string_value(fmt), "float") &&
					     strcmp(json_string_value(fmt), "base64"))))
		return perr_set(e, 400, "encoding_format", "invalid_value",
				"'encoding_format' must be \"float\" or \"base64\"");
	r->base64 = fmt && !strcmp(json_string_value(fmt), "base64");
	if (req_member(o, "dimensions"))
		return perr_set(e, 400, "dimensions", "unsupported",
				"'dimensions' is not supported: the embeddings have the model's width");
	return embed_inputs(ctx, req_member(o, "input"), r, e);
}

int serve_embed_parse(const struct serve_req_ctx *ctx, const char *body, size_t len,
		      struct serve_embed_req *r, struct perr *e)
{
	json_error_t jerr;
	json_t *o;
	int rc;

	memset(r, 0, sizeof(*r));
	o = json_loadb(body, len, 0, &jerr);
	if (!o)
		return perr_set(e, 400, NULL, "invalid_json", "invalid JSON at line %d column %d: %s",
				jerr.line, jerr.column, jerr.text);
	rc = embed_object(ctx, o, r, e);
	json_decref(o);
	if (rc)
		serve_embed_free(r);
	return rc;
}
