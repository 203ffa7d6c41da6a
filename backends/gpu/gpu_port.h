/*
 * gpu_port.h: the few runtime names kernels.cu uses, mapped to CUDA or HIP.
 *
 * kernels.cu is compiled twice: by nvcc for cuda.so and by hipcc for
 * rocm.so (hipcc defines __HIPCC__). Everything vendor-specific lives here.
 *
 * Warp width: 32 on NVIDIA and on RDNA (gfx1100, wave32 by default), 64 on
 * CDNA (gfx90a, gfx942). GPU_WARP is a compile-time constant of the device
 * pass (from the offload target's family macro, see below), so each
 * target's reductions are unrolled for its own width. Launch sizes used by
 * kernels.cu are multiples of 64, so they hold whole warps on every target
 * and the host never needs to know the width.
 *
 * A third build, GPU_EMU, compiles the same kernels as plain C++ for the
 * host-side emulator of gpu_emu.h (the test backends gpuemu.so and
 * gpuemu64.so), so their arithmetic can be checked without a GPU.
 *
 * Launches are written GPU_LAUNCH(kernel, grid, block, shared, stream,
 * args...) and dynamic shared memory GPU_DYNAMIC_SHARED(type, name), the
 * two constructs plain C++ cannot spell.
 */
#ifndef LOOM_GPU_PORT_H
#define LOOM_GPU_PORT_H

#include <stdint.h>

#if defined(GPU_EMU)

#include "gpu_emu.h"

#define GPU_UNROLL _Pragma("GCC unroll 8")

#else

#define GPU_LAUNCH(k, grid, block, shared, stream, ...) \
	k<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__)
#define GPU_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
/* unroll the next loop (fixed trip count): keeps small arrays in registers */
#define GPU_UNROLL _Pragma("unroll")

#endif

/*
 * Int8 tensor-core MMA (where GPU_HAVE_MMA is defined): one warp computes
 * d = A B + c, a 16 x 8 tile of int32 from A (16 x K signed bytes) and B
 * (K x 8), K = 32 (gpu_mma_k32, PTX mma.sync.aligned.m16n8k32.row.col.
 * s32.s8.s8.s32) or 16 (gpu_mma_k16, .m16n8k16), both sm_80+. The warp's
 * 32 lanes hold the fragments; lane = 4 g + t (g = lane / 4, t = lane %
 * 4), each register 4 elements of consecutive k, the lowest byte first:
 *   K = 32: a[0] = A[g][4t .. 4t+3]  a[1] = A[g+8][4t ..]
 *           a[2] = A[g][16+4t ..]    a[3] = A[g+8][16+4t ..]
 *           b[0] = B[4t .. 4t+3][g]  b[1] = B[16+4t ..][g]
 *   K = 16: a[0] = A[g][4t ..]       a[1] = A[g+8][4t ..]    b[0] = B[4t ..][g]
 *   c, d:   [0] = (g, 2t)  [1] = (g, 2t+1)  [2] = (g+8, 2t)  [3] = (g+8, 2t+1)
 * (PTX ISA 9.7.14.5, "Matrix Fragments for mma.m16n8k16 with integer
 * type" and "for mma.m16n8k32"). Every lane of the warp must call it
 * together. The emulator implements the instruction from the same tables
 * (gpu_emu.cc), held to a plain matrix product by tests/gpu/mma_layout.cc.
 * HIP has no such instruction with this layout: AMD's int8 matrix
 * instructions (MFMA on gfx9, WMMA on gfx11) own their fragments by other
 * rules, so rocm.so (and gpuemu64.so, which stands for it) keeps dp4a.
 */
#if defined(GPU_EMU)
/* every name comes from gpu_emu.h */
#define gpu_dp4a(a, b, c) __dp4a((a), (b), (c))
#if GPU_WARP == 32
#define GPU_HAVE_MMA 1
static inline void gpu_mma_k32(int *d, const uint32_t *a, const uint32_t *b, const int *c)
{
	emu_mma_s8(32, d, a, b, c);
}
static inline void gpu_mma_k16(int *d, const uint32_t *a, const uint32_t *b, const int *c)
{
	emu_mma_s8(16, d, a, b, c);
}
#endif
#elif defined(__HIPCC__)

#include <hip/hip_runtime.h>

#define GPU_VENDOR "ROCm/HIP"
typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
typedef hipDeviceProp_t gpuDeviceProp;
#define gpuSuccess hipSuccess
#define gpuErrorMemoryAllocation hipErrorOutOfMemory
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuSetDevice hipSetDevice
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuMemGetInfo hipMemGetInfo
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuMallocHost(p, n) hipHostMalloc((p), (n), 0)
#define gpuFreeHost hipHostFree
typedef hipGraph_t gpuGraph_t;
typedef hipGraphExec_t gpuGraphExec_t;
#define gpuStreamBeginCapture(s) hipStreamBeginCapture((s), hipStreamCaptureModeThreadLocal)
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuGraphInstantiate(e, g) hipGraphInstantiate((e), (g), NULL, NULL, 0)
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphExecDestroy hipGraphExecDestroy
#define gpuGraphDestroy hipGraphDestroy

/* The width follows the offload target: RDNA (gfx10, gfx11, gfx12) runs
 * wave32 by default, GCN/CDNA (gfx9: gfx90a, gfx942) wave64. Read from the
 * target's family macro because clang 20 deprecates, and clang 22 drops,
 * __AMDGCN_WAVEFRONT_SIZE; where that macro is still quiet (clang < 20) it
 * must agree. */
#if defined(__HIP_DEVICE_COMPILE__)
#if defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__)
#define GPU_WARP 32
#else
#define GPU_WARP 64
#endif
#if __clang_major__ < 20 /* nested: clang 20 warns on defined() of it too */
#if defined(__AMDGCN_WAVEFRONT_SIZE)
static_assert(GPU_WARP == __AMDGCN_WAVEFRONT_SIZE, "GPU_WARP disagrees with the target");
#endif
#endif
#else
#define GPU_WARP 64 /* host pass: only used for sizing, never for launches */
#endif

/* HIP's shuffles act on the whole wavefront; there is no mask. */
#define gpu_shfl_xor(v, m) __shfl_xor((v), (m), GPU_WARP)

/* c plus the four products of a's and b's signed bytes (CUDA's __dp4a).
 * Written out: the dot-product builtins differ between gfx9 and gfx11,
 * and clang folds this pattern into them where the target has one. */
static __device__ __forceinline__ int gpu_dp4a(int a, int b, int c)
{
	for (int i = 0; i < 4; i++)
		c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
	return c;
}

#else /* CUDA */

#include <cuda_runtime.h>

#define GPU_VENDOR "CUDA"
typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
typedef cudaDeviceProp gpuDeviceProp;
#define gpuSuccess cudaSuccess
#define gpuErrorMemoryAllocation cudaErrorMemoryAllocation
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuSetDevice cudaSetDevice
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuMemGetInfo cudaMemGetInfo
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
typedef cudaGraph_t gpuGraph_t;
typedef cudaGraphExec_t gpuGraphExec_t;
#define gpuStreamBeginCapture(s) cudaStreamBeginCapture((s), cudaStreamCaptureModeThreadLocal)
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuGraphInstantiate(e, g) cudaGraphInstantiate((e), (g), 0)
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define gpuGraphDestroy cudaGraphDestroy

#define GPU_WARP 32
#define gpu_shfl_xor(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), GPU_WARP)
/* c plus the four products of a's and b's signed bytes (sm_61+) */
#define gpu_dp4a(a, b, c) __dp4a((a), (b), (c))

/* The MMA wrappers above; cuda.so builds SASS for sm_80 and sm_90 only,
 * and the host selects them on compute capability 8.0 and newer. */
#define GPU_HAVE_MMA 1
static __device__ __forceinline__ void gpu_mma_k32(int *d, const uint32_t *a, const uint32_t *b,
						   const int *c)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
	    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
	    : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]),
	      "r"(c[1]), "r"(c[2]), "r"(c[3]));
#else
	__trap(); /* never selected below sm_80 */
#endif
}
static __device__ __forceinline__ void gpu_mma_k16(int *d, const uint32_t *a, const uint32_t *b,
						   const int *c)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 "
	    "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};"
	    : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(b[0]), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#else
	__trap();
#endif
}

/* cuBLAS runs prefill GEMM; HIP builds use the tiled kernel instead
 * (Debian ships no hipBLAS). */
#define GPU_HAVE_BLAS 1
#include <cublas_v2.h>

/* NCCL for the collective slot, where meson found it (GPU_HAVE_NCCL). The
 * host's MPI communicator is the emulator's transport; NCCL connects its
 * ranks through the unique id alone. */
#ifdef GPU_HAVE_NCCL
#include <nccl.h>
#define gpuCommInitRank(comm, n, id, rank, mpi_comm) ncclCommInitRank((comm), (n), (id), (rank))
#endif

#endif

#endif /* LOOM_GPU_PORT_H */
