// merge.cpp - the exact merge of given partial states and its per-element bound (oracle/merge.h).
#include "oracle/merge.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "oracle/lowp.h"

namespace attnfuzz {

MergeWeights merge_weights(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t s) {
  MergeWeights r;
  r.w.assign(static_cast<size_t>(p.n_states), 0.0);
  for (int64_t st = 0; st < p.n_states; ++st) {
    const double l = t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))];
    if (std::isnan(l)) r.nan = true;
    if (l == INFINITY) r.inf = true;
    if (l > r.m) r.m = l;
  }
  r.empty = r.m == -INFINITY && !r.nan;
  if (r.empty || r.nan || r.inf) return r;
  for (int64_t st = 0; st < p.n_states; ++st) {
    const double l = t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))];
    if (l == -INFINITY) continue;
    r.w[static_cast<size_t>(st)] = std::exp(l - r.m);
    r.sum += r.w[static_cast<size_t>(st)];
    ++r.nonempty;
  }
  return r;
}

namespace {

// Bounds of one merged row (oracle/README.md "Merged states"): e_s, the relative error of weight s of an fp32
// merge that subtracts the max (or scales both LSEs by log2(e) first: the |m| term), then the normalisation.
void bound_row(const Problem& p, const Tensors& t, const MergeWeights& mw, int64_t b, int64_t h, int64_t s,
               const OracleOptions& opts, OracleResult& r) {
  const double u = std::ldexp(1.0, -24), sf = opts.safety_factor;
  const BoundModel& bm = opts.model;
  double e_max = 0;
  for (int64_t st = 0; st < p.n_states; ++st) {
    if (mw.w[static_cast<size_t>(st)] == 0) continue;
    const double l = t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))];
    e_max = std::max(e_max, u * (bm.c_arg * (std::fabs(l - mw.m) + std::fabs(mw.m) + 1) + bm.c_exp));
  }
  const double n = static_cast<double>(mw.nonempty);
  const double rel = 2 * e_max + u * (2 * bm.c_n * n + bm.c_0);
  const bool lowp = p.dtype != AF_DTYPE_F32;
  const double uc = unit_roundoff(p.dtype), floor = lowp ? underflow_error(p.dtype) : 0;
  // Flushed or subnormal fp32 intermediates (a weight e^(LSE_s - M) below FLT_MIN, a product w_s O_sd, the
  // stored O): up to FLT_MIN absolutely each, as the attention bound's floor (README "Merged states").
  constexpr double kFltMin = 1.17549435082228750797e-38;
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    double a = 0, omax = 0;  // sum_s (w_s / W) |O_sd|, max_s |O_sd|
    for (int64_t st = 0; st < p.n_states; ++st)
      if (mw.w[static_cast<size_t>(st)] != 0) {
        const double x =
            std::fabs(t.state_o[static_cast<size_t>(state_o_offset(p, t.cu_seqlens_q, st, b, s, h, d))]);
        a += mw.w[static_cast<size_t>(st)] / mw.sum * x;
        omax = std::max(omax, x);
      }
    const size_t oi = r.o_at(b, s, h, d);
    const double fp32 = sf * (a * rel + 2 * kFltMin * (n + 2) * (1 + omax));
    r.o_bound[oi] = fp32 + (lowp ? uc * (std::fabs(r.o[oi]) + fp32) + floor : 0);
    r.o_err[oi] = 1e-15 * std::fabs(r.o[oi]);
  }
  const size_t li = r.lse_at(b, h, s);
  r.lse_bound[li] = sf * (e_max + u * (bm.c_n * n + bm.c_exp * std::log(n + 1))) + u * bm.c_0 * (std::fabs(r.lse[li]) + 1);
  r.lse_err[li] = 1e-15 * std::fabs(r.lse[li]);
}

// Columns d where a non-empty state (finite LSE_s) holds a NaN in O_sd: O_d is NaN however small that state's
// weight (IEEE 0 * NaN = NaN, as a NaN in v at a key whose weight underflows; docs/semantics.md "Merged states").
std::vector<char> nan_columns(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t s) {
  std::vector<char> nan_d(static_cast<size_t>(p.head_dim_v), 0);
  for (int64_t st = 0; st < p.n_states; ++st) {
    if (t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))] == -INFINITY) continue;
    for (int64_t d = 0; d < p.head_dim_v; ++d)
      if (std::isnan(t.state_o[static_cast<size_t>(state_o_offset(p, t.cu_seqlens_q, st, b, s, h, d))]))
        nan_d[static_cast<size_t>(d)] = 1;
  }
  return nan_d;
}

// Row outside the fp32 contract (value range) where, in a column without a NaN, sum_s |O_sd| over the non-empty
// states passes FLT_MAX: an fp32 merge accumulates w_s O_sd with w_s <= 1 relative to its running max, which an
// online merge raises state by state, so its accumulator is bounded by that sum and nothing smaller (as an attention
// row's unnormalised P.V by sum_j |v_j|). An infinite O_sd counts whatever its weight (w_s * inf = inf, or 0 * inf =
// NaN once w_s underflows).
void outside_range_test(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t s,
                        const std::vector<char>& nan_d, RowInfo& info, OracleResult& r) {
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    if (nan_d[static_cast<size_t>(d)]) continue;
    double sum = 0;
    for (int64_t st = 0; st < p.n_states; ++st)
      if (t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))] != -INFINITY)
        sum += std::fabs(t.state_o[static_cast<size_t>(state_o_offset(p, t.cu_seqlens_q, st, b, s, h, d))]);
    if (sum > 3.40282346638528859812e+38) {
      info.contract = ContractReason::kValueRange;
      info.contract_value = sum;
      ++r.rows_outside;
      return;
    }
  }
}

// Row (b, h, s) of the merge into r.
void merge_row(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t s, const OracleOptions& opts,
               OracleResult& r) {
  RowInfo& info = r.rows[r.lse_at(b, h, s)];
  info.computed = true;
  info.path = RowPath::kFast;
  ++r.rows_computed;
  ++r.rows_fast;
  const MergeWeights mw = merge_weights(p, t, b, h, s);
  const size_t li = r.lse_at(b, h, s);
  if (mw.nan || mw.empty || mw.inf) {
    info.kind = mw.nan ? RowKind::kNaN : mw.empty ? RowKind::kFullyMasked : RowKind::kNormal;
    if (mw.inf && !mw.nan) {
      info.contract = ContractReason::kValueRange;
      info.contract_value = INFINITY;
      ++r.rows_outside;
    }
    r.lse[li] = mw.nan ? NAN : mw.empty ? -INFINITY : INFINITY;
    r.lse_bound[li] = 0;
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      r.o[r.o_at(b, s, h, d)] = mw.nan || mw.inf ? NAN : 0.0;
      r.o_bound[r.o_at(b, s, h, d)] = 0;
    }
    return;
  }
  const std::vector<char> nan_d = nan_columns(p, t, b, h, s);
  outside_range_test(p, t, b, h, s, nan_d, info, r);
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    long double acc = 0;
    for (int64_t st = 0; st < p.n_states; ++st)
      if (mw.w[static_cast<size_t>(st)] != 0)
        acc += static_cast<long double>(mw.w[static_cast<size_t>(st)]) *
               t.state_o[static_cast<size_t>(state_o_offset(p, t.cu_seqlens_q, st, b, s, h, d))];
    r.o[r.o_at(b, s, h, d)] = nan_d[static_cast<size_t>(d)] ? NAN : static_cast<double>(acc / mw.sum);
  }
  r.lse[li] = mw.m + std::log(mw.sum);
  bound_row(p, t, mw, b, h, s, opts, r);
  for (int64_t d = 0; d < p.head_dim_v; ++d)
    if (nan_d[static_cast<size_t>(d)]) r.o_bound[r.o_at(b, s, h, d)] = 0;  // an expected NaN has bound 0
}

}  // namespace

OracleResult merge_oracle(const Problem& p, const Tensors& t, const OracleOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  OracleResult r;
  r.problem = dense_view(p, t);
  const Problem& v = r.problem;
  r.compute_dtype = p.dtype;
  r.compute_model = opts.compute_model;
  const size_t no = static_cast<size_t>(v.batch * v.seq_q * v.heads_q * v.head_dim_v);
  const size_t nl = static_cast<size_t>(v.batch * v.heads_q * v.seq_q);
  r.o.assign(no, NAN);
  r.o_bound.assign(no, NAN);
  r.o_err.assign(no, 0);
  r.lse.assign(nl, NAN);
  r.lse_bound.assign(nl, NAN);
  r.lse_err.assign(nl, 0);
  r.rows.assign(nl, RowInfo{});
  for (int64_t s = 0; s < v.seq_q; ++s) r.sampled.push_back(s);
  for (int64_t b = 0; b < v.batch; ++b)
    for (int64_t h = 0; h < v.heads_q; ++h)
      for (int64_t s = 0; s < seq_len_q(p, t, b); ++s) merge_row(p, t, b, h, s, opts, r);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace attnfuzz
