/* Jinja evaluator: runs statements into the output buffer and evaluates
 * expressions to values, with jinja2's scoping (a for loop's body and a
 * macro's body are scopes of their own; if blocks are not). */
#include <string.h>

#include "text/jinja_impl.h"

static struct jv *lookup(struct jscope *sc, const char *name)
{
	for (; sc; sc = sc->up) {
		struct jv *v = jd_gets(&sc->vars, name);

		if (v)
			return v;
	}
	return NULL;
}

static struct jscope *new_scope(struct jctx *c, struct jscope *up)
{
	struct jscope *s = jx_alloc(c, sizeof(*s));

	s->up = up;
	return s;
}

static void set_var(struct jctx *c, struct jscope *sc, const char *name, struct jv v)
{
	jd_set(c, &sc->vars, jv_cstr(name), v);
}

/* Positional and keyword arguments of a call or filter node. */
struct args {
	struct jv *pos;
	size_t npos;
	const char **kwn;
	struct jv *kwv;
	size_t nkw;
};

static void eval_args(struct jctx *c, const struct jnode *n, struct jscope *sc, struct args *a)
{
	a->pos = jx_alloc_array(c, n->n + 1, sizeof(*a->pos));
	a->kwv = jx_alloc_array(c, n->n + 1, sizeof(*a->kwv));
	a->kwn = jx_alloc_array(c, n->n + 1, sizeof(*a->kwn));
	a->npos = a->nkw = 0;
	for (size_t i = 0; i < n->n; i++) {
		const struct jnode *k = n->kids[i];

		if (k->kind == JN_KWARG) {
			a->kwn[a->nkw] = k->name;
			a->kwv[a->nkw++] = jx_eval(c, k->a, sc);
		} else {
			a->pos[a->npos++] = jx_eval(c, k, sc);
		}
	}
}

/* A filter chain whose innermost operand is missing (filter blocks,
 * set blocks) applied to IN. */
static struct jv apply_filters(struct jctx *c, const struct jnode *f, struct jscope *sc,
			       struct jv in)
{
	struct args a;
	struct jv v;

	if (!f)
		return in;
	v = f->a ? apply_filters(c, f->a, sc, in) : in;
	eval_args(c, f, sc, &a);
	return jx_filter(c, f->name, v, a.pos, a.npos, a.kwn, a.kwv, a.nkw);
}

static struct jv eval_call(struct jctx *c, const struct jnode *e, struct jscope *sc)
{
	struct jv f = jx_eval(c, e->a, sc);
	struct args a;

	eval_args(c, e, sc, &a);
	return jx_call(c, f, a.pos, a.npos, a.kwn, a.kwv, a.nkw);
}

static struct jv eval_seq(struct jctx *c, const struct jnode *e, struct jscope *sc)
{
	struct jv l = jv_list(c, e->n);

	for (size_t i = 0; i < e->n; i++)
		jl_push(c, l.u.l, jx_eval(c, e->kids[i], sc));
	if (e->kind == JN_TUPLE)
		l.fl |= JF_TUPLE;
	return l;
}

static struct jv eval_dict(struct jctx *c, const struct jnode *e, struct jscope *sc)
{
	struct jv d = jv_dict(c);

	for (size_t i = 0; i + 1 < e->n; i += 2) {
		struct jv k = jx_eval(c, e->kids[i], sc);

		if (k.k == JK_LIST || k.k == JK_DICT || k.k == JK_UNDEF)
			jx_fail(c, "line %d: unhashable dict key (%s)", e->line, jv_type(k));
		jd_set(c, d.u.d, k, jx_eval(c, e->kids[i + 1], sc));
	}
	return d;
}

static struct jv eval_concat(struct jctx *c, struct jv a, struct jv b)
{
	struct jbuf buf = { 0 };

	jv_print(c, &buf, a);
	jv_print(c, &buf, b);
	return jb_str(&buf);
}

static struct jv eval_cmp(struct jctx *c, const struct jnode *e, struct jscope *sc)
{
	struct jv a = jx_eval(c, e->a, sc), b = jx_eval(c, e->b, sc);
	int r;

	jx_step(c, jv_cost(a) + jv_cost(b)); /* comparing and searching walk the values */

	switch (e->op) {
	case JT_EQ:
		return jv_bool(jv_eq(a, b));
	case JT_NE:
		return jv_bool(!jv_eq(a, b));
	case JT_IN:
		return jv_bool(jx_contains(c, b, a) != e->neg);
	}
	r = jv_cmp(c, a, b);
	switch (e->op) {
	case JT_LT:
		return jv_bool(r < 0);
	case JT_GT:
		return jv_bool(r > 0);
	case JT_LE:
		return jv_bool(r <= 0);
	default:
		return jv_bool(r >= 0);
	}
}

static struct jv eval_neg(struct jctx *c, const struct jnode *e, struct jscope *sc)
{
	struct jv v = jx_eval(c, e->a, sc);

	if (v.k == JK_BOOL)
		v = jv_int(v.u.b);
	if (v.k == JK_INT && e->kind == JN_NEG && v.u.i != INT64_MIN)
		return jv_int(-v.u.i);
	if (v.k == JK_FLOAT)
		return jv_float(e->kind == JN_NEG ? -v.u.f : v.u.f);
	if (v.k == JK_INT && e->kind == JN_POS)
		return v;
	jx_fail(c, "line %d: bad operand type for unary %s: '%s'", e->line,
		e->kind == JN_NEG ? "-" : "+", jv_type(v));
}

struct jv jx_eval(struct jctx *c, const struct jnode *e, struct jscope *sc)
{
	struct jv v;
	struct args a;

	if (!e) /* the parser leaves no operand empty; a guard all the same */
		jx_fail(c, "line %d: missing expression", c->line);
	jx_step(c, 1);
	c->line = e->line;
	switch (e->kind) {
	case JN_LIT:
		return e->lit;
	case JN_NAME: {
		struct jv *p = lookup(sc, e->name);

		if (p)
			return *p;
		if (jx_is_global(e->name)) {
			v.k = JK_FUNC;
			v.fl = 0;
			v.u.name = e->name;
			return v;
		}
		return jv_undef(e->name);
	}
	case JN_ATTR:
		return jx_getattr(c, jx_eval(c, e->a, sc), e->name);
	case JN_ITEM:
		v = jx_eval(c, e->a, sc);
		return jx_getitem(c, v, jx_eval(c, e->b, sc));
	case JN_SLICE:
		v = jx_eval(c, e->a, sc);
		return jx_slice(c, v, e->b ? jx_eval(c, e->b, sc) : jv_none(),
				e->c ? jx_eval(c, e->c, sc) : jv_none(),
				e->d ? jx_eval(c, e->d, sc) : jv_none());
	case JN_CALL:
		return eval_call(c, e, sc);
	case JN_FILTER:
		v = jx_eval(c, e->a, sc);
		eval_args(c, e, sc, &a);
		return jx_filter(c, e->name, v, a.pos, a.npos, a.kwn, a.kwv, a.nkw);
	case JN_TEST:
		v = jx_eval(c, e->a, sc);
		eval_args(c, e, sc, &a);
		return jv_bool(jx_test(c, e->name, v, a.pos, a.npos) != e->neg);
	case JN_LIST:
	case JN_TUPLE:
		return eval_seq(c, e, sc);
	case JN_DICT:
		return eval_dict(c, e, sc);
	case JN_COND:
		if (jv_truthy(jx_eval(c, e->a, sc)))
			return jx_eval(c, e->b, sc);
		return e->c ? jx_eval(c, e->c, sc) : jv_undef(NULL);
	case JN_AND:
		v = jx_eval(c, e->a, sc);
		return jv_truthy(v) ? jx_eval(c, e->b, sc) : v;
	case JN_OR:
		v = jx_eval(c, e->a, sc);
		return jv_truthy(v) ? v : jx_eval(c, e->b, sc);
	case JN_NOT:
		return jv_bool(!jv_truthy(jx_eval(c, e->a, sc)));
	case JN_NEG:
	case JN_POS:
		return eval_neg(c, e, sc);
	case JN_BIN:
		v = jx_eval(c, e->a, sc);
		return jx_binop(c, e->op, v, jx_eval(c, e->b, sc));
	case JN_CMP:
		return eval_cmp(c, e, sc);
	case JN_CONCAT:
		v = jx_eval(c, e->a, sc);
		return eval_concat(c, v, jx_eval(c, e->b, sc));
	}
	jx_fail(c, "line %d: not an expression", e->line);
}

/* Binds a for or set target (a name, ns.attr or a tuple of names). */
static void assign(struct jctx *c, const struct jnode *t, struct jv v, struct jscope *sc)
{
	if (t->kind == JN_NAME) {
		set_var(c, sc, t->name, v);
	} else if (t->kind == JN_ATTR) {
		struct jv ns = jx_eval(c, t->a, sc);

		if (ns.k != JK_DICT || !(ns.fl & JF_NS))
			jx_fail(c, "line %d: can't assign attribute '%s' on %s (only a namespace())",
				t->line, t->name, jv_type(ns));
		jd_set(c, ns.u.d, jv_cstr(t->name), v);
	} else {
		struct jv items = jv_iter(c, v);

		if (items.u.l->n != t->n)
			jx_fail(c, "line %d: cannot unpack %zu values into %zu names", t->line,
				items.u.l->n, t->n);
		for (size_t i = 0; i < t->n; i++)
			assign(c, t->kids[i], items.u.l->v[i], sc);
	}
}

/* Renders BODY into a fresh buffer and returns it as a string. */
static struct jv capture(struct jctx *c, const struct jnode *body, struct jscope *sc)
{
	struct jbuf buf = { 0 }, *saved = c->out;

	c->out = &buf;
	jx_run(c, body, sc);
	c->out = saved;
	return jb_str(&buf);
}

static void set_loop(struct jctx *c, struct jdict *loop, const struct jlist *items, size_t i,
		     int depth)
{
	size_t n = items->n;

	jd_set(c, loop, jv_cstr("index"), jv_int((int64_t)i + 1));
	jd_set(c, loop, jv_cstr("index0"), jv_int((int64_t)i));
	jd_set(c, loop, jv_cstr("revindex"), jv_int((int64_t)(n - i)));
	jd_set(c, loop, jv_cstr("revindex0"), jv_int((int64_t)(n - i - 1)));
	jd_set(c, loop, jv_cstr("first"), jv_bool(i == 0));
	jd_set(c, loop, jv_cstr("last"), jv_bool(i + 1 == n));
	jd_set(c, loop, jv_cstr("length"), jv_int((int64_t)n));
	jd_set(c, loop, jv_cstr("depth"), jv_int(depth + 1));
	jd_set(c, loop, jv_cstr("depth0"), jv_int(depth));
	jd_set(c, loop, jv_cstr("previtem"), i ? items->v[i - 1] : jv_undef("previtem"));
	jd_set(c, loop, jv_cstr("nextitem"), i + 1 < n ? items->v[i + 1] : jv_undef("nextitem"));
	jd_set(c, loop, jv_cstr("cycle"), jx_loop_cycle(c, (int64_t)i));
}

/* The items of a for loop after its if filter. */
/* The items of a for loop (ALL, as iterated) after its if filter. */
static struct jlist *loop_items(struct jctx *c, const struct jnode *s, struct jscope *sc,
				struct jv all)
{
	struct jv kept;
	struct jscope *fs;

	if (!s->n)
		return all.u.l;
	kept = jv_list(c, all.u.l->n);
	fs = new_scope(c, sc);
	for (size_t i = 0; i < all.u.l->n; i++) {
		jx_step(c, 1);
		assign(c, s->a, all.u.l->v[i], fs);
		if (jv_truthy(jx_eval(c, s->kids[0], fs)))
			jl_push(c, kept.u.l, all.u.l->v[i]);
	}
	return kept.u.l;
}

/* A recursive loop's loop is also callable: loop(items) runs the loop
 * again one level deeper (jx_loop_again), kept as a hidden "__call__"
 * entry naming the for statement and its scope. */
static void set_recursion(struct jctx *c, struct jdict *loop, const struct jnode *s,
			  struct jscope *sc, int depth)
{
	struct jmacro *m = jx_alloc(c, sizeof(*m));
	struct jv v = { .k = JK_MACRO };

	m->n = s;
	m->sc = sc;
	m->caller = jv_int(depth + 1);
	v.u.mac = m;
	jd_set(c, loop, jv_cstr("__call__"), v);
}

static void run_loop(struct jctx *c, const struct jnode *s, struct jscope *sc, struct jv iterable,
		     int depth)
{
	struct jlist *items = loop_items(c, s, sc, jv_iter(c, iterable));
	struct jscope *ls;
	struct jv loop;

	if (!items->n) {
		if (s->d)
			jx_run(c, s->d, sc);
		return;
	}
	ls = new_scope(c, sc);
	loop = jv_dict(c);
	set_var(c, ls, "loop", loop);
	if (s->neg)
		set_recursion(c, loop.u.d, s, sc, depth);
	for (size_t i = 0; i < items->n; i++) {
		jx_step(c, 1);
		/* each turn starts afresh: what the body set last turn is gone */
		ls->vars.n = 0;
		set_var(c, ls, "loop", loop);
		assign(c, s->a, items->v[i], ls);
		set_loop(c, loop.u.d, items, i, depth);
		jx_run(c, s->c, ls);
		if (c->ctl == 1) {
			c->ctl = 0;
			break;
		}
		c->ctl = 0;
	}
}

static void run_for(struct jctx *c, const struct jnode *s, struct jscope *sc)
{
	run_loop(c, s, sc, jx_eval(c, s->b, sc), 0);
}

struct jv jx_loop_again(struct jctx *c, const struct jmacro *m, struct jv items)
{
	struct jbuf buf = { 0 }, *saved = c->out;
	int saved_ctl = c->ctl;

	if (++c->depth > c->o->max_depth)
		jx_fail(c, "line %d: recursive loop deeper than %d", c->line, c->o->max_depth);
	c->out = &buf;
	c->ctl = 0;
	run_loop(c, m->n, m->sc, items, (int)m->caller.u.i);
	c->out = saved;
	c->ctl = saved_ctl;
	c->depth--;
	return jb_str(&buf);
}

static void run_macro_def(struct jctx *c, const struct jnode *s, struct jscope *sc)
{
	struct jmacro *m = jx_alloc(c, sizeof(*m));
	struct jv v;

	m->n = s;
	m->sc = sc;
	m->caller = jv_undef("caller");
	v.k = JK_MACRO;
	v.fl = 0;
	v.u.mac = m;
	set_var(c, sc, s->name, v);
}

/* {% call m(args) %}body{% endcall %}: m's caller() renders the body. */
static void run_call_block(struct jctx *c, const struct jnode *s, struct jscope *sc)
{
	struct jv f = jx_eval(c, s->a->a, sc), caller;
	struct jmacro *body = jx_alloc(c, sizeof(*body)), *m;
	struct jnode *def = jx_alloc(c, sizeof(*def));
	struct args a;

	if (f.k != JK_MACRO)
		jx_fail(c, "line %d: {%% call %%} of %s, not a macro", s->line, jv_type(f));
	def->kind = JN_MACRO;
	def->name = "caller";
	def->c = s->c;
	def->kids = s->kids; /* its parameters */
	def->n = s->n;
	body->n = def;
	body->sc = sc;
	body->caller = jv_undef("caller");
	caller.k = JK_MACRO;
	caller.fl = 0;
	caller.u.mac = body;
	m = jx_alloc(c, sizeof(*m));
	*m = *f.u.mac;
	m->caller = caller;
	f.u.mac = m;
	eval_args(c, s->a, sc, &a);
	jv_print(c, c->out, jx_call_macro(c, f, a.pos, a.npos, a.kwn, a.kwv, a.nkw));
}

/* the values are computed outside, then bound in the with's own scope */
static void run_with(struct jctx *c, const struct jnode *s, struct jscope *sc)
{
	struct jscope *ws = new_scope(c, sc);
	struct jv *vals = jx_alloc_array(c, s->n + 1, sizeof(*vals));

	for (size_t i = 0; i < s->n; i++)
		vals[i] = jx_eval(c, s->kids[i]->a, sc);
	for (size_t i = 0; i < s->n; i++)
		set_var(c, ws, s->kids[i]->name, vals[i]);
	jx_run(c, s->c, ws);
}

static void run_stmt(struct jctx *c, const struct jnode *s, struct jscope *sc)
{
	struct jv v;

	jx_step(c, 1);
	c->line = s->line;
	switch (s->kind) {
	case JN_TEXT:
		jb_put(c, c->out, s->lit.u.s.p, s->lit.u.s.n, NULL);
		break;
	case JN_OUT:
		jv_print(c, c->out, jx_eval(c, s->a, sc));
		break;
	case JN_IF:
		if (jv_truthy(jx_eval(c, s->a, sc)))
			jx_run(c, s->c, sc);
		else if (s->d)
			s->d->kind == JN_IF ? run_stmt(c, s->d, sc) : jx_run(c, s->d, sc);
		break;
	case JN_FOR:
		run_for(c, s, sc);
		break;
	case JN_SET:
		assign(c, s->a, jx_eval(c, s->b, sc), sc);
		break;
	case JN_SETBLOCK:
		v = capture(c, s->c, sc);
		assign(c, s->a, apply_filters(c, s->b, sc, v), sc);
		break;
	case JN_MACRO:
		run_macro_def(c, s, sc);
		break;
	case JN_FILTERBLOCK:
		v = capture(c, s->c, sc);
		jv_print(c, c->out, apply_filters(c, s->b, sc, v));
		break;
	case JN_CALLBLOCK:
		run_call_block(c, s, sc);
		break;
	case JN_BREAK:
		c->ctl = 1;
		break;
	case JN_CONTINUE:
		c->ctl = 2;
		break;
	case JN_BODY:
		jx_run(c, s, sc);
		break;
	case JN_WITH:
		run_with(c, s, sc);
		break;
	}
}

void jx_run(struct jctx *c, const struct jnode *body, struct jscope *sc)
{
	for (size_t i = 0; i < body->n && !c->ctl; i++)
		run_stmt(c, body->kids[i], sc);
}

static struct jv find_kw(const char *name, const char *const *kwn, const struct jv *kwv,
			 size_t nkw, bool *found)
{
	for (size_t i = 0; i < nkw; i++)
		if (!strcmp(kwn[i], name)) {
			*found = true;
			return kwv[i];
		}
	*found = false;
	return jv_none();
}

struct jv jx_call_macro(struct jctx *c, struct jv mac, const struct jv *args, size_t nargs,
			const char *const *kwn, const struct jv *kwv, size_t nkw)
{
	const struct jmacro *m = mac.u.mac;
	const struct jnode *def = m->n;
	struct jscope *ms = new_scope(c, m->sc);
	struct jv out, varargs = jv_list(c, 0);
	int saved_ctl = c->ctl;

	if (++c->depth > c->o->max_depth)
		jx_fail(c, "line %d: macro calls nested deeper than %d", c->line, c->o->max_depth);
	/* every parameter is bound (undefined) before the defaults run, so a
	 * default sees the parameters before it and not the names outside */
	for (size_t i = 0; i < def->n; i++)
		set_var(c, ms, def->kids[i]->name, jv_undef(def->kids[i]->name));
	for (size_t i = 0; i < def->n; i++) {
		const struct jnode *p = def->kids[i];
		bool found;
		struct jv v = find_kw(p->name, kwn, kwv, nkw, &found);

		if (!found)
			v = i < nargs ? args[i] : p->a ? jx_eval(c, p->a, ms) : jv_undef(p->name);
		set_var(c, ms, p->name, v);
	}
	for (size_t i = def->n; i < nargs; i++)
		jl_push(c, varargs.u.l, args[i]);
	varargs.fl |= JF_TUPLE;
	set_var(c, ms, "varargs", varargs);
	if (m->caller.k == JK_MACRO)
		set_var(c, ms, "caller", m->caller);
	c->ctl = 0;
	out = capture(c, def->c, ms);
	c->ctl = saved_ctl;
	c->depth--;
	out.fl |= JF_SAFE;
	return out;
}
