// online_row.hip - one block per (query row, head, batch): per-key online softmax with a block reduction.
#include "kernels/common.h"
#include "kernels/register.h"

namespace {

constexpr int kThreads = 64;  // threads per block (any count works; no warp-size assumption)
constexpr int kMaxDv = 256;   // thread t owns o[d] for d = t, t + kThreads, ... (registers)
constexpr int kAcc = kMaxDv / kThreads;
constexpr uint32_t kDtypes = AF_SUPPORTS_F32 | AF_SUPPORTS_F16 | AF_SUPPORTS_BF16;

// For each visible key j in order: every thread forms a partial q.k_j over its d, thread 0 sums the
// partials (fixed order), updates m and l and broadcasts (alpha, beta); then every thread updates its
// accumulators acc = alpha * acc + beta * v_j. Two barriers per key: the partials are complete before
// thread 0 reads them, and (alpha, beta) are published before the others read them. The next key's
// writes of partial[] and coef[] cannot overtake those reads (each sits behind the other barrier).
// Element type T (common.h Elem): fp32 dot products, softmax state and accumulators; beta rounded to T for the
// P.V term only (l sums the unrounded weight); O rounded to T once on store.
template <class T>
__global__ void __launch_bounds__(kThreads)
    online_row_kernel(af_problem p, const T* __restrict__ q, const T* __restrict__ k,
                      const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
  __shared__ float partial[kThreads];
  __shared__ float coef[2];    // alpha, beta of the current key
  __shared__ float final_[2];  // m, l after the last key
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = kv_head_of(p, h);
  const T* qr = q + q_row(p, b, i, h);
  const KeySpan keys = row_keys(p, i);

  float m = neg_inf(), l = 0.0f;  // meaningful in thread 0
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;

  for (int64_t j = keys.first; j < keys.last; ++j) {
    const T* kr = k + k_row(p, b, j, hk);
    float part = 0.0f;
    for (int64_t d = t; d < p.head_dim; d += kThreads) part += Elem<T>::load(qr[d]) * Elem<T>::load(kr[d]);
    partial[t] = part;
    __syncthreads();
    if (t == 0) {
      float dot = 0.0f;
      for (int c = 0; c < kThreads; ++c) dot += partial[c];
      const float s = score_scale<T>(p) * dot;
      const float m_new = nan_max(m, s);
      const float alpha = rescale_factor(m, m_new), beta = softmax_weight(s, m_new);
      l = l * alpha + beta;
      m = m_new;
      coef[0] = alpha;
      coef[1] = Elem<T>::round(beta);
    }
    __syncthreads();
    const float alpha = coef[0], beta = coef[1];
    const T* vr = v + v_row(p, b, j, hk);
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = t + e * kThreads;
      if (d < p.head_dim_v) acc[e] = acc[e] * alpha + beta * Elem<T>::load(vr[d]);
    }
  }

  if (t == 0) {
    final_[0] = m;
    final_[1] = l;
  }
  __syncthreads();
  m = final_[0];
  l = final_[1];
  T* orow = o + o_row(p, b, i, h);
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int64_t d = t + e * kThreads;
    if (d < p.head_dim_v) orow[d] = store_o<T>(p, finish_o(acc[e], m, l));
  }
  if (lse && t == 0) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

int online_row_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, kDtypes, why, why_len)) return 1;
  if (p->head_dim_v > kMaxDv) return unsupported(why, why_len, "online-row supports Dv <= 256");
  if (!grid_fits(p->seq_q, p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "online-row grid (Sq, Hq, B) exceeds the launch limits");
  return 0;
}

int online_row_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (online_row_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  return dispatch_dtype(p, kDtypes, [&](auto tag) {
    using T = decltype(tag);
    hipLaunchKernelGGL(online_row_kernel<T>, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(kThreads), 0, (hipStream_t)stream, p, static_cast<const T*>(buf->q),
                       static_cast<const T*>(buf->k), static_cast<const T*>(buf->v), static_cast<T*>(buf->o),
                       buf->lse);
    return (int)hipGetLastError();
  });
}

const af_kernel kOnlineRowKernels[] = {
    {"online-row", "online-row",
     "one block per query row, per-key online softmax with a block reduction (seed 000)", kDtypes,
     AF_SUPPORTS_ALL_MASKS, /*max_head_dim=*/0, /*max_head_dim_v=*/kMaxDv, /*writes_lse=*/1,
     /*needs_dv_eq_d=*/0, nullptr, online_row_check, online_row_launch},
};

}  // namespace

AF_REGISTER_KERNELS(kOnlineRowKernels);
