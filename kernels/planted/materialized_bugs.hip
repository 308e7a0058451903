// materialized_bugs.hip - planted bugs in the softmax dispatch of kernels/materialized.hip.
//
// Dispatches 1 (scores) and 3 (P.V) are copied unchanged; the softmax dispatch is templated on the bug it
// carries, every deviation behind `if constexpr (kBug == ...)` and marked `// PLANTED:`. See
// kernels/planted/README.md.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kElemThreads = 256;  // dispatches 1 and 3: one thread per element, grid-stride loops
constexpr int kRowThreads = 64;    // dispatch 2: one block per row; a power of two (tree reduction)
constexpr int64_t kMaxBlocks = 1 << 16;

enum class SoftmaxBug {
  kNone,
  kSharedReuseRace,   // the seed 000 bug: red[] reused for the sum before every thread has read the max
  kNoMaxSubtraction,  // exp(s) instead of exp(s - max)
};

// Workspace: scores [B, Hq, Sq, Sk], probabilities [B, Hq, Sq, Sk], row LSE [B, Hq, Sq] (all fp32).
__host__ __device__ inline int64_t matrix_elements(const af_problem& p) {
  return p.batch * p.heads_q * p.seq_q * p.seq_k;
}
__host__ __device__ inline int64_t row_count(const af_problem& p) { return p.batch * p.heads_q * p.seq_q; }

// Dispatch 1 (unchanged): S_ij = scale * q_i . k_j for every visible (i, j).
__global__ void __launch_bounds__(kElemThreads)
    scores_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k, float* scores) {
  const int64_t total = matrix_elements(p);
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = idx % p.seq_k;
    int64_t r = idx / p.seq_k;
    const int64_t i = r % p.seq_q;
    r /= p.seq_q;
    const int64_t h = r % p.heads_q, b = r / p.heads_q;
    const KeySpan keys = row_keys(p, i);
    if (j < keys.first || j >= keys.last) continue;
    const float* qr = q + q_row(p, b, i, h);
    const float* kr = k + k_row(p, b, j, kv_head_of(p, h));
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
    scores[idx] = p.scale * dot;
  }
}

// Dispatch 2 with one planted bug: one block per row: m = max, l = sum exp(s - m), P = exp(s - m) / l.
template <SoftmaxBug kBug>
__global__ void __launch_bounds__(kRowThreads)
    planted_softmax_kernel(af_problem p, const float* __restrict__ scores, float* probs, float* row_lse) {
  __shared__ float red[kRowThreads];
  const int t = threadIdx.x;
  const int64_t rows = row_count(p);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // uniform per block
    const KeySpan keys = row_keys(p, row % p.seq_q);
    const float* s = scores + row * p.seq_k;
    float* pr = probs + row * p.seq_k;

    float m = neg_inf();
    for (int64_t j = keys.first + t; j < keys.last; j += kRowThreads) m = nan_max(m, s[j]);
    red[t] = m;
    __syncthreads();
    for (int w = kRowThreads / 2; w > 0; w /= 2) {
      if (t < w) red[t] = nan_max(red[t], red[t + w]);
      __syncthreads();
    }
    m = red[0];
    // PLANTED: smem-reuse-race (seed 000's bug, which seed 000 fixed): no barrier between every thread's
    // read of the max in red[0] and the reuse of red[] for the sum below. Thread 0 writes its partial sum
    // into red[0]; a thread that reads red[0] after that takes the partial sum for the max. Right when
    // thread 0 happens to write last (one wavefront in lock-step; the emulator's reverse order), wrong
    // otherwise (two warps on NVIDIA; the emulator's forward order).
    if constexpr (kBug != SoftmaxBug::kSharedReuseRace) __syncthreads();

    // PLANTED: no-max-sub: the weights are exp(s) instead of exp(s - m) (the max is still found, but
    // only to recognise a fully masked row). Exact in exact arithmetic; exp overflows to inf once a score
    // passes ~88 (and underflows to 0 below ~-103), giving inf / inf or 0 / 0 = NaN.
    constexpr bool kNoMax = kBug == SoftmaxBug::kNoMaxSubtraction;
    const float m_ref = kNoMax ? 0.0f : m;  // the value subtracted from every score
    float l = 0.0f;
    for (int64_t j = keys.first + t; j < keys.last; j += kRowThreads) {
      const float e = softmax_weight(s[j], m_ref);
      pr[j] = e;
      l += e;
    }
    red[t] = l;
    __syncthreads();
    for (int w = kRowThreads / 2; w > 0; w /= 2) {
      if (t < w) red[t] += red[t + w];
      __syncthreads();
    }
    l = red[0];
    __syncthreads();  // before the next row reuses red

    if (m != neg_inf())
      for (int64_t j = keys.first + t; j < keys.last; j += kRowThreads) pr[j] = pr[j] / l;  // own entries
    if (t == 0) row_lse[row] = kNoMax ? (m == neg_inf() ? neg_inf() : logf(l)) : finish_lse(m, l);
  }
}

// Dispatch 3 (unchanged): O_id = sum over visible j of P_ij v_jd (0 for a fully masked row); LSE copied out.
__global__ void __launch_bounds__(kElemThreads)
    pv_kernel(af_problem p, const float* __restrict__ probs, const float* __restrict__ row_lse,
              const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  const int64_t total = row_count(p) * p.head_dim_v;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t d = idx % p.head_dim_v;
    int64_t r = idx / p.head_dim_v;  // output order [B, Sq, Hq]
    const int64_t h = r % p.heads_q;
    r /= p.heads_q;
    const int64_t i = r % p.seq_q, b = r / p.seq_q;
    const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
    const float row_l = row_lse[row];
    float acc = 0.0f;
    if (row_l != neg_inf()) {
      const KeySpan keys = row_keys(p, i);
      const float* pr = probs + row * p.seq_k;
      const float* vc = v + v_row(p, b, 0, kv_head_of(p, h)) + d;
      for (int64_t j = keys.first; j < keys.last; ++j) acc += pr[j] * vc[j * p.v_stride[1]];
    }
    o[o_row(p, b, i, h) + d] = acc;
    if (lse && d == 0) lse[lse_at(p, b, h, i)] = row_l;
  }
}

size_t planted_materialized_workspace(const af_problem* p) {
  return (size_t)(2 * matrix_elements(*p) + row_count(*p)) * sizeof(float);
}

int planted_materialized_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "materialized supports f32 only");
  return 0;
}

int64_t grid_for(int64_t total, int64_t threads) {
  return min64(max64(ceil_div(total, threads), 1), kMaxBlocks);
}

template <SoftmaxBug kBug>
int planted_materialized_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (planted_materialized_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  float* ws = static_cast<float*>(buf->workspace);
  const int64_t n = matrix_elements(p);
  float* scores = ws;
  float* probs = ws + n;
  float* row_lse = ws + 2 * n;
  const float* q = static_cast<const float*>(buf->q);
  const float* k = static_cast<const float*>(buf->k);
  const float* v = static_cast<const float*>(buf->v);
  float* o = static_cast<float*>(buf->o);
  if (n > 0) {
    hipLaunchKernelGGL(scores_kernel, dim3((unsigned)grid_for(n, kElemThreads)), dim3(kElemThreads), 0,
                       (hipStream_t)stream, p, q, k, scores);
    if (int e = (int)hipGetLastError()) return e;
  }
  void (*softmax)(af_problem, const float*, float*, float*) = planted_softmax_kernel<kBug>;
  hipLaunchKernelGGL(softmax, dim3((unsigned)min64(row_count(p), kMaxBlocks)), dim3(kRowThreads), 0,
                     (hipStream_t)stream, p, (const float*)scores, probs, row_lse);
  if (int e = (int)hipGetLastError()) return e;
  hipLaunchKernelGGL(pv_kernel, dim3((unsigned)grid_for(row_count(p) * p.head_dim_v, kElemThreads)),
                     dim3(kElemThreads), 0, (hipStream_t)stream, p, (const float*)probs,
                     (const float*)row_lse, v, o, buf->lse);
  return (int)hipGetLastError();
}

const af_kernel kMaterializedBugs[] = {
    {"planted-smem-reuse-race", "planted/materialized",
     "materialized with seed 000's bug: red[] reused for the sum without a barrier after the max is read",
     AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, /*max_head_dim=*/0, /*max_head_dim_v=*/0, /*writes_lse=*/1,
     /*needs_dv_eq_d=*/0, planted_materialized_workspace, planted_materialized_check,
     planted_materialized_launch<SoftmaxBug::kSharedReuseRace>},
    {"planted-no-max-sub", "planted/materialized",
     "materialized with a planted bug: softmax weights exp(s) without subtracting the row max",
     AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, /*max_head_dim=*/0, /*max_head_dim_v=*/0, /*writes_lse=*/1,
     /*needs_dv_eq_d=*/0, planted_materialized_workspace, planted_materialized_check,
     planted_materialized_launch<SoftmaxBug::kNoMaxSubtraction>},
};
static_assert(sizeof(kMaterializedBugs) / sizeof(kMaterializedBugs[0]) ==
                  attnfuzz_planted::kMaterializedBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::materialized_bugs() { return kMaterializedBugs; }
