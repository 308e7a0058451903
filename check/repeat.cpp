// repeat.cpp - repeated calls in one process: the stale-cache check (check/repeat.h).
#include "check/repeat.h"

#include <cstdio>
#include <memory>

#include "check/compare.h"

namespace attnfuzz {

std::vector<RepeatSibling> repeat_siblings(const Case& c) {
  std::vector<RepeatSibling> out;
  if (c.pass != Pass::kFwd || has_sequences(c.problem) || c.problem.variants) return out;
  auto add = [&](const char* differs, Case s, std::string value) {
    if (validate(s).empty()) out.push_back({differs, std::move(value), std::move(s)});
  };
  Case s = c;
  s.problem.scale = c.problem.scale != 0 ? c.problem.scale * 0.5f : 1.0f;
  char num[40];
  std::snprintf(num, sizeof num, "scale %.9g", static_cast<double>(s.problem.scale));
  add("scale", s, num);
  s = c;
  if (parse_mask(c.problem.mask_kind == AF_MASK_NONE ? "causal-br" : "none", s.problem).empty())
    add("mask", s, "mask " + mask_to_string(s.problem));
  const int32_t dt = c.problem.dtype;
  if (!c.explicit_values && (dt == AF_DTYPE_F32 || dt == AF_DTYPE_F16 || dt == AF_DTYPE_BF16)) {
    s = c;
    s.problem.dtype = dt == AF_DTYPE_F32 ? AF_DTYPE_F16 : AF_DTYPE_F32;
    add("dtype", s, std::string("dtype ") + dtype_name(s.problem.dtype));
  }
  return out;
}

Judged check_after_sibling(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts) {
  // Every sibling is launched before the case, so each is the first call of whatever key a cache gives it: a cache
  // keyed without the mask alone then serves the case the mask sibling's plan (had the case run between them, it
  // would serve the case its own plan, and nothing would show).
  struct Launched {
    const RepeatSibling* sib;
    std::unique_ptr<PreparedCase> pc;
    RunOptions ko;
  };
  const std::vector<RepeatSibling> sibs = repeat_siblings(pc.the_case());
  std::vector<Launched> ran;
  for (const RepeatSibling& sib : sibs) {
    if (!case_unsupported_reason(k.kernel, sib.sibling.problem, sib.sibling.pass).empty()) continue;
    auto sp = std::make_unique<PreparedCase>(sib.sibling);
    const RunOptions ko = for_kernel(opts, k.kernel, sp->problem());
    if (launch_for_pass(dev, k, *sp, sp->tensors(), ko).launch.status == LaunchStatus::kOk)
      ran.push_back({&sib, std::move(sp), ko});
  }
  Judged j = check_case(dev, k, pc, opts);
  CheckResult& r = j.result;
  if (ran.empty() || r.verdict != Verdict::kFail || j.outcome.o.empty()) return j;
  const float* lse = k.kernel.writes_lse && !j.outcome.lse.empty() ? j.outcome.lse.data() : nullptr;
  std::string values;
  for (Launched& l : ran) {
    CheckResult as_sibling;  // the outputs against the sibling's exact result
    compare_output(l.pc->view(), l.pc->oracle(l.ko.oracle), j.outcome.o.data(), lse, as_sibling);
    values += (values.empty() ? "" : ", ") + l.sib->value;
    if (as_sibling.verdict != Verdict::kPass) continue;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "right after the same shape with %s, the output is that call's exact result (%lld elements within "
                  "its bound): a plan or compiled-graph cache keyed without the %s (stale cache)",
                  l.sib->value.c_str(), static_cast<long long>(as_sibling.compared), l.sib->differs.c_str());
    r.failure = FailureClass::kIgnoredParameter;
    r.decided_by = "repeat-calls/stale-cache";
    r.evidence.push_back({"repeat-calls", buf});
    return j;
  }
  r.evidence.push_back({"repeat-calls", "checked right after the same shape with " + values +
                                            "; the output is none of those calls' results"});
  return j;
}

Judged check_repeated(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts, bool repeat_calls) {
  return repeat_calls ? check_after_sibling(dev, k, pc, opts) : check_case(dev, k, pc, opts);
}

}  // namespace attnfuzz
