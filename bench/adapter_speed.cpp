// adapter_speed.cpp - benchmark: adapter round trip per case vs in-process and isolated cpu kernels; pipe
// throughput for large tensors against the oracle's cost (does shared memory pay?). Prints name=value lines.
//
//   build/bench/adapter_speed [PYTHON]      (PYTHON: a python3 with numpy; default /usr/bin/python3)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"

using namespace attnfuzz;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median ms of the kernel launch (LaunchResult::ms) and of the whole guarded launch (allocation, upload,
// launch, download, canaries) over reps.
struct Times {
  double launch_ms, guarded_ms;
};
Times time_launches(Device& dev, const KernelEntry& k, const Problem& p, int reps) {
  const Tensors t = generate(make_case(p, 1));
  RunOptions ro;
  std::vector<double> l, g;
  for (int i = 0; i < reps + 1; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    LaunchOutcome out = launch_guarded(dev, k, p, t, ro);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (out.launch.status != LaunchStatus::kOk) {
      std::fprintf(stderr, "%s: %s\n", k.kernel.name, out.launch.message.c_str());
      return {-1, -1};
    }
    if (i) {
      l.push_back(out.launch.ms);
      g.push_back(ms);
    }
  }
  return {median(l), median(g)};
}

}  // namespace

int run(const std::string& python);

int main(int argc, char** argv) {
  const std::string python = argc > 1 ? argv[1] : "/usr/bin/python3";
  if (argc > 2 || python.rfind("-", 0) == 0) {
    std::fprintf(stderr, "usage: adapter_speed [PYTHON, default /usr/bin/python3]\n");
    return 2;
  }
  try {
    return run(python);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "adapter_speed: %s\n", e.what());
    return 2;
  }
}

int run(const std::string& python) {
  const std::string src = ATTNFUZZ_SOURCE_DIR;
  const int reps = 31;
  // 1. Per small case: the sweep's typical 33x33 D=32 case.
  const Problem small = make_problem(1, 1, 1, 33, 33, 32, 32);
  DeviceOptions co;
  co.workers = 1;
  co.isolate = false;
  auto cpu = open_device("cpu", co);
  const KernelEntry* mat = Registry::global().find(Backend::kCpu, "materialized");
  const Times in_proc = time_launches(*cpu, *mat, small, reps);
  co.isolate = true;
  cpu->set_options(co);
  const Times isolated = time_launches(*cpu, *mat, small, reps);
  DeviceOptions ao;
  ao.adapter_command = "PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=" + src + "/python " + python + " " + src +
                       "/bench/null_adapter.py";
  auto ad = open_device("adapter", ao);
  const KernelEntry* null = Registry::global().find(Backend::kAdapter, "null");
  const Times adapter = time_launches(*ad, *null, small, reps);
  std::printf("case=B1 H1 Sq=Sk=33 D=32 (median of %d)\n", reps);
  std::printf("cpu_materialized_in_process_launch_ms=%.3f guarded_ms=%.3f\n", in_proc.launch_ms,
              in_proc.guarded_ms);
  std::printf("cpu_materialized_isolated_launch_ms=%.3f guarded_ms=%.3f\n", isolated.launch_ms,
              isolated.guarded_ms);
  std::printf("adapter_null_round_trip_ms=%.3f guarded_ms=%.3f\n", adapter.launch_ms, adapter.guarded_ms);
  std::printf("adapter_round_trip_over_in_process_guarded=%.2f\n", adapter.guarded_ms / in_proc.guarded_ms);
  std::printf("adapter_round_trip_over_isolated_guarded=%.2f\n", adapter.guarded_ms / isolated.guarded_ms);
  // 2. Large tensors through the pipes, against the oracle's cost on the same case.
  for (int64_t s : {256, 1024, 4096}) {
    const Problem p = make_problem(1, 8, 8, s, s, 128, 128);
    const Times t = time_launches(*ad, *null, p, 5);
    const double mb =
        4.0 * (q_elements(p) + k_elements(p) + v_elements(p) + o_elements(p) + lse_elements(p)) / 1e6;
    PreparedCase pc(make_case(p, 1));
    OracleOptions oo;
    oo.row_budget = 512;  // the sampled oracle a large case would use (--oracle-rows 512)
    const auto t0 = std::chrono::steady_clock::now();
    pc.oracle(oo);
    const double oracle_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "S=%lld H=8 D=128: bytes_moved_MB=%.1f adapter_round_trip_ms=%.1f pipe_MB_per_s=%.0f "
        "oracle_512_rows_ms=%.0f round_trip_over_oracle=%.3f\n",
        (long long)s, mb, t.launch_ms, mb / (t.launch_ms / 1e3), oracle_ms, t.launch_ms / oracle_ms);
  }
  return 0;
}
