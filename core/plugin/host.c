/* The host lent to plugins: the format registry and the services table
 * (see host.h). Quantization plugins load through the one loader
 * (loader.h); this file holds only what is theirs. */
#include "plugin/host.h"
#include "plugin/loader.h"
#include "plugin/mapcheck.h"
#include "util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom_config.h"

struct loom_host {
	struct loom_backend_host services; /* lent to backends; .host is this */
	pthread_mutex_t lock;              /* held while plugins register */
	bool formats_scanned;
	/* the registry: entries point into plugins, which stay loaded */
	const struct loom_quant_format *formats[LOOM_TYPE_COUNT];
	struct loom_format_info format_infos[LOOM_TYPE_COUNT];
};

/* ---- the services table's callbacks; `host` is the struct loom_host ---- */

static void host_log(void *host, enum loom_log_level level, const char *msg)
{
	(void)host;
	loom_log(level, "%s", msg);
}

static const struct loom_format_info *host_format_info(void *host, uint32_t type)
{
	struct loom_host *h = host;

	return type < LOOM_TYPE_COUNT && h->formats[type] ? &h->format_infos[type] : NULL;
}

static int host_to_float(void *host, uint32_t type, const void *src, float *dst, int64_t n)
{
	struct loom_host *h = host;

	if (type >= LOOM_TYPE_COUNT || !h->formats[type])
		return LOOM_ERR_UNSUPPORTED;
	return h->formats[type]->to_float(src, dst, n);
}

static struct loom_host default_host = {
	.services = {
		.abi_major = LOOM_BACKEND_ABI_MAJOR,
		.struct_size = sizeof(struct loom_backend_host),
		.host = &default_host,
		.log = host_log,
		.format_info = host_format_info,
		.to_float = host_to_float,
	},
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

struct loom_host *loom_host_default(void)
{
	return &default_host;
}

const struct loom_backend_host *loom_host_services(void)
{
	return &default_host.services;
}

/* ---- quantization plugins ---- */

#define QUANT_V1_SIZE (offsetof(struct loom_quant_plugin, formats) + sizeof(void *))
/* A format as ABI 1.0 defined it: up to from_float. */
#define FORMAT_V1_SIZE (offsetof(struct loom_quant_format, from_float) + sizeof(void *))

/* Format i of p's table: the table's stride is its formats' struct_size
 * (a plugin built against an older header has smaller entries). */
static const struct loom_quant_format *format_at(const struct loom_quant_plugin *p, uint32_t i)
{
	return (const struct loom_quant_format *)((const char *)p->formats +
						  (size_t)i * p->formats[0].struct_size);
}

/* The name is a string and the functions are code of the plugin (dl;
 * NULL: any object), the weighted one only where the format's
 * struct_size has it. */
static bool format_pointers_ok(void *dl, const struct loom_quant_format *f)
{
	size_t weighted_end = offsetof(struct loom_quant_format, from_float_weighted) + sizeof(void *);

	if (!loom_map_string_in(dl, f->name, 64) ||
	    !loom_map_in_object(dl, (const void *)f->to_float, 1, true) ||
	    !loom_map_in_object(dl, (const void *)f->from_float, 1, true))
		return false;
	return f->struct_size < weighted_end || !f->from_float_weighted ||
	       loom_map_in_object(dl, (const void *)f->from_float_weighted, 1, true);
}

/* The format table lies in the plugin's readable segments: n_formats
 * entries of formats[0].struct_size bytes. */
static bool table_fits(void *dl, const struct loom_quant_plugin *p)
{
	return p->n_formats <= SIZE_MAX / p->formats[0].struct_size &&
	       loom_map_in_object(dl, p->formats, (size_t)p->n_formats * p->formats[0].struct_size,
				  false);
}

static int check_quant(const char *path, void *dl, const void *desc, char *err, size_t errlen)
{
	const struct loom_quant_plugin *p = desc;

	if (p->n_formats && !p->formats) {
		loom_seterr(err, errlen, "quant plugin %s: %u formats but no format table", path,
			    p->n_formats);
		return -1;
	}
	if (p->n_formats && !loom_map_in_object(dl, p->formats, FORMAT_V1_SIZE, false)) {
		loom_seterr(err, errlen, "quant plugin %s: format table (%p) is not readable in the plugin",
			    path, (const void *)p->formats);
		return -1;
	}
	if (p->n_formats && (p->formats[0].struct_size < FORMAT_V1_SIZE ||
			     p->formats[0].struct_size % sizeof(void *))) {
		loom_seterr(err, errlen, "quant plugin %s: format struct_size %u (at least %zu, a multiple of %zu)",
			    path, p->formats[0].struct_size, FORMAT_V1_SIZE, sizeof(void *));
		return -1;
	}
	if (p->n_formats && !table_fits(dl, p)) {
		loom_seterr(err, errlen, "quant plugin %s: %u formats run past the readable format table",
			    path, p->n_formats);
		return -1;
	}
	for (uint32_t i = 0; i < p->n_formats; i++) {
		const struct loom_quant_format *f = format_at(p, i);

		if (f->struct_size != p->formats[0].struct_size) {
			loom_seterr(err, errlen, "quant plugin %s: format %u has struct_size %u, format 0 %u",
				    path, i, f->struct_size, p->formats[0].struct_size);
			return -1;
		}
		if (f->type >= LOOM_TYPE_COUNT || !f->to_float || !f->from_float ||
		    !f->block_elems || !f->block_bytes || !f->name) {
			loom_seterr(err, errlen, "quant plugin %s: format %u is incomplete", path, i);
			return -1;
		}
		if (!format_pointers_ok(dl, f)) {
			loom_seterr(err, errlen, "quant plugin %s: format %u has a name or function outside the plugin",
				    path, i);
			return -1;
		}
	}
	return 0;
}

/* No required slots: a format's own are checked by check_quant. */
static const struct loom_plugin_kind quant_kind = {
	.what = "quant plugin", .desc_name = "descriptor", .entry = LOOM_QUANT_ENTRY,
	.env = "LOOM_QUANT_PATH", .build_dir = LOOM_BUILD_ROOT "/plugins/quant",
	.dir = "quant",
	.abi_major = LOOM_PLUGIN_ABI_MAJOR, .min_size = QUANT_V1_SIZE, .check = check_quant,
};

const struct loom_plugin_kind *loom_quant_plugin_kind(void)
{
	return &quant_kind;
}

/* Loads one quant plugin into host h's registry (h->lock held). A later
 * plugin's format replaces an earlier one's of the same type. */
static int register_plugin(const char *path, void *ctx, char *err, size_t errlen)
{
	struct loom_host *h = ctx;
	const struct loom_quant_plugin *p;
	void *dl;

	p = loom_plugin_load(&quant_kind, path, &dl, err, errlen);
	if (!p)
		return -1; /* check_quant saw the format table inside the plugin */
	for (uint32_t i = 0; i < p->n_formats; i++) {
		const struct loom_quant_format *f = format_at(p, i);

		h->formats[f->type] = f;
		h->format_infos[f->type] = (struct loom_format_info){
			.type = f->type, .block_elems = f->block_elems,
			.block_bytes = f->block_bytes, .name = f->name,
		};
	}
	return 0; /* never dlclose: the registry points into the plugin */
}

int loom_formats_load_plugin(const char *path, char *err, size_t errlen)
{
	struct loom_host *h = &default_host;
	int rc;

	pthread_mutex_lock(&h->lock);
	rc = register_plugin(path, h, err, errlen);
	pthread_mutex_unlock(&h->lock);
	return rc;
}

int loom_formats_init(char *err, size_t errlen)
{
	struct loom_host *h = &default_host;
	int rc = 0;

	pthread_mutex_lock(&h->lock);
	if (!h->formats_scanned) {
		rc = loom_plugin_scan(&quant_kind, register_plugin, h, err, errlen);
		h->formats_scanned = rc == 0;
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

const struct loom_quant_format *loom_format_get(uint32_t type)
{
	return type < LOOM_TYPE_COUNT ? default_host.formats[type] : NULL;
}
