// kernel_speed.cpp - benchmark: the kernels on one backend (cpu emulator by default), side by side (name=value lines).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"

using namespace attnfuzz;

namespace {

double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// Median wall time of `reps` in-process launches (buffers allocated once); `cpu_ms` (if given): the median
// process CPU time of a launch, which other processes on a busy machine disturb less than the wall time.
double median_ms(Device& dev, const KernelEntry& k, const Case& c, int reps, double* cpu_ms = nullptr) {
  const Problem& p = c.problem;
  const Tensors t = generate(c);
  auto bytes = [](int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 1)) * 4; };
  void* q = dev.alloc(bytes(q_elements(p)));
  void* kk = dev.alloc(bytes(k_elements(p)));
  void* v = dev.alloc(bytes(v_elements(p)));
  void* o = dev.alloc(bytes(o_elements(p)));
  void* lse = dev.alloc(bytes(lse_elements(p)));
  const size_t wsb = k.kernel.workspace_bytes ? k.kernel.workspace_bytes(&p) : 0;
  void* ws = wsb ? dev.alloc(wsb) : nullptr;
  dev.to_device(q, t.q.data(), t.q.size() * 4);
  dev.to_device(kk, t.k.data(), t.k.size() * 4);
  dev.to_device(v, t.v.data(), t.v.size() * 4);
  af_buffers b{q, kk, v, o, k.kernel.writes_lse ? static_cast<float*>(lse) : nullptr, ws};
  std::vector<void*> ints;  // sequence layouts: cu_seqlens, seqused_k, block_table
  auto put = [&](const std::vector<int32_t>& a) -> const int32_t* {
    if (a.empty()) return nullptr;
    ints.push_back(dev.alloc(a.size() * 4));
    dev.to_device(ints.back(), a.data(), a.size() * 4);
    return static_cast<const int32_t*>(ints.back());
  };
  b.cu_seqlens_q = put(t.cu_seqlens_q);
  b.cu_seqlens_k = put(t.cu_seqlens_k);
  b.seqused_k = put(t.seqused_k);
  b.block_table = put(t.block_table);
  std::vector<double> ms, cpu;
  for (int i = 0; i < reps + 1; ++i) {
    const double c0 = process_cpu_ms();
    LaunchResult r = dev.launch(k.kernel, p, b);
    if (i) cpu.push_back(process_cpu_ms() - c0);
    if (r.status != LaunchStatus::kOk) {
      std::fprintf(stderr, "%s: %s\n", k.kernel.name, r.message.c_str());
      return -1;
    }
    if (i) ms.push_back(r.ms);  // the first launch warms the stack pool
  }
  for (void* x : {q, kk, v, o, lse, ws})
    if (x) dev.free(x);
  for (void* x : ints) dev.free(x);
  std::sort(ms.begin(), ms.end());
  std::sort(cpu.begin(), cpu.end());
  if (cpu_ms) *cpu_ms = cpu[cpu.size() / 2];
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "cpu";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  if (argc > 3 || backend.rfind("-", 0) == 0 || reps < 1) {
    std::fprintf(stderr, "usage: kernel_speed [BACKEND (cpu, nvidia, amd, auto)] [REPS >= 1, default 5]\n");
    return 2;
  }
  DeviceOptions o;
  o.isolate = false;
  o.workers = 1;  // one core: comparable with the spike's 40 ms
  std::unique_ptr<Device> dev;
  try {
    dev = open_device(backend, o);
  } catch (const DeviceError& e) {
    std::fprintf(stderr, "kernel_speed: %s\n", e.what());
    return 2;
  }
  Backend b = dev->backend();
  std::printf("device=%s\n", dev->name().c_str());
  // 1. The emulator's cost on the spike's configuration: online-row, S=128, D=64, 64 threads, 1 core.
  Problem p = make_problem(1, 1, 1, 128, 128, 64, 64);
  const KernelEntry* online = Registry::global().find(b, "online-row");
  double cpu_online = 0;
  const double t_online = median_ms(*dev, *online, make_case(p, 1), reps, &cpu_online);
  std::printf("online_row_S128_D64_ms=%.2f  cpu_ms=%.2f\n", t_online, cpu_online);
  if (b == Backend::kCpu) std::printf("online_row_vs_spike_40ms_ratio=%.2f  (target <= 1.5)\n", t_online / 40.0);
  // 2. Every kernel on two shapes, with its ratio to materialized measured in the same run.
  for (auto [s, d] : {std::pair<int64_t, int64_t>{128, 64}, {512, 64}}) {
    Problem q = make_problem(1, 2, 2, s, s, d, d);
    q.mask_kind = AF_MASK_CAUSAL;
    q.window_right = 0;
    const KernelEntry* mat = Registry::global().find(b, "materialized");
    const double base = median_ms(*dev, *mat, make_case(q, 1), reps);
    for (const KernelEntry* k : Registry::global().select(b, "all")) {
      if (!unsupported_reason(k->kernel, q).empty()) continue;  // e.g. paged-decode: 1..8 query tokens
      const double t = k == mat ? base : median_ms(*dev, *k, make_case(q, 1), reps);
      std::printf("%s_S%lld_D%lld_causal_ms=%.3f  vs_materialized=%.2f\n", k->kernel.name, (long long)s, (long long)d, t,
                  t / base);
    }
  }
  // 3. Decode over a paged KV cache (8 sequences of 100..800 used keys, pages of 16 in shuffled order, one
  //    query token, 4 query heads on 1 kv head): the kernels that take paged K/V.
  Case dc = make_case(make_problem(8, 4, 1, 1, 0, 64, 64), 1);
  dc.problem.mask_kind = AF_MASK_CAUSAL;
  dc.problem.kv_layout = AF_SEQ_PAGED;
  dc.problem.page_size = 16;
  dc.seqs.used = {100, 800, 257, 33, 512, 640, 129, 700};
  dc.seqs.page_order = 7;
  if (std::string e = set_sequence_fields(dc); !e.empty()) {
    std::fprintf(stderr, "decode case: %s\n", e.c_str());
    return 1;
  }
  for (const KernelEntry* k : Registry::global().select(b, "all")) {
    if (!unsupported_reason(k->kernel, dc.problem).empty()) continue;
    std::printf("%s_paged_decode_B8_used3k_ms=%.3f\n", k->kernel.name, median_ms(*dev, *k, dc, reps));
  }
  return 0;
}
