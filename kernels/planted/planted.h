// planted.h - the tables of the planted-bug families, gathered into one plug-in by plugin.hip.
//
// Each planted family file (one family per file) defines its kernels in an anonymous namespace and exports
// only its af_kernel table here. The counts are fixed so that plugin.hip can size the plug-in's table at
// compile time; a table with fewer initialisers than its count leaves a nameless entry, which the registry
// refuses when the plug-in is loaded (so a mismatch cannot go unnoticed).
#pragma once

#include <stddef.h>

#include "attnfuzz/abi.h"

namespace attnfuzz_planted {

constexpr size_t kFlashBugCount = 7;         // flash_bugs.hip
constexpr size_t kOnlineRowBugCount = 2;     // online_row_bugs.hip
constexpr size_t kMaterializedBugCount = 2;  // materialized_bugs.hip
constexpr size_t kSplitKvBugCount = 1;       // split_kv_bugs.hip

extern const af_kernel kFlashBugs[kFlashBugCount];
extern const af_kernel kOnlineRowBugs[kOnlineRowBugCount];
extern const af_kernel kMaterializedBugs[kMaterializedBugCount];
extern const af_kernel kSplitKvBugs[kSplitKvBugCount];

}  // namespace attnfuzz_planted
