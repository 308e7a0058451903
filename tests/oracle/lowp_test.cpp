// lowp_test.cpp - oracle/lowp.h's round_to_dtype (the bit formulation) against the frexp / ldexp / nearbyint one,
// bit for bit, in every dtype: random doubles over the exponents each format reaches, exact ties, the overflow and
// underflow edges, subnormal doubles.
#include "oracle/lowp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace attnfuzz {
namespace {

// The formulation round_to_dtype had until 2026-12 (each step exact: a power-of-two scaling or nearbyint).
double round_by_scaling(double x, int32_t dtype) {
  if (!std::isfinite(x) || x == 0) return x;
  int e = 0;
  std::frexp(x, &e);
  const int q = std::max(e - dtype_precision(dtype), dtype_quantum_exp(dtype));
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);
  if (std::fabs(r) > dtype_max(dtype)) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

constexpr int32_t kDtypes[] = {AF_DTYPE_F32, AF_DTYPE_F16, AF_DTYPE_BF16, AF_DTYPE_FP8_E4M3, AF_DTYPE_FP8_E5M2};

TEST(Lowp, BitRoundingEqualsTheScalingFormulationEverywhere) {
  std::mt19937_64 rng(20261207);
  int64_t n = 0;
  auto same = [&](double x, int32_t dt) {
    ++n;
    ASSERT_EQ(bits(round_to_dtype(x, dt)), bits(round_by_scaling(x, dt))) << x << " dtype " << dt;
  };
  for (int32_t dt : kDtypes) {
    for (int i = 0; i < 400000; ++i) {  // random significands over exponents -160 .. 140 and the double extremes
      const int e = i % 5 == 0 ? static_cast<int>(rng() % 2040) - 1022 : static_cast<int>(rng() % 300) - 160;
      const double x = std::ldexp(std::uniform_real_distribution<double>(0.5, 1.0)(rng), e);
      same(rng() & 1 ? -x : x, dt);
    }
    // Exact ties and their neighbours: a value of the format plus half its quantum, one double ulp either side.
    for (int i = 0; i < 100000; ++i) {
      const int e = static_cast<int>(rng() % 200) - 150;
      const double v = round_by_scaling(std::ldexp(std::uniform_real_distribution<double>(0.5, 1.0)(rng), e), dt);
      if (!std::isfinite(v) || v == 0) continue;
      int ve = 0;
      std::frexp(v, &ve);
      const double half = std::ldexp(1.0, std::max(ve - dtype_precision(dt), dtype_quantum_exp(dt)) - 1);
      for (double x : {v + half, v - half, std::nextafter(v + half, 0.0), std::nextafter(v + half, 1e300)}) {
        same(x, dt);
        same(-x, dt);
      }
    }
    for (double x : {dtype_max(dt), std::nextafter(dtype_max(dt), 1e300), dtype_max(dt) * (1 + 0x1p-20),
                     dtype_min_normal(dt), underflow_error(dt), std::nextafter(underflow_error(dt), 0.0),
                     std::nextafter(underflow_error(dt), 1.0), 0x1p-1074, 0x1p-1030, 1e308, 0.0, -0.0,
                     std::numeric_limits<double>::infinity(), std::numeric_limits<double>::max()}) {
      same(x, dt);
      same(-x, dt);
    }
    const double nan = round_to_dtype(std::numeric_limits<double>::quiet_NaN(), dt);
    EXPECT_TRUE(std::isnan(nan));
  }
  EXPECT_GT(n, 2500000);
}

}  // namespace
}  // namespace attnfuzz
