/*
 * Backend conformance suite (internal): shared harness (tb = test bench),
 * run by `loom check-backend` (check.c, loom_check_backend in loom.h) and
 * by tests/backend.
 *
 * A struct dev is one loaded backend with a list of the device buffers the
 * current case allocated. Test code builds its inputs in host memory,
 * copies them to each backend with dev_put(), runs the operator there, and
 * reads the result back with dev_get(), so the same code drives host
 * backends (ref, cpu) and device backends (cuda, rocm).
 */
#ifndef LOOM_TB_H
#define LOOM_TB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "plugin/backend_loader.h"

#define TB_MAX_BUFS 64

struct dev {
	const char *name;          /* "ref", "cpu", ... */
	struct loom_backend *b;
	const struct loom_backend_ops *ops;
	struct loom_backend_ctx *ctx;
	struct loom_buffer *bufs[TB_MAX_BUFS];
	int n_bufs;
};

/* ---- devices ---- */
/* Loads and creates backend `name` (n_threads 0: its choice). */
int dev_open(struct dev *d, const char *name, int n_threads, char *err, size_t errlen);
/* The same with config flags (LOOM_BACKEND_BATCH_INVARIANT, ...). */
int dev_open_flags(struct dev *d, const char *name, int n_threads, uint32_t flags, char *err,
		   size_t errlen);
void dev_close(struct dev *d);
/* A device copy of n bytes of src (src NULL: uninitialized); NULL on failure. */
void *dev_put(struct dev *d, const void *src, size_t n);
/* Synchronizes, then copies n bytes of device memory at src to dst. */
int dev_get(struct dev *d, void *dst, const void *src, size_t n);
/* Frees every buffer of the current case. */
void dev_reset(struct dev *d);

/* ---- data ---- */
void tb_seed(uint64_t seed);
/* The backend under test runs a fast mode (not LOOM_BACKEND_EXACT; for
 * cpu.so 8-bit activations in gemm): quantized gemm is judged with the
 * fast-mode tolerance of conformance.c. */
extern bool tb_fast;
float tb_rand(void);                      /* uniform in [-1, 1) */
int64_t tb_rand_int(int64_t n);           /* uniform in [0, n) */
void tb_fill(float *x, int64_t n, float amp);
/* A float array of n elements, every element the poison NaN. */
float *tb_poison(int64_t n);
void *tb_xmalloc(size_t n);

/* ---- comparison and reporting ---- */
/* Where FAIL lines and the summary go: tb_log, or stdout when NULL. */
extern FILE *tb_log;
FILE *tb_out(void);
/* Exit status of a run the watchdog ended (a hang or a crash). */
#define TB_EXIT_CRASH 3
/* In the process that runs the cases: after `seconds`, or on a crash
 * signal, write "FAIL <the current case>: timed out|crashed" to tb_out()
 * and _exit(TB_EXIT_CRASH). */
void tb_watchdog(unsigned seconds);
/* sum((a-b)^2) / sum(b^2) over rows x n elements with row stride `stride`
 * (sum((a-b)^2) when b is all zeros); +inf when a holds a NaN or inf. */
double tb_nmse(const float *a, const float *b, int64_t rows, int64_t n, int64_t stride);
/* Whether a and orig agree bit for bit outside the logical rows x n elements
 * of a buffer of rows x stride floats (the padding between rows). */
bool tb_padding_same(const float *a, const float *orig, int64_t rows, int64_t n,
		     int64_t stride);

/* Records one comparison of backend d against ref for op/fmt. */
void tb_result(const struct dev *d, const char *op, const char *fmt, double tol,
	       double nmse, const char *desc);
/* Records a failure that is not a numeric mismatch. */
void tb_fail(const struct dev *d, const char *op, const char *fmt, const char *fmt_msg, ...)
	__attribute__((format(printf, 4, 5)));
/* Names the case about to run, for the watchdog's message if it hangs. */
void tb_current(const struct dev *d, const char *op, const char *fmt, const char *desc);
/* Records that a case was skipped (unsupported, with a reason). */
void tb_skip(const struct dev *d, const char *op, const char *fmt);
/* Prints the per-op/format summary; returns the number of failures. */
int tb_summary(void);
/* s as a JSON string literal. */
void tb_json_string(FILE *out, const char *s);
/* The same as a JSON array of {backend, op, format, cases, ...}. */
void tb_summary_json(FILE *out);
/* "rmsnorm f32, gemm f16": the op/format pairs that failed ("" if none). */
void tb_failed_ops(char *buf, size_t cap);
int tb_failures(void);

/*
 * Judges an operator's status against what supports() announced.
 * Returns true when the outputs should be compared; otherwise records a
 * skip (unsupported and said so) or a failure (any other mismatch).
 */
bool tb_status_ok(const struct dev *d, const char *op, const char *fmt,
		  bool supported, int rc, const char *desc);

const char *tb_type_name(uint32_t type);
const char *tb_status_name(int rc);

/* ---- the checks ---- */
int tb_check_ref_by_hand(struct dev *ref);             /* hand_checks.c */
void tb_run_conformance(struct dev *ref, struct dev *d); /* conformance.c */
void tb_run_invalid(struct dev *d);                    /* invalid.c */
/* invariance.c: backend `name` with LOOM_BACKEND_BATCH_INVARIANT (and
 * LOOM_BACKEND_EXACT when exact), rows alone against the same rows in
 * batches, bit for bit; reported under `label` as inv-gemm, inv-attention,
 * inv-rmsnorm... Returns -1 (with err) when it does not load, else 0. */
int tb_run_invariance(const char *name, const char *label, bool exact, char *err,
		      size_t errlen);
/* The control: gemm rows of `name` without the flag that differ from the
 * same row alone (reported, never judged); -1 when it does not load. */
int tb_invariance_control(const char *name);
/* moe.c: the routed-expert slot (ABI 1.6) of d against ref for weights of
 * `type`, judged at tol; and, on a context opened batch invariant, rows
 * alone against the same rows in a call (reported under label). Both
 * skip a backend without the slot. */
void tb_run_moe(struct dev *ref, struct dev *d, uint32_t type, double tol);
void tb_run_moe_oai(struct dev *ref, struct dev *d, uint32_t type, double tol);
void tb_moe_invariance(struct dev *d, const char *label, uint32_t type);

#endif /* LOOM_TB_H */
