/* Grammars for JSON: any value, any object, a JSON Schema (the subset
 * clients send), and tool calls (docs/SERVING.md, "Structured output and
 * tools"). Rules over bytes, built with grammar.h's builder.
 *
 * Whitespace between tokens is bounded: nothing, one space, or a newline
 * and at most MAX_INDENT spaces or tabs, so a model cannot loop on
 * whitespace. Numbers have at most MAX_DIGITS digits in each part for the
 * same reason. Properties come in the schema's order; an optional one may
 * be left out; properties a schema does not name are never generated
 * (which every schema allows).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar.h"
#include "util.h"

#define MAX_INDENT 20
#define MAX_DIGITS 16
#define MAX_NEST 64       /* schema nesting */
#define MAX_ITEMS 256     /* largest minItems / maxItems expanded */
#define MAX_REFS 128
#define MAX_CALLS 16      /* tool calls in one reply */

struct jc {
	struct gbuild *b;
	json_t *doc;          /* the whole schema, for $ref */
	int32_t ws, str, num, intg, value, anyobj, boolean, null;
	struct {
		char *path;
		int32_t rule;
	} refs[MAX_REFS];
	int n_refs;
	int depth;
	char *err;
	size_t errlen;
	bool failed;
};

static int32_t fail(struct jc *c, const char *fmt, const char *what)
{
	if (!c->failed)
		loom_seterr(c->err, c->errlen, fmt, what);
	c->failed = true;
	return -1;
}

/* A rule with one alternative, s. */
static int32_t rule1(struct jc *c, struct gseq *s)
{
	int32_t r = gbuild_rule(c->b);

	gbuild_alt(c->b, r, s);
	return r;
}

/* A rule that matches the literal text. */
static int32_t lit_rule(struct jc *c, const char *text)
{
	struct gseq s = { 0 };

	gseq_lit(c->b, &s, text, strlen(text));
	return rule1(c, &s);
}

/* ---- shared rules ---- */

/* Whitespace: nothing, a space, or a newline and up to MAX_INDENT blanks. */
static int32_t ws_rule(struct jc *c)
{
	struct gseq s = { 0 };
	int32_t ind, next;

	if (c->ws >= 0)
		return c->ws;
	/* IND_i: at most MAX_INDENT - i more blanks, built from the end */
	ind = rule1(c, &s);
	for (int i = 0; i < MAX_INDENT; i++) {
		next = ind;
		ind = gbuild_rule(c->b);
		gbuild_alt(c->b, ind, &s);
		gseq_chars(c->b, &s, " \t");
		gseq_ref(&s, next);
		gbuild_alt(c->b, ind, &s);
	}
	c->ws = gbuild_rule(c->b);
	gbuild_alt(c->b, c->ws, &s);
	gseq_byte(c->b, &s, ' ');
	gbuild_alt(c->b, c->ws, &s);
	gseq_byte(c->b, &s, '\n');
	gseq_ref(&s, ind);
	gbuild_alt(c->b, c->ws, &s);
	return c->ws;
}

/* x repeated min..max times (max < 0: no limit); x must not match "". */
static int32_t rep_rule(struct jc *c, int32_t x, int min, int max)
{
	struct gseq s = { 0 };
	int32_t tail = gbuild_rule(c->b), r;

	gbuild_alt(c->b, tail, &s);
	if (max < 0) {
		gseq_ref(&s, x);
		gseq_ref(&s, tail);
		gbuild_alt(c->b, tail, &s);
	}
	for (int i = max - 1; max >= 0 && i >= min; i--) {
		r = gbuild_rule(c->b);
		gbuild_alt(c->b, r, &s);
		gseq_ref(&s, x);
		gseq_ref(&s, tail);
		gbuild_alt(c->b, r, &s);
		tail = r;
	}
	for (int i = 0; i < min; i++) {
		gseq_ref(&s, x);
		gseq_ref(&s, tail);
		tail = rule1(c, &s);
	}
	return tail;
}

/* A JSON string: printable ASCII but '"' and '\\', an escape, or a UTF-8
 * sequence (a lead byte and the continuation bytes it announces). */
static int32_t string_rule(struct jc *c)
{
	struct gseq s = { 0 };
	int32_t ch, hex, cont, chars;

	if (c->str >= 0)
		return c->str;
	gseq_range(c->b, &s, 0x80, 0xbf, NULL);
	cont = rule1(c, &s);
	gseq_chars(c->b, &s, "0123456789abcdefABCDEF");
	hex = rule1(c, &s);
	ch = gbuild_rule(c->b);
	gseq_range(c->b, &s, 0x20, 0x7f, "\"\\");
	gbuild_alt(c->b, ch, &s);
	gseq_byte(c->b, &s, '\\');
	gseq_chars(c->b, &s, "\"\\/bfnrt");
	gbuild_alt(c->b, ch, &s);
	gseq_lit(c->b, &s, "\\u", 2);
	for (int i = 0; i < 4; i++)
		gseq_ref(&s, hex);
	gbuild_alt(c->b, ch, &s);
	for (int n = 1; n <= 3; n++) {
		static const unsigned lo[] = { 0, 0xc2, 0xe0, 0xf0 }, hi[] = { 0, 0xdf, 0xef, 0xf4 };

		gseq_range(c->b, &s, lo[n], hi[n], NULL);
		for (int i = 0; i < n; i++)
			gseq_ref(&s, cont);
		gbuild_alt(c->b, ch, &s);
	}
	chars = rep_rule(c, ch, 0, -1);
	gseq_byte(c->b, &s, '"');
	gseq_ref(&s, chars);
	gseq_byte(c->b, &s, '"');
	c->str = rule1(c, &s);
	return c->str;
}

/* A JSON number, or only integers. */
static int32_t number_rule(struct jc *c, bool integer)
{
	struct gseq s = { 0 };
	int32_t dig, ipart, intg, frac, sign, exp, num;

	if ((integer ? c->intg : c->num) >= 0)
		return integer ? c->intg : c->num;
	gseq_range(c->b, &s, '0', '9', NULL);
	dig = rule1(c, &s);
	ipart = gbuild_rule(c->b);
	gseq_byte(c->b, &s, '0');
	gbuild_alt(c->b, ipart, &s);
	gseq_range(c->b, &s, '1', '9', NULL);
	gseq_ref(&s, rep_rule(c, dig, 0, MAX_DIGITS - 1));
	gbuild_alt(c->b, ipart, &s);
	intg = gbuild_rule(c->b);
	gseq_ref(&s, ipart);
	gbuild_alt(c->b, intg, &s);
	gseq_byte(c->b, &s, '-');
	gseq_ref(&s, ipart);
	gbuild_alt(c->b, intg, &s);
	c->intg = intg;
	if (integer)
		return intg;
	frac = gbuild_rule(c->b);
	gbuild_alt(c->b, frac, &s);
	gseq_byte(c->b, &s, '.');
	gseq_ref(&s, rep_rule(c, dig, 1, MAX_DIGITS));
	gbuild_alt(c->b, frac, &s);
	sign = gbuild_rule(c->b);
	gbuild_alt(c->b, sign, &s);
	gseq_chars(c->b, &s, "+-");
	gbuild_alt(c->b, sign, &s);
	exp = gbuild_rule(c->b);
	gbuild_alt(c->b, exp, &s);
	gseq_chars(c->b, &s, "eE");
	gseq_ref(&s, sign);
	gseq_ref(&s, rep_rule(c, dig, 1, 3));
	gbuild_alt(c->b, exp, &s);
	gseq_ref(&s, intg);
	gseq_ref(&s, frac);
	gseq_ref(&s, exp);
	num = rule1(c, &s);
	c->num = num;
	return num;
}

/* "{" ws "}" or "{" ws KV ws ("," ws KV ws)* "}" with KV: string ws ":" ws value. */
static int32_t map_rule(struct jc *c, int32_t value)
{
	struct gseq s = { 0 };
	int32_t ws = ws_rule(c), kv, tail, r;

	gseq_ref(&s, string_rule(c));
	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, ':');
	gseq_ref(&s, ws);
	gseq_ref(&s, value);
	kv = rule1(c, &s);
	tail = gbuild_rule(c->b);
	gseq_byte(c->b, &s, '}');
	gbuild_alt(c->b, tail, &s);
	gseq_byte(c->b, &s, ',');
	gseq_ref(&s, ws);
	gseq_ref(&s, kv);
	gseq_ref(&s, ws);
	gseq_ref(&s, tail);
	gbuild_alt(c->b, tail, &s);
	r = gbuild_rule(c->b);
	gseq_byte(c->b, &s, '{');
	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, '}');
	gbuild_alt(c->b, r, &s);
	gseq_byte(c->b, &s, '{');
	gseq_ref(&s, ws);
	gseq_ref(&s, kv);
	gseq_ref(&s, ws);
	gseq_ref(&s, tail);
	gbuild_alt(c->b, r, &s);
	return r;
}

/* "[" ws "]" (when min is 0) or "[" ws item ws ("," ws item ws){min-1, max-1} "]". */
static int32_t array_rule(struct jc *c, int32_t item, int min, int max)
{
	struct gseq s = { 0 };
	int32_t ws = ws_rule(c), more, r = gbuild_rule(c->b);

	if (min == 0) {
		gseq_byte(c->b, &s, '[');
		gseq_ref(&s, ws);
		gseq_byte(c->b, &s, ']');
		gbuild_alt(c->b, r, &s);
	}
	if (max == 0)
		return r;
	gseq_byte(c->b, &s, ',');
	gseq_ref(&s, ws);
	gseq_ref(&s, item);
	gseq_ref(&s, ws);
	more = rep_rule(c, rule1(c, &s), min > 1 ? min - 1 : 0, max < 0 ? -1 : max - 1);
	gseq_byte(c->b, &s, '[');
	gseq_ref(&s, ws);
	gseq_ref(&s, item);
	gseq_ref(&s, ws);
	gseq_ref(&s, more);
	gseq_byte(c->b, &s, ']');
	gbuild_alt(c->b, r, &s);
	return r;
}

/* Any JSON value. */
static int32_t value_rule(struct jc *c)
{
	struct gseq s = { 0 };
	int32_t v;

	if (c->value >= 0)
		return c->value;
	v = c->value = gbuild_rule(c->b);
	c->anyobj = map_rule(c, v);
	gseq_ref(&s, c->anyobj);
	gbuild_alt(c->b, v, &s);
	gseq_ref(&s, array_rule(c, v, 0, -1));
	gbuild_alt(c->b, v, &s);
	gseq_ref(&s, string_rule(c));
	gbuild_alt(c->b, v, &s);
	gseq_ref(&s, number_rule(c, false));
	gbuild_alt(c->b, v, &s);
	gseq_lit(c->b, &s, "true", 4);
	gbuild_alt(c->b, v, &s);
	gseq_lit(c->b, &s, "false", 5);
	gbuild_alt(c->b, v, &s);
	gseq_lit(c->b, &s, "null", 4);
	gbuild_alt(c->b, v, &s);
	return v;
}

/* A rule matching str[0..len) written as JSON writes it: UTF-8 as is,
 * the short escapes where a character must be escaped. One spelling: a
 * model offered every spelling of a property name (\u0063ity for city)
 * sometimes wanders into the odd ones. */
static int32_t string_lit_rule(struct jc *c, const char *str, size_t len)
{
	struct gseq s = { 0 };
	json_t *js = json_stringn(str, len);
	char *text = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;

	json_decref(js);
	if (!text)
		return fail(c, "json_schema: %s", "out of memory");
	gseq_lit(c->b, &s, text, strlen(text));
	free(text);
	return rule1(c, &s);
}

/* v as an alternative of rule r: a string in any spelling, anything else
 * as its compact JSON text. */
static void lit_alt(struct jc *c, int32_t r, json_t *v)
{
	struct gseq s = { 0 };
	char *text;

	if (json_is_string(v)) {
		gseq_ref(&s, string_lit_rule(c, json_string_value(v), json_string_length(v)));
		gbuild_alt(c->b, r, &s);
		return;
	}
	text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);

	if (!text) {
		fail(c, "json_schema: %s value cannot be written as JSON", "a const or enum");
		return;
	}
	gseq_lit(c->b, &s, text, strlen(text));
	gbuild_alt(c->b, r, &s);
	free(text);
}

static int32_t schema_rule(struct jc *c, json_t *sch);

/* Keywords that only annotate (ignored) and those compiled. */
static const char *const annotations[] = {
	"title", "description", "default", "examples", "$schema", "$id", "$comment",
	"deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL,
};
static const char *const handled[] = {
	"type", "properties", "required", "additionalProperties", "enum", "const",
	"items", "minItems", "maxItems", "anyOf", "oneOf", "$ref", NULL,
};

static bool listed(const char *const *list, const char *key)
{
	for (; *list; list++)
		if (!strcmp(*list, key))
			return true;
	return false;
}

static bool is_required(json_t *req, const char *name)
{
	size_t i;
	json_t *v;

	json_array_foreach(req, i, v)
		if (json_is_string(v) && !strcmp(json_string_value(v), name))
			return true;
	return false;
}

/* An object with the schema's properties, in order, optional ones maybe
 * left out: K_i_f (f: a property came before, so a comma leads) is
 * [K_{i+1}_f when optional] | (f ? "," ws : "") key ws ":" ws value ws K_{i+1}_1. */
static int32_t props_rule(struct jc *c, json_t *props, json_t *req)
{
	struct gseq s = { 0 };
	size_t n = json_object_size(props), i = n;
	int32_t ws = ws_rule(c), k[2], r;
	const char **names = calloc(n + 1, sizeof(*names));
	json_t **subs = calloc(n + 1, sizeof(*subs));
	const char *key;
	json_t *v;

	if (!names || !subs) {
		free(names);
		free(subs);
		return fail(c, "json_schema: %s", "out of memory");
	}
	n = 0;
	json_object_foreach(props, key, v) {
		names[n] = key;
		subs[n++] = v;
	}
	k[0] = k[1] = rule1(c, &s);
	for (i = n; i-- > 0 && !c->failed;) {
		int32_t val = schema_rule(c, subs[i]), nk[2];
		int32_t key = string_lit_rule(c, names[i], strlen(names[i]));

		for (int f = 0; f < 2; f++) {
			nk[f] = gbuild_rule(c->b);
			if (!is_required(req, names[i])) {
				gseq_ref(&s, k[f]);
				gbuild_alt(c->b, nk[f], &s);
			}
			if (f) {
				gseq_byte(c->b, &s, ',');
				gseq_ref(&s, ws);
			}
			gseq_ref(&s, key);
			gseq_ref(&s, ws);
			gseq_byte(c->b, &s, ':');
			gseq_ref(&s, ws);
			gseq_ref(&s, val);
			gseq_ref(&s, ws);
			gseq_ref(&s, k[1]);
			gbuild_alt(c->b, nk[f], &s);
		}
		k[0] = nk[0];
		k[1] = nk[1];
	}
	free(names);
	free(subs);
	gseq_byte(c->b, &s, '{');
	gseq_ref(&s, ws);
	gseq_ref(&s, k[0]);
	gseq_byte(c->b, &s, '}');
	r = rule1(c, &s);
	return r;
}

static int32_t object_rule(struct jc *c, json_t *sch)
{
	json_t *props = json_object_get(sch, "properties");
	json_t *req = json_object_get(sch, "required");
	json_t *add = json_object_get(sch, "additionalProperties");

	if (props && !json_is_object(props))
		return fail(c, "json_schema: '%s' must be an object", "properties");
	if (req && !json_is_array(req))
		return fail(c, "json_schema: '%s' must be an array", "required");
	if (add && !json_is_boolean(add) && !json_is_object(add))
		return fail(c, "json_schema: '%s' must be a boolean or a schema", "additionalProperties");
	if (req) {
		size_t i;
		json_t *v;

		json_array_foreach(req, i, v)
			if (!json_is_string(v) || !props || !json_object_get(props, json_string_value(v)))
				return fail(c, "json_schema: required property '%s' is not among the properties",
					    json_is_string(v) ? json_string_value(v) : "(not a string)");
	}
	if (props && json_object_size(props) > 0)
		return props_rule(c, props, req);
	if (json_is_false(add))
		return lit_rule(c, "{}");
	if (json_is_object(add))
		return map_rule(c, schema_rule(c, add));
	value_rule(c);
	return c->anyobj;
}

static int get_count(struct jc *c, json_t *sch, const char *key, int dflt, int *out)
{
	json_t *v = json_object_get(sch, key);

	*out = dflt;
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return fail(c, "json_schema: '%s' must be a non-negative integer", key);
	if (json_integer_value(v) > MAX_ITEMS)
		return fail(c, "json_schema: '%s' above 256 is not supported", key);
	*out = (int)json_integer_value(v);
	return 0;
}

static int32_t array_schema(struct jc *c, json_t *sch)
{
	json_t *items = json_object_get(sch, "items");
	int min, max;

	if (get_count(c, sch, "minItems", 0, &min) || get_count(c, sch, "maxItems", -1, &max))
		return -1;
	if (max >= 0 && min > max)
		return fail(c, "json_schema: %s", "minItems is above maxItems");
	return array_rule(c, items ? schema_rule(c, items) : value_rule(c), min, max);
}

/* The rule for one type name under schema sch. */
static int32_t type_rule(struct jc *c, json_t *sch, const char *type)
{
	if (!strcmp(type, "object"))
		return object_rule(c, sch);
	if (!strcmp(type, "array"))
		return array_schema(c, sch);
	if (!strcmp(type, "string"))
		return string_rule(c);
	if (!strcmp(type, "number"))
		return number_rule(c, false);
	if (!strcmp(type, "integer"))
		return number_rule(c, true);
	if (!strcmp(type, "boolean")) {
		if (c->boolean < 0) {
			struct gseq s = { 0 };

			c->boolean = gbuild_rule(c->b);
			gseq_lit(c->b, &s, "true", 4);
			gbuild_alt(c->b, c->boolean, &s);
			gseq_lit(c->b, &s, "false", 5);
			gbuild_alt(c->b, c->boolean, &s);
		}
		return c->boolean;
	}
	if (!strcmp(type, "null")) {
		if (c->null < 0)
			c->null = lit_rule(c, "null");
		return c->null;
	}
	return fail(c, "json_schema: unsupported type '%s'", type);
}

/* Whether an enum or anyOf/oneOf of n alternatives can be followed: the
 * matcher keeps LOOM_GRAMMAR_MAX_STACKS alternatives open at once, and
 * each of these is one where the value starts. Refused by name, wherever
 * the construct sits in the schema. */
static bool alts_fit(struct jc *c, size_t n, const char *key)
{
	if (n <= LOOM_GRAMMAR_MAX_STACKS)
		return true;
	if (!c->failed)
		loom_seterr(c->err, c->errlen,
			    "json_schema: too many alternatives open at once: '%s' of %zu values, at most %d",
			    key, n, LOOM_GRAMMAR_MAX_STACKS);
	c->failed = true;
	return false;
}

/* A rule matching one of the alternatives in the array alts. */
static int32_t any_of(struct jc *c, json_t *alts, const char *key)
{
	struct gseq s = { 0 };
	int32_t r = gbuild_rule(c->b);
	size_t i;
	json_t *v;

	if (!json_is_array(alts) || json_array_size(alts) == 0)
		return fail(c, "json_schema: '%s' must be a non-empty array", key);
	if (!alts_fit(c, json_array_size(alts), key))
		return -1;
	json_array_foreach(alts, i, v) {
		gseq_ref(&s, schema_rule(c, v));
		gbuild_alt(c->b, r, &s);
	}
	return r;
}

/* The target of a local reference ("#", "#/$defs/Name", any JSON pointer
 * into the document), or NULL. */
static json_t *resolve(struct jc *c, const char *ref)
{
	json_t *at = c->doc;
	const char *p = ref + 1;
	char seg[256];

	if (ref[0] != '#')
		return NULL;
	while (*p == '/' && at) {
		size_t n = 0;

		for (p++; *p && *p != '/' && n + 1 < sizeof(seg); p++) {
			if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
				seg[n++] = p[1] == '0' ? '~' : '/';
				p++;
			} else {
				seg[n++] = *p;
			}
		}
		seg[n] = 0;
		if (json_is_object(at))
			at = json_object_get(at, seg);
		else if (json_is_array(at))
			at = json_array_get(at, (size_t)strtoul(seg, NULL, 10));
		else
			at = NULL;
	}
	return *p ? NULL : at;
}

/* A rule for $ref, made once per target (so recursive schemas work). */
static int32_t ref_rule(struct jc *c, json_t *ref)
{
	struct gseq s = { 0 };
	const char *path = json_string_value(ref);
	json_t *target;
	int32_t r, body;

	if (!path)
		return fail(c, "json_schema: '%s' must be a string", "$ref");
	for (int i = 0; i < c->n_refs; i++)
		if (!strcmp(c->refs[i].path, path))
			return c->refs[i].rule;
	target = resolve(c, path);
	if (!target)
		return fail(c, "json_schema: $ref '%s' does not name a schema in this document", path);
	if (c->n_refs == MAX_REFS)
		return fail(c, "json_schema: more than %s distinct $ref targets", "128");
	r = gbuild_rule(c->b);
	c->refs[c->n_refs].path = strdup(path);
	if (!c->refs[c->n_refs].path)
		return fail(c, "json_schema: %s", "out of memory");
	c->refs[c->n_refs++].rule = r;
	body = schema_rule(c, target);
	gseq_ref(&s, body);
	gbuild_alt(c->b, r, &s);
	return r;
}

static int check_keywords(struct jc *c, json_t *sch)
{
	const char *key;
	json_t *v;

	json_object_foreach(sch, key, v) {
		if (!listed(annotations, key) && !listed(handled, key))
			return fail(c, "json_schema: unsupported keyword '%s'", key);
	}
	return 0;
}

/* Keywords beside anyOf/oneOf/$ref/const/enum that would constrain further. */
static const char *other_constraint(json_t *sch, const char *self)
{
	const char *key;
	json_t *v;

	json_object_foreach(sch, key, v)
		if (strcmp(key, self) && listed(handled, key))
			return key;
	return NULL;
}

static int32_t schema_body(struct jc *c, json_t *sch)
{
	static const char *const alone[] = { "$ref", "anyOf", "oneOf", "const", "enum", NULL };
	json_t *type = json_object_get(sch, "type");

	if (check_keywords(c, sch))
		return -1;
	for (int i = 0; alone[i]; i++) {
		json_t *v = json_object_get(sch, alone[i]);
		const char *other;
		int32_t r;

		if (!v)
			continue;
		other = other_constraint(sch, alone[i]);
		if (other && !(alone[i][0] == 'e' && !strcmp(other, "type")) &&
		    !(alone[i][0] == 'c' && !strcmp(other, "type"))) {
			loom_seterr(c->err, c->errlen, "json_schema: '%s' beside '%s' is not supported",
				    alone[i], other);
			c->failed = true;
			return -1;
		}
		if (i == 0)
			return ref_rule(c, v);
		if (i <= 2)
			return any_of(c, v, alone[i]);
		r = gbuild_rule(c->b);
		if (i == 3) {
			lit_alt(c, r, v);
		} else {
			size_t k;
			json_t *e;

			if (!json_is_array(v) || json_array_size(v) == 0)
				return fail(c, "json_schema: '%s' must be a non-empty array", "enum");
			if (!alts_fit(c, json_array_size(v), "enum"))
				return -1;
			json_array_foreach(v, k, e)
				lit_alt(c, r, e);
		}
		return r;
	}
	if (json_is_string(type))
		return type_rule(c, sch, json_string_value(type));
	if (json_is_array(type)) {
		struct gseq s = { 0 };
		int32_t r = gbuild_rule(c->b);
		size_t k;
		json_t *t;

		if (json_array_size(type) == 0)
			return fail(c, "json_schema: '%s' must not be empty", "type");
		json_array_foreach(type, k, t) {
			if (!json_is_string(t))
				return fail(c, "json_schema: '%s' must hold type names", "type");
			gseq_ref(&s, type_rule(c, sch, json_string_value(t)));
			gbuild_alt(c->b, r, &s);
		}
		return r;
	}
	if (type)
		return fail(c, "json_schema: '%s' must be a string or an array", "type");
	if (json_object_get(sch, "properties") || json_object_get(sch, "additionalProperties") ||
	    json_object_get(sch, "required"))
		return object_rule(c, sch);
	if (json_object_get(sch, "items") || json_object_get(sch, "minItems") ||
	    json_object_get(sch, "maxItems"))
		return array_schema(c, sch);
	return value_rule(c);
}

static int32_t schema_rule(struct jc *c, json_t *sch)
{
	int32_t r;

	if (c->failed)
		return -1;
	if (json_is_true(sch))
		return value_rule(c);
	if (!json_is_object(sch))
		return fail(c, "json_schema: %s", json_is_false(sch) ?
			    "the schema false matches nothing" : "a schema must be an object");
	if (++c->depth > MAX_NEST) {
		c->depth--;
		return fail(c, "json_schema: nesting deeper than %s", "64");
	}
	r = schema_body(c, sch);
	c->depth--;
	return r;
}

/* ws value ws, the top of a JSON document. */
static int32_t document(struct jc *c, int32_t value)
{
	struct gseq s = { 0 };

	gseq_ref(&s, ws_rule(c));
	gseq_ref(&s, value);
	gseq_ref(&s, ws_rule(c));
	return rule1(c, &s);
}

/* ---- tool calls ---- */

/* {"name": "<name>", "<args_key>": <parameters>} (args_key "arguments",
 * or "parameters" as Llama 3.x writes), whitespace as elsewhere. */
static int32_t call_rule(struct jc *c, json_t *tool, const char *args_key)
{
	struct gseq s = { 0 };
	json_t *name = json_object_get(tool, "name"), *params = json_object_get(tool, "parameters");
	int32_t ws = ws_rule(c), args;

	if (!json_is_string(name) || !json_string_length(name))
		return fail(c, "tools: %s", "each tool needs a non-empty string 'name'");
	args = params ? schema_rule(c, params) : lit_rule(c, "{}");
	gseq_byte(c->b, &s, '{');
	gseq_ref(&s, ws);
	gseq_lit(c->b, &s, "\"name\"", 6);
	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, ':');
	gseq_ref(&s, ws);
	gseq_ref(&s, string_lit_rule(c, json_string_value(name), json_string_length(name)));
	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, ',');
	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, '"');
	gseq_lit(c->b, &s, args_key, strlen(args_key));
	gseq_byte(c->b, &s, '"');
	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, ':');
	gseq_ref(&s, ws);
	gseq_ref(&s, args);
	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, '}');
	return rule1(c, &s);
}

/* gpt-oss's harmony call (args_key "harmony"), after the begin marker
 * "<|channel|>commentary ": to=functions.<name> <|constrain|>json<|message|>
 * <parameters>, whitespace after the marker and around the arguments. */
static int32_t harmony_rule(struct jc *c, json_t *tool)
{
	struct gseq s = { 0 };
	json_t *name = json_object_get(tool, "name"), *params = json_object_get(tool, "parameters");
	int32_t ws = ws_rule(c), args;
	static const char to[] = "to=functions.", mid[] = " <|constrain|>json<|message|>";

	if (!json_is_string(name) || !json_string_length(name))
		return fail(c, "tools: %s", "each tool needs a non-empty string 'name'");
	args = params ? schema_rule(c, params) : lit_rule(c, "{}");
	gseq_lit(c->b, &s, to, strlen(to));
	gseq_lit(c->b, &s, json_string_value(name), json_string_length(name));
	gseq_lit(c->b, &s, mid, strlen(mid));
	gseq_ref(&s, ws);
	gseq_ref(&s, args);
	return rule1(c, &s);
}

/* Any text that does not start with marker m (for "auto": plain text). */
static int32_t not_marker(struct jc *c, const char *m)
{
	struct gseq s = { 0 };
	int32_t any = gbuild_rule(c->b), next = -1, r = -1;
	size_t n = strlen(m);

	gbuild_alt(c->b, any, &s);
	gseq_range(c->b, &s, 0, 255, NULL);
	gseq_ref(&s, any);
	gbuild_alt(c->b, any, &s);
	/* N_i: "" | [^m_i] any | m_i N_{i+1} (the last without its third) */
	for (size_t i = n; i-- > 0;) {
		char ex[2] = { m[i], 0 };

		r = gbuild_rule(c->b);
		gbuild_alt(c->b, r, &s);
		gseq_range(c->b, &s, 0, 255, ex);
		gseq_ref(&s, any);
		gbuild_alt(c->b, r, &s);
		if (next >= 0) {
			gseq_byte(c->b, &s, (unsigned char)m[i]);
			gseq_ref(&s, next);
			gbuild_alt(c->b, r, &s);
		}
		next = r;
	}
	return r;
}

/* "[" call ("," call){0, max - 1} "]", whitespace between: the calls as
 * one JSON array (Mistral's [TOOL_CALLS][...]). */
static int32_t call_list(struct jc *c, int32_t call, int max_calls)
{
	struct gseq s = { 0 };
	int32_t ws = ws_rule(c), more;

	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, ',');
	gseq_ref(&s, ws);
	gseq_ref(&s, call);
	more = rep_rule(c, rule1(c, &s), 0, max_calls - 1);
	gseq_byte(c->b, &s, '[');
	gseq_ref(&s, ws);
	gseq_ref(&s, call);
	gseq_ref(&s, more);
	gseq_ref(&s, ws);
	gseq_byte(c->b, &s, ']');
	return rule1(c, &s);
}

/* The calls of a spec with "list": begin ws [calls] ws end, once; "auto"
 * also allows text that does not start with begin ("{" without one). */
static int32_t list_tools(struct jc *c, int32_t call, int max_calls, const char *begin,
			  const char *end, bool autom)
{
	struct gseq s = { 0 };
	int32_t ws = ws_rule(c), r = gbuild_rule(c->b);

	gseq_ref(&s, ws);
	gseq_lit(c->b, &s, begin, strlen(begin));
	gseq_ref(&s, ws);
	gseq_ref(&s, call_list(c, call, max_calls));
	gseq_ref(&s, ws);
	gseq_lit(c->b, &s, end, strlen(end));
	gseq_ref(&s, ws);
	gbuild_alt(c->b, r, &s);
	if (autom) {
		gseq_ref(&s, not_marker(c, *begin ? begin : "["));
		gbuild_alt(c->b, r, &s);
	}
	return r;
}

/*
 * Tool calls: spec is {"tools": [{"name", "parameters"}...], "mode":
 * "required" | "auto", "begin": marker, "end": marker, "max_calls": n,
 * "args_key": "arguments" (default) or "parameters", or "harmony" (gpt-oss:
 * to=functions.NAME <|constrain|>json<|message|>ARGS), "list": bool}.
 * One call to max_calls calls (default 1, at most MAX_CALLS), each begin
 * ws call ws end, separated by whitespace; with "list", begin [call, ...]
 * end once. Without markers exactly one bare call ("auto": or any text
 * that does not start with "{"). "auto" also allows any text that does
 * not start with the begin marker.
 */
static int32_t tools_rule(struct jc *c, json_t *spec)
{
	struct gseq s = { 0 };
	json_t *tools = json_object_get(spec, "tools");
	const char *mode = json_string_value(json_object_get(spec, "mode"));
	const char *begin = json_string_value(json_object_get(spec, "begin"));
	const char *end = json_string_value(json_object_get(spec, "end"));
	json_t *mc = json_object_get(spec, "max_calls");
	const char *args_key = json_string_value(json_object_get(spec, "args_key"));
	bool list = json_is_true(json_object_get(spec, "list"));
	int32_t ws = ws_rule(c), call = gbuild_rule(c->b), one, calls, r;
	int max_calls = 1;
	size_t i;
	json_t *t;

	if (mc && (!json_is_integer(mc) || json_integer_value(mc) < 1 ||
		   json_integer_value(mc) > MAX_CALLS))
		return fail(c, "tools: %s", "'max_calls' must be an integer in [1, 16]");
	if (mc)
		max_calls = (int)json_integer_value(mc);

	if (!json_is_array(tools) || json_array_size(tools) == 0)
		return fail(c, "tools: %s", "'tools' must be a non-empty array");
	if (!mode || (strcmp(mode, "required") && strcmp(mode, "auto")))
		return fail(c, "tools: %s", "'mode' must be \"required\" or \"auto\"");
	if (args_key && strcmp(args_key, "arguments") && strcmp(args_key, "parameters") &&
	    strcmp(args_key, "harmony"))
		return fail(c, "tools: %s", "'args_key' must be \"arguments\", \"parameters\" or \"harmony\"");
	begin = begin ? begin : "";
	end = end ? end : "";
	json_array_foreach(tools, i, t) {
		gseq_ref(&s, args_key && !strcmp(args_key, "harmony") ? harmony_rule(c, t) :
			     call_rule(c, t, args_key ? args_key : "arguments"));
		gbuild_alt(c->b, call, &s);
	}
	if (list)
		return list_tools(c, call, max_calls, begin, end, !strcmp(mode, "auto"));
	if (!*begin) {
		if (!strcmp(mode, "auto")) {
			r = gbuild_rule(c->b);
			gseq_ref(&s, document(c, call));
			gbuild_alt(c->b, r, &s);
			gseq_ref(&s, not_marker(c, "{"));
			gbuild_alt(c->b, r, &s);
			return r;
		}
		return document(c, call);
	}
	gseq_lit(c->b, &s, begin, strlen(begin));
	gseq_ref(&s, ws);
	gseq_ref(&s, call);
	gseq_ref(&s, ws);
	gseq_lit(c->b, &s, end, strlen(end));
	one = rule1(c, &s);
	gseq_ref(&s, ws);
	gseq_ref(&s, one);
	calls = rep_rule(c, rule1(c, &s), 0, max_calls - 1);
	r = gbuild_rule(c->b);
	gseq_ref(&s, one);
	gseq_ref(&s, calls);
	gseq_ref(&s, ws);
	gbuild_alt(c->b, r, &s);
	if (!strcmp(mode, "auto")) {
		gseq_ref(&s, not_marker(c, begin));
		gbuild_alt(c->b, r, &s);
	}
	return r;
}

/* Why no JSON document of g can start, or NULL when one can: after the
 * longest leading whitespace no byte fits (a schema whose $ref only
 * refers to itself), or the alternatives open at the start were more than
 * the matcher keeps (it would drop some of them). */
#define STR_(x) #x
#define STR(x) STR_(x)
#define MAX_STACKS_TEXT STR(LOOM_GRAMMAR_MAX_STACKS)

static const char *cannot_start(const struct loom_grammar *g)
{
	struct loom_gmatch *m = loom_gmatch_new(g, NULL);
	char ws[MAX_INDENT + 2];
	const char *why = NULL;

	ws[0] = '\n';
	memset(ws + 1, ' ', MAX_INDENT);
	if (!m)
		why = "out of memory";
	else if (loom_gmatch_overflowed(m))
		why = "too many alternatives open at once (at most " MAX_STACKS_TEXT ")";
	else if (loom_gmatch_feed(m, ws, MAX_INDENT + 1) || !loom_gmatch_any_byte(m))
		why = "nothing can match it (a $ref that only refers to itself?)";
	else if (loom_gmatch_overflowed(m))
		why = "too many alternatives open at once (at most " MAX_STACKS_TEXT ")";
	loom_gmatch_free(m);
	return why;
}

struct loom_grammar *loom_grammar_new(const char *kind, const char *text, size_t len,
				      char *err, size_t errlen)
{
	struct jc c = { .ws = -1, .str = -1, .num = -1, .intg = -1, .value = -1, .anyobj = -1,
		.boolean = -1, .null = -1, .err = err, .errlen = errlen };
	struct loom_grammar *g = NULL;
	json_error_t je;
	const char *why;
	int32_t root = -1;

	if (!kind) {
		loom_seterr(err, errlen, "grammar: no kind");
		return NULL;
	}
	if (strcmp(kind, "json_object") && strcmp(kind, "json") && strcmp(kind, "json_schema") &&
	    strcmp(kind, "tool_calls")) {
		loom_seterr(err, errlen, "grammar: unknown kind '%s' (json, json_object, json_schema, tool_calls)",
			    kind);
		return NULL;
	}
	c.b = gbuild_new();
	if (!c.b) {
		loom_seterr(err, errlen, "grammar: out of memory");
		return NULL;
	}
	if (!strcmp(kind, "json_schema") || !strcmp(kind, "tool_calls")) {
		if (!text) {
			loom_seterr(err, errlen, "%s: no text given", kind);
			goto out;
		}
		c.doc = json_loadb(text, len, JSON_DECODE_ANY, &je);
		if (!c.doc) {
			loom_seterr(err, errlen, "%s: not JSON: %s (at %d:%d)", kind, je.text,
				    je.line, je.column);
			goto out;
		}
	}
	if (!strcmp(kind, "json_object")) {
		value_rule(&c);
		root = document(&c, c.anyobj);
	} else if (!strcmp(kind, "json")) {
		root = document(&c, value_rule(&c));
	} else if (!strcmp(kind, "json_schema")) {
		root = document(&c, schema_rule(&c, c.doc));
	} else {
		if (!json_is_object(c.doc))
			fail(&c, "tools: %s", "the specification must be a JSON object");
		else
			root = tools_rule(&c, c.doc);
	}
	if (!c.failed)
		g = gbuild_finish(c.b, root, err, errlen);
	else
		gbuild_free(c.b);
	c.b = NULL;
	if (g && !strcmp(kind, "json_schema") && (why = cannot_start(g))) {
		loom_seterr(err, errlen, "%s: %s", kind, why);
		loom_grammar_free(g);
		g = NULL;
	}
out:
	gbuild_free(c.b);
	json_decref(c.doc);
	for (int i = 0; i < c.n_refs; i++)
		free(c.refs[i].path);
	return g;
}
