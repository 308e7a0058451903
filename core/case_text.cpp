// case_text.cpp - the names and text forms of value specifications (distributions, specials, passes, domains).
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

#include "core/case_internal.h"
#include "core/sequences.h"
#include "oracle/lowp.h"

namespace attnfuzz {

using namespace case_detail;

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

const char* value_domain_name(ValueDomain d) {
  return d == ValueDomain::kFinite ? "finite" : d == ValueDomain::kActivations ? "activations" : "ieee";
}

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
  } else if (text == "activations") {
    out = ValueDomain::kActivations;
  } else {
    return "unknown value domain '" + text + "': ieee, finite or activations";
  }
  return {};
}

bool special_in_domain(SpecialKind k, ValueDomain d) {
  if (d == ValueDomain::kActivations) return k == SpecialKind::kNegZero;
  return d == ValueDomain::kIeee ||
         !(k == SpecialKind::kNaN || k == SpecialKind::kPosInf || k == SpecialKind::kNegInf);
}

bool value_in_domain(float x, ValueDomain d) {
  if (d == ValueDomain::kActivations) return std::fabs(x) <= kActivationBound;  // false for NaN
  return d == ValueDomain::kIeee || std::isfinite(x);
}

float to_domain(float x, ValueDomain d) {
  if (value_in_domain(x, d)) return x;
  if (std::isnan(x)) return 0.0f;
  return std::copysign(d == ValueDomain::kActivations ? static_cast<float>(kActivationBound) : FLT_MAX, x);
}

std::string case_detail::shortest(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

namespace {

bool parse_double(const std::string& s, double& out) {
  if (s.empty() || s.size() > 40) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  return std::from_chars(s.data(), s.data() + s.size(), out).ec == std::errc();
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

}  // namespace attnfuzz
