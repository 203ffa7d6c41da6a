/*
 * quant_tool: drives the quantization plugins (via dlopen, as a host does)
 * for the Python reference tests.
 *
 *   quant_tool list PLUGIN.so...
 *       one line per plugin: "plugin FAMILY ABI_MAJOR ABI_MINOR STRUCT_SIZE"
 *       and per format: "format NAME TYPE BLOCK_ELEMS BLOCK_BYTES"
 *   quant_tool dequant PLUGIN.so FORMAT IN OUT [OFFSET NBYTES]
 *       decodes NBYTES (default: all of IN) starting at OFFSET of IN and
 *       writes the floats (native f32) to OUT
 *   quant_tool quant PLUGIN.so FORMAT IN OUT
 *       encodes the native f32 values of IN and writes the blocks to OUT
 *
 * Exit status 0 on success, 1 with a message on stderr otherwise.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"

static const struct loom_quant_plugin *load(const char *path)
{
	loom_quant_entry_fn entry;
	const struct loom_quant_plugin *p;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		fprintf(stderr, "quant_tool: %s\n", dlerror());
		return NULL;
	}
	*(void **)&entry = dlsym(h, LOOM_QUANT_ENTRY);
	if (!entry) {
		fprintf(stderr, "quant_tool: %s: no %s\n", path, LOOM_QUANT_ENTRY);
		return NULL;
	}
	p = entry();
	if (!p || p->abi_major != LOOM_PLUGIN_ABI_MAJOR ||
	    p->struct_size < sizeof(*p)) {
		fprintf(stderr, "quant_tool: %s: incompatible plugin\n", path);
		return NULL;
	}
	return p;
}

static const struct loom_quant_format *find(const char *path, const char *name)
{
	const struct loom_quant_plugin *p = load(path);

	if (!p)
		return NULL;
	for (uint32_t i = 0; i < p->n_formats; i++)
		if (!strcmp(p->formats[i].name, name))
			return &p->formats[i];
	fprintf(stderr, "quant_tool: %s has no format %s\n", path, name);
	return NULL;
}

/* Reads len bytes at off of path into a new buffer (len < 0: to the end). */
static void *read_range(const char *path, long long off, long long len, size_t *out_len)
{
	FILE *f;
	void *buf = NULL;
	long long end;

	errno = 0;
	f = fopen(path, "rb");
	if (!f || fseeko(f, 0, SEEK_END) != 0 || (end = ftello(f)) < 0)
		goto out_err;
	if (len < 0)
		len = end - off;
	if (off < 0 || len < 0 || off > end || len > end - off ||
	    (unsigned long long)len > SIZE_MAX - 1)
		goto out_err;
	buf = malloc(len ? (size_t)len : 1);
	if (!buf || fseeko(f, off, SEEK_SET) != 0 ||
	    fread(buf, 1, (size_t)len, f) != (size_t)len)
		goto out_err;
	fclose(f);
	*out_len = (size_t)len;
	return buf;
out_err:
	fprintf(stderr, "quant_tool: cannot read %lld bytes at %lld of %s: %s\n",
		len, off, path, errno ? strerror(errno) : "out of range");
	free(buf);
	if (f)
		fclose(f);
	return NULL;
}

static int write_all(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(buf, 1, len, f) == len;

	if (f && fclose(f) != 0)
		ok = 0;
	if (!ok)
		fprintf(stderr, "quant_tool: cannot write %s\n", path);
	return ok ? 0 : -1;
}

static int cmd_list(int argc, char **argv)
{
	for (int i = 0; i < argc; i++) {
		const struct loom_quant_plugin *p = load(argv[i]);

		if (!p)
			return 1;
		printf("plugin %s %" PRIu32 " %" PRIu32 " %" PRIu32 "\n", p->name,
		       p->abi_major, p->abi_minor, p->struct_size);
		for (uint32_t j = 0; j < p->n_formats; j++) {
			const struct loom_quant_format *f = &p->formats[j];

			printf("format %s %" PRIu32 " %" PRIu32 " %" PRIu32 "\n",
			       f->name, f->type, f->block_elems, f->block_bytes);
		}
	}
	return 0;
}

static int cmd_dequant(int argc, char **argv)
{
	const struct loom_quant_format *f;
	long long off = 0, len = -1;
	size_t n_bytes, n_blocks;
	float *out = NULL;
	void *in;
	int ret = 1;

	if (argc == 6) {
		off = strtoll(argv[4], NULL, 10);
		len = strtoll(argv[5], NULL, 10);
	} else if (argc != 4) {
		fprintf(stderr, "usage: quant_tool dequant SO FORMAT IN OUT [OFFSET NBYTES]\n");
		return 1;
	}
	f = find(argv[0], argv[1]);
	if (!f || !(in = read_range(argv[2], off, len, &n_bytes)))
		return 1;
	n_blocks = n_bytes / f->block_bytes;
	if (n_bytes % f->block_bytes ||
	    n_blocks > SIZE_MAX / sizeof(float) / f->block_elems) {
		fprintf(stderr, "quant_tool: %zu bytes is not a whole number of %s blocks\n",
			n_bytes, f->name);
		goto out_free_in;
	}
	out = malloc(n_blocks * f->block_elems * sizeof(float) + 1);
	if (!out)
		goto out_free_in;
	if (f->to_float(in, out, (int64_t)(n_blocks * f->block_elems)) != LOOM_OK) {
		fprintf(stderr, "quant_tool: %s to_float failed\n", f->name);
		goto out_free_out;
	}
	if (write_all(argv[3], out, n_blocks * f->block_elems * sizeof(float)) == 0)
		ret = 0;
out_free_out:
	free(out);
out_free_in:
	free(in);
	return ret;
}

static int cmd_quant(int argc, char **argv)
{
	const struct loom_quant_format *f;
	size_t n_bytes, n, n_blocks;
	void *out = NULL;
	float *in;
	int ret = 1;

	if (argc != 4) {
		fprintf(stderr, "usage: quant_tool quant SO FORMAT IN OUT\n");
		return 1;
	}
	f = find(argv[0], argv[1]);
	if (!f || !(in = read_range(argv[2], 0, -1, &n_bytes)))
		return 1;
	n = n_bytes / sizeof(float);
	n_blocks = n / f->block_elems;
	if (n_bytes % sizeof(float) || n % f->block_elems) {
		fprintf(stderr, "quant_tool: %zu bytes is not a whole number of %s blocks of floats\n",
			n_bytes, f->name);
		goto out_free_in;
	}
	out = malloc(n_blocks * f->block_bytes + 1);
	if (!out)
		goto out_free_in;
	if (f->from_float(in, out, (int64_t)n) != LOOM_OK) {
		fprintf(stderr, "quant_tool: %s from_float failed\n", f->name);
		goto out_free_out;
	}
	if (write_all(argv[3], out, n_blocks * f->block_bytes) == 0)
		ret = 0;
out_free_out:
	free(out);
out_free_in:
	free(in);
	return ret;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "list"))
		return cmd_list(argc - 2, argv + 2);
	if (argc >= 2 && !strcmp(argv[1], "dequant"))
		return cmd_dequant(argc - 2, argv + 2);
	if (argc >= 2 && !strcmp(argv[1], "quant"))
		return cmd_quant(argc - 2, argv + 2);
	fprintf(stderr, "usage: quant_tool list|dequant|quant ...\n");
	return 1;
}
