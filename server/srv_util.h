/* Small helpers of `loom serve`: a growing byte string, error formatting. */
#ifndef LOOM_SRV_UTIL_H
#define LOOM_SRV_UTIL_H

#include <stdbool.h>
#include <stddef.h>

/* A growing NUL-terminated byte string. Zero-initialize; an allocation
 * failure sets `failed`, after which appends do nothing. */
struct sbuf {
	char *s;
	size_t len, cap;
	bool failed;
};

void sb_putn(struct sbuf *b, const char *s, size_t n);
void sb_puts(struct sbuf *b, const char *s);
void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(struct sbuf *b);

/* Formats a one-line error into err (if err and errlen are non-zero). */
void srv_seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
