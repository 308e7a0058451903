// relations.h - internal to properties/: the machinery the properties share (devices, one run of a case,
// relating the rows of two runs, the failure record) and the property bodies (metamorphic.cpp).
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnfuzz/device.h"
#include "check/runner.h"
#include "oracle/oracle.h"
#include "properties/properties.h"

namespace attnfuzz::props::detail {

extern std::string g_adapter_command;  // use_adapter(): every "device" is the adapter

// The cpu devices, one per thread order, made once per process (with an adapter: three adapter devices,
// the orders do not apply there).
struct Devices {
  std::unique_ptr<Device> forward, reverse, shuffle;
  RunOptions run;
  Devices();
};
Devices& devices();

// The last failure a property body saw: the cases that show it (role, case) and extra attn-check flags.
// RapidCheck's final counterexample is its last failing evaluation, so after a run this is the minimal one.
struct FailureRecord {
  std::string why;
  std::vector<std::pair<std::string, Case>> cases;
  std::string flags;  // e.g. " --order reverse"
  ThreadOrder order = ThreadOrder::kForward;
  uint64_t order_seed = 1;
};
extern FailureRecord g_failure;
extern int64_t g_unsupported;  // generated cases the kernel refused, in this run

std::string fmt(double x);
std::string fmt_where(int64_t b, int64_t s, int64_t h, int64_t d);
// A case with the given tensors as its explicit values (the base case's spec stays as provenance).
Case with_values(const Case& base, std::vector<float> q, std::vector<float> k, std::vector<float> v,
                 const std::string& label);

// One launch of kernel k on case c, with the exact result for the bounds.
struct Run {
  Tensors t;
  LaunchOutcome out;
  OracleResult exact;
};
Run run_case(const KernelEntry& k, const Case& c, Device& dev, bool need_oracle = true);

void record(std::string why, std::vector<std::pair<std::string, Case>> cases, std::string flags = "",
            ThreadOrder order = ThreadOrder::kForward, uint64_t order_seed = 1);
// Fails the case (after recording it) unless the launch ran to completion.
void require_launched(const Run& r, const std::string& role,
                      const std::vector<std::pair<std::string, Case>>& cases);

// A row of case A and the row of case B whose exact result is the same.
struct RowPair {
  int64_t ba, ha, sa, bb, hb, sb;
};
bool same_bits(float x, float y);
// Whether x (from A) and y (from B) agree: NaN with NaN, equal infinities, finite values within tol
// (bitwise when `bitwise`). Fills why otherwise.
bool agree(double x, double y, double tol, bool bitwise, std::string& why);
// Checks every O (and, when both runs wrote it and `lse`, LSE) element of the paired rows. Rows the oracle
// did not compute or found outside the fp32 contract in either case are not judged.
bool relate(const Problem& pa, const Run& a, const Problem& pb, const Run& b,
            const std::vector<RowPair>& rows, bool bitwise, bool lse, std::string& why);
std::vector<RowPair> identity_rows(const Problem& p, const std::vector<bool>& keep);
bool supported(const KernelEntry& k, const Problem& p);  // false (counted, tagged) when k refuses p
// Runs A and B and asserts the relation on `rows`.
void assert_relation(const KernelEntry& k, const Case& a, const Case& b, const std::vector<RowPair>& rows,
                     bool bitwise, bool lse, const std::string& what);

// How a property replaces values it changes.
enum class Fill { kFresh, kFreshLarge, kNaN, kPosInf, kNegInf, kHuge, kZero };
const char* fill_name(Fill f);
float fill_value(Fill f, Rng& rng);
// The fills allowed by the case's value domain (finite: no NaN / Inf fills; activations: fresh, zero).
std::vector<Fill> in_domain(const Case& c, std::vector<Fill> fills);

}  // namespace attnfuzz::props::detail
