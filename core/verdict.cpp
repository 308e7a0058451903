// verdict.cpp - names of verdicts and failure classes, as reports and corpus files spell them.
#include "attnfuzz/verdict.h"

#include <cstdio>

namespace attnfuzz {

std::string element_name(const ElementReport& e) {
  char buf[96];
  if (!e.tensor.empty())
    std::snprintf(buf, sizeof buf, "%s[b=%lld,%s=%lld,h=%lld,d=%lld]", e.tensor.c_str(), (long long)e.b,
                  e.tensor == "dQ" ? "s" : "j", (long long)e.s, (long long)e.h, (long long)e.d);
  else if (e.is_lse)
    std::snprintf(buf, sizeof buf, "LSE[b=%lld,h=%lld,s=%lld]", (long long)e.b, (long long)e.h,
                  (long long)e.s);
  else
    std::snprintf(buf, sizeof buf, "O[b=%lld,s=%lld,h=%lld,d=%lld]", (long long)e.b, (long long)e.s,
                  (long long)e.h, (long long)e.d);
  return buf;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "pass";
    case Verdict::kFail:
      return "fail";
    case Verdict::kUnsupported:
      return "unsupported";
    case Verdict::kOutsideContract:
      return "outside-contract";
  }
  return "?";
}

const char* failure_class_name(FailureClass c) {
  switch (c) {
    case FailureClass::kNone:
      return "none";
    case FailureClass::kRescale:
      return "rescale";
    case FailureClass::kMask:
      return "mask";
    case FailureClass::kOobRead:
      return "oob-read";
    case FailureClass::kOobWrite:
      return "oob-write";
    case FailureClass::kBarrierRace:
      return "barrier-race";
    case FailureClass::kNonFinite:
      return "non-finite";
    case FailureClass::kPrecision:
      return "precision";
    case FailureClass::kCrash:
      return "crash";
    case FailureClass::kHang:
      return "hang";
    case FailureClass::kLaunchError:
      return "launch-error";
    case FailureClass::kEmptyRow:
      return "empty-row";
    case FailureClass::kUnwritten:
      return "unwritten";
    case FailureClass::kLse:
      return "lse";
    case FailureClass::kSplitKv:
      return "split-kv";
    case FailureClass::kTail:
      return "tail";
    case FailureClass::kWrong:
      return "wrong";
    case FailureClass::kIgnoredParameter:
      return "ignored-parameter";
    case FailureClass::kMerge:
      return "merge";
    case FailureClass::kDropout:
      return "dropout";
    case FailureClass::kAcceptedMalformed:
      return "accepted-malformed";
  }
  return "?";
}

bool parse_failure_class(const std::string& text, FailureClass& out) {
  for (int i = 0; i <= static_cast<int>(FailureClass::kLastClass); ++i) {
    const auto c = static_cast<FailureClass>(i);
    if (text == failure_class_name(c)) {
      out = c;
      return true;
    }
  }
  return false;
}

}  // namespace attnfuzz
