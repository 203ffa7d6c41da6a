/* Request parsing (server/serve_request.c) alone, with a fake model: one
 * token per byte, a chat template that writes "role:content\n", and two
 * offered strategies. Valid bodies must come out field for field; bad ones
 * must fail with the HTTP status, param and code the OpenAI API uses. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_api.h"
#include "serve_ollama.h"
#include "serve_request.h"
#include "serve_tools.h"

#define FAKE_BOS 1

/* One token per byte (the byte mod 100); add_special puts BOS first. Text
 * starting with "FAIL" cannot be tokenized. */
static int64_t fake_tokenize(void *user, const char *text, size_t len, bool add_special,
			     int32_t *ids, int64_t cap)
{
	int64_t n = 0;
	size_t i;

	if (len >= 4 && !memcmp(text, "FAIL", 4))
		return -1;
	if (add_special && n++ < cap)
		ids[0] = FAKE_BOS;
	for (i = 0; i < len; i++, n++)
		if (n < cap)
			ids[n] = (unsigned char)text[i] % 100;
	return n;
}

/* "role:content\n" per message; the role "bogus" is refused. */
static char *fake_render(void *user, const struct serve_msg *msgs, size_t n, char *why,
			 size_t whylen)
{
	size_t i, len = 1;
	char *s;

	for (i = 0; i < n; i++) {
		if (!strcmp(msgs[i].role, "bogus")) {
			snprintf(why, whylen, "unknown role 'bogus'");
			return NULL;
		}
		len += strlen(msgs[i].role) + strlen(msgs[i].content) + 2;
	}
	s = malloc(len);
	s[0] = '\0';
	for (i = 0; i < n; i++) {
		strcat(s, msgs[i].role);
		strcat(s, ":");
		strcat(s, msgs[i].content);
		strcat(s, "\n");
	}
	return s;
}

static const char *const spec_names[] = { "ngram", "layerskip" };

static struct serve_req_ctx fake_ctx(void)
{
	return (struct serve_req_ctx){
		.n_vocab = 100,
		.n_ctx = 64,
		.max_n = SERVE_REQ_MAX_N,
		.max_stop = SERVE_REQ_MAX_STOP,
		.tokenize = fake_tokenize,
		.render = fake_render,
		.chat_err = "no template",
		.chat_bos = FAKE_BOS,
		.spec_names = spec_names,
		.n_spec = 2,
	};
}

static void parse_ok(const struct serve_req_ctx *ctx, const char *body, bool chat,
		     struct serve_req *r)
{
	struct perr e = { 0 };

	ck_assert_msg(serve_req_parse(ctx, body, strlen(body), chat, r, &e) == 0,
		      "%s: %d %s", body, e.status, e.msg);
}

/* The prompt as the fake tokenizer writes text. */
static void assert_prompt(const struct serve_req *r, bool bos, const char *text)
{
	size_t i, off = bos ? 1 : 0;

	ck_assert_int_eq(r->n_prompt, (int32_t)(strlen(text) + off));
	if (bos)
		ck_assert_int_eq(r->prompt[0], FAKE_BOS);
	for (i = 0; text[i]; i++)
		ck_assert_int_eq(r->prompt[i + off], (unsigned char)text[i] % 100);
}

START_TEST(completion_every_field)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;

	parse_ok(&ctx, "{\"model\": \"m\", \"prompt\": \"abc\", \"temperature\": 0.5,"
		 " \"top_p\": 0.9, \"min_p\": 0.1, \"presence_penalty\": 0.5,"
		 " \"frequency_penalty\": -0.5, \"repetition_penalty\": 1.25, \"top_k\": 20,"
		 " \"seed\": 42, \"n\": 3, \"stop\": [\"x\", \"\", \"yz\"], \"stream\": true,"
		 " \"stream_options\": {\"include_usage\": true},"
		 " \"speculative\": {\"name\": \"layerskip.so\", \"max_draft\": 4},"
		 " \"max_tokens\": 10, \"echo\": false, \"logprobs\": null}", false, &r);
	ck_assert(!r.chat);
	ck_assert_float_eq(r.sp.temp, 0.5f);
	ck_assert_float_eq(r.sp.top_p, 0.9f);
	ck_assert_float_eq(r.sp.min_p, 0.1f);
	ck_assert_float_eq(r.sp.presence_penalty, 0.5f);
	ck_assert_float_eq(r.sp.frequency_penalty, -0.5f);
	ck_assert_float_eq(r.sp.repeat_penalty, 1.25f);
	ck_assert_int_eq(r.sp.top_k, 20);
	ck_assert(r.seed_given);
	ck_assert_uint_eq(r.sp.seed, 42);
	ck_assert_int_eq(r.n, 3);
	ck_assert_int_eq(r.n_stop, 2); /* the empty one is dropped */
	ck_assert_str_eq(r.stop[0], "x");
	ck_assert_str_eq(r.stop[1], "yz");
	ck_assert(r.stream && r.include_usage);
	ck_assert_ptr_eq(r.spec, spec_names[1]);
	ck_assert_int_eq(r.spec_max_draft, 4);
	ck_assert_int_eq(r.max_tokens, 10);
	assert_prompt(&r, true, "abc");
	serve_req_free(&r);
	ck_assert_ptr_null(r.prompt);
}
END_TEST

START_TEST(completion_defaults)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct loom_sampler_params want;
	struct serve_req r;

	parse_ok(&ctx, "{\"prompt\": \"hi\", \"temperature\": null, \"stop\": \"!\", \"spec\": \"ngram\"}",
		 false, &r);
	/* omitted sampling fields: the same defaults as loom run */
	loom_sampler_defaults(&want);
	ck_assert_float_eq(r.sp.temp, want.temp);
	ck_assert_int_eq(r.sp.top_k, want.top_k);
	ck_assert_float_eq(r.sp.top_p, want.top_p);
	ck_assert_float_eq(r.sp.min_p, want.min_p);
	ck_assert_float_eq(r.sp.repeat_penalty, want.repeat_penalty);
	ck_assert_float_eq(r.sp.presence_penalty, want.presence_penalty);
	ck_assert_float_eq(r.sp.frequency_penalty, want.frequency_penalty);
	ck_assert_int_eq(r.sp.penalty_last_n, want.penalty_last_n);
	ck_assert(!r.seed_given);
	ck_assert_int_eq(r.n, 1);
	ck_assert_int_eq(r.max_tokens, 16);
	ck_assert(!r.stream && !r.include_usage);
	ck_assert_int_eq(r.n_stop, 1);
	ck_assert_str_eq(r.stop[0], "!");
	ck_assert_ptr_eq(r.spec, spec_names[0]);
	ck_assert_int_eq(r.spec_max_draft, 0);
	assert_prompt(&r, true, "hi");
	serve_req_free(&r);
}
END_TEST

START_TEST(completion_token_ids)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;

	parse_ok(&ctx, "{\"prompt\": [5, 0, 99], \"max_tokens\": 61}", false, &r);
	ck_assert_int_eq(r.n_prompt, 3);
	ck_assert_int_eq(r.prompt[0], 5);
	ck_assert_int_eq(r.prompt[1], 0);
	ck_assert_int_eq(r.prompt[2], 99);
	ck_assert_int_eq(r.max_tokens, 61); /* exactly fills the context */
	serve_req_free(&r);
	parse_ok(&ctx, "{\"prompt\": [\"one string\"]}", false, &r);
	assert_prompt(&r, true, "one string");
	serve_req_free(&r);
}
END_TEST

START_TEST(chat_messages)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;

	parse_ok(&ctx, "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"},"
		 " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"h\"},"
		 " {\"type\": \"text\", \"text\": \"i\"}]}, {\"role\": \"assistant\", \"content\": null}],"
		 " \"max_completion_tokens\": 5}", true, &r);
	ck_assert(r.chat);
	assert_prompt(&r, true, "system:s\nuser:hi\nassistant:\n");
	ck_assert_int_eq(r.max_tokens, 5);
	serve_req_free(&r);
	/* no max_tokens: the rest of the context; no BOS where the model adds none */
	ctx.chat_bos = -1;
	parse_ok(&ctx, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", true, &r);
	assert_prompt(&r, false, "user:x\n");
	ck_assert_int_eq(r.max_tokens, 64 - 7);
	serve_req_free(&r);
}
END_TEST

START_TEST(spec_default)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;

	ctx.spec_default = spec_names[0];
	parse_ok(&ctx, "{\"prompt\": \"a\"}", false, &r);
	ck_assert_ptr_eq(r.spec, spec_names[0]);
	serve_req_free(&r);
	parse_ok(&ctx, "{\"prompt\": \"a\", \"speculative\": \"none\"}", false, &r);
	ck_assert_ptr_null(r.spec);
	serve_req_free(&r);
}
END_TEST

static const struct bad {
	bool chat;
	const char *body;
	int status;
	const char *param; /* "" for none */
	const char *code;  /* NULL for none */
} bad[] = {
	{ false, "{\"prompt\": ", 400, "", "invalid_json" },
	{ false, "[1, 2]", 400, "", "invalid_json" },
	{ false, "{\"prompt\": \"a\", \"model\": 3}", 400, "model", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"temperature\": \"hot\"}", 400, "temperature", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"temperature\": 2.5}", 400, "temperature", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"top_p\": 0}", 400, "top_p", "invalid_value" },
	/* logit_bias: ids inside the vocabulary (100 here), biases in
	 * [-100, 100], and a non-zero bias refused rather than ignored */
	{ false, "{\"prompt\": \"a\", \"logit_bias\": {\"100\": 1}}", 400, "logit_bias", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"logit_bias\": {\"-1\": 0}}", 400, "logit_bias", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"logit_bias\": {\"99999999999999999999\": 0}}", 400, "logit_bias", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"logit_bias\": {\"5x\": 0}}", 400, "logit_bias", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"logit_bias\": {\"5\": 101}}", 400, "logit_bias", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"logit_bias\": {\"5\": 3}}", 400, "logit_bias", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"logit_bias\": [1]}", 400, "logit_bias", "invalid_type" },
	/* tool names: OpenAI's [a-zA-Z0-9_-]{1,64}, so no newline or special
	 * token reaches the prompt's tools text */
	{ true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\\nb\"}}]}", 400, "tools", "invalid_value" },
	{ true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"<|im_end|>\"}}]}", 400, "tools", "invalid_value" },
	{ true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}}]}", 400, "tools", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"min_p\": -0.1}", 400, "min_p", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"presence_penalty\": 3}", 400, "presence_penalty", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"frequency_penalty\": -3}", 400, "frequency_penalty", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"repetition_penalty\": 0}", 400, "repetition_penalty", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"top_k\": -5}", 400, "top_k", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"top_k\": 101}", 400, "top_k", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"top_k\": 1.5}", 400, "top_k", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"seed\": 1.5}", 400, "seed", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"n\": 0}", 400, "n", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"n\": 9}", 400, "n", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"stop\": 3}", 400, "stop", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"stop\": [\"a\", 3]}", 400, "stop", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"stop\": [\"1\", \"2\", \"3\", \"4\", \"5\"]}", 400, "stop", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"stream\": \"yes\"}", 400, "stream", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"stream_options\": 1}", 400, "stream_options", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": 1}}", 400, "include_usage", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"speculative\": \"nosuch\"}", 400, "speculative", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"spec\": 3}", 400, "spec", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"speculative\": {\"max_draft\": 2}}", 400, "speculative", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"speculative\": {\"name\": \"ngram\", \"max_draft\": 0}}", 400, "max_draft", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"logprobs\": 21}", 400, "logprobs", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"logprobs\": true}", 400, "logprobs", "invalid_type" },
	{ false, "{\"prompt\": [[1, 2], [3, 100]]}", 400, "prompt", "invalid_value" },
	{ false, "{\"prompt\": [\"a\", 5]}", 400, "prompt", "invalid_value" },
	{ false, "{\"prompt\": [\"a\", []]}", 400, "prompt", "invalid_value" },
	{ false, "{\"prompt\": [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"], \"n\": 8}",
	  400, "n", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"max_tokens\": 0, \"echo\": false}", 400, "max_tokens", "invalid_value" },
	{ true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
	  400, "top_logprobs", "invalid_value" },
	{ true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 21}",
	  400, "top_logprobs", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"echo\": 1}", 400, "echo", "invalid_type" },
	{ false, "{}", 400, "prompt", "missing" },
	{ false, "{\"prompt\": 3}", 400, "prompt", "invalid_type" },
	{ false, "{\"prompt\": []}", 400, "prompt", "invalid_type" },
	{ false, "{\"prompt\": [1, 100]}", 400, "prompt", "invalid_value" },
	{ false, "{\"prompt\": [1, -1]}", 400, "prompt", "invalid_value" },
	{ false, "{\"prompt\": [1, \"a\"]}", 400, "prompt", "invalid_value" },
	{ false, "{\"prompt\": \"FAIL\"}", 400, "prompt", "invalid_value" },
	{ false, "{\"prompt\": \"0123456789012345678901234567890123456789012345678901234567890123456789\"}",
	  400, "prompt", "context_length_exceeded" },
	{ false, "{\"prompt\": \"a\", \"max_tokens\": 0}", 400, "max_tokens", "invalid_value" },
	{ false, "{\"prompt\": \"a\", \"max_tokens\": \"5\"}", 400, "max_tokens", "invalid_type" },
	{ false, "{\"prompt\": \"a\", \"max_tokens\": 63}", 400, "max_tokens", "context_length_exceeded" },
	{ true, "{}", 400, "messages", "missing" },
	{ true, "{\"messages\": []}", 400, "messages", "invalid_type" },
	{ true, "{\"messages\": {\"role\": \"user\"}}", 400, "messages", "invalid_type" },
	{ true, "{\"messages\": [1]}", 400, "messages", "invalid_type" },
	{ true, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages", "invalid_type" },
	{ true, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages", "invalid_type" },
	{ true, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
	  400, "messages", "invalid_value" },
	{ true, "{\"messages\": [{\"role\": \"bogus\", \"content\": \"x\"}]}", 400, "messages", "invalid_value" },
	{ true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 100}",
	  400, "max_completion_tokens", "context_length_exceeded" },
};

/* Prompt arrays: one prompt per entry (strings or token ids), choices
 * prompt-major; logprobs and echo; max_tokens 0 only with echo. */
START_TEST(prompt_arrays_and_logprobs)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;

	parse_ok(&ctx, "{\"prompt\": [\"ab\", [7, 8, 9]], \"n\": 2, \"logprobs\": 3, \"echo\": true,"
		 " \"max_tokens\": 0}", false, &r);
	ck_assert_int_eq(r.n_prompts, 2);
	ck_assert_int_eq(r.n, 2);
	ck_assert_int_eq(r.prompt_lens[1], 3);
	ck_assert_int_eq(r.prompts[1][2], 9);
	ck_assert_ptr_eq(r.prompt, r.prompts[0]);
	ck_assert(r.logprobs && r.echo);
	ck_assert_int_eq(r.top_logprobs, 3);
	ck_assert_int_eq(r.max_tokens, 0);
	serve_req_free(&r);
	parse_ok(&ctx, "{\"prompt\": [[1], [2, 3]]}", false, &r);
	ck_assert_int_eq(r.n_prompts, 2);
	ck_assert(!r.logprobs && !r.echo);
	serve_req_free(&r);
	parse_ok(&ctx, "{\"prompt\": \"a\", \"logprobs\": 0}", false, &r);
	ck_assert(r.logprobs);
	ck_assert_int_eq(r.top_logprobs, 0);
	serve_req_free(&r);
	parse_ok(&ctx, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
		 " \"logprobs\": true, \"top_logprobs\": 20}", true, &r);
	ck_assert(r.logprobs);
	ck_assert_int_eq(r.top_logprobs, 20);
	ck_assert_int_eq(r.n_prompts, 1);
	serve_req_free(&r);
}
END_TEST

/* /v1/embeddings bodies: every input shape, the format, and errors that
 * name the input. */
START_TEST(embedding_inputs)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_embed_req r;
	struct perr e;
	static const char *const bad_bodies[] = {
		"{}", "{\"input\": 3}", "{\"input\": []}", "{\"input\": [1, 100]}",
		"{\"input\": [\"a\", [1, -1]]}", "{\"input\": \"a\", \"encoding_format\": \"hex\"}",
		"{\"input\": \"a\", \"model\": \"other\"}", "{\"input\": \"a\", \"dimensions\": 8}",
		"{\"input\": \"FAIL\"}", "[\"a\"]",
	};
	static const char *const params[] = {
		"input", "input", "input", "input", "input", "encoding_format", "model",
		"dimensions", "input", "",
	};

	static const char *const names[] = { "m" };
	const char *body;

	ctx.model_names = names;
	ctx.n_model_names = 1;
	body = "{\"input\": \"ab\", \"model\": \"m\"}";
	ck_assert_int_eq(serve_embed_parse(&ctx, body, strlen(body), &r, &e), 0);
	ck_assert_int_eq(r.n_inputs, 1);
	ck_assert(!r.base64);
	serve_embed_free(&r);
	body = "{\"input\": [\"a\", [5, 6]], \"encoding_format\": \"base64\"}";
	ck_assert_int_eq(serve_embed_parse(&ctx, body, strlen(body), &r, &e), 0);
	ck_assert_int_eq(r.n_inputs, 2);
	ck_assert_int_eq(r.input_lens[1], 2);
	ck_assert_int_eq(r.inputs[1][1], 6);
	ck_assert(r.base64);
	serve_embed_free(&r);
	body = "{\"input\": [4, 5]}";
	ck_assert_int_eq(serve_embed_parse(&ctx, body, strlen(body), &r, &e), 0);
	ck_assert_int_eq(r.n_inputs, 1);
	ck_assert_int_eq(r.input_lens[0], 2);
	serve_embed_free(&r);
	for (size_t i = 0; i < sizeof(bad_bodies) / sizeof(bad_bodies[0]); i++) {
		memset(&e, 0, sizeof(e));
		ck_assert_msg(serve_embed_parse(&ctx, bad_bodies[i], strlen(bad_bodies[i]), &r, &e) == -1,
			      "accepted %s", bad_bodies[i]);
		ck_assert_msg(e.status == 400 || e.status == 404, "%s: %d", bad_bodies[i], e.status);
		ck_assert_msg(!strcmp(e.param, params[i]), "%s: param %s", bad_bodies[i], e.param);
		ck_assert_int_eq(r.n_inputs, 0);
	}
}
END_TEST

/* Pooling: mean, first or last row, normalized to length 1; a zero vector
 * is refused. base64 is the floats' little-endian bytes. */
START_TEST(pooling_and_base64)
{
	const float rows[3 * 2] = { 3, 0, 0, 4, 6, 8 };
	const float zero[2] = { 0, 0 };
	float v[2];
	json_t *item;
	const char *b64;

	ck_assert_int_eq(api_pool(rows, 3, 2, LOOM_POOLING_MEAN, v), 0);
	ck_assert(fabsf(v[0] - 0.6f) < 1e-6f && fabsf(v[1] - 0.8f) < 1e-6f); /* (3, 4) / 5 */
	ck_assert_int_eq(api_pool(rows, 3, 2, LOOM_POOLING_CLS, v), 0);
	ck_assert(v[0] == 1.0f && v[1] == 0.0f);
	ck_assert_int_eq(api_pool(rows, 3, 2, LOOM_POOLING_LAST, v), 0);
	ck_assert(fabsf(v[0] - 0.6f) < 1e-6f && fabsf(v[1] - 0.8f) < 1e-6f);
	ck_assert_int_eq(api_pool(zero, 1, 2, LOOM_POOLING_MEAN, v), -1);
	ck_assert_int_eq(api_pool(rows, 0, 2, LOOM_POOLING_MEAN, v), -1);
	v[0] = 1.0f; /* 00 00 80 3f */
	v[1] = -2.0f; /* 00 00 00 c0 */
	item = api_embedding_item(3, v, 2, true);
	b64 = json_string_value(json_object_get(item, "embedding"));
	ck_assert_str_eq(b64, "AACAPwAAAMA=");
	ck_assert_int_eq(json_integer_value(json_object_get(item, "index")), 3);
	json_decref(item);
	item = api_embedding_item(0, v, 2, false);
	ck_assert_int_eq(json_array_size(json_object_get(item, "embedding")), 2);
	json_decref(item);
}
END_TEST

START_TEST(malformed)
{
	const struct bad *b = &bad[_i];
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;
	struct perr e = { 0 };

	ck_assert_msg(serve_req_parse(&ctx, b->body, strlen(b->body), b->chat, &r, &e) == -1,
		      "accepted: %s", b->body);
	ck_assert_msg(e.status == b->status, "%s: status %d", b->body, e.status);
	ck_assert_msg(!strcmp(e.param, b->param), "%s: param '%s'", b->body, e.param);
	ck_assert_msg(b->code ? e.code && !strcmp(e.code, b->code) : !e.code,
		      "%s: code %s", b->body, e.code ? e.code : "(none)");
	ck_assert_msg(e.msg[0], "%s: no message", b->body);
	/* nothing is left for the caller to free */
	ck_assert_ptr_null(r.prompt);
	ck_assert_int_eq(r.n_stop, 0);
}
END_TEST

START_TEST(messages_name_the_offer)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;
	struct perr e;
	const char *body = "{\"prompt\": \"a\", \"speculative\": \"nosuch\"}";

	ck_assert_int_eq(serve_req_parse(&ctx, body, strlen(body), false, &r, &e), -1);
	ck_assert_ptr_nonnull(strstr(e.msg, "none, ngram, layerskip"));
	ctx.n_spec = 0;
	ck_assert_int_eq(serve_req_parse(&ctx, body, strlen(body), false, &r, &e), -1);
	ck_assert_ptr_nonnull(strstr(e.msg, "--spec"));
}
END_TEST

START_TEST(no_chat_template)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;
	struct perr e;
	const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";

	ctx.render = NULL;
	ck_assert_int_eq(serve_req_parse(&ctx, body, strlen(body), true, &r, &e), -1);
	ck_assert_int_eq(e.status, 500);
	ck_assert_str_eq(e.code, "unsupported_chat_template");
	ck_assert_str_eq(e.msg, "no template");
	/* plain completions still work */
	body = "{\"prompt\": \"x\"}";
	ck_assert_int_eq(serve_req_parse(&ctx, body, strlen(body), false, &r, &e), 0);
	serve_req_free(&r);
}
END_TEST

START_TEST(logit_bias_of_zero)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;
	const char *body = "{\"prompt\": \"a\", \"logit_bias\": {\"0\": 0, \"99\": 0.0}}";

	parse_ok(&ctx, body, false, &r); /* no bias at all: nothing to refuse */
	serve_req_free(&r);
}
END_TEST

START_TEST(tool_name_of_64)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;
	const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_Weather-2aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}}]}";

	ctx.n_ctx = 4096; /* the tools text is long */
	parse_ok(&ctx, body, true, &r);
	serve_req_free(&r);
}
END_TEST

START_TEST(limits_from_the_context)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;
	struct perr e;
	const char *body = "{\"prompt\": \"a\", \"n\": 3, \"stop\": [\"1\", \"2\"]}";

	ctx.max_n = 2;
	ck_assert_int_eq(serve_req_parse(&ctx, body, strlen(body), false, &r, &e), -1);
	ck_assert_str_eq(e.param, "n");
	ctx.max_n = 3;
	ctx.max_stop = 1;
	ck_assert_int_eq(serve_req_parse(&ctx, body, strlen(body), false, &r, &e), -1);
	ck_assert_str_eq(e.param, "stop");
	ctx.max_stop = 2;
	parse_ok(&ctx, body, false, &r);
	serve_req_free(&r);
}
END_TEST

/* ---- Ollama bodies (serve_ollama.c) ---- */

static int ollama(const struct serve_req_ctx *ctx, const char *body, bool chat,
		  struct serve_req *r, struct perr *e)
{
	memset(e, 0, sizeof(*e));
	return ollama_parse(ctx, body, strlen(body), chat, r, e);
}

/* Options become the OpenAI fields of the same meaning; generate without
 * raw is a chat of system and prompt; streaming is the default. */
START_TEST(ollama_fields)
{
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;
	struct perr e;

	ck_assert_int_eq(ollama(&ctx, "{\"model\": \"m:latest\", \"prompt\": \"hi\", \"system\": \"s\","
				" \"options\": {\"temperature\": 0.25, \"top_k\": 7, \"top_p\": 0.5,"
				" \"min_p\": 0.125, \"seed\": 9, \"num_predict\": 5, \"stop\": [\"q\"],"
				" \"repeat_penalty\": 1.5, \"presence_penalty\": 0.5,"
				" \"frequency_penalty\": 0.25, \"num_ctx\": 40}, \"keep_alive\": \"5m\"}",
				false, &r, &e), 0);
	ck_assert_int_eq(r.api, SERVE_API_OLLAMA_GENERATE);
	ck_assert(r.chat && r.stream);
	ck_assert_float_eq(r.sp.temp, 0.25f);
	ck_assert_int_eq(r.sp.top_k, 7);
	ck_assert_float_eq(r.sp.top_p, 0.5f);
	ck_assert_float_eq(r.sp.min_p, 0.125f);
	ck_assert(r.seed_given && r.sp.seed == 9);
	ck_assert_int_eq(r.max_tokens, 5);
	ck_assert(r.n_stop == 1 && !strcmp(r.stop[0], "q"));
	ck_assert_float_eq(r.sp.repeat_penalty, 1.5f);
	ck_assert_float_eq(r.sp.presence_penalty, 0.5f);
	ck_assert_float_eq(r.sp.frequency_penalty, 0.25f);
	assert_prompt(&r, true, "system:s\nuser:hi\n");
	serve_req_free(&r);
	/* raw: the prompt as a completion; no num_predict: until the context
	 * (num_ctx 20 here) is full */
	ck_assert_int_eq(ollama(&ctx, "{\"prompt\": \"abc\", \"raw\": true, \"stream\": false,"
				" \"options\": {\"num_ctx\": 20, \"num_predict\": -1}}", false, &r, &e), 0);
	ck_assert(!r.chat && !r.stream);
	assert_prompt(&r, true, "abc");
	ck_assert_int_eq(r.max_tokens, 20 - 4);
	serve_req_free(&r);
	/* chat: tool calls' arguments objects become OpenAI's JSON text */
	ctx.n_ctx = 256;
	ck_assert_int_eq(ollama(&ctx, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"},"
				" {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\":"
				" {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]},"
				" {\"role\": \"tool\", \"content\": \"r\", \"tool_name\": \"f\"}]}",
				true, &r, &e), 0);
	ck_assert_int_eq(r.api, SERVE_API_OLLAMA_CHAT);
	assert_prompt(&r, true, "user:x\nassistant:<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\nuser:<tool_response>\nr\n</tool_response>\n");
	serve_req_free(&r);
	/* no prompt, no messages: a load request */
	ck_assert_int_eq(ollama(&ctx, "{\"model\": \"m\"}", false, &r, &e), 1);
	ck_assert_int_eq(ollama(&ctx, "{\"model\": \"m\", \"messages\": []}", true, &r, &e), 1);
}
END_TEST

/* What loom cannot honour is a 400 that names it. */
START_TEST(ollama_refusals)
{
	static const struct {
		const char *body, *word;
	} bad[] = {
		{ "{\"prompt\": \"a\", \"options\": {\"mirostat\": 1}}", "options.mirostat" },
		{ "{\"prompt\": \"a\", \"options\": {\"num_gpu\": 1}}", "options.num_gpu" },
		{ "{\"prompt\": \"a\", \"options\": {\"what\": 1}}", "options.what" },
		{ "{\"prompt\": \"a\", \"options\": {\"num_ctx\": 65}}", "num_ctx" },
		{ "{\"prompt\": \"a\", \"options\": {\"num_predict\": 0}}", "num_predict" },
		{ "{\"prompt\": \"a\", \"options\": {\"num_predict\": 100}}", "context" },
		{ "{\"prompt\": \"a\", \"options\": 3}", "'options'" },
		{ "{\"prompt\": \"a\", \"images\": [\"x\"]}", "'images'" },
		{ "{\"prompt\": \"a\", \"suffix\": \"b\"}", "'suffix'" },
		{ "{\"prompt\": \"a\", \"template\": \"t\"}", "'template'" },
		{ "{\"prompt\": \"a\", \"context\": [1]}", "'context'" },
		{ "{\"prompt\": \"a\", \"think\": true}", "'think'" },
		{ "{\"prompt\": \"a\", \"raw\": true, \"system\": \"s\"}", "'system'" },
		{ "{\"prompt\": \"a\", \"format\": \"xml\"}", "'format'" },
		{ "{\"prompt\": \"a\", \"bogus\": 1}", "'bogus'" },
		{ "{\"prompt\": 5}", "'prompt'" },
		{ "{\"prompt\": \"a\", \"stream\": \"yes\"}", "'stream'" },
		{ "[1]", "JSON object" },
	};
	struct serve_req_ctx ctx = fake_ctx();
	struct serve_req r;
	struct perr e;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(ollama(&ctx, bad[i].body, false, &r, &e), -1);
		ck_assert_int_eq(e.status, 400);
		ck_assert_msg(strstr(e.msg, bad[i].word), "%s: '%s'", bad[i].body, e.msg);
	}
	ck_assert_int_eq(ollama(&ctx, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\","
				" \"images\": [\"x\"]}]}", true, &r, &e), -1);
	ck_assert_ptr_nonnull(strstr(e.msg, "images"));
}
END_TEST

/* The formats' calls, as the model writes them, into OpenAI tool_calls. */
START_TEST(tool_formats)
{
	static const char hermes[] = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
	static const char llama[] = " {\"name\": \"f\", \"parameters\": {\"a\": 1}}";
	static const char mistral[] = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}},"
				      " {\"name\": \"g\", \"arguments\": {}}]";
	const char *fmts[] = { hermes, llama, mistral };
	bool renders;

	for (int f = 0; f < 3; f++) {
		json_t *c = serve_tool_calls(f, fmts[f], strlen(fmts[f]));
		json_t *fn = json_object_get(json_array_get(c, 0), "function");

		ck_assert_msg(c != NULL, "format %d", f);
		ck_assert_str_eq(json_string_value(json_object_get(fn, "name")), "f");
		ck_assert_str_eq(json_string_value(json_object_get(fn, "arguments")), "{\"a\":1}");
		ck_assert_int_eq(serve_tool_kind(f, fmts[f], strlen(fmts[f])), 2);
		ck_assert_int_eq(serve_tool_kind(f, "Hello", 5), 1);
		ck_assert_int_eq(serve_tool_kind(f, "", 0), 0);
		/* another format's calls are not calls here */
		ck_assert_ptr_null(serve_tool_calls((f + 1) % 3, fmts[f], strlen(fmts[f])));
		json_decref(c);
	}
	{
		/* gpt-oss's harmony: the channel first or the recipient first,
		 * reasoning before it, <|call|> kept or stopped on */
		static const char *const harmony[] = {
			"<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>",
			"<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"a\":1}",
			"<|channel|>analysis<|message|>Need f.<|end|><|start|>assistant<|channel|>commentary"
			" to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>",
		};
		static const char *const not_calls[] = {
			"<|channel|>final<|message|>Hello",
			"<|channel|>commentary to=functions.f <|constrain|>json<|message|>[1]<|call|>",
			"<|channel|>commentary to=functions. <|constrain|>json<|message|>{}<|call|>",
			"<|channel|>analysis<|message|>no end",
		};
		const int H = SERVE_TOOLFMT_HARMONY;

		for (size_t k = 0; k < sizeof(harmony) / sizeof(harmony[0]); k++) {
			json_t *c = serve_tool_calls(H, harmony[k], strlen(harmony[k]));
			json_t *fn = json_object_get(json_array_get(c, 0), "function");

			ck_assert_msg(c && json_array_size(c) == 1, "harmony %zu", k);
			ck_assert_str_eq(json_string_value(json_object_get(fn, "name")), "f");
			ck_assert_str_eq(json_string_value(json_object_get(fn, "arguments")), "{\"a\":1}");
			json_decref(c);
		}
		for (size_t k = 0; k < sizeof(not_calls) / sizeof(not_calls[0]); k++)
			ck_assert_msg(!serve_tool_calls(H, not_calls[k], strlen(not_calls[k])),
				      "not a harmony call: %s", not_calls[k]);
		ck_assert_int_eq(serve_tool_kind(H, harmony[0], strlen(harmony[0])), 2);
		ck_assert_int_eq(serve_tool_kind(H, harmony[1], strlen(harmony[1])), 2);
		ck_assert_int_eq(serve_tool_kind(H, not_calls[0], strlen(not_calls[0])), 1);
		ck_assert_int_eq(serve_tool_kind(H, "<|chan", 6), 0);
		ck_assert_int_eq(serve_tool_format_of("{{ '<|channel|>commentary to=functions.' }}",
						      NULL), H);
		ck_assert_str_eq(serve_tool_format_name(H), "harmony");
	}
	{
		json_t *c = serve_tool_calls(SERVE_TOOLFMT_MISTRAL, mistral, strlen(mistral));
		const char *id = json_string_value(json_object_get(json_array_get(c, 1), "id"));

		ck_assert_int_eq(json_array_size(c), 2);
		ck_assert_uint_eq(strlen(id), 9); /* Mistral's templates demand 9 alphanumerics */
		json_decref(c);
	}
	ck_assert_ptr_null(serve_tool_calls(SERVE_TOOLFMT_LLAMA3, "{\"name\": \"f\"}", 13));
	ck_assert_ptr_null(serve_tool_calls(SERVE_TOOLFMT_MISTRAL, "[TOOL_CALLS][1]", 15));
	ck_assert_int_eq(serve_tool_kind(SERVE_TOOLFMT_MISTRAL, "[TOOL", 5), 0);
	ck_assert_int_eq(serve_tool_format_of("{{ tools }}[TOOL_CALLS]", &renders), SERVE_TOOLFMT_MISTRAL);
	ck_assert(renders);
	ck_assert_int_eq(serve_tool_format_of("{{ tools }}[TOOL_CALLS]x[ARGS]", &renders),
			 SERVE_TOOLFMT_HERMES);
	ck_assert(!renders); /* a format loom does not parse: its own section */
	ck_assert_int_eq(serve_tool_format_of("<|start_header_id|>{{ tools }}\"parameters\"", &renders),
			 SERVE_TOOLFMT_LLAMA3);
	ck_assert_int_eq(serve_tool_format_of("<tool_call><function={{ tools }}", &renders),
			 SERVE_TOOLFMT_HERMES);
	ck_assert(!renders);
	ck_assert_int_eq(serve_tool_format_of(NULL, &renders), SERVE_TOOLFMT_HERMES);
	ck_assert(!renders);
}
END_TEST

static Suite *request_suite(void)
{
	Suite *s = suite_create("serve_request");
	TCase *tc = tcase_create("parse");

	tcase_add_test(tc, completion_every_field);
	tcase_add_test(tc, completion_defaults);
	tcase_add_test(tc, completion_token_ids);
	tcase_add_test(tc, prompt_arrays_and_logprobs);
	tcase_add_test(tc, embedding_inputs);
	tcase_add_test(tc, pooling_and_base64);
	tcase_add_test(tc, chat_messages);
	tcase_add_test(tc, spec_default);
	tcase_add_loop_test(tc, malformed, 0, (int)(sizeof(bad) / sizeof(bad[0])));
	tcase_add_test(tc, messages_name_the_offer);
	tcase_add_test(tc, no_chat_template);
	tcase_add_test(tc, limits_from_the_context);
	tcase_add_test(tc, logit_bias_of_zero);
	tcase_add_test(tc, tool_name_of_64);
	tcase_add_test(tc, ollama_fields);
	tcase_add_test(tc, ollama_refusals);
	tcase_add_test(tc, tool_formats);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(request_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
