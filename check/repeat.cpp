// repeat.cpp - repeated calls in one process: the stale-cache check (check/repeat.h).
#include "check/repeat.h"

#include <cstdio>

#include "check/compare.h"

namespace attnfuzz {

std::optional<Case> repeat_sibling(const Case& c) {
  if (c.pass != Pass::kFwd || has_sequences(c.problem) || c.problem.variants) return std::nullopt;
  Case s = c;
  s.problem.scale = c.problem.scale != 0 ? c.problem.scale * 0.5f : 1.0f;
  return s;
}

Judged check_after_sibling(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts) {
  const std::optional<Case> sib = repeat_sibling(pc.the_case());
  if (!sib || !case_unsupported_reason(k.kernel, sib->problem, sib->pass).empty())
    return check_case(dev, k, pc, opts);
  PreparedCase sp(*sib);
  const RunOptions ko = for_kernel(opts, k.kernel, sp.problem());
  const LaunchOutcome first = launch_for_pass(dev, k, sp, sp.tensors(), ko);
  Judged j = check_case(dev, k, pc, opts);
  CheckResult& r = j.result;
  if (first.launch.status != LaunchStatus::kOk || r.verdict != Verdict::kFail || j.outcome.o.empty())
    return j;
  CheckResult as_sibling;  // the outputs against the sibling's exact result
  const float* lse = k.kernel.writes_lse && !j.outcome.lse.empty() ? j.outcome.lse.data() : nullptr;
  compare_output(sp.view(), sp.oracle(ko.oracle), j.outcome.o.data(), lse, as_sibling);
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "right after the same shape with scale %.9g, the output is that call's exact result (%lld elements "
      "within its bound): a plan or compiled-graph cache keyed on less than the problem (stale cache)",
      static_cast<double>(sib->problem.scale), static_cast<long long>(as_sibling.compared));
  if (as_sibling.verdict != Verdict::kPass) {
    r.evidence.push_back({"repeat-calls", "checked right after the same shape with scale " +
                                              std::to_string(sib->problem.scale) +
                                              "; the output is not that call's result either"});
    return j;
  }
  r.failure = FailureClass::kIgnoredParameter;
  r.decided_by = "repeat-calls/stale-cache";
  r.evidence.push_back({"repeat-calls", buf});
  return j;
}

}  // namespace attnfuzz
