// dropout_test.cpp - dropout in the oracle (issue 29): a hand value, p = 0 = the dropout-free result, the arbiter, and
// dQ, dK, dV given a keep mask against central finite differences of the exact forward.
#include <gtest/gtest.h>

#include <cmath>

#include "attnfuzz/case.h"
#include "attnfuzz/dropout.h"
#include "oracle/grad.h"
#include "oracle/oracle.h"
#include "tests/oracle/oracle_options.h"

namespace attnfuzz {
namespace {

using test_util::k1Thread;

TEST(OracleDropout, KeptWeightsScaledByOneOverOneMinusP) {
  Problem p = make_problem(1, 1, 1, 1, 2, 1, 1);
  p.scale = 1.0f;
  ASSERT_EQ(set_dropout(p, 0.25, AF_DROPOUT_RNG_EXPORTED, 1, 0), "");
  const std::vector<float> q{1.0f}, k{1.0f, 0.0f}, v{1.0f, 3.0f};
  const std::vector<uint8_t> keep{0, 1};  // key 0 dropped
  VariantInputs vars;
  vars.dropout_keep = keep.data();
  const OracleResult r = compute_oracle(p, q.data(), k.data(), v.data(), vars, k1Thread);
  const double e = std::exp(1.0), L = e + 1;
  EXPECT_NEAR(r.o[0], (1 / L) * 3 / 0.75, 1e-15);
  EXPECT_NEAR(r.lse[0], 1 + std::log(1 + 1 / e), 1e-15);  // the softmax (and LSE) does not see the mask
  EXPECT_GT(r.o_bound[0], 0.0);
}

Case random_case(double drop_p, uint64_t seed) {
  Case c = make_case(make_problem(2, 2, 1, 9, 21, 5, 6), seed);
  (void)parse_mask("causal-br", c.problem);
  EXPECT_EQ(set_dropout(c.problem, drop_p, AF_DROPOUT_RNG_PHILOX_FLASH, seed * 7 + 1, 0), "");
  c.pass = Pass::kBwd;
  return c;
}

TEST(OracleDropout, PZeroIsTheDropoutFreeResultAndTheArbiterAgrees) {
  const Case c = random_case(0.0, 3);
  const Tensors t = generate(c);
  const std::vector<uint8_t> keep = reference_keep_mask(c.problem);
  VariantInputs vars;
  vars.dropout_keep = keep.data();
  Problem plain = c.problem;
  plain.variants = 0;
  OracleOptions o = k1Thread;
  o.baseline = false;
  const OracleResult a = compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), vars, o);
  const OracleResult b = compute_oracle(plain, t.q.data(), t.k.data(), t.v.data(), o);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.o_bound, b.o_bound);
  EXPECT_EQ(a.lse, b.lse);
  const Case d = random_case(0.4, 5);
  const Tensors td = generate(d);
  const std::vector<uint8_t> kd = reference_keep_mask(d.problem);
  vars.dropout_keep = kd.data();
  const OracleResult fast = compute_oracle(d.problem, td.q.data(), td.k.data(), td.v.data(), vars, o);
  o.force_multiprecision = true;
  const OracleResult mp = compute_oracle(d.problem, td.q.data(), td.k.data(), td.v.data(), vars, o);
  for (size_t n = 0; n < fast.o.size(); ++n) {
    EXPECT_NEAR(fast.o[n], mp.o[n], 1e-14 * (1 + std::fabs(mp.o[n])));
    EXPECT_LE(std::fabs(fast.o[n] - mp.o[n]), fast.o_bound[n] * 1e-6);
  }
}

// L(q, k, v) = sum dO . O with the mask fixed: its gradients are dQ, dK, dV.
double loss(const Problem& p, const Tensors& t, const std::vector<float>& q, const std::vector<float>& k,
            const std::vector<float>& v, const VariantInputs& vars) {
  OracleOptions o = k1Thread;
  o.baseline = false;
  const OracleResult r = compute_oracle(p, q.data(), k.data(), v.data(), vars, o);
  double l = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim_v; ++d) l += t.dout[o_index(p, b, s, h, d)] * r.o[r.o_at(b, s, h, d)];
  return l;
}

TEST(OracleDropout, GradientsMatchFiniteDifferencesGivenTheMask) {
  const Case c = random_case(0.3, 11);
  const Tensors t = generate(c);
  const Problem& p = c.problem;
  const std::vector<uint8_t> keep = reference_keep_mask(p);
  VariantInputs vars;
  vars.dropout_keep = keep.data();
  OracleOptions o = k1Thread;
  o.baseline = false;
  o.row_budget = 0;
  const OracleResult fw = compute_oracle(p, t.q.data(), t.k.data(), t.v.data(), vars, o);
  std::vector<float> go(t.dout.size()), gl(static_cast<size_t>(lse_elements(p)));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        gl[lse_index(p, b, h, s)] = static_cast<float>(fw.lse[fw.lse_at(b, h, s)]);
        for (int64_t d = 0; d < p.head_dim_v; ++d) go[o_index(p, b, s, h, d)] = static_cast<float>(fw.o[fw.o_at(b, s, h, d)]);
      }
  GradOptions g;
  g.fwd = o;
  const GradResult gr = compute_grad_oracle(p, t.q.data(), t.k.data(), t.v.data(), t.dout.data(), go.data(), gl.data(),
                                            vars, g);
  auto fd = [&](char which, size_t at) {
    std::vector<float> q = t.q, k = t.k, v = t.v;
    std::vector<float>& x = which == 'q' ? q : which == 'k' ? k : v;
    const float x0 = x[at], hp = x0 + 1e-3f, hm = x0 - 1e-3f;
    x[at] = hp;
    const double lp = loss(p, t, q, k, v, vars);
    x[at] = hm;
    const double lm = loss(p, t, q, k, v, vars);
    return (lp - lm) / (static_cast<double>(hp) - static_cast<double>(hm));
  };
  int checked = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s : {0, 4, 8})
      for (int64_t d = 0; d < p.head_dim; ++d) {
        EXPECT_NEAR(gr.dq[gr.dq_at(b, s, 1, d)], fd('q', q_index(p, b, s, 1, d)), 1e-5) << "dQ " << b << s << d;
        ++checked;
      }
  for (int64_t j : {0, 7, 20})
    for (int64_t d = 0; d < p.head_dim; ++d) {
      EXPECT_NEAR(gr.dk[gr.dk_at(1, j, 0, d)], fd('k', k_index(p, 1, j, 0, d)), 1e-5) << "dK " << j << d;
      EXPECT_NEAR(gr.dv[gr.dv_at(1, j, 0, d)], fd('v', v_index(p, 1, j, 0, d)), 1e-5) << "dV " << j << d;
      checked += 2;
    }
  EXPECT_GT(checked, 50);
}

}  // namespace
}  // namespace attnfuzz
