// merge.cpp - the states of a merge case from its exact sub-problems, and the whole-problem comparison (check/merge.h).
#include "check/merge.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "check/sequences.h"
#include "oracle/lowp.h"

namespace attnfuzz {

Case unmerged(const Case& c) {
  Case u = c;
  u.merge = MergeSpec{};
  u.problem.n_states = 0;
  for (int i = 0; i < 4; ++i) u.problem.state_o_stride[i] = u.problem.state_lse_stride[i] = 0;
  return u;
}

namespace {

// The exact result of dense problem sp (no merge, no variant) over keys r only: the keys outside are not read.
OracleResult restricted_oracle(const Problem& sp, const Tensors& st, KeyRange r, unsigned threads) {
  Problem q = sp;
  q.variants = 0;
  OracleOptions o;
  o.baseline = false;
  o.threads = threads;
  o.keys = r;
  return compute_oracle(q, st.q.data(), st.k.data(), st.v.data(), o);
}

// Writes state st of sequence b (rows of the dense sub-problem result S, batch index sb) into t's state buffers.
void store_state(const Problem& p, const Case& c, const OracleResult& S, int64_t st, int64_t b, int64_t sb,
                 int64_t sq, Tensors& t) {
  const double shift = merge_shift(c.merge, st);
  for (int64_t h = 0; h < p.heads_q; ++h)
    for (int64_t s = 0; s < sq; ++s) {
      const RowInfo& info = S.row(sb, h, s);
      const bool empty = info.kind == RowKind::kFullyMasked || shift == -INFINITY;
      const double l = empty ? -INFINITY : S.lse[S.lse_at(sb, h, s)] + shift;
      t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))] = static_cast<float>(l);
      for (int64_t d = 0; d < p.head_dim_v; ++d)
        t.state_o[static_cast<size_t>(state_o_offset(p, t.cu_seqlens_q, st, b, s, h, d))] =
            empty ? 0.0f : static_cast<float>(round_to_dtype(S.o[S.o_at(sb, s, h, d)], p.dtype));
    }
}

}  // namespace

void make_states(const Case& c, Tensors& t, unsigned threads) {
  const Problem& p = c.problem;
  t.state_o.assign(static_cast<size_t>(state_o_elements(p)), std::bit_cast<float>(kStrideGapBits));
  t.state_lse.assign(static_cast<size_t>(state_lse_elements(p)), std::bit_cast<float>(kStrideGapBits));
  const Problem base = unmerged(c).problem;
  if (!has_sequences(p)) {
    for (int64_t st = 0; st < p.n_states; ++st) {
      const OracleResult S = restricted_oracle(base, t, merge_range(c.merge, st, p.seq_k), threads);
      for (int64_t b = 0; b < p.batch; ++b) store_state(p, c, S, st, b, b, p.seq_q, t);
    }
    return;
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const Problem sp = sequence_problem(base, t, b);
    if (sp.seq_q < 1) continue;
    const Tensors stt = sequence_tensors(base, t, b);
    for (int64_t st = 0; st < p.n_states; ++st) {
      const OracleResult S = restricted_oracle(sp, stt, merge_range(c.merge, st, sp.seq_k), threads);
      store_state(p, c, S, st, b, 0, sp.seq_q, t);
    }
  }
}

std::optional<OracleResult> merge_whole_oracle(const Case& c, const Tensors& t, const OracleResult& merged,
                                               const OracleOptions& opts) {
  for (double s : c.merge.lse_shift)
    if (s != 0) return std::nullopt;
  const Case u = unmerged(c);
  OracleOptions o = opts;
  o.baseline = false;
  o.row_budget = 0;
  OracleResult w = has_sequences(u.problem) ? sequence_oracle(u.problem, t, o)
                                            : compute_oracle(u.problem, t.q.data(), t.k.data(), t.v.data(), o);
  if (w.rows_outside) return std::nullopt;
  const Problem& p = c.problem;
  const double u32 = std::ldexp(1.0, -24), uc = unit_roundoff(p.dtype);
  const double floor = p.dtype == AF_DTYPE_F32 ? 0 : underflow_error(p.dtype);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < seq_len_q(p, t, b); ++s) {
        const MergeWeights mw = merge_weights(p, t, b, h, s);
        const size_t li = w.lse_at(b, h, s);
        w.lse_bound[li] = merged.lse_bound[li];
        double delta = 0;  // the largest rounding error of an LSE_s (fp32)
        for (int64_t st = 0; st < p.n_states; ++st)
          if (mw.w[static_cast<size_t>(st)] != 0)
            delta = std::max(delta, u32 * std::fabs(t.state_lse[static_cast<size_t>(state_lse_offset(p, st, b, h, s))]));
        if (std::isfinite(w.lse_bound[li])) w.lse_bound[li] += opts.safety_factor * delta;
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t oi = w.o_at(b, s, h, d);
          if (std::isnan(w.o[oi]) && !std::isnan(merged.o[oi])) {
            // A NaN / infinite v at a key of weight 0 makes the whole row's O_d NaN (0 * NaN), but a state whose keys
            // all have weight 0 is empty (O_s = 0, LSE_s = -inf) and the merge skips it: the two exact results part
            // there, and the whole-problem comparison takes the merge's element.
            w.o[oi] = merged.o[oi];
            w.o_bound[oi] = merged.o_bound[oi];
            continue;
          }
          double r = 0;  // sum_s (w_s / W) (rounding of O_sd + 2 delta |O_sd - O_d|)
          for (int64_t st = 0; st < p.n_states; ++st) {
            if (mw.w[static_cast<size_t>(st)] == 0) continue;
            const double x = t.state_o[static_cast<size_t>(state_o_offset(p, t.cu_seqlens_q, st, b, s, h, d))];
            r += mw.w[static_cast<size_t>(st)] / mw.sum * (uc * std::fabs(x) + floor + 2 * delta * std::fabs(x - w.o[oi]));
          }
          w.o_bound[oi] = merged.o_bound[oi] + (std::isfinite(merged.o_bound[oi]) ? opts.safety_factor * r : 0);
        }
      }
  return w;
}

}  // namespace attnfuzz
