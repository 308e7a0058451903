// worker_main.cpp - attn-fuzz-worker: the libFuzzer target (entry points, custom mutator and cross-over).
//
// Linked with libFuzzer's runtime (libclang_rt.fuzzer); run by attn-fuzz in -fork mode, configured through
// the file named by ATTNFUZZ_WORKER_CONFIG (fuzz/worker.h). Coverage is semantic: fuzz/features.h.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <unistd.h>

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

// True while libFuzzer only replays inputs it already has: a fork-mode merge process (-merge_inner=1) all along,
// any other process until it first mutates (a job's seed subset). Those replays read their features from the
// feature cache (fuzz/worker.h) when it has them; new inputs are always checked.
bool g_replaying = true;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  watch_lifeline();  // the fork-mode parent and every job die with attn-fuzz
  (void)config();    // a bad configuration stops here, before libFuzzer starts
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Worker& w = worker();
  if (g_replaying && w.replay_features(data, size)) return 0;
  const FuzzInput in = decode(data, size, config().limits);
  note_current_input(data, size);  // the crash hook names this input's kernel (work/faults.txt)
  const Worker::Outcome out = w.run(in);
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
  w.save_features(data, size);
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  g_replaying = false;  // from now on inputs are new (merge processes never mutate)
  // --sync: an entry another campaign published, not yet run here, goes first (fork mode never re-reads
  // the corpus directory; libFuzzer keeps the input if it adds features, and the parent saves it).
  if (auto in = take_synced_input(config().out, max_size)) {
    std::memcpy(data, in->data(), in->size());
    return in->size();
  }
  Rng rng(seed, 0x6d75);
  // Mostly structured mutations; now and then libFuzzer's byte mutations (the decoder keeps them valid).
  if (rng.below(10) == 0) return LLVMFuzzerMutate(data, size, max_size);
  const CaseDomain dom(config().limits);
  FuzzInput in = size == 0 ? dom.init(rng) : decode(data, size, config().limits);
  dom.mutate(in, rng);
  return emit(in, data, max_size);
}

extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* d1, size_t s1, const uint8_t* d2, size_t s2,
                                            uint8_t* out, size_t max_out, unsigned int seed) {
  g_replaying = false;
  Rng rng(seed, 0x636f);
  const CaseDomain dom(config().limits);
  const FuzzInput a = decode(d1, s1, config().limits), b = decode(d2, s2, config().limits);
  return emit(dom.cross_over(a, b, rng), out, max_out);
}
