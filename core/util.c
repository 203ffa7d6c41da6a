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
