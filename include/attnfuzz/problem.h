// problem.h - the attention problem (af_problem) as C++ sees it: construction, validation, masks, text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnfuzz/abi.h"

namespace attnfuzz {

using Problem = af_problem;

// A problem with contiguous [B, S, H, D] strides, contiguous LSE [B, Hq, Sq], scale fp32(1/sqrt(D)),
// no mask, fp32.
Problem make_problem(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_k,
                     int64_t head_dim, int64_t head_dim_v);

// p with another shape, dense and contiguous: the same heads, scale (kept, not the new D's default), mask,
// dtype, fp8 scales, tunables and score variants (the bias broadcast over the same dimensions).
Problem reshape_problem(const Problem& p, int64_t batch, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                        int64_t head_dim_v);
// The same with other head counts too (heads_kv must divide heads_q), e.g. one (b, h) slice: B = Hq = Hkv = 1.
Problem reshape_problem(const Problem& p, int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q,
                        int64_t seq_k, int64_t head_dim, int64_t head_dim_v);

// Recomputes contiguous strides for the current shape (with AF_VARIANT_KV_SHARED, V's are K's: share_kv).
void set_contiguous_strides(Problem& p);
// MLA's shared K/V latent (AF_VARIANT_KV_SHARED, docs/semantics.md "Shared K/V latent"): V is the first Dv
// columns of K's rows, so v_stride = k_stride (set here, with the bit); Dv <= D is validate()'s.
void share_kv(Problem& p);
inline bool kv_shared(const Problem& p) { return (p.variants & AF_VARIANT_KV_SHARED) != 0; }

// fp32 rounding of 1/sqrt(D): the default scale.
float default_scale(int64_t head_dim);

// Empty when the problem is well formed, else a sentence naming the first problem found.
std::string validate(const Problem& p);

// Largest shape dimension product the tool accepts (guards against absurd allocations).
constexpr int64_t kMaxElements = int64_t{1} << 31;

// The diagonal offset: 0 for top-left alignment, Sk - Sq for bottom-right.
int64_t mask_offset(const Problem& p);

// Window sides after normalising causal (left unbounded, right 0) and none (both unbounded).
// AF_UNBOUNDED stays AF_UNBOUNDED.
int64_t window_left(const Problem& p);
int64_t window_right(const Problem& p);

// visible(i, j) <=> j - (i + off) in [-left, right] (docs/semantics.md). i in [0, Sq), j in [0, Sk).
bool visible(const Problem& p, int64_t i, int64_t j);

// The visible keys of row i are exactly [first, last) (a mask is always an interval); empty if first >= last.
struct KeyRange {
  int64_t first, last;
  bool empty() const { return first >= last; }
};
KeyRange visible_keys(const Problem& p, int64_t i);

// AF_SUPPORTS_* bit that a kernel must have to run this problem's mask.
uint32_t mask_support_bit(const Problem& p);

// Mask text: "none", "causal-br", "causal-tl", "window:L,R-br", "window:L,R-tl" (L or R may be "inf").
std::string mask_to_string(const Problem& p);
// Parses the forms above plus the aliases "causal" (= causal-br) and "window:L,R" (= -br). Sets
// mask_kind/align/window_*; returns an error sentence or empty.
std::string parse_mask(const std::string& text, Problem& p);

// "f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2". parse_dtype also takes fp32, fp16, float16, bfloat16, e4m3,
// fp8 (= fp8-e4m3), e5m2.
const char* dtype_name(int32_t dtype);
std::optional<int32_t> parse_dtype(const std::string& text);
// Empty when the descale factors fit the dtype: 1 for every non-fp8 dtype; for fp8, q/k/v_descale in
// [2^-16, 2^16] with at most 16 significand bits (stored * descale is then exact in fp32) and o_scale a power
// of two in [2^-16, 2^16] (stored / o_scale exact). Part of validate().
std::string validate_descales(const Problem& p);
// Empty when one q/k/v descale factor f is valid in the sense above (finite, in [2^-16, 2^16], <= 16 significand
// bits), else why not ("need a value in ..."); the per-head descales (AF_VARIANT_HEAD_DESCALE) use it too.
std::string validate_descale_value(float f);

// One line: "B=1 Hq=2 Hkv=1 Sq=7 Sk=13 D=59 Dv=59 mask=causal-br scale=0.130189 f32" (fp8 adds
// " descale=Q,K,V o_scale=O").
std::string describe(const Problem& p);

// Element counts of each tensor (spanning the strides) and of the LSE.
int64_t q_elements(const Problem& p);
int64_t k_elements(const Problem& p);
int64_t v_elements(const Problem& p);
int64_t o_elements(const Problem& p);
int64_t lse_elements(const Problem& p);

// Element offsets.
inline int64_t q_index(const Problem& p, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * p.q_stride[0] + s * p.q_stride[1] + h * p.q_stride[2] + d;
}
inline int64_t k_index(const Problem& p, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * p.k_stride[0] + s * p.k_stride[1] + h * p.k_stride[2] + d;
}
inline int64_t v_index(const Problem& p, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * p.v_stride[0] + s * p.v_stride[1] + h * p.v_stride[2] + d;
}
inline int64_t o_index(const Problem& p, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * p.o_stride[0] + s * p.o_stride[1] + h * p.o_stride[2] + d;
}
inline int64_t lse_index(const Problem& p, int64_t b, int64_t h, int64_t s) {
  return b * p.lse_stride[0] + h * p.lse_stride[1] + s * p.lse_stride[2];
}
// The kv head read by query head h (GQA / MQA).
inline int64_t kv_head(const Problem& p, int64_t h) { return h / (p.heads_q / p.heads_kv); }

// ---- Score variants (docs/semantics.md "Variants"; issue 28): sinks, softcap, ALiBi, additive bias ----------
// The variants the tool checks (a subset of AF_VARIANTS_KNOWN; a case using another is refused with a reason).
constexpr uint32_t kScoreVariants = AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_BIAS;
// The custom masks (issue 28 item 4): a dense byte mask or FlashInfer's bit-packed one, and a block-sparse mask.
constexpr uint32_t kMaskVariants = AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS | AF_VARIANT_BLOCK_SPARSE;
constexpr uint32_t kCheckedVariants =
    kScoreVariants | kMaskVariants | AF_VARIANT_DROPOUT | AF_VARIANT_HEAD_DESCALE | AF_VARIANT_KV_SHARED;
// The score variants checked on sequence layouts too (varlen, KV cache, paged; docs/sequence-layouts.md "Variants"):
// per-sequence values need no layout of their own (sinks and slopes are per head, the softcap one number). A kernel
// takes them there only with AF_FEATURE_LAYOUT_VARIANTS; kv-shared (geometry) combines with every layout anyway.
constexpr uint32_t kLayoutVariants = AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI;
// "sink", "softcap", "alibi", "bias", ... for one AF_VARIANT_* bit; "" for an unknown bit.
const char* variant_name(uint32_t bit);
// "sink+softcap" for a bit set ("none" for 0); parse_variant_names takes the same form (also ',' separated).
std::string variant_names(uint32_t bits);
std::string parse_variant_names(const std::string& text, uint32_t& out);

// The values a problem's variants read (af_buffers' sinks / alibi_slopes / bias on the host): nullptr where the
// problem does not use the variant. sinks [Hq], alibi_slopes [Hq], bias with p.bias_stride (bias_elements floats).
struct VariantInputs {
  const float* sinks = nullptr;
  const float* alibi_slopes = nullptr;
  const float* bias = nullptr;
  // AF_VARIANT_DROPOUT (docs/semantics.md "Dropout"): the keep mask the oracle applies, [B, Hq, Sq, Sk] contiguous
  // bytes (1 kept, 0 dropped; the kernel's exported mask or the declared generator's), kept weights scaled by
  // 1 / (1 - dropout_p).
  const uint8_t* dropout_keep = nullptr;
  const uint8_t* custom_mask = nullptr;  // AF_VARIANT_MASK_DENSE / _BITS: custom_mask_bytes(p) bytes, mask_stride
  const uint8_t* block_mask = nullptr;   // AF_VARIANT_BLOCK_SPARSE: block_mask_bytes(p) bytes, block_mask_stride
  // AF_VARIANT_HEAD_DESCALE (fp8): per-head descales replacing q/k/v_descale, with p.descale_stride; q per query
  // head (descale_h_elements(p, true) floats), k and v per KV head (descale_h_elements(p, false) floats).
  const float* q_descale_h = nullptr;
  const float* k_descale_h = nullptr;
  const float* v_descale_h = nullptr;
};
// Per-head descales (AF_VARIANT_HEAD_DESCALE): the floats an array spans with p.descale_stride, over the query heads
// (query) or the KV heads (0 without the variant); the element of (b, head) is b * descale_stride[0] + head *
// descale_stride[1]. set_descale_strides: {0, 1} (one value per head for every batch) or, per_batch, {Hq, 1}.
int64_t descale_h_elements(const Problem& p, bool query);
inline int64_t descale_h_index(const Problem& p, int64_t b, int64_t head) {
  return b * p.descale_stride[0] + head * p.descale_stride[1];
}
void set_descale_strides(Problem& p, bool per_batch);
// Elements the bias tensor spans with p.bias_stride (0 when the problem has no bias).
int64_t bias_elements(const Problem& p);
inline int64_t bias_index(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  return b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3];
}
// Contiguous bias strides [B, Hq, Sq, Sk] with the dimensions named in `broadcast` ("b", "h", "i", "j", any
// subset, e.g. "bh") given stride 0. Returns an error sentence or empty.
std::string set_bias_strides(Problem& p, const std::string& broadcast);
// The broadcast dimensions of p's bias ("bh", "" = none): the inverse of set_bias_strides for its layouts.
std::string bias_broadcast(const Problem& p);
// The ALiBi paper's slopes for n heads (Press et al. 2022, the reference get_slopes): for a power of two n,
// 2^(-8 (h + 1) / n); otherwise the slopes of the largest power of two P < n followed by every other slope of
// 2P (the first n - P of them). Rounded to fp32.
std::vector<float> alibi_default_slopes(int64_t heads);
// The ALiBi term of (i, j): -slope * |j - (i + off)| with off of the mask alignment (Sk - Sq bottom-right).
inline double alibi_term(const Problem& p, double slope, int64_t i, int64_t j) {
  const int64_t off = p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? p.seq_k - p.seq_q : 0;
  const int64_t dist = j - (i + off);
  return -slope * static_cast<double>(dist < 0 ? -dist : dist);
}

// ---- Custom masks (docs/semantics.md "Custom masks"): key j of row (b, h, i) is visible iff visible(p, i, j)
// under mask_kind AND custom_visible(...). Without a custom mask variant custom_visible is always true.
// Bytes of one custom-mask row: Sk (dense, one byte per key) or ceil(Sk / 8) (bits); 0 without a custom mask.
int64_t custom_mask_row_bytes(const Problem& p);
// Bytes the custom mask spans with p.mask_stride (0 without one); the block mask with p.block_mask_stride.
int64_t custom_mask_bytes(const Problem& p);
int64_t block_mask_bytes(const Problem& p);
// Query / key blocks of a block-sparse problem: ceil(Sq / block_q), ceil(Sk / block_k) (0 without one).
int64_t query_blocks(const Problem& p);
int64_t key_blocks(const Problem& p);
// Block mask values (abi.h): 0 empty (no key visible), 1 full (every key visible; the custom mask is not read),
// 2 partial (the custom mask decides; without one the block counts as full).
constexpr uint8_t kBlockEmpty = 0, kBlockFull = 1, kBlockPartial = 2;
// Visibility of (b, h, i, j) under the custom and block masks alone (mask_kind not included).
bool custom_visible(const Problem& p, const VariantInputs& in, int64_t b, int64_t h, int64_t i, int64_t j);
// visible(p, i, j) && custom_visible(p, in, b, h, i, j): the one visibility rule of a problem with a custom mask.
bool key_visible(const Problem& p, const VariantInputs& in, int64_t b, int64_t h, int64_t i, int64_t j);
// Every key row (b, h, i) sees under key_visible, ascending (visible_keys(p, i) without a custom mask).
std::vector<int64_t> seen_keys(const Problem& p, const VariantInputs& in, int64_t b, int64_t h, int64_t i);
// Contiguous custom-mask strides (dense or bits row bytes) with the dimensions named in `broadcast` (a subset of
// "bhi") given stride 0; contiguous block-mask strides likewise. Return an error sentence or empty.
std::string set_mask_strides(Problem& p, const std::string& broadcast);
std::string set_block_mask_strides(Problem& p, const std::string& broadcast);
// The broadcast dimensions of p's custom mask / block mask ("bh", "" = none).
std::string mask_broadcast(const Problem& p);
std::string block_mask_broadcast(const Problem& p);

}  // namespace attnfuzz
