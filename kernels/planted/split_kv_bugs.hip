// split_kv_bugs.hip - planted bugs in the split-KV kernel (kernels/split_kv.hip): combine and q.k loop.
//
// Both dispatches are copied from kernels/split_kv.hip, templated on the bug; every deviation sits behind
// `if constexpr (kBug == ...)` and is marked `// PLANTED:`. Like the correct kernel, every kernel here
// declares its split count as the tunable num_splits (role AF_TUNABLE_KV_SPLITS). kernels/planted/README.md
// has each bug's exposing and quiet case.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kThreads = 64;  // threads per block in both kernels
constexpr int kMaxD = 256;    // largest D (the q row is staged in shared memory) and Dv (registers)
constexpr int kAcc = kMaxD / kThreads;
constexpr int64_t kMinSplitKeys = 4;  // small so that short sequences are split too

enum class SplitBug { kWrongWeight, kDropLastSplit, kHeadDimUnroll4 };

// The declared tunable, as in kernels/split_kv.hip: values[0] = 8 is the default.
const af_tunable kSplitTunables[] = {
    {"num_splits",
     "KV splits per row (at most ceil(Sk / 4))",
     AF_TUNABLE_KV_SPLITS,
     9,
     {8, 1, 2, 3, 4, 5, 6, 7, 16}},
};
constexpr int64_t kDefaultSplits = 8;

// The KV split: n splits of len keys each (split s covers [s * len, min((s + 1) * len, Sk))).
struct Splits {
  int64_t n, len;
};
__host__ __device__ inline Splits splits_of(const af_problem& p) {
  if (p.seq_k == 0) return {0, 0};
  const int64_t want = p.tunables[0] >= 1 ? p.tunables[0] : kDefaultSplits;
  const int64_t n = min64(want, ceil_div(p.seq_k, kMinSplitKeys));
  const int64_t len = ceil_div(p.seq_k, n);
  return {ceil_div(p.seq_k, len), len};
}

// Workspace: partial O [B, Hq, Sq, n, Dv] then partial LSE [B, Hq, Sq, n] (fp32).
__host__ __device__ inline int64_t row_count(const af_problem& p) { return p.batch * p.heads_q * p.seq_q; }

// Block (i * n + s, h, b) (unchanged from kernels/split_kv.hip): the keys of split s visible to row i, a
// chunk of kThreads keys at a time. Each thread scores one key of the chunk; every thread then reads all the
// chunk's scores in the same order, so all threads hold identical m and l. Thread t owns the partial output
// for d = t + e * kThreads. Writes the partial O normalised by its own l and the partial LSE (-inf and O =
// acc, which is 0 unless a -inf-scored visible key carried a NaN/Inf value, when the split saw no finite
// score). Two barriers per chunk: scores complete before they are read; weights complete before they are
// read. A chunk's writes of score[] come after the previous chunk's barrier 2 (all reads of score[] precede
// it), its writes of weight[] after its own barrier 1 (all reads of the old weight[] precede that).
template <SplitBug kBug>
__global__ void __launch_bounds__(kThreads)
    split_partial_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ v, float* __restrict__ o_part,
                         float* __restrict__ lse_part, Splits sp) {
  __shared__ float q_vec[kMaxD];
  __shared__ float score[kThreads];
  __shared__ float weight[kThreads];
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x / sp.n, s = blockIdx.x % sp.n, h = blockIdx.y, b = blockIdx.z;
  const int64_t hk = kv_head_of(p, h);
  const KeySpan keys = row_keys(p, i);
  const int64_t lo = max64(keys.first, s * sp.len), hi = min64(keys.last, (s + 1) * sp.len);

  const float* qr = q + q_row(p, b, i, h);
  for (int64_t d = t; d < p.head_dim; d += kThreads) q_vec[d] = qr[d];
  __syncthreads();

  float m = neg_inf(), l = 0.0f;
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  for (int64_t c0 = lo; c0 < hi; c0 += kThreads) {
    const int n = (int)min64(kThreads, hi - c0);  // keys in this chunk, all visible
    float mine = neg_inf();
    if (t < n) {
      const float* kr = k + k_row(p, b, c0 + t, hk);
      float dot = 0.0f;
      if constexpr (kBug == SplitBug::kHeadDimUnroll4) {
        // PLANTED: headdim-unroll4: the q.k loop is unrolled by 4 with no remainder loop, so the last D % 4
        // columns never enter the score (D < 4: every score is 0). Quiet when D % 4 == 0.
        for (int64_t d = 0; d + 4 <= p.head_dim; d += 4)
          dot += q_vec[d] * kr[d] + q_vec[d + 1] * kr[d + 1] + q_vec[d + 2] * kr[d + 2] +
                 q_vec[d + 3] * kr[d + 3];
      } else {
        for (int64_t d = 0; d < p.head_dim; ++d) dot += q_vec[d] * kr[d];
      }
      mine = p.scale * dot;
    }
    score[t] = mine;
    __syncthreads();  // 1
    float chunk_max = neg_inf();
    for (int c = 0; c < n; ++c) chunk_max = nan_max(chunk_max, score[c]);
    const float m_new = nan_max(m, chunk_max);
    const float alpha = rescale_factor(m, m_new);
    weight[t] = t < n ? softmax_weight(mine, m_new) : 0.0f;
    __syncthreads();  // 2
    float sum = 0.0f;
    for (int c = 0; c < n; ++c) sum += weight[c];
    l = l * alpha + sum;
    m = m_new;
    const float* vc = v + v_row(p, b, c0, hk);
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = t + e * kThreads;
      if (d >= p.head_dim_v) continue;
      float pv = 0.0f;
      for (int c = 0; c < n; ++c) pv += weight[c] * vc[c * p.v_stride[1] + d];
      acc[e] = acc[e] * alpha + pv;
    }
  }

  const int64_t slot = ((b * p.heads_q + h) * p.seq_q + i) * sp.n + s;
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int64_t d = t + e * kThreads;
    if (d < p.head_dim_v) o_part[slot * p.head_dim_v + d] = m == neg_inf() ? acc[e] : acc[e] / l;
  }
  if (t == 0) lse_part[slot] = finish_lse(m, l);
}

// PLANTED: combine-wrong-weight: the split weight is 2^(LSE_s - M) (exp2f, as in kernels that keep a base-2
// LSE) although the partial LSE is a natural log: w_s should be e^(LSE_s - M) = softmax_weight(LSE_s, M).
// Exact with one split, or when every split has the same LSE; otherwise the splits are mixed in the wrong
// proportions (and the row LSE is off).
template <SplitBug kBug>
__host__ __device__ inline float planted_split_weight(float lse_s, float max_lse) {
  if constexpr (kBug == SplitBug::kWrongWeight) return lse_s == neg_inf() ? 0.0f : exp2f(lse_s - max_lse);
  return softmax_weight(lse_s, max_lse);
}

// PLANTED: combine-drops-last-split: the combine counts the splits as Sk / len (floor) while the partial
// dispatch made ceil(Sk / len) of them: a last, shorter split is never combined (its keys are lost from O and
// LSE). Quiet when the split length divides Sk (e.g. num_splits = 1, or Sk = 40 with 8 splits of 5).
template <SplitBug kBug>
__host__ __device__ inline int64_t planted_combined_splits(const af_problem& p, Splits sp) {
  if constexpr (kBug == SplitBug::kDropLastSplit) return sp.len ? p.seq_k / sp.len : 0;
  return sp.n;
}

// Block (i, h, b): kernels/split_kv.hip's combine, weighing the splits with planted_split_weight() over
// planted_combined_splits() of them.
template <SplitBug kBug>
__global__ void __launch_bounds__(kThreads)
    planted_combine_kernel(af_problem p, const float* __restrict__ o_part, const float* __restrict__ lse_part,
                           float* __restrict__ o, float* __restrict__ lse, Splits sp) {
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
  const float* lp = lse_part + row * sp.n;
  const int64_t n = planted_combined_splits<kBug>(p, sp);
  float m = neg_inf();
  for (int64_t s = 0; s < n; ++s) m = nan_max(m, lp[s]);
  float l = 0.0f;
  for (int64_t s = 0; s < n; ++s) l += planted_split_weight<kBug>(lp[s], m);
  float* orow = o + o_row(p, b, i, h);
  for (int64_t d = t; d < p.head_dim_v; d += kThreads) {
    float acc = 0.0f;
    for (int64_t s = 0; s < n; ++s)
      acc += planted_split_weight<kBug>(lp[s], m) * o_part[(row * sp.n + s) * p.head_dim_v + d];
    orow[d] = finish_o(acc, m, l);
  }
  if (lse && t == 0) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

size_t planted_split_kv_workspace(const af_problem* p) {
  const Splits sp = splits_of(*p);
  return (size_t)(row_count(*p) * sp.n * (p->head_dim_v + 1)) * sizeof(float);
}

int planted_split_kv_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "split-kv supports f32 only");
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD)
    return unsupported(why, why_len, "split-kv supports D, Dv <= 256");
  if (!grid_fits(p->seq_q * max64(splits_of(*p).n, 1), p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "split-kv grid (Sq x splits, Hq, B) exceeds the launch limits");
  return 0;
}

template <SplitBug kBug>
int planted_split_kv_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (planted_split_kv_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  const Splits sp = splits_of(p);
  float* o_part = static_cast<float*>(buf->workspace);
  float* lse_part = o_part + row_count(p) * sp.n * p.head_dim_v;
  void (*partial)(af_problem, const float*, const float*, const float*, float*, float*, Splits) =
      split_partial_kernel<kBug>;
  void (*combine)(af_problem, const float*, const float*, float*, float*, Splits) =
      planted_combine_kernel<kBug>;
  if (sp.n > 0) {
    hipLaunchKernelGGL(partial, dim3((unsigned)(p.seq_q * sp.n), (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(kThreads), 0, (hipStream_t)stream, p, static_cast<const float*>(buf->q),
                       static_cast<const float*>(buf->k), static_cast<const float*>(buf->v), o_part, lse_part,
                       sp);
    if (int e = (int)hipGetLastError()) return e;
  }
  hipLaunchKernelGGL(combine, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch), dim3(kThreads),
                     0, (hipStream_t)stream, p, (const float*)o_part, (const float*)lse_part,
                     static_cast<float*>(buf->o), buf->lse, sp);
  return (int)hipGetLastError();
}

#define AF_PLANTED_SPLIT(name, bug, what)                                                                   \
  {                                                                                                         \
    name, "planted/split-kv", "split-kv with a planted bug: " what, AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, \
        kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, planted_split_kv_workspace,                    \
        planted_split_kv_check, planted_split_kv_launch<SplitBug::bug>, /*features=*/0, /*n_tunables=*/1,   \
        kSplitTunables                                                                                      \
  }

const af_kernel kSplitKvBugs[] = {
    AF_PLANTED_SPLIT("planted-combine-wrong-weight", kWrongWeight,
                     "the combine weighs split s by 2^(LSE_s - M) instead of e^(LSE_s - M)"),
    AF_PLANTED_SPLIT("planted-combine-drops-last-split", kDropLastSplit,
                     "the combine counts floor(Sk / len) splits: a last, shorter split is dropped"),
    AF_PLANTED_SPLIT("planted-headdim-unroll4", kHeadDimUnroll4,
                     "q.k unrolled by 4 with no remainder: the last D % 4 columns are ignored"),
};
#undef AF_PLANTED_SPLIT
static_assert(sizeof(kSplitKvBugs) / sizeof(kSplitKvBugs[0]) == attnfuzz_planted::kSplitKvBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::split_kv_bugs() { return kSplitKvBugs; }
