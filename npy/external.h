// external.h - outputs computed outside the tool (PyTorch, Triton, vendor libraries) judged like registered
// kernels.
//
// Inputs and outputs come as NPY tensors; the problem's parameters from a JSON sidecar and flags. The
// verdict uses the same oracle, bound and comparison as check_case(); classification can only use the
// output itself (and, for a --npy-emit directory, the outputs of the metamorphic variants): classes that
// need the kernel (oob-read, oob-write, barrier-race, and rescale without variants) are named as
// undeterminable in the evidence.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "check/runner.h"
#include "npy/npy_io.h"
#include "oracle/oracle.h"

namespace attnfuzz::npy {

enum class Layout { kBSHD, kBHSD };  // q/k/v/o as [B, S, H, D] or [B, H, S, D]; LSE is [B, H, Sq]
const char* layout_name(Layout l);   // "bshd", "bhsd"
bool parse_layout(const std::string& text, Layout& out);
const char* compute_dtype_name(int32_t dtype);                        // "fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2"
std::optional<int32_t> parse_compute_dtype(const std::string& text);  // fp32|f32|fp16|f16|bf16|fp8-e4m3|fp8-e5m2
std::optional<int32_t> parse_compute_model(const std::string& text);  // fused|unfused (af_compute_model)

// What the user says about the tensors: sidecar JSON (case.json) first, then flags on top.
struct Spec {
  Layout layout = Layout::kBSHD;
  std::string mask = "none";        // parse_mask forms
  std::optional<float> scale;       // default fp32(1/sqrt(D))
  std::optional<int64_t> kv_heads;  // checked against k's shape (GQA / MQA come from the shapes)
  int32_t compute_dtype = -1;  // -1: from q's stored dtype (float16 -> fp16, raw bf16 -> bf16, else fp32)
  int32_t compute_model = AF_COMPUTE_UNFUSED;  // af_compute_model of an fp16 / bf16 computation ("unfused":
                                               // the wider bound, for code of unknown structure)
  bool bf16_raw = false;       // 16-bit integer arrays hold bfloat16 bits
  std::optional<float> softcap;  // score variant (issue 28): s <- softcap tanh(s / softcap), > 0
  std::optional<std::pair<int32_t, int32_t>> block_size;  // block_mask.npy's (query rows, keys) per block; default
                                                          // 128 x 128 (FlexAttention's BLOCK_SIZE)
  bool kv_shared =
      false;  // MLA (issue 28 item 5): no v.npy; V is the first Dv columns of k.npy (Dv = o's last dim)
};
// Flags given on the command line (each overrides the sidecar).
struct Overrides {
  std::optional<Layout> layout;
  std::optional<std::string> mask;
  std::optional<float> scale;
  std::optional<int64_t> kv_heads;
  std::optional<int32_t> compute_dtype;
  std::optional<int32_t> compute_model;
  bool bf16_raw = false;
};
// Reads a sidecar: {"layout": "bshd", "mask": "causal-br", "scale": 0.125, "kv_heads": 1,
// "compute_dtype": "fp16", "compute_model": "fused", "bf16_raw": false}; every key optional, unknown keys are errors. Throws NpyError.
void read_sidecar(const std::filesystem::path& path, Spec& spec);
// The sidecar (when the file exists) with the overrides applied.
Spec resolve_spec(const std::filesystem::path& sidecar, const Overrides& o);
std::string sidecar_text(const Spec& spec);  // the JSON written next to emitted inputs

// The tensors of one external computation. lse is optional.
struct Files {
  std::filesystem::path q, k, v, o, lse;
  // Backward (issue 14): dO given to the backward and the gradients it computed; all four or none.
  std::filesystem::path dout, dq, dk, dv;
  // Score variants (issue 28), each optional: sinks [Hq], alibi_slopes [Hq], bias [B|1, Hq|1, Sq|1, Sk|1] (that
  // order in every layout; a dimension of size 1 is broadcast).
  std::filesystem::path sinks, alibi_slopes, bias;
  // Custom masks (issue 28 item 4), each optional: mask [B|1, Hq|1, Sq|1, Sk] (bool / uint8 / float, non-zero =
  // visible), mask_bits [B|1, Hq|1, Sq|1, ceil(Sk / 8)] uint8 (FlashInfer's packing, bit j % 8 of byte j / 8),
  // block_mask [B|1, Hq|1, ceil(Sq / bq), ceil(Sk / bk)] (0 empty, 1 full, 2 partial).
  std::filesystem::path mask, mask_bits, block_mask;
  // Per-head fp8 descales (issue 28 item 6), all three or none: q_descale [Hq] or [B, Hq], k_descale and v_descale
  // [Hkv] or [B, Hkv] (any of them [B, H]: per batch); fp8 compute dtypes only.
  std::filesystem::path q_descale, k_descale, v_descale;
};
// DIR/q.npy, k.npy, v.npy, o.npy and lse.npy when present; do.npy, dq.npy, dk.npy, dv.npy when do.npy is;
// sinks.npy, alibi_slopes.npy, bias.npy, mask*.npy, q_descale.npy / k_descale.npy / v_descale.npy when present.
Files files_in(const std::filesystem::path& dir);

// One external computation as a problem with contiguous [B, S, H, D] tensors (converted from bhsd).
struct External {
  Problem problem{};
  std::vector<float> q, k, v, o, lse;  // lse empty when no LSE file was given
  std::vector<float> dout, dq, dk, dv;  // backward files ([B, S, H, D] like o, q, k, v); empty without do.npy
  std::vector<float> sinks, alibi_slopes, bias;  // score variants' values (problem.variants says which)
  std::vector<uint8_t> custom_mask, block_mask;  // custom masks' bytes (contiguous strides, broadcast dims 0)
  std::vector<float> q_descale_h, k_descale_h, v_descale_h;  // per-head descales (descale_stride), or empty
  VariantInputs variant_inputs() const {
    return {.sinks = sinks.empty() ? nullptr : sinks.data(),
            .alibi_slopes = alibi_slopes.empty() ? nullptr : alibi_slopes.data(),
            .bias = bias.empty() ? nullptr : bias.data(),
            .custom_mask = custom_mask.empty() ? nullptr : custom_mask.data(),
            .block_mask = block_mask.empty() ? nullptr : block_mask.data(),
            .q_descale_h = q_descale_h.empty() ? nullptr : q_descale_h.data(),
            .k_descale_h = k_descale_h.empty() ? nullptr : k_descale_h.data(),
            .v_descale_h = v_descale_h.empty() ? nullptr : v_descale_h.data()};
  }
  int32_t compute_dtype = 0;
  int32_t compute_model = AF_COMPUTE_UNFUSED;
  Stored stored = Stored::kF32;    // q's storage
  std::vector<std::string> notes;  // facts about the files worth a line in the evidence
  std::string label;               // "npy:<dir or o file>"
};
// Reads and checks the files (shapes agree with each other and the layout, dtypes, GQA). Throws NpyError.
External load_external(const Files& files, const Spec& spec);
Case case_of(const External& e);  // problem + label, for reports (values are in the files, not the case)

// The verdict of one output: oracle (opts.compute_dtype set from e), NaN-safe comparison, then the
// output-only classification (mask: fully masked rows, other alignment / shifted window; non-finite
// positions; precision), with the undeterminable classes named in the evidence. With gradients, dQ / dK / dV
// are also judged against the gradient oracle for the given o (and lse, else the exact LSE), as fwd+bwd.
Judged judge_external(const External& e, const OracleOptions& opts, size_t worst = 8);

// ---- metamorphic variants (--npy-emit / --npy on a manifest directory) ----

inline constexpr const char* kManifestName = "manifest.json";
// Largest JSON sidecar (case.json) or manifest read (bounded reads: attnfuzz::read_regular_file).
inline constexpr uint64_t kMaxJsonBytes = uint64_t{1} << 20;

// Writes DIR/manifest.json and one sub-directory per variant with q.npy, k.npy, v.npy and case.json:
// base; keys-max-first / keys-max-last / keys-reversed (K and V rows permuted per (b, kv head));
// masked-nan / masked-inf (NaN / Inf in K and V at the most-masked keys; only with a mask);
// rows-changed (every odd query row of q redrawn). Values are rounded to the compute dtype and stored
// as float16 (fp16), float32 (fp32, bf16) or raw bfloat16 bits (bf16 with bf16_raw). Returns the
// variant names. Throws NpyError.
std::vector<std::string> emit_variants(const Case& c, int32_t compute_dtype, Layout layout, bool bf16_raw,
                                       const std::filesystem::path& dir, const std::string& command_line);

// One judged variant of a manifest directory.
struct VariantResult {
  std::string name;
  External ext;
  Judged judged;
  std::vector<std::string> notes;  // relation findings that are not failures (printed as notes)
};
// Judges every variant whose output exists (DIR/<variant>/o.npy) and evaluates the relations: mask leak
// (rows that see no perturbed key must be bitwise equal to base), order dependence (a verdict that
// changes with the key order; max-last failing while max-first passes = rescale), row independence
// (kept rows bitwise equal to base). Throws NpyError (bad manifest, base output missing).
std::vector<VariantResult> evaluate_manifest(const std::filesystem::path& dir, const Overrides& overrides,
                                             const OracleOptions& opts, size_t worst = 8);

}  // namespace attnfuzz::npy
