// device.h - the one device layer: memory, copies, kernel launch with timeout, errors, timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnfuzz/abi.h"

namespace attnfuzz {

// kAdapter: kernels of an external process started with --adapter CMD (runtime/adapter, adapters/PROTOCOL.md).
enum class Backend { kCpu, kNvidia, kAmd, kAdapter };
const char* backend_name(Backend b);
// "cpu" | "nvidia" | "amd" | "adapter"; nullopt-like: returns false on unknown text.
bool parse_backend(const std::string& text, Backend& out);

// Thrown for device-layer failures that are the tool's or the machine's fault (no device, out of
// memory, failed copy). Kernel misbehaviour is reported through LaunchResult, never thrown.
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How a launch ended.
enum class LaunchStatus {
  kOk,           // ran to completion
  kLaunchError,  // the backend refused or aborted the launch (bad config, barrier divergence, ...)
  kCrash,        // the kernel faulted (signal on cpu, illegal address on GPU)
  kHang          // exceeded the timeout and was stopped
};
const char* launch_status_name(LaunchStatus s);

struct LaunchResult {
  LaunchStatus status = LaunchStatus::kOk;
  std::string message;  // backend's words: error name, signal, emulator diagnostics
  double ms = 0;        // wall time of the launch incl. synchronisation
  // cpu backend: where a crashing launch faulted (0: unknown) and how (0 unknown, 1 read, 2 write), so the
  // runner can name the buffer whose guard pages it hit.
  uint64_t fault_address = 0;
  int fault_access = 0;
};

// Emulator schedule within a round (cpu backend only).
enum class ThreadOrder { kForward, kReverse, kShuffle };
const char* thread_order_name(ThreadOrder o);
bool parse_thread_order(const std::string& text, ThreadOrder& out);

struct DeviceOptions {
  // cpu backend
  ThreadOrder order = ThreadOrder::kForward;
  uint64_t order_seed = 1;     // shuffle seed
  unsigned workers = 0;        // OS threads for blocks; 0 = hardware concurrency
  unsigned warp_size = 32;     // 32 or 64
  bool isolate = true;         // run each launch in a forked child: crashes and hangs cannot take the tool down
  size_t max_dynamic_shared = 64 * 1024;
  // Resident memory a launch may leave behind before it counts as a leak: two launches of a kernel in a
  // row over it (in-process), or one launch confirmed by a second (isolated), make the launch a crash
  // "memory grows N MiB per launch". 0: not measured.
  size_t leak_limit_bytes = size_t{4} << 20;
  // all backends
  double timeout_s = 30;       // a launch that takes longer is a hang
  // adapter backend: a kernel that declares "recompiles_per_shape" gets this long (if longer than timeout_s) for
  // the first call at a problem its adapter process has not answered yet: that call compiles (adapters/PROTOCOL.md)
  double compile_timeout_s = 300;
  int gpu_index = 0;
  // adapter backend: the command line of the adapter process (run with /bin/sh -c)
  std::string adapter_command;
};

// What the tool controls on a device. An adapter receives copies of the inputs and returns outputs: the
// device memory and the thread schedule are the adapter's, so the detectors that work on them (guard
// poison and canaries, poison swap, thread orders, TSan, compute-sanitizer) do not apply (docs/semantics.md).
struct DeviceCapabilities {
  bool memory_guards = true;    // the kernel reads and writes the tool's guarded buffers
  bool thread_schedule = true;  // the tool runs the kernel's threads (cpu) or its sanitizers can (GPU)
};

class Device {
 public:
  virtual ~Device() = default;
  virtual Backend backend() const = 0;
  virtual std::string name() const = 0;  // "cpu emulator (2 workers, warp 32, order shuffle/7)", "NVIDIA H200"
  virtual void* alloc(size_t bytes) = 0;  // throws DeviceError
  virtual void free(void* p) = 0;
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(void* dst, const void* pattern, size_t pattern_bytes, size_t bytes);  // repeats pattern
  // Device-to-host copies of one batch, all done when it returns: a GPU backend issues them together and
  // synchronises once (the default calls to_host for each).
  struct HostCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  virtual void to_host_all(const std::vector<HostCopy>& copies);
  // The device bytes at src readable in place by the host (the cpu backend's memory), or null: copy them.
  virtual const void* host_view(const void* src, size_t bytes) const {
    (void)src, (void)bytes;
    return nullptr;
  }
  virtual void synchronize() = 0;
  // Runs k.launch for this backend, waits for completion (or the timeout), and reports.
  virtual LaunchResult launch(const af_kernel& k, const af_problem& p, const af_buffers& b) = 0;
  // After a crash or hang on a GPU the context is unusable; the tool must stop using the device.
  virtual bool usable() const { return true; }
  virtual DeviceCapabilities capabilities() const { return {}; }
  const DeviceOptions& options() const { return opts_; }
  void set_options(const DeviceOptions& o) { opts_ = o; }

 protected:
  explicit Device(DeviceOptions o) : opts_(o) {}
  DeviceOptions opts_;
};

// Backends compiled into this binary, in auto-selection preference order (GPU first, cpu last).
std::vector<Backend> built_backends();
// Whether a backend is built and has a device right now; why it cannot be used otherwise.
bool backend_available(Backend b, std::string* why = nullptr);
// Opens a backend; "auto" = first GPU backend with a device, else cpu. Throws DeviceError with a
// clear message when the backend is not built or has no device.
std::unique_ptr<Device> open_device(const std::string& backend, const DeviceOptions& opts);
std::unique_ptr<Device> open_device(Backend backend, const DeviceOptions& opts);

// cpu backend, in-process launches (isolate = false): called from a watchdog thread when a launch runs
// past its timeout without reaching a barrier (the launching thread cannot be stopped). The handler
// records what it must and ends the process; unset (the default), such a launch just runs on.
using HangHandler = void (*)(const char* kernel, double seconds);
void set_inprocess_hang_handler(HangHandler h);

}  // namespace attnfuzz
