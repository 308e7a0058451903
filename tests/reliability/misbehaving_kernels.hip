// misbehaving_kernels.hip - a test-only plug-in of kernels that attack the tool, not the math: far
// out-of-bounds writes, a leak, a spin, a segfault, an abort. Each computes the right O first (so only its
// misbehaviour can fail it) and misbehaves on every launch. Two more attack the minimizer: o-doubled is plainly
// wrong (O times 2), segv-when-small too and kills its process for Sq <= 2, where shrinking its failure leads.
// Built a second time with AF_SLOW_PLUGIN (slow_kernel.hip) as a plug-in of one correct but slow kernel
// (slow-blocks: every block sleeps 100 ms before its rows), for the hang watch: slow is not hung.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/common.h"

namespace {

enum Bad : int { kWrite16M, kWrite80K, kLeak8M, kSpin, kSegfault, kAbort, kSlow, kDoubled, kDoubledSegvSmall };

// One element past the last element of O (largest offset of any [b, s, h, d] + 1).
__host__ __device__ inline int64_t o_end(const af_problem& p) {
  if (p.batch == 0 || p.seq_q == 0 || p.heads_q == 0) return 0;
  return o_row(p, p.batch - 1, p.seq_q - 1, p.heads_q - 1) + p.head_dim_v;
}

__global__ void bad_kernel(af_problem p, const float* q, const float* k, const float* v, float* o, int bad) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  const bool first = i == 0 && h == 0 && b == 0;
  if (first && bad == kSegfault) *(volatile float*)nullptr = 1.f;
  if (first && bad == kAbort) abort();
  if (bad == kSlow && threadIdx.x == 0) usleep(100 * 1000);  // the emulator: one OS thread runs the block
  if (first && bad == kSpin) {
    volatile int forever = 1;
    while (forever) {
    }
  }
  if (i < p.seq_q) {
    const int64_t hk = kv_head_of(p, h);
    const KeySpan keys = row_keys(p, i);
    float m = neg_inf(), l = 0.f;
    float* orow = o + o_row(p, b, i, h);
    for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = 0.f;
    for (int64_t j = keys.first; j < keys.last; ++j) {
      float dot = 0.f;
      for (int64_t d = 0; d < p.head_dim; ++d) dot += q[q_row(p, b, i, h) + d] * k[k_row(p, b, j, hk) + d];
      const float s = p.scale * dot, m_new = nan_max(m, s);
      const float alpha = rescale_factor(m, m_new), beta = softmax_weight(s, m_new);
      l = l * alpha + beta;
      m = m_new;
      for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = orow[d] * alpha + beta * v[v_row(p, b, j, hk) + d];
    }
    const float times = bad == kDoubled || bad == kDoubledSegvSmall ? 2.f : 1.f;
    for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = times * finish_o(orow[d], m, l);
  }
  if (first && bad == kWrite16M) o[o_end(p) + (16 << 20) / 4] = 7.f;  // 16 MiB past the end of O
  if (first && bad == kWrite80K) o[o_end(p) + (80 << 10) / 4] = 7.f;  // 80 KiB past the end of O
}

void* volatile g_sink;  // keeps the compiler from dropping the leaked allocation

template <int kBad>
int launch(const af_problem* p, const af_buffers* b, void* stream) {
  if (kBad == kDoubledSegvSmall && p->seq_q <= 2) *(volatile int*)nullptr = 1;  // on the host: the process dies
  if (kBad == kLeak8M) {  // host-side scratch that is never freed: 8 MiB more on every launch
    void* scratch = malloc(size_t{8} << 20);
    if (scratch) memset(scratch, 1, size_t{8} << 20);
    g_sink = scratch;
  }
  hipLaunchKernelGGL(bad_kernel, dim3((unsigned)max64(1, ceil_div(p->seq_q, 32)), (unsigned)p->heads_q, (unsigned)p->batch),
                     dim3(32), 0, (hipStream_t)stream, *p, (const float*)b->q, (const float*)b->k,
                     (const float*)b->v, (float*)b->o, kBad);
  return (int)hipGetLastError();
}

#define BAD(name, w, desc) {name, "test", desc, AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, 0, 0, 0, 0, nullptr, nullptr, &launch<w>}
#if defined(AF_SLOW_PLUGIN)
const af_kernel kBadKernels[] = {
    BAD("slow-blocks", kSlow, "correct; every block sleeps 100 ms (a slow launch, not a hung one)"),
};
#else
const af_kernel kBadKernels[] = {
    BAD("bad-write-16m", kWrite16M, "writes one float 16 MiB past the end of O on every launch"),
    BAD("bad-write-80k", kWrite80K, "writes one float 80 KiB past the end of O on every launch"),
    BAD("bad-leak-8m", kLeak8M, "mallocs and never frees 8 MiB on every launch"),
    BAD("bad-spin", kSpin, "spins forever, never reaching a barrier"),
    BAD("bad-segfault", kSegfault, "dereferences NULL"),
    BAD("bad-abort", kAbort, "calls abort()"),
    BAD("o-doubled", kDoubled, "O times 2 (a plain wrong kernel)"),
    BAD("segv-when-small", kDoubledSegvSmall, "O times 2; dereferences NULL on the host when Sq <= 2"),
};
#endif

}  // namespace

AF_DEFINE_PLUGIN("attn-fuzz misbehaving test kernels", kBadKernels)
