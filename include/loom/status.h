/*
 * loom status codes: what every loom function that can fail returns, on
 * both sides of every boundary (public API, backend and plugin ABIs, the
 * core inside). 0 is success; each failure is its own negative value, so
 * "out of KV blocks" and "a malloc failed" never look the same.
 *
 * Values are part of the ABI: never renumber; new codes are appended.
 */
#ifndef LOOM_STATUS_H
#define LOOM_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

enum loom_status {
	LOOM_OK = 0,
	LOOM_ERR_INVALID = -1,     /* bad argument, shape or stride */
	LOOM_ERR_NOMEM = -2,       /* host or device allocation failed */
	LOOM_ERR_UNSUPPORTED = -3, /* op/format/variant not implemented */
	LOOM_ERR_DEVICE = -4,      /* device or driver failure, or none found */
	LOOM_ERR_IO = -5,          /* file or stream error (host side) */
	LOOM_ERR_FORMAT = -6,      /* malformed input data (host side) */
	/* ---- appended (core 0.2) ---- */
	LOOM_ERR_FULL = -7,        /* no room now: KV blocks, or the waiting queue */
	LOOM_ERR_CONTEXT = -8,     /* a sequence would exceed its context */
};

#ifdef __cplusplus
}
#endif
#endif /* LOOM_STATUS_H */
