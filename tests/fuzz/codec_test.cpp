// codec_test.cpp - the fuzz codec is total and exact, the mutator stays in the domain, features and shrinking
// work.
#include "fuzz/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "attnfuzz/corpus.h"
#include "fuzz/campaign.h"
#include "fuzz/features.h"

namespace attnfuzz::fuzz {
namespace {

std::string text(const FuzzInput& in) {
  return std::to_string(in.kernel) + " " + case_to_json(in.the_case).dump();
}

std::vector<uint8_t> random_bytes(Rng& rng, size_t max_len) {
  std::vector<uint8_t> b(rng.below(max_len + 1));
  for (auto& x : b) x = static_cast<uint8_t>(rng.next());
  return b;
}

TEST(Codec, AnyBytesDecodeToAValidCase) {
  Rng rng(1);
  const FuzzLimits lim;
  for (int i = 0; i < 20000; ++i) {
    const auto b = random_bytes(rng, i % 2 ? 64 : 400);
    const FuzzInput in = decode(b.data(), b.size(), lim);
    ASSERT_EQ(in_domain(in.the_case, lim), "") << describe(in.the_case);
    if (i % 40 == 0) EXPECT_NO_THROW(generate(in.the_case));
  }
  const FuzzInput empty = decode(nullptr, 0, lim);
  EXPECT_EQ(in_domain(empty.the_case, lim), "");
}

TEST(Codec, DecodeThenEncodeRoundTrips) {
  Rng rng(2);
  for (int i = 0; i < 5000; ++i) {
    const auto b = random_bytes(rng, 200);
    const FuzzInput in = decode(b.data(), b.size());
    const auto e = encode(in);
    ASSERT_EQ(text(decode(e.data(), e.size())), text(in));
  }
}

TEST(Codec, EncodeThenDecodeIsExactForDomainCases) {
  Rng rng(3);
  const CaseDomain dom;
  for (int i = 0; i < 3000; ++i) {
    FuzzInput in = dom.init(rng);
    for (int m = 0; m < 5; ++m) dom.mutate(in, rng);
    ASSERT_EQ(dom.validate(in.the_case), "");
    in.the_case.label.clear();
    const auto e = encode(in);
    ASSERT_EQ(text(decode(e.data(), e.size())), text(in)) << dom.print(in);
  }
  // Explicit values, padded strides, raw scale and parameter survive too.
  Case c = make_case(make_problem(2, 4, 2, 5, 9, 7, 3), 99);
  c.problem.scale = 0.3f;
  c.problem.q_stride[2] = 9;
  c.problem.q_stride[1] = 36;
  c.problem.q_stride[0] = 180;
  c.values.dist = {Distribution::kNormal, 0.37};
  c.values.specials.push_back({SpecialKind::kNaN, Tensor::kV, Placement::kAt, 1, 1, 1, 8, 2});
  c = materialize(c);
  ASSERT_EQ(in_domain(c), "");
  const FuzzInput in{7, c};
  const auto e = encode(in);
  EXPECT_EQ(text(decode(e.data(), e.size())), text(in));
}

TEST(Codec, RandomBytesLandOnEdgeValues) {
  Rng rng(4);
  const auto edges = space::edge_seq_lengths(160);
  int hits = 0, n = 4000;
  for (int i = 0; i < n; ++i) {
    const auto b = random_bytes(rng, 100);
    const FuzzInput in = decode(b.data(), b.size());
    hits += std::count(edges.begin(), edges.end(), in.the_case.problem.seq_q) > 0;
  }
  EXPECT_GT(hits, n * 8 / 10);
}

TEST(Domain, MutationsStayInTheDomainAndReachTheSpace) {
  Rng rng(5);
  const CaseDomain dom;
  FuzzInput in = dom.init(rng);
  std::set<int> masks, tails;
  bool sk0 = false, nan_masked = false, extreme = false, explicit_values = false;
  for (int i = 0; i < 4000; ++i) {
    dom.mutate(in, rng);
    ASSERT_EQ(dom.validate(in.the_case), "") << dom.print(in);
    const Problem& p = in.the_case.problem;
    masks.insert(p.mask_kind * 2 + p.mask_align);
    tails.insert(static_cast<int>(p.seq_k % 16));
    sk0 |= p.seq_k == 0;
    extreme |= in.the_case.values.dist.kind == Distribution::kExtreme;
    explicit_values |= in.the_case.explicit_values.has_value();
    for (const auto& s : in.the_case.values.specials)
      nan_masked |= s.kind == SpecialKind::kNaN && s.placement == Placement::kMasked;
  }
  EXPECT_GE(masks.size(), 5u);
  EXPECT_GE(tails.size(), 8u);
  EXPECT_TRUE(sk0);
  EXPECT_TRUE(nan_masked);
  EXPECT_TRUE(extreme);
  EXPECT_TRUE(explicit_values);
}

TEST(Domain, CrossOverAndShrinksAreValid) {
  Rng rng(6);
  const CaseDomain dom;
  for (int i = 0; i < 500; ++i) {
    const FuzzInput a = dom.init(rng), b = dom.init(rng);
    const FuzzInput c = dom.cross_over(a, b, rng);
    ASSERT_EQ(dom.validate(c.the_case), "");
    for (const Case& s : dom.shrinks(c.the_case)) ASSERT_EQ(validate(s), "") << describe(s);
  }
}

TEST(Shrink, GreedyReachesTheSmallestFailingShape) {
  Case c = make_case(make_problem(3, 4, 2, 100, 90, 64, 64), 1);
  (void)parse_mask("causal-br", c.problem);
  c.values.specials.push_back({SpecialKind::kNaN, Tensor::kK, Placement::kMasked, 5});
  FuzzLimits big;
  big.max_seq = big.max_dim = big.max_work = 1 << 30;
  int checks = 0;
  // "Fails" while Sq >= 17 and the mask is causal: the minimum keeps exactly that.
  auto fails = [](const Case& x) { return x.problem.seq_q >= 17 && x.problem.mask_kind == AF_MASK_CAUSAL; };
  const Case m = shrink_case(c, CaseDomain(big), fails, 10000, checks);
  std::printf("shrunk in %d checks: %s\n", checks, describe(m).c_str());
  EXPECT_EQ(m.problem.seq_q, 17);
  EXPECT_EQ(m.problem.batch, 1);
  EXPECT_EQ(m.problem.heads_q, 1);
  EXPECT_EQ(m.problem.head_dim, 1);
  EXPECT_LE(m.problem.seq_k, 1);
  EXPECT_TRUE(m.values.specials.empty() || m.explicit_values);
  // Values were materialized and simplified to zeros.
  ASSERT_TRUE(m.explicit_values);
  for (float x : m.explicit_values->q) EXPECT_EQ(x, 0.f);
}

TEST(Features, CaseFeaturesSeeTailsMasksAndSpecials) {
  Case c = make_case(make_problem(1, 1, 1, 40, 9, 32, 32), 3);
  (void)parse_mask("causal-br", c.problem);  // rows 0..30 see no key
  c.values.specials.push_back({SpecialKind::kNaN, Tensor::kK, Placement::kRandom, 2});
  const Tensors t = generate(c);
  const CaseFeatures f = case_features(c, t);
  EXPECT_EQ(f.mask, 2);
  EXPECT_EQ(f.fully_masked, 1);
  EXPECT_EQ(f.special_kinds.size(), 2u);
  for (uint16_t id : f.ids) EXPECT_LT(id, kFeaturesPerKernel);
  // Late max keys: extreme magnitudes give running-max rises after the first key tile.
  Case e = make_case(make_problem(1, 1, 1, 8, 100, 16, 16), 4);
  e.values.dist = {Distribution::kExtreme, 30};
  const CaseFeatures fe = case_features(e, generate(e));
  EXPECT_GE(fe.max_change_tiles, 1);
  EXPECT_GE(fe.logit, 4);
  // Counters: one slot per kernel.
  std::fill(extra_counters(), extra_counters() + kCounterBytes, 0);
  CheckResult r;
  r.verdict = Verdict::kFail;
  r.failure = FailureClass::kMask;
  r.max_ratio = INFINITY;
  record_features(3, result_features(f, r));
  const uint8_t* slot3 = extra_counters() + 3 * kFeaturesPerKernel;
  EXPECT_GT(std::count_if(slot3, slot3 + kFeaturesPerKernel, [](uint8_t x) { return x != 0; }), 10);
  EXPECT_EQ(
      std::count_if(static_cast<const uint8_t*>(extra_counters()), slot3, [](uint8_t x) { return x != 0; }),
      0);
  EXPECT_EQ(ratio_bucket(INFINITY), 11);
  EXPECT_EQ(ratio_bucket(NAN), 11);
  EXPECT_EQ(ratio_bucket(0), 0);
  EXPECT_LT(ratio_bucket(0.9), ratio_bucket(1.5));
}

}  // namespace
}  // namespace attnfuzz::fuzz
