// fit.h - a sweep case reshaped to what one kernel declares (heads, query rows, head dims, page size).
#pragma once

#include <optional>

#include "attnfuzz/case.h"
#include "attnfuzz/registry.h"

namespace attnfuzz {

// c itself when kernel k claims it (case_unsupported_reason is empty). Otherwise the first of c's
// simplifications that k claims, each of them and then each pair: one query and one kv head; as many kv heads
// as query heads; at most 4, 2 or 1 query rows per sequence; D and Dv cut to the kernel's maxima; the page
// size moved into the kernel's page sizes. Its label ends in "-fit-" and the simplifications
// ("-fit-h1x1.q4"). nullopt when none of them is claimed (the sweep then reports c as unsupported, with the
// kernel's reason).
std::optional<Case> fit_to_kernel(const Case& c, const af_kernel& k);

}  // namespace attnfuzz
