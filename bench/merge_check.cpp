// merge_check.cpp - a merge kernel's check against the single-problem check of the same keys, side by side (issue 29):
// the states (n sub-problem oracles), the merge launch and its exact merge, the whole-problem comparison; then the
// campaign's mix: fuzz-decoded merge cases end to end (PreparedCase + check_case), merge kernels against an attention
// kernel on the same cases without their merge.
//   merge_check [--reps N] [--sq S] [--sk S] [--threads T] [--mix N]
// --threads: the oracles' threads (default 1, a campaign worker's; a GPU host's campaign before issue 32 computed
// the states with one thread per core: --threads 16 shows that cost). --mix: how many decoded cases (0: none).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/merge.h"
#include "check/runner.h"
#include "fuzz/codec.h"

using namespace attnfuzz;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Best of reps: preparing the case (generate; for a merge case the states), and check_case.
struct Cost {
  double prepare = 1e300, check = 1e300;
  Verdict verdict = Verdict::kPass;
};
Cost measure(Device& dev, const KernelEntry& k, const Case& c, int reps, RunOptions ro, unsigned state_threads) {
  Cost r;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    PreparedCase pc(c, state_threads);
    r.prepare = std::min(r.prepare, ms_since(t0));
    const auto t1 = std::chrono::steady_clock::now();
    r.verdict = check_case(dev, k, pc, ro).result.verdict;
    r.check = std::min(r.check, ms_since(t1));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, mix = 200;
  int64_t sq = 256, sk = 256;
  unsigned threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc || (a != "--reps" && a != "--sq" && a != "--sk" && a != "--threads" && a != "--mix")) {
      std::fprintf(stderr, "merge_check: unknown or incomplete option %s (usage: merge_check [--reps N] [--sq S] [--sk S] "
                   "[--threads T] [--mix N])\n", argv[i]);
      return 2;
    }
    const long long v = std::atoll(argv[++i]);
    if (v < (a == "--mix" ? 0 : 1)) {
      std::fprintf(stderr, "merge_check: %s must be >= %d\n", a.c_str(), a == "--mix" ? 0 : 1);
      return 2;
    }
    if (a == "--reps") reps = static_cast<int>(v);
    if (a == "--sq") sq = v;
    if (a == "--sk") sk = v;
    if (a == "--threads") threads = static_cast<unsigned>(v);
    if (a == "--mix") mix = static_cast<int>(v);
  }
  DeviceOptions dopt;
  dopt.isolate = false;
  std::unique_ptr<Device> dev = open_device("cpu", dopt);
  const KernelEntry* flash = Registry::global().find(Backend::kCpu, "flash-bm16-bn32");
  const KernelEntry* merge = Registry::global().find(Backend::kCpu, "merge-states");
  if (!flash || !merge) {
    std::fprintf(stderr, "merge_check: the built-in kernels flash-bm16-bn32 and merge-states are needed\n");
    return 2;
  }
  Problem p = make_problem(1, 4, 2, sq, sk, 64, 64);
  (void)parse_mask("causal-br", p);
  const Case plain = make_case(p, 0x5eed);
  RunOptions ro;
  ro.oracle.threads = threads;
  ro.pool = std::make_shared<BufferPool>(*dev);  // guarded buffers reused between checks, as in a campaign's worker
  std::printf("# check cost, B=1 Hq=4 Hkv=2 Sq=%lld Sk=%lld D=64 causal-br f32, cpu emulator in-process, %u oracle "
              "thread(s), best of %d\n",
              (long long)sq, (long long)sk, threads, reps);
  const Cost base = measure(*dev, *flash, plain, reps, ro, threads);
  std::printf("single_problem kernel=flash-bm16-bn32 prepare_ms=%.1f check_ms=%.1f total_ms=%.1f verdict=%s\n", base.prepare,
              base.check, base.prepare + base.check, verdict_name(base.verdict));
  for (int n : {2, 4, 8}) {
    std::vector<int64_t> cuts;
    for (int s = 0; s <= n; ++s) cuts.push_back(sk * s / n);
    Case c = plain;
    if (std::string e = set_merge(c, cuts); !e.empty()) {
      std::fprintf(stderr, "merge_check: %s\n", e.c_str());
      return 2;
    }
    const Cost m = measure(*dev, *merge, c, reps, ro, threads);
    const double total = m.prepare + m.check;
    std::printf("merge n_states=%d kernel=merge-states prepare_ms=%.1f (states) check_ms=%.1f (launch, merge oracle, whole "
                "problem) total_ms=%.1f verdict=%s ratio_vs_single=%.2f\n",
                n, m.prepare, m.check, total, verdict_name(m.verdict), total / (base.prepare + base.check));
  }
  if (mix == 0) return 0;
  // The campaign's mix: the fuzz decoder's merge cases (its limits, f32), each checked end to end by both merge
  // kernels, and its unmerged case by the attention kernel.
  const KernelEntry* online = Registry::global().find(Backend::kCpu, "merge-states-online");
  fuzz::FuzzLimits lim;
  lim.merge = true;
  std::vector<Case> cases;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int tries = 0; static_cast<int>(cases.size()) < mix && tries < 100 * mix; ++tries) {
    std::vector<uint8_t> bytes(256);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 56);
    fuzz::FuzzInput in = fuzz::decode(bytes.data(), bytes.size(), lim);
    if (is_merge(in.the_case.problem)) cases.push_back(std::move(in.the_case));
  }
  double ms[3] = {0, 0, 0};
  for (const Case& c : cases) {
    const KernelEntry* ks[3] = {merge, online, flash};
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      PreparedCase pc(i < 2 ? c : unmerged(c), threads);
      (void)check_case(*dev, *ks[i], pc, ro);
      ms[i] += ms_since(t0);
    }
  }
  const double n = static_cast<double>(std::max<size_t>(cases.size(), 1));
  std::printf("mix cases=%zu (fuzz-decoded merge cases, f32) ms_per_check: merge-states=%.2f merge-states-online=%.2f "
              "flash-bm16-bn32(unmerged)=%.2f ratio_merge_vs_flash=%.2f\n",
              cases.size(), ms[0] / n, ms[1] / n, ms[2] / n, (ms[0] + ms[1]) / (2 * ms[2]));
  return 0;
}
