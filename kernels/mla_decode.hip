// mla_decode.hip - MLA decode (DeepSeek's D = 576, Dv = 512): split-KV over one latent K buffer that V views.
#include "kernels/mla.h"
#include "kernels/register.h"

namespace {

const af_kernel kMlaKernels[] = {
    AF_MLA_KERNEL("mla-decode", "mla",
                  "MLA decode: D <= 576, Dv <= 512, V the first Dv columns of K's rows (AF_VARIANT_KV_SHARED) or "
                  "its own buffer; 1..8 query tokens, num_splits (default 8) KV splits per sequence, logsumexp "
                  "combine; f32 / f16 / bf16, dense or paged K/V, seqused_k",
                  mla_launch<MlaPolicy>),
};

}  // namespace

AF_REGISTER_KERNELS(kMlaKernels);
