/* Jinja's library: attribute and item access, operators, the methods of
 * str, dict and list that templates call, the global functions, filters
 * and tests. Names and behaviour follow jinja2 3.1 and Python; the
 * sandbox refuses the methods that would change a list or a dict. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_impl.h"

#define MAX_RANGE 1000000

/* ---- UTF-8 ---- */

static bool utf8_cont(unsigned char ch)
{
	return (ch & 0xc0) == 0x80;
}

/* Byte offsets of the code points of S, plus its length at [count]. */
static size_t *cp_offsets(struct jctx *c, struct jv s, size_t *count)
{
	size_t *off = jx_alloc_array(c, s.u.s.n + 1, sizeof(*off)), k = 0;

	for (size_t i = 0; i < s.u.s.n; i++)
		if (!utf8_cont((unsigned char)s.u.s.p[i]))
			off[k++] = i;
	off[k] = s.u.s.n;
	*count = k;
	return off;
}

/* The byte offset of code point IDX of S (its length past the end),
 * found by walking: no table for one index. */
static size_t cp_byte_offset(struct jv s, size_t idx)
{
	size_t k = 0;

	for (size_t i = 0; i < s.u.s.n; i++)
		if (!utf8_cont((unsigned char)s.u.s.p[i]) && k++ == idx)
			return i;
	return s.u.s.n;
}

static size_t cp_len(struct jv s)
{
	size_t k = 0;

	for (size_t i = 0; i < s.u.s.n; i++)
		k += !utf8_cont((unsigned char)s.u.s.p[i]);
	return k;
}

/* ---- helpers ---- */

static struct jv need_str(struct jctx *c, struct jv v, const char *what)
{
	if (v.k == JK_UNDEF)
		jx_fail_undef(c, v);
	if (v.k != JK_STR)
		jx_fail(c, "line %d: TypeError: %s needs a string, not %s", c->line, what, jv_type(v));
	return v;
}

static int64_t need_int(struct jctx *c, struct jv v, const char *what)
{
	if (v.k == JK_INT)
		return v.u.i;
	if (v.k == JK_BOOL)
		return v.u.b;
	if (v.k == JK_UNDEF)
		jx_fail_undef(c, v);
	jx_fail(c, "line %d: TypeError: %s needs an integer, not %s", c->line, what, jv_type(v));
}

static struct jv arg(const struct jv *args, size_t nargs, size_t i, const char *const *kwn,
		     const struct jv *kwv, size_t nkw, const char *name, struct jv def)
{
	for (size_t k = 0; k < nkw; k++)
		if (!strcmp(kwn[k], name))
			return kwv[k];
	return i < nargs ? args[i] : def;
}

#define ARG(i, name, def) arg(args, nargs, i, kwn, kwv, nkw, name, def)

static struct jv str_copy(struct jctx *c, struct jv s)
{
	char *p = jx_strdup(c, s.u.s.p, s.u.s.n);
	struct jv r = jv_str(p, s.u.s.n);

	r.fl = s.fl & JF_CTX;
	if (s.u.s.m) {
		uint8_t *m = jx_alloc(c, s.u.s.n + 1);

		memcpy(m, s.u.s.m, s.u.s.n);
		r.u.s.m = m;
	}
	return r;
}

static struct jv make_tuple(struct jctx *c, struct jv a, struct jv b)
{
	struct jv t = jv_list(c, 2);

	jl_push(c, t.u.l, a);
	jl_push(c, t.u.l, b);
	t.fl |= JF_TUPLE;
	return t;
}

static struct jv method(struct jctx *c, struct jv self, const char *name, bool unsafe)
{
	struct jv m = { .k = JK_METHOD };

	m.u.mt = jx_alloc(c, sizeof(*m.u.mt));
	m.u.mt->self = self;
	m.u.mt->name = name;
	if (unsafe)
		m.fl = JF_UNSAFE;
	return m;
}

struct jv jx_loop_cycle(struct jctx *c, int64_t index0)
{
	return method(c, jv_int(index0), "cycle", false);
}

static bool in_names(const char *name, const char *const *names)
{
	for (int i = 0; names[i]; i++)
		if (!strcmp(names[i], name))
			return true;
	return false;
}

static const char *const str_methods[] = { "strip", "lstrip", "rstrip", "split", "rsplit",
	"startswith", "endswith", "upper", "lower", "title", "capitalize", "replace", "find",
	"rfind", "index", "count", "splitlines", "join", "isdigit", "isalpha", "isalnum",
	"isspace", "isupper", "islower", "isnumeric", "isdecimal", "format", "swapcase",
	"removeprefix", "removesuffix", NULL };
static const char *const dict_methods[] = { "items", "keys", "values", "get", "copy", NULL };
static const char *const dict_unsafe[] = { "pop", "popitem", "setdefault", "update", "clear",
					   NULL };
static const char *const list_methods[] = { "index", "count", "copy", NULL };
static const char *const list_unsafe[] = { "append", "extend", "insert", "pop", "remove",
					   "reverse", "sort", "clear", NULL };

/* ---- access ---- */

/* A generator (map, select...) has no items or methods a template can
 * reach: jinja2 gives undefined for them. */
static bool is_gen(struct jv v)
{
	return v.k == JK_LIST && (v.fl & JF_GEN);
}

struct jv jx_getattr(struct jctx *c, struct jv obj, const char *name)
{
	if (obj.k == JK_UNDEF)
		jx_fail_undef(c, obj);
	if (obj.k == JK_DICT)
		jx_step(c, obj.u.d->n / 16); /* the lookup is linear */
	if (is_gen(obj))
		return jv_undef_attr(c, obj, name);
	if (obj.k == JK_DICT) {
		struct jv *v;

		if (!(obj.fl & JF_NS) && in_names(name, dict_methods))
			return method(c, obj, name, false);
		if (!(obj.fl & JF_NS) && in_names(name, dict_unsafe))
			return method(c, obj, name, true);
		v = jd_gets(obj.u.d, name);
		return v ? *v : jv_undef_attr(c, obj, name);
	}
	if (obj.k == JK_STR && in_names(name, str_methods))
		return method(c, obj, name, false);
	if (obj.k == JK_LIST && in_names(name, list_methods))
		return method(c, obj, name, false);
	if (obj.k == JK_LIST && in_names(name, list_unsafe))
		return method(c, obj, name, true);
	return jv_undef_attr(c, obj, name);
}

static int64_t norm_index(int64_t i, size_t n)
{
	return i < 0 ? i + (int64_t)n : i;
}

struct jv jx_getitem(struct jctx *c, struct jv obj, struct jv key)
{
	if (obj.k == JK_UNDEF)
		jx_fail_undef(c, obj);
	if (is_gen(obj))
		return jv_undef_attr(c, obj, "[key]");
	if (obj.k == JK_DICT)
		jx_step(c, jv_cost(obj) / 16); /* the lookup is linear */
	if (obj.k == JK_STR)
		jx_step(c, 3 * jv_cost(obj)); /* a code point index walks the text */
	if (obj.k == JK_DICT) {
		struct jv *v = jd_get(obj.u.d, key);

		if (v)
			return *v;
		return key.k == JK_STR ? jx_getattr(c, obj, jx_strdup(c, key.u.s.p, key.u.s.n))
				       : jv_undef_attr(c, obj, "[key]");
	}
	if ((obj.k == JK_LIST || obj.k == JK_STR) && (key.k == JK_INT || key.k == JK_BOOL)) {
		size_t n = obj.k == JK_LIST ? obj.u.l->n : cp_len(obj);
		int64_t i = norm_index(need_int(c, key, "an index"), n);

		if (i < 0 || (uint64_t)i >= n)
			return jv_undef_attr(c, obj, "[index]");
		if (obj.k == JK_LIST)
			return obj.u.l->v[i];
		size_t at = cp_byte_offset(obj, (size_t)i);

		return jv_sub(obj, at, cp_byte_offset(obj, (size_t)i + 1) - at);
	}
	if (key.k == JK_STR)
		return jx_getattr(c, obj, jx_strdup(c, key.u.s.p, key.u.s.n));
	return jv_undef_attr(c, obj, "[key]");
}

static int64_t slice_bound(struct jctx *c, struct jv v, int64_t n, int64_t step, bool lo)
{
	int64_t i;

	if (v.k == JK_NONE || v.k == JK_UNDEF)
		return step > 0 ? (lo ? 0 : n) : (lo ? n - 1 : -1);
	i = need_int(c, v, "a slice");
	if (i < 0) {
		i += n;
		if (i < 0)
			i = step > 0 ? 0 : -1;
	} else if (i >= n) {
		i = step > 0 ? n : n - 1;
	}
	return i;
}

struct jv jx_slice(struct jctx *c, struct jv v, struct jv lo, struct jv hi, struct jv st)
{
	int64_t step = st.k == JK_NONE || st.k == JK_UNDEF ? 1 : need_int(c, st, "a slice step");
	size_t n, *off = NULL;
	int64_t a, b;
	struct jv out;
	struct jbuf buf = { 0 };

	if (v.k == JK_UNDEF)
		jx_fail_undef(c, v);
	if (step == 0)
		jx_fail(c, "line %d: ValueError: slice step cannot be zero", c->line);
	jx_step(c, jv_cost(v)); /* a string's code points are found by a walk */
	if (v.k == JK_LIST && !is_gen(v))
		n = v.u.l->n;
	else if (v.k == JK_STR)
		off = cp_offsets(c, v, &n);
	else /* jinja2 slices with Python's own subscript, which raises */
		jx_fail(c, "line %d: TypeError: '%s' object is not subscriptable", c->line,
			jv_type(v));
	a = slice_bound(c, lo, (int64_t)n, step, true);
	b = slice_bound(c, hi, (int64_t)n, step, false);
	if (v.k == JK_STR && step == 1)
		return a < b ? jv_sub(v, off[a], off[b] - off[a]) : jv_str("", 0);
	out = jv_list(c, 0);
	for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
		jx_step(c, 1);
		if (v.k == JK_LIST)
			jl_push(c, out.u.l, v.u.l->v[i]);
		else
			jb_putv(c, &buf, jv_sub(v, off[i], off[i + 1] - off[i]));
	}
	if (v.k == JK_STR)
		return jb_str(&buf);
	return out;
}

struct jv jv_iter(struct jctx *c, struct jv v)
{
	struct jv l;

	switch (v.k) {
	case JK_LIST:
		l = v;
		l.fl &= (uint8_t)~(JF_GEN | JF_TUPLE);
		return l;
	case JK_UNDEF:
		return jv_list(c, 0);
	case JK_DICT:
		l = jv_list(c, v.u.d->n);
		for (size_t i = 0; i < v.u.d->n; i++)
			jl_push(c, l.u.l, v.u.d->e[i].key);
		return l;
	case JK_STR: {
		size_t n, *off = cp_offsets(c, v, &n);

		l = jv_list(c, n);
		for (size_t i = 0; i < n; i++)
			jl_push(c, l.u.l, jv_sub(v, off[i], off[i + 1] - off[i]));
		return l;
	}
	default:
		jx_fail(c, "line %d: TypeError: '%s' object is not iterable", c->line, jv_type(v));
	}
}

bool jx_contains(struct jctx *c, struct jv hay, struct jv needle)
{
	switch (hay.k) {
	case JK_STR:
		if (needle.k != JK_STR)
			jx_fail(c, "line %d: TypeError: 'in <string>' requires string as left operand, not %s",
				c->line, jv_type(needle));
		return needle.u.s.n == 0 ||
		       memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
	case JK_LIST:
		for (size_t i = 0; i < hay.u.l->n; i++)
			if (jv_eq(hay.u.l->v[i], needle))
				return true;
		return false;
	case JK_DICT:
		return jd_get(hay.u.d, needle) != NULL;
	case JK_UNDEF:
		return false;
	default:
		jx_fail(c, "line %d: TypeError: argument of type '%s' is not iterable", c->line,
			jv_type(hay));
	}
}

/* ---- operators ---- */

static bool is_num(struct jv v)
{
	return v.k == JK_INT || v.k == JK_FLOAT || v.k == JK_BOOL;
}

static double num(struct jv v)
{
	return v.k == JK_FLOAT ? v.u.f : v.k == JK_INT ? (double)v.u.i : v.u.b;
}

static int64_t ival(struct jv v)
{
	return v.k == JK_INT ? v.u.i : v.u.b;
}

static const char *op_name(int op)
{
	static const char *const names[] = { "?", "+", "-", "*", "/", "//", "%", "**" };

	return op >= 1 && op <= JT_POW ? names[op] : "?";
}

/* s * times for a string or list; an empty one is empty at once, so a
 * huge count cannot spin */
static struct jv repeat(struct jctx *c, struct jv s, int64_t times)
{
	struct jbuf b = { 0 };
	struct jv l;

	if (s.k == JK_LIST && (s.fl & JF_GEN))
		jx_fail(c, "line %d: TypeError: unsupported operand type(s) for *: 'generator' and 'int'",
			c->line);
	if ((s.k == JK_STR && !s.u.s.n) || (s.k == JK_LIST && !s.u.l->n))
		times = 0;
	if (s.k == JK_STR) {
		for (int64_t i = 0; i < times; i++) /* bounded by the output limit */
			jb_putv(c, &b, s);
		return jb_str(&b);
	}
	l = jv_list(c, 0);
	for (int64_t i = 0; i < times; i++)
		for (size_t k = 0; k < s.u.l->n; k++) {
			jx_step(c, 1);
			jl_push(c, l.u.l, s.u.l->v[k]);
		}
	return l;
}

static struct jv int_op(struct jctx *c, int op, int64_t a, int64_t b)
{
	int64_t r;

	switch (op) {
	case JT_ADD:
		if (!__builtin_add_overflow(a, b, &r))
			return jv_int(r);
		break;
	case JT_SUB:
		if (!__builtin_sub_overflow(a, b, &r))
			return jv_int(r);
		break;
	case JT_MUL:
		if (!__builtin_mul_overflow(a, b, &r))
			return jv_int(r);
		break;
	case JT_FLOORDIV:
	case JT_MOD:
		if (b == 0)
			jx_fail(c, "line %d: ZeroDivisionError: integer division or modulo by zero", c->line);
		if (a == INT64_MIN && b == -1)
			break;
		r = a / b;
		if ((a % b != 0) && ((a < 0) != (b < 0)))
			r--;
		return jv_int(op == JT_FLOORDIV ? r : a - r * b);
	case JT_POW:
		if (b < 0)
			return jv_float(pow((double)a, (double)b));
		r = 1;
		for (int64_t i = 0; i < b; i++) {
			if (__builtin_mul_overflow(r, a, &r))
				goto overflow;
			if (r == 0 || r == 1)
				break;
		}
		if (r == 1 && a == -1 && (b & 1))
			r = -1;
		return jv_int(r);
	}
overflow:
	jx_fail(c, "line %d: integer overflow in %s", c->line, op_name(op));
}

static struct jv float_op(struct jctx *c, int op, double a, double b)
{
	switch (op) {
	case JT_ADD:
		return jv_float(a + b);
	case JT_SUB:
		return jv_float(a - b);
	case JT_MUL:
		return jv_float(a * b);
	case JT_POW:
		return jv_float(pow(a, b));
	}
	if (b == 0)
		jx_fail(c, "line %d: ZeroDivisionError: division by zero", c->line);
	if (op == JT_DIV)
		return jv_float(a / b);
	if (op == JT_FLOORDIV)
		return jv_float(floor(a / b));
	double m = fmod(a, b);

	if (m != 0 && ((m < 0) != (b < 0)))
		m += b;
	return jv_float(m);
}

/* "text %s and %d" % args: %s, %d, %i, %r and %% (no widths or flags) */
struct jv jx_percent_format(struct jctx *c, struct jv fmt, struct jv args)
{
	struct jbuf b = { 0 };
	size_t k = 0, n = args.k == JK_LIST && (args.fl & JF_TUPLE) ? args.u.l->n : 1;

	for (size_t i = 0; i < fmt.u.s.n; i++) {
		char ch = fmt.u.s.p[i], conv = i + 1 < fmt.u.s.n ? fmt.u.s.p[i + 1] : 0;
		struct jv v;

		if (ch != '%') {
			jb_putv(c, &b, jv_sub(fmt, i, 1));
			continue;
		}
		i++;
		if (conv == '%') {
			jb_putc(c, &b, '%');
			continue;
		}
		if (!strchr("sdir", conv) || !conv)
			jx_fail(c, "line %d: ValueError: unsupported format character in '%%' formatting",
				c->line);
		if (k >= n)
			jx_fail(c, "line %d: TypeError: not enough arguments for format string", c->line);
		v = n == 1 && !(args.k == JK_LIST && (args.fl & JF_TUPLE)) ? args : args.u.l->v[k];
		k++;
		if (conv == 'r')
			jv_repr(c, &b, v);
		else if (conv == 's')
			jv_print(c, &b, v);
		else if (v.k == JK_INT || v.k == JK_BOOL || v.k == JK_FLOAT)
			jv_print(c, &b, jv_int(v.k == JK_FLOAT ? (int64_t)v.u.f : ival(v)));
		else
			jx_fail(c, "line %d: TypeError: %%d format: a number is required, not %s", c->line,
				jv_type(v));
	}
	if (k < n)
		jx_fail(c, "line %d: TypeError: not all arguments converted during string formatting",
			c->line);
	return jb_str(&b);
}

struct jv jx_binop(struct jctx *c, int op, struct jv a, struct jv b)
{
	if (a.k == JK_UNDEF)
		jx_fail_undef(c, a);
	if (b.k == JK_UNDEF)
		jx_fail_undef(c, b);
	if (is_num(a) && is_num(b)) {
		if (op == JT_DIV)
			return float_op(c, op, num(a), num(b));
		if (a.k != JK_FLOAT && b.k != JK_FLOAT)
			return int_op(c, op, ival(a), ival(b));
		return float_op(c, op, num(a), num(b));
	}
	if (op == JT_ADD && a.k == JK_STR && b.k == JK_STR) {
		struct jbuf buf = { 0 };

		jb_putv(c, &buf, a);
		jb_putv(c, &buf, b);
		return jb_str(&buf);
	}
	if (op == JT_ADD && a.k == JK_LIST && b.k == JK_LIST) {
		struct jv l = jv_list(c, a.u.l->n + b.u.l->n);

		for (size_t i = 0; i < a.u.l->n; i++)
			jl_push(c, l.u.l, a.u.l->v[i]);
		for (size_t i = 0; i < b.u.l->n; i++)
			jl_push(c, l.u.l, b.u.l->v[i]);
		return l;
	}
	if (op == JT_MUL && (a.k == JK_STR || a.k == JK_LIST) && (b.k == JK_INT || b.k == JK_BOOL))
		return repeat(c, a, ival(b));
	if (op == JT_MUL && (b.k == JK_STR || b.k == JK_LIST) && (a.k == JK_INT || a.k == JK_BOOL))
		return repeat(c, b, ival(a));
	if (op == JT_MOD && a.k == JK_STR)
		return jx_percent_format(c, a, b);
	if (op == JT_ADD && a.k == JK_STR)
		jx_fail(c, "line %d: TypeError: can only concatenate str (not \"%s\") to str", c->line,
			jv_type(b));
	if (op == JT_ADD && a.k == JK_LIST)
		jx_fail(c, "line %d: TypeError: can only concatenate list (not \"%s\") to list",
			c->line, jv_type(b));
	jx_fail(c, "line %d: TypeError: unsupported operand type(s) for %s: '%s' and '%s'", c->line,
		op_name(op), jv_type(a), jv_type(b));
}

/* ---- str methods ---- */

/* The bytes of the whitespace character at P (N bytes left), 0 if it is
 * none: Python's str.isspace, so U+00A0, U+3000 and the like count. */
static size_t space_len(const char *p, size_t n)
{
	const unsigned char *q = (const unsigned char *)p;

	if (!n)
		return 0;
	if (q[0] < 0x80)
		return isspace(q[0]) || (q[0] >= 0x1c && q[0] <= 0x1f);
	if (n >= 2 && q[0] == 0xc2 && (q[1] == 0x85 || q[1] == 0xa0))
		return 2;
	if (n < 3)
		return 0;
	if ((q[0] == 0xe1 && q[1] == 0x9a && q[2] == 0x80) ||		/* U+1680 */
	    (q[0] == 0xe2 && q[1] == 0x80 && (q[2] <= 0x8a || q[2] == 0xa8 || q[2] == 0xa9 ||
					      q[2] == 0xaf)) ||		/* U+2000.., U+2028.. */
	    (q[0] == 0xe2 && q[1] == 0x81 && q[2] == 0x9f) ||		/* U+205F */
	    (q[0] == 0xe3 && q[1] == 0x80 && q[2] == 0x80))		/* U+3000 */
		return 3;
	return 0;
}

/* The length of the character at P (N bytes left); a stray byte is 1. */
static size_t char_len(const char *p, size_t n)
{
	size_t k = 1;

	while (k < n && k < 4 && utf8_cont((unsigned char)p[k]))
		k++;
	return k;
}

/* The length of the character that ends at P + N (N bytes before it). */
static size_t char_len_before(const char *p, size_t n)
{
	size_t k = 1;

	while (k < n && k < 4 && utf8_cont((unsigned char)p[n - k]))
		k++;
	return k;
}

/* Whether the K-byte character at P is one strip removes: whitespace, or
 * one of CHARS when given. */
static bool strippable(const char *p, size_t k, struct jv chars)
{
	if (chars.k != JK_STR)
		return space_len(p, k) == k;
	return memmem(chars.u.s.p, chars.u.s.n, p, k) != NULL;
}

static struct jv do_strip(struct jctx *c, struct jv s, struct jv chars, bool left, bool right)
{
	const char *p = s.u.s.p;
	size_t a = 0, b = s.u.s.n, k;

	if (chars.k != JK_STR && chars.k != JK_NONE && chars.k != JK_UNDEF)
		need_str(c, chars, "strip");
	while (left && a < b) {
		k = char_len(p + a, b - a);
		if (!strippable(p + a, k, chars))
			break;
		a += k;
	}
	while (right && b > a) {
		k = char_len_before(p + a, b - a);
		if (!strippable(p + b - k, k, chars))
			break;
		b -= k;
	}
	return jv_sub(s, a, b - a);
}

static void reverse_items(struct jlist *l)
{
	for (size_t i = 0, j = l->n; i + 1 < j; i++, j--) {
		struct jv t = l->v[i];

		l->v[i] = l->v[j - 1];
		l->v[j - 1] = t;
	}
}

/* The bytes of S reversed (marks dropped: only for searching). */
static struct jv reversed_bytes(struct jctx *c, struct jv s)
{
	char *r = jx_alloc(c, s.u.s.n + 1);

	for (size_t i = 0; i < s.u.s.n; i++)
		r[i] = s.u.s.p[s.u.s.n - 1 - i];
	return jv_str(r, s.u.s.n);
}

/* The start of the first SEP in S at or after FROM, or S's length: memmem
 * keeps every search linear. */
static size_t find_from(struct jv s, struct jv sep, size_t from)
{
	const char *p = memmem(s.u.s.p + from, s.u.s.n - from, sep.u.s.p, sep.u.s.n);

	return p ? (size_t)(p - s.u.s.p) : s.u.s.n;
}

/* str.split(SEP, MAX): MAX < 0 for no limit */
static void split_sep(struct jctx *c, struct jlist *l, struct jv s, struct jv sep, int64_t max)
{
	size_t start = 0, at;

	while (max != 0 && (at = find_from(s, sep, start)) < s.u.s.n) {
		jl_push(c, l, jv_sub(s, start, at - start));
		start = at + sep.u.s.n;
		max--;
	}
	jl_push(c, l, jv_sub(s, start, s.u.s.n - start));
}

/* str.rsplit(SEP, MAX), the pieces from the right: a left-to-right
 * search of the reversed text for the reversed separator */
static void rsplit_sep(struct jctx *c, struct jlist *l, struct jv s, struct jv sep, int64_t max)
{
	struct jv rs = reversed_bytes(c, s), rsep = reversed_bytes(c, sep);
	size_t n = s.u.s.n, k = sep.u.s.n, start = 0, at;

	while (max != 0 && (at = find_from(rs, rsep, start)) < n) {
		jl_push(c, l, jv_sub(s, n - at, at - start));
		start = at + k;
		max--;
	}
	jl_push(c, l, jv_sub(s, 0, n - start));
}

/* str.split(None, MAX): runs of whitespace; the last piece keeps its
 * trailing blanks */
static void split_ws(struct jctx *c, struct jlist *l, struct jv s, int64_t max)
{
	const char *p = s.u.s.p;
	size_t i = 0, n = s.u.s.n, k;

	for (;;) {
		size_t st;

		while (i < n && (k = space_len(p + i, n - i)))
			i += k;
		if (i == n)
			return;
		st = i;
		if (max-- == 0) {
			jl_push(c, l, jv_sub(s, st, n - st));
			return;
		}
		while (i < n && !space_len(p + i, n - i))
			i += char_len(p + i, n - i);
		jl_push(c, l, jv_sub(s, st, i - st));
	}
}

/* Whether the character ending at byte I of S is whitespace; its length
 * in *K. */
static bool space_before(struct jv s, size_t i, size_t *k)
{
	*k = char_len_before(s.u.s.p, i);
	return space_len(s.u.s.p + i - *k, *k) == *k;
}

/* str.rsplit(None, MAX), the pieces from the right; the last keeps its
 * leading blanks */
static void rsplit_ws(struct jctx *c, struct jlist *l, struct jv s, int64_t max)
{
	size_t i = s.u.s.n, k;

	for (;;) {
		size_t e;

		while (i > 0 && space_before(s, i, &k))
			i -= k;
		if (i == 0)
			return;
		e = i;
		if (max-- == 0) {
			jl_push(c, l, jv_sub(s, 0, e));
			return;
		}
		while (i > 0 && !space_before(s, i, &k))
			i -= k;
		jl_push(c, l, jv_sub(s, i, e - i));
	}
}

/* split on whitespace runs (SEP none) or on SEP, at most MAX times
 * (negative: no limit), from the right when REV. */
static struct jv do_split(struct jctx *c, struct jv s, struct jv sep, int64_t max, bool rev)
{
	struct jv l = jv_list(c, 0);

	if (sep.k == JK_STR && sep.u.s.n == 0)
		jx_fail(c, "line %d: ValueError: empty separator", c->line);
	if (sep.k == JK_STR)
		rev ? rsplit_sep(c, l.u.l, s, sep, max) : split_sep(c, l.u.l, s, sep, max);
	else
		rev ? rsplit_ws(c, l.u.l, s, max) : split_ws(c, l.u.l, s, max);
	if (rev)
		reverse_items(l.u.l);
	return l;
}

static bool has_affix(struct jctx *c, struct jv s, struct jv x, bool end)
{
	if (x.k == JK_LIST) {
		for (size_t i = 0; i < x.u.l->n; i++)
			if (has_affix(c, s, x.u.l->v[i], end))
				return true;
		return false;
	}
	need_str(c, x, end ? "endswith" : "startswith");
	if (x.u.s.n > s.u.s.n)
		return false;
	return !memcmp(s.u.s.p + (end ? s.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n);
}

/* Case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
 * letters, the pairs whose UTF-8 forms have the same length (so a
 * string's marks stay aligned); other characters are kept. */
static uint32_t cp_upper(uint32_t u)
{
	if ((u >= 'a' && u <= 'z') || (u >= 0xe0 && u <= 0xfe && u != 0xf7) ||
	    (u >= 0x3b1 && u <= 0x3c9 && u != 0x3c2) || (u >= 0x430 && u <= 0x44f))
		return u - 32;
	if (u >= 0x450 && u <= 0x45f)
		return u - 80;
	if (u >= 0x100 && u <= 0x17f && u != 0x130 && u != 0x131 && u != 0x138 && u != 0x149 &&
	    u != 0x17f && ((u < 0x139 || u > 0x148) && (u < 0x179) ? (u & 1) : !(u & 1)))
		return u - 1;
	return u;
}

static uint32_t cp_lower(uint32_t u)
{
	if ((u >= 'A' && u <= 'Z') || (u >= 0xc0 && u <= 0xde && u != 0xd7) ||
	    (u >= 0x391 && u <= 0x3a9 && u != 0x3a2) || (u >= 0x410 && u <= 0x42f))
		return u + 32;
	if (u >= 0x400 && u <= 0x40f)
		return u + 80;
	if (u >= 0x100 && u <= 0x17f && u != 0x130 && u != 0x131 && u != 0x138 && u != 0x149 &&
	    u != 0x17f && ((u < 0x139 || u > 0x148) && (u < 0x179) ? !(u & 1) : (u & 1)))
		return u + 1;
	return u;
}

/* The code point at P (N bytes left) and its length; a malformed byte is
 * itself. */
uint32_t jx_utf8_decode(const unsigned char *p, size_t n, size_t *len)
{
	int k = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc0 ? 2 : 1;
	uint32_t u = k == 1 ? p[0] : p[0] & (0x3f >> (k - 1));

	if ((size_t)k > n) {
		*len = 1;
		return p[0];
	}
	for (int i = 1; i < k; i++) {
		if (!utf8_cont(p[i])) {
			*len = 1;
			return p[0];
		}
		u = u << 6 | (p[i] & 0x3f);
	}
	*len = (size_t)k;
	return u;
}

/* Writes U over the K bytes at P when its encoding has that length. */
static void utf8_put_same(unsigned char *p, size_t k, uint32_t u)
{
	if (k == 1 && u < 0x80)
		p[0] = (unsigned char)u;
	else if (k == 2 && u >= 0x80 && u < 0x800) {
		p[0] = (unsigned char)(0xc0 | u >> 6);
		p[1] = (unsigned char)(0x80 | (u & 0x3f));
	}
}

bool jx_is_space(uint32_t u)
{
	return (u >= 9 && u <= 13) || (u >= 0x1c && u <= 0x20) || u == 0x85 || u == 0xa0 ||
	       u == 0x1680 || (u >= 0x2000 && u <= 0x200a) || u == 0x2028 || u == 0x2029 ||
	       u == 0x202f || u == 0x205f || u == 0x3000;
}

static bool cp_cased(uint32_t u)
{
	return cp_upper(u) != u || cp_lower(u) != u;
}

static struct jv do_case(struct jctx *c, struct jv s, const char *how);

struct jv jx_lower(struct jctx *c, struct jv s)
{
	return do_case(c, s, "lower");
}

/* upper, lower, title (str.title), title_filter (jinja2's), capitalize,
 * swapcase */
static struct jv do_case(struct jctx *c, struct jv s, const char *how)
{
	struct jv r = str_copy(c, s);
	unsigned char *p = (unsigned char *)r.u.s.p;
	bool word = false, first = true;

	for (size_t i = 0, k; i < r.u.s.n; i += k) {
		uint32_t u = jx_utf8_decode(p + i, r.u.s.n - i, &k), m;

		if (!strcmp(how, "upper"))
			m = cp_upper(u);
		else if (!strcmp(how, "lower"))
			m = cp_lower(u);
		else if (!strcmp(how, "swapcase"))
			m = cp_upper(u) != u ? cp_upper(u) : cp_lower(u);
		else if (!strcmp(how, "capitalize"))
			m = first ? cp_upper(u) : cp_lower(u);
		else /* title */
			m = word ? cp_lower(u) : cp_upper(u);
		/* str.title starts a word after any uncased character; the
		 * title filter after whitespace, '-' and opening brackets */
		if (!strcmp(how, "title"))
			word = cp_cased(u);
		else
			word = !jx_is_space(u) && !(u && u < 0x80 && strchr("-([{<", (int)u));
		first = false;
		utf8_put_same(p + i, k, m);
	}
	return r;
}

static struct jv do_replace(struct jctx *c, struct jv s, struct jv old, struct jv new,
			    int64_t count)
{
	struct jbuf b = { 0 };
	size_t i = 0, start = 0;

	need_str(c, old, "replace");
	new = jv_tostr(c, new);
	if (!old.u.s.n) { /* Python inserts NEW between characters */
		size_t n, *off = cp_offsets(c, s, &n);

		for (size_t k = 0; k <= n; k++) {
			if (count < 0 || (int64_t)k < count)
				jb_putv(c, &b, new);
			if (k < n)
				jb_putv(c, &b, jv_sub(s, off[k], off[k + 1] - off[k]));
		}
		return jb_str(&b);
	}
	while (count != 0 && (i = find_from(s, old, start)) < s.u.s.n) {
		jb_putv(c, &b, jv_sub(s, start, i - start));
		jb_putv(c, &b, new);
		start = i + old.u.s.n;
		count--;
	}
	jb_putv(c, &b, jv_sub(s, start, s.u.s.n - start));
	return jb_str(&b);
}

static int64_t do_find(struct jctx *c, struct jv s, struct jv sub, bool rev)
{
	size_t at;

	need_str(c, sub, "find");
	if (sub.u.s.n > s.u.s.n)
		return -1;
	if (!rev) {
		at = find_from(s, sub, 0);
		if (at == s.u.s.n && sub.u.s.n)
			return -1;
	} else { /* the last match: the first of the reversed in the reversed */
		at = find_from(reversed_bytes(c, s), reversed_bytes(c, sub), 0);
		if (at == s.u.s.n && sub.u.s.n)
			return -1;
		at = s.u.s.n - at - sub.u.s.n;
	}
	/* a code point index, as Python counts */
	return (int64_t)cp_len(jv_str(s.u.s.p, at));
}

static int64_t do_count(struct jctx *c, struct jv s, struct jv sub)
{
	int64_t k = 0;
	size_t at = 0;

	need_str(c, sub, "count");
	if (!sub.u.s.n)
		return (int64_t)cp_len(s) + 1;
	while ((at = find_from(s, sub, at)) < s.u.s.n) {
		k++;
		at += sub.u.s.n;
	}
	return k;
}

/* The length of the line break at P (N bytes left), 0 if none: what
 * Python's str.splitlines breaks at. */
static size_t line_break(const char *p, size_t n)
{
	const unsigned char *q = (const unsigned char *)p;

	if (q[0] == '\r')
		return n > 1 && q[1] == '\n' ? 2 : 1;
	if (strchr("\n\v\f\x1c\x1d\x1e", q[0]) && q[0])
		return 1;
	if (n > 1 && q[0] == 0xc2 && q[1] == 0x85)
		return 2; /* U+0085 */
	if (n > 2 && q[0] == 0xe2 && q[1] == 0x80 && (q[2] == 0xa8 || q[2] == 0xa9))
		return 3; /* U+2028, U+2029 */
	return 0;
}

struct jv jx_splitlines(struct jctx *c, struct jv s)
{
	struct jv l = jv_list(c, 0);
	size_t st = 0, i = 0;

	while (i < s.u.s.n) {
		size_t k = line_break(s.u.s.p + i, s.u.s.n - i);

		if (k) {
			jl_push(c, l.u.l, jv_sub(s, st, i - st));
			i += k;
			st = i;
		} else {
			i++;
		}
	}
	if (st < s.u.s.n)
		jl_push(c, l.u.l, jv_sub(s, st, s.u.s.n - st));
	return l;
}

static struct jv do_join(struct jctx *c, struct jv sep, struct jv items, const char *attr)
{
	struct jv l = jv_iter(c, items);
	struct jbuf b = { 0 };

	for (size_t i = 0; i < l.u.l->n; i++) {
		struct jv v = l.u.l->v[i];

		if (i)
			jb_putv(c, &b, sep);
		if (attr)
			v = jx_getitem(c, v, jv_cstr(attr));
		jv_print(c, &b, v);
	}
	return jb_str(&b);
}

static bool all_chars(struct jv s, int (*pred)(int))
{
	if (!s.u.s.n)
		return false;
	for (size_t i = 0; i < s.u.s.n; i++)
		if (!pred((unsigned char)s.u.s.p[i]))
			return false;
	return true;
}

static bool case_test(struct jv s, bool upper)
{
	bool cased = false;

	for (size_t i = 0; i < s.u.s.n; i++) {
		unsigned char ch = (unsigned char)s.u.s.p[i];

		if (upper ? islower(ch) : isupper(ch))
			return false;
		cased |= isalpha(ch) != 0;
	}
	return cased;
}

/* "{} {}".format(a, b) and "{0}": positional fields only */
static struct jv do_format(struct jctx *c, struct jv s, const struct jv *args, size_t nargs)
{
	struct jbuf b = { 0 };
	size_t auto_i = 0;

	for (size_t i = 0; i < s.u.s.n; i++) {
		char ch = s.u.s.p[i];

		if ((ch == '{' || ch == '}') && i + 1 < s.u.s.n && s.u.s.p[i + 1] == ch) {
			jb_putv(c, &b, jv_sub(s, i, 1));
			i++;
			continue;
		}
		if (ch != '{') { /* the format string's own bytes keep their marks */
			jb_putv(c, &b, jv_sub(s, i, 1));
			continue;
		}
		size_t j = i + 1, idx;

		while (j < s.u.s.n && s.u.s.p[j] != '}')
			j++;
		if (j == s.u.s.n)
			jx_fail(c, "line %d: ValueError: unmatched '{' in format string", c->line);
		if (j == i + 1)
			idx = auto_i++;
		else if (isdigit((unsigned char)s.u.s.p[i + 1]))
			idx = (size_t)strtoul(s.u.s.p + i + 1, NULL, 10);
		else
			jx_fail(c, "line %d: format fields other than {} and {N} are not supported",
				c->line);
		if (idx >= nargs)
			jx_fail(c, "line %d: IndexError: format index %zu out of range", c->line, idx);
		jv_print(c, &b, args[idx]);
		i = j;
	}
	return jb_str(&b);
}

static struct jv str_method(struct jctx *c, struct jv s, const char *m, const struct jv *args,
			    size_t nargs, const char *const *kwn, const struct jv *kwv, size_t nkw)
{
	struct jv a0 = ARG(0, "", jv_none()), a1 = ARG(1, "", jv_none());

	if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
		return do_strip(c, s, a0, m[0] != 'r', m[0] != 'l');
	if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
		struct jv sep = ARG(0, "sep", jv_none()), mx = ARG(1, "maxsplit", jv_int(-1));

		if (sep.k != JK_NONE)
			need_str(c, sep, m);
		return do_split(c, s, sep, need_int(c, mx, m), m[0] == 'r');
	}
	if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
		return jv_bool(has_affix(c, s, a0, m[0] == 'e'));
	if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") ||
	    !strcmp(m, "title_filter") || !strcmp(m, "capitalize") || !strcmp(m, "swapcase"))
		return do_case(c, s, m);
	if (!strcmp(m, "replace"))
		return do_replace(c, s, a0, a1, nargs > 2 ? need_int(c, args[2], m) : -1);
	if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index")) {
		int64_t r = do_find(c, s, a0, m[0] == 'r');

		if (r < 0 && m[0] == 'i')
			jx_fail(c, "line %d: ValueError: substring not found", c->line);
		return jv_int(r);
	}
	if (!strcmp(m, "count"))
		return jv_int(do_count(c, s, a0));
	if (!strcmp(m, "splitlines"))
		return jx_splitlines(c, s);
	if (!strcmp(m, "join"))
		return do_join(c, s, a0, NULL);
	if (!strcmp(m, "isdigit") || !strcmp(m, "isnumeric") || !strcmp(m, "isdecimal"))
		return jv_bool(all_chars(s, isdigit));
	if (!strcmp(m, "isalpha"))
		return jv_bool(all_chars(s, isalpha));
	if (!strcmp(m, "isalnum"))
		return jv_bool(all_chars(s, isalnum));
	if (!strcmp(m, "isspace"))
		return jv_bool(all_chars(s, isspace));
	if (!strcmp(m, "isupper") || !strcmp(m, "islower"))
		return jv_bool(case_test(s, m[2] == 'u'));
	if (!strcmp(m, "format"))
		return do_format(c, s, args, nargs);
	if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
		bool end = m[6] == 's';

		need_str(c, a0, m);
		if (!has_affix(c, s, a0, end))
			return s;
		return jv_sub(s, end ? 0 : a0.u.s.n, s.u.s.n - a0.u.s.n);
	}
	jx_fail(c, "line %d: str.%s is not supported", c->line, m);
}

/* ---- dict and list methods ---- */

static struct jv dict_items(struct jctx *c, struct jv d)
{
	struct jv l = jv_list(c, d.u.d->n);

	for (size_t i = 0; i < d.u.d->n; i++)
		jl_push(c, l.u.l, make_tuple(c, d.u.d->e[i].key, d.u.d->e[i].val));
	return l;
}

static struct jv dict_method(struct jctx *c, struct jv d, const char *m, const struct jv *args,
			     size_t nargs)
{
	struct jv l;

	if (!strcmp(m, "items"))
		return dict_items(c, d);
	if (!strcmp(m, "keys") || !strcmp(m, "values")) {
		l = jv_list(c, d.u.d->n);
		for (size_t i = 0; i < d.u.d->n; i++)
			jl_push(c, l.u.l, m[0] == 'k' ? d.u.d->e[i].key : d.u.d->e[i].val);
		return l;
	}
	if (!strcmp(m, "get")) {
		struct jv *v;

		if (nargs < 1)
			jx_fail(c, "line %d: TypeError: get expected at least 1 argument", c->line);
		v = jd_get(d.u.d, args[0]);
		return v ? *v : nargs > 1 ? args[1] : jv_none();
	}
	if (!strcmp(m, "copy")) {
		l = jv_dict(c);
		for (size_t i = 0; i < d.u.d->n; i++)
			jd_set(c, l.u.d, d.u.d->e[i].key, d.u.d->e[i].val);
		return l;
	}
	jx_fail(c, "line %d: dict.%s is not supported", c->line, m);
}

static struct jv list_method(struct jctx *c, struct jv l, const char *m, const struct jv *args,
			     size_t nargs)
{
	if (nargs < 1 && strcmp(m, "copy"))
		jx_fail(c, "line %d: TypeError: list.%s needs an argument", c->line, m);
	if (!strcmp(m, "copy"))
		return jv_iter(c, l);
	int64_t k = 0;

	for (size_t i = 0; i < l.u.l->n; i++) {
		if (!jv_eq(l.u.l->v[i], args[0]))
			continue;
		if (!strcmp(m, "index"))
			return jv_int((int64_t)i);
		k++;
	}
	if (!strcmp(m, "index"))
		jx_fail(c, "line %d: ValueError: value is not in list", c->line);
	return jv_int(k);
}

/* ---- globals ---- */

static const char *const globals[] = { "range", "namespace", "raise_exception",
				       "strftime_now", "dict", NULL };

bool jx_is_global(const char *name)
{
	return in_names(name, globals);
}

static struct jv g_range(struct jctx *c, const struct jv *args, size_t nargs)
{
	int64_t a = 0, b, st = 1;
	struct jv l;

	if (nargs < 1 || nargs > 3)
		jx_fail(c, "line %d: TypeError: range expected 1 to 3 arguments", c->line);
	b = need_int(c, args[nargs == 1 ? 0 : 1], "range");
	if (nargs > 1)
		a = need_int(c, args[0], "range");
	if (nargs > 2)
		st = need_int(c, args[2], "range");
	if (st == 0)
		jx_fail(c, "line %d: ValueError: range() arg 3 must not be zero", c->line);
	l = jv_list(c, 0);
	for (int64_t i = a; st > 0 ? i < b : i > b; i += st) {
		if (l.u.l->n >= MAX_RANGE)
			jx_fail(c, "line %d: range longer than %d", c->line, MAX_RANGE);
		jx_step(c, 1);
		jl_push(c, l.u.l, jv_int(i));
		if ((st > 0 && i > INT64_MAX - st) || (st < 0 && i < INT64_MIN - st))
			break;
	}
	return l;
}

static struct jv g_strftime(struct jctx *c, struct jv fmt)
{
	time_t t = c->o->now ? (time_t)c->o->now : time(NULL);
	struct tm tm;
	char out[512], *f;

	need_str(c, fmt, "strftime_now");
	f = jx_strdup(c, fmt.u.s.p, fmt.u.s.n);
	if (c->o->now)
		gmtime_r(&t, &tm);
	else
		localtime_r(&t, &tm);
	if (fmt.u.s.n > 200)
		jx_fail(c, "line %d: strftime_now format too long", c->line);
	size_t n = strftime(out, sizeof(out), f, &tm);

	return jv_str(jx_strdup(c, out, n), n);
}

static struct jv call_global(struct jctx *c, const char *g, const struct jv *args, size_t nargs,
			     const char *const *kwn, const struct jv *kwv, size_t nkw)
{
	struct jv d;

	if (!strcmp(g, "range"))
		return g_range(c, args, nargs);
	if (!strcmp(g, "raise_exception")) {
		struct jv msg = nargs ? jv_tostr(c, args[0]) : jv_cstr("");

		jx_fail(c, "%.*s", (int)msg.u.s.n, msg.u.s.p);
	}
	if (!strcmp(g, "strftime_now"))
		return g_strftime(c, nargs ? args[0] : jv_undef("format"));
	d = jv_dict(c);
	if (!strcmp(g, "namespace"))
		d.fl |= JF_NS;
	for (size_t i = 0; i < nargs; i++) { /* namespace({...}) or dict({...}) */
		if (args[i].k != JK_DICT)
			jx_fail(c, "line %d: TypeError: %s() takes keyword arguments or a dict", c->line, g);
		for (size_t k = 0; k < args[i].u.d->n; k++)
			jd_set(c, d.u.d, args[i].u.d->e[k].key, args[i].u.d->e[k].val);
	}
	for (size_t i = 0; i < nkw; i++)
		jd_set(c, d.u.d, jv_cstr(kwn[i]), kwv[i]);
	return d;
}

struct jv jx_call(struct jctx *c, struct jv f, const struct jv *args, size_t nargs,
		  const char *const *kwn, const struct jv *kwv, size_t nkw)
{
	switch (f.k) {
	case JK_MACRO:
		return jx_call_macro(c, f, args, nargs, kwn, kwv, nkw);
	case JK_DICT: { /* a recursive loop's loop(items) */
		struct jv *r = jd_gets(f.u.d, "__call__");

		if (!r || r->k != JK_MACRO || nargs != 1)
			break;
		return jx_loop_again(c, r->u.mac, args[0]);
	}
	case JK_FUNC:
		return call_global(c, f.u.name, args, nargs, kwn, kwv, nkw);
	case JK_METHOD: {
		struct jv self = f.u.mt->self;

		jx_step(c, 1 + jv_cost(self)); /* a method walks its string, list or dict */
		if (f.fl & JF_UNSAFE)
			jx_fail(c, "line %d: SecurityError: access to attribute '%s' of '%s' object is unsafe.",
				c->line, f.u.mt->name, jv_type(self));
		if (!strcmp(f.u.mt->name, "cycle")) { /* loop.cycle(a, b, ...) */
			if (!nargs)
				jx_fail(c, "line %d: TypeError: no items for cycling given", c->line);
			return args[self.u.i % (int64_t)nargs];
		}
		if (self.k == JK_STR)
			return str_method(c, self, f.u.mt->name, args, nargs, kwn, kwv, nkw);
		if (self.k == JK_DICT)
			return dict_method(c, self, f.u.mt->name, args, nargs);
		return list_method(c, self, f.u.mt->name, args, nargs);
	}
	case JK_UNDEF:
		jx_fail_undef(c, f);
	default:
		break;
	}
	jx_fail(c, "line %d: TypeError: '%s' object is not callable", c->line, jv_type(f));
}
