// lowp_types.h - fp8 (e4m3, e5m2) element types for kernels on every backend, and the minifloat conversions
// the CPU emulator's software __half / __hip_bfloat16 use (hip_cpu.h).
//
// No backend has an fp8 header on all three builds (CUDA's cuda_fp8.h, ROCm's hip_fp8.h differ in names and
// formats), so kernels use af_fp8_e4m3 / af_fp8_e5m2: one byte, OCP formats (e4m3fn: bias 7, no Inf, NaN =
// S.1111.111, max 448; e5m2: bias 15, IEEE-like, max 57344), converted by the functions below (round to
// nearest even; float -> fp8 saturates to +-max like cvt.rn.satfinite; NaN -> 0x7f). Include after the
// backend's HIP header (attnfuzz/hip.h does), which defines __host__ / __device__.
#pragma once

#include <stdint.h>
#include <string.h>

struct af_fp8_e4m3 {
  uint8_t bits;
};
struct af_fp8_e5m2 {
  uint8_t bits;
};

// float bits <-> float without aliasing (device code too).
__host__ __device__ inline uint32_t af_float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
__host__ __device__ inline float af_bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// A binary minifloat with `mbits` mantissa bits and exponent bias `bias`: decode its bits (exact in fp32).
// ieee_top: the top exponent (all ones) holds Inf / NaN (f16, e5m2); else only S.1..1.1..1 is NaN (e4m3).
__host__ __device__ inline float af_minifloat_to_float(uint32_t h, int ebits, int mbits, bool ieee_top) {
  const uint32_t sign = (h >> (ebits + mbits)) & 1u, emax = (1u << ebits) - 1, mmask = (1u << mbits) - 1;
  const uint32_t e = (h >> mbits) & emax, m = h & mmask;
  const int bias = (1 << (ebits - 1)) - 1;
  uint32_t out;
  if (e == emax && (ieee_top || m == mmask)) {
    out = (ieee_top && m == 0) ? 0x7f800000u : 0x7fc00000u;
  } else if (e == 0) {
    // m * 2^(1 - bias - mbits): exact (m < 2^mbits, the power of two is a normal float)
    const float v = (float)m * af_bits_float((uint32_t)(127 + 1 - bias - mbits) << 23);
    out = af_float_bits(v);
  } else {
    out = ((e - bias + 127) << 23) | (m << (23 - mbits));
  }
  return af_bits_float(out | sign << 31);
}

// float -> minifloat bits, round to nearest even. Overflow: +-Inf when ieee_top and !saturate, else +-max.
// NaN: the format's quiet NaN (all exponent and mantissa bits set).
__host__ __device__ inline uint32_t af_float_to_minifloat(float f, int ebits, int mbits, bool ieee_top,
                                                          bool saturate) {
  const uint32_t u = af_float_bits(f), sign = (u >> 31) << (ebits + mbits);
  const uint32_t emax = (1u << ebits) - 1, mmask = (1u << mbits) - 1;
  const int bias = (1 << (ebits - 1)) - 1;
  const uint32_t nan_bits = (emax << mbits) | mmask;
  if ((u & 0x7fffffffu) > 0x7f800000u) return nan_bits;
  // Largest finite: exponent emax - 1 with all mantissa bits (ieee_top), or emax with mantissa mmask - 1.
  const uint32_t max_bits = ieee_top ? (((emax - 1) << mbits) | mmask) : ((emax << mbits) | (mmask - 1));
  const float a = af_bits_float(u & 0x7fffffffu);
  const float maxv = af_minifloat_to_float(max_bits, ebits, mbits, ieee_top);
  const int min_exp = 1 - bias;  // exponent of the smallest normal
  int e = (int)((af_float_bits(a) >> 23) & 0xff) - 127;
  if (e < min_exp) e = min_exp;  // subnormal range: the quantum is 2^(min_exp - mbits)
  const int qe = e - mbits;
  if (qe < -126) return sign;  // far below the format's subnormals (never for f16 / bf16 / fp8 inputs)
  const float q = af_bits_float((uint32_t)(qe + 127) << 23);
  const float r = rintf(a / q) * q;  // a / q exact (power of two); rintf rounds half to even
  if (r > maxv || af_float_bits(a) == 0x7f800000u) {
    if (ieee_top && !saturate) return sign | (emax << mbits);
    return sign | max_bits;
  }
  int re = (int)((af_float_bits(r) >> 23) & 0xff) - 127;
  if (r == 0.0f) return sign;
  if (re < min_exp) {  // subnormal: r / quantum
    const float quantum = af_bits_float((uint32_t)(min_exp - mbits + 127) << 23);
    return sign | (uint32_t)(r / quantum);
  }
  const uint32_t m = (af_float_bits(r) >> (23 - mbits)) & mmask;
  return sign | ((uint32_t)(re + bias) << mbits) | m;
}

__host__ __device__ inline float af_fp8_to_float(af_fp8_e4m3 x) { return af_minifloat_to_float(x.bits, 4, 3, false); }
__host__ __device__ inline float af_fp8_to_float(af_fp8_e5m2 x) { return af_minifloat_to_float(x.bits, 5, 2, true); }
__host__ __device__ inline af_fp8_e4m3 af_float_to_e4m3(float f) {
  return af_fp8_e4m3{(uint8_t)af_float_to_minifloat(f, 4, 3, false, true)};
}
__host__ __device__ inline af_fp8_e5m2 af_float_to_e5m2(float f) {
  return af_fp8_e5m2{(uint8_t)af_float_to_minifloat(f, 5, 2, true, true)};
}
