/* The host (internal): what the core lends its plugins, one object per
 * process. It owns the quantization format registry (filled by the
 * format plugins, read by the core and by backends through the services
 * table) and routes every message a plugin logs to loom_log (util.h).
 *
 * The services table lent to backends (struct loom_backend_host) carries
 * the host in its `host` field, the first argument of every callback, so
 * a callback reaches the registry it belongs to rather than a global.
 */
#ifndef LOOM_PLUGIN_HOST_H
#define LOOM_PLUGIN_HOST_H

#include <stdint.h>

#include "loom/backend.h"
#include "loom/plugin.h"

struct loom_host;

/* The process's host. */
struct loom_host *loom_host_default(void);
/* The services table the host lends every backend; ->host is the host. */
const struct loom_backend_host *loom_host_services(void);

/* ---- quantization format registry ----
 *
 * Not filled as a side effect of anything else: whoever needs formats
 * (loading a model, `loom quantize`, a test) calls loom_formats_init. */

/* Loads every quantization plugin (*.so) from the build tree's
 * plugins/quant/ (else <libdir>/loom/quant/), then from each folder of
 * $LOOM_QUANT_PATH, whose formats override built-in ones. Idempotent.
 * 0, or -1 with err naming the file and reason. */
int loom_formats_init(char *err, size_t errlen);
/* Loads one plugin file explicitly. 0 or -1 with err. */
int loom_formats_load_plugin(const char *path, char *err, size_t errlen);
/* The registered format for a GGUF type id, or NULL. */
const struct loom_quant_format *loom_format_get(uint32_t type);

#endif /* LOOM_PLUGIN_HOST_H */
