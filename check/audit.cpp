// audit.cpp - race and memory audit of cases that PASS (compute-sanitizer on nvidia, thread orders / TSan on
// the cpu): a GPU-latent race gives plausible output, so a pass is audited before it is believed.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "check/classify.h"
#include "check/detectors/detectors.h"

namespace attnfuzz {

AuditStats audit_passing_case(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts,
                              Judged& j, const ClassifyOptions& co) {
  AuditStats a;
  CheckResult& r = j.result;
  if (r.verdict != Verdict::kPass || !dev.usable() || j.outcome.o.empty()) return a;
  const auto t0 = std::chrono::steady_clock::now();
  ClassifyStats stats;
  detect::Context c{dev, k, pc, opts, j, co, stats, {}};
  std::vector<detect::Finding> findings;
  std::string tools;
  auto run = [&](const char* name, detect::Finding (*fn)(detect::Context&)) {
    a.ran = true;
    tools += (tools.empty() ? "" : ", ") + std::string(name);
    try {
      findings.push_back(fn(c));
    } catch (const std::exception& e) {
      detect::Finding f;
      f.evidence.push_back({name, std::string("could not run: ") + e.what()});
      findings.push_back(f);
    }
  };
  if (dev.backend() == Backend::kNvidia) {
    run("compute-sanitizer", detect::compute_sanitizer_tools);
  } else if (dev.backend() == Backend::kCpu) {
    run("schedule", detect::schedule);
    if (co.tsan) run("tsan", detect::tsan);
  }
  // The class of highest precedence among the findings that fired.
  FailureClass cls = FailureClass::kNone;
  std::vector<Evidence> evidence;
  const auto& order = class_precedence();
  auto rank = [&](FailureClass x) { return std::find(order.begin(), order.end(), x) - order.begin(); };
  for (const detect::Finding& f : findings) {
    evidence.insert(evidence.end(), f.evidence.begin(), f.evidence.end());
    if (f.fired && (cls == FailureClass::kNone || rank(f.cls) < rank(cls))) cls = f.cls;
  }
  a.launches = stats.launches;
  a.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (cls != FailureClass::kNone) {
    a.found = true;
    r.verdict = Verdict::kFail;
    r.failure = cls;
    r.reason = std::string("audit of a passing case: ") + tools + " found a " + failure_class_name(cls) +
               " hazard although the output is within its bound (GPU-latent: another schedule or GPU may " +
               "give a wrong result)";
    r.evidence.push_back({"audit", "the output passed; " + tools + " found hazards (" +
                                       std::to_string(stats.launches) + " extra launch(es), " +
                                       detect::fmt("%.0f ms", a.ms) + "): " + failure_class_name(cls)});
    r.evidence.insert(r.evidence.end(), evidence.begin(), evidence.end());
  }
  if (!c.case_file.empty() && co.work_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::path(c.case_file).parent_path(), ec);
  }
  return a;
}

}  // namespace attnfuzz
