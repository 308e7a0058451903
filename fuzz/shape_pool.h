// shape_pool.h - compile-aware fuzzing (issue 30 item 5): the shapes a kernel that compiles per shape has compiled in
// this worker process, when a new one may be added, and how an input is fitted onto one of them.
//
// A JIT-compiled target (torch.compile'd FlexAttention, jax.jit) compiles on every new shape: seconds per call, where
// a call at a compiled shape takes milliseconds. For such a kernel a worker keeps a pool of the shapes it has run
// (ShapePool, one per kernel and worker process, emptied when the adapter restarts) and spends most inputs on them:
// an input of another shape keeps its values, special values, scale, seed and variant values but takes a pool case's
// shape (snap_shape; the variants the kernel takes as data, "data_variants", stay the input's own). A new shape is admitted while first calls at new shapes took at most a share of the kernel's
// check time (--new-shape-share, default 0.25). A kernel is compile-aware when its adapter declares
// "recompiles_per_shape" (adapters/PROTOCOL.md) or, under --compile-aware auto, when the worker measures it: on its
// first inputs it alternates new and pooled shapes, and a kernel whose first calls all took >= 4x its slowest repeat
// call and >= 50 ms more is treated the same (work/compile.txt; the summary says which and why).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "attnfuzz/case.h"
#include "fuzz/codec.h"

namespace attnfuzz::fuzz {

// What a compiled kernel is specialised on (fuzz/README.md "Compile-aware fuzzing"): B, Hq, Hkv, Sq, Sk, D, Dv,
// dtype, pass, the sequence layout (layouts, page size, total tokens, capacity, pages), the mask (kind, alignment,
// window sides), the variant set with the softcap, dropout p, the broadcast pattern of the bias / mask buffers,
// the block sizes and the tunables; merge cases the state count and layout. Not in it (data, not code): the
// values, special values, seed, scale, per-sequence lengths within the same totals, and the variant values.
// data_variants: the variants (of sink, softcap, ALiBi, bias) the kernel's compiled code takes as data (its
// adapter's "data_variants", adapters/PROTOCOL.md): left out of the key, with the softcap value and the bias pattern.
std::string shape_key(const Case& c, uint32_t data_variants = 0);

// values_of's values on shape_of's shape: shape_of with values_of's value spec (distribution, special values,
// domain), seed, scale, dropout seed and offset, explicit values when their sizes fit and variant values (the
// lists whose sizes fit, the ranges and patterns). Stays in lim's domain: at= special values outside the new
// shape are dropped, and when it still is not in the domain, shape_of with values_of's seed.
// With data_variants (as in shape_key), values_of's own choice of those variants (bits, softcap value, bias
// broadcast pattern) replaces shape_of's: a pool of compiled shapes then runs every combination of them.
Case snap_shape(const Case& shape_of, const Case& values_of, const FuzzLimits& lim, uint32_t data_variants = 0);

// The minimizer's order for a kernel that compiles per shape: the candidates that keep cur's shape_key first (a
// compiled kernel runs them in milliseconds), then those that change it (a compilation each), each group in its
// given order.
void same_shape_steps_first(const Case& cur, std::vector<Case>& candidates);

// --compile-aware: off (today's behaviour: every shape runs as drawn), on (every kernel pooled), auto (kernels whose
// adapter declares recompiles_per_shape pooled; the other adapter kernels measured).
enum class CompileMode : uint8_t { kOff, kProbe, kPooled };

class ShapePool {
 public:
  static constexpr size_t kMaxShapes = 64;       // no new shape beyond this many (a JIT's cache has a limit too)
  static constexpr size_t kProbeSamples = 3;     // first and repeat calls measured before deciding
  static constexpr double kCompileRatio = 4;     // first call >= 4 x the slowest repeat call ...
  static constexpr double kCompileExtraS = 0.05;  // ... and >= 50 ms more

  ShapePool() = default;
  ShapePool(CompileMode mode, double share, std::string why) : mode_(mode), share_(share), why_(std::move(why)) {}
  CompileMode mode() const { return mode_; }
  // The kernel's data variants (of sink, softcap, ALiBi, bias: shape_key); its pool's keys and snaps follow them.
  void set_data_variants(uint32_t bits) { data_variants_ = bits & kScoreVariants; }
  std::string key(const Case& c) const { return shape_key(c, data_variants_); }
  Case snap(const Case& shape_of, const Case& values_of, const FuzzLimits& lim) const {
    return snap_shape(shape_of, values_of, lim, data_variants_);
  }
  const std::string& why() const { return why_; }  // "declared by the adapter", "measured: ...", ...
  // Whether an input of shape `key` runs as drawn: a known shape, or a new one the budget admits. While the pool is
  // empty, every shape until the kernel refuses one; then none (pick() has nothing: CaseDomain::plain_shape).
  bool takes(const std::string& key) const;
  // The pool case a snapped input takes its shape from (r picks; null when the pool is empty).
  const Case* pick(uint64_t r) const;
  // After a check at c (its shape_key `key`): first_call_s the kernel's own time (support question and launch),
  // check_s the whole check. Returns true when this check ended a probe (mode() is now kPooled or kOff).
  bool record(const Case& c, const std::string& key, double first_call_s, double check_s);
  void note_snapped() { ++snapped_; }
  // The kernel refused a shape the pool took, after support_s seconds: an adapter's support question may compile
  // (flex probes on zeros), so they count as a new shape's time and the kernel's, and the key is snapped away from
  // while the pool has shapes. Before, a refusal was free to the budget: compiled FlexAttention spent 89 of 90 s
  // refusing head dims one compilation each (bench/compile_aware.sh, session 22).
  void note_refused(const std::string& key, double support_s);
  void reset();  // the kernel's process restarted: nothing is compiled any more (statistics stay)
  // Decided elsewhere (another worker process measured it): work/compile.txt.
  void set_mode(CompileMode m, std::string why) { mode_ = m, why_ = std::move(why), firsts_.clear(), repeats_.clear(); }
  // {"mode", "why", "shapes" (admitted in this process), "checks", "snapped", "refused", "new_shape_s", "check_s"}.
  nlohmann::json stats() const;

 private:
  bool decide();  // kProbe with enough samples: pooled or off
  CompileMode mode_ = CompileMode::kOff;
  uint32_t data_variants_ = 0;
  double share_ = 0.25;
  std::string why_;
  std::vector<Case> shapes_;
  std::unordered_map<std::string, size_t> index_;
  std::unordered_set<std::string> refused_;
  std::vector<double> firsts_, repeats_;  // probe samples, seconds
  int64_t admitted_ = 0, checks_ = 0, snapped_ = 0, refusals_ = 0;
  double new_s_ = 0, check_s_ = 0;
};

const char* compile_mode_name(CompileMode m);  // "off", "probe", "pooled"

}  // namespace attnfuzz::fuzz
