/* Importance-matrix files (docs/QUANTIZATION.md, "The imatrix file"):
 * llama.cpp's legacy layout, loom's Hessian section after it, and
 * llama.cpp's GGUF imatrix files; the public API is in loom.h.
 *
 * Legacy layout (little-endian): i32 n_entries, then per entry i32
 * name_len, the name, i32 ncall, i32 nval, nval f32 (the mean of x^2
 * times ncall); then i32 chunks, i32 dataset_len, the dataset name.
 * loom's section, when present, follows: "LOOMHES1", u32 version (1),
 * u32 n, per entry u32 name_len, the name, u32 cols, u32 same_as
 * (an earlier entry of this section whose matrix it shares, or
 * 0xffffffff), u64 n_tokens, u64 offset (of cols * cols f32 in the
 * file, a multiple of 64); then the matrices. Before it, when the tokens
 * behind each entry are known: "LOOMTOK1", u32 n (the entry count), n u64
 * token counts in the order of the entries. */
#include "format/gguf.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom.h"

#define HES_MAGIC "LOOMHES1"
#define TOK_MAGIC "LOOMTOK1"
#define HES_VERSION 1u
#define HES_OWN 0xffffffffu
#define HES_ALIGN 64
#define MAX_NAME 4096
#define MAX_ENTRIES (1 << 20)
#define MAX_COLS (1 << 26)

struct loom_imatrix {
	struct loom_imatrix_entry *e;
	size_t n;
	int32_t chunks;
	char *dataset;
	bool hessian;
	void *map; /* the legacy file, mapped (Hessians point into it) */
	size_t map_size;
};

/* ---- reading ---- */

/* A bounds-checked cursor over the mapped file. */
struct cur {
	const uint8_t *base, *p;
	size_t left;
	const char *path;
	char *err;
	size_t errlen;
};

static int short_read(struct cur *c, const char *what)
{
	loom_seterr(c->err, c->errlen, "%s: truncated: %s at byte %zu runs past the end of the file",
		    c->path, what, (size_t)(c->p - c->base));
	return -1;
}

static int take(struct cur *c, void *out, size_t n, const char *what)
{
	if (c->left < n)
		return short_read(c, what);
	memcpy(out, c->p, n);
	c->p += n;
	c->left -= n;
	return 0;
}

static int take_name(struct cur *c, uint32_t len, char **out, const char *what)
{
	if (len == 0 || len > MAX_NAME) {
		loom_seterr(c->err, c->errlen, "%s: %s of length %u at byte %zu (1 to %d expected): not an imatrix file, or corrupt",
			    c->path, what, len, (size_t)(c->p - c->base), MAX_NAME);
		return -1;
	}
	if (c->left < len)
		return short_read(c, what);
	if (memchr(c->p, 0, len)) {
		loom_seterr(c->err, c->errlen, "%s: %s at byte %zu contains a NUL byte", c->path,
			    what, (size_t)(c->p - c->base));
		return -1;
	}
	*out = strndup((const char *)c->p, len);
	if (!*out) {
		loom_seterr(c->err, c->errlen, "%s: out of memory", c->path);
		return -1;
	}
	c->p += len;
	c->left -= len;
	return 0;
}

void loom_imatrix_free(struct loom_imatrix *im)
{
	if (!im)
		return;
	for (size_t i = 0; i < im->n; i++) {
		free((char *)im->e[i].name);
		free((float *)im->e[i].mean_sq);
	}
	free(im->e);
	free(im->dataset);
	if (im->map)
		munmap(im->map, im->map_size);
	free(im);
}

/* One legacy entry: name, ncall, nval, the values (divided by ncall). */
static int read_entry(struct cur *c, struct loom_imatrix_entry *e)
{
	int32_t len, ncall, nval;
	float *v;
	char *name = NULL;

	if (take(c, &len, 4, "an entry's name length") ||
	    take_name(c, (uint32_t)len, &name, "an entry's name"))
		return -1;
	e->name = name;
	if (take(c, &ncall, 4, "an entry's call count") || take(c, &nval, 4, "an entry's size"))
		return -1;
	if (ncall < 0 || nval <= 0 || nval > MAX_COLS) {
		loom_seterr(c->err, c->errlen, "%s: entry '%s': %d calls and %d values (0.. and 1..%d expected)",
			    c->path, name, ncall, nval, MAX_COLS);
		return -1;
	}
	if (c->left / 4 < (size_t)nval)
		return short_read(c, "an entry's values");
	v = malloc(sizeof(float) * (size_t)nval);
	if (!v) {
		loom_seterr(c->err, c->errlen, "%s: out of memory", c->path);
		return -1;
	}
	memcpy(v, c->p, sizeof(float) * (size_t)nval);
	c->p += 4 * (size_t)nval;
	c->left -= 4 * (size_t)nval;
	e->mean_sq = v;
	e->cols = nval;
	for (int32_t j = 0; j < nval; j++) {
		if (!isfinite(v[j]) || v[j] < 0.0f) {
			loom_seterr(c->err, c->errlen, "%s: entry '%s': value %d is %g (a mean of squares is finite and >= 0)",
				    c->path, name, j, (double)v[j]);
			return -1;
		}
		if (ncall > 0)
			v[j] /= (float)ncall;
	}
	return 0;
}

const struct loom_imatrix_entry *loom_imatrix_lookup(const struct loom_imatrix *im,
						     const char *name)
{
	if (!im || !name)
		return NULL;
	for (size_t i = 0; i < im->n; i++)
		if (!strcmp(im->e[i].name, name))
			return &im->e[i];
	return NULL;
}

/* A matrix of the Hessian section, for the entries that share it. */
struct hes_slot {
	const float *h;
	uint32_t cols;
};

/* One entry of loom's Hessian section; hes[i] remembers its matrix. */
static int read_hessian(struct loom_imatrix *im, struct cur *c, uint32_t i, struct hes_slot *hes)
{
	uint32_t len, cols, same;
	uint64_t n_tokens, off, bytes;
	char *name = NULL;
	struct loom_imatrix_entry *e;
	int rc = -1;

	if (take(c, &len, 4, "a Hessian's name length") ||
	    take_name(c, len, &name, "a Hessian's name"))
		return -1;
	if (take(c, &cols, 4, "a Hessian's size") || take(c, &same, 4, "a Hessian's sharing") ||
	    take(c, &n_tokens, 8, "a Hessian's token count") || take(c, &off, 8, "a Hessian's offset"))
		goto out;
	e = (struct loom_imatrix_entry *)loom_imatrix_lookup(im, name);
	if (!e || e->cols != (int64_t)cols) {
		loom_seterr(c->err, c->errlen, "%s: Hessian '%s' of %u columns has no entry of that size before it",
			    c->path, name, cols);
		goto out;
	}
	if (same != HES_OWN) {
		if (same >= i || hes[same].cols != cols) {
			loom_seterr(c->err, c->errlen, "%s: Hessian '%s' shares entry %u of the section, which is not an earlier one of its size",
				    c->path, name, same);
			goto out;
		}
		hes[i] = hes[same];
	} else {
		hes[i].cols = cols;
		bytes = (uint64_t)cols * cols * sizeof(float);
		if (off % HES_ALIGN || off > im->map_size || bytes > im->map_size - off) {
			loom_seterr(c->err, c->errlen, "%s: Hessian '%s': %llu bytes at offset %llu do not fit the file of %zu bytes (truncated?)",
				    c->path, name, (unsigned long long)bytes, (unsigned long long)off,
				    im->map_size);
			goto out;
		}
		hes[i].h = (const float *)((const uint8_t *)im->map + off);
	}
	e->hessian = hes[i].h;
	e->n_tokens = (int64_t)n_tokens;
	rc = 0;
out:
	free(name);
	return rc;
}

static int read_hessians(struct loom_imatrix *im, struct cur *c)
{
	uint32_t version, n;
	struct hes_slot *hes;
	int rc = 0;

	if (take(c, &version, 4, "the Hessian section's version") ||
	    take(c, &n, 4, "the Hessian section's count"))
		return -1;
	if (version != HES_VERSION || n > im->n) {
		loom_seterr(c->err, c->errlen, "%s: Hessian section of version %u with %u entries (version %u, at most %zu expected)",
			    c->path, version, n, HES_VERSION, im->n);
		return -1;
	}
	hes = calloc(n ? n : 1, sizeof(*hes));
	if (!hes) {
		loom_seterr(c->err, c->errlen, "%s: out of memory", c->path);
		return -1;
	}
	for (uint32_t i = 0; i < n && !rc; i++)
		rc = read_hessian(im, c, i, hes);
	free(hes);
	im->hessian = rc == 0;
	return rc;
}

/* loom's token counts, one per entry (the magic not yet taken). */
static int read_tokens(struct loom_imatrix *im, struct cur *c)
{
	uint32_t n;
	uint64_t t;

	c->p += 8;
	c->left -= 8;
	if (take(c, &n, 4, "the token counts' count"))
		return -1;
	if (n != im->n) {
		loom_seterr(c->err, c->errlen, "%s: %u token counts for %zu entries", c->path, n,
			    im->n);
		return -1;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (take(c, &t, 8, "a token count"))
			return -1;
		if (t > INT64_MAX) {
			loom_seterr(c->err, c->errlen, "%s: entry '%s': %llu tokens", c->path,
				    im->e[i].name, (unsigned long long)t);
			return -1;
		}
		im->e[i].n_tokens = (int64_t)t;
	}
	return 0;
}

/* After the entries: llama.cpp's optional trailer, then loom's sections. */
static int read_trailer(struct loom_imatrix *im, struct cur *c, uint32_t flags)
{
	int32_t len;

	if (c->left == 0)
		return 0;
	if (take(c, &im->chunks, 4, "the chunk count") || take(c, &len, 4, "the dataset name's length"))
		return -1;
	if (len < 0 || (size_t)len > c->left)
		return short_read(c, "the dataset name");
	free(im->dataset);
	im->dataset = strndup((const char *)c->p, (size_t)len);
	if (!im->dataset) {
		loom_seterr(c->err, c->errlen, "%s: out of memory", c->path);
		return -1;
	}
	c->p += len;
	c->left -= (size_t)len;
	if (c->left >= 8 && !memcmp(c->p, TOK_MAGIC, 8) && read_tokens(im, c))
		return -1;
	if (c->left == 0)
		return 0;
	if (c->left < 8 || memcmp(c->p, HES_MAGIC, 8)) {
		loom_seterr(c->err, c->errlen, "%s: %zu bytes after the dataset name are not loom's Hessian section",
			    c->path, c->left);
		return -1;
	}
	c->p += 8;
	c->left -= 8;
	return flags & LOOM_IMATRIX_HESSIAN ? read_hessians(im, c) : 0;
}

static int read_legacy(struct loom_imatrix *im, struct cur *c, uint32_t flags)
{
	int32_t n;

	if (take(c, &n, 4, "the entry count"))
		return -1;
	/* an entry takes at least 17 bytes: a bound before allocating */
	if (n < 0 || n > MAX_ENTRIES || (size_t)n > c->left / 17) {
		loom_seterr(c->err, c->errlen, "%s: %d entries in a file of %zu bytes: not an imatrix file, or corrupt",
			    c->path, n, c->left + 4);
		return -1;
	}
	im->e = calloc(n ? (size_t)n : 1, sizeof(*im->e));
	if (!im->e) {
		loom_seterr(c->err, c->errlen, "%s: out of memory", c->path);
		return -1;
	}
	for (int32_t i = 0; i < n; i++) {
		im->n++;
		if (read_entry(c, &im->e[i]))
			return -1;
	}
	return read_trailer(im, c, flags);
}

/* ---- llama.cpp's GGUF imatrix ---- */

static bool ends_with(const struct gguf_str *s, const char *suffix, size_t *stem)
{
	size_t n = strlen(suffix);

	if (s->len <= n || memcmp(s->ptr + s->len - n, suffix, n))
		return false;
	*stem = (size_t)s->len - n;
	return true;
}

/* NAME.in_sum2 [nval, n_mat] and NAME.counts [1, n_mat]: mean = sum / count,
 * experts one after another (as llama.cpp's legacy layout has them); an
 * expert no token reached gets 1s, equal weights, as llama-quantize does. */
static int gguf_entry(const struct gguf_file *g, const struct gguf_tensor *t, size_t stem,
		      struct loom_imatrix_entry *e, const char *path, char *err, size_t errlen)
{
	char cname[MAX_NAME + 16];
	const struct gguf_tensor *ct;
	const float *sum, *cnt;
	int64_t nval = t->ne[0], n_mat = t->ne[1] * t->ne[2] * t->ne[3];
	float *v;

	snprintf(cname, sizeof(cname), "%.*s.counts", (int)stem, t->name.ptr);
	ct = gguf_find_tensor(g, cname);
	if (t->type != LOOM_TYPE_F32 || !ct || ct->type != LOOM_TYPE_F32 ||
	    ct->ne[0] * ct->ne[1] * ct->ne[2] * ct->ne[3] != n_mat || nval * n_mat > MAX_COLS) {
		loom_seterr(err, errlen, "%s: tensor '%.*s' needs an f32 '%s' of one count per matrix (and both f32)",
			    path, (int)t->name.len, t->name.ptr, cname);
		return -1;
	}
	e->name = strndup(t->name.ptr, stem);
	v = malloc(sizeof(float) * (size_t)(nval * n_mat));
	if (!e->name || !v) {
		free(v);
		loom_seterr(err, errlen, "%s: out of memory", path);
		return -1;
	}
	e->mean_sq = v;
	e->cols = nval * n_mat;
	sum = t->data;
	cnt = ct->data;
	for (int64_t m = 0; m < n_mat; m++)
		for (int64_t j = 0; j < nval; j++)
			v[m * nval + j] = cnt[m] > 0.0f ? sum[m * nval + j] / cnt[m] : 1.0f;
	e->n_tokens = n_mat == 1 && cnt[0] > 0.0f ? (int64_t)cnt[0] : 0;
	return 0;
}

static int read_gguf(struct loom_imatrix *im, const char *path, char *err, size_t errlen)
{
	struct gguf_file *g = gguf_open(path, err, errlen);
	const struct gguf_kv *kv;
	char *type = NULL;
	size_t stem;
	uint32_t chunks = 0;
	int rc = -1;

	if (!g)
		return -1;
	if (gguf_get_str(g, "general.type", &type, err, errlen) != 0 || strcmp(type, "imatrix")) {
		loom_seterr(err, errlen, "%s: a GGUF file whose general.type is '%s', not 'imatrix'",
			    path, type ? type : "(none)");
		goto out;
	}
	im->e = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*im->e));
	if (!im->e) {
		loom_seterr(err, errlen, "%s: out of memory", path);
		goto out;
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		if (!ends_with(&g->tensors[i].name, ".in_sum2", &stem))
			continue;
		im->n++;
		if (gguf_entry(g, &g->tensors[i], stem, &im->e[im->n - 1], path, err, errlen))
			goto out;
	}
	if (gguf_get_u32(g, "imatrix.chunk_count", &chunks, err, errlen) < 0)
		goto out;
	im->chunks = (int32_t)(chunks > INT32_MAX ? INT32_MAX : chunks);
	if (gguf_get_arr(g, "imatrix.datasets", 8 /* string */, &kv, NULL, 0) == 0 && kv->arr_n)
		im->dataset = strndup(kv->arr_str[0].ptr, kv->arr_str[0].len);
	rc = 0;
out:
	free(type);
	gguf_close(g);
	return rc;
}

/* ---- the API ---- */

static int map_file(struct loom_imatrix *im, const char *path, char *err, size_t errlen)
{
	struct stat st;
	int fd = open(path, O_RDONLY);

	if (fd < 0 || fstat(fd, &st)) {
		loom_seterr(err, errlen, "%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	if (st.st_size < 4) {
		close(fd);
		loom_seterr(err, errlen, "%s: %lld bytes: too short for an imatrix file", path,
			    (long long)st.st_size);
		return -1;
	}
	im->map_size = (size_t)st.st_size;
	im->map = mmap(NULL, im->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (im->map == MAP_FAILED) {
		im->map = NULL;
		loom_seterr(err, errlen, "%s: cannot map: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

static int by_name(const void *a, const void *b)
{
	const struct loom_imatrix_entry *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

/* Every entry names a different tensor: a name twice (with the same or
 * another width) would make which one counts depend on the search order.
 * 0, or -1 with err naming the tensor and both widths. */
static int check_unique(const struct loom_imatrix *im, const char *path, char *err,
			size_t errlen)
{
	const struct loom_imatrix_entry **v;
	int rc = 0;

	if (im->n < 2)
		return 0;
	v = malloc(sizeof(*v) * im->n);
	if (!v) {
		loom_seterr(err, errlen, "%s: out of memory", path);
		return -1;
	}
	for (size_t i = 0; i < im->n; i++)
		v[i] = &im->e[i];
	qsort(v, im->n, sizeof(*v), by_name);
	for (size_t i = 1; i < im->n && !rc; i++) {
		if (strcmp(v[i - 1]->name, v[i]->name))
			continue;
		loom_seterr(err, errlen, "%s: tensor '%s' has two entries (%lld and %lld columns): corrupt, or two files joined",
			    path, v[i]->name, (long long)v[i - 1]->cols, (long long)v[i]->cols);
		rc = -1;
	}
	free(v);
	return rc;
}

struct loom_imatrix *loom_imatrix_load(const char *path, uint32_t flags, char *err,
				       size_t errlen)
{
	struct loom_imatrix *im = calloc(1, sizeof(*im));
	struct cur c = { .path = path, .err = err, .errlen = errlen };
	int rc;

	if (!im || !path) {
		free(im);
		loom_seterr(err, errlen, "imatrix: %s", path ? "out of memory" : "no file given");
		return NULL;
	}
	if (map_file(im, path, err, errlen)) {
		loom_imatrix_free(im);
		return NULL;
	}
	if (!memcmp(im->map, "GGUF", 4)) {
		munmap(im->map, im->map_size);
		im->map = NULL;
		rc = read_gguf(im, path, err, errlen);
	} else {
		c.base = c.p = im->map;
		c.left = im->map_size;
		rc = read_legacy(im, &c, flags);
	}
	if (!rc)
		rc = check_unique(im, path, err, errlen);
	if (rc) {
		loom_imatrix_free(im);
		return NULL;
	}
	if (!im->hessian && im->map) { /* nothing points into it */
		munmap(im->map, im->map_size);
		im->map = NULL;
	}
	return im;
}

size_t loom_imatrix_count(const struct loom_imatrix *im)
{
	return im ? im->n : 0;
}

const struct loom_imatrix_entry *loom_imatrix_at(const struct loom_imatrix *im, size_t i)
{
	return im && i < im->n ? &im->e[i] : NULL;
}

int32_t loom_imatrix_chunks(const struct loom_imatrix *im)
{
	return im ? im->chunks : 0;
}

const char *loom_imatrix_dataset(const struct loom_imatrix *im)
{
	return im && im->dataset ? im->dataset : "";
}

bool loom_imatrix_has_hessian(const struct loom_imatrix *im)
{
	return im && im->hessian;
}

/* ---- writing ---- */

struct writer {
	FILE *f;
	uint64_t pos;
	bool failed;
};

static void put(struct writer *w, const void *p, size_t n)
{
	if (!w->failed && n && fwrite(p, 1, n, w->f) != n)
		w->failed = true;
	w->pos += n;
}

static void put_u32(struct writer *w, uint32_t v)
{
	put(w, &v, 4);
}

static void put_u64(struct writer *w, uint64_t v)
{
	put(w, &v, 8);
}

static void pad_to(struct writer *w, uint64_t align)
{
	static const uint8_t zero[HES_ALIGN];

	put(w, zero, (size_t)((align - w->pos % align) % align));
}

static void write_legacy(struct writer *w, const struct loom_imatrix_stat *s, size_t n,
			 int32_t n_chunks, const char *dataset)
{
	int32_t ncall = n_chunks > 0 ? n_chunks : 1;

	put_u32(w, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		put_u32(w, (uint32_t)strlen(s[i].name));
		put(w, s[i].name, strlen(s[i].name));
		put_u32(w, (uint32_t)ncall);
		put_u32(w, (uint32_t)s[i].cols);
		for (int64_t j = 0; j < s[i].cols; j++) {
			float v = s[i].mean_sq[j] * (float)ncall;

			put(w, &v, 4);
		}
	}
	put_u32(w, (uint32_t)n_chunks);
	put_u32(w, (uint32_t)strlen(dataset));
	put(w, dataset, strlen(dataset));
}

/* The tokens behind each entry, when any is known (LOOMTOK1). */
static void write_tokens(struct writer *w, const struct loom_imatrix_stat *s, size_t n)
{
	bool any = false;

	for (size_t i = 0; i < n; i++)
		any |= s[i].n_tokens > 0;
	if (!any)
		return;
	put(w, TOK_MAGIC, 8);
	put_u32(w, (uint32_t)n);
	for (size_t i = 0; i < n; i++)
		put_u64(w, s[i].n_tokens > 0 ? (uint64_t)s[i].n_tokens : 0);
}

/* The earlier stat whose Hessian is the same matrix, or HES_OWN. */
static uint32_t shared_with(const struct loom_imatrix_stat *s, size_t i, const uint32_t *slot)
{
	for (size_t k = 0; k < i; k++)
		if (s[k].hessian == s[i].hessian && s[k].cols == s[i].cols)
			return slot[k];
	return HES_OWN;
}

static void write_hessians(struct writer *w, const struct loom_imatrix_stat *s, size_t n,
			   uint32_t *slot)
{
	uint32_t n_hes = 0;
	uint64_t off;

	for (size_t i = 0; i < n; i++)
		slot[i] = s[i].hessian ? n_hes++ : HES_OWN;
	put(w, HES_MAGIC, 8);
	put_u32(w, HES_VERSION);
	put_u32(w, n_hes);
	off = w->pos;
	for (size_t i = 0; i < n; i++) /* the index's size */
		if (s[i].hessian)
			off += 4 + strlen(s[i].name) + 4 + 4 + 8 + 8;
	for (size_t i = 0; i < n; i++) {
		uint32_t same;

		if (!s[i].hessian)
			continue;
		same = shared_with(s, i, slot);
		off = (off + HES_ALIGN - 1) / HES_ALIGN * HES_ALIGN;
		put_u32(w, (uint32_t)strlen(s[i].name));
		put(w, s[i].name, strlen(s[i].name));
		put_u32(w, (uint32_t)s[i].cols);
		put_u32(w, same);
		put_u64(w, (uint64_t)s[i].n_tokens);
		put_u64(w, same == HES_OWN ? off : 0);
		if (same == HES_OWN)
			off += (uint64_t)s[i].cols * (uint64_t)s[i].cols * sizeof(float);
	}
	for (size_t i = 0; i < n; i++) {
		if (!s[i].hessian || shared_with(s, i, slot) != HES_OWN)
			continue;
		pad_to(w, HES_ALIGN);
		put(w, s[i].hessian, (size_t)(s[i].cols * s[i].cols) * sizeof(float));
	}
}

static int check_stats(const struct loom_imatrix_stat *s, size_t n, char *err, size_t errlen)
{
	if (n > MAX_ENTRIES) {
		loom_seterr(err, errlen, "imatrix: %zu entries (at most %d)", n, MAX_ENTRIES);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		size_t len = s[i].name ? strlen(s[i].name) : 0;

		if (!len || len > MAX_NAME || s[i].cols <= 0 || s[i].cols > MAX_COLS ||
		    !s[i].mean_sq) {
			loom_seterr(err, errlen, "imatrix: entry %zu ('%s', %lld columns) cannot be saved",
				    i, s[i].name ? s[i].name : "", (long long)s[i].cols);
			return -1;
		}
	}
	return 0;
}

int loom_imatrix_save(const char *path, uint32_t flags, const struct loom_imatrix_stat *stats,
		      size_t n, int32_t n_chunks, const char *dataset, char *err, size_t errlen)
{
	struct loom_outfile *out;
	struct writer w = { 0 };
	uint32_t *slot;
	bool any_hessian = false;

	if (!path || check_stats(stats, n, err, errlen))
		return -1;
	slot = calloc(n ? n : 1, sizeof(*slot));
	if (!slot) {
		loom_seterr(err, errlen, "%s: out of memory", path);
		return -1;
	}
	out = loom_outfile_open(path, flags, err, errlen);
	if (!out) {
		free(slot);
		return -1;
	}
	w.f = loom_outfile_stream(out);
	for (size_t i = 0; i < n; i++)
		any_hessian |= stats[i].hessian != NULL;
	write_legacy(&w, stats, n, n_chunks, dataset ? dataset : "");
	write_tokens(&w, stats, n);
	if (any_hessian)
		write_hessians(&w, stats, n, slot);
	free(slot);
	if (w.failed) {
		loom_seterr(err, errlen, "%s: cannot write: %s", path, strerror(errno));
		loom_outfile_discard(out);
		return -1;
	}
	return loom_outfile_commit(out, err, errlen);
}
