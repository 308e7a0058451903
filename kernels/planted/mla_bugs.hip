// mla_bugs.hip - planted bugs in the MLA decode kernel (kernels/mla.h), modelled on issue 28's MLA reports; each
// replaces kernels/mla.h's one hook (marked PLANTED). kernels/planted/README.md "MLA bugs" has the exposing and quiet
// case.
#include "kernels/mla.h"
#include "kernels/planted/planted.h"

namespace {

// PLANTED: V's rows stepped by V's own row length (Hkv * Dv elements, V read as a contiguous [B, Sk, Hkv, Dv] tensor)
// instead of its stride, which for MLA's shared latent is K's row (D = 576 per KV head): key 0 of a sequence is right
// and every later V row drifts by j * (D - Dv) elements into K's buffer (ik_llama.cpp PR #2031: an MLA decode kernel
// stepping V by the wrong row length). Quiet where V has its own contiguous buffer (the case without kv-shared), and
// with one key.
struct VSteppedByDv : MlaPolicy {
  __host__ __device__ static int64_t v_row(const af_problem& p, const SeqIndex& x, const SeqShape& sh, int64_t j,
                                           int64_t hk) {
    const int64_t row = p.heads_kv * p.head_dim_v;
    if (p.kv_layout == AF_SEQ_PAGED)
      return x.block_table[sh.b * p.max_pages_per_seq + j / p.page_size] * p.page_size * row + (j % p.page_size) * row +
             hk * p.head_dim_v;
    return sh.b * p.seq_k * row + j * row + hk * p.head_dim_v;
  }
};

const af_kernel kMlaBugs[] = {
    AF_MLA_KERNEL("planted-mla-v-stride-dv", "planted/mla",
                  "MLA decode with a planted bug: V's rows stepped by Dv (V's own row length) instead of K's row "
                  "stride, so V drifts into K's rope columns after key 0 when K and V share the latent",
                  mla_launch<VSteppedByDv>),
};
static_assert(sizeof(kMlaBugs) / sizeof(kMlaBugs[0]) == attnfuzz_planted::kMlaBugCount, "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::mla_bugs() { return kMlaBugs; }
