// emulator.h - configuration of the CPU fiber emulator (what the cpu device sets before a launch).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hipemu {

enum class Order { kForward, kReverse, kShuffle };

struct Config {
  Order order = Order::kForward;
  uint64_t seed = 1;             // shuffle seed (mixed with the block index)
  unsigned workers = 1;          // OS threads that run blocks
  unsigned warp_size = 32;       // 32 or 64
  size_t max_dynamic_shared = 64 * 1024;
  size_t stack_bytes = 128 * 1024;  // per GPU thread (fiber), with a guard page below
  double deadline_s = 0;         // > 0: abandon the launch when a fiber yields after this many seconds
                                 // in which no block of the launch finished (slow is not hung)
  bool strict_sites = true;      // threads at different __syncthreads() lines is divergence
};

// The process-wide configuration (set before a launch; not changed while one runs).
Config& config();
// Launch progress: every finished block adds 1 to this counter (a process-wide one unless set; a forked
// launch points it at a page its parent reads). A watchdog calls a launch hung only when it stops moving.
std::atomic<uint64_t>* progress_counter();
void set_progress_counter(std::atomic<uint64_t>* c);  // nullptr: the process-wide counter
// The message that goes with the last error code (empty if none).
std::string last_error_message();

// Limits a launch must respect (as on current AMD and NVIDIA GPUs).
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimYZ = 65535;

}  // namespace hipemu
