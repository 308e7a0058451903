// lowp.h - fp16 / bf16 rounding and bit conversions (round to nearest even, subnormals, overflow to inf).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attnfuzz/abi.h"

namespace attnfuzz {

// Unit roundoff of a compute dtype: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16).
inline double unit_roundoff(int32_t dtype) {
  return dtype == AF_DTYPE_F16 ? 0x1p-11 : dtype == AF_DTYPE_BF16 ? 0x1p-8 : 0x1p-24;
}
// Half the smallest subnormal: the largest absolute error of rounding a tiny value (f32 2^-150,
// f16 2^-25, bf16 2^-134).
inline double underflow_error(int32_t dtype) {
  return dtype == AF_DTYPE_F16 ? 0x1p-25 : dtype == AF_DTYPE_BF16 ? 0x1p-134 : 0x1p-150;
}
// Largest finite value: FLT_MAX, 65504, bf16 max.
inline double dtype_max(int32_t dtype) {
  return dtype == AF_DTYPE_F16    ? 65504.0
         : dtype == AF_DTYPE_BF16 ? 0x1.fep127
                                  : static_cast<double>(std::numeric_limits<float>::max());
}

// x rounded to the nearest value of dtype (ties to even), with gradual underflow and overflow to
// +-inf. NaN and +-inf pass through. Exact: every step is a power-of-two scaling or nearbyint.
inline double round_to_dtype(double x, int32_t dtype) {
  if (!std::isfinite(x) || x == 0) return x;
  const int p = dtype == AF_DTYPE_F16 ? 11 : dtype == AF_DTYPE_BF16 ? 8 : 24;           // significand bits
  const int qmin = dtype == AF_DTYPE_F16 ? -24 : dtype == AF_DTYPE_BF16 ? -133 : -149;  // subnormal quantum
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int q = std::max(e - p, qmin);
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);
  if (std::fabs(r) > dtype_max(dtype)) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}
inline float round_to_dtype(float x, int32_t dtype) {
  return static_cast<float>(round_to_dtype(static_cast<double>(x), dtype));
}
inline bool representable(float x, int32_t dtype) {
  return std::isnan(x) || round_to_dtype(static_cast<double>(x), dtype) == static_cast<double>(x);
}

// IEEE binary16 bits -> float (exact).
inline float f16_bits_to_float(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0x1f)
    v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -24);
  else
    v = std::ldexp(static_cast<float>(man | 0x400), exp - 25);
  return sign ? -v : v;
}
// float -> IEEE binary16 bits (round to nearest even; NaN stays a quiet NaN).
inline uint16_t float_to_f16_bits(float x) {
  if (std::isnan(x)) return 0x7e00;
  const double r = round_to_dtype(static_cast<double>(x), AF_DTYPE_F16);
  const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < 0x1p-14) return sign | static_cast<uint16_t>(std::ldexp(a, 24));  // subnormal or zero
  int e = 0;
  const double f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  return sign | static_cast<uint16_t>((e + 14) << 10) | static_cast<uint16_t>(std::ldexp(f, 11) - 1024);
}
// bfloat16 bits -> float (exact): the high half of an fp32.
inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// float -> bfloat16 bits (round to nearest even; NaN stays a quiet NaN).
inline uint16_t float_to_bf16_bits(float x) {
  if (std::isnan(x)) return 0x7fc0;
  const float r = round_to_dtype(x, AF_DTYPE_BF16);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace attnfuzz
