// sequences.cpp - the sequence-isolation detector (varlen / paged batches): a sequence's output must not change
// when only other sequences' inputs change; one that does read across its boundary (oob-read).
#include <algorithm>
#include <bit>
#include <cmath>

#include "check/detectors/detectors.h"
#include "check/sequences.h"

namespace attnfuzz::detect {

namespace {

// Changes every q / k / v value of the sequences in `which` (x -> -x + 0.5, finite values only, so the other
// sequences' inputs keep their contract) and leaves the rest bit for bit.
Tensors perturbed(const Problem& p, const Tensors& t, const std::vector<int64_t>& which) {
  Tensors u = t;
  auto flip = [](float& x) {
    if (std::isfinite(x)) x = -x + 0.5f;
  };
  for (int64_t b : which) {
    for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d) flip(u.q[q_offset(p, t, b, s, h, d)]);
    for (int64_t s = 0; s < seq_len_k(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) flip(u.k[k_offset(p, t, b, s, h, d)]);
        for (int64_t d = 0; d < p.head_dim_v; ++d) flip(u.v[v_offset(p, t, b, s, h, d)]);
      }
  }
  return u;
}

// Whether sequence b's rows (in the dense view) differ bitwise between two launches.
bool rows_differ(const Problem& w, const LaunchOutcome& a, const LaunchOutcome& x, int64_t b, int64_t sq) {
  for (int64_t s = 0; s < sq; ++s)
    for (int64_t h = 0; h < w.heads_q; ++h) {
      for (int64_t d = 0; d < w.head_dim_v; ++d) {
        const size_t i = static_cast<size_t>(o_index(w, b, s, h, d));
        if (std::bit_cast<uint32_t>(a.o[i]) != std::bit_cast<uint32_t>(x.o[i])) return true;
      }
      if (!a.lse.empty()) {
        const size_t i = static_cast<size_t>(lse_index(w, b, h, s));
        if (std::bit_cast<uint32_t>(a.lse[i]) != std::bit_cast<uint32_t>(x.lse[i])) return true;
      }
    }
  return false;
}

}  // namespace

Finding sequence_isolation(Context& c) {
  Finding f;
  const Problem& p = c.pc.problem();
  const Tensors& t = c.tensors();
  if (!has_sequences(p) || p.batch < 2 || c.original().o.empty()) return f;
  if (!c.deterministic) {
    const LaunchOutcome again = c.launch(t);
    if (again.launch.status != LaunchStatus::kOk || bit_diff(c.problem(), c.original(), again).count != 0) {
      f.evidence.push_back({"sequences", "not run: a rerun already differs from the checked launch"});
      f.unreliable_baseline = true;
      return f;
    }
  }
  const Problem& w = c.problem();
  // Failing sequences first (they are where a cross-boundary read shows), at most 8 experiments.
  std::vector<int64_t> order;
  for (const RowKey& r : failing_rows(c))
    if (std::find(order.begin(), order.end(), r.b) == order.end()) order.push_back(r.b);
  for (int64_t b = 0; b < p.batch; ++b)
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  int tried = 0;
  for (int64_t b : order) {
    const int64_t sq = seq_len_q(p, t, b);
    if (sq == 0) continue;
    if (++tried > 8) break;
    std::vector<int64_t> others;
    for (int64_t o = 0; o < p.batch; ++o)
      if (o != b) others.push_back(o);
    const LaunchOutcome x = c.launch(perturbed(p, t, others));
    if (x.launch.status != LaunchStatus::kOk || !rows_differ(w, c.original(), x, b, sq)) continue;
    // Which neighbour: the next sequence, then the previous one, else "another".
    std::string culprit = "another sequence";
    for (int64_t n : {b + 1, b - 1}) {
      if (n < 0 || n >= p.batch) continue;
      const LaunchOutcome y = c.launch(perturbed(p, t, {n}));
      if (y.launch.status == LaunchStatus::kOk && rows_differ(w, c.original(), y, b, sq)) {
        culprit = sequence_text(p, t, n);
        break;
      }
    }
    f.fired = true;
    f.cls = FailureClass::kOobRead;
    f.evidence.push_back({"sequences", "the output of " + sequence_text(p, t, b) +
                                           " changes when only the inputs of other sequences change (the kernel "
                                           "is bitwise deterministic): it reads across its boundary, into " +
                                           culprit});
    return f;
  }
  f.evidence.push_back({"sequences", fmt("every tried sequence's output (%d) is bit-identical when the other "
                                         "sequences' inputs change: no read across a sequence boundary",
                                         std::min(tried, 8))});
  return f;
}

}  // namespace attnfuzz::detect
