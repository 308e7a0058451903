// sequences_speed.cpp - benchmark (issue 15): oracle and check cost per case of a packed / paged batch vs the
// same sequences one by one, and fuzz cases/s on varlen and paged cases (name=value lines).
//
// Side by side, same process, same values: the batch case (B sequences in one layout) and B cases of one
// sequence each (the same layout, batch 1, the same values: what the packing property compares). The check
// uses the first registered cpu kernel that declares the layout (af_kernel::features); without one the check
// lines say "skipped". Fuzz cases/s: the campaign's mutator (CaseDomain::mutate + encode/decode) until a
// sequence-layout input, then PreparedCase + check_case, in-process on one thread. Issue 28: each layout's case with
// sinks, softcap and ALiBi against the plain one (oracle and check, and their verdicts).
// Usage: sequences_speed [--seconds S] [--kernel NAME]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"
#include "check/sequences.h"
#include "fuzz/codec.h"

using namespace attnfuzz;
using Clock = std::chrono::steady_clock;

namespace {

double since_ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

const KernelEntry* kernel_for(const Problem& p, const std::string& name) {
  for (const KernelEntry& k : Registry::global().all()) {
    if (k.backend != Backend::kCpu || (!name.empty() && name != k.kernel.name)) continue;
    if (std::string(k.kernel.family).rfind("planted", 0) == 0) continue;
    if (unsupported_reason(k.kernel, p).empty()) return &k;
  }
  return nullptr;
}

// Sequence b of c alone: batch 1, the same layout, the same values.
Case alone(const Case& c, const Tensors& t, int64_t b) {
  Case one = c;
  one.problem.batch = 1;
  one.values.specials.clear();
  for (auto* v : {&one.seqs.q, &one.seqs.k, &one.seqs.used})
    if (!v->empty()) *v = {(*v)[static_cast<size_t>(b)]};
  if (!set_sequence_fields(one).empty()) throw std::logic_error("alone: invalid");
  Tensors ot = generate(one);
  const Problem &p = c.problem, &po = one.problem;
  for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t d = 0; d < p.head_dim; ++d) ot.q[q_offset(po, ot, 0, s, h, d)] = t.q[q_offset(p, t, b, s, h, d)];
  for (int64_t s = 0; s < seq_len_k(p, t, b); ++s)
    for (int64_t h = 0; h < p.heads_kv; ++h) {
      for (int64_t d = 0; d < p.head_dim; ++d) ot.k[k_offset(po, ot, 0, s, h, d)] = t.k[k_offset(p, t, b, s, h, d)];
      for (int64_t d = 0; d < p.head_dim_v; ++d) ot.v[v_offset(po, ot, 0, s, h, d)] = t.v[v_offset(p, t, b, s, h, d)];
    }
  one.explicit_values = ExplicitValues{ot.q, ot.k, ot.v};
  return one;
}

void side_by_side(Device& dev, const std::string& name, const Case& c, const std::string& kname) {
  const Tensors t = generate(c);
  OracleOptions oo;
  std::vector<Case> ones;
  for (int64_t b = 0; b < c.problem.batch; ++b)
    if (seq_len_q(c.problem, t, b) > 0) ones.push_back(alone(c, t, b));
  // Best of 3 each, alternating, after a warm-up of both (thread pool, allocator).
  OracleResult batch;
  double batch_ms = 1e300, ones_ms = 1e300;
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = Clock::now();
    batch = sequence_oracle(c.problem, t, oo);
    if (rep) batch_ms = std::min(batch_ms, since_ms(t0));
    t0 = Clock::now();
    for (const Case& o : ones) {
      const Tensors ot = generate(o);
      (void)sequence_oracle(o.problem, ot, oo);
    }
    if (rep) ones_ms = std::min(ones_ms, since_ms(t0));
  }
  auto t0 = Clock::now();
  std::printf("%s_oracle_batch_ms=%.2f\n%s_oracle_one_by_one_ms=%.2f\n%s_oracle_ratio=%.2f\n", name.c_str(), batch_ms,
              name.c_str(), ones_ms, name.c_str(), ones_ms / batch_ms);
  std::printf("%s_rows=%lld\n", name.c_str(), (long long)batch.rows_computed);
  const KernelEntry* k = kernel_for(c.problem, kname);
  if (!k) {
    std::printf("%s_check=skipped (no cpu kernel declares %s)\n", name.c_str(), layout_name(c.problem).c_str());
    return;
  }
  RunOptions ro;
  (void)check_case(dev, *k, *std::make_unique<PreparedCase>(c), ro);  // warm-up
  t0 = Clock::now();
  PreparedCase pc(c);  // generation counted on both sides
  const Judged j = check_case(dev, *k, pc, ro);
  const double check_ms = since_ms(t0);
  t0 = Clock::now();
  bool all_pass = j.result.verdict == Verdict::kPass;
  for (const Case& o : ones) {
    PreparedCase po(o);
    all_pass &= check_case(dev, *k, po, ro).result.verdict == Verdict::kPass;
  }
  const double ones_check_ms = since_ms(t0);
  std::printf("%s_kernel=%s\n%s_check_batch_ms=%.2f\n%s_check_one_by_one_ms=%.2f\n%s_check_ratio=%.2f\n%s_all_pass=%d\n",
              name.c_str(), k->kernel.name, name.c_str(), check_ms, name.c_str(), ones_check_ms, name.c_str(),
              ones_check_ms / check_ms, name.c_str(), all_pass ? 1 : 0);
}

// Issue 28 on a layout: the same case with sinks, softcap and ALiBi against the plain one, oracle and check (best of
// 3 each, alternating, after a warm-up), and the check's verdicts (a kernel declaring AF_FEATURE_LAYOUT_VARIANTS).
void variant_cost(Device& dev, const std::string& name, const Case& plain, const std::string& kname) {
  Case var = plain;
  if (std::string e = set_variants(var, AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI, 30.0f, ""); !e.empty())
    throw std::logic_error(e);
  const Tensors tp = generate(plain), tv = generate(var);
  const KernelEntry* k = kernel_for(var.problem, kname);
  OracleOptions oo;
  RunOptions ro;
  double ms[2][2] = {{1e300, 1e300}, {1e300, 1e300}};  // [plain, variants][oracle, check]
  bool pass[2] = {true, true};
  for (int rep = 0; rep < 4; ++rep)
    for (int i = 0; i < 2; ++i) {
      const Case& c = i ? var : plain;
      auto t0 = Clock::now();
      (void)sequence_oracle(c.problem, i ? tv : tp, oo);
      if (rep) ms[i][0] = std::min(ms[i][0], since_ms(t0));
      if (!k) continue;
      t0 = Clock::now();
      PreparedCase pc(c);
      pass[i] &= check_case(dev, *k, pc, ro).result.verdict == Verdict::kPass;
      if (rep) ms[i][1] = std::min(ms[i][1], since_ms(t0));
    }
  std::printf("%s_oracle_plain_ms=%.2f\n%s_oracle_variants_ms=%.2f\n%s_oracle_variants_ratio=%.2f\n", name.c_str(),
              ms[0][0], name.c_str(), ms[1][0], name.c_str(), ms[1][0] / ms[0][0]);
  if (!k) {
    std::printf("%s_check=skipped (no cpu kernel declares sink+softcap+alibi on %s)\n", name.c_str(),
                layout_name(var.problem).c_str());
    return;
  }
  std::printf("%s_kernel=%s\n%s_check_plain_ms=%.2f\n%s_check_variants_ms=%.2f\n%s_check_variants_ratio=%.2f\n"
              "%s_all_pass=%d\n",
              name.c_str(), k->kernel.name, name.c_str(), ms[0][1], name.c_str(), ms[1][1], name.c_str(),
              ms[1][1] / ms[0][1], name.c_str(), pass[0] && pass[1] ? 1 : 0);
}

void fuzz_rate(Device& dev, const std::string& name, bool paged, double seconds, const std::string& kname) {
  const fuzz::CaseDomain dom;
  Rng rng(paged ? 2 : 1);
  fuzz::FuzzInput in = dom.init(rng);
  int64_t cases = 0, checks = 0, fails = 0;
  const auto t0 = Clock::now();
  while (since_ms(t0) < seconds * 1000) {
    dom.mutate(in, rng);
    const Problem& p = in.the_case.problem;
    if (!has_sequences(p) || (p.kv_layout == AF_SEQ_PAGED) != paged) continue;
    ++cases;
    const KernelEntry* k = kernel_for(p, kname);
    if (!k) continue;
    PreparedCase pc(in.the_case);
    RunOptions ro;
    ro.oracle.threads = 1;
    fails += check_case(dev, *k, pc, ro).result.verdict == Verdict::kFail;
    ++checks;
  }
  const double s = since_ms(t0) / 1000;
  std::printf("%s_fuzz_inputs_per_s=%.1f\n%s_fuzz_checks_per_s=%.1f\n%s_fuzz_fails=%lld\n", name.c_str(), cases / s,
              name.c_str(), checks / s, name.c_str(), (long long)fails);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  std::string kname;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--kernel") && i + 1 < argc) kname = argv[++i];
    else {
      std::fprintf(stderr, "usage: sequences_speed [--seconds S] [--kernel NAME]\n");
      return 2;
    }
  }
  DeviceOptions o;
  o.isolate = false;
  std::unique_ptr<Device> dev = open_device("cpu", o);
  auto varlen = [](std::vector<int64_t> q, std::vector<int64_t> k) {
    Case c = make_case(make_problem(static_cast<int64_t>(q.size()), 4, 2, 1, 1, 64, 64), 1);
    c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
    (void)parse_mask("causal-br", c.problem);
    c.seqs.q = std::move(q);
    c.seqs.k = std::move(k);
    if (std::string e = set_sequence_fields(c); !e.empty()) throw std::logic_error(e);
    return c;
  };
  auto paged = [](std::vector<int64_t> used, int32_t page, int64_t sq) {
    Case c = make_case(make_problem(static_cast<int64_t>(used.size()), 8, 1, sq, 1, 64, 64), 2);
    c.problem.kv_layout = AF_SEQ_PAGED;
    c.problem.page_size = page;
    (void)parse_mask("causal-br", c.problem);
    c.seqs.used = std::move(used);
    c.seqs.page_order = 7;
    c.seqs.spare_pages = 2;
    if (std::string e = set_sequence_fields(c); !e.empty()) throw std::logic_error(e);
    return c;
  };
  side_by_side(*dev, "varlen_4seq", varlen({17, 0, 33, 128}, {17, 5, 64, 128}), kname);
  side_by_side(*dev, "varlen_16x1", varlen(std::vector<int64_t>(16, 1), std::vector<int64_t>(16, 1)), kname);
  side_by_side(*dev, "varlen_long_short", varlen({3, 200, 5, 2}, {3, 200, 5, 2}), kname);
  side_by_side(*dev, "paged_decode", paged({33, 1, 200, 65}, 16, 1), kname);
  variant_cost(*dev, "varlen_4seq_variants", varlen({17, 0, 33, 128}, {17, 5, 64, 128}), kname);
  variant_cost(*dev, "paged_decode_variants", paged({33, 1, 200, 65}, 16, 1), kname);
  fuzz_rate(*dev, "varlen", false, seconds, kname);
  fuzz_rate(*dev, "paged", true, seconds, kname);
  return 0;
}
