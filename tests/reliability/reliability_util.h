// reliability_util.h - helpers of the reliability tests: run a tool, find a campaign's processes, read OUT.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attnfuzz/corpus.h"

namespace attnfuzz::reliability {

namespace fs = std::filesystem;

struct Outcome {
  int rc;
  std::string out;
  double secs;
};

inline Outcome run(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("$ %s  (%.1f s)\n%s\n", cmd.c_str(), secs, out.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out, secs};
}

inline fs::path fresh(const std::string& name) {
  const fs::path d = fs::absolute(fs::path(TEST_TMP) / name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Whether process `proc` (/proc/PID) has `file` open.
inline bool has_open(const fs::path& proc, const fs::path& file) {
  std::error_code ec;
  for (const auto& fd : fs::directory_iterator(proc / "fd", ec)) {
    std::error_code lec;
    if (fs::read_symlink(fd.path(), lec) == file) return true;
  }
  return false;
}

// Processes whose environment names this campaign's worker configuration (libFuzzer, its jobs, launches),
// or that still hold OUT's lock (a process being torn down has no environment left, but its descriptors).
inline std::vector<pid_t> campaign_processes(const fs::path& out) {
  const std::string needle = "ATTNFUZZ_WORKER_CONFIG=" + (out / "work" / "worker.json").string();
  const fs::path lock = out / "campaign.lock";
  std::vector<pid_t> pids;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || std::stoi(name) == getpid()) continue;
    const std::string env = read_text(e.path() / "environ");
    if (env.find(needle) == std::string::npos && !has_open(e.path(), lock)) continue;
    const std::string stat = read_text(e.path() / "stat");  // zombies are gone already as far as we care
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z') continue;
    pids.push_back(std::stoi(name));
  }
  return pids;
}

// Waits up to `secs` for the campaign's processes to be gone; returns those that remain.
inline std::vector<pid_t> wait_gone(const fs::path& out, double secs) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(secs);
  std::vector<pid_t> left = campaign_processes(out);
  while (!left.empty() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    left = campaign_processes(out);
  }
  return left;
}

// Distinct failures saved in OUT: (kernel, class) -> reasons.
inline std::multimap<std::string, std::pair<std::string, std::string>> failures(const fs::path& out) {
  std::multimap<std::string, std::pair<std::string, std::string>> m;
  for (const auto& e : fs::directory_iterator(out / "failures"))
    if (e.path().extension() == ".case") {
      const CorpusFile f = read_corpus_file(e.path());
      m.emplace(f.verdict->kernel,
                std::make_pair(std::string(failure_class_name(f.verdict->failure)), f.verdict->reason));
    }
  return m;
}

}  // namespace attnfuzz::reliability
