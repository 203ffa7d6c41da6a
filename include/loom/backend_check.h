/*
 * Argument checks for backend authors: the rules ref.so applies, as static
 * inline functions, so every backend refuses the same calls with
 * LOOM_ERR_INVALID and none can be walked outside its buffers by a bad
 * shape. Optional: a backend may include only loom/backend.h.
 *
 * Offsets are kept below INT64_MAX / 16 so every element and byte offset a
 * backend computes from them is representable.
 */
#ifndef LOOM_BACKEND_CHECK_H
#define LOOM_BACKEND_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"

#define LOOM_CHECK_LIMIT (INT64_MAX / 16)

/* rows rows of n floats, `stride` floats apart: rows must not overlap and
 * the furthest offset must be representable. */
static inline bool loom_check_shape(int64_t rows, int64_t n, int64_t stride)
{
	if (rows < 0 || n < 0 || stride < n)
		return false;
	if (rows <= 1 || stride == 0)
		return true;
	return rows - 1 <= (LOOM_CHECK_LIMIT - n) / stride;
}

/* rows rows of row_bytes bytes, `stride` bytes apart. */
static inline bool loom_check_bytes(int64_t rows, size_t row_bytes, size_t stride)
{
	const uint64_t limit = LOOM_CHECK_LIMIT;

	if (row_bytes > limit)
		return false;
	if (rows <= 1 || stride == 0)
		return true;
	return (uint64_t)(rows - 1) <= (limit - row_bytes) / stride;
}

/* A KV cache slot of row_floats floats. The args carry no cache size, so a
 * slot can only be checked for being non-negative and representable. */
static inline bool loom_check_slot(int64_t slot, int64_t row_floats)
{
	return slot >= 0 && (row_floats == 0 || slot < LOOM_CHECK_LIMIT / row_floats);
}

/* The scalar fields of an attention call. */
static inline bool loom_check_attention_args(const struct loom_attention_args *a)
{
	if (a->n_seqs < 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 ||
	    a->n_heads % a->n_kv_heads != 0 || a->head_dim <= 0 ||
	    a->block_size <= 0 || a->block_size > INT32_MAX || a->max_blocks < 0 ||
	    a->window < 0 || !(a->softcap >= 0.0f))
		return false;
	if (a->head_dim > LOOM_CHECK_LIMIT / a->n_heads)
		return false;
	if (a->max_blocks > 0 && a->n_seqs > LOOM_CHECK_LIMIT / a->max_blocks)
		return false;
	return true;
}

/*
 * The per-sequence tables of an attention call, in host-readable memory
 * (a device backend passes host copies): query ranges ascending, every
 * query row backed by a cached token, block tables long enough, block ids
 * usable. Sets *rows (query rows in all) and *longest (largest kv_len).
 */
static inline bool loom_check_attention_tables(const struct loom_attention_args *a,
					       const int32_t *q_start, const int32_t *kv_len,
					       const int32_t *block_table, int64_t *rows,
					       int64_t *longest)
{
	int64_t kv_dim = a->n_kv_heads * a->head_dim;

	*rows = 0;
	*longest = 0;
	if (q_start[0] < 0)
		return false;
	for (int64_t s = 0; s < a->n_seqs; s++) {
		int64_t q_len = (int64_t)q_start[s + 1] - q_start[s];
		int64_t len = kv_len[s];
		int64_t n_blocks = (len + a->block_size - 1) / a->block_size;

		if (q_len < 0 || len < q_len || n_blocks > a->max_blocks)
			return false;
		for (int64_t j = 0; j < n_blocks; j++) {
			int64_t block = block_table[s * a->max_blocks + j];

			if (block < 0 || !loom_check_slot((block + 1) * a->block_size, kv_dim))
				return false;
		}
		if (len > *longest)
			*longest = len;
	}
	*rows = q_start[a->n_seqs];
	return true;
}

/* Outcome of the whole-call checks below. */
#define LOOM_CHECK_RUN 0     /* valid: do the work */
#define LOOM_CHECK_NOTHING 1 /* valid and empty: return LOOM_OK */

/* A rope call: LOOM_CHECK_RUN, LOOM_CHECK_NOTHING or LOOM_ERR_INVALID. */
static inline int loom_check_rope(const struct loom_rope_args *a)
{
	if (!a || !LOOM_ARGS_HAS(a, struct loom_rope_args, freq_factors))
		return LOOM_ERR_INVALID;
	if (a->mode != LOOM_ROPE_NORM && a->mode != LOOM_ROPE_NEOX)
		return LOOM_ERR_INVALID;
	if (a->n_tokens < 0 || a->n_heads < 0 || a->head_dim < 0 || a->n_rot < 0 ||
	    a->n_rot % 2 != 0 || a->n_rot > a->head_dim)
		return LOOM_ERR_INVALID;
	if (a->n_heads > 0 && a->head_dim > LOOM_CHECK_LIMIT / a->n_heads)
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(a->n_tokens, a->n_heads * a->head_dim, a->row_stride))
		return LOOM_ERR_INVALID;
	if (a->n_tokens == 0 || a->n_heads == 0 || a->n_rot == 0)
		return LOOM_CHECK_NOTHING;
	if (!a->x || !a->pos || !(a->freq_base > 0.0f))
		return LOOM_ERR_INVALID;
	return LOOM_CHECK_RUN;
}

/* A kv_write call, all but the slot values (which live in device memory:
 * check a host-readable copy with loom_check_slots). */
static inline int loom_check_kv_write(const struct loom_kv_write_args *a)
{
	if (!a || !LOOM_ARGS_HAS(a, struct loom_kv_write_args, slots))
		return LOOM_ERR_INVALID;
	if (!loom_check_shape(a->n_tokens, a->kv_dim, a->k_stride) ||
	    !loom_check_shape(a->n_tokens, a->kv_dim, a->v_stride))
		return LOOM_ERR_INVALID;
	if (a->n_tokens == 0 || a->kv_dim == 0)
		return LOOM_CHECK_NOTHING;
	if (!a->kcache || !a->vcache || !a->k || !a->v || !a->slots)
		return LOOM_ERR_INVALID;
	return LOOM_CHECK_RUN;
}

/* The KV cache type of a call (LOOM_KV_TYPE) for rows of `dim` values
 * (kv_dim for kv_write, head_dim for attention): LOOM_OK;
 * LOOM_ERR_UNSUPPORTED for a type that is not a KV type of ABI 1.3;
 * LOOM_ERR_INVALID when a block type's blocks would straddle rows. */
static inline int loom_check_kv_type(uint32_t type, int64_t dim)
{
	if (type != LOOM_TYPE_F32 && type != LOOM_TYPE_F16 && type != LOOM_TYPE_Q8_0 &&
	    type != LOOM_TYPE_Q4_0)
		return LOOM_ERR_UNSUPPORTED;
	if ((type == LOOM_TYPE_Q8_0 || type == LOOM_TYPE_Q4_0) && dim % 32 != 0)
		return LOOM_ERR_INVALID;
	return LOOM_OK;
}

static inline bool loom_check_slots(const int32_t *slots, int64_t n, int64_t row_floats)
{
	for (int64_t t = 0; t < n; t++)
		if (!loom_check_slot(slots[t], row_floats))
			return false;
	return true;
}

/* A collective's layout (ABI 1.4): a rank among n_ranks, rows >= 0, and
 * columns col_start[0] .. col_start[n_ranks] - 1, non-decreasing, inside
 * a row of `stride` floats. */
static inline bool loom_check_collective_layout(const struct loom_collective_args *a)
{
	if (a->n_ranks <= 0 || a->rank < 0 || a->rank >= a->n_ranks || a->rows < 0 ||
	    a->stride < 0 || !a->col_start || !a->x || a->col_start[0] < 0 ||
	    a->col_start[a->n_ranks] > a->stride)
		return false;
	for (int r = 0; r < a->n_ranks; r++)
		if (a->col_start[r + 1] < a->col_start[r])
			return false;
	return true;
}

/* ---- token trees (generation 1.8, loom_attention_args.parent) ---- */

/* The parent table of an attention call: NULL when the caller's struct
 * has none (an older host) or left it NULL. */
#define LOOM_ATTN_PARENT(a) \
	(LOOM_ARGS_HAS(a, struct loom_attention_args, parent) ? (a)->parent : NULL)

/* Every parent[] entry (host-readable) names an earlier row of its own
 * sequence or -1; q_start already checked (loom_check_attention_tables). */
static inline bool loom_check_attention_parents(const struct loom_attention_args *a,
						const int32_t *q_start, const int32_t *parent)
{
	for (int64_t s = 0; s < a->n_seqs; s++)
		for (int64_t i = 0; i < (int64_t)q_start[s + 1] - q_start[s]; i++) {
			int32_t p = parent[q_start[s] + i];

			if (p < -1 || p >= i)
				return false;
		}
	return true;
}

/*
 * The cache indices local row i of sequence s sees, in ascending order,
 * into keys[] (room for kv_len[s] entries), and its position in *pos;
 * returns how many. parent NULL: the causal rule (lo .. pos). Otherwise
 * the cached prefix and the row's ancestor chain (backend.h, generation
 * 1.8), both cut to the window. Tables already checked.
 */
static inline int64_t loom_attention_keys(const struct loom_attention_args *a,
					  const int32_t *q_start, const int32_t *kv_len,
					  const int32_t *parent, int64_t s, int64_t i,
					  int32_t *keys, int64_t *pos)
{
	int64_t q_len = (int64_t)q_start[s + 1] - q_start[s], base = kv_len[s] - q_len;
	int64_t depth = 0, lo, n = 0, j;

	if (!parent) {
		*pos = base + i;
		lo = a->window > 0 && *pos - a->window + 1 > 0 ? *pos - a->window + 1 : 0;
		for (j = lo; j <= *pos; j++)
			keys[n++] = (int32_t)j;
		return n;
	}
	/* the chain, leaf first, at the end of keys[] (kv_len > base + i) */
	for (j = i; j >= 0; j = parent[q_start[s] + j])
		keys[kv_len[s] - 1 - depth++] = (int32_t)(base + j);
	*pos = base + depth - 1;
	lo = a->window > 0 && *pos - a->window + 1 > 0 ? *pos - a->window + 1 : 0;
	for (j = lo; j < base; j++)
		keys[n++] = (int32_t)j;
	/* chain member at depth d has position base + d */
	for (int64_t d = 0; d < depth; d++)
		if (base + d >= lo)
			keys[n++] = keys[kv_len[s] - 1 - (depth - 1 - d)];
	return n;
}

#endif /* LOOM_BACKEND_CHECK_H */
