// lowp_bugs.hip - planted low-precision bugs: online-row (one block per query row) computing on f16, bf16 or fp8
// inputs, each with one of the mistakes half-precision kernels make.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kThreads = 64;  // threads per block
constexpr int kMaxDv = 256;   // thread t owns o[d] for d = t, t + kThreads, ...
constexpr int kAcc = kMaxDv / kThreads;

enum Bug {
  kExpNoMaxSub,     // f16: p = fp16(exp(s)), no max subtracted
  kSumHalf,         // f16: the row sum l accumulated in fp16
  kAccHalf,         // f16: the output accumulator O accumulated in fp16
  kScaleAfterCast,  // f16: the unscaled q.k cast to fp16, then scaled
  kPEarlyMax,       // bf16: p rounded to bf16 relative to the running max before it includes the key
  kDescaleTwice,    // fp8-e4m3: q_descale * k_descale applied twice
  kAccStoreHalf,    // f16: the un-normalised accumulator rounded to fp16 before the division by l (issue 25)
  kScoreHalf,       // bf16: the score rounded to bf16 before the softmax, in a kernel that declares fused (issue 25)
};

// The correct kernel is online-row (kernels/online_row.hip) templated on the element type: fp32 dot products,
// softmax state and accumulators, the weight rounded to T for P.V only, O rounded to T once. Each bug below is
// marked PLANTED and changes one step.
template <int kBug, class T>
__global__ void __launch_bounds__(kThreads)
    lowp_bug_kernel(af_problem p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    T* __restrict__ o, float* __restrict__ lse) {
  __shared__ float partial[kThreads];
  __shared__ float coef[2];
  __shared__ float final_[2];
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = kv_head_of(p, h);
  const T* qr = q + q_row(p, b, i, h);
  const KeySpan keys = row_keys(p, i);

  float m = neg_inf(), l = 0.0f;
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;

  for (int64_t j = keys.first; j < keys.last; ++j) {
    const T* kr = k + k_row(p, b, j, hk);
    float part = 0.0f;
    for (int64_t d = t; d < p.head_dim; d += kThreads) part += Elem<T>::load(qr[d]) * Elem<T>::load(kr[d]);
    partial[t] = part;
    __syncthreads();
    if (t == 0) {
      float dot = 0.0f;
      for (int c = 0; c < kThreads; ++c) dot += partial[c];
      float s = score_scale<T>(p) * dot;
      // PLANTED: scale-after-cast - the unscaled q.k is cast to fp16 before the scale: |q.k| > 65504 becomes
      // inf although scale * q.k fits (quiet while |q.k| < 65504: one extra fp16 rounding of the score).
      if (kBug == kScaleAfterCast) s = score_scale<T>(p) * Elem<__half>::round(dot);
      // PLANTED: descale-twice - q_descale * k_descale folded into the scale and applied again (quiet when
      // q_descale * k_descale == 1).
      if (kBug == kDescaleTwice) s = score_scale<T>(p) * dot * (p.q_descale * p.k_descale);
      // PLANTED: score-half - the score rounded to bf16 before the max and the exponent (an unfused kernel's step
      // in one that keeps the rest in fp32): at |s| ~ 1e3 the rounding error 2^-9 |s| ~ 2 moves weights by e^2
      // (quiet while |s| is small: then it is one bf16 rounding of a weight's exponent).
      if (kBug == kScoreHalf) s = Elem<__hip_bfloat16>::round(s);
      float alpha, beta;
      if (kBug == kExpNoMaxSub) {
        // PLANTED: exp-no-max-sub - p = fp16(exp(s)) with no max subtracted: exp(s) > 65504 (s > 11.09)
        // overflows to inf in fp16 (quiet while every score stays below 11).
        alpha = 1.0f;
        beta = Elem<__half>::round(expf(s));
        m = 0.0f;  // "no max": only marks the row as having a key
      } else if (kBug == kPEarlyMax) {
        // PLANTED: p-early-max - the weight is rounded to bf16 relative to the running max before it
        // includes s, then rescaled: exp(s - m_old) overflows when s exceeds the old max by more than 88.7
        // (quiet while the max never jumps that far).
        const float m_new = nan_max(m, s);
        alpha = rescale_factor(m, m_new);
        const float ref = m == neg_inf() ? s : m;
        beta = Elem<__hip_bfloat16>::round(softmax_weight(s, ref)) * rescale_factor(ref, m_new);
        m = m_new;
      } else {
        const float m_new = nan_max(m, s);
        alpha = rescale_factor(m, m_new);
        beta = softmax_weight(s, m_new);
        m = m_new;
      }
      l = l * alpha + beta;
      // PLANTED: sum-half - the row sum l is kept in fp16: once l is large, adding a weight below half its
      // ulp changes nothing, and the error grows with Sk (quiet for short rows).
      if (kBug == kSumHalf) l = Elem<__half>::round(l);
      coef[0] = alpha;
      coef[1] = Elem<T>::round(beta);
    }
    __syncthreads();
    const float alpha = coef[0], beta = coef[1];
    const T* vr = v + v_row(p, b, j, hk);
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = t + e * kThreads;
      if (d < p.head_dim_v) {
        acc[e] = acc[e] * alpha + beta * Elem<T>::load(vr[d]);
        // PLANTED: acc-half - the output accumulator is kept in fp16: with |O| large against a key's
        // contribution the small terms are lost, an error that grows with Sk (quiet for short rows).
        if (kBug == kAccHalf) acc[e] = Elem<__half>::round(acc[e]);
      }
    }
  }

  if (t == 0) {
    final_[0] = m;
    final_[1] = l;
  }
  __syncthreads();
  m = final_[0];
  l = final_[1];
  T* orow = o + o_row(p, b, i, h);
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int64_t d = t + e * kThreads;
    // PLANTED: acc-store-half - the un-normalised accumulator passes through fp16 (an fp16 workspace, or a cast
    // before the division): with near-uniform weights and one-signed v, |sum p v| passes 65504 before it is
    // divided by l (quiet while |sum p v| < 65504: one more fp16 rounding of O).
    const float a = kBug == kAccStoreHalf ? Elem<__half>::round(acc[e]) : acc[e];
    if (d < p.head_dim_v) orow[d] = store_o<T>(p, finish_o(a, m, l));
  }
  if (lse && t == 0) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

template <int kBug, class T>
constexpr uint32_t dtype_bit() {
  return Elem<T>::kFp8 ? AF_SUPPORTS_FP8_E4M3
                       : sizeof(T) == 4 ? AF_SUPPORTS_F32
                                        : kBug == kPEarlyMax || kBug == kScoreHalf ? AF_SUPPORTS_BF16
                                                                                   : AF_SUPPORTS_F16;
}

template <int kBug, class T>
int lowp_bug_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, dtype_bit<kBug, T>(), why, why_len)) return 1;
  if (p->head_dim_v > kMaxDv) return unsupported(why, why_len, "online-row supports Dv <= 256");
  if (!grid_fits(p->seq_q, p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "online-row grid (Sq, Hq, B) exceeds the launch limits");
  return 0;
}

template <int kBug, class T>
int lowp_bug_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (lowp_bug_check<kBug, T>(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  void (*kernel)(af_problem, const T*, const T*, const T*, T*, float*) = lowp_bug_kernel<kBug, T>;
  hipLaunchKernelGGL(kernel, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch), dim3(kThreads), 0,
                     (hipStream_t)stream, p, static_cast<const T*>(buf->q), static_cast<const T*>(buf->k),
                     static_cast<const T*>(buf->v), static_cast<T*>(buf->o), buf->lse);
  return (int)hipGetLastError();
}

#define AF_LOWP_BUG(NAME, BUG, T, DESC)                                                                     \
  {                                                                                                         \
    NAME, "planted/lowp", DESC, dtype_bit<BUG, T>(), AF_SUPPORTS_ALL_MASKS, /*max_head_dim=*/0, kMaxDv,     \
        /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr, lowp_bug_check<BUG, T>, lowp_bug_launch<BUG, T> \
  }

const af_kernel kLowpBugs[] = {
    AF_LOWP_BUG("planted-f16-exp-no-max-sub", kExpNoMaxSub, __half,
                "online-row f16: p = fp16(exp(s)) without subtracting the row max (overflows for s > 11)"),
    AF_LOWP_BUG("planted-f16-sum-half", kSumHalf, __half, "online-row f16: the row sum l accumulated in fp16"),
    AF_LOWP_BUG("planted-f16-acc-half", kAccHalf, __half,
                "online-row f16: the output accumulator accumulated in fp16 (drifts with Sk)"),
    AF_LOWP_BUG("planted-f16-scale-after-cast", kScaleAfterCast, __half,
                "online-row f16: q.k cast to fp16 before the scale (overflows for |q.k| > 65504)"),
    AF_LOWP_BUG("planted-bf16-p-early-max", kPEarlyMax, __hip_bfloat16,
                "online-row bf16: p rounded to bf16 relative to the running max before it includes the key"),
    AF_LOWP_BUG("planted-fp8-descale-twice", kDescaleTwice, af_fp8_e4m3,
                "online-row fp8-e4m3: q_descale * k_descale applied twice to the scores"),
    AF_LOWP_BUG("planted-f16-acc-store-half", kAccStoreHalf, __half,
                "online-row f16: the un-normalised accumulator rounded to fp16 before the division by l"),
    AF_LOWP_BUG("planted-bf16-score-half", kScoreHalf, __hip_bfloat16,
                "online-row bf16 (declared fused): the score rounded to bf16 before the softmax"),
};
static_assert(sizeof(kLowpBugs) / sizeof(kLowpBugs[0]) == attnfuzz_planted::kLowpBugCount,
              "planted.h's count matches the table");

#undef AF_LOWP_BUG

}  // namespace

namespace attnfuzz_planted {
const af_kernel* lowp_bugs() { return kLowpBugs; }
}  // namespace attnfuzz_planted
