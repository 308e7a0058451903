// generators_test.cpp - the case generators stay in bounds and in the case space, print readably, and shrink.
#include "properties/generators.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "attnfuzz/problem.h"

namespace attnfuzz::props {
namespace {

bool in_space_or_range(int64_t x, const std::vector<int64_t>& edges, int64_t lo, int64_t hi) {
  return std::find(edges.begin(), edges.end(), x) != edges.end() || (x >= lo && x <= hi);
}

// Issue 15: sequence cases are valid, bounded and use only the layouts the features allow.
RC_GTEST_PROP(Generators, SequenceCasesAreValidAndFollowTheFeatures, ()) {
  const CaseLimits l;
  const uint32_t all = AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED | AF_FEATURE_SEQUSED_K;
  const Case c = *gen_sequence_case(l, all);
  RC_ASSERT(validate(c).empty());
  RC_ASSERT(has_sequences(c.problem));
  RC_ASSERT(c.problem.seq_q <= 130 && c.problem.seq_k <= 130 + 256);
  const Case paged = *gen_sequence_case(l, AF_FEATURE_KV_PAGED | AF_FEATURE_SEQUSED_K);
  RC_ASSERT(validate(paged).empty());
  RC_ASSERT(paged.problem.q_layout == AF_SEQ_DENSE);
  RC_ASSERT(paged.problem.kv_layout != AF_SEQ_PACKED);
  const Case packed = *gen_sequence_case(l, AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED);
  RC_ASSERT(packed.problem.q_layout == AF_SEQ_PACKED && packed.problem.kv_layout == AF_SEQ_PACKED);
  RC_ASSERT(packed.seqs.used.empty());
}

// Issue 28: a kernel declaring AF_FEATURE_LAYOUT_VARIANTS gets layout cases with its layout variants (a subset of
// sink, softcap and ALiBi; never one it does not declare); without the feature, none.
TEST(Generators, SequenceCasesDrawTheDeclaredLayoutVariants) {
  const CaseLimits l;
  const uint32_t layouts = AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED | AF_FEATURE_SEQUSED_K;
  const uint32_t declared = AF_VARIANT_SINK | AF_VARIANT_ALIBI | AF_VARIANT_BIAS;
  uint32_t seen = 0;
  for (int i = 0; i < 200; ++i) {
    const rc::Random r(static_cast<uint64_t>(i) + 7);
    const Case c = gen_sequence_case(l, layouts | AF_FEATURE_LAYOUT_VARIANTS, declared)(r, 30).value();
    ASSERT_EQ(validate(c), "") << describe(c);
    seen |= c.problem.variants;
    EXPECT_EQ(gen_sequence_case(l, layouts, declared)(r, 30).value().problem.variants, 0u);
  }
  EXPECT_EQ(seen, AF_VARIANT_SINK | AF_VARIANT_ALIBI);
}

TEST(Generators, SequenceLengthsReachTheEdges) {
  bool zero = false, one = false, residue = false, long_short = false;
  for (int i = 0; i < 400; ++i) {
    const auto v = gen_seq_lengths(130, 4)(rc::Random(static_cast<uint64_t>(i) + 1), 50).value();
    for (int64_t x : v) {
      zero |= x == 0;
      one |= x == 1;
      residue |= x > 16 && (x % 16 == 1 || x % 16 == 15);
    }
    const auto mx = *std::max_element(v.begin(), v.end());
    long_short |= v.size() > 1 && mx >= 64 && std::count_if(v.begin(), v.end(), [](int64_t x) { return x <= 3; }) >= 1;
  }
  EXPECT_TRUE(zero && one && residue && long_short);
}

RC_GTEST_PROP(Generators, CasesAreValidAndBounded, ()) {
  const CaseLimits l;
  const Case c = *gen_case(l);
  const Problem& p = c.problem;
  RC_ASSERT(validate(c).empty());
  RC_ASSERT(p.batch * p.heads_q <= l.max_bh);
  RC_ASSERT(p.seq_q >= 1 && p.seq_q <= l.max_seq);
  RC_ASSERT(p.seq_k >= 0 && p.seq_k <= l.max_seq);
  RC_ASSERT(p.head_dim >= 1 && p.head_dim <= l.max_d);
  RC_ASSERT(p.head_dim_v >= 1 && p.head_dim_v <= l.max_dv);
  RC_ASSERT(in_space_or_range(p.seq_q, space::edge_seq_lengths(l.max_seq), 1, l.max_seq));
  RC_ASSERT(c.values.specials.size() <= 3u);
  const auto& hc = space::head_configs();
  RC_ASSERT(std::find(hc.begin(), hc.end(), std::make_pair(p.heads_q, p.heads_kv)) != hc.end());
  RC_TAG(mask_to_string(p) == "none" ? "mask none" : "masked");
}

RC_GTEST_PROP(Generators, LimitsAreHonoured, ()) {
  CaseLimits l;
  l.require_mask = true;
  l.min_seq_q = 2;
  l.min_bh = 2;
  l.dv_eq_d = true;
  l.max_d = l.max_dv = 64;
  l.masks = AF_SUPPORTS_CAUSAL_BR | AF_SUPPORTS_WINDOW_TL;
  l.specials = false;
  l.extreme = false;
  l.allow_empty_k = false;
  const Case c = *gen_case(l);
  const Problem& p = c.problem;
  RC_ASSERT(p.mask_kind != AF_MASK_NONE);
  RC_ASSERT((mask_support_bit(p) & l.masks) != 0u);
  RC_ASSERT(p.seq_q >= 2);
  RC_ASSERT(p.seq_k >= 1);
  RC_ASSERT(p.batch * p.heads_q >= 2);
  RC_ASSERT(p.head_dim == p.head_dim_v);
  RC_ASSERT(p.head_dim <= 64);
  RC_ASSERT(c.values.specials.empty());
  RC_ASSERT(c.values.dist.kind != Distribution::kExtreme);
}

// Issue 11 item 3: under the finite domain the generators place no NaN/Inf (special kinds are subnormal,
// huge, -0 only), and the generated values hold none.
RC_GTEST_PROP(Generators, FiniteDomainHoldsNoNaNOrInf, ()) {
  CaseLimits l;
  l.domain = ValueDomain::kFinite;
  const Case c = *gen_case(l);
  RC_ASSERT(c.values.domain == ValueDomain::kFinite);
  RC_ASSERT(validate(c).empty());
  for (const SpecialValue& s : c.values.specials) RC_ASSERT(special_in_domain(s.kind, ValueDomain::kFinite));
  const Tensors t = generate(c);
  for (const PlacedSpecial& ps : t.placed)
    RC_ASSERT(std::isfinite((ps.tensor == Tensor::kQ ? t.q : ps.tensor == Tensor::kK ? t.k : t.v)[ps.index]));
  const Problem& p = c.problem;
  for (int64_t s = 0; s < p.seq_k; ++s)
    for (int64_t d = 0; d < p.head_dim_v; ++d) RC_ASSERT(std::isfinite(t.v[v_index(p, 0, s, 0, d)]));
  RC_TAG(c.values.specials.empty() ? "no specials" : "specials");
}

TEST(Generators, KernelLimits) {
  af_kernel k{};
  k.max_head_dim = 32;
  k.max_head_dim_v = 16;
  k.masks = AF_SUPPORTS_MASK_NONE | AF_SUPPORTS_CAUSAL_TL;
  const CaseLimits l = limits_for(k);
  EXPECT_EQ(l.max_d, 32);
  EXPECT_EQ(l.max_dv, 16);
  EXPECT_EQ(l.masks, AF_SUPPORTS_MASK_NONE | AF_SUPPORTS_CAUSAL_TL);
  k.needs_dv_eq_d = 1;
  const CaseLimits e = limits_for(k);
  EXPECT_TRUE(e.dv_eq_d);
  EXPECT_EQ(e.max_d, 16);
}

TEST(Generators, ShowValueIsDescribe) {
  Case c = make_case(make_problem(1, 2, 1, 7, 13, 59, 59), 42);
  std::ostringstream os;
  showValue(c, os);
  EXPECT_EQ(os.str(), describe(c));
  std::ostringstream rs;
  rc::show(c, rs);  // what RapidCheck prints for a counterexample
  EXPECT_EQ(rs.str(), describe(c));
}

// Swallows RapidCheck's events, so the deliberately failing probes below leave no "had failures" note.
struct SilentListener : rc::detail::TestListener {
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

// Runs a failing property with a fixed seed and returns the minimal counterexample RapidCheck ends with.
template <typename Pred>
Case minimal_failure(Pred fails, uint64_t seed) {
  static std::optional<Case> last;
  last.reset();
  rc::detail::TestParams params;
  params.seed = seed;
  params.maxSuccess = 200;
  rc::detail::TestMetadata md;
  md.id = md.description = "shrink-probe";
  SilentListener listener;
  const auto result = rc::detail::checkTestable(
      [&]() {
        const Case c = *gen_case();
        if (fails(c)) {
          last = c;
          RC_FAIL("probe");
        }
      },
      md, params, listener);
  EXPECT_TRUE(result.template is<rc::detail::FailureResult>());
  EXPECT_TRUE(last.has_value());
  return last.value_or(Case{});
}

// Shrinking reduces every shape dimension the failure does not need, and simplifies the values.
TEST(Generators, ShrinkingReducesShapesAndSimplifiesValues) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const Case c = minimal_failure([](const Case& c) { return c.problem.seq_q >= 20; }, seed);
    const Problem& p = c.problem;
    // 20 itself, or the smallest edge length above it (31) when the failure came from the edge list.
    EXPECT_TRUE(p.seq_q == 20 || p.seq_q == 31) << describe(c);
    EXPECT_EQ(p.seq_k, p.seq_q) << describe(c);  // Sk == Sq is the simplest Sk
    EXPECT_EQ(p.batch, 1) << describe(c);
    EXPECT_EQ(p.heads_q, 1) << describe(c);
    EXPECT_EQ(p.head_dim, 1) << describe(c);
    EXPECT_EQ(p.head_dim_v, 1) << describe(c);
    EXPECT_EQ(mask_to_string(p), "none") << describe(c);
    EXPECT_EQ(p.scale, default_scale(1)) << describe(c);
    EXPECT_EQ(to_string(c.values.dist), "uniform:1") << describe(c);
    EXPECT_TRUE(c.values.specials.empty()) << describe(c);
    EXPECT_EQ(c.seed, 0u) << describe(c);
  }
}

TEST(Generators, ShrinkingKeepsOnlyTheNeededSpecial) {
  const Case c = minimal_failure(
      [](const Case& c) {
        for (const auto& s : c.values.specials)
          if (s.kind == SpecialKind::kPosInf && s.tensor == Tensor::kV) return true;
        return false;
      },
      7);
  ASSERT_EQ(c.values.specials.size(), 1u) << describe(c);
  EXPECT_EQ(to_string(c.values.specials[0]), "inf@v:random") << describe(c);
  EXPECT_EQ(c.problem.seq_q, 1) << describe(c);
  EXPECT_EQ(c.problem.head_dim, 1) << describe(c);
}

}  // namespace
}  // namespace attnfuzz::props
