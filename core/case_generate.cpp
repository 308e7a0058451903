// case_generate.cpp - generate(): the q, k, v (and dO) values of a case, specials and sequence layouts included.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <tuple>

#include "attnfuzz/case.h"
#include "core/case_internal.h"
#include "core/masks.h"
#include "core/sequences.h"
#include "oracle/lowp.h"

namespace attnfuzz {

using namespace case_detail;

// ------------------------------------------------------------------------------------------ generate

namespace {

float special_value(SpecialKind k, Rng& rng, int32_t dtype) {
  if (dtype != AF_DTYPE_F32 && (k == SpecialKind::kSubnormal || k == SpecialKind::kHuge)) {
    // The format's own subnormals and largest value (an fp32 subnormal would round to 0 in the format).
    const uint64_t r = rng.next();
    const double sign = (r >> 63) ? -1.0 : 1.0;
    if (k == SpecialKind::kHuge) return static_cast<float>(sign * dtype_max(dtype));
    const uint64_t mants = (uint64_t{1} << (dtype_precision(dtype) - 1)) - 1;  // 2^(p-1) - 1 subnormals
    return static_cast<float>(sign * std::ldexp(static_cast<double>(r % mants + 1), dtype_quantum_exp(dtype)));
  }
  switch (k) {
    case SpecialKind::kNaN:
      return std::bit_cast<float>(0x7fc00000u);
    case SpecialKind::kPosInf:
      return std::numeric_limits<float>::infinity();
    case SpecialKind::kNegInf:
      return -std::numeric_limits<float>::infinity();
    case SpecialKind::kSubnormal: {
      const uint64_t r = rng.next();
      const uint32_t mant = static_cast<uint32_t>(r % 0x7fffffu) + 1;  // 1 .. 2^23 - 1
      const uint32_t sign = (r >> 63) ? 0x80000000u : 0u;
      return std::bit_cast<float>(sign | mant);
    }
    case SpecialKind::kHuge:
      return (rng.next() >> 63) ? -FLT_MAX : FLT_MAX;
    case SpecialKind::kNegZero:
      return -0.0f;
  }
  return 0.0f;
}

// Fills the addressed elements of one tensor in logical (b, s, h, d) order.
template <class Draw>
void fill(std::vector<float>& out, const Problem& p, Tensor t, Draw draw) {
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < tensor_seq(p, t); ++s)
      for (int64_t h = 0; h < tensor_heads(p, t); ++h)
        for (int64_t d = 0; d < tensor_dim(p, t); ++d) out[tensor_index(p, t, b, h, s, d)] = draw();
}

}  // namespace

namespace {
// dO of a backward case: uniform in [-1, 1] from its own stream (seed, 5), in logical (b, s, h, d) order,
// stride gaps kStrideGapBits. Forward cases have none (q, k, v never depend on it).
std::vector<float> generate_dout(const Case& c) {
  const Problem& p = c.problem;
  std::vector<float> out(static_cast<size_t>(o_elements(p)), std::bit_cast<float>(kStrideGapBits));
  Rng rng(c.seed, 5);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          out[static_cast<size_t>(o_index(p, b, s, h, d))] = static_cast<float>(2.0 * rng.uniform01() - 1.0);
  return out;
}
Tensors generate_qkv(const Case& c);

// The activations domain's outlier channels (case.h generate): per tensor and head, 1 + D / 64 channels (D >=
// 4) scaled by a factor in [10, 50] from stream (seed, 12), the same channels at every batch and position (as
// an LLM's q, k, v have them); then every base value clamped to +-kActivationBound.
void activation_outliers(const Case& c, Tensors& out) {
  const Problem& p = c.problem;
  Rng rng(c.seed, 12);
  for (Tensor t : {Tensor::kQ, Tensor::kK, Tensor::kV}) {
    std::vector<float>& buf = t == Tensor::kQ ? out.q : t == Tensor::kK ? out.k : out.v;
    const int64_t dim = tensor_dim(p, t);
    std::vector<double> factor(static_cast<size_t>(dim));
    for (int64_t h = 0; h < tensor_heads(p, t); ++h) {
      std::fill(factor.begin(), factor.end(), 1.0);
      for (int64_t n = 0; dim >= 4 && n < 1 + dim / 64; ++n)
        factor[rng.below(static_cast<uint64_t>(dim))] = 10 + 40 * rng.uniform01();
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t s = 0; s < tensor_seq(p, t); ++s)
          for (int64_t d = 0; d < dim; ++d) {
            float& x = buf[static_cast<size_t>(tensor_index(p, t, b, h, s, d))];
            x = static_cast<float>(
                std::clamp(x * factor[static_cast<size_t>(d)], -kActivationBound, kActivationBound));
          }
    }
  }
}
}  // namespace

// The variant buffers (case.h VariantSpec): given lists as they are, else sinks from stream (seed, 6) and the bias
// from stream (seed, 7), uniform; the default ALiBi slopes. fp32 values (the buffers are fp32 in every dtype).
void generate_variants(const Case& c, Tensors& out) {
  const Problem& p = c.problem;
  const VariantSpec& vs = c.variants;
  if (p.variants & AF_VARIANT_SINK) {
    if (!vs.sinks.empty()) {
      out.sinks = vs.sinks;
    } else {
      Rng rng(c.seed, 6);
      out.sinks.resize(static_cast<size_t>(p.heads_q));
      for (float& x : out.sinks) x = static_cast<float>(vs.sink_range * (2 * rng.uniform01() - 1));
    }
  }
  if (p.variants & AF_VARIANT_ALIBI)
    out.alibi_slopes = vs.alibi_slopes.empty() ? alibi_default_slopes(p.heads_q) : vs.alibi_slopes;
  if (p.variants & AF_VARIANT_BIAS) {
    if (!vs.bias.empty()) {
      out.bias = vs.bias;
    } else {
      Rng rng(c.seed, 7);
      out.bias.assign(static_cast<size_t>(bias_elements(p)), 0.0f);
      for (float& x : out.bias) x = static_cast<float>(vs.bias_range * (2 * rng.uniform01() - 1));
    }
  }
  if (p.variants & AF_VARIANT_HEAD_DESCALE) {
    // Per-head fp8 descales: given, else each drawn from space::fp8_descales() (exact in fp32) from stream
    // (seed, 12).
    Rng rng(c.seed, 12);
    const std::vector<float>& menu = space::fp8_descales();
    for (auto [given, dst, query] : {std::tuple{&vs.q_descale_h, &out.q_descale_h, true},
                                     std::tuple{&vs.k_descale_h, &out.k_descale_h, false},
                                     std::tuple{&vs.v_descale_h, &out.v_descale_h, false}}) {
      if (!given->empty()) {
        *dst = *given;
        continue;
      }
      dst->resize(static_cast<size_t>(descale_h_elements(p, query)));
      for (float& x : *dst)
        x = menu[static_cast<size_t>(rng.uniform01() * static_cast<double>(menu.size())) % menu.size()];
    }
  }
}

Tensors generate(const Case& c) {
  Tensors out = generate_qkv(c);
  // kv-shared (docs/semantics.md "Shared K/V latent"): V is the first Dv columns of K's rows; with v_stride =
  // k_stride its elements sit at K's offsets, so V is K's buffer cut to v_elements (the kernel receives K's).
  if (kv_shared(c.problem))
    out.v.assign(out.k.begin(), out.k.begin() + std::min<int64_t>(v_elements(c.problem), out.k.size()));
  generate_variants(c, out);
  generate_masks(c, out);
  if (has_backward(c.pass)) {
    out.dout = c.explicit_values && !c.explicit_values->dout.empty() ? c.explicit_values->dout : generate_dout(c);
    if (c.problem.dtype != AF_DTYPE_F32)  // dO is stored in the dtype too (NaN, so the stride gaps, pass)
      for (float& x : out.dout) x = to_stored(x, c.problem.dtype, finite_domain(c.values.domain));
  }
  return out;
}

namespace {
Tensors generate_qkv(const Case& c) {
  if (std::string e = validate(c); !e.empty()) throw std::invalid_argument(e);
  Tensors out;
  // Low precision: every value becomes the value the dtype stores (case.h; identity for f32; NaN, and so the
  // gap poison of sequence layouts, passes through).
  auto store = [&](Tensors& t) {
    if (c.problem.dtype == AF_DTYPE_F32) return;
    const bool sat = finite_domain(c.values.domain);
    for (auto* buf : {&t.q, &t.k, &t.v})
      for (float& x : *buf) x = to_stored(x, c.problem.dtype, sat);
  };
  if (has_sequences(c.problem)) {
    out = detail::generate_sequences(c);
    store(out);
    return out;
  }
  if (c.explicit_values) {
    out.q = c.explicit_values->q;
    out.k = c.explicit_values->k;
    out.v = c.explicit_values->v;
    store(out);
    return out;
  }
  const Problem& p = c.problem;
  const float gap = std::bit_cast<float>(kStrideGapBits);
  out.q.assign(q_elements(p), gap);
  out.k.assign(k_elements(p), gap);
  out.v.assign(v_elements(p), gap);

  const ValueDist& dist = c.values.dist;
  double qk_half = dist.param, v_half = dist.param;
  if (dist.kind == Distribution::kExtreme) {
    const double denom = std::fabs(static_cast<double>(p.scale)) * std::sqrt(static_cast<double>(p.head_dim));
    qk_half = denom > 0 ? std::sqrt(3.0 * dist.param / denom) : 1.0;
    v_half = 1.0;
  } else if (dist.kind == Distribution::kWideV) {
    qk_half = 1.0;
  }
  const bool finite = finite_domain(c.values.domain);
  auto in_domain = [finite](double x) {
    return finite ? static_cast<float>(
                        std::clamp(x, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX)))
                  : static_cast<float>(x);
  };
  auto filler = [&](Tensor t, double half) {
    Rng rng(c.seed, 1 + static_cast<uint64_t>(t));
    std::vector<float>& buf = t == Tensor::kQ ? out.q : t == Tensor::kK ? out.k : out.v;
    if (dist.kind == Distribution::kNormal) {
      fill(buf, p, t, [&] { return in_domain(dist.param * rng.normal()); });
    } else if (dist.kind == Distribution::kVBias && t == Tensor::kV) {
      fill(buf, p, t, [&] { return in_domain(half * rng.uniform01()); });
    } else if (dist.kind == Distribution::kWideV && t == Tensor::kV) {
      fill(buf, p, t, [&] { return in_domain(half * (0.5 + 0.5 * rng.uniform01())); });
    } else {
      fill(buf, p, t, [&] { return in_domain(half * (2.0 * rng.uniform01() - 1.0)); });
    }
  };
  filler(Tensor::kQ, qk_half);
  filler(Tensor::kK, qk_half);
  filler(Tensor::kV, v_half);
  if (c.values.domain == ValueDomain::kActivations) activation_outliers(c, out);

  if (c.values.specials.empty()) {
    store(out);
    return out;
  }
  Rng rng(c.seed, 4);
  // Candidate sequence positions per (tensor, placement), computed lazily.
  std::vector<int64_t> key_count;
  auto candidates = [&](Tensor t, Placement pl) {
    std::vector<int64_t> pos;
    if (t == Tensor::kQ) {
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const bool masked_row = visible_keys(p, i).empty();
        if (pl == Placement::kRandom || (pl == Placement::kVisible && !masked_row) ||
            ((pl == Placement::kMasked || pl == Placement::kHidden) && masked_row))
          pos.push_back(i);
      }
      return pos;
    }
    if (key_count.empty() && p.seq_k > 0) key_count = key_visibility_counts(p);
    for (int64_t j = 0; j < p.seq_k; ++j) {
      const int64_t n = key_count[j];
      if (pl == Placement::kRandom || (pl == Placement::kVisible && n > 0) ||
          (pl == Placement::kMasked && n < p.seq_q) || (pl == Placement::kHidden && n == 0))
        pos.push_back(j);
    }
    return pos;
  };
  for (const SpecialValue& sv : c.values.specials) {
    // kv-shared: a special value of V is written into K's row (V is a view of it).
    std::vector<float>& buf = sv.tensor == Tensor::kQ                     ? out.q
                              : (sv.tensor == Tensor::kK || kv_shared(p)) ? out.k
                                                                          : out.v;
    std::vector<int64_t> pos;
    if (sv.placement != Placement::kAt) pos = candidates(sv.tensor, sv.placement);
    for (int64_t n = 0; n < sv.count; ++n) {
      PlacedSpecial ps{sv.kind, sv.tensor, sv.b, sv.h, sv.s, sv.d, 0};
      if (sv.placement != Placement::kAt) {
        if (pos.empty()) {
          out.unplaced += sv.count - n;
          break;
        }
        ps.s = pos[rng.below(pos.size())];
        ps.b = static_cast<int64_t>(rng.below(p.batch));
        ps.h = static_cast<int64_t>(rng.below(tensor_heads(p, sv.tensor)));
        ps.d = static_cast<int64_t>(rng.below(tensor_dim(p, sv.tensor)));
      }
      ps.index = tensor_index(p, sv.tensor, ps.b, ps.h, ps.s, ps.d);
      buf[ps.index] = special_value(sv.kind, rng, p.dtype);
      out.placed.push_back(ps);
    }
  }
  store(out);
  return out;
}
}  // namespace

}  // namespace attnfuzz
