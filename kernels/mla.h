// mla.h - the MLA decode kernel body (D up to 576, Dv up to 512, K and V one latent buffer), templated on a
// policy whose one hook places V's rows, so that the planted MLA bug (kernels/planted/mla_bugs.hip) replaces
// the hook only.
#pragma once

#include "kernels/common.h"

namespace {

constexpr int kMlaThreads = 64;  // threads per block in both kernels (one key of a chunk per thread)
constexpr int kMlaMaxQ = 8;      // query tokens per sequence (decode, MTP / speculative decode)
constexpr int kMlaMaxD = 576;    // largest D: 512 latent + 64 rope (the q rows are staged in shared memory)
constexpr int kMlaMaxDv = 512;   // largest Dv (accumulators in registers)
constexpr int kMlaAcc = kMlaMaxDv / kMlaThreads;
constexpr int64_t kMlaMinSplitKeys = 4;  // small so that short sequences are split too
constexpr uint32_t kMlaDtypes = AF_SUPPORTS_F32 | AF_SUPPORTS_F16 | AF_SUPPORTS_BF16;
constexpr uint32_t kMlaFeatures = AF_FEATURE_KV_PAGED | AF_FEATURE_SEQUSED_K;

// num_splits (AF_TUNABLE_KV_SPLITS): KV splits per sequence (fewer when Sk_b / 4 is smaller); values[0] = 8
// is the default, the split-kv detector re-runs a failing case with the others.
const af_tunable kMlaTunables[] = {
    {"num_splits",
     "KV splits per sequence (at most ceil(Sk_b / 4))",
     AF_TUNABLE_KV_SPLITS,
     6,
     {8, 1, 2, 3, 4, 16}},
};

struct MlaSplits {
  int64_t n, len;  // split s covers keys [s * len, min((s + 1) * len, Sk_b))
};
// At most min(num_splits, ceil(sk / 4)) splits of a sequence of sk keys, every split non-empty.
__host__ __device__ inline int64_t mla_split_cap(const af_problem& p, int64_t sk) {
  const int64_t want = p.tunables[0] >= 1 ? p.tunables[0] : 8;  // the tool always resolves it
  return min64(want, ceil_div(sk, kMlaMinSplitKeys));
}
__host__ __device__ inline MlaSplits mla_splits(const af_problem& p, int64_t sk) {
  if (sk <= 0) return {0, 0};
  const int64_t len = ceil_div(sk, mla_split_cap(p, sk));
  return {ceil_div(sk, len), len};
}
// Splits allocated per row (grid x and workspace): the cap of the longest sequence the problem admits, which
// bounds every shorter sequence's count (mla_splits(sk).n <= mla_split_cap(sk), monotone in sk).
__host__ __device__ inline int64_t mla_max_splits(const af_problem& p) {
  const int64_t longest = max64(p.seq_k, p.kv_layout == AF_SEQ_PAGED ? p.kv_capacity : 0);
  return longest <= 0 ? 0 : mla_split_cap(p, longest);
}
__host__ __device__ inline int64_t mla_rows(const af_problem& p) { return p.batch * p.heads_q * p.seq_q; }

// The correct hook: the element offset of V's row (token j of sequence sh, KV head hk) in buffers.v, through
// v_stride. With AF_VARIANT_KV_SHARED buffers.v is buffers.k and v_stride is k_stride: row j of V is the
// first Dv columns of K's row j, D elements (times the heads) after row j - 1 (docs/semantics.md "Shared K/V
// latent").
struct MlaPolicy {
  __host__ __device__ static int64_t v_row(const af_problem& p, const SeqIndex& x, const SeqShape& sh,
                                           int64_t j, int64_t hk) {
    return seq_v_row(p, x, sh, j, hk);
  }
};

// Block (s, h, b): the keys of split s of sequence b for each of its query tokens (FlashMLA's decode split;
// one query head per block). Per chunk of 64 keys thread t scores key c0 + t against every token whose
// visible span holds it, then every thread reads a token's scores in the same order (identical m and l
// everywhere); thread t owns d = t + 64 e of each token's partial output and reads V's rows through P::v_row.
// Writes the partial O normalised by its own l and the partial LSE (-inf, O = 0 where the token saw no finite
// score). The weights are rounded to T for P.V only (fp32 l), as FlashAttention does. Two barriers per chunk
// (the next chunk writes score before its barrier 1, which every reader of this chunk's weights has passed:
// paged_decode.hip's scheme).
template <class T, class P>
__global__ void __launch_bounds__(kMlaThreads)
    mla_partial_kernel(af_problem p, SeqIndex x, const T* __restrict__ q, const T* __restrict__ k, const T* v,
                       float* __restrict__ o_part, float* __restrict__ lse_part, int64_t nmax) {
  __shared__ float q_vec[kMlaMaxQ][kMlaMaxD];
  __shared__ float score[kMlaMaxQ][kMlaThreads];
  __shared__ float weight[kMlaMaxQ][kMlaThreads];
  const int t = threadIdx.x;
  const int64_t s = blockIdx.x, h = blockIdx.y, hk = kv_head_of(p, h);
  const SeqShape sh = seq_shape(p, x, blockIdx.z);
  const MlaSplits sp = mla_splits(p, sh.sk);
  if (s >= sp.n) return;  // the whole block: this sequence has fewer splits
  const int nq = (int)p.seq_q;
  const int64_t s_lo = s * sp.len, s_hi = min64(sh.sk, (s + 1) * sp.len);
  int64_t first[kMlaMaxQ], last[kMlaMaxQ];  // each token's visible keys within this split
  int64_t lo = s_hi, hi = s_lo;             // their union
  AF_UNROLL
  for (int i = 0; i < kMlaMaxQ; ++i) {
    const KeySpan keys = i < nq ? seq_row_keys(p, sh, i) : KeySpan{0, 0};
    first[i] = max64(keys.first, s_lo);
    last[i] = max64(first[i], min64(keys.last, s_hi));
    if (first[i] < last[i]) lo = min64(lo, first[i]), hi = max64(hi, last[i]);
  }
  for (int i = 0; i < nq; ++i)
    for (int64_t d = t; d < p.head_dim; d += kMlaThreads)
      q_vec[i][d] = Elem<T>::load(q[seq_q_row(p, sh, i, h) + d]);
  __syncthreads();
  float m[kMlaMaxQ], l[kMlaMaxQ], acc[kMlaMaxQ][kMlaAcc];
  AF_UNROLL
  for (int i = 0; i < kMlaMaxQ; ++i) {
    m[i] = neg_inf();
    l[i] = 0.0f;
    AF_UNROLL
    for (int e = 0; e < kMlaAcc; ++e) acc[i][e] = 0.0f;
  }
  for (int64_t c0 = lo; c0 < hi; c0 += kMlaThreads) {
    const int n = (int)min64(kMlaThreads, hi - c0);
    const int64_t j = c0 + t;
    const T* kr = t < n ? k + seq_k_row(p, x, sh, j, hk) : nullptr;
    AF_UNROLL
    for (int i = 0; i < kMlaMaxQ; ++i) {  // a constant trip count: unrolled, the arrays stay in registers
      if (i >= nq) continue;
      float dot = 0.0f;
      if (kr && j >= first[i] && j < last[i])
        for (int64_t d = 0; d < p.head_dim; ++d) dot += q_vec[i][d] * Elem<T>::load(kr[d]);
      score[i][t] = kr && j >= first[i] && j < last[i] ? p.scale * dot : neg_inf();
    }
    __syncthreads();  // 1
    float alpha[kMlaMaxQ];
    for (int i = 0; i < kMlaMaxQ && i < nq; ++i) {
      float chunk_max = neg_inf();
      for (int c = 0; c < n; ++c) chunk_max = nan_max(chunk_max, score[i][c]);
      const float m_new = nan_max(m[i], chunk_max);
      alpha[i] = rescale_factor(m[i], m_new);
      weight[i][t] = t < n ? softmax_weight(score[i][t], m_new) : 0.0f;
      m[i] = m_new;
    }
    __syncthreads();  // 2
    AF_UNROLL
    for (int i = 0; i < kMlaMaxQ; ++i) {
      if (i >= nq) continue;
      float sum = 0.0f;
      for (int c = 0; c < n; ++c) sum += weight[i][c];
      l[i] = l[i] * alpha[i] + sum;
      AF_UNROLL
      for (int e = 0; e < kMlaAcc; ++e) acc[i][e] *= alpha[i];
    }
    for (int c = 0; c < n; ++c) {
      // Only keys some token sees are read; a key outside a token's span is skipped for it, so a NaN / Inf
      // value of a key hidden from that token cannot reach it.
      const T* vr = v + P::v_row(p, x, sh, c0 + c, hk);
      AF_UNROLL
      for (int e = 0; e < kMlaAcc; ++e) {
        const int64_t d = t + (int64_t)e * kMlaThreads;
        if (d >= p.head_dim_v) break;
        const float val = Elem<T>::load(vr[d]);
        AF_UNROLL
        for (int i = 0; i < kMlaMaxQ; ++i)
          if (i < nq && c0 + c >= first[i] && c0 + c < last[i]) acc[i][e] += Elem<T>::round(weight[i][c]) * val;
      }
    }
  }
  for (int i = 0; i < kMlaMaxQ && i < nq; ++i) {
    const int64_t slot = ((sh.b * p.heads_q + h) * p.seq_q + i) * nmax + s;
    AF_UNROLL
    for (int e = 0; e < kMlaAcc; ++e) {
      const int64_t d = t + (int64_t)e * kMlaThreads;
      if (d < p.head_dim_v) o_part[slot * p.head_dim_v + d] = m[i] == neg_inf() ? 0.0f : acc[i][e] / l[i];
    }
    if (t == 0) lse_part[slot] = finish_lse(m[i], l[i]);
  }
}

// Block (i, h, b): M = max_s LSE_s over the sequence's splits, O = sum_s e^(LSE_s - M) O_s / sum_s e^(LSE_s -
// M) rounded to T once, LSE = M + log sum; a token with no visible key (or Sk_b = 0) gets O = 0, LSE = -inf.
template <class T>
__global__ void __launch_bounds__(kMlaThreads)
    mla_combine_kernel(af_problem p, SeqIndex x, const float* __restrict__ o_part,
                       const float* __restrict__ lse_part, T* __restrict__ o, float* __restrict__ lse,
                       int64_t nmax) {
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y;
  const SeqShape sh = seq_shape(p, x, blockIdx.z);
  const int64_t n = mla_splits(p, sh.sk).n, row = (sh.b * p.heads_q + h) * p.seq_q + i;
  const float* lp = lse_part + row * nmax;
  float m = neg_inf(), l = 0.0f;
  for (int64_t s = 0; s < n; ++s) m = nan_max(m, lp[s]);
  for (int64_t s = 0; s < n; ++s) l += softmax_weight(lp[s], m);
  for (int64_t d = t; d < p.head_dim_v; d += kMlaThreads) {
    float a = 0.0f;
    for (int64_t s = 0; s < n; ++s)
      a += softmax_weight(lp[s], m) * o_part[(row * nmax + s) * p.head_dim_v + d];
    o[seq_o_row(p, sh, i, h) + d] = Elem<T>::store(finish_o(a, m, l));
  }
  if (lse && t == 0) lse[lse_at(p, sh.b, h, i)] = finish_lse(m, l);
}

inline size_t mla_workspace(const af_problem* p) {
  return (size_t)(mla_rows(*p) * mla_max_splits(*p) * (p->head_dim_v + 1)) * sizeof(float);
}

inline int mla_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, kMlaDtypes, why, why_len)) return 1;
  if (p->head_dim > kMlaMaxD || p->head_dim_v > kMlaMaxDv)
    return unsupported(why, why_len, "mla-decode supports D <= 576 and Dv <= 512");
  if (p->seq_q > kMlaMaxQ || p->q_layout != AF_SEQ_DENSE)
    return unsupported(why, why_len, "mla-decode takes 1 to 8 query tokens per sequence, dense q");
  if (p->kv_layout == AF_SEQ_PACKED) return unsupported(why, why_len, "mla-decode takes dense or paged K/V");
  if (!grid_fits(max64(mla_max_splits(*p), 1), p->heads_q, p->batch, kMlaThreads))
    return unsupported(why, why_len, "mla-decode grid (splits, Hq, B) exceeds the launch limits");
  return 0;
}

template <class P>
int mla_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (mla_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  if (int e = check_seq_metadata(p, *buf)) return e;  // malformed metadata is refused
  return dispatch_dtype(p, kMlaDtypes, [&](auto tag) {
    using T = decltype(tag);
    const int64_t nmax = mla_max_splits(p);
    const SeqIndex x = seq_index(*buf);
    float* o_part = static_cast<float*>(buf->workspace);
    float* lse_part = o_part + mla_rows(p) * nmax * p.head_dim_v;
    if (nmax > 0) {
      hipLaunchKernelGGL(
          (mla_partial_kernel<T, P>), dim3((unsigned)nmax, (unsigned)p.heads_q, (unsigned)p.batch),
          dim3(kMlaThreads), 0, (hipStream_t)stream, p, x, static_cast<const T*>(buf->q),
          static_cast<const T*>(buf->k), static_cast<const T*>(buf->v), o_part, lse_part, nmax);
      if (int e = (int)hipGetLastError()) return e;
    }
    hipLaunchKernelGGL((mla_combine_kernel<T>),
                       dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch), dim3(kMlaThreads), 0,
                       (hipStream_t)stream, p, x, (const float*)o_part, (const float*)lse_part,
                       static_cast<T*>(buf->o), buf->lse, nmax);
    return (int)hipGetLastError();
  });
}

// An af_kernel entry of the MLA decode family (every field its kernels share): f32 / f16 / bf16 (fused
// compute model), every mask, D <= 576, Dv <= 512, dense or paged K/V (any page size 1 .. 1024), seqused_k,
// num_splits; the variant AF_VARIANT_KV_SHARED.
#define AF_MLA_KERNEL(name, family, description, launch)                                                     \
  af_kernel {                                                                                                \
    name, family, description, kMlaDtypes, AF_SUPPORTS_ALL_MASKS, kMlaMaxD, kMlaMaxDv, /*writes_lse=*/1,     \
        /*needs_dv_eq_d=*/0, mla_workspace, mla_check, launch, kMlaFeatures, /*n_tunables=*/1, kMlaTunables, \
        nullptr, nullptr, AF_COMPUTE_FUSED, AF_KIND_ATTENTION, 0, AF_VARIANT_KV_SHARED, 0, 1, 1024, 0        \
  }

}  // namespace
