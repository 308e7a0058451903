// merge_verdicts.cpp - merge kernels over generated merge cases, one line per (case, kernel) with the verdict, class,
// reason and hashes of the states' and oracles' bits: run before and after a change to the merge check, diff the lines.
//   merge_verdicts [--random N] [--seed S] [--plugin PATH] [--no-classify]
// Cases: the merge sweep grid (f32, f16, bf16) and N fuzz-decoded merge cases (the campaign's decoder, dtype any).
// Kernels: merge-states, merge-states-online, and the planted merge kernels of --plugin. Oracle threads = 1 (the
// campaign's setting). Prints "time_ms=" last: the whole run, for a before / after figure.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/classify.h"
#include "check/runner.h"
#include "fuzz/codec.h"
#include "fuzz/worker.h"

using namespace attnfuzz;

namespace {

// FNV-1a over the bytes of a few arrays.
struct Hash {
  uint64_t h = fuzz::kFnvOffset;
  void bytes(const void* p, size_t n) { h = fuzz::fnv1a(p, n, h); }
  template <class T>
  void vec(const std::vector<T>& v) {
    bytes(v.data(), v.size() * sizeof(T));
  }
  void oracle(const OracleResult& r) {
    for (const auto* x : {&r.o, &r.o_bound, &r.lse, &r.lse_bound}) vec(*x);
    for (const RowInfo& i : r.rows) {
      const unsigned char f[4] = {static_cast<unsigned char>(i.computed), static_cast<unsigned char>(i.kind),
                                  static_cast<unsigned char>(i.contract), static_cast<unsigned char>(i.fell_back)};
      bytes(f, sizeof f);
    }
  }
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "merge_verdicts: %s (usage: merge_verdicts [--random N] [--seed S] [--plugin PATH] [--no-classify])\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int random = 200;
  uint64_t seed = 1;
  std::string plugin;
  bool classify = true;
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (!std::strcmp(argv[i], "--random") && has)
      random = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--seed") && has)
      seed = std::strtoull(argv[++i], nullptr, 0);
    else if (!std::strcmp(argv[i], "--plugin") && has)
      plugin = argv[++i];
    else if (!std::strcmp(argv[i], "--no-classify"))
      classify = false;
    else
      usage((std::string("unknown or incomplete option ") + argv[i]).c_str());
  }
  if (random < 0) usage("--random must be >= 0");
  const auto t0 = std::chrono::steady_clock::now();
  DeviceOptions dopt;
  dopt.isolate = false;
  dopt.workers = 1;
  std::unique_ptr<Device> dev = open_device("cpu", dopt);
  Registry& reg = Registry::global();
  std::string patterns = "merge-states,merge-states-online";
  if (!plugin.empty()) {
    try {
      reg.load_plugin(plugin);
    } catch (const std::exception& e) {
      usage(e.what());
    }
    patterns += ",planted-merge-*";
  }
  const std::vector<const KernelEntry*> kernels = reg.select(Backend::kCpu, patterns);

  std::vector<Case> cases;
  for (int32_t dt : {AF_DTYPE_F32, AF_DTYPE_F16, AF_DTYPE_BF16})
    for (Case& c : merge_sweep_grid(seed, dt)) cases.push_back(std::move(c));
  const size_t grid = cases.size();
  fuzz::FuzzLimits lim;
  lim.merge = true;
  lim.dtype = -1;
  std::mt19937_64 rng(seed);
  for (int tries = 0; static_cast<int>(cases.size() - grid) < random && tries < 100 * (random + 1); ++tries) {
    std::vector<uint8_t> bytes(64 + rng() % 448);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    fuzz::FuzzInput in = fuzz::decode(bytes.data(), bytes.size(), lim);
    if (!is_merge(in.the_case.problem)) continue;
    in.the_case.label = "random-" + std::to_string(cases.size() - grid);
    cases.push_back(std::move(in.the_case));
  }

  RunOptions ro;
  ro.oracle.threads = 1;
  int pass = 0, fail = 0, other = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    PreparedCase pc(cases[i], ro.oracle.threads);
    Hash hs;
    hs.vec(pc.tensors().state_o);
    hs.vec(pc.tensors().state_lse);
    for (const KernelEntry* k : kernels) {
      Judged j = check_case(*dev, *k, pc, ro);
      if (classify && j.result.verdict == Verdict::kFail) (void)classify_failure(*dev, *k, pc, ro, j);
      Hash ho, hw;
      ho.oracle(pc.oracle(ro.oracle));
      if (const OracleResult* w = pc.merge_whole(ro.oracle)) hw.oracle(*w);
      const Verdict v = j.result.verdict;
      (v == Verdict::kPass ? pass : v == Verdict::kFail ? fail : other)++;
      std::printf("%zu %s kernel=%s verdict=%s class=%s decided_by=%s max_ratio=%.17g failed=%lld states=%016llx "
                  "merged=%016llx whole=%016llx reason=%s\n",
                  i, cases[i].label.c_str(), k->kernel.name, verdict_name(v), failure_class_name(j.result.failure),
                  j.result.decided_by.c_str(), j.result.max_ratio, static_cast<long long>(j.result.failed),
                  static_cast<unsigned long long>(hs.h), static_cast<unsigned long long>(ho.h),
                  static_cast<unsigned long long>(hw.h), j.result.reason.c_str());
    }
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("cases=%zu (grid %zu, random %zu) kernels=%zu checks=%zu pass=%d fail=%d other=%d\n", cases.size(), grid,
              cases.size() - grid, kernels.size(), cases.size() * kernels.size(), pass, fail, other);
  std::printf("time_ms=%.0f\n", ms);
  return 0;
}
