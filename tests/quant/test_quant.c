/*
 * Unit tests of the quantization plugins, loaded with dlopen from the build
 * tree ($LOOM_BUILD_ROOT/plugins/quant/NAME.so) exactly as a host would.
 *
 * Expected values are GGUF facts (type ids, block geometry, layouts) and
 * hand-computed IEEE conversions; nothing is taken from the code under test.
 * Round-trip error bounds are derived in the comments of each check.
 */
#include <check.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"

struct want_format {
	const char *name;
	uint32_t type, elems, bytes;
};

struct want_plugin {
	const char *file, *family;
	uint32_t n;
	struct want_format f[5];
};

/* Type ids and block sizes as GGUF defines them (ggml_type, GGML_QUANT_SIZES). */
static const struct want_plugin want[] = {
	{ "float", "float", 3, { { "f32", 0, 1, 4 }, { "f16", 1, 1, 2 },
				 { "bf16", 30, 1, 2 } } },
	{ "q8", "q8", 1, { { "q8_0", 8, 32, 34 } } },
	{ "q4", "q4", 2, { { "q4_0", 2, 32, 18 }, { "q4_1", 3, 32, 20 } } },
	{ "q5", "q5", 2, { { "q5_0", 6, 32, 22 }, { "q5_1", 7, 32, 24 } } },
	{ "kquant", "kquant", 5, { { "q2_K", 10, 256, 84 }, { "q3_K", 11, 256, 110 },
				   { "q4_K", 12, 256, 144 }, { "q5_K", 13, 256, 176 },
				   { "q6_K", 14, 256, 210 } } },
	{ "mxfp4", "mxfp4", 1, { { "mxfp4", 39, 32, 17 } } },
};

#define N_WANT (sizeof(want) / sizeof(want[0]))

static void *handles[N_WANT];

static const struct loom_quant_plugin *open_plugin(const char *file, void **out)
{
	const char *root = getenv("LOOM_BUILD_ROOT");
	char path[4096];
	loom_quant_entry_fn entry;
	void *h;

	ck_assert_msg(root && *root, "LOOM_BUILD_ROOT is not set");
	snprintf(path, sizeof(path), "%s/plugins/quant/%s.so", root, file);
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h, "dlopen %s: %s", path, dlerror());
	*(void **)&entry = dlsym(h, LOOM_QUANT_ENTRY);
	ck_assert_msg(entry, "%s: no %s", path, LOOM_QUANT_ENTRY);
	if (out)
		*out = h;
	return entry();
}

/* The format called name, from whichever plugin has it. */
static const struct loom_quant_format *fmt(const char *name)
{
	for (size_t i = 0; i < N_WANT; i++) {
		const struct loom_quant_plugin *p;

		if (!handles[i])
			p = open_plugin(want[i].file, &handles[i]);
		else
			p = ((loom_quant_entry_fn)dlsym(handles[i], LOOM_QUANT_ENTRY))();
		for (uint32_t j = 0; j < p->n_formats; j++)
			if (!strcmp(p->formats[j].name, name))
				return &p->formats[j];
	}
	ck_abort_msg("no plugin provides %s", name);
	return NULL;
}

static uint32_t bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* Deterministic uniform floats in [-1, 1) (xorshift64*, fixed seed). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (float)((rng_state * 0x2545f4914f6cdd1dull) >> 40) / 8388608.0f - 1.0f;
}

START_TEST(test_descriptors)
{
	const struct want_plugin *w = &want[_i];
	const struct loom_quant_plugin *p = open_plugin(w->file, NULL);

	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq(p->abi_major, LOOM_PLUGIN_ABI_MAJOR);
	ck_assert_uint_ge(p->struct_size, sizeof(struct loom_quant_plugin));
	ck_assert_str_eq(p->name, w->family);
	ck_assert_uint_eq(p->n_formats, w->n);
	for (uint32_t j = 0; j < w->n; j++) {
		const struct loom_quant_format *f = &p->formats[j];

		ck_assert_uint_ge(f->struct_size, sizeof(struct loom_quant_format));
		ck_assert_str_eq(f->name, w->f[j].name);
		ck_assert_uint_eq(f->type, w->f[j].type);
		ck_assert_uint_eq(f->block_elems, w->f[j].elems);
		ck_assert_uint_eq(f->block_bytes, w->f[j].bytes);
		ck_assert_ptr_nonnull(f->to_float);
		ck_assert_ptr_nonnull(f->from_float);
	}
}
END_TEST

/* Only the entry point is exported: no helper leaks into the namespace. */
START_TEST(test_hidden_symbols)
{
	static const char *const internal[] = {
		"quant_f32_to_f16", "quant_f16_to_f32", "quant_check_args",
		"q4_0_to_float", "q8_0_block", "float_plugin", "q5_plugin",
	};
	void *h;

	open_plugin(want[_i].file, &h);
	for (size_t k = 0; k < sizeof(internal) / sizeof(internal[0]); k++)
		ck_assert_msg(!dlsym(h, internal[k]), "%s exports %s", want[_i].file,
			      internal[k]);
}
END_TEST

START_TEST(test_bad_args)
{
	static const char *const names[] = { "f32", "f16", "bf16", "q8_0", "q4_0",
					      "q4_1", "q5_0", "q5_1", "q2_K", "q3_K",
					      "q4_K", "q5_K", "q6_K" };
	const struct loom_quant_format *f = fmt(names[_i]);
	uint8_t blk[256 * 4];
	float x[256] = { 0 };

	ck_assert_int_eq(f->to_float(blk, x, -32), LOOM_ERR_INVALID);
	ck_assert_int_eq(f->from_float(x, blk, -32), LOOM_ERR_INVALID);
	ck_assert_int_eq(f->to_float(NULL, x, 32), LOOM_ERR_INVALID);
	ck_assert_int_eq(f->from_float(x, NULL, 32), LOOM_ERR_INVALID);
	ck_assert_int_eq(f->to_float(blk, x, 0), LOOM_OK);
	ck_assert_int_eq(f->from_float(x, blk, 0), LOOM_OK);
	ck_assert_int_eq(f->to_float(blk, x, INT64_MAX - 31), LOOM_ERR_INVALID);
	if (f->block_elems > 1) {
		ck_assert_int_eq(f->to_float(blk, x, f->block_elems + 1),
				 LOOM_ERR_INVALID);
		ck_assert_int_eq(f->from_float(x, blk, f->block_elems - 1),
				 LOOM_ERR_INVALID);
	}
}
END_TEST

static uint16_t to_f16(float v)
{
	uint8_t b[2];

	ck_assert_int_eq(fmt("f16")->from_float(&v, b, 1), LOOM_OK);
	return (uint16_t)(b[0] | b[1] << 8);
}

static uint16_t to_bf16(float v)
{
	uint8_t b[2];

	ck_assert_int_eq(fmt("bf16")->from_float(&v, b, 1), LOOM_OK);
	return (uint16_t)(b[0] | b[1] << 8);
}

/* IEEE binary16 encodings, worked out by hand (round to nearest even). */
START_TEST(test_f16_cases)
{
	static const struct { uint32_t f; uint16_t h; } c[] = {
		{ 0x3f800000, 0x3c00 }, /* 1 */
		{ 0xc0000000, 0xc000 }, /* -2 */
		{ 0x80000000, 0x8000 }, /* -0 */
		{ 0x3dcccccd, 0x2e66 }, /* 0.1 */
		{ 0x477fe000, 0x7bff }, /* 65504, largest half */
		{ 0x477fefff, 0x7bff }, /* just below 65520 */
		{ 0x477ff000, 0x7c00 }, /* 65520: tie, rounds to even = inf */
		{ 0x7f800000, 0x7c00 }, /* inf */
		{ 0xff7fffff, 0xfc00 }, /* -FLT_MAX */
		{ 0x38800000, 0x0400 }, /* 2^-14, smallest normal */
		{ 0x33800000, 0x0001 }, /* 2^-24, smallest subnormal */
		{ 0x33000000, 0x0000 }, /* 2^-25: tie between 0 and 1 -> 0 */
		{ 0x33000001, 0x0001 }, /* just above 2^-25 */
		{ 0x33c00000, 0x0002 }, /* 3 * 2^-25: tie between 1 and 2 -> 2 */
		{ 0x387fc000, 0x03ff }, /* 1023 * 2^-24, largest subnormal */
		{ 0x387fe000, 0x0400 }, /* 1023.5 * 2^-24: tie, carries to normal */
		{ 0x3f801000, 0x3c00 }, /* 1 + 2^-11: tie -> 1 */
		{ 0x3f803000, 0x3c02 }, /* 1 + 3 * 2^-11: tie -> even */
		{ 0x3f801001, 0x3c01 }, /* above the tie */
		{ 0x2f800000, 0x0000 }, /* 2^-32 underflows */
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		ck_assert_msg(to_f16(from_bits(c[i].f)) == c[i].h,
			      "f16(%08x) = %04x, want %04x", c[i].f,
			      to_f16(from_bits(c[i].f)), c[i].h);
	/* NaN stays NaN, sign kept. */
	ck_assert_uint_eq(to_f16(from_bits(0x7fc00000)) & 0x7e00, 0x7e00);
	ck_assert_uint_eq(to_f16(from_bits(0xff800001)) & 0xfe00, 0xfe00);
}
END_TEST

/* Every half value widens exactly and narrows back to itself. */
START_TEST(test_f16_exhaustive)
{
	const struct loom_quant_format *f = fmt("f16");
	static uint8_t in[65536 * 2], back[65536 * 2];
	static float x[65536];

	for (uint32_t h = 0; h < 65536; h++) {
		in[2 * h] = h & 0xff;
		in[2 * h + 1] = h >> 8;
	}
	ck_assert_int_eq(f->to_float(in, x, 65536), LOOM_OK);
	ck_assert_int_eq(f->from_float(x, back, 65536), LOOM_OK);
	for (uint32_t h = 0; h < 65536; h++) {
		uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
		double want;

		if (e == 0x1f && m) {
			ck_assert(isnan(x[h]));
			continue;
		}
		ck_assert_uint_eq(back[2 * h] | back[2 * h + 1] << 8, h);
		if (e == 0x1f)
			want = INFINITY;
		else if (e == 0)
			want = ldexp(m, -24);
		else
			want = ldexp(1024 + m, (int)e - 25);
		if (h & 0x8000)
			want = -want;
		ck_assert_msg((double)x[h] == want, "half %04x -> %a", h, x[h]);
		ck_assert_int_eq(!!signbit(x[h]), !!(h & 0x8000));
	}
}
END_TEST

START_TEST(test_bf16)
{
	static const struct { uint32_t f; uint16_t h; } c[] = {
		{ 0x3f800000, 0x3f80 }, /* 1 */
		{ 0x3f808000, 0x3f80 }, /* tie -> even (down) */
		{ 0x3f818000, 0x3f82 }, /* tie -> even (up) */
		{ 0x3f808001, 0x3f81 }, /* above the tie */
		{ 0x3f807fff, 0x3f80 }, /* below the tie */
		{ 0x7f7fffff, 0x7f80 }, /* FLT_MAX rounds to inf */
		{ 0xff800000, 0xff80 }, /* -inf */
		{ 0x00010000, 0x0001 }, /* subnormal kept */
		{ 0x7f800001, 0x7fc0 }, /* signalling NaN -> quiet NaN */
		{ 0xffc12345, 0xffc1 }, /* NaN payload truncated, sign kept */
	};
	const struct loom_quant_format *f = fmt("bf16");
	static uint8_t in[65536 * 2], back[65536 * 2];
	static float x[65536];

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		ck_assert_msg(to_bf16(from_bits(c[i].f)) == c[i].h,
			      "bf16(%08x) = %04x, want %04x", c[i].f,
			      to_bf16(from_bits(c[i].f)), c[i].h);
	/* Widening is the top half of the float; non-NaN values round-trip. */
	for (uint32_t h = 0; h < 65536; h++) {
		in[2 * h] = h & 0xff;
		in[2 * h + 1] = h >> 8;
	}
	ck_assert_int_eq(f->to_float(in, x, 65536), LOOM_OK);
	ck_assert_int_eq(f->from_float(x, back, 65536), LOOM_OK);
	for (uint32_t h = 0; h < 65536; h++) {
		ck_assert_uint_eq(bits(x[h]), h << 16);
		if (!isnan(x[h]))
			ck_assert_uint_eq(back[2 * h] | back[2 * h + 1] << 8, h);
	}
}
END_TEST

START_TEST(test_f32_exact)
{
	const struct loom_quant_format *f = fmt("f32");
	float x[257], y[257];
	uint8_t b[sizeof(x)];

	for (int i = 0; i < 257; i++)
		x[i] = rnd() * 1e10f;
	x[0] = NAN;
	x[1] = -0.0f;
	ck_assert_int_eq(f->from_float(x, b, 257), LOOM_OK);
	ck_assert_int_eq(f->to_float(b, y, 257), LOOM_OK);
	ck_assert_mem_eq(x, y, sizeof(x));
}
END_TEST

/*
 * Hand-built blocks in GGUF's layout, decoded by the rules of the format:
 * f16 scale first, nibble byte j = element j (low) and j + 16 (high),
 * q5's qh bit j = bit 4 of element j.
 */
START_TEST(test_hand_blocks)
{
	float y[32];
	uint8_t q80[34] = { 0x00, 0x38 }; /* d = 0.5 */
	uint8_t q40[18] = { 0x00, 0x3c }; /* d = 1 */
	uint8_t q41[20] = { 0x00, 0x40, 0x00, 0xbc }; /* d = 2, m = -1 */
	uint8_t q50[22] = { 0x00, 0x34 }; /* d = 0.25 */
	uint8_t q51[24] = { 0x00, 0x3c, 0x00, 0x49 }; /* d = 1, m = 10 */

	q80[2] = 0x80;  /* -128 */
	q80[33] = 0x7f; /* 127 */
	ck_assert_int_eq(fmt("q8_0")->to_float(q80, y, 32), LOOM_OK);
	ck_assert(y[0] == -64.0f && y[1] == 0.0f && y[31] == 63.5f);

	q40[2] = 0x9f; /* element 0: 15, element 16: 9 */
	ck_assert_int_eq(fmt("q4_0")->to_float(q40, y, 32), LOOM_OK);
	ck_assert(y[0] == 7.0f && y[16] == 1.0f && y[1] == -8.0f);

	q41[4 + 15] = 0x3e; /* element 15: 14, element 31: 3 */
	ck_assert_int_eq(fmt("q4_1")->to_float(q41, y, 32), LOOM_OK);
	ck_assert(y[15] == 27.0f && y[31] == 5.0f && y[0] == -1.0f);

	q50[2] = 0x01;       /* qh bit 0: element 0 */
	q50[5] = 0x80;       /* qh bit 31: element 31 */
	q50[6 + 15] = 0xf0;  /* element 31 low bits 15 */
	ck_assert_int_eq(fmt("q5_0")->to_float(q50, y, 32), LOOM_OK);
	ck_assert(y[0] == 0.0f && y[31] == 3.75f && y[1] == -4.0f);

	q51[4 + 1] = 0x02;   /* qh bit 9: element 9 */
	q51[8 + 9] = 0x57;   /* element 9 low 7, element 25 low 5 */
	ck_assert_int_eq(fmt("q5_1")->to_float(q51, y, 32), LOOM_OK);
	ck_assert(y[9] == 33.0f && y[25] == 15.0f && y[0] == 10.0f);
}
END_TEST

/* Values that lie exactly on a representable grid come back unchanged. */
START_TEST(test_exact_grids)
{
	float x[32], y[32];
	uint8_t b[34];

	/* q8_0: amax 63.5 -> d = 0.5 exactly; every x is q * 0.5. */
	for (int j = 0; j < 32; j++)
		x[j] = (float)((j * 37) % 255 - 127) * 0.5f;
	x[5] = -63.5f;
	ck_assert_int_eq(fmt("q8_0")->from_float(x, b, 32), LOOM_OK);
	ck_assert_int_eq(fmt("q8_0")->to_float(b, y, 32), LOOM_OK);
	ck_assert_mem_eq(x, y, sizeof(x));

	/* q4_0: max -2 -> d = 0.25; x = (q - 8) * 0.25, q in 0..15. */
	for (int j = 0; j < 32; j++)
		x[j] = (float)((j * 7) % 16 - 8) * 0.25f;
	ck_assert_int_eq(fmt("q4_0")->from_float(x, b, 32), LOOM_OK);
	ck_assert_int_eq(fmt("q4_0")->to_float(b, y, 32), LOOM_OK);
	ck_assert_mem_eq(x, y, sizeof(x));

	/* q5_0: max -4 -> d = 0.25; x = (q - 16) * 0.25, q in 0..31. */
	for (int j = 0; j < 32; j++)
		x[j] = (float)((j * 13) % 32 - 16) * 0.25f;
	ck_assert_int_eq(fmt("q5_0")->from_float(x, b, 32), LOOM_OK);
	ck_assert_int_eq(fmt("q5_0")->to_float(b, y, 32), LOOM_OK);
	ck_assert_mem_eq(x, y, sizeof(x));

	/* q4_1: min -1, max 2.75 -> d = 0.25, m = -1; q5_1: max 6.75. */
	for (int j = 0; j < 32; j++)
		x[j] = -1.0f + (float)(j % 16) * 0.25f;
	ck_assert_int_eq(fmt("q4_1")->from_float(x, b, 32), LOOM_OK);
	ck_assert_int_eq(fmt("q4_1")->to_float(b, y, 32), LOOM_OK);
	ck_assert_mem_eq(x, y, sizeof(x));
	for (int j = 0; j < 32; j++)
		x[j] = -1.0f + (float)((j * 5) % 32) * 0.25f;
	ck_assert_int_eq(fmt("q5_1")->from_float(x, b, 32), LOOM_OK);
	ck_assert_int_eq(fmt("q5_1")->to_float(b, y, 32), LOOM_OK);
	ck_assert_mem_eq(x, y, sizeof(x));
}
END_TEST

/*
 * Round-trip error bounds, per block of 32 with amax = max|x|, f16 unit
 * roundoff u = 2^-11 and a float slack s = 2^-20 * amax (plus 2^-25 per
 * f16 rounding, the absolute error of an f16 subnormal):
 *
 *   q8_0: d = amax/127, |q| <= 127, so err <= d/2 + 127 * d * u + s.
 *   q4_0: d = amax/8 in magnitude; rounding to q costs d/2, except the
 *         values opposite to max that would need q = 16 and are clipped to
 *         15, which cost up to d; plus 8 * d * u for the f16 scale:
 *         err <= d + 8 * d * u + s (and <= d/2 + 8du + s unclipped).
 *   q5_0: as q4_0 with 16 levels each side: d = amax/16.
 *   q4_1: d = (max - min)/15, m = f16(min): err <= d/2 + 15du + |min|u + s.
 *   q5_1: as q4_1 with d = (max - min)/31.
 * The unclipped q4_0/q5_0 bound is checked for values with x/d <= L - 1/2
 * (L = 8 or 16), since only x/d in (L - 1/2, L] clips.
 */
struct rt_case {
	const char *name;
	int sym;    /* 1: q = x/d + L (q4_0, q5_0, q8_0), 0: min/max formats */
	float levels;
};

static const struct rt_case rt_cases[] = {
	{ "q8_0", 1, 127 }, { "q4_0", 1, 8 },  { "q5_0", 1, 16 },
	{ "q4_1", 0, 15 },  { "q5_1", 0, 31 },
};

static void fill_block(float *x, int kind)
{
	/* 2^-9 .. 2^9, so outliers stay inside the f16 range of the scales */
	float scale = ldexpf(1.0f, (int)(rnd() * 10.0f));

	for (int j = 0; j < 32; j++)
		x[j] = rnd() * scale;
	if (kind == 1) /* one outlier */
		x[(int)((rnd() + 1.0f) * 15.9f)] *= 50.0f;
	else if (kind == 2) /* all positive */
		for (int j = 0; j < 32; j++)
			x[j] = fabsf(x[j]) + scale;
	else if (kind == 3) /* constant */
		for (int j = 0; j < 32; j++)
			x[j] = scale * 0.3f;
	else if (kind == 4)
		memset(x, 0, 32 * sizeof(float));
}

static void check_block(const struct rt_case *c, const float *x, const float *y)
{
	const double u = 0x1p-11;
	double amax = 0, min = INFINITY, max = -INFINITY, d, bound;
	double signed_max = 0;

	for (int j = 0; j < 32; j++) {
		if (fabs(x[j]) > amax) {
			amax = fabs(x[j]);
			signed_max = x[j];
		}
		min = fmin(min, x[j]);
		max = fmax(max, x[j]);
	}
	for (int j = 0; j < 32; j++) {
		double err = fabs((double)x[j] - y[j]);
		double s = 0x1p-20 * amax + (c->levels + 1) * 0x1p-25;

		if (!c->sym) {
			d = (max - min) / c->levels;
			bound = d / 2 + c->levels * d * u + fabs(min) * u + s;
		} else if (c->levels == 127) {
			d = amax / 127;
			bound = d / 2 + 127 * d * u + s;
		} else {
			d = amax / c->levels;
			/* x/d in GGUF's sign convention (d = max / -L) */
			bound = (-x[j] * c->levels / signed_max > c->levels - 0.5) ?
					d : d / 2;
			bound += c->levels * d * u + s;
		}
		ck_assert_msg(err <= bound, "%s: x=%a y=%a err %g > bound %g",
			      c->name, x[j], y[j], err, bound);
	}
}

START_TEST(test_round_trip)
{
	const struct rt_case *c = &rt_cases[_i];
	const struct loom_quant_format *f = fmt(c->name);
	enum { NB = 400 };
	static float x[NB * 32], y[NB * 32];
	static uint8_t b[NB * 34];

	for (int k = 0; k < NB; k++)
		fill_block(x + 32 * k, k % 8 < 5 ? k % 8 : 0);
	ck_assert_int_eq(f->from_float(x, b, NB * 32), LOOM_OK);
	ck_assert_int_eq(f->to_float(b, y, NB * 32), LOOM_OK);
	for (int k = 0; k < NB; k++)
		check_block(c, x + 32 * k, y + 32 * k);
	/* An all-zero block decodes to exact zeros. */
	for (int j = 0; j < 32; j++)
		ck_assert(y[4 * 32 + j] == 0.0f);
}
END_TEST

/* Non-finite input must not crash; the output is unspecified. */
START_TEST(test_nonfinite_input)
{
	const struct loom_quant_format *f = fmt(rt_cases[_i].name);
	float x[64], y[64];
	uint8_t b[2 * 34];

	for (int j = 0; j < 64; j++)
		x[j] = rnd();
	x[3] = NAN;
	x[40] = INFINITY;
	x[41] = -INFINITY;
	ck_assert_int_eq(f->from_float(x, b, 64), LOOM_OK);
	ck_assert_int_eq(f->to_float(b, y, 64), LOOM_OK);
}
END_TEST

/*
 * k-quant from_float (the simple scheme documented in kquant.c) round-trip
 * bounds, per super-block of 256 split in groups of G. With u = 2^-11 and
 * a slack s = 2^-18 * max|x| for float rounding:
 *
 *   scale-and-min (q2_K: G 16, L 3 levels, 4-bit scales, S = 15;
 *                  q4_K: G 32, L 15, S = 63; q5_K: G 32, L 31, S = 63):
 *     lo = min(0, min x), range = max x - lo per group; M = max(-lo) and
 *     R = max(range) over the super-block. The min grid adds at most one
 *     dmin = M/S to a group's span, the scale grid one d <= (R + M/S)/(L S),
 *     so a step is at most (range + M/S)/L + d, and err <= step/2 * (1 + 8u).
 *   signed scale (q3_K: G 16, L 4, S = 31; q6_K: G 16, L 32, S = 127):
 *     a = max|x| of the group, A = max a; step <= a/L + A/(L S); err <=
 *     step/2 * (1 + 8u), or step * (1 + 8u) for values of sign opposite
 *     to the group's extreme with |x| > (L - 1/2) a / L (clipped to L - 1).
 */
struct k_case {
	const char *name;
	int group, levels, smax, sign;
};

static const struct k_case k_cases[] = {
	{ "q2_K", 16, 3, 15, 0 },  { "q3_K", 16, 4, 31, 1 },
	{ "q4_K", 32, 15, 63, 0 }, { "q5_K", 32, 31, 63, 0 },
	{ "q6_K", 16, 32, 127, 1 },
};

static void k_check(const struct k_case *c, const float *x, const float *y)
{
	int ng = 256 / c->group;
	double lo[16], hi[16], a[16], mx[16], M = 0, R = 0, A = 0, all = 0;
	const double slack = 1 + 8 * 0x1p-11;

	for (int g = 0; g < ng; g++) {
		lo[g] = 0;
		hi[g] = -INFINITY;
		a[g] = mx[g] = 0;
		for (int j = g * c->group; j < (g + 1) * c->group; j++) {
			lo[g] = fmin(lo[g], x[j]);
			hi[g] = fmax(hi[g], x[j]);
			if (fabs(x[j]) > a[g]) {
				a[g] = fabs(x[j]);
				mx[g] = x[j];
			}
		}
		M = fmax(M, -lo[g]);
		R = fmax(R, hi[g] - lo[g]);
		A = fmax(A, a[g]);
	}
	all = A;
	for (int e = 0; e < 256; e++) {
		int g = e / c->group;
		double err = fabs((double)x[e] - y[e]), step, bound;

		if (!c->sign) {
			step = (hi[g] - lo[g] + M / c->smax) / c->levels +
			       (R + M / c->smax) / ((double)c->levels * c->smax);
			bound = step / 2;
		} else {
			step = a[g] / c->levels + A / ((double)c->levels * c->smax);
			bound = (x[e] * mx[g] < 0 &&
				 fabs(x[e]) > (c->levels - 0.5) * a[g] / c->levels) ?
					step : step / 2;
		}
		bound = bound * slack + 0x1p-18 * all;
		ck_assert_msg(err <= bound, "%s: element %d x=%a y=%a err %g > bound %g",
			      c->name, e, x[e], y[e], err, bound);
	}
}

START_TEST(test_k_round_trip)
{
	const struct k_case *c = &k_cases[_i];
	const struct loom_quant_format *f = fmt(c->name);
	enum { NS = 64 };
	static float x[NS * 256], y[NS * 256];
	static uint8_t b[NS * 210];

	for (int k = 0; k < NS * 8; k++)
		fill_block(x + 32 * k, k % 8 < 5 ? k % 8 : 0);
	/* Whole super-blocks too: all positive, all negative, all zero. */
	for (int j = 0; j < 256; j++) {
		x[256 * 5 + j] = fabsf(x[256 * 5 + j]) + 1.0f;
		x[256 * 6 + j] = -fabsf(x[256 * 6 + j]);
		x[256 * 7 + j] = 0.0f;
	}
	ck_assert_int_eq(f->from_float(x, b, NS * 256), LOOM_OK);
	ck_assert_int_eq(f->to_float(b, y, NS * 256), LOOM_OK);
	for (int k = 0; k < NS; k++)
		k_check(c, x + 256 * k, y + 256 * k);
	for (int j = 0; j < 256; j++)
		ck_assert(y[256 * 7 + j] == 0.0f);
}
END_TEST

START_TEST(test_k_nonfinite)
{
	const struct loom_quant_format *f = fmt(k_cases[_i].name);
	float x[512], y[512];
	uint8_t b[2 * 210];

	for (int j = 0; j < 512; j++)
		x[j] = rnd();
	x[3] = NAN;
	x[300] = INFINITY;
	x[301] = -INFINITY;
	x[400] = FLT_MAX;
	ck_assert_int_eq(f->from_float(x, b, 512), LOOM_OK);
	ck_assert_int_eq(f->to_float(b, y, 512), LOOM_OK);
}
END_TEST

static Suite *quant_suite(void)
{
	Suite *s = suite_create("quant");
	TCase *tc = tcase_create("plugins");

	tcase_add_loop_test(tc, test_descriptors, 0, N_WANT);
	tcase_add_loop_test(tc, test_hidden_symbols, 0, N_WANT);
	tcase_add_loop_test(tc, test_bad_args, 0, 13);
	tcase_add_test(tc, test_f16_cases);
	tcase_add_test(tc, test_f16_exhaustive);
	tcase_add_test(tc, test_bf16);
	tcase_add_test(tc, test_f32_exact);
	tcase_add_test(tc, test_hand_blocks);
	tcase_add_test(tc, test_exact_grids);
	tcase_add_loop_test(tc, test_round_trip, 0,
			    sizeof(rt_cases) / sizeof(rt_cases[0]));
	tcase_add_loop_test(tc, test_nonfinite_input, 0,
			    sizeof(rt_cases) / sizeof(rt_cases[0]));
	tcase_add_loop_test(tc, test_k_round_trip, 0,
			    sizeof(k_cases) / sizeof(k_cases[0]));
	tcase_add_loop_test(tc, test_k_nonfinite, 0,
			    sizeof(k_cases) / sizeof(k_cases[0]));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(quant_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
