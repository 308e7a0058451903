// registry.cpp - the kernel registry: built-in tables, plug-ins loaded with dlopen, selection by name or glob.
#include "attnfuzz/registry.h"

#include <dlfcn.h>
#include <fnmatch.h>

#include <stdexcept>

#include "attnfuzz/problem.h"

namespace attnfuzz {

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
    if (!k.name || !*k.name || !k.family || !k.launch)
      throw std::runtime_error(origin + ": kernel #" + std::to_string(i) + " lacks a name, family or launch function");
    if (find(backend, k.name))
      throw std::runtime_error(origin + ": kernel '" + k.name + "' is already registered for the " +
                               backend_name(backend) + " backend");
    entries_.push_back({k, backend, origin});
  }
}

void Registry::load_plugin(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) throw std::runtime_error("cannot load plug-in " + path + ": " + dlerror());
  auto entry = reinterpret_cast<af_plugin_entry>(dlsym(h, AF_PLUGIN_ENTRY));
  if (!entry) throw std::runtime_error("plug-in " + path + " has no '" AF_PLUGIN_ENTRY "' function");
  const af_plugin* p = entry();
  if (!p) throw std::runtime_error("plug-in " + path + ": " AF_PLUGIN_ENTRY "() returned NULL");
  if (p->abi_version != AF_ABI_VERSION)
    throw std::runtime_error("plug-in " + path + " was built for ABI version " + std::to_string(p->abi_version) +
                             "; this attn-fuzz speaks version " + std::to_string(AF_ABI_VERSION) + ": rebuild it");
  Backend b;
  if (!p->backend || !parse_backend(p->backend, b))
    throw std::runtime_error("plug-in " + path + " names an unknown backend '" + (p->backend ? p->backend : "(null)") + "'");
  add(b, p->kernels, p->n_kernels, path);  // the library stays loaded for the life of the process
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
  return out;
}

std::string unsupported_reason(const af_kernel& k, const af_problem& p) {
  const uint32_t dtypes = k.dtypes ? k.dtypes : AF_SUPPORTS_F32;  // 0 = fp32 only
  if (!(dtypes & (1u << p.dtype))) return std::string("dtype ") + dtype_name(p.dtype) + " not supported";
  if (k.masks && !(k.masks & mask_support_bit(p))) return "mask " + mask_to_string(p) + " not supported";
  if (k.max_head_dim && p.head_dim > k.max_head_dim)
    return "D = " + std::to_string(p.head_dim) + " exceeds the kernel's max " + std::to_string(k.max_head_dim);
  if (k.max_head_dim_v && p.head_dim_v > k.max_head_dim_v)
    return "Dv = " + std::to_string(p.head_dim_v) + " exceeds the kernel's max " + std::to_string(k.max_head_dim_v);
  if (k.needs_dv_eq_d && p.head_dim != p.head_dim_v) return "the kernel needs Dv == D";
  if (k.check_support) {
    char why[256] = {0};
    if (k.check_support(&p, why, sizeof why) != 0) return why[0] ? why : "the kernel's own check refused the problem";
  }
  return {};
}

}  // namespace attnfuzz
