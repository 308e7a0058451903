// merge.h - merge cases in the check layer (issue 29): the partial states from the exact sub-problems, and the
// whole problem's exact result with the composed bound.
#pragma once

#include <optional>

#include "attnfuzz/case.h"
#include "oracle/merge.h"
#include "oracle/oracle.h"

namespace attnfuzz {

// Fills t.state_o / t.state_lse of merge case c (t = generate(c)): state s of row (b, h, i) is the exact result of
// the problem restricted to the keys merge_range(c.merge, s, Sk_b) (the other keys given a -inf bias, so a row
// with no key in the range is an empty state: O_s = 0, LSE_s = -inf), O_s rounded to the dtype, LSE_s to fp32, then
// LSE_s + merge_shift(s) (a shift of -inf drops the state: O_s = 0). Stride gaps hold kStrideGapBits. threads: the
// states' oracles' worker threads (OracleOptions::threads; 0 = hardware concurrency; a campaign's workers pass 1).
void make_states(const Case& c, Tensors& t, unsigned threads = 0);

// The whole problem's exact result (every key, no merge) with the bound of a merge of the given states composed
// with the states' rounding (docs/semantics.md "Merged states"): merged.o_bound + the effect of rounding O_s to the
// dtype and LSE_s to fp32. Empty when that comparison is not meaningful: a shifted or dropped state (the states are
// then not those of one problem), or a row of the whole problem outside the fp32 contract.
std::optional<OracleResult> merge_whole_oracle(const Case& c, const Tensors& t, const OracleResult& merged,
                                               const OracleOptions& opts);

// c without its merge: the plain attention case whose keys the states split.
Case unmerged(const Case& c);

}  // namespace attnfuzz
