// philox.h - Philox 4x32-R (Random123) and FlashAttention's dropout keep decision: the one implementation, host and device.
//
// Header-only so that the tool (core/dropout.cpp), the built-in kernels and the planted kernels (each compiled for
// the emulator, CUDA and HIP) draw from the same code. Everything is in an anonymous namespace (kernels/common.h:
// the three builds of a kernel file coexist in one binary).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define AF_PHILOX_HD __host__ __device__
#else
#define AF_PHILOX_HD
#endif

namespace attnfuzz {
namespace {

struct PhiloxOut {
  uint32_t v[4];
};

// Philox 4x32 with R rounds (Salmon et al., SC'11; Random123's philox4x32_R): round r maps the counter c with the
// key k to (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)), and the key is bumped by the Weyl
// constants between rounds. R = 10 is Random123's default (tests/core/philox_test.cpp: its known-answer vectors);
// FlashAttention's philox() is R = 7 (six rounds with a bump, then one more).
AF_PHILOX_HD inline PhiloxOut philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                         uint32_t k1, int rounds) {
  const uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) k0 += kW0, k1 += kW1;
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0, p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
  }
  return PhiloxOut{{c0, c1, c2, c3}};
}

// FlashAttention's philox(seed, subsequence, offset): key = seed (low word first), counter = (offset, subsequence)
// as two little-endian 64-bit halves, 7 rounds.
AF_PHILOX_HD inline PhiloxOut flash_philox(uint64_t seed, uint64_t subsequence, uint64_t offset) {
  return philox4x32(static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32),
                    static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32),
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), 7);
}

// FlashAttention's 8-bit keep threshold: floor((1 - p) * 255) with 1 - p in fp32; a weight is kept when its random
// byte is <= the threshold, so the keep probability is (threshold + 1) / 256 (docs/semantics.md "Dropout").
AF_PHILOX_HD inline uint32_t flash_keep_threshold(float p) {
  const double keep = static_cast<double>(1.0f - p) * 255.0;
  return static_cast<uint32_t>(keep);  // keep >= 0: truncation is floor
}

// Where FlashAttention 2 (flash_attn/src/dropout.h, SM80 m16n8k16 accumulators) draws the keep decision of weight
// (i, j) of query head h in batch b (Hq heads): one philox() per 16 x 32 tile of (lane, tile) with
//   subsequence = (i / 16) | (j / 32) << 32,  offset = dropout_offset + (b Hq + h) 32 + lane,
//   lane = 4 (i % 8) + (j % 8) / 2,  byte = 8 ((j % 32) / 16) + 4 ((j % 16) / 8) + 2 ((i % 16) / 8) + j % 2
// of the 16 output bytes (x, y, z, w little-endian). The function of (seed, offset, b, h, i, j) only.
struct FlashDraw {
  uint64_t subsequence, offset;
  int byte;
};
AF_PHILOX_HD inline FlashDraw flash_dropout_draw(uint64_t offset, int64_t b, int64_t h, int64_t heads_q, int64_t i,
                                                 int64_t j) {
  const uint64_t lane = static_cast<uint64_t>(4 * (i % 8) + (j % 8) / 2);
  FlashDraw d;
  d.subsequence = static_cast<uint64_t>(i / 16) | (static_cast<uint64_t>(j / 32) << 32);
  d.offset = offset + static_cast<uint64_t>(b * heads_q + h) * 32u + lane;
  d.byte = static_cast<int>(8 * ((j % 32) / 16) + 4 * ((j % 16) / 8) + 2 * ((i % 16) / 8) + j % 2);
  return d;
}
AF_PHILOX_HD inline uint32_t philox_byte(const PhiloxOut& o, int byte) {
  return (o.v[byte / 4] >> (8 * (byte % 4))) & 0xffu;
}
// The keep decision (1 kept, 0 dropped) of weight (b, h, i, j) under AF_DROPOUT_RNG_PHILOX_FLASH.
AF_PHILOX_HD inline int flash_dropout_keep(uint64_t seed, uint64_t offset, float p, int64_t b, int64_t h,
                                           int64_t heads_q, int64_t i, int64_t j) {
  const FlashDraw d = flash_dropout_draw(offset, b, h, heads_q, i, j);
  return philox_byte(flash_philox(seed, d.subsequence, d.offset), d.byte) <= flash_keep_threshold(p) ? 1 : 0;
}

}  // namespace
}  // namespace attnfuzz
