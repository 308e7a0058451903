// features.cpp - semantic coverage features of a case and a check result, and the extra-counter section.
#include "fuzz/features.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "check/sequences.h"

namespace attnfuzz::fuzz {

namespace {

__attribute__((section("__libfuzzer_extra_counters"), used)) uint8_t g_counters[kCounterBytes];

// Feature id bases (each group's size in the comment; all ids < kFeaturesPerKernel).
enum Base : uint16_t {
  kTails = 0,       // 4 tiles x 2 axes x 5 classes = 40
  kDim = 40,        // D mod 4 (4), D mod 8 class (4), Dv != D, D == 1  = 10
  kMaskLeft = 56,   // mask 5 x left side 4 = 20
  kMaskRight = 76,  // mask 5 x right side 4 = 20
  kRows = 96,       // fully masked (3), Sk == 0, Sq<Sk / == / > (3), Sq == 1 = 8
  kMaxChanges =
      104,           // log2 bucket of running-max rises in a row (6), tiles with rises (4), max key last = 11
  kLogit = 120,      // 11
  kSpecial = 136,    // kind 6 x tensor 3 x where 3 = 54
  kShape = 192,      // heads MHA/GQA/MQA (3) x batch > 1 (2), padded layout (1), dist (3) = 10
  kVerdict = 208,    // pass, unsupported, outside, fail x 11 classes = 14
  kRatio = 224,      // 12
  kCrossMask = 256,  // mask 5 x tail16_k 5 x fully masked 2 = 50
  kCrossRatioMask = 306,     // ratio 12 x mask 5 = 60
  kCrossRatioTiles = 366,    // ratio 12 x max-change tiles 4 = 48
  kCrossSpecialMask = 414,   // special kind 6 x mask 5 = 30
  kCrossDistLogit = 444,     // dist 3 x logit 11 = 33
  kDtype = 488,              // dtype 5 (kCrossDistLogit spans 4 dists x 11 since vbias)
  kCrossDtypeVerdict = 493,  // dtype 5 x pass / fail / other 3 = 15
  kSeq = 508,  // sequence layouts: layout 6, k lengths mod 16 / 32 classes 10, q lengths mod 16 5,
               // zero-length, single-token, one long among short, page size 5, shuffled, spare pages, partial
               // last page, used < slots, decode = 34
  kPass = 542,        // pass fwd / bwd / fwdbwd 3 x fully masked 3 = 9 (issue 14)
  kGradTensor = 551,  // a backward failure's tensor: dQ, dK, dV = 3
  kPassRatio = 554,   // backward passes: ratio 12
  // Score variants (issue 28): the variant set 16, softcap regime max|s| / cap (< 1, < 10, < 88, >= 88) 4, a
  // sink above / near / below the row's max logit 3, bias broadcast dimensions 16, ALiBi over a head count
  // that is not a power of two 1, each variant x pass / fail 8
  kVariants = 566,
  kSoftcapRegime = 582,
  kSinkRegime = 586,
  kBiasBroadcast = 589,
  kAlibiOddHeads = 605,
  kVariantVerdict = 606,
  // Custom masks (issue 28 item 4): the mask set (dense / bits / block-sparse) 8, the share of the mask_kind
  // interval they show (0, < 1/4, < 1/2, < 1, 1) 5, rows they hide entirely (none, some, all) 3, the block
  // values present (empty / full / partial) 8, broadcast dimensions (b, h, i) 8, a bit row of Sk % 8 != 0
  // keys 1, each mask variant x pass / fail 6
  kMaskSet = 614,
  kMaskShare = 622,
  kMaskHiddenRows = 627,
  kBlockValues = 630,
  kMaskBroadcast = 638,
  kBitsOddRow = 646,
  kMaskVerdict = 647,
  // Dropout (issue 29): generator 2 x p regime (0, < 0.3, < 0.9, >= 0.9) 4, an offset whose counters cross
  // 2^32 1
  kDropout = 653,
  kDropoutWrap = 661,
  // Per-head fp8 descales (issue 28 item 6): per batch or not 2 x the k/v descales of a query group's KV
  // heads (MHA: Hq = Hkv; GQA with one KV head; GQA with KV heads whose k descales differ; the same k
  // descales) 4
  kHeadDescale = 662,
  // MLA's shared K/V latent (issue 28 item 5): D - Dv (0, the rope part 64, other) 3 x MHA / GQA / one KV
  // head 3, DeepSeek's 576 / 512 1, Sk beyond the first chunk of 64 keys (a V stepped wrong drifts after it)
  // 1
  kKvShared = 670,
  kMlaDims = 679,
  kKvSharedLong = 680,
  kEnd = 681,
};
static_assert(kEnd <= kFeaturesPerKernel);

int tail_class(int64_t s, int64_t t) {
  if (s < t) return 0;
  const int64_t r = s % t;
  return r == 0 ? 1 : r == 1 ? 2 : r == t - 1 ? 3 : 4;
}

int side_class(int64_t w) { return w == AF_UNBOUNDED ? 3 : w == 0 ? 0 : w < 16 ? 1 : 2; }

int log2_bucket(int64_t n, int max) {
  int b = 0;
  while (n > 0 && b < max) {
    n >>= 1;
    ++b;
  }
  return b;
}

int logit_bucket(double m) {
  static const double edges[] = {1, 4, 16, 30, 88, 100, 300, 1e3, 1e4};
  if (!std::isfinite(m)) return 10;
  int b = 0;
  while (b < 9 && m >= edges[b]) ++b;
  return b;
}

}  // namespace

uint8_t* extra_counters() { return g_counters; }

void record_features(size_t slot, const std::vector<uint16_t>& ids) {
  uint8_t* base = g_counters + (slot % kKernelSlots) * kFeaturesPerKernel;
  for (uint16_t id : ids)
    if (id < kFeaturesPerKernel && base[id] < 255) ++base[id];
}

int ratio_bucket(double r) {
  if (!(r < 1e3)) return 11;  // also NaN
  static const double edges[] = {0x1p-20, 0x1p-15, 0x1p-10, 0x1p-6, 0x1p-3, 0.5, 1, 2, 10, 1e3};
  if (r <= 0) return 0;
  int b = 1;
  for (double e : edges) {
    if (r < e) return b;
    ++b;
  }
  return 11;
}

namespace {

// The features of a dense case (case_features without the sequence view).
CaseFeatures dense_case_features(const Case& c, const Tensors& t);

// Sequence-layout features (issue 15): which layout, per-sequence length residues and edge lists, pages.
void sequence_features(const Case& c, const Tensors& t, const std::function<void(int)>& add) {
  const Problem& p = c.problem;
  const std::string l = layout_name(p);
  static const char* kLayouts[] = {"varlen", "varlen-q", "varlen-k", "kvcache", "paged"};
  int li = 5;
  for (int i = 0; i < 5; ++i)
    if (l.rfind(kLayouts[i], 0) == 0) li = i;
  add(kSeq + li);
  std::vector<int64_t> kl, ql;
  for (int64_t b = 0; b < p.batch; ++b) {
    kl.push_back(seq_len_k(p, t, b));
    ql.push_back(seq_len_q(p, t, b));
  }
  for (int64_t x : kl) {
    add(kSeq + 6 + tail_class(x, 16));
    add(kSeq + 11 + tail_class(x, 32));
  }
  for (int64_t x : ql) add(kSeq + 16 + tail_class(x, 16));
  auto any = [](const std::vector<int64_t>& v, auto pred) { return std::any_of(v.begin(), v.end(), pred); };
  if (any(kl, [](int64_t x) { return x == 0; }) || any(ql, [](int64_t x) { return x == 0; })) add(kSeq + 21);
  if (any(kl, [](int64_t x) { return x == 1; }) || any(ql, [](int64_t x) { return x == 1; })) add(kSeq + 22);
  std::vector<int64_t> sorted = kl;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.size() > 1 && sorted.back() > 4 * std::max<int64_t>(1, sorted[sorted.size() / 2 - (sorted.size() % 2 == 0)]))
    add(kSeq + 23);
  if (p.kv_layout == AF_SEQ_PAGED) {
    add(kSeq + 24 + std::min(4, log2_bucket(p.page_size / 16, 5) - 1));
    if (c.seqs.page_order) add(kSeq + 29);
    if (c.seqs.spare_pages) add(kSeq + 30);
    if (any(kl, [&](int64_t x) { return x % p.page_size != 0; })) add(kSeq + 31);
    if (p.seq_q <= 8 && p.q_layout == AF_SEQ_DENSE) add(kSeq + 33);
  }
  for (int64_t b = 0; b < p.batch; ++b)
    if (seq_len_k(p, t, b) < seq_slots_k(p, t, b)) {
      add(kSeq + 32);
      break;
    }
}

}  // namespace

CaseFeatures case_features(const Case& c, const Tensors& t) {
  if (has_sequences(c.problem)) {  // the dense view's features, plus the layout's own
    Case v = c;
    v.problem = dense_view(c.problem, t);
    v.seqs = {};
    CaseFeatures f = case_features(v, sequence_view_tensors(c.problem, t));
    sequence_features(c, t, [&](int id) { f.ids.push_back(static_cast<uint16_t>(id)); });
    return f;
  }
  return dense_case_features(c, t);
}

namespace {
// The custom-mask features of a dense case (kMaskSet ..): visibility counted over every (b, h, i, j).
template <class Add>
void mask_features(const Problem& p, const Tensors& t, Add& add) {
  add(kMaskSet + static_cast<int>((p.variants >> 4) & 7));
  const VariantInputs in = t.variant_inputs();
  int64_t interval = 0, shown = 0, hidden_rows = 0, rows = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeyRange kr = visible_keys(p, i);
        if (kr.empty()) continue;
        int64_t n = 0;
        for (int64_t j = kr.first; j < kr.last; ++j) n += custom_visible(p, in, b, h, i, j);
        interval += kr.last - kr.first, shown += n, ++rows, hidden_rows += n == 0;
      }
  const double share = interval ? static_cast<double>(shown) / static_cast<double>(interval) : 1.0;
  add(kMaskShare + (shown == 0 ? 0 : share < 0.25 ? 1 : share < 0.5 ? 2 : share < 1 ? 3 : 4));
  add(kMaskHiddenRows + (hidden_rows == 0 ? 0 : hidden_rows < rows ? 1 : 2));
  if (p.variants & AF_VARIANT_BLOCK_SPARSE) {
    int seen = 0;
    for (uint8_t v : t.block_mask) seen |= v <= kBlockPartial ? 1 << v : 0;
    add(kBlockValues + seen);
  }
  const int64_t* st = (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) ? p.mask_stride : p.block_mask_stride;
  add(kMaskBroadcast + (st[0] == 0) + 2 * (st[1] == 0) + 4 * (st[2] == 0));
  if ((p.variants & AF_VARIANT_MASK_BITS) && p.seq_k % 8) add(kBitsOddRow);
}

CaseFeatures dense_case_features(const Case& c, const Tensors& t) {
  CaseFeatures f;
  const Problem& p = c.problem;
  auto add = [&](int id) { f.ids.push_back(static_cast<uint16_t>(id)); };
  const int64_t tiles[] = {16, 32, 64, 128};
  for (int i = 0; i < 4; ++i) {
    add(kTails + i * 10 + tail_class(p.seq_q, tiles[i]));
    add(kTails + i * 10 + 5 + tail_class(p.seq_k, tiles[i]));
  }
  f.tail16_k = tail_class(p.seq_k, 16);
  add(kDim + static_cast<int>(p.head_dim % 4));
  const int64_t d8 = p.head_dim % 8;
  add(kDim + 4 + (d8 == 0 ? 0 : d8 == 1 ? 1 : d8 == 7 ? 2 : 3));
  if (p.head_dim_v != p.head_dim) add(kDim + 8);
  if (p.head_dim == 1) add(kDim + 9);
  const bool br = p.mask_align == AF_ALIGN_BOTTOM_RIGHT;
  f.mask = p.mask_kind == AF_MASK_NONE ? 0 : p.mask_kind == AF_MASK_CAUSAL ? 1 + br : 3 + br;
  add(kMaskLeft + f.mask * 4 + side_class(window_left(p)));
  add(kMaskRight + f.mask * 4 + side_class(window_right(p)));
  // Rows: fully masked ones, and for a few sampled rows the running max over keys in order.
  int64_t masked_rows = 0;
  for (int64_t i = 0; i < p.seq_q; ++i) masked_rows += visible_keys(p, i).empty();
  f.fully_masked = masked_rows == 0 ? 0 : masked_rows == p.seq_q ? 2 : 1;
  add(kRows + f.fully_masked);
  if (p.seq_k == 0) add(kRows + 3);
  add(kRows + 4 + (p.seq_q < p.seq_k ? 0 : p.seq_q == p.seq_k ? 1 : 2));
  if (p.seq_q == 1) add(kRows + 7);
  std::vector<int64_t> rows{0, p.seq_q - 1, p.seq_q / 2};
  for (int64_t r : {15, 16, 31, 32, 63, 64})
    if (r < p.seq_q) rows.push_back(r);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  int64_t max_rises = 0, max_tiles = 0;
  bool max_last = false;
  double max_abs = 0;
  const bool have_values =
      t.q.size() == static_cast<size_t>(q_elements(p)) && t.k.size() == static_cast<size_t>(k_elements(p));
  for (int64_t h : {int64_t{0}, p.heads_q - 1}) {
    const int64_t hk = kv_head(p, h);
    for (int64_t i : rows) {
      if (!have_values) break;
      const KeyRange kr = visible_keys(p, i);
      double m = -INFINITY;
      int64_t rises = 0, rise_tiles = 0, last_tile = -1;
      for (int64_t j = kr.first; j < kr.last; ++j) {
        double s = 0;
        for (int64_t d = 0; d < p.head_dim; ++d)
          s += static_cast<double>(t.q[static_cast<size_t>(q_index(p, 0, i, h, d))]) *
               static_cast<double>(t.k[static_cast<size_t>(k_index(p, 0, j, hk, d))]);
        s *= static_cast<double>(p.scale);
        if (std::isnan(s) || std::isinf(s))
          max_abs = INFINITY;
        else
          max_abs = std::max(max_abs, std::abs(s));
        if (s > m) {
          if (j > kr.first) {
            ++rises;
            const int64_t tile = (j - kr.first) / 16;
            if (tile > 0 && tile != last_tile) {
              ++rise_tiles;
              last_tile = tile;
            }
            if (j == kr.last - 1) max_last = true;
          }
          m = s;
        }
      }
      max_rises = std::max(max_rises, rises);
      max_tiles = std::max(max_tiles, rise_tiles);
    }
  }
  add(kMaxChanges + log2_bucket(max_rises, 5));
  f.max_change_tiles = static_cast<int>(std::min<int64_t>(max_tiles, 3));
  add(kMaxChanges + 6 + f.max_change_tiles);
  if (max_last) add(kMaxChanges + 10);
  f.logit = logit_bucket(max_abs);
  add(kLogit + f.logit);
  // Special values: kind x tensor x where they landed (visible to every row / masked for some / hidden).
  const std::vector<int64_t> vis = key_visibility_counts(p);
  const auto& kinds = space::special_kinds();
  for (const PlacedSpecial& s : t.placed) {
    const int kind = static_cast<int>(std::find(kinds.begin(), kinds.end(), s.kind) - kinds.begin());
    int where;
    if (s.tensor == Tensor::kQ) {
      where = visible_keys(p, s.s).empty() ? 2 : 0;
    } else {
      const int64_t n = vis[static_cast<size_t>(s.s)];
      where = n == 0 ? 2 : n == p.seq_q ? 0 : 1;
    }
    add(kSpecial + (kind * 3 + static_cast<int>(s.tensor)) * 3 + where);
    f.special_kinds.push_back(kind);
  }
  const int hc = p.heads_q == p.heads_kv ? 0 : p.heads_kv == 1 ? 2 : 1;
  add(kShape + hc * 2 + (p.batch > 1));
  Problem cont = p;
  set_contiguous_strides(cont);
  if (q_elements(cont) != q_elements(p) || o_elements(cont) != o_elements(p)) add(kShape + 6);
  f.dist = static_cast<int>(c.values.dist.kind);
  add(kShape + 7 + f.dist);
  add(kCrossMask + (f.mask * 5 + f.tail16_k) * 2 + (f.fully_masked != 0));
  for (int k : f.special_kinds) add(kCrossSpecialMask + k * 5 + f.mask);
  add(kCrossDistLogit + f.dist * 11 + f.logit);
  f.dtype = std::clamp<int>(p.dtype, 0, 4);
  add(kDtype + f.dtype);
  f.pass = static_cast<int>(c.pass);
  add(kPass + f.pass * 3 + f.fully_masked);
  f.variants = p.variants & 0x0f;
  f.mask_variants = (p.variants >> 4) & 7;
  if (f.variants) {
    add(kVariants + static_cast<int>(f.variants));
    if (p.variants & AF_VARIANT_SOFTCAP) {
      const double r = std::isfinite(max_abs) ? max_abs / std::max(1e-30, static_cast<double>(p.softcap)) : 1e9;
      add(kSoftcapRegime + (r < 1 ? 0 : r < 10 ? 1 : r < 88 ? 2 : 3));
    }
    if ((p.variants & AF_VARIANT_SINK) && !t.sinks.empty()) {
      double smax = -1e300;
      for (float x : t.sinks) smax = std::max(smax, static_cast<double>(x));
      const double m = std::isfinite(max_abs) ? max_abs : 1e9;
      add(kSinkRegime + (smax > m ? 0 : smax > -m ? 1 : 2));
    }
    if (p.variants & AF_VARIANT_BIAS) {
      int bits = 0;
      for (int d = 0; d < 4; ++d) bits |= p.bias_stride[d] == 0 ? 1 << d : 0;
      add(kBiasBroadcast + bits);
    }
    if ((p.variants & AF_VARIANT_ALIBI) && (p.heads_q & (p.heads_q - 1))) add(kAlibiOddHeads);
  }
  if (p.variants & AF_VARIANT_DROPOUT) {
    const double dp = p.dropout_p;
    add(kDropout + (p.dropout_rng == AF_DROPOUT_RNG_PHILOX_FLASH ? 4 : 0) + (dp == 0 ? 0 : dp < 0.3 ? 1 : dp < 0.9 ? 2 : 3));
    const uint64_t last = p.dropout_offset + static_cast<uint64_t>(p.batch * p.heads_q) * 32;
    if ((p.dropout_offset >> 32) != (last >> 32)) add(kDropoutWrap);
  }
  if (p.variants & kMaskVariants) mask_features(p, t, add);
  if ((p.variants & AF_VARIANT_HEAD_DESCALE) && !t.k_descale_h.empty()) {
    int kind = p.heads_q == p.heads_kv ? 0 : p.heads_kv == 1 ? 1 : 3;
    for (float x : t.k_descale_h) kind = kind == 3 && x != t.k_descale_h[0] ? 2 : kind;
    add(kHeadDescale + (p.descale_stride[0] != 0 ? 4 : 0) + kind);
  }
  if (kv_shared(p)) {
    const int64_t rope = p.head_dim - p.head_dim_v;
    add(kKvShared +
        (rope == 0    ? 0
         : rope == 64 ? 1
                      : 2) *
            3 +
        (p.heads_kv == p.heads_q ? 0
         : p.heads_kv == 1       ? 2
                                 : 1));
    if (p.head_dim == 576 && p.head_dim_v == 512) add(kMlaDims);
    if (p.seq_k > 64) add(kKvSharedLong);
  }
  return f;
}

}  // namespace

std::vector<uint16_t> result_features(const CaseFeatures& cf, const CheckResult& r) {
  std::vector<uint16_t> ids = cf.ids;
  auto add = [&](int id) { ids.push_back(static_cast<uint16_t>(id)); };
  switch (r.verdict) {
    case Verdict::kPass:
      add(kVerdict + 0);
      break;
    case Verdict::kUnsupported:
      add(kVerdict + 1);
      break;
    case Verdict::kOutsideContract:
      add(kVerdict + 2);
      break;
    case Verdict::kFail:
      add(kVerdict + 3 + std::min(static_cast<int>(r.failure), 10));
      break;
  }
  add(kCrossDtypeVerdict + cf.dtype * 3 +
      (r.verdict == Verdict::kPass ? 0 : r.verdict == Verdict::kFail ? 1 : 2));
  if (r.verdict == Verdict::kPass || r.verdict == Verdict::kFail) {
    const int rb = ratio_bucket(r.max_ratio);
    add(kRatio + rb);
    add(kCrossRatioMask + rb * 5 + cf.mask);
    add(kCrossRatioTiles + rb * 4 + cf.max_change_tiles);
    if (cf.pass != 0) add(kPassRatio + rb);
  }
  for (int v = 0; v < 4; ++v)
    if ((cf.variants & (1u << v)) && (r.verdict == Verdict::kPass || r.verdict == Verdict::kFail))
      add(kVariantVerdict + v * 2 + (r.verdict == Verdict::kFail));
  for (int v = 0; v < 3; ++v)
    if ((cf.mask_variants & (1u << v)) && (r.verdict == Verdict::kPass || r.verdict == Verdict::kFail))
      add(kMaskVerdict + v * 2 + (r.verdict == Verdict::kFail));
  if (r.verdict == Verdict::kFail && !r.tensor.empty() && r.tensor[0] == 'd')
    add(kGradTensor + (r.tensor == "dQ" ? 0 : r.tensor == "dK" ? 1 : 2));
  return ids;
}

}  // namespace attnfuzz::fuzz
