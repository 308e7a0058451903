// cpu_device.cpp - the cpu backend of the device layer: shared-memory buffers, emulated launches in a child process.
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(DeviceOptions o) : Device(o) {}
  ~CpuDevice() override {
    for (auto& [p, n] : sizes_) munmap(p, n);
  }

  Backend backend() const override { return Backend::kCpu; }

  std::string name() const override {
    std::string s = "cpu emulator (" + std::to_string(workers()) + " workers, warp " +
                    std::to_string(opts_.warp_size) + ", order " + thread_order_name(opts_.order);
    if (opts_.order == ThreadOrder::kShuffle) s += "/" + std::to_string(opts_.order_seed);
    return s + (opts_.isolate ? ", isolated)" : ")");
  }

  // MAP_SHARED: a forked launch writes the parent's buffers.
  void* alloc(size_t bytes) override {
    const size_t n = std::max<size_t>(bytes, 1);
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw DeviceError("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    std::lock_guard<std::mutex> lk(mu_);
    sizes_[p] = n;
    return p;
  }
  void free(void* p) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    munmap(p, it->second);
    sizes_.erase(it);
  }
  void to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
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
    const auto t0 = Clock::now();
    int rc = k.launch(&p, &b, nullptr);
    if (rc == 0) rc = hipemu::take_last_error();
    LaunchResult r = from_rc(rc, hipemu::last_error_message());
    r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return r;
  }

  LaunchResult launch_forked(const af_kernel& k, const af_problem& p, const af_buffers& b) {
    auto* rep = static_cast<ChildReport*>(
        mmap(nullptr, sizeof(ChildReport), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (rep == MAP_FAILED) throw DeviceError("cpu backend: cannot map the launch report page");
    std::memset(rep, 0, sizeof *rep);
    std::fflush(stdout);
    std::fflush(stderr);
    const auto t0 = Clock::now();
    const pid_t pid = fork();
    if (pid < 0) {
      munmap(rep, sizeof *rep);
      throw DeviceError(std::string("cpu backend: fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {  // child: run the kernel, report, leave without running the parent's atexit handlers
      hipemu::config().deadline_s = 0;
      int rc = k.launch(&p, &b, nullptr);
      if (rc == 0) rc = hipemu::take_last_error();
      rep->rc = rc;
      std::snprintf(rep->message, sizeof rep->message, "%s", hipemu::last_error_message().c_str());
      rep->finished = 1;
      _exit(0);
    }
    LaunchResult r;
    int status = 0;
    const auto limit = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.timeout_s));
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
      if (opts_.timeout_s > 0 && now > limit) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        r.status = LaunchStatus::kHang;
        r.message = "the kernel did not finish within " + std::to_string(opts_.timeout_s) + " s and was killed";
        break;
      }
      if (pidfd >= 0) {
        pollfd pfd{pidfd, POLLIN, 0};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(limit - now).count() + 1;
        poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
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
        r.message = std::string("the kernel crashed: signal ") + std::to_string(sig) + " (" + strsignal(sig) + ")";
        if (sig == SIGSEGV || sig == SIGBUS)
          r.message += ": an access outside any mapped memory (far out of bounds, or a fiber stack overflow)";
      } else if (!rep->finished) {
        r.status = LaunchStatus::kCrash;
        r.message = "the kernel's process exited with status " + std::to_string(WEXITSTATUS(status)) +
                    " before the launch finished";
      } else {
        const LaunchResult c = from_rc(rep->rc, rep->message);
        r.status = c.status;
        r.message = c.message;
      }
    }
    munmap(rep, sizeof *rep);
    return r;
  }

  std::mutex mu_;
  std::map<void*, size_t> sizes_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const DeviceOptions& o) { return std::make_unique<CpuDevice>(o); }

}  // namespace attnfuzz
