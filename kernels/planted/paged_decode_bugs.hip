// paged_decode_bugs.hip - planted bugs in the paged-KV decode kernel (kernels/paged_decode.hip): pages,
// page size, a kv_len % 32 == 1 tail, the Sq = 1 window, empty splits, a sink counted per empty split.
//
// Both dispatches are copied from kernels/paged_decode.hip, templated on the bug; every deviation sits in one
// of the small functions below (or the partial dispatch) behind `if constexpr (kBug == ...)` and is marked
// `// PLANTED:`. Each kernel declares the correct kernel's features and its tunable num_splits.
// kernels/planted/README.md has each bug's exposing and quiet case.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kThreads = 64;  // threads per block in both kernels (one key of a chunk per thread)
constexpr int kMaxQ = 8;      // query tokens per sequence (decode, speculative decode)
constexpr int kMaxD = 256;    // largest D (the q rows are staged in shared memory) and Dv (registers)
constexpr int kAcc = kMaxD / kThreads;
constexpr int64_t kMinSplitKeys = 4;  // small so that short sequences are split too

// num_splits (AF_TUNABLE_KV_SPLITS): KV splits per sequence, fewer when Sk_b / 4 is smaller; values[0] = 8
// is the default, the split-kv detector re-runs a failing case with the others.
const af_tunable kDecodeTunables[] = {
    {"num_splits",
     "KV splits per sequence (at most ceil(Sk_b / 4))",
     AF_TUNABLE_KV_SPLITS,
     9,
     {8, 1, 2, 3, 4, 5, 6, 7, 16}},
};
constexpr int64_t kDefaultSplits = 8;

struct Splits {
  int64_t n, len;  // split s covers keys [s * len, min((s + 1) * len, Sk_b))
};
__host__ __device__ inline int64_t wanted_splits(const af_problem& p) {
  return p.tunables[0] >= 1 ? p.tunables[0] : kDefaultSplits;  // the tool always resolves it
}
// The split of a sequence of sk keys: every split non-empty.
__host__ __device__ inline Splits splits_of(const af_problem& p, int64_t sk) {
  if (sk <= 0) return {0, 0};
  const int64_t n = min64(wanted_splits(p), ceil_div(sk, kMinSplitKeys));
  const int64_t len = ceil_div(sk, n);
  return {ceil_div(sk, len), len};
}
// Splits allocated per row (grid x and workspace): enough for the longest sequence the problem admits.
__host__ __device__ inline int64_t max_splits(const af_problem& p) {
  const int64_t longest = max64(p.seq_k, p.kv_layout == AF_SEQ_PAGED ? p.kv_capacity : 0);
  return longest <= 0 ? 0 : min64(wanted_splits(p), ceil_div(longest, kMinSplitKeys));
}

enum class DecodeBug { kLastPageWhole, kWrongPageSize, kKvLenMod32, kWindowSq1, kSplitEmptyCombined, kSinkTwice };

// Keys the kernel iterates over for sequence sh.
template <DecodeBug kBug>
__device__ inline int64_t planted_key_count(const af_problem& p, const SeqShape& sh) {
  if constexpr (kBug == DecodeBug::kLastPageWhole) {
    // PLANTED: the key loop runs over whole pages (ceil(Sk_b / P) * P keys): the slots of the last page
    // past the used length are read and scored (the visible span is clipped there too; the diagonal stays
    // at Sk_b - 1). Quiet when every used length is a multiple of the page size, or under causal
    // bottom-right (the extra keys are right of the diagonal).
    if (p.kv_layout == AF_SEQ_PAGED) return ceil_div(sh.sk, p.page_size) * p.page_size;
  }
  return sh.sk;
}

// The split of a sequence whose key loop runs over kv_len keys.
template <DecodeBug kBug>
__device__ inline Splits planted_splits(const af_problem& p, int64_t kv_len) {
  if constexpr (kBug == DecodeBug::kSplitEmptyCombined) {
    // The batch's split (from its longest sequence) for every sequence with keys, as FlashAttention's
    // num_splits (a sequence without keys is finished up front: no split, O = 0, LSE = -inf): by itself
    // correct, wrong with the early exit in the partial dispatch.
    return kv_len <= 0 ? Splits{0, 0} : splits_of(p, p.seq_k);
  }
  return splits_of(p, kv_len);
}

// Visible keys of token i of sequence sh, clipped at the key loop's end kv_len.
template <DecodeBug kBug>
__device__ inline KeySpan planted_row_keys(const af_problem& p, const SeqShape& sh, int64_t i, int64_t kv_len) {
  KeySpan k = seq_row_keys(p, sh, i);
  if constexpr (kBug == DecodeBug::kLastPageWhole) {
    if (k.last == sh.sk) k.last = kv_len;  // the row's span reached the end: it now reaches the page's end
  }
  if constexpr (kBug == DecodeBug::kWindowSq1) {
    // PLANTED: the single-token decode fast path starts a bottom-right sliding window at Sk_b - left
    // instead of Sk_b - 1 - left (the diagonal is key Sk_b - 1): the window's oldest key is dropped.
    // Quiet with 2+ query tokens, top-left alignment, an unbounded left side (causal), or when
    // Sk_b - 1 - left < 0 (the window starts at key 0 either way).
    if (sh.sq == 1 && p.mask_kind == AF_MASK_WINDOW && p.mask_align == AF_ALIGN_BOTTOM_RIGHT &&
        p.window_left != AF_UNBOUNDED)
      k.first = min64(k.last, max64(k.first, sh.sk - p.window_left));
  }
  return k;
}

// Element offset of key / value row t of sequence sh (stride: p.k_stride or p.v_stride).
template <DecodeBug kBug>
__device__ inline int64_t planted_kv_row(const af_problem& p, const int64_t* stride, const SeqIndex& x,
                                         const SeqShape& sh, int64_t t, int64_t hk) {
  if constexpr (kBug == DecodeBug::kWrongPageSize) {
    // PLANTED: the page of token t is found with the kernel's own block size 16 instead of the cache's
    // page_size: token t is looked up in block_table[b, t / 16] at slot t % 16. Quiet when page_size = 16.
    if (p.kv_layout == AF_SEQ_PAGED) {
      constexpr int64_t kBlock = 16;
      const int64_t page = x.block_table[sh.b * p.max_pages_per_seq + t / kBlock];
      return page * stride[0] + (t % kBlock) * stride[1] + hk * stride[2];
    }
  }
  return seq_kv_row(p, stride, x, sh, t, hk);
}

// Element d of the value of key j (the P.V loop).
template <DecodeBug kBug>
__device__ inline float planted_value(const af_problem& p, const SeqIndex& x, const SeqShape& sh,
                                      const float* k, const float* v, int64_t j, int64_t hk, int64_t d) {
  if constexpr (kBug == DecodeBug::kKvLenMod32) {
    // PLANTED: the epilogue for a lone key after whole warps of 32 (kv_len % 32 == 1), copied from the
    // score loop, loads that key's value from K instead of V. Quiet whenever Sk_b % 32 != 1.
    if (sh.sk % 32 == 1 && j == sh.sk - 1) return k[planted_kv_row<kBug>(p, p.k_stride, x, sh, j, hk) + d];
  }
  return v[planted_kv_row<kBug>(p, p.v_stride, x, sh, j, hk) + d];
}

// The partial LSE a split writes for a token from its final state (m, l).
template <DecodeBug kBug>
__device__ inline float planted_partial_lse(const af_problem& p, const VariantBufs& vb, int64_t h, float m, float l) {
  if constexpr (kBug == DecodeBug::kSinkTwice) {
    // PLANTED: a split where the token sees no key writes its initial state, and that state starts from the sink
    // (m = sink, l = 1, O = 0: the sink-initialised state of a kernel that folds the sink into a split), while the
    // combine adds the sink once more: the sink enters the denominator once per empty split, plus once (CK's split-KV
    // sink counted twice when split 0 is empty, rocm-libraries #12227). Quiet when every split holds some of each
    // token's keys (no mask that hides a whole split: no mask, causal decode), at num_splits = 1, or without sinks.
    if (m == neg_inf()) return variant_sink(p, vb, h);
  }
  return finish_lse(m, l);
}

// Workspace: partial O [B, Hq, Sq, nmax, Dv] then partial LSE [B, Hq, Sq, nmax] (fp32), Sq = max tokens.
__host__ __device__ inline int64_t row_count(const af_problem& p) { return p.batch * p.heads_q * p.seq_q; }

// Block (s, h, b): the keys of split s of sequence b, for every query token of b at once (a key row is
// loaded once for up to 8 tokens). Per chunk of kThreads keys, thread t scores key c0 + t against each
// token whose visible span holds it (-inf otherwise); every thread then reads a token's scores in the same
// order, so all threads hold identical m and l per token. Thread t owns d = t + e * kThreads of each
// token's partial output. Writes the partial O normalised by its own l and the partial LSE (-inf and
// O = acc when the token saw no finite score in this split). Scores through the softcap and the ALiBi term of
// this sequence; the combine adds the sink once.
// Two barriers per chunk: scores complete before they are read; weights complete before they are read.
template <DecodeBug kBug>
__global__ void __launch_bounds__(kThreads)
    planted_partial_kernel(af_problem p, SeqIndex x, VariantBufs vb, const float* __restrict__ q,
                           const float* __restrict__ k,
                          const float* __restrict__ v, float* __restrict__ o_part, float* __restrict__ lse_part,
                          int64_t nmax) {
  __shared__ float q_vec[kMaxQ][kMaxD];
  __shared__ float score[kMaxQ][kThreads];
  __shared__ float weight[kMaxQ][kThreads];
  const int t = threadIdx.x;
  const int64_t s = blockIdx.x, h = blockIdx.y, hk = kv_head_of(p, h);
  const SeqShape sh = seq_shape(p, x, blockIdx.z);
  const int64_t kv_len = planted_key_count<kBug>(p, sh);
  const Splits sp = planted_splits<kBug>(p, kv_len);
  if (s >= sp.n || sh.sq == 0) return;  // the whole block: this sequence has fewer splits / no token
  const int nq = (int)min64(sh.sq, p.seq_q);  // seq_q (<= 8) bounds the workspace rows
  const int64_t s_lo = s * sp.len, s_hi = min64(kv_len, (s + 1) * sp.len);
  if constexpr (kBug == DecodeBug::kSplitEmptyCombined) {
    // PLANTED: "nothing to do" early exit: a split past a short sequence's keys leaves its partial (O, LSE)
    // unwritten, while the combine reads every one of the batch's splits (stale workspace, here the
    // runner's NaN poison). Quiet when every sequence fills every split (equal lengths, one sequence).
    if (s_lo >= s_hi) return;
  }

  int64_t first[kMaxQ], last[kMaxQ];  // each token's visible keys within this split
  int64_t lo = s_hi, hi = s_lo;       // their union
  AF_UNROLL
  for (int i = 0; i < kMaxQ; ++i) {
    const KeySpan keys = i < nq ? planted_row_keys<kBug>(p, sh, i, kv_len) : KeySpan{0, 0};
    first[i] = max64(keys.first, s_lo);
    last[i] = max64(first[i], min64(keys.last, s_hi));
    if (first[i] < last[i]) {
      lo = min64(lo, first[i]);
      hi = max64(hi, last[i]);
    }
  }
  for (int i = 0; i < nq; ++i)
    for (int64_t d = t; d < p.head_dim; d += kThreads) q_vec[i][d] = q[seq_q_row(p, sh, i, h) + d];
  __syncthreads();

  float m[kMaxQ], l[kMaxQ], acc[kMaxQ][kAcc];
  AF_UNROLL
  for (int i = 0; i < kMaxQ; ++i) {
    m[i] = neg_inf();
    l[i] = 0.0f;
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) acc[i][e] = 0.0f;
  }
  for (int64_t c0 = lo; c0 < hi; c0 += kThreads) {
    const int n = (int)min64(kThreads, hi - c0);  // keys in this chunk
    const int64_t j = c0 + t;
    const float* kr = t < n ? k + planted_kv_row<kBug>(p, p.k_stride, x, sh, j, hk) : nullptr;
    AF_UNROLL
    for (int i = 0; i < kMaxQ; ++i) {
      float mine = neg_inf();
      if (kr && j >= first[i] && j < last[i]) {
        float dot = 0.0f;
        for (int64_t d = 0; d < p.head_dim; ++d) dot += q_vec[i][d] * kr[d];
        mine = variant_score_in(p, vb, sh.b, h, i, j, p.scale * dot, sh.sq, sh.sk);
      }
      score[i][t] = mine;
    }
    __syncthreads();  // 1
    float alpha[kMaxQ];
    AF_UNROLL
    for (int i = 0; i < kMaxQ; ++i) {
      float chunk_max = neg_inf();
      for (int c = 0; c < n; ++c) chunk_max = nan_max(chunk_max, score[i][c]);
      const float m_new = nan_max(m[i], chunk_max);
      alpha[i] = rescale_factor(m[i], m_new);
      weight[i][t] = t < n ? softmax_weight(score[i][t], m_new) : 0.0f;
      m[i] = m_new;
    }
    __syncthreads();  // 2
    AF_UNROLL
    for (int i = 0; i < kMaxQ; ++i) {
      float sum = 0.0f;
      for (int c = 0; c < n; ++c) sum += weight[i][c];
      l[i] = l[i] * alpha[i] + sum;
    }
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = t + e * kThreads;
      if (d >= p.head_dim_v) continue;
      float pv[kMaxQ];
      AF_UNROLL
      for (int i = 0; i < kMaxQ; ++i) pv[i] = 0.0f;
      for (int c = 0; c < n; ++c) {
        // Only keys some token sees are read; a key outside a token's span has weight exactly 0 there
        // (its score is -inf), so a NaN / Inf value of a key hidden from that token cannot reach it.
        const float val = planted_value<kBug>(p, x, sh, k, v, c0 + c, hk, d);
        AF_UNROLL
        for (int i = 0; i < kMaxQ; ++i)
          if (c0 + c >= first[i] && c0 + c < last[i]) pv[i] += weight[i][c] * val;
      }
      AF_UNROLL
      for (int i = 0; i < kMaxQ; ++i) acc[i][e] = acc[i][e] * alpha[i] + pv[i];
    }
  }

  for (int i = 0; i < nq; ++i) {
    const int64_t slot = ((sh.b * p.heads_q + h) * p.seq_q + i) * nmax + s;
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = t + e * kThreads;
      if (d < p.head_dim_v) o_part[slot * p.head_dim_v + d] = m[i] == neg_inf() ? acc[i][e] : acc[i][e] / l[i];
    }
    if (t == 0) lse_part[slot] = planted_partial_lse<kBug>(p, vb, h, m[i], l[i]);
  }
}

// Block (i, h, b), token i < Sq_b: M = max_s LSE_s over the sequence's splits, w_s = exp(LSE_s - M) (0 for
// a split where the token saw no key), O = sum w_s O_s / sum w_s, LSE = M + log(sum w_s); a token with no
// visible key at all (or Sk_b = 0: no split) gets O = 0, LSE = -inf. The sink is folded in once, here.
template <DecodeBug kBug>
__global__ void __launch_bounds__(kThreads)
    planted_combine_kernel(af_problem p, SeqIndex x, VariantBufs vb, const float* __restrict__ o_part,
                          const float* __restrict__ lse_part, float* __restrict__ o, float* __restrict__ lse,
                          int64_t nmax) {
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y;
  const SeqShape sh = seq_shape(p, x, blockIdx.z);
  if (i >= sh.sq) return;  // i < seq_q: the grid
  const int64_t n = planted_splits<kBug>(p, planted_key_count<kBug>(p, sh)).n;
  const int64_t row = (sh.b * p.heads_q + h) * p.seq_q + i;
  const float* lp = lse_part + row * nmax;
  float m = neg_inf();
  for (int64_t s = 0; s < n; ++s) m = nan_max(m, lp[s]);
  float l = 0.0f;
  for (int64_t s = 0; s < n; ++s) l += softmax_weight(lp[s], m);
  const float m_splits = m;
  const float alpha = fold_sink(variant_sink(p, vb, h), m, l);  // 1 without a sink
  float* orow = o + seq_o_row(p, sh, i, h);
  for (int64_t d = t; d < p.head_dim_v; d += kThreads) {
    float a = 0.0f;
    for (int64_t s = 0; s < n; ++s)
      a += softmax_weight(lp[s], m_splits) * o_part[(row * nmax + s) * p.head_dim_v + d];
    orow[d] = finish_o(a * alpha, m, l);
  }
  if (lse && t == 0) lse[lse_at(p, sh.b, h, i)] = finish_lse(m, l);
}

size_t planted_decode_workspace(const af_problem* p) {
  return (size_t)(row_count(*p) * max_splits(*p) * (p->head_dim_v + 1)) * sizeof(float);
}

int planted_decode_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "paged-decode supports f32 only");
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD)
    return unsupported(why, why_len, "paged-decode supports D, Dv <= 256");
  if (p->seq_q > kMaxQ) return unsupported(why, why_len, "paged-decode takes 1 to 8 query tokens per sequence");
  if (!grid_fits(max64(max_splits(*p), 1), p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "paged-decode grid (splits, Hq, B) exceeds the launch limits");
  return 0;
}

// planted-paged-page-size-16 reads block_table[b, t / 16]: with pages wider than 16 the last sequence's lookups
// can run past the table (a guard word as a page index: a wild read, a crash rather than the oob-read it shows,
// and a crash of an in-process worker). Like the dense OOB kernels, it refuses problems where that can happen.
int planted_page16_check(const af_problem* p, char* why, size_t why_len) {
  if (int e = planted_decode_check(p, why, why_len)) return e;
  if (p->kv_layout == AF_SEQ_PAGED && p->seq_k > 16 * p->max_pages_per_seq)
    return unsupported(why, why_len, "its block-size-16 page lookup would run past the block table");
  return 0;
}

template <DecodeBug kBug>
int planted_decode_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (planted_decode_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  if (int e = check_seq_metadata(p, *buf)) return e;  // malformed metadata is refused (not the bug here)
  if (p.seq_q == 0) return 0;
  const int64_t nmax = max_splits(p);
  const SeqIndex x = seq_index(*buf);
  float* o_part = static_cast<float*>(buf->workspace);
  float* lse_part = o_part + row_count(p) * nmax * p.head_dim_v;
  void (*partial)(af_problem, SeqIndex, VariantBufs, const float*, const float*, const float*, float*, float*,
                  int64_t) = planted_partial_kernel<kBug>;
  void (*combine)(af_problem, SeqIndex, VariantBufs, const float*, const float*, float*, float*, int64_t) =
      planted_combine_kernel<kBug>;
  const VariantBufs vb = variant_bufs(*buf);
  if (nmax > 0) {
    hipLaunchKernelGGL(partial, dim3((unsigned)nmax, (unsigned)p.heads_q, (unsigned)p.batch), dim3(kThreads), 0,
                       (hipStream_t)stream, p, x, vb, static_cast<const float*>(buf->q),
                       static_cast<const float*>(buf->k), static_cast<const float*>(buf->v), o_part, lse_part,
                       nmax);
    if (int e = (int)hipGetLastError()) return e;
  }
  hipLaunchKernelGGL(combine, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch), dim3(kThreads), 0,
                     (hipStream_t)stream, p, x, vb, (const float*)o_part, (const float*)lse_part,
                     static_cast<float*>(buf->o), buf->lse, nmax);
  return (int)hipGetLastError();
}

#define AF_PLANTED_DECODE_V(name, bug, what, check, features, variants)                                   \
  {                                                                                                       \
    name, "planted/paged-decode", "paged-decode with a planted bug: " what, AF_SUPPORTS_F32,              \
        AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0,                       \
        planted_decode_workspace, check, planted_decode_launch<DecodeBug::bug>,                           \
        AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED | AF_FEATURE_SEQUSED_K | features, \
        /*n_tunables=*/1, kDecodeTunables, nullptr, nullptr, AF_COMPUTE_FUSED, AF_KIND_ATTENTION, 0, variants \
  }
#define AF_PLANTED_DECODE(name, bug, what, check) AF_PLANTED_DECODE_V(name, bug, what, check, 0u, 0u)

const af_kernel kDecodeBugs[] = {
    AF_PLANTED_DECODE("planted-paged-last-page-whole", kLastPageWhole,
                      "the key loop covers the last page whole: slots past the used length are scored", planted_decode_check),
    AF_PLANTED_DECODE("planted-paged-page-size-16", kWrongPageSize,
                      "pages looked up with block size 16 instead of the cache's page_size", planted_page16_check),
    AF_PLANTED_DECODE("planted-decode-kvlen-mod32", kKvLenMod32,
                      "when kv_len % 32 == 1 the lone last key's value is loaded from K", planted_decode_check),
    AF_PLANTED_DECODE("planted-decode-window-sq1", kWindowSq1,
                      "Sq = 1 bottom-right window starts at Sk - left: the oldest key is dropped", planted_decode_check),
    AF_PLANTED_DECODE("planted-decode-empty-split", kSplitEmptyCombined,
                      "a split past a short sequence's keys exits unwritten; the combine reads it anyway", planted_decode_check),
    // Issue 28: the variants on the paged layout (AF_FEATURE_LAYOUT_VARIANTS), as paged-decode declares them.
    AF_PLANTED_DECODE_V("planted-paged-sink-twice-empty-split", kSinkTwice,
                        "a split that sees none of a token's keys writes the sink as its partial LSE; the combine "
                        "adds the sink again",
                        planted_decode_check, AF_FEATURE_LAYOUT_VARIANTS,
                        AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI),
};
#undef AF_PLANTED_DECODE
#undef AF_PLANTED_DECODE_V
static_assert(sizeof(kDecodeBugs) / sizeof(kDecodeBugs[0]) == attnfuzz_planted::kPagedDecodeBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::paged_decode_bugs() { return kDecodeBugs; }
