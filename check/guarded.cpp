// guarded.cpp - guard zones around device buffers: fill with poison, find changed canaries.
#include "check/guarded.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

namespace attnfuzz {

namespace {
size_t round4(size_t n) { return (n + 3) & ~size_t{3}; }

// The poison word as seen from a byte offset `phase` (0..3) into it: byte i of the result is poison byte
// (phase + i) % 4.
uint32_t rotated_poison(uint32_t poison, size_t phase) {
  unsigned char in[4], out[4];
  std::memcpy(in, &poison, 4);
  for (size_t i = 0; i < 4; ++i) out[i] = in[(phase + i) % 4];
  uint32_t r;
  std::memcpy(&r, out, 4);
  return r;
}

// True when n bytes at p repeat `word` (byte i == byte i % 4 of word): the first word matches and the bytes
// are 4-periodic (p[i] == p[i + 4], one memcmp of the buffer with itself shifted by a word). Any difference
// sends check() to its word-by-word scan, which finds the hits.
bool holds_pattern(const unsigned char* p, size_t n, uint32_t word) {
  if (n <= 4) return std::memcmp(p, &word, n) == 0;
  return std::memcmp(p, &word, 4) == 0 && std::memcmp(p, p + 4, n - 4) == 0;
}
// Live guarded buffers, readable from a signal handler: a slot is published by a release store of its
// allocation start (0: free) after its other fields are written.
struct FaultSlot {
  std::atomic<uintptr_t> lo{0};
  uintptr_t hi = 0, payload = 0;
  size_t bytes = 0;
  char name[24] = {0};
};
constexpr size_t kFaultSlots = 1024;
FaultSlot g_fault_slots[kFaultSlots];

void register_buffer(uintptr_t lo, uintptr_t hi, uintptr_t payload, size_t bytes, const std::string& name) {
  for (FaultSlot& s : g_fault_slots) {
    uintptr_t expected = 0;
    // Claim with a marker value that no allocation starts at, fill, then publish.
    if (s.lo.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      s.hi = hi;
      s.payload = payload;
      s.bytes = bytes;
      std::snprintf(s.name, sizeof s.name, "%s", name.c_str());
      s.lo.store(lo, std::memory_order_release);
      return;
    }
  }  // more live buffers than slots: the extra ones are not named in an in-process fault
}

void unregister_buffer(uintptr_t lo) {
  for (FaultSlot& s : g_fault_slots)
    if (s.lo.load(std::memory_order_acquire) == lo) {
      s.lo.store(0, std::memory_order_release);
      return;
    }
}

// Decimal digits of v at out (async-signal-safe); returns the count written.
size_t put_u64(char* out, size_t room, uint64_t v) {
  char d[24];
  size_t n = 0;
  do d[n++] = static_cast<char>('0' + v % 10); while ((v /= 10) && n < sizeof d);
  size_t w = 0;
  for (; w < n && w < room; ++w) out[w] = d[n - 1 - w];
  return w;
}
size_t put_str(char* out, size_t room, const char* s) {
  size_t w = 0;
  for (; s[w] && w < room; ++w) out[w] = s[w];
  return w;
}

}  // namespace

bool describe_guard_fault(uint64_t a, char* out, size_t out_size, char* buffer, size_t buffer_size,
                          int64_t* offset) {
  if (!out_size || !buffer_size) return false;
  const FaultSlot* near = nullptr;
  uint64_t best = 0;
  for (const FaultSlot& s : g_fault_slots) {
    const uintptr_t lo = s.lo.load(std::memory_order_acquire);
    if (lo <= 1) continue;
    const uint64_t d = a < lo ? lo - a : a >= s.hi ? a - s.hi + 1 : 0;
    if (!near || d < best) near = &s, best = d;
  }
  if (!near || best > (uint64_t{1} << 30)) return false;
  const int64_t off = static_cast<int64_t>(a - near->payload);
  if (offset) *offset = off;
  size_t n = 0, room = out_size - 1;
  if (off < 0) {
    n += put_u64(out + n, room - n, static_cast<uint64_t>(-off));
    n += put_str(out + n, room - n, " bytes before the start of buffer ");
  } else {
    n += put_u64(out + n, room - n, static_cast<uint64_t>(off) - near->bytes);
    n += put_str(out + n, room - n, " bytes past the end of buffer ");
  }
  n += put_str(out + n, room - n, near->name);
  out[n] = 0;
  buffer[put_str(buffer, buffer_size - 1, near->name)] = 0;
  return true;
}

namespace {
thread_local BufferTraffic t_traffic;
thread_local int t_depth = 0;
// Adds its scope's wall time to this thread's buffer traffic (the outermost scope only: the constructor repoisons).
class Timed {
 public:
  Timed() : t0_(std::chrono::steady_clock::now()) { ++t_depth; }
  ~Timed() {
    if (--t_depth) return;
    t_traffic.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    ++t_traffic.calls;
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  std::chrono::steady_clock::time_point t0_;
};
}  // namespace

BufferTraffic buffer_traffic() { return t_traffic; }

size_t GuardedBuffer::allocation_bytes(size_t bytes, size_t guard_bytes) {
  const size_t g = round4(guard_bytes);
  return (g + round4(bytes) + g + 4095) / 4096 * 4096;
}

size_t GuardedBuffer::allocation() const { return guard_ + round4(bytes_) + after_; }

void GuardedBuffer::relayout(size_t bytes) {
  const Timed timed;
  const size_t total = allocation();
  if (bytes == bytes_ || allocation_bytes(bytes, guard_) > total) return;
  // Byte i of the allocation outside the payload holds poison byte (i - guard_) % 4 whatever the payload size,
  // so only old payload bytes past the new payload's end need the poison: the rest already holds it.
  const size_t old_end = round4(bytes_);
  bytes_ = bytes;
  after_ = total - guard_ - round4(bytes_);
  unregister_buffer(reinterpret_cast<uintptr_t>(base_));  // the fault table's payload size follows
  register_buffer(reinterpret_cast<uintptr_t>(base_), reinterpret_cast<uintptr_t>(base_) + total,
                  reinterpret_cast<uintptr_t>(payload_), bytes_, name_);
  if (old_end > bytes_) {
    const uint32_t rotated = rotated_poison(poison_, bytes_ % 4);
    dev_.fill(static_cast<char*>(payload_) + bytes_, &rotated, 4, old_end - bytes_);
  }
}

GuardedBuffer::GuardedBuffer(Device& dev, std::string name, size_t bytes, size_t guard_bytes, uint32_t poison)
    : dev_(dev), name_(std::move(name)), bytes_(bytes), guard_(round4(guard_bytes)), poison_(poison) {
  // Layout: [guard][payload rounded up to 4 bytes][guard up to the next page]: the after-guard takes the
  // rounding slack, so every byte of the allocation outside the payload is checked (the cpu device fences
  // whole pages; past the allocation an access faults).
  const size_t total = allocation_bytes(bytes_, guard_);
  after_ = total - guard_ - round4(bytes_);
  const Timed timed;
  base_ = static_cast<char*>(dev_.alloc(total));
  payload_ = base_ + guard_;
  repoison(poison_);
  register_buffer(reinterpret_cast<uintptr_t>(base_), reinterpret_cast<uintptr_t>(base_) + total,
                  reinterpret_cast<uintptr_t>(payload_), bytes_, name_);
}

GuardedBuffer::~GuardedBuffer() {
  const Timed timed;
  unregister_buffer(reinterpret_cast<uintptr_t>(base_));
  dev_.free(base_);
}

void GuardedBuffer::upload(const void* host) {
  const Timed timed;
  if (bytes_) dev_.to_device(payload_, host, bytes_);
}
void GuardedBuffer::download(void* host) const {
  const Timed timed;
  if (bytes_) dev_.to_host(host, payload_, bytes_);
}
void GuardedBuffer::fill_payload(uint32_t word) {
  const Timed timed;
  dev_.fill(payload_, &word, 4, bytes_);
}

void GuardedBuffer::repoison(uint32_t poison) {
  const Timed timed;
  poison_ = poison;
  dev_.fill(base_, &poison_, 4, guard_);
  // The after-guard starts at the payload's end; its first word may be partial when bytes_ % 4 != 0: its byte
  // i holds poison byte (bytes_ + i) % 4, i.e. the poison word rotated by bytes_ % 4, repeated.
  const size_t tail = round4(bytes_) - bytes_ + after_;
  const uint32_t rotated = rotated_poison(poison_, bytes_ % 4);
  dev_.fill(static_cast<char*>(payload_) + bytes_, &rotated, 4, tail);
}

void GuardedBuffer::scan(const unsigned char* at, size_t from, size_t to, size_t max_hits,
                         std::vector<CanaryHit>& hits) const {
  // Byte i of the allocation holds poison byte (i - guard_) % 4: one compare when nothing changed.
  if (to == from || holds_pattern(at, to - from, rotated_poison(poison_, (from - guard_) % 4))) return;
  const auto* pb = reinterpret_cast<const unsigned char*>(&poison_);
  for (size_t i = from; i < to;) {
    const size_t phase = (i - guard_) % 4, n = std::min<size_t>(4 - phase, to - i);
    uint32_t got = 0, want = 0;
    if (phase == 0 && n == 4) {
      std::memcpy(&got, at + (i - from), 4);
      want = poison_;
    } else {
      std::memcpy(&got, at + (i - from), n);
      for (size_t j = 0; j < n; ++j) reinterpret_cast<unsigned char*>(&want)[j] = pb[(phase + j) % 4];
    }
    if (got != want) {
      ++changed_;
      if (hits.size() < max_hits)
        hits.push_back({name_, static_cast<int64_t>(i) - static_cast<int64_t>(guard_), got, want});
    }
    i += n;
  }
}

std::vector<CanaryHit> GuardedBuffer::check(size_t max_hits) const { return read_back(dev_, {}, {this}, max_hits); }

std::vector<CanaryHit> GuardedBuffer::read_back(Device& dev, const std::vector<Download>& downloads,
                                                const std::vector<const GuardedBuffer*>& bufs, size_t max_hits) {
  const Timed timed;
  // Only the guard zones are read back (where the device's memory is not readable in place), into one staging
  // vector kept between checks; whole poison words are compared as words.
  struct Zone {
    const GuardedBuffer* buf;
    size_t from, to;
    const unsigned char* view;  // in place, or null: at `staged` in the staging vector
    size_t staged;
  };
  thread_local std::vector<unsigned char> staging;
  std::vector<Zone> zones;
  std::vector<Device::HostCopy> copies;
  size_t staged = 0;
  for (const Download& d : downloads)
    if (d.buffer && d.buffer->bytes_) copies.push_back({d.host, d.buffer->payload_, d.buffer->bytes_});
  for (const GuardedBuffer* b : bufs) {
    if (!b) continue;
    b->changed_ = 0;
    const size_t total = b->allocation();
    for (const auto& [from, to] : {std::pair{size_t{0}, b->guard_}, std::pair{b->guard_ + b->bytes_, total}}) {
      if (to == from) continue;
      const auto* view = static_cast<const unsigned char*>(dev.host_view(b->base_ + from, to - from));
      zones.push_back({b, from, to, view, staged});
      if (!view) staged += to - from;
    }
  }
  staging.resize(staged);
  for (const Zone& z : zones)
    if (!z.view) copies.push_back({staging.data() + z.staged, z.buf->base_ + z.from, z.to - z.from});
  dev.to_host_all(copies);
  std::vector<CanaryHit> hits, mine;
  for (size_t i = 0; i < zones.size(); ++i) {
    const Zone& z = zones[i];
    z.buf->scan(z.view ? z.view : staging.data() + z.staged, z.from, z.to, max_hits, mine);
    if (i + 1 == zones.size() || zones[i + 1].buf != z.buf) {  // the buffer's last zone: its hits are complete
      hits.insert(hits.end(), mine.begin(), mine.end());
      mine.clear();
    }
  }
  return hits;
}

int64_t GuardedBuffer::offset_of(uint64_t address) const {
  return static_cast<int64_t>(address - reinterpret_cast<uintptr_t>(payload_));
}

uint64_t GuardedBuffer::distance_to(uint64_t address) const {
  const uint64_t lo = reinterpret_cast<uintptr_t>(base_), hi = lo + guard_ + round4(bytes_) + after_;
  return address < lo ? lo - address : address >= hi ? address - hi + 1 : 0;
}

}  // namespace attnfuzz
