// register.h - registers a built-in kernel file's af_kernel table with the tool at start-up.
#pragma once

#include <stddef.h>

#include "attnfuzz/abi.h"

namespace attnfuzz {
bool register_builtin_kernels(const char* backend, const af_kernel* kernels, size_t n);
}

// Use once per kernel file, at namespace scope, after the table.
#define AF_REGISTER_KERNELS(kernel_array)                                      \
  static const bool af_registered_##kernel_array = ::attnfuzz::register_builtin_kernels( \
      AF_BACKEND_NAME, (kernel_array), sizeof(kernel_array) / sizeof((kernel_array)[0]))
