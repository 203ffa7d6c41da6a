/* `loom serve`: structured output and tools (docs/SERVING.md, "Structured
 * output and tools"). Request side: response_format, tools and
 * tool_choice become a grammar (loom_grammar_new) and, for tools, a
 * system-prompt section presenting them. Reply side: the model's text
 * becomes OpenAI tool_calls.
 *
 * Tool calls are written in the format the chat template asks for
 * (serve_tool_format_of): <tool_call>{"name": ..., "arguments": {...}}
 * </tool_call> (Hermes, Qwen, and every template that names no format),
 * a bare {"name": ..., "parameters": {...}} (Llama 3.x), or
 * [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral).
 */
#ifndef LOOM_SERVE_TOOLS_H
#define LOOM_SERVE_TOOLS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "serve_request.h"

#define SERVE_TOOL_BEGIN "<tool_call>"
#define SERVE_TOOL_END "</tool_call>"

enum serve_tool_format {
	SERVE_TOOLFMT_HERMES = 0, /* <tool_call>{json}</tool_call>, repeated */
	SERVE_TOOLFMT_LLAMA3,     /* one bare {"name", "parameters"} */
	SERVE_TOOLFMT_MISTRAL,    /* [TOOL_CALLS][{"name", "arguments"}, ...] */
	/* gpt-oss's harmony: <|channel|>commentary to=functions.NAME
	 * <|constrain|>json<|message|>{args}<|call|> (docs/SERVING.md) */
	SERVE_TOOLFMT_HARMONY,
};

/* The format a chat template's source asks tool calls in; *renders (may be
 * NULL): the template presents the tools itself (it reads `tools`) in a
 * format loom parses, so the request's tools go to the template rather
 * than into a system-prompt section of loom's. */
int serve_tool_format_of(const char *source, bool *renders);
const char *serve_tool_format_name(int format);

enum serve_tool_mode {
	SERVE_TOOLS_OFF = 0,  /* no tools, or tool_choice "none" */
	SERVE_TOOLS_AUTO,     /* text or calls, the model chooses */
	SERVE_TOOLS_REQUIRED, /* calls only ("required" or a named function) */
};

/* Reads response_format, tools and tool_choice from body o: sets
 * r->grammar (calls in FORMAT), r->tool_mode and r->tool_format, and
 * *tools_text (malloc'd, or NULL) to the system-prompt section that
 * presents the tools (NULL too when the template presents them:
 * template_tools). 0, or -1 with e set (a 400 naming what is wrong or
 * unsupported). */
int serve_structured_parse(json_t *o, bool chat, int format, bool template_tools,
			   struct serve_req *r, char **tools_text, struct perr *e);

/* What text so far is in FORMAT: 0 undecided (a proper prefix of the
 * begin marker, or only whitespace), 1 plain text, 2 tool calls. */
int serve_tool_kind(int format, const char *text, size_t len);

/* The tool calls in text (in FORMAT) as an OpenAI tool_calls array (ids
 * "call_...", arguments as JSON text), or NULL when text is not a
 * complete sequence of calls. */
json_t *serve_tool_calls(int format, const char *text, size_t len);

/* A chat message of the history rewritten for the template: role "tool"
 * becomes a user turn holding <tool_response>...</tool_response>; an
 * assistant message's tool_calls are appended as <tool_call> blocks.
 * *role and *content (malloc'd, replaces the given one) are updated. 0,
 * or -1 with e set. */
int serve_tool_history(json_t *msg, size_t i, const char **role, char **content,
		       struct perr *e);

#endif
