// mla_kernels_test.cpp - the MLA decode kernel (kernels/mla_decode.hip) on kv-shared cases: DeepSeek's D =
// 576 / Dv = 512 with one KV head for up to 128 query heads, small D > Dv pairs, dense and paged, f32 and
// bf16.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/verdict.h"
#include "check/runner.h"
#include "tests/kernels/test_backend.h"

namespace attnfuzz {
namespace {

Device& device() {
  static std::unique_ptr<Device> d = open_device(test_backend(), DeviceOptions{});
  return *d;
}

const KernelEntry& mla() {
  const KernelEntry* e = Registry::global().find(test_backend(), "mla-decode");
  if (!e) throw std::runtime_error("mla-decode is not registered");
  return *e;
}

// The verdict of mla-decode on c.
CheckResult check(const Case& c) {
  PreparedCase pc(c);
  return check_case(device(), mla(), pc, RunOptions{}).result;
}

// The kv-shared sweep's own edges (labels "mla-...", "d40-...", "d72-...", "d24-..."): every one mla-decode
// takes passes, in f32 and bf16, and it takes every one of at most 8 query tokens.
TEST(MlaDecode, KvSharedSweepEdgesPass) {
  for (int32_t dtype : {AF_DTYPE_F32, AF_DTYPE_BF16}) {
    int ran = 0, edges = 0;
    for (const Case& c : variant_sweep_grid(AF_VARIANT_KV_SHARED, 0, ValueDomain::kIeee, dtype, Pass::kFwd)) {
      if (c.label.find("mla-") == std::string::npos && c.label.find("-dv") == std::string::npos) continue;
      if (c.problem.seq_q > 8) continue;
      ++edges;
      const CheckResult r = check(c);
      ASSERT_EQ(r.verdict, Verdict::kPass) << c.label << " " << describe(c) << ": " << r.reason;
      ++ran;
    }
    EXPECT_GE(edges, 8) << dtype_name(dtype);
    EXPECT_EQ(ran, edges);
  }
}

// DeepSeek-V3's decode geometry (128 query heads on one latent KV head, D 576, Dv 512) with 64 keys, shared
// and with V in its own buffer; and the same on a paged cache (pages of 16, shuffled, a used length below the
// slots).
TEST(MlaDecode, DeepSeekGeometryDenseAndPaged) {
  Case c = make_case(make_problem(1, 128, 1, 1, 64, 576, 512), 3);
  ASSERT_EQ(parse_mask("causal-br", c.problem), "");
  EXPECT_EQ(check(c).verdict, Verdict::kPass) << "own V buffer";
  ASSERT_EQ(set_variants(c, AF_VARIANT_KV_SHARED), "");
  const CheckResult r = check(c);
  EXPECT_EQ(r.verdict, Verdict::kPass) << r.reason;
  Case pg = make_case(make_problem(2, 16, 1, 2, 40, 576, 512), 4);
  pg.problem.kv_layout = AF_SEQ_PAGED;
  pg.problem.page_size = 16;
  pg.seqs.used = {40, 23};
  pg.seqs.page_order = 9;
  ASSERT_EQ(set_sequence_fields(pg), "");
  share_kv(pg.problem);
  ASSERT_EQ(validate(pg), "");
  const CheckResult rp = check(pg);
  EXPECT_EQ(rp.verdict, Verdict::kPass) << describe(pg) << ": " << rp.reason;
}

// Beyond its limits mla-decode is unsupported with a reason, never run: D 577, Dv 513, 9 query tokens.
TEST(MlaDecode, RefusesBeyondItsLimits) {
  for (const Problem& p : {make_problem(1, 2, 1, 1, 8, 577, 512), make_problem(1, 2, 1, 1, 8, 576, 513),
                           make_problem(1, 2, 1, 9, 8, 64, 64)})
    EXPECT_NE(unsupported_reason(mla().kernel, p), "") << describe(p);
}

}  // namespace
}  // namespace attnfuzz
