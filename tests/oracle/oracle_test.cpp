// oracle_test.cpp - the oracle's semantics: closed forms, masks, GQA, NaN/Inf rules, contract, sampling,
// fast path against the multiprecision arbiter.
#include "oracle/oracle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "oracle/reference_fp32.h"
#include "oracle/reference_fp64.h"
#include "tests/oracle/fp32_models.h"
#include "tests/oracle/oracle_options.h"

namespace attnfuzz {
namespace {

using testing::RandomCase;
using testing::Rng;
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr float kInff = std::numeric_limits<float>::infinity();

using test_util::k1Thread;

// Brute force in long double straight from docs/semantics.md (mask from its formula, not visible_keys).
struct Brute {
  std::vector<long double> o, lse;
};
Brute brute(const Problem& p, const float* q, const float* k, const float* v) {
  Brute r;
  r.o.assign(p.batch * p.seq_q * p.heads_q * p.head_dim_v, 0);
  r.lse.assign(p.batch * p.heads_q * p.seq_q, -INFINITY);
  const int64_t off =
      p.mask_kind != AF_MASK_NONE && p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? p.seq_k - p.seq_q : 0;
  int64_t L = INT64_MAX, R = INT64_MAX;
  if (p.mask_kind == AF_MASK_CAUSAL) R = 0;
  if (p.mask_kind == AF_MASK_WINDOW) {
    if (p.window_left != AF_UNBOUNDED) L = p.window_left;
    if (p.window_right != AF_UNBOUNDED) R = p.window_right;
  }
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        std::vector<long double> s(p.seq_k);
        std::vector<bool> vis(p.seq_k);
        long double m = -INFINITY;
        for (int64_t j = 0; j < p.seq_k; ++j) {
          const int64_t t = j - (i + off);
          vis[j] = t >= -L && t <= R;
          if (!vis[j]) continue;
          long double acc = 0;
          for (int64_t d = 0; d < p.head_dim; ++d)
            acc +=
                (long double)q[q_index(p, b, i, h, d)] * k[k_index(p, b, j, h / (p.heads_q / p.heads_kv), d)];
          s[j] = acc * p.scale;
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;
        long double l = 0;
        for (int64_t j = 0; j < p.seq_k; ++j)
          if (vis[j]) l += (s[j] = std::exp(s[j] - m));
        r.lse[(b * p.heads_q + h) * p.seq_q + i] = m + std::log(l);
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          long double acc = 0;
          for (int64_t j = 0; j < p.seq_k; ++j)
            if (vis[j]) acc += s[j] * v[v_index(p, b, j, h / (p.heads_q / p.heads_kv), d)];
          r.o[((b * p.seq_q + i) * p.heads_q + h) * p.head_dim_v + d] = acc / l;
        }
      }
  return r;
}

void expect_matches_brute(const RandomCase& c, const char* what) {
  const OracleResult R = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  const Brute B = brute(c.p, c.q.data(), c.k.data(), c.v.data());
  for (size_t i = 0; i < R.o.size(); ++i)
    ASSERT_NEAR(R.o[i], (double)B.o[i], 1e-12 * (1 + std::fabs((double)B.o[i])))
        << what << " " << describe(c.p);
  for (size_t i = 0; i < R.lse.size(); ++i) {
    if (std::isinf((double)B.lse[i])) {
      ASSERT_EQ(R.lse[i], (double)B.lse[i]) << what;
    } else {
      ASSERT_NEAR(R.lse[i], (double)B.lse[i], 1e-12 * (1 + std::fabs((double)B.lse[i]))) << what;
    }
  }
}

RandomCase make_case(Problem p, Rng& rng, double sigma = 1) {
  RandomCase c;
  c.p = p;
  c.q.resize(q_elements(p));
  c.k.resize(k_elements(p));
  c.v.resize(v_elements(p));
  for (auto* t : {&c.q, &c.k, &c.v})
    for (auto& x : *t) x = static_cast<float>(sigma * rng.normal());
  return c;
}

// ---- closed forms ----

TEST(OracleClosedForm, Seed000Example) {
  // Scores [2, 1, 4] (D = 1, q = 1, scale = 1), V rows [1, 0], [0, 2], [3, 1].
  Problem p = make_problem(1, 1, 1, 1, 3, 1, 2);
  p.scale = 1;
  const float q[] = {1}, k[] = {2, 1, 4}, v[] = {1, 0, 0, 2, 3, 1};
  const OracleResult R = compute_oracle(p, q, k, v, k1Thread);
  const double e2 = std::exp(2.0), e1 = std::exp(1.0), e4 = std::exp(4.0), l = e2 + e1 + e4;
  EXPECT_NEAR(R.o[0], 2.6456, 1e-4);
  EXPECT_NEAR(R.o[1], 0.9278, 1e-4);
  EXPECT_NEAR(R.o[0], (e2 + 3 * e4) / l, 1e-15);
  EXPECT_NEAR(R.o[1], (2 * e1 + e4) / l, 1e-15);
  EXPECT_NEAR(R.lse[0], std::log(l), 1e-15);
  EXPECT_EQ(R.rows[0].kind, RowKind::kNormal);
  EXPECT_GT(R.o_bound[0], 0);
}

TEST(OracleClosedForm, UniformScoresGiveMeanOfV) {
  Rng rng(3);
  Problem p = make_problem(1, 1, 1, 3, 50, 8, 5);
  RandomCase c = make_case(p, rng);
  std::fill(c.q.begin(), c.q.end(), 0.0f);  // every score 0
  const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t d = 0; d < 5; ++d) {
      long double mean = 0;
      for (int64_t j = 0; j < 50; ++j) mean += c.v[v_index(p, 0, j, 0, d)];
      mean /= 50;
      EXPECT_NEAR(R.o[R.o_at(0, s, 0, d)], (double)mean, 1e-15 * (1 + std::fabs((double)mean)));
    }
  EXPECT_NEAR(R.lse[0], std::log(50.0), 1e-15);
}

TEST(OracleClosedForm, DominantKeyGivesItsV) {
  Rng rng(4);
  Problem p = make_problem(1, 1, 1, 1, 40, 4, 6);
  p.scale = 1;
  RandomCase c = make_case(p, rng, 0.1);
  for (int64_t d = 0; d < 4; ++d) c.q[d] = 100, c.k[17 * 4 + d] = 100;  // s_17 = 4e4, others ~ 10
  const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  for (int64_t d = 0; d < 6; ++d) EXPECT_EQ(R.o[d], (double)c.v[17 * 6 + d]);
  EXPECT_NEAR(R.lse[0], 4e4, 1e-11);
}

TEST(OracleClosedForm, FullyMaskedRows) {
  Rng rng(5);
  {  // Sk = 0: every row fully masked.
    Problem p = make_problem(1, 2, 1, 4, 0, 8, 8);
    RandomCase c = make_case(p, rng);
    const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
    for (double x : R.o) EXPECT_EQ(x, 0.0);
    for (double x : R.lse) EXPECT_EQ(x, -INFINITY);
    for (double x : R.o_bound) EXPECT_EQ(x, 0.0);
    for (const RowInfo& ri : R.rows) EXPECT_EQ(ri.kind, RowKind::kFullyMasked);
  }
  {  // Causal top-left with Sq > Sk... rows beyond the keys still see keys; a window left 0 right -
    // use bottom-right causal with Sq > Sk: the first Sq - Sk rows see nothing.
    Problem p = make_problem(1, 1, 1, 6, 2, 3, 3);
    p.mask_kind = AF_MASK_CAUSAL;
    p.mask_align = AF_ALIGN_BOTTOM_RIGHT;
    p.window_right = 0;
    RandomCase c = make_case(p, rng);
    const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
    for (int64_t s = 0; s < 4; ++s) {
      EXPECT_EQ(R.row(0, 0, s).kind, RowKind::kFullyMasked) << s;
      EXPECT_EQ(R.lse[R.lse_at(0, 0, s)], -INFINITY);
      for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(R.o[R.o_at(0, s, 0, d)], 0.0);
    }
    EXPECT_EQ(R.row(0, 0, 4).kind, RowKind::kNormal);
  }
  {  // Every visible score -inf (q has -inf, k positive): O = 0, LSE = -inf.
    Problem p = make_problem(1, 1, 1, 1, 3, 1, 2);
    const float q[] = {-kInff}, k[] = {1, 2, 3}, v[] = {1, 2, 3, 4, 5, 6};
    const OracleResult R = compute_oracle(p, q, k, v, k1Thread);
    EXPECT_EQ(R.rows[0].kind, RowKind::kFullyMasked);
    EXPECT_EQ(R.o[0], 0.0);
    EXPECT_EQ(R.lse[0], -INFINITY);
  }
}

// ---- masks, shapes, GQA ----

TEST(OracleSemantics, MasksMatchBruteForce) {
  Rng rng(6);
  struct M {
    int32_t kind, align;
    int64_t l, r;
  };
  const M masks[] = {{AF_MASK_NONE, AF_ALIGN_BOTTOM_RIGHT, AF_UNBOUNDED, AF_UNBOUNDED},
                     {AF_MASK_CAUSAL, AF_ALIGN_TOP_LEFT, AF_UNBOUNDED, 0},
                     {AF_MASK_CAUSAL, AF_ALIGN_BOTTOM_RIGHT, AF_UNBOUNDED, 0},
                     {AF_MASK_WINDOW, AF_ALIGN_TOP_LEFT, 3, 2},
                     {AF_MASK_WINDOW, AF_ALIGN_BOTTOM_RIGHT, 0, 0},
                     {AF_MASK_WINDOW, AF_ALIGN_BOTTOM_RIGHT, AF_UNBOUNDED, 4},
                     {AF_MASK_WINDOW, AF_ALIGN_TOP_LEFT, 5, AF_UNBOUNDED}};
  const int64_t shapes[][2] = {{7, 13}, {13, 7}, {1, 9}, {9, 1}, {16, 16}, {5, 0}};
  for (const M& m : masks)
    for (const auto& sh : shapes) {
      Problem p = make_problem(2, 2, 1, sh[0], sh[1], 5, 3);
      p.mask_kind = m.kind, p.mask_align = m.align, p.window_left = m.l, p.window_right = m.r;
      expect_matches_brute(make_case(p, rng), mask_to_string(p).c_str());
    }
}

TEST(OracleSemantics, RandomCasesMatchBruteForce) {
  Rng rng(7);
  for (int i = 0; i < 200; ++i) {
    RandomCase c = testing::random_case(rng, 12, 9, 30);
    expect_matches_brute(c, "random");
  }
}

TEST(OracleSemantics, GqaHeadMapping) {
  Rng rng(8);
  Problem p = make_problem(1, 6, 2, 5, 7, 4, 4);  // query heads 0-2 read kv 0, 3-5 read kv 1
  RandomCase c = make_case(p, rng);
  const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  for (int64_t h = 0; h < 6; ++h) {
    Problem p1 = make_problem(1, 1, 1, 5, 7, 4, 4);
    std::vector<float> q1(q_elements(p1)), k1(k_elements(p1)), v1(v_elements(p1));
    for (int64_t s = 0; s < 5; ++s)
      for (int64_t d = 0; d < 4; ++d) q1[q_index(p1, 0, s, 0, d)] = c.q[q_index(p, 0, s, h, d)];
    for (int64_t j = 0; j < 7; ++j)
      for (int64_t d = 0; d < 4; ++d) {
        k1[k_index(p1, 0, j, 0, d)] = c.k[k_index(p, 0, j, h / 3, d)];
        v1[v_index(p1, 0, j, 0, d)] = c.v[v_index(p, 0, j, h / 3, d)];
      }
    const OracleResult R1 = compute_oracle(p1, q1.data(), k1.data(), v1.data(), k1Thread);
    for (int64_t s = 0; s < 5; ++s)
      for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(R.o[R.o_at(0, s, h, d)], R1.o[R1.o_at(0, s, 0, d)]);
  }
}

TEST(OracleSemantics, NonContiguousStrides) {
  Rng rng(9);
  Problem p = make_problem(2, 2, 2, 6, 9, 5, 7);
  RandomCase c = make_case(p, rng);
  Problem ps = p;  // padded layout: extra room between heads and rows
  ps.q_stride[2] = 8, ps.q_stride[1] = 20, ps.q_stride[0] = 200;
  ps.k_stride[2] = 6, ps.k_stride[1] = 13, ps.k_stride[0] = 130;
  ps.v_stride[2] = 9, ps.v_stride[1] = 19, ps.v_stride[0] = 190;
  std::vector<float> q(q_elements(ps), kNaNf), k(k_elements(ps), kNaNf), v(v_elements(ps), kNaNf);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t s = 0; s < 6; ++s)
        for (int64_t d = 0; d < 5; ++d) q[q_index(ps, b, s, h, d)] = c.q[q_index(p, b, s, h, d)];
      for (int64_t j = 0; j < 9; ++j) {
        for (int64_t d = 0; d < 5; ++d) k[k_index(ps, b, j, h, d)] = c.k[k_index(p, b, j, h, d)];
        for (int64_t d = 0; d < 7; ++d) v[v_index(ps, b, j, h, d)] = c.v[v_index(p, b, j, h, d)];
      }
    }
  const OracleResult A = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  const OracleResult B = compute_oracle(ps, q.data(), k.data(), v.data(), k1Thread);
  EXPECT_EQ(A.o, B.o);
  EXPECT_EQ(A.lse, B.lse);
}

// ---- NaN / Inf rules ----

TEST(OracleNonFinite, MaskedNaNAndInfDoNotMatter) {
  Rng rng(10);
  Problem p = make_problem(1, 1, 1, 6, 6, 4, 3);
  p.mask_kind = AF_MASK_CAUSAL, p.mask_align = AF_ALIGN_TOP_LEFT, p.window_right = 0;
  RandomCase c = make_case(p, rng);
  const OracleResult A = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  // Key 5 is visible only to row 5; poison it and check rows 0..4.
  for (int64_t d = 0; d < 4; ++d) c.k[k_index(p, 0, 5, 0, d)] = d % 2 ? kNaNf : kInff;
  for (int64_t d = 0; d < 3; ++d) c.v[v_index(p, 0, 5, 0, d)] = kNaNf;
  const OracleResult B = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  for (int64_t s = 0; s < 5; ++s) {
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(A.o[A.o_at(0, s, 0, d)], B.o[B.o_at(0, s, 0, d)]);
    EXPECT_EQ(A.lse[A.lse_at(0, 0, s)], B.lse[B.lse_at(0, 0, s)]);
  }
  EXPECT_TRUE(std::isnan(B.o[B.o_at(0, 5, 0, 0)]));  // row 5 sees the NaN score
}

TEST(OracleNonFinite, NaNInVisibleQGivesNaNRow) {
  Rng rng(11);
  Problem p = make_problem(1, 1, 1, 3, 5, 4, 3);
  RandomCase c = make_case(p, rng);
  c.q[q_index(p, 0, 1, 0, 2)] = kNaNf;
  const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  EXPECT_EQ(R.row(0, 0, 1).kind, RowKind::kNaN);
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_TRUE(std::isnan(R.o[R.o_at(0, 1, 0, d)]));
    EXPECT_TRUE(std::isfinite(R.o[R.o_at(0, 0, 0, d)]));
  }
  EXPECT_TRUE(std::isnan(R.lse[R.lse_at(0, 0, 1)]));
}

TEST(OracleNonFinite, NaNInVisibleVOnlyPoisonsItsColumn) {
  Rng rng(12);
  Problem p = make_problem(1, 1, 1, 2, 5, 4, 3);
  RandomCase c = make_case(p, rng);
  c.v[v_index(p, 0, 3, 0, 1)] = kNaNf;
  const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  for (int64_t s = 0; s < 2; ++s) {
    EXPECT_TRUE(std::isnan(R.o[R.o_at(0, s, 0, 1)]));
    EXPECT_TRUE(std::isfinite(R.o[R.o_at(0, s, 0, 0)]));
    EXPECT_TRUE(std::isfinite(R.o[R.o_at(0, s, 0, 2)]));
    EXPECT_TRUE(std::isfinite(R.lse[R.lse_at(0, 0, s)]));
    EXPECT_TRUE(R.row(0, 0, s).inside_contract());
  }
}

TEST(OracleNonFinite, MinusInfScoreHasWeightZero) {
  // q = [1, 1], key 1 = [-inf, 1] gives s_1 = -inf: the result equals the case without key 1.
  Problem p = make_problem(1, 1, 1, 1, 3, 2, 2);
  const float q[] = {1, 1};
  const float k[] = {0.5f, 0.25f, -kInff, 1, 2, -1};
  const float v[] = {1, 2, 100, 200, 3, 4};
  const OracleResult R = compute_oracle(p, q, k, v, k1Thread);
  Problem p2 = make_problem(1, 1, 1, 1, 2, 2, 2);
  const float k2[] = {0.5f, 0.25f, 2, -1}, v2[] = {1, 2, 3, 4};
  const OracleResult R2 = compute_oracle(p2, q, k2, v2, k1Thread);
  EXPECT_EQ(R.rows[0].kind, RowKind::kNormal);
  EXPECT_EQ(R.o[0], R2.o[0]);
  EXPECT_EQ(R.o[1], R2.o[1]);
  EXPECT_EQ(R.lse[0], R2.lse[0]);
}

TEST(OracleNonFinite, PlusInfOrNaNScoreGivesNaNRow) {
  Problem p = make_problem(1, 1, 1, 2, 2, 2, 2);
  p.mask_kind = AF_MASK_CAUSAL, p.mask_align = AF_ALIGN_TOP_LEFT, p.window_right = 0;
  const float q[] = {1, 1, 1, 0};
  const float k[] = {1, 1, kInff, 1};  // s_01 = +inf (visible to row 1 only)
  const float v[] = {1, 2, 3, 4};
  const OracleResult R = compute_oracle(p, q, k, v, k1Thread);
  EXPECT_EQ(R.row(0, 0, 0).kind, RowKind::kNormal);
  EXPECT_EQ(R.row(0, 0, 1).kind, RowKind::kNaN);
  EXPECT_TRUE(std::isnan(R.o[R.o_at(0, 1, 0, 0)]));
  EXPECT_TRUE(std::isnan(R.lse[R.lse_at(0, 0, 1)]));
  const float q2[] = {0, 1, 0, 1};
  const float k2[] = {1, 1, kInff, 0};  // q . k = inf * 0 = NaN for key 1
  const OracleResult R2 = compute_oracle(p, q2, k2, v, k1Thread);
  EXPECT_EQ(R2.row(0, 0, 1).kind, RowKind::kNaN);
}

// ---- fp32 contract ----

TEST(OracleContract, HugeScoresAreOutside) {
  Problem p = make_problem(1, 1, 1, 2, 3, 4, 2);
  std::vector<float> q(8, 1e20f), k(12, 1e20f), v(6, 1.0f);
  q[4] = q[5] = q[6] = q[7] = 1.0f;  // row 1 is ordinary
  const OracleResult R = compute_oracle(p, q.data(), k.data(), v.data(), k1Thread);
  EXPECT_EQ(R.row(0, 0, 0).contract, ContractReason::kScoreRange);
  EXPECT_TRUE(std::isinf(R.o_bound[R.o_at(0, 0, 0, 0)]));
  EXPECT_TRUE(R.row(0, 0, 1).inside_contract());
  EXPECT_EQ(R.rows_outside, 1);
}

TEST(OracleContract, HugeValueSumsAndInfiniteVAreOutside) {
  Problem p = make_problem(1, 1, 1, 1, 4, 2, 2);
  std::vector<float> q(2, 0.0f), k(8, 0.0f), v(8, 3e38f);
  const OracleResult R = compute_oracle(p, q.data(), k.data(), v.data(), k1Thread);
  EXPECT_EQ(R.rows[0].contract, ContractReason::kValueRange);
  std::fill(v.begin(), v.end(), 1.0f);
  v[5] = kInff;
  const OracleResult R2 = compute_oracle(p, q.data(), k.data(), v.data(), k1Thread);
  EXPECT_EQ(R2.rows[0].contract, ContractReason::kValueRange);
  std::fill(v.begin(), v.end(), 1e30f);
  const OracleResult R3 = compute_oracle(p, q.data(), k.data(), v.data(), k1Thread);
  EXPECT_TRUE(R3.rows[0].inside_contract());
}

// Found by attn-fuzz on an H200: each case made a correct kernel "fail" although no fp32 kernel can do better.
TEST(OracleContract, OverflowingProductsOutsideEvenWhenTheExactScoreIsMinusInf) {
  Problem p = make_problem(1, 1, 1, 1, 2, 2, 2);
  // score = (+inf)(-1) + FLT_MAX * 1000 = -inf exactly, but an fp32 kernel forms FLT_MAX * 1000 = +inf
  // and -inf + inf = NaN: the finite product already exceeds fp32's range.
  std::vector<float> q{kInff, 3.4e38f}, k{-1.0f, 1000.0f, -1.0f, 1000.0f}, v(4, 1.0f);
  const OracleResult R = compute_oracle(p, q.data(), k.data(), v.data(), k1Thread);
  EXPECT_EQ(R.rows[0].kind, RowKind::kFullyMasked);
  EXPECT_EQ(R.rows[0].contract, ContractReason::kScoreRange);
  EXPECT_TRUE(std::isinf(R.lse_bound[0])) << "outside rows are not judged";
}

TEST(OracleContract, PartialValueSumsBeyondRangeAreOutsideWhateverTheFinalWeights) {
  // Keys 0 and 1 come first with score 0, key 2 last with score 100: an online kernel's accumulator holds
  // v0 + v1 = 5e38 (inf in fp32) before the rescale by e^-100 that the exact result applies.
  Problem p = make_problem(1, 1, 1, 1, 3, 1, 1);
  p.scale = 1.0f;
  std::vector<float> q{1.0f}, k{0.0f, 0.0f, 100.0f}, v{2.5e38f, 2.5e38f, 1.0f};
  const OracleResult R = compute_oracle(p, q.data(), k.data(), v.data(), k1Thread);
  EXPECT_LT(std::fabs(R.o[0]), 1e-5 * 2.5e38);  // the exact O is modest...
  EXPECT_EQ(R.rows[0].contract, ContractReason::kValueRange);  // ...but a partial sum is not
}

// ---- sampling ----

TEST(OracleSampling, IncludesTileBoundariesFullyMaskedAndNonFiniteRows) {
  Rng rng(13);
  Problem p = make_problem(1, 2, 1, 1000, 900, 4, 4);
  p.mask_kind = AF_MASK_CAUSAL, p.mask_align = AF_ALIGN_BOTTOM_RIGHT, p.window_right = 0;  // rows < 100 empty
  RandomCase c = make_case(p, rng);
  c.q[q_index(p, 0, 555, 1, 2)] = kInff;
  OracleOptions o;
  o.row_budget = 300;
  const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), o);
  auto has = [&](int64_t s) { return std::binary_search(R.sampled.begin(), R.sampled.end(), s); };
  for (int64_t T : {16, 32, 64, 128})
    for (int64_t t = 0; t < 1000; t += T) {
      EXPECT_TRUE(has(t)) << t;
      EXPECT_TRUE(has(std::min<int64_t>(t + T, 1000) - 1)) << t;
    }
  EXPECT_TRUE(has(999));
  for (int64_t s = 0; s < 100; ++s) EXPECT_TRUE(has(s)) << s;
  EXPECT_TRUE(has(555));
  EXPECT_GE((int64_t)R.sampled.size(), 300);
  EXPECT_LT((int64_t)R.sampled.size(), 1000);
  for (int64_t s = 0; s < 1000; ++s) EXPECT_EQ(R.row(0, 1, s).computed, has(s));
  EXPECT_EQ(R.rows_computed, 2 * (int64_t)R.sampled.size());
  // A computed row equals the unsampled computation.
  const OracleResult F = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  for (int64_t s : R.sampled) {
    const double a = R.o[R.o_at(0, s, 1, 3)], b = F.o[F.o_at(0, s, 1, 3)];
    EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << s;
  }
  // Inf anywhere in K: every row.
  c.k[k_index(p, 0, 3, 0, 0)] = kInff;
  EXPECT_EQ(sample_rows(p, c.q.data(), c.k.data(), 300, 1).size(), 1000u);
}

// ---- fast path vs the arbiter ----

// Fast (certify_values) and multiprecision round to the same fp32 value, except when the exact value lies
// within the oracle's own error of an fp32 rounding boundary (then the two may straddle it).
void expect_fast_equals_mp(const RandomCase& c, MpBackend be = MpBackend::kAuto) {
  OracleOptions of = k1Thread, om = k1Thread;
  of.certify_values = true;
  om.force_multiprecision = true;
  om.mp_backend = be;
  const OracleResult F = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), of);
  const OracleResult M = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), om);
  auto check = [&](double f, double m, double ef, double em, double bound, const char* what) {
    if (std::isnan(m)) {
      EXPECT_TRUE(std::isnan(f)) << what;
      return;
    }
    if (std::isinf(m)) {
      EXPECT_EQ(f, m) << what;
      return;
    }
    ASSERT_LE(std::fabs(f - m), ef + em + 1e-300) << what << " " << describe(c.p);
    if (std::isfinite(bound)) EXPECT_LE(ef, bound * 0x1p-16) << what;
    const float ff = static_cast<float>(f), fm = static_cast<float>(m);
    if (ff != fm) {
      // The midpoint between the two fp32 neighbours must lie within the error of the two values.
      const double mid = (static_cast<double>(ff) + static_cast<double>(fm)) / 2;
      EXPECT_LE(std::fabs(mid - m), ef + em) << what << " f=" << f << " m=" << m;
    }
  };
  for (size_t i = 0; i < F.o.size(); ++i) check(F.o[i], M.o[i], F.o_err[i], M.o_err[i], F.o_bound[i], "O");
  for (size_t i = 0; i < F.lse.size(); ++i)
    check(F.lse[i], M.lse[i], F.lse_err[i], M.lse_err[i], F.lse_bound[i], "LSE");
}

TEST(OracleFastPath, EqualsMultiprecisionOnRandomCases) {
  Rng rng(14);
  for (int i = 0; i < 60; ++i) expect_fast_equals_mp(testing::random_case(rng, 12, 24, 1e4));
}

TEST(OracleFastPath, EqualsMultiprecisionOnAdversarialCases) {
  Rng rng(15);
  {  // cancellation: v = +-1 with equal weights (O = 0 exactly), and a huge common offset in v
    Problem p = make_problem(1, 1, 1, 3, 64, 8, 4);
    RandomCase c = make_case(p, rng);
    std::fill(c.q.begin(), c.q.end(), 0.0f);
    for (int64_t j = 0; j < 64; ++j)
      for (int64_t d = 0; d < 4; ++d) c.v[v_index(p, 0, j, 0, d)] = (j % 2 ? 1.0f : -1.0f) * (d + 1);
    expect_fast_equals_mp(c);
    for (auto& x : c.v) x += 1e6f;
    expect_fast_equals_mp(c);
  }
  {  // scores that cancel in the dot product: q . k = 1e8 - 1e8 + small
    Problem p = make_problem(1, 1, 1, 2, 8, 3, 2);
    RandomCase c = make_case(p, rng);
    for (int64_t j = 0; j < 8; ++j) {
      c.k[k_index(p, 0, j, 0, 0)] = 1e4f, c.k[k_index(p, 0, j, 0, 1)] = 1e4f;
      c.k[k_index(p, 0, j, 0, 2)] = static_cast<float>(j) * 0.37f;
    }
    for (int64_t s = 0; s < 2; ++s)
      c.q[q_index(p, 0, s, 0, 0)] = 1e4f, c.q[q_index(p, 0, s, 0, 1)] = -1e4f,
                              c.q[q_index(p, 0, s, 0, 2)] = 1;
    expect_fast_equals_mp(c);
  }
  {  // extreme logits, subnormal and huge values
    for (double sig : {1e2, 1e3, 3e4})
      expect_fast_equals_mp(make_case(make_problem(1, 2, 1, 5, 33, 7, 5), rng, sig));
    RandomCase c = make_case(make_problem(1, 1, 1, 4, 20, 5, 3), rng);
    for (auto& x : c.v) x *= 1e-40f;
    expect_fast_equals_mp(c);
    for (auto& x : c.v) x = static_cast<float>(rng.normal() * 1e36);
    expect_fast_equals_mp(c);
  }
}

TEST(OracleFastPath, CertifyValuesFallsBackOnCancellation) {
  Problem p = make_problem(1, 1, 1, 1, 3, 1, 1);
  p.scale = 1;
  // Equal weights 1/3, v = 1, 1, -(2 - 2^-23): O = 2^-23 / 3, cancellation 3e7.
  const float q[] = {1}, k[] = {0, 0, 0}, v[] = {1, 1, -1.99999988079071044921875f};
  OracleOptions o = k1Thread;
  o.certify_values = true;
  const OracleResult R = compute_oracle(p, q, k, v, o);
  EXPECT_TRUE(R.rows[0].fell_back || R.o_err[0] <= 0x1p-40 * std::fabs(R.o[0]));
  EXPECT_NEAR(R.o[0], 0x1p-23 / 3, 1e-22);
}

TEST(OracleFastPath, CppBinFloatBackendAgrees) {
  Rng rng(16);
  for (int i = 0; i < 4; ++i)
    expect_fast_equals_mp(testing::random_case(rng, 6, 8, 100), MpBackend::kCppBinFloat);
}

TEST(OracleFastPath, ThreadsGiveIdenticalResults) {
  Rng rng(17);
  Problem p = make_problem(2, 2, 1, 37, 41, 16, 16);
  RandomCase c = make_case(p, rng, 3);
  OracleOptions o2;
  o2.threads = 2;
  const OracleResult A = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
  const OracleResult B = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), o2);
  EXPECT_EQ(A.o, B.o);
  EXPECT_EQ(A.o_bound, B.o_bound);
  EXPECT_EQ(A.lse, B.lse);
}

TEST(OracleOptionsTest, RejectsBadInput) {
  Problem p = make_problem(1, 1, 1, 1, 1, 1, 1);
  const float x[] = {1};
  OracleOptions o;
  o.mp_bits = 64;
  EXPECT_THROW(compute_oracle(p, x, x, x, o), std::invalid_argument);
  p.heads_kv = 0;
  EXPECT_THROW(compute_oracle(p, x, x, x), std::invalid_argument);
}

// ---- the plain fp32 reference ----

TEST(ReferenceFp32, CloseToExactAndFullyMaskedRowsAreZero) {
  Rng rng(18);
  Problem p = make_problem(1, 1, 1, 5, 3, 8, 4);
  p.mask_kind = AF_MASK_CAUSAL, p.mask_align = AF_ALIGN_BOTTOM_RIGHT, p.window_right = 0;
  RandomCase c = make_case(p, rng);
  const Fp32Result f = reference_fp32(p, c.q.data(), c.k.data(), c.v.data());
  const Fp64Result d = reference_fp64(p, c.q.data(), c.k.data(), c.v.data());
  for (size_t i = 0; i < f.o.size(); ++i) EXPECT_NEAR(f.o[i], d.o[i], 1e-5);
  EXPECT_EQ(f.lse[0], -INFINITY);
  EXPECT_EQ(f.o[0], 0.0f);
}

}  // namespace
}  // namespace attnfuzz
