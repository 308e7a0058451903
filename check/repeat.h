// repeat.h - repeated calls in one process (issue 30 item 6b): a case checked right after the same shape with
// another scale, mask, dtype or q / k / v strides, so a plan or compiled-graph cache keyed without that parameter
// replays the earlier call (a stale cache).
#pragma once

#include <string>
#include <vector>

#include "check/runner.h"

namespace attnfuzz {

// A call launched right before the case: the parameter it differs in ("scale", "mask", "dtype", "strides"), that
// parameter's value in words ("scale 0.25", "mask none", "dtype f16", "q, k, v strides [B, H, S, D]") and the sibling
// case itself.
struct RepeatSibling {
  std::string differs, value;
  Case sibling;
};

// The siblings of c in the order they are tried: the same shape, values and strides with half the scale (1 when it
// is 0); with the other mask (none <-> causal-br); in the other dtype (f32 <-> f16; generated values only); with
// strides (when the device hands the kernel the strides: not an adapter, which receives contiguous copies) q, k and v
// head-major, [B, H, S, D] (generated values; where that addresses other elements than c's strides). A forward dense
// case without variants only; empty otherwise.
std::vector<RepeatSibling> repeat_siblings(const Case& c, bool strides);

// check_case right after one launch of every sibling the kernel supports, in the order above, on the same device and
// kernel. A failure whose outputs are what a plan kept from one sibling computes (every compared element within its
// bound) is named: class ignored-parameter, decided by repeat-calls/stale-cache, with the evidence naming the parameter
// that sibling differs in. What a kept plan computes: the sibling's exact result (its scale, mask or dtype on the same
// values); for the strides sibling the exact result of the case's own q, k, v buffers read with the sibling's strides.
// Cases without a sibling are check_case.
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

// What a driver adds to check_case, the same in every driver (attn-check, a campaign's workers and its
// minimizer): repeat_calls runs check_after_sibling instead (--repeat-calls); amplify then runs amplify_passing
// on the result (--amplify).
struct CheckModes {
  bool repeat_calls = false;
  bool amplify = false;
};
Judged check_in_modes(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts,
                      CheckModes m);

}  // namespace attnfuzz
