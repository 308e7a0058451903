// hip.h - the one include of a kernel source: CPU emulator, HIP-on-CUDA shim, or real ROCm HIP.
#pragma once

#if defined(ATTNFUZZ_BACKEND_CPU)
#include "attnfuzz/hip_cpu.h"
#define AF_BACKEND_NAME "cpu"
#elif defined(__CUDACC__)
#include "attnfuzz/hip_cuda.h"
#define AF_BACKEND_NAME "nvidia"
#elif !defined(__HIP__) && !defined(__HIPCC__) && !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_HCC__)
// A plain C++ compiler without the cpu define would reach ROCm's headers and fail there with "Must define
// exactly one of __HIP_PLATFORM_AMD__ ...": say what to define instead.
#error "attnfuzz/hip.h: no backend: compile with -DATTNFUZZ_BACKEND_CPU for the cpu emulator (g++/clang++ -x c++), with nvcc for nvidia, or with hipcc for amd (examples/plugin/README.md)"
#else
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>  // ROCm >= 6: __hip_bfloat16, __bfloat162float, __float2bfloat16
#else
#include <hip/hip_bfloat16.h>  // older ROCm (Debian's 5.2): hip_bfloat16 under the newer names
typedef hip_bfloat16 __hip_bfloat16;
__host__ __device__ inline float __bfloat162float(__hip_bfloat16 b) { return static_cast<float>(b); }
__host__ __device__ inline __hip_bfloat16 __float2bfloat16(float f) { return hip_bfloat16::round_to_bfloat16(f); }
#endif
#include "attnfuzz/lowp_types.h"
#define AF_BACKEND_NAME "amd"
#endif

#include "attnfuzz/abi.h"

// Defines the entry point of a plug-in shared library from an array of af_kernel.
#define AF_DEFINE_PLUGIN(plugin_name, kernel_array)                                          \
  extern "C" __attribute__((visibility("default"))) const af_plugin* attnfuzz_plugin(void) { \
    static const af_plugin p = {AF_ABI_VERSION, AF_BACKEND_NAME, (plugin_name),              \
                                sizeof(kernel_array) / sizeof((kernel_array)[0]), (kernel_array)}; \
    return &p;                                                                               \
  }
