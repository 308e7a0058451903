// row_leak_kernels.hip - test-only plug-in: a kernel whose rows leak into each other (tile-shared softmax
// max).
//
// No planted kernel of kernels/planted/ lets one query row's values reach another row's output, so the
// row-independence property gets its own planted bug here: the 16 rows of a query tile share one softmax max
// (the max of their row maxes) instead of each using its own. Exact in real arithmetic; in fp32 a row whose
// scores lie ~90 below another row's max underflows (exp -> 0, O = 0/0), and a NaN / +Inf score in one row
// turns the whole tile NaN. Quiet on ordinary inputs (all rows' scores of similar size).
#include "kernels/common.h"

namespace {

constexpr int kTile = 16;

// Block (query tile, head, batch), one thread per row of the tile.
__global__ void tile_max_kernel(af_problem p, const float* q, const float* k, const float* v, float* o,
                                float* lse) {
  __shared__ float row_max[kTile];
  const int r = threadIdx.x;
  const int64_t i = blockIdx.x * (int64_t)kTile + r, h = blockIdx.y, b = blockIdx.z;
  const bool live = i < p.seq_q;
  const int64_t hk = kv_head_of(p, h);
  const KeySpan keys = live ? row_keys(p, i) : KeySpan{0, 0};
  auto score = [&](int64_t j) {
    float dot = 0.f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += q[q_row(p, b, i, h) + d] * k[k_row(p, b, j, hk) + d];
    return p.scale * dot;
  };
  float m = neg_inf();
  for (int64_t j = keys.first; j < keys.last; ++j) m = nan_max(m, score(j));
  row_max[r] = m;
  __syncthreads();
  // PLANTED: row-leak: the tile's max is used for every row (a row's max must be its own).
  float m_tile = neg_inf();
  for (int t = 0; t < kTile; ++t) m_tile = nan_max(m_tile, row_max[t]);
  if (!live) return;
  const float m_use = m == neg_inf() ? m : m_tile;
  float l = 0.f;
  float* orow = o + o_row(p, b, i, h);
  for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = 0.f;
  for (int64_t j = keys.first; j < keys.last; ++j) {
    const float w = softmax_weight(score(j), m_use);
    l += w;
    for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] += w * v[v_row(p, b, j, hk) + d];
  }
  for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] = finish_o(orow[d], m_use, l);
  lse[lse_at(p, b, h, i)] = finish_lse(m_use, l);
}

int launch(const af_problem* p, const af_buffers* b, void* stream) {
  hipLaunchKernelGGL(tile_max_kernel,
                     dim3((unsigned)ceil_div(p->seq_q, kTile), (unsigned)p->heads_q, (unsigned)p->batch),
                     dim3(kTile), 0, (hipStream_t)stream, *p, (const float*)b->q, (const float*)b->k,
                     (const float*)b->v, (float*)b->o, b->lse);
  return (int)hipGetLastError();
}

const af_kernel kRowLeakKernels[] = {
    {"test-row-leak-tile-max", "test", "rows of a 16-row query tile share one softmax max (planted row leak)",
     AF_SUPPORTS_F32, AF_SUPPORTS_ALL_MASKS, 0, 0, /*writes_lse=*/1, 0, nullptr, nullptr, &launch},
};

}  // namespace

AF_DEFINE_PLUGIN("attn-fuzz property tests: row leak", kRowLeakKernels)
