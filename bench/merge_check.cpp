// merge_check.cpp - a merge kernel's check against the single-problem check of the same keys, side by side (issue 29):
// the states (n sub-problem oracles), the merge launch and its exact merge, the whole-problem comparison.
//   merge_check [--reps N] [--sq S] [--sk S]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"

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
Cost measure(Device& dev, const KernelEntry& k, const Case& c, int reps, RunOptions ro) {
  Cost r;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    PreparedCase pc(c, ro.oracle.threads);
    r.prepare = std::min(r.prepare, ms_since(t0));
    const auto t1 = std::chrono::steady_clock::now();
    r.verdict = check_case(dev, k, pc, ro).result.verdict;
    r.check = std::min(r.check, ms_since(t1));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  int64_t sq = 256, sk = 256;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--sq")) sq = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--sk")) sk = std::atoll(argv[i + 1]);
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
  ro.oracle.threads = 1;
  std::printf("# check cost, B=1 Hq=4 Hkv=2 Sq=%lld Sk=%lld D=64 causal-br f32, cpu emulator in-process, 1 oracle thread, "
              "best of %d\n",
              (long long)sq, (long long)sk, reps);
  const Cost base = measure(*dev, *flash, plain, reps, ro);
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
    const Cost m = measure(*dev, *merge, c, reps, ro);
    const double total = m.prepare + m.check;
    std::printf("merge n_states=%d kernel=merge-states prepare_ms=%.1f (states) check_ms=%.1f (launch, merge oracle, whole "
                "problem) total_ms=%.1f verdict=%s ratio_vs_single=%.2f\n",
                n, m.prepare, m.check, total, verdict_name(m.verdict), total / (base.prepare + base.check));
  }
  return 0;
}
