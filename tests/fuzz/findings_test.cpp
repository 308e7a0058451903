// findings_test.cpp - distinct failures grouped into findings (fuzz/findings.h): the same signature and minimal
// input pattern across kernels are one finding; another class, evidence kind, placement or tier is another.
#include "fuzz/findings.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../core/text_case.h"

namespace attnfuzz::fuzz {
namespace {

CorpusFile failure(const std::string& kernel, const std::string& signature, const char* mask, const char* special,
                   int64_t sk = 8) {
  CorpusFile f;
  f.the_case = test_util::text_case(make_problem(1, 1, 1, 8, sk, 8, 8), mask, "uniform:1", special);
  RecordedVerdict v;
  v.kernel = kernel;
  v.signature = signature;
  v.failure = FailureClass::kNonFinite;
  f.verdict = v;
  return f;
}

TEST(Findings, SameSignatureAndPatternAcrossKernelsIsOneFinding) {
  const std::vector<CorpusFile> fs = {
      failure("sdpa-math-bool", "non-finite:compare", "causal-br", "nan@k:masked"),
      failure("sdpa-math-float", "non-finite:compare", "causal-tl", "nan@k:masked*3", 12),  // other shape, count
      failure("sdpa-math-bool", "non-finite:compare", "causal-br", "nan@v:masked"),         // another tensor
      failure("sdpa-flash", "mask:mask/nan-leak", "causal-br", "nan@k:masked"),             // another evidence kind
      failure("sdpa-flash", "non-finite:compare", "none", "nan@k:masked"),                  // another mask family
      failure("sdpa-cudnn", "non-finite:compare", "causal-br", "nan@k:masked"),
  };
  std::vector<const CorpusFile*> ptrs;
  for (const CorpusFile& f : fs) ptrs.push_back(&f);
  const std::vector<Finding> g = group_findings(ptrs);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].kernels, (std::vector<std::string>{"sdpa-math-bool", "sdpa-math-float", "sdpa-cudnn"}));
  EXPECT_EQ(g[0].members, (std::vector<size_t>{0, 1, 5}));
  EXPECT_EQ(g[0].pattern, "non-finite-masked; causal; nan@k:masked");
  EXPECT_EQ(finding_line(g[0]),
            "non-finite:compare on non-finite-masked; causal; nan@k:masked: sdpa-math-bool, sdpa-math-float, "
            "sdpa-cudnn (3 kernels, 3 failures)");
  EXPECT_EQ(g[1].members, (std::vector<size_t>{2}));
}

// Two libraries' bugs are never one root cause: the same signature and pattern in torch_sdpa and in Pallas (an H100
// merge grouped jax-cudnn-window, sdpa-efficient-lower-right and pallas-gqa-decode as one mask:mask/other-mask) are
// two findings, each naming its adapter; plug-in kernels keep no implementation.
TEST(Findings, AdaptersAreNeverGroupedTogether) {
  auto on = [](CorpusFile f, const std::string& adapter) {
    f.verdict->backend = "adapter";
    f.verdict->device = "adapter 'python3 -m x' (" + adapter + ", protocol 1; host memory: no guard zones)";
    return f;
  };
  const std::vector<CorpusFile> fs = {
      on(failure("sdpa-efficient-lower-right", "mask:mask/other-mask", "causal-br", ""), "torch_sdpa"),
      on(failure("pallas-gqa-decode", "mask:mask/other-mask", "causal-br", ""), "pallas_attention"),
      on(failure("sdpa-cudnn-lower-right", "mask:mask/other-mask", "causal-tl", ""), "torch_sdpa"),
      failure("planted-causal-top-left", "mask:mask/other-mask", "causal-br", ""),
  };
  std::vector<const CorpusFile*> ptrs;
  for (const CorpusFile& f : fs) ptrs.push_back(&f);
  const std::vector<Finding> g = group_findings(ptrs);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].implementation, "torch_sdpa");
  EXPECT_EQ(g[0].kernels, (std::vector<std::string>{"sdpa-efficient-lower-right", "sdpa-cudnn-lower-right"}));
  EXPECT_EQ(g[1].implementation, "pallas_attention");
  EXPECT_EQ(g[2].implementation, "");
  EXPECT_EQ(finding_line(g[1]), "mask:mask/other-mask on ordinary; causal [pallas_attention]: pallas-gqa-decode "
                                "(1 kernel, 1 failure)");
  EXPECT_EQ(findings_json(g, {"a", "b", "c", "d"})[0]["implementation"], "torch_sdpa");
}

TEST(Findings, PatternNamesTierMaskVariantsPassAndPlacements) {
  Case c = test_util::text_case(make_problem(1, 2, 1, 4, 4, 8, 8), "window:2,0-br", "uniform:1", "-inf@q:at=0,1");
  c.pass = Pass::kBwd;
  EXPECT_EQ(input_pattern(c), "non-finite-visible; window; bwd; -inf@q:at");
  EXPECT_EQ(input_pattern(test_util::text_case(make_problem(1, 1, 1, 4, 4, 8, 8), "none", "extreme:300")),
            "extreme; no mask");
}

}  // namespace
}  // namespace attnfuzz::fuzz
