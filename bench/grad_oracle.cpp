// grad_oracle.cpp - benchmark: the gradient oracle's fast path vs a plain three-loop fp64 backward on the same
// case (S=256 D=64, S=1024 D=128, one thread each), and the S=4096 D=128 sampled backward check on 2 threads.
// Prints name=value lines. Usage: grad_oracle [--quick]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "oracle/grad.h"

namespace {

using attnfuzz::Problem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Inputs {
  std::vector<float> q, k, v, dout, o, lse;
};

Inputs make_inputs(const Problem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Inputs in;
  for (auto [x, count] : {std::make_pair(&in.q, attnfuzz::q_elements(p)), std::make_pair(&in.k, attnfuzz::k_elements(p)),
                          std::make_pair(&in.v, attnfuzz::v_elements(p)), std::make_pair(&in.dout, attnfuzz::o_elements(p))}) {
    x->resize(static_cast<size_t>(count));
    for (float& y : *x) y = n(rng);
  }
  attnfuzz::OracleOptions fo;
  fo.baseline = false;
  const attnfuzz::OracleResult F = attnfuzz::compute_oracle(p, in.q.data(), in.k.data(), in.v.data(), fo);
  in.o.resize(F.o.size());
  for (size_t i = 0; i < F.o.size(); ++i) in.o[i] = static_cast<float>(F.o[i]);
  in.lse.resize(F.lse.size());
  for (size_t i = 0; i < F.lse.size(); ++i) in.lse[i] = static_cast<float>(F.lse[i]);
  return in;
}

// The plain fp64 backward: per (b, h, i) the scores, softmax, O and Delta, then dP, dS and the three
// gradient updates (B = 1, contiguous, no mask, Hq = Hkv).
void plain_fp64_backward(const Problem& p, const Inputs& in, std::vector<double>& dq, std::vector<double>& dk,
                         std::vector<double>& dv) {
  const int64_t S = p.seq_q, Sk = p.seq_k, H = p.heads_q, D = p.head_dim, Dv = p.head_dim_v;
  dq.assign(static_cast<size_t>(S * H * D), 0.0);
  dk.assign(static_cast<size_t>(Sk * H * D), 0.0);
  dv.assign(static_cast<size_t>(Sk * H * Dv), 0.0);
  std::vector<double> P(static_cast<size_t>(Sk)), O(static_cast<size_t>(Dv));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < S; ++i) {
      const float* qi = &in.q[static_cast<size_t>((i * H + h) * D)];
      const float* g = &in.dout[static_cast<size_t>((i * H + h) * Dv)];
      double m = -INFINITY;
      for (int64_t j = 0; j < Sk; ++j) {
        const float* kj = &in.k[static_cast<size_t>((j * H + h) * D)];
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += static_cast<double>(qi[d]) * kj[d];
        P[j] = s * p.scale;
        m = std::max(m, P[j]);
      }
      double l = 0;
      for (int64_t j = 0; j < Sk; ++j) l += (P[j] = std::exp(P[j] - m));
      std::fill(O.begin(), O.end(), 0.0);
      for (int64_t j = 0; j < Sk; ++j) {
        P[j] /= l;
        const float* vj = &in.v[static_cast<size_t>((j * H + h) * Dv)];
        for (int64_t d = 0; d < Dv; ++d) O[d] += P[j] * vj[d];
      }
      double delta = 0;
      for (int64_t d = 0; d < Dv; ++d) delta += g[d] * O[d];
      double* dqi = &dq[static_cast<size_t>((i * H + h) * D)];
      for (int64_t j = 0; j < Sk; ++j) {
        const float* kj = &in.k[static_cast<size_t>((j * H + h) * D)];
        const float* vj = &in.v[static_cast<size_t>((j * H + h) * Dv)];
        double dp = 0;
        for (int64_t d = 0; d < Dv; ++d) dp += static_cast<double>(g[d]) * vj[d];
        const double ds = P[j] * (dp - delta) * p.scale;
        double* dkj = &dk[static_cast<size_t>((j * H + h) * D)];
        double* dvj = &dv[static_cast<size_t>((j * H + h) * Dv)];
        for (int64_t d = 0; d < D; ++d) dqi[d] += ds * kj[d], dkj[d] += ds * qi[d];
        for (int64_t d = 0; d < Dv; ++d) dvj[d] += P[j] * g[d];
      }
    }
}

void side_by_side(const char* tag, int64_t S, int64_t D) {
  const Problem p = attnfuzz::make_problem(1, 1, 1, S, S, D, D);
  const Inputs in = make_inputs(p, 42);
  std::vector<double> dq, dk, dv;
  auto t0 = Clock::now();
  plain_fp64_backward(p, in, dq, dk, dv);
  const double plain = seconds_since(t0);
  attnfuzz::GradOptions go;
  go.fwd.threads = 1;
  t0 = Clock::now();
  const attnfuzz::GradResult g =
      attnfuzz::compute_grad_oracle(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), in.o.data(), in.lse.data(), go);
  const double oracle = seconds_since(t0);
  double maxdiff = 0;
  for (size_t i = 0; i < dk.size(); ++i) maxdiff = std::max(maxdiff, std::fabs(dk[i] - g.dk[i]) / (g.dk_bound[i] + 1e-300));
  std::printf("%s.plain_fp64_s=%.4f\n%s.oracle_s=%.4f\n%s.ratio=%.2f\n%s.rows_fast=%lld\n%s.rows_mp=%lld\n",
              tag, plain, tag, oracle, tag, oracle / plain, tag, (long long)g.rows_fast, tag, (long long)g.rows_mp);
  std::printf("%s.plain_fp64_dk_err_over_bound=%.3g\n", tag, maxdiff);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 2 || (argc > 1 && !quick)) {
    std::fprintf(stderr, "usage: %s [--quick]\n", "grad_oracle");
    return 2;
  }
  side_by_side("s256_d64", 256, 64);
  if (quick) return 0;
  side_by_side("s1024_d128", 1024, 128);
  // Sampled backward check on 2 threads: the exact forward over every row (what the kernel is given, reused
  // by the gradient oracle through GradOptions::forward), then sampled dQ rows and dK / dV keys.
  const Problem p = attnfuzz::make_problem(1, 1, 1, 4096, 4096, 128, 128);
  std::vector<float> q, k, v, dout;
  {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto* x : {&q, &k, &v, &dout}) {
      x->resize(4096 * 128);
      for (float& y : *x) y = n(rng);
    }
  }
  auto t0 = Clock::now();
  attnfuzz::OracleOptions fo;
  fo.threads = 2;
  fo.baseline = false;
  const attnfuzz::OracleResult F = attnfuzz::compute_oracle(p, q.data(), k.data(), v.data(), fo);
  std::vector<float> o(F.o.size()), lse(F.lse.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<float>(F.o[i]);
  for (size_t i = 0; i < lse.size(); ++i) lse[i] = static_cast<float>(F.lse[i]);
  const double fwd_s = seconds_since(t0);
  attnfuzz::GradOptions go;
  go.fwd.threads = 2;
  go.q_budget = 256;
  go.k_budget = 256;
  go.forward = &F;
  t0 = Clock::now();
  const attnfuzz::GradResult g =
      attnfuzz::compute_grad_oracle(p, q.data(), k.data(), v.data(), dout.data(), o.data(), lse.data(), go);
  const double grad_s = seconds_since(t0);
  std::printf("s4096_d128_sampled.threads=2\ns4096_d128_sampled.q_rows=%zu\ns4096_d128_sampled.k_keys=%zu\n"
              "s4096_d128_sampled.forward_s=%.2f\ns4096_d128_sampled.grad_s=%.2f\ns4096_d128_sampled.check_s=%.2f\n",
              g.sampled_q.size(), g.sampled_k.size(), fwd_s, grad_s, fwd_s + grad_s);
  return 0;
}
