// guarded.cpp - guard zones around device buffers: fill with poison, find changed canaries.
#include "check/guarded.h"

#include <cstring>

namespace attnfuzz {

namespace {
size_t round4(size_t n) { return (n + 3) & ~size_t{3}; }
}  // namespace

GuardedBuffer::GuardedBuffer(Device& dev, std::string name, size_t bytes, size_t guard_bytes, uint32_t poison)
    : dev_(dev), name_(std::move(name)), bytes_(bytes), guard_(round4(guard_bytes)), poison_(poison) {
  // Layout: [guard][payload rounded up to 4 bytes][guard]; the rounding slack belongs to the after-guard.
  base_ = static_cast<char*>(dev_.alloc(guard_ + round4(bytes_) + guard_));
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
  // The after-guard starts at the payload's end; its first word may be partial when bytes_ % 4 != 0.
  const size_t tail = round4(bytes_) - bytes_ + guard_;
  std::vector<unsigned char> host(tail);
  for (size_t i = 0; i < tail; ++i) host[i] = reinterpret_cast<const unsigned char*>(&poison_)[(bytes_ + i) % 4];
  dev_.to_device(static_cast<char*>(payload_) + bytes_, host.data(), tail);
}

std::vector<CanaryHit> GuardedBuffer::check(size_t max_hits) const {
  std::vector<CanaryHit> hits;
  changed_ = 0;
  const size_t total = guard_ + round4(bytes_) + guard_;
  std::vector<unsigned char> host(total);
  dev_.to_host(host.data(), base_, total);
  auto scan = [&](size_t from, size_t to) {  // byte range of the allocation that must hold poison
    for (size_t i = from; i < to; i += 4) {
      uint32_t got = 0, want = 0;
      const size_t n = std::min<size_t>(4, to - i);
      std::memcpy(&got, &host[i], n);
      for (size_t j = 0; j < n; ++j) reinterpret_cast<unsigned char*>(&want)[j] =
          reinterpret_cast<const unsigned char*>(&poison_)[(i + j - guard_) % 4];
      if (got == want) continue;
      ++changed_;
      if (hits.size() < max_hits)
        hits.push_back({name_, static_cast<int64_t>(i) - static_cast<int64_t>(guard_), got, want});
    }
  };
  scan(0, guard_);
  scan(guard_ + bytes_, total);
  return hits;
}

}  // namespace attnfuzz
