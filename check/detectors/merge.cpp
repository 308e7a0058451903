// merge.cpp - the merge detector (issue 29): rows whose states are all empty, then two relaunches whose exact merge
// is known: the states laid out like the output, and each row's LSE_s shifted so that its largest is near 0.
#include <algorithm>
#include <bit>
#include <cmath>

#include "check/detectors/detectors.h"
#include "oracle/merge.h"

namespace attnfuzz::detect {

namespace {

std::string strides(const int64_t* s) {
  return fmt("{%lld, %lld, %lld, %lld}", (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
}

// Every failing row has no non-empty state: an empty-row failure of the merge.
bool all_empty(const std::vector<RowFailure>& rows, Finding& f) {
  std::vector<int64_t> s;
  int64_t nonfinite = 0, written_empty = 0;
  for (const RowFailure& r : rows) {
    if (r.kind != RowKind::kFullyMasked) return false;
    s.push_back(r.key.s);
    nonfinite += r.o_nonfinite || r.lse_nonfinite;
    written_empty += r.written_empty;
  }
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  f.fired = true;
  f.cls = FailureClass::kEmptyRow;
  f.kind = "all-empty";
  f.evidence.push_back({"merge", fmt("every failing (b, h, row) (%zu, rows s = ", rows.size()) + ranges(s) +
                                     ") has only empty states (LSE_s = -inf for every s), whose merge is O = 0, "
                                     "LSE = -inf; " + fmt("%lld of them NaN / Inf", (long long)nonfinite) +
                                     (written_empty ? "" : ", none written as the empty result")});
  return true;
}

// Relaunch with t's states under problem p and judge against ex (the merge of those states).
bool passes(Context& c, const Problem& p, const Tensors& t, const OracleResult& ex, double& ratio) {
  ++c.stats.launches;
  const LaunchOutcome out = launch_guarded(c.dev, c.k, p, t, c.opts);
  if (out.launch.status != LaunchStatus::kOk || out.canary_words) return false;
  const CheckResult r = judge(c.problem(), ex, out);
  ratio = r.max_ratio;
  return r.verdict == Verdict::kPass;
}

// The states laid out like the output: state s at s * o_elements, then o's (b, s, h) strides; LSE like lse.
bool layout_experiment(Context& c, Finding& f) {
  const Problem& p = c.pc.problem();
  Problem q = p;
  q.state_o_stride[0] = o_elements(p);
  q.state_lse_stride[0] = lse_elements(p);
  for (int i = 0; i < 3; ++i) {
    q.state_o_stride[i + 1] = p.o_stride[i];
    q.state_lse_stride[i + 1] = p.lse_stride[i];
  }
  if (std::equal(q.state_o_stride, q.state_o_stride + 4, p.state_o_stride) &&
      std::equal(q.state_lse_stride, q.state_lse_stride + 4, p.state_lse_stride))
    return false;  // already laid out like the output: nothing to vary
  const Tensors& t = c.tensors();
  Tensors u = t;
  u.state_o.assign(static_cast<size_t>(state_o_elements(q)), std::bit_cast<float>(kStrideGapBits));
  u.state_lse.assign(static_cast<size_t>(state_lse_elements(q)), std::bit_cast<float>(kStrideGapBits));
  for (int64_t st = 0; st < p.n_states; ++st)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t s = 0; s < seq_len_q(p, t, b); ++s) {
          u.state_lse[static_cast<size_t>(state_lse_offset(q, st, b, h, s))] =
              t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))];
          for (int64_t d = 0; d < p.head_dim_v; ++d)
            u.state_o[static_cast<size_t>(state_o_offset(q, t.cu_seqlens_q, st, b, s, h, d))] =
                t.state_o[static_cast<size_t>(state_o_offset(p, t.cu_seqlens_q, st, b, s, h, d))];
        }
  double ratio = 0;
  if (!passes(c, q, u, c.pc.oracle(c.opts.oracle), ratio)) return false;
  f.fired = true;
  f.cls = FailureClass::kMerge;
  f.kind = "layout";
  f.evidence.push_back({"merge", "with the states laid out like the output (state_o_stride " +
                                     strides(q.state_o_stride) + ", state_lse_stride " + strides(q.state_lse_stride) +
                                     ") the merge passes (err/bound " + num(ratio) + "); as checked (state_o_stride " +
                                     strides(p.state_o_stride) + ", state_lse_stride " + strides(p.state_lse_stride) +
                                     ") it fails: the kernel indexes the states with other strides than their own"});
  return true;
}

// In every row, each finite LSE_s + c_row (c_row = minus the row's largest LSE_s, rounded to an integer): the exact
// O is unchanged, the LSE moves by about c_row. Per row, because the rows' levels differ (a row near 0 beside one at
// -200 is common) and a merge handles each row on its own. Not run when every row's largest is within 16 of 0.
bool shift_experiment(Context& c, Finding& f) {
  const Problem& p = c.pc.problem();
  const Tensors& t = c.tensors();
  Tensors u = t;
  double lo = INFINITY, hi = -INFINITY, far = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < seq_len_q(p, t, b); ++s) {
        double top = -INFINITY;
        for (int64_t st = 0; st < p.n_states; ++st) {
          const float l = t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))];
          if (std::isfinite(l)) top = std::max<double>(top, l), lo = std::min<double>(lo, l);
        }
        if (!std::isfinite(top)) continue;
        hi = std::max(hi, top);
        far = std::max(far, std::fabs(top));
        const double shift = -std::nearbyint(top);
        for (int64_t st = 0; st < p.n_states; ++st) {
          float& l = u.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))];
          if (std::isfinite(l)) l = static_cast<float>(l + shift);
        }
      }
  if (far < 16) return false;
  ++c.stats.oracles;
  const OracleResult ex = merge_oracle(p, u, c.opts.oracle);
  double ratio = 0;
  if (!passes(c, p, u, ex, ratio)) return false;
  f.fired = true;
  f.cls = FailureClass::kMerge;
  f.kind = "shift";
  f.evidence.push_back({"merge", "with each row's LSE_s shifted so that the row's largest is near 0 (shifts up to " +
                                     num(far) + ") the merge passes (err/bound " + num(ratio) + "); as checked "
                                     "(finite LSE_s in [" + num(lo) + ", " + num(hi) + "]) it fails: the result "
                                     "depends on the LSEs' level, which a merge that subtracts the row's running max "
                                     "(from -inf) does not"});
  return true;
}

}  // namespace

Finding merge(Context& c) {
  Finding f;
  const std::vector<RowFailure> rows = row_failures(c);
  if (rows.empty() || all_empty(rows, f)) return f;
  if (layout_experiment(c, f) || shift_experiment(c, f)) return f;
  f.evidence.push_back({"merge", "the failure stays with the states laid out like the output and with their LSEs "
                                 "shifted (or those experiments did not apply): no merge signature"});
  return f;
}

}  // namespace attnfuzz::detect
