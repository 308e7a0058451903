// flash_bugs.hip - planted rescale, mask, OOB, tail, empty-row, unwritten, LSE and plainly wrong bugs in the
// tiled flash kernel (flash-bm16-bn16).
//
// One copy of flash_kernel, templated on the bug it carries. Every deviation from kernels/flash.hip sits
// behind `if constexpr (kBug == ...)` and is marked `// PLANTED:`; with FlashBug::kNone the kernel is the
// correct one. Each bug is a real bug (it changes the output or writes out of bounds on some supported
// case) and a quiet one (small or aligned cases still pass): see kernels/planted/README.md.
#include "kernels/common.h"
#include "kernels/planted/planted.h"

namespace {

constexpr int kMaxD = 128;                   // largest D and Dv (the tiles hold whole rows in shared memory)
constexpr int kBM = 16, kBN = 16, kNT = 64;  // the flash-bm16-bn16 configuration

enum class FlashBug {
  kNone,
  kNoAccRescale,     // accumulator not rescaled when the row max grows
  kNoSumRescale,     // running sum not rescaled when the row max grows
  kMaskedScoreZero,  // masked scores filled with 0 instead of -inf
  kCausalOffByOne,   // causal rows see one key past the diagonal
  kCausalTopLeft,    // bottom-right alignment ignored (always top-left)
  kTailKUnbounded,   // last K/V tile loaded and scored past Sk (reads past the end of k and v)
  kTailQUnbounded,   // last Q tile stored past Sq (writes past the end of o)
  kTailTileLastKey,  // last partial K tile: P.V stops one key early (the key stays in the sum l)
  kMaskedScoreFinite,  // masked scores -1e30 instead of -inf: an empty row's LSE is finite
  kLseNoMax,           // LSE = log(l) without the row max added back
  kLastQTileUnstored,  // the last partial query tile is never stored
  kGqaInterleaved,     // GQA: kv head h % Hkv (interleaved) instead of h / (Hq / Hkv) (grouped)
  kMaskedPvZeroWeight,  // P.V over the whole key tile, masked keys with weight 0: 0 * NaN / Inf in V reaches O
};

// The visible keys of row i as the planted kernel computes them (row_keys of kernels/common.h, except
// for the two planted mask bugs).
template <FlashBug kBug>
__host__ __device__ inline KeySpan planted_row_keys(const af_problem& p, int64_t i) {
  if constexpr (kBug == FlashBug::kCausalOffByOne) {
    if (p.mask_kind == AF_MASK_CAUSAL) {
      const int64_t off = p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? p.seq_k - p.seq_q : 0;
      // PLANTED: causal-off-by-one: the diagonal test is "j <= i + off + 1" instead of "j <= i + off", so
      // every row whose diagonal key is not the last key also sees the next (future) key.
      return {0, min64(p.seq_k, max64(0, i + off + 2))};
    }
  }
  if constexpr (kBug == FlashBug::kCausalTopLeft) {
    af_problem tl = p;
    // PLANTED: causal-top-left: the mask alignment is ignored and off = 0 is used, also when bottom-right
    // (off = Sk - Sq) is asked for. Identical when Sq == Sk; wrong rows otherwise.
    tl.mask_align = AF_ALIGN_TOP_LEFT;
    return row_keys(tl, i);
  }
  return row_keys(p, i);
}

// kernels/flash.hip's flash_kernel (see there for the structure and the four barriers) with one planted bug.
template <int BM, int BN, int NT, FlashBug kBug>
__global__ void __launch_bounds__(NT)
    planted_flash_kernel(af_problem p, const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  static_assert(NT >= BM, "one thread per row updates the softmax state");
  static_assert((BM * kMaxD) % NT == 0, "accumulators split evenly over the threads");
  constexpr int kAcc = BM * kMaxD / NT;
  __shared__ float q_tile[BM][kMaxD];
  __shared__ float kv_tile[BN][kMaxD];
  __shared__ float s_tile[BM][BN];
  __shared__ float row_m[BM], row_l[BM], row_alpha[BM];
  __shared__ int64_t row_first[BM], row_last[BM];

  const int t = threadIdx.x;
  const int64_t i0 = (int64_t)blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z;
  // PLANTED: gqa-interleaved: the KV head of query head h is taken as h % Hkv (heads interleaved, as after
  // repeat() instead of repeat_interleave()) instead of h / (Hq / Hkv). Same head for MHA (Hq = Hkv) and MQA
  // (Hkv = 1); under GQA every query head whose group index differs reads another head's K and V.
  const int64_t hk = kBug == FlashBug::kGqaInterleaved ? h % p.heads_kv : kv_head_of(p, h);
  const int64_t D = p.head_dim, Dv = p.head_dim_v;
  const int rows = (int)min64(BM, p.seq_q - i0);  // valid rows of this tile

  for (int64_t idx = t; idx < BM * D; idx += NT) {
    const int r = (int)(idx / D);
    const int64_t d = idx % D;
    q_tile[r][d] = r < rows ? q[q_row(p, b, i0 + r, h) + d] : 0.0f;
  }
  if (t < BM) {
    KeySpan keys = t < rows ? planted_row_keys<kBug>(p, i0 + t) : KeySpan{0, 0};
    if constexpr (kBug == FlashBug::kTailKUnbounded) {
      // PLANTED: tail-k-oob-read: the last key tile is taken whole (as if Sk % BLOCK_N == 0): a row that
      // sees up to the last key "sees" up to the next multiple of BLOCK_N, so keys Sk .. are loaded from
      // past the end of k and v (or from the next batch / head) and scored like real keys.
      if (keys.first < keys.last && keys.last == p.seq_k) keys.last = ceil_div(p.seq_k, BN) * BN;
    }
    row_first[t] = keys.first;
    row_last[t] = keys.last;
    row_m[t] = neg_inf();
    row_l[t] = 0.0f;
  }
  float acc[kAcc];
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  __syncthreads();

  int64_t lo = p.seq_k, hi = 0;
  for (int r = 0; r < BM; ++r)
    if (row_first[r] < row_last[r]) {
      lo = min64(lo, row_first[r]);
      hi = max64(hi, row_last[r]);
    }

  for (int64_t n0 = lo < hi ? lo - lo % BN : hi; n0 < hi; n0 += BN) {
    for (int64_t idx = t; idx < BN * D; idx += NT) {
      const int c = (int)(idx / D);
      const int64_t d = idx % D, j = n0 + c;
      kv_tile[c][d] = (j >= lo && j < hi) ? k[k_row(p, b, j, hk) + d] : 0.0f;
    }
    __syncthreads();  // 1

    for (int idx = t; idx < BM * BN; idx += NT) {
      const int r = idx / BN, c = idx % BN;
      const int64_t j = n0 + c;
      float s = neg_inf();
      // PLANTED: masked-score-zero: a masked (or out-of-range) score is 0 instead of -inf, so it enters
      // the row max and adds exp(0 - m) to the row sum. Harmless only when the tile has no masked entry.
      if constexpr (kBug == FlashBug::kMaskedScoreZero) s = 0.0f;
      // PLANTED: masked-score-finite: a masked score is -1e30 (a "safe" finite -inf) instead of -inf. Rows
      // with a visible key are exact (exp(-1e30 - m) = 0), but a row with no visible key in a tile processed
      // for its neighbours takes m = -1e30 and l > 0: O = 0 / l = 0 is right, LSE = -1e30 + log(l) is not -inf.
      if constexpr (kBug == FlashBug::kMaskedScoreFinite) s = -1e30f;
      if (j >= row_first[r] && j < row_last[r]) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += q_tile[r][d] * kv_tile[c][d];
        s = p.scale * dot;
      }
      s_tile[r][c] = s;
    }
    __syncthreads();  // 2

    for (int64_t idx = t; idx < BN * Dv; idx += NT) {
      const int c = (int)(idx / Dv);
      const int64_t d = idx % Dv, j = n0 + c;
      kv_tile[c][d] = (j >= lo && j < hi) ? v[v_row(p, b, j, hk) + d] : 0.0f;
    }
    if (t < BM) {
      float tile_max = neg_inf();
      for (int c = 0; c < BN; ++c) tile_max = nan_max(tile_max, s_tile[t][c]);
      const float m_old = row_m[t], m_new = nan_max(m_old, tile_max);
      const float alpha = rescale_factor(m_old, m_new);
      float sum = 0.0f;
      for (int c = 0; c < BN; ++c) {
        const float w = softmax_weight(s_tile[t][c], m_new);
        s_tile[t][c] = w;
        sum += w;
      }
      if constexpr (kBug == FlashBug::kNoSumRescale) {
        // PLANTED: no-sum-rescale: the running sum is not moved onto the new max (l = l + sum instead of
        // l = l * alpha + sum). Exact while the max never grows after the first key tile.
        row_l[t] = row_l[t] + sum;
      } else {
        row_l[t] = row_l[t] * alpha + sum;
      }
      row_m[t] = m_new;
      row_alpha[t] = alpha;
    }
    __syncthreads();  // 3

    AF_UNROLL
    for (int e = 0; e < kAcc; ++e) {
      const int idx = t + e * NT;
      if (idx < BM * Dv) {
        const int r = idx / (int)Dv, d = idx % (int)Dv;
        int c_lo = (int)(max64(row_first[r], n0) - n0);
        int c_hi = (int)(min64(row_last[r], n0 + BN) - n0);
        if constexpr (kBug == FlashBug::kMaskedPvZeroWeight) {
          // PLANTED: masked-pv-zero-weight: P.V runs over the whole key tile, the masked keys with weight 0 (as a
          // dense P @ V does), for every row with a visible key. 0 * v = 0 for every finite v, so it is exact on
          // finite inputs; a NaN or Inf in the V row of a key this row must not see (0 * Inf = NaN) reaches O.
          if (row_first[r] < row_last[r]) c_lo = 0, c_hi = BN;
        }
        if constexpr (kBug == FlashBug::kTailTileLastKey) {
          // PLANTED: tail-tile-last-key: in a partial last key tile the P.V loop ends at (Sk - 1) % BLOCK_N,
          // the index of the tile's last key, instead of its count: key Sk - 1 is in the row's sum l but
          // never in its output. Quiet when Sk % BLOCK_N == 0 (no partial tile) or no row sees key Sk - 1.
          if (n0 + BN > p.seq_k) c_hi = (int)min64(c_hi, (p.seq_k - 1) % BN);
        }
        float pv = 0.0f;
        for (int c = c_lo; c < c_hi; ++c) pv += s_tile[r][c] * kv_tile[c][d];
        if constexpr (kBug == FlashBug::kNoAccRescale) {
          // PLANTED: no-acc-rescale: the accumulator is not moved onto the new max (acc = acc + pv instead
          // of acc = alpha * acc + pv). Exact while the max never grows after the first key tile.
          acc[e] = acc[e] + pv;
        } else {
          acc[e] = acc[e] * row_alpha[r] + pv;
        }
      }
    }
    __syncthreads();  // 4
  }

  // PLANTED: tail-q-oob-write: the last query tile is stored whole (BLOCK_M rows instead of the tile's
  // valid rows), so rows Sq .. of o are written: past the end of o (or into the next batch's rows).
  constexpr bool kStoreWholeTile = kBug == FlashBug::kTailQUnbounded;
  // PLANTED: last-q-tile-unstored: the store is guarded by "whole tiles only" (rows == BLOCK_M), so the last
  // partial query tile (Sq % 16 rows) is computed and never stored: O and LSE keep what was there before.
  if constexpr (kBug == FlashBug::kLastQTileUnstored)
    if (rows < BM) return;
  const int store_rows = kStoreWholeTile ? BM : rows;
  AF_UNROLL
  for (int e = 0; e < kAcc; ++e) {
    const int idx = t + e * NT;
    if (idx < store_rows * Dv) {
      const int r = idx / (int)Dv, d = idx % (int)Dv;
      o[o_row(p, b, i0 + r, h) + d] = finish_o(acc[e], row_m[r], row_l[r]);
    }
  }
  if (lse && t < rows) {
    float x = finish_lse(row_m[t], row_l[t]);
    // PLANTED: lse-no-max: LSE = log(l), the row max m not added back (the sum l is relative to m). O is
    // right; LSE is off by the row max, so it passes only where every row max is ~0 (tiny inputs).
    if constexpr (kBug == FlashBug::kLseNoMax) x = row_m[t] == neg_inf() ? neg_inf() : logf(row_l[t]);
    lse[lse_at(p, b, h, i0 + t)] = x;
  }
}

// The planted out-of-bounds accesses run at most BLOCK - 1 rows past the end of a buffer. The checker's
// guard zones are 64 KiB each side; a kernel that read or wrote past them would crash (found, but as a
// crash, not as the OOB access it is), so these two kernels refuse rows wider than 32 KiB / (BLOCK - 1).
constexpr int64_t kOverrunLimitBytes = 32 * 1024;

template <FlashBug kBug>
int planted_flash_check(const af_problem* p, char* why, size_t why_len) {
  if (p->dtype != AF_DTYPE_F32) return unsupported(why, why_len, "flash supports f32 only");
  if (p->head_dim > kMaxD || p->head_dim_v > kMaxD)
    return unsupported(why, why_len, "flash supports D, Dv <= 128");
  if (!grid_fits(ceil_div(p->seq_q, kBM), p->heads_q, p->batch, kNT))
    return unsupported(why, why_len, "flash grid (Sq / BLOCK_M, Hq, B) exceeds the launch limits");
  if (kBug == FlashBug::kTailKUnbounded &&
      (kBN - 1) * max64(p->k_stride[1], p->v_stride[1]) * 4 > kOverrunLimitBytes)
    return unsupported(why, why_len, "planted tail-K overrun would pass the 64 KiB guard zone");
  if (kBug == FlashBug::kTailQUnbounded && (kBM - 1) * p->o_stride[1] * 4 > kOverrunLimitBytes)
    return unsupported(why, why_len, "planted tail-Q overrun would pass the 64 KiB guard zone");
  return 0;
}

template <FlashBug kBug>
int planted_flash_launch(const af_problem* pp, const af_buffers* buf, void* stream) {
  (void)stream;  // unused by the cpu emulator
  const af_problem p = *pp;
  if (planted_flash_check<kBug>(pp, nullptr, 0)) return (int)hipErrorInvalidValue;
  void (*kernel)(af_problem, const float*, const float*, const float*, float*, float*) =
      planted_flash_kernel<kBM, kBN, kNT, kBug>;
  hipLaunchKernelGGL(kernel, dim3((unsigned)ceil_div(p.seq_q, kBM), (unsigned)p.heads_q, (unsigned)p.batch),
                     dim3(kNT), 0, (hipStream_t)stream, p, static_cast<const float*>(buf->q),
                     static_cast<const float*>(buf->k), static_cast<const float*>(buf->v),
                     static_cast<float*>(buf->o), buf->lse);
  return (int)hipGetLastError();
}

#define AF_PLANTED_FLASH(name, bug, what)                                                    \
  {                                                                                          \
    name, "planted/flash", "flash-bm16-bn16 with a planted bug: " what, AF_SUPPORTS_F32,     \
        AF_SUPPORTS_ALL_MASKS, kMaxD, kMaxD, /*writes_lse=*/1, /*needs_dv_eq_d=*/0, nullptr, \
        planted_flash_check<FlashBug::bug>, planted_flash_launch<FlashBug::bug>              \
  }

const af_kernel kFlashBugs[] = {
    AF_PLANTED_FLASH("planted-no-acc-rescale", kNoAccRescale, "accumulator not rescaled when the max grows"),
    AF_PLANTED_FLASH("planted-no-sum-rescale", kNoSumRescale, "running sum not rescaled when the max grows"),
    AF_PLANTED_FLASH("planted-masked-score-zero", kMaskedScoreZero, "masked scores are 0 instead of -inf"),
    AF_PLANTED_FLASH("planted-causal-off-by-one", kCausalOffByOne,
                     "causal rows see one key past the diagonal"),
    AF_PLANTED_FLASH("planted-causal-top-left", kCausalTopLeft, "bottom-right alignment taken as top-left"),
    AF_PLANTED_FLASH("planted-tail-k-oob-read", kTailKUnbounded, "last K/V tile read and scored past Sk"),
    AF_PLANTED_FLASH("planted-tail-q-oob-write", kTailQUnbounded, "last Q tile stored past Sq"),
    AF_PLANTED_FLASH("planted-tail-tile-last-key", kTailTileLastKey,
                     "partial last K tile: P.V ends one key early"),
    AF_PLANTED_FLASH("planted-masked-score-finite", kMaskedScoreFinite,
                     "masked scores are -1e30 instead of -inf (empty rows get a finite LSE)"),
    AF_PLANTED_FLASH("planted-lse-no-max", kLseNoMax, "LSE written without the row max added back"),
    AF_PLANTED_FLASH("planted-last-q-tile-unstored", kLastQTileUnstored, "last partial query tile never stored"),
    AF_PLANTED_FLASH("planted-gqa-interleaved", kGqaInterleaved, "GQA kv head h % Hkv instead of h / group"),
    AF_PLANTED_FLASH("planted-masked-pv-zero-weight", kMaskedPvZeroWeight,
                     "P.V over masked keys with weight 0 (NaN / Inf in a masked V reaches O)"),
};
static_assert(sizeof(kFlashBugs) / sizeof(kFlashBugs[0]) == attnfuzz_planted::kFlashBugCount,
              "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::flash_bugs() { return kFlashBugs; }

#undef AF_PLANTED_FLASH
