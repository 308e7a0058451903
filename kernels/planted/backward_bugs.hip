// backward_bugs.hip - planted bugs in the FA2-style flash backward of kernels/flash.hip (flash-bm16-bn16's), and
// one low-precision backward bug (dS and gradient sums in f16 / bf16).
//
// One copy of the backward (Delta preprocess, key-tile dK/dV kernel with dQ by atomicAdd), templated on the
// bug it carries; every deviation sits behind `if constexpr (kBug == ...)` and is marked `// PLANTED:`. The
// forward launch of every kernel here is a plain correct one (one thread per query row, online softmax), so
// fwd+bwd cases feed the buggy backward a right O and LSE. See kernels/planted/README.md.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kMaxD = 128;
constexpr int BM = 16, BN = 16, NT = 64;  // flash-bm16-bn16's backward
constexpr int kAcc = BN * kMaxD / NT;
constexpr int kFwdThreads = 64;
constexpr int kPreThreads = 128;

enum class BwdBug {
  kDeltaScaled,       // Delta = scale * rowsum(dO o)
  kMaskNotReapplied,  // P recomputed for every key of the tile, masked ones included
  kEmptyRowNan,       // masked scores -inf and P = exp(s - lse) also for an empty row (lse = -inf): NaN
  kDkNoScale,         // dK stored without the softmax scale
  kDqPlainAdd,        // dQ read at the start of a query tile and written back at its end, no atomics
  kNoDsBarrier,       // no barrier between writing the P / dS tiles and reading them
  kGqaOneHead,        // dK / dV of a GQA group from its first query head only
  kTailKvOobWrite,    // the last key tile's dK / dV stored whole (BN rows), past Sk
  kEmptyRowNanKv,     // kEmptyRowNan in dK / dV only: an empty row's dQ is skipped (0), its NaN P still summed
};

// ---- forward: one thread per query row (b, h, i), online softmax in fp32 (correct) ----
__global__ void __launch_bounds__(kFwdThreads)
    planted_bwd_forward_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k,
                               const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = r % p.seq_q, h = (r / p.seq_q) % p.heads_q, b = r / (p.seq_q * p.heads_q);
    const int64_t hk = kv_head_of(p, h);
    const KeySpan keys = row_keys(p, i);
    float acc[kMaxD];
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = 0.0f;
    float m = neg_inf(), l = 0.0f;
    const float* qr = q + q_row(p, b, i, h);
    for (int64_t j = keys.first; j < keys.last; ++j) {
      const float* kr = k + k_row(p, b, j, hk);
      float dot = 0.0f;
      for (int64_t d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
      const float s = p.scale * dot;
      const float m_new = nan_max(m, s);
      const float alpha = rescale_factor(m, m_new), w = softmax_weight(s, m_new);
      const float* vr = v + v_row(p, b, j, hk);
      for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = acc[d] * alpha + w * vr[d];
      l = l * alpha + w;
      m = m_new;
    }
    for (int64_t d = 0; d < p.head_dim_v; ++d) o[o_row(p, b, i, h) + d] = finish_o(acc[d], m, l);
    lse[lse_at(p, b, h, i)] = finish_lse(m, l);
  }
}

int planted_bwd_forward(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  hipLaunchKernelGGL(planted_bwd_forward_kernel, dim3((unsigned)min64(ceil_div(rows, kFwdThreads), 1 << 16)),
                     dim3(kFwdThreads), 0, (hipStream_t)stream, p, static_cast<const float*>(buf->q),
                     static_cast<const float*>(buf->k), static_cast<const float*>(buf->v),
                     static_cast<float*>(buf->o), buf->lse);
  return (int)hipGetLastError();
}

// ---- the backward of kernels/flash.hip (see there), with one planted bug ----
__host__ __device__ inline int64_t delta_at(const af_problem& p, int64_t b, int64_t h, int64_t i) {
  return (b * p.heads_q + h) * p.seq_q + i;
}
__host__ __device__ inline int64_t do_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.do_stride[0] + s * p.do_stride[1] + h * p.do_stride[2];
}
__host__ __device__ inline int64_t dq_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.dq_stride[0] + s * p.dq_stride[1] + h * p.dq_stride[2];
}

template <BwdBug kBug>
__global__ void __launch_bounds__(kPreThreads)
    planted_bwd_pre_kernel(af_problem p, const float* __restrict__ o, const float* __restrict__ dout, float* delta,
                           float* dq) {
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = r % p.seq_q, h = (r / p.seq_q) % p.heads_q, b = r / (p.seq_q * p.heads_q);
    const float* orow = o + o_row(p, b, i, h);
    const float* g = dout + do_row(p, b, i, h);
    float acc = 0.0f;
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc += g[d] * orow[d];
    if constexpr (kBug == BwdBug::kDeltaScaled) acc *= p.scale;  // PLANTED: Delta scaled like a score; quiet at D = 1
    delta[delta_at(p, b, h, i)] = acc;
    for (int64_t d = 0; d < p.head_dim; ++d) dq[dq_row(p, b, i, h) + d] = 0.0f;
  }
}

template <BwdBug kBug>
__global__ void __launch_bounds__(NT)
    planted_bwd_kv_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k,
                          const float* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ dout,
                          const float* __restrict__ delta, float* dq, float* __restrict__ dk, float* __restrict__ dv) {
  __shared__ float k_tile[BN][kMaxD];
  __shared__ float v_tile[BN][kMaxD];
  __shared__ float p_tile[BM][BN];
  __shared__ float ds_tile[BM][BN];
  __shared__ float row_lse[BM], row_delta[BM];
  __shared__ int64_t row_first[BM], row_last[BM], row_vfirst[BM], row_vlast[BM];

  const int t = threadIdx.x;
  const int64_t j0 = (int64_t)blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z;
  const int64_t D = p.head_dim, Dv = p.head_dim_v, G = p.heads_q / p.heads_kv;
  const int cols = (int)min64(BN, p.seq_k - j0);
  for (int64_t idx = t; idx < BN * D; idx += NT) {
    const int c = (int)(idx / D);
    k_tile[c][idx % D] = c < cols ? k[k_row(p, b, j0 + c, hk) + idx % D] : 0.0f;
  }
  for (int64_t idx = t; idx < BN * Dv; idx += NT) {
    const int c = (int)(idx / Dv);
    v_tile[c][idx % Dv] = c < cols ? v[v_row(p, b, j0 + c, hk) + idx % Dv] : 0.0f;
  }
  float dk_acc[kAcc], dv_acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) dk_acc[e] = dv_acc[e] = 0.0f;

  for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
    for (int64_t i0 = 0; i0 < p.seq_q; i0 += BM) {
      if (t < BM) {
        const int64_t i = i0 + t;
        const KeySpan keys = i < p.seq_q ? row_keys(p, i) : KeySpan{0, 0};
        const float l = i < p.seq_q ? lse[lse_at(p, b, h, i)] : neg_inf();
        row_first[t] = l == neg_inf() ? j0 : max64(keys.first, j0);
        row_last[t] = l == neg_inf() ? j0 : min64(keys.last, j0 + cols);
        if constexpr (kBug == BwdBug::kMaskNotReapplied) {
          // PLANTED: every key of the tile for a row with keys; quiet when nothing is masked (mask none)
          if (l != neg_inf()) row_first[t] = j0, row_last[t] = j0 + cols;
        }
        if constexpr (kBug == BwdBug::kEmptyRowNan || kBug == BwdBug::kEmptyRowNanKv) {
          // PLANTED: every row of the tile sweeps every key, the mask applied as s = -inf, also for an empty
          // row (lse = -inf): exp(-inf - -inf) = NaN; quiet when no row is empty
          row_vfirst[t] = keys.first;
          row_vlast[t] = keys.last;
          if (i < p.seq_q) row_first[t] = j0, row_last[t] = j0 + cols;
        }
        row_lse[t] = l;
        row_delta[t] = i < p.seq_q ? delta[delta_at(p, b, h, i)] : 0.0f;
      }
      __syncthreads();
      bool any = false;
      for (int r = 0; r < BM; ++r) any = any || row_first[r] < row_last[r];
      if (any) {
        // PLANTED (kDqPlainAdd): this thread's dQ elements read now, written back after the tile
        [[maybe_unused]] float dq_old[BM * kMaxD / NT];
        if constexpr (kBug == BwdBug::kDqPlainAdd) {
          for (int64_t idx = t, e = 0; idx < BM * D; idx += NT, ++e) {
            const int r = (int)(idx / D);
            dq_old[e] = row_first[r] < row_last[r] ? dq[dq_row(p, b, i0 + r, h) + idx % D] : 0.0f;
          }
        }
        for (int idx = t; idx < BM * BN; idx += NT) {
          const int r = idx / BN, c = idx % BN;
          const int64_t j = j0 + c;
          float P = 0.0f, dS = 0.0f;
          if (j >= row_first[r] && j < row_last[r]) {
            const float* qi = q + q_row(p, b, i0 + r, h);
            const float* gi = dout + do_row(p, b, i0 + r, h);
            float dot = 0.0f, dp = 0.0f;
            for (int64_t d = 0; d < D; ++d) dot += qi[d] * k_tile[c][d];
            for (int64_t d = 0; d < Dv; ++d) dp += gi[d] * v_tile[c][d];
            float s = p.scale * dot;
            if constexpr (kBug == BwdBug::kEmptyRowNan || kBug == BwdBug::kEmptyRowNanKv)
              if (j < row_vfirst[r] || j >= row_vlast[r]) s = neg_inf();
            P = expf(s - row_lse[r]);
            dS = P * (dp - row_delta[r]);
          }
          p_tile[r][c] = P;
          ds_tile[r][c] = dS;
        }
        if constexpr (kBug != BwdBug::kNoDsBarrier) __syncthreads();
        // PLANTED (kNoDsBarrier): no barrier here; quiet when each dS entry is read by the thread that wrote it
        // (one key, D = Dv = 1)
        AF_UNROLL
        for (int e = 0; e < kAcc; ++e) {
          const int idx = t + e * NT;
          const int c = idx / kMaxD, d = idx % kMaxD;
          const int64_t j = j0 + c;
          if (c >= cols) continue;
          float sk = 0.0f, sv = 0.0f;
          for (int r = 0; r < BM; ++r) {
            if (j < row_first[r] || j >= row_last[r]) continue;
            if (d < D) sk += ds_tile[r][c] * q[q_row(p, b, i0 + r, h) + d];
            if (d < Dv) sv += p_tile[r][c] * dout[do_row(p, b, i0 + r, h) + d];
          }
          if constexpr (kBug == BwdBug::kGqaOneHead)
            if (h != hk * G) sk = sv = 0.0f;  // PLANTED: only the group's first head reaches dK / dV; quiet when G = 1
          dk_acc[e] += sk;
          dv_acc[e] += sv;
        }
        if constexpr (kBug == BwdBug::kDqPlainAdd) __syncthreads();  // (the tile's work spans a barrier)
        for (int64_t idx = t, e = 0; idx < BM * D; idx += NT, ++e) {
          const int r = (int)(idx / D);
          const int64_t d = idx % D;
          if (row_first[r] >= row_last[r]) continue;
          if constexpr (kBug == BwdBug::kEmptyRowNanKv)
            if (row_lse[r] == neg_inf()) continue;  // PLANTED: dQ guards the empty row; dK / dV above do not
          float acc = 0.0f;
          for (int64_t j = row_first[r]; j < row_last[r]; ++j) acc += ds_tile[r][j - j0] * k_tile[j - j0][d];
          if constexpr (kBug == BwdBug::kDqPlainAdd)
            dq[dq_row(p, b, i0 + r, h) + d] = dq_old[e] + p.scale * acc;  // PLANTED: lost updates between key blocks; quiet with one key block
          else
            atomicAdd(&dq[dq_row(p, b, i0 + r, h) + d], p.scale * acc);
        }
      }
      __syncthreads();
    }
  }
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int idx = t + e * NT;
    const int c = idx / kMaxD, d = idx % kMaxD;
    int stored = cols;
    if constexpr (kBug == BwdBug::kTailKvOobWrite) stored = BN;  // PLANTED: last key tile stored whole; quiet when Sk % 16 == 0
    if (c >= stored) continue;
    const float ks = kBug == BwdBug::kDkNoScale ? 1.0f : p.scale;  // PLANTED (kDkNoScale): no scale; quiet at D = 1
    if (d < D) dk[b * p.dk_stride[0] + (j0 + c) * p.dk_stride[1] + hk * p.dk_stride[2] + d] = ks * dk_acc[e];
    if (d < Dv) dv[b * p.dv_stride[0] + (j0 + c) * p.dv_stride[1] + hk * p.dv_stride[2] + d] = dv_acc[e];
  }
}

size_t planted_bwd_workspace(const af_problem* p) {
  return (size_t)(p->batch * p->heads_q * p->seq_q) * sizeof(float);
}

template <BwdBug kBug>
int planted_bwd_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "planted backward kernels support f32 only");
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD) return unsupported(why, why_len, "D, Dv <= 128");
  if (!grid_fits(max64(ceil_div(p->seq_k, BN), 1), p->heads_kv, p->batch, NT))
    return unsupported(why, why_len, "grid (Sk / 16, Hkv, B) exceeds the launch limits");
  // The overrun (up to 15 key rows) must stay inside the checker's 64 KiB guard zones.
  if (kBug == BwdBug::kTailKvOobWrite && (int64_t)BN * p->dk_stride[1] * 4 > 32 * 1024)
    return unsupported(why, why_len, "key rows too wide: the planted overrun would pass the guard zone");
  return 0;
}

template <BwdBug kBug>
int planted_bwd_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (planted_bwd_check<kBug>(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  const float* dout = static_cast<const float*>(buf->dout);
  float* delta = static_cast<float*>(buf->workspace);
  float* dq = static_cast<float*>(buf->dq);
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  void (*pre)(af_problem, const float*, const float*, float*, float*) = planted_bwd_pre_kernel<kBug>;
  hipLaunchKernelGGL(pre, dim3((unsigned)min64(ceil_div(rows, kPreThreads), 1 << 16)), dim3(kPreThreads), 0,
                     (hipStream_t)stream, p, static_cast<const float*>(buf->o), dout, delta, dq);
  if (int e = (int)hipGetLastError()) return e;
  if (p.seq_k == 0) return 0;
  void (*kv)(af_problem, const float*, const float*, const float*, const float*, const float*, const float*, float*,
             float*, float*) = planted_bwd_kv_kernel<kBug>;
  hipLaunchKernelGGL(kv, dim3((unsigned)ceil_div(p.seq_k, BN), (unsigned)p.heads_kv, (unsigned)p.batch), dim3(NT), 0,
                     (hipStream_t)stream, p, static_cast<const float*>(buf->q), static_cast<const float*>(buf->k),
                     static_cast<const float*>(buf->v), (const float*)buf->lse, dout, (const float*)delta, dq,
                     static_cast<float*>(buf->dk), static_cast<float*>(buf->dv));
  return (int)hipGetLastError();
}

// ---- low precision: a plain f16 / bf16 backward whose dS and gradient sums stay in the element type ----
//
// planted-bwd-lowp-ds-half: one thread per query row computes dQ_i, one thread per (key, kv head) dK_j and dV_j,
// from q, k, v, o, dO of element type T loaded exactly into fp32, P = exp(s - lse) and dP in fp32, as a correct
// kernel does; but (PLANTED) dS = P (dP - Delta) is rounded to T and every gradient is accumulated in T (each
// partial sum rounded to T) instead of fp32. Quiet when a row and a key meet once (Sq = Sk = 1: one product,
// rounded like the stored result); wrong when many terms add up (u = 2^-11 / 2^-8 per addition). The forward
// launch is the same one-thread-per-row online softmax as above, on T.
constexpr int kLowpThreads = 64;
__host__ __device__ inline int64_t dk_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.dk_stride[0] + s * p.dk_stride[1] + h * p.dk_stride[2];
}
__host__ __device__ inline int64_t dv_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.dv_stride[0] + s * p.dv_stride[1] + h * p.dv_stride[2];
}

template <class T>
__global__ void __launch_bounds__(kLowpThreads)
    planted_lowp_forward_kernel(af_problem p, const T* __restrict__ q, const T* __restrict__ k,
                                const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = r % p.seq_q, h = (r / p.seq_q) % p.heads_q, b = r / (p.seq_q * p.heads_q);
    const int64_t hk = kv_head_of(p, h);
    const KeySpan keys = row_keys(p, i);
    float acc[kMaxD];
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = 0.0f;
    float m = neg_inf(), l = 0.0f;
    for (int64_t j = keys.first; j < keys.last; ++j) {
      float dot = 0.0f;
      for (int64_t d = 0; d < p.head_dim; ++d)
        dot += Elem<T>::load(q[q_row(p, b, i, h) + d]) * Elem<T>::load(k[k_row(p, b, j, hk) + d]);
      const float s = p.scale * dot;
      const float m_new = nan_max(m, s);
      const float alpha = rescale_factor(m, m_new), w = softmax_weight(s, m_new);
      for (int64_t d = 0; d < p.head_dim_v; ++d)
        acc[d] = acc[d] * alpha + w * Elem<T>::load(v[v_row(p, b, j, hk) + d]);
      l = l * alpha + w;
      m = m_new;
    }
    for (int64_t d = 0; d < p.head_dim_v; ++d) o[o_row(p, b, i, h) + d] = Elem<T>::store(finish_o(acc[d], m, l));
    lse[lse_at(p, b, h, i)] = finish_lse(m, l);
  }
}

// P_ij and dS_ij (dS rounded to T: PLANTED) of a visible pair, Delta_i from the given o.
template <class T>
__device__ inline void lowp_pair(const af_problem& p, int64_t b, int64_t i, int64_t h, int64_t j, int64_t hk,
                                 const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout,
                                 float& P, float& dS) {
  float dot = 0.0f, dp = 0.0f, delta = 0.0f;
  for (int64_t d = 0; d < p.head_dim; ++d)
    dot += Elem<T>::load(q[q_row(p, b, i, h) + d]) * Elem<T>::load(k[k_row(p, b, j, hk) + d]);
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    const float g = Elem<T>::load(dout[do_row(p, b, i, h) + d]);
    dp += g * Elem<T>::load(v[v_row(p, b, j, hk) + d]);
    delta += g * Elem<T>::load(o[o_row(p, b, i, h) + d]);
  }
  P = expf(p.scale * dot - lse[lse_at(p, b, h, i)]);
  dS = Elem<T>::round(P * (dp - delta));  // PLANTED: dS in T
}

template <class T>
__global__ void __launch_bounds__(kLowpThreads)
    planted_lowp_dq_kernel(af_problem p, const T* q, const T* k, const T* v, const T* o, const float* lse,
                           const T* dout, T* dq) {
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = r % p.seq_q, h = (r / p.seq_q) % p.heads_q, b = r / (p.seq_q * p.heads_q);
    const int64_t hk = kv_head_of(p, h);
    const KeySpan keys = lse[lse_at(p, b, h, i)] == neg_inf() ? KeySpan{0, 0} : row_keys(p, i);
    float acc[kMaxD];
    for (int64_t d = 0; d < p.head_dim; ++d) acc[d] = 0.0f;
    for (int64_t j = keys.first; j < keys.last; ++j) {
      float P, dS;
      lowp_pair(p, b, i, h, j, hk, q, k, v, o, lse, dout, P, dS);
      for (int64_t d = 0; d < p.head_dim; ++d)  // PLANTED: the sum rounded to T after every term
        acc[d] = Elem<T>::round(acc[d] + dS * Elem<T>::load(k[k_row(p, b, j, hk) + d]));
    }
    for (int64_t d = 0; d < p.head_dim; ++d) dq[dq_row(p, b, i, h) + d] = Elem<T>::store(p.scale * acc[d]);
  }
}

template <class T>
__global__ void __launch_bounds__(kLowpThreads)
    planted_lowp_dkv_kernel(af_problem p, const T* q, const T* k, const T* v, const T* o, const float* lse,
                            const T* dout, T* dk, T* dv) {
  const int64_t keys = p.batch * p.heads_kv * p.seq_k, G = p.heads_q / p.heads_kv;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < keys; r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = r % p.seq_k, hk = (r / p.seq_k) % p.heads_kv, b = r / (p.seq_k * p.heads_kv);
    float ak[kMaxD], av[kMaxD];
    for (int64_t d = 0; d < p.head_dim; ++d) ak[d] = 0.0f;
    for (int64_t d = 0; d < p.head_dim_v; ++d) av[d] = 0.0f;
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeySpan ks = row_keys(p, i);
        if (j < ks.first || j >= ks.last || lse[lse_at(p, b, h, i)] == neg_inf()) continue;
        float P, dS;
        lowp_pair(p, b, i, h, j, hk, q, k, v, o, lse, dout, P, dS);
        for (int64_t d = 0; d < p.head_dim; ++d)  // PLANTED: sums in T
          ak[d] = Elem<T>::round(ak[d] + dS * Elem<T>::load(q[q_row(p, b, i, h) + d]));
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          av[d] = Elem<T>::round(av[d] + P * Elem<T>::load(dout[do_row(p, b, i, h) + d]));
      }
    for (int64_t d = 0; d < p.head_dim; ++d) dk[dk_row(p, b, j, hk) + d] = Elem<T>::store(p.scale * ak[d]);
    for (int64_t d = 0; d < p.head_dim_v; ++d) dv[dv_row(p, b, j, hk) + d] = Elem<T>::store(av[d]);
  }
}

constexpr uint32_t kLowpBwdDtypes = AF_SUPPORTS_F16 | AF_SUPPORTS_BF16 | AF_SUPPORTS_BWD_F16 | AF_SUPPORTS_BWD_BF16;

int planted_lowp_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, kLowpBwdDtypes, why, why_len)) return 1;
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD) return unsupported(why, why_len, "D, Dv <= 128");
  return 0;
}

unsigned lowp_grid(int64_t n) { return (unsigned)max64(min64(ceil_div(n, kLowpThreads), 1 << 16), 1); }

int planted_lowp_forward(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (planted_lowp_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  return dispatch_dtype(p, kLowpBwdDtypes, [&](auto tag) {
    using T = decltype(tag);
    void (*f)(af_problem, const T*, const T*, const T*, T*, float*) = planted_lowp_forward_kernel<T>;
    hipLaunchKernelGGL(f, dim3(lowp_grid(p.batch * p.heads_q * p.seq_q)), dim3(kLowpThreads), 0,
                       (hipStream_t)stream, p, static_cast<const T*>(buf->q), static_cast<const T*>(buf->k),
                       static_cast<const T*>(buf->v), static_cast<T*>(buf->o), buf->lse);
    return (int)hipGetLastError();
  });
}

int planted_lowp_launch_bwd(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (planted_lowp_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  return dispatch_dtype(p, kLowpBwdDtypes, [&](auto tag) {
    using T = decltype(tag);
    const T *q = static_cast<const T*>(buf->q), *k = static_cast<const T*>(buf->k),
            *v = static_cast<const T*>(buf->v), *o = static_cast<const T*>(buf->o),
            *dout = static_cast<const T*>(buf->dout);
    void (*dqk)(af_problem, const T*, const T*, const T*, const T*, const float*, const T*, T*) =
        planted_lowp_dq_kernel<T>;
    hipLaunchKernelGGL(dqk, dim3(lowp_grid(p.batch * p.heads_q * p.seq_q)), dim3(kLowpThreads), 0,
                       (hipStream_t)stream, p, q, k, v, o, (const float*)buf->lse, dout, static_cast<T*>(buf->dq));
    if (int e = (int)hipGetLastError()) return e;
    if (p.seq_k == 0) return 0;
    void (*dkv)(af_problem, const T*, const T*, const T*, const T*, const float*, const T*, T*, T*) =
        planted_lowp_dkv_kernel<T>;
    hipLaunchKernelGGL(dkv, dim3(lowp_grid(p.batch * p.heads_kv * p.seq_k)), dim3(kLowpThreads), 0,
                       (hipStream_t)stream, p, q, k, v, o, (const float*)buf->lse, dout, static_cast<T*>(buf->dk),
                       static_cast<T*>(buf->dv));
    return (int)hipGetLastError();
  });
}

#define AF_PLANTED_BWD(NAME, BUG, DESC)                                                                    \
  {                                                                                                        \
    NAME, "planted/flash-bwd", "flash-bm16-bn16's backward with a planted bug: " DESC, AF_SUPPORTS_F32,    \
        AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr,               \
        planted_bwd_check<BwdBug::BUG>, planted_bwd_forward, 0, 0, nullptr, planted_bwd_workspace,                      \
        planted_bwd_launch<BwdBug::BUG>                                                                    \
  }

const af_kernel kBackwardBugs[] = {
    AF_PLANTED_BWD("planted-bwd-delta-scaled", kDeltaScaled, "Delta = scale * rowsum(dO o)"),
    AF_PLANTED_BWD("planted-bwd-mask-not-reapplied", kMaskNotReapplied,
                   "P recomputed for masked keys of a tile too"),
    AF_PLANTED_BWD("planted-bwd-empty-row-nan", kEmptyRowNan, "exp(s - lse) with lse = -inf for an empty row: NaN"),
    AF_PLANTED_BWD("planted-bwd-dk-no-scale", kDkNoScale, "dK stored without the softmax scale"),
    AF_PLANTED_BWD("planted-bwd-dq-plain-add", kDqPlainAdd,
                   "dQ read-modify-written by every key block without atomics (a race)"),
    AF_PLANTED_BWD("planted-bwd-no-ds-barrier", kNoDsBarrier, "no barrier between writing dS and reading it"),
    AF_PLANTED_BWD("planted-bwd-gqa-one-head", kGqaOneHead, "dK / dV of a GQA group from its first query head only"),
    AF_PLANTED_BWD("planted-bwd-tail-kv-oob-write", kTailKvOobWrite,
                   "last key tile's dK / dV stored whole, past the end"),
    AF_PLANTED_BWD("planted-bwd-empty-row-nan-kv", kEmptyRowNanKv,
                   "an empty row's dQ guarded, its exp(s - lse) = NaN still summed into dK / dV"),
    {"planted-bwd-lowp-ds-half", "planted/flash-bwd",
     "f16 / bf16 backward with dS rounded to the element type and dQ / dK / dV summed in it (no fp32 accumulation)",
     kLowpBwdDtypes, AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr,
     planted_lowp_check, planted_lowp_forward, 0, 0, nullptr, nullptr, planted_lowp_launch_bwd},
};

#undef AF_PLANTED_BWD

static_assert(sizeof(kBackwardBugs) / sizeof(kBackwardBugs[0]) == attnfuzz_planted::kBackwardBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::backward_bugs() { return kBackwardBugs; }
