// value_domain_test.cpp - the finite value domain (docs/semantics.md "Value domains"): no generated case holds
// NaN/Inf in q/k/v (sweep, flags, validate), extremes stay, and the domain round-trips through corpus files.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <string>

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

}  // namespace
}  // namespace attnfuzz
