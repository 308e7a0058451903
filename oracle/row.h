// row.h - internal to oracle/: one query row's inputs and work buffers, shared by the fast and mp paths.
#pragma once

#include <cstdint>
#include <vector>

#include "oracle/lowp.h"
#include "oracle/oracle.h"

namespace attnfuzz::oracle_detail {

// One query row (b, h, s): pointers already offset to batch b and kv head kv_head(h).
struct RowRef {
  const float* q = nullptr;  // q[d], d < D (contiguous, last stride is 1)
  const float* k = nullptr;  // key j, element d at k[j * k_row + d]
  const float* v = nullptr;  // value j, element d at v[j * v_row + d]
  int64_t k_row = 0, v_row = 0;
  const unsigned char* vbad = nullptr;  // vbad[j] != 0: value j holds a NaN or Inf (nullptr: unknown, none skipped)
  int64_t first = 0, last = 0;  // visible keys [first, last), non-empty
  int64_t D = 0, Dv = 0;
  float scale = 1;
  // Score variants of this row (docs/semantics.md "Variants"): s <- softcap tanh(s / softcap), then
  // s += bias_j - slope |j - diag|; the sink logit enters the denominator only.
  double softcap = 0;           // 0: no softcap
  const float* bias = nullptr;  // bias of row (b, h, i): key j at bias[j * bias_j]; nullptr: none
  int64_t bias_j = 0;
  bool alibi = false;
  double slope = 0;
  int64_t diag = 0;             // i + off (off of the mask alignment)
  // Custom masks (docs/semantics.md "Custom masks"): hidden[j - first] != 0 for a key of [first, last) the custom
  // or block mask hides; nullptr: every key of the interval is visible.
  const unsigned char* hidden = nullptr;
  bool shown(int64_t j) const { return !hidden || !hidden[j - first]; }
  bool has_sink = false;        // a sink logit other than -inf
  double sink = 0;
  // Dropout (docs/semantics.md "Dropout"): the row's keep mask (key j at keep[j]); a kept weight is multiplied by
  // 1 / (1 - drop_p) after the softmax (which the mask leaves alone: LSE is unchanged). nullptr: no dropout.
  const uint8_t* keep = nullptr;
  double drop_p = 0;
  bool any_variant() const { return softcap > 0 || bias || alibi; }
  double keep_scale() const { return 1.0 / (1.0 - drop_p); }
  // The factor of key j's weight in O: 1 without dropout, else keep_scale() or 0.
  double keep_at(int64_t j) const { return !keep ? 1.0 : keep[j] ? keep_scale() : 0.0; }
  // The kernel takes the additive terms in this dtype (af_dtype; -1: exact): their fp32 sum rounded to it, as
  // SDPA's float attn_mask in the query's dtype (AF_KERNEL_SCORE_ADD_IN_DTYPE; README "Variants").
  int32_t add_dtype = -1;
  // What the variants add to key j's (softcapped) score: bias + ALiBi, each exact in double; with add_dtype, the
  // rounded sum is bias_at (alibi_at 0), or alibi_at where there is no bias.
  double bias_at(int64_t j) const {
    if (!bias) return 0.0;
    const double b = static_cast<double>(bias[j * bias_j]);
    return add_dtype < 0 ? b : in_add_dtype(b + exact_alibi(j));
  }
  double alibi_at(int64_t j) const {
    if (add_dtype < 0 || !alibi) return exact_alibi(j);
    return bias ? 0.0 : in_add_dtype(exact_alibi(j));
  }
  double in_add_dtype(double sum) const {  // as the kernel is given it: the fp32 sum rounded to add_dtype
    return round_to_dtype(static_cast<double>(static_cast<float>(sum)), add_dtype);
  }
  double exact_alibi(int64_t j) const {
    if (!alibi) return 0.0;
    const int64_t dist = j - diag;
    return -slope * static_cast<double>(dist < 0 ? -dist : dist);
  }
};

// Per-row buffers, reused across rows by one worker. Key arrays are indexed by j - first.
struct RowWork {
  // Filled by the score pass (shared by both paths).
  std::vector<double> s_hi, s_lo;        // score as a double-double (exact to ~2^-100 relative); non-finite
                                         // scores (from Inf operands) are IEEE doubles in s_hi, s_lo = 0
  std::vector<double> a;                 // sum_d |q_d k_jd| over the finite products (unscaled)
  std::vector<unsigned char> nonfinite;  // score had a non-finite operand (after the variants: the final score
                                         // is not finite)
  // Keys of a -inf additive term (bias) whose raw score is finite: the final score is -inf whatever the raw one,
  // so the score pass leaves a[j] = 0 for them and marks them here; resolve_deferred() computes their a[j] where
  // it can matter (the contract test, the multiprecision path). n_deferred: how many.
  std::vector<unsigned char> deferred;
  int64_t n_deferred = 0;
  // Filled by the variant pass (apply_variants), when the row has a variant.
  std::vector<double> dscale;            // d s_final / d s_raw (softcap: 1 - tanh^2; else 1)
  std::vector<double> extra;             // u-multiples of the kernel's extra score error (tanh, additions)
  std::vector<unsigned char> raw_bad;    // the raw score was not finite (softcap made it +-cap)
  std::vector<unsigned char> hidden;     // custom_keys' keys the custom mask hides (empty: none)
  double var_big = 0;                    // max |bias|, |alibi|, |final score| over the finite keys (contract)
  double var_own = 0;                    // the fast path's own absolute score error from the variants (tanh)
  double addmax = 0;                     // max |softcapped score| + |bias| + |alibi| (multiprecision error)
  double w_sink = 0;                     // the sink's weight exp(sink - m) / L
  // Filled by a value path.
  std::vector<double> w;      // exact normalised weights exp(s_j - m) / L, rounded to double
  std::vector<double> o;      // exact O_d
  std::vector<double> swa;    // sum_j w_j |v_jd|
  std::vector<double> o_err;  // the path's own error bound on o
  double m = 0;               // max score (double)
  double L = 0;               // sum_j exp(s_j - m) (>= 1)
  double lse = 0, lse_err = 0;
  // Bound buffers.
  std::vector<double> rho, soft;
  std::vector<double> acc_hi, acc_lo;
};

// The keys of row (b, h, i) under its custom / block mask (kr: the row's mask_kind interval): the interval trimmed
// to its first and last shown key (empty when the custom mask hides every key), hidden[j - first] set for the
// keys inside it that the custom mask hides. Without a mask variant: kr unchanged and hidden left empty.
KeyRange custom_keys(const Problem& p, const VariantInputs& in, int64_t b, int64_t h, int64_t i, KeyRange kr,
                     std::vector<unsigned char>& hidden);

// Multiprecision value path: fills w, o, swa, o_err, m, L, lse, lse_err from s_hi/s_lo/nonfinite (rows
// here have at least one finite score and no NaN / +inf score). Returns the bits actually used.
int mp_row(const RowRef& r, RowWork& w, int bits, MpBackend backend);
// The backend name mp_row will use for this request ("mpfr" or "cpp_bin_float"); throws when unavailable.
const char* mp_backend_name(MpBackend backend);
int mp_bits_rounded(int bits);

}  // namespace attnfuzz::oracle_detail
