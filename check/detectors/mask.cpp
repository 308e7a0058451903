// mask.cpp - the mask detectors: rows with keys written empty, masked NaN reaching O, other-mask oracles,
// masked K/V perturbation, zero-score model.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "check/compare.h"
#include "check/detectors/detectors.h"
#include "check/sequences.h"

namespace attnfuzz::detect {

namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();

bool same_visibility(const Problem& a, const Problem& b) {
  for (int64_t i = 0; i < a.seq_q; ++i) {
    const KeyRange x = visible_keys(a, i), y = visible_keys(b, i);
    if (x.empty() != y.empty() || (!x.empty() && (x.first != y.first || x.last != y.last))) return false;
  }
  return true;
}

// Masks a kernel may have used instead of the one asked for: none, the other alignment, the diagonal
// or window edges moved by one. (A causal diagonal moved by -1 has no af_problem form; the masked K/V
// perturbation below does not see missing keys either: such a kernel ends up as precision.)
std::vector<Problem> mask_variants(const Problem& p) {
  std::vector<Problem> out;
  if (p.mask_kind == AF_MASK_NONE) return out;
  Problem none = p;
  none.mask_kind = AF_MASK_NONE;
  out.push_back(none);
  Problem other = p;
  other.mask_align = p.mask_align == AF_ALIGN_TOP_LEFT ? AF_ALIGN_BOTTOM_RIGHT : AF_ALIGN_TOP_LEFT;
  out.push_back(other);
  const int64_t left = window_left(p), right = window_right(p);
  auto window = [&](int64_t l, int64_t r, int32_t align) {
    Problem w = p;
    w.mask_kind = AF_MASK_WINDOW;
    w.mask_align = align;
    w.window_left = l;
    w.window_right = r;
    out.push_back(w);
  };
  for (int32_t align : {p.mask_align, other.mask_align}) {
    if (right != AF_UNBOUNDED) window(left, right + 1, align);
    if (right != AF_UNBOUNDED && right > 0) window(left, right - 1, align);
    if (left != AF_UNBOUNDED) window(left + 1, right, align);
    if (left != AF_UNBOUNDED && left > 0) window(left - 1, right, align);
  }
  std::vector<Problem> distinct;
  for (const Problem& v : out) {
    if (same_visibility(v, p)) continue;
    bool dup = false;
    for (const Problem& d : distinct) dup |= same_visibility(v, d);
    if (!dup) distinct.push_back(v);
  }
  return distinct;
}

bool row_has_nonfinite(const Problem& p, const std::vector<float>& t, int64_t b, int64_t s, int64_t h,
                       int64_t n, bool is_q) {
  for (int64_t d = 0; d < n; ++d) {
    const float x = t[static_cast<size_t>(is_q ? q_index(p, b, s, h, d) : k_index(p, b, s, h, d))];
    if (!std::isfinite(x)) return true;
  }
  return false;
}
bool v_row_nonfinite(const Problem& p, const std::vector<float>& t, int64_t b, int64_t j, int64_t hk) {
  for (int64_t d = 0; d < p.head_dim_v; ++d)
    if (!std::isfinite(t[static_cast<size_t>(v_index(p, b, j, hk, d))])) return true;
  return false;
}

}  // namespace

VariantMatch variant_match(const Problem& p, const OracleResult& ex, const Problem& v,
                           const OracleResult& exv, const LaunchOutcome& out) {
  VariantMatch m;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const RowInfo &ri = ex.row(b, h, s), &rv = exv.row(b, h, s);
        if (!ri.computed || !ri.inside_contract() || !rv.computed || !rv.inside_contract()) continue;
        auto one = [&](double e, double ev, double bound, double bound_v, double g) {
          if (!judge_element(e, g, bound).fail) return;  // fine under the asked mask: proves nothing
          if (judge_element(ev, g, bound_v).fail) return;
          (std::isnan(g) ? m.nan_pairs : m.real)++;
        };
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t e = ex.o_at(b, s, h, d), ev = exv.o_at(b, s, h, d);
          one(ex.o[e], exv.o[ev], ex.o_bound[e], exv.o_bound[ev],
              out.o[static_cast<size_t>(o_index(p, b, s, h, d))]);
        }
        if (!out.lse.empty()) {
          const size_t e = ex.lse_at(b, h, s), ev = exv.lse_at(b, h, s);
          one(ex.lse[e], exv.lse[ev], ex.lse_bound[e], exv.lse_bound[ev],
              out.lse[static_cast<size_t>(lse_index(p, b, h, s))]);
        }
      }
  (void)v;
  return m;
}

namespace {

// The masks a kernel may have used instead of the asked one, as layout problems (pc.problem() with another
// mask) with their labels. A sequence layout aligns each per sequence like the asked mask, and adds the
// bottom-right mask aligned with the batch's largest lengths (off = max Sk - max Sq for every sequence
// instead of Sk_b - Sq_b: the same top-left window for all sequences, j - i in [off - left, off + right])
// when its sides are not negative.
std::vector<std::pair<Problem, std::string>> other_masks(const Context& c) {
  const Problem& lp = c.pc.problem();
  const bool seqs = c.seqs();
  std::vector<std::pair<Problem, std::string>> out;
  for (const Problem& lv : mask_variants(lp))
    out.push_back({lv, mask_to_string(lv) + (seqs ? ", aligned per sequence" : "")});
  // FlashAttention-2's window normalisation (set_params_fprop): a side >= Sk becomes unbounded, then an unbounded
  // side facing a bounded one becomes Sk. Under bottom-right alignment with Sq > Sk that is another mask, a row
  // loses its last keys (flash-attention #895; torch's varlen_attn), which the key reordering of the reorder
  // detector cannot tell from a missing rescale.
  if (lp.mask_kind == AF_MASK_WINDOW) {
    int64_t l = window_left(lp), r = window_right(lp);
    const int64_t sk = lp.seq_k;
    if (l != AF_UNBOUNDED && l >= sk) l = AF_UNBOUNDED;
    if (r != AF_UNBOUNDED && r >= sk) r = AF_UNBOUNDED;
    if (l == AF_UNBOUNDED && r != AF_UNBOUNDED) l = sk;
    else if (r == AF_UNBOUNDED && l != AF_UNBOUNDED) r = sk;
    Problem n = lp;
    n.window_left = l, n.window_right = r;
    bool seen = same_visibility(n, lp);
    for (const auto& [v, label] : out) seen |= same_visibility(n, v);
    if (!seen)
      out.push_back({n, mask_to_string(n) + (seqs ? ", aligned per sequence" : "") +
                            " (FlashAttention-2's window normalisation: a side >= Sk unbounded, an unbounded side "
                            "facing a bounded one = Sk)"});
  }
  if (seqs && lp.mask_kind != AF_MASK_NONE && lp.mask_align == AF_ALIGN_BOTTOM_RIGHT) {
    const int64_t off = lp.seq_k - lp.seq_q, l = window_left(lp), r = window_right(lp);
    Problem bm = lp;
    bm.mask_kind = AF_MASK_WINDOW;
    bm.mask_align = AF_ALIGN_TOP_LEFT;
    bm.window_left = l == AF_UNBOUNDED ? AF_UNBOUNDED : l - off;
    bm.window_right = r == AF_UNBOUNDED ? AF_UNBOUNDED : r + off;
    if ((bm.window_left == AF_UNBOUNDED || bm.window_left >= 0) &&
        (bm.window_right == AF_UNBOUNDED || bm.window_right >= 0))
      out.push_back(
          {bm, mask_to_string(lp) + fmt(" aligned with the batch's largest lengths (offset %lld = "
                                        "max Sk - max Sq for every sequence, instead of Sk_b - Sq_b)",
                                        (long long)off)});
  }
  return out;
}

// Rows another mask (exv) leaves without keys that came out NaN in every O element: the 0 / 0 of a softmax
// over no key, what a kernel without an empty-row guard writes for a row it found empty. They are set to that
// row's exact result under exv (O = 0, LSE = -inf) in `out`, so that the comparison under the other mask
// judges the rest: must_see counts those that have keys under the asked mask (ex), both those empty under
// both (an empty-row bug of their own; set to O = 0 they equal the asked mask's result too, so they never
// count as a match).
struct NaNEmpty {
  int64_t must_see = 0, both = 0;
};
NaNEmpty empty_rows_written_nan(const Problem& p, const OracleResult& ex, const OracleResult& exv,
                                LaunchOutcome& out) {
  NaNEmpty n;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const RowInfo &ri = ex.row(b, h, s), &rv = exv.row(b, h, s);
        if (!ri.computed || ri.kind == RowKind::kNaN || !rv.computed || rv.kind != RowKind::kFullyMasked)
          continue;
        bool all_nan = p.head_dim_v > 0;
        for (int64_t d = 0; d < p.head_dim_v && all_nan; ++d)
          all_nan = std::isnan(out.o[static_cast<size_t>(o_index(p, b, s, h, d))]);
        if (!all_nan) continue;
        for (int64_t d = 0; d < p.head_dim_v; ++d) out.o[static_cast<size_t>(o_index(p, b, s, h, d))] = 0.0f;
        if (!out.lse.empty()) out.lse[static_cast<size_t>(lse_index(p, b, h, s))] = -INFINITY;
        ++(ri.kind == RowKind::kNormal ? n.must_see : n.both);
      }
  return n;
}

// Records a mask finding; the first kind that fires names the finding.
void fire(Finding& f, const char* kind, std::string detail) {
  if (!f.fired) f.kind = kind;
  f.fired = true;
  f.cls = FailureClass::kMask;
  f.evidence.push_back({"mask", std::move(detail)});
}

// (c) The output matches the exact result under another mask (other_masks). Rows outside the fp32 contract
// are not judged under either mask; the rest must all pass; the elements that fail under the asked mask must
// match with values, not NaN = NaN (a NaN row under both says nothing about the mask).
void other_mask_test(Context& c, Finding& f) {
  const Problem& p = c.problem();
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);
  // Every failing row sees no key under the asked mask: another mask that matches differs from it there only, and
  // says no more than the rows' own wrong value (an empty row averaging V is the unmasked result when Sk = 1: a live
  // jax-xla-bias case). The empty-row detector names those rows.
  const auto others = other_masks(c);
  if (others.empty()) return;
  const std::vector<RowKey> failing = failing_rows(c);
  if (!failing.empty() && std::all_of(failing.begin(), failing.end(), [&](const RowKey& r) {
        const RowInfo& ri = ex.row(r.b, r.h, r.s);
        return ri.computed && ri.kind == RowKind::kFullyMasked;
      })) {
    f.evidence.push_back({"mask", "every failing row sees no key under the asked mask: another mask would differ from "
                                  "it only in those rows, which the empty-row detector judges (other masks not tried)"});
    return;
  }
  for (const auto& [lv, label] : others) {
    OracleResult exv;
    try {
      exv = c.layout_oracle(lv, c.tensors());
    } catch (const std::exception&) {
      continue;
    }
    Problem v = p;  // the view with the other mask (nominal for a layout: exv aligned it per sequence)
    v.mask_kind = lv.mask_kind, v.mask_align = lv.mask_align;
    v.window_left = lv.window_left, v.window_right = lv.window_right;
    LaunchOutcome out = c.original();
    const NaNEmpty nan_empty = empty_rows_written_nan(p, ex, exv, out);
    const CheckResult r = judge(v, exv, out);
    if (r.verdict != Verdict::kPass && r.verdict != Verdict::kOutsideContract) continue;
    const VariantMatch vm = variant_match(p, ex, v, exv, out);
    if (vm.real == 0) {
      f.evidence.push_back(
          {"mask", vm.nan_pairs
                       ? fmt("mask %s: the %lld failing element(s) agree only as NaN = NaN: not a match",
                             label.c_str(), (long long)vm.nan_pairs)
                       : "mask " + label +
                             ": passes only because the failing elements are not judged under it "
                             "(outside the fp32 contract there): not a match"});
      continue;
    }
    fire(f, "other-mask",
         "O matches the exact result under mask " + label + " (the case asks for " +
             mask_to_string(c.pc.problem()) +
             fmt("): all %lld compared elements within bound, max err/bound %s; %lld failing element(s) "
                 "match with values",
                 (long long)r.compared, num(r.max_ratio).c_str(), (long long)vm.real) +
             (vm.nan_pairs ? fmt(" (%lld more only as NaN = NaN, not counted)", (long long)vm.nan_pairs)
                           : "") +
             (nan_empty.must_see
                  ? fmt("; %lld (b, h, row)s that must see keys have none under it and came out NaN in "
                        "every element (the 0 / 0 of a softmax over no key), counted as that mask's "
                        "empty rows",
                        (long long)nan_empty.must_see)
                  : "") +
             (nan_empty.both ? fmt("; %lld (b, h, row)s empty under both masks also came out NaN, not "
                                   "O = 0 (an empty-row failure of its own)",
                                   (long long)nan_empty.both)
                             : ""));
    return;
  }
}

// ---- gradients: an input the mask hides from a gradient element must not reach it ----

// Keys row i does not see.
std::vector<int64_t> hidden_keys(const Problem& p, int64_t i) {
  const KeyRange kr = visible_keys(p, i);
  std::vector<int64_t> out;
  for (int64_t j = 0; j < p.seq_k; ++j)
    if (kr.empty() || j < kr.first || j >= kr.last) out.push_back(j);
  return out;
}
bool sees_any(const KeyRange& kr, const std::vector<int64_t>& keys) {
  for (int64_t j : keys)
    if (j >= kr.first && j < kr.last) return true;
  return false;
}

// Whether the mask changes gradient element position s: a dQ row that does not see every key, a dK / dV key
// that some row does not see.
bool mask_matters(const Problem& p, const std::string& tensor, int64_t s) {
  if (tensor == "dQ") {
    const KeyRange kr = visible_keys(p, s);
    return kr.empty() || kr.first > 0 || kr.last < p.seq_k;
  }
  for (int64_t i = 0; i < p.seq_q; ++i)
    if (!sees_any(visible_keys(p, i), {s})) return true;
  return false;
}

// How the gradient elements at positions `pos` (query rows of dQ, keys of dK / dV) moved between the
// original launch a and a perturbed launch x: launch_diff's rule (beyond max(the element's bound, 1e-4 of the
// larger magnitude), or a NaN/Inf mismatch; an atomic accumulation order moves nothing further).
// Negates x at sequence positions `at` of every batch and head, all `dim` elements (index(b, s, h, d): its
// element index). Negation is exact in every dtype: a correct kernel's hidden pairs still add exact zeros.
template <class Index>
void negate_at(std::vector<float>& x, const std::vector<int64_t>& at, int64_t batch, int64_t heads,
               int64_t dim, Index index) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t s : at)
        for (int64_t d = 0; d < dim; ++d) {
          float& v = x[static_cast<size_t>(index(b, s, h, d))];
          v = -v;
        }
}

struct Moved {
  int64_t checked = 0, changed = 0;
  std::string first;
  std::vector<int64_t> where;
};
void moved(const Problem& p, const char* name, const std::vector<float>& a, const std::vector<float>& x,
           const int64_t* st, int64_t seq, int64_t heads, int64_t dim, const std::vector<double>& bound,
           const std::vector<int64_t>& pos, Moved& m) {
  if (a.size() != x.size()) return;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s : pos)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d) {
          const size_t i = static_cast<size_t>(b * st[0] + s * st[1] + h * st[2] + d);
          ++m.checked;
          if (a[i] == x[i] || (std::isnan(a[i]) && std::isnan(x[i]))) continue;
          const size_t e = static_cast<size_t>(((b * seq + s) * heads + h) * dim + d);
          const double bd = e < bound.size() ? bound[e] : std::nan("");
          const double rel =
              1e-4 * std::max(std::fabs(static_cast<double>(a[i])), std::fabs(static_cast<double>(x[i])));
          const ElementJudgement jd = judge_element(a[i], x[i], std::isnan(bd) ? rel : std::max(bd, rel));
          if (!jd.nonfinite_mismatch && !jd.fail) continue;
          if (m.changed++ == 0)
            m.first = fmt("%s[b=%lld,%s=%lld,h=%lld,d=%lld]: %s -> %s", name, (long long)b,
                          name[1] == 'Q' ? "s" : "j", (long long)s, (long long)h, (long long)d,
                          num(a[i]).c_str(), num(x[i]).c_str());
          const auto at = std::lower_bound(m.where.begin(), m.where.end(), s);  // ascending, once each
          if (at == m.where.end() || *at != s) m.where.insert(at, s);
        }
}

// Leak-probe indices in [0, n): `first` when it is a probe, then those of the most and the fewest weight;
// weight(i) <= 0 means i is no probe.
std::vector<int64_t> pick_probes(int64_t n, int64_t first, const std::function<int64_t(int64_t)>& weight) {
  std::vector<int64_t> out;
  if (first >= 0 && first < n && weight(first) > 0) out.push_back(first);
  int64_t most = -1, fewest = -1, nm = 0, nf = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t w = weight(i);
    if (w <= 0) continue;
    if (most < 0 || w > nm) most = i, nm = w;
    if (fewest < 0 || w < nf) fewest = i, nf = w;
  }
  for (int64_t i : {most, fewest})
    if (i >= 0 && std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  return out;
}

// One leak probe in words: "<experiment>: N <grads> element(s) of <checked_what>... unmoved" appended to
// `tried`; the finding ("<experiment> moved N <grads> element(s) of <moved_what>...; first ...") when it
// moved one it must not, else "".
std::string probe_outcome(std::string& tried, const std::string& experiment, const Moved& m,
                          const char* grads, const char* checked_what, const char* moved_what,
                          const std::vector<int64_t>& checked) {
  if (!tried.empty()) tried += "; ";
  tried += experiment + fmt(": %lld %s element(s) of %s", (long long)m.checked, grads, checked_what) +
           ranges(checked) + " unmoved";
  if (!m.changed) return {};
  return experiment + fmt(" moved %lld %s element(s) of %s", (long long)m.changed, grads, moved_what) +
         ranges(m.where) + "); first " + m.first;
}

// The leak experiments (dense problems). (1) K and V negated (exact in every dtype) at the keys a probe row
// does not see: dQ of every row that sees none of those keys must not move. (2) Q and dO negated at the rows
// that do not see a probe key: dK and dV of every key none of those rows sees must not move. Probes: the rows
// with keys that see the fewest and the most keys (some hidden), the keys hidden from the most and the fewest
// rows (some seeing them). A backward that applies the mask adds exact zeros for hidden pairs; one that
// recomputes P for hidden pairs moves them. Returns the first leak ("" when none) and says in `tried` what
// was checked.
std::string gradient_leak(Context& c, std::string& tried) {
  const Problem& p = c.problem();
  const Tensors& t = c.tensors();
  const LaunchOutcome& out = c.original();
  const GradResult& g = c.pc.grad(c.opts.oracle);
  // The worst failing gradient element: its row (dQ) or key (dK, dV) is the first probe, so that the
  // experiment looks where the failure is.
  const ElementReport* worst = c.j.result.worst.empty() ? nullptr : &c.j.result.worst.front();
  const bool worst_is_key = worst && (worst->tensor == "dK" || worst->tensor == "dV");
  // The kernel on the original inputs changed by `negate`; nullopt unless it ran and gave gradients.
  auto relaunch = [&](const std::function<void(Tensors&)>& negate) -> std::optional<LaunchOutcome> {
    Tensors pt = t;
    negate(pt);
    LaunchOutcome po = c.launch(pt);
    if (po.launch.status != LaunchStatus::kOk || !po.backward) return std::nullopt;
    return po;
  };
  // (1) rows as probes: K, V negated at the keys a probe row does not see must not move dQ of the rows that
  // see none of them
  auto row_probes = [&]() -> std::string {
    const std::vector<int64_t> rows =
        pick_probes(p.seq_q, worst && worst->tensor == "dQ" ? worst->s : -1, [&](int64_t i) {
          return visible_keys(p, i).empty() ? 0 : static_cast<int64_t>(hidden_keys(p, i).size());
        });
    for (int64_t r : rows) {
      const std::vector<int64_t> keys = hidden_keys(p, r);
      std::vector<int64_t> checked;
      for (int64_t i = 0; i < p.seq_q; ++i)
        if (!sees_any(visible_keys(p, i), keys)) checked.push_back(i);
      const auto po = relaunch([&](Tensors& pt) {
        negate_at(pt.k, keys, p.batch, p.heads_kv, p.head_dim, [&](auto... i) { return k_index(p, i...); });
        negate_at(pt.v, keys, p.batch, p.heads_kv, p.head_dim_v, [&](auto... i) { return v_index(p, i...); });
      });
      if (!po) continue;
      Moved m;
      moved(p, "dQ", out.dq, po->dq, p.q_stride, p.seq_q, p.heads_q, p.head_dim, g.dq_bound, checked, m);
      const std::string found = probe_outcome(
          tried,
          fmt("K and V negated at the %zu key(s) row %lld must not see (j = ", keys.size(), (long long)r) +
              ranges(keys) + ")",
          m, "dQ", "rows s = ", "rows that see none of them (s = ", checked);
      if (!found.empty()) return found;
    }
    return {};
  };
  // (2) keys as probes: Q, dO negated at the rows that do not see a probe key must not move dK / dV of the
  // keys none of those rows sees
  auto key_probes = [&]() -> std::string {
    std::vector<std::vector<int64_t>> blind(static_cast<size_t>(p.seq_k));  // rows that do not see key j
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const KeyRange kr = visible_keys(p, i);
      for (int64_t j = 0; j < p.seq_k; ++j)
        if (kr.empty() || j < kr.first || j >= kr.last) blind[static_cast<size_t>(j)].push_back(i);
    }
    const std::vector<int64_t> keys =  // seen by some row and not by every row
        pick_probes(p.seq_k, worst_is_key ? worst->s : -1, [&](int64_t j) {
          const int64_t n = static_cast<int64_t>(blind[static_cast<size_t>(j)].size());
          return n < p.seq_q ? n : 0;
        });
    for (int64_t kj : keys) {
      const std::vector<int64_t>& rs = blind[static_cast<size_t>(kj)];
      std::vector<int64_t> checked;
      for (int64_t j = 0; j < p.seq_k; ++j) {
        bool seen = false;
        for (int64_t i : rs) seen |= sees_any(visible_keys(p, i), {j});
        if (!seen) checked.push_back(j);
      }
      const auto po = relaunch([&](Tensors& pt) {
        negate_at(pt.q, rs, p.batch, p.heads_q, p.head_dim, [&](auto... i) { return q_index(p, i...); });
        negate_at(pt.dout, rs, p.batch, p.heads_q, p.head_dim_v, [&](auto... i) { return o_index(p, i...); });
      });
      if (!po) continue;
      Moved m;
      moved(p, "dK", out.dk, po->dk, p.k_stride, p.seq_k, p.heads_kv, p.head_dim, g.dk_bound, checked, m);
      moved(p, "dV", out.dv, po->dv, p.v_stride, p.seq_k, p.heads_kv, p.head_dim_v, g.dv_bound, checked, m);
      const std::string found =
          probe_outcome(tried,
                        fmt("Q and dO negated at the %zu row(s) that must not see key %lld (s = ", rs.size(),
                            (long long)kj) +
                            ranges(rs) + ")",
                        m, "dK / dV", "keys j = ", "keys none of them sees (j = ", checked);
      if (!found.empty()) return found;
    }
    return {};
  };
  // The probes of the failing tensor first (a dK / dV failure: keys as probes).
  std::string found = worst_is_key ? key_probes() : row_probes();
  if (found.empty()) found = worst_is_key ? row_probes() : key_probes();
  return found;
}

// The NaN / Inf leak experiment for gradients (dense problems): the non-finite q / k / v / dO entries of keys
// and rows the mask hides from someone are replaced by 0 and the backward relaunched. The dQ of a row that
// sees none of those keys (and holds none itself), and the dK / dV of a key whose every viewer is such a row,
// have the same exact value before and after; if such elements failed before (NaN / Inf or beyond the bound)
// and now all pass, a hidden non-finite input reached them (0 * NaN = NaN: masked pairs entered a product).
// Returns the finding ("" when the experiment does not apply or shows no leak) and says in `tried` what was
// checked.
std::string gradient_nan_leak(Context& c, std::string& tried) {
  const Problem& p = c.problem();
  const Tensors& t = c.tensors();
  std::vector<int64_t> bad_keys, bad_rows;  // hidden from some row / key, holding a NaN or Inf
  for (int64_t j = 0; j < p.seq_k; ++j) {
    bool bad = false;
    for (int64_t b = 0; b < p.batch && !bad; ++b)
      for (int64_t hk = 0; hk < p.heads_kv && !bad; ++hk)
        bad = row_has_nonfinite(p, t.k, b, j, hk, p.head_dim, false) || v_row_nonfinite(p, t.v, b, j, hk);
    bool hidden = false;
    for (int64_t i = 0; i < p.seq_q && !hidden; ++i) hidden = !sees_any(visible_keys(p, i), {j});
    if (bad && hidden) bad_keys.push_back(j);
  }
  for (int64_t i = 0; i < p.seq_q; ++i) {
    bool bad = false;
    for (int64_t b = 0; b < p.batch && !bad; ++b)
      for (int64_t h = 0; h < p.heads_q && !bad; ++h) {
        bad = row_has_nonfinite(p, t.q, b, i, h, p.head_dim, true);
        for (int64_t d = 0; d < p.head_dim_v && !bad; ++d)
          bad = !std::isfinite(t.dout[static_cast<size_t>(o_index(p, b, i, h, d))]);
      }
    const KeyRange kr = visible_keys(p, i);
    if (bad && (kr.empty() || kr.first > 0 || kr.last < p.seq_k)) bad_rows.push_back(i);
  }
  if (bad_keys.empty() && bad_rows.empty()) return {};
  Tensors pt = t;
  auto zero = [](float& x) {
    if (!std::isfinite(x)) x = 0.0f;
  };
  for (int64_t j : bad_keys)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
        for (int64_t d = 0; d < p.head_dim; ++d) zero(pt.k[static_cast<size_t>(k_index(p, b, j, hk, d))]);
        for (int64_t d = 0; d < p.head_dim_v; ++d) zero(pt.v[static_cast<size_t>(v_index(p, b, j, hk, d))]);
      }
  for (int64_t i : bad_rows)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) zero(pt.q[static_cast<size_t>(q_index(p, b, i, h, d))]);
        for (int64_t d = 0; d < p.head_dim_v; ++d) zero(pt.dout[static_cast<size_t>(o_index(p, b, i, h, d))]);
      }
  // Rows whose exact gradients the change leaves alone: they see no changed key and hold no changed entry.
  std::vector<char> row_same(static_cast<size_t>(p.seq_q), 1), key_same(static_cast<size_t>(p.seq_k), 1);
  for (int64_t i : bad_rows) row_same[static_cast<size_t>(i)] = 0;
  for (int64_t i = 0; i < p.seq_q; ++i)
    if (sees_any(visible_keys(p, i), bad_keys)) row_same[static_cast<size_t>(i)] = 0;
  for (int64_t j : bad_keys) key_same[static_cast<size_t>(j)] = 0;
  for (int64_t i = 0; i < p.seq_q; ++i)
    if (!row_same[static_cast<size_t>(i)]) {
      const KeyRange kr = visible_keys(p, i);
      for (int64_t j = kr.empty() ? 0 : kr.first; !kr.empty() && j < kr.last; ++j)
        key_same[static_cast<size_t>(j)] = 0;
    }
  const LaunchOutcome& out = c.original();
  ++c.stats.launches;
  const LaunchOutcome po = c.launch(pt);
  if (po.launch.status != LaunchStatus::kOk || !po.backward) return {};
  const GradResult& g = c.pc.grad(c.opts.oracle);
  int64_t failed_before = 0, failed_after = 0, nan_before = 0,
          nan_cleared = 0;  // NaN/Inf where exact is finite
  std::string first, first_cleared;
  auto one = [&](const char* name, size_t e, size_t at, const std::vector<float>& a,
                 const std::vector<float>& x, const std::vector<double>& ex, const std::vector<double>& bd,
                 int64_t b, int64_t pos, int64_t h, int64_t d) {
    if (!judge_element(ex[e], a[at], bd[e]).fail) return;
    ++failed_before;
    if (std::isfinite(ex[e]) && !std::isfinite(a[at])) {
      ++nan_before;
      if (std::isfinite(x[at]) && ++nan_cleared == 1)
        first_cleared =
            fmt("%s[b=%lld,%s=%lld,h=%lld,d=%lld]: %s -> %s", name, (long long)b, name[1] == 'Q' ? "s" : "j",
                (long long)pos, (long long)h, (long long)d, num(a[at]).c_str(), num(x[at]).c_str());
    }
    if (judge_element(ex[e], x[at], bd[e]).fail) {
      ++failed_after;
    } else if (first.empty()) {
      first =
          fmt("%s[b=%lld,%s=%lld,h=%lld,d=%lld]: %s -> %s", name, (long long)b, name[1] == 'Q' ? "s" : "j",
              (long long)pos, (long long)h, (long long)d, num(a[at]).c_str(), num(x[at]).c_str());
    }
  };
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.seq_q; ++i)
      for (int64_t h = 0; h < p.heads_q && row_same[static_cast<size_t>(i)]; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          one("dQ", g.dq_at(b, i, h, d), static_cast<size_t>(q_index(p, b, i, h, d)), out.dq, po.dq, g.dq,
              g.dq_bound, b, i, h, d);
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t hk = 0; hk < p.heads_kv && key_same[static_cast<size_t>(j)]; ++hk) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          one("dK", g.dk_at(b, j, hk, d), static_cast<size_t>(k_index(p, b, j, hk, d)), out.dk, po.dk, g.dk,
              g.dk_bound, b, j, hk, d);
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          one("dV", g.dv_at(b, j, hk, d), static_cast<size_t>(v_index(p, b, j, hk, d)), out.dv, po.dv, g.dv,
              g.dv_bound, b, j, hk, d);
      }
  }
  const std::string what = (bad_keys.empty() ? std::string() : "keys j = " + ranges(bad_keys) + " (k / v)") +
                           (!bad_keys.empty() && !bad_rows.empty() ? " and " : "") +
                           (bad_rows.empty() ? std::string() : "rows s = " + ranges(bad_rows) + " (q / dO)");
  if (!tried.empty()) tried += "; ";
  tried += "NaN / Inf of the hidden " + what +
           fmt(" set to 0: %lld failing element(s) the change leaves exact, "
               "%lld still failing",
               (long long)failed_before, (long long)failed_after);
  if (failed_before == 0) return {};
  if (failed_after > 0) {
    // Not every failure goes away, but every NaN / Inf of those elements turns finite: the hidden NaN / Inf
    // reached them (the values that stay wrong say the hidden inputs reach them with their values too).
    if (nan_before == 0 || nan_cleared < nan_before) return {};
    return "the NaN / Inf in " + what +
           ", which the mask hides, reached the gradients: with it set to 0 (the exact "
           "values of those elements unchanged) " +
           fmt("all %lld NaN / Inf element(s) of rows / keys that do not see it turn finite (%lld element(s) "
               "stay "
               "beyond the bound: the hidden inputs reach them with their values too); first ",
               (long long)nan_before, (long long)failed_after) +
           first_cleared;
  }
  return "the NaN / Inf in " + what +
         ", which the mask hides, reached the gradients: with it set to 0 (the exact "
         "values of those elements unchanged) " +
         fmt("all %lld failing element(s) of rows / keys that do not see it "
             "pass; first ",
             (long long)failed_before) +
         first;
}

// The gradients of a backward under p's mask given another forward's O and LSE: P = exp(scale q.k - lse) on p's
// visible keys, Delta = dO . o, dS = P (dP - Delta), in double. They replace g's dQ, dK, dV values (its bounds, layout
// and computed rows stay). No score variant.
void backward_given(const Problem& p, const Tensors& t, const std::vector<float>& o, const std::vector<float>& lse,
                    GradResult& g) {
  for (auto* x : {&g.dq, &g.dk, &g.dv}) std::fill(x->begin(), x->end(), 0.0);
  std::vector<double> row(static_cast<size_t>(p.head_dim_v));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeyRange kr = visible_keys(p, i);
        const double l = lse[static_cast<size_t>(lse_index(p, b, h, i))];
        if (kr.empty() || l == -INFINITY) continue;  // a row the given forward calls empty adds nothing
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          row[static_cast<size_t>(d)] = o[static_cast<size_t>(o_index(p, b, i, h, d))];
        add_row_backward(p, t, b, h, i, kr.first, kr.last, l, row.data(), g);
      }
}

// A backward under the case's mask given the forward (O, LSE) of another mask (other_masks): a library that runs its
// own forward under one alignment and its backward under the other. Session 20's H100 SDPA lower-right f16 case (3x2,
// q = k = v = 0) returned dV[0] = dO_1 / 2 + dO_2 / 2 to the f16 bit: the bottom-right backward given the top-left
// forward's LSE. A model fit, not an experiment: the kernel's gradients within the case's bounds of the model, whose
// values are beyond those bounds from the case's exact gradients (the same comparison, compare_gradients, judges
// both). No score variant (same scope otherwise as other_mask_gradients, its caller).
bool forward_mask_gradients(Context& c, Finding& f) {
  const Problem& p = c.pc.problem();
  if (p.variants) return false;
  const Tensors& t = c.pc.tensors();
  const LaunchOutcome& out = c.original();
  const GradResult own = grad_oracle_for(c.pc, out, c.opts);
  const KernelGrads exact = as_written(p, own, out);
  OracleOptions fo = c.experiment_options();
  fo.row_budget = 0;  // the backward needs every row's O and LSE
  std::string fits, first;  // the masks whose forward fits; the first one's figures
  for (const auto& [mv, label] : other_masks(c)) {  // mv: the case's problem under another mask
    std::vector<float> o, lse;
    ++c.stats.oracles;
    given_forward(p, compute_oracle(mv, t.q.data(), t.k.data(), t.v.data(), t.variant_inputs(), fo), o, lse);
    GradResult model = own;
    backward_given(p, t, o, lse, model);
    const GradFit m = fit_gradients(p, model, out, exact);
    if (!m.fits()) continue;
    if (fits.empty())
      first = fmt("all %lld computed elements within the case's bound of that model (max err/bound %s; the exact "
                  "gradients are %s bounds from it)",
                  (long long)m.got.compared, num(m.got.max_ratio).c_str(), num(m.sep.max_ratio).c_str());
    fits += (fits.empty() ? "" : " or ") + label;
  }
  if (fits.empty()) return false;
  fire(f, "forward-mask",
       "the gradients match a backward under the asked mask " + mask_to_string(p) + " given the forward (O, LSE) of " +
           "mask " + fits + ": " + first + ": the forward and the backward disagree on the mask" +
           (fits.find(" or ") != std::string::npos ? " (these inputs do not tell those forwards apart)" : ""));
  return true;
}

// Gradients under another mask (other_masks; dense problems without custom masks or dropout): the kernel's
// gradients judged against the exact gradients of the very same inputs under that mask. An oracle experiment, no
// launch: it also serves a kernel bound to one mask (an SDPA route that takes causal_lower_right only), which the
// unmasked rerun below cannot. All within bound under one of them: a mask finding.
bool other_mask_gradients(Context& c, Finding& f) {
  const Problem& p = c.pc.problem();
  if (c.seqs() || (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS | AF_VARIANT_BLOCK_SPARSE |
                                 AF_VARIANT_DROPOUT)))
    return false;
  // Values must match, not NaN = NaN: a kernel with non-finite gradients is left to the leak experiments.
  const LaunchOutcome& out = c.original();
  for (const std::vector<float>* g : {&out.dq, &out.dk, &out.dv})
    if (!std::all_of(g->begin(), g->end(), [](float x) { return std::isfinite(x); })) return false;
  const Tensors& t = c.pc.tensors();
  for (const auto& [mv, label] : other_masks(c)) {
    Case alt = c.pc.the_case();
    alt.label += "-other-mask";
    alt.problem.mask_kind = mv.mask_kind, alt.problem.mask_align = mv.mask_align;
    alt.problem.window_left = mv.window_left, alt.problem.window_right = mv.window_right;
    alt.explicit_values = ExplicitValues{t.q, t.k, t.v, t.dout};  // the same inputs, whatever the mask
    alt.values.specials.clear();                                   // (their placements followed the mask)
    if (!validate(alt).empty()) continue;
    CheckResult g;
    try {
      PreparedCase pa(alt);
      ++c.stats.oracles;
      judge_gradients(pa, c.original(), c.opts, g);
    } catch (const std::exception&) {
      continue;
    }
    if (g.verdict != Verdict::kPass) continue;
    fire(f, "other-mask",
         "the gradients match the exact gradients of the same inputs under mask " + label + " (the case asks for " +
             mask_to_string(p) +
             fmt("): all %lld compared elements within bound, max err/bound %s", (long long)g.compared,
                 num(g.max_ratio).c_str()));
    return true;
  }
  return forward_mask_gradients(c, f);
}

// Gradient failures. Necessary: the same inputs pass under mask none. That alone proves nothing (a precision
// loss the masked case happens to push past the bound also passes unmasked), so `mask` needs one of:
// (1) a leak: an input the mask hides from a gradient element moves it (gradient_leak), or (2) errors far
// beyond the bound (err/bound > kPrecisionLimit, finite) only at elements the mask affects (dQ rows that do
// not see every key, dK / dV keys some row does not see): a visible key dropped or added. Otherwise the
// class is left to the later detectors, with what was seen.
Finding mask_gradients(Context& c) {
  Finding f;
  const Problem& p = c.problem();
  if (p.mask_kind == AF_MASK_NONE) {
    f.evidence.push_back({"mask", "no mask in this case: the gradients' failure is not a mask bug"});
    return f;
  }
  Case un = c.pc.the_case();
  un.label += "-unmasked";
  if (std::string e = parse_mask("none", un.problem); !e.empty() || !validate(un).empty()) return f;
  if (!unsupported_reason(c.k.kernel, un.problem).empty()) {
    if (other_mask_gradients(c, f)) return f;
    f.evidence.push_back({"mask", "the kernel does not take the case under mask none (no rerun), and its gradients "
                                  "match the exact ones under no other mask tried"});
    return f;
  }
  PreparedCase pc(un);
  ++c.stats.launches;
  ++c.stats.oracles;
  const Judged j = check_case(c.dev, c.k, pc, c.opts);
  const std::string where = gradient_failure_text(c);
  if (j.result.verdict != Verdict::kPass) {
    f.evidence.push_back({"mask", std::string("under mask none the same inputs also give ") +
                                      verdict_name(j.result.verdict) +
                                      (j.result.tensor.empty() ? "" : " (" + j.result.tensor + ")") +
                                      ": not a mask signature"});
    return f;
  }
  const std::string passes = "the gradients fail under mask " + mask_to_string(p) + " (" + where +
                             ") and pass with the same inputs under mask none (" +
                             fmt("%lld elements within their bound, max err/bound %s)",
                                 (long long)j.result.compared, num(j.result.max_ratio).c_str());
  // (1) the leak experiments: a hidden NaN / Inf reaching a gradient, then hidden finite inputs moving one
  std::string tried;
  if (has_sequences(c.pc.problem())) {
    tried = "not run (sequence layout)";
  } else {
    if (const std::string nan_leak = gradient_nan_leak(c, tried); !nan_leak.empty()) {
      f.kind = "nan-leak";
      f.fired = true;
      f.cls = FailureClass::kMask;
      f.evidence.push_back({"mask", passes + "; " + nan_leak});
      return f;
    }
    const std::string leak = gradient_leak(c, tried);
    if (!leak.empty()) {
      f.kind = "leak";
      f.fired = true;
      f.cls = FailureClass::kMask;
      f.evidence.push_back({"mask", passes + "; " + leak +
                                        ": the backward lets masked pairs in (e.g. P "
                                        "recomputed without re-applying the mask)"});
      return f;
    }
  }
  // (2) far beyond the bound, only where the mask matters
  CheckResult g;
  RunOptions o = c.opts;
  o.worst = size_t{1} << 30;  // every failing element
  judge_gradients(c.pc, c.original(), o, g);
  double worst = 0;
  int64_t failing = 0, outside = 0;
  bool nonfinite = false;
  for (const ElementReport& e : g.worst) {
    if (e.tensor.empty() || e.ratio <= 1) continue;
    ++failing;
    nonfinite |= !std::isfinite(e.ratio);
    worst = std::max(worst, e.ratio);
    outside += !mask_matters(p, e.tensor, e.s);
  }
  if (failing && !nonfinite && outside == 0 && worst > kPrecisionLimit) {
    f.kind = "far-where-hidden";
    f.fired = true;
    f.cls = FailureClass::kMask;
    f.evidence.push_back(
        {"mask",
         passes + fmt("; no hidden input reaches the gradients (leak experiments: %s), but the %lld failing "
                      "element(s) are "
                      "far beyond their bound (max err/bound %s > %g) and all where the mask hides keys "
                      "(dQ rows that do not see every key, dK / dV keys some row does not see): the "
                      "backward's visible set is wrong (e.g. a visible key dropped)",
                      tried.c_str(), (long long)failing, num(worst).c_str(), kPrecisionLimit)});
    return f;
  }
  if (other_mask_gradients(c, f)) return f;
  f.evidence.push_back(
      {"mask",
       passes + fmt("; but no input hidden by the mask reaches the gradients (leak experiments: %s), and the "
                    "failure is %s "
                    "(max err/bound %s, %lld of %lld failing element(s) where the mask changes nothing): "
                    "not proven a mask bug (the masked case may only push a precision loss past the bound)",
                    tried.c_str(),
                    nonfinite                 ? "non-finite"
                    : worst > kPrecisionLimit ? "not only where the mask matters"
                                              : "within the precision limit",
                    num(worst).c_str(), (long long)outside, (long long)failing)});
  return f;
}

// (a) Rows that must see keys but were written as empty rows (O = 0 for every d, LSE = -inf): the kernel
// found no visible key where the mask gives some (an alignment or offset bug). Only with a mask: without
// one, a row written empty is not a mask bug.
void written_empty_test(Context& c, Finding& f) {
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  const std::string asked = mask_to_string(c.pc.problem()) + (c.seqs() ? " (aligned per sequence)" : "");
  if (p.mask_kind == AF_MASK_NONE) return;
  std::vector<int64_t> rows;
  int64_t n = 0;
  std::string example;
  for (const RowFailure& r : row_failures(c)) {
    if (r.kind != RowKind::kNormal || !r.written_empty) continue;
    if (std::find(rows.begin(), rows.end(), r.key.s) == rows.end()) rows.push_back(r.key.s);
    if (n++ == 0) {
      const KeyRange kr = visible_keys(c.row_problem(r.key.b), r.key.s);
      example = fmt("row s=%lld (b=%lld, h=%lld) sees keys [%lld, %lld) under mask ", (long long)r.key.s,
                    (long long)r.key.b, (long long)r.key.h, (long long)kr.first, (long long)kr.last) +
                asked + " but got O = 0" + (out.lse.empty() ? "" : ", LSE = -inf");
    }
  }
  if (n) {
    std::sort(rows.begin(), rows.end());
    fire(f, "written-empty",
         fmt("%lld (b, h, row)s that must see keys were written as empty rows (no visible key found: "
             "a mask alignment or offset bug; s = ",
             (long long)n) +
             ranges(rows) + "); " + example);
  }
}

// (b) A NaN / Inf reached O_i although the row's only non-finite inputs sit at keys it must not see.
void nan_leak_test(Context& c, Finding& f) {
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  const Tensors& t = c.tensors();
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);
  int64_t n = 0;
  std::string example;
  for (const RowKey& r : failing_rows(c, true)) {
    const RowInfo& ri = ex.row(r.b, r.h, r.s);
    // Only rows with keys whose output holds a NaN/Inf the exact row has not: an empty row's mismatch
    // (e.g. a finite LSE where -inf is exact, or 0 / 0) is the empty-row detector's, and a NaN row is NaN.
    if (ri.kind != RowKind::kNormal) continue;
    bool got_nonfinite = false;
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      const size_t e = ex.o_at(r.b, r.s, r.h, d);
      const float g = out.o[static_cast<size_t>(o_index(p, r.b, r.s, r.h, d))];
      got_nonfinite |= std::isfinite(ex.o[e]) && !std::isfinite(g);
    }
    if (!out.lse.empty()) {
      const size_t e = ex.lse_at(r.b, r.h, r.s);
      const float g = out.lse[static_cast<size_t>(lse_index(p, r.b, r.h, r.s))];
      got_nonfinite |= std::isfinite(ex.lse[e]) && !std::isfinite(g);
    }
    if (!got_nonfinite) continue;
    bool q_bad = false;
    for (int64_t d = 0; d < p.head_dim && !q_bad; ++d)
      q_bad = !std::isfinite(t.q[static_cast<size_t>(c.q_at(r.b, r.s, r.h, d))]);
    if (q_bad) continue;
    const Problem rp = c.row_problem(r.b);
    const KeyRange kr = visible_keys(rp, r.s);
    bool visible_bad = false;
    std::vector<int64_t> masked_bad;
    // Key j is bad when it holds a NaN/Inf in any kv head of the sequence: a kernel that reads the wrong
    // head (GQA mapping) takes another head's visible NaN, which is no mask leak.
    for (int64_t j = 0; j < rp.seq_k; ++j) {
      bool bad = false;
      for (int64_t hk = 0; hk < p.heads_kv && !bad; ++hk) {
        for (int64_t d = 0; d < p.head_dim && !bad; ++d)
          bad = !std::isfinite(t.k[static_cast<size_t>(c.k_at(r.b, j, hk, d))]);
        for (int64_t d = 0; d < p.head_dim_v && !bad; ++d)
          bad = !std::isfinite(t.v[static_cast<size_t>(c.v_at(r.b, j, hk, d))]);
      }
      if (!bad) continue;
      if (j >= kr.first && j < kr.last)
        visible_bad = true;
      else
        masked_bad.push_back(j);
    }
    if (visible_bad || masked_bad.empty()) continue;
    if (n++ == 0)
      example =
          fmt("row s=%lld (b=%lld, h=%lld) sees keys [%lld, %lld) and is non-finite in the output, while "
              "its only NaN/Inf inputs are at masked keys j = ",
              (long long)r.s, (long long)r.b, (long long)r.h, (long long)kr.first, (long long)kr.last) +
          ranges(masked_bad);
  }
  if (n)
    fire(f, "nan-leak",
         fmt("a NaN/Inf at masked positions reaches the output (%lld row(s)): ", (long long)n) + example);
}

// The O elements of rows `checked` that differ bitwise between launches a and x (two NaNs are the same).
struct RowChanges {
  int64_t changed = 0;
  std::string first;          // "O[b=0,s=3,h=0,d=1]: 0.25 -> nan"
  std::vector<int64_t> rows;  // the rows with a change, ascending
};
RowChanges row_changes(const Problem& p, const LaunchOutcome& a, const LaunchOutcome& x,
                       const std::vector<int64_t>& checked) {
  RowChanges rc;
  for (int64_t i : checked)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t e = static_cast<size_t>(o_index(p, b, i, h, d));
          const float u = a.o[e], w = x.o[e];
          if ((std::isnan(u) && std::isnan(w)) || u == w) continue;
          if (rc.changed++ == 0) rc.first = o_name(b, i, h, d) + ": " + num(u) + " -> " + num(w);
          if (rc.rows.empty() || rc.rows.back() != i) rc.rows.push_back(i);
        }
  return rc;
}

// The inputs t with K and V (or V alone, to the finite kV) set at keys `masked` of every sequence and kv head.
constexpr float kFiniteV = 256.0f;  // exact in every carried dtype (fp8 e4m3's max is 448)
Tensors at_masked_keys(const Problem& p, const Tensors& t, const std::vector<int64_t>& masked, bool nan) {
  Tensors pt = t;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (int64_t j : masked) {
        for (int64_t d = 0; d < p.head_dim && nan; ++d) pt.k[static_cast<size_t>(k_index(p, b, j, hk, d))] = kNaNf;
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          pt.v[static_cast<size_t>(v_index(p, b, j, hk, d))] = nan ? kNaNf : kFiniteV;
      }
  return pt;
}

// (d) NaN written into K and V at the keys masked for a probe row must not change any row that does not
// see those keys. A change is this failure's cause only if a finite V there (256, K unchanged) changes those
// rows too: a kernel that gives masked keys weight 0 but multiplies them in (0 x NaN in P.V, as jax's xla
// and Pallas do) leaks only a NaN, an input the case may not hold (nan-leak, test (b), names that failure).
void masked_nan_probe(Context& c, Finding& f) {
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  std::vector<int64_t> probes;
  int64_t b0, h0, s0;
  if (worst_row(c.j.result, b0, h0, s0)) probes.push_back(s0);
  int64_t best = -1, best_masked = 0;
  for (int64_t i = 0; i < p.seq_q; ++i) {
    const KeyRange kr = visible_keys(p, i);
    const int64_t masked = kr.empty() ? p.seq_k : p.seq_k - (kr.last - kr.first);
    if (!kr.empty() && masked > best_masked) best = i, best_masked = masked;
  }
  if (best >= 0 && (probes.empty() || probes[0] != best)) probes.push_back(best);
  for (int64_t r : probes) {
    const KeyRange kr = visible_keys(p, r);
    std::vector<int64_t> masked;
    for (int64_t j = 0; j < p.seq_k; ++j)
      if (kr.empty() || j < kr.first || j >= kr.last) masked.push_back(j);
    if (masked.empty()) continue;
    // Rows with keys that see none of the masked keys. A fully masked row is not checked: what it holds is
    // the empty-row detector's (one root cause, one class: an empty row written as the unmasked result must
    // not read as a mask leak here and as empty-row on another call route of the same inputs).
    std::vector<int64_t> checked;
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const KeyRange ki = visible_keys(p, i);
      if (!ki.empty() && !kr.empty() && ki.first >= kr.first && ki.last <= kr.last) checked.push_back(i);
    }
    const LaunchOutcome po = c.launch(at_masked_keys(p, c.tensors(), masked, true));
    if (po.launch.status != LaunchStatus::kOk || po.o.size() != out.o.size()) continue;
    const RowChanges nan = row_changes(p, out, po, checked);
    if (!nan.changed) continue;
    const std::string what =
        fmt("K and V set to NaN at the %zu key(s) masked for row %lld (j = ", masked.size(), (long long)r) +
        ranges(masked) + fmt(") changed %lld output element(s) of rows that see none of them (s = ",
                             (long long)nan.changed) +
        ranges(nan.rows) + "); first " + nan.first;
    const LaunchOutcome pv = c.launch(at_masked_keys(p, c.tensors(), masked, false));
    const bool finite_ran = pv.launch.status == LaunchStatus::kOk && pv.o.size() == out.o.size();
    const RowChanges fin = finite_ran ? row_changes(p, out, pv, checked) : RowChanges{};
    if (!finite_ran || fin.changed) {
      fire(f, "probe",
           what + (finite_ran ? fmt("; V = %g there (K unchanged) changed %lld of them too (first ", kFiniteV,
                                    (long long)fin.changed) + fin.first + "): the masked keys carry weight"
                              : std::string()));
    } else {
      f.evidence.push_back(
          {"mask", what + fmt("; but V = %g there (K unchanged) changed none of them: the masked keys get weight "
                              "0 and a NaN there passes only through 0 x NaN in P.V (a NaN-at-a-masked-key leak, "
                              "for inputs with such a NaN; not what fails here)", kFiniteV)});
    }
    break;
  }
}

}  // namespace

Finding mask(Context& c) {
  if (c.gradient_failure()) return mask_gradients(c);
  Finding f;
  if (c.original().o.empty()) return f;
  written_empty_test(c, f);  // (a)
  nan_leak_test(c, f);       // (b)
  other_mask_test(c, f);     // (c)
  if (c.seqs()) {
    f.evidence.push_back({"mask",
                          "the NaN-in-masked-K/V probe (d) is not run on a sequence layout: it writes NaN "
                          "at one row's masked keys of every sequence, whose rows see different keys"});
    return f;
  }
  masked_nan_probe(c, f);  // (d)
  return f;
}

// The oracle's model of a classic mask bug: masked scores filled with 0 instead of -inf. Such a row is the
// exact row times a factor f < 1 for every d (extra mass in the softmax denominator only), and the extra
// mass c = e^LSE (1/f - 1) is a whole number of keys of score 0. A fit, not an experiment: it ranks below
// the reorder (rescale) detector.
Finding mask_model(Context& c) {
  Finding f;
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  if (out.o.empty() || p.head_dim_v < 1) return f;
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);
  int analysed = 0, fits = 0;
  std::string example;
  for (const RowKey& r : failing_rows(c)) {
    const RowInfo& ri = ex.row(r.b, r.h, r.s);
    if (ri.kind != RowKind::kNormal) continue;
    double ee = 0, ke = 0, bb = 0;
    bool finite = true;
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      const size_t e = ex.o_at(r.b, r.s, r.h, d);
      const double oe = ex.o[e], ok = out.o[static_cast<size_t>(o_index(p, r.b, r.s, r.h, d))];
      if (!std::isfinite(oe) || !std::isfinite(ok)) finite = false;
      ee += oe * oe, ke += ok * oe, bb += ex.o_bound[e] * ex.o_bound[e];
    }
    if (!finite || !(ee > 0)) continue;
    const double fac = ke / ee;
    if (!(fac > 0 && fac < 1)) {
      ++analysed;
      continue;
    }
    bool proportional = true;
    for (int64_t d = 0; d < p.head_dim_v && proportional; ++d) {
      const size_t e = ex.o_at(r.b, r.s, r.h, d);
      const double ok = out.o[static_cast<size_t>(o_index(p, r.b, r.s, r.h, d))];
      proportional = std::fabs(ok - fac * ex.o[e]) <= 4 * ex.o_bound[e] + 1e-6 * std::fabs(ex.o[e]);
    }
    const double lse = ex.lse[ex.lse_at(r.b, r.h, r.s)];
    if (!std::isfinite(lse) || lse > 30) continue;  // e^LSE too large to resolve single keys
    const double mass = std::exp(lse);
    const double noise = mass * std::sqrt(bb / ee) / (fac * fac);
    if (noise > 0.01) continue;
    ++analysed;
    const double extra = mass * (1 / fac - 1);
    const double whole = std::round(extra);
    if (proportional && whole >= 1 && std::fabs(extra - whole) <= std::max(0.02, 3 * noise)) {
      if (fits++ == 0)
        example =
            fmt("row s=%lld (b=%lld, h=%lld): O = %.6f x exact for every d; extra mass %.4f = %.0f key(s) of "
                "score 0",
                (long long)r.s, (long long)r.b, (long long)r.h, fac, extra, whole);
    }
  }
  if (fits >= 1 && fits * 10 >= analysed * 9 && (fits >= 2 || analysed == 1)) {
    f.fired = true;
    f.cls = FailureClass::kMask;
    f.evidence.push_back(
        {"mask-model", fmt("%d of %d failing rows equal the exact softmax with extra keys of score 0 "
                           "and value 0 (masked scores filled with 0 instead of -inf): ",
                           fits, analysed) +
                           example});
  }
  return f;
}

}  // namespace attnfuzz::detect
