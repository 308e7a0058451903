// gpu_device.cpp - the nvidia and amd backends of the device layer: one HIP source, built by nvcc (shim) or hipcc.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attnfuzz/device.h"
#include "attnfuzz/hip.h"

#if defined(ATTNFUZZ_BACKEND_NVIDIA)
#define AF_GPU_BACKEND ::attnfuzz::Backend::kNvidia
#define AF_GPU_FACTORY make_nvidia_device
#define AF_GPU_PROBE probe_nvidia
#else
#define AF_GPU_BACKEND ::attnfuzz::Backend::kAmd
#define AF_GPU_FACTORY make_amd_device
#define AF_GPU_PROBE probe_amd
#endif

namespace attnfuzz {
namespace {

std::string err_text(hipError_t e) { return std::string(hipGetErrorName(e)) + ": " + hipGetErrorString(e); }

// Device::fill's common case (a 32-bit pattern over whole aligned words) on the device, queued on the default
// stream: no host buffer and no copy.
__global__ void fill_words(uint32_t* dst, uint32_t word, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = word;
}

class GpuDevice final : public Device {
 public:
  explicit GpuDevice(DeviceOptions o) : Device(o) {
    int n = 0;
    const hipError_t e = hipGetDeviceCount(&n);
    if (e != hipSuccess || n == 0)
      throw DeviceError(std::string(backend_name(AF_GPU_BACKEND)) + " backend: no device" +
                        (e != hipSuccess ? " (" + err_text(e) + ")" : ""));
    if (o.gpu_index < 0 || o.gpu_index >= n)
      throw DeviceError("gpu index " + std::to_string(o.gpu_index) + " out of range: " + std::to_string(n) +
                        " device(s)");
    check(hipSetDevice(o.gpu_index), "set device");
    hipDeviceProp_t prop;
    check(hipGetDeviceProperties(&prop, o.gpu_index), "device properties");
    name_ = prop.name;
#if !defined(ATTNFUZZ_BACKEND_NVIDIA)
    name_ += std::string(" (") + prop.gcnArchName + ")";
#endif
    check(hipEventCreate(&start_), "event");
    check(hipEventCreate(&stop_), "event");
  }
  ~GpuDevice() override {
    if (usable_) {
      (void)hipEventDestroy(start_);
      (void)hipEventDestroy(stop_);
      if (staging_) (void)hipHostFree(staging_);
    }
  }

  Backend backend() const override { return AF_GPU_BACKEND; }
  std::string name() const override { return name_; }
  bool usable() const override { return usable_; }

  void* alloc(size_t bytes) override {
    void* p = nullptr;
    check(hipMalloc(&p, bytes ? bytes : 1), "allocate " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free(void* p) override {
    if (usable_) (void)hipFree(p);
  }
  void to_device(void* dst, const void* src, size_t n) override {
    check(hipMemcpy(dst, src, n, hipMemcpyHostToDevice), "copy to device");
  }
  void to_host(void* dst, const void* src, size_t n) override {
    check(hipMemcpy(dst, src, n, hipMemcpyDeviceToHost), "copy to host");
  }
  void fill(void* dst, const void* pattern, size_t pattern_bytes, size_t bytes) override {
    if (pattern_bytes != 4 || bytes % 4 != 0 || reinterpret_cast<uintptr_t>(dst) % 4 != 0) {
      Device::fill(dst, pattern, pattern_bytes, bytes);
      return;
    }
    if (bytes == 0) return;
    uint32_t word;
    std::memcpy(&word, pattern, 4);
    const size_t n = bytes / 4;
    const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 1024));
    hipLaunchKernelGGL(fill_words, dim3(blocks), dim3(256), 0, nullptr, static_cast<uint32_t*>(dst), word, n);
    check(hipGetLastError(), "fill " + std::to_string(bytes) + " bytes");
  }
  // One pinned staging buffer for the whole batch, copies queued on the default stream, one synchronisation. A
  // batch over 64 MiB (large outputs) is copied one by one, keeping the pinned memory small.
  void to_host_all(const std::vector<HostCopy>& copies) override {
    size_t total = 0;
    for (const HostCopy& c : copies) total += c.bytes;
    if (total > (size_t{64} << 20)) {
      Device::to_host_all(copies);
      return;
    }
    if (total > staging_bytes_) {
      const size_t want = std::max(total, std::min(2 * staging_bytes_, size_t{64} << 20));
      if (staging_) check(hipHostFree(staging_), "free pinned staging");
      staging_ = nullptr;
      staging_bytes_ = 0;
      check(hipHostMalloc(&staging_, want, hipHostMallocDefault), "allocate " + std::to_string(want) + " pinned bytes");
      staging_bytes_ = want;
    }
    auto* at = static_cast<unsigned char*>(staging_);
    for (const HostCopy& c : copies) {
      if (c.bytes) check(hipMemcpyAsync(at, c.src, c.bytes, hipMemcpyDeviceToHost, nullptr), "copy to host");
      at += c.bytes;
    }
    check(hipStreamSynchronize(nullptr), "copy to host");
    at = static_cast<unsigned char*>(staging_);
    for (const HostCopy& c : copies) {
      if (c.bytes) std::memcpy(c.dst, at, c.bytes);
      at += c.bytes;
    }
  }
  void synchronize() override { check(hipDeviceSynchronize(), "synchronize"); }

  LaunchResult launch(const af_kernel& k, const af_problem& p, const af_buffers& b) override {
    LaunchResult r;
    if (!usable_) {
      r.status = LaunchStatus::kLaunchError;
      r.message = "device unusable after an earlier crash or hang";
      return r;
    }
    (void)hipGetLastError();
    check(hipEventRecord(start_, nullptr), "event record");
    const int rc = k.launch(&p, &b, nullptr);
    if (rc != 0) {
      r.status = LaunchStatus::kLaunchError;
      r.message = err_text(static_cast<hipError_t>(rc));
      (void)hipDeviceSynchronize();
      return r;
    }
    check(hipEventRecord(stop_, nullptr), "event record");
    const auto t0 = std::chrono::steady_clock::now();
    hipError_t q;
    // Polled, so that a hang ends at the timeout: the first 200 us yielding the core (a typical check's kernel
    // ends within them, and a sleep's wake-up alone takes about 60 us), then sleeping 20 us, doubling to 1 ms.
    auto sleep = std::chrono::microseconds(20);
    while ((q = hipEventQuery(stop_)) == hipErrorNotReady) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited < 200e-6) {
        std::this_thread::yield();
        continue;
      }
      if (opts_.timeout_s > 0 && waited > opts_.timeout_s) {
        usable_ = false;  // a running kernel cannot be stopped; the context is lost to this process
        r.status = LaunchStatus::kHang;
        char secs[32];  // "30 s", not std::to_string's "30.000000 s"
        std::snprintf(secs, sizeof secs, "%g", opts_.timeout_s);
        r.message = std::string("the kernel did not finish within ") + secs + " s";
        return r;
      }
      std::this_thread::sleep_for(sleep);
      if (sleep < std::chrono::microseconds(1000)) sleep *= 2;
    }
    if (q != hipSuccess) {
      usable_ = false;  // illegal address and friends are sticky
      r.status = LaunchStatus::kCrash;
      r.message = err_text(q);
      return r;
    }
    float ms = 0;
    (void)hipEventElapsedTime(&ms, start_, stop_);
    r.ms = ms;
    return r;
  }

 private:
  void check(hipError_t e, const std::string& what) {
    if (e != hipSuccess) throw DeviceError(std::string(backend_name(AF_GPU_BACKEND)) + " backend: " + what + ": " + err_text(e));
  }
  std::string name_;
  hipEvent_t start_{}, stop_{};
  void* staging_ = nullptr;  // pinned host memory for to_host_all, grown as batches need
  size_t staging_bytes_ = 0;
  bool usable_ = true;
};

}  // namespace

std::unique_ptr<Device> AF_GPU_FACTORY(const DeviceOptions& o) { return std::make_unique<GpuDevice>(o); }

bool AF_GPU_PROBE(std::string* why) {
  int n = 0;
  const hipError_t e = hipGetDeviceCount(&n);
  if (e == hipSuccess && n > 0) return true;
  if (why) *why = std::string(backend_name(AF_GPU_BACKEND)) + " backend: no device" + (e != hipSuccess ? " (" + err_text(e) + ")" : "");
  return false;
}

}  // namespace attnfuzz
