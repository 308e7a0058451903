// kernel_list.cpp - --list and --list --json: what every registered kernel declares (af_kernel), in the words
// the flags take (--pass, --dtype, --mask, --seq-layout, --tunable), one fact list for both renderings.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnfuzz/abi.h"
#include "attnfuzz/problem.h"
#include "tools/cli_common.h"

namespace attnfuzz {

namespace {

// ABI v3 af_kernel::variants bits, in bit order (abi.h AF_VARIANT_*).
constexpr const char* kVariantNames[] = {"sink",      "softcap",   "alibi",        "bias",         "mask-dense",
                                         "mask-bits", "block-sparse", "kv-shared", "head-descale", "dropout"};
constexpr const char* kDropoutRngNames[] = {"exported", "philox-flash", "philox-torch"};  // af_dropout_rng
constexpr const char* kMaskNames[] = {"none", "causal-tl", "causal-br", "window-tl", "window-br"};  // AF_SUPPORTS_*

// One kernel's declared capabilities as words; "" lists are rendered "-" in the table.
struct Facts {
  std::vector<std::string> passes, dtypes, bwd_dtypes, masks, layouts, variants, dropout_rngs;
  std::string kind, compute, lse, dims;
  int32_t min_page = 0, max_page = 0;  // paged K/V page sizes (0 when the kernel takes no paged K/V)
};

Facts facts_of(const af_kernel& k) {
  Facts f;
  f.kind = k.kind == AF_KIND_MERGE ? "merge" : "attention";
  // The --pass values a check of this kernel may take (check/runner.cpp pass_unsupported_reason).
  if (k.launch) f.passes.push_back("fwd");
  if (k.launch_bwd) f.passes.push_back("bwd");
  if (k.launch && k.launch_bwd && k.writes_lse) f.passes.push_back("fwdbwd");
  const uint32_t dtypes = k.dtypes ? k.dtypes : AF_SUPPORTS_F32;  // 0 = fp32 only
  for (int32_t d = AF_DTYPE_F32; d <= AF_DTYPE_FP8_E5M2; ++d) {
    if (!(dtypes & (1u << d))) continue;
    if (k.launch) f.dtypes.push_back(dtype_name(d));
    // a backward launch takes f32, and f16 / bf16 where the kernel claims AF_SUPPORTS_BWD(dtype)
    if (k.launch_bwd && (d == AF_DTYPE_F32 || ((d == AF_DTYPE_F16 || d == AF_DTYPE_BF16) && (dtypes & AF_SUPPORTS_BWD(d)))))
      f.bwd_dtypes.push_back(dtype_name(d));
  }
  const uint32_t masks = k.masks ? k.masks : AF_SUPPORTS_ALL_MASKS;  // 0 = every mask
  for (int b = 0; b < 5; ++b)
    if (masks & (1u << b)) f.masks.push_back(kMaskNames[b]);
  // --seq-layout values whose features (core/sequences.cpp feature_bits) the kernel declares.
  const uint32_t ft = k.features;
  const bool qp = ft & AF_FEATURE_Q_PACKED, kp = ft & AF_FEATURE_KV_PACKED, used = ft & AF_FEATURE_SEQUSED_K;
  f.layouts.push_back("dense");
  if (qp && kp) f.layouts.push_back("varlen");
  if (qp) f.layouts.push_back("varlen-q");
  if (kp) f.layouts.push_back("varlen-k");
  if (used) f.layouts.push_back("kvcache");
  if ((ft & AF_FEATURE_KV_PAGED) && used) {  // paged K/V always carries seqused_k
    f.min_page = k.min_page_size ? k.min_page_size : 16;
    f.max_page = k.max_page_size ? k.max_page_size : 256;
    f.layouts.push_back("paged:" + std::to_string(f.min_page) + ".." + std::to_string(f.max_page));
    f.layouts.push_back("decode");
  }
  for (int b = 0; b < 10; ++b)
    if (k.variants & (1u << b)) f.variants.push_back(kVariantNames[b]);
  if (k.variants & AF_VARIANT_DROPOUT)
    for (int b = 0; b < 3; ++b)
      if (k.dropout_rngs & (1u << b)) f.dropout_rngs.push_back(kDropoutRngNames[b]);
  f.compute = k.compute_model == AF_COMPUTE_UNFUSED ? "unfused" : "fused";
  if (k.flags & AF_KERNEL_SCORE_ADD_IN_DTYPE) f.compute += "+add-in-dtype";  // bias + ALiBi rounded to f16 / bf16
  f.lse = !k.writes_lse ? "no" : (k.flags & AF_KERNEL_LSE_PACKED) ? "packed" : "yes";
  // "128" when D and Dv share the limit, else "any/256" (Dv: v and o rows); "=" when Dv must equal D
  auto lim = [](int64_t v) { return v ? std::to_string(v) : std::string("any"); };
  f.dims = k.max_head_dim == k.max_head_dim_v ? lim(k.max_head_dim) : lim(k.max_head_dim) + "/" + lim(k.max_head_dim_v);
  if (k.needs_dv_eq_d) f.dims += ",Dv=D";
  return f;
}

std::string joined(const std::vector<std::string>& v, const char* sep = ",") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s.empty() ? "-" : s;
}

// "num_splits=8|1|2" (the default first, as declared).
std::string tunables_text(const af_kernel& k) {
  std::vector<std::string> t;
  for (int32_t i = 0; i < k.n_tunables && i < AF_MAX_TUNABLES; ++i) {
    std::string s = std::string(k.tunables[i].name) + "=";
    for (int32_t v = 0; v < k.tunables[i].n_values; ++v) s += (v ? "|" : "") + std::to_string(k.tunables[i].values[v]);
    t.push_back(s);
  }
  return joined(t, " ");
}

void print_table(const Session& s) {
  const std::vector<std::string> head = {"kernel", "kind",   "family",  "backend",  "passes", "dtypes",
                                         "bwd-dtypes", "masks", "layouts", "max-D/Dv", "lse",    "compute",
                                         "tunables", "variants", "origin"};
  std::vector<std::vector<std::string>> rows;
  for (const KernelEntry& e : s.registry->all()) {
    const af_kernel& k = e.kernel;
    const Facts f = facts_of(k);
    std::string masks = f.masks.size() == 5 ? "all" : joined(f.masks);
    // The table's short form of the layouts: varlen covers varlen-q and varlen-k, paged covers decode.
    std::vector<std::string> layouts;
    const bool both = std::find(f.layouts.begin(), f.layouts.end(), "varlen") != f.layouts.end();
    for (const auto& l : f.layouts)
      if (l != "decode" && !(both && (l == "varlen-q" || l == "varlen-k"))) layouts.push_back(l);
    std::string variants = joined(f.variants);
    if (!f.dropout_rngs.empty()) variants += "(" + joined(f.dropout_rngs) + ")";
    rows.push_back({k.name, f.kind, k.family, backend_name(e.backend), joined(f.passes), joined(f.dtypes),
                    joined(f.bwd_dtypes), masks, joined(layouts), f.dims, f.lse, f.compute, tunables_text(k),
                    variants, e.origin});
  }
  // Every column as wide as its widest cell: the columns line up whatever the names' lengths.
  std::vector<size_t> width(head.size());
  for (size_t c = 0; c < head.size(); ++c) {
    width[c] = head[c].size();
    for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string l;
    for (size_t c = 0; c < r.size(); ++c)
      l += c + 1 == r.size() ? r[c] : r[c] + std::string(width[c] - r[c].size() + 2, ' ');
    std::printf("%s\n", l.c_str());
  };
  line(head);
  for (const auto& r : rows) line(r);
  std::printf("device: %s\n", s.device->name().c_str());
  std::printf("masks all: none, causal-tl, causal-br, window-tl, window-br; layouts: varlen also varlen-q and "
              "varlen-k, paged:MIN..MAX (page sizes) also decode; --list --json: the same facts and descriptions\n");
}

void print_json(const Session& s) {
  using Json = nlohmann::ordered_json;
  Json kernels = Json::array();
  for (const KernelEntry& e : s.registry->all()) {
    const af_kernel& k = e.kernel;
    const Facts f = facts_of(k);
    Json t = Json::array();
    for (int32_t i = 0; i < k.n_tunables && i < AF_MAX_TUNABLES; ++i) {
      const af_tunable& tu = k.tunables[i];
      t.push_back({{"name", tu.name},
                   {"description", tu.description ? tu.description : ""},
                   {"role", tu.role == AF_TUNABLE_KV_SPLITS ? "kv-splits" : "other"},
                   {"default", tu.values[0]},
                   {"values", std::vector<int32_t>(tu.values, tu.values + tu.n_values)}});
    }
    auto limit = [](int64_t v) { return v ? Json(v) : Json(nullptr); };  // null: no limit
    Json j = {{"name", k.name},
              {"family", k.family},
              {"description", k.description ? k.description : ""},
              {"kind", f.kind},
              {"backend", backend_name(e.backend)},
              {"origin", e.origin},
              {"passes", f.passes},
              {"dtypes", f.dtypes},
              {"bwd_dtypes", f.bwd_dtypes},
              {"masks", f.masks},
              {"layouts", f.layouts},
              {"page_sizes", f.max_page ? Json{{"min", f.min_page}, {"max", f.max_page}} : Json(nullptr)},
              {"max_head_dim", limit(k.max_head_dim)},
              {"max_head_dim_v", limit(k.max_head_dim_v)},
              {"needs_dv_eq_d", k.needs_dv_eq_d != 0},
              {"lse", f.lse},
              {"compute_model", f.compute},
              {"tunables", t},
              {"variants", f.variants},
              {"dropout_rngs", f.dropout_rngs}};
    kernels.push_back(std::move(j));
  }
  const Json out = {{"tool", {{"name", s.tool}, {"version", ATTNFUZZ_VERSION}}},
                    {"device", s.device->name()},
                    {"kernels", kernels}};
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

void list_kernels(const Session& s, bool json) {
  if (json)
    print_json(s);
  else
    print_table(s);
}

}  // namespace attnfuzz
