/* GGUF v3 writer (internal to the core), streaming: the header (key-value
 * pairs, tensor infos) is written first, then each tensor's data in turn,
 * so a caller holds one tensor at a time. Offsets and padding follow the
 * reader's rules (gguf.h): every tensor's data starts at a multiple of the
 * alignment, counted from the data section, which is itself aligned.
 *
 * A writer opened with a NULL path writes nothing and only counts bytes:
 * the size a file would have (`loom quantize --dry-run`).
 *
 * Errors are written to err as one line naming the file and the cause. */
#ifndef LOOM_GGUF_WRITE_H
#define LOOM_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"

struct gguf_writer;

/* Writes path through loom_outfile_open(path, flags) (include/loom.h:
 * a temporary renamed into place at close), or counts only when path is
 * NULL. alignment: a power of two. NULL with err on failure. */
struct gguf_writer *gguf_writer_open(const char *path, uint32_t flags, uint64_t alignment,
				     char *err, size_t errlen);
/* Bytes written (or counted) so far. */
uint64_t gguf_writer_pos(const struct gguf_writer *w);
/* Header: magic, version 3, the counts. */
int gguf_write_header(struct gguf_writer *w, uint64_t n_tensors, uint64_t n_kv, char *err,
		      size_t errlen);
/* One key-value pair, in the reader's representation (any value type,
 * arrays of any non-array type). */
int gguf_write_kv(struct gguf_writer *w, const struct gguf_kv *kv, char *err, size_t errlen);
/* A u32 pair (general.file_type). */
int gguf_write_kv_u32(struct gguf_writer *w, const char *key, uint32_t value, char *err,
		      size_t errlen);
/* One tensor info; offset relative to the data section. */
int gguf_write_tensor_info(struct gguf_writer *w, const struct gguf_str *name, uint32_t n_dims,
			   const int64_t *ne, uint32_t type, uint64_t offset, char *err,
			   size_t errlen);
/* Zero bytes up to the next multiple of the alignment. */
int gguf_write_pad(struct gguf_writer *w, char *err, size_t errlen);
int gguf_write_bytes(struct gguf_writer *w, const void *p, size_t n, char *err, size_t errlen);
/* Flushes, closes and moves the file into place (always frees w); 0, or
 * -1 with err if any write, the close or the rename failed (nothing is
 * left behind then). */
int gguf_writer_close(struct gguf_writer *w, char *err, size_t errlen);
/* Drops the file being written (its temporary removed) and frees w. */
void gguf_writer_discard(struct gguf_writer *w);

/* The offset after a tensor of nbytes at offset, aligned; false on overflow. */
bool gguf_next_offset(uint64_t offset, uint64_t nbytes, uint64_t alignment, uint64_t *next);

#endif /* LOOM_GGUF_WRITE_H */
