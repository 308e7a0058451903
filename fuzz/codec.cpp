// codec.cpp - total decoding of fuzz bytes into cases, exact encoding, and the structured case domain.
#include "fuzz/codec.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <tuple>

namespace attnfuzz::fuzz {

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

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
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
  }
};

std::vector<std::pair<int64_t, int64_t>> head_menu(const FuzzLimits& l) {
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
bool fp8(int32_t dtype) { return dtype == AF_DTYPE_FP8_E4M3 || dtype == AF_DTYPE_FP8_E5M2; }
const std::vector<double>& param_menu(Distribution d) {
  static const std::vector<double> plain{1, 0.5, 2, 4, 10, 100, 1e-3, 1e3, 1e-20, 1e18};
  return d == Distribution::kExtreme ? space::extreme_magnitudes() : plain;
}

int64_t work(const Problem& p) {
  return p.batch * p.heads_q * p.seq_q * std::max<int64_t>(p.seq_k, 1) * std::max(p.head_dim, p.head_dim_v);
}

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

int64_t tensor_seq(const Problem& p, Tensor t) { return t == Tensor::kQ ? p.seq_q : p.seq_k; }
int64_t tensor_heads(const Problem& p, Tensor t) { return t == Tensor::kQ ? p.heads_q : p.heads_kv; }
int64_t tensor_dim(const Problem& p, Tensor t) {
  return t == Tensor::kQ || t == Tensor::kK ? p.head_dim : p.head_dim_v;
}

// Brings a problem inside the limits and the work budget (deterministic; identity for in-limit problems).
void fit(Problem& p, const FuzzLimits& l) {
  if (work(p) <= l.max_work) return;
  p.batch = 1;
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

// ---- sequence layouts (issue 15): an optional trailing section, read only without explicit values ----
// Layout byte: < 192 dense (inputs that end early stay dense), else (t - 192) % 5 picks varlen,
// varlen with seqused_k, kvcache, paged, decode. Lengths: a menu byte (zero, single tokens, tile residues)
// or kRaw + varint; encode always writes kRaw + varint (exact).
enum SeqKind { kSeqDense = -1, kSeqVarlen = 0, kSeqVarlenUsed, kSeqKvCache, kSeqPaged, kSeqDecode, kSeqKinds };

const std::vector<int64_t>& length_menu() {
  static const std::vector<int64_t> m{0, 1, 1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 7, 113};
  return m;
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
}

}  // namespace

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
        x = bits_float(r.u32());
        if (lim.domain == ValueDomain::kFinite && !std::isfinite(x))
          x = std::isnan(x) ? 0.0f : std::copysign(FLT_MAX, x);
      }
    }
    if (static_cast<int64_t>(e.q.size() + e.k.size() + e.v.size()) <= lim.max_explicit)
      c.explicit_values = std::move(e);
  }
  const Problem dense = c.problem;  // before any sequence layout (a backward case may need it back)
  if (!c.explicit_values) read_sequences(r, c, lim);
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
  return std::move(w.out);
}

std::string in_domain(const Case& c, const FuzzLimits& l) {
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
  if (c.explicit_values)
    for (float x : c.explicit_values->dout)
      if (!std::isfinite(x)) return "explicit dO holds a NaN or Inf";
  if (std::string e = attnfuzz::validate(c); !e.empty()) return e;
  const Problem& p = c.problem;
  if (p.batch > l.max_batch) return "batch above the fuzz limit";
  if (p.heads_q > l.max_heads) return "heads above the fuzz limit";
  if (p.seq_q > l.max_seq || p.seq_k > l.max_seq) return "sequence length above the fuzz limit";
  if (p.head_dim > l.max_dim || p.head_dim_v > l.max_dim) return "head dim above the fuzz limit";
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

// ------------------------------------------------------------------------------------------- domain

namespace {

int64_t pick(Rng& rng, const std::vector<int64_t>& v) { return v[rng.below(v.size())]; }

// A sequence length near a tile boundary, or any edge length.
int64_t near_tile(Rng& rng, int64_t max_len) {
  const int64_t t = pick(rng, space::tile_sizes());
  const int64_t m = 1 + static_cast<int64_t>(rng.below(3));
  const int64_t v = t * m + static_cast<int64_t>(rng.below(3)) - 1;
  if (v >= 1 && v <= max_len) return v;
  return pick(rng, space::edge_seq_lengths(max_len));
}

int64_t near_vector(Rng& rng, int64_t max_d) {
  const int64_t w = rng.below(2) ? 4 : 8;
  const int64_t v =
      w * (1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(std::max<int64_t>(max_d / w, 1))))) +
      static_cast<int64_t>(rng.below(3)) - 1;
  return std::clamp<int64_t>(v, 1, max_d);
}

// Copies explicit values onto a new shape (overlapping region kept, the rest zero).
Case reshape(const Case& c, Problem np) {
  Case n = c;
  n.problem = np;
  if (has_sequences(np) || has_sequences(c.problem)) n.explicit_values.reset();  // not encoded with a layout
  if (!n.explicit_values) return n;
  const Problem& p = c.problem;
  ExplicitValues e;
  e.q.assign(static_cast<size_t>(q_elements(np)), 0.f);
  e.k.assign(static_cast<size_t>(k_elements(np)), 0.f);
  e.v.assign(static_cast<size_t>(v_elements(np)), 0.f);
  const ExplicitValues& o = *c.explicit_values;
  for (int64_t b = 0; b < std::min(p.batch, np.batch); ++b) {
    for (int64_t s = 0; s < std::min(p.seq_q, np.seq_q); ++s)
      for (int64_t h = 0; h < std::min(p.heads_q, np.heads_q); ++h)
        for (int64_t d = 0; d < std::min(p.head_dim, np.head_dim); ++d)
          e.q[static_cast<size_t>(q_index(np, b, s, h, d))] =
              o.q[static_cast<size_t>(q_index(p, b, s, h, d))];
    for (int64_t s = 0; s < std::min(p.seq_k, np.seq_k); ++s)
      for (int64_t h = 0; h < std::min(p.heads_kv, np.heads_kv); ++h) {
        for (int64_t d = 0; d < std::min(p.head_dim, np.head_dim); ++d)
          e.k[static_cast<size_t>(k_index(np, b, s, h, d))] =
              o.k[static_cast<size_t>(k_index(p, b, s, h, d))];
        for (int64_t d = 0; d < std::min(p.head_dim_v, np.head_dim_v); ++d)
          e.v[static_cast<size_t>(v_index(np, b, s, h, d))] =
              o.v[static_cast<size_t>(v_index(p, b, s, h, d))];
      }
  }
  if (np.batch == p.batch && np.seq_q == p.seq_q && np.heads_q == p.heads_q && np.head_dim_v == p.head_dim_v &&
      o_elements(np) == o_elements(p))
    e.dout = o.dout;  // dO keeps its place when O's shape does; otherwise it comes from the seed again
  n.explicit_values = std::move(e);
  return n;
}

// A problem with a new shape, keeping mask, scale (if not default), dtype; strides made contiguous.
Problem reshaped(const Problem& p, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                 int64_t dv) {
  Problem n = make_problem(b, hq, hkv, sq, sk, d, dv);
  n.mask_kind = p.mask_kind;
  n.mask_align = p.mask_align;
  n.window_left = p.window_left;
  n.window_right = p.window_right;
  n.dtype = p.dtype;
  n.q_descale = p.q_descale, n.k_descale = p.k_descale, n.v_descale = p.v_descale, n.o_scale = p.o_scale;
  if (float_bits(p.scale) != float_bits(default_scale(p.head_dim))) n.scale = p.scale;
  return n;
}

// Drops specials placed "at" a position the shape no longer has.
void fix_specials(Case& c) {
  std::erase_if(c.values.specials, [&](const SpecialValue& s) {
    if (s.placement != Placement::kAt) return false;
    const Problem& p = c.problem;
    return s.b >= p.batch || s.h >= tensor_heads(p, s.tensor) || s.s >= tensor_seq(p, s.tensor) ||
           s.d >= tensor_dim(p, s.tensor);
  });
}

// Normalises through the codec (limits, budget, strides), so every mutation result is in the domain.
void normalise(FuzzInput& in, const FuzzLimits& l) {
  fix_specials(in.the_case);
  if (in.the_case.explicit_values && !attnfuzz::validate(in.the_case).empty())
    in.the_case.explicit_values.reset();
  const std::string label = in.the_case.label;
  const auto bytes = encode(in, l);
  in = decode(bytes.data(), bytes.size(), l);
  in.the_case.label = label;
}

SpecialValue random_special(Rng& rng, const Problem& p) {
  SpecialValue s;
  s.kind = space::special_kinds()[rng.below(space::special_kinds().size())];
  s.tensor = static_cast<Tensor>(rng.below(3));
  // Masked and hidden placements are where NaN must not leak: favour them.
  static const Placement kPlacements[] = {Placement::kMasked, Placement::kHidden, Placement::kVisible,
                                          Placement::kRandom, Placement::kMasked, Placement::kAt};
  s.placement = kPlacements[rng.below(6)];
  s.count = 1 + static_cast<int64_t>(rng.below(4));
  if (s.placement == Placement::kAt) {
    const int64_t seq = tensor_seq(p, s.tensor);
    if (seq == 0) {
      s.placement = Placement::kRandom;
    } else {
      s.b = static_cast<int64_t>(rng.below(static_cast<uint64_t>(p.batch)));
      s.h = static_cast<int64_t>(rng.below(static_cast<uint64_t>(tensor_heads(p, s.tensor))));
      // Tile edges are the interesting rows and keys.
      const int64_t t = pick(rng, space::tile_sizes());
      const int64_t cand[] = {0, seq - 1, t - 1, t, seq / 2};
      s.s = std::clamp<int64_t>(cand[rng.below(5)], 0, seq - 1);
      s.d = static_cast<int64_t>(rng.below(static_cast<uint64_t>(tensor_dim(p, s.tensor))));
    }
  }
  return s;
}

// One structured change of a case's sequence layout: switch to a layout with a length list of the case space,
// change one length (zero, one, a tile residue, one long), the page size, order or spare pages, or go dense.
void mutate_sequences(Case& c, Rng& rng, const FuzzLimits& lim) {
  Problem& p = c.problem;
  SeqLayout& s = c.seqs;
  const bool seqs = has_sequences(p);
  const uint64_t what = seqs ? rng.below(4) : 0;
  c.explicit_values.reset();  // explicit values of a sequence layout are not encoded
  if (what == 0) {  // a layout with a list from the case space
    const auto lists = space::seq_length_lists(lim.max_seq);
    std::vector<int64_t> l = lists[rng.below(lists.size())];
    if (static_cast<int64_t>(l.size()) > lim.max_batch) l.resize(static_cast<size_t>(lim.max_batch));
    p.batch = static_cast<int64_t>(l.size());
    s = {};
    p.q_layout = p.kv_layout = AF_SEQ_DENSE;
    p.page_size = 0;
    p.kv_capacity = 0;
    switch (rng.below(4)) {
      case 0:
        p.q_layout = p.kv_layout = AF_SEQ_PACKED;
        s.q = l;
        s.k = l;
        if (rng.below(2)) std::reverse(s.k.begin(), s.k.end());
        break;
      case 1:
        p.seq_k = std::max<int64_t>(1, *std::max_element(l.begin(), l.end()));
        s.used = l;
        p.kv_capacity = p.seq_k;
        break;
      default:
        p.kv_layout = AF_SEQ_PAGED;
        p.page_size = static_cast<int32_t>(pick(rng, space::page_sizes()));
        s.used = l;
        if (rng.below(2)) p.seq_q = 1 + static_cast<int64_t>(rng.below(8));  // decode
        s.page_order = rng.below(2) ? rng.next() : 0;
        s.spare_pages = static_cast<int64_t>(rng.below(3));
    }
    return;
  }
  if (what == 1) {  // one length
    std::vector<int64_t>* lists[] = {&s.q, &s.k, &s.used};
    std::vector<int64_t>& v = *lists[rng.below(3)];
    if (v.empty()) return;
    int64_t& x = v[rng.below(v.size())];
    const int64_t t = pick(rng, space::tile_sizes());
    const int64_t cand[] = {0, 1, t - 1, t, t + 1, x + 1, std::max<int64_t>(0, x - 1), lim.max_seq};
    x = std::clamp<int64_t>(cand[rng.below(8)], 0, lim.max_seq);
    if (&v == &s.k && !s.used.empty()) {  // keep used <= slots
      for (size_t b = 0; b < s.used.size() && b < s.k.size(); ++b) s.used[b] = std::min(s.used[b], s.k[b]);
    } else if (&v == &s.used && !s.k.empty()) {
      for (size_t b = 0; b < s.used.size() && b < s.k.size(); ++b) s.k[b] = std::max(s.used[b], s.k[b]);
    }
    return;
  }
  if (what == 2 && p.kv_layout == AF_SEQ_PAGED) {  // pages
    p.page_size = static_cast<int32_t>(pick(rng, space::page_sizes()));
    s.page_order = rng.below(3) ? rng.next() : 0;
    s.spare_pages = static_cast<int64_t>(rng.below(4));
    return;
  }
  // back to dense
  s = {};
  p.q_layout = p.kv_layout = AF_SEQ_DENSE;
  p.page_size = 0;
  p.kv_capacity = 0;
  p.total_q = p.total_k = p.num_pages = p.max_pages_per_seq = 0;
  set_contiguous_strides(p);
}

void set_window_side(Rng& rng, const Problem& p, int64_t& side) {
  const int64_t t = pick(rng, space::tile_sizes());
  const int64_t cand[] = {AF_UNBOUNDED, 0, 1, t - 1, t, t + 1, std::abs(p.seq_k - p.seq_q), 3};
  side = cand[rng.below(8)];
}

}  // namespace

FuzzInput CaseDomain::init(Rng& rng) const {
  FuzzInput in;
  in.kernel = static_cast<uint32_t>(rng.below(256));
  const auto seqs = space::edge_seq_lengths(lim_.max_seq);
  const auto dims = space::edge_head_dims(lim_.max_dim);
  const auto heads = head_menu(lim_);
  const auto [hq, hkv] = heads[rng.below(heads.size())];
  const int64_t sq = pick(rng, seqs), d = pick(rng, dims);
  const int64_t sk = rng.below(3) == 0 ? sq : pick(rng, seqs);
  in.the_case =
      make_case(make_problem(1, hq, hkv, sq, sk, d, rng.below(4) == 0 ? pick(rng, dims) : d), rng.next());
  const auto& masks = space::mask_forms();
  (void)parse_mask(masks[rng.below(masks.size())], in.the_case.problem);
  if (rng.below(3) == 0) {
    in.the_case.values.dist = {Distribution::kExtreme,
                               space::extreme_magnitudes()[rng.below(space::extreme_magnitudes().size())]};
  }
  if (rng.below(3) == 0) in.the_case.values.specials.push_back(random_special(rng, in.the_case.problem));
  normalise(in, lim_);
  return in;
}

void CaseDomain::mutate(FuzzInput& in, Rng& rng) const {
  const int steps = 1 + static_cast<int>(rng.below(3));
  for (int step = 0; step < steps; ++step) {
    Case& c = in.the_case;
    Problem p = c.problem;
    int64_t b = p.batch, hq = p.heads_q, hkv = p.heads_kv, sq = p.seq_q, sk = p.seq_k, d = p.head_dim,
            dv = p.head_dim_v;
    bool reshape_needed = false;
    // Steps 0-12 and 14 are those of before issue 13; 13 changes the dtype (not under a fixed f32 campaign,
    // whose draws stay as before); 15 changes the sequence layout (issue 15).
    uint64_t op = rng.below(lim_.dtype == AF_DTYPE_F32 ? 15 : 16);
    if (lim_.dtype == AF_DTYPE_F32 && op == 13) op = 15;
    switch (op) {
      case 15:  // sequence layouts (issue 15): a layout, a length, the pages
        mutate_sequences(c, rng, lim_);
        p = c.problem;
        break;
      case 0:  // Sq near a tile boundary, +-1, decode
        switch (rng.below(4)) {
          case 0:
            sq = near_tile(rng, lim_.max_seq);
            break;
          case 1:
            sq = std::max<int64_t>(1, sq + (rng.below(2) ? 1 : -1));
            break;
          case 2:
            sq = 1;
            break;
          default:
            sq = pick(rng, space::edge_seq_lengths(lim_.max_seq));
        }
        reshape_needed = true;
        break;
      case 1:  // Sk: tile boundary, relative to Sq, 0
        switch (rng.below(5)) {
          case 0:
            sk = near_tile(rng, lim_.max_seq);
            break;
          case 1:
            sk = std::max<int64_t>(0, sk + (rng.below(2) ? 1 : -1));
            break;
          case 2:
            sk = std::clamp<int64_t>(sq + static_cast<int64_t>(rng.below(5)) - 2, 0, lim_.max_seq);
            break;
          case 3:
            sk = rng.below(4) == 0 ? 0 : std::min(lim_.max_seq, sq + pick(rng, space::tile_sizes()));
            break;
          default:
            sk = pick(rng, space::edge_seq_lengths(lim_.max_seq));
        }
        reshape_needed = true;
        break;
      case 2:  // head dims: vector-width tails, edge dims, Dv != D
        switch (rng.below(4)) {
          case 0:
            d = near_vector(rng, lim_.max_dim);
            break;
          case 1:
            d = pick(rng, space::edge_head_dims(lim_.max_dim));
            break;
          case 2:
            dv = rng.below(2) ? d : pick(rng, space::edge_head_dims(lim_.max_dim));
            break;
          default:
            d = std::clamp<int64_t>(d + (rng.below(2) ? 1 : -1), 1, lim_.max_dim);
        }
        reshape_needed = true;
        break;
      case 3: {  // heads and batch
        const auto heads = head_menu(lim_);
        std::tie(hq, hkv) = heads[rng.below(heads.size())];
        if (rng.below(3) == 0) b = 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(lim_.max_batch)));
        reshape_needed = true;
        break;
      }
      case 4: {  // mask kind and alignment from the case space, or flip the alignment
        if (rng.below(3) == 0 && p.mask_kind != AF_MASK_NONE) {
          p.mask_align = p.mask_align == AF_ALIGN_TOP_LEFT ? AF_ALIGN_BOTTOM_RIGHT : AF_ALIGN_TOP_LEFT;
        } else {
          const auto& masks = space::mask_forms();
          (void)parse_mask(masks[rng.below(masks.size())], p);
        }
        break;
      }
      case 5:  // window sides near tile sizes, zero, unbounded, |Sk - Sq|
        p.mask_kind = AF_MASK_WINDOW;
        if (rng.below(4) == 0) p.mask_align = rng.below(2) ? AF_ALIGN_BOTTOM_RIGHT : AF_ALIGN_TOP_LEFT;
        if (p.window_left < -1) p.window_left = AF_UNBOUNDED;
        set_window_side(rng, p, rng.below(2) ? p.window_left : p.window_right);
        break;
      case 6: {  // magnitudes: extreme scores around the exp overflow edge, or the plain parameter
        auto& dist = c.values.dist;
        if (rng.below(2)) {
          dist = {Distribution::kExtreme,
                  space::extreme_magnitudes()[rng.below(space::extreme_magnitudes().size())]};
        } else if (rng.below(2)) {
          dist.param = std::ldexp(dist.param, static_cast<int>(rng.below(9)) - 4);
        } else {
          dist.kind = static_cast<Distribution>(rng.below(p.dtype == AF_DTYPE_F32 ? 3 : 4));
          const auto& m = param_menu(dist.kind);
          dist.param = m[rng.below(m.size())];
        }
        if (!(dist.param > 0) || !std::isfinite(dist.param)) dist.param = 1;
        break;
      }
      case 7:  // scale
        switch (rng.below(4)) {
          case 0:
            p.scale = default_scale(p.head_dim);
            break;
          case 1:
            p.scale = p.scale * (rng.below(2) ? 2.f : 0.5f);
            break;
          case 2:
            p.scale = scale_menu()[rng.below(scale_menu().size())];
            break;
          default:
            p.scale = -p.scale;
        }
        if (!std::isfinite(p.scale)) p.scale = default_scale(p.head_dim);
        break;
      case 8:  // add a special value (kind and placement from the case space)
        if (static_cast<int64_t>(c.values.specials.size()) < lim_.max_specials)
          c.values.specials.push_back(random_special(rng, p));
        break;
      case 9:  // change or remove a special value
        if (!c.values.specials.empty()) {
          auto& s = c.values.specials[rng.below(c.values.specials.size())];
          switch (rng.below(5)) {
            case 0:
              c.values.specials.erase(c.values.specials.begin() + (&s - c.values.specials.data()));
              break;
            case 1:
              s.placement = static_cast<Placement>(rng.below(4));
              break;
            case 2:
              s.tensor = static_cast<Tensor>(rng.below(3));
              break;
            case 3:
              s.kind = space::special_kinds()[rng.below(space::special_kinds().size())];
              break;
            default:
              s.count = 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(lim_.max_special_count)));
          }
        } else {
          c.values.specials.push_back(random_special(rng, p));
        }
        break;
      case 10:
        c.seed = rng.next();
        break;
      case 11:
        in.kernel = static_cast<uint32_t>(rng.below(256));
        break;
      case 12:  // layout: padded rows / heads, or back to contiguous
        if (rng.below(2)) {
          set_contiguous_strides(p);
        } else {
          const int64_t pad = 1 + static_cast<int64_t>(rng.below(8));
          struct Layout {
            int64_t* st;
            int64_t dim, h, s;
          };
          for (const Layout& l : {Layout{p.q_stride, p.head_dim, p.heads_q, p.seq_q},
                                  Layout{p.k_stride, p.head_dim, p.heads_kv, p.seq_k},
                                  Layout{p.v_stride, p.head_dim_v, p.heads_kv, p.seq_k},
                                  Layout{p.o_stride, p.head_dim_v, p.heads_q, p.seq_q}}) {
            int64_t* st = l.st;
            const int64_t dim = l.dim, h = l.h, s = l.s;
            st[2] = dim + pad;
            st[1] = h * st[2];
            st[0] = std::max<int64_t>(s, 1) * st[1];
          }
        }
        break;
      case 13:  // dtype (unless the limits fix it), fp8 descales, or the dtype's stress inputs (case.h space::)
        switch (rng.below(3)) {
          case 0:
            if (lim_.dtype < 0) p.dtype = space::dtypes()[rng.below(space::dtypes().size())];
            break;
          case 1:
            if (fp8(p.dtype)) {
              const auto& dm = space::fp8_descales();
              float* f[] = {&p.q_descale, &p.k_descale, &p.v_descale};
              *f[rng.below(3)] = dm[rng.below(dm.size())];
              if (rng.below(2)) p.o_scale = o_scale_menu()[rng.below(o_scale_menu().size())];
            }
            break;
          default: {
            const auto ext = space::lowp_extreme_magnitudes(p.dtype);
            const auto uni = space::lowp_uniform_widths(p.dtype);
            const auto wide = space::lowp_wide_v(p.dtype);
            const uint64_t pick = rng.below(3);
            if (!ext.empty() && pick == 0)
              c.values.dist = {Distribution::kExtreme, ext[rng.below(ext.size())]};
            else if (!wide.empty() && pick == 1)
              c.values.dist = {Distribution::kWideV, wide[rng.below(wide.size())]};
            else if (!uni.empty())
              c.values.dist = {Distribution::kUniform, uni[rng.below(uni.size())]};
          }
        }
        if (!fp8(p.dtype)) p.q_descale = p.k_descale = p.v_descale = p.o_scale = 1.0f;
        break;
      default:  // explicit values: nudge one, drop them, or (rarely) materialize
        if (c.explicit_values) {
          if (rng.below(4) == 0) {
            c.explicit_values.reset();
          } else {
            auto& e = *c.explicit_values;
            std::vector<float>* vs[] = {&e.q, &e.k, &e.v};
            auto& v = *vs[rng.below(3)];
            if (!v.empty()) {
              float& x = v[rng.below(v.size())];
              static const float kSpecial[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f, 1e30f, 1e-40f};
              x = rng.below(2) ? kSpecial[rng.below(7)]
                               : x * static_cast<float>(std::ldexp(1.0, int(rng.below(9)) - 4));
            }
          }
        } else if (rng.below(8) == 0 && q_elements(p) + k_elements(p) + v_elements(p) <= 4096) {
          c = materialize(c);
        } else {
          c.seed = rng.next();
        }
    }
    if (__builtin_popcount(lim_.passes) > 1 && rng.below(8) == 0) {  // another allowed pass
      const int now = static_cast<int>(c.pass);
      for (int i = 1; i < 3; ++i)
        if (lim_.passes & (1u << ((now + i) % 3))) {
          c.pass = static_cast<Pass>((now + i) % 3);
          break;
        }
      if (c.explicit_values && !has_backward(c.pass)) c.explicit_values->dout.clear();
    }
    if (reshape_needed) {
      if (hq % hkv) hkv = 1;
      Problem np = reshaped(p, b, hq, hkv, sq, sk, d, dv);
      // A sequence layout survives a reshape (the codec resizes the length lists to the new batch).
      np.q_layout = p.q_layout;
      np.kv_layout = p.kv_layout;
      np.page_size = p.page_size;
      np.kv_capacity = p.kv_capacity;
      fit(np, lim_);
      c = reshape(c, np);
    } else {
      c = reshape(c, p);  // same shape; explicit values follow new strides
    }
    normalise(in, lim_);
  }
}

FuzzInput CaseDomain::cross_over(const FuzzInput& a, const FuzzInput& b, Rng& rng) const {
  const bool first = rng.below(2) != 0;
  FuzzInput out = first ? a : b;
  const FuzzInput& other = first ? b : a;
  Case& c = out.the_case;
  const Problem& op = other.the_case.problem;
  switch (rng.below(3)) {
    case 0:  // the other's values
      c.values = other.the_case.values;
      c.seed = other.the_case.seed;
      c.explicit_values.reset();
      break;
    case 1:  // the other's mask
      c.problem.mask_kind = op.mask_kind;
      c.problem.mask_align = op.mask_align;
      c.problem.window_left = op.window_left;
      c.problem.window_right = op.window_right;
      break;
    default: {  // the other's sequence lengths (its per-sequence layout when it has one)
      if (has_sequences(op) && rng.below(2)) {
        c.problem.batch = op.batch;
        c.problem.q_layout = op.q_layout;
        c.problem.kv_layout = op.kv_layout;
        c.problem.page_size = op.page_size;
        c.problem.kv_capacity = op.kv_capacity;
        c.problem.seq_q = op.seq_q;
        c.problem.seq_k = op.seq_k;
        c.seqs = other.the_case.seqs;
        c.explicit_values.reset();
        break;
      }
      Problem np = reshaped(c.problem, c.problem.batch, c.problem.heads_q, c.problem.heads_kv, op.seq_q,
                            op.seq_k, c.problem.head_dim, c.problem.head_dim_v);
      fit(np, lim_);
      c = reshape(c, np);
    }
  }
  normalise(out, lim_);
  return out;
}

std::vector<Case> CaseDomain::shrinks(const Case& c) const {
  std::vector<Case> out;
  const Problem& p = c.problem;
  auto shape = [&](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, int64_t dv) {
    if (b == p.batch && hq == p.heads_q && hkv == p.heads_kv && sq == p.seq_q && sk == p.seq_k &&
        d == p.head_dim && dv == p.head_dim_v)
      return;
    if (b < 1 || hq < 1 || hkv < 1 || hq % hkv || sq < 1 || sk < 0 || d < 1 || dv < 1) return;
    // Only real shrinks (no dimension grows), so the greedy loop terminates.
    if (b > p.batch || hq > p.heads_q || hkv > p.heads_kv || sq > p.seq_q || sk > p.seq_k || d > p.head_dim ||
        dv > p.head_dim_v)
      return;
    Problem np = reshaped(p, b, hq, hkv, sq, sk, d, dv);  // contiguous strides
    Case n = reshape(c, np);
    fix_specials(n);
    if (attnfuzz::validate(n).empty()) out.push_back(std::move(n));
  };
  const int64_t B = p.batch, Hq = p.heads_q, Hk = p.heads_kv, Sq = p.seq_q, Sk = p.seq_k, D = p.head_dim,
                Dv = p.head_dim_v;
  if (has_sequences(p)) {  // sequence layouts: fewer sequences, shorter ones, plainer pages, heads and dims
    auto seq = [&](auto change) {
      Case n = c;
      change(n);
      if (set_sequence_fields(n).empty() && attnfuzz::validate(n).empty() && !(n.seqs == c.seqs && n.problem.batch == B))
        out.push_back(std::move(n));
    };
    for (int64_t drop = B - 1; drop >= 0 && B > 1; --drop)
      seq([&](Case& n) {
        for (auto* v : {&n.seqs.q, &n.seqs.k, &n.seqs.used})
          if (!v->empty()) v->erase(v->begin() + drop);
        n.problem.batch = B - 1;
      });
    for (int div : {2, 0})
      for (auto member : {&SeqLayout::q, &SeqLayout::k, &SeqLayout::used})
        seq([&](Case& n) {
          for (int64_t& x : n.seqs.*member) x = div ? x / div : std::min<int64_t>(x, 1);
          if (member == &SeqLayout::k)
            for (size_t b = 0; b < n.seqs.used.size() && b < n.seqs.k.size(); ++b)
              n.seqs.used[b] = std::min(n.seqs.used[b], n.seqs.k[b]);
        });
    seq([&](Case& n) { n.seqs.page_order = 0; });
    seq([&](Case& n) { n.seqs.spare_pages = 0; });
    for (auto [hq, hk] : {std::pair{int64_t{1}, int64_t{1}}, std::pair{Hk, Hk}})
      if (hq < Hq)
        seq([&](Case& n) {
          n.problem.heads_q = hq;
          n.problem.heads_kv = hk;
          fix_specials(n);
        });
    for (int64_t d : {int64_t{1}, D / 2})
      if (d >= 1 && d < D)
        seq([&](Case& n) {
          n.problem.head_dim = d;
          if (Dv == D) n.problem.head_dim_v = d;
          n.problem.scale = float_bits(p.scale) == float_bits(default_scale(D)) ? default_scale(d) : p.scale;
          fix_specials(n);
        });
  }
  if (!has_sequences(p)) {  // dense reshapes (they would drop a sequence layout)
    shape(1, Hq, Hk, Sq, Sk, D, Dv);
    shape(1 == B ? B : B - 1, Hq, Hk, Sq, Sk, D, Dv);
    shape(B, 1, 1, Sq, Sk, D, Dv);
    shape(B, Hk, Hk, Sq, Sk, D, Dv);
    shape(B, Hq / Hk, 1, Sq, Sk, D, Dv);
    for (int64_t sq : {int64_t{1}, Sq / 2, Sq - 1}) shape(B, Hq, Hk, sq, Sk, D, Dv);
    for (int64_t sk : {int64_t{1}, Sk / 2, Sk - 1, Sq}) shape(B, Hq, Hk, Sq, sk, D, Dv);
    for (int64_t sq : {Sq / 2, Sq - 1}) shape(B, Hq, Hk, sq, std::min(Sk, sq), D, Dv);  // both shrink together
    for (int64_t d : {int64_t{1}, D / 2, D - 1}) shape(B, Hq, Hk, Sq, Sk, d, Dv == D ? d : Dv);
    for (int64_t dv : {int64_t{1}, Dv / 2, Dv - 1, D}) shape(B, Hq, Hk, Sq, Sk, D, dv);
  }
  // Specials: remove each, then smaller counts (with explicit values they are provenance only).
  const size_t n_specials = c.explicit_values ? 0 : c.values.specials.size();
  for (size_t i = 0; i < n_specials; ++i) {
    Case n = c;
    n.values.specials.erase(n.values.specials.begin() + static_cast<long>(i));
    out.push_back(std::move(n));
  }
  for (size_t i = 0; i < n_specials; ++i)
    if (c.values.specials[i].count > 1) {
      Case n = c;
      n.values.specials[i].count = std::max<int64_t>(1, n.values.specials[i].count / 2);
      out.push_back(std::move(n));
    }
  // Plainer mask, scale, layout, distribution.
  auto with_problem = [&](auto edit) {
    Case n = c;
    edit(n.problem);
    if (std::memcmp(&n.problem, &p, sizeof p) != 0 && attnfuzz::validate(n).empty())
      out.push_back(std::move(n));
  };
  with_problem([](Problem& q) {
    q.mask_kind = AF_MASK_NONE;
    q.mask_align = AF_ALIGN_TOP_LEFT;
    q.window_left = q.window_right = AF_UNBOUNDED;
  });
  if (p.mask_kind == AF_MASK_WINDOW) {
    with_problem([](Problem& q) {
      q.mask_kind = AF_MASK_CAUSAL;
      q.window_left = AF_UNBOUNDED;
      q.window_right = 0;
    });
    with_problem([](Problem& q) {
      if (q.window_left > 0) q.window_left /= 2;
    });
    with_problem([](Problem& q) {
      if (q.window_right > 0) q.window_right /= 2;
    });
  }
  with_problem([](Problem& q) { q.scale = default_scale(q.head_dim); });
  with_problem([](Problem& q) { set_contiguous_strides(q); });
  if (!c.explicit_values) {
    const ValueDist& dist = c.values.dist;
    if (dist.kind != Distribution::kUniform || dist.param != 1.0) {
      Case n = c;
      n.values.dist = {Distribution::kUniform, 1.0};
      out.push_back(std::move(n));
    }
    if (dist.param > 1.0) {
      Case n = c;
      n.values.dist.param = dist.param / 2;
      out.push_back(std::move(n));
    }
  } else {
    // Explicit values: zero blocks of each tensor (halves down to sixteenths), then round every value.
    const ExplicitValues& e = *c.explicit_values;
    for (int which = 0; which < 3; ++which) {
      const std::vector<float>& v = which == 0 ? e.q : which == 1 ? e.k : e.v;
      for (size_t parts = 2; parts <= 16; parts *= 2) {
        const size_t chunk = (v.size() + parts - 1) / parts;
        if (chunk == 0) break;
        for (size_t start = 0; start < v.size(); start += chunk) {
          bool any = false;
          for (size_t i = start; i < std::min(v.size(), start + chunk); ++i) any |= float_bits(v[i]) != 0;
          if (!any) continue;
          Case n = c;
          auto& nv = which == 0   ? n.explicit_values->q
                     : which == 1 ? n.explicit_values->k
                                  : n.explicit_values->v;
          std::fill(nv.begin() + static_cast<long>(start),
                    nv.begin() + static_cast<long>(std::min(v.size(), start + chunk)), 0.f);
          out.push_back(std::move(n));
        }
      }
    }
    for (double grid : {1.0, 0.25}) {
      Case n = c;
      bool changed = false;
      for (auto* v : {&n.explicit_values->q, &n.explicit_values->k, &n.explicit_values->v})
        for (float& x : *v)
          if (std::isfinite(x)) {
            const float r = static_cast<float>(std::round(x / grid) * grid);
            changed |= float_bits(r) != float_bits(x);
            x = r;
          }
      if (changed) out.push_back(std::move(n));
    }
  }
  return out;
}

std::string CaseDomain::print(const FuzzInput& in) const {
  return "kernel#" + std::to_string(in.kernel) + " " + describe(in.the_case);
}

Case materialize(const Case& c) {
  if (has_sequences(c.problem)) return c;  // explicit values of a sequence layout are not encoded
  if (c.explicit_values) return c;
  Case n = c;
  Tensors t = generate(c);
  n.explicit_values = ExplicitValues{std::move(t.q), std::move(t.k), std::move(t.v), std::move(t.dout)};
  return n;
}

}  // namespace attnfuzz::fuzz
