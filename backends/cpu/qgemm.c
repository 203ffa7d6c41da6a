/* Fast-mode prefill GEMM over interleaved 16-row panels (qgemm.h). */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "dot256.h"
#include "kpack.h"
#include "qgemm.h"

_Static_assert(QGEMM_ROWS == KPACK_ROWS, "a packed K-quant group is one panel");

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define GROUP_BYTES (4 * QGEMM_ROWS) /* 4 values of each of the 16 rows */

/* Formats whose blocks have a minimum (their q are unsigned, off 0). */
static bool offset_format(uint32_t t)
{
	return t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_1 || t == LOOM_TYPE_Q2_K ||
	       t == LOOM_TYPE_Q4_K || t == LOOM_TYPE_Q5_K;
}

int qgemm_offset(uint32_t t)
{
	return offset_format(t) ? 0 : 128;
}

bool qgemm_supported(enum qdot_isa isa, uint32_t type)
{
	/* mxfp4 has 8-bit GEMV kernels but no panel builder of its own: its
	 * prefill through panels built block by block in C was 12-15 % slower
	 * than dequantizing (docs/BENCHMARKS.md) */
	return (qdot_format(type) || qdot_k_format(type)) && type != LOOM_TYPE_MXFP4 &&
	       (isa == QDOT_VNNI || isa == QDOT_AVXVNNI || isa == QDOT_AVX2) &&
	       qdot_isa_supported(isa);
}

/*
 * Fewest activation rows worth a panel: qgemm rebuilds its panels at every
 * call. For Q2_K and Q3_K that rebuild is dear (2-bit fields spread to
 * bytes), and below 32 rows the packed GEMV kernels, one pass per row over
 * a group kept in cache, are faster: on a 1B-shaped model at 1 thread, 15
 * rows gave 32-50 (Q2_K) and 40-42 (Q3_K) t/s against 16 rows' 32-38 and
 * 27-28 through qgemm (docs/BENCHMARKS.md).
 */
int64_t qgemm_min_m(uint32_t type)
{
	return type == LOOM_TYPE_Q2_K || type == LOOM_TYPE_Q3_K ? 32 : 16;
}

int qgemm_block(uint32_t type)
{
	/* Q4_K and Q5_K scale 32 values at a time, the other K-quants 16 */
	return qdot_k_format(type) && type != LOOM_TYPE_Q4_K && type != LOOM_TYPE_Q5_K ? 16 : 32;
}

size_t qgemm_block_bytes(int B)
{
	return (size_t)B / 4 * GROUP_BYTES + 2 * QGEMM_ROWS * sizeof(float);
}

bool qgemm_has_min(uint32_t type)
{
	return offset_format(type);
}

static size_t block_bytes(uint32_t t)
{
	return qgemm_block_bytes(qgemm_block(t));
}

size_t qgemm_panel_bytes(uint32_t type, int64_t k)
{
	return (size_t)(k / qgemm_block(type)) * block_bytes(type);
}

#if defined(__x86_64__)
/* A GGUF 32-value block as unsigned bytes q + off with vector nibble
 * splits (Q4/Q5: byte j holds element j low and j + 16 high; Q5's element
 * e has its fifth bit at bit e of qh). */
__attribute__((target("avx2,f16c"))) static void block_u8_avx2(uint32_t t, const uint8_t *p,
							      uint8_t u[32], float *d, float *m)
{
	const __m128i m4 = _mm_set1_epi8(15);
	__m128i lo, hi, v;
	uint32_t qh = 0;
	int qs = 2;

	*d = _cvtsh_ss((uint16_t)(p[0] | p[1] << 8));
	*m = 0.0f;
	if (t == LOOM_TYPE_Q8_0) {
		__m256i q = _mm256_loadu_si256((const __m256i *)(p + 2));

		_mm256_storeu_si256((__m256i *)u, _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)));
		return;
	}
	if (offset_format(t)) {
		*m = _cvtsh_ss((uint16_t)(p[2] | p[3] << 8));
		qs = 4;
	}
	if (t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1) {
		memcpy(&qh, p + qs, 4);
		qs += 4;
	}
	v = _mm_loadu_si128((const __m128i *)(p + qs));
	lo = _mm_and_si128(v, m4);
	hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
	if (qh) {
		/* bit e of qh to byte e's bit 4 */
		const __m256i pick = _mm256_set1_epi64x((long long)0x8040201008040201ull);
		__m256i bits = _mm256_shuffle_epi8(
			_mm256_set1_epi32((int)qh),
			_mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll,
					   0x0303030303030303ll));
		__m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, pick), pick),
					     _mm256_set1_epi8(16));

		lo = _mm_or_si128(lo, _mm256_castsi256_si128(h));
		hi = _mm_or_si128(hi, _mm256_extracti128_si256(h, 1));
	}
	if (!offset_format(t)) { /* + off - the format's zero point */
		__m128i add = _mm_set1_epi8((char)(t == LOOM_TYPE_Q5_0 ? 112 : 120));

		lo = _mm_add_epi8(lo, add);
		hi = _mm_add_epi8(hi, add);
	}
	_mm_storeu_si128((__m128i *)u, lo);
	_mm_storeu_si128((__m128i *)(u + 16), hi);
}
#endif

/*
 * Values [c * B, c * B + B) of GGUF row `row` as unsigned bytes q + off,
 * with the block's float scale and minimum. K-quants come a super-block at
 * a time: *sb caches the last one unpacked (its index in *sb_at).
 */
struct kcache {
	int64_t at;
	uint8_t u[256];
	int sc[16], mn[16];
	float d, dmin;
};

static void block_u8(uint32_t t, const uint8_t *row, int64_t c, struct kcache *kc, uint8_t *u,
		     float *d, float *m)
{
	if (qdot_k_format(t)) {
		const int B = qgemm_block(t), per = 256 / B;
		int64_t s = c / per;
		int i = (int)(c % per), off = offset_format(t) ? 0 : 128 - qdot_k_offset(t);

		if (kc->at != s) {
			qdot_k_unpack(t, row + (size_t)s * cpu_block_bytes(t), kc->u, kc->sc, kc->mn,
				      &kc->d, &kc->dmin);
			kc->at = s;
		}
		for (int e = 0; e < B; e++)
			u[e] = (uint8_t)(kc->u[B * i + e] + off);
		/* the 16-value scale of the block's first half (Q4_K, Q5_K: both) */
		*d = kc->d * (float)kc->sc[i * B / 16];
		*m = -kc->dmin * (float)kc->mn[i * B / 16];
		return;
	}
	row += (size_t)c * cpu_block_bytes(t);
#if defined(__x86_64__)
	if (qdot_isa_supported(QDOT_AVX2)) {
		block_u8_avx2(t, row, u, d, m);
		return;
	}
#endif
	int8_t q[32];

	qdot_unpack_block(t, row, q, d, m);
	for (int e = 0; e < 32; e++)
		u[e] = (uint8_t)(q[e] + qgemm_offset(t));
}

/* Block c's values of panel row r: 4 bytes into each group. */
static void put_row(uint8_t *pb, int r, const uint8_t u[32], int groups)
{
	for (int g = 0; g < groups; g++)
		memcpy(pb + g * GROUP_BYTES + r * 4, u + 4 * g, 4);
}

/* qgemm_panel() of K-quant rows, a row and a super-block at a time. */
static void panel_k(uint32_t t, const uint8_t *w, size_t ws, int64_t j0, int rows, int64_t k,
		    void *panel)
{
	const int B = qgemm_block(t), per = 256 / B;
	const int off = offset_format(t) ? 0 : 128 - qdot_k_offset(t);
	const size_t bb = block_bytes(t);
	static const uint8_t zero[32];
	uint8_t u[256];
	int sc[16], mn[16];
	float d = 0.0f, dmin = 0.0f;

	for (int r = 0; r < QGEMM_ROWS; r++) {
		const uint8_t *row = w + (size_t)(j0 + r) * ws;

		for (int64_t s = 0; s < k / 256; s++) {
			if (r < rows) {
				qdot_k_unpack(t, row + (size_t)s * cpu_block_bytes(t), u, sc, mn, &d,
					      &dmin);
				for (int e = 0; e < 256; e++)
					u[e] = (uint8_t)(u[e] + off);
			}
			for (int i = 0; i < per; i++) {
				uint8_t *pb = (uint8_t *)panel + (size_t)(s * per + i) * bb;
				float *dw = (float *)(pb + B / 4 * GROUP_BYTES);

				put_row(pb, r, r < rows ? u + B * i : zero, B / 4);
				/* the 16-value scale of the block's first half */
				dw[r] = r < rows ? d * (float)sc[i * B / 16] : 0.0f;
				dw[QGEMM_ROWS + r] = r < rows ? -dmin * (float)mn[i * B / 16] : 0.0f;
			}
		}
	}
}

void qgemm_panel(uint32_t type, const uint8_t *w, size_t ws, int64_t j0, int rows, int64_t k,
		 bool packed, void *panel)
{
	const int B = qgemm_block(type);
	const int64_t nc = k / B;
	static __thread struct kcache kc[QGEMM_ROWS];
	uint8_t u[QGEMM_ROWS][32];

	memset(u, 0, sizeof(u));
	if (packed) { /* a panel is one 16-row group (kpack.h) */
		kpack_panel(type, w, kpack_nb(type, k), j0, panel);
		return;
	}
	if (qdot_k_format(type)) {
		panel_k(type, w, ws, j0, rows, k, panel);
		return;
	}
	for (int r = 0; r < QGEMM_ROWS; r++)
		kc[r].at = -1;
	for (int64_t c = 0; c < nc; c++) {
		uint8_t *pb = (uint8_t *)panel + (size_t)c * block_bytes(type);
		float *dw = (float *)(pb + B / 4 * GROUP_BYTES), *mw = dw + QGEMM_ROWS;

		for (int r = 0; r < QGEMM_ROWS; r++) {
			dw[r] = mw[r] = 0.0f;
			if (r < rows)
				block_u8(type, w + (size_t)(j0 + r) * ws, c, &kc[r], u[r], &dw[r],
					 &mw[r]);
		}
		/* group g of every row: 4 bytes each, row after row */
		for (int g = 0; g < B / 4; g++)
			for (int r = 0; r < QGEMM_ROWS; r++)
				memcpy(pb + g * GROUP_BYTES + r * 4, u[r] + 4 * g, 4);
	}
}

void qgemm_row_prep(uint32_t type, const struct qdot_block *x, int64_t k, struct qgemm_x *out)
{
	const int B = qgemm_block(type);

	for (int64_t c = 0; c < k / B; c++) {
		const struct qdot_block *xb = x + c * B / 32;
		int32_t sum = 0;

		for (int e = 0; e < B; e++)
			sum += xb->q[c * B % 32 + e];
		out[c].d = xb->d;
		out[c].s = xb->d * (float)sum;
		out[c].fix = -qgemm_offset(type) * sum;
	}
}

float qgemm_ref(uint32_t type, const uint8_t *w, const struct qdot_block *x, int64_t k)
{
	const int B = qgemm_block(type), off = qgemm_offset(type);
	struct kcache kc = { .at = -1 };
	float acc = 0.0f;

	for (int64_t c = 0; c < k / B; c++) {
		const struct qdot_block *xb = x + c * B / 32;
		const int8_t *xq = xb->q + c * B % 32;
		uint8_t u[32];
		float d, m;
		int32_t isum = 0, xsum = 0;

		block_u8(type, w, c, &kc, u, &d, &m);
		for (int e = 0; e < B; e++) {
			isum += (int32_t)u[e] * xq[e];
			xsum += xq[e];
		}
		acc = fmaf((float)(isum - off * xsum), d * xb->d, acc);
		if (offset_format(type))
			acc = fmaf(m, xb->d * (float)xsum, acc);
	}
	return acc;
}

#if defined(__x86_64__)
#define TGT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define QG_X 8 /* activation rows per pass over a panel block */
#define QG_CHAINS 2 /* independent vpdpbusd sums per row and block */

/* X activation rows (X <= QG_X) against the panel; B, has_min constants. */
static inline __attribute__((always_inline)) TGT_VNNI void
qgemm_rows(const uint8_t *panel, int rows, const struct qdot_block *x,
	   const struct qgemm_x *prep, int64_t k, float *y, int64_t ys, int X, int B,
	   bool has_min)
{
	const __mmask16 keep = (__mmask16)((1u << rows) - 1);
	const int64_t nc = k / B, nx = k / 32;
	const size_t bb = (size_t)B / 4 * GROUP_BYTES + 2 * QGEMM_ROWS * sizeof(float);
	__m512 acc[QG_X];

	for (int i = 0; i < X; i++)
		acc[i] = _mm512_setzero_ps();
	for (int64_t c = 0; c < nc; c++) {
		const uint8_t *pb = panel + (size_t)c * bb;
		__m512 dw = _mm512_loadu_ps(pb + B / 4 * GROUP_BYTES);
		__m512 mw = _mm512_loadu_ps(pb + B / 4 * GROUP_BYTES + QGEMM_ROWS * sizeof(float));
		__m512i wq[8];

		for (int g = 0; g < B / 4; g++)
			wq[g] = _mm512_loadu_si512(pb + g * GROUP_BYTES);
		for (int i = 0; i < X; i++) {
			const struct qgemm_x *xp = prep + i * nc + c;
			const int8_t *xq = x[i * nx + c * B / 32].q + c * B % 32;
			__m512i s[QG_CHAINS];
			int32_t x4;

			/* QG_CHAINS independent sums: one chain of B / 4 dependent
			 * vpdpbusd waited on their latency (integer sums are
			 * exact, so the split changes no bit) */
			s[0] = _mm512_set1_epi32(xp->fix);
			for (int h = 1; h < QG_CHAINS; h++)
				s[h] = _mm512_setzero_si512();
			for (int g = 0; g < B / 4; g++) {
				memcpy(&x4, xq + 4 * g, 4);
				s[g % QG_CHAINS] = _mm512_dpbusd_epi32(s[g % QG_CHAINS], wq[g],
								       _mm512_set1_epi32(x4));
			}
			for (int h = 1; h < QG_CHAINS; h++)
				s[0] = _mm512_add_epi32(s[0], s[h]);
			acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0]),
						 _mm512_mul_ps(dw, _mm512_set1_ps(xp->d)), acc[i]);
			if (has_min)
				acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xp->s), acc[i]);
		}
	}
	for (int i = 0; i < X; i++)
		_mm512_mask_storeu_ps(y + i * ys, keep, acc[i]);
}

/* One pass of X rows for a (B, has_min) kind. */
#define QG_KIND(B, MN)                                                                     \
	static TGT_VNNI void qgemm_##B##_##MN(const void *panel, int rows,               \
					      const struct qdot_block *x,                \
					      const struct qgemm_x *prep, int64_t m,     \
					      int64_t k, float *y, int64_t ys)           \
	{                                                                                  \
		const int64_t nx = k / 32, nc = k / (B);                                  \
		int64_t i = 0;                                                             \
                                                                                           \
		for (; i + QG_X <= m; i += QG_X)                                           \
			qgemm_rows(panel, rows, x + i * nx, prep + i * nc, k, y + i * ys,  \
				   ys, QG_X, B, MN);                                        \
		for (; i < m; i++)                                                         \
			qgemm_rows(panel, rows, x + i * nx, prep + i * nc, k, y + i * ys,  \
				   ys, 1, B, MN);                                           \
	}
QG_KIND(32, 0)
QG_KIND(32, 1)
QG_KIND(16, 0)
QG_KIND(16, 1)

/*
 * The same on 256-bit vectors: the panel's rows 8h .. 8h+7 are the first
 * (h = 0) or last 32 bytes of every group and the first or last 8 of its
 * 16 scales, so a pass takes one half. AVX-VNNI sums the byte products
 * with vpdpbusd as above; AVX2 has its own kernel below.
 */
#define QG_X8 4 /* activation rows per pass on 256-bit vectors */

static inline __attribute__((always_inline)) TGT_AVXVNNI void
qgemm_rows_avxvnni(const uint8_t *panel, int h, int lanes, const struct qdot_block *x,
		   const struct qgemm_x *prep, int64_t k, float *y, int64_t ys, int X, int B,
		   bool has_min)
{
	const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),
						_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	const int64_t nc = k / B, nx = k / 32;
	const size_t bb = (size_t)B / 4 * GROUP_BYTES + 2 * QGEMM_ROWS * sizeof(float);
	__m256 acc[QG_X8];

	for (int i = 0; i < X; i++)
		acc[i] = _mm256_setzero_ps();
	for (int64_t c = 0; c < nc; c++) {
		const uint8_t *pb = panel + (size_t)c * bb;
		const float *dwp = (const float *)(pb + B / 4 * GROUP_BYTES) + 8 * h;
		__m256 dw = _mm256_loadu_ps(dwp);
		__m256 mw = _mm256_loadu_ps(dwp + QGEMM_ROWS);
		__m256i w[8];

		for (int g = 0; g < B / 4; g++)
			w[g] = _mm256_loadu_si256((const __m256i *)(pb + g * GROUP_BYTES + 32 * h));
		for (int i = 0; i < X; i++) {
			const struct qgemm_x *xp = prep + i * nc + c;
			const int8_t *xq = x[i * nx + c * B / 32].q + c * B % 32;
			__m256i s = _mm256_set1_epi32(xp->fix);
			int32_t x4;

			for (int g = 0; g < B / 4; g++) {
				memcpy(&x4, xq + 4 * g, 4);
				s = avxvnni_dot(s, w[g], _mm256_set1_epi32(x4));
			}
			acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s),
						 _mm256_mul_ps(dw, _mm256_set1_ps(xp->d)), acc[i]);
			if (has_min)
				acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xp->s), acc[i]);
		}
	}
	for (int i = 0; i < X; i++)
		_mm256_maskstore_ps(y + i * ys + 8 * h, keep, acc[i]);
}

#define QG_KIND8(B, MN)                                                                    \
	static TGT_AVXVNNI void qgemm_avxvnni_##B##_##MN(const void *panel, int rows,    \
							 const struct qdot_block *x,     \
							 const struct qgemm_x *prep,     \
							 int64_t m, int64_t k, float *y, \
							 int64_t ys)                     \
	{                                                                                  \
		const int64_t nx = k / 32, nc = k / (B);                                  \
                                                                                           \
		for (int h = 0; h < 2 && 8 * h < rows; h++) {                              \
			const int lanes = rows - 8 * h < 8 ? rows - 8 * h : 8;             \
			int64_t i = 0;                                                     \
                                                                                           \
			for (; i + QG_X8 <= m; i += QG_X8)                                 \
				qgemm_rows_avxvnni(panel, h, lanes, x + i * nx, prep + i * nc, \
						   k, y + i * ys, ys, QG_X8, B, MN);       \
			for (; i < m; i++)                                                 \
				qgemm_rows_avxvnni(panel, h, lanes, x + i * nx, prep + i * nc, \
						   k, y + i * ys, ys, 1, B, MN);           \
		}                                                                          \
	}
QG_KIND8(32, 0)
QG_KIND8(32, 1)
QG_KIND8(16, 0)
QG_KIND8(16, 1)
#endif

#if defined(__x86_64__)
/*
 * AVX2 for every format but Q8_0: its values brought back to the format's
 * own small unsigned u (the panel holds q + 128 for the formats without a
 * minimum, u + sub; a vpsubb per group, shared by the pass's rows), so a
 * maddubs pair is at most 2 * umax * 127 and the int16 pairs of `ch`
 * groups add up in int16 before one madd widens them: ch = 8 for 4-bit
 * values (8 * 3810 < 32768), 4 for 5-bit and for Q2_K / Q3_K, 2 for
 * Q6_K's 6-bit. The fix then takes the format's own offset:
 * -(128 - sub) * sum(x) = fix * (128 - sub) / 128, an exact division. The
 * sums are the same integers as the other sets', so the bits are
 * qgemm_ref()'s. The groups go outer and the rows inner, so each weight
 * vector is loaded once for the pass's rows.
 */
#define QG_XI 4 /* activation rows per pass over one half */
#define QG_X2 2 /* over both */

static inline __attribute__((always_inline)) TGT_AVX2 void
qgemm_rows_i16(const uint8_t *panel, int h0, int H, int rows, const struct qdot_block *x,
	       const struct qgemm_x *prep, int64_t k, float *y, int64_t ys, int X, int B,
	       bool has_min, int sub, int ch, bool q8)
{
	const __m256i ones = _mm256_set1_epi16(1), back = _mm256_set1_epi8((char)sub);
	const int64_t nc = k / B, nx = k / 32;
	const int div = 128 / (128 - sub); /* a power of two */
	const size_t bb = (size_t)B / 4 * GROUP_BYTES + 2 * QGEMM_ROWS * sizeof(float);
	__m256 acc[2][QG_XI];

	for (int j = 0; j < H; j++)
		for (int i = 0; i < X; i++)
			acc[j][i] = _mm256_setzero_ps();
	for (int64_t c = 0; c < nc; c++) {
		const uint8_t *pb = panel + (size_t)c * bb;
		const float *dwp = (const float *)(pb + B / 4 * GROUP_BYTES);
		const int8_t *xq[QG_XI];
		__m256i s[2][QG_XI], p[2][QG_XI];

		for (int i = 0; i < X; i++) {
			xq[i] = x[i * nx + c * B / 32].q + c * B % 32;
			for (int j = 0; j < H; j++) {
				s[j][i] = _mm256_set1_epi32(sub && !q8 ? prep[i * nc + c].fix / div : 0);
				p[j][i] = _mm256_setzero_si256();
			}
		}
		for (int g = 0; g < B / 4; g++) {
			__m256i w[2], q[2];
			int32_t x4;

			for (int j = 0; j < H; j++) {
				w[j] = _mm256_loadu_si256((const __m256i *)(pb + g * GROUP_BYTES +
									    32 * (h0 + j)));
				q[j] = w[j];
				if (q8) { /* q back from q + 128; |q| meets x with q's sign */
					q[j] = _mm256_xor_si256(w[j], _mm256_set1_epi8((char)0x80));
					w[j] = _mm256_abs_epi8(q[j]);
				} else if (sub) {
					w[j] = _mm256_sub_epi8(w[j], back);
				}
			}
			for (int i = 0; i < X; i++) {
				memcpy(&x4, xq[i] + 4 * g, 4);
				for (int j = 0; j < H; j++) {
					__m256i xb = _mm256_set1_epi32(x4);

					if (q8)
						xb = _mm256_sign_epi8(xb, q[j]);
					p[j][i] = _mm256_add_epi16(p[j][i], _mm256_maddubs_epi16(w[j], xb));
					/* keeps the sum a chain: reassociated into a
					 * tree it held every group's products at once
					 * and spilled */
					__asm__("" : "+x"(p[j][i]));
				}
			}
			if ((g + 1) % ch == 0 || g == B / 4 - 1)
				for (int j = 0; j < H; j++)
					for (int i = 0; i < X; i++) {
						s[j][i] = _mm256_add_epi32(s[j][i], _mm256_madd_epi16(p[j][i], ones));
						/* a chain too: Q8_0's madd a group,
						 * gathered into a tree, spilled */
						__asm__("" : "+x"(s[j][i]));
						p[j][i] = _mm256_setzero_si256();
					}
		}
		for (int j = 0; j < H; j++)
			for (int i = 0; i < X; i++) {
				const struct qgemm_x *xp = prep + i * nc + c;
				const float *dw = dwp + 8 * (h0 + j);

				acc[j][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j][i]),
							    _mm256_mul_ps(_mm256_loadu_ps(dw), _mm256_set1_ps(xp->d)),
							    acc[j][i]);
				if (has_min)
					acc[j][i] = _mm256_fmadd_ps(_mm256_loadu_ps(dw + QGEMM_ROWS),
								    _mm256_set1_ps(xp->s), acc[j][i]);
			}
	}
	for (int j = 0; j < H; j++) {
		const int h = h0 + j, lanes = rows - 8 * h < 8 ? rows - 8 * h : 8;
		const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),
							_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));

		for (int i = 0; i < X; i++)
			_mm256_maskstore_ps(y + i * ys + 8 * h, keep, acc[j][i]);
	}
}

/* One AVX2 kind: block B, minimum MN, panel bytes u + SUB, CH groups per
 * int16 sum; Q8: Q8_0's sign path (|q| against x with q's sign, 2 * 128
 * * 127 a pair: one group per sum, no fix). */
#define QG_KIND_I16(name, B, MN, SUB, CH, Q8)                                              \
	static TGT_AVX2 void name(const void *panel, int rows, const struct qdot_block *x, \
				  const struct qgemm_x *prep, int64_t m, int64_t k, float *y, \
				  int64_t ys)                                              \
	{                                                                                  \
		const int64_t nx = k / 32, nc = k / (B);                                  \
		int64_t i = 0;                                                             \
                                                                                           \
		if (rows > 8) { /* both halves a pass */                                   \
			for (; i + QG_X2 <= m; i += QG_X2)                                 \
				qgemm_rows_i16(panel, 0, 2, rows, x + i * nx, prep + i * nc, k, \
					       y + i * ys, ys, QG_X2, B, MN, SUB, CH, Q8);  \
			for (; i < m; i++)                                                 \
				qgemm_rows_i16(panel, 0, 2, rows, x + i * nx, prep + i * nc, k, \
					       y + i * ys, ys, 1, B, MN, SUB, CH, Q8);      \
			return;                                                            \
		}                                                                          \
		for (; i + QG_XI <= m; i += QG_XI)                                         \
			qgemm_rows_i16(panel, 0, 1, rows, x + i * nx, prep + i * nc, k,    \
				       y + i * ys, ys, QG_XI, B, MN, SUB, CH, Q8);          \
		for (; i < m; i++)                                                         \
			qgemm_rows_i16(panel, 0, 1, rows, x + i * nx, prep + i * nc, k,    \
				       y + i * ys, ys, 1, B, MN, SUB, CH, Q8);              \
	}
QG_KIND_I16(qgemm_i16_q8_0, 32, false, 0, 1, true)
QG_KIND_I16(qgemm_i16_q4_0, 32, false, 120, 8, false)
QG_KIND_I16(qgemm_i16_q5_0, 32, false, 112, 4, false)
QG_KIND_I16(qgemm_i16_q4_1, 32, true, 0, 8, false) /* Q4_1, Q4_K */
QG_KIND_I16(qgemm_i16_q5_1, 32, true, 0, 4, false) /* Q5_1, Q5_K */
QG_KIND_I16(qgemm_i16_q2_k, 16, true, 0, 4, false)
QG_KIND_I16(qgemm_i16_q3_k, 16, false, 124, 4, false)
QG_KIND_I16(qgemm_i16_q6_k, 16, false, 96, 2, false)
#endif

#if defined(__x86_64__)
typedef void (*qgemm_fn)(const void *panel, int rows, const struct qdot_block *x,
			 const struct qgemm_x *prep, int64_t m, int64_t k, float *y, int64_t ys);

/* [set][block 16 or 32][minimum]: VNNI, AVX-VNNI (AVX2: qgemm_avx2_i16()) */
static const qgemm_fn qgemm_kinds[2][2][2] = {
	{ { qgemm_16_0, qgemm_16_1 }, { qgemm_32_0, qgemm_32_1 } },
	{ { qgemm_avxvnni_16_0, qgemm_avxvnni_16_1 }, { qgemm_avxvnni_32_0, qgemm_avxvnni_32_1 } },
};

/* The AVX2 kind of type. */
static qgemm_fn qgemm_avx2_i16(uint32_t type)
{
	switch (type) {
	case LOOM_TYPE_Q8_0: return qgemm_i16_q8_0;
	case LOOM_TYPE_Q4_0: return qgemm_i16_q4_0;
	case LOOM_TYPE_Q5_0: return qgemm_i16_q5_0;
	case LOOM_TYPE_Q4_1: case LOOM_TYPE_Q4_K: return qgemm_i16_q4_1;
	case LOOM_TYPE_Q5_1: case LOOM_TYPE_Q5_K: return qgemm_i16_q5_1;
	case LOOM_TYPE_Q2_K: return qgemm_i16_q2_k;
	case LOOM_TYPE_Q3_K: return qgemm_i16_q3_k;
	case LOOM_TYPE_Q6_K: return qgemm_i16_q6_k;
	default: return NULL;
	}
}
#endif

void qgemm_run(enum qdot_isa isa, uint32_t type, const void *panel, int rows,
	       const struct qdot_block *x, const struct qgemm_x *prep, int64_t m, int64_t k,
	       float *y, int64_t ys)
{
#if defined(__x86_64__)
	const int set = isa == QDOT_VNNI ? 0 : isa == QDOT_AVXVNNI ? 1 : 2;
	const qgemm_fn i16 = set == 2 ? qgemm_avx2_i16(type) : NULL;

	if (i16) {
		i16(panel, rows, x, prep, m, k, y, ys);
		return;
	}
	qgemm_kinds[set][qgemm_block(type) == 32][offset_format(type)](panel, rows, x, prep, m,
								       k, y, ys);
#else
	(void)isa; (void)type; (void)panel; (void)rows; (void)x; (void)prep; (void)m; (void)k;
	(void)y; (void)ys;
#endif
}
