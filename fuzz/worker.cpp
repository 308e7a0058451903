// worker.cpp - one worker process: configuration, checking an input, coverage, statistics, distinct failures.
#include "fuzz/worker.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "attnfuzz/report.h"
#if __has_include("check/classify.h")
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
                 {"max_explicit", c.limits.max_explicit}};
  j["out"] = c.out;
  j["command"] = c.command;
  j["replay_flags"] = c.replay_flags;
  j["reports"] = c.reports;
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
  }
  get("out", c.out);
  get("command", c.command);
  get("replay_flags", c.replay_flags);
  get("reports", c.reports);
  return c;
}

WorkerConfig worker_config_from_env() {
  const char* path = std::getenv(kWorkerConfigEnv);
  if (!path || !*path) return WorkerConfig{};
  std::ifstream f(path);
  if (!f) throw std::runtime_error(std::string("cannot read the worker configuration ") + path);
  return worker_config_from_json(Json::parse(f));
}

std::string failure_signature(const CheckResult& r) {
  // A crash or hang is one failure however it was seen (isolated launch or a dead worker process).
  if (r.failure == FailureClass::kCrash || r.failure == FailureClass::kHang)
    return failure_class_name(r.failure);
  return std::string(failure_class_name(r.failure)) + ":" +
         (r.evidence.empty() ? "-" : r.evidence.front().detector);
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
    write_text_file(stem.string() + ".svg", heatmap_svg(m, p, ho));
    e.heatmap_path = stem.filename().string() + ".svg";
  }
  RunRecord rec;
  rec.tool.name = "attn-fuzz";
  rec.tool.command = cfg.command;
  rec.backend = r.backend;
  rec.device = r.device;
  rec.entries.push_back(e);
  write_text_file(stem.string() + ".json", report_to_json(rec).dump(2) + "\n");
  write_text_file(stem.string() + ".md", markdown_summary(rec));
}

}  // namespace

std::string save_failure(const WorkerConfig& cfg, const Case& c, const CheckResult& r,
                         const std::vector<double>& ratio_map) {
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
  const fs::path path = save_to_corpus_dir(fs::path(cfg.out) / "failures", cf);
  if (cfg.reports) {
    try {
      write_failure_report(cfg, path, c, r, ratio_map);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn-fuzz-worker: cannot write the report of %s: %s\n", path.c_str(), e.what());
    }
  }
  return path.string();
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
  if (cfg_.isolate != "auto" && cfg_.isolate != "always" && cfg_.isolate != "never")
    throw std::runtime_error("isolate must be auto, always or never, not " + cfg_.isolate);
  d.isolate = cfg_.isolate == "always";
  d.adapter_command = cfg_.adapter;  // opening it registers the adapter's kernels
  device_ = open_device(cfg_.backend, d);
  kernels_ = reg.select(device_->backend(), cfg_.kernels);
  run_.oracle.row_budget = cfg_.oracle_rows;
  run_.oracle.mp_bits = cfg_.mp_bits;
  std::error_code ec;
  const fs::path stats = fs::path(cfg_.out) / "work" / "stats";
  fs::create_directories(stats, ec);
  stats_path_ =
      (stats / (std::to_string(::getpid()) + "-" +
                std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + ".json"))
          .string();
  last_stats_ = std::chrono::steady_clock::now();
}

Worker::~Worker() { write_stats(true); }

Worker::Outcome Worker::run(const FuzzInput& in) {
  Outcome out;
  ++cases_;
  PreparedCase pc(in.the_case);
  const CaseFeatures cf = case_features(pc.the_case(), pc.tensors());
  const size_t n = kernels_.size();
  size_t slot = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (in.kernel + i) % n;
    if (unsupported_reason(kernels_[idx]->kernel, pc.problem()).empty()) {
      out.kernel = kernels_[idx];
      slot = idx;
      break;
    }
  }
  if (!out.kernel) {
    ++verdicts_["unsupported"];
    write_stats(false);
    return out;
  }
  if (cfg_.isolate == "auto") {
    refresh_isolated();
    DeviceOptions d = device_->options();
    const bool iso =
        std::find(isolated_.begin(), isolated_.end(), out.kernel->kernel.name) != isolated_.end();
    if (d.isolate != iso) {
      d.isolate = iso;
      device_->set_options(d);
    }
  }
  Judged j = check_case(*device_, *out.kernel, pc, run_);
  out.result = j.result;
  const CheckResult& r = out.result;
  const auto ids = result_features(cf, r);
  record_features(slot, ids);
  for (uint16_t id : ids) {
    const size_t bit = (slot % kKernelSlots) * kFeaturesPerKernel + id;
    seen_[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
  }
  ++verdicts_[verdict_name(r.verdict)];
  ++per_kernel_[r.kernel][verdict_name(r.verdict)];
  if (r.verdict == Verdict::kFail) {
    // The detectors cost several launches: run them on the first two failures of each (kernel, first
    // class, signature) in this process; later ones of the same kind are counted, not saved again.
    const std::string raw = r.kernel + "|" + failure_signature(r);
    const bool classify = raw_failures_[raw]++ < 2;
    if (classify && refine_class(*device_, *out.kernel, pc, run_, cfg_.plugins, j)) out.result = j.result;
    ++classes_[failure_class_name(r.failure)];
    try {
      if (classify) out.saved = save_failure(cfg_, pc.the_case(), r, j.ratio_map);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn-fuzz-worker: cannot save a failure: %s\n", e.what());
    }
  }
  write_stats(!out.saved.empty());
  return out;
}

void Worker::refresh_isolated() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_isolate_check_ < std::chrono::milliseconds(500)) return;
  last_isolate_check_ = now;
  std::ifstream f(fs::path(cfg_.out) / "work" / "isolate.txt");
  std::vector<std::string> names;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) names.push_back(line);
  isolated_ = std::move(names);
}

void Worker::write_stats(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_stats_ < std::chrono::seconds(1)) return;
  last_stats_ = now;
  Json j;
  j["pid"] = ::getpid();
  j["cases"] = cases_;
  j["verdicts"] = verdicts_;
  j["classes"] = classes_;
  j["kernels"] = per_kernel_;
  static const char* hex = "0123456789abcdef";
  std::string bits;
  bits.reserve(seen_.size() * 2);
  for (uint8_t b : seen_) {
    bits.push_back(hex[b >> 4]);
    bits.push_back(hex[b & 15]);
  }
  j["features"] = bits;
  const std::string tmp = stats_path_ + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump() << "\n";
    if (!f) return;
  }
  std::error_code ec;
  fs::rename(tmp, stats_path_, ec);
}

}  // namespace attnfuzz::fuzz
