// merge_test.cpp - merged attention states (issue 29): the case model, case files, the exact merge and the
// whole-problem composition, the states of empty ranges, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "attnfuzz/corpus.h"
#include "check/merge.h"
#include "check/runner.h"

namespace attnfuzz {
namespace {

Case merge_case(const char* mask, int64_t sq, int64_t sk, std::vector<int64_t> cuts, std::vector<double> shift = {}) {
  Problem p = make_problem(1, 2, 1, sq, sk, 8, 8);
  EXPECT_EQ(parse_mask(mask, p), "");
  Case c = make_case(p, 7);
  EXPECT_EQ(set_merge(c, std::move(cuts), std::move(shift)), "");
  return c;
}

TEST(MergeCase, GridValidatesDescribesAndRoundTripsThroughCaseFiles) {
  for (int32_t dt : {AF_DTYPE_F32, AF_DTYPE_F16, AF_DTYPE_BF16})
    for (const Case& c : merge_sweep_grid(0, dt)) {
      ASSERT_EQ(validate(c), "") << c.label;
      EXPECT_NE(describe(c).find(" merge="), std::string::npos) << c.label;
      const Case back = case_from_json(case_to_json(c));
      EXPECT_EQ(describe(back), describe(c)) << c.label;
      EXPECT_EQ(back.merge, c.merge) << c.label;
      for (int i = 0; i < 4; ++i) EXPECT_EQ(back.problem.state_o_stride[i], c.problem.state_o_stride[i]);
    }
  // A case without states writes no merge block (older files and names unchanged).
  Case plain = make_case(make_problem(1, 1, 1, 3, 5, 4, 4));
  EXPECT_FALSE(case_to_json(plain).contains("merge"));
}

TEST(MergeCase, BadInputIsOneSentence) {
  Case c = make_case(make_problem(1, 1, 1, 3, 10, 4, 4));
  EXPECT_NE(parse_merge("0,5", "", false, 0, c).find("from 0 to Sk = 10"), std::string::npos);
  EXPECT_NE(parse_merge("0,6,5,10", "", false, 0, c).find("must not decrease"), std::string::npos);
  EXPECT_NE(parse_merge("0,x,10", "", false, 0, c).find("not integers"), std::string::npos);
  EXPECT_NE(parse_merge("0,5,10", "0", false, 0, c).find("one per state"), std::string::npos);
  EXPECT_NE(parse_merge("0,5,10", "0,inf", false, 0, c).find("-inf"), std::string::npos);
  EXPECT_EQ(parse_merge("0,5,10", "0,-inf", true, 3, c), "");
  c.pass = Pass::kBwd;
  EXPECT_NE(validate(c).find("no backward"), std::string::npos);
}

TEST(MergeOracle, AnEmptyRangeIsAnEmptyStateAndAllEmptyIsTheFullyMaskedRow) {
  // causal-tl 6 x 6 cut at 0,2,6: row 0 and 1 see no key of state 1; a dropped state (-inf) is empty everywhere.
  Case c = merge_case("causal-tl", 6, 6, {0, 2, 6}, {0, -INFINITY});
  PreparedCase pc(c);
  const Problem& p = pc.problem();
  const Tensors& t = pc.tensors();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t s = 0; s < 6; ++s) {
      EXPECT_TRUE(std::isfinite(t.state_lse[state_lse_offset(p, 0, 0, h, s)]));
      EXPECT_EQ(t.state_lse[state_lse_offset(p, 1, 0, h, s)], -INFINITY);
      EXPECT_EQ(t.state_o[state_o_offset(p, t.cu_seqlens_q, 1, 0, s, h, 3)], 0.0f);
    }
  EXPECT_EQ(pc.merge_whole(OracleOptions{}), nullptr);  // shifted: the states are not one problem's
  Case e = merge_case("none", 3, 0, {0, 0, 0});
  PreparedCase pe(e);
  const OracleResult& ex = pe.oracle(OracleOptions{});
  for (const RowInfo& r : ex.rows) EXPECT_EQ(r.kind, RowKind::kFullyMasked);
  for (double x : ex.o) EXPECT_EQ(x, 0.0);
  for (double x : ex.lse) EXPECT_EQ(x, -INFINITY);
}

TEST(MergeOracle, AStateIsComputedFromItsOwnKeysOnly) {
  // As a split-KV kernel computes it: a NaN in v and an infinite k outside state 1's range [4, 8) leave state 1
  // finite (under a -inf bias, 0 * NaN and inf - inf made it NaN); the states that hold those keys are NaN.
  Case c = merge_case("none", 2, 12, {0, 4, 8, 12});
  ExplicitValues x{std::vector<float>(2 * 2 * 8, 1.0f), std::vector<float>(12 * 8, 0.25f),
                   std::vector<float>(12 * 8, 0.5f)};  // [B, S, H, D], one kv head
  x.v[1 * 8 + 3] = NAN;       // key 1 (state 0)
  x.k[10 * 8] = INFINITY;     // key 10 (state 2): a +inf score
  c.explicit_values = x;
  PreparedCase pc(c);
  const Problem& p = pc.problem();
  const Tensors& t = pc.tensors();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t s = 0; s < 2; ++s) {
      EXPECT_FLOAT_EQ(t.state_lse[state_lse_offset(p, 1, 0, h, s)],
                      static_cast<float>(std::log(4.0) + 2.0 * p.scale))
          << h << s;
      for (int64_t d = 0; d < 8; ++d)
        EXPECT_FLOAT_EQ(t.state_o[state_o_offset(p, t.cu_seqlens_q, 1, 0, s, h, d)], 0.5f);
      EXPECT_TRUE(std::isnan(t.state_o[state_o_offset(p, t.cu_seqlens_q, 0, 0, s, h, 3)]));
      EXPECT_TRUE(std::isnan(t.state_lse[state_lse_offset(p, 2, 0, h, s)]));
    }
}

TEST(MergeOracle, TheWholeComparisonFollowsTheMergeWhereAStateOfWeightZeroKeysIsEmpty) {
  // Found by a 90 s campaign over the built-in kernels (merge-states failed `wrong`): key 3 has k = +inf and v = NaN.
  // Row 1 (q = -1) scores it -inf: weight 0, and the whole problem's O is NaN there (0 * NaN), but state 1 holds key 3
  // alone, so its row 1 is empty (O = 0, LSE = -inf) and the merge of the states is finite. Row 0 (q = 0) scores it
  // NaN: NaN in both.
  Case c = merge_case("none", 2, 4, {0, 3, 4});
  ExplicitValues x{std::vector<float>(2 * 2 * 8, 0.0f), std::vector<float>(4 * 8, 0.0f), std::vector<float>(4 * 8, 0.0f)};
  for (int64_t h = 0; h < 2; ++h) x.q[static_cast<size_t>((1 * 2 + h) * 8)] = -1.0f;  // [B, Sq, Hq, D]: row 1
  x.k[3 * 8] = INFINITY;
  x.v[3 * 8] = NAN;
  c.explicit_values = x;
  PreparedCase pc(c);
  const OracleResult& merged = pc.oracle(OracleOptions{});
  const OracleResult* whole = pc.merge_whole(OracleOptions{});
  ASSERT_NE(whole, nullptr);
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(pc.tensors().state_lse[state_lse_offset(pc.problem(), 1, 0, h, 1)], -INFINITY);
    const size_t at = merged.o_at(0, 1, h, 0);
    EXPECT_EQ(merged.o[at], 0.0);
    EXPECT_EQ(whole->o[at], 0.0) << "the whole row's 0 * NaN is not the merge's";
    EXPECT_TRUE(std::isnan(whole->o[whole->o_at(0, 0, h, 0)]));
    EXPECT_TRUE(std::isnan(merged.o[merged.o_at(0, 0, h, 0)]));
  }
}

TEST(MergeOracle, ANaNInANonEmptyStateReachesOHoweverSmallItsWeight) {
  // Found on an H200 (corpus/seed/merge-nan-*.case): a merge that skipped states whose fp32 weight underflowed hid
  // their NaN. Row 0: state 1 at e^-350 below state 0 (fp32 weight 0, double weight > 0) holds a NaN in column 2;
  // state 2 is empty and holds a NaN in column 4 (an empty state adds nothing). Row 1: state 1 at e^-1000 (0 in
  // double too) holds +inf in column 3: outside the contract, whatever its weight.
  Case c = merge_case("none", 2, 12, {0, 4, 8, 12});
  PreparedCase pc(c);
  const Problem& p = pc.problem();
  Tensors t = pc.tensors();
  auto lse = [&](int64_t st, int64_t h, int64_t s) -> float& { return t.state_lse[state_lse_offset(p, st, 0, h, s)]; };
  auto o = [&](int64_t st, int64_t h, int64_t s, int64_t d) -> float& {
    return t.state_o[state_o_offset(p, t.cu_seqlens_q, st, 0, s, h, d)];
  };
  for (int64_t h = 0; h < 2; ++h) {
    lse(0, h, 0) = 0.f, lse(1, h, 0) = -350.f, lse(2, h, 0) = -INFINITY;
    o(1, h, 0, 2) = NAN, o(2, h, 0, 4) = NAN;
    lse(0, h, 1) = 0.f, lse(1, h, 1) = -1000.f, lse(2, h, 1) = -1.f;
    o(1, h, 1, 3) = INFINITY;
  }
  // Row 0 of head 1, column 5: 3e38 at weight 1 and at e^-0.5 under a state 10 higher: sum_s w_s |O_s5| ~ 2.2e34, but
  // an online merge holds 3e38 (1 + e^-0.5) before the third state: outside the contract (unweighted sum 6e38).
  lse(2, 1, 0) = 10.f, o(2, 1, 0, 5) = 1.f, lse(1, 1, 0) = -0.5f, o(1, 1, 0, 2) = 0.f;
  o(0, 1, 0, 5) = 3e38f, o(1, 1, 0, 5) = 3e38f;
  const OracleResult r = merge_oracle(p, t);
  EXPECT_EQ(r.rows[r.lse_at(0, 1, 0)].contract, ContractReason::kValueRange);
  for (int64_t h = 0; h < 1; ++h) {
    EXPECT_EQ(r.rows[r.lse_at(0, h, 0)].contract, ContractReason::kInside);
    EXPECT_TRUE(std::isnan(r.o[r.o_at(0, 0, h, 2)]));
    EXPECT_EQ(r.o_bound[r.o_at(0, 0, h, 2)], 0.0);
    for (int64_t d : {0, 1, 3, 4, 5, 6, 7}) EXPECT_TRUE(std::isfinite(r.o[r.o_at(0, 0, h, d)])) << d;
    EXPECT_TRUE(std::isfinite(r.lse[r.lse_at(0, h, 0)]));
  }
  for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(r.rows[r.lse_at(0, h, 1)].contract, ContractReason::kValueRange);
}

TEST(MergeOracle, TheMergeOfTheStatesIsTheWholeProblemWithinTheStatesRounding) {
  // For every unshifted grid case and dtype: |merge(given states) - whole exact| <= the composed bound's rounding
  // part, and the merged bound is positive where a row has keys.
  int compared = 0;
  for (int32_t dt : {AF_DTYPE_F32, AF_DTYPE_F16, AF_DTYPE_BF16})
    for (const Case& c : merge_sweep_grid(0, dt)) {
      PreparedCase pc(c);
      const OracleResult& m = pc.oracle(OracleOptions{});
      const OracleResult* w = pc.merge_whole(OracleOptions{});
      if (!w) continue;
      for (size_t i = 0; i < m.o.size(); ++i) {
        if (!std::isfinite(m.o[i]) || !std::isfinite(w->o_bound[i])) continue;
        EXPECT_LE(std::fabs(m.o[i] - w->o[i]), w->o_bound[i] - m.o_bound[i]) << c.label << " element " << i;
        ++compared;
      }
      for (size_t i = 0; i < m.lse.size(); ++i)
        if (std::isfinite(m.lse[i])) EXPECT_LE(std::fabs(m.lse[i] - w->lse[i]), w->lse_bound[i]) << c.label;
    }
  EXPECT_GT(compared, 1000);
}

TEST(MergeOracle, KindChecksKeepMergeAndAttentionKernelsApart) {
  Case c = merge_case("none", 3, 10, {0, 5, 10});
  af_kernel attention{};
  attention.name = "a";
  attention.family = "a";
  attention.launch = [](const af_problem*, const af_buffers*, void*) { return 0; };
  af_kernel merge = attention;
  merge.kind = AF_KIND_MERGE;
  EXPECT_NE(unsupported_reason(attention, c.problem).find("needs a merge kernel"), std::string::npos);
  EXPECT_EQ(unsupported_reason(merge, c.problem), "");
  EXPECT_NE(unsupported_reason(merge, unmerged(c).problem).find("merge cases only"), std::string::npos);
}

}  // namespace
}  // namespace attnfuzz
