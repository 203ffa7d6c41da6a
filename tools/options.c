/* Options shared by the command line and the INI config file. */
#include "options.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void loom_options_defaults(struct loom_options *o)
{
	memset(o, 0, sizeof(*o));
	snprintf(o->backend, sizeof(o->backend), "cpu.so");
	o->n_predict = 128;
	o->n_threads = 0;
	o->n_ctx = 4096;
	o->n_batch = 256;
	o->progress = true;
	loom_sampler_defaults(&o->sp);
	o->n_prompt = 128;
	o->n_gen = 64;
	o->reps = 3;
}

int loom_options_parse_int(const char *key, const char *v, long lo, long hi,
			    int *out, char *err, size_t errlen)
{
	char *end;
	long x;

	errno = 0;
	x = strtol(v, &end, 10);
	if (errno || end == v || *end || x < lo || x > hi) {
		snprintf(err, errlen, "%s: '%s' is not an integer in [%ld, %ld]", key, v, lo, hi);
		return -1;
	}
	*out = (int)x;
	return 0;
}

static int parse_float(const char *key, const char *v, float lo, float hi,
		       float *out, char *err, size_t errlen)
{
	char *end;
	float x;

	errno = 0;
	x = strtof(v, &end);
	if (errno || end == v || *end || !(x >= lo && x <= hi)) {
		snprintf(err, errlen, "%s: '%s' is not a number in [%g, %g]", key, v, lo, hi);
		return -1;
	}
	*out = x;
	return 0;
}

static int parse_u64(const char *key, const char *v, uint64_t *out, char *err,
		     size_t errlen)
{
	char *end;
	unsigned long long x;

	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-') {
		snprintf(err, errlen, "%s: '%s' is not a non-negative integer", key, v);
		return -1;
	}
	*out = x;
	return 0;
}

static int copy_str(const char *key, const char *v, char *dst, size_t cap,
		    char *err, size_t errlen)
{
	if (strlen(v) >= cap) {
		snprintf(err, errlen, "%s: value too long", key);
		return -1;
	}
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

/* spec, spec_max_draft, ...: speculative decoding. */
static int set_spec(struct loom_options *o, const char *key, const char *v,
		    char *err, size_t errlen)
{
	if (!strcmp(key, "spec"))
		return copy_str(key, v, o->spec, sizeof(o->spec), err, errlen);
	if (!strcmp(key, "spec_draft_model"))
		return copy_str(key, v, o->spec_draft_model, sizeof(o->spec_draft_model),
				err, errlen);
	if (!strcmp(key, "spec_max_draft"))
		return loom_options_parse_int(key, v, 1, 64, &o->spec_max_draft, err, errlen);
	if (!strcmp(key, "spec_min_draft"))
		return loom_options_parse_int(key, v, 1, 64, &o->spec_min_draft, err, errlen);
	if (!strcmp(key, "spec_ngram_min"))
		return loom_options_parse_int(key, v, 1, 64, &o->spec_ngram_min, err, errlen);
	if (!strcmp(key, "spec_ngram_max"))
		return loom_options_parse_int(key, v, 1, 64, &o->spec_ngram_max, err, errlen);
	if (!strcmp(key, "spec_layers"))
		return loom_options_parse_int(key, v, 1, 4096, &o->spec_layers, err, errlen);
	snprintf(err, errlen, "unknown key '%s'", key);
	return -1;
}

int loom_options_set(struct loom_options *o, const char *key, const char *v,
		     char *err, size_t errlen)
{
	struct loom_sampler_params *sp = &o->sp;

	if (!strcmp(key, "backend"))
		return copy_str(key, v, o->backend, sizeof(o->backend), err, errlen);
	if (!strcmp(key, "model"))
		return copy_str(key, v, o->model, sizeof(o->model), err, errlen);
	if (!strcmp(key, "threads"))
		return loom_options_parse_int(key, v, 0, 1024, &o->n_threads, err, errlen);
	if (!strcmp(key, "n_predict"))
		return loom_options_parse_int(key, v, -1, INT_MAX, &o->n_predict, err, errlen);
	if (!strcmp(key, "ctx_size"))
		return loom_options_parse_int(key, v, 1, 1 << 24, &o->n_ctx, err, errlen);
	if (!strcmp(key, "batch_size"))
		return loom_options_parse_int(key, v, 1, 1 << 16, &o->n_batch, err, errlen);
	if (!strcmp(key, "temp"))
		return parse_float(key, v, 0.0f, 100.0f, &sp->temp, err, errlen);
	if (!strcmp(key, "top_k"))
		return loom_options_parse_int(key, v, 0, INT_MAX, &sp->top_k, err, errlen);
	if (!strcmp(key, "top_p"))
		return parse_float(key, v, 0.0f, 1.0f, &sp->top_p, err, errlen);
	if (!strcmp(key, "min_p"))
		return parse_float(key, v, 0.0f, 1.0f, &sp->min_p, err, errlen);
	if (!strcmp(key, "repeat_penalty"))
		return parse_float(key, v, 0.0f, 100.0f, &sp->repeat_penalty, err, errlen);
	if (!strcmp(key, "presence_penalty"))
		return parse_float(key, v, -100.0f, 100.0f, &sp->presence_penalty, err, errlen);
	if (!strcmp(key, "frequency_penalty"))
		return parse_float(key, v, -100.0f, 100.0f, &sp->frequency_penalty, err, errlen);
	if (!strcmp(key, "repeat_last_n"))
		return loom_options_parse_int(key, v, 0, INT_MAX, &sp->penalty_last_n, err, errlen);
	if (!strcmp(key, "seed"))
		return parse_u64(key, v, &sp->seed, err, errlen);
	if (!strncmp(key, "spec", 4))
		return set_spec(o, key, v, err, errlen);
	snprintf(err, errlen, "unknown key '%s'", key);
	return -1;
}

struct ini_state {
	struct loom_options *o;
	const char *path;
	char *err;
	size_t errlen;
	char why[512];
	bool failed;
};

/* Debian's inih passes no line number to the handler; ini_parse returns
 * the line of the first handler failure instead, so the message is kept
 * here and the line added afterwards. */
static int on_ini_entry(void *user, const char *section, const char *key,
		       const char *value)
{
	struct ini_state *st = user;

	if (st->failed)
		return 0;
	if (section[0] && strcmp(section, "loom") != 0) {
		snprintf(st->why, sizeof(st->why), "key '%s' in unknown section [%s]",
			 key, section);
		st->failed = true;
		return 0;
	}
	if (loom_options_set(st->o, key, value, st->why, sizeof(st->why))) {
		st->failed = true;
		return 0;
	}
	return 1;
}

int loom_options_load_ini(struct loom_options *o, const char *path, char *err,
			  size_t errlen)
{
	struct ini_state st = { .o = o, .path = path, .err = err, .errlen = errlen };
	int rc = ini_parse(path, on_ini_entry, &st);

	if (rc == -1) {
		snprintf(err, errlen, "%s: cannot open config file: %s", path, strerror(errno));
		return -1;
	}
	if (st.failed) {
		snprintf(err, errlen, "%s:%d: %s", path, rc, st.why);
		return -1;
	}
	if (rc) {
		snprintf(err, errlen, "%s:%d: syntax error", path, rc);
		return -1;
	}
	return 0;
}
