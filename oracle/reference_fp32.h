// reference_fp32.h - the plain fp32 attention reference: the same-precision baseline of the flash-attention
// rule.
#pragma once

#include <vector>

#include "attnfuzz/problem.h"

namespace attnfuzz {

// One query row computed the plain way in fp32: sequential fp32 dot products, scale, row max, expf,
// sequential sum, sequential weighted V sum, one division; LSE = m + logf(l). Fully masked rows give
// O = 0, LSE = -inf. q, k, v are laid out with p's strides; o_row receives Dv floats.
void reference_fp32_row(const Problem& p, const float* q, const float* k, const float* v, int64_t b,
                        int64_t h, int64_t s, float* o_row, float* lse);

// How a plain low-precision kernel computes (compute dtype c = f16 or bf16, fp32 accumulation).
enum class LowpStyle {
  kMath,   // PyTorch's math SDPA: q and k multiplied by sqrt(scale) and rounded to c, scores = Q K^T rounded
           // to c, softmax in fp32 from the c scores with its output rounded to c, O = P V rounded to c
  kFlash,  // FlashAttention: q, k, v rounded to c, fp32 scores and online softmax over 64-key tiles,
           // P rounded to c for P V (row sum from the unrounded P), O = acc / l rounded to c; LSE fp32
};
// One query row the plain way in c (see LowpStyle), same layout and conventions as reference_fp32_row.
void reference_lowp_row(const Problem& p, const float* q, const float* k, const float* v, int64_t b, int64_t h,
                        int64_t s, int32_t dtype, LowpStyle style, float* o_row, float* lse);

// The whole problem, contiguous layout of Fp64Result (fp64_o_index / fp64_lse_index).
struct Fp32Result {
  std::vector<float> o;
  std::vector<float> lse;
};
Fp32Result reference_fp32(const Problem& p, const float* q, const float* k, const float* v);

}  // namespace attnfuzz
