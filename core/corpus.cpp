// corpus.cpp - reading and writing corpus files (format: corpus/README.md) and their JSON pieces.
#include "attnfuzz/corpus.h"
#include "attnfuzz/dropout.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <tuple>

namespace attnfuzz {

using json = Json;

const char* corpus_error_kind_name(CorpusError::Kind k) {
  switch (k) {
    case CorpusError::Kind::kIo:
      return "io";
    case CorpusError::Kind::kTruncated:
      return "truncated";
    case CorpusError::Kind::kForeign:
      return "foreign";
    case CorpusError::Kind::kFutureVersion:
      return "future-version";
    case CorpusError::Kind::kCorrupt:
      return "corrupt";
  }
  return "?";
}

namespace {

[[noreturn]] void corrupt(const std::string& what) { throw CorpusError(CorpusError::Kind::kCorrupt, what); }

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

const json& field(const json& j, const char* key, const std::string& ctx) {
  if (!j.is_object()) corrupt(ctx + " is not a JSON object");
  auto it = j.find(key);
  if (it == j.end()) corrupt(ctx + " lacks the field '" + key + "'");
  return *it;
}
int64_t get_int(const json& j, const char* key, const std::string& ctx) {
  const json& v = field(j, key, ctx);
  if (!v.is_number_integer()) corrupt(ctx + "." + key + " is not an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    corrupt(ctx + "." + key + " is out of range");
  return v.get<int64_t>();
}
std::string get_string(const json& j, const char* key, const std::string& ctx) {
  const json& v = field(j, key, ctx);
  if (!v.is_string()) corrupt(ctx + "." + key + " is not a string");
  return v.get<std::string>();
}
std::string opt_string(const json& j, const char* key, const std::string& ctx) {
  return j.contains(key) ? get_string(j, key, ctx) : std::string();
}
// A JSON number, or the strings "nan", "inf", "-inf" (json_number's non-finite forms).
double number_value(const json& v, const std::string& what) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::nan("");
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
  }
  corrupt(what + " is not a number");
}
double get_number(const json& j, const char* key, const std::string& ctx) {
  return number_value(field(j, key, ctx), ctx + "." + key);
}
uint64_t parse_u64(const std::string& s, const std::string& ctx) {
  if (s.empty() || s.size() > 20) corrupt(ctx + " '" + s + "' is not a 64-bit number");
  const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  const std::string digits = hex ? s.substr(2) : s;
  if (digits.empty() ||
      digits.find_first_not_of(hex ? "0123456789abcdefABCDEF" : "0123456789") != std::string::npos ||
      (hex && digits.size() > 16))
    corrupt(ctx + " '" + s + "' is not a 64-bit number");
  uint64_t v = 0;
  if (std::from_chars(digits.data(), digits.data() + digits.size(), v, hex ? 16 : 10).ec != std::errc())
    corrupt(ctx + " '" + s + "' is out of range");
  return v;
}
std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

const char* kStrideNames[] = {"q", "k", "v", "o", "lse"};
int64_t* stride_of(Problem& p, int i) {
  int64_t* s[] = {p.q_stride, p.k_stride, p.v_stride, p.o_stride, p.lse_stride};
  return s[i];
}

// Puts arrays holding only numbers on one line ("[30, 10, 5]") in pretty-printed JSON; strings untouched.
std::string compact_number_arrays(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  bool in_string = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < in.size())
        out += in[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[') {
      const size_t close = in.find(']', i);
      if (close != std::string::npos && in.find_first_not_of("0123456789-+.eE, \n", i + 1) == close) {
        std::string items;
        bool space = false;
        for (size_t k = i + 1; k < close; ++k) {
          const char d = in[k];
          if (d == ' ' || d == '\n') {
            space = true;
            continue;
          }
          if (space && !items.empty() && items.back() == ',') items += ' ';
          space = false;
          items += d;
        }
        out += '[' + items + ']';
        i = close;
        continue;
      }
    }
    out += c;
  }
  return out;
}

}  // namespace

json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string seed_to_hex(uint64_t seed) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(seed));
  return buf;
}

// Fixed-width hex words: 8 digits per fp32 bit pattern, 2 per mask byte.
template <class T>
std::string words_to_hex(const std::vector<T>& v) {
  static const char* digits = "0123456789abcdef";
  constexpr int kDigits = 2 * sizeof(T);
  std::string s(v.size() * kDigits, '0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    if constexpr (sizeof(T) == 4) bits = std::bit_cast<uint32_t>(v[i]);
    else bits = v[i];
    for (int n = 0; n < kDigits; ++n) s[i * kDigits + n] = digits[(bits >> (4 * (kDigits - 1 - n))) & 0xf];
  }
  return s;
}

template <class T>
std::vector<T> hex_to_words(std::string_view hex, const std::string& what) {
  constexpr size_t kDigits = 2 * sizeof(T);
  if (hex.size() % kDigits != 0)
    corrupt(what + " has " + std::to_string(hex.size()) + " hex digits, not a multiple of " + std::to_string(kDigits));
  std::vector<T> v(hex.size() / kDigits);
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits = 0;
    const char* const at = hex.data() + i * kDigits;
    const auto [end, ec] = std::from_chars(at, at + kDigits, bits, 16);  // <= 8 digits fit: no overflow
    if (ec != std::errc() || end != at + kDigits)
      corrupt(what + " has a non-hex character at value " + std::to_string(i));
    if constexpr (sizeof(T) == 4) v[i] = std::bit_cast<T>(bits);
    else v[i] = static_cast<T>(bits);
  }
  return v;
}

std::string floats_to_hex(const std::vector<float>& v) { return words_to_hex(v); }
std::vector<float> hex_to_floats(std::string_view hex, const std::string& what) { return hex_to_words<float>(hex, what); }

// Custom masks (issue 28 item 4) in a case's "variants" object: strides, patterns, given bytes, block sizes.
void masks_to_json(const Case& c, json& v) {
  const Problem& p = c.problem;
  const VariantSpec& vs = c.variants;
  if (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) {
    v["mask_stride"] = {p.mask_stride[0], p.mask_stride[1], p.mask_stride[2]};
    v["mask_pattern"] = vs.mask_pattern;
    if (!vs.custom_mask.empty()) v["custom_mask"] = words_to_hex(vs.custom_mask);
  }
  if (p.variants & AF_VARIANT_BLOCK_SPARSE) {
    v["block_size"] = {p.block_q, p.block_k};
    v["block_mask_stride"] = {p.block_mask_stride[0], p.block_mask_stride[1], p.block_mask_stride[2]};
    v["block_pattern"] = vs.block_pattern;
    if (!vs.block_mask.empty()) v["block_mask"] = words_to_hex(vs.block_mask);
  }
}

void int_array(const json& v, const char* key, int64_t* out, size_t n) {
  const json& a = field(v, key, "case.variants");
  const std::string msg = std::string("case.variants.") + key + " is not an array of " + std::to_string(n) + " integers";
  if (!a.is_array() || a.size() != n) corrupt(msg);
  for (size_t i = 0; i < n; ++i) {
    if (!a[i].is_number_integer()) corrupt(msg);
    out[i] = a[i].get<int64_t>();
  }
}

void masks_from_json(const json& v, Case& c) {
  Problem& p = c.problem;
  const std::string vc = "case.variants";
  if (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) {
    int_array(v, "mask_stride", p.mask_stride, 3);
    if (v.contains("mask_pattern")) c.variants.mask_pattern = get_string(v, "mask_pattern", vc);
    if (v.contains("custom_mask"))
      c.variants.custom_mask = hex_to_words<uint8_t>(get_string(v, "custom_mask", vc), "case.variants.custom_mask");
  }
  if (p.variants & AF_VARIANT_BLOCK_SPARSE) {
    int64_t bs[2];
    int_array(v, "block_size", bs, 2);
    if (bs[0] < 0 || bs[1] < 0 || bs[0] > INT32_MAX || bs[1] > INT32_MAX) corrupt("case.variants.block_size is out of range");
    p.block_q = static_cast<int32_t>(bs[0]), p.block_k = static_cast<int32_t>(bs[1]);
    int_array(v, "block_mask_stride", p.block_mask_stride, 3);
    if (v.contains("block_pattern")) c.variants.block_pattern = get_string(v, "block_pattern", vc);
    if (v.contains("block_mask"))
      c.variants.block_mask = hex_to_words<uint8_t>(get_string(v, "block_mask", vc), "case.variants.block_mask");
  }
}

// ------------------------------------------------------------------------------------------ problem

json problem_to_json(const Problem& p) {
  json j;
  j["batch"] = p.batch;
  j["heads_q"] = p.heads_q;
  j["heads_kv"] = p.heads_kv;
  j["seq_q"] = p.seq_q;
  j["seq_k"] = p.seq_k;
  j["head_dim"] = p.head_dim;
  j["head_dim_v"] = p.head_dim_v;
  j["scale"] = json_number(p.scale);
  j["scale_bits"] = hex32(std::bit_cast<uint32_t>(p.scale));
  j["mask"] = mask_to_string(p);
  j["dtype"] = dtype_name(p.dtype);
  // fp8 descale factors and output scale (ABI v2): written for fp8 cases only, as exact bits.
  if (p.dtype == AF_DTYPE_FP8_E4M3 || p.dtype == AF_DTYPE_FP8_E5M2)
    j["descale_bits"] = {hex32(std::bit_cast<uint32_t>(p.q_descale)), hex32(std::bit_cast<uint32_t>(p.k_descale)),
                         hex32(std::bit_cast<uint32_t>(p.v_descale)), hex32(std::bit_cast<uint32_t>(p.o_scale))};
  json s;
  Problem copy = p;
  for (int i = 0; i < 5; ++i) {
    const int64_t* st = stride_of(copy, i);
    s[kStrideNames[i]] = {st[0], st[1], st[2]};
  }
  if (!has_sequences(p)) {
    j["strides"] = s;
  } else {  // sequence layouts: strides follow from the case's "sequences" (set_sequence_fields)
    j["q_layout"] = p.q_layout == AF_SEQ_PACKED ? "packed" : "dense";
    j["kv_layout"] = p.kv_layout == AF_SEQ_PACKED ? "packed" : p.kv_layout == AF_SEQ_PAGED ? "paged" : "dense";
    if (p.kv_layout == AF_SEQ_PAGED) j["page_size"] = p.page_size;
  }
  // ABI v2 tunables (values of the kernel's declared knobs; 0 = default): written only when one is set, so
  // files without them (format 1 as before) read back with every tunable at its default.
  if (std::any_of(std::begin(p.tunables), std::end(p.tunables), [](int32_t t) { return t != 0; }))
    j["tunables"] = std::vector<int32_t>(std::begin(p.tunables), std::end(p.tunables));
  return j;
}

Problem problem_from_json(const json& j) {
  const std::string ctx = "problem";
  if (!j.is_object()) corrupt("problem is not a JSON object");
  Problem p = make_problem(get_int(j, "batch", ctx), get_int(j, "heads_q", ctx), get_int(j, "heads_kv", ctx),
                           get_int(j, "seq_q", ctx), get_int(j, "seq_k", ctx), get_int(j, "head_dim", ctx),
                           get_int(j, "head_dim_v", ctx));
  if (j.contains("scale_bits")) {
    const uint64_t bits = parse_u64(get_string(j, "scale_bits", ctx), "problem.scale_bits");
    if (bits > 0xffffffffu) corrupt("problem.scale_bits is wider than 32 bits");
    p.scale = std::bit_cast<float>(static_cast<uint32_t>(bits));
  } else if (j.contains("scale")) {
    p.scale = static_cast<float>(get_number(j, "scale", ctx));
  }
  if (j.contains("mask")) {
    if (std::string e = parse_mask(get_string(j, "mask", ctx), p); !e.empty()) corrupt("problem." + e);
  }
  if (j.contains("dtype")) {
    const std::string d = get_string(j, "dtype", ctx);
    const auto dt = parse_dtype(d);
    if (!dt || d != dtype_name(*dt))  // the file's names only, not the CLI's aliases (fp8, e4m3, float32, ...)
      corrupt("problem.dtype '" + d + "' is unknown (f32, f16, bf16, fp8-e4m3, fp8-e5m2)");
    p.dtype = *dt;
  }
  if (j.contains("descale_bits")) {  // q, k, v descale and o_scale, fp32 bits
    const json& a = j["descale_bits"];
    if (!a.is_array() || a.size() != 4) corrupt("problem.descale_bits is not an array of 4 hex strings");
    float* f[] = {&p.q_descale, &p.k_descale, &p.v_descale, &p.o_scale};
    for (int n = 0; n < 4; ++n) {
      if (!a[n].is_string()) corrupt("problem.descale_bits is not an array of 4 hex strings");
      const uint64_t bits = parse_u64(a[n].get<std::string>(), "problem.descale_bits");
      if (bits > 0xffffffffu) corrupt("problem.descale_bits holds a value wider than 32 bits");
      *f[n] = std::bit_cast<float>(static_cast<uint32_t>(bits));
    }
  }
  if (j.contains("strides")) {
    const json& s = j["strides"];
    for (int i = 0; i < 5; ++i) {
      const json& a = field(s, kStrideNames[i], "problem.strides");
      const std::string name = std::string("problem.strides.") + kStrideNames[i];
      if (!a.is_array() || a.size() != 3) corrupt(name + " is not an array of 3 integers");
      for (int n = 0; n < 3; ++n) {
        if (!a[n].is_number_integer()) corrupt(name + " is not an array of 3 integers");
        stride_of(p, i)[n] = a[n].get<int64_t>();
      }
    }
  }
  if (j.contains("tunables")) {
    const json& t = j["tunables"];
    if (!t.is_array() || t.size() > AF_MAX_TUNABLES)
      corrupt("problem.tunables is not an array of at most " + std::to_string(AF_MAX_TUNABLES) + " integers");
    for (size_t n = 0; n < t.size(); ++n) {
      if (!t[n].is_number_integer() || t[n].get<int64_t>() < 0 || t[n].get<int64_t>() > INT32_MAX)
        corrupt("problem.tunables[" + std::to_string(n) + "] is not an integer >= 0 (0 = default)");
      p.tunables[n] = static_cast<int32_t>(t[n].get<int64_t>());
    }
  }
  // Sequence layouts: the derived fields come from the case's "sequences"; case_from_json validates.
  const bool seqs = j.contains("q_layout") || j.contains("kv_layout");
  if (seqs && j.contains("strides"))
    corrupt("problem.strides given beside q_layout / kv_layout (a sequence layout's strides follow from its lengths)");
  if (seqs) {
    const std::string ql = j.contains("q_layout") ? get_string(j, "q_layout", ctx) : "dense";
    const std::string kl = j.contains("kv_layout") ? get_string(j, "kv_layout", ctx) : "dense";
    if (ql != "dense" && ql != "packed") corrupt("problem.q_layout '" + ql + "' is not dense or packed");
    if (kl != "dense" && kl != "packed" && kl != "paged")
      corrupt("problem.kv_layout '" + kl + "' is not dense, packed or paged");
    p.q_layout = ql == "packed" ? AF_SEQ_PACKED : AF_SEQ_DENSE;
    p.kv_layout = kl == "packed" ? AF_SEQ_PACKED : kl == "paged" ? AF_SEQ_PAGED : AF_SEQ_DENSE;
    if (j.contains("page_size")) {
      const int64_t ps = get_int(j, "page_size", ctx);
      if (ps < 1 || ps > 1024) corrupt("problem.page_size is not in 1 .. 1024");
      p.page_size = static_cast<int32_t>(ps);
    }
  }
  if (std::string e = seqs ? std::string() : validate(p); !e.empty()) corrupt("problem: " + e);
  return p;
}

// ------------------------------------------------------------------------------------------ case

// case.merge (issue 29): cuts, shifts (numbers, "-inf" for a dropped state), layout "state" | "token", pad.
void read_merge(const json& m, Case& c) {
  const std::string mc = "case.merge";
  if (!m.is_object()) corrupt("case.merge is not a JSON object");
  const json& cuts = field(m, "cuts", mc);
  if (!cuts.is_array()) corrupt("case.merge.cuts is not an array of integers");
  std::vector<int64_t> cv;
  for (const json& x : cuts) {
    if (!x.is_number_integer()) corrupt("case.merge.cuts is not an array of integers");
    cv.push_back(x.get<int64_t>());
  }
  std::vector<double> sv;
  if (m.contains("shift")) {
    const json& sh = m["shift"];
    if (!sh.is_array()) corrupt("case.merge.shift is not an array");
    for (const json& x : sh) sv.push_back(number_value(x, "case.merge.shift"));
  }
  const std::string layout = m.contains("layout") ? get_string(m, "layout", mc) : "state";
  if (layout != "state" && layout != "token") corrupt("case.merge.layout '" + layout + "' is not state or token");
  const int64_t pad = m.contains("pad") ? static_cast<int64_t>(get_number(m, "pad", mc)) : 0;
  if (std::string e = set_merge(c, cv, sv, layout == "token" ? 1 : 0, pad); !e.empty()) corrupt(mc + ": " + e);
}

json case_to_json(const Case& c) {
  json j;
  if (!c.label.empty()) j["label"] = c.label;
  j["problem"] = problem_to_json(c.problem);
  json values;
  values["dist"] = to_string(c.values.dist);
  json specials = json::array();
  for (const SpecialValue& s : c.values.specials) specials.push_back(to_string(s));
  values["specials"] = specials;
  values["domain"] = value_domain_name(c.values.domain);
  j["values"] = values;
  j["seed"] = seed_to_hex(c.seed);
  if (has_sequences(c.problem)) {  // per-sequence lengths and pages (case.h SeqLayout)
    json q = json::object();
    if (!c.seqs.q.empty()) q["seqlens_q"] = c.seqs.q;
    if (!c.seqs.k.empty()) q["seqlens_k"] = c.seqs.k;
    if (!c.seqs.used.empty()) q["seqused_k"] = c.seqs.used;
    if (c.problem.kv_layout == AF_SEQ_PAGED) {
      q["page_order"] = seed_to_hex(c.seqs.page_order);
      q["spare_pages"] = c.seqs.spare_pages;
    }
    // Issue 30 item 6a: only when set, so well-formed files keep their names and hashes.
    if (c.seqs.malformed.kind != Malformation::kNone) q["malformed"] = to_string(c.seqs.malformed);
    j["sequences"] = q;
  }
  // Backward cases only (issue 14): forward files stay as they were, so their names and hashes do not move.
  if (c.pass != Pass::kFwd) j["pass"] = pass_name(c.pass);
  // Score variants (issue 28), only when the problem uses one: files without them keep their names.
  if (c.problem.variants) {
    const Problem& p = c.problem;
    const VariantSpec& vs = c.variants;
    json v;
    v["use"] = variant_names(p.variants);
    if (p.variants & AF_VARIANT_SOFTCAP) v["softcap_bits"] = hex32(std::bit_cast<uint32_t>(p.softcap));
    if (p.variants & AF_VARIANT_SINK) {
      v["sink_range"] = json_number(vs.sink_range);  // the generator's range (provenance when sinks are given)
      if (!vs.sinks.empty()) v["sinks"] = floats_to_hex(vs.sinks);
    }
    if ((p.variants & AF_VARIANT_ALIBI) && !vs.alibi_slopes.empty()) v["alibi_slopes"] = floats_to_hex(vs.alibi_slopes);
    if (p.variants & AF_VARIANT_BIAS) {
      v["bias_stride"] = {p.bias_stride[0], p.bias_stride[1], p.bias_stride[2], p.bias_stride[3]};
      v["bias_range"] = json_number(vs.bias_range);
      if (!vs.bias.empty()) v["bias"] = floats_to_hex(vs.bias);
    }
    if (p.variants & AF_VARIANT_DROPOUT) {  // issue 29: p exactly (its fp32 bits), the generator, seed and offset
      v["dropout_p_bits"] = hex32(std::bit_cast<uint32_t>(p.dropout_p));
      v["dropout_rng"] = dropout_rng_name(p.dropout_rng);
      v["dropout_seed"] = std::to_string(p.dropout_seed);
      v["dropout_offset"] = std::to_string(p.dropout_offset);
    }
    if (p.variants &
        AF_VARIANT_HEAD_DESCALE) {  // per-head fp8 descales: the strides, and the values when given
      v["descale_stride"] = {p.descale_stride[0], p.descale_stride[1]};
      if (!vs.q_descale_h.empty()) v["q_descale_h"] = floats_to_hex(vs.q_descale_h);
      if (!vs.k_descale_h.empty()) v["k_descale_h"] = floats_to_hex(vs.k_descale_h);
      if (!vs.v_descale_h.empty()) v["v_descale_h"] = floats_to_hex(vs.v_descale_h);
    }
    masks_to_json(c, v);
    j["variants"] = v;
  }
  // Merge cases (issue 29), only for a problem with states: other files keep their names.
  if (is_merge(c.problem)) {
    json m;
    m["cuts"] = c.merge.cuts;
    json sh = json::array();
    for (double x : c.merge.lse_shift) sh.push_back(json_number(x));
    if (!c.merge.lse_shift.empty()) m["shift"] = sh;
    m["layout"] = c.merge.layout == 1 ? "token" : "state";
    m["pad"] = c.merge.pad;
    j["merge"] = m;
  }
  if (c.explicit_values) {
    j["explicit"] = {{"q", floats_to_hex(c.explicit_values->q)},
                     {"k", floats_to_hex(c.explicit_values->k)},
                     {"v", floats_to_hex(c.explicit_values->v)}};
    if (!c.explicit_values->dout.empty()) j["explicit"]["dout"] = floats_to_hex(c.explicit_values->dout);
  }
  return j;
}

Case case_from_json(const json& j) {
  const std::string ctx = "case";
  if (!j.is_object()) corrupt("case is not a JSON object");
  Case c;
  c.label = opt_string(j, "label", ctx);
  c.problem = problem_from_json(field(j, "problem", ctx));
  const json& seed = field(j, "seed", ctx);
  if (seed.is_string())
    c.seed = parse_u64(seed.get<std::string>(), "case.seed");
  else if (seed.is_number_unsigned())
    c.seed = seed.get<uint64_t>();
  else if (seed.is_number_integer() && seed.get<int64_t>() >= 0)
    c.seed = static_cast<uint64_t>(seed.get<int64_t>());
  else
    corrupt("case.seed is not a 64-bit number");
  if (j.contains("values")) {
    const json& v = j["values"];
    if (v.contains("dist")) {
      if (std::string e = parse_distribution(get_string(v, "dist", "case.values"), c.values.dist); !e.empty())
        corrupt("case.values: " + e);
    }
    if (v.contains("domain")) {  // absent in files written before value domains: ieee
      if (std::string e = parse_value_domain(get_string(v, "domain", "case.values"), c.values.domain);
          !e.empty())
        corrupt("case.values: " + e);
    }
    if (v.contains("specials")) {
      const json& s = v["specials"];
      if (!s.is_array()) corrupt("case.values.specials is not an array");
      for (const json& e : s) {
        if (!e.is_string()) corrupt("case.values.specials holds a non-string");
        SpecialValue sv;
        if (std::string err = parse_special(e.get<std::string>(), sv); !err.empty())
          corrupt("case.values: " + err);
        c.values.specials.push_back(sv);
      }
    }
  }
  if (j.contains("sequences")) {
    const json& q = j["sequences"];
    if (!q.is_object()) corrupt("case.sequences is not a JSON object");
    auto lengths = [&](const char* key, std::vector<int64_t>& out) {
      if (!q.contains(key)) return;
      const json& a = q[key];
      if (!a.is_array()) corrupt(std::string("case.sequences.") + key + " is not an array of lengths");
      for (const json& x : a) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > (int64_t{1} << 30))
          corrupt(std::string("case.sequences.") + key + " holds an invalid length");
        out.push_back(x.get<int64_t>());
      }
    };
    lengths("seqlens_q", c.seqs.q);
    lengths("seqlens_k", c.seqs.k);
    lengths("seqused_k", c.seqs.used);
    if (q.contains("page_order")) {
      const json& o = q["page_order"];
      if (!o.is_string()) corrupt("case.sequences.page_order is not a hex string");
      c.seqs.page_order = parse_u64(o.get<std::string>(), "case.sequences.page_order");
    }
    if (q.contains("spare_pages")) c.seqs.spare_pages = get_int(q, "spare_pages", "case.sequences");
    if (q.contains("malformed")) {
      if (std::string e = parse_malformed(get_string(q, "malformed", "case.sequences"), c.seqs.malformed); !e.empty())
        corrupt("case.sequences." + e);
    }
    const Problem written = c.problem;
    if (std::string e = set_sequence_fields(c); !e.empty()) corrupt("case.sequences: " + e);
    // The file's own seq_q / seq_k / batch must be the ones the lengths give: a file that disagrees is
    // corrupt (corpus/README.md), not rewritten.
    for (const auto& [name, was, now] : {std::tuple<const char*, int64_t, int64_t>{"seq_q", written.seq_q, c.problem.seq_q},
                                         {"seq_k", written.seq_k, c.problem.seq_k},
                                         {"batch", written.batch, c.problem.batch}})
      if (was != now)
        corrupt(std::string("problem.") + name + " = " + std::to_string(was) + " disagrees with case.sequences (" +
                std::to_string(now) + ")");
  }
  if (j.contains("explicit")) {
    const json& e = j["explicit"];
    ExplicitValues ev;
    ev.q = hex_to_floats(get_string(e, "q", "case.explicit"), "case.explicit.q");
    ev.k = hex_to_floats(get_string(e, "k", "case.explicit"), "case.explicit.k");
    ev.v = hex_to_floats(get_string(e, "v", "case.explicit"), "case.explicit.v");
    if (e.contains("dout")) ev.dout = hex_to_floats(get_string(e, "dout", "case.explicit"), "case.explicit.dout");
    c.explicit_values = std::move(ev);
  }
  if (j.contains("pass")) {  // absent in files written before backward cases: forward
    if (std::string e = parse_pass(get_string(j, "pass", ctx), c.pass); !e.empty()) corrupt("case: " + e);
  }
  if (j.contains("variants")) {
    const json& v = j["variants"];
    const std::string vc = "case.variants";
    if (!v.is_object()) corrupt("case.variants is not a JSON object");
    Problem& p = c.problem;
    if (std::string e = parse_variant_names(get_string(v, "use", vc), p.variants); !e.empty()) corrupt(vc + ": " + e);
    // kv-shared (MLA): a sequence layout's strides follow from its lengths, V's are K's; a dense file states
    // them
    if (kv_shared(p) && has_sequences(p)) share_kv(p);
    if (p.variants & AF_VARIANT_SOFTCAP) {
      const uint64_t bits = parse_u64(get_string(v, "softcap_bits", vc), "case.variants.softcap_bits");
      if (bits > 0xffffffffu) corrupt("case.variants.softcap_bits is wider than 32 bits");
      p.softcap = std::bit_cast<float>(static_cast<uint32_t>(bits));
    }
    if (v.contains("sink_range")) c.variants.sink_range = get_number(v, "sink_range", vc);
    if (v.contains("sinks")) c.variants.sinks = hex_to_floats(get_string(v, "sinks", vc), "case.variants.sinks");
    if (v.contains("alibi_slopes"))
      c.variants.alibi_slopes = hex_to_floats(get_string(v, "alibi_slopes", vc), "case.variants.alibi_slopes");
    if (p.variants & AF_VARIANT_BIAS) {
      const json& a = field(v, "bias_stride", vc);
      if (!a.is_array() || a.size() != 4) corrupt("case.variants.bias_stride is not an array of 4 integers");
      for (int n = 0; n < 4; ++n) {
        if (!a[n].is_number_integer()) corrupt("case.variants.bias_stride is not an array of 4 integers");
        p.bias_stride[n] = a[n].get<int64_t>();
      }
    }
    if (v.contains("bias_range")) c.variants.bias_range = get_number(v, "bias_range", vc);
    if (v.contains("bias")) c.variants.bias = hex_to_floats(get_string(v, "bias", vc), "case.variants.bias");
    if (p.variants & AF_VARIANT_HEAD_DESCALE) {
      const json& a = field(v, "descale_stride", vc);
      if (!a.is_array() || a.size() != 2)
        corrupt("case.variants.descale_stride is not an array of 2 integers");
      for (int n = 0; n < 2; ++n) {
        if (!a[n].is_number_integer()) corrupt("case.variants.descale_stride is not an array of 2 integers");
        p.descale_stride[n] = a[n].get<int64_t>();
      }
    }
    for (const auto& [key, dst] : {std::pair{"q_descale_h", &c.variants.q_descale_h},
                                   std::pair{"k_descale_h", &c.variants.k_descale_h},
                                   std::pair{"v_descale_h", &c.variants.v_descale_h}})
      if (v.contains(key)) *dst = hex_to_floats(get_string(v, key, vc), std::string("case.variants.") + key);
    if (p.variants & AF_VARIANT_DROPOUT) {
      const uint64_t bits = parse_u64(get_string(v, "dropout_p_bits", vc), "case.variants.dropout_p_bits");
      if (bits > 0xffffffffu) corrupt("case.variants.dropout_p_bits is wider than 32 bits");
      int32_t rng = 0;
      if (std::string e = parse_dropout_rng(get_string(v, "dropout_rng", vc), rng); !e.empty()) corrupt(vc + ": " + e);
      const uint64_t seed = parse_u64(get_string(v, "dropout_seed", vc), "case.variants.dropout_seed");
      const uint64_t offset = parse_u64(get_string(v, "dropout_offset", vc), "case.variants.dropout_offset");
      if (std::string e = set_dropout(p, std::bit_cast<float>(static_cast<uint32_t>(bits)), rng, seed, offset); !e.empty())
        corrupt(vc + ": " + e);
    }
    masks_from_json(v, c);
  }
  if (j.contains("merge")) read_merge(j["merge"], c);
  if (std::string e = validate(c); !e.empty()) corrupt("case: " + e);
  return c;
}

// ------------------------------------------------------------------------------------------ verdict

json verdict_to_json(const RecordedVerdict& v) {
  json j;
  j["kernel"] = v.kernel;
  j["backend"] = v.backend;
  j["device"] = v.device;
  j["verdict"] = verdict_name(v.verdict);
  j["class"] = failure_class_name(v.failure);
  j["signature"] = v.signature;
  j["reason"] = v.reason;
  j["max_ratio"] = json_number(v.max_ratio);
  j["compared"] = v.compared;
  j["failed"] = v.failed;
  return j;
}

RecordedVerdict verdict_from_json(const json& j) {
  const std::string ctx = "verdict";
  RecordedVerdict v;
  v.kernel = get_string(j, "kernel", ctx);
  v.backend = opt_string(j, "backend", ctx);
  v.device = opt_string(j, "device", ctx);
  const std::string name = get_string(j, "verdict", ctx);
  bool found = false;
  for (Verdict x : {Verdict::kPass, Verdict::kFail, Verdict::kUnsupported, Verdict::kOutsideContract})
    if (name == verdict_name(x)) {
      v.verdict = x;
      found = true;
    }
  if (!found) corrupt("verdict.verdict '" + name + "' is unknown");
  if (j.contains("class")) {
    const std::string cls = get_string(j, "class", ctx);
    if (!parse_failure_class(cls, v.failure)) corrupt("verdict.class '" + cls + "' is unknown");
  }
  v.signature = opt_string(j, "signature", ctx);
  v.reason = opt_string(j, "reason", ctx);
  if (j.contains("max_ratio")) v.max_ratio = get_number(j, "max_ratio", ctx);
  // Element counts (absent in files written before they were recorded: then -1, "not recorded").
  v.compared = j.contains("compared") ? get_int(j, "compared", ctx) : -1;
  v.failed = j.contains("failed") ? get_int(j, "failed", ctx) : -1;
  return v;
}

// ------------------------------------------------------------------------------------------ files

std::string to_corpus_text(const CorpusFile& f) {
  json j;
  j["format"] = f.format_version;
  j["tool"] = {{"name", f.tool.name}, {"version", f.tool.version}, {"command", f.tool.command}};
  j["case"] = case_to_json(f.the_case);
  if (f.verdict) j["verdict"] = verdict_to_json(*f.verdict);
  std::ostringstream out;
  out << kCorpusMagic << ' ' << f.format_version << '\n';
  out << "# " << one_line(f.tool.name) << ' ' << one_line(f.tool.version)
      << " test case; format: corpus/README.md; replay: attn-check --replay FILE\n";
  if (!f.tool.command.empty()) out << "# command: " << one_line(f.tool.command) << '\n';
  if (!f.the_case.label.empty()) out << "# label: " << one_line(f.the_case.label) << '\n';
  out << "# case: " << one_line(describe(f.the_case)) << '\n';
  if (f.verdict) {
    const RecordedVerdict& v = *f.verdict;
    out << "# verdict: " << one_line(v.kernel) << " on " << one_line(v.backend) << ": "
        << verdict_name(v.verdict);
    if (v.failure != FailureClass::kNone) out << " (" << failure_class_name(v.failure) << ")";
    if (!v.reason.empty()) out << ": " << one_line(v.reason);
    out << '\n';
  }
  out << compact_number_arrays(j.dump(2)) << '\n';
  return out.str();
}

CorpusFile parse_corpus(std::string_view text, const std::string& origin) {
  using K = CorpusError::Kind;
  const std::string where = origin + ": ";
  if (text.empty()) throw CorpusError(K::kTruncated, where + "empty file, not an attn-fuzz corpus file");
  const size_t eol = text.find('\n');
  std::string_view header = text.substr(0, eol);
  if (!header.empty() && header.back() == '\r') header.remove_suffix(1);
  const std::string_view magic = kCorpusMagic;
  if (header.substr(0, magic.size()) != magic) {
    if (eol == std::string_view::npos && magic.substr(0, header.size()) == header)
      throw CorpusError(K::kTruncated, where + "truncated inside the '" + std::string(magic) + "' header");
    throw CorpusError(K::kForeign, where + "not an attn-fuzz corpus file (the first line is not '" +
                                       std::string(magic) + " <version>')");
  }
  const std::string_view ver = header.substr(magic.size());
  if (ver.size() < 2 || ver[0] != ' ' || ver.size() > 10 ||
      ver.substr(1).find_first_not_of("0123456789") != std::string_view::npos) {
    if (eol == std::string_view::npos && ver.empty())
      throw CorpusError(K::kTruncated, where + "truncated after the header magic");
    throw CorpusError(K::kCorrupt, where + "malformed header line '" + std::string(header) + "'");
  }
  int version = 0;
  std::from_chars(ver.data() + 1, ver.data() + ver.size(), version);  // 1 to 9 digits (checked above)
  if (version > kCorpusFormatVersion)
    throw CorpusError(K::kFutureVersion, where + "corpus format version " + std::to_string(version) +
                                             " is newer than this build reads (" +
                                             std::to_string(kCorpusFormatVersion) + "); update attn-fuzz");
  if (version < 1)
    throw CorpusError(K::kCorrupt,
                      where + "corpus format version " + std::to_string(version) + " is invalid");
  if (eol == std::string_view::npos)
    throw CorpusError(K::kTruncated, where + "truncated after the header line");
  // Skip '#' comment lines; the rest is one JSON object.
  size_t pos = eol + 1;
  while (pos < text.size() && text[pos] == '#') {
    const size_t next = text.find('\n', pos);
    if (next == std::string_view::npos) {
      pos = text.size();
      break;
    }
    pos = next + 1;
  }
  const std::string_view body = text.substr(pos);
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    throw CorpusError(K::kTruncated, where + "truncated: no JSON body after the header");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    const bool at_end =
        e.byte >= body.size() || std::string(e.what()).find("unexpected end of input") != std::string::npos;
    if (at_end) throw CorpusError(K::kTruncated, where + "truncated: the JSON body ends early");
    throw CorpusError(K::kCorrupt, where + "corrupt JSON at byte " + std::to_string(pos + e.byte) + ": " +
                                       one_line(e.what()));
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    throw CorpusError(K::kCorrupt, where + "corrupt JSON: " + one_line(e.what()));
  }
  try {
    CorpusFile f;
    if (!j.is_object()) corrupt("the JSON body is not an object");
    const int64_t fmt = get_int(j, "format", "file");
    if (fmt != version)
      corrupt("format " + std::to_string(fmt) + " disagrees with the header version " +
              std::to_string(version));
    f.format_version = version;
    const json& tool = field(j, "tool", "file");
    f.tool.name = get_string(tool, "name", "tool");
    f.tool.version = get_string(tool, "version", "tool");
    if (f.tool.version.empty()) corrupt("tool.version is empty (files must record the tool version)");
    f.tool.command = opt_string(tool, "command", "tool");
    f.the_case = case_from_json(field(j, "case", "file"));
    if (j.contains("verdict") && !j["verdict"].is_null()) f.verdict = verdict_from_json(j["verdict"]);
    return f;
  } catch (const CorpusError& e) {
    throw CorpusError(e.kind(), where + e.what());
  } catch (const json::exception& e) {
    throw CorpusError(K::kCorrupt, where + one_line(e.what()));
  }
}

std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes, std::string& out) {
  namespace fs = std::filesystem;
  const std::string name = path.string();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return name + ": cannot open for reading (no such file)";
  if (fs::is_directory(st)) return name + ": is a directory, not a file";
  if (!fs::is_regular_file(st)) {
    const char* what = fs::is_character_file(st) ? "a character device"
                       : fs::is_block_file(st)   ? "a block device"
                       : fs::is_fifo(st)         ? "a FIFO"
                       : fs::is_socket(st)       ? "a socket"
                                                 : "not a plain file";
    return name + ": not a regular file (" + what + ")";
  }
  const uintmax_t size = fs::file_size(path, ec);
  auto too_large = [&](uint64_t n) {
    return name + ": " + std::to_string(n) + " bytes, more than the limit of " + std::to_string(max_bytes) +
           " bytes for this kind of file";
  };
  if (!ec && size > max_bytes) return too_large(size);
  std::ifstream in(path, std::ios::binary);
  if (!in) return name + ": cannot open for reading";
  out.clear();
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    out.append(buf, static_cast<size_t>(in.gcount()));
    if (out.size() > max_bytes) return too_large(out.size()) + " (it grew while being read)";
  }
  if (in.bad()) return name + ": read error";
  return {};
}

CorpusFile read_corpus_file(const std::filesystem::path& path) {
  std::string text;
  if (std::string e = read_regular_file(path, kMaxCorpusFileBytes, text); !e.empty())
    throw CorpusError(CorpusError::Kind::kIo, e);
  return parse_corpus(text, path.string());
}

void write_corpus_file(const std::filesystem::path& path, const CorpusFile& f) {
  if (std::string why = write_file_atomically(path, to_corpus_text(f)); !why.empty())
    throw CorpusError(CorpusError::Kind::kIo, why);
}

std::string case_hash(const CorpusFile& f) {
  Case c = f.the_case;
  c.label.clear();
  Json j = case_to_json(c);
  // The ieee domain is the default (files without the field): leave it out so such files keep their names.
  if (c.values.domain == ValueDomain::kIeee) j["values"].erase("domain");
  std::string key = j.dump();
  if (f.verdict) key += "\nkernel=" + f.verdict->kernel;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash64(key)));
  return buf;
}

std::string corpus_file_name(const CorpusFile& f) {
  std::string cls = "case";
  if (f.verdict)
    cls = f.verdict->failure != FailureClass::kNone ? failure_class_name(f.verdict->failure)
                                                    : verdict_name(f.verdict->verdict);
  return cls + "-" + case_hash(f) + kCaseFileExtension;
}

std::filesystem::path save_to_corpus_dir(const std::filesystem::path& dir, const CorpusFile& f) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw CorpusError(CorpusError::Kind::kIo, dir.string() + ": cannot create directory: " + ec.message());
  const std::filesystem::path path = dir / corpus_file_name(f);
  if (!std::filesystem::exists(path, ec)) write_corpus_file(path, f);
  return path;
}

RecordedVerdict recorded_verdict(const CheckResult& r, std::string signature) {
  RecordedVerdict v;
  v.kernel = r.kernel;
  v.backend = r.backend;
  v.device = r.device;
  v.verdict = r.verdict;
  v.failure = r.failure;
  v.signature = std::move(signature);
  v.reason = r.reason;
  v.max_ratio = r.max_ratio;
  v.compared = r.compared;
  v.failed = r.failed;
  return v;
}

CheckResult recorded_result(const RecordedVerdict& v) {
  CheckResult r;
  r.kernel = v.kernel;
  r.backend = v.backend;
  r.device = v.device;
  r.verdict = v.verdict;
  r.failure = v.failure;
  r.reason = v.reason;
  r.max_ratio = v.max_ratio;
  r.compared = v.compared;  // the counts of the saved check (summary.md "failed / compared")
  r.failed = v.failed;
  r.evidence.push_back({"signature", v.signature});
  return r;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@") ==
          std::string::npos)
    return s;
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

}  // namespace attnfuzz
