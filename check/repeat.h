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

// The amplified-parameter relaunch (attn-check --amplify; check/detectors/amplify.cpp): after a passing
// forward check (j) of a dense case whose variant (sink, softcap, ALiBi, bias, a custom mask, per-head
// descales; one the kernel declares) changes the exact result by less than the bound, a sibling case with
// that parameter amplified (the sink at the row LSE, the cap at a quarter of the largest score, slopes / bias
// scaled to 8, every other shown key hidden, per-head descales off the per-tensor ones) until the exact
// results with and without it are far apart (no output within both bounds). A sibling output within the bound
// of the result without it, beyond the one with it, turns j into a failure: class ignored-parameter, decided
// by amplify, naming the parameter. A correct kernel cannot match both, so it is never failed.
void amplify_passing(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts, Judged& j);

}  // namespace attnfuzz
