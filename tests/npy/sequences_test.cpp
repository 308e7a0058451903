// sequences_test.cpp - varlen / paged cases through NPY (npy/sequences.h): emitted files in the layout with
// their int32 arrays, an output computed elsewhere judged per sequence (pass when exact, fail when one element
// is off), FlashAttention's [Hq, total_q] LSE accepted, a wrong o shape refused.
#include "npy/sequences.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "check/sequences.h"
#include "npy/npy_io.h"

namespace attnfuzz::npy {
namespace {

namespace fs = std::filesystem;

Case varlen_case() {
  Case c = make_case(make_problem(3, 4, 2, 1, 1, 16, 16), 5);
  c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
  EXPECT_EQ(parse_mask("causal-br", c.problem), "");
  c.seqs.q = {3, 0, 17};
  c.seqs.k = {5, 1, 40};
  EXPECT_EQ(set_sequence_fields(c), "");
  return c;
}

// The exact O / LSE of c in its layout (o: [total_q, Hq, Dv]; lse: FlashAttention's [Hq, total_q]).
void exact_outputs(const Case& c, std::vector<float>& o, std::vector<float>& lse_fa) {
  const Tensors t = generate(c);
  const Problem& p = c.problem;
  const OracleResult R = sequence_oracle(p, t, {});
  o.assign(static_cast<size_t>(o_elements(p)), 0.f);
  lse_fa.assign(static_cast<size_t>(p.heads_q * p.total_q), 0.f);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          o[o_offset(p, t, b, s, h, d)] = static_cast<float>(R.o[R.o_at(b, s, h, d)]);
        lse_fa[h * p.total_q + t.cu_seqlens_q[b] + s] = static_cast<float>(R.lse[R.lse_at(b, h, s)]);
      }
}

TEST(NpySequences, EmitJudgePassAndFail) {
  const fs::path dir = fs::path(TEST_TMP) / "npy-seq-varlen";
  fs::remove_all(dir);
  const Case c = varlen_case();
  emit_sequence_case(c, dir, "test");
  for (const char* f : {"q.npy", "k.npy", "v.npy", "cu_seqlens_q.npy", "cu_seqlens_k.npy", "case.json"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  EXPECT_FALSE(fs::exists(dir / "block_table.npy"));
  EXPECT_TRUE(is_sequence_dir(dir));
  const Array q = read_array(dir / "q.npy");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{20, 4, 16}));
  std::vector<float> o, lse;
  exact_outputs(c, o, lse);
  write_array(dir / "o.npy", {20, 4, 16}, o.data());
  write_array(dir / "lse.npy", {4, 20}, lse.data());
  Case back;
  Judged j = judge_sequence_dir(dir, {}, 4, back);
  EXPECT_EQ(back.seqs, c.seqs);
  EXPECT_EQ(j.result.verdict, Verdict::kPass) << j.result.reason;
  EXPECT_EQ(j.result.compared, (3 + 17) * 4 * 16 + (3 + 17) * 4);
  o[5 * 64 + 3] += 0.01f;  // sequence 2, token 2, head 0, d 3
  write_array(dir / "o.npy", {20, 4, 16}, o.data());
  j = judge_sequence_dir(dir, {}, 4, back);
  EXPECT_EQ(j.result.verdict, Verdict::kFail);
  ASSERT_FALSE(j.result.worst.empty());
  EXPECT_EQ(j.result.worst.front().b, 2);
  EXPECT_EQ(j.result.worst.front().s, 2);
  write_array(dir / "o.npy", {3, 17, 4, 16}, o.data());
  EXPECT_THROW(judge_sequence_dir(dir, {}, 4, back), NpyError);
}

TEST(NpySequences, PagedArraysAreWritten) {
  const fs::path dir = fs::path(TEST_TMP) / "npy-seq-paged";
  fs::remove_all(dir);
  Case c = make_case(make_problem(2, 2, 1, 1, 1, 8, 8), 3);
  c.problem.kv_layout = AF_SEQ_PAGED;
  c.problem.page_size = 16;
  c.seqs.used = {33, 1};
  c.seqs.page_order = 9;
  c.seqs.spare_pages = 1;
  ASSERT_EQ(set_sequence_fields(c), "");
  emit_sequence_case(c, dir, "test");
  EXPECT_EQ(read_array(dir / "k.npy").shape, (std::vector<int64_t>{5, 16, 1, 8}));
  EXPECT_TRUE(fs::exists(dir / "block_table.npy"));
  EXPECT_TRUE(fs::exists(dir / "seqused_k.npy"));
  int nan = 0;  // 5 pages x 16 slots, 34 used: 46 slots of gaps
  for (float x : read_array(dir / "k.npy").data) nan += std::isnan(x);
  EXPECT_EQ(nan, 46 * 8);
}

}  // namespace
}  // namespace attnfuzz::npy
