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

#if defined(GPU_EMU)
/* every name comes from gpu_emu.h */
#define gpu_dp4a(a, b, c) __dp4a((a), (b), (c))
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
