// varlen.hip - varlen flash forward: packed or paged k/v, seqused_k, per-sequence masks, sinks / softcap / ALiBi.
#include "kernels/common.h"
#include "kernels/register.h"

namespace {

constexpr int kMaxD = 128;  // largest D and Dv (the tiles hold whole rows in shared memory)

// flash.hip's tiling, per sequence: block (query tile, head, sequence b) covers rows i0 .. i0 + BM - 1 of
// sequence b (a tile never straddles two sequences; tiles past Sq_b exit before any barrier). Every row's
// visible keys come from the mask aligned to this sequence's (Sq_b, Sk_b); K and V rows are found through
// the layout (dense, packed at cu_seqlens_k[b] + j, or pool page block_table[b, j / P] slot j % P), so no
// key outside [0, Sk_b) of the sequence is ever read. Per key tile, four barriers:
//   1. K tile loaded          -> scores S = scale * Q K^T, through the score variants (softcap, ALiBi aligned to
//                                this sequence's Sq_b, Sk_b; masked entries -inf) into s_tile
//   2. s_tile complete        -> V tile loaded into kv_tile; BM threads update their row's m, l and turn
//                                s_tile into weights exp(s - m_new)
//   3. weights and V ready    -> acc = alpha * acc + sum over visible j of P_ij V_j
//   4. tile consumed          -> the next tile may overwrite kv_tile and s_tile
// After the last tile the sink (if any) is folded into each row's final state, as flash.hip does.
template <int BM, int BN, int NT>
__global__ void __launch_bounds__(NT)
    varlen_kernel(af_problem p, SeqIndex x, VariantBufs vb, const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  static_assert(NT >= BM, "one thread per row updates the softmax state");
  static_assert((BM * kMaxD) % NT == 0, "accumulators split evenly over the threads");
  constexpr int kAcc = BM * kMaxD / NT;
  __shared__ float q_tile[BM][kMaxD];
  __shared__ float kv_tile[BN][kMaxD];
  __shared__ float s_tile[BM][BN];
  __shared__ float row_m[BM], row_l[BM], row_alpha[BM];
  __shared__ int64_t row_first[BM], row_last[BM];

  const int t = threadIdx.x;
  const int64_t i0 = (int64_t)blockIdx.x * BM, h = blockIdx.y, hk = kv_head_of(p, h);
  const SeqShape sh = seq_shape(p, x, blockIdx.z);
  if (i0 >= sh.sq) return;  // the whole block: this sequence has fewer query tiles
  const int64_t D = p.head_dim, Dv = p.head_dim_v;
  const int rows = (int)min64(BM, sh.sq - i0);  // valid rows of this tile

  for (int64_t idx = t; idx < BM * D; idx += NT) {
    const int r = (int)(idx / D);
    const int64_t d = idx % D;
    q_tile[r][d] = r < rows ? q[seq_q_row(p, sh, i0 + r, h) + d] : 0.0f;
  }
  if (t < BM) {
    const KeySpan keys = t < rows ? seq_row_keys(p, sh, i0 + t) : KeySpan{0, 0};
    row_first[t] = keys.first;
    row_last[t] = keys.last;
    row_m[t] = neg_inf();
    row_l[t] = 0.0f;
  }
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  __syncthreads();

  // Keys visible to some row of the tile: [lo, hi) within [0, Sk_b). Key tiles start at multiples of BN.
  int64_t lo = sh.sk, hi = 0;
  for (int r = 0; r < BM; ++r)
    if (row_first[r] < row_last[r]) {
      lo = min64(lo, row_first[r]);
      hi = max64(hi, row_last[r]);
    }

  for (int64_t n0 = lo < hi ? lo - lo % BN : hi; n0 < hi; n0 += BN) {
    for (int64_t idx = t; idx < BN * D; idx += NT) {
      const int c = (int)(idx / D);
      const int64_t d = idx % D, j = n0 + c;
      kv_tile[c][d] = (j >= lo && j < hi) ? k[seq_k_row(p, x, sh, j, hk) + d] : 0.0f;
    }
    __syncthreads();  // 1

    for (int idx = t; idx < BM * BN; idx += NT) {
      const int r = idx / BN, c = idx % BN;
      const int64_t j = n0 + c;
      float s = neg_inf();
      if (j >= row_first[r] && j < row_last[r]) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += q_tile[r][d] * kv_tile[c][d];
        s = variant_score_in(p, vb, sh.b, h, i0 + r, j, p.scale * dot, sh.sq, sh.sk);
      }
      s_tile[r][c] = s;
    }
    __syncthreads();  // 2

    for (int64_t idx = t; idx < BN * Dv; idx += NT) {
      const int c = (int)(idx / Dv);
      const int64_t d = idx % Dv, j = n0 + c;
      kv_tile[c][d] = (j >= lo && j < hi) ? v[seq_v_row(p, x, sh, j, hk) + d] : 0.0f;
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
        for (int c = c_lo; c < c_hi; ++c) pv += s_tile[r][c] * kv_tile[c][d];
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
      o[seq_o_row(p, sh, i0 + r, h) + d] = finish_o(acc[e], row_m[r], row_l[r]);
    }
  }
  if (lse && t < rows) lse[lse_at(p, sh.b, h, i0 + t)] = finish_lse(row_m[t], row_l[t]);
}

template <int BM, int BN, int NT>
int varlen_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "varlen supports f32 only");
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD)
    return unsupported(why, why_len, "varlen supports D, Dv <= 128");
  if (!grid_fits(max64(ceil_div(p->seq_q, BM), 1), p->heads_q, p->batch, NT))
    return unsupported(why, why_len, "varlen grid (max Sq / BLOCK_M, Hq, B) exceeds the launch limits");
  return 0;
}

template <int BM, int BN, int NT>
int varlen_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (varlen_check<BM, BN, NT>(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  if (int e = check_seq_metadata(p, *buf)) return e;  // malformed metadata is refused
  if (p.seq_q == 0) return 0;  // every sequence is empty: nothing to write
  void (*kernel)(af_problem, SeqIndex, VariantBufs, const float*, const float*, const float*, float*, float*) =
      varlen_kernel<BM, BN, NT>;
  hipLaunchKernelGGL(kernel, dim3((unsigned)ceil_div(p.seq_q, BM), (unsigned)p.heads_q, (unsigned)p.batch),
                     dim3(NT), 0, (hipStream_t)stream, p, seq_index(*buf), variant_bufs(*buf),
                     static_cast<const float*>(buf->q),
                     static_cast<const float*>(buf->k), static_cast<const float*>(buf->v),
                     static_cast<float*>(buf->o), buf->lse);
  return (int)hipGetLastError();
}

constexpr uint32_t kVarlenFeatures = AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED |
                                     AF_FEATURE_SEQUSED_K | AF_FEATURE_LAYOUT_VARIANTS;
// Sinks, softcap and ALiBi, per sequence (kernels/common.h's variant_score_in / fold_sink).
constexpr uint32_t kVarlenVariants = AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI;

#define AF_VARLEN_ENTRY(BM, BN, NT)                                                                      \
  {                                                                                                      \
    "varlen-bm" #BM "-bn" #BN, "varlen",                                                                 \
        "varlen flash forward, BLOCK_M=" #BM " BLOCK_N=" #BN ": packed q / k / v (cu_seqlens), seqused_k, " \
        "paged k / v, per-sequence masks; sinks, softcap, ALiBi",                                        \
        AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0,     \
        nullptr, varlen_check<BM, BN, NT>, varlen_launch<BM, BN, NT>, kVarlenFeatures, 0, nullptr,       \
        nullptr, nullptr, AF_COMPUTE_FUSED, AF_KIND_ATTENTION, 0, kVarlenVariants                        \
  }

const af_kernel kVarlenKernels[] = {
    AF_VARLEN_ENTRY(16, 16, 64),
    AF_VARLEN_ENTRY(32, 32, 128),
};

#undef AF_VARLEN_ENTRY

}  // namespace

AF_REGISTER_KERNELS(kVarlenKernels);
