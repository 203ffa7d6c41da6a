/* Jinja lexer and parser: template text to a tree of struct jnode.
 *
 * The lexer applies the whitespace rules first ({%- -%} {{- -}} strip
 * whitespace; trim_blocks drops the newline after a block or comment tag;
 * lstrip_blocks drops the blanks before one on its own line; one newline
 * at the end of the template is dropped), so the parser only sees text,
 * tag delimiters and expression tokens.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_impl.h"

enum { T_EOF, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };

struct jtok {
	int t, line;
	const char *p; /* T_NAME, T_OP: the text; T_STR / T_TEXT: the value */
	size_t n;
	struct jv v;	/* T_INT, T_FLOAT, T_STR, T_TEXT */
};

struct lexer {
	struct jctx *c;
	const char *s;
	size_t n, i;
	int line;
	struct jtok *tok;
	size_t ntok, cap;
};

struct parser {
	struct jctx *c;
	struct jtok *tok;
	size_t i, ntok;
	int depth;
};

static void add_tok(struct lexer *lx, int t, const char *p, size_t n, struct jv v)
{
	if (lx->ntok == lx->cap) {
		size_t cap = lx->cap ? lx->cap * 2 : 256;
		struct jtok *nt = jx_alloc_array(lx->c, cap, sizeof(*nt));

		if (lx->ntok)
			memcpy(nt, lx->tok, lx->ntok * sizeof(*nt));
		lx->tok = nt;
		lx->cap = cap;
	}
	lx->tok[lx->ntok++] = (struct jtok){ .t = t, .line = lx->line, .p = p, .n = n, .v = v };
}

static int count_lines(const char *p, size_t n)
{
	int k = 0;

	for (size_t i = 0; i < n; i++)
		k += p[i] == '\n';
	return k;
}

static bool is_blank(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\f' || ch == '\v';
}

static bool is_space(char ch)
{
	return is_blank(ch) || ch == '\n';
}

/* Appends the UTF-8 encoding of code point U. */
static size_t put_utf8(char *o, uint32_t u)
{
	if (u < 0x80) {
		o[0] = (char)u;
		return 1;
	}
	if (u < 0x800) {
		o[0] = (char)(0xc0 | u >> 6);
		o[1] = (char)(0x80 | (u & 0x3f));
		return 2;
	}
	if (u < 0x10000) {
		o[0] = (char)(0xe0 | u >> 12);
		o[1] = (char)(0x80 | (u >> 6 & 0x3f));
		o[2] = (char)(0x80 | (u & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | u >> 18);
	o[1] = (char)(0x80 | (u >> 12 & 0x3f));
	o[2] = (char)(0x80 | (u >> 6 & 0x3f));
	o[3] = (char)(0x80 | (u & 0x3f));
	return 4;
}

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* A \x \u \U escape of WIDTH hex digits at P; -1 if malformed. */
static int64_t hex_escape(const char *p, const char *end, int width)
{
	int64_t u = 0;

	if (end - p < width)
		return -1;
	for (int i = 0; i < width; i++) {
		int h = hexval(p[i]);

		if (h < 0)
			return -1;
		u = u * 16 + h;
	}
	return u;
}

/* A string literal's value, with Python's escapes. */
static struct jv unescape(struct lexer *lx, const char *p, size_t n)
{
	char *o = jx_alloc(lx->c, n + 1);
	const char *end = p + n;
	size_t k = 0;

	while (p < end) {
		if (*p != '\\' || p + 1 == end) {
			o[k++] = *p++;
			continue;
		}
		char e = p[1];
		int w = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
		const char *simple = strchr("nrtabfv0\\'\"\n", e);

		if (w) {
			int64_t u = hex_escape(p + 2, end, w);

			if (u < 0 || u > 0x10ffff)
				jx_fail(lx->c, "line %d: bad \\%c escape in a string", lx->line, e);
			k += put_utf8(o + k, (uint32_t)u); /* at most 4 bytes for 4+ source bytes */
			p += 2 + w;
		} else if (e && simple) {
			static const char from[] = "nrtabfv0\\'\"";
			static const char to[] = "\n\r\t\a\b\f\v\0\\'\"";

			if (e != '\n')
				o[k++] = to[strchr(from, e) - from];
			p += 2;
		} else {
			o[k++] = *p++;
		}
	}
	o[k] = 0;
	return jv_str(o, k);
}

static void lex_string(struct lexer *lx)
{
	char q = lx->s[lx->i];
	size_t start = ++lx->i;

	while (lx->i < lx->n && lx->s[lx->i] != q) {
		if (lx->s[lx->i] == '\\' && lx->i + 1 < lx->n)
			lx->i++;
		lx->i++;
	}
	if (lx->i >= lx->n)
		jx_fail(lx->c, "line %d: unterminated string", lx->line);
	add_tok(lx, T_STR, NULL, 0, unescape(lx, lx->s + start, lx->i - start));
	lx->line += count_lines(lx->s + start, lx->i - start);
	lx->i++;
}

static void lex_number(struct lexer *lx)
{
	const char *s = lx->s;
	size_t st = lx->i, i = lx->i;
	bool fl = false;
	char buf[64];
	size_t k = 0;

	while (i < lx->n && (isdigit((unsigned char)s[i]) || s[i] == '_'))
		i++;
	if (i + 1 < lx->n && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
		fl = true;
		for (i++; i < lx->n && (isdigit((unsigned char)s[i]) || s[i] == '_'); i++)
			;
	}
	if (i < lx->n && (s[i] == 'e' || s[i] == 'E')) {
		size_t j = i + 1;

		if (j < lx->n && (s[j] == '+' || s[j] == '-'))
			j++;
		if (j < lx->n && isdigit((unsigned char)s[j])) {
			fl = true;
			for (i = j; i < lx->n && isdigit((unsigned char)s[i]); i++)
				;
		}
	}
	for (size_t j = st; j < i && k + 1 < sizeof(buf); j++)
		if (s[j] != '_')
			buf[k++] = s[j];
	buf[k] = 0;
	if (i - st >= sizeof(buf))
		jx_fail(lx->c, "line %d: number too long", lx->line);
	lx->i = i;
	if (fl) {
		add_tok(lx, T_FLOAT, NULL, 0, jv_float(strtod(buf, NULL)));
		return;
	}
	unsigned long long u = strtoull(buf, NULL, 10);

	if (u > INT64_MAX)
		jx_fail(lx->c, "line %d: integer %s too large", lx->line, buf);
	add_tok(lx, T_INT, NULL, 0, jv_int((int64_t)u));
}

static const char *const ops[] = { "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/",
				   "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}",
				   ",", ".", ":", "|", NULL };

/* Lexes a tag's inside up to its end delimiter (END: "}}" or "%}");
 * returns the sign before it ('-', '+' or 0). */
static char lex_tag(struct lexer *lx, const char *end)
{
	int braces = 0;

	for (;;) {
		const char *s = lx->s + lx->i;
		size_t left = lx->n - lx->i;

		if (!left)
			jx_fail(lx->c, "line %d: missing '%s'", lx->line, end);
		if (*s == '\n')
			lx->line++;
		if (is_space(*s)) {
			lx->i++;
			continue;
		}
		if (braces <= 0 && (*s == '-' || *s == '+') && left >= 3 && !memcmp(s + 1, end, 2)) {
			lx->i += 3;
			return *s;
		}
		if (braces <= 0 && left >= 2 && !memcmp(s, end, 2)) {
			lx->i += 2;
			return 0;
		}
		if (*s == '\'' || *s == '"') {
			lex_string(lx);
		} else if (isdigit((unsigned char)*s)) {
			lex_number(lx);
		} else if (isalpha((unsigned char)*s) || *s == '_') {
			size_t j = 1;

			while (j < left && (isalnum((unsigned char)s[j]) || s[j] == '_'))
				j++;
			add_tok(lx, T_NAME, s, j, jv_none());
			lx->i += j;
		} else {
			int k;

			for (k = 0; ops[k]; k++)
				if (!strncmp(s, ops[k], strlen(ops[k])))
					break;
			if (!ops[k])
				jx_fail(lx->c, "line %d: unexpected character '%c'", lx->line, *s);
			braces += (*s == '{' || *s == '(' || *s == '[') - (*s == '}' || *s == ')' || *s == ']');
			add_tok(lx, T_OP, ops[k], strlen(ops[k]), jv_none());
			lx->i += strlen(ops[k]);
		}
	}
}

/* After a tag: "-" strips all whitespace; a block or comment tag (TRIM)
 * drops one newline unless "+" said not to. Returns whether what it
 * consumed ended a line (jinja2's line_starting). */
static bool after_tag(struct lexer *lx, char sign, bool trim)
{
	bool nl = false;

	if (sign == '-') {
		while (lx->i < lx->n && is_space(lx->s[lx->i])) {
			nl = lx->s[lx->i] == '\n';
			lx->line += nl;
			lx->i++;
		}
		return nl;
	}
	if (trim && sign != '+' && lx->i < lx->n && lx->s[lx->i] == '\n') {
		lx->i++;
		lx->line++;
		return true;
	}
	return false;
}

/* The text before a tag, less what the tag's whitespace control strips. */
static void lex_text(struct lexer *lx, const char *p, size_t n, char kind, char sign,
		     bool line_starting)
{
	if (sign == '-') {
		while (n && is_space(p[n - 1]))
			n--;
	} else if (sign != '+' && kind != '{') {
		size_t l = n;

		while (l && p[l - 1] != '\n')
			l--;
		if (l > 0 || line_starting) {
			size_t j = l;

			while (j < n && is_blank(p[j]))
				j++;
			if (j == n)
				n = l;
		}
	}
	if (n) {
		char *t = jx_strdup(lx->c, p, n);

		add_tok(lx, T_TEXT, NULL, 0, jv_str(t, n));
	}
}

static const char *find_tag(const char *s, size_t n)
{
	for (const char *p = s; (p = memchr(p, '{', (size_t)(s + n - p))) && p + 1 < s + n; p++)
		if (p[1] == '{' || p[1] == '%' || p[1] == '#')
			return p;
	return NULL;
}

static void lex_comment(struct lexer *lx)
{
	const char *s = lx->s + lx->i;
	const char *e = NULL;

	for (const char *p = s; p + 1 < lx->s + lx->n; p++)
		if (p[0] == '#' && p[1] == '}') {
			e = p;
			break;
		}
	if (!e)
		jx_fail(lx->c, "line %d: unterminated comment", lx->line);
	lx->line += count_lines(s, (size_t)(e - s));
	lx->i = (size_t)(e + 2 - lx->s);
}

/* Whether the tokens just lexed are {% raw %}. */
static bool is_raw_tag(struct lexer *lx)
{
	const struct jtok *t;

	if (lx->ntok < 3)
		return false;
	t = lx->tok + lx->ntok - 3;
	return t[0].t == T_BBEGIN && t[1].t == T_NAME && t[1].n == 3 &&
	       !memcmp(t[1].p, "raw", 3) && t[2].t == T_BEND;
}

/* The text up to {% endraw %}, as it is (whitespace control still applies
 * around the tags); replaces the {% raw %} tokens. Returns line_starting. */
static bool lex_raw(struct lexer *lx, bool line_starting)
{
	const char *s = lx->s + lx->i, *end = lx->s + lx->n;

	lx->ntok -= 3;
	for (const char *p = s; (p = find_tag(p, (size_t)(end - p))); p++) {
		const char *q = p + 2;
		char sign = q < end && (*q == '-' || *q == '+') ? *q : 0, esign = 0;

		if (p[1] != '%')
			continue;
		q += sign != 0;
		while (q < end && is_space(*q))
			q++;
		if (end - q < 6 || memcmp(q, "endraw", 6))
			continue;
		for (q += 6; q < end && is_space(*q); q++)
			;
		if (q < end && (*q == '-' || *q == '+'))
			esign = *q++;
		if (end - q < 2 || memcmp(q, "%}", 2))
			continue;
		lex_text(lx, s, (size_t)(p - s), '%', sign, line_starting);
		lx->line += count_lines(s, (size_t)(q + 2 - s));
		lx->i = (size_t)(q + 2 - lx->s);
		return after_tag(lx, esign, true);
	}
	jx_fail(lx->c, "line %d: missing {%% endraw %%}", lx->line);
}

static void lex(struct lexer *lx)
{
	bool line_starting = true;

	while (lx->i < lx->n) {
		const char *s = lx->s + lx->i;
		const char *t = find_tag(s, lx->n - lx->i);

		if (!t) {
			lex_text(lx, s, lx->n - lx->i, 0, '+', false);
			break;
		}
		char kind = t[1];
		char sign = t + 2 < lx->s + lx->n && (t[2] == '-' || t[2] == '+') ? t[2] : 0;

		lex_text(lx, s, (size_t)(t - s), kind, sign, line_starting);
		lx->line += count_lines(s, (size_t)(t - s));
		lx->i = (size_t)(t - lx->s) + 2 + (sign != 0);
		if (kind == '#') {
			lex_comment(lx);
			char esign = lx->s[lx->i - 3] == '-' ? '-' : lx->s[lx->i - 3] == '+' ? '+' : 0;

			line_starting = after_tag(lx, esign, true);
			continue;
		}
		add_tok(lx, kind == '{' ? T_VBEGIN : T_BBEGIN, NULL, 0, jv_none());
		char esign = lex_tag(lx, kind == '{' ? "}}" : "%}");

		add_tok(lx, kind == '{' ? T_VEND : T_BEND, NULL, 0, jv_none());
		/* jinja2 keeps the newline after {% raw %} (no trim_blocks there) */
		bool raw = kind == '%' && is_raw_tag(lx);

		line_starting = after_tag(lx, esign, kind == '%' && !raw);
		if (raw)
			line_starting = lex_raw(lx, line_starting);
	}
	add_tok(lx, T_EOF, NULL, 0, jv_none());
}

/* ---- parser ---- */

static struct jtok *peek(struct parser *p)
{
	return &p->tok[p->i];
}

static struct jtok *next(struct parser *p)
{
	struct jtok *t = &p->tok[p->i];

	if (t->t != T_EOF)
		p->i++;
	return t;
}

static bool is_op(const struct jtok *t, const char *op)
{
	return t->t == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}

static bool is_name(const struct jtok *t, const char *name)
{
	return t->t == T_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}

static const char *tok_desc(struct parser *p, const struct jtok *t)
{
	static const char *const kinds[] = { "end of template", "text", "'{{'", "'}}'", "'{%'",
					     "'%}'", "name", "string", "integer", "float", "operator" };

	if (t->t == T_NAME || t->t == T_OP) {
		char *s = jx_alloc(p->c, t->n + 3);

		s[0] = '\'';
		memcpy(s + 1, t->p, t->n);
		s[t->n + 1] = '\'';
		s[t->n + 2] = 0;
		return s;
	}
	return kinds[t->t];
}

static _Noreturn void unexpected(struct parser *p, const char *want)
{
	struct jtok *t = peek(p);

	jx_fail(p->c, "line %d: expected %s, got %s", t->line, want, tok_desc(p, t));
}

static void expect_op(struct parser *p, const char *op)
{
	if (!is_op(peek(p), op)) {
		char want[16];

		snprintf(want, sizeof(want), "'%s'", op);
		unexpected(p, want);
	}
	next(p);
}

static const char *expect_name(struct parser *p)
{
	struct jtok *t = peek(p);

	if (t->t != T_NAME)
		unexpected(p, "a name");
	next(p);
	return jx_strdup(p->c, t->p, t->n);
}

static void expect(struct parser *p, int type, const char *want)
{
	if (peek(p)->t != type)
		unexpected(p, want);
	next(p);
}

static struct jnode *node(struct parser *p, int kind)
{
	struct jnode *n = jx_alloc(p->c, sizeof(*n));

	n->kind = (uint8_t)kind;
	n->line = peek(p)->line;
	return n;
}

/* A growing list of nodes (kids). */
static void add_kid(struct parser *p, struct jnode *n, struct jnode *kid, size_t *cap)
{
	if (n->n == *cap) {
		size_t nc = *cap ? *cap * 2 : 4;
		struct jnode **k = jx_alloc_array(p->c, nc, sizeof(*k));

		if (n->n)
			memcpy(k, n->kids, n->n * sizeof(*k));
		n->kids = k;
		*cap = nc;
	}
	n->kids[n->n++] = kid;
}

static void enter(struct parser *p)
{
	if (++p->depth > p->c->o->max_depth)
		jx_fail(p->c, "line %d: nesting deeper than %d", peek(p)->line, p->c->o->max_depth);
}

static struct jnode *parse_expr(struct parser *p);
static struct jnode *parse_or(struct parser *p);
static struct jnode *parse_unary(struct parser *p, bool with_filter);

/* ( args ) after the '(': positional and name=value arguments */
static void parse_args(struct parser *p, struct jnode *n)
{
	size_t cap = 0;

	while (!is_op(peek(p), ")")) {
		if (n->n)
			expect_op(p, ",");
		if (is_op(peek(p), ")"))
			break;
		if (peek(p)->t == T_NAME && is_op(&p->tok[p->i + 1], "=")) {
			struct jnode *kw = node(p, JN_KWARG);

			kw->name = expect_name(p);
			next(p);
			kw->a = parse_expr(p);
			add_kid(p, n, kw, &cap);
		} else {
			add_kid(p, n, parse_expr(p), &cap);
		}
	}
	next(p);
}

static struct jnode *parse_list(struct parser *p, const char *close, int kind)
{
	struct jnode *n = node(p, kind);
	size_t cap = 0;

	while (!is_op(peek(p), close)) {
		if (n->n)
			expect_op(p, ",");
		if (is_op(peek(p), close))
			break;
		add_kid(p, n, parse_expr(p), &cap);
	}
	next(p);
	return n;
}

static struct jnode *parse_dict(struct parser *p)
{
	struct jnode *n = node(p, JN_DICT);
	size_t cap = 0;

	while (!is_op(peek(p), "}")) {
		if (n->n)
			expect_op(p, ",");
		if (is_op(peek(p), "}"))
			break;
		add_kid(p, n, parse_expr(p), &cap);
		expect_op(p, ":");
		add_kid(p, n, parse_expr(p), &cap);
	}
	next(p);
	return n;
}

static struct jnode *parse_paren(struct parser *p)
{
	struct jnode *e, *t;
	size_t cap = 0;

	if (is_op(peek(p), ")")) {
		next(p);
		return node(p, JN_TUPLE);
	}
	e = parse_expr(p);
	if (is_op(peek(p), ")")) {
		next(p);
		return e;
	}
	t = node(p, JN_TUPLE);
	add_kid(p, t, e, &cap);
	while (is_op(peek(p), ",")) {
		next(p);
		if (is_op(peek(p), ")"))
			break;
		add_kid(p, t, parse_expr(p), &cap);
	}
	expect_op(p, ")");
	return t;
}

static struct jnode *parse_primary(struct parser *p)
{
	struct jtok *t = peek(p);
	struct jnode *n;

	if (t->t == T_STR) {
		n = node(p, JN_LIT);
		n->lit = t->v;
		next(p);
		/* adjacent literals concatenate: "a" "b" */
		while (peek(p)->t == T_STR) {
			struct jv a = n->lit, b = next(p)->v;
			char *s = jx_alloc(p->c, a.u.s.n + b.u.s.n + 1);

			memcpy(s, a.u.s.p, a.u.s.n);
			memcpy(s + a.u.s.n, b.u.s.p, b.u.s.n);
			n->lit = jv_str(s, a.u.s.n + b.u.s.n);
		}
		return n;
	}
	if (t->t == T_INT || t->t == T_FLOAT) {
		n = node(p, JN_LIT);
		n->lit = next(p)->v;
		return n;
	}
	if (t->t == T_NAME) {
		n = node(p, JN_LIT);
		if (is_name(t, "true") || is_name(t, "True"))
			n->lit = jv_bool(true);
		else if (is_name(t, "false") || is_name(t, "False"))
			n->lit = jv_bool(false);
		else if (is_name(t, "none") || is_name(t, "None"))
			n->lit = jv_none();
		else {
			n->kind = JN_NAME;
			n->name = jx_strdup(p->c, t->p, t->n);
		}
		next(p);
		return n;
	}
	if (is_op(t, "(")) {
		next(p);
		return parse_paren(p);
	}
	if (is_op(t, "[")) {
		next(p);
		return parse_list(p, "]", JN_LIST);
	}
	if (is_op(t, "{")) {
		next(p);
		return parse_dict(p);
	}
	unexpected(p, "an expression");
}

/* [ ... ] after the '[': an index or a slice */
static struct jnode *parse_subscript(struct parser *p, struct jnode *obj)
{
	struct jnode *n = node(p, JN_ITEM), *parts[3] = { NULL, NULL, NULL };
	int k = 0;

	n->a = obj;
	if (is_op(peek(p), "]"))
		unexpected(p, "an index");
	for (;;) {
		if (!is_op(peek(p), ":") && !is_op(peek(p), "]"))
			parts[k] = parse_expr(p);
		if (is_op(peek(p), "]"))
			break;
		expect_op(p, ":");
		if (++k > 2)
			unexpected(p, "']'");
		n->kind = JN_SLICE;
	}
	next(p);
	n->b = parts[0];
	n->c = parts[1];
	n->d = parts[2];
	return n;
}

static struct jnode *parse_postfix(struct parser *p, struct jnode *e)
{
	for (;;) {
		struct jtok *t = peek(p);
		struct jnode *n;

		if (is_op(t, ".")) {
			next(p);
			n = node(p, JN_ATTR);
			n->a = e;
			if (peek(p)->t == T_INT) { /* x.0 is x[0] */
				n->kind = JN_ITEM;
				n->b = node(p, JN_LIT);
				n->b->lit = next(p)->v;
			} else {
				n->name = expect_name(p);
			}
		} else if (is_op(t, "[")) {
			next(p);
			n = parse_subscript(p, e);
		} else if (is_op(t, "(")) {
			next(p);
			n = node(p, JN_CALL);
			n->a = e;
			parse_args(p, n);
		} else {
			return e;
		}
		e = n;
	}
}

static bool starts_primary(const struct jtok *t)
{
	static const char *const stop[] = { "and", "or", "else", "if", "in", "is", "not", NULL };

	if (t->t == T_STR || t->t == T_INT || t->t == T_FLOAT)
		return true;
	if (t->t == T_NAME) {
		for (int i = 0; stop[i]; i++)
			if (is_name(t, stop[i]))
				return false;
		return true;
	}
	return is_op(t, "[") || is_op(t, "{");
}

static struct jnode *parse_filter(struct parser *p, struct jnode *e, int kind)
{
	struct jnode *n = node(p, kind);
	const char *name = expect_name(p);

	/* dotted names are allowed in jinja2; keep the last part */
	while (is_op(peek(p), ".")) {
		next(p);
		name = expect_name(p);
	}
	n->name = name;
	n->a = e;
	if (is_op(peek(p), "(")) {
		next(p);
		parse_args(p, n);
	} else if (kind == JN_TEST && starts_primary(peek(p))) {
		size_t cap = 0;

		add_kid(p, n, parse_unary(p, false), &cap);
	}
	return n;
}

/* | f | g(args) after a block's {% filter %} or {% set x | f %}: filters
 * only, applied to the block's text (the innermost operand is NULL) */
static struct jnode *parse_block_filters(struct parser *p)
{
	struct jnode *e = parse_filter(p, NULL, JN_FILTER);

	while (is_op(peek(p), "|")) {
		next(p);
		e = parse_filter(p, e, JN_FILTER);
	}
	return e;
}

static struct jnode *parse_filters(struct parser *p, struct jnode *e)
{
	for (;;) {
		if (is_op(peek(p), "|")) {
			next(p);
			e = parse_filter(p, e, JN_FILTER);
		} else if (is_name(peek(p), "is")) {
			next(p);
			bool neg = is_name(peek(p), "not");

			if (neg)
				next(p);
			e = parse_filter(p, e, JN_TEST);
			e->neg = neg;
		} else if (is_op(peek(p), "(")) {
			struct jnode *n = node(p, JN_CALL);

			next(p);
			n->a = e;
			parse_args(p, n);
			e = n;
		} else {
			return e;
		}
	}
}

static struct jnode *parse_unary(struct parser *p, bool with_filter)
{
	struct jnode *n;

	enter(p);
	if (is_op(peek(p), "-") || is_op(peek(p), "+")) {
		n = node(p, is_op(peek(p), "-") ? JN_NEG : JN_POS);
		next(p);
		n->a = parse_unary(p, false);
	} else {
		n = parse_postfix(p, parse_primary(p));
	}
	if (with_filter)
		n = parse_filters(p, n);
	p->depth--;
	return n;
}

static struct jnode *binary(struct parser *p, int kind, int op, struct jnode *a, struct jnode *b)
{
	struct jnode *n = node(p, kind);

	n->op = op;
	n->a = a;
	n->b = b;
	return n;
}

static struct jnode *parse_pow(struct parser *p)
{
	struct jnode *e = parse_unary(p, true);

	while (is_op(peek(p), "**")) {
		next(p);
		e = binary(p, JN_BIN, JT_POW, e, parse_unary(p, true));
	}
	return e;
}

static struct jnode *parse_math2(struct parser *p)
{
	struct jnode *e = parse_pow(p);

	for (;;) {
		struct jtok *t = peek(p);
		int op = is_op(t, "*") ? JT_MUL : is_op(t, "/") ? JT_DIV :
			 is_op(t, "//") ? JT_FLOORDIV : is_op(t, "%") ? JT_MOD : 0;

		if (!op)
			return e;
		next(p);
		e = binary(p, JN_BIN, op, e, parse_pow(p));
	}
}

static struct jnode *parse_concat(struct parser *p)
{
	struct jnode *e = parse_math2(p);

	while (is_op(peek(p), "~")) {
		next(p);
		e = binary(p, JN_CONCAT, 0, e, parse_math2(p));
	}
	return e;
}

static struct jnode *parse_math1(struct parser *p)
{
	struct jnode *e = parse_concat(p);

	for (;;) {
		struct jtok *t = peek(p);
		int op = is_op(t, "+") ? JT_ADD : is_op(t, "-") ? JT_SUB : 0;

		if (!op)
			return e;
		next(p);
		e = binary(p, JN_BIN, op, e, parse_concat(p));
	}
}

static int cmp_op(const struct jtok *t)
{
	static const char *const names[] = { "==", "!=", "<", ">", "<=", ">=", NULL };
	static const int codes[] = { JT_EQ, JT_NE, JT_LT, JT_GT, JT_LE, JT_GE };

	for (int i = 0; names[i]; i++)
		if (is_op(t, names[i]))
			return codes[i];
	return 0;
}

/* a < b < c compares pairwise, as Python does: JN_CMP nodes joined by and */
static struct jnode *parse_compare(struct parser *p)
{
	struct jnode *e = parse_math1(p), *res = NULL, *left = e;

	for (;;) {
		struct jtok *t = peek(p);
		int op = cmp_op(t);
		bool neg = false;

		if (!op && is_name(t, "in"))
			op = JT_IN;
		else if (!op && is_name(t, "not") && is_name(&p->tok[p->i + 1], "in")) {
			op = JT_IN;
			neg = true;
			next(p);
		}
		if (!op)
			return res ? res : e;
		next(p);
		struct jnode *right = parse_math1(p);
		struct jnode *c = binary(p, JN_CMP, op, left, right);

		c->neg = neg;
		res = res ? binary(p, JN_AND, 0, res, c) : c;
		left = right;
	}
}

static struct jnode *parse_not(struct parser *p)
{
	if (is_name(peek(p), "not")) {
		struct jnode *n = node(p, JN_NOT);

		next(p);
		enter(p);
		n->a = parse_not(p);
		p->depth--;
		return n;
	}
	return parse_compare(p);
}

static struct jnode *parse_and(struct parser *p)
{
	struct jnode *e = parse_not(p);

	while (is_name(peek(p), "and")) {
		next(p);
		e = binary(p, JN_AND, 0, e, parse_not(p));
	}
	return e;
}

static struct jnode *parse_or(struct parser *p)
{
	struct jnode *e = parse_and(p);

	while (is_name(peek(p), "or")) {
		next(p);
		e = binary(p, JN_OR, 0, e, parse_and(p));
	}
	return e;
}

/* a if cond else b; without else the value is undefined when cond fails */
static struct jnode *parse_expr(struct parser *p)
{
	struct jnode *e;

	enter(p);
	e = parse_or(p);
	while (is_name(peek(p), "if")) {
		struct jnode *n = node(p, JN_COND);

		next(p);
		n->a = parse_or(p);
		n->b = e;
		if (is_name(peek(p), "else")) {
			next(p);
			n->c = parse_expr(p);
		}
		e = n;
	}
	p->depth--;
	return e;
}

/* ---- statements ---- */

static struct jnode *parse_body(struct parser *p, const char *const *ends);

/* name, ns.attr, or names separated by commas (optionally in parens) */
static struct jnode *parse_target(struct parser *p, bool allow_attr)
{
	struct jnode *t = node(p, JN_TUPLE);
	bool paren = is_op(peek(p), "(");
	size_t cap = 0;

	if (paren)
		next(p);
	do {
		struct jnode *n = node(p, JN_NAME);

		if (t->n)
			next(p);
		n->name = expect_name(p);
		if (allow_attr && is_op(peek(p), ".")) {
			struct jnode *a = node(p, JN_ATTR);

			next(p);
			a->a = n;
			a->name = expect_name(p);
			n = a;
		}
		add_kid(p, t, n, &cap);
	} while (is_op(peek(p), ","));
	if (paren)
		expect_op(p, ")");
	return t->n == 1 && !paren ? t->kids[0] : t;
}

static bool at_tag(struct parser *p, const char *name)
{
	return peek(p)->t == T_BBEGIN && is_name(&p->tok[p->i + 1], name);
}

static void end_tag(struct parser *p)
{
	expect(p, T_BEND, "'%}'");
}

static struct jnode *parse_if(struct parser *p)
{
	static const char *const ends[] = { "elif", "else", "endif", NULL };
	struct jnode *n = node(p, JN_IF);

	n->a = parse_expr(p);
	end_tag(p);
	n->c = parse_body(p, ends);
	next(p); /* {% */
	if (is_name(peek(p), "elif")) {
		next(p);
		n->d = parse_if(p);
		return n;
	}
	if (is_name(next(p), "else")) {
		static const char *const end[] = { "endif", NULL };

		end_tag(p);
		n->d = parse_body(p, end);
		next(p);
		next(p);
	}
	end_tag(p);
	return n;
}

static struct jnode *parse_for(struct parser *p)
{
	static const char *const ends[] = { "else", "endfor", NULL };
	struct jnode *n = node(p, JN_FOR);

	n->a = parse_target(p, false);
	if (!is_name(peek(p), "in"))
		unexpected(p, "'in'");
	next(p);
	n->b = parse_or(p);
	if (is_name(peek(p), "if")) {
		next(p);
		n->kids = jx_alloc(p->c, sizeof(*n->kids));
		n->kids[0] = parse_expr(p);
		n->n = 1;
	}
	if (is_name(peek(p), "recursive")) { /* loop(items) renders the body again */
		next(p);
		n->neg = 1;
	}
	end_tag(p);
	n->c = parse_body(p, ends);
	next(p);
	if (is_name(next(p), "else")) {
		static const char *const end[] = { "endfor", NULL };

		end_tag(p);
		n->d = parse_body(p, end);
		next(p);
		next(p);
	}
	end_tag(p);
	return n;
}

static struct jnode *parse_set(struct parser *p)
{
	static const char *const ends[] = { "endset", NULL };
	struct jnode *n = node(p, JN_SET);

	n->a = parse_target(p, true);
	if (is_op(peek(p), "=")) {
		next(p);
		n->b = parse_expr(p);
		if (is_op(peek(p), ",")) { /* set a, b = 1, 2 */
			struct jnode *t = node(p, JN_TUPLE);
			size_t cap = 0;

			add_kid(p, t, n->b, &cap);
			while (is_op(peek(p), ",")) {
				next(p);
				add_kid(p, t, parse_expr(p), &cap);
			}
			n->b = t;
		}
		end_tag(p);
		return n;
	}
	n->kind = JN_SETBLOCK;
	if (is_op(peek(p), "|")) { /* {% set x | filter %} */
		next(p);
		n->b = parse_block_filters(p);
	}
	end_tag(p);
	n->c = parse_body(p, ends);
	next(p);
	next(p);
	end_tag(p);
	return n;
}

/* ( name, name=default, ... ) after a macro's name or {% call %}: the
 * parameters as JN_KWARG kids */
static void parse_params(struct parser *p, struct jnode *n)
{
	size_t cap = 0;

	expect_op(p, "(");
	while (!is_op(peek(p), ")")) {
		struct jnode *arg = node(p, JN_KWARG);

		if (n->n)
			expect_op(p, ",");
		if (is_op(peek(p), ")"))
			break;
		arg->name = expect_name(p);
		if (is_op(peek(p), "=")) {
			next(p);
			arg->a = parse_expr(p);
		}
		add_kid(p, n, arg, &cap);
	}
	next(p);
}

static struct jnode *parse_macro(struct parser *p)
{
	static const char *const ends[] = { "endmacro", NULL };
	struct jnode *n = node(p, JN_MACRO);

	n->name = expect_name(p);
	parse_params(p, n);
	end_tag(p);
	n->c = parse_body(p, ends);
	next(p);
	next(p);
	end_tag(p);
	return n;
}

static struct jnode *parse_filter_block(struct parser *p)
{
	static const char *const ends[] = { "endfilter", NULL };
	struct jnode *n = node(p, JN_FILTERBLOCK);

	n->b = parse_block_filters(p);
	end_tag(p);
	n->c = parse_body(p, ends);
	next(p);
	next(p);
	end_tag(p);
	return n;
}

static struct jnode *parse_call_block(struct parser *p)
{
	static const char *const ends[] = { "endcall", NULL };
	struct jnode *n = node(p, JN_CALLBLOCK);

	if (is_op(peek(p), "(")) /* {% call(x) m() %}: caller(x) takes parameters */
		parse_params(p, n);
	n->a = parse_expr(p);
	if (n->a->kind != JN_CALL)
		jx_fail(p->c, "line %d: {%% call %%} needs a macro call", n->line);
	end_tag(p);
	n->c = parse_body(p, ends);
	next(p);
	next(p);
	end_tag(p);
	return n;
}

static struct jnode *parse_generation(struct parser *p)
{
	static const char *const ends[] = { "endgeneration", NULL };
	struct jnode *n;

	end_tag(p);
	n = parse_body(p, ends);
	next(p);
	next(p);
	end_tag(p);
	return n;
}

/* {% with a = x, b = y %}...{% endwith %}: the names in a scope of their own */
static struct jnode *parse_with(struct parser *p)
{
	static const char *const ends[] = { "endwith", NULL };
	struct jnode *n = node(p, JN_WITH);
	size_t cap = 0;

	while (peek(p)->t != T_BEND) {
		struct jnode *kw = node(p, JN_KWARG);

		if (n->n)
			expect_op(p, ",");
		kw->name = expect_name(p);
		expect_op(p, "=");
		kw->a = parse_expr(p);
		add_kid(p, n, kw, &cap);
	}
	end_tag(p);
	n->c = parse_body(p, ends);
	next(p);
	next(p);
	end_tag(p);
	return n;
}

static struct jnode *parse_stmt(struct parser *p)
{
	struct jtok *t = peek(p);
	struct jnode *n;

	if (t->t != T_NAME)
		unexpected(p, "a statement name");
	next(p);
	if (is_name(t, "if"))
		return parse_if(p);
	if (is_name(t, "for"))
		return parse_for(p);
	if (is_name(t, "set"))
		return parse_set(p);
	if (is_name(t, "macro"))
		return parse_macro(p);
	if (is_name(t, "filter"))
		return parse_filter_block(p);
	if (is_name(t, "call"))
		return parse_call_block(p);
	if (is_name(t, "generation")) /* transformers' assistant-mask tag: its body as is */
		return parse_generation(p);
	if (is_name(t, "with"))
		return parse_with(p);
	if (is_name(t, "break") || is_name(t, "continue")) {
		n = node(p, is_name(t, "break") ? JN_BREAK : JN_CONTINUE);
		end_tag(p);
		return n;
	}
	if (is_name(t, "include") || is_name(t, "import") || is_name(t, "from") ||
	    is_name(t, "extends") || is_name(t, "block"))
		jx_fail(p->c, "line %d: {%% %.*s %%} is not supported: a chat template must be self-contained (loom loads no other template)",
			t->line, (int)t->n, t->p);
	jx_fail(p->c, "line %d: unknown tag '%.*s'", t->line, (int)t->n, t->p);
}

/* Statements up to a {% tag %} named in ENDS (left unconsumed), or the
 * end of the template when ENDS is NULL. */
static struct jnode *parse_body(struct parser *p, const char *const *ends)
{
	struct jnode *body = node(p, JN_BODY);
	size_t cap = 0;

	enter(p);
	for (;;) {
		struct jtok *t = peek(p);
		struct jnode *n;

		if (t->t == T_EOF) {
			int last = 0;

			while (ends && ends[last + 1])
				last++;
			if (ends)
				jx_fail(p->c, "line %d: missing {%% %s %%}", t->line, ends[last]);
			break;
		}
		if (t->t == T_BBEGIN && ends) {
			bool end = false;

			for (int i = 0; ends[i] && !end; i++)
				end = at_tag(p, ends[i]);
			if (end)
				break;
		}
		next(p);
		if (t->t == T_TEXT) {
			n = node(p, JN_TEXT);
			n->lit = t->v;
		} else if (t->t == T_VBEGIN) {
			n = node(p, JN_OUT);
			n->line = t->line;
			n->a = parse_expr(p);
			expect(p, T_VEND, "'}}'");
		} else if (t->t == T_BBEGIN) {
			n = parse_stmt(p);
		} else {
			jx_fail(p->c, "line %d: unexpected %s", t->line, tok_desc(p, t));
		}
		add_kid(p, body, n, &cap);
	}
	p->depth--;
	return body;
}

struct jnode *jx_parse(struct jctx *c, const char *src, size_t n)
{
	struct lexer lx = { .c = c, .line = 1 };
	struct parser p = { .c = c };
	char *s = jx_alloc(c, n + 1);
	size_t k = 0;

	/* newlines to \n, as jinja2 does */
	for (size_t i = 0; i < n; i++) {
		if (src[i] == '\r') {
			s[k++] = '\n';
			if (i + 1 < n && src[i + 1] == '\n')
				i++;
		} else {
			s[k++] = src[i];
		}
	}
	if (k && s[k - 1] == '\n') /* keep_trailing_newline off */
		k--;
	lx.s = s;
	lx.n = k;
	lex(&lx);
	p.tok = lx.tok;
	p.ntok = lx.ntok;
	return parse_body(&p, NULL);
}
