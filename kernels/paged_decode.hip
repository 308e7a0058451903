// paged_decode.hip - paged-KV decode: 1..8 query tokens, split KV, logsumexp combine; sinks, softcap, ALiBi.
#include "kernels/common.h"
#include "kernels/register.h"

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

// Workspace: partial O [B, Hq, Sq, nmax, Dv] then partial LSE [B, Hq, Sq, nmax] (fp32), Sq = max tokens.
__host__ __device__ inline int64_t row_count(const af_problem& p) { return p.batch * p.heads_q * p.seq_q; }

// Block (s, h, b): the keys of split s of sequence b, for every query token of b at once (a key row is
// loaded once for up to 8 tokens). Per chunk of kThreads keys, thread t scores key c0 + t against each
// token whose visible span holds it (-inf otherwise); every thread then reads a token's scores in the same
// order, so all threads hold identical m and l per token. Thread t owns d = t + e * kThreads of each
// token's partial output. Writes the partial O normalised by its own l and the partial LSE (-inf and
// O = acc when the token saw no finite score in this split). Scores go through the softcap and the ALiBi term
// aligned to this sequence (variant_score_in); the sink is not a split's: the combine adds it once.
// Two barriers per chunk: scores complete before they are read; weights complete before they are read.
__global__ void __launch_bounds__(kThreads)
    decode_partial_kernel(af_problem p, SeqIndex x, VariantBufs vb, const float* __restrict__ q,
                          const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o_part,
                          float* __restrict__ lse_part, int64_t nmax) {
  __shared__ float q_vec[kMaxQ][kMaxD];
  __shared__ float score[kMaxQ][kThreads];
  __shared__ float weight[kMaxQ][kThreads];
  const int t = threadIdx.x;
  const int64_t s = blockIdx.x, h = blockIdx.y, hk = kv_head_of(p, h);
  const SeqShape sh = seq_shape(p, x, blockIdx.z);
  const Splits sp = splits_of(p, sh.sk);
  if (s >= sp.n || sh.sq == 0) return;  // the whole block: this sequence has fewer splits / no token
  const int nq = (int)min64(sh.sq, p.seq_q);  // seq_q (<= 8) bounds the workspace rows
  const int64_t s_lo = s * sp.len, s_hi = min64(sh.sk, (s + 1) * sp.len);

  int64_t first[kMaxQ], last[kMaxQ];  // each token's visible keys within this split
  int64_t lo = s_hi, hi = s_lo;       // their union
  AF_UNROLL
  for (int i = 0; i < kMaxQ; ++i) {
    const KeySpan keys = i < nq ? seq_row_keys(p, sh, i) : KeySpan{0, 0};
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
    const float* kr = t < n ? k + seq_k_row(p, x, sh, j, hk) : nullptr;
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
        const float val = v[seq_v_row(p, x, sh, c0 + c, hk) + d];
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
    if (t == 0) lse_part[slot] = finish_lse(m[i], l[i]);
  }
}

// Block (i, h, b), token i < Sq_b: M = max_s LSE_s over the sequence's splits, w_s = exp(LSE_s - M) (0 for
// a split where the token saw no key), O = sum w_s O_s / sum w_s, LSE = M + log(sum w_s); a token with no
// visible key at all (or Sk_b = 0: no split) gets O = 0, LSE = -inf. The sink enters the denominator here, exactly
// once (fold_sink on the combined state): an empty split contributes nothing, so a token that sees no key has
// O = 0, LSE = sink.
__global__ void __launch_bounds__(kThreads)
    decode_combine_kernel(af_problem p, SeqIndex x, VariantBufs vb, const float* __restrict__ o_part,
                          const float* __restrict__ lse_part, float* __restrict__ o, float* __restrict__ lse,
                          int64_t nmax) {
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y;
  const SeqShape sh = seq_shape(p, x, blockIdx.z);
  if (i >= sh.sq) return;  // i < seq_q: the grid
  const int64_t n = splits_of(p, sh.sk).n;
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

size_t decode_workspace(const af_problem* p) {
  return (size_t)(row_count(*p) * max_splits(*p) * (p->head_dim_v + 1)) * sizeof(float);
}

int decode_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "paged-decode supports f32 only");
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD)
    return unsupported(why, why_len, "paged-decode supports D, Dv <= 256");
  if (p->seq_q > kMaxQ) return unsupported(why, why_len, "paged-decode takes 1 to 8 query tokens per sequence");
  if (!grid_fits(max64(max_splits(*p), 1), p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "paged-decode grid (splits, Hq, B) exceeds the launch limits");
  return 0;
}

int decode_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (decode_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  if (int e = check_seq_metadata(p, *buf)) return e;  // malformed metadata is refused
  if (p.seq_q == 0) return 0;
  const int64_t nmax = max_splits(p);
  const SeqIndex x = seq_index(*buf);
  float* o_part = static_cast<float*>(buf->workspace);
  float* lse_part = o_part + row_count(p) * nmax * p.head_dim_v;
  if (nmax > 0) {
    hipLaunchKernelGGL(decode_partial_kernel, dim3((unsigned)nmax, (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(kThreads), 0, (hipStream_t)stream, p, x, variant_bufs(*buf),
                       static_cast<const float*>(buf->q),
                       static_cast<const float*>(buf->k), static_cast<const float*>(buf->v), o_part, lse_part,
                       nmax);
    if (int e = (int)hipGetLastError()) return e;
  }
  hipLaunchKernelGGL(decode_combine_kernel, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch),
                     dim3(kThreads), 0, (hipStream_t)stream, p, x, variant_bufs(*buf), (const float*)o_part,
                     (const float*)lse_part, static_cast<float*>(buf->o), buf->lse, nmax);
  return (int)hipGetLastError();
}

const af_kernel kDecodeKernels[] = {
    {"paged-decode", "paged-decode",
     "paged-KV decode: 1..8 query tokens per sequence, num_splits (default 8) KV splits per sequence into "
     "partial (O, LSE), then a logsumexp combine (the sink added once); paged, packed or dense k / v, seqused_k; "
     "sinks, softcap, ALiBi",
     AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0,
     decode_workspace, decode_check, decode_launch,
     AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED | AF_FEATURE_SEQUSED_K |
         AF_FEATURE_LAYOUT_VARIANTS,
     /*n_tunables=*/1, kDecodeTunables, nullptr, nullptr, AF_COMPUTE_FUSED, AF_KIND_ATTENTION, 0,
     AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI},
};

}  // namespace

AF_REGISTER_KERNELS(kDecodeKernels);
