/*
 * AMX-INT8 prefill GEMM over qgemm's 16-row panels (qgemm.h).
 *
 * A panel group (4 values of each of 16 weight rows, 64 bytes) is one row
 * of an AMX B tile as TDPBSUD reads it: 16 dword columns of 4 unsigned
 * bytes. The activations' int8 bytes of one block, 16 rows of them, are
 * the A tile (signed). So per block, one TDPBSUD gives the 16 x 16 exact
 * integer dot products that qgemm's VNNI kernel builds with B/4 vpdpbusd,
 * and the float work after it (scale, minimum) is the VNNI kernel's, lane
 * for lane: the result equals qgemm_run()'s and qgemm_ref()'s bit for bit.
 *
 * The tile operations (load, zero, dot-product accumulate, store) are a
 * thin layer with two builds: the AMX instructions (AMX_HW), or a plain C
 * emulation of exactly those instructions' semantics (AMX_EMU), which runs
 * on any AVX-512 VNNI CPU so that the layout and the accumulation order
 * are tested where no AMX unit exists.
 */
#ifndef LOOM_CPU_AMX_H
#define LOOM_CPU_AMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qgemm.h"

enum amx_mode {
	AMX_OFF, /* qgemm_run() as before */
	AMX_EMU, /* the tile layer in C (tests, LOOM_CPU_ISA=amx-emu) */
	AMX_HW,  /* the AMX instructions */
};

/* Whether the CPU reports AMX-TILE and AMX-INT8 and the OS enables their
 * state in XCR0 (the process must still ask for it: amx_request()). */
bool amx_hw_present(void);
/* Asks the kernel for tile data state for this process (arch_prctl
 * ARCH_REQ_XCOMP_PERM); once, before any thread touches a tile. 0 when
 * granted; otherwise -1 with the reason in why. */
int amx_request(char *why, size_t why_size);
/* Whether mode has a kernel for type on this CPU (AMX_EMU: AVX-512 VNNI
 * for the float work; AMX_HW: amx_hw_present()). */
bool amx_supported(enum amx_mode mode, uint32_t type);
/* qgemm_run()'s contract, through tiles in the given mode. */
void amx_qgemm_run(enum amx_mode mode, uint32_t type, const void *panel, int rows,
		   const struct qdot_block *x, const struct qgemm_x *prep, int64_t m, int64_t k,
		   float *y, int64_t ys);
const char *amx_mode_name(enum amx_mode mode);

/*
 * AMX-BF16, fast mode, bf16 weights: fgemm.h's pair panels (32 weight
 * rows, pair p of row r at panel[p * 32 + r]) as B tiles, 16 weight rows
 * (64 bytes) a tile row, and the activations' bf16 pairs as A tiles; one
 * TDPBF16PS adds 16 pairs of products to 16 x 16 sums. The emulation
 * follows the instruction as Intel's intrinsics guide writes it (pair
 * after pair; in a pair the lower bf16's product first, then the upper's,
 * each rounded to nearest even, denormals as zero): amx_pairs_ref(). That
 * is not vdpbf16ps's order (upper first, fgemm_pairs_ref()), so the two
 * paths round differently; both are held to the conformance tolerance.
 * Not run on AMX hardware yet (no host had it).
 */
bool amx_pairs_supported(enum amx_mode mode);
/* y[i * ys + r] for i < m, r < rows: x_i (kp pairs apart) . panel row r. */
void amx_pairs_run(enum amx_mode mode, const uint32_t *panel, int rows, const uint32_t *x,
		   int64_t m, int64_t kp, float *y, int64_t ys);
/* The reference of one element over kp pairs. */
float amx_pairs_ref(const uint32_t *x, const uint32_t *w, int64_t kp);

#endif /* LOOM_CPU_AMX_H */
