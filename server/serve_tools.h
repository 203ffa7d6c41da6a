/* `loom serve`: structured output and tools (docs/SERVING.md, "Structured
 * output and tools"). Request side: response_format, tools and
 * tool_choice become a grammar (loom_grammar_new) and, for tools, a
 * system-prompt section presenting them. Reply side: the model's text
 * becomes OpenAI tool_calls.
 *
 * Tool calls are written as <tool_call>{"name": ..., "arguments": {...}}
 * </tool_call>, the convention of ChatML-family templates (Qwen, Hermes,
 * SmolLM2), for every template.
 */
#ifndef LOOM_SERVE_TOOLS_H
#define LOOM_SERVE_TOOLS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "serve_request.h"

#define SERVE_TOOL_BEGIN "<tool_call>"
#define SERVE_TOOL_END "</tool_call>"

enum serve_tool_mode {
	SERVE_TOOLS_OFF = 0,  /* no tools, or tool_choice "none" */
	SERVE_TOOLS_AUTO,     /* text or calls, the model chooses */
	SERVE_TOOLS_REQUIRED, /* calls only ("required" or a named function) */
};

/* Reads response_format, tools and tool_choice from body o: sets
 * r->grammar and r->tool_mode, and *tools_text (malloc'd, or NULL) to the
 * system-prompt section that presents the tools. 0, or -1 with e set (a
 * 400 naming what is wrong or unsupported). */
int serve_structured_parse(json_t *o, bool chat, struct serve_req *r, char **tools_text,
			   struct perr *e);

/* What text so far is: 0 undecided (a proper prefix of the begin
 * marker), 1 plain text, 2 tool calls (starts with the marker). */
int serve_tool_kind(const char *text, size_t len);

/* The tool calls in text (begin marker, call JSON, end marker, repeated)
 * as an OpenAI tool_calls array (ids "call_..."), or NULL when text is not
 * a complete sequence of calls. */
json_t *serve_tool_calls(const char *text, size_t len);

/* A chat message of the history rewritten for the template: role "tool"
 * becomes a user turn holding <tool_response>...</tool_response>; an
 * assistant message's tool_calls are appended as <tool_call> blocks.
 * *role and *content (malloc'd, replaces the given one) are updated. 0,
 * or -1 with e set. */
int serve_tool_history(json_t *msg, size_t i, const char **role, char **content,
		       struct perr *e);

#endif
