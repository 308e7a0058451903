// row.h - internal to oracle/: one query row's inputs and work buffers, shared by the fast and mp paths.
#pragma once

#include <cstdint>
#include <vector>

#include "oracle/oracle.h"

namespace attnfuzz::oracle_detail {

// One query row (b, h, s): pointers already offset to batch b and kv head kv_head(h).
struct RowRef {
  const float* q = nullptr;  // q[d], d < D (contiguous, last stride is 1)
  const float* k = nullptr;  // key j, element d at k[j * k_row + d]
  const float* v = nullptr;  // value j, element d at v[j * v_row + d]
  int64_t k_row = 0, v_row = 0;
  int64_t first = 0, last = 0;  // visible keys [first, last), non-empty
  int64_t D = 0, Dv = 0;
  float scale = 1;
};

// Per-row buffers, reused across rows by one worker. Key arrays are indexed by j - first.
struct RowWork {
  // Filled by the score pass (shared by both paths).
  std::vector<double> s_hi, s_lo;        // score as a double-double (exact to ~2^-100 relative); non-finite
                                         // scores (from Inf operands) are IEEE doubles in s_hi, s_lo = 0
  std::vector<double> a;                 // sum_d |q_d k_jd| over the finite products (unscaled)
  std::vector<unsigned char> nonfinite;  // score had a non-finite operand
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

// Multiprecision value path: fills w, o, swa, o_err, m, L, lse, lse_err from s_hi/s_lo/nonfinite (rows
// here have at least one finite score and no NaN / +inf score). Returns the bits actually used.
int mp_row(const RowRef& r, RowWork& w, int bits, MpBackend backend);
// The backend name mp_row will use for this request ("mpfr" or "cpp_bin_float"); throws when unavailable.
const char* mp_backend_name(MpBackend backend);
int mp_bits_rounded(int bits);

}  // namespace attnfuzz::oracle_detail
