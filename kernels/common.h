// common.h - device-side helpers shared by every kernel file: indexing, mask interval, online-softmax steps.
//
// Everything lives in an anonymous namespace: each kernel file is compiled once per backend into the same
// binary, so nothing here may have external linkage. Planted-bug kernels include this header too.
#pragma once

#include <stdint.h>
#include <stdio.h>

#include "attnfuzz/hip.h"
#include "attnfuzz/philox.h"
#include "attnfuzz/custom_mask.h"

// Full unrolling of fixed-count loops over register arrays (keeps them out of local memory on GPUs).
#if defined(ATTNFUZZ_BACKEND_CPU)
#define AF_UNROLL
#else
#define AF_UNROLL _Pragma("unroll")
#endif

namespace {

// ---- numbers ------------------------------------------------------------------------------------------

__host__ __device__ inline float neg_inf() { return -INFINITY; }

__host__ __device__ inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- tensor addressing ([B, S, H, D] with element strides, last stride 1; LSE [B, Hq, Sq]) -----------

// Element offset of row (b, s, h) of q / k / v / o; add d for the element.
__host__ __device__ inline int64_t q_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.q_stride[0] + s * p.q_stride[1] + h * p.q_stride[2];
}
__host__ __device__ inline int64_t k_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.k_stride[0] + s * p.k_stride[1] + h * p.k_stride[2];
}
__host__ __device__ inline int64_t v_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.v_stride[0] + s * p.v_stride[1] + h * p.v_stride[2];
}
__host__ __device__ inline int64_t o_row(const af_problem& p, int64_t b, int64_t s, int64_t h) {
  return b * p.o_stride[0] + s * p.o_stride[1] + h * p.o_stride[2];
}
__host__ __device__ inline int64_t lse_at(const af_problem& p, int64_t b, int64_t h, int64_t s) {
  return b * p.lse_stride[0] + h * p.lse_stride[1] + s * p.lse_stride[2];
}
// The kv head read by query head h (GQA / MQA): h / (Hq / Hkv).
__host__ __device__ inline int64_t kv_head_of(const af_problem& p, int64_t h) {
  return h / (p.heads_q / p.heads_kv);
}

// ---- mask ---------------------------------------------------------------------------------------------

// Visible keys of query row i are exactly [first, last); empty when first >= last (then last == first).
struct KeySpan {
  int64_t first, last;
};

// visible(i, j) <=> j - (i + off) in [-left, right], off = 0 (top-left) or sk - sq (bottom-right);
// causal = (left unbounded, right 0); none = everything. Mirrors attnfuzz::visible_keys (core/problem.cpp).
// sq, sk: the lengths of the sequence row i belongs to (a varlen batch aligns its mask per sequence).
__host__ __device__ inline KeySpan row_keys_in(const af_problem& p, int64_t sq, int64_t sk, int64_t i) {
  if (p.mask_kind == AF_MASK_NONE) return {0, sk};
  const int64_t off = p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? sk - sq : 0;
  const int64_t c = i + off;  // the key on the diagonal
  const int64_t left = p.mask_kind == AF_MASK_WINDOW ? p.window_left : AF_UNBOUNDED;
  const int64_t right = p.mask_kind == AF_MASK_CAUSAL ? 0 : p.window_right;
  const int64_t first = left == AF_UNBOUNDED ? 0 : max64(0, c - left);
  int64_t last = right == AF_UNBOUNDED ? sk : min64(sk, c + right + 1);
  if (last < first) last = first;
  return {first, last};
}
// The dense problem: every sequence has seq_q queries and seq_k keys.
__host__ __device__ inline KeySpan row_keys(const af_problem& p, int64_t i) {
  return row_keys_in(p, p.seq_q, p.seq_k, i);
}

// ---- varlen / KV cache / paged KV (ABI v2; docs/semantics.md "Sequence layouts") ---------------------
//
// Sequence b has Sq_b queries (cu_seqlens_q[b + 1] - cu_seqlens_q[b] when q is packed, else seq_q) and Sk_b
// keys: seqused_k[b] when given (a KV cache used below its capacity), else the packed length
// cu_seqlens_k[b + 1] - cu_seqlens_k[b], kv_capacity when paged, seq_k when dense. O follows q's layout;
// LSE stays [B, Hq, seq_q] (seq_q = the largest Sq_b) and only its first Sq_b rows of sequence b are written.

// The index arrays of a launch (af_buffers' v2 pointers), passed to kernels by value.
struct SeqIndex {
  const int32_t* cu_q;         // [B + 1] when q is packed
  const int32_t* cu_k;         // [B + 1] when k / v are packed
  const int32_t* used_k;       // [B] or NULL
  const int32_t* block_table;  // [B, max_pages_per_seq] when k / v are paged
};
inline SeqIndex seq_index(const af_buffers& b) {
  return {b.cu_seqlens_q, b.cu_seqlens_k, b.seqused_k, b.block_table};
}

// Sequence b: its lengths and the packed row of its token 0 (0 for a dense layout).
struct SeqShape {
  int64_t b, sq, sk, q_first, k_first;
};
__host__ __device__ inline SeqShape seq_shape(const af_problem& p, const SeqIndex& x, int64_t b) {
  SeqShape s{b, p.seq_q, p.seq_k, 0, 0};
  if (p.q_layout == AF_SEQ_PACKED) {
    s.q_first = x.cu_q[b];
    s.sq = x.cu_q[b + 1] - s.q_first;
  }
  if (p.kv_layout == AF_SEQ_PACKED) {
    s.k_first = x.cu_k[b];
    s.sk = x.cu_k[b + 1] - s.k_first;
  } else if (p.kv_layout == AF_SEQ_PAGED) {
    s.sk = p.kv_capacity;
  }
  if (x.used_k) s.sk = x.used_k[b];
  return s;
}
// Visible keys of row i of sequence s (per-sequence mask alignment).
__host__ __device__ inline KeySpan seq_row_keys(const af_problem& p, const SeqShape& s, int64_t i) {
  return row_keys_in(p, s.sq, s.sk, i);
}

// Element offsets of token t of sequence s, head h. Packed: row q_first + t (stride[0] unused).
__host__ __device__ inline int64_t seq_q_row(const af_problem& p, const SeqShape& s, int64_t t, int64_t h) {
  return (p.q_layout == AF_SEQ_PACKED ? 0 : s.b * p.q_stride[0]) + (s.q_first + t) * p.q_stride[1] +
         h * p.q_stride[2];
}
__host__ __device__ inline int64_t seq_o_row(const af_problem& p, const SeqShape& s, int64_t t, int64_t h) {
  return (p.q_layout == AF_SEQ_PACKED ? 0 : s.b * p.o_stride[0]) + (s.q_first + t) * p.o_stride[1] +
         h * p.o_stride[2];
}
// K / V: paged layouts find key t in pool page block_table[b, t / page_size], slot t % page_size.
__host__ __device__ inline int64_t seq_kv_row(const af_problem& p, const int64_t* stride, const SeqIndex& x,
                                              const SeqShape& s, int64_t t, int64_t hk) {
  if (p.kv_layout == AF_SEQ_PAGED) {
    const int64_t page = x.block_table[s.b * p.max_pages_per_seq + t / p.page_size];
    return page * stride[0] + (t % p.page_size) * stride[1] + hk * stride[2];
  }
  return (p.kv_layout == AF_SEQ_PACKED ? 0 : s.b * stride[0]) + (s.k_first + t) * stride[1] + hk * stride[2];
}
__host__ __device__ inline int64_t seq_k_row(const af_problem& p, const SeqIndex& x, const SeqShape& s, int64_t t,
                                             int64_t hk) {
  return seq_kv_row(p, p.k_stride, x, s, t, hk);
}
__host__ __device__ inline int64_t seq_v_row(const af_problem& p, const SeqIndex& x, const SeqShape& s, int64_t t,
                                             int64_t hk) {
  return seq_kv_row(p, p.v_stride, x, s, t, hk);
}

// ---- sequence metadata (docs/semantics.md "Malformed metadata") ----------------------------------------------
//
// The host-side check of a sequence layout's int32 arrays before a launch (FlashInfer's plan does the same with
// its indptr arrays): cu_seqlens start at 0, never decrease and end at total_q / total_k; 0 <= seqused_k[b] <= the
// sequence's capacity (kv_capacity; packed K/V: its slots); every block-table entry of a page a sequence uses names
// a pool page. Returns 0, or the error code a launch refuses malformed metadata with (hipErrorInvalidValue).
inline int fetch_ints(const int32_t* device, int64_t n, int32_t* host) {
  return device ? (int)hipMemcpy(host, device, (size_t)n * sizeof(int32_t), hipMemcpyDeviceToHost)
                : (int)hipErrorInvalidValue;
}
inline bool prefix_sums_ok(const int32_t* cu, int64_t batch, int64_t total) {
  bool ok = cu[0] == 0 && cu[batch] == total;
  for (int64_t b = 0; b < batch; ++b) ok = ok && cu[b + 1] >= cu[b];
  return ok;
}
inline int check_seq_metadata(const af_problem& p, const af_buffers& buf) {
  const int64_t B = p.batch, bad = (int)hipErrorInvalidValue;
  int32_t* a = new int32_t[(size_t)(3 * (B + 1) + B * p.max_pages_per_seq)];
  int32_t *cq = a, *ck = a + (B + 1), *used = a + 2 * (B + 1), *table = a + 3 * (B + 1);
  int64_t e = 0;
  if (p.q_layout == AF_SEQ_PACKED && !(e = fetch_ints(buf.cu_seqlens_q, B + 1, cq)) &&
      !prefix_sums_ok(cq, B, p.total_q))
    e = bad;
  if (!e && p.kv_layout == AF_SEQ_PACKED && !(e = fetch_ints(buf.cu_seqlens_k, B + 1, ck)) &&
      !prefix_sums_ok(ck, B, p.total_k))
    e = bad;
  if (!e && buf.seqused_k && !(e = fetch_ints(buf.seqused_k, B, used)))
    for (int64_t b = 0; b < B && !e; ++b)
      if (used[b] < 0 || used[b] > (p.kv_layout == AF_SEQ_PACKED ? ck[b + 1] - ck[b] : p.kv_capacity)) e = bad;
  if (!e && p.kv_layout == AF_SEQ_PAGED && !(e = fetch_ints(buf.block_table, B * p.max_pages_per_seq, table)))
    for (int64_t b = 0; b < B && !e; ++b) {
      const int64_t pages = ceil_div(buf.seqused_k ? used[b] : p.kv_capacity, p.page_size);
      for (int64_t j = 0; j < pages && !e; ++j) {
        const int32_t page = table[b * p.max_pages_per_seq + j];
        if (page < 0 || page >= p.num_pages) e = bad;
      }
    }
  delete[] a;
  return (int)e;
}

// ---- online softmax, IEEE-consistent (docs/semantics.md "NaN and Inf") ------------------------------------
//
// State per row: m (running max), l (sum of exp(s - m)), acc (sum of exp(s - m) * v). A NaN score must
// reach the output, so the running max propagates NaN (fmaxf would drop it). A -inf score has weight 0,
// and while every score so far is -inf the state is left as it is (exp(-inf - -inf) would be NaN).
// A row whose max is still -inf at the end is fully masked: O = 0, LSE = -inf.

// max(a, b) that returns NaN when either is NaN.
__host__ __device__ inline float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

// Factor that moves state kept relative to m_old onto m_new (>= m_old): exp(m_old - m_new); 1 while
// m_new is -inf (the state holds nothing relative to any max yet).
__host__ __device__ inline float rescale_factor(float m_old, float m_new) {
  return m_new == neg_inf() ? 1.0f : expf(m_old - m_new);
}

// Weight exp(s - m) of score s under running max m >= s; exactly 0 for s = -inf (also when m = -inf).
__host__ __device__ inline float softmax_weight(float s, float m) {
  return s == neg_inf() ? 0.0f : expf(s - m);
}

// Natural-log logsumexp from the final state; -inf for a fully masked row.
__host__ __device__ inline float finish_lse(float m, float l) {
  return m == neg_inf() ? neg_inf() : m + logf(l);
}

// Output element from the final state; exactly 0 for a fully masked row.
__host__ __device__ inline float finish_o(float acc, float m, float l) {
  return m == neg_inf() ? 0.0f : acc / l;
}

// ---- element types (issue 13) ------------------------------------------------------------------------
//
// Elem<T> for the stored element types: f32 (float), f16 (__half), bf16 (__hip_bfloat16), fp8 (af_fp8_e4m3,
// attnfuzz/lowp_types.h). load: the stored value as float (exact); store: a float rounded once to T; round:
// a float rounded to T and back (P rounded to the input type before P.V, as FlashAttention does). Kernels
// keep every score, sum and accumulator in fp32; for f32 every function is the identity, so the f32 paths
// compute bit-identically to before. kFp8: the case has descale factors (real = stored * descale).
template <class T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr bool kFp8 = false;
  __host__ __device__ static float load(float x) { return x; }
  __host__ __device__ static float store(float x) { return x; }
  __host__ __device__ static float round(float x) { return x; }
};
template <>
struct Elem<__half> {
  static constexpr bool kFp8 = false;
  __host__ __device__ static float load(__half x) { return __half2float(x); }
  __host__ __device__ static __half store(float x) { return __float2half_rn(x); }
  __host__ __device__ static float round(float x) { return __half2float(__float2half_rn(x)); }
};
template <>
struct Elem<__hip_bfloat16> {
  static constexpr bool kFp8 = false;
  __host__ __device__ static float load(__hip_bfloat16 x) { return __bfloat162float(x); }
  __host__ __device__ static __hip_bfloat16 store(float x) { return __float2bfloat16(x); }
  __host__ __device__ static float round(float x) { return __bfloat162float(__float2bfloat16(x)); }
};
template <>
struct Elem<af_fp8_e4m3> {
  static constexpr bool kFp8 = true;
  __host__ __device__ static float load(af_fp8_e4m3 x) { return af_fp8_to_float(x); }
  __host__ __device__ static af_fp8_e4m3 store(float x) { return af_float_to_e4m3(x); }
  __host__ __device__ static float round(float x) { return af_fp8_to_float(af_float_to_e4m3(x)); }
};

// The score scale a kernel of element type T applies to the stored q.k: scale, times q_descale * k_descale
// (rounded to fp32, as FlashAttention 3 folds them) for fp8.
template <class T>
__host__ __device__ inline float score_scale(const af_problem& p) {
  return Elem<T>::kFp8 ? p.scale * p.q_descale * p.k_descale : p.scale;
}
// The stored output element of a finished fp32 O: fp8 applies v_descale and o_scale (stored = fp8(O o_scale)).
template <class T>
__host__ __device__ inline T store_o(const af_problem& p, float o) {
  return Elem<T>::kFp8 ? Elem<T>::store(o * p.v_descale * p.o_scale) : Elem<T>::store(o);
}

// Calls f(T{}) with the element type of p.dtype among those in `dtypes` (AF_SUPPORTS_* bits); returns
// hipErrorInvalidValue for any other dtype.
template <class F>
inline int dispatch_dtype(const af_problem& p, uint32_t dtypes, F f) {
  if (!((1u << p.dtype) & dtypes)) return (int)hipErrorInvalidValue;
  switch (p.dtype) {
    case AF_DTYPE_F32: return f(float{});
    case AF_DTYPE_F16: return f(__half{});
    case AF_DTYPE_BF16: return f(__hip_bfloat16{});
    case AF_DTYPE_FP8_E4M3: return f(af_fp8_e4m3{});
    default: return (int)hipErrorInvalidValue;
  }
}

// "flash supports f16, bf16, f32" style refusal for a dtype outside `dtypes`.
inline int check_dtype(const af_problem* p, uint32_t dtypes, char* why, size_t why_len) {
  if ((1u << p->dtype) & dtypes) return 0;
  if (why && why_len) {
    snprintf(why, why_len, "supports %s%s%s%s", (dtypes & AF_SUPPORTS_F32) ? "f32 " : "",
             (dtypes & AF_SUPPORTS_F16) ? "f16 " : "", (dtypes & AF_SUPPORTS_BF16) ? "bf16 " : "",
             (dtypes & AF_SUPPORTS_FP8_E4M3) ? "fp8-e4m3 " : "");
  }
  return 1;
}

// ---- host-side support checks ------------------------------------------------------------------------

// ---- score variants (docs/semantics.md "Variants"; issue 28) ---------------------------------------------
// The fp32 buffers a problem's variants read (NULL where unused). A kernel declares the ones it applies in
// af_kernel::variants; these helpers are the one definition the built-in kernels share.
struct VariantBufs {
  const float* sinks;
  const float* slopes;
  const float* bias;
  uint8_t* dropout_mask;       // AF_DROPOUT_RNG_EXPORTED: where the keep mask goes (dropout_mask_stride)
  const uint8_t* custom_mask;  // custom masks (docs/semantics.md "Custom masks"): attnfuzz/custom_mask.h
  const uint8_t* block_mask;
  const float* q_descale_h;  // AF_VARIANT_HEAD_DESCALE (fp8): per-head descales with descale_stride
  const float* k_descale_h;
  const float* v_descale_h;
};
inline VariantBufs variant_bufs(const af_buffers& b) {
  return VariantBufs{b.sinks,       b.alibi_slopes, b.bias,        b.dropout_mask, b.custom_mask,
                     b.block_mask,  b.q_descale_h,  b.k_descale_h, b.v_descale_h};
}
// Per-head fp8 descales (AF_VARIANT_HEAD_DESCALE): they replace q/k/v_descale; q's of query head h, k's and v's of
// its KV head hk (kv_head_of), at b * descale_stride[0] + head * descale_stride[1]. Without the variant (or for a
// dtype other than fp8) these are score_scale<T>(p) and store_o<T>(p, o).
__host__ __device__ inline bool head_descale(const af_problem& p) {
  return (p.variants & AF_VARIANT_HEAD_DESCALE) != 0;
}
__host__ __device__ inline float descale_at(const af_problem& p, const float* d, int64_t b, int64_t head) {
  return d[b * p.descale_stride[0] + head * p.descale_stride[1]];
}
template <class T>
__host__ __device__ inline float score_scale(const af_problem& p, const VariantBufs& v, int64_t b, int64_t h,
                                             int64_t hk) {
  if (!Elem<T>::kFp8 || !head_descale(p)) return score_scale<T>(p);
  return p.scale * descale_at(p, v.q_descale_h, b, h) * descale_at(p, v.k_descale_h, b, hk);
}
template <class T>
__host__ __device__ inline T store_o(const af_problem& p, const VariantBufs& v, int64_t b, int64_t hk, float o) {
  if (!Elem<T>::kFp8 || !head_descale(p)) return store_o<T>(p, o);
  return Elem<T>::store(o * descale_at(p, v.v_descale_h, b, hk) * p.o_scale);
}
// Key j of row (b, h, i) is kept by the problem's custom / block mask (always without one); the mask_kind interval
// is the caller's (row_keys).
__host__ __device__ inline bool mask_keeps(const af_problem& p, const VariantBufs& v, int64_t b, int64_t h, int64_t i,
                                           int64_t j) {
  return af_custom_visible(&p, v.custom_mask, v.block_mask, b, h, i, j) != 0;
}

// The final score of a visible pair (b, h, i, j) from s = scale q.k: softcap (dcap <- d s_capped / d s =
// 1 - tanh^2, when asked), then the bias and the ALiBi term -slope_h |j - (i + off)|, off of the mask alignment for
// a sequence of sq queries and sk keys (a sequence layout aligns per sequence: seq_shape's sq, sk).
__host__ __device__ inline float variant_score_in(const af_problem& p, const VariantBufs& v, int64_t b, int64_t h,
                                                  int64_t i, int64_t j, float s, int64_t sq, int64_t sk,
                                                  float* dcap = nullptr) {
  if (dcap) *dcap = 1.0f;
  if (!p.variants) return s;
  if (p.variants & AF_VARIANT_SOFTCAP) {
    const float t = tanhf(s / p.softcap);
    s = p.softcap * t;
    if (dcap) *dcap = 1.0f - t * t;
  }
  if (p.variants & AF_VARIANT_BIAS)
    s += v.bias[b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]];
  if (p.variants & AF_VARIANT_ALIBI) {
    const int64_t off = p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? sk - sq : 0;
    const int64_t dist = j - (i + off);
    s -= v.slopes[h] * (float)(dist < 0 ? -dist : dist);
  }
  return s;
}
// The dense problem: every sequence has seq_q queries and seq_k keys.
__host__ __device__ inline float variant_score(const af_problem& p, const VariantBufs& v, int64_t b, int64_t h,
                                               int64_t i, int64_t j, float s, float* dcap = nullptr) {
  return variant_score_in(p, v, b, h, i, j, s, p.seq_q, p.seq_k, dcap);
}
// The sink logit of query head h, -inf without one.
__host__ __device__ inline float variant_sink(const af_problem& p, const VariantBufs& v, int64_t h) {
  return (p.variants & AF_VARIANT_SINK) ? v.sinks[h] : neg_inf();
}
// Folds a sink into a finished online-softmax state (m, l): the sink is one more term exp(sink - m) of l with no
// value vector; returns the factor the accumulators are multiplied by (1 without a sink).
__host__ __device__ inline float fold_sink(float sink, float& m, float& l) {
  if (sink == neg_inf()) return 1.0f;
  const float m_new = nan_max(m, sink);
  const float alpha = m_new == neg_inf() ? 1.0f : expf(m - m_new);
  l = l * alpha + expf(sink - m_new);
  m = m_new;
  return alpha;
}
// The score variants the built-in flash family applies.
constexpr uint32_t kScoreVariants = AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_BIAS;
// The custom masks the flash family applies (dense, bit-packed, block-sparse).
constexpr uint32_t kMaskVariants = AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS | AF_VARIANT_BLOCK_SPARSE;

// ---- dropout (docs/semantics.md "Dropout"): keep decisions from attnfuzz/philox.h, FlashAttention's layout ----
constexpr uint32_t kDropoutRngs = (1u << AF_DROPOUT_RNG_EXPORTED) | (1u << AF_DROPOUT_RNG_PHILOX_FLASH);
__host__ __device__ inline bool has_dropout(const af_problem& p) { return (p.variants & AF_VARIANT_DROPOUT) != 0; }
// 1 / (1 - p) in fp32 (1 without dropout).
__host__ __device__ inline float dropout_scale(const af_problem& p) {
  return has_dropout(p) ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
}
// The keep decision of visible weight (b, h, i, j), written to the exported mask when the problem asks for it.
__host__ __device__ inline bool dropout_keep(const af_problem& p, const VariantBufs& v, int64_t b, int64_t h, int64_t i,
                                             int64_t j) {
  const bool keep =
      attnfuzz::flash_dropout_keep(p.dropout_seed, p.dropout_offset, p.dropout_p, b, h, p.heads_q, i, j) != 0;
  if (v.dropout_mask && p.dropout_rng == AF_DROPOUT_RNG_EXPORTED)
    v.dropout_mask[b * p.dropout_mask_stride[0] + h * p.dropout_mask_stride[1] + i * p.dropout_mask_stride[2] + j] =
        keep ? 1 : 0;
  return keep;
}

// Writes a reason into why (may be NULL) and returns 1.
inline int unsupported(char* why, size_t why_len, const char* reason) {
  if (why && why_len) snprintf(why, why_len, "%s", reason);
  return 1;
}

// Whether a launch grid fits every backend (x * threads <= 2^31 - 1, y and z <= 65535).
inline bool grid_fits(int64_t x, int64_t y, int64_t z, int64_t threads) {
  return x >= 1 && x * threads <= INT32_MAX && y >= 1 && y <= 65535 && z >= 1 && z <= 65535;
}

}  // namespace
