// case_internal.h - what core/case*.cpp share: per-tensor shape helpers and the shortest number text.
#pragma once

#include <cstdint>
#include <string>

#include "attnfuzz/case.h"

namespace attnfuzz::case_detail {

inline int64_t tensor_heads(const Problem& p, Tensor t) { return t == Tensor::kQ ? p.heads_q : p.heads_kv; }
inline int64_t tensor_seq(const Problem& p, Tensor t) { return t == Tensor::kQ ? p.seq_q : p.seq_k; }
inline int64_t tensor_dim(const Problem& p, Tensor t) { return t == Tensor::kV ? p.head_dim_v : p.head_dim; }
inline int64_t tensor_index(const Problem& p, Tensor t, int64_t b, int64_t h, int64_t s, int64_t d) {
  switch (t) {
    case Tensor::kQ:
      return q_index(p, b, s, h, d);
    case Tensor::kK:
      return k_index(p, b, s, h, d);
    default:
      return v_index(p, b, s, h, d);
  }
}

// Shortest %g form that reads back as the same double.
std::string shortest(double v);

}  // namespace attnfuzz::case_detail
