// dtype_codec.h - q/k/v/o as the device stores them in the case's dtype: encoding, decoding, per-format poisons.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace attnfuzz {

// The 32-bit fill word that poisons buffers of elements of `dtype`, for one of the fp32 poison words of
// guarded.h / runner.h (f32: the word itself). Each narrow format repeats one element of its own:
//   word               f16      bf16     fp8-e4m3        fp8-e5m2
//   kGuardPoison       0x7e5a   0x7fa5   0x7f (NaN)      0x7d (NaN, payload 01)
//   kGuardPoisonAlt    0x3ceb   0x3f9d   0x3b (1.375)    0x3d (1.25)        finite, ~1.23
//   kOutputPoison      0x7fbe   0x7fbe   0xff (-NaN)     0xfd (-NaN, payload 01)
//   kOutputPoisonAlt   0xe68d   0xc4d1   0xd5 (-13)      0xd5 (-80)         finite, distinct from the above
// e4m3 has one NaN per sign (S.1111.111), so its guard and output poisons are the two signs of NaN and its
// second poisons are finite. Any other word: its low element, repeated.
uint32_t format_poison(int32_t dtype, uint32_t f32_word);

// The device bytes of q, k or v: every float (a value of dtype, or NaN) encoded as one element.
std::vector<unsigned char> encode_tensor(const std::vector<float>& values, int32_t dtype);

// Decodes n stored O elements into floats, as the oracle sees O: the stored value (fp8: divided by
// o_scale, a power of two, so exact). An element that holds format_poison(dtype, poison) is returned as
// the fp32 word `poison` itself, so the unwritten detector and the poison counters see the same bits on
// every dtype.
void decode_output(const unsigned char* bytes, size_t n, int32_t dtype, float o_scale, uint32_t poison,
                   float* out);

}  // namespace attnfuzz
