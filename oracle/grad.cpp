// grad.cpp - the exact attention backward: dQ, dK, dV streamed per query row, with per-element fp32 bounds.
#include "oracle/grad.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "oracle/lowp.h"
#include "oracle/row.h"

namespace attnfuzz {

namespace {

constexpr double kU = 0x1p-24;   // fp32 unit roundoff
constexpr double kUd = 0x1p-53;  // double unit roundoff
constexpr double kFltMin = 0x1p-126;
constexpr double kRange = 0x1p127;  // the fp32 contract's range (oracle/README.md "The fp32 contract")
const double kLogRange = std::log(kRange);
constexpr double kTau = 0x1p-16;    // certification: the oracle's own error against the bound
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string fmt_g(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Plain double dot product of fp32 rows in 4 lanes, with the sum of |products| (finite ones).
inline void dot_abs(const float* __restrict x, const float* __restrict y, int64_t n, double& dot, double& abs) {
  double s[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 4 <= n; d += 4)
    for (int l = 0; l < 4; ++l) {
      const double pr = static_cast<double>(x[d + l]) * static_cast<double>(y[d + l]);
      s[l] += pr;
      a[l] += std::fabs(pr);
    }
  for (; d < n; ++d) {
    const double pr = static_cast<double>(x[d]) * static_cast<double>(y[d]);
    s[0] += pr;
    a[0] += std::fabs(pr);
  }
  dot = (s[0] + s[1]) + (s[2] + s[3]);
  abs = (a[0] + a[1]) + (a[2] + a[3]);
  if (!std::isfinite(abs)) {  // a non-finite operand: the finite products only (NaN-safe)
    abs = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double pr = static_cast<double>(x[i]) * static_cast<double>(y[i]);
      if (std::isfinite(pr)) abs += std::fabs(pr);
    }
  }
}

// Per (b, kv head): facts about K and V, computed once.
struct KeyFacts {
  std::vector<double> ksum;          // sum_d |k_jd| (finite entries)
  std::vector<int64_t> bad_prefix;   // prefix counts of keys with a +-inf in k or v
  double kmax = 0;                   // max finite |k|
};

// Accumulators of one output row (dQ of a query row, or dK / dV of a key): value, first-order error
// part and magnitude part (oracle/README.md "Backward bound").
struct Acc {
  std::vector<double> val, err, mag;
  void assign(size_t n) {
    val.assign(n, 0.0);
    err.assign(n, 0.0);
    mag.assign(n, 0.0);
  }
};

// Per-thread key accumulators of one (b, kv head) group: dK [Sk, D], dV [Sk, Dv], term counts, taint.
struct KeyAcc {
  Acc dk, dv;
  std::vector<int64_t> count;
  std::vector<int64_t> taint_diff;  // difference array: keys touched by an outside-contract row
  void reset(int64_t Sk, int64_t D, int64_t Dv) {
    dk.assign(static_cast<size_t>(Sk * D));
    dv.assign(static_cast<size_t>(Sk * Dv));
    count.assign(static_cast<size_t>(Sk), 0);
    taint_diff.assign(static_cast<size_t>(Sk + 1), 0);
  }
};

struct Shared {
  const Problem* p;
  const float *q, *k, *v, *dout, *o, *lse;
  const GradOptions* opts;
  const OracleResult* fwd;
  int32_t cd;
  GradResult* res;
  std::vector<unsigned char> q_pick, k_pick;  // rows whose dQ / keys whose dK, dV are computed
  std::vector<int64_t> k_list;                // sampled keys, ascending
  bool all_keys = true;
  // Score variants (docs/semantics.md "Variants"). With a bias every visible pair is visited (d bias needs them
  // all): pair_* hold dS of the final score per (b, h, i, j), its error bound and |dS|; with a sink row_* hold
  // the row's d sink term -exp(sink - LSE_i) Delta_i, its error bound and magnitude; taint marks rows outside
  // the contract. Each slot is written by the one thread that owns its row.
  VariantInputs vars;
  bool need_all = false;
  std::vector<double>* pair_ds = nullptr;
  std::vector<double>* pair_err = nullptr;
  std::vector<double>* row_sink = nullptr;
  std::vector<double>* row_sink_err = nullptr;
  std::vector<double>* row_sink_mag = nullptr;
  std::vector<unsigned char>* row_taint = nullptr;
};

struct RowBuf {
  std::vector<double> P, dP, eP, edP, s, dsc, edsc;
  oracle_detail::RowWork mp;
  std::vector<double> dq_val, dq_err, dq_mag;
  std::vector<unsigned char> hidden;  // custom-mask hidden keys of the row (oracle_detail::custom_keys)
};

struct Counters {
  int64_t fast = 0, mp = 0, fallback = 0;
  std::string why;
};

// One query row (b, h, i) of kv group hk: dQ_i when picked, and its contributions to the picked keys.
void grad_row(const Shared& S, int64_t b, int64_t h, int64_t i, const KeyFacts& kf, KeyAcc& ka, RowBuf& rb,
              Counters& cnt) {
  const Problem& p = *S.p;
  const GradOptions& opts = *S.opts;
  const OracleResult& F = *S.fwd;
  GradResult& R = *S.res;
  const BoundModel& M = opts.fwd.model;
  const LowpBoundModel& H = lowp_terms(opts.fwd, S.cd);
  const double uc = S.cd == AF_DTYPE_F32 ? 0 : unit_roundoff(S.cd);
  // Rounding a value to c loses up to u_c relatively and, below c's normal range, up to eta_c absolutely (half the
  // smallest subnormal): a dS or P below eta_c becomes 0 (issue 25: f16 dK of 1.6e-7 returned as 0).
  const double eta_c = S.cd == AF_DTYPE_F32 ? 0 : underflow_error(S.cd);
  const int64_t D = p.head_dim, Dv = p.head_dim_v, hk = kv_head(p, h);
  const double scale = p.scale, sc = std::fabs(scale), sf = opts.fwd.safety_factor;
  // A kernel may fold the scale into dS before rounding it (ds = P (dP - Delta) scale, the Triton tutorial's order)
  // instead of scaling the fp32 accumulators after: the underflow is then eta_c of scale dS, eta_c / scale of dS
  // (the final dQ, dK multiply it by the scale again: sc eta_ds = max(sc, 1) eta_c, finite at any scale).
  const double eta_ds = sc > 0 && sc < 1 ? eta_c / sc : eta_c;
  const bool want_dq = S.q_pick[static_cast<size_t>(i)] != 0;
  // Custom masks: the shown keys only; a row they hide entirely is an empty row (README "Custom masks").
  const KeyRange kr = oracle_detail::custom_keys(p, S.vars, b, h, i, visible_keys(p, i), rb.hidden);
  auto hidden = [&](size_t jj) { return !rb.hidden.empty() && rb.hidden[jj]; };
  const size_t qi = R.dq_at(b, i, h, 0);
  if (want_dq) {
    R.q_computed[static_cast<size_t>((b * p.seq_q + i) * p.heads_q + h)] = 1;
    for (int64_t d = 0; d < D; ++d) R.dq[qi + d] = 0, R.dq_bound[qi + d] = 0;
  }
  if (kr.empty()) return;  // no visible key: dQ_i = 0 exactly, no contribution to any key
  // The keys this row works on: every visible one (dQ wanted or every key picked), else the picked ones.
  const bool all_j = want_dq || S.all_keys || S.need_all;
  std::vector<int64_t>::const_iterator kb = S.k_list.begin(), ke = S.k_list.end();
  if (!all_j) {
    kb = std::lower_bound(S.k_list.begin(), S.k_list.end(), kr.first);
    ke = std::lower_bound(kb, S.k_list.end(), kr.last);
    if (kb == ke) return;
  }
  const RowInfo& info = F.row(b, h, i);
  const float* qrow = S.q + q_index(p, b, i, h, 0);
  const float* dorow = S.dout + o_index(p, b, i, h, 0);
  const float* orow = S.o + o_index(p, b, i, h, 0);
  const float* kbase = S.k + k_index(p, b, 0, hk, 0);
  const float* vbase = S.v + v_index(p, b, 0, hk, 0);
  const int64_t kst = p.k_stride[1], vst = p.v_stride[1];
  const size_t oi = F.o_at(b, i, h, 0), li = F.lse_at(b, h, i);
  double LSE = F.lse[li];
  const double lse_given = S.lse[lse_index(p, b, h, i)];

  // ---- contract (README "Backward bound": outside rows taint dQ_i and every visible key's dK / dV) ----
  std::string why;
  if (!info.inside_contract()) why = std::string("forward row ") + contract_reason_text(info.contract);
  if (why.empty() && info.kind == RowKind::kFullyMasked) why = "every visible score is -inf (an infinite q or k)";
  int64_t nbad = kf.bad_prefix[static_cast<size_t>(kr.last)] - kf.bad_prefix[static_cast<size_t>(kr.first)];
  for (int64_t j = kr.first; j < kr.last && nbad > 0 && !rb.hidden.empty(); ++j)  // a hidden key is never read
    if (hidden(static_cast<size_t>(j - kr.first)))
      nbad -= kf.bad_prefix[static_cast<size_t>(j + 1)] - kf.bad_prefix[static_cast<size_t>(j)];
  if (why.empty() && nbad > 0) why = "a visible k or v holds an infinity";
  double qsum = 0, dosum = 0, domax = 0;
  for (int64_t d = 0; d < D && why.empty(); ++d) {
    if (std::isinf(qrow[d])) why = "q holds an infinity";
    if (std::isfinite(qrow[d])) qsum += std::fabs(qrow[d]);
  }
  double delta = 0, dO_O = 0, dO_oe = 0, delta_err_own = 0;
  for (int64_t d = 0; d < Dv; ++d) {
    const double g = dorow[d];
    if (std::isinf(g) && why.empty()) why = "dO holds an infinity";
    if (std::isfinite(g)) dosum += std::fabs(g), domax = std::max(domax, std::fabs(g));
  }
  if (why.empty() && info.kind == RowKind::kNormal) {
    if (!std::isfinite(lse_given)) why = "the given lse is not finite";
    for (int64_t d = 0; d < Dv && why.empty(); ++d)
      if (!std::isfinite(orow[d])) why = "the given o is not finite";
  }
  const bool tainted = !why.empty();
  const int64_t n = kr.last - kr.first;
  const int64_t nwork = all_j ? n : static_cast<int64_t>(ke - kb);
  // The row's variants (oracle/row.h RowRef: the same definitions as the forward).
  oracle_detail::RowRef vr;
  if (p.variants & AF_VARIANT_SOFTCAP) vr.softcap = p.softcap;
  if (p.variants & AF_VARIANT_BIAS) vr.bias = S.vars.bias + bias_index(p, b, h, i, 0), vr.bias_j = p.bias_stride[3];
  if (p.variants & AF_VARIANT_ALIBI) {
    vr.alibi = true;
    vr.slope = S.vars.alibi_slopes[h];
    vr.diag = i + (p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? p.seq_k - p.seq_q : 0);
  }
  vr.add_dtype = score_add_dtype(opts.fwd, p);
  if ((p.variants & AF_VARIANT_SINK) && S.vars.sinks[h] != -kInf) vr.has_sink = true, vr.sink = S.vars.sinks[h];
  const bool var = vr.any_variant();
  const size_t row_slot = static_cast<size_t>((b * p.heads_q + h) * p.seq_q + i);
  if ((p.variants & AF_VARIANT_DROPOUT) && p.dropout_p > 0) {  // README "Dropout": dP, dV see the kept, scaled weights
    vr.keep = S.vars.dropout_keep + row_slot * static_cast<size_t>(p.seq_k);
    vr.drop_p = p.dropout_p;
  }
  if (!why.empty() && S.row_taint) (*S.row_taint)[row_slot] = 1;
  for (auto* x : {&rb.P, &rb.dP, &rb.eP, &rb.edP, &rb.s, &rb.dsc, &rb.edsc})
    if (x->size() < static_cast<size_t>(n)) x->resize(static_cast<size_t>(n));

  // ---- the exact P_ij, LSE, O: fast (plain double from the certified forward) or arbiter (mp_row) ----
  bool use_mp = opts.force_multiprecision && !tainted && info.kind == RowKind::kNormal;
  double lse_err = F.lse_err[li];
  const double* Oex = &F.o[oi];
  const double* Oerr = &F.o_err[oi];
  auto fill_mp = [&] {
    oracle_detail::RowRef r;
    r.q = qrow;
    r.k = kbase;
    r.v = vbase;
    r.k_row = kst;
    r.v_row = vst;
    r.first = kr.first;
    r.last = kr.last;
    r.D = D;
    r.Dv = Dv;
    r.scale = p.scale;
    r.softcap = vr.softcap, r.bias = vr.bias, r.bias_j = vr.bias_j, r.alibi = vr.alibi, r.slope = vr.slope;
    r.diag = vr.diag, r.add_dtype = vr.add_dtype, r.has_sink = vr.has_sink, r.sink = vr.sink, r.keep = vr.keep;
    r.drop_p = vr.drop_p;
    if (!rb.hidden.empty()) r.hidden = rb.hidden.data();
    auto& w = rb.mp;
    for (auto* x : {&w.s_hi, &w.s_lo, &w.a, &w.w, &w.rho, &w.dscale, &w.extra}) x->assign(static_cast<size_t>(n), 0.0);
    w.nonfinite.assign(static_cast<size_t>(n), 0);
    w.raw_bad.assign(static_cast<size_t>(n), 0);
    w.addmax = 0;
    for (auto* x : {&w.o, &w.swa, &w.o_err, &w.soft, &w.acc_hi, &w.acc_lo}) x->assign(static_cast<size_t>(Dv), 0.0);
    for (int64_t jj = 0; jj < n; ++jj) {
      if (hidden(static_cast<size_t>(jj))) {  // weight exactly 0 in mp_row
        w.nonfinite[static_cast<size_t>(jj)] = 1;
        continue;
      }
      double dd, aa;
      dot_abs(qrow, kbase + (kr.first + jj) * kst, D, dd, aa);
      w.a[static_cast<size_t>(jj)] = aa;
      if (var) {
        double sv = scale * dd;
        if (r.softcap > 0) sv = r.softcap * std::tanh(sv / r.softcap);
        const double bj = r.bias_at(kr.first + jj), aj = r.alibi_at(kr.first + jj);
        if (!std::isfinite(sv + bj + aj))
          w.nonfinite[static_cast<size_t>(jj)] = 1;  // a -inf bias: weight 0
        else
          w.addmax = std::max(w.addmax, std::fabs(sv) + std::fabs(bj) + std::fabs(aj));
      }
    }
    oracle_detail::mp_row(r, w, opts.fwd.mp_bits, opts.fwd.mp_backend);
    LSE = w.lse;
    lse_err = w.lse_err;
    Oex = w.o.data();
    Oerr = w.o_err.data();
  };
  if (use_mp) fill_mp();

  const double ud_s = static_cast<double>(D + 2) * kUd;
  for (int attempt = 0; attempt < 2; ++attempt) {
    // Delta_i = sum_d dO_id O_id on the exact O; deviation of the given o and its own error.
    delta = 0, dO_O = 0, dO_oe = 0, delta_err_own = 0;
    for (int64_t d = 0; d < Dv; ++d) {
      const double g = dorow[d];
      delta += g * Oex[d];
      dO_O += std::fabs(g * Oex[d]);
      dO_oe += std::fabs(g) * std::fabs(static_cast<double>(orow[d]) - Oex[d]);
      delta_err_own += std::fabs(g) * Oerr[d];
    }
    if (!std::isfinite(dO_O)) dO_O = 0, dO_oe = 0;
    delta_err_own += static_cast<double>(Dv + 2) * kUd * dO_O;
    const double lse_dev = std::isfinite(lse_given - LSE) ? std::fabs(lse_given - LSE) : 0;
    // Pass 1: P, dP and their kernel error bounds per visible key.
    double sum_pdp = 0, sum_pdp_err = 0, pmax_rel_own = 0;
    bool cert = lse_err <= kTau * kU * (M.c_arg * (std::fabs(LSE) + 1) + M.c_exp) || use_mp;
    for (int64_t t = 0; t < nwork; ++t) {
      const int64_t j = all_j ? kr.first + t : *(kb + t);
      const size_t jj = static_cast<size_t>(j - kr.first);
      if (hidden(jj)) {  // P = 0 exactly: no dS, no dV contribution, no error
        rb.P[jj] = rb.dP[jj] = rb.eP[jj] = rb.edP[jj] = rb.edsc[jj] = 0, rb.dsc[jj] = 1, rb.s[jj] = -kInf;
        continue;
      }
      const float* kj = kbase + j * kst;
      const float* vj = vbase + j * vst;
      double dot, a, dp, bsum;
      dot_abs(qrow, kj, D, dot, a);
      dot_abs(dorow, vj, Dv, dp, bsum);
      if (vr.keep) {  // dropout: d loss / d P_ij = c_j dO_i . v_j (c_j = 1 / (1 - p) or 0)
        const double cj = vr.keep_at(j);
        dp *= cj, bsum *= cj;
      }
      const double s_raw = scale * dot;
      double s = s_raw, dsc = 1, extra = 0, edsc = 0, own_var = 0;
      if (var) {  // README "Variants": softcap, then bias and ALiBi; dS reaches q, k through d softcap / ds
        if (vr.softcap > 0) {
          const double cap = vr.softcap, t = std::tanh(s_raw / cap);
          s = cap * t;
          dsc = 1 - t * t;
          extra = std::fabs(s_raw) * dsc + M.c_exp * std::min(cap, std::fabs(s_raw)) + std::fabs(s);
          // the kernel's 1 - t^2: t's error (the raw score's through the derivative, tanh's own) doubled
          edsc = 2 * kU * (static_cast<double>(D + 2) * sc * a * dsc / cap + std::fabs(s_raw) * dsc / cap + M.c_exp + 1);
          own_var = 4 * kUd * (std::fabs(s) + cap);
        }
        const double bj = vr.bias_at(j), aj = vr.alibi_at(j);
        if (vr.bias || vr.alibi) extra += 2 * (std::fabs(s) + std::fabs(bj) + std::fabs(aj));
        s += bj + aj;
        if (!std::isfinite(s)) extra = 0;  // a -inf bias: weight exactly 0 (P = 0)
      }
      double P;
      if (use_mp)
        P = rb.mp.w[jj];
      else
        P = std::exp(s - LSE);
      // Kernel: relative error of its P = exp(s' - lse') (README "Backward bound" (1)).
      const double ftz = 2 * sc * kFltMin * (qsum + kf.ksum[static_cast<size_t>(j)] + 2.0 * D) * dsc + kFltMin;
      const double as = var && !std::isfinite(s) ? 0.0 : std::fabs(s);  // a -inf bias: P = 0 exactly
      double dlt = kU * (static_cast<double>(D + 2) * sc * a * dsc + extra + M.c_arg * (as + std::fabs(LSE) + 1) +
                         M.c_exp) +
                   lse_dev + ftz;
      if (uc > 0) dlt += uc * (H.c_in * sc * a + H.c_s * (as + std::fabs(LSE)) + H.c_p);
      // The kernel's P' = exp(s' - lse') lies in [P e^-dlt, P e^dlt] (README "Backward bound" (1)). Backward
      // contract (README "The backward contract", rule B1): where P e^dlt may pass the fp32 range, the fp32
      // rounding of the score or of lse leaves exp(s - lse) undetermined, and the row is outside.
      const double arg = s - LSE, dcap = std::min(dlt, 700.0);
      if (why.empty() && std::isfinite(arg) && arg + dlt > kLogRange)
        why = "exp(s - lse) is undetermined in fp32: a visible score of |s| = " + fmt_g(std::fabs(s)) +
              " has a rounding error bound of " + fmt_g(dlt) + " (as an exponent), so the recomputed P may overflow";
      // P (e^dlt - 1), formed from the exponent so that a P that underflows in double keeps its error.
      const double eP = (std::isfinite(arg) ? std::exp(arg + dcap) * -std::expm1(-dcap) : P * std::expm1(dcap)) + kFltMin;
      double edP = kU * static_cast<double>(Dv + 2) * bsum + 2 * kFltMin * (dosum + Dv);
      if (uc > 0) edP += uc * H.c_acc * bsum;
      if (vr.keep) edP += 2 * kU * std::fabs(dp);  // the kernel's 1 / (1 - p) and its product
      rb.s[jj] = s;
      rb.dsc[jj] = dsc;
      rb.edsc[jj] = edsc;
      rb.P[jj] = P;
      rb.dP[jj] = dp;
      rb.eP[jj] = eP;
      rb.edP[jj] = edP;
      if (std::isfinite(P * dp)) {
        sum_pdp += P * std::fabs(dp);
        sum_pdp_err += eP * std::fabs(dp) + (P + eP) * edP;
      }
      if (bsum > kRange && why.empty()) why = "an exact |dO . v| exceeds the fp32 range";
      // The oracle's own relative error of P: score (plain double), argument, exp, the forward's LSE.
      if (!use_mp) {
        const double own = ud_s * sc * a + 4 * kUd * (as + std::fabs(LSE) + 1) + lse_err + own_var;
        pmax_rel_own = std::max(pmax_rel_own, own);
        if (own > kTau * dlt) cert = false;
      }
    }
    // Delta error: from the given o (A: dO . o) or from the row sum of P dP (B); a kernel may use either.
    const double nn = static_cast<double>(n);
    const double accn = kU * (M.c_n * nn + M.c_0);
    const double errA = dO_oe + kU * static_cast<double>(Dv + 2) * (dO_O + dO_oe) + uc * H.c_acc * dO_O;
    const double errB = sum_pdp_err + accn * sum_pdp;
    const double eDelta = std::max(errA, errB) + 2 * kFltMin * (dosum + Dv);
    if (!use_mp && delta_err_own > kTau * eDelta) cert = false;
    if (!cert && !use_mp && !tainted && info.kind == RowKind::kNormal) {
      fill_mp();  // the arbiter: this row's P, LSE and O from the multiprecision path
      use_mp = true;
      ++cnt.fallback;
      continue;
    }
    if (std::fabs(delta) > kRange && why.empty()) why = "an exact |Delta| exceeds the fp32 range";
    if (vr.has_sink && S.row_sink) {  // d sink term of this row: -exp(sink - LSE) Delta, as the kernel forms it
      const double Ps = std::exp(vr.sink - LSE);
      const double dls = kU * (M.c_arg * (std::fabs(vr.sink) + std::fabs(LSE) + 1) + M.c_exp) + lse_dev;
      const double ePs = Ps * std::expm1(std::min(dls, 700.0)) + kFltMin;
      (*S.row_sink)[row_slot] = -Ps * delta;
      (*S.row_sink_err)[row_slot] = ePs * std::fabs(delta) + (Ps + ePs) * eDelta + 2 * kU * Ps * std::fabs(delta);
      (*S.row_sink_mag)[row_slot] = Ps * std::fabs(delta);
    }
    // Pass 2: dS and the accumulations.
    if (want_dq) {
      rb.dq_val.assign(static_cast<size_t>(D), 0.0);
      rb.dq_err.assign(static_cast<size_t>(D), 0.0);
      rb.dq_mag.assign(static_cast<size_t>(D), 0.0);
    }
    for (int64_t t = 0; t < nwork; ++t) {
      const int64_t j = all_j ? kr.first + t : *(kb + t);
      const size_t jj = static_cast<size_t>(j - kr.first);
      if (hidden(jj)) continue;
      const double P = rb.P[jj], dp = rb.dP[jj], eP = rb.eP[jj], edP = rb.edP[jj];
      const double diff = dp - delta;
      const double dS_f = P * diff;
      const double mS = P * (std::fabs(dp) + std::fabs(delta));
      double eS_f = eP * std::fabs(diff) + (P + eP) * (edP + eDelta) + 2 * kU * mS + kFltMin;
      if (S.pair_ds) {  // d bias of this pair: dS of the final score (fp32 on the device)
        const size_t slot = row_slot * static_cast<size_t>(p.seq_k) + static_cast<size_t>(j);
        (*S.pair_ds)[slot] = dS_f;
        (*S.pair_err)[slot] = eS_f;
      }
      // Softcap: the raw score's dS = dS_f (1 - tanh^2), with the error of the kernel's 1 - tanh^2.
      const double dsc = rb.dsc[jj];
      const double dS = dS_f * dsc;
      double eS = eS_f * dsc + std::fabs(dS_f) * rb.edsc[jj] + (dsc != 1 ? 2 * kU * std::fabs(dS) : 0.0);
      if (uc > 0) eS += uc * std::fabs(dS) + eta_ds;  // dS (or scale dS) rounded to the compute dtype
      // Rule B2: what the kernel may form for dS, P' (dP' - Delta'), within the fp32 range.
      if (why.empty() && (P + eP) * (std::fabs(dp) + edP + std::fabs(delta) + eDelta) > kRange)
        why = mS > kRange ? "an exact P (|dP| + |Delta|) exceeds the fp32 range"
                          : "the kernel's dS = P (dP - Delta) may exceed the fp32 range within its rounding error";
      const float* kj = kbase + j * kst;
      if (want_dq) {
        double* __restrict qv = rb.dq_val.data();
        double* __restrict qe = rb.dq_err.data();
        double* __restrict qm = rb.dq_mag.data();
        for (int64_t d = 0; d < D; ++d) {
          const double x = kj[d], ax = std::fabs(x);
          qv[d] += dS * x;
          qe[d] += eS * ax;
          qm[d] += std::fabs(dS) * ax;
        }
      }
      if (!S.k_pick[static_cast<size_t>(j)]) continue;
      ++ka.count[static_cast<size_t>(j)];
      double* __restrict kv = &ka.dk.val[static_cast<size_t>(j * D)];
      double* __restrict ke2 = &ka.dk.err[static_cast<size_t>(j * D)];
      double* __restrict km = &ka.dk.mag[static_cast<size_t>(j * D)];
      for (int64_t d = 0; d < D; ++d) {
        const double x = qrow[d], ax = std::fabs(x);
        kv[d] += dS * x;
        ke2[d] += eS * ax;
        km[d] += std::fabs(dS) * ax;
      }
      double* __restrict vv = &ka.dv.val[static_cast<size_t>(j * Dv)];
      double* __restrict ve = &ka.dv.err[static_cast<size_t>(j * Dv)];
      double* __restrict vm = &ka.dv.mag[static_cast<size_t>(j * Dv)];
      // P rounded to the compute dtype for dV = P^T dO; dropout: dV sees the kept, scaled P (two more roundings)
      const double cj = vr.keep_at(j);
      const double Pv = P * cj, ePv = (eP + uc * H.c_p * P + (vr.keep ? 2 * kU * P : 0.0)) * cj + eta_c;
      for (int64_t d = 0; d < Dv; ++d) {
        const double g = dorow[d], ag = std::fabs(g);
        vv[d] += Pv * g;
        ve[d] += ePv * ag;
        vm[d] += Pv * ag;
      }
    }
    break;
  }
  use_mp ? ++cnt.mp : ++cnt.fast;
  if (!why.empty()) {
    if (S.row_taint) (*S.row_taint)[row_slot] = 1;
    if (cnt.why.empty()) cnt.why = why;
    ++ka.taint_diff[static_cast<size_t>(kr.first)];
    --ka.taint_diff[static_cast<size_t>(kr.last)];
  }
  if (want_dq) {
    const double accq = kU * (M.c_n * static_cast<double>(n) + M.c_0) + uc * H.c_acc;
    const double floor = 2 * kFltMin * static_cast<double>(n + 2) * (1 + kf.kmax) * std::max(1.0, sc);
    const double uout = unit_roundoff(p.dtype);
    // A stored f16 / bf16 dQ: rounding a tiny value may lose up to half the format's smallest subnormal.
    const double eout = p.dtype == AF_DTYPE_F32 || n == 0 ? 0 : underflow_error(p.dtype);
    for (int64_t d = 0; d < D; ++d) {
      const double val = scale * rb.dq_val[static_cast<size_t>(d)];
      const double mag = rb.dq_mag[static_cast<size_t>(d)];
      R.dq[qi + d] = val;
      double bd =
          sf * (sc * (rb.dq_err[static_cast<size_t>(d)] + accq * mag) + uout * std::fabs(val) + eout + floor);
      if (std::isnan(val)) bd = 0;
      // Rule B3: the accumulated magnitude a kernel may form, exact terms plus their error bounds.
      const double reach = mag + rb.dq_err[static_cast<size_t>(d)];
      if (!why.empty() || std::max(reach, sc * reach) > kRange) bd = kInf;
      R.dq_bound[qi + d] = bd;
    }
  }
}

}  // namespace

std::vector<int64_t> sample_keys(const Problem& p, const float* k, const float* v, int64_t budget, uint64_t seed) {
  const int64_t Sk = p.seq_k;
  std::vector<int64_t> out;
  if (budget <= 0 || budget >= Sk) {
    for (int64_t j = 0; j < Sk; ++j) out.push_back(j);
    return out;
  }
  std::vector<unsigned char> pick(static_cast<size_t>(Sk), 0);
  pick[0] = pick[static_cast<size_t>(Sk - 1)] = 1;
  for (int64_t T : {16, 32, 64, 128})
    for (int64_t t = T; t < Sk; t += T) pick[static_cast<size_t>(t - 1)] = pick[static_cast<size_t>(t)] = 1;
  for (int64_t j = 0; j < Sk; ++j)
    for (int64_t b = 0; b < p.batch && !pick[static_cast<size_t>(j)]; ++b)
      for (int64_t hk = 0; hk < p.heads_kv && !pick[static_cast<size_t>(j)]; ++hk) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          if (!std::isfinite(k[k_index(p, b, j, hk, d)])) pick[static_cast<size_t>(j)] = 1;
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          if (!std::isfinite(v[v_index(p, b, j, hk, d)])) pick[static_cast<size_t>(j)] = 1;
      }
  int64_t count = 0;
  for (auto x : pick) count += x;
  uint64_t st = seed ^ 0x6b65797300000000ull;
  while (count < budget) {
    const int64_t j = static_cast<int64_t>(splitmix64(st) % static_cast<uint64_t>(Sk));
    if (!pick[static_cast<size_t>(j)]) pick[static_cast<size_t>(j)] = 1, ++count;
  }
  for (int64_t j = 0; j < Sk; ++j)
    if (pick[static_cast<size_t>(j)]) out.push_back(j);
  return out;
}

GradResult compute_grad_oracle(const Problem& p, const float* q, const float* k, const float* v,
                               const float* dout, const float* o, const float* lse, const GradOptions& opts) {
  return compute_grad_oracle(p, q, k, v, dout, o, lse, VariantInputs{}, opts);
}

GradResult compute_grad_oracle(const Problem& p, const float* q, const float* k, const float* v,
                               const float* dout, const float* o, const float* lse, const VariantInputs& vars,
                               const GradOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  if (const std::string why = validate(p); !why.empty()) throw std::invalid_argument("grad oracle: " + why);
  if (kv_shared(p))  // the contract (dK[:, :, :Dv] += dV into dk) is documented; no kernel writes it yet
    throw std::invalid_argument("grad oracle: kv-shared is checked in the forward pass only (yet)");
  // The forward: exact LSE and O of every row (each key's dK / dV needs every row that sees it).
  OracleOptions fo = opts.fwd;
  fo.row_budget = 0;
  fo.baseline = false;
  fo.force_multiprecision = fo.force_multiprecision || opts.force_multiprecision;
  OracleResult own;
  const bool reuse = opts.forward && opts.forward->rows_computed == p.batch * p.heads_q * p.seq_q &&
                     opts.forward->problem.seq_q == p.seq_q && opts.forward->problem.seq_k == p.seq_k &&
                     opts.forward->problem.heads_q == p.heads_q && opts.forward->problem.head_dim_v == p.head_dim_v;
  if (!reuse) own = compute_oracle(p, q, k, v, vars, fo);  // throws when a variant's values are missing
  const OracleResult& F = reuse ? *opts.forward : own;
  GradResult R;
  R.problem = p;
  const int64_t B = p.batch, Sq = p.seq_q, Sk = p.seq_k, Hq = p.heads_q, Hkv = p.heads_kv;
  const int64_t D = p.head_dim, Dv = p.head_dim_v, G = Hq / Hkv;
  R.dq.assign(static_cast<size_t>(B * Sq * Hq * D), kNaN);
  R.dq_bound = R.dq;
  R.dk.assign(static_cast<size_t>(B * Sk * Hkv * D), kNaN);
  R.dk_bound = R.dk;
  R.dv.assign(static_cast<size_t>(B * Sk * Hkv * Dv), kNaN);
  R.dv_bound = R.dv;
  R.q_computed.assign(static_cast<size_t>(B * Sq * Hq), 0);
  R.k_computed.assign(static_cast<size_t>(B * Sk * Hkv), 0);
  R.sampled_q = sample_rows(p, q, k, opts.q_budget, opts.sample_seed);
  R.sampled_k = sample_keys(p, k, v, opts.k_budget, opts.sample_seed);

  Shared S{&p, q, k, v, dout, o, lse, &opts, &F, F.compute_dtype, &R, {}, {}, R.sampled_k, true};
  S.q_pick.assign(static_cast<size_t>(Sq), 0);
  for (int64_t i : R.sampled_q) S.q_pick[static_cast<size_t>(i)] = 1;
  S.k_pick.assign(static_cast<size_t>(Sk), 0);
  for (int64_t j : R.sampled_k) S.k_pick[static_cast<size_t>(j)] = 1;
  S.all_keys = static_cast<int64_t>(R.sampled_k.size()) == Sk;
  S.vars = vars;
  std::vector<double> pair_ds, pair_err, row_sink, row_sink_err, row_sink_mag;
  std::vector<unsigned char> row_taint(static_cast<size_t>(B * Hq * Sq), 0);
  S.row_taint = &row_taint;
  if (p.variants & AF_VARIANT_BIAS) {
    S.need_all = true;
    pair_ds.assign(static_cast<size_t>(B * Hq * Sq * Sk), 0.0);
    pair_err.assign(pair_ds.size(), 0.0);
    S.pair_ds = &pair_ds;
    S.pair_err = &pair_err;
  }
  if (p.variants & AF_VARIANT_SINK) {
    for (auto* x : {&row_sink, &row_sink_err, &row_sink_mag}) x->assign(static_cast<size_t>(B * Hq * Sq), 0.0);
    S.row_sink = &row_sink;
    S.row_sink_err = &row_sink_err;
    S.row_sink_mag = &row_sink_mag;
  }

  const unsigned hw = opts.fwd.threads ? opts.fwd.threads : std::max(1u, std::thread::hardware_concurrency());
  const BoundModel& M = opts.fwd.model;
  const LowpBoundModel& H = lowp_terms(opts.fwd, S.cd);
  const double uc = S.cd == AF_DTYPE_F32 ? 0 : unit_roundoff(S.cd), uout = unit_roundoff(p.dtype);
  const double eout = p.dtype == AF_DTYPE_F32 ? 0 : underflow_error(p.dtype);  // stored dK / dV underflow
  const double scale = p.scale, sc = std::fabs(scale), sf = opts.fwd.safety_factor;
  // GQA by expansion (K and V repeated per query head, as PyTorch does for a backward without GQA): each query head's
  // dK_h, dV_h is stored in the output dtype and the G of a group summed, adding u_out |dK_h| + eta_out per head, at
  // most u_out (scale) mag + G eta_out (issue 30: SDPA's cuDNN f16 backward at Hq = 8, Hkv = 1 on an H100).
  const double gqa_rel = G > 1 ? uout : 0, gqa_abs = G > 1 ? static_cast<double>(G) * eout : 0;
  Counters total;
  std::vector<KeyAcc> acc;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      KeyFacts kf;
      kf.ksum.assign(static_cast<size_t>(Sk), 0.0);
      kf.bad_prefix.assign(static_cast<size_t>(Sk + 1), 0);
      double domax = 0;
      for (int64_t j = 0; j < Sk; ++j) {
        bool bad = false;
        for (int64_t d = 0; d < D; ++d) {
          const float x = k[k_index(p, b, j, hk, d)];
          if (std::isfinite(x)) kf.ksum[static_cast<size_t>(j)] += std::fabs(x), kf.kmax = std::max(kf.kmax, std::fabs(double(x)));
          bad |= std::isinf(x);
        }
        for (int64_t d = 0; d < Dv; ++d) bad |= std::isinf(v[v_index(p, b, j, hk, d)]);
        kf.bad_prefix[static_cast<size_t>(j + 1)] = kf.bad_prefix[static_cast<size_t>(j)] + (bad ? 1 : 0);
      }
      double qmax = 0;
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
        for (int64_t i = 0; i < Sq; ++i) {
          for (int64_t d = 0; d < D; ++d) {
            const float x = q[q_index(p, b, i, h, d)];
            if (std::isfinite(x)) qmax = std::max(qmax, std::fabs(double(x)));
          }
          for (int64_t d = 0; d < Dv; ++d) {
            const float x = dout[o_index(p, b, i, h, d)];
            if (std::isfinite(x)) domax = std::max(domax, std::fabs(double(x)));
          }
        }
      // Rows of this group: (h, i) over the G query heads; threads take chunks, keys accumulate privately.
      const int64_t rows = G * Sq;
      const int64_t work = rows * std::max<int64_t>(1, Sk) * (D + Dv);
      const unsigned nt = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(hw, work / 200000 + 1)));
      if (acc.size() < nt) acc.resize(nt);
      std::atomic<int64_t> next{0};
      std::mutex mu;
      std::exception_ptr err;
      auto worker = [&](unsigned id) {
        KeyAcc& ka = acc[id];
        ka.reset(Sk, D, Dv);
        RowBuf rb;
        Counters c;
        try {
          const int64_t chunk = 8;
          for (;;) {
            const int64_t begin = next.fetch_add(chunk);
            if (begin >= rows) break;
            for (int64_t t = begin; t < std::min(rows, begin + chunk); ++t)
              grad_row(S, b, hk * G + t / Sq, t % Sq, kf, ka, rb, c);
          }
        } catch (...) {
          std::lock_guard<std::mutex> g(mu);
          if (!err) err = std::current_exception();
          next = rows;
        }
        std::lock_guard<std::mutex> g(mu);
        total.fast += c.fast, total.mp += c.mp, total.fallback += c.fallback;
        if (total.why.empty()) total.why = c.why;
      };
      if (nt == 1) {
        worker(0);
      } else {
        std::vector<std::thread> th;
        for (unsigned id = 0; id < nt; ++id) th.emplace_back(worker, id);
        for (auto& t : th) t.join();
      }
      if (err) std::rethrow_exception(err);
      for (unsigned id = 1; id < nt; ++id) {  // reduce into acc[0]
        for (auto pr : {std::make_pair(&acc[0].dk, &acc[id].dk), std::make_pair(&acc[0].dv, &acc[id].dv)})
          for (size_t x = 0; x < pr.first->val.size(); ++x) {
            pr.first->val[x] += pr.second->val[x];
            pr.first->err[x] += pr.second->err[x];
            pr.first->mag[x] += pr.second->mag[x];
          }
        for (size_t x = 0; x < acc[0].count.size(); ++x) acc[0].count[x] += acc[id].count[x];
        for (size_t x = 0; x < acc[0].taint_diff.size(); ++x) acc[0].taint_diff[x] += acc[id].taint_diff[x];
      }
      const KeyAcc& A = acc[0];
      int64_t taint = 0;
      for (int64_t j = 0; j < Sk; ++j) {
        taint += A.taint_diff[static_cast<size_t>(j)];
        if (!S.k_pick[static_cast<size_t>(j)]) continue;
        R.k_computed[static_cast<size_t>((b * Sk + j) * Hkv + hk)] = 1;
        const double N = static_cast<double>(A.count[static_cast<size_t>(j)]);
        const double accn = kU * (M.c_n * N + M.c_0) + uc * H.c_acc;
        const double fk = 2 * kFltMin * (N + 2) * (1 + qmax) * std::max(1.0, sc);
        const double fv = 2 * kFltMin * (N + 2) * (1 + domax);
        for (int64_t d = 0; d < D; ++d) {
          const size_t x = static_cast<size_t>(j * D + d), y = R.dk_at(b, j, hk, d);
          const double val = scale * A.dk.val[x], mag = A.dk.mag[x];
          double bd = N == 0 ? 0
                             : sf * (sc * (A.dk.err[x] + (accn + gqa_rel) * mag) + uout * std::fabs(val) + eout +
                                     gqa_abs + fk);
          if (std::isnan(val)) bd = 0;
          const double reach = mag + A.dk.err[x];  // rule B3
          if (taint > 0 || std::max(reach, sc * reach) > kRange) bd = kInf;
          R.dk[y] = val;
          R.dk_bound[y] = bd;
        }
        for (int64_t d = 0; d < Dv; ++d) {
          const size_t x = static_cast<size_t>(j * Dv + d), y = R.dv_at(b, j, hk, d);
          const double val = A.dv.val[x], mag = A.dv.mag[x];
          double bd =
              N == 0 ? 0 : sf * (A.dv.err[x] + (accn + gqa_rel) * mag + uout * std::fabs(val) + eout + gqa_abs + fv);
          if (std::isnan(val)) bd = 0;
          if (taint > 0 || mag + A.dv.err[x] > kRange) bd = kInf;  // rule B3
          R.dv[y] = val;
          R.dv_bound[y] = bd;
        }
      }
    }
  // Score variants: d sink per head, d bias per element (sums over rows / broadcast dimensions, any order).
  if (p.variants & AF_VARIANT_SINK) {
    R.dsinks.assign(static_cast<size_t>(Hq), 0.0);
    R.dsinks_bound.assign(static_cast<size_t>(Hq), 0.0);
    for (int64_t h = 0; h < Hq; ++h) {
      double val = 0, err = 0, mag = 0;
      bool taint = false;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < Sq; ++i) {
          const size_t x = static_cast<size_t>((b * Hq + h) * Sq + i);
          val += row_sink[x], err += row_sink_err[x], mag += row_sink_mag[x];
          taint |= row_taint[x] != 0;
        }
      const double N = static_cast<double>(B * Sq);
      double bd = sf * (err + (kU * (M.c_n * N + M.c_0) + uc * H.c_acc) * mag + kU * std::fabs(val) + kFltMin * (N + 2));
      if (taint || mag + err > kRange) bd = kInf;
      if (std::isnan(val)) bd = 0;
      R.dsinks[static_cast<size_t>(h)] = val;
      R.dsinks_bound[static_cast<size_t>(h)] = bd;
    }
  }
  if (p.variants & AF_VARIANT_BIAS) {
    const size_t nb = static_cast<size_t>(bias_elements(p));
    std::vector<double> err(nb, 0.0), mag(nb, 0.0), cnt(nb, 0.0);
    std::vector<unsigned char> taint(nb, 0);
    R.dbias.assign(nb, 0.0);
    R.dbias_bound.assign(nb, 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < Sq; ++i) {
          const KeyRange kr = visible_keys(p, i);
          const size_t row = static_cast<size_t>((b * Hq + h) * Sq + i);
          for (int64_t j = kr.first; j < kr.last; ++j) {
            const size_t e = static_cast<size_t>(bias_index(p, b, h, i, j));
            const size_t x = row * static_cast<size_t>(Sk) + static_cast<size_t>(j);
            R.dbias[e] += pair_ds[x];
            err[e] += pair_err[x];
            mag[e] += std::fabs(pair_ds[x]);
            cnt[e] += 1;
            taint[e] |= row_taint[row];
          }
        }
    for (size_t e = 0; e < nb; ++e) {
      const double val = R.dbias[e];
      double bd = cnt[e] == 0 ? 0
                              : sf * (err[e] + (kU * (M.c_n * cnt[e] + M.c_0) + uc * H.c_acc) * mag[e] +
                                      kU * std::fabs(val) + kFltMin * (cnt[e] + 2));
      if (taint[e] || mag[e] + err[e] > kRange) bd = kInf;
      if (std::isnan(val)) bd = 0;
      R.dbias_bound[e] = bd;
    }
  }
  R.rows_fast = total.fast;
  R.rows_mp = total.mp;
  R.rows_fallback = total.fallback;
  auto any_inf = [](const std::vector<double>& x) {
    return std::any_of(x.begin(), x.end(), [](double y) { return std::isinf(y); });
  };
  if (any_inf(R.dq_bound) || any_inf(R.dk_bound) || any_inf(R.dv_bound) || any_inf(R.dsinks_bound) ||
      any_inf(R.dbias_bound)) {
    R.inside_contract = false;
    R.why = total.why.empty() ? "an accumulated gradient magnitude exceeds the fp32 range" : total.why;
  }
  R.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return R;
}

}  // namespace attnfuzz
