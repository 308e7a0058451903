// verdict.h - what one kernel x case check concluded, with the evidence a report needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/problem.h"

namespace attnfuzz {

enum class Verdict {
  kPass,
  kFail,
  kUnsupported,      // the kernel does not claim this case
  kOutsideContract,  // exact scores or intermediates exceed the fp32 range: no verdict on the kernel
};
const char* verdict_name(Verdict v);

// The failure classes of docs/semantics.md.
enum class FailureClass {
  kNone,
  kRescale,
  kMask,
  kOobRead,
  kOobWrite,
  kBarrierRace,
  kNonFinite,
  kPrecision,
  kCrash,
  kHang,
  kLaunchError,
  // Added with issue 11 (docs/semantics.md table); appended so that existing ordinals stay put.
  kEmptyRow,   // a row with no key of positive weight is not O = 0, LSE = -inf
  kUnwritten,  // output elements keep the pre-launch poison under two poisons
  kLse,        // O within bound, LSE beyond it
  kSplitKv,    // failure appears / vanishes as the declared KV split count changes
  kTail,       // failure vanishes when the case is padded without changing the exact result
  kWrong,      // far beyond the bound with no signature
  // Added with issue 28 (appended: ordinals stay put).
  kIgnoredParameter,  // the output matches the exact result with a variant's parameter switched off / replaced
  // Added with issue 29 (appended).
  kMerge,  // a merge of partial attention states is wrong: it depends on the states' layout or their LSE level
  kDropout,  // the keep mask or its scaling is wrong: exact given the mask fails only through dropout, the keep
             // fraction is not Binomial(n, 1 - p), forward and backward masks differ, or the mask depends on
             // more than (seed, offset, b, h, i, j)
  // Added with issue 30 item 6a (appended).
  kAcceptedMalformed,  // malformed sequence metadata (Case::seqs.malformed) accepted: the launch returned 0 where
                       // no right answer exists, or a result other than the right one
  kLastClass = kAcceptedMalformed,
};
const char* failure_class_name(FailureClass c);  // "rescale", "oob-read", "launch-error", ...
bool parse_failure_class(const std::string& text, FailureClass& out);

// One compared output element (O or LSE).
struct ElementReport {
  bool is_lse = false;
  int64_t b = 0, h = 0, s = 0, d = 0;  // d unused for LSE
  double expected = 0;                 // exact value (double rounding of the exact result)
  double got = 0;                      // what the kernel wrote (float widened)
  double bound = 0;                    // allowed |got - expected|
  double ratio = 0;                    // |got - expected| / bound; +inf for a NaN/Inf mismatch
  std::string tensor;  // backward: "dQ", "dK", "dV", "dSink" (h) or "dBias" (b, h, s = i, d = j) (then h is the KV head and s the key for dK / dV;
                       // is_lse false); empty: O or LSE (is_lse)
};
// The element as reasons, the console and JUnit name it: "O[b=0,s=3,h=1,d=2]", "LSE[b=0,h=1,s=3]",
// "dK[b=0,j=4,h=0,d=1]" (O, dQ, dK, dV in their storage order b, s|j, h, d; LSE in b, h, s).
std::string element_name(const ElementReport& e);

// A piece of evidence: what a detector did and saw, in words a kernel engineer reads.
struct Evidence {
  std::string detector;  // "canary", "compare", "reorder", ...
  std::string detail;
};

struct CheckResult {
  std::string kernel;
  std::string backend;
  std::string device;
  Verdict verdict = Verdict::kPass;
  FailureClass failure = FailureClass::kNone;
  std::string reason;                 // one line: why unsupported / outside contract / failed
  std::vector<Evidence> evidence;
  std::vector<ElementReport> worst;   // worst elements, highest ratio first
  double max_ratio = 0;               // max |err| / bound over the compared elements
  double max_abs_err = 0;
  double baseline_max_ratio = 0;      // same for the plain fp32 reference (flash-attention rule)
  int64_t compared = 0;               // elements compared
  int64_t failed = 0;                 // elements over their bound (or NaN/Inf mismatched)
  double launch_ms = 0;
  double oracle_ms = 0;
  std::string tensor;  // a failed backward check: the first failing tensor ("dQ", "dK", "dV"; "O" / "LSE" when
                       // the forward of a fwd+bwd case failed); empty otherwise
  // A classified failure: the detector that named the class and the kind of its evidence ("mask/other-mask",
  // "reorder", "empty-row"; "check" when no detector decided); empty before classification. The failure's
  // signature and the minimizer keep it.
  std::string decided_by;
};

}  // namespace attnfuzz
