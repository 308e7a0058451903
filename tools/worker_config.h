// worker_config.h - the WorkerConfig both tools derive from the common options (attn-fuzz campaigns and
// minimization, attn-check --replay --minimize), so a case minimized by either runs the same way.
#pragma once

#include "attnfuzz/device.h"
#include "fuzz/worker.h"
#include "tools/cli_common.h"

namespace attnfuzz::cli {

// The worker settings the common options decide: kernels, backend, adapter, plug-ins (absolute paths), thread
// order, warp size, timeout, oracle rows and precision, the value domain, dtype, pass and variants,
// --amplify, and the flags a replay needs besides the file. Campaign-only settings (limits, isolate policy,
// out, command) are the caller's.
fuzz::WorkerConfig common_worker_config(const CommonOptions& o, Backend backend);

}  // namespace attnfuzz::cli
