// registry.cpp - the kernel registry: built-in tables, plug-ins loaded with dlopen, selection by name or
// glob.
#include "attnfuzz/registry.h"

#include "attnfuzz/dropout.h"

#include <dlfcn.h>
#include <fnmatch.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "attnfuzz/case.h"
#include "attnfuzz/problem.h"

namespace attnfuzz {

namespace {
// ABI v1 and v2 structs are the prefixes of the v3 ones (abi.h); their sizes are where the next fields begin.
constexpr size_t kKernelV1Size = offsetof(af_kernel, features);
constexpr size_t kKernelV2Size = offsetof(af_kernel, compute_model);
static_assert(offsetof(af_problem, q_descale) == 216, "af_problem's v1 prefix changed");
static_assert(offsetof(af_buffers, cu_seqlens_q) == 6 * sizeof(void*), "af_buffers' v1 prefix changed");
static_assert(kKernelV1Size == 80, "af_kernel's v1 prefix changed");
static_assert(offsetof(af_problem, pass) == 400, "af_problem's v2 prefix changed");
static_assert(offsetof(af_buffers, sinks) == 14 * sizeof(void*), "af_buffers' v2 prefix changed");
static_assert(kKernelV2Size == 112, "af_kernel's v2 prefix changed");

// The size of one af_kernel entry in a table of ABI version v.
size_t kernel_entry_size(uint32_t v) {
  return v == 1 ? kKernelV1Size : v == 2 ? kKernelV2Size : sizeof(af_kernel);
}
}  // namespace

Registry& Registry::global() {
  static Registry r;
  return r;
}

bool register_builtin_kernels(const char* backend, const af_kernel* kernels, size_t n) {
  Backend b;
  if (!parse_backend(backend, b)) return false;
  Registry::global().add(b, kernels, n, "built-in");
  return true;
}

void Registry::add(Backend backend, const af_kernel* kernels, size_t n, const std::string& origin) {
  for (size_t i = 0; i < n; ++i) {
    const af_kernel& k = kernels[i];
    if (!k.name || !*k.name || !k.family || (!k.launch && !k.launch_bwd))
      throw std::runtime_error(origin + ": kernel #" + std::to_string(i) +
                               " lacks a name, family or launch function");
    // A name is selectable by --kernel only if it is not a list, a glob or the word "all".
    const std::string name = k.name;
    if (name == "all" || name.find_first_of(",*?[]\\ \t\n\r'\"") != std::string::npos)
      throw std::runtime_error(origin + ": kernel name '" + name +
                               "' cannot be selected by --kernel (no 'all', commas, glob characters *?[], quotes "
                               "or spaces)");
    if (k.masks & ~AF_SUPPORTS_ALL_MASKS)
      throw std::runtime_error(origin + ": kernel '" + name + "' declares unknown mask bits (AF_SUPPORTS_* of abi.h)");
    if (k.max_head_dim < 0 || k.max_head_dim_v < 0)
      throw std::runtime_error(origin + ": kernel '" + name + "' declares a negative max head dim (0 = no limit)");
    if (k.compute_model != AF_COMPUTE_FUSED && k.compute_model != AF_COMPUTE_UNFUSED)
      throw std::runtime_error(origin + ": kernel '" + k.name + "' declares compute model " +
                               std::to_string(k.compute_model) + " (0 fused, 1 unfused)");
    if ((k.kind != AF_KIND_ATTENTION && k.kind != AF_KIND_MERGE) || (k.flags & ~AF_KERNEL_FLAGS_KNOWN) || (k.variants & ~AF_VARIANTS_KNOWN) ||
        (k.features & ~AF_FEATURES_KNOWN))
      throw std::runtime_error(origin + ": kernel '" + k.name +
                               "' declares a kind, flag, variant or feature bit this attn-fuzz does not know");
    const bool default_pages = k.min_page_size == 0 && k.max_page_size == 0;
    if (!default_pages && (k.min_page_size < 1 || k.max_page_size > 1024 || k.min_page_size > k.max_page_size))
      throw std::runtime_error(origin + ": kernel '" + k.name + "' declares page sizes " +
                               std::to_string(k.min_page_size) + " .. " + std::to_string(k.max_page_size) +
                               " (need 1 <= min <= max <= 1024, or 0 and 0 for 16 .. 256)");
    if (k.n_tunables < 0 || k.n_tunables > AF_MAX_TUNABLES || (k.n_tunables > 0 && !k.tunables))
      throw std::runtime_error(origin + ": kernel '" + k.name + "' declares " + std::to_string(k.n_tunables) +
                               " tunables (0 to " + std::to_string(AF_MAX_TUNABLES) + " with a table)");
    for (int32_t t = 0; t < k.n_tunables; ++t) {
      const af_tunable& tu = k.tunables[t];
      bool ok = tu.name && *tu.name && tu.n_values >= 1 && tu.n_values <= AF_MAX_TUNABLE_VALUES;
      for (int32_t i = 0; ok && i < tu.n_values; ++i) ok = tu.values[i] >= 1;
      if (!ok)
        throw std::runtime_error(origin + ": kernel '" + k.name + "' tunable #" + std::to_string(t) +
                                 " needs a name and 1 to " + std::to_string(AF_MAX_TUNABLE_VALUES) +
                                 " accepted values, each >= 1");
      // --tunable NAME=VALUE and the NAME=VALUE,... lists of reports: letters, digits, '_', '-', '.'.
      const std::string tn = tu.name;
      if (tn.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
          std::string::npos)
        throw std::runtime_error(origin + ": kernel '" + name + "' tunable '" + tn +
                                 "': a tunable name is letters, digits, '_', '-' and '.' (NAME=VALUE must parse)");
      for (int32_t u = 0; u < t; ++u)
        if (tn == k.tunables[u].name)
          throw std::runtime_error(origin + ": kernel '" + name + "' declares the tunable '" + tn + "' twice");
    }
    if (find(backend, k.name))
      throw std::runtime_error(origin + ": kernel '" + k.name + "' is already registered for the " +
                               backend_name(backend) + " backend");
    entries_.push_back({k, backend, origin});
  }
}

void Registry::load_plugin(const std::string& path) {
  // The same file twice (a tool's --plugin and, in the same process, a campaign's minimizer or a repeated flag) is
  // loaded once: its kernels are registered already.
  std::error_code ec;
  for (const KernelEntry& e : entries_)
    if (e.origin == path || std::filesystem::equivalent(e.origin, path, ec)) return;
  // dlopen searches the library path for a name without a '/': "libx.so" means the file here, as the tools'
  // existence check read it.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) throw std::runtime_error("cannot load plug-in " + path + ": " + dlerror());
  auto entry = reinterpret_cast<af_plugin_entry>(dlsym(h, AF_PLUGIN_ENTRY));
  if (!entry) throw std::runtime_error("plug-in " + path + " has no '" AF_PLUGIN_ENTRY "' function");
  const af_plugin* p = entry();
  if (!p) throw std::runtime_error("plug-in " + path + ": " AF_PLUGIN_ENTRY "() returned NULL");
  if (p->abi_version < AF_ABI_MIN_VERSION || p->abi_version > AF_ABI_VERSION)
    throw std::runtime_error("plug-in " + path + " was built for ABI version " +
                             std::to_string(p->abi_version) + "; this attn-fuzz speaks versions " +
                             std::to_string(AF_ABI_MIN_VERSION) + " to " + std::to_string(AF_ABI_VERSION) +
                             ": rebuild it");
  Backend b;
  if (!p->backend || !parse_backend(p->backend, b))
    throw std::runtime_error("plug-in " + path + " names an unknown backend '" +
                             (p->backend ? p->backend : "(null)") + "'");
  if (p->n_kernels > 0 && !p->kernels)
    throw std::runtime_error("plug-in " + path + " lists kernels but no table");
  if (p->abi_version == AF_ABI_VERSION) {
    add(b, p->kernels, p->n_kernels, path);  // the library stays loaded for the life of the process
    return;
  }
  // An older table: entries are the v1 or v2 prefix of af_kernel; the newer fields stay zero (v1: dense
  // forward only, no tunables; v2: fused, no variants). Its launch reads only its prefix of af_problem and
  // af_buffers. A v1 or v2 kernel always has a forward launch.
  const size_t size = kernel_entry_size(p->abi_version);
  std::vector<af_kernel> upgraded(p->n_kernels);
  const auto* bytes = reinterpret_cast<const unsigned char*>(p->kernels);
  for (size_t i = 0; i < p->n_kernels; ++i) {
    upgraded[i] = af_kernel{};
    std::memcpy(&upgraded[i], bytes + i * size, size);
    if (!upgraded[i].launch)
      throw std::runtime_error("plug-in " + path + ": kernel #" + std::to_string(i) +
                               " has no forward launch (ABI version " + std::to_string(p->abi_version) +
                               " requires one; version 3 allows backward-only kernels)");
  }
  add(b, upgraded.data(), upgraded.size(), path);
}

const KernelEntry* Registry::find(Backend backend, const std::string& name) const {
  for (const auto& e : entries_)
    if (e.backend == backend && name == e.kernel.name) return &e;
  return nullptr;
}

std::vector<const KernelEntry*> Registry::select(Backend backend, const std::string& patterns) const {
  std::vector<const KernelEntry*> out;
  size_t start = 0;
  while (start <= patterns.size()) {
    size_t end = patterns.find(',', start);
    if (end == std::string::npos) end = patterns.size();
    std::string pat = patterns.substr(start, end - start);
    start = end + 1;
    if (pat.empty()) continue;
    if (pat == "all") pat = "*";
    bool hit = false;
    for (const auto& e : entries_) {
      if (e.backend != backend || fnmatch(pat.c_str(), e.kernel.name, 0) != 0) continue;
      hit = true;
      bool dup = false;
      for (auto* o : out) dup |= o == &e;
      if (!dup) out.push_back(&e);
    }
    if (!hit) {
      std::string names;
      for (const auto& e : entries_)
        if (e.backend == backend) names += (names.empty() ? "" : ", ") + std::string(e.kernel.name);
      throw std::invalid_argument("no kernel matches '" + pat + "' on the " + backend_name(backend) +
                                  " backend (have: " + (names.empty() ? "none" : names) + ")");
    }
  }
  if (out.empty())  // "" or ",": checking nothing is an input error, never a silent pass
    throw std::invalid_argument("no kernel selected by '" + patterns + "': name kernels or globs ('all')");
  return out;
}

void resolve_tunables(const af_kernel& k, af_problem& p) {
  for (int32_t t = 0; t < AF_MAX_TUNABLES; ++t) {
    if (t >= k.n_tunables) {
      p.tunables[t] = 0;
      continue;
    }
    const af_tunable& tu = k.tunables[t];
    bool accepted = false;
    for (int32_t i = 0; i < tu.n_values; ++i) accepted |= tu.values[i] == p.tunables[t];
    if (!accepted) p.tunables[t] = tu.values[0];
  }
}

std::string tunables_refusal(const af_kernel& k, const af_problem& p) {
  for (int32_t t = 0; t < AF_MAX_TUNABLES; ++t) {
    const int32_t v = p.tunables[t];
    if (v == 0) continue;
    const std::string at = "tunables[" + std::to_string(t) + "] = " + std::to_string(v);
    if (t >= k.n_tunables)
      return at + ", but kernel " + k.name + " declares " +
             (k.n_tunables ? std::to_string(k.n_tunables) + " tunable(s)" : std::string("no tunable"));
    const af_tunable& tu = k.tunables[t];
    std::string accepted;
    bool ok = false;
    for (int32_t i = 0; i < tu.n_values; ++i) {
      accepted += (i ? ", " : "") + std::to_string(tu.values[i]);
      ok |= tu.values[i] == v;
    }
    if (!ok) return at + ": kernel " + k.name + "'s " + tu.name + " accepts " + accepted + " (0 = default)";
  }
  return {};
}

std::string tunables_to_string(const af_kernel& k, const af_problem& p) {
  std::string s;
  for (int32_t t = 0; t < k.n_tunables && t < AF_MAX_TUNABLES; ++t)
    s += (s.empty() ? "" : ",") + std::string(k.tunables[t].name) + "=" + std::to_string(p.tunables[t]);
  return s;
}

namespace {
// The kernel's own check_support ("" = it takes p).
std::string own_check(const af_kernel& k, const af_problem& p) {
  if (k.check_support) {
    char why[256] = {0};
    if (k.check_support(&p, why, sizeof why) != 0) return why[0] ? why : "the kernel's own check refused the problem";
  }
  return {};
}
// The rest of unsupported_reason for a merge kernel: Dv and its own check.
std::string kind_checks_merge(const af_kernel& k, const af_problem& p) {
  if (k.max_head_dim_v && p.head_dim_v > k.max_head_dim_v)
    return "Dv = " + std::to_string(p.head_dim_v) + " exceeds the kernel's max " + std::to_string(k.max_head_dim_v);
  return own_check(k, p);
}
}  // namespace

std::string unsupported_reason(const af_kernel& k, const af_problem& p) {
  if (p.pass == AF_PASS_FORWARD && !k.launch)
    return "the kernel is backward-only (no forward launch): it does not claim forward cases";
  const uint32_t dtypes = k.dtypes ? k.dtypes : AF_SUPPORTS_F32;  // 0 = fp32 only
  if (!(dtypes & (1u << p.dtype))) return std::string("dtype ") + dtype_name(p.dtype) + " not supported";
  if (k.masks && !(k.masks & mask_support_bit(p))) return "mask " + mask_to_string(p) + " not supported";
  if (p.q_layout == AF_SEQ_PACKED && !(k.features & AF_FEATURE_Q_PACKED))
    return "packed (varlen) q not supported";
  // Merged states (issue 29): a merge kernel takes merge cases only, and reads no K / V (their layout and D do
  // not matter to it); an attention kernel takes no merge case.
  const bool merge_kernel = k.kind == AF_KIND_MERGE;
  if (merge_kernel != (p.n_states > 0))
    return merge_kernel ? "a merge kernel (AF_KIND_MERGE) takes merge cases only (n_states > 0)"
                        : "a merge case (n_states > 0) needs a merge kernel (AF_KIND_MERGE)";
  if (merge_kernel) return kind_checks_merge(k, p);
  if (p.kv_layout == AF_SEQ_PACKED && !(k.features & AF_FEATURE_KV_PACKED))
    return "packed (varlen) k/v not supported";
  if (p.kv_layout == AF_SEQ_PAGED && !(k.features & AF_FEATURE_KV_PAGED)) return "paged k/v not supported";
  if (p.kv_layout == AF_SEQ_PAGED) {
    const int32_t lo = k.min_page_size ? k.min_page_size : 16, hi = k.max_page_size ? k.max_page_size : 256;
    if (p.page_size < lo || p.page_size > hi)
      return "page size " + std::to_string(p.page_size) + " not supported (the kernel takes " + std::to_string(lo) +
             " .. " + std::to_string(hi) + ")";
  }
  if (p.variants & ~k.variants)
    return "variant " + variant_names(p.variants & ~k.variants) +
           " not declared by the kernel (af_kernel::variants)";
  // Issue 28: a kernel that declares layouts and variants applies them on its layouts only when it says so.
  if ((p.variants & kLayoutVariants) && has_sequences(p) && !(k.features & AF_FEATURE_LAYOUT_VARIANTS))
    return "variant " + variant_names(p.variants & kLayoutVariants) + " on a sequence layout (" + layout_name(p) +
           ") not declared by the kernel (AF_FEATURE_LAYOUT_VARIANTS in af_kernel::features)";
  if ((p.variants & AF_VARIANT_DROPOUT) && p.dropout_rng >= 0 && p.dropout_rng < 32 &&
      !(k.dropout_rngs & (1u << p.dropout_rng)))
    return std::string("dropout generator ") + dropout_rng_name(p.dropout_rng) +
           " not declared by the kernel (af_kernel::dropout_rngs)";
  if (p.kv_capacity > 0 && !(k.features & AF_FEATURE_SEQUSED_K))
    return "a KV cache with seqused_k (used length below capacity) not supported";
  if (k.max_head_dim && p.head_dim > k.max_head_dim)
    return "D = " + std::to_string(p.head_dim) + " exceeds the kernel's max " +
           std::to_string(k.max_head_dim);
  if (k.max_head_dim_v && p.head_dim_v > k.max_head_dim_v)
    return "Dv = " + std::to_string(p.head_dim_v) + " exceeds the kernel's max " +
           std::to_string(k.max_head_dim_v);
  if (k.needs_dv_eq_d && p.head_dim != p.head_dim_v) return "the kernel needs Dv == D";
  return own_check(k, p);
}

}  // namespace attnfuzz
