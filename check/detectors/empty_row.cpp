// empty_row.cpp - the empty-row detector (rows with no key of positive weight must be O = 0, LSE = -inf:
// which rows, why empty, what the kernel wrote) and the summary of every kind of wrong row.
#include <algorithm>
#include <cmath>
#include <optional>

#include "check/compare.h"
#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

namespace {

// Why row (b, h, s) has no key of positive weight (the one visibility rule: mask_kind and the custom masks).
std::string why_empty(const Context& c, int64_t b, int64_t h, int64_t s) {
  const Problem rp = c.row_problem(b);
  if (rp.seq_k == 0) return "Sk = 0";
  if (visible_keys(rp, s).empty()) return "no visible key under mask " + mask_to_string(rp);
  return c.seen_text(b, h, s) + (c.seen_keys(b, h, s).empty() ? "" : ", every visible score -inf");
}

// The (b, h, s) rows of a dense problem that see no key, in (b, h, s) order.
std::vector<RowKey> rows_without_keys(const Context& c) {
  const Problem& p = c.problem();
  std::vector<RowKey> out;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s)
        if (c.seen_keys(b, h, s).empty()) out.push_back({b, h, s});
  return out;
}
bool row_before(const RowKey& x, const RowKey& y) {
  return x.b != y.b ? x.b < y.b : x.h != y.h ? x.h < y.h : x.s < y.s;
}
std::vector<int64_t> row_indices(const std::vector<RowKey>& rows) {
  std::vector<int64_t> s;
  for (const RowKey& r : rows) s.push_back(r.s);
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

// Whether every O element of every computed row is NaN, and some of those rows have keys.
bool every_o_nan(const Context& c, const OracleResult& ex) {
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  bool with_keys = false;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const RowInfo& ri = ex.row(b, h, s);
        if (!ri.computed) continue;
        with_keys |= ri.kind == RowKind::kNormal;
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          if (!std::isnan(out.o[static_cast<size_t>(o_index(p, b, s, h, d))])) return false;
      }
  return with_keys;
}

// Whether row (b, h, s) of the output is the plain mean of V over every key of its sequence (to 1e-5 of the
// largest |v|, fp32 summation error included).
bool is_mean_of_v(const Context& c, const LaunchOutcome& out, int64_t b, int64_t h, int64_t s) {
  const Problem& p = c.problem();
  const int64_t sk = c.row_problem(b).seq_k, hk = kv_head(p, h);
  if (sk < 1) return false;
  const Tensors& t = c.tensors();
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    double sum = 0, vmax = 0;
    for (int64_t j = 0; j < sk; ++j) {
      const double v = t.v[static_cast<size_t>(c.v_at(b, j, hk, d))];
      sum += v;
      vmax = std::max(vmax, std::fabs(v));
    }
    if (!std::isfinite(sum)) return false;
    const double g = out.o[static_cast<size_t>(o_index(p, b, s, h, d))];
    if (!(std::fabs(g - sum / double(sk)) <= 1e-5 * vmax + 1e-30)) return false;
  }
  return true;
}

// Whether every addressed dQ, dK and dV element is NaN.
bool every_gradient_nan(const Problem& p, const LaunchOutcome& out) {
  auto all_nan = [](const std::vector<float>& x, const int64_t* st, int64_t batch, int64_t seq, int64_t heads,
                    int64_t dim) {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dim; ++d)
            if (!std::isnan(x[static_cast<size_t>(b * st[0] + s * st[1] + h * st[2] + d)])) return false;
    return true;
  };
  if (out.dq.empty() || out.dk.empty() || out.dv.empty()) return false;
  return all_nan(out.dq, p.dq_stride, p.batch, p.seq_q, p.heads_q, p.head_dim) &&
         all_nan(out.dk, p.dk_stride, p.batch, p.seq_k, p.heads_kv, p.head_dim) &&
         all_nan(out.dv, p.dv_stride, p.batch, p.seq_k, p.heads_kv, p.head_dim_v);
}

}  // namespace

namespace {
// Gradient failures: a query row with no visible key has P = 0, so its dQ is 0 and it adds nothing to any dK,
// dV. The experiment: the backward relaunched with those rows' lse set to 0 instead of -inf (nothing else
// changed; the exact gradients do not depend on it). If every failure goes away, the kernel mishandles the
// lse = -inf of the rows that see no key; a non-zero dQ of such a row is the signature by itself.
// The model of cuDNN's non-zero fully masked rows in the backward: a row that sees no key attends to every key (its
// P the softmax over all Sk keys; Delta = dO . the O the backward was given), the other rows as asked: the case's
// exact gradients plus those rows' unmasked contributions. A model fit, not an experiment: every computed element
// within the case's bound of the model, and the exact gradients beyond it (compare_gradients judges both). Session
// 22's H100 SDPA cuDNN lower-right backward (40x9 causal-br, q = k = 0) returned dV within 0.4% of it; it was named
// `wrong`. Dense problems without variants.
constexpr double kModelTolerance = 0.01;

bool every_key_model(Context& c, const std::vector<RowKey>& empty, const std::vector<float>& o_in,
                     std::string& shown) {
  const Problem& p = c.pc.problem();
  if (p.variants || has_sequences(p) || p.seq_k == 0 || o_in.empty()) return false;
  const Tensors& t = c.pc.tensors();
  const LaunchOutcome& out = c.original();
  const GradResult own = grad_oracle_for(c.pc, out, c.opts);
  GradResult model = own;
  Problem none = p;  // a row's P over every key: the unmasked problem's exact LSE
  none.mask_kind = AF_MASK_NONE;
  OracleOptions fo = c.experiment_options();
  fo.row_budget = 0;
  ++c.stats.oracles;
  const OracleResult all = compute_oracle(none, t.q.data(), t.k.data(), t.v.data(), t.variant_inputs(), fo);
  std::vector<double> o(static_cast<size_t>(p.head_dim_v));
  for (const RowKey& r : empty) {
    const double lse = all.lse[all.lse_at(r.b, r.h, r.s)];
    if (!std::isfinite(lse)) return false;
    for (int64_t d = 0; d < p.head_dim_v; ++d)
      o[static_cast<size_t>(d)] = o_in[static_cast<size_t>(o_index(p, r.b, r.s, r.h, d))];
    add_row_backward(p, t, r.b, r.h, r.s, 0, p.seq_k, lse, o.data(), model);
  }
  // The model's tolerance: the case's bound or 1% of the model's value, whichever is larger. The case's bounds are
  // sized for the exact gradients, which the rows without keys do not reach, and a library's own rounding of them
  // (P, the LSE) is not in them: on the H100 case every dV element was 0.1-0.3% beyond this model.
  for (auto [v, bound] : {std::pair{&model.dq, &model.dq_bound}, std::pair{&model.dk, &model.dk_bound},
                          std::pair{&model.dv, &model.dv_bound}})
    for (size_t x = 0; x < v->size(); ++x) (*bound)[x] = std::max((*bound)[x], kModelTolerance * std::fabs((*v)[x]));
  const GradFit m = fit_gradients(p, model, out, as_written(p, own, out));
  if (!m.fits()) return false;
  shown += fmt("; the gradients match a model in which each of those rows attends to every key (P the softmax over "
               "all %lld keys, as if unmasked): all %lld computed elements within the case's bound or 1%% of the "
               "model's value (max err/tolerance %s; the exact gradients are %s tolerances from it). A model fit",
               (long long)p.seq_k, (long long)m.got.compared, num(m.got.max_ratio).c_str(),
               num(m.sep.max_ratio).c_str());
  return true;
}

Finding empty_row_gradients(Context& c) {
  Finding f;
  const Problem& p = c.problem();
  const std::vector<RowKey> empty = rows_without_keys(c);  // sorted
  if (empty.empty()) return f;
  if (static_cast<int64_t>(empty.size()) < p.batch * p.heads_q * p.seq_q &&
      every_gradient_nan(p, c.original())) {
    f.evidence.push_back({"empty-row",
                          "not applicable: every dQ, dK and dV element is NaN, for the rows with "
                          "keys too: nothing specific to the empty rows"});
    return f;
  }
  RunOptions o = c.opts;
  o.worst = size_t{1} << 30;
  CheckResult g;
  judge_gradients(c.pc, c.original(), o, g);
  int64_t n = 0, nonfinite = 0, kv = 0;
  std::vector<int64_t> rows;
  std::optional<RowKey> first;  // the first empty row with a wrong dQ
  std::string example;
  for (const ElementReport& e : g.worst) {
    if (e.ratio <= 1 || e.tensor.empty()) continue;
    if (e.tensor != "dQ") {
      ++kv;
      continue;
    }
    if (!std::binary_search(empty.begin(), empty.end(), RowKey{e.b, e.h, e.s}, row_before)) continue;
    if (n++ == 0) {
      first = RowKey{e.b, e.h, e.s};
      example = fmt("dQ[b=%lld,s=%lld,h=%lld,d=%lld] = %s", (long long)e.b, (long long)e.s, (long long)e.h,
                    (long long)e.d, num(e.got).c_str());
    }
    nonfinite += !std::isfinite(e.got);
    rows.push_back(e.s);
  }
  if (!n && !kv) {
    f.evidence.push_back({"empty-row", "query rows s = " + ranges(row_indices(empty)) +
                                           " see no key, and their dQ is 0 as it must be"});
    return f;
  }
  // The experiment (dense problems: the sequence layouts' lse rows are the dense view's).
  std::string shown;
  bool cleared = false;  // the experiment made every gradient pass
  // The O the backward was given (its own forward's in a forward + backward check); dense problems only.
  const std::vector<float> o_in = has_sequences(c.pc.problem()) ? std::vector<float>{}
                                  : c.pass() == Pass::kBwd     ? c.pc.given_o(c.opts.oracle)
                                                               : c.original().o;
  if (!has_sequences(c.pc.problem())) {
    const LaunchOutcome& out = c.original();
    std::vector<float> lse = c.pass() == Pass::kBwd ? c.pc.given_lse(c.opts.oracle) : out.lse;
    if (!lse.empty()) {
      for (const RowKey& r : empty) lse[static_cast<size_t>(lse_index(p, r.b, r.h, r.s))] = 0.0f;
      ++c.stats.launches;
      LaunchOutcome x = launch_guarded_bwd(c.dev, c.k, c.pc.problem(), c.pc.tensors(), o_in, lse, c.opts);
      if (x.launch.status == LaunchStatus::kOk) {
        x.o = o_in;
        x.lse = lse;
        CheckResult g2;
        judge_gradients(c.pc, x, o, g2);
        cleared = g2.verdict == Verdict::kPass;
        shown = cleared ? "; with the lse of those rows set to 0 instead of -inf (nothing else changed) "
                          "every gradient "
                          "passes: the kernel mishandles lse = -inf of rows that see no key"
                        : "; with the lse of those rows set to 0 instead of -inf the gradients still fail (" +
                              std::string(verdict_name(g2.verdict)) +
                              fmt(", max err/bound %s)", num(g2.max_ratio).c_str());
      }
    }
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const std::string seen =
      n ? "query rows s = " + ranges(rows) + " see no key (" + why_empty(c, first->b, first->h, first->s) +
              ", LSE = -inf): their dQ must be 0, but " +
              fmt("%lld element(s) are not (%lld NaN/Inf); first ", (long long)n, (long long)nonfinite) +
              example
        : "query rows s = " + ranges(row_indices(empty)) + " see no key and their dQ is 0, " +
              fmt("%lld dK / dV element(s) fail", (long long)kv);
  if (!cleared && every_key_model(c, empty, o_in, shown)) cleared = true;  // those rows weighed every key
  if (!n && !cleared) {  // dK / dV only, and the experiment does not tie them to the empty rows
    f.evidence.push_back({"empty-row", seen + shown + ": not shown to come from the rows that see no key"});
    return f;
  }
  f.fired = true;
  f.cls = FailureClass::kEmptyRow;
  f.evidence.push_back({"empty-row", seen + shown + "; all gradient failures: " + gradient_failure_text(c)});
  return f;
}
}  // namespace

Finding empty_row(Context& c) {
  if (c.gradient_failure()) return empty_row_gradients(c);
  Finding f;
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  if (out.o.empty()) return f;
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);
  std::optional<OracleResult> unmasked;  // the oracle under mask none, computed on first need
  struct Kind {
    const char* what;
    int64_t n = 0;
    std::string example;
  };
  // A failure in which every output element is NaN (rows with keys too) says nothing about empty rows.
  if (every_o_nan(c, ex)) {
    f.evidence.push_back({"empty-row",
                          "not applicable: every O element is NaN, in the rows with keys too: nothing "
                          "specific to the empty rows"});
    return f;
  }
  Kind k_nan{"O NaN (0 / 0, or exp(-inf - -inf) = exp(NaN))"}, k_inf{"O +-Inf"},
      k_unmasked{"O equal to the unmasked result (the softmax over all Sk keys)"},
      k_mean{
          "O equal to the mean of V over every key (equal weights: a softmax over all-equal masked scores)"},
      k_garbage{"O finite, not 0 and not the unmasked result"}, k_lse{"O = 0 but LSE not -inf"};
  std::vector<int64_t> rows;
  std::vector<std::string> reasons;
  int64_t total = 0, wrong = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const RowInfo& ri = ex.row(b, h, s);
        if (!ri.computed || !ri.inside_contract() || ri.kind != RowKind::kFullyMasked) continue;
        ++total;
        if (!(row_ratio(p, ex, out, b, h, s) > 1)) continue;
        ++wrong;
        if (std::find(rows.begin(), rows.end(), s) == rows.end()) rows.push_back(s);
        const std::string why = why_empty(c, b, h, s);
        if (std::find(reasons.begin(), reasons.end(), why) == reasons.end() && reasons.size() < 3)
          reasons.push_back(why);
        bool nan = false, inf = false, zero = true;
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const float g = out.o[static_cast<size_t>(o_index(p, b, s, h, d))];
          nan |= std::isnan(g);
          inf |= std::isinf(g);
          zero &= g == 0.0f;
        }
        const float lse = out.lse.empty() ? -INFINITY : out.lse[static_cast<size_t>(lse_index(p, b, h, s))];
        Kind* k = &k_garbage;
        if (nan)
          k = &k_nan;
        else if (inf)
          k = &k_inf;
        else if (zero)
          k = &k_lse;
        else if (p.seq_k > 0) {
          if (!unmasked) {
            Problem none = c.pc.problem();  // every key of the row: no mask_kind, no custom / block mask
            none.mask_kind = AF_MASK_NONE;
            none.variants &= ~kMaskVariants;
            try {
              unmasked = c.layout_oracle(none, c.tensors());
            } catch (const std::exception&) {
              unmasked = OracleResult{};
            }
          }
          if (!unmasked->o.empty() && unmasked->row(b, h, s).kind == RowKind::kNormal &&
              row_ratio(p, *unmasked, out, b, h, s) <= 1)
            k = &k_unmasked;
          else if (is_mean_of_v(c, out, b, h, s))
            k = &k_mean;
        }
        if (k->n++ == 0) {
          k->example = o_name(b, s, h, 0) + " = " + num(out.o[static_cast<size_t>(o_index(p, b, s, h, 0))]) +
                       (out.lse.empty() ? "" : ", LSE = " + num(lse));
          if (k == &k_lse && std::isfinite(lse) && lse < -1e20)
            k->example += " (a finite stand-in for -inf, e.g. a masked score of -1e30 / -FLT_MAX)";
        }
      }
  if (!wrong) {
    if (total)
      f.evidence.push_back({"empty-row", fmt("%lld empty row(s), all O = 0 / LSE = -inf", (long long)total)});
    return f;
  }
  std::sort(rows.begin(), rows.end());
  std::string why;
  for (const std::string& r : reasons) why += (why.empty() ? "" : "; ") + r;
  std::string detail = fmt("%lld of %lld empty (b, h, row)s (no key of positive weight: ", (long long)wrong,
                           (long long)total) +
                       why + ") are not O = 0, LSE = -inf; query rows s = " + ranges(rows) +
                       "; the kernel wrote";
  std::string sep = " ";
  for (const Kind* k : {&k_nan, &k_inf, &k_unmasked, &k_mean, &k_garbage, &k_lse})
    if (k->n) {
      detail += sep + fmt("%lld x ", (long long)k->n) + k->what + " (e.g. " + k->example + ")";
      sep = "; ";
    }
  f.fired = true;
  f.cls = FailureClass::kEmptyRow;
  f.evidence.push_back({"empty-row", detail});
  return f;
}

Finding row_kinds(Context& c) {
  Finding f;
  const std::vector<RowFailure> rows = row_failures(c);
  if (!rows.empty()) f.evidence.push_back({"rows", row_kinds_text(rows)});
  return f;
}

}  // namespace attnfuzz::detect
