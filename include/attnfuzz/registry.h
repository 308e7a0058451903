// registry.h - every kernel the tool can run: built-ins registered at start-up and plug-ins loaded by path.
#pragma once

#include <string>
#include <vector>

#include "attnfuzz/abi.h"
#include "attnfuzz/device.h"

namespace attnfuzz {

struct KernelEntry {
  af_kernel kernel;    // copied from the kernel's table
  Backend backend;     // what its launch function was compiled for
  std::string origin;  // "built-in" or the plug-in's path
};

// Whether kernel k claims to support problem p (dtype, mask, limits, its own check). Empty = yes,
// else a sentence saying why not.
std::string unsupported_reason(const af_kernel& k, const af_problem& p);

// Sets every declared tunable of k in p to an accepted value: entries that hold one keep it (an
// experiment chose it), the others (0 = default, or a value the kernel does not accept) get values[0].
// Entries past k.n_tunables become 0.
void resolve_tunables(const af_kernel& k, af_problem& p);

// Why p's tunables cannot be run by k as written (a value k does not accept, or a value past k's declared
// tunables), or empty: 0 (the default) is always fine. Replays refuse such a case instead of running the
// default under the file's value (resolve_tunables would map it silently).
std::string tunables_refusal(const af_kernel& k, const af_problem& p);

// "num_splits=4,foo=2" for the declared tunables of k as set in p; empty when k declares none.
std::string tunables_to_string(const af_kernel& k, const af_problem& p);

class Registry {
 public:
  // The process-wide registry (built-ins are added before main by AF_REGISTER_KERNELS).
  static Registry& global();

  void add(Backend backend, const af_kernel* kernels, size_t n, const std::string& origin);
  // Loads a plug-in (dlopen + attnfuzz_plugin()); a file loaded already is not loaded again. Throws
  // std::runtime_error with a clear message on a missing file, missing entry point, ABI mismatch, unknown
  // backend or duplicate kernel name.
  void load_plugin(const std::string& path);

  const std::vector<KernelEntry>& all() const { return entries_; }
  // Entries for one backend whose names match a comma-separated list of names or globs ("all" = *).
  // Throws std::invalid_argument naming a pattern that matched nothing, or when nothing is selected ("",
  // ",").
  std::vector<const KernelEntry*> select(Backend backend, const std::string& patterns) const;
  const KernelEntry* find(Backend backend, const std::string& name) const;

 private:
  std::vector<KernelEntry> entries_;
};

// Called from the static registrar in each kernel file (see kernels/register.h).
bool register_builtin_kernels(const char* backend, const af_kernel* kernels, size_t n);

}  // namespace attnfuzz
