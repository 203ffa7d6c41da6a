/* `loom serve`: OpenAI request bodies into jobs (validation, chat
 * templates, tokenization). */
#include "serve_json.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* A present, non-null member, or NULL (OpenAI clients send nulls for
 * unset options). */
static json_t *member(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return v && !json_is_null(v) ? v : NULL;
}

static int get_int(json_t *o, const char *key, long long lo, long long hi,
		   long long *out, struct perr *e)
{
	json_t *v = member(o, key);

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
	json_t *v = member(o, key);
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

static int get_bool(json_t *o, const char *key, bool *out, struct perr *e)
{
	json_t *v = member(o, key);

	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return perr_set(e, 400, key, "invalid_type", "'%s' must be a boolean", key);
	*out = json_is_true(v);
	return 0;
}

static int add_stop(struct job *j, json_t *v, struct perr *e)
{
	if (!json_is_string(v))
		return perr_set(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
	if (json_string_length(v) == 0)
		return 0; /* an empty stop string would end every request at once */
	if (j->n_stop == SRV_MAX_STOP)
		return perr_set(e, 400, "stop", "invalid_value", "at most %d stop strings", SRV_MAX_STOP);
	if (json_string_length(v) > 256)
		return perr_set(e, 400, "stop", "invalid_value", "a stop string is longer than 256 bytes");
	if (memchr(json_string_value(v), '\0', json_string_length(v)))
		return perr_set(e, 400, "stop", "invalid_value", "a stop string contains NUL");
	j->stop[j->n_stop] = strdup(json_string_value(v));
	if (!j->stop[j->n_stop])
		return perr_set(e, 500, NULL, NULL, "out of memory");
	j->n_stop++;
	return 0;
}

static int get_stop(json_t *o, struct job *j, struct perr *e)
{
	json_t *v = member(o, "stop"), *x;
	size_t i;

	if (!v)
		return 0;
	if (!json_is_array(v))
		return add_stop(j, v, e);
	if (json_array_size(v) > SRV_MAX_STOP)
		return perr_set(e, 400, "stop", "invalid_value", "at most %d stop strings", SRV_MAX_STOP);
	json_array_foreach(v, i, x)
		if (add_stop(j, x, e))
			return -1;
	return 0;
}

static uint64_t fresh_seed(void)
{
	static _Atomic uint64_t counter;
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)ts.tv_sec ^
	       (counter++ << 32);
}

static int get_sampling(json_t *o, struct job *j, struct perr *e)
{
	struct loom_sampler_params *sp = &j->sp;
	long long top_k = 0, seed = 0, n = 1;
	int32_t n_vocab = loom_tokenizer_n_vocab(j->srv->tok);

	loom_sampler_defaults(sp);
	sp->temp = 1.0f;
	sp->top_k = 0;
	sp->top_p = 1.0f;
	sp->min_p = 0.0f;
	sp->repeat_penalty = 1.0f;
	sp->presence_penalty = 0.0f;
	sp->frequency_penalty = 0.0f;
	sp->seed = fresh_seed();
	if (get_num(o, "temperature", 0, 2, false, &sp->temp, e) ||
	    get_num(o, "top_p", 0, 1, true, &sp->top_p, e) ||
	    get_num(o, "min_p", 0, 1, false, &sp->min_p, e) ||
	    get_num(o, "presence_penalty", -2, 2, false, &sp->presence_penalty, e) ||
	    get_num(o, "frequency_penalty", -2, 2, false, &sp->frequency_penalty, e) ||
	    get_num(o, "repetition_penalty", 0, 10, true, &sp->repeat_penalty, e) ||
	    get_int(o, "top_k", 0, n_vocab, &top_k, e) ||
	    get_int(o, "seed", LLONG_MIN, LLONG_MAX, &seed, e) ||
	    get_int(o, "n", 1, SRV_MAX_N, &n, e))
		return -1;
	sp->top_k = (int32_t)top_k;
	if (member(o, "seed"))
		sp->seed = (uint64_t)seed;
	j->n = (int)n;
	return 0;
}

/* "none", or the names of the offered strategies, for error messages. */
static void spec_names(const struct server *srv, char *out, size_t cap)
{
	size_t len = 0;
	int i;

	snprintf(out, cap, "none");
	len = strlen(out);
	for (i = 0; i < srv->n_spec && len < cap; i++) {
		snprintf(out + len, cap - len, ", %s", loom_spec_kind_name(srv->spec[i]));
		len += strlen(out + len);
	}
}

/* "speculative" (or "spec"): a strategy name, or {"name": ..., "max_draft": n}. */
static int get_spec(json_t *o, struct job *j, struct perr *e)
{
	const char *key = member(o, "speculative") ? "speculative" : "spec";
	json_t *v = member(o, key), *name = v;
	long long max_draft = 0;
	char names[512];

	j->spec = j->srv->spec_default;
	if (!v)
		return 0;
	if (json_is_object(v)) {
		name = member(v, "name");
		if (get_int(v, "max_draft", 1, 64, &max_draft, e))
			return -1;
	}
	if (!name || !json_is_string(name))
		return perr_set(e, 400, key, "invalid_type",
				"'%s' must be a strategy name or an object with a string 'name'", key);
	j->spec_max_draft = (int)max_draft;
	if (!strcmp(json_string_value(name), "none")) {
		j->spec = NULL;
		return 0;
	}
	j->spec = server_find_spec(j->srv, json_string_value(name));
	if (j->spec)
		return 0;
	spec_names(j->srv, names, sizeof(names));
	return perr_set(e, 400, key, "invalid_value",
			"unknown speculative strategy '%.64s'; this server offers: %s%s", json_string_value(name),
			names, j->srv->n_spec ? "" : " (start it with --spec=ngram.so)");
}

static int get_stream(json_t *o, struct job *j, struct perr *e)
{
	json_t *so = member(o, "stream_options");

	if (get_bool(o, "stream", &j->stream, e))
		return -1;
	if (!so)
		return 0;
	if (!json_is_object(so))
		return perr_set(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
	return get_bool(so, "include_usage", &j->include_usage, e);
}

/* Tokenizes into j->prompt. */
static int tokenize(struct job *j, const char *text, size_t len, bool add_special,
		    const char *param, struct perr *e)
{
	const struct loom_tokenizer *tok = j->srv->tok;
	int64_t need = loom_tokenize(tok, text, len, add_special, true, NULL, 0);
	int64_t extra = (!add_special && j->srv->add_bos) ? 1 : 0;

	if (need < 0)
		return perr_set(e, 400, param, "invalid_value", "the prompt could not be tokenized");
	if (need + extra == 0)
		return perr_set(e, 400, param, "invalid_value", "the prompt is empty");
	if (need + extra > j->srv->n_ctx)
		return perr_set(e, 400, param, "context_length_exceeded",
				"the prompt is %lld tokens; the context is %d", (long long)(need + extra),
				j->srv->n_ctx);
	j->prompt = malloc(sizeof(int32_t) * (size_t)(need + extra + 1));
	if (!j->prompt)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	if (extra)
		j->prompt[0] = loom_tokenizer_bos(tok);
	loom_tokenize(tok, text, len, add_special, true, j->prompt + extra, need);
	j->n_prompt = (int32_t)(need + extra);
	return 0;
}

static int prompt_ids(struct job *j, json_t *v, struct perr *e)
{
	int32_t n_vocab = loom_tokenizer_n_vocab(j->srv->tok);
	size_t i, n = json_array_size(v);
	json_t *x;

	if (n > (size_t)j->srv->n_ctx)
		return perr_set(e, 400, "prompt", "context_length_exceeded",
				"the prompt is %zu tokens; the context is %d", n, j->srv->n_ctx);
	j->prompt = malloc(sizeof(int32_t) * (n + 1));
	if (!j->prompt)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	json_array_foreach(v, i, x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) >= n_vocab)
			return perr_set(e, 400, "prompt", "invalid_value",
					"prompt[%zu] is not a token id in [0, %d)", i, n_vocab);
		j->prompt[i] = (int32_t)json_integer_value(x);
	}
	j->n_prompt = (int32_t)n;
	return 0;
}

/* prompt: a string, an array of one string, or an array of token ids. */
static int get_prompt(json_t *o, struct job *j, struct perr *e)
{
	json_t *v = member(o, "prompt");

	if (!v)
		return perr_set(e, 400, "prompt", "missing", "'prompt' is required");
	if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
		v = json_array_get(v, 0);
	if (json_is_string(v))
		return tokenize(j, json_string_value(v), json_string_length(v), true, "prompt", e);
	if (json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0)))
		return prompt_ids(j, v, e);
	return perr_set(e, 400, "prompt", "invalid_type",
			"'prompt' must be a string or an array of token ids");
}

/* content: a string, null, or an array of {"type":"text","text":...} parts;
 * the text goes into *out (malloc'd). */
static int message_text(json_t *c, size_t i, char **out, struct perr *e)
{
	struct loom_sbuf b = { 0 };
	json_t *part;
	size_t k;

	if (!c || json_is_null(c)) {
		*out = strdup("");
	} else if (json_is_string(c)) {
		*out = strdup(json_string_value(c));
	} else if (json_is_array(c)) {
		loom_sb_puts(&b, "");
		json_array_foreach(c, k, part) {
			json_t *t = json_object_get(part, "text");

			if (!json_is_object(part) || !json_is_string(json_object_get(part, "type")) ||
			    strcmp(json_string_value(json_object_get(part, "type")), "text") ||
			    !json_is_string(t)) {
				loom_sb_free(&b);
				return perr_set(e, 400, "messages", "invalid_value",
						"messages[%zu].content[%zu]: only text parts are supported", i, k);
			}
			loom_sb_putn(&b, json_string_value(t), json_string_length(t));
		}
		*out = b.failed ? NULL : b.s;
		if (b.failed)
			free(b.s);
	} else {
		return perr_set(e, 400, "messages", "invalid_type",
				"messages[%zu].content must be a string or an array of text parts", i);
	}
	return *out ? 0 : perr_set(e, 500, NULL, NULL, "out of memory");
}

static int render_chat(struct job *j, struct loom_chat_msg *msgs, size_t n, struct perr *e)
{
	char why[256];
	char *text;
	int rc;

	if (!j->srv->chat_ok)
		return perr_set(e, 500, NULL, "unsupported_chat_template", "%s", j->srv->chat_err);
	text = loom_chat_render(&j->srv->chat, msgs, n, true, why, sizeof(why));
	if (!text)
		return perr_set(e, 400, "messages", "invalid_value", "%s", why);
	rc = tokenize(j, text, strlen(text), false, "messages", e);
	free(text);
	return rc;
}

static int get_messages(json_t *o, struct job *j, struct perr *e)
{
	json_t *v = member(o, "messages"), *m;
	struct loom_chat_msg *msgs;
	size_t i, n;
	int rc = -1;

	if (!v)
		return perr_set(e, 400, "messages", "missing", "'messages' is required");
	if (!json_is_array(v) || json_array_size(v) == 0)
		return perr_set(e, 400, "messages", "invalid_type", "'messages' must be a non-empty array");
	n = json_array_size(v);
	msgs = calloc(n, sizeof(*msgs));
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
		msgs[i].content = text;
	}
	rc = render_chat(j, msgs, n, e);
out:
	for (i = 0; i < n; i++)
		free((char *)msgs[i].content);
	free(msgs);
	return rc;
}

static int get_max_tokens(json_t *o, struct job *j, struct perr *e)
{
	int32_t room = j->srv->n_ctx - j->n_prompt;
	const char *key = "max_tokens";
	long long mt = j->chat ? room : 16;

	if (j->chat && member(o, "max_completion_tokens"))
		key = "max_completion_tokens";
	if (get_int(o, key, 1, INT_MAX, &mt, e))
		return -1;
	if (room < 1 || mt > room)
		return perr_set(e, 400, key, "context_length_exceeded",
				"the prompt (%d tokens) + %s (%lld) exceeds the context (%d)",
				j->n_prompt, key, mt, j->srv->n_ctx);
	j->max_tokens = (int)mt;
	return 0;
}

int parse_request(struct job *j, const char *body, size_t len, bool chat, struct perr *e)
{
	json_error_t jerr;
	json_t *o = json_loadb(body, len, 0, &jerr);
	bool echo = false;
	int rc = -1;

	j->chat = chat;
	if (!o)
		return perr_set(e, 400, NULL, "invalid_json", "invalid JSON at line %d column %d: %s",
				jerr.line, jerr.column, jerr.text);
	if (!json_is_object(o)) {
		perr_set(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
		goto out;
	}
	if (member(o, "model") && !json_is_string(member(o, "model"))) {
		perr_set(e, 400, "model", "invalid_type", "'model' must be a string");
		goto out;
	}
	if (get_bool(o, "echo", &echo, e) || get_sampling(o, j, e) || get_stop(o, j, e) ||
	    get_stream(o, j, e) || get_spec(o, j, e))
		goto out;
	if (echo) {
		perr_set(e, 400, "echo", "unsupported", "'echo' is not supported");
		goto out;
	}
	if ((chat ? get_messages(o, j, e) : get_prompt(o, j, e)) || get_max_tokens(o, j, e))
		goto out;
	rc = 0;
out:
	json_decref(o);
	return rc;
}
