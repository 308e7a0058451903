// presets.h - named model geometries (issue 28 item 9): one table of real models' attention shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/problem.h"

namespace attnfuzz {

// One model's attention geometry at its real sizes. A preset is data only; to_problem builds a dense problem
// from it with seq_k capped (the CPU backend cannot afford the real sizes in tests).
struct ModelPreset {
  const char* name;
  const char* model;     // the model it is taken from, for --preset list
  int64_t heads_q;
  int64_t heads_kv;
  int64_t head_dim;
  int64_t head_dim_v;
  int64_t seq_k;         // the real context length the preset stands for
  bool causal;
  int64_t window_left;   // AF_UNBOUNDED unless the model uses a sliding window
  float softcap;         // 0 = none
  bool sinks;            // per-head attention sinks (AF_VARIANT_SINK)
  bool varlen;           // the model is served with packed varlen batches
  bool kv_shared;        // MLA: K and V one latent buffer, V its first Dv columns (AF_VARIANT_KV_SHARED)
  const char* pending;   // a variant the preset needs that the case model does not have yet, or nullptr
};

const std::vector<ModelPreset>& model_presets();
std::optional<ModelPreset> find_preset(const std::string& name);
// "llama-3.1, gemma-2, ..." for an error line.
std::string preset_names();
// A dense problem of the preset's geometry: batch 1, seq_k = min(real, cap), seq_q = min(seq_q, seq_k), the
// window scaled by the same factor as seq_k. varlen and pending are not applied (see docs/attn-check.md).
Problem preset_problem(const ModelPreset& p, int64_t seq_q, int64_t seq_k_cap);

// attn-check --sweep --preset NAME: the preset's geometry at decode (seq_q 1), a short prefill and seq_q =
// seq_k, each with seq_k capped at 64 and 256 keys (the CPU backend's budget; the real seq_k is in
// ModelPreset). A kv_shared (MLA) preset is decode only, as its latent attention is served: seq_q 1, 2
// (multi-token prediction) and 8.
std::vector<Case> preset_sweep_grid(const ModelPreset& p, uint64_t base_seed, ValueDomain domain, int32_t dtype,
                                    Pass pass);
// The --preset list table: one line per preset.
std::string preset_table();

}  // namespace attnfuzz
