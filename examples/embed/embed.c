/* examples/embed: loom inside a C program, through libloom (include/loom.h).
 *
 * Opens a model, streams a greedy completion of a prompt to stdout as it
 * is generated, then prints the run's figures on stderr:
 *
 *   cc embed.c $(pkg-config --cflags --libs loom) -o embed
 *   ./embed MODEL.gguf "The capital of France is" 16
 *
 * Backends and plugins are found as the loom command finds them: beside
 * the installed libloom (<libdir>/loom/backends), LOOM_BACKEND_PATH, or the
 * per-user folder (docs/BACKENDS.md).
 */
#include <loom.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each token's text as it comes (complete UTF-8 characters only). */
static int print_token(void *user, int32_t token, const char *text, size_t len)
{
	(void)user;
	(void)token;
	fwrite(text, 1, len, stdout);
	fflush(stdout);
	return 0; /* non-zero would stop the generation */
}

int main(int argc, char **argv)
{
	struct loom_engine_params ep;
	struct loom_generation_params gp;
	struct loom_generation_stats st;
	struct loom_engine *e;
	char err[1024];
	int rc;

	if (argc < 3 || argc > 4) {
		fprintf(stderr, "usage: %s MODEL.gguf PROMPT [N_TOKENS]\n", argv[0]);
		return 2;
	}
	loom_engine_params_init(&ep); /* every field its default, struct_size set */
	ep.model = argv[1];
	e = loom_engine_open(&ep, err, sizeof(err));
	if (!e) {
		fprintf(stderr, "embed: %s\n", err);
		return 1;
	}
	loom_generation_params_init(&gp);
	gp.n_predict = argc > 3 ? atoi(argv[3]) : 32;
	gp.temp = 0.0f; /* greedy: the same text every run */
	rc = loom_generate(e, argv[2], strlen(argv[2]), &gp, print_token, NULL, &st, err,
			   sizeof(err));
	if (rc) {
		fprintf(stderr, "embed: %s\n", err);
	} else {
		printf("\n");
		fprintf(stderr, "embed: %s on %s: prompt %lld tokens in %.3f s, generated %lld tokens in %.3f s (%.1f t/s)\n",
			loom_engine_model_name(e), loom_engine_backend_name(e),
			(long long)st.n_prompt, st.prompt_seconds, (long long)st.n_generated,
			st.generate_seconds,
			st.generate_seconds > 0 ? (double)st.n_generated / st.generate_seconds : 0.0);
	}
	loom_engine_close(e);
	return rc ? 1 : 0;
}
