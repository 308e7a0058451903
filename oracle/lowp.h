// lowp.h - fp16 / bf16 / fp8 (e4m3, e5m2) rounding and bit conversions (round to nearest even, subnormals).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attnfuzz/abi.h"

namespace attnfuzz {

inline bool is_fp8(int32_t dtype) { return dtype == AF_DTYPE_FP8_E4M3 || dtype == AF_DTYPE_FP8_E5M2; }
// Bytes of one stored element: 4 (f32), 2 (f16, bf16), 1 (fp8).
inline int dtype_bytes(int32_t dtype) {
  return dtype == AF_DTYPE_F16 || dtype == AF_DTYPE_BF16 ? 2 : is_fp8(dtype) ? 1 : 4;
}
// Significand bits (with the implicit one) and the exponent of the subnormal quantum of each format.
inline int dtype_precision(int32_t dtype) {
  switch (dtype) {
    case AF_DTYPE_F16: return 11;
    case AF_DTYPE_BF16: return 8;
    case AF_DTYPE_FP8_E4M3: return 4;
    case AF_DTYPE_FP8_E5M2: return 3;
    default: return 24;
  }
}
inline int dtype_quantum_exp(int32_t dtype) {
  switch (dtype) {
    case AF_DTYPE_F16: return -24;
    case AF_DTYPE_BF16: return -133;
    case AF_DTYPE_FP8_E4M3: return -9;
    case AF_DTYPE_FP8_E5M2: return -16;
    default: return -149;
  }
}
// Unit roundoff of a compute dtype: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16), 2^-4 (e4m3), 2^-3 (e5m2).
inline double unit_roundoff(int32_t dtype) { return std::ldexp(1.0, -dtype_precision(dtype)); }
// Half the smallest subnormal: the largest absolute error of rounding a tiny value (f32 2^-150,
// f16 2^-25, bf16 2^-134, e4m3 2^-10, e5m2 2^-17).
inline double underflow_error(int32_t dtype) { return std::ldexp(1.0, dtype_quantum_exp(dtype) - 1); }
// Smallest positive normal value (f16 2^-14, bf16 2^-126, e4m3 2^-6, e5m2 2^-14).
inline double dtype_min_normal(int32_t dtype) {
  return std::ldexp(1.0, dtype_quantum_exp(dtype) + dtype_precision(dtype) - 1);
}
// Largest finite value: FLT_MAX, 65504, bf16 max, 448 (e4m3: S.1111.110), 57344 (e5m2).
inline double dtype_max(int32_t dtype) {
  return dtype == AF_DTYPE_F16         ? 65504.0
         : dtype == AF_DTYPE_BF16      ? 0x1.fep127
         : dtype == AF_DTYPE_FP8_E4M3  ? 448.0
         : dtype == AF_DTYPE_FP8_E5M2  ? 57344.0
                                       : static_cast<double>(std::numeric_limits<float>::max());
}

// x rounded to the nearest value of dtype (ties to even), with gradual underflow and overflow to
// +-inf (also for e4m3, which stores no Inf: see to_stored). NaN and +-inf pass through. Exact, on the bits: x's
// 53-bit significand is cut to a multiple of the quantum 2^q of x's binade in dtype (q = max(e - p, qmin), e the
// exponent frexp gives) with round to nearest even, and scaled back by a power of two (the frexp / ldexp /
// nearbyint formulation gives the same bits, lowp_test checks it; this one is ~10x faster and the low-precision
// oracle, its bounds and the fp16 baseline call it per element).
inline double round_to_dtype(double x, int32_t dtype) {
  if (!std::isfinite(x) || x == 0) return x;
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint64_t sign = bits & (uint64_t{1} << 63);
  const int biased = static_cast<int>((bits >> 52) & 0x7ff);
  if (biased == 0) return sign ? -0.0 : 0.0;  // a subnormal double is far below half of any dtype's quantum
  const uint64_t sig = (bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);  // x = sig 2^(e - 53)
  const int e = biased - 1022;                                                       // frexp's exponent
  const int q = std::max(e - dtype_precision(dtype), dtype_quantum_exp(dtype));
  const int drop = q - (e - 53);  // low bits of sig below the quantum
  if (drop <= 0) return x;
  uint64_t r = 0;
  if (drop <= 53) {
    const uint64_t rem = sig & ((uint64_t{1} << drop) - 1), half = uint64_t{1} << (drop - 1);
    r = (sig >> drop) + (rem > half || (rem == half && ((sig >> drop) & 1)) ? 1 : 0);
  }
  if (r == 0) return sign ? -0.0 : 0.0;
  // r 2^q: q is at least -149, so 2^q is a normal double, and r < 2^54 is exact.
  const uint64_t pow_bits = static_cast<uint64_t>(q + 1023) << 52;
  double scale;
  std::memcpy(&scale, &pow_bits, sizeof scale);
  const double a = static_cast<double>(r) * scale;
  if (a > dtype_max(dtype)) return sign ? -std::numeric_limits<double>::infinity()
                                        : std::numeric_limits<double>::infinity();
  return sign ? -a : a;
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

// fp8 bits -> float (exact). e4m3 (OCP e4m3fn): bias 7, no Inf, NaN = S.1111.111. e5m2: bias 15, IEEE-like.
inline float fp8_bits_to_float(uint8_t b, int32_t dtype) {
  const bool e4 = dtype == AF_DTYPE_FP8_E4M3;
  const int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15, emax = e4 ? 15 : 31;
  const int sign = b >> 7, exp = (b >> mbits) & emax, man = b & ((1 << mbits) - 1);
  float v;
  if (e4 && exp == 15 && man == 7)
    v = std::numeric_limits<float>::quiet_NaN();
  else if (!e4 && exp == 31)
    v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (exp == 0)
    v = std::ldexp(static_cast<float>(man), 1 - bias - mbits);
  else
    v = std::ldexp(static_cast<float>(man | (1 << mbits)), exp - bias - mbits);
  return sign ? -v : v;
}
// float -> fp8 bits (round to nearest even). NaN -> 0x7f (e4m3) / 0x7e (e5m2); overflow -> NaN (e4m3, the
// non-saturating conversion) / Inf (e5m2).
inline uint8_t float_to_fp8_bits(float x, int32_t dtype) {
  const bool e4 = dtype == AF_DTYPE_FP8_E4M3;
  if (std::isnan(x)) return e4 ? 0x7f : 0x7e;
  const double r = round_to_dtype(static_cast<double>(x), dtype);
  const uint8_t sign = std::signbit(r) ? 0x80 : 0;
  const double a = std::fabs(r);
  if (std::isinf(a)) return sign | (e4 ? 0x7f : 0x7c);
  const int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15;
  if (a < dtype_min_normal(dtype))  // subnormal or zero
    return sign | static_cast<uint8_t>(std::ldexp(a, -dtype_quantum_exp(dtype)));
  int e = 0;
  const double f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  return sign | static_cast<uint8_t>((e - 1 + bias) << mbits) |
         static_cast<uint8_t>(std::ldexp(f, mbits + 1) - (1 << mbits));
}

// The value an input element of dtype holds when the tool meant x (generation): NaN stays NaN, x is rounded
// to dtype; a value beyond the format's range becomes +-inf, or +-max under `saturate` (the finite value
// domain) and always in e4m3, which has no Inf (an "inf" special in e4m3 is +-448, what a saturating
// conversion stores). f32: x itself.
inline float to_stored(float x, int32_t dtype, bool saturate) {
  if (dtype == AF_DTYPE_F32 || std::isnan(x)) return x;
  const double r = round_to_dtype(static_cast<double>(x), dtype);
  if (std::isinf(r) && (saturate || dtype == AF_DTYPE_FP8_E4M3))
    return static_cast<float>(std::copysign(dtype_max(dtype), r));
  return static_cast<float>(r);
}

// Encodes n floats (each a value of dtype, or NaN) into n stored elements of dtype_bytes(dtype) each;
// f32 copies the bits (NaN payloads kept). NaN payloads of the narrow formats are not kept (a NaN encodes
// as the format's canonical quiet NaN).
inline void encode_elements(const float* in, size_t n, int32_t dtype, void* out) {
  auto* o = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == AF_DTYPE_F32) {
      std::memcpy(o + 4 * i, &in[i], 4);
    } else if (dtype == AF_DTYPE_F16 || dtype == AF_DTYPE_BF16) {
      const uint16_t h = dtype == AF_DTYPE_F16 ? float_to_f16_bits(in[i]) : float_to_bf16_bits(in[i]);
      std::memcpy(o + 2 * i, &h, 2);
    } else {
      o[i] = float_to_fp8_bits(in[i], dtype);
    }
  }
}
// Decodes n stored elements of dtype into floats (exact).
inline void decode_elements(const void* in, size_t n, int32_t dtype, float* out) {
  const auto* b = static_cast<const unsigned char*>(in);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == AF_DTYPE_F32) {
      std::memcpy(&out[i], b + 4 * i, 4);
    } else if (dtype == AF_DTYPE_F16 || dtype == AF_DTYPE_BF16) {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      out[i] = dtype == AF_DTYPE_F16 ? f16_bits_to_float(h) : bf16_bits_to_float(h);
    } else {
      out[i] = fp8_bits_to_float(b[i], dtype);
    }
  }
}

}  // namespace attnfuzz
