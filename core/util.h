/* Small helpers shared by the core (internal). */
#ifndef LOOM_UTIL_H
#define LOOM_UTIL_H

#include <stddef.h>

/* Formats a one-line error into err (if err and errlen are non-zero). */
void loom_seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
