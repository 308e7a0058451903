// shrink_impl.h - the greedy shrinking loop of the minimizer (template, included by campaign.h).
#pragma once

#include <vector>

#include "attnfuzz/problem.h"
#include "fuzz/shape_pool.h"

namespace attnfuzz::fuzz {

// Greedy: take the first simplification that still fails, restart from it; stop when none does. Then
// materialize the values (explicit) when the case is small and continue with value simplifications.
// same_shape_first (a kernel that compiles per shape): every round tries the steps that keep the case's shape_key
// (values, special values, magnitudes, scale: nothing a compiled kernel is specialised on) before those that change it.
template <class Pred>
Case shrink_case(const Case& c, const CaseDomain& dom, Pred still_fails, int max_checks, int& checks,
                 bool same_shape_first) {
  Case cur = c;
  auto pass = [&]() {
    bool progress = true;
    while (progress && checks < max_checks) {
      progress = false;
      std::vector<Case> cands = dom.shrinks(cur);
      if (same_shape_first) same_shape_steps_first(cur, cands);
      for (Case& cand : cands) {
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
