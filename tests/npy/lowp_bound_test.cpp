// lowp_bound_test.cpp - the fp16 / bf16 bound: no false positive on plain fp16/bf16 computations
// (PyTorch-math and FlashAttention styles) over a sweep with extreme logits; wrong outputs are caught.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "attnfuzz/case.h"
#include "check/compare.h"
#include "oracle/lowp.h"
#include "oracle/oracle.h"
#include "oracle/reference_fp32.h"

namespace attnfuzz {
namespace {

struct Sweep {
  double max_ratio = 0, min_bug_ratio = INFINITY;
  int cases = 0, false_positives = 0, outside = 0, bugs_missed = 0, bugs = 0;
};

// Case i of the sweep: shapes, masks, GQA and value magnitudes (extreme logits up to ~2e3 for fp16, 1e4
// bf16).
Case sweep_case(int i, int32_t cd) {
  Rng r(1234 + i, 77);
  const int64_t sq = 1 + static_cast<int64_t>(r.below(70)), sk = static_cast<int64_t>(r.below(90));
  const int64_t d = 1 + static_cast<int64_t>(r.below(i % 5 == 0 ? 128 : 40));
  const int64_t hkv = 1 + static_cast<int64_t>(r.below(2)), hq = hkv * (1 + static_cast<int64_t>(r.below(2)));
  Problem p = make_problem(1 + static_cast<int64_t>(r.below(2)), hq, hkv, sq, sk, d,
                           d + static_cast<int64_t>(r.below(3)));
  const auto& masks = space::mask_forms();
  parse_mask(masks[r.below(masks.size())], p);
  Case c = make_case(p, 1000 + i);
  const double mags[] = {1, 3, 10, 30, 100, 300, 1000, cd == AF_DTYPE_F16 ? 2000.0 : 10000.0};
  switch (i % 4) {
    case 0:
      c.values.dist = {Distribution::kUniform, 1};
      break;
    case 1:
      c.values.dist = {Distribution::kNormal, 2};
      break;
    default:
      c.values.dist = {Distribution::kExtreme, mags[r.below(8)]};
      break;
  }
  return c;
}

Sweep run_sweep(int32_t cd, int n) {
  Sweep sw;
  for (int i = 0; i < n; ++i) {
    Case c = sweep_case(i, cd);
    if (!validate(c).empty()) continue;
    Tensors t = generate(c);
    for (auto* x : {&t.q, &t.k, &t.v})
      for (float& f : *x) f = round_to_dtype(f, cd);  // the stored fp16 / bf16 inputs
    const Problem& p = c.problem;
    OracleOptions oo;
    oo.compute_dtype = cd;
    oo.threads = 1;
    const OracleResult ex = compute_oracle(p, t.q.data(), t.k.data(), t.v.data(), oo);
    for (LowpStyle style : {LowpStyle::kMath, LowpStyle::kFlash}) {
      std::vector<float> o(static_cast<size_t>(o_elements(p))), lse(static_cast<size_t>(lse_elements(p)));
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads_q; ++h)
          for (int64_t s = 0; s < p.seq_q; ++s)
            reference_lowp_row(p, t.q.data(), t.k.data(), t.v.data(), b, h, s, cd, style,
                               &o[o_index(p, b, s, h, 0)], &lse[lse_index(p, b, h, s)]);
      CheckResult r;
      compare_output(p, ex, o.data(), style == LowpStyle::kFlash ? lse.data() : nullptr, r);
      ++sw.cases;
      if (r.verdict == Verdict::kOutsideContract) ++sw.outside;
      if (r.verdict == Verdict::kFail) {
        ++sw.false_positives;
        ADD_FAILURE() << "false positive: " << describe(c) << " style " << int(style) << ": " << r.reason;
      }
      if (r.verdict == Verdict::kPass) sw.max_ratio = std::max(sw.max_ratio, r.max_ratio);
      // A deliberately wrong output: the flash computation with the scale 1.5x (fp16) / 3x (bf16); counted
      // where that moves the exact result by more than 3 bounds somewhere.
      if (style == LowpStyle::kFlash && r.verdict == Verdict::kPass && p.seq_k >= 2) {
        Problem wrong = p;
        wrong.scale = p.scale * (cd == AF_DTYPE_F16 ? 1.5f : 3.0f);
        std::vector<float> o2(o.size()), l2(lse.size());
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t h = 0; h < p.heads_q; ++h)
            for (int64_t s = 0; s < p.seq_q; ++s)
              reference_lowp_row(wrong, t.q.data(), t.k.data(), t.v.data(), b, h, s, cd, style,
                                 &o2[o_index(p, b, s, h, 0)], &l2[lse_index(p, b, h, s)]);
        CheckResult rw;
        compare_output(p, ex, o2.data(), l2.data(), rw);
        // Only count cases where the wrong scale changes the exact result by much more than fp16 noise.
        const OracleResult exw = compute_oracle(wrong, t.q.data(), t.k.data(), t.v.data(), oo);
        bool visible_change = false;  // some element moves by more than 3 bounds (of both problems)
        for (size_t e = 0; e < ex.o.size(); ++e)
          if (std::isfinite(ex.o[e]) && std::isfinite(exw.o[e]))
            visible_change |= std::fabs(exw.o[e] - ex.o[e]) > 3 * (ex.o_bound[e] + exw.o_bound[e]);
        if (visible_change) {
          ++sw.bugs;
          if (rw.verdict != Verdict::kFail)
            ++sw.bugs_missed;
          else
            sw.min_bug_ratio = std::min(sw.min_bug_ratio, rw.max_ratio);
        }
      }
    }
  }
  return sw;
}

void report(const char* name, const Sweep& s) {
  std::printf(
      "%s: cases=%d outside_contract=%d false_positives=%d max_ratio=%.4g wrong_scale_cases=%d missed=%d "
      "min_wrong_ratio=%.4g\n",
      name, s.cases, s.outside, s.false_positives, s.max_ratio, s.bugs, s.bugs_missed, s.min_bug_ratio);
}

TEST(LowpBound, Fp16ComputationsNeverExceedTheBound) {
  const Sweep s = run_sweep(AF_DTYPE_F16, 400);
  report("fp16", s);
  EXPECT_EQ(s.false_positives, 0);
  EXPECT_LT(s.max_ratio, 1.0);
  EXPECT_GT(s.bugs, 50);
  EXPECT_EQ(s.bugs_missed, 0);
}

TEST(LowpBound, Bf16ComputationsNeverExceedTheBound) {
  const Sweep s = run_sweep(AF_DTYPE_BF16, 400);
  report("bf16", s);
  EXPECT_EQ(s.false_positives, 0);
  EXPECT_LT(s.max_ratio, 1.0);
  EXPECT_GT(s.bugs, 20);
  EXPECT_EQ(s.bugs_missed, 0);
}

TEST(LowpBound, Fp16OutputFailsTheFp32Bound) {
  // The compute dtype matters: an fp16 computation judged as an fp32 kernel fails.
  Problem p = make_problem(1, 1, 1, 16, 16, 32, 32);
  Case c = make_case(p, 5);
  Tensors t = generate(c);
  for (auto* x : {&t.q, &t.k, &t.v})
    for (float& f : *x) f = round_to_dtype(f, AF_DTYPE_F16);
  std::vector<float> o(static_cast<size_t>(o_elements(p))), lse(16);
  for (int64_t s = 0; s < 16; ++s)
    reference_lowp_row(p, t.q.data(), t.k.data(), t.v.data(), 0, 0, s, AF_DTYPE_F16, LowpStyle::kMath,
                       &o[o_index(p, 0, s, 0, 0)], &lse[s]);
  CheckResult r32, r16;
  OracleOptions oo;
  compare_output(p, compute_oracle(p, t.q.data(), t.k.data(), t.v.data(), oo), o.data(), nullptr, r32);
  oo.compute_dtype = AF_DTYPE_F16;
  compare_output(p, compute_oracle(p, t.q.data(), t.k.data(), t.v.data(), oo), o.data(), nullptr, r16);
  EXPECT_EQ(r32.verdict, Verdict::kFail);
  EXPECT_EQ(r16.verdict, Verdict::kPass) << r16.reason;
}

TEST(LowpBound, RoundingMatchesTheBitConversions) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_bits_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16_bits(f), h);
    ASSERT_EQ(round_to_dtype(f, AF_DTYPE_F16), f);
    const float g = bf16_bits_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(g)) ASSERT_EQ(float_to_bf16_bits(g), h);
  }
  EXPECT_EQ(round_to_dtype(65519.0, AF_DTYPE_F16), 65504.0);
  EXPECT_TRUE(std::isinf(round_to_dtype(65520.0, AF_DTYPE_F16)));
  EXPECT_EQ(round_to_dtype(1.0 + 0x1p-11, AF_DTYPE_F16), 1.0);  // tie to even
  EXPECT_EQ(round_to_dtype(0x1p-25 * 1.5, AF_DTYPE_F16), 0x1p-24);
}

}  // namespace
}  // namespace attnfuzz
