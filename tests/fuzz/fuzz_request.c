/* libFuzzer: OpenAI request bodies (server/serve_request.c serve_req_parse)
 * and Ollama ones (server/serve_ollama.c ollama_parse) through the real
 * chat templates (core/text/chat_template.c) and the GPT-2 tokenizer, as
 * loom serve wires them.
 *
 * Byte 0: bit 7 chat or completions (Ollama: /api/chat or /api/generate),
 * bit 5 Ollama's API, bit 4 with the Jinja template: one that presents
 * tools (chats with tools go through loom_chat_tokenize_json, calls in
 * format byte 0 mod 3), byte 0 mod 8 the template (seven built-in
 * families, or a Jinja template run by core/text/jinja); the rest is the
 * body. An accepted request must have a prompt of ids inside
 * the vocabulary that fits the context, choices and stop strings within
 * their limits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "serve_ollama.h"
#include "serve_request.h"

#define N_CTX 2048

static struct loom_tokenizer *tok;
static struct loom_chat_template tmpl, jinja_tmpl;

/* a chatml template in Jinja, with the checks real ones make */
static const char jinja_src[] =
	"{%- for message in messages %}"
	"{%- if message.role not in ['system', 'user', 'assistant'] %}"
	"{{- raise_exception('unexpected role ' ~ message.role) }}{%- endif %}"
	"{%- if loop.first and message.role != 'system' %}"
	"{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}"
	"{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}"
	"{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
/* one that presents tools and takes calls and results */
static const char tools_src[] =
	"{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
	"<|im_end|>\n{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
	"{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
	"{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
	"{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
static struct loom_chat_template tools_tmpl;
static const char *const spec_names[] = { "ngram", "layerskip" };
static const char *const model_names[] = { "smollm", "loom" };

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[256];

	tok = fuzz_vocab("ggml-vocab-gpt-2.gguf");
	if (loom_chat_template_jinja(jinja_src, "<|endoftext|>", "<|endoftext|>", &jinja_tmpl, err,
				     sizeof(err))) {
		fprintf(stderr, "fuzz: %s\n", err);
		exit(2);
	}
	if (loom_chat_template_jinja(tools_src, "<|endoftext|>", "<|endoftext|>", &tools_tmpl, err,
				     sizeof(err))) {
		fprintf(stderr, "fuzz: %s\n", err);
		exit(2);
	}
	return 0;
}

static int64_t fz_tokenize(void *user, const char *text, size_t len, bool add_special,
			   int32_t *ids, int64_t cap)
{
	return loom_tokenize(tok, text, len, add_special, true, ids, cap);
}

static struct loom_chat_msg *chat_msgs(const struct serve_msg *msgs, size_t n)
{
	struct loom_chat_msg *cm = calloc(n ? n : 1, sizeof(*cm));

	for (size_t i = 0; i < n; i++)
		cm[i] = (struct loom_chat_msg){ .role = msgs[i].role, .content = msgs[i].content };
	return cm;
}

static char *fz_render(void *user, const struct serve_msg *msgs, size_t n, char *why,
		       size_t whylen)
{
	struct loom_chat_msg *cm = chat_msgs(msgs, n);
	char *text = loom_chat_render(&tmpl, cm, n, true, why, whylen);

	free(cm);
	return text;
}

static int32_t *fz_render_ids(void *user, const struct serve_msg *msgs, size_t n,
			      int64_t *n_ids, char *why, size_t whylen)
{
	struct loom_chat_msg *cm = chat_msgs(msgs, n);
	int32_t *ids = NULL;

	*n_ids = loom_chat_tokenize(tok, &tmpl, cm, n, true, &ids, why, whylen);
	free(cm);
	if (*n_ids < 0 && ids)
		abort(); /* -1 leaves *ids NULL */
	return *n_ids < 0 ? NULL : ids;
}

static int32_t *fz_render_json(void *user, const char *mj, const char *tj, int64_t *n_ids,
			       char *why, size_t whylen)
{
	int32_t *ids = NULL;

	*n_ids = loom_chat_tokenize_json(tok, &tools_tmpl, mj, strlen(mj), tj, tj ? strlen(tj) : 0,
					 true, N_CTX, &ids, why, whylen);
	if (*n_ids < 0 && ids)
		abort(); /* -1 leaves *ids NULL */
	return *n_ids < 0 ? NULL : ids;
}

static void check_request(const struct serve_req *r)
{
	if (r->n_prompt <= 0 || r->n_prompt > N_CTX || !r->prompt)
		abort();
	for (int32_t i = 0; i < r->n_prompt; i++)
		if (r->prompt[i] < 0 || r->prompt[i] >= loom_tokenizer_n_vocab(tok))
			abort();
	if (r->n < 1 || r->n > SERVE_REQ_MAX_N || r->n_stop < 0 || r->n_stop > SERVE_REQ_MAX_STOP)
		abort();
	for (int i = 0; i < r->n_stop; i++)
		if (!r->stop[i] || !r->stop[i][0] || strlen(r->stop[i]) > SERVE_REQ_MAX_STOP_LEN)
			abort();
	if ((int64_t)r->n_prompt + (r->max_tokens > 0 ? r->max_tokens : 0) > N_CTX)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct serve_req_ctx ctx = {
		.n_vocab = loom_tokenizer_n_vocab(tok), .n_ctx = N_CTX,
		.max_n = SERVE_REQ_MAX_N, .max_stop = SERVE_REQ_MAX_STOP,
		.tokenize = fz_tokenize, .render = fz_render, .chat_err = "none",
		.chat_bos = -1, .spec_names = spec_names, .n_spec = 2,
		.render_ids = fz_render_ids, .model_names = model_names, .n_model_names = 2,
	};
	struct serve_req r;
	struct perr e;
	int rc;

	if (!size)
		return 0;
	memset(&tmpl, 0, sizeof(tmpl));
	if (data[0] % 8 == 7)
		tmpl = jinja_tmpl; /* shares its source: never freed per input */
	else
		tmpl.family = (enum loom_chat_family)(1 + data[0] % 8);
	if (data[0] & 0x40) {
		ctx.chat_bos = 0;
		if (tmpl.family != LOOM_CHAT_JINJA)
			snprintf(tmpl.default_system, sizeof(tmpl.default_system), "You are helpful.");
	}
	if (tmpl.family == LOOM_CHAT_JINJA && (data[0] & 0x10)) {
		ctx.render_json = fz_render_json;
		ctx.template_tools = true;
		ctx.tool_format = data[0] % 3;
	}
	if (data[0] & 0x20)
		rc = ollama_parse(&ctx, (const char *)data + 1, size - 1, data[0] & 0x80, &r, &e);
	else
		rc = serve_req_parse(&ctx, (const char *)data + 1, size - 1, data[0] & 0x80, &r, &e);
	if (rc == 0) {
		check_request(&r);
		serve_req_free(&r);
	} else if (rc == 1) {
		if (!(data[0] & 0x20))
			abort(); /* only Ollama's load requests */
	} else if (e.status < 400 || e.status > 599 || !e.msg[0]) {
		abort(); /* a refusal is an HTTP error with a message */
	}
	return 0;
}
