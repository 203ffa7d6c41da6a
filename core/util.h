/* Small helpers shared by the core (internal). */
#ifndef LOOM_UTIL_H
#define LOOM_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "loom/backend.h" /* enum loom_log_level */

/* Formats a one-line error into err (if err and errlen are non-zero). */
void loom_seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The core's one log sink, where every services table lent to plugins
 * sends their messages: one line "loom: <level>: <message>" on stderr.
 * Debug and info lines only show with $LOOM_DEBUG set. */
void loom_log(enum loom_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));


#endif
