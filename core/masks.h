// masks.h - internal to core/: the custom-mask checks and generation that validate, describe and generate call.
#pragma once

#include <string>

#include "attnfuzz/case.h"

namespace attnfuzz {

// Problem-level mask fields (exclusive custom masks, strides, block sizes); part of validate(Problem).
std::string validate_mask_fields(const Problem& p);
// Case-level mask values (given bytes' counts, block values, patterns); part of validate_variants.
std::string validate_mask_values(const Case& c);
// " custom-mask=random:0.5/bcast=h blocks=16x16:mixed" (empty without masks); part of describe_variants.
std::string describe_masks(const Case& c);
// The mask buffers of generate(c): given bytes as they are, else from the patterns (streams (seed, 10), (seed, 11)).
void generate_masks(const Case& c, Tensors& out);

}  // namespace attnfuzz
