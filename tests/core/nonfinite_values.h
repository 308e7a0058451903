// nonfinite_values.h - test helper: whether a case's in-bounds q/k/v elements hold NaN or Inf (stride gaps
// excepted; for a sequence layout, the tokens of its sequences).
#pragma once

#include <cmath>

#include "attnfuzz/case.h"

namespace attnfuzz::test_util {

// Sequence layouts (case.h): the tokens of each sequence (the gaps between them are poison, not values).
inline bool has_nonfinite(const Problem& p, const Tensors& t) {
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          if (!std::isfinite(t.q[q_offset(p, t, b, s, h, d)])) return true;
    for (int64_t s = 0; s < seq_len_k(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          if (!std::isfinite(t.k[k_offset(p, t, b, s, h, d)])) return true;
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          if (!std::isfinite(t.v[v_offset(p, t, b, s, h, d)])) return true;
      }
  }
  return false;
}

}  // namespace attnfuzz::test_util
