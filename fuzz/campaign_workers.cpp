// campaign_workers.cpp - a campaign's worker processes: their configuration, the libFuzzer fork-mode
// processes (start, logs, signals, reaping, scratch), the lifeline, and the --mps re-runs of suspects.
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

namespace {

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

}  // namespace

fs::path write_worker_config(const CampaignOptions& o, const Paths& p) {
  const fs::path cfg_path = p.work / "worker.json";
  WorkerConfig job_cfg = o.worker;
  // Compile-aware fuzzing: every fork-mode job starts its adapter again, which has compiled nothing; longer jobs
  // keep a JIT's compiled shapes (fuzz/shape_pool.h) for longer.
  if (job_cfg.backend == "adapter" && job_cfg.compile_aware != "off")
    job_cfg.min_job_s = std::max(job_cfg.min_job_s, kCompileAwareMinJobS);
  if (!o.sync_dir.empty()) job_cfg.min_job_s = 0;  // corpus entries are published after each job's merge
  if (o.max_time_s > 0)  // when the workers are stopped (Stop): fork-mode jobs end before it
    job_cfg.stop_unix =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() +
        stop_after_s(o.max_time_s);
  std::ofstream(cfg_path) << worker_config_to_json(job_cfg).dump(2) << "\n";
  return cfg_path;
}

int libfuzzer_timeout_s(const WorkerConfig& cfg) {
  // The second line behind the device's own launch timeout. An adapter input may also restart the adapter (a
  // handshake of up to 120 s: importing torch under load) and classify a failure with ~10 relaunches, each
  // under the adapter's own timeout: a shorter line killed healthy workers. A JIT kernel's first call at a new
  // problem may take --compile-timeout.
  const double lf_line =
      cfg.backend == "adapter" ? 120 + 10 * cfg.timeout_s + cfg.compile_timeout_s : 2 * cfg.timeout_s;
  return static_cast<int>(std::max(5.0, std::ceil(lf_line) + 3));
}

pid_t spawn(const std::vector<std::string>& args, const Env& env, const fs::path& log, bool keep_stdout) {
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
    if (!keep_stdout) ::dup2(fd, 1);
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

// ------------------------------------------------------------------------------------------ lifeline

bool Lifeline::open() {
  int life[2] = {-1, -1};
  if (::pipe2(life, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "attn-fuzz: cannot create a pipe: %s\n", std::strerror(errno));
    return false;
  }
  read = life[0];
  write = life[1];
  ::fcntl(read, F_SETFD, 0);  // the read end is inherited through fork and exec
  return true;
}

void Lifeline::close_read() {
  if (read >= 0) ::close(read);
  read = -1;
}

void Lifeline::close_write() {
  if (write >= 0) ::close(write);
  write = -1;
}

Lifeline::~Lifeline() {
  close_read();
  close_write();
}

// ------------------------------------------------------------------------------------------ fork scratch

namespace {
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
}  // namespace

ForkScratch::ForkScratch(const Paths& p) : list_(p.work / "fork-scratch.txt") {
  // libFuzzer's fork mode keeps every job's new inputs and their features as files in a temporary directory
  // (TMPDIR, default /tmp) and deletes them after each merge: scratch files, created and deleted by the
  // thousand. Unless TMPDIR is set, they go to /dev/shm (tmpfs) when it has 1 GiB free: on a busy disk file
  // system each create cost ~0.8 ms on the dev box, ~15% of a worker's time. Removed again when the
  // fork-mode process ends (it leaves its directory behind when it is killed).
  if (const char* t = std::getenv("TMPDIR"); !t || !*t) {
    struct statvfs sv {};
    if (::access("/dev/shm", W_OK | X_OK) == 0 && ::statvfs("/dev/shm", &sv) == 0 &&
        static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize) >= 1024.0 * 1024 * 1024)
      tmp_ = "/dev/shm";
  }
  // A campaign killed outright (SIGKILL, a node lost) could not remove its fork-mode scratch, on tmpfs: RAM.
  // Its directories are listed in work/fork-scratch.txt; the next campaign on this OUT removes those whose
  // process is gone.
  std::error_code ec;
  for (const std::string& d : read_lines(list_.string())) {
    const size_t at = d.rfind("FuzzWithFork");
    const long pid = at == std::string::npos ? 0 : std::atol(d.c_str() + at + 12);
    if (pid <= 0) continue;
    std::string
        st;  // "pid (comm) state ...": none when gone; 'Z' for a zombie nobody reaped (attn-fuzz was killed)
    std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/stat"), st);
    const size_t close = st.rfind(')');
    if (close == std::string::npos || (close + 2 < st.size() && st[close + 2] == 'Z')) {
      salvage_fork_scratch(d, p.inputs);
      fs::remove_all(d, ec);
    }
  }
}

Env ForkScratch::env() const {
  if (tmp_.empty()) return {};
  return {{"TMPDIR", tmp_}};
}

fs::path ForkScratch::of(pid_t master) const {  // libFuzzer's TempPath of a fork-mode process
  const char* t = std::getenv("TMPDIR");
  const fs::path tmp = !tmp_.empty() ? fs::path(tmp_) : fs::path(t && *t ? t : "/tmp");
  return tmp / ("libFuzzerTemp.FuzzWithFork" + std::to_string(master) + ".dir");
}

void ForkScratch::record(const std::vector<pid_t>& masters) const {
  std::ofstream f(list_);
  for (pid_t m : masters) f << of(m).string() << "\n";
}

// ------------------------------------------------------------------------------------------ libFuzzer logs

void LogTail::poll(FuzzerLine& l) {
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

// ------------------------------------------------------------------------------------------ fork-mode
// processes

FuzzerProcesses::FuzzerProcesses(const CampaignOptions& o, const Paths& p)
    : o_(o),
      p_(p),
      groups_(std::max<size_t>(1, o.gpu_ids.size())),
      per_group_(std::max(1u, o.workers / static_cast<unsigned>(groups_))) {}

void FuzzerProcesses::start(const fs::path& cfg_path, int lifeline, const MpsDaemon* mps,
                            const ForkScratch& scratch) {
  scratch_ = &scratch;
  const FuzzLimits& lim = o_.worker.limits;
  const int lf_timeout = libfuzzer_timeout_s(o_.worker);
  for (size_t g = 0; g < groups_; ++g) {
    std::vector<std::string> args{o_.worker_binary,
                                  "-fork=" + std::to_string(per_group_),
                                  "-ignore_crashes=1",
                                  "-ignore_timeouts=1",
                                  "-ignore_ooms=1",
                                  "-timeout=" + std::to_string(lf_timeout),
                                  "-rss_limit_mb=" + std::to_string(kRssLimitMb),
                                  "-max_len=" + std::to_string(64 + 4 * lim.max_explicit + 256),
                                  "-len_control=0",
                                  "-print_final_stats=1",
                                  "-artifact_prefix=" + (p_.artifacts / "").string()};
    if (o_.max_time_s > 0)
      args.push_back("-max_total_time=" + std::to_string(static_cast<long>(std::ceil(o_.max_time_s))));
    for (const auto& a : o_.fuzzer_args) args.push_back(a);
    args.push_back(p_.inputs.string());
    Env env{{kWorkerConfigEnv, fs::absolute(cfg_path).string()}, {kLifelineEnv, std::to_string(lifeline)}};
    for (const auto& kv : scratch.env()) env.push_back(kv);
    if (mps)
      for (const auto& kv : mps->client_env()) env.push_back(kv);
    if (!o_.gpu_ids.empty()) {
      env.push_back({"HIP_VISIBLE_DEVICES", o_.gpu_ids[g]});
      env.push_back({"CUDA_VISIBLE_DEVICES", o_.gpu_ids[g]});
    }
    Master m;
    m.log = p_.work / ("fuzzer-" + std::to_string(g) + ".log");
    m.pid = spawn(args, env, m.log);
    m.tail = std::make_unique<LogTail>(m.log);
    masters_.push_back(std::move(m));
  }
  std::vector<pid_t> pids;
  for (const auto& m : masters_) pids.push_back(m.pid);
  scratch.record(pids);
}

bool FuzzerProcesses::reap() {
  bool all_done = true;
  std::error_code ec;
  for (auto& m : masters_) {
    if (m.done) continue;
    int st = 0;
    const pid_t r = ::waitpid(m.pid, &st, WNOHANG);
    if (r == m.pid) {
      m.done = true;
      m.status = st;
      ::kill(-m.pid, SIGKILL);                  // any job the master left behind
      fs::remove_all(scratch_->of(m.pid), ec);  // and its temporary directory
    } else {
      all_done = false;
    }
  }
  return all_done;
}

// The orderly stop: SIGINT to the jobs only. Each exits with libFuzzer's interrupt code, its master sees
// "a child was interrupted" and ends on its own (exit 72, its temporary directory removed). SIGINT to the
// whole group also killed the `sh -c` that system() runs each job under, and libFuzzer counted every job
// running at the stop as a crash (the "12 worker crashes" of a 16-worker soak, with no failure saved).
void FuzzerProcesses::interrupt_jobs() {
  for (auto& m : masters_)
    if (!m.done)
      for (pid_t j : fork_jobs(m.pid)) ::kill(j, SIGINT);
}

void FuzzerProcesses::kill_all() {
  for (auto& m : masters_)
    if (!m.done) ::kill(-m.pid, SIGKILL);
}

FuzzerLine FuzzerProcesses::poll() {
  FuzzerLine lf;
  for (auto& m : masters_) {
    m.tail->poll(m.line);
    lf.ft += m.line.ft;
    lf.corp += m.line.corp;
    lf.crashes += m.line.crashes + m.line.ooms;
    lf.timeouts += m.line.timeouts;
  }
  return lf;
}

void FuzzerProcesses::report_abnormal(bool stopped) {
  for (auto& m : masters_) {
    m.tail->poll(m.line);
    const bool ok = WIFEXITED(m.status) && WEXITSTATUS(m.status) == 0;
    if (!ok && !stopped)  // a process we stopped ends however its signal left it: not abnormal
      std::fprintf(stderr,
                   "attn-fuzz: a libFuzzer process ended abnormally (%s); its log: %s\n  last line: %s\n",
                   WIFEXITED(m.status) ? ("exit " + std::to_string(WEXITSTATUS(m.status))).c_str()
                                       : ("signal " + std::to_string(WTERMSIG(m.status))).c_str(),
                   m.log.c_str(), m.tail->last().c_str());
  }
}

std::string FuzzerProcesses::first_error() const {
  std::string err;
  for (const auto& m : masters_) {
    std::ifstream f(m.log);
    for (std::string l; err.empty() && std::getline(f, l);)
      if (l.find("ERROR:") != std::string::npos) err = l;
  }
  return err;
}

// ------------------------------------------------------------------------------------------ --mps re-runs

// Each suspect input (work/mps-suspects) is re-run alone by the worker binary, one at a time, outside MPS (no
// CUDA_MPS_* in its environment) and with kMpsRecheckEnv set: it judges and saves the case like any worker,
// and a crash or hang that reproduces quarantines the kernel. Its artifacts go to their own folder.
namespace {
bool is_suspect(const fs::directory_entry& e) {  // (".<pid>.tmp": one being written)
  return e.is_regular_file() && e.path().filename().string()[0] != '.';
}
}  // namespace

bool MpsRechecks::step() {
  if (!enabled_) return false;
  std::error_code ec;
  if (pid_ > 0) {
    int st = 0;
    const bool late =
        std::chrono::steady_clock::now() - started_ > std::chrono::duration<double>(lf_timeout_ + 30.0);
    if (late) ::kill(-pid_, SIGKILL);
    if (::waitpid(pid_, &st, late ? 0 : WNOHANG) != pid_) return true;
    pid_ = -1;
    fs::remove(input_, ec);
    ++rechecked_;
  }
  const fs::path recheck_dir = p_.work / "mps-recheck";
  for (const auto& e : fs::directory_iterator(p_.work / "mps-suspects", ec)) {
    if (!is_suspect(e)) continue;
    fs::create_directories(recheck_dir, ec);
    std::vector<std::string> args{o_.worker_binary, "-timeout=" + std::to_string(lf_timeout_),
                                  "-rss_limit_mb=" + std::to_string(kRssLimitMb),
                                  "-artifact_prefix=" + (recheck_dir / "").string(), e.path().string()};
    Env env{{kWorkerConfigEnv, fs::absolute(cfg_path_).string()},
            {kLifelineEnv, std::to_string(lifeline_)},
            {kMpsRecheckEnv, "1"},
            {"CUDA_MPS_PIPE_DIRECTORY", ""},
            {"CUDA_MPS_LOG_DIRECTORY", ""}};
    pid_ = spawn(args, env, recheck_dir / "recheck.log");
    input_ = e.path();
    started_ = std::chrono::steady_clock::now();
    return true;
  }
  return false;
}

void MpsRechecks::drain() {
  if (!enabled_) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (step() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p_.work / "mps-suspects", ec)) pending_ += is_suspect(e);
}

}  // namespace attnfuzz::fuzz::campaign
