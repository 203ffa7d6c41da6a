/* Command-line and config-file options of the `loom` tool. */
#ifndef LOOM_OPTIONS_H
#define LOOM_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/sampler.h"

struct loom_options {
	char backend[4096];
	char model[4096];
	char prompt_file[4096];
	char dump_logits[4096];
	char dump_tokens[4096];
	const char *prompt;
	int n_predict;
	int n_threads;
	int n_ctx;
	int n_batch;
	bool no_bos;
	bool progress;
	struct loom_sampler_params sp;
	/* bench */
	int n_prompt;
	int n_gen;
	int reps;
	char threads_list[256];
	/* speculative decoding (docs/SPECULATIVE.md); 0: the engine's default */
	char spec[4096];             /* plugin name or path; "" or "none": off */
	char spec_draft_model[4096];
	int spec_min_draft, spec_max_draft;
	int spec_ngram_min, spec_ngram_max;
	int spec_layers;
};

void loom_options_defaults(struct loom_options *o);
/* Reads an INI file (keys in [loom] or no section). 0, or -1 with a message
 * naming the file, line and key in err. */
int loom_options_load_ini(struct loom_options *o, const char *path, char *err,
			  size_t errlen);
/* Applies one option by name (shared by the INI reader and the command
 * line). 0, or -1 with the reason in err. */
int loom_options_set(struct loom_options *o, const char *key, const char *value,
		     char *err, size_t errlen);

/* Parses a decimal integer in [lo, hi] for option `key`; 0, or -1 with a
 * message naming the key and the range. */
int loom_options_parse_int(const char *key, const char *v, long lo, long hi,
			   int *out, char *err, size_t errlen);

#endif
