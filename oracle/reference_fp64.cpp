// reference_fp64.cpp - the plain three-loop double-precision attention reference.
#include "oracle/reference_fp64.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnfuzz {

Fp64Result reference_fp64(const Problem& p, const float* q, const float* k, const float* v) {
  Fp64Result r;
  r.o.assign(static_cast<size_t>(p.batch * p.seq_q * p.heads_q * p.head_dim_v), 0.0);
  r.lse.assign(static_cast<size_t>(p.batch * p.heads_q * p.seq_q), -std::numeric_limits<double>::infinity());
  std::vector<double> s(static_cast<size_t>(std::max<int64_t>(p.seq_k, 1)));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = kv_head(p, h);
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeyRange kr = visible_keys(p, i);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = kr.first; j < kr.last; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < p.head_dim; ++d)
            acc += static_cast<double>(q[q_index(p, b, i, h, d)]) * k[k_index(p, b, j, hk, d)];
          s[j] = acc * static_cast<double>(p.scale);
          if (std::isnan(s[j]) || s[j] > m) m = std::isnan(m) ? m : s[j];  // std::max would drop a NaN
        }
        if (kr.empty() || m == -std::numeric_limits<double>::infinity()) continue;  // fully masked: O = 0
        double l = 0;
        for (int64_t j = kr.first; j < kr.last; ++j) l += (s[j] = std::exp(s[j] - m));
        r.lse[fp64_lse_index(p, b, h, i)] = m + std::log(l);
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          double o = 0;
          for (int64_t j = kr.first; j < kr.last; ++j) o += s[j] * v[v_index(p, b, j, hk, d)];
          r.o[fp64_o_index(p, b, i, h, d)] = o / l;
        }
      }
    }
  return r;
}

}  // namespace attnfuzz
