// external.cpp - loading external NPY computations, output-only judgement and classification, metamorphic
// variants.
#include "npy/external.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "attnfuzz/corpus.h"
#include "check/compare.h"
#include "oracle/lowp.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace attnfuzz::npy {

const char* layout_name(Layout l) { return l == Layout::kBSHD ? "bshd" : "bhsd"; }
bool parse_layout(const std::string& t, Layout& out) {
  if (t == "bshd" || t == "BSHD") return out = Layout::kBSHD, true;
  if (t == "bhsd" || t == "BHSD") return out = Layout::kBHSD, true;
  return false;
}
const char* compute_dtype_name(int32_t d) {
  return d == AF_DTYPE_F16        ? "fp16"
         : d == AF_DTYPE_BF16     ? "bf16"
         : d == AF_DTYPE_FP8_E4M3 ? "fp8-e4m3"
         : d == AF_DTYPE_FP8_E5M2 ? "fp8-e5m2"
                                  : "fp32";
}
std::optional<int32_t> parse_compute_model(const std::string& t) {
  if (t == "fused") return AF_COMPUTE_FUSED;
  if (t == "unfused") return AF_COMPUTE_UNFUSED;
  return std::nullopt;
}

std::optional<int32_t> parse_compute_dtype(const std::string& t) {
  if (t == "fp32" || t == "f32" || t == "float32") return AF_DTYPE_F32;
  if (t == "fp16" || t == "f16" || t == "float16") return AF_DTYPE_F16;
  if (t == "bf16" || t == "bfloat16") return AF_DTYPE_BF16;
  if (t == "fp8-e4m3" || t == "e4m3") return AF_DTYPE_FP8_E4M3;  // per-head descales (q/k/v_descale.npy)
  if (t == "fp8-e5m2" || t == "e5m2") return AF_DTYPE_FP8_E5M2;
  return std::nullopt;
}

namespace {

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}
std::string join(const std::vector<int64_t>& v, size_t max_items = 8) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > max_items) s += ", ... (" + std::to_string(v.size()) + ")";
  return s;
}

// [B, H, S, D] -> [B, S, H, D] (or back with to_bhsd).
std::vector<float> transpose_sh(const std::vector<float>& x, int64_t B, int64_t H, int64_t S, int64_t D,
                                bool to_bhsd) {
  std::vector<float> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) {
          const size_t bhsd = static_cast<size_t>(((b * H + h) * S + s) * D + d);
          const size_t bshd = static_cast<size_t>(((b * S + s) * H + h) * D + d);
          if (to_bhsd)
            y[bhsd] = x[bshd];
          else
            y[bshd] = x[bhsd];
        }
  return y;
}

[[noreturn]] void fail(const std::string& msg) { throw NpyError(msg); }

}  // namespace

void read_sidecar(const fs::path& path, Spec& spec) {
  std::string text;
  if (std::string e = read_regular_file(path, kMaxJsonBytes, text); !e.empty()) fail(e);
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    fail(path.string() + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) fail(path.string() + ": expected a JSON object");
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& key = it.key();
      if (key == "layout") {
        if (!parse_layout(it->get<std::string>(), spec.layout))
          fail(path.string() + ": layout must be bshd or bhsd");
      } else if (key == "mask") {
        spec.mask = it->get<std::string>();
      } else if (key == "scale") {
        if (!it->is_null()) spec.scale = it->get<float>();
      } else if (key == "kv_heads") {
        spec.kv_heads = it->get<int64_t>();
      } else if (key == "compute_dtype") {
        auto d = parse_compute_dtype(it->get<std::string>());
        if (!d) fail(path.string() + ": compute_dtype must be fp32, fp16, bf16, fp8-e4m3 or fp8-e5m2");
        spec.compute_dtype = *d;
      } else if (key == "compute_model") {
        auto m = parse_compute_model(it->get<std::string>());
        if (!m) fail(path.string() + ": compute_model must be fused or unfused");
        spec.compute_model = *m;
      } else if (key == "bf16_raw") {
        spec.bf16_raw = it->get<bool>();
      } else if (key == "softcap") {
        spec.softcap = it->get<float>();
        if (!(*spec.softcap > 0) || !std::isfinite(*spec.softcap)) fail(path.string() + ": softcap must be > 0");
      } else if (key == "block_size") {
        const auto v = it->get<std::vector<int64_t>>();
        if (v.size() != 2 || v[0] < 1 || v[1] < 1 || v[0] > (1 << 20) || v[1] > (1 << 20))
          fail(path.string() + ": block_size must be [query rows, keys] per block, each in [1, 1048576]");
        spec.block_size = std::make_pair(static_cast<int32_t>(v[0]), static_cast<int32_t>(v[1]));
      } else if (key == "kv_shared") {
        spec.kv_shared = it->get<bool>();
      } else if (key == "comment" || key == "variant") {
      } else {
        fail(path.string() + ": unknown key '" + key +
             "' (known: layout, mask, scale, kv_heads, compute_dtype, compute_model, bf16_raw, softcap, "
             "block_size, "
             "kv_shared)");
      }
    }
  } catch (const json::exception& e) {
    fail(path.string() + ": wrong value type (" + std::string(e.what()) + ")");
  }
}

Spec resolve_spec(const fs::path& sidecar, const Overrides& o) {
  Spec s;
  std::error_code ec;
  if (!sidecar.empty() && fs::exists(sidecar, ec)) read_sidecar(sidecar, s);
  if (o.layout) s.layout = *o.layout;
  if (o.mask) s.mask = *o.mask;
  if (o.scale) s.scale = *o.scale;
  if (o.kv_heads) s.kv_heads = *o.kv_heads;
  if (o.compute_dtype) s.compute_dtype = *o.compute_dtype;
  if (o.compute_model) s.compute_model = *o.compute_model;
  s.bf16_raw |= o.bf16_raw;
  return s;
}

std::string sidecar_text(const Spec& s) {
  json j;
  j["layout"] = layout_name(s.layout);
  j["mask"] = s.mask;
  if (s.scale) j["scale"] = *s.scale;
  if (s.kv_heads) j["kv_heads"] = *s.kv_heads;
  if (s.compute_dtype >= 0) j["compute_dtype"] = compute_dtype_name(s.compute_dtype);
  j["compute_model"] = s.compute_model == AF_COMPUTE_FUSED ? "fused" : "unfused";
  j["bf16_raw"] = s.bf16_raw;
  if (s.softcap) j["softcap"] = *s.softcap;
  if (s.block_size) j["block_size"] = {s.block_size->first, s.block_size->second};
  if (s.kv_shared) j["kv_shared"] = true;
  return j.dump(2) + "\n";
}

Files files_in(const fs::path& dir) {
  Files f{dir / "q.npy", dir / "k.npy", dir / "v.npy", dir / "o.npy", {}};
  std::error_code ec;
  if (fs::exists(dir / "lse.npy", ec)) f.lse = dir / "lse.npy";
  // Files that come together: whether all of `names` are present (none: false; some: an incomplete input, refused).
  auto all_or_none = [&](std::initializer_list<const char*> names, const char* what, const char* together) {
    std::string have, missing;
    for (const char* g : names) {
      std::string& list = fs::exists(dir / g, ec) ? have : missing;
      list += (list.empty() ? "" : ", ") + std::string(g);
    }
    if (!have.empty() && !missing.empty())
      throw NpyError(dir.string() + ": incomplete " + what + ": " + have + " without " + missing + " (give " +
                     together + " together)");
    return !have.empty();
  };
  // Backward: all four or none. Any one present without the others is an incomplete input, never a forward
  // check that leaves the gradients unjudged.
  if (all_or_none({"do.npy", "dq.npy", "dk.npy", "dv.npy"}, "backward files", "do.npy, dq.npy, dk.npy and dv.npy"))
    f.dout = dir / "do.npy", f.dq = dir / "dq.npy", f.dk = dir / "dk.npy", f.dv = dir / "dv.npy";
  if (fs::exists(dir / "sinks.npy", ec)) f.sinks = dir / "sinks.npy";
  if (fs::exists(dir / "alibi_slopes.npy", ec)) f.alibi_slopes = dir / "alibi_slopes.npy";
  if (fs::exists(dir / "bias.npy", ec)) f.bias = dir / "bias.npy";
  if (fs::exists(dir / "mask.npy", ec)) f.mask = dir / "mask.npy";
  if (fs::exists(dir / "mask_bits.npy", ec)) f.mask_bits = dir / "mask_bits.npy";
  if (fs::exists(dir / "block_mask.npy", ec)) f.block_mask = dir / "block_mask.npy";
  // Per-head descales: all three or none (one alone is an incomplete input, never a per-tensor check).
  if (all_or_none({"q_descale.npy", "k_descale.npy", "v_descale.npy"}, "per-head descales",
                  "q_descale.npy, k_descale.npy and v_descale.npy"))
    f.q_descale = dir / "q_descale.npy", f.k_descale = dir / "k_descale.npy",
    f.v_descale = dir / "v_descale.npy";
  return f;
}

// A mask file [B|1, Hq|1, rows|1, cols] (cols never broadcast): its bytes (non-zero -> 1 unless `raw`: the values, each
// 0..255) and the broadcast dimensions ("bhi" subset) of its size-1 dimensions.
std::vector<uint8_t> read_mask_file(const fs::path& path, const char* name, const int64_t full[4], bool raw,
                                    std::string& bcast) {
  Array a = read_array(path, false);
  bool ok = a.shape.size() == 4 && a.shape[3] == full[3];
  bcast.clear();
  for (int d = 0; d < 3 && ok; ++d) {
    ok = a.shape[static_cast<size_t>(d)] == full[d] || a.shape[static_cast<size_t>(d)] == 1;
    if (ok && a.shape[static_cast<size_t>(d)] == 1 && full[d] != 1) bcast += "bhi"[d];
  }
  if (!ok)
    fail(std::string("shape mismatch: ") + name + " must be [B|1, Hq|1, " + std::to_string(full[2]) + "|1, " +
         std::to_string(full[3]) + "] with B, Hq = " + std::to_string(full[0]) + ", " + std::to_string(full[1]) +
         ", got " + shape_text(a.shape));
  std::vector<uint8_t> out;
  out.reserve(a.data.size());
  for (float x : a.data) {
    if (raw && !(x >= 0 && x <= 255 && x == std::floor(x))) fail(std::string(name) + " holds a value that is not a byte");
    out.push_back(raw ? static_cast<uint8_t>(x) : static_cast<uint8_t>(x != 0));
  }
  return out;
}

// Custom masks (issue 28 item 4): mask.npy (dense) or mask_bits.npy (bit-packed), block_mask.npy with the sidecar's
// block_size; one broadcast for all of them (the first file's).
void load_masks(const Files& files, const Spec& spec, Problem& p, External& e) {
  if (!files.mask.empty() && !files.mask_bits.empty()) fail("give mask.npy or mask_bits.npy, not both");
  std::string bcast, bcast2;
  if (!files.mask.empty() || !files.mask_bits.empty()) {
    const bool bits = !files.mask_bits.empty();
    p.variants |= bits ? AF_VARIANT_MASK_BITS : AF_VARIANT_MASK_DENSE;
    const int64_t full[4] = {p.batch, p.heads_q, p.seq_q, bits ? (p.seq_k + 7) / 8 : p.seq_k};
    e.custom_mask = read_mask_file(bits ? files.mask_bits : files.mask, bits ? "mask_bits" : "mask", full, bits, bcast);
  }
  if (!files.block_mask.empty()) {
    p.variants |= AF_VARIANT_BLOCK_SPARSE;
    const auto bs = spec.block_size.value_or(std::make_pair(128, 128));
    p.block_q = bs.first, p.block_k = bs.second;
    const int64_t full[4] = {p.batch, p.heads_q, query_blocks(p), key_blocks(p)};
    e.block_mask = read_mask_file(files.block_mask, "block_mask", full, true, bcast2);
    for (uint8_t v : e.block_mask)
      if (v > kBlockPartial) fail("block_mask holds a value other than 0 (empty), 1 (full), 2 (partial)");
    if (!e.custom_mask.empty() && bcast != bcast2)
      fail("mask and block_mask broadcast different dimensions ('" + bcast + "' and '" + bcast2 + "')");
    bcast = bcast2;
  }
  if (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS))
    if (std::string err = set_mask_strides(p, bcast); !err.empty()) fail(err);
  if (p.variants & AF_VARIANT_BLOCK_SPARSE)
    if (std::string err = set_block_mask_strides(p, bcast); !err.empty()) fail(err);
}

namespace {
// Per-head fp8 descales (q_descale.npy [Hq] or [B, Hq], k_descale.npy / v_descale.npy [Hkv] or [B, Hkv]): one
// value per head for every batch, or (any file [B, H]) per batch with descale_stride {Hq, 1} (a [H] file
// repeated).
void load_head_descales(const Files& files, Problem& p, External& e) {
  const int64_t B = p.batch;
  struct D {
    const char* name;
    const fs::path* path;
    std::vector<float>* out;
    int64_t heads;
    Array a;
  };
  D ds[] = {{"q_descale", &files.q_descale, &e.q_descale_h, p.heads_q, {}},
            {"k_descale", &files.k_descale, &e.k_descale_h, p.heads_kv, {}},
            {"v_descale", &files.v_descale, &e.v_descale_h, p.heads_kv, {}}};
  bool per_batch = false;
  for (D& d : ds) {
    d.a = read_array(*d.path, false);
    const bool flat = d.a.shape == std::vector<int64_t>{d.heads},
               batched = d.a.shape == std::vector<int64_t>{B, d.heads};
    if (!flat && !batched)
      fail(std::string("shape mismatch: ") + d.name + " must be [" + (d.heads == p.heads_q ? "Hq" : "Hkv") +
           "] = " + shape_text({d.heads}) + " or [B, H] = " + shape_text({B, d.heads}) + ", got " +
           shape_text(d.a.shape));
    per_batch |= batched && B > 1;
    for (float x : d.a.data)
      if (std::string err = validate_descale_value(x); !err.empty())
        fail(std::string(d.name) + " holds " + std::to_string(x) + ": " + err);
  }
  p.variants |= AF_VARIANT_HEAD_DESCALE;
  set_descale_strides(p, per_batch);
  for (D& d : ds) {
    d.out->assign(static_cast<size_t>(descale_h_elements(p, d.out == &e.q_descale_h)), 1.0f);
    const bool batched = d.a.shape.size() == 2;
    for (int64_t b = 0; b < (per_batch ? B : 1); ++b)
      for (int64_t h = 0; h < d.heads; ++h)
        (*d.out)[static_cast<size_t>(descale_h_index(p, b, h))] =
            d.a.data[static_cast<size_t>((batched ? b * d.heads : 0) + h)];
  }
}
}  // namespace

// kv_shared (MLA, docs/npy.md): V as the first Dv columns of k's rows, Dv = o's last dimension; v.npy must be
// absent (a V of its own would contradict the sharing).
Array k_view(const Files& files, const Array& k, const Array& o) {
  std::error_code ec;
  if (fs::exists(files.v, ec))
    fail("kv_shared: V is the first Dv columns of k.npy; remove " + files.v.string() +
         " (or drop kv_shared)");
  if (k.shape.size() != 4 || o.shape.size() != 4 || o.shape[3] > k.shape[3] || o.shape[3] < 1)
    fail("kv_shared: k and o must have 4 dimensions and o's last (Dv) at most k's (D); got k " +
         shape_text(k.shape) + ", o " + shape_text(o.shape));
  Array v = k;
  const int64_t D = k.shape[3], Dv = o.shape[3];
  v.shape[3] = Dv;
  v.data.resize(static_cast<size_t>(k.shape[0] * k.shape[1] * k.shape[2] * Dv));
  for (size_t r = 0; r < v.data.size() / static_cast<size_t>(Dv); ++r)
    std::copy_n(k.data.begin() + static_cast<std::ptrdiff_t>(r * D), Dv,
                v.data.begin() + static_cast<std::ptrdiff_t>(r * Dv));
  return v;
}

External load_external(const Files& files, const Spec& spec) {
  Array q = read_array(files.q, spec.bf16_raw), k = read_array(files.k, spec.bf16_raw),
        o = read_array(files.o, spec.bf16_raw);
  Array v = spec.kv_shared ? k_view(files, k, o) : read_array(files.v, spec.bf16_raw);
  const bool bshd = spec.layout == Layout::kBSHD;
  const char* lay = bshd ? "[B, S, H, D]" : "[B, H, S, D]";
  for (const auto* a : {&q, &k, &v, &o})
    if (a->shape.size() != 4)
      fail("shape mismatch: q, k, v and o must have 4 dimensions " + std::string(lay) + "; got q " +
           shape_text(q.shape) + ", k " + shape_text(k.shape) + ", v " + shape_text(v.shape) + ", o " +
           shape_text(o.shape));
  const int si = bshd ? 1 : 2, hi = bshd ? 2 : 1;
  const int64_t B = q.shape[0], Sq = q.shape[si], Hq = q.shape[hi], D = q.shape[3];
  const int64_t Sk = k.shape[si], Hkv = k.shape[hi], Dv = v.shape[3];
  std::string why;
  if (k.shape[0] != B || v.shape[0] != B || o.shape[0] != B)
    why = "batch sizes differ";
  else if (k.shape[3] != D)
    why = "q and k head dims differ";
  else if (v.shape[si] != Sk || v.shape[hi] != Hkv)
    why = "k and v disagree on keys or heads";
  else if (o.shape[si] != Sq || o.shape[hi] != Hq || o.shape[3] != Dv)
    why = "o is not [B, Sq, Hq, Dv] in this layout";
  else if (Hkv < 1 || Hq % Hkv != 0)
    why = "query heads are not a multiple of kv heads";
  else if (spec.kv_heads && *spec.kv_heads != Hkv)
    why = "kv_heads = " + std::to_string(*spec.kv_heads) + " but k has " + std::to_string(Hkv);
  if (!why.empty()) {
    std::string hint;
    // Would the other layout make them agree? Then say so.
    const int si2 = bshd ? 2 : 1, hi2 = bshd ? 1 : 2;
    if (k.shape[0] == B && v.shape[si2] == k.shape[si2] && v.shape[hi2] == k.shape[hi2] &&
        o.shape[si2] == q.shape[si2] && o.shape[hi2] == q.shape[hi2] &&
        q.shape[hi2] % std::max<int64_t>(k.shape[hi2], 1) == 0)
      hint = std::string(" (the shapes agree as ") +
             (bshd ? "[B, H, S, D]: pass --layout bhsd)" : "[B, S, H, D]: pass --layout bshd)");
    fail("shape mismatch (" + std::string(layout_name(spec.layout)) + " " + lay + "): " + why + ": q " +
         shape_text(q.shape) + ", k " + shape_text(k.shape) + ", v " + shape_text(v.shape) + ", o " +
         shape_text(o.shape) + hint);
  }
  External e;
  Problem p = make_problem(B, Hq, Hkv, Sq, Sk, D, Dv);
  if (std::string err = parse_mask(spec.mask, p); !err.empty()) fail("mask: " + err);
  if (spec.scale) p.scale = *spec.scale;
  if (spec.kv_shared) share_kv(p);
  if (std::string err = validate(p); !err.empty()) fail("invalid problem: " + err);
  e.stored = q.stored;
  e.compute_dtype = spec.compute_dtype >= 0        ? spec.compute_dtype
                    : q.stored == Stored::kF16     ? AF_DTYPE_F16
                    : q.stored == Stored::kBF16Raw ? AF_DTYPE_BF16
                                                   : AF_DTYPE_F32;
  e.compute_model = spec.compute_model;
  p.dtype = e.compute_dtype;  // what the kernel computed in (reports show it); values are the stored ones
  if (bshd) {
    e.q = std::move(q.data), e.k = std::move(k.data), e.v = std::move(v.data), e.o = std::move(o.data);
  } else {
    e.q = transpose_sh(q.data, B, Hq, Sq, D, false);
    e.k = transpose_sh(k.data, B, Hkv, Sk, D, false);
    e.v = transpose_sh(v.data, B, Hkv, Sk, Dv, false);
    e.o = transpose_sh(o.data, B, Hq, Sq, Dv, false);
  }
  if (spec.kv_shared)  // V's elements at K's offsets (v_stride = k_stride): K's buffer cut to v_elements
    e.v.assign(e.k.begin(), e.k.begin() + v_elements(p));
  if (!files.lse.empty()) {
    Array l = read_array(files.lse, spec.bf16_raw);
    if (l.shape != std::vector<int64_t>{B, Hq, Sq})
      fail("shape mismatch: lse must be [B, Hq, Sq] = " + shape_text({B, Hq, Sq}) + ", got " +
           shape_text(l.shape));
    e.lse = std::move(l.data);
  }
  if (!files.dout.empty() || !files.dq.empty() || !files.dk.empty() || !files.dv.empty()) {
    if (files.dout.empty() || files.dq.empty() || files.dk.empty() || files.dv.empty())
      fail("backward: give do, dq, dk and dv together (do.npy, dq.npy, dk.npy, dv.npy)");
    struct G {
      const char* name;
      const fs::path* path;
      std::vector<float>* out;
      int64_t s, h, d;
    };
    for (const G& g : {G{"do", &files.dout, &e.dout, Sq, Hq, Dv}, G{"dq", &files.dq, &e.dq, Sq, Hq, D},
                       G{"dk", &files.dk, &e.dk, Sk, Hkv, D}, G{"dv", &files.dv, &e.dv, Sk, Hkv, Dv}}) {
      Array a = read_array(*g.path, spec.bf16_raw);
      const std::vector<int64_t> want = bshd ? std::vector<int64_t>{B, g.s, g.h, g.d} : std::vector<int64_t>{B, g.h, g.s, g.d};
      if (a.shape != want)
        fail(std::string("shape mismatch: ") + g.name + " must be " + shape_text(want) + " (like " +
             (g.name[1] == 'o' ? "o" : g.name[1] == 'q' ? "q" : g.name[1] == 'k' ? "k" : "v") + "), got " +
             shape_text(a.shape));
      *g.out = bshd ? std::move(a.data) : transpose_sh(a.data, B, g.h, g.s, g.d, false);
    }
  }
  for (const auto& [name, a] : {std::pair<const char*, const Array*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    if (a->f64_inexact)
      e.notes.push_back(std::string(name) +
                        " is float64 with values that are not float32: judged on their float32 rounding");
    if (e.compute_dtype != AF_DTYPE_F32) {
      const std::vector<float>& x = name[0] == 'q' ? e.q : name[0] == 'k' ? e.k : e.v;
      int64_t inexact = 0;
      for (float f : x) inexact += !representable(f, e.compute_dtype);
      if (inexact)
        e.notes.push_back(std::string(name) + ": " + std::to_string(inexact) + " stored value(s) are not " +
                          compute_dtype_name(e.compute_dtype) +
                          " numbers; the bound allows the kernel to round them");
    }
  }
  // Score variants (issue 28): sinks and slopes [Hq]; the bias [B|1, Hq|1, Sq|1, Sk|1], size-1 dimensions broadcast.
  if (spec.softcap) {
    p.variants |= AF_VARIANT_SOFTCAP;
    p.softcap = *spec.softcap;
  }
  for (const auto& [path, out, bit, name] :
       {std::tuple<const fs::path*, std::vector<float>*, uint32_t, const char*>{&files.sinks, &e.sinks, AF_VARIANT_SINK, "sinks"},
        {&files.alibi_slopes, &e.alibi_slopes, AF_VARIANT_ALIBI, "alibi_slopes"}}) {
    if (path->empty()) continue;
    Array a = read_array(*path, false);
    if (a.shape != std::vector<int64_t>{Hq})
      fail(std::string("shape mismatch: ") + name + " must be [Hq] = " + shape_text({Hq}) + ", got " + shape_text(a.shape));
    for (float x : a.data)
      if (std::isnan(x) || (bit == AF_VARIANT_SINK && x == INFINITY) || (bit == AF_VARIANT_ALIBI && !std::isfinite(x)))
        fail(std::string(name) + " holds a value that is not allowed (sinks: finite or -inf; slopes: finite)");
    *out = std::move(a.data);
    p.variants |= bit;
  }
  if (!files.bias.empty()) {
    Array a = read_array(files.bias, false);
    const int64_t full[4] = {B, Hq, Sq, Sk};
    bool ok = a.shape.size() == 4;
    std::string bcast;
    for (int d = 0; d < 4 && ok; ++d) {
      ok = a.shape[static_cast<size_t>(d)] == full[d] || a.shape[static_cast<size_t>(d)] == 1;
      if (ok && a.shape[static_cast<size_t>(d)] == 1 && full[d] != 1) bcast += "bhij"[d];
    }
    if (!ok)
      fail("shape mismatch: bias must be [B|1, Hq|1, Sq|1, Sk|1] with B, Hq, Sq, Sk = " + shape_text({B, Hq, Sq, Sk}) +
           ", got " + shape_text(a.shape));
    p.variants |= AF_VARIANT_BIAS;
    if (std::string err = set_bias_strides(p, bcast); !err.empty()) fail(err);
    e.bias = std::move(a.data);
  }
  load_masks(files, spec, p, e);
  if (!files.q_descale.empty()) load_head_descales(files, p, e);
  if (p.variants) e.notes.push_back("variants " + variant_names(p.variants) + " from the input files / sidecar");
  if (std::string err = validate(p); !err.empty()) fail("invalid problem: " + err);
  e.problem = p;
  e.label = "npy:" + files.o.parent_path().string();
  return e;
}

Case case_of(const External& e) {
  Case c = make_case(e.problem, 0);
  c.label = e.label;
  if (!e.dq.empty()) c.pass = Pass::kFwdBwd;
  c.variants.sinks = e.sinks;  // score variants: the files' values
  c.variants.alibi_slopes = e.alibi_slopes;
  c.variants.bias = e.bias;
  c.variants.custom_mask = e.custom_mask;
  c.variants.block_mask = e.block_mask;
  c.variants.q_descale_h = e.q_descale_h;
  c.variants.k_descale_h = e.k_descale_h;
  c.variants.v_descale_h = e.v_descale_h;
  return c;
}

namespace {

// The failing O rows (b, h, s) of a comparison.
struct RowKey {
  int64_t b, h, s;
  bool operator<(const RowKey& o) const { return std::tie(b, h, s) < std::tie(o.b, o.h, o.s); }
};
std::set<RowKey> failing_rows(const External& e, const OracleResult& ex) {
  std::set<RowKey> rows;
  const Problem& p = e.problem;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s : ex.sampled) {
        const RowInfo& ri = ex.row(b, h, s);
        if (!ri.computed || !ri.inside_contract()) continue;
        bool bad = false;
        for (int64_t d = 0; d < p.head_dim_v && !bad; ++d) {
          const size_t i = ex.o_at(b, s, h, d);
          bad = judge_element(ex.o[i], e.o[static_cast<size_t>(o_index(p, b, s, h, d))], ex.o_bound[i]).fail;
        }
        if (!bad && !e.lse.empty()) {
          const size_t li = ex.lse_at(b, h, s);
          bad = judge_element(ex.lse[li], e.lse[static_cast<size_t>(lse_index(p, b, h, s))], ex.lse_bound[li])
                    .fail;
        }
        if (bad) rows.insert({b, h, s});
      }
  return rows;
}

// Alternative masks a mask bug typically computes instead.
std::vector<std::string> alternative_masks(const Problem& p) {
  std::vector<std::string> alts;
  const std::string cur = mask_to_string(p);
  if (p.mask_kind != AF_MASK_NONE) alts.push_back("none");
  Problem t = p;
  auto add = [&](const std::string& m) {
    Problem x = p;
    if (parse_mask(m, x).empty() && mask_to_string(x) != cur &&
        std::find(alts.begin(), alts.end(), mask_to_string(x)) == alts.end())
      alts.push_back(mask_to_string(x));
  };
  if (cur == "causal-br") add("causal-tl");
  if (cur == "causal-tl") add("causal-br");
  if (cur == "none") {
    add("causal-br");
    add("causal-tl");
  }
  if (cur.rfind("window:", 0) == 0) {
    const int64_t L = window_left(p), R = window_right(p);
    auto side = [](int64_t x) { return x == AF_UNBOUNDED ? std::string("inf") : std::to_string(x); };
    const std::string al = p.mask_align == AF_ALIGN_TOP_LEFT ? "-tl" : "-br",
                      other = p.mask_align == AF_ALIGN_TOP_LEFT ? "-br" : "-tl";
    add("window:" + side(L) + "," + side(R) + other);
    if (L != AF_UNBOUNDED)
      add("window:" + side(L + 1) + "," + side(R) + al),
          add("window:" + side(std::max<int64_t>(L - 1, 0)) + "," + side(R) + al);
    if (R != AF_UNBOUNDED)
      add("window:" + side(L) + "," + side(R + 1) + al),
          add("window:" + side(L) + "," + side(std::max<int64_t>(R - 1, 0)) + al);
  }
  (void)t;
  return alts;
}

// Output-only classification of a failed comparison.
void classify_output(const External& e, const OracleResult& ex, const OracleOptions& opts, CheckResult& r) {
  const Problem& p = e.problem;
  const std::set<RowKey> bad = failing_rows(e, ex);
  FailureClass cls = r.failure;
  std::string decided;
  // 1. Rows with no visible key must be exactly 0 (LSE -inf).
  std::vector<int64_t> masked_rows;
  for (const RowKey& k : bad)
    if (visible_keys(p, k.s).empty() && (masked_rows.empty() || masked_rows.back() != k.s))
      masked_rows.push_back(k.s);
  if (!masked_rows.empty()) {
    const int64_t s = masked_rows.front();
    r.evidence.push_back(
        {"mask", std::to_string(masked_rows.size()) + " fully masked row(s) (no visible key) are not O = 0" +
                     std::string(e.lse.empty() ? "" : " / LSE = -inf") + ": rows " + join(masked_rows) +
                     "; e.g. O[b=0,s=" + std::to_string(s) +
                     ",h=0,d=0] = " + fmt("%.9g", e.o[static_cast<size_t>(o_index(p, 0, s, 0, 0))])});
    cls = FailureClass::kMask;
    decided = "fully masked rows";
  }
  // 2. Masked non-finite inputs reaching the output: NaN/Inf in O of a row whose visible keys are finite.
  if (cls != FailureClass::kMask && r.failure == FailureClass::kNonFinite) {
    int64_t leaks = 0;
    std::string first;
    for (const RowKey& k : bad) {
      const RowInfo& ri = ex.row(k.b, k.h, k.s);
      if (ri.kind != RowKind::kNormal) continue;
      bool got_nonfinite = false;
      for (int64_t d = 0; d < p.head_dim_v && !got_nonfinite; ++d)
        got_nonfinite = !std::isfinite(e.o[static_cast<size_t>(o_index(p, k.b, k.s, k.h, d))]);
      if (!got_nonfinite) continue;
      // Does some masked key of this row hold a non-finite k or v?
      const KeyRange kr = visible_keys(p, k.s);
      const int64_t hk = kv_head(p, k.h);
      for (int64_t j = 0; j < p.seq_k; ++j) {
        if (j >= kr.first && j < kr.last) continue;
        bool nf = false;
        for (int64_t d = 0; d < p.head_dim && !nf; ++d)
          nf = !std::isfinite(e.k[static_cast<size_t>(k_index(p, k.b, j, hk, d))]);
        for (int64_t d = 0; d < p.head_dim_v && !nf; ++d)
          nf = !std::isfinite(e.v[static_cast<size_t>(v_index(p, k.b, j, hk, d))]);
        if (nf) {
          if (leaks++ == 0)
            first = "row s=" + std::to_string(k.s) + " (b=" + std::to_string(k.b) +
                    ", h=" + std::to_string(k.h) + ") is NaN/Inf but only its masked key " +
                    std::to_string(j) + " holds a non-finite k or v";
          break;
        }
      }
    }
    if (leaks) {
      r.evidence.push_back({"mask", std::to_string(leaks) +
                                        " row(s) with finite visible inputs came out NaN/Inf while a "
                                        "masked key holds NaN/Inf (masked values reach the output): " +
                                        first});
      cls = FailureClass::kMask;
      decided = "masked non-finite";
    }
  }
  // 3. Does the output match the exact result under another mask? (shifted window, other alignment, none)
  if (cls != FailureClass::kMask && !bad.empty() && r.failure == FailureClass::kPrecision) {
    for (const std::string& m : alternative_masks(p)) {
      Problem alt = p;
      parse_mask(m, alt);
      OracleOptions o2 = opts;
      o2.baseline = false;
      const OracleResult ax = compute_oracle(alt, e.q.data(), e.k.data(), e.v.data(), e.variant_inputs(), o2);
      bool all = true;
      for (const RowKey& k : bad) {
        if (!ax.row(k.b, k.h, k.s).computed) {
          all = false;
          break;
        }
        for (int64_t d = 0; d < p.head_dim_v && all; ++d) {
          const size_t i = ax.o_at(k.b, k.s, k.h, d);
          all = !judge_element(ax.o[i], e.o[static_cast<size_t>(o_index(p, k.b, k.s, k.h, d))], ax.o_bound[i])
                     .fail;
        }
        if (!all) break;
      }
      if (all) {
        r.evidence.push_back({"mask", "all " + std::to_string(bad.size()) +
                                          " failing row(s) match the exact result under mask " + m +
                                          " instead of " + mask_to_string(p)});
        cls = FailureClass::kMask;
        decided = "other mask";
        break;
      }
    }
  }
  if (r.failure == FailureClass::kNonFinite) {
    int64_t nan_got = 0, nan_exp = 0;
    for (const ElementReport& w : r.worst) {
      nan_got += !std::isfinite(w.got) && std::isfinite(w.expected);
      nan_exp += std::isfinite(w.got) && !std::isfinite(w.expected);
    }
    r.evidence.push_back({"non-finite", "of the worst " + std::to_string(r.worst.size()) + " elements, " +
                                            std::to_string(nan_got) +
                                            " are NaN/Inf where the exact value is finite and " +
                                            std::to_string(nan_exp) + " finite where it is NaN/Inf"});
  }
  r.evidence.push_back(
      {"undeterminable",
       "from one output alone the tool cannot tell rescale (needs the same inputs with keys reordered: "
       "attn-check --npy-emit), oob-read / oob-write (needs the kernel's buffers) or barrier-race "
       "(needs reruns) from " +
           std::string(failure_class_name(cls))});
  if (cls != r.failure) {
    r.failure = cls;
    r.evidence.push_back({"classify", std::string(failure_class_name(cls)) + " by " + decided});
  } else if (cls == FailureClass::kPrecision) {
    r.reason += " (class from one output: rescale, oob-read and barrier-race cannot be excluded)";
  }
}

}  // namespace

Judged judge_external(const External& e, const OracleOptions& base, size_t worst) {
  Judged j;
  CheckResult& r = j.result;
  r.kernel = "external";
  r.backend = "npy";
  r.device = std::string("computed elsewhere (") + compute_dtype_name(e.compute_dtype) + ")";
  OracleOptions opts = base;
  opts.compute_dtype = e.compute_dtype;
  opts.compute_model = e.compute_model;
  const OracleResult ex = compute_oracle(e.problem, e.q.data(), e.k.data(), e.v.data(), e.variant_inputs(), opts);
  CompareOptions co;
  co.worst = worst;
  j.ratio_map = compare_output(e.problem, ex, e.o.data(), e.lse.empty() ? nullptr : e.lse.data(), r, co);
  r.oracle_ms = ex.ms;
  for (const auto& n : e.notes) r.evidence.push_back({"input", n});
  r.evidence.push_back({"bound", std::string("per-element bound for a kernel computing in ") +
                                     compute_dtype_name(e.compute_dtype) +
                                     " with fp32 accumulation (oracle/README.md)"});
  if (r.verdict == Verdict::kFail) classify_output(e, ex, opts, r);
  if (r.verdict == Verdict::kFail) r.tensor = !r.worst.empty() && r.worst.front().is_lse ? "LSE" : "O";
  j.outcome.o = e.o;
  j.outcome.lse = e.lse;
  if (e.dq.empty()) return j;
  // Backward: the gradient oracle for the o / lse the backward was given (the files'; without lse.npy the
  // exact LSE, rounded to fp32).
  const Problem& p = e.problem;
  std::vector<float> lse = e.lse;
  if (lse.empty()) {
    lse.assign(static_cast<size_t>(lse_elements(p)), 0.0f);
    OracleOptions every = opts;
    every.row_budget = 0;
    every.baseline = false;
    const OracleResult full =
        opts.row_budget == 0 ? ex : compute_oracle(p, e.q.data(), e.k.data(), e.v.data(), e.variant_inputs(), every);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t s = 0; s < p.seq_q; ++s)
          lse[static_cast<size_t>(lse_index(p, b, h, s))] = static_cast<float>(full.lse[full.lse_at(b, h, s)]);
    r.evidence.push_back({"input", "no lse.npy: the backward is judged as if given the exact LSE"});
  }
  GradOptions go = grad_options(opts);
  const GradResult g = compute_grad_oracle(p, e.q.data(), e.k.data(), e.v.data(), e.dout.data(), e.o.data(),
                                           lse.data(), e.variant_inputs(), go);
  CheckResult gr;
  j.grad_maps = compare_gradients(p, g, e.dq.data(), e.dk.data(), e.dv.data(), gr, co);
  merge_gradient_judgement(r, gr);
  if (r.verdict == Verdict::kFail && !r.tensor.empty() && r.tensor[0] == 'd') {
    // From the gradients alone: empty-row (dQ of a query row with no visible key must be 0), else precision /
    // wrong by the limit; the classes that need the kernel are named as undeterminable.
    std::vector<int64_t> rows;
    for (int64_t s = 0; s < p.seq_q; ++s) {
      if (!visible_keys(p, s).empty()) continue;
      bool bad = false;
      for (int64_t b = 0; b < p.batch && !bad; ++b)
        for (int64_t h = 0; h < p.heads_q && !bad; ++h)
          for (int64_t d = 0; d < p.head_dim && !bad; ++d) bad = e.dq[static_cast<size_t>(q_index(p, b, s, h, d))] != 0.0f;
      if (bad) rows.push_back(s);
    }
    if (!rows.empty()) {
      r.failure = FailureClass::kEmptyRow;
      std::string list;
      for (size_t i = 0; i < rows.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(rows[i]);
      r.evidence.push_back({"empty-row", "query rows s = " + list + (rows.size() > 8 ? ", ..." : "") +
                                             " see no key (LSE = -inf): their dQ must be 0 and is not"});
    } else if (r.failure == FailureClass::kPrecision && r.max_ratio > 1000) {
      r.failure = FailureClass::kWrong;
    }
    for (const Evidence& ev : gr.evidence)
      if (ev.detector == "compare") r.evidence.push_back({"gradients", ev.detail});
    r.evidence.push_back({"scope", "gradients computed elsewhere: oob-read / oob-write, unwritten and barrier-race "
                                   "need the kernel and cannot be told from the files"});
  }
  j.outcome.backward = true;
  j.outcome.dq = e.dq;
  j.outcome.dk = e.dk;
  j.outcome.dv = e.dv;
  return j;
}

}  // namespace attnfuzz::npy
