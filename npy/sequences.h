// sequences.h - varlen / KV-cache / paged cases through NPY (issue 15): emit the inputs in their layout with
// the int32 arrays beside them, and judge an output computed elsewhere on the case they were emitted from.
#pragma once

#include <filesystem>
#include <string>

#include "attnfuzz/case.h"
#include "check/runner.h"

namespace attnfuzz::npy {

// Writes DIR/q.npy, k.npy, v.npy in the case's layout (packed q [total_q, Hq, D], dense [B, Sq, Hq, D];
// packed K/V [total_k, Hkv, D], paged [num_pages, page_size, Hkv, D], dense [B, Sk, Hkv, D]; float32, every
// element outside a sequence NaN), the arrays that exist (cu_seqlens_q.npy, cu_seqlens_k.npy, seqused_k.npy
// [B], block_table.npy [B, max_pages_per_seq], int32) and case.json {"sequence_case": <the case as in a
// corpus file>, "layout": "bshd"}. Throws NpyError.
void emit_sequence_case(const Case& c, const std::filesystem::path& dir, const std::string& command_line);

// Whether DIR/case.json holds a "sequence_case".
bool is_sequence_dir(const std::filesystem::path& dir);

// The case of DIR/case.json and the judgement of DIR/o.npy (q's layout: [total_q, Hq, Dv] packed or
// [B, Sq, Hq, Dv] dense) and optional DIR/lse.npy ([B, Hq, max Sq], or FlashAttention's [Hq, total_q] for a
// packed q) against its exact result, per sequence, exactly as check_case compares a kernel's output. The
// q / k / v files are not read back: the case regenerates the same bits (generate() is deterministic).
// Classes that need the kernel (oob-read / oob-write / barrier-race) cannot be named; the evidence says so.
// Throws NpyError.
Judged judge_sequence_dir(const std::filesystem::path& dir, const OracleOptions& opts, size_t worst, Case& out_case);

}  // namespace attnfuzz::npy
