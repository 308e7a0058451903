// codec_test.cpp - the fuzz codec is total and exact, the mutator stays in the domain, features and shrinking
// work.
#include "fuzz/codec.h"
#include "fuzz/shape_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "../core/nonfinite_values.h"
#include "attnfuzz/corpus.h"
#include "attnfuzz/presets.h"
#include "fuzz/campaign.h"
#include "fuzz/features.h"

namespace attnfuzz::fuzz {
namespace {

std::string text(const FuzzInput& in) {
  return std::to_string(in.kernel) + " " + case_to_json(in.the_case).dump();
}

std::vector<uint8_t> random_bytes(Rng& rng, size_t max_len) {
  std::vector<uint8_t> b(rng.below(max_len + 1));
  for (auto& x : b) x = static_cast<uint8_t>(rng.next());
  return b;
}

TEST(Codec, AnyBytesDecodeToAValidCase) {
  Rng rng(1);
  const FuzzLimits lim;
  for (int i = 0; i < 20000; ++i) {
    const auto b = random_bytes(rng, i % 2 ? 64 : 400);
    const FuzzInput in = decode(b.data(), b.size(), lim);
    ASSERT_EQ(in_domain(in.the_case, lim), "") << describe(in.the_case);
    if (i % 40 == 0) EXPECT_NO_THROW(generate(in.the_case));
  }
  const FuzzInput empty = decode(nullptr, 0, lim);
  EXPECT_EQ(in_domain(empty.the_case, lim), "");
}

TEST(Codec, DecodeThenEncodeRoundTrips) {
  Rng rng(2);
  for (int i = 0; i < 5000; ++i) {
    const auto b = random_bytes(rng, 200);
    const FuzzInput in = decode(b.data(), b.size());
    const auto e = encode(in);
    ASSERT_EQ(text(decode(e.data(), e.size())), text(in));
  }
}

TEST(Codec, EncodeThenDecodeIsExactForDomainCases) {
  Rng rng(3);
  const CaseDomain dom;
  for (int i = 0; i < 3000; ++i) {
    FuzzInput in = dom.init(rng);
    for (int m = 0; m < 5; ++m) dom.mutate(in, rng);
    ASSERT_EQ(dom.validate(in.the_case), "");
    in.the_case.label.clear();
    const auto e = encode(in);
    ASSERT_EQ(text(decode(e.data(), e.size())), text(in)) << dom.print(in);
  }
  // Explicit values, padded strides, raw scale and parameter survive too.
  Case c = make_case(make_problem(2, 4, 2, 5, 9, 7, 3), 99);
  c.problem.scale = 0.3f;
  c.problem.q_stride[2] = 9;
  c.problem.q_stride[1] = 36;
  c.problem.q_stride[0] = 180;
  c.values.dist = {Distribution::kNormal, 0.37};
  c.values.specials.push_back({SpecialKind::kNaN, Tensor::kV, Placement::kAt, 1, 1, 1, 8, 2});
  c = materialize(c);
  ASSERT_EQ(in_domain(c), "");
  const FuzzInput in{7, c};
  const auto e = encode(in);
  EXPECT_EQ(text(decode(e.data(), e.size())), text(in));
}

TEST(Codec, RandomBytesLandOnEdgeValues) {
  Rng rng(4);
  const auto edges = space::edge_seq_lengths(160);
  int hits = 0, n = 4000;
  for (int i = 0; i < n; ++i) {
    const auto b = random_bytes(rng, 100);
    const FuzzInput in = decode(b.data(), b.size());
    hits += std::count(edges.begin(), edges.end(), in.the_case.problem.seq_q) > 0;
  }
  EXPECT_GT(hits, n * 8 / 10);
}

TEST(Domain, MutationsStayInTheDomainAndReachTheSpace) {
  Rng rng(5);
  const CaseDomain dom;
  FuzzInput in = dom.init(rng);
  std::set<int> masks, tails;
  bool sk0 = false, nan_masked = false, extreme = false, explicit_values = false;
  for (int i = 0; i < 4000; ++i) {
    dom.mutate(in, rng);
    ASSERT_EQ(dom.validate(in.the_case), "") << dom.print(in);
    const Problem& p = in.the_case.problem;
    masks.insert(p.mask_kind * 2 + p.mask_align);
    tails.insert(static_cast<int>(p.seq_k % 16));
    sk0 |= p.seq_k == 0;
    extreme |= in.the_case.values.dist.kind == Distribution::kExtreme;
    explicit_values |= in.the_case.explicit_values.has_value();
    for (const auto& s : in.the_case.values.specials)
      nan_masked |= s.kind == SpecialKind::kNaN && s.placement == Placement::kMasked;
  }
  EXPECT_GE(masks.size(), 5u);
  EXPECT_GE(tails.size(), 8u);
  EXPECT_TRUE(sk0);
  EXPECT_TRUE(nan_masked);
  EXPECT_TRUE(extreme);
  EXPECT_TRUE(explicit_values);
}

// Issue 15: the mutator reaches every sequence layout, each such input round-trips exactly, its shrinks stay
// valid sequence cases, and its features name the layout.
TEST(Domain, SequenceLayoutsAreReachedRoundTripAndShrink) {
  Rng rng(15);
  const CaseDomain dom;
  FuzzInput in = dom.init(rng);
  std::set<std::string> layouts;
  bool zero_len = false, shuffled = false, decode_q = false;
  int seq_inputs = 0;
  for (int i = 0; i < 4000; ++i) {
    dom.mutate(in, rng);
    ASSERT_EQ(dom.validate(in.the_case), "") << dom.print(in);
    const Case& c = in.the_case;
    if (!has_sequences(c.problem)) continue;
    ++seq_inputs;
    layouts.insert(layout_name(c.problem));
    for (const auto* v : {&c.seqs.q, &c.seqs.k, &c.seqs.used}) zero_len |= std::count(v->begin(), v->end(), 0) > 0;
    shuffled |= c.seqs.page_order != 0;
    decode_q |= c.problem.kv_layout == AF_SEQ_PAGED && c.problem.seq_q <= 8;
    FuzzInput plain = in;
    plain.the_case.label.clear();
    const auto e = encode(plain);
    ASSERT_EQ(text(decode(e.data(), e.size())), text(plain)) << dom.print(in);
    if (seq_inputs % 50 == 1) {
      for (const Case& s : dom.shrinks(c)) ASSERT_EQ(validate(s), "") << describe(s);
      const CaseFeatures f = case_features(c, generate(c));
      EXPECT_TRUE(std::any_of(f.ids.begin(), f.ids.end(), [](uint16_t id) { return id >= 477; }));
    }
  }
  EXPECT_GT(seq_inputs, 400);
  EXPECT_TRUE(layouts.count("varlen"));
  EXPECT_TRUE(layouts.count("kvcache"));
  EXPECT_TRUE(layouts.count("paged"));
  EXPECT_TRUE(zero_len);
  EXPECT_TRUE(shuffled);
  EXPECT_TRUE(decode_q);
}

TEST(Domain, CrossOverAndShrinksAreValid) {
  Rng rng(6);
  const CaseDomain dom;
  for (int i = 0; i < 500; ++i) {
    const FuzzInput a = dom.init(rng), b = dom.init(rng);
    const FuzzInput c = dom.cross_over(a, b, rng);
    ASSERT_EQ(dom.validate(c.the_case), "");
    for (const Case& s : dom.shrinks(c.the_case)) ASSERT_EQ(validate(s), "") << describe(s);
  }
}

// Issue 11 item 3: under the finite domain no decoded, mutated, crossed-over or shrunk case holds NaN/Inf
// in q/k/v, and the codec still round-trips.
bool nonfinite_values(const Case& c) { return test_util::has_nonfinite(c.problem, generate(c)); }

TEST(FiniteDomain, RandomBytesDecodeToFiniteCases) {
  Rng rng(11);
  FuzzLimits lim;
  lim.domain = ValueDomain::kFinite;
  FuzzLimits small = lim;
  small.max_seq = small.max_dim = 24;  // explicit values (raw float bits) fit in the bytes more often
  int explicit_cases = 0, specials = 0;
  for (int i = 0; i < 4000; ++i) {
    const auto b = random_bytes(rng, i % 2 ? 64 : 4000);
    const FuzzLimits& l = i % 3 ? lim : small;
    const FuzzInput in = decode(b.data(), b.size(), l);
    ASSERT_EQ(in.the_case.values.domain, ValueDomain::kFinite);
    ASSERT_EQ(in_domain(in.the_case, l), "") << describe(in.the_case);
    explicit_cases += in.the_case.explicit_values.has_value();
    specials += !in.the_case.values.specials.empty();
    if (i % 8 == 0 || in.the_case.explicit_values)
      ASSERT_FALSE(nonfinite_values(in.the_case)) << describe(in.the_case);
    const auto again = encode(in, l);
    EXPECT_EQ(text(decode(again.data(), again.size(), l)), text(in));
  }
  EXPECT_GT(explicit_cases, 0);
  EXPECT_GT(specials, 100);
  // Explicit NaN / Inf bits (an ieee input's bytes) decode as 0 / +-FLT_MAX under finite.
  Case e = make_case(make_problem(1, 1, 1, 2, 2, 2, 2), 1);
  Tensors t = generate(e);
  t.q[0] = NAN;
  t.k[1] = INFINITY;
  t.v[2] = -INFINITY;
  e.explicit_values = ExplicitValues{t.q, t.k, t.v};
  const auto eb = encode(FuzzInput{0, e}, FuzzLimits{});
  const FuzzInput fin = decode(eb.data(), eb.size(), lim);
  ASSERT_TRUE(fin.the_case.explicit_values.has_value());
  EXPECT_EQ(fin.the_case.explicit_values->q[0], 0.0f);
  EXPECT_EQ(fin.the_case.explicit_values->k[1], FLT_MAX);
  EXPECT_EQ(fin.the_case.explicit_values->v[2], -FLT_MAX);
  EXPECT_EQ(fin.the_case.explicit_values->q[1], t.q[1]);  // finite values untouched
  EXPECT_FALSE(nonfinite_values(fin.the_case));
  // The same bytes under ieee do give NaN/Inf somewhere (the domain is what removes them).
  Rng r2(11);
  int ieee_nonfinite = 0;
  for (int i = 0; i < 400; ++i) {
    const auto b = random_bytes(r2, 400);
    const FuzzInput in = decode(b.data(), b.size(), FuzzLimits{});
    ieee_nonfinite += nonfinite_values(in.the_case);
  }
  EXPECT_GT(ieee_nonfinite, 0);
}

TEST(FiniteDomain, MutationsCrossOversAndShrinksStayFinite) {
  FuzzLimits lim;
  lim.domain = ValueDomain::kFinite;
  const CaseDomain dom(lim);
  Rng rng(12);
  FuzzInput in = dom.init(rng), other = dom.init(rng);
  int with_specials = 0;
  for (int i = 0; i < 1500; ++i) {
    dom.mutate(in, rng);
    if (i % 5 == 0) in = dom.cross_over(in, other, rng);
    if (i % 50 == 0) other = dom.init(rng);
    ASSERT_EQ(dom.validate(in.the_case), "") << describe(in.the_case);
    with_specials += !in.the_case.values.specials.empty();
    if (i % 4 == 0) ASSERT_FALSE(nonfinite_values(in.the_case)) << describe(in.the_case);
    if (i % 100 == 0)
      for (const Case& s : dom.shrinks(in.the_case)) ASSERT_EQ(s.values.domain, ValueDomain::kFinite);
  }
  EXPECT_GT(with_specials, 100);
  // A case with a NaN special does not belong to a finite domain; decoding it there maps the kind.
  Case nan_case = make_case(make_problem(1, 1, 1, 8, 8, 8, 8), 1);
  SpecialValue s;
  ASSERT_EQ(parse_special("nan@k:masked", s), "");
  nan_case.values.specials.push_back(s);
  EXPECT_NE(in_domain(nan_case, lim), "");
  const auto b = encode(FuzzInput{0, nan_case}, lim);
  const FuzzInput mapped = decode(b.data(), b.size(), lim);
  ASSERT_EQ(mapped.the_case.values.specials.size(), 1u);
  EXPECT_TRUE(special_in_domain(mapped.the_case.values.specials[0].kind, ValueDomain::kFinite));
}

// Issue 30: under the activations domain every decoded, mutated, crossed-over or shrunk case is in the domain
// (no NaN / Inf, |x| <= 64, scale near 1/sqrt(D), no special value but -0), of the ordinary tier, and
// round-trips.
TEST(ActivationsDomain, DecodedAndMutatedCasesStayInTheDomainAndRoundTrip) {
  Rng rng(30);
  FuzzLimits lim;
  lim.domain = ValueDomain::kActivations;
  FuzzLimits small = lim;
  small.max_seq = small.max_dim = 24;  // explicit values fit in the bytes more often
  int explicit_cases = 0;
  for (int i = 0; i < 3000; ++i) {
    const auto b = random_bytes(rng, i % 2 ? 64 : 4000);
    const FuzzLimits& l = i % 3 ? lim : small;
    const FuzzInput in = decode(b.data(), b.size(), l);
    const Case& c = in.the_case;
    ASSERT_EQ(c.values.domain, ValueDomain::kActivations);
    ASSERT_EQ(in_domain(c, l), "") << describe(c);
    ASSERT_EQ(validate(c), "") << describe(c);
    ASSERT_EQ(input_tier(c), InputTier::kOrdinary);
    for (const SpecialValue& s : c.values.specials) ASSERT_EQ(s.kind, SpecialKind::kNegZero) << describe(c);
    explicit_cases += c.explicit_values.has_value();
    if (i % 16 == 0 || c.explicit_values) {
      const Tensors t = generate(c);
      ASSERT_FALSE(test_util::has_nonfinite(c.problem, t)) << describe(c);
    }
    const auto again = encode(in, l);
    EXPECT_EQ(text(decode(again.data(), again.size(), l)), text(in));
  }
  EXPECT_GT(explicit_cases, 0);
  // Explicit NaN / Inf / large bits (an ieee input's bytes) decode clamped: 0, +-64.
  Case e = make_case(make_problem(1, 1, 1, 2, 2, 2, 2), 1);
  Tensors t = generate(e);
  t.q[0] = NAN;
  t.k[1] = INFINITY;
  t.v[2] = -1e6f;
  e.explicit_values = ExplicitValues{t.q, t.k, t.v};
  const auto eb = encode(FuzzInput{0, e}, FuzzLimits{});
  const FuzzInput act = decode(eb.data(), eb.size(), lim);
  ASSERT_TRUE(act.the_case.explicit_values.has_value());
  EXPECT_EQ(act.the_case.explicit_values->q[0], 0.0f);
  EXPECT_EQ(act.the_case.explicit_values->k[1], 64.0f);
  EXPECT_EQ(act.the_case.explicit_values->v[2], -64.0f);
  EXPECT_EQ(act.the_case.explicit_values->q[1], t.q[1]);
  // Mutations, cross-overs and shrinks.
  const CaseDomain dom(lim);
  FuzzInput in = dom.init(rng), other = dom.init(rng);
  for (int i = 0; i < 800; ++i) {
    dom.mutate(in, rng);
    if (i % 5 == 0) in = dom.cross_over(in, other, rng);
    if (i % 50 == 0) other = dom.init(rng);
    ASSERT_EQ(dom.validate(in.the_case), "") << describe(in.the_case);
    ASSERT_EQ(validate(in.the_case), "") << describe(in.the_case);
    if (i % 100 == 0)
      for (const Case& s : dom.shrinks(in.the_case)) ASSERT_EQ(validate(s), "") << describe(s);
  }
}

TEST(BackwardPass, PassIsTheLastFieldAndStaysInTheLimits) {
  Rng rng(41);
  FuzzLimits fwd;
  FuzzLimits bwd;
  bwd.passes = 1u << static_cast<int>(Pass::kBwd);
  FuzzLimits both;
  both.passes = (1u << static_cast<int>(Pass::kFwd)) | (1u << static_cast<int>(Pass::kFwdBwd));
  for (int i = 0; i < 3000; ++i) {
    const auto b = random_bytes(rng, 300);
    // Forward limits: every input is a forward case, as before the field existed.
    EXPECT_EQ(decode(b.data(), b.size(), fwd).the_case.pass, Pass::kFwd);
    const FuzzInput in = decode(b.data(), b.size(), bwd);
    ASSERT_EQ(in.the_case.pass, Pass::kBwd);
    ASSERT_EQ(in_domain(in.the_case, bwd), "");
    const auto e = encode(in, bwd);
    ASSERT_EQ(text(decode(e.data(), e.size(), bwd)), text(in));
    EXPECT_NE(decode(b.data(), b.size(), both).the_case.pass, Pass::kBwd);
  }
  // Bytes that stop before the pass field: forward where allowed, else the lowest allowed pass.
  EXPECT_EQ(decode(nullptr, 0, fwd).the_case.pass, Pass::kFwd);
  EXPECT_EQ(decode(nullptr, 0, bwd).the_case.pass, Pass::kBwd);
}

TEST(BackwardPass, MutationsReachEveryAllowedPassAndMaterializeKeepsDout) {
  Rng rng(42);
  FuzzLimits lim;
  lim.passes = (1u << static_cast<int>(Pass::kFwd)) | (1u << static_cast<int>(Pass::kBwd));
  const CaseDomain dom(lim);
  std::set<Pass> seen;
  for (int i = 0; i < 200; ++i) {
    FuzzInput in = dom.init(rng);
    for (int m = 0; m < 4; ++m) {
      dom.mutate(in, rng);
      ASSERT_EQ(dom.validate(in.the_case), "");
      seen.insert(in.the_case.pass);
      if (has_backward(in.the_case.pass) && !in.the_case.explicit_values && q_elements(in.the_case.problem) < 4096) {
        const Case m2 = materialize(in.the_case);
        ASSERT_TRUE(m2.explicit_values);
        EXPECT_EQ(m2.explicit_values->dout.size(), static_cast<size_t>(o_elements(m2.problem)));
      }
    }
  }
  EXPECT_EQ(seen.size(), 2u);
}

// 3000 random inputs and 3000 mutations under `lim`: each in the domain and round-tripping exactly; under `none` every
// random input decodes to a case `plain` accepts (a field the limits do not allow is absent); `see` sees each case.
template <class Plain, class See>
void random_and_mutated(const FuzzLimits& none, const FuzzLimits& lim, uint64_t seed, Plain plain, See see) {
  Rng rng(seed);
  for (int i = 0; i < 3000; ++i) {
    const auto b = random_bytes(rng, 300);
    EXPECT_TRUE(plain(decode(b.data(), b.size(), none).the_case));
    const FuzzInput in = decode(b.data(), b.size(), lim);
    ASSERT_EQ(in_domain(in.the_case, lim), "") << text(in);
    const auto e = encode(in, lim);
    ASSERT_EQ(text(decode(e.data(), e.size(), lim)), text(in));
    see(in.the_case);
  }
  const CaseDomain dom(lim);
  FuzzInput in = dom.init(rng);
  for (int i = 0; i < 3000; ++i) {
    dom.mutate(in, rng);
    ASSERT_EQ(dom.validate(in.the_case), "") << text(in);
    const auto e = encode(in, lim);
    ASSERT_EQ(text(decode(e.data(), e.size(), lim)), text(in));
    see(in.the_case);
  }
}

// Score variants (issue 28): the last field; limits without variants decode every input without them (as before),
// limits with them reach every variant, round-trip exactly, and mutations keep the case in the domain.
TEST(Variants, VariantsAreTheLastFieldRoundTripAndAreReached) {
  FuzzLimits none, all, score;
  all.variants = kCheckedVariants;
  score.variants = kScoreVariants;  // the limits before custom masks: their inputs never gain a mask
  uint32_t seen = 0;
  int with_bias_bcast = 0, with_block = 0;
  random_and_mutated(
      none, all, 43, [](const Case& c) { return c.problem.variants == 0; },
      [&](const Case& c) {
        seen |= c.problem.variants;
        with_bias_bcast += (c.problem.variants & AF_VARIANT_BIAS) && !bias_broadcast(c.problem).empty();
        with_block += (c.problem.variants & AF_VARIANT_BLOCK_SPARSE) != 0;
      });
  random_and_mutated(
      none, score, 45, [](const Case& c) { return c.problem.variants == 0; },
      [&](const Case& c) { EXPECT_EQ(c.problem.variants & kMaskVariants, 0u); });
  // Per-head descales are fp8 only: f32 limits never decode them; fp8 limits reach them, per batch too.
  EXPECT_EQ(seen & AF_VARIANT_HEAD_DESCALE, 0u);
  FuzzLimits fp8_none = none, fp8_all = all;
  fp8_none.dtype = fp8_all.dtype = AF_DTYPE_FP8_E4M3;
  int per_batch = 0;
  random_and_mutated(
      fp8_none, fp8_all, 47, [](const Case& c) { return c.problem.variants == 0; },
      [&](const Case& c) {
        seen |= c.problem.variants;
        per_batch += (c.problem.variants & AF_VARIANT_HEAD_DESCALE) && c.problem.descale_stride[0] != 0;
      });
  EXPECT_GT(per_batch, 0);
  EXPECT_EQ(seen, kCheckedVariants);
  EXPECT_GT(with_bias_bcast, 0);
  EXPECT_GT(with_block, 0);
}

// Variants on sequence layouts (issue 28): a layout case draws sink, softcap and ALiBi (and kv-shared) and nothing
// else of the limits' variants, round-trips exactly, and its values generate (the codec stays total).
TEST(Variants, LayoutCasesDrawSinkSoftcapAlibiOnlyAndRoundTrip) {
  FuzzLimits none, all;
  all.variants = kCheckedVariants;
  uint32_t seen = 0;
  int layouts = 0;
  random_and_mutated(
      none, all, 49, [](const Case& c) { return c.problem.variants == 0; },
      [&](const Case& c) {
        if (!has_sequences(c.problem)) return;
        ++layouts;
        EXPECT_EQ(c.problem.variants & ~(kLayoutVariants | AF_VARIANT_KV_SHARED), 0u) << describe(c);
        seen |= c.problem.variants;
        if (layouts % 200 == 1 && (c.problem.variants & kLayoutVariants)) EXPECT_NO_THROW(generate(c));
      });
  EXPECT_GT(layouts, 100);
  EXPECT_EQ(seen & kLayoutVariants, kLayoutVariants);
}

// Model presets (issue 28 item 9; attn-fuzz --preset): random bytes and mutations stay near the preset (its
// head configurations, D and Dv within 8, its mask, softcap and sinks), round-trip, and still vary the
// lengths and D.
TEST(Preset, DecodedAndMutatedCasesStayNearThePresetAndRoundTrip) {
  for (const ModelPreset& m : model_presets()) {
    FuzzLimits lim;
    if (m.pending || m.kv_shared) {  // not fuzzable yet, or MLA (its dims come from --variant kv-shared)
      EXPECT_NE(set_preset(lim, m.name), "") << m.name;
      continue;
    }
    ASSERT_EQ(set_preset(lim, m.name), "") << m.name;
    std::set<int64_t> lengths, dims;
    int own_heads = 0;
    random_and_mutated(
        FuzzLimits{}, lim, 51, [](const Case&) { return true; },
        [&](const Case& c) {
          const Problem& p = c.problem;
          EXPECT_EQ(p.heads_q / p.heads_kv, m.heads_kv == 1 ? p.heads_q : m.heads_q / m.heads_kv) << m.name;
          EXPECT_LE(std::abs(p.head_dim - m.head_dim), 8) << m.name;
          EXPECT_EQ(p.mask_kind != AF_MASK_NONE, m.causal || m.window_left != AF_UNBOUNDED) << m.name;
          if (m.sinks) EXPECT_TRUE(p.variants & AF_VARIANT_SINK) << m.name;
          if (m.softcap > 0) EXPECT_EQ(p.softcap, m.softcap) << m.name;
          own_heads += p.heads_q == m.heads_q;
          lengths.insert(p.seq_k);
          dims.insert(p.head_dim);
        });
    EXPECT_GT(own_heads, 100) << m.name;
    EXPECT_GT(lengths.size(), 10u) << m.name;
    EXPECT_GT(dims.size(), 2u) << m.name;
  }
  FuzzLimits lim;
  EXPECT_NE(set_preset(lim, "llama-9"), "");
  EXPECT_TRUE(lim.preset.empty());
}

// MLA's shared K/V latent (issue 28 item 5): the field after merge. Limits without kv-shared never decode it;
// with it inputs and mutations reach it and round-trip; DeepSeek's D 576 / Dv 512 (beyond max_dim) only with
// mla_dims, every other case within max_dim.
TEST(Variants, KvSharedAndMlaDims) {
  FuzzLimits none, kv, mla;
  kv.variants = mla.variants = AF_VARIANT_KV_SHARED;
  mla.mla_dims = true;
  int shared = 0, over = 0, mla_shaped = 0;
  auto plain = [](const Case& c) { return !kv_shared(c.problem); };
  random_and_mutated(none, kv, 51, plain, [&](const Case& c) {
    shared += kv_shared(c.problem);
    over += c.problem.head_dim > kv.max_dim || c.problem.head_dim_v > kv.max_dim;
  });
  random_and_mutated(none, mla, 53, plain, [&](const Case& c) {
    const Problem& p = c.problem;
    if (p.head_dim <= mla.max_dim && p.head_dim_v <= mla.max_dim) return;
    EXPECT_TRUE(kv_shared(p) && p.head_dim == kMlaHeadDim && p.head_dim_v == kMlaHeadDimV && p.heads_kv == 1)
        << describe(c);
    ++mla_shaped;
  });
  EXPECT_GT(shared, 0);
  EXPECT_EQ(over, 0);
  EXPECT_GT(mla_shaped, 0);
}

// Merged states (issue 29): the field after the variants. Without merge in the limits no bytes give a merge case
// (earlier inputs decode as before); with it random bytes and mutations reach merge cases of several states,
// shifts, both layouts and pads, and round-trip.
TEST(Merge, MergeIsTheFieldAfterTheVariantsRoundTripsAndIsReached) {
  FuzzLimits none, merge;
  merge.merge = true;
  int merges = 0, shifted = 0, token = 0, padded = 0, many = 0;
  random_and_mutated(
      none, merge, 44, [](const Case& c) { return !is_merge(c.problem); },
      [&](const Case& c) {
        if (!is_merge(c.problem)) return;
        ++merges;
        // A merge kernel reads no sequence arrays: no defect rides on a merge case (a 30 s cpu campaign once named
        // the correct merge-states accepted-malformed, and a worker crashed uploading such a case).
        EXPECT_EQ(c.seqs.malformed.kind, Malformation::kNone) << describe(c);
        EXPECT_EQ(validate_malformed(c), "") << describe(c);
        shifted += !c.merge.lse_shift.empty();
        token += c.merge.layout == 1;
        padded += c.merge.pad > 0;
        many += c.problem.n_states > 2;
      });
  std::printf("merge cases %d (shifted %d, token-major %d, padded %d, > 2 states %d)\n", merges, shifted, token,
              padded, many);
  EXPECT_GT(merges, 500);
  EXPECT_GT(shifted, 50);
  EXPECT_GT(token, 50);
  EXPECT_GT(padded, 50);
  EXPECT_GT(many, 50);
}

// Dropout alone (attn-fuzz --variant dropout, issue 29): no score variant to toggle, every dropout field reached, the
// codec round trip exact.
TEST(Variants, DropoutOnlyLimitsMutateRoundTripAndReachTheMenus) {
  Rng rng(29);
  FuzzLimits lim;
  lim.variants = AF_VARIANT_DROPOUT;
  const CaseDomain dom(lim);
  FuzzInput in = dom.init(rng);
  int with = 0, exported = 0, near32 = 0;
  for (int i = 0; i < 3000; ++i) {
    dom.mutate(in, rng);
    ASSERT_EQ(dom.validate(in.the_case), "") << text(in);
    const auto e = encode(in, lim);
    ASSERT_EQ(text(decode(e.data(), e.size(), lim)), text(in));
    const Problem& p = in.the_case.problem;
    EXPECT_EQ(p.variants & ~AF_VARIANT_DROPOUT, 0u);
    if (!(p.variants & AF_VARIANT_DROPOUT)) continue;
    ++with;
    exported += p.dropout_rng == AF_DROPOUT_RNG_EXPORTED;
    near32 += p.dropout_offset == (uint64_t{1} << 32) - 40;
  }
  EXPECT_GT(with, 100);
  EXPECT_GT(exported, 0);
  EXPECT_GT(near32, 0);
}

TEST(Shrink, GreedyReachesTheSmallestFailingShape) {
  Case c = make_case(make_problem(3, 4, 2, 100, 90, 64, 64), 1);
  (void)parse_mask("causal-br", c.problem);
  c.values.specials.push_back({SpecialKind::kNaN, Tensor::kK, Placement::kMasked, 5});
  FuzzLimits big;
  big.max_seq = big.max_dim = big.max_work = 1 << 30;
  int checks = 0;
  // "Fails" while Sq >= 17 and the mask is causal: the minimum keeps exactly that.
  auto fails = [](const Case& x) { return x.problem.seq_q >= 17 && x.problem.mask_kind == AF_MASK_CAUSAL; };
  const Case m = shrink_case(c, CaseDomain(big), fails, 10000, checks);
  std::printf("shrunk in %d checks: %s\n", checks, describe(m).c_str());
  EXPECT_EQ(m.problem.seq_q, 17);
  EXPECT_EQ(m.problem.batch, 1);
  EXPECT_EQ(m.problem.heads_q, 1);
  EXPECT_EQ(m.problem.head_dim, 1);
  EXPECT_LE(m.problem.seq_k, 1);
  EXPECT_TRUE(m.values.specials.empty() || m.explicit_values);
  // Values were materialized and simplified to zeros.
  ASSERT_TRUE(m.explicit_values);
  for (float x : m.explicit_values->q) EXPECT_EQ(x, 0.f);
}

// Issue 30: for a kernel that compiles per shape, every round of the shrink loop tries the steps at the case's shape
// (special values, magnitudes, scale) before the steps that change it (a compilation each); by default the shape
// steps come first. The predicate records the order and accepts nothing: one round, every candidate once.
TEST(Shrink, SameShapeStepsFirstForAKernelThatCompiles) {
  Case c = make_case(make_problem(2, 2, 2, 16, 16, 8, 8), 1);
  (void)parse_mask("causal-br", c.problem);
  c.problem.scale = 0.5f;
  c.values.dist = {Distribution::kNormal, 4};
  c.values.specials.push_back({SpecialKind::kNaN, Tensor::kK, Placement::kMasked, 2});
  const std::string key = shape_key(c);
  for (bool same_first : {false, true}) {
    std::vector<bool> same;  // per candidate tried: whether it kept the shape key
    auto record = [&](const Case& x) {
      same.push_back(shape_key(x) == key);
      return false;
    };
    int checks = 0;
    const Case m = shrink_case(c, CaseDomain(), record, 10000, checks, same_first);
    EXPECT_EQ(shape_key(m), key);
    ASSERT_TRUE(!same.empty() && same.back()) << "the last step makes the values explicit (same shape)";
    const std::vector<bool> round(same.begin(), same.end() - 1);
    const auto n_same = std::count(round.begin(), round.end(), true);
    ASSERT_GE(n_same, 4) << "specials, their count, distribution, magnitude, scale";
    ASSERT_GE(round.size() - n_same, 4u) << "B, heads, Sq, Sk, D, mask";
    if (same_first)
      EXPECT_TRUE(std::is_partitioned(round.begin(), round.end(), [](bool b) { return b; }))
          << "a step at a new shape came before a step at this shape";
    else
      EXPECT_FALSE(round.front()) << "by default the shape steps come first";
  }
}

TEST(Features, CaseFeaturesSeeTailsMasksAndSpecials) {
  Case c = make_case(make_problem(1, 1, 1, 40, 9, 32, 32), 3);
  (void)parse_mask("causal-br", c.problem);  // rows 0..30 see no key
  c.values.specials.push_back({SpecialKind::kNaN, Tensor::kK, Placement::kRandom, 2});
  const Tensors t = generate(c);
  const CaseFeatures f = case_features(c, t);
  EXPECT_EQ(f.mask, 2);
  EXPECT_EQ(f.fully_masked, 1);
  EXPECT_EQ(f.special_kinds.size(), 2u);
  for (uint16_t id : f.ids) EXPECT_LT(id, kFeaturesPerKernel);
  // Late max keys: extreme magnitudes give running-max rises after the first key tile.
  Case e = make_case(make_problem(1, 1, 1, 8, 100, 16, 16), 4);
  e.values.dist = {Distribution::kExtreme, 30};
  const CaseFeatures fe = case_features(e, generate(e));
  EXPECT_GE(fe.max_change_tiles, 1);
  EXPECT_GE(fe.logit, 4);
  // Counters: one slot per kernel.
  std::fill(extra_counters(), extra_counters() + kCounterBytes, 0);
  CheckResult r;
  r.verdict = Verdict::kFail;
  r.failure = FailureClass::kMask;
  r.max_ratio = INFINITY;
  record_features(3, result_features(f, r));
  const uint8_t* slot3 = extra_counters() + 3 * kFeaturesPerKernel;
  EXPECT_GT(std::count_if(slot3, slot3 + kFeaturesPerKernel, [](uint8_t x) { return x != 0; }), 10);
  EXPECT_EQ(
      std::count_if(static_cast<const uint8_t*>(extra_counters()), slot3, [](uint8_t x) { return x != 0; }),
      0);
  EXPECT_EQ(ratio_bucket(INFINITY), 11);
  EXPECT_EQ(ratio_bucket(NAN), 11);
  EXPECT_EQ(ratio_bucket(0), 0);
  EXPECT_LT(ratio_bucket(0.9), ratio_bucket(1.5));
}

}  // namespace
}  // namespace attnfuzz::fuzz
