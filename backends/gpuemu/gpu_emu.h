/*
 * gpu_emu.h: a host-side stand-in for the CUDA/HIP device model, so that
 * kernels.cu runs unchanged (as C++) on the CPU. It exists to test the GPU
 * kernels where no GPU is available: tests load the resulting gpuemu.so and
 * gpuemu64.so like any backend and hold them to the conformance suite. It
 * is not a product backend and is never installed.
 *
 * What is emulated:
 *  - a block is blockDim threads, each a fiber with its own stack; the
 *    blocks of a launch are spread over a few OS threads;
 *  - __shared__ is per OS thread (static thread_local), which is per block
 *    since one OS thread runs one block at a time;
 *  - __syncthreads() waits for every live thread of the block; a warp
 *    shuffle waits for every live lane of the warp (GPU_WARP wide, set at
 *    compile time to 32 or 64 as on the real targets). A barrier no thread
 *    can pass (threads of a block or a warp waiting at different barriers)
 *    is reported as a launch error instead of hanging;
 *  - the runtime API (devices, memory, streams) over host memory; launches
 *    run to completion before GPU_LAUNCH returns, so a stream is trivially
 *    in order;
 *  - stream capture and graphs: while a stream captures, launches, device
 *    to device copies and cuBLAS calls on it are recorded (arguments by
 *    value, as a real capture bakes them in) and run again by each
 *    gpuGraphLaunch. What a capture may not contain fails as on the
 *    hardware and invalidates the capture: synchronizing, copies to or
 *    from host memory, allocating or freeing while capturing;
 *  - with GPU_EMU_BLAS, the cuBLAS calls kernels.cu makes (Sgemm; GemmEx
 *    on f16 inputs with f32 output), computed
 *    from their documented column-major definition, so the argument
 *    mapping of the CUDA build is exercised too.
 *
 *  - with GPU_EMU_NCCL (builds with MPI), the NCCL calls kernels.cu makes
 *    (unique id, communicator, f32 all-gather), over the host's MPI
 *    communicator, so gpu_coll.c's collectives run under mpirun.
 *
 * Not emulated: timing, memory-model races between threads that a missing
 * barrier would expose on hardware (threads switch only at barriers here),
 * device limits other than the grid and block sizes.
 *
 * Environment: LOOM_GPUEMU_DEVICES=0 makes the runtime report no device
 * (to test refusal at load); LOOM_GPUEMU_MEM_MB caps device memory;
 * LOOM_GPUEMU_THREADS sets the number of OS threads running blocks;
 * LOOM_GPUEMU_CAPTURE=0 refuses stream capture.
 */
#ifndef LOOM_GPU_EMU_H
#define LOOM_GPU_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#define GPU_VENDOR "emulator"

#ifndef GPU_WARP
#define GPU_WARP 32
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static thread_local

struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* The thread and block being run on this OS thread. */
struct emu_thread_regs {
	dim3 tid;
};
struct emu_block_regs {
	dim3 bid, bdim, gdim;
};
extern thread_local emu_thread_regs *emu_cur;
extern thread_local emu_block_regs *emu_blk;

#define threadIdx (emu_cur->tid)
#define blockIdx (emu_blk->bid)
#define blockDim (emu_blk->bdim)
#define gridDim (emu_blk->gdim)

void emu_syncthreads(void);
uint64_t emu_shfl_xor_u64(uint64_t v, int mask);
void *emu_dynamic_shared(void);

#define __syncthreads() emu_syncthreads()

template <typename T> inline T emu_shfl_xor(T v, int mask)
{
	static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of at most 8 bytes");
	uint64_t in = 0, out;
	T r;

	memcpy(&in, &v, sizeof(v));
	out = emu_shfl_xor_u64(in, mask);
	memcpy(&r, &out, sizeof(r));
	return r;
}
#define gpu_shfl_xor(v, m) emu_shfl_xor((v), (m))

/* CUDA's 16-byte vector, for 128-bit loads. */
struct alignas(16) uint4 {
	unsigned x, y, z, w;
};

/* CUDA's __dp4a: c plus the four products of a's and b's signed bytes. */
inline int __dp4a(int a, int b, int c)
{
	for (int i = 0; i < 4; i++)
		c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
	return c;
}

/*
 * A warp exchange whose result the warp shares: every live lane passes
 * `bytes` (at most EMU_GATHER_BYTES, the same on every lane) at mine;
 * once all have, each gets the warp's buffer: every lane's bytes in lane
 * order (zeros for a lane that is not live), then EMU_WARP_SCRATCH bytes
 * of scratch. *first is set on exactly one lane, the first to run on; it
 * may compute in the buffer what the others, which run after it, read.
 * The buffer is the warp's until its next exchange.
 */
#define EMU_GATHER_BYTES 64
#define EMU_WARP_SCRATCH 4096
unsigned char *emu_warp_gather(const void *mine, size_t bytes, unsigned *lane, bool *first);

/*
 * The xor butterfly `for (off = FIRST; off > 0; off /= 2) v = op(v,
 * shfl_xor(v, off))` of every live lane, with one warp exchange in place
 * of log2(FIRST) + 1 shuffles: the first lane to run takes every lane's
 * steps on the gathered values, the others read their result. The same
 * operations on the same operands in the same order, so the same bits (a
 * lane that is not live gives zeros here, where a shuffle would read its
 * last value; the kernels reduce whole warps).
 */
template <int FIRST, typename T, typename Op> inline T emu_xor_reduce(T v, Op op)
{
	unsigned lane;
	bool first;
	T *all = (T *)emu_warp_gather(&v, sizeof(v), &lane, &first);

	if (first)
		for (int off = FIRST; off > 0; off /= 2)
			for (int l = 0; l < GPU_WARP; l++)
				if (!(l & off)) {
					T a = all[l], b = all[l ^ off];

					all[l] = op(a, b);      /* lane l: op(own, partner) */
					all[l ^ off] = op(b, a);
				}
	return all[lane];
}

#if GPU_WARP == 32
/* mma.sync.aligned.m16n8k<k>.row.col.s32.s8.s8.s32 (k 16 or 32) as the
 * PTX ISA defines it: d = a b + c over the warp's fragments (a: k / 8
 * registers, b: k / 16). See gpu_emu.cc. */
void emu_mma_s8(int k, int32_t d[4], const uint32_t *a, const uint32_t *b, const int32_t c[4]);
#endif

inline float __uint_as_float(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

inline uint32_t __float_as_uint(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/* CUDA's atomicAdd on a 32-bit counter (shared or device memory). */
inline unsigned atomicAdd(unsigned *p, unsigned v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

/* And on a 64-bit one (integer masses of the sample kernel). */
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

/* ---- runtime ---- */

enum emu_error {
	emuSuccess = 0,
	emuErrorInvalidValue = 1,
	emuErrorMemoryAllocation = 2,
	emuErrorNoDevice = 100,
	emuErrorInvalidDevice = 101,
	emuErrorLaunchFailure = 719,
	emuErrorStreamCaptureUnsupported = 900,
	emuErrorStreamCaptureInvalidated = 901,
};
typedef enum emu_error gpuError_t;
typedef struct emu_stream *gpuStream_t;
struct emu_device_prop {
	char name[256];
	int warpSize;
	size_t totalGlobalMem;
};
typedef struct emu_device_prop gpuDeviceProp;
enum emu_copy_kind { emuHostToDevice, emuDeviceToHost, emuDeviceToDevice };

#define gpuSuccess emuSuccess
#define gpuErrorMemoryAllocation emuErrorMemoryAllocation
#define gpuMemcpyHostToDevice emuHostToDevice
#define gpuMemcpyDeviceToHost emuDeviceToHost
#define gpuMemcpyDeviceToDevice emuDeviceToDevice
#define gpuStreamNonBlocking 1u

const char *gpuGetErrorString(gpuError_t e);
gpuError_t gpuGetLastError(void);
gpuError_t gpuGetDeviceCount(int *n);
gpuError_t gpuSetDevice(int d);
gpuError_t gpuGetDeviceProperties(gpuDeviceProp *p, int d);
gpuError_t gpuMemGetInfo(size_t *avail, size_t *total);
gpuError_t gpuMalloc(void **p, size_t n);
gpuError_t gpuFree(void *p);
gpuError_t gpuMallocHost(void **p, size_t n);
gpuError_t gpuFreeHost(void *p);
gpuError_t gpuMemcpyAsync(void *dst, const void *src, size_t n, enum emu_copy_kind kind,
			  gpuStream_t s);
gpuError_t gpuStreamCreateWithFlags(gpuStream_t *s, unsigned flags);
gpuError_t gpuStreamDestroy(gpuStream_t s);
gpuError_t gpuStreamSynchronize(gpuStream_t s);

/* Graphs: a capture is the list of work recorded on a stream. */
typedef struct emu_graph *gpuGraph_t;
typedef struct emu_graph *gpuGraphExec_t;
gpuError_t gpuStreamBeginCapture(gpuStream_t s);
gpuError_t gpuStreamEndCapture(gpuStream_t s, gpuGraph_t *g);
gpuError_t gpuGraphInstantiate(gpuGraphExec_t *e, gpuGraph_t g);
gpuError_t gpuGraphLaunch(gpuGraphExec_t e, gpuStream_t s);
gpuError_t gpuGraphExecDestroy(gpuGraphExec_t e);
gpuError_t gpuGraphDestroy(gpuGraph_t g);
/* Whether s is capturing; emu_record appends work to its capture. */
bool emu_capturing(gpuStream_t s);
void emu_record(gpuStream_t s, std::function<void()> work);

/* Runs fn(ctx) as every thread of every block of the grid; returns when
 * all are done. Errors (bad sizes, a barrier deadlock) are kept for
 * gpuGetLastError. */
void emu_launch_raw(dim3 grid, dim3 block, size_t shared, gpuStream_t s, int warp,
		    void (*fn)(void *), void *ctx);

template <class F>
void emu_launch(dim3 grid, dim3 block, size_t shared, gpuStream_t s, F f)
{
	if (emu_capturing(s)) {
		emu_record(s, [=]() mutable {
			emu_launch_raw(grid, block, shared, s, GPU_WARP,
				       [](void *c) { (*(F *)c)(); }, &f);
		});
		return;
	}
	emu_launch_raw(grid, block, shared, s, GPU_WARP, [](void *c) { (*(F *)c)(); }, &f);
}

#define GPU_LAUNCH(k, grid, block, shared, stream, ...) \
	emu_launch(dim3(grid), dim3(block), (shared), (stream), [=]() { k(__VA_ARGS__); })
#define GPU_DYNAMIC_SHARED(type, name) type *name = (type *)emu_dynamic_shared()

/* ---- cuBLAS, as far as kernels.cu uses it ---- */

#ifdef GPU_EMU_BLAS
#define GPU_HAVE_BLAS 1
typedef struct emu_blas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, gpuStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *w, size_t n);
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			    int n, int k, const void *alpha, const void *a, cudaDataType_t at,
			    int lda, const void *b, cudaDataType_t bt, int ldb, const void *beta,
			    void *c, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
			    cublasGemmAlgo_t algo);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			   int n, int k, const float *alpha, const float *a, int lda,
			   const float *b, int ldb, const float *beta, float *c, int ldc);
#endif

/* ---- NCCL, as far as kernels.cu uses it (over MPI; see gpu_emu.cc) ---- */

#ifdef GPU_EMU_NCCL
#define GPU_HAVE_NCCL 1
typedef struct emu_nccl_comm *ncclComm_t;
typedef struct {
	char internal[128];
} ncclUniqueId;
typedef enum {
	ncclSuccess = 0,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
} ncclResult_t;
typedef enum { ncclFloat32 = 7 } ncclDataType_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
/* ncclCommInitRank with the transport NCCL finds for itself made explicit:
 * the host's MPI communicator (an MPI_Comm), of n ranks with this one at
 * `rank`. Every rank must pass the same id, which is checked. */
ncclResult_t emu_ncclCommInitRank(ncclComm_t *comm, int n, ncclUniqueId id, int rank,
				  void *mpi_comm);
#define gpuCommInitRank emu_ncclCommInitRank
ncclResult_t ncclCommDestroy(ncclComm_t comm);
/* Runs at once (launches do too, so the stream is in order); refused
 * while the stream captures. */
ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
			   ncclComm_t comm, gpuStream_t s);
const char *ncclGetErrorString(ncclResult_t r);
#endif

#endif /* LOOM_GPU_EMU_H */
