// sequences.h - internal to core/: generation of sequence-layout cases (varlen, KV cache, paged KV).
#pragma once

#include "attnfuzz/case.h"

namespace attnfuzz::detail {

// The sequence arrays of c (cu_seqlens, seqused_k, block table) as generate() returns them.
void build_sequence_arrays(const Case& c, Tensors& t);
// generate() for has_sequences(c.problem): the dense view's values scattered into the layout, every element
// outside a sequence kSeqGapBits. c is validated.
Tensors generate_sequences(const Case& c);

}  // namespace attnfuzz::detail
