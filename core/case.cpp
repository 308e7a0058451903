// case.cpp - test cases: RNG, value specifications and their text forms, generation, sweep grid.
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

#include "core/sequences.h"
#include "oracle/lowp.h"

namespace attnfuzz {

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

// ------------------------------------------------------------------------------------------ names

const char* distribution_name(Distribution d) {
  switch (d) {
    case Distribution::kUniform:
      return "uniform";
    case Distribution::kNormal:
      return "normal";
    case Distribution::kExtreme:
      return "extreme";
    case Distribution::kVBias:
      return "vbias";
    case Distribution::kWideV:
      return "widev";
  }
  return "?";
}
const char* tensor_name(Tensor t) {
  switch (t) {
    case Tensor::kQ:
      return "q";
    case Tensor::kK:
      return "k";
    case Tensor::kV:
      return "v";
  }
  return "?";
}
const char* special_kind_name(SpecialKind k) {
  switch (k) {
    case SpecialKind::kNaN:
      return "nan";
    case SpecialKind::kPosInf:
      return "inf";
    case SpecialKind::kNegInf:
      return "-inf";
    case SpecialKind::kSubnormal:
      return "subnormal";
    case SpecialKind::kHuge:
      return "huge";
    case SpecialKind::kNegZero:
      return "-0";
  }
  return "?";
}
const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kRandom:
      return "random";
    case Placement::kVisible:
      return "visible";
    case Placement::kMasked:
      return "masked";
    case Placement::kHidden:
      return "hidden";
    case Placement::kAt:
      return "at";
  }
  return "?";
}

const char* value_domain_name(ValueDomain d) { return d == ValueDomain::kFinite ? "finite" : "ieee"; }

const char* pass_name(Pass p) { return p == Pass::kBwd ? "bwd" : p == Pass::kFwdBwd ? "fwdbwd" : "fwd"; }

std::string parse_pass(const std::string& text, Pass& out) {
  if (text == "fwd") out = Pass::kFwd;
  else if (text == "bwd") out = Pass::kBwd;
  else if (text == "fwdbwd" || text == "fwd+bwd") out = Pass::kFwdBwd;
  else return "unknown pass '" + text + "' (fwd, bwd or fwdbwd)";
  return {};
}

std::string parse_value_domain(const std::string& text, ValueDomain& out) {
  if (text == "ieee") {
    out = ValueDomain::kIeee;
  } else if (text == "finite") {
    out = ValueDomain::kFinite;
  } else {
    return "unknown value domain '" + text + "': ieee or finite";
  }
  return {};
}

bool special_in_domain(SpecialKind k, ValueDomain d) {
  return d == ValueDomain::kIeee ||
         !(k == SpecialKind::kNaN || k == SpecialKind::kPosInf || k == SpecialKind::kNegInf);
}

namespace {

// Shortest %g form that reads back as the same double.
std::string shortest(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty() || s.size() > 40) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  out = std::stoll(s);
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

}  // namespace

std::string parse_distribution(const std::string& text, ValueDist& out) {
  const std::string err = "value distribution '" + text +
                          "' is invalid: use uniform[:A], normal[:SIGMA], extreme:MAG, vbias[:A] or widev[:A] (A, SIGMA, MAG > 0)";
  const auto colon = text.find(':');
  const std::string name = text.substr(0, colon);
  ValueDist d;
  if (name == "uniform")
    d.kind = Distribution::kUniform;
  else if (name == "normal")
    d.kind = Distribution::kNormal;
  else if (name == "extreme")
    d.kind = Distribution::kExtreme;
  else if (name == "vbias")
    d.kind = Distribution::kVBias;
  else if (name == "widev")
    d.kind = Distribution::kWideV;
  else
    return err;
  if (colon == std::string::npos) {
    if (d.kind == Distribution::kExtreme) return err;
    d.param = 1.0;
  } else if (!parse_double(text.substr(colon + 1), d.param) || !(d.param > 0) || !std::isfinite(d.param)) {
    return err;
  }
  out = d;
  return {};
}

std::string to_string(const ValueDist& d) {
  return std::string(distribution_name(d.kind)) + ":" + shortest(d.param);
}

std::string parse_special(const std::string& text, SpecialValue& out) {
  const std::string err =
      "special value '" + text +
      "' is invalid: use KIND[@q|k|v][:random|visible|masked|hidden|at=S,D|at=B,H,S,D][*COUNT] "
      "with KIND nan, inf, -inf, subnormal, huge or -0";
  SpecialValue s;
  std::string t = text;
  if (const auto star = t.rfind('*'); star != std::string::npos) {
    if (!parse_int(t.substr(star + 1), s.count)) return err;
    t.resize(star);
  }
  std::string placement;
  if (const auto colon = t.find(':'); colon != std::string::npos) {
    placement = t.substr(colon + 1);
    t.resize(colon);
  }
  if (const auto at = t.find('@'); at != std::string::npos) {
    const std::string tn = t.substr(at + 1);
    if (tn == "q")
      s.tensor = Tensor::kQ;
    else if (tn == "k")
      s.tensor = Tensor::kK;
    else if (tn == "v")
      s.tensor = Tensor::kV;
    else
      return err;
    t.resize(at);
  }
  if (t == "nan")
    s.kind = SpecialKind::kNaN;
  else if (t == "inf" || t == "+inf")
    s.kind = SpecialKind::kPosInf;
  else if (t == "-inf")
    s.kind = SpecialKind::kNegInf;
  else if (t == "subnormal" || t == "denormal")
    s.kind = SpecialKind::kSubnormal;
  else if (t == "huge")
    s.kind = SpecialKind::kHuge;
  else if (t == "-0" || t == "negzero")
    s.kind = SpecialKind::kNegZero;
  else
    return err;
  if (placement.empty() || placement == "random")
    s.placement = Placement::kRandom;
  else if (placement == "visible")
    s.placement = Placement::kVisible;
  else if (placement == "masked")
    s.placement = Placement::kMasked;
  else if (placement == "hidden")
    s.placement = Placement::kHidden;
  else if (placement.rfind("at=", 0) == 0) {
    s.placement = Placement::kAt;
    const auto parts = split(placement.substr(3), ',');
    std::vector<int64_t> v(parts.size());
    for (size_t i = 0; i < parts.size(); ++i)
      if (!parse_int(parts[i], v[i])) return err;
    if (v.size() == 2) {
      s.s = v[0];
      s.d = v[1];
    } else if (v.size() == 4) {
      s.b = v[0];
      s.h = v[1];
      s.s = v[2];
      s.d = v[3];
    } else {
      return err;
    }
  } else {
    return err;
  }
  out = s;
  return {};
}

std::string to_string(const SpecialValue& s) {
  std::string t = std::string(special_kind_name(s.kind)) + "@" + tensor_name(s.tensor) + ":";
  if (s.placement == Placement::kAt) {
    t += "at=" + std::to_string(s.b) + "," + std::to_string(s.h) + "," + std::to_string(s.s) + "," +
         std::to_string(s.d);
  } else {
    t += placement_name(s.placement);
  }
  if (s.count != 1) t += "*" + std::to_string(s.count);
  return t;
}

// ------------------------------------------------------------------------------------------- cases

Case make_case(const Problem& p, uint64_t seed) {
  Case c;
  c.problem = p;
  c.seed = seed;
  return c;
}

namespace {
int64_t tensor_heads(const Problem& p, Tensor t) { return t == Tensor::kQ ? p.heads_q : p.heads_kv; }
int64_t tensor_seq(const Problem& p, Tensor t) { return t == Tensor::kQ ? p.seq_q : p.seq_k; }
int64_t tensor_dim(const Problem& p, Tensor t) { return t == Tensor::kV ? p.head_dim_v : p.head_dim; }
int64_t tensor_index(const Problem& p, Tensor t, int64_t b, int64_t h, int64_t s, int64_t d) {
  switch (t) {
    case Tensor::kQ:
      return q_index(p, b, s, h, d);
    case Tensor::kK:
      return k_index(p, b, s, h, d);
    default:
      return v_index(p, b, s, h, d);
  }
}
constexpr int64_t kMaxSpecialCount = int64_t{1} << 24;
}  // namespace

std::string validate(const Case& c) {
  if (std::string e = validate(c.problem); !e.empty()) return e;
  if (std::string e = validate_sequences(c); !e.empty()) return e;
  // The gradient oracle and the backward launch are defined for dense f32, f16 and bf16 problems (fp8 and
  // sequence layouts are not checked yet).
  if (has_backward(c.pass) && c.problem.dtype != AF_DTYPE_F32 && c.problem.dtype != AF_DTYPE_F16 &&
      c.problem.dtype != AF_DTYPE_BF16)
    return std::string("the backward pass is checked in f32, f16 and bf16 only, not ") +
           dtype_name(c.problem.dtype) + " (yet)";
  if (has_backward(c.pass) && has_sequences(c.problem))
    return "the backward pass is checked on dense batches only, not on sequence layouts (yet)";
  const double a = c.values.dist.param;
  if (!(a > 0) || !std::isfinite(a))
    return "value distribution parameter " + shortest(a) + " is invalid: need a finite value > 0";
  for (const SpecialValue& s : c.values.specials) {
    if (!special_in_domain(s.kind, c.values.domain))
      return "special value '" + to_string(s) + "' is not in the finite value domain (no NaN or Inf)";
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
    if (auto m = check("v", e.v.size(), v_elements(c.problem)); !m.empty()) return m;
    if (!e.dout.empty() && !has_backward(c.pass)) return "explicit dO is given for a forward case";
    if (!e.dout.empty())
      if (auto m = check("dO", e.dout.size(), o_elements(c.problem)); !m.empty()) return m;
    if (c.values.domain == ValueDomain::kFinite && !has_sequences(c.problem)) {  // sequences: on the view
      const Problem& p = c.problem;
      for (Tensor t : {Tensor::kQ, Tensor::kK, Tensor::kV}) {
        const std::vector<float>& buf = t == Tensor::kQ ? e.q : t == Tensor::kK ? e.k : e.v;
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t s = 0; s < tensor_seq(p, t); ++s)
            for (int64_t h = 0; h < tensor_heads(p, t); ++h)
              for (int64_t d = 0; d < tensor_dim(p, t); ++d)
                if (!std::isfinite(buf[static_cast<size_t>(tensor_index(p, t, b, h, s, d))]))
                  return std::string("explicit ") + tensor_name(t) +
                         " holds a NaN or Inf at (b=" + std::to_string(b) + ", s=" + std::to_string(s) +
                         ", h=" + std::to_string(h) + ", d=" + std::to_string(d) +
                         "): not in the finite value domain";
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
  return t;
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
}  // namespace

Tensors generate(const Case& c) {
  Tensors out = generate_qkv(c);
  if (has_backward(c.pass)) {
    out.dout = c.explicit_values && !c.explicit_values->dout.empty() ? c.explicit_values->dout : generate_dout(c);
    if (c.problem.dtype != AF_DTYPE_F32)  // dO is stored in the dtype too (NaN, so the stride gaps, pass)
      for (float& x : out.dout) x = to_stored(x, c.problem.dtype, c.values.domain == ValueDomain::kFinite);
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
    const bool sat = c.values.domain == ValueDomain::kFinite;
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
  const bool finite = c.values.domain == ValueDomain::kFinite;
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
    std::vector<float>& buf = sv.tensor == Tensor::kQ ? out.q : sv.tensor == Tensor::kK ? out.k : out.v;
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

// ------------------------------------------------------------------------------------------ space

namespace space {

const std::vector<int64_t>& tile_sizes() {
  static const std::vector<int64_t> t{16, 32, 64, 128};
  return t;
}

std::vector<int64_t> edge_seq_lengths(int64_t max_len) {
  std::vector<int64_t> v{1, 2, 3, 5, 7, 13, 17, 31, 61, 113, 127, 203, 239};
  for (int64_t t : tile_sizes())
    for (int64_t d : {-1, 0, 1}) v.push_back(t + d);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::erase_if(v, [&](int64_t x) { return x > max_len; });
  return v;
}

std::vector<int64_t> edge_head_dims(int64_t max_d) {
  std::vector<int64_t> v{1, 2, 3, 5, 7, 17, 31, 33, 59, 63, 65, 96, 111, 127, 129, 255, 256};
  for (int64_t t : {4, 8, 16, 32, 64, 128}) v.push_back(t);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::erase_if(v, [&](int64_t x) { return x > max_d; });
  return v;
}

const std::vector<std::pair<int64_t, int64_t>>& head_configs() {
  static const std::vector<std::pair<int64_t, int64_t>> h{{1, 1}, {2, 2}, {4, 2}, {4, 1}, {6, 3}, {8, 1}};
  return h;
}

const std::vector<std::string>& mask_forms() {
  static const std::vector<std::string> m{"none",          "causal-br",       "causal-tl",
                                          "window:8,0-br", "window:8,0-tl",   "window:4,4-br",
                                          "window:0,0-br", "window:inf,3-br", "window:16,inf-tl"};
  return m;
}

const std::vector<double>& extreme_magnitudes() {
  static const std::vector<double> m{1, 10, 30, 80, 88, 89, 100, 300, 1000, 10000};
  return m;
}

const std::vector<int32_t>& dtypes() {
  static const std::vector<int32_t> d{AF_DTYPE_F32, AF_DTYPE_F16, AF_DTYPE_BF16, AF_DTYPE_FP8_E4M3,
                                      AF_DTYPE_FP8_E5M2};
  return d;
}

std::vector<double> lowp_extreme_magnitudes(int32_t dtype) {
  switch (dtype) {
    // f16: exp(11.1) > 65504; at D = 64 q.k > 65504 > scale * q.k; 300: a max or lse kept in f16 is 2^-11 x 300
    // off. bf16: exp(89) overflows; 1e3 and 1e4: a softmax statistic kept in bf16 loses 2^-9 relative, i.e.
    // 2 .. 20 in the exponent (issue 25).
    case AF_DTYPE_F16: return {11, 300, 3000};
    case AF_DTYPE_BF16: return {89, 1000, 10000};
    case AF_DTYPE_FP8_E4M3: return {6, 11};  // exp(6.1) > 448
    case AF_DTYPE_FP8_E5M2: return {11};     // exp(11) > 57344
    default: return {};
  }
}

std::vector<double> lowp_wide_v(int32_t dtype) {
  switch (dtype) {
    case AF_DTYPE_F16: return {2048};  // ~0.5 x 128 x 1536 ~ 98k > 65504 while |v| <= 2048
    case AF_DTYPE_FP8_E4M3: return {16};   // 0.75 x 128 x 16 > 448
    case AF_DTYPE_FP8_E5M2: return {1024};
    default: return {};  // bf16 shares fp32's range: no n |v| of a case passes it
  }
}

std::vector<double> lowp_uniform_widths(int32_t dtype) {
  if (dtype == AF_DTYPE_F32) return {};
  return {8 * std::ldexp(1.0, dtype_quantum_exp(dtype)), 2 * dtype_min_normal(dtype), dtype_max(dtype) / 4};
}

const std::vector<float>& fp8_descales() {
  static const std::vector<float> d{1.0f, 0.5f, 2.0f, 0.125f, 8.0f, 0.375f, 3.25f, 0.01171875f, 0x1.2p-9f};
  return d;
}

const std::vector<SpecialKind>& special_kinds() {
  static const std::vector<SpecialKind> k{SpecialKind::kNaN,    SpecialKind::kPosInf,
                                          SpecialKind::kNegInf, SpecialKind::kSubnormal,
                                          SpecialKind::kHuge,   SpecialKind::kNegZero};
  return k;
}

const std::vector<SpecialKind>& special_kinds(ValueDomain d) {
  static const std::vector<SpecialKind> finite = [] {
    std::vector<SpecialKind> k;
    for (SpecialKind x : special_kinds())
      if (special_in_domain(x, ValueDomain::kFinite)) k.push_back(x);
    return k;
  }();
  return d == ValueDomain::kFinite ? finite : special_kinds();
}

}  // namespace space

// ------------------------------------------------------------------------------------------ sweep

std::vector<Case> sweep_grid(uint64_t base_seed, ValueDomain domain, int32_t dtype, Pass pass) {
  std::vector<Case> grid;
  auto add = [&](std::string label, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                 int64_t dv, const std::string& mask, ValueSpec values = {}) {
    Case c;
    c.problem = make_problem(b, hq, hkv, sq, sk, d, dv);
    if (std::string e = parse_mask(mask, c.problem); !e.empty()) throw std::logic_error(e);
    if (dtype != AF_DTYPE_F32) {
      c.problem.dtype = dtype;
      label = std::string(dtype_name(dtype)) + "-" + label;
    }
    c.values = std::move(values);
    c.values.domain = domain;
    c.pass = pass;
    std::replace(label.begin(), label.end(), ':', '=');  // labels stay usable in file names
    std::replace(label.begin(), label.end(), ',', '.');
    c.label = std::move(label);
    uint64_t x = base_seed ^ hash64(c.label);
    c.seed = splitmix64(x);
    grid.push_back(std::move(c));
  };
  auto sp = [](const std::string& text) {
    SpecialValue s;
    if (std::string e = parse_special(text, s); !e.empty()) throw std::logic_error(e);
    return s;
  };
  auto dist = [](Distribution k, double param) {
    ValueSpec v;
    v.dist = {k, param};
    return v;
  };
  auto L = [](const char* prefix, int64_t sq, int64_t sk, const std::string& mask) {
    return std::string(prefix) + "-" + std::to_string(sq) + "x" + std::to_string(sk) + "-" + mask;
  };

  // The classics.
  add("1x1-d64-none", 1, 1, 1, 1, 1, 64, 64, "none");
  add("1x1-d1-causal-br", 1, 1, 1, 1, 1, 1, 1, "causal-br");
  for (const char* m : {"none", "causal-br", "causal-tl"}) {
    add(L("flash", 7, 13, m) + "-d59", 1, 1, 1, 7, 13, 59, 59, m);
    add(L("flash", 13, 7, m) + "-d59", 1, 1, 1, 13, 7, 59, 59, m);
  }
  // Tails around every tile size, square.
  for (int64_t t : space::tile_sizes())
    for (int64_t s : {t - 1, t, t + 1})
      for (const char* m : {"none", "causal-br"}) add(L("tail", s, s, m) + "-d64", 1, 1, 1, s, s, 64, 64, m);
  // Sq != Sk both ways (awkward pairs from flash-attention's tests), every mask alignment.
  const std::pair<int64_t, int64_t> pairs[] = {{1, 129},  {129, 1},  {17, 65},  {65, 17},
                                               {33, 100}, {100, 33}, {113, 203}};
  for (auto [sq, sk] : pairs)
    for (const char* m : {"none", "causal-br", "causal-tl"})
      add(L("rect", sq, sk, m) + "-d32", 1, 1, 1, sq, sk, 32, 32, m);
  // Head dims: odd, prime, tile +- 1 (Sq = Sk = 37 so the sequence tails are odd too).
  for (int64_t d : {1, 3, 17, 31, 33, 59, 63, 65, 111, 127, 128})
    add("headdim-37x37-d" + std::to_string(d), 1, 1, 1, 37, 37, d, d, "causal-br");
  add("dv-40x40-d64-dv32", 1, 1, 1, 40, 40, 64, 32, "none");
  add("dv-40x40-d32-dv64", 1, 1, 1, 40, 40, 32, 64, "causal-br");
  add("dv-40x40-d59-dv17", 1, 1, 1, 40, 40, 59, 17, "causal-tl");
  // Heads: GQA / MQA, and batch.
  for (auto [hq, hkv] : space::head_configs())
    if (hq > 1)
      add("heads-" + std::to_string(hq) + "q" + std::to_string(hkv) + "kv-33x33", 1, hq, hkv, 33, 33, 32, 32,
          "causal-br");
  add("batch-3x2h-20x45", 3, 2, 2, 20, 45, 16, 16, "causal-br");
  add("batch-2x4q2kv-45x20", 2, 4, 2, 45, 20, 16, 16, "causal-tl");
  // Masks: windows, fully masked rows, Sk = 0.
  for (const char* m : {"window:8,0-br", "window:8,0-tl", "window:4,4-br", "window:0,0-br", "window:inf,3-br",
                        "window:16,inf-tl"})
    add(L("window", 50, 70, m), 1, 1, 1, 50, 70, 32, 32, m);
  add("masked-rows-40x9-causal-br", 1, 2, 1, 40, 9, 32, 32, "causal-br");        // rows 0..30 fully masked
  add("masked-rows-9x3-window:0,0-tl", 1, 1, 1, 9, 3, 16, 16, "window:0,0-tl");  // rows 3..8 fully masked
  add("masked-rows-20x40-window:0,2-tl-far", 1, 1, 1, 20, 40, 16, 16, "window:0,2-tl");
  add("empty-keys-5x0-none", 1, 1, 1, 5, 0, 16, 16, "none");
  add("empty-keys-17x0-causal-br", 1, 2, 1, 17, 0, 33, 33, "causal-br");
  // Magnitudes: scores near and beyond exp's overflow without max subtraction, late maxima.
  for (double mag : {10.0, 30.0, 88.0, 300.0})
    add("extreme-" + shortest(mag) + "-65x65", 1, 1, 1, 65, 65, 64, 64, "causal-br",
        dist(Distribution::kExtreme, mag));
  add("normal-0.01-65x65", 1, 1, 1, 65, 65, 64, 64, "none", dist(Distribution::kNormal, 0.01));
  add("uniform-100-33x33", 1, 1, 1, 33, 33, 32, 32, "none", dist(Distribution::kUniform, 100));
  // Special values: masked ones must not reach any output, visible ones must poison exactly their rows.
  auto special = [&](std::string text, int64_t sq, int64_t sk, const std::string& mask) {
    ValueSpec v;
    v.specials.push_back(sp(text));
    if (!special_in_domain(v.specials.back().kind, domain)) {  // finite: huge at the same place instead
      v.specials.back().kind = SpecialKind::kHuge;
      text = to_string(v.specials.back());
    }
    add("special-" + text + "-" + std::to_string(sq) + "x" + std::to_string(sk) + "-" + mask, 1, 1, 1, sq, sk,
        32, 32, mask, v);
  };
  special("nan@k:hidden*3", 20, 40, "causal-tl");
  special("nan@v:hidden*3", 20, 40, "causal-tl");
  special("inf@k:hidden*2", 20, 40, "window:4,0-tl");
  special("nan@k:masked", 33, 33, "causal-br");
  special("inf@v:masked*2", 33, 33, "causal-br");
  special("nan@q:masked*2", 40, 9, "causal-br");
  special("nan@v:visible", 33, 33, "causal-br");
  special("-inf@k:visible", 33, 33, "none");
  special("inf@q:visible", 17, 17, "none");
  special("subnormal@q:random*64", 33, 33, "none");
  special("subnormal@v:random*64", 33, 33, "causal-br");
  special("-0@k:random*16", 17, 17, "none");
  if (dtype == AF_DTYPE_F32) return grid;
  // Low precision (issue 13): exp overflow in the format without max subtraction, the format's subnormal
  // range, its smallest normals and values near its largest, long rows (half-precision sums drift with Sk).
  for (double mag : space::lowp_extreme_magnitudes(dtype))
    add("lowp-extreme-" + shortest(mag) + "-65x65", 1, 1, 1, 65, 65, 64, 64, "causal-br",
        dist(Distribution::kExtreme, mag));
  for (double a : space::lowp_uniform_widths(dtype))
    add("lowp-uniform-" + shortest(a) + "-33x33", 1, 1, 1, 33, 33, 32, 32, "none", dist(Distribution::kUniform, a));
  add("lowp-long-4x2048", 1, 1, 1, 4, 2048, 32, 32, "none", dist(Distribution::kVBias, 1));
  add("lowp-long-3x700-causal-br", 1, 1, 1, 3, 700, 16, 16, "causal-br", dist(Distribution::kVBias, 1));
  add("lowp-long-uniform-4x1024", 1, 1, 1, 4, 1024, 32, 32, "none");
  // Near-uniform weights with one-signed large v: the un-normalised accumulator sum exp(s - m) v passes the
  // format's range before the division by the row sum (f16: 128 keys x ~768 ~ 98k > 65504).
  for (double a : space::lowp_wide_v(dtype))
    add("lowp-widev-" + shortest(a) + "-8x128", 1, 1, 1, 8, 128, 32, 32, "none", dist(Distribution::kWideV, a));
  special("huge@v:visible*4", 33, 33, "none");
  special("subnormal@k:random*64", 33, 33, "causal-br");
  if (dtype == AF_DTYPE_FP8_E4M3 || dtype == AF_DTYPE_FP8_E5M2) {
    // Descale factors: q and k scale the scores, v the output; o_scale keeps |O| o_scale in range.
    const float triples[][4] = {{0.5f, 0.25f, 2.0f, 0.25f},
                                {0.375f, 3.25f, 0.125f, 1.0f},
                                {4.0f, 2.0f, 0.01171875f, 8.0f},
                                {0.125f, 0.125f, 8.0f, 0.0625f}};
    int n = 0;
    for (const auto& t : triples) {
      for (const char* m : {"none", "causal-br"}) {
        add("descale-" + std::to_string(n) + "-40x70-" + m, 1, 2, 1, 40, 70, 32, 32, m,
            dist(Distribution::kUniform, n % 2 ? 4.0 : 1.0));
        Problem& p = grid.back().problem;
        p.q_descale = t[0], p.k_descale = t[1], p.v_descale = t[2], p.o_scale = t[3];
      }
      ++n;
    }
  }
  return grid;
}

}  // namespace attnfuzz
