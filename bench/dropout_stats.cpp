// dropout_stats.cpp - the cost of the dropout checks per case (issue 29), and the false-alarm soak on a correct kernel.
//   dropout_stats [--reps N]                           cost: reference mask, keep-fraction test, oracle with / without
//   dropout_stats --soak N [--seed S] [--kernel K]     N random dropout cases on a correct kernel; exit 1 on any failure
// scripts/dropout_soak.sh runs the soak in parallel (the 10^5-case soak of docs/semantics.md "Dropout").
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/dropout.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"
#include "oracle/oracle.h"

using namespace attnfuzz;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int cost(int reps) {
  for (int64_t n : {64, 256, 1024}) {
    Problem p = make_problem(1, 4, 2, n, n, 64, 64);
    (void)parse_mask("causal-br", p);
    (void)set_dropout(p, 0.1, AF_DROPOUT_RNG_EXPORTED, 42, 0);
    Case c = make_case(p, 1);
    const Tensors t = generate(c);
    double mask_ms = 0, test_ms = 0, with_ms = 0, without_ms = 0;
    KeepTest kt;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      const std::vector<uint8_t> keep = reference_keep_mask(p);
      mask_ms += ms_since(t0);
      t0 = std::chrono::steady_clock::now();
      kt = keep_fraction_test(p, keep);
      test_ms += ms_since(t0);
      VariantInputs vars;
      vars.dropout_keep = keep.data();
      OracleOptions o;
      o.baseline = false;
      t0 = std::chrono::steady_clock::now();
      (void)compute_oracle(p, t.q.data(), t.k.data(), t.v.data(), vars, o);
      with_ms += ms_since(t0);
      Problem plain = p;
      plain.variants = 0;
      t0 = std::chrono::steady_clock::now();
      (void)compute_oracle(plain, t.q.data(), t.k.data(), t.v.data(), o);
      without_ms += ms_since(t0);
    }
    std::printf("case=B1xHq4xSq%lldxSk%lld_D64_causal mask_ms=%.3f keep_test_ms=%.3f keep_tests=%lld oracle_dropout_ms=%.2f "
                "oracle_plain_ms=%.2f stats_over_oracle=%.4f\n",
                (long long)n, (long long)n, mask_ms / reps, test_ms / reps, (long long)kt.tests, with_ms / reps,
                without_ms / reps, (mask_ms + test_ms) / with_ms);
  }
  return 0;
}

// A random dropout case: small shapes, every mask form, p from 0 to 0.999, offsets near 2^32, both generators and passes.
Case soak_case(Rng& r, uint64_t n) {
  static const double kP[] = {0, 0.01, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.999};
  static const char* kMasks[] = {"none", "causal-br", "causal-tl", "window:8,8-br", "window:3,0-tl"};
  const int64_t hkv = 1 + static_cast<int64_t>(r.below(2)), hq = hkv * (1 + static_cast<int64_t>(r.below(2)));
  const int64_t sq = 1 + static_cast<int64_t>(r.below(48)), sk = 1 + static_cast<int64_t>(r.below(80));
  const int64_t d = 1 + static_cast<int64_t>(r.below(32));
  Case c = make_case(make_problem(1 + static_cast<int64_t>(r.below(2)), hq, hkv, sq, sk, d, d), r.next());
  (void)parse_mask(kMasks[r.below(5)], c.problem);
  const uint64_t offset = r.below(4) == 0 ? (uint64_t{1} << 32) - r.below(256) : r.below(1u << 20);
  const int32_t rng = r.below(2) ? AF_DROPOUT_RNG_EXPORTED : AF_DROPOUT_RNG_PHILOX_FLASH;
  (void)set_dropout(c.problem, kP[r.below(9)], rng, r.next(), offset);
  c.pass = r.below(3) == 0 ? Pass::kFwdBwd : Pass::kFwd;
  c.label = "soak-" + std::to_string(n);
  return c;
}

int soak(uint64_t cases, uint64_t seed, const std::string& kernel) {
  DeviceOptions o;
  o.order = ThreadOrder::kShuffle;
  o.order_seed = seed;
  o.isolate = false;  // a correct kernel: a fork per launch would cost ~4x, and a crash ends the soak loudly anyway
  std::unique_ptr<Device> dev = open_device("cpu", o);
  const KernelEntry* k = Registry::global().find(Backend::kCpu, kernel);
  if (!k) {
    std::fprintf(stderr, "dropout_stats: no cpu kernel '%s'\n", kernel.c_str());
    return 2;
  }
  Rng r(seed, 29);
  std::map<std::string, uint64_t> verdicts;
  uint64_t failed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t n = 0; n < cases; ++n) {
    PreparedCase pc(soak_case(r, n));
    const Judged j = check_case(*dev, *k, pc, RunOptions{});
    ++verdicts[verdict_name(j.result.verdict)];
    if (j.result.verdict == Verdict::kFail) {
      ++failed;
      std::printf("false-alarm: %s: %s: %s\n", failure_class_name(j.result.failure), describe(pc.the_case()).c_str(),
                  j.result.reason.c_str());
    }
    if ((n + 1) % 1000 == 0) {  // survives a timeout: the script sums the last progress line of an unfinished worker
      std::printf("soak-progress seed=%llu cases=%llu false_alarms=%llu\n", (unsigned long long)seed,
                  (unsigned long long)(n + 1), (unsigned long long)failed);
      std::fflush(stdout);
    }
  }
  std::printf("soak kernel=%s seed=%llu cases=%llu", kernel.c_str(), (unsigned long long)seed, (unsigned long long)cases);
  for (const auto& [v, c] : verdicts) std::printf(" %s=%llu", v.c_str(), (unsigned long long)c);
  std::printf(" false_alarms=%llu seconds=%.1f\n", (unsigned long long)failed, ms_since(t0) / 1000);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  uint64_t soak_cases = 0, seed = 1;
  std::string kernel = "flash-bm16-bn32";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--soak")) soak_cases = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--seed")) seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--kernel")) kernel = argv[i + 1];
    else {
      std::fprintf(stderr, "dropout_stats: unknown option %s (--reps N | --soak N --seed S --kernel K)\n", argv[i]);
      return 2;
    }
  }
  return soak_cases ? soak(soak_cases, seed, kernel) : cost(reps < 1 ? 1 : reps);
}
