// fp32_models.h - fp32 models of kernel strategies (online tiles, split-KV, approximate exp2, a missing
// rescale) and a small random case generator, for the oracle / compare tests and the bound benchmarks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnfuzz/problem.h"

namespace attnfuzz::testing {

// Deterministic 64-bit generator (splitmix64) with uniform / normal helpers.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * 0x1p-53; }                   // [0, 1)
  double uniform(double a, double b) { return a + (b - a) * uniform(); }  // [a, b)
  int64_t range(int64_t a, int64_t b) { return a + static_cast<int64_t>(next() % uint64_t(b - a + 1)); }
  double normal() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

enum class ExpKind {
  kExpf,    // expf(s - m)
  kExp2,    // exp2f(s * log2e - m * log2e) with the scale folded into log2e (what FA kernels do)
  kApprox,  // kExp2 then a random relative error of up to `approx_ulps` ulp (hardware ex2.approx)
};

struct ModelOptions {
  int64_t tile = 32;   // keys per online-softmax step (1 = row-online, >= Sk = materialized)
  int64_t splits = 1;  // split-KV: number of key splits combined through their LSE
  ExpKind exp = ExpKind::kExpf;
  double approx_ulps = 4;
  bool missing_rescale = false;  // planted bug: acc is not multiplied by exp(m_old - m_new)
  bool reverse_tiles = false;    // process the key tiles last to first
  uint64_t seed = 1;             // for kApprox
};

// Kernel-like output: O with p's o strides, LSE with p's lse strides.
struct ModelOut {
  std::vector<float> o, lse;
};

namespace detail {
struct Part {
  float m, l;
  std::vector<float> acc;
};
inline float approx(float x, const ModelOptions& mo, Rng& rng) {
  if (mo.exp != ExpKind::kApprox || x == 0) return x;
  return x * static_cast<float>(1 + mo.approx_ulps * 0x1p-24 * rng.uniform(-1, 1));
}
// Online softmax over keys [a, e) in tiles. Scores are in the exp domain (natural or base 2).
inline Part online(const Problem& p, const float* q, const float* k, const float* v, int64_t b, int64_t h,
                   int64_t s, int64_t a, int64_t e, const ModelOptions& mo, Rng& rng) {
  const int64_t hk = kv_head(p, h), Dv = p.head_dim_v;
  const bool two = mo.exp != ExpKind::kExpf;
  const float sc = two ? p.scale * 1.44269504f : p.scale;
  Part P{-std::numeric_limits<float>::infinity(), 0.0f, std::vector<float>(Dv, 0.0f)};
  const int64_t T = std::max<int64_t>(mo.tile, 1);
  std::vector<int64_t> starts;
  for (int64_t t = a; t < e; t += T) starts.push_back(t);
  if (mo.reverse_tiles) std::reverse(starts.begin(), starts.end());
  std::vector<float> sv(T);
  for (int64_t t0 : starts) {
    const int64_t t1 = std::min(e, t0 + T);
    float mt = P.m;
    for (int64_t j = t0; j < t1; ++j) {
      float acc = 0;
      for (int64_t d = 0; d < p.head_dim; ++d) acc += q[q_index(p, b, s, h, d)] * k[k_index(p, b, j, hk, d)];
      sv[j - t0] = acc * sc;
      mt = std::max(mt, sv[j - t0]);
    }
    if (mt == -std::numeric_limits<float>::infinity()) continue;
    const float alpha = approx(two ? std::exp2(P.m - mt) : std::exp(P.m - mt), mo, rng);
    P.l *= alpha;
    if (!mo.missing_rescale)
      for (auto& x : P.acc) x *= alpha;
    for (int64_t j = t0; j < t1; ++j) {
      const float pj = approx(two ? std::exp2(sv[j - t0] - mt) : std::exp(sv[j - t0] - mt), mo, rng);
      P.l += pj;
      for (int64_t d = 0; d < Dv; ++d) P.acc[d] += pj * v[v_index(p, b, j, hk, d)];
    }
    P.m = mt;
  }
  return P;
}
}  // namespace detail

inline ModelOut run_model(const Problem& p, const float* q, const float* k, const float* v,
                          const ModelOptions& mo) {
  ModelOut out;
  out.o.assign(static_cast<size_t>(o_elements(p)), 0.0f);
  out.lse.assign(static_cast<size_t>(lse_elements(p)), 0.0f);
  Rng rng(mo.seed);
  const bool two = mo.exp != ExpKind::kExpf;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const KeyRange kr = visible_keys(p, s);
        const int64_t n = std::max<int64_t>(kr.last - kr.first, 0);
        const int64_t ns = std::max<int64_t>(1, std::min<int64_t>(mo.splits, std::max<int64_t>(n, 1)));
        std::vector<detail::Part> parts;
        for (int64_t i = 0; i < ns; ++i) {
          const int64_t a = kr.first + n * i / ns, e = kr.first + n * (i + 1) / ns;
          parts.push_back(detail::online(p, q, k, v, b, h, s, a, e, mo, rng));
        }
        float* o = &out.o[o_index(p, b, s, h, 0)];
        float& lse = out.lse[lse_index(p, b, h, s)];
        if (ns == 1) {
          const detail::Part& P = parts[0];
          if (P.m == ninf) {
            std::fill(o, o + p.head_dim_v, 0.0f);
            lse = ninf;
            continue;
          }
          for (int64_t d = 0; d < p.head_dim_v; ++d) o[d] = P.acc[d] / P.l;
          lse = two ? (P.m + std::log2(P.l)) * 0.693147182f : P.m + std::log(P.l);
          continue;
        }
        // Split-KV: each part normalised with its own LSE (natural log), then a logsumexp combine.
        std::vector<float> ls(ns);
        float M = ninf;
        for (int64_t i = 0; i < ns; ++i) {
          const detail::Part& P = parts[i];
          ls[i] = P.m == ninf ? ninf : (two ? (P.m + std::log2(P.l)) * 0.693147182f : P.m + std::log(P.l));
          M = std::max(M, ls[i]);
        }
        if (M == ninf) {
          std::fill(o, o + p.head_dim_v, 0.0f);
          lse = ninf;
          continue;
        }
        float sum = 0;
        for (int64_t i = 0; i < ns; ++i) sum += std::exp(ls[i] - M);
        lse = M + std::log(sum);
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          float acc = 0;
          for (int64_t i = 0; i < ns; ++i)
            if (ls[i] != ninf) acc += std::exp(ls[i] - lse) * (parts[i].acc[d] / parts[i].l);
          o[d] = acc;
        }
      }
  return out;
}

// A random small case: shape, mask and value distribution drawn from rng; logit magnitude up to
// max_logit (the largest |s| is about max_logit).
struct RandomCase {
  Problem p{};
  std::vector<float> q, k, v;
};
inline RandomCase random_case(Rng& rng, int64_t max_s = 24, int64_t max_d = 40, double max_logit = 1e4) {
  RandomCase c;
  const int64_t hkv = rng.range(1, 2), g = rng.range(1, 2);
  Problem& p = c.p;
  p = make_problem(rng.range(1, 2), hkv * g, hkv, rng.range(1, max_s), rng.range(0, max_s),
                   rng.range(1, max_d), rng.range(1, max_d));
  switch (rng.range(0, 5)) {
    case 0:
      break;
    case 1:
      p.mask_kind = AF_MASK_CAUSAL, p.mask_align = AF_ALIGN_TOP_LEFT, p.window_right = 0;
      break;
    case 2:
      p.mask_kind = AF_MASK_CAUSAL, p.mask_align = AF_ALIGN_BOTTOM_RIGHT, p.window_right = 0;
      break;
    default:
      p.mask_kind = AF_MASK_WINDOW;
      p.mask_align = rng.range(0, 1) ? AF_ALIGN_TOP_LEFT : AF_ALIGN_BOTTOM_RIGHT;
      p.window_left = rng.range(0, 3) == 0 ? AF_UNBOUNDED : rng.range(0, max_s);
      p.window_right = rng.range(0, 3) == 0 ? AF_UNBOUNDED : rng.range(0, max_s);
  }
  // Logit scale: |s| ~ sigma_q * sigma_k * sqrt(D) * scale ~ sigma_q * sigma_k.
  const int kind = static_cast<int>(rng.range(0, 6));
  double target = 1;
  switch (kind) {
    case 0:
      target = 1;
      break;
    case 1:
      target = 10;
      break;
    case 2:
      target = std::pow(10.0, rng.uniform(0, std::log10(max_logit)));
      break;
    case 3:
      target = max_logit;
      break;
    case 4:
      target = 1e-3;
      break;
    default:
      target = std::pow(10.0, rng.uniform(-2, 2));
      break;
  }
  const double sq = std::sqrt(target), sk = std::sqrt(target);
  const double voff = rng.range(0, 3) == 0 ? rng.uniform(-1000, 1000) : 0.0;
  const double vsig = std::pow(10.0, rng.uniform(-3, 3));
  const bool sparse = rng.range(0, 4) == 0;
  c.q.resize(q_elements(p));
  c.k.resize(k_elements(p));
  c.v.resize(v_elements(p));
  for (auto& x : c.q) x = static_cast<float>(sq * rng.normal());
  for (auto& x : c.k) x = static_cast<float>(sk * rng.normal());
  for (auto& x : c.v) x = sparse && rng.range(0, 2) ? 0.0f : static_cast<float>(voff + vsig * rng.normal());
  return c;
}

}  // namespace attnfuzz::testing
