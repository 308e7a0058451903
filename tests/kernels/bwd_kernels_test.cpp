// bwd_kernels_test.cpp - every built-in backward launch (cpu backend) against the gradient oracle's bound:
// shapes, masks of both alignments, GQA, Dv != D, padded strides, empty rows, NaN, and fed by its own forward.
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

namespace attnfuzz {
namespace {

constexpr uint32_t kPoisonBits = 0x7fc0dead;
bool is_poison(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u == kPoisonBits;
}

std::vector<const KernelEntry*> bwd_kernels() {
  std::vector<const KernelEntry*> out;
  for (const KernelEntry& e : Registry::global().all())
    if (e.backend == Backend::kCpu && e.kernel.launch_bwd && std::string(e.kernel.family).rfind("planted", 0) != 0)
      out.push_back(&e);
  return out;
}

struct Grads {
  LaunchResult fwd, bwd;
  std::vector<float> o, lse, dq, dk, dv;  // with p's strides
};

// Runs the backward launch of k (given o / lse), or its forward first when o / lse are empty (fwd+bwd).
Grads run_bwd(Device& dev, const af_kernel& k, const Problem& p, const std::vector<float>& q,
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
  void* dq_ = up({}, nq);
  void* dk_ = up({}, nk);
  void* dv_ = up({}, nv);
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
  g.dq = down(dq_, nq);
  g.dk = down(dk_, nk);
  g.dv = down(dv_, nv);
  g.o = down(o_, no);
  g.lse = down(l_, nl);
  for (void* x : {q_, k_, v_, do_, w})
    if (x) dev.free(x);
  return g;
}

// Every addressed element within the bound (NaN where the oracle says NaN), padding untouched.
void expect_within(const char* name, const Problem& p, const GradResult& r, const Grads& g, double& worst) {
  ASSERT_EQ(g.bwd.status, LaunchStatus::kOk) << name << ": " << g.bwd.message;
  int64_t bad = 0;
  std::string first;
  std::vector<char> seen_q(g.dq.size()), seen_k(g.dk.size()), seen_v(g.dv.size());
  auto check = [&](double ex, double bound, float got, const std::string& where) {
    const bool ok = std::isnan(ex) ? std::isnan(got)
                                   : (std::isinf(bound) || (!std::isnan(got) && std::fabs(got - ex) <= bound));
    if (!std::isnan(ex) && !std::isinf(bound) && std::fabs(got - ex) > 0 && bound > 0)
      worst = std::max(worst, std::fabs(got - ex) / bound);
    if (!ok && bad++ == 0) first = where + " exact " + std::to_string(ex) + " got " + std::to_string(got) +
                                   " bound " + std::to_string(bound);
  };
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.seq_q; ++i)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const int64_t at = b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2] + d;
          seen_q[at] = 1;
          check(r.dq[r.dq_at(b, i, h, d)], r.dq_bound[r.dq_at(b, i, h, d)], g.dq[at],
                "dQ[" + std::to_string(i) + "," + std::to_string(h) + "," + std::to_string(d) + "]");
        }
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const int64_t at = b * p.dk_stride[0] + j * p.dk_stride[1] + h * p.dk_stride[2] + d;
          seen_k[at] = 1;
          check(r.dk[r.dk_at(b, j, h, d)], r.dk_bound[r.dk_at(b, j, h, d)], g.dk[at],
                "dK[" + std::to_string(j) + "," + std::to_string(h) + "," + std::to_string(d) + "]");
        }
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const int64_t at = b * p.dv_stride[0] + j * p.dv_stride[1] + h * p.dv_stride[2] + d;
          seen_v[at] = 1;
          check(r.dv[r.dv_at(b, j, h, d)], r.dv_bound[r.dv_at(b, j, h, d)], g.dv[at],
                "dV[" + std::to_string(j) + "," + std::to_string(h) + "," + std::to_string(d) + "]");
        }
      }
  }
  for (size_t x = 0; x < g.dq.size(); ++x)
    if (!seen_q[x] && !is_poison(g.dq[x]) && q_elements(p) > 0) ++bad, first = first.empty() ? "dQ padding written" : first;
  for (size_t x = 0; x < g.dk.size(); ++x)
    if (!seen_k[x] && !is_poison(g.dk[x]) && k_elements(p) > 0) ++bad, first = first.empty() ? "dK padding written" : first;
  EXPECT_EQ(bad, 0) << name << " " << describe(p) << ": " << first;
}

struct BwdInputs {
  std::vector<float> q, k, v, dout, o, lse;  // o / lse: the exact forward rounded to fp32
};
BwdInputs inputs(const Problem& p, uint64_t seed, float amp = 1.0f) {
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

GradResult oracle(const Problem& p, const BwdInputs& in, const std::vector<float>& o, const std::vector<float>& lse) {
  GradOptions go;
  go.fwd.threads = 1;
  return compute_grad_oracle(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), o.data(), lse.data(), go);
}

// Padded strides for every tensor, gradients included (rows and heads apart, gaps poisoned).
void pad_strides(Problem& p) {
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

TEST(BwdKernels, ThereAreThreeBuiltInBackwardFamilies) {
  std::vector<std::string> names;
  for (const KernelEntry* e : bwd_kernels()) names.push_back(e->kernel.name);
  for (const char* want : {"materialized", "flash-bm16-bn16", "flash-bm16-bn32", "flash-bm32-bn32"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
}

TEST(BwdKernels, SweepOfShapesMasksGqaAndStridesStaysInsideTheBound) {
  auto dev = open_device(Backend::kCpu, DeviceOptions{});
  const char* masks[] = {"none", "causal-br", "causal-tl", "window:5,3-br", "window:2,0-tl", "window:0,0-tl"};
  struct Shape {
    int64_t b, hq, hkv, sq, sk, d, dv;
  };
  const Shape shapes[] = {{1, 1, 1, 1, 1, 1, 1},    {1, 2, 1, 17, 33, 8, 8}, {2, 4, 2, 9, 5, 16, 7},
                          {1, 3, 1, 40, 19, 5, 12}, {1, 2, 2, 33, 0, 4, 4},  {1, 1, 1, 70, 66, 128, 128}};
  double worst = 0;
  uint64_t seed = 1;
  for (const KernelEntry* e : bwd_kernels())
    for (const Shape& s : shapes)
      for (const char* m : masks) {
        if (s.d == 128 && std::string(m) != "causal-br" && std::string(m) != "none") continue;
        Problem p = make_problem(s.b, s.hq, s.hkv, s.sq, s.sk, s.d, s.dv);
        ASSERT_EQ(parse_mask(m, p), "");
        if (seed % 3 == 0) pad_strides(p);
        const BwdInputs in = inputs(p, seed++);
        const Grads g = run_bwd(*dev, e->kernel, p, in.q, in.k, in.v, in.dout, in.o, in.lse);
        expect_within(e->kernel.name, p, oracle(p, in, in.o, in.lse), g, worst);
      }
  std::printf("built-in backward kernels: worst err/bound %.3g\n", worst);
}

TEST(BwdKernels, FedByTheirOwnForwardStayInsideTheBound) {
  auto dev = open_device(Backend::kCpu, DeviceOptions{});
  double worst = 0;
  for (const KernelEntry* e : bwd_kernels()) {
    Problem p = make_problem(1, 4, 2, 37, 29, 24, 16);
    ASSERT_EQ(parse_mask("causal-tl", p), "");
    const BwdInputs in = inputs(p, 77, 3.0f);
    const Grads g = run_bwd(*dev, e->kernel, p, in.q, in.k, in.v, in.dout, {}, {});
    ASSERT_EQ(g.fwd.status, LaunchStatus::kOk);
    expect_within(e->kernel.name, p, oracle(p, in, g.o, g.lse), g, worst);
  }
}

TEST(BwdKernels, NaNInDoReachesTheGradientsItShould) {
  auto dev = open_device(Backend::kCpu, DeviceOptions{});
  double worst = 0;
  for (const KernelEntry* e : bwd_kernels()) {
    Problem p = make_problem(1, 2, 1, 20, 20, 8, 8);
    ASSERT_EQ(parse_mask("window:3,1-br", p), "");
    BwdInputs in = inputs(p, 5);
    in.dout[o_index(p, 0, 7, 1, 2)] = std::numeric_limits<float>::quiet_NaN();
    in.q[q_index(p, 0, 12, 0, 0)] = std::numeric_limits<float>::quiet_NaN();  // a masked-from-most NaN row
    const BwdInputs in2 = inputs(p, 5);
    (void)in2;
    // o / lse of the NaN-q row: what the exact forward gives (NaN).
    OracleOptions fo;
    fo.threads = 1;
    const OracleResult F = compute_oracle(p, in.q.data(), in.k.data(), in.v.data(), fo);
    for (int64_t d = 0; d < 8; ++d) in.o[o_index(p, 0, 12, 0, d)] = static_cast<float>(F.o[F.o_at(0, 12, 0, d)]);
    in.lse[lse_index(p, 0, 0, 12)] = static_cast<float>(F.lse[F.lse_at(0, 0, 12)]);
    const Grads g = run_bwd(*dev, e->kernel, p, in.q, in.k, in.v, in.dout, in.o, in.lse);
    expect_within(e->kernel.name, p, oracle(p, in, in.o, in.lse), g, worst);
  }
}

}  // namespace
}  // namespace attnfuzz
