// nonfinite_values.h - test helper: whether a case's in-bounds q/k/v elements hold NaN or Inf (stride gaps
// excepted).
#pragma once

#include <cmath>

#include "attnfuzz/case.h"

namespace attnfuzz::test_util {

inline bool has_nonfinite(const Problem& p, const Tensors& t) {
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          if (!std::isfinite(t.q[q_index(p, b, s, h, d)])) return true;
    for (int64_t s = 0; s < p.seq_k; ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          if (!std::isfinite(t.k[k_index(p, b, s, h, d)])) return true;
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          if (!std::isfinite(t.v[v_index(p, b, s, h, d)])) return true;
      }
  }
  return false;
}

}  // namespace attnfuzz::test_util
