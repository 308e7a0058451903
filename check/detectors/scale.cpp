// scale.cpp - scale: the failing output re-judged against the exact result under another score scale. The given scale
// ignored (the default 1/sqrt(D), or none) is ignored-parameter; a wrong factor (log2 e missing or doubled in an exp2
// softmax, the scale applied twice, the scores counted 2^k times as a head dimension padded by repeating its columns)
// is named, and the class stays the magnitude's: precision or wrong with that relation as the first evidence.
#include <cmath>
#include <string>
#include <vector>

#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

namespace {

struct ScaleProbe {
  double scale;
  const char* kind;  // "scale/<kind>": decided_by
  std::string what;  // the relation, for the evidence
  bool ignored;      // the given scale is not used at all: ignored-parameter
};

std::vector<ScaleProbe> scale_probes(const Problem& p) {
  const double s = p.scale, log2e = 1.4426950408889634;
  std::vector<ScaleProbe> out = {
      {1.0 / std::sqrt(static_cast<double>(p.head_dim)), "default",
       fmt("the score scale (problem.scale = %s): the output is the attention with the default 1/sqrt(D) = %s",
           num(s).c_str(), num(1.0 / std::sqrt(static_cast<double>(p.head_dim))).c_str()),
       true},
      {1.0, "not-applied", fmt("the score scale (problem.scale = %s): the output is the attention of the unscaled "
                               "scores q.k",
                               num(s).c_str()),
       true},
      {s / log2e, "exp2-no-log2e",
       "the scores times ln 2 (scale / log2 e): an exp2 softmax whose scores miss the log2 e factor", false},
      {s * log2e, "exp-of-log2e",
       "the scores times log2 e: exp taken of scores already multiplied by log2 e for exp2", false},
      {s * s, "squared", "the scale applied twice (scale^2)", false},
  };
  for (int k = 1; k <= 6; ++k)
    out.push_back({s * std::ldexp(1.0, k), "factor",
                   fmt("every score %d times too large (scale x %d): q.k counted %d times, as a head dimension "
                       "padded by repeating its columns would give",
                       1 << k, 1 << k, 1 << k),
                   false});
  return out;
}

}  // namespace

Finding scale(Context& c) {
  Finding f;
  const Problem& p = c.problem();
  const std::vector<RowKey> rows = failing_rows(c);
  if (rows.empty() || p.scale == 0 || !std::isfinite(p.scale)) return f;
  const LaunchOutcome& out = c.original();
  const OracleResult& exact = c.pc.oracle(c.opts.oracle);
  std::string tried;
  for (const ScaleProbe& pr : scale_probes(p)) {
    const float as_fp32 = static_cast<float>(pr.scale);
    if (!std::isfinite(as_fp32) || as_fp32 == 0 || as_fp32 == p.scale) continue;  // not another problem
    Problem alt = c.pc.problem();
    alt.scale = as_fp32;
    const OracleResult ex = c.layout_oracle(alt, c.tensors());
    const RowsMatch m = rows_match(p, exact, ex, out, rows);
    if (m.all(rows.size())) {
      f.fired = true;
      f.kind = pr.kind;
      f.cls = pr.ignored ? FailureClass::kIgnoredParameter
                         : c.j.result.max_ratio > kPrecisionLimit ? FailureClass::kWrong : FailureClass::kPrecision;
      f.evidence.push_back(
          {"scale", fmt("the kernel %s %s: all %lld failing row(s) (s = %s) are within the bound of the exact result "
                        "at scale %s (max ratio %.3g against it, %.3g against the case's)",
                        pr.ignored ? "ignores" : "computes with", pr.what.c_str(), (long long)rows.size(),
                        ranges(m.where).c_str(), num(as_fp32).c_str(), m.worst, c.j.result.max_ratio)});
      return f;
    }
    tried += (tried.empty() ? "" : ", ") + num(as_fp32);
  }
  if (!tried.empty())
    f.evidence.push_back({"scale", "not another score scale: the failing rows match none of the exact results at " +
                                       tried});
  return f;
}

}  // namespace attnfuzz::detect
