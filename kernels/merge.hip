// merge.hip - merged attention states (AF_KIND_MERGE, issue 29): n partial (O_s, LSE_s) of disjoint key ranges into
// (O, LSE) of their union, max-first (kernels/merge.h) and online (one state at a time, FlashInfer's merge_state).
#include "kernels/merge.h"
#include "kernels/register.h"

namespace {

// Block (i, h, b): folds the states in order into a running (m, l, acc) like an online softmax over "keys" with
// score LSE_s and value O_s: acc <- acc e^(m - m') + e^(LSE_s - m') O_s. Thread t owns d = t, t + 64, ... and keeps
// its own copy of m and l (every thread reads the same LSEs in the same order). Dv <= 1024 (16 per thread).
template <class T>
__global__ void __launch_bounds__(kMergeThreads)
    merge_online_kernel(af_problem p, SeqIndex x, const T* __restrict__ so, const float* __restrict__ sl,
                        T* __restrict__ o, float* __restrict__ lse) {
  constexpr int kAcc = kMergeMaxDv / kMergeThreads;
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqShape sh = seq_shape(p, x, b);
  if (i >= sh.sq) return;
  float m = neg_inf(), l = 0.0f, acc[kAcc];
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  for (int64_t st = 0; st < p.n_states; ++st) {
    const float s = sl[state_lse_at(p, st, b, h, i)];
    if (s == neg_inf()) continue;  // an empty state adds nothing
    const float m_new = nan_max(m, s);
    const float alpha = rescale_factor(m, m_new), w = softmax_weight(s, m_new);
    l = l * alpha + w;
    const int64_t row = MergePolicy::state_o_row(p, sh, st, i, h);
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = threadIdx.x + e * kMergeThreads;
      if (d < p.head_dim_v) acc[e] = acc[e] * alpha + w * Elem<T>::load(so[row + d]);
    }
    m = m_new;
  }
  for (int e = 0; e < kAcc; ++e) {
    const int64_t d = threadIdx.x + e * kMergeThreads;
    if (d < p.head_dim_v) o[seq_o_row(p, sh, i, h) + d] = store_o<T>(p, finish_o(acc[e], m, l));
  }
  if (lse && threadIdx.x == 0) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

int merge_online_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (merge_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  return dispatch_dtype(p, kMergeDtypes, [&](auto tag) {
    using T = decltype(tag);
    hipLaunchKernelGGL(merge_online_kernel<T>, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(kMergeThreads), 0, (hipStream_t)stream, p, seq_index(*buf),
                       static_cast<const T*>(buf->state_o), buf->state_lse, static_cast<T*>(buf->o), buf->lse);
    return (int)hipGetLastError();
  });
}

const af_kernel kMergeKernels[] = {
    AF_MERGE_KERNEL("merge-states", "merge",
                    "merged attention states: M = max LSE_s, O = sum e^(LSE_s - M) O_s / sum e^(LSE_s - M), "
                    "LSE = M + log sum (vLLM merge_attn_states); f32 / f16 / bf16, strided and varlen states",
                    merge_check, merge_launch<MergePolicy>),
    AF_MERGE_KERNEL("merge-states-online", "merge",
                    "merged attention states folded one at a time with a running max (FlashInfer merge_state "
                    "chained); f32 / f16 / bf16, strided and varlen states",
                    merge_check, merge_online_launch),
};

}  // namespace

AF_REGISTER_KERNELS(kMergeKernels);
