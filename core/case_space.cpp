// case_space.cpp - the case space (space::: edge values every driver draws from) and the sweep grid.
#include "attnfuzz/case.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numbers>
#include <stdexcept>

#include "core/case_internal.h"
#include "core/sequences.h"
#include "oracle/lowp.h"

namespace attnfuzz {

using namespace case_detail;

// ------------------------------------------------------------------------------------------ space

namespace space {

const std::vector<int64_t>& tile_sizes() {
  static const std::vector<int64_t> t{16, 32, 64, 128};
  return t;
}

std::vector<int64_t> edge_seq_lengths(int64_t max_len) {
  std::vector<int64_t> v{1, 2, 3, 5, 7, 13, 17, 31, 61, 113, 127, 203, 239};
  for (int64_t t : tile_sizes())
    for (int64_t d : {-1, 0, 1}) v.push_back(t + d);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::erase_if(v, [&](int64_t x) { return x > max_len; });
  return v;
}

std::vector<int64_t> edge_head_dims(int64_t max_d) {
  std::vector<int64_t> v{1, 2, 3, 5, 7, 17, 31, 33, 59, 63, 65, 96, 111, 127, 129, 255, 256};
  for (int64_t t : {4, 8, 16, 32, 64, 128}) v.push_back(t);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::erase_if(v, [&](int64_t x) { return x > max_d; });
  return v;
}

const std::vector<std::pair<int64_t, int64_t>>& head_configs() {
  static const std::vector<std::pair<int64_t, int64_t>> h{{1, 1}, {2, 2}, {4, 2}, {4, 1}, {6, 3}, {8, 1}};
  return h;
}

const std::vector<std::string>& mask_forms() {
  static const std::vector<std::string> m{"none",          "causal-br",       "causal-tl",
                                          "window:8,0-br", "window:8,0-tl",   "window:4,4-br",
                                          "window:0,0-br", "window:inf,3-br", "window:16,inf-tl"};
  return m;
}

const std::vector<double>& extreme_magnitudes() {
  static const std::vector<double> m{1, 10, 30, 80, 88, 89, 100, 300, 1000, 10000};
  return m;
}

const std::vector<int32_t>& dtypes() {
  static const std::vector<int32_t> d{AF_DTYPE_F32, AF_DTYPE_F16, AF_DTYPE_BF16, AF_DTYPE_FP8_E4M3,
                                      AF_DTYPE_FP8_E5M2};
  return d;
}

std::vector<double> lowp_extreme_magnitudes(int32_t dtype) {
  switch (dtype) {
    // f16: exp(11.1) > 65504; at D = 64 q.k > 65504 > scale * q.k; 300: a max or lse kept in f16 is 2^-11 x 300
    // off. bf16: exp(89) overflows; 1e3 and 1e4: a softmax statistic kept in bf16 loses 2^-9 relative, i.e.
    // 2 .. 20 in the exponent (issue 25).
    case AF_DTYPE_F16: return {11, 300, 3000};
    case AF_DTYPE_BF16: return {89, 1000, 10000};
    case AF_DTYPE_FP8_E4M3: return {6, 11};  // exp(6.1) > 448
    case AF_DTYPE_FP8_E5M2: return {11};     // exp(11) > 57344
    default: return {};
  }
}

std::vector<double> lowp_wide_v(int32_t dtype) {
  switch (dtype) {
    case AF_DTYPE_F16: return {2048};  // ~0.5 x 128 x 1536 ~ 98k > 65504 while |v| <= 2048
    case AF_DTYPE_FP8_E4M3: return {16};   // 0.75 x 128 x 16 > 448
    case AF_DTYPE_FP8_E5M2: return {1024};
    default: return {};  // bf16 shares fp32's range: no n |v| of a case passes it
  }
}

std::vector<double> lowp_uniform_widths(int32_t dtype) {
  if (dtype == AF_DTYPE_F32) return {};
  return {8 * std::ldexp(1.0, dtype_quantum_exp(dtype)), 2 * dtype_min_normal(dtype), dtype_max(dtype) / 4};
}

const std::vector<float>& fp8_descales() {
  static const std::vector<float> d{1.0f, 0.5f, 2.0f, 0.125f, 8.0f, 0.375f, 3.25f, 0.01171875f, 0x1.2p-9f};
  return d;
}

const std::vector<SpecialKind>& special_kinds() {
  static const std::vector<SpecialKind> k{SpecialKind::kNaN,    SpecialKind::kPosInf,
                                          SpecialKind::kNegInf, SpecialKind::kSubnormal,
                                          SpecialKind::kHuge,   SpecialKind::kNegZero};
  return k;
}

const std::vector<SpecialKind>& special_kinds(ValueDomain d) {
  auto in = [](ValueDomain dom) {
    std::vector<SpecialKind> k;
    for (SpecialKind x : special_kinds())
      if (special_in_domain(x, dom)) k.push_back(x);
    return k;
  };
  static const std::vector<SpecialKind> finite = in(ValueDomain::kFinite),
                                        activations = in(ValueDomain::kActivations);
  return d == ValueDomain::kFinite ? finite : d == ValueDomain::kActivations ? activations : special_kinds();
}

}  // namespace space

// ------------------------------------------------------------------------------------------ sweep

namespace {
// The grid's cases of domain d: under activations those fit_value_domain leaves alone (case.h sweep_grid).
std::vector<Case> in_value_domain(std::vector<Case> grid, ValueDomain d) {
  if (d != ValueDomain::kActivations) return grid;
  std::erase_if(grid, [](const Case& c) {
    Case fit = c;
    fit_value_domain(fit);
    return describe(fit) != describe(c);
  });
  return grid;
}
}  // namespace

std::vector<Case> sweep_grid(uint64_t base_seed, ValueDomain domain, int32_t dtype, Pass pass) {
  std::vector<Case> grid;
  auto add = [&](std::string label, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                 int64_t dv, const std::string& mask, ValueSpec values = {}) {
    Case c;
    c.problem = make_problem(b, hq, hkv, sq, sk, d, dv);
    if (std::string e = parse_mask(mask, c.problem); !e.empty()) throw std::logic_error(e);
    if (dtype != AF_DTYPE_F32) {
      c.problem.dtype = dtype;
      label = std::string(dtype_name(dtype)) + "-" + label;
    }
    c.values = std::move(values);
    c.values.domain = domain;
    c.pass = pass;
    std::replace(label.begin(), label.end(), ':', '=');  // labels stay usable in file names
    std::replace(label.begin(), label.end(), ',', '.');
    c.label = std::move(label);
    c.seed = grid_seed(base_seed, c.label);
    grid.push_back(std::move(c));
  };
  auto sp = [](const std::string& text) {
    SpecialValue s;
    if (std::string e = parse_special(text, s); !e.empty()) throw std::logic_error(e);
    return s;
  };
  auto dist = [](Distribution k, double param) {
    ValueSpec v;
    v.dist = {k, param};
    return v;
  };
  auto L = [](const char* prefix, int64_t sq, int64_t sk, const std::string& mask) {
    return std::string(prefix) + "-" + std::to_string(sq) + "x" + std::to_string(sk) + "-" + mask;
  };

  // The classics.
  add("1x1-d64-none", 1, 1, 1, 1, 1, 64, 64, "none");
  add("1x1-d1-causal-br", 1, 1, 1, 1, 1, 1, 1, "causal-br");
  for (const char* m : {"none", "causal-br", "causal-tl"}) {
    add(L("flash", 7, 13, m) + "-d59", 1, 1, 1, 7, 13, 59, 59, m);
    add(L("flash", 13, 7, m) + "-d59", 1, 1, 1, 13, 7, 59, 59, m);
  }
  // Tails around every tile size, square.
  for (int64_t t : space::tile_sizes())
    for (int64_t s : {t - 1, t, t + 1})
      for (const char* m : {"none", "causal-br"}) add(L("tail", s, s, m) + "-d64", 1, 1, 1, s, s, 64, 64, m);
  // Sq != Sk both ways (awkward pairs from flash-attention's tests), every mask alignment.
  const std::pair<int64_t, int64_t> pairs[] = {{1, 129},  {129, 1},  {17, 65},  {65, 17},
                                               {33, 100}, {100, 33}, {113, 203}};
  for (auto [sq, sk] : pairs)
    for (const char* m : {"none", "causal-br", "causal-tl"})
      add(L("rect", sq, sk, m) + "-d32", 1, 1, 1, sq, sk, 32, 32, m);
  // Head dims: odd, prime, tile +- 1 (Sq = Sk = 37 so the sequence tails are odd too).
  for (int64_t d : {1, 3, 17, 31, 33, 59, 63, 65, 111, 127, 128})
    add("headdim-37x37-d" + std::to_string(d), 1, 1, 1, 37, 37, d, d, "causal-br");
  add("dv-40x40-d64-dv32", 1, 1, 1, 40, 40, 64, 32, "none");
  add("dv-40x40-d32-dv64", 1, 1, 1, 40, 40, 32, 64, "causal-br");
  add("dv-40x40-d59-dv17", 1, 1, 1, 40, 40, 59, 17, "causal-tl");
  // Heads: GQA / MQA, and batch.
  for (auto [hq, hkv] : space::head_configs())
    if (hq > 1)
      add("heads-" + std::to_string(hq) + "q" + std::to_string(hkv) + "kv-33x33", 1, hq, hkv, 33, 33, 32, 32,
          "causal-br");
  add("batch-3x2h-20x45", 3, 2, 2, 20, 45, 16, 16, "causal-br");
  add("batch-2x4q2kv-45x20", 2, 4, 2, 45, 20, 16, 16, "causal-tl");
  // Masks: windows, fully masked rows, Sk = 0.
  for (const char* m : {"window:8,0-br", "window:8,0-tl", "window:4,4-br", "window:0,0-br", "window:inf,3-br",
                        "window:16,inf-tl"})
    add(L("window", 50, 70, m), 1, 1, 1, 50, 70, 32, 32, m);
  add("masked-rows-40x9-causal-br", 1, 2, 1, 40, 9, 32, 32, "causal-br");        // rows 0..30 fully masked
  add("masked-rows-9x3-window:0,0-tl", 1, 1, 1, 9, 3, 16, 16, "window:0,0-tl");  // rows 3..8 fully masked
  add("masked-rows-20x40-window:0,2-tl-far", 1, 1, 1, 20, 40, 16, 16, "window:0,2-tl");
  add("empty-keys-5x0-none", 1, 1, 1, 5, 0, 16, 16, "none");
  add("empty-keys-17x0-causal-br", 1, 2, 1, 17, 0, 33, 33, "causal-br");
  // Magnitudes: scores near and beyond exp's overflow without max subtraction, late maxima.
  for (double mag : {10.0, 30.0, 88.0, 300.0})
    add("extreme-" + shortest(mag) + "-65x65", 1, 1, 1, 65, 65, 64, 64, "causal-br",
        dist(Distribution::kExtreme, mag));
  add("normal-0.01-65x65", 1, 1, 1, 65, 65, 64, 64, "none", dist(Distribution::kNormal, 0.01));
  add("uniform-100-33x33", 1, 1, 1, 33, 33, 32, 32, "none", dist(Distribution::kUniform, 100));
  // Special values: masked ones must not reach any output, visible ones must poison exactly their rows.
  auto special = [&](std::string text, int64_t sq, int64_t sk, const std::string& mask) {
    ValueSpec v;
    v.specials.push_back(sp(text));
    if (!special_in_domain(v.specials.back().kind, domain)) {  // finite: huge at the same place instead
      v.specials.back().kind = SpecialKind::kHuge;
      text = to_string(v.specials.back());
    }
    add("special-" + text + "-" + std::to_string(sq) + "x" + std::to_string(sk) + "-" + mask, 1, 1, 1, sq, sk,
        32, 32, mask, v);
  };
  special("nan@k:hidden*3", 20, 40, "causal-tl");
  special("nan@v:hidden*3", 20, 40, "causal-tl");
  special("inf@k:hidden*2", 20, 40, "window:4,0-tl");
  special("nan@k:masked", 33, 33, "causal-br");
  special("inf@v:masked*2", 33, 33, "causal-br");
  special("nan@q:masked*2", 40, 9, "causal-br");
  special("nan@v:visible", 33, 33, "causal-br");
  special("-inf@k:visible", 33, 33, "none");
  special("inf@q:visible", 17, 17, "none");
  special("subnormal@q:random*64", 33, 33, "none");
  special("subnormal@v:random*64", 33, 33, "causal-br");
  special("-0@k:random*16", 17, 17, "none");
  if (dtype == AF_DTYPE_F32) return in_value_domain(std::move(grid), domain);
  // Low precision (issue 13): exp overflow in the format without max subtraction, the format's subnormal
  // range, its smallest normals and values near its largest, long rows (half-precision sums drift with Sk).
  for (double mag : space::lowp_extreme_magnitudes(dtype))
    add("lowp-extreme-" + shortest(mag) + "-65x65", 1, 1, 1, 65, 65, 64, 64, "causal-br",
        dist(Distribution::kExtreme, mag));
  for (double a : space::lowp_uniform_widths(dtype))
    add("lowp-uniform-" + shortest(a) + "-33x33", 1, 1, 1, 33, 33, 32, 32, "none", dist(Distribution::kUniform, a));
  add("lowp-long-4x2048", 1, 1, 1, 4, 2048, 32, 32, "none", dist(Distribution::kVBias, 1));
  add("lowp-long-3x700-causal-br", 1, 1, 1, 3, 700, 16, 16, "causal-br", dist(Distribution::kVBias, 1));
  add("lowp-long-uniform-4x1024", 1, 1, 1, 4, 1024, 32, 32, "none");
  // Near-uniform weights with one-signed large v: the un-normalised accumulator sum exp(s - m) v passes the
  // format's range before the division by the row sum (f16: 128 keys x ~768 ~ 98k > 65504).
  for (double a : space::lowp_wide_v(dtype))
    add("lowp-widev-" + shortest(a) + "-8x128", 1, 1, 1, 8, 128, 32, 32, "none", dist(Distribution::kWideV, a));
  special("huge@v:visible*4", 33, 33, "none");
  special("subnormal@k:random*64", 33, 33, "causal-br");
  if (dtype == AF_DTYPE_FP8_E4M3 || dtype == AF_DTYPE_FP8_E5M2) {
    // Descale factors: q and k scale the scores, v the output; o_scale keeps |O| o_scale in range.
    const float triples[][4] = {{0.5f, 0.25f, 2.0f, 0.25f},
                                {0.375f, 3.25f, 0.125f, 1.0f},
                                {4.0f, 2.0f, 0.01171875f, 8.0f},
                                {0.125f, 0.125f, 8.0f, 0.0625f}};
    int n = 0;
    for (const auto& t : triples) {
      for (const char* m : {"none", "causal-br"}) {
        add("descale-" + std::to_string(n) + "-40x70-" + m, 1, 2, 1, 40, 70, 32, 32, m,
            dist(Distribution::kUniform, n % 2 ? 4.0 : 1.0));
        Problem& p = grid.back().problem;
        p.q_descale = t[0], p.k_descale = t[1], p.v_descale = t[2], p.o_scale = t[3];
      }
      ++n;
    }
  }
  return in_value_domain(std::move(grid), domain);
}

namespace {
// The custom masks of one variant-sweep case: patterns, broadcast and block size (cycled over the grid).
struct MaskChoice {
  std::string pattern, block_pattern, broadcast;
  int32_t bq = 16, bk = 16;
};
MaskChoice cycled_masks(size_t n) {
  static const char* const kPatterns[] = {"random:0.5", "rows:0.6", "random:0.1", "ones", "random:0.9"};
  static const char* const kBlocks[] = {"mixed", "empty-some", "partial", "full", "mixed", "mixed"};
  static const char* const kBcast[] = {"", "h", "b", "bh", "i", "", ""};
  static const int32_t kSizes[][2] = {{16, 16}, {8, 32}, {32, 8}, {4, 4}, {64, 64}, {1, 3}};
  return {kPatterns[n % 5], kBlocks[n % 6], kBcast[n % 7], kSizes[n % 6][0], kSizes[n % 6][1]};
}
// mask-dense and mask-bits are exclusive: a sweep that asks for both alternates between them.
uint32_t mask_bits_of_case(uint32_t masks, size_t n) {
  constexpr uint32_t kBoth = AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS;
  if ((masks & kBoth) == kBoth) masks &= ~(n % 2 ? AF_VARIANT_MASK_DENSE : AF_VARIANT_MASK_BITS);
  return masks;
}

// Labels usable as file names ("random:0.5" -> "random=0.5").
std::vector<Case> relabel(std::vector<Case>& grid) {
  for (Case& c : grid) {
    std::replace(c.label.begin(), c.label.end(), ':', '=');
    std::replace(c.label.begin(), c.label.end(), ',', '.');
  }
  return std::move(grid);
}

// The custom masks' own edges: rows and blocks fully masked, every key hidden, bit rows whose length is not a
// multiple of 8, a custom mask equal to the causal pattern, sparse long rows, GQA and batch broadcasts, blocks
// larger than the problem and of one key.
template <class Finish, class Base>
void mask_sweep_edges(Finish& finish, Base& base, const std::string& dt, uint32_t masks) {
  struct Edge {
    const char* label;
    int64_t b, hq, hkv, sq, sk, d;
    const char* mask;
    const char* pattern;
    const char* blocks;
    const char* bcast;
    int32_t bq, bk;
  };
  static const Edge kEdges[] = {
      {"rows-masked-24x40", 1, 2, 1, 24, 40, 32, "causal-br", "rows:0.5", "empty-some", "", 8, 8},
      {"all-hidden-16x16", 1, 2, 1, 16, 16, 16, "none", "zeros", "zeros", "", 16, 16},
      {"ones-13x29", 1, 2, 2, 13, 29, 16, "window:5,3-br", "ones", "full", "", 4, 8},
      {"causal-pattern-20x37", 1, 1, 1, 20, 37, 16, "none", "causal", "partial", "", 8, 8},
      {"bits-odd-sk-9x45", 2, 2, 1, 9, 45, 16, "none", "random:0.5", "mixed", "", 3, 5},
      {"bits-sk-8-7x8", 1, 1, 1, 7, 8, 16, "causal-tl", "random:0.7", "mixed", "", 2, 2},
      {"sparse-long-6x300", 1, 1, 1, 6, 300, 16, "none", "random:0.02", "empty-some", "", 2, 32},
      {"gqa-bcast-h-3x4h-19x37", 3, 4, 2, 19, 37, 16, "none", "random:0.4", "mixed", "h", 8, 8},
      {"bcast-bhi-2x2h-11x23", 2, 2, 1, 11, 23, 16, "causal-br", "random:0.6", "partial", "bhi", 4, 4},
      {"block-bigger-5x7", 1, 1, 1, 5, 7, 8, "none", "random:0.5", "partial", "", 64, 64},
      {"block-1x1-12x12", 1, 1, 1, 12, 12, 8, "none", "random:0.5", "mixed", "", 1, 1},
      {"decode-1x100", 1, 4, 1, 1, 100, 32, "causal-br", "random:0.3", "empty-some", "", 1, 16},
  };
  for (const Edge& e : kEdges) {
    MaskChoice mc{e.pattern, e.blocks, e.bcast, e.bq, e.bk};
    finish(base(e.b, e.hq, e.hkv, e.sq, e.sk, e.d, e.mask), dt + e.label, 30.0f, "", mc);
  }
  (void)masks;
}
}  // namespace

namespace {
// kv-shared's own edges (docs/semantics.md "Shared K/V latent"): DeepSeek's D = 576, Dv = 512 at decode (1
// token, MTP's 2, 8) with 16 and 128 query heads per KV head, one key (a V stepped by the wrong row length is
// right on key 0 only), no key, a window, a paged cache (pages of 16, shuffled, a used length below the
// other's); small D > Dv pairs with GQA and causal masks for the kernels of D <= 128.
template <class Finish, class Base>
void kv_shared_sweep_edges(Finish& finish, Base& base, const std::string& dt, bool paged) {
  struct Edge {
    const char* label;
    int64_t b, hq, hkv, sq, sk, d, dv;
    const char* mask;
  };
  static const Edge kEdges[] = {
      {"mla-16h1-1x40", 1, 16, 1, 1, 40, 576, 512, "causal-br"},
      {"mla-128h1-1x9", 1, 128, 1, 1, 9, 576, 512, "none"},
      {"mla-mtp-2x16h1-2x33", 2, 16, 1, 2, 33, 576, 512, "causal-br"},
      {"mla-window-8h1-8x70", 1, 8, 1, 8, 70, 576, 512, "window:32,0-br"},
      {"mla-one-key-4h1-1x1", 1, 4, 1, 1, 1, 576, 512, "none"},
      {"mla-no-key-4h1-1x0", 1, 4, 1, 1, 0, 576, 512, "none"},
      {"d40-dv32-gqa-8h2-3x37", 2, 8, 2, 3, 37, 40, 32, "none"},
      {"d72-dv64-4h1-5x100", 1, 4, 1, 5, 100, 72, 64, "causal-br"},
      {"d24-dv8-2h1-17x17", 1, 2, 1, 17, 17, 24, 8, "causal-tl"},
  };
  auto shaped = [&](const Edge& e) {
    Case c = base(e.b, e.hq, e.hkv, e.sq, e.sk, e.d, e.mask);
    c.problem = reshape_problem(c.problem, e.b, e.sq, e.sk, e.d, e.dv);
    c.problem.scale = default_scale(e.d);
    return c;
  };
  for (const Edge& e : kEdges) finish(shaped(e), dt + e.label, 30.0f, "");
  if (!paged) return;  // the other variants are checked on dense batches only
  Case pg = shaped({"", 2, 8, 1, 2, 40, 576, 512, "causal-br"});
  pg.problem.kv_layout = AF_SEQ_PAGED;
  pg.problem.page_size = 16;
  pg.seqs.used = {40, 23};
  pg.seqs.page_order = 9;
  if (std::string e = set_sequence_fields(pg); !e.empty()) throw std::logic_error(e);
  finish(std::move(pg), dt + "mla-paged-2x8h1-2x40", 30.0f, "");
}
}  // namespace

std::vector<Case> variant_sweep_grid(uint32_t bits, uint64_t base_seed, ValueDomain domain, int32_t dtype, Pass pass) {
  bits &= ~AF_VARIANT_DROPOUT;  // the score variants' sweep; dropout has its own (dropout_sweep_grid)
  std::vector<Case> grid;
  const std::string name = variant_names(bits);
  const uint32_t score = bits & kScoreVariants, masks = bits & kMaskVariants,
                 hd = bits & AF_VARIANT_HEAD_DESCALE, kvs = bits & AF_VARIANT_KV_SHARED;
  // Per-head descales are fp8 only: their sweep is fp8-e4m3 unless fp8-e5m2 is asked for.
  if (hd && dtype != AF_DTYPE_FP8_E4M3 && dtype != AF_DTYPE_FP8_E5M2) dtype = AF_DTYPE_FP8_E4M3;
  static const char* const kBroadcasts[] = {"", "b", "h", "bh", "i", "j", "bhi"};
  size_t n = 0, nm = 0;
  auto finish_masked = [&](Case c, const std::string& label, float softcap, const std::string& bcast,
                           const MaskChoice& mc) {
    if (kvs && c.problem.head_dim_v > c.problem.head_dim) return;  // V cannot be a view of a shorter K row
    if (std::string e = set_variants(c, score | hd | kvs, softcap, bcast); !e.empty())
      throw std::logic_error(e);
    if (hd && label.find("descale-per-batch") != std::string::npos) set_descale_strides(c.problem, true);
    if (masks) {
      const uint32_t mb = mask_bits_of_case(masks, nm++);
      if (std::string e = set_mask_variants(c, mb, mc.pattern, mc.block_pattern, mc.broadcast, mc.bq, mc.bk);
          !e.empty())
        throw std::logic_error(e);
    }
    c.label = name + "-" + label;
    c.seed = grid_seed(base_seed, c.label);
    grid.push_back(std::move(c));
  };
  auto finish = [&](Case c, const std::string& label, float softcap, const std::string& bcast) {
    finish_masked(std::move(c), label, softcap, bcast, cycled_masks(nm));
  };
  for (Case& c : sweep_grid(base_seed, domain, dtype, pass)) {
    const std::string label = c.label;
    finish(std::move(c), label, 30.0f, kBroadcasts[n++ % 7]);
  }
  // The variants' own edges (dtype and pass as the grid's).
  auto base = [&](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, const std::string& mask,
                  ValueDist dist = {}) {
    Case c;
    c.problem = make_problem(b, hq, hkv, sq, sk, d, d);
    if (std::string e = parse_mask(mask, c.problem); !e.empty()) throw std::logic_error(e);
    c.problem.dtype = dtype;
    c.values.dist = dist;
    c.values.domain = domain;
    c.pass = pass;
    return c;
  };
  const std::string dt = dtype == AF_DTYPE_F32 ? "" : std::string(dtype_name(dtype)) + "-";
  if (masks) mask_sweep_edges(finish_masked, base, dt, masks);
  if (hd) {
    // Per-head descales: GQA and MQA with per-KV-head descales that differ (a kernel reading k's or v's at
    // the query head, or head 0's for all, is off), every head equal (= per-tensor), descales per batch, the
    // menu's extremes.
    auto given = [&](Case c, const std::string& label, std::vector<float> qd, std::vector<float> kd,
                     std::vector<float> vd) {
      c.variants.q_descale_h = std::move(qd), c.variants.k_descale_h = std::move(kd);
      c.variants.v_descale_h = std::move(vd);
      finish(std::move(c), label, 30.0f, "");
    };
    given(base(1, 4, 2, 33, 47, 32, "none"), dt + "descale-gqa-4h2-33x47", {1, 2, 0.125f, 3.25f}, {0.5f, 8},
          {2, 0.375f});
    given(base(2, 6, 3, 17, 40, 16, "causal-br"), dt + "descale-gqa-6h3-17x40",
          {0.5f, 1, 2, 0.125f, 8, 0.375f}, {1, 8, 0.125f}, {0.375f, 3.25f, 1});
    given(base(1, 4, 1, 9, 30, 32, "none"), dt + "descale-mqa-4h1-9x30", {8, 0.5f, 1, 2}, {0.375f}, {3.25f});
    given(base(1, 2, 2, 20, 20, 32, "causal-tl"), dt + "descale-equal-2h2-20x20", {2, 2}, {0.5f, 0.5f},
          {8, 8});
    given(base(1, 2, 2, 16, 24, 16, "none"), dt + "descale-extremes-2h2-16x24", {0x1.2p-9f, 8},
          {8, 0.01171875f}, {0x1.2p-9f, 3.25f});
    finish(base(3, 4, 2, 19, 37, 16, "none"), dt + "descale-per-batch-3x4h2-19x37", 30.0f, "");
  }
  if (kvs)
    kv_shared_sweep_edges(finish, base, dt,
                          !(score | masks | hd) && dtype != AF_DTYPE_FP8_E4M3 && dtype != AF_DTYPE_FP8_E5M2);
  if (!score) return in_value_domain(relabel(grid), domain);
  // Softcap: logits far past the cap (|s / cap| >> 88 would overflow an exp-based tanh), small and large caps.
  for (double mag : {100.0, 1000.0, 1e4})
    for (float cap : {5.0f, 50.0f})
      finish(base(1, 2, 1, 33, 47, 32, "causal-br", {Distribution::kExtreme, mag}),
             dt + "cap" + shortest(cap) + "-extreme" + shortest(mag) + "-33x47", cap, "");
  finish(base(1, 1, 1, 20, 20, 16, "none"), dt + "cap-huge-20x20", 1e30f, "");
  // Sinks: fully masked rows (the sink alone), a window whose first KV split is empty, large logits.
  finish(base(1, 2, 1, 40, 9, 32, "causal-br"), dt + "masked-rows-40x9", 30.0f, "");
  finish(base(1, 2, 2, 8, 200, 32, "window:16,0-br"), dt + "window-8x200-empty-front", 30.0f, "h");
  finish(base(1, 1, 1, 1, 0, 16, "none"), dt + "empty-keys-1x0", 30.0f, "");
  {
    Case c = base(1, 4, 2, 24, 24, 32, "causal-tl");
    c.variants.sink_range = 20;  // a sink that dominates some rows
    finish(std::move(c), dt + "sink-range20-24x24", 30.0f, "bh");
  }
  {
    Case c = base(1, 3, 1, 16, 16, 16, "none");
    c.variants.sinks = {-std::numeric_limits<float>::infinity(), 0.5f, 3.0f};
    if (bits & AF_VARIANT_SINK) finish(std::move(c), dt + "sinks-neginf-16x16", 30.0f, "");
  }
  // ALiBi: head counts that are not powers of two (the paper's interleaved rule), long rows, both alignments.
  for (int64_t hq : {12, 6, 8})
    for (const char* m : {"causal-br", "none"})
      finish(base(1, hq, hq == 8 ? 2 : hq / 3, 17, 70, 16, m), dt + "heads" + std::to_string(hq) + "-17x70-" + m, 30.0f,
             hq == 12 ? "b" : "");
  // Bias: broadcast forms over batch and GQA, and -inf / large values (a float mask).
  for (const char* bc : {"", "b", "h", "bh", "i", "j", "bhij"}) {
    std::string l = bc[0] ? bc : "none";
    finish(base(3, 4, 2, 19, 37, 16, "none"), dt + "bcast-" + l + "-3x4h-19x37", 30.0f, bc);
  }
  {
    Case c = base(2, 2, 1, 9, 13, 16, "none");
    c.variants.bias_range = 50;  // bias dominates the scores
    finish(std::move(c), dt + "bias-range50-9x13", 30.0f, "h");
  }
  if ((bits & AF_VARIANT_BIAS) && domain == ValueDomain::kIeee) {
    Case c = base(1, 1, 1, 6, 10, 8, "none");
    if (std::string e = set_variants(c, score, 30.0f, "bh"); !e.empty()) throw std::logic_error(e);
    Rng rng(base_seed ^ 0x62696173ull, 7);
    c.variants.bias.assign(static_cast<size_t>(bias_elements(c.problem)), 0.0f);
    for (size_t e = 0; e < c.variants.bias.size(); ++e)  // a float mask: -inf above the diagonal
      c.variants.bias[e] = (e % 10) > (e / 10) + 4 ? -std::numeric_limits<float>::infinity()
                                                    : static_cast<float>(rng.uniform01() - 0.5);
    finish(std::move(c), dt + "float-mask-6x10", 30.0f, "bh");
  }
  return in_value_domain(relabel(grid), domain);
}

}  // namespace attnfuzz
