/* Small helpers of `loom serve` (srv_util.h). */
#include "srv_util.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sb_putn(struct sbuf *b, const char *s, size_t n)
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

void sb_puts(struct sbuf *b, const char *s)
{
	sb_putn(b, s, strlen(s));
}

void sb_printf(struct sbuf *b, const char *fmt, ...)
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
	sb_putn(b, tmp, (size_t)n);
}

void sb_free(struct sbuf *b)
{
	free(b->s);
	memset(b, 0, sizeof(*b));
}

void srv_seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}
