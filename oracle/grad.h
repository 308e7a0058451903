// grad.h - the exact attention backward: dQ, dK, dV of docs/semantics.md "The backward contract" with per-element error bounds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/problem.h"
#include "oracle/oracle.h"

namespace attnfuzz {

struct GradOptions {
  OracleOptions fwd;     // the forward analysis the gradient bounds extend (model, safety factor, threads,
                         // multiprecision backend and bits, compute dtype)
  int64_t q_budget = 0;  // 0: every query row's dQ. Else about this many query rows (sample_rows rules)
  int64_t k_budget = 0;  // 0: every key's dK / dV. Else about this many key positions: 0 and Sk-1, both
                         // sides of every 16/32/64/128 tile boundary, keys holding a non-finite value,
                         // plus seeded random ones
  uint64_t sample_seed = 1;
  bool force_multiprecision = false;  // every row and column on the arbiter path
  // The exact forward of the same problem and inputs (compute_oracle with row_budget 0, same fwd options),
  // when the caller already has it (e.g. to give the kernel its O and LSE): the gradient oracle then skips
  // its own forward pass (about half of its time). nullptr: computed here.
  const OracleResult* forward = nullptr;
};

// Exact gradients in double, contiguous (not with the problem's strides): dQ [B, Sq, Hq, D],
// dK [B, Sk, Hkv, D], dV [B, Sk, Hkv, Dv]. `_bound` is the allowed |got - exact| of a correct kernel that
// received the given o / lse (oracle/README.md "Backward bound"); NaN where not computed (sampling).
struct GradResult {
  Problem problem{};
  std::vector<double> dq, dq_bound, dk, dk_bound, dv, dv_bound;
  std::vector<uint8_t> q_computed;  // per (b, s, h): 1 when dQ of that row was computed
  std::vector<uint8_t> k_computed;  // per (b, j, hkv): 1 when dK / dV of that key were computed
  std::vector<int64_t> sampled_q, sampled_k;  // query rows / key positions computed, ascending
  // Score variants: d loss / d sink [Hq] (AF_VARIANT_SINK) and d loss / d bias (AF_VARIANT_BIAS, bias_elements
  // floats with the problem's bias_stride, summed over its broadcast dimensions); empty without the variant.
  std::vector<double> dsinks, dsinks_bound, dbias, dbias_bound;
  int64_t rows_fast = 0, rows_mp = 0, rows_fallback = 0;
  bool inside_contract = true;  // false: some exact intermediate exceeds the fp32 range (see why)
  std::string why;              // empty, or the first contract problem
  double ms = 0;

  size_t dq_at(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return static_cast<size_t>(((b * problem.seq_q + s) * problem.heads_q + h) * problem.head_dim + d);
  }
  size_t dk_at(int64_t b, int64_t j, int64_t hk, int64_t d) const {
    return static_cast<size_t>(((b * problem.seq_k + j) * problem.heads_kv + hk) * problem.head_dim + d);
  }
  size_t dv_at(int64_t b, int64_t j, int64_t hk, int64_t d) const {
    return static_cast<size_t>(((b * problem.seq_k + j) * problem.heads_kv + hk) * problem.head_dim_v + d);
  }
};

// Exact dQ, dK, dV for p. q, k, v, dout are host fp32 arrays with p's q / k / v / o strides (dout uses
// o_stride) holding the stored values. o and lse are what the backward kernel is given ([B, Sq, Hq, Dv]
// with o_stride, [B, Hq, Sq] with lse_stride): the exact forward rounded to the dtype (judging backward
// alone) or the kernel's own forward (fwd+bwd). The gradients are the exact ones of the exact softmax;
// Delta_i = sum_d dO_id O_id uses the exact O, and the bound covers the difference to the given o.
// Throws std::invalid_argument when p is malformed.
GradResult compute_grad_oracle(const Problem& p, const float* q, const float* k, const float* v,
                               const float* dout, const float* o, const float* lse,
                               const GradOptions& opts = {});
// The same with the values of p's score variants (the overload above has none: it throws for a problem that
// uses one). Softcap: dS reaches q and k through d(cap tanh(s / cap)) / ds = 1 - tanh^2; bias and ALiBi: the
// final score's dS; sinks: d sink_h = -sum over (b, i) of exp(sink_h - LSE_i) Delta_i.
GradResult compute_grad_oracle(const Problem& p, const float* q, const float* k, const float* v,
                               const float* dout, const float* o, const float* lse, const VariantInputs& vars,
                               const GradOptions& opts = {});

// The key positions computed under a k_budget (GradOptions::k_budget): every key when budget <= 0 or
// budget >= Sk; else 0, Sk-1, both sides of every 16/32/64/128 tile boundary, keys whose k or v holds a
// NaN or Inf, plus seeded random keys until about `budget`. Ascending, no duplicates.
std::vector<int64_t> sample_keys(const Problem& p, const float* k, const float* v, int64_t budget, uint64_t seed);

}  // namespace attnfuzz
