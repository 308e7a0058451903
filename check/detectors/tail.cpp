// tail.cpp - the tail detector: pads a failing case so that its exact result is unchanged and sees whether
// the failure vanishes (head-dim, query-row and key tails; docs/semantics.md `tail`).
//
// Three paddings, each to the next multiple of 8, 16, 32, 64, 128 and to the next power of two:
//   - D and Dv: zero columns appended to q, k (scores unchanged) and v (the extra O columns are not judged);
//     the scale is kept as the explicit fp32 value (the default scale depends on D).
//   - query rows: appended (top-left alignment, no mask) or prepended (bottom-right: the diagonal offset
//     Sk - Sq shrinks by exactly the rows added in front), with zero values;
//   - keys: zero keys appended or prepended that no row sees, under the same mask or a window that gives
//     every original row exactly its original keys (only when the kernel supports that mask).
// Every padded problem is verified row by row (visible_keys) before it is used, and only the original rows
// and columns are judged, against the padded case's own oracle. A failure that vanishes under some padding
// depends on a residue of the size, not on the values: `tail`. Custom / block masks are padded in one dense
// mask form (new rows and keys hidden; the visibility checked key by key), after a control: the unpadded case
// in that form must still fail.
#include <algorithm>
#include <cmath>
#include <map>

#include "check/compare.h"
#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

namespace {

constexpr int64_t kMultiples[] = {8, 16, 32, 64, 128};
constexpr int kMaxExperiments = 14;           // launches + oracles at most (each padding costs one of each)
constexpr int64_t kMaxGrowth = 8;             // a padded problem may be at most this many times the work ...
constexpr int64_t kMinWork = 1 << 16;         // ... or this many multiply-adds, whichever is larger
constexpr int64_t kFullOracleWork = 1 << 24;  // padded oracles below this compute every row

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}
int64_t work(const Problem& p) {
  return p.batch * p.heads_q * p.seq_q * std::max<int64_t>(p.seq_k, 1) * std::max(p.head_dim, p.head_dim_v);
}

// Padding targets of a size n: the next multiple of each tile size and the next power of two, each with the
// names of the tilings it completes ("x8, x16, pow2").
struct Target {
  int64_t size;
  std::string why;
};
std::vector<Target> targets(int64_t n) {
  std::vector<Target> t;
  auto add = [&](int64_t s, const std::string& why) {
    if (s <= n) return;
    for (Target& x : t)
      if (x.size == s) {
        x.why += ", " + why;
        return;
      }
    t.push_back({s, why});
  };
  for (int64_t m : kMultiples) add(round_up(n, m), "x" + std::to_string(m));
  add(next_pow2(n), "pow2");
  std::sort(t.begin(), t.end(), [](const Target& a, const Target& b) { return a.size < b.size; });
  return t;
}

// "59 (mod 8 = 3, mod 16 = 11, ...)": the residues of a size against the tile sizes.
std::string residues(int64_t n) {
  std::string s = std::to_string(n) + " (";
  bool first = true;
  for (int64_t m : kMultiples) {
    s += (first ? "" : ", ") + std::string("%") + std::to_string(m) + "=" + std::to_string(n % m);
    first = false;
  }
  return s + ")";
}

using Padded = TailPadding;

// Whether every original row sees exactly its original keys (shifted) in the padded problem, and every
// padded row / key outside them is nothing the original rows see. With a custom mask (t: the case's inputs in
// the dense mask form, dense_mask_form) every (b, h, row) is compared key by key under the one visibility
// rule.
bool same_visibility(const Problem& p, const Padded& x, const Tensors* t);

}  // namespace

Tensors tail_pad_tensors(const Problem& p, const Tensors& t, const TailPadding& x) {
  Tensors out;
  out.q.assign(static_cast<size_t>(q_elements(x.p)), 0.0f);
  out.k.assign(static_cast<size_t>(k_elements(x.p)), 0.0f);
  out.v.assign(static_cast<size_t>(v_elements(x.p)), 0.0f);
  if (p.variants &
      AF_VARIANT_MASK_DENSE) {  // the dense mask form: original bytes moved, new rows and keys hidden
    out.custom_mask.assign(static_cast<size_t>(custom_mask_bytes(x.p)), 0);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seq_q; ++i)
          for (int64_t j = 0; j < p.seq_k; ++j)
            out.custom_mask[static_cast<size_t>(b * x.p.mask_stride[0] + h * x.p.mask_stride[1] +
                                                (i + x.q_shift) * x.p.mask_stride[2] + j + x.k_shift)] =
                t.custom_mask[static_cast<size_t>(b * p.mask_stride[0] + h * p.mask_stride[1] +
                                                  i * p.mask_stride[2] + j)];
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          out.q[static_cast<size_t>(q_index(x.p, b, s + x.q_shift, h, d))] =
              t.q[static_cast<size_t>(q_index(p, b, s, h, d))];
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d)
          out.k[static_cast<size_t>(k_index(x.p, b, j + x.k_shift, h, d))] =
              t.k[static_cast<size_t>(k_index(p, b, j, h, d))];
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          out.v[static_cast<size_t>(v_index(x.p, b, j + x.k_shift, h, d))] =
              t.v[static_cast<size_t>(v_index(p, b, j, h, d))];
      }
  }
  return out;
}

namespace {

bool same_visibility(const Problem& p, const Padded& x, const Tensors* t) {
  if (!t || !(p.variants & kMaskVariants)) {
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const KeyRange a = visible_keys(p, i), b = visible_keys(x.p, i + x.q_shift);
      if (a.empty() != b.empty()) return false;
      if (!a.empty() && (a.first + x.k_shift != b.first || a.last + x.k_shift != b.last)) return false;
    }
    return true;
  }
  const Tensors t2 = tail_pad_tensors(p, *t, x);
  const VariantInputs in = t->variant_inputs(), in2 = t2.variant_inputs();
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t j = 0; j < x.p.seq_k; ++j) {
          const int64_t o = j - x.k_shift;  // the original key at padded key j, if any
          const bool was = o >= 0 && o < p.seq_k && key_visible(p, in, b, h, i, o);
          if (was != key_visible(x.p, in2, b, h, i + x.q_shift, j)) return false;
        }
  return true;
}

}  // namespace

DenseMaskForm dense_mask_form(const Problem& p, const Tensors& t) {
  DenseMaskForm f{p, t};
  if (!(p.variants & kMaskVariants)) return f;
  f.p.variants = (p.variants & ~kMaskVariants) | AF_VARIANT_MASK_DENSE;
  f.p.block_q = f.p.block_k = 0;
  for (int64_t& x : f.p.block_mask_stride) x = 0;
  (void)set_mask_strides(f.p, "");
  f.t.block_mask.clear();
  f.t.custom_mask.assign(static_cast<size_t>(custom_mask_bytes(f.p)), 0);
  const VariantInputs in = t.variant_inputs();
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t j = 0; j < p.seq_k; ++j)
          f.t.custom_mask[static_cast<size_t>(b * f.p.mask_stride[0] + h * f.p.mask_stride[1] +
                                              i * f.p.mask_stride[2] + j)] =
              custom_visible(p, in, b, h, i, j) ? 1 : 0;
  f.changed = (p.variants & kMaskVariants) != AF_VARIANT_MASK_DENSE ||
              !std::equal(p.mask_stride, p.mask_stride + 3, f.p.mask_stride);
  return f;
}

namespace {

// A problem like p with another shape (core: reshape_problem keeps scale, mask, dtype, fp8 scales, tunables).
Problem reshaped(const Problem& p, int64_t sq, int64_t sk, int64_t d, int64_t dv) {
  return reshape_problem(p, p.batch, sq, sk, d, dv);
}

// The key paddings of p to sk2 keys that leave every row's visible keys unchanged: the same mask, else a
// window in either alignment, with the new keys after the last key or before the first one.
std::vector<Padded> key_paddings(const Problem& p, int64_t sk2) {
  std::vector<Padded> out;
  const int64_t e = sk2 - p.seq_k, off = mask_offset(p), L = window_left(p), R = window_right(p);
  for (bool prepend : {false, true}) {
    const int64_t shift = prepend ? e : 0;
    Padded same;
    same.p = reshaped(p, p.seq_q, sk2, p.head_dim, p.head_dim_v);
    same.k_shift = shift;
    out.push_back(same);
    for (int32_t align : {AF_ALIGN_TOP_LEFT, AF_ALIGN_BOTTOM_RIGHT}) {
      Padded w = same;
      w.p.mask_kind = AF_MASK_WINDOW;
      w.p.mask_align = align;
      const int64_t off2 = align == AF_ALIGN_BOTTOM_RIGHT ? sk2 - p.seq_q : 0;
      const int64_t delta = off + shift - off2;  // j' - (i + off2) = j - (i + off) + delta
      // Bounded sides move with the diagonal; an unbounded side is closed at the original keys' edge.
      const int64_t left = L == AF_UNBOUNDED ? (prepend ? off2 - shift : AF_UNBOUNDED) : L - delta;
      const int64_t right =
          R == AF_UNBOUNDED ? (prepend ? AF_UNBOUNDED : p.seq_k - 1 - off2 - (p.seq_q - 1)) : R + delta;
      if ((left < 0 && left != AF_UNBOUNDED) || (right < 0 && right != AF_UNBOUNDED)) continue;
      if (left == AF_UNBOUNDED && right == AF_UNBOUNDED) continue;  // that is "none": already tried
      w.p.window_left = left;
      w.p.window_right = right;
      out.push_back(w);
    }
  }
  return out;
}

// Query paddings of p to sq2 rows under the same mask: rows after the last (top-left / none) or before the
// first (bottom-right keeps i + off when off shrinks by the rows added in front).
std::vector<Padded> query_paddings(const Problem& p, int64_t sq2) {
  std::vector<Padded> out;
  for (bool prepend : {false, true}) {
    Padded x;
    x.p = reshaped(p, sq2, p.seq_k, p.head_dim, p.head_dim_v);
    x.q_shift = prepend ? sq2 - p.seq_q : 0;
    out.push_back(x);
  }
  return out;
}

// The original rows and columns of a padded run, judged against the padded case's oracle.
struct Judgement {
  bool ran = false;
  bool fail = false;
  double ratio = 0;
  int64_t compared = 0, failed = 0;
  std::string why;  // launch failure, canaries, unsupported, or nothing compared
};

// A padding passes only if every row that failed as checked was computed (not sampled out) and passes.
Judgement judge_padded(const Problem& p, const Padded& x, const OracleResult& ex, const LaunchOutcome& out,
                       const std::vector<RowKey>& failed_rows) {
  Judgement j;
  j.ran = true;
  if (out.launch.status != LaunchStatus::kOk) {
    j.fail = true;
    j.why = "launch: " + out.launch.message;
    return j;
  }
  if (out.canary_words) {
    j.fail = true;
    j.why = std::to_string(out.canary_words) + " guard word(s) overwritten";
    return j;
  }
  auto one = [&](double expected, float got, double bound) {
    const ElementJudgement e = judge_element(expected, got, bound);
    ++j.compared;
    if (e.fail) ++j.failed;
    j.ratio = std::max(j.ratio, std::isnan(e.ratio) ? INFINITY : e.ratio);
  };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const int64_t s2 = s + x.q_shift;
        const RowInfo& ri = ex.row(b, h, s2);
        if (!ri.computed || !ri.inside_contract()) continue;
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t e = ex.o_at(b, s2, h, d);
          one(ex.o[e], out.o[static_cast<size_t>(o_index(x.p, b, s2, h, d))], ex.o_bound[e]);
        }
        if (!out.lse.empty()) {
          const size_t e = ex.lse_at(b, h, s2);
          one(ex.lse[e], out.lse[static_cast<size_t>(lse_index(x.p, b, h, s2))], ex.lse_bound[e]);
        }
      }
  j.fail = j.failed > 0;
  if (j.compared == 0) {
    j.ran = false;
    j.why = "no original row inside the contract was computed";
  }
  if (!j.fail)
    for (const RowKey& r : failed_rows)
      if (!ex.row(r.b, r.h, r.s + x.q_shift).computed) {
        j.ran = false;
        j.why = fmt("failing row %lld is not among the padded oracle's sampled rows", (long long)r.s);
        break;
      }
  return j;
}

}  // namespace

std::vector<TailPadding> tail_paddings(const Problem& p, const af_kernel* k, const Tensors* t) {
  std::vector<TailPadding> out;
  // Picks the first candidate whose every original row keeps exactly its keys and that k supports.
  auto choose = [&](const char* axis, const std::string& at, std::vector<Padded> cands) {
    TailPadding use;
    use.axis = axis;
    use.what = at;
    std::string refused;
    for (Padded& x : cands) {
      if (!same_visibility(p, x, t)) continue;
      if (k)
        if (std::string why = unsupported_reason(*k, x.p); !why.empty()) {
          if (refused.empty()) refused = why;
          continue;
        }
      use.p = x.p;
      use.q_shift = x.q_shift;
      use.k_shift = x.k_shift;
      use.what = at + (x.q_shift ? ", rows in front" : "") + (x.k_shift ? ", keys in front" : "") +
                 (x.p.mask_kind != p.mask_kind || x.p.mask_align != p.mask_align ||
                          x.p.window_left != p.window_left || x.p.window_right != p.window_right
                      ? ", mask " + mask_to_string(x.p)
                      : "");
      out.push_back(use);
      return;
    }
    use.refused = refused.empty() ? "no padding keeps every row's keys" : refused;
    out.push_back(use);
  };
  // D and Dv together, to each target of the larger residue set.
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> dims;
  auto add_dim = [&](int64_t d2, int64_t dv2, const std::string& why) {
    if (d2 == p.head_dim && dv2 == p.head_dim_v) return;
    for (auto& [dd, w] : dims)
      if (dd.first == d2 && dd.second == dv2) {
        w += ", " + why;
        return;
      }
    dims.push_back({{d2, dv2}, why});
  };
  for (int64_t m : kMultiples)
    add_dim(round_up(p.head_dim, m), round_up(p.head_dim_v, m), "x" + std::to_string(m));
  add_dim(next_pow2(p.head_dim), next_pow2(p.head_dim_v), "pow2");
  std::sort(dims.begin(), dims.end());
  for (const auto& [dd, why] : dims) {
    Padded x;
    x.p = reshaped(p, p.seq_q, p.seq_k, dd.first, dd.second);
    choose("D,Dv",
           fmt("D,Dv %lld,%lld -> %lld,%lld (%s)", (long long)p.head_dim, (long long)p.head_dim_v,
               (long long)dd.first, (long long)dd.second, why.c_str()),
           {x});
  }
  for (const Target& tg : targets(p.seq_q))
    choose("Sq", fmt("Sq %lld -> %lld (%s)", (long long)p.seq_q, (long long)tg.size, tg.why.c_str()),
           query_paddings(p, tg.size));
  if (p.seq_k > 0)
    for (const Target& tg : targets(p.seq_k))
      choose("Sk", fmt("Sk %lld -> %lld (%s)", (long long)p.seq_k, (long long)tg.size, tg.why.c_str()),
             key_paddings(p, tg.size));
  return out;
}

namespace {

// The tail detector's experiments on one failing case: every padding run, its outcome line, the budget.
class TailRun {
 public:
  TailRun(Context& c, DenseMaskForm form)
      : c_(c), max_work_(std::max(kMaxGrowth * work(c.problem()), kMinWork)), form_(std::move(form)) {}

  // With custom masks re-expressed as one dense mask (dense_mask_form), the unpadded case in that form must
  // still fail, or a bug of the mask's own form (bits, blocks, a broadcast) could vanish with it. False: do
  // not pad.
  bool mask_form_control(const std::vector<RowKey>& failed_rows) {
    if (!form_.changed) return true;
    if (!unsupported_reason(c_.k.kernel, form_.p).empty()) {
      evidence_.evidence.push_back(
          {"tail", "not run: the kernel does not take the custom masks as one dense mask"});
      return false;
    }
    TailPadding same;
    same.p = form_.p;
    same.what = "control: the custom / block masks as one dense mask (nothing padded)";
    const size_t before = passing_.size();
    run_one(form_.p, form_.t, same, failed_rows, "");
    flush();
    if (passing_.size() == before) return true;
    passing_.pop_back();
    evidence_.evidence.push_back({"tail", "not run: the masks' dense form alone makes the failure vanish"});
    return false;
  }

  // Every padding of tail_paddings, one evidence line per axis.
  void pad_each_axis(const std::vector<RowKey>& failed_rows) {
    const Problem& p = form_.p;
    std::string axis;
    for (const TailPadding& x : tail_paddings(p, &c_.k.kernel, &form_.t)) {
      if (x.axis != axis) flush();
      axis = x.axis;
      if (!x.refused.empty()) {
        skipped_.push_back(x.what + ": " + x.refused);
        continue;
      }
      key_padded_ |= x.axis == "Sk";
      if (!run_one(p, form_.t, x, failed_rows, "")) break;
    }
    flush();
  }

  // Keys of a multi-row case that no padding can hide (no mask): the worst row alone (Sq = 1, its own keys,
  // exactly its exact result) must fail as well; then its keys are padded like a decode case's.
  void pad_worst_row_alone() {
    const Problem& p = c_.problem();
    int64_t wb = 0, wh = 0, ws = 0;
    if (!passing_.empty() || key_padded_ || p.seq_q <= 1 || p.seq_k <= 0 || !c_.dev.usable() ||
        (p.variants & kMaskVariants) || !worst_row(c_.j.result, wb, wh, ws))
      return;
    Problem alone;
    if (!row_alone_problem(ws, alone)) return;
    const Tensors t1 = row_alone_tensors(alone, ws);
    const std::string prefix = fmt("row %lld alone (Sq 1): ", (long long)ws);
    const std::vector<RowKey> row = {{wb, wh, 0}};
    TailPadding same;
    same.p = alone;
    same.what = "as is";
    const size_t before = passing_.size();
    run_one(alone, t1, same, row, prefix);
    if (passing_.size() > before) {  // the row alone passes: its failure needs the other rows
      passing_.pop_back();
      line_ += " (the failure needs the other rows: no key padding tried)";
    } else {
      for (const Target& tg : targets(p.seq_k))
        for (Padded& x : key_paddings(alone, tg.size)) {
          if (!same_visibility(alone, x, nullptr) || !unsupported_reason(c_.k.kernel, x.p).empty()) continue;
          x.what = fmt("Sk %lld -> %lld (%s)", (long long)p.seq_k, (long long)tg.size, tg.why.c_str()) +
                   (x.k_shift ? ", keys in front" : "") + ", mask " + mask_to_string(x.p);
          run_one(alone, t1, x, row, prefix);
          break;  // the first exact padding per target
        }
    }
    flush();
  }

  // The verdict: `tail` when some padding passes, with what was tried and skipped.
  Finding finding() const {
    Finding f = evidence_;
    const Problem& p = form_.p;
    for (size_t i = 0; i < skipped_.size() && i < 3; ++i)
      f.evidence.push_back({"tail", "not tried: " + skipped_[i]});
    const std::string as_checked = "as checked D " + residues(p.head_dim) +
                                   (p.head_dim_v != p.head_dim ? ", Dv " + residues(p.head_dim_v) : "") +
                                   ", Sq " + residues(p.seq_q) + ", Sk " + residues(p.seq_k) + " FAIL";
    if (!passing_.empty()) {
      f.fired = true;
      f.cls = FailureClass::kTail;
      std::string pass_list;
      for (const std::string& s : passing_) pass_list += (pass_list.empty() ? "" : "; ") + s;
      f.evidence.push_back(
          {"tail", "the failure vanishes when the case is padded with its exact result unchanged: " +
                       as_checked + "; pass after " + pass_list +
                       ": a size residue (head-dim / sequence tail, partial tile) is mishandled"});
    } else if (experiments_ > 0) {
      f.evidence.push_back({"tail", "the failure stays under every padding tried (" +
                                        std::to_string(experiments_) + "): not a tail signature"});
    } else {
      f.evidence.push_back({"tail", "not run: no padding applies to this case and kernel"});
    }
    return f;
  }

 private:
  void flush() {
    if (!line_.empty()) evidence_.evidence.push_back({"tail", line_});
    line_.clear();
  }

  // One padding experiment of base (p, or the worst row alone); false when the device became unusable.
  bool run_one(const Problem& base, const Tensors& base_t, const TailPadding& x,
               const std::vector<RowKey>& rows, const std::string& prefix) {
    if (work(x.p) > max_work_ || experiments_ >= kMaxExperiments) {
      skipped_.push_back(prefix + x.what + ": over the experiment budget");
      return true;
    }
    const bool mask_changed = x.p.mask_kind != base.mask_kind || x.p.mask_align != base.mask_align;
    if (mask_changed && x.what.rfind("control:", 0) != 0 && !control(base, base_t, x, rows, prefix)) {
      skipped_.push_back(prefix + x.what + ": its mask form alone changes the outcome (or has no control)");
      return c_.dev.usable();
    }
    if (experiments_ >= kMaxExperiments) {
      skipped_.push_back(prefix + x.what + ": over the experiment budget");
      return true;
    }
    ++experiments_;
    const Tensors t2 = tail_pad_tensors(base, base_t, x);
    OracleOptions oo = c_.opts.oracle;
    if (work(x.p) <= kFullOracleWork) oo.row_budget = 0;
    ++c_.stats.oracles;
    const OracleResult ex =
        compute_oracle(x.p, t2.q.data(), t2.k.data(), t2.v.data(), t2.variant_inputs(), oo);
    ++c_.stats.launches;
    const LaunchOutcome out = launch_guarded(c_.dev, c_.k, x.p, t2, c_.opts);
    const Judgement j = judge_padded(base, x, ex, out, rows);
    std::string r = prefix + x.what + ": ";
    if (!j.ran) {
      skipped_.push_back(r + "inconclusive (" + j.why + ")");
      return c_.dev.usable();
    }
    if (j.fail) {
      r += "FAIL" + (j.why.empty() ? fmt(" (%lld/%lld, err/bound %s)", (long long)j.failed,
                                         (long long)j.compared, num(j.ratio).c_str())
                                   : " (" + j.why + ")");
    } else {
      r += "pass" + fmt(" (err/bound %s)", num(j.ratio).c_str());
      passing_.push_back(prefix + x.what);
    }
    line_ += (line_.empty() ? "" : "; ") + r;
    return c_.dev.usable();
  }

  // Controls of key paddings that re-express the mask (a window instead of causal, the other alignment):
  // the unpadded case under that mask form must still fail, or a mask bug could vanish with the form.
  bool control(const Problem& base, const Tensors& base_t, const TailPadding& x,
               const std::vector<RowKey>& rows, const std::string& prefix) {
    for (Padded& y : key_paddings(base, base.seq_k)) {  // no key added: the same keys, the new mask form
      if (y.p.mask_kind != x.p.mask_kind || y.p.mask_align != x.p.mask_align ||
          !same_visibility(base, y, &base_t))
        continue;
      const std::string key = prefix + describe(y.p);
      auto it = control_fails_.find(key);
      if (it != control_fails_.end()) return it->second;
      y.what = "control: mask " + mask_to_string(y.p) + " (same keys, none added)";
      const size_t before = passing_.size();
      control_fails_[key] = false;  // also while it runs (no recursion)
      run_one(base, base_t, y, rows, prefix);
      const bool fails = passing_.size() == before;
      if (!fails) {
        passing_.pop_back();
        line_ += " (the mask form alone makes the failure vanish: key paddings with it are not evidence)";
      }
      control_fails_[key] = fails;
      return fails;
    }
    return false;  // no exact re-expression of the mask: the padding cannot be trusted
  }

  // Row ws of the case as a problem of one query row that sees exactly its keys, if the kernel supports one.
  bool row_alone_problem(int64_t ws, Problem& out) const {
    const Problem& p = c_.problem();
    const KeyRange want = visible_keys(p, ws);
    if (want.empty()) return false;
    for (int32_t kind : {AF_MASK_NONE, AF_MASK_WINDOW})
      for (int32_t align : {AF_ALIGN_TOP_LEFT, AF_ALIGN_BOTTOM_RIGHT}) {
        Problem q1 = reshaped(p, 1, p.seq_k, p.head_dim, p.head_dim_v);
        q1.mask_kind = kind;
        q1.mask_align = align;
        q1.window_left =
            align == AF_ALIGN_TOP_LEFT ? (want.first == 0 ? AF_UNBOUNDED : -2) : p.seq_k - 1 - want.first;
        q1.window_right = align == AF_ALIGN_TOP_LEFT ? want.last - 1 : (want.last == p.seq_k ? 0 : -2);
        if (kind == AF_MASK_NONE) q1.window_left = q1.window_right = AF_UNBOUNDED;
        if (!validate(q1).empty()) continue;
        const KeyRange got = visible_keys(q1, 0);
        if (got.first != want.first || got.last != want.last) continue;
        if (!unsupported_reason(c_.k.kernel, q1).empty()) continue;
        out = q1;
        return true;
      }
    return false;
  }

  // The case's tensors restricted to query row ws (every batch and head): q's row ws, all of k and v.
  Tensors row_alone_tensors(const Problem& alone, int64_t ws) const {
    const Problem& p = c_.problem();
    const Tensors& t = c_.tensors();
    Tensors t1;
    t1.q.assign(static_cast<size_t>(q_elements(alone)), 0.0f);
    t1.k.assign(static_cast<size_t>(k_elements(alone)), 0.0f);
    t1.v.assign(static_cast<size_t>(v_elements(alone)), 0.0f);
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          t1.q[static_cast<size_t>(q_index(alone, b, 0, h, d))] =
              t.q[static_cast<size_t>(q_index(p, b, ws, h, d))];
      for (int64_t j = 0; j < p.seq_k; ++j)
        for (int64_t h = 0; h < p.heads_kv; ++h) {
          for (int64_t d = 0; d < p.head_dim; ++d)
            t1.k[static_cast<size_t>(k_index(alone, b, j, h, d))] =
                t.k[static_cast<size_t>(k_index(p, b, j, h, d))];
          for (int64_t d = 0; d < p.head_dim_v; ++d)
            t1.v[static_cast<size_t>(v_index(alone, b, j, h, d))] =
                t.v[static_cast<size_t>(v_index(p, b, j, h, d))];
        }
    }
    return t1;
  }

  Context& c_;
  const int64_t max_work_;
  Finding evidence_;  // the per-axis outcome lines, in order
  int experiments_ = 0;
  bool key_padded_ = false;
  std::vector<std::string> passing_, skipped_;
  std::string line_;
  std::map<std::string, bool> control_fails_;
  DenseMaskForm form_;  // the case (its custom masks as one dense mask)
};

}  // namespace

Finding tail(Context& c) {
  if (c.problem().dtype != AF_DTYPE_F32) {
    Finding f;
    f.evidence.push_back({"tail", "not run: padding experiments are for f32 cases"});
    return f;
  }
  TailRun run(c, dense_mask_form(c.problem(), c.tensors()));
  const std::vector<RowKey> rows = failing_rows(c);
  if (run.mask_form_control(rows)) {
    run.pad_each_axis(rows);
    run.pad_worst_row_alone();
  }
  return run.finding();
}

}  // namespace attnfuzz::detect
