// oracle_options.h - test helper: the oracle options the oracle tests share.
#pragma once

#include "oracle/oracle.h"

namespace attnfuzz::test_util {

inline const OracleOptions k1Thread{.threads = 1};  // one worker thread: deterministic row order, no contention

}  // namespace attnfuzz::test_util
