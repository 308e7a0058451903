// worker_main.cpp - attn-fuzz-worker: the libFuzzer target (entry points, custom mutator and cross-over).
//
// Linked with libFuzzer's runtime (libclang_rt.fuzzer); run by attn-fuzz in -fork mode, configured through
// the file named by ATTNFUZZ_WORKER_CONFIG (fuzz/worker.h). Coverage is semantic: fuzz/features.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <unistd.h>

#include "fuzz/campaign.h"
#include "fuzz/codec.h"
#include "fuzz/sync.h"
#include "fuzz/worker.h"

using namespace attnfuzz;
using namespace attnfuzz::fuzz;

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

WorkerConfig& config() {
  static WorkerConfig cfg = [] {
    try {
      return worker_config_from_env();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn-fuzz-worker: %s\n", e.what());
      std::exit(2);
    }
  }();
  return cfg;
}

// Under --mps a new client is refused while the server recovers from a fault (until every client of that
// GPU has exited): retried for a while instead of ending the job as a dead worker.
std::unique_ptr<Worker> open_worker() {
  for (int attempt = 0;; ++attempt) {
    try {
      return std::make_unique<Worker>(config());
    } catch (const DeviceError&) {
      if (!config().mps || attempt >= 300) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

// Created on the first input, not at start-up: libFuzzer's fork-mode parent never runs inputs and should
// not open a device.
Worker& worker() {
  static std::unique_ptr<Worker> w = [] {
    try {
      auto w = open_worker();
      set_inprocess_hang_handler(&on_inprocess_hang);  // a spin that passes no barrier costs one timeout
      install_worker_crash_hook(config());             // libFuzzer's handlers are installed by now
      return w;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn-fuzz-worker: %s\n", e.what());
      std::exit(2);
    }
  }();
  return *w;
}

size_t emit(const FuzzInput& in, uint8_t* data, size_t max_size) {
  std::vector<uint8_t> bytes = encode(in, config().limits);
  if (bytes.size() > max_size && in.the_case.explicit_values) {
    FuzzInput plain = in;
    plain.the_case.explicit_values.reset();
    bytes = encode(plain, config().limits);
  }
  const size_t n = std::min(bytes.size(), max_size);  // a truncated encoding still decodes to a valid case
  std::memcpy(data, bytes.data(), n);
  return n;
}

// Compile-aware fuzzing: the input of these bytes fitted onto its kernel's shape pool (Worker::fit), written back
// only when that changed its shape, so that the bytes libFuzzer keeps are the case that runs.
size_t fitted(uint8_t* data, size_t size, size_t max_size, Rng& rng) {
  const FuzzInput in = decode(data, size, config().limits);
  const FuzzInput f = worker().fit(in, rng.next());
  return shape_key(f.the_case) == shape_key(in.the_case) ? size : emit(f, data, max_size);
}

// True while libFuzzer only replays inputs it already has: a fork-mode merge process (-merge_inner=1) all along,
// any other process until it first mutates (a job's seed subset). Those replays read their features from the
// feature cache (fuzz/worker.h) when it has them; new inputs are always checked.
bool g_replaying = true;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// libFuzzer's fork mode gives job k -max_total_time=min(300, k) (the last such flag of the job's command line):
// in a short campaign most jobs last a few seconds, and every job is a new process (start-up, seed replay) with
// a merge after it during which this worker slot idles. A job (a process with -stop_file, which only fork mode
// passes to its jobs) runs at least WorkerConfig::min_job_s instead, but ends kJobEndLeadS before the campaign
// stops its workers (WorkerConfig::stop_unix), so that the fork-mode process still merges its inputs into the
// corpus; it is never shortened. A job still ends early when the campaign interrupts it or when its process dies
// (crash isolation is per process, as before). ATTNFUZZ_MIN_JOB_S=N overrides the floor (0: libFuzzer's own
// lengths), to compare.
constexpr double kJobEndLeadS = 2;

void lengthen_fork_job(int argc, char** argv) {
  auto flag = [](const char* a, const char* name) { return std::strncmp(a, name, std::strlen(name)) == 0; };
  int last = -1;
  bool job = false;
  for (int i = 1; i < argc; ++i) {
    if (flag(argv[i], "-fork=") || flag(argv[i], "-merge_inner=")) return;
    job |= flag(argv[i], "-stop_file=");
    if (flag(argv[i], "-max_total_time=")) last = i;
  }
  if (!job || last < 0) return;
  const long k = std::atol(argv[last] + std::strlen("-max_total_time="));
  const char* env = std::getenv("ATTNFUZZ_MIN_JOB_S");
  long len = std::max(k, env && *env ? std::atol(env) : static_cast<long>(config().min_job_s));
  if (const double stop = config().stop_unix; stop > 0) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    len = std::max(k, std::min(len, static_cast<long>(std::floor(stop - now - kJobEndLeadS))));
  }
  if (len == k) return;
  static std::string lengthened;  // libFuzzer copies the arguments after LLVMFuzzerInitialize
  lengthened = "-max_total_time=" + std::to_string(len);
  argv[last] = lengthened.data();
}

// Counts the time of a custom mutation or cross-over (on every return) in the worker's statistics.
struct MutateTimer {
  Clock::time_point t0 = Clock::now();
  ~MutateTimer() { worker().count_time(0, seconds_since(t0)); }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // --version as every tool answers it (libFuzzer ignores flags that start with "--" and would start fuzzing).
  for (int i = 1; argc && argv && i < *argc; ++i)
    if (std::strcmp((*argv)[i], "--version") == 0) {
      std::printf("attn-fuzz-worker " ATTNFUZZ_VERSION "\n");
      std::exit(0);
    }
  // The campaign's minimize phase (fuzz/campaign.h minimize_jobs): no fuzzing in this process.
  if (const char* jobs = std::getenv(kMinimizeEnv); jobs && *jobs) std::exit(minimize_jobs(config(), jobs));
  watch_lifeline();  // the fork-mode parent and every job die with attn-fuzz
  (void)config();    // a bad configuration stops here, before libFuzzer starts
  if (argc && argv) lengthen_fork_job(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Worker& w = worker();
  const uint64_t hash = input_hash(data, size);  // once per input: the feature cache's key and the crash hook's
  if (g_replaying && w.replay_features(hash, size)) return 0;
  const auto t0 = Clock::now();
  const FuzzInput in = decode(data, size, config().limits);
  note_current_input(hash);  // the crash hook names this input's kernel (work/faults.txt)
  const Worker::Outcome out = w.run(in);
  w.count_time(seconds_since(t0), 0, out.kernel);
  if (out.suspect) save_mps_suspect(config(), data, size);
  // A GPU fault or hang leaves this process's context unusable (and under MPS every client's): every later
  // launch here would fail. The process ends; the next fork-mode job opens a fresh context.
  if (out.suspect || !w.device().usable()) {
    std::fprintf(stderr, "attn-fuzz-worker: %s%s: this worker process ends, the next one opens a fresh context\n",
                 out.suspect ? "a crash, hang or launch error under MPS, to be re-run alone" : "the device is unusable",
                 out.kernel ? (std::string(" (kernel ") + out.kernel->kernel.name + ")").c_str() : "");
    w.write_stats(true);
    std::fflush(nullptr);
    ::_exit(0);
  }
  w.save_features(hash, size);
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  g_replaying = false;  // from now on inputs are new (merge processes never mutate)
  const MutateTimer timed;
  // --sync: an entry another campaign published, not yet run here, goes first (fork mode never re-reads
  // the corpus directory; libFuzzer keeps the input if it adds features, and the parent saves it).
  if (auto in = take_synced_input(config().out, max_size)) {
    std::memcpy(data, in->data(), in->size());
    return in->size();
  }
  Rng rng(seed, 0x6d75);
  // Mostly structured mutations; now and then libFuzzer's byte mutations (the decoder keeps them valid).
  if (rng.below(10) == 0) return fitted(data, LLVMFuzzerMutate(data, size, max_size), max_size, rng);
  const CaseDomain dom(config().limits);
  FuzzInput in = size == 0 ? dom.init(rng) : decode(data, size, config().limits);
  dom.mutate(in, rng);
  return emit(worker().fit(in, rng.next()), data, max_size);
}

extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* d1, size_t s1, const uint8_t* d2, size_t s2,
                                            uint8_t* out, size_t max_out, unsigned int seed) {
  g_replaying = false;
  const MutateTimer timed;
  Rng rng(seed, 0x636f);
  const CaseDomain dom(config().limits);
  const FuzzInput a = decode(d1, s1, config().limits), b = decode(d2, s2, config().limits);
  return emit(worker().fit(dom.cross_over(a, b, rng), rng.next()), out, max_out);
}
