// codec.h - the fuzz input: any bytes decode totally into a valid (kernel choice, Case); encoder, mutator,
// shrinker.
//
// The byte format is a sequence of fields read front to back; a field that runs out of bytes reads as 0, so
// every byte string (the empty one included) decodes. Integer fields are a tag byte: tags below kRawTag pick
// an entry of a menu drawn from case.h's space:: (edge lengths, head dims, head configs, magnitudes, special
// kinds), so random bytes land on edge values most of the time; kRawTag is followed by a varint for any
// other value in range. Decoding then normalises (limits, work budget, strides, specials) into a Case that
// validate() accepts. encode() writes every field exactly, so decode(encode(x)) == x for every x that
// in_domain() accepts (the round trip the tests check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/case.h"

namespace attnfuzz::fuzz {

// Bounds of the fuzzed case space (small shapes: many cases per second; tails of every common tile).
struct FuzzLimits {
  int64_t max_batch = 3;
  int64_t max_heads = 8;
  int64_t max_seq = 160;       // Sq <= max_seq, Sk <= max_seq
  int64_t max_dim = 160;       // D, Dv
  int64_t max_work = 1 << 21;  // B * Hq * Sq * max(Sk, 1) * max(D, Dv): cost of one check
  int64_t max_specials = 6;    // special-value entries
  int64_t max_special_count = 16;
  int64_t max_explicit = 1 << 16;  // explicit values are encoded only up to this many floats in total
  // Value domain of every decoded case (not encoded in the bytes): under kFinite, special kinds are drawn
  // from space::special_kinds(kFinite) and explicit NaN / Inf bits decode as 0 / +-FLT_MAX.
  ValueDomain domain = ValueDomain::kIeee;
  // The dtype of every decoded case (attn-fuzz --dtype, default f32), or -1 ("any"): the bytes choose among
  // all five. fp8 cases draw q/k/v_descale from space::fp8_descales() and o_scale from a menu of powers of
  // two. Under f32 the decoder and the mutator consume bytes and random numbers exactly as before issue 13.
  int32_t dtype = AF_DTYPE_F32;
  // Passes a decoded case may have, bit (1 << Pass). The pass is the last field of the bytes (0 when they run
  // out: forward, so inputs written before it decode as they did); a pass outside the set decodes as the
  // lowest one in it. With more than one, the mutator also changes the pass.
  uint8_t passes = 1u << static_cast<int>(Pass::kFwd);
  // Score variants a decoded case may use (AF_VARIANT_SINK | _SOFTCAP | _ALIBI | _BIAS; attn-fuzz --variant). They
  // follow the pass as the last field (absent: none, so inputs written before decode as they did): the variant
  // bits, then the softcap (a menu or raw fp32 bits), the sink range, the bias broadcast dimensions and range
  // (menus); values are generated from the seed. Bits outside the set are dropped; none with a sequence layout.
  uint32_t variants = 0;
  // Merged states (issue 29): whether decoded cases may be merge cases (set when the campaign's kernels include a
  // merge kernel, AF_KIND_MERGE). The field after the variants (absent: none): docs in codec.cpp read_merge.
  bool merge = false;
  // A model preset (attn-fuzz --preset NAME; include/attnfuzz/presets.h), or empty. Decoded cases keep its
  // geometry with small perturbations: (Hq, Hkv) its own or reduced keeping the group size, D and Dv within 8
  // of its own, its mask (a window shorter than max_seq as it is, a longer one at Sk's share of its context),
  // its softcap and sinks; batch, lengths, values, the other variants and the pass come from the bytes as
  // usual. set_preset() sets it and the limits it needs.
  std::string preset;
  // MLA geometry (issue 28 item 5): whether a kv-shared case may take DeepSeek's D = 576, Dv = 512 (one KV
  // head), beyond max_dim. Set by the campaign when --variant kv-shared is on and a selected kernel declares
  // kv-shared with max_head_dim >= 576 (or no limit) and max_head_dim_v >= 512; every other case keeps
  // max_dim. The field after merge (absent: not shared): docs in codec.cpp read_kv_shared.
  bool mla_dims = false;
};
// DeepSeek's MLA head dims (512 latent + 64 rope; V the latent), the only D / Dv beyond max_dim a case may
// take.
constexpr int64_t kMlaHeadDim = 576, kMlaHeadDimV = 512;

// Makes l decode near preset `name`: l.preset, l.variants += the preset's, max_heads / max_dim raised to its
// heads and dims, max_work to 2^24 (a 64-head D = 128 check at 16 x 128). Returns "" or a one-line reason
// (unknown name, or a preset whose geometry the case model cannot hold yet).
std::string set_preset(FuzzLimits& l, const std::string& name);

// One fuzz input: which of the selected kernels to run (taken modulo their number) and the case.
struct FuzzInput {
  uint32_t kernel = 0;  // 0 .. 255
  Case the_case;
};

// Total: any bytes give an input whose case passes validate() and in_domain().
FuzzInput decode(const uint8_t* data, size_t size, const FuzzLimits& lim = {});
// Exact for in_domain() inputs (labels are not encoded).
std::vector<uint8_t> encode(const FuzzInput& in, const FuzzLimits& lim = {});

// Empty when the case is valid and inside the limits (and so round-trips), else the first reason.
std::string in_domain(const Case& c, const FuzzLimits& lim = {});

// The case space as a domain (fuzztest-style init / mutate / validate / print), shared by the custom
// mutator, cross-over and the minimizer.
class CaseDomain {
 public:
  explicit CaseDomain(FuzzLimits lim = {}) : lim_(lim) {}
  const FuzzLimits& limits() const { return lim_; }

  // A random case from the edge values of space::.
  FuzzInput init(Rng& rng) const;
  // One to a few structured mutations: shapes near tile boundaries, magnitudes, special-value kinds and
  // placements, mask kind / alignment / windows, scale, layout, seed, kernel. Keeps the input in the domain.
  void mutate(FuzzInput& in, Rng& rng) const;
  // Takes shape, mask and values from a and b at random.
  FuzzInput cross_over(const FuzzInput& a, const FuzzInput& b, Rng& rng) const;
  // Every one-step simplification of c, simplest first (the minimizer tries them in order): smaller B,
  // heads, Sq, Sk, D, Dv; fewer or fewer-count specials; plainer mask, distribution, scale and layout;
  // for explicit values: zeroed halves, rounded values.
  std::vector<Case> shrinks(const Case& c) const;
  // c on the shape that JIT-compiled kernels accept most widely: Sq, Sk, D, Dv each rounded down to a power of two
  // (D and Dv at least 16 where the limits allow), everything else kept. c unchanged for a sequence layout or a
  // merge case, or where the result leaves the domain. The compile-aware pool's start (fuzz/shape_pool.h).
  Case plain_shape(const Case& c) const;
  std::string validate(const Case& c) const { return in_domain(c, lim_); }
  std::string print(const FuzzInput& in) const;

 private:
  FuzzLimits lim_;
};

// Replaces generated values by the explicit values they generate (specials included), so values can be
// simplified one by one. Returns c unchanged if it already has explicit values.
Case materialize(const Case& c);

}  // namespace attnfuzz::fuzz
