// bound_test.cpp - the fp32 error bound: never exceeded by correct fp32 strategies (plain, online tiles,
// exp2, approximate exp2, split-KV) incl. extreme logits; far exceeded by a missing accumulator rescale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "oracle/oracle.h"
#include "tests/oracle/fp32_models.h"
#include "tests/oracle/oracle_options.h"

namespace attnfuzz {
namespace {

using testing::ExpKind;
using testing::ModelOptions;
using testing::RandomCase;
using testing::Rng;

// Max |got - exact| / bound over O and LSE of inside-contract computed rows; +inf for a class mismatch.
double max_ratio(const OracleResult& R, const float* o, const float* lse) {
  const Problem& p = R.problem;
  double mr = 0;
  auto one = [&](double e, double g, double bound) {
    if (std::isnan(e) || std::isnan(g)) return std::isnan(e) && std::isnan(g) ? 0.0 : INFINITY;
    if (std::isinf(e) || std::isinf(g)) return e == g ? 0.0 : INFINITY;
    const double err = std::fabs(g - e);
    return err == 0 ? 0.0 : err / bound;
  };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const RowInfo& ri = R.row(b, h, s);
        if (!ri.computed || !ri.inside_contract()) continue;
        const size_t li = R.lse_at(b, h, s);
        mr = std::max(mr, one(R.lse[li], lse[lse_index(p, b, h, s)], R.lse_bound[li]));
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t oi = R.o_at(b, s, h, d);
          mr = std::max(mr, one(R.o[oi], o[o_index(p, b, s, h, d)], R.o_bound[oi]));
        }
      }
  return mr;
}

using test_util::k1Thread;

TEST(OracleBound, PlainFp32ReferenceNeverExceedsBoundOn10000RandomCases) {
  Rng rng(101);
  double worst = 0;
  int64_t rows = 0;
  for (int i = 0; i < 10000; ++i) {
    const double max_logit = i % 10 == 0 ? 1e6 : 1e4;
    RandomCase c = testing::random_case(rng, 20, 32, max_logit);
    const OracleResult R = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
    // The baseline is stored contiguously: give it contiguous strides.
    Problem pc = c.p;
    set_contiguous_strides(pc);
    OracleResult Rc = R;
    Rc.problem = pc;
    const double r = max_ratio(Rc, R.base_o.data(), R.base_lse.data());
    ASSERT_LE(r, 1.0) << "case " << i << ": " << describe(c.p);
    worst = std::max(worst, r);
    rows += R.rows_computed;
  }
  std::printf("plain fp32 reference: max error/bound ratio %.4g over 10000 cases (%lld rows)\n", worst,
              (long long)rows);
  RecordProperty("max_ratio", std::to_string(worst));
}

struct Variant {
  const char* name;
  ModelOptions mo;
};
std::vector<Variant> variants() {
  std::vector<Variant> v;
  ModelOptions m;
  m.tile = 1, v.push_back({"online-row expf", m});
  m.tile = 16, v.push_back({"tiled-16 expf", m});
  m.tile = 64, m.exp = ExpKind::kExp2, v.push_back({"tiled-64 exp2", m});
  m.tile = 32, m.exp = ExpKind::kApprox, m.approx_ulps = 4, v.push_back({"tiled-32 exp2 approx 4ulp", m});
  m.tile = 1, m.reverse_tiles = true, v.push_back({"online-row reversed approx", m});
  m.tile = 8, m.splits = 3, m.reverse_tiles = false, v.push_back({"split-kv 3 x tiled-8 approx", m});
  m.tile = 1000, m.splits = 1, m.exp = ExpKind::kExpf, v.push_back({"materialized expf", m});
  return v;
}

TEST(OracleBound, CorrectKernelModelsNeverExceedBoundIncludingExtremeLogits) {
  for (const Variant& var : variants()) {
    Rng rng(202);
    double worst = 0, worst_extreme = 0;
    for (int i = 0; i < 1200; ++i) {
      const double max_logit = i % 3 == 0 ? 1e5 : 1e4;
      RandomCase c = testing::random_case(rng, 40, 24, max_logit);
      OracleOptions o = k1Thread;
      o.baseline = false;
      const OracleResult R = compute_oracle(c.p, c.q.data(), c.k.data(), c.v.data(), o);
      ModelOptions mo = var.mo;
      mo.seed = i;
      const testing::ModelOut out = testing::run_model(c.p, c.q.data(), c.k.data(), c.v.data(), mo);
      const double r = max_ratio(R, out.o.data(), out.lse.data());
      ASSERT_LE(r, 1.0) << var.name << " case " << i << ": " << describe(c.p);
      worst = std::max(worst, r);
      if (i % 3 == 0) worst_extreme = std::max(worst_extreme, r);
    }
    std::printf("%-30s max ratio %.4g (logits up to 1e5: %.4g)\n", var.name, worst, worst_extreme);
  }
}

TEST(OracleBound, ExtremeLogitsOfOneKernelCase) {
  // |s| around 1e4 .. 1e7 with D = 64, a long row: no false positive, and the bound stays finite.
  Rng rng(303);
  for (double sig : {1e2, 1e3, 3e3}) {
    Problem p = make_problem(1, 1, 1, 8, 300, 64, 64);
    RandomCase c;
    c.p = p;
    c.q.resize(q_elements(p)), c.k.resize(k_elements(p)), c.v.resize(v_elements(p));
    for (auto& x : c.q) x = static_cast<float>(sig * rng.normal());
    for (auto& x : c.k) x = static_cast<float>(sig * rng.normal());
    for (auto& x : c.v) x = static_cast<float>(rng.normal());
    const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
    for (const Variant& var : variants()) {
      const testing::ModelOut out = testing::run_model(p, c.q.data(), c.k.data(), c.v.data(), var.mo);
      EXPECT_LE(max_ratio(R, out.o.data(), out.lse.data()), 1.0) << var.name << " sigma " << sig;
    }
    for (double b : R.o_bound) EXPECT_TRUE(std::isfinite(b));
  }
}

TEST(OracleBound, MissingAccumulatorRescaleIsFarBeyondTheBound) {
  // The max key comes late (scores rise with j), so a kernel that forgets to rescale acc is wrong by O(1).
  Rng rng(404);
  double least = INFINITY;
  for (int i = 0; i < 50; ++i) {
    Problem p = make_problem(1, 2, 1, 4, 64 + i, 32, 32);
    RandomCase c;
    c.p = p;
    c.q.resize(q_elements(p)), c.k.resize(k_elements(p)), c.v.resize(v_elements(p));
    for (auto& x : c.q) x = static_cast<float>(rng.normal());
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t d = 0; d < 32; ++d)
        c.k[k_index(p, 0, j, 0, d)] = static_cast<float>(0.5 * rng.normal() + 0.08 * j * (d < 16 ? 1 : -1));
    for (auto& x : c.v) x = static_cast<float>(rng.normal());
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 32; ++d) c.q[q_index(p, 0, s, h, d)] = d < 16 ? 1.0f : -1.0f;
    const OracleResult R = compute_oracle(p, c.q.data(), c.k.data(), c.v.data(), k1Thread);
    ModelOptions bug;
    bug.tile = 16;
    bug.missing_rescale = true;
    const testing::ModelOut out = testing::run_model(p, c.q.data(), c.k.data(), c.v.data(), bug);
    least = std::min(least, max_ratio(R, out.o.data(), out.lse.data()));
  }
  std::printf("missing rescale: smallest max ratio over 50 cases %.4g\n", least);
  EXPECT_GT(least, 1e3);
}

}  // namespace
}  // namespace attnfuzz
