/*
 * fuse_io.h: what a fused group of calls reads and writes, shared by the
 * backends that run several of a step region's calls as one (cpu.so's
 * region.c, the GPU backends' gpu_fuse.c).
 *
 * A group runs its members at once, so a call joins only when nothing it
 * writes overlaps what another member reads or writes. The spans below
 * are byte ranges of rows; an empty span ({0, 0}) overlaps nothing, so a
 * backend that does not fuse a norm leaves norm_x and norm_w empty.
 * Header-only: each backend is its own shared object.
 */
#ifndef LOOM_BACKENDS_FUSE_IO_H
#define LOOM_BACKENDS_FUSE_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most gemms any backend groups (cpu.so 4, the GPU backends 3). */
#define FUSE_GROUP_MAX 4

/* Bytes [lo, hi). */
struct span {
	uintptr_t lo, hi;
};

/* `rows` rows of n floats, `stride` floats apart (the calls were checked,
 * so this does not overflow). */
static inline struct span rows_span(const float *p, int64_t rows, int64_t stride, int64_t n)
{
	struct span s = { (uintptr_t)p, (uintptr_t)p };

	if (rows > 0 && n > 0)
		s.hi = s.lo + ((size_t)(rows - 1) * (size_t)stride + (size_t)n) * sizeof(float);
	return s;
}

static inline bool overlap(struct span a, struct span b)
{
	return a.lo < b.hi && b.lo < a.hi;
}

/* An operand that is exactly the given rows (same address and stride):
 * the one overlap an element-wise epilogue allows. */
static inline bool same_rows(const float *a, int64_t as, const float *b, int64_t bs)
{
	return a == b && as == bs;
}

/* What the group built so far reads and writes. */
struct group_io {
	struct span x;                         /* the shared activation rows */
	struct span norm_x, norm_w;            /* what a fused norm making x reads */
	struct span w[FUSE_GROUP_MAX];         /* weights */
	struct span y[FUSE_GROUP_MAX];         /* gemm outputs */
	struct span out[FUSE_GROUP_MAX];       /* add outputs (or y again) */
	struct span other[FUSE_GROUP_MAX];     /* add operands besides y */
	int n;
};

/* s overlaps no member's output but member `skip`'s (-1: none skipped). */
static inline bool disjoint_from_writes(const struct group_io *io, struct span s, int skip)
{
	for (int i = 0; i < io->n; i++)
		if (i != skip && (overlap(s, io->y[i]) || overlap(s, io->out[i])))
			return false;
	return true;
}

/* s overlaps nothing the group reads, but member `skip`'s add operand. */
static inline bool disjoint_from_reads(const struct group_io *io, struct span s, int skip)
{
	if (overlap(s, io->x) || overlap(s, io->norm_x) || overlap(s, io->norm_w))
		return false;
	for (int i = 0; i < io->n; i++)
		if (overlap(s, io->w[i]) || (i != skip && overlap(s, io->other[i])))
			return false;
	return true;
}

#endif
