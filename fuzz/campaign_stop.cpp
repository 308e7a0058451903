// campaign_stop.cpp - how a campaign stops: its deadline, SIGINT / SIGTERM / SIGHUP, every kernel
// quarantined; the orderly stop of the workers (SIGINT to their jobs) and the SIGKILL after a grace.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

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
    : p_(p), kernels_(kernels), stop_at_(stop_after_s(o.max_time_s)) {
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

bool Stop::all_quarantined() const {
  const std::vector<std::string> q = read_lines(p_.quarantine());
  for (const KernelEntry* k : kernels_)
    if (std::find(q.begin(), q.end(), k->kernel.name) == q.end()) return false;
  return !kernels_.empty();
}

void Stop::step(const Clock& clock, FuzzerProcesses& fuzzers) {
  if (g_signal && !stopping_) {
    interrupted_ = true;
    std::printf("attn-fuzz: %s: stopping the workers, then the summary\n", strsignal(g_signal));
    std::fflush(stdout);
  }
  // Every selected kernel hung once and is quarantined: nothing is left to check (the workers would only
  // count skipped inputs until --max-time).
  if (!stopping_ && !g_signal && all_quarantined()) {
    std::printf(
        "attn-fuzz: every selected kernel hung and is quarantined: nothing left to check, stopping\n");
    std::fflush(stdout);
    stopping_ = true;
    fuzzers.interrupt_jobs();
    kill_at_ = clock.elapsed() + kStopGraceS;
  }
  if (!stopping_ && (g_signal || (stop_at_ >= 0 && clock.elapsed() >= stop_at_))) {
    stopping_ = true;
    fuzzers.interrupt_jobs();
    kill_at_ = clock.elapsed() + kStopGraceS;
  }
  if (stopping_ && clock.elapsed() >= kill_at_)
    fuzzers.kill_all();
  else if (stopping_)
    fuzzers.interrupt_jobs();  // also a job its master started while stopping
}

}  // namespace attnfuzz::fuzz::campaign
