// device.cpp - backend, status and order names of the device layer, and its portable helpers.
#include "attnfuzz/device.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace attnfuzz {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kCpu:
      return "cpu";
    case Backend::kNvidia:
      return "nvidia";
    case Backend::kAmd:
      return "amd";
    case Backend::kAdapter:
      return "adapter";
  }
  return "?";
}

bool parse_backend(const std::string& text, Backend& out) {
  for (Backend b : {Backend::kCpu, Backend::kNvidia, Backend::kAmd, Backend::kAdapter})
    if (text == backend_name(b)) {
      out = b;
      return true;
    }
  return false;
}

const char* launch_status_name(LaunchStatus s) {
  switch (s) {
    case LaunchStatus::kOk:
      return "ok";
    case LaunchStatus::kLaunchError:
      return "launch-error";
    case LaunchStatus::kCrash:
      return "crash";
    case LaunchStatus::kHang:
      return "hang";
  }
  return "?";
}

const char* thread_order_name(ThreadOrder o) {
  switch (o) {
    case ThreadOrder::kForward:
      return "forward";
    case ThreadOrder::kReverse:
      return "reverse";
    case ThreadOrder::kShuffle:
      return "shuffle";
  }
  return "?";
}

bool parse_thread_order(const std::string& text, ThreadOrder& out) {
  for (ThreadOrder o : {ThreadOrder::kForward, ThreadOrder::kReverse, ThreadOrder::kShuffle})
    if (text == thread_order_name(o)) {
      out = o;
      return true;
    }
  return false;
}

void Device::fill(void* dst, const void* pattern, size_t pattern_bytes, size_t bytes) {
  if (bytes == 0) return;
  std::unique_ptr<unsigned char[]> host(new unsigned char[bytes]);
  // The pattern once, then doubling copies of what is already filled: byte i == pattern[i % pattern_bytes].
  size_t have = std::min(pattern_bytes, bytes);
  std::memcpy(host.get(), pattern, have);
  while (have < bytes) {
    const size_t n = std::min(have - have % pattern_bytes, bytes - have);
    std::memcpy(host.get() + have, host.get(), n);
    have += n;
  }
  to_device(dst, host.get(), bytes);
}

void Device::to_host_all(const std::vector<HostCopy>& copies) {
  for (const HostCopy& c : copies)
    if (c.bytes) to_host(c.dst, c.src, c.bytes);
}

}  // namespace attnfuzz
