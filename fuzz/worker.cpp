// worker.cpp - one worker process: configuration, checking an input, coverage, statistics, distinct failures.
#include "fuzz/worker.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "attnfuzz/report.h"
#include "check/repeat.h"
#include "runtime/adapter/adapter.h"
#if __has_include("check/classify.h")
#include "check/guarded.h"
#include "check/classify.h"  // the class detectors (issue 5), used when present in the tree
#define ATTNFUZZ_HAVE_CLASSIFY 1
#endif

namespace fs = std::filesystem;

namespace attnfuzz::fuzz {

Json worker_config_to_json(const WorkerConfig& c) {
  Json j;
  j["kernels"] = c.kernels;
  j["backend"] = c.backend;
  j["plugins"] = c.plugins;
  j["adapter"] = c.adapter;
  j["order"] = c.order;
  j["order_seed"] = c.order_seed;
  j["warp_size"] = c.warp_size;
  j["timeout_s"] = c.timeout_s;
  j["compile_timeout_s"] = c.compile_timeout_s;
  j["isolate"] = c.isolate;
  j["oracle_rows"] = c.oracle_rows;
  j["mp_bits"] = c.mp_bits;
  j["limits"] = {{"max_batch", c.limits.max_batch},
                 {"max_heads", c.limits.max_heads},
                 {"max_seq", c.limits.max_seq},
                 {"max_dim", c.limits.max_dim},
                 {"max_work", c.limits.max_work},
                 {"max_specials", c.limits.max_specials},
                 {"max_special_count", c.limits.max_special_count},
                 {"max_explicit", c.limits.max_explicit},
                 {"values", value_domain_name(c.limits.domain)},
                 {"dtype", c.limits.dtype < 0 ? std::string("any") : std::string(dtype_name(c.limits.dtype))},
                 {"passes", c.limits.passes},
                 {"variants", c.limits.variants},
                 {"merge", c.limits.merge},
                 {"preset", c.limits.preset},
                 {"mla_dims", c.limits.mla_dims}};
  j["out"] = c.out;
  j["command"] = c.command;
  j["replay_flags"] = c.replay_flags;
  j["reports"] = c.reports;
  j["amplify"] = c.amplify;
  j["mps"] = c.mps;
  j["stop_unix"] = c.stop_unix;
  j["min_job_s"] = c.min_job_s;
  j["compile_aware"] = c.compile_aware;
  j["new_shape_share"] = c.new_shape_share;
  j["repeat_calls"] = c.repeat_calls;
  return j;
}

WorkerConfig worker_config_from_json(const Json& j) {
  WorkerConfig c;
  auto get = [&](const char* k, auto& v) {
    if (j.contains(k)) j.at(k).get_to(v);
  };
  get("kernels", c.kernels);
  get("backend", c.backend);
  get("plugins", c.plugins);
  get("adapter", c.adapter);
  get("order", c.order);
  get("order_seed", c.order_seed);
  get("warp_size", c.warp_size);
  get("timeout_s", c.timeout_s);
  get("compile_timeout_s", c.compile_timeout_s);
  get("isolate", c.isolate);
  get("oracle_rows", c.oracle_rows);
  get("mp_bits", c.mp_bits);
  if (j.contains("limits")) {
    const Json& l = j.at("limits");
    auto lim = [&](const char* k, int64_t& v) {
      if (l.contains(k)) l.at(k).get_to(v);
    };
    lim("max_batch", c.limits.max_batch);
    lim("max_heads", c.limits.max_heads);
    lim("max_seq", c.limits.max_seq);
    lim("max_dim", c.limits.max_dim);
    lim("max_work", c.limits.max_work);
    lim("max_specials", c.limits.max_specials);
    lim("max_special_count", c.limits.max_special_count);
    lim("max_explicit", c.limits.max_explicit);
    if (l.contains("values")) (void)parse_value_domain(l.at("values").get<std::string>(), c.limits.domain);
    if (l.contains("dtype")) {
      const auto d = parse_dtype(l.at("dtype").get<std::string>());
      c.limits.dtype = d ? *d : -1;
    }
    if (l.contains("passes") && l.at("passes").is_number_unsigned() && l.at("passes").get<uint64_t>() > 0 &&
        l.at("passes").get<uint64_t>() < 8)
      c.limits.passes = static_cast<uint8_t>(l.at("passes").get<uint64_t>());
    if (l.contains("variants") && l.at("variants").is_number_unsigned())
      c.limits.variants = static_cast<uint32_t>(l.at("variants").get<uint64_t>()) & kCheckedVariants;
    if (l.contains("merge") && l.at("merge").is_boolean()) c.limits.merge = l.at("merge").get<bool>();
    if (l.contains("preset") && l.at("preset").is_string())
      c.limits.preset = l.at("preset").get<std::string>();
    if (l.contains("mla_dims") && l.at("mla_dims").is_boolean())
      c.limits.mla_dims = l.at("mla_dims").get<bool>();
  }
  get("out", c.out);
  get("command", c.command);
  get("replay_flags", c.replay_flags);
  get("reports", c.reports);
  get("amplify", c.amplify);
  get("mps", c.mps);
  get("stop_unix", c.stop_unix);
  get("min_job_s", c.min_job_s);
  get("compile_aware", c.compile_aware);
  get("new_shape_share", c.new_shape_share);
  get("repeat_calls", c.repeat_calls);
  return c;
}

WorkerConfig worker_config_from_env() {
  const char* path = std::getenv(kWorkerConfigEnv);
  if (!path || !*path) return WorkerConfig{};
  std::ifstream f(path);
  if (!f) throw std::runtime_error(std::string("cannot read the worker configuration ") + path);
  WorkerConfig c = worker_config_from_json(Json::parse(f));
  if (const char* r = std::getenv(kMpsRecheckEnv); r && *r) {
    c.mps = false;
    c.mps_recheck = true;
  }
  return c;
}

std::string failure_signature(const CheckResult& r) {
  // A crash or hang is one failure however it was seen (isolated launch or a dead worker process); a leak
  // is a crash of its own.
  if (r.failure == FailureClass::kCrash && r.reason.find("memory grows") != std::string::npos)
    return "crash:leak";
  if (r.failure == FailureClass::kCrash || r.failure == FailureClass::kHang)
    return failure_class_name(r.failure);
  // The detector that named the class and the kind of its evidence (mask/other-mask, reorder, ...); an
  // unclassified failure keeps its first evidence line's detector.
  return std::string(failure_class_name(r.failure)) + ":" +
         (!r.decided_by.empty() ? r.decided_by : r.evidence.empty() ? "-" : r.evidence.front().detector);
}

bool refine_class(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& run,
                  const std::vector<std::string>& plugins, Judged& j) {
#ifdef ATTNFUZZ_HAVE_CLASSIFY
  ClassifyOptions co;
  co.plugins = plugins;
  classify_failure(dev, k, pc, run, j, co);
  return true;
#else
  (void)dev, (void)k, (void)pc, (void)run, (void)plugins, (void)j;
  return false;
#endif
}

std::string replay_command(const WorkerConfig& cfg, const std::string& case_path) {
  return "attn-check --replay " + case_path + (cfg.replay_flags.empty() ? "" : " " + cfg.replay_flags);
}

void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const std::string l = line + "\n";
  (void)!::write(fd, l.data(), l.size());
  ::close(fd);
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    if (!line.empty() && std::find(out.begin(), out.end(), line) == out.end()) out.push_back(line);
  return out;
}

namespace {

std::string hex16(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

// Writes a one-entry report beside the case: <stem>.json, <stem>.md and the heatmap <stem>.svg.
void write_failure_report(const WorkerConfig& cfg, const fs::path& case_path, const Case& c,
                          const CheckResult& r, const std::vector<double>& ratio_map) {
  const fs::path stem = case_path.parent_path() / case_path.stem();
  RunEntry e{c, r, replay_command(cfg, case_path.string()), case_path.string(), ""};
  const Problem& p = c.problem;
  if (ratio_map.size() == static_cast<size_t>(p.seq_q * p.head_dim_v)) {
    RatioMap m(p.seq_q, p.head_dim_v);
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t d = 0; d < p.head_dim_v; ++d) {
        const double x = ratio_map[static_cast<size_t>(s * p.head_dim_v + d)];
        if (!std::isnan(x)) m.fold(s, d, x);
      }
    HeatmapOptions ho;
    ho.title = r.kernel + ": " + failure_class_name(r.failure);
    ho.subtitle = describe(c);
    write_heatmap_files(stem.string() + ".svg", heatmap_svg(m, p, ho));
    e.heatmap_path = stem.filename().string() + ".svg";
  }
  RunRecord rec;
  rec.tool.name = "attn-fuzz";
  rec.tool.command = cfg.command;
  rec.backend = r.backend;
  rec.device = r.device;
  rec.entries.push_back(e);
  write_text_file(stem.string() + ".json", report_json_text(report_to_json(rec)));
  write_text_file(stem.string() + ".md", markdown_summary(rec));
}

}  // namespace

bool mps_suspect(const CheckResult& r) {
  return r.verdict == Verdict::kFail && (r.failure == FailureClass::kCrash || r.failure == FailureClass::kHang ||
                                         r.failure == FailureClass::kLaunchError);
}

void save_mps_suspect(const WorkerConfig& cfg, const uint8_t* data, size_t size) {
  const fs::path dir = fs::path(cfg.out) / "work" / "mps-suspects";
  std::error_code ec;
  fs::create_directories(dir, ec);
  // whole or not at all: the parent may read it at once
  write_file_atomically(dir / hex16(input_hash(data, size)), {reinterpret_cast<const char*>(data), size});
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string pass_dtype(const Case& c) {
  return std::string(pass_name(c.pass)) + " " + dtype_name(c.problem.dtype);
}

std::string save_failure(const WorkerConfig& cfg, const Case& c, const CheckResult& r,
                         const std::vector<double>& ratio_map, double found_unix) {
  const std::string sig = failure_signature(r);
  const fs::path dedup = fs::path(cfg.out) / "work" / "dedup";
  std::error_code ec;
  fs::create_directories(dedup, ec);
  const std::string key = hex16(hash64(r.kernel + "|" + failure_class_name(r.failure) + "|" + sig));
  const int fd = ::open((dedup / key).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  if (fd < 0) return {};  // already claimed (or unwritable: then saving would fail too)
  const std::string line = r.kernel + " " + failure_class_name(r.failure) + " " + sig + "\n";
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
  CorpusFile cf;
  cf.tool.name = "attn-fuzz";
  cf.tool.command = cfg.command;
  cf.the_case = c;
  cf.verdict = recorded_verdict(r, sig);
  // The report first, the .case last: a worker stopped in between (the campaign's deadline) leaves no failure
  // without its report, since the campaign reads failures/*.case.
  const fs::path dir = fs::path(cfg.out) / "failures", path = dir / corpus_file_name(cf);
  fs::create_directories(dir, ec);
  if (cfg.reports) {
    try {
      write_failure_report(cfg, path, c, r, ratio_map);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn-fuzz-worker: cannot write the report of %s: %s\n", path.c_str(), e.what());
    }
  }
  save_to_corpus_dir(dir, cf);
  // When it was found and when its class was known (the campaign's history reads this; file times are a fallback).
  char when[512];
  const double classified = unix_now();
  std::snprintf(when, sizeof when, "%s %.3f %.3f", path.filename().c_str(), found_unix > 0 ? found_unix : classified,
                classified);
  append_line((fs::path(cfg.out) / "work" / "found.txt").string(), when);
  return path.string();
}

namespace {
// What the in-process hang handler needs: the worker and the case being checked (one launch at a time).
Worker* g_worker = nullptr;
const Case* g_current = nullptr;

// The crash hook: while a kernel runs in-process, a fatal signal first records which kernel killed the
// worker process (work/deaths.txt "crash <kernel>", and work/isolate.txt so no worker runs it in-process
// again), then goes on to libFuzzer's handler (which saves the input as a crash artifact).
const char* volatile g_in_process_kernel = nullptr;
char g_deaths_path[4096], g_isolate_path[4096], g_faults_path[4096];
struct sigaction g_previous[NSIG];

void write_line_raw(const char* path, const char* a, const char* b) {  // async-signal-safe
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char buf[600];
  size_t n = 0;
  for (const char* s : {a, b, "\n"})
    for (; *s && n < sizeof buf; ++s) buf[n++] = *s;
  (void)!::write(fd, buf, n);
  ::close(fd);
}

// Every in-process death writes a line of work/faults.txt:
// "<kernel>\t<access: 1 read, 2 write, 0 unknown, -1 not in a guard page>\t<buffer>\t<byte offset>\t<where>\t
// <input hash>", so that the campaign blames the dead worker's artifact on the kernel that really ran it (the
// input hash, input_hash() of the artifact's bytes, links them) and names a fault in a buffer's guard pages
// oob-write / oob-read like an isolated launch would (fuzz/campaign.cpp).
std::atomic<uint64_t> g_input_hash{0};

void record_in_process_death(const char* kernel, int sig, siginfo_t* si, void* ctx) {
  char where[200] = "-", buffer[32] = "-", line[600];
  int64_t offset = 0;
  int access = -1;
  if ((sig == SIGSEGV || sig == SIGBUS) && si && si->si_code > 0 &&  // a fault of an access, in guard pages
      describe_guard_fault(reinterpret_cast<uintptr_t>(si->si_addr), where, sizeof where, buffer, sizeof buffer,
                           &offset)) {
    access = 0;
#if defined(__x86_64__)
    access = (static_cast<const ucontext_t*>(ctx)->uc_mcontext.gregs[REG_ERR] & 2) ? 2 : 1;
#else
    (void)ctx;
#endif
  }
  size_t n = 0;
  auto put = [&](const char* s) {
    for (; *s && n + 1 < sizeof line; ++s) line[n++] = *s;
  };
  char num[24], digits[24];
  auto put_num = [&](int64_t v, bool is_unsigned = false, uint64_t uv = 0) {
    size_t d = 0, w = 0;
    uint64_t u = is_unsigned ? uv : v < 0 ? static_cast<uint64_t>(-v) : static_cast<uint64_t>(v);
    do digits[d++] = static_cast<char>('0' + u % 10); while ((u /= 10) && d < sizeof digits);
    if (!is_unsigned && v < 0) num[w++] = '-';
    while (d) num[w++] = digits[--d];
    num[w] = 0;
    put(num);
  };
  put(kernel);
  put("\t");
  put_num(access);
  put("\t");
  put(buffer);
  put("\t");
  put_num(offset);
  put("\t");
  put(where);
  put("\t");
  put_num(0, true, g_input_hash.load());
  line[n] = 0;
  write_line_raw(g_faults_path, line, "");
}

void crash_hook(int sig, siginfo_t* si, void* ctx) {
  if (const char* k = g_in_process_kernel) {
    g_in_process_kernel = nullptr;
    record_in_process_death(k, sig, si, ctx);  // before the death line: the campaign reads them in that order
    write_line_raw(g_deaths_path, "crash ", k);
    write_line_raw(g_isolate_path, "", k);
  }
  const struct sigaction& o = g_previous[sig];
  if ((o.sa_flags & SA_SIGINFO) && o.sa_sigaction) {
    o.sa_sigaction(sig, si, ctx);
  } else if (!(o.sa_flags & SA_SIGINFO) && o.sa_handler != SIG_DFL && o.sa_handler != SIG_IGN) {
    o.sa_handler(sig);
  } else {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}

void install_crash_hook(const std::string& out) {
  const fs::path work = fs::path(out) / "work";
  std::snprintf(g_deaths_path, sizeof g_deaths_path, "%s", (work / "deaths.txt").c_str());
  std::snprintf(g_isolate_path, sizeof g_isolate_path, "%s", (work / "isolate.txt").c_str());
  std::snprintf(g_faults_path, sizeof g_faults_path, "%s", (work / "faults.txt").c_str());
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE}) {
    struct sigaction sa {};
    sa.sa_sigaction = crash_hook;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, &g_previous[sig]);
  }
}
}  // namespace

void install_worker_crash_hook(const WorkerConfig& cfg) { install_crash_hook(cfg.out); }

uint64_t fnv1a(const void* data, size_t size, uint64_t h) {
  const auto* c = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

uint64_t input_hash(const uint8_t* data, size_t size) { return fnv1a(data, size); }

void note_current_input(uint64_t hash) { g_input_hash = hash; }

// Runs on the device's watchdog thread while the worker's thread spins inside a kernel: quarantine the
// kernel, save the hang, count it, and end the process (libFuzzer's fork mode starts another).
void on_inprocess_hang(const char* kernel, double seconds) {
  Worker* w = g_worker;
  if (!w) return;
  const fs::path work = fs::path(w->cfg_.out) / "work";
  append_line((work / "quarantine.txt").string(), kernel);
  append_line((work / "deaths.txt").string(), std::string("hang ") + kernel);
  if (g_current) {
    CheckResult r;
    r.kernel = kernel;
    r.backend = w->cfg_.backend;
    r.device = w->device_->name();
    r.verdict = Verdict::kFail;
    r.failure = FailureClass::kHang;
    char why[160];
    std::snprintf(why, sizeof why,
                  "the kernel hung: no block of the launch finished for %g s (in-process launch; its worker "
                  "process was ended)",
                  seconds);
    r.reason = why;
    r.evidence.push_back({"launch", r.reason});
    try {
      save_failure(w->cfg_, *g_current, r, {});
    } catch (const std::exception&) {
    }
  }
  ++w->cases_;
  ++w->verdicts_["fail"];
  ++w->classes_["hang"];
  ++w->per_kernel_[kernel]["fail"];
  w->write_stats(true);
  std::fprintf(stderr, "attn-fuzz-worker: %s hung (%.0f s): quarantined; this worker process ends\n", kernel,
               seconds);
  ::_exit(0);
}

void watch_lifeline() {
  const char* v = std::getenv(kLifelineEnv);
  if (!v || !*v) return;
  const int fd = std::atoi(v);
  std::thread([fd] {
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      const int n = ::poll(&p, 1, -1);
      if (n < 0 && errno == EINTR) continue;
      char c;
      if (n > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL) || ::read(fd, &c, 1) <= 0)) break;
      if (n < 0) break;
    }
    ::kill(0, SIGKILL);  // attn-fuzz is gone: this process group (libFuzzer, its jobs, their launches) ends
    ::_exit(1);
  }).detach();
}

Worker::Worker(WorkerConfig cfg) : cfg_(std::move(cfg)), seen_(kCounterBytes / 8, 0) {
  Registry& reg = Registry::global();
  for (const auto& p : cfg_.plugins) reg.load_plugin(p);
  DeviceOptions d;
  if (!parse_thread_order(cfg_.order, d.order))
    throw std::runtime_error("unknown thread order " + cfg_.order);
  d.order_seed = cfg_.order_seed;
  d.workers = 1;  // parallelism comes from worker processes
  d.warp_size = cfg_.warp_size;
  d.timeout_s = cfg_.timeout_s;
  d.compile_timeout_s = cfg_.compile_timeout_s;
  if (cfg_.isolate != "auto" && cfg_.isolate != "always" && cfg_.isolate != "never")
    throw std::runtime_error("isolate must be auto, always or never, not " + cfg_.isolate);
  d.isolate = cfg_.isolate == "always";
  d.adapter_command = cfg_.adapter;  // opening it registers the adapter's kernels
  device_ = open_device(cfg_.backend, d);
  kernels_ = reg.select(device_->backend(), cfg_.kernels);
  run_.pool = std::make_shared<BufferPool>(*device_);  // guarded buffers reused between cases (issue 17)
  run_.oracle.row_budget = cfg_.oracle_rows;
  run_.oracle.threads =
      1;  // like the device: parallelism comes from worker processes, not a thread per core per case
  run_.oracle.mp_bits = cfg_.mp_bits;
  std::error_code ec;
  const fs::path stats = fs::path(cfg_.out) / "work" / "stats";
  fs::create_directories(stats, ec);
  stats_path_ =
      (stats / (std::to_string(::getpid()) + "-" +
                std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + ".json"))
          .string();
  last_stats_ = std::chrono::steady_clock::now();
  open_pools();
  g_worker = this;
}

namespace {
// What earlier worker processes measured (work/compile.txt, "KERNEL<TAB>pooled|off<TAB>why" a line): kernel -> (mode,
// why).
std::map<std::string, std::pair<CompileMode, std::string>> compile_decisions(const std::string& out) {
  std::map<std::string, std::pair<CompileMode, std::string>> decided;
  for (const std::string& line : read_lines((fs::path(out) / "work" / "compile.txt").string())) {
    const size_t a = line.find('\t'), b = line.find('\t', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    decided[line.substr(0, a)] = {line.substr(a + 1, b - a - 1) == "pooled" ? CompileMode::kPooled : CompileMode::kOff,
                                  line.substr(b + 1)};
  }
  return decided;
}
}  // namespace

void Worker::open_pools() {
  if (cfg_.compile_aware != "auto" && cfg_.compile_aware != "on" && cfg_.compile_aware != "off")
    throw std::runtime_error("compile_aware must be auto, on or off, not " + cfg_.compile_aware);
  const auto* ad = dynamic_cast<const AdapterDevice*>(device_.get());
  if (ad) adapter_starts_ = ad->starts();
  if (cfg_.mps_recheck) {  // an MPS suspect is re-run exactly as it ran
    pools_.assign(kernels_.size(), ShapePool());
    return;
  }
  const auto decided = compile_decisions(cfg_.out);
  for (const KernelEntry* k : kernels_) {
    const std::string name = k->kernel.name;
    bool declared = false;
    uint32_t data_variants = 0;
    for (const AdapterKernel& a : ad ? ad->declared() : std::vector<AdapterKernel>{})
      if (a.name == name) declared |= a.recompiles_per_shape, data_variants |= a.data_variants;
    ShapePool pool;
    if (cfg_.compile_aware == "on")
      pool = ShapePool(CompileMode::kPooled, cfg_.new_shape_share, "--compile-aware on");
    else if (cfg_.compile_aware == "auto" && declared)
      pool = ShapePool(CompileMode::kPooled, cfg_.new_shape_share, "declared by its adapter (recompiles_per_shape)");
    else if (cfg_.compile_aware == "auto" && ad)
      pool = ShapePool(CompileMode::kProbe, cfg_.new_shape_share, "measuring first calls");
    if (const auto it = decided.find(name); it != decided.end() && pool.mode() == CompileMode::kProbe)
      pool.set_mode(it->second.first, it->second.second);
    pool.set_data_variants(data_variants);
    any_pool_ |= pool.mode() != CompileMode::kOff;
    pools_.push_back(std::move(pool));
  }
}

FuzzInput Worker::fit(const FuzzInput& in, uint64_t pick) {
  if (!any_pool_ || kernels_.empty()) return in;
  ShapePool& pool = pools_[in.kernel % kernels_.size()];
  if (pool.takes(pool.key(in.the_case))) return in;
  pool.note_snapped();
  FuzzInput out = in;
  const Case* shape = pool.pick(pick);  // none: the kernel refused shapes and compiled none yet
  out.the_case = shape ? pool.snap(*shape, in.the_case, cfg_.limits) : CaseDomain(cfg_.limits).plain_shape(in.the_case);
  return out;
}

void Worker::record_shape(size_t slot, const Case& c, const std::string& key, double first_call_s, double check_s) {
  if (const auto* ad = dynamic_cast<const AdapterDevice*>(device_.get()); ad && ad->starts() != adapter_starts_) {
    adapter_starts_ = ad->starts();  // a new adapter process has compiled nothing yet
    for (ShapePool& p : pools_) p.reset();
  }
  ShapePool& pool = pools_[slot];
  if (!pool.record(c, key, first_call_s, check_s)) return;
  append_line((fs::path(cfg_.out) / "work" / "compile.txt").string(),
              std::string(kernels_[slot]->kernel.name) + "\t" + compile_mode_name(pool.mode()) + "\t" + pool.why());
}

Worker::~Worker() {
  if (feat_fd_ >= 0) ::close(feat_fd_);
  set_inprocess_hang_handler(nullptr);
  g_worker = nullptr;
  write_stats(true);
}

bool Worker::quarantined(const KernelEntry* k) const {
  return std::find(quarantined_.begin(), quarantined_.end(), k->kernel.name) != quarantined_.end();
}

// A failed check: its class refined (the first two of each kind), counted under its kind's class, the kernel
// quarantined or isolated when it hung or leaked, and the failure saved when it is new.
void Worker::on_failure(Outcome& out, PreparedCase& pc, Judged& j) {
  const CheckResult& r = out.result;
  // The detectors cost several launches: run them on the first two failures of each (kernel, first
  // class, signature) in this process; later ones of the same kind are counted, not saved again.
  const double found_unix = unix_now();  // the check failed; its class is known once the detectors ran
  const std::string raw = r.kernel + "|" + failure_signature(r);
  const bool classify = raw_failures_[raw]++ < 2;
  if (classify && refine_class(*device_, *out.kernel, pc, run_, cfg_.plugins, j)) out.result = j.result;
  if (classify) raw_class_[raw] = failure_class_name(r.failure);
  // Counted under the class the classified ones of its kind got (not the check's first guess).
  const auto known = raw_class_.find(raw);
  ++classes_[known != raw_class_.end() ? known->second : failure_class_name(r.failure)];
  const fs::path work = fs::path(cfg_.out) / "work";
  if (r.failure == FailureClass::kHang ||  // one timeout is all a spinning kernel may cost
      (cfg_.mps_recheck && mps_suspect(r))) {  // under MPS a crash takes every worker's context down
    append_line((work / "quarantine.txt").string(), r.kernel);
    quarantined_.push_back(r.kernel);
  } else if (r.failure == FailureClass::kCrash && cfg_.isolate == "auto" &&
             r.reason.find("memory grows") != std::string::npos &&
             std::find(isolated_.begin(), isolated_.end(), r.kernel) ==
                 isolated_.end()) {  // a leak: isolate it
    append_line((work / "isolate.txt").string(), r.kernel);
    isolated_.push_back(r.kernel);
  }
  try {
    if (classify) out.saved = save_failure(cfg_, pc.the_case(), r, j.ratio_map, found_unix);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz-worker: cannot save a failure: %s\n", e.what());
  }
}

Worker::Outcome Worker::run(const FuzzInput& drawn) {
  Outcome out;
  const FuzzInput in = fit(drawn, drawn.the_case.seed);
  const std::string key =
      any_pool_ && !kernels_.empty() ? pools_[in.kernel % kernels_.size()].key(in.the_case) : std::string();
  ++cases_;
  last_kernel_ = nullptr;
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const auto t_prepare = Clock::now();
  PreparedCase pc(in.the_case, run_.oracle.threads);
  const CaseFeatures cf = case_features(pc.the_case(), pc.tensors());
  phase_s_["prepare"] += seconds(t_prepare, Clock::now());
  const size_t n = kernels_.size();
  size_t slot = 0;
  refresh_isolated();
  bool skipped_quarantined = false;
  double support_s = 0;  // the chosen kernel's support question (an adapter may compile there: its check)
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (in.kernel + i) % n;
    if (quarantined(kernels_[idx])) {
      skipped_quarantined = true;
      continue;
    }
    // A kernel whose last kThrottleAfter checks all crashed (or faulted, or leaked) gets 1 in kThrottleAfter
    // of the inputs that pick it: the rest go to the next kernel, so the healthy ones keep their pace.
    if (auto it = dying_in_row_.find(kernels_[idx]->kernel.name);
        it != dying_in_row_.end() && it->second >= kThrottleAfter && throttle_tick_++ % kThrottleAfter != 0) {
      skipped_quarantined = true;
      continue;
    }
    // A compile-aware kernel further down the list is not asked about a shape its pool does not take (the
    // question alone may compile it).
    if (i > 0 && !pool_takes(idx, key)) continue;
    // The whole question, pass included: a backward case goes to a kernel with a backward launch (before, a
    // forward-only kernel took it and answered unsupported: 56 % of a backward soak's cases).
    const auto t_support = Clock::now();
    const std::string why = case_unsupported_reason(kernels_[idx]->kernel, pc.problem(), pc.the_case().pass);
    support_s = seconds(t_support, Clock::now());
    if (why.empty()) {
      out.kernel = kernels_[idx];
      slot = idx;
      break;
    }
    ++by_kernel_[kernels_[idx]->kernel.name][pass_dtype(pc.the_case())]["refused"];
    if (any_pool_) pools_[idx].note_refused(key, support_s);
    const std::string reason = std::string(kernels_[idx]->kernel.name) + ": " + why.substr(0, 300);
    if (auto it = refusals_.find(reason); it != refusals_.end()) ++it->second;
    else if (refusals_.size() < kMaxRefusals) refusals_[reason] = 1;
  }
  if (!out.kernel) {
    // libFuzzer ends a fork job whose inputs set no counter ("no interesting inputs were found") and the
    // campaign sees a dead worker: an input that no kernel runs still records its verdict, once per slot.
    CheckResult skipped;
    skipped.verdict = Verdict::kUnsupported;
    if (n > 0) record_features(in.kernel % n, result_features(CaseFeatures{}, skipped));
    ++verdicts_[skipped_quarantined ? "quarantined" : "unsupported"];
    write_stats(false);
    return out;
  }
  if (cfg_.isolate == "auto") {
    DeviceOptions d = device_->options();
    const bool iso =
        std::find(isolated_.begin(), isolated_.end(), out.kernel->kernel.name) != isolated_.end();
    if (d.isolate != iso) {
      d.isolate = iso;
      device_->set_options(d);
    }
  }
  g_current = &pc.the_case();
  if (!device_->options().isolate) g_in_process_kernel = out.kernel->kernel.name;
  const auto t_check = Clock::now();
  const double launch0 = guarded_launch_seconds();
  const BufferTraffic traffic0 = buffer_traffic();
  Judged j =
      check_in_modes(*device_, *out.kernel, pc, run_, {.repeat_calls = cfg_.repeat_calls, .amplify = cfg_.amplify});
  {
    const BufferTraffic traffic = buffer_traffic();
    const double all = seconds(t_check, Clock::now()), launch = guarded_launch_seconds() - launch0,
                 buffers = traffic.seconds - traffic0.seconds, oracle = j.result.oracle_ms / 1e3;
    phase_s_["launch"] += launch;
    phase_s_["buffers"] += buffers;
    phase_s_["oracle"] += oracle;
    phase_s_["judge"] += std::max(0.0, all - launch - buffers - oracle);
    kernel_s_ += j.result.launch_ms / 1e3;
    buffer_calls_ += traffic.calls - traffic0.calls;
    if (any_pool_) record_shape(slot, pc.the_case(), key, support_s + launch, support_s + all);
  }
  g_in_process_kernel = nullptr;
  g_current = nullptr;
  out.result = j.result;
  const CheckResult& r = out.result;
  if (cfg_.mps && mps_suspect(r)) {  // maybe another MPS client's fault: re-run alone by the parent
    out.suspect = true;
    --cases_;
    ++verdicts_["mps-suspect"];
    write_stats(true);
    return out;
  }
  const auto ids = result_features(cf, r);
  record_features(slot, ids);
  last_new_ = note_counts(slot, ids);
  for (uint16_t id : ids) {
    const size_t bit = (slot % kKernelSlots) * kFeaturesPerKernel + id;
    seen_[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
  }
  last_kernel_ = out.kernel;
  last_slot_ = slot;
  last_ids_ = ids;
  ++verdicts_[verdict_name(r.verdict)];
  ++per_kernel_[r.kernel][verdict_name(r.verdict)];
  ++by_kernel_[r.kernel][pass_dtype(pc.the_case())][verdict_name(r.verdict)];
  {
    bool dies = r.verdict == Verdict::kFail &&
                (r.failure == FailureClass::kCrash || r.failure == FailureClass::kHang);
    for (const Evidence& e : r.evidence) dies |= e.detector == "guard-page";
    int& n = dying_in_row_[r.kernel];
    n = dies ? n + 1 : 0;
    // Shared with every worker process of the campaign (work/throttle.txt): libFuzzer's fork mode replaces
    // its jobs every few seconds to minutes, and a throttle each new job had to relearn throttled nothing.
    if (n == kThrottleAfter) append_line((fs::path(cfg_.out) / "work" / "throttle.txt").string(), r.kernel);
  }
  if (r.verdict == Verdict::kFail) {
    const auto t_classify = Clock::now();
    on_failure(out, pc, j);
    phase_s_["classify"] += seconds(t_classify, Clock::now());
  }
  write_stats(!out.saved.empty());
  return out;
}

namespace {
// A feature-cache record (appended to work/featcache/<pid>.bin): the header, the kernel name, the ids.
constexpr uint32_t kFeatMagic = 0x33434641u;  // "AFC3" (keyed by input_hash)
struct FeatHeader {
  uint32_t magic;
  uint32_t slot;
  uint64_t key;   // input_hash() of the input bytes
  uint64_t size;  // input bytes
  uint32_t name_len;
  uint32_t count;
};
}  // namespace

void Worker::load_feature_cache() {
  feat_loaded_ = true;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(cfg_.out) / "work" / "featcache", ec)) {
    if (e.path().extension() != ".bin") continue;
    const std::string b = [&] {
      std::ifstream f(e.path(), std::ios::binary);
      std::ostringstream t;
      t << f.rdbuf();
      return t.str();
    }();
    // Whole records only: a record another process is appending right now is read next time, or never.
    for (size_t off = 0; off + sizeof(FeatHeader) <= b.size();) {
      FeatHeader h;
      std::memcpy(&h, b.data() + off, sizeof h);
      const size_t len = sizeof h + h.name_len + 2 * size_t{h.count};
      if (h.magic != kFeatMagic || h.name_len > 512 || h.count > kFeaturesPerKernel || off + len > b.size()) break;
      CachedFeatures c;
      c.size = h.size;
      c.slot = h.slot;
      c.kernel = b.substr(off + sizeof h, h.name_len);
      c.ids.resize(h.count);
      std::memcpy(c.ids.data(), b.data() + off + sizeof h + h.name_len, 2 * size_t{h.count});
      feat_cache_[h.key] = std::move(c);
      off += len;
    }
  }
}

// libFuzzer's features of a counter are its value's bucket (1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+): an input
// it keeps sets a (counter, bucket) it had not seen. The same test here says which inputs to record.
bool Worker::note_counts(size_t slot, const std::vector<uint16_t>& ids) {
  if (buckets_seen_.empty()) buckets_seen_.assign(kCounterBytes, 0);
  std::vector<uint16_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  bool fresh = false;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    if (sorted[i] < kFeaturesPerKernel) {
      const size_t n = std::min<size_t>(j - i, 255);
      const int b = n >= 128 ? 7 : n >= 32 ? 6 : n >= 16 ? 5 : n >= 8 ? 4 : n >= 4 ? 3 : static_cast<int>(n) - 1;
      uint8_t& seen = buckets_seen_[(slot % kKernelSlots) * kFeaturesPerKernel + sorted[i]];
      fresh |= !(seen & (1u << b));
      seen |= static_cast<uint8_t>(1u << b);
    }
    i = j;
  }
  return fresh;
}

bool Worker::replay_features(uint64_t hash, size_t size) {
  if (!feat_loaded_) load_feature_cache();
  const auto it = feat_cache_.find(hash);
  if (it == feat_cache_.end() || it->second.size != size) return false;
  const CachedFeatures& c = it->second;
  refresh_isolated();
  if (std::find(quarantined_.begin(), quarantined_.end(), c.kernel) != quarantined_.end()) return false;
  record_features(c.slot, c.ids);
  note_counts(c.slot, c.ids);
  for (uint16_t id : c.ids) {
    if (id >= kFeaturesPerKernel) continue;
    const size_t bit = (c.slot % kKernelSlots) * kFeaturesPerKernel + id;
    seen_[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
  }
  ++replayed_;
  write_stats(false);
  return true;
}

void Worker::save_features(uint64_t hash, size_t size) {
  if (!last_kernel_ || !last_new_) return;
  const std::string name = last_kernel_->kernel.name;
  if (name.size() > 512) return;
  if (feat_fd_ < 0) {
    const fs::path dir = fs::path(cfg_.out) / "work" / "featcache";
    std::error_code ec;
    fs::create_directories(dir, ec);
    feat_fd_ = ::open((dir / (std::to_string(::getpid()) + ".bin")).c_str(),
                      O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (feat_fd_ < 0) return;
  }
  FeatHeader h{kFeatMagic, static_cast<uint32_t>(last_slot_), hash, size,
               static_cast<uint32_t>(name.size()), static_cast<uint32_t>(last_ids_.size())};
  std::string rec(reinterpret_cast<const char*>(&h), sizeof h);
  rec += name;
  rec.append(reinterpret_cast<const char*>(last_ids_.data()), 2 * last_ids_.size());
  (void)!::write(feat_fd_, rec.data(), rec.size());  // one write: a whole record (or a torn tail nobody reads)
}

// Re-reads the isolate and quarantine lists when they changed (a stat each per input: ~1 us).
void Worker::refresh_isolated() {
  const fs::path work = fs::path(cfg_.out) / "work";
  auto stamp = [](const fs::path& p) -> int64_t {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return -1;
    return static_cast<int64_t>(st.st_size) ^ (static_cast<int64_t>(st.st_mtim.tv_nsec) << 20);
  };
  const fs::path iso = work / "isolate.txt", quar = work / "quarantine.txt";
  if (const int64_t s = stamp(iso); s != isolate_stamp_) {
    isolate_stamp_ = s;
    isolated_ = read_lines(iso.string());
  }
  if (const int64_t s = stamp(quar); s != quarantine_stamp_) {
    quarantine_stamp_ = s;
    quarantined_ = read_lines(quar.string());
  }
  // Kernels throttled by any worker process start throttled here (a check of theirs that passes here resets it).
  if (const int64_t s = stamp(work / "throttle.txt"); s != throttle_stamp_) {
    throttle_stamp_ = s;
    for (const std::string& k : read_lines((work / "throttle.txt").string())) dying_in_row_.emplace(k, kThrottleAfter);
  }
}

void Worker::write_stats(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_stats_ < std::chrono::seconds(1)) return;
  last_stats_ = now;
  Json j;
  j["pid"] = ::getpid();
  j["cases"] = cases_;
  j["replayed"] = replayed_;
  j["check_s"] = check_s_;
  j["mutate_s"] = mutate_s_;
  j["kernel_check_s"] = kernel_check_s_;
  j["phase_s"] = phase_s_;
  j["kernel_s"] = kernel_s_;
  j["buffer_calls"] = buffer_calls_;
  j["verdicts"] = verdicts_;
  j["classes"] = classes_;
  j["kernels"] = per_kernel_;
  j["by_kernel"] = by_kernel_;
  j["refusals"] = refusals_;
  if (any_pool_) {
    Json pools = Json::object();
    for (size_t i = 0; i < pools_.size(); ++i)
      if (pools_[i].mode() != CompileMode::kOff || !pools_[i].why().empty())
        pools[kernels_[i]->kernel.name] = pools_[i].stats();
    j["compile_aware"] = pools;
  }
  static const char* hex = "0123456789abcdef";
  std::string bits;
  bits.reserve(seen_.size() * 2);
  for (uint8_t b : seen_) {
    bits.push_back(hex[b >> 4]);
    bits.push_back(hex[b & 15]);
  }
  j["features"] = bits;
  write_file_atomically(stats_path_, j.dump() + "\n");
}

}  // namespace attnfuzz::fuzz
