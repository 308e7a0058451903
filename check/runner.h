// runner.h - runs one kernel on one case on a device and judges it: guarded buffers, launch, canaries, oracle, compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/verdict.h"
#include "check/guarded.h"
#include "oracle/oracle.h"

namespace attnfuzz {

// A second, finite output poison (-1677.18f): the unwritten detector relaunches with it (an element that
// keeps kOutputPoison and then this one was never written).
constexpr uint32_t kOutputPoisonAlt = 0xc4d1a5e7u;

struct RunOptions {
  size_t guard_bytes = 64 * 1024;     // each side of every buffer: a tail tile reading past the end lands here
  uint32_t guard_poison = kGuardPoison;
  uint32_t output_poison = kOutputPoison;  // written into O / LSE / workspace before the launch
  size_t worst = 8;                   // worst elements kept in the result
  OracleOptions oracle;
};

// A case with its values and (computed on first use) its exact result: shared by every kernel checked on it.
class PreparedCase {
 public:
  explicit PreparedCase(Case c);
  const Case& the_case() const { return case_; }
  const Problem& problem() const { return case_.problem; }
  const Tensors& tensors() const { return tensors_; }
  const OracleResult& oracle(const OracleOptions& o);  // computed once

 private:
  Case case_;
  Tensors tensors_;
  std::optional<OracleResult> oracle_;
};

// The raw outcome of one launch on guarded buffers.
struct LaunchOutcome {
  LaunchResult launch;
  std::vector<float> o, lse;          // downloaded outputs (lse empty if the kernel does not write it)
  std::vector<CanaryHit> canaries;    // changed guard words (first few per buffer)
  size_t canary_words = 0;            // total changed guard words
  int64_t unwritten = 0;              // output elements still holding the pre-launch poison (output_poison)
  // A crashing launch that faulted in the guard pages around a buffer (cpu backend): which buffer, the byte
  // offset from its payload's start (negative = before it), and in words.
  std::string fault_buffer;
  int64_t fault_offset = 0;
  std::string fault_where;  // "16777216 bytes past the end of buffer o"
};

// Allocates guarded q/k/v/o/lse/workspace, uploads the inputs, poisons the outputs, launches, checks canaries.
LaunchOutcome launch_guarded(Device& dev, const KernelEntry& k, const Problem& p, const Tensors& t,
                             const RunOptions& opts);

// What check_case produces: the verdict and, for the heatmap, |err|/bound over (query row x Dv).
struct Judged {
  CheckResult result;
  std::vector<double> ratio_map;  // Sq x Dv (s * Dv + d), max over batch and heads; NaN = not compared
  LaunchOutcome outcome;
};

// The whole check of one kernel on one case: support, launch, canaries, oracle, comparison, verdict.
Judged check_case(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts);

}  // namespace attnfuzz
