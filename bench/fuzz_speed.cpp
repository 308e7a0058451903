// fuzz_speed.cpp - benchmark: campaign cases/s per kernel on one worker and a per-case breakdown (name=value
// lines).
//
// In-process mode (default) drives the campaign's own code: the custom mutator's CaseDomain::mutate + encode,
// decode, fuzz::Worker::run (PreparedCase, features, check_case, classification of failures, statistics).
// The breakdown replays the same inputs through the same functions stage by stage (check_case's stages:
// launch_guarded, the oracle, compare_output). --campaign runs the attn-fuzz binary itself for --seconds and
// reads its report (what libFuzzer's fork mode and the worker processes add); with --backend nvidia it also
// samples nvidia-smi's GPU utilisation. Usage:
//   fuzz_speed [--seconds S | --cases N] [--backend cpu] [--kernel PATTERN] [--shapes small|default|both]
//   [--dtype f32|f16|bf16|fp8-e4m3|fp8-e5m2|each]  (each: every dtype side by side, tags <shapes>_<dtype>)
//   [--seed N] fuzz_speed --campaign [--backend nvidia] [--workers N] [--seconds S] [--shapes small|default]
//              [--attn-fuzz PATH] [--plugin SO] [--kernel PATTERN] [--mps]
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "check/compare.h"
#include "check/runner.h"
#include "fuzz/codec.h"
#include "fuzz/features.h"
#include "fuzz/worker.h"

using namespace attnfuzz;
using namespace attnfuzz::fuzz;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double since_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Options {
  double seconds = 2;  // per kernel and shape set (in-process); whole run (--campaign)
  std::string backend = "cpu";
  std::string kernels = "all";
  std::string shapes = "both";
  std::string dtype = "f32";  // dtype of every case (FuzzLimits::dtype), or "each": every dtype side by side
  uint64_t seed = 1;
  int64_t cases = 0;  // > 0: this many cases per loop instead of --seconds (deterministic, for profilers)
  bool campaign = false;
  bool mps = false;  // --campaign --backend nvidia: attn-fuzz --mps
  int workers = 1;
  std::string attn_fuzz;
  std::vector<std::string> plugins;
};

FuzzLimits limits_for(const std::string& shapes) {
  FuzzLimits l;  // "default": the campaign's defaults (--max-seq / --max-d 160)
  if (shapes == "small") l.max_seq = l.max_dim = 32;
  return l;
}

// The inputs a campaign feeds a worker: the custom mutator's steps (init, then mutations of earlier inputs,
// as libFuzzer mutates corpus entries), as encoded bytes. Returns the time spent per input on mutate+encode.
std::vector<std::vector<uint8_t>> make_inputs(const FuzzLimits& lim, uint64_t seed, size_t n,
                                              double& ms_per) {
  Rng rng(seed, 0x7370);
  const CaseDomain dom(lim);
  std::vector<std::vector<uint8_t>> out;
  std::vector<FuzzInput> pool;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    FuzzInput in = pool.empty() || rng.below(16) == 0 ? dom.init(rng) : pool[rng.below(pool.size())];
    dom.mutate(in, rng);
    out.push_back(encode(in, lim));
    if (pool.size() < 64)
      pool.push_back(in);
    else
      pool[rng.below(pool.size())] = in;
  }
  ms_per = since_ms(t0) / static_cast<double>(n);
  return out;
}

struct Stages {
  int64_t cases = 0, checked = 0, failed = 0;
  double decode = 0, prepare = 0, features = 0, buffers = 0, launch = 0, oracle = 0, compare = 0,
         classify = 0;
};

void print_stages(const std::string& tag, const Stages& s, double mutate_ms, double worker_ms_per) {
  const double n = static_cast<double>(std::max<int64_t>(s.cases, 1));
  const double gen = mutate_ms + (s.decode + s.prepare) / n;
  const double staged = gen + (s.features + s.buffers + s.launch + s.oracle + s.compare + s.classify) / n;
  std::printf("%s_breakdown_cases=%lld\n", tag.c_str(), (long long)s.cases);
  std::printf("%s_ms_case_generation=%.4f  (mutate+encode %.4f, decode %.4f, values %.4f)\n", tag.c_str(),
              gen, mutate_ms, s.decode / n, s.prepare / n);
  std::printf("%s_ms_buffer_setup=%.4f  (guarded alloc, upload, poison, download, canaries)\n", tag.c_str(),
              s.buffers / n);
  std::printf("%s_ms_launch=%.4f\n", tag.c_str(), s.launch / n);
  std::printf("%s_ms_oracle=%.4f\n", tag.c_str(), s.oracle / n);
  std::printf("%s_ms_compare=%.4f\n", tag.c_str(), s.compare / n);
  std::printf("%s_ms_features=%.4f\n", tag.c_str(), s.features / n);
  std::printf("%s_ms_classification=%.4f  (%lld failing checks)\n", tag.c_str(), s.classify / n,
              (long long)s.failed);
  // Worker::run does all of the above plus bookkeeping (kernel choice, statistics file, dedup/saving).
  std::printf("%s_ms_worker_overhead=%.4f  (Worker::run + mutate minus the stages)\n", tag.c_str(),
              std::max(0.0, worker_ms_per + mutate_ms - staged));
  std::printf("%s_ms_per_case=%.4f\n", tag.c_str(), worker_ms_per + mutate_ms);
}

// One shape set, in process: per kernel cases/s through Worker::run, then the staged breakdown.
void in_process(const Options& o, const std::string& shapes, const std::string& dtype, const fs::path& dir) {
  FuzzLimits lim = limits_for(shapes);
  lim.dtype = *parse_dtype(dtype);
  std::string tag = shapes == "small" ? "small" : "default";
  if (dtype != "f32") tag += "_" + dtype;  // f32 keeps the names earlier runs printed
  std::replace(tag.begin(), tag.end(), '-', '_');
  double mutate_ms = 0;
  const auto inputs = make_inputs(lim, o.seed, 4096, mutate_ms);
  WorkerConfig cfg;
  cfg.backend = o.backend;
  cfg.plugins = o.plugins;
  cfg.limits = lim;
  cfg.isolate = "never";  // the campaign's auto mode launches in process until a kernel kills a worker
  cfg.out = (dir / tag).string();
  cfg.reports = true;
  Worker all(cfg);  // loads plug-ins once (Registry is global)
  std::printf("device=%s\n", all.device().name().c_str());
  std::printf("%s_limits=max_seq:%lld,max_dim:%lld\n", tag.c_str(), (long long)lim.max_seq,
              (long long)lim.max_dim);
  std::vector<std::string> names;
  for (const KernelEntry* k : Registry::global().select(all.device().backend(), o.kernels))
    names.push_back(k->kernel.name);
  for (const std::string& name : names) {
    WorkerConfig kc = cfg;
    kc.kernels = name;
    kc.plugins.clear();
    Worker w(kc);
    int64_t checked = 0, unsupported = 0;
    double check_ms = 0;  // in the checked cases only (compare: report.json's campaign.per_kernel_check_ms)
    size_t i = 0;
    const auto t0 = Clock::now();
    double el = 0;
    while ((el = since_ms(t0) / 1000), o.cases ? static_cast<int64_t>(i) < o.cases : el < o.seconds) {
      const auto& b = inputs[i++ % inputs.size()];
      const auto t1 = Clock::now();
      const FuzzInput in = decode(b.data(), b.size(), lim);
      if (w.run(in).kernel) {
        ++checked;
        check_ms += since_ms(t1);
      } else {
        ++unsupported;
      }
    }
    const double rate = static_cast<double>(checked + unsupported) / el;
    std::printf("%s_%s_cases_per_s=%.1f  (checked %lld, unsupported %lld, %.1f s)\n", tag.c_str(),
                name.c_str(), rate, (long long)checked, (long long)unsupported, el);
    std::printf("%s_%s_ms_per_check=%.3f\n", tag.c_str(), name.c_str(),
                check_ms / static_cast<double>(std::max<int64_t>(checked, 1)));
  }
  // All kernels together: what one campaign worker does (the input picks the kernel).
  int64_t n_all = 0;
  const auto t0 = Clock::now();
  double el = 0;
  while ((el = since_ms(t0) / 1000), o.cases ? n_all < o.cases : el < o.seconds) {
    const auto& b = inputs[static_cast<size_t>(n_all++) % inputs.size()];
    all.run(decode(b.data(), b.size(), lim));
  }
  const double worker_ms_per = el * 1000 / static_cast<double>(n_all);
  if (const auto pool = all.run_options().pool)
    std::printf("%s_buffer_pool_hit_pct=%.1f  (guarded buffers reused between cases)\n", tag.c_str(),
                100.0 * static_cast<double>(pool->hits()) /
                    static_cast<double>(std::max<int64_t>(1, pool->hits() + pool->misses())));
  std::printf("%s_all_kernels_cases_per_s=%.1f  (one worker, in process, mutate excluded)\n", tag.c_str(),
              static_cast<double>(n_all) / el);
  std::printf("%s_all_kernels_cases_per_s_with_mutate=%.1f\n", tag.c_str(),
              1000 / (worker_ms_per + mutate_ms));
  // Staged breakdown over the same inputs: the functions Worker::run and check_case call, one at a time.
  Stages s;
  const RunOptions run = all.run_options();
  const auto& ks = all.kernels();
  const auto b0 = Clock::now();
  for (size_t i = 0; o.cases ? static_cast<int64_t>(i) < o.cases : since_ms(b0) / 1000 < o.seconds; ++i) {
    const auto& b = inputs[i % inputs.size()];
    auto t = Clock::now();
    const FuzzInput in = decode(b.data(), b.size(), lim);
    s.decode += since_ms(t);
    t = Clock::now();
    PreparedCase pc(in.the_case, run.oracle.threads);
    s.prepare += since_ms(t);
    t = Clock::now();
    const CaseFeatures cf = case_features(pc.the_case(), pc.tensors());
    s.features += since_ms(t);
    ++s.cases;
    const KernelEntry* k = nullptr;
    for (size_t j = 0; j < ks.size() && !k; ++j) {
      const KernelEntry* c = ks[(in.kernel + j) % ks.size()];
      if (case_unsupported_reason(c->kernel, pc.problem(), pc.the_case().pass).empty()) k = c;
    }
    if (!k) continue;
    ++s.checked;
    t = Clock::now();
    LaunchOutcome lo = launch_guarded(all.device(), *k, pc.problem(), pc.tensors(), run);
    const double lg = since_ms(t);
    s.launch += lo.launch.ms;
    s.buffers += std::max(0.0, lg - lo.launch.ms);
    t = Clock::now();
    const OracleResult& exact = pc.oracle(run.oracle);
    s.oracle += since_ms(t);
    t = Clock::now();
    CheckResult cmp;
    CompareOptions co;
    co.worst = run.worst;
    compare_output(pc.problem(), exact, lo.o.data(), lo.lse.empty() ? nullptr : lo.lse.data(), cmp, co);
    s.compare += since_ms(t);
    t = Clock::now();
    (void)result_features(cf, cmp);
    s.features += since_ms(t);
    // The dense comparison above is the stage's cost, not always the verdict: a sequence layout's rows past a
    // sequence's length, a backward case's gradients and malformed metadata (a clean refusal passes) are judged by
    // check_case. Only what it fails is classified (before, ~240 of 1,592 cases in 5 s were classified here in a
    // campaign that failed none); its re-check is not timed.
    if (cmp.verdict == Verdict::kFail || lo.canary_words || lo.launch.status != LaunchStatus::kOk) {
      Judged j = check_case(all.device(), *k, pc, run);
      if (j.result.verdict != Verdict::kFail) continue;
      ++s.failed;
      t = Clock::now();
      refine_class(all.device(), *k, pc, run, {}, j);
      s.classify += since_ms(t);
    }
  }
  print_stages(tag, s, mutate_ms, worker_ms_per);
}

// Reads the "campaign" object of attn-fuzz's report.json (cases, cases_per_s) without a JSON dependency here.
bool read_campaign(const fs::path& report, double& cases, double& rate, double& wall, double& failing,
                   double& distinct) {
  std::ifstream f(report);
  if (!f) return false;
  const Json j = Json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.contains("campaign")) return false;
  cases = j["campaign"].value("cases", 0.0);
  rate = j["campaign"].value("cases_per_s", 0.0);
  wall = j.value("wall_s", 0.0);
  failing = j["campaign"].value("failing_checks", 0.0);
  distinct = j["campaign"].value("distinct_failures", 0.0);
  return true;
}

std::string self_dir() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).parent_path().string();
}

int campaign(const Options& o, const fs::path& dir) {
  std::string bin = o.attn_fuzz.empty() ? self_dir() + "/../bin/attn-fuzz" : o.attn_fuzz;
  const FuzzLimits lim = limits_for(o.shapes == "both" ? "small" : o.shapes);
  const fs::path out = dir / "campaign";
  std::string cmd = bin + " --backend " + o.backend + " --workers " + std::to_string(o.workers) +
                    " --max-time " + std::to_string(static_cast<int>(o.seconds)) + " --max-seq " +
                    std::to_string(lim.max_seq) + " --max-d " + std::to_string(lim.max_dim) + " --kernel '" +
                    o.kernels + "' --no-seeds --out " + out.string() + " --progress 1000";
  for (const auto& p : o.plugins) cmd += " --plugin " + p;
  if (o.mps) cmd += " --mps";
  std::printf("command=%s\n", cmd.c_str());
  std::fflush(stdout);
  // GPU utilisation: nvidia-smi samples every 200 ms while the campaign runs.
  std::atomic<bool> stop{false};
  std::vector<double> util;
  std::thread sampler;
  if (o.backend == "nvidia") {
    sampler = std::thread([&] {
      while (!stop) {
        FILE* p =
            popen("nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null", "r");
        if (p) {
          char line[64];
          while (std::fgets(line, sizeof line, p)) util.push_back(std::atof(line));
          pclose(p);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  const int rc = std::system((cmd + " > " + (dir / "campaign.log").string() + " 2>&1").c_str());
  stop = true;
  if (sampler.joinable()) sampler.join();
  double cases = 0, rate = 0, wall = 0, failing = 0, distinct = 0;
  if (!read_campaign(out / "report.json", cases, rate, wall, failing, distinct)) {
    std::fprintf(stderr, "fuzz_speed: the campaign wrote no report (exit %d); log: %s\n", rc,
                 (dir / "campaign.log").c_str());
    return 2;
  }
  std::printf("campaign_backend=%s\ncampaign_workers=%d\ncampaign_cases=%.0f\ncampaign_wall_s=%.1f\n",
              o.backend.c_str(), o.workers, cases, wall);
  std::printf("campaign_cases_per_s=%.1f\n", rate);
  std::printf("campaign_failing_checks=%.0f\ncampaign_distinct_failures=%.0f\n", failing, distinct);
  std::printf("campaign_cases_per_s_per_worker=%.1f\n", rate / o.workers);
  // Where the workers' time went: in checks, in the custom mutator, the rest (libFuzzer, start-up, merges, idle).
  if (std::ifstream f(out / "report.json"); f) {
    const Json c = Json::parse(f, nullptr, false).value("campaign", Json::object());
    const double check_s = c.value("worker_check_s", 0.0), mutate_s = c.value("worker_mutate_s", 0.0);
    const double worker_s = std::max(1e-9, wall * o.workers);
    std::printf("campaign_check_pct_of_worker_wall=%.1f\ncampaign_mutate_pct_of_worker_wall=%.1f\n",
                100 * check_s / worker_s, 100 * mutate_s / worker_s);
    std::printf("campaign_ms_per_check=%.3f\n", cases > 0 ? 1000 * check_s / cases : 0.0);
    const Json per_kernel = c.value("per_kernel_check_ms", Json::object());
    for (const auto& [k, ms] : per_kernel.items())
      std::printf("campaign_%s_ms_per_check=%.3f\n", k.c_str(), ms.get<double>());
  }
  if (!util.empty()) {
    double sum = 0;
    for (double u : util) sum += u;
    std::vector<double> s = util;
    std::sort(s.begin(), s.end());
    std::printf("gpu_util_mean_pct=%.1f\ngpu_util_median_pct=%.1f\ngpu_util_samples=%zu\n",
                sum / static_cast<double>(util.size()), s[s.size() / 2], util.size());
  }
  return 0;
}

int usage(const char* why) {
  std::fprintf(stderr, "fuzz_speed: %s\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fuzz_speed: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seconds")
      o.seconds = std::atof(val().c_str());
    else if (a == "--backend")
      o.backend = val();
    else if (a == "--kernel")
      o.kernels = val();
    else if (a == "--shapes")
      o.shapes = val();
    else if (a == "--dtype")
      o.dtype = val();
    else if (a == "--seed")
      o.seed = std::strtoull(val().c_str(), nullptr, 10);
    else if (a == "--cases")
      o.cases = std::atoll(val().c_str());
    else if (a == "--campaign")
      o.campaign = true;
    else if (a == "--mps")
      o.mps = true;
    else if (a == "--workers")
      o.workers = std::atoi(val().c_str());
    else if (a == "--attn-fuzz")
      o.attn_fuzz = val();
    else if (a == "--plugin")
      o.plugins.push_back(val());
    else
      return usage(("unknown argument " + a).c_str());
  }
  if (o.shapes != "small" && o.shapes != "default" && o.shapes != "both")
    return usage("--shapes small|default|both");
  if (!(o.seconds > 0) || o.workers < 1) return usage("--seconds > 0 and --workers >= 1");
  if (o.dtype != "each" && !parse_dtype(o.dtype)) return usage("--dtype f32|f16|bf16|fp8-e4m3|fp8-e5m2|each");
  char tmpl[] = "/tmp/fuzz_speed.XXXXXX";
  if (!mkdtemp(tmpl)) return usage("cannot create a temporary directory");
  const fs::path dir = tmpl;
  int rc = 0;
  try {
    if (o.campaign) {
      rc = campaign(o, dir);
    } else {
      std::vector<std::string> dts{o.dtype};
      if (o.dtype == "each") dts = {"f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"};
      for (const std::string s : {"small", "default"})
        for (const std::string& dt : dts)
          if (o.shapes == "both" || o.shapes == s) in_process(o, s, dt, dir);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_speed: %s\n", e.what());
    rc = 2;
  }
  std::error_code ec;
  if (rc == 0) fs::remove_all(dir, ec);
  return rc;
}
