// detector_kernels.hip - a test plug-in of small hand-made kernels, one per failure class, for the detector unit tests.
//
// One kernel, templated on the bug it carries: a block per (query row, head, batch), thread 0 scores one key
// at a time and publishes (alpha, beta) through shared memory, every thread updates its accumulators. With
// Bug::kNone it is a correct kernel (the detectors must leave it alone).
#include "kernels/common.h"

namespace {

constexpr int kThreads = 32;
constexpr int kMaxDv = 128;
constexpr int kAcc = kMaxDv / kThreads;

enum class Bug {
  kNone,
  kNoRescale,     // rescale: acc and l not moved onto a new max
  kIgnoreMask,    // mask: every key is visible
  kReadPastEnd,   // oob-read: a row that sees the last key also reads key Sk
  kWritePastEnd,  // oob-write: the last row also writes the element after it
  kNoBarrier,     // barrier-race: (alpha, beta) read without the barrier after thread 0 writes them
  kMaskedRowNaN,  // mask: a fully masked row writes 0 / 0
  kNoMaxSub,      // non-finite at extreme logits: weights exp(s) instead of exp(s - m)
  kSloppy,        // precision: O off by a relative 1e-3 (err/bound ~10-100)
  kBrSignFlip,    // mask: bottom-right offset taken as Sq - Sk (sign flipped): with Sk > Sq the first rows see nothing
  kAlwaysBr,      // mask: bottom-right alignment used also for top-left: with Sq > Sk the first rows see nothing
  kAlwaysBrNaN,   // mask: kAlwaysBr in a kernel without an empty-row guard: the rows it finds empty are 0 / 0
  kFarOff,        // wrong: O off by a relative 10 % (far beyond the bound, no signature)
  kBigNegMask,    // empty-row, as jax's xla: every key scored, a masked one -0.7 FLT_MAX (weight 0, but 0 x v is
                  // taken: 0 x NaN leaks); a row without keys averages V
  kTailLastKey,   // tail: with Sk % 16 != 0 the last key enters l but not the output (a partial last key tile)
  kDropLastTile,  // mask (keys): a row's keys in tiles of 16 from its first; a last partial tile never loaded
  kScaleDefault,  // ignored-parameter (scale): 1/sqrt(D) whatever problem.scale says
  kExp2NoLog2e,   // precision / wrong (scale): an exp2 softmax whose scores miss the log2 e factor (scale ln 2)
};

template <Bug kBug>
__global__ void __launch_bounds__(kThreads)
    row_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
               float* __restrict__ o, float* __restrict__ lse, VariantBufs vb) {
  __shared__ float coef[2];
  __shared__ float state[2];
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = kv_head_of(p, h);
  KeySpan keys = row_keys(p, i);
  if constexpr (kBug == Bug::kIgnoreMask) keys = {0, p.seq_k};
  if constexpr (kBug == Bug::kBrSignFlip || kBug == Bug::kAlwaysBr || kBug == Bug::kAlwaysBrNaN) {
    if (p.mask_kind == AF_MASK_CAUSAL) {
      const bool br = kBug == Bug::kAlwaysBr || kBug == Bug::kAlwaysBrNaN || p.mask_align == AF_ALIGN_BOTTOM_RIGHT;
      const int64_t off = !br ? 0 : kBug == Bug::kBrSignFlip ? p.seq_q - p.seq_k : p.seq_k - p.seq_q;
      keys = {0, min64(p.seq_k, max64(0, i + off + 1))};
    }
  }
  if constexpr (kBug == Bug::kDropLastTile)
    if (keys.last - keys.first > 16) keys.last = keys.first + (keys.last - keys.first) / 16 * 16;
  if constexpr (kBug == Bug::kReadPastEnd)
    if (keys.last == p.seq_k && keys.first < keys.last) keys.last = p.seq_k + 1;
  const KeySpan visible = keys;
  if constexpr (kBug == Bug::kBigNegMask) keys = {0, p.seq_k};
  const float* qr = q + q_row(p, b, i, h);
  float m = neg_inf(), l = 0.0f;
  float acc[kAcc];
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  for (int64_t j = keys.first; j < keys.last; ++j) {
    if (j < p.seq_k && !mask_keeps(p, vb, b, h, i, j)) continue;  // the custom / block masks (uniform per block)
    if (t == 0) {
      const float* kr = k + k_row(p, b, j, hk);
      float dot = 0.0f;
      for (int64_t d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
      float s = p.scale * dot;
      if constexpr (kBug == Bug::kScaleDefault) s = dot / sqrtf(static_cast<float>(p.head_dim));
      if constexpr (kBug == Bug::kExp2NoLog2e) s = p.scale * dot * 0.693147182f;
      if constexpr (kBug == Bug::kBigNegMask)
        if (j < visible.first || j >= visible.last) s = -0.7f * 3.402823466e38f;
      const float m_new = nan_max(m, s);
      float alpha = rescale_factor(m, m_new), beta = softmax_weight(s, m_new);
      if constexpr (kBug == Bug::kNoRescale) alpha = 1.0f;
      if constexpr (kBug == Bug::kNoMaxSub) {
        alpha = 1.0f;
        beta = s == neg_inf() ? 0.0f : expf(s);
      }
      l = l * alpha + beta;
      m = m_new;
      coef[0] = alpha;
      coef[1] = beta;
    }
    if constexpr (kBug != Bug::kNoBarrier) __syncthreads();
    const float alpha = coef[0];
    float beta = coef[1];
    if constexpr (kBug == Bug::kTailLastKey)
      if (p.seq_k % 16 != 0 && j == p.seq_k - 1) beta = 0.0f;
    const float* vr = v + v_row(p, b, j, hk);
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = t + e * kThreads;
      if (d < p.head_dim_v) acc[e] = acc[e] * alpha + beta * vr[d];
    }
    __syncthreads();
  }
  if (t == 0) {
    state[0] = m;
    state[1] = l;
  }
  __syncthreads();
  m = state[0];
  l = state[1];
  float* orow = o + o_row(p, b, i, h);
  for (int e = 0; e < kAcc; ++e) {
    const int64_t d = t + e * kThreads;
    if (d >= p.head_dim_v) continue;
    float x = finish_o(acc[e], m, l);
    if constexpr (kBug == Bug::kMaskedRowNaN || kBug == Bug::kAlwaysBrNaN) x = acc[e] / l;
    if constexpr (kBug == Bug::kSloppy) x *= 1.001f;
    if constexpr (kBug == Bug::kFarOff) x *= 1.1f;
    orow[d] = x;
  }
  if constexpr (kBug == Bug::kWritePastEnd)
    if (t == 0 && i == p.seq_q - 1 && b == p.batch - 1 && h == p.heads_q - 1) orow[p.head_dim_v] = 0.0f;
  if (lse && t == 0) lse[lse_at(p, b, h, i)] = kBug == Bug::kNoMaxSub ? logf(l) : finish_lse(m, l);
}

int row_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "f32 only");
  if (p->head_dim_v > kMaxDv) return unsupported(why, why_len, "Dv <= 128");
  if (!grid_fits(p->seq_q, p->heads_q, p->batch, kThreads)) return unsupported(why, why_len, "grid too large");
  return 0;
}

template <Bug kBug>
int row_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (row_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  void (*kernel)(af_problem, const float*, const float*, const float*, float*, float*, VariantBufs) = row_kernel<kBug>;
  hipLaunchKernelGGL(kernel, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch), dim3(kThreads), 0,
                     (hipStream_t)stream, p, static_cast<const float*>(buf->q), static_cast<const float*>(buf->k),
                     static_cast<const float*>(buf->v), static_cast<float*>(buf->o), buf->lse, variant_bufs(*buf));
  return (int)hipGetLastError();
}

// Every detector kernel applies the custom masks (dense, bits, block-sparse) on top of its mask_kind keys.
#define AF_DETECTOR_KERNEL(name, bug, what)                                                                 \
  {                                                                                                         \
    name, "test/detector", what, AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, 0, kMaxDv, 1, 0, nullptr, row_check, \
        row_launch<Bug::bug>, /*features=*/0, 0, nullptr, nullptr, nullptr, /*compute_model=*/0, /*kind=*/0,  \
        /*flags=*/0,                                                                                        \
        /*variants=*/AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS | AF_VARIANT_BLOCK_SPARSE                 \
  }

const af_kernel kDetectorKernels[] = {
    AF_DETECTOR_KERNEL("det-correct", kNone, "correct row kernel"),
    AF_DETECTOR_KERNEL("det-no-rescale", kNoRescale, "acc and l not rescaled"),
    AF_DETECTOR_KERNEL("det-ignore-mask", kIgnoreMask, "every key visible"),
    AF_DETECTOR_KERNEL("det-read-past-end", kReadPastEnd, "reads key Sk"),
    AF_DETECTOR_KERNEL("det-write-past-end", kWritePastEnd, "writes one element past o"),
    AF_DETECTOR_KERNEL("det-no-barrier", kNoBarrier, "coefficients read without a barrier"),
    AF_DETECTOR_KERNEL("det-masked-row-nan", kMaskedRowNaN, "fully masked row = 0 / 0"),
    AF_DETECTOR_KERNEL("det-no-max-sub", kNoMaxSub, "exp(s) without max subtraction"),
    AF_DETECTOR_KERNEL("det-sloppy", kSloppy, "O off by 1e-3 relative"),
    AF_DETECTOR_KERNEL("det-br-sign-flip", kBrSignFlip, "bottom-right offset Sq - Sk"),
    AF_DETECTOR_KERNEL("det-always-br", kAlwaysBr, "bottom-right alignment also for top-left"),
    AF_DETECTOR_KERNEL("det-always-br-nan", kAlwaysBrNaN, "det-always-br, rows found empty = 0 / 0"),
    AF_DETECTOR_KERNEL("det-far-off", kFarOff, "O off by 10 % relative"),
    AF_DETECTOR_KERNEL("det-big-neg-mask", kBigNegMask, "masked scores -0.7 FLT_MAX over every key (jax xla)"),
    AF_DETECTOR_KERNEL("det-tail-last-key", kTailLastKey, "Sk % 16 != 0: the last key not in the output"),
    AF_DETECTOR_KERNEL("det-drop-last-tile", kDropLastTile, "a row's last partial 16-key tile never loaded"),
    AF_DETECTOR_KERNEL("det-scale-default", kScaleDefault, "1/sqrt(D) whatever the given scale"),
    AF_DETECTOR_KERNEL("det-exp2-no-log2e", kExp2NoLog2e, "exp2 softmax without the log2 e factor"),
};

}  // namespace

AF_DEFINE_PLUGIN("attn-fuzz detector test kernels", kDetectorKernels)
