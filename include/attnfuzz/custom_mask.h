/* custom_mask.h - the one definition of custom / block-sparse mask visibility, for the tool and every kernel. */
#pragma once

#include <stdint.h>

#include "attnfuzz/abi.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define AF_MASK_HD __host__ __device__
#else
#define AF_MASK_HD
#endif

/* Key j of row (b, h, i) under the custom mask and the block mask alone (mask_kind not included; docs/semantics.md
 * "Custom masks"): a block byte 0 hides, 1 shows (the custom mask is not read), 2 (partial) leaves it to the custom
 * mask (visible when the problem has none); dense: byte j of the row non-zero; bits: bit j % 8 of byte j / 8.
 * Without a mask variant every key is visible. custom / block: buffers.custom_mask / block_mask. */
static inline AF_MASK_HD int af_custom_visible(const af_problem* p, const uint8_t* custom, const uint8_t* block,
                                               int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p->variants & AF_VARIANT_BLOCK_SPARSE) {
    const uint8_t v = block[b * p->block_mask_stride[0] + h * p->block_mask_stride[1] +
                            (i / p->block_q) * p->block_mask_stride[2] + j / p->block_k];
    if (v == 0) return 0;
    if (v == 1) return 1;
  }
  if (!(p->variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS))) return 1;
  const uint8_t* row = custom + b * p->mask_stride[0] + h * p->mask_stride[1] + i * p->mask_stride[2];
  if (p->variants & AF_VARIANT_MASK_DENSE) return row[j] != 0;
  return (row[j >> 3] >> (j & 7)) & 1;
}
