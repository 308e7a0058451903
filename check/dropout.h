// dropout.h - the dropout checks of one launch that need no oracle (docs/semantics.md "Dropout"), and its keep mask.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/verdict.h"
#include "check/runner.h"

namespace attnfuzz {

// The keep mask a launch used: its exported one (LaunchOutcome::keep / keep_bwd), else the case's reference mask.
const std::vector<uint8_t>& launch_keep(const PreparedCase& pc, const std::vector<uint8_t>& exported);
// pc's variant values with `keep` as the dropout mask.
VariantInputs with_keep(const PreparedCase& pc, const std::vector<uint8_t>& keep);

// An exported mask's bytes (0 / 1 at every visible weight), its keep fraction (keep_fraction_test) and, for fwd+bwd,
// whether the backward drew the forward's mask. failed: the first finding, class dropout.
struct DropoutJudgement {
  bool failed = false;
  std::string reason;
  std::vector<Evidence> evidence;
};
DropoutJudgement judge_dropout_masks(const PreparedCase& pc, const LaunchOutcome& lo);

// The exported mask depends on (seed, offset, b, h, i, j) only: the forward relaunched in another emulator thread
// order (cpu backend) and with every other value of each tunable the kernel declares must export the same mask, and relaunched with seed + 1 another one (tested only where
// two independent masks agree everywhere with probability below kDropoutAlpha). One launch per order, tunable value, seed.
DropoutJudgement dropout_invariance(Device& dev, const KernelEntry& k, const PreparedCase& pc, const LaunchOutcome& lo,
                                    const RunOptions& opts);

}  // namespace attnfuzz
