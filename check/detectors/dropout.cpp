// dropout.cpp - dropout: a failing dropout case judged with the scale 1 / p, then relaunched with dropout switched off.
//
// check_case already judged the mask itself (check/dropout.cpp: bytes, keep fraction, forward vs backward) and O /
// dQ / dK / dV exactly given the kernel's own (exported or reproduced) mask. Here: (1) O against the exact result
// with the kept weights scaled by 1 / p instead of 1 / (1 - p) (same mask); (2) the same inputs without dropout. A
// match of (1), or a pass of (2), puts the failure in dropout (its scale, or its mask: drawn from more than (seed,
// offset, b, h, i, j), a wrapped offset, a stale seed), since the rest of the kernel is then right on these inputs.
#include "check/compare.h"
#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

namespace {
// (1): the forward's O within the bound of the exact result scaled by 1 / p.
bool scale_probe(Context& c, Finding& f) {
  const Problem& p = c.pc.problem();
  if (c.gradient_failure() || !(p.dropout_p > 0) || c.pass() == Pass::kBwd) return false;
  Problem sp = p;
  sp.dropout_p = 1.0f - p.dropout_p;  // 1 / (1 - p') = 1 / p
  if (!(sp.dropout_p < 1)) return false;
  const OracleResult ex = c.oracle(sp, c.tensors());
  const CheckResult r = judge(sp, ex, c.original());
  if (r.verdict != Verdict::kPass) return false;
  f.fired = true;
  f.cls = FailureClass::kDropout;
  f.kind = "scale";
  f.evidence.push_back({"dropout", fmt("scale: O is within the bound of the exact result whose kept weights are scaled "
                                       "by 1 / p = %.6g instead of 1 / (1 - p) = %.6g (max ratio %.3g)",
                                       1.0 / p.dropout_p, 1.0 / (1.0 - p.dropout_p), r.max_ratio)});
  return true;
}
}  // namespace

Finding dropout(Context& c) {
  Finding f;
  const Case& orig = c.pc.the_case();
  if (!(orig.problem.variants & AF_VARIANT_DROPOUT)) return f;
  if (scale_probe(c, f)) return f;
  // (2): dropout switched off, the same inputs (generate() does not depend on the dropout fields).
  Case off = orig;
  off.problem.variants &= ~AF_VARIANT_DROPOUT;
  off.problem.dropout_p = 0;
  PreparedCase pc(off);
  const Judged j = check_case(c.dev, c.k, pc, c.opts);
  c.stats.launches += c.pass() == Pass::kFwdBwd ? 2 : 1;
  ++c.stats.oracles;
  if (j.result.verdict == Verdict::kUnsupported) {
    f.evidence.push_back({"dropout", "off: the kernel does not take the case without dropout (" + j.result.reason + ")"});
    return f;
  }
  if (j.result.verdict == Verdict::kOutsideContract) {
    f.evidence.push_back({"dropout", "off: without dropout the case is outside the contract (" + j.result.reason +
                                         "): no conclusion"});
    return f;
  }
  if (j.result.verdict != Verdict::kPass) {
    f.evidence.push_back({"dropout", fmt("off: without dropout the same inputs still fail (max ratio %.3g): the failure "
                                         "is not dropout's", j.result.max_ratio)});
    return f;
  }
  f.fired = true;
  f.cls = FailureClass::kDropout;
  f.kind = "off";
  const char* mask = orig.problem.dropout_rng == AF_DROPOUT_RNG_EXPORTED ? "the kernel's exported keep mask"
                                                                         : "the mask the declared generator draws";
  f.evidence.push_back({"dropout", fmt("off: the same inputs without dropout pass (max ratio %.3g), while the output "
                                       "with dropout p = %.6g is beyond the bound of the exact result given %s: the "
                                       "kept weights, their scale or the mask itself (drawn from more than (seed, "
                                       "offset, b, h, i, j)) is wrong",
                                       j.result.max_ratio, static_cast<double>(orig.problem.dropout_p), mask)});
  return f;
}

}  // namespace attnfuzz::detect
