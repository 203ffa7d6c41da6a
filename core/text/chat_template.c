/* Chat templates: family detection and rendering (see chat_template.h). */
#include "text/chat_template.h"
#include "text/jinja.h"
#include "util.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static const char *const family_names[] = {
	[LOOM_CHAT_UNKNOWN] = "unknown", [LOOM_CHAT_CHATML] = "chatml",
	[LOOM_CHAT_LLAMA2] = "llama2",   [LOOM_CHAT_LLAMA3] = "llama3",
	[LOOM_CHAT_GEMMA] = "gemma",     [LOOM_CHAT_MISTRAL] = "mistral",
	[LOOM_CHAT_PHI3] = "phi3",       [LOOM_CHAT_ZEPHYR] = "zephyr",
	[LOOM_CHAT_JINJA] = "jinja",
};

const char *loom_chat_family_name(enum loom_chat_family f)
{
	if ((unsigned)f >= sizeof(family_names) / sizeof(family_names[0]))
		return "unknown";
	return family_names[f];
}

/* A chatml template that inserts a fixed system turn when the conversation
 * has none writes it as a literal: '<|im_start|>system\nTEXT<|im_end|>'
 * after a test of messages[0]['role'] != 'system'. The literal is taken
 * only when it holds no Jinja (no quote, brace or plus). */
static void find_default_system(const char *tmpl, struct loom_chat_template *t)
{
	static const char *const heads[] = { "<|im_start|>system\n", "<|im_start|>system\\n" };
	const char *test = strstr(tmpl, "!= 'system'");
	const char *p = NULL, *end;
	size_t n, i;

	if (!test)
		test = strstr(tmpl, "!= \"system\"");
	for (i = 0; test && !p && i < 2; i++)
		if ((p = strstr(test, heads[i])))
			p += strlen(heads[i]);
	if (!p)
		return;
	end = strstr(p, "<|im_end|>");
	if (!end)
		return;
	n = (size_t)(end - p);
	if (n >= sizeof(t->default_system) || memchr(p, '\'', n) || memchr(p, '"', n) ||
	    memchr(p, '{', n) || memchr(p, '+', n) || memchr(p, '\\', n))
		return;
	memcpy(t->default_system, p, n);
	t->default_system[n] = '\0';
}

int loom_chat_template_detect(const char *tmpl, struct loom_chat_template *t,
			      char *err, size_t errlen)
{
	memset(t, 0, sizeof(*t));
	if (!tmpl || !tmpl[0])
		t->family = LOOM_CHAT_CHATML;
	else if (strstr(tmpl, "<|im_start|>"))
		t->family = LOOM_CHAT_CHATML;
	else if (strstr(tmpl, "<|start_header_id|>"))
		t->family = LOOM_CHAT_LLAMA3;
	else if (strstr(tmpl, "<start_of_turn>"))
		t->family = LOOM_CHAT_GEMMA;
	else if (strstr(tmpl, "<|user|>"))
		t->family = strstr(tmpl, "<|end|>") ? LOOM_CHAT_PHI3 : LOOM_CHAT_ZEPHYR;
	else if (strstr(tmpl, "[INST]"))
		t->family = strstr(tmpl, "<<SYS>>") ? LOOM_CHAT_LLAMA2 : LOOM_CHAT_MISTRAL;
	if (t->family == LOOM_CHAT_UNKNOWN) {
		loom_seterr(err, errlen, "unsupported chat template (known families: chatml, llama2, llama3, gemma, mistral, phi3, zephyr)");
		return -1;
	}
	if (t->family == LOOM_CHAT_CHATML && tmpl)
		find_default_system(tmpl, t);
	return 0;
}

/* The rendered text and, per byte, whether the template wrote it (1) or
 * it came from a message (0): only the template's own bytes may become
 * special tokens. */
struct rbuf {
	char *s;
	unsigned char *mark;
	size_t len, cap;
	bool failed;
};

static void put(struct rbuf *b, const char *s, bool markup)
{
	size_t n = strlen(s);

	if (b->failed)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *ns = realloc(b->s, cap);
		unsigned char *nm = ns ? realloc(b->mark, cap) : NULL;

		if (ns)
			b->s = ns;
		if (!ns || !nm) {
			b->failed = true;
			return;
		}
		b->mark = nm;
		b->cap = cap;
	}
	memcpy(b->s + b->len, s, n);
	memset(b->mark + b->len, markup, n);
	b->len += n;
	b->s[b->len] = '\0';
}

/* markup */
static void mk(struct rbuf *b, const char *s)
{
	put(b, s, true);
}

/* a message's text */
static void text(struct rbuf *b, const char *s)
{
	put(b, s, false);
}

/* ---- families where every role has its own turn ---- */

struct turn_fmt {
	const char *pre, *mid, *post; /* pre ROLE mid CONTENT post */
	const char *gen;              /* assistant header */
};

static const struct turn_fmt turn_fmts[] = {
	[LOOM_CHAT_CHATML] = { "<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n" },
	[LOOM_CHAT_LLAMA3] = { "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
			       "<|start_header_id|>assistant<|end_header_id|>\n\n" },
	[LOOM_CHAT_PHI3] = { "<|", "|>\n", "<|end|>\n", "<|assistant|>\n" },
	[LOOM_CHAT_ZEPHYR] = { "<|", "|>\n", "</s>\n", "<|assistant|>\n" },
};

/* Roles are markup: check_roles let through only system, user, assistant. */
static void render_turns(const struct loom_chat_template *t, const struct loom_chat_msg *msgs,
			 size_t n, bool gen, struct rbuf *b)
{
	const struct turn_fmt *f = &turn_fmts[t->family];
	size_t i;

	if (t->default_system[0] && (n == 0 || strcmp(msgs[0].role, "system"))) {
		mk(b, "<|im_start|>system\n");
		mk(b, t->default_system); /* the template's own text */
		mk(b, "<|im_end|>\n");
	}
	for (i = 0; i < n; i++) {
		mk(b, f->pre);
		mk(b, msgs[i].role);
		mk(b, f->mid);
		text(b, msgs[i].content);
		mk(b, f->post);
	}
	if (gen)
		mk(b, f->gen);
}

/* ---- families that fold the system message into the first user turn ---- */

static void render_gemma(const struct loom_chat_msg *msgs, size_t n, const char *sys,
			 bool gen, struct rbuf *b)
{
	size_t i;

	for (i = 0; i < n; i++) {
		bool user = !strcmp(msgs[i].role, "user");

		mk(b, "<start_of_turn>");
		mk(b, user ? "user" : "model");
		mk(b, "\n");
		if (sys && user) {
			text(b, sys);
			mk(b, "\n\n");
		}
		sys = NULL;
		text(b, msgs[i].content);
		mk(b, "<end_of_turn>\n");
	}
	if (gen)
		mk(b, "<start_of_turn>model\n");
}

static void render_inst(const struct loom_chat_msg *msgs, size_t n, const char *sys,
			bool llama2, struct rbuf *b)
{
	bool first = true;
	size_t i;

	for (i = 0; i < n; i++) {
		if (strcmp(msgs[i].role, "user")) {
			mk(b, llama2 ? " " : "");
			text(b, msgs[i].content);
			mk(b, llama2 ? " </s>" : "</s>");
			continue;
		}
		mk(b, first ? "[INST] " : (llama2 ? "<s>[INST] " : "[INST] "));
		if (sys && llama2) {
			mk(b, "<<SYS>>\n");
			text(b, sys);
			mk(b, "\n<</SYS>>\n\n");
		} else if (sys) {
			text(b, sys);
			mk(b, "\n\n");
		}
		sys = NULL;
		first = false;
		text(b, msgs[i].content);
		mk(b, " [/INST]");
	}
}

static int check_roles(const struct loom_chat_template *t, const struct loom_chat_msg *msgs,
		       size_t n, char *err, size_t errlen)
{
	bool folds = t->family == LOOM_CHAT_GEMMA || t->family == LOOM_CHAT_LLAMA2 ||
		     t->family == LOOM_CHAT_MISTRAL;
	size_t i;

	for (i = 0; i < n; i++) {
		const char *r = msgs[i].role;

		if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
			loom_seterr(err, errlen, "messages[%zu]: unknown role (system, user or assistant)", i);
			return -1;
		}
		if (folds && i > 0 && !strcmp(r, "system")) {
			loom_seterr(err, errlen, "messages[%zu]: the %s format takes a system message only first",
				    i, loom_chat_family_name(t->family));
			return -1;
		}
	}
	return 0;
}

/* ---- Jinja templates (core/text/jinja.h) ---- */

int loom_chat_template_jinja(const char *source, const char *bos, const char *eos,
			     struct loom_chat_template *t, char *err, size_t errlen)
{
	char why[256];

	memset(t, 0, sizeof(*t));
	if (!source) {
		loom_seterr(err, errlen, "no chat template");
		return -1;
	}
	if (jinja_check(source, strlen(source), why, sizeof(why))) {
		loom_seterr(err, errlen, "chat template: %s", why);
		return -1;
	}
	t->source = strdup(source);
	if (!t->source) {
		loom_seterr(err, errlen, "out of memory");
		return -1;
	}
	t->family = LOOM_CHAT_JINJA;
	/* a token text too long for the field is left out rather than cut */
	if (bos && strlen(bos) < sizeof(t->bos_token))
		strcpy(t->bos_token, bos);
	if (eos && strlen(eos) < sizeof(t->eos_token))
		strcpy(t->eos_token, eos);
	return 0;
}

void loom_chat_template_free(struct loom_chat_template *t)
{
	free(t->source);
	t->source = NULL;
}

/* The variables transformers passes: messages, add_generation_prompt,
 * bos_token, eos_token. NULL when out of memory. */
static json_t *chat_vars(const struct loom_chat_template *t, const struct loom_chat_msg *msgs,
			 size_t n, bool gen)
{
	json_t *v = json_object(), *m = json_array();
	bool ok = v && m;

	for (size_t i = 0; ok && i < n; i++) {
		json_t *o = json_object();

		ok = o && !json_array_append_new(m, o) &&
		     !json_object_set_new(o, "role", json_stringn_nocheck(msgs[i].role,
									  strlen(msgs[i].role))) &&
		     !json_object_set_new(o, "content",
					  json_stringn_nocheck(msgs[i].content,
							       strlen(msgs[i].content)));
	}
	if (ok) { /* set_new takes m, even when it fails */
		ok = !json_object_set_new(v, "messages", m);
		m = NULL;
	}
	ok = ok && !json_object_set_new(v, "add_generation_prompt", json_boolean(gen)) &&
	     !json_object_set_new(v, "bos_token", json_stringn_nocheck(t->bos_token,
								       strlen(t->bos_token))) &&
	     !json_object_set_new(v, "eos_token", json_stringn_nocheck(t->eos_token,
								       strlen(t->eos_token)));
	json_decref(m);
	if (!ok) {
		json_decref(v);
		return NULL;
	}
	return v;
}

/* The roles a chat may hold (the OpenAI API's); the template decides
 * what it does with each, but a made-up role is the caller's mistake. */
static bool jinja_roles_ok(const struct loom_chat_msg *msgs, size_t n, char *err, size_t errlen)
{
	static const char *const roles[] = { "system", "user", "assistant", "tool", "developer",
					     NULL };

	for (size_t i = 0; i < n; i++) {
		int k = 0;

		while (roles[k] && strcmp(roles[k], msgs[i].role))
			k++;
		if (!roles[k]) {
			loom_seterr(err, errlen, "messages[%zu]: unknown role (system, user, assistant, tool or developer)",
				    i);
			return false;
		}
	}
	return true;
}

/* A Jinja template's rendering; markup from the interpreter's content
 * marks (strings of the messages are content, the rest markup). */
static char *render_vars(const struct loom_chat_template *t, json_t *vars,
			 unsigned char **markup, char *err, size_t errlen);

static char *render_jinja(const struct loom_chat_template *t, const struct loom_chat_msg *msgs,
			  size_t n, bool gen, unsigned char **markup, char *err, size_t errlen)
{
	json_t *vars = chat_vars(t, msgs, n, gen);
	char *text;

	if (!vars) {
		loom_seterr(err, errlen, "out of memory rendering the chat");
		return NULL;
	}
	text = render_vars(t, vars, markup, err, errlen);
	json_decref(vars);
	return text;
}

/* Renders with vars (borrowed); markup as render_jinja's. */
static char *render_vars(const struct loom_chat_template *t, json_t *vars,
			 unsigned char **markup, char *err, size_t errlen)
{
	size_t len = 0;
	struct jinja_opts o;
	uint8_t *mask = NULL;
	char *text;

	jinja_default_opts(&o);
	o.content_mask = &mask;
	text = jinja_render(t->source, strlen(t->source), vars, &o, &len, err, errlen);
	if (!text)
		return NULL;
	if (markup) {
		*markup = malloc(len + 1);
		if (!*markup) {
			free(text);
			free(mask);
			loom_seterr(err, errlen, "out of memory rendering the chat");
			return NULL;
		}
		for (size_t i = 0; i < len; i++)
			(*markup)[i] = !mask[i];
	}
	free(mask);
	return text;
}

char *loom_chat_render_marked(const struct loom_chat_template *t,
			      const struct loom_chat_msg *msgs, size_t n,
			      bool add_generation_prompt, unsigned char **markup,
			      char *err, size_t errlen)
{
	struct rbuf b = { 0 };
	const char *sys = NULL;

	if (markup)
		*markup = NULL;
	if (t->family == LOOM_CHAT_JINJA)
		return jinja_roles_ok(msgs, n, err, errlen) ?
		       render_jinja(t, msgs, n, add_generation_prompt, markup, err, errlen) : NULL;
	if (t->family == LOOM_CHAT_UNKNOWN) {
		loom_seterr(err, errlen, "unsupported chat template");
		return NULL;
	}
	if (check_roles(t, msgs, n, err, errlen))
		return NULL;
	mk(&b, ""); /* "" even for an empty conversation */
	if (n > 0 && !strcmp(msgs[0].role, "system"))
		sys = msgs[0].content;
	switch (t->family) {
	case LOOM_CHAT_GEMMA:
		render_gemma(msgs + (sys != NULL), n - (sys != NULL), sys, add_generation_prompt, &b);
		break;
	case LOOM_CHAT_LLAMA2:
	case LOOM_CHAT_MISTRAL:
		if (sys && n == 1) {
			static const struct loom_chat_msg empty = { "user", "" };

			render_inst(&empty, 1, sys, t->family == LOOM_CHAT_LLAMA2, &b);
		} else {
			render_inst(msgs + (sys != NULL), n - (sys != NULL), sys,
				    t->family == LOOM_CHAT_LLAMA2, &b);
		}
		break;
	default:
		render_turns(t, msgs, n, add_generation_prompt, &b);
	}
	if (b.failed) {
		free(b.s);
		free(b.mark);
		loom_seterr(err, errlen, "out of memory rendering the chat");
		return NULL;
	}
	if (markup)
		*markup = b.mark;
	else
		free(b.mark);
	return b.s;
}

char *loom_chat_render(const struct loom_chat_template *t,
		       const struct loom_chat_msg *msgs, size_t n,
		       bool add_generation_prompt, char *err, size_t errlen)
{
	return loom_chat_render_marked(t, msgs, n, add_generation_prompt, NULL, err, errlen);
}

/* A Jinja template may write BOS itself ({{ bos_token }}); when the
 * tokenizer adds BOS, the callers prepend it, so the template's is
 * dropped rather than doubled. Returns the new count. */
static int64_t drop_template_bos(const struct loom_tokenizer *tok, int32_t *ids, int64_t n)
{
	int32_t bos = loom_tokenizer_bos(tok), probe[4];
	bool adds = bos >= 0 && loom_tokenize(tok, "", 0, true, false, probe, 4) >= 1 &&
		    probe[0] == bos;

	if (!adds || ids[0] != bos)
		return n;
	memmove(ids, ids + 1, sizeof(int32_t) * (size_t)(n - 1));
	return n - 1;
}

/* Counts (stopping past max), then fills a buffer of that size. */
static int64_t chat_ids(const struct loom_tokenizer *tok, const char *s,
			const unsigned char *mark, int64_t max, int32_t **ids, char *err,
			size_t errlen)
{
	size_t len = strlen(s);
	int64_t need = loom_tokenize_max(tok, s, len, mark, false, false, NULL, 0, max);

	if (need < 0) {
		loom_seterr(err, errlen, "the chat could not be tokenized");
		return -1;
	}
	if (need > max)
		return need;
	*ids = malloc(sizeof(int32_t) * (size_t)(need + 1));
	if (!*ids) {
		loom_seterr(err, errlen, "out of memory tokenizing the chat");
		return -1;
	}
	if (loom_tokenize_max(tok, s, len, mark, false, false, *ids, need, max) != need) {
		loom_seterr(err, errlen, "the chat could not be tokenized");
		free(*ids);
		*ids = NULL;
		return -1;
	}
	return need;
}

/* Checks a chat's token limit, and clears *ids and err. */
static bool limit_ok(int64_t max, int32_t **ids, char *err, size_t errlen)
{
	*ids = NULL;
	if (max < 0 || max == INT64_MAX) {
		loom_seterr(err, errlen, "the chat's token limit is out of range");
		return false;
	}
	if (err && errlen)
		err[0] = '\0';
	return true;
}

/* The ids of a rendering s (NULL: it failed, err says why), counted up to
 * max; a Jinja template's BOS is dropped where the tokenizer adds one.
 * Frees s and mark. */
static int64_t rendered_ids(const struct loom_tokenizer *tok, char *s, unsigned char *mark,
			    bool jinja, int64_t max, int32_t **ids, char *err, size_t errlen)
{
	int64_t need;

	if (!s)
		return -1;
	need = chat_ids(tok, s, mark, max, ids, err, errlen);
	if (need > 0 && need <= max && jinja)
		need = drop_template_bos(tok, *ids, need);
	free(s);
	free(mark);
	return need;
}

int64_t loom_chat_tokenize_max(const struct loom_tokenizer *tok,
			       const struct loom_chat_template *t,
			       const struct loom_chat_msg *msgs, size_t n,
			       bool add_generation_prompt, int64_t max, int32_t **ids,
			       char *err, size_t errlen)
{
	unsigned char *mark = NULL;
	char *s;

	if (!limit_ok(max, ids, err, errlen))
		return -1;
	s = loom_chat_render_marked(t, msgs, n, add_generation_prompt, &mark, err, errlen);
	return rendered_ids(tok, s, mark, t->family == LOOM_CHAT_JINJA, max, ids, err, errlen);
}

/* ---- chats given as JSON (tools, tool calls) ---- */

/* The variables of a JSON chat: messages and tools parsed, the rest as
 * chat_vars gives them. NULL with err. */
static json_t *json_chat_vars(const struct loom_chat_template *t, const char *mj, size_t ml,
			      const char *tj, size_t tl, bool gen, char *err, size_t errlen)
{
	json_t *msgs = json_loadb(mj, ml, 0, NULL), *tools = NULL, *v, *m;
	size_t i;

	if (!json_is_array(msgs)) {
		loom_seterr(err, errlen, "the messages must be a JSON array");
		goto out_free;
	}
	json_array_foreach(msgs, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));
		struct loom_chat_msg one = { role ? role : "", "" };

		if (!json_is_object(m) || !role) {
			loom_seterr(err, errlen, "messages[%zu] must be an object with a string 'role'", i);
			goto out_free;
		}
		if (!jinja_roles_ok(&one, 1, err, errlen)) {
			loom_seterr(err, errlen, "messages[%zu]: unknown role (system, user, assistant, tool or developer)", i);
			goto out_free;
		}
	}
	if (tj && tl) /* json_is_array is a macro: its argument must not load */
		tools = json_loadb(tj, tl, 0, NULL);
	if (tj && tl && !json_is_array(tools)) {
		loom_seterr(err, errlen, "the tools must be a JSON array");
		goto out_free;
	}
	v = chat_vars(t, NULL, 0, gen);
	if (v && !json_object_set(v, "messages", msgs) &&
	    (!tools || !json_object_set(v, "tools", tools))) {
		json_decref(msgs);
		json_decref(tools);
		return v;
	}
	json_decref(v);
	loom_seterr(err, errlen, "out of memory rendering the chat");
out_free:
	json_decref(msgs);
	json_decref(tools);
	return NULL;
}

static char *render_json(const struct loom_chat_template *t, const char *mj, size_t ml,
			 const char *tj, size_t tl, bool gen, unsigned char **markup, char *err,
			 size_t errlen)
{
	json_t *vars;
	char *text;

	if (t->family != LOOM_CHAT_JINJA || !t->source) {
		loom_seterr(err, errlen, "the %s format has no place for tools or tool calls: it needs a Jinja template",
			    loom_chat_family_name(t->family));
		return NULL;
	}
	vars = json_chat_vars(t, mj, ml, tj, tl, gen, err, errlen);
	if (!vars)
		return NULL;
	text = render_vars(t, vars, markup, err, errlen);
	json_decref(vars);
	return text;
}

char *loom_chat_render_json(const struct loom_chat_template *t, const char *messages_json,
			    size_t mlen, const char *tools_json, size_t tlen,
			    bool add_generation_prompt, char *err, size_t errlen)
{
	return render_json(t, messages_json, mlen, tools_json, tlen, add_generation_prompt, NULL,
			   err, errlen);
}

int64_t loom_chat_tokenize_json(const struct loom_tokenizer *tok,
				const struct loom_chat_template *t, const char *messages_json,
				size_t mlen, const char *tools_json, size_t tlen,
				bool add_generation_prompt, int64_t max, int32_t **ids, char *err,
				size_t errlen)
{
	unsigned char *mark = NULL;
	char *s;

	if (!limit_ok(max, ids, err, errlen))
		return -1;
	s = render_json(t, messages_json, mlen, tools_json, tlen, add_generation_prompt, &mark,
			err, errlen);
	return rendered_ids(tok, s, mark, true, max, ids, err, errlen);
}

int64_t loom_chat_tokenize(const struct loom_tokenizer *tok, const struct loom_chat_template *t,
			   const struct loom_chat_msg *msgs, size_t n, bool add_generation_prompt,
			   int32_t **ids, char *err, size_t errlen)
{
	return loom_chat_tokenize_max(tok, t, msgs, n, add_generation_prompt, INT64_MAX - 1, ids,
				      err, errlen);
}
