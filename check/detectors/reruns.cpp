// reruns.cpp - bitwise reruns of the failing case with unchanged settings: any bit difference is a barrier
// race.
#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

Finding reruns(Context& c) {
  Finding f;
  const bool cpu = c.dev.backend() == Backend::kCpu;
  const int n = cpu ? c.co.cpu_reruns : c.co.reruns;
  if (n <= 0 || c.original().o.empty()) return f;
  int differ = 0;
  BitDiff first;
  for (int i = 0; i < n; ++i) {
    const LaunchOutcome again = c.launch(c.tensors());
    if (again.launch.status != LaunchStatus::kOk) {
      f.evidence.push_back({"reruns", "rerun " + std::to_string(i + 1) + " ended with " +
                                          launch_status_name(again.launch.status) + ": " +
                                          again.launch.message});
      ++differ;
      continue;
    }
    BitDiff d = launch_diff(c, c.original(), again);
    if (d.count != 0 && !c.nan_payloads_vary &&
        bit_diff(c.problem(), c.original(), again, false).count == 0) {
      c.nan_payloads_vary = true;  // only NaN signs / payloads differ: not a value the schedule changed
      f.evidence.push_back({"reruns", "rerun " + std::to_string(i + 1) +
                                          " differs from the checked launch only in the "
                                          "sign / payload of NaNs (" +
                                          d.first() +
                                          "): NaNs are compared by value from "
                                          "here on, not by bits"});
      d = launch_diff(c, c.original(), again);
    }
    if (d.count != 0) {
      if (differ == 0) first = d;
      ++differ;
    }
  }
  if (differ) {
    f.fired = true;
    f.cls = FailureClass::kBarrierRace;
    f.unreliable_baseline = true;
    f.evidence.push_back(
        {"reruns", fmt("%d of %d bitwise reruns with the same inputs and settings differ from the "
                       "checked launch: the result depends on the schedule; first difference ",
                       differ, n) +
                       first.first() + fmt(" (%lld element(s))", (long long)first.count)});
  } else {
    c.deterministic = true;
    f.evidence.push_back(
        {"reruns",
         fmt("%d bitwise reruns are identical%s%s", n, c.nan_payloads_vary ? " (NaNs compared by value)" : "",
             cpu ? ""
                 : " (a GPU schedule can be deterministic and still racy: the cpu backend's "
                   "thread orders and --tsan, or compute-sanitizer racecheck, settle it)")});
  }
  return f;
}

}  // namespace attnfuzz::detect
