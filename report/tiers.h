// tiers.h - the --fail-tiers set of attn-check and attn-fuzz: failures counted by input tier, and which tiers
// make the exit status 1 (docs/semantics.md "Input tiers").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/case.h"

namespace attnfuzz {

// The bit set (1 << InputTier) a --fail-tiers value names: "all" or a comma list of ordinary, extreme,
// non-finite-visible, non-finite-masked. "" on success, else the problem.
std::string parse_fail_tiers(const std::string& text, unsigned& bits);
// Whether failures of tier t count for the exit status under a (valid) --fail-tiers value.
bool tier_counted(const std::string& fail_tiers, InputTier t);

// Failures per tier (index = tier, input_tier_counts' order) and how many of them --fail-tiers counts.
struct TierTally {
  int64_t n[4] = {0, 0, 0, 0};
  int64_t counted = 0;
  int64_t total() const { return n[0] + n[1] + n[2] + n[3]; }
};
TierTally tally_tiers(const std::vector<InputTier>& failures, const std::string& fail_tiers);

// The exit status of a run with failures of these tiers: 1 when one is in a counted tier or none is tiered
// (the caller's failures are then of another kind), else 0, after the line "exit 0: every failure is in a
// tier --fail-tiers F does not count".
int tier_exit_status(const TierTally& t, const std::string& fail_tiers);

}  // namespace attnfuzz
