// merge.h - the exact merge of given partial attention states (issue 29): O = sum_s exp(LSE_s - LSE) O_s,
// LSE = log sum_s exp(LSE_s), with the bound of an fp32 merge and the output's rounding (oracle/README.md).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "attnfuzz/case.h"
#include "oracle/oracle.h"

namespace attnfuzz {

// One row's merge weights: m = max_s LSE_s, w[s] = exp(LSE_s - m) (0 for an empty state), sum = sum_s w[s];
// empty: every state empty (m = -inf); nan: some LSE_s is NaN; inf: some LSE_s is +inf.
struct MergeWeights {
  double m = -INFINITY, sum = 0;
  std::vector<double> w;
  int64_t nonempty = 0;
  bool empty = true, nan = false, inf = false;
};
MergeWeights merge_weights(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t s);

// The exact merge of t.state_o / t.state_lse for merge case problem p, in p's dense view ([B, max Sq, Hq, Dv];
// rows past a sequence are not computed). A row whose states are all empty is fully masked (O = 0, LSE = -inf);
// a NaN LSE_s makes the row NaN; an LSE_s of +inf puts the row outside the contract. Bounds: oracle/README.md
// "Merged states".
OracleResult merge_oracle(const Problem& p, const Tensors& t, const OracleOptions& opts = {});

}  // namespace attnfuzz
