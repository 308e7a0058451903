// split_kv.hip - flash-decoding style: KV split across blocks into partial (O, LSE), then a logsumexp
// combine.
#include "kernels/common.h"
#include "kernels/register.h"

namespace {

constexpr int kThreads = 64;  // threads per block in both kernels
constexpr int kMaxD = 256;    // largest D (the q row is staged in shared memory) and Dv (registers)
constexpr int kAcc = kMaxD / kThreads;
constexpr uint32_t kDtypes = AF_SUPPORTS_F32 | AF_SUPPORTS_F16 | AF_SUPPORTS_BF16;
constexpr int64_t kMinSplitKeys = 4;  // small so that short sequences are split too

// The declared tunable (ABI v2): num_splits, the number of KV splits per row (fewer when Sk / 4 is
// smaller). values[0] = 8 is the default; the split-kv detector re-runs a failing case with the others.
const af_tunable kSplitKvTunables[] = {
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
  const int64_t want = p.tunables[0] >= 1 ? p.tunables[0] : kDefaultSplits;  // the tool always resolves it
  const int64_t n = min64(want, ceil_div(p.seq_k, kMinSplitKeys));
  const int64_t len = ceil_div(p.seq_k, n);
  return {ceil_div(p.seq_k, len), len};
}

// Workspace: partial O [B, Hq, Sq, n, Dv] then partial LSE [B, Hq, Sq, n] (fp32).
__host__ __device__ inline int64_t row_count(const af_problem& p) { return p.batch * p.heads_q * p.seq_q; }

// Block (i * n + s, h, b): the keys of split s visible to row i, a chunk of kThreads keys at a time.
// Each thread scores one key of the chunk; every thread then reads all the chunk's scores in the same
// order, so all threads hold identical m and l. Thread t owns the partial output for d = t + e * kThreads.
// Writes the partial O normalised by its own l and the partial LSE (-inf and O = acc, which is 0 unless a
// -inf-scored visible key carried a NaN/Inf value, when the split saw no finite score).
// Two barriers per chunk: scores complete before they are read; weights complete before they are read.
// A chunk's writes of score[] come after the previous chunk's barrier 2 (all reads of score[] precede
// it), its writes of weight[] after its own barrier 1 (all reads of the old weight[] precede that).
// Element type T (common.h Elem): fp32 scores, state, partials and combine; the weights rounded to T for
// P.V only; O rounded to T once, by the combine.
template <class T>
__global__ void __launch_bounds__(kThreads)
    split_partial_kernel(af_problem p, const T* __restrict__ q, const T* __restrict__ k,
                         const T* __restrict__ v, float* __restrict__ o_part,
                         float* __restrict__ lse_part, Splits sp) {
  __shared__ float q_vec[kMaxD];
  __shared__ float score[kThreads];
  __shared__ float weight[kThreads];
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x / sp.n, s = blockIdx.x % sp.n, h = blockIdx.y, b = blockIdx.z;
  const int64_t hk = kv_head_of(p, h);
  const KeySpan keys = row_keys(p, i);
  const int64_t lo = max64(keys.first, s * sp.len), hi = min64(keys.last, (s + 1) * sp.len);

  const T* qr = q + q_row(p, b, i, h);
  for (int64_t d = t; d < p.head_dim; d += kThreads) q_vec[d] = Elem<T>::load(qr[d]);
  __syncthreads();

  float m = neg_inf(), l = 0.0f;
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  for (int64_t c0 = lo; c0 < hi; c0 += kThreads) {
    const int n = (int)min64(kThreads, hi - c0);  // keys in this chunk, all visible
    float mine = neg_inf();
    if (t < n) {
      const T* kr = k + k_row(p, b, c0 + t, hk);
      float dot = 0.0f;
      for (int64_t d = 0; d < p.head_dim; ++d) dot += q_vec[d] * Elem<T>::load(kr[d]);
      mine = score_scale<T>(p) * dot;
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
    const T* vc = v + v_row(p, b, c0, hk);
    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int64_t d = t + e * kThreads;
      if (d >= p.head_dim_v) continue;
      float pv = 0.0f;
      for (int c = 0; c < n; ++c) pv += Elem<T>::round(weight[c]) * Elem<T>::load(vc[c * p.v_stride[1] + d]);
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

// Block (i, h, b): M = max_s LSE_s, w_s = exp(LSE_s - M) (0 for an empty split), O = sum w_s O_s / sum w_s,
// LSE = M + log(sum w_s); a row whose every split is empty gets O = 0, LSE = -inf.
template <class T>
__global__ void __launch_bounds__(kThreads)
    split_combine_kernel(af_problem p, const float* __restrict__ o_part, const float* __restrict__ lse_part,
                         T* __restrict__ o, float* __restrict__ lse, Splits sp) {
  const int t = threadIdx.x;
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
  const float* lp = lse_part + row * sp.n;
  float m = neg_inf();
  for (int64_t s = 0; s < sp.n; ++s) m = nan_max(m, lp[s]);
  float l = 0.0f;
  for (int64_t s = 0; s < sp.n; ++s) l += softmax_weight(lp[s], m);
  T* orow = o + o_row(p, b, i, h);
  for (int64_t d = t; d < p.head_dim_v; d += kThreads) {
    float acc = 0.0f;
    for (int64_t s = 0; s < sp.n; ++s)
      acc += softmax_weight(lp[s], m) * o_part[(row * sp.n + s) * p.head_dim_v + d];
    orow[d] = store_o<T>(p, finish_o(acc, m, l));
  }
  if (lse && t == 0) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

size_t split_kv_workspace(const af_problem* p) {
  const Splits sp = splits_of(*p);
  return (size_t)(row_count(*p) * sp.n * (p->head_dim_v + 1)) * sizeof(float);
}

int split_kv_check(const af_problem* p, char* why, size_t why_len) {
  if (check_dtype(p, kDtypes, why, why_len)) return 1;
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD)
    return unsupported(why, why_len, "split-kv supports D, Dv <= 256");
  if (!grid_fits(p->seq_q * max64(splits_of(*p).n, 1), p->heads_q, p->batch, kThreads))
    return unsupported(why, why_len, "split-kv grid (Sq x splits, Hq, B) exceeds the launch limits");
  return 0;
}

int split_kv_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (split_kv_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  const Splits sp = splits_of(p);
  float* o_part = static_cast<float*>(buf->workspace);
  float* lse_part = o_part + row_count(p) * sp.n * p.head_dim_v;
  return dispatch_dtype(p, kDtypes, [&](auto tag) {
    using T = decltype(tag);
    if (sp.n > 0) {
      hipLaunchKernelGGL(
          split_partial_kernel<T>, dim3((unsigned)(p.seq_q * sp.n), (unsigned)p.heads_q, (unsigned)p.batch),
          dim3(kThreads), 0, (hipStream_t)stream, p, static_cast<const T*>(buf->q),
          static_cast<const T*>(buf->k), static_cast<const T*>(buf->v), o_part, lse_part, sp);
      if (int e = (int)hipGetLastError()) return e;
    }
    hipLaunchKernelGGL(split_combine_kernel<T>, dim3((unsigned)p.seq_q, (unsigned)p.heads_q, (unsigned)p.batch),
                       dim3(kThreads), 0, (hipStream_t)stream, p, (const float*)o_part, (const float*)lse_part,
                       static_cast<T*>(buf->o), buf->lse, sp);
    return (int)hipGetLastError();
  });
}

const af_kernel kSplitKvKernels[] = {
    {"split-kv", "split-kv",
     "flash-decoding: num_splits (default 8) KV splits per row into partial (O, LSE) in the workspace, "
     "then a logsumexp combine",
     kDtypes, AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0,
     split_kv_workspace, split_kv_check, split_kv_launch, /*features=*/0, /*n_tunables=*/1, kSplitKvTunables},
};

}  // namespace

AF_REGISTER_KERNELS(kSplitKvKernels);
