// naive_attention.hip - example attn-fuzz plug-in: one GPU thread per query row, online softmax.
//
// The same file builds three ways (see Makefile): for the cpu emulator (g++), for NVIDIA (nvcc) and for
// AMD (hipcc). It needs only attn-fuzz's include/ directory: attnfuzz/hip.h picks the backend and brings
// the C ABI (attnfuzz/abi.h) and the AF_DEFINE_PLUGIN macro. See README.md for what each field means.
#include <math.h>
#include <stdio.h>

#include "attnfuzz/hip.h"

namespace {

constexpr int kThreads = 64;  // threads per block; thread = one (batch, head, query row)

// The keys query row i may see are [first, last): visible(i, j) <=> j - (i + off) in [-left, right], with
// off = Sk - Sq for bottom-right alignment and 0 for top-left; causal = (left unbounded, right 0).
__host__ __device__ inline void visible_keys(const af_problem& p, int64_t i, int64_t* first, int64_t* last) {
  *first = 0;
  *last = p.seq_k;
  if (p.mask_kind == AF_MASK_NONE) return;
  const int64_t c = i + (p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? p.seq_k - p.seq_q : 0);
  const int64_t left = p.mask_kind == AF_MASK_WINDOW ? p.window_left : AF_UNBOUNDED;
  const int64_t right = p.mask_kind == AF_MASK_CAUSAL ? 0 : p.window_right;
  if (left != AF_UNBOUNDED && c - left > 0) *first = c - left;
  if (right != AF_UNBOUNDED && c + right + 1 < p.seq_k) *last = c + right + 1;
  if (*last < *first) *last = *first;  // no visible key: a fully masked row
}

// O[b, i, h, :] = softmax(scale * q_i K^T over the visible keys) V, accumulated in place in O (so any Dv
// works without registers); LSE[b, h, i] = the natural-log logsumexp of the visible scores.
// Non-finite inputs follow IEEE (the max propagates NaN; a -inf score has weight 0); a fully masked row
// gets O = 0 and LSE = -inf, as attn-fuzz's oracle (and FlashAttention, PyTorch) expects.
__global__ void __launch_bounds__(kThreads)
    naive_attention_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  const int64_t row = (int64_t)blockIdx.x * kThreads + threadIdx.x;  // over (b, h, i), i fastest
  if (row >= p.batch * p.heads_q * p.seq_q) return;
  const int64_t i = row % p.seq_q, h = row / p.seq_q % p.heads_q, b = row / (p.seq_q * p.heads_q);
  const int64_t hk = h / (p.heads_q / p.heads_kv);  // GQA / MQA: the kv head this query head reads
  // Element strides: [B, S, H, D] tensors, last stride 1; LSE [B, Hq, Sq].
  const float* qr = q + b * p.q_stride[0] + i * p.q_stride[1] + h * p.q_stride[2];
  float* orow = o + b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2];
  int64_t first, last;
  visible_keys(p, i, &first, &last);

  for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // running max, running sum of exp(s - m)
  for (int64_t j = first; j < last; ++j) {
    const float* kr = k + b * p.k_stride[0] + j * p.k_stride[1] + hk * p.k_stride[2];
    const float* vr = v + b * p.v_stride[0] + j * p.v_stride[1] + hk * p.v_stride[2];
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
    const float s = p.scale * dot;
    const float m_new = (s > m || s != s) ? s : m;                    // max that keeps NaN
    const float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new);  // moves the old state onto m_new
    const float beta = s == -INFINITY ? 0.0f : expf(s - m_new);       // this key's weight
    l = l * alpha + beta;
    m = m_new;
    for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = orow[d] * alpha + beta * vr[d];
  }
  for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = m == -INFINITY ? 0.0f : orow[d] / l;
  if (lse)
    lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
        m == -INFINITY ? -INFINITY : m + logf(l);
}

// Optional finer support check: 0 = supported, else a reason. The tool never launches a refused problem
// (it reports it as unsupported); the launch function checks again, as a kernel library would.
int naive_attention_check(const af_problem* p, char* why, size_t why_len) {
  const int64_t blocks = (p->batch * p->heads_q * p->seq_q + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff / kThreads) {
    if (why && why_len) snprintf(why, why_len, "more than 2^31 query rows");
    return 1;
  }
  return 0;
}

// Enqueues the kernel on the stream the tool passes (the tool synchronises and times it). Returns the
// backend's error code: 0 (hipSuccess) or the launch error.
int naive_attention_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // the cpu emulator runs the launch synchronously and ignores the stream
  const af_problem p = *pp;
  if (p.dtype != AF_DTYPE_F32 || naive_attention_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  hipLaunchKernelGGL(naive_attention_kernel, dim3((unsigned)((rows + kThreads - 1) / kThreads)),
                     dim3(kThreads), 0, (hipStream_t)stream, p, static_cast<const float*>(buf->q),
                     static_cast<const float*>(buf->k), static_cast<const float*>(buf->v),
                     static_cast<float*>(buf->o), buf->lse);
  return (int)hipGetLastError();
}

// What the plug-in offers: one entry per kernel. Designated initializers name each field (in af_kernel's
// order, attnfuzz/abi.h); a field left out is zero / NULL, with the meaning abi.h gives zero (dtypes 0 = fp32
// only, masks 0 = every mask, features 0 = dense only, launch_bwd NULL = forward only).
const af_kernel kExampleKernels[] = {
    {
        .name = "example-naive",
        .family = "example",
        .description = "one thread per query row, online softmax, O as accumulator (plug-in example)",
        .dtypes = AF_SUPPORTS_F32,        // fp32 only (add AF_SUPPORTS_F16, _BF16, _FP8_E4M3, ...)
        .masks = AF_SUPPORTS_ALL_MASKS,   // none, causal and sliding windows, both alignments
        .max_head_dim = 0,                // largest D: no limit
        .max_head_dim_v = 0,              // largest Dv: no limit
        .writes_lse = 1,                  // LSE is written, so it is checked too
        .needs_dv_eq_d = 0,               // Dv != D is fine
        .workspace_bytes = nullptr,       // no workspace
        .check_support = naive_attention_check,
        .launch = naive_attention_launch,
        // ---- ABI v2: all zero here (dense, forward only, no knobs) ----
        .features = 0,                    // AF_FEATURE_Q_PACKED, _KV_PACKED, _KV_PAGED, _SEQUSED_K
        .n_tunables = 0,                  // integer knobs (af_tunable), e.g. a split count with role
        .tunables = nullptr,              //   AF_TUNABLE_KV_SPLITS, which the split-kv detector varies
        .bwd_workspace_bytes = nullptr,   // backward workspace
        .launch_bwd = nullptr,            // a backward launch (dQ, dK, dV); NULL: forward only
    },
};

}  // namespace

// The one exported symbol: const af_plugin* attnfuzz_plugin(void), with the ABI version and the backend
// this file was compiled for.
AF_DEFINE_PLUGIN("naive attention example", kExampleKernels)
