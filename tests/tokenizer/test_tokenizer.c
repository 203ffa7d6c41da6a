/* test_tokenizer.c: core/text/tokenizer.c against independent references.
 *
 * usage: test_tokenizer unit
 *        test_tokenizer vectors
 *        test_tokenizer model PYTHON3 vocab_ids.py
 *
 * unit: synthetic vocabularies written as GGUF in memory, expected ids
 * computed by hand (merge order, <unk>, special kinds, every pre-tokenizer
 * family, malformed metadata).
 * vectors: every *.gguf under $LOOM_SHARED_DIR/data/tokenizer with its .inp
 * (inputs, each followed by "\n__ggml_vocab_test__\n") and .out (one line
 * of ids per input, produced by the reference HF tokenizers: no BOS,
 * special-token text not parsed). Also round trips, streaming UTF-8 and
 * special-token handling on those vocabularies.
 * model: the real model ($LOOM_MODEL, gpt2 model with smollm pre); the ids
 * of <|im_start|> / <|im_end|> come from the gguf Python package.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "format/gguf.h"
#include "text/tokenizer.h"

#define SEP "\n__ggml_vocab_test__\n"
#define MAX_IDS 4096

static char *data_dir;     /* $LOOM_SHARED_DIR/data/tokenizer */
static const char *model_path;
static const char *python3, *ids_script;

/* ---- helpers ----------------------------------------------------------- */

static char *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET))
		goto out;
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
		goto out;
	}
	if (buf) {
		buf[n] = 0;
		*len = (size_t)n;
	}
out:
	fclose(f);
	return buf;
}

/* Printable form of s for failure messages (static buffer). */
static const char *esc(const char *s, size_t n)
{
	static char out[4096];
	size_t k = 0;

	for (size_t i = 0; i < n && k + 8 < sizeof(out); i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '\n')
			k += (size_t)sprintf(out + k, "\\n");
		else if (c == '\t')
			k += (size_t)sprintf(out + k, "\\t");
		else if (c < 0x20 || c == 0x7f)
			k += (size_t)sprintf(out + k, "\\x%02x", c);
		else
			out[k++] = (char)c;
	}
	out[k] = 0;
	return out;
}

static void ids_str(const int32_t *ids, int64_t n, char *out, size_t cap)
{
	size_t k = 0;

	out[0] = 0;
	for (int64_t i = 0; i < n && k + 16 < cap; i++)
		k += (size_t)snprintf(out + k, cap - k, " %d", ids[i]);
}

static struct loom_tokenizer *open_tok(const char *path)
{
	char err[256] = "";
	struct gguf_file *f = gguf_open(path, err, sizeof(err));
	struct loom_tokenizer *t;

	ck_assert_msg(f != NULL, "gguf_open %s: %s", path, err);
	t = loom_tokenizer_from_gguf(f, err, sizeof(err));
	ck_assert_msg(t != NULL, "tokenizer from %s: %s", path, err);
	gguf_close(f);
	return t;
}

static int64_t tok(const struct loom_tokenizer *t, const char *s, size_t n, bool add,
		   bool special, int32_t *ids)
{
	int64_t r = loom_tokenize(t, s, n, add, special, ids, MAX_IDS);

	ck_assert_msg(r >= 0 && r <= MAX_IDS, "tokenize '%s' returned %lld", esc(s, n),
		      (long long)r);
	return r;
}

/* Streaming detokenization of ids; also checks that no chunk ends inside a
 * UTF-8 sequence when the whole text is valid UTF-8. */
static size_t detok_all(const struct loom_tokenizer *t, const int32_t *ids, int64_t n,
			char *out, size_t cap)
{
	struct loom_detok st = { .n_pending = 0, .first = true };
	size_t k = 0;

	for (int64_t i = 0; i < n; i++) {
		int r = loom_detokenize(t, &st, ids[i], out + k, cap - k);

		ck_assert_msg(r >= 0, "detokenize id %d failed", ids[i]);
		ck_assert_int_eq(out[k + (size_t)r], 0); /* NUL-terminated */
		k += (size_t)r;
	}
	/* End of stream: an incomplete sequence (invalid input) is still held
	 * in st.pending; the header has no flush call, so take it from there. */
	ck_assert_uint_lt(k + (size_t)st.n_pending, cap);
	memcpy(out + k, st.pending, (size_t)st.n_pending);
	k += (size_t)st.n_pending;
	out[k] = 0;
	return k;
}

static bool valid_utf8(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		size_t len = s[i] < 0x80 ? 1 : s[i] < 0xc2 ? 0 : s[i] < 0xe0 ? 2 :
			     s[i] < 0xf0 ? 3 : s[i] < 0xf5 ? 4 : 0;

		if (!len || len > n - i)
			return false;
		for (size_t j = 1; j < len; j++)
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
		i += len;
	}
	return true;
}

/* Parses " 1 2 3" into ids. */
static int64_t parse_ids(const char *line, size_t n, int32_t *ids)
{
	int64_t k = 0;
	size_t i = 0;

	while (i < n) {
		while (i < n && line[i] == ' ')
			i++;
		if (i == n)
			break;
		ck_assert_msg(line[i] >= '0' && line[i] <= '9', "bad .out line '%s'",
			      esc(line, n));
		long v = 0;
		while (i < n && line[i] >= '0' && line[i] <= '9')
			v = v * 10 + (line[i++] - '0');
		ck_assert_int_lt(k, MAX_IDS);
		ids[k++] = (int32_t)v;
	}
	return k;
}

/* ---- the shared vectors ------------------------------------------------ */

struct vcase {
	const char *in;
	size_t in_len;
	const char *out;
	size_t out_len;
};

struct vfile {
	char *inp, *outp;
	struct vcase c[256];
	int n;
};

/* Splits .inp on SEP (every input is followed by one, nothing after the
 * last) and .out on newlines (one line per input). */
static void load_vectors(const char *gguf_path, struct vfile *v)
{
	char path[4096];
	size_t ni, no;
	const char *p, *end;
	int k;

	snprintf(path, sizeof(path), "%s.inp", gguf_path);
	v->inp = read_all(path, &ni);
	ck_assert_msg(v->inp != NULL, "cannot read %s", path);
	snprintf(path, sizeof(path), "%s.out", gguf_path);
	v->outp = read_all(path, &no);
	ck_assert_msg(v->outp != NULL, "cannot read %s", path);
	v->n = 0;
	p = v->inp;
	end = v->inp + ni;
	while (p < end) {
		const char *s = memmem(p, (size_t)(end - p), SEP, strlen(SEP));

		ck_assert_msg(s != NULL, "%s.inp: text after the last separator", gguf_path);
		ck_assert_int_lt(v->n, 256);
		v->c[v->n].in = p;
		v->c[v->n].in_len = (size_t)(s - p);
		v->n++;
		p = s + strlen(SEP);
	}
	p = v->outp;
	end = v->outp + no;
	for (k = 0; p < end; k++) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));

		ck_assert_msg(nl != NULL, "%s.out: last line lacks a newline", gguf_path);
		ck_assert_msg(k < v->n, "%s.out: more lines than inputs", gguf_path);
		v->c[k].out = p;
		v->c[k].out_len = (size_t)(nl - p);
		p = nl + 1;
	}
	ck_assert_msg(k == v->n, "%s: %d inputs but %d output lines", gguf_path, v->n, k);
}

static void free_vectors(struct vfile *v)
{
	free(v->inp);
	free(v->outp);
}

/* Calls fn for every *.gguf in the data dir; returns how many. */
static int for_each_vocab(void (*fn)(const char *path))
{
	DIR *d = opendir(data_dir);
	struct dirent *e;
	int n = 0;

	ck_assert_msg(d != NULL, "cannot open %s", data_dir);
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		char path[4096];

		if (l < 5 || strcmp(e->d_name + l - 5, ".gguf"))
			continue;
		snprintf(path, sizeof(path), "%s/%s", data_dir, e->d_name);
		fn(path);
		n++;
	}
	closedir(d);
	return n;
}

static uint32_t vectors_bucket_min = LOOM_TOKENIZER_BUCKET_MIN;

static void check_vectors(const char *path)
{
	static int32_t got[MAX_IDS], want[MAX_IDS];
	struct loom_tokenizer *t = open_tok(path);
	struct vfile v;

	loom_tokenizer_set_bucket_min(t, vectors_bucket_min);
	load_vectors(path, &v);
	for (int i = 0; i < v.n; i++) {
		int64_t ng = tok(t, v.c[i].in, v.c[i].in_len, false, false, got);
		int64_t nw = parse_ids(v.c[i].out, v.c[i].out_len, want);
		char sw[8192], sg[8192];

		if (ng == nw && !memcmp(got, want, (size_t)ng * sizeof(*got)))
			continue;
		ids_str(want, nw, sw, sizeof(sw));
		ids_str(got, ng, sg, sizeof(sg));
		ck_abort_msg("%s: input %d '%s'\n expected:%s\n got:     %s", path, i,
			     esc(v.c[i].in, v.c[i].in_len), sw, sg);
	}
	fprintf(stderr, "%s: %d vectors match\n", path, v.n);
	free_vectors(&v);
	loom_tokenizer_free(t);
}

START_TEST(test_vectors)
{
	ck_assert_int_gt(for_each_vocab(check_vectors), 0);
}
END_TEST

/* The reference ids again, with every word merged through the queue of
 * buckets that long runs use (core/text/tokenizer.c), short ones too. */
START_TEST(test_vectors_buckets)
{
	vectors_bucket_min = 0;
	ck_assert_int_gt(for_each_vocab(check_vectors), 0);
	vectors_bucket_min = LOOM_TOKENIZER_BUCKET_MIN;
}
END_TEST

/* Long runs from small alphabets (repeats, where merge order on equal
 * priorities decides; and mixes, where a walk meets better candidates)
 * give the same ids by the heap and by the buckets. */
static void check_buckets_equal_heap(const char *path)
{
	static const char *pools[] = { " ", "a", "ab", " a", "\n ", "aab ", "123",
				       "!=", "\xe4\xb8\xad", "e t\nhs.", "ab\xc3\xa9 ,'" };
	static int32_t heap_ids[MAX_IDS], bucket_ids[MAX_IDS];
	static char in[3000];
	struct loom_tokenizer *t = open_tok(path);
	uint64_t x = 0x2545f4914f6cdd1dull;

	for (int i = 0; i < 300; i++) {
		const char *pool = pools[i % (sizeof(pools) / sizeof(*pools))];
		size_t np = strlen(pool), n;

		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		n = 1 + x % (sizeof(in) - 1);
		for (size_t j = 0; j < n; j++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			/* runs: keep the previous byte three times in four */
			in[j] = j && x % 4 ? in[j - 1] : pool[(x >> 8) % np];
		}
		loom_tokenizer_set_bucket_min(t, UINT32_MAX);
		int64_t a = loom_tokenize(t, in, n, false, false, heap_ids, MAX_IDS);
		loom_tokenizer_set_bucket_min(t, 0);
		int64_t b = loom_tokenize(t, in, n, false, false, bucket_ids, MAX_IDS);

		ck_assert_msg(a >= 0 && a <= MAX_IDS, "%s: tokenize returned %lld", path,
			      (long long)a);
		ck_assert_msg(a == b && !memcmp(heap_ids, bucket_ids, (size_t)a * sizeof(int32_t)),
			      "%s: case %d ('%.60s...', %zu bytes): heap %lld ids, buckets %lld",
			      path, i, esc(in, n), n, (long long)a, (long long)b);
	}
	loom_tokenizer_free(t);
}

START_TEST(test_buckets_equal_heap)
{
	ck_assert_int_gt(for_each_vocab(check_buckets_equal_heap), 0);
}
END_TEST

/* detokenize(tokenize(x)) == x for every input; all current vocabularies
 * represent any byte string (spm: <0xXX> byte fallback, gpt2: byte level),
 * so there are no exceptions. Every streamed chunk must be valid UTF-8. */
static void check_roundtrip(const char *path)
{
	static int32_t ids[MAX_IDS];
	static char out[1 << 16];
	struct loom_tokenizer *t = open_tok(path);
	struct vfile v;

	load_vectors(path, &v);
	for (int i = 0; i < v.n; i++) {
		int64_t n = tok(t, v.c[i].in, v.c[i].in_len, false, false, ids);
		struct loom_detok st = { .n_pending = 0, .first = true };
		size_t k = 0;

		for (int64_t j = 0; j < n; j++) {
			int r = loom_detokenize(t, &st, ids[j], out + k, sizeof(out) - k);

			ck_assert_int_ge(r, 0);
			ck_assert_msg(valid_utf8((unsigned char *)out + k, (size_t)r),
				      "%s: input %d: chunk %lld is not complete UTF-8", path, i,
				      (long long)j);
			k += (size_t)r;
		}
		ck_assert_int_eq(st.n_pending, 0);
		ck_assert_msg(k == v.c[i].in_len && !memcmp(out, v.c[i].in, k),
			      "%s: round trip of input %d '%s' gave '%s'", path, i,
			      esc(v.c[i].in, v.c[i].in_len), esc(out, k));
	}
	free_vectors(&v);
	loom_tokenizer_free(t);
}

START_TEST(test_roundtrip)
{
	ck_assert_int_gt(for_each_vocab(check_roundtrip), 0);
}
END_TEST

/* Arbitrary bytes (invalid UTF-8 included) survive the round trip too:
 * spm through <0xXX> byte fallback, gpt2 through the byte-level map. */
static void check_random_roundtrip(const char *path)
{
	static const char pool[] = "ab  \n\t'sT9\xc3\xa9\xe6\x88\x91\xf0\x9f\xa6\x99\xff\x80\xc3";
	static int32_t ids[MAX_IDS];
	static char in[128], out[1 << 12];
	struct loom_tokenizer *t = open_tok(path);
	uint64_t x = 88172645463325252ull;

	for (int i = 0; i < 500; i++) {
		size_t n;

		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		n = x % 64;
		for (size_t j = 0; j < n; j++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			in[j] = (x >> 32) % 3 ? pool[x % (sizeof(pool) - 1)] : (char)(x >> 40);
		}
		int64_t k = tok(t, in, n, false, false, ids);
		size_t m = detok_all(t, ids, k, out, sizeof(out));

		ck_assert_msg(m == n && !memcmp(out, in, n), "%s: round trip of '%s' failed",
			      path, esc(in, n));
	}
	loom_tokenizer_free(t);
}

START_TEST(test_random_roundtrip)
{
	ck_assert_int_gt(for_each_vocab(check_random_roundtrip), 0);
}
END_TEST

static char *vocab_path(const char *name)
{
	static char path[4096];
	struct stat sb;

	snprintf(path, sizeof(path), "%s/%s", data_dir, name);
	ck_assert_msg(stat(path, &sb) == 0, "missing %s", path);
	return path;
}

/* Id of the token whose stored text is s (a plain scan of the vocabulary,
 * independent of the tokenizing code). */
static int32_t find_text(const struct loom_tokenizer *t, const char *s)
{
	for (int32_t i = 0; i < loom_tokenizer_n_vocab(t); i++)
		if (!strcmp(loom_token_text(t, i), s))
			return i;
	ck_abort_msg("no token with text '%s'", s);
	return -1;
}

/* Streaming: a 4-byte character delivered as four spm byte tokens and a
 * 2-byte one as two gpt2 byte-level tokens come out only when complete. */
START_TEST(test_stream_utf8)
{
	struct loom_tokenizer *t = open_tok(vocab_path("ggml-vocab-llama-spm.gguf"));
	static const char *bytes[] = { "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>" };
	struct loom_detok st = { .n_pending = 0, .first = true };
	char out[64];

	/* "▁Hi" first: the leading space of the first piece is dropped. */
	ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, "\xe2\x96\x81Hi"), out, sizeof(out)), 2);
	ck_assert_str_eq(out, "Hi");
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, bytes[i]), out, sizeof(out)), 0);
		ck_assert_str_eq(out, "");
		ck_assert_int_eq(st.n_pending, i + 1);
	}
	/* Too small a buffer fails and leaves the state alone. */
	ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, bytes[3]), out, 4), -1);
	ck_assert_int_eq(st.n_pending, 3);
	ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, bytes[3]), out, sizeof(out)), 4);
	ck_assert_str_eq(out, "\xf0\x9f\xa6\x99");
	ck_assert_int_eq(st.n_pending, 0);
	/* Later pieces keep their space; control tokens give nothing. */
	ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, "\xe2\x96\x81Hi"), out, sizeof(out)), 3);
	ck_assert_str_eq(out, " Hi");
	ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, "</s>"), out, sizeof(out)), 0);
	ck_assert_int_eq(loom_detokenize(t, &st, -1, out, sizeof(out)), -1);
	ck_assert_int_eq(loom_detokenize(t, &st, loom_tokenizer_n_vocab(t), out, sizeof(out)), -1);
	loom_tokenizer_free(t);

	/* gpt2: bytes_to_unicode maps 0xC3 to U+00C3 and 0xA9 to U+00A9. */
	t = open_tok(vocab_path("ggml-vocab-gpt-2.gguf"));
	st = (struct loom_detok){ .n_pending = 0, .first = true };
	ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, "\xc3\x83"), out, sizeof(out)), 0);
	ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, "\xc2\xa9"), out, sizeof(out)), 2);
	ck_assert_str_eq(out, "\xc3\xa9");
	/* gpt2 keeps a first leading space ("Ġ" is U+0120, byte 0x20). */
	st.first = true;
	ck_assert_int_eq(loom_detokenize(t, &st, find_text(t, "\xc4\xa0the"), out, sizeof(out)), 4);
	ck_assert_str_eq(out, " the");
	loom_tokenizer_free(t);
}
END_TEST

START_TEST(test_special_and_flags)
{
	struct loom_tokenizer *t = open_tok(vocab_path("ggml-vocab-gpt-2.gguf"));
	static int32_t ids[MAX_IDS];
	const char *s = "a<|endoftext|>b";
	int32_t eot = find_text(t, "<|endoftext|>");
	int64_t n;

	/* parse_special: the control token is one id, text around it normal. */
	n = tok(t, s, strlen(s), false, true, ids);
	ck_assert_int_eq(n, 3);
	ck_assert_int_eq(ids[0], find_text(t, "a"));
	ck_assert_int_eq(ids[1], eot);
	ck_assert_int_eq(ids[2], find_text(t, "b"));
	n = tok(t, s, strlen(s), false, false, ids);
	ck_assert_int_gt(n, 3);
	for (int64_t i = 0; i < n; i++)
		ck_assert_int_ne(ids[i], eot);
	/* gpt2 file has no add_bos_token: no BOS even with add_special. */
	ck_assert_int_eq(tok(t, "a", 1, true, false, ids), 1);
	ck_assert(loom_tokenizer_is_eog(t, eot));
	ck_assert(!loom_tokenizer_is_eog(t, ids[0]));
	/* Too small an output buffer: the needed count, first ids written. */
	int32_t small[2] = { -7, -7 };
	ck_assert_int_eq(loom_tokenize(t, "Hello world again", 17, false, false, small, 1), 3);
	ck_assert_int_eq(small[0], find_text(t, "Hello"));
	ck_assert_int_eq(small[1], -7);
	ck_assert_int_eq(loom_tokenize(t, NULL, 3, false, false, ids, MAX_IDS), -1);
	ck_assert_int_eq(loom_tokenize(t, "", 0, false, false, NULL, 0), 0);
	loom_tokenizer_free(t);

	/* spm: add_bos_token true, BOS id 1 in the file; EOS </s> is eog. */
	t = open_tok(vocab_path("ggml-vocab-llama-spm.gguf"));
	ck_assert_int_eq(loom_tokenizer_bos(t), find_text(t, "<s>"));
	ck_assert_int_eq(loom_tokenizer_eos(t), find_text(t, "</s>"));
	n = tok(t, "Hello", 5, true, false, ids);
	ck_assert_int_eq(n, 2);
	ck_assert_int_eq(ids[0], loom_tokenizer_bos(t));
	ck_assert_int_eq(ids[1], find_text(t, "\xe2\x96\x81Hello"));
	ck_assert(loom_tokenizer_is_eog(t, loom_tokenizer_eos(t)));
	/* After a special token the text gets the space prefix again. */
	s = "<s>Hello";
	n = tok(t, s, strlen(s), false, true, ids);
	ck_assert_int_eq(n, 2);
	ck_assert_int_eq(ids[0], find_text(t, "<s>"));
	ck_assert_int_eq(ids[1], find_text(t, "\xe2\x96\x81Hello"));
	/* Invalid UTF-8 goes through byte fallback and comes back intact. */
	static char out[256];
	const char *bad = "x\xff\xc3(";
	n = tok(t, bad, 4, false, false, ids);
	ck_assert_uint_eq(detok_all(t, ids, n, out, sizeof(out)), 4);
	ck_assert_mem_eq(out, bad, 4);
	loom_tokenizer_free(t);
}
END_TEST

/* ---- the real model ---------------------------------------------------- */

/* Ids of texts looked up by vocab_ids.py (gguf package). */
static void python_ids(const char *const *texts, int n, int32_t *ids, int32_t *types)
{
	char cmd[8192];
	size_t k;
	FILE *p;

	k = (size_t)snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s'", python3, ids_script,
			     model_path);
	for (int i = 0; i < n; i++)
		k += (size_t)snprintf(cmd + k, sizeof(cmd) - k, " '%s'", texts[i]);
	p = popen(cmd, "r");
	ck_assert_msg(p != NULL, "cannot run %s", cmd);
	for (int i = 0; i < n; i++)
		ck_assert_msg(fscanf(p, "%d %d", &ids[i], &types[i]) == 2,
			      "vocab_ids.py gave no answer for '%s'", texts[i]);
	ck_assert_int_eq(pclose(p), 0);
}

START_TEST(test_model_special)
{
	static const char *const texts[] = { "<|im_start|>", "<|im_end|>", "<|endoftext|>" };
	struct loom_tokenizer *t = open_tok(model_path);
	static int32_t ids[MAX_IDS];
	static char out[256];
	const char *s = "<|im_start|>user\nHi<|im_end|>";
	int32_t want[3], types[3];
	int64_t n;

	python_ids(texts, 3, want, types);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_ge(want[i], 0);
		ck_assert_int_eq(types[i], 3); /* CONTROL */
	}
	/* add_special: the file says add_bos_token = false. */
	n = tok(t, s, strlen(s), true, true, ids);
	ck_assert_int_ge(n, 3);
	ck_assert_int_eq(ids[0], want[0]);
	ck_assert_int_eq(ids[n - 1], want[1]);
	for (int64_t i = 1; i < n - 1; i++)
		ck_assert(ids[i] != want[0] && ids[i] != want[1]);
	ck_assert_uint_eq(detok_all(t, ids + 1, n - 2, out, sizeof(out)), 7);
	ck_assert_str_eq(out, "user\nHi");
	/* Control tokens detokenize to nothing. */
	ck_assert_uint_eq(detok_all(t, ids, n, out, sizeof(out)), 7);
	/* Without parse_special the markers are plain text. */
	n = tok(t, s, strlen(s), false, false, ids);
	for (int64_t i = 0; i < n; i++)
		ck_assert(ids[i] != want[0] && ids[i] != want[1]);
	ck_assert_uint_eq(detok_all(t, ids, n, out, sizeof(out)), strlen(s));
	ck_assert_str_eq(out, s);
	/* End of generation: <|im_end|> and <|endoftext|>, not <|im_start|>. */
	ck_assert(loom_tokenizer_is_eog(t, want[1]));
	ck_assert(loom_tokenizer_is_eog(t, want[2]));
	ck_assert(!loom_tokenizer_is_eog(t, want[0]));
	loom_tokenizer_free(t);
}
END_TEST

/* CPU seconds of this process, not wall time: the hang guards below must
 * not fire because a loaded machine (the suite runs tests side by side)
 * gave the test less of a core; a quadratic path still costs minutes of
 * CPU. */
static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 10 KB of prose and 10 KB with no pre-token boundary, on the 49k vocab:
 * both round-trip; their timings are printed, not asserted (speed targets
 * belong in benchmarks, not unit tests). */
START_TEST(test_model_speed)
{
	struct loom_tokenizer *t = open_tok(model_path);
	static const char *words[] = { "the ", "quick ", "brown ", "fox ", "jumps ", "over ",
				       "lazy ", "dogs, ", "and ", "42 ", "\xc3\xa9t\xc3\xa9 ", "\n" };
	static char text[10240 + 16], out[1 << 15];
	static int32_t ids[1 << 14];
	size_t len = 0;
	double t0;
	int64_t n;

	for (int i = 0; len < 10240; i++) {
		const char *w = words[(i * 7) % 12];

		memcpy(text + len, w, strlen(w));
		len += strlen(w);
	}
	t0 = now();
	n = loom_tokenize(t, text, len, false, false, ids, 1 << 14);
	double dt = now() - t0;
	ck_assert_int_gt(n, 0);
	ck_assert_uint_eq(detok_all(t, ids, n, out, sizeof(out)), len);
	ck_assert_mem_eq(out, text, len);
	fprintf(stderr, "10 KB prose: %lld tokens in %.2f ms\n", (long long)n, dt * 1e3);

	memset(text, 'a', 10240);
	t0 = now();
	n = loom_tokenize(t, text, 10240, false, false, ids, 1 << 14);
	dt = now() - t0;
	ck_assert_int_gt(n, 0);
	fprintf(stderr, "10 KB one word: %lld tokens in %.2f ms\n", (long long)n, dt * 1e3);
	loom_tokenizer_free(t);
}
END_TEST

/* ---- synthetic vocabularies (GGUF built in memory) --------------------- */

/* A tiny GGUF v3 writer: key/value pairs only, no tensors. */
struct gb {
	unsigned char *p;
	size_t n, cap;
	uint64_t n_kv;
};

static void gb_raw(struct gb *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 256;
		b->p = realloc(b->p, b->cap);
		ck_assert_ptr_nonnull(b->p);
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void gb_u32(struct gb *b, uint32_t v) { gb_raw(b, &v, 4); }
static void gb_u64(struct gb *b, uint64_t v) { gb_raw(b, &v, 8); }

static void gb_str(struct gb *b, const char *s)
{
	gb_u64(b, strlen(s));
	gb_raw(b, s, strlen(s));
}

static void kv_key(struct gb *b, const char *key, uint32_t type)
{
	gb_str(b, key);
	gb_u32(b, type);
	b->n_kv++;
}

static void kv_str(struct gb *b, const char *key, const char *v)
{
	kv_key(b, key, GGUF_STRING);
	gb_str(b, v);
}

static void kv_u32(struct gb *b, const char *key, uint32_t v)
{
	kv_key(b, key, GGUF_U32);
	gb_u32(b, v);
}

static void kv_bool(struct gb *b, const char *key, bool v)
{
	unsigned char c = v;

	kv_key(b, key, GGUF_BOOL);
	gb_raw(b, &c, 1);
}

static void kv_strs(struct gb *b, const char *key, const char *const *v, size_t n)
{
	kv_key(b, key, GGUF_ARRAY);
	gb_u32(b, GGUF_STRING);
	gb_u64(b, n);
	for (size_t i = 0; i < n; i++)
		gb_str(b, v[i]);
}

static void kv_arr(struct gb *b, const char *key, uint32_t type, const void *v, size_t n)
{
	kv_key(b, key, GGUF_ARRAY);
	gb_u32(b, type);
	gb_u64(b, n);
	gb_raw(b, v, 4 * n);
}

/* Header + body, opened from memory; *mem must outlive the file. */
static struct gguf_file *gb_open(struct gb *b, unsigned char **mem)
{
	struct gb h = { 0 };
	char err[256] = "";
	struct gguf_file *f;

	gb_raw(&h, "GGUF", 4);
	gb_u32(&h, 3);
	gb_u64(&h, 0);
	gb_u64(&h, b->n_kv);
	gb_raw(&h, b->p, b->n);
	f = gguf_open_memory(h.p, h.n, err, sizeof(err));
	ck_assert_msg(f != NULL, "synthetic gguf: %s", err);
	free(b->p);
	*mem = h.p;
	return f;
}

static struct loom_tokenizer *gb_tok(struct gb *b, char *err, size_t errlen)
{
	unsigned char *mem;
	struct gguf_file *f = gb_open(b, &mem);
	struct loom_tokenizer *t = loom_tokenizer_from_gguf(f, err, errlen);

	gguf_close(f);
	free(mem); /* the tokenizer keeps its own copies */
	return t;
}

/* spm vocab: <unk> <s> </s> ▁ a b ab ba ▁a z? with chosen scores. */
static struct loom_tokenizer *spm_synth(float ba_score, int space_prefix)
{
	static const char *toks[] = { "<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b",
				      "ab", "ba", "\xe2\x96\x81" "a" };
	int32_t types[] = { 2, 3, 3, 1, 1, 1, 1, 1, 1 };
	float scores[] = { 0, 0, 0, -5, -3, -3, -1, ba_score, -0.1f };
	struct gb b = { 0 };
	char err[256] = "";
	struct loom_tokenizer *t;

	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 9);
	kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, types, 9);
	kv_arr(&b, "tokenizer.ggml.scores", GGUF_F32, scores, 9);
	if (space_prefix >= 0)
		kv_bool(&b, "tokenizer.ggml.add_space_prefix", space_prefix);
	t = gb_tok(&b, err, sizeof(err));
	ck_assert_msg(t != NULL, "%s", err);
	return t;
}

static void expect_ids(const struct loom_tokenizer *t, const char *s, const int32_t *want,
		       int64_t n)
{
	static int32_t ids[MAX_IDS];
	int64_t got = tok(t, s, strlen(s), false, true, ids);
	char sw[512], sg[512];

	ids_str(want, n, sw, sizeof(sw));
	ids_str(ids, got, sg, sizeof(sg));
	ck_assert_msg(got == n && !memcmp(ids, want, (size_t)n * 4),
		      "'%s': expected%s got%s", esc(s, strlen(s)), sw, sg);
}

/* Hand-computed merges: best score first, leftmost on ties; unknown
 * characters without byte tokens become <unk>. */
START_TEST(test_spm_merge_order)
{
	struct loom_tokenizer *t = spm_synth(-1, 0);

	/* "aba": ab(-1) and ba(-1) tie, the left pair wins -> ab a */
	expect_ids(t, "aba", (int32_t[]){ 6, 4 }, 2);
	loom_tokenizer_free(t);
	t = spm_synth(-0.5f, 0);
	/* ba(-0.5) beats ab(-1) -> a ba */
	expect_ids(t, "aba", (int32_t[]){ 4, 7 }, 2);
	/* no 'z' and no byte tokens -> <unk> */
	expect_ids(t, "az", (int32_t[]){ 4, 0 }, 2);
	/* control text is matched only with parse_special (expect_ids uses it) */
	expect_ids(t, "a</s>", (int32_t[]){ 4, 2 }, 2);
	loom_tokenizer_free(t);
	/* default add_space_prefix (true): "a" -> "▁a"; after <s> again. */
	t = spm_synth(-1, -1);
	expect_ids(t, "a", (int32_t[]){ 8 }, 1);
	expect_ids(t, "<s>a", (int32_t[]){ 1, 8 }, 2);
	expect_ids(t, "", (int32_t[]){ 0 }, 0);
	loom_tokenizer_free(t);
}
END_TEST

/* spm vocab for the merge queue's order: ids 3.. are the texts given. */
static struct loom_tokenizer *spm_scored(const char *const *texts, const float *scores, int n)
{
	const char *toks[16] = { "<unk>", "<s>", "</s>" };
	int32_t types[16] = { 2, 3, 3 };
	float sc[16] = { 0 };
	struct gb b = { 0 };
	char err[256] = "";
	struct loom_tokenizer *t;

	ck_assert_int_le(n, 13);
	for (int i = 0; i < n; i++) {
		toks[3 + i] = texts[i];
		types[3 + i] = 1;
		sc[3 + i] = scores[i];
	}
	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, (uint64_t)(3 + n));
	kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, types, (uint64_t)(3 + n));
	kv_arr(&b, "tokenizer.ggml.scores", GGUF_F32, sc, (uint64_t)(3 + n));
	kv_bool(&b, "tokenizer.ggml.add_space_prefix", 0);
	t = gb_tok(&b, err, sizeof(err));
	ck_assert_msg(t != NULL, "%s", err);
	return t;
}

/* Both merge queues (one heap; buckets by priority) on hand-computed
 * cases where the order of equal priorities decides the result. */
START_TEST(test_merge_queue_order)
{
	/* Ties made during a walk: "abcd" merges ab (-1), which makes abc
	 * (-1) at position 0, left of cd (-1) at 2: abc first -> abc d. */
	static const char *t1[] = { "a", "b", "c", "d", "ab", "abc", "cd" };
	static const float s1[] = { -9, -9, -9, -9, -1, -1, -1 };
	/* Candidates filed out of order: de (-1) makes cde (-3) at 2, then
	 * ab (-2) makes abc (-3) at 0; the leftmost of the tie wins ->
	 * abc de, not ab cde. */
	static const char *t2[] = { "a", "b", "c", "d", "e", "de", "ab", "abc", "cde" };
	static const float s2[] = { -9, -9, -9, -9, -9, -1, -2, -3, -3 };
	/* A walk that makes a better candidate stops for it: ab (-2) makes
	 * abc (-1), which goes before cd (-2) -> abc d. */
	static const char *t4[] = { "a", "b", "c", "d", "ab", "cd", "abc" };
	static const float s4[] = { -9, -9, -9, -9, -2, -2, -1 };
	/* Negative and positive zero are one priority: leftmost wins. */
	static const char *t3[] = { "a", "b", "ab", "ba", "bb" };
	static const float s3[] = { -9, -9, -0.0f, 0.0f, -9 };

	for (uint32_t min = 0; min <= 1; min++) {
		uint32_t bmin = min ? UINT32_MAX : 0;
		struct loom_tokenizer *t = spm_scored(t1, s1, 7);

		loom_tokenizer_set_bucket_min(t, bmin);
		expect_ids(t, "abcd", (int32_t[]){ 8, 6 }, 2);
		loom_tokenizer_free(t);
		t = spm_scored(t2, s2, 9);
		loom_tokenizer_set_bucket_min(t, bmin);
		expect_ids(t, "abcde", (int32_t[]){ 10, 8 }, 2);
		loom_tokenizer_free(t);
		t = spm_scored(t4, s4, 7);
		loom_tokenizer_set_bucket_min(t, bmin);
		expect_ids(t, "abcd", (int32_t[]){ 9, 6 }, 2);
		loom_tokenizer_free(t);
		t = spm_scored(t3, s3, 5);
		loom_tokenizer_set_bucket_min(t, bmin);
		expect_ids(t, "aba", (int32_t[]){ 5, 3 }, 2);
		expect_ids(t, "baba", (int32_t[]){ 6, 6 }, 2);
		/* ab@0, ba@2, ab@3 tie (bb@1 is worse, and keeps the text one
		 * piece): ab, ba, then ab@3 is gone -> ab ba b */
		expect_ids(t, "abbab", (int32_t[]){ 5, 6, 4 }, 3);
		loom_tokenizer_free(t);
	}
}
END_TEST

/* NaN scores order nothing: refused by name. */
START_TEST(test_nan_score)
{
	const char *toks[] = { "<unk>", "a", "b", "ab" };
	int32_t types[] = { 2, 1, 1, 1 };
	float sc[] = { 0, -1, -1, NAN };
	struct gb b = { 0 };
	char err[256] = "";

	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 4);
	kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, types, 4);
	kv_arr(&b, "tokenizer.ggml.scores", GGUF_F32, sc, 4);
	ck_assert_ptr_null(gb_tok(&b, err, sizeof(err)));
	ck_assert_msg(strstr(err, "tokenizer.ggml.scores[3]") != NULL, "%s", err);
}
END_TEST

/* GPT-2 bytes_to_unicode, written out independently for the test. */
static void byte_char(int byte, char out[3])
{
	int n = 0, cp = byte;

	if (!((byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174)) {
		for (int b = 0; b < byte; b++)
			if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

/* Byte-level vocab: the 256 byte symbols, "he", "Ġt", "Ġthe" (merges
 * "h e", "Ġ t", "Ġt he"), a user-defined <tool> and a control <ctl>, then
 * n_extra user-defined "<tok0>", "<tok1>", ... (many specials that share
 * a first byte). */
static struct loom_tokenizer *bpe_synth_n(const char *pre, int n_extra, char *err,
					  size_t errlen)
{
	static char bytes[256][3];
	const char **toks = calloc(261 + (size_t)n_extra, sizeof(*toks));
	int32_t *types = calloc(261 + (size_t)n_extra, sizeof(*types));
	char (*extra)[16] = calloc((size_t)n_extra + 1, sizeof(*extra));
	static const char *merges[] = { "h e", "\xc4\xa0 t", "\xc4\xa0t he" };
	struct loom_tokenizer *t;
	struct gb b = { 0 };

	ck_assert(toks && types && extra);
	for (int i = 0; i < 256; i++) {
		byte_char(i, bytes[i]);
		toks[i] = bytes[i];
		types[i] = 1;
	}
	toks[256] = "he";
	toks[257] = "\xc4\xa0t";
	toks[258] = "\xc4\xa0the";
	toks[259] = "<tool>";
	toks[260] = "<ctl>";
	types[256] = types[257] = types[258] = 1;
	types[259] = 4;
	types[260] = 3;
	for (int i = 0; i < n_extra; i++) {
		snprintf(extra[i], sizeof(extra[i]), "<tok%d>", i);
		toks[261 + i] = extra[i];
		types[261 + i] = 4;
	}
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	if (pre)
		kv_str(&b, "tokenizer.ggml.pre", pre);
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 261 + (size_t)n_extra);
	kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, types, 261 + (size_t)n_extra);
	kv_strs(&b, "tokenizer.ggml.merges", merges, 3);
	kv_u32(&b, "tokenizer.ggml.eos_token_id", 260);
	t = gb_tok(&b, err, errlen);
	free(toks);
	free(types);
	free(extra);
	return t;
}

static struct loom_tokenizer *bpe_synth(const char *pre, char *err, size_t errlen)
{
	return bpe_synth_n(pre, 0, err, errlen);
}

/* Every supported pre-tokenizer name builds, and round-trips mixed text. */
START_TEST(test_bpe_families)
{
	static const char *pres[] = {
		"default", "gpt-2", "mpt", "llama-bpe", "llama3", "dbrx", "qwen2",
		"stablelm2", "starcoder", "smollm", "refact", "command-r", "falcon",
		"deepseek-llm", "deepseek-coder", "deepseek-v3", "bloom", "poro-chat",
		"viking", "tekken", "chatglm-bpe", "olmo", NULL
	};
	const char *s = "Hello the world!  3333 x\n\n\tK\xce\xa9 \xe6\x88\x91\xe6\x83\xb3 "
			"caf\xc3\xa9 \xf0\x9f\xa6\x99 I've 'LL don't\r\n";
	static int32_t ids[MAX_IDS];
	static char out[1024];
	char err[256];

	for (int i = 0; pres[i]; i++) {
		struct loom_tokenizer *t = bpe_synth(pres[i], err, sizeof(err));
		int64_t n;

		ck_assert_msg(t != NULL, "pre '%s': %s", pres[i], err);
		n = tok(t, s, strlen(s), false, false, ids);
		ck_assert_uint_eq(detok_all(t, ids, n, out, sizeof(out)), strlen(s));
		ck_assert_msg(!strcmp(out, s), "pre '%s': round trip gave '%s'", pres[i],
			      esc(out, strlen(out)));
		/* " the" is merged Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe */
		expect_ids(t, "x the", (int32_t[]){ 'x', 258 }, 2);
		loom_tokenizer_free(t);
	}
}
END_TEST

/* User-defined tokens always match (HF added tokens); control tokens only
 * with parse_special. Unknown pre falls back with a warning. */
START_TEST(test_bpe_special_kinds)
{
	char err[256];
	struct loom_tokenizer *t = bpe_synth("no-such-pre", err, sizeof(err));
	static int32_t ids[MAX_IDS];
	int64_t n;
	bool has_tool = false, has_ctl = false;

	ck_assert_msg(t != NULL, "%s", err);
	n = tok(t, "a<tool>b<ctl>", 13, false, false, ids);
	for (int64_t i = 0; i < n; i++) {
		has_tool |= ids[i] == 259;
		has_ctl |= ids[i] == 260;
	}
	ck_assert(has_tool && !has_ctl);
	expect_ids(t, "a<tool>b<ctl>", (int32_t[]){ 'a', 259, 'b', 260 }, 4);
	ck_assert(loom_tokenizer_is_eog(t, 260));
	ck_assert_int_eq(loom_tokenizer_bos(t), -1);
	loom_tokenizer_free(t);
}
END_TEST

/* Malformed metadata gives NULL and an error naming the key. */
START_TEST(test_bad_metadata)
{
	static const char *toks[] = { "a", "b" };
	static const char *bad_merge[] = { "ab" };
	int32_t types1[] = { 1 };
	float scores1[] = { 0 };
	char err[256];
	struct gb b;

#define EXPECT_FAIL(key_text) do { \
		err[0] = 0; \
		ck_assert_ptr_null(gb_tok(&b, err, sizeof(err))); \
		ck_assert_msg(strstr(err, key_text), "error '%s' lacks '%s'", err, key_text); \
	} while (0)

	b = (struct gb){ 0 };
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 2);
	EXPECT_FAIL("tokenizer.ggml.model");

	b = (struct gb){ 0 };
	kv_str(&b, "tokenizer.ggml.model", "bert");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 2);
	EXPECT_FAIL("bert");

	b = (struct gb){ 0 };
	kv_str(&b, "tokenizer.ggml.model", "llama");
	EXPECT_FAIL("tokenizer.ggml.tokens");

	b = (struct gb){ 0 };
	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 2);
	kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, types1, 1);
	EXPECT_FAIL("tokenizer.ggml.token_type");

	b = (struct gb){ 0 };
	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 2);
	kv_arr(&b, "tokenizer.ggml.scores", GGUF_F32, scores1, 1);
	EXPECT_FAIL("tokenizer.ggml.scores");

	b = (struct gb){ 0 };
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 2);
	EXPECT_FAIL("tokenizer.ggml.merges");

	b = (struct gb){ 0 };
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 2);
	kv_strs(&b, "tokenizer.ggml.merges", bad_merge, 1);
	EXPECT_FAIL("tokenizer.ggml.merges[0]");

	b = (struct gb){ 0 };
	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 2);
	kv_str(&b, "tokenizer.ggml.bos_token_id", "one");
	EXPECT_FAIL("tokenizer.ggml.bos_token_id");
#undef EXPECT_FAIL
	ck_assert_ptr_null(loom_tokenizer_from_gguf(NULL, err, sizeof(err)));
}
END_TEST

/* ---- scaling: time linear in the input --------------------------------- */

/* Inputs that made a tokenizer stage super-linear once, or could: long
 * runs of one class (a regex alternative that scans a run and fails at
 * every start), special-token first bytes and prefixes, and mixed text.
 * Each is unit repeated, then tail. */
struct pattern {
	const char *name, *unit, *tail;
};

static const struct pattern patterns[] = {
	{ "letters", "a", "" },
	{ "spaces+x", " ", "x" },
	{ "spaces+digit", " ", "1" },
	{ "space-digit", "  1", "" },
	{ "newlines", "\n", "" },
	{ "crlf", "\r\n", "" },
	{ "tabs+x", "\t", "x" },
	{ "lt", "<", "" },
	{ "special-prefix", "<too", "" },
	{ "special-prefix-many", "<tok12", "" },
	{ "specials", "<tool>", "" },
	{ "upper", "A", "" },
	{ "digits", "1", "" },
	{ "punct", "!", "" },
	{ "word-space", "a ", "" },
	{ "space-newline", " \n", "" },
	{ "marks", "\xcc\x81", "" },
	{ "cjk", "\xe6\x88\x91", "" },
	{ "bad-utf8", "\xff", "" },
	{ "apostrophe", "'s", "" },
	{ "prose", "Hello the world!  3333 x\n\n\tK\xce\xa9 caf\xc3\xa9 I've 'LL don't\r\n", "" },
};

#define N_PATTERNS (sizeof(patterns) / sizeof(patterns[0]))

static size_t fill_pattern(char *buf, size_t n, const struct pattern *p)
{
	size_t ul = strlen(p->unit), tl = strlen(p->tail), len = 0;

	while (len + ul + tl <= n) {
		memcpy(buf + len, p->unit, ul);
		len += ul;
	}
	memcpy(buf + len, p->tail, tl);
	return len + tl;
}

/* A hang guard, not a speed target: linear code takes milliseconds here,
 * the quadratic paths this replaced took minutes (CPU time, now()). */
#define HANG_GUARD_S 3.0

/* Tokenizes every pattern at n bytes, plain and as message text of a
 * chat (markup 0); prints the slowest. */
static void scale_one(const struct loom_tokenizer *t, const char *what, char *buf,
		      unsigned char *mark, size_t n)
{
	const char *slowest = "";
	double worst = 0;

	for (size_t i = 0; i < N_PATTERNS; i++) {
		size_t len = fill_pattern(buf, n, &patterns[i]);
		double t0 = now(), dt;
		int64_t a = loom_tokenize(t, buf, len, false, true, NULL, 0);
		int64_t b = loom_tokenize_marked(t, buf, len, mark, false, NULL, 0);

		dt = now() - t0;
		ck_assert_msg(a > 0 && b > 0, "%s, %s: %lld / %lld tokens", what, patterns[i].name,
			      (long long)a, (long long)b);
		ck_assert_msg(dt < HANG_GUARD_S, "%s, %s: %.1f s for %zu bytes", what,
			      patterns[i].name, dt, len);
		if (dt > worst) {
			worst = dt;
			slowest = patterns[i].name;
		}
	}
	fprintf(stderr, "%-14s %zu KB: slowest %-20s %7.1f ms\n", what, n >> 10, slowest,
		worst * 1e3);
}

/* Every pre-tokenizer family, a vocabulary with 2000 specials sharing a
 * first byte, and SentencePiece, on 128 KB of each pattern
 * ($LOOM_SCALE_KB to measure other sizes). */
START_TEST(test_scaling)
{
	const char *kb = getenv("LOOM_SCALE_KB");
	const unsigned SCALE_BYTES = (kb ? (unsigned)atoi(kb) : 128u) << 10;
	static const char *pres[] = {
		"default", "gpt-2", "llama3", "qwen2", "starcoder", "falcon", "deepseek-llm",
		"deepseek-coder", "deepseek-v3", "bloom", "viking", "tekken", NULL
	};
	char *buf = malloc(SCALE_BYTES + 1);
	unsigned char *mark = calloc(SCALE_BYTES + 1, 1);
	struct loom_tokenizer *t;
	char err[256];

	ck_assert(buf && mark);
	for (int i = 0; pres[i]; i++) {
		t = bpe_synth(pres[i], err, sizeof(err));
		ck_assert_msg(t != NULL, "pre '%s': %s", pres[i], err);
		scale_one(t, pres[i], buf, mark, SCALE_BYTES);
		loom_tokenizer_free(t);
	}
	t = bpe_synth_n("gpt-2", 2000, err, sizeof(err));
	ck_assert_msg(t != NULL, "%s", err);
	scale_one(t, "2000 specials", buf, mark, SCALE_BYTES);
	loom_tokenizer_free(t);
	t = spm_synth(-2, 1);
	scale_one(t, "spm", buf, mark, SCALE_BYTES);
	loom_tokenizer_free(t);
	free(buf);
	free(mark);
}
END_TEST

/* loom_tokenize_max: the same ids as loom_tokenize up to the limit, max + 1
 * past it, on every prefix length of a text mixing words and specials. */
START_TEST(test_model_max)
{
	static const char text[] = "Hello <|im_start|>the world, 12345 caf\xc3\xa9!<|im_end|>\n";
	struct loom_tokenizer *t = open_tok(model_path);
	int32_t want[64], got[64];
	int64_t n = loom_tokenize(t, text, strlen(text), false, true, want, 64);

	ck_assert(n > 4 && n < 64);
	for (int64_t max = 0; max <= n + 1; max++) {
		int64_t k = loom_tokenize_max(t, text, strlen(text), NULL, false, true, got, 64, max);

		ck_assert_int_eq(k, max < n ? max + 1 : n);
		if (k == n)
			ck_assert_mem_eq(got, want, sizeof(int32_t) * (size_t)n);
	}
	ck_assert_int_eq(loom_tokenize_max(t, text, 3, NULL, false, true, got, 64, -1), -1);
	loom_tokenizer_free(t);
}
END_TEST

/* 1 MB of prose on the real vocabulary, as plain text and as a chat
 * message (markup 0 but for the template's head): the sizes a request
 * may carry. Times printed; the assertion is the hang guard and that the
 * marked count equals the plain one plus the head's tokens. */
START_TEST(test_model_megabyte)
{
	static const char head[] = "<|im_start|>user\n";
	struct loom_tokenizer *t = open_tok(model_path);
	size_t n = (1u << 20) + sizeof(head) - 1, len;
	char *text = malloc(n + 1);
	unsigned char *mark = calloc(n + 1, 1);
	struct pattern prose = patterns[N_PATTERNS - 1];
	double t0, dt_plain, dt_marked;
	int64_t plain, marked;

	ck_assert(text && mark);
	memcpy(text, head, sizeof(head) - 1);
	memset(mark, 1, sizeof(head) - 1);
	len = sizeof(head) - 1 + fill_pattern(text + sizeof(head) - 1, 1u << 20, &prose);
	t0 = now();
	plain = loom_tokenize(t, text + sizeof(head) - 1, len - (sizeof(head) - 1), false, false,
			      NULL, 0);
	dt_plain = now() - t0;
	t0 = now();
	marked = loom_tokenize_marked(t, text, len, mark, false, NULL, 0);
	dt_marked = now() - t0;
	ck_assert_int_gt(plain, 0);
	ck_assert_int_eq(marked, plain + 3); /* <|im_start|>, "user", "\n" */
	ck_assert(dt_plain < 10 && dt_marked < 10);
	fprintf(stderr, "1 MB prose: %lld tokens in %.0f ms plain, %.0f ms as a chat message\n",
		(long long)plain, dt_plain * 1e3, dt_marked * 1e3);
	/* bounded: a context of 8192 refuses it after a few KB of text */
	t0 = now();
	ck_assert_int_eq(loom_tokenize_max(t, text, len, mark, false, false, NULL, 0, 8192), 8193);
	fprintf(stderr, "1 MB prose against an 8192 limit: refused in %.2f ms\n",
		(now() - t0) * 1e3);
	free(text);
	free(mark);
	loom_tokenizer_free(t);
}
END_TEST

/* ---- main -------------------------------------------------------------- */

static bool exists(const char *path)
{
	struct stat sb;

	return path && stat(path, &sb) == 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "vectors";
	const char *shared = getenv("LOOM_SHARED_DIR");
	Suite *s = suite_create("tokenizer");
	TCase *tc = tcase_create(mode);
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 60);
	if (!strcmp(mode, "model")) {
		model_path = getenv("LOOM_MODEL");
		if (!exists(model_path)) {
			printf("model not found (LOOM_MODEL=%s), skipping\n",
			       model_path ? model_path : "unset");
			return 77;
		}
		if (argc < 4) {
			fprintf(stderr, "usage: %s model PYTHON3 vocab_ids.py\n", argv[0]);
			return 2;
		}
		python3 = argv[2];
		ids_script = argv[3];
		tcase_add_test(tc, test_model_special);
		tcase_add_test(tc, test_model_speed);
		tcase_add_test(tc, test_model_megabyte);
		tcase_add_test(tc, test_model_max);
	} else if (!strcmp(mode, "scaling")) {
		tcase_add_test(tc, test_scaling);
	} else if (!strcmp(mode, "unit")) {
		tcase_add_test(tc, test_spm_merge_order);
		tcase_add_test(tc, test_merge_queue_order);
		tcase_add_test(tc, test_nan_score);
		tcase_add_test(tc, test_bpe_families);
		tcase_add_test(tc, test_bpe_special_kinds);
		tcase_add_test(tc, test_bad_metadata);
	} else {
		if (!shared || asprintf(&data_dir, "%s/data/tokenizer", shared) < 0 ||
		    !exists(data_dir)) {
			printf("shared tokenizer data not found (LOOM_SHARED_DIR=%s), skipping\n",
			       shared ? shared : "unset");
			return 77;
		}
		tcase_add_test(tc, test_vectors);
		tcase_add_test(tc, test_vectors_buckets);
		tcase_add_test(tc, test_buckets_equal_heap);
		tcase_add_test(tc, test_roundtrip);
		tcase_add_test(tc, test_random_roundtrip);
		tcase_add_test(tc, test_stream_utf8);
		tcase_add_test(tc, test_special_and_flags);
	}
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	free(data_dir);
	return failed ? 1 : 0;
}
