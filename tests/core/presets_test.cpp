// presets_test.cpp - the model preset table (issue 28 item 9): names, geometry, capped problems.
#include <gtest/gtest.h>

#include "attnfuzz/presets.h"

namespace attnfuzz {

TEST(Presets, EveryPresetHasAValidGeometry) {
  for (const ModelPreset& p : model_presets()) {
    EXPECT_GT(p.heads_kv, 0) << p.name;
    EXPECT_EQ(p.heads_q % p.heads_kv, 0) << p.name;
    const Problem pr = preset_problem(p, 16, 256);
    EXPECT_LE(pr.seq_k, 256) << p.name;
    EXPECT_LE(pr.seq_q, pr.seq_k) << p.name;
    EXPECT_EQ(pr.head_dim, p.head_dim) << p.name;
    EXPECT_EQ(pr.head_dim_v, p.head_dim_v) << p.name;
  }
}

TEST(Presets, ModelsOfIssue28) {
  const auto llama = find_preset("llama-3.1");
  ASSERT_TRUE(llama);
  EXPECT_EQ(llama->heads_q / llama->heads_kv, 8);
  EXPECT_EQ(llama->head_dim, 128);
  const auto gemma = find_preset("gemma-2");
  ASSERT_TRUE(gemma);
  const Problem g = preset_problem(*gemma, 16, 256);
  EXPECT_EQ(g.softcap, 50.f);
  EXPECT_TRUE(g.variants & AF_VARIANT_SOFTCAP);
  EXPECT_EQ(g.mask_kind, AF_MASK_WINDOW);
  EXPECT_EQ(g.window_left, 128);  // 4096 of 8192, scaled to 256 keys
  const auto oss = find_preset("gpt-oss");
  ASSERT_TRUE(oss);
  EXPECT_TRUE(preset_problem(*oss, 16, 256).variants & AF_VARIANT_SINK);
  const auto ds = find_preset("deepseek-v3");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->heads_q, 128);
  EXPECT_EQ(ds->head_dim, 576);
  EXPECT_EQ(ds->head_dim_v, 512);
  EXPECT_EQ(ds->pending, nullptr);  // MLA landed (issue 28 item 5): V a view of K's latent rows
  EXPECT_TRUE(ds->kv_shared);
  const Problem dp = preset_problem(*ds, 1, 64);
  EXPECT_TRUE(kv_shared(dp));
  EXPECT_EQ(validate(dp), "");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(dp.v_stride[i], dp.k_stride[i]);
  // Decode only: 1, 2 and 8 query tokens at each cap, every case kv-shared and valid.
  const std::vector<Case> grid = preset_sweep_grid(*ds, 0, ValueDomain::kIeee, AF_DTYPE_F32, Pass::kFwd);
  ASSERT_EQ(grid.size(), 6u);
  for (const Case& c : grid) {
    EXPECT_LE(c.problem.seq_q, 8) << c.label;
    EXPECT_TRUE(kv_shared(c.problem)) << c.label;
    EXPECT_EQ(validate(c), "") << c.label;
  }
  EXPECT_TRUE(find_preset("qwen-varlen")->varlen);
}

TEST(Presets, UnknownNameIsNotFound) {
  EXPECT_FALSE(find_preset("llama-9"));
  EXPECT_NE(preset_names().find("gpt-oss"), std::string::npos);
}

}  // namespace attnfuzz
