/* Chat templates (internal): chat prompts.
 *
 * GGUF files carry tokenizer.chat_template as a Jinja program, which
 * core/text/jinja*.c runs (LOOM_CHAT_JINJA). For a model without one, the
 * built-in families are recognized by marker tokens (the approach llama.cpp
 * takes) and rendered in C. The rendered text contains special-token text
 * ("<|im_start|>"): only the template's own bytes may become special
 * tokens (loom_chat_tokenize). The built-in families never write BOS (the
 * tokenizer adds it when the model's metadata asks); a Jinja template's
 * BOS is dropped from the ids when the tokenizer adds one.
 */
#ifndef LOOM_CHAT_TEMPLATE_H
#define LOOM_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "loom.h"

/* Everything of chat templates is public: see loom.h. */

#endif /* LOOM_CHAT_TEMPLATE_H */
