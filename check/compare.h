// compare.h - the NaN-safe comparison of a kernel's O / LSE against the oracle's exact values and bounds.
#pragma once

#include <cstdint>
#include <vector>

#include "attnfuzz/verdict.h"
#include "oracle/grad.h"
#include "oracle/oracle.h"

namespace attnfuzz {

// How one element compares. NaN or Inf on one side only always fails; NaN vs NaN and equal infinities
// pass; a finite pair fails when |got - expected| > bound (ratio > 1).
struct ElementJudgement {
  double err = 0;    // |got - expected| for a finite pair, +inf for a non-finite mismatch, else 0
  double ratio = 0;  // err / bound (0 when err == 0, +inf when bound == 0 < err or a mismatch)
  bool fail = false;
  bool nonfinite_mismatch = false;
};
ElementJudgement judge_element(double expected, double got, double bound);

struct CompareOptions {
  size_t worst = 16;      // how many worst elements CheckResult::worst keeps
  bool check_lse = true;  // compare LSE when the kernel wrote it (lse != nullptr)
  double flash_k = 2;     // flash-attention rule factor (reported as evidence, see compare.cpp)
};

// Compares kernel output o (host floats with p's o strides) and optional lse (p's lse strides, or
// nullptr) against `exact` (computed for the same problem and inputs). Only the rows the oracle computed
// are compared. Fills r's verdict, failure, reason, worst, max_ratio, max_abs_err, baseline_max_ratio,
// compared, failed and appends evidence. Returns the ratio map [Sq x Dv] (row-major s * Dv + d): the max
// ratio over batch and heads (an LSE ratio counts for every d of its row), +inf for a NaN/Inf mismatch,
// NaN where nothing was compared (row not sampled, or outside the fp32 contract).
//
// Verdicts: kFail (class kNonFinite if any element is a NaN/Inf mismatch, else kPrecision) when an
// element of an inside-contract row fails; otherwise kOutsideContract when some compared row lies outside
// the fp32 contract (those rows are not judged at all, NaN/Inf included: docs/semantics.md: the verdict then
// names the contract instead of blaming the kernel); otherwise kPass.
std::vector<double> compare_output(const Problem& p, const OracleResult& exact, const float* o,
                                   const float* lse, CheckResult& r, const CompareOptions& opts = {});

// One gradient tensor's heatmap: |err| / bound, max over batch and heads, rows x cols row-major (dQ: Sq x D,
// dK: Sk x D, dV: Sk x Dv); +inf for a NaN/Inf mismatch, NaN where nothing was compared.
struct GradMap {
  std::string tensor;  // "dQ", "dK", "dV"
  int64_t rows = 0, cols = 0;
  std::vector<double> ratio;
};

// The backward counterpart of compare_output: dq, dk, dv (host floats with p's q / k / v strides) against
// the gradient oracle g, element by element with judge_element, only where g computed them (sampling).
// Fills r like compare_output (ElementReport::tensor names dQ / dK / dV) and r.tensor with the tensor of the
// worst failing element; evidence "compare" counts failures per tensor. Outside the fp32 contract
// (!g.inside_contract) nothing is judged: kOutsideContract with g.why. Returns the three maps.
// With score variants the d sink [Hq] and d bias (bias_stride) the kernel wrote are judged too (tensors "dSink"
// and "dBias"); nullptr where the problem has no such gradient.
std::vector<GradMap> compare_gradients(const Problem& p, const GradResult& g, const float* dq, const float* dk,
                                       const float* dv, CheckResult& r, const CompareOptions& opts = {},
                                       const float* dsinks = nullptr, const float* dbias = nullptr);

}  // namespace attnfuzz
