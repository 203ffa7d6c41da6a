/* Chat templates: family detection from template sources and the rendered
 * prompt of each family, against strings written out by hand from the
 * families' published formats. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"

static const struct loom_chat_msg conv[] = {
	{ "system", "Be brief." },
	{ "user", "Hi" },
	{ "assistant", "Hello!" },
	{ "user", "Bye" },
};

static char *render(const char *tmpl, const struct loom_chat_msg *m, size_t n)
{
	struct loom_chat_template t;
	char err[256];
	char *s;

	ck_assert_int_eq(loom_chat_template_detect(tmpl, &t, err, sizeof(err)), 0);
	s = loom_chat_render(&t, m, n, true, err, sizeof(err));
	ck_assert_msg(s != NULL, "%s", err);
	return s;
}

static void expect(const char *tmpl, const char *want)
{
	char *s = render(tmpl, conv, 4);

	ck_assert_str_eq(s, want);
	free(s);
}

START_TEST(chatml)
{
	expect("{{'<|im_start|>' + message['role']}}",
	       "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
	       "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
	       "<|im_start|>assistant\n");
}
END_TEST

START_TEST(chatml_default_system)
{
	/* SmolLM2's template (real newlines inside the Jinja strings) */
	const char *tmpl = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
			   "{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}"
			   "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
			   "{% endfor %}";
	char *s = render(tmpl, conv + 1, 1);

	ck_assert_str_eq(s, "<|im_start|>system\nYou are SmolLM<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
			    "<|im_start|>assistant\n");
	free(s);
	s = render(tmpl, conv, 2); /* a system message replaces the default */
	ck_assert_ptr_null(strstr(s, "SmolLM"));
	free(s);
}
END_TEST

START_TEST(llama3)
{
	expect("{{ '<|start_header_id|>' + message['role'] }}",
	       "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
	       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
	       "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
	       "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
	       "<|start_header_id|>assistant<|end_header_id|>\n\n");
}
END_TEST

START_TEST(llama2)
{
	expect("[INST] <<SYS>>",
	       "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
}
END_TEST

START_TEST(mistral)
{
	expect("{{ '[INST] ' + message['content'] + ' [/INST]' }}",
	       "[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
}
END_TEST

START_TEST(gemma)
{
	expect("<start_of_turn>",
	       "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
	       "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}
END_TEST

START_TEST(phi3_zephyr)
{
	expect("<|user|> ... <|end|>",
	       "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
	       "<|user|>\nBye<|end|>\n<|assistant|>\n");
	expect("<|user|> ... eos_token",
	       "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
	       "<|user|>\nBye</s>\n<|assistant|>\n");
}
END_TEST

START_TEST(refusals)
{
	static const struct loom_chat_msg bad_role[] = { { "wizard", "x" } };
	static const struct loom_chat_msg late_sys[] = { { "user", "x" }, { "system", "y" } };
	struct loom_chat_template t;
	char err[256];

	ck_assert_int_eq(loom_chat_template_detect("{{ bos_token }}{{ foo }}", &t, err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "unsupported"));
	ck_assert_int_eq(loom_chat_template_detect(NULL, &t, err, sizeof(err)), 0);
	ck_assert_int_eq(t.family, LOOM_CHAT_CHATML);
	ck_assert_ptr_null(loom_chat_render(&t, bad_role, 1, true, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "role"));
	ck_assert_int_eq(loom_chat_template_detect("<start_of_turn>", &t, err, sizeof(err)), 0);
	ck_assert_ptr_null(loom_chat_render(&t, late_sys, 2, true, err, sizeof(err)));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("chat_template");
	TCase *tc = tcase_create("all");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, chatml);
	tcase_add_test(tc, chatml_default_system);
	tcase_add_test(tc, llama3);
	tcase_add_test(tc, llama2);
	tcase_add_test(tc, mistral);
	tcase_add_test(tc, gemma);
	tcase_add_test(tc, phi3_zephyr);
	tcase_add_test(tc, refusals);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
