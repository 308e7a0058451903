// fit.cpp - a sweep case reshaped to what one kernel declares (its variants, heads, query rows, head dims, page size).
#include "check/fit.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "check/runner.h"

namespace attnfuzz {

namespace {

using Step = std::pair<const char*, std::function<bool(Case&, const af_kernel&)>>;  // false: changes nothing

bool set_heads(Case& c, int64_t hq, int64_t hkv) {
  if (c.problem.heads_q == hq && c.problem.heads_kv == hkv) return false;
  c.problem.heads_q = hq, c.problem.heads_kv = hkv;
  return true;
}

// At most n query rows in every sequence (dense q: Sq; packed q: each length).
bool cap_rows(Case& c, int64_t n) {
  bool changed = false;
  if (c.problem.q_layout == AF_SEQ_PACKED) {
    for (int64_t& x : c.seqs.q)
      if (x > n) x = n, changed = true;
  } else if (c.problem.seq_q > n) {
    c.problem.seq_q = n, changed = true;
  }
  return changed;
}

const std::vector<Step>& steps() {
  static const std::vector<Step> s = {
      {"h1x1", [](Case& c, const af_kernel&) { return set_heads(c, 1, 1); }},
      {"mha", [](Case& c, const af_kernel&) { return set_heads(c, c.problem.heads_q, c.problem.heads_q); }},
      {"q4", [](Case& c, const af_kernel&) { return cap_rows(c, 4); }},
      {"q2", [](Case& c, const af_kernel&) { return cap_rows(c, 2); }},
      {"q1", [](Case& c, const af_kernel&) { return cap_rows(c, 1); }},
      {"d",
       [](Case& c, const af_kernel& k) {
         Problem& p = c.problem;
         const int64_t d = k.max_head_dim > 0 ? std::min(p.head_dim, k.max_head_dim) : p.head_dim;
         int64_t dv = k.max_head_dim_v > 0 ? std::min(p.head_dim_v, k.max_head_dim_v) : p.head_dim_v;
         if (k.needs_dv_eq_d) dv = std::min(d, dv);
         const int64_t dd = k.needs_dv_eq_d ? dv : d;
         if (dd == p.head_dim && dv == p.head_dim_v) return false;
         p.head_dim = dd, p.head_dim_v = dv;
         return true;
       }},
      {"page",
       [](Case& c, const af_kernel& k) {
         if (c.problem.kv_layout != AF_SEQ_PAGED) return false;
         const int32_t lo = k.min_page_size > 0 ? k.min_page_size : 16;
         const int32_t hi = k.max_page_size > 0 ? k.max_page_size : 256;
         const int32_t p = std::clamp(c.problem.page_size, lo, hi);
         if (p == c.problem.page_size) return false;
         c.problem.page_size = p;
         return true;
       }},
  };
  return s;
}

// c with the steps `use` applied, if each changes something and the result is a valid case k claims.
std::optional<Case> try_steps(const Case& c, const af_kernel& k, const std::vector<size_t>& use) {
  Case f = c;
  std::string tag;
  for (size_t i : use) {
    if (!steps()[i].second(f, k)) return std::nullopt;
    tag += (tag.empty() ? "" : ".") + std::string(steps()[i].first);
  }
  if (has_sequences(f.problem)) {
    if (!set_sequence_fields(f).empty()) return std::nullopt;
  } else {
    set_contiguous_strides(f.problem);
  }
  if (!validate(f).empty()) return std::nullopt;
  if (!case_unsupported_reason(k, f.problem, f.pass).empty()) return std::nullopt;
  f.label += (f.label.find("-fit-") == std::string::npos ? "-fit-" : ".") + tag;
  return f;
}

}  // namespace

std::optional<Case> fit_variants(const Case& c, const af_kernel& k) {
  const uint32_t has = c.problem.variants & kDroppableVariants;
  const uint32_t drop = has & ~k.variants;
  if (!drop || drop == has) return std::nullopt;
  Case f = c;
  if (!drop_variants(f, drop).empty()) return std::nullopt;
  f.label += "-fit-" + variant_names(has & ~drop);
  return f;
}

std::optional<Case> fit_to_kernel(const Case& given, const af_kernel& k) {
  if (case_unsupported_reason(k, given.problem, given.pass).empty()) return given;
  const std::optional<Case> fewer = fit_variants(given, k);
  const Case& c = fewer ? *fewer : given;
  if (fewer && case_unsupported_reason(k, c.problem, c.pass).empty()) return c;
  const size_t n = steps().size();
  for (size_t i = 0; i < n; ++i)
    if (auto f = try_steps(c, k, {i})) return f;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j)
      if (auto f = try_steps(c, k, {i, j})) return f;
  return std::nullopt;
}

}  // namespace attnfuzz
