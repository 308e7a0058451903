// variants_test.cpp - the score variants in the oracle (issue 28): sinks, softcap, ALiBi, bias against
// hand-computed values; the fast path against the multiprecision arbiter; gradients (d sink, d bias, dQ
// through tanh) against central finite differences of the exact forward; the sink alone on an empty row;
// per-head fp8 descales against the per-tensor branch on each (b, head) slice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "oracle/grad.h"
#include "oracle/lowp.h"
#include "oracle/oracle.h"
#include "tests/oracle/oracle_options.h"

namespace attnfuzz {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using test_util::k1Thread;

// One row, D = Dv = 1: q = 1, k = (1, 0), v = (1, 0), scale 1: raw scores (1, 0).
struct Tiny {
  Problem p = make_problem(1, 1, 1, 1, 2, 1, 1);
  std::vector<float> q{1.0f}, k{1.0f, 0.0f}, v{1.0f, 0.0f};
  std::vector<float> sinks{0.0f}, slopes{0.5f}, bias{0.25f, -0.75f};
  Tiny() {
    p.scale = 1.0f;
    p.mask_align = AF_ALIGN_TOP_LEFT;  // ALiBi distances from key 0 (make_problem aligns bottom-right)
  }
  VariantInputs vars() const { return {sinks.data(), slopes.data(), bias.data()}; }
  OracleResult run() const { return compute_oracle(p, q.data(), k.data(), v.data(), vars(), k1Thread); }
};

// Exact O and LSE of one row from final scores s and an optional sink.
void expect_row(const OracleResult& r, double s0, double s1, double sink, bool has_sink) {
  const double m = std::max({s0, s1, has_sink ? sink : -kInf});
  const double L = std::exp(s0 - m) + std::exp(s1 - m) + (has_sink ? std::exp(sink - m) : 0.0);
  EXPECT_NEAR(r.o[0], std::exp(s0 - m) / L, 1e-15);
  EXPECT_NEAR(r.lse[0], m + std::log(L), 1e-15);
  EXPECT_GT(r.o_bound[0], 0.0);
}

TEST(OracleVariants, SinkEntersTheDenominatorOnly) {
  Tiny t;
  t.p.variants = AF_VARIANT_SINK;
  expect_row(t.run(), 1, 0, 0, true);  // O = e / (e + 1 + 1), LSE = log(e + 2)
  t.sinks[0] = -std::numeric_limits<float>::infinity();  // -inf = no sink
  expect_row(t.run(), 1, 0, 0, false);
}

TEST(OracleVariants, SoftcapAlibiAndBias) {
  Tiny t;
  t.p.variants = AF_VARIANT_SOFTCAP;
  t.p.softcap = 0.5f;
  expect_row(t.run(), 0.5 * std::tanh(2.0), 0, 0, false);
  t.p.variants = AF_VARIANT_ALIBI;  // top-left: key 0 at distance 0, key 1 at distance 1
  expect_row(t.run(), 1, -0.5, 0, false);
  t.p.variants = AF_VARIANT_BIAS;
  ASSERT_EQ(set_bias_strides(t.p, "bhi"), "");
  expect_row(t.run(), 1.25, -0.75, 0, false);
  t.p.variants = AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_BIAS | AF_VARIANT_SINK;
  expect_row(t.run(), 0.5 * std::tanh(2.0) + 0.25, -0.75 - 0.5, 0, true);
}

TEST(OracleVariants, AlibiFollowsTheMaskAlignment) {
  Tiny t;
  t.p.variants = AF_VARIANT_ALIBI;
  t.p.mask_align = AF_ALIGN_BOTTOM_RIGHT;  // off = Sk - Sq = 1: key 1 is on the diagonal
  expect_row(t.run(), 1 - 0.5, 0, 0, false);
}

TEST(OracleVariants, SinkAloneOnAnEmptyRow) {
  Problem p = make_problem(1, 1, 1, 2, 1, 4, 4);  // causal-br with Sq > Sk: row 0 sees no key
  ASSERT_EQ(parse_mask("causal-br", p), "");
  p.variants = AF_VARIANT_SINK;
  std::vector<float> q(8, 0.5f), k(4, 0.25f), v(4, 1.0f), sinks{1.5f};
  const OracleResult r = compute_oracle(p, q.data(), k.data(), v.data(), VariantInputs{sinks.data()}, k1Thread);
  EXPECT_EQ(r.o[r.o_at(0, 0, 0, 0)], 0.0);
  EXPECT_EQ(r.o_bound[r.o_at(0, 0, 0, 0)], 0.0);  // exactly 0
  EXPECT_EQ(r.lse[r.lse_at(0, 0, 0)], 1.5);       // LSE = the sink
  EXPECT_GT(r.lse_bound[r.lse_at(0, 0, 0)], 0.0);
  EXPECT_EQ(r.row(0, 0, 0).kind, RowKind::kNormal);
}

// A key of bias -inf weighs nothing (merge states give every key outside the state's range one, check/merge.cpp): its
// k and v do not change O, LSE or the bounds, but its products still meet the fp32 range test (with their own value
// reported), and a NaN k or an infinite v still makes the row NaN / outside the contract.
TEST(OracleVariants, ANegInfBiasKeyWeighsNothingButMeetsTheContract) {
  Problem p = make_problem(1, 1, 1, 1, 3, 4, 4);
  p.variants = AF_VARIANT_BIAS;
  p.bias_stride[0] = p.bias_stride[1] = p.bias_stride[2] = 0;
  p.bias_stride[3] = 1;
  const std::vector<float> bias{0.0f, 0.5f, -std::numeric_limits<float>::infinity()};
  std::vector<float> q{0.5f, -1.0f, 0.25f, 2.0f}, k(12), v(12);
  for (int i = 0; i < 12; ++i) k[i] = 0.125f * (i % 5) - 0.25f, v[i] = 0.5f * (i % 3) - 0.5f;
  VariantInputs vars;
  vars.bias = bias.data();
  auto run = [&] { return compute_oracle(p, q.data(), k.data(), v.data(), vars, k1Thread); };
  const OracleResult a = run();
  for (int d = 0; d < 4; ++d) k[8 + d] = 0.03125f * d, v[8 + d] = 7.0f - d;  // key 2: other finite values
  const OracleResult b = run();
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.o_bound, b.o_bound);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.lse_bound, b.lse_bound);
  ASSERT_TRUE(a.rows[0].inside_contract());
  EXPECT_GT(a.o_bound[0], 0.0);
  // Range: q_d k_2d = 2^67 * 2^60, four of them: a_2 = 2^129 > 2^127, the row is outside with that value.
  q.assign(4, 0x1p67f);
  for (int d = 0; d < 4; ++d) k[d] = k[4 + d] = 0.0f, k[8 + d] = 0x1p60f;
  const OracleResult big = run();
  EXPECT_EQ(big.rows[0].contract, ContractReason::kScoreRange);
  EXPECT_EQ(big.rows[0].contract_value, 0x1p129);
  // A visible key over the range too (a_0 = 2^128): the value reported is still the largest, the -inf key's 2^130.
  for (int d = 0; d < 4; ++d) k[d] = 0x1p59f, k[8 + d] = 0x1p61f;
  EXPECT_EQ(run().rows[0].contract_value, 0x1p130);
  // Small q again: a NaN k on the -inf key makes the score NaN (NaN - inf), an infinite v is outside the contract.
  q.assign(4, 0.5f);
  for (int d = 0; d < 4; ++d) k[d] = k[8 + d] = 0.25f;
  k[9] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(run().rows[0].kind, RowKind::kNaN);
  k[9] = 0.25f;
  v[10] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(run().rows[0].contract, ContractReason::kValueRange);
  v[10] = 1.0f;
  EXPECT_TRUE(run().rows[0].inside_contract());
}

TEST(OracleVariants, MissingValuesAreRefused) {
  Tiny t;
  t.p.variants = AF_VARIANT_SINK;
  EXPECT_THROW(compute_oracle(t.p, t.q.data(), t.k.data(), t.v.data(), k1Thread), std::invalid_argument);
}

TEST(OracleVariants, SoftcapOfHugeLogitsStaysFinite) {
  // |s / cap| >> 88: cap tanh(s / cap) = +-cap; an exp-based tanh would give inf / inf.
  Tiny t;
  t.q = {1e4f};
  t.k = {1e4f, -1e4f};
  t.p.variants = AF_VARIANT_SOFTCAP;
  t.p.softcap = 5.0f;
  expect_row(t.run(), 5, -5, 0, false);
}

// A random problem with every variant; the fast path agrees with the arbiter within its own error.
struct Rand {
  Problem p;
  std::vector<float> q, k, v, dout, sinks, slopes, bias;
  explicit Rand(uint32_t seed, const char* mask = "causal-br", const char* bcast = "b") {
    p = make_problem(2, 4, 2, 9, 13, 8, 8);
    EXPECT_EQ(parse_mask(mask, p), "");
    p.variants = AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_BIAS;
    p.softcap = 1.5f;
    EXPECT_EQ(set_bias_strides(p, bcast), "");
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1.5f, 1.5f);
    for (auto* x : {&q, &k, &v, &dout}) x->clear();
    q.resize(static_cast<size_t>(q_elements(p)));
    k.resize(static_cast<size_t>(k_elements(p)));
    v.resize(static_cast<size_t>(v_elements(p)));
    dout.resize(static_cast<size_t>(o_elements(p)));
    sinks.resize(4);
    bias.resize(static_cast<size_t>(bias_elements(p)));
    for (auto* x : {&q, &k, &v, &dout, &sinks, &bias})
      for (float& e : *x) e = u(g);
    slopes = alibi_default_slopes(4);
  }
  VariantInputs vars() const { return {sinks.data(), slopes.data(), bias.data()}; }
};

TEST(OracleVariants, FastPathMatchesTheArbiter) {
  const Rand c(7);
  OracleOptions fast = k1Thread, mp = k1Thread;
  mp.force_multiprecision = true;
  const OracleResult a = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), c.vars(), fast);
  const OracleResult b = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), c.vars(), mp);
  for (size_t i = 0; i < a.o.size(); ++i) EXPECT_NEAR(a.o[i], b.o[i], 1e-13 + a.o_err[i]) << i;
  for (size_t i = 0; i < a.lse.size(); ++i) EXPECT_NEAR(a.lse[i], b.lse[i], 1e-12) << i;
  EXPECT_EQ(b.rows_mp, b.rows_computed);
}

// A kernel that takes ALiBi + bias as one term in the storage type (AF_KERNEL_SCORE_ADD_IN_DTYPE, SDPA's float
// attn_mask in bf16): the exact result is the one over that term's fp32 sum rounded to bf16, bit for bit the same
// as a bias tensor that holds the rounded sum, forward and backward; at |bias| ~ 100 (bf16 quantum 0.5) it is
// not the result over the exact terms.
TEST(OracleVariants, ScoreTermsInTheDtypeAreTheirFp32SumRounded) {
  Rand c(5, "causal-br", "");
  c.p.variants = AF_VARIANT_ALIBI | AF_VARIANT_BIAS;
  c.p.dtype = AF_DTYPE_BF16;
  for (float& e : c.bias) e *= 64.0f;
  Rand r = c;  // the rounded sum as a plain bias, no ALiBi
  r.p.variants = AF_VARIANT_BIAS;
  for (int64_t b = 0; b < c.p.batch; ++b)
    for (int64_t h = 0; h < c.p.heads_q; ++h)
      for (int64_t i = 0; i < c.p.seq_q; ++i)
        for (int64_t j = 0; j < c.p.seq_k; ++j) {
          const int64_t dist = std::llabs(j - (i + c.p.seq_k - c.p.seq_q));
          const size_t e = static_cast<size_t>(bias_index(c.p, b, h, i, j));
          const double sum = static_cast<double>(c.bias[e]) -
                             static_cast<double>(c.slopes[static_cast<size_t>(h)]) * static_cast<double>(dist);
          r.bias[e] = round_to_dtype(static_cast<float>(sum), AF_DTYPE_BF16);
        }
  OracleOptions in_dtype = k1Thread, exact = k1Thread;
  in_dtype.score_add_in_dtype = true;
  in_dtype.baseline = exact.baseline = false;
  in_dtype.compute_model = exact.compute_model = AF_COMPUTE_FUSED;
  const OracleResult a = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), c.vars(), in_dtype);
  const OracleResult b = compute_oracle(r.p, r.q.data(), r.k.data(), r.v.data(), r.vars(), exact);
  const OracleResult x = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), c.vars(), exact);
  ASSERT_EQ(a.o.size(), b.o.size());
  double moved = 0;  // the largest |exact-term O - rounded-term O| / bound
  for (size_t i = 0; i < a.o.size(); ++i) {
    EXPECT_EQ(a.o[i], b.o[i]) << i;
    moved = std::max(moved, std::fabs(a.o[i] - x.o[i]) / x.o_bound[i]);
  }
  for (size_t i = 0; i < a.lse.size(); ++i) EXPECT_EQ(a.lse[i], b.lse[i]) << i;
  EXPECT_GT(moved, 1.0) << "the rounding of the terms should move O beyond the fused bf16 bound";

  std::vector<float> o(a.o.begin(), a.o.end()), lse(a.lse.begin(), a.lse.end());
  GradOptions ga, gb;
  ga.fwd = in_dtype, gb.fwd = exact;
  const GradResult da = compute_grad_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), c.dout.data(), o.data(),
                                            lse.data(), c.vars(), ga);
  const GradResult db = compute_grad_oracle(r.p, r.q.data(), r.k.data(), r.v.data(), r.dout.data(), o.data(),
                                            lse.data(), r.vars(), gb);
  for (size_t i = 0; i < da.dq.size(); ++i) EXPECT_EQ(da.dq[i], db.dq[i]) << i;
  for (size_t i = 0; i < da.dk.size(); ++i) EXPECT_EQ(da.dk[i], db.dk[i]) << i;
}

TEST(OracleVariants, AlibiDefaultSlopesFollowThePaper) {
  const std::vector<float> s8 = alibi_default_slopes(8);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(s8[h], std::exp2(-(h + 1.0)));
  // 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
  const std::vector<float> s12 = alibi_default_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(s12[h], s8[h]);
  for (int x = 0; x < 4; ++x) EXPECT_EQ(s12[8 + x], static_cast<float>(std::exp2(-0.5 - x)));
}

// Loss = sum dO . O of the exact forward as a function of one input (for finite differences).
double loss(const Rand& c) {
  OracleOptions o = k1Thread;
  o.baseline = false;
  const OracleResult r = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), c.vars(), o);
  double l = 0;
  for (int64_t b = 0; b < c.p.batch; ++b)
    for (int64_t s = 0; s < c.p.seq_q; ++s)
      for (int64_t h = 0; h < c.p.heads_q; ++h)
        for (int64_t d = 0; d < c.p.head_dim_v; ++d)
          l += static_cast<double>(c.dout[o_index(c.p, b, s, h, d)]) * r.o[r.o_at(b, s, h, d)];
  return l;
}

template <class F>
double central(Rand c, float& (*at)(Rand&, size_t), size_t i, F&&) {
  const float x0 = at(c, i);
  const float h = 1.0f / 1024;
  at(c, i) = x0 + h;
  const double lp = loss(c);
  at(c, i) = x0 - h;
  const double lm = loss(c);
  return (lp - lm) / (2.0 * h);
}

TEST(OracleVariants, GradientsMatchFiniteDifferences) {
  for (const char* bcast : {"", "b", "bh", "i"}) {
    Rand c(11, "causal-br", bcast);
    OracleOptions fo = k1Thread;
    fo.baseline = false;
    const OracleResult F = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), c.vars(), fo);
    std::vector<float> o(static_cast<size_t>(o_elements(c.p))), lse(static_cast<size_t>(lse_elements(c.p)));
    for (int64_t b = 0; b < c.p.batch; ++b)
      for (int64_t h = 0; h < c.p.heads_q; ++h)
        for (int64_t s = 0; s < c.p.seq_q; ++s) {
          lse[lse_index(c.p, b, h, s)] = static_cast<float>(F.lse[F.lse_at(b, h, s)]);
          for (int64_t d = 0; d < c.p.head_dim_v; ++d)
            o[o_index(c.p, b, s, h, d)] = static_cast<float>(F.o[F.o_at(b, s, h, d)]);
        }
    GradOptions go;
    go.fwd = fo;
    const GradResult g =
        compute_grad_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), c.dout.data(), o.data(), lse.data(), c.vars(), go);
    ASSERT_TRUE(g.inside_contract) << g.why;
    ASSERT_EQ(g.dsinks.size(), 4u);
    ASSERT_EQ(g.dbias.size(), c.bias.size());
    auto sink_at = +[](Rand& r, size_t i) -> float& { return r.sinks[i]; };
    auto bias_at = +[](Rand& r, size_t i) -> float& { return r.bias[i]; };
    auto q_at = +[](Rand& r, size_t i) -> float& { return r.q[i]; };
    for (size_t h = 0; h < 4; ++h) EXPECT_NEAR(g.dsinks[h], central(c, sink_at, h, 0), 2e-5) << bcast << " h " << h;
    for (size_t e = 0; e < c.bias.size(); e += 7) EXPECT_NEAR(g.dbias[e], central(c, bias_at, e, 0), 2e-5) << bcast << e;
    for (size_t e = 0; e < c.q.size(); e += 5)
      EXPECT_NEAR(g.dq[g.dq_at(e / (4 * 8 * 9), (e / 32) % 9, (e / 8) % 4, e % 8)], central(c, q_at, e, 0), 2e-5) << e;
  }
}

// ---- per-head fp8 descales (AF_VARIANT_HEAD_DESCALE, issue 28 item 6) ----
// A GQA problem (B 2, Hq 4, Hkv 2) of fp8-e4m3 values (multiples of 1/4 in [-2, 2], exact in e4m3).
struct Fp8Gqa {
  Problem p = make_problem(2, 4, 2, 5, 7, 8, 8);
  std::vector<float> q, k, v, qd, kd, vd;
  Fp8Gqa() {
    p.dtype = AF_DTYPE_FP8_E4M3;
    std::mt19937 g(7);
    std::uniform_int_distribution<int> u(-8, 8);
    for (auto [x, n] :
         {std::pair{&q, q_elements(p)}, std::pair{&k, k_elements(p)}, std::pair{&v, v_elements(p)}}) {
      x->resize(static_cast<size_t>(n));
      for (float& e : *x) e = 0.25f * static_cast<float>(u(g));
    }
  }
  // Per-head descales: q per query head, k and v per KV head; per batch (stride {Hq, 1}) or for every batch.
  void per_head(bool per_batch, std::vector<float> q_h, std::vector<float> k_h, std::vector<float> v_h) {
    p.variants = AF_VARIANT_HEAD_DESCALE;
    set_descale_strides(p, per_batch);
    qd = std::move(q_h), kd = std::move(k_h), vd = std::move(v_h);
    ASSERT_EQ(static_cast<int64_t>(qd.size()), descale_h_elements(p, true));
    ASSERT_EQ(static_cast<int64_t>(kd.size()), descale_h_elements(p, false));
    ASSERT_EQ(static_cast<int64_t>(vd.size()), descale_h_elements(p, false));
  }
  OracleResult run() const {
    VariantInputs vi;
    vi.q_descale_h = qd.data(), vi.k_descale_h = kd.data(), vi.v_descale_h = vd.data();
    return compute_oracle(p, q.data(), k.data(), v.data(), vi, k1Thread);
  }
  // The exact result of slice (b, h) alone (B = Hq = Hkv = 1) with the per-tensor descales (fq, fk, fv).
  OracleResult slice(int64_t b, int64_t h, float fq, float fk, float fv) const {
    Problem s = make_problem(1, 1, 1, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v);
    s.dtype = p.dtype, s.scale = p.scale, s.q_descale = fq, s.k_descale = fk, s.v_descale = fv;
    const int64_t hk = h / (p.heads_q / p.heads_kv);
    std::vector<float> sq(static_cast<size_t>(q_elements(s))), sk(static_cast<size_t>(k_elements(s))),
        sv(static_cast<size_t>(v_elements(s)));
    for (int64_t i = 0; i < p.seq_q; ++i)
      for (int64_t d = 0; d < p.head_dim; ++d) sq[q_index(s, 0, i, 0, d)] = q[q_index(p, b, i, h, d)];
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t d = 0; d < p.head_dim; ++d)
        sk[k_index(s, 0, j, 0, d)] = k[k_index(p, b, j, hk, d)],
                               sv[v_index(s, 0, j, 0, d)] = v[v_index(p, b, j, hk, d)];
    return compute_oracle(s, sq.data(), sk.data(), sv.data(), k1Thread);
  }
  // Max relative difference of head (b, h)'s O and LSE from a slice's.
  double diff(const OracleResult& r, const OracleResult& s, int64_t b, int64_t h) const {
    double worst = 0;
    auto rel = [](double a, double x) { return std::fabs(a - x) / std::max(1e-300, std::fabs(x)); };
    for (int64_t i = 0; i < p.seq_q; ++i) {
      for (int64_t d = 0; d < p.head_dim_v; ++d)
        worst = std::max(worst, rel(r.o[r.o_at(b, i, h, d)], s.o[s.o_at(0, i, 0, d)]));
      worst = std::max(worst, rel(r.lse[r.lse_at(b, h, i)], s.lse[s.lse_at(0, 0, i)]));
    }
    return worst;
  }
};

TEST(OracleVariants, HeadDescalesAllEqualAreThePerTensorDescales) {
  Fp8Gqa t;
  t.p.q_descale = 2, t.p.k_descale = 0.5f, t.p.v_descale = 8;
  const OracleResult per_tensor = compute_oracle(t.p, t.q.data(), t.k.data(), t.v.data(), k1Thread);
  t.per_head(false, {2, 2, 2, 2}, {0.5f, 0.5f}, {8, 8});
  t.p.q_descale = t.p.k_descale = t.p.v_descale = 1;  // replaced by the per-head ones: not read
  const OracleResult r = t.run();
  ASSERT_EQ(r.o.size(), per_tensor.o.size());
  for (size_t e = 0; e < r.o.size(); ++e) {
    EXPECT_EQ(r.o[e], per_tensor.o[e]) << e;
    EXPECT_EQ(r.o_bound[e], per_tensor.o_bound[e]) << e;
  }
  for (size_t e = 0; e < r.lse.size(); ++e) EXPECT_EQ(r.lse[e], per_tensor.lse[e]) << e;
}

TEST(OracleVariants, HeadDescalesScaleEachHeadKAndVByTheirKvHead) {
  for (bool per_batch : {false, true}) {
    Fp8Gqa t;
    if (per_batch)  // [B, Hq] rows of Hq; k and v use the first Hkv of each row (the rest is never read)
      t.per_head(true, {1, 2, 0.5f, 8, 0.125f, 3.25f, 1, 0.375f}, {0.5f, 4, 9, 9, 2, 0.25f},
                 {2, 0.125f, 9, 9, 0.5f, 8});
    else
      t.per_head(false, {1, 2, 0.5f, 8}, {0.5f, 4}, {2, 0.125f});
    const OracleResult r = t.run();
    for (int64_t b = 0; b < t.p.batch; ++b)
      for (int64_t h = 0; h < t.p.heads_q; ++h) {
        const int64_t hk = h / 2;
        auto at = [&](const std::vector<float>& a, int64_t head) { return a[descale_h_index(t.p, b, head)]; };
        const OracleResult s = t.slice(b, h, at(t.qd, h), at(t.kd, hk), at(t.vd, hk));
        EXPECT_LE(t.diff(r, s, b, h), 1e-15) << "per_batch " << per_batch << " b " << b << " h " << h;
        if (h % 2 !=
            hk) {  // k's and v's descale at the query head's index (h mod Hkv) would be another result
          const OracleResult w = t.slice(b, h, at(t.qd, h), at(t.kd, h % 2), at(t.vd, h % 2));
          EXPECT_GT(t.diff(r, w, b, h), 1e-3) << "b " << b << " h " << h;
        }
      }
    // Heads differ: head 0 and head 1 share KV head 0 but not their q descale.
    const OracleResult s0 = t.slice(0, 1, t.qd[0], t.kd[0], t.vd[0]);
    EXPECT_GT(t.diff(r, s0, 0, 1), 1e-3);
  }
}

TEST(OracleVariants, HeadDescalesAreFp8OnlyAndMustBeGiven) {
  Fp8Gqa t;
  t.per_head(false, {1, 2, 0.5f, 8}, {0.5f, 4}, {2, 0.125f});
  EXPECT_THROW(compute_oracle(t.p, t.q.data(), t.k.data(), t.v.data(), k1Thread), std::invalid_argument);
  t.p.dtype = AF_DTYPE_F32;
  EXPECT_NE(validate(t.p).find("fp8 only"), std::string::npos) << validate(t.p);
  EXPECT_THROW(t.run(), std::invalid_argument);
}

}  // namespace
}  // namespace attnfuzz
