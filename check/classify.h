// classify.h - refines a failed check's class with detectors (second output poison, poison swap, thread orders,
// reruns, masks, empty rows, LSE relation, key order, sanitizers, error/bound limit) and adds their evidence.
//
// check_case() names a first class from what it saw directly: crash / hang / launch-error from the
// launch, oob-write from the canaries, non-finite or precision from the comparison. classify_failure()
// then runs experiments on the same kernel and case, in the order of class_precedence(), and replaces
// the class with the first one whose detector fires (check/README.md: what each detector does and costs).
// Detection uses only the case, the outputs and the experiments, never the kernel's name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/verdict.h"
#include "check/runner.h"

namespace attnfuzz {

struct ClassifyOptions {
  bool enabled = true;
  // Detector switches (all on by default).
  bool poison = true;    // oob-read: guard poison NaN <-> finite
  bool schedule = true;  // barrier-race: cpu thread orders / GPU bitwise reruns
  bool mask = true;  // mask: rows written empty, masked NaN, shifted / other-alignment oracles, perturbation
  bool split_kv = true;  // split-kv: the failing case at every KV split count the kernel declares
  bool tail = true;      // tail: the case padded (D/Dv, query rows, invisible keys) with its exact result kept
  bool reorder = true;  // rescale: the row's max key first vs last
  bool unwritten = true;  // unwritten: elements that keep the output poison under a second poison
  bool empty_row = true;  // empty-row: rows with no key of positive weight not O = 0, LSE = -inf
  bool lse = true;        // lse: O within bound, LSE beyond (relation: factor, offset, sign, row max)
  // cpu backend: the schedule detector tries forward, reverse and shuffle with these seeds (the order the
  // check ran with is skipped).
  std::vector<uint64_t> shuffle_seeds = {11, 12};
  // GPU backends: bitwise reruns of the failing case (any bit difference = barrier-race). On the cpu
  // backend a launch is deterministic for a given order, so reruns are 0 there unless set here.
  int reruns = 5;
  int cpu_reruns = 0;
  // ThreadSanitizer (cpu backend): re-run the case in the TSan build of attn-check and attach its races.
  bool tsan = false;
  std::string tsan_binary;                // "" = $ATTNFUZZ_TSAN_ATTN_CHECK, else default_tsan_binary()
  std::vector<std::string> plugins;       // plug-ins the tool loaded (passed on to the subprocess)
  std::vector<std::string> tsan_plugins;  // TSan-instrumented plug-ins; empty = for each plug-in, a file of
                                          // the same name in <tsan binary>/../../lib, else the plug-in itself
  // compute-sanitizer (nvidia backend): racecheck, synccheck and memcheck on the case, when on PATH.
  bool compute_sanitizer = false;
  std::string compute_sanitizer_binary = "compute-sanitizer";
  std::string self_binary;      // the attn-check to run under compute-sanitizer; "" = /proc/self/exe
  double tool_timeout_s = 300;  // per subprocess
  std::string work_dir;         // where subprocess case files go; "" = a fresh directory in $TMPDIR
};

// Classes in the order they win when several detectors fire (check/README.md explains why):
// oob-write > unwritten > oob-read > barrier-race > mask > empty-row > split-kv > tail > lse > rescale >
// non-finite > precision > wrong (the mask-model fit runs after the reorder detector).
const std::vector<FailureClass>& class_precedence();

// What classification cost and decided.
struct ClassifyStats {
  bool ran = false;
  std::string decided_by;  // detector that named the class ("poison-swap", "schedule", ...; "check" = kept)
  int launches = 0;        // extra kernel launches
  int oracles = 0;         // extra oracle computations
  double ms = 0;
};

// Refines j.result (a kFail from check_case of kernel k on pc with opts) in place: sets failure,
// appends evidence. Leaves crash / hang / launch-error / oob-write and non-failures alone (oob-write
// gets no more experiments: it already has the highest precedence). Never throws for kernel misbehaviour;
// a detector that cannot run says so in its evidence.
ClassifyStats classify_failure(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts,
                               Judged& j, const ClassifyOptions& co = {});

// ---- external tools (exposed for tests) --------------------------------------------------------------

// One "WARNING: ThreadSanitizer: data race" block.
struct TsanRace {
  std::string variable;  // __shared__ variable named in both source lines, else TSan's location line
  std::string access, previous_access;  // "write of size 4", "read of size 4"
  std::string site, previous_site;      // "online_row_bugs.hip:52" (innermost frame with a source line)
  std::string code, previous_code;      // the source text of those lines (when the file is readable)
};
std::vector<TsanRace> parse_tsan_report(const std::string& text);
std::string describe(
    const TsanRace& r);  // "variable coef: write at a.hip:52 `coef[0] = alpha;` vs read at ..."

// A report on the emulator's thread-local thread ids (a kernel launch line against a threadIdx read of an
// earlier launch): a known false report of the emulator under TSan, not kernel data (check/README.md).
bool is_emulator_bookkeeping(const TsanRace& r);

// The configured TSan attn-check (CMake cache ATTNFUZZ_TSAN_ATTN_CHECK, default <build>/tsan/bin/attn-check).
std::string default_tsan_binary();

// compute-sanitizer's findings of one tool.
struct SanitizerReport {
  std::string tool;                   // racecheck | synccheck | memcheck
  int errors = -1;                    // from "ERROR SUMMARY: N errors"; -1 when absent
  std::vector<std::string> findings;  // first lines of each reported hazard / error
};
SanitizerReport parse_compute_sanitizer(const std::string& tool, const std::string& text);
// The class compute-sanitizer's reports show: memcheck write > memcheck read > racecheck / synccheck hazards
// (barrier-race); kNone when every tool reported 0 errors (or could not say).
FailureClass sanitizer_class(const std::vector<SanitizerReport>& reports);

// ---- audit of passing cases (issue 11 item 7) ---------------------------------------------------------

// What audit_passing_case did.
struct AuditStats {
  bool ran = false;    // an experiment ran (false: nothing to audit with on this backend)
  bool found = false;  // a hazard turned the pass into a failure
  int launches = 0;
  double ms = 0;
};

// Race and memory checks on a case whose check PASSED (j.result.verdict == kPass; anything else is left
// alone). On a GPU a missing barrier often gives deterministic, plausible output, so a pass proves little:
//   nvidia: compute-sanitizer racecheck, synccheck and memcheck on the case (co.compute_sanitizer_binary);
//   cpu:    the other thread orders (forward, reverse, shuffled); with co.tsan also the TSan build.
// A hazard turns j.result into a failure: barrier-race (racecheck / synccheck / thread orders / TSan),
// oob-write or oob-read (memcheck), with the tools' lines as evidence and an "audit" evidence line first.
AuditStats audit_passing_case(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts,
                              Judged& j, const ClassifyOptions& co = {});

}  // namespace attnfuzz
