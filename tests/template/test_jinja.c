/* The Jinja interpreter (core/text/jinja*.c) on its own: small templates
 * against jinja2's renderings (jinja2_snippets.json, written by
 * gen_snippets.py with jinja2 as the oracle), the errors a template can
 * raise, the limits that stop a hostile one, and the content marks that
 * tell message text from template text. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/jinja.h"

static const char *snippets_path;

static char *render_opts(const char *tmpl, const char *vars, const struct jinja_opts *o,
			 char *err, size_t errlen)
{
	json_error_t je;
	json_t *v = vars ? json_loads(vars, 0, &je) : NULL;
	size_t len = 0;
	char *s;

	ck_assert_msg(!vars || v, "bad test vars: %s", je.text);
	s = jinja_render(tmpl, strlen(tmpl), v, o, &len, err, errlen);
	if (s)
		ck_assert_uint_eq(strlen(s), len);
	json_decref(v);
	return s;
}

/* Renders TMPL and expects it to fail with a message containing WANT. */
static void expect_error(const char *tmpl, const struct jinja_opts *o, const char *want)
{
	char err[512] = "";
	char *s = render_opts(tmpl, "{\"x\": 1}", o, err, sizeof(err));

	ck_assert_msg(s == NULL, "'%.60s' rendered '%.60s'; expected an error with '%s'", tmpl,
		      s ? s : "", want);
	ck_assert_msg(strstr(err, want), "'%.60s' failed with '%s', not '%s'", tmpl, err, want);
}

START_TEST(snippets)
{
	json_error_t je;
	json_t *doc = json_load_file(snippets_path, 0, &je), *cases, *c;
	char *ctx;
	size_t i;

	ck_assert_msg(doc != NULL, "%s: %s", snippets_path, je.text);
	ctx = json_dumps(json_object_get(doc, "context"), 0);
	cases = json_object_get(doc, "cases");
	ck_assert_uint_ge(json_array_size(cases), 20);
	json_array_foreach(cases, i, c) {
		const char *t = json_string_value(json_object_get(c, "template"));
		const char *want = json_string_value(json_object_get(c, "expected"));
		char err[512];
		char *s = render_opts(t, ctx, NULL, err, sizeof(err));

		ck_assert_msg(s != NULL, "snippet %zu failed: %s", i, err);
		ck_assert_msg(!strcmp(s, want), "snippet %zu: '%s'\ngot  '%s'\nwant '%s'", i, t, s,
			      want);
		free(s);
	}
	free(ctx);
	json_decref(doc);
}
END_TEST

START_TEST(errors)
{
	char err[512];
	char *s = render_opts("a{{ raise_exception('Only user and assistant roles!') }}", NULL, NULL,
			      err, sizeof(err));

	ck_assert_ptr_null(s);
	ck_assert_str_eq(err, "Only user and assistant roles!"); /* the template's own words */
	expect_error("{% for %}", NULL, "line 1: expected a name");
	expect_error("\n\n{{ x | nosuch }}", NULL, "line 3: No filter named 'nosuch'");
	expect_error("{% if true %}open", NULL, "missing {% endif %}");
	expect_error("{{ 'abc }}", NULL, "unterminated string");
	expect_error("{{ x }", NULL, "missing '}}'");
	expect_error("{# never closed", NULL, "unterminated comment");
	expect_error("{% frobnicate %}", NULL, "unknown tag 'frobnicate'");
	/* a chat template is one file: loading another is refused by name */
	expect_error("a\n{% include 'other.jinja' %}", NULL,
		     "line 2: {% include %} is not supported: a chat template must be self-contained");
	expect_error("{% import 'macros.jinja' as m %}", NULL, "{% import %} is not supported");
	expect_error("{% from 'm.jinja' import f %}", NULL, "{% from %} is not supported");
	expect_error("{% extends 'base.jinja' %}", NULL, "{% extends %} is not supported");
	expect_error("{{ [].append(1) }}", NULL,
		     "SecurityError: access to attribute 'append' of 'list' object is unsafe.");
	expect_error("{{ {}.pop('a') }}", NULL, "SecurityError");
	expect_error("{{ nothing.y }}", NULL, "UndefinedError: 'nothing' is undefined");
	expect_error("{{ 'a' + {} }}", NULL, "can only concatenate str (not \"dict\") to str");
	expect_error("{{ 1 + 'a' }}", NULL, "unsupported operand type(s) for +: 'int' and 'str'");
	expect_error("{{ [1] | map('upper') | tojson }}", NULL,
		     "Object of type generator is not JSON serializable");
	expect_error("{% set n = 1 %}{% set n.a = 2 %}", NULL, "only a namespace()");
	expect_error("{{ 1 // 0 }}", NULL, "ZeroDivisionError");
	expect_error("{{ 9223372036854775807 + 1 }}", NULL, "integer overflow");
	expect_error("{{ 99999999999999999999 }}", NULL, "too large");
	expect_error("{{ x < 'a' }}", NULL, "'<' not supported");
	expect_error("{{ none | length }}", NULL, "has no len()");
	expect_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, "cannot unpack");
	expect_error("{% for i in [1] %}{{ loop([1]) }}{% endfor %}", NULL, "not callable");
}
END_TEST

START_TEST(limits)
{
	struct jinja_opts o;
	char deep[2 * 4096 + 32];

	jinja_default_opts(&o);
	o.max_steps = 100000;
	o.max_output = 1 << 20;
	o.max_memory = 16 << 20;
	o.max_depth = 50;
	expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
		     &o, "more than 100000 steps");
	expect_error("{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}", &o,
		     "output larger than 1048576 bytes");
	expect_error("{{ 'a' * 9223372036854775807 }}", &o, "output larger");
	expect_error("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", &o, "deeper than 50");
	expect_error("{% for i in [1] recursive %}{{ loop([1]) }}{% endfor %}", &o,
		     "recursive loop deeper than 50");
	strcpy(deep, "{{ ");
	memset(deep + 3, '(', 4096);
	deep[3 + 4096] = '1';
	memset(deep + 4 + 4096, ')', 4096);
	strcpy(deep + 4 + 2 * 4096, " }}");
	expect_error(deep, &o, "nesting deeper than 50");
	expect_error("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}", &o,
		     "nested deeper than 50");
	expect_error("{{ range(1000000000) | length }}", NULL, "range longer");
	expect_error("{{ 'ab' * 9000000000000 }}", &o, "output larger"); /* not minutes */
	expect_error("{{ nothing | unique * 8000000000003 }}", &o, "'generator' and 'int'");
	{
		char err[256];
		char *s = render_opts("{{ [] * 9000000000000 }}{{ '' * 9000000000000 }}", NULL, &o,
				      err, sizeof(err));

		ck_assert_msg(s != NULL, "%s", err); /* empty times a huge count: at once */
		ck_assert_str_eq(s, "[]");
		free(s);
	}
	o.max_steps = 1u << 30;
	expect_error("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
		     "{% set ns.l = ns.l + ns.l %}{% endfor %}", &o, "out of memory");
}
END_TEST

/* Bytes copied from the variables' strings are marked 1, template text
 * and *_token variables 0, through concatenation and string filters. */
START_TEST(content_marks)
{
	static const char vars[] = "{\"bos_token\": \"<s>\", \"messages\": "
				   "[{\"role\": \"user\", \"content\": \"  ab \"}]}";
	static const char tmpl[] = "{{ bos_token }}<t>{{ '|' + messages[0].content + '|' }}"
				   "{{ messages[0].content | trim | upper }}{{ 'x' ~ messages[0].role }}"
				   "{{ messages[0].role.format() }}{{ messages[0].role | tojson }}";
	static const char want[] = "<s><t>|  ab |ABxuseruser\"user\"";
	static const char marks[] = "000000011111011011111111011110";
	struct jinja_opts o;
	uint8_t *mask = NULL;
	char err[256];
	char *s;

	jinja_default_opts(&o);
	o.content_mask = &mask;
	s = render_opts(tmpl, vars, &o, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	ck_assert_str_eq(s, want);
	ck_assert_ptr_nonnull(mask);
	for (size_t i = 0; i < strlen(want); i++)
		ck_assert_msg(mask[i] == marks[i] - '0', "byte %zu ('%c') marked %d", i, want[i],
			      mask[i]);
	free(mask);
	free(s);
}
END_TEST

/* transformers' {% generation %} tag (assistant masks) renders its body */
START_TEST(generation_tag)
{
	char err[256];
	char *s = render_opts("a{% generation %}b{{ 1 }}{% endgeneration %}c", NULL, NULL, err,
			      sizeof(err));

	ck_assert_msg(s != NULL, "%s", err);
	ck_assert_str_eq(s, "ab1c");
	free(s);
}
END_TEST

START_TEST(no_vars)
{
	char err[256];
	char *s = render_opts("{{ messages | length }}{% for m in messages %}x{% endfor %}", NULL,
			      NULL, err, sizeof(err));

	ck_assert_msg(s != NULL, "%s", err);
	ck_assert_str_eq(s, "0");
	free(s);
	s = render_opts("{{ 1 }}", "[1]", NULL, err, sizeof(err));
	ck_assert_ptr_null(s);
	ck_assert_msg(strstr(err, "must be a JSON object"), "%s", err);
}
END_TEST

int main(int argc, char **argv)
{
	Suite *s = suite_create("jinja");
	TCase *tc = tcase_create("jinja");
	SRunner *sr;
	int failed;

	snippets_path = argc > 1 ? argv[1] : "tests/template/jinja2_snippets.json";
	tcase_add_test(tc, snippets);
	tcase_add_test(tc, errors);
	tcase_add_test(tc, limits);
	tcase_add_test(tc, content_marks);
	tcase_add_test(tc, no_vars);
	tcase_add_test(tc, generation_tag);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
