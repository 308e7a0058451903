// compare.cpp - NaN-safe element judgement, worst elements, ratio map and the compare verdict.
#include "check/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <queue>
#include <string>

namespace attnfuzz {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}


// Keeps the k elements of highest ratio; ties keep the earlier element.
struct Worst {
  size_t k;
  int64_t seq = 0;
  struct Item {
    ElementReport e;
    int64_t seq;
  };
  struct Cmp {  // "a before b in the heap's order": the heap top is the weakest kept element
    bool operator()(const Item& a, const Item& b) const {
      return a.e.ratio > b.e.ratio || (a.e.ratio == b.e.ratio && a.seq < b.seq);
    }
  };
  std::priority_queue<Item, std::vector<Item>, Cmp> heap;
  void add(const ElementReport& e) {
    Item it{e, seq++};
    if (k == 0) return;
    if (heap.size() < k) {
      heap.push(it);
    } else if (Cmp{}(it, heap.top())) {
      heap.pop();
      heap.push(it);
    }
  }
  std::vector<ElementReport> sorted() {
    std::vector<Item> items;
    while (!heap.empty()) items.push_back(heap.top()), heap.pop();
    std::sort(items.begin(), items.end(), Cmp{});
    std::vector<ElementReport> out;
    for (auto& i : items) out.push_back(i.e);
    return out;
  }
};
}  // namespace

ElementJudgement judge_element(double expected, double got, double bound) {
  ElementJudgement j;
  const bool ef = std::isfinite(expected), gf = std::isfinite(got);
  if (!ef || !gf) {
    // Non-finite on at least one side: only the identical class passes (NaN-NaN, +inf/+inf, -inf/-inf).
    const bool same = (std::isnan(expected) && std::isnan(got)) || (!ef && !gf && expected == got);
    if (!same) {
      j.fail = j.nonfinite_mismatch = true;
      j.err = j.ratio = kInf;
    }
    return j;
  }
  j.err = std::fabs(got - expected);
  if (j.err == 0) return j;
  j.ratio = bound > 0 ? j.err / bound : kInf;
  j.fail = !(j.ratio <= 1);
  return j;
}

std::vector<double> compare_output(const Problem& p, const OracleResult& exact, const float* o,
                                   const float* lse, CheckResult& r, const CompareOptions& opts) {
  const int64_t Dv = p.head_dim_v;
  std::vector<double> map(static_cast<size_t>(p.seq_q * Dv), kNaN);
  Worst worst{opts.worst};
  const bool has_base = !exact.base_o.empty();
  const bool do_lse = lse != nullptr && opts.check_lse;
  int64_t compared = 0, failed = 0, nonfinite = 0, outside_rows = 0;
  double max_ratio = 0, max_abs = 0, base_ratio = 0, base_abs = 0;
  std::string outside_reason;
  auto fold_map = [&](int64_t s, int64_t d, double ratio) {
    double& m = map[static_cast<size_t>(s * Dv + d)];
    if (std::isnan(m) || ratio > m) m = ratio;  // explicit: a max-fold must not drop anything
  };
  auto account = [&](ElementReport e, const ElementJudgement& j, double base_expected, double base_got) {
    ++compared;
    e.ratio = j.ratio;
    worst.add(e);
    if (j.fail) ++failed;
    if (j.nonfinite_mismatch) ++nonfinite;
    if (j.ratio > max_ratio) max_ratio = j.ratio;
    if (std::isfinite(j.err) && j.err > max_abs) max_abs = j.err;
    if (has_base) {
      const ElementJudgement bj = judge_element(base_expected, base_got, e.bound);
      if (bj.ratio > base_ratio) base_ratio = bj.ratio;
      if (std::isfinite(bj.err) && bj.err > base_abs) base_abs = bj.err;
    }
  };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s : exact.sampled) {
        const RowInfo& info = exact.row(b, h, s);
        if (!info.computed) continue;
        if (!info.inside_contract()) {
          if (outside_rows++ == 0) {
            char buf[192];
            std::snprintf(buf, sizeof buf, "row b=%lld h=%lld s=%lld: %s (%.3g)", (long long)b, (long long)h,
                          (long long)s, contract_reason_text(info.contract), info.contract_value);
            outside_reason = buf;
          }
          continue;
        }
        double row_lse_ratio = 0;
        if (do_lse) {
          const size_t li = exact.lse_at(b, h, s);
          ElementReport e;
          e.is_lse = true;
          e.b = b, e.h = h, e.s = s;
          e.expected = exact.lse[li];
          e.got = lse[lse_index(p, b, h, s)];
          e.bound = exact.lse_bound[li];
          const ElementJudgement j = judge_element(e.expected, e.got, e.bound);
          account(e, j, e.expected, has_base ? exact.base_lse[li] : 0.0);
          row_lse_ratio = j.ratio;
        }
        for (int64_t d = 0; d < Dv; ++d) {
          const size_t oi = exact.o_at(b, s, h, d);
          ElementReport e;
          e.b = b, e.h = h, e.s = s, e.d = d;
          e.expected = exact.o[oi];
          e.got = o[o_index(p, b, s, h, d)];
          e.bound = exact.o_bound[oi];
          const ElementJudgement j = judge_element(e.expected, e.got, e.bound);
          account(e, j, e.expected, has_base ? exact.base_o[oi] : 0.0);
          fold_map(s, d, std::max(j.ratio, row_lse_ratio));
        }
      }
  r.worst = worst.sorted();
  r.compared = compared;
  r.failed = failed;
  r.max_ratio = max_ratio;
  r.max_abs_err = max_abs;
  r.baseline_max_ratio = has_base ? base_ratio : std::nan("");  // NaN: not computed (a passing check's)
  r.oracle_ms = exact.ms;
  char buf[256];
  if (has_base) {
    const bool agrees = max_abs <= opts.flash_k * base_abs;
    std::snprintf(
        buf, sizeof buf,
        "kernel max |err| %.3g vs %g x plain fp32 reference max |err| %.3g: %s (advisory; the verdict "
        "uses the bound; baseline max ratio %.3g)",
        max_abs, opts.flash_k, base_abs, agrees ? "within" : "beyond", base_ratio);
    r.evidence.push_back({"flash-rule", buf});
  }
  if (failed > 0) {
    r.verdict = Verdict::kFail;
    r.failure = nonfinite > 0 ? FailureClass::kNonFinite : FailureClass::kPrecision;
    const ElementReport& w = r.worst.front();
    std::snprintf(buf, sizeof buf,
                  "%lld of %lld elements beyond their bound (%lld NaN/Inf mismatches); worst %s",
                  (long long)failed, (long long)compared, (long long)nonfinite, element_name(w).c_str());
    r.reason = buf;
    r.reason += " expected " + fmt("%.9g", w.expected) + " got " + fmt("%.9g", w.got) + " bound " +
                fmt("%.3g", w.bound) + " ratio " + fmt("%.3g", w.ratio);
    if (outside_rows > 0) r.reason += "; " + std::to_string(outside_rows) + " rows outside the fp32 contract";
    r.evidence.push_back({"compare", r.reason});
  } else if (outside_rows > 0) {
    r.verdict = Verdict::kOutsideContract;
    r.failure = FailureClass::kNone;
    r.reason = std::to_string(outside_rows) + " rows outside the fp32 contract, first " + outside_reason;
    r.evidence.push_back({"compare", r.reason});
  } else {
    r.verdict = Verdict::kPass;
    r.failure = FailureClass::kNone;
    std::snprintf(buf, sizeof buf, "%lld elements within their bound (max ratio %.3g)", (long long)compared,
                  max_ratio);
    r.evidence.push_back({"compare", buf});
  }
  return map;
}

std::vector<GradMap> compare_gradients(const Problem& p, const GradResult& g, const float* dq, const float* dk,
                                       const float* dv, CheckResult& r, const CompareOptions& opts,
                                       const float* dsinks, const float* dbias) {
  std::vector<GradMap> maps = {{"dQ", p.seq_q, p.head_dim, {}}, {"dK", p.seq_k, p.head_dim, {}},
                               {"dV", p.seq_k, p.head_dim_v, {}}};
  for (GradMap& m : maps) m.ratio.assign(static_cast<size_t>(m.rows * m.cols), kNaN);
  if (!g.inside_contract) {
    r.verdict = Verdict::kOutsideContract;
    r.failure = FailureClass::kNone;
    r.reason = "the exact backward leaves the fp32 contract: " + g.why;
    r.evidence.push_back({"compare", r.reason});
    return maps;
  }
  Worst worst{opts.worst};
  int64_t compared = 0, failed = 0, nonfinite = 0, per_failed[5] = {0, 0, 0, 0, 0}, per_compared[5] = {0, 0, 0, 0, 0};
  double max_ratio = 0, max_abs = 0, per_max[5] = {0, 0, 0, 0, 0};
  static const char* const kVariantTensors[2] = {"dSink", "dBias"};
  auto one = [&](int t, int64_t b, int64_t s, int64_t h, int64_t d, double expected, double bound, float got) {
    ElementReport e;
    e.tensor = t < 3 ? maps[t].tensor : kVariantTensors[t - 3];
    e.b = b, e.h = h, e.s = s, e.d = d;
    e.expected = expected;
    e.got = got;
    e.bound = bound;
    const ElementJudgement j = judge_element(e.expected, e.got, e.bound);
    e.ratio = j.ratio;
    ++compared, ++per_compared[t];
    worst.add(e);
    if (j.fail) ++failed, ++per_failed[t];
    if (j.nonfinite_mismatch) ++nonfinite;
    max_ratio = std::max(max_ratio, j.ratio);
    per_max[t] = std::max(per_max[t], j.ratio);
    if (std::isfinite(j.err)) max_abs = std::max(max_abs, j.err);
    if (t >= 3) return;  // no heatmap for the variants' gradients
    double& m = maps[t].ratio[static_cast<size_t>(s * maps[t].cols + d)];
    if (std::isnan(m) || j.ratio > m) m = j.ratio;
  };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        if (!g.q_computed[static_cast<size_t>((b * p.seq_q + s) * p.heads_q + h)]) continue;
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const size_t i = g.dq_at(b, s, h, d);
          one(0, b, s, h, d, g.dq[i], g.dq_bound[i], dq[q_index(p, b, s, h, d)]);
        }
      }
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        if (!g.k_computed[static_cast<size_t>((b * p.seq_k + j) * p.heads_kv + h)]) continue;
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const size_t i = g.dk_at(b, j, h, d);
          one(1, b, j, h, d, g.dk[i], g.dk_bound[i], dk[k_index(p, b, j, h, d)]);
        }
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t i = g.dv_at(b, j, h, d);
          one(2, b, j, h, d, g.dv[i], g.dv_bound[i], dv[v_index(p, b, j, h, d)]);
        }
      }
  // Score variants: d sink per head (reported at h), d bias per element (reported at b, h, s = i, d = j of its
  // first (b, h, i, j) in the bias layout).
  if (dsinks && !g.dsinks.empty())
    for (int64_t h = 0; h < p.heads_q; ++h)
      one(3, 0, 0, h, 0, g.dsinks[static_cast<size_t>(h)], g.dsinks_bound[static_cast<size_t>(h)], dsinks[h]);
  if (dbias && !g.dbias.empty()) {
    std::vector<unsigned char> seen(g.dbias.size(), 0);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seq_q; ++i)
          for (int64_t j = 0; j < p.seq_k; ++j) {
            const size_t e = static_cast<size_t>(bias_index(p, b, h, i, j));
            if (seen[e]) continue;
            seen[e] = 1;
            one(4, b, i, h, j, g.dbias[e], g.dbias_bound[e], dbias[e]);
          }
  }
  r.worst = worst.sorted();
  r.compared = compared;
  r.failed = failed;
  r.max_ratio = max_ratio;
  r.max_abs_err = max_abs;
  r.oracle_ms = g.ms;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "dQ %lld of %lld beyond the bound (max ratio %.3g), dK %lld of %lld (%.3g), dV %lld of %lld "
                "(%.3g)",
                (long long)per_failed[0], (long long)per_compared[0], per_max[0], (long long)per_failed[1],
                (long long)per_compared[1], per_max[1], (long long)per_failed[2], (long long)per_compared[2],
                per_max[2]);
  std::string counts = buf;
  for (int t = 3; t < 5; ++t)
    if (per_compared[t])
      counts += std::string(", ") + kVariantTensors[t - 3] + " " + std::to_string(per_failed[t]) + " of " +
                std::to_string(per_compared[t]) + fmt(" (%.3g)", per_max[t]);
  if (failed > 0) {
    r.verdict = Verdict::kFail;
    r.failure = nonfinite > 0 ? FailureClass::kNonFinite : FailureClass::kPrecision;
    const ElementReport& w = r.worst.front();
    r.tensor = w.tensor;
    std::snprintf(buf, sizeof buf, "%lld of %lld gradient elements beyond their bound (%lld NaN/Inf mismatches); worst %s",
                  (long long)failed, (long long)compared, (long long)nonfinite, element_name(w).c_str());
    r.reason = buf;
    r.reason += " expected " + fmt("%.9g", w.expected) + " got " + fmt("%.9g", w.got) + " bound " +
                fmt("%.3g", w.bound) + " ratio " + fmt("%.3g", w.ratio);
    r.evidence.push_back({"compare", r.reason + "; " + counts});
  } else {
    r.verdict = Verdict::kPass;
    r.failure = FailureClass::kNone;
    r.evidence.push_back({"compare", std::to_string(compared) + " gradient elements within their bound: " + counts});
  }
  return maps;
}

}  // namespace attnfuzz
