// repeat.cpp - repeated calls in one process: the stale-cache check (check/repeat.h).
#include "check/repeat.h"

#include <cstdio>
#include <memory>

#include "check/compare.h"

namespace attnfuzz {

namespace {

// q, k, v contiguous head-major, [B, H, S, D] (o and lse as they are).
void set_head_major(Problem& p) {
  auto hm = [](int64_t* st, int64_t S, int64_t H, int64_t D) { st[0] = H * S * D, st[1] = D, st[2] = S * D; };
  hm(p.q_stride, p.seq_q, p.heads_q, p.head_dim);
  hm(p.k_stride, p.seq_k, p.heads_kv, p.head_dim);
  hm(p.v_stride, p.seq_k, p.heads_kv, p.head_dim_v);
}

// The case's own q, k, v buffers (pc.tensors(), laid out with its strides) read with the strides of s, as a plan that
// kept s's strides reads them: the case with those values as explicit inputs. s's extents never pass the case's
// (head-major is contiguous), so every read is inside the case's buffers.
Case read_with_strides(const PreparedCase& pc, const Problem& s) {
  Case r = pc.the_case();
  const Problem& p = r.problem;
  auto read = [](const std::vector<float>& buf, const int64_t* own, const int64_t* as, int64_t B, int64_t S,
                 int64_t H, int64_t D) {
    std::vector<float> out = buf;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d)
            out[static_cast<size_t>(b * own[0] + i * own[1] + h * own[2] + d)] =
                buf[static_cast<size_t>(b * as[0] + i * as[1] + h * as[2] + d)];
    return out;
  };
  const Tensors& t = pc.tensors();
  ExplicitValues ev;
  ev.q = read(t.q, p.q_stride, s.q_stride, p.batch, p.seq_q, p.heads_q, p.head_dim);
  ev.k = read(t.k, p.k_stride, s.k_stride, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  ev.v = read(t.v, p.v_stride, s.v_stride, p.batch, p.seq_k, p.heads_kv, p.head_dim_v);
  r.explicit_values = std::move(ev);
  return r;
}

// Whether strides a and b address the same elements of a [B, S, H, D] tensor (a dimension of size 1 has no stride).
bool same_addresses(const int64_t* a, const int64_t* b, int64_t B, int64_t S, int64_t H) {
  const int64_t n[3] = {B, S, H};
  for (int i = 0; i < 3; ++i)
    if (n[i] > 1 && a[i] != b[i]) return false;
  return true;
}

}  // namespace

std::vector<RepeatSibling> repeat_siblings(const Case& c, bool strides) {
  std::vector<RepeatSibling> out;
  if (c.pass != Pass::kFwd || has_sequences(c.problem) || c.problem.variants) return out;
  auto add = [&](const char* differs, Case s, std::string value) {
    if (validate(s).empty()) out.push_back({differs, std::move(value), std::move(s)});
  };
  Case s = c;
  s.problem.scale = c.problem.scale != 0 ? c.problem.scale * 0.5f : 1.0f;
  char num[40];
  std::snprintf(num, sizeof num, "scale %.9g", static_cast<double>(s.problem.scale));
  add("scale", s, num);
  s = c;
  if (parse_mask(c.problem.mask_kind == AF_MASK_NONE ? "causal-br" : "none", s.problem).empty())
    add("mask", s, "mask " + mask_to_string(s.problem));
  const int32_t dt = c.problem.dtype;
  if (!c.explicit_values && (dt == AF_DTYPE_F32 || dt == AF_DTYPE_F16 || dt == AF_DTYPE_BF16)) {
    s = c;
    s.problem.dtype = dt == AF_DTYPE_F32 ? AF_DTYPE_F16 : AF_DTYPE_F32;
    add("dtype", s, std::string("dtype ") + dtype_name(s.problem.dtype));
  }
  if (strides && !c.explicit_values) {
    s = c;
    set_head_major(s.problem);
    const Problem& p = c.problem;
    if (!same_addresses(p.q_stride, s.problem.q_stride, p.batch, p.seq_q, p.heads_q) ||
        !same_addresses(p.k_stride, s.problem.k_stride, p.batch, p.seq_k, p.heads_kv) ||
        !same_addresses(p.v_stride, s.problem.v_stride, p.batch, p.seq_k, p.heads_kv))
      add("strides", s, "q, k, v strides [B, H, S, D]");
  }
  return out;
}

Judged check_after_sibling(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts) {
  // Every sibling is launched before the case, so each is the first call of whatever key a cache gives it: a cache
  // keyed without the mask alone then serves the case the mask sibling's plan (had the case run between them, it
  // would serve the case its own plan, and nothing would show).
  struct Launched {
    const RepeatSibling* sib;
    std::unique_ptr<PreparedCase> pc;
    RunOptions ko;
  };
  const std::vector<RepeatSibling> sibs = repeat_siblings(pc.the_case(), dev.backend() != Backend::kAdapter);
  std::vector<Launched> ran;
  for (const RepeatSibling& sib : sibs) {
    if (!case_unsupported_reason(k.kernel, sib.sibling.problem, sib.sibling.pass).empty()) continue;
    auto sp = std::make_unique<PreparedCase>(sib.sibling);
    const RunOptions ko = for_kernel(opts, k.kernel, sp->problem());
    if (launch_for_pass(dev, k, *sp, sp->tensors(), ko).launch.status == LaunchStatus::kOk)
      ran.push_back({&sib, std::move(sp), ko});
  }
  Judged j = check_case(dev, k, pc, opts);
  CheckResult& r = j.result;
  if (ran.empty() || r.verdict != Verdict::kFail || j.outcome.o.empty()) return j;
  const float* lse = k.kernel.writes_lse && !j.outcome.lse.empty() ? j.outcome.lse.data() : nullptr;
  std::string values;
  for (Launched& l : ran) {
    // What a plan kept from the sibling computes: its exact result, or (strides) the case's buffers read its way.
    std::unique_ptr<PreparedCase> read;
    if (l.sib->differs == "strides") read = std::make_unique<PreparedCase>(read_with_strides(pc, l.pc->problem()));
    PreparedCase& kept = read ? *read : *l.pc;
    CheckResult as_sibling;  // the outputs against what the kept plan computes
    compare_output(kept.view(), kept.oracle(l.ko.oracle), j.outcome.o.data(), lse, as_sibling);
    values += (values.empty() ? "" : ", ") + l.sib->value;
    if (as_sibling.verdict != Verdict::kPass) continue;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "right after the same shape with %s, the output is %s (%lld elements within its bound): a plan or "
                  "compiled-graph cache keyed without the %s (stale cache)",
                  l.sib->value.c_str(),
                  read ? "the exact result of this case's buffers read with those strides" : "that call's exact result",
                  static_cast<long long>(as_sibling.compared), l.sib->differs.c_str());
    r.failure = FailureClass::kIgnoredParameter;
    r.decided_by = "repeat-calls/stale-cache";
    r.evidence.push_back({"repeat-calls", buf});
    return j;
  }
  r.evidence.push_back({"repeat-calls", "checked right after the same shape with " + values +
                                            "; the output is none of those calls' results"});
  return j;
}

Judged check_in_modes(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts,
                      CheckModes m) {
  Judged j = m.repeat_calls ? check_after_sibling(dev, k, pc, opts) : check_case(dev, k, pc, opts);
  if (m.amplify) amplify_passing(dev, k, pc, opts, j);  // a pass whose variant effect is below the bound
  return j;
}

}  // namespace attnfuzz
