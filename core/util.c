#include "util.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void loom_seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

void loom_log(enum loom_log_level level, const char *fmt, ...)
{
	static const char *const names[] = { "debug", "info", "warning", "error" };
	char msg[2048];
	va_list ap;

	if (level < LOOM_LOG_WARN && !getenv("LOOM_DEBUG"))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* one write per line, so lines from several threads do not interleave */
	fprintf(stderr, "loom: %s: %s\n", names[level & 3], msg);
}

void loom_sb_putn(struct loom_sbuf *b, const char *s, size_t n)
{
	if (b->failed)
		return;
	if (n > SIZE_MAX / 4 - b->len) {
		b->failed = true;
		return;
	}
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *ns = realloc(b->s, cap);

		if (!ns) {
			b->failed = true;
			return;
		}
		b->s = ns;
		b->cap = cap;
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
}

void loom_sb_puts(struct loom_sbuf *b, const char *s)
{
	loom_sb_putn(b, s, strlen(s));
}

void loom_sb_printf(struct loom_sbuf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(tmp)) {
		b->failed = true;
		return;
	}
	loom_sb_putn(b, tmp, (size_t)n);
}

void loom_sb_free(struct loom_sbuf *b)
{
	free(b->s);
	memset(b, 0, sizeof(*b));
}
