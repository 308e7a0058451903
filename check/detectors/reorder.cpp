// reorder.cpp - the rescale detector: the worst row's visible keys sorted so that its max key comes first,
// then last (in a sequence layout: the keys of the worst row's sequence, moved in the layout's K / V; with
// custom masks: only the keys the row sees trade places).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

Finding reorder(Context& c) {
  Finding f;
  const Problem& p = c.problem();
  const Tensors& t = c.tensors();
  int64_t b, h, s;
  if (c.original().o.empty() || !worst_row(c.j.result, b, h, s)) return f;
  // The row's visible keys (mask_kind and the custom / block masks): they trade places among themselves, so
  // every key the row sees stays visible and every hidden key stays where it was.
  const std::vector<int64_t> keys = c.seen_keys(b, h, s);
  const int64_t n = static_cast<int64_t>(keys.size());
  if (n < 2) return f;
  const auto key = [&keys](int64_t i) { return keys[static_cast<size_t>(i)]; };
  const int64_t hk = kv_head(p, h);
  std::vector<double> score(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < p.head_dim; ++d)
      dot += double(t.q[static_cast<size_t>(c.q_at(b, s, h, d))]) *
             double(t.k[static_cast<size_t>(c.k_at(b, key(j), hk, d))]);
    score[static_cast<size_t>(j)] = double(p.scale) * dot;
    // A -inf score is a key of weight 0: it sorts below every other key (max first: it comes last). A NaN or
    // +inf score makes the whole row NaN: nothing to reorder.
    if (std::isnan(score[static_cast<size_t>(j)]) || score[static_cast<size_t>(j)] == INFINITY) {
      f.evidence.push_back({"reorder", "not applicable: the worst row has a NaN or +inf score"});
      return f;
    }
  }
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t x) {
    return score[static_cast<size_t>(a)] > score[static_cast<size_t>(x)];
  });
  auto permuted = [&](bool max_first) {
    Tensors pt = t;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t src = key(perm[static_cast<size_t>(max_first ? i : n - 1 - i)]), dst = key(i);
      for (int64_t d = 0; d < p.head_dim; ++d)
        pt.k[static_cast<size_t>(c.k_at(b, dst, hk, d))] = t.k[static_cast<size_t>(c.k_at(b, src, hk, d))];
      for (int64_t d = 0; d < p.head_dim_v; ++d)
        pt.v[static_cast<size_t>(c.v_at(b, dst, hk, d))] = t.v[static_cast<size_t>(c.v_at(b, src, hk, d))];
    }
    return pt;
  };
  double ratio[2];
  for (int first = 1; first >= 0; --first) {
    const Tensors pt = permuted(first == 1);
    const LaunchOutcome out = c.launch(pt);
    if (out.launch.status != LaunchStatus::kOk) {
      f.evidence.push_back({"reorder", std::string("the reordered launch ended with ") +
                                           launch_status_name(out.launch.status)});
      return f;
    }
    ratio[first] = row_ratio(p, c.layout_oracle(c.pc.problem(), pt), out, b, h, s);
  }
  const double checked = row_ratio(p, c.pc.oracle(c.opts.oracle), c.original(), b, h, s);
  const std::string row = fmt("row s=%lld (b=%lld, h=%lld), ", (long long)s, (long long)b, (long long)h) +
                          c.seen_text(b, h, s) + ", reordered by score: ";
  const std::string table = "max key first -> err/bound " + num(ratio[1]) +
                            (ratio[1] > 1 ? " (FAIL)" : " (pass)") + ", max key last -> " + num(ratio[0]) +
                            (ratio[0] > 1 ? " (FAIL)" : " (pass)") + ", as checked -> " + num(checked);
  if (ratio[1] <= 1 && ratio[0] > 1) {
    f.fired = true;
    f.cls = FailureClass::kRescale;
    f.evidence.push_back(
        {"reorder", row + table +
                        ": the error appears only when the row max grows after the first keys, as a running "
                        "max / sum / accumulator not rescaled makes it (a kernel that drops the row's last keys "
                        "shows it too: the keys probe tests that first)"});
  } else {
    f.evidence.push_back(
        {"reorder", row + table + ": the error does not follow the position of the max key"});
  }
  return f;
}

}  // namespace attnfuzz::detect
