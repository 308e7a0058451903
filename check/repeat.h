// repeat.h - repeated calls in one process (issue 30 item 6b): a case checked right after the same shape with
// another scale, so a plan or compiled-graph cache keyed on the shape alone replays the earlier call (a stale
// cache).
#pragma once

#include "check/runner.h"

namespace attnfuzz {

// The sibling launched first: pc's case with the same shape, values and strides and another scale (half of
// it; 1 when it is 0). A forward dense case only; nullopt otherwise.
std::optional<Case> repeat_sibling(const Case& c);

// check_case right after one launch of the sibling on the same device and kernel. A failure whose outputs are
// the sibling's exact result (every compared element within its bound) is named: class ignored-parameter,
// decided by repeat-calls/stale-cache, with the evidence. Cases without a sibling are check_case.
Judged check_after_sibling(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts);

}  // namespace attnfuzz
