// metamorphic.cpp - the property bodies (oracle, key permutation / shift, causal prefix, row independence,
// batch-head, determinism, packing) and check_property, their dispatch.
#include <rapidcheck.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/problem.h"
#include "check/fit.h"
#include "check/runner.h"
#include "check/sequences.h"
#include "oracle/oracle.h"
#include "properties/relations.h"

namespace attnfuzz::props {

using namespace detail;

namespace {

void prop_oracle(const KernelEntry& k, const Case& c) {
  PreparedCase pc(c);
  const Judged j = check_case(*devices().forward, k, pc, devices().run);
  const CheckResult& r = j.result;
  RC_TAG(verdict_name(r.verdict));
  if (r.verdict == Verdict::kUnsupported) ++g_unsupported;
  if (r.verdict == Verdict::kFail) {
    const std::string why = std::string("verdict fail [") + failure_class_name(r.failure) + "]: " + r.reason +
                            " (max ratio " + fmt(r.max_ratio) + ", " + std::to_string(r.failed) +
                            " element(s))";
    record(why, {{"A", c}});
    RC_FAIL(why);
  }
}

// Keys grouped by the rows that see them (an interval of rows: first, last; (-1, -1) for none).
std::vector<std::vector<int64_t>> visibility_groups(const Problem& p) {
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> g;
  for (int64_t j = 0; j < p.seq_k; ++j) {
    int64_t first = -1, last = -1;
    for (int64_t i = 0; i < p.seq_q; ++i)
      if (visible(p, i, j)) {
        if (first < 0) first = i;
        last = i;
      }
    g[{first, last}].push_back(j);
  }
  std::vector<std::vector<int64_t>> out;
  for (auto& [key, keys] : g) out.push_back(std::move(keys));
  return out;
}

void prop_key_permutation(const KernelEntry& k, const Case& c) {
  const Problem& p = c.problem;
  if (!supported(k, p)) return;
  const bool reverse = *element_of(std::vector<bool>{true, false});
  const uint64_t perm_seed = static_cast<uint64_t>(*in_range(0, (1 << 20) - 1));
  // perm[j] = the key of A that lands at position j of B.
  std::vector<int64_t> perm(static_cast<size_t>(p.seq_k));
  Rng rng(perm_seed, 11);
  for (auto& grp : visibility_groups(p)) {
    std::vector<int64_t> src = grp;
    if (reverse) {
      std::reverse(src.begin(), src.end());
    } else {
      for (size_t i = src.size(); i > 1; --i) std::swap(src[i - 1], src[rng.below(i)]);
    }
    for (size_t i = 0; i < grp.size(); ++i) perm[grp[i]] = src[i];
  }
  RC_TAG(reverse ? "reverse" : "shuffle");
  const Tensors t = generate(c);
  std::vector<float> kp = t.k, vp = t.v;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_kv; ++h)
      for (int64_t j = 0; j < p.seq_k; ++j) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          kp[k_index(p, b, j, h, d)] = t.k[k_index(p, b, perm[j], h, d)];
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          vp[v_index(p, b, j, h, d)] = t.v[v_index(p, b, perm[j], h, d)];
      }
  const Case b =
      with_values(c, t.q, kp, vp, std::string("key-permutation-") + (reverse ? "reverse" : "shuffle"));
  if (!has_backward(c.pass)) {
    assert_relation(k, c, b, identity_rows(p, {}), false, true, "keys and values permuted together");
    return;
  }
  // Backward: dQ is unchanged and dK / dV rows move with their keys (dK_B[j] = dK_A[perm[j]]), each within
  // the two gradient bounds (elements either oracle did not compute are not judged).
  const std::vector<std::pair<std::string, Case>> cases{{"A", c}, {"B", b}};
  PreparedCase pa(c), pb(b);
  Device& dev = *devices().forward;
  const LaunchOutcome oa = launch_for_pass(dev, k, pa, pa.tensors(), devices().run);
  const LaunchOutcome ob = launch_for_pass(dev, k, pb, pb.tensors(), devices().run);
  for (const auto* o : {&oa, &ob})
    if (o->launch.status != LaunchStatus::kOk || o->dq.empty()) {
      const std::string why =
          "backward launch: " + std::string(launch_status_name(o->launch.status)) + " " + o->launch.message;
      record(why, cases);
      RC_FAIL(why);
    }
  const GradResult ga = grad_oracle_for(pa, oa, devices().run);
  const GradResult gb = grad_oracle_for(pb, ob, devices().run);
  if (!ga.inside_contract || !gb.inside_contract) return;
  std::string why;
  auto check = [&](const char* name, float x, float y, double ba, double bb, const std::string& where) {
    std::string w;
    if (why.empty() && !std::isnan(ba) && !std::isnan(bb) && !agree(x, y, ba + bb, false, w))
      why = std::string(name) + where + ": " + w;
  };
  for (int64_t bb = 0; bb < p.batch && why.empty(); ++bb) {
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          check("dQ", oa.dq[q_index(p, bb, s, h, d)], ob.dq[q_index(p, bb, s, h, d)],
                ga.dq_bound[ga.dq_at(bb, s, h, d)], gb.dq_bound[gb.dq_at(bb, s, h, d)],
                fmt_where(bb, s, h, d));
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        const int64_t ja = perm[j];
        for (int64_t d = 0; d < p.head_dim; ++d)
          check("dK", oa.dk[k_index(p, bb, ja, h, d)], ob.dk[k_index(p, bb, j, h, d)],
                ga.dk_bound[ga.dk_at(bb, ja, h, d)], gb.dk_bound[gb.dk_at(bb, j, h, d)],
                fmt_where(bb, ja, h, d) + " (B's key " + std::to_string(j) + ")");
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          check("dV", oa.dv[v_index(p, bb, ja, h, d)], ob.dv[v_index(p, bb, j, h, d)],
                ga.dv_bound[ga.dv_at(bb, ja, h, d)], gb.dv_bound[gb.dv_at(bb, j, h, d)],
                fmt_where(bb, ja, h, d) + " (B's key " + std::to_string(j) + ")");
      }
  }
  if (!why.empty()) {
    why = "keys and values permuted together, gradients: " + why;
    record(why, cases);
    RC_FAIL(why);
  }
}

void prop_key_shift(const KernelEntry& k, const Case& c) {
  const Problem& p = c.problem;
  if (!supported(k, p)) return;
  // n_d in [-16, 16], drawn as 0, -1, 1, -2, 2, ... so that it shrinks toward 0.
  const auto zigzag = rc::gen::map(in_range(0, 32), [](int64_t i) { return i % 2 ? -(i + 1) / 2 : i / 2; });
  const std::vector<int64_t> n =
      *rc::gen::container<std::vector<int64_t>>(static_cast<size_t>(p.head_dim), zigzag);
  const Tensors t = generate(c);
  // Per (b, kv head, d) column: E with every finite |k| < 2^E; k rounded to the grid 2^(E-22); c_d =
  // n_d 2^(E-4). Then |k + c_d| < 2^(E+1) is a multiple of 2^(E-22): exact in fp32 (24-bit significand).
  // Columns holding |k| >= 2^60 (FLT_MAX specials) get c_d = 0, as an exact shift cannot exist there.
  std::vector<float> ka = t.k, kb = t.k;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_kv; ++h)
      for (int64_t d = 0; d < p.head_dim; ++d) {
        float m = 0;
        for (int64_t j = 0; j < p.seq_k; ++j) {
          const float x = t.k[k_index(p, b, j, h, d)];
          if (std::isfinite(x)) m = std::max(m, std::fabs(x));
        }
        const int e = m > 0 ? std::ilogb(m) + 1 : 0;
        if (e > 60) continue;
        const double grid = std::ldexp(1.0, e - 22), shift = std::ldexp(static_cast<double>(n[d]), e - 4);
        for (int64_t j = 0; j < p.seq_k; ++j) {
          const size_t at = static_cast<size_t>(k_index(p, b, j, h, d));
          const float x = t.k[at];
          if (!std::isfinite(x)) {
            kb[at] = x;  // +-Inf + c = +-Inf, NaN stays NaN
            continue;
          }
          const double q = std::nearbyint(x / grid) * grid;
          ka[at] = static_cast<float>(q);
          kb[at] = static_cast<float>(q + shift);
          if (static_cast<double>(kb[at]) != q + shift) throw std::logic_error("key-shift: inexact shift");
        }
      }
  const Case a = with_values(c, t.q, ka, t.v, "key-shift-A");
  const Case b = with_values(c, t.q, kb, t.v, "key-shift-B");
  // Only rows whose q is finite: there every score moves by the finite scale * q.c. With an infinite q_d the
  // "shift" is infinite and can flip a score from -inf to +inf (the exact results then differ).
  std::vector<RowPair> rows;
  for (int64_t bb = 0; bb < p.batch; ++bb)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        bool finite = true;
        for (int64_t d = 0; d < p.head_dim && finite; ++d)
          finite = std::isfinite(t.q[q_index(p, bb, s, h, d)]);
        if (finite) rows.push_back({bb, h, s, bb, h, s});
      }
  assert_relation(k, a, b, rows, false, false, "the same vector added to every key");
}

void prop_causal_prefix(const KernelEntry& k, const Case& c, bool strict) {
  const Problem& p = c.problem;
  if (!supported(k, p)) return;
  int64_t row = *in_range(0, p.seq_q - 1);
  auto hidden_of = [&](int64_t i) {
    std::vector<bool> h(static_cast<size_t>(p.seq_k), true);
    const KeyRange r = visible_keys(p, i);
    for (int64_t j = std::max<int64_t>(0, r.first); j < std::min(p.seq_k, r.last); ++j) h[j] = false;
    return h;
  };
  auto count = [](const std::vector<bool>& v) { return std::count(v.begin(), v.end(), true); };
  std::vector<bool> hidden = hidden_of(row);
  if (count(hidden) == 0)  // the chosen row sees every key: take the row that sees fewest
    for (int64_t i = 0; i < p.seq_q; ++i)
      if (count(hidden_of(i)) > count(hidden)) row = i, hidden = hidden_of(i);
  if (count(hidden) == 0) {
    RC_TAG("vacuous: every row sees every key");
    return;
  }
  // The rows that see none of the changed keys (row is one of them).
  std::vector<bool> keep(static_cast<size_t>(p.seq_q), false);
  for (int64_t i = 0; i < p.seq_q; ++i) {
    const KeyRange r = visible_keys(p, i);
    bool sees = false;
    for (int64_t j = std::max<int64_t>(0, r.first); j < std::min(p.seq_k, r.last) && !sees; ++j)
      sees = hidden[j];
    keep[i] = !sees;
  }
  const std::vector<Fill> fills =
      in_domain(c, {Fill::kFresh, Fill::kFreshLarge, Fill::kNaN, Fill::kPosInf, Fill::kNegInf, Fill::kHuge});
  const Fill kf = *element_of(fills), vf = *element_of(fills);
  RC_TAG(std::string("k ") + fill_name(kf), std::string("v ") + fill_name(vf));
  const Tensors t = generate(c);
  std::vector<float> kb = t.k, vb = t.v;
  Rng rng(c.seed, 21);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_kv; ++h)
      for (int64_t j = 0; j < p.seq_k; ++j) {
        if (!hidden[j]) continue;
        for (int64_t d = 0; d < p.head_dim; ++d) kb[k_index(p, b, j, h, d)] = fill_value(kf, rng);
        for (int64_t d = 0; d < p.head_dim_v; ++d) vb[v_index(p, b, j, h, d)] = fill_value(vf, rng);
      }
  const Case b =
      with_values(c, t.q, kb, vb, std::string("causal-prefix-k-") + fill_name(kf) + "-v-" + fill_name(vf));
  assert_relation(k, c, b, identity_rows(p, keep), strict, true,
                  "keys/values hidden from row " + std::to_string(row) + " changed (k " + fill_name(kf) +
                      ", v " + fill_name(vf) + ")");
}

void prop_row_independence(const KernelEntry& k, const Case& c, bool strict) {
  const Problem& p = c.problem;
  if (!supported(k, p)) return;
  const int64_t row = *in_range(0, p.seq_q - 1);
  const int pattern = *in_range(0, 2);  // 0: keep only row; 1: keep rows of row's parity; 2: random half
  const Fill f = *element_of(
      in_domain(c, {Fill::kFresh, Fill::kFreshLarge, Fill::kNaN, Fill::kPosInf, Fill::kHuge, Fill::kZero}));
  RC_TAG(fill_name(f));
  Rng rng(c.seed, 31);
  std::vector<bool> keep(static_cast<size_t>(p.seq_q));
  for (int64_t i = 0; i < p.seq_q; ++i)
    keep[i] = i == row || (pattern == 1 && (i - row) % 2 == 0) || (pattern == 2 && rng.below(2));
  const Tensors t = generate(c);
  std::vector<float> qb = t.q;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seq_q; ++i)
      if (!keep[i])
        for (int64_t h = 0; h < p.heads_q; ++h)
          for (int64_t d = 0; d < p.head_dim; ++d) qb[q_index(p, b, i, h, d)] = fill_value(f, rng);
  const Case b = with_values(c, qb, t.k, t.v, std::string("row-independence-") + fill_name(f));
  assert_relation(k, c, b, identity_rows(p, keep), strict, true,
                  std::string("other query rows changed (") + fill_name(f) + ")");
}

// Backward batch / head consistency. For every (b, h) one single-head problem (B = Hq = Hkv = 1, the same
// mask and scale; q[b,:,h], dO[b,:,h], k and v of h's kv head): its dQ equals the batched dQ[b,:,h], and for
// every kv head hk the sum over hk's query heads of their single-head dK / dV equals the batched dK / dV
// [b,:,hk] (the exact GQA gradient is that sum). Tolerance: bound(batched) + the sum of the singles' bounds;
// bitwise under strict for dQ and, for groups of one query head, dK / dV. Fwd+bwd also relates O and LSE.
void prop_batch_head_bwd(const KernelEntry& k, const Case& c, bool strict) {
  const Problem& p = c.problem;
  const RunOptions& run = devices().run;
  Device& dev = *devices().forward;
  PreparedCase pa(c);
  const Tensors& ta = pa.tensors();
  const LaunchOutcome oa = launch_for_pass(dev, k, pa, ta, run);
  auto launched = [&](const LaunchOutcome& o, const std::string& role,
                      const std::vector<std::pair<std::string, Case>>& cases) {
    if (o.launch.status == LaunchStatus::kOk && !o.dq.empty()) return;
    const std::string why = "backward launch of case " + role + ": " + launch_status_name(o.launch.status) +
                            " " + o.launch.message;
    record(why, cases);
    RC_FAIL(why);
  };
  launched(oa, "batched", {{"batched", c}});
  const GradResult ga = grad_oracle_for(pa, oa, run);
  const int64_t group = p.heads_q / p.heads_kv;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      // Sums over the group's single-head runs (double), their bounds, and whether every member was judged.
      // The sums start at -0, the identity of IEEE addition (+0 would turn a single -0 into +0, which
      // --strict reads as a different bit pattern).
      std::vector<double> sk(static_cast<size_t>(p.seq_k * p.head_dim), -0.0), skb(sk.size());
      std::vector<double> sv(static_cast<size_t>(p.seq_k * p.head_dim_v), -0.0), svb(sv.size());
      bool complete = ga.inside_contract;
      std::vector<std::pair<std::string, Case>> cases{{"batched", c}};
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        Case one = c;
        Problem& p1 = one.problem;
        p1 = reshape_problem(p, 1, 1, 1, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v);  // one (b, h) slice
        one.values.specials.clear();
        std::vector<float> q(static_cast<size_t>(q_elements(p1))), kk(static_cast<size_t>(k_elements(p1))),
            v(static_cast<size_t>(v_elements(p1))), dout(static_cast<size_t>(o_elements(p1)));
        for (int64_t s = 0; s < p.seq_q; ++s) {
          for (int64_t d = 0; d < p.head_dim; ++d) q[q_index(p1, 0, s, 0, d)] = ta.q[q_index(p, b, s, h, d)];
          for (int64_t d = 0; d < p.head_dim_v; ++d)
            dout[o_index(p1, 0, s, 0, d)] = ta.dout[o_index(p, b, s, h, d)];
        }
        for (int64_t j = 0; j < p.seq_k; ++j) {
          for (int64_t d = 0; d < p.head_dim; ++d)
            kk[k_index(p1, 0, j, 0, d)] = ta.k[k_index(p, b, j, hk, d)];
          for (int64_t d = 0; d < p.head_dim_v; ++d)
            v[v_index(p1, 0, j, 0, d)] = ta.v[v_index(p, b, j, hk, d)];
        }
        one = with_values(one, q, kk, v, "batch-head-b" + std::to_string(b) + "-h" + std::to_string(h));
        one.explicit_values->dout = std::move(dout);
        if (!supported(k, p1)) {
          complete = false;
          continue;
        }
        cases.resize(1);
        cases.push_back({"single", one});
        PreparedCase p1c(one);
        const LaunchOutcome o1 = launch_for_pass(dev, k, p1c, p1c.tensors(), run);
        launched(o1, "single", cases);
        std::string why;
        if (c.pass == Pass::kFwdBwd) {  // the forward outputs that fed the backward launches
          const Run ra{ta, oa, pa.oracle(run.oracle)}, r1{p1c.tensors(), o1, p1c.oracle(run.oracle)};
          std::vector<RowPair> rows;
          for (int64_t s = 0; s < p.seq_q; ++s) rows.push_back({b, h, s, 0, 0, s});
          if (!relate(p, ra, p1, r1, rows, strict, true, why)) why = "forward " + why;
        }
        const GradResult g1 = grad_oracle_for(p1c, o1, run);
        complete = complete && g1.inside_contract;
        std::string w;
        auto judged = [](double x, double y) { return !std::isnan(x) && !std::isnan(y); };
        if (ga.inside_contract && g1.inside_contract)
          for (int64_t s = 0; s < p.seq_q && why.empty(); ++s)
            for (int64_t d = 0; d < p.head_dim && why.empty(); ++d) {
              const double ba = ga.dq_bound[ga.dq_at(b, s, h, d)], b1 = g1.dq_bound[g1.dq_at(0, s, 0, d)];
              if (judged(ba, b1) &&
                  !agree(oa.dq[q_index(p, b, s, h, d)], o1.dq[q_index(p1, 0, s, 0, d)], ba + b1, strict, w))
                why = "dQ" + fmt_where(b, s, h, d) + ": " + w;
            }
        if (!why.empty()) {
          why = "batched run vs single-head run of (b=" + std::to_string(b) + ", h=" + std::to_string(h) +
                "): " + why;
          record(why, cases);
          RC_FAIL(why);
        }
        for (int64_t j = 0; j < p.seq_k; ++j) {
          for (int64_t d = 0; d < p.head_dim; ++d) {
            const size_t at = static_cast<size_t>(j * p.head_dim + d);
            sk[at] += o1.dk[k_index(p1, 0, j, 0, d)];
            skb[at] += g1.dk_bound[g1.dk_at(0, j, 0, d)];
          }
          for (int64_t d = 0; d < p.head_dim_v; ++d) {
            const size_t at = static_cast<size_t>(j * p.head_dim_v + d);
            sv[at] += o1.dv[v_index(p1, 0, j, 0, d)];
            svb[at] += g1.dv_bound[g1.dv_at(0, j, 0, d)];
          }
        }
      }
      if (!complete) continue;
      // The group's dK / dV against the sums of its single-head runs.
      std::string why;
      const bool bitwise = strict && group == 1;
      for (int64_t j = 0; j < p.seq_k && why.empty(); ++j) {
        for (int64_t d = 0; d < p.head_dim && why.empty(); ++d) {
          const size_t at = static_cast<size_t>(j * p.head_dim + d);
          const double ba = ga.dk_bound[ga.dk_at(b, j, hk, d)];
          std::string w;
          if (!std::isnan(ba) && !std::isnan(skb[at]) &&
              !agree(oa.dk[k_index(p, b, j, hk, d)], sk[at], ba + skb[at], bitwise, w))
            why = "dK" + fmt_where(b, j, hk, d) + ": " + w;
        }
        for (int64_t d = 0; d < p.head_dim_v && why.empty(); ++d) {
          const size_t at = static_cast<size_t>(j * p.head_dim_v + d);
          const double ba = ga.dv_bound[ga.dv_at(b, j, hk, d)];
          std::string w;
          if (!std::isnan(ba) && !std::isnan(svb[at]) &&
              !agree(oa.dv[v_index(p, b, j, hk, d)], sv[at], ba + svb[at], bitwise, w))
            why = "dV" + fmt_where(b, j, hk, d) + ": " + w;
        }
      }
      if (!why.empty()) {
        why = "batched run vs the sum of the single-head runs of kv head (b=" + std::to_string(b) +
              ", hkv=" + std::to_string(hk) + ", query heads " + std::to_string(hk * group) + ".." +
              std::to_string((hk + 1) * group - 1) + "): " + why;
        record(why, cases);  // the batched case and the group's last single-head case
        RC_FAIL(why);
      }
    }
}

void prop_batch_head(const KernelEntry& k, const Case& c, bool strict) {
  const Problem& p = c.problem;
  if (!supported(k, p)) return;
  if (has_backward(c.pass)) return prop_batch_head_bwd(k, c, strict);
  Device& dev = *devices().forward;
  const Run ra = run_case(k, c, dev);
  require_launched(ra, "batched", {{"batched", c}});
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      Case one = c;
      Problem& p1 = one.problem;
      p1 = reshape_problem(p, 1, 1, 1, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v);  // one (b, h) slice
      one.values.specials.clear();
      std::vector<float> q(static_cast<size_t>(q_elements(p1))), kk(static_cast<size_t>(k_elements(p1))),
          v(static_cast<size_t>(v_elements(p1)));
      const int64_t hk = kv_head(p, h);
      for (int64_t s = 0; s < p.seq_q; ++s)
        for (int64_t d = 0; d < p.head_dim; ++d) q[q_index(p1, 0, s, 0, d)] = ra.t.q[q_index(p, b, s, h, d)];
      for (int64_t j = 0; j < p.seq_k; ++j) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          kk[k_index(p1, 0, j, 0, d)] = ra.t.k[k_index(p, b, j, hk, d)];
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          v[v_index(p1, 0, j, 0, d)] = ra.t.v[v_index(p, b, j, hk, d)];
      }
      one = with_values(one, q, kk, v, "batch-head-b" + std::to_string(b) + "-h" + std::to_string(h));
      if (!supported(k, p1)) continue;
      const std::vector<std::pair<std::string, Case>> cases{{"batched", c}, {"single", one}};
      const Run r1 = run_case(k, one, dev);
      require_launched(r1, "single", cases);
      std::vector<RowPair> rows;
      for (int64_t s = 0; s < p.seq_q; ++s) rows.push_back({b, h, s, 0, 0, s});
      std::string why;
      if (!relate(p, ra, p1, r1, rows, strict, true, why)) {
        why = "batched run vs single-head run of (b=" + std::to_string(b) + ", h=" + std::to_string(h) +
              "): " + why;
        record(why, cases);
        RC_FAIL(why);
      }
    }
}

void prop_determinism(const KernelEntry& k, const Case& c) {
  const Problem& p = c.problem;
  if (!supported(k, p)) return;
  const uint64_t order_seed = static_cast<uint64_t>(*in_range(1, 1 << 16));
  Devices& ds = devices();
  DeviceOptions so = ds.shuffle->options();
  so.order_seed = order_seed;
  ds.shuffle->set_options(so);
  const Run base = run_case(k, c, *ds.forward, false);
  require_launched(base, "A (forward order)", {{"A", c}});
  struct Other {
    Device* dev;
    ThreadOrder order;
    std::string flags;
  };
  for (const Other& o : {Other{ds.reverse.get(), ThreadOrder::kReverse, " --order reverse"},
                         Other{ds.shuffle.get(), ThreadOrder::kShuffle,
                               " --order shuffle --order-seed " + std::to_string(order_seed)}}) {
    const Run r = run_case(k, c, *o.dev, false);
    std::string why;
    if (r.out.launch.status != LaunchStatus::kOk) {
      why = std::string("launch in ") + thread_order_name(o.order) +
            " order: " + launch_status_name(r.out.launch.status) + " " + r.out.launch.message;
    } else {
      auto diff = [&](const std::vector<float>& x, const std::vector<float>& y, const char* what) {
        if (x.size() != y.size()) return std::string(what) + " size differs";
        for (size_t i = 0; i < x.size(); ++i)
          if (std::memcmp(&x[i], &y[i], 4) != 0)
            return std::string(what) + " element " + std::to_string(i) + ": forward " + fmt(x[i]) + " vs " +
                   thread_order_name(o.order) + " " + fmt(y[i]);
        return std::string();
      };
      why = diff(base.out.o, r.out.o, "O");
      if (why.empty()) why = diff(base.out.lse, r.out.lse, "LSE");
      if (why.empty()) why = diff(base.out.dq, r.out.dq, "dQ");
      if (why.empty()) why = diff(base.out.dk, r.out.dk, "dK");
      if (why.empty()) why = diff(base.out.dv, r.out.dv, "dV");
    }
    if (!why.empty()) {
      why = "thread order changes the bits: " + why;
      record(why, {{"A", c}}, o.flags, o.order, order_seed);
      RC_FAIL(why);
    }
  }
}

}  // namespace

// Packing (issue 15): sequence b of a sequence-layout batch, run alone as a batch of one in the same layout
// with the same values, gives the same rows.
void prop_packing(const KernelEntry& k, const Case& c, bool strict) {
  const Problem& p = c.problem;
  if (!has_sequences(p) || !supported(k, p)) return;
  Device& dev = *devices().forward;
  auto run_seq = [&](const Case& x) {  // outputs and oracle in the dense view
    Run r;
    r.t = generate(x);
    r.out = launch_guarded(dev, k, x.problem, r.t, devices().run);
    if (r.out.launch.status == LaunchStatus::kOk)
      r.exact = sequence_oracle(x.problem, r.t, devices().run.oracle);
    return r;
  };
  const Run ra = run_seq(c);
  require_launched(ra, "batch", {{"batch", c}});
  const Problem wa = dense_view(p, ra.t);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t sq = seq_len_q(p, ra.t, b), sk = seq_len_k(p, ra.t, b);
    if (sq == 0) continue;
    Case one = c;
    one.problem.batch = 1;
    one.values.specials.clear();
    one.explicit_values.reset();
    for (auto* v : {&one.seqs.q, &one.seqs.k, &one.seqs.used})
      if (!v->empty()) *v = {(*v)[static_cast<size_t>(b)]};
    if (!set_sequence_fields(one).empty()) continue;
    Tensors ot = generate(one);  // the layout and its arrays; the values are sequence b's
    const Problem& po = one.problem;
    for (int64_t s = 0; s < sq; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          ot.q[q_offset(po, ot, 0, s, h, d)] = ra.t.q[q_offset(p, ra.t, b, s, h, d)];
    for (int64_t s = 0; s < sk; ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          ot.k[k_offset(po, ot, 0, s, h, d)] = ra.t.k[k_offset(p, ra.t, b, s, h, d)];
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          ot.v[v_offset(po, ot, 0, s, h, d)] = ra.t.v[v_offset(p, ra.t, b, s, h, d)];
      }
    one = with_values(one, ot.q, ot.k, ot.v, "packing-sequence-" + std::to_string(b));
    if (!supported(k, po)) continue;
    const std::vector<std::pair<std::string, Case>> cases{{"batch", c}, {"alone", one}};
    const Run rb = run_seq(one);
    require_launched(rb, "alone", cases);
    std::vector<RowPair> rows;
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < sq; ++s) rows.push_back({b, h, s, 0, h, s});
    std::string why;
    if (!relate(wa, ra, dense_view(po, rb.t), rb, rows, strict, true, why)) {
      why = "batch vs sequence " + std::to_string(b) + " alone: " + why;
      record(why, cases);
      RC_FAIL(why);
    }
  }
}

// Score-variant identities (issue 28): one relation per case, among those the case and the kernel allow; with
// per-head fp8 descales (item 6) also k's descales folded into q's, which a kernel reading k's descale at
// another head than the KV head breaks (the folded case has every k descale 1).
void prop_variants(const KernelEntry& k, const Case& c) {
  const Problem& p = c.problem;
  const uint32_t kv = k.kernel.variants;
  Case plain = c;  // the case without its variants
  (void)set_variants(plain, 0);
  plain.variants = VariantSpec{};
  auto without = [&](uint32_t bit) {
    Case x = c;
    (void)set_variants(x, p.variants & ~bit, p.softcap, bias_broadcast(p));
    if (bit == AF_VARIANT_SINK) x.variants.sinks.clear();
    return x;
  };
  std::vector<int> rel;
  if (p.variants & AF_VARIANT_SINK) rel.push_back(0);
  // Softcap 1e30 = none only where no raw score is infinite (cap tanh(-inf / cap) = -cap, a finite score).
  if ((p.variants & AF_VARIANT_SOFTCAP) && c.values.specials.empty()) rel.push_back(1);
  if ((p.variants & AF_VARIANT_ALIBI) && !(p.variants & AF_VARIANT_BIAS) && (kv & AF_VARIANT_BIAS)) rel.push_back(2);
  if (!(p.variants & AF_VARIANT_BIAS) && (kv & AF_VARIANT_BIAS)) rel.push_back(3);
  if (p.variants &
      AF_VARIANT_HEAD_DESCALE) {  // only its own relation (set_variants redraws the per-head strides)
    rel.clear();
    if (!c.variants.q_descale_h.empty() && !c.variants.k_descale_h.empty()) rel.push_back(4);
  }
  if (rel.empty()) return;
  const int r = rel[*index_below(rel.size())];
  std::vector<bool> keep(static_cast<size_t>(p.seq_q), true);
  const std::vector<RowPair> rows = identity_rows(p, keep);
  if (r == 0) {  // every sink -inf = no sink
    Case a = c;
    a.variants.sinks.assign(static_cast<size_t>(p.heads_q), -std::numeric_limits<float>::infinity());
    if (!supported(k, a.problem)) return;
    return assert_relation(k, a, without(AF_VARIANT_SINK), rows, false, true, "sinks of -inf against no sink");
  }
  if (r == 1) {  // softcap 1e30 = no softcap (cap tanh(s / cap) = s (1 - (s / cap)^2 / 3 ...))
    Case a = c;
    a.problem.softcap = 1e30f;
    if (!supported(k, a.problem)) return;
    return assert_relation(k, a, without(AF_VARIANT_SOFTCAP), rows, false, true, "softcap 1e30 against no softcap");
  }
  if (r == 4) {  // per-head fp8 descales: k's folded into q's (q_d[h] k_d[hk], k_d = 1), the same scores
    Case b = c;
    const int64_t group = p.heads_q / p.heads_kv;
    for (int64_t bb = 0; bb < (p.descale_stride[0] ? p.batch : 1); ++bb)
      for (int64_t h = 0; h < p.heads_q; ++h)
        b.variants.q_descale_h[static_cast<size_t>(descale_h_index(p, bb, h))] =
            c.variants.q_descale_h[static_cast<size_t>(descale_h_index(p, bb, h))] *
            c.variants.k_descale_h[static_cast<size_t>(descale_h_index(p, bb, h / group))];
    std::fill(b.variants.k_descale_h.begin(), b.variants.k_descale_h.end(), 1.0f);
    if (!validate(b).empty()) return;  // a product outside the descales' range [2^-16, 2^16]
    return assert_relation(k, c, b, rows, false, true, "k's per-head descales folded into q's (k's all 1)");
  }
  if (r == 2) {  // ALiBi = the bias tensor -slope_h |j - (i + off)| (broadcast over the batch)
    Case b = without(AF_VARIANT_ALIBI);
    if (std::string e = set_variants(b, b.problem.variants | AF_VARIANT_BIAS, b.problem.softcap, "b"); !e.empty())
      throw std::logic_error(e);
    const std::vector<float> slopes = c.variants.alibi_slopes.empty() ? alibi_default_slopes(p.heads_q)
                                                                      : c.variants.alibi_slopes;
    b.variants.bias.assign(static_cast<size_t>(bias_elements(b.problem)), 0.0f);
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t j = 0; j < p.seq_k; ++j)
          b.variants.bias[static_cast<size_t>(bias_index(b.problem, 0, h, i, j))] =
              static_cast<float>(alibi_term(p, slopes[static_cast<size_t>(h)], i, j));
    if (!supported(k, b.problem)) return;
    return assert_relation(k, c, b, rows, false, true, "ALiBi against its bias tensor");
  }
  // A bias constant along each row (c_bhi, broadcast over keys): O unchanged, LSE moves by c_bhi (without a sink:
  // the sink does not move with the scores).
  const Case base = (p.variants & AF_VARIANT_SINK) ? without(AF_VARIANT_SINK) : c;
  Case a = base;
  if (std::string e = set_variants(a, base.problem.variants | AF_VARIANT_BIAS, p.softcap, "j"); !e.empty())
    throw std::logic_error(e);
  a.variants.bias_range = *element_of(std::vector<double>{4, 0.25, 64});
  if (!supported(k, a.problem)) return;
  assert_relation(k, a, base, rows, false, false, "a bias constant along each row against no bias (O only)");
}

// Merged states (issue 29): one relation per case. The base case's key range is cut into 1 .. 4 states; B adds an
// empty state (a repeated cut) or cuts elsewhere, in another state layout and pad.
void prop_merge(const KernelEntry& k, const Case& c) {
  const int64_t sk = c.problem.seq_k;
  auto cuts_of = [sk](int n) {
    std::vector<int64_t> cuts{0};
    for (int i = 1; i < n; ++i) cuts.push_back(*rc::gen::inRange<int64_t>(0, sk + 1));
    cuts.push_back(sk);
    std::sort(cuts.begin(), cuts.end());
    return cuts;
  };
  Case a = c;
  const std::vector<int64_t> cuts = cuts_of(*rc::gen::inRange(1, 5));
  if (std::string e = set_merge(a, cuts); !e.empty() || !validate(a).empty()) return;
  if (!supported(k, a.problem)) return;
  const std::vector<RowPair> rows = identity_rows(a.problem, std::vector<bool>(static_cast<size_t>(c.problem.seq_q), true));
  Case b = c;
  const bool empty = *element_of(std::vector<bool>{true, false});
  std::vector<int64_t> other = cuts;
  if (empty) {
    const size_t i = *index_below(other.size());
    other.insert(other.begin() + static_cast<std::ptrdiff_t>(i), other[i]);
  } else {
    other = cuts_of(*rc::gen::inRange(1, 5));
  }
  std::sort(other.begin(), other.end());
  if (std::string e = set_merge(b, other, {}, *rc::gen::inRange(0, 2), *element_of(std::vector<int64_t>{0, 3}));
      !e.empty() || !validate(b).empty())
    return;
  assert_relation(k, a, b, rows, false, true,
                  empty ? "the states and one more empty state against the states alone" : "the merge at other split points");
}

// Dropout (issue 29): p = 0 against no dropout (within the bounds); the same case twice (bitwise).
void prop_dropout(const KernelEntry& k, const Case& c) {
  const Problem& p = c.problem;
  if (!(p.variants & AF_VARIANT_DROPOUT) || !supported(k, p)) return;
  std::vector<bool> keep(static_cast<size_t>(p.seq_q), true);
  const std::vector<RowPair> rows = identity_rows(p, keep);
  if (*index_below(2) == 0) {
    Case a = c, b = c;
    a.problem.dropout_p = 0;
    b.problem.variants &= ~AF_VARIANT_DROPOUT;
    b.problem.dropout_p = 0;
    if (!supported(k, b.problem)) return;
    return assert_relation(k, a, b, rows, false, true, "dropout p = 0 against no dropout");
  }
  return assert_relation(k, c, c, rows, true, true, "the same dropout seed and offset twice (bitwise)");
}

// Custom-mask identities (issue 28 item 4): one relation per case, among those the kernel's variants allow. Masks of
// the same pattern text and seed are the same pattern (generate_custom_mask draws the same numbers for both kinds).
void prop_masks(const KernelEntry& k, const Case& c) {
  const Problem& p = c.problem;
  const uint32_t kv = k.kernel.variants;
  constexpr uint32_t kCustom = AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS;
  Case plain = c;  // the case without custom masks
  (void)set_mask_variants(plain, 0);
  auto with = [&](const Case& base, uint32_t bits, const std::string& pattern, const std::string& blocks) {
    Case x = base;
    if (std::string e = set_mask_variants(x, bits, pattern, blocks, "", p.block_q ? p.block_q : 16,
                                          p.block_k ? p.block_k : 16);
        !e.empty())
      throw std::logic_error(e);
    return x;
  };
  std::vector<int> rel;
  if (kv & AF_VARIANT_MASK_DENSE) rel.push_back(0);
  // Special values are placed by the case's mask_kind: mask none and causal-br would place them differently.
  if ((kv & AF_VARIANT_MASK_DENSE) && c.values.specials.empty()) rel.push_back(1);
  if ((kv & AF_VARIANT_MASK_DENSE) && (kv & AF_VARIANT_MASK_BITS)) rel.push_back(2);
  if ((kv & AF_VARIANT_BLOCK_SPARSE) && (p.variants & kCustom)) rel.push_back(3), rel.push_back(4);
  if (rel.empty()) return;
  const int r = rel[*index_below(rel.size())];
  std::vector<bool> keep(static_cast<size_t>(p.seq_q), true);
  const std::vector<RowPair> rows = identity_rows(p, keep);
  if (r == 0) {  // a dense mask of ones = no custom mask
    const Case a = with(plain, AF_VARIANT_MASK_DENSE, "ones", "mixed");
    if (!supported(k, a.problem)) return;
    return assert_relation(k, a, plain, rows, false, true, "a dense mask of ones against no custom mask");
  }
  if (r == 1) {  // the causal pattern under mask none = mask causal-br
    Case none = plain;
    (void)parse_mask("none", none.problem);
    const Case a = with(none, AF_VARIANT_MASK_DENSE, "causal", "mixed");
    Case b = none;
    (void)parse_mask("causal-br", b.problem);
    if (!supported(k, a.problem) || !supported(k, b.problem)) return;
    return assert_relation(k, a, b, rows, false, true, "a dense causal pattern against mask causal-br");
  }
  const std::string pattern = (p.variants & kCustom) ? c.variants.mask_pattern : "random:0.5";
  if (r == 2) {  // bits = dense of the same pattern (the block mask, if any, kept)
    const uint32_t blocks = p.variants & AF_VARIANT_BLOCK_SPARSE;
    const Case a = with(plain, AF_VARIANT_MASK_BITS | blocks, pattern, c.variants.block_pattern);
    const Case b = with(plain, AF_VARIANT_MASK_DENSE | blocks, pattern, c.variants.block_pattern);
    if (!supported(k, a.problem) || !supported(k, b.problem)) return;
    return assert_relation(k, a, b, rows, false, true, "the bit-packed mask against the dense mask of its pattern");
  }
  if (r == 3) {  // a block mask of partial blocks = the custom mask alone
    const Case a = with(plain, (p.variants & kCustom) | AF_VARIANT_BLOCK_SPARSE, pattern, "partial");
    const Case b = with(plain, p.variants & kCustom, pattern, "mixed");
    if (!supported(k, a.problem) || !supported(k, b.problem)) return;
    return assert_relation(k, a, b, rows, false, true, "a block mask of partial blocks against the custom mask alone");
  }
  // a block mask of full blocks = no mask at all (a full block never reads the custom mask)
  const Case a = with(plain, (p.variants & kCustom) | AF_VARIANT_BLOCK_SPARSE, pattern, "full");
  if (!supported(k, a.problem)) return;
  assert_relation(k, a, plain, rows, false, true, "a block mask of full blocks against no custom or block mask");
}

// MLA's shared K/V latent (issue 28 item 5): the kv-shared case against the same values with V copied out
// into its own contiguous buffer (explicit q, k, v), bitwise: reading V through K's rows must not change a
// bit. A case the kernel does not take is first fitted to it (check/fit.h: fewer query rows, smaller dims),
// e.g. a decode kernel's 8 rows.
void prop_kv_shared(const KernelEntry& k, const Case& given) {
  if (!kv_shared(given.problem) || has_sequences(given.problem)) return;
  const std::optional<Case> fitted = fit_to_kernel(given, k.kernel);
  if (!fitted || !kv_shared(fitted->problem)) return;
  const Case& c = *fitted;
  const Problem& p = c.problem;
  if (!supported(k, p)) return;
  const Tensors t = generate(c);
  Case b = c;
  b.problem.variants &= ~AF_VARIANT_KV_SHARED;
  set_contiguous_strides(b.problem);
  if (!std::equal(std::begin(p.q_stride), std::end(p.q_stride), std::begin(b.problem.q_stride)) ||
      !std::equal(std::begin(p.k_stride), std::end(p.k_stride), std::begin(b.problem.k_stride)))
    return;  // the generator's cases are contiguous; explicit q and k keep their layout only then
  ExplicitValues e;
  e.q = t.q, e.k = t.k;
  e.v.assign(static_cast<size_t>(v_elements(b.problem)), 0.0f);
  for (int64_t bb = 0; bb < p.batch; ++bb)
    for (int64_t s = 0; s < p.seq_k; ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h)
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          e.v[static_cast<size_t>(v_index(b.problem, bb, s, h, d))] =
              t.k[static_cast<size_t>(k_index(p, bb, s, h, d))];
  b.explicit_values = std::move(e);
  b.values.specials.clear();  // they are in the explicit values
  if (!supported(k, b.problem) || !validate(b).empty()) return;
  std::vector<bool> keep(static_cast<size_t>(p.seq_q), true);
  assert_relation(k, c, b, identity_rows(p, keep), true, true,
                  "V a view of K's rows against V copied out (bitwise)");
}

void check_property(Property p, const KernelEntry& k, const Case& c, bool strict) {
  switch (p) {
    case Property::kKvShared:
      return prop_kv_shared(k, c);
    case Property::kMerge:
      return prop_merge(k, c);
    case Property::kDropout:
      return prop_dropout(k, c);
    case Property::kMasks:
      return prop_masks(k, c);
    case Property::kVariants:
      return prop_variants(k, c);
    case Property::kOracle:
      return prop_oracle(k, c);
    case Property::kKeyPermutation:
      return prop_key_permutation(k, c);
    case Property::kKeyShift:
      return prop_key_shift(k, c);
    case Property::kCausalPrefix:
      return prop_causal_prefix(k, c, strict);
    case Property::kRowIndependence:
      return prop_row_independence(k, c, strict);
    case Property::kBatchHead:
      return prop_batch_head(k, c, strict);
    case Property::kDeterminism:
      return prop_determinism(k, c);
    case Property::kPacking:
      return prop_packing(k, c, strict);
  }
}

}  // namespace attnfuzz::props
