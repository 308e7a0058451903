// masks_test.cpp - the custom masks in the oracle (issue 28 item 4): hidden keys are keys outside the interval (the
// same O, LSE, gradients and bounds as the problem with those keys removed), never read (NaN there changes nothing),
// fully hidden rows are empty rows, bits = dense, block values 0 / 1 / 2; the fast path against the arbiter.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "attnfuzz/case.h"
#include "oracle/grad.h"
#include "oracle/oracle.h"
#include "tests/oracle/oracle_options.h"

namespace attnfuzz {
namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();

struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs random_inputs(const Problem& p, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Inputs in{std::vector<float>(q_elements(p)), std::vector<float>(k_elements(p)), std::vector<float>(v_elements(p)),
            std::vector<float>(o_elements(p))};
  for (auto* x : {&in.q, &in.k, &in.v, &in.dout})
    for (float& f : *x) f = u(g);
  return in;
}

using test_util::k1Thread;

// Sq = 1, Sk = 6, one head, D = Dv = 4: keys 1 and 4 hidden by a dense mask (key j hidden where mask[j] == 0),
// random inputs. Not copyable: vi points into mask.
struct TwoHiddenKeys {
  Case c = make_case(make_problem(1, 1, 1, 1, 6, 4, 4), 1);
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 0, 1};
  Inputs in;
  VariantInputs vi;
  TwoHiddenKeys() {
    EXPECT_EQ(set_mask_variants(c, AF_VARIANT_MASK_DENSE), "");
    in = random_inputs(c.problem, 7);
    vi.custom_mask = mask.data();
  }
  TwoHiddenKeys(const TwoHiddenKeys&) = delete;
  OracleResult oracle(const OracleOptions& o) const {
    return compute_oracle(c.problem, in.q.data(), in.k.data(), in.v.data(), vi, o);
  }
};

// The same on the multiprecision arbiter (a row the fast path cannot certify takes it): a NaN v at a hidden key
// left the bound NaN there (found on an H200 campaign: a correct flash kernel failed with "bound nan").
TEST(OracleMasks, TheArbitersBoundNeverReadsAHiddenKey) {
  TwoHiddenKeys t;
  t.in.v[1 * 4 + 2] = kNaNf;
  OracleOptions mp = k1Thread;
  mp.force_multiprecision = true;
  const OracleResult r = t.oracle(mp);
  for (int d = 0; d < 4; ++d) {
    EXPECT_TRUE(std::isfinite(r.o[d])) << d;
    EXPECT_TRUE(std::isfinite(r.o_bound[d]) && r.o_bound[d] > 0) << d << ": " << r.o_bound[d];
  }
}

// The reference drops the hidden keys (k, v rows removed).
TEST(OracleMasks, HiddenKeysAreKeysRemovedAndNeverRead) {
  TwoHiddenKeys t;
  t.in.k[1 * 4 + 2] = kNaNf;  // hidden keys 1 and 4 hold NaN / inf: never read
  t.in.v[4 * 4 + 0] = std::numeric_limits<float>::infinity();
  const OracleResult r = t.oracle(k1Thread);
  Problem small = make_problem(1, 1, 1, 1, 4, 4, 4);
  std::vector<float> k2, v2;
  for (int j : {0, 2, 3, 5})
    for (int d = 0; d < 4; ++d) k2.push_back(t.in.k[j * 4 + d]), v2.push_back(t.in.v[j * 4 + d]);
  const OracleResult s = compute_oracle(small, t.in.q.data(), k2.data(), v2.data(), k1Thread);
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(r.o[d], s.o[d]);
    EXPECT_EQ(r.o_bound[d], s.o_bound[d]);
  }
  EXPECT_EQ(r.lse[0], s.lse[0]);
  EXPECT_TRUE(r.rows[0].inside_contract());
}

TEST(OracleMasks, AFullyHiddenRowIsAnEmptyRowForwardAndBackward) {
  Problem p = make_problem(1, 1, 1, 3, 5, 4, 4);
  Case c = make_case(p, 1);
  ASSERT_EQ(set_mask_variants(c, AF_VARIANT_MASK_DENSE, "ones"), "");
  Tensors t = generate(c);
  std::fill(t.custom_mask.begin() + 5, t.custom_mask.begin() + 10, uint8_t{0});  // row 1 sees nothing
  const OracleResult r = compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), t.variant_inputs(), k1Thread);
  EXPECT_EQ(r.rows[1].kind, RowKind::kFullyMasked);
  EXPECT_EQ(r.lse[1], -std::numeric_limits<double>::infinity());
  for (int d = 0; d < 4; ++d) EXPECT_EQ(r.o[r.o_at(0, 1, 0, d)], 0.0);
  Inputs in = random_inputs(c.problem, 3);
  std::vector<float> o(r.o.begin(), r.o.end()), lse(r.lse.begin(), r.lse.end());
  const GradResult g = compute_grad_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), in.dout.data(), o.data(),
                                           lse.data(), t.variant_inputs(), GradOptions{});
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(g.dq[g.dq_at(0, 1, 0, d)], 0.0);
    EXPECT_EQ(g.dq_bound[g.dq_at(0, 1, 0, d)], 0.0);
  }
}

// The same pattern as bytes and as bits, with and without a block mask of partial blocks: one result; full blocks
// are no mask; empty blocks hide everything.
TEST(OracleMasks, BitsEqualDenseAndBlockValuesMeanEmptyFullPartial) {
  Problem p = make_problem(2, 2, 1, 11, 21, 8, 8);
  Case dense = make_case(p, 5), bits = make_case(p, 5), plain = make_case(p, 5);
  ASSERT_EQ(set_mask_variants(dense, AF_VARIANT_MASK_DENSE | AF_VARIANT_BLOCK_SPARSE, "random:0.5", "partial", "", 4, 8),
            "");
  ASSERT_EQ(set_mask_variants(bits, AF_VARIANT_MASK_BITS | AF_VARIANT_BLOCK_SPARSE, "random:0.5", "partial", "", 4, 8),
            "");
  auto run = [](const Case& c) {
    const Tensors t = generate(c);
    return compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), t.variant_inputs(), k1Thread);
  };
  const OracleResult a = run(dense), b = run(bits), n = run(plain);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_NE(a.o, n.o);
  Case full = dense;
  full.variants.block_pattern = "full";
  EXPECT_EQ(run(full).o, n.o);  // a full block never reads the custom mask
  Case empty = dense;
  empty.variants.block_pattern = "zeros";
  for (double x : run(empty).o) EXPECT_EQ(x, 0.0);
}

TEST(OracleMasks, FastPathAgreesWithTheArbiter) {
  Problem p = make_problem(1, 2, 1, 17, 40, 16, 16);
  (void)parse_mask("causal-br", p);
  Case c = make_case(p, 9);
  ASSERT_EQ(set_mask_variants(c, AF_VARIANT_MASK_BITS | AF_VARIANT_BLOCK_SPARSE, "rows:0.6", "mixed", "", 4, 8), "");
  const Tensors t = generate(c);
  OracleOptions mp = k1Thread;
  mp.force_multiprecision = true;
  const OracleResult f = compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), t.variant_inputs(), k1Thread);
  const OracleResult m = compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), t.variant_inputs(), mp);
  for (size_t e = 0; e < f.o.size(); ++e) EXPECT_NEAR(f.o[e], m.o[e], 1e-14 + 1e-6 * f.o_bound[e]);
}

TEST(OracleMasks, ValidateNamesEveryBadMaskInOneSentence) {
  Case c = make_case(make_problem(1, 2, 1, 5, 13, 8, 8), 1);
  ASSERT_EQ(set_mask_variants(c, AF_VARIANT_MASK_BITS), "");
  EXPECT_EQ(validate(c), "");
  c.problem.mask_stride[2] = 1;  // a bits row of 13 keys needs 2 bytes
  EXPECT_NE(validate(c).find("row stride (1 bytes) is shorter than a row (2 bytes)"), std::string::npos) << validate(c);
  ASSERT_EQ(set_mask_variants(c, AF_VARIANT_MASK_DENSE), "");
  c.variants.custom_mask.assign(3, 1);
  EXPECT_NE(validate(c).find("holds 3 bytes"), std::string::npos) << validate(c);
  c.variants.custom_mask.clear();
  c.problem.variants |= AF_VARIANT_MASK_BITS;
  EXPECT_NE(validate(c).find("exclusive"), std::string::npos) << validate(c);
  ASSERT_EQ(set_mask_variants(c, AF_VARIANT_BLOCK_SPARSE, "random:0.5", "mixed", "", 4, 4), "");
  c.variants.block_mask.assign(static_cast<size_t>(block_mask_bytes(c.problem)), 3);
  EXPECT_NE(validate(c).find("need 0 (empty), 1 (full) or 2 (partial)"), std::string::npos) << validate(c);
  c.variants.block_mask.clear();
  c.problem.block_q = 0;
  EXPECT_NE(validate(c).find("block sizes must be in"), std::string::npos) << validate(c);
  EXPECT_NE(set_mask_variants(c, AF_VARIANT_MASK_DENSE, "sometimes"), "");
}

}  // namespace
}  // namespace attnfuzz
