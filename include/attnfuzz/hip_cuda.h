// hip_cuda.h - the project's HIP-to-CUDA shim for nvcc (Debian HIP 5.2's nvidia headers break on CUDA 13).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cmath>

typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaEvent_t hipEvent_t;
#define hipSuccess cudaSuccess
#define hipErrorInvalidValue cudaErrorInvalidValue
#define hipErrorInvalidConfiguration cudaErrorInvalidConfiguration
#define hipErrorNoDevice cudaErrorNoDevice
#define hipErrorLaunchFailure cudaErrorLaunchFailure
#define hipErrorNotReady cudaErrorNotReady
#define hipGetLastError cudaGetLastError
#define hipPeekAtLastError cudaPeekAtLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName

// Host runtime (used by the device layer, runtime/gpu/).
typedef cudaDeviceProp hipDeviceProp_t;
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipStreamSynchronize cudaStreamSynchronize
#define hipHostMalloc cudaHostAlloc  // same arguments: pointer, bytes, flags
#define hipHostMallocDefault cudaHostAllocDefault
#define hipHostFree cudaFreeHost
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipGetDeviceCount cudaGetDeviceCount
#define hipSetDevice cudaSetDevice
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventQuery cudaEventQuery
#define hipEventElapsedTime cudaEventElapsedTime

#define HIP_DYNAMIC_SHARED(type, var) extern __shared__ type var[];
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (cudaStream_t)(stream)>>>(__VA_ARGS__)

// HIP's unsynchronised warp shuffles map to the full-mask CUDA forms.
#define __shfl(v, src, ...) __shfl_sync(0xffffffffu, (v), (src), ##__VA_ARGS__)
#define __shfl_xor(v, m, ...) __shfl_xor_sync(0xffffffffu, (v), (m), ##__VA_ARGS__)
#define __shfl_down(v, d, ...) __shfl_down_sync(0xffffffffu, (v), (d), ##__VA_ARGS__)
#define __shfl_up(v, d, ...) __shfl_up_sync(0xffffffffu, (v), (d), ##__VA_ARGS__)

// HIP's bfloat16 type name (hip_bf16.h) for CUDA's; __half, __half2float, __float2half_rn, __bfloat162float and
// __float2bfloat16 are the same names in both. fp8: attnfuzz/lowp_types.h.
typedef __nv_bfloat16 __hip_bfloat16;
#include "attnfuzz/lowp_types.h"
