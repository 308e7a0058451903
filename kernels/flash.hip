// flash.hip - tiled flash attention: a BLOCK_M query tile sweeps BLOCK_N key tiles, softmax state on chip.
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
// to T once on store. fp8 folds q/k descales into the score scale and applies v_descale, o_scale on store.
template <class T, int BM, int BN, int NT>
__global__ void __launch_bounds__(NT)
    flash_kernel(af_problem p, const T* __restrict__ q, const T* __restrict__ k,
                 const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
  static_assert(NT >= BM, "one thread per row updates the softmax state");
  static_assert((BM * kMaxD) % NT == 0, "accumulators split evenly over the threads");
  constexpr int kAcc = BM * kMaxD / NT;
  __shared__ float q_tile[BM][kMaxD];
  __shared__ float kv_tile[BN][kMaxD];
  __shared__ float s_tile[BM][BN];
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
      if (j >= row_first[r] && j < row_last[r]) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += q_tile[r][d] * kv_tile[c][d];
        s = score_scale<T>(p) * dot;
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
        sum += w;
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
        for (int c = c_lo; c < c_hi; ++c) pv += Elem<T>::round(s_tile[r][c]) * kv_tile[c][d];
        acc[e] = acc[e] * row_alpha[r] + pv;
      }
    }
    __syncthreads();  // 4
  }

  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int idx = t + e * NT;
    if (idx < rows * Dv) {
      const int r = idx / (int)Dv, d = idx % (int)Dv;
      o[o_row(p, b, i0 + r, h) + d] = store_o<T>(p, finish_o(acc[e], row_m[r], row_l[r]));
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
    void (*kernel)(af_problem, const T*, const T*, const T*, T*, float*) = flash_kernel<T, BM, BN, NT>;
    hipLaunchKernelGGL(kernel, dim3((unsigned)ceil_div(p.seq_q, BM), (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(NT), 0, (hipStream_t)stream, p, static_cast<const T*>(buf->q),
                       static_cast<const T*>(buf->k), static_cast<const T*>(buf->v), static_cast<T*>(buf->o),
                       buf->lse);
    return (int)hipGetLastError();
  });
}

constexpr uint32_t kHalves = AF_SUPPORTS_F32 | AF_SUPPORTS_F16 | AF_SUPPORTS_BF16;
constexpr uint32_t kWithFp8 = kHalves | AF_SUPPORTS_FP8_E4M3;

#define AF_FLASH_ENTRY(BM, BN, NT, DT)                                                                     \
  {                                                                                                        \
    "flash-bm" #BM "-bn" #BN, "flash",                                                                     \
        "tiled flash attention, BLOCK_M=" #BM " BLOCK_N=" #BN ", " #NT " threads, online softmax on chip", \
        DT, AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0,                    \
        nullptr, flash_check<BM, BN, NT, DT>, flash_launch<BM, BN, NT, DT>                                 \
  }

// Every shape takes f32, f16 and bf16; flash-bm16-bn32 also fp8-e4m3 with descale factors.
const af_kernel kFlashKernels[] = {
    AF_FLASH_ENTRY(16, 16, 64, kHalves),
    AF_FLASH_ENTRY(16, 32, 64, kWithFp8),
    AF_FLASH_ENTRY(16, 64, 64, kHalves),
    AF_FLASH_ENTRY(32, 32, 128, kHalves),
};

#undef AF_FLASH_ENTRY

}  // namespace

AF_REGISTER_KERNELS(kFlashKernels);
