// campaign_out.cpp - a campaign's OUT directory: the lock (one campaign per OUT), the reset of work/, the
// failures of earlier runs (resume).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

namespace {

// Processes other than this one that have `lock` open (a campaign's processes inherit its descriptor).
std::vector<pid_t> lock_holders(const fs::path& lock) {
  std::vector<pid_t> pids;
  std::error_code ec;
  const fs::path want = fs::weakly_canonical(lock, ec);
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || std::stoi(name) == ::getpid()) continue;
    std::error_code fec;
    for (const auto& fd : fs::directory_iterator(e.path() / "fd", fec)) {
      std::error_code lec;
      if (fs::read_symlink(fd.path(), lec) == want) {
        pids.push_back(std::stoi(name));
        break;
      }
    }
  }
  return pids;
}

// Takes the lock of OUT. When the attn-fuzz that holds it is gone (killed, even by SIGKILL), its processes
// are being ended (PR_SET_PDEATHSIG, the lifeline) but hold the inherited descriptor until the kernel has
// torn down their memory, which takes a while under load: wait for them, up to kOrphanWaitS, so that a
// resume right after a kill works, and never share OUT with a process that is still running.
constexpr double kOrphanWaitS = 10;
bool take_lock(int lock_fd, const fs::path& out, const fs::path& lock_path) {
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) == 0) return true;
  char holder[32] = {0};
  (void)!::pread(lock_fd, holder, sizeof holder - 1, 0);
  for (char& c : holder)
    if (c == '\n') c = 0;
  const pid_t owner = static_cast<pid_t>(std::atol(holder));
  std::vector<pid_t> holders = lock_holders(lock_path);
  const bool owner_alive = owner > 0 && std::find(holders.begin(), holders.end(), owner) != holders.end();
  if (!owner_alive) {
    std::fprintf(
        stderr,
        "attn-fuzz: the campaign that used %s (attn-fuzz pid %s) is gone; waiting up to %.0f s for its "
        "%zu remaining process(es) to end\n",
        out.c_str(), *holder ? holder : "?", kOrphanWaitS, holders.size());
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(kOrphanWaitS);
    while (std::chrono::steady_clock::now() < end) {
      if (::flock(lock_fd, LOCK_EX | LOCK_NB) == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    holders = lock_holders(lock_path);
  }
  std::string pids;
  for (size_t i = 0; i < holders.size() && i < 8; ++i) pids += (i ? " " : "") + std::to_string(holders[i]);
  std::fprintf(stderr,
               "attn-fuzz: %s is in use by another campaign (attn-fuzz pid %s, or its worker processes%s%s): "
               "wait for it to end or use another --out\n",
               out.c_str(), *holder ? holder : "?", pids.empty() ? "" : ": pids ", pids.c_str());
  return false;
}

}  // namespace

bool lock_out(const Paths& p) {
  // An exclusive lock that every process of the campaign inherits (the descriptor stays open across fork
  // and exec), so it is held until the last of them is gone, orphans included.
  std::error_code ec;
  fs::create_directories(p.out, ec);
  const fs::path lock_path = p.out / "campaign.lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  if (lock_fd < 0) {
    std::fprintf(stderr, "attn-fuzz: cannot open %s: %s\n", lock_path.c_str(), std::strerror(errno));
    return false;
  }
  if (!take_lock(lock_fd, p.out, lock_path)) {
    ::close(lock_fd);
    return false;
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  (void)!::ftruncate(lock_fd, 0);
  (void)!::pwrite(lock_fd, me.data(), me.size(), 0);
  return true;  // lock_fd stays open: the lock lasts as long as the campaign's processes
}

bool reset_work(const Paths& p) {
  std::error_code ec;
  const fs::path& work = p.work;
  for (const fs::path& d : {p.inputs, p.artifacts, work / "stats", work / "dedup", work / "featcache"})
    fs::remove_all(d, ec);
  for (const char* f : {"isolate.txt", "quarantine.txt", "deaths.txt", "faults.txt", "throttle.txt"})
    fs::remove(work / f, ec);
  for (const fs::path& d :
       {p.out, work, p.inputs, p.artifacts, work / "stats", work / "dedup", p.failures, p.corpus}) {
    fs::create_directories(d, ec);
    if (ec) {
      std::fprintf(stderr, "attn-fuzz: cannot create %s: %s\n", d.c_str(), ec.message().c_str());
      return false;
    }
  }
  return true;
}

std::vector<Failure> read_failures(const fs::path& dir, std::vector<Skipped>* skipped, bool report_skips) {
  std::vector<Failure> out;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == kCaseFileExtension) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    try {
      CorpusFile cf = read_corpus_file(f);
      if (!cf.verdict || cf.verdict->verdict != Verdict::kFail) continue;
      Failure x{f, std::move(cf), dir.parent_path() / "minimized" / f.filename(), std::nullopt};
      if (fs::exists(x.minimal_path, ec)) {
        try {
          x.minimal = read_corpus_file(x.minimal_path);
        } catch (const CorpusError&) {  // a minimal case that does not read: the failure as found is shown
        }
      }
      out.push_back(std::move(x));
    } catch (const CorpusError& e) {
      if (skipped) {
        if (report_skips) std::fprintf(stderr, "attn-fuzz: skipping unreadable failure file: %s\n", e.what());
        skipped->push_back({f, e.what()});
      }
    }
  }
  return out;
}

void claim_earlier_failures(const Paths& p) {
  std::vector<Skipped> skipped;  // reported on stderr now, listed again in the summary
  for (const Failure& f : read_failures(p.failures, &skipped)) {
    const RecordedVerdict& v = *f.file.verdict;
    std::ofstream(p.work / "dedup" / failure_key(v))
        << v.kernel << " " << failure_class_name(v.failure) << "\n";
    if (v.failure == FailureClass::kHang) append_line(p.quarantine(), v.kernel);
  }
}

}  // namespace attnfuzz::fuzz::campaign
