// contract_test.cpp - the fp32 contract (issue 11 item 1): every product term and partial sum of every
// visible score, the scale, and P.V partial sums; correct kernels are outside-contract there, never fail, and
// a planted bug on the same or a nearby in-contract case is still found.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"
#include "oracle/oracle.h"

namespace attnfuzz {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

Case parse_case(int64_t sq, int64_t sk, int64_t d, const std::string& mask, const std::string& dist,
                const std::vector<std::string>& specials, uint64_t seed) {
  Case c = make_case(make_problem(1, 1, 1, sq, sk, d, d), seed);
  EXPECT_EQ(parse_mask(mask, c.problem), "");
  EXPECT_EQ(parse_distribution(dist, c.values.dist), "");
  for (const auto& s : specials) {
    SpecialValue sv;
    EXPECT_EQ(parse_special(s, sv), "") << s;
    c.values.specials.push_back(sv);
  }
  EXPECT_EQ(validate(c), "");
  return c;
}

// Issue 11's two reproducers.
Case issue_case_1() {
  return parse_case(20, 20, 17, "causal-br", "uniform:10",
                    {"-inf@k:random*3", "inf@k:masked", "huge@k:random*3"}, 0xda8422cf30d8db53ull);
}
Case issue_case_2() {
  return parse_case(1, 2, 2, "none", "uniform:4", {"huge@k:at=0,0,1,0", "-inf@k:at=0,0,1,1"}, 5);
}

OracleResult oracle_of(const Case& c) {
  const Tensors t = generate(c);
  OracleOptions o;
  o.threads = 1;
  return compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), o);
}
OracleResult oracle_of(const Problem& p, const std::vector<float>& q, const std::vector<float>& k,
                       const std::vector<float>& v) {
  OracleOptions o;
  o.threads = 1;
  return compute_oracle(p, q.data(), k.data(), v.data(), o);
}

// Every built-in correct kernel on the cpu backend that claims the case (paged-decode takes 1..8 query tokens).
std::vector<Judged> check_all(const Case& c, const std::string& kernels = "all") {
  DeviceOptions dopt;
  dopt.workers = 1;
  dopt.isolate = false;
  auto dev = open_device("cpu", dopt);
  PreparedCase pc(c);
  RunOptions ro;
  std::vector<Judged> out;
  for (const KernelEntry* k : Registry::global().select(Backend::kCpu, kernels))
    if ((kernels != "all" ||
         std::string(k->kernel.family).rfind("planted", 0) != 0) &&  // "all": the correct ones
        unsupported_reason(k->kernel, pc.problem()).empty())
      out.push_back(check_case(*dev, *k, pc, ro));
  return out;
}

TEST(Contract, IssueCase2KeyWithMinusInfScoreAndOverflowingTermIsOutside) {
  // Key 1: q0 * FLT_MAX overflows fp32 (|q0| > 1), q1 * -inf = -inf: exact score -inf (weight 0), but every
  // fp32 dot product gives inf + -inf = NaN. Key 0 is finite: the row has a finite score too.
  const Case c = issue_case_2();
  const Tensors t = generate(c);
  ASSERT_EQ(t.k[2], FLT_MAX * (t.k[2] > 0 ? 1 : -1));
  ASSERT_EQ(t.k[3], -kInf);
  ASSERT_GT(std::fabs(t.q[0]), 1.0f);
  const OracleResult r = oracle_of(c);
  EXPECT_EQ(r.rows[0].contract, ContractReason::kScoreRange);
  EXPECT_TRUE(std::isinf(r.o_bound[0]));
  for (const Judged& j : check_all(c)) {
    EXPECT_EQ(j.result.verdict, Verdict::kOutsideContract) << j.result.kernel << ": " << j.result.reason;
  }
}

TEST(Contract, IssueCase1NoCorrectKernelFails) {
  const Case c = issue_case_1();
  const OracleResult r = oracle_of(c);
  EXPECT_GT(r.rows_outside, 0);
  EXPECT_LT(r.rows_outside, r.rows_computed);  // only the rows that see an overflowing key
  const auto js = check_all(c);
  EXPECT_GE(js.size(), 7u);
  for (const Judged& j : js)
    EXPECT_EQ(j.result.verdict, Verdict::kOutsideContract) << j.result.kernel << ": " << j.result.reason;
}

TEST(Contract, PlantedBugsOnTheSameCaseAreStillFound) {
  // The rows that do not see an overflowing key stay inside the contract: a mask bug there is found.
  const Case c = issue_case_1();
#ifdef PLANTED_PLUGIN
  Registry::global().load_plugin(PLANTED_PLUGIN);
  for (const Judged& j : check_all(c, "planted-causal-off-by-one,planted-masked-score-zero"))
    EXPECT_EQ(j.result.verdict, Verdict::kFail) << j.result.kernel;
#endif
}

TEST(Contract, NearbyInContractCaseStillJudgesEveryRow) {
  // Case 2 with a large product that does not overflow: inside, exact O = v_0 (key 1 has weight 0), and an
  // output off by far more than the bound fails.
  Problem p = make_problem(1, 1, 1, 1, 2, 2, 2);
  std::vector<float> q{2.0f, 1.0f}, k{0.5f, 0.25f, 1e30f, -kInf}, v{1.0f, -2.0f, 3.0f, 4.0f};
  const OracleResult r = oracle_of(p, q, k, v);
  EXPECT_EQ(r.rows[0].contract, ContractReason::kInside);
  EXPECT_DOUBLE_EQ(r.o[0], 1.0);
  EXPECT_DOUBLE_EQ(r.o[1], -2.0);
  EXPECT_LT(r.o_bound[0], 1e-5);
  // The same with FLT_MAX: 2 * FLT_MAX overflows fp32: outside.
  k[2] = FLT_MAX;
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kScoreRange);
  // 0.25 * FLT_MAX does not overflow, even with log2 e: inside.
  q[0] = 0.25f;
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kInside);
}

TEST(Contract, PartialSumOfFiniteTermsOfAMinusInfKey) {
  // No single term overflows, but q0 k0 + q1 k1 (0.75 FLT_MAX each, same sign) does in the order a kernel
  // sums them before meeting -inf: inf + -inf = NaN. Exact score -inf.
  Problem p = make_problem(1, 1, 1, 1, 2, 3, 1);
  std::vector<float> q{0.75f, 0.75f, 1.0f}, k{1, 1, 1, FLT_MAX, FLT_MAX, -kInf}, v{1.0f, 2.0f};
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kScoreRange);
  // Half the size: every partial sum stays below 2^127: inside.
  q = {0.25f, 0.25f, 1.0f};
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kInside);
}

TEST(Contract, EveryScoreMinusInfAndOverflowingTermIsOutside) {
  // The row's only key has score -inf (fully masked by the score: O = 0) and an overflowing term: outside.
  Problem p = make_problem(1, 1, 1, 1, 1, 2, 1);
  std::vector<float> q{4.0f, 1.0f}, k{FLT_MAX, -kInf}, v{1.0f};
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kScoreRange);
  k[0] = 1e30f;
  const OracleResult r = oracle_of(p, q, k, v);
  EXPECT_EQ(r.rows[0].contract, ContractReason::kInside);
  EXPECT_EQ(r.rows[0].kind, RowKind::kFullyMasked);
}

TEST(Contract, InfiniteVAtAZeroWeightKeyOfAFullyMaskedRowIsOutside) {
  // Every visible score is -inf (O = 0 exactly), but P.V meets 0 * inf = NaN in accumulate-first kernels.
  Problem p = make_problem(1, 1, 1, 1, 2, 1, 1);
  std::vector<float> q{1.0f}, k{-kInf, -kInf}, v{1.0f, kInf};
  const OracleResult r = oracle_of(p, q, k, v);
  EXPECT_EQ(r.rows[0].kind, RowKind::kFullyMasked);
  EXPECT_EQ(r.rows[0].contract, ContractReason::kValueRange);
  v[1] = FLT_MAX;  // finite: 0 * FLT_MAX = 0, inside, and O must be exactly 0
  const OracleResult f = oracle_of(p, q, k, v);
  EXPECT_EQ(f.rows[0].contract, ContractReason::kInside);
  EXPECT_EQ(f.o_bound[0], 0.0);
}

TEST(Contract, InfiniteVInANormalRowIsOutside) {
  Problem p = make_problem(1, 1, 1, 1, 2, 1, 1);
  std::vector<float> q{1.0f}, k{1.0f, -kInf}, v{1.0f, kInf};  // v inf at the weight-0 key
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kValueRange);
}

TEST(Contract, OverflowingPartialPVSumIsOutside) {
  // Two keys of equal score and v = 0.75 FLT_MAX: the unnormalised accumulator (or any partial sum of
  // w_j v_j before normalising) overflows although O = 0.75 FLT_MAX is finite.
  Problem p = make_problem(1, 1, 1, 1, 2, 1, 1);
  std::vector<float> q{1.0f}, k{1.0f, 1.0f}, v{0.75f * FLT_MAX, 0.75f * FLT_MAX};
  const OracleResult r = oracle_of(p, q, k, v);
  EXPECT_EQ(r.rows[0].contract, ContractReason::kValueRange);
  v = {0.2f * FLT_MAX, 0.2f * FLT_MAX};
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kInside);
}

TEST(Contract, ExtremeScale) {
  Problem p = make_problem(1, 1, 1, 1, 1, 2, 1);
  std::vector<float> q{1e20f, 1e20f}, k{1e-2f, 1e-2f}, v{1.0f};
  // q.k = 2e18 is finite, scale * q.k = 2e18 * 1e25 overflows.
  p.scale = 1e25f;
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kScoreRange);
  // scale * q folded into q first overflows (scale * q0 = 1e45) although every product is 0 here:
  // inf * 0 = NaN.
  k = {0.0f, 0.0f};
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kScoreRange);
  // sqrt(scale) folded into k (PyTorch's math backend) overflows: sqrt(1e25) * 1e36 > FLT_MAX.
  q = {1e-30f, 0.0f};
  k = {1e36f, 0.0f};
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kScoreRange);
  // q.k overflows fp32 (each product is 1e39) while scale * q.k = 2e29 is finite: outside (the dot
  // product overflows before the scale is applied).
  p.scale = 1e-10f;
  q = {1e20f, 1e20f};
  k = {1e19f, 1e19f};
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kScoreRange);
  // Moderate: inside.
  p.scale = 1e-10f;
  k = {1e10f, 1e10f};
  EXPECT_EQ(oracle_of(p, q, k, v).rows[0].contract, ContractReason::kInside);
}

TEST(Contract, CorrectKernelsOnTheSiblingsAreNeverFail) {
  // Each sibling as a generated case, through every built-in kernel: outside-contract or pass, never fail.
  const std::vector<Case> cases = {
      issue_case_2(),
      parse_case(33, 33, 8, "causal-tl", "uniform:4", {"huge@k:visible*4", "-inf@k:visible*4"}, 11),
      parse_case(17, 40, 5, "window:8,0-br", "uniform:8",
                 {"huge@k:random*6", "-inf@k:random*6", "inf@v:random*3"}, 12),
      parse_case(24, 24, 3, "none", "uniform:2", {"huge@v:visible*6"}, 13),
      parse_case(9, 9, 4, "causal-br", "uniform:1", {"-inf@k:random*9", "inf@v:random*4"}, 14),
  };
  for (const Case& c : cases)
    for (const Judged& j : check_all(c))
      EXPECT_NE(j.result.verdict, Verdict::kFail)
          << describe(c) << " " << j.result.kernel << ": " << j.result.reason;
}

TEST(Contract, CorrectKernelsOnHandMadeSiblings) {
  // Explicit inputs through every built-in kernel: never fail; the in-contract ones pass.
  struct Sib {
    const char* what;
    int64_t sk, d;
    std::vector<float> q, k, v;
    bool inside;
  };
  const std::vector<Sib> sibs = {
      {"-inf scores only, inf v", 2, 1, {1.0f}, {-kInf, -kInf}, {1.0f, kInf}, false},
      {"-inf scores only, FLT_MAX v", 2, 1, {1.0f}, {-kInf, -kInf}, {1.0f, FLT_MAX}, true},
      {"-inf key with an overflowing term",
       2,
       2,
       {4.0f, 1.0f},
       {0.5f, 0.5f, FLT_MAX, -kInf},
       {1.0f, 2.0f},
       false},
      {"-inf key with a large term", 2, 2, {4.0f, 1.0f}, {0.5f, 0.5f, 1e30f, -kInf}, {1.0f, 2.0f}, true},
      {"-inf key, overflowing partial sum",
       2,
       3,
       {0.75f, 0.75f, 1.0f},
       {1, 1, 1, FLT_MAX, FLT_MAX, -kInf},
       {1.0f, 2.0f},
       false},
      {"overflowing P.V partial sum", 2, 1, {1.0f}, {1.0f, 1.0f}, {0.75f * FLT_MAX, 0.75f * FLT_MAX}, false},
  };
  for (const Sib& s : sibs) {
    Case c = make_case(make_problem(1, 1, 1, 1, s.sk, s.d, 1), 0);
    c.explicit_values = ExplicitValues{s.q, s.k, s.v};
    ASSERT_EQ(validate(c), "") << s.what;
    for (const Judged& j : check_all(c)) {
      EXPECT_NE(j.result.verdict, Verdict::kFail)
          << s.what << " " << j.result.kernel << ": " << j.result.reason;
      EXPECT_EQ(j.result.verdict, s.inside ? Verdict::kPass : Verdict::kOutsideContract)
          << s.what << " " << j.result.kernel << ": " << j.result.reason;
    }
  }
}

}  // namespace
}  // namespace attnfuzz
