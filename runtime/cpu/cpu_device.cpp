// cpu_device.cpp - the cpu backend of the device layer: shared-memory buffers, emulated launches in a child
// process.
//
// Every buffer is a MAP_SHARED region (a forked launch writes the parent's memory) between two large
// PROT_NONE fences, so a kernel writing or reading far out of bounds faults instead of landing silently in
// another mapping of the process; the fault address names the buffer. Launches measure the heap they leave
// allocated (a leaking kernel), and in-process launches can be watched for hangs that pass no barrier.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "attnfuzz/device.h"
#include "runtime/cpu/emulator.h"

namespace hipemu {
int take_last_error();
}

namespace attnfuzz {
namespace {

using Clock = std::chrono::steady_clock;

// What a forked launch reports back through a shared page.
struct ChildReport {
  int finished;
  int rc;
  char message[2000];
  uint64_t fault_address;  // set by the child's SIGSEGV / SIGBUS handler
  int fault_access;        // 0 unknown, 1 read, 2 write
  int64_t grew[3];         // resident memory left by the launch and by the confirming second and third launches
  int confirmed;           // the confirming launches ran
  std::atomic<uint64_t> progress;  // blocks the child's launches finished (hipemu::progress_counter)
};

// PROT_NONE bytes on each side of every buffer: an access up to this far outside any buffer faults.
constexpr size_t kFenceBytes = size_t{256} << 20;
constexpr size_t kPage = 4096;

ChildReport* g_child_report = nullptr;  // the forked child's report page (its fault handler writes it)

void child_fault_handler(int sig, siginfo_t* si, void* ctx) {
  if (g_child_report && si && si->si_code > 0) {  // a fault the kernel raised, not kill() / raise()
    g_child_report->fault_address = reinterpret_cast<uintptr_t>(si->si_addr);
#if defined(__x86_64__)
    const auto* uc = static_cast<const ucontext_t*>(ctx);
    g_child_report->fault_access = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? 2 : 1;
#else
    (void)ctx;
#endif
  }
  signal(sig, SIG_DFL);  // returning re-runs the access, which now ends the process with the signal
}

// Resident memory of this process (/proc/self/statm, a few microseconds): what a leaking launch grows. (A
// heap walk such as mallinfo2() would also see untouched allocations, but costs up to milliseconds on a
// fragmented heap, on every launch.)
// The file stays open (a pread at offset 0 reads it afresh), reopened in a forked child: /proc/self is the
// process that opened it.
int64_t resident_bytes() {
  static std::mutex mu;
  static int fd = -1;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lk(mu);
  if (const pid_t me = getpid(); fd < 0 || owner != me) {
    if (fd >= 0 && owner != me) close(fd);  // the parent's, inherited
    fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    owner = me;
    if (fd < 0) return 0;
  }
  char buf[128];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = 0;
  long long size = 0, resident = 0;
  if (std::sscanf(buf, "%lld %lld", &size, &resident) != 2) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

std::string mib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return b;
}

std::string leak_message(int64_t a, int64_t b, size_t limit) {
  return "memory grows " + mib(std::min(a, b)) + " per launch (" + mib(a) + ", then " + mib(b) +
         " kept by the last two of three launches in a row; limit " + mib(static_cast<int64_t>(limit)) + "): a leak";
}

// One watchdog thread for in-process launches: calls the hang handler when a launch outlives its timeout.
std::atomic<HangHandler> g_hang_handler{nullptr};
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog;  // never destroyed: the thread may outlive static destruction
    return *w;
  }
  void arm(const char* kernel, double seconds) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!started_) {
      std::thread([this] { loop(); }).detach();
      started_ = true;
    }
    kernel_ = kernel;
    seconds_ = seconds;
    armed_at_ = Clock::now();
    deadline_ =
        armed_at_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    cpu0_ = cpu_seconds();
    seen_ = hipemu::progress_counter()->load(std::memory_order_relaxed);
    ++gen_;
    armed_ = true;
    cv_.notify_one();
  }
  void disarm() {
    std::lock_guard<std::mutex> lk(mu_);
    armed_ = false;
  }

 private:
  // A launch counts as hung when the process has spent `seconds` of CPU time since it started or last
  // finished a block (a slow launch on a loaded machine gets little CPU per wall second and is not blamed;
  // a large one that keeps finishing blocks is not hung), or after ten times that in wall time (a kernel
  // blocked without spinning).
  static double cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (!armed_) {
        cv_.wait(lk);
        continue;
      }
      const auto d = deadline_;
      const uint64_t gen = gen_;
      cv_.wait_until(lk, std::min(d, Clock::now() + std::chrono::milliseconds(250)));  // progress looks
      if (!armed_ || gen != gen_) continue;
      if (const uint64_t p = hipemu::progress_counter()->load(std::memory_order_relaxed); p != seen_) {
        seen_ = p;  // a block finished since the last look: the count starts again
        armed_at_ = Clock::now();
        cpu0_ = cpu_seconds();
        deadline_ = armed_at_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds_));
        continue;
      }
      if (Clock::now() < d) continue;
      const double used = cpu_seconds() - cpu0_;
      if (used < seconds_ && Clock::now() < armed_at_ + std::chrono::duration_cast<Clock::duration>(
                                                            std::chrono::duration<double>(10 * seconds_))) {
        deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(std::max(0.05, seconds_ - used)));
        continue;
      }
      armed_ = false;
      const HangHandler h = g_hang_handler.load();
      const std::string k = kernel_;
      const double s = seconds_;
      lk.unlock();
      if (h) h(k.c_str(), s);
      lk.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, armed_ = false;
  Clock::time_point deadline_, armed_at_;
  std::string kernel_;
  double seconds_ = 0, cpu0_ = 0;
  uint64_t gen_ = 0, seen_ = 0;
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(DeviceOptions o) : Device(o) {}
  ~CpuDevice() override {
    for (auto& [p, n] : sizes_) munmap(static_cast<char*>(p) - kFenceBytes, n + 2 * kFenceBytes);
  }

  Backend backend() const override { return Backend::kCpu; }

  std::string name() const override {
    std::string s = "cpu emulator (" + std::to_string(workers()) + (workers() == 1 ? " worker" : " workers") + ", warp " +
                    std::to_string(opts_.warp_size) + ", order " + thread_order_name(opts_.order);
    if (opts_.order == ThreadOrder::kShuffle) s += "/" + std::to_string(opts_.order_seed);
    return s + (opts_.isolate ? ", isolated)" : ")");
  }

  // MAP_SHARED (a forked launch writes the parent's buffers), whole pages, between PROT_NONE fences (a
  // reservation that costs no memory). Callers that want every stray byte caught allocate whole pages.
  void* alloc(size_t bytes) override {
    const size_t n = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
    char* r = static_cast<char*>(
        mmap(nullptr, n + 2 * kFenceBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (r == MAP_FAILED) throw DeviceError("cpu backend: cannot reserve " + std::to_string(bytes) + " bytes");
    void* p = mmap(r + kFenceBytes, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) {
      munmap(r, n + 2 * kFenceBytes);
      throw DeviceError("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    }
    std::lock_guard<std::mutex> lk(mu_);
    sizes_[p] = n;
    return p;
  }
  void free(void* p) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    munmap(static_cast<char*>(p) - kFenceBytes, it->second + 2 * kFenceBytes);
    sizes_.erase(it);
  }
  void to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  const void* host_view(const void* src, size_t) const override { return src; }
  void synchronize() override {}

  LaunchResult launch(const af_kernel& k, const af_problem& p, const af_buffers& b) override {
    configure();
    return opts_.isolate ? launch_forked(k, p, b) : launch_here(k, p, b);
  }

 private:
  unsigned workers() const {
    return opts_.workers ? opts_.workers : std::max(1u, std::thread::hardware_concurrency());
  }

  void configure() {
    hipemu::Config& c = hipemu::config();
    c.order = opts_.order == ThreadOrder::kForward   ? hipemu::Order::kForward
              : opts_.order == ThreadOrder::kReverse ? hipemu::Order::kReverse
                                                     : hipemu::Order::kShuffle;
    c.seed = opts_.order_seed;
    c.workers = workers();
    c.warp_size = opts_.warp_size;
    c.max_dynamic_shared = opts_.max_dynamic_shared;
    c.deadline_s = opts_.timeout_s;  // in-process: catches hangs that pass through barriers
    hipemu::take_last_error();
  }

  static LaunchResult from_rc(int rc, const std::string& msg) {
    LaunchResult r;
    if (rc == 0) return r;
    r.message = msg.empty() ? "hip error " + std::to_string(rc) : msg;
    r.status = msg.find("timeout:") != std::string::npos ? LaunchStatus::kHang : LaunchStatus::kLaunchError;
    return r;
  }

  LaunchResult launch_here(const af_kernel& k, const af_problem& p, const af_buffers& b) {
    const bool watch = opts_.timeout_s > 0 && g_hang_handler.load() != nullptr;
    const int64_t heap0 = opts_.leak_limit_bytes ? resident_bytes() : 0;
    if (watch) Watchdog::get().arm(k.name, opts_.timeout_s);
    const auto t0 = Clock::now();
    int rc = k.launch(&p, &b, nullptr);
    if (rc == 0) rc = hipemu::take_last_error();
    const auto t1 = Clock::now();
    if (watch) Watchdog::get().disarm();
    LaunchResult r = from_rc(rc, hipemu::last_error_message());
    r.ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    if (opts_.leak_limit_bytes) {
      // Three launches of this kernel in a row that each leave the limit allocated: a leak (one or two alone
      // may be a kernel library's one-time cache, or per-thread caches warming: see launch_forked).
      const int64_t grew = resident_bytes() - heap0;
      Strike& s = strikes_[reinterpret_cast<const void*>(k.launch)];
      if (grew >= static_cast<int64_t>(opts_.leak_limit_bytes)) {
        if (s.count++ > 1 && r.status == LaunchStatus::kOk) {
          r.status = LaunchStatus::kCrash;
          r.message = leak_message(s.last, grew, opts_.leak_limit_bytes);
        }
        s.last = grew;
      } else {
        s.count = 0;
      }
    }
    return r;
  }

  LaunchResult launch_forked(const af_kernel& k, const af_problem& p, const af_buffers& b) {
    auto* rep = static_cast<ChildReport*>(
        mmap(nullptr, sizeof(ChildReport), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (rep == MAP_FAILED) throw DeviceError("cpu backend: cannot map the launch report page");
    new (rep) ChildReport();  // zeroed
    std::fflush(stdout);
    std::fflush(stderr);
    const auto t0 = Clock::now();
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      munmap(rep, sizeof *rep);
      throw DeviceError(std::string("cpu backend: fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {  // child: run the kernel, report, leave without running the parent's atexit handlers
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the process that waits for it
      if (getppid() != parent) _exit(1);
      g_child_report = rep;
      struct sigaction sa {};
      sa.sa_sigaction = child_fault_handler;
      sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGSEGV, &sa, nullptr);
      sigaction(SIGBUS, &sa, nullptr);
      // The launching process's own handlers (a fuzzer's crash handler) must not run here: the parent
      // reports what this child died of.
      for (int sig : {SIGABRT, SIGILL, SIGFPE, SIGTRAP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2})
        signal(sig, SIG_DFL);
      hipemu::config().deadline_s = 0;
      hipemu::set_progress_counter(&rep->progress);  // the parent's watch reads it
      const int64_t limit = static_cast<int64_t>(opts_.leak_limit_bytes);
      int64_t heap0 = limit ? resident_bytes() : 0;
      int rc = k.launch(&p, &b, nullptr);
      if (rc == 0) rc = hipemu::take_last_error();
      rep->rc = rc;
      std::snprintf(rep->message, sizeof rep->message, "%s", hipemu::last_error_message().c_str());
      if (limit) {
        // Confirm: do two more launches each leave as much again? (The launch's first OS threads warm
        // per-thread caches: malloc arenas, thread stacks, a plug-in's dynamic TLS. On a 16-core host those
        // grew by 4-6 MiB on the second launch too, and never on the third.)
        rep->grew[0] = resident_bytes() - heap0;
        rep->confirmed = rc == 0;
        for (int n = 1; n < 3 && rep->confirmed && rep->grew[n - 1] >= limit; ++n) {
          heap0 = resident_bytes();
          rep->confirmed = k.launch(&p, &b, nullptr) == 0;
          hipemu::take_last_error();
          rep->grew[n] = resident_bytes() - heap0;
        }
      }
      rep->finished = 1;
      _exit(0);
    }
    LaunchResult r;
    int status = 0;
    // A hang is a launch that stops making progress: killed when no block finished for the timeout (a slow
    // launch, e.g. a large case on a loaded emulator, finishes blocks all along and is never called hung).
    const auto timeout =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.timeout_s));
    uint64_t seen = 0;
    auto moved = t0;  // when the child last finished a block (or started)
    // Wait for the child: poll() on a pidfd wakes the moment it exits; without pidfd (old kernels),
    // sleep-and-retry with a backoff capped at 2 ms.
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    auto sleep = std::chrono::microseconds(20);
    for (;;) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) {
        r.status = LaunchStatus::kCrash;
        r.message = std::string("waitpid failed: ") + std::strerror(errno);
        break;
      }
      const auto now = Clock::now();
      if (const uint64_t p = rep->progress.load(std::memory_order_relaxed); p != seen) {
        seen = p;
        moved = now;
      }
      if (opts_.timeout_s > 0 && now > moved + timeout) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        r.status = LaunchStatus::kHang;
        char m[256];
        std::snprintf(m, sizeof m,
                      "no block of the launch finished for %g s (%llu finished in %.1f s): killed",
                      opts_.timeout_s, static_cast<unsigned long long>(seen),
                      std::chrono::duration<double>(now - t0).count());
        r.message = m;
        break;
      }
      if (pidfd >= 0) {
        pollfd pfd{pidfd, POLLIN, 0};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(moved + timeout - now).count() + 1;
        poll(&pfd, 1, static_cast<int>(std::clamp<long long>(left, 1, 250)));
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(2000));
      }
    }
    if (pidfd >= 0) close(pidfd);
    r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (r.status == LaunchStatus::kOk) {
      if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        r.status = LaunchStatus::kCrash;
        r.message =
            std::string("the kernel crashed: signal ") + std::to_string(sig) + " (" + strsignal(sig) + ")";
        if (sig == SIGSEGV || sig == SIGBUS)
          r.message += ": an access outside any mapped memory (far out of bounds, or a fiber stack overflow)";
        r.fault_address = rep->fault_address;
        r.fault_access = rep->fault_access;
      } else if (!rep->finished) {
        r.status = LaunchStatus::kCrash;
        r.message = "the kernel's process exited with status " + std::to_string(WEXITSTATUS(status)) +
                    " before the launch finished";
      } else {
        const LaunchResult c = from_rc(rep->rc, rep->message);
        r.status = c.status;
        r.message = c.message;
        const int64_t limit = static_cast<int64_t>(opts_.leak_limit_bytes);
        if (r.status == LaunchStatus::kOk && limit && rep->confirmed && rep->grew[0] >= limit &&
            rep->grew[1] >= limit && rep->grew[2] >= limit) {
          r.status = LaunchStatus::kCrash;
          r.message = leak_message(rep->grew[1], rep->grew[2], opts_.leak_limit_bytes);
        }
      }
    }
    munmap(rep, sizeof *rep);
    return r;
  }

  struct Strike {
    int count = 0;     // launches in a row that left at least the leak limit allocated
    int64_t last = 0;  // bytes the last of them left
  };
  std::mutex mu_;
  std::map<void*, size_t> sizes_;
  std::map<const void*, Strike> strikes_;  // per kernel (its launch function), in-process launches
};

}  // namespace

void set_inprocess_hang_handler(HangHandler h) { g_hang_handler = h; }

std::unique_ptr<Device> make_cpu_device(const DeviceOptions& o) { return std::make_unique<CpuDevice>(o); }

}  // namespace attnfuzz
