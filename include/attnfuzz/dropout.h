// dropout.h - dropout as a field of the one case (issue 29): the keep mask's generators, validation, and its checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/problem.h"

namespace attnfuzz {

// "exported", "philox-flash", "philox-torch" (af_dropout_rng); parse takes the same names.
const char* dropout_rng_name(int32_t rng);
std::string parse_dropout_rng(const std::string& text, int32_t& out);

// Makes p use dropout with probability drop_p, generator rng, seed and counter offset (sets the variant bit and
// the fields; the mask stride is the tool's contiguous [B, Hq, Sq, Sk] bytes). Returns an error sentence or empty.
std::string set_dropout(Problem& p, double drop_p, int32_t rng, uint64_t seed, uint64_t offset);
// The tool's mask layout: contiguous [B, Hq, Sq, Sk] bytes (dropout_mask_stride), set again before every launch so
// that a reshaped problem never carries stale strides.
void set_dropout_mask_strides(Problem& p);
// Empty when p's dropout fields are well formed (p in [0, 1), a known and checked generator); part of validate().
std::string validate_dropout(const Problem& p);
// " dropout=0.1 rng=philox-flash dseed=0x2a doffset=0" (empty without dropout).
std::string describe_dropout(const Problem& p);

// Contiguous [B, Hq, Sq, Sk] keep masks (1 kept, 0 dropped) the oracle applies (VariantInputs::dropout_keep).
inline size_t keep_index(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  return static_cast<size_t>(((b * p.heads_q + h) * p.seq_q + i) * p.seq_k + j);
}
// The mask AF_DROPOUT_RNG_PHILOX_FLASH draws for p (attnfuzz/philox.h): the case's reference mask. PHILOX_TORCH
// is not reproduced (docs/semantics.md "Dropout" says why): empty.
std::vector<uint8_t> reference_keep_mask(const Problem& p);
// The exported mask a kernel wrote (bytes with p.dropout_mask_stride, j contiguous) in the contiguous layout.
// Visible (i, j) only: masked pairs are 0 (their weight is 0 either way). A row whose LSE (lse with p.lse_stride, the
// launch's forward output or given input; nullptr: none) is -inf or NaN has no weight to keep or drop (O = 0 or NaN
// whatever the mask): its bytes are kKeepUnjudged, read by no check. bad counts the other visible bytes that are not
// 0 / 1 (the output poison of an unwritten byte is one), first_bad names the first.
constexpr uint8_t kKeepUnjudged = 2;
std::vector<uint8_t> gather_keep_mask(const Problem& p, const uint8_t* exported, const float* lse, int64_t& bad,
                                      std::string& first_bad);
// Bytes a kernel's exported mask spans with p.dropout_mask_stride.
int64_t dropout_mask_bytes(const Problem& p);

// The keep-fraction test (docs/semantics.md "Dropout"): per row, per head and overall, the kept count k of n
// visible weights against Binomial(n, q) for every q in [q_lo, q_hi] (1 - p and the 8-bit generator's
// (floor(255 (1 - p)) + 1) / 256). The p-value of a count is bounded by the Chernoff bound
// 2 exp(-n KL(k / n || q)) at the nearest q; a unit fails when that bound is < alpha / tests (Bonferroni over
// every row, head and the total that has n >= 1). The false-alarm rate of a correct mask is therefore <= alpha.
struct KeepTest {
  bool failed = false;
  int64_t tests = 0;         // units tested (rows + heads + 1)
  double threshold = 0;      // alpha / tests
  double q_lo = 0, q_hi = 0; // the keep probabilities of the null
  double worst_bound = 1;    // the smallest p-value bound seen
  std::string worst_unit;    // "row b=0 h=1 i=3" / "head b=0 h=1" / "overall"
  int64_t worst_k = 0, worst_n = 0;
  std::string evidence() const;  // one line: the unit, k / n, the bound, the threshold
};
constexpr double kDropoutAlpha = 1e-9;
// The keep probabilities of the null: 1 - p and (floor(255 (1 - p)) + 1) / 256, as [lo, hi].
void keep_probabilities(const Problem& p, double& lo, double& hi);
KeepTest keep_fraction_test(const Problem& p, const std::vector<uint8_t>& keep, double alpha = kDropoutAlpha);

// Visible (b, h, i, j) where two masks differ (kKeepUnjudged matches anything): the count and the first one.
int64_t keep_mask_differences(const Problem& p, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                              std::string& first);

// The dropout sweep of attn-check --sweep --variant dropout (docs/attn-check.md): for each generator (exported mask,
// philox-flash) edge shapes (1 x 1, tails around the 16 x 32 Philox tile, GQA, batch, causal and window masks) at
// p = 0.1 and 0.5, plus p = 0 (identical to no dropout), p = 0.9 and 0.999 (rows stay finite), and offsets just below
// 2^32 whose counters cross it (a 32-bit offset wraps). Labelled "<rng>-<shape>-p<P>[-offset2^32]"; the case seed and
// the (non-zero) dropout seed derive from base_seed and the label. Every case gets `pass` and `dtype` (f16 / bf16
// labels start with the dtype's name; f32 cases are those of earlier versions).
std::vector<Case> dropout_sweep_grid(uint64_t base_seed = 0, Pass pass = Pass::kFwd, int32_t dtype = AF_DTYPE_F32);

}  // namespace attnfuzz
