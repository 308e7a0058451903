// reference_fp64.h - the plain three-loop double-precision attention reference (a baseline, not the oracle).
#pragma once

#include <vector>

#include "attnfuzz/problem.h"

namespace attnfuzz {

// O [B, Sq, Hq, Dv] and LSE [B, Hq, Sq] in double, laid out contiguously (not with p's strides).
struct Fp64Result {
  std::vector<double> o;
  std::vector<double> lse;
};

// Computes attention in double the obvious way: scores, max-subtracted exp, sum, weighted V sum.
// Fully masked rows give O = 0 and LSE = -inf. q, k, v are laid out with p's strides.
Fp64Result reference_fp64(const Problem& p, const float* q, const float* k, const float* v);

// Index into Fp64Result::o / lse.
inline size_t fp64_o_index(const Problem& p, int64_t b, int64_t s, int64_t h, int64_t d) {
  return static_cast<size_t>(((b * p.seq_q + s) * p.heads_q + h) * p.head_dim_v + d);
}
inline size_t fp64_lse_index(const Problem& p, int64_t b, int64_t h, int64_t s) {
  return static_cast<size_t>((b * p.heads_q + h) * p.seq_q + s);
}

}  // namespace attnfuzz
