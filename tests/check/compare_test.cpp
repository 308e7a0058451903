// compare_test.cpp - the NaN-safe comparison: element rules, verdicts, worst elements, ratio map, and
// proof that a max-fold checker (seed 000's) passes a case this comparison fails.
#include "check/compare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/oracle/fp32_models.h"

namespace attnfuzz {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(JudgeElement, NonFiniteRules) {
  EXPECT_FALSE(judge_element(kNaN, kNaN, 0).fail);    // NaN expected, NaN got: pass
  EXPECT_FALSE(judge_element(kInf, kInf, 0).fail);    // +inf vs +inf: pass
  EXPECT_FALSE(judge_element(-kInf, -kInf, 0).fail);  // -inf vs -inf: pass
  for (auto [e, g] : {std::pair{1.0, kNaN},
                      {kNaN, 1.0},
                      {1.0, kInf},
                      {kInf, 1.0},
                      {kInf, -kInf},
                      {kNaN, kInf},
                      {kInf, kNaN},
                      {-kInf, 0.0}}) {
    const ElementJudgement j = judge_element(e, g, 1e30);
    EXPECT_TRUE(j.fail) << e << " " << g;
    EXPECT_TRUE(j.nonfinite_mismatch);
    EXPECT_EQ(j.ratio, kInf);
  }
}

TEST(JudgeElement, FiniteRules) {
  EXPECT_FALSE(judge_element(1.0, 1.0, 0).fail);  // exact with a zero bound passes
  EXPECT_EQ(judge_element(1.0, 1.0, 0).ratio, 0);
  EXPECT_TRUE(judge_element(0.0, 1e-30, 0).fail);  // zero bound: any error fails
  const ElementJudgement j = judge_element(1.0, 1.5, 1.0);
  EXPECT_FALSE(j.fail);
  EXPECT_DOUBLE_EQ(j.ratio, 0.5);
  EXPECT_TRUE(judge_element(1.0, 3.5, 1.0).fail);
  EXPECT_DOUBLE_EQ(judge_element(-2.0, 1.0, 1.5).ratio, 2.0);
}

struct Fixture {
  Problem p;
  std::vector<float> q, k, v;
  OracleResult exact;
  std::vector<float> o, lse;  // a kernel output: the exact result rounded to fp32, p's strides
};
Fixture setup(uint64_t seed, Problem p) {
  testing::Rng rng(seed);
  Fixture s;
  s.p = p;
  s.q.resize(q_elements(p)), s.k.resize(k_elements(p)), s.v.resize(v_elements(p));
  for (auto* t : {&s.q, &s.k, &s.v})
    for (auto& x : *t) x = static_cast<float>(rng.normal());
  OracleOptions o;
  o.threads = 1;
  s.exact = compute_oracle(p, s.q.data(), s.k.data(), s.v.data(), o);
  s.o.assign(o_elements(p), -7.0f);
  s.lse.assign(lse_elements(p), -7.0f);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        s.lse[lse_index(p, b, h, i)] = static_cast<float>(s.exact.lse[s.exact.lse_at(b, h, i)]);
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          s.o[o_index(p, b, i, h, d)] = static_cast<float>(s.exact.o[s.exact.o_at(b, i, h, d)]);
      }
  return s;
}

TEST(Compare, ExactRoundedOutputPasses) {
  Fixture s = setup(1, make_problem(2, 2, 1, 9, 11, 8, 6));
  CheckResult r;
  const std::vector<double> map = compare_output(s.p, s.exact, s.o.data(), s.lse.data(), r);
  EXPECT_EQ(r.verdict, Verdict::kPass);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.compared, 2 * 2 * 9 * (6 + 1));
  EXPECT_LT(r.max_ratio, 0.01);
  EXPECT_GT(r.baseline_max_ratio, 0);
  EXPECT_LE(r.baseline_max_ratio, 1);
  ASSERT_EQ(map.size(), 9u * 6u);
  for (double x : map) EXPECT_TRUE(x >= 0 && x < 0.01);
  ASSERT_FALSE(r.worst.empty());
  for (size_t i = 1; i < r.worst.size(); ++i) EXPECT_GE(r.worst[i - 1].ratio, r.worst[i].ratio);
  EXPECT_EQ(r.evidence.front().detector, "flash-rule");
}

// The seed-000 checker: folds |got - expected| with std::max, which silently drops NaN.
bool max_fold_checker_passes(const Fixture& s, double tol) {
  double err = 0;
  for (int64_t b = 0; b < s.p.batch; ++b)
    for (int64_t i = 0; i < s.p.seq_q; ++i)
      for (int64_t h = 0; h < s.p.heads_q; ++h)
        for (int64_t d = 0; d < s.p.head_dim_v; ++d)
          err = std::max(err, std::fabs(static_cast<double>(s.o[o_index(s.p, b, i, h, d)]) -
                                        s.exact.o[s.exact.o_at(b, i, h, d)]));
  return err <= tol;
}

TEST(Compare, MaxFoldCheckerPassesANaNThisComparisonFails) {
  Fixture s = setup(2, make_problem(1, 1, 1, 5, 5, 4, 4));
  s.o[o_index(s.p, 0, 3, 0, 2)] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(max_fold_checker_passes(s, 2e-4));  // the bug: NaN vanishes in std::max
  CheckResult r;
  const std::vector<double> map = compare_output(s.p, s.exact, s.o.data(), s.lse.data(), r);
  EXPECT_EQ(r.verdict, Verdict::kFail);
  EXPECT_EQ(r.failure, FailureClass::kNonFinite);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.max_ratio, kInf);
  EXPECT_EQ(map[3 * 4 + 2], kInf);
  ASSERT_FALSE(r.worst.empty());
  EXPECT_EQ(r.worst[0].s, 3);
  EXPECT_EQ(r.worst[0].d, 2);
  EXPECT_TRUE(std::isnan(r.worst[0].got));
  // Also when the NaN is the first element folded (std::max(0, NaN) keeps 0 as well).
  Fixture s2 = setup(2, make_problem(1, 1, 1, 5, 5, 4, 4));
  s2.o[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(max_fold_checker_passes(s2, 2e-4));
  CheckResult r2;
  compare_output(s2.p, s2.exact, s2.o.data(), nullptr, r2);
  EXPECT_EQ(r2.failure, FailureClass::kNonFinite);
}

TEST(Compare, InfWhereFiniteExpectedFails) {
  Fixture s = setup(3, make_problem(1, 1, 1, 4, 4, 4, 4));
  s.o[o_index(s.p, 0, 1, 0, 1)] = std::numeric_limits<float>::infinity();
  CheckResult r;
  compare_output(s.p, s.exact, s.o.data(), s.lse.data(), r);
  EXPECT_EQ(r.failure, FailureClass::kNonFinite);
}

TEST(Compare, NaNExpectedAndNaNGotPassesFiniteGotFails) {
  Problem p = make_problem(1, 1, 1, 3, 4, 4, 2);
  Fixture s = setup(4, p);
  s.q[q_index(p, 0, 1, 0, 0)] = std::numeric_limits<float>::quiet_NaN();
  OracleOptions o;
  o.threads = 1;
  s.exact = compute_oracle(p, s.q.data(), s.k.data(), s.v.data(), o);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  s.o[o_index(p, 0, 1, 0, 0)] = s.o[o_index(p, 0, 1, 0, 1)] = nan;
  s.lse[lse_index(p, 0, 0, 1)] = nan;
  CheckResult r;
  compare_output(p, s.exact, s.o.data(), s.lse.data(), r);
  EXPECT_EQ(r.verdict, Verdict::kPass);
  s.o[o_index(p, 0, 1, 0, 1)] = 0.5f;  // finite where NaN expected
  CheckResult r2;
  compare_output(p, s.exact, s.o.data(), s.lse.data(), r2);
  EXPECT_EQ(r2.verdict, Verdict::kFail);
  EXPECT_EQ(r2.failure, FailureClass::kNonFinite);
}

TEST(Compare, FullyMaskedRowMustBeZeroAndMinusInfLsePasses) {
  Problem p = make_problem(1, 1, 1, 4, 2, 3, 3);
  p.mask_kind = AF_MASK_CAUSAL, p.mask_align = AF_ALIGN_BOTTOM_RIGHT, p.window_right = 0;  // rows 0, 1 empty
  Fixture s = setup(5, p);
  EXPECT_EQ(s.lse[lse_index(p, 0, 0, 0)], -std::numeric_limits<float>::infinity());
  CheckResult r;
  compare_output(p, s.exact, s.o.data(), s.lse.data(), r);
  EXPECT_EQ(r.verdict, Verdict::kPass);
  s.o[o_index(p, 0, 1, 0, 2)] = 1e-30f;  // a masked row must be exactly 0
  CheckResult r2;
  compare_output(p, s.exact, s.o.data(), s.lse.data(), r2);
  EXPECT_EQ(r2.failure, FailureClass::kPrecision);
  EXPECT_EQ(r2.worst[0].s, 1);
}

TEST(Compare, PrecisionFailureAndLse) {
  Fixture s = setup(6, make_problem(1, 2, 2, 6, 7, 5, 5));
  const size_t oi = s.exact.o_at(0, 4, 1, 3);
  s.o[o_index(s.p, 0, 4, 1, 3)] = static_cast<float>(s.exact.o[oi] + 10 * s.exact.o_bound[oi]);
  CheckResult r;
  const auto map = compare_output(s.p, s.exact, s.o.data(), s.lse.data(), r);
  EXPECT_EQ(r.verdict, Verdict::kFail);
  EXPECT_EQ(r.failure, FailureClass::kPrecision);
  EXPECT_EQ(r.failed, 1);
  EXPECT_NEAR(r.max_ratio, 10, 0.1);
  EXPECT_NEAR(map[4 * 5 + 3], 10, 0.1);
  EXPECT_FALSE(r.worst[0].is_lse);
  EXPECT_NE(r.reason.find("O[b=0,s=4,h=1,d=3]"), std::string::npos) << r.reason;
  Fixture t = setup(6, make_problem(1, 2, 2, 6, 7, 5, 5));
  t.lse[lse_index(t.p, 0, 1, 2)] += 0.5f;
  CheckResult r2;
  compare_output(t.p, t.exact, t.o.data(), t.lse.data(), r2);
  EXPECT_EQ(r2.failure, FailureClass::kPrecision);
  EXPECT_TRUE(r2.worst[0].is_lse);
  CheckResult r3;  // without LSE the same output passes
  compare_output(t.p, t.exact, t.o.data(), nullptr, r3);
  EXPECT_EQ(r3.verdict, Verdict::kPass);
}

TEST(Compare, StridedOutputBuffer) {
  Problem p = make_problem(1, 2, 1, 3, 5, 4, 3);
  p.o_stride[2] = 5, p.o_stride[1] = 11, p.o_stride[0] = 40;  // padded O
  p.lse_stride[2] = 2, p.lse_stride[1] = 7, p.lse_stride[0] = 20;
  Fixture s = setup(7, p);
  CheckResult r;
  compare_output(p, s.exact, s.o.data(), s.lse.data(), r);
  EXPECT_EQ(r.verdict, Verdict::kPass) << r.reason;
  EXPECT_EQ(r.compared, 2 * 3 * 4);
}

TEST(Compare, OutsideContractRowsAreNotBlamed) {
  Problem p = make_problem(1, 1, 1, 2, 3, 4, 2);
  std::vector<float> q(8, 1e20f), k(12, 1e20f), v(6, 1.0f);
  q[4] = q[5] = q[6] = q[7] = 1e-18f;  // row 1: scores ~ 200
  const OracleResult ex = compute_oracle(p, q.data(), k.data(), v.data());
  std::vector<float> o(o_elements(p), std::numeric_limits<float>::quiet_NaN());  // row 0 NaN: overflowed
  o[2] = o[3] = 1.0f;                                                            // row 1: all v = 1
  CheckResult r;
  const auto map = compare_output(p, ex, o.data(), nullptr, r);
  EXPECT_EQ(r.verdict, Verdict::kOutsideContract) << r.reason << " / " << ex.o[2] << " " << ex.o_bound[2];
  EXPECT_NE(r.reason.find("fp32 range"), std::string::npos);
  EXPECT_TRUE(std::isnan(map[0]));
  EXPECT_EQ(r.compared, 2);
  o[3] = 2.0f;  // an inside row failing still fails
  CheckResult r2;
  compare_output(p, ex, o.data(), nullptr, r2);
  EXPECT_EQ(r2.verdict, Verdict::kFail);
}

TEST(Compare, SampledRowsOnlyAndWorstLimit) {
  testing::Rng rng(8);
  Problem p = make_problem(1, 1, 1, 300, 40, 4, 4);
  std::vector<float> q(q_elements(p)), k(k_elements(p)), v(v_elements(p));
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = static_cast<float>(rng.normal());
  OracleOptions oo;
  oo.row_budget = 50;
  const OracleResult ex = compute_oracle(p, q.data(), k.data(), v.data(), oo);
  std::vector<float> o(o_elements(p), 123.0f);  // garbage everywhere
  CheckResult r;
  CompareOptions co;
  co.worst = 5;
  const auto map = compare_output(p, ex, o.data(), nullptr, r, co);
  EXPECT_EQ(r.compared, static_cast<int64_t>(ex.sampled.size()) * 4);
  EXPECT_EQ(r.worst.size(), 5u);
  int64_t nan_rows = 0;
  for (int64_t s = 0; s < 300; ++s) nan_rows += std::isnan(map[s * 4]);
  EXPECT_EQ(nan_rows, 300 - static_cast<int64_t>(ex.sampled.size()));
}

TEST(Compare, MissingRescaleModelFailsCorrectModelPasses) {
  testing::Rng rng(9);
  Problem p = make_problem(1, 1, 1, 8, 80, 16, 16);
  std::vector<float> q(q_elements(p)), k(k_elements(p)), v(v_elements(p));
  for (auto& x : q) x = 1.0f;
  for (int64_t j = 0; j < 80; ++j)
    for (int64_t d = 0; d < 16; ++d)
      k[k_index(p, 0, j, 0, d)] = static_cast<float>(0.05 * j + 0.3 * rng.normal());
  for (auto& x : v) x = static_cast<float>(rng.normal());
  const OracleResult ex = compute_oracle(p, q.data(), k.data(), v.data());
  testing::ModelOptions good, bad;
  good.tile = bad.tile = 16;
  bad.missing_rescale = true;
  const auto go = testing::run_model(p, q.data(), k.data(), v.data(), good);
  const auto bo = testing::run_model(p, q.data(), k.data(), v.data(), bad);
  CheckResult rg, rb;
  compare_output(p, ex, go.o.data(), go.lse.data(), rg);
  compare_output(p, ex, bo.o.data(), bo.lse.data(), rb);
  EXPECT_EQ(rg.verdict, Verdict::kPass);
  EXPECT_EQ(rb.verdict, Verdict::kFail);
  EXPECT_EQ(rb.failure, FailureClass::kPrecision);
  EXPECT_GT(rb.max_ratio, 1e3);
}

}  // namespace
}  // namespace attnfuzz
