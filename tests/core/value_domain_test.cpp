// value_domain_test.cpp - the finite and activations value domains (docs/semantics.md "Value domains"): no
// generated case holds NaN/Inf in q/k/v (sweep, flags, validate), extremes stay under finite, activations
// stay in their bounds and are ordinary, and the domains round-trip through corpus files.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "nonfinite_values.h"

namespace attnfuzz {
namespace {

bool has_nonfinite(const Case& c, const Tensors& t) { return test_util::has_nonfinite(c.problem, t); }

TEST(ValueDomain, Names) {
  ValueDomain d = ValueDomain::kIeee;
  EXPECT_EQ(parse_value_domain("finite", d), "");
  EXPECT_EQ(d, ValueDomain::kFinite);
  EXPECT_EQ(parse_value_domain("ieee", d), "");
  EXPECT_EQ(d, ValueDomain::kIeee);
  EXPECT_NE(parse_value_domain("Finite", d), "");
  EXPECT_STREQ(value_domain_name(ValueDomain::kFinite), "finite");
  EXPECT_EQ(space::special_kinds(ValueDomain::kIeee).size(), space::special_kinds().size());
  for (SpecialKind k : space::special_kinds(ValueDomain::kFinite))
    EXPECT_TRUE(k == SpecialKind::kSubnormal || k == SpecialKind::kHuge || k == SpecialKind::kNegZero);
  EXPECT_EQ(space::special_kinds(ValueDomain::kFinite).size(), 3u);
}

TEST(ValueDomain, FiniteSweepHoldsNoNaNOrInfButKeepsExtremes) {
  const auto ieee = sweep_grid(0), finite = sweep_grid(0, ValueDomain::kFinite);
  ASSERT_EQ(ieee.size(), finite.size());
  bool ieee_nonfinite = false, huge = false, subnormal = false, negzero = false;
  for (size_t i = 0; i < finite.size(); ++i) {
    const Case& c = finite[i];
    EXPECT_EQ(c.values.domain, ValueDomain::kFinite);
    EXPECT_EQ(validate(c), "") << c.label;
    const Tensors t = generate(c);
    EXPECT_FALSE(has_nonfinite(c, t)) << c.label;
    for (const auto& ps : t.placed) {
      huge |= ps.kind == SpecialKind::kHuge;
      subnormal |= ps.kind == SpecialKind::kSubnormal;
      negzero |= ps.kind == SpecialKind::kNegZero;
    }
    ieee_nonfinite |= has_nonfinite(ieee[i], generate(ieee[i]));
    if (ieee[i].values.specials.empty()) EXPECT_EQ(c.label, ieee[i].label);  // only special cases change
  }
  EXPECT_TRUE(ieee_nonfinite);  // the default sweep does place NaN / Inf
  EXPECT_TRUE(huge && subnormal && negzero);
  EXPECT_NE(describe(finite.front()).find("domain=finite"), std::string::npos);
  EXPECT_EQ(describe(ieee.front()).find("domain="), std::string::npos);
}

TEST(ValueDomain, ValidateRefusesNaNAndInfUnderFinite) {
  Case c = make_case(make_problem(1, 1, 1, 4, 4, 8, 8), 1);
  c.values.domain = ValueDomain::kFinite;
  for (const char* bad : {"nan@k:masked", "inf@v:visible", "-inf@q"}) {
    Case x = c;
    SpecialValue s;
    ASSERT_EQ(parse_special(bad, s), "");
    x.values.specials.push_back(s);
    EXPECT_NE(validate(x), "") << bad;
    x.values.domain = ValueDomain::kIeee;
    EXPECT_EQ(validate(x), "") << bad;
  }
  for (const char* ok : {"huge@k:masked*3", "subnormal@q*4", "-0@v"}) {
    Case x = c;
    SpecialValue s;
    ASSERT_EQ(parse_special(ok, s), "");
    x.values.specials.push_back(s);
    EXPECT_EQ(validate(x), "") << ok;
  }
  // Explicit values: a NaN at an element of k is refused; NaN in a stride gap is not a value of k.
  Case e = c;
  e.problem.k_stride[2] = 9;  // one padding float per key row
  e.problem.k_stride[1] = 9;
  e.problem.k_stride[0] = 36;
  ASSERT_EQ(validate(e.problem), "");
  const Tensors t = generate(e);
  EXPECT_FALSE(has_nonfinite(e, t));
  e.explicit_values = ExplicitValues{t.q, t.k, t.v};
  EXPECT_EQ(validate(e), "");  // the gap NaNs (kStrideGapBits) are fine
  e.explicit_values->k[k_index(e.problem, 0, 2, 0, 3)] = NAN;
  EXPECT_NE(validate(e), "");
}

TEST(ValueDomain, HugeBaseValuesAreClampedUnderFinite) {
  Case c = make_case(make_problem(1, 1, 1, 8, 8, 16, 16), 3);
  c.values.dist = {Distribution::kNormal, 1e300};
  EXPECT_TRUE(has_nonfinite(c, generate(c)));  // ieee: they overflow to +-Inf (as before)
  c.values.domain = ValueDomain::kFinite;
  const Tensors t = generate(c);
  EXPECT_FALSE(has_nonfinite(c, t));
  bool flt_max = false;
  for (float f : t.q) flt_max |= std::fabs(f) == FLT_MAX;
  EXPECT_TRUE(flt_max);
}

TEST(ValueDomain, RoundTripsThroughTheCorpusFile) {
  CorpusFile f;
  f.the_case = make_case(make_problem(1, 2, 1, 5, 7, 8, 8), 9);
  f.the_case.values.domain = ValueDomain::kFinite;
  SpecialValue s;
  ASSERT_EQ(parse_special("huge@k:masked*2", s), "");
  f.the_case.values.specials.push_back(s);
  const std::string text = to_corpus_text(f);
  EXPECT_NE(text.find("\"domain\": \"finite\""), std::string::npos);
  const CorpusFile back = parse_corpus(text);
  EXPECT_EQ(back.the_case.values.domain, ValueDomain::kFinite);
  EXPECT_EQ(case_hash(back), case_hash(f));
  // The ieee domain is written too, and a file without the field (older files) reads as ieee with the
  // same name as before (the hash leaves the default out).
  CorpusFile g = f;
  g.the_case.values.domain = ValueDomain::kIeee;
  const std::string gt = to_corpus_text(g);
  EXPECT_NE(gt.find("\"domain\": \"ieee\""), std::string::npos);
  Json j = case_to_json(g.the_case);
  ASSERT_TRUE(j["values"].contains("domain"));
  j["values"].erase("domain");
  CorpusFile og;
  og.the_case = case_from_json(j);
  EXPECT_EQ(og.the_case.values.domain, ValueDomain::kIeee);
  EXPECT_EQ(case_hash(og), case_hash(g));
  EXPECT_NE(case_hash(g), case_hash(f));  // the domain is part of the case's identity
  // A finite file with a NaN special is corrupt.
  std::string bad = text;
  for (size_t h; (h = bad.find("huge@k")) != std::string::npos;) bad.replace(h, 4, "nan");
  EXPECT_THROW(parse_corpus(bad), CorpusError);
  // An unknown domain is corrupt.
  std::string unk = text;
  for (size_t h; (h = unk.find("\"finite\"")) != std::string::npos;) unk.replace(h, 8, "\"wide\"");
  EXPECT_THROW(parse_corpus(unk), CorpusError);
}

// ---- issue 30: the activations domain (finite, |x| <= 64, outlier channels, scale near 1/sqrt(D)) ----

// The largest |x| over the addressed elements of q, k and v (sequence layouts: the tokens of the sequences).
float max_abs(const Problem& p, const Tensors& t) {
  float m = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d) m = std::max(m, std::fabs(t.q[q_offset(p, t, b, s, h, d)]));
    for (int64_t s = 0; s < seq_len_k(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) m = std::max(m, std::fabs(t.k[k_offset(p, t, b, s, h, d)]));
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          m = std::max(m, std::fabs(t.v[v_offset(p, t, b, s, h, d)]));
      }
  }
  return m;
}

TEST(ActivationsDomain, NameParseAndSpecialKinds) {
  ValueDomain d = ValueDomain::kIeee;
  EXPECT_EQ(parse_value_domain("activations", d), "");
  EXPECT_EQ(d, ValueDomain::kActivations);
  EXPECT_STREQ(value_domain_name(d), "activations");
  EXPECT_NE(parse_value_domain("activation", d).find("ieee, finite or activations"), std::string::npos);
  ASSERT_EQ(space::special_kinds(ValueDomain::kActivations).size(), 1u);  // -0 only
  EXPECT_EQ(space::special_kinds(ValueDomain::kActivations)[0], SpecialKind::kNegZero);
  EXPECT_TRUE(finite_domain(ValueDomain::kActivations));
  EXPECT_FALSE(value_in_domain(NAN, ValueDomain::kActivations));
  EXPECT_FALSE(value_in_domain(64.5f, ValueDomain::kActivations));
  EXPECT_TRUE(value_in_domain(-64.0f, ValueDomain::kActivations));
  EXPECT_EQ(to_domain(INFINITY, ValueDomain::kActivations), 64.0f);
  EXPECT_EQ(to_domain(-1e9f, ValueDomain::kActivations), -64.0f);
  EXPECT_EQ(to_domain(NAN, ValueDomain::kActivations), 0.0f);
  EXPECT_EQ(to_domain(-INFINITY, ValueDomain::kFinite), -FLT_MAX);
}

TEST(ActivationsDomain, ValidateRefusesWhatIsNotAnActivation) {
  Case c = make_case(make_problem(1, 2, 1, 6, 9, 16, 16), 4);
  c.values.domain = ValueDomain::kActivations;
  ASSERT_EQ(validate(c), "");
  for (const char* bad : {"nan@k:masked", "inf@v", "huge@q", "subnormal@k"}) {
    Case x = c;
    SpecialValue s;
    ASSERT_EQ(parse_special(bad, s), "");
    x.values.specials.push_back(s);
    EXPECT_NE(validate(x).find("activations value domain"), std::string::npos) << bad << ": " << validate(x);
  }
  Case z = c;
  SpecialValue neg0;
  ASSERT_EQ(parse_special("-0@v*2", neg0), "");
  z.values.specials.push_back(neg0);
  EXPECT_EQ(validate(z), "");
  Case x = c;
  x.values.dist = {Distribution::kExtreme, 30};
  EXPECT_NE(validate(x), "");
  x.values.dist = {Distribution::kUniform, 100};
  EXPECT_NE(validate(x), "");
  x = c;
  for (float s : {0.0f, -0.25f, 30.0f, 1e-3f, NAN}) {
    x.problem.scale = s;
    EXPECT_NE(validate(x).find("scale"), std::string::npos) << s;
  }
  x.problem.scale = 8 * default_scale(16);  // T5's unscaled logits at D = 64 are 8x: still a model's scale
  EXPECT_EQ(validate(x), "");
  // Explicit values: a NaN, or a magnitude past 64, is refused; 64 itself and the stride gaps are fine.
  Case e = c;
  const Tensors t = generate(e);
  e.explicit_values = ExplicitValues{t.q, t.k, t.v};
  EXPECT_EQ(validate(e), "");
  e.explicit_values->v[v_index(e.problem, 0, 3, 0, 2)] = 64.0f;
  EXPECT_EQ(validate(e), "");
  e.explicit_values->v[v_index(e.problem, 0, 3, 0, 2)] = NAN;
  EXPECT_NE(validate(e).find("activations value domain"), std::string::npos) << validate(e);
  e.explicit_values->v[v_index(e.problem, 0, 3, 0, 2)] = 65.0f;
  EXPECT_NE(validate(e), "");
  e.values.domain = ValueDomain::kFinite;
  EXPECT_EQ(validate(e), "");  // finite takes 65
}

TEST(ActivationsDomain, GeneratedValuesStayInBoundsWithOutlierChannels) {
  Case c = make_case(make_problem(2, 4, 2, 24, 40, 128, 64), 17);
  c.values.domain = ValueDomain::kActivations;
  c.values.dist = {Distribution::kNormal, 2};
  ASSERT_EQ(validate(c), "");
  const Tensors t = generate(c);
  EXPECT_FALSE(has_nonfinite(c, t));
  EXPECT_LE(max_abs(c.problem, t), 64.0f);
  // Outlier channels: per (tensor, head) a few channels hold magnitudes 10-50x the others', the same channels
  // at every batch and position. Here: the channel of q head 1 with the largest mean |x| against the median
  // channel.
  const Problem& p = c.problem;
  std::vector<double> mean(static_cast<size_t>(p.head_dim), 0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t d = 0; d < p.head_dim; ++d) mean[d] += std::fabs(t.q[q_index(p, b, s, 1, d)]);
  std::vector<double> sorted = mean;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(sorted.back(), 5 * sorted[sorted.size() / 2]);
  // 1 + 128 / 64 = 3 outlier channels at most: the fourth largest channel is an ordinary one.
  EXPECT_LT(sorted[sorted.size() - 4], 2 * sorted[sorted.size() / 2]);
  // The base values are the ieee / finite domains' (same streams): only the outlier channels and the clamp
  // differ.
  Case f = c;
  f.values.domain = ValueDomain::kFinite;
  const Tensors g = generate(f);
  int same = 0, total = 0;
  for (int64_t s = 0; s < p.seq_k; ++s)
    for (int64_t d = 0; d < p.head_dim; ++d, ++total)
      same += t.k[k_index(p, 0, s, 0, d)] == g.k[k_index(p, 0, s, 0, d)];
  EXPECT_GT(same, total * 9 / 10);
  EXPECT_LT(same, total);
  // A wide base distribution is clamped at 64 (and a dtype stores 64 exactly).
  c.values.dist = {Distribution::kUniform, 4};
  c.problem.dtype = AF_DTYPE_BF16;
  const Tensors w = generate(c);
  EXPECT_EQ(max_abs(c.problem, w), 64.0f);
}

TEST(ActivationsDomain, CasesAreOrdinaryAndFitMovesCasesIntoTheDomain) {
  Case c = make_case(make_problem(1, 1, 1, 9, 4, 16, 16), 2);
  ASSERT_EQ(parse_mask("causal-br", c.problem), "");
  c.values.domain = ValueDomain::kActivations;
  EXPECT_EQ(input_tier(c), InputTier::kOrdinary);
  // What ieee calls extreme or non-finite becomes an activation case (and ordinary) through fit_value_domain.
  Case x = c;
  x.values.dist = {Distribution::kExtreme, 300};
  x.problem.scale = -1;
  SpecialValue s;
  ASSERT_EQ(parse_special("nan@k:masked*2", s), "");
  x.values.specials.push_back(s);
  ASSERT_EQ(parse_special("-0@q", s), "");
  x.values.specials.push_back(s);
  x.values.domain = ValueDomain::kIeee;
  EXPECT_NE(input_tier(x), InputTier::kOrdinary);
  x.values.domain = ValueDomain::kActivations;
  EXPECT_NE(validate(x), "");
  fit_value_domain(x);
  EXPECT_EQ(validate(x), "");
  EXPECT_EQ(x.values.dist.kind, Distribution::kUniform);
  EXPECT_EQ(x.problem.scale, default_scale(16));
  ASSERT_EQ(x.values.specials.size(), 1u);
  EXPECT_EQ(x.values.specials[0].kind, SpecialKind::kNegZero);
  EXPECT_EQ(input_tier(x), InputTier::kOrdinary);
  const Case before = x;
  fit_value_domain(x);
  EXPECT_EQ(describe(x), describe(before));  // a case in the domain is left as it is
  EXPECT_NE(describe(x).find("domain=activations"), std::string::npos);
  // The sweep under activations: every case in the domain, ordinary, inside its bounds; the special-value and
  // extreme cases are left out.
  const auto grid = sweep_grid(0, ValueDomain::kActivations);
  ASSERT_GT(grid.size(), 20u);
  EXPECT_LT(grid.size(), sweep_grid(0).size());
  for (const Case& g : grid) {
    EXPECT_EQ(validate(g), "") << g.label;
    EXPECT_EQ(input_tier(g), InputTier::kOrdinary) << g.label;
    EXPECT_EQ(g.label.find("extreme"), std::string::npos) << g.label;
    const Tensors t = generate(g);
    EXPECT_FALSE(has_nonfinite(g, t)) << g.label;
    EXPECT_LE(max_abs(g.problem, t), 64.0f) << g.label;
  }
}

TEST(ActivationsDomain, RoundTripsThroughTheCorpusFile) {
  CorpusFile f;
  f.the_case = make_case(make_problem(1, 2, 1, 5, 7, 8, 8), 9);
  f.the_case.values.domain = ValueDomain::kActivations;
  const std::string text = to_corpus_text(f);
  EXPECT_NE(text.find("\"domain\": \"activations\""), std::string::npos);
  const CorpusFile back = parse_corpus(text);
  EXPECT_EQ(back.the_case.values.domain, ValueDomain::kActivations);
  EXPECT_EQ(case_hash(back), case_hash(f));
}

}  // namespace
}  // namespace attnfuzz
