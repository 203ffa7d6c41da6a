/* A sandboxed Jinja interpreter for chat templates (internal).
 *
 * It runs the subset of Jinja that model chat templates use, configured as
 * Hugging Face transformers configures jinja2: trim_blocks and
 * lstrip_blocks on, the loopcontrols extension (break/continue), an
 * immutable sandbox (list.append and the like raise), a tojson filter that
 * keeps non-ASCII text, and raise_exception(msg) and strftime_now(fmt) as
 * globals. docs/TEMPLATES.md lists what is supported.
 *
 * Templates and variables are untrusted: every limit below is enforced,
 * and a template that exceeds one fails with a message, as does one that
 * raises. Nothing is kept between calls.
 */
#ifndef LOOM_JINJA_H
#define LOOM_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct jinja_opts {
	size_t max_output;	/* bytes of rendered text (also any captured block) */
	size_t max_memory;	/* bytes the interpreter may allocate in all */
	uint64_t max_steps;	/* evaluation steps: nodes, loop turns, filter items */
	int max_depth;		/* nesting of expressions, blocks and macro calls */
	int64_t now;		/* strftime_now's time (Unix seconds, UTC); 0: the clock, local time */
	/* Optional: when set, *content_mask gets one byte per output byte,
	 * 1 where the byte was copied from a string of VARS (message text)
	 * rather than written by the template. The caller frees it. */
	uint8_t **content_mask;
};

/* Sensible limits for chat templates. */
void jinja_default_opts(struct jinja_opts *o);

/* Renders TMPL (TLEN bytes) with the variables of VARS (a JSON object; NULL
 * for none). Returns the text, NUL-terminated and malloc'd, its length in
 * *LEN; or NULL with a message in ERR: the template's own for
 * raise_exception, else what went wrong and the line. */
char *jinja_render(const char *tmpl, size_t tlen, const json_t *vars,
		   const struct jinja_opts *opts, size_t *len, char *err, size_t errlen);

/* Parses TMPL without running it: 0, or -1 with a message in ERR. */
int jinja_check(const char *tmpl, size_t tlen, char *err, size_t errlen);

#endif /* LOOM_JINJA_H */
