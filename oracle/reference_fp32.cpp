// reference_fp32.cpp - the plain fp32 attention reference (same-precision baseline).
#include "oracle/reference_fp32.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "oracle/lowp.h"
#include "oracle/reference_fp64.h"

namespace attnfuzz {

void reference_fp32_row(const Problem& p, const float* q, const float* k, const float* v, int64_t b,
                        int64_t h, int64_t s, float* o_row, float* lse) {
  const int64_t hk = kv_head(p, h);
  const KeyRange kr = visible_keys(p, s);
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> sc(static_cast<size_t>(std::max<int64_t>(kr.last - kr.first, 1)));
  float m = ninf;
  for (int64_t j = kr.first; j < kr.last; ++j) {
    float acc = 0;
    for (int64_t d = 0; d < p.head_dim; ++d) acc += q[q_index(p, b, s, h, d)] * k[k_index(p, b, j, hk, d)];
    const float x = acc * p.scale;
    sc[j - kr.first] = x;
    // NaN must win (a plain max drops it); +inf/NaN handled by IEEE below.
    if (std::isnan(x) || x > m) m = std::isnan(m) ? m : x;
  }
  if (kr.empty() || m == ninf) {
    for (int64_t d = 0; d < p.head_dim_v; ++d) o_row[d] = 0.0f;
    *lse = ninf;
    return;
  }
  float l = 0;
  for (int64_t j = kr.first; j < kr.last; ++j) l += (sc[j - kr.first] = std::exp(sc[j - kr.first] - m));
  // Key-outer loop (cache-friendly); each o_d is still the sequential sum over j.
  std::vector<float> acc(static_cast<size_t>(p.head_dim_v), 0.0f);
  for (int64_t j = kr.first; j < kr.last; ++j) {
    const float pj = sc[j - kr.first];
    const float* vj = v + v_index(p, b, j, hk, 0);
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] += pj * vj[d];
  }
  for (int64_t d = 0; d < p.head_dim_v; ++d) o_row[d] = acc[d] / l;
  *lse = m + std::log(l);
}

void reference_lowp_row(const Problem& p, const float* q, const float* k, const float* v, int64_t b, int64_t h,
                        int64_t s, int32_t dtype, LowpStyle style, float* o_row, float* lse) {
  auto rc = [dtype](float x) { return round_to_dtype(x, dtype); };
  const int64_t hk = kv_head(p, h), D = p.head_dim, Dv = p.head_dim_v;
  const KeyRange kr = visible_keys(p, s);
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t n = std::max<int64_t>(kr.last - kr.first, 0);
  std::vector<float> sc(static_cast<size_t>(std::max<int64_t>(n, 1)));
  const float sq = style == LowpStyle::kMath ? std::sqrt(p.scale) : 1.0f;
  std::vector<float> qr(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) qr[d] = rc(q[q_index(p, b, s, h, d)] * sq);
  float m = ninf;
  for (int64_t j = kr.first; j < kr.last; ++j) {
    float acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += qr[d] * rc(k[k_index(p, b, j, hk, d)] * sq);
    const float x = style == LowpStyle::kMath ? rc(acc) : acc * p.scale;
    sc[j - kr.first] = x;
    if (std::isnan(x) || x > m) m = std::isnan(m) ? m : x;
  }
  if (n == 0 || m == ninf) {
    for (int64_t d = 0; d < Dv; ++d) o_row[d] = 0.0f;
    *lse = ninf;
    return;
  }
  std::vector<float> acc(static_cast<size_t>(Dv), 0.0f);
  if (style == LowpStyle::kMath) {
    float l = 0;
    for (int64_t j = 0; j < n; ++j) l += (sc[j] = std::exp(sc[j] - m));
    for (int64_t j = 0; j < n; ++j) {
      const float pj = rc(sc[j] / l);
      const float* vj = v + v_index(p, b, kr.first + j, hk, 0);
      for (int64_t d = 0; d < Dv; ++d) acc[d] += pj * rc(vj[d]);
    }
    for (int64_t d = 0; d < Dv; ++d) o_row[d] = rc(acc[d]);
    *lse = m + std::log(l);
    return;
  }
  // Flash: online softmax over 64-key tiles, running max mi, running sum l (fp32).
  float mi = ninf, l = 0;
  for (int64_t t = 0; t < n; t += 64) {
    const int64_t e = std::min(n, t + 64);
    float mt = mi;
    for (int64_t j = t; j < e; ++j)
      if (std::isnan(sc[j]) || sc[j] > mt) mt = std::isnan(mt) ? mt : sc[j];
    if (mt == ninf) continue;
    const float alpha = mi == ninf ? 0.0f : std::exp(mi - mt);
    l *= alpha;
    for (auto& a : acc) a *= alpha;
    for (int64_t j = t; j < e; ++j) {
      const float pj = std::exp(sc[j] - mt);
      l += pj;
      const float pr = rc(pj);
      const float* vj = v + v_index(p, b, kr.first + j, hk, 0);
      for (int64_t d = 0; d < Dv; ++d) acc[d] += pr * rc(vj[d]);
    }
    mi = mt;
  }
  for (int64_t d = 0; d < Dv; ++d) o_row[d] = rc(acc[d] / l);
  *lse = mi + std::log(l);
}

Fp32Result reference_fp32(const Problem& p, const float* q, const float* k, const float* v) {
  Fp32Result r;
  r.o.assign(static_cast<size_t>(p.batch * p.seq_q * p.heads_q * p.head_dim_v), 0.0f);
  r.lse.assign(static_cast<size_t>(p.batch * p.heads_q * p.seq_q), 0.0f);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s)
        reference_fp32_row(p, q, k, v, b, h, s, &r.o[fp64_o_index(p, b, s, h, 0)],
                           &r.lse[fp64_lse_index(p, b, h, s)]);
  return r;
}

}  // namespace attnfuzz
