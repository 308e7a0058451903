// poison.cpp - the oob-read detector: relaunch with the guard zones' poison swapped (NaN <-> finite); changed
// output = a read outside the buffers.
#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

Finding poison_swap(Context& c) {
  Finding f;
  if (c.original().o.empty()) return f;
  RunOptions o = c.opts;
  o.guard_poison = c.opts.guard_poison == kGuardPoisonAlt ? kGuardPoison : kGuardPoisonAlt;
  const LaunchOutcome swapped = c.launch(c.tensors(), o);
  if (swapped.launch.status != LaunchStatus::kOk) {
    f.evidence.push_back({"poison-swap", std::string("the relaunch with the other guard poison ended with ") +
                                             launch_status_name(swapped.launch.status) + ": " +
                                             swapped.launch.message});
    return f;
  }
  const BitDiff d = bit_diff(c.problem(), c.original(), swapped);
  const std::string what = fmt("guard poison 0x%08x -> 0x%08x (%s -> %s)", c.opts.guard_poison,
                               o.guard_poison, c.opts.guard_poison == kGuardPoison ? "NaN" : "1.23",
                               o.guard_poison == kGuardPoison ? "NaN" : "1.23");
  if (d.count != 0) {
    f.fired = true;
    f.cls = FailureClass::kOobRead;
    f.evidence.push_back(
        {"poison-swap", fmt("%lld output element(s) change when only the ", (long long)d.count) + what +
                            " around q, k, v, o, lse and workspace changes: the kernel "
                            "reads outside its buffers; first " +
                            d.first()});
  } else {
    f.evidence.push_back(
        {"poison-swap", "output bit-identical under " + what + ": no read of the guard zones"});
  }
  return f;
}

}  // namespace attnfuzz::detect
