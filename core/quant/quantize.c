/* `loom quantize` (docs/QUANTIZATION.md): plans each tensor's type
 * (mix.c), then streams the output: header first, then one tensor at a
 * time, dequantized from the mapped input when needed, quantized by the
 * strategy plugin on the host's threads, written, and its input pages
 * released, so neither the model nor its copy is ever held whole. */
#include "quant/quantize.h"
#include "format/gguf_write.h"
#include "plugin/host.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

/* One tensor of the plan. */
struct plan_tensor {
	const struct gguf_tensor *src;
	uint32_t type;      /* what it becomes */
	int64_t rows, cols; /* cols = ne[0]; rows = the other dims' product */
	uint64_t nbytes, offset;
	bool convert;       /* type differs from the source's: quantize */
	uint32_t wanted;    /* the rules' choice, before the shape fallback */
};

struct quant_run {
	struct loom_quantize_params p;
	FILE *out;
	struct gguf_file *in;
	struct quant_target target;
	struct plan_tensor *t;
	uint64_t n, n_convert;
	uint64_t n_calibrated; /* converted tensors the --imatrix file has */
	uint64_t data_bytes, file_bytes;
	const struct loom_qstrategy *strategy;
	char strategy_path[4096];
	int n_threads;
	float *wbuf;
	size_t wcap;
	void *obuf;
	size_t ocap;
	/* input scales (fold.c): the groups, a member scaled, its imatrix
	 * and Hessian rescaled */
	struct quant_fold fold;
	float *sbuf, *ibuf, *hbuf;
	size_t scap, icap, hcap;
	struct loom_imatrix *im; /* --imatrix, or NULL */
};

void loom_quantize_params_init(struct loom_quantize_params *p)
{
	*p = (struct loom_quantize_params){ .struct_size = sizeof(*p), .progress = true };
}

static uint32_t block_elems(uint32_t type, uint32_t *bytes)
{
	uint32_t be = 0, bb = 0;

	if (!gguf_type_geometry(type, &be, &bb))
		return 0;
	if (bytes)
		*bytes = bb;
	return be;
}

static int tensor_err(char *err, size_t errlen, const struct gguf_tensor *t, const char *fmt,
		      const char *a, const char *b)
{
	char why[512];

	snprintf(why, sizeof(why), fmt, a, b);
	loom_seterr(err, errlen, "tensor '%.*s': %s", (int)t->name.len, t->name.ptr, why);
	return -1;
}

/* A loom_status as words, for messages. */
static const char *status_text(int rc)
{
	switch (rc) {
	case LOOM_ERR_INVALID: return "invalid argument or shape";
	case LOOM_ERR_NOMEM: return "out of memory";
	case LOOM_ERR_UNSUPPORTED: return "unsupported";
	case LOOM_ERR_FORMAT: return "malformed data";
	default: return "failed";
	}
}

/* ---- the plan ---- */

/* Rows, columns and output bytes of tensor i; checks the shape divides
 * into the type's blocks and that the formats it needs are loaded. */
static int plan_one(struct quant_run *r, struct plan_tensor *pt, char *err, size_t errlen)
{
	const struct gguf_tensor *t = pt->src;
	const struct loom_quant_format *src_f = loom_format_get(t->type);
	const struct loom_quant_format *dst_f = loom_format_get(pt->type);
	uint32_t be, bb;
	uint64_t row_bytes;
	char what[64];

	pt->cols = t->ne[0];
	pt->rows = 1;
	for (uint32_t d = 1; d < t->n_dims; d++)
		pt->rows *= t->ne[d]; /* the reader checked the element count */
	pt->convert = pt->type != t->type;
	if (!pt->convert) {
		pt->nbytes = t->nbytes;
		return 0;
	}
	be = block_elems(pt->type, &bb);
	if (!be || pt->cols % be) {
		snprintf(what, sizeof(what), "%lld", (long long)pt->cols);
		return tensor_err(err, errlen, t, "rows of %s values do not divide into %s blocks",
				  what, gguf_type_name(pt->type));
	}
	if (block_elems(t->type, NULL) > 1 && !r->p.allow_requantize)
		return tensor_err(err, errlen, t,
				  "the source is already quantized (%s); requantizing to %s loses accuracy: pass --allow-requantize to do it anyway",
				  gguf_type_name(t->type), gguf_type_name(pt->type));
	if (t->type != LOOM_TYPE_F32 && !src_f)
		return tensor_err(err, errlen, t, "no format plugin reads %s%s",
				  gguf_type_name(t->type), "");
	if (!dst_f)
		return tensor_err(err, errlen, t, "no format plugin writes %s%s",
				  gguf_type_name(pt->type), "");
	if (__builtin_mul_overflow((uint64_t)(pt->cols / be), bb, &row_bytes) ||
	    __builtin_mul_overflow(row_bytes, (uint64_t)pt->rows, &pt->nbytes))
		return tensor_err(err, errlen, t, "size overflows%s%s", "", "");
	return 0;
}

/* The layer of "blk.N....", or -1. */
static long layer_of(const struct gguf_str *name)
{
	long n = 0;
	uint64_t i = 4;

	if (name->len < 5 || memcmp(name->ptr, "blk.", 4))
		return -1;
	for (; i < name->len && name->ptr[i] >= '0' && name->ptr[i] <= '9' && n < 1000000; i++)
		n = n * 10 + (name->ptr[i] - '0');
	return i > 4 ? n : -1;
}

/* llama.cpp's order: by layer (others first), then by name. The mix rules
 * count attn_v and ffn_down tensors in this order, and the output is
 * written in it, as llama-quantize writes its files. */
static int tensor_order(const void *pa, const void *pb)
{
	const struct gguf_str *a = &((const struct plan_tensor *)pa)->src->name;
	const struct gguf_str *b = &((const struct plan_tensor *)pb)->src->name;
	long la = layer_of(a), lb = layer_of(b);
	int c;

	if (la != lb)
		return la < lb ? -1 : 1;
	c = memcmp(a->ptr, b->ptr, a->len < b->len ? a->len : b->len);
	return c ? c : (a->len > b->len) - (a->len < b->len);
}

static int make_plan(struct quant_run *r, char *err, size_t errlen)
{
	struct quant_rules rules;
	uint64_t off = 0;

	if (!r->in->n_tensors) {
		loom_seterr(err, errlen, "%s: the file has no tensors: nothing to quantize", r->p.input);
		return -1;
	}
	if (quant_rules_init(&rules, &r->target, r->in, err, errlen))
		return -1;
	rules.has_imatrix = r->im != NULL; /* llama-quantize's imatrix-only rules */
	r->n = r->in->n_tensors;
	r->t = calloc(r->n ? r->n : 1, sizeof(*r->t));
	if (!r->t) {
		loom_seterr(err, errlen, "out of memory");
		return -1;
	}
	for (uint64_t i = 0; i < r->n; i++)
		r->t[i].src = &r->in->tensors[i];
	qsort(r->t, r->n, sizeof(*r->t), tensor_order);
	for (uint64_t i = 0; i < r->n; i++) {
		struct plan_tensor *pt = &r->t[i];

		pt->type = quant_tensor_type(&rules, pt->src, &pt->wanted);
		if (plan_one(r, pt, err, errlen))
			return -1;
		pt->offset = off;
		if (!gguf_next_offset(off, pt->nbytes, r->in->alignment, &off)) {
			loom_seterr(err, errlen, "output too large");
			return -1;
		}
		r->data_bytes += pt->nbytes;
		r->n_convert += pt->convert;
	}
	return 0;
}

/* With --imatrix: counts the converted tensors the file has an entry
 * for, and refuses a file that has none of them (an imatrix of another
 * model would otherwise quantize everything without its data while the
 * summary says "quantized by imatrix"). */
static int check_calibration(struct quant_run *r, char *err, size_t errlen)
{
	char name[512];

	if (!r->im)
		return 0;
	for (uint64_t i = 0; i < r->n; i++) {
		const struct gguf_tensor *t = r->t[i].src;

		if (!r->t[i].convert)
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
		r->n_calibrated += loom_imatrix_lookup(r->im, name) != NULL;
	}
	if (r->n_convert && !r->n_calibrated) {
		const struct loom_imatrix_entry *e = loom_imatrix_at(r->im, 0);

		loom_seterr(err, errlen, "the imatrix %s has no entry for any of the %llu tensors quantized here (it has %zu, e.g. '%s'): an imatrix of another model?",
			    r->p.imatrix, (unsigned long long)r->n_convert,
			    loom_imatrix_count(r->im), e ? e->name : "none");
		return -1;
	}
	return 0;
}

/* ---- the header ---- */

static bool key_is(const struct gguf_kv *kv, const char *key)
{
	return kv->key.len == strlen(key) && !memcmp(kv->key.ptr, key, kv->key.len);
}

/* The keys loom sets itself; the input's values of them are dropped. */
static bool replaced(const struct gguf_kv *kv)
{
	return key_is(kv, "general.file_type") || key_is(kv, "general.quantization_version");
}

static int write_header(struct quant_run *r, struct gguf_writer *w, char *err, size_t errlen)
{
	const struct gguf_file *in = r->in;
	uint64_t n_kv = 2;

	for (uint64_t i = 0; i < in->n_kv; i++)
		n_kv += !replaced(&in->kv[i]);
	if (gguf_write_header(w, r->n, n_kv, err, errlen))
		return -1;
	for (uint64_t i = 0; i < in->n_kv; i++)
		if (!replaced(&in->kv[i]) && gguf_write_kv(w, &in->kv[i], err, errlen))
			return -1;
	if (gguf_write_kv_u32(w, "general.file_type", r->target.ftype, err, errlen) ||
	    gguf_write_kv_u32(w, "general.quantization_version", 2, err, errlen))
		return -1;
	for (uint64_t i = 0; i < r->n; i++) {
		const struct gguf_tensor *t = r->t[i].src;

		if (gguf_write_tensor_info(w, &t->name, t->n_dims, t->ne, r->t[i].type,
					   r->t[i].offset, err, errlen))
			return -1;
	}
	return gguf_write_pad(w, err, errlen);
}

/* The size the output will have: the header counted, the data planned. */
static int measure(struct quant_run *r, char *err, size_t errlen)
{
	struct gguf_writer *w = gguf_writer_open(NULL, 0, r->in->alignment, err, errlen);
	uint64_t end = 0;

	if (!w)
		return -1;
	if (write_header(r, w, err, errlen)) {
		gguf_writer_close(w, err, errlen);
		return -1;
	}
	/* every tensor is padded, the last one too (as llama.cpp writes) */
	if (r->n && !gguf_next_offset(r->t[r->n - 1].offset, r->t[r->n - 1].nbytes,
				      r->in->alignment, &end)) {
		gguf_writer_close(w, NULL, 0);
		loom_seterr(err, errlen, "output too large");
		return -1;
	}
	r->file_bytes = gguf_writer_pos(w) + end;
	return gguf_writer_close(w, err, errlen);
}

/* ---- the plan, printed ---- */

/* Tensors whose rows do not divide into the chosen type's blocks got
 * another type (llama.cpp's fallback): one line per pair of types. */
static void print_fallbacks(const struct quant_run *r)
{
	for (uint64_t i = 0; i < r->n; i++) {
		const struct plan_tensor *pt = &r->t[i];
		uint64_t n = 0, j;

		if (pt->wanted == pt->type)
			continue;
		for (j = 0; j < i; j++) /* printed already? */
			if (r->t[j].wanted == pt->wanted && r->t[j].type == pt->type)
				break;
		if (j < i)
			continue;
		for (j = i; j < r->n; j++)
			n += r->t[j].wanted == pt->wanted && r->t[j].type == pt->type;
		fprintf(r->out, "  fallback: %llu tensors (e.g. %.*s, rows of %lld) do not divide into %s blocks: %s instead\n",
			(unsigned long long)n, (int)pt->src->name.len, pt->src->name.ptr,
			(long long)pt->cols, gguf_type_name(pt->wanted), gguf_type_name(pt->type));
	}
}

static void print_plan(const struct quant_run *r)
{
	uint64_t total_elems = 0;

	fprintf(r->out, "loom quantize: %s -> %s as %s (%s), strategy %s%s%s\n", r->p.input,
		r->p.dry_run ? "(dry run)" : r->p.output, r->target.name,
		r->target.mix ? "llama.cpp mix" : "plain", r->p.strategy,
		r->im ? ", imatrix " : "", r->im ? r->p.imatrix : "");
	fprintf(r->out, "  %-6s %8s %14s %16s %12s\n", "type", "tensors", "weights", "bytes",
		"bits/weight");
	for (uint32_t type = 0; type < LOOM_TYPE_COUNT; type++) {
		uint64_t n = 0, elems = 0, bytes = 0;

		for (uint64_t i = 0; i < r->n; i++) {
			if (r->t[i].type != type)
				continue;
			n++;
			elems += (uint64_t)r->t[i].rows * (uint64_t)r->t[i].cols;
			bytes += r->t[i].nbytes;
		}
		if (!n)
			continue;
		total_elems += elems;
		fprintf(r->out, "  %-6s %8llu %14llu %16llu %12.3f\n", gguf_type_name(type),
			(unsigned long long)n, (unsigned long long)elems,
			(unsigned long long)bytes, 8.0 * (double)bytes / (double)elems);
	}
	fprintf(r->out, "  %-6s %8llu %14llu %16llu %12.3f\n", "total", (unsigned long long)r->n,
		(unsigned long long)total_elems, (unsigned long long)r->data_bytes,
		total_elems ? 8.0 * (double)r->data_bytes / (double)total_elems : 0.0);
	print_fallbacks(r);
	fprintf(r->out, "  tensor data %llu bytes (%.2f MiB); file %llu bytes (%.2f MiB); input %llu bytes\n",
		(unsigned long long)r->data_bytes, (double)r->data_bytes / 1048576.0,
		(unsigned long long)r->file_bytes, (double)r->file_bytes / 1048576.0,
		(unsigned long long)r->in->size);
}

static void print_tensors(const struct quant_run *r)
{
	for (uint64_t i = 0; i < r->n; i++) {
		const struct plan_tensor *pt = &r->t[i];

		fprintf(r->out, "  %-40.*s %6s -> %-6s %12llu bytes\n", (int)pt->src->name.len,
			pt->src->name.ptr, gguf_type_name(pt->src->type), gguf_type_name(pt->type),
			(unsigned long long)pt->nbytes);
	}
}

/* ---- threads over rows (the strategy's for_rows) ---- */

struct rows_part {
	loom_qs_rows_fn fn;
	void *arg;
	int64_t begin, end;
	int rc;
};

static void *rows_thread(void *p)
{
	struct rows_part *part = p;

	part->rc = part->fn(part->arg, part->begin, part->end);
	return NULL;
}

static int host_for_rows(const struct loom_qstrategy_tensor *t, loom_qs_rows_fn fn, void *arg)
{
	const struct quant_run *r = t->host;
	struct rows_part parts[256];
	pthread_t tid[256];
	bool started[256] = { false };
	int64_t n = r->n_threads < t->rows ? r->n_threads : t->rows;
	int rc = 0;

	if (n <= 1)
		return fn(arg, 0, t->rows);
	for (int64_t i = 0; i < n; i++)
		parts[i] = (struct rows_part){ .fn = fn, .arg = arg, .begin = t->rows * i / n,
					       .end = t->rows * (i + 1) / n };
	for (int64_t i = 1; i < n; i++)
		started[i] = pthread_create(&tid[i], NULL, rows_thread, &parts[i]) == 0;
	rows_thread(&parts[0]);
	for (int64_t i = 1; i < n; i++) {
		if (started[i])
			pthread_join(tid[i], NULL);
		else
			rows_thread(&parts[i]); /* no thread: this one does it */
	}
	for (int64_t i = 0; i < n && !rc; i++)
		rc = parts[i].rc;
	return rc;
}

/* ---- one tensor ---- */

static void *grow(void **buf, size_t *cap, size_t need)
{
	void *nb;

	if (need <= *cap)
		return *buf;
	nb = realloc(*buf, need);
	if (!nb)
		return NULL;
	*buf = nb;
	*cap = need;
	return nb;
}

/* The tensor as f32: the mapping itself for an aligned f32 tensor, else
 * the format plugin's dequantization into *buf (grown to fit). */
static const float *source_f32(const struct plan_tensor *pt, float **buf, size_t *cap,
			       char *err, size_t errlen)
{
	const struct gguf_tensor *t = pt->src;
	size_t n = (size_t)pt->rows * (size_t)pt->cols;
	int rc;

	if (t->type == LOOM_TYPE_F32 && (uintptr_t)t->data % sizeof(float) == 0)
		return t->data;
	if (!grow((void **)buf, cap, n * sizeof(float))) {
		tensor_err(err, errlen, t, "out of memory%s%s", "", "");
		return NULL;
	}
	if (t->type == LOOM_TYPE_F32) {
		memcpy(*buf, t->data, n * sizeof(float));
		return *buf;
	}
	rc = loom_format_get(t->type)->to_float(t->data, *buf, (int64_t)n);
	if (rc) {
		tensor_err(err, errlen, t, "cannot dequantize its %s data (%s)",
			   gguf_type_name(t->type), status_text(rc));
		return NULL;
	}
	return *buf;
}

/* The calibration data of tensor `name` into q->imatrix and q->hessian
 * (NULL when the file has none for it, or no file was given). An entry
 * of another width is an imatrix of another model: refused. */
static int calibration(const struct quant_run *r, const struct plan_tensor *pt,
		       const char *name, struct loom_qstrategy_tensor *q, char *err, size_t errlen)
{
	const struct loom_imatrix_entry *e = loom_imatrix_lookup(r->im, name);

	q->imatrix = NULL;
	q->hessian = NULL;
	if (!e)
		return 0;
	if (e->cols != pt->cols) {
		loom_seterr(err, errlen, "tensor '%s': the imatrix %s has %lld columns for it, the tensor %lld (an imatrix of another model?)",
			    name, r->p.imatrix, (long long)e->cols, (long long)pt->cols);
		return -1;
	}
	q->imatrix = e->mean_sq;
	q->hessian = e->hessian;
	return 0;
}

/* The strategy's view of tensor pt with f32 weights w, its calibration
 * data included. 0, or -1 with err. */
static int describe(struct quant_run *r, const struct plan_tensor *pt, const char *name,
		    const float *w, void *out, struct loom_qstrategy_tensor *qt, char *err,
		    size_t errlen)
{
	*qt = (struct loom_qstrategy_tensor){
		.struct_size = sizeof(*qt), .type = pt->type, .name = name,
		.rows = pt->rows, .cols = pt->cols, .w = w,
		.format = loom_format_get(pt->type), .out = out,
		.out_size = out ? (size_t)pt->nbytes : 0, .for_rows = host_for_rows, .host = r,
	};
	return calibration(r, pt, name, qt, err, errlen);
}

/* ---- input scales (fold.c) ---- */

static bool has_input_scales(const struct loom_qstrategy *s)
{
	return s->struct_size >= offsetof(struct loom_qstrategy, input_scales) + sizeof(void *) &&
	       s->input_scales;
}

static struct plan_tensor *plan_of(struct quant_run *r, const struct gguf_tensor *t)
{
	for (uint64_t i = 0; i < r->n; i++)
		if (r->t[i].src == t)
			return &r->t[i];
	return NULL;
}

/* Whether t goes through the strategy, or can: quantized, or stored as
 * floats (then rewritten in its own type). */
static bool rewritable(struct quant_run *r, const struct gguf_tensor *t)
{
	struct plan_tensor *pt = plan_of(r, t);

	return pt && (pt->convert || block_elems(pt->type, NULL) == 1) && loom_format_get(pt->type);
}

/* Keeps the groups whose members are all quantized, or stored as floats
 * (then they are rewritten through the strategy in their own type); a
 * member copied as a quantized block would not take the scales. */
static int plan_fold(struct quant_run *r, char *err, size_t errlen)
{
	if (!has_input_scales(r->strategy))
		return 0;
	if (quant_fold_plan(&r->fold, r->in, err, errlen))
		return -1;
	for (size_t i = 0; i < r->fold.n; i++) {
		struct fold_group *g = &r->fold.g[i];
		const struct gguf_tensor *t[4] = { g->member[0], g->member[1], g->member[2] };
		int n = g->n;
		bool ok = true;

		if (g->prev->n_dims == 2) /* a matrix's rows take 1/s */
			t[n++] = g->prev;
		else
			ok = plan_of(r, g->prev) != NULL;
		for (int m = 0; m < n && ok; m++)
			ok = rewritable(r, t[m]);
		for (int m = 0; m < n && ok; m++) {
			struct plan_tensor *pt = plan_of(r, t[m]);

			r->n_convert += !pt->convert;
			pt->convert = true;
		}
		if (!ok)
			g->n = 0;
	}
	return 0;
}

/* The group's scales, chosen by the strategy on first use. */
static int group_scales(struct quant_run *r, struct fold_group *g, char *err, size_t errlen)
{
	struct loom_qstrategy_tensor qt[3];
	const struct loom_qstrategy_tensor *ptr[3];
	char names[3][256], msg[512] = "";
	float *buf[3] = { NULL };
	size_t cap[3] = { 0 };
	int rc = 0;

	if (g->scales)
		return 0;
	if (!(g->scales = malloc(sizeof(float) * (size_t)g->cols))) {
		loom_seterr(err, errlen, "out of memory");
		return -1;
	}
	for (int m = 0; m < g->n && !rc; m++) {
		struct plan_tensor *pt = plan_of(r, g->member[m]);
		const float *w = source_f32(pt, &buf[m], &cap[m], err, errlen);

		snprintf(names[m], sizeof(names[m]), "%.*s", (int)pt->src->name.len,
			 pt->src->name.ptr);
		ptr[m] = &qt[m];
		rc = w ? describe(r, pt, names[m], w, NULL, &qt[m], err, errlen) : -1;
	}
	if (!rc) {
		rc = r->strategy->input_scales(ptr, g->n, g->scales, msg, sizeof(msg));
		if (rc)
			rc = tensor_err(err, errlen, g->member[0], "strategy's input scales failed: %s%s",
					msg[0] ? msg : status_text(rc), "");
		else
			rc = quant_fold_check_scales(g, err, errlen);
	}
	for (int m = 0; m < 3; m++)
		free(buf[m]);
	return rc;
}

/* qt's weights times the group's scales per column, its imatrix divided
 * by their squares and its Hessian by s_i s_j, in the run's buffers. */
static int apply_scales(struct quant_run *r, const struct fold_group *g,
			struct loom_qstrategy_tensor *qt, char *err, size_t errlen)
{
	size_t n = (size_t)qt->rows * (size_t)qt->cols, nc = (size_t)qt->cols;
	const float *s = g->scales;

	if (!grow((void **)&r->sbuf, &r->scap, n * sizeof(float)) ||
	    !grow((void **)&r->ibuf, &r->icap, nc * sizeof(float)) ||
	    (qt->hessian && !grow((void **)&r->hbuf, &r->hcap, nc * nc * sizeof(float)))) {
		loom_seterr(err, errlen, "tensor '%s': out of memory", qt->name);
		return -1;
	}
	for (size_t i = 0; i < n; i++)
		r->sbuf[i] = qt->w[i] * s[i % nc];
	qt->w = r->sbuf;
	if (qt->imatrix) {
		for (size_t j = 0; j < nc; j++)
			r->ibuf[j] = qt->imatrix[j] / (s[j] * s[j]);
		qt->imatrix = r->ibuf;
	}
	if (qt->hessian) {
		for (size_t i = 0; i < nc; i++)
			for (size_t j = 0; j < nc; j++)
				r->hbuf[i * nc + j] = qt->hessian[i * nc + j] / (s[i] * s[j]);
		qt->hessian = r->hbuf;
	}
	return 0;
}

/* qt's row j divided by s_j (qt is the prev of g: its output is g's
 * input), in r->sbuf. */
static int apply_row_scales(struct quant_run *r, struct fold_group *g,
			    struct loom_qstrategy_tensor *qt, char *err, size_t errlen)
{
	size_t nc = (size_t)qt->cols, n = (size_t)qt->rows * nc;

	if (group_scales(r, g, err, errlen))
		return -1;
	if (qt->rows != g->cols) {
		loom_seterr(err, errlen, "tensor '%s': %lld rows, the scales %lld", qt->name,
			    (long long)qt->rows, (long long)g->cols);
		return -1;
	}
	if (qt->w != r->sbuf) {
		if (!grow((void **)&r->sbuf, &r->scap, n * sizeof(float))) {
			loom_seterr(err, errlen, "tensor '%s': out of memory", qt->name);
			return -1;
		}
		memcpy(r->sbuf, qt->w, n * sizeof(float));
		qt->w = r->sbuf;
	}
	for (size_t i = 0; i < n; i++)
		r->sbuf[i] /= g->scales[i / nc];
	return 0;
}

/* The norm before a group, its weight divided by the scales. */
static int write_norm(struct quant_run *r, struct fold_group *g, struct gguf_writer *w,
		      char *err, size_t errlen)
{
	const float *src = source_f32(plan_of(r, g->prev), &r->wbuf, &r->wcap, err, errlen);

	if (!src || group_scales(r, g, err, errlen))
		return -1;
	if (!grow((void **)&r->sbuf, &r->scap, sizeof(float) * (size_t)g->cols))
		return tensor_err(err, errlen, g->prev, "out of memory%s%s", "", "");
	for (int64_t j = 0; j < g->cols; j++)
		r->sbuf[j] = src[j] / g->scales[j];
	return gguf_write_bytes(w, r->sbuf, sizeof(float) * (size_t)g->cols, err, errlen);
}

static int convert_one(struct quant_run *r, const struct plan_tensor *pt,
		       struct gguf_writer *w, char *err, size_t errlen)
{
	const struct gguf_tensor *t = pt->src;
	struct loom_qstrategy_tensor qt;
	struct fold_group *g, *pg;
	char name[512], msg[512] = "";
	const float *src = source_f32(pt, &r->wbuf, &r->wcap, err, errlen);
	int rc;

	if (!src)
		return -1;
	if (!grow(&r->obuf, &r->ocap, (size_t)pt->nbytes)) {
		return tensor_err(err, errlen, t, "out of memory%s%s", "", "");
	}
	snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
	if (describe(r, pt, name, src, r->obuf, &qt, err, errlen))
		return -1;
	g = quant_fold_member(&r->fold, t);
	if (g && (group_scales(r, g, err, errlen) || apply_scales(r, g, &qt, err, errlen)))
		return -1;
	pg = quant_fold_prev(&r->fold, t);
	if (pg && apply_row_scales(r, pg, &qt, err, errlen))
		return -1;
	rc = r->strategy->quantize(&qt, msg, sizeof(msg));
	if (rc)
		return tensor_err(err, errlen, t, "strategy failed: %s%s",
				  msg[0] ? msg : status_text(rc), "");
	return gguf_write_bytes(w, r->obuf, (size_t)pt->nbytes, err, errlen);
}

static void progress(const struct quant_run *r, uint64_t i, const struct plan_tensor *pt)
{
	int width = 30, done = r->n ? (int)(width * i / r->n) : width;

	if (!r->p.progress || !isatty(STDERR_FILENO))
		return;
	if (!pt) {
		fprintf(stderr, "\r\033[K");
		return;
	}
	fprintf(stderr, "\r\033[K[%.*s%*s] %llu/%llu %.*s -> %s", done,
		"##############################", width - done, "",
		(unsigned long long)i + 1, (unsigned long long)r->n, (int)pt->src->name.len,
		pt->src->name.ptr, gguf_type_name(pt->type));
}

static int write_all(struct quant_run *r, char *err, size_t errlen)
{
	struct gguf_writer *w = gguf_writer_open(r->p.output, r->p.force ? LOOM_WRITE_FORCE : 0,
						 r->in->alignment, err, errlen);
	int rc;

	if (!w)
		return -1;
	rc = write_header(r, w, err, errlen);
	for (uint64_t i = 0; i < r->n && !rc; i++) {
		const struct plan_tensor *pt = &r->t[i];

		struct fold_group *g = quant_fold_prev(&r->fold, pt->src);

		progress(r, i, pt);
		if (g && g->prev->n_dims == 1)
			rc = write_norm(r, g, w, err, errlen);
		else if (pt->convert)
			rc = convert_one(r, pt, w, err, errlen);
		else
			rc = gguf_write_bytes(w, pt->src->data, (size_t)pt->nbytes, err, errlen);
		gguf_release(r->in, pt->src->data, (size_t)pt->src->nbytes);
		if (!rc)
			rc = gguf_write_pad(w, err, errlen);
	}
	progress(r, r->n, NULL);
	if (rc) {
		gguf_writer_discard(w);
		return -1;
	}
	return gguf_writer_close(w, err, errlen);
}

/* ---- the command ---- */

static int check_paths(const struct quant_run *r, char *err, size_t errlen)
{
	struct stat a, b;

	if (!r->p.input || !r->p.output || !r->p.type || !r->p.input[0] || !r->p.output[0]) {
		loom_seterr(err, errlen, "quantize needs IN.gguf OUT.gguf TYPE");
		return -1;
	}
	if (stat(r->p.input, &a)) {
		loom_seterr(err, errlen, "%s: %s", r->p.input, strerror(errno));
		return -1;
	}
	if (!r->p.dry_run && stat(r->p.output, &b) == 0 && a.st_dev == b.st_dev &&
	    a.st_ino == b.st_ino) {
		loom_seterr(err, errlen, "%s: the output is the input file", r->p.output);
		return -1;
	}
	return 0;
}

/* Loads the strategy (not for a dry run) and the --imatrix file, and
 * checks the strategy gets what it needs. */
static int open_strategy(struct quant_run *r, char *err, size_t errlen)
{
	uint32_t needs = 0;
	bool hessian;

	if (!r->p.dry_run) {
		r->strategy = quant_strategy_open(r->p.strategy, r->strategy_path,
						  sizeof(r->strategy_path), err, errlen);
		if (!r->strategy)
			return -1;
		needs = r->strategy->needs;
	}
	hessian = needs & LOOM_QS_NEEDS_HESSIAN;
	if ((needs & (LOOM_QS_NEEDS_IMATRIX | LOOM_QS_NEEDS_HESSIAN)) && !r->p.imatrix) {
		loom_seterr(err, errlen,
			    "quant strategy %s (%s) needs calibration data (%s): pass --imatrix FILE (made by loom imatrix%s)",
			    r->strategy->name, r->strategy_path,
			    hessian ? "a Hessian" : "an importance matrix",
			    hessian ? " --hessian" : "");
		return -1;
	}
	if (!r->p.imatrix)
		return 0;
	r->im = loom_imatrix_load(r->p.imatrix, hessian ? LOOM_IMATRIX_HESSIAN : 0, err, errlen);
	if (!r->im)
		return -1;
	if (hessian && !loom_imatrix_has_hessian(r->im)) {
		loom_seterr(err, errlen,
			    "quant strategy %s needs Hessians, and %s has none: make it with loom imatrix --hessian",
			    r->strategy->name, r->p.imatrix);
		return -1;
	}
	return 0;
}

/* gguf_open, its refusal naming the file. */
static struct gguf_file *open_input(const char *path, char *err, size_t errlen)
{
	char why[512] = "";
	struct gguf_file *g = gguf_open(path, why, sizeof(why));

	if (!g)
		loom_seterr(err, errlen, "%s%s%s", strstr(why, path) ? "" : path,
			    strstr(why, path) ? "" : ": ", why);
	return g;
}

/* ", 180 of them with imatrix data" with --imatrix, else "". */
static const char *calibrated_text(const struct quant_run *r, char *buf, size_t cap)
{
	if (!r->im)
		return "";
	snprintf(buf, cap, ", %llu of them with imatrix data", (unsigned long long)r->n_calibrated);
	return buf;
}

static int run(struct quant_run *r, char *err, size_t errlen)
{
	struct timespec t0, t1;
	char note[64];

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (check_paths(r, err, errlen) || quant_target_parse(r->p.type, &r->target, err, errlen) ||
	    loom_formats_init(err, errlen))
		return -1;
	if (open_strategy(r, err, errlen))
		return -1;
	r->in = open_input(r->p.input, err, errlen);
	if (!r->in || make_plan(r, err, errlen) || check_calibration(r, err, errlen) ||
	    measure(r, err, errlen))
		return -1;
	if (r->p.dry_run) {
		print_plan(r);
		print_tensors(r);
		return 0;
	}
	if (plan_fold(r, err, errlen))
		return -1;
	if (write_all(r, err, errlen))
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	print_plan(r);
	fprintf(r->out, "loom quantize: wrote %s: %llu tensors (%llu quantized by %s%s), %.2f MiB, general.file_type %u, %.1f s\n",
		r->p.output, (unsigned long long)r->n, (unsigned long long)r->n_convert,
		r->strategy->name, calibrated_text(r, note, sizeof(note)), (double)r->file_bytes / 1048576.0, r->target.ftype,
		(double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
	return 0;
}

int loom_quantize(const struct loom_quantize_params *p, char *err, size_t errlen)
{
	struct quant_run r = { 0 };
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int rc;

	/* a caller built before the appended fields passes a smaller struct */
	if (!p || p->struct_size < offsetof(struct loom_quantize_params, imatrix)) {
		loom_seterr(err, errlen, "loom_quantize: params not initialized (call loom_quantize_params_init)");
		return -1;
	}
	memcpy(&r.p, p, p->struct_size < sizeof(r.p) ? p->struct_size : sizeof(r.p));
	if (!r.p.strategy || !r.p.strategy[0])
		r.p.strategy = "rtn";
	r.out = p->out ? p->out : stdout;
	r.n_threads = p->n_threads > 0 ? p->n_threads : (int)(cores > 0 ? cores : 1);
	if (r.n_threads > 256)
		r.n_threads = 256;
	rc = run(&r, err, errlen);
	free(r.t);
	free(r.wbuf);
	free(r.obuf);
	free(r.sbuf);
	free(r.ibuf);
	free(r.hbuf);
	quant_fold_free(&r.fold);
	loom_imatrix_free(r.im);
	if (r.in)
		gguf_close(r.in);
	return rc;
}
