// features.h - semantic coverage: what a (kernel, case, verdict) exercised, as libFuzzer extra counters.
//
// libFuzzer treats every byte of the section __libfuzzer_extra_counters as a coverage counter (reset before
// each input, bucketed after). attn-fuzz sets one counter per semantic feature, per kernel: tile-tail classes
// (S mod tile, D mod vector width), mask kind x alignment x window sides, fully masked rows, running-max
// changes and the key tiles they happen in (from the inputs, not the kernel), logit magnitude, special-value
// kind x tensor x where it landed, verdict and class, and the error/bound ratio, plus a few cross products; the pass (fwd / bwd / fwdbwd) with
// fully masked rows, a backward failure's gradient tensor and a backward ratio bucket.
// So an input is "new" when it makes some kernel do something semantically new, not when it takes a new
// branch of the decoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/verdict.h"

namespace attnfuzz::fuzz {

inline constexpr size_t kKernelSlots = 32;         // kernels beyond this share slots (index mod 32)
inline constexpr size_t kFeaturesPerKernel = 1024;  // feature ids are < this
inline constexpr size_t kCounterBytes = kKernelSlots * kFeaturesPerKernel;

// Features of the case alone (computed once per input from the problem and the generated values).
struct CaseFeatures {
  std::vector<uint16_t> ids;
  int mask = 0;              // 0 none, 1 causal-tl, 2 causal-br, 3 window-tl, 4 window-br
  int tail16_k = 0;          // Sk mod 16 class (0 .. 4)
  int fully_masked = 0;      // 0 none, 1 some rows, 2 every row
  int max_change_tiles = 0;  // 0 .. 3: key tiles (of 16) after the first where some row's running max rose
  int logit = 0;             // logit magnitude bucket 0 .. 10
  int dist = 0;              // Distribution
  int dtype = 0;             // af_dtype 0 .. 4
  int pass = 0;              // Pass (fwd, bwd, fwdbwd)
  uint32_t variants = 0;     // score variants (AF_VARIANT_SINK | _SOFTCAP | _ALIBI | _BIAS)
  uint32_t mask_variants = 0;  // custom masks: AF_VARIANT_MASK_DENSE / _BITS / _BLOCK_SPARSE >> 4
  std::vector<int> special_kinds;  // index into space::special_kinds() of every placed value
};
CaseFeatures case_features(const Case& c, const Tensors& t);

// Features of one check's outcome, combined with the case's (cross products).
std::vector<uint16_t> result_features(const CaseFeatures& cf, const CheckResult& r);

// The counters libFuzzer reads (kCounterBytes bytes in section __libfuzzer_extra_counters).
uint8_t* extra_counters();
// Sets the counters of one kernel slot for the given feature ids.
void record_features(size_t kernel_slot, const std::vector<uint16_t>& ids);

// Ratio bucket 0 .. 11 of max |err| / bound (11: >= 1e3 or infinite / NaN mismatch).
int ratio_bucket(double ratio);

}  // namespace attnfuzz::fuzz
