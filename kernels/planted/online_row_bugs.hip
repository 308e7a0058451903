// online_row_bugs.hip - planted bugs in kernels/online_row.hip: a barrier race and a NaN masked row.
//
// One copy of online_row_kernel, templated on the bug it carries; every deviation from kernels/online_row.hip
// sits behind `if constexpr (kBug == ...)` and is marked `// PLANTED:`. See kernels/planted/README.md.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kThreads = 64;  // threads per block
constexpr int kMaxDv = 256;   // thread t owns o[d] for d = t, t + kThreads, ... (registers)
constexpr int kAcc = kMaxDv / kThreads;

enum class OnlineRowBug {
  kNone,
  kNoScoreBarrier,  // no barrier between thread 0's broadcast of (alpha, beta) and the other threads' use
  kMaskedRowNan,    // a fully masked row computes 0 / 0
};

// kernels/online_row.hip's kernel (see there for the two barriers per key) with one planted bug.
template <OnlineRowBug kBug>
__global__ void __launch_bounds__(kThreads)
    planted_online_row_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k,
                              const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  __shared__ float partial[kThreads];
  __shared__ float coef[2];    // alpha, beta of the current key
  __shared__ float final_[2];  // m, l after the last key
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = kv_head_of(p, h);
  const float* qr = q + q_row(p, b, i, h);
  const KeySpan keys = row_keys(p, i);

  float m = neg_inf(), l = 0.0f;  // meaningful in thread 0
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;

  for (int64_t j = keys.first; j < keys.last; ++j) {
    const float* kr = k + k_row(p, b, j, hk);
    float part = 0.0f;
    for (int64_t d = t; d < p.head_dim; d += kThreads) part += qr[d] * kr[d];
    partial[t] = part;
    __syncthreads();
    if (t == 0) {
      float dot = 0.0f;
      for (int c = 0; c < kThreads; ++c) dot += partial[c];
      const float s = p.scale * dot;
      const float m_new = nan_max(m, s);
      const float alpha = rescale_factor(m, m_new), beta = softmax_weight(s, m_new);
      l = l * alpha + beta;
      m = m_new;
      coef[0] = alpha;
      coef[1] = beta;
    }
    // PLANTED: no-score-barrier: the barrier that publishes thread 0's (alpha, beta) before the other
    // threads read them is gone. A thread scheduled before thread 0 reads the previous key's coefficients,
    // and its next partial[] write can land before thread 0 has summed this key's partials. In lock-step
    // (one wavefront, or the emulator's forward order) thread 0 happens to run first and the result is
    // right; under any other schedule it is wrong.
    if constexpr (kBug != OnlineRowBug::kNoScoreBarrier) __syncthreads();
    const float alpha = coef[0], beta = coef[1];
    const float* vr = v + v_row(p, b, j, hk);
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = t + e * kThreads;
      if (d < p.head_dim_v) acc[e] = acc[e] * alpha + beta * vr[d];
    }
  }

  if (t == 0) {
    final_[0] = m;
    final_[1] = l;
  }
  __syncthreads();
  m = final_[0];
  l = final_[1];
  float* orow = o + o_row(p, b, i, h);
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int64_t d = t + e * kThreads;
    if (d >= p.head_dim_v) continue;
    if constexpr (kBug == OnlineRowBug::kMaskedRowNan) {
      // PLANTED: masked-row-nan: O = acc / l without the fully-masked-row case of finish_o(); a row with
      // no visible key (or only -inf scores) has acc = 0 and l = 0 and writes 0 / 0 = NaN instead of 0.
      orow[d] = acc[e] / l;
    } else {
      orow[d] = finish_o(acc[e], m, l);
    }
  }
  if (lse && t == 0) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

int planted_online_row_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "online-row supports f32 only");
  if (p->head_dim_v > kMaxDv) return unsupported(why, why_len, "online-row supports Dv <= 256");
  if (!grid_fits(p->seq_q, p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "online-row grid (Sq, Hq, B) exceeds the launch limits");
  return 0;
}

template <OnlineRowBug kBug>
int planted_online_row_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (planted_online_row_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  void (*kernel)(af_problem, const float*, const float*, const float*, float*, float*) =
      planted_online_row_kernel<kBug>;
  hipLaunchKernelGGL(kernel, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch), dim3(kThreads),
                     0, (hipStream_t)stream, p, static_cast<const float*>(buf->q),
                     static_cast<const float*>(buf->k), static_cast<const float*>(buf->v),
                     static_cast<float*>(buf->o), buf->lse);
  return (int)hipGetLastError();
}

const af_kernel kOnlineRowBugs[] = {
    {"planted-no-score-barrier", "planted/online-row",
     "online-row with a planted bug: no barrier between the (alpha, beta) broadcast and its use",
     AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, /*max_head_dim=*/0, /*max_head_dim_v=*/kMaxDv, /*writes_lse=*/1,
     /*needs_dv_eq_d=*/0, nullptr, planted_online_row_check,
     planted_online_row_launch<OnlineRowBug::kNoScoreBarrier>},
    {"planted-masked-row-nan", "planted/online-row",
     "online-row with a planted bug: a fully masked row writes 0 / 0 = NaN instead of 0", AF_SUPPORTS_F32,
     AF_SUPPORTS_ALL_MASKS, /*max_head_dim=*/0, /*max_head_dim_v=*/kMaxDv, /*writes_lse=*/1,
     /*needs_dv_eq_d=*/0, nullptr, planted_online_row_check,
     planted_online_row_launch<OnlineRowBug::kMaskedRowNan>},
};
static_assert(sizeof(kOnlineRowBugs) / sizeof(kOnlineRowBugs[0]) == attnfuzz_planted::kOnlineRowBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::online_row_bugs() { return kOnlineRowBugs; }
