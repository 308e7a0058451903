// bound_sweep.cpp - measures the error/bound ratio of every correct cpu kernel (and the fp32 strategy
// models) over a random sweep with extreme logits: the measurement behind the oracle's safety factor.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/compare.h"
#include "oracle/oracle.h"
#include "tests/oracle/fp32_models.h"

using namespace attnfuzz;

namespace {

struct Stat {
  double max_ratio = 0, max_ratio_extreme = 0;
  int64_t cases = 0, fails = 0, outside = 0, skipped = 0, launch_errors = 0;
  std::string worst_case;
};

void account(Stat& st, const CheckResult& r, const Problem& p, double max_logit) {
  ++st.cases;
  if (r.verdict == Verdict::kOutsideContract) ++st.outside;
  if (r.verdict == Verdict::kFail) ++st.fails;
  if (r.max_ratio > st.max_ratio) {
    st.max_ratio = r.max_ratio;
    st.worst_case = describe(p) + " max_logit=" + std::to_string(max_logit);
  }
  if (max_logit >= 1e5) st.max_ratio_extreme = std::max(st.max_ratio_extreme, r.max_ratio);
}

std::vector<float> run_kernel(Device& dev, const af_kernel& k, const Problem& p, const testing::RandomCase& c,
                              std::vector<float>& lse_out, LaunchResult& lr) {
  auto bytes = [](int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float); };
  const size_t ws_bytes = k.workspace_bytes ? k.workspace_bytes(&p) : 0;
  void* q = dev.alloc(bytes(q_elements(p)));
  void* kk = dev.alloc(bytes(k_elements(p)));
  void* v = dev.alloc(bytes(v_elements(p)));
  void* o = dev.alloc(bytes(o_elements(p)));
  void* lse = dev.alloc(bytes(lse_elements(p)));
  void* ws = ws_bytes ? dev.alloc(ws_bytes) : nullptr;
  if (!c.q.empty()) dev.to_device(q, c.q.data(), c.q.size() * sizeof(float));
  if (!c.k.empty()) dev.to_device(kk, c.k.data(), c.k.size() * sizeof(float));
  if (!c.v.empty()) dev.to_device(v, c.v.data(), c.v.size() * sizeof(float));
  const uint32_t poison = 0x7fc0dead;
  dev.fill(o, &poison, 4, bytes(o_elements(p)));
  dev.fill(lse, &poison, 4, bytes(lse_elements(p)));
  af_buffers b{q, kk, v, o, k.writes_lse ? static_cast<float*>(lse) : nullptr, ws};
  lr = dev.launch(k, p, b);
  std::vector<float> out(std::max<int64_t>(o_elements(p), 1));
  lse_out.assign(std::max<int64_t>(lse_elements(p), 1), 0.0f);
  dev.to_host(out.data(), o, out.size() * sizeof(float));
  dev.to_host(lse_out.data(), lse, lse_out.size() * sizeof(float));
  for (void* x : {q, kk, v, o, lse, ws})
    if (x) dev.free(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  auto number = [](const char* a) { return *a && std::strspn(a, "0123456789") == std::strlen(a); };
  if (argc > 3 || (argc > 1 && !number(argv[1])) || (argc > 2 && !number(argv[2]))) {
    std::fprintf(stderr, "usage: bound_sweep [CASES, default 400] [SEED, default 1]\n");
    return 2;
  }
  const int64_t n_cases = argc > 1 ? std::atoll(argv[1]) : 400;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const auto t0 = std::chrono::steady_clock::now();
  OracleOptions oo;  // default safety factor
  std::printf("safety_factor=%g\n", oo.safety_factor);
  std::printf("cases=%lld\n", (long long)n_cases);

  std::vector<const KernelEntry*> kernels;
  for (const KernelEntry* e : Registry::global().select(Backend::kCpu, "all"))
    if (std::strncmp(e->kernel.family, "planted/", 8) != 0) kernels.push_back(e);
  DeviceOptions dopt;
  dopt.isolate = false;  // correct kernels: no crash expected, and the sweep runs thousands of launches
  dopt.order = ThreadOrder::kShuffle;
  std::unique_ptr<Device> dev = open_device("cpu", dopt);

  std::map<std::string, Stat> stats;
  struct Model {
    const char* name;
    testing::ModelOptions mo;
  };
  std::vector<Model> models;
  {
    testing::ModelOptions m;
    m.tile = 64, m.exp = testing::ExpKind::kApprox, m.approx_ulps = 4;
    models.push_back({"model/tiled-64-exp2-approx4ulp", m});
    m.tile = 16, m.splits = 4;
    models.push_back({"model/split4-tiled-16-exp2-approx4ulp", m});
  }
  testing::ModelOptions bug;
  bug.tile = 16;
  bug.missing_rescale = true;
  double bug_max_ratio = 0;
  int64_t bug_cases = 0, bug_detected = 0;

  testing::Rng rng(seed);
  const double logits[] = {1, 1e2, 1e4, 1e5, 1e6};
  for (int64_t i = 0; i < n_cases; ++i) {
    const double max_logit = logits[i % 5];
    testing::RandomCase c =
        testing::random_case(rng, i % 4 == 0 ? 150 : 48, i % 3 == 0 ? 128 : 64, max_logit);
    OracleOptions o = oo;
    const OracleResult ex = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), o);
    for (const KernelEntry* e : kernels) {
      Stat& st = stats[e->kernel.name];
      if (!unsupported_reason(e->kernel, c.p).empty()) {
        ++st.skipped;
        continue;
      }
      std::vector<float> lse;
      LaunchResult lr;
      const std::vector<float> out = run_kernel(*dev, e->kernel, c.p, c, lse, lr);
      if (lr.status != LaunchStatus::kOk) {
        ++st.launch_errors;
        continue;
      }
      CheckResult r;
      compare_output(c.p, ex, out.data(), e->kernel.writes_lse ? lse.data() : nullptr, r);
      account(st, r, c.p, max_logit);
      if (r.verdict == Verdict::kFail)
        std::printf("# FALSE POSITIVE %s case %lld: %s: %s\n", e->kernel.name, (long long)i,
                    describe(c.p).c_str(), r.reason.c_str());
    }
    for (const Model& m : models) {
      testing::ModelOptions mo = m.mo;
      mo.seed = i;
      const testing::ModelOut out = testing::run_model(c.p, c.q.data(), c.k.data(), c.v.data(), mo);
      CheckResult r;
      compare_output(c.p, ex, out.o.data(), out.lse.data(), r);
      account(stats[m.name], r, c.p, max_logit);
    }
    // The missing-rescale model (random cases: it only shows where the row max rises after a tile).
    if (c.p.seq_k >= 32) {
      const testing::ModelOut out = testing::run_model(c.p, c.q.data(), c.k.data(), c.v.data(), bug);
      CheckResult r;
      compare_output(c.p, ex, out.o.data(), out.lse.data(), r);
      if (r.verdict != Verdict::kOutsideContract) {
        bug_detected += r.verdict == Verdict::kFail;
        bug_max_ratio = std::max(bug_max_ratio, r.max_ratio);
        ++bug_cases;
      }
    }
  }
  double overall = 0;
  int64_t fails = 0;
  for (const auto& [name, st] : stats) {
    std::printf("%s.cases=%lld\n", name.c_str(), (long long)st.cases);
    std::printf("%s.skipped_unsupported=%lld\n", name.c_str(), (long long)st.skipped);
    std::printf("%s.launch_errors=%lld\n", name.c_str(), (long long)st.launch_errors);
    std::printf("%s.outside_contract=%lld\n", name.c_str(), (long long)st.outside);
    std::printf("%s.false_positives=%lld\n", name.c_str(), (long long)st.fails);
    std::printf("%s.max_ratio=%.4g\n", name.c_str(), st.max_ratio);
    std::printf("%s.max_ratio_logits_ge_1e5=%.4g\n", name.c_str(), st.max_ratio_extreme);
    std::printf("# %s worst case: %s\n", name.c_str(), st.worst_case.c_str());
    overall = std::max(overall, st.max_ratio);
    fails += st.fails;
  }
  std::printf("all.max_ratio=%.4g\n", overall);
  std::printf("all.false_positives=%lld\n", (long long)fails);
  std::printf("all.margin=%.3g\n", overall > 0 ? 1 / overall : INFINITY);
  // The smallest safety factor that would still have given zero false positives in this sweep.
  std::printf("all.min_safe_safety_factor=%.3g\n", overall * oo.safety_factor);
  std::printf("missing_rescale.cases=%lld\n", (long long)bug_cases);
  std::printf("missing_rescale.detected=%lld\n", (long long)bug_detected);
  std::printf("missing_rescale.max_ratio=%.4g\n", bug_max_ratio);
  std::printf("sweep_s=%.1f\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return fails == 0 ? 0 : 1;
}
