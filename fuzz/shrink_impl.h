// shrink_impl.h - the greedy shrinking loop of the minimizer (template, included by campaign.h).
#pragma once

#include "attnfuzz/problem.h"

namespace attnfuzz::fuzz {

// Greedy: take the first simplification that still fails, restart from it; stop when none does. Then
// materialize the values (explicit) when the case is small and continue with value simplifications.
template <class Pred>
Case shrink_case(const Case& c, const CaseDomain& dom, Pred still_fails, int max_checks, int& checks) {
  Case cur = c;
  auto pass = [&]() {
    bool progress = true;
    while (progress && checks < max_checks) {
      progress = false;
      for (Case& cand : dom.shrinks(cur)) {
        if (checks >= max_checks) break;
        ++checks;
        if (still_fails(cand)) {
          cur = std::move(cand);
          progress = true;
          break;
        }
      }
    }
  };
  pass();
  if (!cur.explicit_values &&
      q_elements(cur.problem) + k_elements(cur.problem) + v_elements(cur.problem) <= 8192 &&
      checks < max_checks) {
    Case m = materialize(cur);
    ++checks;
    if (still_fails(m)) {
      cur = std::move(m);
      pass();
    }
  }
  return cur;
}

}  // namespace attnfuzz::fuzz
