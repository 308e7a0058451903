// amplify.cpp - the amplified-parameter relaunch (attn-check --amplify; issue 28 item 7b): a passing case
// whose variant effect is within the bound gets a sibling with that parameter amplified; a sibling output
// that is the exact result without the parameter names it ignored.
#include <algorithm>
#include <cmath>
#include <optional>

#include "check/detectors/detectors.h"
#include "check/repeat.h"

namespace attnfuzz {

namespace {

using detect::fmt;
using detect::num;

// The parameters amplified, in order, with their names ("sink") and how the exact result without them is
// named.
struct Amplified {
  uint32_t bits;
  const char* name;
};
constexpr uint32_t kCustom = AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS;
constexpr Amplified kAmplified[] = {
    {AF_VARIANT_SINK, "the sink logits (buffers.sinks)"},
    {AF_VARIANT_SOFTCAP, "the softcap (problem.softcap)"},
    {AF_VARIANT_ALIBI, "the ALiBi slopes (buffers.alibi_slopes)"},
    {AF_VARIANT_BIAS, "the bias (buffers.bias)"},
    {kCustom, "the custom mask (buffers.custom_mask)"},
    {AF_VARIANT_HEAD_DESCALE, "the per-head descales (buffers.q/k/v_descale_h)"}};

// The largest |scale q.k| (fp8: times the per-tensor descales) over the pairs the one visibility rule shows.
double max_visible_score(const Problem& p, const Tensors& t) {
  const bool fp8 = p.dtype == AF_DTYPE_FP8_E4M3 || p.dtype == AF_DTYPE_FP8_E5M2;
  const double f = double(p.scale) * (fp8 ? double(p.q_descale) * p.k_descale : 1.0);
  const VariantInputs in = t.variant_inputs();
  double most = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t j = 0; j < p.seq_k; ++j) {
          if (!key_visible(p, in, b, h, i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < p.head_dim; ++d)
            dot += double(t.q[static_cast<size_t>(q_index(p, b, i, h, d))]) *
                   t.k[static_cast<size_t>(k_index(p, b, j, kv_head(p, h), d))];
          if (std::isfinite(dot)) most = std::max(most, std::fabs(f * dot));
        }
  return most;
}

// Multiplies v by the factor that brings its largest finite |element| (times `reach`) to 8; false when it is
// 0 or already that large (nothing an amplification adds).
bool scale_to_eight(std::vector<float>& v, double reach, double& factor) {
  double most = 0;
  for (float x : v)
    if (std::isfinite(x)) most = std::max(most, std::fabs(double(x)) * reach);
  factor = most > 0 ? 8 / most : 0;
  if (!(factor > 1)) return false;
  for (float& x : v) x = static_cast<float>(x * factor);
  return true;
}

// Every other key a stored row of the custom mask shows hidden (its first shown key kept): dense or
// bit-packed.
bool hide_every_other_key(const Problem& p, std::vector<uint8_t>& m) {
  const bool bits = p.variants & AF_VARIANT_MASK_BITS;
  bool changed = false;
  for (int64_t b = 0; b < (p.mask_stride[0] ? p.batch : 1); ++b)
    for (int64_t h = 0; h < (p.mask_stride[1] ? p.heads_q : 1); ++h)
      for (int64_t i = 0; i < (p.mask_stride[2] ? p.seq_q : 1); ++i) {
        uint8_t* row = m.data() + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2];
        int64_t shown = 0;
        for (int64_t j = 0; j < p.seq_k; ++j) {
          const bool vis = bits ? (row[j >> 3] >> (j & 7)) & 1 : row[j] != 0;
          if (!vis || shown++ % 2 == 0) continue;
          changed = true;
          if (bits)
            row[j >> 3] = static_cast<uint8_t>(row[j >> 3] & ~(1u << (j & 7)));
          else
            row[j] = 0;
        }
      }
  return changed;
}

// Case c with parameter `a` amplified from its generated values t and exact result on; `how` says what
// changed.
std::optional<Case> amplified(const Case& c, const Tensors& t, const OracleResult& on, uint32_t bits,
                              std::string& how) {
  const Problem& p = c.problem;
  Case s = c;
  double f = 0;
  if (bits ==
      AF_VARIANT_SINK) {  // each head's sink at its largest row LSE: the sink takes a visible share of a row
    s.variants.sinks = t.sinks;
    bool any = false;
    for (int64_t h = 0; h < p.heads_q; ++h) {
      double most = -INFINITY;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t i = 0; i < p.seq_q; ++i)
          if (on.row(b, h, i).computed && std::isfinite(on.lse[on.lse_at(b, h, i)]))
            most = std::max(most, on.lse[on.lse_at(b, h, i)]);
      if (!std::isfinite(most)) continue;
      s.variants.sinks[static_cast<size_t>(h)] = static_cast<float>(most);
      any = true;
    }
    how = "every head's sink logit raised to its largest row LSE (head 0: " + num(t.sinks[0]) + " -> " +
          num(s.variants.sinks[0]) + ")";
    return any ? std::optional<Case>(s) : std::nullopt;
  }
  if (bits ==
      AF_VARIANT_SOFTCAP) {  // the cap at a quarter of the largest visible |score|: tanh saturates there
    if (p.variants & AF_VARIANT_HEAD_DESCALE) return std::nullopt;
    const double cap = max_visible_score(p, t) / 4;
    if (!(cap > 0) || !std::isfinite(cap) || !(cap < p.softcap)) return std::nullopt;
    s.problem.softcap = static_cast<float>(cap);
    how = "softcap " + num(p.softcap) + " -> " + num(s.problem.softcap) +
          " (a quarter of the largest visible |score|)";
    return s;
  }
  if (bits == AF_VARIANT_ALIBI) {  // slopes scaled until the largest term |slope| (Sq + Sk) is 8
    s.variants.alibi_slopes = t.alibi_slopes;
    if (!scale_to_eight(s.variants.alibi_slopes, double(p.seq_q + p.seq_k), f)) return std::nullopt;
    how = "the ALiBi slopes scaled by " + num(f);
    return s;
  }
  if (bits == AF_VARIANT_BIAS) {  // the bias scaled until its largest |element| is 8
    s.variants.bias = t.bias;
    if (!scale_to_eight(s.variants.bias, 1, f)) return std::nullopt;
    how = "the bias scaled by " + num(f);
    return s;
  }
  if (bits == kCustom) {  // more hidden keys
    s.variants.custom_mask = t.custom_mask;
    if (!hide_every_other_key(p, s.variants.custom_mask)) return std::nullopt;
    how = "every other key each custom-mask row shows hidden";
    return s;
  }
  if (bits ==
      AF_VARIANT_HEAD_DESCALE) {  // per-head descales away from the per-tensor ones: scores x2, O x0.5
    s.variants.q_descale_h.assign(t.q_descale_h.size(), 2 * p.q_descale);
    s.variants.k_descale_h.assign(t.k_descale_h.size(), p.k_descale);
    s.variants.v_descale_h.assign(t.v_descale_h.size(), 0.5f * p.v_descale);
    how = "every q descale twice the per-tensor one, every v descale half of it";
    return s;
  }
  return std::nullopt;
}

// The exact result of problem q on pc's inputs.
OracleResult exact_of(const Problem& q, const PreparedCase& pc, const RunOptions& o) {
  const Tensors& t = pc.tensors();
  return compute_oracle(q, t.q.data(), t.k.data(), t.v.data(), pc.variant_inputs(), o.oracle);
}

}  // namespace

void amplify_passing(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& given,
                     Judged& j) {
  const Case& c = pc.the_case();
  const uint32_t vars = c.problem.variants;
  if (j.result.verdict != Verdict::kPass || c.pass != Pass::kFwd || has_sequences(c.problem) ||
      (vars & AF_VARIANT_DROPOUT) || !dev.usable())
    return;
  const RunOptions opts = for_kernel(given, k.kernel, pc.problem());
  for (const Amplified& a : kAmplified) {
    const uint32_t bits = vars & a.bits;
    if (!bits || (k.kernel.variants & bits) != bits) continue;
    const OracleResult& on = pc.oracle(opts.oracle);
    // The pass shows the parameter applied where its effect is beyond the bound: nothing to amplify.
    if (!detect::outputs_apart(c.problem, on, exact_of(detect::variant_off(c.problem, bits), pc, opts))
             .empty())
      continue;
    std::string how;
    const std::optional<Case> s = amplified(c, pc.tensors(), on, a.bits, how);
    if (!s || !validate(*s).empty() || !case_unsupported_reason(k.kernel, s->problem, s->pass).empty())
      continue;
    PreparedCase sp(*s);
    const RunOptions so = for_kernel(given, k.kernel, sp.problem());
    const OracleResult& son = sp.oracle(so.oracle);
    const OracleResult soff = exact_of(detect::variant_off(sp.problem(), bits), sp, so);
    // Well beyond the bound: no output is within both exact results' bounds at this element.
    const std::string where = detect::outputs_apart(sp.problem(), son, soff, 4);
    if (where.empty()) continue;
    const LaunchOutcome out = launch_for_pass(dev, k, sp, sp.tensors(), so);
    if (out.launch.status != LaunchStatus::kOk) continue;
    const CheckResult r_on = detect::judge(sp.view(), son, out), r_off = detect::judge(sp.view(), soff, out);
    if (r_on.verdict != Verdict::kFail || r_off.verdict != Verdict::kPass) continue;
    CheckResult& r = j.result;
    r.verdict = Verdict::kFail;
    r.failure = FailureClass::kIgnoredParameter;
    r.decided_by = "amplify";
    r.reason = "passes, but ignores " + std::string(a.name) + " once it is amplified (--amplify)";
    r.evidence.push_back(
        {"amplify",
         fmt("the case passes with the effect of %s within the bound; its sibling with %s, where the "
             "exact results with and without it are far apart (%s), gives the exact result without it "
             "(max ratio %s against it, %s against the exact one): the kernel ignores %s",
             a.name, how.c_str(), where.c_str(), num(r_off.max_ratio).c_str(), num(r_on.max_ratio).c_str(),
             a.name)});
    return;
  }
}

}  // namespace attnfuzz
