// campaign.cpp - attn-fuzz's parent process: corpus in and out, libFuzzer fork-mode workers, progress,
// artifacts, distinct failures, summary; and the minimizer.
#include "fuzz/campaign.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "attnfuzz/report.h"
#include "fuzz/mps.h"
#include "fuzz/sync.h"

namespace fs = std::filesystem;

namespace attnfuzz::fuzz {

namespace {

std::atomic<int> g_signal{0};
// From SIGINT to SIGKILL of the worker processes when stopping: long enough for libFuzzer's fork-mode process
// to see its interrupted jobs and end by itself under load (1.5 s was too short with ctest -j 2 on 2 cores).
constexpr double kStopGraceS = 3;
constexpr double kStopLeadS = 1.5;  // the stop begins this long before --max-time (so ends by max-time + 1.5 s)
constexpr int kRssLimitMb = 4096;     // libFuzzer's -rss_limit_mb of a worker process
void on_signal(int sig) { g_signal = sig; }

std::string hex16(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  write_file_atomically(p, {reinterpret_cast<const char*>(b.data()), b.size()});
}

std::string shape(const Problem& p) {
  char b[160];
  std::snprintf(b, sizeof b, "B=%lld H=%lld/%lld %lldx%lld D=%lld%s %s", (long long)p.batch,
                (long long)p.heads_q, (long long)p.heads_kv, (long long)p.seq_q, (long long)p.seq_k,
                (long long)p.head_dim,
                p.head_dim_v != p.head_dim ? ("/" + std::to_string(p.head_dim_v)).c_str() : "",
                mask_to_string(p).c_str());
  if (has_sequences(p)) return std::string(b) + " " + layout_name(p);  // Sq x Sk: the largest lengths
  return b;
}

// The kernel index (into the selection) an input should select for a corpus case: its fuzz label or its
// recorded kernel, else none (-1).
int kernel_index_of(const CorpusFile& cf, const std::vector<const KernelEntry*>& ks) {
  std::string name;
  if (cf.verdict) name = cf.verdict->kernel;
  if (cf.the_case.label.rfind("fuzz-", 0) == 0) name = cf.the_case.label.substr(5);
  for (size_t i = 0; i < ks.size(); ++i)
    if (name == ks[i]->kernel.name) return static_cast<int>(i);
  return -1;
}

// The kernel a worker runs for an input (the selected one, or the next that supports the case).
const KernelEntry* kernel_for(const FuzzInput& in, const std::vector<const KernelEntry*>& ks,
                              const std::vector<std::string>& quarantined = {}) {
  for (size_t i = 0; i < ks.size(); ++i) {
    const KernelEntry* k = ks[(in.kernel + i) % ks.size()];
    if (std::find(quarantined.begin(), quarantined.end(), k->kernel.name) != quarantined.end()) continue;
    if (unsupported_reason(k->kernel, in.the_case.problem).empty()) return k;
  }
  return nullptr;
}

std::vector<std::string> read_lines_all(const fs::path& p) {  // every line, duplicates too
  std::ifstream f(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

struct Aggregate {
  int64_t cases = 0, failing = 0;  // cases: inputs checked on a kernel
  int64_t skipped = 0;             // inputs that no selected kernel ran (unsupported by all, or quarantined)
  int64_t replayed = 0;            // libFuzzer re-runs of kept inputs answered from the feature cache
  double check_s = 0, mutate_s = 0;  // worker processes' time in checks and in the custom mutator
  std::map<std::string, double> kernel_check_s;  // the checks' time per kernel
  std::map<std::string, int64_t> verdicts, classes;
  std::map<std::string, int64_t> refusals;  // "kernel: why it refused an input" -> count
  std::map<std::string, std::map<std::string, int64_t>> kernels;
  int64_t features = 0;
  std::string features_hex;  // the union bitmap (merged summaries take the union over campaigns)
};

Aggregate read_stats(const fs::path& dir) {
  Aggregate a;
  std::vector<uint8_t> bits(kCounterBytes / 8, 0);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".json") continue;
    try {
      const Json j = Json::parse(read_all(e.path()));
      for (const auto& [k, v] : j.at("verdicts").items()) a.verdicts[k] += v.get<int64_t>();
      a.replayed += j.value("replayed", int64_t{0});
      a.check_s += j.value("check_s", 0.0);
      a.mutate_s += j.value("mutate_s", 0.0);
      if (j.contains("kernel_check_s"))
        for (const auto& [k, v] : j.at("kernel_check_s").items()) a.kernel_check_s[k] += v.get<double>();
      for (const auto& [k, v] : j.at("classes").items()) a.classes[k] += v.get<int64_t>();
      if (j.contains("refusals"))
        for (const auto& [k, v] : j.at("refusals").items()) a.refusals[k] += v.get<int64_t>();
      for (const auto& [k, m] : j.at("kernels").items())
        for (const auto& [v, n] : m.items()) a.kernels[k][v] += n.get<int64_t>();
      const std::string hex = j.value("features", std::string());
      for (size_t i = 0; i + 1 < hex.size() && i / 2 < bits.size(); i += 2)
        bits[i / 2] |= static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16));
    } catch (const std::exception&) {
      // a stats file being replaced right now: counted next time
    }
  }
  static const char* hex = "0123456789abcdef";
  for (uint8_t b : bits) {
    a.features += __builtin_popcount(b);
    a.features_hex += hex[b >> 4];
    a.features_hex += hex[b & 15];
  }
  a.failing = a.verdicts.count("fail") ? a.verdicts["fail"] : 0;
  // Cases are counted from the verdicts (a worker's input counter runs one ahead while an input is in flight).
  a.cases = 0;
  for (const auto& [v, n] : a.verdicts)
    if (v != "mps-suspect")  // not judged: re-run alone (--mps), that run counts
      (v == "unsupported" || v == "quarantined" ? a.skipped : a.cases) += n;
  return a;
}

// libFuzzer's own counters from its log ("#N: cov: C ft: F corp: K exec/s E oom/timeout/crash: a/b/c").
struct FuzzerLine {
  int64_t ft = 0, corp = 0, ooms = 0, timeouts = 0, crashes = 0;
};

class LogTail {
 public:
  explicit LogTail(fs::path p) : path_(std::move(p)) {}
  void poll(FuzzerLine& l) {
    std::ifstream f(path_, std::ios::binary);
    if (!f) return;
    f.seekg(static_cast<std::streamoff>(off_));
    std::string line;
    static const std::regex re(R"(ft: (\d+) corp: (\d+).*oom/timeout/crash: (\d+)/(\d+)/(\d+))");
    while (std::getline(f, line)) {
      if (f.eof()) break;  // partial line: read again next time
      off_ += line.size() + 1;
      std::smatch m;
      if (std::regex_search(line, m, re)) {
        l.ft = std::stoll(m[1]);
        l.corp = std::stoll(m[2]);
        l.ooms = std::stoll(m[3]);
        l.timeouts = std::stoll(m[4]);
        l.crashes = std::stoll(m[5]);
      }
      last_ = line;
    }
  }
  const std::string& last() const { return last_; }

 private:
  fs::path path_;
  size_t off_ = 0;
  std::string last_;
};

struct Failure {
  fs::path path;
  CorpusFile file;
};

// Failure files that do not read (corrupted, truncated): kept in OUT untouched and listed in the summary.
struct Skipped {
  fs::path path;
  std::string why;
};

std::vector<Failure> read_failures(const fs::path& dir, std::vector<Skipped>* skipped = nullptr,
                                   bool report_skips = true) {
  std::vector<Failure> out;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == kCaseFileExtension) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    try {
      CorpusFile cf = read_corpus_file(f);
      if (cf.verdict && cf.verdict->verdict == Verdict::kFail) out.push_back({f, std::move(cf)});
    } catch (const CorpusError& e) {
      if (skipped) {
        if (report_skips) std::fprintf(stderr, "attn-fuzz: skipping unreadable failure file: %s\n", e.what());
        skipped->push_back({f, e.what()});
      }
    }
  }
  return out;
}

// The fuzzing jobs of a libFuzzer fork-mode process `master`: it runs each job through system(), i.e. under
// a `sh -c` that does not exec, so the jobs are its grandchildren (or children that are not a shell).
std::vector<pid_t> fork_jobs(pid_t master) {
  std::map<pid_t, std::pair<pid_t, std::string>> group;  // pid -> (parent, command name), in master's group
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string st = read_all(e.path() / "stat");  // pid (comm) state ppid pgrp ...
    const size_t open = st.find('('), close = st.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(st.substr(close + 1));
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (!(rest >> state >> ppid >> pgrp) || pgrp != master || state == 'Z') continue;
    group[std::stoi(name)] = {static_cast<pid_t>(ppid), st.substr(open + 1, close - open - 1)};
  }
  std::vector<pid_t> jobs;
  for (const auto& [pid, pc] : group) {
    if (pid == master) continue;
    const auto parent = group.find(pc.first);
    if ((pc.first == master && pc.second != "sh") ||
        (parent != group.end() && parent->second.first == master && parent->second.second == "sh"))
      jobs.push_back(pid);
  }
  return jobs;
}

// A campaign killed outright leaves the inputs its fork-mode jobs found since their last merge in the jobs'
// corpus directories (`C<job>/` of libFuzzer's fork scratch `dir`): copied into `inputs` before the scratch is
// removed, they are fuzzed again and become corpus files like any new input (issue 27: kill -9 lost them).
void salvage_fork_scratch(const fs::path& dir, const fs::path& inputs) {
  std::error_code ec;
  for (const auto& job : fs::directory_iterator(dir, ec)) {
    const std::string n = job.path().filename().string();
    if (n.size() < 2 || n[0] != 'C' || n.find_first_not_of("0123456789", 1) != std::string::npos) continue;
    std::error_code jec;
    for (const auto& e : fs::directory_iterator(job.path(), jec)) {
      std::error_code fec;
      const fs::path to = inputs / e.path().filename();
      if (e.is_regular_file(fec) && e.path().filename().string()[0] != '.' && !fs::exists(to, fec))
        fs::copy_file(e.path(), to, fec);  // (no worker runs yet: nobody reads inputs/ meanwhile)
    }
  }
}

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

// Locks OUT for this campaign. When the attn-fuzz that holds the lock is gone (killed, even by SIGKILL), its
// processes are being ended (PR_SET_PDEATHSIG, the lifeline) but hold the inherited descriptor until the
// kernel has torn down their memory, which takes a while under load: wait for them, up to kOrphanWaitS, so
// that a resume right after a kill works, and never share OUT with a process that is still running.
constexpr double kOrphanWaitS = 10;
bool lock_out(int lock_fd, const fs::path& out, const fs::path& lock_path) {
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) == 0) return true;
  char holder[32] = {0};
  (void)!::pread(lock_fd, holder, sizeof holder - 1, 0);
  for (char& c : holder)
    if (c == '\n') c = 0;
  const pid_t owner = static_cast<pid_t>(std::atol(holder));
  std::vector<pid_t> holders = lock_holders(lock_path);
  const bool owner_alive = owner > 0 && std::find(holders.begin(), holders.end(), owner) != holders.end();
  if (!owner_alive) {
    std::fprintf(stderr,
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

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& env,
            const fs::path& log) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) {
    if (pid > 0) ::setpgid(pid, pid);  // (both sides: no race with the first kill of the group)
    return pid;
  }
  ::setpgid(0, 0);  // its own group: the parent signals it as a whole, and its jobs die with it
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with attn-fuzz; its jobs watch the lifeline pipe
  if (::getppid() != parent) ::_exit(1);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  for (const auto& [k, v] : env) v.empty() ? ::unsetenv(k.c_str()) : ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  std::fprintf(stderr, "attn-fuzz: cannot run %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

}  // namespace

int run_campaign(const CampaignOptions& o) {
  const WorkerConfig& cfg = o.worker;
  const fs::path out = cfg.out, work = out / "work", inputs = work / "inputs", artifacts = work / "artifacts";
  const fs::path failures = out / "failures", corpus = o.corpus_dir;
  std::error_code ec;
  // One campaign per OUT: an exclusive lock that every process of the campaign inherits (the descriptor
  // stays open across fork and exec), so it is held until the last of them is gone, orphans included.
  fs::create_directories(out, ec);
  const fs::path lock_path = out / "campaign.lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  if (lock_fd < 0) {
    std::fprintf(stderr, "attn-fuzz: cannot open %s: %s\n", lock_path.c_str(), std::strerror(errno));
    return 2;
  }
  if (!lock_out(lock_fd, out, lock_path)) {
    ::close(lock_fd);
    return 2;
  }
  {
    const std::string me = std::to_string(::getpid()) + "\n";
    (void)!::ftruncate(lock_fd, 0);
    (void)!::pwrite(lock_fd, me.data(), me.size(), 0);
  }
  for (const fs::path& d : {inputs, artifacts, work / "stats", work / "dedup", work / "featcache"})
    fs::remove_all(d, ec);
  for (const char* f : {"isolate.txt", "quarantine.txt", "deaths.txt", "faults.txt", "throttle.txt"}) fs::remove(work / f, ec);
  for (const fs::path& d : {out, work, inputs, artifacts, work / "stats", work / "dedup", failures, corpus}) {
    fs::create_directories(d, ec);
    if (ec) {
      std::fprintf(stderr, "attn-fuzz: cannot create %s: %s\n", d.c_str(), ec.message().c_str());
      return 2;
    }
  }
  if (::access(o.worker_binary.c_str(), X_OK) != 0) {
    std::fprintf(
        stderr,
        "attn-fuzz: the libFuzzer worker %s is missing (configure with -DATTNFUZZ_FUZZ=ON and build target "
        "attn-fuzz-worker)\n",
        o.worker_binary.c_str());
    return 2;
  }
  // Kernels (the parent needs the selection to map corpus cases to kernels and artifacts to failures).
  Backend backend;
  if (!parse_backend(cfg.backend, backend)) {
    std::fprintf(stderr, "attn-fuzz: unknown backend %s\n", cfg.backend.c_str());
    return 2;
  }
  std::vector<const KernelEntry*> kernels;
  try {
    kernels = Registry::global().select(backend, cfg.kernels);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
    return 2;
  }
  // Failures of earlier runs in this directory stay claimed; a kernel that hung stays quarantined (a
  // resumed campaign is the same campaign). Unreadable failure files are reported once and kept as they are.
  std::vector<Skipped> skipped_failures;
  const std::vector<Failure> earlier = read_failures(failures, &skipped_failures);
  for (const Failure& f : earlier) {
    const RecordedVerdict& v = *f.file.verdict;
    const std::string key = hex16(hash64(v.kernel + "|" + failure_class_name(v.failure) + "|" + v.signature));
    std::ofstream(work / "dedup" / key) << v.kernel << " " << failure_class_name(v.failure) << "\n";
    if (v.failure == FailureClass::kHang) append_line((work / "quarantine.txt").string(), v.kernel);
  }
  // --sync: what the other campaigns published so far comes in first (their corpus entries are then loaded
  // with the local corpus; their failures are claimed, so local workers do not save them again).
  std::unique_ptr<Sync> sync;
  const std::string name = o.name.empty() ? default_campaign_name() : o.name;
  const std::time_t started_unix = std::time(nullptr);
  if (!o.sync_dir.empty()) {
    SyncConfig sc;
    sc.dir = o.sync_dir;
    sc.name = name;
    sc.out = out;
    sc.corpus = corpus;
    sc.limits = cfg.limits;
    for (const KernelEntry* k : kernels) sc.kernels.push_back(k->kernel.name);
    sc.quiet = o.quiet;
    try {
      sync = std::make_unique<Sync>(sc);
      sync->start();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn-fuzz: --sync %s: %s\n", o.sync_dir.c_str(), e.what());
      return 2;
    }
  }
  // Corpus in: every .case file of the corpus and seed directories becomes libFuzzer inputs; a file that
  // does not read is reported and skipped.
  const FuzzLimits& lim = cfg.limits;
  int64_t loaded = 0, skipped = 0, seeds = 0;
  std::set<std::string> known;  // input file names in work/inputs
  auto add_input = [&](FuzzInput in) {
    const auto b = encode(in, lim);
    const FuzzInput back = decode(b.data(), b.size(), lim);
    const auto nb = encode(back, lim);  // normalised into the fuzz limits
    const std::string name = hex16(hash64(std::string(nb.begin(), nb.end())));
    if (known.insert(name).second) write_bytes(inputs / name, nb);
  };
  auto load_dir = [&](const fs::path& dir, bool is_seed) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file() && e.path().extension() == kCaseFileExtension) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      CorpusFile cf;
      try {
        cf = read_corpus_file(f);
      } catch (const CorpusError& e) {
        std::fprintf(stderr, "attn-fuzz: skipping corpus file: %s\n", e.what());
        ++skipped;
        continue;
      }
      FuzzInput in;
      in.the_case = cf.the_case;
      const int k = kernel_index_of(cf, kernels);
      if (k >= 0 || kernels.empty()) {
        in.kernel = static_cast<uint32_t>(std::max(k, 0));
        add_input(in);
      } else {
        // No kernel recorded: one input per selected kernel (seeds exercise every kernel from the start).
        for (size_t i = 0; i < kernels.size() && i < 256; ++i) {
          in.kernel = static_cast<uint32_t>(i);
          add_input(in);
        }
      }
      ++(is_seed ? seeds : loaded);
    }
  };
  load_dir(corpus, false);
  for (const auto& s : o.seed_dirs)
    if (fs::is_directory(s, ec)) load_dir(s, true);
  // Worker configuration, then the libFuzzer fork-mode processes (one per GPU group).
  const fs::path cfg_path = work / "worker.json";
  WorkerConfig job_cfg = cfg;
  if (!o.sync_dir.empty()) job_cfg.min_job_s = 0;  // corpus entries are published after each job's merge
  if (o.max_time_s > 0)  // when the workers are stopped (below: stop_at): fork-mode jobs end before it
    job_cfg.stop_unix = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() +
                        (o.max_time_s >= 10 ? o.max_time_s - kStopLeadS : o.max_time_s);
  std::ofstream(cfg_path) << worker_config_to_json(job_cfg).dump(2) << "\n";
  const size_t groups = std::max<size_t>(1, o.gpu_ids.size());
  const unsigned per_group = std::max(1u, o.workers / static_cast<unsigned>(groups));
  struct Master {
    pid_t pid;
    fs::path log;
    std::unique_ptr<LogTail> tail;
    FuzzerLine line;
    int status = -1;
    bool done = false;
  };
  std::vector<Master> masters;
  // The lifeline: attn-fuzz holds the only write end; every worker process watches the read end and kills
  // its process group when it reads end-of-file (attn-fuzz died, even by SIGKILL).
  int life[2] = {-1, -1};
  if (::pipe2(life, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "attn-fuzz: cannot create a pipe: %s\n", std::strerror(errno));
    return 2;
  }
  ::fcntl(life[0], F_SETFD, 0);  // the read end is inherited through fork and exec
  // libFuzzer's per-input timeout: the second line behind the device's own launch timeout. An adapter input
  // may also restart the adapter (a handshake of up to 120 s: importing torch under load) and classify a
  // failure with ~10 relaunches, each under the adapter's own timeout: a shorter line killed healthy workers.
  const double lf_line = cfg.backend == "adapter" ? 120 + 10 * cfg.timeout_s : 2 * cfg.timeout_s;
  const int lf_timeout = static_cast<int>(std::max(5.0, std::ceil(lf_line) + 3));
  std::printf(
      "attn-fuzz %s: %zu kernel(s) on %s, %u worker(s)%s, corpus %s (%lld case file(s), %lld seed(s)%s), "
      "out %s%s\n",
      ATTNFUZZ_VERSION, kernels.size(), cfg.backend.c_str(), per_group * static_cast<unsigned>(groups),
      groups > 1 ? (" in " + std::to_string(groups) + " GPU groups").c_str() : "", corpus.c_str(),
      (long long)loaded, (long long)seeds,
      skipped ? (", " + std::to_string(skipped) + " skipped").c_str() : "", out.c_str(),
      o.max_time_s > 0 ? (", " + std::to_string(static_cast<int>(o.max_time_s)) + " s").c_str() : "");
  std::fflush(stdout);
  // libFuzzer's fork mode keeps every job's new inputs and their features as files in a temporary directory
  // (TMPDIR, default /tmp) and deletes them after each merge: scratch files, created and deleted by the
  // thousand. Unless TMPDIR is set, they go to /dev/shm (tmpfs) when it has 1 GiB free: on a busy disk file
  // system each create cost ~0.8 ms on the dev box, ~15% of a worker's time. Removed again when the
  // fork-mode process ends (it leaves its directory behind when it is killed).
  std::string fork_tmp;
  if (const char* t = std::getenv("TMPDIR"); !t || !*t) {
    struct statvfs sv {};
    if (::access("/dev/shm", W_OK | X_OK) == 0 && ::statvfs("/dev/shm", &sv) == 0 &&
        static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize) >= 1024.0 * 1024 * 1024)
      fork_tmp = "/dev/shm";
  }
  auto fork_scratch = [&](pid_t master) {  // libFuzzer's TempPath of a fork-mode process
    const char* t = std::getenv("TMPDIR");
    const fs::path tmp = !fork_tmp.empty() ? fs::path(fork_tmp) : fs::path(t && *t ? t : "/tmp");
    return tmp / ("libFuzzerTemp.FuzzWithFork" + std::to_string(master) + ".dir");
  };
  // A campaign killed outright (SIGKILL, a node lost) could not remove its fork-mode scratch, on tmpfs: RAM.
  // Its directories are listed in work/fork-scratch.txt; the next campaign on this OUT removes those whose
  // process is gone.
  const fs::path scratch_list = work / "fork-scratch.txt";
  for (const std::string& d : read_lines(scratch_list.string())) {
    const size_t at = d.rfind("FuzzWithFork");
    const long pid = at == std::string::npos ? 0 : std::atol(d.c_str() + at + 12);
    if (pid <= 0) continue;
    std::string st;  // "pid (comm) state ...": none when gone; 'Z' for a zombie nobody reaped (attn-fuzz was killed)
    std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/stat"), st);
    const size_t close = st.rfind(')');
    if (close == std::string::npos || (close + 2 < st.size() && st[close + 2] == 'Z')) {
      salvage_fork_scratch(d, inputs);
      fs::remove_all(d, ec);
    }
  }
  // --mps: one private MPS daemon for all GPU groups (fuzz/mps.h), stopped when the campaign ends.
  std::unique_ptr<MpsDaemon> mps;
  if (o.mps) {
    try {
      mps = std::make_unique<MpsDaemon>(work / "mps");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
      ::close(life[0]);
      ::close(life[1]);
      return 2;
    }
  }
  for (size_t g = 0; g < groups; ++g) {
    std::vector<std::string> args{o.worker_binary,
                                  "-fork=" + std::to_string(per_group),
                                  "-ignore_crashes=1",
                                  "-ignore_timeouts=1",
                                  "-ignore_ooms=1",
                                  "-timeout=" + std::to_string(lf_timeout),
                                  "-rss_limit_mb=" + std::to_string(kRssLimitMb),
                                  "-max_len=" + std::to_string(64 + 4 * lim.max_explicit + 256),
                                  "-len_control=0",
                                  "-print_final_stats=1",
                                  "-artifact_prefix=" + (artifacts / "").string()};
    if (o.max_time_s > 0)
      args.push_back("-max_total_time=" + std::to_string(static_cast<long>(std::ceil(o.max_time_s))));
    for (const auto& a : o.fuzzer_args) args.push_back(a);
    args.push_back(inputs.string());
    std::vector<std::pair<std::string, std::string>> env{{kWorkerConfigEnv, fs::absolute(cfg_path).string()},
                                                         {kLifelineEnv, std::to_string(life[0])}};
    if (!fork_tmp.empty()) env.push_back({"TMPDIR", fork_tmp});
    if (mps)
      for (const auto& kv : mps->client_env()) env.push_back(kv);
    if (!o.gpu_ids.empty()) {
      env.push_back({"HIP_VISIBLE_DEVICES", o.gpu_ids[g]});
      env.push_back({"CUDA_VISIBLE_DEVICES", o.gpu_ids[g]});
    }
    Master m;
    m.log = work / ("fuzzer-" + std::to_string(g) + ".log");
    m.pid = spawn(args, env, m.log);
    m.tail = std::make_unique<LogTail>(m.log);
    masters.push_back(std::move(m));
  }
  {
    std::ofstream f(scratch_list);
    for (const auto& m : masters) f << fork_scratch(m.pid).string() << "\n";
  }
  if (!mps) ::close(life[0]);  // (under --mps the re-runs of suspects inherit it too)
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{}, old_hup{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);

  // Corpus out: new libFuzzer inputs become .case files (labelled with the kernel they select).
  std::set<std::string> synced = known;
  auto sync_corpus = [&]() {
    for (const auto& e : fs::directory_iterator(inputs, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || synced.count(name)) continue;
      synced.insert(name);
      const std::string bytes = read_all(e.path());
      FuzzInput in = decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), lim);
      CorpusFile cf;
      cf.tool.name = "attn-fuzz";
      cf.tool.command = o.command_line;
      cf.the_case = in.the_case;
      if (const KernelEntry* k = kernel_for(in, kernels))
        cf.the_case.label = std::string("fuzz-") + k->kernel.name;
      try {
        save_to_corpus_dir(corpus, cf);
      } catch (const CorpusError& err) {
        std::fprintf(stderr, "attn-fuzz: warning: %s\n", err.what());
      }
    }
  };

  // libFuzzer artifacts: inputs that killed a worker process (a kernel that crashed or hung in-process).
  // Each becomes a crash or hang failure like any other, and its kernel is launched isolated from then on.
  std::set<std::string> artifacts_seen, isolated;
  int64_t artifact_crashes = 0, artifact_hangs = 0;  // worker processes that died, as libFuzzer saved them
  std::vector<bool> fault_taken;  // lines of work/faults.txt already matched to an artifact
  std::map<std::string, int64_t> ended_by;  // what ended worker processes, as the artifacts tell it
  auto scan_artifacts = [&]() {
    for (const auto& e : fs::directory_iterator(artifacts, ec)) {
      const std::string name = e.path().filename().string();
      if (artifacts_seen.count(name)) continue;
      const bool timeout = name.rfind("timeout-", 0) == 0;
      if (!timeout && name.rfind("crash-", 0) != 0 && name.rfind("oom-", 0) != 0) continue;
      artifacts_seen.insert(name);
      ++(timeout ? artifact_hangs : artifact_crashes);
      const std::string bytes = read_all(e.path());
      const FuzzInput in = decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), lim);
      const KernelEntry* k = kernel_for(in, kernels, read_lines((work / "quarantine.txt").string()));
      // An in-process death: the worker's crash hook wrote which kernel ran this very input (work/faults.txt,
      // linked by the input's hash), and where it faulted if that was in a buffer's guard pages. The kernel
      // the input maps to now may differ (a kernel quarantined since then shifts the choice).
      std::vector<std::string> fault;
      if (name.rfind("crash-", 0) == 0) {
        const std::vector<std::string> lines = read_lines_all(work / "faults.txt");
        fault_taken.resize(lines.size(), false);
        const std::string h = std::to_string(input_hash(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
        for (size_t i = 0; i < lines.size() && fault.empty(); ++i) {
          std::vector<std::string> f;
          std::stringstream ss(lines[i]);
          for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
          if (fault_taken[i] || f.size() != 6 || f[5] != h) continue;
          fault_taken[i] = true;
          fault = f;
          for (const KernelEntry* c : kernels)
            if (c->kernel.name == f[0]) k = c;
        }
      }
      const bool oom = name.rfind("oom-", 0) == 0;
      const std::string lf_why = timeout ? "libFuzzer -timeout (" + std::to_string(lf_timeout) + " s)"
                                         : "libFuzzer rss limit (-rss_limit_mb=" + std::to_string(kRssLimitMb) + ")";
      if (!k) {
        ++ended_by[(timeout || oom ? lf_why : std::string("crash")) + " on an input no selected kernel runs"];
        continue;
      }
      if (mps) {  // maybe another client's fault (a copy failing after it, or a spin starving this one)
        save_mps_suspect(cfg, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        ++ended_by["died under MPS (" + name.substr(0, name.find('-')) + "), its input re-run alone"];
        continue;
      }
      if (timeout) append_line((work / "quarantine.txt").string(), k->kernel.name);
      if (isolated.insert(k->kernel.name).second) {
        if (cfg.isolate == "auto") append_line((work / "isolate.txt").string(), k->kernel.name);
        if (!o.quiet && cfg.isolate == "auto")
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
        r.failure = access == 1 ? FailureClass::kOobRead : access == 2 ? FailureClass::kOobWrite : FailureClass::kCrash;
        r.reason = std::string("the kernel ") + (access == 1 ? "read" : access == 2 ? "wrote" : "accessed memory") +
                   " " + fault[4] + ", in the guard pages around it (the access faulted in-process and ended the " +
                   "worker process; libFuzzer " + name + ")";
        r.evidence.push_back({"guard-page", "buffer " + fault[2] + " byte offset " + fault[3] +
                                                (access == 1 ? ": read" : access == 2 ? ": write" : "")});
      }
      r.evidence.push_back({"libfuzzer", (work / "artifacts" / name).string()});
      ++ended_by[timeout || oom ? lf_why + " in kernel " + k->kernel.name
                                : std::string(failure_class_name(r.failure)) + " in kernel " + k->kernel.name +
                                      " (in-process)"];
      try {
        save_failure(cfg, in.the_case, r, {});
      } catch (const std::exception& err) {
        std::fprintf(stderr, "attn-fuzz: warning: %s\n", err.what());
      }
    }
  };
  // --mps: each suspect input (work/mps-suspects) is re-run alone by the worker binary, one at a time, outside
  // MPS (no CUDA_MPS_* in its environment) and with kMpsRecheckEnv set: it judges and saves the case like any
  // worker, and a crash or hang that reproduces quarantines the kernel. Its artifacts go to their own folder.
  const fs::path suspects = work / "mps-suspects", recheck_dir = work / "mps-recheck";
  auto is_suspect = [](const fs::directory_entry& e) {  // (".<pid>.tmp": one being written)
    return e.is_regular_file() && e.path().filename().string()[0] != '.';
  };
  struct Recheck {
    pid_t pid = -1;
    fs::path input;
    std::chrono::steady_clock::time_point started;
  } recheck;
  int64_t mps_rechecked = 0;
  auto recheck_step = [&]() {  // true while a re-run is in flight or waiting
    if (!mps) return false;
    if (recheck.pid > 0) {
      int st = 0;
      const bool late = std::chrono::steady_clock::now() - recheck.started >
                        std::chrono::duration<double>(lf_timeout + 30.0);
      if (late) ::kill(-recheck.pid, SIGKILL);
      if (::waitpid(recheck.pid, &st, late ? 0 : WNOHANG) != recheck.pid) return true;
      recheck.pid = -1;
      fs::remove(recheck.input, ec);
      ++mps_rechecked;
    }
    for (const auto& e : fs::directory_iterator(suspects, ec)) {
      if (!is_suspect(e)) continue;
      fs::create_directories(recheck_dir, ec);
      std::vector<std::string> args{o.worker_binary, "-timeout=" + std::to_string(lf_timeout),
                                    "-rss_limit_mb=" + std::to_string(kRssLimitMb),
                                    "-artifact_prefix=" + (recheck_dir / "").string(), e.path().string()};
      std::vector<std::pair<std::string, std::string>> env{{kWorkerConfigEnv, fs::absolute(cfg_path).string()},
                                                           {kLifelineEnv, std::to_string(life[0])},
                                                           {kMpsRecheckEnv, "1"},
                                                           {"CUDA_MPS_PIPE_DIRECTORY", ""},
                                                           {"CUDA_MPS_LOG_DIRECTORY", ""}};
      recheck.pid = spawn(args, env, recheck_dir / "recheck.log");
      recheck.input = e.path();
      recheck.started = std::chrono::steady_clock::now();
      return true;
    }
    return false;
  };
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double next_progress = o.progress_s, next_sync = o.sync_interval_s;
  bool interrupted = false;
  // Worker processes that died: libFuzzer's counts, or the artifacts it saved if more (its counters lag),
  // plus the processes the hang watchdog ended (work/deaths.txt).
  int64_t worker_crashes = 0, worker_hangs = 0, lf_timeouts = 0;
  auto progress = [&](bool final) {
    const Aggregate a = read_stats(work / "stats");
    FuzzerLine lf;
    for (auto& m : masters) {
      m.tail->poll(m.line);
      lf.ft += m.line.ft;
      lf.corp += m.line.corp;
      lf.crashes += m.line.crashes + m.line.ooms;
      lf.timeouts += m.line.timeouts;
    }
    int64_t hooked_crashes = 0;  // in-process deaths the workers' crash hook recorded
    for (const std::string& l : read_lines_all((work / "deaths.txt").string()))
      hooked_crashes += l.rfind("crash ", 0) == 0;
    worker_crashes = std::max({lf.crashes, artifact_crashes, hooked_crashes});
    int64_t watchdog_hangs = 0;
    for (const std::string& l : read_lines((work / "deaths.txt").string()))
      watchdog_hangs += l.rfind("hang ", 0) == 0;
    worker_hangs = std::max(lf.timeouts, artifact_hangs) + watchdog_hangs;
    lf_timeouts = lf.timeouts;
    lf.crashes = worker_crashes;
    lf.timeouts = worker_hangs;
    const double t = elapsed();
    std::string cls;
    for (const auto& [c, n] : a.classes) cls += (cls.empty() ? ": " : ", ") + c + " " + std::to_string(n);
    const size_t distinct = read_failures(failures).size();
    std::printf(
        "attn-fuzz [%5.0fs] cases %lld (%.0f/s)  failing %lld%s  distinct %zu  features %lld  corpus %lld"
        "  worker crashes %lld hangs %lld%s%s\n",
        t, (long long)a.cases, t > 0 ? a.cases / t : 0.0, (long long)a.failing, cls.c_str(), distinct,
        (long long)a.features, (long long)lf.corp, (long long)lf.crashes, (long long)lf.timeouts,
        a.skipped ? ("  skipped " + std::to_string(a.skipped)).c_str() : "", final ? "  (final)" : "");
    std::fflush(stdout);
    return a;
  };
  // Stopping: at --max-time (a little before, so the summary is written by then) or on SIGINT / SIGTERM /
  // SIGHUP, every process group gets SIGINT (libFuzzer's orderly exit), then SIGKILL after a short grace.
  const double stop_at =
      o.max_time_s > 0 ? (o.max_time_s >= 10 ? o.max_time_s - kStopLeadS : o.max_time_s) : -1;
  bool stopping = false;
  double kill_at = -1;
  auto all_quarantined = [&] {
    const std::vector<std::string> q = read_lines((work / "quarantine.txt").string());
    for (const KernelEntry* k : kernels)
      if (std::find(q.begin(), q.end(), k->kernel.name) == q.end()) return false;
    return !kernels.empty();
  };
  auto signal_all = [&](int sig) {
    for (auto& m : masters)
      if (!m.done) ::kill(-m.pid, sig);
  };
  // The orderly stop: SIGINT to the jobs only. Each exits with libFuzzer's interrupt code, its master sees
  // "a child was interrupted" and ends on its own (exit 72, its temporary directory removed). SIGINT to the
  // whole group also killed the `sh -c` that system() runs each job under, and libFuzzer counted every job
  // running at the stop as a crash (the "12 worker crashes" of a 16-worker soak, with no failure saved).
  auto interrupt_jobs = [&] {
    for (auto& m : masters)
      if (!m.done)
        for (pid_t j : fork_jobs(m.pid)) ::kill(j, SIGINT);
  };
  while (true) {
    bool all_done = true;
    for (auto& m : masters) {
      if (m.done) continue;
      int st = 0;
      const pid_t r = ::waitpid(m.pid, &st, WNOHANG);
      if (r == m.pid) {
        m.done = true;
        m.status = st;
        ::kill(-m.pid, SIGKILL);          // any job the master left behind
        fs::remove_all(fork_scratch(m.pid), ec);  // and its temporary directory
      } else {
        all_done = false;
      }
    }
    if (all_done) break;
    if (!stopping) scan_artifacts();
    recheck_step();
    if (g_signal && !stopping) {
      interrupted = true;
      std::printf("attn-fuzz: %s: stopping the workers, then the summary\n", strsignal(g_signal));
      std::fflush(stdout);
    }
    // Every selected kernel hung once and is quarantined: nothing is left to check (the workers would only
    // count skipped inputs until --max-time).
    if (!stopping && !g_signal && all_quarantined()) {
      std::printf("attn-fuzz: every selected kernel hung and is quarantined: nothing left to check, stopping\n");
      std::fflush(stdout);
      stopping = true;
      interrupt_jobs();
      kill_at = elapsed() + kStopGraceS;
    }
    if (!stopping && (g_signal || (stop_at >= 0 && elapsed() >= stop_at))) {
      stopping = true;
      interrupt_jobs();
      kill_at = elapsed() + kStopGraceS;
    }
    if (stopping && elapsed() >= kill_at) signal_all(SIGKILL);
    else if (stopping) interrupt_jobs();  // also a job its master started while stopping
    if (!o.quiet && !stopping && elapsed() >= next_progress) {
      progress(false);
      sync_corpus();
      next_progress += o.progress_s;
    }
    if (sync && !stopping && elapsed() >= next_sync) {
      sync_corpus();
      sync->round();
      next_sync += o.sync_interval_s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(stopping ? 50 : 200));
  }
  ::close(life[1]);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  sync_corpus();
  for (auto& m : masters) {
    m.tail->poll(m.line);
    const bool ok = WIFEXITED(m.status) && WEXITSTATUS(m.status) == 0;
    if (!ok && !stopping) {  // a process we stopped ends however its signal left it: not abnormal
      std::fprintf(stderr,
                   "attn-fuzz: a libFuzzer process ended abnormally (%s); its log: %s\n  last line: %s\n",
                   WIFEXITED(m.status) ? ("exit " + std::to_string(WEXITSTATUS(m.status))).c_str()
                                       : ("signal " + std::to_string(WTERMSIG(m.status))).c_str(),
                   m.log.c_str(), m.tail->last().c_str());
    }
  }
  scan_artifacts();
  int64_t mps_pending = 0;
  if (mps) {  // the suspects left: re-run now (bounded), then the daemon goes
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (recheck_step() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (recheck.pid > 0) {
      ::kill(-recheck.pid, SIGKILL);
      ::waitpid(recheck.pid, nullptr, 0);
    }
    for (const auto& e : fs::directory_iterator(suspects, ec))
      mps_pending += is_suspect(e);
    mps->stop();
    ::close(life[0]);
  }
  if (sync) sync->round();  // the last publish: everything this campaign found is in DIR
  const Aggregate a = progress(true);
  // What ended each worker process that died: the artifacts (kernel and class), the hang watchdog, and what
  // libFuzzer counted beyond them (a job that exited non-zero without an artifact, with its ERROR line).
  std::map<std::string, int64_t> ended = ended_by;
  for (const std::string& l : read_lines((work / "deaths.txt").string()))
    if (l.rfind("hang ", 0) == 0) ++ended["hang in kernel " + l.substr(5) + " (the in-process hang watchdog)"];
  if (const int64_t n = worker_crashes - artifact_crashes; n > 0) {
    std::string err;
    for (const auto& m : masters) {
      std::ifstream f(m.log);
      for (std::string l; err.empty() && std::getline(f, l);)
        if (l.find("ERROR:") != std::string::npos) err = l;
    }
    ended["non-zero exit without an artifact" + (err.empty() ? std::string() : " (" + err + ")")] += n;
  }
  if (const int64_t n = lf_timeouts - artifact_hangs; n > 0) ended["libFuzzer -timeout without an artifact"] += n;
  std::string ended_text;
  for (const auto& [why, n] : ended) ended_text += (ended_text.empty() ? "" : "; ") + std::to_string(n) + " x " + why;
  const double wall = elapsed();
  const std::vector<ImportedFailure> imported = sync ? sync->imported_failures() : std::vector<ImportedFailure>{};

  // Summary: the distinct failures in this campaign directory, each with its replay command; the kernels
  // quarantined (they hung) and isolated; failure files that could not be read (kept as they are).
  std::vector<Skipped> skipped_now;
  const std::vector<Failure> found = read_failures(failures, &skipped_now, false);
  const std::vector<std::string> quarantined = read_lines((work / "quarantine.txt").string()),
                                 isolated_now = read_lines((work / "isolate.txt").string());
  RunRecord rec;
  rec.tool.name = "attn-fuzz";
  rec.tool.command = o.command_line;
  rec.backend = cfg.backend;
  rec.device = found.empty() ? cfg.backend : found.front().file.verdict->device;
  rec.wall_s = wall;
  std::printf(
      "\nattn-fuzz: %.0f s, %lld case(s) (%.0f/s), %lld failing check(s), %zu distinct failure(s)%s%s\n", wall,
      (long long)a.cases, wall > 0 ? a.cases / wall : 0.0, (long long)a.failing, found.size(),
      sync ? (" found here, " + std::to_string(imported.size()) + " imported").c_str() : "",
      interrupted ? " (interrupted)" : "");
  if (!found.empty()) std::printf("%-13s %-30s %-34s %s\n", "class", "kernel", "shape", "replay");
  for (const Failure& f : found) {
    const RecordedVerdict& v = *f.file.verdict;
    RunEntry e;
    e.the_case = f.file.the_case;
    e.result = recorded_result(v);
    e.corpus_path = f.path.string();
    e.replay_command = replay_command(cfg, f.path.string());
    const fs::path svg = f.path.parent_path() / (f.path.stem().string() + ".svg");
    if (fs::exists(svg, ec)) e.heatmap_path = fs::relative(svg, out, ec).string();
    std::printf("%-13s %-30s %-34s %s\n", failure_class_name(v.failure), v.kernel.c_str(),
                shape(e.the_case.problem).c_str(), e.replay_command.c_str());
    rec.entries.push_back(std::move(e));
  }
  auto joined = [](const std::vector<std::string>& v) {
    std::string t;
    for (const auto& x : v) t += (t.empty() ? "" : ", ") + x;
    return t;
  };
  if (!imported.empty()) {
    std::printf("imported from other campaigns (--sync %s; first found there, not saved again here):\n",
                o.sync_dir.c_str());
    std::printf("%-13s %-30s %-34s %s\n", "class", "kernel", "shape", "found by");
    for (const ImportedFailure& f : imported)
      std::printf("%-13s %-30s %-34s %s\n", failure_class_name(f.verdict.failure), f.verdict.kernel.c_str(),
                  shape(f.the_case.problem).c_str(), f.from.c_str());
  }
  SyncTotals st;
  if (sync) {
    st = sync->totals();
    std::string per;
    int64_t in_corpus = 0;
    for (const auto& [from, n] : st.imported_corpus) {
      per += (per.empty() ? "" : ", ") + from + " " + std::to_string(n);
      in_corpus += n;
    }
    std::printf(
        "sync %s as %s: published %lld corpus entr(ies), %lld failure(s); imported %lld corpus entr(ies)%s%s%s "
        "(%lld run by the workers), %zu failure(s); %lld round(s), %.2f s (%.2f s CPU)\n",
        o.sync_dir.c_str(), name.c_str(), (long long)st.published_corpus, (long long)st.published_failures,
        (long long)in_corpus, per.empty() ? "" : " (", per.c_str(), per.empty() ? "" : ")",
        (long long)st.imported_inputs_run, imported.size(), (long long)st.rounds, st.seconds, st.cpu_seconds);
  }
  std::printf("worker processes that died: %lld crash(es), %lld hang(s)%s%s\n", (long long)worker_crashes,
              (long long)worker_hangs, ended.empty() ? "" : ": ", ended_text.c_str());
  if (mps)
    std::printf("MPS: %lld crash / hang / launch-error check(s) re-run alone, outside MPS (a failure they reproduced "
                "is listed above)%s\n",
                (long long)mps_rechecked,
                mps_pending ? (", " + std::to_string(mps_pending) + " not re-run (time)").c_str() : "");
  if (!quarantined.empty())
    std::printf("quarantined (hung once%s, not run again): %s\n", mps ? ", or crashed under MPS" : "",
                joined(quarantined).c_str());
  if (!isolated_now.empty())
    std::printf("isolated (launched in a forked child): %s\n", joined(isolated_now).c_str());
  for (const Skipped& k : skipped_now)
    std::printf("skipped unreadable failure file (kept as it is): %s\n", k.why.c_str());
  try {
    const ReportPaths paths = write_reports(rec, out);
    // Campaign facts on top of the shared report formats.
    Json j = report_to_json(rec);
    Json camp;
    camp["cases"] = a.cases;
    camp["cases_per_s"] = wall > 0 ? a.cases / wall : 0.0;
    camp["replayed_inputs"] = a.replayed;  // libFuzzer re-runs of kept inputs answered from work/featcache
    if (mps) camp["mps"] = {{"rechecked_alone", mps_rechecked}, {"not_rechecked", mps_pending}};
    // Where the workers' time went (issue 17): seconds in checks and in the custom mutator, over all worker
    // processes; the rest of workers x wall is libFuzzer, process start-up, merges and idle time.
    camp["worker_check_s"] = a.check_s;
    camp["worker_mutate_s"] = a.mutate_s;
    Json per_kernel_ms = Json::object();  // milliseconds per check, per kernel (compare: bench/fuzz_speed)
    for (const auto& [k, t] : a.kernel_check_s) {
      int64_t n = 0;
      if (const auto it = a.kernels.find(k); it != a.kernels.end())
        for (const auto& [v, c] : it->second) n += v == "unsupported" || v == "quarantined" ? 0 : c;
      if (n > 0) per_kernel_ms[k] = 1000 * t / static_cast<double>(n);
    }
    camp["per_kernel_check_ms"] = per_kernel_ms;
    camp["skipped_inputs"] = a.skipped;  // inputs no selected kernel ran (in verdicts: unsupported, quarantined)
    camp["refusals"] = a.refusals;       // why kernels refused inputs (the first few distinct reasons per worker)
    camp["failing_checks"] = a.failing;
    camp["failing_by_class"] = a.classes;
    camp["verdicts"] = a.verdicts;
    camp["per_kernel"] = a.kernels;
    camp["semantic_features"] = a.features;
    camp["distinct_failures"] = found.size();
    camp["interrupted"] = interrupted;
    camp["worker_crashes"] = worker_crashes;
    camp["worker_hangs"] = worker_hangs;
    camp["worker_deaths"] = ended;  // what ended them: reason -> processes
    camp["quarantined"] = quarantined;
    camp["isolated"] = isolated_now;
    Json sk = Json::array();
    for (const Skipped& k : skipped_now) sk.push_back({{"path", k.path.string()}, {"error", k.why}});
    camp["skipped_failure_files"] = sk;
    camp["corpus"] = corpus.string();
    camp["name"] = name;
    camp["started_at"] = [&] {
      std::tm tm{};
      gmtime_r(&started_unix, &tm);
      char b[32];
      std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
      return std::string(b);
    }();
    camp["started_unix"] = static_cast<int64_t>(started_unix);
    camp["wall_s"] = wall;
    camp["backend"] = cfg.backend;
    camp["replay_flags"] = cfg.replay_flags;
    camp["features_hex"] = a.features_hex;
    if (sync) {
      Json sj;
      sj["dir"] = o.sync_dir;
      sj["interval_s"] = o.sync_interval_s;
      sj["published_corpus"] = st.published_corpus;
      sj["published_failures"] = st.published_failures;
      sj["imported_corpus"] = st.imported_corpus;
      sj["imported_inputs_run"] = st.imported_inputs_run;
      sj["rounds"] = st.rounds;
      sj["seconds"] = st.seconds;
      sj["cpu_seconds"] = st.cpu_seconds;
      Json fl = Json::array();
      for (const ImportedFailure& f : imported)
        fl.push_back({{"kernel", f.verdict.kernel},
                      {"class", failure_class_name(f.verdict.failure)},
                      {"signature", f.verdict.signature},
                      {"from", f.from},
                      {"file", f.path.string()}});
      sj["imported_failures"] = fl;
      camp["sync"] = sj;
    }
    j["campaign"] = camp;
    write_text_file(paths.json, j.dump(2) + "\n");
    std::ostringstream md;
    md << "# attn-fuzz campaign\n\n"
       << "- command: `" << o.command_line << "`\n"
       << "- " << static_cast<long long>(wall) << " s, " << a.cases << " cases ("
       << static_cast<long long>(wall > 0 ? a.cases / wall : 0) << "/s), " << a.failing
       << " failing checks, **" << found.size() << " distinct failure(s)**"
       << (sync ? " found here, " + std::to_string(imported.size()) + " imported" : std::string())
       << (interrupted ? " (interrupted)" : "") << "\n"
       << "- semantic features covered: " << a.features << "; corpus: `" << corpus.string() << "`\n"
       << "- worker processes that died: " << worker_crashes << " crash(es), " << worker_hangs << " hang(s)"
       << (ended.empty() ? "" : ": " + markdown_escape(ended_text)) << "\n";
    if (!quarantined.empty())
      md << "- quarantined (hung once" << (mps ? ", or crashed under MPS" : "") << ", not run again): "
         << joined(quarantined) << "\n";
    if (!isolated_now.empty())
      md << "- isolated (launched in a forked child): " << joined(isolated_now) << "\n";
    for (const Skipped& k : skipped_now)
      md << "- **skipped unreadable failure file** (kept as it is): `" << k.path.string()
         << "`: " << markdown_escape(k.why) << "\n";
    if (sync) {
      int64_t in_corpus = 0;
      std::string per;
      for (const auto& [from, n] : st.imported_corpus) {
        per += (per.empty() ? "" : ", ") + markdown_escape(from) + " " + std::to_string(n);
        in_corpus += n;
      }
      md << "- sync `" << o.sync_dir << "` as **" << markdown_escape(name) << "**: published " << st.published_corpus
         << " corpus entries and " << st.published_failures << " failures; imported " << in_corpus
         << " corpus entries" << (per.empty() ? "" : " (" + per + ")") << ", " << st.imported_inputs_run
         << " of them run by the workers, and " << imported.size() << " failures\n";
    }
    md << "\n";
    if (!imported.empty()) {
      md << "Imported from other campaigns (first found there):\n\n| class | kernel | shape | found by |\n"
            "|---|---|---|---|\n";
      for (const ImportedFailure& f : imported)
        md << "| " << failure_class_name(f.verdict.failure) << " | " << markdown_escape(f.verdict.kernel) << " | "
           << markdown_escape(shape(f.the_case.problem)) << " | " << markdown_escape(f.from) << " |\n";
      md << "\n";
    }
    if (!found.empty()) {
      md << "| class | kernel | shape | replay |\n|---|---|---|---|\n";
      for (const RunEntry& e : rec.entries)
        md << "| " << failure_class_name(e.result.failure) << " | " << markdown_escape(e.result.kernel)
           << " | " << markdown_escape(shape(e.the_case.problem)) << " | `" << e.replay_command << "` |\n";
      md << "\n";
    }
    if (!rec.entries.empty()) md << markdown_summary(rec);  // the distinct failures replayed; none: no empty table
    write_text_file(paths.markdown, md.str());
    std::printf("reports: %s  %s  %s\n", paths.markdown.c_str(), paths.json.c_str(), paths.junit.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: cannot write reports: %s\n", e.what());
    return 2;
  }
  if (a.cases == 0 && found.empty()) {  // checking nothing is an input error, never a pass
    if (a.skipped > 0) {
      std::string most;  // the most frequent reason, as a kernel or its adapter gave it
      int64_t n = 0;
      for (const auto& [why, c] : a.refusals)
        if (c > n) most = why, n = c;
      std::fprintf(stderr,
                   "attn-fuzz: no case was checked: the selected kernels refused all %lld input(s) the campaign "
                   "drew (see --max-seq / --max-d and what the kernels support: --list)%s%s\n",
                   (long long)a.skipped, most.empty() ? "" : "; most often ", most.c_str());
    }
    else  // e.g. --worker /bin/true
      std::fprintf(stderr, "attn-fuzz: no case was checked: the workers (%s) reported no check\n",
                   o.worker_binary.c_str());
    return 2;
  }
  // An unreadable failure file still records a failure in this OUT: not a clean result.
  return found.empty() && skipped_now.empty() && imported.empty() ? 0 : 1;
}

// ------------------------------------------------------------------------------------------ minimize

int minimize_file(const std::string& path, const WorkerConfig& cfg_in, const MinimizeOptions& o) {
  CorpusFile cf;
  try {
    cf = read_corpus_file(path);
  } catch (const CorpusError& e) {
    std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
    return 2;
  }
  if (!cf.verdict || cf.verdict->verdict != Verdict::kFail) {
    std::fprintf(stderr, "attn-fuzz: %s records no failure: nothing to minimize\n", path.c_str());
    return 2;
  }
  const RecordedVerdict rv = *cf.verdict;
  WorkerConfig cfg = cfg_in;
  cfg.kernels = rv.kernel;
  // Crashes and hangs need the forked launches; everything else runs faster in-process.
  const bool dies = rv.failure == FailureClass::kCrash || rv.failure == FailureClass::kHang;
  cfg.isolate = dies || cfg_in.isolate == "always" ? "always" : "never";
  std::unique_ptr<Worker> w;
  try {
    w = std::make_unique<Worker>(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
    return 2;
  }
  const KernelEntry& k = *w->kernels().front();
  const RunOptions run = w->run_options();
  CheckResult last;
  auto still_fails = [&](const Case& c) {
    if (!validate(c).empty()) return false;
    PreparedCase pc(c);
    Judged j = check_case(w->device(), k, pc, run);
    if (j.result.verdict != Verdict::kFail) return false;
    refine_class(w->device(), k, pc, run, cfg.plugins, j);
    if (j.result.failure == rv.failure) {
      last = j.result;
      return true;
    }
    return false;
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (!still_fails(cf.the_case)) {
    std::fprintf(stderr, "attn-fuzz: %s does not reproduce %s/%s on %s with these options: not minimized\n",
                 path.c_str(), rv.kernel.c_str(), failure_class_name(rv.failure), w->device().name().c_str());
    return 2;
  }
  // The domain is unbounded here: the case only ever gets smaller.
  FuzzLimits big;
  big.max_batch = big.max_heads = big.max_seq = big.max_dim = big.max_work = int64_t{1} << 40;
  big.max_specials = big.max_special_count = big.max_explicit = int64_t{1} << 30;
  big.domain = cf.the_case.values.domain;  // shrinking keeps the recorded value domain
  big.dtype = cf.the_case.problem.dtype;  // and the dtype
  big.passes = static_cast<uint8_t>(1u << static_cast<int>(cf.the_case.pass));  // and the recorded pass
  const CaseDomain dom(big);
  int checks = 1;
  auto timed = [&](const Case& c) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > o.max_time_s) {
      checks = o.max_checks;  // stop the greedy loop
      return false;
    }
    return still_fails(c);
  };
  Case best = shrink_case(cf.the_case, dom, timed, o.max_checks, checks);
  still_fails(best);  // the recorded verdict is the final case's
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CorpusFile mf;
  mf.tool.name = "attn-fuzz";
  mf.tool.command = "attn-fuzz --minimize " + path;
  mf.the_case = best;
  if (!cf.the_case.label.empty()) mf.the_case.label = cf.the_case.label + "-min";
  RecordedVerdict nv = rv;
  nv.device = last.device;
  nv.reason = last.reason;
  nv.max_ratio = last.max_ratio;
  nv.signature = failure_signature(last);
  mf.verdict = nv;
  fs::path saved;
  try {
    saved = save_to_corpus_dir(o.out_dir, mf);
  } catch (const CorpusError& e) {
    std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
    return 2;
  }
  const Problem &a = cf.the_case.problem, &b = best.problem;
  std::printf(
      "minimized %s (%s, %s) in %d check(s), %.1f s:\n  before: %s\n  after:  %s\n  wrote %s\n  replay: %s\n",
      path.c_str(), rv.kernel.c_str(), failure_class_name(rv.failure), checks, secs,
      describe(cf.the_case).c_str(), describe(best).c_str(), saved.c_str(),
      replay_command(cfg, saved.string()).c_str());
  (void)a;
  (void)b;
  return 0;
}

}  // namespace attnfuzz::fuzz
