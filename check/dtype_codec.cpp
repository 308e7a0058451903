// dtype_codec.cpp - encode / decode of stored elements and the per-format poison words.
#include "check/dtype_codec.h"

#include <cstring>

#include "check/guarded.h"
#include "check/runner.h"
#include "oracle/lowp.h"

namespace attnfuzz {

uint32_t format_poison(int32_t dtype, uint32_t w) {
  if (dtype == AF_DTYPE_F32) return w;
  const int which = w == kGuardPoison ? 0 : w == kGuardPoisonAlt ? 1 : w == kOutputPoison ? 2 : w == kOutputPoisonAlt ? 3 : -1;
  uint32_t e = 0;
  switch (dtype) {
    case AF_DTYPE_F16: {
      static const uint16_t t[] = {0x7e5a, 0x3ceb, 0x7fbe, 0xe68d};
      e = which < 0 ? (w & 0xffff) : t[which];
      return e | e << 16;
    }
    case AF_DTYPE_BF16: {
      static const uint16_t t[] = {0x7fa5, 0x3f9d, 0x7fbe, 0xc4d1};
      e = which < 0 ? (w & 0xffff) : t[which];
      return e | e << 16;
    }
    case AF_DTYPE_FP8_E4M3: {
      static const uint8_t t[] = {0x7f, 0x3b, 0xff, 0xd5};
      e = which < 0 ? (w & 0xff) : t[which];
      break;
    }
    default: {
      static const uint8_t t[] = {0x7d, 0x3d, 0xfd, 0xd5};
      e = which < 0 ? (w & 0xff) : t[which];
      break;
    }
  }
  return e * 0x01010101u;
}

std::vector<unsigned char> encode_tensor(const std::vector<float>& values, int32_t dtype) {
  std::vector<unsigned char> out(values.size() * static_cast<size_t>(dtype_bytes(dtype)));
  encode_elements(values.data(), values.size(), dtype, out.data());
  return out;
}

void decode_output(const unsigned char* bytes, size_t n, int32_t dtype, float o_scale, uint32_t poison,
                   float* out) {
  decode_elements(bytes, n, dtype, out);
  if (dtype == AF_DTYPE_F32) return;
  const size_t eb = static_cast<size_t>(dtype_bytes(dtype));
  const uint32_t fw = format_poison(dtype, poison);
  float pf;
  std::memcpy(&pf, &poison, 4);
  for (size_t i = 0; i < n; ++i) {
    uint32_t e = 0;
    std::memcpy(&e, bytes + i * eb, eb);
    if (e == (eb == 2 ? (fw & 0xffff) : (fw & 0xff)))
      out[i] = pf;
    else if (is_fp8(dtype) && o_scale != 1.0f)
      out[i] /= o_scale;  // a power of two (validate_descales): exact
  }
}

}  // namespace attnfuzz
