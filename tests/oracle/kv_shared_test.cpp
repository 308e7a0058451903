// kv_shared_test.cpp - MLA geometry (issue 28 item 5): the oracle reading V as the first Dv columns of K's
// rows.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "oracle/grad.h"
#include "oracle/oracle.h"
#include "tests/oracle/oracle_options.h"

namespace attnfuzz {
namespace {

using test_util::k1Thread;

// V given as a view into K (v_stride = k_stride, the K pointer passed as V) gives the same O, LSE and bounds as
// the same V copied out into its own contiguous buffer: the forward needs no KV_SHARED branch, only the strides.
// B = 2, Hq = 8 per Hk = 2 (GQA 4:1), decode-like Sq = 3, Sk = 37, D = 40 > Dv = 32; q, k, dout normal.
struct Shared {
  static constexpr int64_t B = 2, Hq = 8, Hk = 2, Sq = 3, Sk = 37, D = 40, Dv = 32;
  Problem copied = make_problem(B, Hq, Hk, Sq, Sk, D, Dv);
  Problem shared = copied;
  std::vector<float> q, k, v, dout;
  Shared();
};

Shared::Shared() : q(B * Sq * Hq * D), k(B * Sk * Hk * D), v(B * Sk * Hk * Dv), dout(B * Sq * Hq * Dv) {
  for (int i = 0; i < 3; ++i) shared.v_stride[i] = shared.k_stride[i];  // dv_stride stays V's own layout
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::vector<float>* t : {&q, &k, &dout})
    for (float& x : *t) x = nd(rng);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Sk; ++j)
      for (int64_t h = 0; h < Hk; ++h)
        for (int64_t d = 0; d < Dv; ++d)
          v[b * copied.v_stride[0] + j * copied.v_stride[1] + h * copied.v_stride[2] + d] =
              k[b * copied.k_stride[0] + j * copied.k_stride[1] + h * copied.k_stride[2] + d];
}

TEST(OracleKvShared, VAsAViewOfKEqualsVCopiedOut) {
  const Shared t;
  const Problem &copied = t.copied, &shared = t.shared;
  const std::vector<float>&q = t.q, &k = t.k, &v = t.v;
  const OracleResult a = compute_oracle(copied, q.data(), k.data(), v.data(), k1Thread);
  const OracleResult s = compute_oracle(shared, q.data(), k.data(), k.data(), k1Thread);
  ASSERT_EQ(a.o.size(), s.o.size());
  for (size_t i = 0; i < a.o.size(); ++i) {
    EXPECT_EQ(a.o[i], s.o[i]) << i;
    EXPECT_EQ(a.o_bound[i], s.o_bound[i]) << i;
  }
  for (size_t i = 0; i < a.lse.size(); ++i) EXPECT_EQ(a.lse[i], s.lse[i]) << i;
}

// The gradient oracle through the same strides: dQ, dK and dV (each in its own layout) equal the copied-out case's.
// The shared buffer's gradient, dK[:, :Dv] + dV (docs/semantics.md), is folded from these by the planned branch.
TEST(OracleKvShared, GradientsThroughTheViewEqualVCopiedOut) {
  const Shared t;
  const OracleResult f = compute_oracle(t.copied, t.q.data(), t.k.data(), t.v.data(), k1Thread);
  const std::vector<float> o(f.o.begin(), f.o.end()), lse(f.lse.begin(), f.lse.end());
  const GradResult a = compute_grad_oracle(t.copied, t.q.data(), t.k.data(), t.v.data(), t.dout.data(), o.data(),
                                           lse.data(), GradOptions{});
  const GradResult s = compute_grad_oracle(t.shared, t.q.data(), t.k.data(), t.k.data(), t.dout.data(), o.data(),
                                           lse.data(), GradOptions{});
  EXPECT_EQ(a.dq, s.dq);
  EXPECT_EQ(a.dk, s.dk);
  EXPECT_EQ(a.dv, s.dv);
  EXPECT_EQ(a.dv_bound, s.dv_bound);
}

// The kv-shared branch (AF_VARIANT_KV_SHARED): V is read through K's pointer whatever the caller passes as v,
// so a v of NaNs changes nothing; the result is the copied-out case's bit for bit. The gradient oracle
// refuses the variant (forward only, docs/semantics.md "Shared K/V latent").
TEST(OracleKvShared, TheVariantReadsVThroughKsPointer) {
  const Shared t;
  Problem variant = t.shared;
  share_kv(variant);
  const std::vector<float> nans(t.k.size(), std::numeric_limits<float>::quiet_NaN());
  const OracleResult a = compute_oracle(t.copied, t.q.data(), t.k.data(), t.v.data(), k1Thread);
  const OracleResult s = compute_oracle(variant, t.q.data(), t.k.data(), nans.data(), k1Thread);
  ASSERT_EQ(a.o.size(), s.o.size());
  for (size_t i = 0; i < a.o.size(); ++i) ASSERT_EQ(a.o[i], s.o[i]) << i;
  for (size_t i = 0; i < a.lse.size(); ++i) ASSERT_EQ(a.lse[i], s.lse[i]) << i;
  const std::vector<float> o(a.o.begin(), a.o.end()), lse(a.lse.begin(), a.lse.end());
  EXPECT_THROW(compute_grad_oracle(variant, t.q.data(), t.k.data(), t.k.data(), t.dout.data(), o.data(),
                                   lse.data(), GradOptions{}),
               std::invalid_argument);
}

}  // namespace
}  // namespace attnfuzz
