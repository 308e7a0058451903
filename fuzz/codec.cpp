// codec.cpp - the fuzz input's byte format: total decoding of bytes into cases, exact encoding, in_domain.
#include "fuzz/codec.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <tuple>

#include "attnfuzz/dropout.h"
#include "fuzz/codec_shared.h"

namespace attnfuzz::fuzz {

namespace detail {

const ModelPreset* preset_of(const FuzzLimits& l) {
  if (l.preset.empty()) return nullptr;
  for (const ModelPreset& m : model_presets())
    if (l.preset == m.name) return &m;
  return nullptr;
}

void preset_mask(Problem& p, const ModelPreset& m, int64_t max_seq) {
  // A window shorter than the fuzzed lengths can reach is kept as it is (gpt-oss's 128 keys); a longer one
  // keeps its share of the context at p's Sk (gemma-2's 4096 of 8192: Sk / 2), as in the preset sweep.
  Problem want = preset_problem(m, p.seq_q,
                                m.window_left != AF_UNBOUNDED && m.window_left < max_seq ? m.seq_k : p.seq_k);
  p.mask_kind = want.mask_kind;
  p.mask_align = want.mask_kind == AF_MASK_NONE ? AF_ALIGN_TOP_LEFT : want.mask_align;
  p.window_left = want.mask_kind == AF_MASK_WINDOW ? want.window_left : AF_UNBOUNDED;
  p.window_right = want.mask_kind == AF_MASK_WINDOW ? want.window_right : AF_UNBOUNDED;
}

std::vector<std::pair<int64_t, int64_t>> head_menu(const FuzzLimits& l) {
  if (const ModelPreset* m =
          preset_of(l)) {  // its heads, then fewer KV heads of the same group size (GQA kept)
    std::vector<std::pair<int64_t, int64_t>> out;
    const int64_t group = m->heads_q / m->heads_kv;
    for (int64_t hkv = m->heads_kv; hkv >= 1; hkv /= 2) {
      out.emplace_back(group * hkv, hkv);
      if (hkv % 2) break;
    }
    if (m->heads_kv == 1)  // MQA: fewer query heads, one KV head
      for (int64_t hq = m->heads_q / 2; hq >= 8; hq /= 2) out.emplace_back(hq, 1);
    return out;
  }
  std::vector<std::pair<int64_t, int64_t>> m{{1, 1}, {1, 1}};
  for (auto hc : space::head_configs())
    if (hc.first <= l.max_heads) m.push_back(hc);
  return m;
}

const std::vector<float>& scale_menu() {
  static const std::vector<float> m{1.f, 0.5f, 2.f, 0.125f, 8.f, 1e-3f, 30.f, -1.f, 0.f, 1e-20f};
  return m;
}
const std::vector<float>& o_scale_menu() {
  static const std::vector<float> m{1.f, 0.5f, 2.f, 0.125f, 8.f, 0.0625f};
  return m;
}
const std::vector<double>& param_menu(Distribution d) {
  static const std::vector<double> plain{1, 0.5, 2, 4, 10, 100, 1e-3, 1e3, 1e-20, 1e18};
  return d == Distribution::kExtreme ? space::extreme_magnitudes() : plain;
}

const std::vector<float>& softcap_menu() {
  static const std::vector<float> m = {30.0f, 50.0f, 5.0f, 1.0f, 20.0f, 0.5f, 1e4f};
  return m;
}
const std::vector<double>& dropout_p_menu() {
  static const std::vector<double> m = {0.1, 0.0, 0.01, 0.2, 0.5, 0.9, 0.999};
  return m;
}
const std::vector<uint64_t>& dropout_offset_menu() {
  static const std::vector<uint64_t> m = {0, 12345, (uint64_t{1} << 32) - 40, (uint64_t{1} << 32) + 7, uint64_t{1} << 40};
  return m;
}
const std::vector<double>& sink_range_menu() {
  static const std::vector<double> m = {2, 0.5, 10, 50};
  return m;
}
const std::vector<double>& merge_shift_menu() {
  static const std::vector<double> m = {0, -1e4, -200, 150, -INFINITY};
  return m;
}
const std::vector<int64_t>& merge_pad_menu() {
  static const std::vector<int64_t> m = {0, 1, 3, 5};
  return m;
}
void fit_merge(Case& c) {
  if (!is_merge(c.problem) || c.merge.cuts.size() < 2) return;
  const int64_t sk = c.problem.seq_k;
  for (int64_t& x : c.merge.cuts) x = std::min(x, sk);
  c.merge.cuts.front() = 0;
  c.merge.cuts.back() = sk;
  for (size_t i = 1; i < c.merge.cuts.size(); ++i) c.merge.cuts[i] = std::max(c.merge.cuts[i], c.merge.cuts[i - 1]);
  (void)set_merge_fields(c);
}
const std::vector<double>& bias_range_menu() {
  static const std::vector<double> m = {1, 0.1, 10, 100};
  return m;
}
uint8_t broadcast_bits(const Problem& p) {
  uint8_t b = 0;
  for (int d = 0; d < 4; ++d)
    if (p.bias_stride[d] == 0) b |= static_cast<uint8_t>(1u << d);
  return b;
}
const std::vector<std::string>& mask_pattern_menu() {
  static const std::vector<std::string> m = {"random:0.5", "rows:0.6", "random:0.1", "random:0.9",
                                             "ones",       "zeros",    "causal"};
  return m;
}
const std::vector<std::string>& block_pattern_menu() {
  static const std::vector<std::string> m = {"mixed", "empty-some", "partial", "full", "zeros"};
  return m;
}
const std::vector<std::pair<int32_t, int32_t>>& block_size_menu() {
  static const std::vector<std::pair<int32_t, int32_t>> m = {{16, 16}, {8, 8}, {4, 16}, {32, 8},
                                                            {1, 1},   {64, 64}, {2, 3}};
  return m;
}

std::string broadcast_text(uint8_t bits) {
  std::string t;
  for (int d = 0; d < 4; ++d)
    if (bits & (1u << d)) t += "bhij"[d];
  return t;
}

int64_t work(const Problem& p) {
  return p.batch * p.heads_q * p.seq_q * std::max<int64_t>(p.seq_k, 1) * std::max(p.head_dim, p.head_dim_v);
}

// Brings a problem inside the limits and the work budget (deterministic; identity for in-limit problems).
void fit(Problem& p, const FuzzLimits& l) {
  if (work(p) <= l.max_work) return;
  p.batch = 1;
  if (preset_of(
          l)) {  // near a preset: the heads and dims stay; the lengths halve, then the heads' smallest config
    while (work(p) > l.max_work && (p.seq_q > 1 || p.seq_k > 1)) {
      if (p.seq_k >= p.seq_q && p.seq_k > 1)
        p.seq_k = (p.seq_k + 1) / 2;
      else
        p.seq_q = (p.seq_q + 1) / 2;
    }
    if (work(p) > l.max_work) std::tie(p.heads_q, p.heads_kv) = head_menu(l).back();
    set_contiguous_strides(p);
    return;
  }
  if (work(p) > l.max_work) p.heads_q = p.heads_kv = 1;
  while (work(p) > l.max_work) {
    if (p.seq_k >= p.seq_q && p.seq_k > 1)
      p.seq_k = (p.seq_k + 1) / 2;
    else if (p.seq_q > 1)
      p.seq_q = (p.seq_q + 1) / 2;
    else if (p.head_dim >= p.head_dim_v && p.head_dim > 1)
      p.head_dim = (p.head_dim + 1) / 2;
    else if (p.head_dim_v > 1)
      p.head_dim_v = (p.head_dim_v + 1) / 2;
    else
      break;
  }
  set_contiguous_strides(p);
}

}  // namespace detail

using namespace detail;

namespace {

// Tags below kRaw pick a menu entry (menu[tag % size]); tags >= kRaw are followed by a raw value.
constexpr uint8_t kRaw = 224;
constexpr int64_t kSame = -1000;  // menu sentinel: "same as the previous dimension" (Sk = Sq, Dv = D)
constexpr uint8_t kExplicitTag = 0xA5;
constexpr uint8_t kDtypeTag[5] = {0, 225, 226, 243, 244};  // f32, f16, bf16, fp8-e4m3, fp8-e5m2 (decode)

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = u8();
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(u8()) << (8 * i);
    return v;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
    return v;
  }

 private:
  const uint8_t* p_;
  size_t n_, i_ = 0;
};

class Writer {
 public:
  void u8(uint8_t b) { out.push_back(b); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      u8(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    u8(static_cast<uint8_t>(v));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> out;
};

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
double bits_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

// An integer field: a menu of edge values (possibly with kSame) and a raw range [lo, hi].
struct IntField {
  std::vector<int64_t> menu;
  int64_t lo, hi;
  int64_t read(Reader& r) const {
    const uint8_t t = r.u8();
    if (t < kRaw && !menu.empty()) return menu[t % menu.size()];
    return lo + static_cast<int64_t>(r.varint() % static_cast<uint64_t>(hi - lo + 1));
  }
  void write(Writer& w, int64_t x) const {
    auto it = std::find(menu.begin(), menu.end(), x);
    if (it != menu.end() && it - menu.begin() < kRaw) {
      w.u8(static_cast<uint8_t>(it - menu.begin()));
    } else {
      w.u8(kRaw);
      w.varint(static_cast<uint64_t>(x - lo));
    }
  }
};

std::vector<int64_t> capped(std::vector<int64_t> v, int64_t lo, int64_t hi) {
  std::erase_if(v, [&](int64_t x) { return x != kSame && (x < lo || x > hi); });
  return v;
}

struct Fields {
  IntField batch, seq_q, seq_k, dim, dim_v, window;
  explicit Fields(const FuzzLimits& l) {
    batch = {capped({1, 1, 1, 1, 2, 3}, 1, l.max_batch), 1, l.max_batch};
    seq_q = {space::edge_seq_lengths(l.max_seq), 1, l.max_seq};
    std::vector<int64_t> sk{kSame, kSame};
    for (int64_t s : space::edge_seq_lengths(l.max_seq)) sk.push_back(s);
    sk.push_back(0);
    seq_k = {sk, 0, l.max_seq};
    dim = {space::edge_head_dims(l.max_dim), 1, l.max_dim};
    std::vector<int64_t> dv{kSame, kSame, kSame, kSame};
    for (int64_t d : space::edge_head_dims(l.max_dim)) dv.push_back(d);
    dim_v = {dv, 1, l.max_dim};
    window = {capped({AF_UNBOUNDED, 0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129},
                     -1, 2 * l.max_seq),
              -1, 2 * l.max_seq};
    if (const ModelPreset* m = preset_of(l)) {  // D and Dv within 8 of the preset's, mostly its own
      auto near = [&](int64_t x) {
        const int64_t lo = std::max<int64_t>(1, x - 8), hi = std::min(l.max_dim, x + 8);
        return IntField{capped({x, x, x, x, x - 1, x + 1, x - 8, x + 8}, lo, hi), lo, hi};
      };
      dim = near(m->head_dim);
      dim_v = near(m->head_dim_v);
      if (m->head_dim_v == m->head_dim) dim_v.menu.insert(dim_v.menu.begin(), {kSame, kSame, kSame, kSame});
    }
  }
};



bool strides_ok(const Problem& p) {
  auto mono = [](const int64_t* s, int64_t inner, int64_t h, int64_t seq) {
    return s[2] >= inner && s[1] >= h * s[2] && s[0] >= seq * s[1];
  };
  if (!mono(p.q_stride, p.head_dim, p.heads_q, p.seq_q) ||
      !mono(p.k_stride, p.head_dim, p.heads_kv, p.seq_k) ||
      !mono(p.v_stride, p.head_dim_v, p.heads_kv, p.seq_k) ||
      !mono(p.o_stride, p.head_dim_v, p.heads_q, p.seq_q))
    return false;
  if (p.lse_stride[2] < 1 || p.lse_stride[1] < p.seq_q * p.lse_stride[2] ||
      p.lse_stride[0] < p.heads_q * p.lse_stride[1])
    return false;
  Problem c = p;
  set_contiguous_strides(c);
  // Padding stays modest: at most 4x the contiguous span (+64) per tensor.
  return q_elements(p) <= 4 * q_elements(c) + 64 && k_elements(p) <= 4 * k_elements(c) + 64 &&
         v_elements(p) <= 4 * v_elements(c) + 64 && o_elements(p) <= 4 * o_elements(c) + 64 &&
         lse_elements(p) <= 4 * lse_elements(c) + 64 && validate(p).empty();
}

bool contiguous(const Problem& p) {
  Problem c = p;
  set_contiguous_strides(c);
  return std::memcmp(c.q_stride, p.q_stride, sizeof p.q_stride) == 0 &&
         std::memcmp(c.k_stride, p.k_stride, sizeof p.k_stride) == 0 &&
         std::memcmp(c.v_stride, p.v_stride, sizeof p.v_stride) == 0 &&
         std::memcmp(c.o_stride, p.o_stride, sizeof p.o_stride) == 0 &&
         std::memcmp(c.lse_stride, p.lse_stride, sizeof p.lse_stride) == 0;
}



// ---- sequence layouts (issue 15): an optional trailing section, read only without explicit values ----
// Layout byte: < 192 dense (inputs that end early stay dense), else (t - 192) % 5 picks varlen,
// varlen with seqused_k, kvcache, paged, decode. Lengths: a menu byte (zero, single tokens, tile residues)
// or kRaw + varint; encode always writes kRaw + varint (exact).
enum SeqKind { kSeqDense = -1, kSeqVarlen = 0, kSeqVarlenUsed, kSeqKvCache, kSeqPaged, kSeqDecode, kSeqKinds };

const std::vector<int64_t>& length_menu() {
  static const std::vector<int64_t> m{0, 1, 1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 7, 113};
  return m;
}
// ---- custom masks (issue 28 item 4): after the bias's bytes, read only for mask bits the limits allow (so inputs
// decoded under limits without them decode as before): pattern and broadcast (b 1, h 2, i 4) of a custom mask,
// pattern and size of a block mask (menus). mask-dense and mask-bits are exclusive: bits yields to dense.
struct MaskFields {
  uint8_t pattern = 0, bcast = 0, blocks = 0, size = 0;
};
MaskFields read_masks(Reader& r, uint32_t& bits) {
  MaskFields f;
  if ((bits & AF_VARIANT_MASK_DENSE) && (bits & AF_VARIANT_MASK_BITS)) bits &= ~AF_VARIANT_MASK_BITS;
  if (bits & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) f.pattern = r.u8();
  if (bits & kMaskVariants) f.bcast = r.u8() & 0x07;
  if (bits & AF_VARIANT_BLOCK_SPARSE) f.blocks = r.u8(), f.size = r.u8();
  return f;
}
std::string mask_broadcast_text(uint8_t bits) {
  std::string t;
  for (int d = 0; d < 3; ++d)
    if (bits & (1u << d)) t += "bhi"[d];
  return t;
}
void apply_masks(Case& c, uint32_t bits, const MaskFields& f) {
  const auto& bs = block_size_menu()[f.size % block_size_menu().size()];
  (void)set_mask_variants(c, bits, mask_pattern_menu()[f.pattern % mask_pattern_menu().size()],
                          block_pattern_menu()[f.blocks % block_pattern_menu().size()], mask_broadcast_text(f.bcast),
                          bs.first, bs.second);
}
template <class T>
uint8_t menu_index(const std::vector<T>& m, const T& x) {
  return static_cast<uint8_t>(std::find(m.begin(), m.end(), x) - m.begin());
}
uint8_t mask_broadcast_bits(const int64_t* st) {
  uint8_t b = 0;
  for (int d = 0; d < 3; ++d)
    if (st[d] == 0) b |= static_cast<uint8_t>(1u << d);
  return b;
}
void write_masks(Writer& w, const Case& c) {
  const Problem& p = c.problem;
  const bool custom = p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS);
  if (custom) w.u8(menu_index(mask_pattern_menu(), c.variants.mask_pattern));
  if (p.variants & kMaskVariants) w.u8(mask_broadcast_bits(custom ? p.mask_stride : p.block_mask_stride));
  if (p.variants & AF_VARIANT_BLOCK_SPARSE) {
    w.u8(menu_index(block_pattern_menu(), c.variants.block_pattern));
    w.u8(menu_index(block_size_menu(), std::make_pair(p.block_q, p.block_k)));
  }
}
std::string masks_encodable(const Case& c) {
  const Problem& p = c.problem;
  const VariantSpec& vs = c.variants;
  if (!vs.custom_mask.empty() || !vs.block_mask.empty()) return "given mask bytes are not encoded";
  const uint32_t m = p.variants & kMaskVariants;
  if (!m) return {};
  auto menu_has = [](const auto& menu, const auto& x) { return std::find(menu.begin(), menu.end(), x) != menu.end(); };
  const bool custom = m & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS);
  if (custom && !menu_has(mask_pattern_menu(), vs.mask_pattern)) return "a custom mask pattern outside the fuzz menu";
  if ((m & AF_VARIANT_BLOCK_SPARSE) && (!menu_has(block_pattern_menu(), vs.block_pattern) ||
                                        !menu_has(block_size_menu(), std::make_pair(p.block_q, p.block_k))))
    return "a block pattern or block size outside the fuzz menu";
  Case want = c;
  (void)set_mask_variants(want, m, vs.mask_pattern, vs.block_pattern,
                          mask_broadcast_text(mask_broadcast_bits(custom ? p.mask_stride : p.block_mask_stride)),
                          p.block_q, p.block_k);
  if (!std::equal(std::begin(want.problem.mask_stride), std::end(want.problem.mask_stride), std::begin(p.mask_stride)) ||
      !std::equal(std::begin(want.problem.block_mask_stride), std::end(want.problem.block_mask_stride),
                  std::begin(p.block_mask_stride)))
    return "mask strides other than contiguous with broadcast dimensions";
  return {};
}

int64_t read_len(Reader& r, int64_t max) {
  const uint8_t t = r.u8();
  const int64_t x = t < kRaw ? length_menu()[t % length_menu().size()]
                             : static_cast<int64_t>(r.varint() % static_cast<uint64_t>(max + 1));
  return std::min(x, max);
}
void write_len(Writer& w, int64_t x) {
  w.u8(kRaw);
  w.varint(static_cast<uint64_t>(x));
}
int seq_kind(const Case& c) {
  const Problem& p = c.problem;
  if (!has_sequences(p)) return kSeqDense;
  if (p.kv_layout == AF_SEQ_PAGED) return kSeqPaged;  // decode decodes to a paged case with Sq <= 8
  if (p.kv_layout == AF_SEQ_PACKED) return c.seqs.used.empty() ? kSeqVarlen : kSeqVarlenUsed;
  return kSeqKvCache;
}

// Reads the section into c (whose problem is dense and within the limits); keeps c valid.
void read_sequences(Reader& r, Case& c, const FuzzLimits& lim) {
  const uint8_t t = r.u8();
  if (t < 192) return;  // three in four random inputs stay dense
  const int kind = (t - 192) % kSeqKinds;
  Problem& p = c.problem;
  const int64_t B = p.batch, max = lim.max_seq;
  SeqLayout& s = c.seqs;
  s = {};
  auto lens = [&](std::vector<int64_t>& v, int64_t cap) {
    v.resize(static_cast<size_t>(B));
    for (auto& x : v) x = read_len(r, cap);
  };
  if (kind == kSeqVarlen || kind == kSeqVarlenUsed) {
    p.q_layout = p.kv_layout = AF_SEQ_PACKED;
    lens(s.q, max);
    lens(s.k, max);
    if (std::all_of(s.q.begin(), s.q.end(), [](int64_t x) { return x == 0; })) s.q[0] = 1;
    if (kind == kSeqVarlenUsed) {
      s.used.resize(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) s.used[b] = std::min(read_len(r, max), s.k[b]);
      if (*std::max_element(s.k.begin(), s.k.end()) == 0) s.k[0] = 1;
    }
  } else if (kind == kSeqKvCache) {
    if (p.seq_k < 1) p.seq_k = 1;
    lens(s.used, p.seq_k);
  } else {
    p.kv_layout = AF_SEQ_PAGED;
    if (kind == kSeqDecode) p.seq_q = 1 + (p.seq_q - 1) % 8;
    p.page_size = static_cast<int32_t>(space::page_sizes()[r.u8() % space::page_sizes().size()]);
    lens(s.used, max);
    const uint8_t o = r.u8();
    s.page_order = o < 128 ? 0 : r.u64();
    s.spare_pages = r.u8() % 4;
    if (std::all_of(s.used.begin(), s.used.end(), [](int64_t x) { return x == 0; }) && s.spare_pages == 0)
      s.spare_pages = 1;
  }
  // Work budget over the largest lengths: halve them until it fits.
  for (;;) {
    Case trial = c;
    if (!set_sequence_fields(trial).empty() || work(trial.problem) <= lim.max_work) break;
    for (auto* v : {&s.q, &s.k, &s.used})
      for (auto& x : *v) x /= 2;
    if (!s.q.empty() && std::all_of(s.q.begin(), s.q.end(), [](int64_t x) { return x == 0; })) s.q[0] = 1;
    if (p.kv_layout == AF_SEQ_DENSE) p.seq_k = std::max<int64_t>(1, p.seq_k / 2);
  }
  if (!set_sequence_fields(c).empty()) {  // cannot happen for the lengths above; stay dense to stay total
    p.q_layout = p.kv_layout = AF_SEQ_DENSE;
    p.page_size = 0;
    s = {};
    set_sequence_fields(c);
    set_contiguous_strides(p);
  }
  // Malformed metadata (issue 30 item 6a; docs/semantics.md "Malformed metadata"): one sequence-layout input in
  // sixteen carries one defect of the arrays its layout has, in sequence (byte % B); none where it does not fit.
  if (has_sequences(p)) {
    const uint8_t m = r.u8();
    const std::vector<Malformation> kinds = malformations_for(p);
    if (m >= 240 && !kinds.empty()) {
      s.malformed = {kinds[(m - 240) % kinds.size()], static_cast<int64_t>(r.u8()) % p.batch};
      if (!validate_malformed(c).empty()) s.malformed = {};
    }
  }
  // Sequence layouts take random and at= special placements only; at= inside the largest lengths.
  for (SpecialValue& sv : c.values.specials)
    if (sv.placement != Placement::kRandom && sv.placement != Placement::kAt) sv.placement = Placement::kRandom;
  std::erase_if(c.values.specials, [&](const SpecialValue& sv) {
    return sv.placement == Placement::kAt &&
           (sv.b >= p.batch || sv.s >= (sv.tensor == Tensor::kQ ? p.seq_q : p.seq_k));
  });
}

void write_sequences(Writer& w, const Case& c) {
  const int kind = seq_kind(c);
  if (kind == kSeqDense) {
    w.u8(0);
    return;
  }
  const Problem& p = c.problem;
  const SeqLayout& s = c.seqs;
  w.u8(static_cast<uint8_t>(192 + kind));
  auto lens = [&](const std::vector<int64_t>& v) {
    for (int64_t b = 0; b < p.batch; ++b) write_len(w, b < static_cast<int64_t>(v.size()) ? v[b] : 0);
  };
  if (kind == kSeqVarlen || kind == kSeqVarlenUsed) {
    lens(s.q);
    lens(s.k);
    if (kind == kSeqVarlenUsed) lens(s.used);
  } else if (kind == kSeqKvCache) {
    lens(s.used);
  } else {
    const auto& ps = space::page_sizes();
    w.u8(static_cast<uint8_t>(std::find(ps.begin(), ps.end(), p.page_size) - ps.begin()));
    lens(s.used);
    if (s.page_order) {
      w.u8(128);
      w.u64(s.page_order);
    } else {
      w.u8(0);
    }
    w.u8(static_cast<uint8_t>(s.spare_pages));
  }
  const std::vector<Malformation> kinds = malformations_for(p);
  const auto it = std::find(kinds.begin(), kinds.end(), s.malformed.kind);
  if (s.malformed.kind == Malformation::kNone || it == kinds.end()) {
    w.u8(0);
  } else {
    w.u8(static_cast<uint8_t>(240 + (it - kinds.begin())));
    w.u8(static_cast<uint8_t>(s.malformed.seq));
  }
}

}  // namespace

namespace {
// Score variants (issue 28) and custom masks: the field after the pass. Bits outside the limits' set are
// dropped; with a sequence layout only sink, softcap and ALiBi (kLayoutVariants) are kept. Bit 7 of the variant byte is head-descale (AF_VARIANT_HEAD_DESCALE,
// fp8 only; its byte after the masks: bit 0 = descales per batch), the other bits are the variant bits.
void read_variants(Reader& r, Case& c, const FuzzLimits& lim) {
  const uint8_t vb = r.u8();
  uint32_t bits = ((vb & 0x7f) | ((vb & 0x80) ? AF_VARIANT_HEAD_DESCALE : 0)) & lim.variants;
  const ModelPreset* preset = preset_of(lim);
  if (preset) bits |= (preset->sinks ? AF_VARIANT_SINK : 0) | (preset->softcap > 0 ? AF_VARIANT_SOFTCAP : 0);
  float softcap = 30.0f;
  uint8_t bcast = 0;
  if (vb & 0x0f & AF_VARIANT_SOFTCAP) {
    const uint8_t t = r.u8();
    softcap = t == kRaw ? bits_float(r.u32()) : softcap_menu()[t % softcap_menu().size()];
    if (!(softcap > 0) || !std::isfinite(softcap)) softcap = 30.0f;
  }
  if (vb & 0x0f & AF_VARIANT_SINK) c.variants.sink_range = sink_range_menu()[r.u8() % sink_range_menu().size()];
  if (vb & 0x0f & AF_VARIANT_BIAS) {
    bcast = r.u8() & 0x0f;
    c.variants.bias_range = bias_range_menu()[r.u8() % bias_range_menu().size()];
  }
  if (preset && preset->softcap > 0) softcap = preset->softcap;
  const MaskFields mf = read_masks(r, bits);
  const bool per_batch = (vb & 0x80) && (r.u8() & 1);
  if (has_sequences(c.problem)) bits &= kLayoutVariants;
  if (!fp8(c.problem.dtype)) bits &= ~AF_VARIANT_HEAD_DESCALE;
  (void)set_variants(c, bits & (kScoreVariants | AF_VARIANT_HEAD_DESCALE), softcap, broadcast_text(bcast));
  if (bits & AF_VARIANT_HEAD_DESCALE) set_descale_strides(c.problem, per_batch);
  if (bits & kMaskVariants) apply_masks(c, bits & kMaskVariants, mf);
  if (!(bits & AF_VARIANT_SINK)) c.variants.sink_range = 2;
  if (!(bits & AF_VARIANT_BIAS)) c.variants.bias_range = 1;
}

// Dropout (issue 29): after the score variants (absent = none, so earlier inputs decode as before): a byte (bit 0
// dropout, bit 1 philox-flash, bits 2.. the p menu index), the seed, the offset menu index.
void read_dropout(Reader& r, Case& c, const FuzzLimits& lim) {
  const uint8_t db = r.u8();
  if ((db & 1) && (lim.variants & AF_VARIANT_DROPOUT) && !has_sequences(c.problem)) {
    const double drop_p = dropout_p_menu()[(db >> 2) % dropout_p_menu().size()];
    const uint64_t dseed = r.u64();
    const uint64_t offset = dropout_offset_menu()[r.u8() % dropout_offset_menu().size()];
    (void)set_dropout(c.problem, drop_p, (db & 2) ? AF_DROPOUT_RNG_PHILOX_FLASH : AF_DROPOUT_RNG_EXPORTED, dseed, offset);
  }
}

// Merged states (issue 29), the field after the variants: a byte with 0x80 set makes a merge case of 1 + (low 7
// bits % 6) states when the limits allow merge cases and the case can be one (forward, no variant, not fp8); then
// the cut deltas (varints, clipped to Sk), a shift flag with one menu index per state, and the layout (bit 0) and
// pad (menu index, bits 1-2). Absent or 0: no merge (inputs written before decode as they did).
void read_merge(Reader& r, Case& c, const FuzzLimits& lim) {
  const uint8_t mb = r.u8();
  if (!(mb & 0x80) || !lim.merge || c.pass != Pass::kFwd || c.problem.variants || fp8(c.problem.dtype)) return;
  const int64_t n = 1 + (mb & 0x7f) % kMaxFuzzStates, sk = c.problem.seq_k;
  std::vector<int64_t> cuts{0};
  for (int64_t i = 1; i < n; ++i)
    cuts.push_back(std::min(sk, cuts.back() + static_cast<int64_t>(r.varint() % static_cast<uint64_t>(sk + 1))));
  cuts.push_back(sk);
  std::vector<double> shift;
  if (r.u8() & 1)
    for (int64_t i = 0; i < n; ++i) shift.push_back(merge_shift_menu()[r.u8() % merge_shift_menu().size()]);
  const uint8_t lb = r.u8();
  (void)set_merge(c, cuts, shift, lb & 1, merge_pad_menu()[(lb >> 1) % merge_pad_menu().size()]);
}

// Whether p is MLA-shaped under lim (kv-shared, D 576, Dv 512, one KV head, dense; lim.mla_dims on).
bool mla_dims(const Problem& p, const FuzzLimits& lim) {
  return lim.mla_dims && kv_shared(p) && p.head_dim == kMlaHeadDim && p.head_dim_v == kMlaHeadDimV &&
         p.heads_kv == 1 && !has_sequences(p);
}

// MLA's shared K/V latent (issue 28 item 5), the field after merge: bit 0 makes the case kv-shared (V the
// first Dv columns of K's rows) when the limits allow it, the case is a forward one with Dv <= D, not a merge
// case and has no explicit values; bit 1 then gives it DeepSeek's D = 576, Dv = 512 with one KV head when the
// limits allow MLA dims (dense only; the work budget shrinks the sequences, never these dims; at= special
// values dropped). A dense shared case gets contiguous strides. Absent or 0: not shared.
void read_kv_shared(Reader& r, Case& c, const FuzzLimits& lim) {
  const uint8_t kb = r.u8();
  Problem& p = c.problem;
  if (!(kb & 1) || !(lim.variants & AF_VARIANT_KV_SHARED) || has_backward(c.pass) || is_merge(p) ||
      c.explicit_values)
    return;
  if ((kb & 2) && lim.mla_dims && !has_sequences(p)) {
    if (float_bits(p.scale) == float_bits(default_scale(p.head_dim))) p.scale = default_scale(kMlaHeadDim);
    p.head_dim = kMlaHeadDim, p.head_dim_v = kMlaHeadDimV, p.heads_kv = 1;
    share_kv(p);
    set_contiguous_strides(p);
    fit(p, lim);  // sequences shrink first: D and Dv stay
    if (p.variants & AF_VARIANT_BIAS) (void)set_bias_strides(p, broadcast_text(broadcast_bits(p)));
    if (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS))
      (void)set_mask_strides(p, mask_broadcast(p));
    if (p.variants & AF_VARIANT_BLOCK_SPARSE) (void)set_block_mask_strides(p, block_mask_broadcast(p));
    if (p.variants & AF_VARIANT_DROPOUT)
      (void)set_dropout(p, p.dropout_p, p.dropout_rng, p.dropout_seed, p.dropout_offset);
    if (p.variants & AF_VARIANT_HEAD_DESCALE) set_descale_strides(p, p.descale_stride[0] != 0);
    // at= positions were read for the old shape (their d modulo the old D): dropped, as in_domain requires
    std::erase_if(c.values.specials, [](const SpecialValue& s) { return s.placement == Placement::kAt; });
    c.variants.bias.clear(), c.variants.custom_mask.clear(), c.variants.block_mask.clear();
    c.variants.q_descale_h.clear(), c.variants.k_descale_h.clear(), c.variants.v_descale_h.clear();
    return;
  }
  if (p.head_dim_v > p.head_dim) return;
  share_kv(p);
  if (!has_sequences(p)) set_contiguous_strides(p);  // the raw strides were drawn for a V of its own
}

void write_merge(Writer& w, const Case& c) {
  const MergeSpec& m = c.merge;
  w.u8(static_cast<uint8_t>(0x80 | (c.problem.n_states - 1)));
  for (size_t i = 1; i + 1 < m.cuts.size(); ++i) w.varint(static_cast<uint64_t>(m.cuts[i] - m.cuts[i - 1]));
  w.u8(m.lse_shift.empty() ? 0 : 1);
  for (double x : m.lse_shift) {
    const auto& menu = merge_shift_menu();
    w.u8(static_cast<uint8_t>(std::find(menu.begin(), menu.end(), x) - menu.begin()));
  }
  const auto& pads = merge_pad_menu();
  w.u8(static_cast<uint8_t>(m.layout | ((std::find(pads.begin(), pads.end(), m.pad) - pads.begin()) << 1)));
}
}  // namespace

// The byte format, read field by field in the order encode() writes them (the order is the format); the last
// fields (variants, dropout, merge) each have a reader of their own, called in that order.
FuzzInput decode(const uint8_t* data, size_t size, const FuzzLimits& lim) {
  Reader r(data, size);
  const Fields f(lim);
  FuzzInput in;
  in.kernel = r.u8();
  Case& c = in.the_case;
  c.values.domain = lim.domain;
  // Shape.
  const int64_t batch = f.batch.read(r);
  const auto heads = head_menu(lim);
  int64_t hq, hkv;
  if (const uint8_t t = r.u8(); t < kRaw) {
    std::tie(hq, hkv) = heads[t % heads.size()];
  } else {
    hkv = 1 + static_cast<int64_t>(r.varint() % static_cast<uint64_t>(lim.max_heads));
    hq = hkv * (1 + static_cast<int64_t>(r.varint() % static_cast<uint64_t>(lim.max_heads / hkv)));
  }
  const ModelPreset* preset = preset_of(lim);
  if (preset && std::find(heads.begin(), heads.end(), std::pair{hq, hkv}) == heads.end())
    std::tie(hq, hkv) =
        heads[static_cast<size_t>(hq + hkv) % heads.size()];  // near a preset: one of its configs
  const int64_t sq = f.seq_q.read(r);
  int64_t sk = f.seq_k.read(r);
  if (sk == kSame) sk = sq;
  const int64_t d = f.dim.read(r);
  int64_t dv = f.dim_v.read(r);
  if (dv == kSame) dv = d;
  Problem p = make_problem(batch, hq, hkv, sq, sk, d, dv);
  fit(p, lim);
  // Mask.
  const uint8_t mk = r.u8() % 8;
  const uint8_t align = r.u8() & 1;
  const int64_t wl = f.window.read(r), wr = f.window.read(r);
  if (mk >= 2) {
    p.mask_kind = mk < 5 ? AF_MASK_CAUSAL : AF_MASK_WINDOW;
    p.mask_align = align ? AF_ALIGN_BOTTOM_RIGHT : AF_ALIGN_TOP_LEFT;
    if (p.mask_kind == AF_MASK_WINDOW) {
      p.window_left = wl;
      p.window_right = wr;
    }
  }
  if (preset) preset_mask(p, *preset, lim.max_seq);
  // Scale.
  if (const uint8_t t = r.u8(); t >= kRaw) {
    const float s = bits_float(r.u32());
    if (std::isfinite(s)) p.scale = s;
  } else if (t >= 160) {
    p.scale = scale_menu()[(t - 160) % scale_menu().size()];
  }
  // Dtype.
  // Tags >= kRaw: (t - kRaw) % 3 picks f32 / f16 / bf16 as before issue 13; from 240 on, the f16 and bf16
  // residues pick fp8-e4m3 and fp8-e5m2 (kDtypeTag: the tag encode writes for each dtype).
  if (const uint8_t t = r.u8(); t >= kRaw) {
    const int res = (t - kRaw) % 3;
    p.dtype = res == 0 ? AF_DTYPE_F32 : t < 240 ? res : res == 1 ? AF_DTYPE_FP8_E4M3 : AF_DTYPE_FP8_E5M2;
  }
  if (lim.dtype >= 0) p.dtype = lim.dtype;
  if (fp8(p.dtype)) {  // descales: menu indices
    const auto& dm = space::fp8_descales();
    p.q_descale = dm[r.u8() % dm.size()];
    p.k_descale = dm[r.u8() % dm.size()];
    p.v_descale = dm[r.u8() % dm.size()];
    p.o_scale = o_scale_menu()[r.u8() % o_scale_menu().size()];
  }
  // Layout: contiguous, or raw strides kept when they are non-overlapping and modest.
  if (r.u8() >= 208) {
    Problem s = p;
    for (int64_t* st : {s.q_stride, s.k_stride, s.v_stride, s.o_stride, s.lse_stride})
      for (int i = 0; i < 3; ++i) st[i] = static_cast<int64_t>(r.varint() % (uint64_t{1} << 40));
    if (strides_ok(s)) p = s;
  }
  c.problem = p;
  // Values.
  const uint8_t dk = r.u8();
  c.values.dist.kind = dk < 96                                    ? Distribution::kUniform
                       : dk < 144                                 ? Distribution::kNormal
                       : dk < 208 || p.dtype == AF_DTYPE_F32 ? Distribution::kExtreme
                       : dk < 232                                 ? Distribution::kVBias  // low precision only
                                                                  : Distribution::kWideV;
  if (const uint8_t t = r.u8(); t >= kRaw) {
    const double a = bits_double(r.u64());
    c.values.dist.param = std::isfinite(a) && a > 0 ? a : 1.0;
  } else {
    const auto& m = param_menu(c.values.dist.kind);
    c.values.dist.param = m[t % m.size()];
  }
  if (const uint8_t t = r.u8(); t >= 144) {
    const int64_t n = 1 + (t - 144) % lim.max_specials;
    for (int64_t i = 0; i < n; ++i) {
      SpecialValue s;
      const auto& kinds = space::special_kinds(lim.domain);
      s.kind = kinds[r.u8() % kinds.size()];
      s.tensor = static_cast<Tensor>(r.u8() % 3);
      s.placement = static_cast<Placement>(r.u8() % 5);
      s.count = 1 + r.u8() % lim.max_special_count;
      if (s.placement == Placement::kAt) {
        const uint64_t b = r.varint(), h = r.varint(), sp = r.varint(), dd = r.varint();
        const int64_t seq = tensor_seq(p, s.tensor);
        if (seq == 0) continue;  // no position to place at: dropped
        s.b = static_cast<int64_t>(b % static_cast<uint64_t>(p.batch));
        s.h = static_cast<int64_t>(h % static_cast<uint64_t>(tensor_heads(p, s.tensor)));
        s.s = static_cast<int64_t>(sp % static_cast<uint64_t>(seq));
        s.d = static_cast<int64_t>(dd % static_cast<uint64_t>(tensor_dim(p, s.tensor)));
      }
      c.values.specials.push_back(s);
    }
  }
  c.seed = r.u64();
  if (r.u8() == kExplicitTag) {
    ExplicitValues e;
    for (auto [vec, n] : {std::pair{&e.q, q_elements(p)}, {&e.k, k_elements(p)}, {&e.v, v_elements(p)}}) {
      vec->resize(static_cast<size_t>(n));
      for (float& x : *vec) {
        x = to_domain(bits_float(r.u32()), lim.domain);
      }
    }
    if (static_cast<int64_t>(e.q.size() + e.k.size() + e.v.size()) <= lim.max_explicit)
      c.explicit_values = std::move(e);
  }
  const Problem dense = c.problem;  // before any sequence layout (a backward case may need it back)
  if (!c.explicit_values) read_sequences(r, c, lim);
  if (preset && (preset->sinks || preset->softcap > 0) &&
      has_sequences(c.problem)) {  // its variants need dense
    c.problem = dense;
    c.seqs = {};
  }
  // Pass (issue 14), and a backward case's explicit dO (flag 0x80) when its values are explicit.
  const uint8_t pt = r.u8();
  c.pass = static_cast<Pass>((pt & 0x7f) % 3);
  if (!(lim.passes & (1u << static_cast<int>(c.pass))))
    for (int i = 0; i < 3; ++i)
      if (lim.passes & (1u << i)) {
        c.pass = static_cast<Pass>(i);
        break;
      }
  if ((pt & 0x80) && c.explicit_values && has_backward(c.pass)) {
    std::vector<float>& dout = c.explicit_values->dout;
    dout.resize(static_cast<size_t>(o_elements(p)));
    for (float& x : dout) {
      x = bits_float(r.u32());
      if (!std::isfinite(x)) x = std::isnan(x) ? 0.0f : std::copysign(FLT_MAX, x);  // dO finite
    }
  }
  read_variants(r, c, lim);
  read_dropout(r, c, lim);
  // Backward cases are dense f32 / f16 / bf16 (validate(Case)): a backward pass drawn for a sequence layout or
  // fp8 becomes the forward pass when the limits allow it; else the case goes back to dense f32.
  if (has_backward(c.pass) && (has_sequences(c.problem) || fp8(c.problem.dtype))) {
    if ((lim.passes & (1u << static_cast<int>(Pass::kFwd))) || lim.dtype > AF_DTYPE_F32) {
      c.pass = Pass::kFwd;
      if (c.explicit_values) c.explicit_values->dout.clear();
    } else {
      if (has_sequences(c.problem)) {
        c.problem = dense;
        c.seqs = {};
      }
      c.problem.dtype = AF_DTYPE_F32;
      c.problem.q_descale = c.problem.k_descale = c.problem.v_descale = c.problem.o_scale = 1.0f;
    }
  }
  read_merge(r, c, lim);
  read_kv_shared(r, c, lim);
  // A defect read after the layout may not fit what came after it (a merge case reads no sequence arrays): dropped,
  // so every input decodes to a valid case (the mutator and cross-over normalise through here too).
  if (!validate_malformed(c).empty()) c.seqs.malformed = {};
  fit_value_domain(c);  // activations: distribution, scale, specials and explicit values in its bounds
  return in;
}

std::vector<uint8_t> encode(const FuzzInput& in, const FuzzLimits& lim) {
  Writer w;
  const Fields f(lim);
  const Case& c = in.the_case;
  const Problem& p = c.problem;
  w.u8(static_cast<uint8_t>(in.kernel));
  f.batch.write(w, p.batch);
  const auto heads = head_menu(lim);
  auto hit = std::find(heads.begin(), heads.end(), std::pair{p.heads_q, p.heads_kv});
  if (hit != heads.end()) {
    w.u8(static_cast<uint8_t>(hit - heads.begin()));
  } else {
    w.u8(kRaw);
    w.varint(static_cast<uint64_t>(p.heads_kv - 1));
    w.varint(static_cast<uint64_t>(p.heads_q / std::max<int64_t>(p.heads_kv, 1) - 1));
  }
  f.seq_q.write(w, p.seq_q);
  f.seq_k.write(w, p.seq_k == p.seq_q ? kSame : p.seq_k);
  f.dim.write(w, p.head_dim);
  f.dim_v.write(w, p.head_dim_v == p.head_dim ? kSame : p.head_dim_v);
  w.u8(p.mask_kind == AF_MASK_NONE ? 0 : p.mask_kind == AF_MASK_CAUSAL ? 2 : 5);
  w.u8(p.mask_kind != AF_MASK_NONE && p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? 1 : 0);
  const bool win = p.mask_kind == AF_MASK_WINDOW;
  f.window.write(w, win ? p.window_left : AF_UNBOUNDED);
  f.window.write(w, win ? p.window_right : AF_UNBOUNDED);
  if (float_bits(p.scale) == float_bits(default_scale(p.head_dim))) {
    w.u8(0);
  } else {
    const auto& m = scale_menu();
    auto it = std::find_if(m.begin(), m.end(), [&](float x) { return float_bits(x) == float_bits(p.scale); });
    if (it != m.end()) {
      w.u8(static_cast<uint8_t>(160 + (it - m.begin())));
    } else {
      w.u8(kRaw);
      w.u32(float_bits(p.scale));
    }
  }
  w.u8(kDtypeTag[std::clamp<int32_t>(p.dtype, 0, 4)]);
  if (fp8(p.dtype)) {
    const auto& dm = space::fp8_descales();
    for (float x : {p.q_descale, p.k_descale, p.v_descale})
      w.u8(static_cast<uint8_t>(std::find(dm.begin(), dm.end(), x) - dm.begin()));
    const auto& om = o_scale_menu();
    w.u8(static_cast<uint8_t>(std::find(om.begin(), om.end(), p.o_scale) - om.begin()));
  }
  if (contiguous(p) || has_sequences(p)) {  // sequence layouts: strides follow from the lengths
    w.u8(0);
  } else {
    w.u8(208);
    for (const int64_t* st : {p.q_stride, p.k_stride, p.v_stride, p.o_stride, p.lse_stride})
      for (int i = 0; i < 3; ++i) w.varint(static_cast<uint64_t>(st[i]));
  }
  const Distribution dk = c.values.dist.kind;
  w.u8(dk == Distribution::kUniform  ? 0
       : dk == Distribution::kNormal ? 96
       : dk == Distribution::kExtreme ? 144
       : dk == Distribution::kVBias  ? 208
                                     : 232);
  const auto& pm = param_menu(dk);
  auto pit = std::find_if(pm.begin(), pm.end(),
                          [&](double x) { return double_bits(x) == double_bits(c.values.dist.param); });
  if (pit != pm.end() && pit - pm.begin() < kRaw) {
    w.u8(static_cast<uint8_t>(pit - pm.begin()));
  } else {
    w.u8(kRaw);
    w.u64(double_bits(c.values.dist.param));
  }
  const size_t ns = c.values.specials.size();
  w.u8(ns == 0 ? 0 : static_cast<uint8_t>(144 + ns - 1));
  for (const SpecialValue& s : c.values.specials) {
    const auto& kinds = space::special_kinds(lim.domain);  // a kind outside it decodes as another one
    w.u8(static_cast<uint8_t>(std::find(kinds.begin(), kinds.end(), s.kind) - kinds.begin()));
    w.u8(static_cast<uint8_t>(s.tensor));
    w.u8(static_cast<uint8_t>(s.placement));
    w.u8(static_cast<uint8_t>(std::max<int64_t>(s.count - 1, 0)));
    if (s.placement == Placement::kAt)
      for (int64_t x : {s.b, s.h, s.s, s.d}) w.varint(static_cast<uint64_t>(x));
  }
  w.u64(c.seed);
  if (c.explicit_values) {
    w.u8(kExplicitTag);
    for (const auto* vec : {&c.explicit_values->q, &c.explicit_values->k, &c.explicit_values->v})
      for (float x : *vec) w.u32(float_bits(x));
  } else {
    w.u8(0);
    write_sequences(w, c);
  }
  const bool dout = c.explicit_values && !c.explicit_values->dout.empty() && has_backward(c.pass);
  w.u8(static_cast<uint8_t>(static_cast<int>(c.pass) | (dout ? 0x80 : 0)));
  if (dout)
    for (float x : c.explicit_values->dout) w.u32(float_bits(x));
  if (p.variants || is_merge(p)) {  // issue 28: absent when the case has none (the bytes of such inputs are unchanged)
    w.u8(static_cast<uint8_t>((p.variants & 0x7f) | ((p.variants & AF_VARIANT_HEAD_DESCALE) ? 0x80 : 0)));
    if (p.variants & AF_VARIANT_SOFTCAP) {
      const auto& m = softcap_menu();
      auto it = std::find_if(m.begin(), m.end(), [&](float x) { return float_bits(x) == float_bits(p.softcap); });
      if (it != m.end()) {
        w.u8(static_cast<uint8_t>(it - m.begin()));
      } else {
        w.u8(kRaw);
        w.u32(float_bits(p.softcap));
      }
    }
    auto index = [](const std::vector<double>& m, double x) {
      return static_cast<uint8_t>(std::find(m.begin(), m.end(), x) - m.begin());
    };
    if (p.variants & AF_VARIANT_SINK) w.u8(index(sink_range_menu(), c.variants.sink_range));
    if (p.variants & AF_VARIANT_BIAS) {
      w.u8(broadcast_bits(p));
      w.u8(index(bias_range_menu(), c.variants.bias_range));
    }
    write_masks(w, c);
    if (p.variants & AF_VARIANT_HEAD_DESCALE) w.u8(p.descale_stride[0] != 0 ? 1 : 0);
  }
  // issue 29: dropout, then merged states, each after the fields before it (absent = none); a merge case without
  // dropout writes the dropout byte 0 so that its merge byte lands where the decoder reads it.
  if (p.variants & AF_VARIANT_DROPOUT) {
    const auto& pm = dropout_p_menu();
    const auto& om = dropout_offset_menu();
    const auto pi =
        std::find_if(pm.begin(), pm.end(), [&](double x) { return static_cast<float>(x) == p.dropout_p; }) - pm.begin();
    w.u8(static_cast<uint8_t>(1 | (p.dropout_rng == AF_DROPOUT_RNG_PHILOX_FLASH ? 2 : 0) | (pi << 2)));
    w.u64(p.dropout_seed);
    w.u8(static_cast<uint8_t>(std::find(om.begin(), om.end(), p.dropout_offset) - om.begin()));
  } else if (is_merge(p) || kv_shared(p)) {
    w.u8(0);
  }
  if (is_merge(p)) write_merge(w, c);
  if (kv_shared(
          p)) {  // issue 28 item 5, after merge (a kv-shared case is no merge case: its merge byte is 0)
    if (!is_merge(p)) w.u8(0);
    w.u8(static_cast<uint8_t>(1 | (mla_dims(p, lim) ? 2 : 0)));
  }
  return std::move(w.out);
}

std::string set_preset(FuzzLimits& l, const std::string& name) {
  const std::optional<ModelPreset> m = find_preset(name);
  if (!m) return "--preset '" + name + "' is not a preset: one of " + preset_names() + " (or list)";
  if (m->pending) return "--preset " + name + " needs " + m->pending + ": not fuzzable yet";
  if (m->kv_shared)  // the fuzzer's MLA cases come from --variant kv-shared (FuzzLimits::mla_dims), not a preset
    return "--preset " + name + " is MLA (kv-shared): fuzz its geometry with --variant kv-shared instead";
  l.preset = name;
  l.variants |= (m->sinks ? AF_VARIANT_SINK : 0u) | (m->softcap > 0 ? AF_VARIANT_SOFTCAP : 0u);
  l.max_heads = std::max(l.max_heads, m->heads_q);
  l.max_dim = std::max({l.max_dim, m->head_dim + 8, m->head_dim_v + 8});
  l.max_work = std::max<int64_t>(l.max_work, int64_t{1} << 24);
  return {};
}

namespace {
// Near the preset of l (FuzzLimits::preset): its heads, dims, mask, softcap and sinks; "" when l has none.
std::string preset_in_domain(const Case& c, const FuzzLimits& l) {
  const ModelPreset* m = preset_of(l);
  if (!m) return {};
  const Problem& p = c.problem;
  const auto heads = head_menu(l);
  if (std::find(heads.begin(), heads.end(), std::pair{p.heads_q, p.heads_kv}) == heads.end())
    return "heads other than the preset's configurations";
  if (std::abs(p.head_dim - m->head_dim) > 8 || std::abs(p.head_dim_v - m->head_dim_v) > 8)
    return "D or Dv more than 8 from the preset's";
  Problem want = p;
  preset_mask(want, *m, l.max_seq);
  if (want.mask_kind != p.mask_kind || want.mask_align != p.mask_align || want.window_left != p.window_left ||
      want.window_right != p.window_right)
    return "a mask other than the preset's";
  if (m->sinks && !(p.variants & AF_VARIANT_SINK)) return "no sinks in a sinks preset";
  if (m->softcap > 0 && (!(p.variants & AF_VARIANT_SOFTCAP) || p.softcap != m->softcap))
    return "a softcap other than the preset's";
  if ((m->sinks || m->softcap > 0) && has_sequences(p)) return "a sequence layout in a preset with variants";
  return {};
}
}  // namespace

std::string in_domain(const Case& c, const FuzzLimits& l) {
  if (std::string e = preset_in_domain(c, l); !e.empty()) return e;
  if (c.values.domain != l.domain) return "value domain differs from the fuzz limits'";
  if (l.dtype >= 0 && c.problem.dtype != l.dtype) return "dtype differs from the fuzz limits'";
  if (c.problem.dtype == AF_DTYPE_F32 &&
      (c.values.dist.kind == Distribution::kVBias || c.values.dist.kind == Distribution::kWideV))
    return "vbias / widev values are a low-precision fuzz input (f32 cases decode that tag as extreme)";
  if (fp8(c.problem.dtype)) {
    const auto& dm = space::fp8_descales();
    const auto& om = o_scale_menu();
    for (float x : {c.problem.q_descale, c.problem.k_descale, c.problem.v_descale})
      if (std::find(dm.begin(), dm.end(), x) == dm.end()) return "a descale outside the fuzz menu";
    if (std::find(om.begin(), om.end(), c.problem.o_scale) == om.end()) return "o_scale outside the fuzz menu";
  }
  if (!(l.passes & (1u << static_cast<int>(c.pass)))) return "pass outside the fuzz limits' passes";
  if (c.problem.variants & ~l.variants) return "a score variant outside the fuzz limits' variants";
  if (c.problem.variants & AF_VARIANT_DROPOUT) {
    const Problem& p = c.problem;
    const auto& pm = dropout_p_menu();
    const auto& om = dropout_offset_menu();
    if (std::find_if(pm.begin(), pm.end(), [&](double x) { return static_cast<float>(x) == p.dropout_p; }) == pm.end())
      return "a dropout p outside the fuzz menu";
    if (std::find(om.begin(), om.end(), p.dropout_offset) == om.end()) return "a dropout offset outside the fuzz menu";
    if (p.dropout_rng != AF_DROPOUT_RNG_EXPORTED && p.dropout_rng != AF_DROPOUT_RNG_PHILOX_FLASH)
      return "a dropout generator the fuzzer does not draw";
  }
  {
    const VariantSpec& vs = c.variants;
    const uint32_t v = c.problem.variants;
    if (!vs.sinks.empty() || !vs.alibi_slopes.empty() || !vs.bias.empty() || !vs.q_descale_h.empty() ||
        !vs.k_descale_h.empty() || !vs.v_descale_h.empty())
      return "given variant values are not encoded";
    if (v & AF_VARIANT_HEAD_DESCALE) {
      if (c.problem.descale_stride[1] != 1 ||
          (c.problem.descale_stride[0] != 0 && c.problem.descale_stride[0] != c.problem.heads_q))
        return "per-head descale strides other than {0, 1} or {Hq, 1}";
    } else if (c.problem.descale_stride[0] != 0 || c.problem.descale_stride[1] != 0) {
      return "per-head descale strides without the head-descale variant";
    }
    auto in_menu = [](const std::vector<double>& m, double x) { return std::find(m.begin(), m.end(), x) != m.end(); };
    if ((v & AF_VARIANT_SINK) ? !in_menu(sink_range_menu(), vs.sink_range) : vs.sink_range != 2)
      return "sink range outside the fuzz menu";
    if ((v & AF_VARIANT_BIAS) ? !in_menu(bias_range_menu(), vs.bias_range) : vs.bias_range != 1)
      return "bias range outside the fuzz menu";
    if (!(v & AF_VARIANT_SOFTCAP) && c.problem.softcap != 0) return "a softcap without the softcap variant";
    if (v & AF_VARIANT_BIAS) {
      Problem want = c.problem;
      (void)set_bias_strides(want, broadcast_text(broadcast_bits(c.problem)));
      if (!std::equal(std::begin(want.bias_stride), std::end(want.bias_stride), std::begin(c.problem.bias_stride)))
        return "bias strides other than contiguous with broadcast dimensions";
    } else if (std::any_of(std::begin(c.problem.bias_stride), std::end(c.problem.bias_stride),
                           [](int64_t x) { return x != 0; })) {
      return "bias strides without the bias variant";
    }
    if (std::string e = masks_encodable(c); !e.empty()) return e;
  }
  if (is_merge(c.problem)) {  // issue 29
    const MergeSpec& m = c.merge;
    auto in_menu = [](const auto& menu, auto x) { return std::find(menu.begin(), menu.end(), x) != menu.end(); };
    if (!l.merge) return "a merge case while the fuzz limits take none";
    if (c.problem.n_states > kMaxFuzzStates) return "more merge states than the fuzzer encodes";
    if (!in_menu(merge_pad_menu(), m.pad)) return "a state pad outside the fuzz menu";
    for (double x : m.lse_shift)
      if (!in_menu(merge_shift_menu(), x)) return "a merge shift outside the fuzz menu";
  }
  if (c.explicit_values)
    for (float x : c.explicit_values->dout)
      if (!std::isfinite(x)) return "explicit dO holds a NaN or Inf";
  if (std::string e = attnfuzz::validate(c); !e.empty()) return e;
  const Problem& p = c.problem;
  if (p.batch > l.max_batch) return "batch above the fuzz limit";
  if (p.heads_q > l.max_heads) return "heads above the fuzz limit";
  if (p.seq_q > l.max_seq || p.seq_k > l.max_seq) return "sequence length above the fuzz limit";
  if ((p.head_dim > l.max_dim || p.head_dim_v > l.max_dim) && !mla_dims(p, l))
    return "head dim above the fuzz limit";
  if (kv_shared(p) && !(l.variants & AF_VARIANT_KV_SHARED))
    return "kv-shared while the fuzz limits take none";
  if (kv_shared(p) && c.explicit_values) return "explicit values of a kv-shared case are not encoded";
  if (kv_shared(p) && !has_sequences(p) && !contiguous(p))
    return "a kv-shared case is contiguous in the fuzzer";
  if (mla_dims(p, l) && std::any_of(c.values.specials.begin(), c.values.specials.end(),
                                    [](const SpecialValue& s) { return s.placement == Placement::kAt; }))
    return "an MLA-shaped case places no special value at= (the decoder reads positions for its first shape)";
  if (work(p) > l.max_work) return "work above the fuzz budget";
  if (p.mask_kind == AF_MASK_WINDOW && (p.window_left > 2 * l.max_seq || p.window_right > 2 * l.max_seq))
    return "window side above the fuzz limit";
  if (!has_sequences(p) && !contiguous(p) && !strides_ok(p)) return "strides overlap or pad too much";
  if (has_sequences(p) && c.explicit_values) return "explicit values of a sequence layout are not encoded";
  if (p.kv_layout == AF_SEQ_PAGED && (!c.seqs.k.empty() || c.seqs.spare_pages > 3))
    return "paged slots beyond the used lengths / more than 3 spare pages are not encoded";
  if (static_cast<int64_t>(c.values.specials.size()) > l.max_specials) return "too many special values";
  for (const SpecialValue& s : c.values.specials)
    if (s.count < 1 || s.count > l.max_special_count) return "special count outside 1 .. max_special_count";
  if (c.explicit_values && static_cast<int64_t>(c.explicit_values->q.size() + c.explicit_values->k.size() +
                                                c.explicit_values->v.size()) > l.max_explicit)
    return "too many explicit values";
  return {};
}

}  // namespace attnfuzz::fuzz

