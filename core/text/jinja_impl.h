/* The Jinja interpreter's insides, shared by its three files:
 * jinja_parse.c (lexer and parser), jinja_eval.c (statements and
 * expressions), jinja_lib.c (values, filters, tests and methods).
 *
 * Memory: everything of one render (tokens, tree, values, buffers) comes
 * from one arena that is freed at the end, so values are shared freely
 * and never freed one by one. Errors: jx_fail() formats the message and
 * longjmps back to jinja_render, which frees the arena; no caller checks
 * a status, and nothing outside the arena is held across a call that can
 * fail.
 */
#ifndef LOOM_JINJA_IMPL_H
#define LOOM_JINJA_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/jinja.h"

enum jk { JK_UNDEF, JK_NONE, JK_BOOL, JK_INT, JK_FLOAT, JK_STR, JK_LIST, JK_DICT,
	  JK_MACRO, JK_METHOD, JK_FUNC };

/* value flags */
#define JF_TUPLE 1	/* a list written as a tuple: printed (a, b) */
#define JF_GEN 2	/* a generator (map, select...): tojson and length refuse it */
#define JF_NS 4		/* a namespace(): a dict whose attributes can be set */
#define JF_SAFE 8	/* Markup (|safe, macro output): printed the same */
#define JF_UNSAFE 16	/* JK_METHOD: a mutating method the sandbox refuses */
#define JF_CTX 32	/* JK_STR: every byte came from the variables (else see u.s.m) */
#define JF_MSG 64	/* JK_UNDEF: u.name is the whole message, not a variable's name */

struct jv {
	uint8_t k, fl;
	union {
		bool b;
		int64_t i;
		double f;
		struct { const char *p; const uint8_t *m; size_t n; } s; /* m: per byte, 1 = from the variables; NULL: none */
		struct jlist *l;
		struct jdict *d;
		struct jmacro *mac;
		struct jmethod *mt;
		const char *name; /* JK_UNDEF: what is undefined (may be NULL); JK_FUNC: the global */
	} u;
};

struct jlist { struct jv *v; size_t n, cap; };
struct jpair { struct jv key, val; };
struct jdict { struct jpair *e; size_t n, cap; };
struct jmethod { struct jv self; const char *name; };
struct jscope;
/* a macro (n: its JN_MACRO, caller: caller() inside a call block), or a
 * recursive loop's loop() (n: its JN_FOR, caller: the depth it runs at) */
struct jmacro { const struct jnode *n; struct jscope *sc; struct jv caller; };

/* syntax tree */
enum jn {
	/* statements */
	JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_FILTERBLOCK,
	JN_BREAK, JN_CONTINUE, JN_BODY, JN_CALLBLOCK, JN_WITH,
	/* expressions */
	JN_LIT, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST,
	JN_LIST, JN_TUPLE, JN_DICT, JN_COND, JN_AND, JN_OR, JN_NOT, JN_NEG, JN_POS,
	JN_BIN, JN_CMP, JN_CONCAT, JN_KWARG,
};

struct jnode {
	uint8_t kind;
	uint8_t neg;		/* JN_TEST: is not; JN_CMP: not in */
	int op;			/* JN_BIN / JN_CMP: the operator token */
	int line;
	const char *name;	/* names, attributes, filters, tests, macro names */
	struct jv lit;		/* JN_LIT, JN_TEXT */
	struct jnode *a, *b, *c, *d; /* operands; statements: a cond/target, b iterable, c body, d else */
	struct jnode **kids;	/* arguments, list items, body statements */
	size_t n;
};

struct jarena;

struct jscope {
	struct jscope *up;
	struct jdict vars;
};

struct jbuf { char *p; uint8_t *m; size_t n, cap; bool any; /* some byte of m is 1 */ };

struct jctx {
	jmp_buf jb;
	char *err;
	size_t errlen;
	struct jarena *arena;
	const struct jinja_opts *o;
	uint64_t steps;
	int depth;
	int line;		/* of the node being run, for messages */
	int ctl;		/* 1 break, 2 continue: unwinding to the loop */
	struct jbuf *out;
	struct jscope *globals;
	bool json_ascii;	/* tojson(ensure_ascii=True) is running */
};

/* jinja_parse.c */
struct jnode *jx_parse(struct jctx *c, const char *src, size_t n);

/* jinja_eval.c */
void jx_run(struct jctx *c, const struct jnode *body, struct jscope *sc);
struct jv jx_eval(struct jctx *c, const struct jnode *e, struct jscope *sc);
struct jv jx_loop_again(struct jctx *c, const struct jmacro *m, struct jv items);
struct jv jx_call_macro(struct jctx *c, struct jv mac, const struct jv *args, size_t nargs,
			const char *const *kwn, const struct jv *kwv, size_t nkw);

/* jinja_lib.c: memory, errors */
_Noreturn void jx_fail(struct jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *jx_alloc(struct jctx *c, size_t n);
void *jx_alloc_array(struct jctx *c, size_t count, size_t size);
char *jx_strdup(struct jctx *c, const char *s, size_t n);
void jx_step(struct jctx *c, uint64_t n);
uint64_t jv_cost(struct jv v); /* steps for walking V: its items, its bytes / 64 */

/* values */
struct jv jv_undef(const char *name);
struct jv jv_none(void);
struct jv jv_bool(bool b);
struct jv jv_int(int64_t i);
struct jv jv_float(double f);
struct jv jv_str(const char *p, size_t n);
struct jv jv_cstr(const char *s);
struct jv jv_list(struct jctx *c, size_t cap);
struct jv jv_dict(struct jctx *c);
void jl_push(struct jctx *c, struct jlist *l, struct jv v);
void jd_set(struct jctx *c, struct jdict *d, struct jv key, struct jv val);
struct jv *jd_get(const struct jdict *d, struct jv key);
struct jv *jd_gets(const struct jdict *d, const char *key);
bool jv_truthy(struct jv v);
bool jv_eq(struct jv a, struct jv b);
int jv_cmp(struct jctx *c, struct jv a, struct jv b); /* <0 0 >0, fails on mixed kinds */
const char *jv_type(struct jv v);
struct jv jv_from_json(struct jctx *c, const json_t *j, int depth);
struct jv jv_iter(struct jctx *c, struct jv v); /* a list of the items; fails if not iterable */

/* buffers */
void jb_put(struct jctx *c, struct jbuf *b, const char *p, size_t n, const uint8_t *m);
void jb_putc(struct jctx *c, struct jbuf *b, char ch);
void jb_puts(struct jctx *c, struct jbuf *b, const char *s);
struct jv jb_str(struct jbuf *b);
void jb_putv(struct jctx *c, struct jbuf *b, struct jv s); /* a string value, with its marks */
struct jv jv_sub(struct jv s, size_t off, size_t n); /* bytes OFF..OFF+N of a string */
struct jv jv_undef_attr(struct jctx *c, struct jv obj, const char *attr);
_Noreturn void jx_fail_undef(struct jctx *c, struct jv u);
void jx_tojson(struct jctx *c, struct jbuf *b, struct jv v, const char *indent, const char *item_sep,
	       const char *key_sep, bool sort_keys, int level);
void fmt_float(double f, char *buf, size_t len);
void jv_print(struct jctx *c, struct jbuf *b, struct jv v);	/* str(v) */
void jv_repr(struct jctx *c, struct jbuf *b, struct jv v);	/* repr(v) */
struct jv jv_tostr(struct jctx *c, struct jv v);

/* filters, tests, methods, globals */
struct jv jx_filter(struct jctx *c, const char *name, struct jv v, const struct jv *args,
		    size_t nargs, const char *const *kwn, const struct jv *kwv, size_t nkw);
bool jx_test(struct jctx *c, const char *name, struct jv v, const struct jv *args, size_t nargs);
struct jv jx_getattr(struct jctx *c, struct jv obj, const char *name);
struct jv jx_getitem(struct jctx *c, struct jv obj, struct jv key);
struct jv jx_call(struct jctx *c, struct jv f, const struct jv *args, size_t nargs,
		  const char *const *kwn, const struct jv *kwv, size_t nkw);
struct jv jx_binop(struct jctx *c, int op, struct jv a, struct jv b);
bool jx_contains(struct jctx *c, struct jv hay, struct jv needle);
struct jv jx_slice(struct jctx *c, struct jv v, struct jv lo, struct jv hi, struct jv step);
bool jx_is_global(const char *name);
struct jv jx_loop_cycle(struct jctx *c, int64_t index0);
struct jv jx_splitlines(struct jctx *c, struct jv s); /* str.splitlines() */
uint32_t jx_utf8_decode(const unsigned char *p, size_t n, size_t *len); /* bad byte: itself */
bool jx_is_space(uint32_t u); /* Python's str.isspace for one code point */
struct jv jx_lower(struct jctx *c, struct jv s); /* str.lower() */
struct jv jx_percent_format(struct jctx *c, struct jv fmt, struct jv args); /* fmt % args */

/* tokens the parser hands to the evaluator as operators */
enum { JT_ADD = 1, JT_SUB, JT_MUL, JT_DIV, JT_FLOORDIV, JT_MOD, JT_POW, JT_EQ, JT_NE,
       JT_LT, JT_GT, JT_LE, JT_GE, JT_IN };

#endif /* LOOM_JINJA_IMPL_H */
