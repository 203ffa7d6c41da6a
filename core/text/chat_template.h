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

#include "loom.h"

/* Everything of chat templates is public: see loom.h. */

#endif /* LOOM_CHAT_TEMPLATE_H */
