// emulator_test.cpp - the CPU fiber emulator honours the HIP execution model and reports what it cannot run.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnfuzz/hip.h"
#include "runtime/cpu/emulator.h"

namespace {

struct EmuTest : ::testing::Test {
  void SetUp() override {
    hipemu::config() = hipemu::Config{};
    (void)hipGetLastError();
  }
};

// Each block sums its threads' ids through static shared memory and a barrier.
__global__ void block_sum(int* out) {
  __shared__ int vals[256];
  vals[threadIdx.x] = (int)(blockIdx.x * 1000 + threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) s += vals[i];
    out[blockIdx.x] = s;
  }
}

TEST_F(EmuTest, SharedMemoryIsSharedWithinABlockAndNotAcrossBlocks) {
  for (unsigned workers : {1u, 2u, 4u}) {
    hipemu::config().workers = workers;
    std::vector<int> out(16, -1);
    hipLaunchKernelGGL(block_sum, dim3(16), dim3(64), 0, nullptr, out.data());
    ASSERT_EQ(hipGetLastError(), hipSuccess) << hipemu::last_error_message();
    for (int b = 0; b < 16; ++b) EXPECT_EQ(out[b], b * 1000 * 64 + 63 * 64 / 2) << "block " << b << " workers " << workers;
  }
}

__global__ void ids3d(int* out) {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  out[b * (blockDim.x * blockDim.y * blockDim.z) + t] = (int)(b * 10000 + t);
}

TEST_F(EmuTest, ThreeDimensionalIdsCoverTheGridOnce) {
  const dim3 g(3, 2, 2), bl(4, 3, 2);
  std::vector<int> out(12 * 24, -1);
  hipLaunchKernelGGL(ids3d, g, bl, 0, nullptr, out.data());
  ASSERT_EQ(hipGetLastError(), hipSuccess);
  for (int b = 0; b < 12; ++b)
    for (int t = 0; t < 24; ++t) EXPECT_EQ(out[b * 24 + t], b * 10000 + t);
}

__global__ void dyn_reverse(const float* in, float* out) {
  HIP_DYNAMIC_SHARED(float, buf)
  buf[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

TEST_F(EmuTest, DynamicSharedMemory) {
  std::vector<float> in(4 * 100), out(in.size());
  std::iota(in.begin(), in.end(), 0.f);
  hipLaunchKernelGGL(dyn_reverse, dim3(4), dim3(100), 100 * sizeof(float), nullptr, in.data(), out.data());
  ASSERT_EQ(hipGetLastError(), hipSuccess);
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 100; ++t) EXPECT_EQ(out[b * 100 + t], in[b * 100 + 99 - t]);
}

// Thread 0 writes, the others read after a barrier: correct in every order.
// Without the barrier, the result depends on the order: forward sees it, reverse does not.
template <bool kBarrier>
__global__ void broadcast(int* out) {
  __shared__ int v;
  if (threadIdx.x == 0) v = 42 + (int)blockIdx.x;
  if (kBarrier) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) v = -1;
}

TEST_F(EmuTest, ThreadOrderChangesWhatAMissingBarrierDoes) {
  auto run = [](hipemu::Order o, bool barrier) {
    hipemu::config().order = o;
    std::vector<int> out(2 * 32, 0);
    if (barrier) hipLaunchKernelGGL(broadcast<true>, dim3(2), dim3(32), 0, nullptr, out.data());
    else hipLaunchKernelGGL(broadcast<false>, dim3(2), dim3(32), 0, nullptr, out.data());
    EXPECT_EQ(hipGetLastError(), hipSuccess);
    return out;
  };
  for (auto o : {hipemu::Order::kForward, hipemu::Order::kReverse, hipemu::Order::kShuffle})
    for (int x : run(o, true)) EXPECT_GE(x, 42);
  const auto fwd = run(hipemu::Order::kForward, false), rev = run(hipemu::Order::kReverse, false);
  EXPECT_EQ(fwd[1], 42);
  EXPECT_NE(rev[1], 42);  // thread 1 ran before thread 0 wrote
}

// Static shared memory outlives a launch (as on a GPU, its contents are whatever was there): a first
// launch leaves v = -1 (the kernel's last store), so every measured launch starts from the same state.
std::vector<int> racy_broadcast(uint64_t seed) {
  std::vector<int> out(32);
  hipemu::config().seed = seed;
  hipLaunchKernelGGL(broadcast<false>, dim3(1), dim3(32), 0, nullptr, out.data());
  hipLaunchKernelGGL(broadcast<false>, dim3(1), dim3(32), 0, nullptr, out.data());
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  return out;
}

TEST_F(EmuTest, ShuffledOrderDependsOnTheSeed) {
  hipemu::config().order = hipemu::Order::kShuffle;
  const std::vector<int> a = racy_broadcast(1);
  int differs = 0;
  for (uint64_t seed = 2; seed < 10; ++seed) differs += a != racy_broadcast(seed);
  EXPECT_EQ(a, racy_broadcast(1)) << "the same seed must give the same schedule";
  EXPECT_GT(differs, 0);
}

// Each thread appends its id to the log when it runs, `rounds` times, a barrier after each: the log is the
// order in which the emulator ran the block's threads, round by round.
__global__ void log_order(int* log, int* next, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    log[__atomic_fetch_add(next, 1, __ATOMIC_RELAXED)] = (int)threadIdx.x;
    __syncthreads();
  }
}

// What a saved failure's replay relies on: the shuffled order of block b's round r is the r-th
// std::shuffle of iota(threads) by std::mt19937_64(seed * 0x9E3779B97F4A7C15 + b), the same in every
// launch and every version. Launches after the first replay the orders from the emulator's tape (as far as
// it records: 1024 rounds of 64 threads); 1100 rounds also run past it.
TEST_F(EmuTest, ShuffledOrdersAreTheDocumentedSequenceInEveryLaunch) {
  hipemu::config().order = hipemu::Order::kShuffle;
  hipemu::config().seed = 7;
  for (int rounds : {3, 1100}) {
    const unsigned threads = 64, blocks = 2;
    std::vector<int> want;
    for (unsigned b = 0; b < blocks; ++b) {
      std::mt19937_64 rng(7 * 0x9E3779B97F4A7C15ull + b);
      std::vector<unsigned> order(threads);
      std::iota(order.begin(), order.end(), 0u);
      for (int r = 0; r <= rounds; ++r) {  // the last round: every thread leaves the loop and ends
        std::shuffle(order.begin(), order.end(), rng);
        if (r < rounds) want.insert(want.end(), order.begin(), order.end());
      }
    }
    for (int launch = 0; launch < 3; ++launch) {  // one OS thread: block 0, then block 1
      std::vector<int> log(want.size(), -1);
      int next = 0;
      hipLaunchKernelGGL(log_order, dim3(blocks), dim3(threads), 0, nullptr, log.data(), &next, rounds);
      ASSERT_EQ(hipGetLastError(), hipSuccess);
      ASSERT_EQ(log, want) << rounds << " rounds, launch " << launch;
    }
  }
}

__global__ void diverge_sites(int* out) {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}
__global__ void diverge_exit(int* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

TEST_F(EmuTest, BarrierDivergenceIsALaunchErrorWithAMessage) {
  std::vector<int> out(64);
  hipLaunchKernelGGL(diverge_sites, dim3(1), dim3(64), 0, nullptr, out.data());
  EXPECT_EQ(hipGetLastError(), hipErrorLaunchFailure);
  EXPECT_NE(hipemu::last_error_message().find("different __syncthreads"), std::string::npos)
      << hipemu::last_error_message();
  hipLaunchKernelGGL(diverge_exit, dim3(1), dim3(64), 0, nullptr, out.data());
  EXPECT_EQ(hipGetLastError(), hipErrorLaunchFailure);
  EXPECT_NE(hipemu::last_error_message().find("exited while the others wait"), std::string::npos)
      << hipemu::last_error_message();
}

__global__ void noop(int*) {}

TEST_F(EmuTest, LaunchLimitsAreLaunchErrorsNotCrashes) {
  int x = 0;
  hipLaunchKernelGGL(noop, dim3(1), dim3(1025), 0, nullptr, &x);
  EXPECT_EQ(hipGetLastError(), hipErrorInvalidConfiguration);
  hipLaunchKernelGGL(noop, dim3(0), dim3(32), 0, nullptr, &x);
  EXPECT_EQ(hipGetLastError(), hipErrorInvalidConfiguration);
  hipLaunchKernelGGL(noop, dim3(1), dim3(1, 1, 65), 0, nullptr, &x);
  EXPECT_EQ(hipGetLastError(), hipErrorInvalidConfiguration);
  hipLaunchKernelGGL(noop, dim3(1), dim3(32), 1 << 20, nullptr, &x);
  EXPECT_EQ(hipGetLastError(), hipErrorInvalidConfiguration);
  EXPECT_NE(hipemu::last_error_message().find("dynamic shared"), std::string::npos);
  hipLaunchKernelGGL(noop, dim3(1), dim3(1024), 0, nullptr, &x);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
}

// Tree reduction with warp shuffles, then lane 0 of each warp writes.
__global__ void warp_reduce(const float* in, float* out, int* lanes) {
  float v = in[threadIdx.x];
  for (int off = warpSize / 2; off > 0; off /= 2) v += __shfl_xor(v, off);
  const int lane = (int)(threadIdx.x % warpSize);
  if (lane == 0) out[threadIdx.x / warpSize] = v;
  lanes[threadIdx.x] = __shfl_down(lane, 1);
}

TEST_F(EmuTest, WarpShufflesFollowHipSemanticsForWarp32And64) {
  for (unsigned ws : {32u, 64u}) {
    for (auto o : {hipemu::Order::kForward, hipemu::Order::kReverse, hipemu::Order::kShuffle}) {
      hipemu::config().warp_size = ws;
      hipemu::config().order = o;
      std::vector<float> in(128), out(128 / ws, 0.f);
      std::vector<int> lanes(128);
      std::iota(in.begin(), in.end(), 1.f);
      hipLaunchKernelGGL(warp_reduce, dim3(1), dim3(128), 0, nullptr, in.data(), out.data(), lanes.data());
      ASSERT_EQ(hipGetLastError(), hipSuccess) << hipemu::last_error_message();
      for (unsigned w = 0; w < 128 / ws; ++w) {
        float want = 0;
        for (unsigned i = w * ws; i < (w + 1) * ws; ++i) want += in[i];
        EXPECT_EQ(out[w], want) << "warp " << w << " size " << ws;
      }
      for (unsigned t = 0; t < 128; ++t)  // down: last lane keeps its own value
        EXPECT_EQ(lanes[t], (int)(t % ws == ws - 1 ? ws - 1 : t % ws + 1));
    }
  }
}

__global__ void atomics(int* counter, float* fsum) {
  atomicAdd(counter, 1);
  atomicAdd(fsum, 0.5f);
}

TEST_F(EmuTest, AtomicsAreAtomicAcrossWorkers) {
  hipemu::config().workers = 4;
  int c = 0;
  float f = 0;
  hipLaunchKernelGGL(atomics, dim3(64), dim3(64), 0, nullptr, &c, &f);
  ASSERT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_EQ(c, 64 * 64);
  EXPECT_EQ(f, 64 * 64 * 0.5f);
}

}  // namespace
