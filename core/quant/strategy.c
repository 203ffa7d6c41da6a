/* Quantization strategies as a plugin kind of the one loader (loader.h). */
#include "quant/quantize.h"
#include "plugin/loader.h"
#include "util.h"

#include "loom_config.h"

_Static_assert(offsetof(struct loom_qstrategy, abi_major) == 0 &&
	       offsetof(struct loom_qstrategy, abi_minor) == 4 &&
	       offsetof(struct loom_qstrategy, struct_size) == 8,
	       "struct loom_qstrategy does not start as every plugin descriptor does");

#define QSTRATEGY_V1_SIZE (offsetof(struct loom_qstrategy, quantize) + sizeof(void *))

static const struct loom_plugin_slot qstrategy_required[] = {
	LOOM_PLUGIN_SLOT(struct loom_qstrategy, quantize),
};

static const struct loom_plugin_slot qstrategy_optional[] = {
	LOOM_PLUGIN_SLOT(struct loom_qstrategy, input_scales),
};

/* After the common checks (the name is a string of the plugin, the slots
 * its code): the name is not empty, the needs are known. */
static int check_qstrategy(const char *path, void *dl, const void *desc, char *err,
			   size_t errlen)
{
	const struct loom_qstrategy *s = desc;
	uint32_t known = LOOM_QS_NEEDS_IMATRIX | LOOM_QS_NEEDS_HESSIAN;

	(void)dl;

	if (!s->name || !s->name[0]) {
		loom_seterr(err, errlen, "quant strategy %s: descriptor has no name", path);
		return -1;
	}
	if (s->needs & ~known) {
		loom_seterr(err, errlen, "quant strategy %s: needs flags 0x%x unknown to this loom",
			    path, s->needs & ~known);
		return -1;
	}
	return 0;
}

static const struct loom_plugin_kind qstrategy_kind = {
	.what = "quant strategy", .desc_name = "descriptor", .entry = LOOM_QSTRATEGY_ENTRY,
	.env = "LOOM_QSTRATEGY_PATH", .build_dir = LOOM_BUILD_ROOT "/plugins/qstrategy",
	.dir = "qstrategy", .add_suffix = true,
	.abi_major = LOOM_QSTRATEGY_ABI_MAJOR, .min_size = QSTRATEGY_V1_SIZE,
	.required = qstrategy_required,
	.n_required = sizeof(qstrategy_required) / sizeof(qstrategy_required[0]),
	.optional = qstrategy_optional,
	.n_optional = sizeof(qstrategy_optional) / sizeof(qstrategy_optional[0]),
	.name_required = true,
	.check = check_qstrategy,
};

const struct loom_qstrategy *quant_strategy_open(const char *name, char *path, size_t cap,
						  char *err, size_t errlen)
{
	void *dl;

	return loom_plugin_open(&qstrategy_kind, name, path, cap, &dl, err, errlen);
}
