// shape_pool_test.cpp - compile-aware fuzzing in process: shape keys, snapping onto a pool shape, the new-shape
// budget and the first-call measurement (fuzz/shape_pool.h).
#include "fuzz/shape_pool.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fuzz/codec.h"

namespace attnfuzz::fuzz {
namespace {

Case shaped(int64_t b, int64_t h, int64_t sq, int64_t sk, int64_t d, uint64_t seed = 1) {
  Case c = make_case(make_problem(b, h, h, sq, sk, d, d), seed);
  return c;
}

TEST(ShapeKey, ValuesSeedScaleAndSpecialsAreNotPartOfIt) {
  Case a = shaped(1, 2, 7, 13, 16);
  Case b = a;
  b.seed = 99;
  b.problem.scale = 0.5f;
  b.values.dist = {Distribution::kNormal, 3};
  SpecialValue nan;
  (void)parse_special("nan@k:masked*2", nan);
  b.values.specials.push_back(nan);
  EXPECT_EQ(shape_key(a), shape_key(b));
}

TEST(ShapeKey, ShapeDtypeMaskAndPassAre) {
  const Case a = shaped(1, 2, 7, 13, 16);
  Case sq = shaped(1, 2, 8, 13, 16), dt = a, mask = a, pass = a;
  dt.problem.dtype = AF_DTYPE_F16;
  ASSERT_EQ(parse_mask("causal-br", mask.problem), "");
  pass.pass = Pass::kBwd;
  for (const Case& other : {sq, dt, mask, pass}) EXPECT_NE(shape_key(a), shape_key(other)) << describe(other);
}

TEST(SnapShape, TakesTheValuesOfOneAndTheShapeOfTheOther) {
  const FuzzLimits lim;
  const Case pool = shaped(2, 4, 33, 17, 32, 5);
  Case drawn = shaped(1, 1, 9, 100, 8, 77);
  drawn.problem.scale = 0.25f;
  drawn.values.dist = {Distribution::kExtreme, 30};
  SpecialValue inf, at;
  ASSERT_EQ(parse_special("inf@v:visible*3", inf), "");
  ASSERT_EQ(parse_special("nan@q:at=0,0,8,7", at), "");  // inside the pool shape too: kept
  drawn.values.specials = {inf, at};
  const Case s = snap_shape(pool, drawn, lim);
  EXPECT_EQ(in_domain(s, lim), "") << describe(s);
  EXPECT_EQ(shape_key(s), shape_key(pool));
  EXPECT_EQ(s.seed, 77u);
  EXPECT_EQ(s.problem.scale, 0.25f);
  EXPECT_EQ(to_string(s.values.dist), "extreme:30");
  ASSERT_EQ(s.values.specials.size(), 2u);
  EXPECT_EQ(to_string(s.values.specials[0]), "inf@v:visible*3");
}

TEST(SnapShape, DropsAtPositionsOutsideThePoolShape) {
  const FuzzLimits lim;
  const Case pool = shaped(1, 1, 4, 4, 8);
  Case drawn = shaped(1, 1, 40, 40, 64, 3);
  SpecialValue far;
  ASSERT_EQ(parse_special("nan@k:at=0,0,30,60", far), "");
  drawn.values.specials = {far};
  const Case s = snap_shape(pool, drawn, lim);
  EXPECT_EQ(in_domain(s, lim), "");
  EXPECT_TRUE(s.values.specials.empty());
  EXPECT_EQ(s.seed, 3u);
}

// A case with sinks, softcap 30 and a bias broadcast over batch and heads.
Case with_score_variants(Case c) {
  Problem& p = c.problem;
  p.variants |= AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_BIAS;
  p.softcap = 30;
  EXPECT_EQ(set_bias_strides(p, "bh"), "");
  return c;
}

TEST(ShapeKey, DataVariantsAreNotPartOfIt) {
  const Case plain = shaped(1, 2, 7, 13, 16), scored = with_score_variants(plain);
  EXPECT_NE(shape_key(plain), shape_key(scored));  // compiled in, by default
  EXPECT_EQ(shape_key(plain, kScoreVariants), shape_key(scored, kScoreVariants));
  // Only the declared ones: a softcap compiled in still makes another shape.
  EXPECT_NE(shape_key(plain, AF_VARIANT_SINK | AF_VARIANT_BIAS), shape_key(scored, AF_VARIANT_SINK | AF_VARIANT_BIAS));
}

TEST(SnapShape, KeepsTheInputsOwnDataVariants) {
  FuzzLimits lim;
  lim.variants = kScoreVariants;  // attn-fuzz --variant sink,softcap,alibi,bias
  const Case pool = shaped(2, 4, 33, 17, 32, 5);
  const Case drawn = with_score_variants(shaped(1, 1, 9, 100, 8, 77));
  // Without data variants the snapped input takes the pool case's (none): its sink, softcap and bias are lost.
  EXPECT_EQ(snap_shape(pool, drawn, lim).problem.variants, 0u);
  const Case s = snap_shape(pool, drawn, lim, kScoreVariants);
  EXPECT_EQ(in_domain(s, lim), "") << describe(s);
  EXPECT_EQ(s.problem.variants, AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_BIAS);
  EXPECT_EQ(s.problem.softcap, 30.0f);
  EXPECT_EQ(bias_broadcast(s.problem), "bh");
  EXPECT_EQ(bias_elements(s.problem), 33 * 17);  // [Sq, Sk] of the pool's shape
  EXPECT_EQ(shape_key(s, kScoreVariants), shape_key(pool, kScoreVariants));
  // And the other way: a pool case with variants, an input without: the input's choice (none) wins.
  EXPECT_EQ(snap_shape(with_score_variants(pool), shaped(1, 1, 4, 4, 8), lim, kScoreVariants).problem.variants, 0u);
}

TEST(ShapePool, NewShapesWithinTheTimeShare) {
  ShapePool pool(CompileMode::kPooled, 0.25, "test");
  const Case a = shaped(1, 1, 4, 4, 8), b = shaped(1, 1, 5, 5, 8), c = shaped(1, 1, 6, 6, 8);
  EXPECT_TRUE(pool.takes(shape_key(a)));  // an empty pool takes the first shape
  pool.record(a, shape_key(a), 1.0, 1.01);
  EXPECT_TRUE(pool.takes(shape_key(a)));
  EXPECT_FALSE(pool.takes(shape_key(b)));  // 1 s of 1.01 s in a first call: over the share
  ASSERT_NE(pool.pick(7), nullptr);
  EXPECT_EQ(shape_key(*pool.pick(7)), shape_key(a));
  for (int i = 0; i < 300; ++i) pool.record(a, shape_key(a), 0.01, 0.01);  // 3 s more at the pool shape
  EXPECT_TRUE(pool.takes(shape_key(b)));                                   // 1 s of 4 s: within the share
  pool.record(b, shape_key(b), 1.0, 1.0);
  EXPECT_FALSE(pool.takes(shape_key(c)));
  const nlohmann::json st = pool.stats();
  EXPECT_EQ(st["shapes"], 2);
  EXPECT_EQ(st["checks"], 302);
  pool.reset();  // the adapter restarted: its first shape is new again
  EXPECT_TRUE(pool.takes(shape_key(c)));
}

// A refusal at a new shape costs what its support question cost (flex compiles there): it counts against the new
// shapes' share, and the refused shape is snapped away from. Before, compiled FlexAttention spent 89 of 90 s
// refusing head dims, one compilation each, and the pool never throttled them.
TEST(ShapePool, ARefusedNewShapeCountsAgainstTheShareAndIsNotTakenAgain) {
  ShapePool pool(CompileMode::kPooled, 0.25, "test");
  const Case a = shaped(1, 1, 4, 4, 8), odd = shaped(1, 1, 4, 4, 7), b = shaped(1, 1, 5, 5, 8);
  pool.record(a, shape_key(a), 1.0, 1.0);
  for (int i = 0; i < 400; ++i) pool.record(a, shape_key(a), 0.01, 0.01);  // 1 s of 5 s: new shapes welcome
  EXPECT_TRUE(pool.takes(shape_key(odd)));
  pool.note_refused(shape_key(odd), 2.0);  // 3 s of 7 s now in first calls and refusals
  EXPECT_FALSE(pool.takes(shape_key(odd)));
  EXPECT_FALSE(pool.takes(shape_key(b)));  // over the share
  for (int i = 0; i < 900; ++i) pool.record(a, shape_key(a), 0.01, 0.01);  // 3 s of 16 s
  EXPECT_TRUE(pool.takes(shape_key(b)));
  EXPECT_FALSE(pool.takes(shape_key(odd)));  // still refused: snapped onto a compiled shape
  const nlohmann::json st = pool.stats();
  EXPECT_EQ(st["refused"], 1);
  EXPECT_DOUBLE_EQ(st["new_shape_s"].get<double>(), 3.0);
  ShapePool off;
  off.note_refused(shape_key(odd), 2.0);  // no pool: nothing counted, every shape as drawn
  EXPECT_TRUE(off.takes(shape_key(odd)));
  EXPECT_EQ(off.stats()["refused"], 0);
}

// Before the first compiled shape there is nothing to snap onto: after a refusal the inputs go to plain_shape
// (powers of two, head dims >= 16), which compiled FlexAttention accepts, instead of one refused compilation each.
TEST(ShapePool, AfterARefusalWithNothingCompiledInputsTakeThePlainShape) {
  ShapePool pool(CompileMode::kPooled, 0.25, "test");
  const Case odd = shaped(2, 3, 37, 45, 7), other = shaped(1, 1, 9, 9, 24);
  EXPECT_TRUE(pool.takes(shape_key(odd)));
  pool.note_refused(shape_key(odd), 10.0);
  EXPECT_FALSE(pool.takes(shape_key(other)));
  EXPECT_EQ(pool.pick(0), nullptr);
  FuzzLimits lim;
  lim.max_seq = 64, lim.max_dim = 64;
  const Problem p = CaseDomain(lim).plain_shape(odd).problem;
  EXPECT_EQ(std::vector<int64_t>({p.batch, p.heads_q, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v}),
            std::vector<int64_t>({2, 3, 32, 32, 16, 16}));
  const Problem q = CaseDomain(lim).plain_shape(shaped(1, 1, 64, 100, 64)).problem;  // 64 stays, 100 -> 64
  EXPECT_EQ(std::vector<int64_t>({q.seq_q, q.seq_k, q.head_dim}), std::vector<int64_t>({64, 64, 64}));
  lim.max_dim = 8;  // head dims as near 16 as the limits allow
  EXPECT_EQ(CaseDomain(lim).plain_shape(shaped(1, 1, 4, 4, 7)).problem.head_dim, 8);
  pool.record(odd, "compiled", 10.0, 10.0);  // once one shape compiled, inputs snap onto it
  EXPECT_NE(pool.pick(0), nullptr);
}

TEST(ShapePool, ShareOneTakesEveryShapeAndOffTakesAll) {
  ShapePool every(CompileMode::kPooled, 1, "test"), off;
  const Case a = shaped(1, 1, 4, 4, 8), b = shaped(1, 1, 5, 5, 8);
  every.record(a, shape_key(a), 5, 5.001);
  off.record(a, shape_key(a), 5, 5.001);
  EXPECT_TRUE(every.takes(shape_key(b)));
  EXPECT_TRUE(off.takes(shape_key(b)));
}

// The probe alternates new and pooled shapes, then decides from kProbeSamples of each.
ShapePool probe(double first_s, double repeat_s) {
  ShapePool pool(CompileMode::kProbe, 0.25, "measuring");
  int next = 4;
  const Case home = shaped(1, 1, 3, 3, 8);
  for (int i = 0; i < 20 && pool.mode() == CompileMode::kProbe; ++i) {
    const Case fresh = shaped(1, 1, next, next, 8);
    const bool fresh_taken = pool.takes(shape_key(fresh));
    const Case& c = i == 0 ? home : fresh_taken ? fresh : *pool.pick(0);
    if (&c == &fresh) ++next;
    const bool is_new = i == 0 || &c == &fresh;
    pool.record(c, shape_key(c), is_new ? first_s : repeat_s, is_new ? first_s : repeat_s);
  }
  return pool;
}

TEST(ShapePool, ProbeFindsAKernelThatCompilesPerShape) {
  const ShapePool p = probe(0.2, 0.005);
  EXPECT_EQ(p.mode(), CompileMode::kPooled);
  EXPECT_NE(p.why().find("measured"), std::string::npos) << p.why();
}

TEST(ShapePool, ProbeLeavesAKernelWithoutCompilationAlone) {
  EXPECT_EQ(probe(0.02, 0.01).mode(), CompileMode::kOff);  // 2x: not a compilation
  EXPECT_EQ(probe(0.012, 0.001).mode(), CompileMode::kOff);  // 12x but 11 ms: not worth a pool
}

}  // namespace
}  // namespace attnfuzz::fuzz
