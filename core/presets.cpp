// presets.cpp - the one table of model presets (issue 28 item 9) and the dense problem built from one.
#include "attnfuzz/presets.h"

#include <algorithm>
#include <stdexcept>

namespace attnfuzz {

const std::vector<ModelPreset>& model_presets() {
  // name, model, Hq, Hkv, D, Dv, Sk, causal, window_left, softcap, sinks, varlen, kv_shared, pending
  static const std::vector<ModelPreset> table = {
      {"llama-3.1", "Llama-3.1-70B (GQA 8:1)", 64, 8, 128, 128, 8192, true, AF_UNBOUNDED, 0.f, false, false,
       false, nullptr},
      {"gemma-2", "Gemma-2-9B (softcap 50, window 4096)", 16, 8, 256, 256, 8192, true, 4096, 50.f, false,
       false, false, nullptr},
      {"gpt-oss", "gpt-oss-20b (sinks, window 128)", 64, 8, 64, 64, 4096, true, 128, 0.f, true, false, false,
       nullptr},
      {"deepseek-v3", "DeepSeek-V3 MLA decode (576/512, 128 heads)", 128, 1, 576, 512, 4096, true,
       AF_UNBOUNDED, 0.f, false, false, true, nullptr},
      {"qwen-varlen", "Qwen2.5-7B (GQA 7:1, packed varlen)", 28, 4, 128, 128, 4096, true, AF_UNBOUNDED, 0.f,
       false, true, false, nullptr},
  };
  return table;
}

std::optional<ModelPreset> find_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets())
    if (name == p.name) return p;
  return std::nullopt;
}

std::string preset_names() {
  std::string out;
  for (const ModelPreset& p : model_presets()) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

Problem preset_problem(const ModelPreset& p, int64_t seq_q, int64_t seq_k_cap) {
  const int64_t sk = std::min(p.seq_k, seq_k_cap);
  Problem out = make_problem(1, p.heads_q, p.heads_kv, std::min(seq_q, sk), sk, p.head_dim, p.head_dim_v);
  if (p.window_left != AF_UNBOUNDED) {
    out.mask_kind = AF_MASK_WINDOW;
    // The window keeps its share of the context, so a capped preset still masks (4096 of 8192 -> sk / 2).
    out.window_left = std::max<int64_t>(1, p.window_left * sk / p.seq_k);
    out.window_right = 0;
  } else if (p.causal) {
    out.mask_kind = AF_MASK_CAUSAL;
  }
  if (p.causal) out.mask_align = AF_ALIGN_BOTTOM_RIGHT;
  if (p.softcap > 0) {
    out.variants |= AF_VARIANT_SOFTCAP;
    out.softcap = p.softcap;
  }
  if (p.sinks) out.variants |= AF_VARIANT_SINK;
  if (p.kv_shared) share_kv(out);
  return out;
}

std::vector<Case> preset_sweep_grid(const ModelPreset& p, uint64_t base_seed, ValueDomain domain, int32_t dtype,
                                    Pass pass) {
  std::vector<Case> grid;
  const std::vector<int64_t> decode = {1, 2, 8};
  for (int64_t cap : {64, 256})
    for (int64_t sq : p.kv_shared ? decode : std::vector<int64_t>{1, 16, cap}) {
      Case c;
      c.problem = preset_problem(p, sq, cap);
      c.problem.dtype = dtype;
      c.values.domain = domain;
      c.pass = pass;
      if (std::string e = set_variants(c, c.problem.variants & kScoreVariants, p.softcap); !e.empty())
        throw std::logic_error(e);
      c.label = std::string("preset-") + p.name + "-sq" + std::to_string(c.problem.seq_q) + "-sk" +
                std::to_string(c.problem.seq_k);
      c.seed = grid_seed(base_seed, c.label);
      grid.push_back(std::move(c));
    }
  return grid;
}

std::string preset_table() {
  std::string out;
  for (const ModelPreset& p : model_presets()) {
    out += std::string(p.name) + ": " + p.model + "; Hq " + std::to_string(p.heads_q) + ", Hkv " +
           std::to_string(p.heads_kv) + ", D " + std::to_string(p.head_dim) + ", Dv " + std::to_string(p.head_dim_v) +
           ", Sk " + std::to_string(p.seq_k);
    if (p.varlen) out += ", varlen (not applied yet: the sweep is dense)";
    if (p.kv_shared) out += ", kv-shared (V the first Dv columns of K)";
    if (p.pending) out += std::string(", pending: ") + p.pending;
    out += "\n";
  }
  return out;
}

}  // namespace attnfuzz
