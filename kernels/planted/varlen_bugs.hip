// varlen_bugs.hip - planted bugs in the varlen flash forward (kernels/varlen.hip): cu_seqlens, per-sequence
// causal offset, seqused_k, GQA on packed K/V, the softcap on the packed path.
//
// The kernel is copied from kernels/varlen.hip (BLOCK_M = BLOCK_N = 16, 64 threads), templated on the bug;
// every deviation sits in one of the small functions below behind `if constexpr (kBug == ...)` and is
// marked `// PLANTED:`. Each kernel declares the correct kernel's features (packed q / K/V, paged K/V,
// seqused_k). kernels/planted/README.md has each bug's exposing and quiet case.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kMaxD = 128;
constexpr int BM = 16, BN = 16, NT = 64;
static_assert((BM * kMaxD) % NT == 0, "accumulators split evenly over the threads");

enum class VarlenBug {
  kCuSeqlensOffByOne,
  kCausalBatchMax,
  kSequsedIgnored,
  kGqaPacked,
  kTrustsMetadata,
  kSoftcapPackedIgnored
};

// Sequence b's lengths, as the kernel derives them.
template <VarlenBug kBug>
__device__ inline SeqShape planted_seq_shape(const af_problem& p, const SeqIndex& x, int64_t b) {
  SeqShape s = seq_shape(p, x, b);
  if constexpr (kBug == VarlenBug::kCuSeqlensOffByOne) {
    // PLANTED: cu_seqlens_k[b + 1] taken as the row of the sequence's last key (inclusive) instead of
    // one past it: every packed sequence gets one key too many, the first key of the next sequence (past
    // the end of k for the last one). Quiet where no row sees key Sk_b: causal top-left with Sq_b <= Sk_b
    // (row i sees keys 0..i), or seqused_k given (it overrides the packed length).
    if (p.kv_layout == AF_SEQ_PACKED && !x.used_k) s.sk = x.cu_k[b + 1] - s.k_first + 1;
  }
  if constexpr (kBug == VarlenBug::kSequsedIgnored) {
    // PLANTED: seqused_k never read: the key count is the packed segment (or the cache capacity), so the
    // unused tail of every sequence is scored. Quiet when each used length equals its capacity.
    if (p.kv_layout == AF_SEQ_PACKED) s.sk = x.cu_k[b + 1] - s.k_first;
    else if (p.kv_layout == AF_SEQ_PAGED) s.sk = p.kv_capacity;
    else s.sk = p.seq_k;
  }
  return s;
}

// Visible keys of row i of sequence s.
template <VarlenBug kBug>
__device__ inline KeySpan planted_row_keys(const af_problem& p, const SeqShape& s, int64_t i) {
  if constexpr (kBug == VarlenBug::kCausalBatchMax) {
    // PLANTED: the bottom-right offset is taken from the batch's largest lengths (max_seqlen_k -
    // max_seqlen_q) instead of the sequence's own Sk_b - Sq_b. Quiet when every sequence has the same
    // Sk_b - Sq_b as the batch maxima (equal lengths), or top-left / no mask.
    if (p.mask_kind != AF_MASK_NONE && p.mask_align == AF_ALIGN_BOTTOM_RIGHT) {
      const KeySpan wrong = row_keys_in(p, p.seq_q, p.seq_k, i);
      return {min64(wrong.first, s.sk), min64(wrong.last, s.sk)};  // still clipped to the sequence
    }
  }
  return seq_row_keys(p, s, i);
}

// The kv head read by query head h.
template <VarlenBug kBug>
__device__ inline int64_t planted_kv_head(const af_problem& p, int64_t h) {
  if constexpr (kBug == VarlenBug::kGqaPacked) {
    // PLANTED: the packed-K/V path maps query head h to kv head h % Hkv (heads repeated, not
    // repeat_interleave-d); the dense path is right. Quiet for dense K/V, MHA (Hq = Hkv) and MQA (Hkv = 1).
    if (p.kv_layout == AF_SEQ_PACKED) return h % p.heads_kv;
  }
  return kv_head_of(p, h);
}

// The problem whose score variants the kernel applies (variant_score_in).
template <VarlenBug kBug>
__device__ inline af_problem planted_score_problem(const af_problem& p) {
  af_problem sp = p;
  if constexpr (kBug == VarlenBug::kSoftcapPackedIgnored) {
    // PLANTED: the packed-q (varlen prefill) path takes the softcap argument and never applies it; the dense path
    // does (a parameter accepted and ignored by one code path, issue 28). Quiet for a dense q (KV cache, paged
    // decode), without a softcap, or where the scores stay far below the cap (|s| << cap: tanh(s / cap) ~ s / cap).
    if (p.q_layout == AF_SEQ_PACKED) sp.variants &= ~AF_VARIANT_SOFTCAP;
  }
  return sp;
}

template <VarlenBug kBug>
__global__ void __launch_bounds__(NT)
    planted_varlen_kernel(af_problem p, SeqIndex x, VariantBufs vb, const float* __restrict__ q,
                          const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,
                          float* __restrict__ lse) {
  constexpr int kAcc = BM * kMaxD / NT;
  __shared__ float q_tile[BM][kMaxD];
  __shared__ float kv_tile[BN][kMaxD];
  __shared__ float s_tile[BM][BN];
  __shared__ float row_m[BM], row_l[BM], row_alpha[BM];
  __shared__ int64_t row_first[BM], row_last[BM];

  const int t = threadIdx.x;
  const int64_t i0 = (int64_t)blockIdx.x * BM, h = blockIdx.y;
  const SeqShape sh = planted_seq_shape<kBug>(p, x, blockIdx.z);
  const int64_t hk = planted_kv_head<kBug>(p, h);
  if (i0 >= sh.sq) return;  // the whole block: this sequence has fewer query tiles
  const af_problem sp = planted_score_problem<kBug>(p);
  const int64_t D = p.head_dim, Dv = p.head_dim_v;
  const int rows = (int)min64(BM, sh.sq - i0);  // valid rows of this tile

  for (int64_t idx = t; idx < BM * D; idx += NT) {
    const int r = (int)(idx / D);
    const int64_t d = idx % D;
    q_tile[r][d] = r < rows ? q[seq_q_row(p, sh, i0 + r, h) + d] : 0.0f;
  }
  if (t < BM) {
    const KeySpan keys = t < rows ? planted_row_keys<kBug>(p, sh, i0 + t) : KeySpan{0, 0};
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
        s = variant_score_in(sp, vb, sh.b, h, i0 + r, j, p.scale * dot, sh.sq, sh.sk);
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
  if (t < BM) row_alpha[t] = fold_sink(variant_sink(p, vb, h), row_m[t], row_l[t]);  // the sink, once
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

int planted_varlen_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "varlen supports f32 only");
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD)
    return unsupported(why, why_len, "varlen supports D, Dv <= 128");
  if (!grid_fits(max64(ceil_div(p->seq_q, BM), 1), p->heads_q, p->batch, NT))
    return unsupported(why, why_len, "varlen grid (max Sq / BLOCK_M, Hq, B) exceeds the launch limits");
  return 0;
}

template <VarlenBug kBug>
int planted_varlen_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (planted_varlen_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  // PLANTED (kTrustsMetadata): the arrays are never checked, so malformed cu_seqlens, seqused_k or block-table
  // entries are indexed as given (the other bugs refuse them as kernels/varlen.hip does). Quiet on well-formed
  // metadata: the kernel is then varlen-bm16-bn16.
  if constexpr (kBug != VarlenBug::kTrustsMetadata)
    if (int e = check_seq_metadata(p, *buf)) return e;
  if (p.seq_q == 0) return 0;
  void (*kernel)(af_problem, SeqIndex, VariantBufs, const float*, const float*, const float*, float*, float*) =
      planted_varlen_kernel<kBug>;
  hipLaunchKernelGGL(kernel, dim3((unsigned)ceil_div(p.seq_q, BM), (unsigned)p.heads_q, (unsigned)p.batch),
                     dim3(NT), 0, (hipStream_t)stream, p, seq_index(*buf), variant_bufs(*buf),
                     static_cast<const float*>(buf->q),
                     static_cast<const float*>(buf->k), static_cast<const float*>(buf->v),
                     static_cast<float*>(buf->o), buf->lse);
  return (int)hipGetLastError();
}

#define AF_PLANTED_VARLEN_V(name, bug, what, features, variants)                                          \
  {                                                                                                       \
    name, "planted/varlen", "varlen-bm16-bn16 with a planted bug: " what, AF_SUPPORTS_F32,                \
        AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr,              \
        planted_varlen_check, planted_varlen_launch<VarlenBug::bug>,                                      \
        AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED | AF_FEATURE_SEQUSED_K | features, \
        0, nullptr, nullptr, nullptr, AF_COMPUTE_FUSED, AF_KIND_ATTENTION, 0, variants                     \
  }
#define AF_PLANTED_VARLEN(name, bug, what) AF_PLANTED_VARLEN_V(name, bug, what, 0u, 0u)

const af_kernel kVarlenBugs[] = {
    AF_PLANTED_VARLEN("planted-varlen-cu-off-by-one", kCuSeqlensOffByOne,
                      "cu_seqlens_k[b + 1] read as the last key's row: each sequence takes the next one's first key"),
    AF_PLANTED_VARLEN("planted-varlen-causal-batch-max", kCausalBatchMax,
                      "bottom-right offset from the batch maxima instead of the sequence's own lengths"),
    AF_PLANTED_VARLEN("planted-varlen-seqused-ignored", kSequsedIgnored,
                      "seqused_k ignored: the capacity tail of every sequence is read"),
    AF_PLANTED_VARLEN("planted-varlen-gqa-packed", kGqaPacked,
                      "packed K/V path maps query head h to kv head h % Hkv"),
    AF_PLANTED_VARLEN("planted-varlen-trusts-metadata", kTrustsMetadata,
                      "cu_seqlens / seqused_k / block table never checked: malformed metadata accepted"),
    // Issue 28: the variants on the sequence layouts (AF_FEATURE_LAYOUT_VARIANTS), as varlen-bm16-bn16 declares them.
    AF_PLANTED_VARLEN_V("planted-varlen-softcap-ignored", kSoftcapPackedIgnored,
                        "the packed-q (varlen prefill) path never applies the softcap", AF_FEATURE_LAYOUT_VARIANTS,
                        AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI),
};
#undef AF_PLANTED_VARLEN
#undef AF_PLANTED_VARLEN_V
static_assert(sizeof(kVarlenBugs) / sizeof(kVarlenBugs[0]) == attnfuzz_planted::kVarlenBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::varlen_bugs() { return kVarlenBugs; }
