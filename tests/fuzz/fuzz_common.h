/* What the libFuzzer harnesses share: the test vocabularies. */
#ifndef LOOM_FUZZ_COMMON_H
#define LOOM_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include "loom.h"

/* A vocabulary of ../shared/data/tokenizer ($LOOM_SHARED_DIR), opened once;
 * the harness exits with a message if it is missing (tests/fuzz/run_fuzz.py
 * skips before that). */
static inline struct loom_tokenizer *fuzz_vocab(const char *name)
{
	const char *dir = getenv("LOOM_SHARED_DIR");
	char path[4096], err[512];
	struct loom_tokenizer *t;

	snprintf(path, sizeof(path), "%s/data/tokenizer/%s", dir ? dir : "../shared", name);
	t = loom_tokenizer_open(path, err, sizeof(err));
	if (!t) {
		fprintf(stderr, "fuzz: %s\n", err);
		exit(2);
	}
	return t;
}

#endif
