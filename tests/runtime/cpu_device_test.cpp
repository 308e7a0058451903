// cpu_device_test.cpp - the cpu backend of the device layer: memory, launches, and kernels that crash or hang.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "attnfuzz/device.h"
#include "attnfuzz/hip.h"

namespace {

using attnfuzz::DeviceOptions;
using attnfuzz::LaunchStatus;

__global__ void add_one(float* x, int n) {
  const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] += 1.f;
}
__global__ void crash(float* x) {
  if (threadIdx.x == 5) *(volatile float*)nullptr = x[0];
}
__global__ void spin(float* x) {
  volatile float* v = x;
  while (v[0] == 0.f) {
  }
}
__global__ void spin_with_barrier(float* x) {
  for (;;) {
    __syncthreads();
    if (x[1] != 0.f) break;
  }
}
__global__ void divergent(float*) {
  if (threadIdx.x == 0) __syncthreads();
}

__global__ void three_barriers(float* x) {
  __shared__ float s[64];
  for (int r = 0; r < 3; ++r) {
    s[threadIdx.x] = (float)r;
    __syncthreads();
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) x[0] = s[63];
}

// af_kernel launch functions: problem.seq_q carries n; workspace is the buffer.
int launch_add_one(const af_problem* p, const af_buffers* b, void*) {
  hipLaunchKernelGGL(add_one, dim3(((unsigned)p->seq_q + 63) / 64), dim3(64), 0, nullptr, (float*)b->workspace,
                     (int)p->seq_q);
  return (int)hipGetLastError();
}
int launch_crash(const af_problem*, const af_buffers* b, void*) {
  hipLaunchKernelGGL(crash, dim3(1), dim3(32), 0, nullptr, (float*)b->workspace);
  return (int)hipGetLastError();
}
int launch_spin(const af_problem*, const af_buffers* b, void*) {
  hipLaunchKernelGGL(spin, dim3(1), dim3(4), 0, nullptr, (float*)b->workspace);
  return (int)hipGetLastError();
}
int launch_spin_barrier(const af_problem*, const af_buffers* b, void*) {
  hipLaunchKernelGGL(spin_with_barrier, dim3(1), dim3(4), 0, nullptr, (float*)b->workspace);
  return (int)hipGetLastError();
}
int launch_divergent(const af_problem*, const af_buffers* b, void*) {
  hipLaunchKernelGGL(divergent, dim3(1), dim3(4), 0, nullptr, (float*)b->workspace);
  return (int)hipGetLastError();
}

int launch_three_barriers(const af_problem* p, const af_buffers* b, void*) {  // seq_q blocks of 64 threads
  hipLaunchKernelGGL(three_barriers, dim3((unsigned)p->seq_q), dim3(64), 0, nullptr, (float*)b->workspace);
  return (int)hipGetLastError();
}

af_kernel make(const char* name, int (*fn)(const af_problem*, const af_buffers*, void*)) {
  af_kernel k{};
  k.name = name;
  k.family = "test";
  k.launch = fn;
  return k;
}

struct Outcome {
  attnfuzz::LaunchResult result;
  std::vector<float> data;
};
Outcome run(const af_kernel& k, DeviceOptions o, int n = 100) {
  auto dev = attnfuzz::open_device("cpu", o);
  float* buf = static_cast<float*>(dev->alloc(n * sizeof(float)));
  std::vector<float> host(n, 0.f);
  dev->to_device(buf, host.data(), n * sizeof(float));
  af_problem p{};
  p.seq_q = n;
  af_buffers b{};
  b.workspace = buf;
  Outcome r;
  r.result = dev->launch(k, p, b);
  dev->to_host(host.data(), buf, n * sizeof(float));
  r.data = host;
  dev->free(buf);
  return r;
}

TEST(CpuDevice, LaunchWritesDeviceMemoryInProcessAndIsolated) {
  for (bool isolate : {false, true}) {
    DeviceOptions o;
    o.isolate = isolate;
    Outcome r = run(make("add", launch_add_one), o, 1000);
    ASSERT_EQ(r.result.status, LaunchStatus::kOk) << r.result.message;
    for (float v : r.data) ASSERT_EQ(v, 1.f);
  }
}

TEST(CpuDevice, ACrashingKernelIsReportedNotFatal) {
  DeviceOptions o;
  o.isolate = true;
  Outcome r = run(make("crash", launch_crash), o);
  EXPECT_EQ(r.result.status, LaunchStatus::kCrash);
  EXPECT_NE(r.result.message.find("signal"), std::string::npos) << r.result.message;
}

TEST(CpuDevice, AHangingKernelIsStoppedByTheTimeout) {
  DeviceOptions o;
  o.isolate = true;
  o.timeout_s = 0.5;
  Outcome r = run(make("spin", launch_spin), o);
  EXPECT_EQ(r.result.status, LaunchStatus::kHang) << r.result.message;
  EXPECT_LT(r.result.ms, 5000);
}

TEST(CpuDevice, InProcessDeadlineStopsAHangThatPassesBarriers) {
  DeviceOptions o;
  o.isolate = false;
  o.timeout_s = 0.3;
  Outcome r = run(make("spin-barrier", launch_spin_barrier), o);
  EXPECT_EQ(r.result.status, LaunchStatus::kHang) << r.result.message;
}

TEST(CpuDevice, BarrierDivergenceIsALaunchError) {
  for (bool isolate : {false, true}) {
    DeviceOptions o;
    o.isolate = isolate;
    Outcome r = run(make("divergent", launch_divergent), o);
    EXPECT_EQ(r.result.status, LaunchStatus::kLaunchError);
    EXPECT_NE(r.result.message.find("__syncthreads"), std::string::npos) << r.result.message;
  }
}

// What the emulator keeps between launches (fiber stacks, the shuffled orders it replays) stays far below the
// leak limit, however many distinct blocks the launches have: a correct kernel on ever larger grids, run in
// process as campaigns run it, is never a leak (a split-kv check was, with a 32 MiB store of orders).
TEST(CpuDevice, ShuffledLaunchesOfEverLargerGridsAreNotALeak) {
  DeviceOptions o;
  o.isolate = false;
  o.order = attnfuzz::ThreadOrder::kShuffle;
  o.workers = 1;
  auto dev = attnfuzz::open_device("cpu", o);
  float* buf = static_cast<float*>(dev->alloc(64));
  af_buffers b{};
  b.workspace = buf;
  const af_kernel k = make("three-barriers", launch_three_barriers);
  for (int64_t blocks = 2000; blocks <= 12000; blocks += 2000) {
    af_problem p{};
    p.seq_q = blocks;
    const attnfuzz::LaunchResult r = dev->launch(k, p, b);
    EXPECT_EQ(r.status, LaunchStatus::kOk) << blocks << " blocks: " << r.message;
  }
  dev->free(buf);
}

TEST(CpuDevice, NameSaysHowItRuns) {
  DeviceOptions o;
  o.order = attnfuzz::ThreadOrder::kShuffle;
  o.order_seed = 7;
  o.workers = 2;
  auto dev = attnfuzz::open_device("cpu", o);
  EXPECT_EQ(dev->name(), "cpu emulator (2 workers, warp 32, order shuffle/7, isolated)");
}

TEST(DeviceSelection, AutoFallsBackToCpuAndUnbuiltBackendsSaySo) {
  auto dev = attnfuzz::open_device("auto", DeviceOptions{});
  ASSERT_TRUE(dev);
  std::string why;
  for (auto b : {attnfuzz::Backend::kNvidia, attnfuzz::Backend::kAmd})
    if (!attnfuzz::backend_available(b, &why)) {
      EXPECT_FALSE(why.empty());
      EXPECT_THROW(attnfuzz::open_device(b, DeviceOptions{}), attnfuzz::DeviceError);
    }
  EXPECT_THROW(attnfuzz::open_device("tpu", DeviceOptions{}), attnfuzz::DeviceError);
}

}  // namespace
