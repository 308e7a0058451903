// sequences.h - sequence-layout cases (varlen, KV cache, paged KV) in the checker: the per-sequence oracle,
// outputs in the dense view, output canaries past a sequence, boundary text for evidence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "oracle/oracle.h"

namespace attnfuzz {

// The exact result of a sequence-layout problem in its dense view (dense_view(p, t)): compute_oracle on each
// sequence's dense sub-problem (sequence_problem / sequence_tensors, so the mask aligns per sequence), copied
// to rows (b, h, s < Sq_b); rows past a sequence are not computed (compare skips them). `sampled` is the union.
OracleResult sequence_oracle(const Problem& p, const Tensors& t, const OracleOptions& opts);

// Outputs downloaded in the layout (o: o_elements(p), lse: lse_elements(p) or empty) -> the dense view
// [B, Sq, Hq, Dv] / [B, Hq, Sq]; rows past a sequence hold `fill`.
void outputs_to_view(const Problem& p, const Tensors& t, const std::vector<float>& o, const std::vector<float>& lse,
                     float fill, std::vector<float>& view_o, std::vector<float>& view_lse);

// Output elements outside every sequence (LSE rows s >= Sq_b) that no longer hold `poison` after a launch:
// they are canaries. Returns the count; `first` describes the first one ("" if none).
int64_t output_gap_writes(const Problem& p, const Tensors& t, const std::vector<float>& lse, uint32_t poison,
                          std::string& first, int64_t& first_offset, uint32_t& first_bits);

// q / k / v in the dense view (dense_view(p, t)): token s of sequence b at [b, s]; positions past a sequence 0.
Tensors sequence_view_tensors(const Problem& p, const Tensors& t);

// "sequence 1 (q tokens 17, keys 5 of 32 slots; packed rows [17, 34), key rows [5, 10); its first outside key
// is key 5)" - where a sequence and its boundaries are, for evidence.
std::string sequence_text(const Problem& p, const Tensors& t, int64_t b);

}  // namespace attnfuzz
