// flash.hip - tiled flash attention: a BLOCK_M query tile sweeps BLOCK_N key tiles, softmax state on chip;
// FlashAttention-2 style backward (key-tile blocks; dQ by atomicAdd, or deterministic in its own pass).
#include "kernels/common.h"
#include "kernels/register.h"

namespace {

constexpr int kMaxD = 128;  // largest D and Dv (the tiles hold whole rows in shared memory)

// One block per (query tile, head, batch). Shared memory: the Q tile, one K tile that is then reused for
// the V tile, the score / probability tile, and per-row m, l, alpha and visible key interval. Each thread
// keeps BM * kMaxD / NT output accumulators in registers (element e: flat index t + e * NT of the tile's
// [BM, Dv] output). Per key tile, four barriers:
//   1. K tile loaded          -> scores S = scale * Q K^T (masked entries -inf) into s_tile
//   2. s_tile complete        -> V tile loaded into kv_tile (K no longer read); BM threads update their
//                                row's m, l and turn s_tile into weights exp(s - m_new)
//   3. weights and V ready    -> acc = alpha * acc + sum over visible j of P_ij V_j
//   4. tile consumed          -> the next tile may overwrite kv_tile and s_tile
// Only visible keys are multiplied into the output; masked K/V are never read from s_tile / kv_tile.
// Element type T (common.h Elem): q, k, v loaded into the fp32 tiles exactly; scores, m, l and the accumulators
// fp32; the weights rounded to T for P.V only (l sums the unrounded ones, as FlashAttention does); O rounded
// to T once on store. fp8 folds q/k descales into the score scale and applies v_descale, o_scale on store (the
// per-head ones of (b, h) and (b, hk) with AF_VARIANT_HEAD_DESCALE).
template <class T, int BM, int BN, int NT>
__global__ void __launch_bounds__(NT)
    flash_kernel(af_problem p, const T* __restrict__ q, const T* __restrict__ k,
                 const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse, VariantBufs vb) {
  static_assert(NT >= BM, "one thread per row updates the softmax state");
  static_assert((BM * kMaxD) % NT == 0, "accumulators split evenly over the threads");
  constexpr int kAcc = BM * kMaxD / NT;
  __shared__ float q_tile[BM][kMaxD];
  __shared__ float kv_tile[BN][kMaxD];
  __shared__ float s_tile[BM][BN];
  __shared__ unsigned char keep[BM][BN];  // visible under mask_kind and the custom mask (docs "Custom masks")
  __shared__ float row_m[BM], row_l[BM], row_alpha[BM];
  __shared__ int64_t row_first[BM], row_last[BM];

  const int t = threadIdx.x;
  const int64_t i0 = (int64_t)blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hk = kv_head_of(p, h);
  const int64_t D = p.head_dim, Dv = p.head_dim_v;
  const int rows = (int)min64(BM, p.seq_q - i0);  // valid rows of this tile

  for (int64_t idx = t; idx < BM * D; idx += NT) {
    const int r = (int)(idx / D);
    const int64_t d = idx % D;
    q_tile[r][d] = r < rows ? Elem<T>::load(q[q_row(p, b, i0 + r, h) + d]) : 0.0f;
  }
  if (t < BM) {
    const KeySpan keys = t < rows ? row_keys(p, i0 + t) : KeySpan{0, 0};
    row_first[t] = keys.first;
    row_last[t] = keys.last;
    row_m[t] = neg_inf();
    row_l[t] = 0.0f;
  }
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  __syncthreads();

  // Keys visible to some row of the tile: [lo, hi). Key tiles start at multiples of BN.
  int64_t lo = p.seq_k, hi = 0;
  for (int r = 0; r < BM; ++r)
    if (row_first[r] < row_last[r]) {
      lo = min64(lo, row_first[r]);
      hi = max64(hi, row_last[r]);
    }

  for (int64_t n0 = lo < hi ? lo - lo % BN : hi; n0 < hi; n0 += BN) {
    for (int64_t idx = t; idx < BN * D; idx += NT) {
      const int c = (int)(idx / D);
      const int64_t d = idx % D, j = n0 + c;
      kv_tile[c][d] = (j >= lo && j < hi) ? Elem<T>::load(k[k_row(p, b, j, hk) + d]) : 0.0f;
    }
    __syncthreads();  // 1

    for (int idx = t; idx < BM * BN; idx += NT) {
      const int r = idx / BN, c = idx % BN;
      const int64_t j = n0 + c;
      float s = neg_inf();
      keep[r][c] = j >= row_first[r] && j < row_last[r] && mask_keeps(p, vb, b, h, i0 + r, j);
      if (keep[r][c]) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += q_tile[r][d] * kv_tile[c][d];
        s = variant_score(p, vb, b, h, i0 + r, j, score_scale<T>(p, vb, b, h, hk) * dot);
      }
      s_tile[r][c] = s;
    }
    __syncthreads();  // 2

    for (int64_t idx = t; idx < BN * Dv; idx += NT) {
      const int c = (int)(idx / Dv);
      const int64_t d = idx % Dv, j = n0 + c;
      kv_tile[c][d] = (j >= lo && j < hi) ? Elem<T>::load(v[v_row(p, b, j, hk) + d]) : 0.0f;
    }
    if (t < BM) {
      float tile_max = neg_inf();
      for (int c = 0; c < BN; ++c) tile_max = nan_max(tile_max, s_tile[t][c]);
      const float m_old = row_m[t], m_new = nan_max(m_old, tile_max);
      const float alpha = rescale_factor(m_old, m_new);
      float sum = 0.0f;
      for (int c = 0; c < BN; ++c) {
        const float w = softmax_weight(s_tile[t][c], m_new);
        s_tile[t][c] = w;
        sum += w;  // l sums every weight; dropout zeroes the dropped ones for P.V only
        const int64_t j = n0 + c;
        if (has_dropout(p) && t < rows && j >= row_first[t] && j < row_last[t] && !dropout_keep(p, vb, b, h, i0 + t, j))
          s_tile[t][c] = 0.0f;
      }
      row_l[t] = row_l[t] * alpha + sum;
      row_m[t] = m_new;
      row_alpha[t] = alpha;
    }
    __syncthreads();  // 3

    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int idx = t + e * NT;
      if (idx < BM * Dv) {
        const int r = idx / (int)Dv, d = idx % (int)Dv;
        const int c_lo = (int)(max64(row_first[r], n0) - n0), c_hi = (int)(min64(row_last[r], n0 + BN) - n0);
        float pv = 0.0f;
        for (int c = c_lo; c < c_hi; ++c)
          if (keep[r][c]) pv += Elem<T>::round(s_tile[r][c]) * kv_tile[c][d];  // a hidden v is never read
        acc[e] = acc[e] * row_alpha[r] + pv;
      }
    }
    __syncthreads();  // 4
  }
  // A sink enters the denominator only (docs/semantics.md "Variants"): folded into the final state.
  if (t < BM) row_alpha[t] = fold_sink(variant_sink(p, vb, h), row_m[t], row_l[t]);
  __syncthreads();
  if (p.variants & AF_VARIANT_SINK) {
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int idx = t + e * NT;
      if (idx < BM * Dv) acc[e] *= row_alpha[idx / (int)Dv];
    }
  }

  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int idx = t + e * NT;
    if (idx < rows * Dv) {
      const int r = idx / (int)Dv, d = idx % (int)Dv;
      o[o_row(p, b, i0 + r, h) + d] = store_o<T>(p, vb, b, hk, finish_o(acc[e], row_m[r], row_l[r]) * dropout_scale(p));
    }
  }
  if (lse && t < rows) lse[lse_at(p, b, h, i0 + t)] = finish_lse(row_m[t], row_l[t]);
}

template <int BM, int BN, int NT, uint32_t DT>
int flash_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, DT, why, why_len)) return 1;
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD)
    return unsupported(why, why_len, "flash supports D, Dv <= 128");
  if (!grid_fits(ceil_div(p->seq_q, BM), p->heads_q, p->batch, NT))
    return unsupported(why, why_len, "flash grid (Sq / BLOCK_M, Hq, B) exceeds the launch limits");
  return 0;
}

template <int BM, int BN, int NT, uint32_t DT>
int flash_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (flash_check<BM, BN, NT, DT>(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  return dispatch_dtype(p, DT, [&](auto tag) {
    using T = decltype(tag);
    void (*kernel)(af_problem, const T*, const T*, const T*, T*, float*, VariantBufs) = flash_kernel<T, BM, BN, NT>;
    hipLaunchKernelGGL(kernel, dim3((unsigned)ceil_div(p.seq_q, BM), (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(NT), 0, (hipStream_t)stream, p, static_cast<const T*>(buf->q),
                       static_cast<const T*>(buf->k), static_cast<const T*>(buf->v), static_cast<T*>(buf->o),
                       buf->lse, variant_bufs(*buf));
    return (int)hipGetLastError();
  });
}


// ---- backward (FlashAttention-2 style) -----------------------------------------------------------------
//
// Workspace: Delta [B, Hq, Sq] = rowsum(dO * o) (fp32), written by bwd_pre_kernel, which also zeroes dQ
// when dQ is accumulated by atomics. bwd_kv_kernel: one block per (key tile of BN keys, kv head, batch)
// keeps its dK / dV tile in registers while it sweeps every query head of the GQA group and every BM-row
// query tile that sees one of its keys: P = exp(s - lse) recomputed from the given LSE (0 where the mask
// hides the key or the row is empty), dS = P (dP - Delta). Only visible (i, j) pairs reach a gradient.
// With kAtomicDq each block adds its dS K contribution to dQ with atomicAdd (order across key blocks is
// whatever the hardware does); otherwise bwd_dq_kernel computes dQ in its own pass, one block per query
// tile sweeping the key tiles in order (deterministic). Element type T (the deterministic variant also takes
// f16 / bf16, as FlashAttention's backward does): q, k, v, o, dO loaded exactly into fp32; P, dP, Delta, dS and
// every accumulation in fp32; dQ, dK, dV rounded to T once on store. The atomic variant is fp32 only.

__host__ __device__ inline int64_t delta_at(const af_problem& p, int64_t b, int64_t h, int64_t i) {
  return (b * p.heads_q + h) * p.seq_q + i;
}
__host__ __device__ inline int64_t do_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.do_stride[0] + s * p.do_stride[1] + h * p.do_stride[2];
}
__host__ __device__ inline int64_t dq_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.dq_stride[0] + s * p.dq_stride[1] + h * p.dq_stride[2];
}
__host__ __device__ inline int64_t dk_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.dk_stride[0] + s * p.dk_stride[1] + h * p.dk_stride[2];
}
__host__ __device__ inline int64_t dv_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.dv_stride[0] + s * p.dv_stride[1] + h * p.dv_stride[2];
}

constexpr int kPreThreads = 128;

// One thread per query row (b, h, i): Delta_i = sum_d dO_id o_id; optionally dQ_i = 0.
template <class T>
__global__ void __launch_bounds__(kPreThreads)
    bwd_pre_kernel(af_problem p, const T* __restrict__ o, const T* __restrict__ dout, float* delta,
                   float* dq, int zero_dq, float* dbias) {
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = r % p.seq_q, h = (r / p.seq_q) % p.heads_q, b = r / (p.seq_q * p.heads_q);
    const T* orow = o + o_row(p, b, i, h);
    const T* g = dout + do_row(p, b, i, h);
    float acc = 0.0f;
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc += Elem<T>::load(g[d]) * Elem<T>::load(orow[d]);
    delta[delta_at(p, b, h, i)] = acc;
    if (zero_dq)
      for (int64_t d = 0; d < p.head_dim; ++d) dq[dq_row(p, b, i, h) + d] = 0.0f;
    // d bias is accumulated by the key blocks: zeroed first, each element by the one row thread that owns it
    // (index 0 along a broadcast dimension).
    if (dbias && (p.bias_stride[0] || b == 0) && (p.bias_stride[1] || h == 0) && (p.bias_stride[2] || i == 0))
      for (int64_t j = 0; j < (p.bias_stride[3] ? p.seq_k : 1); ++j)
        dbias[b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]] = 0.0f;
  }
}

// d sink_h = -sum over (b, i) of exp(sink_h - lse_i) Delta_i (docs/semantics.md "Variants"), one thread per head,
// rows in order (deterministic).
__global__ void __launch_bounds__(kPreThreads)
    bwd_sink_kernel(af_problem p, const float* __restrict__ sinks, const float* __restrict__ lse,
                    const float* __restrict__ delta, float* dsinks) {
  for (int64_t h = threadIdx.x; h < p.heads_q; h += blockDim.x) {
    const float sink = sinks[h];
    float acc = 0.0f;
    if (sink != neg_inf())
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t i = 0; i < p.seq_q; ++i) {
          const float l = lse[lse_at(p, b, h, i)];
          if (l == neg_inf()) continue;
          acc -= expf(sink - l) * delta[delta_at(p, b, h, i)];
        }
    dsinks[h] = acc;
  }
}

// P_ij and dS_ij of a visible pair (b, h, i, j) (row i with lse / Delta, key row kc / vc on chip). Score variants:
// P from the final score; dS_f = P (dP - Delta) is the final score's gradient (d bias), dS = dS_f (1 - tanh^2)
// the raw score's (dQ, dK).
template <class T>
__device__ inline void bwd_pair(const af_problem& p, const VariantBufs& vb, int64_t b, int64_t h, int64_t i, int64_t j,
                                const T* qi, const T* gi, const float* kc, const float* vc, float lse, float delta,
                                float& P, float& dS, float& dS_f) {
  float dot = 0.0f, dp = 0.0f;
  for (int64_t d = 0; d < p.head_dim; ++d) dot += Elem<T>::load(qi[d]) * kc[d];
  for (int64_t d = 0; d < p.head_dim_v; ++d) dp += Elem<T>::load(gi[d]) * vc[d];
  float dcap;
  P = expf(variant_score(p, vb, b, h, i, j, p.scale * dot, &dcap) - lse);
  if (has_dropout(p)) {  // the forward's mask: dP and dV see the kept weights scaled by 1 / (1 - p)
    const float c = dropout_keep(p, vb, b, h, i, j) ? dropout_scale(p) : 0.0f;
    dp *= c;
    dS_f = P * (dp - delta);
    P *= c;  // what dV = P^T dO uses
  } else {
    dS_f = P * (dp - delta);
  }
  dS = dS_f * dcap;
}

template <class T, int BM, int BN, int NT, bool kAtomicDq>
__global__ void __launch_bounds__(NT)
    bwd_kv_kernel(af_problem p, const T* __restrict__ q, const T* __restrict__ k,
                  const T* __restrict__ v, const float* __restrict__ lse, const T* __restrict__ dout,
                  const float* __restrict__ delta, float* dq, T* __restrict__ dk, T* __restrict__ dv, VariantBufs vb,
                  float* dbias) {
  static_assert((BN * kMaxD) % NT == 0, "accumulators split evenly over the threads");
  constexpr int kAcc = BN * kMaxD / NT;
  __shared__ float k_tile[BN][kMaxD];
  __shared__ float v_tile[BN][kMaxD];
  __shared__ float p_tile[BM][BN];
  __shared__ float ds_tile[BM][BN];
  __shared__ unsigned char keep[BM][BN];  // the pair is visible (mask_kind and custom mask)
  __shared__ float row_lse[BM], row_delta[BM];
  __shared__ int64_t row_first[BM], row_last[BM];

  const int t = threadIdx.x;
  const int64_t j0 = (int64_t)blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z;
  const int64_t D = p.head_dim, Dv = p.head_dim_v, G = p.heads_q / p.heads_kv;
  const int cols = (int)min64(BN, p.seq_k - j0);
  for (int64_t idx = t; idx < BN * D; idx += NT) {
    const int c = (int)(idx / D);
    k_tile[c][idx % D] = c < cols ? Elem<T>::load(k[k_row(p, b, j0 + c, hk) + idx % D]) : 0.0f;
  }
  for (int64_t idx = t; idx < BN * Dv; idx += NT) {
    const int c = (int)(idx / Dv);
    v_tile[c][idx % Dv] = c < cols ? Elem<T>::load(v[v_row(p, b, j0 + c, hk) + idx % Dv]) : 0.0f;
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
        // The row's visible keys inside this tile; none for an empty row (lse = -inf).
        row_first[t] = l == neg_inf() ? j0 : max64(keys.first, j0);
        row_last[t] = l == neg_inf() ? j0 : min64(keys.last, j0 + cols);
        row_lse[t] = l;
        row_delta[t] = i < p.seq_q ? delta[delta_at(p, b, h, i)] : 0.0f;
      }
      __syncthreads();
      bool any = false;
      for (int r = 0; r < BM; ++r) any = any || row_first[r] < row_last[r];
      if (any) {
        for (int idx = t; idx < BM * BN; idx += NT) {
          const int r = idx / BN, c = idx % BN;
          const int64_t j = j0 + c;
          float P = 0.0f, dS = 0.0f, dS_f = 0.0f;
          keep[r][c] = j >= row_first[r] && j < row_last[r] && mask_keeps(p, vb, b, h, i0 + r, j);
          if (keep[r][c]) {
            bwd_pair(p, vb, b, h, i0 + r, j, q + q_row(p, b, i0 + r, h), dout + do_row(p, b, i0 + r, h), k_tile[c],
                     v_tile[c], row_lse[r], row_delta[r], P, dS, dS_f);
            if (dbias) {  // one writer per element unless the bias is broadcast
              float* e = dbias + b * p.bias_stride[0] + h * p.bias_stride[1] + (i0 + r) * p.bias_stride[2] +
                         j * p.bias_stride[3];
              if (p.bias_stride[0] && p.bias_stride[1] && p.bias_stride[2] && p.bias_stride[3])
                *e = dS_f;
              else
                atomicAdd(e, dS_f);
            }
          }
          p_tile[r][c] = P;
          ds_tile[r][c] = dS;
        }
        __syncthreads();
        AF_UNROLL
        for (int e = 0; e < kAcc; ++e) {
          const int idx = t + e * NT;
          const int c = idx / kMaxD, d = idx % kMaxD;
          const int64_t j = j0 + c;
          if (c >= cols) continue;
          float sk = 0.0f, sv = 0.0f;
          for (int r = 0; r < BM; ++r) {
            if (!keep[r][c]) continue;  // masked: never reaches a gradient
            if (d < D) sk += ds_tile[r][c] * Elem<T>::load(q[q_row(p, b, i0 + r, h) + d]);
            if (d < Dv) sv += p_tile[r][c] * Elem<T>::load(dout[do_row(p, b, i0 + r, h) + d]);
          }
          dk_acc[e] += sk;
          dv_acc[e] += sv;
        }
        if (kAtomicDq) {
          for (int64_t idx = t; idx < BM * D; idx += NT) {
            const int r = (int)(idx / D);
            const int64_t d = idx % D;
            if (row_first[r] >= row_last[r]) continue;
            float acc = 0.0f;
            for (int64_t j = row_first[r]; j < row_last[r]; ++j)
              if (keep[r][j - j0]) acc += ds_tile[r][j - j0] * k_tile[j - j0][d];
            atomicAdd(&dq[dq_row(p, b, i0 + r, h) + d], p.scale * acc);
          }
        }
      }
      __syncthreads();  // before the next query tile overwrites the row state and tiles
    }
  }
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int idx = t + e * NT;
    const int c = idx / kMaxD, d = idx % kMaxD;
    if (c >= cols) continue;
    if (d < D) dk[dk_row(p, b, j0 + c, hk) + d] = Elem<T>::store(p.scale * dk_acc[e]);
    if (d < Dv) dv[dv_row(p, b, j0 + c, hk) + d] = Elem<T>::store(dv_acc[e]);
  }
}

// Deterministic dQ: one block per (BM-row query tile, head, batch) sweeping its key tiles in order.
template <class T, int BM, int BN, int NT>
__global__ void __launch_bounds__(NT)
    bwd_dq_kernel(af_problem p, const T* __restrict__ q, const T* __restrict__ k,
                  const T* __restrict__ v, const float* __restrict__ lse, const T* __restrict__ dout,
                  const float* __restrict__ delta, T* __restrict__ dq, VariantBufs vb) {
  static_assert((BM * kMaxD) % NT == 0, "accumulators split evenly over the threads");
  constexpr int kAcc = BM * kMaxD / NT;
  __shared__ float k_tile[BN][kMaxD];
  __shared__ float v_tile[BN][kMaxD];
  __shared__ float ds_tile[BM][BN];
  __shared__ unsigned char keep[BM][BN];
  __shared__ float row_lse[BM], row_delta[BM];
  __shared__ int64_t row_first[BM], row_last[BM];
  const int t = threadIdx.x;
  const int64_t i0 = (int64_t)blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hk = kv_head_of(p, h);
  const int64_t D = p.head_dim, Dv = p.head_dim_v;
  const int rows = (int)min64(BM, p.seq_q - i0);
  if (t < BM) {
    const KeySpan keys = t < rows ? row_keys(p, i0 + t) : KeySpan{0, 0};
    const float l = t < rows ? lse[lse_at(p, b, h, i0 + t)] : neg_inf();
    row_first[t] = l == neg_inf() ? 0 : keys.first;
    row_last[t] = l == neg_inf() ? 0 : keys.last;
    row_lse[t] = l;
    row_delta[t] = t < rows ? delta[delta_at(p, b, h, i0 + t)] : 0.0f;
  }
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  __syncthreads();
  int64_t lo = p.seq_k, hi = 0;
  for (int r = 0; r < BM; ++r)
    if (row_first[r] < row_last[r]) lo = min64(lo, row_first[r]), hi = max64(hi, row_last[r]);
  for (int64_t n0 = lo < hi ? lo - lo % BN : hi; n0 < hi; n0 += BN) {
    for (int64_t idx = t; idx < BN * D; idx += NT) {
      const int c = (int)(idx / D);
      const int64_t j = n0 + c;
      k_tile[c][idx % D] = (j >= lo && j < hi) ? Elem<T>::load(k[k_row(p, b, j, hk) + idx % D]) : 0.0f;
    }
    for (int64_t idx = t; idx < BN * Dv; idx += NT) {
      const int c = (int)(idx / Dv);
      const int64_t j = n0 + c;
      v_tile[c][idx % Dv] = (j >= lo && j < hi) ? Elem<T>::load(v[v_row(p, b, j, hk) + idx % Dv]) : 0.0f;
    }
    __syncthreads();
    for (int idx = t; idx < BM * BN; idx += NT) {
      const int r = idx / BN, c = idx % BN;
      const int64_t j = n0 + c;
      float P = 0.0f, dS = 0.0f, dS_f = 0.0f;
      keep[r][c] = j >= row_first[r] && j < row_last[r] && mask_keeps(p, vb, b, h, i0 + r, j);
      if (keep[r][c])
        bwd_pair(p, vb, b, h, i0 + r, j, q + q_row(p, b, i0 + r, h), dout + do_row(p, b, i0 + r, h), k_tile[c],
                 v_tile[c], row_lse[r], row_delta[r], P, dS, dS_f);
      ds_tile[r][c] = dS;
    }
    __syncthreads();
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int idx = t + e * NT;
      const int r = idx / kMaxD, d = idx % kMaxD;
      if (d >= D) continue;
      const int64_t c_lo = max64(row_first[r], n0) - n0, c_hi = min64(row_last[r], n0 + BN) - n0;
      float s = 0.0f;
      for (int64_t c = c_lo; c < c_hi; ++c)
        if (keep[r][c]) s += ds_tile[r][c] * k_tile[c][d];
      acc[e] += s;
    }
    __syncthreads();
  }
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int idx = t + e * NT;
    const int r = idx / kMaxD, d = idx % kMaxD;
    if (r < rows && d < D) dq[dq_row(p, b, i0 + r, h) + d] = Elem<T>::store(p.scale * acc[e]);
  }
}

size_t flash_bwd_workspace(const af_problem* p) {
  return (size_t)(p->batch * p->heads_q * p->seq_q) * sizeof(float);
}

// The backward's dtypes: the deterministic variant f32, f16, bf16; the atomic-dQ one f32 (atomicAdd on fp32 dQ).
template <bool kAtomicDq>
constexpr uint32_t kBwdDtypes = kAtomicDq ? AF_SUPPORTS_F32 : (AF_SUPPORTS_F32 | AF_SUPPORTS_F16 | AF_SUPPORTS_BF16);

template <int BM, int BN, int NT, bool kAtomicDq>
int flash_bwd_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (p.head_dim > kMaxD || p.head_dim_v > kMaxD ||
      !grid_fits(max64(ceil_div(p.seq_k, BN), 1), p.heads_kv, p.batch, NT) ||
      !grid_fits(ceil_div(p.seq_q, BM), p.heads_q, p.batch, NT))
    return (int)hipErrorInvalidValue;
  return dispatch_dtype(p, kBwdDtypes<kAtomicDq>, [&](auto tag) {
    using T = decltype(tag);
    const T* q = static_cast<const T*>(buf->q);
    const T* k = static_cast<const T*>(buf->k);
    const T* v = static_cast<const T*>(buf->v);
    const T* o = static_cast<const T*>(buf->o);
    const T* dout = static_cast<const T*>(buf->dout);
    float* delta = static_cast<float*>(buf->workspace);
    // Atomic dQ accumulates into the fp32 dq buffer (T is float then); the deterministic pass stores T.
    float* dq_acc = kAtomicDq ? static_cast<float*>(buf->dq) : nullptr;
    const int64_t rows = p.batch * p.heads_q * p.seq_q;
    const VariantBufs vb = variant_bufs(*buf);
    float* dbias = (p.variants & AF_VARIANT_BIAS) ? buf->dbias : nullptr;
    void (*pre)(af_problem, const T*, const T*, float*, float*, int, float*) = bwd_pre_kernel<T>;
    hipLaunchKernelGGL(pre, dim3((unsigned)min64(ceil_div(rows, kPreThreads), 1 << 16)), dim3(kPreThreads), 0,
                       (hipStream_t)stream, p, o, dout, delta, dq_acc, kAtomicDq ? 1 : 0, dbias);
    if (int e = (int)hipGetLastError()) return e;
    if (p.variants & AF_VARIANT_SINK) {
      hipLaunchKernelGGL(bwd_sink_kernel, dim3(1), dim3(kPreThreads), 0, (hipStream_t)stream, p, buf->sinks,
                         (const float*)buf->lse, (const float*)delta, buf->dsinks);
      if (int e = (int)hipGetLastError()) return e;
    }
    if (p.seq_k > 0) {
      void (*kv)(af_problem, const T*, const T*, const T*, const float*, const T*, const float*, float*, T*, T*,
                 VariantBufs, float*) = bwd_kv_kernel<T, BM, BN, NT, kAtomicDq>;
      hipLaunchKernelGGL(kv, dim3((unsigned)ceil_div(p.seq_k, BN), (unsigned)p.heads_kv, (unsigned)p.batch),
                         dim3(NT), 0, (hipStream_t)stream, p, q, k, v, (const float*)buf->lse, dout,
                         (const float*)delta, dq_acc, static_cast<T*>(buf->dk), static_cast<T*>(buf->dv), vb, dbias);
      if (int e = (int)hipGetLastError()) return e;
    }
    if (!kAtomicDq) {
      void (*dqk)(af_problem, const T*, const T*, const T*, const float*, const T*, const float*, T*, VariantBufs) =
          bwd_dq_kernel<T, BM, BN, NT>;
      hipLaunchKernelGGL(dqk, dim3((unsigned)ceil_div(p.seq_q, BM), (unsigned)p.heads_q, (unsigned)p.batch),
                         dim3(NT), 0, (hipStream_t)stream, p, q, k, v, (const float*)buf->lse, dout,
                         (const float*)delta, static_cast<T*>(buf->dq), vb);
    }
    return (int)hipGetLastError();
  });
}

constexpr uint32_t kHalves = AF_SUPPORTS_F32 | AF_SUPPORTS_F16 | AF_SUPPORTS_BF16;
constexpr uint32_t kWithFp8 = kHalves | AF_SUPPORTS_FP8_E4M3;

#define AF_FLASH_ENTRY(BM, BN, NT, DT, BWD_DESC, BWD_WS, BWD, VAR)                                        \
  {                                                                                                        \
    "flash-bm" #BM "-bn" #BN, "flash",                                                                     \
        "tiled flash attention, BLOCK_M=" #BM " BLOCK_N=" #BN ", " #NT " threads, online softmax on chip"  \
        BWD_DESC,                                                                                          \
        DT, AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0,                    \
        nullptr, flash_check<BM, BN, NT, DT>, flash_launch<BM, BN, NT, DT>, 0, 0, nullptr, BWD_WS, BWD,    \
        /*compute_model=*/0, /*kind=*/0, /*flags=*/0,                                                      \
        /*variants=*/kScoreVariants | kMaskVariants | AF_VARIANT_DROPOUT | AF_VARIANT_KV_SHARED | (VAR),         \
        /*dropout_rngs=*/kDropoutRngs                                                                     \
  }

// Every shape takes f32, f16 and bf16; flash-bm16-bn32 also fp8-e4m3 with descale factors, per tensor or per head
// (AF_VARIANT_HEAD_DESCALE, which only it declares: the others have no fp8).
const af_kernel kFlashKernels[] = {
    AF_FLASH_ENTRY(16, 16, 64, kHalves, "; backward (f32) FA2-style, key tiles of 16, dQ by atomicAdd",
                   flash_bwd_workspace, (flash_bwd_launch<16, 16, 64, true>), 0),
    AF_FLASH_ENTRY(16, 32, 64, kWithFp8 | AF_SUPPORTS_BWD_F16 | AF_SUPPORTS_BWD_BF16,
                   "; backward (f32, f16, bf16; fp32 accumulation) deterministic, key tiles of 32, dQ in its own pass",
                   flash_bwd_workspace, (flash_bwd_launch<16, 32, 128, false>), AF_VARIANT_HEAD_DESCALE),
    AF_FLASH_ENTRY(16, 64, 64, kHalves, "", nullptr, nullptr, 0),
    AF_FLASH_ENTRY(32, 32, 128, kHalves, "; backward (f32) FA2-style, key tiles of 32, dQ by atomicAdd",
                   flash_bwd_workspace, (flash_bwd_launch<32, 32, 128, true>), 0),
};

#undef AF_FLASH_ENTRY

}  // namespace

AF_REGISTER_KERNELS(kFlashKernels);
