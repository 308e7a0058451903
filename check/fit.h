// fit.h - a sweep case reshaped to what one kernel declares (its variants, heads, query rows, head dims, page size).
#pragma once

#include <optional>

#include "attnfuzz/case.h"
#include "attnfuzz/registry.h"

namespace attnfuzz {

// c without the variants kernel k does not declare (drop_variants), when k declares at least one of c's droppable
// variants and lacks another: a `--sweep --variant all` case checks a sink-only kernel under its sink. The label ends
// in "-fit-" and the variants kept ("-fit-sink+softcap"). nullopt when c has nothing to drop or k declares none of it.
std::optional<Case> fit_variants(const Case& c, const af_kernel& k);

// c itself when kernel k claims it (case_unsupported_reason is empty). Otherwise c after fit_variants (when it
// applies), itself if k claims that, else the first of its simplifications that k claims, each of them and then each pair: one query and one kv head; as many kv heads
// as query heads; at most 4, 2 or 1 query rows per sequence; D and Dv cut to the kernel's maxima; the page
// size moved into the kernel's page sizes. Its label ends in "-fit-" and the simplifications
// ("-fit-h1x1.q4"). nullopt when none of them is claimed (the sweep then reports c as unsupported, with the
// kernel's reason).
std::optional<Case> fit_to_kernel(const Case& c, const af_kernel& k);

}  // namespace attnfuzz
