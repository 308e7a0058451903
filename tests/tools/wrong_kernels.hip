// wrong_kernels.hip - a test-only plug-in of deliberately wrong kernels: one per verdict path of attn-check.
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/common.h"

namespace {

enum Wrong : int { kScaled, kNanRow, kOobWrite, kCrash, kHang, kRight };

// One thread per (query row, head, batch): a plain online softmax, then the chosen mistake.
__global__ void row_kernel(af_problem p, const float* q, const float* k, const float* v, float* o, int wrong) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  if (wrong == kCrash && i == 0) *(volatile float*)nullptr = 1.f;
  if (wrong == kHang) {
    volatile int forever = 1;
    while (forever) {
    }
  }
  const int64_t hk = kv_head_of(p, h);
  const KeySpan keys = row_keys(p, i);
  float m = neg_inf(), l = 0.f;
  float* orow = o + o_row(p, b, i, h);
  for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = 0.f;
  for (int64_t j = keys.first; j < keys.last; ++j) {
    float dot = 0.f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += q[q_row(p, b, i, h) + d] * k[k_row(p, b, j, hk) + d];
    const float s = p.scale * dot, m_new = nan_max(m, s);
    const float alpha = rescale_factor(m, m_new), beta = softmax_weight(s, m_new);
    l = l * alpha + beta;
    m = m_new;
    for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = orow[d] * alpha + beta * v[v_row(p, b, j, hk) + d];
  }
  for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = finish_o(orow[d], m, l);
  if (wrong == kScaled) orow[0] *= 1.001f;
  if (wrong == kNanRow && i == p.seq_q - 1) orow[0] = NAN;
  if (wrong == kOobWrite && i == p.seq_q - 1 && h == p.heads_q - 1 && b == p.batch - 1)
    orow[p.head_dim_v] = 7.f;  // one past the last element of O (contiguous layout)
}

template <int kWrong>
int launch(const af_problem* p, const af_buffers* b, void* stream) {
  hipLaunchKernelGGL(row_kernel, dim3((unsigned)ceil_div(p->seq_q, 32), (unsigned)p->heads_q, (unsigned)p->batch),
                     dim3(32), 0, (hipStream_t)stream, *p, (const float*)b->q, (const float*)b->k,
                     (const float*)b->v, (float*)b->o, kWrong);
  return (int)hipGetLastError();
}

// A plan cache keyed on the shape, scale, mask and dtype but not the strides (FlashInfer PR #4015's stale plans): the
// first launch of each key fixes the q, k, v strides every later launch of that key reads with. It lives in the
// process, so it shows only where launches share one (attn-check --no-isolate on the cpu backend: an isolated launch
// runs in a fresh child).
int stale_strides_launch(const af_problem* p, const af_buffers* b, void* stream) {
  static std::mutex mu;
  static std::map<std::vector<int64_t>, std::vector<int64_t>> plans;
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &p->scale, sizeof scale_bits);
  const std::vector<int64_t> key = {p->batch,     p->heads_q,    p->heads_kv,    p->seq_q,       p->seq_k,
                                    p->head_dim,  p->head_dim_v, scale_bits,     p->mask_kind,   p->mask_align,
                                    p->window_left, p->window_right, p->dtype};
  af_problem kept = *p;
  {
    const std::lock_guard<std::mutex> lock(mu);
    const auto it = plans.try_emplace(key, std::vector<int64_t>(p->q_stride, p->q_stride + 3)).first;
    if (it->second.size() == 3) {  // the strides of the first launch of this key, q then k then v
      it->second.insert(it->second.end(), p->k_stride, p->k_stride + 3);
      it->second.insert(it->second.end(), p->v_stride, p->v_stride + 3);
    }
    for (int i = 0; i < 3; ++i)
      kept.q_stride[i] = it->second[i], kept.k_stride[i] = it->second[3 + i], kept.v_stride[i] = it->second[6 + i];
  }
  return launch<kRight>(&kept, b, stream);
}

#define WRONG(name, w, masks, desc) \
  {name, "test", desc, AF_SUPPORTS_F32, masks, 0, 0, 0, 0, nullptr, nullptr, &launch<w>}
const af_kernel kWrongKernels[] = {
    WRONG("test-right", kRight, AF_SUPPORTS_ALL_MASKS, "correct: one thread per row"),
    WRONG("test-scaled", kScaled, AF_SUPPORTS_ALL_MASKS, "O[...,0] scaled by 1.001: a precision failure"),
    WRONG("test-nan-row", kNanRow, AF_SUPPORTS_ALL_MASKS, "writes NaN into the last row: non-finite"),
    WRONG("test-oob-write", kOobWrite, AF_SUPPORTS_ALL_MASKS, "writes one element past O: oob-write"),
    WRONG("test-crash", kCrash, AF_SUPPORTS_ALL_MASKS, "dereferences NULL: crash"),
    WRONG("test-hang", kHang, AF_SUPPORTS_ALL_MASKS, "spins forever: hang"),
    WRONG("test-nomask-only", kRight, AF_SUPPORTS_MASK_NONE, "correct, but claims no mask support"),
    {"test-stale-strides", "test", "correct, with a plan cache keyed without the q, k, v strides (one process)",
     AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, 0, 0, 0, 0, nullptr, nullptr, &stale_strides_launch},
};

}  // namespace

AF_DEFINE_PLUGIN("attn-check test kernels", kWrongKernels)
