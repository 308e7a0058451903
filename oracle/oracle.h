// oracle.h - the exact attention reference: exact O / LSE, per-element fp32 error bounds, contract status.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/problem.h"

namespace attnfuzz {

// Which multiprecision library the arbiter path uses.
enum class MpBackend {
  kAuto,         // mpfr when built with it (ATTNFUZZ_HAVE_MPFR), else cpp_bin_float
  kMpfr,         // Boost.Multiprecision mpfr_float_backend (throws if not built in)
  kCppBinFloat,  // Boost.Multiprecision cpp_bin_float (header-only, ~10x slower)
};

// Constants of the first-order fp32 error model (oracle/README.md derives each one). u = 2^-24.
struct BoundModel {
  double c_arg = 4;  // u-multiples of |s_j| + |m| + log n + 1: rounding of s - m, s * log2(e), rescale
                     // arguments, split-KV logsumexp terms
  double c_exp = 8;  // u-multiples of relative error of one exp / exp2 / log (approximate hardware ops)
  double c_n = 8;    // u-multiples per visible key in the accumulation term: P.V sum, row sum, and per
                     // online-softmax rescale an approximate exp and two multiplications
  double c_0 = 16;   // constant u-multiples in the accumulation term (division, stores, split combine)
};

// Extra terms for a kernel that computes in fp16 / bf16 (OracleOptions::compute_dtype) with fp32
// accumulation, in multiples of that dtype's unit roundoff u_c (2^-11 fp16, 2^-8 bf16); the fp32 terms of
// BoundModel stay (oracle/README.md "fp16 / bf16 bound": derivation and measurement).
struct LowpBoundModel {
  double c_in = 2;   // relative score error from rounding q and k (or q sqrt(scale), k sqrt(scale)) to c
  double c_s = 2;    // u_c-multiples of |s_j|: the score (and s - m) rounded to c
  double c_p = 1;    // probabilities p_j (or normalised weights) rounded to c: relative error of weight j
  double c_acc = 2;  // u_c-multiples of (sum_j w_j |v_jd| + |O_d|): v rounded to c, and a row sum taken
                     // from the unrounded p while P.V uses the rounded p
  double c_out = 1;  // O rounded to c on store
};

struct OracleOptions {
  int mp_bits = 128;  // multiprecision significand bits (>= 100; rounded up to 101, 128,
                      // 194, 257 or 513)
  MpBackend mp_backend = MpBackend::kAuto;
  bool force_multiprecision = false;  // every row on the multiprecision path (the arbiter)
  bool certify_values = false;        // also fall back where the fast path's value is not accurate to
                                      // 2^-40 relative (cancellation-heavy rows), so that the fp32
                                      // rounding of `o` is the fp32 rounding of the exact value
  unsigned threads = 0;               // worker threads over rows; 0 = hardware concurrency
  int64_t row_budget = 0;             // 0: every row. Else about this many query rows are computed:
                                      // the required rows (see sample_rows) plus seeded random ones
  uint64_t sample_seed = 1;           // seed of the random part of the sample
  double safety_factor = 2.0;         // multiplies the first-order bound (README: measurement)
  BoundModel model{};
  // The precision the kernel computed in (af_dtype): AF_DTYPE_F32, F16, BF16, FP8_E4M3, FP8_E5M2; -1 =
  // the problem's dtype. f16 / bf16 add the LowpBoundModel terms, use the fp16 contract (exact scores
  // and q, k, v within 2^15) for f16, and make the baseline a plain f16 / bf16 reference.
  int32_t compute_dtype = -1;
  // How an f16 / bf16 kernel computes (af_compute_model; README "Compute models"). AF_COMPUTE_UNFUSED (the
  // default here: the widest bound, for outputs of unknown origin): q, k and the scores rounded to c, the
  // `lowp` terms, and f16's contract. AF_COMPUTE_FUSED (FlashAttention-style; what a registered kernel declares
  // unless it says otherwise, set by check_case): scores and softmax statistics in fp32 from the stored
  // inputs, P rounded to c before P.V, the `lowp_fused` terms and the fp32 contract. fp8 is always fused.
  int32_t compute_model = AF_COMPUTE_UNFUSED;
  // The kernel takes the additive score terms (bias, ALiBi) in the f16 / bf16 storage type
  // (AF_KERNEL_SCORE_ADD_IN_DTYPE, set by check_case): the exact result adds their fp32 sum rounded to it.
  bool score_add_in_dtype = false;
  LowpBoundModel lowp{};
  // Fused and fp8 compute (README "fp8 bound"): scores in fp32 from the exact stored inputs (no c_in, c_s), P
  // rounded to c before P.V, fp32 accumulation, the output rounded once.
  LowpBoundModel lowp_fused{0, 0, 1, 2, 1};
  bool baseline = true;  // also run the plain fp32 reference on the computed rows
  // Only keys [keys.first, keys.last) exist for this result: every row's visible keys are cut to them, and the
  // keys outside are never read (a merge state over its key split, check/merge.cpp).
  KeyRange keys{0, INT64_MAX};
};

// The type the exact result rounds p's additive score terms to under o: p's storage type when the kernel takes them
// in it (OracleOptions::score_add_in_dtype, f16 / bf16 only), else -1 (exact). The one rule of the forward and
// gradient oracles and of the detectors' add-in-dtype probe.
inline int32_t score_add_dtype(const OracleOptions& o, const Problem& p) {
  return o.score_add_in_dtype && (p.dtype == AF_DTYPE_F16 || p.dtype == AF_DTYPE_BF16) ? p.dtype : -1;
}

// Whether a kernel computing in cd under opts computes scores in fp32 (fused, or fp8), and the low-precision
// bound terms that apply to it.
bool fused_compute(const OracleOptions& opts, int32_t cd);
const LowpBoundModel& lowp_terms(const OracleOptions& opts, int32_t cd);

// Why a row is outside the fp32 contract (docs/semantics.md "The fp32 contract").
enum class ContractReason : uint8_t {
  kInside = 0,
  kScoreRange,  // an exact |s_ij| or sum_d |q k| (scaled or not) exceeds the fp32 range (margin 2)
  kValueRange,  // sum_j exp(s_ij - m) |v_jd| (the unnormalised accumulator) exceeds the fp32 range, or
                // a visible v is infinite
};
const char* contract_reason_text(ContractReason r);

// What kind of row the exact semantics produced.
enum class RowKind : uint8_t {
  kNormal = 0,
  kFullyMasked,  // no visible key, or every visible score is -inf: O = 0, LSE = -inf
  kNaN,          // NaN in q_i, or a NaN / +inf visible score: O_i and LSE_i are NaN
};

enum class RowPath : uint8_t { kNone = 0, kFast, kMultiprecision };

struct RowInfo {
  bool computed = false;  // false: left out by sampling (o, bounds are NaN there)
  RowKind kind = RowKind::kNormal;
  RowPath path = RowPath::kNone;
  bool fell_back = false;  // the fast path could not certify the row; the multiprecision path did it
  ContractReason contract = ContractReason::kInside;
  double contract_value = 0;  // the quantity that exceeded the fp32 range (for the report)
  bool inside_contract() const { return contract == ContractReason::kInside; }
};

// Exact results in double, laid out contiguously (not with the problem's strides): O [B, Sq, Hq, Dv],
// LSE and rows [B, Hq, Sq]. Index with o_at / lse_at.
struct OracleResult {
  Problem problem{};
  std::vector<double> o, o_bound, o_err;        // exact value, allowed |got - o|, the oracle's own error
  std::vector<double> lse, lse_bound, lse_err;  // same for LSE (natural log)
  std::vector<float> base_o, base_lse;          // plain reference in the compute dtype (empty if !baseline)
  int32_t compute_dtype = AF_DTYPE_F32;         // the precision the bounds are for
  int32_t compute_model = AF_COMPUTE_UNFUSED;   // and the compute model (af_compute_model)
  std::vector<RowInfo> rows;                    // per (b, h, s)
  std::vector<int64_t> sampled;                 // query rows s that were computed, ascending
  int mp_bits_used = 0;
  const char* mp_backend_used = "";
  int64_t rows_computed = 0, rows_fast = 0, rows_mp = 0, rows_fallback = 0, rows_outside = 0;
  double ms = 0;

  size_t o_at(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return static_cast<size_t>(((b * problem.seq_q + s) * problem.heads_q + h) * problem.head_dim_v + d);
  }
  size_t lse_at(int64_t b, int64_t h, int64_t s) const {
    return static_cast<size_t>((b * problem.heads_q + h) * problem.seq_q + s);
  }
  const RowInfo& row(int64_t b, int64_t h, int64_t s) const { return rows[lse_at(b, h, s)]; }
};

// Computes the exact result of docs/semantics.md's semantics for p. q, k, v are host fp32 arrays laid out with
// p's strides, holding the stored input values (f16 / bf16 / fp8 inputs widened exactly). For fp8 the real
// inputs are stored * q/k/v_descale (exact, see validate_descales) and the result is the real O (not scaled
// by o_scale). Throws
// std::invalid_argument when p is malformed (validate(p) non-empty) or the compute dtype is unknown,
// std::runtime_error when the requested multiprecision backend is not built in.
OracleResult compute_oracle(const Problem& p, const float* q, const float* k, const float* v,
                            const OracleOptions& opts = {});
// The same with the values of p's score variants (docs/semantics.md "Variants": sinks, softcap, ALiBi, bias).
// The overload above is this one with no variant values: it throws std::invalid_argument for a problem that
// uses a variant whose values are missing.
OracleResult compute_oracle(const Problem& p, const float* q, const float* k, const float* v,
                            const VariantInputs& vars, const OracleOptions& opts = {});

// The query rows computed under row sampling: every row when budget <= 0 or budget >= Sq; else rows 0
// and Sq-1, the first and last row of every 16/32/64/128 tile, every row whose visible key range is
// empty, every row whose q (for some b, h) holds a NaN or Inf (all rows when k holds a NaN or Inf),
// plus seeded random rows until about `budget` rows are chosen. Ascending, no duplicates.
std::vector<int64_t> sample_rows(const Problem& p, const float* q, const float* k, int64_t budget,
                                 uint64_t seed);

// Whether this binary has the mpfr backend.
bool oracle_has_mpfr();

}  // namespace attnfuzz
