// worker.h - what one attn-fuzz worker process does with an input: decode, pick a kernel, check, count, save
// failures.
//
// Protocol with the attn-fuzz parent (fuzz/campaign.cpp): the parent writes a WorkerConfig as JSON and
// names it in the environment variable ATTNFUZZ_WORKER_CONFIG (libFuzzer's fork mode passes the
// environment to every job). Each worker process then writes into the campaign directory <out>:
//   <out>/failures/<class>-<hash>.case   a distinct failure (corpus format, replayable by attn-check
//   --replay) <out>/failures/<class>-<hash>.md/.json/.svg  its report (Markdown, JSON, heatmap)
//   <out>/work/dedup/<key>               claim of a (kernel, class, signature): created O_EXCL, first one
//   wins <out>/work/stats/<pid>-<ns>.json     running totals of this process (cases, verdicts, classes,
//   features)
// and reads
//   <out>/work/isolate.txt               kernels to launch isolated (one name a line; appended by the parent
//                                        after a worker process died in one, by a worker after a leak)
//   <out>/work/quarantine.txt            kernels not run any more (one name a line; appended by whoever saw
//                                        one hang: a spinning kernel costs one timeout, then none)
//   <out>/work/deaths.txt                "hang <kernel>" per worker process its hang watchdog ended
// and both reads and writes
//   <out>/work/featcache/<pid>.bin       the coverage features of inputs that added a feature to their process
//                                        (what libFuzzer keeps): key (hash of the bytes), kernel slot and name,
//                                        feature ids, appended one record per write. Fork mode runs kept inputs
//                                        again only to read their features (every job replays a seed subset,
//                                        every merge re-runs a job's new inputs): those replays take them from
//                                        here (Worker::replay_features) instead of checking the input again.
// and nothing on stdout per input (libFuzzer's own lines are what the parent parses for coverage).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"
#include "fuzz/codec.h"
#include "fuzz/features.h"
#include "fuzz/shape_pool.h"

namespace attnfuzz::fuzz {

inline constexpr const char* kWorkerConfigEnv = "ATTNFUZZ_WORKER_CONFIG";

struct WorkerConfig {
  std::string kernels = "all";  // --kernel patterns
  std::string backend = "cpu";
  std::vector<std::string> plugins;
  std::string adapter;  // backend "adapter": the adapter command each worker process starts (PROTOCOL.md)
  std::string order = "shuffle";  // cpu emulator thread order (shuffle finds races in either direction)
  uint64_t order_seed = 1;
  unsigned warp_size = 32;
  double timeout_s = 10;  // per launch
  double compile_timeout_s = 300;  // adapters: a JIT kernel's first call at a new problem (DeviceOptions)
  // cpu launches in a forked child (crash / hang = a verdict, ~ms per launch): "always", "never", or "auto":
  // in-process until a kernel kills a worker process once (libFuzzer's fork mode records the input), then
  // isolated for that kernel: the parent lists it in <out>/work/isolate.txt, which workers re-read.
  std::string isolate = "auto";
  int64_t oracle_rows = 0;
  int mp_bits = 128;
  FuzzLimits limits;
  std::string out = "reports/fuzz";  // campaign directory
  std::string command;               // the campaign's command line (provenance of saved cases)
  std::string replay_flags;          // appended to "attn-check --replay FILE" (order, plug-ins, backend)
  bool reports = true;               // write a report beside each failure
  // --amplify (check/repeat.h amplify_passing): a passing forward dense variant case gets its amplified
  // sibling, through check_in_modes as attn-check --amplify; the campaign's minimizer checks the same way.
  bool amplify = false;
  // GPU workers are clients of one MPS server (attn-fuzz --mps, fuzz/mps.h): a crash, hang or launch error
  // may be another client's fault, so such a check is not judged here (Worker::Outcome::suspect; the process
  // then leaves the input in work/mps-suspects and ends). The parent re-runs it alone, outside MPS, in a
  // process started with kMpsRecheckEnv set: there mps is false, and a crash or hang that reproduces
  // quarantines the kernel (it would take every worker's context down again).
  bool mps = false;
  bool mps_recheck = false;  // set from kMpsRecheckEnv, never written to the configuration file
  // When the campaign stops its workers (seconds since the epoch; 0: when it is interrupted): a fork-mode job
  // is lengthened no further than this (worker_main.cpp), so that its inputs are merged before the stop.
  double stop_unix = 0;
  // The shortest fork-mode job, seconds (worker_main.cpp; 0: libFuzzer's own lengths, 1, 2, 3... s). New corpus
  // entries reach work/inputs only when a job ends (its merge), so --sync campaigns keep libFuzzer's lengths.
  int min_job_s = 20;
  // Compile-aware fuzzing (fuzz/shape_pool.h): "auto" (kernels whose adapter declares recompiles_per_shape are
  // pooled, the other adapter kernels measured), "on" (every kernel pooled), "off" (every shape runs as drawn).
  std::string compile_aware = "auto";
  double new_shape_share = 0.25;  // of a pooled kernel's check time, at most this much on first calls at new shapes
  // --repeat-calls (check/repeat.h): each case checked right after its siblings in the same process (stale caches).
  bool repeat_calls = false;
};
// The shortest fork-mode job of an adapter campaign with --compile-aware auto | on (WorkerConfig::min_job_s).
inline constexpr int kCompileAwareMinJobS = 120;
inline constexpr const char* kMpsRecheckEnv = "ATTNFUZZ_MPS_RECHECK";
// A worker process started with kMinimizeEnv set (the path of a job file, fuzz/campaign.h minimize_jobs) minimizes
// a campaign's failures instead of fuzzing, and exits.
inline constexpr const char* kMinimizeEnv = "ATTNFUZZ_MINIMIZE";
Json worker_config_to_json(const WorkerConfig& c);
WorkerConfig worker_config_from_json(const Json& j);  // missing keys keep their defaults
// Reads the file named by ATTNFUZZ_WORKER_CONFIG, or defaults when the variable is unset.
WorkerConfig worker_config_from_env();

// --mps: leaves an input whose check was a suspect in <out>/work/mps-suspects (named by its hash), for the
// parent to re-run alone.
void save_mps_suspect(const WorkerConfig& cfg, const uint8_t* data, size_t size);
// Whether a failed check is one that, under MPS, another client's fault or spin can cause.
bool mps_suspect(const CheckResult& r);

// The dedup key of a failure: (kernel, class, signature). The signature is the class and the detector of
// the first evidence ("non-finite:compare", "oob-write:canary"); just the class for crash and hang.
std::string failure_signature(const CheckResult& r);

// Saves a failure unless its (kernel, class, signature) was already claimed in this campaign directory, and
// appends "<file> <found> <classified>" (Unix seconds: when the check failed, when its class was known; found
// 0 = now) to OUT/work/found.txt. Returns the saved .case path, or empty for a duplicate.
std::string save_failure(const WorkerConfig& cfg, const Case& c, const CheckResult& r,
                         const std::vector<double>& ratio_map, double found_unix = 0);
double unix_now();                     // seconds since the epoch
std::string pass_dtype(const Case& c);  // "fwd f32": a row of the campaign's per-kernel table

// Refines the class of a failed check with the classification detectors (check/classify.h) when they are
// built; returns false (class left as check_case named it) otherwise.
bool refine_class(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& run,
                  const std::vector<std::string>& plugins, Judged& j);

// The replay command of a saved failure.
std::string replay_command(const WorkerConfig& cfg, const std::string& case_path);

// The in-process hang handler of a libFuzzer worker process (set_inprocess_hang_handler): quarantines the
// kernel, saves the hang, counts it and ends the process.
void on_inprocess_hang(const char* kernel, double seconds);

// Chains a handler in front of libFuzzer's fatal-signal handlers (install after libFuzzer's): a kernel that
// kills the worker process in-process is recorded (work/deaths.txt, work/isolate.txt) before the artifact.
void install_worker_crash_hook(const WorkerConfig& cfg);

// The hash of an input's bytes (FNV-1a 64), computed once per input: the crash hook records it for the input a
// worker process is running (work/faults.txt; the campaign computes it again from libFuzzer's artifact of it),
// and it keys the feature cache.
uint64_t input_hash(const uint8_t* data, size_t size);
// FNV-1a 64 of size bytes, continuing from h (kFnvOffset starts a hash): input_hash's, also the verdict table's and
// bench/merge_verdicts' hashes of cases and outputs.
constexpr uint64_t kFnvOffset = 1469598103934665603ull;
uint64_t fnv1a(const void* data, size_t size, uint64_t h = kFnvOffset);
void note_current_input(uint64_t hash);

// The environment variable naming the read end of attn-fuzz's lifeline pipe: when it reads end-of-file, the
// campaign parent is gone, and every worker process of its group is killed.
inline constexpr const char* kLifelineEnv = "ATTNFUZZ_LIFELINE_FD";
// Starts the thread that watches the lifeline (no-op when the variable is unset).
void watch_lifeline();

// Appends one line to a campaign list file (O_APPEND: whole lines from concurrent writers), and reads one.
void append_line(const std::string& path, const std::string& line);
std::vector<std::string> read_lines(const std::string& path);

class Worker {
 public:
  explicit Worker(WorkerConfig cfg);  // loads plug-ins, opens the device; throws on bad configuration
  ~Worker();

  struct Outcome {
    const KernelEntry* kernel = nullptr;  // null when no selected kernel supports the case
    CheckResult result;
    std::string saved;  // path of a newly saved distinct failure
    bool suspect = false;  // under MPS: a crash, hang or launch error, not judged (WorkerConfig::mps)
  };
  // Checks one input on the kernel it selects (the next one that supports the case, if it does not),
  // records coverage features and statistics, and saves a new distinct failure.
  Outcome run(const FuzzInput& in);
  const std::vector<const KernelEntry*>& kernels() const { return kernels_; }
  const WorkerConfig& config() const { return cfg_; }
  // Compile-aware fuzzing: `in` as it runs on the kernel it picks (in.kernel modulo the selected kernels): as drawn
  // when that kernel's shape pool takes its shape, else on a pool case's shape (snap_shape; `pick` chooses which).
  // The custom mutator fits what it writes, so that libFuzzer's bytes are the case that runs; run() fits the
  // rest (seed and corpus inputs).
  // Counts the snapped ones (ShapePool::note_snapped).
  FuzzInput fit(const FuzzInput& in, uint64_t pick);
  const ShapePool& pool(size_t slot) const { return pools_.at(slot); }
  Device& device() { return *device_; }
  RunOptions run_options() const { return run_; }
  void write_stats(bool force);
  // Feature cache (work/featcache, issue 17), keyed by input_hash() of the input's bytes. replay_features: when
  // the input has a record whose kernel is not quarantined, sets the same coverage counters as its check did and
  // returns true (nothing is launched or counted as a case); false otherwise. save_features: after run(),
  // records the last check's features when it added a feature new to this process (an input libFuzzer keeps).
  bool replay_features(uint64_t hash, size_t size);
  void save_features(uint64_t hash, size_t size);
  int64_t replayed() const { return replayed_; }
  // Time spent in this process's checks (decode and run(); per kernel when `kernel` is given) and in the custom
  // mutator, for the statistics file (report.json: where a campaign worker's time goes).
  void count_time(double check_s, double mutate_s, const KernelEntry* kernel = nullptr) {
    check_s_ += check_s;
    mutate_s_ += mutate_s;
    if (kernel) kernel_check_s_[kernel->kernel.name] += check_s;
  }

 private:
  void on_failure(Outcome& out, PreparedCase& pc, Judged& j);
  WorkerConfig cfg_;
  std::unique_ptr<Device> device_;
  std::vector<const KernelEntry*> kernels_;
  RunOptions run_;
  // statistics
  int64_t cases_ = 0;
  std::map<std::string, int64_t> verdicts_, classes_, raw_failures_;
  std::map<std::string, std::string> raw_class_;  // kernel|first signature -> the class its classified ones got
  std::map<std::string, std::map<std::string, int64_t>> per_kernel_;
  // kernel -> "PASS DTYPE" (e.g. "bwd f16") -> verdict or "refused" -> count: the campaign's per-kernel table
  std::map<std::string, std::map<std::string, std::map<std::string, int64_t>>> by_kernel_;
  // Why kernels refused inputs: "kernel: reason" -> count (the first kMaxRefusals distinct ones), so a campaign
  // whose kernels refuse everything can say why (e.g. an SDPA backend that takes no explicit mask).
  std::map<std::string, int64_t> refusals_;
  static constexpr size_t kMaxRefusals = 8;
  std::vector<uint8_t> seen_;  // kCounterBytes bits: features seen by this process
  std::string stats_path_;
  std::chrono::steady_clock::time_point last_stats_, last_isolate_check_;
  std::vector<std::string> isolated_;     // kernels launched in a forked child (isolate = auto)
  std::vector<std::string> quarantined_;  // kernels that hung once: not run any more
  int64_t isolate_stamp_ = -1, quarantine_stamp_ = -1, throttle_stamp_ = -1;
  static constexpr int kThrottleAfter = 16;
  std::map<std::string, int> dying_in_row_;  // per kernel: checks in a row that crashed / faulted / leaked
  uint64_t throttle_tick_ = 0;
  // The last check's features (for save_features) and whether one of them was new to this process.
  const KernelEntry* last_kernel_ = nullptr;
  size_t last_slot_ = 0;
  std::vector<uint16_t> last_ids_;
  bool last_new_ = false;
  int64_t replayed_ = 0;  // inputs answered from the feature cache
  double check_s_ = 0, mutate_s_ = 0;  // count_time()
  std::map<std::string, double> kernel_check_s_;
  // Where run()'s time goes (issue 32), seconds: prepare (the case's values, a merge case's states), launch (wall
  // time in Device::launch: submission, the kernel, the wait), buffers (guarded buffers: allocation, uploads,
  // fills, downloads, guard reads), oracle (the exact result, CheckResult::oracle_ms), judge (the rest of
  // check_case: encoding, comparison, gradients, merge-whole), classify (the detectors' experiments on failures,
  // saving them). kernel_s_: the device's own timing of those launches (LaunchResult::ms), part of launch;
  // buffer_calls_: the guarded buffers' device calls (each a synchronous transfer on a GPU).
  std::map<std::string, double> phase_s_;
  double kernel_s_ = 0;
  uint64_t buffer_calls_ = 0;
  struct CachedFeatures {
    uint64_t size = 0;
    uint32_t slot = 0;
    std::string kernel;
    std::vector<uint16_t> ids;
  };
  std::unordered_map<uint64_t, CachedFeatures> feat_cache_;  // loaded on the first replay_features()
  bool feat_loaded_ = false;
  int feat_fd_ = -1;  // this process's work/featcache/<pid>.bin
  void load_feature_cache();
  std::vector<uint8_t> buckets_seen_;  // per counter: the value buckets seen in this process (libFuzzer's features)
  bool note_counts(size_t slot, const std::vector<uint16_t>& ids);  // true when one was new
  void refresh_isolated();
  void open_pools();  // one ShapePool per selected kernel, its mode from the configuration and work/compile.txt
  // The kernel of slot picked and its shape pool: whether the pool takes a case of shape `key`.
  bool pool_takes(size_t slot, const std::string& key) const { return !any_pool_ || pools_[slot].takes(key); }
  // After a check on slot: the pools of a restarted adapter emptied, the check recorded, a probe's decision shared.
  void record_shape(size_t slot, const Case& c, const std::string& key, double first_call_s, double check_s);
  std::vector<ShapePool> pools_;  // per selected kernel (slot)
  bool any_pool_ = false;         // some pool is not off (shape keys are computed)
  int adapter_starts_ = 0;        // the adapter's starts when the pools were last emptied
  bool quarantined(const KernelEntry* k) const;
  friend void on_inprocess_hang(const char*, double);
};

}  // namespace attnfuzz::fuzz
