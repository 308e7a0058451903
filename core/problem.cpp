// problem.cpp - construction, validation, mask algebra and text forms of af_problem.
#include "attnfuzz/problem.h"

#include "attnfuzz/dropout.h"

#include <charconv>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "core/masks.h"

namespace attnfuzz {

float default_scale(int64_t head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

void set_contiguous_strides(Problem& p) {
  p.q_stride[2] = p.head_dim;
  p.q_stride[1] = p.heads_q * p.head_dim;
  p.q_stride[0] = p.seq_q * p.q_stride[1];
  p.k_stride[2] = p.head_dim;
  p.k_stride[1] = p.heads_kv * p.head_dim;
  p.k_stride[0] = p.seq_k * p.k_stride[1];
  p.v_stride[2] = p.head_dim_v;
  p.v_stride[1] = p.heads_kv * p.head_dim_v;
  p.v_stride[0] = p.seq_k * p.v_stride[1];
  if (kv_shared(p)) std::copy(std::begin(p.k_stride), std::end(p.k_stride), std::begin(p.v_stride));
  p.o_stride[2] = p.head_dim_v;
  p.o_stride[1] = p.heads_q * p.head_dim_v;
  p.o_stride[0] = p.seq_q * p.o_stride[1];
  p.lse_stride[2] = 1;
  p.lse_stride[1] = p.seq_q;
  p.lse_stride[0] = p.heads_q * p.seq_q;
  // Gradients are laid out like the tensors they belong to (dO and dQ like o and q, dK / dV like k / v).
  for (int i = 0; i < 3; ++i) {
    p.do_stride[i] = p.o_stride[i];
    p.dq_stride[i] = p.q_stride[i];
    p.dk_stride[i] = p.k_stride[i];
    p.dv_stride[i] = p.v_stride[i];
  }
}

void share_kv(Problem& p) {
  p.variants |= AF_VARIANT_KV_SHARED;
  std::copy(std::begin(p.k_stride), std::end(p.k_stride), std::begin(p.v_stride));
}

Problem make_problem(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_k,
                     int64_t head_dim, int64_t head_dim_v) {
  Problem p{};
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seq_q = seq_q;
  p.seq_k = seq_k;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim_v;
  p.scale = head_dim > 0 ? default_scale(head_dim) : 1.0f;
  p.mask_kind = AF_MASK_NONE;
  p.mask_align = AF_ALIGN_BOTTOM_RIGHT;
  p.window_left = AF_UNBOUNDED;
  p.window_right = AF_UNBOUNDED;
  p.dtype = AF_DTYPE_F32;
  p.q_descale = p.k_descale = p.v_descale = p.o_scale = 1.0f;
  p.q_layout = p.kv_layout = AF_SEQ_DENSE;
  set_contiguous_strides(p);
  return p;
}

Problem reshape_problem(const Problem& p, int64_t batch, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                        int64_t head_dim_v) {
  return reshape_problem(p, batch, p.heads_q, p.heads_kv, seq_q, seq_k, head_dim, head_dim_v);
}

Problem reshape_problem(const Problem& p, int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q,
                        int64_t seq_k, int64_t head_dim, int64_t head_dim_v) {
  Problem v = make_problem(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v);
  v.scale = p.scale;
  v.mask_kind = p.mask_kind;
  v.mask_align = p.mask_align;
  v.window_left = p.window_left;
  v.window_right = p.window_right;
  v.dtype = p.dtype;
  v.q_descale = p.q_descale;
  v.k_descale = p.k_descale;
  v.v_descale = p.v_descale;
  v.o_scale = p.o_scale;
  std::copy(std::begin(p.tunables), std::end(p.tunables), std::begin(v.tunables));
  // Score variants (issue 28): the same variants; the bias keeps its broadcast dimensions, contiguous in the others.
  v.variants = p.variants;
  v.softcap = p.softcap;
  if (p.variants & AF_VARIANT_BIAS) (void)set_bias_strides(v, bias_broadcast(p));
  // Dropout (issue 29): the same p, generator, seed and offset; the tool's contiguous mask strides.
  if (p.variants & AF_VARIANT_DROPOUT)
    (void)set_dropout(v, p.dropout_p, p.dropout_rng, p.dropout_seed, p.dropout_offset);
  // Custom masks likewise (contiguous rows of the new Sk; the same block sizes).
  v.block_q = p.block_q, v.block_k = p.block_k;
  if (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) (void)set_mask_strides(v, mask_broadcast(p));
  if (p.variants & AF_VARIANT_BLOCK_SPARSE) (void)set_block_mask_strides(v, block_mask_broadcast(p));
  if (p.variants & AF_VARIANT_HEAD_DESCALE) set_descale_strides(v, p.descale_stride[0] != 0);
  if (kv_shared(p)) share_kv(v);
  return v;
}

namespace {
// Largest offset + 1 reachable through the strides (0 if any extent is 0).
int64_t span(const int64_t* stride, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
  if (n0 <= 0 || n1 <= 0 || n2 <= 0 || n3 <= 0) return 0;
  return (n0 - 1) * stride[0] + (n1 - 1) * stride[1] + (n2 - 1) * stride[2] + n3;
}
bool mul_ok(int64_t a, int64_t b, int64_t limit) { return a == 0 || b <= limit / a; }

// Whether distinct indices reach distinct offsets sum(idx_i * stride_i), idx_i < extent_i (an output
// tensor must not alias itself: two elements written to one address make a correct kernel look racy).
// Nested strides (each at least the span of the smaller ones) are injective; anything else is decided by
// enumeration when small, else refused. Extents and strides are validated (>= 0, spans <= kMaxElements).
bool injective(std::vector<std::pair<int64_t, int64_t>> dims) {  // (stride, extent)
  std::erase_if(dims, [](const auto& d) { return d.second <= 1; });
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // largest offset + 1 over the dimensions so far
  bool nested = true;
  for (const auto& [stride, extent] : dims) {
    if (stride < span) nested = false;
    span += (extent - 1) * stride;
  }
  if (nested) return true;
  constexpr int64_t kEnumerate = int64_t{1} << 24;
  int64_t total = 1;
  for (const auto& d : dims) {
    if (!mul_ok(total, d.second, kEnumerate)) return false;
    total *= d.second;
  }
  if (span > kEnumerate) return false;
  std::vector<bool> seen(static_cast<size_t>(span));
  std::vector<int64_t> idx(dims.size(), 0);
  for (int64_t n = 0; n < total; ++n) {
    int64_t off = 0;
    for (size_t i = 0; i < dims.size(); ++i) off += idx[i] * dims[i].first;
    if (seen[static_cast<size_t>(off)]) return false;
    seen[static_cast<size_t>(off)] = true;
    for (size_t i = 0; i < dims.size() && ++idx[i] == dims[i].second; ++i) idx[i] = 0;
  }
  return true;
}

std::string strides_text(const int64_t* s) {
  return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + "]";
}
}  // namespace

// Sequence layouts (ABI v2): packed [total, H, D] (stride[0] unused), paged [num_pages, page_size, H, D].
int64_t q_elements(const Problem& p) {
  if (p.q_layout == AF_SEQ_PACKED) return span(p.q_stride, 1, p.total_q, p.heads_q, p.head_dim);
  return span(p.q_stride, p.batch, p.seq_q, p.heads_q, p.head_dim);
}
int64_t o_elements(const Problem& p) {
  if (p.q_layout == AF_SEQ_PACKED) return span(p.o_stride, 1, p.total_q, p.heads_q, p.head_dim_v);
  return span(p.o_stride, p.batch, p.seq_q, p.heads_q, p.head_dim_v);
}
namespace {
int64_t kv_elements(const Problem& p, const int64_t* stride, int64_t dim) {
  if (p.kv_layout == AF_SEQ_PACKED) return span(stride, 1, p.total_k, p.heads_kv, dim);
  if (p.kv_layout == AF_SEQ_PAGED) return span(stride, p.num_pages, p.page_size, p.heads_kv, dim);
  return span(stride, p.batch, p.seq_k, p.heads_kv, dim);
}
}  // namespace
int64_t k_elements(const Problem& p) { return kv_elements(p, p.k_stride, p.head_dim); }
int64_t v_elements(const Problem& p) { return kv_elements(p, p.v_stride, p.head_dim_v); }
int64_t lse_elements(const Problem& p) {
  if (p.batch <= 0 || p.heads_q <= 0 || p.seq_q <= 0) return 0;
  return (p.batch - 1) * p.lse_stride[0] + (p.heads_q - 1) * p.lse_stride[1] +
         (p.seq_q - 1) * p.lse_stride[2] + 1;
}

namespace {
// The sequence-layout fields (ABI v2) taken alone; the per-sequence lengths are checked with the case
// (validate_sequences in core/sequences.cpp).
std::string validate_layout(const Problem& p) {
  const int64_t lim = kMaxElements;
  if (p.q_layout != AF_SEQ_DENSE && p.q_layout != AF_SEQ_PACKED)
    return "q layout " + std::to_string(p.q_layout) + " is unknown (dense or packed)";
  if (p.kv_layout != AF_SEQ_DENSE && p.kv_layout != AF_SEQ_PACKED && p.kv_layout != AF_SEQ_PAGED)
    return "kv layout " + std::to_string(p.kv_layout) + " is unknown (dense, packed or paged)";
  if (p.reserved1 != 0) return "reserved1 must be 0";
  if (p.q_layout == AF_SEQ_PACKED) {
    if (p.total_q < p.seq_q || p.total_q > lim) return "total_q = " + std::to_string(p.total_q) + " is invalid";
  } else if (p.total_q != 0) {
    return "total_q is set but q is dense";
  }
  if (p.kv_layout == AF_SEQ_PACKED) {
    if (p.total_k < p.seq_k || p.total_k > lim) return "total_k = " + std::to_string(p.total_k) + " is invalid";
  } else if (p.total_k != 0) {
    return "total_k is set but K/V are not packed";
  }
  if (p.kv_layout == AF_SEQ_PAGED) {
    if (p.page_size < 1 || p.page_size > 1024)
      return "page size " + std::to_string(p.page_size) + " is invalid: need 1 .. 1024";
    if (p.num_pages < 1 || p.num_pages > lim / p.page_size)
      return "num_pages = " + std::to_string(p.num_pages) + " is invalid";
    if (p.max_pages_per_seq < 1 || p.max_pages_per_seq > p.num_pages)
      return "max_pages_per_seq = " + std::to_string(p.max_pages_per_seq) + " is invalid";
    if (p.kv_capacity != p.max_pages_per_seq * p.page_size || p.seq_k > p.kv_capacity)
      return "paged K/V need kv_capacity = max_pages_per_seq * page_size >= seq_k (seqused_k is required)";
  } else if (p.page_size != 0 || p.num_pages != 0 || p.max_pages_per_seq != 0) {
    return "page fields are set but K/V are not paged";
  }
  if (p.kv_capacity < 0 || p.kv_capacity > lim) return "kv_capacity = " + std::to_string(p.kv_capacity) + " is invalid";
  if (p.kv_layout == AF_SEQ_DENSE && p.kv_capacity != 0 && p.kv_capacity != p.seq_k)
    return "a dense KV cache has kv_capacity = sk";
  return {};
}
}  // namespace

namespace {
// The problem-level variant fields (the values are the case's: validate_variants in core/case.cpp).
std::string validate_variant_fields(const Problem& p) {
  if (p.variants & ~AF_VARIANTS_KNOWN) return "the problem uses an unknown variant bit";
  if (p.variants & AF_VARIANT_SOFTCAP)
    if (!(p.softcap > 0) || !std::isfinite(p.softcap)) return "softcap must be a finite value > 0";
  if (p.variants & AF_VARIANT_BIAS) {
    for (int64_t st : p.bias_stride)
      if (st < 0) return "a bias stride is negative";
    if (bias_elements(p) > kMaxElements) return "the bias tensor would exceed " + std::to_string(kMaxElements) + " elements";
  }
  if (p.variants & AF_VARIANT_HEAD_DESCALE) {
    if (p.dtype != AF_DTYPE_FP8_E4M3 && p.dtype != AF_DTYPE_FP8_E5M2)
      return std::string("per-head descales (variant head-descale) apply to fp8 only, not ") +
             dtype_name(p.dtype);
    if (p.descale_stride[0] < 0 || p.descale_stride[1] < 0) return "a per-head descale stride is negative";
    if (p.descale_stride[1] == 0 && std::max(p.heads_q, p.heads_kv) > 1)
      return "the per-head descale head stride is 0: use the per-tensor descales";
    if (descale_h_elements(p, true) > kMaxElements) return "the per-head descales would exceed kMaxElements";
  }
  if (kv_shared(p)) {  // V is a view of K's rows (docs/semantics.md "Shared K/V latent")
    if (p.head_dim_v > p.head_dim)
      return "kv-shared (V the first Dv columns of K) needs Dv <= D, not Dv = " +
             std::to_string(p.head_dim_v) + " > D = " + std::to_string(p.head_dim);
    if (!std::equal(std::begin(p.k_stride), std::end(p.k_stride), std::begin(p.v_stride)))
      return "kv-shared needs v_stride = k_stride (V is a view of K's rows), not " +
             strides_text(p.v_stride) + " and " + strides_text(p.k_stride);
  }
  if (std::string e = validate_dropout(p); !e.empty()) return e;
  return validate_mask_fields(p);
}
}  // namespace

const char* variant_name(uint32_t bit) {
  switch (bit) {
    case AF_VARIANT_SINK: return "sink";
    case AF_VARIANT_SOFTCAP: return "softcap";
    case AF_VARIANT_ALIBI: return "alibi";
    case AF_VARIANT_BIAS: return "bias";
    case AF_VARIANT_MASK_DENSE: return "mask-dense";
    case AF_VARIANT_MASK_BITS: return "mask-bits";
    case AF_VARIANT_BLOCK_SPARSE: return "block-sparse";
    case AF_VARIANT_KV_SHARED: return "kv-shared";
    case AF_VARIANT_HEAD_DESCALE: return "head-descale";
    case AF_VARIANT_DROPOUT: return "dropout";
  }
  return "";
}

std::string variant_names(uint32_t bits) {
  if (!bits) return "none";
  std::string out;
  for (uint32_t bit = 1; bit && bit <= AF_VARIANTS_KNOWN; bit <<= 1)
    if (bits & bit) out += (out.empty() ? "" : "+") + std::string(variant_name(bit));
  return out;
}

std::string parse_variant_names(const std::string& text, uint32_t& out) {
  out = 0;
  if (text.empty() || text == "none") return {};
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find_first_of("+,", start);
    if (end == std::string::npos) end = text.size();
    const std::string name = text.substr(start, end - start);
    uint32_t found = 0;
    for (uint32_t bit = 1; bit <= AF_VARIANTS_KNOWN; bit <<= 1)
      if (name == variant_name(bit)) found = bit;
    if (!found)
      return "unknown variant '" + name +
             "' (sink, softcap, alibi, bias, dropout, mask-dense, mask-bits, block-sparse, head-descale, "
             "kv-shared)";
    out |= found;
    start = end + 1;
  }
  return {};
}

int64_t bias_elements(const Problem& p) {
  if (!(p.variants & AF_VARIANT_BIAS)) return 0;
  const int64_t ext[4] = {p.batch, p.heads_q, p.seq_q, p.seq_k};
  int64_t last = 0;
  for (int i = 0; i < 4; ++i) {
    if (ext[i] == 0) return 0;
    last += (ext[i] - 1) * p.bias_stride[i];
  }
  return last + 1;
}

int64_t descale_h_elements(const Problem& p, bool query) {
  const int64_t heads = query ? p.heads_q : p.heads_kv;
  if (!(p.variants & AF_VARIANT_HEAD_DESCALE) || p.batch <= 0 || heads <= 0) return 0;
  return (p.batch - 1) * p.descale_stride[0] + (heads - 1) * p.descale_stride[1] + 1;
}

void set_descale_strides(Problem& p, bool per_batch) {
  p.descale_stride[0] = per_batch ? p.heads_q : 0;
  p.descale_stride[1] = 1;
}

std::string set_bias_strides(Problem& p, const std::string& broadcast) {
  for (char c : broadcast)
    if (c != 'b' && c != 'h' && c != 'i' && c != 'j')
      return "bias broadcast '" + broadcast + "' is invalid: name dimensions among b, h, i, j (e.g. bh)";
  const int64_t ext[4] = {p.batch, p.heads_q, p.seq_q, p.seq_k};
  const char names[4] = {'b', 'h', 'i', 'j'};
  int64_t st = 1;
  for (int i = 3; i >= 0; --i) {
    if (broadcast.find(names[i]) != std::string::npos) {
      p.bias_stride[i] = 0;
    } else {
      p.bias_stride[i] = st;
      st *= std::max<int64_t>(ext[i], 1);
    }
  }
  return {};
}

std::string bias_broadcast(const Problem& p) {
  std::string out;
  const char names[4] = {'b', 'h', 'i', 'j'};
  for (int i = 0; i < 4; ++i)
    if (p.bias_stride[i] == 0) out += names[i];
  return out;
}

std::vector<float> alibi_default_slopes(int64_t heads) {
  auto pow2_slopes = [](int64_t n) {
    std::vector<double> s;
    for (int64_t h = 0; h < n; ++h) s.push_back(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n)));
    return s;
  };
  std::vector<double> s;
  if (heads >= 1) {
    int64_t P = 1;
    while (P * 2 <= heads) P *= 2;
    s = pow2_slopes(P);
    if (P < heads) {
      const std::vector<double> twice = pow2_slopes(2 * P);
      for (int64_t x = 0; x < heads - P; ++x) s.push_back(twice[static_cast<size_t>(2 * x)]);
    }
  }
  return std::vector<float>(s.begin(), s.end());
}

std::string validate(const Problem& p) {
  auto bad = [](const char* what, int64_t v, const char* need) {
    return std::string(what) + " = " + std::to_string(v) + " is invalid: " + need;
  };
  if (p.batch < 1) return bad("batch", p.batch, "need >= 1");
  if (p.heads_q < 1) return bad("heads", p.heads_q, "need >= 1");
  if (p.heads_kv < 1) return bad("kv-heads", p.heads_kv, "need >= 1");
  if (p.heads_q % p.heads_kv != 0)
    return "heads = " + std::to_string(p.heads_q) +
           " is not a multiple of kv-heads = " + std::to_string(p.heads_kv) + " (GQA/MQA need Hq % Hkv == 0)";
  if (p.seq_q < 1) return bad("sq", p.seq_q, "need >= 1");
  if (p.seq_k < 0) return bad("sk", p.seq_k, "need >= 0");
  if (p.head_dim < 1) return bad("d", p.head_dim, "need >= 1");
  if (p.head_dim_v < 1) return bad("dv", p.head_dim_v, "need >= 1");
  if (!std::isfinite(p.scale)) return "scale is not finite";
  if (p.dtype < AF_DTYPE_F32 || p.dtype > AF_DTYPE_FP8_E5M2) return "dtype " + std::to_string(p.dtype) + " is unknown";
  if (std::string e = validate_layout(p); !e.empty()) return e;
  if (std::string e = validate_descales(p); !e.empty()) return e;
  for (int32_t t : p.tunables)
    if (t < 0) return bad("tunable", t, "need >= 0 (0 = the kernel's default)");
  if (std::string e = validate_variant_fields(p); !e.empty()) return e;
  if (p.mask_kind != AF_MASK_NONE && p.mask_kind != AF_MASK_CAUSAL && p.mask_kind != AF_MASK_WINDOW)
    return "mask kind " + std::to_string(p.mask_kind) + " is unknown";
  if (p.mask_align != AF_ALIGN_TOP_LEFT && p.mask_align != AF_ALIGN_BOTTOM_RIGHT)
    return "mask alignment " + std::to_string(p.mask_align) + " is unknown";
  if (p.mask_kind == AF_MASK_WINDOW) {
    if (p.window_left < 0 && p.window_left != AF_UNBOUNDED)
      return bad("window left", p.window_left, "need >= 0 or inf");
    if (p.window_right < 0 && p.window_right != AF_UNBOUNDED)
      return bad("window right", p.window_right, "need >= 0 or inf");
  }
  // Sizes: every tensor must fit comfortably in memory and in int32 index arithmetic of kernels.
  const int64_t lim = kMaxElements;
  const int64_t dims[] = {p.batch, p.seq_q, p.seq_k, p.heads_q, p.head_dim, p.head_dim_v};
  for (int64_t d : dims)
    if (d > lim) return "a dimension exceeds " + std::to_string(lim);
  int64_t bh = p.batch;
  if (!mul_ok(bh, p.heads_q, lim)) return "batch x heads is too large";
  bh *= p.heads_q;
  if (!mul_ok(bh, std::max(p.seq_q, p.seq_k), lim) ||
      !mul_ok(bh * std::max(p.seq_q, p.seq_k), std::max(p.head_dim, p.head_dim_v), lim))
    return "the tensors would exceed " + std::to_string(lim) + " elements";
  for (const int64_t* s : {p.q_stride, p.k_stride, p.v_stride, p.o_stride, p.lse_stride})
    for (int i = 0; i < 3; ++i)
      if (s[i] < 0) return "a stride is negative";
  const int64_t ext[] = {q_elements(p), k_elements(p), v_elements(p), o_elements(p), lse_elements(p)};
  for (int64_t e : ext)
    if (e < 0 || e > lim) return "the strides span more than " + std::to_string(lim) + " elements";
  // Outputs must be injective (q, k and v may alias: they are only read).
  if (p.q_layout == AF_SEQ_PACKED) {
    if (!injective({{p.o_stride[1], p.total_q}, {p.o_stride[2], p.heads_q}, {1, p.head_dim_v}}))
      return "o strides " + strides_text(p.o_stride) + " overlap: distinct elements of packed o would share memory";
  } else if (!injective({{p.o_stride[0], p.batch},
                  {p.o_stride[1], p.seq_q},
                  {p.o_stride[2], p.heads_q},
                  {1, p.head_dim_v}}))
    return "o strides " + strides_text(p.o_stride) +
           " overlap: distinct elements of o [B, Sq, Hq, Dv] would share memory";
  if (!injective({{p.lse_stride[0], p.batch}, {p.lse_stride[1], p.heads_q}, {p.lse_stride[2], p.seq_q}}))
    return "lse strides " + strides_text(p.lse_stride) +
           " overlap: distinct elements of lse [B, Hq, Sq] would share memory";
  return {};
}

int64_t mask_offset(const Problem& p) {
  return p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? p.seq_k - p.seq_q : 0;
}
int64_t window_left(const Problem& p) { return p.mask_kind == AF_MASK_WINDOW ? p.window_left : AF_UNBOUNDED; }
int64_t window_right(const Problem& p) {
  if (p.mask_kind == AF_MASK_CAUSAL) return 0;
  return p.mask_kind == AF_MASK_WINDOW ? p.window_right : AF_UNBOUNDED;
}

KeyRange visible_keys(const Problem& p, int64_t i) {
  if (p.mask_kind == AF_MASK_NONE) return {0, p.seq_k};
  const int64_t c = i + mask_offset(p);  // key on the diagonal
  const int64_t l = window_left(p), r = window_right(p);
  int64_t first = l == AF_UNBOUNDED ? 0 : std::max<int64_t>(0, c - l);
  int64_t last = r == AF_UNBOUNDED ? p.seq_k : std::min<int64_t>(p.seq_k, c + r + 1);
  if (last < first) last = first;
  return {first, last};
}

bool visible(const Problem& p, int64_t i, int64_t j) {
  const KeyRange r = visible_keys(p, i);
  return j >= r.first && j < r.last;
}

uint32_t mask_support_bit(const Problem& p) {
  const bool br = p.mask_align == AF_ALIGN_BOTTOM_RIGHT;
  switch (p.mask_kind) {
    case AF_MASK_NONE:
      return AF_SUPPORTS_MASK_NONE;
    case AF_MASK_CAUSAL:
      return br ? AF_SUPPORTS_CAUSAL_BR : AF_SUPPORTS_CAUSAL_TL;
    default:
      return br ? AF_SUPPORTS_WINDOW_BR : AF_SUPPORTS_WINDOW_TL;
  }
}

namespace {
std::string side(int64_t v) { return v == AF_UNBOUNDED ? "inf" : std::to_string(v); }
bool parse_side(const std::string& s, int64_t& out) {
  if (s == "inf") {  // "-1" (AF_UNBOUNDED in the ABI) is refused as text: a typo must not mean "no limit"
    out = AF_UNBOUNDED;
    return true;
  }
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  return std::from_chars(s.data(), s.data() + s.size(), out).ec == std::errc();
}
}  // namespace

std::string mask_to_string(const Problem& p) {
  const char* al = p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? "-br" : "-tl";
  switch (p.mask_kind) {
    case AF_MASK_NONE:
      return "none";
    case AF_MASK_CAUSAL:
      return std::string("causal") + al;
    default:
      return "window:" + side(p.window_left) + "," + side(p.window_right) + al;
  }
}

std::string parse_mask(const std::string& text, Problem& p) {
  std::string t = text;
  int32_t align = AF_ALIGN_BOTTOM_RIGHT;
  auto ends = [&](const char* suf) {
    const std::string s(suf);
    if (t.size() >= s.size() && t.compare(t.size() - s.size(), s.size(), s) == 0) {
      t.resize(t.size() - s.size());
      return true;
    }
    return false;
  };
  if (ends("-tl"))
    align = AF_ALIGN_TOP_LEFT;
  else if (ends("-br"))
    align = AF_ALIGN_BOTTOM_RIGHT;
  const std::string err =
      "mask '" + text +
      "' is invalid: use none, causal, causal-tl, causal-br, window:L,R[-tl|-br] (L, R integers "
      "in [0, 10^18) or inf)";
  if (t == "none") {
    if (t.size() != text.size()) return err;
    p.mask_kind = AF_MASK_NONE;
    p.mask_align = AF_ALIGN_BOTTOM_RIGHT;
    p.window_left = p.window_right = AF_UNBOUNDED;
    return {};
  }
  if (t == "causal") {
    p.mask_kind = AF_MASK_CAUSAL;
    p.mask_align = align;
    p.window_left = AF_UNBOUNDED;
    p.window_right = 0;
    return {};
  }
  if (t.rfind("window:", 0) == 0) {
    const std::string body = t.substr(7);
    const auto comma = body.find(',');
    int64_t l, r;
    if (comma == std::string::npos || !parse_side(body.substr(0, comma), l) ||
        !parse_side(body.substr(comma + 1), r))
      return err;
    p.mask_kind = AF_MASK_WINDOW;
    p.mask_align = align;
    p.window_left = l;
    p.window_right = r;
    return {};
  }
  return err;
}

std::string validate_descale_value(float f) {
  // stored * descale must be exact in fp32 (fp8 has <= 4 significand bits): the oracle then judges the exact
  // real inputs.
  int e = 0;
  const double m = std::frexp(static_cast<double>(f), &e);
  const bool bits_ok = std::ldexp(m, 16) == std::nearbyint(std::ldexp(m, 16));
  if (!(f > 0) || !std::isfinite(f) || e < -15 || e > 17 || (e == 17 && m != 0.5) || !bits_ok)
    return "need a value in [2^-16, 2^16] with at most 16 significand bits";
  return {};
}

std::string validate_descales(const Problem& p) {
  const bool fp8 = p.dtype == AF_DTYPE_FP8_E4M3 || p.dtype == AF_DTYPE_FP8_E5M2;
  const char* names[] = {"q_descale", "k_descale", "v_descale", "o_scale"};
  const float f[] = {p.q_descale, p.k_descale, p.v_descale, p.o_scale};
  for (int i = 0; i < 4; ++i) {
    if (!fp8) {
      if (f[i] != 1.0f) return std::string(names[i]) + " other than 1 applies to fp8 only";
      continue;
    }
    // stored * descale must be exact in fp32 (fp8 has <= 4 significand bits): the oracle then judges the
    // exact real inputs; stored / o_scale must be exact: o_scale is a power of two.
    int e = 0;
    const double m = std::frexp(static_cast<double>(f[i]), &e);
    const bool bits_ok = i == 3 ? m == 0.5 : std::ldexp(m, 16) == std::nearbyint(std::ldexp(m, 16));
    if (!(f[i] > 0) || !std::isfinite(f[i]) || e < -15 || e > 17 || (e == 17 && m != 0.5) || !bits_ok)
      return std::string(names[i]) + " = " + std::to_string(f[i]) + " is invalid: " +
             (i == 3 ? "need a power of two in [2^-16, 2^16]"
                     : "need a value in [2^-16, 2^16] with at most 16 significand bits");
  }
  return {};
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case AF_DTYPE_F32:
      return "f32";
    case AF_DTYPE_F16:
      return "f16";
    case AF_DTYPE_BF16:
      return "bf16";
    case AF_DTYPE_FP8_E4M3:
      return "fp8-e4m3";
    case AF_DTYPE_FP8_E5M2:
      return "fp8-e5m2";
    default:
      return "unknown";
  }
}
std::optional<int32_t> parse_dtype(const std::string& text) {
  if (text == "f32" || text == "fp32" || text == "float32") return AF_DTYPE_F32;
  if (text == "f16" || text == "fp16" || text == "float16") return AF_DTYPE_F16;
  if (text == "bf16" || text == "bfloat16") return AF_DTYPE_BF16;
  if (text == "fp8-e4m3" || text == "e4m3" || text == "fp8") return AF_DTYPE_FP8_E4M3;
  if (text == "fp8-e5m2" || text == "e5m2") return AF_DTYPE_FP8_E5M2;
  return std::nullopt;
}

std::string describe(const Problem& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld Dv=%lld mask=%s scale=%.9g %s",
                (long long)p.batch, (long long)p.heads_q, (long long)p.heads_kv, (long long)p.seq_q,
                (long long)p.seq_k, (long long)p.head_dim, (long long)p.head_dim_v, mask_to_string(p).c_str(),
                (double)p.scale, dtype_name(p.dtype));
  std::string out = buf;
  if (p.dtype == AF_DTYPE_FP8_E4M3 || p.dtype == AF_DTYPE_FP8_E5M2) {
    std::snprintf(buf, sizeof buf, " descale=%.9g,%.9g,%.9g o_scale=%.9g", (double)p.q_descale,
                  (double)p.k_descale, (double)p.v_descale, (double)p.o_scale);
    out += buf;
  }
  // ABI v3 score variants, only when one is used.
  if (p.variants) {
    out += " variants=" + variant_names(p.variants);
    if (p.variants & AF_VARIANT_SOFTCAP) {
      std::snprintf(buf, sizeof buf, " softcap=%.9g", (double)p.softcap);
      out += buf;
    }
    if ((p.variants & AF_VARIANT_BIAS) && !bias_broadcast(p).empty()) out += " bias-bcast=" + bias_broadcast(p);
    if ((p.variants & AF_VARIANT_HEAD_DESCALE) && p.descale_stride[0] != 0) out += " descale-per-batch";
    out += describe_dropout(p);
    if (p.variants & AF_VARIANT_BLOCK_SPARSE) out += " blocks=" + std::to_string(p.block_q) + "x" + std::to_string(p.block_k);
  }
  // ABI v2 tunables, only when one is set (0 = the kernel's default).
  if (std::any_of(std::begin(p.tunables), std::end(p.tunables), [](int32_t t) { return t != 0; })) {
    out += " tunables=";
    for (int i = 0; i < AF_MAX_TUNABLES; ++i) out += (i ? "," : "") + std::to_string(p.tunables[i]);
  }
  return out;
}

}  // namespace attnfuzz
