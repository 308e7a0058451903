// dropout.cpp - the dropout checks of one launch that need no oracle: mask bytes, keep fraction, forward vs backward.
#include "check/dropout.h"

#include <algorithm>
#include <cmath>

#include "attnfuzz/dropout.h"
#include "attnfuzz/registry.h"

namespace attnfuzz {

const std::vector<uint8_t>& launch_keep(const PreparedCase& pc, const std::vector<uint8_t>& exported) {
  return exported.empty() ? pc.keep_mask() : exported;
}

VariantInputs with_keep(const PreparedCase& pc, const std::vector<uint8_t>& keep) {
  VariantInputs v = pc.variant_inputs();
  if (!keep.empty()) v.dropout_keep = keep.data();
  return v;
}

DropoutJudgement judge_dropout_masks(const PreparedCase& pc, const LaunchOutcome& lo) {
  DropoutJudgement d;
  const Problem& p = pc.problem();
  if (!(p.variants & AF_VARIANT_DROPOUT) || p.dropout_rng != AF_DROPOUT_RNG_EXPORTED) return d;
  auto fail = [&](std::string reason) {
    if (!d.failed) d.failed = true, d.reason = std::move(reason);
  };
  if (lo.keep_bad) {
    d.evidence.push_back({"dropout", "mask-bytes: " + std::to_string(lo.keep_bad) +
                                         " visible byte(s) of the exported keep mask are neither 0 nor 1 (0xa5 = "
                                         "unwritten); first: " + lo.keep_bad_first});
    fail("the exported dropout mask holds " + std::to_string(lo.keep_bad) + " byte(s) other than 0 / 1");
  }
  // The mask the forward used (fwd, fwd+bwd) or the backward's (bwd alone).
  const std::vector<uint8_t>& mask = lo.keep.empty() ? lo.keep_bwd : lo.keep;
  if (!mask.empty()) {
    const KeepTest t = keep_fraction_test(p, mask);
    d.evidence.push_back({"dropout", t.evidence()});
    if (t.failed) fail("dropout keep fraction: " + t.worst_unit + " keeps " + std::to_string(t.worst_k) + " of " +
                       std::to_string(t.worst_n) + " weights, not Binomial(n, 1 - p) (p-value bound below the threshold)");
  }
  if (!lo.keep.empty() && !lo.keep_bwd.empty()) {
    std::string first;
    const int64_t n = keep_mask_differences(p, lo.keep, lo.keep_bwd, first);
    if (n) {
      d.evidence.push_back({"dropout", "fwd-bwd: the backward launch dropped other weights than the forward: " +
                                           std::to_string(n) + " visible weight(s) differ; first: " + first});
      fail("the forward and backward launches drew different dropout masks (" + std::to_string(n) + " weights differ)");
    }
  }
  return d;
}

namespace {
// The exported forward mask of p (another tunable or seed than the case's), empty when the launch did not end well.
std::vector<uint8_t> relaunch_mask(Device& dev, const KernelEntry& k, const PreparedCase& pc, const Problem& p,
                                   const RunOptions& opts) {
  const LaunchOutcome o = launch_guarded(dev, k, p, pc.tensors(), opts);
  if (o.launch.status != LaunchStatus::kOk || o.keep_bad) return {};
  return o.keep;
}
// The probability that two independent masks of n weights with keep probability q agree everywhere, for the q of the
// null closest to 0 or 1.
double agree_probability(const Problem& p, int64_t n) {
  double lo = 0, hi = 0, worst = 0;
  keep_probabilities(p, lo, hi);
  for (double q : {lo, hi}) worst = std::max(worst, q * q + (1 - q) * (1 - q));
  return std::pow(worst, static_cast<double>(n));
}
}  // namespace

DropoutJudgement dropout_invariance(Device& dev, const KernelEntry& k, const PreparedCase& pc, const LaunchOutcome& lo,
                                    const RunOptions& opts) {
  DropoutJudgement d;
  const Problem& p = pc.problem();
  if (!(p.variants & AF_VARIANT_DROPOUT) || p.dropout_rng != AF_DROPOUT_RNG_EXPORTED || lo.keep.empty()) return d;
  Problem base = p;
  resolve_tunables(k.kernel, base);
  if (dev.backend() == Backend::kCpu) {  // another emulator thread order (the schedule detector's mechanism)
    const DeviceOptions saved = dev.options();
    DeviceOptions other = saved;
    other.order = saved.order == ThreadOrder::kReverse ? ThreadOrder::kForward : ThreadOrder::kReverse;
    dev.set_options(other);
    const std::vector<uint8_t> m = relaunch_mask(dev, k, pc, base, opts);
    dev.set_options(saved);
    std::string first;
    const int64_t n = m.empty() ? 0 : keep_mask_differences(p, lo.keep, m, first);
    if (n) {
      d.failed = true;
      d.reason = "the dropout mask depends on the thread order (" + std::to_string(n) + " weights differ)";
      d.evidence.push_back({"dropout", std::string("thread-order: in thread order ") + thread_order_name(other.order) +
                                           " the exported mask differs at " + std::to_string(n) +
                                           " visible weight(s); first: " + first});
      return d;
    }
  }
  for (int t = 0; t < k.kernel.n_tunables && !d.failed; ++t) {
    const af_tunable& tu = k.kernel.tunables[t];
    for (int v = 0; v < tu.n_values && !d.failed; ++v) {
      if (tu.values[v] == base.tunables[t]) continue;
      Problem other = base;
      other.tunables[t] = tu.values[v];
      const std::vector<uint8_t> m = relaunch_mask(dev, k, pc, other, opts);
      std::string first;
      const int64_t n = m.empty() ? 0 : keep_mask_differences(p, lo.keep, m, first);
      if (n == 0) continue;
      d.failed = true;
      d.reason = "the dropout mask depends on tunable " + std::string(tu.name) + " (" + std::to_string(n) +
                 " weights differ between " + std::to_string(base.tunables[t]) + " and " + std::to_string(tu.values[v]) + ")";
      d.evidence.push_back({"dropout", "tunable: with " + std::string(tu.name) + " = " + std::to_string(tu.values[v]) +
                                           " instead of " + std::to_string(base.tunables[t]) + " the exported mask differs at " +
                                           std::to_string(n) + " visible weight(s); first: " + first});
    }
  }
  int64_t n_visible = 0;  // the judged weights (rows with a finite LSE)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeyRange kr = visible_keys(p, i);
        for (int64_t j = kr.first; j < kr.last; ++j) n_visible += lo.keep[keep_index(p, b, h, i, j)] != kKeepUnjudged;
      }
  if (d.failed || agree_probability(p, n_visible) >= kDropoutAlpha) return d;
  Problem reseeded = base;
  reseeded.dropout_seed = p.dropout_seed + 1;
  const std::vector<uint8_t> m = relaunch_mask(dev, k, pc, reseeded, opts);
  std::string first;
  if (!m.empty() && keep_mask_differences(p, lo.keep, m, first) == 0) {
    d.failed = true;
    d.reason = "the dropout mask does not change with the seed (a stale or ignored seed)";
    d.evidence.push_back({"dropout", "seed: with seed " + std::to_string(reseeded.dropout_seed) + " instead of " +
                                         std::to_string(p.dropout_seed) + " the exported mask is the same at all " +
                                         std::to_string(n_visible) + " visible weights (two independent masks agree "
                                         "everywhere with probability < 1e-9)"});
  }
  return d;
}

}  // namespace attnfuzz
