/* Jinja filters and tests, as jinja2 3.1 defines them (tojson as
 * transformers does: ensure_ascii off). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_impl.h"

struct fargs {
	const struct jv *args;
	size_t nargs;
	const char *const *kwn;
	const struct jv *kwv;
	size_t nkw;
};

/* argument I, or keyword NAME, or DEF */
static struct jv fa(const struct fargs *a, size_t i, const char *name, struct jv def)
{
	for (size_t k = 0; k < a->nkw; k++)
		if (!strcmp(a->kwn[k], name))
			return a->kwv[k];
	return i < a->nargs ? a->args[i] : def;
}

static bool has(const struct fargs *a, size_t i, const char *name)
{
	for (size_t k = 0; k < a->nkw; k++)
		if (!strcmp(a->kwn[k], name))
			return true;
	return i < a->nargs;
}

static bool str_eq(struct jv s, const char *t)
{
	return s.k == JK_STR && s.u.s.n == strlen(t) && !memcmp(s.u.s.p, t, s.u.s.n);
}

static char *cstr(struct jctx *c, struct jv s)
{
	return jx_strdup(c, s.u.s.p, s.u.s.n);
}

/* ---- sorting (a stable merge sort, as Python's sorted) ---- */

struct sortkey {
	bool case_sensitive;
	const char *attr;
};

static struct jv attr_path(struct jctx *c, struct jv v, const char *path);

static struct jv sort_value(struct jctx *c, struct jv v, const struct sortkey *k)
{
	if (k->attr)
		v = attr_path(c, v, k->attr);
	if (v.k == JK_STR && !k->case_sensitive)
		return jx_lower(c, v);
	return v;
}

static void merge_sort(struct jctx *c, struct jv *v, struct jv *keys, size_t n, bool rev)
{
	struct jv *tv, *tk;
	size_t h = n / 2, i = 0, j = h, k = 0;

	if (n < 2)
		return;
	merge_sort(c, v, keys, h, rev);
	merge_sort(c, v + h, keys + h, n - h, rev);
	tv = jx_alloc_array(c, n, sizeof(*tv));
	tk = jx_alloc_array(c, n, sizeof(*tk));
	while (i < h || j < n) {
		bool take_right = i == h;

		jx_step(c, 1);
		if (i < h && j < n) {
			int r = jv_cmp(c, keys[j], keys[i]);

			take_right = rev ? r > 0 : r < 0;
		}
		if (take_right) {
			tv[k] = v[j];
			tk[k++] = keys[j++];
		} else {
			tv[k] = v[i];
			tk[k++] = keys[i++];
		}
	}
	memcpy(v, tv, n * sizeof(*v));
	memcpy(keys, tk, n * sizeof(*keys));
}

static struct jv sorted(struct jctx *c, struct jv items, const struct sortkey *k, bool rev)
{
	struct jv src = jv_iter(c, items), out = jv_list(c, src.u.l->n);
	struct jv *keys = jx_alloc_array(c, src.u.l->n + 1, sizeof(*keys));

	for (size_t i = 0; i < src.u.l->n; i++) {
		jl_push(c, out.u.l, src.u.l->v[i]);
		keys[i] = sort_value(c, src.u.l->v[i], k);
	}
	merge_sort(c, out.u.l->v, keys, out.u.l->n, rev);
	return out;
}

/* ---- attribute paths: "a.b.0" ---- */

static struct jv attr_path(struct jctx *c, struct jv v, const char *path)
{
	const char *p = path;

	while (*p) {
		const char *dot = strchr(p, '.');
		size_t n = dot ? (size_t)(dot - p) : strlen(p);
		struct jv key = jv_str(p, n);
		bool digits = n > 0;

		for (size_t i = 0; i < n; i++)
			digits &= isdigit((unsigned char)p[i]) != 0;
		if (digits)
			key = jv_int(strtoll(p, NULL, 10));
		v = jx_getitem(c, v, key);
		p += n + (dot != NULL);
	}
	return v;
}

/* ---- filters ---- */

static struct jv f_default(struct jv v, const struct fargs *a)
{
	struct jv def = fa(a, 0, "default_value", jv_str("", 0));
	bool boolean = jv_truthy(fa(a, 1, "boolean", jv_bool(false)));

	if (v.k == JK_UNDEF || (boolean && !jv_truthy(v)))
		return def;
	return v;
}

static struct jv f_length(struct jctx *c, struct jv v)
{
	switch (v.k) {
	case JK_UNDEF:
		return jv_int(0);
	case JK_STR: {
		int64_t k = 0;

		for (size_t i = 0; i < v.u.s.n; i++)
			k += ((unsigned char)v.u.s.p[i] & 0xc0) != 0x80;
		return jv_int(k);
	}
	case JK_LIST:
		if (!(v.fl & JF_GEN))
			return jv_int((int64_t)v.u.l->n);
		break;
	case JK_DICT:
		return jv_int((int64_t)v.u.d->n);
	default:
		break;
	}
	jx_fail(c, "line %d: TypeError: object of type '%s' has no len()", c->line, jv_type(v));
}

static struct jv f_tojson(struct jctx *c, struct jv v, const struct fargs *a)
{
	/* transformers' signature: tojson(x, ensure_ascii, indent, separators, sort_keys) */
	bool ascii = jv_truthy(fa(a, 0, "ensure_ascii", jv_bool(false)));
	struct jv ind = fa(a, 1, "indent", jv_none()), seps = fa(a, 2, "separators", jv_none());
	bool sort = jv_truthy(fa(a, 3, "sort_keys", jv_bool(false)));
	const char *indent = NULL, *isep, *ksep = ": ";
	struct jbuf b = { 0 };

	if (ind.k == JK_INT) {
		if (ind.u.i < 0 || ind.u.i > 64)
			jx_fail(c, "line %d: tojson indent %lld out of range", c->line, (long long)ind.u.i);
		char *s = jx_alloc(c, (size_t)ind.u.i + 1);

		memset(s, ' ', (size_t)ind.u.i);
		indent = s;
	} else if (ind.k == JK_STR) {
		indent = cstr(c, ind);
	}
	isep = indent ? "," : ", ";
	if (seps.k == JK_LIST) {
		if (seps.u.l->n != 2 || seps.u.l->v[0].k != JK_STR || seps.u.l->v[1].k != JK_STR)
			jx_fail(c, "line %d: tojson separators must be two strings", c->line);
		isep = cstr(c, seps.u.l->v[0]);
		ksep = cstr(c, seps.u.l->v[1]);
	}
	c->json_ascii = ascii;
	jx_tojson(c, &b, v, indent, isep, ksep, sort, 0);
	c->json_ascii = false;
	struct jv r = jb_str(&b);

	r.fl |= JF_SAFE;
	return r;
}

/* a generator of (key, value) pairs, as jinja2's items filter */
static struct jv f_items(struct jctx *c, struct jv v)
{
	struct jv l;

	if (v.k == JK_UNDEF) {
		l = jv_list(c, 0);
		l.fl |= JF_GEN;
		return l;
	}
	if (v.k != JK_DICT)
		jx_fail(c, "line %d: TypeError: Can only get item pairs from a mapping.", c->line);
	l = jv_list(c, v.u.d->n);
	for (size_t i = 0; i < v.u.d->n; i++) {
		struct jv t = jv_list(c, 2);

		jl_push(c, t.u.l, v.u.d->e[i].key);
		jl_push(c, t.u.l, v.u.d->e[i].val);
		t.fl |= JF_TUPLE;
		jl_push(c, l.u.l, t);
	}
	l.fl |= JF_GEN;
	return l;
}

static struct jv f_join(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct jv sep = jv_tostr(c, fa(a, 0, "d", jv_str("", 0)));
	struct jv attr = fa(a, 1, "attribute", jv_none());
	struct jv l = jv_iter(c, v);
	struct jbuf b = { 0 };

	for (size_t i = 0; i < l.u.l->n; i++) {
		struct jv x = l.u.l->v[i];

		if (i)
			jb_putv(c, &b, sep);
		if (attr.k == JK_STR)
			x = attr_path(c, x, cstr(c, attr));
		jv_print(c, &b, x);
	}
	return jb_str(&b);
}

static struct jv apply_test_or_filter(struct jctx *c, bool filter, const char *name, struct jv v,
				      const struct fargs *a, size_t from)
{
	size_t n = a->nargs > from ? a->nargs - from : 0;

	if (filter)
		return jx_filter(c, name, v, a->args + from, n, NULL, NULL, 0);
	return jv_bool(jx_test(c, name, v, a->args + from, n));
}

static struct jv f_map(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct jv l = jv_iter(c, v), out = jv_list(c, l.u.l->n);
	struct jv attr = fa(a, 99, "attribute", jv_none());
	struct jv def = fa(a, 99, "default", jv_undef(NULL));
	const char *name = NULL;

	if (attr.k != JK_STR) {
		if (!a->nargs || a->args[0].k != JK_STR)
			jx_fail(c, "line %d: map needs a filter name or attribute=", c->line);
		name = cstr(c, a->args[0]);
	}
	for (size_t i = 0; i < l.u.l->n; i++) {
		struct jv x = l.u.l->v[i];

		jx_step(c, 1);
		if (name) {
			x = apply_test_or_filter(c, true, name, x, a, 1);
		} else {
			x = attr_path(c, x, cstr(c, attr));
			if (x.k == JK_UNDEF && has(a, 99, "default"))
				x = def;
		}
		jl_push(c, out.u.l, x);
	}
	out.fl |= JF_GEN;
	return out;
}

/* select / reject (ATTR false) and selectattr / rejectattr (ATTR true) */
static struct jv f_select(struct jctx *c, struct jv v, const struct fargs *a, bool keep,
			  bool attr)
{
	struct jv l = jv_iter(c, v), out = jv_list(c, 0);
	size_t ti = attr ? 1 : 0;
	const char *test = NULL, *path = NULL;

	if (attr) {
		if (!a->nargs || a->args[0].k != JK_STR)
			jx_fail(c, "line %d: selectattr needs an attribute name", c->line);
		path = cstr(c, a->args[0]);
	}
	if (a->nargs > ti) {
		if (a->args[ti].k != JK_STR)
			jx_fail(c, "line %d: select needs a test name", c->line);
		test = cstr(c, a->args[ti]);
	}
	for (size_t i = 0; i < l.u.l->n; i++) {
		struct jv x = l.u.l->v[i], t = path ? attr_path(c, x, path) : x;
		bool ok;

		jx_step(c, 1);
		ok = test ? jv_truthy(apply_test_or_filter(c, false, test, t, a, ti + 1))
			  : jv_truthy(t);
		if (ok == keep)
			jl_push(c, out.u.l, x);
	}
	out.fl |= JF_GEN;
	return out;
}

static struct jv f_first_last(struct jctx *c, struct jv v, bool last)
{
	struct jv l;

	if (v.k == JK_UNDEF)
		return jv_undef("first");
	l = jv_iter(c, v);
	if (!l.u.l->n)
		return jv_undef(last ? "last" : "first");
	return l.u.l->v[last ? l.u.l->n - 1 : 0];
}

static struct jv f_int(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct jv def = fa(a, 0, "default", jv_int(0));

	switch (v.k) {
	case JK_UNDEF:
		jx_fail_undef(c, v);
	case JK_INT:
		return v;
	case JK_BOOL:
		return jv_int(v.u.b);
	case JK_FLOAT:
		if (isfinite(v.u.f) && fabs(v.u.f) < 9.2e18)
			return jv_int((int64_t)v.u.f);
		return def;
	case JK_STR: {
		char *s = cstr(c, v), *end;
		long long i = strtoll(s, &end, 10);

		while (isspace((unsigned char)*end))
			end++;
		if (end != s && !*end)
			return jv_int(i);
		double f = strtod(s, &end);

		while (isspace((unsigned char)*end))
			end++;
		if (end != s && !*end && isfinite(f) && fabs(f) < 9.2e18)
			return jv_int((int64_t)f);
		return def;
	}
	default:
		return def;
	}
}

static struct jv f_float(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct jv def = fa(a, 0, "default", jv_float(0));

	switch (v.k) {
	case JK_UNDEF:
		jx_fail_undef(c, v);
	case JK_INT:
		return jv_float((double)v.u.i);
	case JK_BOOL:
		return jv_float(v.u.b);
	case JK_FLOAT:
		return v;
	case JK_STR: {
		char *s = cstr(c, v), *end;
		double f = strtod(s, &end);

		while (isspace((unsigned char)*end))
			end++;
		return end != s && !*end ? jv_float(f) : def;
	}
	default:
		return def;
	}
}

static struct jv f_escape(struct jctx *c, struct jv v)
{
	struct jbuf b = { 0 };
	struct jv s = jv_tostr(c, v);

	if (v.fl & JF_SAFE)
		return v;
	for (size_t i = 0; i < s.u.s.n; i++) {
		char ch = s.u.s.p[i];
		const char *e = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" :
				ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;

		if (e)
			jb_puts(c, &b, e);
		else
			jb_putv(c, &b, jv_sub(s, i, 1));
	}
	s = jb_str(&b);
	s.fl |= JF_SAFE;
	return s;
}

/* jinja2's indent: the lines of S + "\n" (str.splitlines), joined by "\n"
 * with the indent before each but the first (and before blank ones only
 * with blank=true), before the first too with first=true. */
static struct jv f_indent(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct jv w = fa(a, 0, "width", jv_int(4)), s = jv_tostr(c, v), ind = w, lines;
	bool first = jv_truthy(fa(a, 1, "first", jv_bool(false)));
	bool blank = jv_truthy(fa(a, 2, "blank", jv_bool(false)));
	struct jbuf b = { 0 };

	if (w.k != JK_STR) {
		struct jbuf ib = { 0 };
		int64_t n = w.k == JK_INT ? w.u.i : 4;

		for (int64_t i = 0; i < n && i < 256; i++)
			jb_putc(c, &ib, ' ');
		ind = jb_str(&ib);
	}
	jb_putv(c, &b, s);
	jb_putc(c, &b, '\n');
	lines = jx_splitlines(c, jb_str(&b));
	b = (struct jbuf){ 0 };
	if (first)
		jb_putv(c, &b, ind);
	for (size_t i = 0; i < lines.u.l->n; i++) {
		struct jv line = lines.u.l->v[i];

		if (i) {
			jb_putc(c, &b, '\n');
			if (blank || line.u.s.n)
				jb_putv(c, &b, ind);
		}
		jb_putv(c, &b, line);
	}
	return jb_str(&b);
}

static struct jv f_dictsort(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct sortkey k = { .case_sensitive = jv_truthy(fa(a, 0, "case_sensitive", jv_bool(false))) };
	struct jv by = fa(a, 1, "by", jv_cstr("key"));
	bool rev = jv_truthy(fa(a, 2, "reverse", jv_bool(false)));
	struct jv items = f_items(c, v), keys;

	k.attr = (by.k == JK_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5)) ? "1" : "0";
	keys = jv_list(c, items.u.l->n);
	for (size_t i = 0; i < items.u.l->n; i++)
		jl_push(c, keys.u.l, sort_value(c, items.u.l->v[i], &k));
	merge_sort(c, items.u.l->v, keys.u.l->v, items.u.l->n, rev);
	items.fl &= (uint8_t)~JF_GEN; /* a list */
	return items;
}

static struct jv f_unique(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct sortkey k = { .case_sensitive = jv_truthy(fa(a, 0, "case_sensitive", jv_bool(false))) };
	struct jv attr = fa(a, 1, "attribute", jv_none());
	struct jv l = jv_iter(c, v), out = jv_list(c, 0), seen = jv_list(c, 0);

	if (attr.k == JK_STR)
		k.attr = cstr(c, attr);
	for (size_t i = 0; i < l.u.l->n; i++) {
		struct jv key = sort_value(c, l.u.l->v[i], &k);
		bool dup = false;

		for (size_t j = 0; j < seen.u.l->n && !dup; j++) {
			jx_step(c, 1);
			dup = jv_eq(seen.u.l->v[j], key);
		}
		if (!dup) {
			jl_push(c, seen.u.l, key);
			jl_push(c, out.u.l, l.u.l->v[i]);
		}
	}
	out.fl |= JF_GEN;
	return out;
}

static struct jv f_minmax(struct jctx *c, struct jv v, const struct fargs *a, bool max)
{
	struct sortkey k = { .case_sensitive = jv_truthy(fa(a, 0, "case_sensitive", jv_bool(false))) };
	struct jv attr = fa(a, 1, "attribute", jv_none()), l = jv_iter(c, v), best;
	size_t bi = 0;

	if (attr.k == JK_STR)
		k.attr = cstr(c, attr);
	if (!l.u.l->n)
		return jv_undef(max ? "max" : "min");
	best = sort_value(c, l.u.l->v[0], &k);
	for (size_t i = 1; i < l.u.l->n; i++) {
		struct jv x = sort_value(c, l.u.l->v[i], &k);
		int r = jv_cmp(c, x, best);

		if (max ? r > 0 : r < 0) {
			best = x;
			bi = i;
		}
	}
	return l.u.l->v[bi];
}

static struct jv f_sum(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct jv attr = fa(a, 0, "attribute", jv_none()), acc = fa(a, 1, "start", jv_int(0));
	struct jv l = jv_iter(c, v);

	for (size_t i = 0; i < l.u.l->n; i++) {
		struct jv x = l.u.l->v[i];

		if (attr.k == JK_STR)
			x = attr_path(c, x, cstr(c, attr));
		acc = jx_binop(c, JT_ADD, acc, x);
	}
	return acc;
}

static struct jv f_reverse(struct jctx *c, struct jv v)
{
	struct jv l, out;

	if (v.k == JK_STR)
		return jx_slice(c, v, jv_none(), jv_none(), jv_int(-1));
	l = jv_iter(c, v);
	out = jv_list(c, l.u.l->n);
	for (size_t i = l.u.l->n; i-- > 0;)
		jl_push(c, out.u.l, l.u.l->v[i]);
	out.fl |= JF_GEN;
	return out;
}

static struct jv f_round(struct jctx *c, struct jv v, const struct fargs *a)
{
	int64_t prec = fa(a, 0, "precision", jv_int(0)).u.i;
	struct jv how = fa(a, 1, "method", jv_cstr("common"));
	double x, p;

	if (v.k == JK_UNDEF)
		jx_fail_undef(c, v);
	if (v.k != JK_INT && v.k != JK_FLOAT && v.k != JK_BOOL)
		jx_fail(c, "line %d: TypeError: round needs a number, not %s", c->line, jv_type(v));
	x = v.k == JK_FLOAT ? v.u.f : v.k == JK_INT ? (double)v.u.i : v.u.b;
	if (v.k != JK_FLOAT && !(how.k == JK_STR && (str_eq(how, "ceil") || str_eq(how, "floor"))))
		return jv_int(v.k == JK_INT ? v.u.i : v.u.b); /* Python's round(int) is the int */
	if (prec < 0 || prec > 15)
		prec = 0;
	p = pow(10, (double)prec);
	if (how.k == JK_STR && str_eq(how, "ceil"))
		return jv_float(ceil(x * p) / p);
	if (how.k == JK_STR && str_eq(how, "floor"))
		return jv_float(floor(x * p) / p);
	return jv_float(rint(x * p) / p); /* Python's round: half to even */
}

static struct jv f_center(struct jctx *c, struct jv v, const struct fargs *a)
{
	struct jv s = jv_tostr(c, v);
	int64_t w = fa(a, 0, "width", jv_int(80)).u.i;
	struct jbuf b = { 0 };
	int64_t n = 0;

	for (size_t i = 0; i < s.u.s.n; i++)
		n += ((unsigned char)s.u.s.p[i] & 0xc0) != 0x80;
	if (w > 4096)
		w = 4096;
	if (w <= n)
		return s;
	int64_t left = (w - n) / 2 + ((w - n) & w & 1); /* Python's str.center */

	for (int64_t i = 0; i < left; i++)
		jb_putc(c, &b, ' ');
	jb_putv(c, &b, s);
	for (int64_t i = 0; i < w - n - left; i++)
		jb_putc(c, &b, ' ');
	return jb_str(&b);
}

/* the number of \w+ runs: letters, digits and '_'; any character beyond
 * ASCII but the Unicode spaces counts as a letter */
static struct jv f_wordcount(struct jctx *c, struct jv v)
{
	struct jv s = jv_tostr(c, v);
	const unsigned char *p = (const unsigned char *)s.u.s.p;
	int64_t k = 0;
	bool in = false;

	for (size_t i = 0, n; i < s.u.s.n; i += n) {
		uint32_t u = jx_utf8_decode(p + i, s.u.s.n - i, &n);
		bool w = u < 0x80 ? (isalnum((int)u) || u == '_') : !jx_is_space(u);

		k += w && !in;
		in = w;
	}
	return jv_int(k);
}

static struct jv str_filter(struct jctx *c, const char *name, struct jv v, const struct fargs *a)
{
	struct jv s = v.k == JK_STR ? v : jv_tostr(c, v);
	struct jv m = { .k = JK_METHOD };
	struct jmethod mt = { s, name };

	m.u.mt = &mt;
	return jx_call(c, m, a->args, a->nargs, a->kwn, a->kwv, a->nkw);
}

/* ---- the filter table ---- */

typedef struct jv (*filter_fn)(struct jctx *c, struct jv v, const struct fargs *a,
			       const char *name);

static struct jv x_default(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_default(v, a);
}

static struct jv x_length(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_length(c, v);
}

static struct jv x_tojson(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_tojson(c, v, a);
}

static struct jv x_trim(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	struct jv chars = fa(a, 0, "chars", jv_none());

	return str_filter(c, "strip", v, &(struct fargs){ &chars, 1, NULL, NULL, 0 });
}

/* upper, lower, capitalize; title as jinja2's filter (not str.title) */
static struct jv x_case(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return str_filter(c, strcmp(n, "title") ? n : "title_filter", v, &(struct fargs){ 0 });
}

static struct jv x_replace(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	struct jv r[3] = { fa(a, 0, "old", jv_str("", 0)), fa(a, 1, "new", jv_str("", 0)),
			   fa(a, 2, "count", jv_none()) };

	return str_filter(c, "replace", v, &(struct fargs){ r, r[2].k == JK_NONE ? 2 : 3, NULL,
							      NULL, 0 });
}

static struct jv x_string(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return jv_tostr(c, v);
}

static struct jv x_safe(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	struct jv s = jv_tostr(c, v);

	s.fl |= JF_SAFE;
	return s;
}

static struct jv x_escape(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_escape(c, v);
}

static struct jv x_join(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_join(c, v, a);
}

static struct jv x_items(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_items(c, v);
}

static struct jv x_list(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	struct jv l = jv_iter(c, v), out = jv_list(c, l.u.l->n);

	for (size_t i = 0; i < l.u.l->n; i++)
		jl_push(c, out.u.l, l.u.l->v[i]);
	return out;
}

static struct jv x_map(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_map(c, v, a);
}

/* select, reject, selectattr, rejectattr */
static struct jv x_select(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_select(c, v, a, n[0] == 's', strstr(n, "attr") != NULL);
}

static struct jv x_first_last(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_first_last(c, v, n[0] == 'l');
}

static struct jv x_int(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_int(c, v, a);
}

static struct jv x_float(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_float(c, v, a);
}

static struct jv x_abs(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	if (v.k == JK_INT && v.u.i != INT64_MIN)
		return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
	if (v.k == JK_FLOAT)
		return jv_float(fabs(v.u.f));
	if (v.k == JK_BOOL)
		return jv_int(v.u.b);
	jx_fail(c, "line %d: TypeError: bad operand type for abs(): '%s'", c->line, jv_type(v));
}

static struct jv x_round(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_round(c, v, a);
}

static struct jv x_sort(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	struct jv attr = fa(a, 2, "attribute", jv_none());
	struct sortkey sk = {
		.case_sensitive = jv_truthy(fa(a, 1, "case_sensitive", jv_bool(false))),
		.attr = attr.k == JK_STR ? cstr(c, attr) : NULL,
	};

	return sorted(c, v, &sk, jv_truthy(fa(a, 0, "reverse", jv_bool(false))));
}

static struct jv x_dictsort(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_dictsort(c, v, a);
}

static struct jv x_unique(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_unique(c, v, a);
}

static struct jv x_reverse(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_reverse(c, v);
}

static struct jv x_minmax(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_minmax(c, v, a, n[1] == 'a');
}

static struct jv x_sum(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_sum(c, v, a);
}

static struct jv x_indent(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_indent(c, v, a);
}

static struct jv x_center(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_center(c, v, a);
}

static struct jv x_wordcount(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return f_wordcount(c, v);
}

static struct jv x_attr(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	return jx_getattr(c, v, cstr(c, jv_tostr(c, fa(a, 0, "name", jv_str("", 0)))));
}

/* "%s and %s"|format(a, b): printf-style, as "..." % (a, b) */
static struct jv x_format(struct jctx *c, struct jv v, const struct fargs *a, const char *n)
{
	struct jv args = jv_list(c, a->nargs);

	for (size_t i = 0; i < a->nargs; i++)
		jl_push(c, args.u.l, a->args[i]);
	args.fl |= JF_TUPLE;
	return jx_percent_format(c, jv_tostr(c, v), args);
}

static const struct {
	const char *name;
	filter_fn fn;
} filters[] = {
	{ "default", x_default }, { "d", x_default }, { "length", x_length },
	{ "count", x_length }, { "tojson", x_tojson }, { "trim", x_trim },
	{ "upper", x_case }, { "lower", x_case }, { "capitalize", x_case }, { "title", x_case },
	{ "replace", x_replace }, { "string", x_string }, { "safe", x_safe },
	{ "e", x_escape }, { "escape", x_escape }, { "forceescape", x_escape },
	{ "join", x_join }, { "items", x_items }, { "list", x_list }, { "map", x_map },
	{ "select", x_select }, { "reject", x_select }, { "selectattr", x_select },
	{ "rejectattr", x_select }, { "first", x_first_last }, { "last", x_first_last },
	{ "int", x_int }, { "float", x_float }, { "abs", x_abs }, { "round", x_round },
	{ "sort", x_sort }, { "dictsort", x_dictsort }, { "unique", x_unique },
	{ "reverse", x_reverse }, { "min", x_minmax }, { "max", x_minmax }, { "sum", x_sum },
	{ "indent", x_indent }, { "center", x_center }, { "wordcount", x_wordcount },
	{ "attr", x_attr }, { "format", x_format },
};

#define N_FILTERS (sizeof(filters) / sizeof(filters[0]))

static filter_fn find_filter(const char *name)
{
	for (size_t i = 0; i < N_FILTERS; i++)
		if (!strcmp(filters[i].name, name))
			return filters[i].fn;
	return NULL;
}

struct jv jx_filter(struct jctx *c, const char *name, struct jv v, const struct jv *args,
		    size_t nargs, const char *const *kwn, const struct jv *kwv, size_t nkw)
{
	struct fargs a = { args, nargs, kwn, kwv, nkw };
	filter_fn fn = find_filter(name);

	if (!fn) /* jinja2 checks at compile time; a filter in a branch not taken is fine */
		jx_fail(c, "line %d: No filter named '%s'.", c->line, name);
	jx_step(c, 1 + jv_cost(v)); /* a filter walks its value */
	return fn(c, v, &a, name);
}

/* ---- tests ---- */

/* The tests, by name; the comparison tests (eq, lt...) share test_cmp. */
enum test_id {
	T_DEFINED, T_UNDEFINED, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE, T_INTEGER, T_FLOAT, T_NUMBER,
	T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_EVEN, T_ODD, T_DIVISIBLEBY,
	T_IN, T_LOWER, T_UPPER, T_SAMEAS, T_ESCAPED, T_FILTER, T_TEST, T_CMP,
};

static const struct {
	const char *name;
	enum test_id id;
} tests[] = {
	{ "defined", T_DEFINED }, { "undefined", T_UNDEFINED }, { "none", T_NONE },
	{ "boolean", T_BOOLEAN }, { "false", T_FALSE }, { "true", T_TRUE },
	{ "integer", T_INTEGER }, { "float", T_FLOAT }, { "number", T_NUMBER },
	{ "string", T_STRING }, { "mapping", T_MAPPING }, { "iterable", T_ITERABLE },
	{ "sequence", T_SEQUENCE }, { "callable", T_CALLABLE }, { "even", T_EVEN },
	{ "odd", T_ODD }, { "divisibleby", T_DIVISIBLEBY }, { "in", T_IN }, { "lower", T_LOWER },
	{ "upper", T_UPPER }, { "sameas", T_SAMEAS }, { "escaped", T_ESCAPED },
	{ "filter", T_FILTER }, { "test", T_TEST },
	{ "eq", T_CMP }, { "equalto", T_CMP }, { "==", T_CMP }, { "ne", T_CMP }, { "!=", T_CMP },
	{ "lt", T_CMP }, { "lessthan", T_CMP }, { "<", T_CMP }, { "le", T_CMP }, { "<=", T_CMP },
	{ "gt", T_CMP }, { "greaterthan", T_CMP }, { ">", T_CMP }, { "ge", T_CMP },
	{ ">=", T_CMP },
};

#define N_TESTS (sizeof(tests) / sizeof(tests[0]))

static bool known_filter(const char *name)
{
	return find_filter(name) != NULL;
}

static bool test_cmp(struct jctx *c, const char *name, struct jv v, struct jv x)
{
	int r;

	if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "=="))
		return jv_eq(v, x);
	if (!strcmp(name, "ne") || !strcmp(name, "!="))
		return !jv_eq(v, x);
	r = jv_cmp(c, v, x);
	if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<"))
		return r < 0;
	if (!strcmp(name, "le") || !strcmp(name, "<="))
		return r <= 0;
	if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">"))
		return r > 0;
	return r >= 0;
}

static bool str_case(struct jctx *c, struct jv v, bool upper)
{
	struct jv s = jv_tostr(c, v);

	for (size_t i = 0; i < s.u.s.n; i++) {
		unsigned char ch = (unsigned char)s.u.s.p[i];

		if (upper ? islower(ch) : isupper(ch))
			return false;
	}
	return true;
}

static bool test_parity(struct jctx *c, const char *name, struct jv v, bool even)
{
	int64_t n = v.k == JK_INT ? v.u.i : v.k == JK_BOOL ? v.u.b : 0;

	if (v.k == JK_FLOAT) /* value % 2 == 0, as jinja2 computes it */
		return (fmod(v.u.f, 2) == 0) == even;
	if (v.k != JK_INT && v.k != JK_BOOL)
		jx_fail(c, "line %d: TypeError: %s needs a number", c->line, name);
	return (n % 2 == 0) == even;
}

static bool test_divisible(struct jctx *c, struct jv v, struct jv x)
{
	if (v.k != JK_INT || x.k != JK_INT)
		jx_fail(c, "line %d: TypeError: divisibleby needs integers", c->line);
	if (x.u.i == 0)
		jx_fail(c, "line %d: ZeroDivisionError: divisibleby 0", c->line);
	return x.u.i == -1 || v.u.i % x.u.i == 0;
}

/* sameas: the same object (lists and dicts), else the same value */
static bool test_sameas(struct jv v, struct jv x)
{
	if (v.k != x.k)
		return false;
	if (v.k == JK_LIST)
		return v.u.l == x.u.l;
	if (v.k == JK_DICT)
		return v.u.d == x.u.d;
	return jv_eq(v, x);
}

static bool test_is_test(struct jv v)
{
	if (v.k != JK_STR)
		return false;
	for (size_t k = 0; k < N_TESTS; k++)
		if (strlen(tests[k].name) == v.u.s.n && !memcmp(tests[k].name, v.u.s.p, v.u.s.n))
			return true;
	return false;
}

bool jx_test(struct jctx *c, const char *name, struct jv v, const struct jv *args, size_t nargs)
{
	struct jv x = nargs ? args[0] : jv_undef(NULL);
	bool seq = v.k == JK_STR || v.k == JK_UNDEF || (v.k == JK_DICT && !(v.fl & JF_NS));
	size_t i;

	for (i = 0; i < N_TESTS; i++)
		if (!strcmp(tests[i].name, name))
			break;
	if (i == N_TESTS)
		jx_fail(c, "line %d: No test named '%s'.", c->line, name);
	switch (tests[i].id) {
	case T_DEFINED: return v.k != JK_UNDEF && !(v.fl & JF_UNSAFE); /* sandbox: undefined */
	case T_UNDEFINED: return v.k == JK_UNDEF || (v.fl & JF_UNSAFE);
	case T_NONE: return v.k == JK_NONE;
	case T_BOOLEAN: return v.k == JK_BOOL;
	case T_FALSE: return v.k == JK_BOOL && !v.u.b;
	case T_TRUE: return v.k == JK_BOOL && v.u.b;
	case T_INTEGER: return v.k == JK_INT;
	case T_FLOAT: return v.k == JK_FLOAT;
	case T_NUMBER: return v.k == JK_INT || v.k == JK_FLOAT || v.k == JK_BOOL;
	case T_STRING: return v.k == JK_STR;
	case T_MAPPING: return v.k == JK_DICT && !(v.fl & JF_NS);
	case T_ITERABLE: return seq || v.k == JK_LIST;
	case T_SEQUENCE: return seq || (v.k == JK_LIST && !(v.fl & JF_GEN)); /* no len() */
	case T_CALLABLE: return v.k == JK_MACRO || v.k == JK_METHOD || v.k == JK_FUNC;
	case T_EVEN:
	case T_ODD: return test_parity(c, name, v, tests[i].id == T_EVEN);
	case T_DIVISIBLEBY: return test_divisible(c, v, x);
	case T_IN: return jx_contains(c, x, v);
	case T_LOWER: return str_case(c, v, false);
	case T_UPPER: return str_case(c, v, true);
	case T_SAMEAS: return test_sameas(v, x);
	case T_ESCAPED: return (v.fl & JF_SAFE) != 0;
	case T_FILTER: return v.k == JK_STR && known_filter(jx_strdup(c, v.u.s.p, v.u.s.n));
	case T_TEST: return test_is_test(v);
	case T_CMP: break;
	}
	return test_cmp(c, name, v, x);
}
