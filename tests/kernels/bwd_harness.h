// bwd_harness.h - test helper: runs a kernel's backward launch on a device (given o / lse, or its own
// forward first) with poisoned, slack-guarded outputs, and judges dQ, dK, dV against the gradient oracle.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnfuzz/device.h"
#include "attnfuzz/problem.h"
#include "attnfuzz/registry.h"
#include "oracle/grad.h"

namespace attnfuzz::bwd_harness {

constexpr size_t kSlack = 16384;  // poisoned floats after each gradient buffer: an overrun lands here
constexpr uint32_t kPoisonBits = 0x7fc0dead;
inline bool is_poison(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u == kPoisonBits;
}

struct Grads {
  LaunchResult fwd, bwd;
  std::vector<float> o, lse, dq, dk, dv;  // with p's strides
  bool oob_write = false;                 // something was written past the end of dQ, dK or dV
};

// Runs the backward launch of k (given o / lse), or its forward first when o / lse are empty (fwd+bwd).
inline Grads run_bwd(Device& dev, const af_kernel& k, const Problem& p, const std::vector<float>& q,
              const std::vector<float>& kk, const std::vector<float>& v, const std::vector<float>& dout,
              std::vector<float> o, std::vector<float> lse) {
  auto n = [](int64_t x) { return static_cast<size_t>(std::max<int64_t>(x, 1)); };
  const size_t nq = n(q_elements(p)), nk = n(k_elements(p)), nv = n(v_elements(p)), no = n(o_elements(p));
  const size_t nl = n(lse_elements(p));
  auto up = [&](const std::vector<float>& x, size_t count) {
    void* d = dev.alloc(count * 4);
    if (x.empty())
      dev.fill(d, &kPoisonBits, 4, count * 4);
    else
      dev.to_device(d, x.data(), count * 4);
    return d;
  };
  void* dq_ = up({}, nq + kSlack);
  void* dk_ = up({}, nk + kSlack);
  void* dv_ = up({}, nv + kSlack);
  void* q_ = up(q, nq);
  void* k_ = up(kk, nk);
  void* v_ = up(v, nv);
  void* do_ = up(dout, no);
  void* o_ = up(o, no);
  void* l_ = up(lse, nl);
  Grads g;
  if (o.empty()) {
    const size_t ws = k.workspace_bytes ? k.workspace_bytes(&p) : 0;
    void* w = ws ? dev.alloc(ws) : nullptr;
    af_buffers b{q_, k_, v_, o_, static_cast<float*>(l_), w};
    g.fwd = dev.launch(k, p, b);
    if (w) dev.free(w);
  }
  const size_t ws = k.bwd_workspace_bytes ? k.bwd_workspace_bytes(&p) : 0;
  void* w = ws ? dev.alloc(ws) : nullptr;
  if (w) dev.fill(w, &kPoisonBits, 4, ws & ~size_t{3});
  af_buffers b{q_, k_, v_, o_, static_cast<float*>(l_), w};
  b.dout = do_;
  b.dq = dq_;
  b.dk = dk_;
  b.dv = dv_;
  af_kernel kb = k;
  kb.launch = k.launch_bwd;  // the device layer runs k.launch; the backward goes through the same path
  g.bwd = dev.launch(kb, p, b);
  auto down = [&](void* d, size_t count) {
    std::vector<float> x(count);
    dev.to_host(x.data(), d, count * 4);
    dev.free(d);
    return x;
  };
  g.dq = down(dq_, nq + kSlack);
  g.dk = down(dk_, nk + kSlack);
  g.dv = down(dv_, nv + kSlack);
  auto slack_written = [](std::vector<float>& x, size_t n) {
    bool w = false;
    for (size_t i = n; i < x.size(); ++i) w |= !is_poison(x[i]);
    x.resize(n);
    return w;
  };
  g.oob_write = slack_written(g.dq, nq) | slack_written(g.dk, nk) | slack_written(g.dv, nv);
  g.o = down(o_, no);
  g.lse = down(l_, nl);
  for (void* x : {q_, k_, v_, do_, w})
    if (x) dev.free(x);
  return g;
}

// Every addressed element within the bound (NaN where the oracle says NaN), padding and slack untouched.
struct Judgement {
  int64_t bad_dq = 0, bad_dk = 0, bad_dv = 0, padding = 0;
  bool oob_write = false;
  double worst = 0;  // max err / bound over judged finite elements
  std::string first;
  bool failed() const { return bad_dq + bad_dk + bad_dv + padding > 0 || oob_write; }
};
inline Judgement judge(const Problem& p, const GradResult& r, const Grads& g) {
  Judgement j;
  j.oob_write = g.oob_write;
  std::vector<char> seen_q(g.dq.size()), seen_k(g.dk.size()), seen_v(g.dv.size());
  auto check = [&](double ex, double bound, float got, int64_t& bad, const std::string& where) {
    const bool ok = std::isnan(ex) ? std::isnan(got)
                                   : (std::isinf(bound) || (!std::isnan(got) && std::fabs(got - ex) <= bound));
    if (!std::isnan(ex) && !std::isinf(bound) && std::fabs(got - ex) > 0 && bound > 0)
      j.worst = std::max(j.worst, std::fabs(got - ex) / bound);
    if (!ok && bad++ == 0 && j.first.empty())
      j.first = where + " exact " + std::to_string(ex) + " got " + std::to_string(got) + " bound " + std::to_string(bound);
  };
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.seq_q; ++i)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const int64_t at = b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2] + d;
          seen_q[at] = 1;
          check(r.dq[r.dq_at(b, i, h, d)], r.dq_bound[r.dq_at(b, i, h, d)], g.dq[at], j.bad_dq,
                "dQ[" + std::to_string(i) + "," + std::to_string(h) + "," + std::to_string(d) + "]");
        }
    for (int64_t k = 0; k < p.seq_k; ++k)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const int64_t at = b * p.dk_stride[0] + k * p.dk_stride[1] + h * p.dk_stride[2] + d;
          seen_k[at] = 1;
          check(r.dk[r.dk_at(b, k, h, d)], r.dk_bound[r.dk_at(b, k, h, d)], g.dk[at], j.bad_dk,
                "dK[" + std::to_string(k) + "," + std::to_string(h) + "," + std::to_string(d) + "]");
        }
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const int64_t at = b * p.dv_stride[0] + k * p.dv_stride[1] + h * p.dv_stride[2] + d;
          seen_v[at] = 1;
          check(r.dv[r.dv_at(b, k, h, d)], r.dv_bound[r.dv_at(b, k, h, d)], g.dv[at], j.bad_dv,
                "dV[" + std::to_string(k) + "," + std::to_string(h) + "," + std::to_string(d) + "]");
        }
      }
  }
  auto pad = [&](const std::vector<float>& x, const std::vector<char>& seen, int64_t n) {
    if (n > 0)
      for (size_t i = 0; i < x.size(); ++i)
        if (!seen[i] && !is_poison(x[i])) ++j.padding;
  };
  pad(g.dq, seen_q, q_elements(p));
  pad(g.dk, seen_k, k_elements(p));
  pad(g.dv, seen_v, v_elements(p));
  return j;
}

inline void expect_within(const char* name, const Problem& p, const GradResult& r, const Grads& g, double& worst) {
  ASSERT_EQ(g.bwd.status, LaunchStatus::kOk) << name << ": " << g.bwd.message;
  const Judgement j = judge(p, r, g);
  worst = std::max(worst, j.worst);
  EXPECT_FALSE(j.failed()) << name << " " << describe(p) << ": dQ " << j.bad_dq << " dK " << j.bad_dk << " dV "
                           << j.bad_dv << " bad, padding " << j.padding << ", oob " << j.oob_write << ": " << j.first;
}

struct BwdInputs {
  std::vector<float> q, k, v, dout, o, lse;  // o / lse: the exact forward rounded to fp32
};
inline BwdInputs inputs(const Problem& p, uint64_t seed, float amp = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-amp, amp), g(-1.0f, 1.0f);
  BwdInputs in;
  auto fill = [&](std::vector<float>& x, int64_t n, bool unit) {
    x.resize(static_cast<size_t>(std::max<int64_t>(n, 1)));
    for (float& y : x) y = unit ? g(rng) : u(rng);
  };
  fill(in.q, q_elements(p), false);
  fill(in.k, k_elements(p), false);
  fill(in.v, v_elements(p), true);
  fill(in.dout, o_elements(p), true);
  OracleOptions fo;
  fo.threads = 1;
  fo.baseline = false;
  const OracleResult F = compute_oracle(p, in.q.data(), in.k.data(), in.v.data(), fo);
  in.o.assign(static_cast<size_t>(std::max<int64_t>(o_elements(p), 1)), 0.0f);
  in.lse.assign(static_cast<size_t>(std::max<int64_t>(lse_elements(p), 1)), 0.0f);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        in.lse[lse_index(p, b, h, i)] = static_cast<float>(F.lse[F.lse_at(b, h, i)]);
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          in.o[o_index(p, b, i, h, d)] = static_cast<float>(F.o[F.o_at(b, i, h, d)]);
      }
  return in;
}

inline GradResult oracle(const Problem& p, const BwdInputs& in, const std::vector<float>& o, const std::vector<float>& lse) {
  GradOptions go;
  go.fwd.threads = 1;
  return compute_grad_oracle(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), o.data(), lse.data(), go);
}

// Padded strides for every tensor, gradients included (rows and heads apart, gaps poisoned).
inline void pad_strides(Problem& p) {
  auto pad = [&](int64_t* st, int64_t H, int64_t S, int64_t W) {
    st[2] = W + 3;
    st[1] = H * st[2] + 5;
    st[0] = S * st[1] + 7;
  };
  pad(p.q_stride, p.heads_q, p.seq_q, p.head_dim);
  pad(p.k_stride, p.heads_kv, p.seq_k, p.head_dim);
  pad(p.v_stride, p.heads_kv, p.seq_k, p.head_dim_v);
  pad(p.o_stride, p.heads_q, p.seq_q, p.head_dim_v);
  for (int x = 0; x < 3; ++x) {
    p.do_stride[x] = p.o_stride[x];
    p.dq_stride[x] = p.q_stride[x];
    p.dk_stride[x] = p.k_stride[x];
    p.dv_stride[x] = p.v_stride[x];
  }
}

}  // namespace attnfuzz::bwd_harness
