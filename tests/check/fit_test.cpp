// fit_test.cpp - sweeps reshaped to a kernel's declaration (check/fit.h): a one-head varlen kernel and a decode
// kernel of at most 4 query rows get every case of their layout sweeps (issue 25 item 4); a kernel declaring some
// of a variant sweep's variants gets every case under those (issue 28).
#include "check/fit.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "check/runner.h"

namespace attnfuzz {
namespace {

int no_launch(const af_problem*, const af_buffers*, void*) { return 0; }

int one_head(const af_problem* p, char* why, size_t n) {
  if (p->heads_q == 1 && p->heads_kv == 1) return 0;
  if (why) std::snprintf(why, n, "one head only");
  return 1;
}

int four_rows(const af_problem* p, char* why, size_t n) {
  if (p->seq_q <= 4) return 0;
  if (why) std::snprintf(why, n, "at most 4 query rows");
  return 1;
}

af_kernel kernel(const char* name, int (*check)(const af_problem*, char*, size_t)) {
  af_kernel k{};
  k.name = name;
  k.family = "test";
  k.writes_lse = 1;
  k.check_support = check;
  k.launch = no_launch;
  k.features = AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED | AF_FEATURE_SEQUSED_K;
  return k;
}

// How many of a layout's sweep cases kernel k gets (as they are, or fitted), and how many were fitted.
std::pair<size_t, size_t> coverage(const std::string& layout, const af_kernel& k) {
  size_t got = 0, fitted = 0;
  for (const Case& c : layout_sweep_grid(layout, 0)) {
    const std::optional<Case> f = fit_to_kernel(c, k);
    if (!f) continue;
    ++got;
    EXPECT_EQ(case_unsupported_reason(k, f->problem, f->pass), "") << f->label;
    EXPECT_EQ(validate(*f), "") << f->label;
    if (f->label != c.label) {
      ++fitted;
      EXPECT_NE(f->label.find("-fit-"), std::string::npos) << f->label;
    }
  }
  return {got, fitted};
}

TEST(Fit, AOneHeadVarlenKernelGetsEveryVarlenCase) {
  const af_kernel k = kernel("one-head", one_head);
  for (const char* layout : {"varlen", "varlen-q", "varlen-k", "kvcache", "paged"}) {
    const auto [got, fitted] = coverage(layout, k);
    EXPECT_EQ(got, layout_sweep_grid(layout, 0).size()) << layout;
    EXPECT_GT(fitted, 0u) << layout;  // the grid has GQA / MHA cases of 4 heads: they are fitted
  }
}

TEST(Fit, ADecodeKernelOfFourRowsGetsEveryPagedCase) {
  const af_kernel k = kernel("four-rows", four_rows);
  for (const char* layout : {"paged", "decode", "kvcache"}) {
    const auto [got, fitted] = coverage(layout, k);
    EXPECT_EQ(got, layout_sweep_grid(layout, 0).size()) << layout;
    if (std::string(layout) == "paged") EXPECT_GT(fitted, 0u);  // the paged grid has 16- and 33-row cases
  }
}

TEST(Fit, AClaimedCaseIsKeptAsItIs) {
  const af_kernel k = kernel("any", nullptr);
  for (const Case& c : layout_sweep_grid("varlen", 0)) {
    const std::optional<Case> f = fit_to_kernel(c, k);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->label, c.label);
    EXPECT_EQ(describe(*f), describe(c));
  }
}

TEST(Fit, AKernelWithoutTheLayoutIsNotFitted) {
  af_kernel k = kernel("dense-only", nullptr);
  k.features = 0;
  for (const Case& c : layout_sweep_grid("paged", 0)) EXPECT_FALSE(fit_to_kernel(c, k)) << c.label;
}

// `--sweep --variant sink+softcap+alibi+bias+block-sparse`: a sink-only kernel gets every case of the grid with its
// sink and nothing else changed (the same q, k, v); a kernel declaring none of them, or all, is not fitted.
TEST(Fit, AVariantSweepCaseKeepsTheVariantsAKernelDeclares) {
  af_kernel k = kernel("sink-only", nullptr);
  k.features = 0;
  k.variants = AF_VARIANT_SINK;
  af_kernel none = k, all = k;
  none.variants = 0;
  all.variants = kScoreVariants | AF_VARIANT_BLOCK_SPARSE;
  const std::vector<Case> grid =
      variant_sweep_grid(kScoreVariants | AF_VARIANT_BLOCK_SPARSE, 0, ValueDomain::kIeee, AF_DTYPE_F32, Pass::kFwd);
  size_t fitted = 0, same_values = 0;
  for (const Case& c : grid) {
    EXPECT_FALSE(fit_variants(c, none)) << c.label;
    EXPECT_FALSE(fit_variants(c, all)) << c.label;
    const std::optional<Case> f = fit_to_kernel(c, k);
    ASSERT_TRUE(f) << c.label;
    ++fitted;
    EXPECT_EQ(case_unsupported_reason(k, f->problem, f->pass), "") << f->label;
    EXPECT_EQ(f->problem.variants, c.problem.variants & AF_VARIANT_SINK) << f->label;
    EXPECT_EQ(f->label, c.label + "-fit-sink") << f->label;
    EXPECT_EQ(f->problem.softcap, 0.0f);
    EXPECT_TRUE(f->variants.block_mask.empty() && f->variants.bias.empty()) << f->label;
    // Special values placed at masked keys move with the mask; the other cases keep every value.
    if (!c.values.specials.empty()) continue;
    const Tensors a = generate(c), b = generate(*f);
    EXPECT_EQ(a.q, b.q) << f->label;
    EXPECT_EQ(a.k, b.k) << f->label;
    EXPECT_EQ(a.v, b.v) << f->label;
    EXPECT_EQ(a.sinks, b.sinks) << f->label;  // the kept variant's own values too
    ++same_values;
  }
  EXPECT_EQ(fitted, grid.size());
  EXPECT_GT(same_values, grid.size() / 2);
}

}  // namespace
}  // namespace attnfuzz
