// guarded.cpp - guard zones around device buffers: fill with poison, find changed canaries.
#include "check/guarded.h"

#include <algorithm>
#include <cstring>
#include <memory>

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
}  // namespace

size_t GuardedBuffer::allocation_bytes(size_t bytes, size_t guard_bytes) {
  const size_t g = round4(guard_bytes);
  return (g + round4(bytes) + g + 4095) / 4096 * 4096;
}

size_t GuardedBuffer::allocation() const { return guard_ + round4(bytes_) + after_; }

void GuardedBuffer::relayout(size_t bytes) {
  const size_t total = allocation();
  if (bytes == bytes_ || allocation_bytes(bytes, guard_) != total) return;
  // Byte i of the allocation outside the payload holds poison byte (i - guard_) % 4 whatever the payload size,
  // so only old payload bytes past the new payload's end need the poison: the rest already holds it.
  const size_t old_end = round4(bytes_);
  bytes_ = bytes;
  after_ = total - guard_ - round4(bytes_);
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
  base_ = static_cast<char*>(dev_.alloc(total));
  payload_ = base_ + guard_;
  repoison(poison_);
}

GuardedBuffer::~GuardedBuffer() { dev_.free(base_); }

void GuardedBuffer::upload(const void* host) {
  if (bytes_) dev_.to_device(payload_, host, bytes_);
}
void GuardedBuffer::download(void* host) const {
  if (bytes_) dev_.to_host(host, payload_, bytes_);
}
void GuardedBuffer::fill_payload(uint32_t word) { dev_.fill(payload_, &word, 4, bytes_); }

void GuardedBuffer::repoison(uint32_t poison) {
  poison_ = poison;
  dev_.fill(base_, &poison_, 4, guard_);
  // The after-guard starts at the payload's end; its first word may be partial when bytes_ % 4 != 0: its byte
  // i holds poison byte (bytes_ + i) % 4, i.e. the poison word rotated by bytes_ % 4, repeated.
  const size_t tail = round4(bytes_) - bytes_ + after_;
  const uint32_t rotated = rotated_poison(poison_, bytes_ % 4);
  dev_.fill(static_cast<char*>(payload_) + bytes_, &rotated, 4, tail);
}

std::vector<CanaryHit> GuardedBuffer::check(size_t max_hits) const {
  std::vector<CanaryHit> hits;
  changed_ = 0;
  const size_t total = guard_ + round4(bytes_) + after_;
  thread_local std::vector<unsigned char> host;  // kept between checks: no allocation per guard zone
  // Only the guard zones are read back; whole poison words are compared as words.
  auto scan = [&](size_t from, size_t to) {  // byte range of the allocation that must hold poison
    host.resize(to - from);
    if (host.empty()) return;
    dev_.to_host(host.data(), base_ + from, to - from);
    // Byte i of the allocation holds poison byte (i - guard_) % 4: one compare when nothing changed.
    if (holds_pattern(host.data(), to - from, rotated_poison(poison_, (from - guard_) % 4))) return;
    const auto* pb = reinterpret_cast<const unsigned char*>(&poison_);
    for (size_t i = from; i < to;) {
      const size_t phase = (i - guard_) % 4, n = std::min<size_t>(4 - phase, to - i);
      uint32_t got = 0, want = 0;
      if (phase == 0 && n == 4) {
        std::memcpy(&got, &host[i - from], 4);
        want = poison_;
      } else {
        std::memcpy(&got, &host[i - from], n);
        for (size_t j = 0; j < n; ++j) reinterpret_cast<unsigned char*>(&want)[j] = pb[(phase + j) % 4];
      }
      if (got != want) {
        ++changed_;
        if (hits.size() < max_hits)
          hits.push_back({name_, static_cast<int64_t>(i) - static_cast<int64_t>(guard_), got, want});
      }
      i += n;
    }
  };
  scan(0, guard_);
  scan(guard_ + bytes_, total);
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
