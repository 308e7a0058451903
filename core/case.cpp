// case.cpp - test cases: the RNG and hashing, make_case, validate, describe (text forms: case_text.cpp;
// values: case_generate.cpp; the case space and sweep grid: case_space.cpp).
#include "attnfuzz/case.h"

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

#include "core/case_internal.h"
#include "core/masks.h"
#include "core/sequences.h"
#include "oracle/lowp.h"

namespace attnfuzz {

using namespace case_detail;

// ----------------------------------------------------------------------------------------------- RNG

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);
  x = splitmix64(x) ^ stream;  // decorrelate seed/stream pairs that xor to the same value
  for (uint64_t& w : s_) w = splitmix64(x);
}

uint64_t Rng::next() {
  const uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = std::rotl(s_[3], 45);
  return result;
}

double Rng::uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t Rng::below(uint64_t n) {
  if (n <= 1) return 0;
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
  uint64_t x;
  do x = next();
  while (x >= limit);
  return x % n;
}

double Rng::normal() {
  const double u1 = 1.0 - uniform01();  // (0, 1]
  const double u2 = uniform01();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t hash64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return splitmix64(h);
}

uint64_t grid_seed(uint64_t base_seed, const std::string& label) {
  uint64_t x = base_seed ^ hash64(label);
  return splitmix64(x);
}

// ------------------------------------------------------------------------------------------- cases

Case make_case(const Problem& p, uint64_t seed) {
  Case c;
  c.problem = p;
  c.seed = seed;
  return c;
}

namespace {
constexpr int64_t kMaxSpecialCount = int64_t{1} << 24;

// What domain d allows, for the messages of validate.
const char* domain_rule(ValueDomain d) {
  return d == ValueDomain::kActivations ? "finite, |x| <= 64, no special value but -0" : "no NaN or Inf";
}

bool activation_scale(const Problem& p) {
  const double def = default_scale(p.head_dim), s = p.scale;
  return s >= def / kActivationScaleRange && s <= def * kActivationScaleRange;  // false for NaN
}

bool activation_param(double a) { return a >= kActivationParamMin && a <= kActivationParamMax; }

// The activations domain's distribution and scale (its special and explicit values: in validate's loops).
std::string validate_activations(const Case& c) {
  if (c.values.domain != ValueDomain::kActivations) return {};
  if (c.values.dist.kind == Distribution::kExtreme)
    return "extreme:MAG values are not in the activations value domain (uniform, normal, vbias or widev)";
  if (!c.explicit_values && !activation_param(c.values.dist.param))
    return "value distribution parameter " + shortest(c.values.dist.param) +
           " is outside the activations value domain's [0.001, 4]";
  if (!activation_scale(c.problem))
    return "scale " + shortest(c.problem.scale) +
           " is outside the activations value domain (within 8x of 1/sqrt(D) = " +
           shortest(default_scale(c.problem.head_dim)) + ")";
  return {};
}
}  // namespace

void fit_value_domain(Case& c) {
  if (c.values.domain != ValueDomain::kActivations) return;
  ValueDist& dist = c.values.dist;
  if (dist.kind == Distribution::kExtreme) dist = ValueDist{};
  if (!activation_param(dist.param))
    dist.param =
        std::isnan(dist.param) ? 1.0 : std::clamp(dist.param, kActivationParamMin, kActivationParamMax);
  if (!activation_scale(c.problem)) c.problem.scale = default_scale(c.problem.head_dim);
  std::erase_if(c.values.specials,
                [&](const SpecialValue& s) { return !special_in_domain(s.kind, c.values.domain); });
  if (c.explicit_values)
    for (auto* buf : {&c.explicit_values->q, &c.explicit_values->k, &c.explicit_values->v})
      for (float& x : *buf)  // the stride gaps' poison stays
        if (std::bit_cast<uint32_t>(x) != kStrideGapBits) x = to_domain(x, c.values.domain);
}

namespace {
// kv-shared with an explicit V: empty unless some addressed element of V differs from K's element at the same
// offset (v_stride = k_stride; NaNs compare by bits).
std::string explicit_v_is_k_view(const Case& c) {
  const Problem& p = c.problem;
  const ExplicitValues& e = *c.explicit_values;
  if (has_sequences(p)) return {};  // on a sequence layout V is derived from K by generate()
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq_k; ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h)
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t i = static_cast<size_t>(v_index(p, b, s, h, d));
          if (i >= e.k.size() || std::bit_cast<uint32_t>(e.v[i]) != std::bit_cast<uint32_t>(e.k[i]))
            return "explicit v differs from k at (b=" + std::to_string(b) + ", s=" + std::to_string(s) +
                   ", h=" + std::to_string(h) + ", d=" + std::to_string(d) +
                   "): with kv-shared V is the first Dv columns of K (give no v, or K's)";
        }
  return {};
}
}  // namespace

std::string validate(const Case& c) {
  if (std::string e = validate(c.problem); !e.empty()) return e;
  if (std::string e = validate_sequences(c); !e.empty()) return e;
  if (std::string e = validate_malformed(c); !e.empty()) return e;
  // The gradient oracle and the backward launch are defined for dense f32, f16 and bf16 problems (fp8 and
  // sequence layouts are not checked yet).
  if (has_backward(c.pass) && c.problem.dtype != AF_DTYPE_F32 && c.problem.dtype != AF_DTYPE_F16 &&
      c.problem.dtype != AF_DTYPE_BF16)
    return std::string("the backward pass is checked in f32, f16 and bf16 only, not ") +
           dtype_name(c.problem.dtype) + " (yet)";
  if (has_backward(c.pass) && has_sequences(c.problem))
    return "the backward pass is checked on dense batches only, not on sequence layouts (yet)";
  if (has_backward(c.pass) && kv_shared(c.problem))
    return "kv-shared is checked in the forward pass only (yet): no built-in kernel writes the shared latent's "
           "gradient dK[:, :, :Dv] += dV (docs/semantics.md \"Shared K/V latent\")";
  if (std::string e = validate_variants(c); !e.empty()) return e;
  if (std::string e = validate_merge(c); !e.empty()) return e;
  const double a = c.values.dist.param;
  if (!(a > 0) || !std::isfinite(a))
    return "value distribution parameter " + shortest(a) + " is invalid: need a finite value > 0";
  if (std::string e = validate_activations(c); !e.empty()) return e;
  for (const SpecialValue& s : c.values.specials) {
    if (!special_in_domain(s.kind, c.values.domain))
      return "special value '" + to_string(s) + "' is not in the " + value_domain_name(c.values.domain) +
             " value domain (" + domain_rule(c.values.domain) + ")";
    if (s.count < 0 || s.count > kMaxSpecialCount)
      return "special value '" + to_string(s) + "' has an invalid count (need 0 .. 2^24)";
    if (s.placement == Placement::kAt) {
      const Problem& p = c.problem;
      if (s.b < 0 || s.b >= p.batch || s.h < 0 || s.h >= tensor_heads(p, s.tensor) || s.s < 0 ||
          s.s >= tensor_seq(p, s.tensor) || s.d < 0 || s.d >= tensor_dim(p, s.tensor))
        return "special value '" + to_string(s) + "' is outside the " + tensor_name(s.tensor) + " tensor";
    }
  }
  if (c.explicit_values) {
    const ExplicitValues& e = *c.explicit_values;
    auto check = [](const char* name, size_t have, int64_t need) -> std::string {
      if (static_cast<int64_t>(have) == need) return {};
      return std::string("explicit ") + name + " holds " + std::to_string(have) +
             " values, the problem needs " + std::to_string(need);
    };
    if (auto m = check("q", e.q.size(), q_elements(c.problem)); !m.empty()) return m;
    if (auto m = check("k", e.k.size(), k_elements(c.problem)); !m.empty()) return m;
    if (kv_shared(c.problem)) {  // V is K's first Dv columns: an explicit V is absent or repeats them
      if (!e.v.empty()) {
        if (auto m = check("v", e.v.size(), v_elements(c.problem)); !m.empty()) return m;
        if (std::string m = explicit_v_is_k_view(c); !m.empty()) return m;
      }
    } else if (auto m = check("v", e.v.size(), v_elements(c.problem)); !m.empty()) {
      return m;
    }
    if (!e.dout.empty() && !has_backward(c.pass)) return "explicit dO is given for a forward case";
    if (!e.dout.empty())
      if (auto m = check("dO", e.dout.size(), o_elements(c.problem)); !m.empty()) return m;
    if (finite_domain(c.values.domain) && !has_sequences(c.problem)) {  // sequences: on the view
      const Problem& p = c.problem;
      for (Tensor t : {Tensor::kQ, Tensor::kK, Tensor::kV}) {
        const std::vector<float>& buf = t == Tensor::kQ                                      ? e.q
                                        : (t == Tensor::kK || (kv_shared(p) && e.v.empty())) ? e.k
                                                                                             : e.v;
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t s = 0; s < tensor_seq(p, t); ++s)
            for (int64_t h = 0; h < tensor_heads(p, t); ++h)
              for (int64_t d = 0; d < tensor_dim(p, t); ++d)
                if (const float x = buf[static_cast<size_t>(tensor_index(p, t, b, h, s, d))];
                    !value_in_domain(x, c.values.domain))
                  return std::string("explicit ") + tensor_name(t) + " holds " + shortest(x) +
                         " at (b=" + std::to_string(b) + ", s=" + std::to_string(s) +
                         ", h=" + std::to_string(h) + ", d=" + std::to_string(d) + "): not in the " +
                         value_domain_name(c.values.domain) + " value domain (" +
                         domain_rule(c.values.domain) + ")";
      }
    }
  }
  return {};
}

std::string describe(const Case& c) {
  char seed[32];
  std::snprintf(seed, sizeof seed, "0x%016llx", static_cast<unsigned long long>(c.seed));
  std::string t = describe(c.problem) + " values=" + to_string(c.values.dist);
  for (const SpecialValue& s : c.values.specials) t += " special=" + to_string(s);
  t += std::string(" seed=") + seed;
  if (c.explicit_values) t += " explicit";
  t += describe_sequences(c);
  if (c.values.domain != ValueDomain::kIeee)
    t += std::string(" domain=") + value_domain_name(c.values.domain);
  if (c.pass != Pass::kFwd) t += std::string(" pass=") + pass_name(c.pass);
  t += describe_variants(c);
  t += describe_merge(c);
  return t;
}

std::string validate_variants(const Case& c) {
  const Problem& p = c.problem;
  const VariantSpec& vs = c.variants;
  if (p.variants & ~kCheckedVariants)
    return "variant " + variant_names(p.variants & ~kCheckedVariants) +
           " is not checked yet (the checked ones: sink, softcap, alibi, bias, dropout, mask-dense, "
           "mask-bits, block-sparse, head-descale, kv-shared)";
  const uint32_t dense_only = p.variants & ~(kLayoutVariants | AF_VARIANT_KV_SHARED);
  if (dense_only && has_sequences(p))
    return "variant " + variant_names(dense_only) +
           " is checked on dense batches only, not on sequence layouts (yet): sink, softcap, alibi and kv-shared "
           "combine with every layout";
  if (std::string e = validate_mask_values(c); !e.empty()) return e;
  auto count = [](const char* what, size_t have, int64_t need) -> std::string {
    if (static_cast<int64_t>(have) == need) return {};
    return std::string(what) + " holds " + std::to_string(have) + " values, the problem needs " + std::to_string(need);
  };
  if (!(p.variants & AF_VARIANT_SINK) && !vs.sinks.empty()) return "sink values are given but the problem has no sinks";
  if (!(p.variants & AF_VARIANT_ALIBI) && !vs.alibi_slopes.empty())
    return "ALiBi slopes are given but the problem has no ALiBi";
  if (!(p.variants & AF_VARIANT_BIAS) && !vs.bias.empty()) return "bias values are given but the problem has no bias";
  if (!(vs.sink_range > 0) || !std::isfinite(vs.sink_range)) return "the sink range must be a finite value > 0";
  if (!(vs.bias_range > 0) || !std::isfinite(vs.bias_range)) return "the bias range must be a finite value > 0";
  if (!vs.sinks.empty()) {
    if (auto m = count("sinks", vs.sinks.size(), p.heads_q); !m.empty()) return m;
    for (float x : vs.sinks)  // -inf = no sink for that head; NaN and +inf are not logits
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
        return "a sink logit is NaN or +inf: need a finite value or -inf (no sink)";
  }
  if (!vs.alibi_slopes.empty()) {
    if (auto m = count("ALiBi slopes", vs.alibi_slopes.size(), p.heads_q); !m.empty()) return m;
    for (float x : vs.alibi_slopes)
      if (!std::isfinite(x)) return "an ALiBi slope is not finite";
  }
  const bool hd = p.variants & AF_VARIANT_HEAD_DESCALE;
  for (const auto& [name, given, query] :
       {std::tuple{"q_descale_h", &vs.q_descale_h, true}, std::tuple{"k_descale_h", &vs.k_descale_h, false},
        std::tuple{"v_descale_h", &vs.v_descale_h, false}}) {
    if (given->empty()) continue;
    if (!hd)
      return std::string(name) + " values are given but the problem has no per-head descales (head-descale)";
    if (auto m = count(name, given->size(), descale_h_elements(p, query)); !m.empty()) return m;
    for (float x : *given)
      if (std::string e = validate_descale_value(x); !e.empty())
        return std::string("a per-head descale (") + name + ") = " + shortest(x) + " is invalid: " + e;
  }
  if (!vs.bias.empty()) {
    if (auto m = count("bias", vs.bias.size(), bias_elements(p)); !m.empty()) return m;
    if (finite_domain(c.values.domain))
      for (float x : vs.bias)
        if (!std::isfinite(x)) return "the bias holds a NaN or Inf: not in the finite value domain";
  }
  return {};
}

std::string set_variants(Case& c, uint32_t bits, float softcap, const std::string& bias_broadcast) {
  if (bits & ~kCheckedVariants) return "variant " + variant_names(bits & ~kCheckedVariants) + " is not checked yet";
  // The score variants and the masks; dropout (issue 29) is set with set_dropout and kept here as it is.
  // kv-shared is geometry (V a view of K, v_stride = k_stride): kept as it is like dropout, set when asked
  // for.
  c.problem.variants = (c.problem.variants & (AF_VARIANT_DROPOUT | AF_VARIANT_KV_SHARED)) |
                       (bits & (kScoreVariants | AF_VARIANT_HEAD_DESCALE));
  if (bits & AF_VARIANT_KV_SHARED) share_kv(c.problem);  // Dv <= D is validate()'s
  c.problem.descale_stride[0] = c.problem.descale_stride[1] = 0;
  if (bits & AF_VARIANT_HEAD_DESCALE) set_descale_strides(c.problem, false);
  if (bits & kMaskVariants)
    if (std::string e = set_mask_variants(c, bits & kMaskVariants); !e.empty()) return e;
  c.problem.softcap = (bits & AF_VARIANT_SOFTCAP) ? softcap : 0.0f;
  for (int64_t& st : c.problem.bias_stride) st = 0;
  if (bits & AF_VARIANT_BIAS)
    if (std::string e = set_bias_strides(c.problem, bias_broadcast); !e.empty()) return e;
  return {};
}

std::string drop_variants(Case& c, uint32_t bits) {
  if (bits & ~kDroppableVariants)
    return "variant " + variant_names(bits & ~kDroppableVariants) + " cannot be dropped from a case";
  Problem& p = c.problem;
  VariantSpec& vs = c.variants;
  bits &= p.variants;
  p.variants &= ~bits;
  if (bits & AF_VARIANT_SINK) vs.sinks.clear();
  if (bits & AF_VARIANT_SOFTCAP) p.softcap = 0;
  if (bits & AF_VARIANT_ALIBI) vs.alibi_slopes.clear();
  if (bits & AF_VARIANT_BIAS) {
    for (int64_t& st : p.bias_stride) st = 0;
    vs.bias.clear();
  }
  if (bits & AF_VARIANT_HEAD_DESCALE) {
    p.descale_stride[0] = p.descale_stride[1] = 0;
    vs.q_descale_h.clear(), vs.k_descale_h.clear(), vs.v_descale_h.clear();
  }
  if (bits & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) {
    for (int64_t& st : p.mask_stride) st = 0;
    vs.custom_mask.clear();
  }
  if (bits & AF_VARIANT_BLOCK_SPARSE) {
    for (int64_t& st : p.block_mask_stride) st = 0;
    p.block_q = p.block_k = 0;
    vs.block_mask.clear();
  }
  return validate(c);
}

std::string describe_variants(const Case& c) {
  const Problem& p = c.problem;
  const VariantSpec& vs = c.variants;
  std::string t;
  if (p.variants & AF_VARIANT_SINK) t += vs.sinks.empty() ? " sinks=uniform:" + shortest(vs.sink_range) : " sinks=given";
  if (p.variants & AF_VARIANT_ALIBI) t += vs.alibi_slopes.empty() ? " slopes=default" : " slopes=given";
  if (p.variants & AF_VARIANT_BIAS) t += vs.bias.empty() ? " bias=uniform:" + shortest(vs.bias_range) : " bias=given";
  if (p.variants & AF_VARIANT_HEAD_DESCALE)
    t += vs.q_descale_h.empty() && vs.k_descale_h.empty() && vs.v_descale_h.empty() ? " descale_h=drawn"
                                                                                    : " descale_h=given";
  return t + describe_masks(c);
}

std::vector<int64_t> key_visibility_counts(const Problem& p) {
  std::vector<int64_t> diff(static_cast<size_t>(p.seq_k) + 1, 0);
  for (int64_t i = 0; i < p.seq_q; ++i) {
    const KeyRange r = visible_keys(p, i);
    if (r.empty()) continue;
    ++diff[r.first];
    --diff[r.last];
  }
  std::vector<int64_t> count(static_cast<size_t>(p.seq_k));
  int64_t run = 0;
  for (int64_t j = 0; j < p.seq_k; ++j) count[j] = run += diff[j];
  return count;
}

}  // namespace attnfuzz
