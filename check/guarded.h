// guarded.h - device buffers with poisoned guard zones before and after, and canary checks after a launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/device.h"

namespace attnfuzz {

// A guard word that changed: which buffer, where (bytes from the payload's start; negative = before it,
// >= payload size = after it), what it holds now.
struct CanaryHit {
  std::string buffer;
  int64_t offset;
  uint32_t got;
  uint32_t expected;
};

// Poison patterns. Guards and unwritten outputs hold quiet NaNs with recognisable payloads, so a kernel
// that reads a guard or skips an output element produces NaN, and the report can say which it was.
constexpr uint32_t kGuardPoison = 0x7fa5a5a5u;     // NaN: reads past the end turn into NaN
constexpr uint32_t kGuardPoisonAlt = 0x3f9d70a4u;  // 1.23f: a finite second poison (OOB-read detector)
constexpr uint32_t kOutputPoison = 0x7fbeefedu;    // NaN written into O / LSE before every launch

class GuardedBuffer {
 public:
  GuardedBuffer(Device& dev, std::string name, size_t bytes, size_t guard_bytes, uint32_t poison);
  ~GuardedBuffer();
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  void* data() const { return payload_; }  // nullptr-free even for 0 bytes
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

  void upload(const void* host);     // host -> payload
  void download(void* host) const;   // payload -> host
  void fill_payload(uint32_t word);  // every 32-bit word of the payload
  void repoison(uint32_t poison);    // refill both guard zones
  // Guard words that no longer hold the poison (at most max_hits reported, in address order).
  std::vector<CanaryHit> check(size_t max_hits = 16) const;
  // A payload download of read_back().
  struct Download {
    const GuardedBuffer* buffer;
    void* host;  // buffer->bytes() bytes
  };
  // The downloads and check() of every buffer (null ones skipped) in one read-back (Device::to_host_all: one
  // synchronisation on a GPU): each buffer's hits (at most max_hits), in the order of bufs.
  static std::vector<CanaryHit> read_back(Device& dev, const std::vector<Download>& downloads,
                                          const std::vector<const GuardedBuffer*>& bufs, size_t max_hits = 16);
  size_t changed_words() const { return changed_; }  // total changed guard words in the last check()
  // Byte offset of an address from the payload's start (negative = before it), and its distance from the
  // allocation (0 inside it): how the runner names the buffer whose guard pages a faulting access hit.
  int64_t offset_of(uint64_t address) const;
  uint64_t distance_to(uint64_t address) const;
  // The allocation a buffer of `bytes` with `guard_bytes` guards takes (whole pages), and this one's.
  static size_t allocation_bytes(size_t bytes, size_t guard_bytes);
  size_t allocation() const;
  // Reuses the allocation for a payload of `bytes` whose allocation_bytes() it holds: the after-guard moves to the
  // new payload end (and takes the spare bytes) and every byte outside the payload holds the poison, as in a new
  // buffer of that size.
  void relayout(size_t bytes);

 private:
  Device& dev_;
  std::string name_;
  size_t bytes_, guard_, after_;  // after_: the after-guard, up to the allocation's end (whole pages)
  // Compares allocation bytes [from, to) held at `at` with the poison, counting changed words into changed_.
  void scan(const unsigned char* at, size_t from, size_t to, size_t max_hits, std::vector<CanaryHit>& hits) const;
  uint32_t poison_;
  char* base_;
  void* payload_;
  mutable size_t changed_ = 0;
};

// For a fatal-signal handler (async-signal-safe: no allocation, no locks): when `address` lies within 1 GiB
// of a live guarded buffer (the cpu device fences 256 MiB each side of every buffer, so a far out-of-bounds
// access faults there), writes "<N> bytes past the end of buffer <name>" (or "before the start") into `out`,
// the buffer's name into `buffer` and the byte offset from its payload's start into `offset`; returns true. Used when a kernel faults in-process, where no
// launch outcome is left to name the buffer (the worker process dies; fuzz/worker.cpp).
// Wall seconds this thread spent in guarded buffers' device work (allocation, uploads, downloads, fills, guard
// reads) and how many such calls: the campaign's "buffers" phase (fuzz/README.md "Where a GPU campaign's time goes").
struct BufferTraffic {
  double seconds = 0;
  uint64_t calls = 0;
};
BufferTraffic buffer_traffic();

bool describe_guard_fault(uint64_t address, char* out, size_t out_size, char* buffer, size_t buffer_size,
                          int64_t* offset);

}  // namespace attnfuzz
