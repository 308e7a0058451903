// tiers.cpp - the --fail-tiers set shared by attn-check and attn-fuzz: parsing, the tally, the exit status.
#include "report/tiers.h"

#include <cstdio>
#include <sstream>

namespace attnfuzz {

std::string parse_fail_tiers(const std::string& text, unsigned& bits) {
  bits = 0;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    bool known = item == "all";
    for (InputTier t : kInputTiers)
      if (item == "all" || item == input_tier_name(t)) {
        bits |= 1u << static_cast<unsigned>(t);
        known = true;
      }
    if (!known)
      return "'" + item + "' is not a tier: all, ordinary, extreme, non-finite-visible, non-finite-masked";
  }
  return bits ? "" : "names no tier";
}

bool tier_counted(const std::string& fail_tiers, InputTier t) {
  unsigned bits = 0;
  parse_fail_tiers(fail_tiers, bits);  // validated by the option table
  return (bits >> static_cast<unsigned>(t)) & 1u;
}

TierTally tally_tiers(const std::vector<InputTier>& failures, const std::string& fail_tiers) {
  TierTally t;
  for (InputTier x : failures) {
    ++t.n[static_cast<int>(x)];
    t.counted += tier_counted(fail_tiers, x);
  }
  return t;
}

int tier_exit_status(const TierTally& t, const std::string& fail_tiers) {
  if (t.counted > 0 || t.total() == 0) return 1;
  std::printf("exit 0: every failure is in a tier --fail-tiers %s does not count\n", fail_tiers.c_str());
  return 0;
}

}  // namespace attnfuzz
