// lse.cpp - the lse detector: O within its bound everywhere, LSE beyond it; fits the relation between the
// kernel's LSE and the exact one (factor, offset, sign, row max missing or alone).
#include <algorithm>
#include <cmath>

#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

namespace {

// The largest visible finite score of row (b, h, s), in double.
double row_max(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t s) {
  const KeyRange kr = visible_keys(p, s);
  const int64_t hk = kv_head(p, h);
  double m = -INFINITY;
  for (int64_t j = kr.first; j < kr.last; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < p.head_dim; ++d)
      dot += double(t.q[static_cast<size_t>(q_index(p, b, s, h, d))]) *
             double(t.k[static_cast<size_t>(k_index(p, b, j, hk, d))]);
    const double sc = double(p.scale) * dot;
    if (std::isfinite(sc)) m = std::max(m, sc);
  }
  return m;
}

struct Model {
  std::string text;
  int fits = 0;
};

}  // namespace

Finding lse(Context& c) {
  Finding f;
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  if (out.o.empty() || out.lse.empty()) return f;
  const std::vector<RowFailure> rows = row_failures(c);
  if (rows.empty()) return f;
  for (const RowFailure& r : rows)
    if (r.o_bad || r.kind != RowKind::kNormal || !r.lse_bad)
      return f;  // O wrong somewhere, or not a normal row
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);
  struct Pt {
    double e, g, m, tol;
  };
  std::vector<Pt> pts;
  std::vector<int64_t> srows;
  int64_t nonfinite = 0;
  std::string first;
  for (const RowFailure& r : rows) {
    const size_t e = ex.lse_at(r.key.b, r.key.h, r.key.s);
    const double g = out.lse[static_cast<size_t>(lse_index(p, r.key.b, r.key.h, r.key.s))];
    if (first.empty())
      first = fmt("LSE[b=%lld,h=%lld,s=%lld] expected %s got %s", (long long)r.key.b, (long long)r.key.h,
                  (long long)r.key.s, num(ex.lse[e]).c_str(), num(g).c_str());
    srows.push_back(r.key.s);
    if (!std::isfinite(g) || !std::isfinite(ex.lse[e])) {
      ++nonfinite;
      continue;
    }
    pts.push_back({ex.lse[e], g, row_max(p, c.view_tensors(), r.key.b, r.key.h, r.key.s),
                   std::max(8 * ex.lse_bound[e], 1e-5 * (1 + std::fabs(g)))});
  }
  std::sort(srows.begin(), srows.end());
  srows.erase(std::unique(srows.begin(), srows.end()), srows.end());
  std::string detail =
      fmt("O within its bound everywhere; LSE beyond it in %zu (b, h, row)s (s = ", rows.size()) +
      ranges(srows) + fmt(" of Sq=%lld)", (long long)p.seq_q);
  if (nonfinite)
    detail +=
        fmt(", %lld of them NaN/Inf where the exact LSE is finite (or the reverse)", (long long)nonfinite);
  detail += "; first " + first;
  if (!pts.empty()) {
    // Candidate relations got = f(exact, row max); the factor and the offset are taken from the median row.
    std::vector<double> ratios, offsets;
    for (const Pt& x : pts) {
      if (std::fabs(x.e) > 1e-3) ratios.push_back(x.g / x.e);
      offsets.push_back(x.g - x.e);
    }
    auto median = [](std::vector<double> v) -> double {
      if (v.empty()) return NAN;
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      return v[v.size() / 2];
    };
    const double fac = median(ratios), off = median(offsets);
    std::vector<Model> models;
    auto test = [&](std::string text, auto pred) {
      Model m{std::move(text)};
      for (const Pt& x : pts) {
        const double v = pred(x);
        m.fits += std::isfinite(v) && std::fabs(v - x.g) <= x.tol;
      }
      models.push_back(m);
    };
    test("the row max is not added back: LSE = log(sum exp(s - m)) without + m (got = exact - max score)",
         [](const Pt& x) { return x.e - x.m; });
    test("only the row max: the log of the sum is missing (got = max score)",
         [](const Pt& x) { return x.m; });
    test("sign flipped (got = -exact)", [](const Pt& x) { return -x.e; });
    test("base 2: got = log2(e) x exact (log2 of the sum, e.g. from an exp2 kernel)",
         [](const Pt& x) { return x.e * 1.4426950408889634; });
    test("got = ln(2) x exact (a base-2 LSE converted the wrong way)",
         [](const Pt& x) { return x.e * 0.6931471805599453; });
    if (std::isfinite(fac)) {
      std::string why;
      // fp8 (issue 13): a descale applied twice or not at all scales every score by q_descale x k_descale.
      const Problem& pp = c.problem();
      const double qk = double(pp.q_descale) * double(pp.k_descale);
      if ((pp.dtype == AF_DTYPE_FP8_E4M3 || pp.dtype == AF_DTYPE_FP8_E5M2) && qk != 1 &&
          (std::fabs(fac / qk - 1) < 0.1 || std::fabs(fac * qk - 1) < 0.1))
        why = "; close to " + std::string(std::fabs(fac / qk - 1) < 0.1 ? "" : "1 / ") + "q_descale x k_descale = " +
              num(qk) + ": the scores carry the descales twice, or not at all";
      test("constant factor " + num(fac) + " (got = f x exact)" + why, [&](const Pt& x) { return fac * x.e; });
    }
    test("constant offset " + num(off) + " (got = exact + c)", [&](const Pt& x) { return x.e + off; });
    const Model* best = nullptr;
    for (const Model& m : models)
      if (m.fits > 0 && (!best || m.fits > best->fits)) best = &m;
    if (best && best->fits * 10 >= static_cast<int>(pts.size()) * 9)
      detail += fmt("; relation found in %d of %zu finite rows: ", best->fits, pts.size()) + best->text;
    else
      detail +=
          fmt("; no simple relation (factor, offset, sign, row max) fits the %zu finite rows (median "
              "got/exact %s, median got - exact %s)",
              pts.size(), num(fac).c_str(), num(off).c_str());
  }
  f.fired = true;
  f.cls = FailureClass::kLse;
  f.evidence.push_back({"lse", detail});
  return f;
}

}  // namespace attnfuzz::detect
