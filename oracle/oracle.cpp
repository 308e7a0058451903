// oracle.cpp - exact attention: row driver, sampling, threads, the certified fast path and the fp32 bound.
#include "oracle/oracle.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "oracle/lowp.h"
#include "oracle/reference_fp32.h"
#include "oracle/row.h"

namespace attnfuzz {

using oracle_detail::RowRef;
using oracle_detail::RowWork;

const char* contract_reason_text(ContractReason r) {
  switch (r) {
    case ContractReason::kInside:
      return "inside the fp32 contract";
    case ContractReason::kScoreRange:
      return "an exact score or sum |q k| exceeds the fp32 range";
    case ContractReason::kValueRange:
      return "the unnormalised P.V accumulator or a visible v exceeds the fp32 range";
  }
  return "?";
}

bool oracle_has_mpfr() {
#ifdef ATTNFUZZ_HAVE_MPFR
  return true;
#else
  return false;
#endif
}

namespace {

constexpr double kU = 0x1p-24;   // fp32 unit roundoff
constexpr double kUd = 0x1p-53;  // double unit roundoff
constexpr double kFltMin = 0x1p-126;
// Values above this are outside the contract: a kernel may multiply by log2(e) ~ 1.44 or round up.
constexpr double kRange = 0x1p127;  // FLT_MAX / 2 (rounded)
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Knuth's TwoSum: s + e == a + b exactly.
inline void two_sum(double a, double b, double& s, double& e) {
  s = a + b;
  const double bb = s - a;
  e = (a - (s - bb)) + (b - bb);
}
// Keeps the top `keep` significand bits (with the implicit one) of x: an exact split x = hi + (x - hi).
template <int keep>
inline double truncate_bits(double x) {
  uint64_t u;
  std::memcpy(&u, &x, 8);
  u &= ~((uint64_t{1} << (53 - keep)) - 1);
  std::memcpy(&x, &u, 8);
  return x;
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Per (b, kv head) facts about K and V, computed once.
struct HeadFacts {
  std::vector<double> ksum;         // sum_d |k_jd| per key (finite entries)
  std::vector<unsigned char> kbad;  // key row holds a NaN or Inf
  std::vector<unsigned char> vinf;  // value row holds a +-Inf (a visible one is outside the fp32 contract)
  std::vector<unsigned char> vbad;  // value row holds a NaN or Inf (0 * it is NaN: such a key is never skipped)
  double vmax = 0;                  // max finite |v|
};

struct Shared {
  const Problem* p;
  const float *q, *k, *v;
  const OracleOptions* opts;
  int32_t cd;  // compute dtype
  std::vector<HeadFacts> heads;  // [b * Hkv + hk]
  OracleResult* res;
  bool fused;  // scores in fp32 (fused_compute)
  VariantInputs vars;  // the problem's variant values (docs/semantics.md "Variants")
};

struct Counters {
  int64_t computed = 0, fast = 0, mp = 0, fallback = 0, outside = 0;
};

// sum_d |q_d k_jd| over D finite products, summed in score_pass's four lanes: the same double as its w.a[j].
double abs_sum(const double* qd, const float* kj, int64_t D) {
  double as[4] = {0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 4 <= D; d += 4)
    for (int l = 0; l < 4; ++l) as[l] += std::fabs(qd[d + l] * static_cast<double>(kj[d + l]));
  for (; d < D; ++d) as[0] += std::fabs(qd[d] * static_cast<double>(kj[d]));
  return (as[0] + as[1]) + (as[2] + as[3]);
}

// The a[j] the score pass deferred (RowWork::deferred), computed now.
void resolve_deferred(const RowRef& r, const double* qd, RowWork& w) {
  if (w.n_deferred == 0) return;
  for (int64_t jj = 0; jj < r.last - r.first; ++jj)
    if (w.deferred[jj]) w.a[jj] = abs_sum(qd, r.k + (r.first + jj) * r.k_row, r.D), w.deferred[jj] = 0;
  w.n_deferred = 0;
}

// ---- score pass: double-double scores (exact products, TwoSum accumulation, exact scaling) ----
void score_pass(const RowRef& r, const HeadFacts& hf, bool q_nonfinite, const double* qd, RowWork& w) {
  const int64_t n = r.last - r.first;
  const double sc = r.scale;
  std::fill_n(w.deferred.begin(), n, 0);
  w.n_deferred = 0;
  // A -inf bias makes the final score -inf for every finite raw score (apply_variants: raw + bias + ALiBi), so such
  // a key's double-double score is never read (a -inf bias is how a mask is often given). Not with a softcap (its
  // tanh error of the raw score enters var_own).
  const bool skip_neg_inf = r.bias && !(r.softcap > 0) && !q_nonfinite;
  for (int64_t jj = 0; jj < n; ++jj) {
    const int64_t j = r.first + jj;
    const float* kj = r.k + j * r.k_row;
    if (!r.shown(j)) {  // hidden by the custom mask: weight exactly 0, like a key outside the interval
      w.s_hi[jj] = -kInf, w.s_lo[jj] = 0, w.a[jj] = 0, w.nonfinite[jj] = 1;
      continue;
    }
    if (skip_neg_inf && !hf.kbad[j] && r.bias_at(j) == -kInf && std::isfinite(r.alibi_at(j))) {
      // what apply_variants makes of the finite raw score: -inf, lo 0, not finite; a[j] deferred
      w.s_hi[jj] = -kInf, w.s_lo[jj] = 0, w.a[jj] = 0, w.nonfinite[jj] = 1;
      w.deferred[jj] = 1;
      ++w.n_deferred;
      continue;
    }
    if (q_nonfinite || hf.kbad[j]) {
      // IEEE double: products of fp32 are exact and finite sums cannot overflow, so the class of the
      // result (+-inf / NaN) is the extended-real one.
      double acc = 0, ab = 0;
      for (int64_t d = 0; d < r.D; ++d) {
        const double pr = qd[d] * static_cast<double>(kj[d]);
        acc += pr;
        if (std::isfinite(pr)) ab += std::fabs(pr);
      }
      w.s_hi[jj] = acc * sc;
      w.s_lo[jj] = 0;
      w.a[jj] = ab;
      w.nonfinite[jj] = 1;  // a non-finite operand always gives +-inf or NaN (inf * 0 = NaN)
      continue;
    }
    double hs[4] = {0, 0, 0, 0}, ls[4] = {0, 0, 0, 0}, as[4] = {0, 0, 0, 0};
    int64_t d = 0;
    for (; d + 4 <= r.D; d += 4) {
      for (int l = 0; l < 4; ++l) {
        const double pr = qd[d + l] * static_cast<double>(kj[d + l]);  // exact
        const double t = hs[l] + pr;
        const double bb = t - hs[l];
        ls[l] += (hs[l] - (t - bb)) + (pr - bb);
        hs[l] = t;
        as[l] += std::fabs(pr);
      }
    }
    for (; d < r.D; ++d) {
      const double pr = qd[d] * static_cast<double>(kj[d]);
      const double t = hs[0] + pr;
      const double bb = t - hs[0];
      ls[0] += (hs[0] - (t - bb)) + (pr - bb);
      hs[0] = t;
      as[0] += std::fabs(pr);
    }
    double h01, e01, h23, e23, hi, e;
    two_sum(hs[0], hs[1], h01, e01);
    two_sum(hs[2], hs[3], h23, e23);
    two_sum(h01, h23, hi, e);
    const double lo = ((ls[0] + ls[1]) + (ls[2] + ls[3])) + (e01 + e23) + e;
    double s1, s2;
    two_sum(hi, lo, s1, s2);  // renormalise
    // (s1 + s2) * scale: s1 = h1 + h2 with <= 27 bits each, so h1*sc, h2*sc are exact (24-bit scale).
    const double h1 = truncate_bits<26>(s1), h2 = s1 - h1;
    double t, te;
    two_sum(h1 * sc, h2 * sc, t, te);
    te += s2 * sc;
    w.s_hi[jj] = t + te;
    w.s_lo[jj] = te - (w.s_hi[jj] - t);
    w.a[jj] = (as[0] + as[1]) + (as[2] + as[3]);
    w.nonfinite[jj] = 0;
  }
}

// ---- variant pass (docs/semantics.md "Variants"; oracle/README.md "Variants"): the scores of score_pass become
// the final scores s = softcap tanh(s_raw / softcap) + bias + ALiBi. The additions stay double-double (each term
// is exact in double); tanh is taken in double (its own error in var_own). dscale / extra feed the bound.
void apply_variants(const RowRef& r, RowWork& w, const BoundModel& M) {
  const int64_t n = r.last - r.first;
  w.var_big = 0, w.var_own = 0, w.addmax = 0;
  for (int64_t jj = 0; jj < n; ++jj) {
    const int64_t j = r.first + jj;
    double hi = w.s_hi[jj], lo = w.s_lo[jj];
    double dscale = 1, extra = 0;
    w.raw_bad[jj] = 0;
    if (!r.shown(j)) {  // hidden: stays -inf, no softcap or bias applies
      w.dscale[jj] = 1, w.extra[jj] = 0;
      continue;
    }
    if (r.softcap > 0) {
      const double cap = r.softcap;
      const double raw = hi + lo;
      if (std::isnan(raw)) {
        // stays NaN (nonfinite)
      } else if (std::isinf(raw)) {  // cap tanh(+-inf) = +-cap exactly
        hi = raw > 0 ? cap : -cap, lo = 0;
        w.raw_bad[jj] = 1;
        w.nonfinite[jj] = 0;
        dscale = 0;
        extra = M.c_exp * cap;  // tanh(+-inf) = +-1 exactly in any implementation; kept as a margin
      } else {
        const double t = std::tanh(raw / cap);
        hi = cap * t, lo = 0;
        dscale = 1 - t * t;
        // The kernel's softcap: s / cap rounded (u |s| through the derivative), tanh's own absolute error
        // (c_exp u relative, at most c_exp u min(cap, |s|) absolute), the product (u |s'|).
        extra = std::fabs(raw) * dscale + M.c_exp * std::min(cap, std::fabs(raw)) + std::fabs(hi);
        w.var_own = std::max(w.var_own, 4 * kUd * (std::fabs(hi) + cap) + kUd * std::fabs(raw) * dscale);
      }
    }
    const double bj = r.bias_at(j), aj = r.alibi_at(j);
    if (r.bias || r.alibi) {
      extra += 2 * (std::fabs(hi) + std::fabs(bj) + std::fabs(aj));
      if (w.nonfinite[jj] || !std::isfinite(bj) || !std::isfinite(aj)) {
        hi = (hi + lo) + bj + aj;  // IEEE: -inf stays -inf (weight 0), NaN / +inf make the row NaN
        lo = 0;
        w.nonfinite[jj] = 1;
      } else {
        for (double add : {bj, aj}) {
          double t, e;
          two_sum(hi, add, t, e);
          lo += e;
          two_sum(t, lo, hi, lo);
        }
      }
    }
    if (!w.nonfinite[jj]) {
      w.var_big = std::max({w.var_big, std::fabs(bj), std::fabs(aj), std::fabs(hi)});
      w.addmax = std::max(w.addmax, std::fabs(hi) + std::fabs(bj) + std::fabs(aj));
    }
    w.s_hi[jj] = hi;
    w.s_lo[jj] = lo;
    w.dscale[jj] = dscale;
    w.extra[jj] = extra;
  }
}

// ---- fast value path ----
void fast_row(const RowRef& r, RowWork& w) {
  const int64_t n = r.last - r.first;
  double mh = -kInf, ml = 0, amax = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (w.nonfinite[j]) continue;
    if (w.s_hi[j] > mh || (w.s_hi[j] == mh && w.s_lo[j] > ml)) mh = w.s_hi[j], ml = w.s_lo[j];
    amax = std::max(amax, w.a[j]);
  }
  // A sink (README "Variants") is one more term of the denominator, exp(sink - m), with no value vector.
  if (r.has_sink && (r.sink > mh || (r.sink == mh && 0 > ml))) mh = r.sink, ml = 0;
  double Lh = 0, Ll = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (w.nonfinite[j]) {
      w.w[j] = 0;
      continue;
    }
    double t, e;
    two_sum(w.s_hi[j], -mh, t, e);
    e += w.s_lo[j] - ml;
    const double ah = t + e, al = e - (ah - t);
    double pj = std::exp(ah);
    pj += pj * al;  // exp(ah + al) = exp(ah) (1 + al + O(al^2)), |al| <= 2^-52 |ah|
    w.w[j] = pj;
    two_sum(Lh, pj, t, e);
    Lh = t;
    Ll += e;
  }
  double psink = 0;
  if (r.has_sink) {
    double t, e;
    two_sum(r.sink, -mh, t, e);
    e -= ml;
    const double ah = t + e, al = e - (ah - t);
    psink = std::exp(ah);
    psink += psink * al;
    two_sum(Lh, psink, t, e);
    Lh = t;
    Ll += e;
  }
  const double L = Lh + Ll;
  for (int64_t j = 0; j < n; ++j) w.w[j] /= L;
  w.w_sink = psink / L;
  const int64_t Dv = r.Dv;
  std::fill(w.acc_hi.begin(), w.acc_hi.end(), 0.0);
  std::fill(w.acc_lo.begin(), w.acc_lo.end(), 0.0);
  std::fill(w.swa.begin(), w.swa.end(), 0.0);
  double* __restrict ah = w.acc_hi.data();
  double* __restrict al = w.acc_lo.data();
  double* __restrict swa = w.swa.data();
  for (int64_t j = 0; j < n; ++j) {
    if (!r.shown(r.first + j)) continue;  // hidden by the custom mask: its v is never read (an inf v is no NaN)
    const double wj = w.w[j] * r.keep_at(r.first + j);  // dropout: kept weights scaled (one double rounding)
    // A weight of 0 on a finite v adds +0 to every accumulator (none is -0): skipped, the sums are the same bits.
    if (wj == 0 && r.vbad && !r.vbad[r.first + j]) continue;
    const double whi = truncate_bits<24>(wj), wlo = wj - whi;  // whi * v is exact (24 x 24 bits)
    const float* __restrict vj = r.v + (r.first + j) * r.v_row;
    for (int64_t d = 0; d < Dv; ++d) {
      const double x = vj[d];
      const double p1 = whi * x, p2 = wlo * x;
      const double t = ah[d] + p1;
      const double bb = t - ah[d];
      al[d] += ((ah[d] - (t - bb)) + (p1 - bb)) + p2;
      ah[d] = t;
      swa[d] += wj * std::fabs(x);
    }
  }
  for (int64_t d = 0; d < Dv; ++d) w.o[d] = ah[d] + al[d];
  w.m = mh;
  w.L = L;
  const double logL = std::log(L);
  double t, e;
  two_sum(mh, logL, t, e);
  w.lse = t + (e + ml);
  // Own error (README "fast path"): score double-double error eps_s, weight error eps_w (exp < 1 ulp,
  // the (1 + al) correction, L's compensated sum, the division), Dot2 error of the P.V sum.
  const double D4 = static_cast<double>(r.D + 4);
  const double eps_s = 4 * D4 * D4 * kUd * kUd * (std::fabs(r.scale) * amax + 1) + w.var_own;
  const double eps_w = (r.keep ? 8 : 6) * kUd + 2 * eps_s;  // dropout: 1 / (1 - p) and its product rounded
  const double nn = static_cast<double>(n + 2);
  for (int64_t d = 0; d < Dv; ++d)
    w.o_err[d] = kUd * std::fabs(w.o[d]) + (eps_w + 2 * nn * nn * kUd * kUd) * (swa[d] + std::fabs(w.o[d])) +
                 nn * 0x1p-1070;
  w.lse_err = kUd * std::fabs(w.lse) + 2 * kUd * (std::fabs(mh) + std::fabs(logL) + 1) + eps_s + eps_w;
}

// ---- the per-element fp32 bound (README "bound") ----
// Fills o_bound / lse_bound for a row whose value path has run.
// out_eta: the absolute underflow error of storing O (fp8: eta / o_scale; else 0, inside `floor`).
void bound_row(const RowRef& r, RowWork& w, const HeadFacts& hf, double qsum, const OracleOptions& opts,
               int32_t cd, double out_eta, double* o_bound, double* lse_bound) {
  const BoundModel& M = opts.model;
  // Low-precision compute (README "fp16 / bf16 bound"): uc = 0 for fp32 kernels.
  const LowpBoundModel& H = lowp_terms(opts, cd);
  const double uc = cd == AF_DTYPE_F32 ? 0 : unit_roundoff(cd), eta = cd == AF_DTYPE_F32 ? 0 : underflow_error(cd);
  const int64_t n = r.last - r.first;
  int64_t nf = 0;
  for (int64_t j = 0; j < n; ++j) nf += !w.nonfinite[j];
  const bool var = r.any_variant();
  if (r.has_sink) ++nf;  // the sink is one more term of the softmax (a key whose value vector is 0)
  const double logn = std::log(static_cast<double>(std::max<int64_t>(nf, 1)));
  const double sc = std::fabs(static_cast<double>(r.scale));
  const double dterm = static_cast<double>(r.D + 2) * sc;
  const double argc = M.c_arg * (std::fabs(w.m) + logn + 1);
  double Ep = 0, Em = 0, delta_max = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (w.nonfinite[j] || w.w[j] == 0) {
      w.rho[j] = 0;
      continue;
    }
    // Variants (README "Variants"): the raw score's error passes through softcap's derivative (<= 1); the
    // softcap and the additions add their own roundings (extra).
    const double dsc = var ? w.dscale[j] : 1.0, extra = var ? w.extra[j] : 0.0;
    const double ftz = (2 * sc * kFltMin * (qsum + hf.ksum[r.first + j] + 2.0 * r.D)) * dsc + kFltMin;
    double delta = kU * (dterm * w.a[j] * dsc + extra + M.c_arg * std::fabs(w.s_hi[j]) + argc + M.c_exp) + ftz;
    if (uc > 0)  // q, k (pre-scaled or not) rounded to c, the score rounded to c, p_j rounded to c; c's underflow
      delta += uc * (H.c_in * sc * w.a[j] + H.c_s * (std::fabs(w.s_hi[j]) + std::fabs(w.m)) + H.c_p) +
               2 * sc * eta * (qsum + hf.ksum[r.first + j] + 2.0 * r.D);
    delta_max = std::max(delta_max, delta);  // |LSE error| <= max_j delta_j, also where exp(delta) overflows
    delta = std::min(delta, 700.0);
    w.rho[j] = delta;
    const double ed = std::exp(delta);
    Ep += w.w[j] * ed;
    Em += w.w[j] / ed;
  }
  // The sink's term exp(sink - m): an exact fp32 logit, so only the argument and exp errors.
  double rho_sink = 0;
  if (r.has_sink && w.w_sink > 0) {
    double delta = kU * (M.c_arg * std::fabs(r.sink) + argc + M.c_exp);
    if (uc > 0) delta += uc * (H.c_s * (std::fabs(r.sink) + std::fabs(w.m)) + H.c_p);
    delta_max = std::max(delta_max, delta);
    delta = std::min(delta, 700.0);
    rho_sink = delta;
    const double ed = std::exp(delta);
    Ep += w.w_sink * ed;
    Em += w.w_sink / ed;
  }
  for (int64_t j = 0; j < n; ++j) {
    if (w.rho[j] == 0) continue;
    const double ed = std::exp(w.rho[j]);
    const double r1 = std::max(ed / Em - 1, 1 - 1 / (ed * Ep));
    w.rho[j] = std::min(1.0, w.w[j] * r1);
  }
  if (rho_sink > 0) {
    const double ed = std::exp(rho_sink);
    rho_sink = std::min(1.0, w.w_sink * std::max(ed / Em - 1, 1 - 1 / (ed * Ep)));
  }
  const int64_t Dv = r.Dv;
  std::fill(w.soft.begin(), w.soft.end(), 0.0);
  double* __restrict soft = w.soft.data();
  const double* __restrict o = w.o.data();
  for (int64_t j = 0; j < n; ++j) {
    const double rj = w.rho[j];
    if (rj == 0) continue;
    const float* __restrict vj = r.v + (r.first + j) * r.v_row;
    if (r.keep) {  // dropout (README "Dropout"): the kept weights need not sum to 1, so no centring on O
      const double cj = r.keep_at(r.first + j);
      if (cj != 0)
        for (int64_t d = 0; d < Dv; ++d) soft[d] += rj * cj * std::fabs(static_cast<double>(vj[d]));
      continue;
    }
    for (int64_t d = 0; d < Dv; ++d) soft[d] += rj * std::fabs(static_cast<double>(vj[d]) - o[d]);
  }
  if (rho_sink > 0 && !r.keep)  // the sink's value vector is 0
    for (int64_t d = 0; d < Dv; ++d) soft[d] += rho_sink * std::fabs(o[d]);
  // Dropout: the kernel's 1 / (1 - p) and its product with a weight (or O) add two roundings (swa holds the
  // scaled weights).
  const double accc = kU * (M.c_n * static_cast<double>(nf) + M.c_0 + (r.keep ? 2 : 0)) + uc * H.c_acc;
  // Flushed weights and products; in c, every weight may lose up to eta absolutely (fp16 subnormal p).
  // fp8 (README "fp8 bound"): only a weight whose p_j = exp(s_j - m_run) >= exp(s_j - m) = w_j L can fall
  // below the format's smallest normal loses up to eta absolutely; count those instead of every key.
  double nsmall = static_cast<double>(nf + 2);
  if (is_fp8(cd)) {
    nsmall = 2;
    for (int64_t j = 0; j < n; ++j)
      if (!w.nonfinite[j] && w.w[j] * w.L < 2 * dtype_min_normal(cd)) nsmall += 1;
  }
  const double floor = 2 * kFltMin * static_cast<double>(nf + 2) * (1 + hf.vmax) + 2 * eta * nsmall * (1 + hf.vmax) + out_eta;
  const double sf = opts.safety_factor;
  // Common-mode weight error (weights that do not sum to 1: split-KV logsumexp combine, LSE-domain
  // normalisation) acts on |O| itself, plus the fp32 rounding of the output.
  const double common =
      kU * (M.c_arg * (std::fabs(w.m) + std::fabs(w.lse) + logn + 1) + M.c_exp + 1) + uc * H.c_out;
  for (int64_t d = 0; d < Dv; ++d) {
    if (std::isnan(o[d])) {
      o_bound[d] = 0;
      continue;
    }
    o_bound[d] = sf * (soft[d] + accc * (w.swa[d] + std::fabs(o[d])) + common * std::fabs(o[d]) + floor);
  }
  const double soft_lse = delta_max > 700 ? delta_max : std::max(std::log(Ep), -std::log(Em));
  *lse_bound =
      sf * (soft_lse + accc + kU * (M.c_arg * (std::fabs(w.lse) + std::fabs(w.m)) + M.c_exp * (1 + logn)));
}

void resize_work(RowWork& w, int64_t n, int64_t Dv) {
  const size_t N = static_cast<size_t>(std::max<int64_t>(n, 1)), V = static_cast<size_t>(Dv);
  if (w.s_hi.size() < N) {
    for (auto* x : {&w.s_hi, &w.s_lo, &w.a, &w.w, &w.rho, &w.dscale, &w.extra}) x->resize(N);
    w.nonfinite.resize(N);
    w.raw_bad.resize(N);
    w.deferred.resize(N);
  }
  if (w.o.size() != V)
    for (auto* x : {&w.o, &w.swa, &w.o_err, &w.soft, &w.acc_hi, &w.acc_lo}) x->assign(V, 0.0);
}

// Computes row (b, h, s) into the result.
void do_row(const Shared& S, int64_t b, int64_t h, int64_t s, RowWork& w, std::vector<double>& qd,
            Counters& cnt) {
  const Problem& p = *S.p;
  OracleResult& R = *S.res;
  const OracleOptions& opts = *S.opts;
  const int64_t Dv = p.head_dim_v, hk = kv_head(p, h);
  const size_t oi = R.o_at(b, s, h, 0), li = R.lse_at(b, h, s);
  RowInfo& info = R.rows[li];
  info.computed = true;
  ++cnt.computed;
  if (opts.baseline) {
    if (S.cd == AF_DTYPE_F32)
      reference_fp32_row(p, S.q, S.k, S.v, b, h, s, &R.base_o[oi], &R.base_lse[li]);
    else
      reference_lowp_row(p, S.q, S.k, S.v, b, h, s, S.cd, S.fused ? LowpStyle::kFlash : LowpStyle::kMath,
                         &R.base_o[oi], &R.base_lse[li]);
  }
  auto fill = [&](double ov, double lv, RowKind kind) {
    info.kind = kind;
    const double bound = info.inside_contract() ? 0 : kInf;  // exact 0 / -inf / NaN, unless outside
    if (!info.inside_contract()) ++cnt.outside;
    for (int64_t d = 0; d < Dv; ++d) R.o[oi + d] = ov, R.o_bound[oi + d] = bound, R.o_err[oi + d] = 0;
    R.lse[li] = lv;
    R.lse_bound[li] = bound;
    R.lse_err[li] = 0;
  };
  // The row's sink (README "Variants"): -inf is no sink.
  const bool has_sink = (p.variants & AF_VARIANT_SINK) && S.vars.sinks[h] != -std::numeric_limits<float>::infinity();
  const double sink = has_sink ? static_cast<double>(S.vars.sinks[h]) : 0.0;
  // A row with a sink and no key of positive weight: the sink alone, O = 0 exactly and LSE = sink (the kernel's
  // l = exp(sink - sink) = 1, acc = 0); LSE's error: the argument and one exp / log.
  auto fill_sink_only = [&] {
    if (std::fabs(sink) > kRange && info.inside_contract())
      info.contract = ContractReason::kScoreRange, info.contract_value = std::fabs(sink);
    fill(0.0, sink, RowKind::kNormal);
    if (info.inside_contract())
      R.lse_bound[li] = opts.safety_factor * kU * (opts.model.c_arg * (2 * std::fabs(sink) + 1) + opts.model.c_exp);
  };
  // Custom masks: the interval trimmed to the shown keys; a row whose keys the custom mask all hides is fully
  // masked exactly like an empty causal row (docs/semantics.md "Custom masks").
  const KeyRange vk = visible_keys(p, s);
  const KeyRange kr = oracle_detail::custom_keys(
      p, S.vars, b, h, s, {std::max(vk.first, opts.keys.first), std::min(vk.last, opts.keys.last)}, w.hidden);
  if (kr.empty()) return has_sink ? fill_sink_only() : fill(0.0, -kInf, RowKind::kFullyMasked);
  RowRef r;
  r.q = S.q + q_index(p, b, s, h, 0);
  r.k = S.k + k_index(p, b, 0, hk, 0);
  r.v = S.v + v_index(p, b, 0, hk, 0);
  r.k_row = p.k_stride[1];
  r.v_row = p.v_stride[1];
  r.first = kr.first;
  r.last = kr.last;
  if (!w.hidden.empty()) r.hidden = w.hidden.data();
  r.D = p.head_dim;
  r.Dv = Dv;
  r.scale = p.scale;
  if (p.variants & AF_VARIANT_SOFTCAP) r.softcap = p.softcap;
  if (p.variants & AF_VARIANT_BIAS) {
    r.bias = S.vars.bias + bias_index(p, b, h, s, 0);
    r.bias_j = p.bias_stride[3];
  }
  if (p.variants & AF_VARIANT_ALIBI) {
    r.alibi = true;
    r.slope = S.vars.alibi_slopes[h];
    r.diag = s + (p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? p.seq_k - p.seq_q : 0);
  }
  r.add_dtype = score_add_dtype(opts, p);
  r.has_sink = has_sink;
  r.sink = sink;
  if ((p.variants & AF_VARIANT_DROPOUT) && p.dropout_p > 0) {  // p = 0: every weight kept, the dropout-free result
    r.keep = S.vars.dropout_keep + ((b * p.heads_q + h) * p.seq_q + s) * p.seq_k;
    r.drop_p = p.dropout_p;
  }
  const HeadFacts& hf = S.heads[static_cast<size_t>(b * p.heads_kv + hk)];
  r.vbad = hf.vbad.data();
  bool q_nan = false, q_nonfinite = false;
  double qsum = 0;
  for (int64_t d = 0; d < p.head_dim; ++d) {
    qd[d] = r.q[d];
    q_nan |= std::isnan(qd[d]);
    q_nonfinite |= !std::isfinite(qd[d]);
    if (std::isfinite(qd[d])) qsum += std::fabs(qd[d]);
  }
  if (q_nan) return fill(kNaN, kNaN, RowKind::kNaN);
  const int64_t n = kr.last - kr.first;
  resize_work(w, n, Dv);
  score_pass(r, hf, q_nonfinite, qd.data(), w);
  if (r.any_variant()) apply_variants(r, w, opts.model);
  int64_t nf = 0;
  double amax = 0, amax_all = 0;  // amax_all: also over non-finite scores' finite products
  bool nan_row = false;
  for (int64_t j = 0; j < n; ++j) {
    amax_all = std::max(amax_all, w.a[j]);
    if (w.nonfinite[j]) {
      nan_row |= !(w.s_hi[j] == -kInf);  // NaN or +inf score
    } else {
      ++nf;
      amax = std::max(amax, w.a[j]);
    }
  }
  const double sc = std::fabs(static_cast<double>(p.scale));
  // fp32 contract on the scores (oracle/README.md "The fp32 contract"): every product term q_d k_jd of
  // every visible key, and every partial sum of them an fp32 kernel could form in any order, must stay
  // inside the fp32 range, scaled or not. a_j = sum_d |q_d k_jd| over the finite products bounds all of
  // them, also for a key whose exact score is -inf (weight 0): there an overflowing finite term gives
  // inf + (-inf) = NaN in every fp32 dot product. A kernel may also fold the scale (and log2 e) into q
  // before the dot product, or sqrt(scale) into q and k (PyTorch's math backend): |scale q_d| and
  // sqrt(|scale|) |k_jd| must not overflow either (sqrt(|scale|) |q_d| <= max(|q_d|, |scale q_d|)).
  double qmax = 0;
  for (int64_t d = 0; d < p.head_dim; ++d)
    if (std::isfinite(qd[d])) qmax = std::max(qmax, std::fabs(qd[d]));
  if (w.n_deferred > 0) {
    // The deferred a_j (-inf bias keys) enter only the range test below (and its reported value): a_j <= qmax
    // sum_d |k_jd| (the sums' roundings within the margin), so they are computed only where that could reach it.
    double kmax = 0;
    for (int64_t j = 0; j < n; ++j)
      if (w.deferred[j]) kmax = std::max(kmax, hf.ksum[static_cast<size_t>(kr.first + j)]);
    const double reach = std::max(1.0, sc) * qmax * kmax * (1 + 0x1p-30);
    if (!(reach <= kRange) || std::max({amax_all, sc * amax_all, sc * qmax}) > kRange) {
      resolve_deferred(r, qd.data(), w);
      for (int64_t j = 0; j < n; ++j) amax_all = std::max(amax_all, w.a[j]);
    }
  }
  const double score_big = std::max({amax_all, sc * amax_all, sc * qmax});
  if (score_big > kRange) {
    info.contract = ContractReason::kScoreRange;
    info.contract_value = score_big;
  } else if (r.any_variant() && std::max(w.var_big, std::fabs(sink)) > kRange) {  // a bias, ALiBi term or final score
    info.contract = ContractReason::kScoreRange;
    info.contract_value = std::max(w.var_big, std::fabs(sink));
  } else if (sc > 1) {
    const double kcap = kRange / std::sqrt(sc);
    for (int64_t j = kr.first; j < kr.last && info.contract == ContractReason::kInside; ++j)
      for (int64_t d = 0; d < p.head_dim && r.shown(j); ++d) {
        const double x = std::fabs(static_cast<double>(r.k[j * r.k_row + d]));
        if (std::isfinite(x) && x > kcap) {
          info.contract = ContractReason::kScoreRange;
          info.contract_value = std::sqrt(sc) * x;
          break;
        }
      }
  }
  if (nan_row || nf == 0) {
    // The exact row is NaN or fully masked by -inf scores. A fully masked row must be O = 0, but a
    // visible infinite or NaN v meets a zero weight in P.V (0 * inf = 0 * NaN = NaN) in every kernel that
    // accumulates before normalising (with a sink too: the row's keys all score -inf, the sink alone is finite):
    // outside the contract, as in a normal row.
    if (!nan_row && info.contract == ContractReason::kInside)
      for (int64_t j = kr.first; j < kr.last; ++j)
        if (r.shown(j) && hf.vbad[static_cast<size_t>(j)]) {  // a hidden key's v is never read
          info.contract = ContractReason::kValueRange;
          info.contract_value = kInf;
          break;
        }
    if (!nan_row && has_sink) return fill_sink_only();
    return nan_row ? fill(kNaN, kNaN, RowKind::kNaN) : fill(0.0, -kInf, RowKind::kFullyMasked);
  }
  if (S.cd == AF_DTYPE_F16 && !S.fused && info.contract == ContractReason::kInside) {
    // fp16 contract (unfused compute only: a fused kernel keeps scores in fp32): scores (possibly rounded to fp16, scaled or not) and q, k, v must stay well inside
    // fp16's range (65504); 2^15 leaves room for the exp2 factor and rounding up.
    constexpr double kHalfRange = 0x1p15;
    double big = std::max(sc * amax, qmax);
    for (int64_t j = kr.first; j < kr.last; ++j)
      for (int64_t d = 0; d < p.head_dim && r.shown(j); ++d) {
        const double x = r.k[j * r.k_row + d];
        if (std::isfinite(x)) big = std::max(big, std::fabs(x));
      }
    if (big > kHalfRange) {
      info.contract = ContractReason::kScoreRange;
      info.contract_value = big;
    }
  }
  const double out_eta = is_fp8(S.cd) ? underflow_error(S.cd) / std::fabs(static_cast<double>(p.o_scale)) : 0;
  const bool mp_first = opts.force_multiprecision;
  if (mp_first) {
    resolve_deferred(r, qd.data(), w);  // the multiprecision error term takes max_j a_j over every key
    R.mp_bits_used = oracle_detail::mp_row(r, w, opts.mp_bits, opts.mp_backend);
    info.path = RowPath::kMultiprecision;
  } else {
    fast_row(r, w);
    info.path = RowPath::kFast;
  }
  double* ob = &R.o_bound[oi];
  bound_row(r, w, hf, qsum, opts, S.cd, out_eta, ob, &R.lse_bound[li]);
  if (!mp_first) {
    // Self-check: certified when the fast path's own error is negligible against the bound (and, with
    // certify_values, against the value itself).
    constexpr double kTau = 0x1p-16, kRel = 0x1p-40;
    bool ok =
        w.lse_err <= kTau * R.lse_bound[li] && (!opts.certify_values || w.lse_err <= kRel * std::fabs(w.lse));
    for (int64_t d = 0; d < Dv && ok; ++d) {
      if (std::isnan(w.o[d])) continue;
      ok = w.o_err[d] <= kTau * ob[d] && (!opts.certify_values || w.o_err[d] <= kRel * std::fabs(w.o[d]));
    }
    if (!ok && info.contract == ContractReason::kInside) {
      resolve_deferred(r, qd.data(), w);
      R.mp_bits_used = oracle_detail::mp_row(r, w, opts.mp_bits, opts.mp_backend);
      info.path = RowPath::kMultiprecision;
      info.fell_back = true;
      ++cnt.fallback;
      bound_row(r, w, hf, qsum, opts, S.cd, out_eta, ob, &R.lse_bound[li]);
    }
  }
  info.path == RowPath::kFast ? ++cnt.fast : ++cnt.mp;
  if (info.contract == ContractReason::kInside) {
    if (S.cd == AF_DTYPE_F16 && !S.fused && hf.vmax > 0x1p15) {
      info.contract = ContractReason::kValueRange;
      info.contract_value = hf.vmax;
    }
    // fp8: the stored output fp8(O * o_scale) must fit the format (|O| <= max |v|).
    if (is_fp8(S.cd) && hf.vmax * std::fabs(static_cast<double>(p.o_scale)) > dtype_max(S.cd)) {
      info.contract = ContractReason::kValueRange;
      info.contract_value = hf.vmax * std::fabs(static_cast<double>(p.o_scale));
    }
    for (int64_t j = r.first; j < r.last && info.contract == ContractReason::kInside; ++j)
      if (r.shown(j) && hf.vinf[static_cast<size_t>(j)]) {  // README: a visible infinite v is outside the fp32 contract
        info.contract = ContractReason::kValueRange;
        info.contract_value = kInf;
      }
    // Any running max: every partial accumulator sum_j exp(s_j - m_run) |v_jd| is at most sum_j |v_jd|
    // (weights <= 1), so a kernel may overflow once that exceeds the range (cheap pre-check: n * vmax).
    if (static_cast<double>(r.last - r.first) * hf.vmax > kRange) {
      for (int64_t d = 0; d < Dv && info.contract == ContractReason::kInside; ++d) {
        double sum = 0;
        for (int64_t j = r.first; j < r.last; ++j)
          if (r.shown(j)) sum += std::fabs(static_cast<double>(r.v[j * r.v_row + d]));
        if (sum > kRange) {
          info.contract = ContractReason::kValueRange;
          info.contract_value = sum;
        }
      }
    }
    for (int64_t d = 0; d < Dv && info.contract == ContractReason::kInside; ++d) {
      const double acc = w.L * w.swa[d];
      if (acc > kRange) {
        info.contract = ContractReason::kValueRange;
        info.contract_value = acc;
        break;
      }
    }
  }
  for (int64_t d = 0; d < Dv; ++d) R.o[oi + d] = w.o[d], R.o_err[oi + d] = w.o_err[d];
  R.lse[li] = w.lse;
  R.lse_err[li] = w.lse_err;
  if (!info.inside_contract()) {
    ++cnt.outside;
    for (int64_t d = 0; d < Dv; ++d) ob[d] = kInf;
    R.lse_bound[li] = kInf;
  }
}

}  // namespace

std::vector<int64_t> sample_rows(const Problem& p, const float* q, const float* k, int64_t budget,
                                 uint64_t seed) {
  const int64_t Sq = p.seq_q;
  std::vector<int64_t> out;
  std::vector<unsigned char> pick(static_cast<size_t>(Sq), 0);
  bool all = budget <= 0 || budget >= Sq;
  if (!all) {
    for (int64_t b = 0; b < p.batch && !all; ++b)
      for (int64_t hk = 0; hk < p.heads_kv && !all; ++hk)
        for (int64_t j = 0; j < p.seq_k && !all; ++j)
          for (int64_t d = 0; d < p.head_dim; ++d)
            if (!std::isfinite(k[k_index(p, b, j, hk, d)])) {
              all = true;
              break;
            }
  }
  if (all) {
    for (int64_t i = 0; i < Sq; ++i) out.push_back(i);
    return out;
  }
  pick[0] = pick[Sq - 1] = 1;
  for (int64_t T : {16, 32, 64, 128})
    for (int64_t t = 0; t < Sq; t += T) pick[t] = pick[std::min(t + T, Sq) - 1] = 1;
  for (int64_t i = 0; i < Sq; ++i) {
    if (visible_keys(p, i).empty()) pick[i] = 1;
    for (int64_t b = 0; b < p.batch && !pick[i]; ++b)
      for (int64_t h = 0; h < p.heads_q && !pick[i]; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          if (!std::isfinite(q[q_index(p, b, i, h, d)])) {
            pick[i] = 1;
            break;
          }
  }
  int64_t count = 0;
  for (auto x : pick) count += x;
  uint64_t st = seed;
  while (count < budget) {
    const int64_t i = static_cast<int64_t>(splitmix64(st) % static_cast<uint64_t>(Sq));
    if (!pick[i]) pick[i] = 1, ++count;
  }
  for (int64_t i = 0; i < Sq; ++i)
    if (pick[i]) out.push_back(i);
  return out;
}

bool fused_compute(const OracleOptions& opts, int32_t cd) {
  return is_fp8(cd) || opts.compute_model == AF_COMPUTE_FUSED;
}

const LowpBoundModel& lowp_terms(const OracleOptions& opts, int32_t cd) {
  return fused_compute(opts, cd) ? opts.lowp_fused : opts.lowp;
}

OracleResult compute_oracle(const Problem& p, const float* q, const float* k, const float* v,
                            const OracleOptions& opts) {
  return compute_oracle(p, q, k, v, VariantInputs{}, opts);
}

OracleResult compute_oracle(const Problem& p, const float* q, const float* k, const float* v,
                            const VariantInputs& vars, const OracleOptions& opts_in) {
  const auto t0 = std::chrono::steady_clock::now();
  if (const std::string why = validate(p); !why.empty()) throw std::invalid_argument("oracle: " + why);
  if (p.variants & ~kCheckedVariants)
    throw std::invalid_argument("oracle: variant " + variant_names(p.variants & ~kCheckedVariants) + " is not checked");
  if (((p.variants & AF_VARIANT_SINK) && !vars.sinks) || ((p.variants & AF_VARIANT_ALIBI) && !vars.alibi_slopes) ||
      ((p.variants & AF_VARIANT_BIAS) && !vars.bias && bias_elements(p) > 0) ||
      ((p.variants & AF_VARIANT_DROPOUT) && !vars.dropout_keep && p.seq_k > 0) ||
      ((p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) && !vars.custom_mask && custom_mask_bytes(p) > 0) ||
      ((p.variants & AF_VARIANT_BLOCK_SPARSE) && !vars.block_mask && block_mask_bytes(p) > 0))
    throw std::invalid_argument("oracle: the problem uses variant " + variant_names(p.variants) +
                                " but its values (sinks / ALiBi slopes / bias / dropout keep mask / masks) were not given");
  // kv-shared (docs/semantics.md "Shared K/V latent"): V is the first Dv columns of K's rows, read through
  // K's pointer (validate: v_stride = k_stride, Dv <= D), whatever the caller passed as v.
  if (kv_shared(p)) v = k;
  OracleOptions opts_v = opts_in;
  if (p.variants) opts_v.baseline = false;  // the plain fp32 reference knows no variant
  const OracleOptions& opts = opts_v;
  const int32_t cd = opts.compute_dtype < 0 ? p.dtype : opts.compute_dtype;
  if (cd < AF_DTYPE_F32 || cd > AF_DTYPE_FP8_E5M2)
    throw std::invalid_argument("oracle: unknown compute dtype " + std::to_string(cd));
  if (p.variants & AF_VARIANT_HEAD_DESCALE) {
    // Per-head fp8 descales (docs/semantics.md "Variants"): the per-tensor branch below per (b, head): q's by
    // query head, k's and v's by KV head, each product exact in fp32 (validate_descale_value); they replace
    // the per-tensor descales.
    if (!vars.q_descale_h || !vars.k_descale_h || !vars.v_descale_h)
      throw std::invalid_argument(
          "oracle: the problem uses variant head-descale but its per-head descales were not given");
    std::vector<float> qs(q, q + q_elements(p)), ks(k, k + k_elements(p)), vs(v, v + v_elements(p));
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const float f = vars.q_descale_h[descale_h_index(p, b, h)];
        for (int64_t s = 0; s < p.seq_q; ++s)
          for (int64_t d = 0; d < p.head_dim; ++d) qs[static_cast<size_t>(q_index(p, b, s, h, d))] *= f;
      }
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        const float fk = vars.k_descale_h[descale_h_index(p, b, h)],
                    fv = vars.v_descale_h[descale_h_index(p, b, h)];
        for (int64_t s = 0; s < p.seq_k; ++s) {
          for (int64_t d = 0; d < p.head_dim; ++d) ks[static_cast<size_t>(k_index(p, b, s, h, d))] *= fk;
          for (int64_t d = 0; d < p.head_dim_v; ++d) vs[static_cast<size_t>(v_index(p, b, s, h, d))] *= fv;
        }
      }
    }
    Problem p1 = p;
    p1.variants &= ~(AF_VARIANT_HEAD_DESCALE | AF_VARIANT_KV_SHARED);  // V scaled apart from K from here on
    p1.descale_stride[0] = p1.descale_stride[1] = 0;
    p1.q_descale = p1.k_descale = p1.v_descale = 1.0f;
    OracleOptions o1 = opts;
    o1.compute_dtype = cd;
    VariantInputs v1 = vars;
    v1.q_descale_h = v1.k_descale_h = v1.v_descale_h = nullptr;
    OracleResult R = compute_oracle(p1, qs.data(), ks.data(), vs.data(), v1, o1);
    R.problem = p;
    return R;
  }
  if (is_fp8(p.dtype) && (p.q_descale != 1 || p.k_descale != 1 || p.v_descale != 1)) {
    // fp8 (README "fp8 inputs"): the real inputs are stored * descale, exact in fp32 (validate_descales), so
    // the exact result of the real inputs is the exact result of the scaled copies.
    auto scaled = [](const float* x, int64_t n, float f) {
      std::vector<float> out(x, x + n);
      for (float& e : out) e *= f;  // exact: <= 4 + 16 significand bits, exponent in range
      return out;
    };
    const std::vector<float> qs = scaled(q, q_elements(p), p.q_descale), ks = scaled(k, k_elements(p), p.k_descale),
                             vs = scaled(v, v_elements(p), p.v_descale);
    Problem p1 = p;
    p1.q_descale = p1.k_descale = p1.v_descale = 1.0f;
    p1.variants &= ~AF_VARIANT_KV_SHARED;  // V (scaled by v_descale) apart from K from here on
    OracleOptions o1 = opts;
    o1.compute_dtype = cd;
    OracleResult R = compute_oracle(p1, qs.data(), ks.data(), vs.data(), vars, o1);
    R.problem = p;
    return R;
  }
  if (opts.mp_bits < 100) throw std::invalid_argument("oracle: mp_bits must be >= 100");
  OracleResult R;
  R.problem = p;
  R.compute_dtype = cd;
  R.compute_model = opts.compute_model;
  R.mp_backend_used = oracle_detail::mp_backend_name(opts.mp_backend);  // throws when unavailable
  R.mp_bits_used = oracle_detail::mp_bits_rounded(opts.mp_bits);
  const size_t no = static_cast<size_t>(p.batch * p.seq_q * p.heads_q * p.head_dim_v);
  const size_t nl = static_cast<size_t>(p.batch * p.heads_q * p.seq_q);
  for (auto* x : {&R.o, &R.o_bound, &R.o_err}) x->assign(no, kNaN);
  for (auto* x : {&R.lse, &R.lse_bound, &R.lse_err}) x->assign(nl, kNaN);
  if (opts.baseline) {
    R.base_o.assign(no, std::numeric_limits<float>::quiet_NaN());
    R.base_lse.assign(nl, std::numeric_limits<float>::quiet_NaN());
  }
  R.rows.assign(nl, RowInfo{});
  R.sampled = sample_rows(p, q, k, opts.row_budget, opts.sample_seed);

  Shared S{&p, q, k, v, &opts, cd, {}, &R, fused_compute(opts, cd), vars};
  S.heads.resize(static_cast<size_t>(p.batch * p.heads_kv));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      HeadFacts& hf = S.heads[static_cast<size_t>(b * p.heads_kv + hk)];
      hf.ksum.assign(static_cast<size_t>(p.seq_k), 0.0);
      hf.kbad.assign(static_cast<size_t>(p.seq_k), 0);
      hf.vinf.assign(static_cast<size_t>(p.seq_k), 0);
      hf.vbad.assign(static_cast<size_t>(p.seq_k), 0);
      for (int64_t j = 0; j < p.seq_k; ++j) {
        const float* kj = k + k_index(p, b, j, hk, 0);
        for (int64_t d = 0; d < p.head_dim; ++d) {
          if (std::isfinite(kj[d]))
            hf.ksum[j] += std::fabs(kj[d]);
          else
            hf.kbad[j] = 1;
        }
        const float* vj = v + v_index(p, b, j, hk, 0);
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          if (std::isfinite(vj[d])) hf.vmax = std::max(hf.vmax, std::fabs(static_cast<double>(vj[d])));
          if (std::isinf(vj[d])) hf.vinf[j] = 1;
          if (!std::isfinite(vj[d])) hf.vbad[j] = 1;
        }
      }
    }

  // Work items: (b, h, sampled row index), in chunks.
  const int64_t per_bh = static_cast<int64_t>(R.sampled.size());
  const int64_t total = p.batch * p.heads_q * per_bh;
  unsigned nt = opts.threads ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  const int64_t chunk = 4;
  nt = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(nt, (total + chunk - 1) / chunk)));
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::exception_ptr err;
  Counters sum;
  auto worker = [&] {
    RowWork w;
    std::vector<double> qd(static_cast<size_t>(p.head_dim));
    Counters c;
    try {
      for (;;) {
        const int64_t begin = next.fetch_add(chunk);
        if (begin >= total) break;
        for (int64_t t = begin; t < std::min(total, begin + chunk); ++t) {
          const int64_t bh = t / per_bh, s = R.sampled[static_cast<size_t>(t % per_bh)];
          do_row(S, bh / p.heads_q, bh % p.heads_q, s, w, qd, c);
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      if (!err) err = std::current_exception();
      next = total;
    }
    std::lock_guard<std::mutex> g(mu);
    sum.computed += c.computed, sum.fast += c.fast, sum.mp += c.mp, sum.fallback += c.fallback;
    sum.outside += c.outside;
  };
  if (nt == 1) {
    worker();
  } else {
    std::vector<std::thread> th;
    for (unsigned i = 0; i < nt; ++i) th.emplace_back(worker);
    for (auto& t : th) t.join();
  }
  if (err) std::rethrow_exception(err);
  R.rows_computed = sum.computed;
  R.rows_fast = sum.fast;
  R.rows_mp = sum.mp;
  R.rows_fallback = sum.fallback;
  R.rows_outside = sum.outside;
  R.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return R;
}

namespace oracle_detail {

KeyRange custom_keys(const Problem& p, const VariantInputs& in, int64_t b, int64_t h, int64_t i, KeyRange kr,
                     std::vector<unsigned char>& hidden) {
  hidden.clear();
  if (!(p.variants & kMaskVariants) || kr.empty()) return kr;
  int64_t first = kr.last, last = kr.first;
  for (int64_t j = kr.first; j < kr.last; ++j)
    if (custom_visible(p, in, b, h, i, j)) first = std::min(first, j), last = j + 1;
  if (first >= last) return {0, 0};
  hidden.resize(static_cast<size_t>(last - first));
  for (int64_t j = first; j < last; ++j) hidden[static_cast<size_t>(j - first)] = !custom_visible(p, in, b, h, i, j);
  return {first, last};
}

}  // namespace oracle_detail

}  // namespace attnfuzz
