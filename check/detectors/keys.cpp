// keys.cpp - the keys-ignored detector: a failing row equals exact attention over only the first n of the keys it
// must see (the rest reached neither O nor the softmax sum): class mask, in every dtype (the tail paddings are f32).
#include <cmath>

#include "check/detectors/detectors.h"
#include "oracle/lowp.h"

namespace attnfuzz::detect {

namespace {

constexpr int kRows = 4;  // failing rows tested, the worst first

// The n (1 <= n < keys) whose exact-in-long-double attention over the first n keys (from_back: the last n) of
// `keys` lies closest to the kernel's row, in units of the case's own row bounds; how many n lie within them.
struct Closest {
  int64_t n = 0, within = 0;
  double ratio = INFINITY;
};

class RowProbe {
 public:
  RowProbe(Context& c, int64_t b, int64_t h, int64_t s)
      : c_(c), p_(c.problem()), t_(c.view_tensors()), b_(b), h_(h), s_(s), keys_(c.seen_keys(b, h, s)) {}

  const std::vector<int64_t>& keys() const { return keys_; }

  // False when a score is NaN or +inf (the whole row is NaN: no subset to find) or the kernel's row is not finite.
  bool usable() const {
    for (int64_t d = 0; d < p_.head_dim_v; ++d)
      if (!std::isfinite(got(d))) return false;
    for (int64_t j : keys_) {
      const double sc = score(j);
      if (std::isnan(sc) || sc == INFINITY) return false;
    }
    return keys_.size() >= 2;
  }

  Closest closest(bool from_back) const {
    const OracleResult& ex = c_.pc.oracle(c_.opts.oracle);
    const int64_t m = static_cast<int64_t>(keys_.size()), dv = p_.head_dim_v;
    std::vector<long double> acc(static_cast<size_t>(dv), 0.0L);
    long double mx = -INFINITY, l = 0;
    Closest best;
    for (int64_t n = 1; n < m; ++n) {
      const int64_t j = keys_[static_cast<size_t>(from_back ? m - n : n - 1)];
      const long double sc = score(j);
      if (sc != -INFINITY) {
        const long double mnew = std::max(mx, sc), alpha = std::exp(mx - mnew), w = std::exp(sc - mnew);
        l = l * alpha + w;
        for (int64_t d = 0; d < dv; ++d)
          acc[static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] * alpha + w * value(j, d);
        mx = mnew;
      }
      double worst = 0;
      for (int64_t d = 0; d < dv; ++d) {
        const double o = l > 0 ? double(acc[static_cast<size_t>(d)] / l) : 0.0;
        const double bound = ex.o_bound[ex.o_at(b_, s_, h_, d)];
        worst = std::max(worst, std::fabs(o - got(d)) / std::max(bound, 1e-300));
      }
      if (worst <= 1) ++best.within;
      if (worst < best.ratio) best.ratio = worst, best.n = n;
    }
    return best;
  }

  // err/bound of the kernel's row against the exact oracle of the row over its first (last) n keys alone: a
  // problem of one query row and those n keys, no mask, the case's dtype, scale and compute model. NaN when no
  // such problem can be built.
  double exact_ratio(int64_t n, bool from_back) {
    Problem one = reshape_problem(p_, 1, 1, 1, 1, n, p_.head_dim, p_.head_dim_v);
    one.mask_kind = AF_MASK_NONE;
    one.window_left = one.window_right = AF_UNBOUNDED;
    one.variants = 0;
    if (!validate(one).empty()) return std::nan("");
    Tensors t1;
    t1.q.resize(static_cast<size_t>(p_.head_dim));
    t1.k.resize(static_cast<size_t>(n * p_.head_dim));
    t1.v.resize(static_cast<size_t>(n * p_.head_dim_v));
    const int64_t hk = kv_head(p_, h_), m = static_cast<int64_t>(keys_.size());
    for (int64_t d = 0; d < p_.head_dim; ++d)
      t1.q[static_cast<size_t>(d)] = t_.q[static_cast<size_t>(q_index(p_, b_, s_, h_, d))];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = keys_[static_cast<size_t>(from_back ? m - n + i : i)];
      for (int64_t d = 0; d < p_.head_dim; ++d)
        t1.k[static_cast<size_t>(k_index(one, 0, i, 0, d))] = t_.k[static_cast<size_t>(k_index(p_, b_, j, hk, d))];
      for (int64_t d = 0; d < p_.head_dim_v; ++d)
        t1.v[static_cast<size_t>(v_index(one, 0, i, 0, d))] = t_.v[static_cast<size_t>(v_index(p_, b_, j, hk, d))];
    }
    OracleResult ex1;
    try {
      ex1 = c_.oracle(one, t1);
    } catch (const std::exception&) {
      return std::nan("");
    }
    LaunchOutcome row;
    for (int64_t d = 0; d < p_.head_dim_v; ++d) row.o.push_back(got(d));
    const LaunchOutcome& out = c_.original();
    if (!out.lse.empty()) row.lse.push_back(out.lse[static_cast<size_t>(lse_index(p_, b_, h_, s_))]);
    return row_ratio(one, ex1, row, 0, 0, 0);
  }

 private:
  double got(int64_t d) const { return c_.original().o[static_cast<size_t>(o_index(p_, b_, s_, h_, d))]; }
  long double score(int64_t j) const {
    const int64_t hk = kv_head(p_, h_);
    long double dot = 0;
    for (int64_t d = 0; d < p_.head_dim; ++d)
      dot += static_cast<long double>(t_.q[static_cast<size_t>(q_index(p_, b_, s_, h_, d))]) *
             t_.k[static_cast<size_t>(k_index(p_, b_, j, hk, d))];
    return static_cast<long double>(p_.scale) * dot;
  }
  long double value(int64_t j, int64_t d) const {
    return t_.v[static_cast<size_t>(v_index(p_, b_, j, kv_head(p_, h_), d))];
  }

  Context& c_;
  const Problem& p_;
  const Tensors& t_;
  const int64_t b_, h_, s_;
  const std::vector<int64_t> keys_;
};

}  // namespace

Finding keys_ignored(Context& c) {
  Finding f;
  const Problem& p = c.problem();
  if (c.original().o.empty()) return f;
  if (is_fp8(p.dtype)) {
    f.evidence.push_back({"keys", "not run: fp8 scores carry descales this probe does not model"});
    return f;
  }
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);
  std::string rows_text, suffix_text;
  int tested = 0, matched = 0;
  for (const RowKey& r : failing_rows(c)) {
    if (tested == kRows) break;
    RowProbe row(c, r.b, r.h, r.s);
    if (!row.usable() || !ex.row(r.b, r.h, r.s).computed || !ex.row(r.b, r.h, r.s).inside_contract()) continue;
    ++tested;
    const int64_t m = static_cast<int64_t>(row.keys().size());
    const Closest front = row.closest(false), back = row.closest(true);
    const double full = row_ratio(p, ex, c.original(), r.b, r.h, r.s);
    const std::string where = fmt("row s=%lld (b=%lld, h=%lld), %s: ", (long long)r.s, (long long)r.b,
                                  (long long)r.h, c.seen_text(r.b, r.h, r.s).c_str());
    const double front_exact = front.ratio <= 4 ? row.exact_ratio(front.n, false) : std::nan("");
    // A match is within the bound of the n keys and 4x closer to them than to all m: a row failing just past its
    // bound (precision) is not named by a prefix that happens to move the exact result its way.
    if (front_exact <= 1 && front_exact * 4 <= full) {
      ++matched;
      const int64_t first_ignored = row.keys()[static_cast<size_t>(front.n)];
      rows_text += (rows_text.empty() ? "" : "; ") + where +
                   fmt("O%s within bound of attention over its first %lld of %lld keys (err/bound %s; against "
                       "all %lld: %s), so keys from %lld on reached neither O nor the sum",
                       c.original().lse.empty() ? "" : " and LSE", (long long)front.n, (long long)m,
                       num(front_exact).c_str(), (long long)m, num(full).c_str(), (long long)first_ignored) +
                   (front.within > 1 ? fmt(" (%lld prefix lengths fit: the keys between carry too little weight "
                                           "to tell)",
                                           (long long)front.within)
                                     : "");
      continue;
    }
    rows_text += (rows_text.empty() ? "" : "; ") + where + "no prefix of its keys matches (closest: first " +
                 fmt("%lld of %lld, err/bound %s)", (long long)front.n, (long long)m,
                     num(std::isnan(front_exact) ? front.ratio : front_exact).c_str());
    const double back_exact = back.ratio <= 4 ? row.exact_ratio(back.n, true) : std::nan("");
    if (back_exact <= 1)
      suffix_text = where + fmt("O within bound of attention over its last %lld of %lld keys (err/bound %s): the "
                                "first keys are missing, as a window moved or an accumulator reset (not rescaled) "
                                "when the row max grows would give; not named here",
                                (long long)back.n, (long long)m, num(back_exact).c_str());
  }
  if (tested == 0) {
    f.evidence.push_back({"keys", "not run: no failing row with two or more keys, finite scores and a finite O"});
    return f;
  }
  if (matched == tested) {
    f.fired = true;
    f.cls = FailureClass::kMask;
    f.evidence.push_back({"keys", fmt("%d of %d failing row(s) tested miss their last keys: ", matched, tested) +
                                      rows_text});
    return f;
  }
  f.evidence.push_back({"keys", fmt("%d of %d failing row(s) tested match a prefix of their keys: ", matched,
                                    tested) +
                                    rows_text});
  if (!suffix_text.empty()) f.evidence.push_back({"keys", suffix_text});
  return f;
}

}  // namespace attnfuzz::detect
