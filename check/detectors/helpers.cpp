// helpers.cpp - what the detectors share: counted launches and oracles, bitwise diffs, row ratios,
// subprocesses.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "attnfuzz/corpus.h"
#include "attnfuzz/dropout.h"
#include "check/compare.h"
#include "check/detectors/detectors.h"
#include "check/dropout.h"
#include "check/sequences.h"

namespace attnfuzz::detect {

LaunchOutcome Context::launch(const Tensors& t, const RunOptions& o) {
  ++stats.launches;
  return launch_for_pass(dev, k, pc, t, o);
}

const Tensors& Context::view_tensors() {
  if (!has_sequences(pc.problem())) return pc.tensors();
  if (!view_t) view_t = sequence_view_tensors(pc.problem(), pc.tensors());
  return *view_t;
}

OracleResult Context::oracle(const Problem& p, const Tensors& t, bool add_in_dtype) {
  ++stats.oracles;
  VariantInputs vars = t.variant_inputs();
  std::vector<uint8_t> keep;  // dropout: the checked launch's mask for the case's shape, else the reference mask
  if (p.variants & AF_VARIANT_DROPOUT) {
    const Problem& cp = pc.problem();
    const bool same = p.batch == cp.batch && p.heads_q == cp.heads_q && p.seq_q == cp.seq_q && p.seq_k == cp.seq_k;
    keep = same ? launch_keep(pc, j.outcome.keep) : reference_keep_mask(p);
    vars.dropout_keep = keep.data();
  }
  return compute_oracle(p, t.q.data(), t.k.data(), t.v.data(), vars, experiment_options(add_in_dtype));
}

OracleOptions Context::experiment_options(bool add_in_dtype) const {
  OracleOptions o = opts.oracle;
  o.baseline = false;  // the experiments judge against the exact rows only
  o.score_add_in_dtype |= add_in_dtype;
  return o;
}

Problem Context::row_problem(int64_t b) const {
  return seqs() ? sequence_problem(pc.problem(), pc.tensors(), b) : problem();
}

OracleResult Context::layout_oracle(const Problem& lp, const Tensors& t, bool add_in_dtype) {
  if (!seqs()) return oracle(lp, t, add_in_dtype);
  ++stats.oracles;
  return sequence_oracle(lp, t, experiment_options(add_in_dtype));
}

std::vector<int64_t> Context::seen_keys(int64_t b, int64_t h, int64_t s) const {
  return attnfuzz::seen_keys(row_problem(b), pc.variant_inputs(), b, h, s);  // custom masks: dense batches
}

std::string Context::seen_text(int64_t b, int64_t h, int64_t s) const {
  const std::vector<int64_t> keys = seen_keys(b, h, s);
  const KeyRange kr = visible_keys(row_problem(b), s);
  const int64_t n = static_cast<int64_t>(keys.size());
  if (keys.empty())
    return kr.empty() ? "no visible key"
                      : fmt("no visible key (the custom / block mask hides all of [%lld, %lld))",
                            (long long)kr.first, (long long)kr.last);
  if (n == kr.last - kr.first)
    return fmt("keys [%lld, %lld) visible", (long long)kr.first, (long long)kr.last);
  return fmt("%lld keys visible in [%lld, %lld) (the custom / block mask hides the other %lld)", (long long)n,
             (long long)kr.first, (long long)kr.last, (long long)(kr.last - kr.first - n));
}

int64_t Context::q_at(int64_t b, int64_t s, int64_t h, int64_t d) const {
  return seqs() ? q_offset(pc.problem(), pc.tensors(), b, s, h, d) : q_index(problem(), b, s, h, d);
}
int64_t Context::k_at(int64_t b, int64_t j, int64_t hk, int64_t d) const {
  return seqs() ? k_offset(pc.problem(), pc.tensors(), b, j, hk, d) : k_index(problem(), b, j, hk, d);
}
int64_t Context::v_at(int64_t b, int64_t j, int64_t hk, int64_t d) const {
  return seqs() ? v_offset(pc.problem(), pc.tensors(), b, j, hk, d) : v_index(problem(), b, j, hk, d);
}

bool apart(double a, double ba, double b, double bb, double margin) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) != std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a != b;
  return std::fabs(a - b) > ba + 1e-4 * std::max(std::fabs(a), std::fabs(b)) + margin * (ba + bb);
}

std::string outputs_apart(const Problem& p, const OracleResult& x, const OracleResult& y, double margin) {
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const RowInfo &rx = x.row(b, h, s), &ry = y.row(b, h, s);
        if (!rx.computed || !ry.computed || !rx.inside_contract()) continue;
        if (!ry.inside_contract())
          return fmt("row s=%lld (b=%lld, h=%lld) leaves the fp32 contract without it", (long long)s,
                     (long long)b, (long long)h);
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t e = x.o_at(b, s, h, d);
          if (apart(x.o[e], x.o_bound[e], y.o[e], y.o_bound[e], margin))
            return o_name(b, s, h, d) + ": " + num(x.o[e]) + " vs " + num(y.o[e]);
        }
      }
  return {};
}

std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt("%.6g", v);
}

std::string o_name(int64_t b, int64_t s, int64_t h, int64_t d) {
  return fmt("O[b=%lld,s=%lld,h=%lld,d=%lld]", (long long)b, (long long)s, (long long)h, (long long)d);
}

std::string BitDiff::first() const {
  const std::string where =
      !tensor.empty() ? fmt("%s[b=%lld,%s=%lld,h=%lld,d=%lld]", tensor.c_str(), (long long)b,
                            tensor == "dQ" ? "s" : "j", (long long)s, (long long)h, (long long)d)
      : is_lse        ? fmt("LSE[b=%lld,h=%lld,s=%lld]", (long long)b, (long long)h, (long long)s)
                      : o_name(b, s, h, d);
  return where + ": " + num(a) + " vs " + num(x);
}

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

BitDiff bit_diff(const Problem& p, const LaunchOutcome& a, const LaunchOutcome& x, bool nan_payloads) {
  // Bitwise equal, or (nan_payloads false) both NaN.
  auto same_bits = [nan_payloads](float u, float w) {
    return bits(u) == bits(w) || (!nan_payloads && std::isnan(u) && std::isnan(w));
  };
  BitDiff r;
  if (a.o.size() != x.o.size() || a.lse.size() != x.lse.size()) {
    r.count = -1;
    return r;
  }
  auto note = [&](bool lse, int64_t b, int64_t s, int64_t h, int64_t d, float va, float vx) {
    if (r.count++ == 0) {
      r.is_lse = lse;
      r.b = b, r.s = s, r.h = h, r.d = d, r.a = va, r.x = vx;
    }
  };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t i = static_cast<size_t>(o_index(p, b, s, h, d));
          if (i < a.o.size() && !same_bits(a.o[i], x.o[i])) note(false, b, s, h, d, a.o[i], x.o[i]);
        }
  if (!a.lse.empty())
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t s = 0; s < p.seq_q; ++s) {
          const size_t i = static_cast<size_t>(lse_index(p, b, h, s));
          if (i < a.lse.size() && !same_bits(a.lse[i], x.lse[i])) note(true, b, s, h, 0, a.lse[i], x.lse[i]);
        }
  if (!a.backward || !x.backward) return r;
  if (a.dq.size() != x.dq.size() || a.dk.size() != x.dk.size() || a.dv.size() != x.dv.size()) {
    r.count = -1;
    return r;
  }
  auto grad = [&](const char* name, const std::vector<float>& va, const std::vector<float>& vx,
                  const int64_t* st, int64_t seq, int64_t heads, int64_t dim) {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dim; ++d) {
            const size_t i = static_cast<size_t>(b * st[0] + s * st[1] + h * st[2] + d);
            if (same_bits(va[i], vx[i])) continue;
            if (r.count == 0) r.tensor = name;
            note(false, b, s, h, d, va[i], vx[i]);
          }
  };
  grad("dQ", a.dq, x.dq, p.q_stride, p.seq_q, p.heads_q, p.head_dim);
  grad("dK", a.dk, x.dk, p.k_stride, p.seq_k, p.heads_kv, p.head_dim);
  grad("dV", a.dv, x.dv, p.v_stride, p.seq_k, p.heads_kv, p.head_dim_v);
  return r;
}

BitDiff launch_diff(Context& c, const LaunchOutcome& a, const LaunchOutcome& x) {
  const Problem& p = c.problem();
  const bool payloads = !c.nan_payloads_vary;
  auto same_bits = [payloads](float u, float w) {
    return bits(u) == bits(w) || (!payloads && std::isnan(u) && std::isnan(w));
  };
  if (!a.backward || !x.backward) return bit_diff(p, a, x, payloads);
  LaunchOutcome fa, fx;  // O / LSE only: every bit counts
  fa.o = a.o, fa.lse = a.lse, fx.o = x.o, fx.lse = x.lse;
  BitDiff r = bit_diff(p, fa, fx, payloads);
  if (r.count < 0) return r;
  if (a.dq.size() != x.dq.size() || a.dk.size() != x.dk.size() || a.dv.size() != x.dv.size()) {
    r.count = -1;
    return r;
  }
  const GradResult& g = c.pc.grad(c.opts.oracle);
  auto grad = [&](const char* name, const std::vector<float>& va, const std::vector<float>& vx,
                  const int64_t* st, int64_t seq, int64_t heads, int64_t dim,
                  const std::vector<double>& bound) {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dim; ++d) {
            const size_t i = static_cast<size_t>(b * st[0] + s * st[1] + h * st[2] + d);
            if (same_bits(va[i], vx[i])) continue;
            // Accumulation order moves a sum by rounding errors relative to its terms: within the element's
            // bound when the result is right, within 1e-4 of its magnitude when it is wrong anyway (a lost
            // update or a missing barrier moves whole terms).
            const double bd = bound[static_cast<size_t>(((b * seq + s) * heads + h) * dim + d)];
            const double rel =
                1e-4 * std::max(std::fabs(static_cast<double>(va[i])), std::fabs(static_cast<double>(vx[i])));
            const ElementJudgement jd = judge_element(va[i], vx[i], std::isnan(bd) ? rel : std::max(bd, rel));
            if (!jd.nonfinite_mismatch && (std::isnan(bd) || !jd.fail)) {
              ++r.within_bound;
              continue;
            }
            if (r.count++ == 0) {
              r.tensor = name;
              r.b = b, r.s = s, r.h = h, r.d = d, r.a = va[i], r.x = vx[i];
            }
          }
  };
  grad("dQ", a.dq, x.dq, p.q_stride, p.seq_q, p.heads_q, p.head_dim, g.dq_bound);
  grad("dK", a.dk, x.dk, p.k_stride, p.seq_k, p.heads_kv, p.head_dim, g.dk_bound);
  grad("dV", a.dv, x.dv, p.v_stride, p.seq_k, p.heads_kv, p.head_dim_v, g.dv_bound);
  return r;
}

CheckResult judge_outcome(Context& c, const LaunchOutcome& out) {
  if (!out.backward) return judge(c.problem(), c.pc.oracle(c.opts.oracle), out);
  CheckResult r;
  if (c.pass() == Pass::kFwdBwd) r = judge(c.problem(), c.pc.oracle(c.opts.oracle), out);
  CheckResult g;
  RunOptions o = c.opts;
  o.worst = 1;
  judge_gradients(c.pc, out, o, g);
  if (g.verdict == Verdict::kFail)
    r.verdict = Verdict::kFail;
  else if (r.verdict != Verdict::kFail)
    r.verdict = g.verdict;
  return r;
}

std::string gradient_failure_text(Context& c) {
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  std::string text;
  if (!out.backward) return text;
  CheckResult g;
  RunOptions o = c.opts;
  o.worst = size_t{1} << 30;  // every failing element
  judge_gradients(c.pc, out, o, g);
  for (const char* t : {"dQ", "dK", "dV", "dSink", "dBias"}) {
    std::vector<int64_t> pos, heads;
    int64_t n = 0, nonfinite = 0;
    for (const ElementReport& e : g.worst)
      if (e.tensor == t && !(e.ratio <= 1)) {
        ++n;
        nonfinite += std::isinf(e.ratio) && (!std::isfinite(e.got) || !std::isfinite(e.expected));
        pos.push_back(e.s);
        heads.push_back(e.h);
      }
    if (!n) continue;
    if (!text.empty()) text += "; ";
    if (t[1] == 'S' || t[1] == 'B') {  // the variants' own parameters: per head / bias element, no row or key
      text += fmt("%s: %lld element(s) beyond the bound (%lld NaN/Inf)", t, (long long)n, (long long)nonfinite);
      continue;
    }
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    std::sort(heads.begin(), heads.end());
    heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
    const bool q = std::string(t) == "dQ";
    text += fmt("%s: %lld element(s) beyond the bound (%lld NaN/Inf), %s = ", t, (long long)n,
                (long long)nonfinite, q ? "query rows s" : "keys j") +
            ranges(pos) + fmt(" of %s=%lld", q ? "Sq" : "Sk", (long long)(q ? p.seq_q : p.seq_k)) +
            fmt(", %s heads h = ", q ? "query" : "KV") + ranges(heads);
  }
  return text.empty() ? "no gradient element beyond its bound" : text;
}

double row_ratio(const Problem& p, const OracleResult& ex, const LaunchOutcome& out, int64_t b, int64_t h,
                 int64_t s) {
  const RowInfo& ri = ex.row(b, h, s);
  if (!ri.computed || !ri.inside_contract() || out.o.empty()) return std::nan("");
  double worst = 0;
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    const size_t e = ex.o_at(b, s, h, d);
    const ElementJudgement jd =
        judge_element(ex.o[e], out.o[static_cast<size_t>(o_index(p, b, s, h, d))], ex.o_bound[e]);
    worst = std::max(worst, jd.ratio);
  }
  if (!out.lse.empty()) {
    const size_t e = ex.lse_at(b, h, s);
    const ElementJudgement jd =
        judge_element(ex.lse[e], out.lse[static_cast<size_t>(lse_index(p, b, h, s))], ex.lse_bound[e]);
    worst = std::max(worst, jd.ratio);
  }
  return worst;
}

RowsMatch rows_match(const Problem& p, const OracleResult& exact, const OracleResult& ex, const LaunchOutcome& out,
                     const std::vector<RowKey>& rows) {
  RowsMatch m;
  for (const RowKey& r : rows) {
    double rr = row_ratio(p, ex, out, r.b, r.h, r.s);
    // Never a NaN = NaN "match": a row whose other exact result is NaN says nothing about the other problem.
    for (int64_t d = 0; d < p.head_dim_v; ++d)
      if (std::isnan(ex.o[ex.o_at(r.b, r.s, r.h, d)])) rr = std::numeric_limits<double>::infinity();
    m.match += rr <= 1;
    // The difference must be visible on the row: the other exact result is itself beyond the case's bound (else a
    // kernel that is merely imprecise would "match" another problem that changes nothing there).
    bool vis = false;
    for (int64_t d = 0; d < p.head_dim_v && !vis; ++d) {
      const size_t e = exact.o_at(r.b, r.s, r.h, d);
      vis = judge_element(exact.o[e], static_cast<float>(ex.o[e]), exact.o_bound[e]).fail;
    }
    if (!vis && !out.lse.empty()) {
      const size_t e = exact.lse_at(r.b, r.h, r.s);
      vis = judge_element(exact.lse[e], static_cast<float>(ex.lse[e]), exact.lse_bound[e]).fail;
    }
    m.visible += vis;
    if (!std::isnan(rr)) m.worst = std::max(m.worst, rr);
    if (m.where.size() < 64) m.where.push_back(r.s);
  }
  std::sort(m.where.begin(), m.where.end());
  m.where.erase(std::unique(m.where.begin(), m.where.end()), m.where.end());
  return m;
}

GradFit fit_gradients(const Problem& p, const GradResult& model, const LaunchOutcome& out, const KernelGrads& exact) {
  GradFit r;
  compare_gradients(p, model, out.dq.data(), out.dk.data(), out.dv.data(), r.got);
  compare_gradients(p, model, exact.dq.data(), exact.dk.data(), exact.dv.data(), r.sep);
  return r;
}

void add_row_backward(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t i, int64_t first,
                      int64_t last, double lse, const double* o_row, GradResult& g) {
  auto at = [](int64_t x) { return static_cast<size_t>(x); };
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const float* qi = &t.q[at(q_index(p, b, i, h, 0))];
  const float* gi = &t.dout[at(o_index(p, b, i, h, 0))];
  double delta = 0;
  for (int64_t d = 0; d < p.head_dim_v; ++d) delta += double{gi[d]} * o_row[d];
  for (int64_t j = first; j < last; ++j) {
    const float* kj = &t.k[at(k_index(p, b, j, hk, 0))];
    const float* vj = &t.v[at(v_index(p, b, j, hk, 0))];
    double s = 0, dp = 0;
    for (int64_t d = 0; d < p.head_dim; ++d) s += double{qi[d]} * kj[d];
    for (int64_t d = 0; d < p.head_dim_v; ++d) dp += double{gi[d]} * vj[d];
    const double P = std::exp(double{p.scale} * s - lse), dS = P * (dp - delta);
    for (int64_t d = 0; d < p.head_dim; ++d) {
      g.dq[g.dq_at(b, i, h, d)] += p.scale * dS * kj[d];
      g.dk[g.dk_at(b, j, hk, d)] += p.scale * dS * qi[d];
    }
    for (int64_t d = 0; d < p.head_dim_v; ++d) g.dv[g.dv_at(b, j, hk, d)] += P * gi[d];
  }
}

KernelGrads as_written(const Problem& p, const GradResult& g, const LaunchOutcome& like) {
  KernelGrads k{std::vector<float>(like.dq.size()), std::vector<float>(like.dk.size()),
                std::vector<float>(like.dv.size())};
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          k.dq[static_cast<size_t>(q_index(p, b, s, h, d))] = static_cast<float>(g.dq[g.dq_at(b, s, h, d)]);
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          k.dk[static_cast<size_t>(k_index(p, b, j, h, d))] = static_cast<float>(g.dk[g.dk_at(b, j, h, d)]);
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          k.dv[static_cast<size_t>(v_index(p, b, j, h, d))] = static_cast<float>(g.dv[g.dv_at(b, j, h, d)]);
      }
  }
  return k;
}

CheckResult judge(const Problem& p, const OracleResult& ex, const LaunchOutcome& out) {
  CheckResult r;
  CompareOptions co;
  co.worst = 1;
  if (out.o.empty()) {
    r.verdict = Verdict::kFail;
    return r;
  }
  compare_output(p, ex, out.o.data(), out.lse.empty() ? nullptr : out.lse.data(), r, co);
  return r;
}

std::string ranges(const std::vector<int64_t>& v, size_t max_items) {
  std::string out;
  size_t items = 0;
  for (size_t i = 0; i < v.size();) {
    size_t e = i;
    while (e + 1 < v.size() && v[e + 1] == v[e] + 1) ++e;
    if (items == max_items) {
      out += ", ...";
      break;
    }
    if (!out.empty()) out += ", ";
    out += std::to_string(v[i]);
    if (e > i) out += "-" + std::to_string(v[e]);
    ++items;
    i = e + 1;
  }
  return out;
}

bool worst_row(const CheckResult& r, int64_t& b, int64_t& h, int64_t& s) {
  if (r.worst.empty()) return false;
  const ElementReport& w = r.worst.front();
  b = w.b, h = w.h, s = w.s;
  return true;
}

std::vector<RowFailure> row_failures(const Context& c) {
  std::vector<RowFailure> rows;
  const Problem& p = c.problem();
  const LaunchOutcome& out = c.original();
  if (out.o.empty()) return rows;
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const RowInfo& ri = ex.row(b, h, s);
        if (!ri.computed || !ri.inside_contract()) continue;
        RowFailure f{{b, h, s}, ri.kind};
        bool zero = true;
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t e = ex.o_at(b, s, h, d);
          const float g = out.o[static_cast<size_t>(o_index(p, b, s, h, d))];
          const ElementJudgement jd = judge_element(ex.o[e], g, ex.o_bound[e]);
          f.o_bad |= jd.fail;
          f.o_nonfinite |= jd.nonfinite_mismatch;
          zero &= g == 0.0f;
        }
        bool lse_empty = true;
        if (!out.lse.empty()) {
          const size_t e = ex.lse_at(b, h, s);
          const float g = out.lse[static_cast<size_t>(lse_index(p, b, h, s))];
          const ElementJudgement jd = judge_element(ex.lse[e], g, ex.lse_bound[e]);
          f.lse_bad = jd.fail;
          f.lse_nonfinite = jd.nonfinite_mismatch;
          lse_empty = std::isinf(g) && g < 0;
        }
        f.written_empty = zero && lse_empty;
        if (f.o_bad || f.lse_bad) rows.push_back(f);
      }
  return rows;
}

std::vector<RowKey> failing_rows(const Context& c, bool nonfinite_only) {
  // A NaN/Inf mismatch always fails (judge_element), so row_failures() holds every row either filter wants.
  std::vector<RowKey> rows;
  for (const RowFailure& f : row_failures(c))
    if (nonfinite_only ? f.o_nonfinite || f.lse_nonfinite : f.o_bad || f.lse_bad) rows.push_back(f.key);
  return rows;
}

std::string row_kinds_text(const std::vector<RowFailure>& rows) {
  int64_t empty_wrong = 0, nan_wrong = 0, as_empty = 0, o_nonfinite = 0, o_far = 0, lse_only = 0;
  for (const RowFailure& r : rows) {
    if (r.kind == RowKind::kFullyMasked)
      ++empty_wrong;
    else if (r.kind == RowKind::kNaN)
      ++nan_wrong;
    else if (r.written_empty)
      ++as_empty;
    else if (r.o_nonfinite)
      ++o_nonfinite;
    else if (r.o_bad)
      ++o_far;
    else
      ++lse_only;
  }
  std::string out = fmt("%zu failing (b, h, row)s:", rows.size());
  std::string sep = " ";
  auto add = [&](int64_t n, const char* what) {
    if (!n) return;
    out += sep + fmt("%lld ", (long long)n) + what;
    sep = ", ";
  };
  add(empty_wrong, "empty row(s) (no key of positive weight) not O = 0 / LSE = -inf");
  add(nan_wrong, "NaN row(s) (exact O is NaN) not NaN");
  add(as_empty, "row(s) with keys written as empty (O = 0, LSE = -inf)");
  add(o_nonfinite, "row(s) with keys and NaN/Inf in O where the exact O is finite (or the reverse)");
  add(o_far, "row(s) with keys and finite O beyond the bound");
  add(lse_only, "row(s) with keys, O within bound and LSE beyond it");
  return out;
}

int run_command(const std::string& command, double timeout_s, std::string& output) {
  output.clear();
  int fds[2];
  if (pipe(fds) != 0) return -1;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: a timeout kills the whole tree
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  const auto t0 = std::chrono::steady_clock::now();
  char buf[4096];
  bool timed_out = false;
  for (;;) {
    const double left =
        timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (left <= 0) {
      timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int pr = poll(&pfd, 1, static_cast<int>(std::min(left * 1000, 1000.0)) + 1);
    if (pr < 0 && errno != EINTR) break;
    if (pr <= 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    if (output.size() < (64u << 20)) output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (timed_out) return 124;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string case_file(Context& c) {
  if (!c.case_file.empty()) return c.case_file;
  namespace fs = std::filesystem;
  fs::path dir;
  if (!c.co.work_dir.empty()) {
    dir = c.co.work_dir;
    fs::create_directories(dir);
  } else {
    std::string tmpl = (fs::temp_directory_path() / "attnfuzz-classify-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) return {};
    dir = tmpl;
  }
  CorpusFile cf;
  cf.tool.name = "attn-check";
  cf.tool.command = "classify: " + std::string(c.k.kernel.name);
  cf.the_case = c.pc.the_case();
  const fs::path path = dir / ("classify-" + case_hash(cf) + kCaseFileExtension);
  try {
    write_corpus_file(path, cf);
  } catch (const std::exception&) {
    return {};
  }
  c.case_file = path.string();
  return c.case_file;
}

}  // namespace attnfuzz::detect
