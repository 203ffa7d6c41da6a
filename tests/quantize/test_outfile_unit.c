/* test_outfile_unit.c: core/outfile.c (include/loom.h, "output files").
 *
 *  - a commit refused because OUT appeared meanwhile keeps the finished
 *    temporary (named in the error) and leaves OUT alone; a later
 *    loom_outfile_discard_all() leaves the kept file too;
 *  - with --force, a directory at OUT is refused by open, before any work;
 *  - with renameat2's NOREPLACE made to fail (LOOM_TEST_OUTFILE_FAULTS),
 *    and then link(2) too, as on vfat, the commit still writes OUT and
 *    still refuses an OUT that appeared meanwhile;
 *  - SIGINT at random moments while another thread opens and discards
 *    outputs leaves no OUT.XXXXXX.part (the handler may run on either
 *    thread). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

static char dir[64];

static void make_dir(void)
{
	snprintf(dir, sizeof(dir), "/tmp/loom_outfile_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

/* Removes everything in dir and dir; the number of *.part files found. */
static int clean_dir(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[512];
	int parts = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);

		if (e->d_name[0] == '.')
			continue;
		if (n > 5 && !strcmp(e->d_name + n - 5, ".part"))
			parts++;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		if (rmdir(p))
			unlink(p);
	}
	closedir(d);
	rmdir(dir);
	return parts;
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static bool holds(const char *path, const char *text)
{
	char buf[256] = { 0 };
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	return n == strlen(text) && !memcmp(buf, text, n);
}

/* loom_outfile_discard_all() in a child (it stops new temporaries in its
 * process, as a dying process wants). */
static void discard_all_in_child(void)
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		loom_outfile_discard_all();
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Opens OUT, writes, lets OUT appear (someone else's), commits: refused,
 * the result kept under the name the error gives. */
static void refused_commit_keeps_result(void)
{
	char out[128], err[512], kept[512];
	struct loom_outfile *f;
	const char *at;

	make_dir();
	snprintf(out, sizeof(out), "%s/out.gguf", dir);
	f = loom_outfile_open(out, 0, err, sizeof(err));
	ck_assert_msg(f != NULL, "%s", err);
	fputs("hours of results", loom_outfile_stream(f));
	put(out, "someone else's");
	ck_assert_int_eq(loom_outfile_commit(f, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "exists now; the result is kept as ") &&
			      strstr(err, ": rename it, or rerun with --force"),
		      "%s", err);
	at = strstr(err, "kept as ") + strlen("kept as ");
	snprintf(kept, sizeof(kept), "%.*s", (int)(strstr(at, ": rename") - at), at);
	ck_assert_msg(holds(kept, "hours of results"), "kept file %s", kept);
	ck_assert(holds(out, "someone else's"));
	discard_all_in_child(); /* as a later SIGINT would */
	ck_assert_msg(holds(kept, "hours of results"), "the signal table still had %s", kept);
	ck_assert_int_eq(clean_dir(), 1);
}

START_TEST(test_refused_commit_keeps_result)
{
	unsetenv("LOOM_TEST_OUTFILE_FAULTS");
	refused_commit_keeps_result();
}
END_TEST

START_TEST(test_force_over_directory)
{
	char out[128], err[512];

	make_dir();
	snprintf(out, sizeof(out), "%s/out", dir);
	ck_assert_int_eq(mkdir(out, 0700), 0);
	ck_assert_ptr_null(loom_outfile_open(out, LOOM_WRITE_FORCE, err, sizeof(err)));
	ck_assert_msg(strstr(err, "out: is a directory"), "%s", err);
	ck_assert_int_eq(clean_dir(), 0);
}
END_TEST

/* The commit writes OUT, and with the faults given too. */
static void writes_and_refuses(const char *faults)
{
	char out[128], err[512];

	setenv("LOOM_TEST_OUTFILE_FAULTS", faults, 1);
	make_dir();
	snprintf(out, sizeof(out), "%s/a.bin", dir);
	ck_assert_msg(loom_write_file(out, 0, "new", 3, err, sizeof(err)) == 0, "%s: %s", faults,
		      err);
	ck_assert(holds(out, "new"));
	ck_assert_int_eq(loom_write_file(out, 0, "newer", 5, err, sizeof(err)), -1);
	ck_assert_msg(strstr(err, "already exists"), "%s", err);
	ck_assert_msg(loom_write_file(out, LOOM_WRITE_FORCE, "newer", 5, err, sizeof(err)) == 0,
		      "%s", err);
	ck_assert(holds(out, "newer"));
	ck_assert_int_eq(clean_dir(), 0);
	refused_commit_keeps_result();
	unsetenv("LOOM_TEST_OUTFILE_FAULTS");
}

START_TEST(test_without_noreplace)
{
	writes_and_refuses("noreplace");
}
END_TEST

START_TEST(test_without_noreplace_or_links)
{
	writes_and_refuses("noreplace,nolink");
}
END_TEST

static const char *loop_out;

static void on_int(int sig)
{
	(void)sig;
	loom_outfile_discard_all();
	_exit(0);
}

static void *open_discard_loop(void *arg)
{
	char err[256];

	(void)arg;
	for (;;)
		loom_outfile_discard(loom_outfile_open(loop_out, 0, err, sizeof(err)));
	return NULL;
}

/* A child opening and discarding outputs on a second thread, its main
 * thread waiting: SIGINT at a random moment leaves no temporary. */
START_TEST(test_sigint_leaves_no_part)
{
	char out[128];
	int leaks = 0;

	unsetenv("LOOM_TEST_OUTFILE_FAULTS");
	make_dir();
	snprintf(out, sizeof(out), "%s/loop.bin", dir);
	loop_out = out;
	srand((unsigned)getpid());
	signal(SIGINT, on_int); /* inherited: the child has it from its start */
	for (int i = 0; i < 150; i++) {
		pid_t pid = fork();
		struct timespec t = { 0, 200000 + rand() % 1500000 };
		int st;

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			pthread_t th;

			pthread_create(&th, NULL, open_discard_loop, NULL);
			for (;;)
				pause();
		}
		nanosleep(&t, NULL);
		kill(pid, SIGINT);
		waitpid(pid, &st, 0);
		leaks += clean_dir();
		ck_assert_int_eq(mkdir(dir, 0700), 0);
	}
	ck_assert_msg(leaks == 0, "%d of 150 interrupted children left a .part", leaks);
	clean_dir();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("outfile");
	TCase *tc = tcase_create("outfile");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_refused_commit_keeps_result);
	tcase_add_test(tc, test_force_over_directory);
	tcase_add_test(tc, test_without_noreplace);
	tcase_add_test(tc, test_without_noreplace_or_links);
	tcase_add_test(tc, test_sigint_leaves_no_part);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
