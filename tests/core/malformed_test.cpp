// malformed_test.cpp - malformed sequence metadata in the case model (core/malformed.cpp): parsing, fit, the defect
// applied to the uploaded arrays only, describe and the case file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"

namespace attnfuzz {
namespace {

// Packed q and K/V of 3 sequences (3, 0, 17 queries over 5, 1, 40 keys).
Case varlen_case() {
  Case c = make_case(make_problem(3, 2, 1, 1, 1, 16, 16), 5);
  c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
  c.seqs.q = {3, 0, 17};
  c.seqs.k = {5, 1, 40};
  EXPECT_EQ(set_sequence_fields(c), "");
  return c;
}

// Paged K/V: 2 sequences of 33 and 1 used keys in pages of 16, one spare page.
Case paged_case() {
  Case c = make_case(make_problem(2, 2, 1, 2, 1, 16, 16), 6);
  c.problem.kv_layout = AF_SEQ_PAGED;
  c.problem.page_size = 16;
  c.seqs.used = {33, 1};
  c.seqs.spare_pages = 1;
  EXPECT_EQ(set_sequence_fields(c), "");
  return c;
}

TEST(Malformed, ParsesKindAndSequenceAndRefusesTheRest) {
  Malformed m;
  EXPECT_EQ(parse_malformed("cu-k-decreasing@1", m), "");
  EXPECT_EQ(m.kind, Malformation::kCuKDecreasing);
  EXPECT_EQ(m.seq, 1);
  EXPECT_EQ(to_string(m), "cu-k-decreasing@1");
  EXPECT_EQ(parse_malformed("page-negative", m), "");
  EXPECT_EQ(m.seq, 0);
  EXPECT_NE(parse_malformed("cu-z", m).find("is not one of"), std::string::npos);
  EXPECT_NE(parse_malformed("seqused-negative@-1", m).find("integer >= 0"), std::string::npos);
  EXPECT_NE(parse_malformed("seqused-negative@", m), "");
}

TEST(Malformed, KindsFollowTheLayoutsArrays) {
  EXPECT_EQ(malformations_for(varlen_case().problem),
            (std::vector<Malformation>{Malformation::kCuQDecreasing, Malformation::kCuKDecreasing,
                                       Malformation::kCuKPastTotal}));
  EXPECT_EQ(malformations_for(paged_case().problem),
            (std::vector<Malformation>{Malformation::kSequsedOverCapacity, Malformation::kSequsedNegative,
                                       Malformation::kPageOutOfPool, Malformation::kPageNegative,
                                       Malformation::kPageUnusedOutOfPool}));
  EXPECT_TRUE(malformations_for(make_problem(1, 1, 1, 4, 4, 8, 8)).empty());
  EXPECT_TRUE(malformation_has_answer(Malformation::kPageUnusedOutOfPool));
  EXPECT_FALSE(malformation_has_answer(Malformation::kCuKDecreasing));
}

TEST(Malformed, ValidateRefusesADefectTheCaseCannotCarry) {
  Case c = varlen_case();
  c.seqs.malformed = {Malformation::kPageNegative, 0};
  EXPECT_NE(validate(c).find("has no such array"), std::string::npos) << validate(c);
  c.seqs.malformed = {Malformation::kCuKDecreasing, 3};
  EXPECT_NE(validate(c).find("there are 3 sequences"), std::string::npos) << validate(c);
  c.seqs.malformed = {Malformation::kCuKDecreasing, 1};
  EXPECT_EQ(validate(c), "");
  Case p = paged_case();  // sequence 1 uses 1 page of its 3 entries; sequence 0 uses all 3
  p.seqs.malformed = {Malformation::kPageUnusedOutOfPool, 0};
  EXPECT_NE(validate(p).find("uses every entry"), std::string::npos) << validate(p);
  p.seqs.malformed = {Malformation::kPageUnusedOutOfPool, 1};
  EXPECT_EQ(validate(p), "");
}

TEST(Malformed, OnlyTheUploadedArraysCarryTheDefect) {
  Case c = varlen_case();
  c.seqs.malformed = {Malformation::kCuKDecreasing, 1};
  const Tensors t = generate(c);
  EXPECT_EQ(t.cu_seqlens_k, (std::vector<int32_t>{0, 5, 6, 46}));  // the oracle's arrays stay well-formed
  const Tensors sent = malformed_arrays(c.problem, t);
  EXPECT_EQ(sent.cu_seqlens_k, (std::vector<int32_t>{0, 5, 4, 46}));
  EXPECT_EQ(sent.cu_seqlens_q, t.cu_seqlens_q);
  EXPECT_EQ(describe_malformation(c.problem, t), "cu_seqlens_k[2] = 4 < cu_seqlens_k[1] = 5 (cu-k-decreasing)");
  EXPECT_NE(describe(c).find(" malformed=cu-k-decreasing@1"), std::string::npos) << describe(c);

  Case p = paged_case();
  p.seqs.malformed = {Malformation::kPageOutOfPool, 0};
  const Tensors pt = generate(p);
  const Tensors ps = malformed_arrays(p.problem, pt);
  EXPECT_EQ(ps.block_table[2], p.problem.num_pages);  // sequence 0's last used page (33 keys: 3 pages)
  EXPECT_EQ(describe_malformation(p.problem, pt),
            "block_table[0, 2] = 5 outside the pool of 5 pages (a page the sequence uses) (page-out-of-pool)");
  p.seqs.malformed = {Malformation::kSequsedOverCapacity, 1};
  EXPECT_EQ(malformed_arrays(p.problem, generate(p)).seqused_k[1], p.problem.kv_capacity + 1);
}

TEST(Malformed, RoundTripsThroughTheCaseFileAndWellFormedFilesStayAsBefore) {
  Case c = paged_case();
  const std::string plain = case_to_json(c).dump();
  EXPECT_EQ(plain.find("malformed"), std::string::npos);  // well-formed files keep their bytes and names
  c.seqs.malformed = {Malformation::kSequsedNegative, 1};
  const Case back = case_from_json(case_to_json(c));
  EXPECT_EQ(back.seqs.malformed, c.seqs.malformed);
  Json j = case_to_json(c);
  j["sequences"]["malformed"] = "seqused-negative@7";
  EXPECT_THROW(case_from_json(j), CorpusError);
  j["sequences"]["malformed"] = "bogus";
  EXPECT_THROW(case_from_json(j), CorpusError);
}

TEST(Malformed, EveryLayoutSweepCarriesEachDefectItsArraysHaveOnce) {
  for (const std::string& layout : sequence_layouts()) {
    int malformed = 0;
    std::set<Malformation> kinds, fit;
    for (const Case& c : layout_sweep_grid(layout, 0))
      if (c.seqs.malformed.kind == Malformation::kNone) {
        for (Malformation k : malformations_for(c.problem)) fit.insert(k);
      } else {
        ++malformed;
        EXPECT_TRUE(kinds.insert(c.seqs.malformed.kind).second) << c.label << ": a defect twice";
        EXPECT_EQ(c.label.rfind(std::string("malformed-") + malformation_name(c.seqs.malformed.kind), 0), 0u)
            << c.label;
        EXPECT_EQ(validate(c), "") << c.label;
      }
    EXPECT_GE(malformed, 1) << layout;
    EXPECT_EQ(kinds, fit) << layout << ": every defect the layout's arrays can carry";
  }
}

}  // namespace
}  // namespace attnfuzz
