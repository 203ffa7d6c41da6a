/* The server's output path (server/serve_gen.c) keeps every token's text,
 * however long: a token of 3000 bytes (longer than the 512-byte buffer the
 * common case uses) reaches the response whole, between its neighbours;
 * and a text that ends inside a character ends with U+FFFD. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "serve_int.h"
#include "synth_vocab.h"

#define LONG_LEN 3000

static void collect(struct job *j, struct gen *g, const char *text, size_t len,
		    bool finished, void *user)
{
	struct sbuf *out = user;

	(void)j;
	(void)g;
	(void)finished;
	sb_putn(out, text, len);
}

START_TEST(long_token_whole)
{
	static char long_tok[LONG_LEN + 1];
	const char *extra[] = { long_tok };
	int32_t types[] = { 1 };
	struct server srv = { 0 };
	struct sbuf out = { 0 };
	struct loom_tokenizer *tok;
	struct job *j;
	struct gen *g;
	char want[LONG_LEN + 3];

	memset(long_tok, 'a', LONG_LEN); /* 'a' is its own byte symbol */
	tok = synth_vocab(extra, types, 1);
	srv.tok = tok;
	atomic_init(&srv.hard_stop, false);
	j = job_new(&srv);
	ck_assert_ptr_nonnull(j);
	j->max_tokens = 16;
	g = &j->gens[0];
	/* what the engine thread would have appended: 'x', the long token, 'y' */
	g->toks = malloc(3 * sizeof(int32_t));
	ck_assert_ptr_nonnull(g->toks);
	g->toks[0] = 'x';
	g->toks[1] = 256;
	g->toks[2] = 'y';
	g->n_toks = g->cap_toks = 3;
	g->submitted = g->sched_done = true;
	g->finish = LOOM_FINISH_LENGTH;
	ck_assert(job_advance(j, 0, collect, &out));
	want[0] = 'x';
	memset(want + 1, 'a', LONG_LEN);
	want[LONG_LEN + 1] = 'y';
	want[LONG_LEN + 2] = '\0';
	ck_assert_uint_eq(out.len, LONG_LEN + 2);
	ck_assert(!memcmp(out.s, want, LONG_LEN + 2));
	ck_assert_int_eq(g->n_out, 3);
	ck_assert_str_eq(g->finish_reason, "length");
	sb_free(&out);
	job_put(j);
	loom_tokenizer_free(tok);
}
END_TEST

/* Tokens that end inside a character (0xc3, the first byte of a two-byte
 * one) end the text with U+FFFD whether max_tokens cuts them (the server's
 * own count) or the engine reports the length; never with the byte
 * dropped unseen. */
static void partial_end(int max_tokens, enum loom_finish fin, const char *reason)
{
	struct server srv = { 0 };
	struct sbuf out = { 0 };
	struct loom_tokenizer *tok = synth_vocab(NULL, NULL, 0);
	struct job *j;
	struct gen *g;

	srv.tok = tok;
	atomic_init(&srv.hard_stop, false);
	j = job_new(&srv);
	ck_assert_ptr_nonnull(j);
	j->max_tokens = max_tokens;
	g = &j->gens[0];
	g->toks = malloc(2 * sizeof(int32_t));
	ck_assert_ptr_nonnull(g->toks);
	g->toks[0] = 'x';
	g->toks[1] = 0xc3;
	g->n_toks = g->cap_toks = 2;
	g->submitted = g->sched_done = true;
	g->finish = fin;
	ck_assert(job_advance(j, 0, collect, &out));
	ck_assert_uint_eq(out.len, 4);
	ck_assert(!memcmp(out.s, "x\xef\xbf\xbd", 4));
	ck_assert_str_eq(g->finish_reason, reason);
	sb_free(&out);
	job_put(j);
	loom_tokenizer_free(tok);
}

START_TEST(unfinished_character_at_the_end)
{
	partial_end(2, LOOM_FINISH_LENGTH, "length");  /* max_tokens reached */
	partial_end(16, LOOM_FINISH_LENGTH, "length"); /* the engine's count */
	partial_end(16, LOOM_FINISH_EOG, "stop");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("gen_detok");
	TCase *tc = tcase_create("all");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, long_token_whole);
	tcase_add_test(tc, unfinished_character_at_the_end);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
