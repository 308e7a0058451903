// device.cpp - which backends this binary has, whether they have a device, and opening one.
#include "attnfuzz/device.h"

namespace attnfuzz {

std::unique_ptr<Device> make_cpu_device(const DeviceOptions& o);
std::unique_ptr<Device> make_adapter_device(const DeviceOptions& o);
#if defined(ATTNFUZZ_HAVE_NVIDIA)
std::unique_ptr<Device> make_nvidia_device(const DeviceOptions& o);
bool probe_nvidia(std::string* why);
#endif
#if defined(ATTNFUZZ_HAVE_AMD)
std::unique_ptr<Device> make_amd_device(const DeviceOptions& o);
bool probe_amd(std::string* why);
#endif

std::vector<Backend> built_backends() {
  std::vector<Backend> v;
#if defined(ATTNFUZZ_HAVE_NVIDIA)
  v.push_back(Backend::kNvidia);
#endif
#if defined(ATTNFUZZ_HAVE_AMD)
  v.push_back(Backend::kAmd);
#endif
  v.push_back(Backend::kCpu);
  return v;
}

bool backend_available(Backend b, std::string* why) {
  switch (b) {
    case Backend::kCpu: return true;
    case Backend::kNvidia:
#if defined(ATTNFUZZ_HAVE_NVIDIA)
      return probe_nvidia(why);
#else
      if (why) *why = "the nvidia backend is not built (configure with -DATTNFUZZ_NVIDIA=ON)";
      return false;
#endif
    case Backend::kAmd:
#if defined(ATTNFUZZ_HAVE_AMD)
      return probe_amd(why);
#else
      if (why) *why = "the amd backend is not built (configure with -DATTNFUZZ_AMD=ON)";
      return false;
#endif
    case Backend::kAdapter: return true;  // open_device says what is wrong with the command
  }
  return false;
}

std::unique_ptr<Device> open_device(Backend b, const DeviceOptions& o) {
  std::string why;
  if (!backend_available(b, &why)) throw DeviceError(why);
  switch (b) {
    case Backend::kAdapter: return make_adapter_device(o);
#if defined(ATTNFUZZ_HAVE_NVIDIA)
    case Backend::kNvidia: return make_nvidia_device(o);
#endif
#if defined(ATTNFUZZ_HAVE_AMD)
    case Backend::kAmd: return make_amd_device(o);
#endif
    default: return make_cpu_device(o);
  }
}

std::unique_ptr<Device> open_device(const std::string& backend, const DeviceOptions& o) {
  if (!o.adapter_command.empty()) {  // --adapter CMD: the adapter backend, whatever "auto" would pick
    if (backend != "auto" && backend != "adapter")
      throw DeviceError("--adapter runs kernels in the adapter process: drop --backend " + backend);
    return make_adapter_device(o);
  }
  if (backend == "auto") {
    for (Backend b : built_backends())
      if (backend_available(b)) return open_device(b, o);
    return make_cpu_device(o);
  }
  Backend b;
  if (!parse_backend(backend, b)) throw DeviceError("unknown backend '" + backend + "': use cpu, nvidia, amd, auto or adapter (with --adapter CMD)");
  return open_device(b, o);
}

}  // namespace attnfuzz
