// relations.cpp - the machinery the properties share: devices, one run of a case, relating two runs' rows.
#include "properties/relations.h"

#include "attnfuzz/dropout.h"

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
#include <optional>
#include <sstream>

#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/problem.h"
#include "check/merge.h"
#include "check/runner.h"
#include "check/sequences.h"
#include "oracle/oracle.h"

namespace attnfuzz::props::detail {

std::string g_adapter_command;  // use_adapter(): every "device" is the adapter

Devices::Devices() {
  // One worker per device: properties run many small launches, and ctest runs test binaries side by
  // side. ATTNFUZZ_PROPERTY_ISOLATE=0 runs launches in-process (faster; a crashing kernel ends the run).
  DeviceOptions o;
  o.workers = 1;
  if (const char* e = std::getenv("ATTNFUZZ_PROPERTY_ISOLATE"); e && std::string(e) == "0") o.isolate = false;
  o.adapter_command = g_adapter_command;
  const char* backend = g_adapter_command.empty() ? "cpu" : "adapter";
  forward = open_device(backend, o);
  o.order = ThreadOrder::kReverse;
  reverse = open_device(backend, o);
  o.order = ThreadOrder::kShuffle;
  shuffle = open_device(backend, o);
  run.oracle.baseline = false;  // relations need bounds only
}

Devices& devices() {
  static Devices d;
  return d;
}

FailureRecord g_failure;
int64_t g_unsupported = 0;

std::string fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", x);
  return b;
}

std::string fmt_where(int64_t b, int64_t s, int64_t h, int64_t d) {
  return "[b=" + std::to_string(b) + "," + std::to_string(s) + ",h=" + std::to_string(h) +
         ",d=" + std::to_string(d) + "]";
}

// A case with the given tensors as its explicit values (the base case's spec stays as provenance).
Case with_values(const Case& base, std::vector<float> q, std::vector<float> k, std::vector<float> v,
                 const std::string& label) {
  Case c = base;
  c.explicit_values = ExplicitValues{std::move(q), std::move(k), std::move(v)};
  c.label = label;
  // A relation's transform of activations (a key shift, a scaled V) may pass |x| <= 64: checked as finite.
  if (c.values.domain == ValueDomain::kActivations && !validate(c).empty())
    c.values.domain = ValueDomain::kFinite;
  return c;
}

Run run_case(const KernelEntry& k, const Case& c, Device& dev, bool need_oracle) {
  Run r;
  r.t = generate(c);
  if (is_merge(c.problem)) {  // merged states (issue 29): the states, and the whole problem's composed bound
    make_states(c, r.t);
    r.out = launch_guarded(dev, k, c.problem, r.t, devices().run);
    if (need_oracle) {
      OracleResult m = merge_oracle(c.problem, r.t, devices().run.oracle);
      std::optional<OracleResult> w = merge_whole_oracle(c, r.t, m, devices().run.oracle);
      r.exact = w ? std::move(*w) : std::move(m);
    }
    return r;
  }
  if (has_backward(c.pass)) {  // the launch of the case's pass (backward given the exact O / LSE)
    PreparedCase pc(c);
    r.out = launch_for_pass(dev, k, pc, r.t, devices().run);
  } else {
    r.out = launch_guarded(dev, k, c.problem, r.t, devices().run);
  }
  if (need_oracle) {
    VariantInputs vars = r.t.variant_inputs();
    // Dropout (issue 29): the launch's exported mask, else the case's reference mask (the declared generator's)
    const std::vector<uint8_t> keep = !r.out.keep.empty() ? r.out.keep : reference_keep_mask(c.problem);
    if (!keep.empty()) vars.dropout_keep = keep.data();
    r.exact = compute_oracle(c.problem, r.t.q.data(), r.t.k.data(), r.t.v.data(), vars, devices().run.oracle);
  }
  return r;
}

void record(std::string why, std::vector<std::pair<std::string, Case>> cases, std::string flags,
            ThreadOrder order, uint64_t order_seed) {
  g_failure = FailureRecord{std::move(why), std::move(cases), std::move(flags), order, order_seed};
}

// Fails the case (after recording it) unless the launch ran to completion.
void require_launched(const Run& r, const std::string& role,
                      const std::vector<std::pair<std::string, Case>>& cases) {
  if (r.out.launch.status == LaunchStatus::kOk) return;
  const std::string why =
      "launch of case " + role + ": " + launch_status_name(r.out.launch.status) + " " + r.out.launch.message;
  record(why, cases);
  RC_FAIL(why);
}

bool same_bits(float x, float y) {
  if (std::isnan(x) && std::isnan(y)) return true;
  uint32_t a, b;
  std::memcpy(&a, &x, 4);
  std::memcpy(&b, &y, 4);
  return a == b;
}

// Whether x (from A) and y (from B) agree: NaN with NaN, equal infinities, finite values within tol
// (bitwise when `bitwise`). Fills why otherwise.
bool agree(double x, double y, double tol, bool bitwise, std::string& why) {
  if (bitwise) {  // x, y are floats then (a sum of one float is that float)
    if (same_bits(static_cast<float>(x), static_cast<float>(y))) return true;
    why = fmt(x) + " vs " + fmt(y) + " (bitwise required)";
    return false;
  }
  if (std::isnan(x) || std::isnan(y)) {
    if (std::isnan(x) && std::isnan(y)) return true;
    why = fmt(x) + " vs " + fmt(y) + " (NaN on one side only)";
    return false;
  }
  if (std::isinf(x) || std::isinf(y)) {
    if (x == y) return true;
    why = fmt(x) + " vs " + fmt(y) + " (Inf on one side only)";
    return false;
  }
  const double diff = std::fabs(x - y);
  if (std::isnan(tol) || diff <= tol) return true;
  why = fmt(x) + " vs " + fmt(y) + ": |diff| " + fmt(diff) + " > bound(A) + bound(B) = " + fmt(tol);
  return false;
}

// Checks every O (and, when both runs wrote it and `lse`, LSE) element of the paired rows. Rows the oracle
// did not compute or found outside the fp32 contract in either case are not judged.
bool relate(const Problem& pa, const Run& a, const Problem& pb, const Run& b,
            const std::vector<RowPair>& rows, bool bitwise, bool lse, std::string& why) {
  const bool with_lse = lse && !a.out.lse.empty() && !b.out.lse.empty();
  for (const RowPair& r : rows) {
    const RowInfo& ia = a.exact.row(r.ba, r.ha, r.sa);
    const RowInfo& ib = b.exact.row(r.bb, r.hb, r.sb);
    if (!ia.computed || !ib.computed || !ia.inside_contract() || !ib.inside_contract()) continue;
    const std::string where =
        "row (b=" + std::to_string(r.ba) + " h=" + std::to_string(r.ha) + " s=" + std::to_string(r.sa) + ")";
    for (int64_t d = 0; d < pa.head_dim_v; ++d) {
      const float x = a.out.o[o_index(pa, r.ba, r.sa, r.ha, d)];
      const float y = b.out.o[o_index(pb, r.bb, r.sb, r.hb, d)];
      const double tol = a.exact.o_bound[a.exact.o_at(r.ba, r.sa, r.ha, d)] +
                         b.exact.o_bound[b.exact.o_at(r.bb, r.sb, r.hb, d)];
      std::string w;
      if (!agree(x, y, tol, bitwise, w)) {
        why = where + " O[d=" + std::to_string(d) + "]: " + w;
        return false;
      }
    }
    if (with_lse) {
      const float x = a.out.lse[lse_index(pa, r.ba, r.ha, r.sa)];
      const float y = b.out.lse[lse_index(pb, r.bb, r.hb, r.sb)];
      const double tol = a.exact.lse_bound[a.exact.lse_at(r.ba, r.ha, r.sa)] +
                         b.exact.lse_bound[b.exact.lse_at(r.bb, r.hb, r.sb)];
      std::string w;
      if (!agree(x, y, tol, bitwise, w)) {
        why = where + " LSE: " + w;
        return false;
      }
    }
  }
  return true;
}

std::vector<RowPair> identity_rows(const Problem& p, const std::vector<bool>& keep) {
  std::vector<RowPair> rows;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s)
        if (keep.empty() || keep[s]) rows.push_back({b, h, s, b, h, s});
  return rows;
}

bool supported(const KernelEntry& k, const Problem& p) {
  if (unsupported_reason(k.kernel, p).empty()) return true;
  ++g_unsupported;
  RC_TAG("unsupported");
  return false;
}

// Runs A and B and asserts the relation on `rows`.
void assert_relation(const KernelEntry& k, const Case& a, const Case& b, const std::vector<RowPair>& rows,
                     bool bitwise, bool lse, const std::string& what) {
  const std::vector<std::pair<std::string, Case>> cases{{"A", a}, {"B", b}};
  Device& dev = *devices().forward;
  const Run ra = run_case(k, a, dev);
  require_launched(ra, "A", cases);
  const Run rb = run_case(k, b, dev);
  require_launched(rb, "B", cases);
  std::string why;
  if (!relate(a.problem, ra, b.problem, rb, rows, bitwise, lse, why)) {
    why = what + ": " + why;
    record(why, cases);
    RC_FAIL(why);
  }
}

const char* fill_name(Fill f) {
  static const char* n[] = {"fresh", "fresh x100", "nan", "+inf", "-inf", "huge", "zero"};
  return n[static_cast<int>(f)];
}
float fill_value(Fill f, Rng& rng) {
  switch (f) {
    case Fill::kFresh:
      return static_cast<float>(2 * rng.uniform01() - 1);
    case Fill::kFreshLarge:
      return static_cast<float>(200 * rng.uniform01() - 100);
    case Fill::kNaN:
      return std::numeric_limits<float>::quiet_NaN();
    case Fill::kPosInf:
      return std::numeric_limits<float>::infinity();
    case Fill::kNegInf:
      return -std::numeric_limits<float>::infinity();
    case Fill::kHuge:
      return rng.below(2) ? std::numeric_limits<float>::max() : -std::numeric_limits<float>::max();
    case Fill::kZero:
      return 0.0f;
  }
  return 0;
}

// The fills allowed by the case's value domain (finite: no NaN / Inf fills; activations: fresh, zero).
std::vector<Fill> in_domain(const Case& c, std::vector<Fill> fills) {
  if (c.values.domain == ValueDomain::kFinite)
    std::erase_if(fills, [](Fill f) { return f == Fill::kNaN || f == Fill::kPosInf || f == Fill::kNegInf; });
  if (c.values.domain == ValueDomain::kActivations)
    std::erase_if(fills, [](Fill f) { return f != Fill::kFresh && f != Fill::kZero; });
  return fills;
}

}  // namespace attnfuzz::props::detail
