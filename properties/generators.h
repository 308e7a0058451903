// generators.h - RapidCheck generators of attn-fuzz cases, drawn from attnfuzz::space (case.h), with
// printing.
//
// One description of the case space: every shape, mask, magnitude and special value a generator yields
// comes from namespace attnfuzz::space (the sweep and the fuzzer's mutator use the same lists), weighted
// toward the edges, and bounded so that a property run stays fast on the cpu emulator. Shrinking goes
// toward B = Hq = Hkv = 1, Sq = Sk = 1, D = Dv = 1, mask none, default scale, uniform:1 values and no
// specials (each list below starts with its simplest element, and RapidCheck shrinks toward it).
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "attnfuzz/abi.h"
#include "attnfuzz/case.h"

namespace attnfuzz {

// RapidCheck prints a counterexample with this (found by argument-dependent lookup): describe(c), plus
// "explicit" values' sizes when the case carries them.
void showValue(const Case& c, std::ostream& os);

namespace props {

// Bounds and requirements of the generated cases. Every field is inclusive.
struct CaseLimits {
  int64_t max_seq = 130;                   // Sq, Sk <= max_seq (130: covers 128 +- 1 and 113, 127)
  int64_t min_seq_q = 1;                   // Sq >= min_seq_q (row independence needs two rows)
  int64_t max_d = 128;                     // D <= max_d (and the kernel's max_head_dim)
  int64_t max_dv = 128;                    // Dv <= max_dv (and the kernel's max_head_dim_v)
  bool dv_eq_d = false;                    // Dv == D (kernel's needs_dv_eq_d)
  int64_t max_bh = 8;                      // B * Hq <= max_bh
  int64_t min_bh = 1;                      // B * Hq >= min_bh (batch/head consistency needs two heads)
  uint32_t masks = AF_SUPPORTS_ALL_MASKS;  // AF_SUPPORTS_* bits a generated mask must be in
  bool require_mask = false;               // never mask none (masked-key invariance needs hidden keys)
  bool allow_empty_k = true;               // Sk = 0 may be drawn (rarely)
  bool specials = true;                    // special values (NaN, Inf, huge, subnormal, -0) may be placed
  bool extreme = true;                     // Distribution::kExtreme magnitudes may be drawn
  ValueDomain domain = ValueDomain::kIeee;  // finite: no NaN / Inf specials; activations: case.h ValueDomain
  int32_t dtype = AF_DTYPE_F32;  // dtype of every case; not f32: 1 time in 4 the dtype's stress inputs
                                 // (space::lowp_*); fp8: descales from space::fp8_descales(), o_scale 1
  Pass pass = Pass::kFwd;                   // the pass of every generated case (bwd / fwdbwd: dO generated too)
  // Score variants a case may use (issue 28; AF_VARIANT_SINK | _SOFTCAP | _ALIBI | _BIAS): 0 draws none (and
  // no extra random choice, so the other properties' cases are unchanged); else a subset, a softcap, a sink
  // range and the bias's broadcast dimensions, each shrinking toward "none" / the first option.
  // AF_VARIANT_HEAD_DESCALE (fp8 dtypes only): per-head descales half the time, from space::fp8_descales().
  // AF_VARIANT_KV_SHARED: half the time V a view of K's rows (Dv <= D).
  uint32_t variants = 0;
};

// Size-independent choices that shrink toward their first option (rc::gen::elementOf and weightedOneOf do not
// shrink, and rc::gen::inRange narrows with RapidCheck's size: early cases would only see the first values).
rc::Gen<size_t> index_below(size_t n);              // uniform in [0, n), shrinks toward 0
rc::Gen<int64_t> in_range(int64_t lo, int64_t hi);  // uniform in [lo, hi] inclusive, shrinks toward lo
rc::Gen<size_t> weighted_index(
    std::vector<int> weights);  // i with probability weights[i] / sum, shrinks to 0
template <typename T>
rc::Gen<T> element_of(std::vector<T> v) {
  return rc::gen::map(index_below(v.size()), [v](size_t i) { return v[i]; });
}
template <typename T>
rc::Gen<T> weighted_one_of(std::vector<std::pair<int, rc::Gen<T>>> choices) {
  std::vector<int> w;
  std::vector<rc::Gen<T>> gens;
  for (auto& [weight, g] : choices) w.push_back(weight), gens.push_back(g);
  return rc::gen::mapcat(weighted_index(w), [gens](size_t i) { return gens[i]; });
}

// The limits a kernel imposes (max head dims, Dv == D, masks), on top of `base`.
CaseLimits limits_for(const af_kernel& k, CaseLimits base = {});

// Sequence lengths: space::edge_seq_lengths(max) (1, tile +- 1, primes, 113, 127 ...) 3 times in 4, any
// length in [lo, max] otherwise. Shrinks toward lo.
rc::Gen<int64_t> gen_seq_len(int64_t lo, int64_t max);
// Head dims: space::edge_head_dims(max) (1, odd, primes, powers of two +- 1, 59, 111) 3 times in 4, any
// dim in [1, max] otherwise. Shrinks toward 1.
rc::Gen<int64_t> gen_head_dim(int64_t max);
// Mask texts from space::mask_forms() whose support bit is in limits.masks ("none" first, unless
// require_mask), plus random windows "window:L,R-tl|br" with small or unbounded sides.
rc::Gen<std::string> gen_mask(const CaseLimits& limits);
// Value distributions: uniform:1 (half the time), uniform:A, normal:SIGMA, extreme:MAG with MAG from
// space::extreme_magnitudes() (1 .. 1e4, around the exp overflow edge 88). Shrinks toward uniform:1.
rc::Gen<ValueDist> gen_value_dist(bool extreme);
// One special value: kind from space::special_kinds(), tensor q/k/v, placement random / visible /
// masked / hidden, count 1..3. Shrinks toward nan@q:random*1.
// Under ValueDomain::kFinite the kind comes from space::special_kinds(kFinite) (shrinks toward subnormal).
rc::Gen<SpecialValue> gen_special(ValueDomain domain = ValueDomain::kIeee);

// A whole case within `limits`: shape (B, Hq/Hkv from space::head_configs(), Sq, Sk with Sq != Sk
// half the time, D, Dv != D sometimes), mask, scale (default fp32(1/sqrt(D)) mostly), value
// distribution, 0..3 special values (none half the time), limits.dtype (with fp8 descales) and a seed.
// Always passes validate(Case).
rc::Gen<Case> gen_case(const CaseLimits& limits = {});

// Per-sequence length lists (issue 15): a list of space::seq_length_lists(), or n lengths each drawn from
// zero, one, tile residues (t - 1, t, t + 1 for t in 16/32/64/128) and any length, or one long sequence among
// short ones. Every length <= max. Shrinks toward {1}.
rc::Gen<std::vector<int64_t>> gen_seq_lengths(int64_t max, int64_t max_n = 4);

// A sequence-layout case within `limits` for a kernel declaring `features` (AF_FEATURE_*): varlen (packed q
// and K/V, cross lengths, with or without seqused_k), a KV cache (dense K/V, used below capacity), paged
// (page size 16..256, shuffled tables, spare pages, reserved slots) or decode (1..8 query tokens) - whichever
// the features allow; heads, dims and mask as gen_case; random-placement specials. With AF_FEATURE_LAYOUT_VARIANTS in
// features, half the cases draw a non-empty subset of `variants` & kLayoutVariants (sinks, softcap 5 / 30, ALiBi;
// issue 28). Always passes validate. Throws rc::GenerationFailure when the features allow no layout.
rc::Gen<Case> gen_sequence_case(const CaseLimits& limits, uint32_t features, uint32_t variants = 0);

}  // namespace props
}  // namespace attnfuzz
