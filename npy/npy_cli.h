// npy_cli.h - attn-check's NPY options (--npy, --q/--k/--v/--o/--lse, --npy-emit, ...) and their two entry
// points.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "attnfuzz/case.h"
#include "tools/cli_common.h"

namespace attnfuzz::npy {

struct NpyOptions {
  std::string dir;  // --npy DIR: q/k/v/o(/lse).npy + optional case.json, or an --npy-emit manifest
  std::string q, k, v, o, lse;  // explicit files (instead of --npy)
  std::string meta;             // --npy-meta FILE: the JSON sidecar (default DIR/case.json)
  std::string emit;             // --npy-emit DIR
  std::string layout;           // bshd | bhsd (default: sidecar, else bshd)
  std::string compute_dtype;    // fp32 | fp16 | bf16 (default: sidecar, else from q's dtype)
  std::string compute_model;    // fused | unfused (default: sidecar, else unfused)
  bool bf16_raw = false;
};
void add_npy_options(CLI::App& app, NpyOptions& o);
// The combinations CLI11's needs/excludes cannot say ("needs one of"): "" or a usage error sentence.
std::string check_npy_combination(const NpyOptions& o);
// Whether the command asks to judge NPY outputs (--npy or --o).
bool npy_mode(const NpyOptions& o);

// Case flags attn-check shares with NPY mode: given only when the user typed them.
struct SharedCaseFlags {
  std::string mask, scale;
  int64_t kv_heads = 0;
  bool mask_given = false, scale_given = false;
};
// Judges the NPY outputs through the session's Runner (verdict lines, reports, heatmaps). Returns the exit
// code: 0 pass, 1 a failure, 2 bad input (one-line message on stderr).
int run_npy(const NpyOptions& o, const SharedCaseFlags& f, Session& s, const CommonOptions& common);
// --npy-emit: writes the case's inputs and metamorphic variants. Returns the exit code.
int run_npy_emit(const NpyOptions& o, const Case& c, const std::string& command_line);

}  // namespace attnfuzz::npy
