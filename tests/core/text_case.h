// text_case.h - test helper: a case from a shape and the mask / distribution / special-value texts a user types.
#pragma once

#include <gtest/gtest.h>

#include "attnfuzz/case.h"

namespace attnfuzz::test_util {

// B = Hq = Hkv = 1 unless `p` says otherwise; mask, dist and special as on the command line ("" = no special).
inline Case text_case(Problem p, const char* mask, const char* dist = "uniform:1", const char* special = "",
                      uint64_t seed = 1) {
  EXPECT_EQ(parse_mask(mask, p), "");
  Case c = make_case(p, seed);
  EXPECT_EQ(parse_distribution(dist, c.values.dist), "");
  if (*special) {
    SpecialValue sv;
    EXPECT_EQ(parse_special(special, sv), "");
    c.values.specials.push_back(sv);
  }
  return c;
}

}  // namespace attnfuzz::test_util
