// dtype_codec_test.cpp - low-precision cases end to end (issue 13): stored values, encodings, poisons, descales,
// corpus round trip, and the built-in f16 / bf16 / fp8 kernels on the cpu backend.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <set>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/hip_cpu.h"
#include "attnfuzz/registry.h"
#include "check/dtype_codec.h"
#include "check/runner.h"
#include "oracle/lowp.h"

namespace attnfuzz {
namespace {

const int32_t kLowp[] = {AF_DTYPE_F16, AF_DTYPE_BF16, AF_DTYPE_FP8_E4M3, AF_DTYPE_FP8_E5M2};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The tool's conversions (oracle/lowp.h) and the kernels' (attnfuzz/lowp_types.h, the emulator's __half /
// __hip_bfloat16) round every float the same way: what the oracle assumes is what a kernel stores.
TEST(DtypeCodec, ToolAndKernelConversionsAgree) {
  Rng rng(13, 0);
  for (int i = 0; i < 200000; ++i) {
    float x;
    const uint32_t u = static_cast<uint32_t>(rng.next());
    std::memcpy(&x, &u, 4);
    if (i % 2) x = static_cast<float>(std::ldexp(rng.uniform01() * 2 - 1, static_cast<int>(rng.below(40)) - 24));
    if (std::isnan(x)) continue;
    EXPECT_EQ(__float2half_rn(x).__x, float_to_f16_bits(x)) << x;
    EXPECT_EQ(__float2bfloat16(x).data, float_to_bf16_bits(x)) << x;
    // fp8: the kernels saturate (satfinite), the tool's encoder turns overflow into NaN / Inf: compare in range.
    for (int32_t dt : {AF_DTYPE_FP8_E4M3, AF_DTYPE_FP8_E5M2}) {
      if (!(std::fabs(round_to_dtype(static_cast<double>(x), dt)) <= dtype_max(dt))) continue;
      const uint8_t k = dt == AF_DTYPE_FP8_E4M3 ? af_float_to_e4m3(x).bits : af_float_to_e5m2(x).bits;
      EXPECT_EQ(k, float_to_fp8_bits(x, dt)) << x << " " << dtype_name(dt);
      EXPECT_EQ(bits(fp8_bits_to_float(k, dt)),
                bits(dt == AF_DTYPE_FP8_E4M3 ? af_fp8_to_float(af_fp8_e4m3{k}) : af_fp8_to_float(af_fp8_e5m2{k})));
    }
  }
}

TEST(DtypeCodec, EveryStoredValueRoundTrips) {
  for (int32_t dt : kLowp) {
    const int n = dtype_bytes(dt) == 1 ? 256 : 65536;
    std::vector<float> vals;
    for (int b = 0; b < n; ++b) {
      unsigned char raw[2] = {static_cast<unsigned char>(b), static_cast<unsigned char>(b >> 8)};
      float f;
      decode_elements(raw, 1, dt, &f);
      if (!std::isnan(f)) vals.push_back(f);
    }
    const std::vector<unsigned char> enc = encode_tensor(vals, dt);
    std::vector<float> back(vals.size());
    decode_elements(enc.data(), vals.size(), dt, back.data());
    for (size_t i = 0; i < vals.size(); ++i) ASSERT_EQ(bits(back[i]), bits(vals[i])) << dtype_name(dt);
  }
  EXPECT_EQ(fp8_bits_to_float(0x7e, AF_DTYPE_FP8_E4M3), 448.0f);
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(0x7f, AF_DTYPE_FP8_E4M3)));
  EXPECT_EQ(fp8_bits_to_float(0x7b, AF_DTYPE_FP8_E5M2), 57344.0f);
  EXPECT_TRUE(std::isinf(fp8_bits_to_float(0x7c, AF_DTYPE_FP8_E5M2)));
}

// Guard poisons read as NaN (e4m3: its only NaN) or the finite alternate; the two output poisons are distinct
// elements, and the decoded output poison is the fp32 poison word.
TEST(DtypeCodec, PoisonsPerFormat) {
  for (int32_t dt : kLowp) {
    const int eb = dtype_bytes(dt);
    auto elem = [&](uint32_t w) {
      float f;
      decode_elements(&w, 1, dt, &f);
      return f;
    };
    EXPECT_TRUE(std::isnan(elem(format_poison(dt, kGuardPoison)))) << dtype_name(dt);
    EXPECT_TRUE(std::isnan(elem(format_poison(dt, kOutputPoison)))) << dtype_name(dt);
    EXPECT_TRUE(std::isfinite(elem(format_poison(dt, kGuardPoisonAlt)))) << dtype_name(dt);
    EXPECT_TRUE(std::isfinite(elem(format_poison(dt, kOutputPoisonAlt)))) << dtype_name(dt);
    const uint32_t mask = eb == 2 ? 0xffffu : 0xffu;
    std::set<uint32_t> distinct;
    for (uint32_t w : {kGuardPoison, kGuardPoisonAlt, kOutputPoison, kOutputPoisonAlt})
      distinct.insert(format_poison(dt, w) & mask);
    EXPECT_EQ(distinct.size(), 4u) << dtype_name(dt);
    const uint32_t word = format_poison(dt, kOutputPoison);
    float out[2];
    decode_output(reinterpret_cast<const unsigned char*>(&word), 4 / eb > 2 ? 2 : 4 / eb, dt, 1.0f, kOutputPoison, out);
    EXPECT_EQ(bits(out[0]), kOutputPoison) << dtype_name(dt);
  }
}

// Generation stores values of the dtype: base values rounded, huge = the format's max, subnormals of the
// format, e4m3's inf = 448.
TEST(DtypeCodec, GenerationRoundsToTheDtype) {
  for (int32_t dt : kLowp) {
    Case c = make_case(make_problem(1, 2, 1, 9, 17, 16, 16), 5);
    c.problem.dtype = dt;
    for (const char* s : {"huge@k:random*4", "subnormal@v:random*8", "inf@q:random", "-0@k:random"}) {
      SpecialValue sv;
      ASSERT_EQ(parse_special(s, sv), "");
      c.values.specials.push_back(sv);
    }
    const Tensors t = generate(c);
    for (const auto* buf : {&t.q, &t.k, &t.v})
      for (float x : *buf) EXPECT_TRUE(representable(x, dt) || std::isinf(x)) << x << " " << dtype_name(dt);
    for (const PlacedSpecial& ps : t.placed) {
      const std::vector<float>& buf = ps.tensor == Tensor::kQ ? t.q : ps.tensor == Tensor::kK ? t.k : t.v;
      const float x = buf[static_cast<size_t>(ps.index)];
      if (ps.kind == SpecialKind::kHuge) EXPECT_EQ(std::fabs(x), dtype_max(dt));
      if (ps.kind == SpecialKind::kSubnormal) {
        EXPECT_NE(x, 0.0f);
        EXPECT_LT(std::fabs(x), dtype_min_normal(dt));
      }
      if (ps.kind == SpecialKind::kPosInf)
        EXPECT_EQ(x, dt == AF_DTYPE_FP8_E4M3 ? 448.0f : INFINITY) << dtype_name(dt);
    }
    EXPECT_EQ(bits(generate(c).q[3]), bits(t.q[3]));  // deterministic
  }
}

TEST(DtypeCodec, DescalesAreValidatedAndRecorded) {
  Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  p.q_descale = 0.5f;
  EXPECT_NE(validate(p), "");  // f32 with a descale
  p.dtype = AF_DTYPE_FP8_E4M3;
  EXPECT_EQ(validate(p), "");
  p.q_descale = 0.1f;  // 24 significand bits: stored * descale would not be exact
  EXPECT_NE(validate(p), "");
  p.q_descale = 0.375f;
  p.o_scale = 3.0f;  // not a power of two
  EXPECT_NE(validate(p), "");
  p.o_scale = 0.25f;
  p.v_descale = 3.25f;
  ASSERT_EQ(validate(p), "");
  CorpusFile f;
  f.the_case = make_case(p, 9);
  const CorpusFile back = parse_corpus(to_corpus_text(f));
  EXPECT_EQ(bits(back.the_case.problem.q_descale), bits(0.375f));
  EXPECT_EQ(bits(back.the_case.problem.v_descale), bits(3.25f));
  EXPECT_EQ(bits(back.the_case.problem.o_scale), bits(0.25f));
  EXPECT_EQ(back.the_case.problem.dtype, AF_DTYPE_FP8_E4M3);
  EXPECT_NE(describe(p).find("descale=0.375"), std::string::npos) << describe(p);
}

// The built-in low-precision kernels pass their dtype's sweep on the cpu backend (attn-check --dtype D
// --sweep), small cases only here; and an f32 bound would reject the f16 outputs (the dtype matters).
TEST(DtypeCodec, BuiltInKernelsPassTheirDtypeSweep) {
  std::unique_ptr<Device> dev = open_device("cpu", DeviceOptions{});
  RunOptions ro;
  int checked = 0;
  for (int32_t dt : {AF_DTYPE_F16, AF_DTYPE_BF16, AF_DTYPE_FP8_E4M3}) {
    for (const Case& c : sweep_grid(0, ValueDomain::kIeee, dt)) {
      const Problem& p = c.problem;
      if (p.batch * p.heads_q * p.seq_q * std::max<int64_t>(p.seq_k, 1) * p.head_dim > (int64_t{1} << 15)) continue;
      PreparedCase pc(c);
      for (const KernelEntry* k : Registry::global().select(Backend::kCpu, "all")) {
        if (k->origin != "built-in") continue;
        const Judged j = check_case(*dev, *k, pc, ro);
        EXPECT_NE(j.result.verdict, Verdict::kFail) << k->kernel.name << " " << describe(c) << ": " << j.result.reason;
        checked += j.result.verdict == Verdict::kPass;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace attnfuzz
