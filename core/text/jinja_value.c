/* Jinja values: the arena, constructors, comparison, printing as Python
 * prints (str, repr, json.dumps), and the render entry point. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "text/jinja_impl.h"

/* ---- arena ---- */

struct achunk {
	struct achunk *next;
	size_t cap, off;
	_Alignas(16) unsigned char data[];
};

struct jarena {
	struct achunk *head;
	size_t total, max;
};

void *jx_alloc(struct jctx *c, size_t n)
{
	struct jarena *a = c->arena;
	struct achunk *h = a->head;

	n = (n + 15) & ~(size_t)15;
	if (n == 0 || n > a->max)
		jx_fail(c, "out of memory (more than %zu bytes)", a->max);
	if (!h || h->cap - h->off < n) {
		size_t cap = n > 65536 ? n : 65536;

		if (a->total + cap > a->max)
			jx_fail(c, "out of memory (more than %zu bytes)", a->max);
		h = calloc(1, sizeof(*h) + cap);
		if (!h)
			jx_fail(c, "out of memory");
		h->cap = cap;
		h->next = a->head;
		a->head = h;
		a->total += cap;
	}
	h->off += n;
	return h->data + h->off - n;
}

void *jx_alloc_array(struct jctx *c, size_t count, size_t size)
{
	if (size && count > SIZE_MAX / size)
		jx_fail(c, "out of memory (array of %zu)", count);
	return jx_alloc(c, count && size ? count * size : 1);
}

char *jx_strdup(struct jctx *c, const char *s, size_t n)
{
	char *d = jx_alloc(c, n + 1);

	memcpy(d, s, n);
	d[n] = 0;
	return d;
}

static void arena_free(struct jarena *a)
{
	while (a->head) {
		struct achunk *h = a->head;

		a->head = h->next;
		free(h);
	}
}

void jx_fail(struct jctx *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, c->errlen, fmt, ap);
	va_end(ap);
	longjmp(c->jb, 1);
}

void jx_step(struct jctx *c, uint64_t n)
{
	c->steps += n;
	if (c->steps > c->o->max_steps)
		jx_fail(c, "line %d: template ran more than %llu steps", c->line,
			(unsigned long long)c->o->max_steps);
}

uint64_t jv_cost(struct jv v)
{
	if (v.k == JK_STR)
		return v.u.s.n / 64;
	if (v.k == JK_LIST)
		return v.u.l->n;
	if (v.k == JK_DICT)
		return v.u.d->n;
	return 0;
}

/* ---- constructors ---- */

struct jv jv_undef(const char *name)
{
	return (struct jv){ .k = JK_UNDEF, .u.name = name };
}

struct jv jv_undef_attr(struct jctx *c, struct jv obj, const char *attr)
{
	const char *t = jv_type(obj);
	size_t n = strlen(t) + strlen(attr) + 40;
	char *m = jx_alloc(c, n);
	struct jv u = jv_undef(m);

	snprintf(m, n, "'%s object' has no attribute '%s'", t, attr);
	u.fl = JF_MSG;
	return u;
}

void jx_fail_undef(struct jctx *c, struct jv u)
{
	if (u.fl & JF_MSG)
		jx_fail(c, "line %d: UndefinedError: %s", c->line, u.u.name);
	if (u.u.name)
		jx_fail(c, "line %d: UndefinedError: '%s' is undefined", c->line, u.u.name);
	jx_fail(c, "line %d: UndefinedError: a value is undefined", c->line);
}

struct jv jv_none(void)
{
	return (struct jv){ .k = JK_NONE };
}

struct jv jv_bool(bool b)
{
	return (struct jv){ .k = JK_BOOL, .u.b = b };
}

struct jv jv_int(int64_t i)
{
	return (struct jv){ .k = JK_INT, .u.i = i };
}

struct jv jv_float(double f)
{
	return (struct jv){ .k = JK_FLOAT, .u.f = f };
}

struct jv jv_str(const char *p, size_t n)
{
	struct jv v = { .k = JK_STR };

	v.u.s.p = p;
	v.u.s.n = n;
	return v;
}

struct jv jv_cstr(const char *s)
{
	return jv_str(s, strlen(s));
}

struct jv jv_sub(struct jv s, size_t off, size_t n)
{
	struct jv r = jv_str(s.u.s.p + off, n);

	r.fl = s.fl & JF_CTX;
	if (s.u.s.m)
		r.u.s.m = s.u.s.m + off;
	return r;
}

struct jv jv_list(struct jctx *c, size_t cap)
{
	struct jv v = { .k = JK_LIST };

	v.u.l = jx_alloc(c, sizeof(*v.u.l));
	if (cap) {
		v.u.l->v = jx_alloc_array(c, cap, sizeof(struct jv));
		v.u.l->cap = cap;
	}
	return v;
}

struct jv jv_dict(struct jctx *c)
{
	struct jv v = { .k = JK_DICT };

	v.u.d = jx_alloc(c, sizeof(*v.u.d));
	return v;
}

void jl_push(struct jctx *c, struct jlist *l, struct jv v)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 4;
		struct jv *nv = jx_alloc_array(c, cap, sizeof(*nv));

		if (l->n)
			memcpy(nv, l->v, l->n * sizeof(*nv));
		l->v = nv;
		l->cap = cap;
	}
	l->v[l->n++] = v;
}

static bool key_eq(struct jv a, struct jv b)
{
	if (a.k == JK_STR && b.k == JK_STR)
		return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
	return jv_eq(a, b);
}

struct jv *jd_get(const struct jdict *d, struct jv key)
{
	for (size_t i = 0; i < d->n; i++)
		if (key_eq(d->e[i].key, key))
			return &d->e[i].val;
	return NULL;
}

struct jv *jd_gets(const struct jdict *d, const char *key)
{
	return jd_get(d, jv_cstr(key));
}

static void jd_append(struct jctx *c, struct jdict *d, struct jv key, struct jv val)
{
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 4;
		struct jpair *ne = jx_alloc_array(c, cap, sizeof(*ne));

		if (d->n)
			memcpy(ne, d->e, d->n * sizeof(*ne));
		d->e = ne;
		d->cap = cap;
	}
	d->e[d->n++] = (struct jpair){ key, val };
}

void jd_set(struct jctx *c, struct jdict *d, struct jv key, struct jv val)
{
	struct jv *old = jd_get(d, key);

	if (old) {
		*old = val;
		return;
	}
	jd_append(c, d, key, val);
}

/* ---- semantics ---- */

bool jv_truthy(struct jv v)
{
	switch (v.k) {
	case JK_UNDEF:
	case JK_NONE:
		return false;
	case JK_BOOL:
		return v.u.b;
	case JK_INT:
		return v.u.i != 0;
	case JK_FLOAT:
		return v.u.f != 0;
	case JK_STR:
		return v.u.s.n > 0;
	case JK_LIST: /* a generator is true even when empty, as in Python */
		return v.u.l->n > 0 || (v.fl & JF_GEN);
	case JK_DICT:
		return v.u.d->n > 0;
	default:
		return true;
	}
}

static bool is_num(struct jv v)
{
	return v.k == JK_INT || v.k == JK_FLOAT || v.k == JK_BOOL;
}

static double num(struct jv v)
{
	return v.k == JK_FLOAT ? v.u.f : v.k == JK_INT ? (double)v.u.i : v.u.b;
}

bool jv_eq(struct jv a, struct jv b)
{
	if (is_num(a) && is_num(b)) {
		if (a.k != JK_FLOAT && b.k != JK_FLOAT)
			return (a.k == JK_INT ? a.u.i : a.u.b) == (b.k == JK_INT ? b.u.i : b.u.b);
		return num(a) == num(b);
	}
	if (a.k != b.k)
		return false;
	switch (a.k) {
	case JK_UNDEF:
	case JK_NONE:
		return true;
	case JK_STR:
		return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
	case JK_LIST: /* a list never equals a tuple, as in Python */
		if (a.u.l->n != b.u.l->n || ((a.fl ^ b.fl) & JF_TUPLE))
			return false;
		for (size_t i = 0; i < a.u.l->n; i++)
			if (!jv_eq(a.u.l->v[i], b.u.l->v[i]))
				return false;
		return true;
	case JK_DICT:
		if (a.u.d->n != b.u.d->n)
			return false;
		for (size_t i = 0; i < a.u.d->n; i++) {
			struct jv *o = jd_get(b.u.d, a.u.d->e[i].key);

			if (!o || !jv_eq(a.u.d->e[i].val, *o))
				return false;
		}
		return true;
	case JK_MACRO:
		return a.u.mac == b.u.mac;
	default:
		return false;
	}
}

int jv_cmp(struct jctx *c, struct jv a, struct jv b)
{
	if (a.k == JK_UNDEF)
		jx_fail_undef(c, a);
	if (b.k == JK_UNDEF)
		jx_fail_undef(c, b);
	if (is_num(a) && is_num(b)) {
		if (a.k == JK_INT && b.k == JK_INT)
			return (a.u.i > b.u.i) - (a.u.i < b.u.i);
		return (num(a) > num(b)) - (num(a) < num(b));
	}
	if (a.k == JK_STR && b.k == JK_STR) {
		size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
		int r = memcmp(a.u.s.p, b.u.s.p, n);

		return r ? r : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
	}
	if (a.k == JK_LIST && b.k == JK_LIST) {
		for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
			if (!jv_eq(a.u.l->v[i], b.u.l->v[i]))
				return jv_cmp(c, a.u.l->v[i], b.u.l->v[i]);
		}
		return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
	}
	jx_fail(c, "line %d: TypeError: '<' not supported between instances of '%s' and '%s'",
		c->line, jv_type(a), jv_type(b));
}

const char *jv_type(struct jv v)
{
	switch (v.k) {
	case JK_UNDEF:
		return "Undefined";
	case JK_NONE:
		return "NoneType";
	case JK_BOOL:
		return "bool";
	case JK_INT:
		return "int";
	case JK_FLOAT:
		return "float";
	case JK_STR:
		return "str";
	case JK_LIST:
		return v.fl & JF_GEN ? "generator" : v.fl & JF_TUPLE ? "tuple" : "list";
	case JK_DICT:
		return v.fl & JF_NS ? "Namespace" : "dict";
	case JK_MACRO:
		return "Macro";
	default:
		return "function";
	}
}

/* ---- JSON in ---- */

struct jv jv_from_json(struct jctx *c, const json_t *j, int depth)
{
	struct jv v;

	if (depth > c->o->max_depth)
		jx_fail(c, "variables nested deeper than %d", c->o->max_depth);
	switch (json_typeof(j)) {
	case JSON_OBJECT: {
		const char *k;
		json_t *x;

		v = jv_dict(c);
		json_object_foreach((json_t *)j, k, x) {
			struct jv key = jv_str(jx_strdup(c, k, strlen(k)), strlen(k));

			key.fl = JF_CTX;
			jx_step(c, 1);
			/* JSON object keys are unique: no lookup */
			jd_append(c, v.u.d, key, jv_from_json(c, x, depth + 1));
		}
		return v;
	}
	case JSON_ARRAY:
		v = jv_list(c, json_array_size(j));
		jx_step(c, json_array_size(j));
		for (size_t i = 0; i < json_array_size(j); i++)
			jl_push(c, v.u.l, jv_from_json(c, json_array_get(j, i), depth + 1));
		return v;
	case JSON_STRING:
		v = jv_str(jx_strdup(c, json_string_value(j), json_string_length(j)),
			   json_string_length(j));
		v.fl = JF_CTX;
		return v;
	case JSON_INTEGER:
		return jv_int(json_integer_value(j));
	case JSON_REAL:
		return jv_float(json_real_value(j));
	case JSON_TRUE:
		return jv_bool(true);
	case JSON_FALSE:
		return jv_bool(false);
	default:
		return jv_none();
	}
}

/* ---- buffers ---- */

static void jb_grow(struct jctx *c, struct jbuf *b, size_t n)
{
	size_t need, cap;
	char *p;
	uint8_t *m;

	if (n > c->o->max_output || b->n > c->o->max_output - n)
		jx_fail(c, "line %d: output larger than %zu bytes", c->line, c->o->max_output);
	need = b->n + n;
	if (need <= b->cap)
		return;
	cap = b->cap ? b->cap : 64;
	while (cap < need)
		cap *= 2;
	p = jx_alloc(c, cap + 1);
	m = jx_alloc(c, cap + 1);
	if (b->n) {
		memcpy(p, b->p, b->n);
		memcpy(m, b->m, b->n);
	}
	b->p = p;
	b->m = m;
	b->cap = cap;
}

void jb_put(struct jctx *c, struct jbuf *b, const char *p, size_t n, const uint8_t *m)
{
	if (!n)
		return;
	jx_step(c, n / 64); /* copying text costs steps too, so no loop copies for free */
	jb_grow(c, b, n);
	memcpy(b->p + b->n, p, n);
	if (m) {
		memcpy(b->m + b->n, m, n);
		b->any = true;
	} else {
		memset(b->m + b->n, 0, n);
	}
	b->n += n;
	b->p[b->n] = 0;
}

void jb_putv(struct jctx *c, struct jbuf *b, struct jv s)
{
	if (!(s.fl & JF_CTX) || !s.u.s.n) {
		jb_put(c, b, s.u.s.p, s.u.s.n, s.u.s.m);
		return;
	}
	jb_put(c, b, s.u.s.p, s.u.s.n, NULL);
	memset(b->m + b->n - s.u.s.n, 1, s.u.s.n);
	b->any = true;
}

void jb_putc(struct jctx *c, struct jbuf *b, char ch)
{
	jb_put(c, b, &ch, 1, NULL);
}

void jb_puts(struct jctx *c, struct jbuf *b, const char *s)
{
	jb_put(c, b, s, strlen(s), NULL);
}

struct jv jb_str(struct jbuf *b)
{
	struct jv v = jv_str(b->p ? b->p : "", b->n);

	if (b->any)
		v.u.s.m = b->m;
	return v;
}

/* ---- printing ---- */

/* Python's repr of a float: the shortest digits that read back the same,
 * positional from 1e-4 up to 1e16, else with an exponent. */
void fmt_float(double f, char *buf, size_t len)
{
	char e[40], digits[24];
	int prec, exp, nd = 0;
	char *p;

	if (isnan(f)) {
		snprintf(buf, len, "nan");
		return;
	}
	if (isinf(f)) {
		snprintf(buf, len, f < 0 ? "-inf" : "inf");
		return;
	}
	for (prec = 0; prec < 17; prec++) {
		snprintf(e, sizeof(e), "%.*e", prec, f);
		if (strtod(e, NULL) == f)
			break;
	}
	for (p = e; *p && *p != 'e'; p++)
		if (*p >= '0' && *p <= '9')
			digits[nd++] = *p;
	digits[nd] = 0;
	exp = atoi(p + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		digits[--nd] = 0;
	const char *sign = f < 0 || (f == 0 && signbit(f)) ? "-" : "";

	if (exp < -4 || exp >= 16) {
		snprintf(buf, len, "%s%c%s%s%se%c%02d", sign, digits[0], nd > 1 ? "." : "",
			 digits + 1, "", exp < 0 ? '-' : '+', abs(exp));
	} else if (exp < 0) {
		snprintf(buf, len, "%s0.%0*d%s", sign, -exp - 1, 0, digits);
		if (exp == -1) /* %0*d with width 0 still prints one 0 */
			snprintf(buf, len, "%s0.%s", sign, digits);
	} else if (nd <= exp + 1) {
		snprintf(buf, len, "%s%s%0*d.0", sign, digits, exp + 1 - nd, 0);
		if (nd == exp + 1)
			snprintf(buf, len, "%s%s.0", sign, digits);
	} else {
		snprintf(buf, len, "%s%.*s.%s", sign, exp + 1, digits, digits + exp + 1);
	}
}

/* Whether Python's repr escapes code point U (>= 0x80): the C1 controls,
 * the Unicode spaces and the common format characters (not printable). */
static bool repr_escapes(uint32_t u)
{
	return u <= 0xa0 || u == 0xad || u == 0x1680 || (u >= 0x2000 && u <= 0x200f) ||
	       (u >= 0x2028 && u <= 0x202f) || (u >= 0x205f && u <= 0x206f) || u == 0x3000 ||
	       u == 0xfeff;
}

/* The code point of the UTF-8 character at P (N bytes left) and its
 * length; a malformed byte is -1, one byte. */
static int32_t utf8_at(const char *p, size_t n, size_t *len)
{
	const unsigned char *q = (const unsigned char *)p;
	size_t k = q[0] >= 0xf0 ? 4 : q[0] >= 0xe0 ? 3 : q[0] >= 0xc0 ? 2 : 1;
	uint32_t u = k == 1 ? q[0] : q[0] & (0x3f >> (k - 1));

	*len = 1;
	if (k > n || q[0] >= 0xf8 || (q[0] >= 0x80 && q[0] < 0xc0))
		return q[0] < 0x80 ? q[0] : -1;
	for (size_t i = 1; i < k; i++) {
		if ((q[i] & 0xc0) != 0x80)
			return -1;
		u = u << 6 | (q[i] & 0x3f);
	}
	*len = k;
	return (int32_t)u;
}

/* The marks of bytes I.. of S, for K bytes copied as they are */
static const uint8_t *marks_at(struct jv s, size_t i)
{
	static const uint8_t ones[4] = { 1, 1, 1, 1 };

	return (s.fl & JF_CTX) ? ones : s.u.s.m ? s.u.s.m + i : NULL;
}

static void repr_str(struct jctx *c, struct jbuf *b, struct jv s)
{
	bool sq = memchr(s.u.s.p, '\'', s.u.s.n) && !memchr(s.u.s.p, '"', s.u.s.n);
	char q = sq ? '"' : '\'';

	jb_putc(c, b, q);
	for (size_t i = 0, k; i < s.u.s.n; i += k) {
		int32_t u = utf8_at(s.u.s.p + i, s.u.s.n - i, &k);
		char esc[16];

		if (u == '\\' || u == q) {
			esc[0] = '\\';
			esc[1] = (char)u;
			jb_put(c, b, esc, 2, NULL);
		} else if (u == '\n' || u == '\r' || u == '\t') {
			jb_puts(c, b, u == '\n' ? "\\n" : u == '\r' ? "\\r" : "\\t");
		} else if (u < 0 || u < 0x20 || u == 0x7f || (u >= 0x80 && repr_escapes((uint32_t)u))) {
			if (u < 0) /* not UTF-8: Python would have no str; show the byte */
				u = (unsigned char)s.u.s.p[i];
			snprintf(esc, sizeof(esc), u < 0x100 ? "\\x%02x" : "\\u%04x", (unsigned)u);
			jb_puts(c, b, esc);
		} else {
			jb_put(c, b, s.u.s.p + i, k, marks_at(s, i));
		}
	}
	jb_putc(c, b, q);
}

static void print_depth(struct jctx *c, int depth)
{
	if (depth > c->o->max_depth)
		jx_fail(c, "line %d: value nested deeper than %d", c->line, c->o->max_depth);
}

static void print_val(struct jctx *c, struct jbuf *b, struct jv v, bool repr, int depth)
{
	char num[40];

	print_depth(c, depth);
	jx_step(c, 1);
	switch (v.k) {
	case JK_UNDEF:
		if (repr)
			jb_puts(c, b, "Undefined");
		return;
	case JK_NONE:
		jb_puts(c, b, "None");
		return;
	case JK_BOOL:
		jb_puts(c, b, v.u.b ? "True" : "False");
		return;
	case JK_INT:
		snprintf(num, sizeof(num), "%lld", (long long)v.u.i);
		jb_puts(c, b, num);
		return;
	case JK_FLOAT:
		fmt_float(v.u.f, num, sizeof(num));
		jb_puts(c, b, num);
		return;
	case JK_STR:
		repr ? repr_str(c, b, v) : jb_putv(c, b, v);
		return;
	case JK_LIST:
		if (v.fl & JF_GEN) {
			jb_puts(c, b, "<generator object>");
			return;
		}
		jb_putc(c, b, v.fl & JF_TUPLE ? '(' : '[');
		for (size_t i = 0; i < v.u.l->n; i++) {
			if (i)
				jb_puts(c, b, ", ");
			print_val(c, b, v.u.l->v[i], true, depth + 1);
		}
		if ((v.fl & JF_TUPLE) && v.u.l->n == 1)
			jb_putc(c, b, ',');
		jb_putc(c, b, v.fl & JF_TUPLE ? ')' : ']');
		return;
	case JK_DICT:
		if (v.fl & JF_NS)
			jb_puts(c, b, "<Namespace ");
		jb_putc(c, b, '{');
		for (size_t i = 0; i < v.u.d->n; i++) {
			if (i)
				jb_puts(c, b, ", ");
			print_val(c, b, v.u.d->e[i].key, true, depth + 1);
			jb_puts(c, b, ": ");
			print_val(c, b, v.u.d->e[i].val, true, depth + 1);
		}
		jb_putc(c, b, '}');
		if (v.fl & JF_NS)
			jb_putc(c, b, '>');
		return;
	default: /* a method the sandbox refuses prints as undefined does */
		if (!(v.fl & JF_UNSAFE))
			jb_puts(c, b, "<function>");
	}
}

void jv_print(struct jctx *c, struct jbuf *b, struct jv v)
{
	print_val(c, b, v, false, 0);
}

void jv_repr(struct jctx *c, struct jbuf *b, struct jv v)
{
	print_val(c, b, v, true, 0);
}

struct jv jv_tostr(struct jctx *c, struct jv v)
{
	struct jbuf b = { 0 };

	if (v.k == JK_STR)
		return v;
	jv_print(c, &b, v);
	return jb_str(&b);
}

/* ---- json.dumps(ensure_ascii=False) ---- */

/* The code point at P as \uXXXX (two, a surrogate pair, above U+FFFF),
 * as json.dumps(ensure_ascii=True) writes it; returns the bytes read. */
static size_t json_ascii_escape(struct jctx *c, struct jbuf *b, const char *p, size_t n,
				bool content)
{
	static const uint8_t ones[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	const unsigned char *q = (const unsigned char *)p;
	size_t k = q[0] >= 0xf0 ? 4 : q[0] >= 0xe0 ? 3 : q[0] >= 0xc0 ? 2 : 1;
	uint32_t u = k == 1 ? q[0] : q[0] & (0x3f >> (k - 1));
	char esc[16];

	if (k > n)
		k = 1;
	for (size_t i = 1; i < k; i++) {
		if ((q[i] & 0xc0) != 0x80) { /* malformed: the byte alone */
			k = 1;
			u = q[0];
			break;
		}
		u = u << 6 | (q[i] & 0x3f);
	}
	if (u >= 0x10000) {
		u -= 0x10000;
		snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xd800 + (u >> 10), 0xdc00 + (u & 0x3ff));
	} else {
		snprintf(esc, sizeof(esc), "\\u%04x", u);
	}
	jb_put(c, b, esc, strlen(esc), content ? ones : NULL); /* keeps the source's mark */
	return k;
}

static void json_str(struct jctx *c, struct jbuf *b, struct jv s)
{
	jb_putc(c, b, '"');
	for (size_t i = 0; i < s.u.s.n; i++) {
		unsigned char ch = (unsigned char)s.u.s.p[i];
		const char *e = ch == '"' ? "\\\"" : ch == '\\' ? "\\\\" : ch == '\n' ? "\\n" :
				ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : ch == '\b' ? "\\b" :
				ch == '\f' ? "\\f" : NULL;
		char u[8];

		if (e) {
			jb_puts(c, b, e);
		} else if (ch < 0x20) {
			snprintf(u, sizeof(u), "\\u%04x", ch);
			jb_puts(c, b, u);
		} else if (ch >= 0x80 && c->json_ascii) {
			i += json_ascii_escape(c, b, s.u.s.p + i, s.u.s.n - i,
					       (s.fl & JF_CTX) || (s.u.s.m && s.u.s.m[i])) - 1;
		} else {
			jb_put(c, b, s.u.s.p + i, 1, (s.fl & JF_CTX) ? (const uint8_t *)"\1" :
				   s.u.s.m ? s.u.s.m + i : NULL);
		}
	}
	jb_putc(c, b, '"');
}

static void json_newline(struct jctx *c, struct jbuf *b, const char *indent, int level)
{
	jb_putc(c, b, '\n');
	for (int i = 0; i < level; i++)
		jb_puts(c, b, indent);
}

static int key_order(const void *x, const void *y)
{
	const struct jpair *a = x, *b = y;
	size_t n = a->key.u.s.n < b->key.u.s.n ? a->key.u.s.n : b->key.u.s.n;
	int r = memcmp(a->key.u.s.p, b->key.u.s.p, n);

	return r ? r : (a->key.u.s.n > b->key.u.s.n) - (a->key.u.s.n < b->key.u.s.n);
}

static void json_dict(struct jctx *c, struct jbuf *b, struct jv v, const char *indent,
		      const char *isep, const char *ksep, bool sort, int level)
{
	const struct jpair *e = v.u.d->e;
	size_t n = v.u.d->n;

	if (!n) {
		jb_puts(c, b, "{}");
		return;
	}
	if (sort) {
		struct jpair *s = jx_alloc_array(c, n, sizeof(*s));

		memcpy(s, e, n * sizeof(*s));
		for (size_t i = 0; i < n; i++)
			if (s[i].key.k != JK_STR)
				jx_fail(c, "line %d: TypeError: tojson sort_keys needs string keys", c->line);
		qsort(s, n, sizeof(*s), key_order);
		e = s;
	}
	jb_putc(c, b, '{');
	for (size_t i = 0; i < n; i++) {
		struct jv k = e[i].key;

		if (i)
			jb_puts(c, b, isep);
		if (indent)
			json_newline(c, b, indent, level + 1);
		if (k.k == JK_STR)
			json_str(c, b, k);
		else if (k.k == JK_INT || k.k == JK_FLOAT || k.k == JK_BOOL || k.k == JK_NONE) {
			jb_putc(c, b, '"');
			jx_tojson(c, b, k, NULL, ", ", ": ", false, level + 1);
			jb_putc(c, b, '"');
		} else
			jx_fail(c, "line %d: TypeError: keys must be str, int, float, bool or None",
				c->line);
		jb_puts(c, b, ksep);
		jx_tojson(c, b, e[i].val, indent, isep, ksep, sort, level + 1);
	}
	if (indent)
		json_newline(c, b, indent, level);
	jb_putc(c, b, '}');
}

void jx_tojson(struct jctx *c, struct jbuf *b, struct jv v, const char *indent, const char *isep,
	       const char *ksep, bool sort, int level)
{
	char num[40];

	print_depth(c, level);
	jx_step(c, 1);
	switch (v.k) {
	case JK_NONE:
		jb_puts(c, b, "null");
		return;
	case JK_BOOL:
		jb_puts(c, b, v.u.b ? "true" : "false");
		return;
	case JK_INT:
		snprintf(num, sizeof(num), "%lld", (long long)v.u.i);
		jb_puts(c, b, num);
		return;
	case JK_FLOAT:
		if (isnan(v.u.f) || isinf(v.u.f))
			jb_puts(c, b, isnan(v.u.f) ? "NaN" : v.u.f < 0 ? "-Infinity" : "Infinity");
		else {
			fmt_float(v.u.f, num, sizeof(num));
			jb_puts(c, b, num);
		}
		return;
	case JK_STR:
		json_str(c, b, v);
		return;
	case JK_LIST:
		if (v.fl & JF_GEN)
			break;
		if (!v.u.l->n) {
			jb_puts(c, b, "[]");
			return;
		}
		jb_putc(c, b, '[');
		for (size_t i = 0; i < v.u.l->n; i++) {
			if (i)
				jb_puts(c, b, isep);
			if (indent)
				json_newline(c, b, indent, level + 1);
			jx_tojson(c, b, v.u.l->v[i], indent, isep, ksep, sort, level + 1);
		}
		if (indent)
			json_newline(c, b, indent, level);
		jb_putc(c, b, ']');
		return;
	case JK_DICT:
		if (v.fl & JF_NS)
			break;
		json_dict(c, b, v, indent, isep, ksep, sort, level);
		return;
	default:
		break;
	}
	jx_fail(c, "line %d: TypeError: Object of type %s is not JSON serializable", c->line,
		jv_type(v));
}

/* ---- entry ---- */

void jinja_default_opts(struct jinja_opts *o)
{
	*o = (struct jinja_opts){
		.max_output = 16u << 20,
		.max_memory = 256u << 20,
		.max_steps = 20000000,
		.max_depth = 200,
	};
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);

	return n >= k && !strcmp(s + n - k, suffix);
}

/* The variables, as the globals scope. Strings are marked as coming from
 * the caller's data, except top-level ones named *_token (bos_token...),
 * which are the template's own markup. */
static struct jscope *load_vars(struct jctx *c, const json_t *vars)
{
	struct jscope *g = jx_alloc(c, sizeof(*g));
	const char *k;
	json_t *x;

	if (!vars)
		return g;
	if (!json_is_object(vars))
		jx_fail(c, "the variables must be a JSON object");
	json_object_foreach((json_t *)vars, k, x) {
		struct jv v = jv_from_json(c, x, 1);

		if (v.k == JK_STR && ends_with(k, "_token"))
			v.fl &= (uint8_t)~JF_CTX;
		jd_set(c, &g->vars, jv_cstr(jx_strdup(c, k, strlen(k))), v);
	}
	return g;
}

/* Parses and runs the template into OUT; -1 with c->err set on failure.
 * Everything it allocates is in c's arena. */
static int run(struct jctx *c, const char *tmpl, size_t tlen, const json_t *vars,
	       struct jbuf *out)
{
	struct jnode *body;

	if (setjmp(c->jb))
		return -1;
	body = jx_parse(c, tmpl, tlen);
	c->globals = load_vars(c, vars);
	c->out = out;
	jx_run(c, body, c->globals);
	return 0;
}

static int parse_only(struct jctx *c, const char *tmpl, size_t tlen)
{
	if (setjmp(c->jb))
		return -1;
	jx_parse(c, tmpl, tlen);
	return 0;
}

int jinja_check(const char *tmpl, size_t tlen, char *err, size_t errlen)
{
	struct jinja_opts o;
	struct jarena arena = { 0 };
	struct jctx c = { .err = err, .errlen = errlen, .arena = &arena, .o = &o };
	int rc;

	jinja_default_opts(&o);
	arena.max = o.max_memory;
	rc = parse_only(&c, tmpl, tlen);
	arena_free(&arena);
	return rc;
}

char *jinja_render(const char *tmpl, size_t tlen, const json_t *vars,
		   const struct jinja_opts *opts, size_t *len, char *err, size_t errlen)
{
	struct jinja_opts def;
	struct jarena arena = { 0 };
	struct jctx c = { .err = err, .errlen = errlen, .arena = &arena };
	struct jbuf out = { 0 };
	char *res = NULL;

	if (!opts) {
		jinja_default_opts(&def);
		opts = &def;
	}
	c.o = opts;
	arena.max = opts->max_memory;
	if (opts->content_mask)
		*opts->content_mask = NULL;
	if (run(&c, tmpl, tlen, vars, &out))
		goto out_free;
	res = malloc(out.n + 1);
	if (!res) {
		snprintf(err, errlen, "out of memory");
		goto out_free;
	}
	memcpy(res, out.p ? out.p : "", out.n);
	res[out.n] = 0;
	*len = out.n;
	if (opts->content_mask) {
		*opts->content_mask = malloc(out.n ? out.n : 1);
		if (!*opts->content_mask) {
			free(res);
			res = NULL;
			snprintf(err, errlen, "out of memory");
			goto out_free;
		}
		if (out.n)
			memcpy(*opts->content_mask, out.m, out.n);
	}
out_free:
	arena_free(&arena);
	return res;
}

char *loom_template_render(const char *tmpl, size_t tlen, const char *vars_json, size_t vlen,
			   int64_t now, size_t *len, char *err, size_t errlen)
{
	struct jinja_opts o;
	json_error_t je;
	json_t *vars = NULL;
	char *text;

	while (vars_json && vlen && strchr(" \t\r\n", *vars_json)) { /* empty: no variables */
		vars_json++;
		vlen--;
	}
	if (vars_json && vlen) {
		vars = json_loadb(vars_json, vlen, JSON_ALLOW_NUL, &je);
		if (!vars) {
			snprintf(err, errlen, "variables: line %d: %s", je.line, je.text);
			return NULL;
		}
	}
	jinja_default_opts(&o);
	o.now = now;
	text = jinja_render(tmpl, tlen, vars, &o, len, err, errlen);
	json_decref(vars);
	return text;
}
