// planted.h - the tables of the planted-bug families, gathered into one plug-in by plugin.hip.
//
// Each planted family file (one family per file) defines its kernels and its af_kernel table in an anonymous
// namespace and exports only a host function returning the table (a host function, not the table itself:
// an external const table would be emitted in the device compilation too, referring to host functions that
// exist only on the host side). The counts are fixed so that plugin.hip can size the plug-in's table at
// compile time; each family file static_asserts its table against its count.
#pragma once

#include <stddef.h>

#include "attnfuzz/abi.h"

namespace attnfuzz_planted {

constexpr size_t kFlashBugCount = 13;        // flash_bugs.hip
constexpr size_t kOnlineRowBugCount = 2;     // online_row_bugs.hip
constexpr size_t kMaterializedBugCount = 2;  // materialized_bugs.hip
constexpr size_t kSplitKvBugCount = 3;       // split_kv_bugs.hip
constexpr size_t kLowpBugCount = 8;          // lowp_bugs.hip (f16 / bf16 / fp8)
constexpr size_t kVarlenBugCount = 6;        // varlen_bugs.hip
constexpr size_t kPagedDecodeBugCount = 6;   // paged_decode_bugs.hip
constexpr size_t kBackwardBugCount = 10;     // backward_bugs.hip
constexpr size_t kVariantBugCount = 12;      // variant_bugs.hip (issue 28: sinks, softcap, ALiBi, bias, masks, descales)
constexpr size_t kMergeBugCount = 4;         // merge_bugs.hip (issue 29: merged attention states)
constexpr size_t kDropoutBugCount = 5;       // dropout_bugs.hip (issue 29)
constexpr size_t kMlaBugCount = 1;           // mla_bugs.hip (issue 28 item 5: MLA's shared K/V latent)

const af_kernel* flash_bugs();         // kFlashBugCount entries
const af_kernel* online_row_bugs();    // kOnlineRowBugCount entries
const af_kernel* materialized_bugs();  // kMaterializedBugCount entries
const af_kernel* split_kv_bugs();      // kSplitKvBugCount entries
const af_kernel* lowp_bugs();          // kLowpBugCount entries
const af_kernel* varlen_bugs();        // kVarlenBugCount entries
const af_kernel* paged_decode_bugs();  // kPagedDecodeBugCount entries
const af_kernel* backward_bugs();      // kBackwardBugCount entries
const af_kernel* variant_bugs();       // kVariantBugCount entries
const af_kernel* merge_bugs();         // kMergeBugCount entries
const af_kernel* dropout_bugs();       // kDropoutBugCount entries
const af_kernel* mla_bugs();           // kMlaBugCount entries

}  // namespace attnfuzz_planted
