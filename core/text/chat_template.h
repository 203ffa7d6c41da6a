/* Chat templates (internal): the prompt formats of common model families.
 *
 * GGUF files carry tokenizer.chat_template as a Jinja program. loom does not
 * run Jinja; it recognizes the family a template belongs to by its marker
 * tokens (the approach llama.cpp takes) and renders that family's format in
 * C. The rendered text contains special-token text ("<|im_start|>") and must
 * be tokenized with parse_special; it never contains BOS (the tokenizer adds
 * it when the model's metadata asks).
 */
#ifndef LOOM_CHAT_TEMPLATE_H
#define LOOM_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

enum loom_chat_family {
	LOOM_CHAT_UNKNOWN = 0,
	LOOM_CHAT_CHATML,  /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
	LOOM_CHAT_LLAMA2,  /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] */
	LOOM_CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	LOOM_CHAT_GEMMA,   /* <start_of_turn>user\n...<end_of_turn>\n */
	LOOM_CHAT_MISTRAL, /* [INST] ... [/INST]...</s> (no <<SYS>> block) */
	LOOM_CHAT_PHI3,    /* <|user|>\n...<|end|>\n */
	LOOM_CHAT_ZEPHYR,  /* <|user|>\n...</s>\n */
};

struct loom_chat_template {
	enum loom_chat_family family;
	/* chatml only: the system message the template inserts when the
	 * conversation has none (SmolLM2 does this), or "" */
	char default_system[512];
};

/* A message; role is "system", "user" or "assistant". */
struct loom_chat_msg {
	const char *role;
	const char *content;
};

/* Recognizes tmpl (the Jinja source; NULL when the model has none, which
 * means chatml). Returns 0, or -1 with err naming what was not recognized. */
int loom_chat_template_detect(const char *tmpl, struct loom_chat_template *t,
			      char *err, size_t errlen);
const char *loom_chat_family_name(enum loom_chat_family f);

/* Renders msgs[0..n) into a malloc'd NUL-terminated string, adding the
 * assistant header when add_generation_prompt. NULL with err set for an
 * unknown role, a misplaced system message, or out of memory. */
char *loom_chat_render(const struct loom_chat_template *t,
		       const struct loom_chat_msg *msgs, size_t n,
		       bool add_generation_prompt, char *err, size_t errlen);

#endif /* LOOM_CHAT_TEMPLATE_H */
