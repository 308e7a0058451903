// codec_shared.h - what the byte codec (codec.cpp) and the case domain (mutator.cpp) share: the menus of
// edge values they draw from, the work budget, and small problem helpers.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "attnfuzz/presets.h"
#include "fuzz/codec.h"

namespace attnfuzz::fuzz::detail {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline bool fp8(int32_t dtype) { return dtype == AF_DTYPE_FP8_E4M3 || dtype == AF_DTYPE_FP8_E5M2; }

inline int64_t tensor_seq(const Problem& p, Tensor t) { return t == Tensor::kQ ? p.seq_q : p.seq_k; }
inline int64_t tensor_heads(const Problem& p, Tensor t) { return t == Tensor::kQ ? p.heads_q : p.heads_kv; }
inline int64_t tensor_dim(const Problem& p, Tensor t) {
  return t == Tensor::kQ || t == Tensor::kK ? p.head_dim : p.head_dim_v;
}

std::vector<std::pair<int64_t, int64_t>> head_menu(const FuzzLimits& l);  // (Hq, Hkv) configurations
// The preset of l (FuzzLimits::preset) in the one table, or null.
const ModelPreset* preset_of(const FuzzLimits& l);
// The preset's mask at p's Sk: none / causal-br, or its window: as it is when shorter than max_seq, else
// scaled to Sk's share of its context.
void preset_mask(Problem& p, const ModelPreset& m, int64_t max_seq);
const std::vector<float>& scale_menu();
const std::vector<float>& o_scale_menu();  // fp8 output scales
const std::vector<double>& param_menu(Distribution d);
// Score variants (issue 28): softcaps (|s / cap| from << 1 to >> 88 on the fuzzer's logits), sink and bias ranges.
const std::vector<float>& softcap_menu();
const std::vector<double>& sink_range_menu();
const std::vector<double>& bias_range_menu();
// Merged states (issue 29): LSE shifts (0, one state dominated by 1e4, every LSE near -200 / +150, a dropped
// state), stride pads, and the most states a fuzzed merge case has.
const std::vector<double>& merge_shift_menu();
const std::vector<int64_t>& merge_pad_menu();
constexpr int64_t kMaxFuzzStates = 6;
// A merge case's cuts clipped to its (new) Sk, the last one Sk, and its state strides recomputed; no-op otherwise.
void fit_merge(Case& c);
// Dropout (issue 29): probabilities from 0 to 0.999, and counter offsets (0, small, around 2^32, past 2^40).
const std::vector<double>& dropout_p_menu();
const std::vector<uint64_t>& dropout_offset_menu();
// The broadcast dimensions of a bias as bits (b 1, h 2, i 4, j 8) and back ("bh").
uint8_t broadcast_bits(const Problem& p);
std::string broadcast_text(uint8_t bits);
// Custom masks (issue 28 item 4): the generated mask patterns, block patterns and block sizes (q rows x keys).
const std::vector<std::string>& mask_pattern_menu();
const std::vector<std::string>& block_pattern_menu();
const std::vector<std::pair<int32_t, int32_t>>& block_size_menu();
// B * Hq * Sq * max(Sk, 1) * max(D, Dv): the cost of one check (FuzzLimits::max_work).
int64_t work(const Problem& p);
// Brings a problem inside the limits and the work budget (deterministic; identity for in-limit problems).
void fit(Problem& p, const FuzzLimits& l);

}  // namespace attnfuzz::fuzz::detail
