/* loom backends: the backend search path and every file on it, loaded or
 * refused with the loader's reason; loom check-backend: the conformance
 * suite. Both through the public API (loom.h). */
#include "backends.h"

#include <stdio.h>
#include <string.h>

/* s as a JSON string literal. */
void loom_json_string(FILE *out, const char *s)
{
	fputc('"', out);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", out);
		else if (c < 0x20)
			fprintf(out, "\\u%04x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}

struct list_out {
	bool json;
	int n; /* entries printed */
};

static double gib(uint64_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

static void print_text(const struct loom_backend_listing *l)
{
	if (l->refused) {
		printf("refused  %s\n", l->refused);
		return;
	}
	printf("%-8s %s  ABI %u.%u (table %u bytes)%s%s\n", l->name, l->path, l->abi_major,
	       l->abi_minor, l->struct_size, l->shadowed_by ? ", shadowed by " : "",
	       l->shadowed_by ? l->shadowed_by : "");
	if (l->create_error) {
		printf("         not usable here: %s\n", l->create_error);
		return;
	}
	printf("         device   %s", l->device[0] ? l->device : "(unnamed)");
	if (l->mem_total)
		printf(", %.1f GiB (%.1f GiB free)", gib(l->mem_total), gib(l->mem_free));
	printf("\n         gemm     %s\n", l->gemm_formats[0] ? l->gemm_formats : "-");
	printf("         embed    %s\n", l->embed_formats[0] ? l->embed_formats : "-");
	printf("         ops      %s\n", l->ops[0] ? l->ops : "-");
	printf("         optional %s\n", l->optional[0] ? l->optional : "none");
}

static void json_field(const char *key, const char *value, bool last)
{
	printf("\"%s\": ", key);
	if (value)
		loom_json_string(stdout, value);
	else
		fputs("null", stdout);
	fputs(last ? "" : ", ", stdout);
}

static void print_json(const struct loom_backend_listing *l)
{
	putchar('{');
	json_field("path", l->path, false);
	json_field("refused", l->refused, false);
	json_field("shadowed_by", l->shadowed_by, false);
	json_field("name", l->name, !!l->refused);
	if (!l->refused) {
		printf("\"abi\": \"%u.%u\", \"struct_size\": %u, ", l->abi_major, l->abi_minor,
		       l->struct_size);
		json_field("create_error", l->create_error, !!l->create_error);
	}
	if (!l->refused && !l->create_error) {
		json_field("device", l->device, false);
		printf("\"mem_total\": %llu, \"mem_free\": %llu, ",
		       (unsigned long long)l->mem_total, (unsigned long long)l->mem_free);
		json_field("gemm", l->gemm_formats, false);
		json_field("embed", l->embed_formats, false);
		json_field("ops", l->ops, false);
		json_field("optional", l->optional, true);
	}
	putchar('}');
}

static void on_listing(void *user, const struct loom_backend_listing *l)
{
	struct list_out *lo = user;

	if (lo->json) {
		fputs(lo->n ? ",\n  " : "\n  ", stdout);
		print_json(l);
	} else {
		print_text(l);
	}
	lo->n++;
	fflush(stdout);
}

/* The search path, one folder a line (text) or a JSON array. */
static int print_path(bool json, char *err, size_t errlen)
{
	char path[16384], *dir, *save;
	bool first = true;

	if (loom_plugin_path("backends", path, sizeof(path))) {
		snprintf(err, errlen, "the backend search path is too long to show");
		return -1;
	}
	printf(json ? "{\"search_path\": [" :
	       "search path ($LOOM_BACKEND_PATH, user folder, built-in folder):\n");
	for (dir = strtok_r(path, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
		if (json) {
			fputs(first ? "" : ", ", stdout);
			loom_json_string(stdout, dir);
		} else {
			printf("  %s\n", dir);
		}
		first = false;
	}
	printf(json ? "],\n \"backends\": [" : "\n");
	return 0;
}

int loom_backends_main(const struct loom_options *o, char *err, size_t errlen)
{
	struct list_out lo = { .json = o->json };
	int rc;

	if (print_path(o->json, err, errlen))
		return -1;
	rc = loom_backends_list(on_listing, &lo, err, errlen);
	if (o->json)
		printf("\n]}\n");
	return rc;
}

int loom_check_main(const struct loom_options *o, char *err, size_t errlen)
{
	struct loom_check_params p;

	if (o->n_args < 1) {
		snprintf(err, errlen, "usage: loom check-backend BACKEND.so [--model FILE]");
		return -1;
	}
	loom_check_params_init(&p);
	p.backend = o->args[0];
	p.reference = o->reference;
	p.model = o->model[0] ? o->model : NULL;
	p.n_tokens = o->n_predict;
	p.n_threads = o->n_threads;
	p.json = o->json;
	return loom_check_backend(&p, err, errlen) ? -1 : 0;
}
