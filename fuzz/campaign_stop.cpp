// campaign_stop.cpp - how a campaign stops: its deadline, SIGINT / SIGTERM / SIGHUP, every kernel
// quarantined, each kernel failed (--stop-when-each-fails); the orderly stop of the workers (SIGINT to their
// jobs) and the SIGKILL after a grace.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

// From SIGINT to SIGKILL of the worker processes when stopping: long enough for libFuzzer's fork-mode process
// to see its interrupted jobs and end by itself under load (1.5 s was too short with ctest -j 2 on 2 cores).
constexpr double kStopGraceS = 3;
constexpr double kStopLeadS =
    1.5;  // the stop begins this long before --max-time (so ends by max-time + 1.5 s)

}  // namespace

double stop_after_s(double max_time_s) {
  if (max_time_s <= 0) return -1;
  return max_time_s >= 10 ? max_time_s - kStopLeadS : max_time_s;
}

Stop::Stop(const CampaignOptions& o, const Paths& p, const Kernels& kernels)
    : p_(p), kernels_(kernels), stop_at_(stop_after_s(o.max_time_s)), stop_when_each_fails_(o.stop_when_each_fails) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGHUP, &sa, &old_hup_);
}

void Stop::restore_signals() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGHUP, &old_hup_, nullptr);
}

bool Stop::every_kernel_in(const std::set<std::string>& or_these) const {
  const std::vector<std::string> q = read_lines(p_.quarantine());
  for (const KernelEntry* k : kernels_)
    if (!or_these.count(k->kernel.name) && std::find(q.begin(), q.end(), k->kernel.name) == q.end()) return false;
  return !kernels_.empty();
}

bool Stop::each_failed() {
  const std::vector<FoundLine> lines = read_found(p_);
  for (; found_lines_ < lines.size(); ++found_lines_) {
    try {
      const CorpusFile f = read_corpus_file(p_.failures / lines[found_lines_].file);
      if (f.verdict) failed_.insert(f.verdict->kernel);
    } catch (const CorpusError&) {  // unreadable: the summary lists it; it names no kernel here
    }
  }
  return every_kernel_in(failed_);
}

void Stop::begin(const Clock& clock, FuzzerProcesses& fuzzers, const char* why) {
  if (why) {
    std::printf("attn-fuzz: %s\n", why);
    std::fflush(stdout);
  }
  stopping_ = true;
  fuzzers.interrupt_jobs();
  kill_at_ = clock.elapsed() + kStopGraceS;
}

void Stop::step(const Clock& clock, FuzzerProcesses& fuzzers) {
  if (g_signal && !stopping_) {
    interrupted_ = true;
    begin(clock, fuzzers, (std::string(strsignal(g_signal)) + ": stopping the workers, then the summary").c_str());
  }
  // Every selected kernel hung once and is quarantined: nothing is left to check (the workers would only
  // count skipped inputs until --max-time).
  if (!stopping_ && every_kernel_in({}))
    begin(clock, fuzzers, "every selected kernel hung and is quarantined: nothing left to check, stopping");
  if (!stopping_ && stop_when_each_fails_ && each_failed())
    begin(clock, fuzzers, "each selected kernel has a failure (--stop-when-each-fails): stopping");
  if (!stopping_ && stop_at_ >= 0 && clock.elapsed() >= stop_at_) begin(clock, fuzzers, nullptr);
  if (stopping_ && clock.elapsed() >= kill_at_)
    fuzzers.kill_all();
  else if (stopping_)
    fuzzers.interrupt_jobs();  // also a job its master started while stopping
}

}  // namespace attnfuzz::fuzz::campaign
