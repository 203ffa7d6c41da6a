/* `loom serve`: response_format, tools and tool_choice into a grammar and a
 * system-prompt section; the model's tool calls into OpenAI tool_calls. */
#include "serve_tools.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "srv_util.h"

#define HARMONY_BEGIN "<|channel|>commentary "

/* What each format writes around and in a call. */
static const struct tool_fmt {
	const char *name, *begin, *end, *args_key;
	bool list;     /* the calls as one JSON array after begin */
	int max_calls; /* 0: as the request allows */
} formats[] = {
	[SERVE_TOOLFMT_HERMES] = { "hermes", SERVE_TOOL_BEGIN, SERVE_TOOL_END, "arguments", false, 0 },
	[SERVE_TOOLFMT_LLAMA3] = { "llama3-json", "", "", "parameters", false, 1 },
	[SERVE_TOOLFMT_MISTRAL] = { "mistral", "[TOOL_CALLS]", "", "arguments", true, 0 },
	/* the grammar's "harmony" call: to=functions.NAME <|constrain|>json
	 * <|message|>ARGS between begin and end; one call a reply, as the
	 * model ends its turn with <|call|> */
	[SERVE_TOOLFMT_HARMONY] = { "harmony", HARMONY_BEGIN, "<|call|>", "harmony", false, 1 },
};

static const struct tool_fmt *fmt_of(int format)
{
	if (format < 0 || (size_t)format >= sizeof(formats) / sizeof(formats[0]))
		format = SERVE_TOOLFMT_HERMES;
	return &formats[format];
}

const char *serve_tool_format_name(int format)
{
	return fmt_of(format)->name;
}

/* The template's own words decide: Mistral's [TOOL_CALLS] with a JSON
 * list (not the newer name[ARGS]{...}), Hermes' <tool_call> holding JSON
 * (not the XML of <function=...> or GLM's <arg_key>), Llama 3.x's
 * {"name", "parameters"}. Anything else: Hermes' format, presented by
 * loom's own system-prompt section. */
int serve_tool_format_of(const char *src, bool *renders)
{
	int f = -1;

	if (src && strstr(src, "[TOOL_CALLS]") && !strstr(src, "[ARGS]"))
		f = SERVE_TOOLFMT_MISTRAL;
	else if (src && strstr(src, "<|channel|>") && strstr(src, "to=functions."))
		f = SERVE_TOOLFMT_HARMONY;
	else if (src && strstr(src, "<tool_call>") &&
		 (strstr(src, "\"name\"") || strstr(src, "name\\\"")) &&
		 !strstr(src, "<function=") && !strstr(src, "arg_key"))
		f = SERVE_TOOLFMT_HERMES;
	else if (src && strstr(src, "<|start_header_id|>") && strstr(src, "\"parameters\""))
		f = SERVE_TOOLFMT_LLAMA3;
	if (renders)
		*renders = f >= 0 && strstr(src, "tools");
	return f >= 0 ? f : SERVE_TOOLFMT_HERMES;
}

static json_t *member(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return v && !json_is_null(v) ? v : NULL;
}

/* Compiles kind/spec into r->grammar; a refusal is a 400 on param. */
static int compile(struct serve_req *r, const char *kind, json_t *spec, const char *param,
		   struct perr *e)
{
	char err[400];
	char *text = spec ? json_dumps(spec, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;

	if (spec && !text)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	r->grammar = loom_grammar_new(kind, text, text ? strlen(text) : 0, err, sizeof(err));
	free(text);
	if (!r->grammar)
		return perr_set(e, 400, param, "invalid_value", "%s", err);
	return 0;
}

static int response_format(json_t *o, struct serve_req *r, struct perr *e)
{
	json_t *rf = member(o, "response_format"), *js, *schema;
	const char *type;

	if (!rf)
		return 0;
	type = json_string_value(json_object_get(rf, "type"));
	if (!json_is_object(rf) || !type)
		return perr_set(e, 400, "response_format", "invalid_type",
				"'response_format' must be an object with a string 'type'");
	if (!strcmp(type, "text"))
		return 0;
	if (!strcmp(type, "json_object"))
		return compile(r, "json_object", NULL, "response_format", e);
	if (strcmp(type, "json_schema"))
		return perr_set(e, 400, "response_format", "invalid_value",
				"response_format type '%.64s' is not one of text, json_object, json_schema",
				type);
	js = member(rf, "json_schema");
	if (!json_is_object(js))
		return perr_set(e, 400, "response_format", "invalid_type",
				"response_format.json_schema must be an object");
	if (!json_is_string(json_object_get(js, "name")))
		return perr_set(e, 400, "response_format", "missing",
				"response_format.json_schema.name must be a string");
	if (member(js, "strict") && !json_is_boolean(member(js, "strict")))
		return perr_set(e, 400, "response_format", "invalid_type",
				"response_format.json_schema.strict must be a boolean");
	schema = member(js, "schema");
	if (!schema)
		return compile(r, "json", NULL, "response_format", e);
	return compile(r, "json_schema", schema, "response_format", e);
}

/* A function name as OpenAI's API defines it: 1 to 64 of a-z, A-Z, 0-9,
 * '_' and '-'. Names go into the prompt's tools text and the grammar, so
 * a newline or special-token text ("<|im_end|>") must not pass. */
static bool tool_name_ok(json_t *name)
{
	const char *s = json_string_value(name);
	size_t len = json_string_length(name);

	if (!s || len == 0 || len > 64)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (!(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && !(c >= '0' && c <= '9') &&
		    c != '_' && c != '-')
			return false;
	}
	return true;
}

/* The function of tools[i] after checking its shape, or NULL with e set. */
static json_t *tool_function(json_t *t, size_t i, struct perr *e)
{
	json_t *fn = json_object_get(t, "function");
	const char *type = json_string_value(json_object_get(t, "type"));
	json_t *name = json_object_get(fn, "name");

	if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn)) {
		perr_set(e, 400, "tools", "invalid_value",
			 "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
		return NULL;
	}
	if (!tool_name_ok(name)) {
		perr_set(e, 400, "tools", "invalid_value", "tools[%zu].function.name must be 1 to 64 letters, digits, '_' or '-'", i);
		return NULL;
	}
	if (member(fn, "parameters") && !json_is_object(member(fn, "parameters"))) {
		perr_set(e, 400, "tools", "invalid_value", "tools[%zu].function.parameters must be an object", i);
		return NULL;
	}
	return fn;
}

/* tool_choice: "none" | "auto" | "required" | {"type": "function",
 * "function": {"name": ...}}; *named gets the name of the last form. */
static int tool_choice(json_t *o, json_t *tools, int *mode, const char **named, struct perr *e)
{
	json_t *tc = member(o, "tool_choice");
	const char *s = json_string_value(tc), *name;
	size_t i;
	json_t *t;

	*mode = tools ? SERVE_TOOLS_AUTO : SERVE_TOOLS_OFF;
	*named = NULL;
	if (!tc)
		return 0;
	if (s && !strcmp(s, "none")) {
		*mode = SERVE_TOOLS_OFF;
		return 0;
	}
	if (!tools)
		return perr_set(e, 400, "tool_choice", "invalid_value",
				"'tool_choice' needs 'tools'");
	if (s && !strcmp(s, "auto"))
		return 0;
	if (s && !strcmp(s, "required")) {
		*mode = SERVE_TOOLS_REQUIRED;
		return 0;
	}
	name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
	if (s || !json_is_object(tc) || !name)
		return perr_set(e, 400, "tool_choice", "invalid_value",
				"'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
	json_array_foreach(tools, i, t) {
		if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
			    name)) {
			*mode = SERVE_TOOLS_REQUIRED;
			*named = name;
			return 0;
		}
	}
	return perr_set(e, 400, "tool_choice", "invalid_value",
			"tool_choice names '%.64s', which is not among the tools", name);
}

/* The system-prompt section that presents the tools. */
static char *tools_section(json_t *tools, int mode, const char *named)
{
	struct sbuf b = { 0 };
	size_t i;
	json_t *t;

	sb_puts(&b, "# Tools\n\nYou may call one or more functions to help with the user's request. "
		    "The functions are described with JSON Schema inside <tools></tools>:\n<tools>");
	json_array_foreach(tools, i, t) {
		char *s = json_dumps(t, JSON_COMPACT);

		if (!s) {
			sb_free(&b);
			return NULL;
		}
		sb_puts(&b, "\n");
		sb_puts(&b, s);
		free(s);
	}
	sb_puts(&b, "\n</tools>\n\nTo call a function, reply with a JSON object holding its name "
		    "and arguments inside <tool_call></tool_call> tags, one block per call:\n"
		    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <arguments-object>}\n</tool_call>");
	if (named) {
		sb_puts(&b, "\n\nCall the function ");
		sb_puts(&b, named);
		sb_puts(&b, " now.");
	} else if (mode == SERVE_TOOLS_REQUIRED) {
		sb_puts(&b, "\n\nCall at least one function now.");
	}
	if (b.failed) {
		sb_free(&b);
		return NULL;
	}
	return b.s;
}

/* Calls in one reply: one per tool offered (at most 4) when parallel
 * calls are allowed (OpenAI's default), else one. A small model that may
 * call again tends to repeat its call until max_tokens. */
static int max_calls(json_t *o, json_t *tools, const char *named)
{
	size_t n = json_array_size(tools);

	if (named || json_is_false(member(o, "parallel_tool_calls")))
		return 1;
	return n < 4 ? (int)n : 4;
}

static int tools_grammar(json_t *tools, int mode, const char *named, int calls,
			 const struct tool_fmt *f, struct serve_req *r, struct perr *e)
{
	json_t *spec = json_pack("{s:[],s:s,s:s,s:s,s:i,s:s,s:b}", "tools", "mode",
				 mode == SERVE_TOOLS_AUTO ? "auto" : "required", "begin", f->begin,
				 "end", f->end, "max_calls", f->max_calls ? f->max_calls : calls,
				 "args_key", f->args_key, "list", f->list);
	json_t *list = json_object_get(spec, "tools"), *t;
	size_t i;
	int rc;

	if (!spec)
		return perr_set(e, 500, NULL, NULL, "out of memory");
	json_array_foreach(tools, i, t) {
		json_t *fn = json_object_get(t, "function"), *name = json_object_get(fn, "name");
		json_t *one;

		if (named && strcmp(json_string_value(name), named))
			continue;
		one = json_pack("{s:O}", "name", name);
		if (one && member(fn, "parameters"))
			json_object_set(one, "parameters", member(fn, "parameters"));
		json_array_append_new(list, one);
	}
	rc = compile(r, "tool_calls", spec, "tools", e);
	json_decref(spec);
	return rc;
}

int serve_structured_parse(json_t *o, bool chat, int format, bool template_tools,
			   struct serve_req *r, char **tools_text, struct perr *e)
{
	json_t *tools = member(o, "tools"), *t;
	const char *named, *rf_type;
	int mode;
	size_t i;

	*tools_text = NULL;
	if (tools && !chat)
		return perr_set(e, 400, "tools", "unsupported",
				"'tools' belongs to /v1/chat/completions");
	if (tools && (!json_is_array(tools) || json_array_size(tools) == 0))
		return perr_set(e, 400, "tools", "invalid_type", "'tools' must be a non-empty array");
	json_array_foreach(tools, i, t)
		if (!tool_function(t, i, e))
			return -1;
	if (member(o, "parallel_tool_calls") && !json_is_boolean(member(o, "parallel_tool_calls")))
		return perr_set(e, 400, "parallel_tool_calls", "invalid_type",
				"'parallel_tool_calls' must be a boolean");
	if (tool_choice(o, tools, &mode, &named, e))
		return -1;
	if (mode == SERVE_TOOLS_OFF)
		return response_format(o, r, e);
	rf_type = json_string_value(json_object_get(member(o, "response_format"), "type"));
	if (member(o, "response_format") && (!rf_type || strcmp(rf_type, "text")))
		return perr_set(e, 400, "response_format", "unsupported",
				"'response_format' together with tools is supported only with tool_choice \"none\"");
	r->tool_mode = mode;
	r->tool_format = template_tools ? format : SERVE_TOOLFMT_HERMES;
	if (!template_tools) {
		*tools_text = tools_section(tools, mode, named);
		if (!*tools_text)
			return perr_set(e, 500, NULL, NULL, "out of memory");
	}
	if (tools_grammar(tools, mode, named, max_calls(o, tools, named), fmt_of(r->tool_format),
			  r, e)) {
		free(*tools_text); /* a refusal leaves the caller nothing to free */
		*tools_text = NULL;
		return -1;
	}
	return 0;
}

int serve_tool_kind(int format, const char *text, size_t len)
{
	const char *begin = fmt_of(format)->begin;
	size_t m = strlen(begin);

	if (format == SERVE_TOOLFMT_HARMONY && len >= 9 && !memcmp(text, "<|start|>", 9))
		return 2; /* a call with its recipient before the channel */
	if (format != SERVE_TOOLFMT_HERMES) { /* the grammar allows whitespace first */
		while (len && strchr(" \t\r\n", *text)) {
			text++;
			len--;
		}
		if (!len)
			return 0;
	}
	if (!m) /* a bare call: JSON */
		return *text == '{' ? 2 : 1;
	if (len < m)
		return memcmp(text, begin, len) ? 1 : 0;
	return memcmp(text, begin, m) ? 1 : 2;
}

/* A call id: "call_" and 16 hex digits; Mistral's templates take only
 * 9 letters and digits. */
static void call_id(int format, char *out, size_t cap)
{
	static _Atomic unsigned long long counter;
	static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	struct timespec ts;
	unsigned long long x;

	clock_gettime(CLOCK_REALTIME, &ts);
	x = ((unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec) *
	    0x9e3779b97f4a7c15ULL;
	x ^= (x >> 31) ^ (++counter * 0xbf58476d1ce4e5b9ULL);
	if (format != SERVE_TOOLFMT_MISTRAL || cap < 10) {
		snprintf(out, cap, "call_%016llx", x);
		return;
	}
	for (int i = 0; i < 9; i++, x /= 62)
		out[i] = alnum[x % 62];
	out[9] = '\0';
}

/* One call (a JSON object c, borrowed) as an OpenAI tool call, or NULL. */
static json_t *call_openai(int format, json_t *c)
{
	json_t *name = json_object_get(c, "name"), *out = NULL;
	json_t *args = json_object_get(c, fmt_of(format)->args_key);
	char id[40], *a;

	if (json_is_string(name) && args && (a = json_dumps(args, JSON_ENCODE_ANY | JSON_COMPACT))) {
		call_id(format, id, sizeof(id));
		out = json_pack("{s:s,s:s,s:{s:O,s:s}}", "id", id, "type", "function", "function",
				"name", name, "arguments", a);
		free(a);
	}
	return out;
}

/* One call's JSON text as an OpenAI tool call, or NULL. */
static json_t *one_call(const char *s, size_t n)
{
	json_t *c = json_loadb(s, n, 0, NULL), *out = call_openai(SERVE_TOOLFMT_HERMES, c);

	json_decref(c);
	return out;
}

/* Llama 3.x's one bare call, or Mistral's [TOOL_CALLS] and a list. */
static json_t *json_calls(int format, const char *text, size_t len)
{
	const char *begin = fmt_of(format)->begin;
	json_t *v, *calls = json_array(), *c;
	size_t i;

	while (len && strchr(" \t\r\n", *text)) {
		text++;
		len--;
	}
	if (len < strlen(begin) || memcmp(text, begin, strlen(begin)))
		goto out_not;
	v = json_loadb(text + strlen(begin), len - strlen(begin), JSON_DECODE_ANY, NULL);
	if (format == SERVE_TOOLFMT_LLAMA3) { /* one object: a list of one */
		json_t *one = json_array();

		json_array_append(one, v);
		json_decref(v);
		v = json_is_object(json_array_get(one, 0)) ? one : NULL;
		if (!v)
			json_decref(one);
	}
	if (!json_is_array(v)) {
		json_decref(v);
		goto out_not;
	}
	json_array_foreach(v, i, c) {
		json_t *one = json_is_object(c) ? call_openai(format, c) : NULL;

		if (!one || json_array_append_new(calls, one)) {
			json_decref(v);
			goto out_not;
		}
	}
	json_decref(v);
	if (calls && json_array_size(calls) > 0)
		return calls;
out_not:
	json_decref(calls);
	return NULL;
}

/* Whether text[*i..len) starts with word; if so *i moves past it. */
static bool take(const char *text, size_t len, size_t *i, const char *word)
{
	size_t n = strlen(word);

	if (len - *i < n || memcmp(text + *i, word, n))
		return false;
	*i += n;
	return true;
}

static void skip_ws(const char *text, size_t len, size_t *i)
{
	while (*i < len && strchr(" \t\r\n", text[*i]))
		(*i)++;
}

/* " to=functions.NAME": NAME's bounds, or false. */
static bool harmony_recipient(const char *text, size_t len, size_t *i, size_t *n0, size_t *n1)
{
	skip_ws(text, len, i);
	if (!take(text, len, i, "to=functions."))
		return false;
	*n0 = *i;
	while (*i < len && !strchr(" \t\r\n<", text[*i]))
		(*i)++;
	*n1 = *i;
	return *n1 > *n0;
}

/*
 * One harmony call from text[*i..]: [<|start|>assistant] then either
 * <|channel|>commentary to=functions.NAME [<|constrain|>json | json]
 * <|message|>ARGS, or the recipient first (assistant to=functions.NAME
 * <|channel|>commentary [json]<|message|>ARGS); ARGS a JSON object ending
 * at <|call|> (or the text's end, where <|call|> stopped generation).
 */
static json_t *harmony_call(const char *text, size_t len, size_t *i)
{
	size_t n0 = 0, n1 = 0, a0, a1;
	const char *end;
	json_t *args, *out = NULL;
	char id[40], *name, *a;
	bool named;

	skip_ws(text, len, i);
	take(text, len, i, "<|start|>assistant");
	named = harmony_recipient(text, len, i, &n0, &n1);
	if (!take(text, len, i, "<|channel|>commentary") ||
	    (!named && !harmony_recipient(text, len, i, &n0, &n1)))
		return NULL;
	skip_ws(text, len, i);
	if (!take(text, len, i, "<|constrain|>json"))
		take(text, len, i, "json");
	if (!take(text, len, i, "<|message|>"))
		return NULL;
	a0 = *i;
	end = memmem(text + a0, len - a0, "<|call|>", 8);
	a1 = end ? (size_t)(end - text) : len;
	*i = end ? a1 + 8 : len;
	args = json_loadb(text + a0, a1 - a0, 0, NULL);
	name = json_is_object(args) ? strndup(text + n0, n1 - n0) : NULL;
	a = name ? json_dumps(args, JSON_COMPACT) : NULL;
	if (a) {
		call_id(SERVE_TOOLFMT_HARMONY, id, sizeof(id));
		out = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function",
				"name", name, "arguments", a);
	}
	free(a);
	free(name);
	json_decref(args);
	return out;
}

/* gpt-oss's harmony calls, one or more. */
static json_t *harmony_calls(const char *text, size_t len)
{
	json_t *calls = json_array(), *c;
	size_t i = 0;

	while (calls) {
		const char *end;

		skip_ws(text, len, &i);
		if (i == len)
			break;
		/* reasoning before the call (the analysis channel) is not a call */
		if (take(text, len, &i, "<|channel|>analysis") ||
		    (take(text, len, &i, "<|start|>assistant<|channel|>analysis"))) {
			end = memmem(text + i, len - i, "<|end|>", 7);
			if (!end)
				goto out_not;
			i = (size_t)(end - text) + 7;
			continue;
		}
		c = harmony_call(text, len, &i);
		if (!c || json_array_append_new(calls, c))
			goto out_not;
	}
	if (calls && json_array_size(calls) > 0)
		return calls;
out_not:
	json_decref(calls);
	return NULL;
}

json_t *serve_tool_calls(int format, const char *text, size_t len)
{
	size_t bl = strlen(SERVE_TOOL_BEGIN), el = strlen(SERVE_TOOL_END), i = 0;
	json_t *calls;

	if (format == SERVE_TOOLFMT_HARMONY)
		return harmony_calls(text, len);
	if (format != SERVE_TOOLFMT_HERMES)
		return json_calls(format, text, len);
	calls = json_array();
	while (calls) {
		const char *end;
		json_t *c;

		while (i < len && strchr(" \t\r\n", text[i]))
			i++;
		if (i == len)
			break;
		if (len - i < bl || memcmp(text + i, SERVE_TOOL_BEGIN, bl))
			goto out_not;
		i += bl;
		end = memmem(text + i, len - i, SERVE_TOOL_END, el);
		if (!end)
			goto out_not;
		c = one_call(text + i, (size_t)(end - (text + i)));
		if (!c)
			goto out_not;
		json_array_append_new(calls, c);
		i = (size_t)(end - text) + el;
	}
	if (calls && json_array_size(calls) > 0)
		return calls;
out_not:
	json_decref(calls);
	return NULL;
}

/* The history's tool calls as <tool_call> blocks after content. */
static int assistant_calls(json_t *calls, size_t i, char **content, struct perr *e)
{
	struct sbuf b = { 0 };
	size_t k;
	json_t *c;

	sb_puts(&b, *content);
	json_array_foreach(calls, k, c) {
		json_t *fn = json_object_get(c, "function");
		const char *name = json_string_value(json_object_get(fn, "name"));
		const char *args = json_string_value(json_object_get(fn, "arguments"));
		json_t *parsed = args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
		json_t *call;
		char *s;

		if (!name) {
			json_decref(parsed);
			sb_free(&b);
			return perr_set(e, 400, "messages", "invalid_value",
					"messages[%zu].tool_calls[%zu].function.name must be a string", i, k);
		}
		call = json_pack("{s:s,s:o}", "name", name, "arguments",
				 parsed ? parsed : json_string(args ? args : ""));
		s = call ? json_dumps(call, JSON_ENCODE_ANY) : NULL;
		json_decref(call);
		if (b.len)
			sb_puts(&b, "\n");
		sb_puts(&b, SERVE_TOOL_BEGIN "\n");
		sb_puts(&b, s ? s : "{}");
		sb_puts(&b, "\n" SERVE_TOOL_END);
		free(s);
	}
	if (b.failed || !b.s) {
		sb_free(&b);
		return perr_set(e, 500, NULL, NULL, "out of memory");
	}
	free(*content);
	*content = b.s;
	return 0;
}

int serve_tool_history(json_t *msg, size_t i, const char **role, char **content,
		       struct perr *e)
{
	json_t *calls = member(msg, "tool_calls");

	if (!strcmp(*role, "tool")) {
		struct sbuf b = { 0 };

		sb_puts(&b, "<tool_response>\n");
		sb_puts(&b, *content);
		sb_puts(&b, "\n</tool_response>");
		if (b.failed || !b.s) {
			sb_free(&b);
			return perr_set(e, 500, NULL, NULL, "out of memory");
		}
		free(*content);
		*content = b.s;
		*role = "user";
		return 0;
	}
	if (!calls || strcmp(*role, "assistant"))
		return 0;
	if (!json_is_array(calls))
		return perr_set(e, 400, "messages", "invalid_type",
				"messages[%zu].tool_calls must be an array", i);
	return assistant_calls(calls, i, content, e);
}
