// input_tier.cpp - how unusual a case's inputs are (issue 30 item 2): ordinary, extreme, non-finite-visible,
// non-finite-masked, so that a summary can lead with the failures of ordinary inputs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attnfuzz/case.h"
#include "core/masks.h"

namespace attnfuzz {

namespace {

bool nonfinite_kind(SpecialKind k) {
  return k == SpecialKind::kNaN || k == SpecialKind::kPosInf || k == SpecialKind::kNegInf;
}

// Magnitudes a model's activations do not have: logits of RMS > 100 (extreme:MAG), uniform / normal / vbias / widev
// parameters past 100 or below 1e-4, a scale <= 0, non-finite, or 1000x off fp32(1/sqrt(D)).
bool extreme_spec(const Case& c) {
  const ValueDist& d = c.values.dist;
  if (!c.explicit_values && (d.kind == Distribution::kExtreme || d.param > 100 || d.param < 1e-4)) return true;
  const double s = c.problem.scale, def = default_scale(c.problem.head_dim);
  if (!(s > 0) || !std::isfinite(s) || s > 1e3 * def || s < 1e-3 * def) return true;
  if (!c.explicit_values)
    for (const SpecialValue& sv : c.values.specials)
      if (sv.count > 0 && (sv.kind == SpecialKind::kHuge || sv.kind == SpecialKind::kSubnormal)) return true;
  return false;
}

// Which positions of a dense problem some query row must not see, through the one visibility rule
// (key_visible: mask_kind and the custom / block masks): q of row (b, h, s) when that row sees no key; a K /
// V row (b, hkv, j) when some row of a query head of kv head hkv does not see key j. Answers are cached per
// (b, head, position).
class Hiding {
 public:
  explicit Hiding(const Case& c) : p_(c.problem) {
    generate_masks(c, masks_);
    in_ = masks_.variant_inputs();
  }
  const VariantInputs& inputs() const { return in_; }
  bool hidden(Tensor t, int64_t b, int64_t h, int64_t s) {
    const bool q = t == Tensor::kQ;
    std::vector<int8_t>& memo = q ? q_memo_ : k_memo_;
    const int64_t heads = q ? p_.heads_q : p_.heads_kv, len = q ? p_.seq_q : p_.seq_k;
    if (memo.empty()) memo.assign(static_cast<size_t>(p_.batch * heads * len), -1);
    int8_t& m = memo[static_cast<size_t>((b * heads + h) * len + s)];
    if (m < 0) m = q ? seen_keys(p_, in_, b, h, s).empty() : key_hidden(b, h, s);
    return m;
  }

 private:
  bool key_hidden(int64_t b, int64_t hkv, int64_t j) const {
    for (int64_t h = 0; h < p_.heads_q; ++h) {
      if (kv_head(p_, h) != hkv) continue;
      for (int64_t i = 0; i < p_.seq_q; ++i)
        if (!key_visible(p_, in_, b, h, i, j)) return true;
    }
    return false;
  }
  const Problem& p_;
  Tensors masks_;  // the custom / block mask buffers alone
  VariantInputs in_;
  std::vector<int8_t> q_memo_, k_memo_;  // -1 not asked yet, else hidden
};

// Models' attention logits stay within this (softcaps of 30 and 50 bound them where they would not): a visible
// logit |scale * q.k| beyond it is extreme, the explicit counterpart of extreme:MAG.
constexpr double kOrdinaryLogit = 50;

// The largest |scale * q_i . k_j| over the (i, j) a row sees, of a dense problem's explicit values (finite ones).
double max_visible_logit(const Problem& p, const VariantInputs& in, const ExplicitValues& e) {
  double most = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t j : seen_keys(p, in, b, h, i)) {
          double dot = 0;
          for (int64_t d = 0; d < p.head_dim; ++d)
            dot += static_cast<double>(e.q[static_cast<size_t>(q_index(p, b, i, h, d))]) *
                   e.k[static_cast<size_t>(k_index(p, b, j, kv_head(p, h), d))];
          if (std::isfinite(dot)) most = std::max(most, std::fabs(p.scale * dot));
        }
  return most;
}

}  // namespace

const char* input_tier_name(InputTier t) {
  switch (t) {
    case InputTier::kOrdinary: return "ordinary";
    case InputTier::kExtreme: return "extreme";
    case InputTier::kNonFiniteVisible: return "non-finite-visible";
    case InputTier::kNonFiniteMasked: return "non-finite-masked";
  }
  return "?";
}

std::string input_tier_counts(const int64_t (&n)[4]) {
  std::string out;
  for (InputTier t : kInputTiers)
    out += (out.empty() ? "" : ", ") + std::string(input_tier_name(t)) + " " +
           std::to_string(n[static_cast<int>(t)]);
  return out;
}

InputTier input_tier(const Case& c) {
  // The activations domain is the magnitudes a model produces by definition (validate holds its cases to it).
  if (c.values.domain == ValueDomain::kActivations) return InputTier::kOrdinary;
  const Problem& p = c.problem;
  const bool dense = !has_sequences(p);
  Hiding hiding(c);             // dense problems only (a sequence layout has no custom mask)
  int visible = 0, hidden = 0;  // non-finite values seen by every row that may see them / hidden from some row
  bool huge_explicit = false;
  if (c.explicit_values && dense) {
    const ExplicitValues& e = *c.explicit_values;
    auto scan = [&](const std::vector<float>& x, Tensor t, const int64_t* st, int64_t seq, int64_t heads, int64_t dim) {
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t s = 0; s < seq; ++s)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < dim; ++d) {
              const float v = x[static_cast<size_t>(b * st[0] + s * st[1] + h * st[2] + d)];
              if (!std::isfinite(v))
                ++(hiding.hidden(t, b, h, s) ? hidden : visible);
              else if (std::fabs(v) > 1e4f || (v != 0 && std::fabs(v) < 1e-30f))
                huge_explicit = true;
            }
    };
    scan(e.q, Tensor::kQ, p.q_stride, p.seq_q, p.heads_q, p.head_dim);
    scan(e.k, Tensor::kK, p.k_stride, p.seq_k, p.heads_kv, p.head_dim);
    scan(e.v, Tensor::kV, p.v_stride, p.seq_k, p.heads_kv, p.head_dim_v);
    huge_explicit = huge_explicit || max_visible_logit(p, hiding.inputs(), e) > kOrdinaryLogit;
  } else if (!c.explicit_values) {
    bool any = false;
    for (const SpecialValue& sv : c.values.specials) any |= sv.count > 0 && nonfinite_kind(sv.kind);
    if (any && dense) {
      for (const PlacedSpecial& ps : generate(c).placed)
        if (nonfinite_kind(ps.kind)) ++(hiding.hidden(ps.tensor, ps.b, ps.h, ps.s) ? hidden : visible);
    } else if (any) {  // a sequence layout: the placement asked for says where
      for (const SpecialValue& sv : c.values.specials)
        if (sv.count > 0 && nonfinite_kind(sv.kind))
          ++(sv.placement == Placement::kMasked || sv.placement == Placement::kHidden ? hidden : visible);
    }
  }
  if (visible) return InputTier::kNonFiniteVisible;
  if (hidden) return InputTier::kNonFiniteMasked;
  return extreme_spec(c) || huge_explicit ? InputTier::kExtreme : InputTier::kOrdinary;
}

}  // namespace attnfuzz
