// materialized.hip - attention in three dispatches (scores, row softmax, P.V) with S and P in the workspace;
// its backward materializes P and dS in three dispatches too.
#include "kernels/common.h"
#include "kernels/register.h"

namespace {

constexpr int kElemThreads = 256;  // dispatches 1 and 3: one thread per element, grid-stride loops
constexpr int kRowThreads = 64;    // dispatch 2: one block per row; a power of two (tree reduction)
constexpr int64_t kMaxBlocks = 1 << 16;

// Workspace: scores [B, Hq, Sq, Sk], probabilities [B, Hq, Sq, Sk], row LSE [B, Hq, Sq] (all fp32).
// Only visible (i, j) entries of the two matrices are ever written or read.
__host__ __device__ inline int64_t matrix_elements(const af_problem& p) {
  return p.batch * p.heads_q * p.seq_q * p.seq_k;
}
__host__ __device__ inline int64_t row_count(const af_problem& p) { return p.batch * p.heads_q * p.seq_q; }

// Dispatch 1: S_ij = scale * q_i . k_j for every visible (i, j).
__global__ void __launch_bounds__(kElemThreads)
    scores_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k, float* scores) {
  const int64_t total = matrix_elements(p);
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = idx % p.seq_k;
    int64_t r = idx / p.seq_k;
    const int64_t i = r % p.seq_q;
    r /= p.seq_q;
    const int64_t h = r % p.heads_q, b = r / p.heads_q;
    const KeySpan keys = row_keys(p, i);
    if (j < keys.first || j >= keys.last) continue;  // masked: never computed, never read
    const float* qr = q + q_row(p, b, i, h);
    const float* kr = k + k_row(p, b, j, kv_head_of(p, h));
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
    scores[idx] = p.scale * dot;
  }
}

// Dispatch 2: one block per row: m = max, l = sum exp(s - m), P = exp(s - m) / l over the visible keys;
// row LSE = m + log l (-inf for a fully masked row, whose P is never read).
__global__ void __launch_bounds__(kRowThreads)
    softmax_kernel(af_problem p, const float* __restrict__ scores, float* probs, float* row_lse) {
  __shared__ float red[kRowThreads];
  const int t = threadIdx.x;
  const int64_t rows = row_count(p);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // uniform per block
    const KeySpan keys = row_keys(p, row % p.seq_q);
    const float* s = scores + row * p.seq_k;
    float* pr = probs + row * p.seq_k;

    float m = neg_inf();
    for (int64_t j = keys.first + t; j < keys.last; j += kRowThreads) m = nan_max(m, s[j]);
    red[t] = m;
    __syncthreads();
    for (int w = kRowThreads / 2; w > 0; w /= 2) {
      if (t < w) red[t] = nan_max(red[t], red[t + w]);
      __syncthreads();
    }
    m = red[0];
    __syncthreads();  // everyone has read red[0] before red is reused

    float l = 0.0f;
    for (int64_t j = keys.first + t; j < keys.last; j += kRowThreads) {
      const float e = softmax_weight(s[j], m);
      pr[j] = e;
      l += e;
    }
    red[t] = l;
    __syncthreads();
    for (int w = kRowThreads / 2; w > 0; w /= 2) {
      if (t < w) red[t] += red[t + w];
      __syncthreads();
    }
    l = red[0];
    __syncthreads();  // before the next row reuses red

    if (m != neg_inf())
      for (int64_t j = keys.first + t; j < keys.last; j += kRowThreads) pr[j] = pr[j] / l;  // own entries
    if (t == 0) row_lse[row] = finish_lse(m, l);
  }
}

// Dispatch 3: O_id = sum over visible j of P_ij v_jd (0 for a fully masked row); LSE copied out.
__global__ void __launch_bounds__(kElemThreads)
    pv_kernel(af_problem p, const float* __restrict__ probs, const float* __restrict__ row_lse,
              const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  const int64_t total = row_count(p) * p.head_dim_v;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t d = idx % p.head_dim_v;
    int64_t r = idx / p.head_dim_v;  // output order [B, Sq, Hq]
    const int64_t h = r % p.heads_q;
    r /= p.heads_q;
    const int64_t i = r % p.seq_q, b = r / p.seq_q;
    const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
    const float row_l = row_lse[row];
    float acc = 0.0f;
    if (row_l != neg_inf()) {
      const KeySpan keys = row_keys(p, i);
      const float* pr = probs + row * p.seq_k;
      const float* vc = v + v_row(p, b, 0, kv_head_of(p, h)) + d;
      for (int64_t j = keys.first; j < keys.last; ++j) acc += pr[j] * vc[j * p.v_stride[1]];
    }
    o[o_row(p, b, i, h) + d] = acc;
    if (lse && d == 0) lse[lse_at(p, b, h, i)] = row_l;
  }
}

size_t materialized_workspace(const af_problem* p) {
  return (size_t)(2 * matrix_elements(*p) + row_count(*p)) * sizeof(float);
}

int materialized_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "materialized supports f32 only");
  return 0;
}

int64_t grid_for(int64_t total, int64_t threads) {
  return min64(max64(ceil_div(total, threads), 1), kMaxBlocks);
}

int materialized_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (materialized_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  float* ws = static_cast<float*>(buf->workspace);
  const int64_t n = matrix_elements(p);
  float* scores = ws;
  float* probs = ws + n;
  float* row_lse = ws + 2 * n;
  const float* q = static_cast<const float*>(buf->q);
  const float* k = static_cast<const float*>(buf->k);
  const float* v = static_cast<const float*>(buf->v);
  float* o = static_cast<float*>(buf->o);
  if (n > 0) {
    hipLaunchKernelGGL(scores_kernel, dim3((unsigned)grid_for(n, kElemThreads)), dim3(kElemThreads), 0,
                       (hipStream_t)stream, p, q, k, scores);
    if (int e = (int)hipGetLastError()) return e;
  }
  hipLaunchKernelGGL(softmax_kernel, dim3((unsigned)min64(row_count(p), kMaxBlocks)), dim3(kRowThreads), 0,
                     (hipStream_t)stream, p, (const float*)scores, probs, row_lse);
  if (int e = (int)hipGetLastError()) return e;
  hipLaunchKernelGGL(pv_kernel, dim3((unsigned)grid_for(row_count(p) * p.head_dim_v, kElemThreads)),
                     dim3(kElemThreads), 0, (hipStream_t)stream, p, (const float*)probs,
                     (const float*)row_lse, v, o, buf->lse);
  return (int)hipGetLastError();
}


// ---- backward: P and dP, then Delta = rowsum(P dP) and dS = P (dP - Delta), then one thread per gradient
// element. Workspace: P [B, Hq, Sq, Sk], dP / dS [B, Hq, Sq, Sk], Delta [B, Hq, Sq]. Only visible pairs of
// rows with a finite-or-NaN lse are written or read (an empty row, lse = -inf, contributes nothing).

__host__ __device__ inline int64_t mdo_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.do_stride[0] + s * p.do_stride[1] + h * p.do_stride[2];
}

// Whether row (b, h, i) and key j form a pair that reaches a gradient.
__host__ __device__ inline bool pair_live(const af_problem& p, const float* lse, int64_t b, int64_t h, int64_t i,
                                          int64_t j) {
  const KeySpan keys = row_keys(p, i);
  return j >= keys.first && j < keys.last && lse[lse_at(p, b, h, i)] != neg_inf();
}

// Dispatch 1: P_ij = exp(s_ij - lse_i) and dP_ij = dO_i . v_j.
__global__ void __launch_bounds__(kElemThreads)
    bwd_p_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                 const float* __restrict__ lse, const float* __restrict__ dout, float* probs, float* dsm) {
  const int64_t total = matrix_elements(p);
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = idx % p.seq_k;
    int64_t r = idx / p.seq_k;
    const int64_t i = r % p.seq_q;
    r /= p.seq_q;
    const int64_t h = r % p.heads_q, b = r / p.heads_q, hk = kv_head_of(p, h);
    if (!pair_live(p, lse, b, h, i, j)) continue;
    const float* qr = q + q_row(p, b, i, h);
    const float* kr = k + k_row(p, b, j, hk);
    const float* g = dout + mdo_row(p, b, i, h);
    const float* vr = v + v_row(p, b, j, hk);
    float dot = 0.0f, dp = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
    for (int64_t d = 0; d < p.head_dim_v; ++d) dp += g[d] * vr[d];
    probs[idx] = expf(p.scale * dot - lse[lse_at(p, b, h, i)]);
    dsm[idx] = dp;
  }
}

// Dispatch 2: one block per row: Delta = sum_j P dP (tree reduction), then dS = P (dP - Delta) in place.
__global__ void __launch_bounds__(kRowThreads)
    bwd_ds_kernel(af_problem p, const float* __restrict__ lse, const float* __restrict__ probs, float* dsm) {
  __shared__ float red[kRowThreads];
  const int t = threadIdx.x;
  const int64_t rows = row_count(p);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % p.seq_q, h = (row / p.seq_q) % p.heads_q, b = row / (p.seq_q * p.heads_q);
    KeySpan keys = row_keys(p, i);
    if (lse[lse_at(p, b, h, i)] == neg_inf()) keys.last = keys.first;
    const float* pr = probs + row * p.seq_k;
    float* ds = dsm + row * p.seq_k;
    float acc = 0.0f;
    for (int64_t j = keys.first + t; j < keys.last; j += kRowThreads) acc += pr[j] * ds[j];
    red[t] = acc;
    __syncthreads();
    for (int w = kRowThreads / 2; w > 0; w /= 2) {
      if (t < w) red[t] += red[t + w];
      __syncthreads();
    }
    const float delta = red[0];
    __syncthreads();  // everyone has read red[0] before the next row reuses red
    for (int64_t j = keys.first + t; j < keys.last; j += kRowThreads) ds[j] = pr[j] * (ds[j] - delta);
  }
}

// Dispatch 3: one thread per element of dQ [B, Sq, Hq, D], then dK [B, Sk, Hkv, D], then dV [B, Sk, Hkv, Dv].
__global__ void __launch_bounds__(kElemThreads)
    bwd_grad_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k,
                    const float* __restrict__ lse, const float* __restrict__ dout, const float* __restrict__ probs,
                    const float* __restrict__ dsm, float* dq, float* dk, float* dv) {
  const int64_t D = p.head_dim, Dv = p.head_dim_v, G = p.heads_q / p.heads_kv;
  const int64_t nq = p.batch * p.seq_q * p.heads_q * D, nk = p.batch * p.seq_k * p.heads_kv * D;
  const int64_t total = nq + nk + p.batch * p.seq_k * p.heads_kv * Dv;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    if (idx < nq) {
      const int64_t d = idx % D, h = (idx / D) % p.heads_q, i = (idx / (D * p.heads_q)) % p.seq_q,
                    b = idx / (D * p.heads_q * p.seq_q);
      const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
      float acc = 0.0f;
      if (lse[lse_at(p, b, h, i)] != neg_inf()) {
        const KeySpan keys = row_keys(p, i);
        for (int64_t j = keys.first; j < keys.last; ++j) acc += dsm[row * p.seq_k + j] * k[k_row(p, b, j, kv_head_of(p, h)) + d];
      }
      dq[b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2] + d] = p.scale * acc;
      continue;
    }
    const bool is_k = idx < nq + nk;
    const int64_t e = is_k ? idx - nq : idx - nq - nk, W = is_k ? D : Dv;
    const int64_t d = e % W, hk = (e / W) % p.heads_kv, j = (e / (W * p.heads_kv)) % p.seq_k,
                  b = e / (W * p.heads_kv * p.seq_k);
    float acc = 0.0f;
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        if (!pair_live(p, lse, b, h, i, j)) continue;
        const int64_t at = ((b * p.heads_q + h) * p.seq_q + i) * p.seq_k + j;
        acc += is_k ? dsm[at] * q[q_row(p, b, i, h) + d] : probs[at] * dout[mdo_row(p, b, i, h) + d];
      }
    if (is_k)
      dk[b * p.dk_stride[0] + j * p.dk_stride[1] + hk * p.dk_stride[2] + d] = p.scale * acc;
    else
      dv[b * p.dv_stride[0] + j * p.dv_stride[1] + hk * p.dv_stride[2] + d] = acc;
  }
}

size_t materialized_bwd_workspace(const af_problem* p) {
  return (size_t)(2 * matrix_elements(*p) + row_count(*p)) * sizeof(float);
}

int materialized_bwd_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (materialized_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  float* ws = static_cast<float*>(buf->workspace);
  const int64_t n = matrix_elements(p);
  float* probs = ws;
  float* dsm = ws + n;
  const float* q = static_cast<const float*>(buf->q);
  const float* k = static_cast<const float*>(buf->k);
  const float* v = static_cast<const float*>(buf->v);
  const float* dout = static_cast<const float*>(buf->dout);
  const float* lse = buf->lse;
  if (n > 0) {
    hipLaunchKernelGGL(bwd_p_kernel, dim3((unsigned)grid_for(n, kElemThreads)), dim3(kElemThreads), 0,
                       (hipStream_t)stream, p, q, k, v, lse, dout, probs, dsm);
    if (int e = (int)hipGetLastError()) return e;
    hipLaunchKernelGGL(bwd_ds_kernel, dim3((unsigned)min64(row_count(p), kMaxBlocks)), dim3(kRowThreads), 0,
                       (hipStream_t)stream, p, lse, (const float*)probs, dsm);
    if (int e = (int)hipGetLastError()) return e;
  }
  const int64_t total =
      p.batch * (p.seq_q * p.heads_q * p.head_dim + p.seq_k * p.heads_kv * (p.head_dim + p.head_dim_v));
  hipLaunchKernelGGL(bwd_grad_kernel, dim3((unsigned)grid_for(total, kElemThreads)), dim3(kElemThreads), 0,
                     (hipStream_t)stream, p, q, k, lse, dout, (const float*)probs, (const float*)dsm,
                     static_cast<float*>(buf->dq), static_cast<float*>(buf->dk), static_cast<float*>(buf->dv));
  return (int)hipGetLastError();
}

const af_kernel kMaterializedKernels[] = {
    {"materialized", "materialized",
     "3 dispatches: scores, row softmax, P.V; S and P materialized in the workspace (seed 000); backward: "
     "P / dP, Delta = rowsum(P dP) and dS, then one thread per gradient element",
     AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, /*max_head_dim=*/0, /*max_head_dim_v=*/0, /*writes_lse=*/1,
     /*needs_dv_eq_d=*/0, materialized_workspace, materialized_check, materialized_launch, 0, 0, nullptr,
     materialized_bwd_workspace, materialized_bwd_launch},
};

}  // namespace

AF_REGISTER_KERNELS(kMaterializedKernels);
