/*
 * kernels.cu: device side of cuda.so and rocm.so, one source for both
 * (gpu_port.h maps the runtime names). Host-side checks live in gpu.c;
 * this file launches kernels on validated arguments and maps every runtime
 * failure to LOOM_ERR_DEVICE with a message kept in the context.
 *
 * Kernels use fixed block sizes that are multiples of 64, so every block
 * holds whole warps on 32- and 64-wide targets; reductions use GPU_WARP,
 * the width of the target being compiled.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_port.h"
#include "gpu_rt.h"
/* the KV cache types' layouts and quantizers, on host and device alike */
#define LOOM_KVQ_FN static __host__ __device__ __forceinline__
#include "loom/kv_quant.h"
/* routed experts' routing rule and gpt-oss's clamped SwiGLU, likewise */
#define LOOM_MOE_FN static __host__ __device__ inline
#include "loom/moe.h"

#define THREADS 256
#define MAX_GRID 65535 /* blocks per grid-stride launch */
#define GEMV_ROWS 8    /* weight rows per GEMV block */
#define GEMV_MB 16     /* activation rows per GEMV pass: each weight unit read once */
#define ATTN_THREADS 128
#define TILE_KV 16     /* keys per prefill tile */

struct gpurt {
	int device;
	gpuStream_t stream;
#ifdef GPU_HAVE_BLAS
	cublasHandle_t blas;
	void *blas_ws; /* cuBLAS workspace, set once so captures never allocate */
#endif
	char err[256];
	uint64_t launches; /* kernels queued (gpurt_launches) */
};

struct gpurt_graph {
	gpuGraphExec_t exec;
};

/* cuBLAS's recommended workspace on Hopper (4 MiB suffices before). */
#define BLAS_WORKSPACE ((size_t)32 << 20)

/* ---- errors ---- */

static int fail(struct gpurt *rt, const char *what, gpuError_t e)
{
	snprintf(rt->err, sizeof(rt->err), "%s: %s: %s", GPU_VENDOR, what, gpuGetErrorString(e));
	return e == gpuErrorMemoryAllocation ? LOOM_ERR_NOMEM : LOOM_ERR_DEVICE;
}

/* Status of the launch just queued. */
static int launched(struct gpurt *rt, const char *kernel)
{
	gpuError_t e = gpuGetLastError();

	rt->launches++;
	return e == gpuSuccess ? LOOM_OK : fail(rt, kernel, e);
}

extern "C" uint64_t gpurt_launches(const struct gpurt *rt)
{
	return rt ? rt->launches : 0;
}

/*
 * Makes rt's device current for this thread. The host may call a context
 * from different threads over time, and the current device is per thread.
 */
static int bind(struct gpurt *rt)
{
	gpuError_t e = gpuSetDevice(rt->device);

	return e == gpuSuccess ? LOOM_OK : fail(rt, "set device", e);
}

#define BIND(rt)                               \
	do {                                   \
		int bind_rc_ = bind(rt);       \
		if (bind_rc_)                  \
			return bind_rc_;       \
	} while (0)

static unsigned grid_of(int64_t items)
{
	return items < MAX_GRID ? (unsigned)(items > 0 ? items : 1) : MAX_GRID;
}

extern "C" const char *gpurt_vendor(void)
{
	return GPU_VENDOR;
}

extern "C" const char *gpurt_error(const struct gpurt *rt)
{
	return rt ? rt->err : "no context";
}

extern "C" bool gpurt_has_blas(void)
{
#ifdef GPU_HAVE_BLAS
	return true;
#else
	return false;
#endif
}

/* ---- context and memory ---- */

extern "C" int gpurt_device_count(int *n, char *err, size_t errlen)
{
	gpuError_t e = gpuGetDeviceCount(n);

	if (e != gpuSuccess) {
		*n = 0;
		snprintf(err, errlen, "%s", gpuGetErrorString(e));
		return LOOM_ERR_DEVICE;
	}
	return LOOM_OK;
}

extern "C" int gpurt_open(int device, struct gpurt **out, char *err, size_t errlen)
{
	struct gpurt *rt = (struct gpurt *)calloc(1, sizeof(*rt));
	gpuError_t e;

	*out = NULL;
	if (!rt)
		return LOOM_ERR_NOMEM;
	rt->device = device;
	e = gpuSetDevice(device);
	if (e == gpuSuccess)
		e = gpuStreamCreateWithFlags(&rt->stream, gpuStreamNonBlocking);
	if (e != gpuSuccess) {
		snprintf(err, errlen, "%s device %d: %s", GPU_VENDOR, device, gpuGetErrorString(e));
		free(rt);
		return LOOM_ERR_DEVICE;
	}
#ifdef GPU_HAVE_BLAS
	if (gpuMalloc(&rt->blas_ws, BLAS_WORKSPACE) != gpuSuccess ||
	    cublasCreate(&rt->blas) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetStream(rt->blas, rt->stream) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetMathMode(rt->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetWorkspace(rt->blas, rt->blas_ws, BLAS_WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "CUDA device %d: cuBLAS initialization failed", device);
		if (rt->blas)
			(void)cublasDestroy(rt->blas);
		(void)gpuFree(rt->blas_ws);
		(void)gpuStreamDestroy(rt->stream);
		free(rt);
		return LOOM_ERR_DEVICE;
	}
#endif
	*out = rt;
	return LOOM_OK;
}

extern "C" void gpurt_close(struct gpurt *rt)
{
	if (!rt)
		return;
	/* teardown: failures here leave nothing to undo */
	(void)gpuSetDevice(rt->device);
	(void)gpuStreamSynchronize(rt->stream);
#ifdef GPU_HAVE_BLAS
	(void)cublasDestroy(rt->blas);
	(void)gpuFree(rt->blas_ws);
#endif
	(void)gpuStreamDestroy(rt->stream);
	free(rt);
}

extern "C" int gpurt_info(struct gpurt *rt, char *name, size_t cap, uint64_t *total,
			  uint64_t *avail)
{
	gpuDeviceProp prop;
	size_t f = 0, t = 0;
	gpuError_t e;

	BIND(rt);

	e = gpuGetDeviceProperties(&prop, rt->device);
	if (e != gpuSuccess)
		return fail(rt, "device properties", e);
	e = gpuMemGetInfo(&f, &t);
	if (e != gpuSuccess)
		return fail(rt, "memory info", e);
	snprintf(name, cap, "%s %d: %s (warp %d)", GPU_VENDOR, rt->device, prop.name,
		 prop.warpSize);
	*total = t;
	*avail = f;
	return LOOM_OK;
}

/* Status of an allocation; a failure clears its (non-sticky) error. */
static int allocated(struct gpurt *rt, const char *what, gpuError_t e, void **out)
{
	if (e == gpuSuccess)
		return LOOM_OK;
	*out = NULL;
	(void)gpuGetLastError();
	return fail(rt, what, e);
}

/* Waits until nothing queued can still use memory about to be freed
 * (teardown path: a failure leaves nothing to undo). */
static void drain(struct gpurt *rt)
{
	(void)gpuSetDevice(rt->device);
	(void)gpuStreamSynchronize(rt->stream);
}

extern "C" int gpurt_alloc(struct gpurt *rt, size_t size, void **out)
{
	gpuError_t e;

	BIND(rt);
	e = gpuMalloc(out, size);

	return allocated(rt, "allocation", e, out);
}

extern "C" void gpurt_free(struct gpurt *rt, void *p)
{
	if (!p)
		return;
	drain(rt);
	(void)gpuFree(p);
}

/* Waits for the copy: an async copy from pageable memory is documented
 * as "might be synchronous", not as done with src when it returns. */
extern "C" int gpurt_upload(struct gpurt *rt, void *dst, const void *src, size_t n)
{
	gpuError_t e;

	BIND(rt);
	e = gpuMemcpyAsync(dst, src, n, gpuMemcpyHostToDevice, rt->stream);

	if (e == gpuSuccess)
		e = gpuStreamSynchronize(rt->stream);
	return e == gpuSuccess ? LOOM_OK : fail(rt, "upload", e);
}

/* src must be pinned (gpurt_host_alloc) and stay untouched until the
 * next gpurt_sync. */
extern "C" int gpurt_upload_async(struct gpurt *rt, void *dst, const void *src, size_t n)
{
	gpuError_t e;

	BIND(rt);
	e = gpuMemcpyAsync(dst, src, n, gpuMemcpyHostToDevice, rt->stream);

	return e == gpuSuccess ? LOOM_OK : fail(rt, "upload", e);
}

extern "C" int gpurt_download_async(struct gpurt *rt, void *dst, const void *src, size_t n)
{
	gpuError_t e;

	BIND(rt);
	e = gpuMemcpyAsync(dst, src, n, gpuMemcpyDeviceToHost, rt->stream);

	return e == gpuSuccess ? LOOM_OK : fail(rt, "download", e);
}

extern "C" int gpurt_host_alloc(struct gpurt *rt, size_t size, void **out)
{
	gpuError_t e;

	BIND(rt);
	e = gpuMallocHost(out, size);

	return allocated(rt, "pinned host allocation", e, out);
}

extern "C" void gpurt_host_free(struct gpurt *rt, void *p)
{
	if (!p)
		return;
	drain(rt);
	(void)gpuFreeHost(p);
}

extern "C" int gpurt_download(struct gpurt *rt, void *dst, const void *src, size_t n)
{
	gpuError_t e;

	BIND(rt);
	e = gpuMemcpyAsync(dst, src, n, gpuMemcpyDeviceToHost, rt->stream);

	if (e == gpuSuccess)
		e = gpuStreamSynchronize(rt->stream);
	return e == gpuSuccess ? LOOM_OK : fail(rt, "download", e);
}

extern "C" int gpurt_copy(struct gpurt *rt, void *dst, const void *src, size_t n)
{
	gpuError_t e;

	BIND(rt);
	e = gpuMemcpyAsync(dst, src, n, gpuMemcpyDeviceToDevice, rt->stream);

	return e == gpuSuccess ? LOOM_OK : fail(rt, "device copy", e);
}

extern "C" int gpurt_sync(struct gpurt *rt)
{
	gpuError_t e;

	BIND(rt);
	e = gpuStreamSynchronize(rt->stream);

	return e == gpuSuccess ? LOOM_OK : fail(rt, "synchronize", e);
}

/* ---- graphs ---- */

extern "C" int gpurt_capture_begin(struct gpurt *rt)
{
	gpuError_t e;

	BIND(rt);
	e = gpuStreamBeginCapture(rt->stream);
	return e == gpuSuccess ? LOOM_OK : fail(rt, "begin capture", e);
}

extern "C" int gpurt_capture_end(struct gpurt *rt, bool keep, struct gpurt_graph **out)
{
	gpuGraph_t graph = NULL;
	gpuError_t e = gpuStreamEndCapture(rt->stream, &graph);
	struct gpurt_graph *g = NULL;

	*out = NULL;
	if (e == gpuSuccess && keep) {
		g = (struct gpurt_graph *)calloc(1, sizeof(*g));
		e = g ? gpuGraphInstantiate(&g->exec, graph) : gpuErrorMemoryAllocation;
	}
	if (graph)
		(void)gpuGraphDestroy(graph);
	(void)gpuGetLastError(); /* a failed capture leaves nothing sticky */
	if (e != gpuSuccess) {
		free(g);
		return keep ? fail(rt, "end capture", e) : LOOM_OK;
	}
	*out = g;
	return LOOM_OK;
}

extern "C" int gpurt_graph_launch(struct gpurt *rt, struct gpurt_graph *g)
{
	gpuError_t e;

	BIND(rt);
	e = gpuGraphLaunch(g->exec, rt->stream);
	if (e != gpuSuccess)
		return fail(rt, "graph launch", e);
	return launched(rt, "graph");
}

/* Waits first: CUDA defers destroying a graph still running, older HIP
 * documents no such promise. */
extern "C" void gpurt_graph_free(struct gpurt *rt, struct gpurt_graph *g)
{
	if (!g)
		return;
	drain(rt);
	(void)gpuGraphExecDestroy(g->exec);
	free(g);
}

/* ---- weight formats ---- */

/*
 * The formats the kernels decode in place. Every kernel that reads a
 * weight is a template over the format, so a format's decoding is
 * compiled into its own kernel (no run-time switch in an inner loop); the
 * host picks the instance with a switch over GPU_FORMATS.
 */
#define GPU_FORMATS(X)                                                            \
	X(LOOM_TYPE_F32) X(LOOM_TYPE_F16) X(LOOM_TYPE_BF16) X(LOOM_TYPE_Q8_0)     \
	X(LOOM_TYPE_Q4_0) X(LOOM_TYPE_Q4_1) X(LOOM_TYPE_Q5_0) X(LOOM_TYPE_Q5_1)   \
	X(LOOM_TYPE_Q2_K) X(LOOM_TYPE_Q3_K) X(LOOM_TYPE_Q4_K) X(LOOM_TYPE_Q5_K)   \
	X(LOOM_TYPE_Q6_K) X(LOOM_TYPE_MXFP4) X(GPU_Q4_0P) X(GPU_Q8_0P) X(GPU_Q6_KP)

/* The formats of the fast GEMV (an integer unit<T>, 8-bit activations),
 * and of the int8 tiled GEMM (a dec32<T>): every one but q2_K, whose
 * min per 16 values would need activation sums per 16 values, which the
 * GEMV's q2_K unit makes itself but the tile's activation blocks (one
 * sum per 32) do not carry. */
#define GPU_MMQ_FORMATS(X)                                                         \
	X(LOOM_TYPE_Q8_0) X(LOOM_TYPE_Q4_0) X(LOOM_TYPE_Q4_1) X(LOOM_TYPE_Q5_0)    \
	X(LOOM_TYPE_Q5_1) X(LOOM_TYPE_Q3_K) X(LOOM_TYPE_Q4_K) X(LOOM_TYPE_Q5_K)    \
	X(LOOM_TYPE_Q6_K) X(GPU_Q4_0P) X(GPU_Q8_0P) X(GPU_Q6_KP)
#define GPU_Q8_FORMATS(X) GPU_MMQ_FORMATS(X) X(LOOM_TYPE_Q2_K)

/* Bytes per block (per value for the plain types); 0: not a format here. */
static constexpr __host__ __device__ uint32_t bytes_of(uint32_t t)
{
	return t == LOOM_TYPE_F32 ? 4 : t == LOOM_TYPE_F16 || t == LOOM_TYPE_BF16 ? 2 :
	       t == LOOM_TYPE_Q8_0 ? 34 : t == LOOM_TYPE_Q4_0 ? 18 : t == LOOM_TYPE_Q4_1 ? 20 :
	       t == LOOM_TYPE_Q5_0 ? 22 : t == LOOM_TYPE_Q5_1 ? 24 : t == LOOM_TYPE_Q2_K ? 84 :
	       t == LOOM_TYPE_Q3_K ? 110 : t == LOOM_TYPE_Q4_K ? 144 :
	       t == LOOM_TYPE_Q5_K ? 176 : t == LOOM_TYPE_Q6_K ? 210 :
	       t == LOOM_TYPE_MXFP4 ? 17 : t == GPU_Q4_0P ? 18 : t == GPU_Q8_0P ? 34 :
	       t == GPU_Q6_KP ? 210 : 0;
}

/* A layout of weight_pack's (gpu_rt.h), and its quant bytes per block. */
static constexpr __host__ __device__ bool is_packed(uint32_t t)
{
	return t == GPU_Q4_0P || t == GPU_Q8_0P || t == GPU_Q6_KP;
}

/* the bytes of a block but its f16 scale d: q4_0's and q8_0's quants,
 * q6_K's ql, qh and scales (GGUF's first 208 bytes of a super-block) */
static constexpr __host__ __device__ uint32_t pk_qbytes(uint32_t t)
{
	return t == GPU_Q4_0P ? 16 : t == GPU_Q6_KP ? 208 : 32;
}

static constexpr __host__ __device__ bool is_plain(uint32_t t)
{
	return t == LOOM_TYPE_F32 || t == LOOM_TYPE_F16 || t == LOOM_TYPE_BF16;
}

/* k-quants: super-blocks of 256 values (GGUF's QK_K). */
static constexpr __host__ __device__ bool is_kquant(uint32_t t)
{
	return t == LOOM_TYPE_Q2_K || t == LOOM_TYPE_Q3_K || t == LOOM_TYPE_Q4_K ||
	       t == LOOM_TYPE_Q5_K || t == LOOM_TYPE_Q6_K || t == GPU_Q6_KP;
}

static constexpr __host__ __device__ uint32_t elems_of(uint32_t t)
{
	return !bytes_of(t) ? 0 : is_plain(t) ? 1 : is_kquant(t) ? 256 : 32;
}

/* Formats a caller may name (not the packed layouts, which only gpu.c
 * hands down). */
extern "C" bool gpurt_format_known(uint32_t type)
{
	return bytes_of(type) != 0 && !is_packed(type);
}

extern "C" size_t gpurt_packed_row(uint32_t type, int64_t k)
{
	const uint32_t p = type | GPU_TYPE_PACKED;

	if (!is_packed(p) || type == p || k <= 0 || k % elems_of(p))
		return 0;
	return ((size_t)(k / elems_of(p)) * (pk_qbytes(p) + 2) + 15) & ~(size_t)15;
}

extern "C" uint32_t gpurt_block_elems(uint32_t type)
{
	return elems_of(type);
}

extern "C" uint32_t gpurt_block_bytes(uint32_t type)
{
	return bytes_of(type);
}

/* Little-endian loads that work at any alignment, the widest the address
 * allows (GGUF's 18- and 34-byte blocks are only 2-byte aligned). */
__device__ __forceinline__ uint32_t ld16(const uint8_t *p)
{
	if (((uintptr_t)p & 1) == 0)
		return *(const uint16_t *)p;
	return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

__device__ __forceinline__ uint32_t ld32(const uint8_t *p)
{
	if (((uintptr_t)p & 3) == 0)
		return *(const uint32_t *)p;
	return ld16(p) | ld16(p + 2) << 16;
}

/* IEEE half to float, exactly (subnormals included). */
__device__ __forceinline__ float half_to_f32(uint32_t h)
{
	uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 31, mant = h & 0x3ff;
	float f;

	if (exp == 0) {
		f = (float)mant * 5.9604644775390625e-8f; /* mant * 2^-24 */
		return sign ? -f : f;
	}
	if (exp == 31)
		return __uint_as_float(sign | 0x7f800000u | mant << 13);
	return __uint_as_float(sign | (exp + 112) << 23 | mant << 13);
}

/* float to IEEE half, rounding to nearest even; overflow gives infinity. */
__device__ __forceinline__ uint16_t f32_to_half(float f)
{
	uint32_t x, sign, mant;
	int exp;

	memcpy(&x, &f, sizeof(x));
	sign = (x >> 16) & 0x8000u;
	exp = (int)((x >> 23) & 0xff) - 127 + 15;
	mant = x & 0x7fffffu;
	if (((x >> 23) & 0xff) == 0xff) /* inf or NaN (kept quiet) */
		return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
	if (exp >= 31)
		return (uint16_t)(sign | 0x7c00u);
	if (exp <= 0) { /* subnormal half, or zero */
		uint32_t m = mant | 0x800000u, shift = (uint32_t)(14 - exp), h, rest, halfway;

		if (exp < -10)
			return (uint16_t)sign;
		h = m >> shift;
		rest = m & ((1u << shift) - 1);
		halfway = 1u << (shift - 1);
		if (rest > halfway || (rest == halfway && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	{
		uint32_t h = (uint32_t)exp << 10 | mant >> 13, rest = mant & 0x1fffu;

		if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
			h++; /* may carry into the exponent, up to infinity: correct */
		return (uint16_t)(sign | h);
	}
}

/* a * b rounded once, never fused with a following add: the reference
 * dequantizers (compiled with -ffp-contract=off) round the product
 * before subtracting a min, and so do these, bit for bit. */
__device__ __forceinline__ float mul_rn(float a, float b)
{
#ifdef GPU_EMU
	return a * b; /* the emulator is compiled with -ffp-contract=off */
#else
	return __fmul_rn(a, b);
#endif
}

/*
 * A row is read in parts of 8 values. Part q of a plain row (f32, f16,
 * bf16), of a q8_0 row or of a k-quant row is values 8q .. 8q+7 (a
 * k-quant part lies inside one sub-block, so it has one scale). Part q of
 * a 4- or 5-bit row of 32-value blocks is, in block b = q/4 with j =
 * 4 (q%4): values j .. j+3 (low nibbles of bytes j .. j+3) and j+16 ..
 * j+19 (their high nibbles).
 */
template <uint32_t T> __device__ __forceinline__ int64_t part_index(int64_t q, int e)
{
	if constexpr (T == LOOM_TYPE_Q4_0 || T == LOOM_TYPE_Q4_1 || T == LOOM_TYPE_Q5_0 ||
		      T == LOOM_TYPE_Q5_1 || T == LOOM_TYPE_MXFP4 || T == GPU_Q4_0P)
		return (q >> 2) * 32 + (q & 3) * 4 + (e < 4 ? e : 12 + e);
	return q * 8 + e;
}

/* Plain types: values 8q .. 8q+7, zeros past k. */
template <uint32_t T>
__device__ __forceinline__ void deq_plain(const uint8_t *row, int64_t q, int64_t k, float v[8])
{
	for (int e = 0; e < 8; e++) {
		int64_t i = q * 8 + e;

		if (i >= k)
			v[e] = 0.0f;
		else if constexpr (T == LOOM_TYPE_F32)
			v[e] = __uint_as_float(ld32(row + 4 * i));
		else if constexpr (T == LOOM_TYPE_F16)
			v[e] = half_to_f32(ld16(row + 2 * i));
		else
			v[e] = __uint_as_float(ld16(row + 2 * i) << 16);
	}
}

/* 32-value blocks b, part j = 4 (q%4) of them. The _at forms take the
 * scale and the block's quants (qs) apart: the GGUF and the packed
 * layouts share them, so a value is the same float in both. */
__device__ __forceinline__ void deq_q8_0_at(float d, const uint8_t *qs, int p, float v[8])
{
	for (int e = 0; e < 8; e++)
		v[e] = (float)(int8_t)qs[p * 8 + e] * d;
}

__device__ __forceinline__ void deq_q8_0(const uint8_t *b, int p, float v[8])
{
	deq_q8_0_at(half_to_f32(ld16(b)), b + 2, p, v);
}

__device__ __forceinline__ void deq_q4_0_at(float d, const uint8_t *qs, int j, float v[8])
{
	for (int e = 0; e < 4; e++) {
		v[e] = (float)((qs[j + e] & 15) - 8) * d;
		v[e + 4] = (float)((qs[j + e] >> 4) - 8) * d;
	}
}

__device__ __forceinline__ void deq_q4_0(const uint8_t *b, int j, float v[8])
{
	deq_q4_0_at(half_to_f32(ld16(b)), b + 2, j, v);
}

/* A packed row (gpu_rt.h) of k values: block b's quants and its scale. */
template <uint32_t T> __device__ __forceinline__ const uint8_t *pk_quants(const uint8_t *row,
									  int64_t b)
{
	return row + b * pk_qbytes(T);
}

template <uint32_t T>
__device__ __forceinline__ float pk_scale(const uint8_t *row, int64_t b, int64_t k)
{
	return half_to_f32(*(const uint16_t *)(row + k / elems_of(T) * pk_qbytes(T) + 2 * b));
}

__device__ __forceinline__ void deq_q4_1(const uint8_t *b, int j, float v[8])
{
	const float d = half_to_f32(ld16(b)), m = half_to_f32(ld16(b + 2));

	for (int e = 0; e < 4; e++) {
		v[e] = mul_rn((float)(b[4 + j + e] & 15), d) + m;
		v[e + 4] = mul_rn((float)(b[4 + j + e] >> 4), d) + m;
	}
}

__device__ __forceinline__ void deq_q5_0(const uint8_t *b, int j, float v[8])
{
	const float d = half_to_f32(ld16(b));
	const uint32_t qh = ld32(b + 2);

	for (int e = 0; e < 4; e++) {
		int lo = (b[6 + j + e] & 15) | (int)((qh >> (j + e)) & 1) << 4;
		int hi = (b[6 + j + e] >> 4) | (int)((qh >> (j + e + 16)) & 1) << 4;

		v[e] = (float)(lo - 16) * d;
		v[e + 4] = (float)(hi - 16) * d;
	}
}

__device__ __forceinline__ void deq_q5_1(const uint8_t *b, int j, float v[8])
{
	const float d = half_to_f32(ld16(b)), m = half_to_f32(ld16(b + 2));
	const uint32_t qh = ld32(b + 4);

	for (int e = 0; e < 4; e++) {
		int lo = (b[8 + j + e] & 15) | (int)((qh >> (j + e)) & 1) << 4;
		int hi = (b[8 + j + e] >> 4) | (int)((qh >> (j + e + 16)) & 1) << 4;

		v[e] = mul_rn((float)lo, d) + m;
		v[e + 4] = mul_rn((float)hi, d) + m;
	}
}

/*
 * mxfp4 (plugins/quant/mxfp4.c): an E8M0 scale byte e, then q4_0's nibble
 * layout of E2M1 codes. Code c is the doubled value +-{0, 1, 2, 3, 4, 6,
 * 8, 12} (sign bit 8), times 2^(e - 128) built from its bits: every
 * product exact, as the reference's.
 */
__device__ __forceinline__ float mxfp4_value(uint32_t c, float d)
{
	const int m = (int)(c & 7), a = m < 4 ? m : (m & 1 ? 6 : 4) << ((m - 4) >> 1);

	return (float)(c & 8 ? -a : a) * d;
}

__device__ __forceinline__ void deq_mxfp4(const uint8_t *b, int j, float v[8])
{
	const uint32_t e = b[0];
	const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);

	for (int i = 0; i < 4; i++) {
		v[i] = mxfp4_value(b[1 + j + i] & 15, d);
		v[i + 4] = mxfp4_value(b[1 + j + i] >> 4, d);
	}
}

/*
 * k-quants (layouts as in GGUF, see plugins/quant/kquant.c): part p (0..31)
 * of super-block b is its values e = 8p .. 8p+7. Low 2-bit fields (q2_K,
 * q3_K, q6_K's top bits) of e sit in byte 32 (e/128) + e%32 at shift
 * 2 (e/32 % 4); q4_K/q5_K nibbles in byte 32 (e/64) + e%32, high half for
 * odd e/32; q6_K's low nibble in byte 64 (e/128) + e%64, high half for odd
 * e/64. Scale first (d * sc), then times q, then minus the min, each
 * product rounded: the reference's order.
 */
__device__ __forceinline__ void deq_q2_K(const uint8_t *b, int p, float v[8])
{
	const uint8_t *qs = b + 16 + 32 * (p >> 4) + 8 * (p & 3);
	const int shift = 2 * ((p >> 2) & 3);
	const uint32_t sc = b[p >> 1];
	const float dl = mul_rn(half_to_f32(ld16(b + 80)), (float)(sc & 15));
	const float ml = mul_rn(half_to_f32(ld16(b + 82)), (float)(sc >> 4));

	for (int e = 0; e < 8; e++)
		v[e] = mul_rn(dl, (float)((qs[e] >> shift) & 3)) - ml;
}

/* q3_K scale i (of 16): 6 bits, low 4 in byte i%8 (high half for i >= 8),
 * top 2 in byte 8 + i%4 at 2 (i/4); stored biased by 32. */
__device__ __forceinline__ int q3_K_scale(const uint8_t *s, int i)
{
	int lo = (s[i & 7] >> (4 * (i >> 3))) & 15, hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;

	return (lo | hi << 4) - 32;
}

__device__ __forceinline__ void deq_q3_K(const uint8_t *b, int p, float v[8])
{
	const uint8_t *hmask = b + 8 * (p & 3), *qs = b + 32 + 32 * (p >> 4) + 8 * (p & 3);
	const int shift = 2 * ((p >> 2) & 3), bit = p >> 2;
	const float dl = mul_rn(half_to_f32(ld16(b + 108)), (float)q3_K_scale(b + 96, p >> 1));

	for (int e = 0; e < 8; e++) {
		int q = ((qs[e] >> shift) & 3) - ((hmask[e] >> bit) & 1 ? 0 : 4);

		v[e] = mul_rn(dl, (float)q);
	}
}

/* q4_K/q5_K 6-bit scale and min of sub-block j (0..7) from 12 bytes. */
__device__ __forceinline__ void k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
		*m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
	}
}

/* q4_K (Q5 false) and q5_K (Q5 true: a fifth bit from qh). */
template <bool Q5> __device__ __forceinline__ void deq_q45_K(const uint8_t *b, int p, float v[8])
{
	const int j = p >> 2, shift = 4 * (j & 1);
	const uint8_t *qh = b + 16 + 8 * (p & 3);
	const uint8_t *qs = b + (Q5 ? 48 : 16) + 32 * (p >> 3) + 8 * (p & 3);
	int sc, m;
	float dl, ml;

	k4_scale_min(b + 4, j, &sc, &m);
	dl = mul_rn(half_to_f32(ld16(b)), (float)sc);
	ml = mul_rn(half_to_f32(ld16(b + 2)), (float)m);
	for (int e = 0; e < 8; e++) {
		int q = (qs[e] >> shift) & 15;

		if (Q5)
			q |= ((qh[e] >> j) & 1) << 4;
		v[e] = mul_rn(dl, (float)q) - ml;
	}
}

/* d given apart: the GGUF layout's (at b + 208) or a packed row's */
__device__ __forceinline__ void deq_q6_K_at(const uint8_t *b, float d, int p, float v[8])
{
	const uint8_t *ql = b + 64 * (p >> 4) + 8 * (p & 7);
	const uint8_t *qh = b + 128 + 32 * (p >> 4) + 8 * (p & 3);
	const int lshift = 4 * ((p >> 3) & 1), hshift = 2 * ((p >> 2) & 3);
	const float dl = mul_rn(d, (float)(int8_t)b[192 + (p >> 1)]);

	for (int e = 0; e < 8; e++) {
		int q = ((ql[e] >> lshift) & 15) | ((qh[e] >> hshift) & 3) << 4;

		v[e] = mul_rn(dl, (float)(q - 32));
	}
}

__device__ __forceinline__ void deq_q6_K(const uint8_t *b, int p, float v[8])
{
	deq_q6_K_at(b, half_to_f32(ld16(b + 208)), p, v);
}

/* Values of part q of `row` (k values in all) into v; past k, zeros. */
template <uint32_t T>
__device__ __forceinline__ void deq_part(const uint8_t *row, int64_t q, int64_t k, float v[8])
{
	constexpr int64_t per_block = is_plain(T) ? 1 : elems_of(T) / 8; /* parts a block */
	const uint8_t *b = row + q / per_block * bytes_of(T);
	const int p = (int)(q % per_block);

	if constexpr (is_plain(T))
		deq_plain<T>(row, q, k, v);
	else if constexpr (T == GPU_Q8_0P)
		deq_q8_0_at(pk_scale<T>(row, q / per_block, k), pk_quants<T>(row, q / per_block), p,
			    v);
	else if constexpr (T == GPU_Q4_0P)
		deq_q4_0_at(pk_scale<T>(row, q / per_block, k), pk_quants<T>(row, q / per_block),
			    4 * p, v);
	else if constexpr (T == GPU_Q6_KP)
		deq_q6_K_at(pk_quants<T>(row, q / per_block), pk_scale<T>(row, q / per_block, k), p,
			    v);
	else if constexpr (T == LOOM_TYPE_Q8_0)
		deq_q8_0(b, p, v);
	else if constexpr (T == LOOM_TYPE_Q4_0)
		deq_q4_0(b, 4 * p, v);
	else if constexpr (T == LOOM_TYPE_Q4_1)
		deq_q4_1(b, 4 * p, v);
	else if constexpr (T == LOOM_TYPE_Q5_0)
		deq_q5_0(b, 4 * p, v);
	else if constexpr (T == LOOM_TYPE_Q5_1)
		deq_q5_1(b, 4 * p, v);
	else if constexpr (T == LOOM_TYPE_Q2_K)
		deq_q2_K(b, p, v);
	else if constexpr (T == LOOM_TYPE_Q3_K)
		deq_q3_K(b, p, v);
	else if constexpr (T == LOOM_TYPE_Q4_K)
		deq_q45_K<false>(b, p, v);
	else if constexpr (T == LOOM_TYPE_Q5_K)
		deq_q45_K<true>(b, p, v);
	else if constexpr (T == LOOM_TYPE_MXFP4)
		deq_mxfp4(b, 4 * p, v);
	else
		deq_q6_K(b, p, v);
	(void)k;
}

/* Parts in a row of k values (k a whole number of blocks for block types). */
static int64_t parts_of(uint32_t t, int64_t k)
{
	return is_plain(t) ? (k + 7) / 8 : k / 8;
}

/* Whether value idx of a part exists: only plain rows end inside a part. */
template <uint32_t T> __device__ __forceinline__ bool in_row(int64_t idx, int64_t k)
{
	return !is_plain(T) || idx < k;
}

/* `return fn<T>;` for the format t (one case per format of GPU_FORMATS). */
#define FORMAT_CASE(T) case T: return FORMAT_FN<T>;

/* ---- reductions ---- */

/* The emulator replays each butterfly below on one warp exchange
 * (emu_xor_reduce: the same bits, a fifth of the fiber switches). */
template <typename T> __device__ __forceinline__ T warp_sum(T v)
{
#ifdef GPU_EMU
	return emu_xor_reduce<GPU_WARP / 2>(v, [](T a, T b) { return a + b; });
#else
	for (int off = GPU_WARP / 2; off > 0; off /= 2)
		v += gpu_shfl_xor(v, off);
	return v;
#endif
}

__device__ __forceinline__ float warp_max(float v)
{
#ifdef GPU_EMU
	return emu_xor_reduce<GPU_WARP / 2>(v, [](float a, float b) { return fmaxf(a, b); });
#else
	for (int off = GPU_WARP / 2; off > 0; off /= 2)
		v = fmaxf(v, gpu_shfl_xor(v, off));
	return v;
#endif
}

/*
 * Block-wide sum or max: each warp reduces, then every thread combines the
 * warp results in the same order, so all threads get the same value. red
 * is shared scratch of at least blockDim.x / GPU_WARP entries.
 */
template <typename T> __device__ T block_sum(T v, T *red)
{
	const int nw = blockDim.x / GPU_WARP;

	v = warp_sum(v);
	__syncthreads(); /* red may still be read by a previous call */
	if (threadIdx.x % GPU_WARP == 0)
		red[threadIdx.x / GPU_WARP] = v;
	__syncthreads();
	v = red[0];
	for (int w = 1; w < nw; w++)
		v += red[w];
	return v;
}

__device__ float block_max(float v, float *red)
{
	const int nw = blockDim.x / GPU_WARP;

	v = warp_max(v);
	__syncthreads();
	if (threadIdx.x % GPU_WARP == 0)
		red[threadIdx.x / GPU_WARP] = v;
	__syncthreads();
	v = red[0];
	for (int w = 1; w < nw; w++)
		v = fmaxf(v, red[w]);
	return v;
}

/* ---- gemm ---- */

/* A format the host side did not check: a bug there, reported, not run. */
static int unknown_format(struct gpurt *rt, const char *what, uint32_t t)
{
	snprintf(rt->err, sizeof(rt->err), "%s: no kernel for weight type %u", what, (unsigned)t);
	return LOOM_ERR_UNSUPPORTED;
}

/* ---- fast GEMV: 8-bit activations, integer dot products ---- */

/*
 * Outside exact mode a GEMV of q4_0, q8_0, q4_K or q6_K weights quantizes its
 * activations once, per row in blocks of 32 (GGML's q8_1): d = max|x| /
 * 127, q = round(x / d), and s = d * sum(q) for the formats with a min or
 * an offset. The dot of a weight block with an activation block is then
 * sums of 4 byte products in 32-bit integers (dp4a), scaled once per
 * block. The activations are loaded 16 bytes at a time, and q4_K's
 * nibbles too where the weight rows are 16-byte aligned.
 */
#define Q8_BLOCK 32

struct alignas(8) q8_scale {
	float d, s;
};

struct q8_p {
	const float *x;
	int64_t x_stride, m, k;
	int8_t *qs;             /* m x k, rows k apart */
	struct q8_scale *scale; /* m x k / 32 */
};

/* Max and sum over 32 lanes (a warp, or half of a 64-wide one). */
__device__ __forceinline__ float max32(float v)
{
#ifdef GPU_EMU
	return emu_xor_reduce<16>(v, [](float a, float b) { return fmaxf(a, b); });
#else
	for (int off = 16; off > 0; off /= 2)
		v = fmaxf(v, gpu_shfl_xor(v, off));
	return v;
#endif
}

__device__ __forceinline__ int sum32(int v)
{
#ifdef GPU_EMU
	return emu_xor_reduce<16>(v, [](int a, int b) { return a + b; });
#else
	for (int off = 16; off > 0; off /= 2)
		v += gpu_shfl_xor(v, off);
	return v;
#endif
}

/* Value v at index g of the m x k activations (the 32 lanes of a group
 * hold one block, g / 32, and all of them call this): its 8-bit value
 * and, from the group's first lane, the block's scales; nothing stored
 * without `store` (a group past the end). A value that is not finite
 * leaves q 0 and a scale that is not finite, so the outputs it reaches
 * are not finite either. */
__device__ __forceinline__ void quantize_at(float v, int64_t g, bool store, int8_t *qs,
					    struct q8_scale *scale)
{
	const float amax = max32(fabsf(v));
	const float d = amax / 127.0f, r = rintf(v * (amax > 0.0f ? 127.0f / amax : 0.0f));
	const int q = r >= -127.0f && r <= 127.0f ? (int)r : 0;
	const int sum = sum32(q);

	if (!store)
		return;
	qs[g] = (int8_t)q;
	if ((threadIdx.x & 31) == 0)
		scale[g / Q8_BLOCK] = q8_scale{ d, d * (float)sum };
}

/* One value per thread (k and the grid stride are multiples of 32, so a
 * group runs as a whole). */
__global__ void __launch_bounds__(THREADS) k_quantize_q8(const struct q8_p p)
{
	const int64_t total = p.m * p.k;

	for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < total;
	     g += (int64_t)gridDim.x * blockDim.x)
		quantize_at(p.x[g / p.k * p.x_stride + g % p.k], g, true, p.qs, p.scale);
}

extern "C" int gpurt_quantize_q8(struct gpurt *rt, const float *x, int64_t x_stride,
				 int64_t m, int64_t k, int8_t *qs, void *scale)
{
	struct q8_p p = { x, x_stride, m, k, qs, (struct q8_scale *)scale };

	BIND(rt);
	GPU_LAUNCH(k_quantize_q8, grid_of((m * k + THREADS - 1) / THREADS), THREADS, 0, rt->stream,
		   p);
	return launched(rt, "activation quantize kernel");
}

#define FORMAT_TRUE(T) case T: return true;

extern "C" bool gpurt_gemv_q8_format(uint32_t type)
{
	switch (type) {
		GPU_Q8_FORMATS(FORMAT_TRUE)
	default:
		return false;
	}
}

extern "C" bool gpurt_mmq_format(uint32_t type)
{
	switch (type) {
		GPU_MMQ_FORMATS(FORMAT_TRUE)
	default:
		return false;
	}
}

/* n 32-bit words from p: 16 bytes a load where p is 16-byte aligned. */
__device__ __forceinline__ void ld_words(const uint8_t *p, int n, uint32_t *w)
{
	if (((uintptr_t)p & 15) == 0) {
		for (int i = 0; i < n; i += 4) {
			const uint4 v = *(const uint4 *)(p + 4 * i);

			w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
		}
		return;
	}
	for (int i = 0; i < n; i++)
		w[i] = ld32(p + 4 * i);
}

/* The same from a 16-byte aligned p (a packed weight's quants): 128-bit
 * loads, no alignment test. */
__device__ __forceinline__ void ld_words16(const uint8_t *p, int n, uint32_t *w)
{
	for (int i = 0; i < n; i += 4) {
		const uint4 v = *(const uint4 *)(p + 4 * i);

		w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
	}
}

/* sum plus the dp4a of n words of signed bytes q and x */
__device__ __forceinline__ int dot_words(const uint32_t *q, const uint32_t *x, int n, int sum)
{
	for (int t = 0; t < n; t++)
		sum = gpu_dp4a((int)q[t], (int)x[t], sum);
	return sum;
}

/* sum plus the sum of the signed bytes of n words of x (a dp4a with ones) */
__device__ __forceinline__ int sum_words(const uint32_t *x, int n, int sum)
{
	for (int t = 0; t < n; t++)
		sum = gpu_dp4a(0x01010101, (int)x[t], sum);
	return sum;
}

/* The integer dot of 32 values held as signed bytes in value order (8
 * words) with the activation block at xq. The units take these sums into
 * a local before they read the activation scales: written inside the
 * float expression, nvcc loads xs first and keeps it live across the
 * dp4a chain (more registers, and spills in the 16-row GEMV). */
__device__ __forceinline__ int dot_bytes32(const uint32_t q[8], const int8_t *xq)
{
	uint32_t x[8];

	ld_words((const uint8_t *)xq, 8, x);
	return dot_words(q, x, 8, 0);
}

/* The integer dot of 32 values in q4_0's nibble layout (4 words; byte j:
 * value j in the low nibble, value j + 16 in the high) with the
 * activation block at xq. */
__device__ __forceinline__ int dot_nibbles32(const uint32_t q[4], const int8_t *xq)
{
	uint32_t x[8];
	int sum = 0;

	ld_words((const uint8_t *)xq, 8, x);
	for (int t = 0; t < 4; t++) {
		sum = gpu_dp4a((int)(q[t] & 0x0f0f0f0fu), (int)x[t], sum);
		sum = gpu_dp4a((int)((q[t] >> 4) & 0x0f0f0f0fu), (int)x[t + 4], sum);
	}
	return sum;
}

/* d * scale (dl) and dmin * min (ml) of sub-blocks 2 pair and 2 pair + 1
 * of the q4_K or q5_K super-block at b */
__device__ __forceinline__ void k45_pair_scales(const uint8_t *b, int pair, float dl[2],
						float ml[2])
{
	const float d = half_to_f32(ld16(b)), dmin = half_to_f32(ld16(b + 2));

	GPU_UNROLL
	for (int h = 0; h < 2; h++) {
		int sc, m;

		k4_scale_min(b + 4, 2 * pair + h, &sc, &m);
		dl[h] = d * (float)sc, ml[h] = dmin * (float)m;
	}
}

/* The dot of a q4_K or q5_K unit (a pair of sub-blocks): sub-block hh's
 * quants are nibble hh of q's bytes, for q5_K (Q5) with bit hh of h's
 * bytes as the fifth bit; value = dl q - ml, so per sub-block
 * dl dx sum(q xq) - ml s. */
template <bool Q5>
__device__ __forceinline__ float dot_k45(const uint32_t q[8], const uint32_t *h, const float dl[2],
					 const float ml[2], const int8_t *xq,
					 const struct q8_scale *xs)
{
	float r = 0.0f;

	GPU_UNROLL
	for (int hh = 0; hh < 2; hh++) {
		uint32_t x[8];
		int sum = 0;

		ld_words((const uint8_t *)xq + 32 * hh, 8, x);
		for (int t = 0; t < 8; t++) {
			uint32_t v = (q[t] >> (4 * hh)) & 0x0f0f0f0fu;

			if (Q5)
				v |= ((h[t] >> hh) & 0x01010101u) << 4;
			sum = gpu_dp4a((int)v, (int)x[t], sum);
		}
		r += dl[hh] * xs[hh].d * (float)sum - ml[hh] * xs[hh].s;
	}
	return r;
}

/*
 * A unit of a weight row is what one lane decodes at a time: a 32-value
 * block of q4_0 or q8_0, a pair of q4_K sub-blocks (64 values, one run
 * of 32 nibble bytes), a pair of q6_K sub-blocks (32 values). unit_dot<T> is its dot with activation row xq/xs
 * (values and scales from the unit's first value on), in f32.
 */
template <uint32_t T> struct unit;

template <> struct unit<LOOM_TYPE_Q8_0> {
	static constexpr int values = 32;
	float d;
	uint32_t q[8];

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + u * 34;

		d = half_to_f32(ld16(b));
		ld_words(b + 2, 8, q);
	}

	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		const int sum = dot_bytes32(q, xq);

		return d * xs[0].d * (float)sum;
	}
};

template <> struct unit<LOOM_TYPE_Q4_0> {
	static constexpr int values = 32;
	float d;
	uint32_t q[4]; /* byte j: value j (low nibble), value j + 16 (high) */

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + u * 18;

		d = half_to_f32(ld16(b));
		ld_words(b + 2, 4, q);
	}

	/* value = d (q - 8): d (dx sum(q xq) - 8 dx sum(xq)) = d (dx sum - 8 s) */
	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		const int sum = dot_nibbles32(q, xq);

		return d * (xs[0].d * (float)sum - 8.0f * xs[0].s);
	}
};

template <> struct unit<LOOM_TYPE_Q4_K> {
	static constexpr int values = 64;
	float dl[2], ml[2]; /* d * scale and dmin * min of the two sub-blocks */
	uint32_t q[8];      /* byte j: value j (low nibble), value j + 32 (high) */

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + (u >> 2) * 144;
		const int pair = (int)(u & 3);

		k45_pair_scales(b, pair, dl, ml);
		ld_words(b + 16 + 32 * pair, 8, q);
	}

	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		return dot_k45<false>(q, NULL, dl, ml, xq, xs);
	}
};

template <> struct unit<LOOM_TYPE_Q6_K> {
	static constexpr int values = 32;
	float d;
	int sc[2];     /* the int8 scales of the two 16-value sub-blocks */
	uint32_t q[8]; /* byte j: value j, 0 .. 63 (the stored q, 32 too high) */

	/* unit u: values 32 (u%8) .. of super-block u/8; low nibbles at
	 * ql[64 (p/4) + 32 (p%2)], high half for odd p/2; top 2 bits at
	 * qh[32 (p/4)], shift 2 (p%4) (p = u%8, as deq_q6_K spells out) */
	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + (u >> 3) * 210;

		load_at(b, half_to_f32(ld16(b + 208)), (int)(u & 7));
	}

	/* unit p of super-block b (its ql, qh and scales as GGUF lays them
	 * out), d given apart (a packed row keeps it elsewhere) */
	__device__ __forceinline__ void load_at(const uint8_t *b, float dd, int p)
	{
		const int ls = 4 * ((p >> 1) & 1), hs = 2 * (p & 3);
		uint32_t lo[8], hi[8];

		ld_words(b + 64 * (p >> 2) + 32 * (p & 1), 8, lo);
		ld_words(b + 128 + 32 * (p >> 2), 8, hi);
		for (int t = 0; t < 8; t++)
			q[t] = ((lo[t] >> ls) & 0x0f0f0f0fu) | ((hi[t] >> hs) & 0x03030303u) << 4;
		d = dd;
		sc[0] = (int8_t)b[192 + 2 * p];
		sc[1] = (int8_t)b[193 + 2 * p];
	}

	/* value = d sc (q - 32): per sub-block sc (sum(q xq) - 32 sum(xq)),
	 * in integers, then d dx once */
	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		uint32_t x[8];
		int total = 0;

		ld_words((const uint8_t *)xq, 8, x);
		GPU_UNROLL
		for (int h = 0; h < 2; h++)
			total += sc[h] * (dot_words(q + 4 * h, x + 4 * h, 4, 0) -
					  32 * sum_words(x + 4 * h, 4, 0));
		return d * xs[0].d * (float)total;
	}
};

/* Bits 0 .. 3 of v to bit 4 of bytes 0 .. 3 (the fifth bit of four
 * 5-bit quants; the four shifted copies of v do not overlap). */
__device__ __forceinline__ uint32_t bit4_bytes(uint32_t v)
{
	return ((v & 15u) * 0x00204081u & 0x01010101u) << 4;
}

/* q4_1: value = d q + m, q 0 .. 15 in q4_0's nibble layout; the min
 * reaches the dot through the activation block's s = dx sum(xq). */
template <> struct unit<LOOM_TYPE_Q4_1> {
	static constexpr int values = 32;
	float d, m;
	uint32_t q[4]; /* byte j: value j (low nibble), value j + 16 (high) */

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + u * 20;

		d = half_to_f32(ld16(b));
		m = half_to_f32(ld16(b + 2));
		ld_words(b + 4, 4, q);
	}

	/* d dx sum(q xq) + m s */
	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		const int sum = dot_nibbles32(q, xq);

		return d * xs[0].d * (float)sum + m * xs[0].s;
	}
};

/* A q5_0/q5_1 block's 32 quants (0 .. 31) as bytes in value order: the
 * nibbles of qs (q4_0's layout) and bit j of qh for value j. */
__device__ __forceinline__ void q5_words(const uint8_t *qs, uint32_t qh, uint32_t q[8])
{
	uint32_t w[4];

	ld_words(qs, 4, w);
	for (int t = 0; t < 4; t++) {
		q[t] = (w[t] & 0x0f0f0f0fu) | bit4_bytes(qh >> (4 * t));
		q[t + 4] = ((w[t] >> 4) & 0x0f0f0f0fu) | bit4_bytes(qh >> (16 + 4 * t));
	}
}

/* Bytes 0 .. 31 to -16 .. 15, four at a time (no carries between bytes). */
__device__ __forceinline__ uint32_t q5_signed(uint32_t v)
{
	return (v + 0x70707070u) ^ 0x80808080u;
}

/* q5_0: value = d (q - 16), kept as signed bytes q - 16, so the dot is
 * one integer sum. */
template <> struct unit<LOOM_TYPE_Q5_0> {
	static constexpr int values = 32;
	float d;
	uint32_t q[8]; /* byte j: value j's q - 16 */

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + u * 22;

		d = half_to_f32(ld16(b));
		q5_words(b + 6, ld32(b + 2), q);
		for (int t = 0; t < 8; t++)
			q[t] = q5_signed(q[t]);
	}

	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		const int sum = dot_bytes32(q, xq);

		return d * xs[0].d * (float)sum;
	}
};

/* q5_1: value = d q + m, q 0 .. 31: d dx sum(q xq) + m s */
template <> struct unit<LOOM_TYPE_Q5_1> {
	static constexpr int values = 32;
	float d, m;
	uint32_t q[8]; /* byte j: value j's q */

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + u * 24;

		d = half_to_f32(ld16(b));
		m = half_to_f32(ld16(b + 2));
		q5_words(b + 8, ld32(b + 4), q);
	}

	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		const int sum = dot_bytes32(q, xq);

		return d * xs[0].d * (float)sum + m * xs[0].s;
	}
};

/* q5_K: q4_K's unit (a pair of sub-blocks, one run of 32 nibble bytes)
 * with the fifth bit of sub-block j in bit j of qh[l] (l: the value's
 * index in its sub-block). */
template <> struct unit<LOOM_TYPE_Q5_K> {
	static constexpr int values = 64;
	float dl[2], ml[2]; /* d * scale and dmin * min of the two sub-blocks */
	uint32_t q[8];      /* byte l: value l (low nibble), value l + 32 (high) */
	uint32_t h[8];      /* byte l: bit 0 value l's fifth bit, bit 1 value l + 32's */

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + (u >> 2) * 176;
		const int pair = (int)(u & 3);

		k45_pair_scales(b, pair, dl, ml);
		ld_words(b + 48 + 32 * pair, 8, q);
		ld_words(b + 16, 8, h);
		for (int t = 0; t < 8; t++)
			h[t] = (h[t] >> (2 * pair)) & 0x03030303u;
	}

	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		return dot_k45<true>(q, h, dl, ml, xq, xs);
	}
};

/* q3_K: a 32-value unit j (0 .. 7) of a super-block, two 16-value
 * sub-blocks with signed 6-bit scales; value = d sc (q - 4 + 4 hbit), q
 * the 2 bits of qs[32 (j/4) + l] at shift 2 (j%4), hbit bit j of
 * hmask[l] (as deq_q3_K spells out). Kept as signed bytes -4 .. 3. */
template <> struct unit<LOOM_TYPE_Q3_K> {
	static constexpr int values = 32;
	float d;
	int sc[2];
	uint32_t q[8]; /* byte l: value l's q - 4 + 4 hbit */

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + (u >> 3) * 110;
		const int j = (int)(u & 7), shift = 2 * (j & 3);
		uint32_t hm[8];

		ld_words(b + 32 + 32 * (j >> 2), 8, q);
		ld_words(b, 8, hm);
		for (int t = 0; t < 8; t++) {
			const uint32_t v = ((q[t] >> shift) & 0x03030303u) |
					   ((hm[t] >> j) & 0x01010101u) << 2;

			q[t] = (v + 0x7c7c7c7cu) ^ 0x80808080u; /* 0 .. 7 to -4 .. 3 */
		}
		d = half_to_f32(ld16(b + 108));
		sc[0] = q3_K_scale(b + 96, 2 * j);
		sc[1] = q3_K_scale(b + 96, 2 * j + 1);
	}

	/* per sub-block sc sum(q xq) in integers, then d dx once */
	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		uint32_t x[8];
		int total = 0;

		ld_words((const uint8_t *)xq, 8, x);
		GPU_UNROLL
		for (int hh = 0; hh < 2; hh++)
			total += sc[hh] * dot_words(q + 4 * hh, x + 4 * hh, 4, 0);
		return d * xs[0].d * (float)total;
	}
};

/* q2_K: a 32-value unit j (0 .. 7) of a super-block, two 16-value
 * sub-blocks with 4-bit scales and mins (byte 2j + h: scale low, min
 * high); value = d sc q - dmin m, q the 2 bits of qs[32 (j/4) + l] at
 * shift 2 (j%4). The min needs each sub-block's activation sum, so the
 * dot sums the activations per 16 values itself. */
template <> struct unit<LOOM_TYPE_Q2_K> {
	static constexpr int values = 32;
	float d, dmin;
	uint32_t sm;   /* the two scale/min bytes */
	uint32_t q[8]; /* byte l: value l's q, 0 .. 3 */

	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t)
	{
		const uint8_t *b = row + (u >> 3) * 84;
		const int j = (int)(u & 7), shift = 2 * (j & 3);

		ld_words(b + 16 + 32 * (j >> 2), 8, q);
		for (int t = 0; t < 8; t++)
			q[t] = (q[t] >> shift) & 0x03030303u;
		sm = ld16(b + 2 * j);
		d = half_to_f32(ld16(b + 80));
		dmin = half_to_f32(ld16(b + 82));
	}

	/* dx (d sum_h sc_h sum(q xq) - dmin sum_h m_h sum(xq)), the sums in
	 * integers */
	__device__ __forceinline__ float dot(const int8_t *xq, const struct q8_scale *xs) const
	{
		uint32_t x[8];
		int total = 0, mins = 0;

		ld_words((const uint8_t *)xq, 8, x);
		GPU_UNROLL
		for (int hh = 0; hh < 2; hh++) {
			const int s = (int)(sm >> (8 * hh)) & 0xff;

			total += (s & 15) * dot_words(q + 4 * hh, x + 4 * hh, 4, 0);
			mins += (s >> 4) * sum_words(x + 4 * hh, 4, 0);
		}
		return xs[0].d * (d * (float)total - dmin * (float)mins);
	}
};

/* The packed layouts (gpu_rt.h): the same values and the same dot as
 * the GGUF layout's unit, the quants by 128-bit loads. */
template <> struct unit<GPU_Q8_0P> : unit<LOOM_TYPE_Q8_0> {
	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t k)
	{
		d = pk_scale<GPU_Q8_0P>(row, u, k);
		ld_words16(pk_quants<GPU_Q8_0P>(row, u), 8, q);
	}
};

template <> struct unit<GPU_Q4_0P> : unit<LOOM_TYPE_Q4_0> {
	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t k)
	{
		d = pk_scale<GPU_Q4_0P>(row, u, k);
		ld_words16(pk_quants<GPU_Q4_0P>(row, u), 4, q);
	}
};

/* q6_K packed: super-blocks of 208 bytes (16-byte aligned ql and qh) */
template <> struct unit<GPU_Q6_KP> : unit<LOOM_TYPE_Q6_K> {
	__device__ __forceinline__ void load(const uint8_t *row, int64_t u, int64_t k)
	{
		load_at(pk_quants<GPU_Q6_KP>(row, u >> 3), pk_scale<GPU_Q6_KP>(row, u >> 3, k),
			(int)(u & 7));
	}
};

__device__ __forceinline__ float act_silu(float g)
{
	return g / (1.0f + expf(-g));
}

__device__ __forceinline__ float act_gelu_tanh(float g)
{
	const float sqrt_2_over_pi = 0.79788456080286535588f;

	return 0.5f * g * (1.0f + tanhf(sqrt_2_over_pi * (g + 0.044715f * g * g * g)));
}

/* One GLU output of kind (enum loom_glu_kind): act(g) * u, or gpt-oss's
 * clamped SwiGLU of the pair (loom/moe.h's formula, ref.so's bits). */
__device__ __forceinline__ float glu_of(int kind, float g, float u)
{
	if (kind == LOOM_GLU_SWIGLU_OAI)
		return loom_glu_swiglu_oai(g, u);
	return (kind == LOOM_GLU_SILU ? act_silu(g) : act_gelu_tanh(g)) * u;
}

/* ---- GEMV groups: every GEMV, exact and fast ---- */

/*
 * A GEMV runs as a group of up to GPURT_GROUP_MAX members that read the
 * same activation rows, in one launch whose blocks are the members'
 * blocks one after the other: one member for a lone gemm, a layer's q, k
 * and v or its gate and up in a step region (gpu_fuse.c). One warp per
 * weight row, GEMV_ROWS rows a block, MB activation rows a pass: lane l
 * decodes parts (exact) or units (fast) l, l + GPU_WARP, ... of the row
 * once a pass and dots each with every activation row of the pass, so up
 * to MB rows (a decode batch) read each weight block once; the lane sums
 * meet in a fixed shuffle tree. y[i][j] is computed the same way whatever
 * the group, m or MB (batch invariance): its own accumulator, the same
 * parts in the same order. So a group gives the bits of its members run
 * one by one, and its epilogue those of the add or GLU that follows them:
 * y first, then the member's add (out = y + other, in the add's operand
 * order) or, for a gate and up pair, the GLU of the two values just
 * written.
 */
struct group_p {
	struct gpurt_gemv_member mem[GPURT_GROUP_MAX];
	int64_t first_block[GPURT_GROUP_MAX + 1];
	int n_members, glu;
	float *glu_out;
	int64_t glu_stride;
	const float *x; /* exact: f32 activations */
	int64_t x_stride, m, k, parts;
	const int8_t *xq; /* fast: 8-bit activations (m x k) and their scales */
	const struct q8_scale *xs;
};

/* Activation rows i0, i0 + 1, ... of a GEMV pass. */
struct seq_rows {
	const float *x;
	int64_t stride, i0;
	__device__ __forceinline__ const float *operator()(int ii) const
	{
		return x + (i0 + ii) * stride;
	}
};

/* Exact: acc[ii] += row . xrow(ii) in f32 over k values (parts parts),
 * dequantized as ref.so. The GEMV groups and the routed experts' GEMV
 * share it, so an expert product has a lone gemm's bits. */
template <uint32_t T, int MB, typename XRow>
__device__ __forceinline__ void dots_rows(const uint8_t *row, int64_t parts, int64_t k,
					  const XRow &xrow, int mb, float *acc)
{
	for (int64_t q = threadIdx.x % GPU_WARP; q < parts; q += GPU_WARP) {
		float v[8];

		deq_part<T>(row, q, k, v);
		GPU_UNROLL
		for (int ii = 0; ii < MB; ii++) {
			if (ii >= mb)
				continue;
			const float *x = xrow(ii);

			for (int e = 0; e < 8; e++) {
				int64_t idx = part_index<T>(q, e);

				if (in_row<T>(idx, k))
					acc[ii] += v[e] * x[idx];
			}
		}
	}
}

template <uint32_t T, int MB>
__device__ __forceinline__ void dots_f32(const uint8_t *row, const struct group_p &p, int64_t i0,
					 int mb, float *acc)
{
	dots_rows<T, MB>(row, p.parts, p.k, seq_rows{ p.x, p.x_stride, i0 }, mb, acc);
}

/* Activation row indices i0, i0 + 1, ... of a pass. */
struct seq_index {
	int64_t i0;
	__device__ __forceinline__ int64_t operator()(int ii) const
	{
		return i0 + ii;
	}
};

/* Fast: acc[ii] += row . activation row xi(ii), from the 8-bit
 * activations (xq, xs: rows of k), unit by unit. Shared like dots_rows. */
template <uint32_t T, int MB, typename XIndex>
__device__ __forceinline__ void dots_q8_rows(const uint8_t *row, int64_t k, const int8_t *xq,
					     const struct q8_scale *xs, const XIndex &xi, int mb,
					     float *acc)
{
	const int64_t units = k / unit<T>::values, blocks = k / Q8_BLOCK;

	for (int64_t u = threadIdx.x % GPU_WARP; u < units; u += GPU_WARP) {
		const int64_t v0 = u * unit<T>::values;
		unit<T> w;

		w.load(row, u, k);
		GPU_UNROLL /* acc stays in registers: a fixed trip count, no break */
		for (int ii = 0; ii < MB; ii++) {
			if (ii < mb) {
				const int64_t i = xi(ii);

				acc[ii] += w.dot(xq + i * k + v0, xs + i * blocks + v0 / Q8_BLOCK);
			}
		}
	}
}

template <uint32_t T, int MB>
__device__ __forceinline__ void dots_q8(const uint8_t *row, const struct group_p &p, int64_t i0,
					int mb, float *acc)
{
	dots_q8_rows<T, MB>(row, p.k, p.xq, p.xs, seq_index{ i0 }, mb, acc);
}

template <uint32_t T, int MB, bool Q8>
__device__ __forceinline__ void row_dots(const struct gpurt_gemv_member &w, int64_t j,
					 const struct group_p &p, int64_t i0, int mb, float *acc)
{
	const uint8_t *row = (const uint8_t *)w.w + j * w.w_stride;

	if constexpr (Q8)
		dots_q8<T, MB>(row, p, i0, mb, acc);
	else
		dots_f32<T, MB>(row, p, i0, mb, acc);
}

/* Lane 0's epilogue of member w: y, then its add. other is read before
 * anything is written (out may be other: x += y). */
__device__ __forceinline__ void put_y(const struct gpurt_gemv_member &w, int64_t i, int64_t j,
				      float s)
{
	const float o = w.other ? w.other[i * w.other_stride + j] : 0.0f;

	w.y[i * w.y_stride + j] = s;
	if (w.other)
		w.out[i * w.out_stride + j] = w.y_first ? s + o : o + s;
}

/* A gate and up pair's epilogue: both outputs, then the GLU of them. */
__device__ __forceinline__ void put_glu(const struct group_p &p, int64_t i, int64_t j, float g,
					float u)
{
	p.mem[0].y[i * p.mem[0].y_stride + j] = g;
	p.mem[1].y[i * p.mem[1].y_stride + j] = u;
	p.glu_out[i * p.glu_stride + j] = glu_of(p.glu, g, u);
}

template <uint32_t T, int MB, bool Q8, bool GLU>
__global__ void __launch_bounds__(THREADS) k_gemv_group(const struct group_p p)
{
	const int lane = threadIdx.x % GPU_WARP, nw = blockDim.x / GPU_WARP;
	int g = 0;

	while (g + 1 < p.n_members && (int64_t)blockIdx.x >= p.first_block[g + 1])
		g++;
	for (int r = threadIdx.x / GPU_WARP; r < GEMV_ROWS; r += nw) {
		const int64_t j = ((int64_t)blockIdx.x - p.first_block[g]) * GEMV_ROWS + r;

		if (j >= p.mem[g].n)
			return; /* later r only go further */
		for (int64_t i0 = 0; i0 < p.m; i0 += MB) {
			const int mb = p.m - i0 < MB ? (int)(p.m - i0) : MB;
			float acc[MB] = { 0.0f }, up[GLU ? MB : 1] = { 0.0f };

			row_dots<T, MB, Q8>(p.mem[g], j, p, i0, mb, acc);
			if constexpr (GLU)
				row_dots<T, MB, Q8>(p.mem[1], j, p, i0, mb, up);
			for (int ii = 0; ii < MB; ii++) {
				float s, u = 0.0f;

				if (ii >= mb) /* the same for the whole warp */
					break;
				s = warp_sum(acc[ii]);
				if constexpr (GLU)
					u = warp_sum(up[ii]);
				if (lane == 0 && GLU)
					put_glu(p, i0 + ii, j, s, u);
				else if (lane == 0)
					put_y(p.mem[g], i0 + ii, j, s);
			}
		}
	}
}

/* The smallest pass that holds m rows: exact 4 or GEMV_MB (fewer
 * registers for small m), fast 1, 2, 4, 8 or GEMV_MB. */
template <uint32_t T, bool Q8, bool GLU>
static void launch_group_glu(unsigned blocks, gpuStream_t s, const struct group_p p)
{
	void (*kernel)(const struct group_p);

	if constexpr (Q8)
		kernel = p.m <= 1 ? k_gemv_group<T, 1, true, GLU> :
			 p.m <= 2 ? k_gemv_group<T, 2, true, GLU> :
			 p.m <= 4 ? k_gemv_group<T, 4, true, GLU> :
			 p.m <= 8 ? k_gemv_group<T, 8, true, GLU> :
				    k_gemv_group<T, GEMV_MB, true, GLU>;
	else
		kernel = p.m <= 4 ? k_gemv_group<T, 4, false, GLU> :
				    k_gemv_group<T, GEMV_MB, false, GLU>;
	GPU_LAUNCH(kernel, blocks, THREADS, 0, s, p);
}

template <uint32_t T, bool Q8>
static void launch_group(unsigned blocks, gpuStream_t s, const struct group_p p)
{
	if (p.glu >= 0)
		launch_group_glu<T, Q8, true>(blocks, s, p);
	else
		launch_group_glu<T, Q8, false>(blocks, s, p);
}

template <uint32_t T>
static void launch_group_f32(unsigned blocks, gpuStream_t s, const struct group_p p)
{
	launch_group<T, false>(blocks, s, p);
}

template <uint32_t T>
static void launch_group_q8(unsigned blocks, gpuStream_t s, const struct group_p p)
{
	launch_group<T, true>(blocks, s, p);
}

typedef void (*group_launch)(unsigned, gpuStream_t, const struct group_p);

/* The launcher for weights of type t: exact (every format) or fast (the
 * formats with integer units). */
static group_launch group_for(uint32_t t, bool q8)
{
	if (q8) {
		switch (t) {
#define FORMAT_FN launch_group_q8
			GPU_Q8_FORMATS(FORMAT_CASE)
#undef FORMAT_FN
		default:
			return NULL;
		}
	}
	switch (t) {
#define FORMAT_FN launch_group_f32
		GPU_FORMATS(FORMAT_CASE)
#undef FORMAT_FN
	default:
		return NULL;
	}
}

extern "C" int gpurt_gemv_group(struct gpurt *rt, const struct gpurt_gemv_group *g,
				const int8_t *qs, const void *scale)
{
	struct group_p p;
	group_launch launch = group_for(g->type, qs != NULL);
	int members = g->glu >= 0 ? 1 : g->n_members; /* a GLU pair: the gate's blocks */

	BIND(rt);
	if (!launch)
		return unknown_format(rt, qs ? "gemm (8-bit activations)" : "gemm", g->type);
	if (g->n_members < 1 || g->n_members > GPURT_GROUP_MAX ||
	    (g->glu >= 0 && (g->n_members != 2 || g->mem[0].n != g->mem[1].n))) {
		snprintf(rt->err, sizeof(rt->err), "gemv group: bad shape (%d members, glu %d)",
			 g->n_members, g->glu);
		return LOOM_ERR_INVALID;
	}
	memset(&p, 0, sizeof(p));
	p.first_block[0] = 0;
	for (int i = 0; i < g->n_members; i++) {
		p.mem[i] = g->mem[i];
		if (i < members)
			p.first_block[i + 1] = p.first_block[i] + (g->mem[i].n + GEMV_ROWS - 1) / GEMV_ROWS;
	}
	if (p.first_block[members] > INT32_MAX) {
		snprintf(rt->err, sizeof(rt->err), "gemm: n %lld too large", (long long)g->mem[0].n);
		return LOOM_ERR_UNSUPPORTED;
	}
	p.n_members = members;
	p.glu = g->glu;
	p.glu_out = g->glu_out;
	p.glu_stride = g->glu_stride;
	p.x = g->x;
	p.x_stride = g->x_stride;
	p.m = g->m;
	p.k = g->k;
	p.parts = parts_of(g->type, g->k);
	p.xq = qs;
	p.xs = (const struct q8_scale *)scale;
	if (p.first_block[members] > 0)
		launch((unsigned)p.first_block[members], rt->stream, p);
	return launched(rt, qs ? "gemv (8-bit activations) kernel" : "gemv kernel");
}

/* A lone gemm: a group of one member. */
static struct gpurt_gemv_group group_of_one(const struct loom_gemm_args *a)
{
	struct gpurt_gemv_group g;

	memset(&g, 0, sizeof(g));
	g.type = a->w_type;
	g.n_members = 1;
	g.glu = -1;
	g.m = a->m, g.k = a->k;
	g.x = a->x, g.x_stride = a->x_stride;
	g.mem[0].w = a->w, g.mem[0].w_stride = a->w_stride, g.mem[0].n = a->n;
	g.mem[0].y = a->y, g.mem[0].y_stride = a->y_stride;
	return g;
}

extern "C" int gpurt_gemv(struct gpurt *rt, const struct loom_gemm_args *a)
{
	struct gpurt_gemv_group g = group_of_one(a);

	return gpurt_gemv_group(rt, &g, NULL, NULL);
}

extern "C" int gpurt_gemv_q8(struct gpurt *rt, const struct loom_gemm_args *a, const int8_t *qs,
			     const void *scale)
{
	struct gpurt_gemv_group g = group_of_one(a);

	return gpurt_gemv_group(rt, &g, qs, scale);
}

/* ---- greedy choice on the device ---- */

/* Value v at index i ranks before (bv, bi): larger, or as large and a
 * lower index. NaN ranks as -inf. */
__device__ __forceinline__ bool ranks_before(float v, int32_t i, float bv, int32_t bi)
{
	return v > bv || (v == bv && i < bi);
}

/* Row's largest value (NaN as -inf) into *best and the lowest index
 * holding it, as the host's greedy sampler picks: each thread keeps its
 * best of a strided run, then a fixed shared-memory tree picks the
 * block's. Every thread of the block calls it and gets the same answer;
 * bv and bi (THREADS each, shared) are free again when it returns. */
__device__ int32_t block_argmax(const float *row, int64_t n, float *bv, int32_t *bi,
				float *best_out)
{
	const int t = threadIdx.x;
	float best = -INFINITY;
	int32_t at = INT32_MAX;

	for (int64_t i = t; i < n; i += THREADS) {
		const float v = isnan(row[i]) ? -INFINITY : row[i];

		if (ranks_before(v, (int32_t)i, best, at))
			best = v, at = (int32_t)i;
	}
	bv[t] = best;
	bi[t] = at;
	__syncthreads();
	for (int half = THREADS / 2; half > 0; half /= 2) {
		if (t < half && ranks_before(bv[t + half], bi[t + half], bv[t], bi[t])) {
			bv[t] = bv[t + half];
			bi[t] = bi[t + half];
		}
		__syncthreads();
	}
	at = bi[0];
	*best_out = bv[0];
	__syncthreads(); /* bv, bi are rewritten by the next call */
	return at;
}

/* One block a row. */
__global__ void __launch_bounds__(THREADS)
k_argmax(const float *x, int64_t stride, int64_t rows, int64_t n, int32_t *ids)
{
	__shared__ float bv[THREADS];
	__shared__ int32_t bi[THREADS];

	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		float best;
		const int32_t at = block_argmax(x + r * stride, n, bv, bi, &best);

		if (threadIdx.x == 0)
			ids[r] = at;
	}
}

extern "C" int gpurt_argmax(struct gpurt *rt, int32_t *ids, const float *x, int64_t stride,
			    int64_t rows, int64_t n)
{
	BIND(rt);
	GPU_LAUNCH(k_argmax, grid_of(rows), THREADS, 0, rt->stream, x, stride, rows, n, ids);
	return launched(rt, "argmax kernel");
}

/* ---- sampling on the device (ABI 1.8) ---- */

/*
 * One block a row, the rule of struct loom_sample_args (the host sampler's):
 * penalties in place, the greedy choice as k_argmax, then for a draw the
 * top_k keys found by a radix select (8 passes of 8 bits over 64-bit keys:
 * the logit's order-preserving bits above the complemented index, so keys
 * are distinct and a larger key ranks first), gathered, sorted by a
 * bitonic network, weighted in parallel, and cut and drawn by one thread
 * in rank order with the host's double sums, so the draw is the host's.
 */
static_assert(THREADS == 256, "one radix bin a thread");

__device__ __forceinline__ uint32_t rank_bits(float l)
{
	uint32_t u;

	if (isnan(l))
		l = -INFINITY;
	if (l == 0.0f)
		l = 0.0f; /* -0 ranks as +0 */
	u = __float_as_uint(l);
	return u & 0x80000000u ? ~u : u | 0x80000000u;
}

__device__ __forceinline__ float rank_value(uint32_t r)
{
	return __uint_as_float(r & 0x80000000u ? r & 0x7fffffffu : ~r);
}

__device__ __forceinline__ uint64_t rank_key(const float *row, int32_t i)
{
	return (uint64_t)rank_bits(row[i]) << 32 | (uint32_t)~(uint32_t)i;
}

__device__ __forceinline__ uint64_t rng_next(uint64_t s[4])
{
	const uint64_t out = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = s[3] << 45 | s[3] >> 19;
	return out;
}

/* x[tok] as the host sampler penalizes it, each operation rounded; the
 * values before into raw (when not NULL). */
__device__ void sample_penalize(float *row, const struct loom_sample_row &P, const int32_t *tok,
				const int32_t *cnt, float *raw)
{
	for (int j = threadIdx.x; j < P.pen_count; j += blockDim.x) {
		const int32_t t = tok[P.pen_first + j];
		float l = row[t];

		if (raw)
			raw[P.pen_first + j] = l;
		l = l > 0.0f ? l / P.repeat_penalty : mul_rn(l, P.repeat_penalty);
		l = l - P.presence_penalty;
		l = l - mul_rn(P.frequency_penalty, (float)cnt[P.pen_first + j]);
		row[t] = l;
	}
}

/* The k-th largest key of row[0..n): 8 radix passes, most significant
 * byte first, counting only keys that match the digits found so far. */
__device__ uint64_t sample_kth(const float *row, int32_t n, int32_t k, uint32_t *hist,
			       uint64_t *found, int32_t *need_sh)
{
	uint64_t prefix = 0, mask = 0;
	int32_t need = k;

	for (int shift = 56; shift >= 0; shift -= 8) {
		__syncthreads(); /* hist and found read by everyone */
		hist[threadIdx.x] = 0;
		__syncthreads();
		for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
			const uint64_t c = rank_key(row, i);

			if ((c & mask) == prefix)
				atomicAdd(&hist[(c >> shift) & 0xff], 1u);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			int32_t above = 0, d = 255;

			while (d > 0 && above + (int32_t)hist[d] < need)
				above += (int32_t)hist[d--];
			*found = prefix | (uint64_t)d << shift;
			*need_sh = need - above;
		}
		__syncthreads();
		prefix = *found;
		need = *need_sh;
		mask |= (uint64_t)0xff << shift;
	}
	return prefix;
}

/* keys[0..p2) into descending order (p2 a power of two). */
__device__ void sample_sort(uint64_t *keys, int32_t p2)
{
	for (int32_t size = 2; size <= p2; size <<= 1)
		for (int32_t half = size / 2; half > 0; half >>= 1) {
			for (int32_t i = threadIdx.x; i < p2; i += blockDim.x) {
				const int32_t j = i ^ half;
				const bool desc = (i & size) == 0;

				if (j > i && (keys[i] < keys[j]) == desc) {
					const uint64_t t = keys[i];

					keys[i] = keys[j];
					keys[j] = t;
				}
			}
			__syncthreads();
		}
}

/* Top-p, min-p and the draw over the weights in rank order: one thread,
 * the host sampler's loops (cut_ranked, draw). Returns the rank. */
__device__ int32_t sample_draw(const struct loom_sample_row &P, const double *w, int32_t k)
{
	uint64_t s[4] = { P.rng[0], P.rng[1], P.rng[2], P.rng[3] };
	double z = 0.0, total = 0.0, target, cum = 0.0;
	int32_t keep = k, last = 0;

	for (int32_t j = 0; j < k; j++)
		z += w[j];
	if (P.top_p < 1.0f) {
		const double need = (double)P.top_p * z;

		for (int32_t j = 0; j < k; j++) {
			cum += w[j];
			if (cum >= need) {
				keep = j + 1;
				break;
			}
		}
	}
	if (P.min_p > 0.0f) {
		int32_t j = 1;

		while (j < keep && w[j] >= (double)P.min_p)
			j++;
		keep = j;
	}
	for (int32_t j = 0; j < keep; j++)
		total += w[j];
	target = (double)(rng_next(s) >> 11) * 0x1.0p-53 * total;
	cum = 0.0;
	for (int32_t j = 0; j < keep; j++) {
		if (w[j] <= 0.0)
			continue;
		cum += w[j];
		last = j;
		if (target < cum)
			return j;
	}
	return last;
}

/* ---- generation 1.9: without top-k, and logprobs ----
 * Integer masses (q = w * 2^40, truncated) are summed with 64-bit atomics
 * and per-thread partials: exact, so in any order the host's sums. */
static_assert(THREADS == LOOM_SAMPLE_LANES, "one log-sum-exp lane a thread");

typedef unsigned long long mass_t;

__device__ __forceinline__ mass_t mass_of(double w)
{
	return (mass_t)(w * (double)(1ull << LOOM_SAMPLE_MASS_BITS));
}

/* (a * b) >> 53 for a < 2^53, in 64-bit halves (exact). */
__device__ __forceinline__ mass_t mul_shift53(mass_t a, mass_t b)
{
	const mass_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
	const mass_t lo = a0 * b0, mid1 = a1 * b0, mid2 = a0 * b1;
	const mass_t mid = (lo >> 32) + (mid1 & 0xffffffffu) + (mid2 & 0xffffffffu);
	const mass_t hi = a1 * b1 + (mid1 >> 32) + (mid2 >> 32) + (mid >> 32);

	return hi << 11 | ((mid << 32) | (lo & 0xffffffffu)) >> 53;
}

/* The shared state of one row's full-vocabulary draw. */
struct sample_full {
	double inv_t, floor_w;
	float mx;
};

__device__ __forceinline__ double full_weight(const struct sample_full &F, float l)
{
	return exp(((double)(isnan(l) ? -INFINITY : l) - (double)F.mx) * F.inv_t);
}

/* Block sum of per-thread masses (every thread gets it). */
__device__ mass_t block_mass(mass_t mine, mass_t *part)
{
	mass_t total = 0;

	part[threadIdx.x] = mine;
	__syncthreads();
	for (int j = 0; j < THREADS; j++)
		total += part[j];
	__syncthreads();
	return total;
}

/* The smallest key T such that the F tokens (weight >= floor) with key >=
 * T hold at least `need` mass (they hold that much in all): 8 radix passes
 * over mass histograms, as sample_kth over counts. */
__device__ uint64_t full_threshold(const float *row, int32_t n, const struct sample_full &F,
				   mass_t need, mass_t *mhist, uint64_t *found, mass_t *need_sh)
{
	uint64_t prefix = 0, mask = 0;

	for (int shift = 56; shift >= 0; shift -= 8) {
		__syncthreads();
		mhist[threadIdx.x] = 0;
		__syncthreads();
		for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
			const uint64_t c = rank_key(row, i);
			double w;

			if ((c & mask) != prefix)
				continue;
			w = full_weight(F, row[i]);
			if (w >= F.floor_w)
				atomicAdd(&mhist[(c >> shift) & 0xff], mass_of(w));
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			mass_t above = 0;
			int d = 255;

			while (d > 0 && above + mhist[d] < need)
				above += mhist[d--];
			*found = prefix | (uint64_t)d << shift;
			*need_sh = need - above;
		}
		__syncthreads();
		prefix = *found;
		need = *need_sh;
		mask |= (uint64_t)0xff << shift;
	}
	return prefix;
}

/* Token i's mass when it is kept (weight >= floor, key >= T), else 0. */
__device__ __forceinline__ mass_t kept_mass(const float *row, int32_t i,
					    const struct sample_full &F, uint64_t T)
{
	double w;

	if (rank_key(row, i) < T)
		return 0;
	w = full_weight(F, row[i]);
	return w >= F.floor_w ? mass_of(w) : 0;
}

/* The draw over the kept tokens in id order: each thread sums a run of
 * ids, thread 0 finds the run and the token. Returns it on thread 0. */
__device__ int32_t full_draw(const float *row, int32_t n, const struct sample_full &F, uint64_t T,
			     const struct loom_sample_row &P, mass_t *part)
{
	const int32_t run = (n + THREADS - 1) / THREADS;
	const int32_t lo = threadIdx.x * run, hi = lo + run < n ? lo + run : n;
	uint64_t s[4] = { P.rng[0], P.rng[1], P.rng[2], P.rng[3] };
	mass_t mine = 0, total, target, cum = 0;
	int c = 0;

	for (int32_t i = lo; i < hi; i++)
		mine += kept_mass(row, i, F, T);
	total = block_mass(mine, part);
	part[threadIdx.x] = mine;
	__syncthreads();
	if (threadIdx.x != 0)
		return -1;
	target = mul_shift53(rng_next(s) >> 11, total);
	while (c < THREADS - 1 && cum + part[c] <= target)
		cum += part[c++];
	for (int32_t i = c * run; i < n; i++) {
		cum += kept_mass(row, i, F, T);
		if (target < cum)
			return i;
	}
	return 0; /* total 0: cannot happen (the top token's mass is 2^40) */
}

/* A row without top-k (generation 1.9): F, the top-p cut T over it, the
 * draw. Every thread calls it; thread 0 gets the token. */
__device__ int32_t sample_full_row(const float *row, int32_t n, const struct loom_sample_row &P,
				   float mx, mass_t *part, mass_t *mhist, uint64_t *found,
				   mass_t *need_sh)
{
	struct sample_full F;
	mass_t all = 0, in_f = 0, need;
	uint64_t T = 0;

	F.inv_t = 1.0 / (double)P.temp;
	F.floor_w = P.min_p > 0.0f ? (double)P.min_p : 0.0;
	F.mx = mx;
	for (int32_t i = threadIdx.x; i < n; i += THREADS) {
		const double w = full_weight(F, row[i]);

		all += mass_of(w);
		if (w >= F.floor_w)
			in_f += mass_of(w);
	}
	all = block_mass(all, part);
	in_f = block_mass(in_f, part);
	if (P.top_p < 1.0f) {
		need = (mass_t)((double)P.top_p * (double)all);
		need = need ? need : 1;
		if (in_f >= need) /* else all of F */
			T = full_threshold(row, n, F, need, mhist, found, need_sh);
	}
	return full_draw(row, n, F, T, P, part);
}

/* log(sum(exp(row))) as loom_logprob_lse: lane t is thread t. */
__device__ double sample_lse(const float *row, int32_t n, float mx, double *lane)
{
	double acc = 0.0, sum = 0.0;

	if (!isfinite(mx))
		return mx;
	for (int32_t i = threadIdx.x; i < n; i += THREADS)
		acc += exp((double)row[i] - (double)mx);
	lane[threadIdx.x] = acc;
	__syncthreads();
	for (int j = 0; j < THREADS; j++)
		sum += lane[j];
	__syncthreads();
	return (double)mx + log(sum);
}

/* The keys of the row's k best (0 < k <= n) into keys[0 .. k) in rank
 * order: the k-th key by sample_kth, the keys at or above it gathered,
 * padded with zeros (below every real key) to a power of two and
 * sorted. Every thread calls it. */
__device__ void sample_top_keys(const float *row, int32_t n, int32_t k, uint64_t *keys,
				uint32_t *hist, uint64_t *found, int32_t *need_sh,
				uint32_t *n_keys)
{
	int32_t p2 = 1;
	uint64_t kth = sample_kth(row, n, k, hist, found, need_sh);

	if (threadIdx.x == 0)
		*n_keys = 0;
	__syncthreads();
	for (int32_t i = threadIdx.x; i < n; i += THREADS) {
		const uint64_t c = rank_key(row, i);

		if (c >= kth)
			keys[atomicAdd(n_keys, 1u)] = c;
	}
	while (p2 < k)
		p2 <<= 1;
	for (int32_t i = k + threadIdx.x; i < p2; i += THREADS)
		keys[i] = 0;
	__syncthreads();
	sample_sort(keys, p2);
}

/* The k best of the row in rank order into lp[1..k] ({-1, NaN} past n),
 * as loom_logprob_top. */
__device__ void sample_top_lp(const float *row, int32_t n, int32_t k, double lse,
			      struct loom_sample_logprob *lp, uint64_t *keys, uint32_t *hist,
			      uint64_t *found, int32_t *need_sh, uint32_t *n_keys)
{
	const int32_t kk = k < n ? k : n;

	sample_top_keys(row, n, kk, keys, hist, found, need_sh, n_keys);
	for (int32_t j = threadIdx.x; j < k; j += THREADS) {
		const int32_t id = j < kk ? (int32_t)~(uint32_t)keys[j] : -1;

		lp[1 + j].token = id;
		lp[1 + j].logprob = id < 0 ? NAN : (float)((double)row[id] - lse);
	}
	__syncthreads();
}

/* The chosen token's value before the penalties (pen_raw holds the
 * penalized ones'). One thread. */
__device__ float raw_value(const float *row, int32_t tok, const struct loom_sample_row &P,
			   const int32_t *pen_tok, const float *pen_raw)
{
	for (int32_t j = 0; j < P.pen_count; j++)
		if (pen_tok[P.pen_first + j] == tok)
			return pen_raw[P.pen_first + j];
	return row[tok];
}

/* The top_k draw of a row (0 < top_k <= LOOM_SAMPLE_MAX_TOP_K, < n):
 * every thread calls it, thread 0 gets the token. */
__device__ int32_t sample_topk_row(const float *row, int32_t n, const struct loom_sample_row &P,
				   float mx, uint64_t *keys, double *w, uint32_t *hist,
				   uint64_t *found, int32_t *need_sh, uint32_t *n_keys)
{
	const int32_t k = P.top_k;
	int32_t tok = -1;
	double inv_t;

	sample_top_keys(row, n, k, keys, hist, found, need_sh, n_keys);
	inv_t = 1.0 / (double)P.temp;
	for (int32_t j = threadIdx.x; j < k; j += THREADS)
		w[j] = exp(((double)rank_value((uint32_t)(keys[j] >> 32)) - (double)mx) * inv_t);
	__syncthreads();
	if (threadIdx.x == 0)
		tok = (int32_t)~(uint32_t)keys[sample_draw(P, w, k)];
	__syncthreads(); /* keys, w are rewritten for the next row */
	return tok;
}

__global__ void __launch_bounds__(THREADS)
k_sample(float *x, int64_t stride, int64_t rows, int32_t n, const struct loom_sample_row *params,
	 const int32_t *pen_tok, const int32_t *pen_cnt, int32_t *out,
	 struct loom_sample_logprob *lp_out, int64_t lp_stride, float *pen_raw)
{
	__shared__ float bv[THREADS];
	__shared__ int32_t bi[THREADS];
	__shared__ uint32_t hist[256], n_keys;
	__shared__ uint64_t keys[LOOM_SAMPLE_MAX_TOP_K], found;
	__shared__ double w[LOOM_SAMPLE_MAX_TOP_K];
	__shared__ mass_t part[THREADS], mhist[256], need_m;
	__shared__ int32_t need_sh;
	const int t = threadIdx.x;

	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const struct loom_sample_row P = params[r];
		const int32_t m = lp_out ? P.logprobs : 0, k = P.top_k;
		struct loom_sample_logprob *lp = lp_out ? lp_out + r * lp_stride : NULL;
		float *row = x + r * stride;
		float mx;
		double lse = 0.0;
		int32_t tok;
		bool drew = false;

		if (m > 0) { /* before the penalties: the model's own distribution */
			block_argmax(row, n, bv, bi, &mx);
			lse = sample_lse(row, n, mx, w);
			if (m > 1)
				sample_top_lp(row, n, m - 1, lse, lp, keys, hist, &found, &need_sh,
					      &n_keys);
		}
		sample_penalize(row, P, pen_tok, pen_cnt, m > 0 ? pen_raw : NULL);
		__syncthreads();
		tok = block_argmax(row, n, bv, bi, &mx);
		if (P.temp <= 0.0f || !isfinite(mx)) {
			/* greedy: tok */
		} else if (k <= 0 || k >= n) { /* the same for the whole block */
			tok = sample_full_row(row, n, P, mx, part, mhist, &found, &need_m);
			drew = true;
		} else if (k <= LOOM_SAMPLE_MAX_TOP_K) {
			tok = sample_topk_row(row, n, P, mx, keys, w, hist, &found, &need_sh, &n_keys);
			drew = true;
		} else {
			tok = -1;
		}
		if (t == 0) {
			out[2 * r] = tok;
			out[2 * r + 1] = drew;
			if (m > 0 && tok >= 0)
				lp[0] = (struct loom_sample_logprob){ tok, (float)((double)raw_value(
					row, tok, P, pen_tok, pen_raw) - lse) };
			else if (m > 0)
				lp[0] = (struct loom_sample_logprob){ -1, NAN };
		}
		__syncthreads();
	}
}

extern "C" int gpurt_sample(struct gpurt *rt, const struct loom_sample_args *a)
{
	const bool has_lp = LOOM_SAMPLE_HAS_LP(a) && a->lp;

	BIND(rt);
	GPU_LAUNCH(k_sample, grid_of(a->rows), THREADS, 0, rt->stream, a->x, a->stride, a->rows,
		(int32_t)a->n, a->params, a->pen_tokens, a->pen_counts, a->out,
		has_lp ? a->lp : NULL, has_lp ? a->lp_stride : 0, has_lp ? a->pen_raw : NULL);
	return launched(rt, "sample kernel");
}

/* ---- int8 tiled GEMM (fast mode, batches past the GEMV) ---- */

/*
 * Outside exact mode a GEMM of q4_0, q8_0, q4_K or q6_K weights with more
 * rows than a GEMV pass (GEMV_MB) reads its weights once per tile of
 * MMQ_M activation rows, never through a dequantized copy: a block of
 * THREADS threads computes MMQ_M x MMQ_N outputs, MMQ_KB 32-value blocks
 * of k at a time. Each step decodes MMQ_N weight rows' blocks to signed
 * bytes in shared memory (one block a thread) beside the same blocks of
 * the 8-bit activations. Then the integer dot products of each block,
 * by one of two inner products with the same integer results:
 *  - k_mmq: each thread dots 4 activation rows with 4 weight rows by dp4a;
 *  - k_mmq_mma (GPU_HAVE_MMA: CUDA sm_80+, the warp-32 emulator): each
 *    warp multiplies 16 activation rows by 32 weight rows on the int8
 *    tensor cores, one m16n8k32 MMA per 8 weight rows and block (two
 *    m16n8k16, one per 16-value half, for q6_K, whose halves have scales
 *    of their own).
 * Integer sums are exact, and both kernels turn them into floats by the
 * same function (mmq_add) in the same block order, so they give the same
 * bits. Not batch invariant (that mode keeps the GEMV).
 */
#define MMQ_M 64
#define MMQ_N 64
#define MMQ_KB 4
#define MMQ_W (MMQ_KB * 8 + 1) /* words a shared row, dp4a (+1: other banks) */
/* words a shared row, MMA: lanes 4g + t read word t of rows g (g < 8),
 * 36 g + t covers the 32 banks once */
#define MMQ_W_MMA (MMQ_KB * 8 + 4)
static_assert(MMQ_N * MMQ_KB == THREADS && MMQ_M * MMQ_KB == THREADS,
	      "one weight block and one activation block per thread and step");
static_assert(MMQ_M == 64 && MMQ_N == 64 && THREADS == 256,
	      "4 x 4 outputs a thread; 8 warps of 16 x 32 outputs (warps of 32)");

/* A 32-value block of a weight row as signed bytes q (value e in byte e
 * % 4 of word e / 4) and the factors that make its values: value e =
 * a[e / 16] q[e] - b. */
struct blk8 {
	uint32_t q[8];
	float a[2], b;
};

/* Bytes 0 .. 15 to -8 .. 7, four at a time (no carries between bytes). */
__device__ __forceinline__ uint32_t nib_signed(uint32_t v)
{
	return (v + 0x78787878u) ^ 0x80808080u;
}

/* Words w in q4_0's nibble layout (byte j: value j low, value j + 16
 * high) to 8 words of bytes 0 .. 15 in value order. */
__device__ __forceinline__ void split_nibbles(const uint32_t w[4], uint32_t q[8])
{
	for (int t = 0; t < 4; t++) {
		q[t] = w[t] & 0x0f0f0f0fu;
		q[t + 4] = (w[t] >> 4) & 0x0f0f0f0fu;
	}
}

/* A unit holding its 32 values as bytes in value order (q8_0, q5_0,
 * q5_1): one factor d for both halves, value = d q - b. */
__device__ __forceinline__ void dec32_bytes(const uint32_t q[8], float d, float b, blk8 *o)
{
	o->a[0] = o->a[1] = d;
	o->b = b;
	for (int t = 0; t < 8; t++)
		o->q[t] = q[t];
}

/* The sub-block factors of sub-block s of the q4_K or q5_K super-block
 * at b: a = d * scale, b = dmin * min. */
__device__ __forceinline__ void dec32_k45_factors(const uint8_t *b, int s, blk8 *o)
{
	int sc, m;

	k4_scale_min(b + 4, s, &sc, &m);
	o->a[0] = o->a[1] = half_to_f32(ld16(b)) * (float)sc;
	o->b = half_to_f32(ld16(b + 2)) * (float)m;
}

/* q8_0 and its packed layout: the unit's bytes as they are */
template <uint32_t T> __device__ __forceinline__ void dec32_q8(const uint8_t *row, int64_t blk,
							       int64_t k, blk8 *o)
{
	unit<T> u;

	u.load(row, blk, k);
	dec32_bytes(u.q, u.d, 0.0f, o);
}

/* q4_0 and its packed layout: byte j holds value j (low nibble) and
 * value j + 16 (high), value = d (q - 8) */
template <uint32_t T> __device__ __forceinline__ void dec32_q4(const uint8_t *row, int64_t blk,
							       int64_t k, blk8 *o)
{
	unit<T> u;

	u.load(row, blk, k);
	o->a[0] = o->a[1] = u.d;
	o->b = 0.0f;
	split_nibbles(u.q, o->q);
	for (int t = 0; t < 8; t++)
		o->q[t] = nib_signed(o->q[t]);
}

template <uint32_t T>
__device__ __forceinline__ void dec32(const uint8_t *row, int64_t blk, int64_t k, blk8 *o);

template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q8_0>(const uint8_t *row, int64_t blk, int64_t k,
						    blk8 *o)
{
	dec32_q8<LOOM_TYPE_Q8_0>(row, blk, k, o);
}

template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q4_0>(const uint8_t *row, int64_t blk, int64_t k,
						    blk8 *o)
{
	dec32_q4<LOOM_TYPE_Q4_0>(row, blk, k, o);
}

/* sub-block s of a super-block: nibbles of the 32 bytes of pair s / 2,
 * low for even s; value = d sc q - dmin m */
template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q4_K>(const uint8_t *row, int64_t blk, int64_t,
						    blk8 *o)
{
	const uint8_t *b = row + (blk >> 3) * 144;
	const int s = (int)(blk & 7), shift = 4 * (s & 1);
	uint32_t w[8];

	dec32_k45_factors(b, s, o);
	ld_words(b + 16 + 32 * (s >> 1), 8, w);
	for (int t = 0; t < 8; t++)
		o->q[t] = (w[t] >> shift) & 0x0f0f0f0fu;
}

/* q4_1: q4_0's nibbles as they are (0 .. 15), value = d q + m */
template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q4_1>(const uint8_t *row, int64_t blk, int64_t k,
						    blk8 *o)
{
	unit<LOOM_TYPE_Q4_1> u;

	u.load(row, blk, k);
	o->a[0] = o->a[1] = u.d;
	o->b = -u.m;
	split_nibbles(u.q, o->q);
}

/* q5_0 (q - 16 as signed bytes) and q5_1 (q, value = d q + m): their
 * units hold the 32 bytes in value order already */
template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q5_0>(const uint8_t *row, int64_t blk, int64_t k,
						    blk8 *o)
{
	unit<LOOM_TYPE_Q5_0> u;

	u.load(row, blk, k);
	dec32_bytes(u.q, u.d, 0.0f, o);
}

template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q5_1>(const uint8_t *row, int64_t blk, int64_t k,
						    blk8 *o)
{
	unit<LOOM_TYPE_Q5_1> u;

	u.load(row, blk, k);
	dec32_bytes(u.q, u.d, -u.m, o);
}

/* q5_K sub-block s: q4_K's nibbles with bit s of qh[l] as the fifth bit */
template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q5_K>(const uint8_t *row, int64_t blk, int64_t,
						    blk8 *o)
{
	const uint8_t *b = row + (blk >> 3) * 176;
	const int s = (int)(blk & 7), shift = 4 * (s & 1);
	uint32_t w[8], h[8];

	dec32_k45_factors(b, s, o);
	ld_words(b + 48 + 32 * (s >> 1), 8, w);
	ld_words(b + 16, 8, h);
	for (int t = 0; t < 8; t++)
		o->q[t] = ((w[t] >> shift) & 0x0f0f0f0fu) | ((h[t] >> s) & 0x01010101u) << 4;
}

/* q3_K: the unit's signed bytes, one factor per 16-value sub-block */
template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q3_K>(const uint8_t *row, int64_t blk, int64_t k,
						    blk8 *o)
{
	unit<LOOM_TYPE_Q3_K> u;

	u.load(row, blk, k);
	for (int t = 0; t < 8; t++)
		o->q[t] = u.q[t];
	o->a[0] = u.d * (float)u.sc[0];
	o->a[1] = u.d * (float)u.sc[1];
	o->b = 0.0f;
}

/* the q6_K unit is 32 values already; its bytes 0 .. 63 to -32 .. 31 */
template <uint32_t T> __device__ __forceinline__ void dec32_q6(const uint8_t *row, int64_t blk,
							       int64_t k, blk8 *o)
{
	unit<T> u;

	u.load(row, blk, k);
	for (int t = 0; t < 8; t++)
		o->q[t] = (u.q[t] + 0x60606060u) ^ 0x80808080u;
	o->a[0] = u.d * (float)u.sc[0];
	o->a[1] = u.d * (float)u.sc[1];
	o->b = 0.0f;
}

template <>
__device__ __forceinline__ void dec32<LOOM_TYPE_Q6_K>(const uint8_t *row, int64_t blk, int64_t k,
						    blk8 *o)
{
	dec32_q6<LOOM_TYPE_Q6_K>(row, blk, k, o);
}

template <>
__device__ __forceinline__ void dec32<GPU_Q6_KP>(const uint8_t *row, int64_t blk, int64_t k,
						 blk8 *o)
{
	dec32_q6<GPU_Q6_KP>(row, blk, k, o);
}

/* the packed layouts: as q8_0 and q4_0 above, the quants by 128-bit loads */
template <>
__device__ __forceinline__ void dec32<GPU_Q8_0P>(const uint8_t *row, int64_t blk, int64_t k,
						 blk8 *o)
{
	dec32_q8<GPU_Q8_0P>(row, blk, k, o);
}

template <>
__device__ __forceinline__ void dec32<GPU_Q4_0P>(const uint8_t *row, int64_t blk, int64_t k,
						 blk8 *o)
{
	dec32_q4<GPU_Q4_0P>(row, blk, k, o);
}

struct mmq_p {
	const uint8_t *w;
	size_t w_stride;
	const int8_t *xq;
	const struct q8_scale *xs;
	float *y;
	int64_t y_stride, m, n, k;
};

/* Step b0: thread t decodes block b0 + t % MMQ_KB of weight row t /
 * MMQ_KB of the tile, and loads the same block of activation row t /
 * MMQ_KB; blocks past k and rows past m or n are zeros. W: words a
 * shared row. */
template <uint32_t T, int W>
__device__ __forceinline__ void mmq_stage(const struct mmq_p &p, int64_t i0, int64_t j0,
					  int64_t b0, uint32_t (*wq)[W], float (*wa)[MMQ_KB][3],
					  uint32_t (*xq)[W], struct q8_scale (*xs)[MMQ_KB])
{
	const int r = threadIdx.x / MMQ_KB, kb = threadIdx.x % MMQ_KB;
	const int64_t blk = b0 + kb, nblk = p.k / Q8_BLOCK, i = i0 + r, j = j0 + r;
	blk8 w;
	uint32_t x[8];
	struct q8_scale sc = { 0.0f, 0.0f };

	memset(&w, 0, sizeof(w));
	memset(x, 0, sizeof(x));
	if (j < p.n && blk < nblk)
		dec32<T>(p.w + j * p.w_stride, blk, p.k, &w);
	if (i < p.m && blk < nblk) {
		ld_words((const uint8_t *)(p.xq + i * p.k + blk * Q8_BLOCK), 8, x);
		sc = p.xs[i * nblk + blk];
	}
	for (int e = 0; e < 8; e++) {
		wq[r][kb * 8 + e] = w.q[e];
		xq[r][kb * 8 + e] = x[e];
	}
	wa[r][kb][0] = w.a[0], wa[r][kb][1] = w.a[1], wa[r][kb][2] = w.b;
	xs[r][kb] = sc;
}

/* Whether a format's 32-value block has one scale (a[0] == a[1]): its
 * integer sum is taken over the whole block. q6_K and q3_K have one per
 * 16 values. */
template <uint32_t T> struct mmq_halves {
	static constexpr bool two = false;
};
template <> struct mmq_halves<LOOM_TYPE_Q6_K> {
	static constexpr bool two = true;
};
template <> struct mmq_halves<GPU_Q6_KP> {
	static constexpr bool two = true;
};
template <> struct mmq_halves<LOOM_TYPE_Q3_K> {
	static constexpr bool two = true;
};

__device__ __forceinline__ float add_rn(float a, float b)
{
#ifdef GPU_EMU
	return a + b;
#else
	return __fadd_rn(a, b);
#endif
}

/* acc plus one block's part of an output: s[0] the integer dot of the
 * block (or of its first half, and s[1] of the second, where the halves
 * have scales of their own), x the activation block's scale and sum, a
 * the weight block's factors. Every operation rounded on its own (no
 * contraction), so both inner products give the same bits on hardware
 * too. */
template <uint32_t T>
__device__ __forceinline__ float mmq_add(float acc, const int *s, struct q8_scale x,
					 const float *a)
{
	float dot = mul_rn(a[0], (float)s[0]);

	if (mmq_halves<T>::two)
		dot = add_rn(dot, mul_rn(a[1], (float)s[1]));
	return add_rn(acc, add_rn(mul_rn(x.d, dot), -mul_rn(a[2], x.s)));
}

/* Thread (tx, ty) = (t % 16, t / 16) owns activation rows ty + 16 rr and
 * weight rows tx + 16 c of the tile. */
template <uint32_t T> __global__ void __launch_bounds__(THREADS) k_mmq(const struct mmq_p p)
{
	__shared__ uint32_t wq[MMQ_N][MMQ_W], xq[MMQ_M][MMQ_W];
	__shared__ float wa[MMQ_N][MMQ_KB][3];
	__shared__ struct q8_scale xs[MMQ_M][MMQ_KB];
	const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
	const int64_t i0 = (int64_t)blockIdx.y * MMQ_M, j0 = (int64_t)blockIdx.x * MMQ_N;
	float acc[4][4];

	for (int rr = 0; rr < 4; rr++)
		for (int c = 0; c < 4; c++)
			acc[rr][c] = 0.0f;
	for (int64_t b0 = 0; b0 < p.k / Q8_BLOCK; b0 += MMQ_KB) {
		mmq_stage<T, MMQ_W>(p, i0, j0, b0, wq, wa, xq, xs);
		__syncthreads();
		for (int kb = 0; kb < MMQ_KB; kb++) {
			int sum[4][4][2];

			GPU_UNROLL
			for (int h = 0; h < 2; h++) {
				uint32_t xw[4][4], ww[4][4];

				for (int e = 0; e < 4; e++) {
					for (int rr = 0; rr < 4; rr++)
						xw[rr][e] = xq[ty + 16 * rr][kb * 8 + 4 * h + e];
					for (int c = 0; c < 4; c++)
						ww[c][e] = wq[tx + 16 * c][kb * 8 + 4 * h + e];
				}
				for (int rr = 0; rr < 4; rr++)
					for (int c = 0; c < 4; c++) {
						int v = 0;

						for (int e = 0; e < 4; e++)
							v = gpu_dp4a((int)ww[c][e], (int)xw[rr][e], v);
						sum[rr][c][h] = v;
					}
			}
			for (int rr = 0; rr < 4; rr++)
				for (int c = 0; c < 4; c++) {
					if (!mmq_halves<T>::two)
						sum[rr][c][0] += sum[rr][c][1];
					acc[rr][c] = mmq_add<T>(acc[rr][c], sum[rr][c],
								xs[ty + 16 * rr][kb],
								wa[tx + 16 * c][kb]);
				}
		}
		__syncthreads();
	}
	for (int rr = 0; rr < 4; rr++)
		for (int c = 0; c < 4; c++) {
			const int64_t i = i0 + ty + 16 * rr, j = j0 + tx + 16 * c;

			if (i < p.m && j < p.n)
				p.y[i * p.y_stride + j] = acc[rr][c];
		}
}

#ifdef GPU_HAVE_MMA
/*
 * The same tile on the int8 tensor cores. Warp w (of 8) owns activation
 * rows 16 (w % 4) .. +15 and weight rows 32 (w / 4) .. +31 of the tile:
 * per block, one A fragment of its activation rows (matrix A, 16 x 32)
 * and, for each group of 8 weight rows, a B fragment (matrix B = those
 * rows' bytes, 32 x 8) and one MMA. Lane 4g + t (gpu_port.h) holds D's
 * elements (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1): output rows
 * g and g + 8, columns 2t and 2t + 1 of each group.
 */
template <uint32_t T>
__device__ __forceinline__ void mmq_mma_block(const uint32_t (*xq)[MMQ_W_MMA],
					      const uint32_t (*wq)[MMQ_W_MMA], int kb, int mr,
					      int nc, int s[4][4][2])
{
	const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
	const int zero[4] = { 0, 0, 0, 0 };
	uint32_t a[4], b[2];
	int d[4];

	a[0] = xq[mr + g][kb * 8 + t];
	a[1] = xq[mr + g + 8][kb * 8 + t];
	a[2] = xq[mr + g][kb * 8 + 4 + t];
	a[3] = xq[mr + g + 8][kb * 8 + 4 + t];
	for (int c = 0; c < 4; c++) {
		b[0] = wq[nc + 8 * c + g][kb * 8 + t];
		b[1] = wq[nc + 8 * c + g][kb * 8 + 4 + t];
		if (mmq_halves<T>::two) { /* one MMA per 16-value half */
			gpu_mma_k16(d, a, b, zero);
			for (int i = 0; i < 4; i++)
				s[c][i][0] = d[i];
			gpu_mma_k16(d, a + 2, b + 1, zero);
			for (int i = 0; i < 4; i++)
				s[c][i][1] = d[i];
		} else {
			gpu_mma_k32(d, a, b, zero);
			for (int i = 0; i < 4; i++)
				s[c][i][0] = d[i];
		}
	}
}

template <uint32_t T> __global__ void __launch_bounds__(THREADS) k_mmq_mma(const struct mmq_p p)
{
	__shared__ uint32_t wq[MMQ_N][MMQ_W_MMA], xq[MMQ_M][MMQ_W_MMA];
	__shared__ float wa[MMQ_N][MMQ_KB][3];
	__shared__ struct q8_scale xs[MMQ_M][MMQ_KB];
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int mr = 16 * (warp % 4), nc = 32 * (warp / 4), g = lane / 4, t = lane % 4;
	const int64_t i0 = (int64_t)blockIdx.y * MMQ_M, j0 = (int64_t)blockIdx.x * MMQ_N;
	float acc[4][4]; /* [weight row group c][D element i] */

	for (int c = 0; c < 4; c++)
		for (int i = 0; i < 4; i++)
			acc[c][i] = 0.0f;
	for (int64_t b0 = 0; b0 < p.k / Q8_BLOCK; b0 += MMQ_KB) {
		mmq_stage<T, MMQ_W_MMA>(p, i0, j0, b0, wq, wa, xq, xs);
		__syncthreads();
		for (int kb = 0; kb < MMQ_KB; kb++) {
			int s[4][4][2];

			mmq_mma_block<T>(xq, wq, kb, mr, nc, s);
			for (int c = 0; c < 4; c++)
				for (int i = 0; i < 4; i++) {
					const int r = mr + g + 8 * (i / 2);
					const int col = nc + 8 * c + 2 * t + i % 2;

					acc[c][i] = mmq_add<T>(acc[c][i], s[c][i], xs[r][kb],
							       wa[col][kb]);
				}
		}
		__syncthreads();
	}
	for (int c = 0; c < 4; c++)
		for (int i = 0; i < 4; i++) {
			const int64_t r = i0 + mr + g + 8 * (i / 2);
			const int64_t col = j0 + nc + 8 * c + 2 * t + i % 2;

			if (r < p.m && col < p.n)
				p.y[r * p.y_stride + col] = acc[c][i];
		}
}
#endif

extern "C" bool gpurt_has_mma(struct gpurt *rt)
{
#if defined(GPU_HAVE_MMA) && defined(GPU_EMU)
	(void)rt;
	return true;
#elif defined(GPU_HAVE_MMA)
	gpuDeviceProp prop;

	return bind(rt) == LOOM_OK && gpuGetDeviceProperties(&prop, rt->device) == gpuSuccess &&
	       prop.major >= 8;
#else
	(void)rt;
	return false;
#endif
}

/* The kernel for w_type: k_mmq_mma where asked for and built, else k_mmq. */
template <uint32_t T> static void (*mmq_kernel(bool mma))(const struct mmq_p)
{
#ifdef GPU_HAVE_MMA
	if (mma)
		return k_mmq_mma<T>;
#else
	(void)mma;
#endif
	return k_mmq<T>;
}

extern "C" int gpurt_mmq(struct gpurt *rt, const struct loom_gemm_args *a, const int8_t *qs,
			 const void *scale, bool mma)
{
	struct mmq_p p = {
		(const uint8_t *)a->w, a->w_stride, qs, (const struct q8_scale *)scale, a->y,
		a->y_stride, a->m, a->n, a->k,
	};
	const int64_t gx = (a->n + MMQ_N - 1) / MMQ_N, gy = (a->m + MMQ_M - 1) / MMQ_M;
	void (*kernel)(const struct mmq_p);

	BIND(rt);
	if (gx > INT32_MAX || gy > 65535) {
		snprintf(rt->err, sizeof(rt->err), "gemm: m %lld x n %lld too large for the int8 GEMM",
			 (long long)a->m, (long long)a->n);
		return LOOM_ERR_UNSUPPORTED;
	}
#define MMQ_CASE(T) case T: kernel = mmq_kernel<T>(mma); break;
	switch (a->w_type) {
		GPU_MMQ_FORMATS(MMQ_CASE)
	default: return unknown_format(rt, "gemm (int8 tiles)", a->w_type);
	}
#undef MMQ_CASE
	GPU_LAUNCH(kernel, dim3((unsigned)gx, (unsigned)gy), THREADS, 0, rt->stream, p);
	return launched(rt, "int8 GEMM kernel");
}

__device__ __forceinline__ void store(float *p, float v)
{
	*p = v;
}

__device__ __forceinline__ void store(uint16_t *p, float v)
{
	*p = f32_to_half(v);
}

struct deq_p {
	const uint8_t *w;
	size_t w_stride;
	int64_t k, parts, rows;
	const int32_t *ids; /* NULL: rows 0 .. rows-1 */
	void *dst;
	int64_t dst_stride;
};

/* Row r of a weight (or table) of format T to f32 or f16 (O); rows
 * grid-strided over blocks. */
template <uint32_t T, typename O>
__global__ void __launch_bounds__(THREADS) k_dequant(const struct deq_p p)
{
	for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
		const uint8_t *row = p.w + (p.ids ? (int64_t)p.ids[r] : r) * p.w_stride;
		O *out = (O *)p.dst + r * p.dst_stride;

		for (int64_t q = threadIdx.x; q < p.parts; q += blockDim.x) {
			float v[8];

			deq_part<T>(row, q, p.k, v);
			for (int e = 0; e < 8; e++) {
				int64_t idx = part_index<T>(q, e);

				if (in_row<T>(idx, p.k))
					store(&out[idx], v[e]);
			}
		}
	}
}

template <uint32_t T, typename O> static void launch_dequant(gpuStream_t s, const struct deq_p p)
{
	void (*kernel)(const struct deq_p) = k_dequant<T, O>;

	GPU_LAUNCH(kernel, grid_of(p.rows), THREADS, 0, s, p);
}

template <uint32_t T> static void launch_deq_f32(gpuStream_t s, const struct deq_p p)
{
	launch_dequant<T, float>(s, p);
}

template <uint32_t T> static void launch_deq_f16(gpuStream_t s, const struct deq_p p)
{
	launch_dequant<T, uint16_t>(s, p);
}

typedef void (*deq_launch)(gpuStream_t, const struct deq_p);

static deq_launch deq_f32_for(uint32_t t)
{
	switch (t) {
#define FORMAT_FN launch_deq_f32
		GPU_FORMATS(FORMAT_CASE)
#undef FORMAT_FN
	default:
		return NULL;
	}
}

static deq_launch deq_f16_for(uint32_t t)
{
	switch (t) {
#define FORMAT_FN launch_deq_f16
		GPU_FORMATS(FORMAT_CASE)
#undef FORMAT_FN
	default:
		return NULL;
	}
}

static int dequant(struct gpurt *rt, uint32_t type, bool half, const struct deq_p *p)
{
	deq_launch launch = half ? deq_f16_for(type) : deq_f32_for(type);

	BIND(rt);
	if (!launch)
		return unknown_format(rt, "dequantize", type);
	launch(rt->stream, *p);
	return launched(rt, half ? "dequantize (f16) kernel" : "dequantize kernel");
}

extern "C" int gpurt_dequant(struct gpurt *rt, uint32_t type, const void *w, size_t w_stride,
			     int64_t k, int64_t rows, const int32_t *ids, float *dst,
			     int64_t dst_stride)
{
	struct deq_p p = { (const uint8_t *)w, w_stride, k, parts_of(type, k), rows, ids, dst,
			   dst_stride };

	return dequant(rt, type, false, &p);
}

extern "C" int gpurt_dequant_half(struct gpurt *rt, uint32_t type, const void *w,
				  size_t w_stride, int64_t k, int64_t rows, uint16_t *dst,
				  int64_t dst_stride)
{
	struct deq_p p = { (const uint8_t *)w, w_stride, k, parts_of(type, k), rows, NULL, dst,
			   dst_stride };

	return dequant(rt, type, true, &p);
}

/* float to bfloat16, rounding to nearest even; NaN stays a quiet NaN. */
__device__ __forceinline__ uint16_t f32_to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, sizeof(x));
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)(x >> 16 | 0x40u);
	return (uint16_t)((x + 0x7fffu + (x >> 16 & 1u)) >> 16);
}

template <bool BF16>
__global__ void __launch_bounds__(THREADS)
k_to_16(const float *x, int64_t x_stride, int64_t rows, int64_t k, uint16_t *dst)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
			dst[r * k + i] = BF16 ? f32_to_bf16(x[r * x_stride + i]) :
						f32_to_half(x[r * x_stride + i]);
}

extern "C" int gpurt_to_half(struct gpurt *rt, const float *x, int64_t x_stride, int64_t rows,
			     int64_t k, bool bf16, uint16_t *dst)
{
	BIND(rt);
	if (bf16)
		GPU_LAUNCH(k_to_16<true>, grid_of(rows), THREADS, 0, rt->stream, x, x_stride, rows,
			k, dst);
	else
		GPU_LAUNCH(k_to_16<false>, grid_of(rows), THREADS, 0, rt->stream, x, x_stride,
			rows, k, dst);
	return launched(rt, "f16 conversion kernel");
}

#ifdef GPU_HAVE_BLAS

/* cuBLAS is column-major: y^T (n x m, ld y_stride) = p (k x n, ld ldp)^T .
 * x^T (k x m, ld x_stride). Default math mode: no TF32. */
extern "C" int gpurt_sgemm(struct gpurt *rt, int64_t m, int64_t n, int64_t k, const float *x,
			   int64_t x_stride, const float *p, int64_t ldp, float *y,
			   int64_t y_stride)
{
	const float one = 1.0f, zero = 0.0f;
	cublasStatus_t st;

	BIND(rt);

	if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || x_stride > INT32_MAX ||
	    ldp > INT32_MAX || y_stride > INT32_MAX) {
		snprintf(rt->err, sizeof(rt->err), "gemm: shape too large for cuBLAS");
		return LOOM_ERR_UNSUPPORTED;
	}
	st = cublasSgemm(rt->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, p,
			 (int)ldp, x, (int)x_stride, &zero, y, (int)y_stride);
	if (st != CUBLAS_STATUS_SUCCESS) {
		snprintf(rt->err, sizeof(rt->err), "CUDA: cublasSgemm failed (status %d)", (int)st);
		return LOOM_ERR_DEVICE;
	}
	return LOOM_OK;
}

/* The same product on f16 or bf16 inputs (x rows k apart, p rows ldp
 * apart), f32 accumulation and output: tensor cores. */
extern "C" int gpurt_hgemm(struct gpurt *rt, int64_t m, int64_t n, int64_t k, const uint16_t *x,
			   const uint16_t *p, int64_t ldp, bool bf16, float *y, int64_t y_stride)
{
	const float one = 1.0f, zero = 0.0f;
	const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
	cublasStatus_t st;

	BIND(rt);

	if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || ldp > INT32_MAX ||
	    y_stride > INT32_MAX) {
		snprintf(rt->err, sizeof(rt->err), "gemm: shape too large for cuBLAS");
		return LOOM_ERR_UNSUPPORTED;
	}
	st = cublasGemmEx(rt->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, p, t,
			  (int)ldp, x, t, (int)k, &zero, y, CUDA_R_32F, (int)y_stride,
			  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS) {
		snprintf(rt->err, sizeof(rt->err), "CUDA: cublasGemmEx failed (status %d)", (int)st);
		return LOOM_ERR_DEVICE;
	}
	return LOOM_OK;
}

#else

extern "C" int gpurt_hgemm(struct gpurt *rt, int64_t m, int64_t n, int64_t k, const uint16_t *x,
			   const uint16_t *p, int64_t ldp, bool bf16, float *y, int64_t y_stride)
{
	(void)m, (void)n, (void)k, (void)x, (void)p, (void)ldp, (void)bf16, (void)y, (void)y_stride;
	snprintf(rt->err, sizeof(rt->err), "gemm: no f16 BLAS in this build");
	return LOOM_ERR_UNSUPPORTED;
}

#define SG_TILE 64
#define SG_K 16

/*
 * y = x . p^T in 64 x 64 tiles of y, 256 threads of 4 x 4 outputs each,
 * k in steps of 16 through shared memory. Used where no vendor BLAS is
 * available (Debian's ROCm has no hipBLAS).
 */
__global__ void __launch_bounds__(THREADS)
k_sgemm(int64_t m, int64_t n, int64_t k, const float *x, int64_t x_stride, const float *p,
	int64_t ldp, float *y, int64_t y_stride)
{
	__shared__ float xs[SG_K][SG_TILE + 1], ps[SG_K][SG_TILE + 1];
	const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
	const int64_t i0 = (int64_t)blockIdx.y * SG_TILE, j0 = (int64_t)blockIdx.x * SG_TILE;
	float acc[4][4] = { { 0.0f } };

	for (int64_t k0 = 0; k0 < k; k0 += SG_K) {
		for (int l = threadIdx.x; l < SG_K * SG_TILE; l += blockDim.x) {
			int r = l / SG_K, c = l % SG_K;
			int64_t kk = k0 + c;

			xs[c][r] = i0 + r < m && kk < k ? x[(i0 + r) * x_stride + kk] : 0.0f;
			ps[c][r] = j0 + r < n && kk < k ? p[(j0 + r) * ldp + kk] : 0.0f;
		}
		__syncthreads();
		for (int c = 0; c < SG_K; c++)
			for (int a = 0; a < 4; a++)
				for (int b = 0; b < 4; b++)
					acc[a][b] += xs[c][ty * 4 + a] * ps[c][tx * 4 + b];
		__syncthreads();
	}
	for (int a = 0; a < 4; a++)
		for (int b = 0; b < 4; b++) {
			int64_t i = i0 + ty * 4 + a, j = j0 + tx * 4 + b;

			if (i < m && j < n)
				y[i * y_stride + j] = acc[a][b];
		}
}

extern "C" int gpurt_sgemm(struct gpurt *rt, int64_t m, int64_t n, int64_t k, const float *x,
			   int64_t x_stride, const float *p, int64_t ldp, float *y,
			   int64_t y_stride)
{
	int64_t gx = (n + SG_TILE - 1) / SG_TILE, gy = (m + SG_TILE - 1) / SG_TILE;

	BIND(rt);

	if (gx > INT32_MAX || gy > MAX_GRID) {
		snprintf(rt->err, sizeof(rt->err), "gemm: shape too large for the tiled kernel");
		return LOOM_ERR_UNSUPPORTED;
	}
	GPU_LAUNCH(k_sgemm, dim3((unsigned)gx, (unsigned)gy), THREADS, 0, rt->stream, m, n, k, x,
		x_stride, p, ldp, y, y_stride);
	return launched(rt, "sgemm kernel");
}

#endif

/* ---- row and elementwise operators ---- */

/*
 * RMSNorm, one block a row, the sum of squares in double as the reference
 * (each thread a strided run, then block_sum's fixed order). ADD: the row
 * is first made as gpurt_add makes it, x[r] = a[r] + b[r] (b_stride 0:
 * the same b row for all), and written out; Q8: the normalized row is
 * also quantized to 8 bits as k_quantize_q8 does it (for the fast GEMVs
 * that read it). So a norm with its add or its quantization gives the
 * bits of the separate kernels.
 */
template <bool ADD, bool Q8>
__global__ void __launch_bounds__(THREADS) k_norm(const struct gpurt_norm p)
{
	__shared__ double red[THREADS / 32];

	for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
		float *xr = p.x + r * p.x_stride, *yr = p.y + r * p.y_stride;
		double ss = 0.0;
		float inv;

		for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
			float v;

			if constexpr (ADD) {
				v = p.a[r * p.a_stride + i] + p.b[r * p.b_stride + i];
				xr[i] = v;
			} else {
				v = xr[i];
			}
			ss += (double)v * v;
		}
		ss = block_sum(ss, red);
		inv = (float)(1.0 / sqrt(ss / (double)p.n + (double)p.eps));
		/* the same trip count for every thread: quantize_at shuffles */
		for (int64_t i0 = 0; i0 < p.n; i0 += blockDim.x) {
			const int64_t i = i0 + threadIdx.x;
			const float v = i < p.n ? xr[i] * inv * p.w[i] : 0.0f;

			if (i < p.n)
				yr[i] = v;
			if constexpr (Q8)
				quantize_at(v, r * p.n + i, i < p.n, p.qs, (struct q8_scale *)p.scale);
		}
	}
}

extern "C" int gpurt_norm(struct gpurt *rt, const struct gpurt_norm *n)
{
	const struct gpurt_norm p = *n; /* by value: a capture keeps the arguments */
	void (*kernel)(const struct gpurt_norm) =
		p.a ? (p.qs ? k_norm<true, true> : k_norm<true, false>) :
		      (p.qs ? k_norm<false, true> : k_norm<false, false>);

	BIND(rt);
	GPU_LAUNCH(kernel, grid_of(p.rows), THREADS, 0, rt->stream, p);
	return launched(rt, "rmsnorm kernel");
}

extern "C" int gpurt_rmsnorm(struct gpurt *rt, float *y, int64_t y_stride, const float *x,
			     int64_t x_stride, const float *w, int64_t rows, int64_t n, float eps)
{
	struct gpurt_norm p;

	memset(&p, 0, sizeof(p));
	p.y = y, p.y_stride = y_stride;
	p.x = (float *)x, p.x_stride = x_stride; /* not written without an add */
	p.w = w, p.rows = rows, p.n = n, p.eps = eps;
	return gpurt_norm(rt, &p);
}

/*
 * RoPE. Each pair's inverse frequency freq_base^(-2i/n_rot) comes from a
 * table the host makes once per (freq_base, n_rot) (gpu.c: rope_table):
 * inv[i] in double, by the host's pow exactly as ref.so computes it,
 * inv_f[i] = (float)inv[i] and inv_lo[i] = (float)(inv[i] - inv_f[i]).
 * Exact mode then computes ref.so's angle (double)pos * freq_scale *
 * inv[i] (/ freq_factors[i]) and its double cos and sin, so the bits are
 * ref.so's; fast mode computes the same angle in f32 arithmetic only
 * (rope_cs_f32; conformance: rope's fast-mode tolerance, measured in
 * docs/GPU.md).
 */
struct rope_p {
	uint32_t mode;
	int32_t fast;
	float *x;
	int64_t n_tokens, n_heads, head_dim, n_rot, row_stride;
	const int32_t *pos;
	float freq_scale;
	const float *freq_factors;
	const double *inv;
	const float *inv_f, *inv_lo;
};

static struct rope_p rope_params(const struct loom_rope_args *a, const struct gpurt_rope_table *t)
{
	struct rope_p p = {
		a->mode, t->fast, a->x, a->n_tokens, a->n_heads, a->head_dim, a->n_rot, a->row_stride,
		a->pos, a->freq_scale, a->freq_factors, t->inv, t->inv_f, t->inv_lo,
	};

	return p;
}

/*
 * Fast mode's cos and sin, f32 arithmetic only: the angle as an unevaluated
 * sum a + e (the product (float)pos * freq_scale * inv with each rounding
 * error caught by fmaf, inv split as inv_f + inv_lo, the division by a
 * frequency factor likewise), sincosf of a, then the rotation by the small
 * e to second order. So the angle loses nothing to f32 at long positions
 * (a lone f32 product is off by up to half an ulp of the angle: 0.004 rad
 * at position 65536); what is left is sincosf's own error.
 */
__device__ __forceinline__ void rope_cs_f32(const struct rope_p &p, int64_t t, int64_t i, float *c,
					    float *s)
{
	const float pf = (float)p.pos[t], hi = p.inv_f[i], lo = p.inv_lo[i];
	const float q = pf * p.freq_scale, q_lo = fmaf(pf, p.freq_scale, -q);
	float a = q * hi, e = fmaf(q, hi, -a) + fmaf(q, lo, q_lo * hi), sa, ca;

	if (p.freq_factors) {
		const float f = p.freq_factors[i], b = a / f;

		e = (fmaf(-b, f, a) + e) / f;
		a = b;
	}
	sincosf(a, &sa, &ca);
	*s = sa + e * (ca - 0.5f * e * sa);
	*c = ca - e * (sa + 0.5f * e * ca);
}

/* cos and sin of token t's angle for pair i. */
__device__ __forceinline__ void rope_cs(const struct rope_p &p, int64_t t, int64_t i, float *c,
					float *s)
{
	if (p.fast) {
		rope_cs_f32(p, t, i, c, s);
		return;
	}
	double theta = (double)p.pos[t] * p.freq_scale * p.inv[i];

	if (p.freq_factors)
		theta /= p.freq_factors[i];
	*c = (float)cos(theta);
	*s = (float)sin(theta);
}

/* Rotates pair i of the head at h (NORM: 2i, 2i + 1; NEOX: i, i + half)
 * in place; products rounded as ref.so's rotate() rounds them. */
__device__ __forceinline__ void rope_pair(const struct rope_p &p, float *h, int64_t t, int64_t i)
{
	const int64_t half = p.n_rot / 2;
	const int64_t ia = p.mode == LOOM_ROPE_NORM ? 2 * i : i;
	const int64_t ib = p.mode == LOOM_ROPE_NORM ? 2 * i + 1 : i + half;
	float c, s, x0 = h[ia], x1 = h[ib];

	rope_cs(p, t, i, &c, &s);
	h[ia] = mul_rn(x0, c) - mul_rn(x1, s);
	h[ib] = mul_rn(x0, s) + mul_rn(x1, c);
}

/* One thread per (token, head, pair). */
__global__ void __launch_bounds__(THREADS) k_rope(const struct rope_p p)
{
	const int64_t half = p.n_rot / 2, total = p.n_tokens * p.n_heads * half;

	for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < total;
	     g += (int64_t)gridDim.x * blockDim.x) {
		int64_t i = g % half, h = g / half % p.n_heads, t = g / half / p.n_heads;

		rope_pair(p, p.x + t * p.row_stride + h * p.head_dim, t, i);
	}
}

extern "C" int gpurt_rope(struct gpurt *rt, const struct loom_rope_args *a,
			  const struct gpurt_rope_table *t)
{
	struct rope_p p = rope_params(a, t);
	int64_t total = a->n_tokens * a->n_heads * (a->n_rot / 2);

	BIND(rt);

	GPU_LAUNCH(k_rope, grid_of((total + THREADS - 1) / THREADS), THREADS, 0, rt->stream, p);
	return launched(rt, "rope kernel");
}

/*
 * Element-wise kernels run on a grid of column blocks (x) by rows (y), so
 * one row spreads over n / THREADS blocks: at batch 1 a single block
 * would do the whole row. Each element is computed alone, so the grid
 * changes nothing in the results.
 */
static dim3 grid_2d(int64_t rows, int64_t n)
{
	return dim3(grid_of((n + THREADS - 1) / THREADS), grid_of(rows));
}

#define FOR_ELEMENTS(r, i, rows, n)                                                        \
	for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)                           \
		for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
		     i += (int64_t)gridDim.x * blockDim.x)

__global__ void __launch_bounds__(THREADS)
k_glu(int kind, float *out, int64_t out_stride, const float *gate, int64_t gate_stride,
      const float *up, int64_t up_stride, int64_t rows, int64_t n)
{
	FOR_ELEMENTS(r, i, rows, n) {
		out[r * out_stride + i] = glu_of(kind, gate[r * gate_stride + i], up[r * up_stride + i]);
	}
}

extern "C" int gpurt_glu(struct gpurt *rt, enum loom_glu_kind kind, float *out,
			 int64_t out_stride, const float *gate, int64_t gate_stride,
			 const float *up, int64_t up_stride, int64_t rows, int64_t n)
{
	BIND(rt);
	GPU_LAUNCH(k_glu, grid_2d(rows, n), THREADS, 0, rt->stream, (int)kind, out, out_stride, gate,
		gate_stride, up, up_stride, rows, n);
	return launched(rt, "glu kernel");
}

__global__ void __launch_bounds__(THREADS)
k_add(float *out, int64_t out_stride, const float *a, int64_t a_stride, const float *b,
      int64_t b_stride, int64_t b_rows, int64_t rows, int64_t n)
{
	FOR_ELEMENTS(r, i, rows, n)
		out[r * out_stride + i] = a[r * a_stride + i] + b[(b_rows == 1 ? 0 : r * b_stride) + i];
}

extern "C" int gpurt_add(struct gpurt *rt, float *out, int64_t out_stride, const float *a,
			 int64_t a_stride, const float *b, int64_t b_stride, int64_t b_rows,
			 int64_t rows, int64_t n)
{
	BIND(rt);
	GPU_LAUNCH(k_add, grid_2d(rows, n), THREADS, 0, rt->stream, out, out_stride, a, a_stride, b,
		b_stride, b_rows, rows, n);
	return launched(rt, "add kernel");
}

__global__ void __launch_bounds__(THREADS)
k_scale(float *x, int64_t stride, int64_t rows, int64_t n, float s)
{
	FOR_ELEMENTS(r, i, rows, n)
		x[r * stride + i] *= s;
}

extern "C" int gpurt_scale(struct gpurt *rt, float *x, int64_t stride, int64_t rows,
			   int64_t n, float s)
{
	BIND(rt);
	GPU_LAUNCH(k_scale, grid_2d(rows, n), THREADS, 0, rt->stream, x, stride, rows, n, s);
	return launched(rt, "scale kernel");
}

__global__ void __launch_bounds__(THREADS)
k_softcap(float *x, int64_t stride, int64_t rows, int64_t n, float cap)
{
	FOR_ELEMENTS(r, i, rows, n)
		x[r * stride + i] = cap * tanhf(x[r * stride + i] / cap);
}

extern "C" int gpurt_softcap(struct gpurt *rt, float *x, int64_t stride, int64_t rows,
			     int64_t n, float cap)
{
	BIND(rt);
	GPU_LAUNCH(k_softcap, grid_2d(rows, n), THREADS, 0, rt->stream, x, stride, rows, n, cap);
	return launched(rt, "softcap kernel");
}

/*
 * Blocks of THREADS units (x) by tokens (y): thread i writes the cache's i-th unit of the row (a
 * value for f32 and f16, a 32-value block for q8_0 and q4_0), quantized
 * as loom/kv_quant.h does on the host, so every backend stores the same
 * bytes.
 */
__global__ void __launch_bounds__(THREADS)
k_kv_write(float *kc, float *vc, const float *k, const float *v, int64_t k_stride,
	   int64_t v_stride, int64_t n_tokens, int64_t kv_dim, const int32_t *slots,
	   uint32_t type, int64_t row_bytes)
{
	const int64_t per = loom_kvq_block_elems(type), units = kv_dim / per;
	const int64_t unit_bytes = row_bytes / units;

	FOR_ELEMENTS(t, i, n_tokens, units) {
		const int64_t dst = (int64_t)slots[t] * row_bytes;

		loom_kvq_quantize(type, (char *)kc + dst + i * unit_bytes,
				  k + t * k_stride + i * per, per);
		loom_kvq_quantize(type, (char *)vc + dst + i * unit_bytes,
				  v + t * v_stride + i * per, per);
	}
}

extern "C" int gpurt_kv_write(struct gpurt *rt, const struct loom_kv_write_args *a)
{
	uint32_t type = LOOM_KV_TYPE(a, struct loom_kv_write_args);

	BIND(rt);
	GPU_LAUNCH(k_kv_write, grid_2d(a->n_tokens, a->kv_dim / loom_kvq_block_elems(type)), THREADS,
		   0, rt->stream, a->kcache, a->vcache, a->k, a->v, a->k_stride, a->v_stride,
		   a->n_tokens, a->kv_dim, a->slots, type,
		   (int64_t)loom_kvq_row_bytes(type, a->kv_dim));
	return launched(rt, "kv_write kernel");
}

/*
 * RoPE of q (optional) and k, then kv_write of k and v, in one launch
 * (gpu_fuse.c decides when that is safe). Per token, the items are q's
 * pairs, then k's units, then v's units; each thread does one item:
 *  - a q pair: rotated in place, as k_rope;
 *  - a k unit: its values rotated in place in k's rows as k_rope rotates
 *    them, then stored to the cache slot from those rows as k_kv_write
 *    stores them. A unit owns whole pairs, so no thread reads a value
 *    another writes: for f32 and f16 a pair (or a value past n_rot); for
 *    q8_0 and q4_0 a 32-value block (NORM: its pairs lie inside it) or,
 *    in NEOX mode, the two blocks i and i + n_rot/2 whose values pair up
 *    (n_rot a multiple of 64), or a block past n_rot;
 *  - a v unit: stored as k_kv_write stores it.
 */
struct rope_kv_p {
	struct rope_p q, k; /* q.x NULL: no q */
	float *kc, *vc;
	const float *v;
	int64_t v_stride;
	const int32_t *slots;
	uint32_t type;
	int64_t row_bytes;
};

/* k's units in one head. */
__host__ __device__ static int64_t rope_kv_head_units(const struct rope_p &k, uint32_t type)
{
	if (loom_kvq_block_elems(type) == 1)
		return k.n_rot / 2 + k.head_dim - k.n_rot;
	if (k.mode == LOOM_ROPE_NORM)
		return k.head_dim / 32;
	return k.n_rot / 64 + (k.head_dim - k.n_rot) / 32;
}

/* Stores values [e, e + n) of k's row t (whole units) to its cache slot. */
__device__ __forceinline__ void rope_kv_store(const struct rope_kv_p &p, int64_t t, int64_t e,
					      int64_t n)
{
	const int64_t per = loom_kvq_block_elems(p.type);
	const int64_t unit_bytes = p.row_bytes / (p.k.n_heads * p.k.head_dim / per);
	char *dst = (char *)p.kc + (int64_t)p.slots[t] * p.row_bytes;
	const float *x = p.k.x + t * p.k.row_stride;

	for (int64_t u = e; u < e + n; u += per)
		loom_kvq_quantize(p.type, dst + u / per * unit_bytes, x + u, per);
}

/* k's unit j of head h, token t. */
__device__ void rope_kv_k(const struct rope_kv_p &p, int64_t t, int64_t h, int64_t j)
{
	const struct rope_p &k = p.k;
	const int64_t half = k.n_rot / 2, base = h * k.head_dim;
	float *x = k.x + t * k.row_stride + base;

	if (loom_kvq_block_elems(p.type) == 1) {
		if (j >= half) { /* a value past n_rot */
			rope_kv_store(p, t, base + k.n_rot + j - half, 1);
			return;
		}
		rope_pair(k, x, t, j);
		rope_kv_store(p, t, base + (k.mode == LOOM_ROPE_NORM ? 2 * j : j), 1);
		rope_kv_store(p, t, base + (k.mode == LOOM_ROPE_NORM ? 2 * j + 1 : j + half), 1);
		return;
	}
	if (k.mode == LOOM_ROPE_NORM) {
		for (int64_t e = 32 * j; e < 32 * j + 32 && e < k.n_rot; e += 2)
			rope_pair(k, x, t, e / 2);
		rope_kv_store(p, t, base + 32 * j, 32);
		return;
	}
	if (j >= k.n_rot / 64) { /* a block past n_rot */
		rope_kv_store(p, t, base + k.n_rot + 32 * (j - k.n_rot / 64), 32);
		return;
	}
	for (int64_t i = 32 * j; i < 32 * j + 32; i++)
		rope_pair(k, x, t, i);
	rope_kv_store(p, t, base + 32 * j, 32);
	rope_kv_store(p, t, base + 32 * j + half, 32);
}

__global__ void __launch_bounds__(THREADS) k_rope_kv(const struct rope_kv_p p)
{
	const int64_t per = loom_kvq_block_elems(p.type), kv_dim = p.k.n_heads * p.k.head_dim;
	const int64_t nq = p.q.x ? p.q.n_heads * (p.q.n_rot / 2) : 0;
	const int64_t hk = rope_kv_head_units(p.k, p.type), nk = p.k.n_heads * hk;
	const int64_t unit_bytes = p.row_bytes / (kv_dim / per);

	FOR_ELEMENTS(t, i, p.k.n_tokens, nq + nk + kv_dim / per) {
		if (i < nq) {
			const int64_t half = p.q.n_rot / 2;

			rope_pair(p.q, p.q.x + t * p.q.row_stride + i / half * p.q.head_dim, t,
				  i % half);
		} else if (i < nq + nk) {
			rope_kv_k(p, t, (i - nq) / hk, (i - nq) % hk);
		} else {
			const int64_t u = i - nq - nk;

			loom_kvq_quantize(p.type,
					  (char *)p.vc + (int64_t)p.slots[t] * p.row_bytes +
						  u * unit_bytes,
					  p.v + t * p.v_stride + u * per, per);
		}
	}
}

extern "C" int gpurt_rope_kv(struct gpurt *rt, const struct loom_rope_args *q,
			     const struct loom_rope_args *k, const struct loom_kv_write_args *w,
			     const struct gpurt_rope_table *t)
{
	struct rope_kv_p p;
	int64_t items;

	memset(&p, 0, sizeof(p));
	if (q)
		p.q = rope_params(q, t);
	p.k = rope_params(k, t);
	p.kc = w->kcache, p.vc = w->vcache;
	p.v = w->v, p.v_stride = w->v_stride;
	p.slots = w->slots;
	p.type = LOOM_KV_TYPE(w, struct loom_kv_write_args);
	p.row_bytes = (int64_t)loom_kvq_row_bytes(p.type, w->kv_dim);
	items = (q ? q->n_heads * (q->n_rot / 2) : 0) + k->n_heads * rope_kv_head_units(p.k, p.type) +
		w->kv_dim / loom_kvq_block_elems(p.type);
	BIND(rt);
	GPU_LAUNCH(k_rope_kv, grid_2d(k->n_tokens, items), THREADS, 0, rt->stream, p);
	return launched(rt, "rope and kv_write kernel");
}

/*
 * The head norms of Qwen3 and Gemma 3 (rmsnorm of each head of q and k,
 * in place) with the RoPE of q and k and the kv_write of k's rows after
 * them, in one launch. One block per (token, head) of q and of k: the
 * head's sum of squares and scaling exactly as k_norm computes a row
 * (THREADS threads, the same strided partial sums, the same block_sum, so
 * the same bits), a barrier, its pairs rotated as k_rope rotates them, and
 * for a k head a barrier, then its k and v units stored as k_kv_write
 * stores them. head_dim must be a whole number of cache units.
 */
struct norm_rope_kv_p {
	struct rope_kv_p rk;
	const float *qw, *kw; /* the norms' weights (head_dim each) */
	float q_eps, k_eps;
};

__device__ void norm_head(float *x, int64_t n, const float *w, float eps, double *red)
{
	double ss = 0.0;
	float inv;

	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		ss += (double)x[i] * x[i];
	ss = block_sum(ss, red);
	inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		x[i] = x[i] * inv * w[i];
}

__global__ void __launch_bounds__(THREADS) k_norm_rope_kv(const struct norm_rope_kv_p p)
{
	__shared__ double red[THREADS / 32];
	const struct rope_kv_p &rk = p.rk;
	const int64_t hq = rk.q.n_heads, heads = hq + rk.k.n_heads, hd = rk.k.head_dim;
	const int64_t per = loom_kvq_block_elems(rk.type), units = hd / per;
	const int64_t unit_bytes = rk.row_bytes / (rk.k.n_heads * units);

	for (int64_t b = blockIdx.x; b < rk.k.n_tokens * heads; b += gridDim.x) {
		const int64_t t = b / heads, hh = b % heads, h = hh < hq ? hh : hh - hq;
		const struct rope_p &r = hh < hq ? rk.q : rk.k;
		float *x = r.x + t * r.row_stride + h * r.head_dim;

		norm_head(x, r.head_dim, hh < hq ? p.qw : p.kw, hh < hq ? p.q_eps : p.k_eps, red);
		__syncthreads();
		for (int64_t j = threadIdx.x; j < r.n_rot / 2; j += blockDim.x)
			rope_pair(r, x, t, j);
		if (hh < hq)
			continue; /* every thread alike: the barrier below is whole */
		__syncthreads();
		for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
			const int64_t at = (int64_t)rk.slots[t] * rk.row_bytes + (h * units + u) * unit_bytes;

			loom_kvq_quantize(rk.type, (char *)rk.kc + at, x + u * per, per);
			loom_kvq_quantize(rk.type, (char *)rk.vc + at,
					  rk.v + t * rk.v_stride + h * hd + u * per, per);
		}
	}
}

extern "C" int gpurt_norm_rope_kv(struct gpurt *rt, const struct gpurt_head_norms *n,
				  const struct loom_rope_args *q, const struct loom_rope_args *k,
				  const struct loom_kv_write_args *w, const struct gpurt_rope_table *t)
{
	struct norm_rope_kv_p p;

	memset(&p, 0, sizeof(p));
	p.rk.q = rope_params(q, t);
	p.rk.k = rope_params(k, t);
	p.rk.kc = w->kcache, p.rk.vc = w->vcache;
	p.rk.v = w->v, p.rk.v_stride = w->v_stride;
	p.rk.slots = w->slots;
	p.rk.type = LOOM_KV_TYPE(w, struct loom_kv_write_args);
	p.rk.row_bytes = (int64_t)loom_kvq_row_bytes(p.rk.type, w->kv_dim);
	p.qw = n->q_w, p.kw = n->k_w;
	p.q_eps = n->q_eps, p.k_eps = n->k_eps;
	BIND(rt);
	GPU_LAUNCH(k_norm_rope_kv, grid_of(k->n_tokens * (q->n_heads + k->n_heads)), THREADS, 0,
		   rt->stream, p);
	return launched(rt, "head norm, rope and kv_write kernel");
}

/* ---- paged attention ---- */

struct attn_p {
	float *out;
	const float *q, *kc, *vc;
	int64_t q_stride, out_stride, n_heads, head_dim, block_size, max_blocks, kv_dim, group;
	const int32_t *block_table;
	float scale, softcap;
	int32_t window;
	uint32_t kv_type;  /* the cache's (ABI 1.3) */
	int64_t row_bytes; /* of one cache slot */
	const float *sinks; /* [n_heads] or NULL (ABI 1.8, gpt-oss) */
	const int32_t *tree; /* split-K: the tree table (gpu_rt.h), NULL: all causal */
};

static struct attn_p attn_params(const struct loom_attention_args *a)
{
	struct attn_p p = {
		a->out, a->q, a->kcache, a->vcache, a->q_stride, a->out_stride, a->n_heads,
		a->head_dim, a->block_size, a->max_blocks, a->n_kv_heads * a->head_dim,
		a->n_heads / a->n_kv_heads, a->block_table, a->scale, a->softcap, a->window,
		LOOM_KV_TYPE(a, struct loom_attention_args), 0, LOOM_ATTN_SINKS(a), NULL,
	};
	p.row_bytes = (int64_t)loom_kvq_row_bytes(p.kv_type, p.kv_dim);
	return p;
}

/* Value d of head kvh of token t of sequence seq in a cache of any type. */
__device__ __forceinline__ float kv_at(const struct attn_p &p, const float *cache, int64_t seq,
				       int64_t t, int64_t kvh, int64_t d)
{
	int64_t block = p.block_table[seq * p.max_blocks + t / p.block_size];
	int64_t slot = block * p.block_size + t % p.block_size;

	if (p.kv_type == LOOM_TYPE_F32)
		return cache[slot * p.kv_dim + kvh * p.head_dim + d];
	return loom_kvq_value(p.kv_type, (const char *)cache + slot * p.row_bytes,
			      kvh * p.head_dim + d);
}

__device__ __forceinline__ float cap(const struct attn_p &p, float s)
{
	return p.softcap > 0.0f ? p.softcap * tanhf(s / p.softcap) : s;
}

/* The softmax denominator of head h, l over scores shifted by mx, with
 * the head's sink logit joining it last (ABI 1.8): l + exp(sink - mx). */
__device__ __forceinline__ float with_sink(const struct attn_p &p, int64_t h, float l, float mx)
{
	return p.sinks ? l + expf(p.sinks[h] - mx) : l;
}

/*
 * Flash-style prefill: one block per (tile of up to GPU_ATTN_TILE_Q query
 * rows of one sequence, head). Key/value tiles of TILE_KV tokens stream
 * through shared memory via the block table; each row keeps a running
 * maximum m, denominator l and output accumulator, rescaled by exp(m_old -
 * m_new) whenever a tile raises the maximum (online softmax). Keys outside
 * a row's causal window are masked to weight 0. A sink (gpt-oss) joins
 * each row's denominator at the end, shifted by the row's final maximum.
 */
__global__ void __launch_bounds__(ATTN_THREADS)
k_attn_prefill(const struct attn_p p, const struct gpu_attn_tile *tiles)
{
	GPU_DYNAMIC_SHARED(float, sm);
	const struct gpu_attn_tile tile = tiles[blockIdx.x];
	const int64_t h = blockIdx.y, kvh = h / p.group, hd = p.head_dim, pitch = hd + 1;
	const int TQ = GPU_ATTN_TILE_Q;
	float *qs = sm, *ks = qs + TQ * pitch, *vs = ks + TILE_KV * pitch;
	float *acc = vs + TILE_KV * pitch, *s = acc + TQ * pitch;
	float *mrow = s + TQ * TILE_KV, *lrow = mrow + TQ, *corr = lrow + TQ;
	const int64_t last = (int64_t)tile.pos + tile.n - 1;
	int64_t first = p.window > 0 ? (int64_t)tile.pos - p.window + 1 : 0;

	if (first < 0)
		first = 0;
	for (int64_t l = threadIdx.x; l < TQ * hd; l += blockDim.x) {
		int64_t i = l / hd, d = l % hd;

		qs[i * pitch + d] = i < tile.n ?
			p.q[(tile.row + i) * p.q_stride + h * hd + d] : 0.0f;
		acc[i * pitch + d] = 0.0f;
	}
	if (threadIdx.x < TQ) {
		mrow[threadIdx.x] = -INFINITY;
		lrow[threadIdx.x] = 0.0f;
	}
	for (int64_t t0 = first; t0 <= last; t0 += TILE_KV) {
		__syncthreads(); /* previous tile fully consumed */
		for (int64_t l = threadIdx.x; l < TILE_KV * hd; l += blockDim.x) {
			int64_t j = l / hd, d = l % hd, t = t0 + j;
			bool in = t <= last;

			ks[j * pitch + d] = in ? kv_at(p, p.kc, tile.seq, t, kvh, d) : 0.0f;
			vs[j * pitch + d] = in ? kv_at(p, p.vc, tile.seq, t, kvh, d) : 0.0f;
		}
		__syncthreads();
		for (int l = threadIdx.x; l < TQ * TILE_KV; l += blockDim.x) {
			int i = l / TILE_KV, j = l % TILE_KV;
			int64_t t = t0 + j, pos = (int64_t)tile.pos + i;
			int64_t lo = p.window > 0 ? pos - p.window + 1 : 0;
			float dot = 0.0f;

			if (i >= tile.n || t > pos || t < lo) {
				s[l] = -INFINITY;
				continue;
			}
			for (int64_t d = 0; d < hd; d++)
				dot += qs[i * pitch + d] * ks[j * pitch + d];
			s[l] = cap(p, p.scale * dot);
		}
		__syncthreads();
		if (threadIdx.x < TQ) {
			int i = threadIdx.x;
			float mt = -INFINITY, mnew, sum = 0.0f;

			for (int j = 0; j < TILE_KV; j++)
				mt = fmaxf(mt, s[i * TILE_KV + j]);
			mnew = fmaxf(mrow[i], mt);
			if (mnew == -INFINITY) { /* nothing visible yet */
				corr[i] = 1.0f;
				for (int j = 0; j < TILE_KV; j++)
					s[i * TILE_KV + j] = 0.0f;
			} else {
				corr[i] = expf(mrow[i] - mnew);
				for (int j = 0; j < TILE_KV; j++) {
					float e = expf(s[i * TILE_KV + j] - mnew);

					s[i * TILE_KV + j] = e;
					sum += e;
				}
				lrow[i] = lrow[i] * corr[i] + sum;
				mrow[i] = mnew;
			}
		}
		__syncthreads();
		for (int64_t l = threadIdx.x; l < TQ * hd; l += blockDim.x) {
			int64_t i = l / hd, d = l % hd;
			float a = acc[i * pitch + d] * corr[i];

			for (int j = 0; j < TILE_KV; j++)
				a += s[i * TILE_KV + j] * vs[j * pitch + d];
			acc[i * pitch + d] = a;
		}
	}
	__syncthreads();
	for (int64_t l = threadIdx.x; l < TQ * hd; l += blockDim.x) {
		int64_t i = l / hd, d = l % hd;

		if (i < tile.n)
			p.out[(tile.row + i) * p.out_stride + h * hd + d] =
				acc[i * pitch + d] / with_sink(p, h, lrow[i], mrow[i]);
	}
}

extern "C" int gpurt_attn_prefill(struct gpurt *rt, const struct loom_attention_args *a,
				  const struct gpu_attn_tile *tiles, int64_t n_tiles)
{
	const int64_t pitch = a->head_dim + 1;
	size_t smem = ((size_t)(2 * GPU_ATTN_TILE_Q + 2 * TILE_KV) * pitch +
		       GPU_ATTN_TILE_Q * TILE_KV + 3 * GPU_ATTN_TILE_Q) * sizeof(float);

	BIND(rt);

	/* no tiles: every row goes to split-K (heads wider than the tiled
	 * kernel takes, such as Gemma 3's 256, always do) */
	if (n_tiles == 0)
		return LOOM_OK;
	if (n_tiles > INT32_MAX || a->n_heads > MAX_GRID ||
	    a->head_dim > GPU_ATTN_PREFILL_MAX_HEAD_DIM) {
		snprintf(rt->err, sizeof(rt->err), "attention: prefill shape beyond grid limits");
		return LOOM_ERR_UNSUPPORTED;
	}
	GPU_LAUNCH(k_attn_prefill, dim3((unsigned)n_tiles, (unsigned)a->n_heads), ATTN_THREADS, smem,
		rt->stream, attn_params(a), tiles);
	return launched(rt, "attention prefill kernel");
}

/*
 * Split-K decode: block (item, group chunk, split) takes the split's
 * GPU_ATTN_SPLIT keys of one query row for up to DEC_HEADS query heads that
 * share one KV head (a GQA group, or a chunk of a larger one), so K and V
 * are read once for all of them. Keys stream through shared memory in
 * tiles of DEC_TILE_VALS values, dequantized to f32 there (f32 caches by
 * 16-byte loads where aligned; q8_0/q4_0 one 32-value block a thread);
 * then
 *   - scores: one thread per (head, key) of the tile, a serial dot over
 *     head_dim (ref.so's order);
 *   - per head (one warp each) the maximum m, weights exp(score - m) and
 *     their sum l;
 *   - values: threads over (head, dimension) and, when those are fewer
 *     than the block, over KQ interleaved key subsets as well, summed in a
 *     fixed order at the end.
 * Each head writes partial [m, l, acc[head_dim]]; a split past the row's
 * last key writes m = -inf, l = 0. The split boundaries depend only on the
 * row's own key range, so a row's result never depends on the rest of the
 * batch. A token-tree row (p.tree) reads the key at position t from the
 * cache index its chain record gives (dec_row), so it computes exactly
 * what a causal row at its position over the same keys does. Index arithmetic is 32-bit except one 64-bit multiply per key for
 * its cache row. The result does not depend on the warp width.
 */
#define DEC_THREADS 256
#define DEC_HEADS 8	     /* query heads a block serves */
#define DEC_TILE_VALS 4096   /* values of K or V a tile stages (16 KiB) */
#define DEC_ACC (DEC_HEADS * GPU_ATTN_MAX_HEAD_DIM / DEC_THREADS)

struct dec_shape {
	int hd, pitch, tk; /* head_dim, shared row pitch, keys per tile */
	int gsize, chunks; /* query heads per KV head; chunks of DEC_HEADS */
};

static struct dec_shape dec_shape_of(const struct loom_attention_args *a)
{
	struct dec_shape sh;

	sh.hd = (int)a->head_dim;
	sh.pitch = sh.hd + 1;
	sh.tk = DEC_TILE_VALS / sh.hd;
	sh.gsize = (int)(a->n_heads / a->n_kv_heads);
	sh.chunks = (sh.gsize + DEC_HEADS - 1) / DEC_HEADS;
	return sh;
}

static size_t dec_shared_bytes(const struct dec_shape &sh)
{
	return ((size_t)DEC_HEADS * sh.hd + (size_t)sh.tk * sh.pitch +
		(size_t)DEC_HEADS * GPU_ATTN_SPLIT + DEC_THREADS + 2 * DEC_HEADS) * sizeof(float);
}

/* Cache row (all KV heads) of the key at position t of sequence seq; chain:
 * the row's chain record in the tree table (token trees), NULL for a
 * causal row. */
__device__ __forceinline__ const uint8_t *dec_row(const struct attn_p &p, const float *cache,
						  int32_t seq, uint32_t t, const int32_t *chain)
{
	const uint32_t bs = (uint32_t)p.block_size;

	if (chain && t >= (uint32_t)chain[0])
		t = (uint32_t)chain[1 + (t - (uint32_t)chain[0])];
	const int32_t block = p.block_table[(int64_t)seq * p.max_blocks + t / bs];
	const int64_t slot = (int64_t)block * bs + t % bs;

	return (const uint8_t *)cache + slot * p.row_bytes;
}

/* tile[k][0..hd) = head kvh of keys t0 .. t0 + n - 1, as f32. */
__device__ void dec_stage(const struct attn_p &p, const struct dec_shape &sh, const float *cache,
			  int32_t seq, const int32_t *chain, uint32_t t0, int n, int kvh, bool vec,
			  float *tile)
{
	const int hd = sh.hd;

	if (p.kv_type == LOOM_TYPE_F32 && vec) {
		const int n4 = hd / 4;

		for (int i = threadIdx.x; i < n * n4; i += blockDim.x) {
			const int k = i / n4, c = i % n4;
			const uint4 v = ((const uint4 *)(dec_row(p, cache, seq, t0 + k, chain)) +
					 (kvh * hd) / 4)[c];
			float *o = tile + k * sh.pitch + 4 * c;

			o[0] = __uint_as_float(v.x), o[1] = __uint_as_float(v.y);
			o[2] = __uint_as_float(v.z), o[3] = __uint_as_float(v.w);
		}
		return;
	}
	if (p.kv_type == LOOM_TYPE_F32) {
		for (int i = threadIdx.x; i < n * hd; i += blockDim.x) {
			const int k = i / hd, d = i % hd;

			tile[k * sh.pitch + d] =
				((const float *)dec_row(p, cache, seq, t0 + k, chain))[kvh * hd + d];
		}
		return;
	}
	/* f16 takes any head_dim (a head of 16 has no whole 32-value block:
	 * the block loop below would stage nothing), so value by value */
	if (p.kv_type == LOOM_TYPE_F16) {
		for (int i = threadIdx.x; i < n * hd; i += blockDim.x) {
			const int k = i / hd, d = i % hd;

			const uint8_t *row = dec_row(p, cache, seq, t0 + k, chain);

			tile[k * sh.pitch + d] = loom_kvq_value(p.kv_type, row, kvh * hd + d);
		}
		return;
	}
	{
		const int nu = hd / LOOM_KVQ_BLOCK; /* whole blocks: loom_check_kv_type */

		for (int i = threadIdx.x; i < n * nu; i += blockDim.x) {
			const int k = i / nu, u = i % nu;
			const uint8_t *row = dec_row(p, cache, seq, t0 + k, chain);
			float *o = tile + k * sh.pitch + u * LOOM_KVQ_BLOCK;

			for (int j = 0; j < LOOM_KVQ_BLOCK; j++)
				o[j] = loom_kvq_value(p.kv_type, row,
						      kvh * hd + u * LOOM_KVQ_BLOCK + j);
		}
	}
}

/* m and l of each head over its n scores, the scores turned into weights. */
__device__ void dec_softmax(float *sc, int gn, int n, float *mrow, float *lrow)
{
	const int lane = threadIdx.x % GPU_WARP, nw = blockDim.x / GPU_WARP;

	for (int g = threadIdx.x / GPU_WARP; g < gn; g += nw) {
		float *s = sc + g * GPU_ATTN_SPLIT, mx = -INFINITY, sum = 0.0f;

		for (int k = lane; k < n; k += GPU_WARP)
			mx = fmaxf(mx, s[k]);
		mx = warp_max(mx);
		for (int k = lane; k < n; k += GPU_WARP) {
			s[k] = expf(s[k] - mx);
			sum += s[k];
		}
		sum = warp_sum(sum);
		if (lane == 0) {
			mrow[g] = mx;
			lrow[g] = sum;
		}
	}
}

/* acc += the tile's tn values weighted by w (head g's weights at w + g *
 * GPU_ATTN_SPLIT). Output o = (head, dimension) of n_out; with kq > 1
 * thread t takes output t % n_out over keys t / n_out, + kq, ..., else
 * outputs t, t + DEC_THREADS, ... over every key. */
__device__ __forceinline__ void dec_values(const float *w, const float *tile,
					   const struct dec_shape &sh, int tn, int n_out, int kq,
					   float *acc)
{
	const int t = threadIdx.x;

	if (kq > 1) {
		const int o = t % n_out, g = o / sh.hd, d = o % sh.hd;

		if (t < kq * n_out)
			for (int k = t / n_out; k < tn; k += kq)
				acc[0] += w[g * GPU_ATTN_SPLIT + k] * tile[k * sh.pitch + d];
		return;
	}
	for (int j = 0; j < DEC_ACC; j++) {
		const int o = t + j * DEC_THREADS, g = o / sh.hd, d = o % sh.hd;
		float a;

		if (o >= n_out)
			break;
		a = acc[j];
		for (int k = 0; k < tn; k++)
			a += w[g * GPU_ATTN_SPLIT + k] * tile[k * sh.pitch + d];
		acc[j] = a;
	}
}

__global__ void __launch_bounds__(DEC_THREADS)
k_attn_split(const struct attn_p p, const struct dec_shape sh, bool vec,
	     const struct gpu_attn_row *items, int32_t n_splits, float *partial)
{
	GPU_DYNAMIC_SHARED(float, sm);
	const struct gpu_attn_row it = items[blockIdx.x];
	const int hd = sh.hd, kvh = blockIdx.y / sh.chunks;
	const int g0 = (blockIdx.y % sh.chunks) * DEC_HEADS;
	const int gn = sh.gsize - g0 < DEC_HEADS ? sh.gsize - g0 : DEC_HEADS;
	const int h0 = kvh * sh.gsize + g0, n_out = gn * hd;
	const int kq = n_out < DEC_THREADS ? DEC_THREADS / n_out : 1;
	const uint32_t t0 = (uint32_t)it.lo + blockIdx.z * GPU_ATTN_SPLIT;
	const uint32_t end = (uint32_t)it.pos + 1;
	const int n = t0 >= end ? 0 : (end - t0 < GPU_ATTN_SPLIT ? (int)(end - t0) : GPU_ATTN_SPLIT);
	const int32_t *chain = p.tree && p.tree[it.row] >= 0 ? p.tree + p.tree[it.row] : NULL;
	float *qs = sm, *tile = qs + DEC_HEADS * hd, *sc = tile + sh.tk * sh.pitch;
	float *red = sc + DEC_HEADS * GPU_ATTN_SPLIT, *mrow = red + DEC_THREADS, *lrow = mrow + DEC_HEADS;
	float acc[DEC_ACC];
	const int t = threadIdx.x;

	for (int i = t; i < n_out; i += blockDim.x)
		qs[i] = n ? p.q[(int64_t)it.row * p.q_stride + (int64_t)h0 * hd + i] : 0.0f;
	for (int k0 = 0; k0 < n; k0 += sh.tk) {
		const int tn = n - k0 < sh.tk ? n - k0 : sh.tk;

		__syncthreads(); /* qs written, previous tile consumed */
		dec_stage(p, sh, p.kc, it.seq, chain, t0 + k0, tn, kvh, vec, tile);
		__syncthreads();
		for (int i = t; i < gn * tn; i += blockDim.x) {
			const int g = i / tn, k = i % tn;
			const float *qv = qs + g * hd, *kv = tile + k * sh.pitch;
			float dot = 0.0f;

			for (int d = 0; d < hd; d++)
				dot += qv[d] * kv[d];
			sc[g * GPU_ATTN_SPLIT + k0 + k] = cap(p, p.scale * dot);
		}
	}
	__syncthreads();
	dec_softmax(sc, gn, n, mrow, lrow);
	for (int j = 0; j < DEC_ACC; j++)
		acc[j] = 0.0f;
	for (int k0 = 0; k0 < n; k0 += sh.tk) {
		const int tn = n - k0 < sh.tk ? n - k0 : sh.tk;

		__syncthreads(); /* weights final, previous tile consumed */
		dec_stage(p, sh, p.vc, it.seq, chain, t0 + k0, tn, kvh, vec, tile);
		__syncthreads();
		dec_values(sc + k0, tile, sh, tn, n_out, kq, acc);
	}
	__syncthreads();
	if (kq > 1) { /* the key subsets' sums, added in subset order */
		if (t < kq * n_out)
			red[t] = acc[0];
		__syncthreads();
		if (t < n_out) {
			acc[0] = red[t];
			for (int s = 1; s < kq; s++)
				acc[0] += red[s * n_out + t];
		}
	}
	for (int j = 0; j < DEC_ACC; j++) {
		const int o = t + j * DEC_THREADS, g = o / hd;
		float *po;

		if (o >= n_out)
			break;
		po = partial + (((int64_t)blockIdx.x * p.n_heads + h0 + g) * n_splits + blockIdx.z) *
			       (hd + 2);
		po[2 + o % hd] = n ? acc[j] : 0.0f;
		if (o % hd == 0) {
			po[0] = n ? mrow[g] : -INFINITY;
			po[1] = n ? lrow[g] : 0.0f;
		}
	}
}

/* out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, M the largest m_s
 * (the row's largest score); a sink adds e^(sink - M) to the denominator. */
__global__ void __launch_bounds__(ATTN_THREADS)
k_attn_combine(const struct attn_p p, const struct gpu_attn_row *items, int64_t n_splits,
	       const float *partial)
{
	const struct gpu_attn_row it = items[blockIdx.x];
	const int64_t h = blockIdx.y, hd = p.head_dim;
	const float *pi = partial + ((int64_t)blockIdx.x * p.n_heads + h) * n_splits * (hd + 2);
	float big = -INFINITY, den = 0.0f;

	for (int64_t s = 0; s < n_splits; s++)
		big = fmaxf(big, pi[s * (hd + 2)]);
	for (int64_t s = 0; s < n_splits; s++)
		if (pi[s * (hd + 2)] != -INFINITY)
			den += expf(pi[s * (hd + 2)] - big) * pi[s * (hd + 2) + 1];
	den = with_sink(p, h, den, big);
	for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
		float num = 0.0f;

		for (int64_t s = 0; s < n_splits; s++)
			if (pi[s * (hd + 2)] != -INFINITY)
				num += expf(pi[s * (hd + 2)] - big) * pi[s * (hd + 2) + 2 + d];
		p.out[(int64_t)it.row * p.out_stride + h * hd + d] = num / den;
	}
}

extern "C" int gpurt_attn_split(struct gpurt *rt, const struct loom_attention_args *a,
				const struct gpu_attn_row *items, int64_t n_items,
				int64_t n_splits, const int32_t *tree, float *partial)
{
	struct attn_p p = attn_params(a);
	struct dec_shape sh;
	bool vec;
	int rc;

	BIND(rt);

	if (n_items > INT32_MAX || a->n_heads > MAX_GRID || n_splits > MAX_GRID ||
	    a->head_dim > GPU_ATTN_MAX_HEAD_DIM || a->head_dim < 1) {
		snprintf(rt->err, sizeof(rt->err), "attention: split shape beyond grid limits");
		return LOOM_ERR_UNSUPPORTED;
	}
	if (n_items == 0)
		return LOOM_OK;
	sh = dec_shape_of(a);
	p.tree = tree;
	/* 16-byte loads: every head's values start 16-byte aligned */
	vec = sh.hd % 4 == 0 && (uintptr_t)a->kcache % 16 == 0 && (uintptr_t)a->vcache % 16 == 0;
	GPU_LAUNCH(k_attn_split,
		dim3((unsigned)n_items, (unsigned)(a->n_kv_heads * sh.chunks), (unsigned)n_splits),
		DEC_THREADS, dec_shared_bytes(sh), rt->stream, p, sh, vec, items, (int32_t)n_splits,
		partial);
	rc = launched(rt, "attention split kernel");
	if (rc)
		return rc;
	GPU_LAUNCH(k_attn_combine, dim3((unsigned)n_items, (unsigned)a->n_heads), ATTN_THREADS, 0,
		rt->stream, p, items, n_splits, partial);
	return launched(rt, "attention combine kernel");
}

/* ---- routed experts (the moe slot, gpu.c's exec_moe) ---- */

/* Each row's experts and weights by loom/moe.h's rule (one thread a row;
 * p: n_expert floats of scratch a row). ids and w: [rows][n_used]. */
__global__ void __launch_bounds__(THREADS)
k_moe_route(const struct gpurt_moe_route p)
{
	const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (r >= p.rows)
		return;
	loom_moe_route_as(p.gating, p.logits + r * p.logits_stride, p.n_expert, p.n_used,
			  p.norm != 0, p.p + r * p.n_expert, p.ids + r * p.n_used,
			  p.w + r * p.n_used);
}

/* Slots (row r's j-th choice is slot r * n_used + j) grouped by expert:
 * expert e's slots, ascending, are order[start[e] .. start[e + 1]). One
 * block; a thread counts, then lists, its experts' slots. */
__global__ void __launch_bounds__(THREADS)
k_moe_group(const struct gpurt_moe_route p)
{
	const int64_t slots = p.rows * p.n_used;

	for (int64_t e = threadIdx.x; e < p.n_expert; e += blockDim.x) {
		int32_t n = 0;

		for (int64_t s = 0; s < slots; s++)
			n += p.ids[s] == e;
		p.start[e + 1] = n;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		p.start[0] = 0;
		for (int64_t e = 0; e < p.n_expert; e++)
			p.start[e + 1] += p.start[e];
	}
	__syncthreads();
	for (int64_t e = threadIdx.x; e < p.n_expert; e += blockDim.x) {
		int32_t o = p.start[e];

		for (int64_t s = 0; s < slots; s++)
			if (p.ids[s] == e)
				p.order[o++] = (int32_t)s;
	}
}

extern "C" int gpurt_moe_route(struct gpurt *rt, const struct gpurt_moe_route *a)
{
	const struct gpurt_moe_route p = *a; /* by value: a capture keeps it */

	BIND(rt);
	if (p.rows <= 0)
		return LOOM_OK;
	GPU_LAUNCH(k_moe_route, grid_of((p.rows + THREADS - 1) / THREADS), THREADS, 0, rt->stream,
		p);
	if (launched(rt, "moe route kernel"))
		return LOOM_ERR_DEVICE;
	GPU_LAUNCH(k_moe_group, 1, THREADS, 0, rt->stream, p);
	return launched(rt, "moe group kernel");
}

/* The activation rows of a pass over an expert's slots: slot s reads
 * row s / div of x (slot_rows: its f32 row; slot_index: its index, for
 * the 8-bit activations). */
struct slot_rows {
	const float *x;
	int64_t stride, div;
	const int32_t *slot;
	__device__ __forceinline__ const float *operator()(int ii) const
	{
		return x + (slot[ii] / div) * stride;
	}
};

struct slot_index {
	int64_t div;
	const int32_t *slot;
	__device__ __forceinline__ int64_t operator()(int ii) const
	{
		return slot[ii] / div;
	}
};

/*
 * Block (b, e): expert e's weight rows j of block b (a warp each, as the
 * GEMV groups) over every slot of e, GEMV_MB slots a pass, each output
 * computed as gpurt_gemv (dots_rows) or, Q8, gpurt_gemv_q8 (dots_q8_rows)
 * computes it, then its bias added.
 */
template <uint32_t T, bool Q8>
__global__ void __launch_bounds__(THREADS) k_moe_gemv(const struct gpurt_moe_gemv p)
{
	const int lane = threadIdx.x % GPU_WARP, nw = blockDim.x / GPU_WARP;
	const int64_t e = blockIdx.y, s0 = p.start[e], s1 = p.start[e + 1];
	const int64_t parts = is_plain(T) ? (p.k + 7) / 8 : p.k / 8;

	for (int r = threadIdx.x / GPU_WARP; r < GEMV_ROWS && s0 < s1; r += nw) {
		const int64_t j = (int64_t)blockIdx.x * GEMV_ROWS + r;
		const uint8_t *row = (const uint8_t *)p.w[e] + j * p.w_stride;

		if (j >= p.n)
			return;
		for (int64_t i0 = s0; i0 < s1; i0 += GEMV_MB) {
			const int mb = s1 - i0 < GEMV_MB ? (int)(s1 - i0) : GEMV_MB;
			float acc[GEMV_MB] = { 0.0f };

			if constexpr (Q8)
				dots_q8_rows<T, GEMV_MB>(row, p.k, p.xq,
							 (const struct q8_scale *)p.xs,
							 slot_index{ p.x_div, p.order + i0 }, mb,
							 acc);
			else
				dots_rows<T, GEMV_MB>(row, parts, p.k,
						      slot_rows{ p.x, p.x_stride, p.x_div,
								 p.order + i0 },
						      mb, acc);
			for (int ii = 0; ii < GEMV_MB; ii++) {
				float sum;

				if (ii >= mb)
					break;
				sum = warp_sum(acc[ii]);
				if (lane == 0)
					p.y[p.order[i0 + ii] * p.y_stride + j] =
						p.bias ? sum + p.bias[e * p.n + j] : sum;
			}
		}
	}
}

template <uint32_t T, bool Q8>
static void launch_moe_gemv_as(gpuStream_t s, const struct gpurt_moe_gemv p)
{
	void (*kernel)(const struct gpurt_moe_gemv) = k_moe_gemv<T, Q8>;

	GPU_LAUNCH(kernel, dim3(grid_of((p.n + GEMV_ROWS - 1) / GEMV_ROWS), (unsigned)p.n_expert),
		THREADS, 0, s, p);
}

template <uint32_t T> static void launch_moe_gemv(gpuStream_t s, const struct gpurt_moe_gemv p)
{
	launch_moe_gemv_as<T, false>(s, p);
}

template <uint32_t T>
static void launch_moe_gemv_q8(gpuStream_t s, const struct gpurt_moe_gemv p)
{
	launch_moe_gemv_as<T, true>(s, p);
}

typedef void (*moe_launch)(gpuStream_t, const struct gpurt_moe_gemv);

/* The launcher for weights of type t: exact (every format) or fast (the
 * formats with integer units). */
static moe_launch moe_for(uint32_t t, bool q8)
{
	if (q8) {
		switch (t) {
#define FORMAT_FN launch_moe_gemv_q8
			GPU_Q8_FORMATS(FORMAT_CASE)
#undef FORMAT_FN
		default:
			return NULL;
		}
	}
	switch (t) {
#define FORMAT_FN launch_moe_gemv
		GPU_FORMATS(FORMAT_CASE)
#undef FORMAT_FN
	default:
		return NULL;
	}
}

extern "C" int gpurt_moe_gemv(struct gpurt *rt, const struct gpurt_moe_gemv *g)
{
	moe_launch launch = moe_for(g->type, g->xq != NULL);

	BIND(rt);
	if (!launch)
		return unknown_format(rt, "moe", g->type);
	if ((g->n + GEMV_ROWS - 1) / GEMV_ROWS > MAX_GRID || g->n_expert > MAX_GRID) {
		snprintf(rt->err, sizeof(rt->err), "moe: n %lld beyond grid limits", (long long)g->n);
		return LOOM_ERR_UNSUPPORTED;
	}
	launch(rt->stream, *g);
	return launched(rt, "moe gemv kernel");
}

/* y[r] = w_0 d_0 + w_1 d_1 + ... in choice order (slot r * k + j's d),
 * each product rounded alone: ref.so's sum. */
__global__ void __launch_bounds__(THREADS)
k_moe_combine(float *y, int64_t y_stride, const float *d, const float *w, int64_t rows,
	      int64_t k, int64_t n)
{
	FOR_ELEMENTS(r, i, rows, n) {
		float acc = mul_rn(w[r * k], d[r * k * n + i]);

		for (int64_t j = 1; j < k; j++)
			acc = acc + mul_rn(w[r * k + j], d[(r * k + j) * n + i]);
		y[r * y_stride + i] = acc;
	}
}

extern "C" int gpurt_moe_combine(struct gpurt *rt, float *y, int64_t y_stride, const float *d,
				 const float *w, int64_t rows, int64_t k, int64_t n)
{
	BIND(rt);
	GPU_LAUNCH(k_moe_combine, grid_2d(rows, n), THREADS, 0, rt->stream, y, y_stride, d, w, rows,
		k, n);
	return launched(rt, "moe combine kernel");
}

/* y[r] += sigmoid(s[r]) * d[r]: the shared expert, gated (Qwen2-MoE). */
__global__ void __launch_bounds__(THREADS)
k_moe_shared(float *y, int64_t y_stride, const float *s, const float *d, int64_t rows, int64_t n)
{
	FOR_ELEMENTS(r, i, rows, n)
		y[r * y_stride + i] = y[r * y_stride + i] + mul_rn(loom_moe_sigmoid(s[r]), d[r * n + i]);
}

extern "C" int gpurt_moe_shared(struct gpurt *rt, float *y, int64_t y_stride, const float *s,
				const float *d, int64_t rows, int64_t n)
{
	BIND(rt);
	GPU_LAUNCH(k_moe_shared, grid_2d(rows, n), THREADS, 0, rt->stream, y, y_stride, s, d, rows, n);
	return launched(rt, "moe shared kernel");
}

/* ---- collectives (gpu_coll.c) ---- */

__global__ void __launch_bounds__(THREADS)
k_copy_cols(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
	    int64_t cols)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
			dst[r * dst_stride + i] = src[r * src_stride + i];
}

extern "C" int gpurt_copy_cols(struct gpurt *rt, float *dst, int64_t dst_stride, const float *src,
			       int64_t src_stride, int64_t rows, int64_t cols)
{
	BIND(rt);
	if (rows == 0 || cols == 0)
		return LOOM_OK;
	GPU_LAUNCH(k_copy_cols, grid_of(rows), THREADS, 0, rt->stream, dst, dst_stride, src,
		src_stride, rows, cols);
	return launched(rt, "column copy kernel");
}

/* One thread per element adds the parts in rank order: the same sums,
 * bit for bit, on every rank that runs it on the same parts. */
__global__ void __launch_bounds__(THREADS)
k_sum_parts(float *y, int64_t y_stride, const float *p, int64_t p_stride, int64_t part_floats,
	    int n_parts, int64_t rows, int64_t cols)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
			const float *e = p + r * p_stride + i;
			float s = e[0];

			for (int k = 1; k < n_parts; k++)
				s += e[k * part_floats];
			y[r * y_stride + i] = s;
		}
}

extern "C" int gpurt_sum_parts(struct gpurt *rt, float *y, int64_t y_stride, const float *p,
			       int64_t p_stride, int64_t part_floats, int n_parts, int64_t rows,
			       int64_t cols)
{
	BIND(rt);
	if (rows == 0 || cols == 0)
		return LOOM_OK;
	GPU_LAUNCH(k_sum_parts, grid_of(rows), THREADS, 0, rt->stream, y, y_stride, p, p_stride,
		part_floats, n_parts, rows, cols);
	return launched(rt, "rank-order sum kernel");
}

#ifdef GPU_HAVE_NCCL

struct gpurt_comm {
	ncclComm_t nccl;
};

static_assert(sizeof(ncclUniqueId) == GPURT_COMM_ID_BYTES, "NCCL's unique id size");

static int nccl_failed(struct gpurt *rt, const char *what, ncclResult_t r)
{
	snprintf(rt->err, sizeof(rt->err), "NCCL: %s: %s", what, ncclGetErrorString(r));
	return LOOM_ERR_DEVICE;
}

extern "C" bool gpurt_has_comm(void)
{
	return true;
}

extern "C" int gpurt_comm_id(struct gpurt *rt, unsigned char id[GPURT_COMM_ID_BYTES])
{
	ncclUniqueId u;
	ncclResult_t r;

	BIND(rt);
	r = ncclGetUniqueId(&u);
	if (r != ncclSuccess)
		return nccl_failed(rt, "unique id", r);
	memcpy(id, &u, sizeof(u));
	return LOOM_OK;
}

extern "C" int gpurt_comm_open(struct gpurt *rt, const unsigned char id[GPURT_COMM_ID_BYTES],
			       int n_ranks, int rank, void *mpi_comm, struct gpurt_comm **out)
{
	struct gpurt_comm *c;
	ncclUniqueId u;
	ncclResult_t r;

	*out = NULL;
	BIND(rt);
	c = (struct gpurt_comm *)calloc(1, sizeof(*c));
	if (!c)
		return LOOM_ERR_NOMEM;
	memcpy(&u, id, sizeof(u));
	(void)mpi_comm; /* NCCL (not the emulator) connects through the id alone */
	r = gpuCommInitRank(&c->nccl, n_ranks, u, rank, mpi_comm);
	if (r != ncclSuccess) {
		free(c);
		return nccl_failed(rt, "joining the communicator", r);
	}
	*out = c;
	return LOOM_OK;
}

extern "C" void gpurt_comm_close(struct gpurt *rt, struct gpurt_comm *c)
{
	if (!c)
		return;
	drain(rt);
	(void)ncclCommDestroy(c->nccl); /* teardown: nothing to undo */
	free(c);
}

extern "C" int gpurt_all_gather(struct gpurt *rt, struct gpurt_comm *c, const float *send,
				float *recv, size_t count)
{
	ncclResult_t r;

	BIND(rt);
	r = ncclAllGather(send, recv, count, ncclFloat32, c->nccl, rt->stream);
	return r == ncclSuccess ? LOOM_OK : nccl_failed(rt, "all-gather", r);
}

#else /* no collective library: rocm.so (no RCCL), emulators without MPI */

extern "C" bool gpurt_has_comm(void)
{
	return false;
}

static int no_comm(struct gpurt *rt)
{
	snprintf(rt->err, sizeof(rt->err), "%s: built without a collective library",
		 GPU_VENDOR);
	return LOOM_ERR_UNSUPPORTED;
}

extern "C" int gpurt_comm_id(struct gpurt *rt, unsigned char id[GPURT_COMM_ID_BYTES])
{
	(void)id;
	return no_comm(rt);
}

extern "C" int gpurt_comm_open(struct gpurt *rt, const unsigned char id[GPURT_COMM_ID_BYTES],
			       int n_ranks, int rank, void *mpi_comm, struct gpurt_comm **out)
{
	(void)id, (void)n_ranks, (void)rank, (void)mpi_comm;
	*out = NULL;
	return no_comm(rt);
}

extern "C" void gpurt_comm_close(struct gpurt *rt, struct gpurt_comm *c)
{
	(void)rt, (void)c;
}

extern "C" int gpurt_all_gather(struct gpurt *rt, struct gpurt_comm *c, const float *send,
				float *recv, size_t count)
{
	(void)c, (void)send, (void)recv, (void)count;
	return no_comm(rt);
}

#endif /* GPU_HAVE_NCCL */
