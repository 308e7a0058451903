// campaign_minimize.cpp - a campaign's distinct failures shrunk to their minimal cases before the summary, in a
// child process (the worker binary): a kernel that kills that process or faults its GPU context while it is shrunk
// costs its own minimization only, and the failures after it get a fresh process.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz {

namespace {

using Steady = std::chrono::steady_clock;
double since(Steady::time_point t) { return std::chrono::duration<double>(Steady::now() - t).count(); }

constexpr double kMaxEach = 30;  // seconds for one failure at the most: the budget goes to many

}  // namespace

int minimize_jobs(const WorkerConfig& cfg, const std::string& jobs_path) {
  Json j;
  try {
    std::ifstream in(jobs_path);
    j = Json::parse(in);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz-worker: %s: %s\n", jobs_path.c_str(), e.what());
    return 2;
  }
  const Json& items = j.at("items");
  const size_t n = items.size(), first = j.at("first").get<size_t>();
  const double budget = j.at("budget_s").get<double>();
  const bool quiet = j.at("quiet").get<bool>();
  const std::string done = j.at("done").get<std::string>();
  Minimizer mz(cfg);
  const auto t0 = Steady::now();
  int rc = 0;
  for (size_t i = first; i < n; ++i) {
    const double left = budget - since(t0);
    if (left < 1) {
      if (!quiet)
        std::printf("minimize: budget spent; %zu distinct failure(s) not minimized (attn-fuzz --minimize FILE, or "
                    "--minimize-budget)\n", n - i);
      break;
    }
    // An even share of what is left, at least a second (ordinary inputs come first, so they get theirs).
    const double each = std::min(kMaxEach, std::max(1.0, left / static_cast<double>(n - i)));
    const Json& it = items[i];
    const std::string source = it.at("source").get<std::string>(), minimal = it.at("minimal").get<std::string>();
    auto outcome = [&](const char* what) { append_line(done, std::to_string(i) + " " + what); };
    CorpusFile cf;
    try {
      cf = read_corpus_file(source);
    } catch (const CorpusError& e) {
      if (!quiet) std::printf("minimize %zu/%zu: not minimized: %s\n", i + 1, n, e.what());
      outcome("not");
      continue;
    }
    const RecordedVerdict& v = *cf.verdict;
    if (!quiet) {
      std::printf("minimize %zu/%zu: %s %s (%.0f s) ... ", i + 1, n, v.kernel.c_str(), failure_class_name(v.failure),
                  each);
      std::fflush(stdout);
    }
    Minimized m;
    if (const std::string e = mz.minimize(cf, source, each, 5000, m, it.at("forked").get<bool>()); !e.empty()) {
      if (!quiet) std::printf("not minimized: %s\n", e.c_str());
      outcome(mz.device_failed() ? "device" : "not");
      if (mz.device_failed() && i + 1 < n) {  // the rest in a fresh process (a GPU fault is sticky in this one)
        rc = kMinimizeFreshProcess;
        break;
      }
      continue;
    }
    try {
      write_corpus_file(minimal, m.file);
    } catch (const CorpusError& err) {
      if (!quiet) std::printf("not written: %s\n", err.what());
      outcome("not");
      continue;
    }
    if (!quiet)
      std::printf("%s -> %s, %d check(s), %.1f s%s\n", campaign::shape(cf.the_case.problem).c_str(),
                  campaign::shape(m.file.the_case.problem).c_str(), m.checks, m.secs,
                  m.left.empty() ? "" : ("; its budget ran out: " + m.left).c_str());
    outcome("ok");
  }
  append_line(done, "adapters " + std::to_string(mz.adapter_starts()));
  std::fflush(stdout);
  return rc;
}

namespace campaign {

namespace {

double budget_of(const CampaignOptions& o) {
  if (o.minimize_budget_s >= 0) return o.minimize_budget_s;
  return std::min(300.0, o.max_time_s > 0 ? o.max_time_s / 10 : 30.0);
}

// Waits for the minimizing process until `deadline` (then kills its group); its wait status.
int wait_until(pid_t pid, Steady::time_point deadline) {
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) == 0) {
    if (Steady::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return st;
}

std::string death_of(int st) {
  if (WIFSIGNALED(st)) return std::string("signal ") + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
  return "exit status " + std::to_string(WEXITSTATUS(st));
}

}  // namespace

void minimize_failures(const CampaignOptions& o, const Paths& p, const std::vector<std::string>& isolated,
                       std::vector<Failure>& found) {
  const double budget = budget_of(o);
  std::vector<Failure*> todo;
  for (Failure& f : found)
    if (!f.minimal && f.file.verdict->failure != FailureClass::kHang) todo.push_back(&f);
  if (budget <= 0 || todo.empty()) return;
  // Ordinary inputs first; crashes last: on a GPU a crash can leave the device context unusable, and the process
  // minimizing after it must then be replaced (a fresh one goes on).
  std::stable_sort(todo.begin(), todo.end(), [](const Failure* a, const Failure* b) {
    const bool ca = a->file.verdict->failure == FailureClass::kCrash;
    const bool cb = b->file.verdict->failure == FailureClass::kCrash;
    if (ca != cb) return cb;
    return input_tier(a->file.the_case) < input_tier(b->file.the_case);
  });
  std::error_code ec;
  fs::create_directories(p.out / "minimized", ec);
  Json items = Json::array();
  for (const Failure* f : todo) {
    // A kernel that killed a worker in-process is launched forked here too (the summary must still be written).
    const bool forked =
        std::find(isolated.begin(), isolated.end(), f->file.verdict->kernel) != isolated.end();
    items.push_back({{"source", f->path.string()}, {"minimal", f->minimal_path.string()}, {"forked", forked}});
  }
  const fs::path jobs = fs::absolute(p.work / "minimize.json"), done = fs::absolute(p.work / "minimize.done");
  const auto t0 = Steady::now();
  std::vector<std::string> outcome(todo.size());
  size_t next = 0;
  int adapters = 0, processes = 0;
  // One process (one device, one adapter) for every failure; a fresh one after a failed device or a death.
  while (next < todo.size()) {
    const double left = budget - since(t0);
    std::ofstream(jobs) << Json{{"items", items}, {"first", next}, {"budget_s", left},
                                {"quiet", o.quiet}, {"done", done.string()}}.dump() << "\n";
    fs::remove(done, ec);
    std::fflush(stdout);
    const pid_t pid = spawn({o.worker_binary}, {{kWorkerConfigEnv, fs::absolute(p.work / "worker.json").string()},
                                                {kMinimizeEnv, jobs.string()}},
                            p.work / "minimize.log", true);
    if (pid < 0) {
      std::fprintf(stderr, "attn-fuzz: cannot start %s to minimize: %s\n", o.worker_binary.c_str(), strerror(errno));
      break;
    }
    ++processes;
    // Past the budget the process gets the longest check's grace (an adapter's start, a compilation) and no more.
    const int st = wait_until(pid, t0 + std::chrono::duration_cast<Steady::duration>(
                                            std::chrono::duration<double>(budget + kMaxEach + 120)));
    const size_t from = next;
    for (const std::string& line : read_lines(done.string())) {
      std::istringstream in(line);
      std::string a, b;
      in >> a >> b;
      if (a == "adapters") {
        adapters += std::atoi(b.c_str());
      } else if (const size_t i = std::strtoul(a.c_str(), nullptr, 10); i < todo.size()) {
        outcome[i] = b;
        next = std::max(next, i + 1);
      }
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) break;
    if (WIFEXITED(st) && WEXITSTATUS(st) == kMinimizeFreshProcess && next > from) continue;
    // It died while minimizing todo[next] (its progress line is open): that failure stays as found.
    if (next >= todo.size()) break;
    if (!o.quiet)
      std::printf("not minimized: the minimizing process died (%s; work/minimize.log); %s\n", death_of(st).c_str(),
                  next + 1 < todo.size() ? "a fresh one goes on" : "it was the last");
    outcome[next++] = "died";
  }
  size_t ok = 0, tried = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    tried += !outcome[i].empty();
    if (outcome[i] != "ok") continue;
    try {
      todo[i]->minimal = read_corpus_file(todo[i]->minimal_path);
      ++ok;
    } catch (const CorpusError& e) {
      if (!o.quiet) std::printf("minimize: %s\n", e.what());
    }
  }
  if (o.quiet) return;
  std::printf("minimize: %zu of %zu failure(s) minimized in %.1f s (budget %.0f s)", ok, tried, since(t0), budget);
  if (processes > 1) std::printf(" by %d processes", processes);
  if (adapters) std::printf(", %d adapter process(es) started", adapters);
  std::printf("\n");
}

}  // namespace campaign
}  // namespace attnfuzz::fuzz
