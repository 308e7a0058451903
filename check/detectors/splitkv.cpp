// splitkv.cpp - the split-kv detector: re-runs a failing case with every KV split count the kernel declares.
//
// A kernel declares its split count as an ABI v2 tunable with role AF_TUNABLE_KV_SPLITS and the values it
// accepts. The exact result does not depend on the split, so a correct kernel passes at every count; a
// failure that appears at some counts and vanishes at others is in the split / combine (docs/semantics.md
// `split-kv`). A failure present at every count says nothing about the split and the detector stays silent.
#include <algorithm>

#include "check/compare.h"
#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

namespace {

// The outcome of the case at one split count.
struct AtCount {
  int32_t value = 0;
  bool as_checked = false;  // the count the original check used
  bool ran = false;         // false: the kernel refused the case at this count (why)
  bool fail = false;
  double ratio = 0;  // max err/bound
  std::string why;   // unsupported reason / launch failure / canaries
};

std::string describe(const AtCount& a) {
  std::string s = std::to_string(a.value) + (a.as_checked ? " (as checked)" : "") + ": ";
  if (!a.ran) return s + "not run (" + a.why + ")";
  if (!a.fail) return s + "pass (err/bound " + num(a.ratio) + ")";
  return s + "FAIL" + (a.why.empty() ? " (err/bound " + num(a.ratio) + ")" : " (" + a.why + ")");
}

}  // namespace

Finding split_kv(Context& c) {
  Finding f;
  const af_kernel& k = c.k.kernel;
  int32_t knob = -1;
  for (int32_t t = 0; t < k.n_tunables && t < AF_MAX_TUNABLES && k.tunables; ++t)
    if (k.tunables[t].role == AF_TUNABLE_KV_SPLITS) {
      knob = t;
      break;
    }
  if (knob < 0) {
    f.evidence.push_back({"split-kv",
                          "not run: the kernel declares no KV-split tunable (ABI v2 af_tunable with "
                          "role AF_TUNABLE_KV_SPLITS), so its split count could not be varied"});
    return f;
  }
  const af_tunable& tu = k.tunables[knob];
  Problem checked = c.pc.problem();  // what the kernel ran (a sequence layout's own problem, not its dense view)
  resolve_tunables(k, checked);      // the values the original launch ran with
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);

  std::vector<AtCount> runs;
  std::vector<int32_t> seen;
  for (int32_t i = 0; i < tu.n_values && i < AF_MAX_TUNABLE_VALUES; ++i) {
    const int32_t v = tu.values[i];
    if (std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
    seen.push_back(v);
    AtCount a;
    a.value = v;
    if (v == checked.tunables[knob]) {  // the original check
      a.as_checked = a.ran = a.fail = true;
      a.ratio = c.j.result.max_ratio;
      runs.push_back(a);
      continue;
    }
    Problem p = checked;
    p.tunables[knob] = v;
    if (std::string why = unsupported_reason(k, p); !why.empty()) {
      a.why = why;
      runs.push_back(a);
      continue;
    }
    ++c.stats.launches;
    const LaunchOutcome out = launch_guarded(c.dev, c.k, p, c.tensors(), c.opts);
    a.ran = true;
    if (out.launch.status != LaunchStatus::kOk) {
      a.fail = true;
      a.why = "launch: " + out.launch.message;
    } else if (out.canary_words) {
      a.fail = true;
      a.why = std::to_string(out.canary_words) + " guard word(s) overwritten";
    } else {
      const CheckResult r = judge(c.problem(), ex, out);  // outputs come back indexed like the view
      a.fail = r.verdict == Verdict::kFail;
      a.ratio = r.max_ratio;
    }
    runs.push_back(a);
    if (!c.dev.usable()) break;  // a GPU fault: no further launch can run
  }

  std::vector<int32_t> pass, fail;
  std::string line;
  for (const AtCount& a : runs) {
    line += (line.empty() ? "" : "; ") + describe(a);
    if (a.ran) (a.fail ? fail : pass).push_back(a.value);
  }
  auto list = [](const std::vector<int32_t>& v) {
    std::string s;
    for (int32_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
    return s;
  };
  f.evidence.push_back({"split-kv", std::string(tu.name) + " " + line});
  if (!pass.empty() && !fail.empty()) {
    f.fired = true;
    f.cls = FailureClass::kSplitKv;
    f.evidence.push_back(
        {"split-kv",
         "the failure appears or vanishes with the KV split count (the exact result does not "
         "depend on it): " +
             std::string(tu.name) + " = " + list(fail) + " FAIL, " + list(pass) +
             " pass; look at the split bounds and the combine"});
  } else if (!fail.empty()) {
    f.evidence.push_back({"split-kv", "fails at every " + std::string(tu.name) + " tried (" + list(fail) +
                                          "): not a split / combine signature"});
  }
  return f;
}

}  // namespace attnfuzz::detect
