// plugin.hip - the planted-bug plug-in's entry point: every planted family's kernels in one af_plugin table.
#include <string.h>

#include "attnfuzz/hip.h"
#include "kernels/planted/planted.h"

namespace {

using namespace attnfuzz_planted;

constexpr size_t kPlantedCount =
    kFlashBugCount + kOnlineRowBugCount + kMaterializedBugCount + kSplitKvBugCount + kLowpBugCount +
    kVarlenBugCount + kPagedDecodeBugCount + kBackwardBugCount + kVariantBugCount + kMergeBugCount +
    kDropoutBugCount + kMlaBugCount;

// Filled when the library is loaded (before attnfuzz_plugin() can be called) from the family tables, which
// are constant-initialised.
af_kernel kPlantedKernels[kPlantedCount];

bool gather_planted_kernels() {
  size_t at = 0;
  auto append = [&at](const af_kernel* table, size_t n) {
    memcpy(kPlantedKernels + at, table, n * sizeof(af_kernel));
    at += n;
  };
  append(flash_bugs(), kFlashBugCount);
  append(online_row_bugs(), kOnlineRowBugCount);
  append(materialized_bugs(), kMaterializedBugCount);
  append(split_kv_bugs(), kSplitKvBugCount);
  append(lowp_bugs(), kLowpBugCount);
  append(varlen_bugs(), kVarlenBugCount);
  append(paged_decode_bugs(), kPagedDecodeBugCount);
  append(backward_bugs(), kBackwardBugCount);
  append(variant_bugs(), kVariantBugCount);
  append(merge_bugs(), kMergeBugCount);
  append(dropout_bugs(), kDropoutBugCount);
  append(mla_bugs(), kMlaBugCount);
  return at == kPlantedCount;
}

[[maybe_unused]] const bool kGathered = gather_planted_kernels();

}  // namespace

AF_DEFINE_PLUGIN("attn-fuzz planted bugs", kPlantedKernels)
