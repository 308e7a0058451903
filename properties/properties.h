// properties.h - metamorphic and oracle properties of one kernel, run with RapidCheck; failures shrink and
// are saved.
//
// Each property is stated for one kernel and every case the generator yields (properties/README.md has
// the exact statements and tolerances). run_property() runs RapidCheck on it with fixed or RC_PARAMS-given
// parameters; when it fails, the shrunk counterexample is saved as corpus file(s) and reported with the
// RapidCheck reproduce string and the attn-check replay command.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/registry.h"
#include "properties/generators.h"

namespace attnfuzz::props {

enum class Property {
  kOracle,           // check_case verdict is pass or outside-contract
  kKeyPermutation,   // permuting keys and values together (within equal-visibility groups) keeps O, LSE
  kKeyShift,         // adding one vector to every key (exactly, in fp32) keeps O
  kCausalPrefix,     // changing keys/values a row cannot see (to anything, NaN/Inf included) keeps its O, LSE
  kRowIndependence,  // changing other query rows (to anything) keeps a row's O, LSE
  kBatchHead,        // a batched multi-head run equals one single-head run per (b, h) (backward: dK / dV of a
                     // kv head equal the sum over its query heads)
  kDeterminism,      // forward, reverse and shuffled emulator thread orders give the same bits
  kPacking,          // a varlen / KV-cache / paged batch equals its sequences run one by one (same layout)
  kVariants,  // score-variant identities: sinks of -inf = no sink; a huge softcap = no softcap; ALiBi = its
              // bias tensor; a bias constant along each row leaves O unchanged (issue 28)
  kMerge,     // merge kernels (issue 29): an extra empty state is the identity; other split points (and state
              // layouts) give the same merged result within the composed bounds
  kDropout,  // dropout with p = 0 equals no dropout; the same (seed, offset) twice gives the same bits (issue
             // 29)
  kMasks,  // custom-mask identities: all-ones dense = no mask; the causal pattern = mask_kind causal; bits =
           // dense of the same pattern; all-partial blocks = the custom mask; all-full = none (issue 28)
  kKvShared,  // V a view of K's rows (one buffer) gives the same bits as V copied out (issue 28 item 5)
};
const std::vector<Property>& all_properties();
const char* property_name(Property p);       // "oracle", "key-permutation", ...
const char* property_statement(Property p);  // one sentence
bool parse_property(const std::string& text, Property& out);

// The case limits a property draws from for kernel k (e.g. masked-key invariance needs a mask).
CaseLimits property_limits(Property p, const af_kernel& k);

struct PropertyOptions {
  int max_success = 20;  // cases per run (ignored when RC_PARAMS is set: it then decides)
  uint64_t seed = 0;     // 0: derived from property and kernel names (fixed); ignored with RC_PARAMS
  bool shrink = true;
  bool strict = false;        // relations of rows that no correct kernel computes differently (causal
                              // prefix, row independence, batch/head) must hold bitwise, not just within
                              // the combined bound
  bool use_rc_params = true;  // RC_PARAMS, when set in the environment, overrides max_success and seed
  std::filesystem::path out;  // where failing cases go; empty: $ATTNFUZZ_PROPERTY_OUT, else
                              // <build>/property-failures
  bool quiet = false;         // no report on stderr
  ValueDomain domain = ValueDomain::kIeee;  // generated cases and perturbations (finite: no NaN / Inf)
  int32_t dtype = AF_DTYPE_F32;             // dtype of generated cases (CaseLimits::dtype)
  // The pass of generated cases (issue 14). Backward: oracle judges dQ / dK / dV, key-permutation permutes
  // dK / dV rows with the keys (dQ unchanged), batch-head relates dQ per (b, h) and dK / dV per kv head to the
  // sum of its query heads' single-head runs, determinism compares the gradients' bits; the other
  // properties are forward relations and pass without running. A kernel without launch_bwd passes with 0 tests.
  Pass pass = Pass::kFwd;
};

struct PropertyOutcome {
  bool passed = false;
  bool gave_up = false;                      // RapidCheck discarded too many cases
  int tests = 0;                             // successful cases run
  int64_t unsupported = 0;                   // generated cases the kernel refused (check_support)
  std::string rc_message;                    // RapidCheck's own result text (counterexample, shrinks)
  std::string reproduce;                     // RC_PARAMS="reproduce=..." for this failure
  std::string failure;                       // our one-line reason of the minimal failure
  std::string minimal_case;                  // describe() of the minimal case (case A)
  std::vector<std::filesystem::path> saved;  // corpus files of the minimal failure
  std::vector<std::string> replay;           // one attn-check command per saved file
  double seconds = 0;
};

// Runs the properties on the kernels of an adapter process (adapters/PROTOCOL.md) instead of the cpu
// emulator: call before the first property; opens the adapter (registering its kernels). Throws DeviceError.
void use_adapter(const std::string& command);

// RapidCheck id of a (property, kernel) run: "<property>/<kernel>", the key of RC_PARAMS reproduce=.
std::string property_id(Property p, const KernelEntry& k);

// Runs property p on kernel k (a cpu kernel) and reports. Never throws on a property failure.
PropertyOutcome run_property(Property p, const KernelEntry& k, const PropertyOptions& opts = {});

// The property body for one case (RC_ASSERT / RC_FAIL inside; draws extra values with *gen): usable in
// one's own rc::check. Records the case(s) of a failure for run_property's report.
void check_property(Property p, const KernelEntry& k, const Case& c, bool strict = false);

}  // namespace attnfuzz::props
