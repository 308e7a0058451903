// variant_bugs.hip - planted bugs in the variants (issue 28): sinks, softcap, ALiBi, bias, d sink, custom masks,
// per-head fp8 descales, the precision of bf16 score terms.
//
// A plain fp32 row kernel (one thread per query row, online softmax over the visible keys with kernels/common.h's
// variant_score / fold_sink), a split-KV version of it (num_splits partial states, then a logsumexp combine) and a
// plain backward (one thread per query row for Delta and dQ, one per key for dK / dV, one per head for d sink); an
// fp8-e4m3 row kernel for the per-head descales; a bf16 row kernel for the score terms' precision.
// With VarBug::kNone each is correct; every deviation sits behind `if constexpr (kBug == ...)` and is marked
// `// PLANTED:`. Each is modelled on a reported bug; kernels/planted/README.md has its exposing and quiet case.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kThreads = 64;
constexpr int kMaxD = 128;  // largest Dv (accumulators in registers)

enum class VarBug {
  kNone,
  kSinkIgnoredPrefill,  // the sink applied on the decode path (Sq == 1) only (vLLM PR #52148)
  kSoftcapExp,          // tanh(x) as (e^x - e^-x) / (e^x + e^-x): inf / inf = NaN for |s / cap| > 88 (vLLM #56578)
  kAlibiPow2,           // ALiBi slopes 2^(-8 (h + 1) / Hq) computed in the kernel, the buffer ignored
  kBiasBatch0,          // the bias's batch stride ignored: every batch reads batch 0's bias
  kSinkTwiceEmptySplit, // split-KV: the sink enters the denominator twice when split 0 is empty (rocm-libraries #12227)
  kDsinkZero,           // backward: d sink left 0
  kMaskBitsStride,      // bit-packed custom mask rows stepped by Sk / 8 bytes (floor), not mask_stride[2]
  kBlockPartialFull,    // block-sparse: a partial block (2) treated as full, the custom mask never read
  kMaskIgnoredBwd,      // the custom / block mask applied in the forward only; the backward sees every key
  kHeadDescaleQHead,    // fp8: k's per-head descale read at the query head (h mod Hkv), not the KV head
  kHeadDescaleIgnored,  // fp8: the per-head descale arrays never read, the per-tensor descales used (FlashInfer #4979)
  kBiasAddBf16,         // bf16: bias + ALiBi rounded to bf16 before they are added (a float mask in the query's dtype,
                        // as SDPA takes one), without declaring AF_KERNEL_SCORE_ADD_IN_DTYPE
};

// Key j of row (b, h, i) under the custom / block mask as the planted kernel reads it.
template <VarBug kBug>
__host__ __device__ inline bool planted_keeps(const af_problem& p, const VariantBufs& vb, int64_t b, int64_t h,
                                              int64_t i, int64_t j) {
  if constexpr (kBug == VarBug::kMaskBitsStride) {
    if (p.variants & AF_VARIANT_MASK_BITS) {
      af_problem w = p;
      // PLANTED: mask-bits-stride: the row stride of the bit-packed mask computed as Sk / 8 (rounded down) bytes;
      // right when Sk is a multiple of 8, rows drift by one byte per row otherwise.
      w.mask_stride[2] = p.seq_k / 8;
      return mask_keeps(w, vb, b, h, i, j);
    }
  }
  if constexpr (kBug == VarBug::kBlockPartialFull) {
    if (p.variants & AF_VARIANT_BLOCK_SPARSE) {
      af_problem w = p;
      // PLANTED: block-partial-full: a partial block is processed like a full one (the mask_mod step skipped).
      w.variants &= ~(AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS);
      return mask_keeps(w, vb, b, h, i, j);
    }
  }
  return mask_keeps(p, vb, b, h, i, j);
}

// The final score of (b, h, i, j) as the planted kernel computes it.
template <VarBug kBug>
__host__ __device__ inline float planted_score(const af_problem& p, const VariantBufs& vb, int64_t b, int64_t h,
                                               int64_t i, int64_t j, float s) {
  if constexpr (kBug == VarBug::kSoftcapExp) {
    if (p.variants & AF_VARIANT_SOFTCAP) {
      // PLANTED: softcap-exp: tanh through exponentials; e^x overflows past |x| = 88.7 and inf / inf = NaN.
      const float x = s / p.softcap, ep = expf(x), em = expf(-x);
      af_problem rest = p;
      rest.variants &= ~AF_VARIANT_SOFTCAP;
      return variant_score(rest, vb, b, h, i, j, p.softcap * ((ep - em) / (ep + em)));
    }
  }
  if constexpr (kBug == VarBug::kAlibiPow2) {
    if (p.variants & AF_VARIANT_ALIBI) {
      af_problem rest = p;
      rest.variants &= ~AF_VARIANT_ALIBI;
      s = variant_score(rest, vb, b, h, i, j, s);
      const int64_t off = p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? p.seq_k - p.seq_q : 0;
      const int64_t dist = j - (i + off);
      // PLANTED: alibi-pow2: the slope of head h is 2^(-8 (h + 1) / Hq), the ALiBi paper's rule for a power-of-two
      // head count only; buffers.alibi_slopes is never read.
      const float slope = exp2f(-8.0f * (float)(h + 1) / (float)p.heads_q);
      return s - slope * (float)(dist < 0 ? -dist : dist);
    }
  }
  if constexpr (kBug == VarBug::kBiasBatch0) {
    if (p.variants & AF_VARIANT_BIAS) {
      af_problem q0 = p;
      // PLANTED: bias-batch0: the bias is taken as broadcast over the batch (batch stride ignored).
      q0.bias_stride[0] = 0;
      return variant_score(q0, vb, b, h, i, j, s);
    }
  }
  return variant_score(p, vb, b, h, i, j, s);
}

// Online softmax over keys [lo, hi) of row (b, h, i): state (m, l, acc[Dv]).
template <VarBug kBug>
__device__ inline void row_state(const af_problem& p, const VariantBufs& vb, const float* q, const float* k,
                                 const float* v, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi, float& m,
                                 float& l, float* acc) {
  const int64_t hk = kv_head_of(p, h);
  const float* qr = q + q_row(p, b, i, h);
  for (int64_t j = lo; j < hi; ++j) {
    if (!planted_keeps<kBug>(p, vb, b, h, i, j)) continue;  // hidden by the custom / block mask
    const float* kr = k + k_row(p, b, j, hk);
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
    const float s = planted_score<kBug>(p, vb, b, h, i, j, p.scale * dot);
    const float m_new = nan_max(m, s);
    const float alpha = rescale_factor(m, m_new), w = softmax_weight(s, m_new);
    const float* vr = v + v_row(p, b, j, hk);
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = acc[d] * alpha + w * vr[d];
    l = l * alpha + w;
    m = m_new;
  }
}

template <VarBug kBug>
__global__ void __launch_bounds__(kThreads)
    var_row_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                   float* __restrict__ o, float* __restrict__ lse, VariantBufs vb) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const KeySpan keys = row_keys(p, i);
  float m = neg_inf(), l = 0.0f, acc[kMaxD];
  for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = 0.0f;
  row_state<kBug>(p, vb, q, k, v, b, h, i, keys.first, keys.last, m, l, acc);
  float sink = variant_sink(p, vb, h);
  // PLANTED: sink-ignored-prefill: only the decode path (one query row) folds the sink in.
  if (kBug == VarBug::kSinkIgnoredPrefill && p.seq_q > 1) sink = neg_inf();
  const float alpha = fold_sink(sink, m, l);
  for (int64_t d = 0; d < p.head_dim_v; ++d) o[o_row(p, b, i, h) + d] = finish_o(acc[d] * alpha, m, l);
  if (lse) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

// ---- fp8 per-head descales (AF_VARIANT_HEAD_DESCALE) ----
// One thread per query row of fp8-e4m3 q, k, v (the online softmax above in fp32, the weight rounded to fp8 for P.V as
// the flash kernel does), with common.h's score_scale / store_o of the per-head descales.
template <VarBug kBug>
__global__ void __launch_bounds__(kThreads)
    var_fp8_row_kernel(af_problem p, const af_fp8_e4m3* __restrict__ q, const af_fp8_e4m3* __restrict__ k,
                       const af_fp8_e4m3* __restrict__ v, af_fp8_e4m3* __restrict__ o, float* __restrict__ lse,
                       VariantBufs vb) {
  using T = af_fp8_e4m3;
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const int64_t hk = kv_head_of(p, h);
  // PLANTED: head-descale-qhead: k's per-head descale read at the query head's index wrapped into the [Hkv] array
  // (h mod Hkv) instead of its KV head hk = h / (Hq / Hkv); right when Hq == Hkv or Hkv == 1.
  const int64_t hk_descale = kBug == VarBug::kHeadDescaleQHead ? h % p.heads_kv : hk;
  af_problem pd = p;
  // PLANTED: head-descale-ignored: the per-head descale arrays are never read; the per-tensor q/k/v_descale are used.
  if (kBug == VarBug::kHeadDescaleIgnored) pd.variants &= ~AF_VARIANT_HEAD_DESCALE;
  const float sc = score_scale<T>(pd, vb, b, h, hk_descale);
  const KeySpan keys = row_keys(p, i);
  const T* qr = q + q_row(p, b, i, h);
  float m = neg_inf(), l = 0.0f, acc[kMaxD];
  for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = 0.0f;
  for (int64_t j = keys.first; j < keys.last; ++j) {
    const T* kr = k + k_row(p, b, j, hk);
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += Elem<T>::load(qr[d]) * Elem<T>::load(kr[d]);
    const float s = sc * dot;
    const float m_new = nan_max(m, s);
    const float alpha = rescale_factor(m, m_new), w = softmax_weight(s, m_new), wr = Elem<T>::round(w);
    const T* vr = v + v_row(p, b, j, hk);
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = acc[d] * alpha + wr * Elem<T>::load(vr[d]);
    l = l * alpha + w;
    m = m_new;
  }
  for (int64_t d = 0; d < p.head_dim_v; ++d) o[o_row(p, b, i, h) + d] = store_o<T>(pd, vb, b, hk, finish_o(acc[d], m, l));
  if (lse) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

// ---- bf16 with the score variants ----
// One thread per query row of bf16 q, k, v: online-row's bf16 arithmetic (fp32 scores, softmax state and accumulators,
// the weight rounded to bf16 for P.V, O rounded once) with the score variants of common.h.
template <VarBug kBug>
__global__ void __launch_bounds__(kThreads)
    var_bf16_row_kernel(af_problem p, const __hip_bfloat16* __restrict__ q, const __hip_bfloat16* __restrict__ k,
                        const __hip_bfloat16* __restrict__ v, __hip_bfloat16* __restrict__ o, float* __restrict__ lse,
                        VariantBufs vb) {
  using T = __hip_bfloat16;
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const int64_t hk = kv_head_of(p, h);
  constexpr uint32_t kAdd = AF_VARIANT_BIAS | AF_VARIANT_ALIBI;
  af_problem rest = p, terms = p;  // the score without the additive terms; the terms alone
  rest.variants &= ~kAdd;
  terms.variants &= kAdd;
  const KeySpan keys = row_keys(p, i);
  const T* qr = q + q_row(p, b, i, h);
  float m = neg_inf(), l = 0.0f, acc[kMaxD];
  for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = 0.0f;
  for (int64_t j = keys.first; j < keys.last; ++j) {
    const T* kr = k + k_row(p, b, j, hk);
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += Elem<T>::load(qr[d]) * Elem<T>::load(kr[d]);
    float s = variant_score(rest, vb, b, h, i, j, p.scale * dot);
    // PLANTED: bias-add-bf16: bias + ALiBi summed in fp32, rounded to bf16, then added (the float mask SDPA takes in
    // the query's dtype); the kernel does not declare AF_KERNEL_SCORE_ADD_IN_DTYPE.
    if (terms.variants) s += Elem<T>::round(variant_score(terms, vb, b, h, i, j, 0.0f));
    const float m_new = nan_max(m, s);
    const float alpha = rescale_factor(m, m_new), w = softmax_weight(s, m_new), wr = Elem<T>::round(w);
    const T* vr = v + v_row(p, b, j, hk);
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = acc[d] * alpha + wr * Elem<T>::load(vr[d]);
    l = l * alpha + w;
    m = m_new;
  }
  const float alpha = fold_sink(variant_sink(p, vb, h), m, l);
  for (int64_t d = 0; d < p.head_dim_v; ++d) o[o_row(p, b, i, h) + d] = Elem<T>::store(finish_o(acc[d] * alpha, m, l));
  if (lse) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

int var_bf16_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, AF_SUPPORTS_BF16, why, why_len)) return 1;
  if (p->head_dim_v > kMaxD) return unsupported(why, why_len, "planted variant kernels support Dv <= 128");
  if (!grid_fits(ceil_div(p->seq_q, kThreads), p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "grid exceeds the launch limits");
  return 0;
}

template <VarBug kBug>
int var_bf16_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (var_bf16_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  using T = __hip_bfloat16;
  hipLaunchKernelGGL(var_bf16_row_kernel<kBug>,
                     dim3((unsigned)ceil_div(p.seq_q, kThreads), (unsigned)p.heads_q, (unsigned)p.batch),
                     dim3(kThreads), 0, (hipStream_t)stream, p, static_cast<const T*>(buf->q),
                     static_cast<const T*>(buf->k), static_cast<const T*>(buf->v), static_cast<T*>(buf->o), buf->lse,
                     variant_bufs(*buf));
  return (int)hipGetLastError();
}

int var_fp8_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, AF_SUPPORTS_FP8_E4M3, why, why_len)) return 1;
  if (p->head_dim_v > kMaxD) return unsupported(why, why_len, "planted variant kernels support Dv <= 128");
  if (!grid_fits(ceil_div(p->seq_q, kThreads), p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "grid exceeds the launch limits");
  return 0;
}

template <VarBug kBug>
int var_fp8_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (var_fp8_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  using T = af_fp8_e4m3;
  hipLaunchKernelGGL(var_fp8_row_kernel<kBug>,
                     dim3((unsigned)ceil_div(p.seq_q, kThreads), (unsigned)p.heads_q, (unsigned)p.batch),
                     dim3(kThreads), 0, (hipStream_t)stream, p, static_cast<const T*>(buf->q),
                     static_cast<const T*>(buf->k), static_cast<const T*>(buf->v), static_cast<T*>(buf->o), buf->lse,
                     variant_bufs(*buf));
  return (int)hipGetLastError();
}

// ---- split-KV: partial states of num_splits key ranges, then the combine ----
const af_tunable kSplitTunables[] = {
    {"num_splits", "KV splits per row (at most ceil(Sk / 4))", AF_TUNABLE_KV_SPLITS, 5, {8, 1, 2, 4, 16}},
};
struct Splits {
  int64_t n, len;
};
__host__ __device__ inline Splits splits_of(const af_problem& p) {
  if (p.seq_k == 0) return {0, 0};
  const int64_t want = p.tunables[0] >= 1 ? p.tunables[0] : 8;
  const int64_t n = min64(want, ceil_div(p.seq_k, 4));
  const int64_t len = ceil_div(p.seq_k, n);
  return {ceil_div(p.seq_k, len), len};
}

// Thread (row i, split s): the split's (O_s, LSE_s); split 0 also carries the sink (its state starts from it).
template <VarBug kBug>
__global__ void __launch_bounds__(kThreads)
    var_split_partial(af_problem p, const float* __restrict__ q, const float* __restrict__ k,
                      const float* __restrict__ v, float* o_part, float* lse_part, Splits sp, VariantBufs vb) {
  const int64_t x = (int64_t)blockIdx.x * kThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (x >= p.seq_q * sp.n) return;
  const int64_t i = x / sp.n, s = x % sp.n;
  const KeySpan keys = row_keys(p, i);
  const int64_t lo = max64(keys.first, s * sp.len), hi = min64(keys.last, (s + 1) * sp.len);
  float m = neg_inf(), l = 0.0f, acc[kMaxD];
  for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = 0.0f;
  if (s == 0) {
    m = variant_sink(p, vb, h);  // the sink as split 0's first term: exp(sink - sink) = 1
    l = m == neg_inf() ? 0.0f : 1.0f;
  }
  row_state<kBug>(p, vb, q, k, v, b, h, i, lo, hi, m, l, acc);
  const int64_t slot = ((b * p.heads_q + h) * p.seq_q + i) * sp.n + s;
  for (int64_t d = 0; d < p.head_dim_v; ++d) o_part[slot * p.head_dim_v + d] = m == neg_inf() ? 0.0f : acc[d] / l;
  lse_part[slot] = finish_lse(m, l);
}

template <VarBug kBug>
__global__ void __launch_bounds__(kThreads)
    var_split_combine(af_problem p, const float* __restrict__ o_part, const float* __restrict__ lse_part,
                      float* __restrict__ o, float* __restrict__ lse, Splits sp, VariantBufs vb) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
  const float* lp = lse_part + row * sp.n;
  float m = neg_inf();
  for (int64_t s = 0; s < sp.n; ++s) m = nan_max(m, lp[s]);
  float extra = neg_inf();
  if constexpr (kBug == VarBug::kSinkTwiceEmptySplit) {
    const KeySpan keys = row_keys(p, i);
    // PLANTED: sink-twice-empty-split: when split 0 sees no key of the row, the combine adds the sink once more
    // (a fix-up for a path where split 0 did not start from the sink; here it always does).
    if (sp.n > 1 && max64(keys.first, 0) >= min64(keys.last, sp.len)) extra = variant_sink(p, vb, h);
    m = nan_max(m, extra);
  }
  float l = softmax_weight(extra, m);
  for (int64_t s = 0; s < sp.n; ++s) l += softmax_weight(lp[s], m);
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    float acc = 0.0f;
    for (int64_t s = 0; s < sp.n; ++s) acc += softmax_weight(lp[s], m) * o_part[(row * sp.n + s) * p.head_dim_v + d];
    o[o_row(p, b, i, h) + d] = finish_o(acc, m, l);
  }
  if (lse) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

// ---- backward: Delta and dQ per query row, dK / dV per key, d sink per head, d bias per pair ----
__host__ __device__ inline int64_t grad_row(const af_problem& p, const int64_t* st, int64_t b, int64_t s, int64_t h) {
  return b * st[0] + s * st[1] + h * st[2];
}

// P and the raw score's dS of the visible pair (b, h, i, j); dS_f is the final score's.
__device__ inline void pair(const af_problem& p, const VariantBufs& vb, const float* q, const float* k, const float* v,
                            const float* dout, const float* lse, const float* delta, int64_t b, int64_t h, int64_t i,
                            int64_t j, float& P, float& dS, float& dS_f) {
  const int64_t hk = kv_head_of(p, h);
  const float *qr = q + q_row(p, b, i, h), *kr = k + k_row(p, b, j, hk), *vr = v + v_row(p, b, j, hk);
  const float* g = dout + grad_row(p, p.do_stride, b, i, h);
  float dot = 0.0f, dp = 0.0f;
  for (int64_t d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
  for (int64_t d = 0; d < p.head_dim_v; ++d) dp += g[d] * vr[d];
  float dcap;
  P = expf(variant_score(p, vb, b, h, i, j, p.scale * dot, &dcap) - lse[lse_at(p, b, h, i)]);
  dS_f = P * (dp - delta[(b * p.heads_q + h) * p.seq_q + i]);
  dS = dS_f * dcap;
}

__global__ void __launch_bounds__(kThreads)
    var_bwd_rows(af_problem p, const float* q, const float* k, const float* v, const float* o, const float* lse,
                 const float* dout, float* delta, float* dq, int pass, VariantBufs vb, float* dbias, int use_mask) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const float* g = dout + grad_row(p, p.do_stride, b, i, h);
  const float* orow = o + o_row(p, b, i, h);
  const KeySpan keys = row_keys(p, i);
  const bool empty = lse[lse_at(p, b, h, i)] == neg_inf();
  if (pass == 0) {  // Delta
    float acc = 0.0f;
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc += g[d] * orow[d];
    delta[(b * p.heads_q + h) * p.seq_q + i] = acc;
    return;
  }
  float* dqr = dq + grad_row(p, p.dq_stride, b, i, h);
  for (int64_t d = 0; d < p.head_dim; ++d) dqr[d] = 0.0f;
  if (empty) return;
  const int64_t hk = kv_head_of(p, h);
  for (int64_t j = keys.first; j < keys.last; ++j) {
    if (use_mask && !mask_keeps(p, vb, b, h, i, j)) continue;
    float P, dS, dS_f;
    pair(p, vb, q, k, v, dout, lse, delta, b, h, i, j, P, dS, dS_f);
    const float* kr = k + k_row(p, b, j, hk);
    for (int64_t d = 0; d < p.head_dim; ++d) dqr[d] += p.scale * dS * kr[d];
    if (dbias)
      atomicAdd(dbias + b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3], dS_f);
  }
}

__global__ void __launch_bounds__(kThreads)
    var_bwd_keys(af_problem p, const float* q, const float* k, const float* v, const float* lse, const float* dout,
                 const float* delta, float* dk, float* dv, VariantBufs vb, int use_mask) {
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x, hk = blockIdx.y, b = blockIdx.z;
  if (j >= p.seq_k) return;
  float* dkr = dk + grad_row(p, p.dk_stride, b, j, hk);
  float* dvr = dv + grad_row(p, p.dv_stride, b, j, hk);
  for (int64_t d = 0; d < p.head_dim; ++d) dkr[d] = 0.0f;
  for (int64_t d = 0; d < p.head_dim_v; ++d) dvr[d] = 0.0f;
  const int64_t G = p.heads_q / p.heads_kv;
  for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const KeySpan keys = row_keys(p, i);
      if (j < keys.first || j >= keys.last || lse[lse_at(p, b, h, i)] == neg_inf()) continue;
      if (use_mask && !mask_keeps(p, vb, b, h, i, j)) continue;
      float P, dS, dS_f;
      pair(p, vb, q, k, v, dout, lse, delta, b, h, i, j, P, dS, dS_f);
      const float* qr = q + q_row(p, b, i, h);
      const float* g = dout + grad_row(p, p.do_stride, b, i, h);
      for (int64_t d = 0; d < p.head_dim; ++d) dkr[d] += p.scale * dS * qr[d];
      for (int64_t d = 0; d < p.head_dim_v; ++d) dvr[d] += P * g[d];
    }
}

template <VarBug kBug>
__global__ void __launch_bounds__(kThreads)
    var_bwd_sinks(af_problem p, const float* lse, const float* delta, float* dsinks, float* dbias, VariantBufs vb) {
  const int64_t t = threadIdx.x;
  if (dbias && t == 0) {  // zeroed before the row pass accumulates (one thread: the bias may be broadcast)
    for (int64_t b = 0; b < (p.bias_stride[0] ? p.batch : 1); ++b)
      for (int64_t h = 0; h < (p.bias_stride[1] ? p.heads_q : 1); ++h)
        for (int64_t i = 0; i < (p.bias_stride[2] ? p.seq_q : 1); ++i)
          for (int64_t j = 0; j < (p.bias_stride[3] ? p.seq_k : 1); ++j)
            dbias[b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]] = 0.0f;
  }
  if (!dsinks) return;
  for (int64_t h = t; h < p.heads_q; h += kThreads) {
    const float sink = variant_sink(p, vb, h);
    float acc = 0.0f;
    if (sink != neg_inf())
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t i = 0; i < p.seq_q; ++i) {
          const float l = lse[lse_at(p, b, h, i)];
          if (l != neg_inf()) acc -= expf(sink - l) * delta[(b * p.heads_q + h) * p.seq_q + i];
        }
    // PLANTED: dsink-zero: d sink is left 0 (the sink treated as a constant of the backward).
    dsinks[h] = kBug == VarBug::kDsinkZero ? 0.0f : acc;
  }
}

size_t var_split_workspace(const af_problem* p) {
  const Splits sp = splits_of(*p);
  return (size_t)(p->batch * p->heads_q * p->seq_q * sp.n * (p->head_dim_v + 1)) * sizeof(float);
}
size_t var_bwd_workspace(const af_problem* p) { return (size_t)(p->batch * p->heads_q * p->seq_q) * sizeof(float); }

int var_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, AF_SUPPORTS_F32, why, why_len)) return 1;
  if (p->head_dim_v > kMaxD) return unsupported(why, why_len, "planted variant kernels support Dv <= 128");
  if (!grid_fits(ceil_div(max64(p->seq_q, p->seq_k) * 16, kThreads), p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "grid exceeds the launch limits");
  return 0;
}

template <VarBug kBug>
int var_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (var_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  const VariantBufs vb = variant_bufs(*buf);
  const float *q = static_cast<const float*>(buf->q), *k = static_cast<const float*>(buf->k),
              *v = static_cast<const float*>(buf->v);
  if constexpr (kBug == VarBug::kSinkTwiceEmptySplit) {
    const Splits sp = splits_of(p);
    float* o_part = static_cast<float*>(buf->workspace);
    float* lse_part = o_part + p.batch * p.heads_q * p.seq_q * sp.n * p.head_dim_v;
    if (sp.n > 0) {
      hipLaunchKernelGGL(var_split_partial<kBug>, dim3((unsigned)ceil_div(p.seq_q * sp.n, kThreads),
                                                       (unsigned)p.heads_q, (unsigned)p.batch),
                         dim3(kThreads), 0, (hipStream_t)stream, p, q, k, v, o_part, lse_part, sp, vb);
      if (int e = (int)hipGetLastError()) return e;
    }
    hipLaunchKernelGGL(var_split_combine<kBug>,
                       dim3((unsigned)ceil_div(p.seq_q, kThreads), (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(kThreads), 0, (hipStream_t)stream, p, (const float*)o_part, (const float*)lse_part,
                       static_cast<float*>(buf->o), buf->lse, sp, vb);
    return (int)hipGetLastError();
  }
  hipLaunchKernelGGL(var_row_kernel<kBug>,
                     dim3((unsigned)ceil_div(p.seq_q, kThreads), (unsigned)p.heads_q, (unsigned)p.batch),
                     dim3(kThreads), 0, (hipStream_t)stream, p, q, k, v, static_cast<float*>(buf->o), buf->lse, vb);
  return (int)hipGetLastError();
}

template <VarBug kBug>
int var_bwd_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (var_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  const VariantBufs vb = variant_bufs(*buf);
  const float *q = static_cast<const float*>(buf->q), *k = static_cast<const float*>(buf->k),
              *v = static_cast<const float*>(buf->v), *o = static_cast<const float*>(buf->o),
              *dout = static_cast<const float*>(buf->dout);
  float* delta = static_cast<float*>(buf->workspace);
  float* dbias = (p.variants & AF_VARIANT_BIAS) ? buf->dbias : nullptr;
  // PLANTED: mask-ignored-bwd: the backward recomputes P over every key of the mask_kind interval (the custom and
  // block masks, applied by the forward, are not passed on), with the forward's LSE.
  const int use_mask = kBug == VarBug::kMaskIgnoredBwd ? 0 : 1;
  const dim3 rows((unsigned)ceil_div(p.seq_q, kThreads), (unsigned)p.heads_q, (unsigned)p.batch);
  hipLaunchKernelGGL(var_bwd_rows, rows, dim3(kThreads), 0, (hipStream_t)stream, p, q, k, v, o, buf->lse, dout, delta,
                     static_cast<float*>(buf->dq), 0, vb, dbias, use_mask);
  if (int e = (int)hipGetLastError()) return e;
  hipLaunchKernelGGL(var_bwd_sinks<kBug>, dim3(1), dim3(kThreads), 0, (hipStream_t)stream, p, (const float*)buf->lse,
                     (const float*)delta, (p.variants & AF_VARIANT_SINK) ? buf->dsinks : nullptr, dbias, vb);
  if (int e = (int)hipGetLastError()) return e;
  hipLaunchKernelGGL(var_bwd_rows, rows, dim3(kThreads), 0, (hipStream_t)stream, p, q, k, v, o, buf->lse, dout, delta,
                     static_cast<float*>(buf->dq), 1, vb, dbias, use_mask);
  if (int e = (int)hipGetLastError()) return e;
  if (p.seq_k > 0)
    hipLaunchKernelGGL(var_bwd_keys, dim3((unsigned)ceil_div(p.seq_k, kThreads), (unsigned)p.heads_kv, (unsigned)p.batch),
                       dim3(kThreads), 0, (hipStream_t)stream, p, q, k, v, (const float*)buf->lse, dout,
                       (const float*)delta, static_cast<float*>(buf->dk), static_cast<float*>(buf->dv), vb, use_mask);
  return (int)hipGetLastError();
}

#define AF_PLANTED_VARIANTS(name, bug, what, ws, ntun, tun, bwd_ws, bwd, vars)                                   \
  {                                                                                                              \
    name, "planted/variants", "fp32 row kernel with the variants and a planted bug: " what, AF_SUPPORTS_F32,      \
        AF_SUPPORTS_ALL_MASKS, 0, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, ws, var_check,                  \
        var_launch<VarBug::bug>, /*features=*/0, ntun, tun, bwd_ws, bwd, /*compute_model=*/0, /*kind=*/0,        \
        /*flags=*/0, /*variants=*/vars                                                                           \
  }
#define AF_PLANTED_VAR(name, bug, what, ws, ntun, tun, bwd_ws, bwd) \
  AF_PLANTED_VARIANTS(name, bug, what, ws, ntun, tun, bwd_ws, bwd, kScoreVariants)
#define AF_PLANTED_MASK(name, bug, what, bwd_ws, bwd) \
  AF_PLANTED_VARIANTS(name, bug, what, nullptr, 0, nullptr, bwd_ws, bwd, kScoreVariants | kMaskVariants)

const af_kernel kVariantBugs[] = {
    AF_PLANTED_VAR("planted-sink-ignored-prefill", kSinkIgnoredPrefill,
                   "the sink is applied on the decode path (Sq = 1) only", nullptr, 0, nullptr, nullptr, nullptr),
    AF_PLANTED_VAR("planted-softcap-exp", kSoftcapExp, "softcap's tanh through exp overflows for |s / cap| > 88",
                   nullptr, 0, nullptr, nullptr, nullptr),
    AF_PLANTED_VAR("planted-alibi-pow2-slopes", kAlibiPow2,
                   "ALiBi slopes 2^(-8 (h + 1) / Hq) of its own (wrong for Hq not a power of two)", nullptr, 0, nullptr,
                   nullptr, nullptr),
    AF_PLANTED_VAR("planted-bias-batch0", kBiasBatch0, "the bias's batch stride ignored (batch 0's bias everywhere)",
                   nullptr, 0, nullptr, nullptr, nullptr),
    AF_PLANTED_VAR("planted-split-sink-twice", kSinkTwiceEmptySplit,
                   "split-KV: the sink counted twice when split 0 is empty", var_split_workspace, 1, kSplitTunables,
                   nullptr, nullptr),
    AF_PLANTED_VAR("planted-dsink-zero", kDsinkZero, "backward: d sink left 0", nullptr, 0, nullptr, var_bwd_workspace,
                   var_bwd_launch<VarBug::kDsinkZero>),
    AF_PLANTED_MASK("planted-mask-bits-stride", kMaskBitsStride,
                    "bit-packed custom mask rows read Sk / 8 bytes apart (rounded down), not mask_stride[2]", nullptr,
                    nullptr),
    AF_PLANTED_MASK("planted-block-partial-full", kBlockPartialFull,
                    "block-sparse: a partial block treated as full (the custom mask never read)", nullptr, nullptr),
    AF_PLANTED_MASK("planted-mask-ignored-bwd", kMaskIgnoredBwd,
                    "the custom / block mask applied in the forward only (the backward sees every key)",
                    var_bwd_workspace, var_bwd_launch<VarBug::kMaskIgnoredBwd>),
    {"planted-head-descale-qhead", "planted/variants",
     "fp8-e4m3 row kernel with per-head descales and a planted bug: k's per-head descale read at the query head "
     "(h mod Hkv), not its KV head",
     AF_SUPPORTS_FP8_E4M3, AF_SUPPORTS_ALL_MASKS, 0, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr,
     var_fp8_check, var_fp8_launch<VarBug::kHeadDescaleQHead>, /*features=*/0, 0, nullptr, nullptr, nullptr,
     /*compute_model=*/0, /*kind=*/0, /*flags=*/0, /*variants=*/AF_VARIANT_HEAD_DESCALE},
    {"planted-head-descale-ignored", "planted/variants",
     "fp8-e4m3 row kernel with per-head descales and a planted bug: the per-head descales ignored (per-tensor used)",
     AF_SUPPORTS_FP8_E4M3, AF_SUPPORTS_ALL_MASKS, 0, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr,
     var_fp8_check, var_fp8_launch<VarBug::kHeadDescaleIgnored>, /*features=*/0, 0, nullptr, nullptr, nullptr,
     /*compute_model=*/0, /*kind=*/0, /*flags=*/0, /*variants=*/AF_VARIANT_HEAD_DESCALE},
    {"planted-bias-add-bf16", "planted/variants",
     "bf16 row kernel with the score variants and a planted bug: bias + ALiBi rounded to bf16 before they are added, "
     "not declared (AF_KERNEL_SCORE_ADD_IN_DTYPE)",
     AF_SUPPORTS_BF16, AF_SUPPORTS_ALL_MASKS, 0, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr,
     var_bf16_check, var_bf16_launch<VarBug::kBiasAddBf16>, /*features=*/0, 0, nullptr, nullptr, nullptr,
     /*compute_model=*/0, /*kind=*/0, /*flags=*/0, /*variants=*/kScoreVariants},
};
static_assert(sizeof(kVariantBugs) / sizeof(kVariantBugs[0]) == attnfuzz_planted::kVariantBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::variant_bugs() { return kVariantBugs; }

#undef AF_PLANTED_VAR
#undef AF_PLANTED_MASK
#undef AF_PLANTED_VARIANTS
