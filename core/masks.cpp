// masks.cpp - custom masks (dense, bit-packed, block-sparse): sizes, strides, visibility, patterns, validation.
#include "core/masks.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "attnfuzz/case.h"
#include "attnfuzz/custom_mask.h"
#include "core/case_internal.h"

namespace attnfuzz {

namespace {

constexpr uint32_t kCustom = AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS;
constexpr int32_t kMaxBlock = 1 << 20;

int64_t ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }

// Bytes spanned by rows of `row` bytes with strides st over extents ext (b, h, i); 0 for an empty extent.
int64_t spanned(const int64_t st[3], const int64_t ext[3], int64_t row) {
  int64_t last = 0;
  for (int d = 0; d < 3; ++d) {
    if (ext[d] == 0) return 0;
    last += (ext[d] - 1) * st[d];
  }
  return row > 0 ? last + row : 0;
}

// Each non-zero stride (i, then h, then b) must step past everything the inner dimensions span, so two rows
// never share a byte unless a dimension is broadcast.
std::string check_nested(const char* what, const int64_t st[3], const int64_t ext[3], int64_t row) {
  static const char* const dims[3] = {"batch", "head", "row"};
  for (int d = 0; d < 3; ++d)
    if (st[d] < 0) return std::string(what) + " has a negative " + dims[d] + " stride";
  int64_t inner = row;
  for (int d = 2; d >= 0; --d) {
    if (st[d] != 0 && ext[d] > 1 && st[d] < inner)
      return std::string(what) + "'s " + dims[d] + " stride (" + std::to_string(st[d]) + " bytes) is shorter than " +
             (d == 2 ? "a row (" : "what one step spans (") + std::to_string(inner) + " bytes)";
    if (st[d] != 0) inner = std::max(inner, (ext[d] - 1) * st[d] + inner);
  }
  return {};
}

std::string set_strides(int64_t st[3], const int64_t ext[3], int64_t row, const std::string& broadcast,
                        const char* what) {
  for (char c : broadcast)
    if (c != 'b' && c != 'h' && c != 'i')
      return std::string(what) + " broadcast '" + broadcast + "' is invalid: name dimensions among b, h, i";
  const char names[3] = {'b', 'h', 'i'};
  int64_t step = row;
  for (int d = 2; d >= 0; --d) {
    if (broadcast.find(names[d]) != std::string::npos) {
      st[d] = 0;
    } else {
      st[d] = step;
      step *= std::max<int64_t>(ext[d], 1);
    }
  }
  return {};
}

std::string broadcast_of(const int64_t st[3]) {
  std::string out;
  const char names[3] = {'b', 'h', 'i'};
  for (int d = 0; d < 3; ++d)
    if (st[d] == 0) out += names[d];
  return out;
}

// "random:D" / "rows:D": the density D (returns false when text is not that pattern or D is not in [0, 1]).
bool density_pattern(const std::string& text, const char* name, double& d) {
  const std::string prefix = std::string(name) + ":";
  if (text.rfind(prefix, 0) != 0) return false;
  char* end = nullptr;
  const std::string num = text.substr(prefix.size());
  d = std::strtod(num.c_str(), &end);
  return !num.empty() && end && *end == 0 && d >= 0 && d <= 1;
}

}  // namespace

int64_t custom_mask_row_bytes(const Problem& p) {
  if (p.variants & AF_VARIANT_MASK_DENSE) return p.seq_k;
  if (p.variants & AF_VARIANT_MASK_BITS) return ceil_div(p.seq_k, 8);
  return 0;
}

int64_t custom_mask_bytes(const Problem& p) {
  const int64_t ext[3] = {p.batch, p.heads_q, p.seq_q};
  return spanned(p.mask_stride, ext, custom_mask_row_bytes(p));
}

int64_t query_blocks(const Problem& p) {
  return (p.variants & AF_VARIANT_BLOCK_SPARSE) ? ceil_div(p.seq_q, p.block_q) : 0;
}
int64_t key_blocks(const Problem& p) {
  return (p.variants & AF_VARIANT_BLOCK_SPARSE) ? ceil_div(p.seq_k, p.block_k) : 0;
}

int64_t block_mask_bytes(const Problem& p) {
  const int64_t ext[3] = {p.batch, p.heads_q, query_blocks(p)};
  return spanned(p.block_mask_stride, ext, key_blocks(p));
}

bool custom_visible(const Problem& p, const VariantInputs& in, int64_t b, int64_t h, int64_t i, int64_t j) {
  return af_custom_visible(&p, in.custom_mask, in.block_mask, b, h, i, j) != 0;
}

bool key_visible(const Problem& p, const VariantInputs& in, int64_t b, int64_t h, int64_t i, int64_t j) {
  return visible(p, i, j) && custom_visible(p, in, b, h, i, j);
}

std::vector<int64_t> seen_keys(const Problem& p, const VariantInputs& in, int64_t b, int64_t h, int64_t i) {
  const KeyRange kr = visible_keys(p, i);
  std::vector<int64_t> keys;
  for (int64_t j = kr.first; j < kr.last; ++j)
    if (key_visible(p, in, b, h, i, j)) keys.push_back(j);
  return keys;
}

std::string set_mask_strides(Problem& p, const std::string& broadcast) {
  const int64_t ext[3] = {p.batch, p.heads_q, p.seq_q};
  return set_strides(p.mask_stride, ext, std::max<int64_t>(custom_mask_row_bytes(p), 1), broadcast, "mask");
}

std::string set_block_mask_strides(Problem& p, const std::string& broadcast) {
  const int64_t ext[3] = {p.batch, p.heads_q, query_blocks(p)};
  return set_strides(p.block_mask_stride, ext, std::max<int64_t>(key_blocks(p), 1), broadcast, "block mask");
}

std::string mask_broadcast(const Problem& p) { return broadcast_of(p.mask_stride); }
std::string block_mask_broadcast(const Problem& p) { return broadcast_of(p.block_mask_stride); }

std::string validate_mask_fields(const Problem& p) {
  if ((p.variants & kCustom) == kCustom) return "mask-dense and mask-bits are exclusive: one custom mask per problem";
  if (p.variants & kCustom) {
    const int64_t ext[3] = {p.batch, p.heads_q, p.seq_q};
    const char* what = (p.variants & AF_VARIANT_MASK_DENSE) ? "the dense custom mask" : "the bit-packed custom mask";
    if (std::string e = check_nested(what, p.mask_stride, ext, custom_mask_row_bytes(p)); !e.empty()) return e;
    if (custom_mask_bytes(p) > kMaxElements) return std::string(what) + " would exceed " + std::to_string(kMaxElements) + " bytes";
  }
  if (p.variants & AF_VARIANT_BLOCK_SPARSE) {
    if (p.block_q < 1 || p.block_k < 1 || p.block_q > kMaxBlock || p.block_k > kMaxBlock)
      return "block-sparse block sizes must be in [1, " + std::to_string(kMaxBlock) + "] (block_q " +
             std::to_string(p.block_q) + ", block_k " + std::to_string(p.block_k) + ")";
    const int64_t ext[3] = {p.batch, p.heads_q, query_blocks(p)};
    if (std::string e = check_nested("the block mask", p.block_mask_stride, ext, key_blocks(p)); !e.empty()) return e;
    if (block_mask_bytes(p) > kMaxElements) return "the block mask would exceed " + std::to_string(kMaxElements) + " bytes";
  }
  return {};
}

std::string validate_mask_pattern(const std::string& text, bool custom) {
  double d = 0;
  if (custom) {
    if (text == "ones" || text == "zeros" || text == "causal" || density_pattern(text, "random", d) ||
        density_pattern(text, "rows", d))
      return {};
    return "custom mask pattern '" + text + "' is invalid (random:D, rows:D with D in [0, 1], ones, zeros, causal)";
  }
  if (text == "mixed" || text == "full" || text == "partial" || text == "empty-some" || text == "zeros") return {};
  return "block mask pattern '" + text + "' is invalid (mixed, full, partial, empty-some, zeros)";
}

void generate_custom_mask(const Problem& p, const std::string& pattern, Rng& rng, std::vector<uint8_t>& out) {
  out.assign(static_cast<size_t>(custom_mask_bytes(p)), 0xA5);  // gaps: a pattern a wrong stride reads as noise
  const bool bits = p.variants & AF_VARIANT_MASK_BITS;
  const int64_t nb = p.mask_stride[0] ? p.batch : 1, nh = p.mask_stride[1] ? p.heads_q : 1;
  const int64_t ni = p.mask_stride[2] ? p.seq_q : std::min<int64_t>(p.seq_q, 1);
  double density = 1;
  const bool rows = density_pattern(pattern, "rows", density);
  if (!rows && !density_pattern(pattern, "random", density)) density = pattern == "zeros" ? 0 : 1;
  const int64_t off = p.seq_k - p.seq_q;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < ni; ++i) {
        uint8_t* row = out.data() + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2];
        const bool empty_row = rows && rng.below(4) == 0;
        if (bits) std::fill(row, row + custom_mask_row_bytes(p), uint8_t{0});
        for (int64_t j = 0; j < p.seq_k; ++j) {
          bool vis;
          if (pattern == "causal") vis = j <= i + off;
          else if (pattern == "ones" || pattern == "zeros") vis = density > 0;
          else vis = !empty_row && rng.uniform01() < density;
          if (!bits) row[j] = vis ? 1 : 0;
          else if (vis) row[j >> 3] |= static_cast<uint8_t>(1u << (j & 7));
        }
      }
}

void generate_block_mask(const Problem& p, const std::string& pattern, Rng& rng, std::vector<uint8_t>& out) {
  out.assign(static_cast<size_t>(block_mask_bytes(p)), 0);
  const int64_t nb = p.block_mask_stride[0] ? p.batch : 1, nh = p.block_mask_stride[1] ? p.heads_q : 1;
  const int64_t nq = p.block_mask_stride[2] ? query_blocks(p) : std::min<int64_t>(query_blocks(p), 1);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t qb = 0; qb < nq; ++qb)
        for (int64_t kb = 0; kb < key_blocks(p); ++kb) {
          uint8_t v = kBlockEmpty;
          if (pattern == "mixed") v = static_cast<uint8_t>(rng.below(3));
          else if (pattern == "full") v = kBlockFull;
          else if (pattern == "partial") v = kBlockPartial;
          else if (pattern == "empty-some") v = rng.below(4) == 0 ? kBlockEmpty : static_cast<uint8_t>(1 + rng.below(2));
          out[static_cast<size_t>(b * p.block_mask_stride[0] + h * p.block_mask_stride[1] +
                                  qb * p.block_mask_stride[2] + kb)] = v;
        }
}

std::string set_mask_variants(Case& c, uint32_t bits, const std::string& mask_pattern,
                              const std::string& block_pattern, const std::string& broadcast, int32_t block_q,
                              int32_t block_k) {
  if (bits & ~kMaskVariants) return "set_mask_variants takes mask-dense, mask-bits and block-sparse only";
  Problem& p = c.problem;
  p.variants = (p.variants & ~kMaskVariants) | bits;
  for (int64_t& st : p.mask_stride) st = 0;
  for (int64_t& st : p.block_mask_stride) st = 0;
  p.block_q = p.block_k = 0;
  c.variants.custom_mask.clear();
  c.variants.block_mask.clear();
  if (bits & kCustom) {
    if (std::string e = set_mask_strides(p, broadcast); !e.empty()) return e;
    if (std::string e = validate_mask_pattern(mask_pattern, true); !e.empty()) return e;
    c.variants.mask_pattern = mask_pattern;
  }
  if (bits & AF_VARIANT_BLOCK_SPARSE) {
    p.block_q = block_q;
    p.block_k = block_k;
    if (std::string e = set_block_mask_strides(p, broadcast); !e.empty()) return e;
    if (std::string e = validate_mask_pattern(block_pattern, false); !e.empty()) return e;
    c.variants.block_pattern = block_pattern;
  }
  return validate_mask_fields(p);
}

std::string validate_mask_values(const Case& c) {
  const Problem& p = c.problem;
  const VariantSpec& vs = c.variants;
  if (!(p.variants & kCustom) && !vs.custom_mask.empty()) return "custom mask bytes are given but the problem has no custom mask";
  if (!(p.variants & AF_VARIANT_BLOCK_SPARSE) && !vs.block_mask.empty())
    return "block mask bytes are given but the problem is not block-sparse";
  if (std::string e = validate_mask_pattern(vs.mask_pattern, true); !e.empty()) return e;
  if (std::string e = validate_mask_pattern(vs.block_pattern, false); !e.empty()) return e;
  auto count = [](const char* what, size_t have, int64_t need) -> std::string {
    if (static_cast<int64_t>(have) == need) return {};
    return std::string(what) + " holds " + std::to_string(have) + " bytes, the problem's strides need " + std::to_string(need);
  };
  if (!vs.custom_mask.empty())
    if (auto m = count("the custom mask", vs.custom_mask.size(), custom_mask_bytes(p)); !m.empty()) return m;
  if (!vs.block_mask.empty()) {
    if (auto m = count("the block mask", vs.block_mask.size(), block_mask_bytes(p)); !m.empty()) return m;
    for (uint8_t v : vs.block_mask)
      if (v > kBlockPartial) return "a block mask byte is " + std::to_string(v) + ": need 0 (empty), 1 (full) or 2 (partial)";
  }
  return {};
}

std::string describe_masks(const Case& c) {
  const Problem& p = c.problem;
  const VariantSpec& vs = c.variants;
  std::string t;
  if (p.variants & kCustom) {
    t += vs.custom_mask.empty() ? " custom-mask=" + vs.mask_pattern : " custom-mask=given";
    if (!mask_broadcast(p).empty()) t += "/bcast=" + mask_broadcast(p);
  }
  if (p.variants & AF_VARIANT_BLOCK_SPARSE) {
    t += " blocks=" + std::to_string(p.block_q) + "x" + std::to_string(p.block_k) + ":" +
         (vs.block_mask.empty() ? vs.block_pattern : std::string("given"));
    if (!block_mask_broadcast(p).empty()) t += "/bcast=" + block_mask_broadcast(p);
  }
  return t;
}

void generate_masks(const Case& c, Tensors& out) {
  const Problem& p = c.problem;
  if (p.variants & kCustom) {
    if (!c.variants.custom_mask.empty()) {
      out.custom_mask = c.variants.custom_mask;
    } else {
      Rng rng(c.seed, 10);
      generate_custom_mask(p, c.variants.mask_pattern, rng, out.custom_mask);
    }
  }
  if (p.variants & AF_VARIANT_BLOCK_SPARSE) {
    if (!c.variants.block_mask.empty()) {
      out.block_mask = c.variants.block_mask;
    } else {
      Rng rng(c.seed, 11);
      generate_block_mask(p, c.variants.block_pattern, rng, out.block_mask);
    }
  }
}

}  // namespace attnfuzz
