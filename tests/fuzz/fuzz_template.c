/* libFuzzer: Jinja chat templates (core/text/jinja*.c) with contexts.
 *
 * The input is a template, then optionally a NUL byte and a JSON object of
 * variables; without one (or when it does not parse) the template gets a
 * conversation with a tool call and a tools list, as transformers passes
 * them. Each template runs under small limits, so a slow one fails with a
 * message instead of timing out. A rendering must be as long as it says,
 * with one content mark per byte, each 0 or 1; a failure must leave a
 * message. ASan and LeakSanitizer check the arena frees everything on
 * both paths.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/jinja.h"

static const char default_vars[] =
	"{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true,"
	" \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
	" {\"role\": \"user\", \"content\": \"Hi <|im_start|> \\u00e9\"},"
	" {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call_1\","
	" \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]},"
	" {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"42\"}],"
	" \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
	" \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}]}";

static json_t *defaults;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	defaults = json_loads(default_vars, 0, NULL);
	if (!defaults)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t tlen = nul ? (size_t)(nul - data) : size, len = 0;
	json_t *vars = NULL;
	struct jinja_opts o;
	uint8_t *mask = NULL;
	char err[256] = "";
	char *out;

	if (nul)
		vars = json_loadb((const char *)nul + 1, size - tlen - 1, 0, NULL);
	jinja_default_opts(&o);
	o.max_steps = 200000;
	o.max_output = 1 << 20;
	o.max_memory = 64 << 20;
	o.max_depth = 64;
	o.now = 1767323045;
	o.content_mask = &mask;
	out = jinja_render((const char *)data, tlen, vars ? vars : defaults, &o, &len, err,
			   sizeof(err));
	if (out) {
		if (!mask || out[len] != 0 || len > o.max_output)
			abort();
		for (size_t i = 0; i < len; i++)
			if (mask[i] > 1)
				abort();
	} else if (!err[0] || mask) {
		abort();
	}
	free(out);
	free(mask);
	json_decref(vars);
	return 0;
}
