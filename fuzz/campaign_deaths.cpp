// campaign_deaths.cpp - worker processes that died: their libFuzzer artifacts become crash / hang failures,
// and the campaign counts them and says what ended each.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

void ArtifactScanner::scan() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p_.artifacts, ec)) {
    const std::string name = e.path().filename().string();
    if (seen_.count(name)) continue;
    const bool timeout = name.rfind("timeout-", 0) == 0;
    if (!timeout && name.rfind("crash-", 0) != 0 && name.rfind("oom-", 0) != 0) continue;
    seen_.insert(name);
    ++(timeout ? hangs_ : crashes_);
    take(name);
  }
}

// An in-process death: the worker's crash hook wrote which kernel ran this very input (work/faults.txt,
// linked by the input's hash), and where it faulted if that was in a buffer's guard pages. Its fields
// (kernel, access, buffer, offset, what, hash), or none.
std::vector<std::string> ArtifactScanner::fault_of(const std::string& bytes) {
  std::vector<std::string> fault;
  const std::vector<std::string> lines = read_lines_all(p_.work / "faults.txt");
  fault_taken_.resize(lines.size(), false);
  const std::string h =
      std::to_string(input_hash(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  for (size_t i = 0; i < lines.size() && fault.empty(); ++i) {
    std::vector<std::string> f;
    std::stringstream ss(lines[i]);
    for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
    if (fault_taken_[i] || f.size() != 6 || f[5] != h) continue;
    fault_taken_[i] = true;
    fault = f;
  }
  return fault;
}

// One new artifact (crash-, oom- or timeout-<hash>): a failure of the kernel that ran it, saved like any
// other.
void ArtifactScanner::take(const std::string& name) {
  const WorkerConfig& cfg = o_.worker;
  const bool timeout = name.rfind("timeout-", 0) == 0, oom = name.rfind("oom-", 0) == 0;
  const std::string bytes = read_all(p_.artifacts / name);
  const FuzzInput in = decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), cfg.limits);
  const KernelEntry* k = kernel_for(in, kernels_, read_lines(p_.quarantine()));
  // The kernel the input maps to now may differ from the one that ran it (a kernel quarantined since then
  // shifts the choice): the crash hook's record names the one that ran.
  const std::vector<std::string> fault =
      name.rfind("crash-", 0) == 0 ? fault_of(bytes) : std::vector<std::string>{};
  if (!fault.empty())
    for (const KernelEntry* c : kernels_)
      if (c->kernel.name == fault[0]) k = c;
  const std::string lf_why = timeout
                                 ? "libFuzzer -timeout (" + std::to_string(lf_timeout_) + " s)"
                                 : "libFuzzer rss limit (-rss_limit_mb=" + std::to_string(kRssLimitMb) + ")";
  if (!k) {
    ++ended_by_[(timeout || oom ? lf_why : std::string("crash")) + " on an input no selected kernel runs"];
    return;
  }
  if (mps_) {  // maybe another client's fault (a copy failing after it, or a spin starving this one)
    save_mps_suspect(cfg, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++ended_by_["died under MPS (" + name.substr(0, name.find('-')) + "), its input re-run alone"];
    return;
  }
  if (timeout) append_line(p_.quarantine(), k->kernel.name);
  if (isolated_.insert(k->kernel.name).second) {
    if (cfg.isolate == "auto") append_line(p_.isolate(), k->kernel.name);
    if (!o_.quiet && cfg.isolate == "auto")
      std::printf("attn-fuzz: a worker process died in %s (%s): its launches are isolated from now on\n",
                  k->kernel.name, timeout ? "timeout" : "crash");
  }
  CheckResult r;
  r.kernel = k->kernel.name;
  r.backend = cfg.backend;
  r.device = "libFuzzer worker process";
  r.verdict = Verdict::kFail;
  r.failure = timeout ? FailureClass::kHang : FailureClass::kCrash;
  r.reason = std::string("the worker process ") + (timeout ? "timed out" : "died") +
             " on this input (libFuzzer " + name + ")";
  // An in-process fault in a buffer's guard pages: named like an isolated launch names it.
  if (!fault.empty() && std::atoi(fault[1].c_str()) >= 0) {
    const int access = std::atoi(fault[1].c_str());
    r.failure = access == 1   ? FailureClass::kOobRead
                : access == 2 ? FailureClass::kOobWrite
                              : FailureClass::kCrash;
    r.reason = std::string("the kernel ") +
               (access == 1   ? "read"
                : access == 2 ? "wrote"
                              : "accessed memory") +
               " " + fault[4] +
               ", in the guard pages around it (the access faulted in-process and ended the " +
               "worker process; libFuzzer " + name + ")";
    r.evidence.push_back({"guard-page", "buffer " + fault[2] + " byte offset " + fault[3] +
                                            (access == 1   ? ": read"
                                             : access == 2 ? ": write"
                                                           : "")});
  }
  r.evidence.push_back({"libfuzzer", (p_.work / "artifacts" / name).string()});
  ++ended_by_[timeout || oom ? lf_why + " in kernel " + k->kernel.name
                             : std::string(failure_class_name(r.failure)) + " in kernel " + k->kernel.name +
                                   " (in-process)"];
  try {
    save_failure(cfg, in.the_case, r, {});
  } catch (const std::exception& err) {
    std::fprintf(stderr, "attn-fuzz: warning: %s\n", err.what());
  }
}

WorkerDeaths count_deaths(const FuzzerLine& lf, const ArtifactScanner& artifacts, const Paths& p) {
  WorkerDeaths d;
  int64_t hooked_crashes = 0;  // in-process deaths the workers' crash hook recorded
  for (const std::string& l : read_lines_all(p.deaths())) hooked_crashes += l.rfind("crash ", 0) == 0;
  d.crashes = std::max({lf.crashes, artifacts.crashes(), hooked_crashes});
  int64_t watchdog_hangs = 0;
  for (const std::string& l : read_lines(p.deaths())) watchdog_hangs += l.rfind("hang ", 0) == 0;
  d.hangs = std::max(lf.timeouts, artifacts.hangs()) + watchdog_hangs;
  d.lf_timeouts = lf.timeouts;
  return d;
}

std::map<std::string, int64_t> death_reasons(const WorkerDeaths& d, const ArtifactScanner& artifacts,
                                             const Paths& p, const FuzzerProcesses& fuzzers) {
  std::map<std::string, int64_t> ended = artifacts.ended_by();
  for (const std::string& l : read_lines(p.deaths()))
    if (l.rfind("hang ", 0) == 0)
      ++ended["hang in kernel " + l.substr(5) + " (the in-process hang watchdog)"];
  if (const int64_t n = d.crashes - artifacts.crashes(); n > 0) {
    const std::string err = fuzzers.first_error();
    ended["non-zero exit without an artifact" + (err.empty() ? std::string() : " (" + err + ")")] += n;
  }
  if (const int64_t n = d.lf_timeouts - artifacts.hangs(); n > 0)
    ended["libFuzzer -timeout without an artifact"] += n;
  return ended;
}

}  // namespace attnfuzz::fuzz::campaign
