/*
 * Backend conformance suite (core/check): the harness every check shares,
 * devices, data, comparison, the watchdog and the per-op report. Run by
 * `loom check-backend` (check.c) and by tests/backend.
 */
#include "check/tb.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

bool tb_fast;
FILE *tb_log;

/* ---- devices ---- */

int dev_open(struct dev *d, const char *name, int n_threads, char *err, size_t errlen)
{
	return dev_open_flags(d, name, n_threads, 0, err, errlen);
}

int dev_open_flags(struct dev *d, const char *name, int n_threads, uint32_t flags, char *err,
		   size_t errlen)
{
	struct loom_backend_config cfg = {
		.struct_size = sizeof(cfg), .device = 0, .n_threads = n_threads, .flags = flags,
	};

	memset(d, 0, sizeof(*d));
	d->b = loom_backend_open(name, &cfg, err, errlen);
	if (!d->b)
		return -1;
	d->ops = d->b->ops;
	d->ctx = d->b->ctx;
	d->name = d->ops->name ? d->ops->name : name;
	return 0;
}

void dev_close(struct dev *d)
{
	dev_reset(d);
	loom_backend_close(d->b);
	d->b = NULL;
}

void *dev_put(struct dev *d, const void *src, size_t n)
{
	struct loom_buffer *buf;
	void *addr;

	if (d->n_bufs == TB_MAX_BUFS) {
		fprintf(stderr, "tb: too many buffers in one case\n");
		return NULL;
	}
	if (d->ops->buffer_alloc(d->ctx, n, &buf) != LOOM_OK)
		return NULL;
	d->bufs[d->n_bufs++] = buf;
	addr = d->ops->buffer_addr(d->ctx, buf);
	if (src && n && d->ops->upload(d->ctx, addr, src, n) != LOOM_OK)
		return NULL;
	return addr;
}

int dev_get(struct dev *d, void *dst, const void *src, size_t n)
{
	int rc = d->ops->synchronize(d->ctx);

	return rc ? rc : d->ops->download(d->ctx, dst, src, n);
}

void dev_reset(struct dev *d)
{
	while (d->n_bufs > 0)
		d->ops->buffer_free(d->ctx, d->bufs[--d->n_bufs]);
}

/* ---- data ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

void tb_seed(uint64_t seed)
{
	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
}

/* xorshift64*: deterministic, so every run sees the same cases. */
static uint64_t rng_next(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

float tb_rand(void)
{
	return (float)((rng_next() >> 40) * (2.0 / 16777216.0) - 1.0);
}

int64_t tb_rand_int(int64_t n)
{
	return (int64_t)(rng_next() % (uint64_t)n);
}

void tb_fill(float *x, int64_t n, float amp)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = amp * tb_rand();
}

void *tb_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		fprintf(stderr, "tb: out of memory (%zu bytes)\n", n);
		exit(2);
	}
	return p;
}

float *tb_poison(int64_t n)
{
	static const uint32_t nan_bits = 0x7fc0dead;
	float *x = tb_xmalloc((size_t)n * sizeof(float));

	for (int64_t i = 0; i < n; i++)
		memcpy(&x[i], &nan_bits, sizeof(float));
	return x;
}

/* ---- comparison ---- */

double tb_nmse(const float *a, const float *b, int64_t rows, int64_t n, int64_t stride)
{
	double err = 0.0, ref = 0.0;

	for (int64_t r = 0; r < rows; r++) {
		for (int64_t i = 0; i < n; i++) {
			double x = a[r * stride + i], y = b[r * stride + i];

			if (!isfinite(x))
				return INFINITY;
			err += (x - y) * (x - y);
			ref += y * y;
		}
	}
	return ref > 0.0 ? err / ref : err;
}

bool tb_padding_same(const float *a, const float *orig, int64_t rows, int64_t n,
		     int64_t stride)
{
	for (int64_t r = 0; r < rows; r++) {
		size_t pad = (size_t)(stride - n) * sizeof(float);

		if (pad && memcmp(a + r * stride + n, orig + r * stride + n, pad))
			return false;
	}
	return true;
}

/* ---- the watchdog: a hung or crashed backend fails with its case ---- */

static char current[320] = "FAIL startup: ";
static int log_fd = 1;

void tb_current(const struct dev *d, const char *op, const char *fmt, const char *desc)
{
	snprintf(current, sizeof(current), "FAIL %s %s %s: %s: ", d->name, op, fmt, desc);
}

static void say_and_exit(const char *why)
{
	ssize_t unused = write(log_fd, current, strlen(current));

	unused = write(log_fd, why, strlen(why));
	(void)unused;
	_exit(TB_EXIT_CRASH);
}

static void on_alarm(int sig)
{
	say_and_exit("timed out\n");
}

static void on_crash(int sig)
{
	say_and_exit(sig == SIGSEGV ? "crashed (SIGSEGV)\n" : sig == SIGBUS ? "crashed (SIGBUS)\n" :
		     sig == SIGFPE ? "crashed (SIGFPE)\n" : sig == SIGILL ? "crashed (SIGILL)\n" :
		     "crashed (SIGABRT)\n");
}

void tb_watchdog(unsigned seconds)
{
	static const int crashes[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT };

	log_fd = fileno(tb_out());
	signal(SIGALRM, on_alarm);
	for (size_t i = 0; i < sizeof(crashes) / sizeof(crashes[0]); i++)
		signal(crashes[i], on_crash);
	alarm(seconds);
}

FILE *tb_out(void)
{
	return tb_log ? tb_log : stdout;
}

/* ---- reporting: one tally per backend, op and format ---- */

struct tally {
	char name[32], op[24], fmt[16];
	double tol, worst;
	int cases, fails, skips;
};

static struct tally tallies[256];
static int n_tallies, n_failures;

static struct tally *tally_of(const struct dev *d, const char *op, const char *fmt)
{
	struct tally *t;

	for (int i = 0; i < n_tallies; i++) {
		t = &tallies[i];
		if (!strcmp(t->name, d->name) && !strcmp(t->op, op) && !strcmp(t->fmt, fmt))
			return t;
	}
	if (n_tallies == (int)(sizeof(tallies) / sizeof(tallies[0])))
		return &tallies[n_tallies - 1];
	t = &tallies[n_tallies++];
	snprintf(t->name, sizeof(t->name), "%s", d->name);
	snprintf(t->op, sizeof(t->op), "%s", op);
	snprintf(t->fmt, sizeof(t->fmt), "%s", fmt);
	return t;
}

void tb_result(const struct dev *d, const char *op, const char *fmt, double tol,
	       double nmse, const char *desc)
{
	struct tally *t = tally_of(d, op, fmt);

	t->cases++;
	t->tol = tol;
	if (!(nmse <= t->worst))
		t->worst = nmse;
	if (!(nmse <= tol)) {
		t->fails++;
		n_failures++;
		fprintf(tb_out(), "FAIL %s %s %s: %s: nmse %.3g > %.3g\n", d->name, op, fmt,
			desc, nmse, tol);
	}
}

void tb_fail(const struct dev *d, const char *op, const char *fmt, const char *msg, ...)
{
	struct tally *t = tally_of(d, op, fmt);
	va_list ap;

	t->cases++;
	t->fails++;
	n_failures++;
	fprintf(tb_out(), "FAIL %s %s %s: ", d->name, op, fmt);
	va_start(ap, msg);
	vfprintf(tb_out(), msg, ap);
	va_end(ap);
	fprintf(tb_out(), "\n");
}

void tb_skip(const struct dev *d, const char *op, const char *fmt)
{
	tally_of(d, op, fmt)->skips++;
}

int tb_failures(void)
{
	return n_failures;
}

static const char *tally_verdict(const struct tally *t)
{
	return t->cases == 0 ? "skipped" : t->fails ? "FAIL" : "ok";
}

int tb_summary(void)
{
	FILE *out = tb_out();

	for (int i = 0; i < n_tallies; i++) {
		const struct tally *t = &tallies[i];

		fprintf(out, "  %-5s %-13s %-5s ", t->name, t->op, t->fmt);
		if (t->cases == 0)
			fprintf(out, " skipped (unsupported, %d cases)\n", t->skips);
		else if (t->tol > 0.0 || t->fails)
			fprintf(out, " %4d cases  max nmse %-9.3g tol %-7.1g %s\n", t->cases,
				t->worst, t->tol, tally_verdict(t));
		else
			fprintf(out, " %4d cases  exact %s\n", t->cases, tally_verdict(t));
	}
	return n_failures;
}

void tb_json_string(FILE *out, const char *s)
{
	fputc('"', out);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c < 0x20)
			fprintf(out, "\\u%04x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}

void tb_summary_json(FILE *out)
{
	fprintf(out, "[");
	for (int i = 0; i < n_tallies; i++) {
		const struct tally *t = &tallies[i];

		/* the backend's name comes from its table: escaped */
		fprintf(out, "%s\n  {\"backend\": ", i ? "," : "");
		tb_json_string(out, t->name);
		fprintf(out, ", \"op\": \"%s\", \"format\": \"%s\", "
			"\"cases\": %d, \"failed\": %d, \"skipped\": %d, ",
			t->op, t->fmt, t->cases, t->fails, t->skips);
		if (isfinite(t->worst))
			fprintf(out, "\"max_nmse\": %.3g, ", t->worst);
		else
			fprintf(out, "\"max_nmse\": null, ");
		fprintf(out, "\"tolerance\": %.3g, \"result\": \"%s\"}", t->tol,
			tally_verdict(t));
	}
	fprintf(out, "\n]");
}

/* Whether an earlier tally of the same op and format failed too. */
static bool failed_before(int i)
{
	for (int j = 0; j < i; j++)
		if (tallies[j].fails && !strcmp(tallies[j].op, tallies[i].op) &&
		    !strcmp(tallies[j].fmt, tallies[i].fmt))
			return true;
	return false;
}

void tb_failed_ops(char *buf, size_t cap)
{
	size_t len;

	buf[0] = '\0';
	for (int i = 0; i < n_tallies; i++) {
		/* each pair once, though several modes may fail it */
		if (!tallies[i].fails || failed_before(i))
			continue;
		len = strlen(buf);
		snprintf(buf + len, cap - len, "%s%s %s", len ? ", " : "", tallies[i].op,
			 tallies[i].fmt);
	}
}

bool tb_status_ok(const struct dev *d, const char *op, const char *fmt,
		  bool supported, int rc, const char *desc)
{
	if (supported && rc == LOOM_OK)
		return true;
	if (!supported && rc == LOOM_ERR_UNSUPPORTED) {
		tb_skip(d, op, fmt);
		return false;
	}
	tb_fail(d, op, fmt, "%s: supports() says %s but the call returned %s", desc,
		supported ? "yes" : "no", tb_status_name(rc));
	return false;
}

const char *tb_type_name(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_F32: return "f32";
	case LOOM_TYPE_F16: return "f16";
	case LOOM_TYPE_BF16: return "bf16";
	case LOOM_TYPE_MXFP4: return "mxfp4";
	case LOOM_TYPE_Q8_0: return "q8_0";
	case LOOM_TYPE_Q4_0: return "q4_0";
	case LOOM_TYPE_Q4_1: return "q4_1";
	case LOOM_TYPE_Q5_0: return "q5_0";
	case LOOM_TYPE_Q5_1: return "q5_1";
	case LOOM_TYPE_Q2_K: return "q2_K";
	case LOOM_TYPE_Q3_K: return "q3_K";
	case LOOM_TYPE_Q4_K: return "q4_K";
	case LOOM_TYPE_Q5_K: return "q5_K";
	case LOOM_TYPE_Q6_K: return "q6_K";
	default: return "?";
	}
}

const char *tb_status_name(int rc)
{
	switch (rc) {
	case LOOM_OK: return "LOOM_OK";
	case LOOM_ERR_INVALID: return "LOOM_ERR_INVALID";
	case LOOM_ERR_NOMEM: return "LOOM_ERR_NOMEM";
	case LOOM_ERR_UNSUPPORTED: return "LOOM_ERR_UNSUPPORTED";
	case LOOM_ERR_DEVICE: return "LOOM_ERR_DEVICE";
	default: return "an unknown status";
	}
}
