// merge.h - the merge-of-states kernel body (AF_KIND_MERGE, issue 29), templated on a policy of four hooks so that
// the planted merge bugs (kernels/planted/merge_bugs.hip) each replace one hook instead of copying the kernel.
#pragma once

#include "kernels/common.h"

namespace {

constexpr int kMergeThreads = 64;
constexpr uint32_t kMergeDtypes = AF_SUPPORTS_F32 | AF_SUPPORTS_F16 | AF_SUPPORTS_BF16;
constexpr int64_t kMergeMaxDv = 1024;
constexpr uint32_t kMergeFeatures = AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED |
                                    AF_FEATURE_SEQUSED_K;  // K / V are not read: any layout's states merge alike

// The correct hooks: state st's O row of token i of sequence s (state_o_stride; packed q: row q_first + i), the
// running max's start, a state's weight, and the final O and LSE (docs/semantics.md "Merged states").
struct MergePolicy {
  __host__ __device__ static int64_t state_o_row(const af_problem& p, const SeqShape& s, int64_t st, int64_t i,
                                                 int64_t h) {
    const int64_t* x = p.state_o_stride;
    return st * x[0] + (p.q_layout == AF_SEQ_PACKED ? 0 : s.b * x[1]) + (s.q_first + i) * x[2] + h * x[3];
  }
  __host__ __device__ static float init_max() { return neg_inf(); }
  __host__ __device__ static float weight(float lse, float m) { return softmax_weight(lse, m); }
  __host__ __device__ static float out_o(float acc, float m, float l) { return finish_o(acc, m, l); }
  __host__ __device__ static float out_lse(float m, float l) { return finish_lse(m, l); }
};

__host__ __device__ inline int64_t state_lse_at(const af_problem& p, int64_t st, int64_t b, int64_t h, int64_t i) {
  const int64_t* x = p.state_lse_stride;
  return st * x[0] + b * x[1] + h * x[2] + i * x[3];
}

// Block (i, h, b): M = max_s LSE_s, w_s = exp(LSE_s - M), O = sum_s w_s O_s / sum_s w_s, LSE = M + log sum_s w_s;
// every thread computes M and the sum itself (no shared state, no barrier); thread t owns d = t, t + 64, ...
template <class T, class P>
__global__ void __launch_bounds__(kMergeThreads)
    merge_states_kernel(af_problem p, SeqIndex x, const T* __restrict__ so, const float* __restrict__ sl,
                        T* __restrict__ o, float* __restrict__ lse) {
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqShape sh = seq_shape(p, x, b);
  if (i >= sh.sq) return;
  float m = P::init_max();
  for (int64_t st = 0; st < p.n_states; ++st) m = nan_max(m, sl[state_lse_at(p, st, b, h, i)]);
  float l = 0.0f;
  for (int64_t st = 0; st < p.n_states; ++st) l += P::weight(sl[state_lse_at(p, st, b, h, i)], m);
  for (int64_t d = threadIdx.x; d < p.head_dim_v; d += kMergeThreads) {
    float acc = 0.0f;
    for (int64_t st = 0; st < p.n_states; ++st) {
      const float l_s = sl[state_lse_at(p, st, b, h, i)];
      // An empty state adds nothing; any other adds w * O_s even when w underflows (a NaN in O_s stays NaN).
      if (l_s != neg_inf()) acc += P::weight(l_s, m) * Elem<T>::load(so[P::state_o_row(p, sh, st, i, h) + d]);
    }
    o[seq_o_row(p, sh, i, h) + d] = store_o<T>(p, P::out_o(acc, m, l));
  }
  if (lse && threadIdx.x == 0) lse[lse_at(p, b, h, i)] = P::out_lse(m, l);
}

inline int merge_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, kMergeDtypes, why, why_len)) return 1;
  if (p->n_states < 1) return unsupported(why, why_len, "a merge kernel needs n_states >= 1");
  if (!grid_fits(p->seq_q, p->heads_q, p->batch, kMergeThreads))
    return unsupported(why, why_len, "merge grid (Sq, Hq, B) exceeds the launch limits");
  return 0;
}

template <class P>
int merge_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (merge_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  return dispatch_dtype(p, kMergeDtypes, [&](auto tag) {
    using T = decltype(tag);
    hipLaunchKernelGGL((merge_states_kernel<T, P>), dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(kMergeThreads), 0, (hipStream_t)stream, p, seq_index(*buf),
                       static_cast<const T*>(buf->state_o), buf->state_lse, static_cast<T*>(buf->o), buf->lse);
    return (int)hipGetLastError();
  });
}

// An af_kernel entry of kind AF_KIND_MERGE (every field the merge kernels share).
#define AF_MERGE_KERNEL(name, family, description, check, launch)                                              \
  af_kernel {                                                                                                  \
    name, family, description, kMergeDtypes, AF_SUPPORTS_ALL_MASKS, 0, kMergeMaxDv, /*writes_lse=*/1,          \
        /*needs_dv_eq_d=*/0, nullptr, check, launch, kMergeFeatures, 0, nullptr, nullptr, nullptr,             \
        AF_COMPUTE_FUSED, AF_KIND_MERGE, 0, 0, 0, 0, 0, 0                                                      \
  }

}  // namespace
