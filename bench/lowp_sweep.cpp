// lowp_sweep.cpp - the low-precision bound measurement (issue 13): every correct kernel of each dtype over that
// dtype's sweep grid and random cases, worst err/bound and false positives per dtype; and the oracle's cost
// per case on f16 vs f32 inputs of the same shapes, side by side.
//   lowp_sweep [--backend cpu] [--random N] [--seed S] [--max-work W] [--kernel PATTERN]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"
#include "oracle/oracle.h"

using namespace attnfuzz;

namespace {

int64_t work(const Problem& p) {
  return p.batch * p.heads_q * p.seq_q * std::max<int64_t>(p.seq_k, 1) * std::max(p.head_dim, p.head_dim_v);
}

// Random cases of dtype dt: edge lengths and dims, every mask form, uniform / normal / extreme / vbias values
// and the dtype's stress inputs; fp8 with descales from the case space.
std::vector<Case> random_cases(int32_t dt, int n, uint64_t seed, int64_t max_work) {
  std::vector<Case> out;
  Rng rng(seed, 0x10f);
  const auto lens = space::edge_seq_lengths(130);
  const auto dims = space::edge_head_dims(128);
  const auto& masks = space::mask_forms();
  const auto ext = space::lowp_extreme_magnitudes(dt);
  const auto uni = space::lowp_uniform_widths(dt);
  for (int tries = 0; static_cast<int>(out.size()) < n && tries < 100 * n; ++tries) {
    const auto hc = space::head_configs()[rng.below(space::head_configs().size())];
    Problem p = make_problem(1, hc.first, hc.second, lens[rng.below(lens.size())], lens[rng.below(lens.size())],
                             dims[rng.below(dims.size())], 0);
    p.head_dim_v = rng.below(4) ? p.head_dim : dims[rng.below(dims.size())];
    set_contiguous_strides(p);
    if (!parse_mask(masks[rng.below(masks.size())], p).empty() || work(p) > max_work) continue;
    p.dtype = dt;
    if (dt == AF_DTYPE_FP8_E4M3 || dt == AF_DTYPE_FP8_E5M2) {
      const auto& d = space::fp8_descales();
      p.q_descale = d[rng.below(d.size())], p.k_descale = d[rng.below(d.size())];
      p.v_descale = d[rng.below(d.size())];
    }
    Case c = make_case(p, rng.next());
    switch (rng.below(6)) {
      case 0: c.values.dist = {Distribution::kNormal, 1}; break;
      case 1: c.values.dist = {Distribution::kExtreme, space::extreme_magnitudes()[rng.below(6)]}; break;
      case 2: c.values.dist = {Distribution::kVBias, 1}; break;
      case 3:
        if (!ext.empty()) c.values.dist = {Distribution::kExtreme, ext[rng.below(ext.size())]};
        break;
      case 4:
        if (!uni.empty()) c.values.dist = {Distribution::kUniform, uni[rng.below(uni.size())]};
        break;
      default: break;
    }
    c.label = "random-" + std::to_string(out.size());
    if (validate(c).empty()) out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "cpu", kernels = "all";
  int n_random = 60;
  uint64_t seed = 1;
  int64_t max_work = int64_t{1} << 21;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "lowp_sweep: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--backend") backend = v;
    else if (a == "--random") n_random = std::atoi(v.c_str());
    else if (a == "--seed") seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--max-work") max_work = std::atoll(v.c_str());
    else if (a == "--kernel") kernels = v;
    else {
      std::fprintf(stderr, "lowp_sweep: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::unique_ptr<Device> dev = open_device(backend, DeviceOptions{});
  std::printf("device=%s\n", dev->name().c_str());
  RunOptions ro;
  for (int32_t dt : {AF_DTYPE_F16, AF_DTYPE_BF16, AF_DTYPE_FP8_E4M3, AF_DTYPE_FP8_E5M2}) {
    std::string tag = dtype_name(dt);
    std::replace(tag.begin(), tag.end(), '-', '_');
    std::vector<Case> cases;
    for (Case& c : sweep_grid(0, ValueDomain::kIeee, dt))
      if (work(c.problem) <= max_work) cases.push_back(std::move(c));
    const size_t n_sweep = cases.size();
    for (Case& c : random_cases(dt, n_random, seed, max_work)) cases.push_back(std::move(c));
    std::vector<PreparedCase> pcs(cases.begin(), cases.end());
    int64_t kernels_run = 0;
    for (const KernelEntry* k : Registry::global().select(dev->backend(), kernels)) {
      if (k->origin != "built-in" || !((k->kernel.dtypes ? k->kernel.dtypes : AF_SUPPORTS_F32) & (1u << dt)))
        continue;
      ++kernels_run;
      int64_t pass = 0, fail = 0, outside = 0, unsupported = 0;
      double worst = 0;
      std::string worst_case;
      for (PreparedCase& pc : pcs) {
        const Judged j = check_case(*dev, *k, pc, ro);
        switch (j.result.verdict) {
          case Verdict::kPass: ++pass; break;
          case Verdict::kFail:
            ++fail;
            std::printf("# FAIL %s %s: %s\n", k->kernel.name, describe(pc.the_case()).c_str(), j.result.reason.c_str());
            break;
          case Verdict::kOutsideContract: ++outside; break;
          default: ++unsupported; break;
        }
        if (j.result.verdict == Verdict::kPass && j.result.max_ratio > worst) {
          worst = j.result.max_ratio;
          worst_case = pc.the_case().label + " (" + describe(pc.the_case()) + ")";
        }
      }
      std::printf("%s_%s_cases=%zu  (sweep %zu, random %zu)\n", tag.c_str(), k->kernel.name, pcs.size(), n_sweep,
                  pcs.size() - n_sweep);
      std::printf("%s_%s_false_positives=%lld  (pass %lld, outside %lld, unsupported %lld)\n", tag.c_str(),
                  k->kernel.name, (long long)fail, (long long)pass, (long long)outside, (long long)unsupported);
      std::printf("%s_%s_max_ratio=%.4g  (worst: %s)\n", tag.c_str(), k->kernel.name, worst, worst_case.c_str());
    }
    std::printf("%s_kernels=%lld\n", tag.c_str(), (long long)kernels_run);
  }
  // Oracle cost per case: the same random shapes and seeds with f32 inputs and with f16 inputs.
  const std::vector<Case> f16 = random_cases(AF_DTYPE_F16, n_random, seed + 1, max_work);
  double ms[2] = {0, 0};
  for (const Case& c16 : f16) {
    Case c32 = c16;
    c32.problem.dtype = AF_DTYPE_F32;
    for (int i = 0; i < 2; ++i) {
      const Case& c = i ? c16 : c32;
      const Tensors t = generate(c);
      const auto t0 = std::chrono::steady_clock::now();
      (void)compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), ro.oracle);
      ms[i] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  const double n = static_cast<double>(std::max<size_t>(f16.size(), 1));
  std::printf("oracle_ms_per_case_f32=%.4f\n", ms[0] / n);
  std::printf("oracle_ms_per_case_f16=%.4f\n", ms[1] / n);
  std::printf("oracle_cost_ratio_f16_over_f32=%.3f  (%zu cases, same shapes and seeds)\n", ms[1] / std::max(ms[0], 1e-9),
              f16.size());
  return 0;
}
