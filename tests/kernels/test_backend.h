// test_backend.h - the backend the kernel tests run on: cpu unless ATTNFUZZ_TEST_BACKEND names another built one
// (e.g. nvidia on the H200: the same grids, the same oracle, the kernels as nvcc built them).
#pragma once

#include <cstdlib>

#include "attnfuzz/device.h"

namespace attnfuzz {

inline Backend test_backend() {
  static const Backend b = [] {
    Backend x = Backend::kCpu;
    if (const char* e = std::getenv("ATTNFUZZ_TEST_BACKEND")) parse_backend(e, x);
    return x;
  }();
  return b;
}

}  // namespace attnfuzz
