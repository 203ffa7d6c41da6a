/* loom backends and loom check-backend (tools/backends.c, tools/check.c). */
#ifndef LOOM_TOOLS_BACKENDS_H
#define LOOM_TOOLS_BACKENDS_H

#include <stddef.h>
#include <stdio.h>

#include "options.h"

/* s as a JSON string literal on out. */
void loom_json_string(FILE *out, const char *s);
/* `loom backends`: 0, or -1 with err (no backend found at all). */
int loom_backends_main(const struct loom_options *o, char *err, size_t errlen);

/* `loom check-backend PATH`: 0 when every check passed; -1 with err (the
 * failed ops, or why the check could not run). */
int loom_check_main(const struct loom_options *o, char *err, size_t errlen);

#endif /* LOOM_TOOLS_BACKENDS_H */
