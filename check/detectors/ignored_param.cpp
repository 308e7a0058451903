// ignored_param.cpp - ignored-parameter: the failing output re-judged against the exact result with one of
// the case's score variants switched off (no sink, no softcap, no ALiBi, no bias) or its parameter replaced
// by what a kernel that ignores the given buffer uses instead (ALiBi slopes by the power-of-two rule; a bias
// broadcast over a dimension along which the case's bias has its own values); custom masks: the custom or
// block mask off, a mask row stride replaced; per-head fp8 descales: the per-tensor ones used, head 0's for
// every head, k's read at the query head; kv-shared: V read from K's buffer as its own contiguous tensor. A
// match within the bound names the parameter.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <optional>

#include "check/compare.h"
#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

Problem variant_off(const Problem& p, uint32_t bits) {
  Problem off = p;
  off.variants &= ~bits;
  if (bits & AF_VARIANT_HEAD_DESCALE)
    off.descale_stride[0] = off.descale_stride[1] = 0;  // the per-tensor ones
  return off;
}

namespace {

// One re-judgement: the problem (and inputs) of the exact result the kernel may have computed instead.
struct Probe {
  std::string what;  // "the sink (AF_VARIANT_SINK)": what the kernel ignored
  Problem p;
  std::optional<Tensors> t;  // other variant values (nullopt: the case's)
  // The exact result with bias + ALiBi rounded to the dtype before they are added (OracleOptions::score_add_in_dtype):
  // a kernel that does so without declaring it. Its class is precision: nothing is ignored, a rounding is undeclared.
  bool add_in_dtype = false;
};

bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// Both masks off except on the rows they hide entirely (their lse is -inf: a backward that recomputes P from the given
// lse skips them as empty rows): a dense mask of whole rows, 0 on those rows, 1 elsewhere. Only when such rows exist.
void hidden_rows_probe(const Problem& p, const Tensors& t, std::vector<Probe>& out) {
  Probe pr{"the custom / block mask on every row it does not hide entirely (buffers.custom_mask, buffers.block_mask): "
           "the output is the attention under mask_kind alone with those rows empty",
           p, t};
  pr.p.variants = (p.variants & ~kMaskVariants) | AF_VARIANT_MASK_DENSE;
  if (!set_mask_strides(pr.p, "").empty()) return;
  pr.t->custom_mask.assign(static_cast<size_t>(custom_mask_bytes(pr.p)), 1);
  pr.t->block_mask.clear();
  const VariantInputs in = t.variant_inputs();
  bool any = false;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeyRange kr = visible_keys(p, i);
        bool shown = false;
        for (int64_t j = kr.first; j < kr.last && !shown; ++j) shown = custom_visible(p, in, b, h, i, j);
        if (shown || kr.empty()) continue;
        any = true;
        uint8_t* row = pr.t->custom_mask.data() + b * pr.p.mask_stride[0] + h * pr.p.mask_stride[1] + i * pr.p.mask_stride[2];
        std::fill(row, row + p.seq_k, uint8_t{0});
      }
  if (any) out.push_back(std::move(pr));
}

// Custom masks (docs/semantics.md "Custom masks"): the custom mask off (inside a block-sparse problem: every
// partial block taken as full), the block mask off, and the custom mask's rows read with another row stride
// (the contiguous row length, or floor(Sk / 8) bytes for a bit-packed row of Sk % 8 != 0 keys, 0 below 8
// keys: row 0 for every row).
void mask_probes(const Problem& p, const Tensors& t, std::vector<Probe>& out) {
  constexpr uint32_t kCustom = AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS;
  const bool blocks = p.variants & AF_VARIANT_BLOCK_SPARSE;
  if (p.variants & kCustom) {
    Probe pr{blocks ? "the custom mask inside the partial blocks (buffers.custom_mask): the output matches the block "
                      "mask with every partial block (2) taken as full"
                    : "the custom mask (buffers.custom_mask): the output is the attention under mask_kind alone",
             p, std::nullopt};
    pr.p.variants &= ~kCustom;
    out.push_back(std::move(pr));
  }
  if (blocks) {
    Probe pr{"the block mask (buffers.block_mask): the output is the attention without its empty and full blocks", p,
             std::nullopt};
    pr.p.variants &= ~AF_VARIANT_BLOCK_SPARSE;
    out.push_back(std::move(pr));
  }
  if (blocks && (p.variants & kCustom)) {
    Probe pr{"the custom and the block mask (buffers.custom_mask, buffers.block_mask): the output is the attention "
             "under mask_kind alone",
             p, std::nullopt};
    pr.p.variants &= ~(kCustom | AF_VARIANT_BLOCK_SPARSE);
    out.push_back(std::move(pr));
  }
  hidden_rows_probe(p, t, out);
  if (!(p.variants & kCustom) || p.seq_q < 2 || p.mask_stride[2] == 0 || t.custom_mask.empty()) return;
  const int64_t row = custom_mask_row_bytes(p), given = p.mask_stride[2];
  std::vector<int64_t> wrong;
  if (row != given) wrong.push_back(row);
  // floor(Sk / 8) is 0 below 8 keys: every row reads row 0's byte.
  if ((p.variants & AF_VARIANT_MASK_BITS) && p.seq_k % 8 != 0) wrong.push_back(p.seq_k / 8);
  for (int64_t w : wrong) {
    if (w == given) continue;
    Probe pr{fmt("mask_stride[2] (the custom mask's row stride, %lld bytes): the output matches its rows "
                 "read %lld "
                 "bytes apart%s",
                 (long long)given, (long long)w, w == 0 ? " (row 0's bits for every row)" : ""),
             p, t};
    // The rows a kernel stepping w bytes reads, repacked at the given stride (bytes past the buffer read as 0).
    const std::vector<uint8_t>& in = t.custom_mask;
    std::vector<uint8_t>& m = pr.t->custom_mask;
    for (int64_t b = 0; b < (p.mask_stride[0] ? p.batch : 1); ++b)
      for (int64_t h = 0; h < (p.mask_stride[1] ? p.heads_q : 1); ++h)
        for (int64_t i = 0; i < p.seq_q; ++i)
          for (int64_t x = 0; x < row; ++x) {
            const int64_t base = b * p.mask_stride[0] + h * p.mask_stride[1];
            const int64_t from = base + i * w + x;
            m[static_cast<size_t>(base + i * given + x)] = from < static_cast<int64_t>(in.size()) ? in[from] : 0;
          }
    out.push_back(std::move(pr));
  }
}

// Per-head fp8 descales (AF_VARIANT_HEAD_DESCALE): the arrays ignored (the per-tensor q/k/v_descale used),
// head 0's descales for every head, and k's descale read at query head h mod Hkv instead of its KV head hk.
// k's descale only scales the scores, so the last is the exact result with q's descale q_d[h] k_d[h mod Hkv]
// / k_d[hk].
void head_descale_probes(const Problem& p, const Tensors& t, std::vector<Probe>& out) {
  Probe off{
      "the per-head descales (buffers.q/k/v_descale_h): per-head descale ignored (per-tensor used), the "
      "output "
      "matches the per-tensor q/k/v_descale",
      variant_off(p, AF_VARIANT_HEAD_DESCALE), std::nullopt};
  out.push_back(std::move(off));
  Probe first{
      "the per-head descales past head 0 (buffers.q/k/v_descale_h): per-head descale ignored (per-tensor "
      "used), the output matches head 0's descales for every head",
      p, t};
  bool differs = false;
  for (std::vector<float>* a : {&first.t->q_descale_h, &first.t->k_descale_h, &first.t->v_descale_h})
    for (float& x : *a) differs |= x != (*a)[0], x = (*a)[0];
  if (differs) out.push_back(std::move(first));
  if (p.heads_kv < 2 || p.heads_kv == p.heads_q || t.q_descale_h.empty() || t.k_descale_h.empty()) return;
  Probe qh{
      "the KV head of k's per-head descale (buffers.k_descale_h): the output matches k's descale read at "
      "query "
      "head h mod Hkv instead of its KV head h / (Hq / Hkv)",
      p, t};
  bool moved = false;
  for (int64_t b = 0; b < (p.descale_stride[0] ? p.batch : 1); ++b)  // each q descale once
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const double right =
          t.k_descale_h[static_cast<size_t>(descale_h_index(p, b, h / (p.heads_q / p.heads_kv)))];
      const double wrong = t.k_descale_h[static_cast<size_t>(descale_h_index(p, b, h % p.heads_kv))];
      float& qd = qh.t->q_descale_h[static_cast<size_t>(descale_h_index(p, b, h))];
      moved |= right != wrong;
      qd = static_cast<float>(qd * wrong / right);
    }
  if (moved) out.push_back(std::move(qh));
}

// MLA's shared latent (AF_VARIANT_KV_SHARED, dense): V's rows stepped by its own row length (Dv per KV head,
// a contiguous [B, Sk, Hkv, Dv] tensor) from K's pointer instead of K's row stride (ik_llama.cpp PR #2031: V
// stepped by the wrong row length, right on key 0 only). The exact result of V = K's buffer read that way.
void kv_shared_probe(const Problem& p, const Tensors& t, std::vector<Probe>& out) {
  if (has_sequences(p) || p.seq_k < 2) return;
  Probe pr{
      fmt("v_stride (kv-shared: V's rows are K's, %lld elements apart): the output matches V read from K's "
          "buffer with its own row length (%lld elements apart, as a contiguous [B, Sk, Hkv, Dv] tensor)",
          (long long)p.k_stride[1], (long long)(p.heads_kv * p.head_dim_v)),
      p, t};
  pr.p.variants &= ~AF_VARIANT_KV_SHARED;
  pr.p.v_stride[2] = p.head_dim_v;
  pr.p.v_stride[1] = p.heads_kv * p.head_dim_v;
  pr.p.v_stride[0] = p.seq_k * pr.p.v_stride[1];
  if (pr.p.v_stride[1] == p.k_stride[1] && pr.p.v_stride[0] == p.k_stride[0])
    return;       // D = Dv: nothing differs
  pr.t->v = t.k;  // every element the contiguous reading reaches lies in K's buffer (Dv <= D)
  out.push_back(std::move(pr));
}

std::vector<Probe> probes(const Problem& p, const Tensors& t) {
  std::vector<Probe> out;
  static const std::pair<uint32_t, const char*> kOff[] = {
      {AF_VARIANT_SINK, "the sink logits (buffers.sinks): the output is the softmax without the sink"},
      {AF_VARIANT_SOFTCAP, "the softcap (problem.softcap): the output is the uncapped softmax"},
      {AF_VARIANT_ALIBI, "the ALiBi slopes (buffers.alibi_slopes): the output has no ALiBi term"},
      {AF_VARIANT_BIAS, "the bias (buffers.bias): the output has no additive bias"},
  };
  for (const auto& [bit, what] : kOff)
    if (p.variants & bit) out.push_back(Probe{what, variant_off(p, bit), std::nullopt});
  if ((p.variants & AF_VARIANT_ALIBI) && !power_of_two(p.heads_q)) {
    // A kernel that computes its own slopes 2^(-8 (h + 1) / Hq): right for a power-of-two head count only.
    Probe pr{fmt("the given ALiBi slopes (buffers.alibi_slopes): the output matches the slopes 2^(-8 (h + 1) / Hq) "
                 "of the power-of-two rule, which the ALiBi paper replaces for Hq = %lld (not a power of two)",
                 (long long)p.heads_q),
             p, t};
    for (int64_t h = 0; h < p.heads_q; ++h)
      pr.t->alibi_slopes[static_cast<size_t>(h)] =
          static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(p.heads_q)));
    out.push_back(std::move(pr));
  }
  if (p.variants & AF_VARIANT_BIAS) {
    static const char* const kDim[4] = {"batch", "query head", "query row", "key"};
    const int64_t ext[4] = {p.batch, p.heads_q, p.seq_q, p.seq_k};
    for (int d = 0; d < 4; ++d) {
      if (p.bias_stride[d] == 0 || ext[d] < 2) continue;
      Probe pr{fmt("bias_stride[%d] (the %s stride of the bias): the output matches the bias broadcast over the %s "
                   "(index 0 everywhere) while the case's bias has its own values per %s",
                   d, kDim[d], kDim[d], kDim[d]),
               p, std::nullopt};
      pr.p.bias_stride[d] = 0;
      out.push_back(std::move(pr));
    }
  }
  mask_probes(p, t, out);
  if (p.variants & AF_VARIANT_HEAD_DESCALE) head_descale_probes(p, t, out);
  if (kv_shared(p)) kv_shared_probe(p, t, out);
  return out;
}

// ---- the relaunch: a switched-off probe run by the kernel itself ----
// The oracle probes compare the output with another exact result under that result's bound, which a backward
// given the case's LSE can make too wide to separate (P = exp(s' - LSE) far above 1 once a mask is off), and
// which a problem outside the fp32 contract (a huge value the parameter hid) leaves without a result. The
// relaunch asks the kernel instead: the same inputs on the problem without the parameter. An output identical
// to the checked one (launch_diff) while the parameter's effect is visible (the exact result without it is
// beyond the case's bound, or leaves the fp32 contract that the case keeps) means the kernel does not read
// the parameter.

// Where exact gradients y (a switched-off problem) are apart from the case's x, or "".
std::string gradients_apart(const Problem& p, const GradResult& x, const GradResult& y) {
  if (!x.inside_contract) return {};
  if (!y.inside_contract) return "the backward without it leaves the fp32 contract (" + y.why + ")";
  auto scan = [](const char* name, const std::vector<double>& a, const std::vector<double>& ba,
                 const std::vector<double>& b, const std::vector<uint8_t>& ca, const std::vector<uint8_t>& cb,
                 int64_t dim) -> std::string {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      const size_t row = i / static_cast<size_t>(dim);
      if (ca[row] && cb[row] && apart(a[i], ba[i], b[i]))
        return fmt("%s element %zu: ", name, i) + num(a[i]) + " vs " + num(b[i]);
    }
    return {};
  };
  for (std::string w : {scan("dQ", x.dq, x.dq_bound, y.dq, x.q_computed, y.q_computed, p.head_dim),
                        scan("dK", x.dk, x.dk_bound, y.dk, x.k_computed, y.k_computed, p.head_dim),
                        scan("dV", x.dv, x.dv_bound, y.dv, x.k_computed, y.k_computed, p.head_dim_v)})
    if (!w.empty()) return w;
  return {};
}

// Whether probe pr switches a parameter off and nothing else: the kernel can run it on the case's own inputs.
bool relaunchable(const Context& c, const Probe& pr) {
  return !pr.t && pr.p.variants != c.pc.problem().variants && unsupported_reason(c.k.kernel, pr.p).empty();
}

// The kernel on problem p with the case's inputs t (v possibly changed): the forward, or for a gradient
// failure the backward given the checked launch's O / LSE (the case's given ones for a backward pass), whose
// O / LSE are kept.
LaunchOutcome relaunch(Context& c, const Problem& p, const Tensors& t) {
  ++c.stats.launches;
  if (!c.gradient_failure()) return launch_guarded(c.dev, c.k, p, t, c.opts);
  const LaunchOutcome& out = c.original();
  const std::vector<float>& o = c.pass() == Pass::kBwd ? c.pc.given_o(c.opts.oracle) : out.o;
  const std::vector<float>& lse = c.pass() == Pass::kBwd ? c.pc.given_lse(c.opts.oracle) : out.lse;
  LaunchOutcome x = launch_guarded_bwd(c.dev, c.k, p, t, o, lse, c.opts);
  x.o = out.o, x.lse = out.lse;
  return x;
}

// A switched-off probe whose exact result is apart from the case's: `where` is the first element apart.
struct Apart {
  const Probe* pr;
  std::string where;
};

// Relaunches each probe; fires for the one that switches the most variants off among those whose output is
// the checked one, after a control (v doubled, the case's problem) shows the output depends on the inputs at
// all.
Finding relaunch_probes(Context& c, const std::vector<Apart>& cands) {
  Finding f;
  const Apart* best = nullptr;
  for (const Apart& a : cands) {
    const LaunchOutcome x = relaunch(c, a.pr->p, c.tensors());
    if (x.launch.status != LaunchStatus::kOk || launch_diff(c, c.original(), x).count != 0) continue;
    const auto off = [&](const Apart& y) {
      return std::popcount(c.pc.problem().variants ^ y.pr->p.variants);
    };
    if (!best || off(a) > off(*best)) best = &a;
  }
  if (!best) return f;
  Tensors doubled = c.tensors();
  for (float& v : doubled.v) v *= 2;
  const LaunchOutcome ctl = relaunch(c, c.pc.problem(), doubled);
  if (ctl.launch.status != LaunchStatus::kOk || launch_diff(c, c.original(), ctl).count == 0) {
    f.evidence.push_back({"ignored-parameter", "relaunch: the output stays the same without " +
                                                   best->pr->what.substr(0, best->pr->what.find(':')) +
                                                   ", but also with V doubled (control): no conclusion"});
    return f;
  }
  f.fired = true;
  f.cls = FailureClass::kIgnoredParameter;
  f.kind = "relaunch";
  f.evidence.push_back(
      {"ignored-parameter",
       "the kernel ignores " + best->pr->what + " (relaunch): run on the same inputs without it (variants " +
           variant_names(best->pr->p.variants) + "), its " +
           (c.gradient_failure() ? "dQ, dK, dV are" : "output is") +
           " the checked launch's, while its effect on the exact result is beyond the case's bound (" +
           best->where + "); with V doubled the output changes (control)"});
  return f;
}

Finding gradient_probes(Context& c) {
  Finding f;
  const Problem& p = c.pc.problem();
  const LaunchOutcome& out = c.original();
  const Tensors& t = c.tensors();
  // d sink left 0: every head's d sink exactly 0 where the exact one is beyond its bound from 0.
  if (c.j.result.tensor == "dSink" && !out.dsinks.empty()) {
    const GradResult g = grad_oracle_for(c.pc, out, c.opts);
    int64_t zero = 0, visible = 0;
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const double ex = g.dsinks[static_cast<size_t>(h)], bd = g.dsinks_bound[static_cast<size_t>(h)];
      if (!(std::fabs(ex) > bd)) continue;
      ++visible;
      zero += out.dsinks[static_cast<size_t>(h)] == 0.0f;
    }
    if (visible > 0 && zero == visible) {
      f.fired = true;
      f.cls = FailureClass::kIgnoredParameter;
      f.evidence.push_back({"ignored-parameter", fmt("the sink's gradient: d sink is exactly 0 at all %lld head(s) whose "
                                                     "exact d sink is beyond its bound from 0 (the backward ignores the "
                                                     "sink; dQ, dK, dV are judged separately)",
                                                     (long long)visible)});
      return f;
    }
  }
  // A failure in d sink or d bias alone (dQ, dK, dV within the bound) is not explained by the probes below: a
  // probe problem whose dQ, dK, dV the kernel's also match would name a parameter no experiment tied to the
  // failing tensor (a d bias off by a factor was once named "ignores bias_stride[3]"). Whether dQ, dK, dV
  // fail is judged here, not read from the worst element's tensor: a d bias of tiny bounds is often the worst
  // while dQ, dK, dV fail too.
  const GradResult own = grad_oracle_for(c.pc, out, c.opts);
  const KernelGrads exact = as_written(p, own, out);
  if (c.j.result.tensor == "dSink" || c.j.result.tensor == "dBias") {
    CheckResult r;
    compare_gradients(p, own, out.dq.data(), out.dk.data(), out.dv.data(), r);
    if (r.verdict == Verdict::kPass) return f;
  }
  const std::vector<float>& o = c.pass() == Pass::kBwd ? c.pc.given_o(c.opts.oracle) : out.o;
  const std::vector<float>& lse = c.pass() == Pass::kBwd ? c.pc.given_lse(c.opts.oracle) : out.lse;
  if (lse.empty()) return f;
  struct Loose {
    const Probe* pr;
    double kernel_ratio, exact_ratio;
  };
  std::vector<Loose> loose;  // matches the probe's bound cannot separate from the case's exact gradients
  std::vector<Apart> relaunch;  // switched-off probes whose exact gradients are apart from the case's
  const std::vector<Probe> all = probes(p, t);
  for (const Probe& pr : all) {
    const Tensors& pt = pr.t ? *pr.t : t;
    GradOptions go = grad_options(c.opts.oracle);
    ++c.stats.oracles;
    const GradResult g =
        compute_grad_oracle(pr.p, pt.q.data(), pt.k.data(), pt.v.data(), pt.dout.data(), o.data(), lse.data(),
                            pt.variant_inputs(), go);
    if (relaunchable(c, pr))
      if (std::string w = gradients_apart(p, own, g); !w.empty()) relaunch.push_back({&pr, w});
    // dQ, dK, dV and the variants' own gradients the kernel wrote (d sink; d bias where the probe keeps its
    // layout): all must match the probe's.
    const bool dbias = !out.dbias.empty() && std::equal(p.bias_stride, p.bias_stride + 4, pr.p.bias_stride);
    CheckResult r;
    compare_gradients(pr.p, g, out.dq.data(), out.dk.data(), out.dv.data(), r, {},
                      out.dsinks.empty() ? nullptr : out.dsinks.data(), dbias ? out.dbias.data() : nullptr);
    // The probe must tell the case's exact dQ, dK, dV from its own: with the case's O and LSE given, a probe
    // problem's bounds can be so wide (P = exp(s' - LSE) far above 1) that a correct kernel would match it
    // too.
    CheckResult sep;
    compare_gradients(pr.p, g, exact.dq.data(), exact.dk.data(), exact.dv.data(), sep);
    if (r.verdict == Verdict::kPass && sep.verdict == Verdict::kFail) {
      f.fired = true;
      f.cls = FailureClass::kIgnoredParameter;
      f.evidence.push_back(
          {"ignored-parameter", "the backward ignores " + pr.what + ": dQ, dK, dV" +
                                    (out.dsinks.empty() ? "" : ", d sink") + (dbias ? ", d bias" : "") +
                                    " are within the bound of that problem's exact gradients" +
                                    fmt(" (max ratio %.3g; the case's exact gradients are beyond it, "
                                        "max ratio %.3g)",
                                        r.max_ratio, sep.max_ratio)});
      return f;
    }
    if (r.verdict ==
        Verdict::kPass) {  // a match the probe's wide bound cannot tell from the case's exact result
      CheckResult
          vis;  // the probe's exact gradients beyond the case's bound: the parameter's effect is visible
      const KernelGrads pg = as_written(pr.p, g, out);
      compare_gradients(p, own, pg.dq.data(), pg.dk.data(), pg.dv.data(), vis);
      if (vis.verdict == Verdict::kFail) loose.push_back({&pr, r.max_ratio, sep.max_ratio});
      f.evidence.push_back(
          {"ignored-parameter", "not (yet) " + pr.what.substr(0, pr.what.find(':')) +
                                    fmt(": the gradients are within that problem's bound (max ratio "
                                        "%.3g), but so are the case's exact ones (max ratio %.3g): "
                                        "the probe alone cannot tell them apart",
                                        r.max_ratio, sep.max_ratio)});
      continue;
    }
    f.evidence.push_back({"ignored-parameter", "not " + pr.what.substr(0, pr.what.find(':')) +
                                                   fmt(": the gradients stay beyond the bound (max ratio %.3g)", r.max_ratio)});
  }
  if (Finding r = relaunch_probes(c, relaunch); r.fired || !r.evidence.empty()) {
    f.evidence.insert(f.evidence.end(), r.evidence.begin(), r.evidence.end());
    if (r.fired) {
      f.fired = true, f.cls = r.cls, f.kind = r.kind;
      return f;
    }
  }
  // No probe separated. One probe alone matching, whose exact gradients are beyond the case's bound (its
  // effect is visible), still names the parameter; several are ambiguous unless they are one result (e.g. a
  // block mask whose blocks are all partial: the custom mask off inside them is both masks off), judged by
  // identical ratios.
  bool one = !loose.empty();
  for (const Loose& l : loose)
    one &= l.kernel_ratio == loose[0].kernel_ratio && l.exact_ratio == loose[0].exact_ratio;
  if (one) {
    f.fired = true;
    f.cls = FailureClass::kIgnoredParameter;
    f.evidence.push_back(
        {"ignored-parameter",
         "the backward ignores " + loose[0].pr->what +
             fmt(": of every probe only this one matches dQ, dK, dV (max ratio %.3g against it) and "
                 "its exact gradients are beyond the case's bound; its own bound is wide (the case's "
                 "exact gradients are within it too, max ratio %.3g)",
                 loose[0].kernel_ratio, loose[0].exact_ratio)});
  }
  return f;
}

}  // namespace

Finding ignored_parameter(Context& c) {
  Finding f;
  const Problem& p = c.problem();
  if (!p.variants) return f;
  if (c.gradient_failure()) return gradient_probes(c);
  const std::vector<RowKey> rows = failing_rows(c);
  if (rows.empty()) return f;
  const LaunchOutcome& out = c.original();
  const OracleResult& exact = c.pc.oracle(c.opts.oracle);
  // A sequence layout's probes switch the variant off in the layout problem (the one a relaunch takes) and their
  // exact results are per sequence (layout_oracle), in the dense view p like the case's.
  std::vector<Probe> all = probes(c.pc.problem(), c.tensors());
  OracleOptions declared = c.opts.oracle;  // as if the kernel declared AF_KERNEL_SCORE_ADD_IN_DTYPE
  declared.score_add_in_dtype = true;
  if ((p.variants & (AF_VARIANT_BIAS | AF_VARIANT_ALIBI)) && score_add_dtype(c.opts.oracle, p) < 0 &&
      score_add_dtype(declared, p) >= 0)
    all.push_back(Probe{fmt("bias + ALiBi in %s: rounded to the dtype before they are added (as a float mask in the "
                            "query's dtype is), which it does not declare (AF_KERNEL_SCORE_ADD_IN_DTYPE; an adapter's "
                            "score_add_in_dtype)",
                            dtype_name(p.dtype)),
                        c.pc.problem(), std::nullopt, true});
  std::vector<Apart> relaunch;  // switched-off probes whose exact result is apart from the case's
  for (const Probe& pr : all) {
    const OracleResult ex = c.layout_oracle(pr.p, pr.t ? *pr.t : c.tensors(), pr.add_in_dtype);
    if (relaunchable(c, pr))
      if (std::string w = outputs_apart(p, exact, ex); !w.empty()) relaunch.push_back({&pr, w});
    const RowsMatch m = rows_match(p, exact, ex, out, rows);
    if (m.all(rows.size())) {
      // The row's whole output (O and LSE) matches the other exact result: every other row already passes.
      f.fired = true;
      f.cls = pr.add_in_dtype ? FailureClass::kPrecision : FailureClass::kIgnoredParameter;
      if (pr.add_in_dtype) f.kind = "score-add-in-dtype";  // decided by "ignored-parameter/score-add-in-dtype"
      f.evidence.push_back({pr.add_in_dtype ? "score-add-in-dtype" : "ignored-parameter",
                            fmt("the kernel %s %s: all %lld failing row(s) (s = %s) are within the bound of that exact "
                                "result (max ratio %.3g against it, %.3g against the case's)",
                                pr.add_in_dtype ? "takes" : "ignores", pr.what.c_str(), (long long)rows.size(),
                                ranges(m.where).c_str(), m.worst, c.j.result.max_ratio)});
      return f;
    }
    f.evidence.push_back({"ignored-parameter", fmt("not %s: %lld of %lld failing row(s) match it (max ratio %.3g), on "
                                                   "%lld its effect is beyond the bound",
                                                   pr.what.substr(0, pr.what.find(':')).c_str(), (long long)m.match,
                                                   (long long)rows.size(), m.worst, (long long)m.visible)});
  }
  Finding r = relaunch_probes(c, relaunch);
  r.evidence.insert(r.evidence.begin(), f.evidence.begin(), f.evidence.end());
  return r;
}

}  // namespace attnfuzz::detect
