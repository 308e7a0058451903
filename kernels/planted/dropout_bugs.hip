// dropout_bugs.hip - planted bugs in dropout (issue 29): offset wrap, backward mask, tile mask, 1 / p, stale seed.
//
// A plain fp32 kernel with dropout: one thread per query row (three passes over the visible keys: max, row sum, then
// the kept weights times V), and a backward with one thread per query row (Delta, dQ) and one per key (dK, dV). Keep
// decisions come from attnfuzz/philox.h in FlashAttention's layout. With DropBug::kNone it is correct; every deviation
// sits behind `if constexpr (kBug == ...)` and is marked `// PLANTED:`. kernels/planted/README.md has each bug's
// report, its exposing and its quiet case.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kThreads = 64;
constexpr int kMaxDv = 128;  // accumulators in registers

enum class DropBug {
  kNone,
  kOffsetWrap,  // the Philox counter offset (offset + (b Hq + h) 32 + lane) kept in 32 bits (PyTorch PR #192138)
  kBwdWrap,     // the backward's offset wraps at 32 bits, the forward's does not: other masks (PyTorch PR #188015)
  kTileMask,    // the draw uses the row inside its BLOCK_M tile (i % block_m): the mask depends on the tile
  kInvP,        // kept weights scaled by 1 / p instead of 1 / (1 - p)
  kStaleSeed,   // the generator's seed read once and never refreshed: seed 0 whatever the launch asks (CK PR #197563)
};

// Tunable of the tile-mask kernel: the query rows per tile (its draw uses i % block_m).
const af_tunable kTileTunables[] = {
    {"block_m", "query rows per tile (the planted draw uses the row inside the tile)", AF_TUNABLE_OTHER, 2, {16, 32}}};

// The keep decision of visible weight (b, h, i, j) as the planted kernel draws it; exported when asked.
template <DropBug kBug>
__host__ __device__ inline bool planted_keep(const af_problem& p, const VariantBufs& vb, int64_t b, int64_t h,
                                             int64_t i, int64_t j, bool backward) {
  uint64_t seed = p.dropout_seed;
  int64_t row = i;
  if constexpr (kBug == DropBug::kStaleSeed) seed = 0;  // PLANTED: stale-seed: the first state's seed, never re-read
  if constexpr (kBug == DropBug::kTileMask) row = i % p.tunables[0];  // PLANTED: tile-mask: the row inside its tile
  attnfuzz::FlashDraw d = attnfuzz::flash_dropout_draw(p.dropout_offset, b, h, p.heads_q, row, j);
  if constexpr (kBug == DropBug::kOffsetWrap) d.offset = static_cast<uint32_t>(d.offset);  // PLANTED: offset-wrap
  if constexpr (kBug == DropBug::kBwdWrap)
    if (backward) d.offset = static_cast<uint32_t>(d.offset);  // PLANTED: bwd-wrap: the backward's offset in 32 bits
  const bool keep = attnfuzz::philox_byte(attnfuzz::flash_philox(seed, d.subsequence, d.offset), d.byte) <=
                    attnfuzz::flash_keep_threshold(p.dropout_p);
  if (vb.dropout_mask && p.dropout_rng == AF_DROPOUT_RNG_EXPORTED)
    vb.dropout_mask[b * p.dropout_mask_stride[0] + h * p.dropout_mask_stride[1] + i * p.dropout_mask_stride[2] + j] =
        keep ? 1 : 0;
  return keep;
}

// The factor of a kept weight.
template <DropBug kBug>
__host__ __device__ inline float planted_scale(const af_problem& p) {
  if constexpr (kBug == DropBug::kInvP) return has_dropout(p) ? 1.0f / p.dropout_p : 1.0f;  // PLANTED: inv-p
  return dropout_scale(p);
}

// s_ij = scale q_i . k_j.
__host__ __device__ inline float drop_score(const af_problem& p, const float* q, const float* k, int64_t b, int64_t h,
                                            int64_t i, int64_t j) {
  const float* qi = q + q_row(p, b, i, h);
  const float* kj = k + k_row(p, b, j, kv_head_of(p, h));
  float dot = 0.0f;
  for (int64_t d = 0; d < p.head_dim; ++d) dot += qi[d] * kj[d];
  return p.scale * dot;
}

// One thread per query row (b, h, i): m, l over the visible keys, then O = scale sum_j keep_ij e^(s_ij - m) v_j / l.
template <DropBug kBug>
__global__ void __launch_bounds__(kThreads)
    drop_row_kernel(af_problem p, const float* q, const float* k, const float* v, float* o, float* lse, VariantBufs vb) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const KeySpan keys = row_keys(p, i);
  float m = neg_inf(), l = 0.0f, acc[kMaxDv];
  for (int64_t j = keys.first; j < keys.last; ++j) m = nan_max(m, drop_score(p, q, k, b, h, i, j));
  for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = 0.0f;
  for (int64_t j = keys.first; j < keys.last; ++j) {
    const float w = softmax_weight(drop_score(p, q, k, b, h, i, j), m);
    l += w;
    if (has_dropout(p) && !planted_keep<kBug>(p, vb, b, h, i, j, false)) continue;
    const float* vj = v + v_row(p, b, j, kv_head_of(p, h));
    for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] += w * vj[d];
  }
  const float c = planted_scale<kBug>(p);
  for (int64_t d = 0; d < p.head_dim_v; ++d) o[o_row(p, b, i, h) + d] = finish_o(acc[d], m, l) * c;
  if (lse) lse[lse_at(p, b, h, i)] = finish_lse(m, l);
}

// P_ij and the kept factor c_ij of the backward (dP_ij = c_ij dO_i . v_j, dV gets c_ij P_ij).
template <DropBug kBug>
__host__ __device__ inline float drop_bwd_pair(const af_problem& p, const VariantBufs& vb, const float* q,
                                               const float* k, const float* lse, int64_t b, int64_t h, int64_t i,
                                               int64_t j, float& c) {
  c = !has_dropout(p) ? 1.0f : planted_keep<kBug>(p, vb, b, h, i, j, true) ? planted_scale<kBug>(p) : 0.0f;
  return expf(drop_score(p, q, k, b, h, i, j) - lse[lse_at(p, b, h, i)]);
}
__host__ __device__ inline float drop_dp(const af_problem& p, const float* dout, const float* v, int64_t b, int64_t h,
                                         int64_t i, int64_t j) {
  const float* gi = dout + b * p.do_stride[0] + i * p.do_stride[1] + h * p.do_stride[2];
  const float* vj = v + v_row(p, b, j, kv_head_of(p, h));
  float dp = 0.0f;
  for (int64_t d = 0; d < p.head_dim_v; ++d) dp += gi[d] * vj[d];
  return dp;
}

// Backward, one thread per query row: Delta_i = dO_i . o_i (into the workspace), dQ_i = scale sum_j dS_ij k_j.
template <DropBug kBug>
__global__ void __launch_bounds__(kThreads)
    drop_bwd_rows(af_problem p, const float* q, const float* k, const float* v, const float* o, const float* lse,
                  const float* dout, float* delta, float* dq, VariantBufs vb) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const float* gi = dout + b * p.do_stride[0] + i * p.do_stride[1] + h * p.do_stride[2];
  float dl = 0.0f;
  for (int64_t d = 0; d < p.head_dim_v; ++d) dl += gi[d] * o[o_row(p, b, i, h) + d];
  delta[(b * p.heads_q + h) * p.seq_q + i] = dl;
  float* dqi = dq + b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2];
  for (int64_t d = 0; d < p.head_dim; ++d) dqi[d] = 0.0f;
  const KeySpan keys = lse[lse_at(p, b, h, i)] == neg_inf() ? KeySpan{0, 0} : row_keys(p, i);
  for (int64_t j = keys.first; j < keys.last; ++j) {
    float c;
    const float P = drop_bwd_pair<kBug>(p, vb, q, k, lse, b, h, i, j, c);
    const float dS = P * (c * drop_dp(p, dout, v, b, h, i, j) - dl);
    const float* kj = k + k_row(p, b, j, kv_head_of(p, h));
    for (int64_t d = 0; d < p.head_dim; ++d) dqi[d] += p.scale * dS * kj[d];
  }
}

// Backward, one thread per key (b, kv head, j): dK_j, dV_j over every query head of its group and every row seeing j.
template <DropBug kBug>
__global__ void __launch_bounds__(kThreads)
    drop_bwd_keys(af_problem p, const float* q, const float* k, const float* v, const float* lse, const float* dout,
                  const float* delta, float* dk, float* dv, VariantBufs vb) {
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x, hk = blockIdx.y, b = blockIdx.z;
  if (j >= p.seq_k) return;
  float* dkj = dk + b * p.dk_stride[0] + j * p.dk_stride[1] + hk * p.dk_stride[2];
  float* dvj = dv + b * p.dv_stride[0] + j * p.dv_stride[1] + hk * p.dv_stride[2];
  for (int64_t d = 0; d < p.head_dim; ++d) dkj[d] = 0.0f;
  for (int64_t d = 0; d < p.head_dim_v; ++d) dvj[d] = 0.0f;
  const int64_t G = p.heads_q / p.heads_kv;
  for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const KeySpan keys = row_keys(p, i);
      if (j < keys.first || j >= keys.last || lse[lse_at(p, b, h, i)] == neg_inf()) continue;
      float c;
      const float P = drop_bwd_pair<kBug>(p, vb, q, k, lse, b, h, i, j, c);
      const float dS = P * (c * drop_dp(p, dout, v, b, h, i, j) - delta[(b * p.heads_q + h) * p.seq_q + i]);
      const float* qi = q + q_row(p, b, i, h);
      const float* gi = dout + b * p.do_stride[0] + i * p.do_stride[1] + h * p.do_stride[2];
      for (int64_t d = 0; d < p.head_dim; ++d) dkj[d] += p.scale * dS * qi[d];
      for (int64_t d = 0; d < p.head_dim_v; ++d) dvj[d] += c * P * gi[d];
    }
}

int drop_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "the planted dropout kernels are fp32 only");
  if (p->head_dim_v > kMaxDv) return unsupported(why, why_len, "Dv <= 128");
  if (!grid_fits(ceil_div(p->seq_q, kThreads), p->heads_q, p->batch, kThreads) ||
      !grid_fits(max64(ceil_div(p->seq_k, kThreads), 1), p->heads_kv, p->batch, kThreads))
    return unsupported(why, why_len, "grid exceeds the launch limits");
  return 0;
}

template <DropBug kBug>
int drop_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (drop_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  hipLaunchKernelGGL(drop_row_kernel<kBug>, dim3((unsigned)ceil_div(p.seq_q, kThreads), (unsigned)p.heads_q,
                                                 (unsigned)p.batch),
                     dim3(kThreads), 0, (hipStream_t)stream, p, static_cast<const float*>(buf->q),
                     static_cast<const float*>(buf->k), static_cast<const float*>(buf->v),
                     static_cast<float*>(buf->o), buf->lse, variant_bufs(*buf));
  return (int)hipGetLastError();
}

size_t drop_bwd_workspace(const af_problem* p) { return (size_t)(p->batch * p->heads_q * p->seq_q) * sizeof(float); }

template <DropBug kBug>
int drop_bwd_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  const af_problem p = *pp;
  if (drop_check(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  const VariantBufs vb = variant_bufs(*buf);
  const float *q = static_cast<const float*>(buf->q), *k = static_cast<const float*>(buf->k),
              *v = static_cast<const float*>(buf->v), *dout = static_cast<const float*>(buf->dout);
  float* delta = static_cast<float*>(buf->workspace);
  hipLaunchKernelGGL(drop_bwd_rows<kBug>, dim3((unsigned)ceil_div(p.seq_q, kThreads), (unsigned)p.heads_q,
                                               (unsigned)p.batch),
                     dim3(kThreads), 0, (hipStream_t)stream, p, q, k, v, static_cast<const float*>(buf->o),
                     (const float*)buf->lse, dout, delta, static_cast<float*>(buf->dq), vb);
  if (int e = (int)hipGetLastError()) return e;
  if (p.seq_k > 0)
    hipLaunchKernelGGL(drop_bwd_keys<kBug>, dim3((unsigned)ceil_div(p.seq_k, kThreads), (unsigned)p.heads_kv,
                                                 (unsigned)p.batch),
                       dim3(kThreads), 0, (hipStream_t)stream, p, q, k, v, (const float*)buf->lse, dout,
                       (const float*)delta, static_cast<float*>(buf->dk), static_cast<float*>(buf->dv), vb);
  return (int)hipGetLastError();
}

constexpr uint32_t kExported = 1u << AF_DROPOUT_RNG_EXPORTED;
constexpr uint32_t kPhiloxFlash = 1u << AF_DROPOUT_RNG_PHILOX_FLASH;

#define AF_PLANTED_DROP(name, bug, what, rngs, ntun, tun)                                                        \
  {                                                                                                              \
    name, "planted/dropout", "fp32 row kernel with dropout and a planted bug: " what, AF_SUPPORTS_F32,           \
        AF_SUPPORTS_ALL_MASKS, 0, kMaxDv, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr, drop_check,           \
        drop_launch<DropBug::bug>, /*features=*/0, ntun, tun, drop_bwd_workspace, drop_bwd_launch<DropBug::bug>, \
        /*compute_model=*/0, /*kind=*/0, /*flags=*/0, /*variants=*/AF_VARIANT_DROPOUT, /*dropout_rngs=*/rngs    \
  }

const af_kernel kDropoutBugs[] = {
    AF_PLANTED_DROP("planted-dropout-offset-wrap", kOffsetWrap,
                    "the Philox counter offset kept in 32 bits (wraps past 2^32)", kPhiloxFlash, 0, nullptr),
    AF_PLANTED_DROP("planted-dropout-bwd-mask", kBwdWrap,
                    "the backward's Philox offset wraps at 32 bits, the forward's does not (other masks)", kExported, 0,
                    nullptr),
    AF_PLANTED_DROP("planted-dropout-tile-mask", kTileMask,
                    "the keep decision drawn from the row inside its BLOCK_M tile (the mask depends on the tile)",
                    kExported, 1, kTileTunables),
    AF_PLANTED_DROP("planted-dropout-inv-p", kInvP, "kept weights scaled by 1 / p instead of 1 / (1 - p)",
                    kPhiloxFlash, 0, nullptr),
    AF_PLANTED_DROP("planted-dropout-stale-seed", kStaleSeed,
                    "the generator's seed read once: seed 0 whatever the launch asks", kExported, 0, nullptr),
};
static_assert(sizeof(kDropoutBugs) / sizeof(kDropoutBugs[0]) == attnfuzz_planted::kDropoutBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::dropout_bugs() { return kDropoutBugs; }

#undef AF_PLANTED_DROP
