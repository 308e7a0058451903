// dropout_test.cpp - Philox 4x32 against Random123's known answers; the FlashAttention keep layout, dropout fields,
// the keep-fraction test and the case codec (issue 29).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "attnfuzz/dropout.h"
#include "attnfuzz/philox.h"

namespace attnfuzz {
namespace {

// Random123 1.14 kat_vectors, "philox4x32 10": counter, key, output.
struct Kat {
  uint32_t c[4], k[2], out[4];
};
const Kat kKat10[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox, Random123KnownAnswers4x32x10) {
  for (const Kat& t : kKat10) {
    const PhiloxOut o = philox4x32(t.c[0], t.c[1], t.c[2], t.c[3], t.k[0], t.k[1], 10);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(o.v[i], t.out[i]) << std::hex << "word " << i << " of ctr " << t.c[0];
  }
}

TEST(Philox, FlashPhiloxIsSevenRoundsOnOffsetThenSubsequence) {
  const uint64_t seed = 0x299f31d0a4093822ull, sub = 0x0370734413198a2eull, off = 0x85a308d3243f6a88ull;
  const PhiloxOut f = flash_philox(seed, sub, off);
  const PhiloxOut r = philox4x32(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 7);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f.v[i], r.v[i]);
}

TEST(Philox, KeepThresholdAndLayout) {
  EXPECT_EQ(flash_keep_threshold(0.0f), 255u);  // p = 0 keeps every byte
  EXPECT_EQ(flash_keep_threshold(0.1f), 229u);
  // Every (lane, byte) of a 16 x 32 tile is drawn once.
  std::vector<int> seen(32 * 16, 0);
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 32; ++j) {
      const FlashDraw d = flash_dropout_draw(0, 0, 0, 1, i, j);
      EXPECT_EQ(d.subsequence, 0u);
      ++seen[static_cast<size_t>(d.offset * 16 + static_cast<uint64_t>(d.byte))];
    }
  for (int n : seen) EXPECT_EQ(n, 1);
  // Tile (1, 2) and head 1 of 3 in batch 1: subsequence and offset.
  const FlashDraw d = flash_dropout_draw(1000, 1, 1, 3, 17, 70);
  EXPECT_EQ(d.subsequence, 1u | (2ull << 32));
  EXPECT_EQ(d.offset, 1000u + (1 * 3 + 1) * 32 + (4 * 1 + 3));
}

Problem dropout_problem(int64_t sq, int64_t sk, double p, uint64_t offset = 0) {
  Problem pr = make_problem(2, 3, 1, sq, sk, 8, 8);
  EXPECT_EQ(set_dropout(pr, p, AF_DROPOUT_RNG_PHILOX_FLASH, 42, offset), "");
  return pr;
}

TEST(Dropout, ReferenceMaskIsAFunctionOfSeedOffsetBHIJOnly) {
  const Problem big = dropout_problem(40, 70, 0.3), small = dropout_problem(17, 33, 0.3);
  const std::vector<uint8_t> a = reference_keep_mask(big), b = reference_keep_mask(small);
  for (int64_t bb = 0; bb < 2; ++bb)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 17; ++i)
        for (int64_t j = 0; j < 33; ++j) ASSERT_EQ(a[keep_index(big, bb, h, i, j)], b[keep_index(small, bb, h, i, j)]);
  Problem zero = dropout_problem(17, 33, 0.0);
  for (uint8_t k : reference_keep_mask(zero)) ASSERT_EQ(k, 1);
}

TEST(Dropout, OffsetsPast2To32DoNotWrap) {
  const uint64_t near = (uint64_t{1} << 32) - 96;
  const Problem p = dropout_problem(16, 32, 0.5, near);
  const std::vector<uint8_t> full = reference_keep_mask(p);
  // The same draws with the counter offset truncated to 32 bits (the planted offset-wrap bug): some weights differ.
  int64_t differ = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 16; ++i)
        for (int64_t j = 0; j < 32; ++j) {
          FlashDraw d = flash_dropout_draw(near, b, h, 3, i, j);
          d.offset = static_cast<uint32_t>(d.offset);
          const int k = philox_byte(flash_philox(42, d.subsequence, d.offset), d.byte) <= flash_keep_threshold(0.5f);
          differ += k != full[keep_index(p, b, h, i, j)];
        }
  EXPECT_GT(differ, 100);
}

TEST(Dropout, KeepFractionTestPassesTheGeneratorAndCatchesBiasedMasks) {
  const Problem p = dropout_problem(64, 128, 0.25);
  const std::vector<uint8_t> ref = reference_keep_mask(p);
  const KeepTest ok = keep_fraction_test(p, ref);
  EXPECT_FALSE(ok.failed) << ok.evidence();
  EXPECT_EQ(ok.tests, 2 * 3 * 64 + 2 * 3 + 1);
  std::vector<uint8_t> ones(ref.size(), 1);  // nothing dropped
  EXPECT_TRUE(keep_fraction_test(p, ones).failed);
  std::vector<uint8_t> half = ref;  // one row drops everything
  for (int64_t j = 0; j < 128; ++j) half[keep_index(p, 0, 1, 5, j)] = 0;
  const KeepTest t = keep_fraction_test(p, half);
  EXPECT_TRUE(t.failed);
  EXPECT_EQ(t.worst_unit, "row b=0 h=1 i=5") << t.evidence();
}

TEST(Dropout, ValidationNamesTheField) {
  Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  EXPECT_NE(set_dropout(p, 1.0, AF_DROPOUT_RNG_EXPORTED, 1, 0).find("[0, 1)"), std::string::npos);
  EXPECT_NE(validate(p), "");
  EXPECT_NE(set_dropout(p, 0.1, AF_DROPOUT_RNG_PHILOX_TORCH, 1, 0).find("not pinned"), std::string::npos);
  EXPECT_EQ(set_dropout(p, 0.1, AF_DROPOUT_RNG_EXPORTED, 1, 0), "");
  EXPECT_EQ(validate(p), "");
  EXPECT_NE(describe(p).find("dropout=0.1 rng=exported"), std::string::npos) << describe(p);
}

TEST(Dropout, CaseFileRoundTrip) {
  for (const Case& c : dropout_sweep_grid(7, Pass::kFwdBwd)) {
    const Case back = case_from_json(case_to_json(c));
    EXPECT_EQ(back.problem.variants, c.problem.variants);
    EXPECT_EQ(back.problem.dropout_p, c.problem.dropout_p);
    EXPECT_EQ(back.problem.dropout_rng, c.problem.dropout_rng);
    EXPECT_EQ(back.problem.dropout_seed, c.problem.dropout_seed);
    EXPECT_EQ(back.problem.dropout_offset, c.problem.dropout_offset);
    EXPECT_EQ(describe(back), describe(c));
  }
}

}  // namespace
}  // namespace attnfuzz
