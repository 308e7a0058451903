// multiprecision.cpp - the arbiter value path on Boost.Multiprecision (mpfr backend, or cpp_bin_float).
#include <algorithm>
#include <boost/multiprecision/cpp_bin_float.hpp>
#include <cmath>
#include <limits>
#include <stdexcept>
#ifdef ATTNFUZZ_HAVE_MPFR
#include <boost/multiprecision/mpfr.hpp>
#endif

#include "oracle/row.h"

namespace attnfuzz::oracle_detail {
namespace bmp = boost::multiprecision;

namespace {

constexpr double kUd = 0x1p-53;  // double unit roundoff

// One row in Real (precision `bits`): exact products (fp32 x fp32 is exact in double) summed in Real,
// scaled, exp / log in Real, weighted V sum in Real; then everything is rounded to double once.
template <class Real>
void row_in(const RowRef& r, RowWork& w, int bits) {
  const int64_t n = r.last - r.first;
  std::vector<Real> e(static_cast<size_t>(n));
  Real m = 0;
  bool have = false;
  const Real scale = r.scale;
  const bool var = r.any_variant();
  for (int64_t j = 0; j < n; ++j) {
    if (w.nonfinite[j]) continue;  // only -inf reaches here: weight exactly 0
    if (var && w.raw_bad[j]) {
      // softcap of an infinite raw score: +-cap plus the additions, exact as the double-double s_hi + s_lo
      e[j] = Real(w.s_hi[j]) + Real(w.s_lo[j]);
    } else {
      const float* kj = r.k + (r.first + j) * r.k_row;
      Real acc = 0;
      for (int64_t d = 0; d < r.D; ++d) acc += static_cast<double>(r.q[d]) * static_cast<double>(kj[d]);
      e[j] = acc * scale;
      if (r.softcap > 0) {  // the variants in Real (README "Variants")
        const Real cap = r.softcap;
        e[j] = Real(cap * tanh(Real(e[j] / cap)));
      }
      if (r.bias) e[j] += Real(r.bias_at(r.first + j));
      if (r.alibi) e[j] += Real(r.alibi_at(r.first + j));
    }
    if (!have || e[j] > m) m = e[j];
    have = true;
  }
  if (r.has_sink && (!have || Real(r.sink) > m)) m = Real(r.sink);
  Real L = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (w.nonfinite[j]) {
      e[j] = 0;
      continue;
    }
    e[j] = exp(Real(e[j] - m));
    L += e[j];
  }
  Real esink = 0;
  if (r.has_sink) {
    esink = exp(Real(Real(r.sink) - m));
    L += esink;
  }
  std::vector<Real> acc(static_cast<size_t>(r.Dv), Real(0));
  const Real keep_scale = Real(1) / (Real(1) - Real(r.drop_p));  // dropout (README "Dropout")
  for (int64_t j = 0; j < n; ++j) {
    if (!r.shown(r.first + j)) continue;  // hidden by the custom mask: v never read
    const float* vj = r.v + (r.first + j) * r.v_row;
    // A dropped weight is a weight of 0: 0 * NaN = NaN still reaches O (docs/semantics.md "NaN and Inf").
    const Real ej = !r.keep ? e[j] : r.keep[r.first + j] ? Real(e[j] * keep_scale) : Real(0);
    for (int64_t d = 0; d < r.Dv; ++d) acc[d] += ej * static_cast<double>(vj[d]);
  }
  for (int64_t d = 0; d < r.Dv; ++d) w.o[d] = static_cast<double>(Real(acc[d] / L));
  for (int64_t j = 0; j < n; ++j) w.w[j] = static_cast<double>(Real(e[j] / L));
  w.w_sink = r.has_sink ? static_cast<double>(Real(esink / L)) : 0.0;
  w.m = static_cast<double>(m);
  w.L = static_cast<double>(L);
  const Real logL = log(L);
  w.lse = static_cast<double>(Real(m + logL));
  // Error of the Real computation: every Real op adds 2^-(bits-1) relative; the longest chain is a sum
  // of n + D terms, so (n + D + 8) * 2^-(bits-1) relative to the sum of magnitudes. Then one rounding to
  // double (u_d relative).
  double amax = 0;
  for (int64_t j = 0; j < n; ++j) amax = std::max(amax, w.a[j]);
  const double er = std::ldexp(static_cast<double>(n + r.D + 8), 1 - bits) *
                    (1 + std::fabs(static_cast<double>(r.scale)) * amax + (var ? w.addmax + r.softcap : 0.0) +
                     (r.has_sink ? std::fabs(r.sink) : 0.0));
  std::fill(w.swa.begin(), w.swa.end(), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    if (!r.shown(r.first + j)) continue;  // hidden by the custom mask: its v is never read (a NaN v is no NaN bound)
    const float* vj = r.v + (r.first + j) * r.v_row;
    const double wj = w.w[j] * r.keep_at(r.first + j);
    for (int64_t d = 0; d < r.Dv; ++d) w.swa[d] += wj * std::fabs(static_cast<double>(vj[d]));
  }
  for (int64_t d = 0; d < r.Dv; ++d)
    w.o_err[d] = kUd * std::fabs(w.o[d]) + 2 * er * (w.swa[d] + std::fabs(w.o[d]));
  w.lse_err = kUd * std::fabs(w.lse) + er * (std::fabs(w.m) + std::fabs(static_cast<double>(logL)) + 1);
}

template <template <int> class T>
int dispatch(const RowRef& r, RowWork& w, int bits) {
  const int b = mp_bits_rounded(bits);
  switch (b) {
    case 101:
      row_in<typename T<101>::type>(r, w, 101);
      break;
    case 128:
      row_in<typename T<128>::type>(r, w, 128);
      break;
    case 194:
      row_in<typename T<194>::type>(r, w, 194);
      break;
    case 257:
      row_in<typename T<257>::type>(r, w, 257);
      break;
    default:
      row_in<typename T<513>::type>(r, w, 513);
      break;
  }
  return b;
}

template <int Bits>
struct BinFloat {
  using type = bmp::number<bmp::cpp_bin_float<Bits, bmp::digit_base_2>, bmp::et_off>;
};
#ifdef ATTNFUZZ_HAVE_MPFR
// digits10 whose digits10_2_2 gives exactly Bits (boost/multiprecision/detail/digits.hpp).
constexpr unsigned mpfr_digits10(int bits) {
  return bits == 101 ? 30 : bits == 128 ? 38 : bits == 194 ? 58 : bits == 257 ? 77 : 154;
}
template <int Bits>
struct Mpfr {
  using type = bmp::number<bmp::mpfr_float_backend<mpfr_digits10(Bits), bmp::allocate_stack>, bmp::et_on>;
};
#endif

bool use_mpfr(MpBackend backend) {
#ifdef ATTNFUZZ_HAVE_MPFR
  return backend != MpBackend::kCppBinFloat;
#else
  if (backend == MpBackend::kMpfr)
    throw std::runtime_error("the mpfr backend is not built in (libmpfr was not found at configure time)");
  return false;
#endif
}

}  // namespace

int mp_bits_rounded(int bits) {
  if (bits <= 101) return 101;
  if (bits <= 128) return 128;
  if (bits <= 194) return 194;
  if (bits <= 257) return 257;
  return 513;
}

const char* mp_backend_name(MpBackend backend) { return use_mpfr(backend) ? "mpfr" : "cpp_bin_float"; }

int mp_row(const RowRef& r, RowWork& w, int bits, MpBackend backend) {
#ifdef ATTNFUZZ_HAVE_MPFR
  if (use_mpfr(backend)) return dispatch<Mpfr>(r, w, bits);
#else
  (void)use_mpfr(backend);
#endif
  return dispatch<BinFloat>(r, w, bits);
}

}  // namespace attnfuzz::oracle_detail
