// hip_cpu.h - the HIP kernel language on the CPU emulator: each GPU thread is a fiber (runtime/cpu/).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include <boost/context/detail/fcontext.hpp>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

typedef int hipError_t;  // values as in HIP
enum : int {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2,
  hipErrorInvalidConfiguration = 9,
  hipErrorNoDevice = 100,
  hipErrorLaunchFailure = 719,
};
typedef void* hipStream_t;
// Device memory is host memory on the emulator: a copy is a memcpy (kernels read their metadata arrays on the host
// through it, kernels/common.h check_seq_metadata).
enum hipMemcpyKind { hipMemcpyHostToHost = 0, hipMemcpyHostToDevice, hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice };
inline hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind) {
  if (bytes) std::memcpy(dst, src, bytes);
  return hipSuccess;
}

namespace hipemu {

// Per-fiber identity, read by threadIdx etc. Set by the scheduler before a fiber resumes.
struct FiberIds {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
  unsigned linear_tid;
  unsigned warp_size;
  void* dynamic_shared;
};
extern __thread const FiberIds* tl_ids;
// The running GPU thread's ids. The fibers of one OS thread share tl_ids, and under TSan each fiber is a
// thread of its own: there every access to it is atomic, so that TSan does not report the switches.
#if defined(ATTNFUZZ_TSAN)
inline const FiberIds* ids() { return __atomic_load_n(&tl_ids, __ATOMIC_RELAXED); }
#else
inline const FiberIds* ids() { return tl_ids; }
#endif

void syncthreads(const char* file, int line);
// __syncthreads() in two steps, so that the fiber switch sits in the kernel's own frame: after it the
// kernel goes on without returning through frames entered before the switch (each such return is a
// mispredicted branch, since the switch leaves the return-address predictor holding the previous fiber's
// calls). barrier_arrive records the arrival and names the context to switch to and where this fiber's
// context is to be saved; the resumed fiber saves the context that switched to it (save_jumper). A null
// `to`: the emulator has switched and resumed this fiber itself (its TSan build, which must announce every
// switch to TSan; a plug-in built without TSan still runs there).
struct Handoff {
  boost::context::detail::fcontext_t to;
  void* slot;
};
Handoff barrier_arrive(const char* file, int line);
// The resumed side of every switch: the context that jumped here is saved where it asked.
inline void save_jumper(boost::context::detail::transfer_t from) {
  auto* slot = static_cast<boost::context::detail::fcontext_t*>(from.data);
  if (slot) __atomic_store_n(slot, from.fctx, __ATOMIC_RELAXED);
}
// Warp-level exchange used by the shuffles: publishes `bits`, waits for the warp, returns lane src's bits.
uint64_t warp_exchange(uint64_t bits, int src_lane, const char* file, int line);
void set_last_error(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int take_last_error();

// Runs fn(ctx) once per GPU thread of the grid; returns hipSuccess or an error code (message kept).
int run_grid(dim3 grid, dim3 block, size_t dynamic_shared, void (*fn)(void*), void* ctx);

template <class... P, class... A>
inline int launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem, A&&... args) {
  std::tuple<std::decay_t<P>...> argv(static_cast<std::decay_t<P>>(std::forward<A>(args))...);  // by value, as on a GPU
  auto call = [&] { std::apply(kernel, argv); };
  return run_grid(grid, block, shmem, [](void* c) { (*static_cast<decltype(call)*>(c))(); }, &call);
}

// The lane of the calling thread within its warp.
inline unsigned lane_id() { return ids()->linear_tid % ids()->warp_size; }

enum class ShflMode { kIndex, kXor, kDown, kUp };
// Shuffle among `width` lanes (0 = warp size) with HIP semantics: index wraps modulo width; down/up
// return the caller's own value when the source lane falls outside its width-segment.
template <class T>
inline T shfl(T v, int arg, int width, ShflMode mode, const char* file, int line) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a type wider than 8 bytes");
  const unsigned ws = ids()->warp_size, lane = lane_id();
  const unsigned w = (width <= 0 || (unsigned)width > ws) ? ws : (unsigned)width;
  const unsigned base = lane - lane % w, me = lane % w;
  long src = me;
  switch (mode) {
    case ShflMode::kIndex: src = (long)((unsigned)arg % w); break;
    case ShflMode::kXor: src = (long)(me ^ (unsigned)arg); if (src >= (long)w) src = me; break;
    case ShflMode::kDown: src = (long)me + arg; if (src >= (long)w) src = me; break;
    case ShflMode::kUp: src = (long)me - arg; if (src < 0) src = me; break;
  }
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(bits, (int)(base + (unsigned)src), file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace hipemu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define HIP_DYNAMIC_SHARED(type, var) type* var = static_cast<type*>(::hipemu::ids()->dynamic_shared);
#define threadIdx (::hipemu::ids()->thread_idx)
#define blockIdx (::hipemu::ids()->block_idx)
#define blockDim (::hipemu::ids()->block_dim)
#define gridDim (::hipemu::ids()->grid_dim)
#define warpSize ((int)::hipemu::ids()->warp_size)
#if defined(ATTNFUZZ_TSAN)
// Under TSan the switch stays in the emulator (hipemu::syncthreads), where nothing is read between the TSan
// fiber switch and the context switch: such a read would count as the next fiber's.
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::hipemu::syncthreads(file, line);
}
#else
__attribute__((always_inline)) inline void __syncthreads(const char* file = __builtin_FILE(),
                                                         int line = __builtin_LINE()) {
  const ::hipemu::Handoff h = ::hipemu::barrier_arrive(file, line);
  if (h.to) ::hipemu::save_jumper(::boost::context::detail::jump_fcontext(h.to, h.slot));
}
#endif
template <class T>
inline T __shfl(T v, int src, int width = 0, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::hipemu::shfl(v, src, width, ::hipemu::ShflMode::kIndex, file, line);
}
template <class T>
inline T __shfl_xor(T v, int mask, int width = 0, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::hipemu::shfl(v, mask, width, ::hipemu::ShflMode::kXor, file, line);
}
template <class T>
inline T __shfl_down(T v, unsigned d, int width = 0, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
  return ::hipemu::shfl(v, (int)d, width, ::hipemu::ShflMode::kDown, file, line);
}
template <class T>
inline T __shfl_up(T v, unsigned d, int width = 0, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::hipemu::shfl(v, (int)d, width, ::hipemu::ShflMode::kUp, file, line);
}

#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  ::hipemu::launch((kernel), dim3(grid), dim3(block), (size_t)(shmem), ##__VA_ARGS__)
inline hipError_t hipGetLastError() { return ::hipemu::take_last_error(); }
inline hipError_t hipPeekAtLastError() { return ::hipemu::take_last_error(); }

// Math the kernels use. The fast-math intrinsics are the precise functions here: the error bound
// (oracle/) allows for hardware approximations on GPUs.
using std::fabs;
inline float __expf(float x) { return expf(x); }
inline float __exp2f(float x) { return exp2f(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }

// Atomics: blocks run on several OS threads, so these are real atomics.
inline float atomicAdd(float* p, float v) {
  float old, want;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do {
    want = old + v;
  } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return old;
}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline int atomicCAS(int* p, int cmp, int v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// Half types (hip_fp16.h / hip_bf16.h in ROCm, cuda_fp16.h / cuda_bf16.h through hip_cuda.h): software
// types with the same conversion functions, round to nearest even (attnfuzz/lowp_types.h).
#include "attnfuzz/lowp_types.h"
struct __half {
  uint16_t __x;
};
struct __hip_bfloat16 {
  uint16_t data;
};
inline float __half2float(__half h) { return af_minifloat_to_float(h.__x, 5, 10, true); }
inline __half __float2half_rn(float f) { return __half{(uint16_t)af_float_to_minifloat(f, 5, 10, true, false)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __bfloat162float(__hip_bfloat16 b) { return af_bits_float((uint32_t)b.data << 16); }
inline __hip_bfloat16 __float2bfloat16(float f) {
  const uint32_t u = af_float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __hip_bfloat16{(uint16_t)((u >> 16) | 0x40)};  // quiet NaN
  return __hip_bfloat16{(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
