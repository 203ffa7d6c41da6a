/* The public API (include/loom.h) as an embedding program uses it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom.h"

static const char *model;
static struct loom_engine *engine;

struct collected {
	int32_t ids[64];
	int n;
	int stop_after;
};

static int collect(void *user, int32_t token, const char *text, size_t len)
{
	struct collected *c = user;

	if (c->n < 64)
		c->ids[c->n++] = token;
	return c->stop_after && c->n >= c->stop_after;
}

static void open_engine(void)
{
	struct loom_engine_params p;
	char err[1024];

	loom_engine_params_init(&p);
	p.model = model;
	p.n_ctx = 256;
	engine = loom_engine_open(&p, err, sizeof(err));
	ck_assert_msg(engine != NULL, "%s", err);
}

static void close_engine(void)
{
	loom_engine_close(engine);
}

START_TEST(missing_model_is_named)
{
	struct loom_engine_params p;
	char err[1024] = "";

	loom_engine_params_init(&p);
	p.model = "/nonexistent/m.gguf";
	ck_assert_ptr_null(loom_engine_open(&p, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/m.gguf"));
}
END_TEST

START_TEST(greedy_is_repeatable_and_stoppable)
{
	struct loom_generation_params g;
	struct loom_generation_stats st;
	struct collected a = { .n = 0 }, b = { .n = 0 }, c = { .stop_after = 3 };
	const char *prompt = "The capital of France is";
	char err[1024];

	loom_generation_params_init(&g);
	g.temp = 0;
	g.n_predict = 12;
	ck_assert_msg(loom_generate(engine, prompt, strlen(prompt), &g, collect, &a, &st,
				    err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(st.n_prompt, 5);
	ck_assert_int_eq(st.n_generated, a.n);
	ck_assert_int_gt(a.n, 0);
	ck_assert_int_eq(loom_generate(engine, prompt, strlen(prompt), &g, collect, &b, NULL,
				       err, sizeof(err)), 0);
	ck_assert_int_eq(a.n, b.n);
	ck_assert_mem_eq(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n);
	ck_assert_int_eq(loom_generate(engine, prompt, strlen(prompt), &g, collect, &c, &st,
				       err, sizeof(err)), 0);
	ck_assert_int_eq(st.n_generated, 3);
	ck_assert_mem_eq(a.ids, c.ids, sizeof(int32_t) * 3);
}
END_TEST

START_TEST(context_overflow_is_refused)
{
	struct loom_generation_params g;
	char err[1024] = "";

	loom_generation_params_init(&g);
	g.n_predict = 1000; /* context is 256 */
	ck_assert_int_eq(loom_generate(engine, "hi", 2, &g, NULL, NULL, NULL, err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "context"));
}
END_TEST

START_TEST(tokenize_counts)
{
	int32_t ids[16];
	int64_t n = loom_engine_tokenize(engine, "The capital of France is", 24, false, ids, 16);

	/* SmolLM2's vocabulary: "The", " capital", " of", " France", " is" */
	ck_assert_int_eq(n, 5);
	ck_assert_int_eq(loom_engine_tokenize(engine, "The capital", 11, false, NULL, 0), 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("api");
	TCase *plain = tcase_create("plain"), *with_model = tcase_create("model");
	SRunner *sr;
	int failed;

	model = getenv("LOOM_MODEL");
	tcase_add_test(plain, missing_model_is_named);
	suite_add_tcase(s, plain);
	if (model && access(model, R_OK) == 0) {
		tcase_add_unchecked_fixture(with_model, open_engine, close_engine);
		tcase_set_timeout(with_model, 300);
		tcase_add_test(with_model, greedy_is_repeatable_and_stoppable);
		tcase_add_test(with_model, context_overflow_is_refused);
		tcase_add_test(with_model, tokenize_counts);
		suite_add_tcase(s, with_model);
	} else {
		printf("skip model checks: LOOM_MODEL (%s) not found\n", model ? model : "unset");
	}
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
